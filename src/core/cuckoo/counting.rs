//! CCF: the counting cuckoo filter of Li, Luo and Guo, *Multiset synchronization with counting
//! cuckoo filters* (Algorithms 1-3), as a replicated multiset: the counter field of every slot
//! is a per-replica counter, so that increments and decrements made at different replicas
//! converge under merge.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::table::{Entry, Table, TableRepr};
use crate::core::causal::{MAX_COUNTER, ReplicaId, check_own_dots};
use crate::core::delta::{CheckRemote, DeltaState};
use crate::core::error::FilterError;
use crate::core::hash::{cuckoo_position, hash_item};
use crate::core::kind::{FilterKind, ImportRoom, Occurrence};
use crate::core::lattice::{Lattice, Membership, Removable};
use crate::core::params::CuckooParams;

/// The counter of one slot, per source replica: `(replica, added, removed)`, ascending by
/// replica, where `added` counts the occurrences `replica` added and `removed` how many of
/// *those* occurrences have been removed, by any replica. Invariant: `1 <= added` and
/// `removed <= added` for every pair, and `added <= MAX_COUNTER` (2^48 - 1, the bound of tag
/// timestamps): a received count above it is refused, so that no forged message can carry a
/// source's count to where its next add would overflow, and the sum over all 65,535 sources
/// stays within `u64`.
pub type SlotCounts = Vec<(ReplicaId, u64, u64)>;

/// A counting cuckoo filter replicated as a CRDT: a cuckoo table of fingerprints whose slots
/// carry a multiplicity (paper Fig. 2), kept as a PN-counter per source replica.
///
/// # Operations (paper Algorithms 1-3)
///
/// - [`add_count`](Self::add_count) (Algorithm 1): if the element's fingerprint is already in
///   one of its two candidate buckets, its counter grows; otherwise the fingerprint and count
///   are stored by kick-and-reallocate. A failed insertion (`Full` after `max_kicks` kicks)
///   leaves the filter exactly as it was.
/// - [`remove_all`](Self::remove_all) (Algorithm 2) removes every occurrence;
///   [`remove_count`](Self::remove_count) some of them.
/// - [`count`](Self::count) (Algorithm 3) returns the multiplicity, 0 for a non-member.
///
/// # The replicated counter, and why a multiplicity never goes negative
///
/// A slot is identified by its *key*, the unordered pair of candidate buckets and the
/// fingerprint (the same for every placement, so replicas agree on it). Its counter holds, per
/// source replica `s`, a pair of grow-only counts `(P_s, N_s)`: `P_s` occurrences added at `s`,
/// and `N_s` of those removed (by anyone). The multiplicity is `Σ P_s - Σ N_s` and merge is the
/// pointwise maximum.
///
/// The occurrences a replica adds are numbered `1, 2, …, P_s`; a remove takes the next live
/// one of some source, occurrence `N_s + 1` of `s`, so the removed occurrences of `s` are
/// always a prefix `1..=N_s` and a count describes them exactly. A remove is refused where
/// the local view has nothing live (`P_s = N_s` for every `s`): it never sets `N_s` above
/// `P_s`. **Proof that no state, local or merged, has a negative multiplicity:** every state a
/// replica creates keeps `N_s <= P_s` for each `s` (adds raise `P_s`, removes raise `N_s` only
/// while `N_s < P_s`), and the join keeps it: if `N_s <= P_s` and `N'_s <= P'_s` then
/// `max(N_s, N'_s) <= max(P_s, P'_s)`. So each term `P_s - N_s` is non-negative in every
/// reachable state, and so is their sum. No clamping is needed, and an add is never absorbed
/// by an earlier over-removal.
///
/// **What concurrent decrements do.** Two replicas that concurrently remove an occurrence of
/// the same source remove the *same* occurrence (`N_s + 1` in both views), so after merging
/// they count once: from a multiplicity of 1, two concurrent removes give 0, not -1. This is
/// the observed-remove semantics of [`crate::OrCuckoo`] (a remove deletes an occurrence it
/// observed; concurrent removes of one occurrence are one remove), at the cost of a counter
/// per source instead of a tag per occurrence. Which occurrence a remove takes is one rule
/// every replica applies alike: the next live occurrence of the **lowest source id** that has
/// one. Replicas that remove concurrently from one view therefore take the same occurrence.
/// (Taking one's own occurrences first, as this type once did, let two replicas that each
/// removed one occurrence of an element `x` take two different occurrences, and when another
/// element `y` shared the slot (same key), one of them was `y`'s: `y` then read 0 though it
/// was never removed, a false negative. With one rule, a slot never reads below the true
/// multiplicity of what it holds; concurrent removes of *different* elements sharing a slot
/// may count once, so a colliding element can read above its own, like a false positive.
/// The rule needs the removers to agree on the slot's live sources: a replica that removes
/// `x` right after an add of a colliding `y` that no peer has merged yet can still take
/// `y`'s occurrence while a peer takes `x`'s; without a tag per occurrence, as
/// [`crate::OrCuckoo`] keeps, no rule can tell them apart.)
/// Sequential removes all count. An add concurrent with a remove creates an occurrence the
/// remove did not observe: the add wins.
/// Merge is a pointwise maximum, so it is idempotent, commutative and associative, and
/// replicas that have seen the same updates have the same state and the same multiplicities.
///
/// **Costs.** A slot whose multiplicity went back to 0 keeps its counter (and its slot):
/// forgetting it would let a merge with a replica that still has the old counts resurrect them.
/// Adding the element again reuses it. Replica ids must not be shared (a replica only raises
/// its own `P`), the same assumption as for OrCuckoo's tags; see [`CheckRemote`].
///
/// Colliding elements (same key, probability per paper Eq. 5-7 about `2cα / 2^l`) share a
/// counter: a query returns the sum of their multiplicities.
///
/// ```
/// use crpf::{CountingCuckoo, Lattice, Membership, Removable};
///
/// let mut a = CountingCuckoo::with_capacity(1000, 0.01, 1)?;
/// let mut b = CountingCuckoo::with_capacity(1000, 0.01, 2)?;
/// a.add_count(b"apple", 3)?;
/// b.merge(&a)?;
/// b.add(b"apple")?;                 // concurrent with...
/// assert_eq!(a.remove_count(b"apple", 2), 2); // ...two removes at a
/// a.merge(&b)?;
/// b.merge(&a)?;
/// assert_eq!((a.count(b"apple"), b.count(b"apple")), (2, 2));
/// assert!(a.remove(b"apple") && a.remove(b"apple"));
/// assert!(!a.remove(b"apple"));     // refused at 0: never negative
/// assert!(!a.contains(b"apple"));
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct CountingCuckoo {
    /// Payload: the index of the slot's key and counts in `slots`.
    table: Table<u64>,
    /// One per table entry, in the order they were created; never removed (see the costs).
    slots: Vec<Slot>,
    replica: ReplicaId,
    /// Indexes into `slots` changed by local updates since the last `take_delta`, while tracking.
    pending: Option<BTreeSet<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Canonical key: the lower of the two candidate buckets, and the fingerprint.
    pub bucket: u64,
    pub fp: u16,
    pub counts: SlotCounts,
}

