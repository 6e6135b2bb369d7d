//! The NATS transport: core subjects for replication and the request API, JetStream KV for
//! replica ids.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{OnceCell, broadcast};
use uuid::Uuid;

use super::retry::{self, Retry};
use super::{
    Bus, Claim, ClaimEntry, ClaimRecord, IdRegistry, Message, MessageStream, Renewal, Transport,
    TransportError, TransportEvent,
};
use super::{cause, registry};
use crate::ReplicaId;

/// TLS settings (rustls; the server certificate is always verified).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Require TLS even if the server does not ask for it.
    pub required: bool,
    /// PEM file of extra root certificates (a private CA).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<PathBuf>,
}

/// How to reach NATS. Every field has a default, so a TOML section may name only what differs.
///
/// ```
/// let cfg: crpf::transport::NatsConfig =
///     serde_json::from_str(r#"{"servers": ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"],
///                              "user": "svc", "password": "secret"}"#).unwrap();
/// assert_eq!(cfg.servers.len(), 2);
/// assert_eq!(cfg.ping_interval_ms, 60_000);
/// assert_eq!(cfg.kv_bucket, "crpf_replicas");
/// assert_eq!(cfg.claim_timeout_ms, 300_000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URLs of the cluster (any of them; the client learns the others).
    pub servers: Vec<String>,
    /// Token authentication.
    pub token: Option<String>,
    /// User of user/password authentication.
    pub user: Option<String>,
    /// Password of user/password authentication.
    pub password: Option<String>,
    /// NKey seed (`SU...`) authentication.
    pub nkey_seed: Option<String>,
    /// A `.creds` file (JWT and NKey seed) for decentralized authentication.
    pub creds_file: Option<PathBuf>,
    /// TLS settings.
    pub tls: Option<TlsConfig>,
    /// Connection name shown by the server's monitoring.
    pub name: Option<String>,
    /// Interval of client pings, which detect a dead connection (async-nats: 60 s).
    pub ping_interval_ms: u64,
    /// Timeout of one connection attempt.
    pub connection_timeout_ms: u64,
    /// Timeout of requests (replica id claims, API requests made through this transport).
    pub request_timeout_ms: u64,
    /// Keep retrying if no server answers at start, instead of failing (async-nats: off).
    pub retry_on_initial_connect: bool,
    /// Reconnect attempts before giving up; `None`: forever.
    pub max_reconnects: Option<usize>,
    /// Messages a subscription buffers client-side before it drops them (async-nats: 65,536).
    pub subscription_capacity: usize,
    /// The JetStream KV bucket of replica id claims.
    pub kv_bucket: String,
    /// Replicas of that bucket's stream in a JetStream cluster (1 on a single server).
    pub kv_replicas: usize,
    /// The JetStream KV bucket of the filter catalog (filters created at run time; its
    /// stream has `kv_replicas` replicas too).
    pub catalog_bucket: String,
    /// How long opening the KV bucket and claiming a replica id keep retrying while JetStream
    /// is unavailable (a cluster starting or electing leaders) before the replica gives up.
    /// Errors that waiting cannot fix (configuration, permissions) fail at once.
    pub claim_timeout_ms: u64,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            servers: vec!["nats://127.0.0.1:4222".into()],
            token: None,
            user: None,
            password: None,
            nkey_seed: None,
            creds_file: None,
            tls: None,
            name: None,
            ping_interval_ms: 60_000,
            connection_timeout_ms: 5_000,
            request_timeout_ms: 5_000,
            retry_on_initial_connect: false,
            max_reconnects: None,
            subscription_capacity: 65_536,
            kv_bucket: "crpf_replicas".into(),
            kv_replicas: 1,
            catalog_bucket: "crpf_catalog".into(),
            claim_timeout_ms: 300_000,
        }
    }
}

