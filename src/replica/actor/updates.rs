//! Updates of the request API (`add`, `remove`, `madd`, `mremove`): checked and applied here
//! for both ways they arrive.
//!
//! Adds to a grow-only kind (no removes, no version tags: `g_bloom`, `g_cuckoo`, their
//! scalable forms, `expiring_bloom`) at `local` are applied in the subscription task that
//! received them, like queries ([`super::reads`]): no hand-off to the actor's thread and back.
//! Any order of such adds gives the same state, so applying them beside the actor's own
//! updates reorders nothing that matters. Everything else goes to the actor: an update that
//! waits for a commit must be registered there before its delta can be taken (else a commit
//! could carry it before anyone waits for it), a tagged kind reserves tags from the actor's
//! lease, and removes must stay in order with adds. A task does not wait for the filter's
//! lock (the NATS connection shares its thread): when the lock is taken, the update goes to
//! the actor too. A request made in process (the RESP front end) tries a little longer
//! ([`Lock::Block`]), so that a commit in progress does not send it, and the requests behind
//! it that keep its order, through the actor.
//!
//! Either way an update is applied under the filter's write lock, so queries and merges see
//! it wholly or not at all; the actor learns of changes made outside it
//! ([`Shared::direct_changes`], set under the lock) before it digests, snapshots or commits
//! the state; and once the actor shuts down ([`Shared::closed`], set under the lock) no task
//! applies an update it could no longer save.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockWriteGuard, TryLockError};

use super::items::{check_item, prefetch_items_ahead};
use super::{Inbound, Shared};
use crate::Dot;
pub(crate) use crate::api::AddOutcome;
use crate::api::{AddMode, BatchAdded, Op, Request, Response};
use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;
use crate::replica::filter::{AnyFilter, NotRemovable};
use crate::replica::metrics::{OpKind, Telemetry};
use crate::wire::FilterKind;

/// How an update takes the filter's write lock.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// Waits for it (the actor).
    Wait,
    /// Only if free; else nothing is applied (a subscription task, which then hands the update
    /// to the actor). Marks the change for the actor under the lock.
    Try,
    /// Waits for it a little ([`BLOCK_WAIT`]), off the actor: a request made in process (the
    /// RESP front end), whose caller keeps the order of its requests and sends later ones
    /// through the actor too while one is there. A commit holds the lock for microseconds
    /// (taking the pending delta), a merge or a full-state encoding for much longer: the
    /// wait catches the first and hands the update to the actor on the others, never holding
    /// the I/O worker it runs on. Marks the change like [`Lock::Try`].
    Block,
}

/// How long [`Lock::Block`] tries for the lock.
const BLOCK_WAIT: std::time::Duration = std::time::Duration::from_micros(50);

/// An applied update: answered with `response` once it reached `level` (at once if it
/// changed nothing).
pub(super) struct Applied {
    pub level: AckLevel,
    pub changed: bool,
    pub response: Response,
    /// Applied outside the actor with `durable`: the commit it waits for.
    pub commit: Option<u64>,
}

/// What adding one item came to, under the lock.
pub(crate) struct AddApplied {
    pub outcome: AddOutcome,
    /// The tag an OR kind issued (an add made).
    pub dot: Option<Dot>,
    /// Whether it changed the state or recorded to the pending delta: it then waits for a
    /// commit at `logged` and `durable`.
    pub changed: bool,
    /// The commit a `durable` add waits for, applied outside the actor.
    pub commit: Option<u64>,
}

/// What adding a batch's items came to.
pub(crate) struct BatchAdd {
    /// Whether any item changed the state.
    pub applied_any: bool,
    /// Per item, whether it is in the filter after the add (false where refused).
    pub added: Vec<bool>,
    /// Per item, whether it was absent before its add (empty for [`AddMode::Always`]; false
    /// where refused).
    pub new_items: Vec<bool>,
    /// The refused items, in order.
    pub failed: Vec<usize>,
    /// The first refusal's error.
    pub error: Option<ReplicaError>,
    /// Applied with `durable`: the commit the changes wait for, if any.
    pub commit: Option<u64>,
}

/// Everything needed to check and apply an update of the request API.
pub(crate) struct Updates {
    pub shared: Arc<Shared>,
    pub default_ack: AckLevel,
    /// Whether the replica has a write-ahead log (`durable` needs one).
    pub has_wal: bool,
    /// Pending delta entries at which a commit is due (`delta_max_updates`).
    pub delta_max_updates: usize,
    /// The actor's inbound buffer, for the commit a full pending delta asks for.
    pub to_actor: flume::Sender<Inbound>,
}