/// The multiplicity a counter describes: `Σ (added - removed)`. It cannot overflow (at most
/// 65,535 sources of at most [`MAX_COUNTER`] each); saturating anyway costs nothing.
pub(crate) fn multiplicity(counts: &SlotCounts) -> u64 {
    counts
        .iter()
        .fold(0u64, |m, &(_, p, n)| m.saturating_add(p - n))
}

/// `a := a ⊔ b`, pointwise maximum by replica. Both sorted by replica; the result is too.
fn join_counts(a: &mut SlotCounts, b: &SlotCounts) -> bool {
    let mut changed = false;
    for &(r, p, n) in b {
        match a.binary_search_by_key(&r, |e| e.0) {
            Ok(i) => {
                let e = &mut a[i];
                if p > e.1 || n > e.2 {
                    changed = true;
                    e.1 = e.1.max(p);
                    e.2 = e.2.max(n);
                }
            }
            Err(i) => {
                a.insert(i, (r, p, n));
                changed = true;
            }
        }
    }
    changed
}

/// `a ≤ b` pointwise (a missing replica counts as `(0, 0)`).
fn counts_le(a: &SlotCounts, b: &SlotCounts) -> bool {
    a.iter()
        .all(|&(r, p, n)| match b.binary_search_by_key(&r, |e| e.0) {
            Ok(i) => p <= b[i].1 && n <= b[i].2,
            Err(_) => false,
        })
}

/// Checks the invariant of [`SlotCounts`] on decoded or received counts.
pub(crate) fn check_counts(counts: &SlotCounts) -> Result<(), FilterError> {
    if counts.is_empty() {
        return Err(FilterError::malformed("a slot without counts"));
    }
    if counts.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(FilterError::malformed(
            "slot counts not strictly ascending by replica",
        ));
    }
    if let Some(bad) = counts
        .iter()
        .find(|&&(_, p, n)| p == 0 || n > p || p > MAX_COUNTER)
    {
        return Err(FilterError::malformed(format!(
            "slot count {bad:?}: needs 1 <= added <= 2^48 - 1 and removed <= added"
        )));
    }
    Ok(())
}

/// Delta of a [`CountingCuckoo`]: the full counts of every slot local updates changed. Joining
/// it is the pointwise maximum on those slots, so it may arrive late, twice or out of order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountingCuckooDelta {
    /// `(bucket, fingerprint, counts)`; `bucket` is either candidate bucket of the slot.
    pub entries: Vec<(u64, u16, SlotCounts)>,
}

/// Why [`CountingCuckoo::add_count`] failed, besides `Full`: the replica's own count of the
/// slot would pass [`MAX_COUNTER`].
fn overflow_error() -> FilterError {
    FilterError::invalid("count", "the slot's count would exceed 2^48 - 1")
}

/// `count + n`, if it stays within [`MAX_COUNTER`].
fn bounded_add(count: u64, n: u64) -> Result<u64, FilterError> {
    count
        .checked_add(n)
        .filter(|&c| c <= MAX_COUNTER)
        .ok_or_else(overflow_error)
}

impl CountingCuckoo {
    /// A filter for `capacity` distinct elements at false positive rate `fpr`, counting as
    /// `replica`: 4-slot buckets and the fingerprint length of paper Eq. 8.
    pub fn with_capacity(capacity: u64, fpr: f64, replica: ReplicaId) -> Result<Self, FilterError> {
        Self::new(CuckooParams::with_capacity(capacity, fpr)?, replica)
    }

