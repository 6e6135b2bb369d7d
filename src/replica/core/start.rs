//! What a replica starts as, decided from what its data directory gave back and the replica id
//! it was granted: its state, its identity, its tag reservation, and whether anything must be
//! written before it serves. Pure: the shell reads the directory, claims the id and writes
//! what the answer asks for; the simulation (`src/sim/`) runs the same decisions.

use uuid::Uuid;

use crate::ReplicaId;
use crate::replica::durable::Identity;
use crate::replica::filter::AnyFilter;
use crate::replica::recovery::Restored;
use crate::wire::FilterKind;

/// A start before its replica id is claimed: what it asks the registry for.
pub(crate) struct Claiming {
    filter: AnyFilter,
    /// The identity's uuid: the snapshot's if it is kept.
    pub uuid: Uuid,
    /// The snapshot's replica id, asked for again if the identity is kept.
    pub preferred: Option<ReplicaId>,
    /// No tag at or below it is issued again.
    floor: u64,
    keep_id: bool,
    /// The identity and reservation already on disk, if the snapshot alone is the state.
    on_disk: Option<(Identity, Option<u64>)>,
    tagged: bool,
}

/// What a replica starts as.
pub(crate) struct Adopted {
    /// The state, on its replica id, its clock above every tag issued before.
    pub filter: AnyFilter,
    pub identity: Identity,
    /// Tags up to this one are reserved (on disk, if the replica has a data directory).
    pub reserved: u64,
    /// Whether the directory already holds this start's identity, reservation and state: a
    /// restart that changed nothing writes nothing. Otherwise the tag reservation (tagged
    /// kinds) is written before the replica serves, and a first snapshot as soon as it runs.
    pub unchanged: bool,
    /// The snapshot's replica id was asked for and another was granted.
    pub id_changed: bool,
}

/// A new uuid for the next run of a replica whose ids serve one run only, in the lineage of
/// `earlier`: its first 8 bytes (so every run of the replica shares them), the rest new
/// (the variant bits with them, so it stays a version-4 uuid). A run retires the claims its
/// lineage's earlier runs left in the registry, those that crashed before writing their
/// identity included (see the core's lease).
pub(crate) fn next_run(earlier: Uuid) -> Uuid {
    let mut bytes = *earlier.as_bytes();
    bytes[8..].copy_from_slice(&Uuid::new_v4().as_bytes()[8..]);
    Uuid::from_bytes(bytes)
}

/// Whether two runs' uuids are of one replica ([`next_run`]).
pub(crate) fn same_lineage(a: Uuid, b: Uuid) -> bool {
    a.as_bytes()[..8] == b.as_bytes()[..8]
}

impl Claiming {
    /// The start of a replica of `kind` from `restored` (`None`: afresh, from `fresh`). A
    /// kind whose ids serve one run only keeps its state and takes a new identity.
    pub(crate) fn new(kind: FilterKind, restored: Option<Restored>, fresh: AnyFilter) -> Self {
        let tagged = kind.tagged();
        match restored {
            Some(mut r) => {
                r.trusted &= kind.reuses_ids();
                let uuid = match r.trusted {
                    true => r.identity.uuid,
                    false => next_run(r.identity.uuid),
                };
                let on_disk =
                    (r.trusted && r.snapshot_is_state).then_some((r.identity, r.saved_reserved));
                Claiming {
                    filter: r.filter,
                    uuid,
                    preferred: r.trusted.then_some(r.identity.replica),
                    floor: r.floor,
                    keep_id: r.trusted,
                    on_disk,
                    tagged,
                }
            }
            None => Claiming {
                filter: fresh,
                uuid: Uuid::new_v4(),
                preferred: None,
                floor: 0,
                keep_id: false,
                on_disk: None,
                tagged,
            },
        }
    }

