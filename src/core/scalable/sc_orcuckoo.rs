//! ScORCF: the scalable observed-remove cuckoo filter (thesis Spec. 8).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::params::ScalableParams;
use super::series::{compound, load};
use crate::core::causal::{
    CausalContext, Dot, MAX_COUNTER, ReplicaId, check_own_dots, clamp_clock, next_dot,
};
use crate::core::cuckoo::orcuckoo_parts::{
    PackedTags, PendingOr, check_listed_dots, check_tags, merge_tables, pack_tags, remove_random,
    table_le, unpack_tags,
};
use crate::core::cuckoo::table::{Entry, Table, TableRepr};
use crate::core::delta::{CheckRemote, DeltaState, MAX_SUBS_AHEAD, ScOrCuckooDelta};
use crate::core::error::FilterError;
use crate::core::hash::{cuckoo_position, hash_item};
use crate::core::kind::{FilterKind, ImportRoom, Occurrence, tags_to_issue};
use crate::core::lattice::{Lattice, Membership, Removable};
use crate::core::params::CuckooParams;

/// A scalable observed-remove cuckoo filter (thesis Spec. 8): a series of ORCF tables sharing
/// one causal history. An add goes to the newest sub-filter with room; a remove picks a random
/// sub-filter holding the item, and trailing empty sub-filters are dropped.
///
/// ```
/// use crpf::{Lattice, Membership, Removable, ScOrCuckoo};
///
/// let mut a = ScOrCuckoo::with_capacity(100, 0.05, 1)?;
/// let mut b = ScOrCuckoo::with_capacity(100, 0.05, 2)?;
/// for i in 0..500u32 { a.add(&i.to_le_bytes())?; }
/// b.merge(&a)?;
/// assert!(b.remove(&7u32.to_le_bytes()));
/// a.merge(&b)?;
/// assert_eq!(a.cardinality(), 499.0);           // the remove observed by a, too
/// assert!(a.contains(&8u32.to_le_bytes()));
/// assert!(a.equivalent(&b));
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct ScOrCuckoo {
    params: ScalableParams,
    subs: Vec<Table<u64>>,
    history: CausalContext,
    replica: ReplicaId,
    clock: u64,
    /// Local updates since the last `take_delta`, located by (sub-filter, bucket, fp).
    pending: Option<PendingOr<(u32, u64, u16)>>,
}

impl ScOrCuckoo {
    /// A series whose first sub-filter holds `initial_capacity` elements, with compounded FPR
    /// bounded by `fpr`, adding as `replica`.
    pub fn with_capacity(
        initial_capacity: u64,
        fpr: f64,
        replica: ReplicaId,
    ) -> Result<Self, FilterError> {
        Self::new(
            ScalableParams::with_capacity(initial_capacity, fpr)?,
            replica,
        )
    }

    /// A series with explicit parameters, adding as `replica`.
    pub fn new(params: ScalableParams, replica: ReplicaId) -> Result<Self, FilterError> {
        let params = params.validated()?;
        params.cuckoo(0)?;
        Ok(Self {
            params,
            subs: Vec::new(),
            history: CausalContext::new(),
            replica,
            clock: 0,
            pending: None,
        })
    }

    /// The series' parameters.
    pub fn params(&self) -> &ScalableParams {
        &self.params
    }

    /// The replica id new tags are issued under.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// Issues future tags under another replica id.
    pub fn set_replica(&mut self, replica: ReplicaId) {
        self.replica = replica;
        self.clock = 0;
    }

    /// Highest timestamp this replica may have issued.
    pub fn clock(&self) -> u64 {
        self.clock.max(self.history.max(self.replica))
    }

    /// Guarantees every future tag of this replica has a timestamp above `floor`. A floor at
    /// or past [`MAX_COUNTER`] leaves no timestamp: the clock stops there and every add fails
    /// with [`FilterError::ClockExhausted`].
    pub fn advance_clock(&mut self, floor: u64) {
        self.clock = self.clock.max(clamp_clock(floor));
    }

    /// The shared causal history.
    pub fn history(&self) -> &CausalContext {
        &self.history
    }

    /// Number of sub-filters.
    pub fn sub_filters(&self) -> usize {
        self.subs.len()
    }

