//! A count-min sketch (Cormode and Muthukrishnan) replicated as a state-based CRDT: every
//! cell is a G-counter by replica. Each writing replica counts into cells it alone raises;
//! a query sums the replicas' counts of a cell and takes the minimum over the rows; merge is
//! the maximum per (replica, cell). Replicas that have seen the same increments answer
//! exactly what one sketch of the same width and depth fed all of them answers (the sum of
//! the replicas' counts of a cell *is* the single sketch's count), so the error bounds are a
//! single sketch's: an estimate is never below the true count, and exceeds it by more than
//! `2N / width` (`N`: the increments in all) with probability at most `2^-depth`.
//!
//! **Hashing.** Row `i` maps an item to column `murmur2(item, seed_i) mod width`, with
//! MurmurHash2 (32 bits) seeded independently per row: `seed_i = i` with the default seed,
//! which is exactly RedisBloom's mapping, so that a sketch answers as RedisBloom's of the same
//! width and depth fed the same increments (the differential test compares them). Another
//! seed shifts every row's seed alike ([`CmsParams::row_seed`]).
//!
//! **Memory.** A replica allocates a writer's cells only once that writer has counted
//! something: `4·width·depth` bytes (32-bit counters, as RedisBloom's) and 10 bytes per
//! writing replica, so a sketch written at one replica takes what one sketch does, and each
//! further writing replica as much again. Replicas that only read cost nothing.
//!
//! **Concurrent updates.** Increments commute: concurrent increments at different replicas
//! all count once merged. A counter saturates at `2^32 - 1` per writer (RedisBloom saturates
//! its one counter there). [`CountMinSketch::merge_weighted`] (`CMS.MERGE`) raises every
//! counter to the weighted sum of the sources' as this replica's own increments (their
//! shortfall); it never takes anything away, so a counter that already counts more than the
//! sum keeps its count, where RedisBloom's `CMS.MERGE` sets it to the sum.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::causal::{ReplicaId, check_own_dots};
use crate::core::delta::{CheckRemote, DeltaState};
use crate::core::error::FilterError;
use crate::core::kind::{Counted, FilterKind, FilterSpec, ImportRoom, Occurrence, SetSum};
use crate::core::lattice::{Lattice, Membership};
use crate::core::params::{DEFAULT_SEED, MAX_FILTER_BYTES};

/// MurmurHash2 (Austin Appleby's 32-bit hash), reading the input as little-endian words: the
/// hash RedisBloom's sketch maps items with.
pub fn murmur2(data: &[u8], seed: u32) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h = seed ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = words.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&b) = tail.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// The shape of a count-min sketch: `depth` rows of `width` counters, hashed with `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CmsParams {
    /// Counters per row.
    pub width: u32,
    /// Rows (hash functions).
    pub depth: u32,
    /// Hash seed ([`DEFAULT_SEED`]: RedisBloom's row seeds).
    pub seed: u64,
}

/// The pseudo-row of an [`Occurrence`] that carries a sketch's increments in all (what
/// `CMS.INFO` calls its count) rather than a cell's.
pub const TOTAL_ROW: u32 = u32::MAX;

impl CmsParams {
    /// Rows a sketch has at most: its spec carries the depth as the failure probability
    /// `2^-depth` ([`CmsParams::from_spec`]), which an `f64` holds exactly up to here.
    pub const MAX_DEPTH: u32 = 1000;

    /// `depth` rows of `width` counters, the default seed; checked.
    pub fn new(width: u32, depth: u32) -> Result<Self, FilterError> {
        CmsParams {
            width,
            depth,
            seed: DEFAULT_SEED,
        }
        .validated()
    }

    /// RedisBloom's `CMS.INITBYPROB` dimensions: an overestimate of at most `error` times the
    /// increments in all (`width = ceil(2 / error)`) with probability `1 - probability`
    /// (`depth = ceil(log(probability) / log(0.5))`, computed in `f32` as RedisBloom does, so
    /// that both make the same sketch). Both in `(0, 1)`.
    pub fn from_error(error: f64, probability: f64) -> Result<Self, FilterError> {
        if !(error > 0.0 && error < 1.0) {
            return Err(FilterError::invalid("error", "must be in (0, 1)"));
        }
        if !(probability > 0.0 && probability < 1.0) {
            return Err(FilterError::invalid("probability", "must be in (0, 1)"));
        }
        let width = (2.0 / error).ceil();
        let depth = ((probability as f32).log10() / 0.5f32.log10()).ceil();
        if !(1.0..=f64::from(u32::MAX)).contains(&width)
            || !(1.0..=u32::MAX as f32).contains(&depth)
        {
            return Err(FilterError::invalid(
                "error",
                "the sketch would be too large",
            ));
        }
        Self::new(width as u32, depth as u32)
    }

