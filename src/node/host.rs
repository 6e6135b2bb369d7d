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

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Serialize;
use thiserror::Error;
use tokio::sync::{broadcast, watch};

use super::NodeError;
use super::config::{ApiQueue, CatalogSection, NodeConfig};
use super::foreign::{ForeignNames, Heard};
use super::table::{self, Filter, FilterTable, Found};
use crate::FilterSpec;
use crate::names::is_subject_name;
use crate::replica::{
    Identity, Parked, Replica, ReplicaConfig, ReplicaError, ReplicaHandle, SharedId, refusal,
};
use crate::transport::catalog::CatalogWatch;
use crate::transport::digests::{
    BATCHED_DIGESTS, DIGEST_BATCHES, DIGEST_BATCHES_REJECTED, DIGESTS_TOKEN, DigestBatcher,
    publish_digests,
};
use crate::transport::{
    Catalog, CatalogChange, CatalogEntry, CatalogError, Created, Message, MessageStream, Subjects,
    Transport, TransportEvent, confirm_subscriptions, event_stream, serve_subscription,
    subscribe_now,
};
use crate::wire::AuthKeys;
use crate::wire::batch::decode_batch;

mod parking;
pub use parking::{PARKED_FILTERS, PARKING};

/// Catalog changes applied at once (replica starts and stops in flight).
const PARALLEL_CHANGES: usize = 32;

/// Configured filters started at once as the node starts.
const PARALLEL_DECLARED_STARTS: usize = 256;

/// How long a create or drop waits for this node to start or stop the replica.
const HOSTING_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a request the node's API subscription took for a catalog filter it does not
/// serve yet (created a moment ago, or still catching up) waits for it; then it is refused
/// as not serving. Shorter than a client's usual timeout, so that the refusal is heard.
const API_HOLD: Duration = Duration::from_secs(3);

/// Catalog reads in flight for requests on own API subjects
/// (`<prefix>.<filter>.replica.<node id>.api...`) to names the node does not know; a request
/// beyond them is left unanswered, as one for a name the catalog does not list.
const OWN_API_LOOKUPS: usize = 16;

/// Requests waiting so at most; more are refused as not serving at once.
const MAX_HELD_REQUESTS: usize = 10_000;

/// Catalog reads in flight for requests to names the node does not know; a request beyond
/// them is left unanswered, as one for a name the catalog does not list.
const API_LOOKUPS: usize = 64;

/// How long after the watcher saw a catalog filter dropped the node refuses its name as
/// unknown on the request API's queue group: a client still asking hears of the drop at once.
/// Later the name is any name the catalog does not list, left unanswered: a responder outside
/// the catalog may have taken it.
const DROPPED_REFUSAL: Duration = Duration::from_secs(60);

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

/// Where [`Inner::target`] found the replica of a name.
enum Target {
    /// Hosted and running (resumed if it was parked).
    Live(ReplicaHandle),
    /// Starting; whether the node routes its own API subjects.
    Starting(ReplicaHandle, bool),
    /// Dropped a moment ago: it refuses requests.
    Dropping(ReplicaHandle),
    /// Stopping with the node; whether it takes its own API subjects' requests.
    Stopping(ReplicaHandle, bool),
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
    /// Its replica is parked: idle and alone, its state kept by the node and its actor gone
    /// until something is for it (`catalog.park_after_ms`).
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
    /// ([`Inner::declared_shares_id`]): the node's subscriptions answer their `$SRV`, their
    /// API subject without an operation and their own API subjects, as a catalog filter's.
    configured_routed: HashSet<String>,
    /// Every filter of the node, in the state it is in ([`FilterTable`]): one lock.
    table: RwLock<Table>,
    /// The catalog as this node's watcher has seen it (what `list` answers without asking
    /// JetStream).
    view: RwLock<std::collections::BTreeMap<String, CatalogEntry>>,
    /// Bumped whenever the hosted filters change, for the creates and drops that wait on it.
    changes: watch::Sender<u64>,
    stopping: AtomicBool,
    /// The replica id the catalog filters share, and the task renewing it.
    shared_id: Option<Arc<SharedId>>,
    renewals: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The tasks answering `$SRV` for the catalog filters ([`serve_services`]).
    services: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The catalog filters' subject prefix.
    prefix: String,
    /// The tasks routing the catalog filters' subjects ([`serve_replica_apis`]): they go on
    /// while the node stops its replicas, as the replicas' own subscriptions did.
    routers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The routers stop.
    routing_stopped: AtomicBool,
    /// The digests of its catalog filters, published in batches (with a catalog).
    digest_batches: Option<Arc<DigestBatcher>>,
    /// Names replicated by replicas outside the catalog (`api_queue = "node"`).
    foreign: std::sync::Mutex<ForeignNames>,
    /// Requests of the node's API subscription waiting for their filter ([`API_HOLD`]).
    held: AtomicUsize,
    /// Catalog reads for requests to unknown names ([`API_LOOKUPS`]).
    lookups: Arc<tokio::sync::Semaphore>,
    /// The same for requests on own API subjects ([`OWN_API_LOOKUPS`]): a flood of those
    /// does not take the queue group's.
    own_lookups: Arc<tokio::sync::Semaphore>,
    /// The task of the node's API subscription, stopped first when the node stops.
    api_router: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The transport of the catalog filters' replication (set as the node subscribes it).
    replication: std::sync::OnceLock<Arc<dyn Transport>>,
    /// The arbiter the replicas run on: a parked one resumes there.
    arbiter: actix::ArbiterHandle,
    /// The task that parks idle replicas ([`parking`]).
    parking: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When each name may be offered back to the catalog next ([`REOFFER_INTERVAL`]);
    /// `None`: a later offer waits for that moment.
    reoffered: std::sync::Mutex<HashMap<String, Option<Instant>>>,
    /// The expiries of hosted filters, by time: (ms since the epoch, name, generation). An
    /// item left behind (the filter dropped, its expiry moved or cleared) does nothing: the
    /// catalog drops only the generation named, and only once its own entry has expired.
    expiries: std::sync::Mutex<std::collections::BTreeSet<(u64, String, u64)>>,
    /// Wakes [`expire_due`] for an expiry noted (it sleeps until the earliest one).
    expiry_noted: Arc<tokio::sync::Notify>,
}

/// How late a node may look for filters whose expiry has come (`EXPIRE`): it sleeps until
/// the earliest expiry it knows (woken by a new one), at most this long.
const EXPIRY_TICK: Duration = Duration::from_secs(1);

