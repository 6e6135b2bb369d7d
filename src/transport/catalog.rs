//! The filter catalog (docs/DESIGN.md section 8): which filters exist cluster-wide, created and
//! dropped at run time. Every node watches it and starts or stops its replica of each filter.
//!
//! An entry is a filter's name, its [`FilterSpec`] and its **generation**: a number that grows
//! with every create in the catalog, so that a dropped and re-created name is a new
//! incarnation whose replicas refuse everything of the old one (envelopes, snapshots, log
//! records and replica id claims are all tagged with it). Creates are compare-and-set: of two
//! concurrent creates of one name exactly one wins everywhere; a create with the spec that
//! exists already is answered with the existing entry (idempotent), one with another spec is
//! refused with [`CatalogError::Exists`] naming it.
//!
//! Two stores: [`MemoryCatalog`] for the in-process bus (one per bus, shared by every node of
//! the process) and the NATS JetStream KV bucket of [`crate::transport::NatsTransport::catalog`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::kind::FilterSpec;

/// One filter of the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The filter's name (a subject token, see [`crate::transport::is_token`]).
    pub name: String,
    /// Its kind and size, equal on every replica.
    pub spec: FilterSpec,
    /// The incarnation: larger for every create in the catalog (the KV revision of the create
    /// over NATS). Filters of a node's configuration file have generation 0.
    pub generation: u64,
    /// When it was created, milliseconds since the UNIX epoch (for operators).
    pub created_ms: u64,
}

/// What a catalog stores under a filter's name (the generation is the store's revision).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredEntry {
    pub spec: FilterSpec,
    pub created_ms: u64,
}

impl StoredEntry {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a catalog entry encodes")
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    pub(crate) fn entry(self, name: String, generation: u64) -> CatalogEntry {
        CatalogEntry {
            name,
            spec: self.spec,
            generation,
            created_ms: self.created_ms,
        }
    }
}

/// A change of the catalog, in the order the store made them.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogChange {
    /// A filter exists (created, or found when the watch began).
    Put(CatalogEntry),
    /// The filter of that name was dropped.
    Dropped {
        /// Its name.
        name: String,
    },
}

/// A catalog's changes: first one [`CatalogChange::Put`] per filter that exists, then every
/// change as it happens. An error ends it: watch again (and reconcile with what the first
/// part lists).
pub type CatalogWatch = BoxStream<'static, Result<CatalogChange, CatalogError>>;

/// Why a catalog operation failed.
#[derive(Debug, Clone, Error, PartialEq)]
#[non_exhaustive]
pub enum CatalogError {
    /// A filter of that name exists with another spec (concurrent creates: the first wins).
    #[error(
        "filter `{name}` exists with another spec: {} (generation {generation}); drop it first",
        serde_json::to_string(existing).unwrap_or_default()
    )]
    Exists {
        /// The name.
        name: String,
        /// The spec it has.
        existing: FilterSpec,
        /// Its generation.
        generation: u64,
    },
    /// The store could not be reached or refused the operation (retry).
    #[error("filter catalog: {0}")]
    Unavailable(String),
    /// An entry of the store does not decode (written by something else).
    #[error("filter catalog: entry `{name}` is unreadable: {reason}")]
    Corrupt {
        /// Its key.
        name: String,
        /// Why.
        reason: String,
    },
}

/// Outcome of [`Catalog::create`].
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    /// The entry, new or existing.
    pub entry: CatalogEntry,
    /// Whether this call created it (`false`: it existed with the same spec).
    pub new: bool,
}

/// A store of the filter catalog.
pub trait Catalog: Send + Sync + 'static {
    /// Creates `name` with `spec`, or answers the entry that exists with an equal spec;
    /// [`CatalogError::Exists`] if it exists with another.
    fn create(
        &self,
        name: String,
        spec: FilterSpec,
    ) -> BoxFuture<'static, Result<Created, CatalogError>>;

    /// Drops `name`; the entry dropped, `None` if there was none.
    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>>;

    /// The entry of `name`.
    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>>;

    /// Every entry, by name.
    fn list(&self) -> BoxFuture<'static, Result<Vec<CatalogEntry>, CatalogError>>;

    /// The entries that exist, then the changes (see [`CatalogWatch`]).
    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>>;
}

/// Milliseconds since the UNIX epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The catalog of an in-process bus: a map, a revision counter and the watchers' channels.
#[derive(Clone, Default)]
pub struct MemoryCatalog {
    inner: Arc<Mutex<MemoryState>>,
}