    /// The sketch of a spec: `capacity` is the width, `fpr` the probability `2^-depth` that an
    /// estimate exceeds its bound (the depth is the smallest whose probability is at most
    /// `fpr`); [`FilterSpec::count_min`] makes one of a width and depth.
    pub fn from_spec(spec: &FilterSpec) -> Result<Self, FilterError> {
        let width = u32::try_from(spec.capacity)
            .map_err(|_| FilterError::invalid("capacity", "a sketch's width is below 2^32"))?;
        if !(spec.fpr > 0.0 && spec.fpr < 1.0) {
            return Err(FilterError::invalid("fpr", "must be in (0, 1)"));
        }
        // 2^-depth is exact in an f64, and so is its log2: the tolerance only absorbs the
        // rounding of an fpr given in decimal.
        let depth = (-spec.fpr.log2() - 1e-9).ceil().max(1.0);
        if depth > f64::from(Self::MAX_DEPTH) {
            return Err(FilterError::invalid(
                "fpr",
                format!("a sketch has at most {} rows", Self::MAX_DEPTH),
            ));
        }
        CmsParams {
            width,
            depth: depth as u32,
            seed: spec.seed(),
        }
        .validated()
    }

    /// `Ok` if a sketch can be built: at least one row and column, at most
    /// [`CmsParams::MAX_DEPTH`] rows, one writer's counters within [`MAX_FILTER_BYTES`].
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.width == 0 {
            return Err(FilterError::invalid("width", "must be at least 1"));
        }
        if self.depth == 0 || self.depth > Self::MAX_DEPTH {
            return Err(FilterError::invalid(
                "depth",
                format!("must be in 1..={}", Self::MAX_DEPTH),
            ));
        }
        let needed = self.memory_bytes();
        if needed > MAX_FILTER_BYTES {
            return Err(FilterError::TooLarge {
                needed,
                limit: MAX_FILTER_BYTES,
            });
        }
        Ok(self)
    }

    /// Counters of one writer: `width · depth`.
    pub fn cells(&self) -> u64 {
        u64::from(self.width) * u64::from(self.depth)
    }

    /// Bytes of one writer's counters (what a sketch written at one replica takes).
    pub fn memory_bytes(&self) -> u64 {
        self.cells() * 4
    }

    /// The MurmurHash2 seed of row `row`: RedisBloom's (`row`) with the default seed.
    pub fn row_seed(&self, row: u32) -> u32 {
        let shift = self.seed ^ DEFAULT_SEED;
        row ^ (shift ^ (shift >> 32)) as u32
    }

    /// The column of `item` in row `row`.
    #[inline]
    pub fn column(&self, item: &[u8], row: u32) -> u32 {
        murmur2(item, self.row_seed(row)) % self.width
    }

    /// The index of `item`'s counter in row `row` of a writer's counters (rows one after the
    /// other).
    #[inline]
    fn cell(&self, item: &[u8], row: u32) -> usize {
        row as usize * self.width as usize + self.column(item, row) as usize
    }

    /// Digest of the parameters.
    pub fn digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"count_min_sketch/murmur2");
        h.update(&self.width.to_le_bytes());
        h.update(&self.depth.to_le_bytes());
        h.update(&self.seed.to_le_bytes());
        h.digest()
    }
}

/// One writing replica's counts: its counters and its increments in all.
#[derive(Clone, PartialEq, Eq)]
struct Writer {
    id: ReplicaId,
    /// Increments counted (saturating), `CMS.INFO`'s count of this writer.
    total: u64,
    /// `depth` rows of `width` counters.
    cells: Box<[u32]>,
}

impl Writer {
    fn is_empty(&self) -> bool {
        self.total == 0 && self.cells.iter().all(|&c| c == 0)
    }
}

/// A count-min sketch replicated as a CRDT (see the module's documentation).
///
/// ```
/// use crpf::{CountMinSketch, Lattice};
///
/// let mut a = CountMinSketch::new(crpf::CmsParams::new(1000, 5)?, 1);
/// let mut b = CountMinSketch::new(*a.params(), 2);
/// a.increment(b"x", 3);
/// b.increment(b"x", 4); // concurrently
/// a.merge(&b)?;
/// assert_eq!((a.count(b"x"), a.total()), (7, 7));
/// assert_eq!(a.writers(), 2);
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct CountMinSketch {
    params: CmsParams,
    /// The replica local increments count under.
    writer: ReplicaId,
    /// Ascending by id; only writers that counted something.
    writers: Vec<Writer>,
    /// `(writer, cell)` of counters local updates changed, and the writers whose total they
    /// changed (a cell index `u32::MAX`), while tracking.
    pending: Option<Pending>,
}

/// The `(writer, cell)` entries of the pending delta ([`TOTAL_CELL`] for a writer's total):
/// per writer (in practice one, this replica), the entries in the order first recorded and
/// a bit per cell saying which are, so that recording one costs a bit test, not a search
/// (`CMS.INCRBY`'s hot path records `depth + 1`).
#[derive(Clone, Default)]
struct Pending {
    writers: Vec<PendingWriter>,
}

