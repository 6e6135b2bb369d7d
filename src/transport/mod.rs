//! Transports (docs/DESIGN.md sections 4 and 5): what replicas publish on and subscribe to.
//!
//! [`Transport`] is what a replica needs: a [`Bus`] (publish, subscribe, optionally in a queue
//! group, request/reply, the server's `max_payload`, connection events) and an [`IdRegistry`]
//! (replica id claims as leases, see [`ClaimRecord`]). Two implementations of both:
//! [`NatsTransport`] (async-nats: core subjects, JetStream KV for ids) and [`InProcessBus`]
//! (no server: several replicas in one program, and fast tests). [`FaultyTransport`] wraps
//! either and drops messages on purpose, to show that anti-entropy repairs what is lost.

mod bus;
pub mod catalog;
pub mod digests;
mod fault;
mod kv_catalog;
mod nats;
pub(crate) mod registry;
mod retry;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use thiserror::Error;
use tokio::sync::broadcast;
use uuid::Uuid;

pub use bus::InProcessBus;
pub use catalog::{
    Catalog, CatalogChange, CatalogEntry, CatalogError, Created, Listing, MemoryCatalog, Reoffered,
};
pub use fault::{FaultConfig, FaultyTransport};
pub use kv_catalog::KvCatalog;
pub use nats::{NatsConfig, NatsTransport, TlsConfig};
pub use registry::{Claim, ClaimEntry, ClaimRecord, Renewal};

use crate::ReplicaId;

/// A message received on a subscription.
#[derive(Debug, Clone)]
pub struct Message {
    /// The subject it was published on.
    pub subject: String,
    /// Its payload.
    pub payload: Bytes,
    /// Where to send a reply, for requests.
    pub reply: Option<String>,
    /// NATS headers, if it had any (the request API reads `Crpf-Ack`).
    pub headers: Option<async_nats::HeaderMap>,
}

/// A stream of received messages; it ends when the subscription does.
pub type MessageStream = BoxStream<'static, Message>;

