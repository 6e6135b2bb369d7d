//! ORCF: the observed-remove cuckoo filter (thesis Spec. 4).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::table::{Entry, Table, TableRepr};
use crate::core::causal::{
    CausalContext, Dot, MAX_COUNTER, ReplicaId, check_own_dots, clamp_clock, next_dot,
};
use crate::core::codec::{bits_for, pack, unpack};
use crate::core::delta::{CheckRemote, DeltaState, OrCuckooDelta};
use crate::core::error::FilterError;
use crate::core::hash::{cuckoo_position, hash_item};
use crate::core::kind::{FilterKind, ImportRoom, Occurrence, tags_to_issue};
use crate::core::lattice::{Lattice, Membership, Removable};
use crate::core::params::CuckooParams;

/// An observed-remove cuckoo filter (thesis Spec. 4): every entry carries a version tag
/// `(replica, timestamp)`, the causal history `H` records every tag observed, and a merge keeps
/// an entry unless the other side observed its tag and no longer has it (add wins over a
/// concurrent remove).
///
/// ```
/// use crpf::{Lattice, Membership, OrCuckoo, Removable};
///
/// let mut a = OrCuckoo::with_capacity(1000, 0.03, 1)?;
/// let mut b = OrCuckoo::with_capacity(1000, 0.03, 2)?;
/// a.add(b"apple")?;
/// b.merge(&a)?;
/// assert!(b.remove(b"apple"));     // b observed the add, so its remove wins...
/// a.add(b"apple")?;                // ...but not over a concurrent re-add on a
/// a.merge(&b)?;
/// b.merge(&a)?;
/// assert!(a.contains(b"apple") && b.contains(b"apple"));
/// assert!(a.equivalent(&b));
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct OrCuckoo {
    table: Table<u64>,
    history: CausalContext,
    replica: ReplicaId,
    /// Highest timestamp this replica may have issued; it never issues one at or below it.
    clock: u64,
    /// [`OrCuckoo::clock`], kept: the higher of `clock` and the history's highest timestamp of
    /// `replica` (which took two map searches per add, for the add and for the batch's check
    /// of its reservation).
    issued: u64,
    /// Local updates since the last `take_delta`, while tracking.
    pending: Option<PendingOr<(u64, u16)>>,
}

/// A delta being accumulated: added entries, removed entries, and the context of their dots.
/// `L` locates an entry: `(bucket, fp)`, plus the sub-filter for ScORCF.
///
/// Both lists are kept in the order of the updates, without a map: every add issues a fresh
/// tag, and a tag is removed at most once (its entry leaves the table, and the history keeps
/// it from coming back), so neither list can hold a tag twice. An entry added and then removed
/// before the delta is taken is left out of the added entries when it is taken. (Maps keyed by
/// tag, hashed with SipHash, then sorted when taken, cost an `or_cuckoo` add about a tenth of
/// its time.)
#[derive(Debug, Clone)]
pub(crate) struct PendingOr<L> {
    added: Vec<(L, Dot)>,
    removed: Vec<(L, Dot)>,
    /// Entries of `added` removed since: each is in `removed` too.
    cancelled: usize,
    context: CausalContext,
}

impl<L> Default for PendingOr<L> {
    fn default() -> Self {
        Self {
            added: Vec::new(),
            removed: Vec::new(),
            cancelled: 0,
            context: CausalContext::new(),
        }
    }
}

impl<L: Copy> PendingOr<L> {
    /// Records a local add under `dot`, a tag never issued before.
    #[inline]
    pub(crate) fn added(&mut self, dot: Dot, at: L) {
        self.added.push((at, dot));
        self.context.insert(dot);
    }
    /// Records a local remove of the entry tagged `dot`.
    pub(crate) fn removed(&mut self, dot: Dot, at: L) {
        // The context holds exactly the tags added or removed since the last take, and no tag
        // is removed twice: a tag it holds was added since.
        if self.context.contains(dot) {
            self.cancelled += 1;
        } else {
            self.context.insert(dot);
        }
        self.removed.push((at, dot));
    }
    pub(crate) fn len(&self) -> usize {
        self.added.len() - self.cancelled + self.removed.len()
    }
    /// The accumulated lists, sorted by tag, and the context; `None` if nothing changed.
    pub(crate) fn take(&mut self) -> Option<TakenDelta<L>> {
        if self.context.is_empty() {
            return None;
        }
        let PendingOr {
            mut added,
            mut removed,
            cancelled,
            context,
        } = std::mem::take(self);
        // The next delta is likely as large: room for it now rather than growing into it.
        self.added.reserve(added.len());
        // A replica's own tags ascend: sorted already, unless its id changed since the last
        // take.
        let sort = |v: &mut Vec<(L, Dot)>| {
            if !v.is_sorted_by_key(|e| e.1) {
                v.sort_unstable_by_key(|e| e.1);
            }
        };
        sort(&mut added);
        sort(&mut removed);
        if cancelled > 0 {
            added.retain(|e| removed.binary_search_by_key(&e.1, |r| r.1).is_err());
        }
        debug_assert_eq!(
            added.len() + removed.len(),
            context.dot_count() as usize,
            "a tag listed twice or missing"
        );
        Some(TakenDelta {
            entries: added,
            removed,
            context,
        })
    }
}

