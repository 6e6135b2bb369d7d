//! The RESP front end: the request API over the Redis protocol, straight to the node, without
//! a broker in between. Any Redis client (`redis-cli`, redis-rs, redis-py...) then talks to
//! crpf filters with RedisBloom's commands ([`commands`]), and a request costs one hop
//! instead of the two through nats-server.
//!
//! Each command becomes a typed request of the API ([`crate::api::Request`], sent with
//! [`ReplicaHandle::call`]) and is answered by the code that answers a NATS request: queries
//! and adds to grow-only kinds are answered in the connection's task, everything else by the
//! replica's actor, in order. Replies go back
//! in the order of the commands, so a client may pipeline; a connection keeps at most
//! [`RespConfig::max_pipeline`] commands in progress and reads no further until they are
//! answered.
//!
//! Until a replica is ready (caught up after its start, when it also starts answering over
//! NATS), its commands are answered `-LOADING`, as Redis answers while it loads its data.
//!
//! A request that is not RESP, or exceeds [`RespConfig::max_request_bytes`], is answered
//! with an error and its connection closed (the stream cannot be resynchronised), as Redis
//! does; it never reaches a filter.
//!
//! ```no_run
//! # async fn demo() -> redis::RedisResult<()> {
//! // A node with `[resp] listen = "127.0.0.1:6380"` and a filter named `sessions`.
//! let client = redis::Client::open("redis://127.0.0.1:6380/")?;
//! let mut con = client.get_multiplexed_async_connection().await?;
//! let _: i64 = redis::cmd("BF.ADD").arg("sessions").arg("alice").query_async(&mut con).await?;
//! let found: Vec<i64> = redis::cmd("BF.MEXISTS").arg("sessions").arg("alice").arg("bob")
//!     .query_async(&mut con).await?;
//! assert_eq!(found[0], 1);
//! # Ok(()) }
//! ```

pub mod cms;
pub mod commands;
pub mod dump;
mod introspect;
pub mod parse;
pub mod redisbloom;
mod reply;
mod slowlog;
pub mod tdigest;
pub mod topk;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use metrics::{Counter, Gauge};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::replica::{AckLevel, PendingResponse, ReplicaError, ReplicaHandle};
use commands::{Command, Protocol, Reply};
use parse::ParseLimits;

/// Connections accepted (counter).
pub const CONNECTIONS_TOTAL: &str = "crpf_resp_connections_total";
/// Connections open (gauge).
pub const CONNECTIONS: &str = "crpf_resp_connections";
/// Commands received, answered or refused (counter).
pub const COMMANDS_TOTAL: &str = "crpf_resp_commands_total";
/// Commands refused before reaching a filter, and connections refused or closed for a
/// protocol error, by `reason`.
pub const REJECTED: &str = "crpf_resp_rejected_total";

/// The `[resp]` section of a node's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespConfig {
    /// Where to listen (`127.0.0.1:6380`; `0.0.0.0:...` exposes every filter to the
    /// network: set a password).
    pub listen: SocketAddr,
    /// File holding the password clients must give with `AUTH` (surrounding whitespace is
    /// ignored). None: no authentication.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Connections open at once; further ones are answered with an error and closed
    /// (`maxclients` in Redis's words, accepted as an alias).
    #[serde(default = "default_max_connections", alias = "maxclients")]
    pub max_connections: usize,
    /// Close a connection idle this many seconds, with nothing in progress, as Redis's
    /// `timeout` does (counted in `crpf_resp_rejected_total{reason="idle_timeout"}`). 0: never.
    #[serde(default)]
    pub timeout: u64,
    /// Commands of one connection in progress at once (pipelined, or waiting for their
    /// acknowledgement level).
    #[serde(default = "default_max_pipeline")]
    pub max_pipeline: usize,
    /// Bytes of one command's arguments together.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
}

fn default_max_connections() -> usize {
    1024
}
fn default_max_pipeline() -> usize {
    1024
}
fn default_max_request_bytes() -> usize {
    16 << 20
}

impl RespConfig {
    /// Refuses limits of zero (nothing could be served).
    pub fn validate(&self) -> Result<(), RespError> {
        for (field, value) in [
            ("max_connections", self.max_connections),
            ("max_pipeline", self.max_pipeline),
            ("max_request_bytes", self.max_request_bytes),
        ] {
            if value == 0 {
                return Err(RespError::Zero(field));
            }
        }
        Ok(())
    }

    /// The config listening on `listen`, with the defaults.
    pub fn new(listen: SocketAddr) -> Self {
        RespConfig {
            listen,
            password_file: None,
            max_connections: default_max_connections(),
            timeout: 0,
            max_pipeline: default_max_pipeline(),
            max_request_bytes: default_max_request_bytes(),
        }
    }
}

/// Why the front end could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RespError {
    /// The address could not be bound.
    #[error(
        "RESP listener cannot listen on {addr}: {source}; set another address with `resp.listen`"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The password file is unreadable or empty.
    #[error("RESP password file {path}: {reason}")]
    Password {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A limit is zero.
    #[error("invalid configuration: `resp.{0}` must be at least 1")]
    Zero(&'static str),
}

/// A query answered from a parked filter's kept state ([`Keyspace::query_parked`]).
pub use crate::replica::ParkedAnswer;

/// Where the front end finds a filter by its key: a fixed set, or a node's filters, which
/// the filter catalog changes at run time.
pub trait Keyspace: Send + Sync + 'static {
    /// The replica serving `name` over the request API, if any.
    fn filter(&self, name: &str) -> Option<ReplicaHandle>;

    /// The answer of the query `request` for `name` from a filter that keeps its state
    /// without running its replica (a node's parked filter), with that filter's kind:
    /// answered so, it resumes nothing. `None`: ask [`Keyspace::filter`].
    fn query_parked(&self, name: &str, request: &crate::api::Request) -> Option<ParkedAnswer> {
        let _ = (name, request);
        None
    }

    /// The names of the filters served, sorted (`KEYS`, `SCAN`, `DBSIZE`).
    fn names(&self) -> Vec<String>;

    /// Creates filter `name` of `spec` and waits until it serves (`BF.RESERVE`,
    /// `CF.RESERVE`): whether this call created it. `Err`: the error reply's text.
    fn create(
        &self,
        name: String,
        spec: crate::FilterSpec,
    ) -> BoxFuture<'static, Result<bool, String>> {
        let _ = (name, spec);
        Box::pin(async { Err(FIXED_FILTERS.to_string()) })
    }

    /// How many filters are served (`DBSIZE`, `INFO keyspace`).
    fn filter_count(&self) -> usize {
        self.names().len()
    }

    /// The spec of filter `name`, if known (`SCANDUMP` puts it in the dump's header).
    fn spec(&self, name: &str) -> Option<crate::FilterSpec> {
        let _ = name;
        None
    }

    /// Drops filter `name` (`DEL`, `UNLINK`): whether it existed. `Err`: the error reply's
    /// text.
    fn drop_filter(&self, name: String) -> BoxFuture<'static, Result<bool, String>> {
        let _ = name;
        Box::pin(async { Err(FIXED_FILTERS.to_string()) })
    }

    /// Whether `name` may be dropped (a name that does not exist may): the refusal's reply
    /// text if not. Commands on several keys ask first for every key, then drop.
    fn may_drop(&self, name: &str) -> Result<(), String> {
        let _ = name;
        Err(FIXED_FILTERS.to_string())
    }

    /// Whether the filters are not known yet (a node still starting): commands on keys are
    /// answered `-LOADING`.
    fn loading(&self) -> bool {
        false
    }

    /// The expiry of filter `name` (ms since the epoch): `None` if there is no such filter,
    /// `Some(None)` if it has none (`TTL`).
    fn expiry(&self, name: &str) -> Option<Option<u64>> {
        self.filter(name).map(|_| None)
    }

    /// Sets or clears the expiry of filter `name` (`EXPIRE`, `PERSIST`); a time past drops
    /// it: whether it existed. `Err`: the error reply's text.
    fn set_expiry(
        &self,
        name: String,
        at_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<bool, String>> {
        let _ = (name, at_ms);
        Box::pin(async { Err(FIXED_FILTERS.to_string()) })
    }
}

