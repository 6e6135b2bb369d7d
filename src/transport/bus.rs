//! The in-process bus: NATS-like subjects, queue groups and request/reply inside one program.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use super::registry;
use super::{
    Bus, Claim, ClaimEntry, ClaimRecord, IdRegistry, Message, MessageStream, Renewal, Transport,
    TransportError, TransportEvent, subject_matches,
};
use crate::ReplicaId;

/// A message bus inside one process, with the [`Transport`] interface: the embedded default,
/// for running several replicas with no server, and for tests. Like core NATS it delivers at
/// most once: a subscriber whose buffer is full loses the message (counted in
/// [`InProcessBus::dropped`]). Clones share the bus.
///
/// ```
/// use crpf::transport::{Bus, IdRegistry, InProcessBus};
/// use futures::StreamExt;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let bus = InProcessBus::new();
/// let mut sub = bus.subscribe("a.*".into(), None).await?;
/// bus.publish("a.b".into(), "hi".into()).await?;
/// assert_eq!(sub.next().await.unwrap().payload, "hi");
/// assert_eq!(bus.claim_replica_id("f".into(), uuid::Uuid::new_v4(), None).await?.id, 1);
/// # Ok::<(), crpf::transport::TransportError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct InProcessBus {
    inner: Arc<Inner>,
    /// Nonzero for a handle made by [`Transport::replication_transport`]: what it publishes
    /// skips the subscriptions it made (no echo). 0 for the shared handle, which echoes.
    endpoint: u64,
}

struct Inner {
    state: Mutex<BusState>,
    events: broadcast::Sender<TransportEvent>,
    max_payload: usize,
    buffer: usize,
    dropped: AtomicU64,
    /// Last endpoint number handed out.
    endpoints: AtomicU64,
    /// The filter catalog of every node on this bus.
    catalog: super::MemoryCatalog,
}

#[derive(Default)]
struct BusState {
    subs: Vec<Sub>,
    /// Round-robin position per queue group.
    rr: HashMap<String, usize>,
    /// `filter -> id -> (record, revision)`.
    claims: HashMap<String, HashMap<ReplicaId, (ClaimRecord, u64)>>,
}

struct Sub {
    pattern: String,
    queue: Option<String>,
    tx: mpsc::Sender<Message>,
    /// The endpoint of the handle that subscribed (see [`InProcessBus::endpoint`]).
    endpoint: u64,
}

impl Default for InProcessBus {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessBus {
    /// A bus with NATS's default `max_payload` (1 MiB) and subscription buffer (65,536).
    pub fn new() -> Self {
        Self::with_limits(1 << 20, 65_536)
    }

    /// The filter catalog shared by everything on this bus.
    pub fn catalog(&self) -> super::MemoryCatalog {
        self.inner.catalog.clone()
    }

    /// A bus with the given payload limit and per-subscription buffer.
    pub fn with_limits(max_payload: usize, buffer: usize) -> Self {
        InProcessBus {
            inner: Arc::new(Inner {
                state: Mutex::new(BusState::default()),
                events: broadcast::channel(64).0,
                max_payload,
                buffer: buffer.max(1),
                dropped: AtomicU64::new(0),
                endpoints: AtomicU64::new(0),
                catalog: super::MemoryCatalog::new(),
            }),
            endpoint: 0,
        }
    }

