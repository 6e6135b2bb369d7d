//! Following the catalog: one watch, its changes applied several names at once but those of
//! one name in order; a filter hosted as its entry comes and unhosted as it goes; what the
//! catalog lost offered back to it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::dirs::{ENTRY_FILE, entry_file, incarnation_dir, move_aside, record_entry};
use super::{CATALOG_CHANGES, CATALOG_ERRORS, Inner, PARALLEL_CHANGES, PARKED_FILTERS};
use crate::node::follow::{FollowStep, follow_step, lost_by_catalog};
use crate::node::table::Filter;
use crate::replica::{GroupApi, Replica, ReplicaConfig, ReplicaError, ReplicaHandle, SharedId};
use crate::transport::catalog::CatalogWatch;
use crate::transport::digests::DigestBatcher;
use crate::transport::{Catalog, CatalogChange, CatalogEntry, CatalogError};

/// The `filter` label of the catalog's own rejects.
pub(super) const CATALOG_LABEL: &str = "_catalog";

/// A name is offered back to the catalog at most this often: two nodes with different keys
/// hosting one filter each take the other's entry for one to replace, and would otherwise
/// write over each other without end.
pub(super) const REOFFER_INTERVAL: Duration = Duration::from_secs(2);

impl Inner {
    /// Offers the hosted filter `name` back to the catalog (which lost it, or holds a record
    /// of it nobody may act on); unhosts it if the catalog recorded its drop.
    pub(super) async fn reoffer_hosted(self: &Arc<Self>, name: &str) {
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
    pub(super) fn reoffer_later(
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
    pub(super) async fn rejected(self: &Arc<Self>, name: &str, reason: &'static str) {
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

    /// Keeps this node's view of the catalog.
    pub(super) fn saw(&self, change: &CatalogChange) {
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

    /// Starts and hosts the replica of `entry` (whatever of its name was hosted stopped).
    pub(super) async fn host(self: &Arc<Self>, entry: CatalogEntry) {
        let mut cfg = self.incarnation_config(&entry);
        // A new directory is made with its entry file, durable with its first snapshot in
        // two sync rounds (the file written after the start took two more).
        cfg.data_dir_files = vec![(ENTRY_FILE.to_string(), entry_file(&entry))];
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=5 {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            // A restart's filters come back parked where their directories allow.
            let restored = attempt == 1 && self.host_restored(&entry, &cfg).await;
            let started = match restored {
                true => Ok(()),
                false => self
                    .start_replica(
                        cfg.clone(),
                        self.shared_id.clone(),
                        self.digest_batches.clone(),
                        None,
                        self.routes_own_api(entry.spec.kind),
                        entry.clone(),
                    )
                    .await
                    .map(|_| ()),
            };
            match started {
                Ok(_) => {
                    if let Some(dir) = cfg.data_dir.clone() {
                        // Written once: a restart finds it there (rewritten, with its syncs,
                        // at every start, it doubled the start of 10,000 filters).
                        let recorded = entry.clone();
                        let _ = tokio::task::spawn_blocking(move || record_entry(&dir, &recorded))
                            .await;
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
    /// (`routes`: whether the node routes its own API subjects), then hosted. `group_api`: the
    /// node takes its queue group's subscriptions (a configured filter's).
    pub(super) async fn start_replica(
        &self,
        cfg: ReplicaConfig,
        shared_id: Option<Arc<SharedId>>,
        digest_batches: Option<Arc<DigestBatcher>>,
        group_api: Option<GroupApi>,
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
            group_api,
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
    pub(super) async fn unhost(self: &Arc<Self>, name: &str) {
        self.unhost_generation(name, None).await
    }

    /// [`Inner::unhost`], if the generation hosted is at most `dropped` (`None`: any).
    pub(super) async fn unhost_generation(self: &Arc<Self>, name: &str, dropped: Option<u64>) {
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

    /// Carries out what [`follow_step`] decides for `change`; answers the name it was of.
    pub(super) async fn apply(self: Arc<Self>, change: CatalogChange) -> String {
        let name = change_name(&change).to_string();
        let hosted = {
            let table = self.table.read().expect("table lock");
            table.hosted(&name).map(|h| h.generation)
        };
        let configured = self.configured.contains(&name);
        match (follow_step(hosted, configured, &change), change) {
            (FollowStep::Host, CatalogChange::Put(entry)) => self.host(entry).await,
            (FollowStep::Replace, CatalogChange::Put(entry)) => {
                self.unhost(&name).await;
                self.host(entry).await;
            }
            (FollowStep::Refresh, CatalogChange::Put(entry)) => self.expiry_changed(&entry).await,
            (FollowStep::Unhost, CatalogChange::Dropped { generation, .. }) => {
                self.unhost_generation(&name, generation).await;
            }
            (FollowStep::Reject(reason), _) => self.rejected(&name, reason).await,
            (FollowStep::Nothing, CatalogChange::Put(_)) if configured => {
                tracing::warn!(
                    filter = name,
                    "the catalog has a filter of this node's configuration file: the configured one stays"
                );
            }
            _ => {}
        }
        name
    }
}

pub(super) fn change_name(c: &CatalogChange) -> &str {
    match c {
        CatalogChange::Put(e) => &e.name,
        CatalogChange::Dropped { name, .. } | CatalogChange::Rejected { name, .. } => name,
        CatalogChange::Current => "",
    }
}

/// The catalog's records, read from a watch's first part, and that watch to follow on with
/// (its first part again, then the changes); the watch is `None` if it failed.
pub(super) async fn list_and_watch(
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
pub(super) async fn follow(
    inner: Arc<Inner>,
    catalog: Arc<dyn Catalog>,
    first: Option<CatalogWatch>,
) {
    let mut delay = Duration::from_millis(100);
    let mut first = first;
    while !inner.stopping.load(Ordering::SeqCst) {
        // The start matched the data directories with the first part of the watch it
        // handed over; every later watch's first part is matched with them here.
        let matched_at_start = first.is_some();
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
        // is one the catalog lost (a lost bucket), offered back. And the first part itself,
        // to match the data directories with.
        let mut recorded = Some(HashSet::new());
        let mut first_part = (!matched_at_start).then(crate::transport::Listing::default);
        while watching || !running.is_empty() {
            tokio::select! {
                next = watch.next(), if watching && running.len() < PARALLEL_CHANGES => {
                    match next {
                        Some(Ok(CatalogChange::Current)) => {
                            // A directory whose record the catalog lost since the node
                            // last matched them (before it hosted it) is offered back too.
                            if let Some(listing) = first_part.take() {
                                // Offered back: hosted as the watch brings their records.
                                let inner = inner.clone();
                                let catalog = catalog.clone();
                                tokio::spawn(async move {
                                    inner.reconcile_dirs(&catalog, &listing).await;
                                });
                            }
                            if let Some(recorded) = recorded.take() {
                                let lost: Vec<String> = inner
                                    .table
                                    .read()
                                    .expect("table lock")
                                    .iter_hosted()
                                    .map(|(n, ..)| n)
                                    .filter(|n| lost_by_catalog(recorded.contains(*n), inner.configured.contains(*n)))
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
                            if let Some(listing) = &mut first_part {
                                listing.add(change.clone());
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