impl NatsConfig {
    /// Defaults, with these server URLs.
    pub fn with_servers<I: IntoIterator<Item = S>, S: Into<String>>(servers: I) -> Self {
        NatsConfig {
            servers: servers.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    async fn options(
        &self,
        events: broadcast::Sender<TransportEvent>,
        violations: Arc<Mutex<Option<Violation>>>,
    ) -> Result<async_nats::ConnectOptions, TransportError> {
        let mut o = match &self.creds_file {
            Some(path) => async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| TransportError::Connect {
                    context: format!("creds file {path:?}"),
                    source: cause(e),
                })?,
            None => async_nats::ConnectOptions::new(),
        };
        if let Some(t) = &self.token {
            o = o.token(t.clone());
        }
        match (&self.user, &self.password) {
            (Some(u), Some(p)) => o = o.user_and_password(u.clone(), p.clone()),
            (None, None) => {}
            _ => {
                return Err(TransportError::connect("user and password go together"));
            }
        }
        if let Some(seed) = &self.nkey_seed {
            o = o.nkey(seed.clone());
        }
        if let Some(tls) = &self.tls {
            o = o.require_tls(tls.required);
            if let Some(ca) = &tls.ca_file {
                o = o.add_root_certificates(ca.clone());
            }
            match (&tls.cert_file, &tls.key_file) {
                (Some(c), Some(k)) => o = o.add_client_certificate(c.clone(), k.clone()),
                (None, None) => {}
                _ => {
                    return Err(TransportError::connect(
                        "tls cert_file and key_file go together",
                    ));
                }
            }
        }
        if let Some(n) = &self.name {
            o = o.name(n);
        }
        if self.retry_on_initial_connect {
            o = o.retry_on_initial_connect();
        }
        let log = super::LogLimiter::new(Duration::from_secs(10));
        o = o
            .ping_interval(Duration::from_millis(self.ping_interval_ms.max(1)))
            .connection_timeout(Duration::from_millis(self.connection_timeout_ms.max(1)))
            .request_timeout(Some(Duration::from_millis(self.request_timeout_ms.max(1))))
            .subscription_capacity(self.subscription_capacity.max(1))
            .max_reconnects(self.max_reconnects)
            .event_callback(move |ev| {
                let mapped = match &ev {
                    async_nats::Event::Connected => Some(TransportEvent::Connected),
                    async_nats::Event::Disconnected => Some(TransportEvent::Disconnected),
                    async_nats::Event::SlowConsumer(_) => Some(TransportEvent::SlowConsumer),
                    async_nats::Event::Closed => Some(TransportEvent::Closed),
                    _ => None,
                };
                if let async_nats::Event::ServerError(async_nats::ServerError::Other(msg)) = &ev
                    && super::retry::is_claim_permission_violation(msg)
                {
                    // The request it refused just times out: remember why, so that a claim
                    // fails at once instead of retrying what it may never do.
                    *violations.lock().expect("violations lock") = Some(Violation {
                        at: Instant::now(),
                        message: msg.clone(),
                    });
                }
                match mapped {
                    Some(TransportEvent::SlowConsumer) => {
                        if let Some(n) = log.allow("slow_consumer") {
                            tracing::warn!(
                                suppressed = n,
                                "NATS slow consumer: messages dropped client-side"
                            );
                        }
                    }
                    _ => tracing::info!(event = %ev, "NATS connection event"),
                }
                if let Some(m) = mapped {
                    let _ = events.send(m);
                }
                futures::future::ready(())
            });
        Ok(o)
    }
}

/// [`TransportError::NoJetStream`] if `client`'s server announced it runs without JetStream.
pub(crate) fn no_jetstream(client: &async_nats::Client) -> Option<TransportError> {
    let info = client.try_server_info()?;
    (!info.jetstream).then(|| TransportError::NoJetStream {
        server: format!("{} ({}:{})", info.server_name, info.host, info.port),
    })
}

/// A permission violation the server reported on a subject a claim uses.
#[derive(Debug, Clone)]
struct Violation {
    at: Instant,
    message: String,
}

/// Why one attempt at opening the bucket or claiming an id failed, and whether to retry.
#[derive(Debug, Error)]
#[error("{context}: {message}")]
struct AttemptError {
    context: &'static str,
    message: String,
    retry: Retry,
}

impl AttemptError {
    fn of(context: &'static str, e: &(dyn std::error::Error + 'static)) -> Self {
        AttemptError {
            context,
            message: e.to_string(),
            retry: retry::classify(e),
        }
    }
}

