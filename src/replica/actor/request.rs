//! The request API of a replica (README, "Subjects"): single operations with the raw item as
//! payload, batch operations with the framing of [`crate::api::batch`], stats. Queries, and
//! adds at `local` to grow-only kinds, are answered in the subscription tasks
//! ([`super::reads`], [`super::updates`]); other requests reach the actor through its inbound
//! buffer like replication messages, and their replies leave through the publisher task. Every
//! reply carries the header [`REPLICA_HEADER`] naming this replica. The replica also
//! answers the NATS service API for it ([`crate::replica::service`]), which counts what
//! [`Replica::on_api`] answers.

use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use serde_json::json;
use tokio::sync::oneshot;

use super::Replica;
use super::publish::Responder;
use super::pump::{API_LINGER, Outbound, Route, forward_stream};
use super::reads::{Reads, count_reply, query_reply};
use super::updates::{Applied, Lock};
use crate::ReplicaId;
use crate::api::batch;
use crate::api::{ERROR_HEADER, FAILED_HEADER, Op, REPLICA_HEADER, REPLY_HEADER, ReplyFormat};
use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;
use crate::replica::metrics::{Channel, Direction};
use crate::replica::service::{
    ApiService, SERVICE_ERROR_CODE_HEADER, SERVICE_ERROR_HEADER, Served, ServiceError,
};
use crate::transport::{Message, MessageStream, confirm_subscriptions, subscribe_now};

/// Longest error text carried in a reply header (the JSON body has no such bound).
const MAX_ERROR_HEADER: usize = 256;

/// What a request is answered with once it succeeded (an error is always JSON).
pub(crate) struct ApiReply {
    payload: Bytes,
    /// A bitmap rather than JSON: flagged by [`REPLY_HEADER`] in the reply.
    bitmap: bool,
    /// The first error of a partly failed `madd`, for [`ERROR_HEADER`].
    error: Option<String>,
    /// The refused items of a `madd` whose bitmap says which items were new, for
    /// [`FAILED_HEADER`].
    failed: Option<String>,
    /// An error answer: for the service API's error headers and counts.
    failure: Option<ServiceError>,
    /// The request it answers, counted on its service endpoint once sent.
    pub(super) served: Option<Served>,
}

impl ApiReply {
    pub(super) fn json(body: &serde_json::Value) -> Self {
        ApiReply {
            payload: serde_json::to_vec(body).expect("JSON serialize").into(),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
            served: None,
        }
    }

    /// A JSON body known at compile time: the single operations' answers, without serializing.
    pub(super) fn fixed(body: &'static [u8]) -> Self {
        ApiReply {
            payload: Bytes::from_static(body),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
            served: None,
        }
    }

    /// The answer of `contains`.
    pub(super) fn contains(found: bool) -> Self {
        Self::fixed(if found {
            b"{\"contains\":true}"
        } else {
            b"{\"contains\":false}"
        })
    }

    /// Names the refused items of a batch (none: no header).
    pub(super) fn with_failed(mut self, failed: &[usize]) -> Self {
        if !failed.is_empty() {
            let list: Vec<String> = failed.iter().map(usize::to_string).collect();
            self.failed = Some(list.join(","));
        }
        self
    }

    pub(super) fn bitmap(bits: &[bool], error: Option<String>) -> Self {
        ApiReply {
            payload: batch::encode_bitmap(bits.iter().copied()).into(),
            bitmap: true,
            error,
            failed: None,
            failure: None,
            served: None,
        }
    }
}

/// Where the reply of a request goes.
pub(crate) enum ReplyTo {
    /// A NATS reply subject.
    Subject(String),
    /// The caller of [`crate::replica::ReplicaHandle::request`], in this process.
    InProcess(oneshot::Sender<ApiResponse>),
}

/// The reply of a request of the API made in this process
/// ([`crate::replica::ReplicaHandle::request`]): what a NATS requester would receive.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    /// The reply's headers ([`REPLICA_HEADER`], [`REPLY_HEADER`] for a bitmap,
    /// [`ERROR_HEADER`], and the service API's error headers on an error reply).
    pub headers: async_nats::HeaderMap,
    /// The body: JSON, or a bitmap where the headers say so.
    pub payload: Bytes,
}

impl ApiResponse {
    /// The error of an error reply (the service API's `Nats-Service-Error` header).
    pub fn error(&self) -> Option<&str> {
        self.headers.get(SERVICE_ERROR_HEADER).map(|v| v.as_str())
    }