/// A delta taken out of [`PendingOr`]: located entries added and removed, and their dots.
pub(crate) struct TakenDelta<L> {
    pub entries: Vec<(L, Dot)>,
    pub removed: Vec<(L, Dot)>,
    pub context: CausalContext,
}

/// Checks the dots a delta lists (each with whether its location fits the parameters): each
/// fits and is in the context, none is listed twice, and the context holds no other dot, so
/// that joining the delta needs to touch only the entries it lists.
pub(crate) fn check_listed_dots(
    listed: impl Iterator<Item = (bool, Dot)>,
    context: &CausalContext,
) -> Result<(), FilterError> {
    let mut dots = Vec::new();
    for (fits, dot) in listed {
        if !fits || dot.counter == 0 || !context.contains(dot) {
            return Err(FilterError::malformed(format!(
                "delta entry {dot:?} does not fit"
            )));
        }
        dots.push(dot);
    }
    dots.sort_unstable();
    if dots.windows(2).any(|w| w[0] == w[1]) {
        return Err(FilterError::malformed("a tag is listed twice in the delta"));
    }
    if context.dot_count() != dots.len() as u64 {
        return Err(FilterError::malformed(
            "the delta's context holds dots it lists no entry for",
        ));
    }
    Ok(())
}

impl OrCuckoo {
    /// A filter for `capacity` elements at false positive rate `fpr`, adding as `replica`.
    pub fn with_capacity(capacity: u64, fpr: f64, replica: ReplicaId) -> Result<Self, FilterError> {
        Self::new(CuckooParams::with_capacity(capacity, fpr)?, replica)
    }

    /// A filter with explicit parameters, adding as `replica`.
    ///
    /// ```
    /// let p = crpf::CuckooParams::with_capacity(100, 0.01)?;
    /// let f = crpf::OrCuckoo::new(p, 3)?;
    /// assert_eq!(f.replica(), 3);
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn new(params: CuckooParams, replica: ReplicaId) -> Result<Self, FilterError> {
        let params = params.validated()?;
        Ok(Self::from_parts(
            Table::new(params, rng_seed(&params, replica)),
            CausalContext::new(),
            replica,
            0,
        ))
    }

    fn from_parts(
        table: Table<u64>,
        history: CausalContext,
        replica: ReplicaId,
        clock: u64,
    ) -> Self {
        Self {
            issued: clock.max(history.max(replica)),
            table,
            history,
            replica,
            clock,
            pending: None,
        }
    }

    /// The filter's parameters.
    pub fn params(&self) -> &CuckooParams {
        self.table.params()
    }

    /// The replica id new tags are issued under.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// Issues future tags under another replica id (for a replica that lost its durable state
    /// and claimed a new id).
    pub fn set_replica(&mut self, replica: ReplicaId) {
        self.replica = replica;
        self.clock = 0;
        self.issued = self.history.max(replica);
    }

    /// Highest timestamp this replica may have issued.
    #[inline]
    pub fn clock(&self) -> u64 {
        debug_assert_eq!(self.issued, self.clock.max(self.history.max(self.replica)));
        self.issued
    }

    /// Keeps [`OrCuckoo::clock`] after the history grew by a merge.
    fn history_merged(&mut self) {
        self.issued = self.issued.max(self.history.max(self.replica));
    }

    /// Guarantees every future tag of this replica has a timestamp above `floor`, e.g. a
    /// durably reserved high-water mark after a crash. A floor at or past
    /// [`MAX_COUNTER`] leaves no timestamp: the clock stops there and every add fails with
    /// [`FilterError::ClockExhausted`].
    pub fn advance_clock(&mut self, floor: u64) {
        self.clock = self.clock.max(clamp_clock(floor));
        self.issued = self.issued.max(self.clock);
    }

    /// The causal history `H`.
    pub fn history(&self) -> &CausalContext {
        &self.history
    }

    /// Entries stored beyond their bucket's `c` slots.
    pub fn overflow_len(&self) -> usize {
        self.table.overflow_len()
    }

    /// Calls `f` with the packed tag ([`Dot::pack`]) of every entry, without collecting them.
    pub(crate) fn for_each_tag(&self, mut f: impl FnMut(u64)) {
        self.table.for_each(|_, e| f(e.payload));
    }

    /// The version tags of every entry.
    pub fn dots(&self) -> Vec<Dot> {
        let mut v = Vec::with_capacity(self.table.len());
        self.table.for_each(|_, e| v.push(Dot::unpack(e.payload)));
        v
    }

    #[inline]
    fn position(&self, item: &[u8]) -> (usize, u16) {
        let p = self.params();
        cuckoo_position(
            hash_item(item, p.seed),
            p.buckets,
            p.fingerprint_bits as u32,
        )
    }

