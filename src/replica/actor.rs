//! The replica actor: a thin shell that owns a replica's parts and routes messages between
//! them. The parts that decide are their own types, each with its own state and unit tests,
//! and no I/O of their own:
//!
//! - [`crate::replica::anti_entropy`]: peers, digests and readiness; `push`: when a full-state
//!   push may go, and the digest cache; [`crate::replica::reassembly`]: transfers coming in;
//! - `pipeline`: the commit pipeline (write-ahead log and its recovery, group commit, the
//!   updates waiting for their acknowledgement level);
//! - `snapshots`: the snapshotter (what is unsaved, when a snapshot is due, older never over
//!   newer);
//! - `lease`: the replica id claim (when to renew, what to ask for, a lost claim);
//!   `unreserved`: the other ids' reservations, and frames held until the next look.
//!
//! The actor's `impl` carries out what they decide, by concern: `publish` (sequencing,
//! commits, digests, pushes), `durability` (tag reservations, snapshots, log recovery),
//! `local` (the actor's messages), `request` (the request API through the actor). Around it,
//! without the actor: `pump` (the subscriptions into the bounded inbound buffer, and the
//! publisher task), `reads` and `updates` (queries, and `local` adds to grow-only kinds,
//! answered in the subscription tasks), and the leaves they share, `reply` and `items`.
//! Modules import only toward the leaves, never in a circle.
//!
//! Telemetry (metrics and the counts `stats` reads) goes through
//! [`crate::replica::metrics::Telemetry`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::anti_entropy::{Action, AntiEntropy, PeerTableFull, Timing};
use super::config::ReplicaConfig;
use super::durable::{DataDir, Identity};
use super::filter::{AnyFilter, FilterStats};
use super::metrics::{self as m, Counts, Direction, MergeSource, Telemetry};
use super::reassembly::{Progress, Reassembly};
use super::ticks;
use super::wal::WalWriter;
use super::{ReplicaError, ReplicaStats};
use crate::ReplicaId;
use crate::transport::digests::DigestBatcher;
use crate::transport::{Channel, LogLimiter, MessageStream, Subjects, Transport, TransportEvent};
use crate::wire::{Body, Envelope, Expect, FilterKind, StateChunk, WireCodec, WireError};
use super::core::{
    CommitPipeline, DigestCache, HeldFrame, Lease, PeerClocks, Pushes, Rearm, RegistryView, Schedule,
    Snapshotter,
};

mod clocks;
mod commits;
mod durability;
mod items;
mod lease;
mod lifecycle;
mod local;
mod parking;
mod publish;
mod pump;
mod push;
mod reads;
mod reply;
mod request;
mod snapshots;
mod unreserved;
mod updates;

pub use commits::CommitTicket;
pub use local::{
    Add, Contains, FlushDelta, Import, Merge, Persist, Remove, ReserveTags, Shutdown, Stats,
    TakeSnapshot,
};
pub(crate) use local::{FINAL_FLUSH_TIMEOUT, ShutdownBy};
pub(crate) use parking::{Park, ParkInto, Parked};
pub(crate) use pump::{API_LINGER, Inbound, Route, route_event, route_replication};
pub use reads::PendingResponse;
pub(crate) use reads::{refusal, route_own_api};
pub(crate) use reply::{error_of, header_text};
#[cfg(test)]
pub(crate) use snapshots::SnapshotJob;

/// The header of an API request that asks for an acknowledgement level.
pub use crate::api::ACK_HEADER;

/// States at least this large are decoded off the actor's thread.
const BLOCKING_THRESHOLD: usize = 256 << 10;