    /// Messages lost because a subscriber's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Delivers to every plain subscriber and one member per queue group, with NATS's subject
    /// matching (`*` one token, `>` one or more); answers how many subscriptions matched.
    fn deliver(&self, msg: Message) -> Result<usize, TransportError> {
        if msg.payload.len() > self.inner.max_payload {
            return Err(TransportError::MaxPayload {
                len: msg.payload.len(),
                max: self.inner.max_payload,
            });
        }
        let mut st = self.inner.state.lock().expect("bus lock");
        st.subs.retain(|s| !s.tx.is_closed());
        let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
        let mut targets = Vec::new();
        for (i, s) in st.subs.iter().enumerate() {
            let echo = self.endpoint != 0 && s.endpoint == self.endpoint;
            if !echo && subject_matches(&s.pattern, &msg.subject) {
                match &s.queue {
                    Some(q) => groups.entry(q.clone()).or_default().push(i),
                    None => targets.push(i),
                }
            }
        }
        for (q, members) in groups {
            let n = st.rr.entry(q).or_insert(0);
            targets.push(members[*n % members.len()]);
            *n = n.wrapping_add(1);
        }
        for &i in &targets {
            if st.subs[i].tx.try_send(msg.clone()).is_err() {
                self.inner.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(targets.len())
    }

    fn add_sub(&self, pattern: String, queue: Option<String>) -> MessageStream {
        let (tx, rx) = mpsc::channel(self.inner.buffer);
        let mut st = self.inner.state.lock().expect("bus lock");
        st.subs.push(Sub {
            pattern,
            queue,
            tx,
            endpoint: self.endpoint,
        });
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
            .boxed()
    }
}

impl Bus for InProcessBus {
    fn name(&self) -> &'static str {
        "bus"
    }

    fn publish(
        &self,
        subject: String,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let r = self.deliver(Message {
            subject,
            payload,
            reply: None,
            headers: None,
        });
        futures::future::ready(r.map(|_| ())).boxed()
    }

    fn publish_with_headers(
        &self,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let r = self.deliver(Message {
            subject,
            payload,
            reply: None,
            headers: Some(headers),
        });
        futures::future::ready(r.map(|_| ())).boxed()
    }

    fn subscribe(
        &self,
        subject: String,
        queue_group: Option<String>,
    ) -> BoxFuture<'static, Result<MessageStream, TransportError>> {
        futures::future::ready(Ok(self.add_sub(subject, queue_group))).boxed()
    }

    fn request(
        &self,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, TransportError>> {
        let inbox = format!("_INBOX.{}", Uuid::new_v4().simple());
        let mut replies = self.add_sub(inbox.clone(), None);
        let sent = self.deliver(Message {
            subject,
            payload,
            reply: Some(inbox),
            headers: None,
        });
        async move {
            // Like NATS: a request nobody subscribes to fails at once.
            if sent? == 0 {
                return Err(TransportError::request("no responders"));
            }
            match tokio::time::timeout(timeout, replies.next()).await {
                Ok(Some(m)) => Ok(m.payload),
                Ok(None) => Err(TransportError::request("bus closed")),
                Err(_) => Err(TransportError::request("timed out")),
            }
        }
        .boxed()
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload
    }

    fn events(&self) -> broadcast::Receiver<TransportEvent> {
        self.inner.events.subscribe()
    }

    fn is_connected(&self) -> bool {
        true
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        futures::future::ready(Ok(())).boxed()
    }

    /// A handle on the same bus that does not deliver what it publishes to the
    /// subscriptions made through it (NATS's `no_echo`, for one replica).
    fn replication_transport(
        &self,
    ) -> BoxFuture<'static, Result<Option<Arc<dyn Transport>>, TransportError>> {
        let endpoint = self.inner.endpoints.fetch_add(1, Ordering::Relaxed) + 1;
        let t = InProcessBus {
            inner: self.inner.clone(),
            endpoint,
        };
        futures::future::ready(Ok(Some(Arc::new(t) as Arc<dyn Transport>))).boxed()
    }
}

impl IdRegistry for InProcessBus {
    fn claim_replica_id(
        &self,
        filter: String,
        claimant: Uuid,
        preferred: Option<ReplicaId>,
    ) -> BoxFuture<'static, Result<Claim, TransportError>> {
        let mut st = self.inner.state.lock().expect("bus lock");
        let claims = st.claims.entry(filter).or_default();
        let entries: Vec<ClaimEntry> = claims
            .iter()
            .map(|(&id, &(record, revision))| ClaimEntry {
                id,
                record,
                revision,
            })
            .collect();
        let r = match registry::pick_id(&entries, claimant, preferred) {
            Some((id, previous)) => {
                let floor = previous.map_or(0, |e| e.record.floor());
                let revision = previous.map_or(0, |e| e.revision) + 1;
                let record = ClaimRecord::Held {
                    claimant,
                    reserved: floor,
                };
                claims.insert(id, (record, revision));
                Ok(Claim { id, floor })
            }
            None => Err(TransportError::claim("every replica id is taken")),
        };
        futures::future::ready(r).boxed()
    }

