//! Queries of the request API (`contains`, `mcontains`) answered off the actor: in the task
//! of the subscription they arrive on, from the shared state under its read lock, and
//! published from there. A query thus costs no hand-off to the actor's thread and back and
//! never waits behind replication work in the mailbox.
//!
//! What a query sees: every update (an add, a remove, one merged delta or state) is applied
//! under one write lock, by the actor or by a subscription task ([`super::updates`]), so a
//! query sees each wholly or not at all, never a torn state; an update acknowledged to a
//! client is applied, so a query sent after the acknowledgement sees it. The items of one
//! batch update are applied one by one: a concurrent query may see some of them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde_json::json;
use tokio::sync::oneshot;

use super::items::{check_item, map_prefetched};
use super::pump::{Refused, offer};
use super::reply::{ApiReply, ApiResponse, ReplyTo, api_reply_format, failure_reply};
use super::updates::{AddOutcome, BatchAdd, InPlace, Lock, Updates};
use super::{Route, Shared};
use crate::ReplicaId;
use crate::api::batch::{self, Limits};
use crate::api::{AddMode, Op, ReplyFormat};
use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;
use crate::replica::metrics::{Channel, Direction, OpKind};
use crate::replica::service::ApiService;
use crate::transport::{Message, Subjects};

/// A request to the replica's own API subjects that its node received for it
/// ([`crate::replica::ReplicaConfig::catalog_hosted`]): answered here or handed to the
/// actor, as the replica's own subscription task would ([`Reads::route`]). Before the replica
/// serves its API it is refused as not serving: the subscription is the node's, and silence
/// would cost the requester a whole timeout. The reply to publish, if any.
pub(crate) fn route_own_api(shared: &Shared, msg: Message) -> Option<(String, HeaderMap, Bytes)> {
    let api = shared.api.load();
    let Some(reads) = api.as_ref() else {
        return refusal(shared.identity.replica, msg, &shared.not_serving());
    };
    match reads.route(msg) {
        Route::Actor(item) => {
            // A full buffer drops it and counts; a closed one means the replica stopped.
            let _ = offer(shared, &reads.updates.to_actor, item);
            None
        }
        Route::Drop => None,
        Route::Reply(to, headers, payload) => Some((to, headers, payload)),
    }
}

/// The error answer `e` to a request, from replica `replica` (or the node of that id): the
/// reply to publish, if the request wants one.
pub(crate) fn refusal(
    replica: ReplicaId,
    msg: Message,
    e: &ReplicaError,
) -> Option<(String, HeaderMap, Bytes)> {
    let to = ReplyTo::Subject(msg.reply?);
    match failure_reply(e).finish(replica, Some(to)) {
        Some((ReplyTo::Subject(to), headers, payload)) => Some((to, headers, payload)),
        _ => None,
    }
}

/// Everything a subscription task needs to answer queries itself.
pub(crate) struct Reads {
    pub shared: Arc<Shared>,
    pub subjects: Arc<Subjects>,
    pub service: Arc<ApiService>,
    pub replica: ReplicaId,
    /// Applies some updates here too ([`Updates::applies_in_task`]).
    pub updates: Arc<Updates>,
}

/// What [`Reads::answer`] came to.
enum Answer {
    /// Answered here.
    Here(ApiReply),
    /// For the actor.
    Actor,
}

impl Reads {
    /// Where a request from NATS goes: answered here if it is a query (or an update applied
    /// here), else to the actor.
    pub(super) fn route(&self, msg: Message) -> Route {
        let op = self
            .subjects
            .api_op(&msg.subject)
            .and_then(|op| op.parse::<Op>().ok());
        let answer = if self.shared.closed.load(Ordering::Acquire) {
            // Stopping (its filter dropped, its node shutting down): refused at once, so that
            // a requester learns it now, not after its timeout once the subscription is gone
            // (or the actor dropped what it was handed).
            let mut body = failure_reply(&ReplicaError::Stopped);
            body.served = Some(self.service.serve(&msg.subject));
            Answer::Here(body)
        } else {
            self.answer(op, &msg, Lock::Try)
        };
        match answer {
            Answer::Here(body) => {
                match body.finish(self.replica, msg.reply.map(ReplyTo::Subject)) {
                    Some((ReplyTo::Subject(to), headers, payload)) => {
                        self.shared
                            .telemetry
                            .traffic(Direction::Out, Channel::Api, payload.len());
                        Route::Reply(to, headers, payload)
                    }
                    _ => Route::Drop,
                }
            }
            Answer::Actor => Route::Actor(super::Inbound::Api(Box::new(msg))),
        }
    }