    /// Adds the item under a fresh tag and returns the tag. An error (`Full`,
    /// `ClockExhausted`) changes nothing.
    pub fn add_dot(&mut self, item: &[u8]) -> Result<Dot, FilterError> {
        let dot = next_dot(self.replica, self.clock())?;
        let (b, fp) = self.position(item);
        self.table.insert(
            b,
            Entry {
                fp,
                payload: dot.pack(),
            },
        )?;
        self.history.insert(dot);
        self.clock = dot.counter;
        self.issued = dot.counter;
        if let Some(pending) = &mut self.pending {
            pending.added(dot, (b as u64, fp));
        }
        Ok(dot)
    }

    /// Every entry, located, in the order of [`OrCuckoo::dots`]
    /// ([`crate::ReplicatedFilter::live_occurrences`]).
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        let mut v = Vec::with_capacity(self.table.len());
        self.table
            .for_each(|b, e| v.push(Occurrence::at(b as u64, e.fp, 1)));
        v
    }

    /// Re-adds `occurrences` (a dump's, located as in a filter of these parameters) under
    /// fresh tags of this replica, `count` entries each, and answers the tags, in order
    /// ([`crate::ReplicatedFilter::import_occurrences`]). All or nothing: a location that does
    /// not fit ([`FilterError::Incompatible`]), more entries than the table has room for
    /// ([`FilterError::NoRoom`]: its slots, or what the dump held if more) or too few
    /// timestamps left ([`FilterError::ClockExhausted`]) change nothing.
    ///
    /// ```
    /// use crpf::{Membership, OrCuckoo, Removable};
    ///
    /// let mut there = OrCuckoo::with_capacity(1000, 0.01, 1)?;
    /// there.add(b"x")?;
    /// there.add(b"x")?;
    /// let mut here = OrCuckoo::with_capacity(1000, 0.01, 2)?;
    /// let tags = here.import(&there.live_occurrences())?;
    /// assert!(tags.iter().all(|t| t.replica == 2));   // this replica's tags, not replica 1's
    /// assert_eq!(here.occurrences(b"x"), 2);
    /// assert!(here.remove(b"x") && here.remove(b"x") && !here.contains(b"x"));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn import(&mut self, occurrences: &[Occurrence]) -> Result<Vec<Dot>, FilterError> {
        let room = ImportRoom::of(FilterKind::OrCuckoo, occurrences);
        self.import_part(occurrences, &room)
    }

    /// [`OrCuckoo::import`] of a part of a dump, whose room (all of it) is `room`.
    pub fn import_part(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<Vec<Dot>, FilterError> {
        self.check_import(occurrences, room)?;
        let start = self.clock();
        let n = tags_to_issue(occurrences, self.replica, start)?;
        let mut dots = Vec::with_capacity(n as usize);
        let mut counter = start;
        for o in occurrences {
            for _ in 0..o.count {
                counter += 1;
                let dot = Dot {
                    replica: self.replica,
                    counter,
                };
                let (b, fp) = (o.bucket as usize, o.fp);
                self.table.place_imported(
                    b,
                    Entry {
                        fp,
                        payload: dot.pack(),
                    },
                );
                self.history.insert(dot);
                if let Some(pending) = &mut self.pending {
                    pending.added(dot, (o.bucket, fp));
                }
                dots.push(dot);
            }
        }
        self.clock = counter;
        self.issued = self.issued.max(counter);
        Ok(dots)
    }

    /// Whether [`OrCuckoo::import_part`] would take `occurrences` now (leaving the clock
    /// aside): [`crate::ReplicatedFilter::check_import`].
    pub fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        let p = *self.params();
        if let Some(o) = occurrences
            .iter()
            .find(|o| o.series != 0 || o.sub != 0 || !p.holds_entry(o.bucket, o.fp))
        {
            return Err(FilterError::Incompatible(format!(
                "occurrence {o:?} does not fit these parameters"
            )));
        }
        let entries = occurrences
            .iter()
            .fold(self.table.len() as u64, |n, o| n.saturating_add(o.count));
        room.check(0, 0, self.table.slots() as u64, entries)
    }

    /// Live entries matching the item ([`crate::core::kind::ObservedRemove::occurrences`]).
    pub fn occurrences(&self, item: &[u8]) -> u64 {
        let (b, fp) = self.position(item);
        count_matching(&self.table, b, fp)
    }

    /// Removes one random entry matching the item (Spec. 4 *remove*) and returns its tag.
    pub fn remove_dot(&mut self, item: &[u8]) -> Option<Dot> {
        let (b, fp) = self.position(item);
        let dot = remove_random(&mut self.table, b, fp)?;
        if let Some(pending) = &mut self.pending {
            pending.removed(dot, (b as u64, fp));
        }
        Some(dot)
    }

    /// Merges the entries and context of another state, which may be a delta-state: its
    /// context need not be contiguous and its table need hold only what it changed.
    pub(crate) fn merge_parts(&mut self, table: &Table<u64>, history: &CausalContext) {
        merge_tables(&mut self.table, &self.history, Some(table), history);
        self.history.union(history);
        self.history_merged();
    }
}