#[derive(Clone)]
struct PendingWriter {
    id: ReplicaId,
    /// Cells recorded, unordered, each once.
    cells: Vec<u32>,
    /// A bit per cell, and one (the last) for the total: set for those in `cells`.
    recorded: Vec<u64>,
}

impl PendingWriter {
    /// The bit of `cell` ([`TOTAL_CELL`]: the last).
    #[inline]
    fn bit(&self, cell: u32) -> (usize, u64) {
        let bit = match cell {
            TOTAL_CELL => self.recorded.len() * 64 - 1,
            c => c as usize,
        };
        (bit / 64, 1u64 << (bit % 64))
    }
}

impl Pending {
    /// Records `(id, cell)` of a sketch of `cells` counters.
    #[inline]
    fn insert(&mut self, id: ReplicaId, cell: u32, cells: u64) {
        let w = match self.writers.iter().position(|w| w.id == id) {
            Some(i) => &mut self.writers[i],
            None => {
                self.writers.push(PendingWriter {
                    id,
                    cells: Vec::new(),
                    // The total's bit last, after the cells' (`cells + 1` bits at least).
                    recorded: vec![0; (cells as usize + 1).div_ceil(64)],
                });
                self.writers.last_mut().expect("pushed")
            }
        };
        let (word, mask) = w.bit(cell);
        if w.recorded[word] & mask == 0 {
            w.recorded[word] |= mask;
            w.cells.push(cell);
        }
    }

    fn len(&self) -> usize {
        self.writers.iter().map(|w| w.cells.len()).sum()
    }

    /// The entries, writers ascending and each writer's cells ascending (its total last);
    /// empties this, keeping its buffers.
    fn drain_sorted(&mut self) -> Vec<(ReplicaId, Vec<u32>)> {
        self.writers.sort_unstable_by_key(|w| w.id);
        let mut out = Vec::with_capacity(self.writers.len());
        for w in &mut self.writers {
            if w.cells.is_empty() {
                continue;
            }
            // The next delta's buffer at this one's size: grown one push at a time, it cost
            // a `CMS.INCRBY` under load ~150 instructions of reallocation.
            let taken = w.cells.len();
            let mut cells = std::mem::replace(&mut w.cells, Vec::with_capacity(taken));
            if taken >= w.recorded.len() {
                // At least one a word: the bits in order, each word cleared (a sort of the
                // cells took ~300 instructions per `CMS.INCRBY` under load).
                cells.clear();
                let total = w.recorded.len() * 64 - 1;
                for (i, word) in w.recorded.iter_mut().enumerate() {
                    let mut bits = std::mem::take(word);
                    while bits != 0 {
                        let bit = i * 64 + bits.trailing_zeros() as usize;
                        cells.push(if bit == total { TOTAL_CELL } else { bit as u32 });
                        bits &= bits - 1;
                    }
                }
            } else {
                // Only the bits set: a wide sketch's commits clear what they took, not its
                // width.
                for &c in &cells {
                    let (word, mask) = w.bit(c);
                    w.recorded[word] &= !mask;
                }
                cells.sort_unstable();
            }
            out.push((w.id, cells));
        }
        out
    }
}

/// The pending entry of a writer's total.
const TOTAL_CELL: u32 = u32::MAX;

/// One writer's part of a [`CmsDelta`]: its id, its total, and `(cell index, counter)`
/// ascending.
pub type CmsDeltaWriter = (ReplicaId, u64, Vec<(u32, u32)>);

/// Delta of a [`CountMinSketch`]: the counters local updates changed, at their values, by
/// writer. Joining it is the maximum on those counters, so it may arrive late, twice or out
/// of order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmsDelta {
    /// `(writer, its total, (cell index, counter) ascending)`.
    pub writers: Vec<CmsDeltaWriter>,
}

impl CountMinSketch {
    /// An empty sketch whose local increments count as `writer`.
    pub fn new(params: CmsParams, writer: ReplicaId) -> Self {
        CountMinSketch {
            params,
            writer,
            writers: Vec::new(),
            pending: None,
        }
    }

    /// The sketch's shape.
    pub fn params(&self) -> &CmsParams {
        &self.params
    }

    /// The replica local increments count under.
    pub fn writer(&self) -> ReplicaId {
        self.writer
    }

    /// Replicas whose counts the state holds (each takes [`CmsParams::memory_bytes`]).
    pub fn writers(&self) -> usize {
        self.writers.len()
    }

    /// Increments in all, by every writer (`CMS.INFO`'s count).
    pub fn total(&self) -> u64 {
        self.writers
            .iter()
            .fold(0u64, |t, w| t.saturating_add(w.total))
    }

    /// The summed count of cell `i`.
    #[inline]
    fn cell_sum(&self, i: usize) -> u64 {
        self.writers.iter().map(|w| u64::from(w.cells[i])).sum()
    }

    /// The counter at `(row, column)`, summed over the writers.
    pub fn cell_count(&self, row: u32, column: u32) -> u64 {
        self.cell_sum(row as usize * self.params.width as usize + column as usize)
    }

