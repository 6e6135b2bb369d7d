//! The core's one entry: [`ReplicaCore::step`] takes an [`Event`] (a peer's frame, decoded
//! and checked by the codec; a timer's firing, by name; a commit written; a connection
//! event; the shell's wish for a flush or a push) at `now`, and appends to [`Effects`] what
//! the shell carries out, in order (publish, reply, log append or sync, snapshot, merge,
//! set a named timer, ready, ...). The shell builds the event, steps, and runs the effects;
//! a unit test steps a fake clock through the same calls and looks at the effects.
//!
//! Why effects are a list the caller passes in, not a return value: the shell keeps its
//! buffers and reuses them (a commit or a peer's frame allocates none once they have
//! grown), and an effect the shell carries out may step the core again (a flush takes the
//! delta, then tells the core what it took) with a buffer of its own.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{HeldDelta, PushPlan, Ready, Rearm, Release, ReplicaCore};
use crate::ReplicaId;
use crate::replica::ack::{Resolved, known_replicas, peers_needed};
use crate::replica::anti_entropy::{Action, PeerTableFull};
use crate::replica::reassembly::Progress;
use crate::transport::registry::TakeBack;
use crate::transport::{ClaimEntry, Renewal, TransportError, TransportEvent};
use crate::wire::{Body, Envelope, WireError};

/// A timer of the replica's, by what it is for. At most one is armed under a name; its
/// firing is stepped as [`Event::Timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The digest and the housekeeping ([`super::Schedule`]).
    Periodic,
    /// The flush of the pending delta.
    Flush,
    /// A commit within a millisecond.
    Commit,
    /// The publication of written commits' held deltas.
    Publish,
    /// A full-state push put off by `min_push_interval`.
    Push,
    /// A look at the registry for held frames, over its budget.
    RegistryLook,
    /// An attempt at replacing a failed log writer.
    WalRecovery,
}

/// What happens to a replica.
pub(crate) enum Event {
    /// A peer's frame, decoded and checked (kind, parameters, signature). `mine` is this
    /// replica's digest when the frame is a digest (the shell computes it: the core never
    /// reads the state).
    Frame { env: Envelope, mine: Option<u64> },
    /// The merges a frame asked for were carried out ([`Effect::AfterMerges`]).
    FrameDone,
    /// The connection's news.
    Transport(TransportEvent),
    /// A timer fired.
    Timer(Timer),
    /// The periodic digest went out, announcing `spacing` intervals to the next.
    DigestSent { spacing: u32 },
    /// The state changed (the pending delta grew, or a change was made outside the actor):
    /// a flush is wanted.
    FlushWanted,
    /// Updates wait for a commit (through the actor): soon.
    CommitWanted,
    /// `logged` updates wait for a commit within a millisecond.
    LoggedCommitWanted,
    /// A commit starts now.
    Flush,
    /// Commit `batch`'s delta was taken from the filter (`None`: nothing changed since the
    /// last); `sync_through` is the newest commit an update applied outside the actor waits
    /// on the disk for.
    DeltaTaken {
        batch: u64,
        delta: Option<Vec<u8>>,
        sync_through: u64,
    },
    /// Commit `batch`'s append (with its `delta`) or sync (without) finished.
    Written {
        batch: u64,
        delta: Option<Vec<u8>>,
        result: Result<(), String>,
    },
    /// Commit `batch`'s delta went out numbered `seq` (or, over `max_payload`, did not:
    /// the push the core asked for carries it).
    Published { batch: u64, seq: u64 },
    /// Several commits' deltas, up to `last`, went out in one message numbered `seq`.
    PublishedRun { last: u64, seq: u64 },
    /// The wait of the updates for their peers' confirmations may have run out.
    ConfirmationsDue,
    /// A full-state push is wanted (a delta too large for a message, or the naive
    /// protocol's change).
    PushWanted,
    /// An attempt at replacing the failed log writer did not succeed.
    RecoveryFailed,
    /// The lease's renewal is due (`id_lease_renew_ms`), or tags were `issued` (renewed
    /// only once half its block is used); `clock` is the state's tag clock.
    Renew { clock: u64, issued: bool },
    /// The registry answered a renewal that asked for `want`: the replica's own
    /// (`periodic`) or an import's; `clock` as at the answer.
    Renewed {
        want: u64,
        renewal: Result<Renewal, TransportError>,
        periodic: bool,
        clock: u64,
    },
    /// The registry's claims, listed from `started` on, after a renewal.
    Listed {
        claims: Result<Vec<ClaimEntry>, TransportError>,
        started: Instant,
    },
    /// Taking the retired id back ended.
    TakenBack(Result<TakeBack, TransportError>),
    /// The look asked for by [`Effect::LookForAlone`] ended: it started at this instant
    /// (`None`: it failed, or none could be made).
    LookedForAlone(Option<Instant>),
}