    /// With the id granted (`replica`, or the node's shared one) above `claim_floor`.
    pub(crate) fn settle(self, uuid: Uuid, replica: ReplicaId, claim_floor: u64) -> Adopted {
        let mut filter = self.filter;
        let kept = self.keep_id && Some(replica) == self.preferred;
        if kept {
            filter.advance_clock(self.floor);
        } else {
            filter.set_replica(replica);
        }
        // A retired id's earlier holders may have issued every tag up to the floor (and a
        // shared id's holder, this node, every tag up to its last reservation).
        filter.advance_clock(claim_floor);
        filter.track_deltas(true);
        let identity = Identity { uuid, replica };
        let reserved = filter.clock().max(self.floor);
        let tagged = self.tagged;
        let unchanged = self.on_disk.is_some_and(|(on_disk, saved)| {
            on_disk == identity && (!tagged || saved == Some(reserved))
        });
        Adopted {
            filter,
            identity,
            reserved,
            unchanged,
            id_changed: self.keep_id && !kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ReplicaConfig;

    fn fresh(kind: FilterKind) -> AnyFilter {
        AnyFilter::new(&ReplicaConfig::for_kind("t", kind, 100, 0.01).filter, 0).unwrap()
    }

    fn restored(kind: FilterKind, trusted: bool, snapshot_is_state: bool) -> Restored {
        let mut filter = fresh(kind);
        filter.set_replica(3);
        filter.add(b"x").unwrap();
        Restored {
            filter,
            identity: Identity {
                uuid: Uuid::from_u128(9),
                replica: 3,
            },
            floor: 50,
            trusted,
            saved_reserved: Some(50),
            snapshot_is_state,
        }
    }

    #[test]
    fn a_restart_that_changed_nothing_writes_nothing() {
        let kind = FilterKind::OrCuckoo;
        let c = Claiming::new(kind, Some(restored(kind, true, true)), fresh(kind));
        assert_eq!((c.uuid, c.preferred), (Uuid::from_u128(9), Some(3)));
        let a = c.settle(Uuid::from_u128(9), 3, 0);
        assert!(a.unchanged && !a.id_changed);
        assert_eq!(a.reserved, 50);
        assert!(a.filter.clock() >= 50, "no tag at or below the floor again");
        assert!(a.filter.contains(b"x"));
    }

    #[test]
    fn another_id_or_a_replayed_log_means_writing_the_identity_first() {
        let kind = FilterKind::OrCuckoo;
        let c = Claiming::new(kind, Some(restored(kind, true, true)), fresh(kind));
        let a = c.settle(Uuid::from_u128(9), 4, 0);
        assert!(!a.unchanged && a.id_changed);
        assert_eq!(a.filter.replica(), 4);
        let c = Claiming::new(kind, Some(restored(kind, true, false)), fresh(kind));
        assert!(
            !c.settle(Uuid::from_u128(9), 3, 0).unchanged,
            "log replayed"
        );
        // Untrusted (no reservation): the state stays, under a new uuid and id.
        let c = Claiming::new(kind, Some(restored(kind, false, true)), fresh(kind));
        assert!(c.preferred.is_none() && c.uuid != Uuid::from_u128(9));
        let uuid = c.uuid;
        let a = c.settle(uuid, 7, 0);
        assert!(!a.unchanged && a.filter.contains(b"x"));
    }

    #[test]
    fn each_run_of_a_kind_whose_ids_serve_one_run_is_new_in_its_replicas_lineage() {
        let kind = FilterKind::CountMinSketch;
        assert!(!kind.reuses_ids());
        let mut r = restored(kind, true, true);
        r.identity.uuid = Uuid::new_v4();
        let earlier = r.identity.uuid;
        let c = Claiming::new(kind, Some(r), fresh(kind));
        assert!(c.preferred.is_none() && c.uuid != earlier);
        assert!(same_lineage(c.uuid, earlier));
        assert_eq!(c.uuid.get_version_num(), 4);
        assert!(!same_lineage(Uuid::new_v4(), earlier), "another replica's");
    }

    #[test]
    fn a_fresh_start_takes_the_granted_id_above_its_floor() {
        let kind = FilterKind::OrCuckoo;
        let c = Claiming::new(kind, None, fresh(kind));
        let uuid = c.uuid;
        let a = c.settle(uuid, 5, 1_000);
        assert!(!a.unchanged);
        assert_eq!(a.identity, Identity { uuid, replica: 5 });
        assert!(a.filter.clock() >= 1_000 && a.reserved >= 1_000);
    }
}