    /// The estimate of the item's count: the minimum over the rows of its counters, each
    /// summed over the writers. Never below the increments of the item this state has seen.
    pub fn count(&self, item: &[u8]) -> u64 {
        (0..self.params.depth)
            .map(|row| self.cell_sum(self.params.cell(item, row)))
            .min()
            .unwrap_or(0)
    }

    /// The index of `id`'s counts, allocated (zero) if it has none.
    fn writer_mut(&mut self, id: ReplicaId) -> &mut Writer {
        let i = match self.writers.binary_search_by_key(&id, |w| w.id) {
            Ok(i) => i,
            Err(i) => {
                let cells = vec![0u32; self.params.cells() as usize].into_boxed_slice();
                self.writers.insert(
                    i,
                    Writer {
                        id,
                        total: 0,
                        cells,
                    },
                );
                i
            }
        };
        &mut self.writers[i]
    }

    fn writer_ref(&self, id: ReplicaId) -> Option<&Writer> {
        self.writers
            .binary_search_by_key(&id, |w| w.id)
            .ok()
            .map(|i| &self.writers[i])
    }

    /// Adds `n` to this replica's counters of the item (each saturating at `2^32 - 1`) and
    /// answers the item's estimate afterwards. `n = 0` changes nothing.
    pub fn increment(&mut self, item: &[u8], n: u64) -> u64 {
        if n == 0 {
            return self.count(item);
        }
        // One hash per row, each counter raised and read in the same pass: `CMS.INCRBY`'s
        // hot path (RedisBloom's answer is this estimate).
        let p = self.params;
        let me = self.writer;
        let mine = match self.writers.binary_search_by_key(&me, |w| w.id) {
            Ok(i) => i,
            Err(_) => {
                self.writer_mut(me);
                self.writers
                    .binary_search_by_key(&me, |w| w.id)
                    .expect("just allocated")
            }
        };
        let mut estimate = u64::MAX;
        for row in 0..p.depth {
            let c = p.cell(item, row);
            let cell = &mut self.writers[mine].cells[c];
            *cell = u64::from(*cell).saturating_add(n).min(u64::from(u32::MAX)) as u32;
            if let Some(pending) = &mut self.pending {
                pending.insert(me, c as u32, p.cells());
            }
            estimate = estimate.min(self.cell_sum(c));
        }
        let w = &mut self.writers[mine];
        w.total = w.total.saturating_add(n);
        if let Some(pending) = &mut self.pending {
            pending.insert(me, TOTAL_CELL, p.cells());
        }
        estimate
    }

    /// Adds each `(cell, n)` to this replica's counters (saturating) and `total` to its total,
    /// recording them in the pending delta.
    fn add_cells(&mut self, cells: impl IntoIterator<Item = (u32, u64)>, total: u64) {
        let me = self.writer;
        let mut touched = Vec::new();
        let w = self.writer_mut(me);
        for (c, n) in cells {
            let cell = &mut w.cells[c as usize];
            *cell = u64::from(*cell).saturating_add(n).min(u64::from(u32::MAX)) as u32;
            touched.push(c);
        }
        w.total = w.total.saturating_add(total);
        let cells = self.params.cells();
        if let Some(p) = &mut self.pending {
            for c in touched {
                p.insert(me, c, cells);
            }
            p.insert(me, TOTAL_CELL, cells);
        }
    }

    /// The occurrences that increment the item by `n` ([`CountMinSketch::import_occurrences`]):
    /// one per row, at the item's column, and the [`TOTAL_ROW`]. What a replica applies for
    /// `CMS.INCRBY`, through the same path as an import.
    pub fn item_occurrences(&self, item: &[u8], n: u64, out: &mut Vec<Occurrence>) {
        for row in 0..self.params.depth {
            out.push(located(row, self.params.column(item, row), n));
        }
        out.push(located(TOTAL_ROW, 0, n));
    }

    /// The weighted sums of `sources`' counters, cell by cell, and of their totals, as
    /// RedisBloom's `CMS.MERGE` computes them. Refused (`Incompatible`) for a source of
    /// another shape, and (`InvalidParams`, field `weights`) where a cell's or the totals'
    /// weighted sum would be negative or a cell's pass `2^32 - 1`, as RedisBloom refuses them
    /// ("MERGE overflow").
    fn weighted_sums(
        &self,
        sources: &[(&CountMinSketch, i64)],
    ) -> Result<(Vec<u64>, u64), FilterError> {
        for (s, _) in sources {
            FilterError::require_same("count-min sketch", &self.params, &s.params)?;
        }
        let overflow = || FilterError::invalid("weights", "MERGE overflow");
        let mut cells = Vec::with_capacity(self.params.cells() as usize);
        for i in 0..self.params.cells() as usize {
            let mut sum = 0i128;
            for (s, w) in sources {
                sum += i128::from(s.cell_sum(i)) * i128::from(*w);
            }
            if !(0..=i128::from(u32::MAX)).contains(&sum) {
                return Err(overflow());
            }
            cells.push(sum as u64);
        }
        let total: i128 = sources
            .iter()
            .map(|(s, w)| i128::from(s.total()) * i128::from(*w))
            .sum();
        if total < 0 {
            return Err(overflow());
        }
        Ok((cells, total.min(i128::from(u64::MAX)) as u64))
    }

