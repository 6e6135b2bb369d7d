//! Parking: a replica that is idle gives up its actor and leaves its state with its node, as
//! data ([`Parked`]); the node runs it again ([`crate::replica::Replica::resume`]) as soon as
//! a request or a message is for it. Of a node's 100,000 mostly idle filters, each actor (its
//! task, timers, queues, subjects, codec and commit pipeline) cost ~5 KB beside a 1.2 KB
//! state.
//!
//! A replica with peers parks too, once its state equals every live peer's (each announced
//! our digest): it leaves its digest and the frame that announces it, and its node announces
//! that frame in its digest batches at the quiet spacing (so its peers keep counting it live)
//! and compares the peers' batched digests with it, waking the replica only for one that
//! differs. Any other message of a peer for it (a delta, a state, a request) wakes it and is
//! handed to it (docs/DESIGN.md, "Parking with peers").

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use actix::prelude::*;

use super::Replica;
use crate::replica::config::ReplicaConfig;
use crate::replica::core::InFlight;
use crate::replica::durable::Identity;
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::Telemetry;
use crate::replica::ticks::quiet_digest_max;
use crate::wire::{Body, Envelope};

/// How many anti-entropy intervals apart a node announces its parked replicas' digests: the
/// quietest spacing a live replica's peers accept ([`quiet_digest_max`]), which the
/// announced frame states (`None`: 1).
pub(crate) fn parked_spacing(cfg: &ReplicaConfig) -> Option<u32> {
    let max = quiet_digest_max(cfg.anti_entropy_interval_ms, cfg.peer_expiry_ms);
    (max > 1).then_some(max)
}

/// What a parked replica leaves with its node: its state, and what resumes it without
/// reading its data directory.
pub(crate) struct Parked {
    pub filter: AnyFilter,
    pub identity: Identity,
    /// Its counts go on from where they were (`stats`).
    pub telemetry: Telemetry,
    /// With a data directory (its configuration's), the segment of the log its writer goes
    /// on at: after every one written so far, which its last snapshot covers. (Nothing else
    /// of its directory or writer is kept: 100,000 parked replicas held 35 MB of paths and
    /// writers that their configurations give again.)
    pub wal_next: Option<u64>,
    /// The tags reserved durably.
    pub reserved: u64,
    /// The number of its last numbered message: a resumed replica numbers on from it, so
    /// that its peers see no restart (nor, from the claims of its announced frame, a loss).
    pub seq: u64,
    /// Its state's digest when it parked: a peer's equal digest needs no answer.
    pub digest: u64,
    /// With peers: its digest's frame, for its node to announce in its batches (ready, all
    /// its numbered messages sent, the next within [`parked_spacing`] intervals).
    pub announce: Option<Box<[u8]>>,
    /// Restored from its data directory as its node started ([`restored_announcement`]),
    /// and no ready peer announced an equal digest since: whether it missed anything while
    /// its node was down is not known yet. Its frame says it is not ready, so that a peer
    /// whose state differs pushes its own at once.
    pub unconfirmed: AtomicBool,
    /// Restored parked from its data directory as its node started, and not run since.
    pub restored: bool,
    /// What a query may hold (its configuration's): its node answers queries from the kept
    /// state ([`answer_parked`]).
    pub limits: crate::api::batch::Limits,
}

/// A query answered from a parked replica's kept state (over RESP, through
/// `Keyspace::query_parked`): its filter's kind (a RESP command checks it against its
/// family), and the answer.
pub type ParkedAnswer = (
    crate::FilterKind,
    Result<crate::api::Response, crate::replica::ReplicaError>,
);

/// Whether the parked replica `parked` answers `op` from its kept state: a query, of a
/// kind whose reads need no clock.
fn answers_parked(parked: &Parked, op: crate::api::Op) -> bool {
    op.is_query() && !parked.filter.kind().clocked()
}

/// The answer of `request` from the parked replica `parked`'s kept state, if it is a query
/// that state answers (see [`answer_parked`]); `None` for anything else, which resumes it.
pub(crate) fn query_parked(parked: &Parked, request: &crate::api::Request) -> Option<ParkedAnswer> {
    if !answers_parked(parked, request.op()) {
        return None;
    }
    let answer =
        super::reads::query_state(&parked.filter, parked.limits, &parked.telemetry, request);
    if let Err(e) = &answer {
        parked.telemetry.api_errors(e.reason(), 1);
    }
    Some((parked.filter.kind(), answer))
}

