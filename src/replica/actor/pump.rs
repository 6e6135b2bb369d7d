//! The streams around the actor: subscriptions forwarded into its bounded inbound buffer
//! (replication decoded and checked first, so that garbage never takes a place in it), the
//! transport's connection events, and the publisher task that sends what the actor queued,
//! in order.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::push::{Pace, StatePush};
use super::{Shared, reject, unverified};
use crate::replica::metrics::{Channel, Direction, channel_label};
use crate::transport::{LogLimiter, Message, MessageStream, Subjects, Transport, TransportEvent};
use crate::wire::{Envelope, WireCodec, WireError};

/// What reaches the actor from its subscriptions and the transport. Messages are boxed: a
/// burst grows the buffer's queue, which keeps its capacity, and a node of 100,000 filters
/// holds 100,000 such buffers.
pub(crate) enum Inbound {
    /// A valid replication message from a peer, and the length of its frame.
    Replication(Box<Envelope>, usize),
    /// A request of the API (from NATS or made in this process), and where its answer goes.
    Api(Box<(crate::api::Request, super::reply::ReplyTo)>),
    /// A connection event.
    Event(TransportEvent),
    /// The pending delta, filled by updates applied in the subscription tasks, is full:
    /// commit it.
    Commit,
    /// The state changed and no flush is scheduled: schedule one ([`super::Shared::want_flush`]).
    Wake,
    /// `logged` updates were applied in a subscription task: commit within a millisecond
    /// ([`super::Shared::want_logged_commit`]).
    LoggedCommit,
}

impl Inbound {
    /// Bytes it holds, for the inbound buffer's byte bound.
    pub(super) fn size(&self) -> u64 {
        match self {
            Inbound::Replication(_, len) => *len as u64,
            Inbound::Api(call) => call.0.payload_len() as u64,
            Inbound::Event(_) | Inbound::Commit | Inbound::Wake | Inbound::LoggedCommit => 0,
        }
    }
}

/// Where a subscription task sends what it received.
pub(crate) enum Route {
    /// To the actor, through the inbound buffer.
    Actor(Inbound),
    /// Nowhere: answered, or not for this replica.
    Drop,
    /// Answered in the task: publish this reply (subject, headers, payload).
    Reply(String, async_nats::HeaderMap, Bytes),
}

/// What the publisher task sends, in order. Boxed, as [`Inbound`] is.
pub(super) enum Outbound {
    /// A replication frame (subject, frame).
    Publish(Box<(String, Bytes)>, Channel),
    /// A full state, framed chunk by chunk as it is published (see [`StatePush`]).
    State(Box<StatePush>),
    /// A reply of the request API (subject, payload, headers).
    Reply(Box<(String, Bytes, async_nats::HeaderMap)>),
    /// Answers once everything queued before it was handed to the transport and flushed.
    Flush(oneshot::Sender<()>),
}

impl Outbound {
    /// The channel label its drop is counted under.
    pub(super) fn channel_label(&self) -> &'static str {
        match self {
            Outbound::Publish(_, channel) => channel_label(*channel),
            Outbound::State(_) => channel_label(Channel::State),
            Outbound::Reply(..) => channel_label(Channel::Api),
            Outbound::Flush(_) => "flush",
        }
    }
}

/// Bytes of a full state's frames handed to the transport between two flushes: what a push
/// holds outside its encoded state.
const STATE_FLUSH_BYTES: usize = 8 << 20;

/// How long the request API's subscriptions outlive a replica whose filter was dropped,
/// refusing what still comes ([`super::reads::Reads::route`] answers "stopped" once the
/// replica closed): the server routes requests here until it has processed the
/// unsubscription, and a request dropped unanswered costs its sender a whole timeout.
/// (async-nats 0.51 has no drain that would end this after one round trip: its `drain`
/// forgets the subscription before the server's PONG.)
pub(crate) const API_LINGER: Duration = Duration::from_millis(500);