/// The NATS transport. Connect once and share it (it is `Clone`; the async-nats client is).
///
/// The replication subjects use core NATS (at most once; anti-entropy repairs losses); replica
/// ids are claimed in the JetStream KV bucket [`NatsConfig::kv_bucket`] as `<filter>.<id>`
/// holding a [`ClaimRecord`], created atomically or updated by compare-and-set. Opening the bucket and claiming retry with
/// exponential backoff while JetStream is unavailable, for up to
/// [`NatsConfig::claim_timeout_ms`].
#[derive(Clone)]
pub struct NatsTransport {
    /// Behind an `Arc`: every publish takes a clone into its `'static` future, and a client
    /// clone costs several reference counts, a channel sender and strings.
    client: Arc<async_nats::Client>,
    cfg: Arc<NatsConfig>,
    events: broadcast::Sender<TransportEvent>,
    kv: Arc<OnceCell<kv::Store>>,
    /// With [`NatsTransport::sharing_replication`]: the one no-echo connection every replica
    /// made with this handle replicates over.
    shared_replication: Option<Arc<OnceCell<Arc<dyn Transport>>>>,
    violations: Arc<Mutex<Option<Violation>>>,
    log: Arc<super::LogLimiter>,
}

impl std::fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTransport")
            .field("servers", &self.cfg.servers)
            .field("state", &self.client.connection_state())
            .finish()
    }
}

impl NatsTransport {
    /// Connects (inside a tokio runtime, e.g. the actix System's).
    pub async fn connect(cfg: NatsConfig) -> Result<Self, TransportError> {
        Self::connect_with(cfg, false).await
    }

    async fn connect_with(cfg: NatsConfig, no_echo: bool) -> Result<Self, TransportError> {
        if cfg.servers.is_empty() {
            return Err(TransportError::connect("no server URL configured"));
        }
        let events = broadcast::channel(256).0;
        let violations = Arc::new(Mutex::new(None));
        let mut opts = cfg.options(events.clone(), violations.clone()).await?;
        if no_echo {
            opts = opts.no_echo();
        }
        let addrs: Vec<async_nats::ServerAddr> = cfg
            .servers
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()
            .map_err(|e| TransportError::Connect {
                context: "server URL".into(),
                source: cause(e),
            })?;
        let client = opts
            .connect(addrs)
            .await
            .map_err(|e| TransportError::Connect {
                context: format!("connecting to {:?}", cfg.servers),
                source: cause(e),
            })?;
        Ok(NatsTransport {
            client: Arc::new(client),
            cfg: Arc::new(cfg),
            events,
            kv: Arc::new(OnceCell::new()),
            shared_replication: None,
            violations,
            log: Arc::new(super::LogLimiter::new(Duration::from_secs(5))),
        })
    }

    /// This transport, with one replication connection for every replica started with it
    /// (instead of one each): what a node uses, which holds one replica per filter, so that
    /// its connections do not grow with its filters. Replicas of one filter that share a
    /// no-echo connection do not hear each other: start those with separate handles.
    pub fn sharing_replication(&self) -> Self {
        NatsTransport {
            shared_replication: Some(Arc::new(OnceCell::new())),
            ..self.clone()
        }
    }

    /// The filter catalog in the JetStream KV bucket [`NatsConfig::catalog_bucket`], over
    /// this connection.
    pub fn catalog(&self) -> super::KvCatalog {
        super::KvCatalog::new(
            async_nats::Client::clone(&self.client),
            self.cfg.catalog_bucket.clone(),
            self.cfg.kv_replicas.max(1),
        )
    }