    /// Calls `f` with the packed tag ([`Dot::pack`]) of every entry, without collecting them.
    pub(crate) fn for_each_tag(&self, mut f: impl FnMut(u64)) {
        for t in &self.subs {
            t.for_each(|_, e| f(e.payload));
        }
    }

    /// The version tags of every entry.
    pub fn dots(&self) -> Vec<Dot> {
        let mut v = Vec::new();
        for t in &self.subs {
            t.for_each(|_, e| v.push(Dot::unpack(e.payload)));
        }
        v
    }

    fn position(t: &Table<u64>, item: &[u8]) -> (usize, u16) {
        let p = t.params();
        cuckoo_position(
            hash_item(item, p.seed),
            p.buckets,
            p.fingerprint_bits as u32,
        )
    }

    fn new_sub(&self, index: usize) -> Result<Table<u64>, FilterError> {
        let p = self.params.cuckoo(index)?;
        Ok(Table::new(
            p,
            p.seed ^ (self.replica as u64).rotate_left(32),
        ))
    }

    /// Adds the item under a fresh tag and returns the tag. An error (`Full`,
    /// `ClockExhausted`, `TooLarge`, `TooManySubFilters`) changes nothing.
    pub fn add_dot(&mut self, item: &[u8]) -> Result<Dot, FilterError> {
        let dot = next_dot(self.replica, self.clock())?;
        let subs_before = self.subs.len();
        match self.place(item, dot) {
            Ok((sub, b, fp)) => {
                if let Some(pending) = &mut self.pending {
                    pending.added(dot, (sub as u32, b as u64, fp));
                }
                self.history.insert(dot);
                self.clock = dot.counter;
                Ok(dot)
            }
            Err(e) => {
                // Failed insertions roll themselves back; only sub-filters this call appended
                // remain to drop, so that a failed add leaves the filter exactly as it was.
                self.subs.truncate(subs_before);
                Err(e)
            }
        }
    }

    /// Inserts the entry of `item` tagged `dot` (Spec. 8, line 8: into the newest sub-filter
    /// with room that takes it, expanding as needed) and returns where it went.
    fn place(&mut self, item: &[u8], dot: Dot) -> Result<(usize, usize, u16), FilterError> {
        if self.subs.last().is_none_or(|t| t.len() >= t.slots()) {
            self.subs.push(self.new_sub(self.subs.len())?);
        }
        let entry_in = |t: &Table<u64>| {
            let (b, fp) = Self::position(t, item);
            (
                b,
                Entry {
                    fp,
                    payload: dot.pack(),
                },
            )
        };
        for (i, t) in self.subs.iter_mut().enumerate().rev() {
            if t.len() < t.slots() {
                let (b, e) = entry_in(t);
                if t.insert(b, e).is_ok() {
                    return Ok((i, b, e.fp));
                }
            }
        }
        let mut t = self.new_sub(self.subs.len())?;
        let (b, e) = entry_in(&t);
        t.insert(b, e)?;
        self.subs.push(t);
        Ok((self.subs.len() - 1, b, e.fp))
    }

