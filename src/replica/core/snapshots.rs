//! The snapshotter's state: whether the state changed since the last snapshot, when the next
//! periodic one is due, which are being written, and that a snapshot taken earlier never
//! overwrites a newer one (whose log segments are gone: the number it holds, checked by the
//! shell's `SnapshotJob::save`). Snapshots are taken on the actor's thread, together with a
//! log rotation, and encoded and saved on another; the decisions are here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::replica::durable::DataDir;

/// Snapshots of one replica into its data directory (none without one: every call is then
/// a no-op that answers "nothing to do").
pub(crate) struct Snapshotter {
    data: Option<DataDir>,
    /// `snapshot_interval_ms`.
    interval: Duration,
    /// The state changed since the last snapshot taken.
    dirty: bool,
    /// A periodic snapshot is being written (shared with the task that writes it).
    writing: Arc<AtomicBool>,
    /// Snapshots asked for by `Persist` still being written.
    persisting: u32,
    /// Snapshots taken so far (numbered on the actor's thread).
    taken: u64,
    /// The number of the newest snapshot saved (held while one is saved, so that they land
    /// in the order they were taken).
    saved: Arc<Mutex<u64>>,
    /// When a periodic snapshot was last due.
    last_due: Instant,
}

impl Snapshotter {
    /// The snapshotter of a replica started at `now`, with `data` if it has a directory.
    pub(crate) fn new(data: Option<DataDir>, interval: Duration, now: Instant) -> Self {
        Snapshotter {
            data,
            interval,
            dirty: false,
            writing: Arc::new(AtomicBool::new(false)),
            persisting: 0,
            taken: 0,
            saved: Arc::new(Mutex::new(0)),
            last_due: now,
        }
    }

    /// The data directory, if the replica has one.
    pub(crate) fn data(&self) -> Option<&DataDir> {
        self.data.as_ref()
    }

    /// The state changed: the next snapshot has something to save.
    pub(crate) fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether a snapshot has something to save (never without a data directory).
    pub(crate) fn has_unsaved(&self) -> bool {
        self.data.is_some() && self.dirty
    }

    /// Whether every change is saved (or there is nowhere to save it) and no snapshot is
    /// being written: the last one saved is the final one already.
    pub(crate) fn settled(&self) -> bool {
        !self.has_unsaved() && !self.writing.load(Ordering::Acquire) && self.persisting == 0
    }

    /// Whether a periodic snapshot is due at `now` (`snapshot_interval_ms` after the last
    /// one was); it is then counted as due.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if self.data.is_none() || now.saturating_duration_since(self.last_due) < self.interval {
            return false;
        }
        self.last_due = now;
        true
    }

    /// Starts a periodic snapshot if there is something to save and none is being written:
    /// the directory and the flag to clear once it is written.
    pub(crate) fn begin_periodic(&mut self) -> Option<(DataDir, Arc<AtomicBool>)> {
        let data = self.data.clone()?;
        if !self.dirty || self.writing.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.dirty = false;
        Some((data, self.writing.clone()))
    }

    /// Whether a periodic snapshot is being written.
    pub(crate) fn writing(&self) -> bool {
        self.writing.load(Ordering::Acquire)
    }

    /// Starts a snapshot asked for (`Persist`): changes from now on are the next
    /// snapshot's. End it with [`Snapshotter::persisted`].
    pub(crate) fn begin_persist(&mut self) {
        self.dirty = false;
        self.persisting += 1;
    }

    /// A snapshot asked for was written (or failed).
    pub(crate) fn persisted(&mut self) {
        self.persisting -= 1;
    }

    /// Numbers a snapshot being taken now, for `SnapshotJob::generation`.
    pub(crate) fn take(&mut self) -> u64 {
        self.taken += 1;
        self.taken
    }

    /// The newest snapshot saved, for `SnapshotJob::save`.
    pub(crate) fn saved(&self) -> Arc<Mutex<u64>> {
        self.saved.clone()
    }

    /// A snapshot was written (`ok`) or failed: a failure leaves its changes to the next.
    pub(crate) fn written(&mut self, ok: bool) {
        if !ok {
            self.dirty = true;
        }
    }

    /// A snapshot written on the actor's thread (at shutdown) saved every change.
    pub(crate) fn written_now(&mut self) {
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(30);

    #[test]
    fn a_periodic_snapshot_goes_when_due_with_changes_and_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut s = Snapshotter::new(Some(DataDir::open(dir.path()).unwrap()), INTERVAL, t0);
        assert!(s.settled());
        assert!(!s.due(t0 + INTERVAL / 2));
        assert!(s.due(t0 + INTERVAL));
        assert!(!s.due(t0 + INTERVAL), "counted as due");
        assert!(s.begin_periodic().is_none(), "nothing changed");
        s.changed();
        assert!(s.has_unsaved() && !s.settled());
        let (_, writing) = s.begin_periodic().expect("a change to save");
        assert!(s.writing() && !s.has_unsaved() && !s.settled());
        s.changed();
        assert!(s.begin_periodic().is_none(), "one is being written");
        writing.store(false, Ordering::Release);
        // Its save failed: its changes stay for the next.
        s.written(false);
        assert!(s.begin_periodic().is_some());
    }

    #[test]
    fn snapshots_asked_for_hold_the_final_one_back_until_written() {
        let mut s = Snapshotter::new(None, INTERVAL, Instant::now());
        assert!(s.begin_periodic().is_none() && !s.due(Instant::now() + INTERVAL));
        s.changed();
        assert!(!s.has_unsaved(), "nothing to save without a directory");
        s.begin_persist();
        assert!(!s.settled());
        s.persisted();
        assert!(s.settled());
        s.changed();
        s.written_now();
        assert!(s.settled());
    }
}