    /// Fails, naming the fix, if the server this client is connected to runs without
    /// JetStream and no server of its cluster answers JetStream's API for it (a cluster may
    /// mix servers with and without JetStream). Not connected yet (with
    /// `retry_on_initial_connect`): nothing to tell; a replica id claim tells later.
    pub async fn require_jetstream(&self) -> Result<(), TransportError> {
        let Some(missing) = self.jetstream_missing() else {
            return Ok(());
        };
        let js = async_nats::jetstream::new(async_nats::Client::clone(&self.client));
        match js.query_account().await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, "JetStream account info refused");
                Err(missing)
            }
        }
    }

    /// [`TransportError::NoJetStream`] if the connected server announced it runs without
    /// JetStream (its INFO at connect says so).
    pub(crate) fn jetstream_missing(&self) -> Option<TransportError> {
        no_jetstream(&self.client)
    }

    /// The underlying client (to publish or subscribe outside crpf).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The bucket, opened (or created) once; a failed opening is tried again next time.
    async fn store(&self) -> Result<kv::Store, AttemptError> {
        let store = self.kv.get_or_try_init(|| self.open_store()).await?;
        Ok(store.clone())
    }

    async fn open_store(&self) -> Result<kv::Store, AttemptError> {
        let js = async_nats::jetstream::new(async_nats::Client::clone(&self.client));
        let bucket = self.cfg.kv_bucket.clone();
        match js.get_key_value(bucket.clone()).await {
            Ok(s) => return Ok(s),
            Err(e) if !bucket_missing(&e) => return Err(AttemptError::of("KV bucket", &e)),
            Err(_) => {}
        }
        // Nodes started together all get here: creating with the same configuration is
        // idempotent on the server, so they all end up with the one bucket.
        js.create_key_value(kv::Config {
            bucket,
            description: "crpf replica id claims".into(),
            history: 1,
            num_replicas: self.cfg.kv_replicas.max(1),
            ..Default::default()
        })
        .await
        .map_err(|e| AttemptError::of("creating the KV bucket", &e))
    }

    /// Claims an id, retrying transient failures with backoff until the claim deadline.
    async fn claim(
        &self,
        filter: String,
        claimant: Uuid,
        preferred: Option<ReplicaId>,
    ) -> Result<Claim, TransportError> {
        let started = Instant::now();
        let timeout = Duration::from_millis(self.cfg.claim_timeout_ms);
        let mut delays = retry::backoff();
        let mut preferred = preferred;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let e = match self.try_claim(&filter, claimant, &mut preferred).await {
                Ok(claim) => {
                    if attempt > 1 {
                        tracing::info!(
                            filter,
                            replica = claim.id,
                            attempts = attempt,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "replica id claimed once JetStream answered"
                        );
                    }
                    return Ok(claim);
                }
                Err(e) => e,
            };
            // "No responders" from a server without JetStream looks like a cluster still
            // electing leaders, but the server's INFO tells the two apart: no waiting.
            if let Some(missing) = self.jetstream_missing() {
                return Err(missing);
            }
            if let Some(v) = self.violation_since(started) {
                return Err(TransportError::claim(format!(
                    "{e}; the server refused it: {} (grant this user publish and subscribe \
                     permissions on $JS.API.>, $KV.{}.> and _INBOX.>)",
                    v.message, self.cfg.kv_bucket
                )));
            }
            if e.retry == Retry::Permanent {
                return Err(TransportError::claim(e.to_string()));
            }
            let remaining = timeout.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                return Err(TransportError::claim(format!(
                    "JetStream was not available for {:.1} s (nats.claim_timeout_ms = {}): {e}. \
                     Is JetStream enabled on the servers, and do at least kv_replicas = {} of \
                     them run?",
                    started.elapsed().as_secs_f64(),
                    self.cfg.claim_timeout_ms,
                    self.cfg.kv_replicas
                )));
            }
            // The last wait ends at the deadline, for one more attempt there.
            let delay = delays
                .next()
                .unwrap_or(Duration::from_secs(2))
                .min(remaining);
            if let Some(suppressed) = self.log.allow("claim_retry") {
                tracing::warn!(
                    filter, attempt, suppressed, retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "JetStream not available yet (cluster starting or electing leaders?); \
                     retrying the replica id claim"
                );
            }
            tokio::time::sleep(delay).await;
        }
    }

    fn violation_since(&self, t: Instant) -> Option<Violation> {
        let v = self.violations.lock().expect("violations lock");
        v.as_ref().filter(|v| v.at >= t).cloned()
    }

    /// One attempt. An id whose create or update failed without an answer may have been
    /// stored for us: it becomes `preferred`, so that the next attempt takes it back instead
    /// of leaking it.
    async fn try_claim(
        &self,
        filter: &str,
        claimant: Uuid,
        preferred: &mut Option<ReplicaId>,
    ) -> Result<Claim, AttemptError> {
        let store = self.store().await?;
        // Each turn loses at most one race to another claimant; ids are finite.
        for _ in 0..=ReplicaId::MAX {
            let entries = list_claims(&store, filter).await?;
            let Some((id, previous)) = registry::pick_id(&entries, claimant, *preferred) else {
                break;
            };
            let floor = previous.map_or(0, |e| e.record.floor());
            let value = Bytes::from(
                ClaimRecord::Held {
                    claimant,
                    reserved: floor,
                }
                .encode(),
            );
            let key = claim_key(filter, id);
            let stored = match previous {
                None => store.create(key, value).await.map_err(|e| {
                    let lost_race = e.kind() == kv::CreateErrorKind::AlreadyExists;
                    (lost_race, AttemptError::of("claiming a replica id", &e))
                }),
                Some(e) => store.update(key, value, e.revision).await.map_err(|e| {
                    let lost_race = e.kind() == kv::UpdateErrorKind::WrongLastRevision;
                    (lost_race, AttemptError::of("claiming a replica id", &e))
                }),
            };
            match stored {
                Ok(_) => return Ok(Claim { id, floor }),
                // Claimed or renewed concurrently by another replica: look again.
                Err((true, _)) => {
                    if *preferred == Some(id) {
                        *preferred = None;
                    }
                }
                Err((false, e)) => {
                    *preferred = Some(id);
                    return Err(e);
                }
            }
        }
        Err(AttemptError {
            context: "claiming a replica id",
            message: "every replica id is taken".into(),
            retry: Retry::Permanent,
        })
    }

    /// Renews a claim by compare-and-set on the revision the stream's leader holds. A lost
    /// race is looked at again on the leader before anything is concluded: our own earlier
    /// write whose answer was lost changes the revision too, and only a record that is no
    /// longer ours means the claim is lost.
    async fn renew(
        &self,
        filter: &str,
        id: ReplicaId,
        claimant: Uuid,
        reserved: u64,
    ) -> Result<Renewal, AttemptError> {
        let store = self.store().await?;
        let key = claim_key(filter, id);
        // Each turn loses a race to a write that left the claim ours: one of our own writes.
        for turn in 0..3 {
            let found = match leader_record(&store, &key).await {
                Ok(found) => found,
                // The bucket may be gone with a lost JetStream store: made again (the handle
                // names it, so it works again once it exists), then looked at again.
                Err(_) if turn == 0 => {
                    self.open_store().await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some((record, revision)) = found else {
                // No record at all, not even a retired one: the registry lost it (a lost
                // JetStream store). Nobody else holds the id, so the claim is written again
                // at once, before a new claimant could take the id.
                let value = ClaimRecord::Held { claimant, reserved };
                match store
                    .create(key.as_str(), Bytes::from(value.encode()))
                    .await
                {
                    Ok(_) => {
                        tracing::warn!(
                            key,
                            "the replica id registry had lost this claim: written again"
                        );
                        return Ok(Renewal::Held);
                    }
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(AttemptError::of("renewing a replica id claim", &e)),
                }
            };
            if !record.held_by(claimant) {
                return Ok(Renewal::Lost);
            }
            let value = ClaimRecord::Held {
                claimant,
                reserved: reserved.max(record.floor()),
            };
            match store
                .update(key.as_str(), Bytes::from(value.encode()), revision)
                .await
            {
                Ok(_) => return Ok(Renewal::Held),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(AttemptError::of("renewing a replica id claim", &e)),
            }
        }
        Err(AttemptError {
            context: "renewing a replica id claim",
            message: "the claim's revision kept changing while it stayed ours".into(),
            retry: Retry::Transient,
        })
    }

    async fn retire(
        &self,
        filter: &str,
        id: ReplicaId,
        revision: u64,
        floor: u64,
    ) -> Result<bool, AttemptError> {
        let store = self.store().await?;
        let key = claim_key(filter, id);
        let current = leader_record(&store, &key).await?;
        let Some((record, rev)) = current.filter(|(_, rev)| *rev == revision) else {
            return Ok(false);
        };
        let value = ClaimRecord::Retired {
            floor: floor.max(record.floor()),
        };
        match store.update(key, Bytes::from(value.encode()), rev).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(AttemptError::of("retiring a replica id", &e)),
        }
    }
}