    /// Every entry, located by sub-filter, in the order of [`ScOrCuckoo::dots`]
    /// ([`crate::ReplicatedFilter::live_occurrences`]); `series` is 0.
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        let mut v = Vec::new();
        for (i, t) in self.subs.iter().enumerate() {
            t.for_each(|b, e| {
                v.push(Occurrence {
                    sub: i as u32,
                    ..Occurrence::at(b as u64, e.fp, 1)
                })
            });
        }
        v
    }

    /// Re-adds `occurrences` (a dump's, located as in a series of these parameters: `series`
    /// 0) under fresh tags of this replica, `count` entries each, each into the sub-filter it
    /// came from (a sub-filter's fingerprints fit only its own parameters), and answers the
    /// tags, in order ([`crate::ReplicatedFilter::import_occurrences`]). Sub-filters are added
    /// as needed. All or nothing: a location that does not fit
    /// ([`FilterError::Incompatible`]), a sub-filter left past its room
    /// ([`FilterError::NoRoom`]) or past the limits ([`FilterError::TooManySubFilters`],
    /// [`FilterError::TooLarge`]), or too few timestamps left
    /// ([`FilterError::ClockExhausted`]) change nothing.
    pub fn import(&mut self, occurrences: &[Occurrence]) -> Result<Vec<Dot>, FilterError> {
        let room = ImportRoom::of(FilterKind::ScOrCuckoo, occurrences);
        self.import_part(occurrences, &room)
    }

    /// [`ScOrCuckoo::import`] of a part of a dump, whose room (all of it) is `room`.
    pub fn import_part(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<Vec<Dot>, FilterError> {
        let fresh = self.subs_for(occurrences, 0, room)?;
        let start = self.clock();
        tags_to_issue(occurrences, self.replica, start)?;
        self.subs.extend(fresh);
        let dots = self.place_occurrences(occurrences, self.replica, start);
        if let Some(last) = dots.last() {
            self.clock = last.counter;
        }
        Ok(dots)
    }

    /// Whether [`ScOrCuckoo::import_part`] would take `occurrences` now (leaving the clock
    /// aside): [`crate::ReplicatedFilter::check_import`].
    pub fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        self.check_subs(occurrences, 0, room).map(|_| ())
    }

    /// Checks that `occurrences`, of the series `series` names in a dump (all must), fit this
    /// series' sub-filters and leave none past its room, and builds those they name past the
    /// last one (an import adds them): nothing changes, so an error changes nothing.
    pub(crate) fn subs_for(
        &self,
        occurrences: &[Occurrence],
        series: ReplicaId,
        room: &ImportRoom,
    ) -> Result<Vec<Table<u64>>, FilterError> {
        let subs = self.check_subs(occurrences, series, room)?;
        (self.subs.len()..subs).map(|i| self.new_sub(i)).collect()
    }

    /// [`ScOrCuckoo::subs_for`]'s checks: the sub-filters the series will have.
    fn check_subs(
        &self,
        occurrences: &[Occurrence],
        series: ReplicaId,
        room: &ImportRoom,
    ) -> Result<usize, FilterError> {
        let mut params: Vec<CuckooParams> = self.subs.iter().map(|t| *t.params()).collect();
        let mut entries: std::collections::BTreeMap<u32, u64> = Default::default();
        for o in occurrences {
            if o.series != series {
                return Err(FilterError::Incompatible(format!(
                    "occurrence {o:?} names another writer's series than {series}"
                )));
            }
            if o.count == 0 {
                continue;
            }
            let sub = o.sub as usize;
            while params.len() <= sub {
                // Checks the sub-filter count and the series' memory bound.
                params.push(self.params.cuckoo(params.len())?);
            }
            if !params[sub].holds_entry(o.bucket, o.fp) {
                return Err(FilterError::Incompatible(format!(
                    "occurrence {o:?} does not fit these parameters"
                )));
            }
            let n = entries
                .entry(o.sub)
                .or_insert_with(|| self.subs.get(sub).map_or(0, |t| t.len() as u64));
            *n = n.saturating_add(o.count);
        }
        for (sub, n) in entries {
            room.check(series, sub, params[sub as usize].slots(), n)?;
        }
        Ok(params.len())
    }

    /// Appends sub-filters built by [`ScOrCuckoo::subs_for`].
    pub(crate) fn append_subs(&mut self, fresh: Vec<Table<u64>>) {
        self.subs.extend(fresh);
    }

    /// Places `occurrences`, checked by [`ScOrCuckoo::subs_for`] (whose sub-filters are
    /// appended), `count` entries each, under the tags `(replica, after + 1)`, `(replica,
    /// after + 2)`, …, and answers them. Leaves the clock to the caller: the tags may be
    /// another writer's series' ([`crate::WriterScOrCuckoo`]).
    pub(crate) fn place_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        replica: ReplicaId,
        after: u64,
    ) -> Vec<Dot> {
        let mut dots = Vec::new();
        let mut counter = after;
        for o in occurrences {
            for _ in 0..o.count {
                counter += 1;
                let dot = Dot { replica, counter };
                self.place_occurrence(o, dot);
                dots.push(dot);
            }
        }
        dots
    }

    /// Places one entry of `o` tagged `dot` into its sub-filter, which exists.
    pub(crate) fn place_occurrence(&mut self, o: &Occurrence, dot: Dot) {
        self.subs[o.sub as usize].place_imported(
            o.bucket as usize,
            Entry {
                fp: o.fp,
                payload: dot.pack(),
            },
        );
        self.history.insert(dot);
        if let Some(pending) = &mut self.pending {
            pending.added(dot, (o.sub, o.bucket, o.fp));
        }
    }

    /// Removes one entry of the item from a random sub-filter holding it and returns its tag.
    pub fn remove_dot(&mut self, item: &[u8]) -> Option<Dot> {
        let holding: Vec<usize> = (0..self.subs.len())
            .filter(|&i| {
                let (b, fp) = Self::position(&self.subs[i], item);
                self.subs[i].contains_fp(b, fp)
            })
            .collect();
        let first = *holding.first()?;
        let i = holding[self.subs[first].rng().usize(..holding.len())];
        let (b, fp) = Self::position(&self.subs[i], item);
        let dot = remove_random(&mut self.subs[i], b, fp)?;
        self.shrink();
        if let Some(pending) = &mut self.pending {
            pending.removed(dot, (i as u32, b as u64, fp));
        }
        Some(dot)
    }

    /// Spec. 5 *shrink*.
    fn shrink(&mut self) {
        while self.subs.last().is_some_and(|t| t.len() == 0) {
            self.subs.pop();
        }
    }
}

