//! The replica's id claim as a lease (see [`crate::transport::ClaimRecord`]): renewing it,
//! extending the tags it reserves, noticing that it was lost, and retiring the ids of
//! replicas gone for longer than `retire_after_ms`.
//!
//! Why this is safe without coordination: a holder issues tags only up to the reservation the
//! registry confirmed, and a retirement records a floor at or above that reservation (a
//! compare-and-set on the revision the retirer watched unchanged, so a renewal in between
//! wins). Whoever takes the id next starts above the floor, so no tag is ever issued twice,
//! even if the old holder was only cut off from the registry and is still adding. Entries keep
//! their tags: nothing is rewritten in any state.

use std::collections::HashMap;
use std::time::Instant;

use actix::prelude::*;

use super::Replica;
use crate::ReplicaId;
use crate::replica::ReplicaError;
use crate::replica::config::ReplicaConfig;
use crate::replica::metrics as m;
use crate::transport::{ClaimEntry, ClaimRecord, Renewal, TransportError};

/// What the replica knows of its claim and of the other claims of its filter.
pub(crate) struct Lease {
    /// The highest tag timestamp the registry confirmed this replica may issue.
    pub reserved: u64,
    /// A renewal (and a look at the registry) is under way.
    busy: bool,
    /// The id was retired under this replica: it issues no more tags.
    pub lost: bool,
    /// Other ids' claims: the revision last seen and since when it has not changed.
    seen: HashMap<ReplicaId, (u64, Instant)>,
    /// Ids held and retired at the last look.
    pub live_ids: usize,
    pub retired_ids: usize,
}

impl Lease {
    pub(super) fn new(reserved: u64) -> Self {
        Lease {
            reserved,
            busy: false,
            lost: false,
            seen: HashMap::new(),
            live_ids: 0,
            retired_ids: 0,
        }
    }

