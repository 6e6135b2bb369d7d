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
use crate::replica::ack::{known_replicas, peers_needed};
use crate::replica::config::ReplicaConfig;
use crate::replica::metrics as m;
use crate::transport::registry::{self, TakeBack};
use crate::transport::{ClaimEntry, Renewal, TransportError};

/// How long an import waits for the node to extend its shared id's reservation.
const SHARED_RESERVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Replica {
    /// Renews the claim at once when half of its reserved tags are used.
    pub(super) fn extend_lease_if_low(&mut self, ctx: &mut Context<Self>) {
        if let Some(shared) = &self.core.lease.shared {
            if self.io.expect.kind.tagged() {
                shared.want(self.read().clock());
            }
            return;
        }
        let clock = self.read().clock();
        if self
            .core
            .lease
            .running_low(clock, self.cfg.id_lease_block, self.io.expect.kind.tagged())
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

    /// Renews the claim (extending its reservation) and looks for ids to retire; takes the
    /// id back instead if it was retired.
    pub(super) fn renew_lease(&mut self, ctx: &mut Context<Self>) {
        self.take_back_id(ctx);
        let clock = self.read().clock();
        let tagged = self.io.expect.kind.tagged();
        let Some(want) = self
            .core
            .lease
            .begin_renewal(clock, self.cfg.id_lease_block, tagged)
        else {
            return;
        };
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
                    act.core.lease.renewal_ended();
                    act.on_renewal(want, renewal);
                    act.take_back_id(ctx);
                    match claims {
                        Ok(claims) => {
                            // The listing counts every replica held now: those heard from
                            // since are counted afresh.
                            let live = act.core.anti_entropy.live_peers(Instant::now());
                            act.core.most_live = live + 1;
                            act.registry_view_mut().note(&claims, started);
                            act.retire_stale(&claims, ctx);
                            act.looked_for_alone(Some(started), ctx);
                        }
                        Err(e) => {
                            act.lease_failed("listing claims", &e);
                            act.looked_for_alone(None, ctx);
                        }
                    }
                }),
        );
    }

    /// Asks for a look at the registry for the `replicated` updates published while the last
    /// one found this replica alone ([`crate::replica::AckTracker::committed_alone`]), unless
    /// one is asked for already: the node's listing under its id, else a renewal of its own.
    pub(super) fn look_for_alone(&mut self, ctx: &mut Context<Self>) {
        let Some(since) = self.core.pipeline.acks.look_to_ask() else {
            return;
        };
        if let Some(shared) = self.core.lease.shared.clone() {
            let timeout = ReplicaConfig::ms(self.cfg.replicated_timeout_ms);
            let look = async move { shared.looked_since(since, timeout).await };
            ctx.spawn(
                look.into_actor(self)
                    .map(|started, act, ctx| act.looked_for_alone(started, ctx)),
            );
            return;
        }
        // A renewal under way ends in `looked_for_alone`, and asks again if it started
        // before `since`; none possible (the claim is lost): the updates time out.
        self.renew_lease(ctx);
        if !self.core.lease.renewing() {
            self.core.pipeline.acks.look_ended();
        }
    }

    /// A look asked for by [`Replica::look_for_alone`] ended: it started at `started`
    /// (`None`: it failed, and the updates waiting for it time out unless a peer answers).
    pub(super) fn looked_for_alone(&mut self, started: Option<Instant>, ctx: &mut Context<Self>) {
        self.core.pipeline.acks.look_ended();
        let Some(started) = started else { return };
        let live = self.core.anti_entropy.live_peers(Instant::now());
        self.core.note_live(live);
        let known = known_replicas(self.core.lease.known_replicas(), self.core.most_live, live);
        let r = self
            .core
            .pipeline
            .acks
            .looked(started, peers_needed(None, known));
        self.answer(r);
        // Published after this look started: another.
        self.look_for_alone(ctx);
    }

    /// The registry answered a renewal (periodic, or an import's) that asked for `want`.
    pub(super) fn on_renewal(&mut self, want: u64, renewal: Result<Renewal, TransportError>) {
        let lost = self
            .core
            .lease
            .renewed(want, renewal.as_ref().ok().copied());
        if lost {
            self.telemetry.gauge(m::ID_LOST, &[]).set(1.0);
            tracing::warn!(
                filter = %self.cfg.name,
                replica = self.id(),
                "this replica's id was retired while it could not renew its claim: taking it \
                 back above the retirement's floor (adds wait)"
            );
        }
        if let Err(e) = renewal {
            self.lease_failed("renewing the claim", &e);
        }
    }

    /// Takes its own id back after a retirement (see
    /// [`crate::transport::registry::take_back`]), if it was lost and nothing else is under
    /// way: the same identity, tags above the retirement's floor, so nothing written changes.
    pub(super) fn take_back_id(&mut self, ctx: &mut Context<Self>) {
        if !self.core.lease.begin_take_back() {
            return;
        }
        let block = self.cfg.id_lease_block;
        let want = self.read().clock().saturating_add(block);
        let (t, ns, id, uuid) = (
            self.io.transport.clone(),
            self.cfg.registry_name(),
            self.id(),
            self.uuid(),
        );
        let work = async move { registry::take_back(t.as_ref(), &ns, id, uuid, block, want).await };
        ctx.spawn(work.into_actor(self).map(|r, act, _| {
            act.core.lease.renewal_ended();
            match r {
                Ok(TakeBack::Taken { floor, reserved }) => {
                    act.core.lease.taken_back(floor, reserved);
                    act.telemetry.gauge(m::ID_LOST, &[]).set(0.0);
                    tracing::info!(
                        filter = %act.cfg.name, replica = act.id(), floor,
                        "took this replica's retired id back: tags go on above the \
                         retirement's floor"
                    );
                }
                Ok(TakeBack::HeldByOther) => {
                    if let Some(suppressed) = act.io.limiter.allow("held_by_other") {
                        tracing::error!(
                            filter = %act.cfg.name, replica = act.id(), suppressed,
                            "this replica's id was retired and another replica holds it now: \
                             it issues no tags (adds fail); restart it to claim a new id"
                        );
                    }
                }
                Err(e) => act.lease_failed("taking the retired id back", &e),
            }
        }));
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

    /// Retires the ids whose claims went unrenewed for `retire_after_ms` and whose replicas
    /// were not heard from meanwhile.
    fn retire_stale(&mut self, claims: &[ClaimEntry], ctx: &mut Context<Self>) {
        // A kind whose ids serve one run only never retires one (a retired id is reused).
        let retire_after = if self.io.expect.kind.reuses_ids() {
            ReplicaConfig::ms(self.cfg.retire_after_ms)
        } else {
            std::time::Duration::ZERO
        };
        let now = Instant::now();
        let stale = self
            .core
            .lease
            .watch
            .stale(self.id(), claims, now, retire_after);
        // Whether or not the kind retires ids, one silent for `retire_after_ms` no longer
        // counts among the replicas a `replicated` update waits for.
        let window = ReplicaConfig::ms(self.cfg.retire_after_ms);
        self.core
            .lease
            .watch
            .note_known(self.id(), claims, now, window);
        let (live, retired) = self.core.lease.id_counts();
        for (state, n) in [("live", live), ("retired", retired)] {
            self.telemetry
                .gauge(m::REPLICA_IDS, &[("state", state)])
                .set(n as f64);
        }
        for e in stale {
            let heard = self
                .core
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
            let (t, filter) = (self.io.transport.clone(), self.cfg.registry_name());
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