/// A transport's connection events as a stream (from [`Bus::events`]): a lagging receiver
/// skips what it missed, since the next event tells the connection's state; the stream ends
/// with the transport.
pub(crate) fn event_stream(
    events: broadcast::Receiver<TransportEvent>,
) -> impl futures::Stream<Item = TransportEvent> {
    futures::stream::unfold(events, |mut events| async move {
        loop {
            match events.recv().await {
                Ok(ev) => return Some((ev, events)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// Connection events a replica reacts to (re-announce) and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportEvent {
    /// (Re)connected: what was published meanwhile may be lost.
    Connected,
    /// Lost the connection; publishes may vanish until it is back.
    Disconnected,
    /// A subscription's buffer overflowed: messages were dropped client-side.
    SlowConsumer,
    /// The connection is closed for good.
    Closed,
}

/// The error under a [`TransportError`], kept whole for the cause chain (the `crpf` binary
/// prints one cause per line), as async-nats keeps its sources.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// `Some` cause of an error.
pub(crate) fn cause(e: impl std::error::Error + Send + Sync + 'static) -> Option<Cause> {
    Some(Arc::new(e))
}

/// What can go wrong in a transport: what was being done (`context`), and the error that
/// caused it, if another layer raised one (`source`).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Could not connect (or not configured correctly).
    #[error("connect: {context}")]
    Connect {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Option<Cause>,
    },
    /// A payload over the server's `max_payload`.
    #[error("payload of {len} bytes exceeds max_payload {max}")]
    MaxPayload {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Publish failed.
    #[error("publish: {context}")]
    Publish {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Option<Cause>,
    },
    /// Subscribe failed.
    #[error("subscribe: {context}")]
    Subscribe {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Option<Cause>,
    },
    /// A request had no reply in time, or no responder.
    #[error("request: {context}")]
    Request {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Option<Cause>,
    },
    /// Claiming a replica id, or renewing or retiring a claim, failed.
    #[error("replica id claim: {context}")]
    Claim {
        /// What failed.
        context: String,
        /// Why.
        #[source]
        source: Option<Cause>,
    },
    /// The server runs without JetStream, which replica ids and the filter catalog need:
    /// waiting cannot fix that.
    #[error(
        "the NATS server {server} runs without JetStream, where crpf keeps replica ids and the \
         filter catalog: start it with `nats-server -js` (or a `jetstream {{}}` block in its \
         configuration file)"
    )]
    NoJetStream {
        /// The server's name and address, as it announced them.
        server: String,
    },
}

impl TransportError {
    /// A [`TransportError::Request`] without a further cause.
    pub(crate) fn request(context: impl Into<String>) -> Self {
        TransportError::Request {
            context: context.into(),
            source: None,
        }
    }

    /// A [`TransportError::Claim`] without a further cause.
    pub(crate) fn claim(context: impl Into<String>) -> Self {
        TransportError::Claim {
            context: context.into(),
            source: None,
        }
    }

    /// A [`TransportError::Connect`] without a further cause.
    pub(crate) fn connect(context: impl Into<String>) -> Self {
        TransportError::Connect {
            context: context.into(),
            source: None,
        }
    }
}

/// The message bus replicas talk to each other on. Futures are `'static` so that an actor can
/// spawn them without holding any of its state across an `.await`.
pub trait Bus: Send + Sync + 'static {
    /// Short name for logs (`nats`, `bus`).
    fn name(&self) -> &'static str;

    /// Publishes a payload (at most once: it may be lost).
    fn publish(
        &self,
        subject: String,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>>;

    /// Publishes a payload with NATS headers (the request API's replies name the replica
    /// that answered). The default drops the headers: a transport that cannot carry them
    /// still delivers the payload.
    fn publish_with_headers(
        &self,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let _ = headers;
        self.publish(subject, payload)
    }

    /// Subscribes to a subject (NATS wildcards `*` and `>` allowed); with a queue group, each
    /// message goes to one member of the group.
    fn subscribe(
        &self,
        subject: String,
        queue_group: Option<String>,
    ) -> BoxFuture<'static, Result<MessageStream, TransportError>>;

    /// Sends a request and waits for the first reply.
    fn request(
        &self,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, TransportError>>;

    /// Largest payload the server accepts.
    fn max_payload(&self) -> usize;

    /// Connection events from now on.
    fn events(&self) -> broadcast::Receiver<TransportEvent>;

    /// Whether the connection is up now.
    fn is_connected(&self) -> bool;

    /// Waits until what was published so far has been handed to the server.
    fn flush(&self) -> BoxFuture<'static, Result<(), TransportError>>;

    /// Waits for a round trip to the server: everything sent before it, subscriptions
    /// included, has then been processed, so other clients of that server find the
    /// subscriptions ([`Bus::flush`] only hands bytes to the socket). The default is `flush`,
    /// for a bus that applies a subscription as it is made.
    fn round_trip(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        self.flush()
    }

    /// A transport for one replica's replication traffic that does not deliver what it
    /// publishes to its own subscriptions ("no echo"), so that a replica does not receive its
    /// own deltas and full states back; every other subscriber, on this transport or any
    /// other, still receives them. `None` (the default) if this transport cannot make one:
    /// the replica then receives its own messages and drops them by their sender.
    ///
    /// NATS's `no_echo` is a property of a whole connection, so [`NatsTransport`] opens one
    /// connection per call: two replicas sharing one transport (one connection) would
    /// otherwise not hear each other, and requests made on that connection would not reach
    /// a replica's API subscriptions on it.
    fn replication_transport(
        &self,
    ) -> BoxFuture<'static, Result<Option<Arc<dyn Transport>>, TransportError>> {
        Box::pin(async { Ok(None) })
    }
}

/// The registry of replica ids (docs/DESIGN.md section 4): claims as leases that reserve the tags
/// their holder may issue, renewed, retired when unrenewed, and reused above their floor.
pub trait IdRegistry: Send + Sync + 'static {
    /// Claims a replica id for `filter` on behalf of `claimant` (docs/DESIGN.md section 4): keeps
    /// `preferred` if it is free, retired or already this claimant's, else the lowest retired
    /// id, else the lowest id never used (1 and up). The claimant issues tags above the
    /// returned [`Claim::floor`] only, and only up to a reservation it records with
    /// [`IdRegistry::renew_claim`] first.
    fn claim_replica_id(
        &self,
        filter: String,
        claimant: Uuid,
        preferred: Option<ReplicaId>,
    ) -> BoxFuture<'static, Result<Claim, TransportError>>;

    /// Renews `claimant`'s claim of `id`, recording that it may issue tags up to `reserved`
    /// (never lowered). [`Renewal::Lost`] if the claim is no longer the claimant's.
    fn renew_claim(
        &self,
        filter: String,
        id: ReplicaId,
        claimant: Uuid,
        reserved: u64,
    ) -> BoxFuture<'static, Result<Renewal, TransportError>>;

    /// Every id of `filter` the registry holds a record for.
    fn replica_claims(
        &self,
        filter: String,
    ) -> BoxFuture<'static, Result<Vec<ClaimEntry>, TransportError>>;

    /// Retires `id` with `floor`, if its record is still at `revision` (compare-and-set: a
    /// renewal in between wins). Whether it was retired.
    fn retire_claim(
        &self,
        filter: String,
        id: ReplicaId,
        revision: u64,
        floor: u64,
    ) -> BoxFuture<'static, Result<bool, TransportError>>;
}

/// What a replica needs: a [`Bus`] and an [`IdRegistry`] (NATS has both: core subjects and
/// JetStream KV).
pub trait Transport: Bus + IdRegistry {}

impl<T: Bus + IdRegistry + ?Sized> Transport for T {}

/// What travels on a subject of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `<prefix>.<filter>.delta`: delta-states.
    Delta,
    /// `<prefix>.<filter>.state`: digests, state requests, full states in chunks.
    State,
    /// `<prefix>.<filter>.api` and `<prefix>.<filter>.api.>`: the request API.
    Api,
}

/// The subjects of one filter (docs/DESIGN.md section 5). Every subject name is made and recognized
/// here, so that the replicas, the transports and the fault injector agree on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    /// `<prefix>.<filter>.delta`
    pub delta: String,
    /// `<prefix>.<filter>.state`
    pub state: String,
    /// `<prefix>.<filter>.*`: the pattern of the one replication subscription. One subscription
    /// rather than two keeps a sender's messages in the order it sent them (a sequence gap then
    /// means a loss); receivers accept from it only what [`Subjects::channel`] says is `delta`
    /// or `state`, with an envelope body that belongs there.
    pub replication: String,
    /// `<prefix>.<filter>.api.>`: the API's operations (any ready replica answers; see
    /// [`Subjects::replica_api_root`] for one chosen replica).
    pub api: String,
    /// `<prefix>.<filter>.api`: a request without an operation, which gets an error reply;
    /// also the API's queue group.
    pub api_root: String,
    /// `<prefix>.<filter>.api`, the API's queue group.
    pub api_queue: String,
}