/// The answer to a command on keys while the node starts.
const LOADING: &str = "LOADING crpf is starting (claiming its replica id, following the filter catalog); try again in a moment";

/// The keyspace of a node that is still starting: none (every command on keys answers
/// `-LOADING`) until [`Starting::started`] hands over the node's, then the node's.
pub struct Starting<K> {
    node: std::sync::OnceLock<K>,
}

impl<K> Default for Starting<K> {
    fn default() -> Self {
        Starting {
            node: std::sync::OnceLock::new(),
        }
    }
}

impl<K: Keyspace> Starting<K> {
    /// The node has started: its filters are served from now on.
    pub fn started(&self, node: K) {
        let _ = self.node.set(node);
    }
}

impl<K: Keyspace> Keyspace for Starting<K> {
    fn filter(&self, name: &str) -> Option<ReplicaHandle> {
        Keyspace::filter(self.node.get()?, name)
    }

    fn query_parked(&self, name: &str, request: &crate::api::Request) -> Option<ParkedAnswer> {
        self.node.get()?.query_parked(name, request)
    }

    fn names(&self) -> Vec<String> {
        self.node.get().map(Keyspace::names).unwrap_or_default()
    }

    fn create(
        &self,
        name: String,
        spec: crate::FilterSpec,
    ) -> BoxFuture<'static, Result<bool, String>> {
        match self.node.get() {
            Some(node) => Keyspace::create(node, name, spec),
            None => Box::pin(async { Err(LOADING.to_string()) }),
        }
    }

    fn filter_count(&self) -> usize {
        self.node.get().map_or(0, Keyspace::filter_count)
    }

    fn spec(&self, name: &str) -> Option<crate::FilterSpec> {
        Keyspace::spec(self.node.get()?, name)
    }

    fn drop_filter(&self, name: String) -> BoxFuture<'static, Result<bool, String>> {
        match self.node.get() {
            Some(node) => Keyspace::drop_filter(node, name),
            None => Box::pin(async { Err(LOADING.to_string()) }),
        }
    }

    fn may_drop(&self, name: &str) -> Result<(), String> {
        match self.node.get() {
            Some(node) => Keyspace::may_drop(node, name),
            None => Err(LOADING.to_string()),
        }
    }

    fn loading(&self) -> bool {
        self.node.get().is_none()
    }

    fn expiry(&self, name: &str) -> Option<Option<u64>> {
        Keyspace::expiry(self.node.get()?, name)
    }

    fn set_expiry(
        &self,
        name: String,
        at_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<bool, String>> {
        match self.node.get() {
            Some(node) => Keyspace::set_expiry(node, name, at_ms),
            None => Box::pin(async { Err(LOADING.to_string()) }),
        }
    }
}

/// The refusal of a lookup without a catalog.
const FIXED_FILTERS: &str =
    "ERR this front end serves a fixed set of filters: they are not created or dropped by commands";

impl Keyspace for HashMap<Vec<u8>, ReplicaHandle> {
    fn filter(&self, name: &str) -> Option<ReplicaHandle> {
        self.get(name.as_bytes()).cloned()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        names.sort();
        names
    }
}

/// Drops the filters `names` (`DEL`, `UNLINK`, `FLUSHDB`, `FLUSHALL`): all or nothing where
/// the node can tell beforehand (a configured filter refuses, and then nothing is dropped);
/// a failure on the way (the catalog unreachable) says which were dropped before it.
/// Answers how many existed.
async fn drop_all(lookup: &dyn Keyspace, names: Vec<String>) -> Result<usize, String> {
    for name in &names {
        lookup.may_drop(name)?;
    }
    let mut dropped = Vec::new();
    let mut existed = 0;
    for name in names {
        match lookup.drop_filter(name.clone()).await {
            Ok(true) => {
                existed += 1;
                dropped.push(name);
            }
            Ok(false) => {}
            Err(e) if dropped.is_empty() => return Err(e),
            Err(e) => {
                let e = e.strip_prefix("ERR ").unwrap_or(&e).to_string();
                return Err(format!(
                    "ERR dropped {} key(s) ({}) before failing: {e}",
                    dropped.len(),
                    dropped.join(", ")
                ));
            }
        }
    }
    Ok(existed)
}

/// What every connection shares.
struct Server {
    filters: Arc<dyn Keyspace>,
    limits: ParseLimits,
    max_pipeline: usize,
    /// `timeout`: how long a connection may be idle.
    idle_timeout: Option<Duration>,
    /// SHA-256 of the password, which is not kept in clear (comparing digests tells a
    /// timing attacker nothing about the password).
    password: Option<[u8; 32]>,
    open: Gauge,
    commands: Counter,
    rejected: fn(&'static str) -> Counter,
    /// The next connection's id.
    next_id: std::sync::atomic::AtomicU64,
    /// Open connections (`INFO clients`).
    connections: std::sync::atomic::AtomicUsize,
    max_connections: usize,
    /// Dumps and loads in progress (`SCANDUMP`, `LOADCHUNK`).
    dumps: Arc<dump::Dumps>,
    /// Where it listens and since when (`INFO server`).
    addr: SocketAddr,
    started: Instant,
    /// Connections accepted, commands parsed and connections refused since the start
    /// (`INFO stats`).
    connections_received: std::sync::atomic::AtomicU64,
    commands_processed: std::sync::atomic::AtomicU64,
    rejected_connections: std::sync::atomic::AtomicU64,
    /// The open connections (`CLIENT LIST`, `CLIENT KILL`).
    clients: std::sync::Mutex<std::collections::BTreeMap<u64, Arc<Client>>>,
    /// `SLOWLOG` and `MONITOR`.
    watch: Arc<slowlog::Watch>,
}

/// An open connection, as `CLIENT LIST` shows it.
struct Client {
    id: u64,
    addr: SocketAddr,
    local: SocketAddr,
    since: Instant,
    /// When it last sent something, in milliseconds after `since`.
    last_read_ms: std::sync::atomic::AtomicU64,
    name: std::sync::Mutex<Option<Bytes>>,
    /// 2 or 3.
    resp: std::sync::atomic::AtomicU8,
    /// `CLIENT KILL` closes it.
    kill: tokio::sync::Notify,
}

impl Client {
    /// Its line of `CLIENT LIST` (the fields crpf knows; Redis's others are not tracked).
    fn line(&self, multi: Option<usize>) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let age = self.since.elapsed();
        let idle = age.saturating_sub(Duration::from_millis(self.last_read_ms.load(Relaxed)));
        let name = self.name.lock().expect("client name lock").clone();
        let name = name.map_or_else(String::new, |n| String::from_utf8_lossy(&n).into_owned());
        format!(
            "id={} addr={} laddr={} name={name} age={} idle={} flags=N db=0 multi={} \
             user=default resp={}\n",
            self.id,
            self.addr,
            self.local,
            age.as_secs(),
            idle.as_secs(),
            multi.map_or(-1, |m| m as i64),
            self.resp.load(Relaxed),
        )
    }
}

/// A running front end: where it listens. It stops when the runtime does.
#[derive(Debug)]
pub struct RespServer {
    addr: SocketAddr,
}

impl RespServer {
    /// Binds `cfg.listen` and serves `filters` (by name) on the current Tokio runtime.
    pub async fn start(cfg: &RespConfig, filters: &[ReplicaHandle]) -> Result<Self, RespError> {
        // Room for the largest batch a filter takes, its command, key and insert options.
        let max_batch = filters
            .iter()
            .map(|f| f.limits().max_items)
            .max()
            .unwrap_or(crate::api::DEFAULT_MAX_BATCH_ITEMS);
        for f in filters.iter().filter(|f| !f.serves_api()) {
            tracing::info!(filter = f.name(), "not served over RESP: serve_api is off");
        }
        let lookup: HashMap<Vec<u8>, ReplicaHandle> = filters
            .iter()
            .filter(|f| f.serves_api())
            .map(|f| (f.name().as_bytes().to_vec(), f.clone()))
            .collect();
        Self::start_with(cfg, Arc::new(lookup), max_batch).await
    }