    fn renew_claim(
        &self,
        filter: String,
        id: ReplicaId,
        claimant: Uuid,
        reserved: u64,
    ) -> BoxFuture<'static, Result<Renewal, TransportError>> {
        let mut st = self.inner.state.lock().expect("bus lock");
        let r = match st.claims.entry(filter).or_default().get_mut(&id) {
            Some((record @ ClaimRecord::Held { .. }, revision)) if record.held_by(claimant) => {
                *record = ClaimRecord::Held {
                    claimant,
                    reserved: reserved.max(record.floor()),
                };
                *revision += 1;
                Renewal::Held
            }
            _ => Renewal::Lost,
        };
        futures::future::ready(Ok(r)).boxed()
    }

    fn replica_claims(
        &self,
        filter: String,
    ) -> BoxFuture<'static, Result<Vec<ClaimEntry>, TransportError>> {
        let st = self.inner.state.lock().expect("bus lock");
        let mut entries: Vec<ClaimEntry> = st
            .claims
            .get(&filter)
            .into_iter()
            .flatten()
            .map(|(&id, &(record, revision))| ClaimEntry {
                id,
                record,
                revision,
            })
            .collect();
        entries.sort_by_key(|e| e.id);
        futures::future::ready(Ok(entries)).boxed()
    }

    fn retire_claim(
        &self,
        filter: String,
        id: ReplicaId,
        revision: u64,
        floor: u64,
    ) -> BoxFuture<'static, Result<bool, TransportError>> {
        let mut st = self.inner.state.lock().expect("bus lock");
        let r = match st.claims.entry(filter).or_default().get_mut(&id) {
            Some((record, rev)) if *rev == revision => {
                *record = ClaimRecord::Retired {
                    floor: floor.max(record.floor()),
                };
                *rev += 1;
                true
            }
            _ => false,
        };
        futures::future::ready(Ok(r)).boxed()
    }
}