/// Entries with fingerprint `fp` in bucket `b` and its alternate.
pub(crate) fn count_matching(table: &Table<u64>, b: usize, fp: u16) -> u64 {
    let a = table.alt(b, fp);
    let in_bucket = |bucket| table.bucket_entries(bucket).filter(|e| e.fp == fp).count() as u64;
    in_bucket(b) + if a == b { 0 } else { in_bucket(a) }
}

/// Removes one random entry with fingerprint `fp` from bucket `b` or its alternate.
pub(crate) fn remove_random(table: &mut Table<u64>, b: usize, fp: u16) -> Option<Dot> {
    let a = table.alt(b, fp);
    let mut matches: Vec<(usize, usize)> = Vec::new();
    for bucket in if a == b { vec![b] } else { vec![b, a] } {
        let found = table
            .bucket_entries(bucket)
            .enumerate()
            .filter(|(_, e)| e.fp == fp);
        matches.extend(found.map(|(k, _)| (bucket, k)));
    }
    if matches.is_empty() {
        return None;
    }
    let (bucket, k) = matches[table.rng().usize(..matches.len())];
    Some(Dot::unpack(table.take(bucket, k).payload))
}

/// The table part of the ORCF merge (Eq. 3.12-3.15). `theirs` is `None` where the other
/// side has no such table (a series padded with a bottom sub-filter). `mine_history` must be
/// our history before the merge; the caller unions the histories afterwards.
pub(crate) fn merge_tables(
    mine: &mut Table<u64>,
    mine_history: &CausalContext,
    theirs: Option<&Table<u64>>,
    their_history: &CausalContext,
) {
    // Entries we hold whose tags the other side observed and no longer holds were removed
    // there (Eq. 3.13 excludes them); entries both hold, possibly displaced, stay (S1, S4).
    let mut removed = Vec::new();
    mine.for_each(|b, e| {
        if their_history.contains_tag(e.payload)
            && !theirs.is_some_and(|t| t.has_exact_either(b, e))
        {
            removed.push((b, e));
        }
    });
    for (b, e) in removed {
        mine.remove_exact(b, e);
    }
    // Entries new to us (Eq. 3.14).
    if let Some(theirs) = theirs {
        let mut fresh = Vec::new();
        theirs.for_each(|b, e| {
            if !mine_history.contains_tag(e.payload) {
                fresh.push((b, e));
            }
        });
        for (b, e) in fresh {
            mine.place_merged(b, e);
        }
    }
}

/// The tombstone half of Eq. 3.11: given `H ⊆ H'`, `T ⊆ T'` holds iff every entry of the other
/// side whose tag we observed is still live here.
pub(crate) fn table_le(
    mine: Option<&Table<u64>>,
    mine_history: &CausalContext,
    theirs: Option<&Table<u64>>,
) -> bool {
    let Some(theirs) = theirs else { return true };
    let mut all = true;
    theirs.for_each(|b, e| {
        if all && mine_history.contains_tag(e.payload) {
            all = mine.is_some_and(|m| m.has_exact_either(b, e));
        }
    });
    all
}

fn rng_seed(params: &CuckooParams, replica: ReplicaId) -> u64 {
    params.seed ^ (replica as u64).rotate_left(32)
}

impl fmt::Debug for OrCuckoo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OrCuckoo")
            .field("params", self.params())
            .field("replica", &self.replica)
            .field("len", &self.table.len())
            .field("history", &self.history)
            .finish()
    }
}

impl Lattice for OrCuckoo {
    /// Eq. 3.16: `(S1 ∪ S2 ∪ S3 ∪ S4, H ∪ H')`.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("cuckoo", self.params(), other.params())?;
        self.merge_parts(&other.table, &other.history);
        Ok(())
    }

    /// Eq. 3.11: `H ⊆ H' ∧ T ⊆ T'`. With `H ⊆ H'`, `T ⊆ T'` holds iff every entry of the other
    /// whose tag we observed is still live here.
    fn le(&self, other: &Self) -> bool {
        if self.params() != other.params() || !self.history.is_subset(&other.history) {
            return false;
        }
        table_le(Some(&self.table), &self.history, Some(&other.table))
    }
}

impl Membership for OrCuckoo {
    #[inline]
    fn contains(&self, item: &[u8]) -> bool {
        let (b, fp) = self.position(item);
        self.table.contains_fp(b, fp)
    }

    /// Adds the item under a fresh tag, even if it is already contained (Spec. 4).
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.add_dot(item).map(|_| ())
    }

    fn cardinality(&self) -> f64 {
        self.table.len() as f64
    }

    fn capacity(&self) -> u64 {
        self.table.slots() as u64
    }

    fn load_factor(&self) -> f64 {
        self.table.load_factor()
    }

    /// Eq. 3.18 at the table's average load factor.
    fn estimated_fpr(&self) -> f64 {
        self.params().fpr_at_load(self.load_factor())
    }
}

impl Removable for OrCuckoo {
    fn remove(&mut self, item: &[u8]) -> bool {
        self.remove_dot(item).is_some()
    }
}