impl Subjects {
    const DELTA: &'static str = "delta";
    const STATE: &'static str = "state";
    const API: &'static str = "api";
    const REPLICA: &'static str = "replica";

    /// The subjects of `filter` under `prefix`.
    ///
    /// ```
    /// use crpf::transport::{Channel, Subjects};
    /// let s = Subjects::new("crpf", "users");
    /// assert_eq!(s.delta, "crpf.users.delta");
    /// assert_eq!(s.api_subject("add"), "crpf.users.api.add");
    /// assert_eq!(s.channel("crpf.users.state"), Some(Channel::State));
    /// assert_eq!(s.channel("crpf.users.bogus"), None);
    /// assert_eq!(s.api_op("crpf.users.api.add"), Some("add"));
    /// assert_eq!(s.api_op("crpf.users.api"), Some(""));
    /// // One chosen replica's API.
    /// assert_eq!(s.replica_api_subject(3, "stats"), "crpf.users.replica.3.api.stats");
    /// assert_eq!(s.api_target("crpf.users.replica.3.api.stats"), Some((Some(3), "stats")));
    /// assert_eq!(s.api_target("crpf.users.api.add"), Some((None, "add")));
    /// ```
    pub fn new(prefix: &str, filter: &str) -> Self {
        let base = format!("{prefix}.{filter}");
        let api_root = format!("{base}.{}", Self::API);
        Subjects {
            delta: format!("{base}.{}", Self::DELTA),
            state: format!("{base}.{}", Self::STATE),
            replication: format!("{base}.*"),
            api: format!("{api_root}.>"),
            api_queue: api_root.clone(),
            api_root,
        }
    }