fn claim_key(filter: &str, id: ReplicaId) -> String {
    format!("{filter}.{id}")
}

/// The live value of `key` and its revision, as the bucket stream's leader holds it; `None`
/// for a key never written or deleted.
///
/// Not `kv::Store::entry`: that reads with direct gets, which any replica of the bucket may
/// answer, a follower still catching up after a restart included, so its answer can predate a
/// write this node already saw acknowledged (its own claim). A renewal that compared against
/// such a revision lost its race to itself and took the claim for retired (issue 27). The
/// leader answers with every acknowledged write applied.
pub(super) async fn leader_get(
    store: &kv::Store,
    key: &str,
) -> Result<Option<(Bytes, u64)>, async_nats::jetstream::stream::LastRawMessageError> {
    Ok(leader_raw(store, key)
        .await?
        .and_then(|(value, revision)| Some((value?, revision))))
}

/// The last message under `key` on the stream's leader: its value (`None` for a delete or
/// purge marker) and revision; `None` if the key never had one.
pub(super) async fn leader_raw(
    store: &kv::Store,
    key: &str,
) -> Result<Option<(Option<Bytes>, u64)>, async_nats::jetstream::stream::LastRawMessageError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{key}", store.prefix);
    let message = match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => m,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let deleted = message
        .headers
        .get("KV-Operation")
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
    Ok(Some((
        (!deleted).then_some(message.payload),
        message.sequence,
    )))
}

