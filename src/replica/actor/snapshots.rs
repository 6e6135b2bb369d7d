//! A snapshot's save ([`SnapshotJob`]): taken on the actor's thread, encoded and saved on
//! another, never over a newer one. When one is due, and what is unsaved, is the core's
//! ([`crate::replica::core::Snapshotter`]).

use std::sync::{Arc, Mutex};

use crate::replica::ReplicaError;
use crate::replica::core::MergesHeld;
use crate::replica::durable::{DataDir, Identity, Snapshot};
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::Telemetry;
use crate::replica::wal::SegmentId;
use crate::wire::FilterKind;

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
    use std::time::{Duration, Instant};

    use super::*;
    use crate::replica::ReplicaConfig;
    use crate::replica::core::Snapshotter;

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
}