    /// Answers a request made in this process: here where [`Reads::route`] would (unless
    /// `queued`), else through the actor's inbound buffer ([`ReplicaError::Busy`] if it is
    /// full).
    pub(crate) fn in_process(
        &self,
        op: Op,
        payload: Bytes,
        headers: Option<HeaderMap>,
        queued: bool,
    ) -> PendingResponse {
        let msg = Message {
            subject: self.subjects.api_subject(op.name()),
            payload,
            reply: None,
            headers,
        };
        let answer = if queued {
            Answer::Actor
        } else {
            self.answer(Some(op), &msg, Lock::Block)
        };
        match answer {
            Answer::Here(body) => {
                let (_, headers, payload) = body
                    .finish(self.replica, Some(ReplyTo::Subject(String::new())))
                    .expect("a reply was asked for");
                PendingResponse::Ready(Some(ApiResponse { headers, payload }))
            }
            Answer::Actor => {
                let (tx, rx) = oneshot::channel();
                match offer(
                    &self.shared,
                    &self.updates.to_actor,
                    super::Inbound::InProcess(Box::new(msg), tx),
                ) {
                    Ok(()) => PendingResponse::Actor(rx),
                    Err(Refused::Full) => PendingResponse::Failed(ReplicaError::Busy),
                    Err(Refused::Closed) => PendingResponse::Failed(ReplicaError::Stopped),
                }
            }
        }
    }

    /// `contains` of one item made in this process, answered typed: no subject, headers or
    /// JSON (the RESP front end's commonest command). Counted in the replica's metrics, not on
    /// its `$SRV` endpoints, which count the requests that came over NATS.
    pub(crate) fn contains_now(&self, item: &[u8]) -> Result<bool, ReplicaError> {
        self.shared
            .telemetry
            .traffic(Direction::In, Channel::Api, item.len());
        contains_one(&self.shared, item).inspect_err(|e| {
            self.shared.telemetry.api_errors(e.reason(), 1);
        })
    }

    /// `add` of one item made in this process, applied here and answered typed where a
    /// request would be applied here ([`Updates::applies_in_task`]: a grow-only kind at
    /// `local` or `logged`) and the filter's lock comes within [`Lock::Block`]'s wait. `ack`: the level
    /// asked for (unset: the replica's default). `None`: nothing was applied; the request
    /// path takes it.
    pub(crate) fn add_now(
        &self,
        item: &[u8],
        mode: AddMode,
        ack: Option<AckLevel>,
    ) -> Option<Result<InPlace<AddOutcome>, ReplicaError>> {
        self.update_now(Op::Add, ack, item.len(), |updates, durable| {
            let added = updates.add_one(item, mode, Lock::Block, &mut || Ok(u64::MAX), durable)?;
            Ok(added.map(|a| (a.outcome, a.changed, a.commit)))
        })
    }

    /// `mcontains` of `items` made in this process, answered typed (see
    /// [`Reads::contains_now`]). The caller checked the items against the replica's limits.
    pub(crate) fn mcontains_now(&self, items: &[&[u8]]) -> Vec<bool> {
        self.shared
            .telemetry
            .traffic(Direction::In, Channel::Api, batch_bytes(items));
        contains_each(&self.shared, items)
    }

    /// `madd` of `items` in `mode` made in this process, applied and answered typed where
    /// [`Reads::add_now`] would apply an `add`; `None`: nothing was applied. The caller
    /// checked the items against the replica's limits.
    pub(crate) fn madd_now(
        &self,
        items: &[&[u8]],
        mode: AddMode,
        ack: Option<AckLevel>,
    ) -> Option<Result<InPlace<BatchAdd>, ReplicaError>> {
        self.update_now(Op::MAdd, ack, batch_bytes(items), |updates, durable| {
            let added = updates.add_items(items, mode, Lock::Block, &mut || Ok(u64::MAX), durable);
            Ok(added?.map(|batch| {
                let (changed, commit) = (batch.applied_any, batch.commit);
                (batch, changed, commit)
            }))
        })
    }