#[derive(Default)]
struct MemoryState {
    entries: BTreeMap<String, CatalogEntry>,
    revision: u64,
    watchers: Vec<mpsc::UnboundedSender<Result<CatalogChange, CatalogError>>>,
}

impl MemoryState {
    fn announce(&mut self, change: CatalogChange) {
        self.watchers
            .retain(|w| w.unbounded_send(Ok(change.clone())).is_ok());
    }
}

impl MemoryCatalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.inner.lock().expect("catalog lock")
    }
}

impl std::fmt::Debug for MemoryCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCatalog")
            .field("filters", &self.state().entries.len())
            .finish()
    }
}

impl Catalog for MemoryCatalog {
    fn create(
        &self,
        name: String,
        spec: FilterSpec,
    ) -> BoxFuture<'static, Result<Created, CatalogError>> {
        let mut s = self.state();
        let result = match s.entries.get(&name) {
            Some(e) if e.spec == spec => Ok(Created {
                entry: e.clone(),
                new: false,
            }),
            Some(e) => Err(CatalogError::Exists {
                name,
                existing: e.spec.clone(),
                generation: e.generation,
            }),
            None => {
                s.revision += 1;
                let entry = CatalogEntry {
                    name: name.clone(),
                    spec,
                    generation: s.revision,
                    created_ms: now_ms(),
                };
                s.entries.insert(name, entry.clone());
                s.announce(CatalogChange::Put(entry.clone()));
                Ok(Created { entry, new: true })
            }
        };
        futures::future::ready(result).boxed()
    }

    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let mut s = self.state();
        let dropped = s.entries.remove(&name);
        if dropped.is_some() {
            s.revision += 1;
            s.announce(CatalogChange::Dropped { name });
        }
        futures::future::ready(Ok(dropped)).boxed()
    }

    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let found = self.state().entries.get(&name).cloned();
        futures::future::ready(Ok(found)).boxed()
    }

    fn list(&self) -> BoxFuture<'static, Result<Vec<CatalogEntry>, CatalogError>> {
        let all = self.state().entries.values().cloned().collect();
        futures::future::ready(Ok(all)).boxed()
    }

    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>> {
        let mut s = self.state();
        let (tx, rx) = mpsc::unbounded();
        // The snapshot and the registration under one lock: no change falls between them.
        for e in s.entries.values() {
            let _ = tx.unbounded_send(Ok(CatalogChange::Put(e.clone())));
        }
        s.watchers.push(tx);
        futures::future::ready(Ok(rx.boxed())).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FilterKind;

    fn spec(capacity: u64) -> FilterSpec {
        FilterSpec::new(FilterKind::GBloom, capacity, 0.01)
    }

    #[test]
    fn creates_are_compare_and_set_and_generations_grow() {
        futures::executor::block_on(async {
            let c = MemoryCatalog::new();
            let mut watch = c.watch().await.unwrap();
            let a = c.create("a".into(), spec(10)).await.unwrap();
            assert!(a.new);
            // Same spec: idempotent; another: refused, naming the existing one.
            let again = c.create("a".into(), spec(10)).await.unwrap();
            assert_eq!(
                (again.new, again.entry.generation),
                (false, a.entry.generation)
            );
            let clash = c.create("a".into(), spec(20)).await.unwrap_err();
            assert!(
                matches!(&clash, CatalogError::Exists { existing, .. } if existing.capacity == 10)
            );
            assert!(clash.to_string().contains("\"capacity\":10"), "{clash}");
            assert_eq!(
                c.drop_filter("a".into()).await.unwrap(),
                Some(a.entry.clone())
            );
            assert_eq!(c.drop_filter("a".into()).await.unwrap(), None);
            let b = c.create("a".into(), spec(20)).await.unwrap();
            assert!(b.entry.generation > a.entry.generation);
            let seen: Vec<_> = (&mut watch).take(3).map(Result::unwrap).collect().await;
            assert_eq!(
                seen,
                [
                    CatalogChange::Put(a.entry),
                    CatalogChange::Dropped { name: "a".into() },
                    CatalogChange::Put(b.entry.clone()),
                ]
            );
            // A new watch starts with what exists.
            let mut fresh = c.watch().await.unwrap();
            assert_eq!(
                fresh.next().await.unwrap().unwrap(),
                CatalogChange::Put(b.entry)
            );
        });
    }
}
