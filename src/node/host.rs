//! A node's filters: the replicas of the filters its configuration file lists (generation 0)
//! and of every filter of the filter catalog ([`crate::transport::catalog`]), started and
//! stopped as the catalog changes, without a restart.
//!
//! One task follows the catalog (one watcher, one JetStream consumer over NATS, whatever the
//! number of filters) and applies its changes, several filters at once but the changes of one
//! name in order. A create waits until this node hosts the new filter, a drop until it no
//! longer does; other nodes follow within their watcher's delay.
//!
//! What a drop guarantees: the replica stops, then its data directory
//! (`<data_dir>/<name>.g<generation>`) is moved aside into `<data_dir>/.dropped/`, kept for
//! `catalog.drop_retention_ms` (README, "Dropped filters"); a node that was down meanwhile
//! does so at its next start, if the catalog recorded the drop. Nothing else removes a
//! filter's data: a catalog that is absent, empty, unreachable or new is no drop, and a
//! directory the catalog does not know is offered back to it (its entry is kept in the
//! directory, [`ENTRY_FILE`]). A filter created again under the name is a new generation:
//! its envelopes, replica id claims and data directory are its own, and its replicas refuse
//! everything of the old one (`crpf_rejects_total{reason="generation"}`).
//!
//! Every filter of the node is one entry of its [`FilterTable`] (src/node/table.rs), in one
//! state, under one lock. The rest, by concern, each file importing toward the table:
//! `start` (the node's start and subscriptions), `following` (the catalog's changes applied),
//! `dirs` (data directories), `routing` (where a message for a filter goes), `held`
//! (requests waiting for their filter), `subscriptions` (the tasks that take them),
//! `service` (`$SRV`), `expiry` (`EXPIRE`), `parking` (idle replicas as data), `shared_id`
//! (the replica id the catalog filters share).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;
use tokio::sync::watch;

use super::NodeError;
use super::config::{ApiQueue, CatalogSection};
use super::foreign::ForeignNames;
use super::table::{self, Filter, FilterTable};
use crate::FilterSpec;
use crate::names::is_subject_name;
use crate::replica::{Parked, ReplicaConfig, ReplicaHandle, SharedId};
use crate::transport::digests::DigestBatcher;
use crate::transport::{Catalog, CatalogEntry, CatalogError, Created, Transport};
use crate::wire::AuthKeys;

mod dirs;
mod expiry;
mod following;
mod held;
mod parking;
mod restore;
mod routing;
mod service;
mod shared_id;
mod start;
mod subscriptions;

use dirs::incarnation_dir;
pub use dirs::{DROPPED_DIR, ENTRY_FILE};
use expiry::Expiries;
use held::Holds;
pub use parking::{PARKED_FILTERS, PARKED_MESSAGES, PARKED_QUERIES, PARKING};

/// Catalog changes applied at once (replica starts and stops in flight).
const PARALLEL_CHANGES: usize = 32;

/// Configured filters started at once as the node starts.
const PARALLEL_DECLARED_STARTS: usize = 256;

/// How long a create or drop waits for this node to start or stop the replica.
const HOSTING_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a create or drop was refused or did not complete.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HostError {
    /// The name is no subject name ([`crate::names`]): its key is over 1 KiB.
    #[error(
        "invalid key `{}`: a key is at most 1024 bytes (or the name is no key's subject name, crpf::names)",
        crate::names::display_key(.0).chars().take(40).chain("...".chars()).collect::<String>()
    )]
    InvalidName(String),
    /// The spec or the settings it makes are invalid.
    #[error("invalid filter: {0}")]
    InvalidSpec(String),
    /// The name belongs to a filter of this node's configuration file.
    #[error("filter `{0}` is declared in this node's configuration file: change it there")]
    Configured(String),
    /// `catalog.max_filters` reached.
    #[error("this node hosts {hosted} filters from the catalog, its limit (catalog.max_filters)")]
    TooManyFilters {
        /// Filters hosted.
        hosted: usize,
    },
    /// Larger than `catalog.max_filter_bytes`.
    #[error("a filter of {bytes} bytes exceeds catalog.max_filter_bytes = {max}")]
    TooLarge {
        /// Its initial size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The catalog is off on this node.
    #[error("the filter catalog is disabled on this node ([catalog] enabled = false)")]
    Disabled,
    /// The catalog refused or could not be reached.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The catalog took the change, but this node did not apply it in time (its replica
    /// could not start or stop; the node's log says why). The change stands.
    #[error(
        "filter `{name}` (generation {generation}) is in the catalog but was not {what} on this node within {HOSTING_TIMEOUT:?}"
    )]
    NotApplied {
        /// The filter.
        name: String,
        /// Its generation.
        generation: u64,
        /// "started" or "stopped".
        what: &'static str,
    },
}