/// What one replica shares between its actor, its handle and its inbound tasks.
pub(crate) struct Shared {
    /// The filter. The actor writes it, and so do the API's subscription tasks for `local`
    /// adds to grow-only kinds ([`updates`]); handles read it without queueing behind
    /// replication work in the mailbox.
    pub filter: RwLock<AnyFilter>,
    /// Reads the filter's bits without its lock, for the kinds that allow it (`g_bloom`):
    /// queries never wait for an update or a merge in progress.
    pub reader: Option<crate::BloomReader>,
    pub name: String,
    pub kind: FilterKind,
    pub identity: Identity,
    /// Ready, and whether the actor is gone, for those waiting outside it.
    pub lifecycle: lifecycle::Lifecycle,
    pub telemetry: Telemetry,
    /// Bytes of messages waiting in the inbound buffer, and their bound.
    pub inbound_bytes: AtomicU64,
    pub inbound_max_bytes: u64,
    /// The state changed outside the actor (an update applied in a subscription task) since
    /// the actor last looked: its digest is stale, and a snapshot and a push are due.
    pub direct_changes: AtomicBool,
    /// A commit was asked of the actor because the pending delta is full, and not yet made.
    pub commit_requested: AtomicBool,
    /// A flush of the pending delta is scheduled (or asked of the actor): an idle replica
    /// has no timer running for its deltas, and a change arms one ([`Shared::want_flush`]).
    pub flush_scheduled: AtomicBool,
    /// The number of the commit whose delta the next take carries: moved on by the actor
    /// under the write lock as it takes a delta, read under it by updates applied outside
    /// the actor that wait for their commit ([`commits`]).
    pub open_batch: AtomicU64,
    /// The highest commit that an update applied outside the actor needs fsynced (raised
    /// under the write lock, read by the commit that takes the update's delta).
    pub sync_through: AtomicU64,
    /// How far the commits got, for the [`CommitTicket`]s of those updates.
    pub commits: commits::Commits,
    /// A commit within a millisecond is asked of the actor (`logged` updates applied in a
    /// subscription task) and not yet scheduled.
    pub logged_commit_requested: AtomicBool,
    /// The write-ahead log failed and is not replaced yet: `logged` updates are answered as
    /// applied but not durable.
    pub wal_failed: AtomicBool,
    /// The replica shut down: updates are no longer applied (set under the write lock).
    pub closed: AtomicBool,
    /// A publisher task runs ([`pump::publish`]): one at a time, so that frames leave in
    /// the order they were queued, and none while nothing is queued (a task of its own for
    /// each of a node's 100,000 mostly idle replicas cost 640 bytes each).
    pub publishing: AtomicBool,
    /// Full-state pushes queued or going out: their chunks' numbers are taken, and some
    /// may not be published for a while (a batched digest claims no number meanwhile).
    pub pushes_out: std::sync::atomic::AtomicUsize,
    /// The replica shuts down because its filter was dropped: its API refuses for a moment
    /// longer ([`pump::API_LINGER`]), since no other replica will answer for it.
    pub dropped: AtomicBool,
    /// What a batch request may hold (`max_batch_items`, `max_item_bytes`).
    pub limits: crate::api::batch::Limits,
    /// Whether the replica serves the request API (`serve_api`), once ready.
    pub serve_api: bool,
    /// Answers requests of the API made in this process ([`ReplicaHandle::request`]); set
    /// once the API is served, and let go when the actor stops: the requests' path holds
    /// this `Shared`, so a cell kept for good kept every stopped replica (its filter among
    /// it) alive through the cycle.
    pub api: arc_swap::ArcSwapOption<reads::Reads>,
    /// Takes the messages the node routes to the replica
    /// ([`ReplicaConfig::routed_replication`]); set as the actor is made.
    pub replication_inlet: std::sync::OnceLock<pump::Inlet>,
    /// The time kinds whose elements expire go by, bounded by the peers' clock.
    pub clock: super::clock::ReplicaClock,
    /// Merges the log does not hold: adds record their whole footprint meanwhile.
    pub unlogged: Arc<super::core::UnloggedMerges>,
}

impl Shared {
    /// What a replica shares with its handles and tasks, before anything happened: no change,
    /// request or commit yet, not closed, the API not served.
    pub(crate) fn new(
        filter: AnyFilter,
        name: String,
        identity: Identity,
        telemetry: Telemetry,
        inbound_max_bytes: u64,
        limits: crate::api::batch::Limits,
        serve_api: bool,
    ) -> Self {
        Shared {
            unlogged: Default::default(),
            kind: filter.kind(),
            reader: filter.shared_reader(),
            filter: RwLock::new(filter),
            name,
            identity,
            lifecycle: Default::default(),
            telemetry,
            inbound_bytes: Default::default(),
            inbound_max_bytes,
            direct_changes: Default::default(),
            commit_requested: Default::default(),
            flush_scheduled: Default::default(),
            open_batch: AtomicU64::new(super::core::FIRST_BATCH),
            sync_through: Default::default(),
            commits: Default::default(),
            logged_commit_requested: Default::default(),
            wal_failed: Default::default(),
            closed: Default::default(),
            publishing: Default::default(),
            pushes_out: Default::default(),
            dropped: Default::default(),
            api: Default::default(),
            replication_inlet: Default::default(),
            clock: Default::default(),
            limits,
            serve_api,
        }
    }

    /// With a write-ahead log: adds record their footprints while the state holds merges
    /// the log does not ([`super::core::UnloggedMerges`]).
    pub(crate) fn with_log(mut self, logged: bool) -> Self {
        self.unlogged = Arc::new(super::core::UnloggedMerges::new(logged));
        self
    }

    /// Why the replica's API takes no request: it stopped (its API let go), or it does not
    /// serve yet.
    pub(crate) fn not_serving(&self) -> ReplicaError {
        match self.closed.load(Ordering::Acquire) {
            true => ReplicaError::Stopped,
            false => ReplicaError::NotServing,
        }
    }

    /// The state changed: unless a flush is already scheduled, asks the actor for one
    /// ([`Inbound::Wake`]). A full inbound buffer drops the request; the housekeeping tick
    /// then notices the pending delta.
    pub(crate) fn want_flush(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(&self.flush_scheduled, to_actor, Inbound::Wake);
    }

    /// A `logged` update was applied outside the actor: asks for a commit within a
    /// millisecond ([`Inbound::LoggedCommit`]) unless one is asked for already. A full
    /// inbound buffer drops the request; the delta's periodic commit then carries it.
    pub(crate) fn want_logged_commit(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(
            &self.logged_commit_requested,
            to_actor,
            Inbound::LoggedCommit,
        );
    }