    /// The occurrences that raise every counter of this sketch to the weighted sum of
    /// `sources`' (RedisBloom's `CMS.MERGE` sets the destination's counters to it), and its
    /// total likewise: each counter's shortfall, as this replica's own increments. A counter
    /// that already counts more keeps its count: a replicated counter never decreases, so
    /// this answers as RedisBloom does wherever the destination counted no more than the
    /// sum (an empty destination, or one among the sources at a weight of 1 or more).
    /// Refused as `CountMinSketch::weighted_sums` refuses.
    pub fn weighted_occurrences(
        &self,
        sources: &[(&CountMinSketch, i64)],
    ) -> Result<Vec<Occurrence>, FilterError> {
        let (cells, total) = self.weighted_sums(sources)?;
        let width = self.params.width;
        let mut out: Vec<Occurrence> = cells
            .into_iter()
            .enumerate()
            .filter_map(|(i, target)| {
                let short = target.saturating_sub(self.cell_sum(i));
                (short > 0).then(|| located(i as u32 / width, i as u32 % width, short))
            })
            .collect();
        out.push(located(TOTAL_ROW, 0, total.saturating_sub(self.total())));
        Ok(out)
    }

    /// Raises this sketch to the weighted sum of `sources` as this replica's own increments
    /// (`CMS.MERGE ... WEIGHTS`, see [`CountMinSketch::weighted_occurrences`]); all or
    /// nothing.
    pub fn merge_weighted(
        &mut self,
        sources: &[(&CountMinSketch, i64)],
    ) -> Result<(), FilterError> {
        let occurrences = self.weighted_occurrences(sources)?;
        self.import_occurrences(&occurrences).map(|_| ())
    }

    /// Every counter with a positive count, summed over the writers, located (`sub` its row,
    /// `bucket` its column), and the increments in all at [`TOTAL_ROW`]: what re-adding into
    /// another sketch ([`CountMinSketch::import_occurrences`]) counts as that sketch's own.
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        let width = self.params.width;
        let mut out: Vec<Occurrence> = (0..self.params.cells() as usize)
            .filter_map(|i| {
                let c = self.cell_sum(i);
                (c > 0).then(|| located(i as u32 / width, i as u32 % width, c))
            })
            .collect();
        out.push(located(TOTAL_ROW, 0, self.total()));
        out
    }

    /// Whether [`CountMinSketch::import_occurrences`] takes `occurrences`: each names a row and
    /// column of this shape (or the [`TOTAL_ROW`]), with no series and no fingerprint.
    pub fn check_import(&self, occurrences: &[Occurrence]) -> Result<(), FilterError> {
        let p = &self.params;
        match occurrences.iter().find(|o| {
            o.series != 0
                || o.fp != 0
                || !((o.sub < p.depth && o.bucket < u64::from(p.width))
                    || (o.sub == TOTAL_ROW && o.bucket == 0))
        }) {
            Some(o) => Err(FilterError::Incompatible(format!(
                "occurrence {o:?} does not fit a {}x{} sketch",
                p.width, p.depth
            ))),
            None => Ok(()),
        }
    }

    /// Adds `occurrences` (located as [`CountMinSketch::live_occurrences`] lists them) to this
    /// replica's own counters and total: an increment, a fold of other sketches, or a dump
    /// re-added. Answers the increments in all (the [`TOTAL_ROW`]'s counts). All or nothing.
    pub fn import_occurrences(&mut self, occurrences: &[Occurrence]) -> Result<u64, FilterError> {
        self.check_import(occurrences)?;
        let width = self.params.width;
        let total = occurrences
            .iter()
            .filter(|o| o.sub == TOTAL_ROW)
            .fold(0u64, |t, o| t.saturating_add(o.count));
        if occurrences.iter().all(|o| o.count == 0) {
            return Ok(0);
        }
        let cells = occurrences
            .iter()
            .filter(|o| o.sub != TOTAL_ROW && o.count > 0)
            .map(|o| (o.sub * width + o.bucket as u32, o.count));
        self.add_cells(cells, total);
        Ok(total)
    }

    /// `a := a ⊔ b` for one writer's counts; whether anything changed.
    fn join_writer(
        &mut self,
        id: ReplicaId,
        total: u64,
        cells: impl Iterator<Item = (usize, u32)>,
    ) -> bool {
        let w = self.writer_mut(id);
        let mut changed = total > w.total;
        w.total = w.total.max(total);
        for (i, c) in cells {
            if c > w.cells[i] {
                w.cells[i] = c;
                changed = true;
            }
        }
        changed
    }

    /// `OwnDotAhead` if `theirs` counts more of this replica's increments than it has.
    fn own_ahead(
        &self,
        total: u64,
        cells: impl Iterator<Item = (usize, u32)>,
    ) -> Result<(), FilterError> {
        let me = self.writer;
        let mine = self.writer_ref(me);
        check_own_dots(me, mine.map_or(0, |w| w.total), total)?;
        for (i, c) in cells {
            check_own_dots(me, mine.map_or(0, |w| u64::from(w.cells[i])), u64::from(c))?;
        }
        Ok(())
    }

    fn check_writers<'a>(
        &self,
        writers: impl Iterator<Item = (ReplicaId, &'a [u32])>,
    ) -> Result<(), FilterError> {
        let mut last = None;
        for (id, cells) in writers {
            if last.is_some_and(|l| l >= id) {
                return Err(FilterError::malformed("writers not strictly ascending"));
            }
            last = Some(id);
            if cells.len() as u64 != self.params.cells() {
                return Err(FilterError::malformed(format!(
                    "a writer with {} counters in a {}x{} sketch",
                    cells.len(),
                    self.params.width,
                    self.params.depth
                )));
            }
        }
        Ok(())
    }
}

