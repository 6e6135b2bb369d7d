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
//!
//! # Sealed records, and drops as records
//! A store holds one record per name: a live entry, or the record of its drop (a tombstone
//! naming the generation dropped); nothing is ever deleted, so a node that was down still
//! reads every drop it missed, and a name the store does not know was never dropped (a lost
//! or new store is not a drop of everything). With a cluster key each record carries an
//! HMAC-SHA256 (the key of the replication frames, [`AuthKeys`]) over its name and contents:
//! a handle made [`Catalog::sealed_with`] the keys seals what it writes and reports any
//! record that does not verify as [`CatalogChange::Rejected`] rather than acting on it, so
//! only key holders create or drop filters. A live entry names the generation whose drop it
//! follows (`replaces`): a sealed value written again later (a replay) cannot stand in for a
//! drop. A record a store lost can be offered again by a node that hosts the filter
//! ([`Catalog::reoffer`]), with its generation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::kind::FilterSpec;
use crate::wire::AuthKeys;

/// One filter of the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The filter's subject name ([`crate::names`]: its key, or the key encoded).
    pub name: String,
    /// Its kind and size, equal on every replica.
    pub spec: FilterSpec,
    /// The incarnation: larger for every create in the catalog (the KV revision of the create
    /// over NATS). Filters of a node's configuration file have generation 0.
    pub generation: u64,
    /// When it was created, milliseconds since the UNIX epoch (for operators).
    pub created_ms: u64,
    /// The generation of the name whose drop this create followed (`None`: the name had no
    /// record). A node hosting an older generation replaces it only by an entry that
    /// replaces at least that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<u64>,
    /// When it expires, milliseconds since the UNIX epoch (`EXPIRE`): every node drops it
    /// then, by its own clock, as a drop ([`Catalog::expire`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

/// A live entry as stored under its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredEntry {
    pub spec: FilterSpec,
    pub created_ms: u64,
    /// Set when a node offers a lost entry again: its generation (else the store's revision
    /// of the write is the generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<u64>,
    /// The key, for a name that is not its own subject name and is UTF-8 ([`crate::names`]):
    /// for people reading the store (the name it is stored under says it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// See [`CatalogEntry::expires_ms`] (absent: none, as in every entry written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// The cluster key's HMAC (hex) over the name and the fields above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

/// Generations from here up were chosen by their create and sealed into its record
/// ([`StoredEntry::created`]); below, a generation is the store's revision of a create made
/// before (a replay of such a record written again gets a new one).
pub(crate) const CHOSEN_GENERATIONS: u64 = 1 << 40;

/// Whether `generation` was chosen by its create (see [`CHOSEN_GENERATIONS`]): then no
/// stranger can have made it, and a later one is a key holder's create of the name.
pub(crate) fn chosen_generation(generation: u64) -> bool {
    generation >= CHOSEN_GENERATIONS
}

impl StoredEntry {
    /// The entry a create writes at `now_ms`, following the drop of `replaces`. Its
    /// generation is the time of the create (past the one it replaces), sealed with the
    /// entry: a store that lost everything starts its revisions again, so revisions would
    /// give a name's new filter the generation of an old one, whose replicas, records and
    /// drops would then pass for the new one's.
    pub(crate) fn created(spec: FilterSpec, replaces: Option<u64>, now_ms: u64) -> Self {
        // (A keyless store's bare delete drops every generation: `u64::MAX`.)
        let after_drop = replaces.filter(|&r| r != u64::MAX).map_or(0, |r| r + 1);
        let generation = now_ms.max(after_drop).max(CHOSEN_GENERATIONS);
        StoredEntry {
            spec,
            created_ms: now_ms,
            generation: Some(generation),
            replaces,
            key: None,
            expires_ms: None,
            seal: None,
        }
    }

    /// The catalog entry it is for `name`, written at `generation`.
    pub(crate) fn entry(self, name: String, generation: u64) -> CatalogEntry {
        CatalogEntry {
            name,
            spec: self.spec,
            generation: self.generation.unwrap_or(generation),
            created_ms: self.created_ms,
            replaces: self.replaces,
            expires_ms: self.expires_ms,
        }
    }
}

