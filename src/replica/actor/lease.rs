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

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use super::Replica;
use crate::replica::config::ReplicaConfig;
use crate::replica::metrics as m;
use crate::replica::{ReplicaError, SharedId};
use crate::transport::registry::StaleWatch;
use crate::transport::{ClaimEntry, Renewal, TransportError};

/// What the replica knows of its claim and of the other claims of its filter.
pub(crate) struct Lease {
    /// The highest tag timestamp the registry confirmed this replica may issue (its own
    /// claim; see [`Lease::reserved`]).
    reserved: u64,
    /// A renewal (and a look at the registry) is under way.
    busy: bool,
    /// The id was retired under this replica: it issues no more tags.
    lost: bool,
    /// Other ids' claims, to retire those gone silent.
    watch: StaleWatch,
    /// The node's id, when the replica issues its tags under it: the node renews it.
    pub shared: Option<Arc<SharedId>>,
}

impl Lease {
    pub(super) fn new(reserved: u64, shared: Option<Arc<SharedId>>) -> Self {
        Lease {
            reserved,
            busy: false,
            lost: false,
            watch: StaleWatch::default(),
            shared,
        }
    }

    /// The highest tag timestamp the registry confirmed.
    pub(super) fn reserved(&self) -> u64 {
        self.shared.as_ref().map_or(self.reserved, |s| s.reserved())
    }

    /// The id was retired while it could not be renewed.
    pub(super) fn lost(&self) -> bool {
        self.shared.as_ref().map_or(self.lost, |s| s.lost())
    }

    /// Ids of the registry namespace held and retired at the last look.
    pub(super) fn id_counts(&self) -> (usize, usize) {
        match &self.shared {
            Some(s) => s.id_counts(),
            None => (self.watch.live_ids, self.watch.retired_ids),
        }
    }
}

impl Replica {
    /// Refuses a new tag the registry has not reserved for this replica.
    pub(super) fn check_lease(&self) -> Result<(), ReplicaError> {
        if self.lease.lost() {
            return Err(ReplicaError::IdRetired { replica: self.id() });
        }
        if self.read().clock() >= self.lease.reserved() {
            return Err(ReplicaError::TagsUnreserved);
        }
        Ok(())
    }

    /// Renews the claim at once when half of its reserved tags are used.
    pub(super) fn extend_lease_if_low(&mut self, ctx: &mut Context<Self>) {
        if let Some(shared) = &self.lease.shared {
            if self.expect.kind.tagged() {
                shared.want(self.read().clock());
            }
            return;
        }
        if self.expect.kind.tagged()
            && !self.lease.busy
            && !self.lease.lost
            && self.read().clock() + self.cfg.id_lease_block / 2 >= self.lease.reserved
        {
            self.renew_lease(ctx);
        }
    }

    /// Renews the claim (extending its reservation) and looks for ids to retire.
    pub(super) fn renew_lease(&mut self, ctx: &mut Context<Self>) {
        if self.lease.busy || self.lease.lost || self.lease.shared.is_some() {
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

    fn on_renewal(&mut self, want: u64, renewal: Result<Renewal, TransportError>) {
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
            .watch
            .stale(self.id(), claims, Instant::now(), retire_after);
        let (live, retired) = self.lease.id_counts();
        for (state, n) in [("live", live), ("retired", retired)] {
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
