//! The replica actor: local operations, delta publication, anti-entropy, durability.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

use super::ack::{AckLevel, AckTracker, Resolved, peers_needed};
use super::config::ReplicaConfig;
use super::durable::{DataDir, Identity, Reservation, Snapshot};
use super::filter::{AnyFilter, FilterStats};
use super::metrics::{self as m, Direction, MergeSource, Metrics, OpKind};
use super::reassembly::{Progress, Reassembly};
use super::wal::{SegmentId, WalWriter};
use super::{ReplicaError, ReplicaHandle, ReplicaStats};
use crate::transport::{
    Channel, LogLimiter, Message, MessageStream, Subjects, Transport, TransportEvent,
};
use crate::wire::{
    Body, Envelope, Expect, FilterKind, StateChunk, WireCodec, WireError, chunk_count, state_chunk,
};
use crate::{Dot, ReplicaId};

/// The request API (`<prefix>.<filter>.api.<op>`, `<...>.replica.<id>.api.<op>`).
mod lease;
mod reads;
mod request;

/// States at least this large are encoded and decoded off the actor's thread.
const BLOCKING_THRESHOLD: usize = 256 << 10;
/// Room left in a frame for the envelope around a chunk.
const ENVELOPE_OVERHEAD: usize = 1024;

/// What one replica shares between its actor, its handle and its inbound tasks.
pub(crate) struct Shared {
    /// The filter. Only the actor writes it; handles read it without queueing behind
    /// replication work in the mailbox.
    pub filter: RwLock<AnyFilter>,
    pub name: String,
    pub kind: FilterKind,
    pub identity: Identity,
    pub ready: watch::Sender<bool>,
    pub counters: Counters,
    /// Bound on the bytes waiting in the inbound buffer.
    pub inbound_max_bytes: u64,
}