impl Updates {
    /// Whether a subscription task may apply update `op` at `level` itself: adds to a
    /// grow-only kind, answered when applied (`local`, `logged`: see
    /// [`Updates::settle_in_task`]).
    pub(super) fn applies_in_task(&self, op: Op, level: AckLevel) -> bool {
        level.answered_at_apply() && self.grow_only_add(op)
    }

    /// Whether an update made in this process may be applied where it is made: as
    /// [`Updates::applies_in_task`], and at `durable` too, its answer then waiting for the
    /// commit that carries it (a [`super::CommitTicket`]).
    pub(super) fn applies_in_place(&self, op: Op, level: AckLevel) -> bool {
        let durable = level == AckLevel::Durable && self.has_wal;
        (level.answered_at_apply() || durable) && self.grow_only_add(op)
    }

    /// Whether `op` adds to a kind without tags or removes: what may be applied outside the
    /// actor, which issues tags.
    fn grow_only_add(&self, op: Op) -> bool {
        // A t-digest's reset is an inflation without tags too (it raises floors).
        matches!(
            op,
            Op::Add | Op::MAdd | Op::CmsIncrBy | Op::TopkAdd | Op::TdigestAdd | Op::TdigestReset
        ) && !self.kind().tagged()
            && !self.kind().removable()
    }

    /// The answer to an update applied outside the actor at `level`, which `changed` the
    /// state or not: a `logged` one that did asks for its commit within a millisecond, as the
    /// actor does for its own (the updates of that millisecond share the write and the delta).
    pub(super) fn settle_in_task(
        &self,
        level: AckLevel,
        changed: bool,
    ) -> Result<(), ReplicaError> {
        if level != AckLevel::Logged || !changed {
            return Ok(());
        }
        self.shared.want_logged_commit(&self.to_actor);
        self.logged_answer()
    }

    /// The answer to a `logged` update that changed the state: applied, and not durable if
    /// the log is known to have failed (said rather than promised).
    pub(super) fn logged_answer(&self) -> Result<(), ReplicaError> {
        if self.shared.wal_failed.load(Ordering::Acquire) {
            return Err(ReplicaError::NotDurable(
                "the write-ahead log failed and is recovering".into(),
            ));
        }
        Ok(())
    }

    /// The level a request asks for (`ack`, else the replica's default), refused if the
    /// replica cannot give it, before anything is applied.
    pub(super) fn level(&self, ack: Option<AckLevel>) -> Result<AckLevel, ReplicaError> {
        let level = ack.unwrap_or(self.default_ack);
        self.check_level(level)?;
        Ok(level)
    }

    /// Refuses a level this replica cannot give.
    pub(super) fn check_level(&self, level: AckLevel) -> Result<(), ReplicaError> {
        if level.needs_log() && !self.has_wal {
            return Err(ReplicaError::AckUnavailable(format!(
                "`{level}` needs a data_dir (and deltas, which full_state_only does not log)"
            )));
        }
        Ok(())
    }

    fn kind(&self) -> FilterKind {
        self.shared.kind
    }

    fn telemetry(&self) -> &Telemetry {
        &self.shared.telemetry
    }