    /// Whether the body is a bitmap ([`crate::api::batch::decode_bitmap`]) rather than JSON.
    pub fn is_bitmap(&self) -> bool {
        self.headers
            .get(REPLY_HEADER)
            .is_some_and(|v| v.as_str() == ReplyFormat::Bitmap.name())
    }
}

impl ApiReply {
    /// Counts the request on its service endpoint, and makes the reply (where to, headers
    /// naming `replica`, payload) if the request wants one.
    pub(super) fn finish(
        mut self,
        replica: ReplicaId,
        reply: Option<ReplyTo>,
    ) -> Option<(ReplyTo, async_nats::HeaderMap, Bytes)> {
        // Served even without a reply subject (a request published without one).
        if let Some(served) = self.served.take() {
            served.finish(self.failure.as_ref());
        }
        let to = reply?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(REPLICA_HEADER, replica.to_string());
        if self.bitmap {
            headers.insert(REPLY_HEADER, ReplyFormat::Bitmap.name());
        }
        if let Some(e) = &self.error {
            headers.insert(ERROR_HEADER, header_text(e));
        }
        if let Some(failed) = &self.failed {
            headers.insert(FAILED_HEADER, failed.as_str());
        }
        if let Some(f) = &self.failure {
            headers.insert(SERVICE_ERROR_HEADER, f.text.as_str());
            headers.insert(SERVICE_ERROR_CODE_HEADER, f.code.to_string());
        }
        Some((to, headers, self.payload))
    }
}

/// The error answer to a request.
pub(super) fn failure_reply(e: &ReplicaError) -> ApiReply {
    let mut body = ApiReply::json(&json!({"error": e.to_string()}));
    body.failure = Some(ServiceError {
        code: service_code(e),
        text: header_text(&e.to_string()),
    });
    body
}

/// What a request came to, when it did not fail outright.
enum Handled {
    /// A query: answered at once.
    Answer(ApiReply),
    /// An applied update: answered once it reached `level` (see [`Replica::settle`]).
    Settle {
        level: AckLevel,
        changed: bool,
        body: ApiReply,
    },
}

impl Replica {
    /// Serves the request API, then publishes readiness (`why` says what made the replica
    /// ready): a client that waits for ready, or a probe of `crpf_ready`, must find the API's
    /// subscriptions in place, not "no responders".
    pub(super) fn start_api(&mut self, ctx: &mut Context<Self>, why: String) {
        // First, so that whatever answers requests can count them on its endpoints; it is
        // announced ($SRV) after the API's subscriptions.
        let service = self.new_service();
        // `<...>.api` and `<...>.api.>` (one NATS pattern cannot cover both) in the queue
        // group, so that one ready replica answers; and the same two under
        // `<...>.replica.<id>`, without a group, for requests to this replica alone. Every
        // request on an API subject gets a reply, an error one without a known operation.
        let queue = self.subjects.api_queue.clone();
        let shared_subjects = self
            .subjects
            .api_subscriptions()
            .map(|s| (s.to_string(), Some(queue.clone())));
        let own = self
            .subjects
            .replica_api_subscriptions(self.id())
            .map(|s| (s, None));
        let subscriptions: Vec<_> = shared_subjects.into_iter().chain(own).collect();
        // Queries (and some updates, see `updates`) are answered in the subscription tasks;
        // the rest go to the actor.
        let reads = Arc::new(Reads {
            shared: self.shared.clone(),
            subjects: self.subjects.clone(),
            service: service.clone(),
            replica: self.id(),
            updates: self.updates.clone(),
        });
        // Started once: the cell is empty.
        let _ = self.shared.api.set(reads.clone());
        let service_subjects = match self.cfg.service_by_node {
            true => Vec::new(),
            false => service.subscriptions().to_vec(),
        };
        let transport = self.transport.clone();
        let subscribing = async move {
            let mut api = Vec::with_capacity(subscriptions.len());
            for (subject, queue) in subscriptions {
                let stream = subscribe_now(&transport, &subject, queue.clone()).await;
                api.push((stream, subject, queue));
            }
            let mut srv = Vec::with_capacity(service_subjects.len());
            for subject in service_subjects {
                srv.push((subscribe_now(&transport, &subject, None).await, subject));
            }
            (api, srv)
        };
        ctx.spawn(subscribing.into_actor(self).map(move |(api, srv), act, ctx| {
            // The subscription tasks run on the runtime's workers (`tokio::spawn`), where the
            // NATS connection's task runs, not on the actors' thread: a query is then
            // answered without a wake-up of another thread on its way in (node CPU per
            // `contains` at 16 in flight went from about 8 to 5 µs, BENCHMARKS.md). They
            // start before the round trip below, so that requests the server already sends
            // here are answered at once.
            // Not among the tasks aborted at stop: they end when the actor's queue closes,
            // after lingering a moment if the filter was dropped (`API_LINGER`).
            for (stream, subject, queue) in api {
                let reads = reads.clone();
                tokio::spawn(forward_stream(
                    stream,
                    act.transport.clone(),
                    (subject, queue),
                    act.inbound_tx.clone(),
                    move |m| reads.route(m),
                    act.shared.clone(),
                    Some(API_LINGER),
                ));
            }
            act.serve_service(service, srv);
            // The server has processed the subscriptions once it answers a request sent after
            // them. Disconnected, nobody could reach the API anyway: ready is not held back.
            let transport = act.transport.clone();
            let confirming = async move {
                if let Err(e) = confirm_subscriptions(&transport).await {
                    tracing::warn!(error = %e, "the API's subscriptions were not confirmed");
                }
            };
            ctx.spawn(
                confirming
                    .into_actor(act)
                    .map(move |(), act, _ctx| act.publish_ready(&why)),
            );
        }));
    }

