//! Publishing and sequencing: envelopes numbered in order; the commit pipeline carried out
//! (local updates gathered into a delta, appended to the write-ahead log with group commit,
//! published, and the updates answered at their acknowledgement level, as
//! [`crate::replica::core::CommitPipeline`] decides); digests; and full-state pushes (when
//! [`crate::replica::core::Pushes`] says)
//! encoded off the actor's thread and framed chunk by chunk by the publisher.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::prelude::*;
use bytes::Bytes;

use super::pump::Outbound;
use super::push::{Pacing, PushSource, StatePush};
use super::reply::Responder;
use super::{Replica, ReplicaError, digest_of};
use crate::replica::ack::Resolved;
use crate::replica::core::{ENVELOPE_OVERHEAD, Event, HeldDelta, chunk_len};
use crate::replica::metrics::{Channel, Direction};
use crate::wire::{Body, Envelope, FilterKind, MAX_DELTAS_PER_MESSAGE};

impl Replica {
    /// The next envelope in this replica's sequence.
    pub(super) fn envelope(&mut self, body: Body) -> Envelope {
        let seq = self.core.next_seq();
        self.numbered_envelope(seq, body)
    }

    /// An envelope of this replica numbered `seq` (0: outside the sequence).
    fn numbered_envelope(&self, seq: u64, body: Body) -> Envelope {
        Envelope::new(
            self.cfg.name.clone(),
            self.io.expect.kind,
            self.io.expect.params_digest,
            self.uuid(),
            self.id(),
            seq,
            body,
        )
        .with_generation(self.cfg.generation)
    }

    /// Queues a frame for the publisher task (which publishes in order).
    fn send(&mut self, subject: String, frame: Vec<u8>, channel: Channel) {
        self.telemetry.traffic(Direction::Out, channel, frame.len());
        self.enqueue(Outbound::Publish(
            Box::new((subject, frame.into())),
            channel,
        ));
    }

    /// Hands a message to the publisher task, starting one if none runs; a full queue drops
    /// it and counts. Whether it was queued.
    pub(super) fn enqueue(&self, o: Outbound) -> bool {
        match self.chans.outbound.try_send(o) {
            Ok(()) => {
                // Not among the tasks aborted at stop: it sends what was queued (the final
                // flush of a shutdown included), then ends.
                if !self.shared.publishing.swap(true, Ordering::AcqRel) {
                    actix::spawn(super::pump::publish(
                        self.chans.outbound_rx.clone(),
                        self.io.transport.clone(),
                        self.io.replication_transport.clone(),
                        self.shared.clone(),
                        self.io.limiter.clone(),
                    ));
                }
                true
            }
            Err(flume::TrySendError::Full(o)) => {
                self.telemetry.outbound_dropped(o.channel_label());
                false
            }
            Err(flume::TrySendError::Disconnected(_)) => false,
        }
    }

    fn publish_state_body(&mut self, body: Body) {
        let env = self.envelope(body);
        let frame = self.io.codec.encode(&env);
        let subject = self.io.subjects.state.clone();
        self.send(subject, frame, Channel::State);
    }

    /// Schedules a flush of the pending delta, unless one is (when: the core's).
    pub(super) fn schedule_flush(&mut self, ctx: &mut Context<Self>) {
        self.step(Event::FlushWanted, ctx);
    }

    /// Commits the local updates since the last commit: appends their delta to the log (with
    /// a data directory) and publishes it once durable, answering the updates that waited for
    /// it. One commit at a time: updates arriving meanwhile go into the next (group commit).
    /// The core decides each step ([`Event::Flush`]).
    pub(super) fn flush_delta(&mut self, ctx: &mut Context<Self>) {
        self.absorb_direct_changes();
        self.step(Event::Flush, ctx);
    }

