//! The filter catalog in a NATS JetStream KV bucket (see [`super::catalog`]): a filter's name
//! is its key, its record the value (JSON, readable with `nats kv get`), and the revision of the
//! create its generation. Creates and drops are compare-and-set writes against the revision
//! read from the stream's leader (a drop writes the record of the drop over the entry; nothing
//! is deleted), and a node follows the bucket with one watcher (one ordered consumer) whatever
//! the number of filters.
//!
//! A bucket found missing (a JetStream store lost, the bucket deleted) is made again at the
//! next operation: the handle forgets the bucket it opened after any failure.

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use super::catalog::{
    Catalog, CatalogChange, CatalogEntry, CatalogError, CatalogWatch, CreateStep, Created, Listing,
    Opened, Reoffered, Seal, StoredEntry, create_step, expired, expiry_step, now_ms, offered,
    reoffer_step,
};
use crate::core::kind::FilterSpec;
use crate::wire::AuthKeys;
use std::sync::{Arc, Mutex};

/// How often a watch looks whether its bucket still exists.
const BUCKET_PROBE: std::time::Duration = std::time::Duration::from_secs(3);

/// The catalog of a NATS cluster. Made by [`super::NatsTransport::catalog`]; cheap to clone.
#[derive(Clone)]
pub struct KvCatalog {
    client: async_nats::Client,
    bucket: String,
    replicas: usize,
    /// The bucket as opened; forgotten after a failure, so that a lost one is made again.
    store: Arc<Mutex<Option<kv::Store>>>,
    seal: Seal,
}

impl std::fmt::Debug for KvCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCatalog")
            .field("bucket", &self.bucket)
            .finish()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Unavailable(format!(
        "{what}: {e} (is JetStream up, with a quorum of its servers reachable?)"
    ))
}

impl KvCatalog {
    pub(crate) fn new(client: async_nats::Client, bucket: String, replicas: usize) -> Self {
        KvCatalog {
            client,
            bucket,
            replicas,
            store: Arc::new(Mutex::new(None)),
            seal: Seal::default(),
        }
    }

    /// The bucket, opened (or created: creating with one configuration is idempotent on the
    /// server, so nodes starting together end up with the one bucket).
    async fn store(&self) -> Result<kv::Store, CatalogError> {
        if let Some(store) = self.store.lock().expect("catalog store lock").clone() {
            return Ok(store);
        }
        let js = async_nats::jetstream::new(self.client.clone());
        let store = match js.get_key_value(self.bucket.clone()).await {
            Ok(s) => s,
            Err(_) => js
                .create_key_value(kv::Config {
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
                })?,
        };
        *self.store.lock().expect("catalog store lock") = Some(store.clone());
        Ok(store)
    }

    /// Runs `op` on the bucket; after a failure the bucket is opened afresh next time (it may
    /// have been lost and must be made again).
    async fn with_store<T, F>(&self, op: impl FnOnce(kv::Store) -> F) -> Result<T, CatalogError>
    where
        F: std::future::Future<Output = Result<T, CatalogError>>,
    {
        let result = op(self.store().await?).await;
        if matches!(result, Err(CatalogError::Unavailable(_))) {
            self.store.lock().expect("catalog store lock").take();
        }
        result
    }

    /// The record of `name` as the stream's leader holds it, opened, with its revision.
    async fn current(
        &self,
        store: &kv::Store,
        name: &str,
    ) -> Result<Option<(Opened, u64)>, CatalogError> {
        let found = super::nats::leader_raw(store, name)
            .await
            .map_err(|e| unavailable("reading the catalog", e))?;
        Ok(found.map(|(value, revision)| {
            (
                self.seal.open_record(name, value.as_deref(), revision),
                revision,
            )
        }))
    }

    /// Writes `value` under `name` where the record at `revision` (none: no record) still is.
    async fn write(
        store: &kv::Store,
        name: &str,
        value: Vec<u8>,
        revision: Option<u64>,
    ) -> Result<Option<u64>, CatalogError> {
        let written = match revision {
            None => store.create(name, Bytes::from(value)).await.map_err(|e| {
                (e.kind() != kv::CreateErrorKind::AlreadyExists).then_some(e.to_string())
            }),
            Some(r) => store
                .update(name, Bytes::from(value), r)
                .await
                .map_err(|e| {
                    (e.kind() != kv::UpdateErrorKind::WrongLastRevision).then_some(e.to_string())
                }),
        };
        match written {
            Ok(revision) => Ok(Some(revision)),
            // Lost a race: look again.
            Err(None) => Ok(None),
            Err(Some(e)) => Err(unavailable("writing to the catalog", e)),
        }
    }