impl fmt::Debug for ScOrCuckoo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScOrCuckoo")
            .field("params", &self.params)
            .field("replica", &self.replica)
            .field(
                "sub_lens",
                &self.subs.iter().map(|t| t.len()).collect::<Vec<_>>(),
            )
            .field("history", &self.history)
            .finish()
    }
}

impl Lattice for ScOrCuckoo {
    /// Sub-filter-wise ORCF merge against the shared histories, padding with bottom.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("scalable", &self.params, &other.params)?;
        // Build the sub-filters we lack before touching anything, so that an error leaves
        // `self` untouched. (It cannot occur for a state built or decoded with our parameters,
        // whose sub-filters all passed the same bounds.)
        let mut fresh = (self.subs.len()..other.subs.len())
            .map(|i| self.new_sub(i))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter();
        for i in 0..self.subs.len().max(other.subs.len()) {
            if i == self.subs.len() {
                self.subs.push(fresh.next().expect("built above"));
            }
            merge_tables(
                &mut self.subs[i],
                &self.history,
                other.subs.get(i),
                &other.history,
            );
        }
        self.history.union(&other.history);
        self.shrink();
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.history.is_subset(&other.history)
            && (0..self.subs.len().max(other.subs.len()))
                .all(|i| table_le(self.subs.get(i), &self.history, other.subs.get(i)))
    }
}

impl Membership for ScOrCuckoo {
    fn contains(&self, item: &[u8]) -> bool {
        self.subs.iter().any(|t| {
            let (b, fp) = Self::position(t, item);
            t.contains_fp(b, fp)
        })
    }

    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.add_dot(item).map(|_| ())
    }

    fn cardinality(&self) -> f64 {
        self.subs.iter().map(|t| t.len() as f64).sum()
    }

    /// Total slots of the sub-filters (those of the first one while there is none).
    fn capacity(&self) -> u64 {
        let slots: u64 = self.subs.iter().map(|t| t.slots() as u64).sum();
        slots.max(self.params.initial_capacity)
    }

    fn load_factor(&self) -> f64 {
        load(self.cardinality(), self.capacity())
    }

    /// Eq. 2.12 over the sub-filters' Eq. 3.18 estimates.
    fn estimated_fpr(&self) -> f64 {
        compound(
            self.subs
                .iter()
                .map(|t| t.params().fpr_at_load(t.load_factor())),
        )
    }
}