/// Forwards a subscription into the actor's inbound buffer, resubscribing if it ends, until
/// the actor is gone (and then, with `linger`, for that long more if the replica's filter
/// was dropped: `route` answers everything by then). A full buffer (in messages or in
/// bytes) drops the message and counts it.
pub(super) async fn forward_stream(
    initial: Option<MessageStream>,
    transport: Arc<dyn Transport>,
    (subject, queue): (String, Option<String>),
    tx: flume::Sender<Inbound>,
    mut route: impl FnMut(Message) -> Route,
    shared: Arc<Shared>,
    linger: Option<Duration>,
) {
    let mut initial = initial;
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut stream = match initial.take() {
            Some(s) => s,
            None => match transport.subscribe(subject.clone(), queue.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%subject, error = %e, "subscribe failed, retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shared.lifecycle.gone() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        let mut lingering = None;
        loop {
            let msg = tokio::select! {
                m = stream.next() => m,
                _ = shared.lifecycle.gone(), if lingering.is_none() => {
                    match linger {
                        Some(d) if shared.dropped.load(Ordering::Acquire) => {
                            lingering = Some(Box::pin(tokio::time::sleep(d)));
                            continue;
                        }
                        _ => return,
                    }
                }
                _ = async { lingering.as_mut().expect("lingering").await }, if lingering.is_some() => {
                    // The refusals go out before this task's hold on the connection (perhaps
                    // the last) is let go.
                    let _ = tokio::time::timeout(API_LINGER, transport.flush()).await;
                    return;
                }
            };
            let Some(msg) = msg else { break };
            backoff = Duration::from_millis(50);
            let item = match route(msg) {
                Route::Actor(item) => item,
                Route::Drop => continue,
                Route::Reply(to, headers, payload) => {
                    if transport
                        .publish_with_headers(to, headers, payload)
                        .await
                        .is_err()
                    {
                        shared.telemetry.publish_error(Channel::Api);
                    }
                    continue;
                }
            };
            if offer(&shared, &tx, item) == Err(Refused::Closed) {
                return;
            }
        }
        tracing::warn!(%subject, "subscription ended, resubscribing");
    }
}

/// Why [`offer`] dropped an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The buffer is full (counted).
    Full,
    /// The actor is gone.
    Closed,
}

/// Puts `item` in the actor's inbound buffer, bounded in messages by the channel and in bytes
/// here (a flood of large chunks must not pile up in memory while the actor is busy). A full
/// buffer drops it and counts.
pub(super) fn offer(
    shared: &Shared,
    tx: &flume::Sender<Inbound>,
    item: Inbound,
) -> Result<(), Refused> {
    let size = item.size();
    let queued = shared.inbound_bytes.fetch_add(size, Ordering::AcqRel);
    let result = if queued + size > shared.inbound_max_bytes {
        Err(Refused::Full)
    } else {
        tx.try_send(item).map_err(|e| match e {
            flume::TrySendError::Full(_) => Refused::Full,
            flume::TrySendError::Disconnected(_) => Refused::Closed,
        })
    };
    if let Err(refused) = result {
        shared.inbound_bytes.fetch_sub(size, Ordering::AcqRel);
        if refused == Refused::Full {
            shared.telemetry.inbound_dropped();
        }
    }
    result
}

/// Turns a message of the replication subscription into an [`Inbound`]: decoded, verified and
/// checked against its subject; own echoes and anything invalid are dropped (and counted).
pub(crate) struct ReplicationRouter {
    pub codec: WireCodec,
    /// The replica's own uuid: its echoes are dropped.
    pub me: Uuid,
    pub subjects: Arc<Subjects>,
    /// Logs what it refuses, at a bounded rate.
    pub limiter: Arc<LogLimiter>,
}

impl ReplicationRouter {
    /// Where `msg` goes. The replica's `Shared` comes with each message rather than being
    /// held: the inlet that holds a router lives in it.
    pub(crate) fn route(&self, shared: &Shared, msg: Message) -> Route {
        // Only the exact delta and state subjects count, each for its own bodies: the
        // subscription's wildcard also hears `<filter>.api` requests (answered by the API
        // subscription) and whatever anyone publishes on `<filter>.<anything>`.
        let channel = match self.subjects.channel(&msg.subject) {
            Some(c @ (Channel::Delta | Channel::State)) => c,
            Some(Channel::Api) => return Route::Drop,
            None => {
                let e =
                    WireError::Subject(format!("`{}` is not a replication subject", msg.subject));
                reject(shared, &self.limiter, &e);
                return Route::Drop;
            }
        };
        match self.codec.decode(&msg.payload) {
            Ok(env) if env.sender == self.me => {
                shared.telemetry.echo();
                Route::Drop
            }
            Ok(env) if (channel == Channel::Delta) != env.body.is_delta() => {
                let what = if env.body.is_delta() {
                    "delta"
                } else {
                    "state message"
                };
                let e = WireError::Subject(format!("a {what} on `{}`", msg.subject));
                reject(shared, &self.limiter, &e);
                Route::Drop
            }
            Ok(env) => {
                if self.codec.takes_unverified(&msg.payload) {
                    unverified(shared, &self.limiter);
                }
                Route::Actor(Inbound::Replication(Box::new(env), msg.payload.len()))
            }
            Err(e) => {
                reject(shared, &self.limiter, &e);
                Route::Drop
            }
        }
    }
}

