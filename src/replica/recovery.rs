//! Recovery at start: the snapshot, the tag reservation, and the write-ahead log replayed on
//! top of the snapshot before the state is trusted.

use super::config::ReplicaConfig;
use super::durable::{DataDir, DurableError, HWM_FILE, Identity, SNAPSHOT_FILE};
use super::filter::AnyFilter;
use super::wal::{self, Replayed, SegmentId, WAL_DIR, WalLimits};

/// What a data directory gave back.
pub(crate) struct Restored {
    /// The state: the snapshot, with the log's records merged.
    pub filter: AnyFilter,
    /// Whose state it is.
    pub identity: Identity,
    /// The tag floor: no tag at or below it is issued again.
    pub floor: u64,
    /// Whether the identity may be kept (its tag reservation is trustworthy); if not, the
    /// state is kept but tags go under a new replica id.
    pub trusted: bool,
    /// The reservation file's tag reservation, where it is this identity's.
    pub saved_reserved: Option<u64>,
    /// Whether the snapshot alone is the state: no log record was merged into it, and the log
    /// was read without a torn tail or damage to cut off.
    pub snapshot_is_state: bool,
}

/// What recovery found: the restored state (`None` when it must start afresh) and the
/// write-ahead log as replayed, for the log writer to continue.
pub(crate) struct Recovered {
    pub state: Option<Restored>,
    pub wal: Replayed,
}

/// Loads what the data directory holds: the snapshot, then every write-ahead log record it
/// does not cover. `None` when the state must start afresh (docs/DESIGN.md section 4: a replica
/// without its durable state claims a new id). Answers the replayed log too, for the writer.
pub(crate) fn restore(
    data: &DataDir,
    cfg: &ReplicaConfig,
    fresh: &AnyFilter,
) -> Result<Recovered, DurableError> {
    let Some(SoundSnapshot {
        mut filter,
        identity: snap_identity,
        reserved,
        wal_covered: covered,
    }) = load_snapshot(data, cfg, fresh)?
    else {
        // Without the snapshot the log cannot be trusted to be this state's (nor is it
        // complete: it is truncated at every snapshot): keep it aside for inspection.
        let dir = data.path().join(WAL_DIR);
        if dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
            let to = wal::quarantine(&dir)?;
            tracing::warn!(to = %to.display(), "write-ahead log without a snapshot moved aside");
        }
        let replayed = wal::replay(&dir, placeholder(), None, WalLimits::default(), |_| {})?;
        return Ok(Recovered {
            state: None,
            wal: replayed,
        });
    };
    let replayed = replay_into(data, &mut filter, snap_identity, covered)?;
    // Tags issued after the snapshot are known only through the reservation file: without a
    // trustworthy one, keep the state but issue tags under a new id.
    let reservation = match data.load_reservation() {
        Ok(r) => r,
        Err(e @ DurableError::Corrupt { .. }) => {
            tracing::warn!(error = %e, "tag reservation is damaged");
            data.quarantine(HWM_FILE);
            None
        }
        Err(e) => return Err(e),
    };
    let saved_reserved = reservation
        .as_ref()
        .filter(|r| r.identity == snap_identity)
        .map(|r| r.reserved);
    let snapshot_is_state =
        replayed.records == 0 && !replayed.torn && replayed.damaged_regions == 0;
    let floor = match reservation {
        Some(r) if r.identity == snap_identity => Some(r.reserved.max(reserved)),
        _ if !fresh.kind().tagged() => Some(0),
        _ => None,
    };
    if floor.is_none() {
        tracing::warn!("no tag reservation for the snapshot: keeping the state, new replica id");
    }
    let restored = Restored {
        filter,
        identity: snap_identity,
        floor: floor.unwrap_or(0),
        trusted: floor.is_some(),
        saved_reserved,
        snapshot_is_state,
    };
    Ok(Recovered {
        state: Some(restored),
        wal: replayed,
    })
}

/// A snapshot that decoded and belongs to this replica's filter.
struct SoundSnapshot {
    filter: AnyFilter,
    identity: Identity,
    reserved: u64,
    wal_covered: Option<SegmentId>,
}

/// The snapshot, if it is sound.
fn load_snapshot(
    data: &DataDir,
    cfg: &ReplicaConfig,
    fresh: &AnyFilter,
) -> Result<Option<SoundSnapshot>, DurableError> {
    let snap = match data.load_snapshot() {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        Err(e @ DurableError::Corrupt { .. }) => {
            tracing::warn!(error = %e, "snapshot is damaged: starting afresh under a new replica id");
            data.quarantine(SNAPSHOT_FILE);
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if snap.filter != cfg.name
        || snap.kind != fresh.kind()
        || snap.params_digest != fresh.params_digest()
    {
        return Err(DurableError::Mismatch {
            path: data.path().join(SNAPSHOT_FILE),
            found: format!(
                "{} ({}, params {:#x})",
                snap.filter, snap.kind, snap.params_digest
            ),
            expected: format!(
                "{} ({}, params {:#x})",
                cfg.name,
                fresh.kind(),
                fresh.params_digest()
            ),
        });
    }
    match AnyFilter::decode_state(snap.kind, &snap.state) {
        Ok(filter) => Ok(Some(SoundSnapshot {
            filter,
            identity: snap.identity,
            reserved: snap.reserved,
            wal_covered: snap.wal_covered.map(SegmentId),
        })),
        Err(e) => {
            tracing::warn!(error = %e, "snapshot does not decode: starting afresh under a new replica id");
            data.quarantine(SNAPSHOT_FILE);
            Ok(None)
        }
    }
}

/// Merges the log's records after `covered` into `filter`. A log that is damaged past its
/// torn tail, or another replica's, is moved aside after what could be read was merged.
fn replay_into(
    data: &DataDir,
    filter: &mut AnyFilter,
    identity: Identity,
    covered: Option<SegmentId>,
) -> Result<Replayed, DurableError> {
    let dir = data.path().join(WAL_DIR);
    let mut unreadable = 0u64;
    let mut merge = |record: &[u8]| {
        // Our own delta-states, checksummed: a failure is a version change, not an attack.
        if let Err(e) = filter.merge_delta_bytes(record) {
            unreadable += 1;
            tracing::error!(error = %e, "a write-ahead log record does not merge");
        }
    };
    let replayed = match wal::replay(&dir, identity, covered, WalLimits::default(), &mut merge) {
        Ok(r) => r,
        Err(e @ (DurableError::Corrupt { .. } | DurableError::ForeignLog { .. })) => {
            let to = wal::quarantine(&dir)?;
            tracing::error!(error = %e, to = %to.display(),
                "write-ahead log damaged: kept what could be read, moved it aside");
            wal::replay(&dir, identity, None, WalLimits::default(), |_| {})?
        }
        Err(e) => return Err(e),
    };
    if replayed.damaged_regions > 0 {
        tracing::warn!(
            records = replayed.records,
            damaged_regions = replayed.damaged_regions,
            damaged_bytes = replayed.damaged_bytes,
            "write-ahead log replayed past damage: the records in the damaged bytes are lost, \
             every intact record after them was kept"
        );
    }
    if replayed.records > 0 || replayed.torn_bytes > 0 {
        tracing::info!(
            records = replayed.records,
            unreadable,
            torn_bytes = replayed.torn_bytes,
            "write-ahead log replayed on top of the snapshot"
        );
    }
    Ok(replayed)
}

/// The identity checked against an empty log (it has no segment to check).
fn placeholder() -> Identity {
    Identity {
        uuid: uuid::Uuid::nil(),
        replica: 0,
    }
}