impl DeltaState for OrCuckoo {
    type Delta = OrCuckooDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(PendingOr::default);
    }

    fn take_delta(&mut self) -> Option<OrCuckooDelta> {
        let taken = self.pending.as_mut()?.take()?;
        let flat =
            |v: Vec<((u64, u16), Dot)>| v.into_iter().map(|((b, fp), d)| (b, fp, d)).collect();
        Some(OrCuckooDelta {
            entries: flat(taken.entries),
            removed: flat(taken.removed),
            context: taken.context,
        })
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, PendingOr::len)
    }

    /// Every add records an entry of its own (a fresh tag): nothing to add.
    fn record_footprint(&mut self, _item: &[u8]) -> bool {
        false
    }

    fn check_delta(&self, delta: &OrCuckooDelta) -> Result<(), FilterError> {
        let p = self.params();
        let listed = delta.entries.iter().chain(&delta.removed);
        check_listed_dots(
            listed.map(|&(b, fp, d)| (p.holds_entry(b, fp), d)),
            &delta.context,
        )
    }

    /// Removes the listed removed entries, places the listed entries not yet observed, and
    /// unions the context: the lattice join, touching only what the delta lists.
    fn merge_delta(&mut self, delta: &OrCuckooDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for &(b, fp, dot) in &delta.removed {
            self.table.remove_exact(
                b as usize,
                Entry {
                    fp,
                    payload: dot.pack(),
                },
            );
        }
        for &(b, fp, dot) in &delta.entries {
            if !self.history.contains(dot) {
                self.table.place_merged(
                    b as usize,
                    Entry {
                        fp,
                        payload: dot.pack(),
                    },
                );
            }
        }
        self.history.union(&delta.context);
        self.history_merged();
        Ok(())
    }
}

impl CheckRemote for OrCuckoo {
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        check_own_dots(self.replica, self.clock(), other.history.max(self.replica))
    }

    /// A delta's context holds exactly the dots it lists, so checking it covers them all.
    fn check_remote_delta(&self, delta: &OrCuckooDelta) -> Result<(), FilterError> {
        check_own_dots(self.replica, self.clock(), delta.context.max(self.replica))
    }

    fn delta_tag_maxima(&self, delta: &OrCuckooDelta) -> Vec<(ReplicaId, u64)> {
        delta.context.maxima().collect()
    }
}

/// Tags are packed as an index into the list of replicas present plus a counter, each at the
/// width its largest value needs.
#[derive(Serialize, Deserialize)]
struct OrCuckooRepr {
    params: CuckooParams,
    replica: ReplicaId,
    clock: u64,
    history: CausalContext,
    table: TableRepr,
    tag_replicas: Vec<ReplicaId>,
    counter_bits: u8,
    #[serde(with = "serde_bytes")]
    tag_replica_indexes: Vec<u8>,
    #[serde(with = "serde_bytes")]
    tag_counters: Vec<u8>,
}

pub(crate) struct PackedTags {
    pub replicas: Vec<ReplicaId>,
    pub counter_bits: u8,
    pub indexes: Vec<u8>,
    pub counters: Vec<u8>,
}

pub(crate) fn pack_tags(tags: &[u64]) -> PackedTags {
    let mut replicas: Vec<ReplicaId> = tags.iter().map(|&t| Dot::unpack(t).replica).collect();
    replicas.sort_unstable();
    replicas.dedup();
    let max_counter = tags
        .iter()
        .map(|&t| Dot::unpack(t).counter)
        .max()
        .unwrap_or(0);
    let counter_bits = bits_for(max_counter);
    let index_bits = bits_for(replicas.len().saturating_sub(1) as u64);
    let index_of = |r: ReplicaId| replicas.binary_search(&r).expect("collected") as u64;
    PackedTags {
        indexes: pack(
            tags.iter().map(|&t| index_of(Dot::unpack(t).replica)),
            index_bits,
        ),
        counters: pack(tags.iter().map(|&t| Dot::unpack(t).counter), counter_bits),
        counter_bits: counter_bits as u8,
        replicas,
    }
}

pub(crate) fn unpack_tags(p: &PackedTags, n: usize) -> Result<Vec<u64>, FilterError> {
    let index_bits = bits_for(p.replicas.len().saturating_sub(1) as u64);
    if p.counter_bits > 48 || (n > 0 && p.replicas.is_empty()) {
        return Err(FilterError::malformed("bad tag encoding"));
    }
    let idx = unpack(&p.indexes, index_bits, n)?;
    let ctr = unpack(&p.counters, p.counter_bits as u32, n)?;
    idx.into_iter()
        .zip(ctr)
        .map(|(i, counter)| {
            let replica = *p
                .replicas
                .get(i as usize)
                .ok_or_else(|| FilterError::malformed("tag replica index"))?;
            if counter == 0 {
                return Err(FilterError::malformed("tag with timestamp 0"));
            }
            Ok(Dot { replica, counter }.pack())
        })
        .collect()
}