/// The claim record stored under `key` and its revision, read from the leader
/// ([`leader_get`]). A record that does not decode is taken for a claim by an unknown holder:
/// never picked, never retired.
async fn leader_record(
    store: &kv::Store,
    key: &str,
) -> Result<Option<(ClaimRecord, u64)>, AttemptError> {
    let found = leader_get(store, key)
        .await
        .map_err(|e| AttemptError::of("reading a replica id claim", &e))?;
    Ok(found.map(|(value, revision)| {
        let record = ClaimRecord::decode(&value).unwrap_or(ClaimRecord::Held {
            claimant: Uuid::nil(),
            reserved: crate::MAX_COUNTER,
        });
        (record, revision)
    }))
}

/// Every claim of `filter` in the bucket.
async fn list_claims(store: &kv::Store, filter: &str) -> Result<Vec<ClaimEntry>, AttemptError> {
    // The filter's keys from the stream's subjects (a stream info request, answered by its
    // leader), not `Store::keys`: that creates a consumer per call, and a node renewing the
    // claims of a thousand filters ran into JetStream's consumer limit.
    let prefix = format!("{}{filter}.", store.prefix);
    let listing =
        |e: &(dyn std::error::Error + 'static)| AttemptError::of("listing replica id claims", e);
    let mut subjects = store
        .stream
        .info_with_subjects(format!("{prefix}*"))
        .await
        .map_err(|e| listing(&e))?;
    let mut ids = Vec::new();
    while let Some(subject) = subjects.next().await {
        let (subject, _) = subject.map_err(|e| listing(&e))?;
        if let Some(id) = subject.strip_prefix(&prefix).and_then(|s| s.parse().ok()) {
            ids.push(id);
        }
    }
    let mut entries = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some((record, revision)) = leader_record(store, &claim_key(filter, id)).await? {
            entries.push(ClaimEntry {
                id,
                record,
                revision,
            });
        }
    }
    entries.sort_by_key(|e| e.id);
    Ok(entries)
}

