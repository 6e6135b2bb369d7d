//! The shell's half of [`ReplicaCore::step`](crate::replica::core::ReplicaCore::step): an
//! event in, the core's effects carried out, in order. Each effect is one call into the
//! shell's I/O (publish, the log's writer, the filter's lock, a timer, telemetry); what to
//! do was decided by the core.

use std::sync::atomic::Ordering;
use std::time::Instant;

use actix::prelude::*;

use super::Replica;
use super::reply::Responder;
use crate::replica::TakenDelta;
use crate::replica::anti_entropy::Action;
use crate::replica::core::{Effect, Effects, Event, ReplicaCore, Timer};
use crate::replica::metrics as m;

impl Replica {
    /// Steps the core with `event` now and carries out what it says.
    pub(super) fn step(&mut self, event: Event, ctx: &mut Context<Self>) {
        self.stepping(ctx, |core, now, out| core.step(event, now, out));
    }

    /// Carries out what the anti-entropy state machine decided (through the core).
    pub(super) fn carry_out(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        self.stepping(ctx, |core, now, out| core.actions(actions, now, out));
    }

    /// Runs `f` on the core with a buffer for its effects (one kept from an earlier step:
    /// none allocated once they have grown; an effect that steps again takes another),
    /// then carries the effects out.
    fn stepping(
        &mut self,
        ctx: &mut Context<Self>,
        f: impl FnOnce(&mut ReplicaCore<Responder>, Instant, &mut Effects<Responder>),
    ) {
        let mut out = self.spare_effects.pop().unwrap_or_default();
        f(&mut self.core, Instant::now(), &mut out);
        for effect in out.drain() {
            self.effect(effect, ctx);
        }
        self.spare_effects.push(out);
    }