impl DeltaState for ScOrCuckoo {
    type Delta = ScOrCuckooDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(PendingOr::default);
    }

    fn take_delta(&mut self) -> Option<ScOrCuckooDelta> {
        let taken = self.pending.as_mut()?.take()?;
        let flat = |v: Vec<((u32, u64, u16), Dot)>| {
            v.into_iter().map(|((s, b, fp), d)| (s, b, fp, d)).collect()
        };
        Some(ScOrCuckooDelta {
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

    /// Every listed entry must fit the sub-filter it names, and name none more than
    /// `MAX_SUBS_AHEAD` past our last one (a receiver further behind catches up by
    /// anti-entropy, so that a forged index cannot make it allocate absurd sub-filters).
    fn check_delta(&self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        self.check_delta_ahead(delta, MAX_SUBS_AHEAD)
    }

    /// Removes the listed removed entries, places the listed entries not yet observed (adding
    /// sub-filters as needed), and unions the context: touching only what the delta lists.
    fn merge_delta(&mut self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        self.join_delta(delta)
    }

    /// Our own delta may name any sub-filter within the series' limits.
    fn merge_own_delta(&mut self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        self.check_own_delta(delta)?;
        self.join_delta(delta)
    }

    fn check_own_delta(&self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        self.check_delta_ahead(delta, ScalableParams::MAX_SUB_FILTERS)
    }
}

impl ScOrCuckoo {
    /// [`DeltaState::check_delta`], letting the delta name sub-filters up to `ahead` past our
    /// last one.
    fn check_delta_ahead(&self, delta: &ScOrCuckooDelta, ahead: usize) -> Result<(), FilterError> {
        // Parameters of every sub-filter the delta may name: ours, then those ahead that are
        // within bounds.
        let params: Vec<_> = (self.subs.iter().map(|t| Ok(*t.params())))
            .chain((self.subs.len()..self.subs.len() + ahead).map(|i| self.params.cuckoo(i)))
            .map_while(Result::ok)
            .collect();
        let fits =
            |s: u32, b: u64, fp: u16| params.get(s as usize).is_some_and(|p| p.holds_entry(b, fp));
        let listed = delta.entries.iter().chain(&delta.removed);
        check_listed_dots(
            listed.map(|&(s, b, fp, d)| (fits(s, b, fp), d)),
            &delta.context,
        )
    }

    /// The join of a checked delta.
    fn join_delta(&mut self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        for &(s, b, fp, dot) in &delta.removed {
            if let Some(t) = self.subs.get_mut(s as usize) {
                t.remove_exact(
                    b as usize,
                    Entry {
                        fp,
                        payload: dot.pack(),
                    },
                );
            }
        }
        for &(s, b, fp, dot) in &delta.entries {
            if self.history.contains(dot) {
                continue;
            }
            while self.subs.len() <= s as usize {
                let t = self.new_sub(self.subs.len())?;
                self.subs.push(t);
            }
            self.subs[s as usize].place_merged(
                b as usize,
                Entry {
                    fp,
                    payload: dot.pack(),
                },
            );
        }
        self.history.union(&delta.context);
        self.shrink();
        Ok(())
    }
}

impl CheckRemote for ScOrCuckoo {
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        check_own_dots(self.replica, self.clock(), other.history.max(self.replica))
    }

    /// A delta's context holds exactly the dots it lists, so checking it covers them all.
    fn check_remote_delta(&self, delta: &ScOrCuckooDelta) -> Result<(), FilterError> {
        check_own_dots(self.replica, self.clock(), delta.context.max(self.replica))
    }

    fn delta_tag_maxima(&self, delta: &ScOrCuckooDelta) -> Vec<(ReplicaId, u64)> {
        delta.context.maxima().collect()
    }
}

impl Removable for ScOrCuckoo {
    fn remove(&mut self, item: &[u8]) -> bool {
        self.remove_dot(item).is_some()
    }
}

#[derive(Serialize, Deserialize)]
struct SubRepr {
    table: TableRepr,
    tag_replicas: Vec<ReplicaId>,
    counter_bits: u8,
    #[serde(with = "serde_bytes")]
    tag_replica_indexes: Vec<u8>,
    #[serde(with = "serde_bytes")]
    tag_counters: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Repr {
    params: ScalableParams,
    replica: ReplicaId,
    clock: u64,
    history: CausalContext,
    subs: Vec<SubRepr>,
}

impl Serialize for ScOrCuckoo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let subs = self
            .subs
            .iter()
            .map(|t| {
                let mut tags = Vec::with_capacity(t.len());
                t.for_each(|_, e| tags.push(e.payload));
                let p = pack_tags(&tags);
                SubRepr {
                    table: t.to_repr(),
                    tag_replicas: p.replicas,
                    counter_bits: p.counter_bits,
                    tag_replica_indexes: p.indexes,
                    tag_counters: p.counters,
                }
            })
            .collect();
        Repr {
            params: self.params,
            replica: self.replica,
            clock: self.clock,
            history: self.history.clone(),
            subs,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ScOrCuckoo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = Repr::deserialize(d)?;
        let params = r.params.validated().map_err(D::Error::custom)?;
        if r.clock > MAX_COUNTER {
            return Err(D::Error::custom(FilterError::malformed(
                "clock out of range",
            )));
        }
        let mut f = ScOrCuckoo {
            params,
            subs: Vec::new(),
            history: r.history,
            replica: r.replica,
            clock: r.clock,
            pending: None,
        };
        for (i, sub) in r.subs.into_iter().enumerate() {
            let p = params.cuckoo(i).map_err(D::Error::custom)?;
            let packed = PackedTags {
                replicas: sub.tag_replicas,
                counter_bits: sub.counter_bits,
                indexes: sub.tag_replica_indexes,
                counters: sub.tag_counters,
            };
            let seed = p.seed ^ (f.replica as u64).rotate_left(32);
            let t = Table::from_repr(p, &sub.table, |n| unpack_tags(&packed, n), seed)
                .map_err(D::Error::custom)?;
            f.subs.push(t);
        }
        // Tags must be unique across sub-filters, not just within one.
        let mut tags: Vec<u64> = Vec::new();
        for t in &f.subs {
            check_tags(t, &f.history).map_err(D::Error::custom)?;
            t.for_each(|_, e| tags.push(e.payload));
        }
        tags.sort_unstable();
        if tags.windows(2).any(|w| w[0] == w[1]) {
            return Err(D::Error::custom(FilterError::malformed(
                "duplicate version tag across sub-filters",
            )));
        }
        Ok(f)
    }
}

impl crate::core::kind::ReplicatedFilter for ScOrCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::ScOrCuckoo;
    const REMOVABLE: bool = true;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        replica: ReplicaId,
    ) -> Result<Self, FilterError> {
        ScOrCuckoo::new(crate::core::kind::scalable_params(spec)?, replica)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        crate::core::kind::digest_observed_remove(self, h);
    }

    fn sub_filters(&self) -> usize {
        ScOrCuckoo::sub_filters(self)
    }

    fn observed_remove(&self) -> Option<&dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn observed_remove_mut(&mut self) -> Option<&mut dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn live_occurrences(&self) -> Vec<Occurrence> {
        ScOrCuckoo::live_occurrences(self)
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
        ScOrCuckoo::check_import(self, occurrences, room)
    }
}

