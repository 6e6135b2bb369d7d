//! The filter catalog in a NATS JetStream KV bucket (see [`super::catalog`]): a filter's name
//! is its key, its spec the value (JSON, readable with `nats kv get`), and the revision of the
//! create its generation. Creates are KV creates (compare-and-set on "no live value"), drops
//! delete at the revision read from the stream's leader, and a node follows the bucket with
//! one watcher (one ordered consumer) whatever the number of filters.

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::OnceCell;

use super::catalog::{
    Catalog, CatalogChange, CatalogEntry, CatalogError, CatalogWatch, Created, StoredEntry, now_ms,
};
use crate::core::kind::FilterSpec;
use std::sync::Arc;

/// The catalog of a NATS cluster. Made by [`super::NatsTransport::catalog`]; cheap to clone.
#[derive(Clone)]
pub struct KvCatalog {
    client: async_nats::Client,
    bucket: String,
    replicas: usize,
    store: Arc<OnceCell<kv::Store>>,
}

impl std::fmt::Debug for KvCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCatalog")
            .field("bucket", &self.bucket)
            .finish()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Unavailable(format!("{what}: {e}"))
}

/// A stored value as a catalog entry.
fn decode(name: String, value: &[u8], revision: u64) -> Result<CatalogEntry, CatalogError> {
    StoredEntry::decode(value)
        .map(|s| s.entry(name.clone(), revision))
        .map_err(|e| CatalogError::Corrupt {
            name,
            reason: e.to_string(),
        })
}

impl KvCatalog {
    pub(crate) fn new(client: async_nats::Client, bucket: String, replicas: usize) -> Self {
        KvCatalog {
            client,
            bucket,
            replicas,
            store: Arc::new(OnceCell::new()),
        }
    }

    /// The bucket, opened or created once (creating with one configuration is idempotent on
    /// the server, so nodes starting together end up with the one bucket).
    async fn store(&self) -> Result<kv::Store, CatalogError> {
        self.store
            .get_or_try_init(|| async {
                let js = async_nats::jetstream::new(self.client.clone());
                if let Ok(s) = js.get_key_value(self.bucket.clone()).await {
                    return Ok(s);
                }
                js.create_key_value(kv::Config {
                    bucket: self.bucket.clone(),
                    description: "crpf filter catalog".into(),
                    history: 1,
                    num_replicas: self.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| match super::nats::no_jetstream(&self.client) {
                    // Not a passing state: say what fixes it.
                    Some(missing) => unavailable("opening the catalog bucket", missing),
                    None => unavailable("opening the catalog bucket", e),
                })
            })
            .await
            .cloned()
    }

    /// The live entry of `name` as the stream's leader holds it, with its revision.
    async fn current(
        store: &kv::Store,
        name: &str,
    ) -> Result<Option<(CatalogEntry, u64)>, CatalogError> {
        let found = super::nats::leader_get(store, name)
            .await
            .map_err(|e| unavailable("reading the catalog", e))?;
        found
            .map(|(value, revision)| Ok((decode(name.into(), &value, revision)?, revision)))
            .transpose()
    }

    async fn create_entry(&self, name: String, spec: FilterSpec) -> Result<Created, CatalogError> {
        let store = self.store().await?;
        let value = StoredEntry {
            spec: spec.clone(),
            created_ms: now_ms(),
        };
        // Each turn loses one race: to a create (then the entry answers) or a drop.
        for _ in 0..4 {
            match store.create(&name, Bytes::from(value.encode())).await {
                Ok(revision) => {
                    return Ok(Created {
                        entry: value.entry(name, revision),
                        new: true,
                    });
                }
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(unavailable("creating a filter", e)),
            }
            match Self::current(&store, &name).await? {
                Some((entry, _)) if entry.spec == spec => {
                    return Ok(Created { entry, new: false });
                }
                Some((entry, _)) => {
                    return Err(CatalogError::Exists {
                        name,
                        existing: entry.spec,
                        generation: entry.generation,
                    });
                }
                // Dropped meanwhile: create again.
                None => {}
            }
        }
        Err(CatalogError::Unavailable(format!(
            "creating `{name}`: it kept being created and dropped concurrently"
        )))
    }

    async fn drop_entry(&self, name: String) -> Result<Option<CatalogEntry>, CatalogError> {
        let store = self.store().await?;
        for _ in 0..4 {
            let Some((entry, revision)) = Self::current(&store, &name).await? else {
                return Ok(None);
            };
            match store.delete_expect_revision(&name, Some(revision)).await {
                Ok(()) => return Ok(Some(entry)),
                // Dropped (or re-created) meanwhile: look again.
                Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => {}
                Err(e) => return Err(unavailable("dropping a filter", e)),
            }
        }
        Err(CatalogError::Unavailable(format!(
            "dropping `{name}`: it kept changing concurrently"
        )))
    }

    async fn watch_entries(&self) -> Result<CatalogWatch, CatalogError> {
        let store = self.store().await?;
        let watch = store
            .watch_with_history(">")
            .await
            .map_err(|e| unavailable("watching the catalog", e))?;
        Ok(watch
            .map(|e| {
                let e = e.map_err(|e| unavailable("watching the catalog", e))?;
                Ok(match e.operation {
                    kv::Operation::Put => CatalogChange::Put(decode(e.key, &e.value, e.revision)?),
                    kv::Operation::Delete | kv::Operation::Purge => {
                        CatalogChange::Dropped { name: e.key }
                    }
                })
            })
            .boxed())
    }

    /// Every live entry: a watch read until it has delivered what existed when it began.
    async fn list_entries(&self) -> Result<Vec<CatalogEntry>, CatalogError> {
        let store = self.store().await?;
        // A fresh look (`Store::status` answers the info cached when the bucket was opened):
        // a watch of an empty bucket would wait for its first entry.
        let empty = store
            .stream
            .get_info()
            .await
            .map_err(|e| unavailable("reading the catalog", e))?
            .state
            .messages
            == 0;
        let mut all = std::collections::BTreeMap::new();
        if empty {
            return Ok(Vec::new());
        }
        let mut watch = store
            .watch_with_history(">")
            .await
            .map_err(|e| unavailable("listing the catalog", e))?;
        while let Some(e) = watch.next().await {
            let e = e.map_err(|e| unavailable("listing the catalog", e))?;
            let last = e.delta == 0;
            match e.operation {
                kv::Operation::Put => {
                    all.insert(e.key.clone(), decode(e.key, &e.value, e.revision)?);
                }
                _ => {
                    all.remove(&e.key);
                }
            }
            if last {
                break;
            }
        }
        Ok(all.into_values().collect())
    }
}

impl Catalog for KvCatalog {
    fn create(
        &self,
        name: String,
        spec: FilterSpec,
    ) -> BoxFuture<'static, Result<Created, CatalogError>> {
        let this = self.clone();
        async move { this.create_entry(name, spec).await }.boxed()
    }

    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let this = self.clone();
        async move { this.drop_entry(name).await }.boxed()
    }

    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let this = self.clone();
        async move {
            let store = this.store().await?;
            Ok(Self::current(&store, &name).await?.map(|(e, _)| e))
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'static, Result<Vec<CatalogEntry>, CatalogError>> {
        let this = self.clone();
        async move { this.list_entries().await }.boxed()
    }

    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>> {
        let this = self.clone();
        async move { this.watch_entries().await }.boxed()
    }
}