/// The `key` of an entry stored under `name`: its key, if it is not `name` and is UTF-8.
fn key_field(name: &str) -> Option<String> {
    let key = crate::names::key_of(name)?;
    (key != name.as_bytes())
        .then(|| String::from_utf8(key).ok())
        .flatten()
}

/// The record of a drop, stored under the name in place of its entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredDrop {
    pub dropped_generation: u64,
    pub dropped_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

/// What a record of the store says, once opened with a handle's keys.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Opened {
    Live(CatalogEntry),
    Dropped {
        generation: u64,
    },
    /// Not to be acted on: unsealed, sealed with another key, or not a record at all.
    Rejected(&'static str),
}

/// The keys a catalog handle seals with and checks against (none: a keyless cluster, which
/// seals nothing and takes every record that decodes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Seal {
    keys: Option<AuthKeys>,
}

/// Domain separation: a catalog seal is never a valid frame MAC, nor the reverse.
const SEAL_CONTEXT: &[u8] = b"crpf catalog record v1\0";

impl Seal {
    pub(crate) fn new(keys: Option<AuthKeys>) -> Self {
        Seal { keys }
    }

    /// Whether records must carry a seal.
    pub(crate) fn sealing(&self) -> bool {
        self.keys.is_some()
    }

    fn message(name: &str, unsealed: &impl Serialize) -> Vec<u8> {
        let mut m = SEAL_CONTEXT.to_vec();
        m.extend_from_slice(name.as_bytes());
        m.push(0);
        m.extend_from_slice(&serde_json::to_vec(unsealed).expect("a catalog record encodes"));
        m
    }

