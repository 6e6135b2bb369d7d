//! A seeded simulation of nodes following one filter catalog: key holders create and drop
//! filters, strangers write past the cluster key (bare deletes, unsealed records, records
//! sealed with another key, sealed records replayed), the store loses everything and starts
//! its revisions again (a lost JetStream store), links between a node and the store are cut,
//! nodes crash, restart and lose their disks. The product's own rules decide: the store's
//! steps (`create_step`, `reoffer_step`), its seal ([`Seal`]), and what a node does with each
//! record, at its start and while it follows (`crate::node::follow`); the simulation holds
//! the records, the watches and the data directories, and chooses the order.
//!
//! Checked as it runs: no two creates get one generation of a name (replicas of one
//! incarnation must hold one filter), a node hosts only what a key holder created, and stops
//! or moves aside only what a key holder dropped. Checked at the end, once the links heal and
//! every node is up and has caught up: every node hosts what the catalog lists, and every
//! filter a node kept data of that no key holder dropped is listed (unless a key holder
//! created its name anew while the catalog had lost it).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;

use crate::core::kind::FilterSpec;
use crate::node::follow::{
    DirStep, FollowStep, Offered, dir_step, follow_step, follows_drop_of, lost_by_catalog,
    offered_step,
};
use crate::transport::catalog::{
    CreateStep, Opened, Seal, StoredEntry, create_step, offered, reoffer_step,
};
use crate::transport::{CatalogChange, CatalogEntry, Listing, Reoffered};
use crate::wire::{AuthKeys, FilterKind};

/// What one run does: its seed decides everything else.
#[derive(Debug, Clone)]
pub(crate) struct CatalogPlan {
    pub seed: u64,
    pub steps: usize,
    pub nodes: usize,
    /// The rule before issue 47: a start moves aside every directory the catalog does not
    /// list (a lost catalog deleted every filter). For the test that shows it is found.
    pub absent_is_dropped: bool,
    /// Before issue 47: records were taken without a seal (a stranger's delete dropped a
    /// filter). For the test that shows it is found.
    pub unsealed_trusted: bool,
    /// A create's generation is the store's revision of its write, as before this
    /// simulation found that a store lost starts its revisions again. For the test that
    /// shows it is found.
    pub revision_generations: bool,
}

