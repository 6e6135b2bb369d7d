//! The replica actor: a thin shell around the replica's core
//! ([`crate::replica::core::ReplicaCore`], every decision, no I/O, `now` passed in, unit-tested
//! with a stepped clock). The shell holds the I/O ([`io::Io`]: transports, subjects, codec,
//! the log's writer), the queues ([`io::Channels`]), the timers by name ([`timers::Timers`]),
//! and carries out what the core decides, by concern: `receive` (peers' frames, merged with
//! their checks), `publish` (sequencing, commits to the log, digests, pushes), `durability`
//! (tag reservations, snapshots, log recovery), `lease` and `unreserved` (the registry's
//! calls), `local` (the actor's messages), `request` (the request API through the actor),
//! `parking`. Around it, without the actor: `shared` (what threads share), `pump` (the
//! subscriptions into the bounded inbound buffer, and the publisher task), `reads` and
//! `updates` (queries, and `local` adds to grow-only kinds, answered in the subscription
//! tasks), and the leaves they share, `reply` and `items`. Modules import only toward the
//! leaves, never in a circle.
//!
//! Telemetry (metrics and the counts `stats` reads) goes through
//! [`crate::replica::metrics::Telemetry`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::ReplicaError;
use super::anti_entropy::Timing;
use super::config::ReplicaConfig;
use super::core::{
    CommitPipeline, Effects, Event, Lease, Outside, Pushes, ReplicaCore, Snapshotter, Timer,
    Traits, frame_numbers_origin,
};
use super::filter::AnyFilter;
use super::metrics::{self as m, Telemetry};
use super::ticks;
use crate::ReplicaId;
use crate::transport::{LogLimiter, Subjects, TransportEvent};
use crate::wire::{Expect, WireCodec, WireError};
use io::{Channels, Io};
use timers::Timers;

mod clocks;
mod commits;
mod durability;
mod effects;
mod io;
mod items;
mod lease;
mod lifecycle;
mod local;
mod parking;
mod publish;
mod pump;
mod push;
mod reads;
mod receive;
mod reply;
mod request;
mod shared;
mod snapshots;
mod timers;
mod unreserved;
mod updates;

pub use commits::CommitTicket;
pub use local::{
    Add, Contains, FlushDelta, Import, Merge, Persist, Remove, ReserveTags, Shutdown, Stats,
    TakeSnapshot,
};
pub(crate) use local::{FINAL_FLUSH_TIMEOUT, ShutdownBy};
pub use parking::ParkedAnswer;
pub(crate) use parking::{
    Park, ParkInto, Parked, answer_parked, parked_spacing, query_parked, restored_announcement,
};
pub(crate) use pump::{API_LINGER, Inbound, Route, route_event, route_replication};
pub use reads::PendingResponse;
pub(crate) use reads::{refusal, route_own_api};
pub(crate) use reply::{error_of, header_text};
pub(crate) use shared::{GroupApi, Setup, Shared};
#[cfg(test)]
pub(crate) use snapshots::SnapshotJob;

/// The header of an API request that asks for an acknowledgement level.
pub use crate::api::ACK_HEADER;

/// The replica actor. Start one with [`super::Replica::start`]; talk to it through the
/// [`super::ReplicaHandle`] or by sending its messages to [`super::ReplicaHandle::addr`].
pub struct Replica {
    cfg: ReplicaConfig,
    shared: Arc<Shared>,
    /// What it publishes and subscribes with, how it frames, and its log's writer.
    io: Io,
    /// Its queues: messages in, frames out.
    chans: Channels,
    telemetry: Telemetry,
    /// What the replica decides with (see [`super::core::ReplicaCore`]).
    core: ReplicaCore<reply::Responder>,
    /// Its armed timers, by name.
    timers: Timers,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The NATS service API (ADR-32) of the request API, once it is served.
    service: Option<Arc<super::service::ApiService>>,
    /// The receivers' pace of our live pushes still queued or going out.
    pacings: Vec<Arc<push::Pacing>>,
    /// Buffers for the core's effects, kept between steps (see [`effects`]).
    spare_effects: Vec<Effects<reply::Responder>>,
    /// Checks and applies the request API's updates (here, or in the subscription tasks).
    updates: Arc<updates::Updates>,
    /// Its node takes its queue group's subscriptions as the API starts ([`GroupApi`]).
    group_api: Option<shared::GroupApi>,
}