/// Checks the ORCF invariants on decoded parts: tags are unique and observed by the history.
pub(crate) fn check_tags(table: &Table<u64>, history: &CausalContext) -> Result<(), FilterError> {
    let mut tags = Vec::with_capacity(table.len());
    table.for_each(|_, e| tags.push(e.payload));
    if let Some(t) = tags.iter().find(|&&t| !history.contains_tag(t)) {
        return Err(FilterError::malformed(format!(
            "entry tag {:?} not in the causal history",
            Dot::unpack(*t)
        )));
    }
    tags.sort_unstable();
    if tags.windows(2).any(|w| w[0] == w[1]) {
        return Err(FilterError::malformed("duplicate version tag"));
    }
    Ok(())
}

impl Serialize for OrCuckoo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut tags = Vec::with_capacity(self.table.len());
        self.table.for_each(|_, e| tags.push(e.payload));
        let p = pack_tags(&tags);
        OrCuckooRepr {
            params: *self.params(),
            replica: self.replica,
            clock: self.clock,
            history: self.history.clone(),
            table: self.table.to_repr(),
            tag_replicas: p.replicas,
            counter_bits: p.counter_bits,
            tag_replica_indexes: p.indexes,
            tag_counters: p.counters,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for OrCuckoo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = OrCuckooRepr::deserialize(d)?;
        let packed = PackedTags {
            replicas: r.tag_replicas,
            counter_bits: r.counter_bits,
            indexes: r.tag_replica_indexes,
            counters: r.tag_counters,
        };
        let seed = rng_seed(&r.params, r.replica);
        let table = Table::from_repr(r.params, &r.table, |n| unpack_tags(&packed, n), seed)
            .map_err(serde::de::Error::custom)?;
        check_tags(&table, &r.history).map_err(serde::de::Error::custom)?;
        if r.clock > MAX_COUNTER {
            return Err(serde::de::Error::custom(FilterError::malformed(
                "clock out of range",
            )));
        }
        Ok(OrCuckoo::from_parts(table, r.history, r.replica, r.clock))
    }
}

impl crate::core::kind::ReplicatedFilter for OrCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::OrCuckoo;
    const REMOVABLE: bool = true;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        replica: ReplicaId,
    ) -> Result<Self, FilterError> {
        OrCuckoo::new(spec.cuckoo_params()?, replica)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    fn prefetch(&self, item: &[u8]) {
        let (b, fp) = self.position(item);
        self.table.prefetch(b, fp);
    }

    /// The buckets and the tags an add of the item writes.
    fn prefetch_add(&self, item: &[u8]) {
        let (b, fp) = self.position(item);
        self.table.prefetch_insert(b, fp);
    }

    fn prefetch_ahead(&self) -> usize {
        crate::core::prefetch::CUCKOO_ITEMS_AHEAD
    }

    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        crate::core::kind::digest_observed_remove(self, h);
    }

    fn observed_remove(&self) -> Option<&dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn observed_remove_mut(&mut self) -> Option<&mut dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn live_occurrences(&self) -> Vec<Occurrence> {
        OrCuckoo::live_occurrences(self)
    }

    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        self.import_part(occurrences, room)
            .map(|dots| dots.len() as u64)
    }

    fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        OrCuckoo::check_import(self, occurrences, room)
    }
}

impl crate::core::kind::ObservedRemove for OrCuckoo {
    fn replica(&self) -> ReplicaId {
        OrCuckoo::replica(self)
    }
    fn set_replica(&mut self, replica: ReplicaId) {
        OrCuckoo::set_replica(self, replica)
    }
    fn clock(&self) -> u64 {
        OrCuckoo::clock(self)
    }
    fn advance_clock(&mut self, floor: u64) {
        OrCuckoo::advance_clock(self, floor)
    }
    fn add_dot(&mut self, item: &[u8]) -> Result<Dot, FilterError> {
        OrCuckoo::add_dot(self, item)
    }
    fn remove_dot(&mut self, item: &[u8]) -> Option<Dot> {
        OrCuckoo::remove_dot(self, item)
    }
    fn occurrences(&self, item: &[u8]) -> u64 {
        OrCuckoo::occurrences(self, item)
    }
    fn dots(&self) -> Vec<Dot> {
        OrCuckoo::dots(self)
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.for_each_tag(|t| f(Dot::unpack(t)))
    }
    fn history(&self) -> std::borrow::Cow<'_, CausalContext> {
        std::borrow::Cow::Borrowed(OrCuckoo::history(self))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;

    use super::*;

    /// A dump of `n` distinct items, item `i` added `1 + i % 3` times, by replica 1.
    fn dumped(n: u32) -> (OrCuckoo, Vec<(Dot, u32)>) {
        let mut f = OrCuckoo::with_capacity(1000, 0.001, 1).unwrap();
        let mut added = Vec::new();
        for i in 0..n {
            for _ in 0..=(i % 3) {
                added.push((f.add_dot(&i.to_le_bytes()).unwrap(), i));
            }
        }
        (f, added)
    }