    /// A filter with explicit parameters, counting as `replica`.
    ///
    /// ```
    /// let p = crpf::CuckooParams::with_capacity(100, 0.01)?;
    /// let f = crpf::CountingCuckoo::new(p, 3)?;
    /// assert_eq!((f.replica(), f.total()), (3, 0));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn new(params: CuckooParams, replica: ReplicaId) -> Result<Self, FilterError> {
        let params = params.validated()?;
        Ok(Self {
            table: Table::new(params, rng_seed(&params, replica)),
            slots: Vec::new(),
            replica,
            pending: None,
        })
    }

    /// The filter's parameters.
    pub fn params(&self) -> &CuckooParams {
        self.table.params()
    }

    /// The replica id local adds are counted under.
    pub fn replica(&self) -> ReplicaId {
        self.replica
    }

    /// Entries stored beyond their bucket's `c` slots (only merges create them).
    pub fn overflow_len(&self) -> usize {
        self.table.overflow_len()
    }

    /// Occupied slots, including those whose multiplicity went back to 0.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The cardinality `C(X)` of the represented multiset: the sum of all multiplicities.
    pub fn total(&self) -> u64 {
        self.slots
            .iter()
            .fold(0u64, |t, s| t.saturating_add(multiplicity(&s.counts)))
    }

    /// Every slot with a positive multiplicity: `(lower candidate bucket, fingerprint,
    /// multiplicity)`, ascending. Equivalent states give the same list.
    pub fn entries(&self) -> Vec<(u64, u16, u64)> {
        let mut v: Vec<_> = self
            .slots
            .iter()
            .map(|s| (s.bucket, s.fp, multiplicity(&s.counts)))
            .filter(|e| e.2 > 0)
            .collect();
        v.sort_unstable();
        v
    }

    /// The per-replica counts of the item's slot (empty if it has none).
    pub fn counts(&self, item: &[u8]) -> SlotCounts {
        let (b, fp) = self.position(item);
        self.find(b, fp)
            .map(|i| self.slots[i].counts.clone())
            .unwrap_or_default()
    }

    #[inline]
    pub(crate) fn position(&self, item: &[u8]) -> (usize, u16) {
        let p = self.params();
        cuckoo_position(
            hash_item(item, p.seed),
            p.buckets,
            p.fingerprint_bits as u32,
        )
    }

    /// The canonical key of the slot `(b, fp)` would occupy.
    pub(crate) fn key(&self, b: usize, fp: u16) -> (u64, u16) {
        (b.min(self.table.alt(b, fp)) as u64, fp)
    }

    /// Index in `slots` of the entry with fingerprint `fp` in bucket `b` or its alternate.
    /// There is at most one: a key is stored once.
    #[inline]
    pub(crate) fn find(&self, b: usize, fp: u16) -> Option<usize> {
        let a = self.table.alt(b, fp);
        let hit = |bucket: usize| {
            self.table
                .bucket_entries(bucket)
                .find(|e| e.fp == fp)
                .map(|e| e.payload as usize)
        };
        hit(b).or_else(|| hit(a))
    }

    /// Multiplicity of the slot at key position `(b, fp)`, 0 if there is none.
    pub(crate) fn count_at(&self, b: usize, fp: u16) -> u64 {
        self.find(b, fp)
            .map_or(0, |i| multiplicity(&self.slots[i].counts))
    }

    /// Calls `f(lower candidate bucket, fingerprint, multiplicity)` for every slot.
    pub(crate) fn for_each_slot(&self, mut f: impl FnMut(u64, u16, u64)) {
        for s in &self.slots {
            f(s.bucket, s.fp, multiplicity(&s.counts));
        }
    }

    /// Algorithm 3 (*Query*): the item's multiplicity, 0 if it is not a member. May exceed the
    /// true multiplicity when another element shares the item's slot (a false positive).
    #[inline]
    pub fn count(&self, item: &[u8]) -> u64 {
        let (b, fp) = self.position(item);
        self.count_at(b, fp)
    }

    /// Algorithm 1 (*Insertion*): adds `n` occurrences of the item and returns its new
    /// multiplicity. An error (`Full`: the slot could not be placed within `max_kicks` kicks;
    /// `InvalidParams`: this replica's count of the slot would pass [`MAX_COUNTER`], 2^48 - 1)
    /// changes nothing.
    pub fn add_count(&mut self, item: &[u8], n: u64) -> Result<u64, FilterError> {
        let (b, fp) = self.position(item);
        if n == 0 {
            return Ok(self.count_at(b, fp));
        }
        let me = self.replica;
        // A new slot starts at `n`: it must fit the bound by itself.
        let n = bounded_add(0, n)?;
        let i = match self.find(b, fp) {
            Some(i) => {
                let counts = &mut self.slots[i].counts;
                match counts.binary_search_by_key(&me, |e| e.0) {
                    Ok(k) => counts[k].1 = bounded_add(counts[k].1, n)?,
                    Err(k) => counts.insert(k, (me, n, 0)),
                }
                i
            }
            None => {
                let i = self.slots.len();
                self.table.insert(
                    b,
                    Entry {
                        fp,
                        payload: i as u64,
                    },
                )?;
                let (bucket, fp) = self.key(b, fp);
                self.slots.push(Slot {
                    bucket,
                    fp,
                    counts: vec![(me, n, 0)],
                });
                i
            }
        };
        if let Some(p) = &mut self.pending {
            p.insert(i as u64);
        }
        Ok(multiplicity(&self.slots[i].counts))
    }

    /// Every slot with a positive multiplicity, located, with that multiplicity as its count
    /// ([`crate::ReplicatedFilter::live_occurrences`]).
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        self.slots
            .iter()
            .map(|s| Occurrence::at(s.bucket, s.fp, multiplicity(&s.counts)))
            .filter(|o| o.count > 0)
            .collect()
    }

    /// Re-adds `occurrences` (a dump's, located as in a filter of these parameters) as this
    /// replica's own counts: `count` more occurrences at each slot, as
    /// [`CountingCuckoo::add_count`] of an item of that slot would add
    /// ([`crate::ReplicatedFilter::import_occurrences`]). The dumped counts are other
    /// replicas' (only a replica raises its own), so they are never merged as they are.
    /// Answers the occurrences added. A new slot is placed as an add would be, or, where that
    /// runs out of kicks, overflows its bucket as a merge would. All or nothing: a location
    /// that does not fit ([`FilterError::Incompatible`]), more slots than the table has room
    /// for ([`FilterError::NoRoom`]: its slots, or what the dump held if more) or a count of
    /// this replica past [`MAX_COUNTER`] change nothing.
    ///
    /// ```
    /// use crpf::CountingCuckoo;
    ///
    /// let mut there = CountingCuckoo::with_capacity(1000, 0.01, 1)?;
    /// there.add_count(b"x", 3)?;
    /// let mut here = CountingCuckoo::with_capacity(1000, 0.01, 2)?;
    /// assert_eq!(here.import(&there.live_occurrences())?, 3);
    /// assert_eq!(here.count(b"x"), 3);
    /// assert_eq!(here.counts(b"x"), vec![(2, 3, 0)]); // this replica's own count
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn import(&mut self, occurrences: &[Occurrence]) -> Result<u64, FilterError> {
        let room = ImportRoom::of(FilterKind::CountingCuckoo, occurrences);
        self.import_part(occurrences, &room)
    }

    /// [`CountingCuckoo::import`] of a part of a dump, whose room (all of it) is `room`.
    pub fn import_part(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        self.check_import(occurrences, room)?;
        let me = self.replica;
        let mut added = 0u64;
        for o in occurrences.iter().filter(|o| o.count > 0) {
            let (b, fp) = (o.bucket as usize, o.fp);
            let i = match self.find(b, fp) {
                Some(i) => {
                    let counts = &mut self.slots[i].counts;
                    match counts.binary_search_by_key(&me, |e| e.0) {
                        Ok(k) => counts[k].1 += o.count,
                        Err(k) => counts.insert(k, (me, o.count, 0)),
                    }
                    i
                }
                None => self.push_slot(b, fp, vec![(me, o.count, 0)], Table::place_imported),
            };
            if let Some(p) = &mut self.pending {
                p.insert(i as u64);
            }
            added = added.saturating_add(o.count);
        }
        Ok(added)
    }

    /// Whether [`CountingCuckoo::import_part`] would take `occurrences` now:
    /// [`crate::ReplicatedFilter::check_import`].
    pub fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        let p = *self.params();
        let live = || occurrences.iter().filter(|o| o.count > 0);
        if let Some(o) =
            live().find(|o| o.series != 0 || o.sub != 0 || !p.holds_entry(o.bucket, o.fp))
        {
            return Err(FilterError::Incompatible(format!(
                "occurrence {o:?} does not fit these parameters"
            )));
        }
        // Our count of each slot afterwards, and the slots added.
        let me = self.replica;
        let mut totals: std::collections::BTreeMap<(u64, u16), u64> = Default::default();
        let mut new_slots = 0u64;
        for o in live() {
            let key = self.key(o.bucket as usize, o.fp);
            let total = match totals.get(&key) {
                Some(&t) => t,
                None => match self.find(o.bucket as usize, o.fp) {
                    Some(i) => {
                        let c = &self.slots[i].counts;
                        c.binary_search_by_key(&me, |e| e.0).map_or(0, |k| c[k].1)
                    }
                    None => {
                        new_slots += 1;
                        0
                    }
                },
            };
            totals.insert(key, bounded_add(total, o.count)?);
        }
        let slots = self.table.len() as u64 + new_slots;
        room.check(0, 0, self.table.slots() as u64, slots)
    }

    /// Removes up to `n` occurrences of the item and returns how many it removed: at most its
    /// multiplicity in this replica's view, so nothing is removed from an item counted 0 (a
    /// decrement below zero is refused). Occurrences go in the order every replica uses: the
    /// lowest source id first (see the type's documentation).
    pub fn remove_count(&mut self, item: &[u8], n: u64) -> u64 {
        let (b, fp) = self.position(item);
        let Some(i) = self.find(b, fp) else { return 0 };
        let counts = &mut self.slots[i].counts;
        let mut left = n;
        // Counts are ascending by source.
        for e in counts.iter_mut() {
            if left == 0 {
                break;
            }
            let take = (e.1 - e.2).min(left);
            e.2 += take;
            left -= take;
        }
        let done = n - left;
        if done > 0
            && let Some(p) = &mut self.pending
        {
            p.insert(i as u64);
        }
        done
    }

    /// Removes one occurrence, as [`CountingCuckoo::remove_count`] with 1 would, and names it:
    /// its source replica and its number among that source's occurrences at the item's slot.
    /// `None` (nothing changes) at multiplicity 0.
    pub fn remove_occurrence(&mut self, item: &[u8]) -> Option<crate::Dot> {
        let (b, fp) = self.position(item);
        let i = self.find(b, fp)?;
        let counts = &mut self.slots[i].counts;
        // The rule of remove_count: the lowest source with a live occurrence.
        let k = counts.iter().position(|e| e.1 > e.2)?;
        counts[k].2 += 1;
        let dot = crate::Dot {
            replica: counts[k].0,
            counter: counts[k].2,
        };
        if let Some(p) = &mut self.pending {
            p.insert(i as u64);
        }
        Some(dot)
    }

    /// Algorithm 2 (*Delete*): removes every occurrence of the item and returns how many. The
    /// slot keeps its counter (at multiplicity 0) for the merge, see the type's documentation.
    pub fn remove_all(&mut self, item: &[u8]) -> u64 {
        self.remove_count(item, u64::MAX)
    }

    /// Adds a slot new here for `(b, fp)` with `counts`, its entry placed by `place` (as an
    /// import or a merge places one); its index.
    fn push_slot(
        &mut self,
        b: usize,
        fp: u16,
        counts: SlotCounts,
        place: fn(&mut Table<u64>, usize, Entry<u64>),
    ) -> usize {
        let i = self.slots.len();
        place(
            &mut self.table,
            b,
            Entry {
                fp,
                payload: i as u64,
            },
        );
        let (bucket, fp) = self.key(b, fp);
        self.slots.push(Slot { bucket, fp, counts });
        i
    }

    /// Joins the counts of slot `(b, fp)` from another state, placing the slot if it is new
    /// here (overflowing a bucket if it must: a merge cannot fail). Returns whether it changed.
    fn join_slot(&mut self, b: usize, fp: u16, counts: &SlotCounts) -> bool {
        match self.find(b, fp) {
            Some(i) => join_counts(&mut self.slots[i].counts, counts),
            None => {
                self.push_slot(b, fp, counts.clone(), Table::place_merged);
                true
            }
        }
    }

    /// [`FilterError::OwnDotAhead`] if any of `slots` counts more adds of this replica than
    /// this replica counts at the same slot, for [`CheckRemote`].
    fn own_ahead<'a>(
        &self,
        slots: impl Iterator<Item = (usize, u16, &'a SlotCounts)>,
    ) -> Result<(), FilterError> {
        let me = self.replica;
        for (b, fp, counts) in slots {
            let Ok(k) = counts.binary_search_by_key(&me, |e| e.0) else {
                continue;
            };
            let theirs = counts[k].1;
            let mine = self
                .find(b, fp)
                .and_then(|i| {
                    let c = &self.slots[i].counts;
                    c.binary_search_by_key(&me, |e| e.0).ok().map(|k| c[k].1)
                })
                .unwrap_or(0);
            check_own_dots(me, mine, theirs)?;
        }
        Ok(())
    }
}