/// The reply to `msg`, a request on one of the API subjects (`subjects`) of the parked
/// replica `parked`, if it is a query its kept state answers: `None` for anything else (an
/// update, an operation the actor answers, a kind whose reads need its clock), which
/// resumes it. A query wakes nothing: after a restart, 100,000 filters each probed once
/// resumed 100,000 actors (1.2 GB, and half the restart's CPU) to answer from a state
/// they had already. What it answers is what the replica would (a restored one serves at
/// once as well), and while parked its state changes only by resuming.
pub(crate) fn answer_parked(
    parked: &Parked,
    subjects: &crate::transport::Subjects,
    msg: &crate::transport::Message,
) -> Option<Option<(String, async_nats::HeaderMap, bytes::Bytes)>> {
    use crate::api::ReplyFormat;
    use crate::replica::metrics::{Channel, Direction};
    let op = subjects.api_op(&msg.subject)?;
    if !op.parse().is_ok_and(|op| answers_parked(parked, op)) {
        return None;
    }
    let telemetry = &parked.telemetry;
    telemetry.traffic(Direction::In, Channel::Api, msg.payload.len());
    let (result, format) =
        match super::reply::nats_request(Some(op), &subjects.api_root, msg, parked.limits) {
            // A query of the op checked above: answered here.
            Ok((request, format)) => (query_parked(parked, &request)?.1, format),
            Err(e) => {
                telemetry.api_errors(e.reason(), 1);
                (Err(e), ReplyFormat::Json)
            }
        };
    let reply = super::reply::ApiReply::of_result(result, format).finish(
        parked.identity.replica,
        None,
        msg.reply.clone(),
    );
    if let Some((_, _, payload)) = &reply {
        telemetry.traffic(Direction::Out, Channel::Api, payload.len());
    }
    Some(reply)
}

/// The frame a node announces for a replica it restored parked from its data directory
/// (`digest`, of `kind` with `params_digest`, replicating as `identity` under `cfg`): not
/// ready (a peer whose digest differs pushes its state at once, as to any replica catching
/// up), nothing numbered sent yet (a restart numbers from 1 again), the next within
/// [`parked_spacing`] intervals.
pub(crate) fn restored_announcement(
    cfg: &ReplicaConfig,
    (kind, params_digest): (crate::wire::FilterKind, u64),
    identity: Identity,
    digest: u64,
) -> Box<[u8]> {
    let body = Body::Digest {
        digest,
        ready: false,
        sent: Some(0),
        spacing: parked_spacing(cfg),
    };
    let env = Envelope::new(
        cfg.name.clone(),
        kind,
        params_digest,
        identity.uuid,
        identity.replica,
        0,
        body,
    )
    .with_generation(cfg.generation);
    let expect = crate::wire::Expect {
        filter: cfg.name.clone(),
        kind,
        params_digest,
        generation: cfg.generation,
        max_bytes: cfg.max_message_bytes,
    };
    crate::wire::WireCodec::new(expect, cfg.auth_keys.clone())
        .encode(&env)
        .into_boxed_slice()
}

/// Where a parking replica's state goes. The actor calls it with a function that closes the
/// replica and gives its [`Parked`] (or `None`, leaving it running, if a message came in
/// meanwhile); the node calls that only if the replica is still the one it hosts under its
/// name and was not looked up since the node asked it to park (under its lock: no request
/// or message finds the replica closing, and one handed to it before is seen), and answers
/// whether it parked.
pub(crate) type ParkInto = Box<dyn FnOnce(&mut dyn FnMut() -> Option<Parked>) -> bool + Send>;

/// Asks the replica to park if it is idle; answers whether it parked.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct Park(pub ParkInto);