    fn effect(&mut self, effect: Effect<Responder>, ctx: &mut Context<Self>) {
        match effect {
            Effect::RequestState(target) => self.request_state(target),
            Effect::SendDigest { periodic } => {
                let spacing = self.send_digest();
                if periodic {
                    self.step(Event::DigestSent { spacing }, ctx);
                }
            }
            Effect::Push { transfer } => self.push_state(transfer, ctx),
            Effect::StartApi(why) => self.start_api(ctx, why.to_string()),
            Effect::Ready(why) => self.publish_ready(why),
            Effect::CountGaps(n) => self.telemetry.sequence_gaps(n),
            Effect::Forgot(uuid) => {
                tracing::debug!(filter = %self.cfg.name, %uuid, "peer forgotten");
            }
            Effect::Reject(e) => self.reject(&e),
            Effect::MergeDelta { sender, bytes, ack } => {
                if self.merge_delta_checked(&bytes, true, ack.map(|seq| (sender, seq)), ctx) {
                    if let Some(seq) = ack {
                        self.send_ack(sender, seq);
                    }
                    self.delta_clock(sender, &bytes);
                }
            }
            Effect::MergeState {
                sender,
                replica,
                state,
            } => self.decode_and_merge(sender, replica, state, ctx),
            Effect::MergePiece {
                sender,
                offset,
                data,
                total_len,
                last,
                report,
            } => {
                if self.merge_piece(sender, (offset, &data, total_len), last, ctx)
                    && let Some((transfer, next)) = report
                {
                    self.report_progress(sender, transfer, next);
                }
            }
            Effect::AfterMerges => self.step(Event::FrameDone, ctx),
            Effect::TransferRejected(e) => {
                self.telemetry
                    .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                    .increment(1);
                self.reject(&e);
            }
            Effect::Progress {
                receiver,
                transfer,
                next,
            } => self.on_progress(receiver, transfer, next),
            Effect::Answer(r) => self.answer(r),
            Effect::SetTimer(timer, delay) => self.timers.arm(timer, delay, ctx),
            Effect::RearmPeriodic => {
                // Not from within the timer's own run (it arms the next itself): there is
                // no armed timer then.
                if self.timers.cancel(Timer::Periodic, ctx) {
                    self.schedule_periodic(ctx);
                }
            }
            Effect::ArmPeriodic => self.schedule_periodic(ctx),
            Effect::Housekeeping => self.housekeeping(ctx),
            Effect::PeerGauges { live } => {
                let now = Instant::now();
                for (_, p) in self.core.anti_entropy.peers() {
                    self.telemetry
                        .gauge(m::PEER_STALENESS, &[("peer", &p.replica.to_string())])
                        .set(now.saturating_duration_since(p.last_seen).as_secs_f64());
                }
                self.telemetry.peers.set(live as f64);
            }
            Effect::TransfersExpired(n) => {
                self.telemetry
                    .counter(m::STATE_TRANSFERS, &[("outcome", "expired")])
                    .increment(n as u64);
            }
            Effect::Snapshot => self.snapshot_async(ctx),
            Effect::Flush { scheduled } => {
                if scheduled {
                    self.shared.flush_scheduled.store(false, Ordering::Release);
                }
                self.flush_delta(ctx);
            }
            Effect::TakeDelta { batch, encode } => {
                // Taken under the lock, encoded after it is released. Under the lock too,
                // the next commit's number moves on: an update applied outside the actor
                // before this take is in this commit, one applied after it in the next.
                let taken = {
                    let mut f = self.write();
                    self.shared.open_batch.store(batch + 1, Ordering::Release);
                    f.take_delta_unencoded()
                };
                let delta = taken.filter(|_| encode).map(TakenDelta::encode);
                let sync_through = self.shared.sync_through.load(Ordering::Acquire);
                let taken = Event::DeltaTaken {
                    batch,
                    delta,
                    sync_through,
                };
                self.step(taken, ctx);
            }
            Effect::Append { batch, delta, sync } => match &self.io.wal {
                Some(wal) => {
                    let done = match sync {
                        true => wal.append(delta.clone()),
                        false => wal.append_logged(delta.clone()),
                    };
                    self.await_commit(batch, Some(delta), done, ctx);
                }
                // The core asks only with a log; without one, the append is as done.
                None => self.written(batch, Some(delta), Ok(()), ctx),
            },
            Effect::Sync { batch } => match &self.io.wal {
                Some(wal) => {
                    let done = wal.sync();
                    self.await_commit(batch, None, done, ctx);
                }
                None => self.written(batch, None, Ok(()), ctx),
            },
            Effect::CommitDone { batch, error } => {
                self.shared.commits.done(batch, error.as_deref())
            }
            Effect::PublishDelta { batch, delta } => self.publish_delta(batch, delta, ctx),
            Effect::PublishHeld(held) => self.publish_held(held, ctx),
            Effect::ExpireAfter(timeout) => {
                ctx.run_later(timeout, |act, ctx| act.step(Event::ConfirmationsDue, ctx));
            }
            Effect::WalFailed(e) => self.wal_failed(&e),
            Effect::RecoverWal => self.recover_wal(ctx),
            Effect::LookForHeld => self.look_for_held(ctx),
            Effect::LookForAlone { since } => self.look_for_alone(since, ctx),
            Effect::Renew { want } => self.renew_claim(want, ctx),
            Effect::TakeBack { want } => self.take_back_id(want, ctx),
            Effect::Retire(entry) => self.retire(entry, ctx),
            news @ (Effect::WantReservation { .. }
            | Effect::IdLost
            | Effect::IdTakenBack { .. }
            | Effect::IdHeldByOther
            | Effect::LeaseFailed { .. }
            | Effect::IdCounts { .. }) => self.lease_news(news),
        }
    }

    /// A commit's append or sync finished.
    pub(super) fn written(
        &mut self,
        batch: u64,
        delta: Option<Vec<u8>>,
        result: Result<(), String>,
        ctx: &mut Context<Self>,
    ) {
        let written = Event::Written {
            batch,
            delta,
            result,
        };
        self.step(written, ctx);
    }
}