    /// Update `op` (of `bytes`) at `ack` made in this process: `apply` runs it if it is
    /// applied here (told whether it is `durable`; answering its outcome, whether it changed
    /// the state, and the commit it then waits for), and answers `None` if it was not (the
    /// lock held too long). Counted and settled
    /// ([`Updates::settle_in_task`]) as the request path does.
    fn update_now<T>(
        &self,
        op: Op,
        ack: Option<AckLevel>,
        bytes: usize,
        apply: impl FnOnce(&Updates, bool) -> Result<Option<(T, bool, Option<u64>)>, ReplicaError>,
    ) -> Option<Result<InPlace<T>, ReplicaError>> {
        let updates = &self.updates;
        let level = ack.unwrap_or(updates.default_ack);
        if let Err(e) = updates.check_level(level) {
            return Some(Err(e));
        }
        if !updates.applies_in_place(op, level) {
            return None;
        }
        let durable = level == AckLevel::Durable;
        let applied =
            apply(updates, durable)
                .transpose()?
                .and_then(|(outcome, changed, commit)| {
                    updates.settle_in_task(level, changed)?;
                    let ticket = commit.map(|batch| self.shared.commits.ticket(batch));
                    Ok(InPlace { outcome, ticket })
                });
        self.shared
            .telemetry
            .traffic(Direction::In, Channel::Api, bytes);
        Some(applied.inspect_err(|e| self.shared.telemetry.api_errors(e.reason(), 1)))
    }

    /// The answer of a request here, or [`Answer::Actor`] if the actor gives it; an update
    /// applied here takes the filter's lock as `lock` says.
    fn answer(&self, op: Option<Op>, msg: &Message, lock: Lock) -> Answer {
        if let Some(op) = op
            && op.is_update()
        {
            return self.update(op, msg, lock);
        }
        if !matches!(
            op,
            Some(Op::Contains | Op::MContains | Op::Count | Op::MCount)
        ) {
            return Answer::Actor;
        }
        self.shared
            .telemetry
            .traffic(Direction::In, Channel::Api, msg.payload.len());
        let served = self.service.serve(&msg.subject);
        let result = match op {
            Some(op @ (Op::Count | Op::MCount)) => {
                count_reply(&self.filter(), op, msg, self.shared.limits)
            }
            _ => query_reply(&self.shared, op == Some(Op::MContains), msg),
        };
        let mut body = match result {
            Ok(body) => body,
            Err(e) => {
                self.shared.telemetry.api_errors(e.reason(), 1);
                failure_reply(&e)
            }
        };
        body.served = Some(served);
        Answer::Here(body)
    }

    /// Applies an update here if it may be ([`Updates::applies_in_task`]) and the filter's
    /// lock is free (or `lock` waits for it); else hands it to the actor, which also answers a
    /// malformed one.
    fn update(&self, op: Op, msg: &Message, lock: Lock) -> Answer {
        let updates = &self.updates;
        match updates.level(msg) {
            Ok(level) if updates.applies_in_task(op, level) => {
                let served = self.service.serve(&msg.subject);
                let applied = updates
                    .apply(op, level, msg, lock, &mut || Ok(u64::MAX))
                    .and_then(|applied| match applied {
                        Some(a) => updates.settle_in_task(a.level, a.changed).map(|()| Some(a)),
                        None => Ok(None),
                    });
                let mut body = match applied {
                    Ok(None) => return Answer::Actor,
                    Ok(Some(applied)) => applied.body,
                    Err(e) => {
                        self.shared.telemetry.api_errors(e.reason(), 1);
                        failure_reply(&e)
                    }
                };
                self.shared
                    .telemetry
                    .traffic(Direction::In, Channel::Api, msg.payload.len());
                body.served = Some(served);
                Answer::Here(body)
            }
            _ => Answer::Actor,
        }
    }

    fn filter(&self) -> std::sync::RwLockReadGuard<'_, crate::replica::AnyFilter> {
        self.shared.filter.read().expect("filter lock poisoned")
    }
}

