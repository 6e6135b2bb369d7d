//! The receiving side of replication: a peer's frame through the anti-entropy state machine
//! (what it decides, [`Replica::carry_out`]) and the schedule, then merged into the filter (a
//! delta, a state whole or piece by piece, decoded off the actor's thread when large), with
//! its checks (kind, parameters, tags within the registry's reservations).

use std::time::Instant;

use actix::prelude::*;
use uuid::Uuid;

use super::Replica;
use crate::ReplicaId;
use crate::replica::anti_entropy::{Action, PeerTableFull};
use crate::replica::core::HeldFrame;
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::{self as m, Direction, MergeSource};
use crate::replica::reassembly::Progress;
use crate::transport::Channel;
use crate::wire::{Body, Envelope, StateChunk, WireError};

/// States at least this large are decoded off the actor's thread.
const BLOCKING_THRESHOLD: usize = 256 << 10;

impl Replica {
    pub(super) fn on_replication(
        &mut self,
        env: Envelope,
        frame_len: usize,
        ctx: &mut Context<Self>,
    ) {
        let channel = if env.body.is_delta() {
            Channel::Delta
        } else {
            Channel::State
        };
        self.telemetry.traffic(Direction::In, channel, frame_len);
        let now = Instant::now();
        let known = self.core.anti_entropy.knows(&env.sender);
        let rearm = self.core.schedule.heard(now, known);
        self.rearm_periodic(rearm, ctx);
        if let Body::StateProgress {
            target,
            transfer,
            next,
        } = env.body
        {
            // Unsequenced (it overtakes what its sender queued), so it moves no sequence
            // count; only a peer already heard from paces a push.
            if target == self.uuid() && self.core.anti_entropy.knows(&env.sender) {
                self.on_progress(env.sender, transfer, next);
            }
            return;
        }
        match self
            .core
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
                    let r = self.core.pipeline.acks.acked(env.sender, seq);
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
                    let actions = self.core.anti_entropy.claimed(env.sender, sent, now);
                    self.carry_out(actions, ctx);
                }
                let mine = self.my_digest();
                let actions = self.core.anti_entropy.digest(
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
        if self.core.schedule.changed_since_digest() {
            self.quiet_ended(ctx);
        }
    }

    /// Carries out what the anti-entropy state machine decided.
    pub(super) fn carry_out(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::RequestState(target) => self.request_state(target),
                Action::PushState => self.schedule_push(ctx),
                Action::BecomeReady(why) => self.become_ready(ctx, why),
                Action::CountGaps(n) => self.telemetry.sequence_gaps(n),
                Action::Forget(uuid) => {
                    tracing::debug!(filter = %self.cfg.name, %uuid, "peer forgotten");
                    if let Some(transfers) = &mut self.core.transfers {
                        transfers.forget(&uuid);
                    }
                }
            }
        }
    }

    pub(super) fn record_merge(&self, source: MergeSource, t: Instant, ok: bool) {
        self.telemetry.merge(source, ok, t.elapsed().as_secs_f64());
    }

    fn on_chunk(
        &mut self,
        sender: Uuid,
        replica: ReplicaId,
        chunk: StateChunk,
        ctx: &mut Context<Self>,
    ) {
        let state = match self.core.transfers_mut().add(sender, chunk) {
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
        let kind = self.io.expect.kind;
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
            if let Some(transfers) = &mut self.core.transfers {
                transfers.forget_transfer(&sender);
            }
            self.telemetry
                .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                .increment(1);
            self.reject(&WireError::Incompatible(e.to_string()));
            return false;
        }
        self.core.changed();
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
        let actions = self.core.anti_entropy.state_merged();
        self.carry_out(actions, ctx);
    }

    pub(super) fn merge_state(
        &mut self,
        result: Result<AnyFilter, WireError>,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
        ctx: &mut Context<Self>,
    ) {
        let other = match result {
            Ok(o) if o.params_digest() == self.io.expect.params_digest => o,
            Ok(o) => {
                return self.reject(&WireError::Params {
                    got: o.params_digest(),
                    expected: self.io.expect.params_digest,
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
    pub(super) fn merge_state_checked(
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
                    .map_err(crate::replica::filter::remote_error),
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
                self.core.changed();
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