/// Whether opening the bucket failed because it does not exist (yet): then create it.
fn bucket_missing(e: &async_nats::jetstream::context::KeyValueError) -> bool {
    use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(g) = err.downcast_ref::<GetStreamError>()
            && let GetStreamErrorKind::JetStream(j) = g.kind()
        {
            return j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND
                || j.code() == 404;
        }
        cur = err.source();
    }
    false
}

fn convert(m: async_nats::Message) -> Message {
    Message {
        subject: m.subject.to_string(),
        payload: m.payload,
        reply: m.reply.map(|r| r.to_string()),
        headers: m.headers,
    }
}

impl NatsTransport {
    /// Publishes with or without headers, refusing a payload over the server's `max_payload`
    /// before async-nats would.
    fn publish_checked(
        &self,
        subject: String,
        headers: Option<async_nats::HeaderMap>,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        let max = self.max_payload();
        let client = self.client.clone();
        async move {
            if payload.len() > max {
                return Err(TransportError::MaxPayload {
                    len: payload.len(),
                    max,
                });
            }
            let sent = match headers {
                Some(h) => client.publish_with_headers(subject, h, payload).await,
                None => client.publish(subject, payload).await,
            };
            // No subject in the context: it would cost every publish an allocation.
            sent.map_err(|e| TransportError::Publish {
                context: "publishing".into(),
                source: cause(e),
            })
        }
        .boxed()
    }
}

impl Bus for NatsTransport {
    fn name(&self) -> &'static str {
        "nats"
    }

    /// A new connection with the same settings and `no_echo`, one per replica (see the
    /// trait): the server then sends a replica's publications to every other connection but
    /// not back to its own. Its connection name, if one is set, ends in `/replication`.
    fn replication_transport(
        &self,
    ) -> BoxFuture<'static, Result<Option<Arc<dyn Transport>>, TransportError>> {
        let mut cfg = (*self.cfg).clone();
        cfg.name = cfg.name.map(|n| format!("{n}/replication"));
        let shared = self.shared_replication.clone();
        async move {
            let t = match shared {
                // The same handle for every replica (one each cost a node of 100,000
                // filters 72 bytes a filter).
                Some(cell) => cell
                    .get_or_try_init(|| async {
                        let t = NatsTransport::connect_with(cfg, true).await?;
                        Ok::<_, TransportError>(Arc::new(t) as Arc<dyn Transport>)
                    })
                    .await?
                    .clone(),
                None => {
                    Arc::new(NatsTransport::connect_with(cfg, true).await?) as Arc<dyn Transport>
                }
            };
            Ok(Some(t))
        }
        .boxed()
    }

    fn publish(
        &self,
        subject: String,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        self.publish_checked(subject, None, payload)
    }

    fn publish_with_headers(
        &self,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        self.publish_checked(subject, Some(headers), payload)
    }

    fn subscribe(
        &self,
        subject: String,
        queue_group: Option<String>,
    ) -> BoxFuture<'static, Result<MessageStream, TransportError>> {
        let client = self.client.clone();
        async move {
            let sub = match queue_group {
                Some(q) => client.queue_subscribe(subject.clone(), q).await,
                None => client.subscribe(subject.clone()).await,
            }
            .map_err(|e| TransportError::Subscribe {
                context: format!("to `{subject}`"),
                source: cause(e),
            })?;
            Ok(sub.map(convert).boxed())
        }
        .boxed()
    }

    fn request(
        &self,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, TransportError>> {
        let client = self.client.clone();
        async move {
            match tokio::time::timeout(timeout, client.request(subject.clone(), payload)).await {
                Ok(Ok(m)) => Ok(m.payload),
                Ok(Err(e)) => Err(TransportError::Request {
                    context: format!("on `{subject}`"),
                    source: cause(e),
                }),
                Err(_) => Err(TransportError::request(format!(
                    "on `{subject}`: timed out"
                ))),
            }
        }
        .boxed()
    }

    /// The server's limit, from an atomic the client keeps (not `server_info()`, which
    /// clones the whole INFO, a dozen allocations, at every publish).
    fn max_payload(&self) -> usize {
        match self.client.max_payload() {
            // Not connected yet (retry_on_initial_connect): the server default.
            0 => 1 << 20,
            n => n,
        }
    }

    fn events(&self) -> broadcast::Receiver<TransportEvent> {
        self.events.subscribe()
    }

    fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        let client = self.client.clone();
        async move {
            client.flush().await.map_err(|e| TransportError::Publish {
                context: "flushing".into(),
                source: cause(e),
            })
        }
        .boxed()
    }

    /// A request to an inbox nobody listens on: the server answers it "no responders" once
    /// it has processed what this connection sent before (it reads a connection in order).
    /// Within the permissions a replica needs anyway (`_INBOX.>`).
    fn round_trip(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        let client = self.client.clone();
        async move {
            let subject = format!("_INBOX.crpf-round-trip.{}", Uuid::new_v4().simple());
            match client.request(subject, Bytes::new()).await {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
                Err(e) => Err(TransportError::Request {
                    context: "round trip to the server".into(),
                    source: cause(e),
                }),
            }
        }
        .boxed()
    }
}