/// The reply of a request made in this process ([`crate::replica::ReplicaHandle::request`]):
/// ready at once where a subscription task would have answered it, else the actor's.
#[must_use = "a future does nothing unless awaited"]
pub enum PendingResponse {
    /// Answered already (taken once polled).
    Ready(Option<ApiResponse>),
    /// The actor answers.
    Actor(oneshot::Receiver<ApiResponse>),
    /// Not taken (taken once polled).
    Failed(ReplicaError),
}

impl std::fmt::Debug for PendingResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PendingResponse::Ready(_) => "PendingResponse::Ready",
            PendingResponse::Actor(_) => "PendingResponse::Actor",
            PendingResponse::Failed(_) => "PendingResponse::Failed",
        })
    }
}

impl Future for PendingResponse {
    type Output = Result<ApiResponse, ReplicaError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        match &mut *self {
            PendingResponse::Ready(r) => Poll::Ready(r.take().ok_or(ReplicaError::Stopped)),
            // The actor stopped before answering: the request may or may not have applied.
            PendingResponse::Actor(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|r| r.map_err(|_| ReplicaError::Stopped)),
            PendingResponse::Failed(e) => {
                Poll::Ready(Err(std::mem::replace(e, ReplicaError::Stopped)))
            }
        }
    }
}

/// The answer of `contains` or, for a `batch`, `mcontains`, from the shared state: through
/// the lock-free reader where the kind has one.
pub(super) fn query_reply(
    shared: &Shared,
    batch: bool,
    msg: &Message,
) -> Result<ApiReply, ReplicaError> {
    if !batch {
        return Ok(ApiReply::contains(contains_one(shared, &msg.payload)?));
    }
    let format = api_reply_format(msg)?;
    let items = batch::decode(&msg.payload, shared.limits)
        .map_err(|e| ReplicaError::InvalidItem(e.to_string()))?;
    let found = contains_each(shared, &items);
    Ok(match format {
        ReplyFormat::Json => ApiReply::json(&json!({ "contains": found })),
        ReplyFormat::Bitmap => ApiReply::bitmap(&found, None),
    })
}

/// The bytes of `items` in the batch framing ([`batch::encode`]), as a request carries them.
fn batch_bytes(items: &[&[u8]]) -> usize {
    items.iter().map(|i| i.len() + 4).sum()
}

/// Whether the state contains each of `items` (checked already), through the lock-free
/// reader where the kind has one.
fn contains_each(shared: &Shared, items: &[&[u8]]) -> Vec<bool> {
    let found: Vec<bool> = match &shared.reader {
        // Without the lock: the batch never waits for an update or a merge.
        Some(r) => map_prefetched(
            items,
            crate::core::prefetch::BLOOM_ITEMS_AHEAD,
            |i| r.prefetch(i),
            |i| r.contains(i),
        ),
        None => {
            let f = shared.filter.read().expect("filter lock poisoned");
            let now = if shared.kind.clocked() {
                shared.clock.for_reads(f.clock_bounds())
            } else {
                0
            };
            map_prefetched(
                items,
                f.prefetch_ahead(),
                |i| f.prefetch(i),
                |i| f.contains_as_of(i, now),
            )
        }
    };
    shared
        .telemetry
        .count_ops(OpKind::Contains, found.len() as u64, 0);
    found
}

/// Whether the state contains `item` (checked against `max_item_bytes`), through the
/// lock-free reader where the kind has one.
fn contains_one(shared: &Shared, item: &[u8]) -> Result<bool, ReplicaError> {
    let r = check_item(item, shared.limits.max_item_bytes).map(|()| match &shared.reader {
        Some(r) => r.contains(item),
        None => {
            let f = shared.filter.read().expect("filter lock poisoned");
            if shared.kind.clocked() {
                f.contains_as_of(item, shared.clock.for_reads(f.clock_bounds()))
            } else {
                f.contains(item)
            }
        }
    });
    shared.telemetry.op(OpKind::Contains, r.is_ok());
    r
}