/// Counters reported by `stats` (the metrics facade has no read side).
#[derive(Default)]
pub(crate) struct Counters {
    pub rejects: Mutex<BTreeMap<&'static str, u64>>,
    pub dropped: AtomicU64,
    pub sequence_gaps: AtomicU64,
    pub deltas_sent: AtomicU64,
    pub deltas_merged: AtomicU64,
    pub state_pushes: AtomicU64,
    pub states_merged: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub delta_bytes_sent: AtomicU64,
    pub state_bytes_sent: AtomicU64,
    /// Own replication messages the transport delivered back (and that were dropped).
    pub echoes: AtomicU64,
    pub bytes_received: AtomicU64,
    pub state_bytes: AtomicU64,
    /// Bytes of messages waiting in the inbound buffer.
    pub inbound_bytes: AtomicU64,
    pub disconnects: AtomicU64,
    pub reconnects: AtomicU64,
    /// Messages dropped because the outbound queue was full.
    pub outbound_dropped: AtomicU64,
    /// Request API errors by reason (apart from the wire's `rejects`).
    pub api_errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counters {
    fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// What reaches the actor from its subscriptions and the transport.
pub(crate) enum Inbound {
    /// A valid replication message from a peer.
    Replication(Envelope, usize),
    /// A request of the API.
    Api(Message),
    /// A connection event.
    Event(TransportEvent),
}

impl Inbound {
    /// Bytes it holds, for the inbound buffer's byte bound.
    fn size(&self) -> u64 {
        match self {
            Inbound::Replication(_, len) => *len as u64,
            Inbound::Api(m) => m.payload.len() as u64,
            Inbound::Event(_) => 0,
        }
    }
}

/// An item of a single operation: not empty, at most `max_item_bytes`.
fn check_item(item: &[u8], max_item_bytes: usize) -> Result<(), ReplicaError> {
    if item.is_empty() {
        return Err(ReplicaError::InvalidItem("empty item".into()));
    }
    if item.len() > max_item_bytes {
        return Err(ReplicaError::InvalidItem(format!(
            "item of {} bytes exceeds max_item_bytes {max_item_bytes}",
            item.len(),
        )));
    }
    Ok(())
}

/// Where a subscription task sends what it received.
pub(crate) enum Route {
    /// To the actor, through the inbound buffer.
    Actor(Inbound),
    /// Nowhere: answered, or not for this replica.
    Drop,
    /// Answered in the task: publish this reply (subject, headers, payload).
    Reply(String, async_nats::HeaderMap, Bytes),
}

/// What the publisher task sends, in order.
enum Outbound {
    Publish(String, Bytes, Channel),
    /// A full state, framed chunk by chunk as it is published (see [`StatePush`]).
    State(Box<StatePush>),
    /// A reply of the request API, with its headers.
    Reply(String, Bytes, async_nats::HeaderMap),
    Flush(oneshot::Sender<()>),
}

/// Who gets the answer of an update waiting for its acknowledgement level.
pub(crate) enum Responder {
    /// A request of the API: the reply subject and the reply of a success.
    Api {
        reply: Option<String>,
        body: request::ApiReply,
    },
    /// A [`ReplicaHandle`] call.
    Handle {
        tx: oneshot::Sender<Result<Option<Dot>, ReplicaError>>,
        dot: Option<Dot>,
    },
}

struct Peer {
    replica: ReplicaId,
    last_seen: Instant,
    last_seq: u64,
    /// The state digest it last announced.
    digest: Option<u64>,
    /// Consecutive digests from this peer that differed from ours.
    mismatches: u32,
    last_request: Option<Instant>,
}

/// Everything a replica needs to start, prepared by [`super::Replica::start`].
pub(crate) struct Setup {
    pub cfg: ReplicaConfig,
    pub shared: Arc<Shared>,
    pub transport: Arc<dyn Transport>,
    /// Publishes and subscribes replication (no echo where the transport can): see
    /// [`Transport::replication_transport`].
    pub replication_transport: Arc<dyn Transport>,
    pub replication: MessageStream,
    pub data: Option<DataDir>,
    /// The write-ahead log, with a data directory.
    pub wal: Option<WalWriter>,
    pub reserved: u64,
    /// The tags the registry confirmed this replica may issue.
    pub lease_reserved: u64,
}

/// The replica actor. Start one with [`super::Replica::start`]; talk to it through the
/// [`ReplicaHandle`] or by sending its messages to [`ReplicaHandle::addr`].
pub struct Replica {
    cfg: ReplicaConfig,
    shared: Arc<Shared>,
    transport: Arc<dyn Transport>,
    /// Replication's publications and subscription (see [`Setup::replication_transport`]).
    replication_transport: Arc<dyn Transport>,
    subjects: Subjects,
    expect: Expect,
    /// Encodes and decodes (signs and verifies) this replica's frames.
    codec: WireCodec,
    metrics: Metrics,
    limiter: Arc<LogLimiter>,
    seq: u64,
    /// Transfer ids: a random epoch per start in the high half, a counter in the low one,
    /// so that a restarted replica's transfers are never taken for old ones.
    transfer: u64,
    peers: HashMap<Uuid, Peer>,
    transfers: Reassembly,
    digest: Option<u64>,
    last_push: Option<Instant>,
    push_scheduled: bool,
    encoding: bool,
    changed_since_push: bool,
    last_catch_up_request: Option<Instant>,
    data: Option<DataDir>,
    wal: Option<WalWriter>,
    reserved: u64,
    dirty: bool,
    snapshotting: Arc<AtomicBool>,
    /// Snapshots taken (numbered on the actor's thread) and the newest saved: an older one
    /// that finishes late must not overwrite a newer one, whose log segments are gone.
    snapshot_generation: u64,
    snapshot_saved: Arc<Mutex<u64>>,
    started: Instant,
    ready: bool,
    api_started: bool,
    inbound_tx: mpsc::Sender<Inbound>,
    inbound_rx: Option<mpsc::Receiver<Inbound>>,
    outbound: mpsc::Sender<Outbound>,
    outbound_rx: Option<mpsc::Receiver<Outbound>>,
    replication: Option<MessageStream>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The NATS service API (ADR-32) of the request API, once it is served.
    service: Option<Arc<super::service::ApiService>>,
    /// Updates waiting for their acknowledgement level.
    acks: AckTracker<Responder>,
    /// Number of the next commit (a commit carries every local update since the last one).
    next_batch: u64,
    /// A commit is being written to the log; the next waits for it (group commit).
    committing: bool,
    /// A commit was asked for while one was in flight.
    commit_again: bool,
    /// A commit is scheduled (replicated updates without a log are batched for a moment).
    commit_scheduled: bool,
    /// The id claim and the other ids of the filter.
    lease: lease::Lease,
}

impl Replica {
    pub(crate) fn new(s: Setup) -> Self {
        let subjects = Subjects::new(&s.cfg.prefix, &s.cfg.name);
        let (expect, metrics) = {
            let f = s.shared.filter.read().expect("filter lock");
            (
                Expect {
                    filter: s.cfg.name.clone(),
                    kind: f.kind(),
                    params_digest: f.params_digest(),
                    max_bytes: s.cfg.max_message_bytes,
                },
                Metrics::new(&s.cfg.name, s.shared.identity.replica, s.cfg.filter.fpr),
            )
        };
        let codec = WireCodec::new(expect.clone(), s.cfg.auth_keys.clone());
        let (inbound_tx, inbound_rx) = mpsc::channel(s.cfg.inbound_buffer);
        let (outbound, outbound_rx) = mpsc::channel(s.cfg.outbound_buffer);
        let timeout =
            ReplicaConfig::ms(s.cfg.anti_entropy_interval_ms * 3).max(Duration::from_secs(5));
        Replica {
            transfers: Reassembly::new(s.cfg.max_state_bytes, timeout),
            cfg: s.cfg,
            shared: s.shared,
            transport: s.transport,
            replication_transport: s.replication_transport,
            subjects,
            expect,
            codec,
            metrics,
            limiter: Arc::new(LogLimiter::new(Duration::from_secs(10))),
            seq: 0,
            transfer: u64::from(fastrand::u32(..)) << 32,
            peers: HashMap::new(),
            digest: None,
            last_push: None,
            push_scheduled: false,
            encoding: false,
            changed_since_push: false,
            last_catch_up_request: None,
            data: s.data,
            wal: s.wal,
            reserved: s.reserved,
            lease: lease::Lease::new(s.lease_reserved),
            dirty: false,
            snapshotting: Arc::new(AtomicBool::new(false)),
            snapshot_generation: 0,
            snapshot_saved: Arc::new(Mutex::new(0)),
            started: Instant::now(),
            ready: false,
            api_started: false,
            inbound_tx,
            inbound_rx: Some(inbound_rx),
            outbound,
            outbound_rx: Some(outbound_rx),
            replication: Some(s.replication),
            tasks: Vec::new(),
            service: None,
            acks: AckTracker::default(),
            next_batch: 1,
            committing: false,
            commit_again: false,
            commit_scheduled: false,
        }
    }

    fn uuid(&self) -> Uuid {
        self.shared.identity.uuid
    }

    fn id(&self) -> ReplicaId {
        self.shared.identity.replica
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, AnyFilter> {
        self.shared.filter.read().expect("filter lock poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, AnyFilter> {
        self.shared.filter.write().expect("filter lock poisoned")
    }

    fn reject(&self, e: &WireError) {
        reject(&self.shared, &self.metrics, &self.limiter, e);
    }

    // ---- publishing ----------------------------------------------------------------------

    fn envelope(&mut self, body: Body) -> Envelope {
        self.seq += 1;
        Envelope::new(
            self.cfg.name.clone(),
            self.expect.kind,
            self.expect.params_digest,
            self.uuid(),
            self.id(),
            self.seq,
            body,
        )
    }

    /// Queues a frame for the publisher task (which publishes in order).
    fn send(&mut self, subject: String, frame: Vec<u8>, channel: Channel) {
        self.metrics.traffic(Direction::Out, channel, frame.len());
        let c = &self.shared.counters;
        Counters::bump(&c.bytes_sent, frame.len() as u64);
        match channel {
            Channel::Delta => Counters::bump(&c.delta_bytes_sent, frame.len() as u64),
            _ => Counters::bump(&c.state_bytes_sent, frame.len() as u64),
        }
        self.enqueue(Outbound::Publish(subject, frame.into(), channel));
    }

    /// Hands a message to the publisher task; a full queue drops it and counts.
    fn enqueue(&self, o: Outbound) {
        if let Err(mpsc::error::TrySendError::Full(o)) = self.outbound.try_send(o) {
            let channel = match &o {
                Outbound::Publish(_, _, channel) => m::channel_label(*channel),
                Outbound::State(_) => m::channel_label(Channel::State),
                Outbound::Reply(..) => m::channel_label(Channel::Api),
                Outbound::Flush(_) => "flush",
            };
            Counters::bump(&self.shared.counters.outbound_dropped, 1);
            self.metrics
                .counter(m::OUTBOUND_DROPPED, &[("channel", channel)])
                .increment(1);
        }
    }

    fn publish_state_body(&mut self, body: Body) {
        let env = self.envelope(body);
        let frame = self.codec.encode(&env);
        let subject = self.subjects.state.clone();
        self.send(subject, frame, Channel::State);
    }

    /// Commits the local updates since the last commit: appends their delta to the log (with
    /// a data directory) and publishes it once durable, answering the updates that waited for
    /// it. One commit at a time: updates arriving meanwhile go into the next (group commit).
    fn flush_delta(&mut self, ctx: &mut Context<Self>) {
        if self.committing {
            self.commit_again = true;
            return;
        }
        let batch = self.next_batch;
        self.next_batch += 1;
        if self.cfg.full_state_only {
            // The naive protocol: every change is followed by a full-state broadcast.
            self.write().take_delta();
            if self.changed_since_push {
                self.schedule_push(ctx);
            }
            let r = self.acks.committed(batch, None, 0, Instant::now());
            return self.answer(r);
        }
        let Some(delta) = self.write().take_delta() else {
            // Nothing changed since the last commit: what the waiting updates rely on is
            // already as durable and published as it gets.
            let r = self.acks.committed(batch, None, 0, Instant::now());
            return self.answer(r);
        };
        match &self.wal {
            Some(wal) => {
                self.committing = true;
                let done = wal.append(delta.clone());
                let addr = ctx.address();
                actix::spawn(async move {
                    let result = done.await.map_err(|e| e.to_string());
                    addr.do_send(Committed {
                        batch,
                        delta,
                        result,
                    });
                });
            }
            None => self.publish_delta(batch, delta, ctx),
        }
    }

    /// Publishes the delta of commit `batch` (durable by now, if there is a log).
    fn publish_delta(&mut self, batch: u64, delta: Vec<u8>, ctx: &mut Context<Self>) {
        let confirm = self.acks.wants_confirmation(batch);
        let body = if confirm {
            Body::ConfirmedDelta(delta)
        } else {
            Body::Delta(delta)
        };
        let env = self.envelope(body);
        let frame = self.codec.encode(&env);
        let seq = self.seq;
        if frame.len() > self.transport.max_payload() {
            // Too big for one message: the full state (chunked) carries it instead; updates
            // waiting for peers time out, as their peers never see this delta.
            tracing::debug!(
                bytes = frame.len(),
                "delta over max_payload, pushing the state"
            );
            self.schedule_push(ctx);
        } else {
            Counters::bump(&self.shared.counters.deltas_sent, 1);
            let subject = self.subjects.delta.clone();
            self.send(subject, frame, Channel::Delta);
        }
        let timeout = ReplicaConfig::ms(self.cfg.replicated_timeout_ms);
        let needed = peers_needed(self.cfg.replicated_peers, self.live_peers());
        let r = self
            .acks
            .committed(batch, Some(seq), needed, Instant::now() + timeout);
        self.answer(r);
        if confirm {
            ctx.run_later(timeout, |act, _| {
                let r = act.acks.expire(Instant::now());
                act.answer(r);
            });
        }
    }

    /// A commit's log append finished.
    fn committed(&mut self, c: Committed, ctx: &mut Context<Self>) {
        self.committing = false;
        if let Err(e) = &c.result {
            tracing::error!(filter = %self.cfg.name, error = %e, "write-ahead log append failed");
            let r = self.acks.commit_failed(c.batch, e);
            self.answer(r);
        }
        // Published either way: the updates are applied, and peers may as well have them.
        self.publish_delta(c.batch, c.delta, ctx);
        if std::mem::take(&mut self.commit_again) || self.acks.wants_commit(self.next_batch) {
            self.flush_delta(ctx);
        }
    }

    /// Makes sure a commit comes soon for updates that wait for one.
    fn schedule_commit(&mut self, ctx: &mut Context<Self>) {
        if self.wal.is_some() {
            // The log's own pace batches: commit now, or right after the one in flight.
            return self.flush_delta(ctx);
        }
        if !self.commit_scheduled {
            // No log to pace commits: gather what arrives within a millisecond.
            self.commit_scheduled = true;
            ctx.run_later(Duration::from_millis(1), |act, ctx| {
                act.commit_scheduled = false;
                act.flush_delta(ctx);
            });
        }
    }

    /// Answers updates whose acknowledgement level was reached, or failed.
    fn answer(&mut self, r: Resolved<Responder>) {
        for responder in r.ok {
            self.respond(responder, Ok(()));
        }
        for (responder, failure) in r.failed {
            let e = ReplicaError::from_ack(failure, self.cfg.replicated_timeout_ms);
            self.respond(responder, Err(e));
        }
    }

    fn respond(&mut self, responder: Responder, result: Result<(), ReplicaError>) {
        match responder {
            Responder::Api { reply, body } => self.api_answer(reply, body, result),
            Responder::Handle { tx, dot } => {
                let _ = tx.send(result.map(|()| dot));
            }
        }
    }

    fn live_peers(&self) -> usize {
        let live = ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3);
        self.peers
            .values()
            .filter(|p| p.last_seen.elapsed() < live)
            .count()
    }

    fn send_digest(&mut self) {
        let digest = self.my_digest();
        // The gauge needs our digest, which encodes the whole state: computed here, where the
        // anti-entropy round computes it anyway, not at every metrics interval.
        let converged = self.converged_peers();
        self.metrics.converged.set(converged as f64);
        let ready = self.ready;
        self.publish_state_body(Body::Digest { digest, ready });
    }

    fn request_state(&mut self, target: Option<Uuid>) {
        self.publish_state_body(Body::StateRequest { target });
    }

    fn my_digest(&mut self) -> u64 {
        if let Some(d) = self.digest {
            return d;
        }
        let d = self.read().state_digest();
        self.digest = Some(d);
        d
    }

    fn changed(&mut self) {
        self.digest = None;
        self.dirty = true;
    }

    /// Pushes the full state now, or as soon as `min_push_interval` allows (one push serves
    /// every peer that asked meanwhile).
    fn schedule_push(&mut self, ctx: &mut Context<Self>) {
        if self.push_scheduled {
            return;
        }
        let min = ReplicaConfig::ms(self.cfg.min_push_interval_ms);
        let wait = match self.last_push {
            Some(t) if t.elapsed() < min => min - t.elapsed(),
            _ => Duration::ZERO,
        };
        if wait.is_zero() && !self.encoding {
            self.push_state(ctx);
        } else {
            self.push_scheduled = true;
            ctx.run_later(wait.max(Duration::from_millis(10)), |act, ctx| {
                act.push_scheduled = false;
                if act.encoding {
                    act.schedule_push(ctx);
                } else {
                    act.push_state(ctx);
                }
            });
        }
    }

    /// Encodes the full state (off the actor's thread if large) and publishes it in chunks.
    fn push_state(&mut self, ctx: &mut Context<Self>) {
        self.last_push = Some(Instant::now());
        self.changed_since_push = false;
        for p in self.peers.values_mut() {
            p.mismatches = 0;
        }
        let chunk_len = self
            .cfg
            .chunk_bytes
            .min(
                self.transport
                    .max_payload()
                    .saturating_sub(ENVELOPE_OVERHEAD),
            )
            .max(1);
        // The counter wraps within the epoch half (2^32 pushes).
        self.transfer =
            (self.transfer & !0xffff_ffff) | (self.transfer.wrapping_add(1) & 0xffff_ffff);
        let transfer = self.transfer;
        let (shared, addr) = (self.shared.clone(), ctx.address());
        // Room for the state as large as it was last time, so that its buffer is not regrown.
        let last = self.shared.counters.state_bytes.load(Ordering::Relaxed) as usize;
        let capacity = last + last / 16 + 1024;
        // Bloom kinds are encoded under the read lock, not from a clone: their encoding is a
        // copy of the bits, about as long as the clone that held the lock before (~130 ms for
        // a 120 MB GBloom, BENCHMARKS.md "Memory of large states"), and the clone was a
        // second copy of the whole state. Cuckoo kinds pack fingerprints and tags, ~10x
        // longer than a clone of their (packed) table: they are still cloned, so that writers
        // (and readers queued behind a waiting writer) wait for the clone only.
        let snapshot = match self.shared.kind {
            FilterKind::GBloom | FilterKind::ScGBloom => None,
            _ => Some(self.read().clone()),
        };
        self.encoding = true;
        actix::spawn(async move {
            let encoded = tokio::task::spawn_blocking(move || {
                let state = match snapshot {
                    Some(f) => f.encode_state_sized(capacity),
                    None => shared
                        .filter
                        .read()
                        .expect("filter lock poisoned")
                        .encode_state_sized(capacity),
                };
                let checksum = xxhash_rust::xxh3::xxh3_64(&state);
                (Bytes::from(state), checksum)
            })
            .await;
            // A failed encoding (a panic) still ends the push, so later ones are not blocked.
            addr.do_send(Encoded {
                state: encoded.ok(),
                transfer,
                chunk_len,
            });
        });
    }

    // ---- receiving -----------------------------------------------------------------------

    fn on_replication(&mut self, env: Envelope, frame_len: usize, ctx: &mut Context<Self>) {
        let channel = if matches!(env.body, Body::Delta(_) | Body::ConfirmedDelta(_)) {
            Channel::Delta
        } else {
            Channel::State
        };
        self.metrics.traffic(Direction::In, channel, frame_len);
        Counters::bump(&self.shared.counters.bytes_received, frame_len as u64);
        let min = ReplicaConfig::ms(self.cfg.min_push_interval_ms);
        if !self.peers.contains_key(&env.sender) && !self.make_room_for_peer() {
            return self.reject(&WireError::TooManyPeers(self.cfg.max_peers));
        }
        let peer = self.peers.entry(env.sender).or_insert(Peer {
            replica: env.replica,
            last_seen: Instant::now(),
            last_seq: env.seq.saturating_sub(1),
            digest: None,
            mismatches: 0,
            last_request: None,
        });
        peer.replica = env.replica;
        peer.last_seen = Instant::now();
        // One publisher's messages arrive in order on one subscription, so a jump means lost
        // messages, and a step back means the peer restarted (its count starts over). A
        // remote number must not move our counters without bound: a jump beyond
        // MAX_COUNTED_GAP (a forged `u64::MAX`, say) counts as that many.
        let gap = env
            .seq
            .saturating_sub(peer.last_seq.saturating_add(1))
            .min(MAX_COUNTED_GAP);
        peer.last_seq = env.seq;
        if gap > 0 {
            // Messages of this peer were lost: ask it for its state rather than wait for the
            // next anti-entropy round.
            Counters::bump(&self.shared.counters.sequence_gaps, gap);
            self.metrics.counter(m::SEQUENCE_GAPS, &[]).increment(gap);
            if peer.last_request.is_none_or(|t| t.elapsed() >= min) {
                peer.last_request = Some(Instant::now());
                let target = env.sender;
                self.request_state(Some(target));
            }
        }
        match env.body {
            Body::Delta(bytes) => {
                self.merge_delta(&bytes);
            }
            Body::ConfirmedDelta(bytes) => {
                if self.merge_delta(&bytes) {
                    let (target, seq) = (env.sender, env.seq);
                    self.publish_state_body(Body::Ack { target, seq });
                }
            }
            Body::Ack { target, seq } => {
                if target == self.uuid() {
                    let r = self.acks.acked(env.sender, seq);
                    self.answer(r);
                }
            }
            Body::Digest { digest, ready } => {
                let mine = self.my_digest();
                let peer = self.peers.get_mut(&env.sender).expect("inserted above");
                peer.digest = Some(digest);
                if digest == mine {
                    peer.mismatches = 0;
                    if ready {
                        self.become_ready(ctx, "a peer has the same state");
                    }
                } else {
                    peer.mismatches += 1;
                    // A mismatch that persists is not just updates in flight: a loss our
                    // sequence numbers cannot see (e.g. from a replica that has left since).
                    // (Our own lost deltas show as sequence gaps at the peer, which asks.)
                    if peer.mismatches >= 3 || !ready {
                        peer.mismatches = 0;
                        self.schedule_push(ctx);
                    }
                }
            }
            Body::StateRequest { target } => {
                if target.is_none_or(|t| t == self.uuid()) {
                    self.schedule_push(ctx);
                }
            }
            Body::StateChunk(chunk) => self.on_chunk(env.sender, env.replica, chunk, ctx),
        }
    }

    /// Merges a peer's delta; whether it was accepted.
    fn merge_delta(&mut self, bytes: &[u8]) -> bool {
        let t = Instant::now();
        let r = self.write().merge_remote_delta_bytes(bytes);
        self.record_merge(MergeSource::Delta, t, r.is_ok());
        match r {
            Ok(()) => {
                Counters::bump(&self.shared.counters.deltas_merged, 1);
                self.changed();
                true
            }
            Err(e) => {
                self.reject(&e);
                false
            }
        }
    }

    fn record_merge(&self, source: MergeSource, t: Instant, ok: bool) {
        self.metrics.merge(source, ok, t.elapsed().as_secs_f64());
    }

    /// Whether a new sender may be tracked: under the cap, or by evicting the stalest peer
    /// if it has been silent for three anti-entropy intervals (a live peer is never evicted
    /// for a newcomer, so forged senders cannot push real peers out).
    fn make_room_for_peer(&mut self) -> bool {
        if self.peers.len() < self.cfg.max_peers {
            return true;
        }
        let live = ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3);
        let stalest = self
            .peers
            .iter()
            .max_by_key(|(_, p)| p.last_seen.elapsed())
            .filter(|(_, p)| p.last_seen.elapsed() >= live)
            .map(|(u, _)| *u);
        match stalest {
            Some(u) => {
                self.forget_peer(u);
                true
            }
            None => false,
        }
    }

    fn forget_peer(&mut self, uuid: Uuid) {
        self.peers.remove(&uuid);
        self.transfers.forget(&uuid);
    }

    /// Forgets peers silent for longer than `peer_expiry_ms`.
    fn expire_peers(&mut self) {
        let expiry = ReplicaConfig::ms(self.cfg.peer_expiry_ms);
        let gone: Vec<Uuid> = self
            .peers
            .iter()
            .filter(|(_, p)| p.last_seen.elapsed() >= expiry)
            .map(|(u, _)| *u)
            .collect();
        for u in gone {
            if let Some(p) = self.peers.get(&u) {
                tracing::info!(filter = %self.cfg.name, peer = p.replica, %u, "peer expired");
            }
            self.forget_peer(u);
        }
    }

    /// Live peers whose last announced digest equals ours. Our digest encodes the whole
    /// state, so it is only computed when some live peer announced one to compare with.
    fn converged_peers(&mut self) -> usize {
        let live = ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3);
        let is_live = |p: &Peer| p.last_seen.elapsed() < live && p.digest.is_some();
        if !self.peers.values().any(is_live) {
            return 0;
        }
        let mine = self.my_digest();
        self.peers
            .values()
            .filter(|p| is_live(p) && p.digest == Some(mine))
            .count()
    }

    fn on_chunk(
        &mut self,
        sender: Uuid,
        replica: ReplicaId,
        chunk: StateChunk,
        ctx: &mut Context<Self>,
    ) {
        let state = match self.transfers.add(sender, chunk) {
            Ok(Progress::Pending) => return,
            Ok(Progress::Complete(state)) => state,
            Err(e) => {
                self.metrics
                    .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                    .increment(1);
                self.reject(&e);
                return;
            }
        };
        self.metrics
            .counter(m::STATE_TRANSFERS, &[("outcome", "complete")])
            .increment(1);
        let kind = self.expect.kind;
        if state.len() < BLOCKING_THRESHOLD {
            let result = AnyFilter::decode_state(kind, &state);
            self.merge_state(result, sender, replica, ctx);
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
                });
            });
        }
    }

    fn merge_state(
        &mut self,
        result: Result<AnyFilter, WireError>,
        sender: Uuid,
        replica: ReplicaId,
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
        if let Err(e) = self.read().check_remote_state(&other) {
            self.record_merge(MergeSource::State, Instant::now(), false);
            return self.reject(&super::filter::remote_error(e));
        }
        let t = Instant::now();
        let r = self.write().merge(&other);
        self.record_merge(MergeSource::State, t, r.is_ok());
        match r {
            Ok(()) => {
                Counters::bump(&self.shared.counters.states_merged, 1);
                self.changed();
                tracing::debug!(peer = replica, %sender, "merged a peer's full state");
                self.become_ready(ctx, "merged a peer's state");
            }
            Err(e) => self.reject(&WireError::Incompatible(e.to_string())),
        }
    }

    fn become_ready(&mut self, ctx: &mut Context<Self>, why: &str) {
        if self.ready {
            return;
        }
        self.ready = true;
        self.metrics.ready.set(1.0);
        self.shared.ready.send_replace(true);
        tracing::info!(
            filter = %self.cfg.name,
            replica = self.id(),
            after_ms = self.started.elapsed().as_millis() as u64,
            "replica ready: {why}"
        );
        if self.cfg.serve_api && !self.api_started {
            self.api_started = true;
            self.start_api(ctx);
        }
    }

    fn on_event(&mut self, ev: TransportEvent, ctx: &mut Context<Self>) {
        match ev {
            TransportEvent::Connected => {
                self.metrics.connected.set(1.0);
                Counters::bump(&self.shared.counters.reconnects, 1);
                // Publishes made while disconnected may be lost: re-announce, ask for the
                // peers' states and push ours.
                self.request_state(None);
                self.send_digest();
                self.schedule_push(ctx);
            }
            TransportEvent::Disconnected => {
                self.metrics.connected.set(0.0);
                Counters::bump(&self.shared.counters.disconnects, 1);
                self.metrics.counter(m::DISCONNECTS, &[]).increment(1);
            }
            TransportEvent::SlowConsumer => {
                self.metrics.counter(m::SLOW_CONSUMER, &[]).increment(1);
                // Messages were dropped client-side: sequence gaps will name the peers, but a
                // broadcast request repairs the loss sooner.
                self.request_state(None);
            }
            TransportEvent::Closed => self.metrics.connected.set(0.0),
        }
    }

    // ---- local operations ----------------------------------------------------------------

    fn check_item(&self, item: &[u8]) -> Result<(), ReplicaError> {
        check_item(item, self.cfg.max_item_bytes)
    }

    fn op(&self, op: OpKind, ok: bool) {
        self.metrics.op(op, ok);
    }

    /// Reserves tag timestamps durably before one above the reservation is issued.
    fn reserve_tags(&mut self) -> Result<(), ReplicaError> {
        if !self.expect.kind.removable() {
            return Ok(());
        }
        self.check_lease()?;
        let Some(data) = &self.data else {
            return Ok(());
        };
        let clock = self.read().clock();
        if clock < self.reserved {
            return Ok(());
        }
        let reserved = clock + self.cfg.tag_reserve_block;
        data.save_reservation(&Reservation {
            identity: self.shared.identity,
            reserved,
        })?;
        self.reserved = reserved;
        self.metrics.counter(m::TAG_RESERVATIONS, &[]).increment(1);
        Ok(())
    }

    fn do_add(&mut self, item: &[u8]) -> Result<Option<Dot>, ReplicaError> {
        let r = self
            .check_item(item)
            .and_then(|_| self.reserve_tags())
            .and_then(|_| self.write().add(item).map_err(ReplicaError::from));
        self.op(OpKind::Add, r.is_ok());
        if r.is_ok() {
            self.local_change();
        }
        r
    }

    fn do_remove(&mut self, item: &[u8]) -> Result<Option<Dot>, ReplicaError> {
        let r = self
            .check_item(item)
            .and_then(|_| self.write().remove(item).map_err(ReplicaError::from));
        self.op(OpKind::Remove, r.is_ok());
        if matches!(r, Ok(Some(_))) {
            self.local_change();
        }
        r
    }

    /// Refuses a level this replica cannot give before the update is applied.
    fn check_level(&self, level: AckLevel) -> Result<(), ReplicaError> {
        if level == AckLevel::Durable && self.wal.is_none() {
            return Err(ReplicaError::AckUnavailable(
                "`durable` needs a data_dir".into(),
            ));
        }
        Ok(())
    }

    /// Answers an applied local update once it reached `level` (at once if it changed
    /// nothing: what it relies on is already committed or in the next commit's way).
    fn settle(
        &mut self,
        level: AckLevel,
        changed: bool,
        responder: Responder,
        ctx: &mut Context<Self>,
    ) {
        if level == AckLevel::Local || !changed {
            self.respond(responder, Ok(()));
        } else {
            self.acks.wait(level, self.next_batch, responder);
            self.schedule_commit(ctx);
        }
        // Only now, with the update waiting on the next commit: committing before would put
        // its delta in a commit it does not wait for.
        self.commit_if_full(ctx);
        self.extend_lease_if_low(ctx);
    }

    /// Commits when the pending delta holds `delta_max_updates` updates.
    pub(super) fn commit_if_full(&mut self, ctx: &mut Context<Self>) {
        if self.read().pending_delta_len() >= self.cfg.delta_max_updates {
            self.flush_delta(ctx);
        }
    }

    fn do_contains(&self, item: &[u8]) -> Result<bool, ReplicaError> {
        self.check_item(item)?;
        Ok(self.read().contains(item))
    }

    /// Marks a local update; the commit it may call for comes from [`Replica::settle`].
    pub(super) fn local_change(&mut self) {
        self.changed();
        self.changed_since_push = true;
    }

    fn stats(&mut self) -> ReplicaStats {
        let digest = self.my_digest();
        let converged_peers = self.converged_peers();
        let (figures, pending_delta): (FilterStats, usize) = {
            let f = self.read();
            (f.stats(), f.pending_delta_len())
        };
        let c = &self.shared.counters;
        let live = ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3);
        ReplicaStats {
            filter: self.cfg.name.clone(),
            replica: self.id(),
            uuid: self.uuid(),
            ready: self.ready,
            connected: self.transport.is_connected(),
            peers: self
                .peers
                .values()
                .filter(|p| p.last_seen.elapsed() < live)
                .count(),
            pending_delta,
            digest: format!("{digest:016x}"),
            awaiting_ack: self.acks.len(),
            converged_peers,
            live_ids: self.lease.live_ids,
            retired_ids: self.lease.retired_ids,
            id_lost: self.lease.lost,
            figures,
            rejects: by_reason(&c.rejects),
            api_errors: by_reason(&c.api_errors),
            outbound_dropped: c.outbound_dropped.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            disconnects: c.disconnects.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
            sequence_gaps: c.sequence_gaps.load(Ordering::Relaxed),
            deltas_sent: c.deltas_sent.load(Ordering::Relaxed),
            deltas_merged: c.deltas_merged.load(Ordering::Relaxed),
            state_pushes: c.state_pushes.load(Ordering::Relaxed),
            states_merged: c.states_merged.load(Ordering::Relaxed),
            bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
            delta_bytes_sent: c.delta_bytes_sent.load(Ordering::Relaxed),
            state_bytes_sent: c.state_bytes_sent.load(Ordering::Relaxed),
            echoes_received: c.echoes.load(Ordering::Relaxed),
            bytes_received: c.bytes_received.load(Ordering::Relaxed),
            state_bytes: c.state_bytes.load(Ordering::Relaxed),
        }
    }

    // ---- durability and housekeeping -----------------------------------------------------

    /// Takes what a snapshot saves, on the actor's thread: the log is rotated at the same
    /// moment the state is cloned, so the clone holds every record of the segments up to the
    /// one it returns (see [`super::wal`]).
    fn snapshot_source(&mut self) -> SnapshotJob {
        self.snapshot_generation += 1;
        let wal_covered = self.wal.as_mut().map(|w| w.rotate());
        SnapshotJob {
            filter: self.read().clone(),
            identity: self.shared.identity,
            name: self.cfg.name.clone(),
            kind: self.expect.kind,
            params_digest: self.expect.params_digest,
            reserved: self.reserved,
            wal_covered,
            generation: self.snapshot_generation,
        }
    }

    /// Writes a snapshot in the background if the state changed since the last one.
    fn snapshot_async(&mut self, ctx: &mut Context<Self>) {
        let Some(data) = self.data.clone() else {
            return;
        };
        if !self.dirty || self.snapshotting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.dirty = false;
        let job = self.snapshot_source();
        let (shared, saved) = (self.shared.clone(), self.snapshot_saved.clone());
        let busy = self.snapshotting.clone();
        let addr = ctx.address();
        actix::spawn(async move {
            let r = tokio::task::spawn_blocking(move || job.save(&data, &shared, &saved))
                .await
                .unwrap_or_else(|e| Err(ReplicaError::Config(format!("snapshot task: {e}"))));
            busy.store(false, Ordering::Release);
            addr.do_send(SnapshotSaved(r));
        });
    }

    /// Writes a snapshot now, on the actor's thread (shutdown, explicit requests).
    fn snapshot_now(&mut self) -> Result<(), ReplicaError> {
        let Some(data) = self.data.clone() else {
            return Ok(());
        };
        let job = self.snapshot_source();
        let r = job.save(&data, &self.shared, &self.snapshot_saved);
        let ok = r.is_ok();
        self.snapshot_saved_now(r)?;
        if ok {
            self.dirty = false;
        }
        Ok(())
    }

    /// A snapshot was saved (or failed): counts it, and drops the log segments it covers.
    fn snapshot_saved_now(
        &mut self,
        r: Result<Option<SegmentId>, ReplicaError>,
    ) -> Result<(), ReplicaError> {
        let outcome = if r.is_ok() { "ok" } else { "error" };
        self.metrics
            .counter(m::SNAPSHOTS, &[("outcome", outcome)])
            .increment(1);
        match r {
            Ok(covered) => {
                if let (Some(wal), Some(k)) = (&self.wal, covered) {
                    let done = wal.remove_through(k);
                    actix::spawn(async move {
                        if let Err(e) = done.await {
                            tracing::warn!(error = %e, "removing covered log segments failed");
                        }
                    });
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(filter = %self.cfg.name, error = %e, "snapshot failed");
                self.dirty = true;
                Err(e)
            }
        }
    }

    fn housekeeping(&mut self, ctx: &mut Context<Self>) {
        {
            let f = self.read();
            let s = f.stats();
            self.metrics.fpr.set(s.estimated_fpr);
            self.metrics.load.set(s.load_factor);
            self.metrics.cardinality.set(s.cardinality);
            self.metrics.capacity.set(s.capacity as f64);
            self.metrics.pending.set(f.pending_delta_len() as f64);
        }
        self.metrics
            .state_bytes
            .set(self.shared.counters.state_bytes.load(Ordering::Relaxed) as f64);
        self.metrics
            .connected
            .set(if self.transport.is_connected() {
                1.0
            } else {
                0.0
            });
        // Gauges set on events only are set again here, so the exporter's idle timeout
        // (which ends the series of expired peers) never ends theirs.
        self.metrics.target_fpr.set(self.cfg.filter.fpr);
        self.metrics.ready.set(if self.ready { 1.0 } else { 0.0 });
        if let Some(wal) = &self.wal {
            let s = wal.stats();
            for (name, v) in [
                (m::WAL_APPENDS, &s.appends),
                (m::WAL_FSYNCS, &s.fsyncs),
                (m::WAL_BYTES, &s.bytes),
                (m::WAL_FAILURES, &s.failures),
            ] {
                self.metrics
                    .counter(name, &[])
                    .absolute(v.load(Ordering::Relaxed));
            }
        }
        self.expire_peers();
        let live = ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3);
        let mut alive = 0;
        for p in self.peers.values() {
            let age = p.last_seen.elapsed();
            if age < live {
                alive += 1;
            }
            self.metrics
                .gauge(m::PEER_STALENESS, &[("peer", &p.replica.to_string())])
                .set(age.as_secs_f64());
        }
        self.metrics.peers.set(alive as f64);
        let expired = self.transfers.expire();
        if expired > 0 {
            self.metrics
                .counter(m::STATE_TRANSFERS, &[("outcome", "expired")])
                .increment(expired as u64);
        }
        self.catch_up(ctx);
    }

    /// Readiness without a peer's state: a replica that heard no peer within
    /// `catch_up_timeout_ms` is alone and ready; one that hears peers keeps asking for their
    /// state, up to ten timeouts.
    fn catch_up(&mut self, ctx: &mut Context<Self>) {
        if self.ready {
            return;
        }
        let timeout = ReplicaConfig::ms(self.cfg.catch_up_timeout_ms);
        let waited = self.started.elapsed();
        if waited < timeout {
            return;
        }
        if self.peers.is_empty() {
            self.become_ready(ctx, "no peer heard within catch_up_timeout: alone");
        } else if waited >= timeout * 10 {
            self.become_ready(
                ctx,
                "peers heard but no state merged within 10 catch_up_timeouts",
            );
        } else if self
            .last_catch_up_request
            .is_none_or(|t| t.elapsed() >= timeout)
        {
            self.last_catch_up_request = Some(Instant::now());
            self.request_state(None);
        }
    }

    fn schedule_digest(&mut self, ctx: &mut Context<Self>) {
        let base = self.cfg.anti_entropy_interval_ms as f64;
        let jitter = base * (0.75 + 0.5 * fastrand::f64());
        ctx.run_later(Duration::from_millis(jitter as u64), |act, ctx| {
            act.send_digest();
            act.schedule_digest(ctx);
        });
    }
}