impl Replica {
    pub(crate) fn new(s: Setup) -> Self {
        let mut subjects = Subjects::new(&s.cfg.prefix, &s.cfg.name);
        if s.cfg.routed_api {
            // What its `$SRV` endpoints announce.
            subjects.api_queue = Subjects::node_api(&s.cfg.prefix).1;
        }
        let subjects = Arc::new(subjects);
        let expect = {
            let f = s.shared.filter.read().expect("filter lock");
            Expect {
                filter: s.cfg.name.clone(),
                kind: f.kind(),
                params_digest: f.params_digest(),
                generation: s.cfg.generation,
                max_bytes: s.cfg.max_message_bytes,
            }
        };
        let started = Instant::now();
        let timing = match s.restored {
            true => Timing::of(&s.cfg).restored(&s.cfg),
            false => Timing::of(&s.cfg),
        };
        let codec = WireCodec::new(expect.clone(), s.cfg.auth_keys.clone());
        let limiter = Arc::new(LogLimiter::new(Duration::from_secs(10)));
        // Flume's queues grow with what they hold: tokio's allocate 32 slots up front, and
        // most replicas of a node of many filters are idle.
        let (inbound_tx, inbound_rx) = flume::bounded(s.cfg.inbound_buffer);
        let (outbound, outbound_rx) = flume::bounded(s.cfg.outbound_buffer);
        let updates = Arc::new(updates::Updates {
            shared: s.shared.clone(),
            default_ack: s.cfg.default_ack(),
            // The naive protocol logs no deltas: nothing it acknowledges would be durable.
            has_wal: s.wal.is_some() && !s.cfg.full_state_only,
            delta_max_updates: s.cfg.delta_max_updates,
            to_actor: inbound_tx.clone(),
        });
        if s.replication.is_none() {
            let inlet = pump::Inlet {
                router: pump::ReplicationRouter {
                    codec: codec.clone(),
                    me: s.shared.identity.uuid,
                    subjects: subjects.clone(),
                    limiter: limiter.clone(),
                },
                to_actor: inbound_tx.clone(),
            };
            // Made once, here: the cell is empty.
            let _ = s.shared.replication_inlet.set(inlet);
        }
        let snapshots = Snapshotter::new(
            s.data,
            ReplicaConfig::ms(s.cfg.snapshot_interval_ms),
            started,
        );
        let pushes = Pushes::new(
            ReplicaConfig::ms(s.cfg.min_push_interval_ms),
            fastrand::u32(..),
        );
        let traits = Traits::of(
            &s.cfg,
            expect.kind,
            s.shared_id.is_some(),
            (s.shared.identity.uuid, s.shared.identity.replica),
        );
        let parts = (
            snapshots,
            CommitPipeline::new(s.wal.is_some()),
            Lease::new(s.lease_reserved, s.shared_id),
        );
        let durable = (s.reserved, s.resumed);
        let seed = fastrand::u64(..);
        let mut core = ReplicaCore::new(traits, timing, parts, pushes, durable, started, seed);
        core.restored = s.restored;
        // A resumed replica numbers on from where it parked (`resumed_at`); a started one
        // above every earlier life of its uuid.
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        core.number_frames_after(frame_numbers_origin(since_epoch));
        Replica {
            updates,
            cfg: s.cfg,
            telemetry: s.shared.telemetry.clone(),
            shared: s.shared,
            io: Io {
                transport: s.transport,
                replication_transport: s.replication_transport,
                subjects,
                expect,
                codec,
                limiter,
                digest_batches: s.digest_batches,
                wal: s.wal,
            },
            chans: Channels {
                inbound_tx,
                inbound_rx: Some(inbound_rx),
                outbound,
                outbound_rx,
                replication: s.replication,
            },
            core,
            pacings: Vec::new(),
            spare_effects: Vec::new(),
            timers: Timers::default(),
            tasks: Vec::new(),
            service: None,
            group_api: s.group_api,
        }
    }