/// The answer of `count` (`{"count":N}`) or `mcount` (`{"count":[N...]}`, JSON only), from
/// `f`; [`ReplicaError::NotCounting`] for a kind that does not count.
pub(super) fn count_reply(
    f: &crate::replica::AnyFilter,
    op: Op,
    msg: &Message,
    limits: Limits,
) -> Result<ApiReply, ReplicaError> {
    if op == Op::Count {
        let item = &msg.payload[..];
        check_item(item, limits.max_item_bytes)?;
        return Ok(ApiReply::json(&json!({ "count": f.count(item)? })));
    }
    if api_reply_format(msg)? != ReplyFormat::Json {
        return Err(ReplicaError::InvalidItem(
            "mcount replies in JSON only (its counts are not bits)".into(),
        ));
    }
    let items = batch::decode(&msg.payload, limits)
        .map_err(|e| ReplicaError::InvalidItem(e.to_string()))?;
    let counts = items
        .iter()
        .map(|&i| f.count(i))
        .collect::<Result<Vec<u64>, _>>()?;
    Ok(ApiReply::json(&json!({ "count": counts })))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopping replica refuses every request on its subjects at once: the requester learns
    /// it now, not after its timeout once the subscriptions are gone.
    #[actix::test]
    async fn a_stopping_replica_refuses_requests_at_once() {
        use crate::replica::{Replica, ReplicaConfig};
        use crate::wire::FilterKind;
        let cfg = ReplicaConfig::for_kind("t", FilterKind::GBloom, 1_000, 0.01).fast();
        let bus = Arc::new(crate::transport::InProcessBus::new());
        let handle = Replica::start(cfg, bus).await.unwrap();
        assert!(handle.wait_ready(std::time::Duration::from_secs(10)).await);
        let reads = handle.shared.api.load_full().unwrap();
        let request = |op: &str, subject: String| Message {
            subject,
            payload: Bytes::from_static(b"x"),
            reply: Some(format!("_INBOX.{op}")),
            headers: None,
        };
        let own = |op| reads.subjects.replica_api_subject(reads.replica, op);
        let error = |route: Route| match route {
            Route::Reply(_, headers, payload) => headers
                .get(crate::replica::service::SERVICE_ERROR_HEADER)
                .map(|e| e.to_string())
                .ok_or(payload),
            _ => panic!("not answered here"),
        };
        let found = error(reads.route(request("contains", own("contains"))));
        assert_eq!(found, Err(Bytes::from_static(b"{\"contains\":false}")));
        handle.shared.closed.store(true, Ordering::Release);
        for (op, subject) in [
            ("contains", own("contains")),
            ("add", own("add")),
            ("add", reads.subjects.api_subject("add")),
            ("stats", own("stats")),
        ] {
            let refused = error(reads.route(request(op, subject))).unwrap();
            assert!(refused.contains("stopped"), "{op}: {refused}");
        }
        assert!(!handle.contains(b"x"), "nothing was applied");
        handle.shared.closed.store(false, Ordering::Release);
        handle.shutdown().await.unwrap();
    }

    /// A stopped replica is let go with its last handle: its request API, which holds it,
    /// goes when its actor stops (kept for good, every dropped filter stayed in memory).
    /// Its handle's requests meanwhile are refused as stopped, not as not serving yet.
    #[actix::test]
    async fn a_stopped_replica_is_freed_with_its_last_handle() {
        use crate::replica::{Replica, ReplicaConfig};
        use crate::wire::FilterKind;
        let cfg = ReplicaConfig::for_kind("t", FilterKind::GBloom, 1_000, 0.01).fast();
        let bus = Arc::new(crate::transport::InProcessBus::new());
        let handle = Replica::start(cfg, bus).await.unwrap();
        assert!(handle.wait_ready(std::time::Duration::from_secs(10)).await);
        assert!(handle.serving_api());
        let shared = Arc::downgrade(&handle.shared);
        handle.shutdown().await.unwrap();
        handle.shared.lifecycle.gone().await;
        assert!(matches!(
            handle.contains_now(b"x"),
            Err(crate::replica::ReplicaError::Stopped)
        ));
        drop(handle);
        // The actor's last references go as its context is dropped, after `stopped`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while shared.upgrade().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the stopped replica is still held"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// A `logged` add applied outside the actor is answered at once and committed within a
    /// millisecond (written to the log), as one the actor applies would be; a `local` one
    /// waits for the delta interval (ten minutes here), and so do the deltas of the commits
    /// after the first.
    #[actix::test]
    async fn adds_applied_in_place_are_committed_as_their_level_says() {
        use crate::replica::{Replica, ReplicaConfig};
        use crate::wire::FilterKind;
        let wait = std::time::Duration::from_secs(10);
        let data = tempfile::tempdir().unwrap();
        let mut cfg = ReplicaConfig::for_kind("t", FilterKind::GBloom, 1_000, 0.01).fast();
        cfg.data_dir = Some(data.path().to_path_buf());
        cfg.delta_interval_ms = 600_000;
        let bus = Arc::new(crate::transport::InProcessBus::new());
        let handle = Replica::start(cfg, bus).await.unwrap();
        assert!(handle.wait_ready(wait).await);
        let reads = handle.shared.api.load_full().unwrap();
        let committed = |sent_before: u64| {
            let handle = handle.clone();
            async move {
                let deadline = std::time::Instant::now() + wait;
                loop {
                    let s = handle.stats().await.unwrap();
                    if s.pending_delta == 0 && s.deltas_sent >= sent_before {
                        return s.deltas_sent;
                    }
                    assert!(std::time::Instant::now() < deadline, "not committed: {s:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            }
        };
        // The first change is committed at once (no flush yet); the next flush is then due
        // an interval later.
        let sent = handle.stats().await.unwrap().deltas_sent;
        handle.add(b"first".to_vec()).await.unwrap();
        let sent = committed(sent + 1).await;
        let local = reads.add_now(b"a", AddMode::Always, Some(AckLevel::Local));
        assert!(matches!(local, Some(Ok(_))), "applied here");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let s = handle.stats().await.unwrap();
        assert!(s.pending_delta > 0 && s.deltas_sent == sent, "{s:?}");
        let logged = reads.add_now(b"b", AddMode::ReportNew, Some(AckLevel::Logged));
        assert!(
            matches!(
                logged,
                Some(Ok(InPlace {
                    outcome: AddOutcome::New,
                    ticket: None
                }))
            ),
            "applied here, answered now"
        );
        assert_eq!(
            committed(sent).await,
            sent,
            "its delta waits for the interval"
        );
        // A log known to have failed is said, not promised; the add stays applied.
        handle.shared.wal_failed.store(true, Ordering::Release);
        let refused = reads.add_now(b"c", AddMode::Always, Some(AckLevel::Logged));
        assert!(
            matches!(refused, Some(Err(ReplicaError::NotDurable(_)))),
            "{refused:?}"
        );
        assert!(handle.contains(b"c"));
        handle.shared.wal_failed.store(false, Ordering::Release);
        // A durable add is applied here too, and waits for its commit: asked for now, and
        // fsynced (it is in the log once the ticket settles; its delta waits for the
        // interval).
        let sent = handle.stats().await.unwrap().deltas_sent;
        let durable = reads.add_now(b"d", AddMode::ReportNew, Some(AckLevel::Durable));
        let Some(Ok(InPlace {
            outcome: AddOutcome::New,
            ticket: Some(ticket),
        })) = durable
        else {
            panic!("{durable:?}");
        };
        ticket.settled().await.unwrap();
        let s = handle.stats().await.unwrap();
        assert!(s.pending_delta == 0 && s.deltas_sent == sent, "{s:?}");
        // One that adds nothing still waits for a commit, a sync of the log: it rests on what
        // earlier commits wrote, perhaps not synced yet.
        let again = reads.add_now(b"d", AddMode::IfAbsent, Some(AckLevel::Durable));
        let Some(Ok(InPlace {
            outcome: AddOutcome::Skipped,
            ticket: Some(ticket),
        })) = again
        else {
            panic!("{again:?}");
        };
        ticket.settled().await.unwrap();
        assert_eq!(
            handle.stats().await.unwrap().deltas_sent,
            sent,
            "nothing sent"
        );
        // A ticket taken as the replica stops settles with the stop: its final snapshot
        // holds the update.
        let last = reads.add_now(b"e", AddMode::Always, Some(AckLevel::Durable));
        let Some(Ok(InPlace {
            ticket: Some(last), ..
        })) = last
        else {
            panic!("{last:?}");
        };
        handle.shutdown().await.unwrap();
        last.settled().await.unwrap();
    }
}