    fn sign(&self, name: &str, unsealed: &impl Serialize) -> Option<String> {
        let mac = self.keys.as_ref()?.sign(&Self::message(name, unsealed));
        Some(mac.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// `None` if it verifies (or no key is asked for), else the reason to reject it.
    fn check(
        &self,
        name: &str,
        unsealed: &impl Serialize,
        seal: Option<&str>,
    ) -> Option<&'static str> {
        let keys = self.keys.as_ref()?;
        let Some(seal) = seal else {
            return Some("unsigned");
        };
        let mac: Option<Vec<u8>> = (seal.len() % 2 == 0)
            .then(|| {
                (0..seal.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(seal.get(i..i + 2)?, 16).ok())
                    .collect()
            })
            .flatten();
        match mac {
            Some(mac) if keys.verify(&Self::message(name, unsealed), &mac) => None,
            _ => Some("bad_signature"),
        }
    }

    /// The bytes of a live entry, sealed.
    pub(crate) fn entry(&self, name: &str, mut stored: StoredEntry) -> Vec<u8> {
        stored.key = key_field(name);
        stored.seal = None;
        stored.seal = self.sign(name, &stored);
        serde_json::to_vec(&stored).expect("a catalog entry encodes")
    }

    /// The bytes of the drop of `generation`, sealed.
    pub(crate) fn drop_record(&self, name: &str, generation: u64) -> Vec<u8> {
        let mut stored = StoredDrop {
            dropped_generation: generation,
            dropped_ms: now_ms(),
            seal: None,
        };
        stored.seal = self.sign(name, &stored);
        serde_json::to_vec(&stored).expect("a catalog drop encodes")
    }

    /// What the record `value` of `name`, written at `revision`, says.
    pub(crate) fn open(&self, name: &str, value: &[u8], revision: u64) -> Opened {
        // A record without the drop's field anywhere in it is an entry: read as one at once
        // (read through a `Value` first, a node's 100,000 records cost 6% of its start).
        const DROP_FIELD: &[u8] = b"\"dropped_generation\"";
        if !value.windows(DROP_FIELD.len()).any(|w| w == DROP_FIELD) {
            let Ok(e) = serde_json::from_slice::<StoredEntry>(value) else {
                return Opened::Rejected("malformed");
            };
            return self.open_entry(name, e, revision);
        }
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(value) else {
            return Opened::Rejected("malformed");
        };
        if json.get("dropped_generation").is_some() {
            let Ok(mut d) = serde_json::from_value::<StoredDrop>(json) else {
                return Opened::Rejected("malformed");
            };
            let seal = d.seal.take();
            return match self.check(name, &d, seal.as_deref()) {
                Some(reason) => Opened::Rejected(reason),
                None => Opened::Dropped {
                    generation: d.dropped_generation,
                },
            };
        }
        let Ok(e) = serde_json::from_value::<StoredEntry>(json) else {
            return Opened::Rejected("malformed");
        };
        self.open_entry(name, e, revision)
    }

    /// What the entry record `e` of `name`, written at `revision`, says.
    fn open_entry(&self, name: &str, mut e: StoredEntry, revision: u64) -> Opened {
        let seal = e.seal.take();
        if let Some(reason) = self.check(name, &e, seal.as_deref()) {
            return Opened::Rejected(reason);
        }
        if e.key.is_some() && e.key != key_field(name) {
            return Opened::Rejected("malformed");
        }
        Opened::Live(e.entry(name.to_string(), revision))
    }
}

impl Seal {
    /// What a record of `name` written at `revision` says: its bytes, or a bare KV delete
    /// (`None`): a drop of any generation in a keyless cluster, nothing in one with a key.
    pub(crate) fn open_record(&self, name: &str, value: Option<&[u8]>, revision: u64) -> Opened {
        match value {
            Some(value) => self.open(name, value, revision),
            None if self.sealing() => Opened::Rejected("unsigned_drop"),
            None => Opened::Dropped {
                generation: u64::MAX,
            },
        }
    }
}

impl Opened {
    /// The change a watch reports for this record of `name`.
    pub(crate) fn change(self, name: String) -> CatalogChange {
        match self {
            Opened::Live(entry) => CatalogChange::Put(entry),
            Opened::Dropped { generation } => CatalogChange::Dropped {
                name,
                generation: (generation != u64::MAX).then_some(generation),
            },
            Opened::Rejected(reason) => CatalogChange::Rejected { name, reason },
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
        /// The generation dropped (`None`: a keyless store's bare delete, any generation).
        generation: Option<u64>,
    },
    /// A record that is not to be acted on: unsealed or sealed with another key in a cluster
    /// with a key, or not a record at all. Whatever this node hosts under the name stays.
    Rejected {
        /// Its name.
        name: String,
        /// Why (a bounded label: `unsigned`, `bad_signature`, `malformed`, `unsigned_drop`,
        /// `replaced_without_drop`).
        reason: &'static str,
    },
    /// Everything the store held when the watch began has been delivered (once per watch).
    Current,
}

/// A catalog's changes: first one [`CatalogChange::Put`] per filter that exists (and one
/// [`CatalogChange::Dropped`] per drop recorded), then [`CatalogChange::Current`], then every
/// change as it happens. An error ends it: watch again.
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
    #[error("filter catalog unavailable: {0}")]
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

/// Everything a catalog holds, as a handle reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// The live entries, by name.
    pub live: Vec<CatalogEntry>,
    /// The drops recorded: name and generation dropped.
    pub dropped: BTreeMap<String, u64>,
    /// Records not acted on (see [`CatalogChange::Rejected`]), with why.
    pub rejected: BTreeMap<String, &'static str>,
}

/// What became of a [`Catalog::reoffer`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reoffered {
    /// The catalog had no valid record of the name: it has the offered entry again.
    Restored,
    /// The catalog lists the name (this generation or another): nothing written.
    Listed(CatalogEntry),
    /// The catalog recorded the drop of this generation (or a later one): nothing written.
    Dropped(u64),
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

    /// Drops `name` (records its drop); the entry dropped, `None` if there was none.
    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>>;

    /// The entry of `name`.
    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>>;

    /// Every record.
    fn listing(&self) -> BoxFuture<'static, Result<Listing, CatalogError>>;

