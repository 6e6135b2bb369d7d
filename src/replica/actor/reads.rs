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
use tokio::sync::oneshot;

use super::items::{check_item, map_prefetched};
use super::pump::{Refused, offer};
use super::reply::{ApiReply, ReplyTo, failure_reply, nats_request};
use super::updates::{Applied, Lock, Updates};
use super::{CommitTicket, Route, Shared};
use crate::ReplicaId;
use crate::api::{ReplyFormat, Request, Response};
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
    failure_reply(e).finish(replica, None, Some(msg.reply?))
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

/// Where a request is answered, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// In a subscription task, from NATS: updates only where answered once applied
    /// ([`Updates::applies_in_task`]), without waiting for the filter's lock.
    Task,
    /// In the caller's thread, in this process: `durable` adds too, their answer then
    /// waiting for the commit ([`Updates::applies_in_place`]); the lock waited for a moment
    /// ([`Lock::Block`]).
    Caller,
}

/// What answering a request outside the actor came to.
#[derive(Debug)]
pub(super) enum Answer {
    /// Answered.
    Here(Result<Response, ReplicaError>),
    /// Applied: answered once the commit that carries it is synced.
    AfterCommit(CommitTicket, Response),
    /// For the actor.
    Actor(Request),
}

impl Reads {
    /// Where a request from NATS goes: answered here if it is a query (or an update applied
    /// here), else to the actor.
    pub(super) fn route(&self, msg: Message) -> Route {
        let served = Some(self.service.serve(&msg.subject));
        let op = self.subjects.api_op(&msg.subject);
        let parsed = nats_request(op, &self.subjects.api_root, &msg, self.shared.limits);
        let answer = if self.shared.closed.load(Ordering::Acquire) {
            // Stopping (its filter dropped, its node shutting down): refused at once, so that
            // a requester learns it now, not after its timeout once the subscription is gone
            // (or the actor dropped what it was handed).
            Err(ReplicaError::Stopped)
        } else {
            parsed.map(|(request, format)| (self.answer(request, Place::Task), format))
        };
        let (result, format) = match answer {
            Ok((Answer::Here(result), format)) => (result, format),
            Ok((Answer::Actor(request), format)) => {
                let reply = ReplyTo::Nats {
                    subject: msg.reply,
                    format,
                    served,
                };
                return Route::Actor(super::Inbound::Api(Box::new((request, reply))));
            }
            Ok((Answer::AfterCommit(..), _)) => unreachable!("a task never waits for a commit"),
            Err(e) => {
                self.shared.telemetry.api_errors(e.reason(), 1);
                (Err(e), ReplyFormat::Json)
            }
        };
        match ApiReply::of_result(result, format).finish(self.replica, served, msg.reply) {
            Some((to, headers, payload)) => {
                self.shared
                    .telemetry
                    .traffic(Direction::Out, Channel::Api, payload.len());
                Route::Reply(to, headers, payload)
            }
            None => Route::Drop,
        }
    }

    /// Answers a request made in this process: here where [`Reads::route`] would, and
    /// `durable` adds of the kinds applied outside the actor too (unless `queued`), else
    /// through the actor's inbound buffer ([`ReplicaError::Busy`] if it is full).
    pub(crate) fn call(&self, request: Request, queued: bool) -> PendingResponse {
        let answer = match queued {
            true => Answer::Actor(request),
            false => self.answer(request, Place::Caller),
        };
        match answer {
            Answer::Here(result) => PendingResponse::Ready(Some(result)),
            Answer::AfterCommit(ticket, response) => {
                PendingResponse::AfterCommit(Box::pin(async move {
                    ticket.settled().await.map(|()| response)
                }))
            }
            Answer::Actor(request) => {
                let (tx, rx) = oneshot::channel();
                // It waits: its items in a buffer of their own, not the caller's.
                let call = Box::new((request.compact(), ReplyTo::InProcess(tx)));
                match offer(
                    &self.shared,
                    &self.updates.to_actor,
                    super::Inbound::Api(call),
                ) {
                    Ok(()) => PendingResponse::Actor(rx),
                    Err(Refused::Full) => PendingResponse::Ready(Some(Err(ReplicaError::Busy))),
                    Err(Refused::Closed) => {
                        PendingResponse::Ready(Some(Err(ReplicaError::Stopped)))
                    }
                }
            }
        }
    }