impl std::fmt::Debug for InProcessBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.state.lock().expect("bus lock");
        f.debug_struct("InProcessBus")
            .field("subscriptions", &st.subs.len())
            .field("max_payload", &self.inner.max_payload)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn queue_groups_share_and_requests_reply() {
        rt().block_on(async {
            let bus = InProcessBus::new();
            let mut a = bus.subscribe("s.*".into(), Some("g".into())).await.unwrap();
            let mut b = bus.subscribe("s.*".into(), Some("g".into())).await.unwrap();
            let mut all = bus.subscribe("s.>".into(), None).await.unwrap();
            for _ in 0..4 {
                bus.publish("s.x".into(), Bytes::from_static(b"m"))
                    .await
                    .unwrap();
            }
            for _ in 0..2 {
                a.next().await.unwrap();
                b.next().await.unwrap();
            }
            for _ in 0..4 {
                all.next().await.unwrap();
            }
            let server = bus.clone();
            tokio::spawn(async move {
                let m = a.next().await.unwrap();
                server
                    .publish(m.reply.unwrap(), Bytes::from_static(b"pong"))
                    .await
                    .unwrap();
            });
            // b is in the group too: the request may go to it, so drain it in a second responder.
            let server = bus.clone();
            tokio::spawn(async move {
                if let Some(m) = b.next().await {
                    server
                        .publish(m.reply.unwrap(), Bytes::from_static(b"pong"))
                        .await
                        .unwrap();
                }
            });
            let r = bus
                .request("s.ping".into(), Bytes::new(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(r, "pong");
            let too_big = Bytes::from(vec![0; (1 << 20) + 1]);
            assert!(matches!(
                bus.publish("s.x".into(), too_big).await,
                Err(TransportError::MaxPayload { .. })
            ));
        });
    }

    #[test]
    fn api_subjects_match_like_nats_and_unheard_requests_fail_fast() {
        rt().block_on(async {
            let bus = InProcessBus::new();
            let s = crate::transport::Subjects::new("crpf", "f");
            let mut root = bus.subscribe(s.api_root.clone(), None).await.unwrap();
            let mut ops = bus.subscribe(s.api.clone(), None).await.unwrap();
            let mut repl = bus.subscribe(s.replication.clone(), None).await.unwrap();
            for subject in [
                "crpf.f.api",
                "crpf.f.api.add",
                "crpf.f.api.a.b",
                "crpf.f.delta",
            ] {
                bus.publish(subject.into(), Bytes::new()).await.unwrap();
            }
            assert_eq!(root.next().await.unwrap().subject, "crpf.f.api");
            assert_eq!(ops.next().await.unwrap().subject, "crpf.f.api.add");
            assert_eq!(ops.next().await.unwrap().subject, "crpf.f.api.a.b");
            // `*` is one token: the replication pattern hears `api` but not `api.add`.
            assert_eq!(repl.next().await.unwrap().subject, "crpf.f.api");
            assert_eq!(repl.next().await.unwrap().subject, "crpf.f.delta");
            let r = bus
                .request("nobody.here".into(), Bytes::new(), Duration::from_secs(60))
                .await;
            assert!(matches!(r, Err(TransportError::Request { context, .. }) if context == "no responders"));
        });
    }

    #[test]
    fn full_buffers_drop_and_count() {
        rt().block_on(async {
            let bus = InProcessBus::with_limits(1024, 2);
            let _sub = bus.subscribe("x".into(), None).await.unwrap();
            for _ in 0..5 {
                bus.publish("x".into(), Bytes::new()).await.unwrap();
            }
            assert_eq!(bus.dropped(), 3);
        });
    }

    #[test]
    fn claims_are_unique_and_sticky() {
        rt().block_on(async {
            let bus = InProcessBus::new();
            let (u1, u2) = (Uuid::new_v4(), Uuid::new_v4());
            let id = |c: Result<Claim, TransportError>| c.unwrap().id;
            assert_eq!(id(bus.claim_replica_id("f".into(), u1, None).await), 1);
            assert_eq!(id(bus.claim_replica_id("f".into(), u2, Some(1)).await), 2);
            assert_eq!(id(bus.claim_replica_id("f".into(), u1, Some(1)).await), 1);
            assert_eq!(id(bus.claim_replica_id("g".into(), u2, None).await), 1);
        });
    }

    #[test]
    fn retired_ids_are_reused_above_the_holders_reservation() {
        rt().block_on(async {
            let bus = InProcessBus::new();
            let f = || "f".to_string();
            let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
            let claim = bus.claim_replica_id(f(), old, None).await.unwrap();
            assert_eq!(claim, Claim { id: 1, floor: 0 });
            let renewed = bus.renew_claim(f(), 1, old, 4096).await.unwrap();
            assert_eq!(renewed, Renewal::Held);
            let [entry] = bus.replica_claims(f()).await.unwrap()[..] else {
                panic!("one claim")
            };
            // A renewal after the listing makes its revision stale: no retirement.
            bus.renew_claim(f(), 1, old, 8192).await.unwrap();
            assert!(!bus.retire_claim(f(), 1, entry.revision, 0).await.unwrap());
            let [entry] = bus.replica_claims(f()).await.unwrap()[..] else {
                panic!("one claim")
            };
            assert!(bus.retire_claim(f(), 1, entry.revision, 100).await.unwrap());
            // The floor covers the holder's reservation, not just what the retirer saw.
            let reused = bus.claim_replica_id(f(), new, None).await.unwrap();
            assert_eq!(reused, Claim { id: 1, floor: 8192 });
            assert_eq!(
                bus.renew_claim(f(), 1, old, 9000).await.unwrap(),
                Renewal::Lost
            );
            assert_eq!(
                bus.renew_claim(f(), 1, new, 9000).await.unwrap(),
                Renewal::Held
            );
        });
    }
}