/// What the shell carries out for the core, in order.
pub(crate) enum Effect<R> {
    /// Publish a state request, to one peer or to all.
    RequestState(Option<Uuid>),
    /// Announce the digest; `periodic`: then step [`Event::DigestSent`].
    SendDigest { periodic: bool },
    /// Push the full state now, as transfer `transfer`.
    Push { transfer: u64 },
    /// Caught up: subscribe the request API, then be ready.
    StartApi(&'static str),
    /// Caught up: ready now.
    Ready(&'static str),
    /// Count this many messages lost.
    CountGaps(u64),
    /// A peer was forgotten (what the core kept of it is dropped).
    Forgot(Uuid),
    /// Refuse the frame (counted, logged).
    Reject(WireError),
    /// Merge a peer's delta with its checks; `ack`: a confirmed delta of this number, to
    /// acknowledge once merged.
    MergeDelta {
        sender: Uuid,
        bytes: Vec<u8>,
        ack: Option<u64>,
    },
    /// A transfer completed: decode the state and merge it with its checks.
    MergeState {
        sender: Uuid,
        replica: ReplicaId,
        state: Vec<u8>,
    },
    /// Merge the next piece of a peer's state; `report`: the live transfer's progress to
    /// tell its sender once merged.
    MergePiece {
        sender: Uuid,
        offset: u64,
        data: Vec<u8>,
        total_len: u64,
        last: bool,
        report: Option<(u64, u32)>,
    },
    /// Step [`Event::FrameDone`] (the frame's merges above were carried out).
    AfterMerges,
    /// A transfer coming in was refused.
    TransferRejected(WireError),
    /// `receiver` merged our live push `transfer` before chunk `next`: pace it.
    Progress {
        receiver: Uuid,
        transfer: u64,
        next: u32,
    },
    /// Answer the updates whose level was reached, or failed.
    Answer(Resolved<R>),
    /// Arm the named timer (none is armed under its name).
    SetTimer(Timer, Duration),
    /// The periodic timer's deadline moved earlier: arm it anew if it is armed.
    RearmPeriodic,
    /// Arm the periodic timer for the schedule's next deadline.
    ArmPeriodic,
    /// The shell's part of the housekeeping: gauges, time passing for the state, a flush
    /// whose request found the inbound buffer full.
    Housekeeping,
    /// `live` peers are live: the peers' gauges.
    PeerGauges { live: usize },
    /// Partial transfers coming in timed out.
    TransfersExpired(usize),
    /// Write a snapshot in the background.
    Snapshot,
    /// Commit now; `scheduled`: the scheduled flush (which threads outside the actor know
    /// of) is the one going.
    Flush { scheduled: bool },
    /// Take commit `batch`'s delta from the filter (`encode` it: not for the naive
    /// protocol, which publishes none), and step [`Event::DeltaTaken`].
    TakeDelta { batch: u64, encode: bool },
    /// Append commit `batch`'s delta to the log, fsynced if `sync`; step
    /// [`Event::Written`] once done.
    Append {
        batch: u64,
        delta: Vec<u8>,
        sync: bool,
    },
    /// Sync the log for commit `batch`, which has no delta; step [`Event::Written`].
    Sync { batch: u64 },
    /// Commit `batch` is over (for those waiting on it outside the actor), or failed.
    CommitDone { batch: u64, error: Option<String> },
    /// Publish commit `batch`'s delta now (confirmed by peers if its updates wait for
    /// them), then step [`Event::Published`].
    PublishDelta { batch: u64, delta: Vec<u8> },
    /// Publish written commits' deltas, oldest first.
    PublishHeld(Vec<HeldDelta>),
    /// Step [`Event::ConfirmationsDue`] after this long (one per confirmed delta).
    ExpireAfter(Duration),
    /// The log failed: durable updates fail until it is replaced.
    WalFailed(String),
    /// Try replacing the failed log writer (step [`Event::RecoveryFailed`] if not yet).
    RecoverWal,
    /// Look at the registry for the frames held against it.
    LookForHeld,
    /// Look at the registry with a look that starts at or after `since` (the node's
    /// listing under its id, else a renewal of the replica's own claim), for `replicated`
    /// updates published while the last look found this replica alone; step
    /// [`Event::LookedForAlone`].
    LookForAlone { since: Instant },
    /// Renew the claim, asking for a reservation up to `want`, then list the registry's
    /// claims; step [`Event::Renewed`] and [`Event::Listed`].
    Renew { want: u64 },
    /// Take the retired id back, with a reservation up to `want`; step
    /// [`Event::TakenBack`].
    TakeBack { want: u64 },
    /// Under the node's id: tell the node the tags used up to `clock` (it renews).
    WantReservation { clock: u64 },
    /// The id was retired while the claim could not be renewed: no more tags.
    IdLost,
    /// The id is ours again, above `floor`.
    IdTakenBack { floor: u64 },
    /// The id was retired and another replica holds it now: no more tags, for good.
    IdHeldByOther,
    /// A call to the registry failed (retried later).
    LeaseFailed {
        what: &'static str,
        error: TransportError,
    },
    /// The registry's ids, held and retired.
    IdCounts { live: usize, retired: usize },
    /// Retire this id (its claim went unrenewed, its replica unheard).
    Retire(ClaimEntry),
}

/// The effects of one or more steps, in order. A buffer the caller keeps and reuses.
pub(crate) struct Effects<R>(Vec<Effect<R>>);

impl<R> Default for Effects<R> {
    fn default() -> Self {
        Effects(Vec::new())
    }
}

impl<R> Effects<R> {
    pub(crate) fn push(&mut self, e: Effect<R>) {
        self.0.push(e);
    }

    /// Takes the effects out, in order, leaving the buffer (and its room) for reuse.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, Effect<R>> {
        self.0.drain(..)
    }

    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &[Effect<R>] {
        &self.0
    }
}

impl<R> ReplicaCore<R> {
    /// What `event`, at `now`, makes the replica do: appended to `out`.
    pub(crate) fn step(&mut self, event: Event, now: Instant, out: &mut Effects<R>) {
        match event {
            Event::Frame { env, mine } => self.frame(env, mine, now, out),
            Event::FrameDone => {
                if self.schedule.changed_since_digest() {
                    rearm(self.schedule.quiet_ended(now), out);
                }
            }
            Event::Transport(ev) => match ev {
                TransportEvent::Connected => {
                    // Publishes made while disconnected may be lost: re-announce, ask for
                    // the peers' states and push ours. The digest at the interval from
                    // here: it may announce none of the spacing the timer's was armed for.
                    out.push(Effect::RequestState(None));
                    rearm(self.schedule.quiet_ended(now), out);
                    out.push(Effect::SendDigest { periodic: false });
                    self.push(now, out);
                }
                // Messages were dropped client-side: sequence gaps will name the peers, but
                // a broadcast request repairs the loss sooner.
                TransportEvent::SlowConsumer => out.push(Effect::RequestState(None)),
                TransportEvent::Disconnected | TransportEvent::Closed => {}
            },
            Event::Timer(timer) => self.timer(timer, now, out),
            Event::DigestSent { spacing } => {
                let live = self.anti_entropy.live_peers(now);
                self.schedule.digest_sent(now, spacing, live);
            }
            Event::FlushWanted => self.want_flush(now, out),
            Event::CommitWanted => match self.pipeline.logged() {
                // The log's own pace batches: commit now, or right after the one in flight.
                true => out.push(Effect::Flush { scheduled: false }),
                // No log to pace commits: gather what arrives within a millisecond.
                false => self.commit_soon(out),
            },
            Event::LoggedCommitWanted => self.commit_soon(out),
            Event::Flush => {
                if let Some(batch) = self.pipeline.begin(now) {
                    let encode = !self.traits.full_state_only;
                    out.push(Effect::TakeDelta { batch, encode });
                }
            }
            Event::DeltaTaken {
                batch,
                delta,
                sync_through,
            } => self.delta_taken(batch, delta, sync_through, now, out),
            Event::Written {
                batch,
                delta,
                result,
            } => self.written(batch, delta, result, now, out),
            Event::Published { batch, seq } => self.published(batch, seq, now, out),
            Event::PublishedRun { last, seq } => {
                // No update in these commits waits for peers (those go alone): what waited
                // for the disk was answered when they were written.
                let r = self.pipeline.acks.committed(last, Some(seq), 0, now);
                answer(r, out);
            }
            Event::ConfirmationsDue => answer(self.pipeline.acks.expire(now), out),
            Event::PushWanted => self.push(now, out),
            Event::RecoveryFailed => {
                let delay = self.pipeline.retry_delay();
                out.push(Effect::SetTimer(Timer::WalRecovery, delay));
            }
            Event::Renew { clock, issued } => self.renew(clock, issued, out),
            Event::Renewed {
                want,
                renewal,
                periodic,
                clock,
            } => self.renewed(want, renewal, periodic, clock, out),
            Event::Listed { claims, started } => self.listed(claims, started, now, out),
            Event::TakenBack(r) => self.taken_back(r, out),
            Event::LookedForAlone(started) => self.looked_for_alone(started, now, out),
        }
    }