/// The occurrence at `(row, column)` of a sketch.
fn located(row: u32, column: u32, count: u64) -> Occurrence {
    Occurrence {
        series: 0,
        sub: row,
        bucket: u64::from(column),
        fp: 0,
        count,
    }
}

impl fmt::Debug for CountMinSketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountMinSketch")
            .field("params", &self.params)
            .field("writer", &self.writer)
            .field("writers", &self.writers.len())
            .field("total", &self.total())
            .finish()
    }
}

impl Lattice for CountMinSketch {
    /// The maximum per (writer, counter) and per writer's total.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("count-min sketch", &self.params, &other.params)?;
        for w in other.writers.iter().filter(|w| !w.is_empty()) {
            self.join_writer(w.id, w.total, w.cells.iter().copied().enumerate());
        }
        Ok(())
    }

    /// Every writer's counters and total here at most `other`'s (a writer it lacks counts 0).
    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.writers.iter().all(|w| match other.writer_ref(w.id) {
                Some(o) => {
                    w.total <= o.total && w.cells.iter().zip(o.cells.iter()).all(|(a, b)| a <= b)
                }
                None => w.is_empty(),
            })
    }
}

impl Membership for CountMinSketch {
    /// A positive estimate.
    fn contains(&self, item: &[u8]) -> bool {
        self.count(item) > 0
    }

    /// An increment by 1.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.increment(item, 1);
        Ok(())
    }

    /// The increments in all.
    fn cardinality(&self) -> f64 {
        self.total() as f64
    }

    /// Counters per row.
    fn capacity(&self) -> u64 {
        u64::from(self.params.width)
    }

    /// Counters above 0, over all of them.
    fn load_factor(&self) -> f64 {
        if self.writers.is_empty() {
            return 0.0;
        }
        let used = (0..self.params.cells() as usize)
            .filter(|&i| self.writers.iter().any(|w| w.cells[i] > 0))
            .count();
        used as f64 / self.params.cells() as f64
    }

    /// The chance that an item never counted reads above 0: every row's share of counters
    /// above 0, multiplied.
    fn estimated_fpr(&self) -> f64 {
        if self.writers.is_empty() {
            return 0.0;
        }
        let width = self.params.width as usize;
        (0..self.params.depth as usize)
            .map(|row| {
                let used = (row * width..(row + 1) * width)
                    .filter(|&i| self.writers.iter().any(|w| w.cells[i] > 0))
                    .count();
                used as f64 / width as f64
            })
            .product()
    }
}

impl DeltaState for CountMinSketch {
    type Delta = CmsDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(Pending::default);
    }

    fn take_delta(&mut self) -> Option<CmsDelta> {
        let pending = self.pending.as_mut()?.drain_sorted();
        if pending.is_empty() {
            return None;
        }
        let mut writers: Vec<CmsDeltaWriter> = Vec::new();
        for (id, cells) in pending {
            let Some(w) = self.writer_ref(id) else {
                continue;
            };
            // Sized at once (a filtered collect grows one doubling at a time).
            let mut entries = Vec::with_capacity(cells.len());
            entries.extend(
                cells
                    .into_iter()
                    .filter(|&c| c != TOTAL_CELL)
                    .map(|c| (c, w.cells[c as usize])),
            );
            writers.push((id, w.total, entries));
        }
        Some(CmsDelta { writers })
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, Pending::len)
    }

    /// The item's estimate rests on this replica's counters of it, which its own increments
    /// log: recorded again, they hold it whatever a merge brought.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        if self.pending.is_none() || !self.contains(item) {
            return false;
        }
        let me = self.writer;
        if self.writer_ref(me).is_none() {
            return false;
        }
        let params = self.params;
        let p = self.pending.as_mut().expect("tracking");
        for row in 0..params.depth {
            p.insert(me, params.cell(item, row) as u32, params.cells());
        }
        p.insert(me, TOTAL_CELL, params.cells());
        true
    }

    fn check_delta(&self, delta: &CmsDelta) -> Result<(), FilterError> {
        let cells = self.params.cells();
        let mut last = None;
        for (id, _, entries) in &delta.writers {
            if last.is_some_and(|l| l >= *id) {
                return Err(FilterError::malformed(
                    "delta writers not strictly ascending",
                ));
            }
            last = Some(*id);
            if let Some((i, _)) = entries.iter().find(|(i, _)| u64::from(*i) >= cells) {
                return Err(FilterError::malformed(format!(
                    "delta counter {i} out of range"
                )));
            }
        }
        Ok(())
    }

    fn merge_delta(&mut self, delta: &CmsDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for (id, total, entries) in &delta.writers {
            if *total == 0 && entries.iter().all(|(_, c)| *c == 0) {
                continue;
            }
            self.join_writer(*id, *total, entries.iter().map(|&(i, c)| (i as usize, c)));
        }
        Ok(())
    }
}