    #[test]
    fn an_import_re_adds_every_entry_under_this_replicas_own_fresh_tags() {
        let (dump, _) = dumped(200);
        let mut f = OrCuckoo::with_capacity(1000, 0.001, 7).unwrap();
        f.add(b"already here").unwrap();
        let clock = f.clock();
        let tags = f.import(&dump.live_occurrences()).unwrap();
        assert_eq!(tags.len(), dump.dots().len());
        // Fresh tags of replica 7, right above its clock; none of replica 1's.
        assert!(tags.iter().all(|t| t.replica == 7));
        let counters: Vec<u64> = tags.iter().map(|t| t.counter).collect();
        assert_eq!(
            counters,
            (clock + 1..=clock + tags.len() as u64).collect::<Vec<_>>()
        );
        assert_eq!(f.clock(), clock + tags.len() as u64);
        assert!(!f.history().replicas().any(|r| r == 1));
        for i in 0..200u32 {
            let item = i.to_le_bytes();
            assert_eq!(f.occurrences(&item), dump.occurrences(&item), "item {i}");
        }
        assert!(f.contains(b"already here"));
        // Removable like any entry: every occurrence, one at a time.
        let item = 5u32.to_le_bytes();
        for _ in 0..dump.occurrences(&item) {
            assert_eq!(f.remove_dot(&item).map(|d| d.replica), Some(7));
        }
        assert!(!f.contains(&item) && dump.contains(&item));
    }

    #[test]
    fn occurrences_are_listed_in_the_order_of_the_dots() {
        let (dump, added) = dumped(30);
        let item_of: HashMap<Dot, u32> = added.into_iter().collect();
        let occurrences = dump.live_occurrences();
        for (o, dot) in occurrences.iter().zip(dump.dots()) {
            let mut one = OrCuckoo::with_capacity(1000, 0.001, 2).unwrap();
            one.import(std::slice::from_ref(o)).unwrap();
            assert!(one.contains(&item_of[&dot].to_le_bytes()));
        }
        assert_eq!(occurrences.len(), dump.dots().len());
    }

    #[test]
    fn an_imports_delta_replays_to_the_same_state() {
        let (dump, _) = dumped(150);
        let mut f = OrCuckoo::with_capacity(1000, 0.001, 3).unwrap();
        f.add(b"x").unwrap();
        let before = f.clone();
        f.track_deltas(true);
        f.import(&dump.live_occurrences()).unwrap();
        let delta = f.take_delta().unwrap();
        assert_eq!(delta.entries.len(), dump.dots().len());
        let mut replayed = before.clone();
        replayed.merge_delta(&delta).unwrap();
        assert!(replayed.equivalent(&f));
        assert!(before.le(&f) && !f.le(&before), "an import inflates");
        // A peer merges it too: it carries only replica 3's tags.
        let mut peer = OrCuckoo::with_capacity(1000, 0.001, 4).unwrap();
        peer.merge(&before).unwrap();
        peer.merge_delta(&delta).unwrap();
        assert!(peer.equivalent(&f));
    }

    #[test]
    fn a_refused_import_changes_nothing() {
        let (dump, _) = dumped(50);
        let occurrences = dump.live_occurrences();
        let mut f = OrCuckoo::with_capacity(1000, 0.001, 3).unwrap();
        f.add(b"x").unwrap();
        let encoded = |f: &OrCuckoo| serde_cbor::to_vec(f).unwrap();
        let before = encoded(&f);
        // Of other parameters: a bucket past the table, a fingerprint too wide, a sub-filter.
        let buckets = f.params().buckets;
        for bad in [
            Occurrence::at(buckets, 1, 1),
            Occurrence::at(0, u16::MAX, 1),
            Occurrence {
                sub: 1,
                ..occurrences[0]
            },
        ] {
            let mut with_bad = occurrences.clone();
            with_bad.push(bad);
            assert!(matches!(
                f.import(&with_bad),
                Err(FilterError::Incompatible(_))
            ));
            assert_eq!(encoded(&f), before);
        }
        // Fewer timestamps left than occurrences.
        f.advance_clock(MAX_COUNTER - 10);
        let before = encoded(&f);
        assert!(matches!(
            f.import(&occurrences),
            Err(FilterError::ClockExhausted { replica: 3 })
        ));
        assert_eq!(encoded(&f), before);
    }

    #[test]
    fn a_dump_with_overflowing_buckets_loads_whole_into_an_empty_filter() {
        // Two replicas filling a small table concurrently: their merge overflows buckets.
        let p = CuckooParams::with_capacity(100, 0.01).unwrap();
        let (mut a, mut b) = (OrCuckoo::new(p, 1).unwrap(), OrCuckoo::new(p, 2).unwrap());
        for i in 0..400u32 {
            let _ = a.add(&i.to_le_bytes());
            let _ = b.add(&(i + 1000).to_le_bytes());
        }
        a.merge(&b).unwrap();
        assert!(a.overflow_len() > 0, "the dump overflows");
        let mut f = OrCuckoo::new(p, 3).unwrap();
        let tags = f.import(&a.live_occurrences()).unwrap();
        assert_eq!(tags.len(), a.dots().len());
        for i in (0..400u32).chain(1000..1400) {
            let item = i.to_le_bytes();
            assert_eq!(f.occurrences(&item), a.occurrences(&item));
        }
        // Not twice, though: the table would hold more than the dump did, without bound.
        let before = serde_cbor::to_vec(&f).unwrap();
        assert!(matches!(
            f.import(&a.live_occurrences()),
            Err(FilterError::NoRoom {
                series: 0,
                sub: 0,
                ..
            })
        ));
        assert_eq!(serde_cbor::to_vec(&f).unwrap(), before);
    }