    /// Carries anti-entropy's decisions into effects.
    pub(crate) fn actions(&mut self, actions: Vec<Action>, now: Instant, out: &mut Effects<R>) {
        for action in actions {
            match action {
                Action::RequestState(target) => out.push(Effect::RequestState(target)),
                Action::PushState => self.push(now, out),
                Action::BecomeReady(why) => out.push(match self.becoming_ready() {
                    Ready::StartApi => Effect::StartApi(why),
                    Ready::Now => Effect::Ready(why),
                }),
                Action::CountGaps(n) => out.push(Effect::CountGaps(n)),
                Action::Forget(uuid) => {
                    if let Some(transfers) = &mut self.transfers {
                        transfers.forget(&uuid);
                    }
                    out.push(Effect::Forgot(uuid));
                }
            }
        }
    }

    /// A peer's frame: the schedule hears it, anti-entropy takes its number, and its body
    /// decides the rest.
    fn frame(&mut self, env: Envelope, mine: Option<u64>, now: Instant, out: &mut Effects<R>) {
        let (sender, me) = (env.sender, self.traits.me);
        let known = self.anti_entropy.knows(&sender);
        rearm(self.schedule.heard(now, known), out);
        if let Body::StateProgress {
            target,
            transfer,
            next,
        } = env.body
        {
            // Unsequenced (it overtakes what its sender queued), so it moves no sequence
            // count; only a peer already heard from paces a push.
            if target == me && known {
                out.push(Effect::Progress {
                    receiver: sender,
                    transfer,
                    next,
                });
            }
            return;
        }
        match self.anti_entropy.heard(sender, env.replica, env.seq, now) {
            Ok(actions) => self.actions(actions, now, out),
            Err(PeerTableFull) => {
                out.push(Effect::Reject(WireError::TooManyPeers(
                    self.traits.max_peers,
                )));
                return;
            }
        }
        match env.body {
            Body::Delta(bytes) => out.push(Effect::MergeDelta {
                sender,
                bytes,
                ack: None,
            }),
            Body::Deltas(deltas) => {
                for bytes in deltas {
                    out.push(Effect::MergeDelta {
                        sender,
                        bytes: bytes.into_vec(),
                        ack: None,
                    });
                }
            }
            // A held delta is acknowledged once merged.
            Body::ConfirmedDelta(bytes) => out.push(Effect::MergeDelta {
                sender,
                bytes,
                ack: Some(env.seq),
            }),
            Body::Ack { target, seq } => {
                if target == me {
                    answer(self.pipeline.acks.acked(sender, seq), out);
                }
            }
            Body::Digest {
                digest,
                ready,
                sent,
                spacing,
            } => {
                if let Some(sent) = sent.filter(|_| env.seq == 0) {
                    let actions = self.anti_entropy.claimed(sender, sent, now);
                    self.actions(actions, now, out);
                }
                // The shell computes ours for every digest frame; without it (a test that
                // forgot), nothing compares equal.
                let mine = mine.unwrap_or(!digest);
                let actions = self
                    .anti_entropy
                    .digest(sender, digest, ready, spacing, mine, now);
                self.actions(actions, now, out);
                if digest != mine {
                    // Something to repair: no more spacing out.
                    rearm(self.schedule.quiet_ended(now), out);
                }
            }
            Body::StateRequest { target } => {
                // Someone catches up (a restart keeps its uuid): at the interval again.
                rearm(self.schedule.quiet_ended(now), out);
                if target.is_none_or(|t| t == me) {
                    self.push(now, out);
                }
            }
            Body::StateChunk(chunk) => match self.transfers_mut().add(sender, chunk) {
                Ok(Progress::Pending) => {}
                Ok(Progress::Complete(state)) => out.push(Effect::MergeState {
                    sender,
                    replica: env.replica,
                    state,
                }),
                Ok(Progress::Piece {
                    offset,
                    data,
                    total_len,
                    last,
                    report,
                }) => out.push(Effect::MergePiece {
                    sender,
                    offset,
                    data,
                    total_len,
                    last,
                    report,
                }),
                Err(e) => out.push(Effect::TransferRejected(e)),
            },
            // Taken above, before the sequence check.
            Body::StateProgress { .. } => {}
        }
        out.push(Effect::AfterMerges);
    }

    fn timer(&mut self, timer: Timer, now: Instant, out: &mut Effects<R>) {
        match timer {
            Timer::Periodic => {
                let fired = self.schedule.fired(now);
                if fired.digest {
                    out.push(Effect::SendDigest { periodic: true });
                }
                if fired.housekeeping {
                    self.housekeeping(now, out);
                }
                out.push(Effect::ArmPeriodic);
            }
            Timer::Flush => {
                self.pipeline.flush_timer_fired();
                out.push(Effect::Flush { scheduled: true });
            }
            Timer::Commit => {
                self.pipeline.commit_timer_fired();
                out.push(Effect::Flush { scheduled: false });
            }
            Timer::Publish => out.push(Effect::PublishHeld(self.pipeline.publish_timer_fired())),
            Timer::Push => match self.pushes.timer_fired() {
                true => self.start_push(now, out),
                // One is still being encoded: plan again.
                false => self.push(now, out),
            },
            Timer::RegistryLook => {
                self.registry_view
                    .get_or_insert_default()
                    .look_timer_fired();
                out.push(Effect::LookForHeld);
            }
            Timer::WalRecovery => out.push(Effect::RecoverWal),
        }
    }

    /// Gauges, time passing for anti-entropy (peer expiry, catch-up), partial transfers
    /// that timed out, and a snapshot if one is due (checked here rather than on a timer of
    /// its own: one wake-up per replica, not two).
    fn housekeeping(&mut self, now: Instant, out: &mut Effects<R>) {
        if self.snapshots.due(now) {
            out.push(Effect::Snapshot);
        }
        out.push(Effect::Housekeeping);
        let actions = self.anti_entropy.tick(now);
        self.actions(actions, now, out);
        let live = self.anti_entropy.live_peers(now);
        self.note_live(live);
        out.push(Effect::PeerGauges { live });
        let expired = self.transfers.as_mut().map_or(0, |t| t.expire());
        if expired > 0 {
            out.push(Effect::TransfersExpired(expired));
        }
    }

    /// A push is wanted: now, or as soon as `min_push_interval` allows (one push serves
    /// every peer that asked meanwhile).
    fn push(&mut self, now: Instant, out: &mut Effects<R>) {
        match self.pushes.plan(now) {
            PushPlan::Now => self.start_push(now, out),
            PushPlan::Armed => {}
            PushPlan::After(wait) => out.push(Effect::SetTimer(Timer::Push, wait)),
        }
    }