    /// `<prefix>.<filter>.api.<op>`.
    pub fn api_subject(&self, op: &str) -> String {
        format!("{}.{op}", self.api_root)
    }

    /// The subscriptions that together cover every API subject (`<...>.api` itself and
    /// `<...>.api.>`): a request on any of them gets a reply.
    pub fn api_subscriptions(&self) -> [&str; 2] {
        [&self.api_root, &self.api]
    }

    /// `<prefix>.<filter>.replica.<id>.api`: the request API of replica `id` alone (no queue
    /// group: only that replica subscribes).
    pub fn replica_api_root(&self, id: ReplicaId) -> String {
        format!("{}.{}.{id}.{}", self.base(), Self::REPLICA, Self::API)
    }

    /// `<prefix>.<filter>.replica.<id>.api.<op>`.
    pub fn replica_api_subject(&self, id: ReplicaId, op: &str) -> String {
        format!("{}.{op}", self.replica_api_root(id))
    }

    /// The request API's operations of every filter under `prefix` (`<prefix>.*.api.>`) and
    /// the queue group a node takes them in (`<prefix>.api`): one subscription of each node
    /// with a catalog, which routes them to its catalog filters (README, "Filters as data").
    /// The group is a name of its own, never a filter's (`<prefix>.<filter>.api`).
    ///
    /// ```
    /// use crpf::transport::Subjects;
    /// assert_eq!(
    ///     Subjects::node_api("crpf"),
    ///     ("crpf.*.api.>".to_string(), "crpf.api".to_string())
    /// );
    /// ```
    pub fn node_api(prefix: &str) -> (String, String) {
        (
            format!("{prefix}.*.{}.>", Self::API),
            format!("{prefix}.{}", Self::API),
        )
    }

    /// Like [`Subjects::api_subscriptions`], for the API of replica `id` alone.
    pub fn replica_api_subscriptions(&self, id: ReplicaId) -> [String; 2] {
        let root = self.replica_api_root(id);
        let all = format!("{root}.>");
        [root, all]
    }

    /// `<prefix>.<filter>`.
    fn base(&self) -> &str {
        self.api_root
            .strip_suffix(Self::API)
            .and_then(|b| b.strip_suffix('.'))
            .expect("api_root ends with .api")
    }

    /// Which of this filter's channels `subject` is exactly; `None` for any other subject
    /// (`<prefix>.<filter>.bogus`, another filter's).
    pub fn channel(&self, subject: &str) -> Option<Channel> {
        if subject == self.delta {
            Some(Channel::Delta)
        } else if subject == self.state {
            Some(Channel::State)
        } else if self.api_op(subject).is_some() {
            Some(Channel::Api)
        } else {
            None
        }
    }

    /// The operation of an API subject of this filter: `Some("add")` for `<...>.api.add`
    /// and `<...>.replica.<id>.api.add`, `Some("")` for `<...>.api` itself (no operation),
    /// `None` if not an API subject.
    pub fn api_op<'a>(&self, subject: &'a str) -> Option<&'a str> {
        self.api_target(subject).map(|(_, op)| op)
    }

    /// The replica an API subject of this filter addresses (`None`: any, through the queue
    /// group) and its operation (`""` for none); `None` if not an API subject.
    pub fn api_target<'a>(&self, subject: &'a str) -> Option<(Option<ReplicaId>, &'a str)> {
        fn op_of(rest: &str) -> Option<&str> {
            if rest.is_empty() {
                Some("")
            } else {
                rest.strip_prefix('.')
            }
        }
        if let Some(rest) = subject.strip_prefix(self.api_root.as_str()) {
            return op_of(rest).map(|op| (None, op));
        }
        let rest = subject
            .strip_prefix(self.base())?
            .strip_prefix('.')?
            .strip_prefix(Self::REPLICA)?
            .strip_prefix('.')?;
        let (id, rest) = rest.split_once('.')?;
        // Only the canonical spelling of an id: it is what replicas subscribe to.
        let id: ReplicaId = id
            .parse()
            .ok()
            .filter(|n: &ReplicaId| n.to_string() == id)?;
        let op = op_of(rest.strip_prefix(Self::API)?)?;
        Some((Some(id), op))
    }

    /// The channel of a subject of any filter under any prefix, by its last two tokens: for
    /// code that does not know the filter (the fault injector).
    pub fn channel_of(subject: &str) -> Option<Channel> {
        let mut tokens = subject.rsplit('.');
        let last = tokens.next()?;
        let before = tokens.next();
        if last == Self::API || before == Some(Self::API) {
            Some(Channel::Api)
        } else if last == Self::DELTA {
            Some(Channel::Delta)
        } else if last == Self::STATE {
            Some(Channel::State)
        } else {
            None
        }
    }
}