    /// Applies update `request` at `level`. `reserve` reserves version tags before they are
    /// issued and answers the clock they reach (`u64::MAX` for an untagged kind); with
    /// `durable`, an update applied outside the actor answers the commit it waits for. A
    /// batch is checked whole first (its items, the kind), so that a refused batch changes
    /// nothing; its items are then applied in order, each all or nothing. `Ok(None)`: the
    /// lock was taken ([`Lock::Try`], [`Lock::Block`]) and nothing was applied.
    pub(super) fn apply(
        &self,
        request: &Request,
        level: AckLevel,
        lock: Lock,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
        durable: bool,
    ) -> Result<Option<Applied>, ReplicaError> {
        let applied = |changed, response, commit| {
            Some(Applied {
                level,
                changed,
                response,
                commit,
            })
        };
        let checked = |items: &crate::api::Items| {
            items
                .check(self.shared.limits)
                .map_err(|e| ReplicaError::InvalidItem(e.to_string()))
        };
        // A `replicated` add is answered once a peer confirmed the delta holding it, so the
        // delta must hold it even if the state had it already: an earlier add of it may
        // never have reached a peer (found by the simulation, `sim::tests`).
        let footprint = level == AckLevel::Replicated;
        match request {
            Request::Add { item, mode, .. } => {
                let Some(AddApplied {
                    outcome,
                    changed,
                    commit,
                    ..
                }) = self.add_one(item, *mode, lock, reserve, durable, footprint)?
                else {
                    return Ok(None);
                };
                let response = Response::Added {
                    mode: *mode,
                    outcome,
                };
                Ok(applied(changed, response, commit))
            }
            Request::Remove { item, .. } => {
                let removed = self.remove_one(item)?.is_some();
                Ok(applied(removed, Response::Removed(removed), None))
            }
            Request::MAdd { items, mode, .. } => {
                checked(items)?;
                let Some(added) =
                    self.add_items(&items.slices(), *mode, lock, reserve, durable, footprint)?
                else {
                    return Ok(None);
                };
                let (changed, commit) = (added.applied_any, added.commit);
                let response = Response::MAdded(BatchAdded {
                    mode: *mode,
                    added: added.added,
                    new_items: added.new_items,
                    failed: added.failed,
                    error: added.error.map(|e| e.to_string()),
                });
                Ok(applied(changed, response, commit))
            }
            Request::MRemove { items, .. } => {
                if !self.kind().removable() {
                    return Err(NotRemovable(self.kind()).into());
                }
                checked(items)?;
                let removed = self.mremove(&items.slices())?;
                let changed = removed.contains(&true);
                Ok(applied(changed, Response::MRemoved(removed), None))
            }
            Request::CmsIncrBy {
                items, increments, ..
            } => {
                let Some(mut f) = self.filter_write(lock)? else {
                    return Ok(None);
                };
                let (max, telemetry) = (self.shared.limits.max_item_bytes, self.telemetry());
                let counts =
                    crate::replica::sketch::incr_by(&mut f, items, increments, max, telemetry)?;
                let changed = increments.iter().any(|&n| n > 0);
                let commit = match changed {
                    true => self.changed_under(&f, lock, durable),
                    false => self.unchanged_under(lock, durable),
                };
                Ok(applied(changed, Response::CmsIncremented(counts), commit))
            }
            Request::TopkAdd {
                items, increments, ..
            } => {
                let Some(mut f) = self.filter_write(lock)? else {
                    return Ok(None);
                };
                let (max, telemetry) = (self.shared.limits.max_item_bytes, self.telemetry());
                let (expelled, changed) =
                    crate::replica::topk::add(&mut f, items, increments, max, telemetry)?;
                let commit = match changed {
                    true => self.changed_under(&f, lock, durable),
                    false => self.unchanged_under(lock, durable),
                };
                Ok(applied(changed, Response::TopkAdded(expelled), commit))
            }
            Request::TdigestAdd { .. } | Request::TdigestReset { .. } => {
                let Some(mut f) = self.filter_write(lock)? else {
                    return Ok(None);
                };
                let values = match request {
                    Request::TdigestAdd { values, bounds, .. } => Some((&values[..], *bounds)),
                    _ => None,
                };
                let changed = crate::replica::tdigest::update(&mut f, values, self.telemetry())?;
                let commit = match changed {
                    true => self.changed_under(&f, lock, durable),
                    false => self.unchanged_under(lock, durable),
                };
                Ok(applied(changed, Response::TdigestUpdated, commit))
            }
            other => unreachable!("{:?} is not an update", other.op()),
        }
    }

