//! Replica id claims as leases (docs/DESIGN.md section 4): what the registry holds for each id of a
//! filter, and how an id is retired and given to a new replica without any tag being issued
//! twice.
//!
//! A replica holds its id by renewing its claim, and may issue tags only up to the reservation
//! its claim records. An id whose claim nobody renewed for `retire_after` is retired by any
//! replica that sees that, with a floor at or above every tag its holder could have issued (its
//! recorded reservation); a later claimant takes the id and issues tags above the floor only.
//! Its entries and their tags stay where they are; only the id is handed on.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{MAX_COUNTER, ReplicaId};

/// What the registry holds for one replica id of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimRecord {
    /// Held by a running replica, which issues tags up to `reserved` and no further.
    Held {
        /// The holder.
        claimant: Uuid,
        /// The highest timestamp the holder may issue.
        reserved: u64,
    },
    /// Retired: every tag of this id up to `floor` may have been issued; a new holder issues
    /// tags above it only.
    Retired {
        /// The highest timestamp a previous holder may have issued.
        floor: u64,
    },
}

impl ClaimRecord {
    /// The record's encoding in the registry (JSON, so that operators can read it with
    /// `nats kv get`).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a claim record encodes")
    }

    /// Decodes a record. A bare uuid is a claim made before claims had reservations: its
    /// holder's tags are unknown, so it reserves every timestamp and is never retired.
    pub fn decode(bytes: &[u8]) -> Option<ClaimRecord> {
        serde_json::from_slice(bytes).ok().or_else(|| {
            let claimant = std::str::from_utf8(bytes).ok()?.trim().parse().ok()?;
            Some(ClaimRecord::Held {
                claimant,
                reserved: MAX_COUNTER,
            })
        })
    }

    /// Whether `claimant` holds the id.
    pub fn held_by(&self, claimant: Uuid) -> bool {
        matches!(self, ClaimRecord::Held { claimant: c, .. } if *c == claimant)
    }

    /// The timestamp a new holder starts above: the floor of a retired id, 0 for a free one.
    pub fn floor(&self) -> u64 {
        match self {
            ClaimRecord::Held { reserved, .. } => *reserved,
            ClaimRecord::Retired { floor } => *floor,
        }
    }

    /// Whether the holder's reservation is known, so that the id can be retired safely.
    pub fn retirable(&self) -> bool {
        matches!(self, ClaimRecord::Held { reserved, .. } if *reserved < MAX_COUNTER)
    }
}

/// A replica id and what the registry holds for it, at a revision (for compare-and-set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimEntry {
    /// The id.
    pub id: ReplicaId,
    /// Its record.
    pub record: ClaimRecord,
    /// The record's revision: it changes with every renewal.
    pub revision: u64,
}

/// A claimed id: the claimant issues tags above `floor` only (0 for an id never used; the
/// floor of a retired id; the claimant's own reservation when it takes its id back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The id.
    pub id: ReplicaId,
    /// The highest timestamp an earlier holder may have issued.
    pub floor: u64,
}

/// The outcome of renewing a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Still ours, with the new reservation recorded.
    Held,
    /// No longer ours: the id was retired (and perhaps claimed again) while we were silent.
    /// The replica must stop issuing tags under it.
    Lost,
}

/// The lowest id a claim can take among `entries` (sorted or not): `preferred` if it is free,
/// retired or already the claimant's, else the lowest retired id, else the lowest id never used.
/// Retired ids go first, so that the ids in causal contexts stay as few as the replicas that
/// run at once.
pub(crate) fn pick_id(
    entries: &[ClaimEntry],
    claimant: Uuid,
    preferred: Option<ReplicaId>,
) -> Option<(ReplicaId, Option<ClaimEntry>)> {
    let find = |id: ReplicaId| entries.iter().find(|e| e.id == id).copied();
    let available = |e: &Option<ClaimEntry>| {
        e.is_none_or(|e| {
            e.record.held_by(claimant) || matches!(e.record, ClaimRecord::Retired { .. })
        })
    };
    if let Some(p) = preferred.filter(|&p| p != 0) {
        let e = find(p);
        if available(&e) {
            return Some((p, e));
        }
    }
    let retired = entries
        .iter()
        .filter(|e| matches!(e.record, ClaimRecord::Retired { .. }))
        .min_by_key(|e| e.id);
    if let Some(e) = retired {
        return Some((e.id, Some(*e)));
    }
    (1..=ReplicaId::MAX)
        .find(|id| find(*id).is_none())
        .map(|id| (id, None))
}