impl crate::core::kind::ObservedRemove for ScOrCuckoo {
    fn replica(&self) -> ReplicaId {
        ScOrCuckoo::replica(self)
    }
    fn set_replica(&mut self, replica: ReplicaId) {
        ScOrCuckoo::set_replica(self, replica)
    }
    fn clock(&self) -> u64 {
        ScOrCuckoo::clock(self)
    }
    fn advance_clock(&mut self, floor: u64) {
        ScOrCuckoo::advance_clock(self, floor)
    }
    fn add_dot(&mut self, item: &[u8]) -> Result<Dot, FilterError> {
        ScOrCuckoo::add_dot(self, item)
    }
    fn remove_dot(&mut self, item: &[u8]) -> Option<Dot> {
        ScOrCuckoo::remove_dot(self, item)
    }
    fn occurrences(&self, item: &[u8]) -> u64 {
        self.subs
            .iter()
            .map(|t| {
                let (b, fp) = Self::position(t, item);
                crate::core::cuckoo::orcuckoo_parts::count_matching(t, b, fp)
            })
            .sum()
    }
    fn dots(&self) -> Vec<Dot> {
        ScOrCuckoo::dots(self)
    }
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.for_each_tag(|t| f(Dot::unpack(t)))
    }
    fn history(&self) -> std::borrow::Cow<'_, CausalContext> {
        std::borrow::Cow::Borrowed(ScOrCuckoo::history(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries_per_sub(f: &ScOrCuckoo) -> Vec<usize> {
        f.subs.iter().map(|t| t.len()).collect()
    }

    #[test]
    fn an_import_keeps_each_entry_in_its_sub_filter_under_fresh_tags() {
        let mut dump = ScOrCuckoo::with_capacity(50, 0.01, 1).unwrap();
        for i in 0..600u32 {
            dump.add(&i.to_le_bytes()).unwrap();
            if i % 4 == 0 {
                dump.add(&i.to_le_bytes()).unwrap();
            }
        }
        assert!(dump.sub_filters() >= 4);
        let mut f = ScOrCuckoo::with_capacity(50, 0.01, 9).unwrap();
        f.track_deltas(true);
        let tags = f.import(&dump.live_occurrences()).unwrap();
        assert!(tags.iter().all(|t| t.replica == 9));
        assert_eq!(f.clock(), tags.len() as u64);
        assert_eq!(entries_per_sub(&f), entries_per_sub(&dump));
        use crate::core::kind::ObservedRemove;
        for i in 0..600u32 {
            let item = i.to_le_bytes();
            assert_eq!(
                ObservedRemove::occurrences(&f, &item),
                ObservedRemove::occurrences(&dump, &item)
            );
        }
        let delta = f.take_delta().unwrap();
        let mut replayed = ScOrCuckoo::with_capacity(50, 0.01, 9).unwrap();
        replayed.merge_delta(&delta).unwrap();
        assert!(replayed.equivalent(&f));
        assert!(f.remove(&3u32.to_le_bytes()));
    }

    #[test]
    fn an_import_past_empty_sub_filters_replays_as_an_own_delta() {
        // Entries only in sub-filter 5 (the ones before emptied by removes, say).
        let mut dump = ScOrCuckoo::with_capacity(50, 0.01, 1).unwrap();
        let far = Occurrence {
            sub: 5,
            ..Occurrence::at(3, 1, 2)
        };
        dump.import(&[far]).unwrap();
        assert_eq!(entries_per_sub(&dump), [0, 0, 0, 0, 0, 2]);
        let mut f = ScOrCuckoo::with_capacity(50, 0.01, 2).unwrap();
        let before = f.clone();
        f.track_deltas(true);
        f.import(&dump.live_occurrences()).unwrap();
        assert_eq!(entries_per_sub(&f), [0, 0, 0, 0, 0, 2]);
        let delta = f.take_delta().unwrap();
        // A peer so far behind refuses it (and catches up by anti-entropy); the replica's own
        // log replays it.
        let mut peer = before.clone();
        assert!(peer.merge_delta(&delta).is_err());
        assert!(peer.equivalent(&before));
        let mut replayed = before;
        replayed.merge_own_delta(&delta).unwrap();
        assert!(replayed.equivalent(&f));
    }

    #[test]
    fn a_refused_import_changes_nothing() {
        let mut dump = ScOrCuckoo::with_capacity(50, 0.01, 1).unwrap();
        for i in 0..20u32 {
            dump.add(&i.to_le_bytes()).unwrap();
        }
        let mut f = ScOrCuckoo::with_capacity(50, 0.01, 2).unwrap();
        f.add(b"x").unwrap();
        let encoded = |f: &ScOrCuckoo| serde_cbor::to_vec(f).unwrap();
        let before = encoded(&f);
        let good = dump.live_occurrences();
        let past_limit = Occurrence {
            sub: ScalableParams::MAX_SUB_FILTERS as u32,
            ..good[0]
        };
        let of_a_series = Occurrence {
            series: 1,
            ..good[0]
        };
        for bad in [past_limit, of_a_series] {
            let mut occurrences = good.clone();
            occurrences.push(bad);
            assert!(f.import(&occurrences).is_err());
            assert_eq!(encoded(&f), before);
        }
        // Past the first sub-filter's room: what the dump holds is loaded thrice at most
        // beside x, and a failed load changes nothing.
        let slots = f.subs[0].slots();
        let mut loads = 0;
        while f.import(&good).is_ok() {
            loads += 1;
        }
        assert_eq!(loads, (slots - 1) / good.len());
        let before = encoded(&f);
        assert!(matches!(
            f.import(&good),
            Err(FilterError::NoRoom { sub: 0, .. })
        ));
        assert_eq!(encoded(&f), before);
        let mut g = ScOrCuckoo::with_capacity(50, 0.01, 2).unwrap();
        g.advance_clock(MAX_COUNTER - 5);
        let before = encoded(&g);
        assert!(matches!(
            g.import(&good),
            Err(FilterError::ClockExhausted { .. })
        ));
        assert_eq!(encoded(&g), before);
    }
}
