//! How an import (issue 51: a filter in another library's format merged into a replica) is
//! answered: at which level, and by which path its merged state reaches disk and peers.
//!
//! An import below `replicated` merges as a state from elsewhere does: on disk only with the
//! next snapshot ([`super::UnloggedMerges`]), at peers only by anti-entropy, which no peer
//! acknowledges. At `replicated` it merges as a local update instead: the bits it newly sets
//! join the pending delta, which the commit pipeline writes to the log (synced) and publishes
//! as a delta that peers confirm, exactly as an add's ([`crate::replica::ack::AckTracker`]).
//! That delta must travel as one message: one over the transport's `max_payload` would go
//! out as a (chunked, unacknowledged) full-state push instead and the import would time out.
//! So an import at `replicated` whose delta exceeds [`import_delta_limit`] is refused before
//! anything merges, with the sizes named.

use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;

use super::ENVELOPE_OVERHEAD;

/// The path an import takes, once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImportPath {
    /// Merged as a state from elsewhere, answered at once (`local`).
    Merge,
    /// Merged as a state from elsewhere, answered once a snapshot holding it is saved
    /// (`logged`, `durable`: the log does not hold such a merge).
    MergeThenSnapshot,
    /// Merged as a local update: its delta logged and published, answered once peers
    /// confirm it (`replicated`).
    AsDelta,
}

/// The level an import is answered at: `asked` in `Crpf-Ack`, else the filter's `default`.
pub(crate) fn import_level(asked: Option<AckLevel>, default: AckLevel) -> AckLevel {
    asked.unwrap_or(default)
}

/// The path of an import at `level` (see [`ImportPath`]).
pub(crate) fn import_path(level: AckLevel) -> ImportPath {
    match level {
        AckLevel::Local => ImportPath::Merge,
        AckLevel::Logged | AckLevel::Durable => ImportPath::MergeThenSnapshot,
        AckLevel::Replicated => ImportPath::AsDelta,
    }
}

/// The largest encoded delta an import at `replicated` may have, for a transport whose
/// messages carry at most `max_payload` bytes: half of what an envelope leaves, the other
/// half for the local updates that share its commit (a full default delta of adds, up to
/// `delta_max_updates` of them, fits that half). 523,776 bytes at NATS's default 1 MiB.
pub(crate) fn import_delta_limit(max_payload: usize) -> usize {
    max_payload.saturating_sub(ENVELOPE_OVERHEAD) / 2
}

/// Whether an import at `replicated` whose delta encodes in `delta_bytes` is taken, with a
/// transport of `max_payload`: else [`ReplicaError::ImportTooLarge`], and nothing merges.
pub(crate) fn admit_replicated_import(
    delta_bytes: usize,
    max_payload: usize,
) -> Result<(), ReplicaError> {
    let limit = import_delta_limit(max_payload);
    if delta_bytes > limit {
        return Err(ReplicaError::ImportTooLarge {
            bytes: delta_bytes,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_at_replicated_travels_as_a_delta_peers_confirm() {
        // Asked wins; else the filter's default, `replicated` included (no longer capped).
        assert_eq!(
            import_level(Some(AckLevel::Replicated), AckLevel::Local),
            AckLevel::Replicated
        );
        assert_eq!(
            import_level(None, AckLevel::Replicated),
            AckLevel::Replicated
        );
        assert_eq!(
            import_level(Some(AckLevel::Local), AckLevel::Replicated),
            AckLevel::Local
        );
        assert_eq!(import_path(AckLevel::Local), ImportPath::Merge);
        // The log holds no merged state: `logged` waits for the snapshot as `durable` does.
        assert_eq!(import_path(AckLevel::Logged), ImportPath::MergeThenSnapshot);
        assert_eq!(
            import_path(AckLevel::Durable),
            ImportPath::MergeThenSnapshot
        );
        assert_eq!(import_path(AckLevel::Replicated), ImportPath::AsDelta);
    }

    #[test]
    fn a_replicated_import_whose_delta_needs_more_than_half_a_message_is_refused() {
        let max = 1 << 20;
        let limit = import_delta_limit(max);
        assert_eq!(limit, ((1 << 20) - ENVELOPE_OVERHEAD) / 2);
        // Room for a full commit of adds beside it, and the envelope.
        assert!(2 * limit + ENVELOPE_OVERHEAD <= max);
        assert!(admit_replicated_import(0, max).is_ok());
        assert!(admit_replicated_import(limit, max).is_ok());
        match admit_replicated_import(limit + 1, max) {
            Err(ReplicaError::ImportTooLarge { bytes, limit: l }) => {
                assert_eq!((bytes, l), (limit + 1, limit))
            }
            other => panic!("{other:?}"),
        }
        // A transport with less room than an envelope takes no import at `replicated`.
        assert!(admit_replicated_import(1, ENVELOPE_OVERHEAD).is_err());
    }
}