fn rng_seed(params: &CuckooParams, replica: ReplicaId) -> u64 {
    params.seed ^ (replica as u64).rotate_left(40) ^ 0x6363_6600
}

impl fmt::Debug for CountingCuckoo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingCuckoo")
            .field("params", self.params())
            .field("replica", &self.replica)
            .field("slots", &self.slots.len())
            .field("total", &self.total())
            .finish()
    }
}

impl Lattice for CountingCuckoo {
    /// Pointwise maximum of the counters, slot by slot (by key).
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("cuckoo", self.params(), other.params())?;
        for s in &other.slots {
            self.join_slot(s.bucket as usize, s.fp, &s.counts);
        }
        Ok(())
    }

    /// Every slot here is in `other` with counts at least as high, replica by replica.
    fn le(&self, other: &Self) -> bool {
        self.params() == other.params()
            && self.slots.iter().all(|s| {
                other
                    .find(s.bucket as usize, s.fp)
                    .is_some_and(|i| counts_le(&s.counts, &other.slots[i].counts))
            })
    }
}

impl Membership for CountingCuckoo {
    /// Multiplicity above 0.
    #[inline]
    fn contains(&self, item: &[u8]) -> bool {
        self.count(item) > 0
    }

    /// One more occurrence ([`CountingCuckoo::add_count`] with 1).
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.add_count(item, 1).map(|_| ())
    }

    /// Distinct elements: slots with a positive multiplicity.
    fn cardinality(&self) -> f64 {
        self.slots
            .iter()
            .filter(|s| s.counts.iter().any(|&(_, p, n)| p > n))
            .count() as f64
    }

    fn capacity(&self) -> u64 {
        self.table.slots() as u64
    }

    /// Occupied slots over slots, counting slots at multiplicity 0 (they take room).
    fn load_factor(&self) -> f64 {
        self.table.load_factor()
    }

    /// Paper Eq. 5-7 at the load of slots with a positive multiplicity: `2cα / (2^l - 1)`. A
    /// key is stored once, so a query matches at most one slot.
    fn estimated_fpr(&self) -> f64 {
        let live = self.cardinality() / self.table.slots() as f64;
        self.params().fpr_at_load_unique(live)
    }
}