/// The header of an API request that asks for an acknowledgement level.
pub use crate::api::ACK_HEADER;

/// Sequence gaps one message can add to the counters.
const MAX_COUNTED_GAP: u64 = 1 << 20;

fn by_reason(counts: &Mutex<BTreeMap<&'static str, u64>>) -> BTreeMap<String, u64> {
    counts
        .lock()
        .expect("counters lock")
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect()
}

/// Counts and logs (rate-limited) a rejected message.
pub(crate) fn reject(shared: &Shared, metrics: &Metrics, limiter: &LogLimiter, e: &WireError) {
    let reason = e.reason();
    *shared
        .counters
        .rejects
        .lock()
        .expect("counters lock")
        .entry(reason)
        .or_default() += 1;
    metrics
        .counter(m::REJECTS, &[("reason", reason)])
        .increment(1);
    if let Some(suppressed) = limiter.allow(reason) {
        tracing::warn!(filter = %shared.name, reason, suppressed, "rejected a message: {e}");
    }
}

/// Forwards a subscription into the actor's inbound buffer, resubscribing if it ends, until
/// the actor is gone. A full buffer drops the message and counts it.
#[allow(clippy::too_many_arguments)]
async fn forward_stream(
    initial: &mut Option<MessageStream>,
    transport: Arc<dyn Transport>,
    subject: String,
    queue: Option<String>,
    tx: mpsc::Sender<Inbound>,
    mut route: impl FnMut(Message) -> Route,
    shared: Arc<Shared>,
    metrics: Metrics,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut stream = match initial.take() {
            Some(s) => s,
            None => match transport.subscribe(subject.clone(), queue.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%subject, error = %e, "subscribe failed, retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = tx.closed() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        loop {
            let msg = tokio::select! {
                m = stream.next() => m,
                _ = tx.closed() => return,
            };
            let Some(msg) = msg else { break };
            backoff = Duration::from_millis(50);
            let item = match route(msg) {
                Route::Actor(item) => item,
                Route::Drop => continue,
                Route::Reply(to, headers, payload) => {
                    if transport
                        .publish_with_headers(to, headers, payload)
                        .await
                        .is_err()
                    {
                        metrics
                            .counter(m::PUBLISH_ERRORS, &[("channel", "api")])
                            .increment(1);
                    }
                    continue;
                }
            };
            // Bounded in messages by the channel, and in bytes here: a flood of large
            // chunks must not pile up in memory while the actor is busy.
            let size = item.size();
            let c = &shared.counters;
            let queued = c.inbound_bytes.fetch_add(size, Ordering::AcqRel);
            let result = if queued + size > shared.inbound_max_bytes {
                Err(mpsc::error::TrySendError::Full(item))
            } else {
                tx.try_send(item)
            };
            match result {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    c.inbound_bytes.fetch_sub(size, Ordering::AcqRel);
                    Counters::bump(&c.dropped, 1);
                    metrics.dropped.increment(1);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
        tracing::warn!(%subject, "subscription ended, resubscribing");
    }
}

impl Actor for Replica {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.metrics.ready.set(0.0);
        self.metrics
            .connected
            .set(if self.transport.is_connected() {
                1.0
            } else {
                0.0
            });
        // Inbound messages arrive as a stream; the buffer between the subscriptions and the
        // actor is bounded and drops (counting) rather than growing without limit.
        let rx = self.inbound_rx.take().expect("started once");
        ctx.add_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        }));

        // Replication: decoded and checked before they take a place in the buffer.
        let codec = self.codec.clone();
        let me = self.uuid();
        let limiter = self.limiter.clone();
        let (shared, metrics) = (self.shared.clone(), self.metrics.clone());
        // Only the exact delta and state subjects count, each for its own bodies: the
        // subscription's wildcard also hears `<filter>.api` requests (answered by the API
        // subscription) and whatever anyone publishes on `<filter>.<anything>`.
        let subjects = self.subjects.clone();
        let convert = move |msg: Message| {
            let channel = match subjects.channel(&msg.subject) {
                Some(c @ (Channel::Delta | Channel::State)) => c,
                Some(Channel::Api) => return None,
                None => {
                    let e = WireError::Subject(format!(
                        "`{}` is not a replication subject",
                        msg.subject
                    ));
                    reject(&shared, &metrics, &limiter, &e);
                    return None;
                }
            };
            match codec.decode(&msg.payload) {
                Ok(env) if env.sender == me => {
                    Counters::bump(&shared.counters.echoes, 1);
                    None
                }
                Ok(env) if (channel == Channel::Delta) != env.body.is_delta() => {
                    let e = WireError::Subject(format!(
                        "a {} on `{}`",
                        if env.body.is_delta() {
                            "delta"
                        } else {
                            "state message"
                        },
                        msg.subject
                    ));
                    reject(&shared, &metrics, &limiter, &e);
                    None
                }
                Ok(env) => Some(Inbound::Replication(env, msg.payload.len())),
                Err(e) => {
                    reject(&shared, &metrics, &limiter, &e);
                    None
                }
            }
        };
        let mut initial = self.replication.take();
        let (t, subj, tx) = (
            self.replication_transport.clone(),
            self.subjects.replication.clone(),
            self.inbound_tx.clone(),
        );
        let (shared, metrics) = (self.shared.clone(), self.metrics.clone());
        self.tasks.push(actix::spawn(async move {
            let route = |m| convert(m).map_or(Route::Drop, Route::Actor);
            forward_stream(&mut initial, t, subj, None, tx, route, shared, metrics).await;
        }));

        // Connection events.
        let mut events = self.transport.events();
        let tx = self.inbound_tx.clone();
        self.tasks.push(actix::spawn(async move {
            loop {
                let ev = tokio::select! {
                    e = events.recv() => e,
                    _ = tx.closed() => return,
                };
                match ev {
                    Ok(ev) => {
                        let _ = tx.send(Inbound::Event(ev)).await;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                }
            }
        }));

        // The publisher: one task, so frames leave in the order they were queued.
        let mut out = self.outbound_rx.take().expect("started once");
        let (transport, replication) = (self.transport.clone(), self.replication_transport.clone());
        let (metrics, limiter) = (self.metrics.clone(), self.limiter.clone());
        let shared = self.shared.clone();
        actix::spawn(async move {
            while let Some(o) = out.recv().await {
                let (sent, channel) = match o {
                    Outbound::Publish(subject, payload, channel) => (
                        replication.publish(subject, payload).await,
                        m::channel_label(channel),
                    ),
                    Outbound::State(push) => {
                        let mut sent = Ok(());
                        for i in 0..push.count() {
                            let frame = push.frame(i);
                            metrics.traffic(Direction::Out, Channel::State, frame.len());
                            let c = &shared.counters;
                            Counters::bump(&c.bytes_sent, frame.len() as u64);
                            Counters::bump(&c.state_bytes_sent, frame.len() as u64);
                            sent = replication
                                .publish(push.subject.clone(), frame.into())
                                .await;
                            if sent.is_err() {
                                // The rest would not get through either; anti-entropy repairs.
                                break;
                            }
                        }
                        (sent, m::channel_label(Channel::State))
                    }
                    Outbound::Reply(subject, payload, headers) => (
                        transport
                            .publish_with_headers(subject, headers, payload)
                            .await,
                        m::channel_label(Channel::Api),
                    ),
                    Outbound::Flush(done) => {
                        let _ = replication.flush().await;
                        let _ = transport.flush().await;
                        let _ = done.send(());
                        continue;
                    }
                };
                if let Err(e) = sent {
                    metrics
                        .counter(m::PUBLISH_ERRORS, &[("channel", channel)])
                        .increment(1);
                    if let Some(n) = limiter.allow("publish") {
                        tracing::warn!(error = %e, suppressed = n, "publish failed; anti-entropy will repair");
                    }
                }
            }
        });

        ctx.run_interval(ReplicaConfig::ms(self.cfg.delta_interval_ms), |act, ctx| {
            act.flush_delta(ctx)
        });
        ctx.run_interval(
            ReplicaConfig::ms(self.cfg.metrics_interval_ms),
            |act, ctx| act.housekeeping(ctx),
        );
        ctx.run_interval(ReplicaConfig::ms(self.cfg.id_lease_renew_ms), |act, ctx| {
            act.renew_lease(ctx)
        });
        self.metrics.gauge(m::ID_LOST, &[]).set(0.0);
        self.renew_lease(ctx);
        if self.data.is_some() {
            ctx.run_interval(
                ReplicaConfig::ms(self.cfg.snapshot_interval_ms),
                |act, ctx| act.snapshot_async(ctx),
            );
        }
        self.schedule_digest(ctx);
        // Catch up: ask every peer for its state, and tell them ours.
        self.request_state(None);
        self.send_digest();
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.metrics.ready.set(0.0);
        tracing::info!(filter = %self.cfg.name, replica = self.id(), "replica stopped");
    }
}