impl HostError {
    /// A short, bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            HostError::InvalidName(_) => "invalid_name",
            HostError::InvalidSpec(_) => "invalid_spec",
            HostError::Configured(_) => "configured",
            HostError::TooManyFilters { .. } => "max_filters",
            HostError::TooLarge { .. } => "max_filter_bytes",
            HostError::Disabled => "disabled",
            HostError::Catalog(CatalogError::Exists { .. }) => "exists",
            HostError::Catalog(_) => "catalog",
            HostError::NotApplied { .. } => "not_applied",
        }
    }
}

/// The node's filters: replicas, parked ones as data ([`parking`]).
type Table = FilterTable<ReplicaHandle, Parked>;

impl table::Handle for ReplicaHandle {
    fn same(&self, other: &Self) -> bool {
        self.same_replica(other)
    }
}

/// What [`Node::set_expiry`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Expiry {
    /// The entry, with its new expiry.
    Set(CatalogEntry),
    /// The time was past: the filter was dropped.
    Dropped,
    /// No such filter.
    Missing,
}

/// What [`Node::filters`] lists of each filter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostedFilter {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: FilterSpec,
    /// Its generation (0: from the configuration file).
    pub generation: u64,
    /// Its replica is parked: idle (alone, or converged with its peers), its state kept by
    /// the node and its actor gone until something is for it (`catalog.park_after_ms`).
    pub parked: bool,
}

struct Inner {
    transport: Arc<dyn Transport>,
    catalog: Option<Arc<dyn Catalog>>,
    settings: CatalogSection,
    data_dir: Option<PathBuf>,
    auth_keys: Option<AuthKeys>,
    configured: HashSet<String>,
    /// Those under the catalog's prefix, whose requests their own subscriptions answer.
    configured_here: HashSet<String>,
    /// Configured filters under the node's shared id and the catalog's prefix
    /// ([`shared_id::declared_shares_id`]): the node's subscriptions answer their `$SRV`, their
    /// API subject without an operation and their own API subjects, as a catalog filter's.
    configured_routed: HashSet<String>,
    /// The settings of those in the node-wide series, the ones that may park (from the
    /// file, as the node started them): a parked one resumes with them.
    declared: HashMap<String, ReplicaConfig>,
    /// The catalog filters' `anti_entropy_interval_ms` and `peer_expiry_ms`, at whose
    /// spacing the node announces its parked replicas' digests.
    announce_timing: (u64, u64),
    /// Every filter of the node, in the state it is in ([`FilterTable`]): one lock.
    table: RwLock<Table>,
    /// The catalog as this node's watcher has seen it (what `list` answers without asking
    /// JetStream).
    view: RwLock<std::collections::BTreeMap<String, CatalogEntry>>,
    /// Bumped whenever the hosted filters change, for the creates and drops that wait on it.
    changes: watch::Sender<u64>,
    stopping: AtomicBool,
    /// The replica id the catalog filters share.
    shared_id: Option<Arc<SharedId>>,
    /// The catalog filters' subject prefix.
    prefix: String,
    /// The routers stop.
    routing_stopped: AtomicBool,
    /// The digests of its catalog filters, published in batches (with a catalog).
    digest_batches: Option<Arc<DigestBatcher>>,
    /// Names replicated by replicas outside the catalog (`api_queue = "node"`).
    foreign: std::sync::Mutex<ForeignNames>,
    /// The transport of the catalog filters' replication (set as the node subscribes it).
    replication: std::sync::OnceLock<Arc<dyn Transport>>,
    /// Requests waiting for their filter, and catalog reads for unknown names.
    holds: Holds,
    /// The expiries of hosted filters ([`expiry`]).
    expiries: Expiries,
    /// The node's tasks, stopped as it stops.
    tasks: Tasks,
    /// The arbiter the replicas run on: a parked one resumes there.
    arbiter: actix::ArbiterHandle,
    /// When each name may be offered back to the catalog next
    /// ([`following::REOFFER_INTERVAL`]);
    /// `None`: a later offer waits for that moment.
    reoffered: std::sync::Mutex<HashMap<String, Option<Instant>>>,
}