    pub(super) fn uuid(&self) -> Uuid {
        self.shared.identity.uuid
    }

    pub(super) fn id(&self) -> ReplicaId {
        self.shared.identity.replica
    }

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, AnyFilter> {
        self.shared.filter.read().expect("filter lock poisoned")
    }

    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, AnyFilter> {
        self.shared.filter.write().expect("filter lock poisoned")
    }

    /// The write lock, for a merge of state from elsewhere (a peer's, a user's), which the
    /// log will not hold: counted under the lock ([`super::core::UnloggedMerges`]).
    pub(super) fn write_to_merge(&self) -> std::sync::RwLockWriteGuard<'_, AnyFilter> {
        let f = self.write();
        self.shared.unlogged.merged();
        f
    }

    pub(super) fn reject(&self, e: &WireError) {
        reject(&self.shared, &self.io.limiter, e);
    }

    /// Tells `wait_ready`, the `crpf_ready` gauge and the log that the replica is ready.
    pub(super) fn publish_ready(&mut self, why: &str) {
        self.telemetry.ready.set(1.0);
        self.shared.lifecycle.set_ready();
        let after_ms = self.core.schedule.started().elapsed().as_millis() as u64;
        let (filter, replica) = (&self.cfg.name, self.id());
        // A node wakes its parked replicas all the time: not worth a line each.
        if self.core.resumed {
            tracing::debug!(%filter, replica, after_ms, "replica ready: {why}");
        } else {
            tracing::info!(%filter, replica, after_ms, "replica ready: {why}");
        }
    }

    /// The connection's news: counted here, what it makes the replica do is the core's.
    fn on_event(&mut self, ev: TransportEvent, ctx: &mut Context<Self>) {
        match ev {
            TransportEvent::Connected => self.telemetry.connected(),
            TransportEvent::Disconnected => self.telemetry.disconnected(),
            TransportEvent::SlowConsumer => {
                self.telemetry.counter(m::SLOW_CONSUMER, &[]).increment(1);
            }
            TransportEvent::Closed => self.telemetry.connected.set(0.0),
        }
        self.step(Event::Transport(ev), ctx);
    }

    // ---- the state's digest --------------------------------------------------------------

    pub(super) fn my_digest(&mut self) -> u64 {
        self.absorb_direct_changes();
        self.core
            .digests
            .get(|| digest_of(&self.shared, &self.telemetry))
    }

    /// Takes in the changes made outside the actor since it last looked
    /// ([`Shared::direct_changes`]).
    pub(super) fn absorb_direct_changes(&mut self) {
        if self.shared.direct_changes.swap(false, Ordering::AcqRel) {
            // Their flush was asked for when they were made.
            self.mark_local_change();
        }
    }

    /// Live peers whose last announced digest equals ours. Our digest encodes the whole
    /// state, so it is only computed when some live peer announced one to compare with.
    fn converged_peers(&mut self) -> usize {
        let now = Instant::now();
        if !self.core.anti_entropy.has_live_digest(now) {
            return 0;
        }
        let mine = self.my_digest();
        self.core.anti_entropy.converged_peers(mine, now)
    }

    /// Arms the replica's one periodic timer for what [`Schedule::plan`] says is next, on
    /// the process's grid ([`crate::replica::ticks`]) so that the timers of many replicas
    /// fire together; its firing is stepped into the core.
    fn schedule_periodic(&mut self, ctx: &mut Context<Self>) {
        let busy = self.core.busy(self.outside());
        let plan = self.core.schedule.plan(busy);
        let delay = plan.due.saturating_duration_since(Instant::now());
        let delay = ticks::on_grid(delay, plan.grid_period);
        self.timers.arm(Timer::Periodic, delay, ctx);
    }

    /// What the core's decisions read of the state outside it.
    fn outside(&self) -> Outside {
        Outside {
            direct_changes: self.shared.direct_changes.load(Ordering::Acquire),
            pending_delta: self.read().pending_delta_len(),
        }
    }

    /// The shell's part of the housekeeping (the core's: a snapshot due, anti-entropy's
    /// time passing, transfers timed out): gauges, and time passing for the state.
    fn housekeeping(&mut self, ctx: &mut Context<Self>) {
        // Time passes for kinds whose elements expire: their window moves (and the move
        // travels to the peers in the next delta), never beyond what the peers accept.
        self.keep_clock();
        self.tick_clock();
        // A flush whose request found the inbound buffer full.
        if self.read().pending_delta_len() > 0 || self.shared.direct_changes.load(Ordering::Acquire)
        {
            self.schedule_flush(ctx);
        }
        {
            let f = self.read();
            let s = f.stats();
            self.telemetry.fpr.set(s.estimated_fpr);
            self.telemetry.load.set(s.load_factor);
            self.telemetry.cardinality.set(s.cardinality);
            self.telemetry.capacity.set(s.capacity as f64);
            self.telemetry.pending.set(f.pending_delta_len() as f64);
            self.telemetry.kind_figures(&f);
        }
        let t = &self.telemetry;
        t.state_bytes.set(t.last_state_bytes() as f64);
        t.connected.set(if self.io.transport.is_connected() {
            1.0
        } else {
            0.0
        });
        // Gauges set on events only are set again here, so the exporter's idle timeout
        // (which ends the series of expired peers) never ends theirs.
        t.target_fpr.set(self.cfg.filter.fpr);
        t.ready.set(if self.shared.lifecycle.is_ready() {
            1.0
        } else {
            0.0
        });
        if let Some(wal) = &self.io.wal {
            let ok = !self.core.pipeline.wal_failing();
            t.gauge(m::DURABLE_OK, &[]).set(if ok { 1.0 } else { 0.0 });
            let s = wal.stats();
            for (name, v) in [
                (m::WAL_APPENDS, &s.appends),
                (m::WAL_LOGGED, &s.logged),
                (m::WAL_FSYNCS, &s.fsyncs),
                (m::WAL_BYTES, &s.bytes),
                (m::WAL_FAILURES, &s.failures),
            ] {
                t.counter(name, &[]).absolute(v.load(Ordering::Relaxed));
            }
        }
    }
}