impl StreamHandler<Inbound> for Replica {
    fn handle(&mut self, item: Inbound, ctx: &mut Context<Self>) {
        self.shared
            .counters
            .inbound_bytes
            .fetch_sub(item.size(), Ordering::AcqRel);
        match item {
            Inbound::Replication(env, len) => self.on_replication(env, len, ctx),
            Inbound::Api(msg) => self.on_api(msg, ctx),
            Inbound::Event(ev) => self.on_event(ev, ctx),
        }
    }

    /// The stream only ends when the actor drops its own sender, i.e. never while it runs;
    /// do not let actix stop the actor (its default) if it somehow does.
    fn finished(&mut self, _ctx: &mut Context<Self>) {}
}

// ---- messages ---------------------------------------------------------------------------

/// Adds an item; OR kinds answer the tag issued. Answered once the update reached `ack`
/// (unset: the replica's default level).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Dot>, ReplicaError>")]
pub struct Add {
    /// The item.
    pub item: Vec<u8>,
    /// Its acknowledgement level.
    pub ack: Option<AckLevel>,
}

/// Removes one occurrence of an item (OR kinds); answers the tag of the entry removed, `None`
/// if the item was not contained. Answered once the update reached `ack`.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Option<Dot>, ReplicaError>")]
pub struct Remove {
    /// The item.
    pub item: Vec<u8>,
    /// Its acknowledgement level.
    pub ack: Option<AckLevel>,
}