/// The node's tasks, each stopped at its moment as the node stops.
#[derive(Default)]
struct Tasks {
    /// The task renewing the shared id.
    renewals: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The tasks answering `$SRV` for the catalog filters ([`service::serve_services`]).
    services: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The tasks routing the catalog filters' subjects
    /// ([`subscriptions::serve_replica_apis`]): they go on while the node stops its replicas,
    /// as the replicas' own subscriptions did.
    routers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The task of the node's API subscription, stopped first when the node stops.
    api_router: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The task that parks idle replicas ([`parking`]).
    parking: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A running node's filters. Cheap to clone. Start it inside an actix System.
///
/// ```
/// use std::sync::Arc;
/// use crpf::node::{Node, NodeConfig};
/// use crpf::transport::InProcessBus;
/// use crpf::{FilterKind, FilterSpec};
///
/// #[actix::main]
/// async fn main() {
///     let bus = InProcessBus::new();
///     let cfg = NodeConfig::from_toml_str("[catalog]\n").unwrap();
///     let node = Node::start(cfg, Arc::new(bus.clone()), Some(Arc::new(bus.catalog())))
///         .await
///         .unwrap();
///     let spec = FilterSpec::new(FilterKind::GBloom, 1_000, 0.01);
///     let created = node.create_filter("tenant-7", spec).await.unwrap();
///     assert!(created.new && created.entry.generation > 0);
///     let filter = node.filter("tenant-7").unwrap();
///     filter.add(b"alice".to_vec()).await.unwrap();
///     assert!(filter.contains(b"alice"));
///     node.drop_filter("tenant-7").await.unwrap();
///     assert!(node.filter("tenant-7").is_none());
///     node.shutdown().await.unwrap();
/// }
/// ```
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("filters", &self.read().hosted_len())
            .finish()
    }
}

impl Node {
    /// Creates a filter in the catalog (every node of the cluster starts a replica) and
    /// returns once this node's replica serves it. Creating a filter that exists with an equal spec
    /// answers its entry (with [`Created::new`] false); with another spec,
    /// [`CatalogError::Exists`].
    pub async fn create_filter(&self, name: &str, spec: FilterSpec) -> Result<Created, HostError> {
        let catalog = self.inner.catalog.clone().ok_or(HostError::Disabled)?;
        self.check_create(name, &spec)?;
        let created = catalog.create(name.to_string(), spec).await?;
        let generation = created.entry.generation;
        let hosted = self
            .wait(HOSTING_TIMEOUT, |t| {
                t.hosted(name).is_some_and(|h| h.generation >= generation)
            })
            .await;
        // Hosted and serving: a request right after the answer finds the filter here.
        let serving = hosted
            && match self.hosted_replica(name) {
                Some(h) => h.wait_ready(HOSTING_TIMEOUT).await,
                None => false,
            };
        if !serving {
            return Err(HostError::NotApplied {
                name: name.into(),
                generation,
                what: "started",
            });
        }
        if created.new {
            tracing::info!(filter = name, generation, "filter created");
        }
        Ok(created)
    }

    /// Drops a filter from the catalog (every node stops its replica and removes its data)
    /// and returns once this node no longer hosts it: the entry dropped, `None` if there was
    /// none.
    pub async fn drop_filter(&self, name: &str) -> Result<Option<CatalogEntry>, HostError> {
        self.may_drop(name)?;
        let catalog = self.inner.catalog.clone().ok_or(HostError::Disabled)?;
        let Some(entry) = catalog.drop_filter(name.to_string()).await? else {
            return Ok(None);
        };
        let generation = entry.generation;
        let gone = self
            .wait(HOSTING_TIMEOUT, |t| {
                t.hosted(name).is_none_or(|h| h.generation > generation)
            })
            .await;
        if !gone {
            return Err(HostError::NotApplied {
                name: name.into(),
                generation,
                what: "stopped",
            });
        }
        tracing::info!(filter = name, generation, "filter dropped");
        Ok(Some(entry))
    }