    /// The answer of `request` outside the actor, at `place`, or [`Answer::Actor`] if the
    /// actor gives it.
    pub(super) fn answer(&self, request: Request, place: Place) -> Answer {
        let op = request.op();
        let answer = if op.is_update() {
            self.update(request, place)
        } else if op.is_query() {
            // Traffic is what came over NATS: a call made in this process (RESP's) is none.
            if place == Place::Task {
                self.shared
                    .telemetry
                    .traffic(Direction::In, Channel::Api, request.payload_len());
            }
            Answer::Here(query(&self.shared, &request))
        } else {
            return Answer::Actor(request);
        };
        if let Answer::Here(Err(e)) = &answer {
            self.shared.telemetry.api_errors(e.reason(), 1);
        }
        answer
    }

    /// Applies an update here if it may be at `place` and the filter's lock comes as
    /// `place` allows; else hands it to the actor.
    fn update(&self, request: Request, place: Place) -> Answer {
        let updates = &self.updates;
        let level = match updates.level(request.ack()) {
            Ok(level) => level,
            Err(e) => return Answer::Here(Err(e)),
        };
        let (here, lock) = match place {
            Place::Task => (updates.applies_in_task(request.op(), level), Lock::Try),
            Place::Caller => (updates.applies_in_place(request.op(), level), Lock::Block),
        };
        if !here {
            return Answer::Actor(request);
        }
        let durable = level == AckLevel::Durable;
        let answer = match updates.apply(&request, level, lock, &mut || Ok(u64::MAX), durable) {
            Ok(None) => return Answer::Actor(request),
            Ok(Some(Applied {
                level,
                changed,
                response,
                commit,
            })) => match updates.settle_in_task(level, changed) {
                Err(e) => Answer::Here(Err(e)),
                Ok(()) => match commit {
                    Some(batch) => Answer::AfterCommit(self.shared.commits.ticket(batch), response),
                    None => Answer::Here(Ok(response)),
                },
            },
            Err(e) => Answer::Here(Err(e)),
        };
        if place == Place::Task {
            self.shared
                .telemetry
                .traffic(Direction::In, Channel::Api, request.payload_len());
        }
        answer
    }
}

/// The answer of a request made in this process ([`crate::replica::ReplicaHandle::call`]):
/// ready at once where a subscription task would have answered it, after its commit for a
/// `durable` add applied in place, else the actor's.
#[must_use = "a future does nothing unless awaited"]
pub enum PendingResponse {
    /// Answered already (taken once polled).
    Ready(Option<Result<Response, ReplicaError>>),
    /// Applied; answered once its commit is synced.
    AfterCommit(futures::future::BoxFuture<'static, Result<Response, ReplicaError>>),
    /// The actor answers.
    Actor(oneshot::Receiver<Result<Response, ReplicaError>>),
}

impl PendingResponse {
    /// Whether the actor answers it (its answer then comes in the order the actor takes
    /// requests).
    pub fn via_actor(&self) -> bool {
        matches!(self, PendingResponse::Actor(_))
    }
}

impl std::fmt::Debug for PendingResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PendingResponse::Ready(_) => "PendingResponse::Ready",
            PendingResponse::AfterCommit(_) => "PendingResponse::AfterCommit",
            PendingResponse::Actor(_) => "PendingResponse::Actor",
        })
    }
}