    /// Asks the actor for a commit now ([`Inbound::Commit`]) unless one is asked for
    /// already. A full inbound buffer drops the request; the periodic commit comes soon
    /// enough.
    pub(crate) fn want_commit(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(&self.commit_requested, to_actor, Inbound::Commit);
    }
}

/// Sends `ask` to the actor unless `asked` says it is on its way (the actor clears it when
/// it handles it); `asked` is cleared again if the inbound buffer is full. A load first: on
/// the hot path the request is mostly made already, and a swap would take the line from the
/// actor's core every time.
fn ask_once(asked: &AtomicBool, to_actor: &flume::Sender<Inbound>, ask: Inbound) {
    if !asked.load(Ordering::Acquire)
        && !asked.swap(true, Ordering::AcqRel)
        && to_actor.try_send(ask).is_err()
    {
        asked.store(false, Ordering::Release);
    }
}

/// Everything a replica needs to start, prepared by [`super::Replica::start`].
pub(crate) struct Setup {
    pub cfg: ReplicaConfig,
    pub shared: Arc<Shared>,
    pub transport: Arc<dyn Transport>,
    /// Publishes and subscribes replication (no echo where the transport can): see
    /// [`Transport::replication_transport`].
    pub replication_transport: Arc<dyn Transport>,
    /// Its own replication subscription; none if the node routes its replication subject
    /// ([`ReplicaConfig::routed_replication`]).
    pub replication: Option<MessageStream>,
    pub data: Option<DataDir>,
    /// The write-ahead log, with a data directory.
    pub wal: Option<WalWriter>,
    pub reserved: u64,
    /// The tags the registry confirmed this replica may issue.
    pub lease_reserved: u64,
    /// The node's id, when the replica issues its tags under it (see [`super::SharedId`]).
    pub shared_id: Option<Arc<super::SharedId>>,
    /// Where its digests go, when its node publishes them in batches.
    pub digest_batches: Option<Arc<DigestBatcher>>,
    /// It resumes after parking ([`parking`]): ready at once, as it was.
    pub resumed: bool,
}