    /// Sets (`Some`: ms since the UNIX epoch) or clears the expiry of filter `name` in the
    /// catalog (`EXPIRE`, `PERSIST`), and here at once; every node drops the filter at that
    /// time by its own clock. A time already past drops it now, as Redis deletes a key given
    /// one. The entry as updated (`None`: no such filter, or dropped by a past time: `Ok` of
    /// whether it existed is in [`Expiry`]).
    pub async fn set_expiry(&self, name: &str, at_ms: Option<u64>) -> Result<Expiry, HostError> {
        self.may_drop(name)?;
        let catalog = self.inner.catalog.clone().ok_or(HostError::Disabled)?;
        if at_ms.is_some_and(|at| at <= crate::transport::catalog::now_ms()) {
            return Ok(match self.drop_filter(name).await? {
                Some(_) => Expiry::Dropped,
                None => Expiry::Missing,
            });
        }
        let Some(entry) = catalog.set_expiry(name.to_string(), at_ms).await? else {
            return Ok(Expiry::Missing);
        };
        // Here at once (the watcher's copy follows): a `TTL` right after answers it.
        self.inner.expiry_changed(&entry).await;
        Ok(Expiry::Set(entry))
    }

    /// The expiry of filter `name` as this node has it: `None` if it does not host it,
    /// `Some(None)` if it has none.
    pub fn expiry(&self, name: &str) -> Option<Option<u64>> {
        self.read().hosted(name).map(|h| h.expires_ms)
    }

    /// Whether `name` may be dropped: not a filter of the configuration file, and the
    /// catalog on (a name that does not exist may be).
    pub fn may_drop(&self, name: &str) -> Result<(), HostError> {
        if self.inner.catalog.is_none() {
            return Err(HostError::Disabled);
        }
        if self.inner.configured.contains(name) {
            return Err(HostError::Configured(name.into()));
        }
        Ok(())
    }

    /// The catalog entry of `name`, as the catalog has it now.
    pub async fn filter_info(&self, name: &str) -> Result<Option<CatalogEntry>, HostError> {
        let catalog = self.inner.catalog.clone().ok_or(HostError::Disabled)?;
        Ok(catalog.get(name.to_string()).await?)
    }

    /// Every entry of the catalog, by name (what the whole cluster hosts), as this node's
    /// watcher has seen it: a change made elsewhere shows here within the watcher's delay.
    pub async fn catalog_entries(&self) -> Result<Vec<CatalogEntry>, HostError> {
        if self.inner.catalog.is_none() {
            return Err(HostError::Disabled);
        }
        Ok(self
            .inner
            .view
            .read()
            .expect("view lock")
            .values()
            .cloned()
            .collect())
    }

    /// Whether [`Node::shutdown`] was called.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// The replica of `name` this node hosts (resumed if it was parked). It stays awake from
    /// then on: the caller may hold the handle for good, and a parked replica's handle
    /// would refuse everything as stopped.
    pub fn filter(&self, name: &str) -> Option<ReplicaHandle> {
        self.inner.replica_pinned(name, true)
    }

    /// The replica of `name` this node hosts (resumed if it was parked), for a caller that
    /// uses the handle at once and lets it go (it may park later, when idle).
    pub(crate) fn hosted_replica(&self, name: &str) -> Option<ReplicaHandle> {
        self.inner.replica_pinned(name, false)
    }

    /// The answer of `request`, with the filter's kind, if `name`'s replica is parked and
    /// `request` is a query its kept state answers (which then resumes nothing).
    pub(crate) fn query_parked(
        &self,
        name: &str,
        request: &crate::api::Request,
    ) -> Option<crate::replica::ParkedAnswer> {
        self.inner.query_parked(name, request)
    }

    /// The spec of filter `name`, if this node hosts it.
    pub fn spec(&self, name: &str) -> Option<FilterSpec> {
        self.read().hosted(name).map(|h| h.spec.clone())
    }

