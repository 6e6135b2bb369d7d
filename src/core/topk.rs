//! Top-k (heavy hitters) replicated as a state-based CRDT: RedisBloom's `TOPK.*` with counts
//! that converge.
//!
//! **State.** Two parts, each a join-semilattice, so their product is one:
//! - *Counts*: a [`CountMinSketch`] of the top-k's depth and twice its width (the bytes of
//!   RedisBloom's buckets, a fingerprint and a count each, spent on counters), whose every
//!   cell is a G-counter by replica (each writer raises only its own counters; merge is the maximum
//!   per writer and cell). An item's estimate is the minimum over the rows of its cells
//!   summed over the writers: never below its true count.
//! - *Candidates*: per writing replica, its own heap of `k` slots (item, count), kept exactly
//!   as RedisBloom keeps its one heap (a min-heap on the count, the newcomer taking the root's
//!   place when it counts at least as much). Only its writer changes a heap, and every change
//!   raises the heap's version: merge keeps, per writer, the heap of the highest version (a
//!   last-writer-wins register with a single writer, so there is no conflict to resolve).
//!
//! **The list** (`TOPK.LIST`, `TOPK.QUERY`) is a function of the state, so replicas that hold
//! the same state answer the same: the items of every writer's heap, once each, ranked by
//! their estimate (highest first), ties broken by writer id, then heap slot (which for one
//! writer is RedisBloom's order: its list is a stable sort of the heap), the first `k`.
//! A writer judges an add against its own view: before it uses its heap after a merge
//! brought counts, it re-reads every slot's estimate and restores the heap order.
//! `TOPK.ADD` answers the item the add pushed out of this replica's list: with one writer,
//! the item its heap expelled, as RedisBloom answers.
//!
//! **Why not HeavyKeeper.** RedisBloom counts with HeavyKeeper: buckets own a fingerprint and
//! a colliding item *decays* the owner's count (a probabilistic decrement), which keeps heavy
//! items' counts nearly exact in a small table. A G-counter cannot decrement, so the counts
//! here are a count-min sketch's: estimates never fall below the truth but include every
//! item that shares all of an item's cells. At the same width and depth, a count-min sketch
//! overestimates more than HeavyKeeper's buckets under a long tail (RedisBloom's default
//! width, 8, is too narrow for it: give a width of a few times `k` or more), and never
//! underestimates, where HeavyKeeper's decay can. The decay is kept (`TOPK.INFO` reports it)
//! but not applied. Counts are exact whenever each item has one row to itself, and then a
//! replica answers exactly as RedisBloom does for the same adds.
//!
//! **Concurrent updates.** Increments commute (counts are G-counters). Each writer's heap
//! holds what that writer saw, judged against the counts it knew: once merged, the list is
//! the k best of every writer's candidates by the summed counts. When writers' views include
//! every earlier add (synchronised between adds) and counts are exact, the merged list is
//! exactly the list of one top-k fed every add: an item of the final top k entered the heap
//! of the writer that last added it (the k slots beating it there would beat it at the end),
//! and stayed (whatever expelled it there beats it too). Writers adding the same item
//! concurrently, each below its own heap's minimum, can leave out an item whose summed count
//! would rank it: the bound of a k-slot heap per writer.
//!
//! **Memory.** Per writing replica: its counters, `8·width·depth` bytes (RedisBloom's table
//! takes as much), and its heap, `k` slots of 32 bytes plus the items' bytes. Replicas that only
//! read cost nothing.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::core::causal::{ReplicaId, check_own_dots};
use crate::core::cms::{CmsDelta, CmsParams, CountMinSketch};
use crate::core::delta::{CheckRemote, DeltaState};
use crate::core::error::FilterError;
use crate::core::kind::{Counted, FilterKind, FilterSpec, SetSum};
use crate::core::lattice::{Lattice, Membership};
use crate::core::params::{DEFAULT_SEED, MAX_FILTER_BYTES};

