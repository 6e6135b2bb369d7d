//! Whether a replica's state holds merges that its own log does not.
//!
//! A replica's write-ahead log holds its own updates, and its snapshots hold its whole state;
//! what it merged from peers (deltas, full states, state pieces) and from its users (a merge
//! or an import of a state) reaches disk only with the next snapshot. An add of a grow-only
//! kind records only what it changed: a Bloom filter's add, the bits it set; a grow-only
//! cuckoo filter's add of an item already held, nothing. Acknowledged as durable once that
//! record is synced, it still rests on the merged parts, which a crash before the next
//! snapshot loses: the simulation found it (three replicas, Bloom kinds: an add whose bits a
//! peer's delta had set). So while the state holds merges no saved snapshot does, each add
//! also records its whole footprint ([`crate::DeltaState::record_footprint`]).
//!
//! The ledger counts merges under the filter's write lock; a snapshot marks how many its
//! copy holds (taken under the lock too) and, once saved, clears them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::replica::filter::AnyFilter;

/// Merges made and merges a saved snapshot holds, of one replica. Shared by the actor and the
/// tasks that apply updates outside it.
#[derive(Debug, Default)]
pub(crate) struct UnloggedMerges {
    /// Without a log, nothing is durable and nothing is recorded.
    logged: bool,
    merged: AtomicU64,
    saved: AtomicU64,
}

impl UnloggedMerges {
    /// The ledger of a replica with a write-ahead log (`logged`) or without one, whose state
    /// is all on disk as it starts (restored, or empty).
    pub(crate) fn new(logged: bool) -> Self {
        UnloggedMerges {
            logged,
            ..Default::default()
        }
    }

    /// A merge from elsewhere changed (or may have changed) the state. Called under the
    /// filter's write lock.
    pub(crate) fn merged(&self) {
        self.merged.fetch_add(1, Ordering::AcqRel);
    }

    /// The merges a copy of the state taken now holds (called under the filter's lock), to
    /// clear once a snapshot of that copy is saved.
    pub(crate) fn mark(self: &Arc<Self>) -> MergesHeld {
        MergesHeld {
            ledger: self.clone(),
            through: self.merged.load(Ordering::Acquire),
        }
    }

    /// Whether the state holds merges that no saved snapshot does.
    pub(crate) fn pending(&self) -> bool {
        self.logged && self.merged.load(Ordering::Acquire) > self.saved.load(Ordering::Acquire)
    }

    /// Whether adds record their whole footprint now. Asked under the filter's write lock,
    /// the answer holds while it is held (merges take it too): a batch asks once.
    pub(crate) fn footprints(&self) -> bool {
        #[cfg(test)]
        if NO_FOOTPRINTS.get() {
            return false;
        }
        self.pending()
    }

    /// After an add of `item` to `f` (under its write lock): records the item's whole
    /// footprint while merges are unlogged. Whether it did: the add then waits for its
    /// commit even if it changed nothing itself.
    pub(crate) fn record_add(&self, f: &mut AnyFilter, item: &[u8]) -> bool {
        self.footprints() && f.record_footprint(item)
    }
}

#[cfg(test)]
thread_local! {
    /// Records no footprints (the defect this ledger fixes), on this thread: for the
    /// simulation to show it finds it.
    pub(crate) static NO_FOOTPRINTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The merges a snapshot's copy of the state holds.
pub(crate) struct MergesHeld {
    ledger: Arc<UnloggedMerges>,
    through: u64,
}

impl MergesHeld {
    /// The snapshot was saved: its merges are on disk.
    pub(crate) fn saved(self) {
        self.ledger.saved.fetch_max(self.through, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::FilterSpec;
    use crate::wire::FilterKind;

    fn bloom() -> AnyFilter {
        let mut f = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, 1000, 0.01), 1).unwrap();
        f.track_deltas(true);
        f
    }

    #[test]
    fn merges_are_pending_until_a_snapshot_that_holds_them_is_saved() {
        let ledger = Arc::new(UnloggedMerges::new(true));
        let mut f = bloom();
        f.add(b"x").unwrap();
        f.take_delta();
        assert!(!ledger.pending() && !ledger.record_add(&mut f, b"x"));
        ledger.merged();
        let (first, older) = (ledger.mark(), ledger.mark());
        assert!(ledger.pending());
        assert!(ledger.record_add(&mut f, b"x"), "the whole footprint");
        assert!(f.take_delta().is_some());
        ledger.merged(); // after the snapshot's copy
        first.saved();
        assert!(ledger.pending(), "the later merge is not in that snapshot");
        ledger.mark().saved();
        assert!(!ledger.pending());
        older.saved(); // an older snapshot saved late changes nothing
        assert!(!ledger.pending());
    }

    #[test]
    fn without_a_log_nothing_is_recorded() {
        let ledger = UnloggedMerges::new(false);
        let mut f = bloom();
        f.add(b"x").unwrap();
        ledger.merged();
        assert!(!ledger.record_add(&mut f, b"x"));
    }
}