    /// Every live entry, by name.
    fn list(&self) -> BoxFuture<'static, Result<Vec<CatalogEntry>, CatalogError>> {
        let listing = self.listing();
        async move { Ok(listing.await?.live) }.boxed()
    }

    /// Writes `entry` back, with its generation, where the catalog has no valid record of its
    /// name or only the drop of an older generation: a node offers the filters it hosts to a
    /// catalog that lost them (a lost bucket, a record a stranger replaced).
    fn reoffer(&self, entry: CatalogEntry) -> BoxFuture<'static, Result<Reoffered, CatalogError>>;

    /// Sets (`Some`: milliseconds since the UNIX epoch) or clears the expiry of the live
    /// entry of `name`, keeping its generation: the entry as written, `None` if there is none.
    fn set_expiry(
        &self,
        name: String,
        expires_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let _ = (name, expires_ms);
        futures::future::ready(Err(CatalogError::Unavailable(
            "this catalog does not keep expiries".into(),
        )))
        .boxed()
    }

    /// Drops `name` (records its drop) if its live entry is `generation` and its expiry is
    /// past by this node's clock: whether it did. Every node calls it when a filter it hosts
    /// expires; the first one drops it, the others find it dropped.
    fn expire(
        &self,
        name: String,
        generation: u64,
    ) -> BoxFuture<'static, Result<bool, CatalogError>> {
        let _ = (name, generation);
        futures::future::ready(Ok(false)).boxed()
    }

    /// The records that exist, then the changes (see [`CatalogWatch`]).
    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>>;

    /// A handle on the same store that seals what it writes with `keys` and rejects what
    /// does not verify (none: a keyless cluster).
    fn sealed_with(&self, keys: Option<AuthKeys>) -> Arc<dyn Catalog>;
}

/// Milliseconds since the UNIX epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How a create goes on, given the record the store holds under the name.
pub(crate) enum CreateStep {
    /// Write the new entry (replacing that record, if any), which replaces this generation.
    Write { replaces: Option<u64> },
    /// The name exists with this spec: the answer.
    Done(Created),
    /// It exists with another.
    Refused(CatalogError),
}

/// The next step of creating `name` with `spec` over `current` (opened).
pub(crate) fn create_step(name: &str, spec: &FilterSpec, current: Option<Opened>) -> CreateStep {
    match current {
        None => CreateStep::Write { replaces: None },
        Some(Opened::Dropped { generation }) => CreateStep::Write {
            replaces: Some(generation),
        },
        // Nothing a node acts on: written over (its nodes re-offer what they host first).
        Some(Opened::Rejected(_)) => CreateStep::Write { replaces: None },
        Some(Opened::Live(entry)) if &entry.spec == spec => {
            CreateStep::Done(Created { entry, new: false })
        }
        Some(Opened::Live(entry)) => CreateStep::Refused(CatalogError::Exists {
            name: name.to_string(),
            existing: entry.spec,
            generation: entry.generation,
        }),
    }
}

/// Whether a re-offer of `offered` writes over `current` (opened), else the answer.
// The answer carries an entry, as large as a spec (which grew by go_bloom's `shape`): a
// re-offer is rare, its size does not matter.
#[allow(clippy::result_large_err)]
pub(crate) fn reoffer_step(
    offered: &CatalogEntry,
    current: Option<Opened>,
) -> Result<(), Reoffered> {
    match current {
        None | Some(Opened::Rejected(_)) => Ok(()),
        Some(Opened::Dropped { generation }) if generation >= offered.generation => {
            Err(Reoffered::Dropped(generation))
        }
        Some(Opened::Dropped { .. }) => Ok(()),
        // An older generation listed (a record written again over the offered one's): the
        // offered one, a key holder's later create, takes the name back.
        Some(Opened::Live(entry))
            if entry.generation < offered.generation && chosen_generation(offered.generation) =>
        {
            Ok(())
        }
        Some(Opened::Live(entry)) => Err(Reoffered::Listed(entry)),
    }
}

/// The stored form of an offered entry (with its own generation).
pub(crate) fn offered(entry: &CatalogEntry) -> StoredEntry {
    StoredEntry {
        spec: entry.spec.clone(),
        created_ms: entry.created_ms,
        generation: Some(entry.generation),
        replaces: entry.replaces,
        key: None,
        expires_ms: entry.expires_ms,
        seal: None,
    }
}

/// The live entry of `current` with its expiry set to `expires_ms`, to write over it; `None`
/// if there is no live entry.
pub(crate) fn expiry_step(
    current: Option<Opened>,
    expires_ms: Option<u64>,
) -> Option<CatalogEntry> {
    match current {
        Some(Opened::Live(entry)) => Some(CatalogEntry {
            expires_ms,
            ..entry
        }),
        _ => None,
    }
}

