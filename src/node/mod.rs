//! The node layer (docs/DESIGN.md section 1, layer 5): configuration, the Prometheus exporter, and
//! the `crpf` subcommands that run replicas (`node`, `demo`) or read their snapshots
//! (`inspect`).

pub mod catalog_api;
mod config;
mod demo;
pub mod exporter;
pub(crate) mod follow;
mod foreign;
mod host;
mod inspect;
mod keygen;
mod keyspace;
mod table;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use thiserror::Error;

pub use config::{
    ApiQueue, CatalogSection, ConfigError, DeclaredMetrics, NodeConfig, NodeSection,
    RuntimeFilterDefaults,
};
pub use demo::{DemoArgs, run_demo};
pub use host::{
    CATALOG_CHANGES, CATALOG_ERRORS, DROPPED_DIR, ENTRY_FILE, Expiry, FILTERS, HostError,
    HostedFilter, NODE_API_REQUESTS, Node, PARKED_FILTERS, PARKED_MESSAGES, PARKED_QUERIES,
    PARKING,
};
pub use inspect::{InspectArgs, run_inspect};
pub use keygen::{KeygenArgs, KeygenError, new_key_text, run_keygen};

use crate::replica::{FINAL_FLUSH_TIMEOUT, ReplicaError, ReplicaHandle};
use crate::transport::{InProcessBus, NatsTransport, Transport, TransportError};

/// What can stop a node.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The metrics exporter could not start (e.g. its address is taken).
    #[error(transparent)]
    Exporter(#[from] exporter::ExporterError),
    /// NATS could not be reached or used.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A replica failed to start or stop.
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// A snapshot could not be read.
    #[error(transparent)]
    Durable(#[from] crate::replica::DurableError),
    /// Anything else worth a non-zero exit.
    #[error("{0}")]
    Failed(String),
    /// Local I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The RESP front end could not start.
    #[error(transparent)]
    Resp(#[from] crate::resp::RespError),
}

/// The file of a data directory its node holds locked.
pub const DATA_DIR_LOCK: &str = "node.lock";

/// How long a node waits for the process before it to let go of its data directory (a
/// restart right after a `kill -9`, whose process the kernel is still tearing down).
const DATA_DIR_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Locks `dir` for this process ([`DATA_DIR_LOCK`]), waiting up to [`DATA_DIR_LOCK_WAIT`]:
/// two processes on one data directory would interleave their logs, and a run of a kind whose
/// ids serve one run retires the claims of the directory's earlier runs, which must have ended.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, NodeError> {
    crate::replica::durable::create_dir_synced(&*crate::replica::disk::real(), dir)?;
    let path = dir.join(DATA_DIR_LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    let deadline = std::time::Instant::now() + DATA_DIR_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(NodeError::Failed(format!(
                    "data directory {} is in use by another process ({} held for {} s)",
                    dir.display(),
                    path.display(),
                    DATA_DIR_LOCK_WAIT.as_secs()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

/// `crpf node`: runs the replicas a configuration declares until SIGINT or SIGTERM.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// The node's TOML configuration (see configs/); `CRPF_<SECTION>__<FIELD>` variables
    /// override its values.
    #[arg(long, short, env = "CRPF_CONFIG")]
    pub config: PathBuf,
}

/// Runs an async body on an actix System over a Tokio runtime with `io_threads` workers, or a
/// single-threaded one for 0 (actors need a System; `spawn_local` panics under a plain Tokio
/// runtime, docs/DESIGN.md section 7).
pub(crate) fn block_on_system<F: Future<Output = Result<(), NodeError>>>(
    io_threads: usize,
    body: F,
) -> Result<(), NodeError> {
    actix::System::with_tokio_rt(move || {
        let mut rt = if io_threads == 0 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(io_threads);
            b
        };
        rt.enable_all().build().expect("a Tokio runtime")
    })
    .block_on(body)
}

/// Connects to NATS if configured, else returns an in-process bus.
pub(crate) async fn connect(
    nats: Option<&crate::transport::NatsConfig>,
) -> Result<(Arc<dyn Transport>, Option<Arc<NatsTransport>>), NodeError> {
    Ok(match nats {
        Some(cfg) => {
            let t = Arc::new(NatsTransport::connect(cfg.clone()).await?);
            t.require_jetstream().await?;
            (t.clone() as Arc<dyn Transport>, Some(t))
        }
        None => (Arc::new(InProcessBus::new()) as Arc<dyn Transport>, None),
    })
}

/// SIGINT and SIGTERM, caught from the moment this is made: one that arrives while the node is
/// still starting (claiming ids, following the catalog) waits for [`ShutdownSignals::recv`]
/// instead of killing the process before its final snapshots.
pub(crate) struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    pub(crate) fn install() -> Result<Self, NodeError> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on SIGINT or SIGTERM (at once for one caught earlier).
    pub(crate) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Stops replicas (each takes a final snapshot) and drains the NATS connection, so that what
/// was published reaches the server.
pub(crate) async fn stop(
    replicas: Vec<ReplicaHandle>,
    nats: Option<Arc<NatsTransport>>,
    stopped: impl FnOnce(),
) -> Result<(), NodeError> {
    use futures::StreamExt;
    // Many at once, and one deadline for all their last publications, which never go out
    // while NATS is unreachable: one after another, 100 filters each waiting its 5 s took 8
    // minutes to stop, and so did 100,000 a thousand at a time.
    let flush_by = tokio::time::Instant::now() + FINAL_FLUSH_TIMEOUT;
    let mut stops = futures::stream::iter(replicas)
        .map(|r| async move {
            let r2 = r.clone();
            (r2, r.shutdown_by(flush_by).await)
        })
        .buffer_unordered(PARALLEL_STOPS);
    let mut first_error = None;
    while let Some((r, result)) = stops.next().await {
        if let Err(e) = result {
            tracing::error!(filter = r.name(), error = %e, "replica did not stop cleanly");
            first_error.get_or_insert(e);
        }
    }
    crate::replica::crash::point(crate::replica::crash::NODE_STOPPED);
    // Once every replica stopped (the node's routes to them end here), before the drain.
    stopped();
    if let Some(nats) = nats {
        // A drain waits for the server: bounded, so that a node whose server is gone still
        // exits (its replicas' states are saved by now).
        match tokio::time::timeout(DRAIN_TIMEOUT, nats.client().drain()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "NATS drain failed"),
            Err(_) => tracing::warn!(
                timeout_s = DRAIN_TIMEOUT.as_secs(),
                "NATS drain did not finish (server unreachable?); exiting anyway"
            ),
        }
    }
    first_error.map_or(Ok(()), |e| Err(e.into()))
}

/// Replicas stopped at once by [`stop`].
const PARALLEL_STOPS: usize = 1024;

/// How long [`stop`] waits for the NATS connection to drain.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The transport a node's replicas use, and the catalog it follows: over NATS one shared
/// replication connection for all its replicas and the catalog's KV bucket; without NATS an
/// in-process bus and its catalog.
pub(crate) async fn connect_node(
    nats: Option<&crate::transport::NatsConfig>,
) -> Result<
    (
        Arc<dyn Transport>,
        Arc<dyn crate::transport::Catalog>,
        Option<Arc<NatsTransport>>,
    ),
    NodeError,
> {
    Ok(match nats {
        Some(cfg) => {
            let t = Arc::new(
                NatsTransport::connect(cfg.clone())
                    .await?
                    .sharing_replication(),
            );
            t.require_jetstream().await?;
            let catalog = Arc::new(t.catalog());
            (t.clone() as Arc<dyn Transport>, catalog, Some(t))
        }
        None => {
            let bus = InProcessBus::new();
            let catalog = Arc::new(bus.catalog());
            (Arc::new(bus) as Arc<dyn Transport>, catalog, None)
        }
    })
}

/// Makes freed buffers of 1 MiB and more go back to the operating system at once. glibc's
/// malloc raises its mmap threshold to the size of the largest block freed (up to 32 MiB):
/// after one multi-megabyte frame or state, later ones come from the heap, which keeps
/// their pages after they are freed, so a node's RSS stayed at its peak. A fixed threshold
/// maps each large buffer and unmaps it when freed.
fn give_large_buffers_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets an allocator parameter; called before the node's threads.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused; large buffers stay in the heap");
        }
    }
}