/// A name is offered back to the catalog at most this often: two nodes with different keys
/// hosting one filter each take the other's entry for one to replace, and would otherwise
/// write over each other without end.
const REOFFER_INTERVAL: Duration = Duration::from_secs(2);

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
    /// Starts the configured filters, removes the data directories of catalog filters dropped
    /// while the node was down, and follows `catalog` (none, or `[catalog] enabled = false`:
    /// the configured filters only). Returns once the filters the catalog lists now are
    /// hosted (or after 60 s, with a warning).
    pub async fn start(
        cfg: NodeConfig,
        transport: Arc<dyn Transport>,
        catalog: Option<Arc<dyn Catalog>>,
    ) -> Result<Node, NodeError> {
        // Before the first replica starts its log. The pool is one per process: a second node
        // in the same process (tests) asking for another size keeps the running one.
        if let Err(e) = crate::replica::wal::WalPool::configure_global(cfg.node.wal_threads) {
            tracing::warn!(error = %e, "node.wal_threads not applied");
        }
        // Sealed with the cluster key: only its holders create or drop filters.
        let catalog = catalog
            .filter(|_| cfg.catalog.enabled)
            .map(|c| c.sealed_with(cfg.auth_keys.clone()));
        let with_catalog = catalog.is_some();
        let template = lease_template(&cfg.catalog);
        let (shared_id, renewals) = match &catalog {
            Some(_) => {
                let id = claim_node_id(cfg.node.data_dir.as_deref(), &transport, &template).await?;
                let renewals = id.spawn_renewals(
                    transport.clone(),
                    ReplicaConfig::ms(template.id_lease_renew_ms),
                    ReplicaConfig::ms(template.retire_after_ms),
                );
                (Some(id), Some(renewals))
            }
            None => (None, None),
        };
        let inner = Arc::new(Inner {
            transport,
            catalog,
            configured: cfg.filters.iter().map(|f| f.name.clone()).collect(),
            configured_here: cfg
                .filters
                .iter()
                .filter(|f| f.prefix == template.prefix)
                .map(|f| f.name.clone())
                .collect(),
            configured_routed: cfg
                .filters
                .iter()
                .filter(|f| {
                    f.prefix == template.prefix
                        && declared_shares_id(shared_id.is_some(), f.filter.kind)
                })
                .map(|f| f.name.clone())
                .collect(),
            settings: cfg.catalog,
            data_dir: cfg.node.data_dir,
            auth_keys: cfg.auth_keys,
            table: RwLock::new(Table::default()),
            view: RwLock::new(Default::default()),
            changes: watch::channel(0).0,
            stopping: AtomicBool::new(false),
            shared_id,
            renewals: std::sync::Mutex::new(renewals),
            services: Default::default(),
            prefix: template.prefix,
            routers: Default::default(),
            routing_stopped: AtomicBool::new(false),
            digest_batches: with_catalog.then(Default::default),
            foreign: Default::default(),
            held: AtomicUsize::new(0),
            lookups: Arc::new(tokio::sync::Semaphore::new(API_LOOKUPS)),
            own_lookups: Arc::new(tokio::sync::Semaphore::new(OWN_API_LOOKUPS)),
            api_router: Default::default(),
            replication: Default::default(),
            arbiter: actix::Arbiter::current(),
            parking: Default::default(),
            reoffered: Default::default(),
            expiries: Default::default(),
            expiry_noted: Default::default(),
        });
        if inner.catalog.is_some() {
            // Subscribed, and confirmed by the server, before any catalog filter is ready: a
            // ready filter's instance answers `$SRV` (README, "ready").
            // So are the catalog filters' subjects the node routes (a ready filter answers
            // them): the request API's without an operation, and their own.
            let mut subjects: Vec<_> = SERVICE_SUBJECTS
                .iter()
                .map(|s| (s.to_string(), Routed::Service))
                .collect();
            let all = Subjects::new(&inner.prefix, "*");
            subjects.push((all.api_root.clone(), Routed::ApiRoot));
            if let Some(id) = &inner.shared_id {
                let own = all.replica_api_subscriptions(id.identity().replica);
                subjects.extend(own.map(|s| (s, Routed::OwnApi)));
            }
            let mut streams = Vec::with_capacity(subjects.len());
            for (subject, routed) in subjects {
                let stream = subscribe_now(&inner.transport, &subject, None).await;
                streams.push((subject, stream, routed));
            }
            // Replication of the catalog filters: one subscription for all of them, on the
            // connection their replicas publish on (no echo where the transport can).
            let replication = inner
                .transport
                .replication_transport()
                .await?
                .unwrap_or_else(|| inner.transport.clone());
            let _ = inner.replication.set(replication.clone());
            // Before any replica starts, so that none misses an event.
            let events = forward_events(Arc::downgrade(&inner), inner.transport.events());
            let replication_subject = Subjects::new(&inner.prefix, "*").replication;
            let replication_stream = subscribe_now(&replication, &replication_subject, None).await;
            // The digests of other nodes' catalog filters, in batches.
            let digests_subject = format!("{}.{DIGESTS_TOKEN}", inner.prefix);
            let digests_stream = subscribe_now(&replication, &digests_subject, None).await;
            for transport in [&inner.transport, &replication] {
                if let Err(e) = confirm_subscriptions(transport).await {
                    tracing::warn!(error = %e, "the node's subscriptions were not confirmed");
                }
            }
            let task = serve_routed(
                Arc::downgrade(&inner),
                replication.clone(),
                replication_subject,
                replication_stream,
                Inner::route_replication,
            );
            let publishing = publish_digests(
                inner
                    .digest_batches
                    .clone()
                    .expect("a batcher with a catalog"),
                replication.clone(),
                digests_subject.clone(),
                stopped(Arc::downgrade(&inner), |i| &i.routing_stopped),
            );
            let receiving = serve_routed(
                Arc::downgrade(&inner),
                replication,
                digests_subject,
                digests_stream,
                |inner, msg| inner.route_digest_batch(&msg.payload),
            );
            inner.routers.lock().expect("routers lock").extend([
                tokio::spawn(events),
                tokio::spawn(task),
                tokio::spawn(publishing),
                tokio::spawn(receiving),
            ]);
            for (subject, stream, routed) in streams {
                let (weak, transport) = (Arc::downgrade(&inner), inner.transport.clone());
                match routed {
                    Routed::Service => {
                        let task = serve_services(weak, transport, subject, stream);
                        inner
                            .services
                            .lock()
                            .expect("services lock")
                            .push(tokio::spawn(task));
                    }
                    routed => {
                        let task = serve_replica_apis(weak, transport, subject, stream, routed);
                        inner
                            .routers
                            .lock()
                            .expect("routers lock")
                            .push(tokio::spawn(task));
                    }
                }
            }
        }
        let node = Node { inner };
        // Many at once: each start waited for its own round trips (an id claim and its
        // renewal, subscriptions), and 10,000 configured filters took 104 s one after another.
        let starts = cfg.filters.into_iter().map(|mut f| {
            let inner = &node.inner;
            let spec = f.filter.clone();
            // With a catalog, the node's replication subscription covers the configured
            // filters under its prefix too: their own would take every message twice.
            f.routed_replication = inner.catalog.is_some() && f.prefix == inner.prefix;
            let shared_id = inner
                .shared_id
                .clone()
                .filter(|_| declared_shares_id(true, f.filter.kind));
            // Under the node's id and prefix the node's subscriptions serve its `$SRV` and
            // its API subjects but the queue group's, which stays its filter's.
            let routed = inner.configured_routed.contains(&f.name);
            f.catalog_hosted = routed;
            // Its digests go alone: a replica outside any node may share its name.
            let entry = CatalogEntry {
                name: f.name.clone(),
                spec,
                generation: 0,
                created_ms: 0,
                replaces: None,
                expires_ms: None,
            };
            async move {
                let handle = inner
                    .start_replica(f, shared_id, None, routed, entry)
                    .await?;
                let id = handle.identity();
                tracing::info!(filter = handle.name(), replica = id.replica, uuid = %id.uuid, "replica started");
                Ok::<_, NodeError>(())
            }
        });
        {
            let mut starts =
                futures::stream::iter(starts).buffer_unordered(PARALLEL_DECLARED_STARTS);
            while let Some(started) = starts.next().await {
                started?;
            }
        }
        if let Some(catalog) = node.inner.catalog.clone() {
            node.inner.purge_dropped_dirs();
            // The watch the node follows the catalog with lists it first: one consumer.
            let (listing, first) = list_and_watch(&catalog).await;
            let listed = match listing {
                Ok(listing) => {
                    let mut listed = listing.live.clone();
                    listed.extend(node.inner.reconcile_dirs(&catalog, &listing).await);
                    listed.sort_by(|a, b| a.name.cmp(&b.name));
                    *node.inner.view.write().expect("view lock") =
                        listed.iter().map(|e| (e.name.clone(), e.clone())).collect();
                    listed
                }
                Err(e) => {
                    // No drop can be told from an unreachable catalog: every directory stays.
                    tracing::warn!(error = %e, "filter catalog unavailable at start: following it once it answers");
                    Vec::new()
                }
            };
            actix::spawn(follow(node.inner.clone(), catalog, first));
            actix::spawn(expire_due(Arc::downgrade(&node.inner)));
            // A cursor over the listing, not a pass over all of it at each change: with
            // 100,000 filters those passes made the start quadratic (49 s instead of ~4).
            let mut started = 0;
            let all_hosted = |t: &Table| {
                started += listed[started..]
                    .iter()
                    .take_while(|e| {
                        node.inner.configured.contains(&e.name)
                            || t.hosted(&e.name)
                                .is_some_and(|h| h.generation >= e.generation)
                    })
                    .count();
                started == listed.len()
            };
            if !node.wait(Duration::from_secs(60), all_hosted).await {
                tracing::warn!(
                    filters = listed.len(),
                    "not every filter of the catalog started within 60 s; going on"
                );
            }
            if node.inner.settings.api_queue == ApiQueue::Node {
                // Once its filters are hosted, not before: until then the other nodes of
                // the group take the requests.
                let (subject, queue) = Subjects::node_api(&node.inner.prefix);
                let transport = &node.inner.transport;
                let stream = subscribe_now(transport, &subject, Some(queue.clone())).await;
                if let Err(e) = confirm_subscriptions(transport).await {
                    tracing::warn!(error = %e, "the node's API subscription was not confirmed");
                }
                let task = serve_node_api(
                    Arc::downgrade(&node.inner),
                    transport.clone(),
                    (subject, queue),
                    stream,
                );
                let mut router = node.inner.api_router.lock().expect("router lock");
                *router = Some(tokio::spawn(task));
            }
            tracing::info!(filters = listed.len(), "filter catalog followed");
            let park_after = node.inner.settings.park_after_ms;
            if park_after > 0 {
                let every =
                    Duration::from_millis((park_after / u64::from(parking::IDLE_LOOKS)).max(1));
                let task = parking::park_idle(Arc::downgrade(&node.inner), every);
                *node.inner.parking.lock().expect("parking lock") = Some(tokio::spawn(task));
            }
        }
        Ok(node)
    }

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

    /// Runs `f` on the replica of filter `name`, if this node hosts it, under the lock of the
    /// node's filters (a lookup without a copy of the handle; `f` must be brief). A parked
    /// replica is resumed first.
    pub(crate) fn with_hosted<R>(
        &self,
        name: &str,
        f: impl FnOnce(&ReplicaHandle) -> R,
    ) -> Option<R> {
        {
            let table = self.read();
            if let Some(handle) = table.use_hosted(name, false)? {
                return Some(f(handle));
            }
        }
        self.inner.resume(name).map(|handle| f(&handle))
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
        if let Some(r) = self.inner.renewals.lock().expect("renewals lock").take() {
            r.abort();
        }
        for t in self.inner.services.lock().expect("services lock").drain(..) {
            t.abort();
        }
        // Out of the queue group at once, so that the other nodes take the requests while
        // this one stops its replicas (the requests the subscription had taken and not
        // handed on yet are lost, as with a replica's own subscription at its stop).
        if let Some(t) = self.inner.api_router.lock().expect("router lock").take() {
            t.abort();
        }
        if let Some(t) = self.inner.parking.lock().expect("parking lock").take() {
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
        for t in self.inner.routers.lock().expect("routers lock").drain(..) {
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

/// Whether `entry` was created after the drop of `generation` of its name (so that
/// generation is gone for good).
fn follows_drop_of(entry: &CatalogEntry, generation: u64) -> bool {
    entry.generation > generation && entry.replaces.is_some_and(|r| r >= generation)
}

/// The `filter` label of the catalog's own rejects.
const CATALOG_LABEL: &str = "_catalog";

/// Subject names longer than this get a hashed data directory ([`incarnation_dir`]): a
/// directory entry is at most 255 bytes on most file systems, and the generation (and, in
/// [`DROPPED_DIR`], the time of the drop) follow the name.
const LONGEST_DIR_NAME: usize = 160;

/// The start of a hashed data directory's name (never a subject name's: those start with
/// `_k` or no `_`).
const HASHED_DIR: &str = "_h";

/// `<name>.g<generation>`: the data directory of a catalog filter's incarnation; for a name
/// over [`LONGEST_DIR_NAME`] bytes, `_h<SHA-256 of the name, hex>.g<generation>` (its
/// [`ENTRY_FILE`] names the filter).
fn incarnation_dir(name: &str, generation: u64) -> String {
    if name.len() <= LONGEST_DIR_NAME {
        return format!("{name}.g{generation}");
    }
    use sha2::Digest;
    let hash = sha2::Sha256::digest(name.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASHED_DIR}{hex}.g{generation}")
}

/// The name (or, for a hashed directory, its `_h<hash>` stem) and the generation of an
/// incarnation's data directory.
fn parse_incarnation_dir(dir: &str) -> Option<(&str, u64)> {
    let (name, generation) = dir.rsplit_once(".g")?;
    let generation = generation.parse().ok()?;
    let hashed = name
        .strip_prefix(HASHED_DIR)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    ((is_subject_name(name) || hashed) && generation > 0).then_some((name, generation))
}

/// The filter of incarnation directory `dir` (`<base>/<dir>`), named `stem` and
/// `generation` by [`parse_incarnation_dir`]: the stem, or the name of a hashed
/// directory's entry file.
fn incarnation_name(base: &Path, dir: &str, stem: &str, generation: u64) -> Option<String> {
    if !stem.starts_with(HASHED_DIR) {
        return Some(stem.to_string());
    }
    let bytes = std::fs::read(base.join(dir).join(ENTRY_FILE)).ok()?;
    let entry: CatalogEntry = serde_json::from_slice(&bytes).ok()?;
    (incarnation_dir(&entry.name, generation) == dir).then_some(entry.name)
}

/// Whether a configured filter of `kind` takes the node's shared id (with one, `shared`)
/// instead of claiming and renewing one of its own (two JetStream requests per filter every
/// `id_lease_renew_ms`, and two more at its start: 10,000 configured filters kept
/// nats-server 75% busy). Only kinds without tags, whose replicas issue nothing under their
/// id that another replica of the filter must never issue again: a replica outside any node
/// (or on a node without a catalog) claims in the filter's own namespace, whose ids may equal
/// the node's (see [`SharedId`]), and tags issued twice would lose elements. Kinds whose ids
/// serve one run only (`counting_cuckoo`) keep their own as everywhere.
fn declared_shares_id(shared: bool, kind: crate::FilterKind) -> bool {
    shared && kind.reuses_ids() && !kind.tagged()
}

/// The settings of the node's shared id: the catalog's replica defaults.
fn lease_template(settings: &CatalogSection) -> ReplicaConfig {
    let spec = FilterSpec::new(crate::FilterKind::GBloom, 1_000, 0.01);
    settings.defaults.replica_config("_node", spec)
}

/// The file of a node's data directory that keeps its uuid and shared replica id, so that a
/// restart takes the id back (above its own reservation) instead of leaving one to retire.
const NODE_ID_FILE: &str = "node-id.json";

/// Claims the node's shared id (see [`SharedId`]): the one its data directory names, if any.
async fn claim_node_id(
    data_dir: Option<&Path>,
    transport: &Arc<dyn Transport>,
    template: &ReplicaConfig,
) -> Result<Arc<SharedId>, NodeError> {
    let path = data_dir.map(|d| d.join(NODE_ID_FILE));
    let known: Option<Identity> = match &path {
        Some(p) => match std::fs::read(p) {
            Ok(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                NodeError::Failed(format!("{}: not a node identity: {e}", p.display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    let uuid = known.map_or_else(uuid::Uuid::new_v4, |k| k.uuid);
    let id = SharedId::claim(
        transport,
        uuid,
        known.map(|k| k.replica),
        template.id_lease_block,
    )
    .await?;
    if let Some(dir) = data_dir {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_vec(&id.identity()).expect("an identity encodes");
        crate::replica::durable::write_atomically(dir, NODE_ID_FILE, &json)?;
    }
    tracing::info!(
        replica = id.identity().replica, uuid = %uuid, floor = id.floor(),
        "claimed the node's replica id for its catalog filters"
    );
    Ok(id)
}

/// The file of a catalog filter's data directory that keeps its catalog entry, so that the
/// node can offer the filter back to a catalog that lost it (or, without NATS, to the
/// in-process catalog of its next start).
pub const ENTRY_FILE: &str = "catalog-entry.json";

/// The folder of `node.data_dir` where dropped filters' directories are kept
/// (`<name>.g<generation>.<dropped at, ms since the epoch>`) for `catalog.drop_retention_ms`.
/// A dot: no filter name has one.
pub const DROPPED_DIR: &str = ".dropped";

/// Records `entry` in its incarnation's data directory ([`ENTRY_FILE`]).
fn write_entry_file(dir: &Path, entry: &CatalogEntry) -> Result<(), crate::replica::DurableError> {
    let json = serde_json::to_vec_pretty(entry).expect("a catalog entry encodes");
    crate::replica::durable::write_atomically(dir, ENTRY_FILE, &json)
}

/// The entry recorded in an incarnation's data directory, if it is there and is its own.
fn read_entry_file(dir: &Path, name: &str, generation: u64) -> Option<CatalogEntry> {
    let bytes = std::fs::read(dir.join(ENTRY_FILE)).ok()?;
    let entry: CatalogEntry = serde_json::from_slice(&bytes).ok()?;
    (entry.name == name && entry.generation == generation).then_some(entry)
}

/// Moves a dropped filter's data directory `<base>/<dir>` aside into [`DROPPED_DIR`].
fn move_aside(base: &Path, dir: &str, why: &str) {
    let from = base.join(dir);
    if !from.exists() {
        return;
    }
    let kept = base.join(DROPPED_DIR);
    let to = kept.join(format!("{dir}.{}", crate::transport::catalog::now_ms()));
    let moved = std::fs::create_dir_all(&kept)
        .and_then(|()| std::fs::rename(&from, &to))
        .and_then(|()| crate::replica::group_sync::sync(&kept))
        .and_then(|()| crate::replica::group_sync::sync(base));
    match moved {
        Ok(()) => {
            tracing::info!(from = %from.display(), to = %to.display(), why, "moved a dropped filter's data aside")
        }
        Err(e) => {
            tracing::warn!(dir = %from.display(), error = %e, "could not move a dropped filter's data aside")
        }
    }
}

/// The incarnation directory and the time of the drop of an entry of [`DROPPED_DIR`].
fn parse_dropped_dir(entry: &str) -> Option<(&str, u64)> {
    let (dir, at) = entry.rsplit_once('.')?;
    parse_incarnation_dir(dir)?;
    Some((dir, at.parse().ok()?))
}

impl Inner {
    /// Removes the dropped filters' directories kept longer than `catalog.drop_retention_ms`.
    fn purge_dropped_dirs(&self) {
        let Some(base) = &self.data_dir else {
            return;
        };
        let Ok(kept) = std::fs::read_dir(base.join(DROPPED_DIR)) else {
            return;
        };
        let now = crate::transport::catalog::now_ms();
        for d in kept.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let Some((_, at)) = parse_dropped_dir(&name) else {
                continue;
            };
            if now.saturating_sub(at) < self.settings.drop_retention_ms {
                continue;
            }
            match std::fs::remove_dir_all(d.path()) {
                Ok(()) => {
                    tracing::info!(dir = %d.path().display(), "removed a dropped filter's data after its retention")
                }
                Err(e) => {
                    tracing::warn!(dir = %d.path().display(), error = %e, "could not remove a dropped filter's kept data")
                }
            }
        }
    }

    /// Matches the catalog filters' data directories with the catalog at the start: a
    /// directory whose drop the catalog recorded (its generation dropped, or replaced by a
    /// create that followed that drop) is moved aside; one the catalog does not know is
    /// offered back to it with the entry kept in it. Answers the entries offered back, to be
    /// hosted as the listed ones are.
    async fn reconcile_dirs(
        &self,
        catalog: &Arc<dyn Catalog>,
        listing: &crate::transport::Listing,
    ) -> Vec<CatalogEntry> {
        let Some(base) = self.data_dir.clone() else {
            return Vec::new();
        };
        let Ok(dirs) = std::fs::read_dir(&base) else {
            return Vec::new();
        };
        let live: HashMap<&str, &CatalogEntry> =
            listing.live.iter().map(|e| (e.name.as_str(), e)).collect();
        let mut unknown = Vec::new();
        for d in dirs.flatten() {
            let dir = d.file_name().to_string_lossy().into_owned();
            let Some((stem, generation)) = parse_incarnation_dir(&dir) else {
                continue;
            };
            let Some(name) = incarnation_name(&base, &dir, stem, generation) else {
                tracing::warn!(
                    dir = %d.path().display(),
                    "a hashed filter directory without its entry: kept, not hosted"
                );
                continue;
            };
            let name = name.as_str();
            if self.configured.contains(name) {
                continue;
            }
            match live.get(name) {
                Some(e) if e.generation == generation => continue,
                Some(e) if follows_drop_of(e, generation) => {
                    move_aside(&base, &dir, "dropped while this node was down");
                    continue;
                }
                _ => {}
            }
            if listing.dropped.get(name).is_some_and(|&g| g >= generation) {
                move_aside(&base, &dir, "dropped while this node was down");
                continue;
            }
            match read_entry_file(&d.path(), name, generation) {
                Some(entry) => unknown.push((dir, entry)),
                None => tracing::warn!(
                    dir = %d.path().display(),
                    "the catalog does not list this filter and its directory has no entry to offer back: kept, not hosted"
                ),
            }
        }
        let offers = unknown.into_iter().map(|(dir, entry)| {
            let catalog = catalog.clone();
            async move { (dir, entry.clone(), catalog.reoffer(entry).await) }
        });
        let mut offers = futures::stream::iter(offers).buffer_unordered(PARALLEL_CHANGES);
        let mut restored = Vec::new();
        while let Some((dir, entry, answer)) = offers.next().await {
            match answer {
                Ok(crate::transport::Reoffered::Restored) => {
                    metrics::counter!(CATALOG_CHANGES, "change" => "offered_back").increment(1);
                    tracing::info!(
                        filter = entry.name,
                        generation = entry.generation,
                        "offered a filter the catalog did not list back to it"
                    );
                    restored.push(entry);
                }
                Ok(crate::transport::Reoffered::Dropped(_)) => {
                    move_aside(&base, &dir, "dropped while this node was down");
                }
                Ok(crate::transport::Reoffered::Listed(e))
                    if follows_drop_of(&e, entry.generation) =>
                {
                    move_aside(&base, &dir, "dropped while this node was down");
                }
                Ok(crate::transport::Reoffered::Listed(e)) => {
                    if e.generation != entry.generation {
                        tracing::warn!(
                            filter = entry.name,
                            kept = entry.generation,
                            listed = e.generation,
                            "the catalog lists another incarnation of a filter this node has data of: kept, not hosted"
                        );
                    } else {
                        restored.push(e);
                    }
                }
                Err(e) => {
                    tracing::warn!(filter = entry.name, error = %e, "could not offer a filter back to the catalog: its data is kept");
                }
            }
        }
        restored
    }

    /// Offers the hosted filter `name` back to the catalog (which lost it, or holds a record
    /// of it nobody may act on); unhosts it if the catalog recorded its drop.
    async fn reoffer_hosted(self: &Arc<Self>, name: &str) {
        let Some(catalog) = self.catalog.clone() else {
            return;
        };
        let Some(entry) = self
            .table
            .read()
            .expect("table lock")
            .hosted(name)
            .filter(|_| !self.configured.contains(name))
            .map(|h| h.entry(name))
        else {
            return;
        };
        {
            // Offered a moment ago: once more when the interval is over (one such wait per
            // name), so that the last word is this node's whatever was written meanwhile.
            let mut next = self.reoffered.lock().expect("reoffered lock");
            let now = Instant::now();
            match next.get(name).copied() {
                Some(Some(at)) if at > now => {
                    next.insert(name.to_string(), None);
                    tokio::spawn(Self::reoffer_later(
                        Arc::downgrade(self),
                        name.to_string(),
                        at - now,
                    ));
                    return;
                }
                // Already waiting.
                Some(None) => return,
                _ => {}
            }
            next.retain(|_, at| at.is_none_or(|at| at > now));
            next.insert(name.to_string(), Some(now + REOFFER_INTERVAL));
        }
        match catalog.reoffer(entry.clone()).await {
            Ok(crate::transport::Reoffered::Restored) => {
                metrics::counter!(CATALOG_CHANGES, "change" => "offered_back").increment(1);
                tracing::warn!(
                    filter = name,
                    generation = entry.generation,
                    "the catalog had lost a filter this node hosts: offered it back"
                );
            }
            Ok(crate::transport::Reoffered::Dropped(generation)) => {
                self.unhost_generation(name, Some(generation)).await;
            }
            Ok(crate::transport::Reoffered::Listed(_)) => {}
            Err(e) => {
                metrics::counter!(CATALOG_ERRORS, "op" => "offer_back").increment(1);
                tracing::warn!(filter = name, error = %e, "could not offer a hosted filter back to the catalog");
            }
        }
    }

    /// [`Inner::reoffer_hosted`] after `delay` (boxed: the two call each other).
    fn reoffer_later(
        inner: Weak<Self>,
        name: String,
        delay: Duration,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if let Some(inner) = inner.upgrade() {
                inner
                    .reoffered
                    .lock()
                    .expect("reoffered lock")
                    .remove(&name);
                inner.reoffer_hosted(&name).await;
            }
        })
    }

    /// Counts a catalog record this node does not act on, and offers back what it hosts
    /// under that name.
    async fn rejected(self: &Arc<Self>, name: &str, reason: &'static str) {
        let replica = self
            .shared_id
            .as_ref()
            .map_or(String::new(), |id| id.identity().replica.to_string());
        metrics::counter!(crate::replica::metrics::REJECTS, "filter" => CATALOG_LABEL, "replica" => replica, "reason" => reason)
            .increment(1);
        tracing::warn!(
            filter = name,
            reason,
            "ignored a catalog record that does not carry the cluster key's seal"
        );
        self.reoffer_hosted(name).await;
    }

    /// Refuses a request for `name`, which the watcher saw dropped, as for an unknown filter
    /// (and counts it so, wherever the route found the drop).
    fn refuse_dropped(&self, name: String, msg: Message) -> ApiRoute {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
        let unknown = ReplicaError::UnknownFilter(name);
        ApiRoute::answer(self.refuse(msg, &unknown))
    }

    /// Keeps this node's view of the catalog.
    fn saw(&self, change: &CatalogChange) {
        let mut view = self.view.write().expect("view lock");
        match change {
            CatalogChange::Put(e) => {
                view.insert(e.name.clone(), e.clone());
                self.foreign.lock().expect("foreign lock").listed(&e.name);
            }
            CatalogChange::Dropped { name, generation } => {
                if view
                    .get(name)
                    .is_some_and(|e| generation.is_none_or(|g| e.generation <= g))
                {
                    view.remove(name);
                }
                let mut foreign = self.foreign.lock().expect("foreign lock");
                foreign.dropped(name, Instant::now());
            }
            // The view keeps what it had: a record nobody may act on changes nothing.
            CatalogChange::Rejected { .. } | CatalogChange::Current => {}
        }
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
        let hosted = self.table.read().expect("table lock").hosted_len();
        metrics::gauge!(FILTERS).set(hosted as f64);
    }

    /// The answers of the catalog filters' service instances to the service request on
    /// `subject` (`$SRV.<verb>`, `$SRV.<verb>.<service>`, `$SRV.<verb>.<service>.<id>`).
    fn service_answers(&self, subject: &str) -> Vec<Bytes> {
        let service = subject.split('.').nth(2);
        // The instances first, the answers (JSON of each) outside the lock: a `$SRV.PING` to
        // 100,000 filters must not hold up the creates and drops meanwhile.
        // To every service: the running replicas (parked ones are not woken for a census).
        // To one filter's: its replica, resumed if it was parked.
        let instances: Vec<_> = match service {
            None => {
                let table = self.table.read().expect("table lock");
                table
                    .iter_hosted()
                    .filter(|(name, ..)| self.answers_service_of(name))
                    .filter_map(|(.., running)| running?.service())
                    .collect()
            }
            Some(service) => service
                .strip_prefix(crate::replica::service::SERVICE_NAME_PREFIX)
                .filter(|name| self.answers_service_of(name))
                .and_then(|name| self.replica_pinned(name, false))
                .and_then(|h| h.service())
                .into_iter()
                .collect(),
        };
        instances.iter().filter_map(|s| s.answer(subject)).collect()
    }

    /// Whether the node answers `$SRV` for filter `name`: a catalog filter's, or a configured
    /// one it routes ([`Inner::configured_routed`]).
    fn answers_service_of(&self, name: &str) -> bool {
        !self.configured.contains(name) || self.configured_routed.contains(name)
    }

    /// The catalog filter `name` (not a configured one) a request on a subject the node routes
    /// is for (`routed`, on `<prefix>.<filter>.api` or
    /// `<prefix>.<filter>.replica.<node id>.api[.<op>]`): hosted and serving its API (for the first, which every node answers for its own replica), or
    /// (for the second) hosted, replicating under the node's id ([`Inner::routes_own_api`]),
    /// or (`true`) dropped a moment ago, which refuses them. A hosted or starting replica of
    /// the name goes first: a re-created filter's, not the dropped one's still lingering.
    fn routed_target(&self, name: &str, routed: Routed) -> Option<(ReplicaHandle, bool)> {
        let (handle, routes, dropped) = match self.target(name)? {
            Target::Live(handle) => {
                let routes = self.routes_own_api(handle.kind());
                (handle, routes, false)
            }
            Target::Starting(handle, routes) => (handle, routes, false),
            Target::Dropping(handle) => (handle, true, true),
            Target::Stopping(handle, refusing) => (handle, refusing, true),
        };
        match routed {
            Routed::ApiRoot => (!dropped && handle.serving_api()).then_some((handle, false)),
            _ => routes.then_some((handle, dropped)),
        }
    }

    /// The filter a subject under the node's prefix is about (`<prefix>.<filter>...`).
    fn filter_of<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('.')?
            .split('.')
            .next()
    }

    /// Hands a message of a replication subject (`<prefix>.<filter>.*`) to the replica of the
    /// filter it is for, hosted or starting, if the node routes its replication. Anything
    /// else (a filter the node does not host; a request on `<prefix>.<filter>.api`, which
    /// the same pattern covers) is not for it.
    fn route_replication(&self, msg: Message) {
        let Some(name) = self.filter_of(&msg.subject) else {
            return;
        };
        match self.replica_of(name) {
            Some(handle) => handle.route_replication(msg),
            None => self.heard_elsewhere(name, &msg.subject),
        }
    }

    /// Notes `name` as replicated outside the catalog if `subject` is its delta or state
    /// subject and the catalog does not list it ([`ForeignNames`]).
    fn heard_elsewhere(&self, name: &str, subject: &str) {
        if self.settings.api_queue != ApiQueue::Node || !is_subject_name(name) {
            return;
        }
        // `<prefix>.<name>.delta` or `.state` (the pattern is `<prefix>.*.*`).
        let channel = subject.rsplit('.').next();
        if !matches!(channel, Some("delta" | "state")) {
            return;
        }
        // The view's lock held meanwhile, taken first as `saw` does: a create or drop seen
        // at the same time is not undone here.
        let view = self.view.read().expect("view lock");
        if !view.contains_key(name) {
            let mut foreign = self.foreign.lock().expect("foreign lock");
            foreign.saw(name, Instant::now());
        }
    }

    /// Where a request the node's API subscription took goes ([`serve_node_api`]).
    fn route_api(&self, msg: Message) -> ApiRoute {
        let Some(name) = self.filter_of(&msg.subject) else {
            return ApiRoute::Silent;
        };
        if self.configured_here.contains(name) {
            // Its own subscription, in its filter's group, answers.
            return ApiRoute::Silent;
        }
        if self.configured.contains(name) {
            // Configured under another prefix: a catalog filter of this name is not hosted
            // here (the configured one stays; its start logged why). A name the catalog does
            // not list is not the node's to answer.
            if self.view.read().expect("view lock").contains_key(name) {
                return ApiRoute::answer(self.refuse(msg, &ReplicaError::NotServing));
            }
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
            return ApiRoute::Silent;
        }
        if let Some((handle, final_)) = self.api_target(name) {
            if final_ || handle.serving_api() {
                return ApiRoute::answer(handle.route_own_api(msg));
            }
            if self.dropped_meanwhile(name) {
                return self.refuse_dropped(name.to_owned(), msg);
            }
            return ApiRoute::Hold(msg);
        }
        if self.view.read().expect("view lock").contains_key(name) {
            return ApiRoute::Hold(msg);
        }
        let now = Instant::now();
        let foreign = self.foreign.lock().expect("foreign lock");
        if foreign.dropped_within(name, now, DROPPED_REFUSAL) {
            // The watcher saw it dropped a moment ago (and its replica, if it ever started
            // here, is gone): a catalog filter's name, refused without asking the catalog.
            drop(foreign);
            return self.refuse_dropped(name.to_owned(), msg);
        }
        // Any other name is not the node's to answer: the requester takes the first answer,
        // and a refusal here would beat the reply of whoever serves the name outside the
        // catalog (a filter configured on another node, an embedded replica, any service on
        // the prefix), which the node cannot tell is there. Only a filter the catalog lists
        // (created a moment ago, ahead of the watcher) is waited for.
        match foreign.heard(name, now) {
            Heard::Elsewhere => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
                ApiRoute::Silent
            }
            Heard::Unlisted => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
                ApiRoute::Silent
            }
            Heard::Unchecked | Heard::Never => ApiRoute::LookUp(msg),
        }
    }

    /// The replica of catalog filter `name` that takes its requests: hosted or starting,
    /// or (`true`) dropped a moment ago or stopping with the node, which refuses them.
    fn api_target(&self, name: &str) -> Option<(ReplicaHandle, bool)> {
        Some(match self.target(name)? {
            Target::Live(h) | Target::Starting(h, _) => (h, false),
            Target::Dropping(h) | Target::Stopping(h, _) => (h, true),
        })
    }

    /// Where the replica of `name` is, in one look at the table (a parked one resumed).
    fn target(&self, name: &str) -> Option<Target> {
        {
            let table = self.table.read().expect("table lock");
            match table.find(name) {
                Found::Absent => return None,
                Found::Live(h) => return Some(Target::Live(h.clone())),
                Found::Starting(h, routes) => return Some(Target::Starting(h.clone(), routes)),
                Found::Dropping(h) => return Some(Target::Dropping(h.clone())),
                Found::Stopping(h, own) => return Some(Target::Stopping(h.clone(), own)),
                Found::Parked => {}
            }
        }
        self.resume(name).map(Target::Live)
    }

    /// Whether the watcher saw `name` dropped (and not created again) while its replica
    /// still starts: the drop waits behind the create's start, and a request must not wait
    /// for a replica that stops as soon as it has started.
    fn dropped_meanwhile(&self, name: &str) -> bool {
        self.foreign.lock().expect("foreign lock").was_dropped(name)
    }

    /// Waits up to `left` for `handle` to serve, unless its filter is dropped meanwhile
    /// ([`Inner::dropped_meanwhile`]): `false` then.
    async fn wait_serving(&self, name: &str, handle: &ReplicaHandle, left: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + left;
        loop {
            if self.dropped_meanwhile(name) {
                return false;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if handle.wait_ready(left.min(Duration::from_millis(20))).await || left.is_zero() {
                return true;
            }
        }
    }

    /// The replicas hosted or starting (those whose replication the node does not route take
    /// no routed message, [`ReplicaHandle::route_event`]).
    fn routed_handles(&self) -> Vec<ReplicaHandle> {
        self.table.read().expect("table lock").routed_handles()
    }

    /// The node's refusal `e` of a request its API subscription took.
    fn refuse(
        &self,
        msg: Message,
        e: &ReplicaError,
    ) -> Option<(String, async_nats::HeaderMap, Bytes)> {
        let id = self.shared_id.as_ref().map_or(0, |s| s.identity().replica);
        refusal(id, msg, e)
    }

    /// The replica of `name`: hosted, starting, or stopping with the node.
    fn replica_of(&self, name: &str) -> Option<ReplicaHandle> {
        match self.target(name)? {
            Target::Live(h) | Target::Starting(h, _) | Target::Stopping(h, _) => Some(h),
            Target::Dropping(_) => None,
        }
    }

    /// Hands each digest of another node's batch to this node's replica of its filter, as if
    /// it had come on the filter's `state` subject (where its replica checks it as any
    /// frame). A batch that is not one is refused whole, and counted.
    fn route_digest_batch(&self, payload: &[u8]) {
        let items = match decode_batch(payload) {
            Ok(items) => items,
            Err(e) => {
                metrics::counter!(DIGEST_BATCHES_REJECTED).increment(1);
                tracing::debug!(error = %e, "a digest batch was refused");
                return;
            }
        };
        metrics::counter!(DIGEST_BATCHES, "direction" => "in").increment(1);
        metrics::counter!(BATCHED_DIGESTS, "direction" => "in").increment(items.len() as u64);
        for (name, frame) in items {
            // A name that is no subject token is no filter of this node.
            if !is_subject_name(&name) {
                continue;
            }
            if let Some(handle) = self.replica_of(&name) {
                handle.route_batched_digest(Message {
                    subject: format!("{}.{name}.state", self.prefix),
                    payload: frame.into(),
                    reply: None,
                    headers: None,
                });
            }
        }
    }

    /// Routes a request on a subject the node serves for its catalog filters (`routed`). On
    /// its own API subjects, a catalog filter whose replica does not serve yet (starting,
    /// catching up, or not started: the watcher saw the create) is waited for, and a name
    /// the watcher has not told of is looked up in the catalog (created a moment ago), as
    /// on the queue group: such a request was refused at once, or left unanswered.
    fn route(&self, msg: Message, routed: Routed) -> ApiRoute {
        let Some(name) = self.filter_of(&msg.subject) else {
            return ApiRoute::Silent;
        };
        if self.configured.contains(name) && !self.configured_routed.contains(name) {
            // Its own subscriptions answer (its id may equal the node's: another namespace).
            return ApiRoute::Silent;
        }
        if let Some((handle, dropped)) = self.routed_target(name, routed) {
            if routed == Routed::OwnApi && !handle.serving_api() {
                if self.dropped_meanwhile(name) {
                    return ApiRoute::answer(self.refuse(msg, &ReplicaError::Stopped));
                }
                if !dropped {
                    // Starting or catching up: held until it serves, as on the queue group.
                    return ApiRoute::HoldOwn(msg);
                }
            }
            return ApiRoute::answer(handle.route_own_api(msg));
        }
        if routed != Routed::OwnApi || self.shared_id.is_none() {
            return ApiRoute::Silent;
        }
        let listed = self
            .view
            .read()
            .expect("view lock")
            .get(name)
            .map(|e| self.routes_own_api(e.spec.kind));
        match listed {
            // Listed, its replica not started yet.
            Some(true) => ApiRoute::HoldOwn(msg),
            Some(false) => ApiRoute::Silent,
            // Not known to the watcher yet: perhaps created a moment ago (a request sent
            // right after the create was left unanswered here), perhaps a replica outside
            // the catalog with the same id. The catalog tells.
            None if !is_subject_name(name) => ApiRoute::Silent,
            None => match self
                .foreign
                .lock()
                .expect("foreign lock")
                .heard(name, Instant::now())
            {
                Heard::Elsewhere | Heard::Unlisted => ApiRoute::Silent,
                Heard::Unchecked | Heard::Never => ApiRoute::LookUpOwn(msg),
            },
        }
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

    /// Notes the expiry of `entry`, if it has one, for [`expire_due`].
    fn schedule_expiry(&self, entry: &CatalogEntry) {
        if let Some(at) = entry.expires_ms {
            self.expiries.lock().expect("expiries lock").insert((
                at,
                entry.name.clone(),
                entry.generation,
            ));
            self.expiry_noted.notify_one();
        }
    }

    /// The entry of a hosted generation was written again with another expiry (`EXPIRE`,
    /// `PERSIST`): kept, scheduled, and recorded in its data directory (a node without
    /// NATS rebuilds its catalog from there).
    async fn expiry_changed(&self, entry: &CatalogEntry) {
        let changed = self.table.write().expect("table lock").set_expiry(
            &entry.name,
            entry.generation,
            entry.expires_ms,
        );
        if !changed {
            return;
        }
        if let Some(view) = self.view.write().expect("view lock").get_mut(&entry.name)
            && view.generation == entry.generation
        {
            view.expires_ms = entry.expires_ms;
        }
        self.schedule_expiry(entry);
        if let Some(base) = &self.data_dir {
            let dir = base.join(incarnation_dir(&entry.name, entry.generation));
            let recorded = entry.clone();
            let written =
                tokio::task::spawn_blocking(move || write_entry_file(&dir, &recorded)).await;
            if let Ok(Err(e)) = written {
                tracing::warn!(filter = entry.name, error = %e, "could not record a filter's new expiry in its data directory");
            }
        }
    }

    /// Hosts the filter of `entry` (stopping an older generation of the name first).
    async fn host(self: &Arc<Self>, entry: CatalogEntry) {
        if self.configured.contains(&entry.name) {
            tracing::warn!(
                filter = entry.name,
                "the catalog has a filter of this node's configuration file: the configured one stays"
            );
            return;
        }
        let current = self
            .table
            .read()
            .expect("table lock")
            .hosted(&entry.name)
            .map(|h| h.generation);
        match current {
            Some(g) if g == entry.generation => return self.expiry_changed(&entry).await,
            Some(g) if g > entry.generation => return,
            // A later generation takes the name only after the drop of the hosted one: a
            // sealed entry written again (a replay) is no drop.
            Some(g) if !follows_drop_of(&entry, g) => {
                self.rejected(&entry.name, "replaced_without_drop").await;
                return;
            }
            Some(_) => self.unhost(&entry.name).await,
            None => {}
        }
        let mut cfg = self.replica_config(&entry.name, entry.spec.clone(), entry.generation);
        let age_ms = crate::transport::catalog::now_ms().saturating_sub(entry.created_ms);
        cfg.new_incarnation = age_ms < cfg.catch_up_timeout_ms;
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=5 {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let started = self
                .start_replica(
                    cfg.clone(),
                    self.shared_id.clone(),
                    self.digest_batches.clone(),
                    self.routes_own_api(entry.spec.kind),
                    entry.clone(),
                )
                .await;
            match started {
                Ok(_) => {
                    if let Some(dir) = cfg.data_dir.clone() {
                        let recorded = entry.clone();
                        // Written once: a restart finds it there (rewritten, with its syncs,
                        // at every start, it doubled the start of 10,000 filters).
                        let written = tokio::task::spawn_blocking(move || {
                            match read_entry_file(&dir, &recorded.name, recorded.generation) {
                                Some(kept) if kept == recorded => Ok(()),
                                _ => write_entry_file(&dir, &recorded),
                            }
                        })
                        .await;
                        if let Ok(Err(e)) = written {
                            tracing::warn!(filter = entry.name, error = %e, "could not record the catalog entry in the filter's data directory");
                        }
                    }
                    metrics::counter!(CATALOG_CHANGES, "change" => "started").increment(1);
                    self.schedule_expiry(&entry);
                    return;
                }
                Err(e) => {
                    metrics::counter!(CATALOG_ERRORS, "op" => "start").increment(1);
                    tracing::warn!(
                        filter = entry.name, generation = entry.generation, attempt, error = %e,
                        "could not start a catalog filter's replica"
                    );
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }

    /// Starts the replica of `cfg` and hosts it as `entry`. Routed to as soon as its actor
    /// runs, before its first snapshot is written: [`table::State::Starting`] until then
    /// (`routes`: whether the node routes its own API subjects), then hosted.
    async fn start_replica(
        &self,
        cfg: ReplicaConfig,
        shared_id: Option<Arc<SharedId>>,
        digest_batches: Option<Arc<DigestBatcher>>,
        routes: bool,
        entry: CatalogEntry,
    ) -> Result<ReplicaHandle, crate::replica::ReplicaError> {
        let name = cfg.name.clone();
        let starting = |h: &ReplicaHandle| {
            let mut table = self.table.write().expect("table lock");
            if let Err(e) = table.begin_start(&name, h.clone(), routes) {
                tracing::warn!(error = %e, "a replica starts that the node does not route to");
            }
        };
        let started = Replica::start_hosted(
            cfg,
            self.transport.clone(),
            shared_id,
            digest_batches,
            starting,
        )
        .await;
        let handle = match started {
            Ok(handle) => handle,
            Err(e) => {
                let _ = self.table.write().expect("table lock").start_failed(&name);
                return Err(e);
            }
        };
        let hosted = {
            let mut table = self.table.write().expect("table lock");
            table.started(&name, &handle, Filter::new(entry))
        };
        if let Err(e) = hosted {
            // Another replica has the name (changes of one name are applied in order, so
            // this is a defect): the new one stops rather than run unhosted.
            tracing::warn!(error = %e, "a started replica could not be hosted: stopping it");
            if let Err(e) = handle.shutdown().await {
                tracing::warn!(filter = name, error = %e, "an unhosted replica did not stop cleanly");
            }
            return Err(ReplicaError::Stopped);
        }
        self.changed();
        Ok(handle)
    }

    /// Stops the replica of `name` and moves its data directory aside.
    async fn unhost(self: &Arc<Self>, name: &str) {
        self.unhost_generation(name, None).await
    }

    /// [`Inner::unhost`], if the generation hosted is at most `dropped` (`None`: any).
    async fn unhost_generation(self: &Arc<Self>, name: &str, dropped: Option<u64>) {
        if self.configured.contains(name) {
            return;
        }
        // Out of the hosted filters and, where it refuses, dropping in one step: a request
        // meanwhile finds it in one state or the other.
        let dropped = {
            let mut table = self.table.write().expect("table lock");
            table.drop_filter(name, dropped, |h| self.routes_own_api(h.spec.kind))
        };
        // Not hosted (or a later generation is).
        let Ok(dropped) = dropped else {
            return;
        };
        // A parked replica has nothing to stop; requests for it meanwhile are refused as for
        // a dropped filter the node never ran ([`Inner::dropped_meanwhile`]).
        if dropped.was_parked {
            metrics::gauge!(PARKED_FILTERS).decrement(1.0);
        }
        let (generation, running, refusing) =
            (dropped.generation, dropped.running, dropped.lingers);
        self.changed();
        if let Some(handle) = &running
            && let Err(e) = handle.shutdown_dropped().await
        {
            tracing::warn!(filter = name, error = %e, "a dropped filter's replica did not stop cleanly");
        }
        if let Some(handle) = running.filter(|_| refusing) {
            // As long as its own subscriptions would have lingered, unless the name is
            // hosted again meanwhile (a new incarnation answers then).
            let inner = Arc::downgrade(self);
            let name = name.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(crate::replica::API_LINGER).await;
                if let Some(inner) = inner.upgrade() {
                    let mut table = inner.table.write().expect("table lock");
                    table.linger_over(&name, &handle);
                }
            });
        }
        if let Some(base) = &self.data_dir {
            move_aside(base, &incarnation_dir(name, generation), "dropped");
            self.purge_dropped_dirs();
        }
        metrics::counter!(CATALOG_CHANGES, "change" => "stopped").increment(1);
    }

    async fn apply(self: Arc<Self>, change: CatalogChange) -> String {
        match change {
            CatalogChange::Put(entry) => {
                let name = entry.name.clone();
                self.host(entry).await;
                name
            }
            CatalogChange::Dropped { name, generation } => {
                self.unhost_generation(&name, generation).await;
                name
            }
            CatalogChange::Rejected { name, reason } => {
                self.rejected(&name, reason).await;
                name
            }
            // Not queued by name (see `follow`).
            CatalogChange::Current => String::new(),
        }
    }
}

/// Drops the hosted filters whose expiry has come, by this node's clock, until the node
/// stops: each through [`Catalog::expire`] (a drop record, which every node applies as a
/// drop; the first node whose clock says so writes it).
async fn expire_due(inner: Weak<Inner>) {
    let mut wait = EXPIRY_TICK;
    loop {
        {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            // Not holding the node while waiting (it may stop); a note meanwhile is kept
            // as the Notify's permit.
            let noted = inner.expiry_noted.clone();
            drop(inner);
            let _ = tokio::time::timeout(wait, noted.notified()).await;
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Some(catalog) = inner.catalog.clone() else {
            return;
        };
        let now = crate::transport::catalog::now_ms();
        let due: Vec<(u64, String, u64)> = {
            let mut expiries = inner.expiries.lock().expect("expiries lock");
            let later = expiries.split_off(&(now + 1, String::new(), 0));
            let due = std::mem::replace(&mut *expiries, later);
            // Until the next one, or a new one noted.
            wait = expiries.first().map_or(EXPIRY_TICK, |(at, ..)| {
                Duration::from_millis(at.saturating_sub(now).max(1)).min(EXPIRY_TICK)
            });
            due.into_iter().collect()
        };
        for (at, name, generation) in due {
            let hosts = inner
                .table
                .read()
                .expect("table lock")
                .hosted(&name)
                .is_some_and(|h| {
                    h.generation == generation && h.expires_ms.is_some_and(|e| e <= now)
                });
            let _ = at;
            if !hosts {
                continue;
            }
            let catalog = catalog.clone();
            let weak = Arc::downgrade(&inner);
            actix::spawn(async move {
                match catalog.expire(name.clone(), generation).await {
                    Ok(true) => {
                        metrics::counter!(CATALOG_CHANGES, "change" => "expired").increment(1);
                        tracing::info!(filter = name, generation, "filter expired: dropped");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        // Tried again in a second.
                        tracing::warn!(filter = name, error = %e, "could not drop an expired filter");
                        if let Some(inner) = weak.upgrade() {
                            inner.expiries.lock().expect("expiries lock").insert((
                                crate::transport::catalog::now_ms() + 1_000,
                                name,
                                generation,
                            ));
                        }
                    }
                }
            });
        }
    }
}

/// The NATS service protocol's subjects (a verb to every service, to one service, to one
/// instance), each one subscription of the node for all its catalog filters.
const SERVICE_SUBJECTS: [&str; 3] = ["$SRV.*", "$SRV.*.*", "$SRV.*.*.*"];

/// Answers the NATS service protocol on `subject` for every catalog filter the node hosts
/// (those that serve their API), until the node stops. Three subscriptions per replica were
/// 3 of its 8, with a channel buffer of ~6 KB each, and 300,000 subscriptions in nats-server
/// for 100,000 filters.
async fn serve_services(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    subject: String,
    initial: Option<MessageStream>,
) {
    let stopped = stopped(inner.clone(), |i| &i.stopping);
    let answering = transport.clone();
    serve_subscription(transport, (subject, None), initial, stopped, |msg| {
        let answers = match (inner.upgrade(), msg.reply) {
            (Some(inner), Some(reply)) => Some((inner.service_answers(&msg.subject), reply)),
            _ => None,
        };
        let transport = answering.clone();
        async move {
            let Some((answers, reply)) = answers else {
                return;
            };
            for answer in answers {
                if let Err(e) = transport.publish(reply.clone(), answer).await {
                    tracing::debug!(error = %e, "a service protocol answer was not sent");
                }
            }
        }
    })
    .await
}

/// The subjects of its catalog filters a node serves on subscriptions of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routed {
    /// The NATS service protocol ([`SERVICE_SUBJECTS`]).
    Service,
    /// `<prefix>.*.api`: the request API without an operation, answered with an error by
    /// every node whose replica serves (the requester takes the first answer).
    ApiRoot,
    /// `<prefix>.*.replica.<node id>.api[.>]`: the own API subjects of the filters that
    /// replicate under the node's id.
    OwnApi,
}

/// Routes the requests on `subject` (see [`Routed`]) to the replicas of the catalog filters
/// they are for, until the node stops. These were 3 of each replica's 5 subscriptions, with
/// a channel buffer of ~6 KB each.
async fn serve_replica_apis(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    subject: String,
    initial: Option<MessageStream>,
    routed: Routed,
) {
    // Not when the node starts stopping: its replicas answer until they stopped.
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    let replying = transport.clone();
    serve_subscription(transport, (subject, None), initial, stopped, |msg| {
        let routed = inner.upgrade().map(|i| (i.route(msg, routed), i));
        let transport = replying.clone();
        async move {
            let reply = match routed {
                Some((ApiRoute::Reply(reply), _)) => Some(reply),
                Some((ApiRoute::LookUpOwn(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::LookUpOwn);
                    None
                }
                Some((ApiRoute::HoldOwn(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::Hold { own: true });
                    None
                }
                // `route` holds nothing itself: a hold follows a look-up here.
                Some((ApiRoute::Silent | ApiRoute::Hold(_) | ApiRoute::LookUp(_), _)) | None => {
                    None
                }
            };
            if let Some((to, headers, payload)) = reply
                && let Err(e) = transport.publish_with_headers(to, headers, payload).await
            {
                tracing::debug!(error = %e, "a reply of a replica's API was not sent");
            }
        }
    })
    .await
}

/// Where [`Inner::route_api`] sends a request.
enum ApiRoute {
    /// The reply (subject, headers, payload), at once.
    Reply((String, async_nats::HeaderMap, Bytes)),
    /// None from this node: a replica's own subscription answers it (or it wants none).
    Silent,
    /// A catalog filter this node does not serve yet: it waits for it ([`hold_request`]).
    Hold(Message),
    /// A name the node does not know: the catalog says whether it is one
    /// ([`look_up_request`]); if not, it gets no answer.
    LookUp(Message),
    /// The same on a filter's own API subject of the node's id ([`Routed::OwnApi`]),
    /// where a name the catalog does not list gets no answer ([`look_up_own_request`]).
    LookUpOwn(Message),
    /// A catalog filter's replica that does not serve yet, on its own API subject of the
    /// node's id: it waits for it ([`hold_request`]).
    HoldOwn(Message),
}

impl ApiRoute {
    /// The reply, if the request wants one.
    fn answer(reply: Option<(String, async_nats::HeaderMap, Bytes)>) -> Self {
        reply.map_or(ApiRoute::Silent, ApiRoute::Reply)
    }
}

/// Takes the request API's operations of every catalog filter (`subject`, `<prefix>.*.api.>`,
/// in the node's queue group) and routes each to its replica, until the node stopped its
/// replicas. One subscription of the node where each replica had one (~7 KB each).
async fn serve_node_api(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    (subject, queue): (String, String),
    initial: Option<MessageStream>,
) {
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    let replying = transport.clone();
    serve_subscription(transport, (subject, Some(queue)), initial, stopped, |msg| {
        let routed = inner.upgrade().map(|i| (i.route_api(msg), i));
        let transport = replying.clone();
        async move {
            let reply = match routed {
                Some((ApiRoute::Reply(reply), _)) => Some(reply),
                Some((ApiRoute::Hold(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::Hold { own: false });
                    None
                }
                Some((ApiRoute::LookUp(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::LookUp);
                    None
                }
                // Only own API subjects are held or looked up that way.
                Some((ApiRoute::Silent | ApiRoute::LookUpOwn(_) | ApiRoute::HoldOwn(_), _))
                | None => None,
            };
            if let Some((to, headers, payload)) = reply {
                publish_reply(&transport, to, headers, payload).await;
            }
        }
    })
    .await
}

/// Why a request of the node's subscriptions waits in a task of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// For its filter to serve ([`hold_request`]); `own`: on its own API subject.
    Hold { own: bool },
    /// For the catalog to say whether the name is one ([`look_up_request`]).
    LookUp,
    /// The same for an own API subject ([`look_up_own_request`]).
    LookUpOwn,
}

/// One of the node's [`MAX_HELD_REQUESTS`] places for held requests, given back when dropped:
/// also by a task that panics or is cancelled (the node's runtime stopping), where a count
/// decremented by hand would stay taken for good.
struct HeldSlot(Arc<Inner>);

impl HeldSlot {
    /// A place, if one is free.
    fn take(inner: &Arc<Inner>) -> Option<HeldSlot> {
        let taken = inner.held.fetch_add(1, Ordering::AcqRel);
        let slot = HeldSlot(inner.clone());
        (taken < MAX_HELD_REQUESTS).then_some(slot)
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers `msg` in a task of its own (see [`Held`]). Beyond [`MAX_HELD_REQUESTS`] it is
/// refused at once.
fn spawn_held(inner: Arc<Inner>, transport: Arc<dyn Transport>, msg: Message, why: Held) {
    let Some(slot) = HeldSlot::take(&inner) else {
        match why {
            // Perhaps another responder's: left to it.
            Held::LookUp => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "undecided").increment(1);
                return;
            }
            Held::LookUpOwn => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
                return;
            }
            Held::Hold { .. } => {}
        }
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "refused").increment(1);
        if let Some((to, headers, payload)) = inner.refuse(msg, &ReplicaError::NotServing) {
            tokio::spawn(async move { publish_reply(&transport, to, headers, payload).await });
        }
        return;
    };
    tokio::spawn(async move {
        let reply = match why {
            Held::Hold { own } => hold_request(&inner, msg, own).await,
            Held::LookUp => look_up_request(&inner, msg).await,
            Held::LookUpOwn => look_up_own_request(&inner, msg).await,
        };
        drop(slot);
        if let Some((to, headers, payload)) = reply {
            publish_reply(&transport, to, headers, payload).await;
        }
    });
}

/// The reply to a request for a catalog filter this node does not serve yet, once its
/// replica serves; refused as not serving if it does not within [`API_HOLD`]. `own`: on the
/// filter's own API subject of the node's id ([`Routed::OwnApi`]) rather than the queue
/// group's, where a filter dropped before its replica started, or back as a kind that keeps
/// an id of its own (its replica subscribes), is no longer the node's to answer.
async fn hold_request(
    inner: &Arc<Inner>,
    msg: Message,
    own: bool,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    if own {
        // Own API subjects are the node's only under its id.
        inner.shared_id.as_ref()?;
    }
    metrics::counter!(NODE_API_REQUESTS, "outcome" => "held").increment(1);
    let deadline = tokio::time::Instant::now() + API_HOLD;
    let mut changes = inner.changes.subscribe();
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let mut seen_listed = false;
    loop {
        if inner.stopping.load(Ordering::SeqCst) {
            return inner.refuse(msg, &ReplicaError::Stopped);
        }
        let target = match own {
            true => inner.routed_target(&name, Routed::OwnApi),
            false => inner.api_target(&name),
        };
        if let Some((handle, final_)) = target {
            if !final_ {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if !inner.wait_serving(&name, &handle, left).await {
                    // Dropped while its replica started.
                    let dropped = match own {
                        true => ReplicaError::Stopped,
                        false => ReplicaError::UnknownFilter(name),
                    };
                    return inner.refuse(msg, &dropped);
                }
            }
            return match handle.serving_api() || final_ {
                true => handle.route_own_api(msg),
                false => inner.refuse(msg, &ReplicaError::NotServing),
            };
        }
        if own {
            let listed = {
                let view = inner.view.read().expect("view lock");
                view.get(&name).map(|e| inner.routes_own_api(e.spec.kind))
            };
            match listed {
                Some(false) => return None,
                Some(true) => seen_listed = true,
                None if seen_listed => return None,
                None => {}
            }
        }
        // Started replicas show in `starting` without a change: looked at again meanwhile.
        let next = deadline.min(tokio::time::Instant::now() + Duration::from_millis(20));
        if tokio::time::timeout_at(next, changes.changed())
            .await
            .is_err()
            && tokio::time::Instant::now() >= deadline
        {
            return inner.refuse(msg, &ReplicaError::NotServing);
        }
    }
}

/// The reply to a request for a name the node does not know: held for the filter if the
/// catalog lists it (its watcher had not told of it yet), else none: whoever serves the name
/// outside the catalog answers, if anyone does ([`Inner::route_api`]). Without an answer of
/// the catalog it gets none either.
async fn look_up_request(
    inner: &Arc<Inner>,
    msg: Message,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let catalog = inner.catalog.clone()?;
    let undecided = || {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "undecided").increment(1);
        None
    };
    let Ok(permit) = inner.lookups.clone().try_acquire_owned() else {
        return undecided();
    };
    let listed = tokio::time::timeout(API_HOLD, catalog.get(name.clone())).await;
    drop(permit);
    match listed {
        Ok(Ok(Some(_))) => hold_request(inner, msg, false).await,
        Ok(Ok(None)) => {
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
            // The view's lock first, as `saw` takes them: a create the watcher saw while
            // the catalog was read is not undone here.
            let view = inner.view.read().expect("view lock");
            if !view.contains_key(&name) {
                let mut foreign = inner.foreign.lock().expect("foreign lock");
                foreign.absent(&name, Instant::now());
            }
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(filter = name, error = %e, "the catalog could not say whether a requested filter exists");
            undecided()
        }
        Err(_) => undecided(),
    }
}

/// The reply to a request on a filter's own API subject of the node's id for a name the
/// node's watcher has not told of: if the catalog lists it under a kind that replicates
/// under the node's id (created a moment ago), the request waits for its replica to serve,
/// as on the queue group ([`hold_request`]); otherwise it is left to whoever has the name
/// outside the catalog (no answer).
async fn look_up_own_request(
    inner: &Arc<Inner>,
    msg: Message,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let catalog = inner.catalog.clone()?;
    let Ok(permit) = inner.own_lookups.clone().try_acquire_owned() else {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
        return None;
    };
    let listed = tokio::time::timeout(API_HOLD, catalog.get(name.clone())).await;
    drop(permit);
    let entry = match listed {
        Ok(Ok(Some(entry))) => entry,
        Ok(Ok(None)) => {
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
            // The view's lock first, as `saw` takes them: a create the watcher saw while
            // the catalog was read is not undone here.
            let view = inner.view.read().expect("view lock");
            if !view.contains_key(&name) {
                let mut foreign = inner.foreign.lock().expect("foreign lock");
                foreign.absent(&name, Instant::now());
            }
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!(filter = name, error = %e, "the catalog could not say whether a requested filter exists");
            return None;
        }
        Err(_) => return None,
    };
    if !inner.routes_own_api(entry.spec.kind) {
        // Its replica subscribes its own subjects, under an id of its own.
        return None;
    }
    hold_request(inner, msg, true).await
}

async fn publish_reply(
    transport: &Arc<dyn Transport>,
    to: String,
    headers: async_nats::HeaderMap,
    payload: Bytes,
) {
    if let Err(e) = transport.publish_with_headers(to, headers, payload).await {
        tracing::debug!(error = %e, "a reply of a catalog filter's API was not sent");
    }
}

/// Hands each message on `subject` to `route` (the replication subjects, `<prefix>.*.*`, to
/// [`Inner::route_replication`]; other nodes' digest batches, `<prefix>.$digests`, to
/// [`Inner::route_digest_batch`]), in the order they came (a gap in a sender's sequence
/// means a loss), until the node stops. Each replica had its own replication subscription,
/// with a channel buffer of ~6 KB.
async fn serve_routed(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    subject: String,
    initial: Option<MessageStream>,
    route: fn(&Inner, Message),
) {
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    serve_subscription(transport, (subject, None), initial, stopped, |msg| {
        if let Some(inner) = inner.upgrade() {
            route(&inner, msg);
        }
        std::future::ready(())
    })
    .await
}

/// Hands each connection event of the node's transport to every replica whose replication
/// the node routes, as their own receivers of it did (one each cost a replica 200 bytes),
/// until the node is gone. In order: one replica's full buffer holds the rest back a moment.
async fn forward_events(inner: Weak<Inner>, events: broadcast::Receiver<TransportEvent>) {
    let mut events = std::pin::pin!(event_stream(events));
    while let Some(ev) = events.next().await {
        let Some(handles) = inner.upgrade().map(|i| i.routed_handles()) else {
            return;
        };
        for handle in handles {
            handle.route_event(ev).await;
        }
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

fn change_name(c: &CatalogChange) -> &str {
    match c {
        CatalogChange::Put(e) => &e.name,
        CatalogChange::Dropped { name, .. } | CatalogChange::Rejected { name, .. } => name,
        CatalogChange::Current => "",
    }
}

/// The catalog's records, read from a watch's first part, and that watch to follow on with
/// (its first part again, then the changes); the watch is `None` if it failed.
async fn list_and_watch(
    catalog: &Arc<dyn Catalog>,
) -> (
    Result<crate::transport::Listing, CatalogError>,
    Option<CatalogWatch>,
) {
    let mut watch = match catalog.watch().await {
        Ok(watch) => watch,
        Err(e) => return (Err(e), None),
    };
    let mut listing = crate::transport::Listing::default();
    let mut seen = Vec::new();
    loop {
        match watch.next().await {
            Some(Ok(CatalogChange::Current)) => {
                seen.push(Ok(CatalogChange::Current));
                let replayed = futures::stream::iter(seen).chain(watch).boxed();
                return (Ok(listing), Some(replayed));
            }
            Some(Ok(change)) => {
                listing.add(change.clone());
                seen.push(Ok(change));
            }
            Some(Err(e)) => return (Err(e), None),
            None => {
                let ended = CatalogError::Unavailable("the catalog's watch ended".into());
                return (Err(ended), None);
            }
        }
    }
}

/// Follows the catalog until the node stops: watches it (again after any error) and applies
/// its changes, up to [`PARALLEL_CHANGES`] at once, those of one name in order.
async fn follow(inner: Arc<Inner>, catalog: Arc<dyn Catalog>, first: Option<CatalogWatch>) {
    let mut delay = Duration::from_millis(100);
    let mut first = first;
    while !inner.stopping.load(Ordering::SeqCst) {
        let watched = match first.take() {
            Some(watch) => Ok(watch),
            None => catalog.watch().await,
        };
        let mut watch = match watched {
            Ok(w) => {
                delay = Duration::from_millis(100);
                w
            }
            Err(e) => {
                metrics::counter!(CATALOG_ERRORS, "op" => "watch").increment(1);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot watch the filter catalog");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        // Changes waiting behind one of their name in flight, by name.
        let mut queued: HashMap<String, VecDeque<CatalogChange>> = HashMap::new();
        let mut running = FuturesUnordered::new();
        let mut watching = true;
        // The names the watch's first part had a record of: a hosted filter not among them
        // is one the catalog lost (a lost bucket), offered back.
        let mut recorded = Some(HashSet::new());
        while watching || !running.is_empty() {
            tokio::select! {
                next = watch.next(), if watching && running.len() < PARALLEL_CHANGES => {
                    match next {
                        Some(Ok(CatalogChange::Current)) => {
                            if let Some(recorded) = recorded.take() {
                                let lost: Vec<String> = inner
                                    .table
                                    .read()
                                    .expect("table lock")
                                    .iter_hosted()
                                    .map(|(n, ..)| n)
                                    .filter(|n| !recorded.contains(*n) && !inner.configured.contains(*n))
                                    .cloned()
                                    .collect();
                                if !lost.is_empty() {
                                    let inner = inner.clone();
                                    tokio::spawn(async move {
                                        futures::stream::iter(lost)
                                            .map(|n| {
                                                let inner = inner.clone();
                                                async move { inner.reoffer_hosted(&n).await }
                                            })
                                            .buffer_unordered(PARALLEL_CHANGES)
                                            .collect::<Vec<()>>()
                                            .await;
                                    });
                                }
                            }
                        }
                        Some(Ok(change)) => {
                            if let Some(recorded) = &mut recorded {
                                recorded.insert(change_name(&change).to_string());
                            }
                            inner.saw(&change);
                            let name = change_name(&change).to_string();
                            match queued.get_mut(&name) {
                                Some(q) => q.push_back(change),
                                None => {
                                    queued.insert(name, VecDeque::new());
                                    running.push(inner.clone().apply(change));
                                }
                            }
                        }
                        Some(Err(e)) => {
                            metrics::counter!(CATALOG_ERRORS, "op" => "watch").increment(1);
                            tracing::warn!(error = %e, "filter catalog watch failed; watching again");
                            watching = false;
                        }
                        None => watching = false,
                    }
                }
                Some(name) = running.next(), if !running.is_empty() => {
                    match queued.get_mut(&name).and_then(VecDeque::pop_front) {
                        Some(next) => running.push(inner.clone().apply(next)),
                        None => {
                            queued.remove(&name);
                        }
                    }
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A place for a held request is given back however its task ends: a panic too.
    #[actix::test]
    async fn a_held_request_gives_its_place_back_even_if_its_task_panics() {
        let cfg = NodeConfig::from_toml_str("").unwrap();
        let bus = Arc::new(crate::transport::InProcessBus::new());
        let node = Node::start(cfg, bus, None).await.unwrap();
        let inner = &node.inner;
        let mut slots: Vec<_> = (0..MAX_HELD_REQUESTS)
            .map(|_| HeldSlot::take(inner).expect("a free place"))
            .collect();
        assert!(HeldSlot::take(inner).is_none(), "beyond the limit");
        let slot = slots.pop();
        let task = tokio::spawn(async move {
            let _slot = slot;
            panic!("a held request's task panicked");
        });
        assert!(task.await.is_err());
        assert!(HeldSlot::take(inner).is_some(), "the panicked task's place");
        drop(slots);
        assert_eq!(inner.held.load(Ordering::Acquire), 0);
        node.shutdown().await.unwrap();
    }

    #[test]
    fn incarnation_dirs_round_trip_and_configured_dirs_are_not_taken_for_them() {
        assert_eq!(incarnation_dir("tenant-7", 42), "tenant-7.g42");
        assert_eq!(
            parse_incarnation_dir("tenant-7.g42"),
            Some(("tenant-7", 42))
        );
        assert_eq!(parse_incarnation_dir("a.g1.g2"), None);
        for configured in [
            "sessions", "gauges", "x.g0", "x.gx", ".g5", "_x.g1", "_h12.g1",
        ] {
            assert_eq!(parse_incarnation_dir(configured), None, "{configured}");
        }
        // Keys of any bytes: their subject names; past 160 bytes, a hash that fits a file
        // name with the generation and a drop time after it.
        let name = crate::names::subject_name(b"bf:users:2026");
        let dir = incarnation_dir(&name, 3);
        assert_eq!(parse_incarnation_dir(&dir), Some((&*name, 3)));
        let long = crate::names::subject_name(&[0xFF; crate::names::MAX_KEY_BYTES]);
        let dir = incarnation_dir(&long, u64::MAX);
        assert!(dir.len() + ".1234567890123".len() < 255, "{dir}");
        let (stem, g) = parse_incarnation_dir(&dir).unwrap();
        assert!(stem.starts_with(HASHED_DIR) && g == u64::MAX);
        assert_ne!(
            dir,
            incarnation_dir(&crate::names::subject_name(&[0xFE; 1024]), u64::MAX)
        );
    }
}