    /// Commit `batch`'s append (or sync) is under way: [`Committed`] once done.
    pub(super) fn await_commit(
        &mut self,
        batch: u64,
        delta: Option<Vec<u8>>,
        done: crate::replica::wal::Pending<()>,
        ctx: &mut Context<Self>,
    ) {
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

    /// Publishes the delta of commit `batch` (durable by now, if there is a log).
    pub(super) fn publish_delta(&mut self, batch: u64, delta: Vec<u8>, ctx: &mut Context<Self>) {
        let confirm = self.core.pipeline.acks.wants_confirmation(batch);
        let body = if confirm {
            Body::ConfirmedDelta(delta)
        } else {
            Body::Delta(delta)
        };
        let env = self.envelope(body);
        let frame = self.io.codec.encode(&env);
        let seq = self.core.seq;
        if frame.len() > self.io.transport.max_payload() {
            // Too big for one message: the full state (chunked) carries it instead; updates
            // waiting for peers time out, as their peers never see this delta.
            tracing::debug!(
                bytes = frame.len(),
                "delta over max_payload, pushing the state"
            );
            self.step(Event::PushWanted, ctx);
        } else {
            self.telemetry.delta_sent();
            let subject = self.io.subjects.delta.clone();
            self.send(subject, frame, Channel::Delta);
        }
        self.step(Event::Published { batch, seq }, ctx);
    }

    /// Publishes written commits' deltas, oldest first: one alone as itself, several in one
    /// message (each then merged in turn by its receivers), or one by one if together they
    /// exceed the server's `max_payload`.
    pub(super) fn publish_held(&mut self, mut held: Vec<HeldDelta>, ctx: &mut Context<Self>) {
        let last = held.last().map_or(0, |h| h.batch);
        // The one peers confirm travels alone, after the others.
        let alone = if held.len() > 1 && self.core.pipeline.acks.wants_confirmation(last) {
            held.pop()
        } else {
            None
        };
        let mut rest = held.into_iter().peekable();
        while rest.peek().is_some() {
            let run: Vec<HeldDelta> = rest.by_ref().take(MAX_DELTAS_PER_MESSAGE).collect();
            if run.len() > 1 {
                self.publish_run(run, ctx);
            } else {
                for h in run {
                    self.publish_delta(h.batch, h.delta, ctx);
                }
            }
        }
        if let Some(h) = alone {
            self.publish_delta(h.batch, h.delta, ctx);
        }
    }

    /// Several written commits' deltas in one message (see [`Replica::publish_held`]).
    fn publish_run(&mut self, held: Vec<HeldDelta>, ctx: &mut Context<Self>) {
        // Each delta adds at most 9 bytes of CBOR framing to the envelope.
        let bytes: usize = held.iter().map(|h| h.delta.len() + 9).sum();
        if bytes + ENVELOPE_OVERHEAD > self.io.transport.max_payload() {
            for h in held {
                self.publish_delta(h.batch, h.delta, ctx);
            }
            return;
        }
        let last = held.last().map_or(0, |h| h.batch);
        debug_assert!(!self.core.pipeline.acks.wants_confirmation(last));
        let deltas = held
            .into_iter()
            .map(|h| serde_bytes::ByteBuf::from(h.delta))
            .collect();
        let env = self.envelope(Body::Deltas(deltas));
        let frame = self.io.codec.encode(&env);
        let seq = self.core.seq;
        self.telemetry.delta_sent();
        let subject = self.io.subjects.delta.clone();
        self.send(subject, frame, Channel::Delta);
        self.step(Event::PublishedRun { last, seq }, ctx);
    }

    /// A commit within a millisecond (unless one is scheduled), for `logged` updates.
    pub(super) fn commit_within_a_millisecond(&mut self, ctx: &mut Context<Self>) {
        self.step(Event::LoggedCommitWanted, ctx);
    }

    /// Makes sure a commit comes soon for updates that wait for one.
    pub(super) fn schedule_commit(&mut self, ctx: &mut Context<Self>) {
        self.step(Event::CommitWanted, ctx);
    }

    /// Answers updates whose acknowledgement level was reached, or failed.
    pub(super) fn answer(&mut self, r: Resolved<Responder>) {
        for responder in r.ok {
            self.respond(responder, Ok(()));
        }
        for (responder, failure) in r.failed {
            let e = ReplicaError::from_ack(failure, self.cfg.replicated_timeout_ms);
            self.respond(responder, Err(e));
        }
    }

    pub(super) fn respond(&mut self, responder: Responder, result: Result<(), ReplicaError>) {
        match responder {
            Responder::Api { reply, response } => self.send_reply(reply, result.map(|()| response)),
            Responder::Handle { tx, dot } => {
                let _ = tx.send(result.map(|()| dot));
            }
        }
    }

    // ---- anti-entropy messages -----------------------------------------------------------

    /// Announces our digest (and readiness); returns the anti-entropy intervals until the next one (more
    /// than 1 while the cluster is quiet, see [`crate::replica::ticks::quiet_digest_factor`]),
    /// which the digest tells its receivers.
    pub(super) fn send_digest(&mut self) -> u32 {
        // Alone, nobody compares our digest: announce the last one computed instead of
        // passing over the whole state again where the kind's digest is such a pass (0.14 s
        // of this thread for an `or_cuckoo` of 8.6M entries, every interval). A replica that
        // appears announces its own, and comparing with it computes ours afresh.
        self.absorb_direct_changes();
        let live = self.core.anti_entropy.live_peers(Instant::now());
        let digest = self
            .core
            .digests
            .announced(live, || digest_of(&self.shared, &self.telemetry));
        // The gauge needs our digest, which encodes the whole state: computed here, where the
        // anti-entropy round computes it anyway, not at every metrics interval.
        let converged = self.converged_peers();
        self.telemetry.converged.set(converged as f64);
        let ready = self.core.anti_entropy.is_ready();
        let factor = self.core.schedule.announce(live, ready, converged);
        let spacing = (factor > 1).then_some(factor);
        match &self.io.digest_batches {
            Some(batches) => {
                // Outside the sequence: a batch goes another way than the numbered messages.
                // It claims the numbers sent so far, for its receivers to check at the next
                // one, unless some still wait in the publisher's queue or in a full-state
                // push (one of hundreds of megabytes, or paced by its receivers, may take
                // longer than an interval: its numbers would look lost, and be pushed again).
                let queued = !self.chans.outbound.is_empty();
                let pushing = self.shared.pushes_out.load(Ordering::Acquire) > 0;
                let sent = (!queued && !pushing).then_some(self.core.seq);
                let body = Body::Digest {
                    digest,
                    ready,
                    sent,
                    spacing,
                };
                let frame = self.io.codec.encode(&self.numbered_envelope(0, body));
                self.telemetry
                    .traffic(Direction::Out, Channel::State, frame.len());
                batches.push(&self.cfg.name, frame);
            }
            None => self.publish_state_body(Body::Digest {
                digest,
                ready,
                sent: None,
                spacing,
            }),
        }
        factor
    }

    /// Acknowledges a confirmed delta of `target` numbered `seq`.
    pub(super) fn send_ack(&mut self, target: uuid::Uuid, seq: u64) {
        self.publish_state_body(Body::Ack { target, seq });
    }

    pub(super) fn request_state(&mut self, target: Option<uuid::Uuid>) {
        self.publish_state_body(Body::StateRequest { target });
    }

    /// Encodes the full state (off the actor's thread) and publishes it in chunks; a state
    /// of several chunks of a kind merged piece by piece is read live instead, a chunk at a
    /// time as it goes out ([`PushSource::Live`]). The core started it as `transfer`.
    pub(super) fn push_state(&mut self, transfer: u64, ctx: &mut Context<Self>) {
        let chunk_len = chunk_len(self.cfg.chunk_bytes, self.io.transport.max_payload());
        let live_len = self.read().encoded_state_len();
        if let Some(total_len) = live_len.filter(|&len| len > chunk_len as u64) {
            self.core.pushes.encoded();
            let pacing = Arc::new(Pacing::new(transfer));
            // Those of pushes still queued or going out (their push holds them) stay.
            self.pacings.retain(|p| Arc::strong_count(p) > 1);
            self.pacings.push(pacing.clone());
            let source = PushSource::Live {
                shared: self.shared.clone(),
                total_len,
                pacing,
            };
            return self.queue_push(source, transfer, chunk_len);
        }
        let (shared, addr) = (self.shared.clone(), ctx.address());
        // Room for the state as large as it was last time, so that its buffer is not regrown.
        let last = self.telemetry.last_state_bytes() as usize;
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
}

/// A full state encoded for a push.
#[derive(Message)]
#[rtype(result = "()")]
struct Encoded {
    /// The encoded state and its xxh3-64; `None` if encoding failed.
    state: Option<(Bytes, u64)>,
    transfer: u64,
    chunk_len: usize,
}

impl Handler<Encoded> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Encoded, _: &mut Context<Self>) {
        self.core.pushes.encoded();
        let Some((state, checksum)) = msg.state else {
            return;
        };
        let source = PushSource::Encoded { state, checksum };
        self.queue_push(source, msg.transfer, msg.chunk_len);
    }
}