    fn start_push(&mut self, now: Instant, out: &mut Effects<R>) {
        let transfer = self.pushes.start(now);
        self.anti_entropy.pushed(now);
        out.push(Effect::Push { transfer });
    }

    /// A flush of the pending delta, unless one is scheduled: at once if the last flush is
    /// `delta_interval_ms` old or more (an add on an idle link travels at once), else when
    /// it will be (updates that come faster share deltas, so that the envelope's bytes and
    /// a message through nats-server are paid once per interval, not per update).
    fn want_flush(&mut self, now: Instant, out: &mut Effects<R>) {
        if self.pipeline.flush_timer_armed() {
            return;
        }
        rearm(self.schedule.busy_again(now), out);
        let delay = self.pipeline.flush_delay(now, self.traits.delta_interval);
        if delay.is_zero() {
            // In this turn: a timer, even of zero, waits for the runtime's next millisecond.
            return out.push(Effect::Flush { scheduled: true });
        }
        self.pipeline.arm_flush_timer();
        out.push(Effect::SetTimer(Timer::Flush, delay));
    }

    /// A commit within a millisecond (unless one is timed): for `logged` updates, which do
    /// not wait for it, and for waiting updates without a log to pace commits; those that
    /// arrive meanwhile share its write and its delta.
    pub(crate) fn commit_soon(&mut self, out: &mut Effects<R>) {
        if self.pipeline.arm_commit_timer() {
            out.push(Effect::SetTimer(Timer::Commit, Duration::from_millis(1)));
        }
    }

    /// Commit `batch`'s delta was taken: logged (appended, or synced for a commit without
    /// a delta whose updates wait for the disk), published, or done at once.
    fn delta_taken(
        &mut self,
        batch: u64,
        delta: Option<Vec<u8>>,
        sync_through: u64,
        now: Instant,
        out: &mut Effects<R>,
    ) {
        if self.traits.full_state_only {
            // The naive protocol: every change is followed by a full-state broadcast.
            if self.pushes.changed_since_last() {
                self.push(now, out);
            }
            return self.without_delta(batch, now, out);
        }
        let Some(delta) = delta else {
            // Nothing changed since the last commit: the waiting updates rest on what
            // earlier commits logged (and published, or held), some of it perhaps only
            // written. Those that wait for the disk wait for a sync of the log.
            return match self.pipeline.sync(batch, sync_through) {
                true => out.push(Effect::Sync { batch }),
                false => self.without_delta(batch, now, out),
            };
        };
        match self.pipeline.append(batch, sync_through) {
            Some(sync) => out.push(Effect::Append { batch, delta, sync }),
            None => out.push(Effect::PublishDelta { batch, delta }),
        }
    }

    /// Commit `batch` carries no delta to log or publish: done at once.
    fn without_delta(&mut self, batch: u64, now: Instant, out: &mut Effects<R>) {
        out.push(Effect::CommitDone { batch, error: None });
        self.answer_without_delta(batch, now, out);
    }

    /// Answers the updates of commit `batch`, which had no delta, done.
    fn answer_without_delta(&mut self, batch: u64, now: Instant, out: &mut Effects<R>) {
        if self.pipeline.acks.wants_confirmation(batch) {
            // Updates waiting for peers may rely on held deltas (an add whose item an
            // earlier commit set): those go now, the newest confirmed on this commit's
            // behalf, so that the waiters count its receivers.
            let mut held = self.pipeline.take_held();
            if let Some(newest) = held.pop() {
                out.push(Effect::PublishHeld(held));
                return out.push(Effect::PublishDelta {
                    batch,
                    delta: newest.delta,
                });
            }
        }
        answer(self.pipeline.acks.committed(batch, None, 0, now), out);
    }

    /// A commit's append (or sync) finished.
    fn written(
        &mut self,
        batch: u64,
        delta: Option<Vec<u8>>,
        result: Result<(), String>,
        now: Instant,
        out: &mut Effects<R>,
    ) {
        let (again, began) = self.pipeline.written(now);
        let error = result.err();
        out.push(Effect::CommitDone {
            batch,
            error: error.clone(),
        });
        if let Some(e) = &error {
            answer(self.pipeline.acks.commit_failed(batch, e), out);
            out.push(Effect::WalFailed(e.clone()));
            if let Some(delay) = self.pipeline.wal_failed() {
                out.push(Effect::SetTimer(Timer::WalRecovery, delay));
            }
        }
        match delta {
            // A sync for a commit without a delta.
            None if error.is_none() => self.answer_without_delta(batch, now, out),
            None => {}
            Some(delta) => {
                // Durable now: what waited for the disk is answered before its delta goes.
                answer(self.pipeline.acks.durable(batch), out);
                // Published either way: the updates are applied, and peers may as well
                // have them.
                let confirm = self.pipeline.acks.wants_confirmation(batch);
                let interval = self.traits.delta_interval;
                match self
                    .pipeline
                    .release(batch, delta, began, confirm, interval, now)
                {
                    Release::Now(held) => out.push(Effect::PublishHeld(held)),
                    Release::Later(delay) => out.push(Effect::SetTimer(Timer::Publish, delay)),
                    Release::Held => {}
                }
            }
        }
        if again {
            out.push(Effect::Flush { scheduled: false });
        }
    }

    /// Commit `batch`'s delta went out as frame `seq`: its updates are answered, those
    /// waiting for peers once enough of the replicas the registry knows confirmed it, or
    /// failed after `replicated_timeout_ms`.
    fn published(&mut self, batch: u64, seq: u64, now: Instant, out: &mut Effects<R>) {
        let confirm = self.pipeline.acks.wants_confirmation(batch);
        let timeout = self.traits.replicated_timeout;
        // Fixed now, of the replicas the registry knows: peers that go silent meanwhile
        // still count (see `known_replicas`).
        let live = self.anti_entropy.live_peers(now);
        self.note_live(live);
        let known = known_replicas(self.lease.known_replicas(), self.most_live, live);
        let needed = peers_needed(self.traits.replicated_peers, known);
        let acks = &mut self.pipeline.acks;
        let r = if confirm && needed == 0 && self.traits.replicated_peers.is_none() {
            // Alone at the last look, which may have come before peers claimed their ids: a
            // peer's acknowledgement or a look from now on says so first.
            let r = acks.committed_alone(batch, seq, now, now + timeout);
            self.look_for_alone(out);
            r
        } else {
            acks.committed(batch, Some(seq), needed, now + timeout)
        };
        answer(r, out);
        if confirm {
            out.push(Effect::ExpireAfter(timeout));
        }
    }