    /// Binds `cfg.listen` and serves the filters `filters` finds, whose batches hold at most
    /// `max_batch` items, on the current Tokio runtime.
    pub async fn start_with(
        cfg: &RespConfig,
        filters: Arc<dyn Keyspace>,
        max_batch: usize,
    ) -> Result<Self, RespError> {
        cfg.validate()?;
        let password = cfg.password_file.as_ref().map(read_password).transpose()?;
        let listener = TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| RespError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| RespError::Bind {
            addr: cfg.listen,
            source,
        })?;
        describe();
        let server = Arc::new(Server {
            filters,
            limits: ParseLimits {
                // No count of arguments is refused below `max_request_bytes` (an argument
                // takes at least 4 bytes): a parse error closes the connection, so a batch
                // larger than a filter takes is answered by the filter instead, and the
                // connection stays (issue 49: `BF.MADD` of 12,000 items closed it).
                max_args: (cfg.max_request_bytes / 4).max(max_batch + 16),
                max_request_bytes: cfg.max_request_bytes,
            },
            max_pipeline: cfg.max_pipeline,
            idle_timeout: (cfg.timeout > 0).then(|| Duration::from_secs(cfg.timeout)),
            password,
            open: metrics::gauge!(CONNECTIONS),
            next_id: std::sync::atomic::AtomicU64::new(1),
            connections: Default::default(),
            dumps: Default::default(),
            max_connections: cfg.max_connections,
            addr,
            started: Instant::now(),
            commands: metrics::counter!(COMMANDS_TOTAL),
            rejected: |reason| metrics::counter!(REJECTED, "reason" => reason),
            connections_received: Default::default(),
            commands_processed: Default::default(),
            rejected_connections: Default::default(),
            clients: Default::default(),
            watch: Default::default(),
        });
        let slots = Arc::new(Semaphore::new(cfg.max_connections));
        tracing::info!(%addr, auth = server.password.is_some(), "serving RESP");
        tokio::spawn(accept(listener, server, slots));
        Ok(RespServer { addr })
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn read_password(path: &PathBuf) -> Result<[u8; 32], RespError> {
    let failed = |reason: String| RespError::Password {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let password = text.trim();
    if password.is_empty() {
        return Err(failed("empty".into()));
    }
    Ok(Sha256::digest(password.as_bytes()).into())
}

fn describe() {
    metrics::describe_counter!(CONNECTIONS_TOTAL, "RESP connections accepted");
    metrics::describe_gauge!(CONNECTIONS, "RESP connections open");
    metrics::describe_counter!(COMMANDS_TOTAL, "RESP commands received");
    metrics::describe_counter!(
        REJECTED,
        "RESP commands refused before reaching a filter, and connections refused or closed, by reason"
    );
}

/// How often the open-connections gauge is touched even if no connection came or went: the
/// exporter drops a gauge not updated for 5 minutes (`GAUGE_IDLE_TIMEOUT`), after which the
/// handle `Server::open` holds would update a series no longer on the page.
const OPEN_REFRESH: Duration = Duration::from_secs(60);

async fn accept(listener: TcpListener, server: Arc<Server>, slots: Arc<Semaphore>) {
    let accepted = metrics::counter!(CONNECTIONS_TOTAL);
    let mut refresh = tokio::time::interval(OPEN_REFRESH);
    loop {
        let next = tokio::select! {
            next = listener.accept() => next,
            _ = refresh.tick() => {
                // An update that changes nothing but the gauge's last-updated mark.
                server.open.increment(0.0);
                continue;
            }
        };
        let (mut stream, peer) = match next {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(error = %e, "RESP accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        accepted.increment(1);
        server
            .connections_received
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            (server.rejected)("max_connections").increment(1);
            server
                .rejected_connections
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut out = BytesMut::new();
            Reply::err("max number of clients reached").encode(&mut out);
            tokio::spawn(async move {
                let _ = stream.write_all(&out).await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            server.open.increment(1.0);
            server
                .connections
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            serve(stream, peer, &server).await;
            tracing::debug!(%peer, "RESP connection closed");
            server
                .connections
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            server.open.decrement(1.0);
            drop(slot);
        });
    }
}

/// Limits on a connection that has not authenticated yet (with a password set): enough for
/// `AUTH`, little to buffer.
const UNAUTHENTICATED: ParseLimits = ParseLimits {
    max_args: 8,
    max_request_bytes: 16 << 10,
};

/// A command's reply: ready, or the filter's answer still to come; with the bytes of the
/// request it answers, which stay held until the reply is sent, and the protocol to encode
/// it in (the one in force when the command came: `HELLO`'s own reply is in the new one).
struct Pending {
    reply: PendingReply,
    bytes: usize,
    kind: Kind,
    protocol: Protocol,
}

/// What the connection must do once a reply is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Nothing.
    Plain,
    /// Sent to the actor ([`Session::with_actor`]).
    Actor,
    /// An `EXEC`: the commands after it may go on.
    Exec,
}

enum PendingReply {
    Ready(Option<Reply>),
    Answer(PendingResponse, crate::api::Op),
    /// A reply that comes later: an `EXEC`'s, or a `durable` add's once its commit is done.
    Future(futures::future::BoxFuture<'static, Reply>),
}

/// The reply to a request the replica did not take (not ready, busy, stopped) or refused.
pub(super) fn untaken_reply(e: &ReplicaError) -> Reply {
    match e {
        // What Redis answers while it loads its data: clients know to retry.
        ReplicaError::NotServing => Reply::Error(format!("LOADING {e}")),
        e => Reply::err(e),
    }
}

/// A command on the keys, answered from the filters `lookup` finds, creating and dropping
/// them through its catalog; `ack`: the connection's level, for the add of a key created by
/// it.
async fn run_key(
    lookup: Arc<dyn Keyspace>,
    dumps: &dump::Dumps,
    key: commands::KeyCommand,
    ack: Option<AckLevel>,
) -> Reply {
    use commands::KeyCommand as K;
    let text = |s: String| Reply::Bulk(bytes::Bytes::from(s));
    match key {
        K::Reserve { name, spec } => {
            let bloom = redisbloom::is_bloom(spec.kind);
            match lookup.create(name.clone(), spec).await {
                Ok(true) => Reply::Simple("OK"),
                // A key of the other family is RedisBloom's WRONGTYPE.
                Ok(false) | Err(_)
                    if lookup
                        .filter(&name)
                        .is_some_and(|h| !cms::in_family(h.kind(), bloom)) =>
                {
                    Reply::Error(commands::WRONGTYPE.into())
                }
                Ok(false) => Reply::Error(redisbloom::EXISTS.into()),
                Err(e) => Reply::Error(e),
            }
        }
        K::Create {
            name,
            spec,
            bloom,
            request,
        } => {
            let handle = match created(&*lookup, &name, spec).await {
                Ok(handle) => handle,
                Err(refused) => return refused,
            };
            if !cms::in_family(handle.kind(), bloom) {
                return Reply::Error(commands::WRONGTYPE.into());
            }
            let op = request.op();
            commands::reply(op, commands::send(&handle, *request, ack, true).await)
        }
        K::IfFound {
            name,
            family,
            request,
            missing,
        } => match lookup.filter(&name) {
            None => missing,
            Some(handle) => {
                let other_family =
                    family.is_some_and(|bloom| !cms::in_family(handle.kind(), bloom));
                let query = matches!(
                    request.op(),
                    crate::api::Op::Contains
                        | crate::api::Op::MContains
                        | crate::api::Op::Count
                        | crate::api::Op::Remove
                );
                match (other_family, query) {
                    (true, true) => missing,
                    (true, false) => Reply::Error(commands::WRONGTYPE.into()),
                    (false, _) => {
                        let op = request.op();
                        commands::reply(op, commands::send(&handle, *request, ack, true).await)
                    }
                }
            }
        },
        K::Cms(command) => cms::run(&*lookup, command, ack).await,
        K::Topk(command) => topk::run(&*lookup, command, ack).await,
        K::Tdigest(command) => tdigest::run(&*lookup, command, ack).await,
        K::Delete(names) => match drop_all(&*lookup, names).await {
            Ok(dropped) => Reply::Int(dropped as i64),
            Err(refused) => Reply::Error(refused),
        },
        K::FlushAll => match drop_all(&*lookup, lookup.names()).await {
            Ok(_) => Reply::Simple("OK"),
            Err(refused) => Reply::Error(refused),
        },
        K::ScanDump { name, iter } => {
            let (Some(handle), Some(spec)) = (lookup.filter(&name), lookup.spec(&name)) else {
                return Reply::err("not found");
            };
            dumps.scan(&name, &handle, spec, iter)
        }
        K::LoadChunk {
            name,
            iter,
            data,
            bloom,
        } => {
            if !dump::is_header(&data) && !dumps.loading(&name) {
                // Not a chunk of a dump being loaded: RedisBloom's answers to data it cannot
                // read.
                return if lookup.filter(&name).is_none() && iter != 1 {
                    Reply::err("not found")
                } else if bloom {
                    Reply::err("received bad data")
                } else {
                    Reply::Error("Invalid header".into())
                };
            }
            let (spec, state) = match dumps.load(&name, iter, &data) {
                Ok(Some(loaded)) => loaded,
                Ok(None) => return Reply::Simple("OK"),
                Err(refused) => return refused,
            };
            if redisbloom::is_bloom(spec.kind) != bloom {
                return Reply::Error(commands::WRONGTYPE.into());
            }
            restore(&*lookup, name, spec, state).await
        }
        K::Import { name, format, data } => {
            use crate::replica::interop;
            let (spec, state) = match interop::decode(format, &data) {
                Ok(decoded) => decoded,
                Err(e) => return Reply::err(format!("the {format} filter does not load: {e}")),
            };
            if let Some(h) = lookup.filter(&name)
                && let Err(e) = h.read(|f| interop::check_fits(f, &state))
            {
                return Reply::err(format!("not imported into `{name}`: {e}"));
            }
            if ack == Some(AckLevel::Replicated) {
                // The connection's `CRPF.ACK replicated`: as the request API's `import`, its
                // delta logged and confirmed by peers (or refused, too large), not a merge
                // that reaches peers unacknowledged.
                let handle = match created(&*lookup, &name, spec).await {
                    Ok(handle) => handle,
                    Err(refused) => return refused,
                };
                let request = crate::api::Request::Import {
                    format,
                    filter: data,
                    ack,
                };
                return match commands::send(&handle, request, ack, true).await {
                    Ok(_) => Reply::Simple("OK"),
                    Err(e) => Reply::err(format!("not imported into `{name}`: {e}")),
                };
            }
            restore(&*lookup, name, spec, state).await
        }
        K::Export { name, format } => match lookup.filter(&name) {
            None => Reply::err("not found"),
            Some(h) => match h.read(|f| crate::replica::interop::export(f, format)) {
                Ok(bytes) => Reply::Bulk(bytes::Bytes::from(bytes)),
                Err(e) => Reply::err(format!("`{name}` not exported: {e}")),
            },
        },
        K::Read { name, read, bloom } => {
            use commands::Read as R;
            let handle = lookup.filter(&name);
            let wrong = handle
                .as_ref()
                .is_some_and(|h| bloom.is_some_and(|bloom| !cms::in_family(h.kind(), bloom)));
            let wrongtype = || Reply::Error(commands::WRONGTYPE.into());
            match (read, handle) {
                (R::Compact, Some(_)) if !wrong => Reply::Simple("OK"),
                (R::Compact, _) => Reply::Error("Cuckoo filter was not found".into()),
                (R::Memory, Some(h)) => Reply::Int(redisbloom::memory_usage(&h) as i64),
                (R::Memory, None) => Reply::Null,
                (_, Some(_)) if wrong => wrongtype(),
                (R::Card, Some(h)) => redisbloom::bf_card(&h),
                (R::Card, None) => Reply::Int(0),
                (R::BfInfo(field), Some(h)) => redisbloom::bf_info(&h, field),
                (R::CfInfo, Some(h)) => redisbloom::cf_info(&h),
                (R::BfDebug, Some(h)) => redisbloom::bf_debug(&h),
                (R::BfInfo(_) | R::CfInfo | R::BfDebug, None) => Reply::err("not found"),
            }
        }
        K::Expire {
            name,
            ms,
            absolute,
            when,
            command,
        } => {
            let Some(current) = lookup.expiry(&name) else {
                return Reply::Int(0);
            };
            let now = crate::transport::catalog::now_ms();
            let at = if absolute {
                i128::from(ms)
            } else {
                i128::from(now) + i128::from(ms)
            };
            if at > i128::from(i64::MAX) {
                return Reply::err(format!("invalid expire time in '{command}' command"));
            }
            if !when.allows(current, at) {
                return Reply::Int(0);
            }
            // A time past (or now) drops the key, as Redis deletes it.
            let at = u64::try_from(at).unwrap_or(0).max(1);
            match lookup.set_expiry(name, Some(at)).await {
                Ok(existed) => Reply::Int(i64::from(existed)),
                Err(e) => Reply::Error(e),
            }
        }
        K::Persist(name) => match lookup.expiry(&name) {
            Some(Some(_)) => match lookup.set_expiry(name, None).await {
                Ok(existed) => Reply::Int(i64::from(existed)),
                Err(e) => Reply::Error(e),
            },
            _ => Reply::Int(0),
        },
        K::Ttl { name, ms, absolute } => match lookup.expiry(&name) {
            None => Reply::Int(-2),
            Some(None) => Reply::Int(-1),
            Some(Some(at)) => {
                // Redis's arithmetic: never below 0, seconds rounded to the nearest.
                let t = if absolute {
                    at
                } else {
                    at.saturating_sub(crate::transport::catalog::now_ms())
                };
                let t = if ms { t } else { (t + 500) / 1000 };
                Reply::Int(i64::try_from(t).unwrap_or(i64::MAX))
            }
        },
        K::Exists(keys) => {
            Reply::Int(keys.iter().filter(|k| lookup.filter(k).is_some()).count() as i64)
        }
        K::Type(key) => Reply::Simple(
            lookup
                .filter(&key)
                .map_or("none", |h| redisbloom::type_name(h.kind())),
        ),
        K::DbSize => Reply::Int(lookup.filter_count() as i64),
        K::RandomKey => {
            let names = lookup.names();
            match names.len() {
                0 => Reply::Null,
                n => key_reply(&names[fastrand::usize(..n)]),
            }
        }
        K::Keys {
            pattern,
            scan,
            kind,
        } => {
            let of_kind = |name: &str| match &kind {
                None => true,
                Some(kind) => lookup.filter(name).is_some_and(|h| {
                    redisbloom::type_name(h.kind())
                        .as_bytes()
                        .eq_ignore_ascii_case(kind)
                }),
            };
            // Matched and answered as the keys, not their subject names.
            let names: Vec<Reply> = lookup
                .names()
                .into_iter()
                .filter(|n| {
                    let key = crate::names::key_of(n).unwrap_or_else(|| n.as_bytes().to_vec());
                    commands::glob_match(&pattern, &key) && of_kind(n)
                })
                .map(|n| key_reply(&n))
                .collect();
            if scan {
                Reply::Array(vec![text("0".into()), Reply::Array(names)])
            } else {
                Reply::Array(names)
            }
        }
    }
}

/// The key of the filter of subject name `name` ([`crate::names`]), as a bulk string.
fn key_reply(name: &str) -> Reply {
    Reply::Bulk(crate::names::key_of(name).map_or_else(
        || bytes::Bytes::copy_from_slice(name.as_bytes()),
        bytes::Bytes::from,
    ))
}

/// Filter `name`, created of `spec` first if it does not exist (by this call, or by another
/// client meanwhile).
async fn created(
    lookup: &dyn Keyspace,
    name: &str,
    spec: crate::FilterSpec,
) -> Result<ReplicaHandle, Reply> {
    if lookup.filter(name).is_none() {
        match lookup.create(name.to_string(), spec).await {
            Ok(_) => {}
            Err(e) if e == redisbloom::EXISTS => {}
            Err(e) => return Err(Reply::Error(e)),
        }
    }
    lookup
        .filter(name)
        .ok_or_else(|| Reply::err("could not create filter"))
}

/// Loads a dump into filter `name`, created of `spec` if it does not exist, and snapshots it:
/// the kinds with tags or counts re-add its occurrences as this replica's own
/// ([`ReplicaHandle::import`]), the others merge its state. A key of another kind or
/// parameters is left as it is.
async fn restore(
    lookup: &dyn Keyspace,
    name: String,
    spec: crate::FilterSpec,
    state: crate::replica::AnyFilter,
) -> Reply {
    use crate::replica::AnyFilter;
    let fits = |h: &ReplicaHandle| {
        h.kind() == state.kind() && h.read(AnyFilter::params_digest) == state.params_digest()
    };
    if let Some(h) = lookup.filter(&name)
        && !fits(&h)
    {
        return dump::mismatch(&name, &spec, lookup.spec(&name).as_ref(), h.kind());
    }
    let handle = match created(lookup, &name, spec.clone()).await {
        Ok(handle) => handle,
        Err(refused) => return refused,
    };
    if !fits(&handle) {
        // Created meanwhile by another client, of another spec.
        return dump::mismatch(&name, &spec, lookup.spec(&name).as_ref(), handle.kind());
    }
    if state.kind().removable() {
        if let Err(e) = handle.import(&state).await {
            return Reply::err(format!("the dump was not loaded into `{name}`: {e}"));
        }
    } else {
        let now = crate::replica::wall_clock_ms();
        if let Err(e) = handle.read(|f| f.check_remote_state(&state, now)) {
            return Reply::err(format!("the dump does not fit `{name}`: {e}"));
        }
        if let Err(e) = handle.merge(state).await {
            return Reply::err(format!("the dump does not fit `{name}`: {e}"));
        }
    }
    match handle.persist().await {
        Ok(()) => Reply::Simple("OK"),
        Err(e) => Reply::err(format!("loaded, but not saved: {e}")),
    }
}

impl Future for Pending {
    type Output = (Reply, usize, Kind, Protocol);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let (bytes, kind, protocol) = (self.bytes, self.kind, self.protocol);
        let reply = match &mut self.reply {
            PendingReply::Ready(r) => std::task::Poll::Ready(r.take().expect("polled once ready")),
            PendingReply::Answer(response, op) => {
                let op = *op;
                response.poll_unpin(cx).map(|r| commands::reply(op, r))
            }
            PendingReply::Future(f) => f.poll_unpin(cx),
        };
        reply.map(|r| (r, bytes, kind, protocol))
    }
}

/// A command waiting for the actor's commands of this connection to be answered.
enum Waiting {
    Request(ReplicaHandle, commands::Request, usize),
    /// Commands run one after the other: an `EXEC`'s (replies in one array), or one key
    /// command (its reply alone).
    Exec(Vec<Command>, usize, Replies),
}

/// How the replies of commands run one after the other go out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Replies {
    /// In one array (`EXEC`).
    Array,
    /// The only command's reply as it is.
    Single,
}

/// The commands queued since `MULTI`.
#[derive(Default)]
struct Multi {
    queued: Vec<Command>,
    /// Request bytes of the queued commands: bounded by `max_request_bytes`, as commands in
    /// progress are (a queued command no longer counts as in progress once `QUEUED` is sent).
    bytes: usize,
    /// A command was refused while queueing: `EXEC` runs nothing (`EXECABORT`), as Redis.
    aborted: bool,
}

/// What a command is, for queueing it after `MULTI`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queued {
    /// A RedisBloom command (`BF.*`, `CF.*`).
    Module,
    /// `EXEC` itself.
    Exec,
    /// Any other.
    Command,
}

/// One step of an `EXEC`.
enum Step {
    Ready(Reply),
    Send(ReplicaHandle, commands::Request, Option<AckLevel>),
    Key(commands::KeyCommand, Option<AckLevel>),
}

/// One connection's state.
struct Session<'a> {
    server: &'a Server,
    authenticated: bool,
    ack: Option<AckLevel>,
    /// After `QUIT` or a protocol error: answer what is in progress, then close.
    closing: bool,
    /// The filter whose actor has commands of this connection not yet answered, and how many.
    /// Commands run in the order they came, as Redis runs them: until those are answered,
    /// later commands to the same filter queue behind them in the actor (a query would
    /// otherwise be answered at once, before an earlier add), and a command to another filter
    /// waits in [`Session::waiting`].
    with_actor: Option<(ReplicaHandle, usize)>,
    /// A command waiting for [`Session::with_actor`]'s commands to be answered.
    waiting: Option<Waiting>,
    /// The protocol: RESP2 until `HELLO 3`.
    protocol: Protocol,
    /// The connection's id (`HELLO`'s `id`).
    id: u64,
    /// How `CLIENT LIST` shows it.
    client: Arc<Client>,
    /// Its name (`CLIENT SETNAME`, `HELLO ... SETNAME`).
    name: Option<bytes::Bytes>,
    /// Commands queued since `MULTI`.
    multi: Option<Multi>,
    /// An `EXEC` is running: later commands wait for it, as they would in Redis.
    exec_running: bool,
    /// After `MONITOR`: the commands served, to send as they come.
    monitor: Option<slowlog::Monitor<'a>>,
    /// The arguments of the key command or `EXEC` about to run, for `SLOWLOG`.
    exec_args: Option<Vec<Bytes>>,
}