impl Future for PendingResponse {
    type Output = Result<Response, ReplicaError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        match &mut *self {
            PendingResponse::Ready(r) => {
                Poll::Ready(r.take().unwrap_or(Err(ReplicaError::Stopped)))
            }
            PendingResponse::AfterCommit(f) => f.as_mut().poll(cx),
            // The actor stopped before answering: the request may or may not have applied.
            PendingResponse::Actor(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(ReplicaError::Stopped))),
        }
    }
}

/// The answer of a query (`contains`, `mcontains`, `count`, `mcount`, the sketches') from
/// the shared state: through the lock-free reader where the kind has one.
pub(super) fn query(shared: &Shared, request: &Request) -> Result<Response, ReplicaError> {
    match request {
        Request::Contains { item } => contains_one(shared, item).map(Response::Contains),
        Request::MContains { items } => {
            checked(items, shared.limits)?;
            Ok(Response::MContains(contains_each(shared, &items.slices())))
        }
        other => query_state(&filter(shared), shared.limits, &shared.telemetry, other),
    }
}

/// The answer of a query from the state `f` (a parked replica's, or the shared state under
/// its read lock), of a kind whose reads need no clock.
pub(super) fn query_state(
    f: &crate::replica::AnyFilter,
    limits: crate::api::batch::Limits,
    telemetry: &crate::replica::metrics::Telemetry,
    request: &Request,
) -> Result<Response, ReplicaError> {
    let counts = |items: &mut dyn Iterator<Item = &[u8]>| {
        items.map(|i| f.count(i)).collect::<Result<Vec<u64>, _>>()
    };
    match request {
        Request::Contains { item } => {
            let r = check_item(item, limits.max_item_bytes).map(|()| f.contains(item));
            telemetry.op(OpKind::Contains, r.is_ok());
            r.map(Response::Contains)
        }
        Request::MContains { items } => {
            checked(items, limits)?;
            let found: Vec<bool> = map_prefetched(
                &items.slices(),
                f.prefetch_ahead(),
                |i| f.prefetch(i),
                |i| f.contains(i),
            );
            telemetry.count_ops(OpKind::Contains, found.len() as u64, 0);
            Ok(Response::MContains(found))
        }
        Request::Count { item } => {
            check_item(item, limits.max_item_bytes)?;
            Ok(Response::Count(f.count(item)?))
        }
        Request::MCount { items } => {
            checked(items, limits)?;
            Ok(Response::MCount(counts(&mut items.iter())?))
        }
        Request::CmsQuery { .. } | Request::CmsInfo => {
            crate::replica::sketch::query(f, request, limits.max_item_bytes)
        }
        Request::TopkQuery { .. } | Request::TopkList { .. } | Request::TopkInfo => {
            crate::replica::topk::query(f, request, limits.max_item_bytes)
        }
        Request::TdigestQuantile { .. } | Request::TdigestCdf { .. } | Request::TdigestInfo => {
            crate::replica::tdigest::query(f, request)
        }
        other => unreachable!("{:?} is not a query", other.op()),
    }
}

/// `items` checked against `limits`.
fn checked(
    items: &crate::api::Items,
    limits: crate::api::batch::Limits,
) -> Result<(), ReplicaError> {
    items
        .check(limits)
        .map_err(|e| ReplicaError::InvalidItem(e.to_string()))
}