    /// Adds one item as `mode` says, under the filter's write lock taken as `lock` says.
    /// `Ok(None)`: the lock was taken ([`Lock::Try`], [`Lock::Block`]) and nothing was applied.
    pub(super) fn add_one(
        &self,
        item: &[u8],
        mode: AddMode,
        lock: Lock,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
        durable: bool,
        footprint: bool,
    ) -> Result<Option<AddApplied>, ReplicaError> {
        check_item(item, self.shared.limits.max_item_bytes)
            .and_then(|()| reserve().map(|_| ()))
            .inspect_err(|_| self.telemetry().op(OpKind::Add, false))?;
        let Some(mut f) = self.filter_write(lock)? else {
            return Ok(None);
        };
        if self.kind().clocked() {
            let now = self
                .shared
                .clock
                .for_updates(f.clock_bounds())
                .inspect_err(|_| self.telemetry().op(OpKind::Add, false))?;
            f.tick(now);
        }
        // Judged under the write lock: of two adds of one new item on this replica, exactly
        // one is told it was new.
        let r = match mode {
            AddMode::Always => f.add(item).map(|dot| (AddOutcome::Known, dot)),
            // One pass where the kind can (a Bloom filter's bits tell it).
            AddMode::ReportNew => f.add_new(item).map(|new| {
                let outcome = match new {
                    true => AddOutcome::New,
                    false => AddOutcome::Known,
                };
                (outcome, None)
            }),
            AddMode::IfAbsent if f.contains(item) => Ok((AddOutcome::Skipped, None)),
            AddMode::IfAbsent => f.add(item).map(|dot| (AddOutcome::New, dot)),
        };
        let r = r.map_err(ReplicaError::from);
        let mut commit = None;
        let mut changed = false;
        if let Ok((outcome, _)) = &r {
            // A skipped add of an item held only by merges is logged too: it is answered as
            // contained, so it must stay contained.
            let recorded = match footprint {
                true => f.record_footprint(item),
                false => self.shared.unlogged.record_add(&mut f, item),
            };
            changed = *outcome != AddOutcome::Skipped || recorded;
            commit = match changed {
                true => self.changed_under(&f, lock, durable),
                false => self.unchanged_under(lock, durable),
            };
        }
        drop(f);
        self.telemetry().op(OpKind::Add, r.is_ok());
        r.map(|(outcome, dot)| {
            Some(AddApplied {
                outcome,
                dot,
                changed,
                commit,
            })
        })
    }

    /// Removes one occurrence of `item` (OR kinds): the tag of the entry removed, `None` if
    /// it was not contained.
    pub(super) fn remove_one(&self, item: &[u8]) -> Result<Option<Dot>, ReplicaError> {
        let r = check_item(item, self.shared.limits.max_item_bytes).and_then(|()| {
            let mut f = self.filter_write(Lock::Wait)?.expect("waited for");
            f.remove(item).map_err(ReplicaError::from)
        });
        self.telemetry().op(OpKind::Remove, r.is_ok());
        r
    }

    fn mremove(&self, items: &[&[u8]]) -> Result<Vec<bool>, ReplicaError> {
        let mut f = self.filter_write(Lock::Wait)?.expect("waited for");
        let removed = items
            .iter()
            .map(|&i| f.remove(i).map(|d| d.is_some()))
            .collect::<Result<Vec<bool>, NotRemovable>>()?;
        drop(f);
        self.telemetry()
            .count_ops(OpKind::Remove, items.len() as u64, 0);
        Ok(removed)
    }

