//! The snapshotter's state: whether the state changed since the last snapshot, when the next
//! periodic one is due, which are being written, and that a snapshot taken earlier never
//! overwrites a newer one (whose log segments are gone). Snapshots are taken on the actor's
//! thread, together with a log rotation, and encoded and saved on another
//! ([`SnapshotJob`]); the decisions are here, without the actor, and unit-tested.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::replica::ReplicaError;
use crate::replica::core::MergesHeld;
use crate::replica::durable::{DataDir, Identity, Snapshot};
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::Telemetry;
use crate::replica::wal::SegmentId;
use crate::wire::FilterKind;

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
    /// Snapshots asked for by [`super::Persist`] still being written.
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
    pub(super) fn new(data: Option<DataDir>, interval: Duration, now: Instant) -> Self {
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
    pub(super) fn data(&self) -> Option<&DataDir> {
        self.data.as_ref()
    }

    /// The state changed: the next snapshot has something to save.
    pub(super) fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether a snapshot has something to save (never without a data directory).
    pub(super) fn has_unsaved(&self) -> bool {
        self.data.is_some() && self.dirty
    }

    /// Whether every change is saved (or there is nowhere to save it) and no snapshot is
    /// being written: the last one saved is the final one already.
    pub(super) fn settled(&self) -> bool {
        !self.has_unsaved() && !self.writing.load(Ordering::Acquire) && self.persisting == 0
    }

    /// Whether a periodic snapshot is due at `now` (`snapshot_interval_ms` after the last
    /// one was); it is then counted as due.
    pub(super) fn due(&mut self, now: Instant) -> bool {
        if self.data.is_none() || now.saturating_duration_since(self.last_due) < self.interval {
            return false;
        }
        self.last_due = now;
        true
    }

    /// Starts a periodic snapshot if there is something to save and none is being written:
    /// the directory and the flag to clear once it is written.
    pub(super) fn begin_periodic(&mut self) -> Option<(DataDir, Arc<AtomicBool>)> {
        let data = self.data.clone()?;
        if !self.dirty || self.writing.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.dirty = false;
        Some((data, self.writing.clone()))
    }

    /// Whether a periodic snapshot is being written.
    pub(super) fn writing(&self) -> bool {
        self.writing.load(Ordering::Acquire)
    }

    /// Starts a snapshot asked for ([`super::Persist`]): changes from now on are the next
    /// snapshot's. End it with [`Snapshotter::persisted`].
    pub(super) fn begin_persist(&mut self) {
        self.dirty = false;
        self.persisting += 1;
    }

    /// A snapshot asked for was written (or failed).
    pub(super) fn persisted(&mut self) {
        self.persisting -= 1;
    }

    /// Numbers a snapshot being taken now, for [`SnapshotJob::generation`].
    pub(super) fn take(&mut self) -> u64 {
        self.taken += 1;
        self.taken
    }

    /// The newest snapshot saved, for [`SnapshotJob::save`].
    pub(super) fn saved(&self) -> Arc<Mutex<u64>> {
        self.saved.clone()
    }

    /// A snapshot was written (`ok`) or failed: a failure leaves its changes to the next.
    pub(super) fn written(&mut self, ok: bool) {
        if !ok {
            self.dirty = true;
        }
    }

    /// A snapshot written on the actor's thread (at shutdown) saved every change.
    pub(super) fn written_now(&mut self) {
        self.dirty = false;
    }
}

/// What a snapshot saves, taken on the actor's thread and saved on any.
pub(crate) struct SnapshotJob {
    pub(crate) filter: AnyFilter,
    pub(crate) identity: Identity,
    pub(crate) name: String,
    pub(crate) kind: FilterKind,
    pub(crate) params_digest: u64,
    pub(crate) reserved: u64,
    /// The log segments the state covers (every record in them is in `filter`).
    pub(crate) wal_covered: Option<SegmentId>,
    /// Its number ([`Snapshotter::take`]).
    pub(crate) generation: u64,
    /// The merges from elsewhere `filter` holds, on disk once it is saved.
    pub(crate) merges: MergesHeld,
}

impl SnapshotJob {
    /// [`SnapshotJob::save`] on a blocking thread.
    pub(super) async fn save_off_thread(
        self,
        data: DataDir,
        telemetry: Telemetry,
        saved: Arc<Mutex<u64>>,
    ) -> Result<Option<SegmentId>, ReplicaError> {
        tokio::task::spawn_blocking(move || self.save(&data, &telemetry, &saved))
            .await
            .unwrap_or_else(|e| Err(ReplicaError::Config(format!("snapshot task: {e}"))))
    }

    /// Encodes and saves it, unless a newer snapshot was saved meanwhile; answers the log
    /// segments it covers (none if it was not saved).
    pub(crate) fn save(
        self,
        data: &DataDir,
        telemetry: &Telemetry,
        saved: &Mutex<u64>,
    ) -> Result<Option<SegmentId>, ReplicaError> {
        let state = self.filter.encode_state();
        let len = state.len();
        // Held while saving, so snapshots land in the order they were taken.
        let mut newest = saved.lock().expect("snapshot lock");
        if *newest > self.generation {
            return Ok(None);
        }
        data.save_snapshot(&Snapshot {
            identity: self.identity,
            filter: self.name,
            kind: self.kind,
            params_digest: self.params_digest,
            reserved: self.reserved,
            state,
            wal_covered: self.wal_covered.map(|k| k.0),
        })?;
        *newest = self.generation;
        self.merges.saved();
        telemetry.state_encoded(len);
        Ok(self.wal_covered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ReplicaConfig;

    const INTERVAL: Duration = Duration::from_secs(30);

    fn job(filter: &AnyFilter, generation: u64, covered: u64) -> SnapshotJob {
        SnapshotJob {
            filter: filter.clone(),
            identity: Identity {
                uuid: uuid::Uuid::nil(),
                replica: 1,
            },
            name: "t".into(),
            kind: filter.kind(),
            params_digest: filter.params_digest(),
            reserved: 0,
            wal_covered: Some(SegmentId(covered)),
            generation,
            merges: std::sync::Arc::new(crate::replica::core::UnloggedMerges::new(true)).mark(),
        }
    }

    fn telemetry() -> Telemetry {
        Telemetry::new("t", 1, 0.01, true)
    }

    #[test]
    fn an_older_snapshot_saved_late_never_overwrites_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::open(dir.path()).unwrap();
        let mut s = Snapshotter::new(Some(data.clone()), INTERVAL, Instant::now());
        let cfg = ReplicaConfig::for_kind("t", FilterKind::GBloom, 1_000, 0.01);
        let mut filter = AnyFilter::new(&cfg.filter, 1).unwrap();
        let (older, newer) = (s.take(), s.take());
        let old_job = job(&filter, older, 1);
        filter.add(b"later").unwrap();
        let new_job = job(&filter, newer, 2);
        let t = telemetry();
        assert_eq!(
            new_job.save(&data, &t, &s.saved()).unwrap(),
            Some(SegmentId(2))
        );
        // The older one covers fewer segments: saving it now would lose what the newer holds.
        assert_eq!(old_job.save(&data, &t, &s.saved()).unwrap(), None);
        let on_disk = data.load_snapshot().unwrap().unwrap();
        assert_eq!(on_disk.wal_covered, Some(2));
        let restored = AnyFilter::decode_state(FilterKind::GBloom, &on_disk.state).unwrap();
        assert!(restored.contains(b"later"));
    }

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