/// Membership test through the mailbox ([`ReplicaHandle::contains`] reads without it).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<bool, ReplicaError>")]
pub struct Contains(pub Vec<u8>);

/// The replica's figures.
#[derive(Debug, Clone, Message)]
#[rtype(result = "ReplicaStats")]
pub struct Stats;

/// A copy of the current state.
#[derive(Debug, Clone, Message)]
#[rtype(result = "AnyFilter")]
pub struct TakeSnapshot;

/// Merges a full state from elsewhere (a file, another system).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub struct Merge(pub AnyFilter);

/// Writes a snapshot to the data directory now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub struct Persist;

/// Publishes what is pending, snapshots, stops the actor, and answers once the transport has
/// sent everything.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub struct Shutdown;

/// Publishes the pending delta now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct FlushDelta;

#[derive(Message)]
#[rtype(result = "()")]
struct Encoded {
    /// The encoded state and its xxh3-64; `None` if encoding failed.
    state: Option<(Bytes, u64)>,
    transfer: u64,
    chunk_len: usize,
}

/// A full state on its way out: one encoded buffer, framed a chunk at a time by the
/// publisher task, so that a push holds the state about once instead of as the state, its
/// chunks and their frames together. Its chunks' sequence numbers are reserved when it is
/// queued, so they stay in order with the messages queued around it.
struct StatePush {
    subject: String,
    state: Bytes,
    checksum: u64,
    transfer: u64,
    chunk_len: usize,
    /// Sequence number of the first chunk.
    first_seq: u64,
    codec: WireCodec,
    /// The envelope of every chunk but for its sequence number and body.
    template: Envelope,
}