impl CatalogPlan {
    pub(crate) fn new(seed: u64) -> Self {
        CatalogPlan {
            seed,
            steps: 400,
            nodes: 3,
            absent_is_dropped: false,
            unsealed_trusted: false,
            revision_generations: false,
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub(crate) struct CatalogOutcome {
    pub violation: Option<String>,
    pub creates: u64,
    pub drops: u64,
    pub store_losses: u64,
    pub stranger_writes: u64,
    pub restarts: u64,
    /// Filters a node offered back to a catalog that had lost them.
    pub offered_back: u64,
}

/// Events a failure prints.
const TRACE: usize = 60;

/// The names a run uses; node 0 declares [`CONFIGURED`] in its file.
const NAMES: [&str; 3] = ["a", "b", "conf"];
const CONFIGURED: &str = "conf";

fn spec(i: usize) -> FilterSpec {
    FilterSpec::new(FilterKind::GBloom, [1000, 2000][i], 0.01)
}

/// A record as the store keeps it: bytes, or a bare delete.
type Value = Option<Vec<u8>>;

/// The KV bucket: one record per name, a revision per write, the writes in order for the
/// watches (a store lost starts an empty log and its revisions again).
#[derive(Default)]
struct Store {
    records: BTreeMap<String, (Value, u64)>,
    revision: u64,
    log: Vec<(String, Value, u64)>,
    /// Bumped when the store is lost: a watch of an earlier epoch has ended.
    epoch: u64,
}

impl Store {
    fn write(&mut self, name: &str, value: Value) -> u64 {
        self.revision += 1;
        self.records
            .insert(name.to_string(), (value.clone(), self.revision));
        self.log.push((name.to_string(), value, self.revision));
        self.revision
    }

    fn current(&self, seal: &Seal, name: &str) -> Option<Opened> {
        self.records
            .get(name)
            .map(|(value, revision)| seal.open_record(name, value.as_deref(), *revision))
    }

    /// A watch's first part: one change per record.
    fn first_part(&self, seal: &Seal) -> Vec<CatalogChange> {
        self.records
            .iter()
            .map(|(name, (value, revision))| {
                seal.open_record(name, value.as_deref(), *revision)
                    .change(name.clone())
            })
            .collect()
    }

    fn listing(&self, seal: &Seal) -> Listing {
        self.first_part(seal).into_iter().collect()
    }
}

/// A node's watch of the store: the changes received and not applied yet, where it reads
/// on in the store's log, and the names its first part had a record of (until `Current`).
struct Watch {
    /// Whether the data directories were matched with its first part already (the start's).
    matched: bool,
    epoch: u64,
    /// Its first part, as a listing.
    listing: Listing,
    received: VecDeque<CatalogChange>,
    next: usize,
}

#[derive(Default)]
struct Node {
    up: bool,
    linked: bool,
    /// Data directories: an incarnation's entry by name and generation.
    dirs: BTreeMap<(String, u64), CatalogEntry>,
    hosted: BTreeMap<String, CatalogEntry>,
    configured: BTreeSet<String>,
    watch: Option<Watch>,
    /// Names of a watch's first part (until its `Current`).
    recorded: Option<BTreeSet<String>>,
    /// Names to offer back to the catalog.
    offers: VecDeque<String>,
}

struct World {
    plan: CatalogPlan,
    /// The simulated clock, milliseconds since the epoch (a create's generation is its time).
    now_ms: u64,
    rng: fastrand::Rng,
    store: Store,
    /// The nodes' and key holders' handle: sealed with the cluster key.
    seal: Seal,
    nodes: Vec<Node>,
    /// Each incarnation a key holder created: its spec.
    created: BTreeMap<(String, u64), usize>,
    /// Incarnations a key holder dropped.
    dropped: BTreeSet<(String, u64)>,
    /// Sealed records ever written, for strangers to replay.
    sealed: Vec<(String, Vec<u8>)>,
    trace: VecDeque<String>,
    out: CatalogOutcome,
}

/// Runs one plan.
pub(crate) fn run_catalog(plan: &CatalogPlan) -> CatalogOutcome {
    let keys = AuthKeys::new([vec![7u8; 32]]).expect("a key");
    let mut world = World {
        plan: plan.clone(),
        rng: fastrand::Rng::with_seed(plan.seed),
        now_ms: 1_780_000_000_000,
        store: Store::default(),
        seal: Seal::new(if plan.unsealed_trusted {
            None
        } else {
            Some(keys)
        }),
        nodes: (0..plan.nodes).map(|_| Node::default()).collect(),
        created: BTreeMap::new(),
        dropped: BTreeSet::new(),
        sealed: Vec::new(),
        trace: VecDeque::new(),
        out: CatalogOutcome::default(),
    };
    world.nodes[0].configured.insert(CONFIGURED.to_string());
    for i in 0..plan.nodes {
        world.nodes[i].linked = true;
    }
    let result = (|| {
        for i in 0..plan.nodes {
            world.start(i)?;
        }
        for _ in 0..plan.steps {
            world.step()?;
        }
        world.heal()?;
        world.check_end()
    })();
    if let Err(v) = result {
        let mut text = v;
        let _ = write!(text, "\nlast events:");
        for e in &world.trace {
            let _ = write!(text, "\n  {e}");
        }
        world.out.violation = Some(text);
    }
    std::mem::take(&mut world.out)
}

impl World {
    fn note(&mut self, event: String) {
        if self.trace.len() == TRACE {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    fn step(&mut self) -> Result<(), String> {
        self.now_ms += self.rng.u64(1..40);
        let i = self.rng.usize(..self.nodes.len());
        let name = NAMES[self.rng.usize(..NAMES.len())].to_string();
        match self.rng.u8(..100) {
            0..=19 => {
                let spec_index = self.rng.usize(..2);
                self.create(&name, spec_index)?;
            }
            20..=29 => self.drop_filter(&name),
            30..=59 => self.deliver(i)?,
            60..=69 => self.offer_next(i)?,
            70..=73 if self.nodes[i].up => {
                self.note(format!("node {i} crashes"));
                self.nodes[i].up = false;
            }
            74 if self.nodes[i].up => {
                self.note(format!("node {i} is replaced: its disk is lost"));
                self.nodes[i].up = false;
                self.nodes[i].dirs.clear();
            }
            75..=79 if !self.nodes[i].up => self.start(i)?,
            80..=81 => {
                let linked = !self.nodes[i].linked;
                self.note(format!("node {i} linked to the store: {linked}"));
                self.nodes[i].linked = linked;
                if !linked {
                    self.nodes[i].watch = None;
                }
            }
            82 => {
                self.note("the store is lost (its revisions start again)".into());
                self.out.store_losses += 1;
                let epoch = self.store.epoch + 1;
                self.store = Store {
                    epoch,
                    ..Store::default()
                };
            }
            83..=89 => self.stranger(&name),
            _ => self.rewatch(i),
        }
        Ok(())
    }

    fn create(&mut self, name: &str, spec_index: usize) -> Result<(), String> {
        let spec = spec(spec_index);
        let current = self.store.current(&self.seal, name);
        let CreateStep::Write { replaces } = create_step(name, &spec, current) else {
            return Ok(());
        };
        let mut stored = StoredEntry::created(spec, replaces, self.now_ms);
        if self.plan.revision_generations {
            stored.generation = None;
        }
        let value = self.seal.entry(name, stored.clone());
        let revision = self.store.write(name, Some(value.clone()));
        let generation = stored.entry(name.to_string(), revision).generation;
        self.sealed.push((name.to_string(), value));
        self.out.creates += 1;
        let key = (name.to_string(), generation);
        self.note(format!(
            "a key holder creates {name} g{generation} (spec {spec_index}, replaces {replaces:?})"
        ));
        if self.created.insert(key, spec_index).is_some() {
            return Err(format!(
                "generation {generation} of {name} given to a second create: replicas of two \
                 filters would take each other's frames"
            ));
        }
        Ok(())
    }

    fn drop_filter(&mut self, name: &str) {
        let Some(Opened::Live(entry)) = self.store.current(&self.seal, name) else {
            return;
        };
        let value = self.seal.drop_record(name, entry.generation);
        self.store.write(name, Some(value.clone()));
        self.sealed.push((name.to_string(), value));
        self.out.drops += 1;
        self.note(format!("a key holder drops {name} g{}", entry.generation));
        self.dropped.insert((name.to_string(), entry.generation));
    }

    fn stranger(&mut self, name: &str) {
        self.out.stranger_writes += 1;
        let other = Seal::new(Some(AuthKeys::new([vec![9u8; 32]]).expect("a key")));
        let (what, value) = match self.rng.u8(..4) {
            0 => ("deletes", None),
            1 => (
                "writes an unsealed entry of",
                Some(Seal::new(None).entry(name, StoredEntry::created(spec(1), None, self.now_ms))),
            ),
            2 => (
                "writes an entry sealed with another key of",
                Some(other.entry(name, StoredEntry::created(spec(0), None, self.now_ms))),
            ),
            _ if !self.sealed.is_empty() => {
                let (replayed, value) = self.sealed[self.rng.usize(..self.sealed.len())].clone();
                self.note(format!("a stranger replays a sealed record of {replayed}"));
                self.store.write(&replayed, Some(value));
                return;
            }
            _ => return,
        };
        self.note(format!("a stranger {what} {name}"));
        self.store.write(name, value);
    }

    /// A node's start: its configured filters, then the catalog's listing matched with its
    /// data directories (what it does not know offered back), then the watch.
    fn start(&mut self, i: usize) -> Result<(), String> {
        self.out.restarts += 1;
        let node = &mut self.nodes[i];
        node.up = true;
        node.hosted.clear();
        node.offers.clear();
        node.watch = None;
        node.recorded = None;
        for name in node.configured.clone() {
            node.hosted.insert(
                name.clone(),
                CatalogEntry {
                    name,
                    spec: spec(0),
                    generation: 0,
                    created_ms: 0,
                    replaces: None,
                    expires_ms: None,
                },
            );
        }
        self.note(format!("node {i} starts"));
        if !self.nodes[i].linked {
            // No drop can be told from an unreachable catalog: every directory stays.
            return Ok(());
        }
        let listing = self.begin_watch(i, true);
        self.reconcile(i, &listing)
    }

    /// Matches the node's data directories with `listing`: what a key holder dropped moved
    /// aside, what the catalog does not know offered back.
    fn reconcile(&mut self, i: usize, listing: &Listing) -> Result<(), String> {
        let dirs: Vec<((String, u64), CatalogEntry)> = self.nodes[i]
            .dirs
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        for ((name, generation), entry) in dirs {
            let node = &self.nodes[i];
            let hosted = node.hosted.get(&name).map(|e| e.generation) == Some(generation);
            if node.configured.contains(&name) || hosted {
                continue;
            }
            let step =
                if self.plan.absent_is_dropped && !listing.live.iter().any(|e| e.name == name) {
                    DirStep::Dropped
                } else {
                    let listed = listing.live.iter().find(|e| e.name == name);
                    dir_step(generation, listed, listing.dropped.get(&name).copied())
                };
            match step {
                DirStep::Listed => {}
                DirStep::Dropped => {
                    self.moved_aside(i, &name, generation, "dropped while down")?;
                }
                DirStep::Superseded => self.superseded(i, &name, generation)?,
                DirStep::Offer => match offered_step(&entry, self.reoffer(&entry)) {
                    // Hosted as the watch delivers the record written.
                    Offered::Host(_) | Offered::Kept(_) => {}
                    Offered::Dropped => {
                        self.moved_aside(i, &name, generation, "its offer found it dropped")?;
                    }
                    Offered::Superseded => self.superseded(i, &name, generation)?,
                },
            }
        }
        Ok(())
    }

    /// A new watch of the node: the records now, then the changes; its first part as a
    /// listing (`matched`: the data directories are matched with it at once, as at a start).
    fn begin_watch(&mut self, i: usize, matched: bool) -> Listing {
        let first_part = self.store.first_part(&self.seal);
        let listing: Listing = first_part.iter().cloned().collect();
        let mut received = VecDeque::from(first_part);
        received.push_back(CatalogChange::Current);
        let node = &mut self.nodes[i];
        node.recorded = Some(BTreeSet::new());
        node.watch = Some(Watch {
            matched,
            listing: listing.clone(),
            epoch: self.store.epoch,
            received,
            next: self.store.log.len(),
        });
        listing
    }

    /// The follow loop watching again after its watch ended.
    fn rewatch(&mut self, i: usize) {
        let node = &self.nodes[i];
        if node.up && node.linked && node.watch.is_none() {
            self.note(format!("node {i} watches the catalog again"));
            self.begin_watch(i, false);
        }
    }

    /// The node applies the next change its watch has.
    fn deliver(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        if !node.up {
            return Ok(());
        }
        let Some(watch) = &mut node.watch else {
            return Ok(());
        };
        if watch.received.is_empty() {
            if watch.epoch != self.store.epoch {
                // The store was lost: the watch ends (the node watches again later).
                node.watch = None;
                return Ok(());
            }
            if let Some((name, value, revision)) = self.store.log.get(watch.next) {
                watch.next += 1;
                let change = self
                    .seal
                    .open_record(name, value.as_deref(), *revision)
                    .change(name.clone());
                watch.received.push_back(change);
            }
        }
        let Some(change) = self.nodes[i]
            .watch
            .as_mut()
            .and_then(|w| w.received.pop_front())
        else {
            return Ok(());
        };
        self.apply(i, change)
    }

    fn apply(&mut self, i: usize, change: CatalogChange) -> Result<(), String> {
        if change == CatalogChange::Current {
            // A directory whose record the catalog lost since the node last matched them
            // (before it hosted it) is offered back too.
            let listing = self.nodes[i]
                .watch
                .as_ref()
                .filter(|w| !w.matched)
                .map(|w| w.listing.clone());
            if let Some(listing) = listing {
                self.reconcile(i, &listing)?;
            }
            let node = &mut self.nodes[i];
            if let Some(recorded) = node.recorded.take() {
                let lost: Vec<String> = node
                    .hosted
                    .keys()
                    .filter(|n| {
                        lost_by_catalog(recorded.contains(*n), node.configured.contains(*n))
                    })
                    .cloned()
                    .collect();
                node.offers.extend(lost);
            }
            return Ok(());
        }
        let name = match &change {
            CatalogChange::Put(e) => e.name.clone(),
            CatalogChange::Dropped { name, .. } | CatalogChange::Rejected { name, .. } => {
                name.clone()
            }
            CatalogChange::Current => unreachable!("handled above"),
        };
        if let Some(recorded) = &mut self.nodes[i].recorded {
            recorded.insert(name.clone());
        }
        let hosted = self.nodes[i].hosted.get(&name).map(|e| e.generation);
        let configured = self.nodes[i].configured.contains(&name);
        let step = follow_step(hosted, configured, &change);
        self.note(format!(
            "node {i} applies {} -> {step:?}",
            describe(&change)
        ));
        match (step, change) {
            (FollowStep::Host, CatalogChange::Put(entry)) => self.host(i, entry)?,
            (FollowStep::Replace, CatalogChange::Put(entry)) => {
                if let Some(old) = self.nodes[i].hosted.remove(&name) {
                    if follows_drop_of(&entry, old.generation) {
                        self.moved_aside(i, &name, old.generation, "replaced after its drop")?;
                    } else {
                        self.superseded(i, &name, old.generation)?;
                    }
                }
                self.host(i, entry)?;
            }
            (FollowStep::Refresh, CatalogChange::Put(entry)) => {
                self.nodes[i].hosted.insert(name, entry);
            }
            (FollowStep::Unhost, CatalogChange::Dropped { generation, .. }) => {
                self.unhost(i, &name, generation, "its drop")?;
            }
            (FollowStep::Reject(_), _) => self.nodes[i].offers.push_back(name),
            _ => {}
        }
        Ok(())
    }

    fn host(&mut self, i: usize, entry: CatalogEntry) -> Result<(), String> {
        let key = (entry.name.clone(), entry.generation);
        let spec_index = (0..2).find(|&s| spec(s) == entry.spec);
        if self.created.get(&key).copied() != spec_index {
            return Err(format!(
                "node {i} hosts {} g{} (spec {spec_index:?}), which no key holder created",
                entry.name, entry.generation
            ));
        }
        let node = &mut self.nodes[i];
        node.dirs.insert(key, entry.clone());
        node.hosted.insert(entry.name.clone(), entry);
        Ok(())
    }

    /// Stops hosted `name` if its generation is at most `at_most` (the table's rule).
    fn unhost(
        &mut self,
        i: usize,
        name: &str,
        at_most: Option<u64>,
        why: &str,
    ) -> Result<(), String> {
        let node = &mut self.nodes[i];
        if node.configured.contains(name) {
            return Ok(());
        }
        let Some(generation) = node.hosted.get(name).map(|e| e.generation) else {
            return Ok(());
        };
        if at_most.is_some_and(|g| generation > g) {
            return Ok(());
        }
        node.hosted.remove(name);
        self.moved_aside(i, name, generation, why)
    }

    fn moved_aside(
        &mut self,
        i: usize,
        name: &str,
        generation: u64,
        why: &str,
    ) -> Result<(), String> {
        self.nodes[i].dirs.remove(&(name.to_string(), generation));
        self.note(format!("node {i} moves {name} g{generation} aside ({why})"));
        if !self.dropped_at_or_after(name, generation) {
            return Err(format!(
                "node {i} stopped {name} g{generation} ({why}), which no key holder dropped"
            ));
        }
        Ok(())
    }

    /// The data of `name`'s `generation` moved aside for a later generation that a key
    /// holder created while the catalog had lost it.
    fn superseded(&mut self, i: usize, name: &str, generation: u64) -> Result<(), String> {
        self.nodes[i].dirs.remove(&(name.to_string(), generation));
        self.note(format!(
            "node {i} moves {name} g{generation} aside (superseded)"
        ));
        let later = self
            .created
            .range((name.to_string(), generation + 1)..)
            .next()
            .is_some_and(|((n, _), _)| n == name);
        if !later && !self.dropped_at_or_after(name, generation) {
            return Err(format!(
                "node {i} moved {name} g{generation} aside for a later generation no key holder \
                 created"
            ));
        }
        Ok(())
    }

    /// Whether a key holder dropped `name` at `generation` or later (a drop ends every
    /// incarnation of the name up to the one dropped).
    fn dropped_at_or_after(&self, name: &str, generation: u64) -> bool {
        self.dropped
            .range((name.to_string(), generation)..)
            .next()
            .is_some_and(|(n, _)| n == name)
    }

    /// The store's side of an offer (atomic: a compare-and-set that loses a race retries).
    fn reoffer(&mut self, entry: &CatalogEntry) -> Reoffered {
        let current = self.store.current(&self.seal, &entry.name);
        if let Err(answer) = reoffer_step(entry, current) {
            return answer;
        }
        let value = self.seal.entry(&entry.name, offered(entry));
        self.store.write(&entry.name, Some(value.clone()));
        self.sealed.push((entry.name.clone(), value));
        self.out.offered_back += 1;
        self.note(format!(
            "{} g{} offered back to the catalog",
            entry.name, entry.generation
        ));
        Reoffered::Restored
    }

    /// A running node offers one hosted filter back (`reoffer_hosted`).
    fn offer_next(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        if !node.up || !node.linked {
            return Ok(());
        }
        let Some(name) = node.offers.pop_front() else {
            return Ok(());
        };
        let Some(entry) = node
            .hosted
            .get(&name)
            .filter(|_| !node.configured.contains(&name))
            .cloned()
        else {
            return Ok(());
        };
        if let Reoffered::Dropped(generation) = self.reoffer(&entry) {
            self.unhost(i, &name, Some(generation), "its offer found it dropped")?;
        }
        Ok(())
    }

    /// Every link back, every node up, and every node caught up with the store.
    fn heal(&mut self) -> Result<(), String> {
        self.note("heal".into());
        for i in 0..self.nodes.len() {
            self.nodes[i].linked = true;
            if !self.nodes[i].up {
                self.start(i)?;
            }
        }
        for _round in 0..200 {
            let mut busy = false;
            for i in 0..self.nodes.len() {
                self.rewatch(i);
                let watch = self.nodes[i].watch.as_ref();
                let pending = watch.is_some_and(|w| {
                    !w.received.is_empty()
                        || w.epoch != self.store.epoch
                        || w.next < self.store.log.len()
                });
                if pending || !self.nodes[i].offers.is_empty() {
                    busy = true;
                    self.deliver(i)?;
                    self.offer_next(i)?;
                }
            }
            if !busy {
                return Ok(());
            }
        }
        Err("the nodes did not settle within 200 rounds after the heal".into())
    }

    fn check_end(&mut self) -> Result<(), String> {
        let listed: BTreeMap<String, u64> = self
            .store
            .listing(&self.seal)
            .live
            .into_iter()
            .map(|e| (e.name, e.generation))
            .collect();
        for (i, node) in self.nodes.iter().enumerate() {
            let hosted: BTreeMap<String, u64> = node
                .hosted
                .iter()
                .filter(|(n, _)| !node.configured.contains(*n))
                .map(|(n, e)| (n.clone(), e.generation))
                .collect();
            let expected: BTreeMap<String, u64> = listed
                .iter()
                .filter(|(n, _)| !node.configured.contains(*n))
                .map(|(n, g)| (n.clone(), *g))
                .collect();
            if hosted != expected {
                return Err(format!(
                    "after the heal node {i} hosts {hosted:?}, the catalog lists {listed:?}"
                ));
            }
        }
        for node in &self.nodes {
            for (name, generation) in node.dirs.keys() {
                let superseded = self
                    .created
                    .keys()
                    .any(|(n, g)| n == name && g > generation);
                if !self.dropped_at_or_after(name, *generation)
                    && listed.get(name) != Some(generation)
                    && !superseded
                {
                    return Err(format!(
                        "{name} g{generation} is kept on a node but not listed, and no key holder \
                         dropped it or created its name again"
                    ));
                }
            }
        }
        Ok(())
    }
}

fn describe(change: &CatalogChange) -> String {
    match change {
        CatalogChange::Put(e) => format!(
            "put {} g{} (replaces {:?})",
            e.name, e.generation, e.replaces
        ),
        CatalogChange::Dropped { name, generation } => format!("drop {name} {generation:?}"),
        CatalogChange::Rejected { name, reason } => format!("rejected {name} ({reason})"),
        CatalogChange::Current => "current".into(),
    }
}
