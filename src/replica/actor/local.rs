//! Local operations: the actor's messages (what a [`ReplicaHandle`] sends), how an update is
//! checked and applied, and how it is answered once it reached its acknowledgement level.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::reply::Responder;
use super::updates::Lock;
use super::{Replica, ReplicaError, Shared};
use crate::api::AddMode;
use crate::replica::ReplicaHandle;
use crate::replica::ReplicaStats;
use crate::replica::ack::AckLevel;
use crate::replica::filter::AnyFilter;
use crate::replica::filter::FilterStats;
use crate::replica::metrics::Counts;
use crate::replica::metrics::{MergeSource, OpKind};
use crate::{Dot, ImportRoom, Occurrence};

impl Replica {
    pub(super) fn op(&self, op: OpKind, ok: bool) {
        self.telemetry.op(op, ok);
    }

    /// Applies a slice of an import ([`Import`]): its tags reserved, then all or nothing.
    pub(super) fn do_import(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, ReplicaError> {
        let tags = AnyFilter::tags_for_import(self.io.expect.kind, occurrences);
        let r = self.reserve_tags_for(tags).and_then(|()| {
            let mut f = self.write();
            let now = self.shared.clock.for_updates(f.clock_bounds())?;
            f.tick(now);
            f.import(occurrences, room).map_err(ReplicaError::from)
        });
        match &r {
            Ok(added) => self.telemetry.count_ops(OpKind::Add, *added, 0),
            Err(e) => {
                self.op(OpKind::Add, false);
                tracing::debug!(filter = %self.cfg.name, error = %e, "an import's slice was refused");
            }
        }
        if matches!(r, Ok(added) if added > 0) {
            self.local_change();
        }
        r
    }

    /// Refuses a level this replica cannot give before the update is applied.
    pub(super) fn check_level(&self, level: AckLevel) -> Result<(), ReplicaError> {
        self.updates.check_level(level)
    }

    /// Answers an applied local update once it reached `level`. One that changed nothing
    /// relies on what earlier commits carry: answered at once, but at `durable` only after
    /// the next commit (a sync of the log), since those may be written and not yet synced.
    pub(super) fn settle(
        &mut self,
        level: AckLevel,
        changed: bool,
        responder: Responder,
        ctx: &mut Context<Self>,
    ) {
        if level == AckLevel::Logged && changed {
            // Answered now, committed within a millisecond (or right after the commit in
            // flight): its delta is written to the log, not synced.
            let r = self.updates.logged_answer();
            self.respond(responder, r);
            self.commit_within_a_millisecond(ctx);
        } else if level.answered_at_apply() || (!changed && level != AckLevel::Durable) {
            self.respond(responder, Ok(()));
        } else {
            let batch = self.core.pipeline.next_batch();
            self.core.pipeline.acks.wait(level, batch, responder);
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

    /// Marks a local update; the commit it may call for comes from [`Replica::settle`].
    pub(super) fn local_change(&mut self) {
        self.mark_local_change();
        self.shared.want_flush(&self.chans.inbound_tx);
    }

    /// A local change whose flush is already asked for (made outside the actor, see
    /// [`Replica::absorb_direct_changes`]).
    pub(super) fn mark_local_change(&mut self) {
        self.core.local_change();
    }

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

/// Reserves this many version tags past the clock, for an import's slices
/// ([`ReplicaHandle::import`]): renews the id claim first where its reservation falls short,
/// then reserves durably (with a data directory). No-op for kinds without tags.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub struct ReserveTags(pub u64);

/// Re-adds occurrences of a filter of the same kind and parameters (a slice of a dump's
/// [`AnyFilter::live_occurrences`]) as this replica's own updates: under fresh tags of its
/// own (the observed-remove kinds), as its own counts (`counting_cuckoo`); logged, published
/// and acknowledged as adds are. All or nothing. Answers the occurrences added, once the
/// update reached `ack`; unset: `durable` with a write-ahead log, else `local`, so that an
/// import sent in slices goes to the log a slice at a time (the delta of a whole large dump
/// could exceed a log record).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<u64, ReplicaError>")]
pub struct Import {
    /// The occurrences.
    pub occurrences: Vec<Occurrence>,
    /// The room of the whole dump they are part of ([`ImportRoom::of`]).
    pub room: std::sync::Arc<ImportRoom>,
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
/// sent everything (or after 5 s: NATS may be unreachable).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub struct Shutdown;

/// How long [`Shutdown`] waits for the transport to send the replica's last publications.
pub(crate) const FINAL_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// [`Shutdown`], waiting for the transport until the given instant at the latest. A node
/// stopping many replicas gives them one deadline: each waiting its own 5 s for a server
/// that was gone, 1,024 at a time, 100,000 filters took 8 minutes to stop.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), ReplicaError>")]
pub(crate) struct ShutdownBy(pub tokio::time::Instant);

/// Publishes the pending delta now.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct FlushDelta;

impl Handler<Add> for Replica {
    type Result = ResponseFuture<Result<Option<Dot>, ReplicaError>>;
    fn handle(&mut self, msg: Add, ctx: &mut Context<Self>) -> Self::Result {
        let level = msg.ack.unwrap_or(self.cfg.default_ack());
        // The request API's add (`Updates::add_one`), answering the tag it issued.
        let applied = self.check_level(level).and_then(|()| {
            let updates = self.updates.clone();
            let mut reserve = || {
                self.reserve_tags()?;
                Ok(self.tag_limit())
            };
            let footprint = level == AckLevel::Replicated;
            let added = updates
                .add_one(
                    &msg.item,
                    AddMode::Always,
                    Lock::Wait,
                    &mut reserve,
                    false,
                    footprint,
                )?
                .expect("the actor waits for the lock");
            if added.changed {
                self.local_change();
            }
            Ok((added.changed, added.dot))
        });
        self.settle_handle(level, applied, ctx)
    }
}

impl Handler<Remove> for Replica {
    type Result = ResponseFuture<Result<Option<Dot>, ReplicaError>>;
    fn handle(&mut self, msg: Remove, ctx: &mut Context<Self>) -> Self::Result {
        let level = msg.ack.unwrap_or(self.cfg.default_ack());
        let applied = self.check_level(level).and_then(|()| {
            let dot = self.updates.remove_one(&msg.item)?;
            if dot.is_some() {
                self.local_change();
            }
            Ok((dot.is_some(), dot))
        });
        self.settle_handle(level, applied, ctx)
    }
}

impl Handler<ReserveTags> for Replica {
    type Result = ResponseActFuture<Self, Result<(), ReplicaError>>;
    fn handle(&mut self, msg: ReserveTags, _: &mut Context<Self>) -> Self::Result {
        let n = msg.0;
        let renewal = self.renewal_for(n);
        let renewed = async move {
            match renewal {
                Some((want, r)) => Some((want, r.await)),
                None => None,
            }
        };
        Box::pin(renewed.into_actor(self).map(move |renewed, act, _| {
            if let Some((want, r)) = renewed {
                act.on_renewal(want, r);
            }
            act.reserve_tags_for(n)
        }))
    }
}

impl Handler<Import> for Replica {
    type Result = ResponseFuture<Result<u64, ReplicaError>>;
    fn handle(&mut self, msg: Import, ctx: &mut Context<Self>) -> Self::Result {
        let level = msg.ack.unwrap_or(if self.core.pipeline.logged() {
            AckLevel::Durable
        } else {
            AckLevel::Local
        });
        let applied = self
            .check_level(level)
            .and_then(|()| self.do_import(&msg.occurrences, &msg.room));
        let added = *applied.as_ref().unwrap_or(&0);
        let answer = self.settle_handle(level, applied.map(|n| (n > 0, None)), ctx);
        Box::pin(async move { answer.await.map(|_| added) })
    }
}

impl Handler<Contains> for Replica {
    type Result = Result<bool, ReplicaError>;
    fn handle(&mut self, msg: Contains, _: &mut Context<Self>) -> Self::Result {
        super::reads::contains_one(&self.shared, &msg.0)
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
        let r = self.write_to_merge().merge(&msg.0);
        self.record_merge(MergeSource::Local, t, r.is_ok());
        r?;
        self.local_change();
        Ok(())
    }
}

impl Handler<Persist> for Replica {
    type Result = ResponseActFuture<Self, Result<(), ReplicaError>>;
    fn handle(&mut self, _: Persist, _: &mut Context<Self>) -> Self::Result {
        let Some(data) = self.core.snapshots.data().cloned() else {
            return Box::pin(actix::fut::ready(Ok(())));
        };
        Box::pin(
            self.snapshot_off_thread(data)
                .map(|r, act, _| act.snapshot_saved_now(r)),
        )
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
        let flush_by = tokio::time::Instant::now() + FINAL_FLUSH_TIMEOUT;
        <Self as Handler<ShutdownBy>>::handle(self, ShutdownBy(flush_by), ctx)
    }
}

impl Handler<ShutdownBy> for Replica {
    type Result = ResponseFuture<Result<(), ReplicaError>>;
    fn handle(
        &mut self,
        ShutdownBy(flush_by): ShutdownBy,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        self.close_to_updates();
        self.flush_delta(ctx);
        // Written commits' deltas waiting for their interval go out before the stop, and so
        // does any written meanwhile (its `Committed` may still be handled).
        self.core.pipeline.stopping();
        let held = self.core.pipeline.take_held();
        self.publish_held(held, ctx);
        // Nothing changed since the last snapshot, which is written (none is being written):
        // it is the final one already.
        crate::replica::crash::point(crate::replica::crash::SHUTDOWN_BEFORE_SNAPSHOT);
        let saved = if self.core.snapshots.settled() {
            Ok(())
        } else {
            self.snapshot_now()
        };
        crate::replica::crash::point(crate::replica::crash::SHUTDOWN_AFTER_SNAPSHOT);
        // The final snapshot holds every update: durable ones are answered, the others
        // (waiting for peers, or with no snapshot written) fail as stopped.
        let durable = (saved.is_ok() && self.core.snapshots.data().is_some())
            .then_some(self.core.pipeline.next_batch());
        self.answer_stopped(durable);
        let (done, flushed) = oneshot::channel();
        self.enqueue(super::pump::Outbound::Flush(done));
        ctx.stop();
        Box::pin(async move {
            let _ = tokio::time::timeout_at(flush_by, flushed).await;
            saved
        })
    }
}

impl Replica {
    /// Takes no update from now on. Under the write lock: an update applied in a
    /// subscription task is either in the state now, and so in the final commit and
    /// snapshot, or refused as stopped.
    pub(super) fn close_to_updates(&self) {
        let _f = self.write();
        self.shared.closed.store(true, Ordering::Release);
    }

    /// Answers, as the replica stops, what waits for a commit or an acknowledgement: durable
    /// if its commit is before `durable` (the final snapshot holds it), else failed as
    /// stopped.
    pub(super) fn answer_stopped(&mut self, durable: Option<u64>) {
        self.shared.commits.stopped(durable);
        let r = self.core.pipeline.acks.stop(durable);
        self.answer(r);
    }
}

impl ReplicaHandle {
    pub(crate) fn from_parts(addr: Addr<Replica>, shared: std::sync::Arc<Shared>) -> Self {
        let parts = std::sync::Arc::new(super::super::HandleParts { addr, shared });
        ReplicaHandle { parts }
    }
}

impl Replica {
    /// What `stats` reads: the core's figures, the filter's and the counts.
    pub(super) fn stats(&mut self) -> ReplicaStats {
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
            ready: self.core.anti_entropy.is_ready(),
            connected: self.io.transport.is_connected(),
            peers: self.core.anti_entropy.live_peers(Instant::now()),
            pending_delta,
            digest: format!("{digest:016x}"),
            awaiting_ack: self.core.pipeline.acks.len(),
            converged_peers,
            live_ids: self.core.lease.id_counts().0,
            retired_ids: self.core.lease.id_counts().1,
            id_lost: self.core.lease.lost(),
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
}