impl StatePush {
    fn count(&self) -> usize {
        chunk_count(self.state.len(), self.chunk_len)
    }

    /// The frame of chunk `i`.
    fn frame(&self, i: usize) -> Vec<u8> {
        let chunk = state_chunk(&self.state, self.transfer, self.chunk_len, self.checksum, i);
        let mut env = self.template.clone();
        env.seq = self.first_seq + i as u64;
        env.body = Body::StateChunk(chunk);
        self.codec.encode(&env)
    }
}

/// What a snapshot saves, taken on the actor's thread and saved on any.
struct SnapshotJob {
    filter: AnyFilter,
    identity: Identity,
    name: String,
    kind: FilterKind,
    params_digest: u64,
    reserved: u64,
    wal_covered: Option<SegmentId>,
    generation: u64,
}

impl SnapshotJob {
    /// Encodes and saves it, unless a newer snapshot was saved meanwhile; answers the log
    /// segments it covers.
    fn save(
        self,
        data: &DataDir,
        shared: &Shared,
        saved: &Mutex<u64>,
    ) -> Result<Option<SegmentId>, ReplicaError> {
        let state = self.filter.encode_state();
        let len = state.len();
        // Held while saving, so snapshots land in the order they were taken.
        let mut newest = saved.lock().expect("snapshot lock");
        if *newest > self.generation {
            return Ok(None);
        }
        data.save_snapshot(&Snapshot {
            identity: self.identity,
            filter: self.name,
            kind: self.kind,
            params_digest: self.params_digest,
            reserved: self.reserved,
            state,
            wal_covered: self.wal_covered.map(|k| k.0),
        })?;
        *newest = self.generation;
        shared
            .counters
            .state_bytes
            .store(len as u64, Ordering::Relaxed);
        Ok(self.wal_covered)
    }
}