impl CheckRemote for CountMinSketch {
    /// Only this replica raises its own counters, so a received state that counts more of
    /// them comes from a replica sharing the id (or is forged): merged, this replica's next
    /// increments would vanish in the maximum. [`FilterError::OwnDotAhead`], the counts as
    /// "timestamps".
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        match other.writer_ref(self.writer) {
            Some(w) if w.cells.len() as u64 == self.params.cells() => {
                self.own_ahead(w.total, w.cells.iter().copied().enumerate())
            }
            _ => Ok(()),
        }
    }

    fn check_remote_delta(&self, delta: &CmsDelta) -> Result<(), FilterError> {
        let cells = self.params.cells();
        match delta.writers.iter().find(|w| w.0 == self.writer) {
            Some((_, total, entries)) => self.own_ahead(
                *total,
                entries
                    .iter()
                    .filter(|(i, _)| u64::from(*i) < cells)
                    .map(|&(i, c)| (i as usize, c)),
            ),
            None => Ok(()),
        }
    }
}

/// The sketch in a replica: an add of the request API increments by 1, `count` estimates;
/// `CMS.INCRBY` and `CMS.MERGE` increment through [`crate::ReplicatedFilter::import_occurrences`].
impl crate::core::kind::ReplicatedFilter for CountMinSketch {
    const KIND: FilterKind = FilterKind::CountMinSketch;
    /// Only an id's own replica raises its counters, and a later run could not continue them
    /// safely (as `counting_cuckoo`'s counts): a new id at every start.
    const REUSES_IDS: bool = false;

    fn from_spec(spec: &FilterSpec, replica: ReplicaId) -> Result<Self, FilterError> {
        Ok(Self::new(CmsParams::from_spec(spec)?, replica))
    }

    fn params_digest(&self) -> u64 {
        self.params.digest()
    }

    /// Every writer that counted something, with all its counters and its total.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        let mut sum = SetSum::default();
        let mut buf = Vec::new();
        for w in self.writers.iter().filter(|w| !w.is_empty()) {
            buf.clear();
            buf.extend_from_slice(&w.id.to_le_bytes());
            buf.extend_from_slice(&w.total.to_le_bytes());
            for c in w.cells.iter() {
                buf.extend_from_slice(&c.to_le_bytes());
            }
            sum.add(&buf);
        }
        sum.finish(h);
    }

    fn set_writer(&mut self, replica: ReplicaId) {
        self.writer = replica;
    }

    fn counted(&self) -> Option<&dyn Counted> {
        Some(self)
    }

    fn live_occurrences(&self) -> Vec<Occurrence> {
        CountMinSketch::live_occurrences(self)
    }

    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        _room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        CountMinSketch::import_occurrences(self, occurrences)
    }

    fn check_import(
        &self,
        occurrences: &[Occurrence],
        _room: &ImportRoom,
    ) -> Result<(), FilterError> {
        CountMinSketch::check_import(self, occurrences)
    }
}

/// `count` only: a sketch never removes (`counted_mut` stays `None`).
impl Counted for CountMinSketch {
    fn count(&self, item: &[u8]) -> u64 {
        CountMinSketch::count(self, item)
    }

    fn remove_one(&mut self, _item: &[u8]) -> Option<crate::Dot> {
        None
    }
}

/// A writer's counters as CBOR integers (a counter below 24 takes one byte, so a sparse
/// sketch encodes small).
#[derive(Serialize, Deserialize)]
struct CmsRepr {
    params: CmsParams,
    writer: ReplicaId,
    writers: Vec<(ReplicaId, u64, Vec<u32>)>,
}

