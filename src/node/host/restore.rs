//! A node's start hosts its catalog filters parked, restored from their data directories
//! in batches on a few blocking threads, before it follows the catalog's changes: a filter
//! whose directory alone is its state runs no replica until something is for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;

use super::dirs::record_entry;
use super::parking::{PARKED_FILTERS, PARKING};
use super::{Inner, Parked};
use crate::node::table::Filter;
use crate::replica::{Replica, ReplicaConfig, RestoreUnder, crash};
use crate::transport::CatalogEntry;

/// Filters restored in one blocking task: the hand-offs between threads cost little beside
/// the files read (one hand-off per filter cost a third of a restart's CPU), and the first
/// batches are answered early.
const RESTORE_BATCH: usize = 64;

/// Blocking tasks restoring at once. With the directories in the page cache, two would do
/// (a restore is system calls); read from the disk (after a reboot), each task waits on its
/// reads one at a time: 100,000 filters took 56 s with 4 tasks and 10-13 s with 16 to 128
/// (BENCHMARKS.md), while 16 cost the cached case ~0.5 s of CPU more than 4.
const RESTORE_TASKS: usize = 16;

impl Inner {
    /// The configuration of the replica of catalog entry `entry`: a new incarnation if it
    /// was created less than a catch-up ago.
    pub(super) fn incarnation_config(&self, entry: &CatalogEntry) -> ReplicaConfig {
        let mut cfg = self.replica_config(&entry.name, entry.spec.clone(), entry.generation);
        let age_ms = crate::transport::catalog::now_ms().saturating_sub(entry.created_ms);
        cfg.new_incarnation = age_ms < cfg.catch_up_timeout_ms;
        cfg
    }

    /// Whether the node may host `entry`, configured as `cfg`, parked, restored from its
    /// data directory ([`Inner::host_restored`]): parking on, a data directory, the node's
    /// id and routes in place, a kind it parks, and an incarnation older than a catch-up
    /// (a new one may not have its directory yet).
    pub(super) fn may_restore(&self, entry: &CatalogEntry, cfg: &ReplicaConfig) -> bool {
        self.settings.park_after_ms > 0
            && !cfg.new_incarnation
            && cfg.data_dir.is_some()
            && self.shared_id.is_some()
            && self.digest_batches.is_some()
            && self.replication.get().is_some()
            && self.may_park_spec(&entry.name, entry.spec.kind)
    }

    /// Hosts parked every filter of `listed` whose data directory alone is its state, as
    /// [`Inner::host_restored`] does one, in batches of [`RESTORE_BATCH`] on up to
    /// [`RESTORE_TASKS`] blocking threads; the rest are left to the catalog's follower,
    /// which starts their replicas. Each batch is hosted at once: requests for its filters
    /// are answered (queries from the kept states) while the next ones are read.
    pub(super) async fn restore_listed(self: &Arc<Self>, listed: &[CatalogEntry]) {
        let Some(shared_id) = &self.shared_id else {
            return;
        };
        // Nothing to restore (and no configuration made for each of 100,000 entries).
        if self.data_dir.is_none() || self.settings.park_after_ms == 0 {
            return;
        }
        let under = RestoreUnder::of(shared_id);
        let batches = listed.chunks(RESTORE_BATCH).map(|chunk| {
            let jobs: Vec<(ReplicaConfig, CatalogEntry)> = chunk
                .iter()
                .map(|e| (self.incarnation_config(e), e.clone()))
                .filter(|(cfg, e)| self.may_restore(e, cfg))
                .collect();
            async move {
                tokio::task::spawn_blocking(move || restore_batch(jobs, under))
                    .await
                    .unwrap_or_default()
            }
        });
        let mut batches = futures::stream::iter(batches).buffer_unordered(RESTORE_TASKS);
        while let Some(restored) = batches.next().await {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let mut hosted = Vec::with_capacity(restored.len());
            {
                let mut table = self.table.write().expect("table lock");
                for (entry, parked) in restored {
                    match table.host_parked(&entry.name, Filter::new(entry.clone()), parked) {
                        Ok(()) => hosted.push(entry),
                        Err(e) => {
                            tracing::warn!(error = %e, "a restored filter could not be hosted parked: starting it")
                        }
                    }
                }
            }
            for entry in &hosted {
                metrics::counter!(PARKING, "change" => "restored").increment(1);
                metrics::gauge!(PARKED_FILTERS).increment(1.0);
                crash::point(crash::RESTORED);
                self.schedule_expiry(entry);
            }
            self.changed();
        }
    }
}

/// Restores each of `jobs` parked ([`Replica::restore_parked_now`]) and records its entry
/// in its directory where it differs (its expiry changed while the node was down); those
/// that cannot be restored so are left out.
fn restore_batch(
    jobs: Vec<(ReplicaConfig, CatalogEntry)>,
    under: RestoreUnder,
) -> Vec<(CatalogEntry, Box<Parked>)> {
    let mut restored = Vec::with_capacity(jobs.len());
    for (cfg, entry) in jobs {
        let dir = cfg.data_dir.clone().expect("may_restore: a data directory");
        match Replica::restore_parked_now(cfg, under) {
            Ok(Some(parked)) => {
                record_entry(&dir, &entry);
                restored.push((entry, Box::new(parked)));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(filter = entry.name, error = %e, "not restored parked: starting it");
            }
        }
    }
    restored
}