/// A background snapshot finished.
#[derive(Message)]
#[rtype(result = "()")]
struct SnapshotSaved(Result<Option<SegmentId>, ReplicaError>);

impl Handler<SnapshotSaved> for Replica {
    type Result = ();
    fn handle(&mut self, msg: SnapshotSaved, _: &mut Context<Self>) {
        let _ = self.snapshot_saved_now(msg.0);
    }
}

/// A commit's log append finished.
#[derive(Message)]
#[rtype(result = "()")]
struct Committed {
    batch: u64,
    delta: Vec<u8>,
    result: Result<(), String>,
}

#[derive(Message)]
#[rtype(result = "()")]
struct Decoded {
    result: Result<AnyFilter, WireError>,
    sender: Uuid,
    replica: ReplicaId,
}

impl Handler<Add> for Replica {
    type Result = ResponseFuture<Result<Option<Dot>, ReplicaError>>;
    fn handle(&mut self, msg: Add, ctx: &mut Context<Self>) -> Self::Result {
        let level = msg.ack.unwrap_or(self.cfg.default_ack());
        let applied = self.check_level(level).and_then(|_| self.do_add(&msg.item));
        self.settle_handle(level, applied.map(|dot| (true, dot)), ctx)
    }
}

impl Handler<Remove> for Replica {
    type Result = ResponseFuture<Result<Option<Dot>, ReplicaError>>;
    fn handle(&mut self, msg: Remove, ctx: &mut Context<Self>) -> Self::Result {
        let level = msg.ack.unwrap_or(self.cfg.default_ack());
        let applied = self
            .check_level(level)
            .and_then(|_| self.do_remove(&msg.item));
        self.settle_handle(level, applied.map(|dot| (dot.is_some(), dot)), ctx)
    }
}