/// Where the node's shared replication subscription hands a replica its messages
/// ([`crate::replica::ReplicaConfig::routed_replication`]).
pub(crate) struct Inlet {
    pub router: ReplicationRouter,
    pub to_actor: flume::Sender<Inbound>,
}

/// A message of `shared`'s replica's replication subject, routed by the node: decoded and
/// checked, then offered to the actor (as its own subscription's task would). From a
/// digest batch (`batched`), only a digest outside the sequence is taken: a batch is no
/// way around the order of a sender's numbered messages.
pub(crate) fn route_replication(shared: &Shared, msg: Message, batched: bool) {
    let Some(inlet) = shared.replication_inlet.get() else {
        return;
    };
    let Route::Actor(item) = inlet.router.route(shared, msg) else {
        return;
    };
    if batched
        && let Inbound::Replication(env, _) = &item
        && !(env.seq == 0 && matches!(env.body, crate::wire::Body::Digest { .. }))
    {
        let e =
            WireError::Subject("a digest batch carries digests outside the sequence only".into());
        return reject(shared, &inlet.router.limiter, &e);
    }
    let _ = offer(shared, &inlet.to_actor, item);
}

/// A connection event of the node's transport, handed to `shared`'s replica by its node
/// ([`crate::replica::ReplicaConfig::routed_replication`]). Waits for room in a full inbound
/// buffer rather than drop it: a lost `Connected` would leave the replica without the state
/// requests a reconnection makes. Nothing for a replica that takes its own events.
pub(crate) async fn route_event(shared: &Shared, ev: TransportEvent) {
    if let Some(inlet) = shared.replication_inlet.get() {
        // A closed buffer: the replica stopped.
        let _ = inlet.to_actor.send_async(Inbound::Event(ev)).await;
    }
}

/// The transport's connection events, as the actor takes them.
pub(super) fn events(
    events: tokio::sync::broadcast::Receiver<TransportEvent>,
) -> impl futures::Stream<Item = Inbound> {
    crate::transport::event_stream(events).map(Inbound::Event)
}