/// What [`take_back`] found of a claimant's lost id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakeBack {
    /// Ours again: tags above `floor` (every tag any holder may have issued under it,
    /// ours included), up to `reserved`, which the registry confirmed.
    Taken {
        /// The highest timestamp an earlier holder may have issued.
        floor: u64,
        /// The reservation recorded for the claimant.
        reserved: u64,
    },
    /// Another claimant holds it now: tags under it are not ours to issue.
    HeldByOther,
}

/// Takes back `id` of `namespace` for `claimant`, whose claim was retired while it could not
/// renew it (a partition from the registry longer than `retire_after`), recording a
/// reservation of `block` tags above the retirement's floor (or `want`, if higher).
///
/// Why this is safe: the retirement recorded a floor at or above every tag the claimant could
/// issue, and whoever held the id since issued tags at most up to its own reservation, which
/// a later retirement's floor covers too; the claimant issues tags above the floor only. An id
/// held by another is left alone ([`TakeBack::HeldByOther`]); an id claimed in a race is given
/// back at once, so nothing is left to retire later.
pub(crate) async fn take_back(
    registry: &dyn super::IdRegistry,
    namespace: &str,
    id: ReplicaId,
    claimant: Uuid,
    block: u64,
    want: u64,
) -> Result<TakeBack, super::TransportError> {
    let claims = registry.replica_claims(namespace.to_string()).await?;
    let held_by_other = |claims: &[ClaimEntry]| {
        claims.iter().any(|e| {
            e.id == id
                && matches!(e.record, ClaimRecord::Held { .. })
                && !e.record.held_by(claimant)
        })
    };
    if held_by_other(&claims) {
        return Ok(TakeBack::HeldByOther);
    }
    let claim = registry
        .claim_replica_id(namespace.to_string(), claimant, Some(id))
        .await?;
    if claim.id != id {
        // Another claimant took it between the listing and the claim: give the id this claim
        // took back at once (nobody issued a tag under it: the claimant has not).
        let claims = registry.replica_claims(namespace.to_string()).await?;
        if let Some(e) = claims
            .iter()
            .find(|e| e.id == claim.id && e.record.held_by(claimant))
        {
            registry
                .retire_claim(namespace.to_string(), e.id, e.revision, e.record.floor())
                .await?;
        }
        return Ok(TakeBack::HeldByOther);
    }
    let reserved = claim.floor.saturating_add(block).max(want);
    match registry
        .renew_claim(namespace.to_string(), id, claimant, reserved)
        .await?
    {
        Renewal::Held => Ok(TakeBack::Taken {
            floor: claim.floor,
            reserved,
        }),
        Renewal::Lost => Ok(TakeBack::HeldByOther),
    }
}

/// Which ids of a registry namespace went unrenewed for long enough to retire: the revision
/// of each other claim as last seen, and since when it has not changed. Shared by a replica's
/// own lease and a node's shared id ([`crate::replica::SharedId`]).
#[derive(Debug, Default)]
pub(crate) struct StaleWatch {
    seen: std::collections::HashMap<ReplicaId, (u64, std::time::Instant)>,
    /// Ids held and retired at the last look.
    pub live_ids: usize,
    pub retired_ids: usize,
    /// Ids held at the last look whose claims changed within the window last asked of
    /// [`StaleWatch::note_known`] (this replica's own always).
    pub known_ids: usize,
}