/// The digest of the replica's state: a pass over it (counted).
fn digest_of(shared: &Shared, telemetry: &Telemetry) -> u64 {
    let d = shared
        .filter
        .read()
        .expect("filter lock poisoned")
        .state_digest();
    telemetry.state_digest();
    d
}

/// Counts and logs (rate-limited) a signed frame taken without verifying it: this node has no
/// cluster key, its peers have one (issue 47, item 8: such a node said nothing of it).
pub(crate) fn unverified(shared: &Shared, limiter: &LogLimiter) {
    shared.telemetry.unverified();
    if let Some(suppressed) = limiter.allow("unverified") {
        tracing::warn!(
            filter = %shared.name, suppressed,
            "took a signed frame without verifying it: this node has no cluster key \
             (allow_unauthenticated) and its peers sign theirs, which refuse this node's \
             (reason `unsigned`); give it the cluster's key (node.auth_key_file)"
        );
    }
}

/// Counts and logs (rate-limited) a rejected message.
pub(crate) fn reject(shared: &Shared, limiter: &LogLimiter, e: &WireError) {
    let reason = e.reason();
    shared.telemetry.reject(reason);
    if let Some(suppressed) = limiter.allow(reason) {
        tracing::warn!(filter = %shared.name, reason, suppressed, "rejected a message: {e}");
    }
}

impl Actor for Replica {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.telemetry.ready.set(0.0);
        self.telemetry
            .connected
            .set(if self.io.transport.is_connected() {
                1.0
            } else {
                0.0
            });
        // Inbound messages arrive as a stream; the buffer between the subscriptions and the
        // actor is bounded and drops (counting) rather than growing without limit.
        ctx.add_stream(
            self.chans
                .inbound_rx
                .take()
                .expect("started once")
                .into_stream(),
        );