/// Whether `current` is the live entry of `generation`, expired at `now_ms`: the entry to
/// drop.
pub(crate) fn expired(
    current: Option<Opened>,
    generation: u64,
    now_ms: u64,
) -> Option<CatalogEntry> {
    match current {
        Some(Opened::Live(entry))
            if entry.generation == generation
                && entry.expires_ms.is_some_and(|at| at <= now_ms) =>
        {
            Some(entry)
        }
        _ => None,
    }
}

/// The catalog of an in-process bus: the records, a revision counter and the watchers'
/// channels, shared by every handle of the bus (each with its own keys).
#[derive(Clone, Default)]
pub struct MemoryCatalog {
    inner: Arc<Mutex<MemoryState>>,
    seal: Seal,
}

/// A record: its bytes and the revision that wrote it.
type Record = (Vec<u8>, u64);

#[derive(Default)]
struct MemoryState {
    records: BTreeMap<String, Record>,
    revision: u64,
    watchers: Vec<mpsc::UnboundedSender<(String, Record)>>,
}

impl MemoryState {
    fn write(&mut self, name: &str, bytes: Vec<u8>) -> u64 {
        self.revision += 1;
        let record = (bytes, self.revision);
        self.records.insert(name.to_string(), record.clone());
        self.watchers
            .retain(|w| w.unbounded_send((name.to_string(), record.clone())).is_ok());
        self.revision
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

    fn current(&self, s: &MemoryState, name: &str) -> Option<Opened> {
        let (bytes, revision) = s.records.get(name)?;
        Some(self.seal.open(name, bytes, *revision))
    }

    fn change(&self, name: String, (bytes, revision): &Record) -> CatalogChange {
        match self.seal.open(&name, bytes, *revision) {
            Opened::Live(entry) => CatalogChange::Put(entry),
            Opened::Dropped { generation } => CatalogChange::Dropped {
                name,
                generation: Some(generation),
            },
            Opened::Rejected(reason) => CatalogChange::Rejected { name, reason },
        }
    }
}

impl std::fmt::Debug for MemoryCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCatalog")
            .field("records", &self.state().records.len())
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
        let result = match create_step(&name, &spec, self.current(&s, &name)) {
            CreateStep::Done(created) => Ok(created),
            CreateStep::Refused(e) => Err(e),
            CreateStep::Write { replaces } => {
                let stored = StoredEntry::created(spec, replaces, now_ms());
                let generation = s.write(&name, self.seal.entry(&name, stored.clone()));
                Ok(Created {
                    entry: stored.entry(name, generation),
                    new: true,
                })
            }
        };
        futures::future::ready(result).boxed()
    }

    fn drop_filter(
        &self,
        name: String,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let mut s = self.state();
        let dropped = match self.current(&s, &name) {
            Some(Opened::Live(entry)) => {
                let bytes = self.seal.drop_record(&name, entry.generation);
                s.write(&name, bytes);
                Some(entry)
            }
            _ => None,
        };
        futures::future::ready(Ok(dropped)).boxed()
    }

    fn set_expiry(
        &self,
        name: String,
        expires_ms: Option<u64>,
    ) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let mut s = self.state();
        let updated = expiry_step(self.current(&s, &name), expires_ms);
        if let Some(entry) = &updated {
            s.write(&name, self.seal.entry(&name, offered(entry)));
        }
        futures::future::ready(Ok(updated)).boxed()
    }

    fn expire(
        &self,
        name: String,
        generation: u64,
    ) -> BoxFuture<'static, Result<bool, CatalogError>> {
        let mut s = self.state();
        let dropped = expired(self.current(&s, &name), generation, now_ms()).is_some();
        if dropped {
            let bytes = self.seal.drop_record(&name, generation);
            s.write(&name, bytes);
        }
        futures::future::ready(Ok(dropped)).boxed()
    }

    fn get(&self, name: String) -> BoxFuture<'static, Result<Option<CatalogEntry>, CatalogError>> {
        let found = match self.current(&self.state(), &name) {
            Some(Opened::Live(entry)) => Some(entry),
            _ => None,
        };
        futures::future::ready(Ok(found)).boxed()
    }

    fn listing(&self) -> BoxFuture<'static, Result<Listing, CatalogError>> {
        let s = self.state();
        let listing = s
            .records
            .iter()
            .map(|(name, record)| self.change(name.clone(), record))
            .collect();
        futures::future::ready(Ok(listing)).boxed()
    }

    fn reoffer(&self, entry: CatalogEntry) -> BoxFuture<'static, Result<Reoffered, CatalogError>> {
        let mut s = self.state();
        let result = match reoffer_step(&entry, self.current(&s, &entry.name)) {
            Err(answer) => answer,
            Ok(()) => {
                let bytes = self.seal.entry(&entry.name, offered(&entry));
                s.write(&entry.name, bytes);
                // Later creates get larger generations than the one offered back.
                s.revision = s.revision.max(entry.generation);
                Reoffered::Restored
            }
        };
        futures::future::ready(Ok(result)).boxed()
    }

    fn watch(&self) -> BoxFuture<'static, Result<CatalogWatch, CatalogError>> {
        let mut s = self.state();
        let (tx, rx) = mpsc::unbounded();
        // The snapshot and the registration under one lock: no change falls between them.
        let mut first: Vec<_> = s
            .records
            .iter()
            .map(|(name, record)| Ok(self.change(name.clone(), record)))
            .collect();
        first.push(Ok(CatalogChange::Current));
        s.watchers.push(tx);
        let this = self.clone();
        let changes = rx.map(move |(name, record)| Ok(this.change(name, &record)));
        futures::future::ready(Ok(futures::stream::iter(first).chain(changes).boxed())).boxed()
    }

    fn sealed_with(&self, keys: Option<AuthKeys>) -> Arc<dyn Catalog> {
        Arc::new(MemoryCatalog {
            inner: self.inner.clone(),
            seal: Seal::new(keys),
        })
    }
}