impl StaleWatch {
    /// Counts the held ids among `claims` whose claim was renewed (its revision changed, as
    /// this watch saw it) within `window` of `now`, `me` always, into `known_ids`: the
    /// replicas a `replicated` update's majority is of. An id silent for longer would be
    /// retired; where the kind never retires ids (they serve one run), its old ones would
    /// otherwise count for good. A zero `window` counts every held id. Call after
    /// [`StaleWatch::stale`], which records the revisions.
    pub(crate) fn note_known(
        &mut self,
        me: ReplicaId,
        claims: &[ClaimEntry],
        now: std::time::Instant,
        window: std::time::Duration,
    ) {
        self.known_ids = claims
            .iter()
            .filter(|e| matches!(e.record, ClaimRecord::Held { .. }))
            .filter(|e| {
                e.id == me
                    || window.is_zero()
                    || self
                        .seen
                        .get(&e.id)
                        .is_none_or(|(_, since)| now.duration_since(*since) < window)
            })
            .count();
    }

    /// Which of `claims` to retire at `now`: held by another claimant than `me`, with a known
    /// reservation, unchanged for `retire_after` (zero: never). Updates what was seen.
    pub(crate) fn stale(
        &mut self,
        me: ReplicaId,
        claims: &[ClaimEntry],
        now: std::time::Instant,
        retire_after: std::time::Duration,
    ) -> Vec<ClaimEntry> {
        self.live_ids = claims
            .iter()
            .filter(|e| matches!(e.record, ClaimRecord::Held { .. }))
            .count();
        self.retired_ids = claims.len() - self.live_ids;
        self.seen
            .retain(|id, _| claims.iter().any(|e| e.id == *id && e.record.retirable()));
        let mut stale = Vec::new();
        for e in claims.iter().filter(|e| e.id != me && e.record.retirable()) {
            let seen = self.seen.entry(e.id).or_insert((e.revision, now));
            if seen.0 != e.revision {
                *seen = (e.revision, now);
            } else if !retire_after.is_zero() && now.duration_since(seen.1) >= retire_after {
                stale.push(*e);
            }
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{IdRegistry, InProcessBus};

    #[tokio::test]
    async fn a_retired_id_is_taken_back_above_its_floor_unless_another_holds_it() {
        let bus = InProcessBus::new();
        let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
        let id = bus.claim_replica_id("f".into(), me, None).await.unwrap().id;
        let revision =
            |claims: Vec<ClaimEntry>, id| claims.into_iter().find(|e| e.id == id).unwrap().revision;
        let rev = revision(bus.replica_claims("f".into()).await.unwrap(), id);
        assert!(bus.retire_claim("f".into(), id, rev, 500).await.unwrap());
        assert_eq!(
            take_back(&bus, "f", id, me, 100, 0).await.unwrap(),
            TakeBack::Taken {
                floor: 500,
                reserved: 600
            }
        );
        let claims = bus.replica_claims("f".into()).await.unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(
            claims[0].record,
            ClaimRecord::Held {
                claimant: me,
                reserved: 600
            }
        );
        // A replica that asks for more than a block gets it.
        let rev = revision(claims, id);
        assert!(bus.retire_claim("f".into(), id, rev, 0).await.unwrap());
        assert_eq!(
            take_back(&bus, "f", id, me, 100, 5_000).await.unwrap(),
            TakeBack::Taken {
                floor: 600,
                reserved: 5_000
            }
        );
        // Retired and claimed by another first: left to it, and no claim of ours is left.
        let rev = revision(bus.replica_claims("f".into()).await.unwrap(), id);
        assert!(bus.retire_claim("f".into(), id, rev, 0).await.unwrap());
        let theirs = bus
            .claim_replica_id("f".into(), other, Some(id))
            .await
            .unwrap();
        assert_eq!(theirs.id, id);
        assert_eq!(
            take_back(&bus, "f", id, me, 100, 0).await.unwrap(),
            TakeBack::HeldByOther
        );
        let claims = bus.replica_claims("f".into()).await.unwrap();
        assert_eq!(claims.len(), 1, "{claims:?}");
        assert!(claims[0].record.held_by(other));
    }

    fn entry(id: ReplicaId, record: ClaimRecord) -> ClaimEntry {
        ClaimEntry {
            id,
            record,
            revision: 1,
        }
    }

    #[test]
    fn records_round_trip_and_bare_uuids_are_never_retirable() {
        let u = Uuid::new_v4();
        for r in [
            ClaimRecord::Held {
                claimant: u,
                reserved: 7,
            },
            ClaimRecord::Retired { floor: 9 },
        ] {
            assert_eq!(ClaimRecord::decode(&r.encode()), Some(r));
        }
        let legacy = ClaimRecord::decode(u.to_string().as_bytes()).unwrap();
        assert!(legacy.held_by(u) && !legacy.retirable());
        assert_eq!(ClaimRecord::decode(b"garbage"), None);
    }

    #[test]
    fn picks_preferred_then_retired_then_never_used() {
        let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
        let held = |c| ClaimRecord::Held {
            claimant: c,
            reserved: 10,
        };
        let entries = [
            entry(1, held(other)),
            entry(2, held(me)),
            entry(3, ClaimRecord::Retired { floor: 50 }),
            entry(5, ClaimRecord::Retired { floor: 5 }),
        ];
        assert_eq!(pick_id(&entries, me, Some(2)).unwrap().0, 2);
        assert_eq!(pick_id(&entries, me, Some(5)).unwrap().0, 5);
        assert_eq!(pick_id(&entries, me, Some(4)).unwrap().0, 4);
        // Held by another: the lowest retired id instead.
        assert_eq!(pick_id(&entries, me, Some(1)).unwrap().0, 3);
        let fresh = [entry(1, held(other))];
        assert_eq!(pick_id(&fresh, me, None), Some((2, None)));
    }

    #[test]
    fn only_claims_unchanged_for_retire_after_are_stale() {
        use std::time::{Duration, Instant};
        let held = |id, revision| ClaimEntry {
            id,
            record: ClaimRecord::Held {
                claimant: Uuid::new_v4(),
                reserved: 10,
            },
            revision,
        };
        let mut watch = StaleWatch::default();
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let legacy = ClaimEntry {
            id: 4,
            record: ClaimRecord::Held {
                claimant: Uuid::new_v4(),
                reserved: crate::MAX_COUNTER,
            },
            revision: 1,
        };
        let retired = ClaimEntry {
            id: 5,
            record: ClaimRecord::Retired { floor: 3 },
            revision: 2,
        };
        let claims = [held(1, 1), held(2, 1), held(3, 1), legacy, retired];
        assert!(watch.stale(1, &claims, t0, after).is_empty());
        assert_eq!((watch.live_ids, watch.retired_ids), (4, 1));
        // Id 3 renews; id 2 does not; id 1 is ours; id 4's reservation is unknown.
        let later = [held(1, 1), held(2, 1), held(3, 2), legacy, retired];
        let stale = watch.stale(1, &later, t0 + after, after);
        assert_eq!(stale.iter().map(|e| e.id).collect::<Vec<_>>(), [2]);
        // Known replicas: all four held ids until then; then id 2, silent, no longer counts
        // (whether or not the kind retires it).
        watch.note_known(1, &later, t0 + after - Duration::from_secs(1), after);
        assert_eq!(watch.known_ids, 4);
        watch.note_known(1, &later, t0 + after, after);
        assert_eq!(watch.known_ids, 3);
        watch.note_known(1, &later, t0 + after, Duration::ZERO);
        assert_eq!(watch.known_ids, 4, "a zero window counts every held id");
        // Id 3's clock restarted at its renewal.
        assert!(
            watch
                .stale(1, &later, t0 + after + Duration::from_secs(59), after)
                .iter()
                .all(|e| e.id == 2)
        );
        // Zero disables retirement.
        assert!(
            watch
                .stale(1, &later, t0 + after * 10, Duration::ZERO)
                .is_empty()
        );
    }
}