/// The shape of a top-k: the `k` items it lists, and the `depth` rows of `width` counters it
/// counts with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TopkParams {
    /// Items listed.
    pub k: u32,
    /// Counters per row.
    pub width: u32,
    /// Rows.
    pub depth: u32,
    /// RedisBloom's decay, in `(0, 1]`: reported, not applied (see the module's documentation).
    pub decay: f64,
    /// Hash seed ([`DEFAULT_SEED`]: RedisBloom's row hashes).
    pub seed: u64,
}

impl TopkParams {
    /// RedisBloom's `TOPK.RESERVE` defaults: width 8, depth 7, decay 0.9.
    pub const DEFAULT_WIDTH: u32 = 8;
    /// See [`TopkParams::DEFAULT_WIDTH`].
    pub const DEFAULT_DEPTH: u32 = 7;
    /// See [`TopkParams::DEFAULT_WIDTH`].
    pub const DEFAULT_DECAY: f64 = 0.9;
    /// Bytes a heap slot takes (its item's bytes apart).
    pub const SLOT_BYTES: u64 = 32;
    /// Items listed at most: a heap decoded from a peer is allocated whole (32 MiB at most).
    pub const MAX_K: u32 = 1 << 20;

    /// A top-k of `k` items counted in `depth` rows of `width`, with `decay`; checked.
    pub fn new(k: u32, width: u32, depth: u32, decay: f64) -> Result<Self, FilterError> {
        TopkParams {
            k,
            width,
            depth,
            decay,
            seed: DEFAULT_SEED,
        }
        .validated()
    }

    /// The top-k of a spec ([`FilterSpec::top_k`]): `capacity` is `k`, `fpr` the decay,
    /// [`FilterSpec::shape`] the width (`bits`) and depth (`hashes`), RedisBloom's defaults if
    /// absent.
    pub fn from_spec(spec: &FilterSpec) -> Result<Self, FilterError> {
        let k = u32::try_from(spec.capacity)
            .map_err(|_| FilterError::invalid("capacity", "a top-k's k is below 2^32"))?;
        let (width, depth) = match spec.shape.as_deref() {
            Some(s) => (
                u32::try_from(s.bits)
                    .map_err(|_| FilterError::invalid("width", "a top-k's width is below 2^32"))?,
                s.hashes,
            ),
            None => (Self::DEFAULT_WIDTH, Self::DEFAULT_DEPTH),
        };
        TopkParams {
            k,
            width,
            depth,
            decay: spec.fpr,
            seed: spec.seed(),
        }
        .validated()
    }

    /// `Ok` if a top-k can be built: `k`, width and depth at least 1, depth at most
    /// [`CmsParams::MAX_DEPTH`], decay in `(0, 1]`, one writer's counters and heap within
    /// [`MAX_FILTER_BYTES`].
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.k == 0 || self.k > Self::MAX_K {
            return Err(FilterError::invalid(
                "k",
                format!("must be in 1..={}", Self::MAX_K),
            ));
        }
        if !(self.decay > 0.0 && self.decay <= 1.0) {
            return Err(FilterError::invalid("decay", "must be in (0, 1]"));
        }
        self.counts().validated()?;
        let needed = self.memory_bytes();
        if needed > MAX_FILTER_BYTES {
            return Err(FilterError::TooLarge {
                needed,
                limit: MAX_FILTER_BYTES,
            });
        }
        Ok(self)
    }

    /// The shape of the counts: `2·width` counters per row, the bytes of RedisBloom's row
    /// of `width` buckets (each a 32-bit fingerprint and a 32-bit count) as 32-bit counters.
    pub fn counts(&self) -> CmsParams {
        CmsParams {
            width: self.width.saturating_mul(2),
            depth: self.depth,
            seed: self.seed,
        }
    }

    /// Bytes of one writer's counters and heap slots (what a top-k written at one replica
    /// takes, its items' bytes apart).
    pub fn memory_bytes(&self) -> u64 {
        self.counts().memory_bytes() + u64::from(self.k) * Self::SLOT_BYTES
    }

    /// Digest of the parameters.
    pub fn digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"top_k/cms+heaps");
        h.update(&self.k.to_le_bytes());
        h.update(&self.decay.to_bits().to_le_bytes());
        h.update(&self.counts().digest().to_le_bytes());
        h.digest()
    }
}