        // Replication: decoded and checked before they take a place in the buffer. (Routed
        // by the node, they come through the inlet instead.)
        if let Some(replication) = self.chans.replication.take() {
            let router = pump::ReplicationRouter {
                codec: self.io.codec.clone(),
                me: self.uuid(),
                subjects: self.io.subjects.clone(),
                limiter: self.io.limiter.clone(),
            };
            let shared = self.shared.clone();
            self.tasks.push(actix::spawn(pump::forward_stream(
                Some(replication),
                self.io.replication_transport.clone(),
                (self.io.subjects.replication.clone(), None),
                self.chans.inbound_tx.clone(),
                move |msg| router.route(&shared, msg),
                self.shared.clone(),
                None,
            )));
        }
        // Connection events: a stream of the actor's, not a task of their own.
        // (Routed by the node, they come through the inlet: one receiver for all its replicas,
        // 200 bytes less for each.)
        if !self.cfg.routed_replication {
            ctx.add_stream(pump::events(self.io.transport.events()));
        }

        self.core.schedule.start(Instant::now());
        // A state restored while its clock is ahead of ours (a snapshot taken while the wall
        // clock ran ahead) is repaired before anything is sent or merged; and one that is
        // behind (new, or an old snapshot) moves to our time, so that the first state the
        // peers see tells them our clock.
        self.keep_clock();
        self.tick_clock();
        self.schedule_periodic(ctx);
        if self.core.lease.shared.is_none() {
            ctx.run_interval(ReplicaConfig::ms(self.cfg.id_lease_renew_ms), |act, ctx| {
                act.renew_lease(ctx)
            });
            self.telemetry.gauge(m::ID_LOST, &[]).set(0.0);
            self.renew_lease(ctx);
        }
        // Under the node's id: its latest listing of the ids is this replica's first view.
        self.note_shared_listing();
        if self.core.resumed && !self.core.restored {
            let actions = self.core.anti_entropy.ready_now("resumed after parking");
            self.carry_out(actions, ctx);
        } else if self.core.restored {
            // Serving already; caught up by digests: a peer whose state differs pushes its
            // own at once to a replica that is not ready.
        } else if self.cfg.new_incarnation {
            let actions = self
                .core
                .anti_entropy
                .ready_now("a filter created a moment ago: nothing to catch up");
            self.carry_out(actions, ctx);
        }
        // Catch up: ask every peer for its state, and tell them ours. A resumed replica
        // missed nothing while parked (whatever came for it woke it, and is in its buffer):
        // its digest says the rest, and a request would wake its parked peers for nothing.
        // (A restored one may have missed changes while its node was down: its digest, not
        // ready, has the peers that differ push their states.)
        if !self.core.resumed {
            self.request_state(None);
        }
        self.send_digest();
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.shared.api.store(None);
        self.shared.lifecycle.set_gone();
        self.telemetry.ready.set(0.0);
        if self.core.parked {
            tracing::debug!(filter = %self.cfg.name, replica = self.id(), "replica parked");
        } else {
            tracing::info!(filter = %self.cfg.name, replica = self.id(), "replica stopped");
        }
    }
}

impl StreamHandler<Inbound> for Replica {
    fn handle(&mut self, item: Inbound, ctx: &mut Context<Self>) {
        self.shared
            .inbound_bytes
            .fetch_sub(item.size(), Ordering::AcqRel);
        match item {
            Inbound::Replication(env, len) => self.on_replication(*env, len, ctx),
            Inbound::Api(call) => {
                let (request, reply) = *call;
                self.on_api(request, reply, ctx)
            }
            Inbound::Commit => {
                self.shared.commit_requested.store(false, Ordering::Release);
                self.flush_delta(ctx);
            }
            Inbound::Wake => self.schedule_flush(ctx),
            Inbound::LoggedCommit => {
                // Cleared first: an update applied after this asks again.
                self.shared
                    .logged_commit_requested
                    .store(false, Ordering::Release);
                self.commit_within_a_millisecond(ctx);
            }
            Inbound::Event(ev) => self.on_event(ev, ctx),
        }
    }

    /// The stream only ends when the actor drops its own sender, i.e. never while it runs;
    /// do not let actix stop the actor (its default) if it somehow does.
    fn finished(&mut self, _ctx: &mut Context<Self>) {}
}