/// The publisher: started by the actor when it queues something and none runs, it sends
/// until the queue is empty, then ends. One at a time ([`Shared::publishing`]), so frames
/// leave in the order they were queued. Replication goes out on `replication` (no echo where
/// the transport can), API replies on `transport`.
pub(super) async fn publish(
    out: flume::Receiver<Outbound>,
    transport: Arc<dyn Transport>,
    replication: Arc<dyn Transport>,
    shared: Arc<Shared>,
    limiter: Arc<LogLimiter>,
) {
    let telemetry = &shared.telemetry;
    loop {
        let o = match out.try_recv() {
            Ok(o) => o,
            Err(_) => {
                shared.publishing.store(false, Ordering::Release);
                // A message queued between the last look and the store above found the flag
                // still set and started no task: this one takes it, unless one started since.
                if out.is_empty() || shared.publishing.swap(true, Ordering::AcqRel) {
                    return;
                }
                continue;
            }
        };
        let (sent, channel) = match o {
            Outbound::Publish(frame, channel) => {
                let (subject, payload) = *frame;
                (replication.publish(subject, payload).await, channel)
            }
            Outbound::State(push) => {
                let mut sent = Ok(());
                let mut unflushed = 0;
                for i in 0..push.count() {
                    if let Some(pacing) = push.pacing() {
                        // Ahead of a receiver by a window: what went out must reach it
                        // before it can report.
                        if pacing.pace(i as u32, std::time::Instant::now()) != Pace::Go {
                            unflushed = 0;
                            let _ = replication.flush().await;
                            pacing.wait(i as u32).await;
                        }
                    }
                    let Some(frame) = push.frame(i) else { break };
                    telemetry.traffic(Direction::Out, Channel::State, frame.len());
                    unflushed += frame.len();
                    sent = replication
                        .publish(push.subject.clone(), frame.into())
                        .await;
                    if sent.is_err() {
                        // The rest would not get through either; anti-entropy repairs.
                        break;
                    }
                    // The client queues what it was handed faster than the socket takes it:
                    // unpaced, a large state sat in its queue as frames, a second copy.
                    if unflushed >= STATE_FLUSH_BYTES {
                        unflushed = 0;
                        let _ = replication.flush().await;
                    }
                }
                // Its numbers are all out (or lost for good): digests may claim them again.
                shared.pushes_out.fetch_sub(1, Ordering::AcqRel);
                (sent, Channel::State)
            }
            Outbound::Reply(reply) => {
                let (subject, payload, headers) = *reply;
                (
                    transport
                        .publish_with_headers(subject, headers, payload)
                        .await,
                    Channel::Api,
                )
            }
            Outbound::Flush(done) => {
                let _ = replication.flush().await;
                let _ = transport.flush().await;
                let _ = done.send(());
                continue;
            }
        };
        if let Err(e) = sent {
            telemetry.publish_error(channel);
            if let Some(n) = limiter.allow("publish") {
                tracing::warn!(error = %e, suppressed = n, "publish failed; anti-entropy will repair");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FilterSpec;
    use crate::replica::durable::Identity;
    use crate::replica::filter::AnyFilter;
    use crate::replica::metrics::Telemetry;
    use crate::wire::{Body, Expect, FilterKind};

    /// A replica's `Shared` with a routed inlet, what its actor would receive, and a codec
    /// of its peers.
    fn routed() -> (Arc<Shared>, flume::Receiver<Inbound>, WireCodec) {
        let filter = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, 1_000, 0.01), 1).unwrap();
        let expect = Expect {
            filter: "t".into(),
            kind: FilterKind::GBloom,
            params_digest: filter.params_digest(),
            generation: 0,
            max_bytes: 1 << 20,
        };
        let me = Uuid::new_v4();
        let shared = Arc::new(Shared::new(
            filter,
            "t".into(),
            Identity {
                uuid: me,
                replica: 1,
            },
            Telemetry::new("t", 1, 0.01, false),
            u64::MAX,
            crate::api::batch::Limits::new(1_000, 1024),
            true,
        ));
        let codec = WireCodec::new(expect, None);
        let limiter = Arc::new(LogLimiter::new(Duration::from_secs(10)));
        let (to_actor, from_node) = flume::bounded(16);
        let router = ReplicationRouter {
            codec: codec.clone(),
            me,
            subjects: Arc::new(Subjects::new("crpf", "t")),
            limiter,
        };
        let inlet = Inlet { router, to_actor };
        assert!(shared.replication_inlet.set(inlet).is_ok());
        (shared, from_node, codec)
    }

    fn frame(codec: &WireCodec, seq: u64, body: Body) -> Message {
        let filter = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, 1_000, 0.01), 1).unwrap();
        let env = Envelope::new(
            "t",
            FilterKind::GBloom,
            filter.params_digest(),
            Uuid::new_v4(),
            2,
            seq,
            body,
        );
        Message {
            subject: "crpf.t.state".into(),
            payload: codec.encode(&env).into(),
            reply: None,
            headers: None,
        }
    }

    #[test]
    fn a_digest_batch_carries_digests_outside_the_sequence_only() {
        let (shared, actor, codec) = routed();
        let digest = || Body::Digest {
            digest: 7,
            ready: true,
            sent: None,
            spacing: None,
        };
        let request = || Body::StateRequest { target: None };
        route_replication(&shared, frame(&codec, 0, digest()), true);
        assert!(actor.try_recv().is_ok(), "a batched digest is taken");
        for refused in [frame(&codec, 5, digest()), frame(&codec, 0, request())] {
            route_replication(&shared, refused, true);
            assert!(actor.try_recv().is_err(), "refused from a batch");
        }
        // On the filter's own subject, numbered messages are what they were.
        route_replication(&shared, frame(&codec, 5, request()), false);
        assert!(actor.try_recv().is_ok());
    }
}