/// One slot of a heap: its item (none while empty) and the count it had when its writer last
/// placed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Slot {
    /// The item.
    pub item: Option<ByteBuf>,
    /// Its count when placed.
    pub count: u64,
}

/// One writer's heap: `k` slots in heap order, and the version its writer gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heap {
    /// The writer.
    pub id: ReplicaId,
    /// Raised by every change its writer makes.
    pub version: u64,
    /// The slots, a min-heap on the count.
    pub slots: Vec<Slot>,
}

/// A heap as encoded: its writer, version, slots, and the slots that hold an item, each
/// `(slot, item, count)` ascending by slot (empty slots count 0 and take no bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapRepr(
    pub ReplicaId,
    pub u64,
    pub u32,
    pub Vec<(u32, ByteBuf, u64)>,
);

impl HeapRepr {
    /// The heap of a top-k of `k` items, or why it is none; allocates only once checked.
    fn to_heap(&self, k: u32) -> Result<Heap, FilterError> {
        let HeapRepr(id, version, slots, entries) = self;
        if *slots != k {
            return Err(FilterError::malformed(format!(
                "a heap of {slots} slots in a top-{k}"
            )));
        }
        if entries.windows(2).any(|w| w[0].0 >= w[1].0) || entries.iter().any(|e| e.0 >= k) {
            return Err(FilterError::malformed("heap slots out of order or range"));
        }
        let mut out = vec![Slot::default(); k as usize];
        for (at, item, count) in entries {
            out[*at as usize] = Slot {
                item: Some(item.clone()),
                count: *count,
            };
        }
        Ok(Heap {
            id: *id,
            version: *version,
            slots: out,
        })
    }
}

impl Heap {
    fn to_repr(&self) -> HeapRepr {
        HeapRepr(
            self.id,
            self.version,
            self.slots.len() as u32,
            self.slots
                .iter()
                .enumerate()
                .filter_map(|(at, s)| Some((at as u32, s.item.clone()?, s.count)))
                .collect(),
        )
    }

    fn items(&self) -> impl Iterator<Item = &[u8]> {
        self.slots
            .iter()
            .filter_map(|s| s.item.as_ref().map(|b| &b[..]))
    }

    fn position(&self, item: &[u8]) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.item.as_ref().is_some_and(|b| b[..] == *item))
    }
}

/// RedisBloom's `heapifyDown` (its tie behaviour included: which slot a tie leaves at the
/// root decides what a later add expels, so it is followed step by step).
fn heapify_down(a: &mut [Slot], mut start: usize) {
    let len = a.len();
    if len < 2 || (len - 2) / 2 < start {
        return;
    }
    let smaller = |a: &[Slot], child: usize| {
        if child + 1 < len && a[child].count > a[child + 1].count {
            child + 1
        } else {
            child
        }
    };
    let mut child = smaller(a, 2 * start + 1);
    if a[child].count > a[start].count {
        return;
    }
    let top = std::mem::take(&mut a[start]);
    loop {
        a[start] = std::mem::take(&mut a[child]);
        start = child;
        if (len - 2) / 2 < child {
            break;
        }
        child = smaller(a, 2 * child + 1);
        if a[child].count >= top.count {
            break;
        }
    }
    a[start] = top;
}

/// Delta of a [`TopK`]: the counters local updates changed, and this replica's heap if it
/// changed (whole, at its version). Joining it is the maximum on both, so it may arrive late,
/// twice or out of order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopkDelta {
    /// The counts' delta.
    pub counts: Option<CmsDelta>,
    /// Heaps at their versions.
    pub heaps: Vec<HeapRepr>,
}