    /// Which of `claims` to retire at `now`: held by another replica, with a known
    /// reservation, unchanged for `retire_after`. Updates what was seen.
    fn stale(
        &mut self,
        me: ReplicaId,
        claims: &[ClaimEntry],
        now: Instant,
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

impl Replica {
    /// Refuses a new tag the registry has not reserved for this replica.
    pub(super) fn check_lease(&self) -> Result<(), ReplicaError> {
        if self.lease.lost {
            return Err(ReplicaError::IdRetired { replica: self.id() });
        }
        if self.read().clock() >= self.lease.reserved {
            return Err(ReplicaError::TagsUnreserved);
        }
        Ok(())
    }

    /// Renews the claim at once when half of its reserved tags are used.
    pub(super) fn extend_lease_if_low(&mut self, ctx: &mut Context<Self>) {
        if self.expect.kind.tagged()
            && !self.lease.busy
            && !self.lease.lost
            && self.read().clock() + self.cfg.id_lease_block / 2 >= self.lease.reserved
        {
            self.renew_lease(ctx);
        }
    }

    /// Extends the id claim to cover `n` more tags than the clock (an import's), when its
    /// reservation falls short: the registry's answer, to pass to [`Replica::on_renewal`]
    /// with the reservation asked for. `None` when nothing needs renewing (no tags, or
    /// enough reserved). Independent of the periodic renewal: a renewal never lowers a
    /// reservation, so the two may overlap.
    pub(super) fn renewal_for(
        &self,
        n: u64,
    ) -> Option<(
        u64,
        futures::future::BoxFuture<'static, Result<Renewal, TransportError>>,
    )> {
        if !self.expect.kind.tagged() || n == 0 || self.lease.lost {
            return None;
        }
        let need = self.read().clock().saturating_add(n);
        if need <= self.lease.reserved {
            return None;
        }
        let want = need.saturating_add(self.cfg.id_lease_block);
        let renewal =
            self.transport
                .renew_claim(self.cfg.registry_name(), self.id(), self.uuid(), want);
        Some((want, renewal))
    }

    /// Renews the claim (extending its reservation) and looks for ids to retire.
    pub(super) fn renew_lease(&mut self, ctx: &mut Context<Self>) {
        if self.lease.busy || self.lease.lost {
            return;
        }
        self.lease.busy = true;
        let want = if self.expect.kind.tagged() {
            self.lease
                .reserved
                .max(self.read().clock() + self.cfg.id_lease_block)
        } else {
            self.lease.reserved
        };
        let (t, filter, id, uuid) = (
            self.transport.clone(),
            self.cfg.registry_name(),
            self.id(),
            self.uuid(),
        );
        let work = async move {
            let renewal = t.renew_claim(filter.clone(), id, uuid, want).await;
            let started = Instant::now();
            let claims = t.replica_claims(filter).await;
            (renewal, claims, started)
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(renewal, claims, started), act, ctx| {
                    act.lease.busy = false;
                    act.on_renewal(want, renewal);
                    match claims {
                        Ok(claims) => {
                            act.registry_view.note(&claims, started);
                            act.retire_stale(&claims, ctx)
                        }
                        Err(e) => act.lease_failed("listing claims", &e),
                    }
                }),
        );
    }

    pub(super) fn on_renewal(&mut self, want: u64, renewal: Result<Renewal, TransportError>) {
        match renewal {
            Ok(Renewal::Held) => self.lease.reserved = self.lease.reserved.max(want),
            Ok(Renewal::Lost) => {
                self.lease.lost = true;
                self.telemetry.gauge(m::ID_LOST, &[]).set(1.0);
                tracing::error!(
                    filter = %self.cfg.name,
                    replica = self.id(),
                    "this replica's id was retired while it could not renew its claim: it \
                     issues no more tags (adds fail); restart it to claim a new id"
                );
            }
            Err(e) => self.lease_failed("renewing the claim", &e),
        }
    }

    pub(super) fn lease_failed(&self, what: &'static str, e: &TransportError) {
        self.telemetry
            .counter(m::ID_LEASE_FAILURES, &[])
            .increment(1);
        if let Some(suppressed) = self.limiter.allow("lease") {
            tracing::warn!(
                error = %e, suppressed, "replica id registry: {what} failed; retrying"
            );
        }
    }

    /// Retires the ids whose claims went unrenewed for `retire_after_ms` and whose replicas
    /// were not heard from meanwhile.
    fn retire_stale(&mut self, claims: &[ClaimEntry], ctx: &mut Context<Self>) {
        // A kind whose ids serve one run only never retires one (a retired id is reused).
        let retire_after = if self.expect.kind.reuses_ids() {
            ReplicaConfig::ms(self.cfg.retire_after_ms)
        } else {
            std::time::Duration::ZERO
        };
        let stale = self
            .lease
            .stale(self.id(), claims, Instant::now(), retire_after);
        for (state, n) in [
            ("live", self.lease.live_ids),
            ("retired", self.lease.retired_ids),
        ] {
            self.telemetry
                .gauge(m::REPLICA_IDS, &[("state", state)])
                .set(n as f64);
        }
        for e in stale {
            let heard = self
                .anti_entropy
                .peers()
                .any(|(_, p)| p.replica == e.id && p.last_seen.elapsed() < retire_after);
            if heard {
                continue;
            }
            // Above the holder's reservation, and above any of its tags this replica saw
            // (a reservation is never below them; this is only belt and braces).
            let observed = self.read().history().map_or(0, |h| h.max(e.id));
            let floor = e.record.floor().max(observed);
            let (t, filter) = (self.transport.clone(), self.cfg.registry_name());
            let retire = async move { t.retire_claim(filter, e.id, e.revision, floor).await };
            ctx.spawn(retire.into_actor(self).map(move |r, act, _| match r {
                Ok(true) => {
                    act.telemetry.counter(m::RETIREMENTS, &[]).increment(1);
                    tracing::info!(
                        filter = %act.cfg.name, retired = e.id, floor,
                        "retired a replica id whose claim was not renewed"
                    );
                }
                // Renewed, or retired by another replica, meanwhile.
                Ok(false) => {}
                Err(e) => act.lease_failed("retiring an id", &e),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;

    fn held(id: ReplicaId, revision: u64) -> ClaimEntry {
        ClaimEntry {
            id,
            record: ClaimRecord::Held {
                claimant: Uuid::new_v4(),
                reserved: 10,
            },
            revision,
        }
    }

    #[test]
    fn only_claims_unchanged_for_retire_after_are_stale() {
        let mut lease = Lease::new(0);
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
        assert!(lease.stale(1, &claims, t0, after).is_empty());
        assert_eq!((lease.live_ids, lease.retired_ids), (4, 1));
        // Id 3 renews; id 2 does not; id 1 is ours; id 4's reservation is unknown.
        let later = [held(1, 1), held(2, 1), held(3, 2), legacy, retired];
        let stale = lease.stale(1, &later, t0 + after, after);
        assert_eq!(stale.iter().map(|e| e.id).collect::<Vec<_>>(), [2]);
        // Id 3's clock restarted at its renewal.
        assert!(
            lease
                .stale(1, &later, t0 + after + Duration::from_secs(59), after)
                .iter()
                .all(|e| e.id == 2)
        );
        // Zero disables retirement.
        assert!(
            lease
                .stale(1, &later, t0 + after * 10, Duration::ZERO)
                .is_empty()
        );
    }
}