impl Replica {
    /// The answer of a [`ReplicaHandle`] update, once it reached its level.
    fn settle_handle(
        &mut self,
        level: AckLevel,
        applied: Result<(bool, Option<Dot>), ReplicaError>,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<Option<Dot>, ReplicaError>> {
        let (tx, rx) = oneshot::channel();
        match applied {
            Ok((changed, dot)) => self.settle(level, changed, Responder::Handle { tx, dot }, ctx),
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
        Box::pin(async move { rx.await.unwrap_or(Err(ReplicaError::Stopped)) })
    }
}

impl Handler<Committed> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Committed, ctx: &mut Context<Self>) {
        self.committed(msg, ctx);
    }
}

impl Handler<Contains> for Replica {
    type Result = Result<bool, ReplicaError>;
    fn handle(&mut self, msg: Contains, _: &mut Context<Self>) -> Self::Result {
        let r = self.do_contains(&msg.0);
        self.op(OpKind::Contains, r.is_ok());
        r
    }
}

impl Handler<Stats> for Replica {
    type Result = MessageResult<Stats>;
    fn handle(&mut self, _: Stats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

impl Handler<TakeSnapshot> for Replica {
    type Result = MessageResult<TakeSnapshot>;
    fn handle(&mut self, _: TakeSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.read().clone())
    }
}

impl Handler<Merge> for Replica {
    type Result = Result<(), ReplicaError>;
    fn handle(&mut self, msg: Merge, _: &mut Context<Self>) -> Self::Result {
        let t = Instant::now();
        let r = self.write().merge(&msg.0);
        self.record_merge(MergeSource::Local, t, r.is_ok());
        r?;
        self.changed();
        self.changed_since_push = true;
        Ok(())
    }
}

impl Handler<Persist> for Replica {
    type Result = Result<(), ReplicaError>;
    fn handle(&mut self, _: Persist, _: &mut Context<Self>) -> Self::Result {
        self.snapshot_now()
    }
}

impl Handler<FlushDelta> for Replica {
    type Result = ();
    fn handle(&mut self, _: FlushDelta, ctx: &mut Context<Self>) {
        self.flush_delta(ctx);
    }
}

impl Handler<Shutdown> for Replica {
    type Result = ResponseFuture<Result<(), ReplicaError>>;
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        self.flush_delta(ctx);
        let saved = self.snapshot_now();
        // The final snapshot holds every update: durable ones are answered, the others
        // (waiting for peers, or with no snapshot written) fail as stopped.
        let durable = (saved.is_ok() && self.data.is_some()).then_some(self.next_batch);
        let r = self.acks.stop(durable);
        self.answer(r);
        let (done, flushed) = oneshot::channel();
        self.enqueue(Outbound::Flush(done));
        ctx.stop();
        Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), flushed).await;
            saved
        })
    }
}

impl Handler<Encoded> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Encoded, _: &mut Context<Self>) {
        self.encoding = false;
        let Some((state, checksum)) = msg.state else {
            return;
        };
        self.shared
            .counters
            .state_bytes
            .store(state.len() as u64, Ordering::Relaxed);
        Counters::bump(&self.shared.counters.state_pushes, 1);
        self.metrics.counter(m::STATE_PUSHES, &[]).increment(1);
        let template = self.envelope(Body::Delta(Vec::new()));
        let push = StatePush {
            subject: self.subjects.state.clone(),
            state,
            checksum,
            transfer: msg.transfer,
            chunk_len: msg.chunk_len,
            first_seq: template.seq,
            codec: self.codec.clone(),
            template,
        };
        // `envelope` took the first number; the rest are reserved here.
        self.seq += push.count() as u64 - 1;
        self.enqueue(Outbound::State(Box::new(push)));
    }
}

impl Handler<Decoded> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Decoded, ctx: &mut Context<Self>) {
        self.merge_state(msg.result, msg.sender, msg.replica, ctx);
    }
}

impl ReplicaHandle {
    pub(crate) fn from_parts(addr: Addr<Replica>, shared: Arc<Shared>) -> Self {
        ReplicaHandle { addr, shared }
    }
}