impl Removable for CountingCuckoo {
    /// One occurrence; `false` (and nothing changes) if the multiplicity is 0.
    fn remove(&mut self, item: &[u8]) -> bool {
        self.remove_count(item, 1) == 1
    }
}

impl DeltaState for CountingCuckoo {
    type Delta = CountingCuckooDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(BTreeSet::new);
    }

    fn take_delta(&mut self) -> Option<CountingCuckooDelta> {
        let pending = std::mem::take(self.pending.as_mut()?);
        if pending.is_empty() {
            return None;
        }
        let entries = pending
            .into_iter()
            .map(|i| {
                let s = &self.slots[i as usize];
                (s.bucket, s.fp, s.counts.clone())
            })
            .collect();
        Some(CountingCuckooDelta { entries })
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, BTreeSet::len)
    }

    /// Every add records a count of its own: nothing to add.
    fn record_footprint(&mut self, _item: &[u8]) -> bool {
        false
    }

    fn check_delta(&self, delta: &CountingCuckooDelta) -> Result<(), FilterError> {
        let p = self.params();
        for (b, fp, counts) in &delta.entries {
            if !p.holds_entry(*b, *fp) {
                return Err(FilterError::malformed(format!(
                    "delta slot ({b}, {fp}) out of range"
                )));
            }
            check_counts(counts)?;
        }
        Ok(())
    }

    fn merge_delta(&mut self, delta: &CountingCuckooDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for (b, fp, counts) in &delta.entries {
            self.join_slot(*b as usize, *fp, counts);
        }
        Ok(())
    }
}

impl CheckRemote for CountingCuckoo {
    /// Only this replica raises its own `added` counts, so a received state with a higher one
    /// at some slot comes from a replica sharing the id (or is forged). Merging it would make
    /// this replica's next adds there look already counted elsewhere, and vanish in the max:
    /// [`FilterError::OwnDotAhead`] (with the counts as "timestamps").
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        self.own_ahead(
            other
                .slots
                .iter()
                .map(|s| (s.bucket as usize, s.fp, &s.counts)),
        )
    }

    fn check_remote_delta(&self, delta: &CountingCuckooDelta) -> Result<(), FilterError> {
        let p = self.params();
        self.own_ahead(
            delta
                .entries
                .iter()
                .filter(|(b, fp, _)| p.holds_entry(*b, *fp))
                .map(|(b, fp, c)| (*b as usize, *fp, c)),
        )
    }
}

/// The counting filter in a replica: adds and removes of the request API count occurrences
/// under the replica's id.
impl crate::core::kind::ReplicatedFilter for CountingCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::CountingCuckoo;
    const COUNTING: bool = true;
    /// Only an id's own replica raises its counts, and a later run could not continue them
    /// safely: what it restores may lag what peers saw (a full-state push carries updates not
    /// yet in the write-ahead log), and [`CheckRemote`] would then refuse every peer state.
    const REUSES_IDS: bool = false;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        replica: ReplicaId,
    ) -> Result<Self, FilterError> {
        Self::new(spec.cuckoo_params()?, replica)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    /// Every slot's key with all its per-source counts (not only the multiplicity, so that
    /// states that would still exchange counts differ), as an order-free sum.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        let mut sum = crate::core::kind::SetSum::default();
        let mut buf = Vec::new();
        for s in &self.slots {
            buf.clear();
            buf.extend_from_slice(&s.bucket.to_le_bytes());
            buf.extend_from_slice(&s.fp.to_le_bytes());
            for (r, p, n) in &s.counts {
                buf.extend_from_slice(&r.to_le_bytes());
                buf.extend_from_slice(&p.to_le_bytes());
                buf.extend_from_slice(&n.to_le_bytes());
            }
            sum.add(&buf);
        }
        sum.finish(h);
    }

    fn set_writer(&mut self, replica: ReplicaId) {
        self.replica = replica;
    }

    fn counted(&self) -> Option<&dyn crate::core::kind::Counted> {
        Some(self)
    }

    fn counted_mut(&mut self) -> Option<&mut dyn crate::core::kind::Counted> {
        Some(self)
    }

    fn live_occurrences(&self) -> Vec<Occurrence> {
        CountingCuckoo::live_occurrences(self)
    }

    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        self.import_part(occurrences, room)
    }

    fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        CountingCuckoo::check_import(self, occurrences, room)
    }
}