impl Session<'_> {
    /// Whether commands must wait before being parsed further.
    fn blocked(&self) -> bool {
        self.waiting.is_some() || self.exec_running
    }

    /// The reply to `args`, or `None` if the command waits in [`Session::waiting`].
    fn handle(&mut self, args: &parse::Args) -> Option<Pending> {
        let server = self.server;
        let bytes = args.size();
        // Before AUTH only what logs in or leaves is even parsed: nothing a command computes
        // from the filters (INFO, BF.CARD...) or the patterns it matches runs for a stranger.
        if !self.authenticated {
            let name = args.arg(0);
            let allowed = [&b"AUTH"[..], b"HELLO", b"QUIT"];
            if !allowed.iter().any(|a| name.eq_ignore_ascii_case(a)) {
                let refused = Reply::Error("NOAUTH Authentication required.".into());
                return Some(self.ready(refused, bytes));
            }
        }
        // A node whose start takes long (claiming its id, following the catalog: minutes
        // inside a partition) serves the connection's own commands and answers the others as
        // Redis does while it loads.
        if server.filters.loading() {
            let name = args.arg(0);
            let allowed = [
                &b"PING"[..],
                b"ECHO",
                b"AUTH",
                b"HELLO",
                b"QUIT",
                b"INFO",
                b"CLIENT",
                b"COMMAND",
                b"SELECT",
                b"RESET",
                b"ROLE",
                b"TIME",
                b"MODULE",
            ];
            if !allowed.iter().any(|a| name.eq_ignore_ascii_case(a)) {
                let loading = Reply::Error(LOADING.into());
                return Some(self.ready(loading, bytes));
            }
        }
        // A query for a parked filter is answered from its kept state (not in a transaction:
        // a queued one reads the state `EXEC` finds).
        let command = match self.multi {
            Some(_) => commands::command(args, |name| server.filters.filter(name)),
            None => commands::command_with(
                args,
                |name| server.filters.filter(name),
                |name, request| server.filters.query_parked(name, request),
            ),
        };
        if self.multi.is_some() {
            let name = args.arg(0);
            let family = |prefix: &[u8]| {
                name.len() > prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
            };
            let queued_as = if family(b"BF.") || family(b"CF.") {
                Queued::Module
            } else if name.eq_ignore_ascii_case(b"EXEC") {
                self.exec_args = Some(slowlog::summary(args));
                Queued::Exec
            } else {
                Queued::Command
            };
            return self.queue(command, bytes, queued_as);
        }
        match command {
            Command::Filter(handle, request) => self.send(handle, request, bytes),
            // Outside a transaction the key was missing a moment ago: answered at once (and
            // counted as refused before reaching a filter); only a queued one looks again.
            Command::Key(commands::KeyCommand::IfFound { missing, .. }) => {
                Some(self.answer(Command::Reply(missing), bytes))
            }
            Command::Multi if self.authenticated => {
                self.multi = Some(Multi::default());
                Some(self.ready(Reply::Simple("OK"), bytes))
            }
            Command::Exec if self.authenticated => {
                Some(self.ready(Reply::err("EXEC without MULTI"), bytes))
            }
            Command::Discard if self.authenticated => {
                Some(self.ready(Reply::err("DISCARD without MULTI"), bytes))
            }
            Command::Key(key) if self.authenticated => {
                self.exec_args = Some(slowlog::summary(args));
                self.exec(vec![Command::Key(key)], bytes, Replies::Single)
            }
            command => Some(self.answer(command, bytes)),
        }
    }

    /// A command after `MULTI`: queued (`+QUEUED`), or `EXEC`, `DISCARD`, or refused (which
    /// aborts the transaction). A RedisBloom command's refusal is queued as its reply, as
    /// Redis queues a module's commands and they refuse when `EXEC` runs them.
    fn queue(&mut self, command: Command, bytes: usize, queued_as: Queued) -> Option<Pending> {
        let multi = self.multi.as_mut().expect("in MULTI");
        let reply = match command {
            // `EXEC` refused (its arity): the transaction is discarded.
            Command::Reply(refused @ Reply::Error(_)) if queued_as == Queued::Exec => {
                self.multi = None;
                refused
            }
            Command::Reply(refused @ Reply::Error(_)) if queued_as == Queued::Module => {
                multi.bytes += bytes;
                multi.queued.push(Command::Reply(refused));
                Reply::Simple("QUEUED")
            }
            Command::Exec => {
                let multi = self.multi.take().expect("in MULTI");
                if multi.aborted {
                    Reply::Error(
                        "EXECABORT Transaction discarded because of previous errors.".into(),
                    )
                } else {
                    return self.exec(multi.queued, bytes, Replies::Array);
                }
            }
            Command::Discard => {
                self.multi = None;
                Reply::Simple("OK")
            }
            Command::Multi => Reply::err("MULTI calls can not be nested"),
            Command::Quit => return Some(self.answer(Command::Quit, bytes)),
            Command::Reply(refused @ Reply::Error(_)) => {
                multi.aborted = true;
                refused
            }
            Command::Filter(..) | Command::Key(_) | Command::Reply(_) | Command::SetAck(_)
                if multi.bytes + bytes > self.server.limits.max_request_bytes =>
            {
                multi.aborted = true;
                multi.queued = Vec::new();
                Reply::err(format!(
                    "the transaction's commands exceed max_request_bytes ({}): it is discarded",
                    self.server.limits.max_request_bytes
                ))
            }
            Command::Auth(..) | Command::AuthRefused(_) | Command::Hello { .. } => {
                multi.aborted = true;
                Reply::err("Command not allowed inside a transaction")
            }
            queued => {
                multi.bytes += bytes;
                multi.queued.push(queued);
                Reply::Simple("QUEUED")
            }
        };
        Some(self.ready(reply, bytes))
    }

    /// Runs an `EXEC`'s commands (or one key command) once this connection's earlier
    /// commands with an actor are answered.
    fn exec(&mut self, queued: Vec<Command>, bytes: usize, replies: Replies) -> Option<Pending> {
        if self.with_actor.is_some() {
            self.waiting = Some(Waiting::Exec(queued, bytes, replies));
            return None;
        }
        Some(self.start_exec(queued, bytes, replies))
    }

    /// Commands one after the other, each through its filter's actor (in order behind
    /// anything before it) or the catalog, their replies in one array (or the only one's
    /// alone). Nothing else of this connection runs meanwhile: the commands after a
    /// `BF.RESERVE` find its filter.
    fn start_exec(&mut self, queued: Vec<Command>, bytes: usize, replies: Replies) -> Pending {
        let mut steps = Vec::with_capacity(queued.len());
        for command in queued {
            steps.push(match command {
                Command::Filter(handle, request) => Step::Send(handle, request, self.ack),
                Command::Key(key) => Step::Key(key, self.ack),
                Command::SetAck(level) => {
                    self.ack = Some(level);
                    Step::Ready(Reply::Simple("OK"))
                }
                Command::Reply(reply) => Step::Ready(reply),
                Command::ClientId => Step::Ready(Reply::Int(self.id as i64)),
                Command::ClientSetName(name) => {
                    self.set_name(Some(name));
                    Step::Ready(Reply::Simple("OK"))
                }
                Command::ClientGetName => {
                    Step::Ready(self.name.clone().map_or(Reply::Null, Reply::Bulk))
                }
                Command::ClientList(ids) => Step::Ready(self.client_list(ids.as_deref())),
                Command::ClientInfo => Step::Ready(self.client_info()),
                Command::ClientKill(kill) => Step::Ready(self.client_kill(&kill)),
                Command::Info(sections) => Step::Ready(self.info(&sections)),
                // Only the commands above are queued.
                _ => Step::Ready(Reply::err("not allowed inside a transaction")),
            });
        }
        let lookup = self.server.filters.clone();
        let dumps = self.server.dumps.clone();
        let run = async move {
            let mut out = Vec::with_capacity(steps.len());
            for step in steps {
                out.push(match step {
                    Step::Ready(reply) => reply,
                    Step::Send(handle, request, ack) => {
                        let op = request.op();
                        commands::reply(op, commands::send(&handle, request, ack, true).await)
                    }
                    Step::Key(key, ack) => run_key(lookup.clone(), &dumps, key, ack).await,
                });
            }
            match replies {
                Replies::Array => Reply::Array(out),
                Replies::Single => out.pop().unwrap_or(Reply::Null),
            }
        };
        self.exec_running = true;
        // Timed for `SLOWLOG` from here: its turn has come.
        let run = match self.exec_args.take() {
            Some(args) => {
                let started = Instant::now();
                let (addr, name) = (self.client.addr, self.name.clone().unwrap_or_default());
                let watch = self.server.watch.clone();
                async move {
                    let reply = run.await;
                    watch.took(started.elapsed(), args, addr, name);
                    reply
                }
                .boxed()
            }
            None => run.boxed(),
        };
        Pending {
            reply: PendingReply::Future(run),
            bytes,
            kind: Kind::Exec,
            protocol: self.protocol,
        }
    }

    /// `INFO`'s reply.
    fn info(&self, sections: &[String]) -> Reply {
        use std::sync::atomic::Ordering::Relaxed;
        let server = self.server;
        introspect::info_text(
            sections,
            &introspect::Facts {
                port: server.addr.port(),
                started: server.started,
                clients: server
                    .connections
                    .load(std::sync::atomic::Ordering::Relaxed),
                max_clients: server.max_connections,
                keys: server.filters.filter_count(),
                connections_received: server.connections_received.load(Relaxed),
                commands_processed: server.commands_processed.load(Relaxed),
                rejected_connections: server.rejected_connections.load(Relaxed),
                loading: server.filters.loading(),
            },
        )
    }

    /// Names the connection (`CLIENT SETNAME`, `HELLO ... SETNAME`).
    fn set_name(&mut self, name: Option<Bytes>) {
        *self.client.name.lock().expect("client name lock") = name.clone();
        self.name = name;
    }

    /// `CLIENT LIST [ID id...]`.
    fn client_list(&self, ids: Option<&[u64]>) -> Reply {
        let clients: Vec<Arc<Client>> = self
            .server
            .clients
            .lock()
            .expect("clients lock")
            .values()
            .filter(|c| ids.is_none_or(|ids| ids.contains(&c.id)))
            .cloned()
            .collect();
        let mut out = String::new();
        for c in clients {
            let multi = (c.id == self.id).then(|| self.multi.as_ref().map(|m| m.queued.len()));
            out.push_str(&c.line(multi.flatten()));
        }
        Reply::Text(Bytes::from(out))
    }

    /// `CLIENT INFO`.
    fn client_info(&self) -> Reply {
        let multi = self.multi.as_ref().map(|m| m.queued.len());
        Reply::Text(Bytes::from(self.client.line(multi)))
    }

    /// `CLIENT KILL`: notifies the connections it selects, which close at once.
    fn client_kill(&self, kill: &commands::ClientKill) -> Reply {
        let victims: Vec<Arc<Client>> = self
            .server
            .clients
            .lock()
            .expect("clients lock")
            .values()
            .filter(|c| {
                kill.id.is_none_or(|id| id == c.id)
                    && kill.addr.as_ref().is_none_or(|a| *a == c.addr.to_string())
                    && kill
                        .laddr
                        .as_ref()
                        .is_none_or(|a| *a == c.local.to_string())
                    && !(kill.skip_me && c.id == self.id)
            })
            .cloned()
            .collect();
        for c in &victims {
            c.kill.notify_one();
        }
        match (kill.old_form, victims.len()) {
            (true, 0) => Reply::err("No such client"),
            (true, _) => Reply::Simple("OK"),
            (false, n) => Reply::Int(n as i64),
        }
    }

    /// A reply answered at once, counted if it refuses.
    fn ready(&self, reply: Reply, bytes: usize) -> Pending {
        if let Some(reason) = commands::rejected_reason(&reply) {
            (self.server.rejected)(reason).increment(1);
        }
        Pending {
            reply: PendingReply::Ready(Some(reply)),
            bytes,
            kind: Kind::Plain,
            protocol: self.protocol,
        }
    }

    /// `HELLO`'s reply: who answers, in the protocol now in force.
    fn hello_reply(&self) -> Reply {
        let text = |s: &str| Reply::Bulk(bytes::Bytes::copy_from_slice(s.as_bytes()));
        let proto = match self.protocol {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        };
        Reply::Map(vec![
            // Redis's name: clients check the server they reached speaks its protocol.
            (text("server"), text("redis")),
            (text("version"), text("7.2.0")),
            (text("proto"), Reply::Int(proto)),
            (text("id"), Reply::Int(self.id as i64)),
            (text("mode"), text("standalone")),
            (text("role"), text("master")),
            (text("modules"), Reply::Array(vec![introspect::bf_module()])),
            (text("crpf"), text(env!("CARGO_PKG_VERSION"))),
        ])
    }

    /// Sends a filter's command, in order behind what this connection has with an actor.
    fn send(
        &mut self,
        handle: ReplicaHandle,
        request: commands::Request,
        bytes: usize,
    ) -> Option<Pending> {
        if !self.authenticated {
            let refused = Reply::Error("NOAUTH Authentication required.".into());
            return Some(self.answer(Command::Reply(refused), bytes));
        }
        let queued = match &self.with_actor {
            None => false,
            Some((h, _)) if h.name() == handle.name() => true,
            Some(_) => {
                self.waiting = Some(Waiting::Request(handle, request, bytes));
                return None;
            }
        };
        let op = request.op();
        let response = commands::send(&handle, request, self.ack, queued);
        let via_actor = response.via_actor();
        if via_actor {
            self.with_actor.get_or_insert((handle, 0)).1 += 1;
        }
        // Answered already (a query, an add applied here): out without a future.
        let reply = match response {
            PendingResponse::Ready(Some(answer)) => {
                PendingReply::Ready(Some(commands::reply(op, answer)))
            }
            response => PendingReply::Answer(response, op),
        };
        Some(Pending {
            reply,
            bytes,
            kind: if via_actor { Kind::Actor } else { Kind::Plain },
            protocol: self.protocol,
        })
    }

    /// A reply of `kind` was sent: what may go on now.
    fn sent(&mut self, kind: Kind) -> Option<Pending> {
        match kind {
            Kind::Plain => None,
            Kind::Actor => self.answered_by_actor(),
            Kind::Exec => {
                self.exec_running = false;
                None
            }
        }
    }

    /// A command sent to the actor was answered. Once all are, the order needs nothing
    /// more: sends the waiting command, if any.
    fn answered_by_actor(&mut self) -> Option<Pending> {
        if let Some((_, n)) = &mut self.with_actor {
            *n -= 1;
            if *n > 0 {
                return None;
            }
        }
        self.with_actor = None;
        match self.waiting.take()? {
            Waiting::Request(handle, request, bytes) => self.send(handle, request, bytes),
            Waiting::Exec(queued, bytes, replies) => Some(self.start_exec(queued, bytes, replies)),
        }
    }

    fn answer(&mut self, command: Command, bytes: usize) -> Pending {
        let server = self.server;
        let reply = match command {
            Command::Auth(given, user) => match &server.password {
                // Redis's default user without a password takes any, named.
                None if user => Reply::Simple("OK"),
                None => Reply::err(
                    "AUTH <password> called without any password configured for the default \
                     user. Are you sure your configuration is correct?",
                ),
                Some(hash) if Sha256::digest(&given)[..] == hash[..] => {
                    self.authenticated = true;
                    Reply::Simple("OK")
                }
                Some(_) => Reply::Error(commands::WRONGPASS.into()),
            },
            Command::Quit => {
                self.closing = true;
                Reply::Simple("OK")
            }
            Command::AuthRefused(reply) => reply,
            Command::Hello {
                protocol,
                password,
                name,
            } => {
                let refused = match (&password, &server.password) {
                    // Redis's default user without a password takes any.
                    (Some(_), None) => None,
                    (Some(given), Some(hash)) if Sha256::digest(given)[..] == hash[..] => {
                        self.authenticated = true;
                        None
                    }
                    (Some(_), Some(_)) => Some(Reply::Error(commands::WRONGPASS.into())),
                    (None, _) if !self.authenticated => Some(Reply::Error(
                        "NOAUTH HELLO must be called with the client already authenticated, \
                         otherwise the HELLO <proto> AUTH <user> <pass> option can be used to \
                         authenticate the client and select the RESP protocol version at the \
                         same time"
                            .into(),
                    )),
                    (None, _) => None,
                };
                match refused {
                    Some(reply) => reply,
                    None => {
                        if let Some(p) = protocol {
                            self.protocol = p;
                            let resp = if p == Protocol::Resp3 { 3 } else { 2 };
                            self.client
                                .resp
                                .store(resp, std::sync::atomic::Ordering::Relaxed);
                        }
                        if name.is_some() {
                            self.set_name(name);
                        }
                        self.hello_reply()
                    }
                }
            }
            _ if !self.authenticated => Reply::Error("NOAUTH Authentication required.".into()),
            Command::Reply(reply) => reply,
            Command::SetAck(level) => {
                self.ack = Some(level);
                Reply::Simple("OK")
            }
            Command::Key(_) => unreachable!("run by Session::handle"),
            Command::ClientId => Reply::Int(self.id as i64),
            Command::ClientSetName(name) => {
                self.set_name(Some(name));
                Reply::Simple("OK")
            }
            Command::ClientGetName => self.name.clone().map_or(Reply::Null, Reply::Bulk),
            Command::ClientList(ids) => self.client_list(ids.as_deref()),
            Command::ClientInfo => self.client_info(),
            Command::ClientKill(kill) => self.client_kill(&kill),
            Command::Info(sections) => self.info(&sections),
            Command::Monitor => {
                if self.monitor.is_none() {
                    self.monitor = Some(server.watch.monitor());
                }
                Reply::Simple("OK")
            }
            Command::SlowLog(commands::SlowLog::Get(count)) => server.watch.get(count),
            Command::SlowLog(commands::SlowLog::Len) => Reply::Int(server.watch.len() as i64),
            Command::SlowLog(commands::SlowLog::Reset) => {
                server.watch.reset();
                Reply::Simple("OK")
            }
            Command::Multi | Command::Exec | Command::Discard => {
                unreachable!("answered by Session::handle")
            }
            Command::Filter(..) => unreachable!("sent by Session::send"),
        };
        self.ready(reply, bytes)
    }
}