    /// The NATS service API's instance of this replica.
    fn new_service(&mut self) -> Arc<ApiService> {
        let service = Arc::new(ApiService::new(
            &self.subjects,
            &self.cfg.prefix,
            &self.cfg.name,
            self.expect.kind,
            self.id(),
            self.uuid(),
        ));
        self.service = Some(service.clone());
        service
    }

    /// Serves the NATS service API on `subscriptions` (a stream each, or `None` to subscribe
    /// in its task): its requests are answered in their subscription tasks, from the
    /// service's own figures, without the actor.
    fn serve_service(
        &mut self,
        service: Arc<ApiService>,
        subscriptions: Vec<(Option<MessageStream>, String)>,
    ) {
        tracing::info!(
            filter = %self.cfg.name,
            replica = self.id(),
            service = service.name(),
            id = service.id(),
            "serving the NATS service API ($SRV)"
        );
        for (stream, subject) in subscriptions {
            let service = service.clone();
            // Answered in the subscription task, like a query; nothing reaches the actor.
            let route = move |msg: Message| match (msg.reply, service.answer(&msg.subject)) {
                (Some(to), Some(answer)) => Route::Reply(to, async_nats::HeaderMap::new(), answer),
                _ => Route::Drop,
            };
            self.tasks.push(tokio::spawn(forward_stream(
                stream,
                self.transport.clone(),
                (subject, None),
                self.inbound_tx.clone(),
                route,
                self.shared.clone(),
                None,
            )));
        }
    }

    pub(super) fn on_api(&mut self, msg: Message, reply: Option<ReplyTo>, ctx: &mut Context<Self>) {
        self.telemetry
            .traffic(Direction::In, Channel::Api, msg.payload.len());
        let served = self.service.as_ref().map(|s| s.serve(&msg.subject));
        match self.api_request(&msg) {
            Ok(Handled::Answer(mut body)) => {
                body.served = served;
                self.send_reply(reply, body)
            }
            Ok(Handled::Settle {
                level,
                changed,
                mut body,
            }) => {
                body.served = served;
                self.settle(level, changed, Responder::Api { reply, body }, ctx)
            }
            Err(e) => self.api_failed(reply, served, e),
        }
    }

    fn api_request(&mut self, msg: &Message) -> Result<Handled, ReplicaError> {
        let op = match self.subjects.api_op(&msg.subject).unwrap_or("") {
            "" => {
                return Err(ReplicaError::InvalidItem(format!(
                    "no operation: send to {}.<{}>",
                    self.subjects.api_root,
                    Op::ALL.map(Op::name).join("|")
                )));
            }
            op => op.parse::<Op>().map_err(ReplicaError::InvalidItem)?,
        };
        Ok(match op {
            op if op.is_update() => {
                let updates = self.updates.clone();
                let level = updates.level(msg)?;
                let mut reserve = || {
                    self.reserve_tags()?;
                    Ok(self.tag_limit())
                };
                let Applied {
                    level,
                    changed,
                    body,
                } = updates
                    .apply(op, level, msg, Lock::Wait, &mut reserve)?
                    .expect("the actor waits for the lock");
                if changed {
                    self.local_change();
                }
                Handled::Settle {
                    level,
                    changed,
                    body,
                }
            }
            // Queries are answered in the subscription tasks; the same answer here.
            Op::Contains | Op::MContains => {
                let batch = op == Op::MContains;
                Handled::Answer(query_reply(&self.shared, batch, msg)?)
            }
            Op::Stats => {
                let stats = serde_json::to_value(self.stats()).expect("stats serialize");
                Handled::Answer(ApiReply::json(&stats))
            }
            Op::Count | Op::MCount => {
                let f = self.read();
                Handled::Answer(count_reply(&f, op, msg, self.shared.limits)?)
            }
            _ => unreachable!("every operation is handled above"),
        })
    }