/// The replica actor. Start one with [`super::Replica::start`]; talk to it through the
/// [`super::ReplicaHandle`] or by sending its messages to [`super::ReplicaHandle::addr`].
pub struct Replica {
    cfg: ReplicaConfig,
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    /// Replication's publications and subscription (see [`Setup::replication_transport`]).
    replication_transport: Arc<dyn Transport>,
    /// Shared with its request API, its replication router and its `$SRV` service: six
    /// strings each copy.
    subjects: Arc<Subjects>,
    expect: Expect,
    /// Encodes and decodes (signs and verifies) this replica's frames.
    codec: WireCodec,
    telemetry: Telemetry,
    limiter: Arc<LogLimiter>,
    seq: u64,
    /// Peers, digests and readiness (the protocol's decisions, pure and unit-tested).
    anti_entropy: AntiEntropy,
    /// State transfers in progress and recently completed, made by the first chunk: most
    /// replicas of a node of many filters never receive one.
    transfers: Option<Box<Reassembly>>,
    /// The digest, cached until the state changes.
    digests: DigestCache,
    /// When full-state pushes may go.
    pushes: Pushes,
    /// The receivers' pace of our live pushes still queued or going out.
    pacings: Vec<Arc<push::Pacing>>,
    /// Snapshots into the data directory, if the replica has one.
    snapshots: Snapshotter,
    /// The tags reserved durably (written to the data directory before one above is issued).
    reserved: u64,
    /// When the periodic timer fires, and what for (the digest spacing, the housekeeping).
    schedule: Schedule,
    /// The periodic timer, while armed.
    periodic: Option<SpawnHandle>,
    api_started: bool,
    /// It parked ([`parking`]): its node keeps its state.
    parked: bool,
    /// It resumed after parking: ready at once (it was, and alone).
    resumed: bool,
    inbound_tx: flume::Sender<Inbound>,
    inbound_rx: Option<flume::Receiver<Inbound>>,
    outbound: flume::Sender<pump::Outbound>,
    /// What the publisher task takes from; the task runs while there is something to take
    /// ([`Shared::publishing`]).
    outbound_rx: flume::Receiver<pump::Outbound>,
    replication: Option<MessageStream>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The NATS service API (ADR-32) of the request API, once it is served.
    service: Option<Arc<super::service::ApiService>>,
    /// Commits and the updates waiting for their acknowledgement level.
    pipeline: CommitPipeline<reply::Responder>,
    /// The write-ahead log's writer, with a data directory.
    wal: Option<WalWriter>,
    /// The id claim and the other ids of the filter.
    lease: Lease,
    /// The other ids' reservations as last seen, and frames waiting for the next look; made
    /// by the first use (only tagged kinds look).
    registry_view: Option<Box<RegistryView>>,
    /// Kinds whose elements expire: the live peers' clocks (see [`clocks`]); made by the
    /// first peer's.
    peer_clocks: Option<Box<PeerClocks>>,
    /// The most replicas (this one included) live at once since this replica's last listing
    /// of the registry (ever, under the node's id): counted by `replicated` beside the
    /// registry's (see [`crate::replica::ack::known_replicas`]).
    most_live: usize,
    /// Checks and applies the request API's updates (here, or in the subscription tasks).
    updates: Arc<updates::Updates>,
    /// Its node's digest batches, where its digests go if it has one.
    digest_batches: Option<Arc<DigestBatcher>>,
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
        let timing = Timing {
            live: ReplicaConfig::ms(s.cfg.anti_entropy_interval_ms * 3),
            peer_expiry: ReplicaConfig::ms(s.cfg.peer_expiry_ms),
            min_request_interval: ReplicaConfig::ms(s.cfg.min_push_interval_ms),
            catch_up_timeout: ReplicaConfig::ms(s.cfg.catch_up_timeout_ms),
            max_peers: s.cfg.max_peers,
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
        let schedule = Schedule::new(
            ReplicaConfig::ms(s.cfg.anti_entropy_interval_ms),
            ReplicaConfig::ms(s.cfg.metrics_interval_ms),
            ReplicaConfig::ms(s.cfg.peer_expiry_ms),
            started,
            fastrand::u64(..),
        );
        Replica {
            updates,
            transfers: None,
            cfg: s.cfg,
            telemetry: s.shared.telemetry.clone(),
            shared: s.shared,
            transport: s.transport,
            replication_transport: s.replication_transport,
            subjects,
            expect,
            codec,
            limiter,
            seq: 0,
            anti_entropy: AntiEntropy::new(timing, started),
            digests: DigestCache::default(),
            pushes,
            pacings: Vec::new(),
            snapshots,
            pipeline: CommitPipeline::new(s.wal.is_some()),
            wal: s.wal,
            reserved: s.reserved,
            lease: Lease::new(s.lease_reserved, s.shared_id),
            registry_view: None,
            peer_clocks: None,
            most_live: 1,
            schedule,
            periodic: None,
            api_started: false,
            parked: false,
            resumed: s.resumed,
            inbound_tx,
            inbound_rx: Some(inbound_rx),
            outbound,
            outbound_rx,
            replication: s.replication,
            tasks: Vec::new(),
            service: None,
            digest_batches: s.digest_batches,
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
        reject(&self.shared, &self.limiter, e);
    }

    // ---- receiving -----------------------------------------------------------------------

    fn on_replication(&mut self, env: Envelope, frame_len: usize, ctx: &mut Context<Self>) {
        let channel = if env.body.is_delta() {
            Channel::Delta
        } else {
            Channel::State
        };
        self.telemetry.traffic(Direction::In, channel, frame_len);
        let now = Instant::now();
        let known = self.anti_entropy.knows(&env.sender);
        let rearm = self.schedule.heard(now, known);
        self.rearm_periodic(rearm, ctx);
        if let Body::StateProgress {
            target,
            transfer,
            next,
        } = env.body
        {
            // Unsequenced (it overtakes what its sender queued), so it moves no sequence
            // count; only a peer already heard from paces a push.
            if target == self.uuid() && self.anti_entropy.knows(&env.sender) {
                self.on_progress(env.sender, transfer, next);
            }
            return;
        }
        match self
            .anti_entropy
            .heard(env.sender, env.replica, env.seq, now)
        {
            Ok(actions) => self.carry_out(actions, ctx),
            Err(PeerTableFull) => {
                return self.reject(&WireError::TooManyPeers(self.cfg.max_peers));
            }
        }
        match env.body {
            Body::Delta(bytes) => {
                if self.merge_delta_checked(&bytes, true, None, ctx) {
                    self.delta_clock(env.sender, &bytes);
                }
            }
            Body::Deltas(deltas) => {
                for bytes in deltas {
                    if self.merge_delta_checked(&bytes, true, None, ctx) {
                        self.delta_clock(env.sender, &bytes);
                    }
                }
            }
            Body::ConfirmedDelta(bytes) => {
                // A held delta is acknowledged once merged.
                let ack_to = Some((env.sender, env.seq));
                if self.merge_delta_checked(&bytes, true, ack_to, ctx) {
                    self.send_ack(env.sender, env.seq);
                    self.delta_clock(env.sender, &bytes);
                }
            }
            Body::Ack { target, seq } => {
                if target == self.uuid() {
                    let r = self.pipeline.acks.acked(env.sender, seq);
                    self.answer(r);
                }
            }
            Body::Digest {
                digest,
                ready,
                sent,
                spacing,
            } => {
                if let Some(sent) = sent.filter(|_| env.seq == 0) {
                    let actions = self.anti_entropy.claimed(env.sender, sent, now);
                    self.carry_out(actions, ctx);
                }
                let mine = self.my_digest();
                let actions = self.anti_entropy.digest(
                    env.sender,
                    digest,
                    ready,
                    spacing,
                    mine,
                    Instant::now(),
                );
                self.carry_out(actions, ctx);
                if digest != mine {
                    // Something to repair: no more spacing out.
                    self.quiet_ended(ctx);
                }
            }
            Body::StateRequest { target } => {
                // Someone catches up (a restart keeps its uuid): at the interval again.
                self.quiet_ended(ctx);
                if target.is_none_or(|t| t == self.uuid()) {
                    self.schedule_push(ctx);
                }
            }
            Body::StateChunk(chunk) => self.on_chunk(env.sender, env.replica, chunk, ctx),
            // Taken above, before the sequence check.
            Body::StateProgress { .. } => {}
        }
        if self.schedule.changed_since_digest() {
            self.quiet_ended(ctx);
        }
    }

    /// Carries out what the anti-entropy state machine decided.
    fn carry_out(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::RequestState(target) => self.request_state(target),
                Action::PushState => self.schedule_push(ctx),
                Action::BecomeReady(why) => self.become_ready(ctx, why),
                Action::CountGaps(n) => self.telemetry.sequence_gaps(n),
                Action::Forget(uuid) => {
                    tracing::debug!(filter = %self.cfg.name, %uuid, "peer forgotten");
                    if let Some(transfers) = &mut self.transfers {
                        transfers.forget(&uuid);
                    }
                }
            }
        }
    }

    fn transfers_mut(&mut self) -> &mut Reassembly {
        let cfg = &self.cfg;
        self.transfers.get_or_insert_with(|| {
            let timeout =
                ReplicaConfig::ms(cfg.anti_entropy_interval_ms * 3).max(Duration::from_secs(5));
            Box::new(Reassembly::new(
                cfg.max_state_bytes,
                timeout,
                cfg.filter.kind.merges_state_pieces(),
            ))
        })
    }

    fn record_merge(&self, source: MergeSource, t: Instant, ok: bool) {
        self.telemetry.merge(source, ok, t.elapsed().as_secs_f64());
    }

    fn on_chunk(
        &mut self,
        sender: Uuid,
        replica: ReplicaId,
        chunk: StateChunk,
        ctx: &mut Context<Self>,
    ) {
        let state = match self.transfers_mut().add(sender, chunk) {
            Ok(Progress::Pending) => return,
            Ok(Progress::Complete(state)) => state,
            Ok(Progress::Piece {
                offset,
                data,
                total_len,
                last,
                report,
            }) => {
                if self.merge_piece(sender, (offset, &data, total_len), last, ctx)
                    && let Some((transfer, next)) = report
                {
                    self.report_progress(sender, transfer, next);
                }
                return;
            }
            Err(e) => {
                self.telemetry
                    .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                    .increment(1);
                self.reject(&e);
                return;
            }
        };
        self.telemetry
            .counter(m::STATE_TRANSFERS, &[("outcome", "complete")])
            .increment(1);
        let kind = self.expect.kind;
        let len = state.len();
        if len < BLOCKING_THRESHOLD {
            let result = AnyFilter::decode_state(kind, &state);
            self.merge_state(result, sender, replica, len, ctx);
        } else {
            let addr = ctx.address();
            actix::spawn(async move {
                let result =
                    tokio::task::spawn_blocking(move || AnyFilter::decode_state(kind, &state))
                        .await
                        .unwrap_or_else(|e| Err(WireError::Malformed(e.to_string())));
                addr.do_send(Decoded {
                    result,
                    sender,
                    replica,
                    len,
                });
            });
        }
    }

    /// Merges the next piece of a peer's full state as it comes (kinds that
    /// [merge states piece by piece](crate::wire::FilterKind::merges_state_pieces)): the
    /// replica never holds the peer's state whole, reassembled and decoded, next to its own.
    /// Each piece comes from a frame whose checksum (and signature, with keys) was checked,
    /// and joins a part of the peer's state: an inflation of its own, so a transfer cut
    /// short leaves a valid state, and the rest comes with the next push. Whether it merged.
    fn merge_piece(
        &mut self,
        sender: Uuid,
        (offset, data, total_len): (u64, &[u8], u64),
        last: bool,
        ctx: &mut Context<Self>,
    ) -> bool {
        let t = Instant::now();
        let merged = self
            .write_to_merge()
            .merge_state_piece(total_len, offset, data);
        if let Err(e) = merged {
            self.record_merge(MergeSource::State, t, false);
            if let Some(transfers) = &mut self.transfers {
                transfers.forget_transfer(&sender);
            }
            self.telemetry
                .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                .increment(1);
            self.reject(&WireError::Incompatible(e.to_string()));
            return false;
        }
        self.changed();
        if !last {
            return true;
        }
        self.record_merge(MergeSource::State, t, true);
        self.telemetry
            .counter(m::STATE_TRANSFERS, &[("outcome", "complete")])
            .increment(1);
        tracing::debug!(%sender, bytes = total_len, "merged a peer's full state, piece by piece");
        self.state_merged(total_len as usize, ctx);
        true
    }

    /// A peer's full state (of `len` bytes encoded) was merged, whole or piece by piece.
    fn state_merged(&mut self, len: usize, ctx: &mut Context<Self>) {
        self.telemetry.state_merged();
        if len >= BLOCKING_THRESHOLD {
            release_freed_heap();
        }
        let actions = self.anti_entropy.state_merged();
        self.carry_out(actions, ctx);
    }

    fn merge_state(
        &mut self,
        result: Result<AnyFilter, WireError>,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
        ctx: &mut Context<Self>,
    ) {
        let other = match result {
            Ok(o) if o.params_digest() == self.expect.params_digest => o,
            Ok(o) => {
                return self.reject(&WireError::Params {
                    got: o.params_digest(),
                    expected: self.expect.params_digest,
                });
            }
            Err(e) => {
                self.record_merge(MergeSource::State, Instant::now(), false);
                return self.reject(&e);
            }
        };
        self.merge_state_checked(other, sender, replica, len, true, ctx);
    }

    /// Merges a peer's full state of the right kind and parameters, holding it for a fresh
    /// look at the registry if its tags are above the view and `may_hold`; whether it was
    /// merged now.
    fn merge_state_checked(
        &mut self,
        other: AnyFilter,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
        may_hold: bool,
        ctx: &mut Context<Self>,
    ) -> bool {
        let now = self.shared.clock.now_ms();
        let checked = self.with_tag_bounds(|bounds| {
            let f = self.read();
            match bounds {
                Some(b) => f.check_remote_state_within(&other, now, b),
                None => f
                    .check_remote_state(&other, now)
                    .map(|()| None)
                    .map_err(super::filter::remote_error),
            }
        });
        let adopt = match checked {
            Ok(adopt) => adopt,
            Err(e) => {
                if may_hold && matches!(e, WireError::TagUnreserved { .. }) {
                    let frame = HeldFrame::State {
                        state: Box::new(other),
                        sender,
                        replica,
                        len,
                    };
                    if self.hold(frame, ctx) {
                        return false;
                    }
                }
                self.record_merge(MergeSource::State, Instant::now(), false);
                self.reject(&e);
                return false;
            }
        };
        let t = Instant::now();
        let r = {
            let mut f = self.write_to_merge();
            // A forged tag of our own id within our reservation: our clock moves past it.
            if let Some(clock) = adopt {
                f.advance_clock(clock);
            }
            f.merge(&other)
        };
        self.record_merge(MergeSource::State, t, r.is_ok());
        match r {
            Ok(()) => {
                if let Some(epoch) = other.clock_epoch() {
                    self.note_peer_clock(sender, epoch);
                }
                self.changed();
                tracing::debug!(peer = replica, %sender, "merged a peer's full state");
                self.state_merged(len, ctx);
                true
            }
            Err(e) => {
                self.reject(&WireError::Incompatible(e.to_string()));
                false
            }
        }
    }

    /// Caught up. A replica that serves the API is ready once the API is subscribed
    /// ([`Replica::start_api`]).
    fn become_ready(&mut self, ctx: &mut Context<Self>, why: &str) {
        if self.cfg.serve_api && !self.api_started {
            self.api_started = true;
            self.start_api(ctx, why.to_string());
        } else {
            self.publish_ready(why);
        }
    }

    /// Tells `wait_ready`, the `crpf_ready` gauge and the log that the replica is ready.
    fn publish_ready(&mut self, why: &str) {
        self.telemetry.ready.set(1.0);
        self.shared.lifecycle.set_ready();
        let after_ms = self.schedule.started().elapsed().as_millis() as u64;
        let (filter, replica) = (&self.cfg.name, self.id());
        // A node wakes its parked replicas all the time: not worth a line each.
        if self.resumed {
            tracing::debug!(%filter, replica, after_ms, "replica ready: {why}");
        } else {
            tracing::info!(%filter, replica, after_ms, "replica ready: {why}");
        }
    }

    fn on_event(&mut self, ev: TransportEvent, ctx: &mut Context<Self>) {
        match ev {
            TransportEvent::Connected => {
                self.telemetry.connected();
                // Publishes made while disconnected may be lost: re-announce, ask for the
                // peers' states and push ours.
                self.request_state(None);
                // At the interval from here: this digest may announce none of the spacing
                // the next timer's digest was armed for.
                self.quiet_ended(ctx);
                self.send_digest();
                self.schedule_push(ctx);
            }
            TransportEvent::Disconnected => self.telemetry.disconnected(),
            TransportEvent::SlowConsumer => {
                self.telemetry.counter(m::SLOW_CONSUMER, &[]).increment(1);
                // Messages were dropped client-side: sequence gaps will name the peers, but a
                // broadcast request repairs the loss sooner.
                self.request_state(None);
            }
            TransportEvent::Closed => self.telemetry.connected.set(0.0),
        }
    }

    // ---- the state's digest --------------------------------------------------------------

    fn my_digest(&mut self) -> u64 {
        self.absorb_direct_changes();
        self.digests
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

    /// The state changed: its digest is stale, and a snapshot is due.
    fn changed(&mut self) {
        self.schedule.changed();
        self.digests.invalidate();
        self.snapshots.changed();
    }

    /// Live peers whose last announced digest equals ours. Our digest encodes the whole
    /// state, so it is only computed when some live peer announced one to compare with.
    fn converged_peers(&mut self) -> usize {
        let now = Instant::now();
        if !self.anti_entropy.has_live_digest(now) {
            return 0;
        }
        let mine = self.my_digest();
        self.anti_entropy.converged_peers(mine, now)
    }

    fn stats(&mut self) -> ReplicaStats {
        let digest = self.my_digest();
        let converged_peers = self.converged_peers();
        let (figures, pending_delta): (FilterStats, usize) = {
            let f = self.read();
            (f.stats(), f.pending_delta_len())
        };
        let c = self.telemetry.counts();
        ReplicaStats {
            filter: self.cfg.name.clone(),
            replica: self.id(),
            uuid: self.uuid(),
            ready: self.anti_entropy.is_ready(),
            connected: self.transport.is_connected(),
            peers: self.anti_entropy.live_peers(Instant::now()),
            pending_delta,
            digest: format!("{digest:016x}"),
            awaiting_ack: self.pipeline.acks.len(),
            converged_peers,
            live_ids: self.lease.id_counts().0,
            retired_ids: self.lease.id_counts().1,
            id_lost: self.lease.lost(),
            figures,
            rejects: Counts::by_reason(&c.rejects),
            api_errors: Counts::by_reason(&c.api_errors),
            outbound_dropped: Counts::get(&c.outbound_dropped),
            dropped: Counts::get(&c.dropped),
            disconnects: Counts::get(&c.disconnects),
            reconnects: Counts::get(&c.reconnects),
            sequence_gaps: Counts::get(&c.sequence_gaps),
            deltas_sent: Counts::get(&c.deltas_sent),
            deltas_merged: Counts::get(&c.deltas_merged),
            state_pushes: Counts::get(&c.state_pushes),
            states_merged: Counts::get(&c.states_merged),
            bytes_sent: Counts::get(&c.bytes_sent),
            delta_bytes_sent: Counts::get(&c.delta_bytes_sent),
            state_bytes_sent: Counts::get(&c.state_bytes_sent),
            echoes_received: Counts::get(&c.echoes),
            state_digests: Counts::get(&c.state_digests),
            bytes_received: Counts::get(&c.bytes_received),
            state_bytes: Counts::get(&c.state_bytes),
        }
    }

    /// Arms the replica's one periodic timer for what [`Schedule::plan`] says is next, on
    /// the process's grid ([`crate::replica::ticks`]) so that the timers of many replicas
    /// fire together.
    fn schedule_periodic(&mut self, ctx: &mut Context<Self>) {
        let busy = !self.at_rest() || self.snapshots.has_unsaved();
        let plan = self.schedule.plan(busy);
        let delay = plan.due.saturating_duration_since(Instant::now());
        let timer = ctx.run_later(ticks::on_grid(delay, plan.grid_period), |act, ctx| {
            act.periodic = None;
            let now = Instant::now();
            let fired = act.schedule.fired(now);
            if fired.digest {
                let spacing = act.send_digest();
                let live = act.anti_entropy.live_peers(now);
                act.schedule.digest_sent(now, spacing, live);
            }
            if fired.housekeeping {
                act.housekeeping(ctx);
            }
            act.schedule_periodic(ctx);
        });
        self.periodic = Some(timer);
    }

    /// The state changed (a flush is being armed): see [`Schedule::busy_again`].
    pub(super) fn busy_again(&mut self, ctx: &mut Context<Self>) {
        let rearm = self.schedule.busy_again(Instant::now());
        self.rearm_periodic(rearm, ctx);
    }

    /// Arms the periodic timer anew, for deadlines brought forward. Not from within the
    /// timer's own run (it arms the next itself): there is no armed timer then.
    fn rearm_periodic(&mut self, rearm: Rearm, ctx: &mut Context<Self>) {
        if rearm.0
            && let Some(timer) = self.periodic.take()
        {
            ctx.cancel_future(timer);
            self.schedule_periodic(ctx);
        }
    }

    /// See [`Schedule::quiet_ended`].
    fn quiet_ended(&mut self, ctx: &mut Context<Self>) {
        let rearm = self.schedule.quiet_ended(Instant::now());
        self.rearm_periodic(rearm, ctx);
    }

    /// Whether nothing but a snapshot may be due: its figures go to the node-wide series only
    /// or it has no peer (its own series then stand still: no peer's staleness grows), it is
    /// caught up, nothing is in flight (a transfer, a commit, a change not taken into a
    /// delta), and its state does not move with time. Housekeeping is then rare, and (with
    /// more) the replica may park. (10,000 configured filters, each with its own series,
    /// woke every `metrics_interval_ms` alone: 8-10% of a core for the node, issue 52.)
    fn at_rest(&self) -> bool {
        (self.cfg.aggregate_metrics || self.anti_entropy.peers().next().is_none())
            && self.expect.kind != FilterKind::ExpiringBloom
            && self.anti_entropy.is_ready()
            && self.transfers.as_ref().is_none_or(|t| t.in_progress() == 0)
            && !self.pipeline.busy()
            && !self.shared.direct_changes.load(Ordering::Acquire)
            && self.read().pending_delta_len() == 0
    }

    /// Gauges, time passing for anti-entropy (peer expiry, catch-up), and partial transfers
    /// that timed out (see [`Replica::housekeeping_delay`] for how often).
    fn housekeeping(&mut self, ctx: &mut Context<Self>) {
        // Snapshots are due every `snapshot_interval_ms` (checked here rather than on a timer
        // of their own: one wake-up per replica, not two).
        if self.snapshots.due(Instant::now()) {
            self.snapshot_async(ctx);
        }
        // Time passes for kinds whose elements expire: their window moves (and the move
        // travels to the peers in the next delta), never beyond what the peers accept.
        self.keep_clock();
        self.tick_clock();
        // A flush whose request found the inbound buffer full.
        if !self.pipeline.flush_timer_armed()
            && (self.read().pending_delta_len() > 0
                || self.shared.direct_changes.load(Ordering::Acquire))
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
        }
        let t = &self.telemetry;
        t.state_bytes.set(t.last_state_bytes() as f64);
        t.connected.set(if self.transport.is_connected() {
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
        if let Some(wal) = &self.wal {
            let ok = !self.pipeline.wal_failing();
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
        let now = Instant::now();
        let actions = self.anti_entropy.tick(now);
        self.carry_out(actions, ctx);
        for (_, p) in self.anti_entropy.peers() {
            self.telemetry
                .gauge(m::PEER_STALENESS, &[("peer", &p.replica.to_string())])
                .set(now.saturating_duration_since(p.last_seen).as_secs_f64());
        }
        let live = self.anti_entropy.live_peers(now);
        self.most_live = self.most_live.max(live + 1);
        self.telemetry.peers.set(live as f64);
        let expired = self.transfers.as_mut().map_or(0, |t| t.expire());
        if expired > 0 {
            self.telemetry
                .counter(m::STATE_TRANSFERS, &[("outcome", "expired")])
                .increment(expired as u64);
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

/// Gives the heap's free pages back to the operating system once a large state was merged:
/// its chunks and frames (each under the 1 MiB mmap threshold a node sets) came from the
/// heap, whose freed pages glibc keeps, so a replica that caught up stayed near its peak
/// (1.6-1.9x the state, `scripts/catch-up-rss.sh`).
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::task::spawn_blocking(|| {
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe { libc::malloc_trim(0) };
    });
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
            .set(if self.transport.is_connected() {
                1.0
            } else {
                0.0
            });
        // Inbound messages arrive as a stream; the buffer between the subscriptions and the
        // actor is bounded and drops (counting) rather than growing without limit.
        ctx.add_stream(self.inbound_rx.take().expect("started once").into_stream());

        // Replication: decoded and checked before they take a place in the buffer. (Routed
        // by the node, they come through the inlet instead.)
        if let Some(replication) = self.replication.take() {
            let router = pump::ReplicationRouter {
                codec: self.codec.clone(),
                me: self.uuid(),
                subjects: self.subjects.clone(),
                limiter: self.limiter.clone(),
            };
            let shared = self.shared.clone();
            self.tasks.push(actix::spawn(pump::forward_stream(
                Some(replication),
                self.replication_transport.clone(),
                (self.subjects.replication.clone(), None),
                self.inbound_tx.clone(),
                move |msg| router.route(&shared, msg),
                self.shared.clone(),
                None,
            )));
        }
        // Connection events: a stream of the actor's, not a task of their own.
        // (Routed by the node, they come through the inlet: one receiver for all its replicas,
        // 200 bytes less for each.)
        if !self.cfg.routed_replication {
            ctx.add_stream(pump::events(self.transport.events()));
        }

        self.schedule.start(Instant::now());
        // A state restored while its clock is ahead of ours (a snapshot taken while the wall
        // clock ran ahead) is repaired before anything is sent or merged; and one that is
        // behind (new, or an old snapshot) moves to our time, so that the first state the
        // peers see tells them our clock.
        self.keep_clock();
        self.tick_clock();
        self.schedule_periodic(ctx);
        if self.lease.shared.is_none() {
            ctx.run_interval(ReplicaConfig::ms(self.cfg.id_lease_renew_ms), |act, ctx| {
                act.renew_lease(ctx)
            });
            self.telemetry.gauge(m::ID_LOST, &[]).set(0.0);
            self.renew_lease(ctx);
        }
        // Under the node's id: its latest listing of the ids is this replica's first view.
        self.note_shared_listing();
        if self.resumed {
            let actions = self.anti_entropy.ready_now("resumed after parking");
            self.carry_out(actions, ctx);
        } else if self.cfg.new_incarnation {
            let actions = self
                .anti_entropy
                .ready_now("a filter created a moment ago: nothing to catch up");
            self.carry_out(actions, ctx);
        }
        // Catch up: ask every peer for its state, and tell them ours.
        self.request_state(None);
        self.send_digest();
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.shared.api.store(None);
        self.shared.lifecycle.set_gone();
        self.telemetry.ready.set(0.0);
        if self.parked {
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

/// A large peer state decoded off the actor's thread.
#[derive(Message)]
#[rtype(result = "()")]
struct Decoded {
    result: Result<AnyFilter, WireError>,
    sender: Uuid,
    replica: ReplicaId,
    /// Bytes of the encoded state.
    len: usize,
}

impl Handler<Decoded> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Decoded, ctx: &mut Context<Self>) {
        self.merge_state(msg.result, msg.sender, msg.replica, msg.len, ctx);
    }
}