impl Serialize for CountMinSketch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CmsRepr {
            params: self.params,
            writer: self.writer,
            writers: self
                .writers
                .iter()
                .map(|w| (w.id, w.total, w.cells.to_vec()))
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for CountMinSketch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = CmsRepr::deserialize(d)?;
        let params = r.params.validated().map_err(D::Error::custom)?;
        let sketch = CountMinSketch::new(params, r.writer);
        sketch
            .check_writers(r.writers.iter().map(|(id, _, c)| (*id, c.as_slice())))
            .map_err(D::Error::custom)?;
        Ok(CountMinSketch {
            writers: r
                .writers
                .into_iter()
                .map(|(id, total, cells)| Writer {
                    id,
                    total,
                    cells: cells.into_boxed_slice(),
                })
                .collect(),
            ..sketch
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_reference_vectors() {
        // Worked by hand: the empty input is only the finalisation of `seed ^ 0`. The
        // differential test checks every other input against RedisBloom's sketch.
        assert_eq!(murmur2(b"", 0), 0);
        assert_eq!(murmur2(b"", 1), 0x5bd1_5e36);
    }

    #[test]
    fn one_writer_answers_as_a_plain_sketch_and_several_sum() {
        let p = CmsParams::new(50, 4).unwrap();
        let mut a = CountMinSketch::new(p, 1);
        let mut b = CountMinSketch::new(p, 2);
        let mut single = CountMinSketch::new(p, 9);
        for i in 0..500u32 {
            let item = (i % 37).to_le_bytes();
            let n = u64::from(i % 5);
            if i % 2 == 0 { &mut a } else { &mut b }.increment(&item, n);
            single.increment(&item, n);
        }
        a.merge(&b).unwrap();
        for i in 0..40u32 {
            assert_eq!(a.count(&i.to_le_bytes()), single.count(&i.to_le_bytes()));
        }
        assert_eq!(a.total(), single.total());
        assert_eq!(a.writers(), 2);
    }

    #[test]
    fn a_delta_lists_every_changed_counter_ascending_few_or_many() {
        let p = CmsParams::new(300, 4).unwrap();
        for increments in [1u32, 3, 40, 2_000] {
            let mut s = CountMinSketch::new(p, 1);
            s.track_deltas(true);
            let mut changed = std::collections::BTreeSet::new();
            for i in 0..increments {
                let item = i.to_le_bytes();
                s.increment(&item, 1);
                for row in 0..p.depth {
                    changed.insert(p.cell(&item, row) as u32);
                }
            }
            let delta = s.take_delta().expect("changed");
            let [(id, total, entries)] = &delta.writers[..] else {
                panic!("one writer: {delta:?}");
            };
            assert_eq!((*id, *total), (1, u64::from(increments)));
            let cells: Vec<u32> = entries.iter().map(|&(c, _)| c).collect();
            assert_eq!(cells, changed.iter().copied().collect::<Vec<_>>());
            assert!(
                entries
                    .iter()
                    .all(|&(c, v)| v == s.writers[0].cells[c as usize])
            );
            assert_eq!(s.take_delta(), None, "taken whole");
            // The next delta starts from nothing.
            s.increment(b"again", 2);
            assert_eq!(s.take_delta().unwrap().writers[0].2.len(), p.depth as usize);
        }
    }

    #[test]
    fn weighted_merge_refuses_negative_cells_and_counts_as_own() {
        let p = CmsParams::new(20, 3).unwrap();
        let mut src = CountMinSketch::new(p, 1);
        src.increment(b"x", 3);
        let mut dest = CountMinSketch::new(p, 2);
        assert!(dest.merge_weighted(&[(&src, -1)]).is_err());
        assert_eq!(dest.writers(), 0, "all or nothing");
        dest.merge_weighted(&[(&src, 2)]).unwrap();
        assert_eq!((dest.count(b"x"), dest.total(), dest.writers()), (6, 6, 1));
        // Raised to the sum, not added to: again changes nothing, a larger sum raises more.
        dest.merge_weighted(&[(&src, 2)]).unwrap();
        assert_eq!((dest.count(b"x"), dest.total()), (6, 6));
        dest.merge_weighted(&[(&src, 3)]).unwrap();
        assert_eq!((dest.count(b"x"), dest.total()), (9, 9));
        dest.merge_weighted(&[(&src, 1)]).unwrap();
        assert_eq!((dest.count(b"x"), dest.total()), (9, 9), "never lowered");
        assert!(dest.writer_ref(2).is_some(), "this replica's own counts");
        let mut big = CountMinSketch::new(p, 3);
        big.increment(b"x", u64::from(u32::MAX));
        assert!(dest.merge_weighted(&[(&big, 2)]).is_err());
    }

    #[test]
    fn spec_dimensions_round_trip() {
        for (w, d) in [(1, 1), (2000, 7), (10, 64), (3, CmsParams::MAX_DEPTH)] {
            let spec = FilterSpec::count_min(w, d);
            let p = CmsParams::from_spec(&spec).unwrap();
            assert_eq!((p.width, p.depth), (w, d));
        }
        let p = CmsParams::from_error(0.01, 0.01).unwrap();
        assert_eq!(
            (p.width, p.depth),
            (200, 7),
            "RedisBloom's INITBYPROB 0.01 0.01"
        );
    }
}