    /// The filters this node hosts, by name.
    pub fn filters(&self) -> Vec<HostedFilter> {
        let mut all: Vec<HostedFilter> = self
            .read()
            .iter_hosted()
            .map(|(name, h, running)| HostedFilter {
                name: name.clone(),
                spec: h.spec.clone(),
                generation: h.generation,
                parked: running.is_none(),
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// How many filters this node hosts.
    pub fn len(&self) -> usize {
        self.read().hosted_len()
    }

    /// Whether it hosts none.
    pub fn is_empty(&self) -> bool {
        self.read().hosted_len() == 0
    }

    /// Stops following the catalog and stops every replica (each writes its final
    /// snapshot).
    pub async fn shutdown(&self) -> Result<(), NodeError> {
        super::stop(self.stop_following(), None, || self.stop_routing()).await
    }

    /// Stops following the catalog and hands over every replica, to be stopped.
    pub(crate) fn stop_following(&self) -> Vec<ReplicaHandle> {
        self.inner.stopping.store(true, Ordering::SeqCst);
        if let Some(r) = self
            .inner
            .tasks
            .renewals
            .lock()
            .expect("renewals lock")
            .take()
        {
            r.abort();
        }
        for t in self
            .inner
            .tasks
            .services
            .lock()
            .expect("services lock")
            .drain(..)
        {
            t.abort();
        }
        // Out of the queue group at once, so that the other nodes take the requests while
        // this one stops its replicas (the requests the subscription had taken and not
        // handed on yet are lost, as with a replica's own subscription at its stop).
        if let Some(t) = self
            .inner
            .tasks
            .api_router
            .lock()
            .expect("router lock")
            .take()
        {
            t.abort();
        }
        if let Some(t) = self
            .inner
            .tasks
            .parking
            .lock()
            .expect("parking lock")
            .take()
        {
            t.abort();
        }
        let stopped = {
            let inner = &self.inner;
            // Routed to until it stopped, as its own subscriptions answered (a kind with ids
            // of its own answers on its own subscriptions meanwhile).
            let refusing = |name: &str, h: &Filter| {
                !inner.configured.contains(name) && inner.routes_own_api(h.spec.kind)
            };
            inner.table.write().expect("table lock").stop_all(refusing)
        };
        // A parked replica has nothing to stop: its last snapshot is its final one.
        if stopped.parked > 0 {
            metrics::gauge!(PARKED_FILTERS).decrement(stopped.parked as f64);
        }
        stopped.running.into_iter().map(|(_, h)| h).collect()
    }

    /// Stops routing the catalog filters' subjects, once their replicas stopped.
    pub(crate) fn stop_routing(&self) {
        self.inner.routing_stopped.store(true, Ordering::SeqCst);
        self.inner
            .table
            .write()
            .expect("table lock")
            .routing_stopped();
        for t in self
            .inner
            .tasks
            .routers
            .lock()
            .expect("routers lock")
            .drain(..)
        {
            t.abort();
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.inner.table.read().expect("table lock")
    }

    /// Refusals that need no catalog: the name, the spec, this node's limits.
    fn check_create(&self, name: &str, spec: &FilterSpec) -> Result<(), HostError> {
        if !is_subject_name(name) {
            return Err(HostError::InvalidName(name.into()));
        }
        if self.inner.configured.contains(name) {
            return Err(HostError::Configured(name.into()));
        }
        self.inner
            .replica_config(name, spec.clone(), 1)
            .validate()
            .map_err(HostError::InvalidSpec)?;
        let bytes = spec
            .memory_bytes()
            .map_err(|e| HostError::InvalidSpec(e.to_string()))?;
        let max = self.inner.settings.max_filter_bytes;
        if bytes > max {
            return Err(HostError::TooLarge { bytes, max });
        }
        let table = self.read();
        let from_catalog = table.hosted_len() - self.inner.configured.len();
        if table.hosted(name).is_none() && from_catalog >= self.inner.settings.max_filters {
            return Err(HostError::TooManyFilters {
                hosted: from_catalog,
            });
        }
        Ok(())
    }

    /// Waits until `done` holds of the hosted filters; `false` at the deadline.
    async fn wait(&self, timeout: Duration, mut done: impl FnMut(&Table) -> bool) -> bool {
        let mut changes = self.inner.changes.subscribe();
        let waiting = async {
            loop {
                if done(&self.read()) {
                    return;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, waiting).await.is_ok()
    }
}

/// How often the node sets its own gauges again, changed or not: the exporter drops a
/// gauge not set for `GAUGE_IDLE_TIMEOUT` (5 minutes), and a cluster at rest changes
/// nothing, so `crpf_filters` and `crpf_parked_filters` vanished from its page (and an
/// increment after that counted from 0).
const NODE_GAUGES_REFRESH: Duration = Duration::from_secs(60);

/// Sets the node's gauges from its table every [`NODE_GAUGES_REFRESH`], until the node is
/// gone: `crpf_filters` (hosted) and `crpf_parked_filters` (counted, which also puts right
/// what increments and decrements may have missed).
async fn keep_gauges(inner: Weak<Inner>) {
    let mut every = tokio::time::interval(NODE_GAUGES_REFRESH);
    loop {
        every.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let (hosted, parked) = {
            let table = inner.table.read().expect("table lock");
            (table.hosted_len(), table.iter_parked().count())
        };
        metrics::gauge!(FILTERS).set(hosted as f64);
        metrics::gauge!(PARKED_FILTERS).set(parked as f64);
    }
}

impl Inner {
    /// The hosted filters changed: the creates and drops waiting are told.
    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
        let hosted = self.table.read().expect("table lock").hosted_len();
        metrics::gauge!(FILTERS).set(hosted as f64);
    }

    /// Whether the node routes the own API subjects of a catalog filter of `kind`: it
    /// replicates under the node's id (kinds that keep their own ids subscribe themselves).
    fn routes_own_api(&self, kind: crate::FilterKind) -> bool {
        self.shared_id.is_some() && kind.reuses_ids()
    }

    /// The replica configuration of a catalog filter's incarnation.
    fn replica_config(&self, name: &str, spec: FilterSpec, generation: u64) -> ReplicaConfig {
        let mut c = self.settings.defaults.replica_config(name, spec);
        c.generation = generation;
        c.aggregate_metrics = !self.settings.metrics_filters.iter().any(|f| f == name);
        c.auth_keys = self.auth_keys.clone();
        c.catalog_hosted = true;
        c.routed_replication = true;
        c.routed_api = self.settings.api_queue == ApiQueue::Node;
        c.data_dir = self
            .data_dir
            .as_ref()
            .map(|d| d.join(incarnation_dir(name, generation)));
        c
    }
}

/// Whether the node is gone, or `flag` of it is set.
fn stopped(inner: Weak<Inner>, flag: fn(&Inner) -> &AtomicBool) -> impl Fn() -> bool {
    move || {
        inner
            .upgrade()
            .is_none_or(|i| flag(&i).load(Ordering::SeqCst))
    }
}

/// Filters hosted (gauge).
pub const FILTERS: &str = "crpf_filters";
/// Catalog changes applied on this node, by `change` (started, stopped).
pub const CATALOG_CHANGES: &str = "crpf_catalog_changes_total";
/// Failures to follow the catalog, by `op` (watch, start).
pub const CATALOG_ERRORS: &str = "crpf_catalog_errors_total";

/// Requests of the node's API subscription (`api_queue = "node"`) not answered by their
/// replica at once, by `outcome`: `held` (waited for their filter to serve), `unknown`
/// (a name the catalog does not list: left unanswered, or refused as unknown in the minute
/// after its drop), `elsewhere` (heard replicating outside the catalog: left unanswered),
/// `undecided` (the catalog could not say, or too many were being looked up: left
/// unanswered), `refused` (a catalog filter not served here, or too many waiting: refused as
/// not serving).
pub const NODE_API_REQUESTS: &str = "crpf_node_api_requests_total";

/// Describes the node's catalog metrics.
pub(crate) fn describe() {
    parking::describe();
    metrics::describe_counter!(
        NODE_API_REQUESTS,
        "Requests of the node's API subscription not answered by their replica at once, by outcome (held, unknown, elsewhere, undecided, refused)"
    );
    metrics::describe_gauge!(
        FILTERS,
        "Filters this node hosts (configured and from the catalog)"
    );
    metrics::describe_counter!(
        CATALOG_CHANGES,
        "Filter catalog changes applied on this node, by change (started, stopped)"
    );
    metrics::describe_counter!(
        CATALOG_ERRORS,
        "Failures to follow the filter catalog, by op (watch, start)"
    );
    crate::transport::digests::describe();
}