    /// Adds a batch's items: a refused item (a full cuckoo table, tags not reserved) is
    /// reported and the others are applied. `Ok(None)`: the lock was taken before any item
    /// was applied ([`Lock::Try`] and [`Lock::Block`] are only used for untagged kinds,
    /// whose batch takes the lock once). With an [`AddMode`] other than `Always`,
    /// [`BatchAdd::new_items`] says which items were new.
    pub(super) fn add_items(
        &self,
        items: &[&[u8]],
        mode: AddMode,
        lock: Lock,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
        durable: bool,
        footprint: bool,
    ) -> Result<Option<BatchAdd>, ReplicaError> {
        let mut added = Vec::with_capacity(items.len());
        // Which items were absent before their add (with a mode); refused items stay false.
        let mut new_items = vec![
            false;
            if mode == AddMode::Always {
                0
            } else {
                items.len()
            }
        ];
        let mut applied_any = false;
        let mut commit = None;
        let mut failed = Vec::new();
        let mut first_error: Option<ReplicaError> = None;
        let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut refused = |i: usize, e: ReplicaError, added: &mut Vec<bool>| {
            added.push(false);
            failed.push(i);
            *reasons.entry(e.reason()).or_default() += 1;
            first_error.get_or_insert(e);
        };
        let mut i = 0;
        while i < items.len() {
            // Tags are reserved before they are issued; then one write lock covers as many
            // items as the reservation does (all of them for untagged kinds): a lock per item
            // cost about a tenth of a batch.
            let limit = match reserve() {
                Ok(limit) => limit,
                Err(e) => {
                    refused(i, e, &mut added);
                    i += 1;
                    continue;
                }
            };
            let Some(mut f) = self.filter_write(lock)? else {
                debug_assert_eq!(i, 0, "a batch of an untagged kind takes the lock once");
                return Ok(None);
            };
            if self.kind().clocked() {
                match self.shared.clock.for_updates(f.clock_bounds()) {
                    Ok(now) => {
                        f.tick(now);
                    }
                    // Each item refused alike (a lock each: the clock may be corrected).
                    Err(e) => {
                        drop(f);
                        refused(i, e, &mut added);
                        i += 1;
                        continue;
                    }
                }
            }
            let first = i;
            let ahead = f.prefetch_ahead();
            let footprints = footprint || self.shared.unlogged.footprints();
            let mut changed = false;
            while i < items.len() && f.clock() < limit {
                prefetch_items_ahead(items, i, ahead, |i| f.prefetch_add(i));
                let outcome = match mode {
                    AddMode::Always => f.add(items[i]).map(|_| false),
                    AddMode::ReportNew => f.add_new(items[i]),
                    AddMode::IfAbsent if f.contains(items[i]) => {
                        added.push(true);
                        changed |= footprints && f.record_footprint(items[i]);
                        i += 1;
                        continue;
                    }
                    AddMode::IfAbsent => f.add(items[i]).map(|_| true),
                };
                match outcome {
                    Ok(new) => {
                        added.push(true);
                        if footprints {
                            f.record_footprint(items[i]);
                        }
                        changed = true;
                        if new {
                            new_items[i] = true;
                        }
                    }
                    Err(e) => refused(i, e.into(), &mut added),
                }
                i += 1;
            }
            if changed {
                applied_any = true;
                commit = commit.max(self.changed_under(&f, lock, durable));
            } else {
                commit = commit.max(self.unchanged_under(lock, durable));
            }
            drop(f);
            if i == first {
                // A reservation that succeeded leaves room for a tag: never loop forever if
                // it somehow did not.
                refused(i, ReplicaError::TagsUnreserved, &mut added);
                i += 1;
            }
        }
        let ok = (added.len() - failed.len()) as u64;
        self.telemetry()
            .count_ops(OpKind::Add, ok, failed.len() as u64);
        for (reason, count) in reasons {
            self.telemetry().api_errors(reason, count);
        }
        Ok(Some(BatchAdd {
            applied_any,
            added,
            new_items,
            failed,
            error: first_error,
            commit,
        }))
    }

    /// Outside the actor ([`Lock::Try`], [`Lock::Block`]), tells it the state changed, and asks it for a commit
    /// once the pending delta is full (once until it commits). Called under the write lock
    /// `f`, so that the actor never digests the new state as the old one. With `durable`,
    /// the change waits for its commit: the number of that commit, which is asked for now
    /// and told to fsync (see [`super::commits`]).
    fn changed_under(&self, f: &AnyFilter, lock: Lock, durable: bool) -> Option<u64> {
        if lock == Lock::Wait {
            return None;
        }
        let commit = durable.then(|| self.open_commit());
        self.shared.direct_changes.store(true, Ordering::Release);
        self.shared.want_flush(&self.to_actor);
        if durable || f.pending_delta_len() >= self.delta_max_updates {
            self.shared.want_commit(&self.to_actor);
        }
        commit
    }

    /// Outside the actor, an update that changed nothing: with `durable`, it still waits for
    /// a commit, which syncs what earlier commits only wrote (the update rests on them).
    fn unchanged_under(&self, lock: Lock, durable: bool) -> Option<u64> {
        if lock == Lock::Wait || !durable {
            return None;
        }
        let commit = self.open_commit();
        self.shared.want_commit(&self.to_actor);
        Some(commit)
    }

    /// The commit that an update applied now, outside the actor, is in; told to fsync.
    fn open_commit(&self) -> u64 {
        let batch = self.shared.open_batch.load(Ordering::Acquire);
        self.shared.sync_through.fetch_max(batch, Ordering::AcqRel);
        batch
    }