impl Replica {
    /// Queues a push for the publisher task, its chunks' sequence numbers reserved.
    fn queue_push(&mut self, source: PushSource, transfer: u64, chunk_len: usize) {
        let template = self.envelope(Body::Delta(Vec::new()));
        let push = StatePush {
            subject: self.io.subjects.state.clone(),
            source,
            transfer,
            chunk_len,
            first_seq: template.seq,
            codec: self.io.codec.clone(),
            template,
        };
        self.telemetry.state_pushed(push.len() as usize);
        // `envelope` took the first number; the rest are reserved here.
        self.core.seq += push.count() as u64 - 1;
        self.shared.pushes_out.fetch_add(1, Ordering::AcqRel);
        if !self.enqueue(Outbound::State(Box::new(push))) {
            self.shared.pushes_out.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A receiver of our live push `transfer` merged its chunks before `next`.
    pub(super) fn on_progress(&mut self, receiver: uuid::Uuid, transfer: u64, next: u32) {
        if let Some(pacing) = self.pacings.iter().find(|p| p.transfer == transfer) {
            pacing.report(receiver, next, Instant::now());
        }
    }

    /// Tells `target` that we merged its live transfer's chunks before `next`. Unsequenced
    /// and published at once rather than queued: our own publisher may be busy with a push
    /// of ours paced by `target`, whose reports are queued behind its own push in turn (peers
    /// answering a joiner together), and neither push could go on.
    pub(super) fn report_progress(&mut self, target: uuid::Uuid, transfer: u64, next: u32) {
        let body = Body::StateProgress {
            target,
            transfer,
            next,
        };
        let env = self.numbered_envelope(0, body);
        let frame = self.io.codec.encode(&env);
        self.telemetry
            .traffic(Direction::Out, Channel::State, frame.len());
        let (transport, subject) = (
            self.io.replication_transport.clone(),
            self.io.subjects.state.clone(),
        );
        let shared = self.shared.clone();
        actix::spawn(async move {
            if transport.publish(subject, frame.into()).await.is_err() {
                shared.telemetry.publish_error(Channel::State);
            }
        });
    }
}

/// A commit's log append finished.
#[derive(Message)]
#[rtype(result = "()")]
struct Committed {
    batch: u64,
    /// `None`: a sync for a commit without a delta.
    delta: Option<Vec<u8>>,
    result: Result<(), String>,
}

impl Handler<Committed> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Committed, ctx: &mut Context<Self>) {
        self.written(msg.batch, msg.delta, msg.result, ctx);
    }
}
