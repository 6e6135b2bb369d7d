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

use std::time::Instant;

use actix::prelude::*;

use super::Replica;
use super::reply::Responder;
use crate::replica::config::ReplicaConfig;
use crate::replica::core::{Effect, Effects, Event};
use crate::replica::metrics as m;
use crate::transport::registry;
use crate::transport::{ClaimEntry, Renewal, TransportError};

/// How long an import waits for the node to extend its shared id's reservation.
const SHARED_RESERVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Replica {
    /// Renews the claim at once when half of its reserved tags are used (the core's).
    pub(super) fn extend_lease_if_low(&mut self, ctx: &mut Context<Self>) {
        let clock = self.read().clock();
        self.step(
            Event::Renew {
                clock,
                issued: true,
            },
            ctx,
        );
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
        let clock = self.read().clock();
        let need = self
            .core
            .lease
            .shortfall(clock, n, self.io.expect.kind.tagged())?;
        if let Some(shared) = self.core.lease.shared.clone() {
            // The node renews its id; wait for a reservation that covers the import.
            let renewal = async move {
                if shared.reserved_at_least(need, SHARED_RESERVE_TIMEOUT).await {
                    Ok(Renewal::Held)
                } else if shared.lost() {
                    Ok(Renewal::Lost)
                } else {
                    Err(TransportError::claim(
                        "the node's shared replica id was not extended in time",
                    ))
                }
            };
            return Some((need, Box::pin(renewal)));
        }
        let want = need.saturating_add(self.cfg.id_lease_block);
        let renewal =
            self.io
                .transport
                .renew_claim(self.cfg.registry_name(), self.id(), self.uuid(), want);
        Some((want, renewal))
    }

    /// The lease's renewal is due: the core says whether to take the id back, renew the
    /// claim (and look for ids to retire), or neither.
    pub(super) fn renew_lease(&mut self, ctx: &mut Context<Self>) {
        let clock = self.read().clock();
        self.step(
            Event::Renew {
                clock,
                issued: false,
            },
            ctx,
        );
    }

    /// A look at the registry that starts at or after `since`, for `replicated` updates
    /// published while the last one found this replica alone: the node's listing under its
    /// id, else a renewal of its own claim (whose listing the core takes as the look; a
    /// renewal under way ends the same way; none possible, the claim lost: none).
    pub(super) fn look_for_alone(&mut self, since: Instant, ctx: &mut Context<Self>) {
        if let Some(shared) = self.core.lease.shared.clone() {
            let timeout = ReplicaConfig::ms(self.cfg.replicated_timeout_ms);
            let look = async move { shared.looked_since(since, timeout).await };
            ctx.spawn(
                look.into_actor(self)
                    .map(|started, act, ctx| act.step(Event::LookedForAlone(started), ctx)),
            );
            return;
        }
        self.renew_lease(ctx);
        if !self.core.lease.renewing() {
            self.step(Event::LookedForAlone(None), ctx);
        }
    }

    /// Renews the claim up to `want`, then lists the registry's claims: both answers
    /// stepped into the core.
    pub(super) fn renew_claim(&mut self, want: u64, ctx: &mut Context<Self>) {
        let (t, filter, id, uuid) = (
            self.io.transport.clone(),
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
                    let clock = act.read().clock();
                    let renewed = Event::Renewed {
                        want,
                        renewal,
                        periodic: true,
                        clock,
                    };
                    act.step(renewed, ctx);
                    act.step(Event::Listed { claims, started }, ctx);
                }),
        );
    }

    /// The registry answered an import's renewal that asked for `want`.
    pub(super) fn on_renewal(&mut self, want: u64, renewal: Result<Renewal, TransportError>) {
        let renewed = Event::Renewed {
            want,
            renewal,
            periodic: false,
            clock: 0,
        };
        // What an import's answer makes the core do is told, not done (no take-back, no
        // timer): carried out without the actor's context.
        let mut out = Effects::default();
        self.core.step(renewed, Instant::now(), &mut out);
        for effect in out.drain() {
            self.lease_news(effect);
        }
    }

    /// Takes the retired id back (see [`crate::transport::registry::take_back`]) with a
    /// reservation up to `want`: the answer stepped into the core.
    pub(super) fn take_back_id(&mut self, want: u64, ctx: &mut Context<Self>) {
        let block = self.cfg.id_lease_block;
        let (t, ns, id, uuid) = (
            self.io.transport.clone(),
            self.cfg.registry_name(),
            self.id(),
            self.uuid(),
        );
        let work = async move { registry::take_back(t.as_ref(), &ns, id, uuid, block, want).await };
        ctx.spawn(
            work.into_actor(self)
                .map(|r, act, ctx| act.step(Event::TakenBack(r), ctx)),
        );
    }

    /// Tells what the core made of the registry's answers (gauges, counters, the log).
    pub(super) fn lease_news(&mut self, effect: Effect<Responder>) {
        match effect {
            Effect::IdLost => {
                self.telemetry.gauge(m::ID_LOST, &[]).set(1.0);
                tracing::warn!(
                    filter = %self.cfg.name,
                    replica = self.id(),
                    "this replica's id was retired while it could not renew its claim: taking \
                     it back above the retirement's floor (adds wait)"
                );
            }
            Effect::IdTakenBack { floor } => {
                self.telemetry.gauge(m::ID_LOST, &[]).set(0.0);
                tracing::info!(
                    filter = %self.cfg.name, replica = self.id(), floor,
                    "took this replica's retired id back: tags go on above the retirement's \
                     floor"
                );
            }
            Effect::IdHeldByOther => {
                if let Some(suppressed) = self.io.limiter.allow("held_by_other") {
                    tracing::error!(
                        filter = %self.cfg.name, replica = self.id(), suppressed,
                        "this replica's id was retired and another replica holds it now: it \
                         issues no tags (adds fail); restart it to claim a new id"
                    );
                }
            }
            Effect::LeaseFailed { what, error } => self.lease_failed(what, &error),
            Effect::IdCounts { live, retired } => {
                for (state, n) in [("live", live), ("retired", retired)] {
                    self.telemetry
                        .gauge(m::REPLICA_IDS, &[("state", state)])
                        .set(n as f64);
                }
            }
            Effect::WantReservation { clock } => {
                if let Some(shared) = &self.core.lease.shared {
                    shared.want(clock);
                }
            }
            _ => debug_assert!(false, "not the lease's news"),
        }
    }

    pub(super) fn lease_failed(&self, what: &'static str, e: &TransportError) {
        self.telemetry
            .counter(m::ID_LEASE_FAILURES, &[])
            .increment(1);
        if let Some(suppressed) = self.io.limiter.allow("lease") {
            tracing::warn!(
                error = %e, suppressed, "replica id registry: {what} failed; retrying"
            );
        }
    }

    /// Retires `e`'s id (the core found its claim unrenewed for `retire_after_ms` and its
    /// replica unheard meanwhile).
    pub(super) fn retire(&mut self, e: ClaimEntry, ctx: &mut Context<Self>) {
        // Above the holder's reservation, and above any of its tags this replica saw (a
        // reservation is never below them; this is only belt and braces).
        let observed = self.read().history().map_or(0, |h| h.max(e.id));
        let floor = e.record.floor().max(observed);
        let (t, filter) = (self.io.transport.clone(), self.cfg.registry_name());
        let retire = async move { t.retire_claim(filter, e.id, e.revision, floor).await };
        ctx.spawn(retire.into_actor(self).map(move |r, act, _| match r {
            Ok(true) => {
                act.telemetry.counter(m::RETIREMENTS, &[]).increment(1);
                tracing::info!(
                    filter = %act.cfg.name, retired = e.id, floor,
                    "retired a replica id: its claim unrenewed, or this replica's previous run's"
                );
            }
            // Renewed, or retired by another replica, meanwhile.
            Ok(false) => {}
            Err(e) => act.lease_failed("retiring an id", &e),
        }));
    }
}
