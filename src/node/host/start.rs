//! A node's start: its shared id, its subscriptions for the catalog filters (confirmed before
//! any filter is ready), its configured filters (many at once), then the catalog's (the
//! listing, the directories matched with it, the watch followed).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::expiry::expire_due;
use super::following::{follow, list_and_watch};
use super::held::Holds;
use super::routing::Routed;
use super::service::{SERVICE_SUBJECTS, serve_services};
use super::shared_id::{claim_node_id, declared_shares_id, lease_template};
use super::subscriptions::{forward_events, serve_node_api, serve_replica_apis, serve_routed};
use super::{Inner, Node, PARALLEL_DECLARED_STARTS, Table, Tasks, parking, stopped};
use crate::node::NodeError;
use crate::node::config::{ApiQueue, DeclaredMetrics, NodeConfig};
use crate::replica::ReplicaConfig;
use crate::transport::digests::{DIGESTS_TOKEN, publish_digests};
use crate::transport::{
    Catalog, CatalogEntry, Subjects, Transport, confirm_subscriptions, subscribe_now,
};

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
        let mut filters = cfg.filters;
        for f in &mut filters {
            // With a catalog, the node's replication subscription covers the configured
            // filters under its prefix too: their own would take every message twice.
            f.routed_replication = with_catalog && f.prefix == template.prefix;
            // Under the node's id and prefix the node's subscriptions serve its `$SRV` and
            // its API subjects, and take over its queue group's as it starts (still its
            // filter's group).
            f.catalog_hosted = f.prefix == template.prefix
                && declared_shares_id(shared_id.is_some(), f.filter.kind);
            // Node-wide series only where they let the filter park (with a catalog): without
            // one nothing parks, and a node of a few filters would lose their own series
            // for nothing.
            f.aggregate_metrics = with_catalog
                && cfg.catalog.declared_metrics == DeclaredMetrics::Node
                && !cfg.catalog.metrics_filters.contains(&f.name);
        }
        let inner = Arc::new(Inner {
            transport,
            catalog,
            configured: filters.iter().map(|f| f.name.clone()).collect(),
            configured_here: filters
                .iter()
                .filter(|f| f.prefix == template.prefix)
                .map(|f| f.name.clone())
                .collect(),
            configured_routed: filters
                .iter()
                .filter(|f| f.catalog_hosted)
                .map(|f| f.name.clone())
                .collect(),
            // What a parked one resumes with: the file's settings (of those that may park).
            declared: filters
                .iter()
                .filter(|f| f.catalog_hosted && f.aggregate_metrics)
                .map(|f| (f.name.clone(), f.clone()))
                .collect(),
            announce_timing: (template.anti_entropy_interval_ms, template.peer_expiry_ms),
            settings: cfg.catalog,
            data_dir: cfg.node.data_dir,
            auth_keys: cfg.auth_keys,
            table: RwLock::new(Table::default()),
            view: RwLock::new(Default::default()),
            changes: watch::channel(0).0,
            stopping: AtomicBool::new(false),
            shared_id,
            prefix: template.prefix,
            routing_stopped: AtomicBool::new(false),
            digest_batches: with_catalog.then(Default::default),
            foreign: Default::default(),
            holds: Holds::default(),
            replication: Default::default(),
            arbiter: actix::Arbiter::current(),
            tasks: Tasks {
                renewals: std::sync::Mutex::new(renewals),
                ..Tasks::default()
            },
            reoffered: Default::default(),
            expiries: Default::default(),
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
            inner.tasks.routers.lock().expect("routers lock").extend([
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
                            .tasks
                            .services
                            .lock()
                            .expect("services lock")
                            .push(tokio::spawn(task));
                    }
                    routed => {
                        let task =
                            serve_replica_apis(weak, transport, (subject, None), stream, routed);
                        inner
                            .tasks
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
        let starts = filters.into_iter().map(|f| {
            let inner = &node.inner;
            let spec = f.filter.clone();
            let shared_id = inner
                .shared_id
                .clone()
                .filter(|_| declared_shares_id(true, f.filter.kind));
            let routed = f.catalog_hosted;
            let group_api = routed.then(|| inner.serve_group_api());
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
                    .start_replica(f, shared_id, None, group_api, routed, entry)
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
            // What the data directory holds as it was is hosted parked first, in batches;
            // the follower then starts the rest (and finds these hosted).
            node.inner.restore_listed(&listed).await;
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
                let mut router = node.inner.tasks.api_router.lock().expect("router lock");
                *router = Some(tokio::spawn(task));
            }
            tracing::info!(filters = listed.len(), "filter catalog followed");
            let park_after = node.inner.settings.park_after_ms;
            if park_after > 0 {
                let every =
                    Duration::from_millis((park_after / u64::from(parking::IDLE_LOOKS)).max(1));
                let task = parking::park_idle(Arc::downgrade(&node.inner), every);
                *node.inner.tasks.parking.lock().expect("parking lock") = Some(tokio::spawn(task));
            }
        }
        actix::spawn(super::keep_gauges(Arc::downgrade(&node.inner)));
        Ok(node)
    }
}
