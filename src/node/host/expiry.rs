//! Filters that expire (`EXPIRE`): each node drops a hosted filter whose expiry has come by
//! its own clock, through [`crate::transport::Catalog::expire`] (the first node to write the
//! drop record wins; every node applies it as a drop).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::dirs::{incarnation_dir, write_entry_file};
use super::{CATALOG_CHANGES, Inner};
use crate::transport::CatalogEntry;

/// The expiries a node knows of.
#[derive(Default)]
pub(super) struct Expiries {
    /// Of the hosted filters, by time: (ms since the epoch, name, generation). An item left
    /// behind (the filter dropped, its expiry moved or cleared) does nothing: the catalog
    /// drops only the generation named, and only once its own entry has expired.
    due: Mutex<BTreeSet<(u64, String, u64)>>,
    /// Wakes [`expire_due`] for an expiry noted (it sleeps until the earliest one).
    noted: Arc<tokio::sync::Notify>,
}

/// How late a node may look for filters whose expiry has come (`EXPIRE`): it sleeps until
/// the earliest expiry it knows (woken by a new one), at most this long.
pub(super) const EXPIRY_TICK: Duration = Duration::from_secs(1);

impl Inner {
    /// Notes the expiry of `entry`, if it has one, for [`expire_due`].
    pub(super) fn schedule_expiry(&self, entry: &CatalogEntry) {
        if let Some(at) = entry.expires_ms {
            self.expiries.due.lock().expect("expiries lock").insert((
                at,
                entry.name.clone(),
                entry.generation,
            ));
            self.expiries.noted.notify_one();
        }
    }

    /// The entry of a hosted generation was written again with another expiry (`EXPIRE`,
    /// `PERSIST`): kept, scheduled, and recorded in its data directory (a node without
    /// NATS rebuilds its catalog from there).
    pub(super) async fn expiry_changed(&self, entry: &CatalogEntry) {
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
}

/// Drops the hosted filters whose expiry has come, by this node's clock, until the node
/// stops: each through [`Catalog::expire`] (a drop record, which every node applies as a
/// drop; the first node whose clock says so writes it).
pub(super) async fn expire_due(inner: Weak<Inner>) {
    let mut wait = EXPIRY_TICK;
    loop {
        {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            // Not holding the node while waiting (it may stop); a note meanwhile is kept
            // as the Notify's permit.
            let noted = inner.expiries.noted.clone();
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
            let mut expiries = inner.expiries.due.lock().expect("expiries lock");
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
                            inner.expiries.due.lock().expect("expiries lock").insert((
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