impl crate::core::kind::Counted for CountingCuckoo {
    fn count(&self, item: &[u8]) -> u64 {
        CountingCuckoo::count(self, item)
    }

    fn remove_one(&mut self, item: &[u8]) -> Option<crate::Dot> {
        self.remove_occurrence(item)
    }
}

/// Fingerprints packed in the table's form; the counts in the table's entry order.
#[derive(Serialize, Deserialize)]
struct CountingCuckooRepr {
    params: CuckooParams,
    replica: ReplicaId,
    table: TableRepr,
    counts: Vec<SlotCounts>,
}

impl Serialize for CountingCuckoo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut counts = Vec::with_capacity(self.slots.len());
        self.table
            .for_each(|_, e| counts.push(self.slots[e.payload as usize].counts.clone()));
        CountingCuckooRepr {
            params: *self.params(),
            replica: self.replica,
            table: self.table.to_repr(),
            counts,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for CountingCuckoo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = CountingCuckooRepr::deserialize(d)?;
        let n = r.counts.len();
        // Entry `i` in the table's order gets payload `i`, the index of its counts.
        let table = Table::from_repr(
            r.params,
            &r.table,
            |len| {
                if len == n {
                    Ok((0..n as u64).collect())
                } else {
                    Err(FilterError::malformed(format!(
                        "{len} slots but {n} counters"
                    )))
                }
            },
            rng_seed(&r.params, r.replica),
        )
        .map_err(D::Error::custom)?;
        let mut keys: Vec<Option<(u64, u16)>> = vec![None; n];
        table.for_each(|b, e| {
            let a = table.alt(b, e.fp);
            keys[e.payload as usize] = Some((b.min(a) as u64, e.fp));
        });
        let mut slots = Vec::with_capacity(n);
        for (key, counts) in keys.into_iter().zip(r.counts) {
            check_counts(&counts).map_err(D::Error::custom)?;
            let (bucket, fp) = key.expect("every payload index is used once");
            slots.push(Slot { bucket, fp, counts });
        }
        let mut sorted: Vec<(u64, u16)> = slots.iter().map(|s| (s.bucket, s.fp)).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(D::Error::custom(FilterError::malformed(
                "a slot key is stored twice",
            )));
        }
        Ok(CountingCuckoo {
            table,
            slots,
            replica: r.replica,
            pending: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(replica: ReplicaId) -> CountingCuckoo {
        CountingCuckoo::new(
            CuckooParams {
                buckets: 8,
                bucket_size: 4,
                fingerprint_bits: 12,
                max_kicks: 30,
                seed: 5,
            },
            replica,
        )
        .unwrap()
    }

    /// Paper Fig. 1: a multiset of cardinality `C(X) = 8` in which `m_X(a) = 2` (the figure's
    /// other elements are not in the text; these complete it to 8).
    #[test]
    fn algorithm_1_and_3_represent_the_multiset_of_fig_1() {
        let mut f = CountingCuckoo::with_capacity(100, 0.001, 1).unwrap();
        let x: [(&[u8], u64); 4] = [(b"a", 2), (b"b", 3), (b"c", 1), (b"d", 2)];
        for (item, m) in x {
            for _ in 0..m {
                f.add(item).unwrap();
            }
        }
        assert_eq!(f.total(), 8, "C(X)");
        assert_eq!(f.cardinality(), 4.0, "|X*|");
        for (item, m) in x {
            assert_eq!(f.count(item), m);
        }
        assert_eq!(f.count(b"e"), 0, "Algorithm 3 returns 0 for a non-member");
        // One slot per element, the counter holding the multiplicity (Fig. 2).
        assert_eq!(f.slot_count(), 4);
        assert_eq!(f.add_count(b"a", 5).unwrap(), 7);
        assert_eq!(f.slot_count(), 4);
    }

    #[test]
    fn algorithm_2_deletes_every_occurrence_and_returns_false_for_a_non_member() {
        let mut f = small(1);
        f.add_count(b"a", 4).unwrap();
        f.add_count(b"b", 1).unwrap();
        assert_eq!(f.remove_all(b"a"), 4);
        assert_eq!(f.count(b"a"), 0);
        assert!(!f.contains(b"a") && f.contains(b"b"));
        assert_eq!(f.remove_all(b"a"), 0, "nothing left: False");
        assert_eq!(f.remove_all(b"zzz"), 0, "never inserted: False");
        // The slot stays (its counts are needed by merges) and is reused by a re-add.
        assert_eq!(f.slot_count(), 2);
        assert_eq!(f.add_count(b"a", 1).unwrap(), 1);
        assert_eq!(f.slot_count(), 2);
    }

    #[test]
    fn a_failed_insertion_changes_nothing() {
        let mut f = small(1);
        f.track_deltas(true);
        let mut failures = 0;
        for i in 0..200u32 {
            let before = serde_cbor::to_vec(&f).unwrap();
            let pending = f.pending_delta_len();
            match f.add_count(&i.to_le_bytes(), 2) {
                Ok(_) => assert!(f.count(&i.to_le_bytes()) >= 2),
                Err(FilterError::Full { .. }) => {
                    failures += 1;
                    assert_eq!(serde_cbor::to_vec(&f).unwrap(), before);
                    assert_eq!(f.pending_delta_len(), pending);
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(failures > 0, "the tiny table must fill up");
        // Every element that went in is still counted.
        for i in 0..200u32 {
            let c = f.count(&i.to_le_bytes());
            assert!(c == 0 || c >= 2);
        }
    }

    #[test]
    fn concurrent_removes_of_one_occurrence_count_once() {
        let mut a = small(1);
        a.add(b"x").unwrap();
        let mut b = small(2);
        b.merge(&a).unwrap();
        assert!(a.remove(b"x") && b.remove(b"x"));
        a.merge(&b).unwrap();
        b.merge(&a).unwrap();
        assert_eq!((a.count(b"x"), b.count(b"x")), (0, 0));
        assert!(!a.remove(b"x"), "refused at 0");
        // The over-removal is not a debt: the next add counts.
        b.add(b"x").unwrap();
        a.merge(&b).unwrap();
        assert_eq!(a.count(b"x"), 1);
    }

    #[test]
    fn concurrent_removes_of_one_element_take_the_same_occurrence() {
        let mut a = small(1);
        let mut b = small(2);
        a.add_count(b"x", 1).unwrap();
        b.add_count(b"x", 1).unwrap();
        a.merge(&b).unwrap();
        b.merge(&a).unwrap();
        // One rule for both: the lowest source's occurrence, so they count once...
        assert!(a.remove(b"x") && b.remove(b"x"));
        a.merge(&b).unwrap();
        assert_eq!(a.counts(b"x"), vec![(1, 1, 1), (2, 1, 0)]);
        assert_eq!(a.count(b"x"), 1);
        // ...and sequential removes all count.
        b.merge(&a).unwrap();
        assert!(b.remove(b"x"));
        assert_eq!(b.count(b"x"), 0);
        assert!(!b.remove(b"x"));
    }

    #[test]
    fn removes_take_the_lowest_source_first_whoever_removes() {
        let mut a = small(2);
        let mut b = small(1);
        b.add_count(b"x", 3).unwrap();
        a.merge(&b).unwrap();
        a.add_count(b"x", 1).unwrap();
        assert_eq!(a.remove_count(b"x", 2), 2);
        assert_eq!(a.counts(b"x"), vec![(1, 3, 2), (2, 1, 0)]);
        assert_eq!(
            a.remove_occurrence(b"x"),
            Some(crate::Dot {
                replica: 1,
                counter: 3
            })
        );
        assert_eq!(a.remove_count(b"x", 10), 1);
        assert_eq!(a.count(b"x"), 0);
    }

    /// A table where collisions are common: 8 buckets of 4 slots, 4-bit fingerprints.
    fn tiny(replica: ReplicaId) -> CountingCuckoo {
        CountingCuckoo::new(
            CuckooParams {
                buckets: 8,
                bucket_size: 4,
                fingerprint_bits: 4,
                max_kicks: 30,
                seed: 5,
            },
            replica,
        )
        .unwrap()
    }

    /// Issue 27, point 6: `y` and `x` share a slot; replica 1 adds `y`, replica 2 adds `x`,
    /// they merge, then each removes `x` once, concurrently. With "own source first" each
    /// took its own occurrence and `y` read 0 after the merge, though it was never removed.
    #[test]
    fn a_colliding_element_never_reads_below_its_multiplicity_after_concurrent_removes() {
        let probe = tiny(1);
        let items: Vec<Vec<u8>> = (0u32..2000).map(|i| i.to_le_bytes().to_vec()).collect();
        let (x, y) = items
            .iter()
            .enumerate()
            .find_map(|(i, x)| {
                let kx = {
                    let (b, fp) = probe.position(x);
                    probe.key(b, fp)
                };
                items[i + 1..].iter().find_map(|y| {
                    let (b, fp) = probe.position(y);
                    (probe.key(b, fp) == kx).then_some((x.clone(), y.clone()))
                })
            })
            .expect("two items sharing a slot");
        let mut r1 = tiny(1);
        let mut r2 = tiny(2);
        r1.add(&y).unwrap();
        r2.add(&x).unwrap();
        r1.merge(&r2).unwrap();
        r2.merge(&r1).unwrap();
        assert!(r1.remove(&x) && r2.remove(&x));
        r1.merge(&r2).unwrap();
        r2.merge(&r1).unwrap();
        // The truth: y once, x none; they share the slot, which reads their sum.
        assert_eq!((r1.count(&y), r2.count(&y)), (1, 1));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Against an exact model of the multiset under observed-remove semantics: every add
        /// is an occurrence with its own id; a remove takes one occurrence of the element the
        /// remover has seen live (the one of the lowest source, then the oldest), and
        /// concurrent removes of one occurrence count once. In rounds, each replica makes at
        /// most one update from the state all share, then they all merge, on a table where
        /// collisions are frequent: no element ever reads below its true multiplicity.
        #[test]
        fn no_element_reads_below_its_true_multiplicity(
            rounds in proptest::collection::vec(
                proptest::collection::vec(proptest::option::of((0u8..3, 0u8..12)), 3),
                1..40,
            )
        ) {
            use std::collections::BTreeSet;
            // Occurrences (source, seq, element) every replica has seen, and those removed.
            type Occ = (ReplicaId, u64, u8);
            let mut filters: Vec<CountingCuckoo> = (1..=3).map(tiny).collect();
            let (mut seen, mut removed) = (BTreeSet::<Occ>::new(), BTreeSet::<Occ>::new());
            let mut next_seq = [0u64; 3];
            for round in rounds {
                let (mut added_now, mut removed_now) = (Vec::new(), Vec::new());
                for (r, op) in round.into_iter().enumerate() {
                    let Some((op, e)) = op else { continue };
                    if op >= 2 {
                        // A remove of an element the remover has seen live (removing what
                        // was never added takes a colliding element's occurrence: a false
                        // positive no filter can tell).
                        if let Some(o) = seen.iter().find(|o| o.2 == e && !removed.contains(o)) {
                            proptest::prop_assert!(filters[r].remove(&[e]));
                            removed_now.push(*o);
                        }
                        continue;
                    }
                    if filters[r].add(&[e]).is_ok() {
                        next_seq[r] += 1;
                        added_now.push((r as ReplicaId + 1, next_seq[r], e));
                    }
                }
                seen.extend(added_now);
                removed.extend(removed_now);
                let joined = filters.iter().skip(1).fold(filters[0].clone(), |mut j, f| {
                    j.merge(f).unwrap();
                    j
                });
                for f in &mut filters {
                    f.merge(&joined).unwrap();
                }
                for el in 0u8..12 {
                    let truth = seen
                        .iter()
                        .filter(|o| o.2 == el && !removed.contains(o))
                        .count() as u64;
                    for (i, f) in filters.iter().enumerate() {
                        proptest::prop_assert!(
                            f.count(&[el]) >= truth,
                            "replica {} element {el}: count {} below its multiplicity {truth}",
                            i + 1,
                            f.count(&[el])
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn serde_round_trip_and_tampering() {
        let mut a = small(1);
        for i in 0..20u32 {
            let _ = a.add_count(&i.to_le_bytes(), i as u64 % 3 + 1);
        }
        a.remove_all(&3u32.to_le_bytes());
        let bytes = serde_cbor::to_vec(&a).unwrap();
        let back: CountingCuckoo = serde_cbor::from_slice(&bytes).unwrap();
        assert!(back.equivalent(&a));
        assert_eq!(back.entries(), a.entries());
        let mut repr: CountingCuckooRepr = serde_cbor::from_slice(&bytes).unwrap();
        repr.counts[0][0].2 = repr.counts[0][0].1 + 1; // removed > added
        assert!(
            serde_cbor::from_slice::<CountingCuckoo>(&serde_cbor::to_vec(&repr).unwrap()).is_err()
        );
        let mut repr: CountingCuckooRepr = serde_cbor::from_slice(&bytes).unwrap();
        repr.counts.pop();
        assert!(
            serde_cbor::from_slice::<CountingCuckoo>(&serde_cbor::to_vec(&repr).unwrap()).is_err()
        );
    }

    #[test]
    fn own_counts_ahead_are_refused() {
        let mine = small(1);
        let mut impostor = small(1);
        impostor.add(b"x").unwrap();
        assert!(matches!(
            mine.check_remote(&impostor),
            Err(FilterError::OwnDotAhead { .. })
        ));
        let mut peer = small(2);
        peer.add(b"x").unwrap();
        assert!(mine.check_remote(&peer).is_ok());
    }

    #[test]
    fn count_overflow_is_refused() {
        let mut a = small(1);
        assert!(a.add_count(b"x", MAX_COUNTER + 1).is_err());
        assert_eq!(a.total(), 0);
        a.add_count(b"x", MAX_COUNTER).unwrap();
        let before = serde_cbor::to_vec(&a).unwrap();
        assert!(a.add_count(b"x", 1).is_err());
        assert_eq!(serde_cbor::to_vec(&a).unwrap(), before);
    }

    /// A forged count past the bound, in a state or a delta, is refused whole: received as it
    /// is, it would leave its source unable to add at that slot (and saturate sums).
    #[test]
    fn forged_counts_beyond_the_bound_are_refused() {
        let mut a = small(1);
        a.add_count(b"x", 2).unwrap();
        let mut repr: CountingCuckooRepr =
            serde_cbor::from_slice(&serde_cbor::to_vec(&a).unwrap()).unwrap();
        repr.counts[0][0].1 = MAX_COUNTER + 1;
        let forged = serde_cbor::to_vec(&repr).unwrap();
        assert!(serde_cbor::from_slice::<CountingCuckoo>(&forged).is_err());
        repr.counts[0][0].1 = MAX_COUNTER;
        let at_bound = serde_cbor::to_vec(&repr).unwrap();
        assert!(serde_cbor::from_slice::<CountingCuckoo>(&at_bound).is_ok());

        let mut b = small(2);
        b.track_deltas(true);
        b.add(b"y").unwrap();
        let mut delta = b.take_delta().unwrap();
        let before = serde_cbor::to_vec(&a).unwrap();
        delta.entries[0].2[0].1 = u64::MAX;
        delta.entries[0].2[0].2 = 0;
        assert!(a.check_delta(&delta).is_err());
        assert!(a.merge_delta(&delta).is_err());
        assert_eq!(serde_cbor::to_vec(&a).unwrap(), before);
    }

    #[test]
    fn an_import_adds_the_dumps_multiplicities_as_this_replicas_own_counts() {
        // Counted by replicas 1 and 2, some removed: the dump's multiplicities are what count.
        let mut dump = CountingCuckoo::with_capacity(1000, 0.001, 1).unwrap();
        let mut other = CountingCuckoo::with_capacity(1000, 0.001, 2).unwrap();
        for i in 0..100u32 {
            dump.add_count(&i.to_le_bytes(), 1 + u64::from(i % 4))
                .unwrap();
            other.add_count(&i.to_le_bytes(), 2).unwrap();
        }
        dump.merge(&other).unwrap();
        assert_eq!(dump.remove_count(&7u32.to_le_bytes(), 100), 6);
        let mut f = CountingCuckoo::with_capacity(1000, 0.001, 5).unwrap();
        f.add_count(&3u32.to_le_bytes(), 10).unwrap();
        f.track_deltas(true);
        let before = f.clone();
        let occurrences = dump.live_occurrences();
        assert_eq!(occurrences.len(), 99, "the emptied slot is not listed");
        assert_eq!(f.import(&occurrences).unwrap(), dump.total());
        for i in 0..100u32 {
            let item = i.to_le_bytes();
            let mine = if i == 3 { 10 } else { 0 };
            assert_eq!(f.count(&item), dump.count(&item) + mine, "item {i}");
            // Only this replica's counts: none of replicas 1 and 2.
            assert!(f.counts(&item).iter().all(|&(r, _, _)| r == 5));
        }
        let delta = f.take_delta().unwrap();
        let mut replayed = before.clone();
        replayed.merge_delta(&delta).unwrap();
        assert!(replayed.equivalent(&f));
        assert!(before.le(&f) && !f.le(&before), "an import inflates");
        // Merged with the dump's own replicas, the counts add up: they are different adds.
        let mut all = f.clone();
        all.merge(&dump).unwrap();
        assert_eq!(
            all.count(&0u32.to_le_bytes()),
            2 * dump.count(&0u32.to_le_bytes())
        );
    }

    #[test]
    fn a_refused_import_changes_nothing() {
        let mut dump = small(1);
        dump.add_count(b"x", 3).unwrap();
        dump.add_count(b"y", 1).unwrap();
        let mut f = small(2);
        f.add_count(b"x", MAX_COUNTER - 2).unwrap();
        let before = serde_cbor::to_vec(&f).unwrap();
        // Our count of x's slot would pass the bound.
        assert!(f.import(&dump.live_occurrences()).is_err());
        assert_eq!(serde_cbor::to_vec(&f).unwrap(), before);
        // A location of other parameters.
        let bad = Occurrence::at(f.params().buckets, 1, 1);
        assert!(matches!(
            f.import(&[dump.live_occurrences()[0], bad]),
            Err(FilterError::Incompatible(_))
        ));
        assert_eq!(serde_cbor::to_vec(&f).unwrap(), before);
    }
}