    /// The write lock, or `None` if it is taken and `lock` is [`Lock::Try`];
    /// [`ReplicaError::Stopped`] once the replica shut down.
    fn filter_write(
        &self,
        lock: Lock,
    ) -> Result<Option<RwLockWriteGuard<'_, AnyFilter>>, ReplicaError> {
        let f = match lock {
            Lock::Wait => self.shared.filter.write().expect("filter lock poisoned"),
            Lock::Try | Lock::Block => {
                // Read only once the lock is found taken: the clock costs more than the lock.
                let mut since = None;
                loop {
                    match self.shared.filter.try_write() {
                        Ok(f) => break f,
                        Err(TryLockError::WouldBlock)
                            if lock == Lock::Block
                                && since.get_or_insert_with(std::time::Instant::now).elapsed()
                                    < BLOCK_WAIT =>
                        {
                            std::thread::yield_now()
                        }
                        Err(TryLockError::WouldBlock) => return Ok(None),
                        Err(TryLockError::Poisoned(_)) => panic!("filter lock poisoned"),
                    }
                }
            }
        };
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(ReplicaError::Stopped);
        }
        Ok(Some(f))
    }
}

#[cfg(test)]
mod tests {
    use super::super::reply::{ApiReply, nats_request};
    use super::*;
    use crate::FilterSpec;
    use crate::api::batch;
    use crate::api::batch::Limits;
    use crate::api::{ADD_MODE_HEADER, ReplyFormat};
    use crate::replica::durable::Identity;
    use crate::transport::Message;

    fn updates(kind: FilterKind, delta_max_updates: usize) -> (Updates, flume::Receiver<Inbound>) {
        let mut filter = AnyFilter::new(&FilterSpec::new(kind, 1_000, 0.01), 1).unwrap();
        filter.track_deltas(true);
        let identity = Identity {
            uuid: uuid::Uuid::new_v4(),
            replica: 1,
        };
        let shared = Arc::new(Shared::new(
            filter,
            "t".into(),
            identity,
            Telemetry::new("t", 1, 0.01, false),
            u64::MAX,
            Limits::new(1_000, 1024),
            true,
        ));
        let (to_actor, from_tasks) = flume::bounded(8);
        let updates = Updates {
            shared,
            default_ack: AckLevel::Local,
            has_wal: false,
            delta_max_updates,
            to_actor,
        };
        (updates, from_tasks)
    }

    fn add(item: &str) -> Message {
        Message {
            subject: "crpf.t.api.add".into(),
            payload: bytes::Bytes::copy_from_slice(item.as_bytes()),
            reply: None,
            headers: None,
        }
    }

    fn madd(items: &[&str]) -> Message {
        Message {
            subject: "crpf.t.api.madd".into(),
            payload: batch::encode(items).unwrap().into(),
            ..add("")
        }
    }

    /// Applies NATS request `msg` of `op` as the request path does: read at the NATS edge,
    /// then applied typed.
    fn apply_msg(
        u: &Updates,
        op: Op,
        level: AckLevel,
        msg: &Message,
        lock: Lock,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
    ) -> Result<Option<Applied>, ReplicaError> {
        let (request, _) = nats_request(Some(op.name()), "crpf.t.api", msg, u.shared.limits)?;
        u.apply(&request, level, lock, reserve, false)
    }

    /// A `replicated` add is answered once a peer confirmed its delta, so its delta holds the
    /// item even when the state had it already (an earlier add's delta may never have
    /// reached a peer); at the other levels an add that changes nothing has no delta.
    #[test]
    fn a_replicated_add_of_an_item_held_already_carries_it_in_its_delta() {
        for kind in [FilterKind::GBloom, FilterKind::GCuckoo] {
            for many in [false, true] {
                let (u, _rx) = updates(kind, 1_000);
                let msg = if many { madd(&["x"]) } else { add("x") };
                let op = if many { Op::MAdd } else { Op::Add };
                let apply = |level| {
                    apply_msg(&u, op, level, &msg, Lock::Wait, &mut || Ok(u64::MAX))
                        .unwrap()
                        .unwrap()
                };
                apply(AckLevel::Local);
                let taken = |u: &Updates| u.shared.filter.write().unwrap().take_delta();
                assert!(taken(&u).is_some(), "{kind}: the first add's delta");
                if kind == FilterKind::GBloom {
                    apply(AckLevel::Local);
                    assert!(taken(&u).is_none(), "{kind}: a local re-add sets no bit");
                }
                let again = apply(AckLevel::Replicated);
                assert!(again.changed, "{kind} many={many}: waits for its commit");
                let delta = taken(&u).expect("a replicated re-add has a delta");
                let mut peer = AnyFilter::new(&FilterSpec::new(kind, 1_000, 0.01), 2).unwrap();
                peer.merge_delta_bytes(&delta).unwrap();
                assert!(
                    peer.contains(b"x"),
                    "{kind} many={many}: the delta holds the item"
                );
            }
        }
    }