    async fn create_entry(&self, name: String, spec: FilterSpec) -> Result<Created, CatalogError> {
        self.with_store(|store| async move {
            // Each turn loses one race: to a create (then the entry answers) or a drop.
            for _ in 0..4 {
                let current = self.current(&store, &name).await?;
                let revision = current.as_ref().map(|(_, r)| *r);
                let replaces = match create_step(&name, &spec, current.map(|(o, _)| o)) {
                    CreateStep::Done(created) => return Ok(created),
                    CreateStep::Refused(e) => return Err(e),
                    CreateStep::Write { replaces } => replaces,
                };
                let stored = StoredEntry::created(spec.clone(), replaces, now_ms());
                let value = self.seal.entry(&name, stored.clone());
                if let Some(generation) = Self::write(&store, &name, value, revision).await? {
                    let entry = stored.entry(name, generation);
                    return Ok(Created { entry, new: true });
                }
            }
            Err(CatalogError::Unavailable(format!(
                "creating `{name}`: it kept being created and dropped concurrently"
            )))
        })
        .await
    }

    async fn drop_entry(&self, name: String) -> Result<Option<CatalogEntry>, CatalogError> {
        self.with_store(|store| async move {
            for _ in 0..4 {
                let Some((Opened::Live(entry), revision)) = self.current(&store, &name).await?
                else {
                    return Ok(None);
                };
                let value = self.seal.drop_record(&name, entry.generation);
                if Self::write(&store, &name, value, Some(revision))
                    .await?
                    .is_some()
                {
                    return Ok(Some(entry));
                }
            }
            Err(CatalogError::Unavailable(format!(
                "dropping `{name}`: it kept changing concurrently"
            )))
        })
        .await
    }

    async fn set_entry_expiry(
        &self,
        name: String,
        expires_ms: Option<u64>,
    ) -> Result<Option<CatalogEntry>, CatalogError> {
        self.with_store(|store| async move {
            for _ in 0..4 {
                let current = self.current(&store, &name).await?;
                let revision = current.as_ref().map(|(_, r)| *r);
                let Some(entry) = expiry_step(current.map(|(o, _)| o), expires_ms) else {
                    return Ok(None);
                };
                let value = self.seal.entry(&name, offered(&entry));
                if Self::write(&store, &name, value, revision).await?.is_some() {
                    return Ok(Some(entry));
                }
            }
            Err(CatalogError::Unavailable(format!(
                "setting the expiry of `{name}`: it kept changing concurrently"
            )))
        })
        .await
    }

    async fn expire_entry(&self, name: String, generation: u64) -> Result<bool, CatalogError> {
        self.with_store(|store| async move {
            for _ in 0..4 {
                let current = self.current(&store, &name).await?;
                let revision = current.as_ref().map(|(_, r)| *r);
                if expired(current.map(|(o, _)| o), generation, now_ms()).is_none() {
                    return Ok(false);
                }
                let value = self.seal.drop_record(&name, generation);
                if Self::write(&store, &name, value, revision).await?.is_some() {
                    return Ok(true);
                }
            }
            Err(CatalogError::Unavailable(format!(
                "expiring `{name}`: it kept changing concurrently"
            )))
        })
        .await
    }

    async fn reoffer_entry(&self, entry: CatalogEntry) -> Result<Reoffered, CatalogError> {
        self.with_store(|store| async move {
            for _ in 0..4 {
                let current = self.current(&store, &entry.name).await?;
                let revision = current.as_ref().map(|(_, r)| *r);
                if let Err(answer) = reoffer_step(&entry, current.map(|(o, _)| o)) {
                    return Ok(answer);
                }
                let value = self.seal.entry(&entry.name, offered(&entry));
                if Self::write(&store, &entry.name, value, revision)
                    .await?
                    .is_some()
                {
                    return Ok(Reoffered::Restored);
                }
            }
            Err(CatalogError::Unavailable(format!(
                "offering `{}` again: it kept changing concurrently",
                entry.name
            )))
        })
        .await
    }