impl IdRegistry for NatsTransport {
    fn claim_replica_id(
        &self,
        filter: String,
        claimant: Uuid,
        preferred: Option<ReplicaId>,
    ) -> BoxFuture<'static, Result<Claim, TransportError>> {
        let this = self.clone();
        async move { this.claim(filter, claimant, preferred).await }.boxed()
    }

    fn renew_claim(
        &self,
        filter: String,
        id: ReplicaId,
        claimant: Uuid,
        reserved: u64,
    ) -> BoxFuture<'static, Result<Renewal, TransportError>> {
        let this = self.clone();
        async move {
            this.renew(&filter, id, claimant, reserved)
                .await
                .map_err(|e| TransportError::claim(e.to_string()))
        }
        .boxed()
    }

    fn replica_claims(
        &self,
        filter: String,
    ) -> BoxFuture<'static, Result<Vec<ClaimEntry>, TransportError>> {
        let this = self.clone();
        async move {
            let store = this
                .store()
                .await
                .map_err(|e| TransportError::claim(e.to_string()))?;
            list_claims(&store, &filter)
                .await
                .map_err(|e| TransportError::claim(e.to_string()))
        }
        .boxed()
    }

    fn retire_claim(
        &self,
        filter: String,
        id: ReplicaId,
        revision: u64,
        floor: u64,
    ) -> BoxFuture<'static, Result<bool, TransportError>> {
        let this = self.clone();
        async move {
            this.retire(&filter, id, revision, floor)
                .await
                .map_err(|e| TransportError::claim(e.to_string()))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure keeps the error that caused it, for the chain the binary prints.
    #[test]
    fn errors_keep_their_cause() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut cfg = NatsConfig::with_servers(["nats://127.0.0.1:1"]);
        cfg.creds_file = Some("/nonexistent/crpf.creds".into());
        let e = rt.block_on(NatsTransport::connect(cfg)).unwrap_err();
        assert!(matches!(e, TransportError::Connect { .. }), "{e}");
        let cause = std::error::Error::source(&e).expect("the cause is kept");
        assert!(!cause.to_string().is_empty());
        assert!(e.to_string().contains("/nonexistent/crpf.creds"), "{e}");
    }
}