    fn try_add(u: &Updates, op: Op, msg: &Message) -> Result<Option<Applied>, ReplicaError> {
        apply_msg(u, op, AckLevel::Local, msg, Lock::Try, &mut || Ok(u64::MAX))
    }

    fn contains(u: &Updates, item: &str) -> bool {
        u.shared.filter.read().unwrap().contains(item.as_bytes())
    }

    /// The NATS reply of an applied update, in `format`: its headers and body.
    fn reply_of(applied: Applied, format: ReplyFormat) -> (async_nats::HeaderMap, bytes::Bytes) {
        let body = ApiReply::of(applied.response, format);
        let (_, headers, payload) = body.finish(1, None, Some(String::new())).unwrap();
        (headers, payload)
    }

    fn with_mode(mut msg: Message, mode: AddMode) -> Message {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ADD_MODE_HEADER, mode.name());
        msg.headers = Some(headers);
        msg
    }

    #[test]
    fn add_modes_say_which_items_were_new_and_if_absent_adds_only_those() {
        for kind in [
            FilterKind::GBloom,
            FilterKind::GCuckoo,
            FilterKind::OrCuckoo,
        ] {
            let (u, _rx) = updates(kind, 1 << 20);
            let apply = |op, msg: &Message| {
                apply_msg(&u, op, AckLevel::Local, msg, Lock::Wait, &mut || {
                    Ok(u64::MAX)
                })
                .unwrap()
                .unwrap()
            };
            let body = |op, msg: Message| {
                let applied = apply(op, &msg);
                (applied.changed, reply_of(applied, ReplyFormat::Json).1)
            };
            let report = |item| with_mode(add(item), AddMode::ReportNew);
            let if_absent = |item| with_mode(add(item), AddMode::IfAbsent);
            assert_eq!(body(Op::Add, add("a")).1, &b"{\"added\":true}"[..]);
            assert_eq!(
                body(Op::Add, report("x")),
                (
                    true,
                    bytes::Bytes::from_static(b"{\"added\":true,\"new\":true}")
                ),
                "{kind}"
            );
            assert_eq!(
                body(Op::Add, report("x")).1,
                &b"{\"added\":true,\"new\":false}"[..]
            );
            assert_eq!(
                body(Op::Add, if_absent("y")).1,
                &b"{\"added\":true,\"new\":true}"[..]
            );
            let pending = u.shared.filter.read().unwrap().pending_delta_len();
            assert_eq!(
                body(Op::Add, if_absent("y")),
                (
                    false,
                    bytes::Bytes::from_static(b"{\"added\":false,\"new\":false}")
                ),
                "{kind}: an item present is not added again"
            );
            assert_eq!(u.shared.filter.read().unwrap().pending_delta_len(), pending);
            assert!(body(Op::Add, with_mode(add("z"), AddMode::Always)).0);
            assert!(matches!(
                apply_msg(
                    &u,
                    Op::Add,
                    AckLevel::Local,
                    &with_mode(add("q"), AddMode::Always),
                    Lock::Wait,
                    &mut || Ok(u64::MAX)
                ),
                Ok(Some(_))
            ));
            let mut bad = add("w");
            bad.headers = Some(async_nats::HeaderMap::new());
            bad.headers
                .as_mut()
                .unwrap()
                .insert(ADD_MODE_HEADER, "maybe");
            assert!(matches!(
                apply_msg(&u, Op::Add, AckLevel::Local, &bad, Lock::Wait, &mut || Ok(
                    u64::MAX
                )),
                Err(ReplicaError::InvalidItem(_))
            ));
            assert!(!contains(&u, "w"), "{kind}: a refused add changes nothing");

            // Batches: JSON lists which were new; the bitmap's bits are those.
            let (_, json) = body(
                Op::MAdd,
                with_mode(madd(&["x", "n1", "n1"]), AddMode::ReportNew),
            );
            let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
            assert_eq!(
                json,
                serde_json::json!({"added": 3, "new": [false, true, false]})
            );
            let mut bits = with_mode(madd(&["n2", "y", "n2", "n3"]), AddMode::IfAbsent);
            bits.headers
                .as_mut()
                .unwrap()
                .insert(crate::api::REPLY_HEADER, ReplyFormat::Bitmap.name());
            let (headers, bitmap) = reply_of(apply(Op::MAdd, &bits), ReplyFormat::Bitmap);
            assert_eq!(
                batch::decode_bitmap(&bitmap, 4).unwrap(),
                [true, false, false, true],
                "{kind}"
            );
            assert!(headers.get(crate::api::FAILED_HEADER).is_none());
        }
    }

    #[test]
    fn only_local_adds_to_grow_only_kinds_are_applied_in_a_task() {
        let (g, _rx) = updates(FilterKind::GBloom, 1 << 20);
        assert!(g.applies_in_task(Op::Add, AckLevel::Local));
        assert!(g.applies_in_task(Op::MAdd, AckLevel::Local));
        for level in [AckLevel::Durable, AckLevel::Replicated] {
            assert!(
                !g.applies_in_task(Op::Add, level),
                "{level:?} waits for a commit"
            );
        }
        for kind in [FilterKind::OrCuckoo, FilterKind::CountingCuckoo] {
            let (u, _rx) = updates(kind, 1 << 20);
            assert!(!u.applies_in_task(Op::Add, AckLevel::Local), "{kind}");
        }
    }

    #[test]
    fn a_task_applies_nothing_while_the_lock_is_taken_and_hands_the_add_on() {
        let (u, _rx) = updates(FilterKind::GCuckoo, 1 << 20);
        for (op, msg) in [(Op::Add, add("a")), (Op::MAdd, madd(&["a", "b"]))] {
            let held = u.shared.filter.write().unwrap();
            assert!(try_add(&u, op, &msg).unwrap().is_none());
            drop(held);
            assert!(!contains(&u, "a") && !contains(&u, "b"));
            assert!(!u.shared.direct_changes.load(Ordering::Acquire));
        }
        // Waiting for it (the actor's way) applies the add.
        let msg = madd(&["a", "b"]);
        let applied = apply_msg(&u, Op::MAdd, AckLevel::Local, &msg, Lock::Wait, &mut || {
            Ok(u64::MAX)
        });
        assert!(applied.unwrap().unwrap().changed);
        assert!(contains(&u, "a") && contains(&u, "b"));
    }

    #[test]
    fn a_task_marks_its_change_and_asks_once_for_a_flush_and_the_commit_of_a_full_delta() {
        let (u, rx) = updates(FilterKind::GBloom, 1);
        let applied = try_add(&u, Op::Add, &add("a")).unwrap().unwrap();
        assert!(applied.changed && contains(&u, "a"));
        assert!(u.shared.direct_changes.load(Ordering::Acquire));
        // A flush, since none was scheduled, and a commit, since the delta is full.
        assert!(matches!(rx.try_recv(), Ok(Inbound::Wake)));
        assert!(matches!(rx.try_recv(), Ok(Inbound::Commit)));
        // Each asked once until the actor acts (and clears the request).
        try_add(&u, Op::MAdd, &madd(&["b", "c"])).unwrap().unwrap();
        assert!(rx.try_recv().is_err());
        u.shared.commit_requested.store(false, Ordering::Release);
        try_add(&u, Op::Add, &add("d")).unwrap().unwrap();
        assert!(matches!(rx.try_recv(), Ok(Inbound::Commit)));
        assert!(rx.try_recv().is_err(), "the flush is still scheduled");
        u.shared.flush_scheduled.store(false, Ordering::Release);
        u.shared.commit_requested.store(false, Ordering::Release);
        try_add(&u, Op::Add, &add("e")).unwrap().unwrap();
        assert!(matches!(rx.try_recv(), Ok(Inbound::Wake)));
    }

    #[test]
    fn after_shutdown_a_task_refuses_adds_as_stopped_and_applies_nothing() {
        let (u, _rx) = updates(FilterKind::GBloom, 1 << 20);
        u.shared.closed.store(true, Ordering::Release);
        for (op, msg) in [(Op::Add, add("a")), (Op::MAdd, madd(&["a"]))] {
            assert!(matches!(try_add(&u, op, &msg), Err(ReplicaError::Stopped)));
        }
        assert!(!contains(&u, "a"));
        assert!(!u.shared.direct_changes.load(Ordering::Acquire));
    }
}