/// A connection's place in [`Server::clients`], for as long as it is served.
struct Listed<'a> {
    server: &'a Server,
    id: u64,
}

impl<'a> Listed<'a> {
    fn new(server: &'a Server, client: Arc<Client>) -> Self {
        let id = client.id;
        server
            .clients
            .lock()
            .expect("clients lock")
            .insert(id, client);
        Listed { server, id }
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.server
            .clients
            .lock()
            .expect("clients lock")
            .remove(&self.id);
    }
}

/// Capacity an idle connection's buffer keeps; a larger one is given back.
const BUFFER_KEEP: usize = 64 << 10;

/// Closes our side after `QUIT` or a protocol error, then reads and drops what the client is
/// still sending, for a moment: closing a socket with unread input sends a reset, which can
/// discard the replies not yet delivered (the error among them).
async fn linger(rd: &mut tokio::net::tcp::OwnedReadHalf, wr: &mut tokio::net::tcp::OwnedWriteHalf) {
    let _ = wr.shutdown().await;
    let mut sink = vec![0u8; 16 << 10];
    let drain = async {
        let mut left = 1usize << 20;
        while left > 0 {
            match rd.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
}

/// How long a connection handles buffered commands before it writes the replies it has.
/// Writing them all once the buffer is parsed left the client idle while the node worked
/// through up to 16 batches, and then the node idle while the client caught up: flushing
/// every 20 µs of work lets both run at once. Side by side with RedisBloom (CHANGELOG.md's
/// benchmark history),
/// single items at 16 in flight went from 0.72-0.85x to 1.0-1.2x, `madd` from 1.0x to about
/// 1.1x; at 5 µs the extra writes cost more than the overlap gained at 64 in flight.
const FLUSH_AFTER: Duration = Duration::from_micros(20);

/// Serves one connection until the client leaves, sends `QUIT`, or breaks the protocol.
/// Memory is bounded by the commands in progress: at most `max_pipeline` of them, and no
/// new one parsed while those hold `max_request_bytes` or more.
async fn serve(stream: TcpStream, peer: SocketAddr, server: &Server) {
    let local = stream.local_addr().unwrap_or(server.addr);
    let (mut rd, mut wr) = stream.into_split();
    let id = server
        .next_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let client = Arc::new(Client {
        id,
        addr: peer,
        local,
        since: Instant::now(),
        last_read_ms: Default::default(),
        name: Default::default(),
        resp: std::sync::atomic::AtomicU8::new(2),
        kill: Default::default(),
    });
    let _listed = Listed::new(server, client.clone());
    let mut session = Session {
        server,
        authenticated: server.password.is_none(),
        ack: None,
        closing: false,
        with_actor: None,
        waiting: None,
        protocol: Protocol::Resp2,
        id,
        client: client.clone(),
        name: None,
        multi: None,
        exec_running: false,
        monitor: None,
        exec_args: None,
    };
    let mut parser = parse::Parser::default();
    let mut input = BytesMut::with_capacity(16 << 10);
    let mut output = BytesMut::with_capacity(16 << 10);
    let mut pending = FuturesOrdered::new();
    // Bytes of the requests in `pending` and `waiting`.
    let mut held = 0usize;
    let mut eof = false;
    let room = |pending: &FuturesOrdered<Pending>, held: usize| {
        pending.len() < server.max_pipeline && held < server.limits.max_request_bytes
    };
    // The idle deadline: one timer per connection, moved on only when it fires (a read
    // just records the time), so the busy path registers no timer.
    let idle_timeout = server.idle_timeout.unwrap_or(Duration::MAX);
    let mut last_read = Instant::now();
    let idle = tokio::time::sleep(idle_timeout.min(Duration::from_secs(86_400 * 365)));
    tokio::pin!(idle);
    // One wait for `CLIENT KILL` for the connection's life: a new one at every turn of the
    // loop would register and unregister with the `Notify` on the busy path.
    let killed = client.kill.notified();
    tokio::pin!(killed);
    loop {
        // Commands already buffered, as far as the limits allow.
        let mut stopped_for_room = false;
        let mut flush_first = false;
        let parse_start = Instant::now();
        // Commands parsed in this round: counted once, and the clock read every few.
        let mut parsed = 0u64;
        while !session.closing && !session.blocked() {
            if !room(&pending, held) {
                stopped_for_room = true;
                break;
            }
            if parsed % 4 == 3
                && (!pending.is_empty() || !output.is_empty())
                && parse_start.elapsed() > FLUSH_AFTER
            {
                // Replies first; the rest of the buffer right after (below).
                flush_first = true;
                break;
            }
            let limits = if session.authenticated {
                server.limits
            } else {
                UNAUTHENTICATED
            };
            match parser.next_command(&mut input, limits) {
                // Redis answers nothing to an empty command.
                Ok(Some(args)) if args.is_empty() => {}
                Ok(Some(args)) => {
                    parsed += 1;
                    if server.watch.monitored() {
                        server.watch.feed(&args, client.addr);
                    }
                    match session.handle(&args) {
                        // Answered, with nothing ahead of it: out without a future.
                        Some(Pending {
                            reply: PendingReply::Ready(Some(reply)),
                            kind: Kind::Plain,
                            protocol,
                            ..
                        }) if pending.is_empty() => reply.encode_as(&mut output, protocol),
                        answer => {
                            held += args.size();
                            pending.extend(answer);
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    (server.rejected)("protocol").increment(1);
                    // Not through `Session::answer`: before `AUTH` it would say NOAUTH.
                    pending.push_back(Pending {
                        reply: PendingReply::Ready(Some(Reply::err(e))),
                        bytes: 0,
                        kind: Kind::Plain,
                        protocol: session.protocol,
                    });
                    session.closing = true;
                }
            }
        }
        server.commands.increment(parsed);
        server
            .commands_processed
            .fetch_add(parsed, std::sync::atomic::Ordering::Relaxed);
        // Everything answered already goes out in one write.
        let mut answered = false;
        while let Some(Some((reply, bytes, kind, protocol))) = pending.next().now_or_never() {
            reply.encode_as(&mut output, protocol);
            held -= bytes;
            answered = true;
            pending.extend(session.sent(kind));
        }
        if !output.is_empty() {
            if wr.write_all(&output).await.is_err() {
                return;
            }
            output.clear();
            // An idle connection does not keep what one large reply or request needed.
            if output.capacity() > BUFFER_KEEP {
                output = BytesMut::with_capacity(16 << 10);
            }
        }
        if input.is_empty() && input.capacity() > BUFFER_KEEP {
            input = BytesMut::with_capacity(16 << 10);
        }
        if flush_first || (answered && (stopped_for_room || !session.blocked())) {
            // Room again, a waiting command sent, or the ready replies written: parse what
            // is buffered before reading (or closing) on. After a flush, whether or not a
            // reply was ready: the buffered commands must not wait for the first reply
            // (one waiting for a commit would hold up commands that share its commit).
            continue;
        }
        let reading = !session.closing && !eof && !session.blocked() && room(&pending, held);
        if pending.is_empty() && !reading {
            // Nothing in progress, nothing more to read: closing, or the client left. (A
            // waiting command always has the actor's commands before it in `pending`.)
            if session.closing {
                linger(&mut rd, &mut wr).await;
            }
            return;
        }
        if input.capacity() - input.len() < 4096 {
            input.reserve(16 << 10);
        }
        tokio::select! {
            read = rd.read_buf(&mut input), if reading => match read {
                Ok(0) => eof = true,
                Ok(_) => {
                    last_read = Instant::now();
                    client.last_read_ms.store(
                        last_read.duration_since(client.since).as_millis() as u64,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                Err(_) => return,
            },
            () = &mut killed => {
                (server.rejected)("killed").increment(1);
                return;
            }
            () = &mut idle, if server.idle_timeout.is_some() => {
                let due = last_read + idle_timeout;
                if Instant::now() >= due && pending.is_empty() && !session.blocked() {
                    (server.rejected)("idle_timeout").increment(1);
                    return;
                }
                // Not idle long enough (or busy): look again when it could be.
                let next = due.max(Instant::now() + Duration::from_millis(100));
                idle.as_mut().reset(tokio::time::Instant::from_std(next));
            }
            Some((reply, bytes, kind, protocol)) = pending.next(), if !pending.is_empty() => {
                reply.encode_as(&mut output, protocol);
                held -= bytes;
                pending.extend(session.sent(kind));
            }
            Some(line) = async {
                match session.monitor.as_mut() {
                    Some(m) => m.next().await,
                    None => std::future::pending().await,
                }
            }, if session.monitor.is_some() => {
                output.extend_from_slice(&line);
            }
        }
    }
}
