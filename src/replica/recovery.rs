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
    /// Log records that did not merge (a version change; logged). Read by the simulation.
    #[cfg_attr(not(test), allow(dead_code))]
    pub unmerged: u64,
    /// Why the log was moved aside (`wal.corrupt`) after what could be read, if it was
    /// (logged). Read by the simulation.
    #[cfg_attr(not(test), allow(dead_code))]
    pub quarantined: Option<String>,
}

/// Loads what the data directory holds: the snapshot, then every write-ahead log record it
/// does not cover. `None` when the state must start afresh (docs/DESIGN.md section 4: a replica
/// without its durable state claims a new id). Answers the replayed log too, for the writer.
pub(crate) fn restore(
    data: &DataDir,
    cfg: &ReplicaConfig,
    fresh: &AnyFilter,
) -> Result<Recovered, DurableError> {
    match load_snapshot(data, cfg, fresh)? {
        Some(snapshot) => on_snapshot(data, fresh, snapshot),
        None => without_snapshot(data, fresh),
    }
}

/// [`restore`] where the directory has a sound snapshot; `None`, with nothing else read or
/// made, where it has none (or is not there at all).
pub(crate) fn restore_on_snapshot(
    data: &DataDir,
    cfg: &ReplicaConfig,
    fresh: &AnyFilter,
) -> Result<Option<Recovered>, DurableError> {
    load_snapshot(data, cfg, fresh)?
        .map(|snapshot| on_snapshot(data, fresh, snapshot))
        .transpose()
}

/// No snapshot: a new replica stopped before its first was saved (it serves from its
/// start, so adds acknowledged at `durable` are in the log only), or its snapshot was
/// damaged. The log's records are the filter's all the same: merged into a fresh state,
/// kept under a new identity (no snapshot vouches for its tags).
fn without_snapshot(data: &DataDir, fresh: &AnyFilter) -> Result<Recovered, DurableError> {
    let dir = data.path().join(WAL_DIR);
    let disk = data.disk();
    // No log, or an empty one (a new replica's): no copy of the fresh state.
    if !disk.list_dir(&dir).is_ok_and(|names| !names.is_empty()) {
        let limits = WalLimits::default();
        let replayed = wal::replay_on(disk.clone(), &dir, placeholder(), None, limits, |_| {})?;
        return Ok(Recovered {
            state: None,
            wal: replayed,
            unmerged: 0,
            quarantined: None,
        });
    }
    let mut filter = fresh.clone();
    let (replayed, unmerged, quarantined) = replay_into(data, &mut filter, placeholder(), None)?;
    let state = (replayed.records > 0).then(|| Restored {
        filter,
        identity: placeholder(),
        floor: 0,
        trusted: false,
        saved_reserved: None,
        snapshot_is_state: false,
    });
    Ok(Recovered {
        state,
        wal: replayed,
        unmerged,
        quarantined,
    })
}

/// [`restore`] on the sound `snapshot`: the log's records after it merged, and the tag
/// reservation read.
fn on_snapshot(
    data: &DataDir,
    fresh: &AnyFilter,
    snapshot: SoundSnapshot,
) -> Result<Recovered, DurableError> {
    let SoundSnapshot {
        mut filter,
        identity: snap_identity,
        reserved,
        wal_covered: covered,
    } = snapshot;
    let (replayed, unmerged, quarantined) = replay_into(data, &mut filter, snap_identity, covered)?;
    // Tags issued after the snapshot are known only through the reservation file: without a
    // trustworthy one, keep the state but issue tags under a new id.
    // A kind without tags has no reservation to keep (none is written for it): not read.
    let reservation = match fresh.kind().tagged() {
        true => data.load_reservation(),
        false => Ok(None),
    };
    let reservation = match reservation {
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
        unmerged,
        quarantined,
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
/// torn tail is moved aside after what could be read was merged. Answers the log as replayed,
/// the records that did not merge, and whether the log was moved aside.
fn replay_into(
    data: &DataDir,
    filter: &mut AnyFilter,
    identity: Identity,
    covered: Option<SegmentId>,
) -> Result<(Replayed, u64, Option<String>), DurableError> {
    let dir = data.path().join(WAL_DIR);
    let mut unreadable = 0u64;
    let mut merge = |record: &[u8]| {
        // Our own delta-states, checksummed: a failure is a version change, not an attack.
        if let Err(e) = filter.merge_delta_bytes(record) {
            unreadable += 1;
            tracing::error!(error = %e, "a write-ahead log record does not merge");
        }
    };
    let disk = data.disk();
    let limits = WalLimits::default();
    let mut quarantined = None;
    let replayed = match wal::replay_on(disk.clone(), &dir, identity, covered, limits, &mut merge) {
        Ok(r) => r,
        Err(e @ DurableError::Corrupt { .. }) => {
            let to = wal::quarantine_on(&**disk, &dir)?;
            tracing::error!(error = %e, to = %to.display(),
                "write-ahead log damaged: kept what could be read, moved it aside");
            quarantined = Some(e.to_string());
            wal::replay_on(disk.clone(), &dir, identity, None, limits, |_| {})?
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
    Ok((replayed, unreadable, quarantined))
}

/// The identity checked against an empty log (it has no segment to check).
fn placeholder() -> Identity {
    Identity {
        uuid: uuid::Uuid::nil(),
        replica: 0,
    }
}