fn filter(shared: &Shared) -> std::sync::RwLockReadGuard<'_, crate::replica::AnyFilter> {
    shared.filter.read().expect("filter lock poisoned")
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
            let f = filter(shared);
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
pub(super) fn contains_one(shared: &Shared, item: &[u8]) -> Result<bool, ReplicaError> {
    let r = check_item(item, shared.limits.max_item_bytes).map(|()| match &shared.reader {
        Some(r) => r.contains(item),
        None => {
            let f = filter(shared);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AddMode, AddOutcome};

    /// An add of `item` in `mode` at `level` made in this process, as answered outside the
    /// actor.
    fn add_here(reads: &Reads, item: &'static [u8], mode: AddMode, level: AckLevel) -> Answer {
        let add = Request::Add {
            item: Bytes::from_static(item),
            mode,
            ack: Some(level),
        };
        reads.answer(add, Place::Caller)
    }

    fn outcome(outcome: AddOutcome) -> Response {
        Response::Added {
            mode: AddMode::ReportNew,
            outcome,
        }
    }

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
        let reads = handle.parts.shared.api.load_full().unwrap();
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
        handle.parts.shared.closed.store(true, Ordering::Release);
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
        handle.parts.shared.closed.store(false, Ordering::Release);
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
        let shared = Arc::downgrade(&handle.parts.shared);
        handle.shutdown().await.unwrap();
        handle.parts.shared.lifecycle.gone().await;
        let contains = handle.call(Request::Contains {
            item: Bytes::from_static(b"x"),
        });
        assert!(matches!(
            contains.await,
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
        let reads = handle.parts.shared.api.load_full().unwrap();
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
        let local = add_here(&reads, b"a", AddMode::Always, AckLevel::Local);
        assert!(matches!(local, Answer::Here(Ok(_))), "applied here");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let s = handle.stats().await.unwrap();
        assert!(s.pending_delta > 0 && s.deltas_sent == sent, "{s:?}");
        let logged = add_here(&reads, b"b", AddMode::ReportNew, AckLevel::Logged);
        assert!(
            matches!(logged, Answer::Here(Ok(r)) if r == outcome(AddOutcome::New)),
            "applied here, answered now"
        );
        assert_eq!(
            committed(sent).await,
            sent,
            "its delta waits for the interval"
        );
        // A log known to have failed is said, not promised; the add stays applied.
        handle
            .parts
            .shared
            .wal_failed
            .store(true, Ordering::Release);
        let refused = add_here(&reads, b"c", AddMode::Always, AckLevel::Logged);
        assert!(
            matches!(refused, Answer::Here(Err(ReplicaError::NotDurable(_)))),
            "{refused:?}"
        );
        assert!(handle.contains(b"c"));
        handle
            .parts
            .shared
            .wal_failed
            .store(false, Ordering::Release);
        // A durable add is applied here too, and waits for its commit: asked for now, and
        // fsynced (it is in the log once the ticket settles; its delta waits for the
        // interval).
        let sent = handle.stats().await.unwrap().deltas_sent;
        let durable = add_here(&reads, b"d", AddMode::ReportNew, AckLevel::Durable);
        let Answer::AfterCommit(ticket, added) = durable else {
            panic!("{durable:?}");
        };
        assert_eq!(added, outcome(AddOutcome::New));
        ticket.settled().await.unwrap();
        let s = handle.stats().await.unwrap();
        assert!(s.pending_delta == 0 && s.deltas_sent == sent, "{s:?}");
        // One that adds nothing still waits for a commit, a sync of the log: it rests on what
        // earlier commits wrote, perhaps not synced yet.
        let again = add_here(&reads, b"d", AddMode::IfAbsent, AckLevel::Durable);
        let Answer::AfterCommit(ticket, skipped) = again else {
            panic!("{again:?}");
        };
        let skipped_outcome = Response::Added {
            mode: AddMode::IfAbsent,
            outcome: AddOutcome::Skipped,
        };
        assert_eq!(skipped, skipped_outcome);
        ticket.settled().await.unwrap();
        assert_eq!(
            handle.stats().await.unwrap().deltas_sent,
            sent,
            "nothing sent"
        );
        // A ticket taken as the replica stops settles with the stop: its final snapshot
        // holds the update.
        let last = add_here(&reads, b"e", AddMode::Always, AckLevel::Durable);
        let Answer::AfterCommit(last, _) = last else {
            panic!("{last:?}");
        };
        handle.shutdown().await.unwrap();
        last.settled().await.unwrap();
    }
}