/// Whether `s` is a valid single subject token (filter names, prefixes' parts).
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Rate limit for repeated warnings (rejects, slow consumers): each key passes at most once per
/// period, and says how many were suppressed since the last time it passed.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    period: Duration,
    last: std::sync::Mutex<std::collections::HashMap<&'static str, (std::time::Instant, u64)>>,
}

impl LogLimiter {
    pub(crate) fn new(period: Duration) -> Self {
        LogLimiter {
            period,
            last: Default::default(),
        }
    }

    /// `Some(suppressed)` if a message for `key` may be logged now.
    pub(crate) fn allow(&self, key: &'static str) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut last = self.last.lock().expect("log limiter lock");
        match last.get_mut(key) {
            Some((at, suppressed)) if now.duration_since(*at) < self.period => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                *at = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                last.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

/// How long a subscriber waits for each subscription, and then for the server to confirm
/// them ([`subscribe_now`], [`confirm_subscriptions`]).
pub(crate) const SUBSCRIBED_TIMEOUT: Duration = Duration::from_secs(5);

/// A subscription made now, or `None` if the transport is disconnected, refuses it or takes
/// longer than [`SUBSCRIBED_TIMEOUT`]: its task then subscribes again (and logs why). Giving
/// up on a subscribe is safe, since async-nats sends a subscription whole or not at all.
pub(crate) async fn subscribe_now(
    transport: &Arc<dyn Transport>,
    subject: &str,
    queue: Option<String>,
) -> Option<MessageStream> {
    if !transport.is_connected() {
        return None;
    }
    let subscribing = transport.subscribe(subject.to_string(), queue);
    match tokio::time::timeout(SUBSCRIBED_TIMEOUT, subscribing).await {
        Ok(Ok(stream)) => Some(stream),
        _ => None,
    }
}

/// Waits until the server has processed the subscriptions made before: it answers a request
/// sent after them. Disconnected, nobody could reach them anyway: `Ok` at once.
pub(crate) async fn confirm_subscriptions(
    transport: &Arc<dyn Transport>,
) -> Result<(), TransportError> {
    if !transport.is_connected() {
        return Ok(());
    }
    tokio::time::timeout(SUBSCRIBED_TIMEOUT, transport.round_trip())
        .await
        .unwrap_or_else(|_| Err(TransportError::request("timed out")))
}

/// Serves a subscription to `subject` (in `queue`, if any) until `stopped` says so: every
/// message goes to `handle`, in order, and the subscription is made again whenever it fails
/// (after a backoff doubling from 50 ms up to 5 s) or ends. `initial`: one made already.
pub(crate) async fn serve_subscription<F, Fut>(
    transport: Arc<dyn Transport>,
    (subject, queue): (String, Option<String>),
    mut initial: Option<MessageStream>,
    stopped: impl Fn() -> bool,
    mut handle: F,
) where
    F: FnMut(Message) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures::StreamExt;
    let mut backoff = Duration::from_millis(50);
    while !stopped() {
        let subscribed = match initial.take() {
            Some(stream) => Ok(stream),
            None => transport.subscribe(subject.clone(), queue.clone()).await,
        };
        let mut stream = match subscribed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%subject, error = %e, "cannot subscribe; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        while let Some(msg) = stream.next().await {
            // Handled even if it came as the server stops: a request taken is answered.
            backoff = Duration::from_millis(50);
            handle(msg).await;
            if stopped() {
                return;
            }
        }
        if stopped() {
            return;
        }
        tracing::warn!(%subject, "subscription ended, subscribing again");
        tokio::time::sleep(backoff).await;
    }
}

/// Whether a NATS subject with wildcards matches a concrete subject.
pub(crate) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(subject_matches("a.b.*", "a.b.c"));
        assert!(!subject_matches("a.b.*", "a.b.c.d"));
        assert!(subject_matches("a.>", "a.b.c.d"));
        assert!(!subject_matches("a.>", "a"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.c"));
        assert!(is_token("users_1-x") && !is_token("a.b") && !is_token("") && !is_token("a*"));
    }

    #[test]
    fn subjects_are_exact() {
        let s = Subjects::new("crpf", "f");
        assert_eq!(s.channel("crpf.f.delta"), Some(Channel::Delta));
        assert_eq!(s.channel("crpf.f.state"), Some(Channel::State));
        assert_eq!(s.channel("crpf.f.api"), Some(Channel::Api));
        assert_eq!(s.channel("crpf.f.api.add"), Some(Channel::Api));
        for other in [
            "crpf.f.bogus",
            "crpf.g.delta",
            "crpf.f.delta.x",
            "crpf.f.apix",
            "crpf.f",
        ] {
            assert_eq!(s.channel(other), None, "{other}");
        }
        assert_eq!(s.api_op("crpf.f.api.add.more"), Some("add.more"));
        // One replica's API.
        assert_eq!(s.channel("crpf.f.replica.7.api"), Some(Channel::Api));
        assert_eq!(s.api_target("crpf.f.replica.7.api"), Some((Some(7), "")));
        assert_eq!(
            s.api_target("crpf.f.replica.7.api.madd"),
            Some((Some(7), "madd"))
        );
        for other in [
            "crpf.f.replica.07.api.add",
            "crpf.f.replica.x.api.add",
            "crpf.f.replica.70000.api.add",
            "crpf.f.replica.7.apix",
            "crpf.f.replica.7",
            "crpf.f.replica",
            "crpf.g.replica.7.api.add",
        ] {
            assert_eq!(s.api_target(other), None, "{other}");
        }
        let [root, all] = s.replica_api_subscriptions(7);
        assert_eq!(
            (root.as_str(), all.as_str()),
            ("crpf.f.replica.7.api", "crpf.f.replica.7.api.>")
        );
        for subject in ["crpf.f.replica.7.api", "crpf.f.replica.7.api.stats"] {
            let hits = [&root, &all]
                .iter()
                .filter(|p| subject_matches(p, subject))
                .count();
            assert_eq!(hits, 1, "{subject}");
            // Neither the shared API subscriptions nor the replication one hear it.
            assert!(
                !s.api_subscriptions()
                    .iter()
                    .any(|p| subject_matches(p, subject))
            );
            assert!(!subject_matches(&s.replication, subject));
            assert_eq!(Subjects::channel_of(subject), Some(Channel::Api));
        }
        assert!(!subject_matches(&all, "crpf.f.replica.8.api.stats"));
        assert_eq!(s.api_op("crpf.f.apix"), None);
        // Every API subject is covered by one of the API subscriptions, and nothing else is.
        for subject in ["crpf.f.api", "crpf.f.api.add", "crpf.f.api.a.b"] {
            let hits = s
                .api_subscriptions()
                .iter()
                .filter(|p| subject_matches(p, subject))
                .count();
            assert_eq!(hits, 1, "{subject}");
        }
        assert!(
            !s.api_subscriptions()
                .iter()
                .any(|p| subject_matches(p, "crpf.f.delta"))
        );
        assert!(subject_matches(&s.replication, "crpf.f.delta"));
        assert!(subject_matches(&s.replication, "crpf.f.state"));
        // Without knowing the filter (fault injection).
        assert_eq!(Subjects::channel_of("my.pre.f.delta"), Some(Channel::Delta));
        assert_eq!(Subjects::channel_of("crpf.f.state"), Some(Channel::State));
        assert_eq!(Subjects::channel_of("crpf.f.api.delta"), Some(Channel::Api));
        assert_eq!(Subjects::channel_of("crpf.f.api"), Some(Channel::Api));
        assert_eq!(Subjects::channel_of("_INBOX.x"), None);
    }

    #[test]
    fn log_limiter_suppresses_and_counts() {
        let l = LogLimiter::new(Duration::from_secs(3600));
        assert_eq!(l.allow("a"), Some(0));
        assert_eq!(l.allow("a"), None);
        assert_eq!(l.allow("b"), Some(0));
        let l = LogLimiter::new(Duration::ZERO);
        assert_eq!(l.allow("a"), Some(0));
        assert_eq!(l.allow("a"), Some(0));
    }
}