impl Listing {
    /// Takes in one record's change (as a watch's first part gives them).
    pub fn add(&mut self, change: CatalogChange) {
        match change {
            CatalogChange::Put(entry) => self.live.push(entry),
            CatalogChange::Dropped { name, generation } => {
                self.dropped.insert(name, generation.unwrap_or(u64::MAX));
            }
            CatalogChange::Rejected { name, reason } => {
                self.rejected.insert(name, reason);
            }
            CatalogChange::Current => {}
        }
    }
}

impl FromIterator<CatalogChange> for Listing {
    fn from_iter<I: IntoIterator<Item = CatalogChange>>(changes: I) -> Self {
        let mut listing = Listing::default();
        for change in changes {
            listing.add(change);
        }
        listing
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
    fn expiries_keep_the_generation_and_only_a_past_one_drops() {
        futures::executor::block_on(async {
            let c = MemoryCatalog::new().sealed_with(keys(1));
            let a = c.create("a".into(), spec(10)).await.unwrap().entry;
            let later = now_ms() + 60_000;
            let set = c
                .set_expiry("a".into(), Some(later))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                (set.generation, set.expires_ms),
                (a.generation, Some(later))
            );
            assert_eq!(c.get("a".into()).await.unwrap(), Some(set));
            // Not yet, or another generation: nothing dropped.
            assert!(!c.expire("a".into(), a.generation).await.unwrap());
            let past = c.set_expiry("a".into(), Some(1)).await.unwrap().unwrap();
            assert!(!c.expire("a".into(), a.generation + 1).await.unwrap());
            assert!(c.expire("a".into(), a.generation).await.unwrap());
            assert_eq!(c.get("a".into()).await.unwrap(), None);
            assert_eq!(past.generation, a.generation);
            // Once dropped, by the first node: the others find nothing to do.
            assert!(!c.expire("a".into(), a.generation).await.unwrap());
            assert_eq!(c.set_expiry("a".into(), Some(later)).await.unwrap(), None);
            let listing = c.listing().await.unwrap();
            assert_eq!(listing.dropped.get("a"), Some(&a.generation));
            // Cleared: `PERSIST`.
            let b = c.create("b".into(), spec(10)).await.unwrap().entry;
            c.set_expiry("b".into(), Some(1)).await.unwrap();
            let kept = c.set_expiry("b".into(), None).await.unwrap().unwrap();
            assert_eq!(kept.expires_ms, None);
            assert!(!c.expire("b".into(), b.generation).await.unwrap());
        });
    }