/// A top-k replicated as a CRDT (see the module's documentation).
///
/// ```
/// use crpf::{Lattice, TopK, TopkParams};
///
/// let p = TopkParams::new(2, 100, 4, 0.9)?;
/// let mut a = TopK::new(p, 1);
/// let mut b = TopK::new(p, 2);
/// for item in [&b"x"[..], b"x", b"y", b"z"] {
///     a.add(item, 1);
/// }
/// for item in [&b"z"[..], b"z"] {
///     b.add(item, 1); // concurrently
/// }
/// a.merge(&b)?;
/// let list: Vec<_> = a.list().into_iter().map(|(i, n)| (i.to_vec(), n)).collect();
/// assert_eq!(list, [(b"z".to_vec(), 3), (b"x".to_vec(), 2)]);
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct TopK {
    params: TopkParams,
    counts: CountMinSketch,
    /// Ascending by writer id.
    heaps: Vec<Heap>,
    /// Changes to this replica's heap since the last delta (while tracking): updates of the
    /// pending delta, which carries the heap once.
    heap_changes: usize,
    tracking: bool,
    /// Whether a merge may have raised counts since this replica's heap last read them.
    stale: bool,
}

impl TopK {
    /// An empty top-k whose local adds count as `writer`.
    pub fn new(params: TopkParams, writer: ReplicaId) -> Self {
        TopK {
            params,
            counts: CountMinSketch::new(params.counts(), writer),
            heaps: Vec::new(),
            heap_changes: 0,
            tracking: false,
            stale: false,
        }
    }

    /// The shape.
    pub fn params(&self) -> &TopkParams {
        &self.params
    }

    /// The counts.
    pub fn counts(&self) -> &CountMinSketch {
        &self.counts
    }

    /// The replica local adds count under.
    pub fn writer(&self) -> ReplicaId {
        self.counts.writer()
    }

    /// Replicas whose heaps the state holds.
    pub fn writers(&self) -> usize {
        self.heaps.len()
    }

    /// The item's estimated count (`TOPK.COUNT`): never below its adds this state has seen.
    pub fn count(&self, item: &[u8]) -> u64 {
        self.counts.count(item)
    }

    /// Increments in all, by every writer.
    pub fn total(&self) -> u64 {
        self.counts.total()
    }

    /// The version of this replica's heap (0 before its first add): raised by every change.
    pub fn own_version(&self) -> u64 {
        self.heap_index(self.writer())
            .map_or(0, |i| self.heaps[i].version)
    }

    fn heap_index(&self, id: ReplicaId) -> Result<usize, usize> {
        self.heaps.binary_search_by_key(&id, |h| h.id)
    }

    /// The list with each item's estimate, best first: at most `k` items (see the module's
    /// documentation). Items may count 0 (an `INCRBY` of 0 places an item, as RedisBloom's).
    pub fn list(&self) -> Vec<(&[u8], u64)> {
        let own_only = self.heaps.len() == 1;
        let mut seen = HashSet::new();
        let mut out: Vec<(&[u8], u64)> = Vec::new();
        for h in &self.heaps {
            for item in h.items() {
                if own_only || seen.insert(item) {
                    out.push((item, self.counts.count(item)));
                }
            }
        }
        // Stable: ties keep the writers' and slots' order.
        out.sort_by_key(|e| std::cmp::Reverse(e.1));
        out.truncate(self.params.k as usize);
        out
    }

    /// Whether the item is in the list (`TOPK.QUERY`).
    pub fn query(&self, item: &[u8]) -> bool {
        if self.heaps.len() == 1 {
            // One heap holds at most k items: all listed.
            return self.heaps[0].position(item).is_some();
        }
        self.list().iter().any(|(i, _)| *i == item)
    }

    /// Re-reads every slot's estimate of this replica's heap and restores its order, after a
    /// merge raised counts (a new version if anything moved).
    fn refresh_own(&mut self) {
        self.stale = false;
        let Ok(i) = self.heap_index(self.writer()) else {
            return;
        };
        let counts = &self.counts;
        let heap = &mut self.heaps[i];
        let before = heap.slots.clone();
        for s in &mut heap.slots {
            if let Some(item) = &s.item {
                s.count = counts.count(item);
            }
        }
        for at in (0..heap.slots.len() / 2).rev() {
            heapify_down(&mut heap.slots, at);
        }
        if heap.slots != before {
            heap.version += 1;
            self.heap_changes += usize::from(self.tracking);
        }
    }