    #[test]
    fn a_dump_loads_beside_what_a_filter_holds_while_its_slots_suffice() {
        let (dump, _) = dumped(100);
        let mut f = OrCuckoo::with_capacity(1000, 0.001, 3).unwrap();
        let slots = f.params().slots();
        // Twice is 400 entries, three times 600: within the slots. Then no more.
        let mut loads = 0;
        loop {
            let before = serde_cbor::to_vec(&f).unwrap();
            match f.import(&dump.live_occurrences()) {
                Ok(_) => loads += 1,
                Err(FilterError::NoRoom { entries, room, .. }) => {
                    assert_eq!(room, slots);
                    assert!(entries > slots);
                    assert_eq!(serde_cbor::to_vec(&f).unwrap(), before);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(loads, slots / dump.dots().len() as u64);
        assert_eq!(f.occurrences(&7u32.to_le_bytes()), loads * 2);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(u8),
        Remove(u8),
        Take,
        /// Tags under another id from now on (lower ids break the ascending order of tags).
        SetReplica(ReplicaId),
        /// A merge of a peer's state that holds some of our items and removed others.
        Merge,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (0..40u8).prop_map(Step::Add),
            4 => (0..40u8).prop_map(Step::Remove),
            1 => Just(Step::Take),
            1 => (1..6u16).prop_map(Step::SetReplica),
            1 => Just(Step::Merge),
        ]
    }

    /// The pending delta as maps keyed by tag: what `PendingOr` kept before it kept lists.
    #[derive(Default)]
    struct Model {
        entries: BTreeMap<Dot, (u64, u16)>,
        removed: BTreeMap<Dot, (u64, u16)>,
        context: CausalContext,
    }

    fn params() -> CuckooParams {
        // Small enough that adds fail now and then, once it fills.
        CuckooParams {
            buckets: 8,
            bucket_size: 4,
            fingerprint_bits: 8,
            max_kicks: 20,
            seed: 9,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The pending delta's lists (an entry added and removed before the delta is taken
        /// leaves the added ones; tags out of order after an id change) give the delta the
        /// maps keyed by tag gave, its length counts what they counted, and the clock kept
        /// is the computed one throughout.
        #[test]
        fn pending_lists_give_the_delta_maps_gave(steps in prop::collection::vec(step(), 0..120)) {
            let mut f = OrCuckoo::new(params(), 3).unwrap();
            let mut peer = OrCuckoo::new(params(), 7).unwrap();
            f.track_deltas(true);
            let mut model = Model::default();
            for s in steps {
                match s {
                    Step::Add(i) => {
                        let item = [i];
                        if let Ok(dot) = f.add_dot(&item) {
                            let (b, fp) = f.position(&item);
                            model.entries.insert(dot, (b as u64, fp));
                            model.context.insert(dot);
                        }
                    }
                    Step::Remove(i) => {
                        let item = [i];
                        if let Some(dot) = f.remove_dot(&item) {
                            let (b, fp) = f.position(&item);
                            model.entries.remove(&dot);
                            model.removed.insert(dot, (b as u64, fp));
                            model.context.insert(dot);
                        }
                    }
                    Step::Take => {
                        let delta = f.take_delta();
                        let m = std::mem::take(&mut model);
                        if m.context.is_empty() {
                            prop_assert!(delta.is_none());
                        } else {
                            let d = delta.expect("changes pending");
                            let flat = |v: BTreeMap<Dot, (u64, u16)>| {
                                v.into_iter().map(|(d, (b, fp))| (b, fp, d)).collect::<Vec<_>>()
                            };
                            prop_assert_eq!(&d.entries, &flat(m.entries));
                            prop_assert_eq!(&d.removed, &flat(m.removed));
                            prop_assert_eq!(&d.context, &m.context);
                            let mut g = OrCuckoo::new(params(), 4).unwrap();
                            prop_assert!(g.check_delta(&d).is_ok());
                            g.merge_delta(&d).unwrap();
                        }
                    }
                    Step::SetReplica(r) => f.set_replica(r),
                    Step::Merge => {
                        peer.merge(&f).unwrap();
                        let _ = peer.remove(&[0]);
                        let _ = peer.add(&[1]);
                        f.merge(&peer).unwrap();
                    }
                }
                prop_assert_eq!(
                    f.pending_delta_len(),
                    model.entries.len() + model.removed.len()
                );
                prop_assert_eq!(f.clock(), f.clock.max(f.history.max(f.replica)));
            }
        }
    }
}