impl Replica {
    /// Whether the replica may park now but for its snapshot (see the module documentation
    /// and [`crate::replica::core::ReplicaCore::is_idle`]): idle, and alone or with every
    /// live peer on our digest.
    fn idle(&mut self) -> bool {
        let asked = |flag: &std::sync::atomic::AtomicBool| flag.load(Ordering::Acquire);
        let s = &self.shared;
        let in_flight = InFlight {
            closed: asked(&s.closed),
            asked: asked(&s.flush_scheduled)
                || asked(&s.commit_requested)
                || asked(&s.logged_commit_requested),
            publishing: asked(&s.publishing) || !self.chans.outbound_rx.is_empty(),
            pushes: s.pushes_out.load(Ordering::Acquire) > 0
                || !self.pacings.is_empty()
                || self.timers.armed(crate::replica::core::Timer::Push),
            inbound: !self.chans.inbound_tx.is_empty(),
        };
        let live = self.core.anti_entropy.live_peers(Instant::now());
        // Cheap terms first: the digest (a pass over the state) only for a replica idle but
        // for its peers.
        self.core.is_idle(self.outside(), in_flight)
            && (live == 0 || self.converged_peers() == live)
    }

    /// The frame announcing `digest` for the node to publish while the replica is parked:
    /// ready, every numbered message sent, the next within the quietest spacing (at which
    /// the node announces it).
    fn parked_announcement(&self, digest: u64) -> Box<[u8]> {
        let body = Body::Digest {
            digest,
            ready: true,
            sent: Some(self.core.seq),
            spacing: parked_spacing(&self.cfg),
        };
        let env = Envelope::new(
            self.cfg.name.clone(),
            self.io.expect.kind,
            self.io.expect.params_digest,
            self.uuid(),
            self.id(),
            0,
            body,
        )
        .with_generation(self.cfg.generation);
        self.io.codec.encode(&env).into_boxed_slice()
    }

    /// A resumed replica numbers its messages on from where it parked.
    pub(crate) fn resumed_at(&mut self, seq: u64) {
        self.core.seq = seq;
    }

    /// Closes the replica for good (as a shutdown does, with nothing left to flush or save)
    /// and gives what resumes it; `None` (still running) if a message came in since it was
    /// found idle: it is handled, not left in the closing actor's buffer.
    fn close_for_parking(
        &mut self,
        ctx: &mut Context<Self>,
        (digest, announce): (u64, Option<Box<[u8]>>),
    ) -> Option<Parked> {
        if !self.chans.inbound_tx.is_empty() {
            return None;
        }
        self.close_to_updates();
        self.core.pipeline.stopping();
        let durable = self
            .core
            .snapshots
            .data()
            .is_some()
            .then_some(self.core.pipeline.next_batch());
        self.answer_stopped(durable);
        self.core.parked = true;
        ctx.stop();
        // The writer closes its log (if it wrote one); a resumed one starts a segment after.
        let wal_next = self.io.wal.take().map(|w| w.next_segment());
        let filter = self.read().clone();
        crate::replica::crash::point(crate::replica::crash::PARK_STATE_TAKEN);
        Some(Parked {
            filter,
            identity: self.shared.identity,
            telemetry: self.telemetry.clone(),
            wal_next,
            reserved: self.core.reserved,
            seq: self.core.seq,
            digest,
            announce,
            unconfirmed: AtomicBool::new(false),
            restored: false,
            limits: self.shared.limits,
        })
    }
}

impl Handler<Park> for Replica {
    type Result = bool;

    fn handle(&mut self, Park(into): Park, ctx: &mut Context<Self>) -> bool {
        if !self.idle() {
            return false;
        }
        if !self.core.snapshots.settled() {
            // Idle but for changes not saved yet (the periodic snapshot is not due): saved
            // now, so that the next ask finds the replica settled.
            if !self.core.snapshots.writing() {
                crate::replica::crash::point(crate::replica::crash::PARK_BEFORE_SNAPSHOT);
                self.snapshot_async(ctx);
            }
            return false;
        }
        // Computed before the node's lock is taken (the digest may be a pass over the state).
        let digest = self.my_digest();
        // Any peer known (live or not: one cut off for a while comes back) is told of it.
        let announce = (self.core.anti_entropy.peers().next().is_some())
            .then(|| self.parked_announcement(digest));
        let mut kept = Some((digest, announce));
        into(&mut || {
            let kept = kept.take()?;
            self.close_for_parking(ctx, kept)
        })
    }
}