    /// Adds `n` to the item's count (`TOPK.INCRBY`; `TOPK.ADD` is `n = 1`) and places it in
    /// this replica's heap as RedisBloom places it; answers the item that left this replica's
    /// list, if one did.
    pub fn add(&mut self, item: &[u8], n: u64) -> Option<Vec<u8>> {
        if self.stale {
            self.refresh_own();
        }
        let me = self.writer();
        // With other writers' heaps, the list is more than this heap: compare it whole.
        let others = self
            .heaps
            .iter()
            .any(|h| h.id != me && h.items().next().is_some());
        let before: Option<Vec<Vec<u8>>> =
            others.then(|| self.list().into_iter().map(|(i, _)| i.to_vec()).collect());
        let i = match self.heap_index(me) {
            Ok(i) => i,
            Err(i) => {
                self.heaps.insert(
                    i,
                    Heap {
                        id: me,
                        version: 0,
                        slots: vec![Slot::default(); self.params.k as usize],
                    },
                );
                i
            }
        };
        let heap_min = self.heaps[i].slots[0].count;
        let estimate = self.counts.increment(item, n);
        let mut expelled = None;
        if estimate >= heap_min {
            let heap = &mut self.heaps[i];
            match heap.position(item) {
                Some(at) => {
                    heap.slots[at].count = estimate;
                    heapify_down(&mut heap.slots, at);
                }
                None => {
                    let old = std::mem::replace(
                        &mut heap.slots[0],
                        Slot {
                            item: Some(ByteBuf::from(item)),
                            count: estimate,
                        },
                    );
                    expelled = old.item.map(ByteBuf::into_vec);
                    heapify_down(&mut heap.slots, 0);
                }
            }
            heap.version += 1;
            self.heap_changes += usize::from(self.tracking);
        }
        match before {
            None => expelled,
            Some(before) => {
                let after = self.list();
                before
                    .into_iter()
                    .rev()
                    .find(|b| !after.iter().any(|(a, _)| *a == &b[..]))
            }
        }
    }

    fn join_heap(&mut self, heap: &Heap) -> bool {
        match self.heap_index(heap.id) {
            // The later version; at one version (two writers sharing an id, or a forged
            // state) the greater slots, so that the join is one whatever the order.
            Ok(i) if heap_order(&self.heaps[i]) >= heap_order(heap) => false,
            Ok(i) => {
                self.heaps[i] = heap.clone();
                true
            }
            Err(i) => {
                self.heaps.insert(i, heap.clone());
                true
            }
        }
    }

    /// The heaps of `reprs`, checked: ascending by writer, `k` slots each.
    fn checked_heaps(&self, reprs: &[HeapRepr]) -> Result<Vec<Heap>, FilterError> {
        if reprs.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(FilterError::malformed("heaps not strictly ascending"));
        }
        reprs.iter().map(|r| r.to_heap(self.params.k)).collect()
    }

    fn own_heap_ahead(
        &self,
        mut heaps: impl Iterator<Item = (ReplicaId, u64)>,
    ) -> Result<(), FilterError> {
        let me = self.writer();
        match heaps.find(|h| h.0 == me) {
            Some((_, theirs)) => check_own_dots(me, self.own_version(), theirs),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for TopK {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopK")
            .field("params", &self.params)
            .field("writer", &self.writer())
            .field("heaps", &self.heaps.len())
            .field("total", &self.total())
            .finish()
    }
}

impl Lattice for TopK {
    /// The counts' join, and per writer the heap of the higher version.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("top-k", &self.params, &other.params)?;
        self.counts.merge(&other.counts)?;
        for h in &other.heaps {
            self.join_heap(h);
        }
        self.stale = true;
        Ok(())
    }

    /// The counts at most `other`'s, and every heap at or below `other`'s of its writer in
    /// the join's order (version, then slots: at one version two heaps differ only if two
    /// writers shared an id, or a state was forged).
    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.counts.le(&other.counts)
            && self.heaps.iter().all(|h| match other.heap_index(h.id) {
                Ok(i) => heap_order(h) <= heap_order(&other.heaps[i]),
                Err(_) => h.version == 0,
            })
    }
}

/// How two heaps of one writer are ordered by the join: version, then slots.
fn heap_order(h: &Heap) -> (u64, &[Slot]) {
    (h.version, &h.slots)
}