    /// A store lost and made anew counts its revisions from 1 again: a name created again
    /// there still gets a later generation than its incarnations before (a generation is the
    /// create's time, past the one it replaces), and one a store of before gave out is not
    /// given again. Found by the catalog simulation (`sim::catalog`).
    #[test]
    fn a_store_made_anew_gives_no_generation_out_again() {
        futures::executor::block_on(async {
            let lost = MemoryCatalog::new();
            let old = lost.create("a".into(), spec(10)).await.unwrap().entry;
            lost.drop_filter("a".into()).await.unwrap();
            let after_drop = lost.create("a".into(), spec(10)).await.unwrap().entry;
            assert!(after_drop.generation > old.generation);
            assert!(chosen_generation(old.generation));
            std::thread::sleep(std::time::Duration::from_millis(2));
            let anew = MemoryCatalog::new();
            let again = anew.create("a".into(), spec(20)).await.unwrap().entry;
            assert!(
                again.generation > after_drop.generation,
                "{} after {}",
                again.generation,
                after_drop.generation
            );
            // A create that follows a drop of a generation ahead of its clock goes past it.
            let ahead = StoredEntry::created(spec(10), Some(u64::MAX - 1), 5);
            assert_eq!(ahead.generation, Some(u64::MAX));
        });
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
            // The create after a drop names the generation it follows.
            assert_eq!(b.entry.replaces, Some(a.entry.generation));
            let seen: Vec<_> = (&mut watch).take(4).map(Result::unwrap).collect().await;
            assert_eq!(
                seen,
                [
                    CatalogChange::Current,
                    CatalogChange::Put(a.entry.clone()),
                    CatalogChange::Dropped {
                        name: "a".into(),
                        generation: Some(a.entry.generation)
                    },
                    CatalogChange::Put(b.entry.clone()),
                ]
            );
            // A new watch starts with what exists, then says it is current.
            let fresh: Vec<_> = c
                .watch()
                .await
                .unwrap()
                .take(2)
                .map(Result::unwrap)
                .collect()
                .await;
            assert_eq!(fresh, [CatalogChange::Put(b.entry), CatalogChange::Current]);
        });
    }

    fn keys(byte: u8) -> Option<AuthKeys> {
        Some(AuthKeys::new([[byte; 32]]).unwrap())
    }

    #[test]
    fn only_key_holders_create_or_drop() {
        futures::executor::block_on(async {
            let store = MemoryCatalog::new();
            let honest = store.sealed_with(keys(1));
            let stranger = store.sealed_with(keys(2));
            let keyless = store.sealed_with(None);
            let victim = honest
                .create("victim".into(), spec(10))
                .await
                .unwrap()
                .entry;
            let mut watch = honest.watch().await.unwrap();

            // The stranger and the keyless node see no sealed entry of theirs: to them the
            // name holds a record they may not act on, so they write over it.
            assert!(
                stranger
                    .drop_filter("victim".into())
                    .await
                    .unwrap()
                    .is_none()
            );
            stranger.create("victim".into(), spec(99)).await.unwrap();
            keyless.create("planted".into(), spec(10)).await.unwrap();
            let seen: Vec<_> = (&mut watch).take(4).map(Result::unwrap).collect().await;
            assert_eq!(
                seen,
                [
                    CatalogChange::Put(victim.clone()),
                    CatalogChange::Current,
                    CatalogChange::Rejected {
                        name: "victim".into(),
                        reason: "bad_signature"
                    },
                    CatalogChange::Rejected {
                        name: "planted".into(),
                        reason: "unsigned"
                    },
                ]
            );
            assert_eq!(honest.get("victim".into()).await.unwrap(), None);
            // A node hosting the victim offers it back, with its generation.
            assert_eq!(
                honest.reoffer(victim.clone()).await.unwrap(),
                Reoffered::Restored
            );
            assert_eq!(
                honest.get("victim".into()).await.unwrap(),
                Some(victim.clone())
            );
            assert_eq!(
                honest.reoffer(victim.clone()).await.unwrap(),
                Reoffered::Listed(victim.clone())
            );
            // A drop is sealed too, and ends the generation for good.
            honest.drop_filter("victim".into()).await.unwrap().unwrap();
            assert_eq!(
                honest.reoffer(victim.clone()).await.unwrap(),
                Reoffered::Dropped(victim.generation)
            );
            let listing = honest.listing().await.unwrap();
            assert_eq!(listing.dropped.get("victim"), Some(&victim.generation));
            assert_eq!(listing.rejected.get("planted"), Some(&"unsigned"));
            assert!(listing.live.is_empty());
        });
    }

    #[test]
    fn a_record_changed_after_sealing_is_rejected() {
        let seal = Seal::new(keys(1));
        let stored = StoredEntry {
            spec: spec(10),
            created_ms: 5,
            generation: None,
            replaces: Some(3),
            key: None,
            expires_ms: None,
            seal: None,
        };
        let bytes = seal.entry("a", stored.clone());
        // A plain name's record is as before (no `key`); an encoded one keeps its key, sealed.
        assert!(!String::from_utf8_lossy(&bytes).contains("\"key\""));
        let coded = seal.entry("_kbf_3Ax", stored.clone());
        assert!(String::from_utf8_lossy(&coded).contains("\"key\":\"bf:x\""));
        assert!(
            matches!(seal.open("_kbf_3Ax", &coded, 9), Opened::Live(e) if e.name == "_kbf_3Ax")
        );
        let forged = String::from_utf8_lossy(&coded).replace("bf:x", "bf:y");
        assert_eq!(
            seal.open("_kbf_3Ax", forged.as_bytes(), 9),
            Opened::Rejected("bad_signature")
        );
        assert!(matches!(seal.open("a", &bytes, 9), Opened::Live(e) if e.generation == 9));
        // Another name, another generation, another predecessor: none verifies.
        assert_eq!(seal.open("b", &bytes, 9), Opened::Rejected("bad_signature"));
        let text = String::from_utf8(bytes.clone()).unwrap();
        let forged = text.replace("\"replaces\":3", "\"replaces\":8");
        assert_ne!(forged, text);
        assert_eq!(
            seal.open("a", forged.as_bytes(), 9),
            Opened::Rejected("bad_signature")
        );
        assert_eq!(
            seal.open("a", b"{not json", 9),
            Opened::Rejected("malformed")
        );
        // A keyless handle takes the sealed record as it is.
        assert!(matches!(
            Seal::default().open("a", &bytes, 9),
            Opened::Live(_)
        ));
    }

    /// An entry record is read straight into its struct (no drop field in it), and what it
    /// says is what reading it through a JSON value said; a drop record is still a drop,
    /// and a record that is neither is malformed either way.
    #[test]
    fn entry_and_drop_records_open_as_they_did_through_a_json_value() {
        let seal = Seal::new(keys(1));
        let stored = StoredEntry {
            spec: spec(10),
            created_ms: 5,
            generation: None,
            replaces: None,
            key: None,
            expires_ms: Some(77),
            seal: None,
        };
        let bytes = seal.entry("a", stored);
        let through_value = {
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let mut e: StoredEntry = serde_json::from_value(json).unwrap();
            let sealed = e.seal.take();
            assert_eq!(seal.check("a", &e, sealed.as_deref()), None);
            Opened::Live(e.entry("a".into(), 9))
        };
        assert_eq!(seal.open("a", &bytes, 9), through_value);
        let dropped = seal.drop_record("a", 4);
        assert_eq!(
            seal.open("a", &dropped, 11),
            Opened::Dropped { generation: 4 }
        );
        // The drop's field inside a value is not a drop record: read through a value, as an
        // entry (malformed here: no spec).
        assert_eq!(
            seal.open("a", br#"{"note":"\"dropped_generation\""}"#, 9),
            Opened::Rejected("malformed")
        );
        assert_eq!(seal.open("a", b"[]", 9), Opened::Rejected("malformed"));
    }
}