    fn change(&self, e: kv::Entry) -> CatalogChange {
        let value = match e.operation {
            kv::Operation::Put => Some(&e.value[..]),
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        self.seal
            .open_record(&e.key, value, e.revision)
            .change(e.key.clone())
    }

    /// Whether the bucket holds nothing (a fresh look: `Store::status` answers the info
    /// cached when the bucket was opened). A watch of an empty bucket would wait for its
    /// first entry before saying it is current.
    async fn is_empty(store: &kv::Store) -> Result<bool, CatalogError> {
        Ok(store
            .stream
            .clone()
            .info()
            .await
            .map_err(|e| unavailable("reading the catalog", e))?
            .state
            .messages
            == 0)
    }

    async fn watch_entries(&self) -> Result<CatalogWatch, CatalogError> {
        self.with_store(|store| async move {
            let empty = Self::is_empty(&store).await?;
            let created = store
                .stream
                .get_info()
                .await
                .map_err(|e| unavailable("reading the catalog", e))?
                .created;
            let watch = store
                .watch_with_history(">")
                .await
                .map_err(|e| unavailable("watching the catalog", e))?;
            let this = self.clone();
            // `Current` once: at once for an empty bucket, else after the entry that had
            // nothing pending behind it when delivered.
            let mut current = empty;
            let first = futures::stream::iter(empty.then_some(Ok(CatalogChange::Current)));
            let changes = watch.flat_map(move |e| {
                let out = match e {
                    Err(e) => {
                        this.store.lock().expect("catalog store lock").take();
                        vec![Err(unavailable("watching the catalog", e))]
                    }
                    Ok(e) => {
                        let last = e.delta == 0;
                        let mut out = vec![Ok(this.change(e))];
                        if last && !current {
                            current = true;
                            out.push(Ok(CatalogChange::Current));
                        }
                        out
                    }
                };
                futures::stream::iter(out)
            });
            // A watch of a bucket that is deleted, or lost with the server's store, says
            // nothing: a look at the bucket every few seconds ends it with an error, so that
            // the watcher watches again (and the bucket is made anew).
            let this = self.clone();
            let probe = futures::stream::unfold((), move |()| {
                let (this, store) = (this.clone(), store.clone());
                async move {
                    loop {
                        tokio::time::sleep(BUCKET_PROBE).await;
                        let why = match store.stream.get_info().await {
                            Ok(info) if info.created == created => continue,
                            Ok(_) => "the bucket was made anew".to_string(),
                            Err(e) => e.to_string(),
                        };
                        this.store.lock().expect("catalog store lock").take();
                        return Some((Err(unavailable("watching the catalog", why)), ()));
                    }
                }
            });
            Ok(futures::stream::select(first.chain(changes), probe).boxed())
        })
        .await
    }

    /// Every record: a watch read until it has delivered what existed when it began.
    async fn list_entries(&self) -> Result<Listing, CatalogError> {
        let mut listing = Listing::default();
        let mut watch = self.watch_entries().await?;
        while let Some(change) = watch.next().await {
            match change? {
                CatalogChange::Current => return Ok(listing),
                change => listing.add(change),
            }
        }
        Err(CatalogError::Unavailable(
            "listing the catalog: the watch ended early".into(),
        ))
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
            let this = &this;
            this.with_store(|store| async move {
                Ok(match this.current(&store, &name).await? {
                    Some((Opened::Live(entry), _)) => Some(entry),
                    _ => None,
                })
            })
            .await
        }
        .boxed()
    }

    fn listing(&self) -> BoxFuture<'static, Result<Listing, CatalogError>> {
        let this = self.clone();
        async move { this.list_entries().await }.boxed()
    }

    fn set_expiry(
        &self,
        name: String,
        expires_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let this = self.clone();
        async move { this.set_entry_expiry(name, expires_ms).await }.boxed()
    }

    fn expire(
        &self,
        name: String,
        generation: u64,
    ) -> BoxFuture<'static, Result<bool, CatalogError>> {
        let this = self.clone();
        async move { this.expire_entry(name, generation).await }.boxed()
    }

    fn reoffer(&self, entry: CatalogEntry) -> BoxFuture<'static, Result<Reoffered, CatalogError>> {
        let this = self.clone();
        async move { this.reoffer_entry(entry).await }.boxed()
    }

    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>> {
        let this = self.clone();
        async move { this.watch_entries().await }.boxed()
    }

    fn sealed_with(&self, keys: Option<AuthKeys>) -> Arc<dyn Catalog> {
        Arc::new(KvCatalog {
            seal: Seal::new(keys),
            ..self.clone()
        })
    }
}