impl Membership for TopK {
    /// A positive estimate (as a count-min sketch: no false negatives); whether it is
    /// listed is [`TopK::query`].
    fn contains(&self, item: &[u8]) -> bool {
        self.count(item) > 0
    }

    /// An add of 1 (`TOPK.ADD`).
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        TopK::add(self, item, 1);
        Ok(())
    }

    /// The increments in all.
    fn cardinality(&self) -> f64 {
        self.total() as f64
    }

    /// `k`.
    fn capacity(&self) -> u64 {
        u64::from(self.params.k)
    }

    /// Items listed, over `k`.
    fn load_factor(&self) -> f64 {
        self.list().len() as f64 / f64::from(self.params.k)
    }

    /// The counts' chance that an item never added reads above 0.
    fn estimated_fpr(&self) -> f64 {
        self.counts.estimated_fpr()
    }
}

impl DeltaState for TopK {
    type Delta = TopkDelta;

    fn track_deltas(&mut self, on: bool) {
        self.counts.track_deltas(on);
        self.tracking = on;
        self.heap_changes = 0;
    }

    fn take_delta(&mut self) -> Option<TopkDelta> {
        let counts = self.counts.take_delta();
        let heaps = match std::mem::take(&mut self.heap_changes) > 0 {
            true => self
                .heap_index(self.writer())
                .map(|i| vec![self.heaps[i].to_repr()])
                .unwrap_or_default(),
            false => Vec::new(),
        };
        (counts.is_some() || !heaps.is_empty()).then_some(TopkDelta { counts, heaps })
    }

    fn pending_delta_len(&self) -> usize {
        self.counts.pending_delta_len() + self.heap_changes
    }

    /// The item's counters, and this replica's heap.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        if !self.counts.record_footprint(item) {
            return false;
        }
        if self.heap_index(self.writer()).is_ok() {
            self.heap_changes = self.heap_changes.max(1);
        }
        true
    }

    fn check_delta(&self, delta: &TopkDelta) -> Result<(), FilterError> {
        if let Some(c) = &delta.counts {
            self.counts.check_delta(c)?;
        }
        self.checked_heaps(&delta.heaps).map(|_| ())
    }

    fn merge_delta(&mut self, delta: &TopkDelta) -> Result<(), FilterError> {
        if let Some(c) = &delta.counts {
            self.counts.check_delta(c)?;
        }
        let heaps = self.checked_heaps(&delta.heaps)?;
        if let Some(c) = &delta.counts {
            self.counts.merge_delta(c)?;
        }
        for h in &heaps {
            self.join_heap(h);
        }
        self.stale = true;
        Ok(())
    }
}

impl CheckRemote for TopK {
    /// Only this replica raises its counters and its heap's version: a state that holds more
    /// of either comes from a replica sharing the id ([`FilterError::OwnDotAhead`]).
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        if other.params == self.params {
            self.counts.check_remote(&other.counts)?;
        }
        self.own_heap_ahead(other.heaps.iter().map(|h| (h.id, h.version)))
    }

    fn check_remote_delta(&self, delta: &TopkDelta) -> Result<(), FilterError> {
        if let Some(c) = &delta.counts {
            self.counts.check_remote_delta(c)?;
        }
        self.own_heap_ahead(delta.heaps.iter().map(|h| (h.0, h.1)))
    }
}

impl crate::core::kind::ReplicatedFilter for TopK {
    const KIND: FilterKind = FilterKind::TopK;
    /// Per-id counts and heap versions, which only an id's own run raises: a new id at every
    /// start (as `count_min_sketch`).
    const REUSES_IDS: bool = false;

    fn from_spec(spec: &FilterSpec, replica: ReplicaId) -> Result<Self, FilterError> {
        Ok(Self::new(TopkParams::from_spec(spec)?, replica))
    }

    fn params_digest(&self) -> u64 {
        self.params.digest()
    }