/// How long a node's start may take before its RESP port opens all the same, answering
/// `-LOADING`.
const RESP_LOADING_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// `crpf node`.
pub fn run_node(args: &NodeArgs) -> Result<(), NodeError> {
    let cfg = NodeConfig::load(&args.config)?;
    // Held until the process exits (the kernel lets go of it then, `kill -9` included).
    let _data_dir = cfg
        .node
        .data_dir
        .as_deref()
        .map(lock_data_dir)
        .transpose()?;
    give_large_buffers_back();
    exporter::install(
        cfg.node.metrics_addr,
        "`node.metrics_addr` (or CRPF_NODE__METRICS_ADDR)",
    )?;
    host::describe();
    tracing::info!(metrics = %cfg.node.metrics_addr, filters = cfg.filters.len(), catalog = cfg.catalog.enabled, "crpf node starting");
    block_on_system(cfg.node.io_threads, async move {
        let mut signals = ShutdownSignals::install()?;
        let (transport, catalog, nats) = connect_node(cfg.nats.as_ref()).await?;
        let resp = cfg.resp.clone();
        let catalog_prefix = cfg
            .catalog
            .defaults
            .prefix
            .clone()
            .unwrap_or_else(|| "crpf".into());
        let serve_catalog = cfg.catalog.enabled;
        let max_batch = cfg
            .filters
            .iter()
            .map(|f| f.max_batch_items)
            .chain([crate::api::DEFAULT_MAX_BATCH_ITEMS])
            .max()
            .unwrap_or(crate::api::DEFAULT_MAX_BATCH_ITEMS);
        // RESP opens once the node has started, or after `RESP_LOADING_AFTER` if its start
        // takes longer (inside a partition it waits for the id registry and the catalog):
        // then commands on keys answer `-LOADING` until it has.
        let starting = Node::start(cfg, transport.clone(), Some(catalog));
        tokio::pin!(starting);
        let (node, loading) = match &resp {
            Some(resp) => tokio::select! {
                node = &mut starting => (node?, None),
                () = tokio::time::sleep(RESP_LOADING_AFTER) => {
                    tracing::warn!("the node's start takes long: RESP answers -LOADING until it has started");
                    let lookup = Arc::new(crate::resp::Starting::<Node>::default());
                    crate::resp::RespServer::start_with(resp, lookup.clone(), max_batch).await?;
                    (starting.await?, Some(lookup))
                }
            },
            None => (starting.await?, None),
        };
        if serve_catalog {
            actix::spawn(catalog_api::serve(node.clone(), transport, catalog_prefix));
        }
        match (&resp, loading) {
            (_, Some(lookup)) => lookup.started(node.clone()),
            (Some(resp), None) => {
                crate::resp::RespServer::start_with(resp, Arc::new(node.clone()), max_batch)
                    .await?;
            }
            (None, None) => {}
        }
        let signal = signals.recv().await;
        tracing::info!(signal, "shutting down: final snapshots, draining NATS");
        stop(node.stop_following(), nats, || node.stop_routing()).await
    })
}