    /// Answers an update that waited for its acknowledgement level: `body` if it was
    /// reached, else the error.
    pub(super) fn api_answer(
        &mut self,
        reply: Option<ReplyTo>,
        body: ApiReply,
        result: Result<(), ReplicaError>,
    ) {
        match result {
            Ok(()) => self.send_reply(reply, body),
            Err(e) => self.api_failed(reply, body.served, e),
        }
    }

    fn api_failed(&mut self, reply: Option<ReplyTo>, served: Option<Served>, e: ReplicaError) {
        self.api_error(&e);
        let mut body = failure_reply(&e);
        body.served = served;
        self.send_reply(reply, body);
    }

    fn send_reply(&mut self, reply: Option<ReplyTo>, body: ApiReply) {
        match body.finish(self.id(), reply) {
            Some((ReplyTo::Subject(to), headers, payload)) => {
                self.telemetry
                    .traffic(Direction::Out, Channel::Api, payload.len());
                self.enqueue(Outbound::Reply(to, payload, headers));
            }
            Some((ReplyTo::InProcess(tx), headers, payload)) => {
                // The caller may have given up waiting: nothing to do then.
                let _ = tx.send(ApiResponse { headers, payload });
            }
            None => {}
        }
    }

    /// Counts a request API error by reason (apart from replication rejects).
    fn api_error(&self, e: &ReplicaError) {
        self.count_api_errors(e.reason(), 1);
    }

    fn count_api_errors(&self, reason: &'static str, n: u64) {
        self.telemetry.api_errors(reason, n);
    }
}

/// The reply format a batch request asks for in its `Crpf-Reply` header (JSON by default).
pub(super) fn api_reply_format(msg: &Message) -> Result<ReplyFormat, ReplicaError> {
    match msg.headers.as_ref().and_then(|h| h.get(REPLY_HEADER)) {
        None => Ok(ReplyFormat::Json),
        Some(v) => v.as_str().parse().map_err(ReplicaError::InvalidItem),
    }
}

/// The ADR-32 code of an error answer, HTTP-like: what the request did wrong (400), what the
/// replica cannot do now (503), what was not confirmed in time (504), a full filter (507), and
/// the replica's own failures (500).
fn service_code(e: &ReplicaError) -> u16 {
    use crate::FilterError;
    match e {
        ReplicaError::InvalidItem(_)
        | ReplicaError::NotRemovable(_)
        | ReplicaError::NotCounting(_) => 400,
        ReplicaError::Filter(FilterError::Full { .. } | FilterError::NoRoom { .. }) => 507,
        ReplicaError::AckUnavailable(_)
        | ReplicaError::Stopped
        | ReplicaError::Transport(_)
        | ReplicaError::TagsUnreserved
        | ReplicaError::Busy
        | ReplicaError::NotServing
        | ReplicaError::IdRetired { .. } => 503,
        ReplicaError::NotReplicated { .. } => 504,
        ReplicaError::Config(_)
        | ReplicaError::Filter(_)
        | ReplicaError::Durable(_)
        | ReplicaError::NotDurable(_)
        | ReplicaError::ImportStopped { .. } => 500,
    }
}

/// An error message fit for a header value: one line, bounded.
/// The text an error reply to a request carries for `e` (its `Nats-Service-Error`), and
/// whether its code says the filter was full: for a caller that answers in this process
/// without an [`ApiResponse`] (the RESP front end's hot path).
pub(crate) fn error_of(e: &ReplicaError) -> (String, bool) {
    (header_text(&e.to_string()), service_code(e) == 507)
}

fn header_text(e: &str) -> String {
    e.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_ERROR_HEADER)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_is_one_bounded_line() {
        assert_eq!(header_text("a\r\nb"), "a  b");
        assert_eq!(header_text(&"x".repeat(1000)).len(), MAX_ERROR_HEADER);
    }
}