    /// The counts' digest, and every heap with its version.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        self.counts.digest_state(h);
        let mut sum = SetSum::default();
        let mut buf = Vec::new();
        for heap in &self.heaps {
            buf.clear();
            buf.extend_from_slice(&heap.id.to_le_bytes());
            buf.extend_from_slice(&heap.version.to_le_bytes());
            for s in &heap.slots {
                buf.extend_from_slice(&s.count.to_le_bytes());
                match &s.item {
                    Some(i) => {
                        buf.extend_from_slice(&(i.len() as u64 + 1).to_le_bytes());
                        buf.extend_from_slice(i);
                    }
                    None => buf.extend_from_slice(&0u64.to_le_bytes()),
                }
            }
            sum.add(&buf);
        }
        sum.finish(h);
    }

    fn set_writer(&mut self, replica: ReplicaId) {
        self.counts.set_writer(replica);
        self.stale = true;
    }

    fn counted(&self) -> Option<&dyn Counted> {
        Some(self)
    }
}

/// `count` only: a top-k never removes.
impl Counted for TopK {
    fn count(&self, item: &[u8]) -> u64 {
        TopK::count(self, item)
    }

    fn remove_one(&mut self, _item: &[u8]) -> Option<crate::Dot> {
        None
    }
}

#[derive(Serialize, Deserialize)]
struct TopkRepr {
    params: TopkParams,
    counts: CountMinSketch,
    heaps: Vec<HeapRepr>,
}

impl Serialize for TopK {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Ref<'a> {
            params: &'a TopkParams,
            counts: &'a CountMinSketch,
            heaps: Vec<HeapRepr>,
        }
        Ref {
            params: &self.params,
            counts: &self.counts,
            heaps: self.heaps.iter().map(Heap::to_repr).collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TopK {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = TopkRepr::deserialize(d)?;
        let params = r.params.validated().map_err(D::Error::custom)?;
        if *r.counts.params() != params.counts() {
            return Err(D::Error::custom("the counts' shape is not the top-k's"));
        }
        let t = TopK::new(params, r.counts.writer());
        let heaps = t.checked_heaps(&r.heaps).map_err(D::Error::custom)?;
        Ok(TopK {
            counts: r.counts,
            heaps,
            stale: true,
            ..t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RedisBloom's heap with exact counts, step by step: redis-py's `test_topk` replies.
    #[test]
    fn one_writer_expels_as_redisbloom() {
        let mut t = TopK::new(TopkParams::new(3, 50, 4, 0.9).unwrap(), 1);
        let adds = "A B C D E A A B C G D B D A E E 1";
        let got: Vec<Option<String>> = adds
            .split(' ')
            .map(|i| {
                t.add(i.as_bytes(), 1)
                    .map(|e| String::from_utf8(e).unwrap())
            })
            .collect();
        let want = [
            None,
            None,
            None,
            Some("A"),
            Some("C"),
            Some("D"),
            None,
            None,
            Some("E"),
            None,
            Some("B"),
            Some("C"),
            None,
            None,
            None,
            Some("D"),
            None,
        ];
        assert_eq!(got, want.map(|w| w.map(String::from)));
        let list: Vec<(&[u8], u64)> = t.list();
        assert_eq!(list, [(&b"A"[..], 4), (b"B", 3), (b"E", 3)]);
    }

    #[test]
    fn merged_heaps_list_the_best_and_versions_win() {
        let p = TopkParams::new(2, 64, 4, 0.9).unwrap();
        let mut a = TopK::new(p, 1);
        let mut b = TopK::new(p, 2);
        for _ in 0..3 {
            a.add(b"x", 1);
        }
        a.add(b"y", 1);
        b.add(b"z", 5);
        let old_b = b.clone();
        b.add(b"w", 6);
        a.merge(&b).unwrap();
        a.merge(&old_b).unwrap();
        let list: Vec<_> = a.list().into_iter().map(|(i, _)| i.to_vec()).collect();
        assert_eq!(list, [b"w".to_vec(), b"z".to_vec()]);
        // x (3) left this replica's list when z and w came; y's add pushes nothing more out.
        assert_eq!(a.add(b"y", 1), None);
        assert_eq!(a.add(b"y", 5), Some(b"z".to_vec()), "y (7) passes z (5)");
    }
}