    /// Asks for a look at the registry for the `replicated` updates published alone
    /// ([`crate::replica::AckTracker::committed_alone`]), unless one is asked for already.
    fn look_for_alone(&mut self, out: &mut Effects<R>) {
        if let Some(since) = self.pipeline.acks.look_to_ask() {
            out.push(Effect::LookForAlone { since });
        }
    }

    /// The look asked for updates published alone ended, started at `started`: they now wait
    /// for a majority of the replicas it counted (none: answered); those published after it
    /// started ask for another.
    pub(super) fn looked_for_alone(
        &mut self,
        started: Option<Instant>,
        now: Instant,
        out: &mut Effects<R>,
    ) {
        self.pipeline.acks.look_ended();
        let Some(started) = started else { return };
        let live = self.anti_entropy.live_peers(now);
        self.note_live(live);
        let known = known_replicas(self.lease.known_replicas(), self.most_live, live);
        let r = self
            .pipeline
            .acks
            .looked(started, peers_needed(None, known));
        answer(r, out);
        self.look_for_alone(out);
    }
}

/// The periodic timer's deadline moved earlier, if `r` says so.
fn rearm<R>(r: Rearm, out: &mut Effects<R>) {
    if r.0 {
        out.push(Effect::RearmPeriodic);
    }
}

/// Answers `r`, unless it answers no one.
fn answer<R>(r: Resolved<R>, out: &mut Effects<R>) {
    if !(r.ok.is_empty() && r.failed.is_empty()) {
        out.push(Effect::Answer(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ack::AckLevel;
    use crate::replica::anti_entropy::Timing;
    use crate::replica::core::{CommitPipeline, Lease, Pushes, Snapshotter, Traits};
    use crate::transport::registry::TakeBack;
    use crate::wire::{FilterKind, chunk_state};

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);
    const ME: Uuid = Uuid::from_u128(1);

    fn core(t0: Instant, logged: bool) -> ReplicaCore<u32> {
        let traits = Traits {
            aggregate_metrics: true,
            moves_with_time: false,
            small: true,
            serve_api: false,
            node_id: false,
            anti_entropy_interval: 5 * S,
            metrics_interval: S,
            peer_expiry: 60 * S,
            max_state_bytes: 1 << 20,
            merges_pieces: false,
            me: ME,
            max_peers: 2,
            delta_interval: 50 * MS,
            full_state_only: false,
            replicated_timeout: 5 * S,
            replicated_peers: None,
            id: 1,
            lease_block: 1_000,
            tagged: true,
            retire_after: 60 * S,
            reuses_ids: true,
        };
        let timing = Timing {
            live: 15 * S,
            peer_expiry: 60 * S,
            min_request_interval: S,
            catch_up_timeout: 2 * S,
            max_peers: 2,
        };
        let parts = (
            Snapshotter::new(None, 30 * S, t0),
            CommitPipeline::new(logged),
            Lease::new(0, None),
        );
        let parts = (parts.0, parts.1, Lease::new(1_000, None));
        let mut c = ReplicaCore::new(traits, timing, parts, Pushes::new(S, 1), (0, false), t0, 1);
        let _ = c.anti_entropy.ready_now("a test");
        c
    }

    /// The effects of one step, named (the payloads the tests look at spelled out).
    fn step(c: &mut ReplicaCore<u32>, event: Event, now: Instant) -> Vec<String> {
        let mut out = Effects::default();
        c.step(event, now, &mut out);
        out.as_slice().iter().map(name).collect()
    }

    fn name(e: &Effect<u32>) -> String {
        match e {
            Effect::RequestState(t) => format!("RequestState({t:?})"),
            Effect::SendDigest { periodic } => format!("SendDigest({periodic})"),
            Effect::Push { .. } => "Push".into(),
            Effect::StartApi(_) => "StartApi".into(),
            Effect::Ready(_) => "Ready".into(),
            Effect::CountGaps(n) => format!("CountGaps({n})"),
            Effect::Forgot(_) => "Forgot".into(),
            Effect::Reject(e) => format!("Reject({})", e.reason()),
            Effect::MergeDelta { bytes, ack, .. } => format!("MergeDelta({bytes:?}, {ack:?})"),
            Effect::MergeState { state, .. } => format!("MergeState({state:?})"),
            Effect::MergePiece { .. } => "MergePiece".into(),
            Effect::AfterMerges => "AfterMerges".into(),
            Effect::TransferRejected(e) => format!("TransferRejected({})", e.reason()),
            Effect::Progress { transfer, next, .. } => format!("Progress({transfer}, {next})"),
            Effect::Answer(r) => {
                let failed: Vec<u32> = r.failed.iter().map(|(w, _)| *w).collect();
                format!("Answer(ok {:?}, failed {failed:?})", r.ok)
            }
            Effect::SetTimer(t, d) => format!("SetTimer({t:?}, {d:?})"),
            Effect::RearmPeriodic => "RearmPeriodic".into(),
            Effect::ArmPeriodic => "ArmPeriodic".into(),
            Effect::Housekeeping => "Housekeeping".into(),
            Effect::PeerGauges { live } => format!("PeerGauges({live})"),
            Effect::TransfersExpired(n) => format!("TransfersExpired({n})"),
            Effect::Snapshot => "Snapshot".into(),
            Effect::Flush { scheduled } => format!("Flush({scheduled})"),
            Effect::TakeDelta { batch, encode } => format!("TakeDelta({batch}, {encode})"),
            Effect::Append { batch, sync, .. } => format!("Append({batch}, sync {sync})"),
            Effect::Sync { batch } => format!("Sync({batch})"),
            Effect::CommitDone { batch, error } => format!("CommitDone({batch}, {error:?})"),
            Effect::PublishDelta { batch, .. } => format!("PublishDelta({batch})"),
            Effect::PublishHeld(h) => {
                let batches: Vec<u64> = h.iter().map(|h| h.batch).collect();
                format!("PublishHeld({batches:?})")
            }
            Effect::ExpireAfter(d) => format!("ExpireAfter({d:?})"),
            Effect::WalFailed(e) => format!("WalFailed({e})"),
            Effect::RecoverWal => "RecoverWal".into(),
            Effect::LookForHeld => "LookForHeld".into(),
            Effect::LookForAlone { .. } => "LookForAlone".into(),
            Effect::Renew { want } => format!("Renew({want})"),
            Effect::TakeBack { want } => format!("TakeBack({want})"),
            Effect::WantReservation { clock } => format!("WantReservation({clock})"),
            Effect::IdLost => "IdLost".into(),
            Effect::IdTakenBack { floor } => format!("IdTakenBack({floor})"),
            Effect::IdHeldByOther => "IdHeldByOther".into(),
            Effect::LeaseFailed { what, .. } => format!("LeaseFailed({what})"),
            Effect::IdCounts { live, retired } => format!("IdCounts({live}, {retired})"),
            Effect::Retire(e) => format!("Retire({})", e.id),
        }
    }

    fn peer(n: u128) -> Uuid {
        Uuid::from_u128(100 + n)
    }

    /// A frame of peer `n`, numbered `seq`.
    fn frame(n: u128, seq: u64, body: Body) -> Event {
        let env = Envelope::new("f", FilterKind::GBloom, 0, peer(n), n as u16, seq, body);
        Event::Frame { env, mine: None }
    }

    /// The commit the pipeline begins next, through the flush's steps, with `delta`.
    fn commit(c: &mut ReplicaCore<u32>, delta: Option<Vec<u8>>, now: Instant) -> Vec<String> {
        let taken = step(c, Event::Flush, now);
        let batch = c.pipeline.next_batch() - 1;
        assert_eq!(taken, [format!("TakeDelta({batch}, true)")]);
        let taken = Event::DeltaTaken {
            batch,
            delta,
            sync_through: 0,
        };
        step(c, taken, now)
    }

    #[test]
    fn a_connection_asks_announces_and_pushes_and_pushes_keep_their_interval() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let connected = || Event::Transport(TransportEvent::Connected);
        assert_eq!(
            step(&mut c, connected(), t0),
            ["RequestState(None)", "SendDigest(false)", "Push"]
        );
        c.pushes.encoded();
        // Again within `min_push_interval`: the push waits for it.
        assert_eq!(
            step(&mut c, connected(), t0 + 100 * MS),
            [
                "RequestState(None)",
                "SendDigest(false)",
                "SetTimer(Push, 900ms)"
            ]
        );
        assert_eq!(step(&mut c, Event::Timer(Timer::Push), t0 + S), ["Push"]);
        let slow = Event::Transport(TransportEvent::SlowConsumer);
        assert_eq!(step(&mut c, slow, t0 + S), ["RequestState(None)"]);
        let gone = Event::Transport(TransportEvent::Disconnected);
        assert!(step(&mut c, gone, t0 + S).is_empty());
        // A push still being encoded when its timer fires waits again.
        let asked = Event::PushWanted;
        assert_eq!(step(&mut c, asked, t0 + S), ["SetTimer(Push, 1s)"]);
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Push), t0 + 2 * S),
            ["SetTimer(Push, 10ms)"]
        );
    }

    #[test]
    fn a_peer_frame_is_merged_acknowledged_or_refused_as_its_body_says() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let delta = step(&mut c, frame(1, 1, Body::Delta(vec![1])), t0);
        assert_eq!(delta.last().unwrap(), "AfterMerges");
        assert!(delta.contains(&"MergeDelta([1], None)".into()), "{delta:?}");
        // A confirmed delta is acknowledged once merged: the shell acks with its number.
        let confirmed = step(&mut c, frame(1, 2, Body::ConfirmedDelta(vec![2])), t0);
        assert_eq!(confirmed, ["MergeDelta([2], Some(2))", "AfterMerges"]);
        let deltas = vec![vec![3].into(), vec![4].into()];
        assert_eq!(
            step(&mut c, frame(1, 3, Body::Deltas(deltas)), t0),
            [
                "MergeDelta([3], None)",
                "MergeDelta([4], None)",
                "AfterMerges"
            ]
        );
        // A state request for another replica is not ours to answer; a broadcast one is.
        let other = Body::StateRequest {
            target: Some(peer(9)),
        };
        assert_eq!(step(&mut c, frame(1, 4, other), t0), ["AfterMerges"]);
        let all = Body::StateRequest { target: None };
        assert_eq!(step(&mut c, frame(1, 5, all), t0), ["Push", "AfterMerges"]);
        let mine = Body::StateRequest { target: Some(ME) };
        c.pushes.encoded();
        assert_eq!(
            step(&mut c, frame(1, 6, mine), t0 + 100 * MS),
            ["SetTimer(Push, 900ms)", "AfterMerges"]
        );
        // The peer table holds two live peers: a third is refused, merging nothing.
        let _ = step(&mut c, frame(2, 1, Body::Delta(vec![5])), t0);
        assert_eq!(
            step(&mut c, frame(3, 1, Body::Delta(vec![6])), t0),
            ["Reject(too_many_peers)"]
        );
    }

    #[test]
    fn only_a_known_peer_paces_a_push_of_ours() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let progress = |target| Body::StateProgress {
            target,
            transfer: 7,
            next: 4,
        };
        assert!(step(&mut c, frame(1, 0, progress(ME)), t0).is_empty());
        let _ = step(&mut c, frame(1, 1, Body::Delta(vec![1])), t0);
        assert_eq!(
            step(&mut c, frame(1, 0, progress(ME)), t0),
            ["Progress(7, 4)"]
        );
        assert!(step(&mut c, frame(1, 0, progress(peer(2))), t0).is_empty());
    }

    #[test]
    fn a_transfer_completes_into_a_merge_or_is_refused() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let mut chunks = chunk_state(b"a state", 7, 1024);
        assert_eq!(
            step(&mut c, frame(1, 1, Body::StateChunk(chunks.remove(0))), t0),
            [
                "MergeState([97, 32, 115, 116, 97, 116, 101])",
                "AfterMerges"
            ]
        );
        let mut forged = chunk_state(b"another", 8, 1024).remove(0);
        forged.data[0] ^= 1;
        assert_eq!(
            step(&mut c, frame(1, 2, Body::StateChunk(forged)), t0),
            ["TransferRejected(chunk)", "AfterMerges"]
        );
    }

    #[test]
    fn replicated_updates_are_answered_by_their_peers_acks_or_expire() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        // One live peer: with this replica, two known; one ack needed.
        let _ = step(&mut c, frame(1, 1, Body::Delta(vec![1])), t0);
        c.pipeline.acks.wait(AckLevel::Replicated, 1, 7);
        assert_eq!(commit(&mut c, Some(vec![9]), t0), ["PublishDelta(1)"]);
        let published = Event::Published { batch: 1, seq: 5 };
        assert_eq!(step(&mut c, published, t0), ["ExpireAfter(5s)"]);
        let ack = |target| Body::Ack { target, seq: 5 };
        assert_eq!(step(&mut c, frame(1, 2, ack(peer(3))), t0), ["AfterMerges"]);
        assert_eq!(
            step(&mut c, frame(1, 3, ack(ME)), t0),
            ["Answer(ok [7], failed [])", "AfterMerges"]
        );
        // No ack within `replicated_timeout_ms`: failed.
        c.pipeline.acks.wait(AckLevel::Replicated, 2, 8);
        assert_eq!(commit(&mut c, Some(vec![10]), t0), ["PublishDelta(2)"]);
        let published = Event::Published { batch: 2, seq: 6 };
        assert_eq!(step(&mut c, published, t0), ["ExpireAfter(5s)"]);
        assert!(step(&mut c, Event::ConfirmationsDue, t0 + S).is_empty());
        assert_eq!(
            step(&mut c, Event::ConfirmationsDue, t0 + 6 * S),
            ["Answer(ok [], failed [8])"]
        );
    }

    /// Alone at the last look (no peer heard, no registry listing yet), a `replicated`
    /// update is not answered at its publication: the core asks for a fresh look, and only
    /// one that started after the publication and still finds it alone answers it; a look
    /// that finds a peer makes it wait for that peer.
    #[test]
    fn a_replicated_update_published_alone_waits_for_a_fresh_look() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        c.pipeline.acks.wait(AckLevel::Replicated, 1, 7);
        assert_eq!(commit(&mut c, Some(vec![9]), t0), ["PublishDelta(1)"]);
        let published = Event::Published { batch: 1, seq: 5 };
        assert_eq!(
            step(&mut c, published, t0 + S),
            ["LookForAlone", "ExpireAfter(5s)"]
        );
        // A look that started before the publication: asks again.
        let stale = Event::LookedForAlone(Some(t0));
        assert_eq!(step(&mut c, stale, t0 + 2 * S), ["LookForAlone"]);
        let fresh = Event::LookedForAlone(Some(t0 + 2 * S));
        assert_eq!(
            step(&mut c, fresh, t0 + 3 * S),
            ["Answer(ok [7], failed [])"]
        );
        // Now the registry lists a peer's claim: the next one waits for its ack.
        c.pipeline.acks.wait(AckLevel::Replicated, 2, 8);
        assert_eq!(commit(&mut c, Some(vec![10]), t0), ["PublishDelta(2)"]);
        let published = Event::Published { batch: 2, seq: 6 };
        assert_eq!(
            step(&mut c, published, t0 + 4 * S),
            ["LookForAlone", "ExpireAfter(5s)"]
        );
        let claim = |id| ClaimEntry {
            id,
            record: crate::transport::ClaimRecord::Held {
                claimant: peer(id.into()),
                reserved: 0,
            },
            revision: 1,
        };
        let listed = Event::Listed {
            claims: Ok(vec![claim(1), claim(2)]),
            started: t0 + 5 * S,
        };
        let effects = step(&mut c, listed, t0 + 5 * S);
        assert!(
            !effects.iter().any(|e| e.starts_with("Answer")),
            "{effects:?}"
        );
        let ack = Body::Ack { target: ME, seq: 6 };
        assert_eq!(
            step(&mut c, frame(2, 1, ack), t0 + 6 * S),
            ["Answer(ok [8], failed [])", "AfterMerges"]
        );
    }

    #[test]
    fn a_flush_goes_at_once_on_an_idle_link_then_once_per_delta_interval() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        assert_eq!(step(&mut c, Event::FlushWanted, t0), ["Flush(true)"]);
        assert_eq!(commit(&mut c, Some(vec![1]), t0), ["PublishDelta(1)"]);
        assert_eq!(
            step(&mut c, Event::FlushWanted, t0 + 10 * MS),
            ["SetTimer(Flush, 40ms)"]
        );
        assert!(step(&mut c, Event::FlushWanted, t0 + 20 * MS).is_empty());
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Flush), t0 + 50 * MS),
            ["Flush(true)"]
        );
    }

    #[test]
    fn commits_without_a_log_gather_for_a_millisecond_with_one_at_once() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        assert_eq!(
            step(&mut c, Event::CommitWanted, t0),
            ["SetTimer(Commit, 1ms)"]
        );
        assert!(step(&mut c, Event::LoggedCommitWanted, t0).is_empty());
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Commit), t0 + MS),
            ["Flush(false)"]
        );
        let mut logged = core(t0, true);
        assert_eq!(step(&mut logged, Event::CommitWanted, t0), ["Flush(false)"]);
    }

    #[test]
    fn a_logged_commit_is_synced_for_the_disk_and_published_once_written() {
        let t0 = Instant::now();
        let mut c = core(t0, true);
        c.pipeline.acks.wait(AckLevel::Durable, 1, 7);
        assert_eq!(commit(&mut c, Some(vec![1]), t0), ["Append(1, sync true)"]);
        // Asked for while the first is written: it follows at once.
        assert!(step(&mut c, Event::Flush, t0).is_empty());
        let written = Event::Written {
            batch: 1,
            delta: Some(vec![1]),
            result: Ok(()),
        };
        assert_eq!(
            step(&mut c, written, t0 + MS),
            [
                "CommitDone(1, None)",
                "Answer(ok [7], failed [])",
                "PublishHeld([1])",
                "Flush(false)"
            ]
        );
        // Nothing waits for the disk: appended, not synced; its delta waits for the
        // interval after the last one published.
        assert_eq!(
            commit(&mut c, Some(vec![2]), t0 + 2 * MS),
            ["Append(2, sync false)"]
        );
        let written = Event::Written {
            batch: 2,
            delta: Some(vec![2]),
            result: Ok(()),
        };
        assert_eq!(
            step(&mut c, written, t0 + 3 * MS),
            ["CommitDone(2, None)", "SetTimer(Publish, 47ms)"]
        );
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Publish), t0 + 50 * MS),
            ["PublishHeld([2])"]
        );
    }

    #[test]
    fn a_commit_without_a_delta_syncs_for_the_disk_or_is_done_at_once() {
        let t0 = Instant::now();
        let mut c = core(t0, true);
        c.pipeline.acks.wait(AckLevel::Durable, 1, 7);
        assert_eq!(commit(&mut c, None, t0), ["Sync(1)"]);
        let synced = Event::Written {
            batch: 1,
            delta: None,
            result: Ok(()),
        };
        assert_eq!(
            step(&mut c, synced, t0 + MS),
            ["CommitDone(1, None)", "Answer(ok [7], failed [])"]
        );
        assert_eq!(commit(&mut c, None, t0 + 2 * MS), ["CommitDone(2, None)"]);
    }

    #[test]
    fn a_failed_write_fails_its_updates_and_retries_the_log_with_backoff() {
        let t0 = Instant::now();
        let mut c = core(t0, true);
        c.pipeline.acks.wait(AckLevel::Durable, 1, 7);
        assert_eq!(commit(&mut c, Some(vec![1]), t0), ["Append(1, sync true)"]);
        let failed = Event::Written {
            batch: 1,
            delta: Some(vec![1]),
            result: Err("disk".into()),
        };
        assert_eq!(
            step(&mut c, failed, t0 + MS),
            [
                "CommitDone(1, Some(\"disk\"))",
                "Answer(ok [], failed [7])",
                "WalFailed(disk)",
                "SetTimer(WalRecovery, 100ms)",
                "PublishHeld([1])"
            ]
        );
        assert_eq!(
            step(&mut c, Event::Timer(Timer::WalRecovery), t0 + S),
            ["RecoverWal"]
        );
        assert_eq!(
            step(&mut c, Event::RecoveryFailed, t0 + S),
            ["SetTimer(WalRecovery, 200ms)"]
        );
    }

    #[test]
    fn the_periodic_timer_announces_keeps_house_and_arms_itself_again() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let _ = c.schedule.plan(false);
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Periodic), t0),
            [
                "SendDigest(true)",
                "Housekeeping",
                "PeerGauges(0)",
                "ArmPeriodic"
            ]
        );
        assert!(step(&mut c, Event::DigestSent { spacing: 1 }, t0).is_empty());
        // Fired early (the grid): nothing is due yet.
        let _ = c.schedule.plan(false);
        assert_eq!(
            step(&mut c, Event::Timer(Timer::Periodic), t0 + MS),
            ["ArmPeriodic"]
        );
    }

    fn renew(clock: u64, issued: bool) -> Event {
        Event::Renew { clock, issued }
    }

    fn renewed(want: u64, renewal: Result<Renewal, TransportError>, clock: u64) -> Event {
        Event::Renewed {
            want,
            renewal,
            periodic: true,
            clock,
        }
    }

    #[test]
    fn the_claim_is_renewed_when_due_or_half_its_block_is_used_one_renewal_at_a_time() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        assert!(step(&mut c, renew(499, true), t0).is_empty(), "enough left");
        assert_eq!(step(&mut c, renew(500, true), t0), ["Renew(1500)"]);
        assert!(
            step(&mut c, renew(600, false), t0).is_empty(),
            "one under way"
        );
        assert!(step(&mut c, renewed(1500, Ok(Renewal::Held), 600), t0).is_empty());
        assert_eq!(c.lease.reserved(), 1500);
        // Due: renewed whatever is used, never below the reservation held.
        assert_eq!(step(&mut c, renew(0, false), t0), ["Renew(1500)"]);
        let failed = renewed(1500, Err(TransportError::claim("no leader")), 0);
        assert_eq!(
            step(&mut c, failed, t0),
            ["LeaseFailed(renewing the claim)"]
        );
        assert_eq!(c.lease.reserved(), 1500);
        assert_eq!(step(&mut c, renew(900, false), t0), ["Renew(1900)"]);
        // An import's renewal answered does not end the periodic one.
        let import = Event::Renewed {
            want: 5000,
            renewal: Ok(Renewal::Held),
            periodic: false,
            clock: 900,
        };
        assert!(step(&mut c, import, t0).is_empty());
        assert_eq!(c.lease.reserved(), 5000);
        assert!(
            step(&mut c, renew(900, false), t0).is_empty(),
            "still one under way"
        );
    }

    #[test]
    fn a_lost_claim_is_reported_once_and_taken_back_before_renewals_resume() {
        let t0 = Instant::now();
        let mut c = core(t0, false);
        assert_eq!(step(&mut c, renew(10, false), t0), ["Renew(1010)"]);
        assert_eq!(
            step(&mut c, renewed(1010, Ok(Renewal::Lost), 10), t0),
            ["IdLost", "TakeBack(1010)"]
        );
        assert!(step(&mut c, renew(10, false), t0).is_empty(), "taking back");
        let taken = Event::TakenBack(Ok(TakeBack::Taken {
            floor: 2000,
            reserved: 3000,
        }));
        assert_eq!(step(&mut c, taken, t0), ["IdTakenBack(2000)"]);
        assert_eq!(step(&mut c, renew(2000, false), t0), ["Renew(3000)"]);
        // Lost again, and the id held by another meanwhile: no tags, no renewal.
        assert_eq!(
            step(&mut c, renewed(3000, Ok(Renewal::Lost), 2000), t0),
            ["IdLost", "TakeBack(3000)"]
        );
        let other = Event::TakenBack(Ok(TakeBack::HeldByOther));
        assert_eq!(step(&mut c, other, t0), ["IdHeldByOther"]);
        assert!(c.lease.lost());
        assert_eq!(step(&mut c, renew(2000, false), t0), ["TakeBack(3000)"]);
    }

    #[test]
    fn the_claims_of_earlier_runs_are_retired_and_never_counted() {
        use crate::replica::core::start::next_run;
        use crate::transport::ClaimRecord;
        let t0 = Instant::now();
        let held = |id, claimant| ClaimEntry {
            id,
            record: ClaimRecord::Held {
                claimant,
                reserved: 100,
            },
            revision: 1,
        };
        let listed = |claims: Vec<ClaimEntry>| Event::Listed {
            claims: Ok(claims),
            started: t0,
        };
        // Runs 1 and 2 of this replica (2 crashed before it wrote its identity), this run
        // (3, under id 1), and another replica's claim.
        let first = Uuid::new_v4();
        let second = next_run(first);
        let mut c = core(t0, false);
        c.traits.reuses_ids = false;
        c.traits.me = next_run(second);
        let claims = vec![
            held(1, c.traits.me),
            held(4, first),
            held(6, second),
            held(5, peer(5)),
        ];
        assert_eq!(
            step(&mut c, listed(claims), t0),
            ["Retire(4)", "Retire(6)", "IdCounts(2, 0)"]
        );
        assert_eq!(c.lease.known_replicas(), Some(2), "this one and 5");
        // A kind whose ids serve later runs keeps its uuid: nothing of the kind.
        let mut c = core(t0, false);
        c.traits.me = first;
        let claims = vec![held(1, first), held(6, second)];
        assert_eq!(step(&mut c, listed(claims), t0), ["IdCounts(2, 0)"]);
    }

    #[test]
    fn a_silent_claim_is_retired_unless_its_replica_was_heard() {
        use crate::transport::ClaimRecord;
        let t0 = Instant::now();
        let mut c = core(t0, false);
        let claim = |id, revision| ClaimEntry {
            id,
            record: ClaimRecord::Held {
                claimant: peer(u128::from(id)),
                reserved: 100,
            },
            revision,
        };
        let claims = || Ok(vec![claim(1, 1), claim(5, 1), claim(6, 1)]);
        let listed = |started| Event::Listed {
            claims: claims(),
            started,
        };
        assert_eq!(step(&mut c, listed(t0), t0), ["IdCounts(3, 0)"]);
        // Replica 6 is heard; 5 is not; neither renewed its claim for `retire_after_ms`.
        let later = t0 + 61 * S;
        let _ = step(&mut c, frame(6, 1, Body::Delta(vec![1])), later);
        assert_eq!(
            step(&mut c, listed(later), later),
            ["IdCounts(3, 0)", "Retire(5)"]
        );
        assert_eq!(c.lease.known_replicas(), Some(1), "only this one renewed");
        let failed = Event::Listed {
            claims: Err(TransportError::claim("no leader")),
            started: later,
        };
        assert_eq!(step(&mut c, failed, later), ["LeaseFailed(listing claims)"]);
    }
}
