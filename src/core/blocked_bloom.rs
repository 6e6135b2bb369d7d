//! `blocked_bloom`: a grow-only blocked Bloom filter (Putze, Sanders, Singler 2007): each
//! item's `k` bits lie in one 512-bit block, a 64-byte cache line, so a lookup in a filter far
//! larger than the caches misses the cache once instead of up to `k` times. The price is a
//! slightly higher false positive rate at the same memory (blocks fill unevenly; the
//! concurrent Bloom filter specification gives 1.15-1.3x, measured in BENCHMARKS.md). Merge is
//! the OR of the bit arrays, as for `g_bloom`.
//!
//! Hashing: the seeded xxh3-128 of the item (docs/DESIGN.md section 3); the high half picks
//! the block (multiply-shift), the low half the bits in it, 9 bits per position (seven per
//! 64 bits; past seven, the next seven come from murmur3's finalizer of the last 64 bits).
//! Independent positions, not an arithmetic progression `lo + i·step` within the block: the
//! patterns of such progressions overlap (one item's shifted by one step shares `k - 1`
//! bits), which measured 1.35x the standard filter's FPR at 1% and 3.1x at 0.1%, where
//! independent positions give the 1.15x and 1.6x that theory predicts.
//!
//! Layouts ([`BlockedLayout`]): one block per item, or two, three or four. In one block the FPR's excess
//! comes from the spread of the blocks' loads (Poisson, `512/c` items per block at `c` bits
//! per item), and it grows as the target falls (theory: 1.15x at 1%, 1.6x at 0.1%, 2.8x at
//! 0.01%; measured 1.17x, 1.64x, 2.96x). Splitting the `k` bits over two independent blocks
//! (`⌈k/2⌉` in the first, the rest in the second) averages two loads: measured 1.03x, 1.12x
//! and 1.40x (`benches/blocked.rs`, BENCHMARKS.md), for a second cache line on the lookups
//! that pass the first block: present items; an absent one passes its first block's `⌈k/2⌉`
//! bits at half load with probability about `2^-⌈k/2⌉`. Larger blocks do less for the same
//! reads (simulated: 1024 bits, two adjacent lines, give 1.3x at 0.1% and 1.8-1.9x at
//! 0.01%), and so does a better `k` per block (3% at most). Three and four blocks (`k/b` bits
//! each) average more loads: at 0.01% three give 1.12x where two give 1.40x, at 0.001% four
//! give 1.02x. A spec takes one block at 0.5% and above, where it is within the
//! specification's 1.15-1.3x and a present item costs one line; two below 0.5%, where one
//! block's excess passes 1.25x; three below 0.05% and four below 0.005%, where the fewer
//! blocks' excess passes 1.15x in theory ([`BlockedLayout::for_fpr`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::bloom::{bloom_cardinality, bloom_estimated_fpr, check_bloom_delta, take_bloom_delta};
use super::delta::{BloomDelta, CheckRemote, DeltaState};
use super::error::FilterError;
use super::hash::{HASH_VERSION, hash_item, reduce};
use super::huge_pages;
use super::lattice::{Lattice, Membership};
use super::params::BloomParams;
use super::prefetch::{BITS_AHEAD, prefetch};

const UNKNOWN: u64 = u64::MAX;

/// Bits per block: one 64-byte cache line.
pub const BLOCK_BITS: u64 = 512;

/// Fresh bits for the next 7 positions of an item (`k > 7`): murmur3's 64-bit finalizer.
#[inline(always)]
fn remix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Over how many blocks an item's `k` bits spread (module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BlockedLayout {
    /// All `k` bits in one block: one cache line per lookup.
    #[default]
    OneBlock,
    /// `⌈k/2⌉` bits in one block and the rest in a second, independent one: at most two
    /// cache lines per lookup, for an FPR near the standard filter's at low targets.
    TwoBlocks,
    /// The `k` bits over three independent blocks (`k/3` each, the first ones taking the
    /// remainder): at most three lines per lookup, for targets below 0.05%.
    ThreeBlocks,
    /// Over four blocks, for targets below 0.005%.
    FourBlocks,
}

impl BlockedLayout {
    /// Below this target FPR a spec takes two blocks per item: one block's FPR at the same
    /// memory passes 1.25x the standard filter's there (1.25x at 0.5%, 1.6x at 0.1%).
    pub const TWO_BLOCKS_BELOW_FPR: f64 = 0.005;
    /// Below this target, three blocks: two blocks' excess passes 1.15x in theory there
    /// (measured 1.40x at 0.01%).
    pub const THREE_BLOCKS_BELOW_FPR: f64 = 0.0005;
    /// Below this target, four blocks: three blocks' excess passes 1.15x in theory there.
    pub const FOUR_BLOCKS_BELOW_FPR: f64 = 0.00005;

    /// The layout of a filter sized for `fpr`.
    pub fn for_fpr(fpr: f64) -> Self {
        if fpr < Self::FOUR_BLOCKS_BELOW_FPR {
            BlockedLayout::FourBlocks
        } else if fpr < Self::THREE_BLOCKS_BELOW_FPR {
            BlockedLayout::ThreeBlocks
        } else if fpr < Self::TWO_BLOCKS_BELOW_FPR {
            BlockedLayout::TwoBlocks
        } else {
            BlockedLayout::OneBlock
        }
    }

    /// Blocks per item (1 to 4): the number the state's encoding carries.
    pub fn blocks(self) -> u8 {
        match self {
            BlockedLayout::OneBlock => 1,
            BlockedLayout::TwoBlocks => 2,
            BlockedLayout::ThreeBlocks => 3,
            BlockedLayout::FourBlocks => 4,
        }
    }

    fn from_blocks(blocks: u8) -> Option<Self> {
        match blocks {
            1 => Some(BlockedLayout::OneBlock),
            2 => Some(BlockedLayout::TwoBlocks),
            3 => Some(BlockedLayout::ThreeBlocks),
            4 => Some(BlockedLayout::FourBlocks),
            _ => None,
        }
    }
}

/// Most blocks an item's bits spread over.
const MAX_BLOCKS: usize = 4;

/// The item's bits from the first 64 of its hash's low half, 9 at a time, then from murmur3's
/// finalizer of those 64 every seven positions.
struct Positions {
    word: u64,
    bits: u64,
    left: u32,
}

impl Positions {
    #[inline(always)]
    fn new(lo: u64) -> Self {
        Self {
            word: lo,
            bits: lo,
            left: 7,
        }
    }

    #[inline(always)]
    fn next_bit(&mut self) -> usize {
        if self.left == 0 {
            self.word = remix(self.word);
            (self.bits, self.left) = (self.word, 7);
        }
        let bit = (self.bits & (BLOCK_BITS - 1)) as usize;
        self.bits >>= 9;
        self.left -= 1;
        bit
    }
}

/// The blocks an item's bits lie in and its bits in each (the masks past the layout's
/// blocks are empty, their blocks the first's).
struct Footprint {
    blocks: [usize; MAX_BLOCKS],
    masks: [[u64; 8]; MAX_BLOCKS],
}

/// One block, aligned to a cache line so that it is one.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
#[repr(C, align(64))]
struct Block([u64; 8]);

// SAFETY: eight u64 and nothing else (64 bytes, alignment 64: no padding); all-zero is a
// valid value and so is any bit pattern.
unsafe impl bytemuck::Zeroable for Block {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Block {}

/// A grow-only blocked Bloom filter.
///
/// ```
/// use crpf::{BlockedBloom, Lattice, Membership};
///
/// let mut a = BlockedBloom::with_capacity(1000, 0.01)?;
/// let mut b = BlockedBloom::with_capacity(1000, 0.01)?;
/// a.add(b"apple")?;
/// b.add(b"pear")?;
/// a.merge(&b)?;
/// assert!(a.contains(b"apple") && a.contains(b"pear"));
/// assert_eq!(a.params().bits % 512, 0);
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub struct BlockedBloom {
    params: BloomParams,
    layout: BlockedLayout,
    blocks: Vec<Block>,
    ones: AtomicU64,
    pending: Option<Vec<u64>>,
}

/// The parameters a blocked filter takes for `params`: its bits rounded up to whole blocks.
pub fn blocked_params(params: BloomParams) -> Result<BloomParams, FilterError> {
    BloomParams {
        bits: params.bits.div_ceil(BLOCK_BITS).max(1) * BLOCK_BITS,
        ..params
    }
    .validated()
}

impl BlockedBloom {
    /// A filter sized as `g_bloom` is for `capacity` at `fpr` (the same `k`, the bits rounded
    /// up to whole blocks): the same memory, for a slightly higher FPR; in the layout
    /// [`BlockedLayout::for_fpr`] gives.
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::with_layout(
            BloomParams::with_capacity(capacity, fpr)?,
            BlockedLayout::for_fpr(fpr),
        )
    }

    /// A filter of these parameters, its bits rounded up to whole 512-bit blocks, one block
    /// per item.
    pub fn new(params: BloomParams) -> Result<Self, FilterError> {
        Self::with_layout(params, BlockedLayout::OneBlock)
    }

    /// A filter of these parameters in this layout, its bits rounded up to whole blocks.
    pub fn with_layout(params: BloomParams, layout: BlockedLayout) -> Result<Self, FilterError> {
        let params = blocked_params(params)?;
        Ok(Self {
            params,
            layout,
            blocks: huge_pages::zeroed_vec((params.bits / BLOCK_BITS) as usize),
            ones: AtomicU64::new(0),
            pending: None,
        })
    }

    /// The filter's parameters (bits a multiple of 512).
    pub fn params(&self) -> &BloomParams {
        &self.params
    }

    /// The filter's layout.
    pub fn layout(&self) -> BlockedLayout {
        self.layout
    }

    /// The blocks of an item of hash `hi`, the layout's first (those past them are the
    /// first's).
    #[inline(always)]
    fn blocks_of(&self, hi: u64) -> [usize; MAX_BLOCKS] {
        let n = self.blocks.len() as u64;
        let first = reduce(hi, n) as usize;
        let mut blocks = [first; MAX_BLOCKS];
        // Fresh bits for each further block: `reduce` keeps the product's high half, which
        // the first block's index already took from `hi`.
        let mut x = hi;
        for b in blocks.iter_mut().take(self.layout.blocks().into()).skip(1) {
            x = remix(x);
            *b = reduce(x, n) as usize;
        }
        blocks
    }

    /// Bits of the item in block `i` of its blocks: `k / blocks` each, the first
    /// `k % blocks` one more (with two blocks, `⌈k/2⌉` and `⌊k/2⌋`, as before there were
    /// more).
    #[inline(always)]
    fn block_bits(&self, i: usize) -> u32 {
        let k = self.params.hashes;
        // A division by a constant in each arm: no `div` on the lookup's path.
        let share = |b: u32| k / b + u32::from((i as u32) < k % b);
        match self.layout {
            BlockedLayout::OneBlock => k,
            BlockedLayout::TwoBlocks => share(2),
            BlockedLayout::ThreeBlocks => share(3),
            BlockedLayout::FourBlocks => share(4),
        }
    }

    /// The item's blocks and its bits in each, as masks of eight words.
    #[inline(always)]
    fn locate(&self, item: &[u8]) -> Footprint {
        let h = hash_item(item, self.params.seed);
        let mut positions = Positions::new(h.lo);
        let mut masks = [[0u64; 8]; MAX_BLOCKS];
        for (i, mask) in masks
            .iter_mut()
            .enumerate()
            .take(self.layout.blocks().into())
        {
            for _ in 0..self.block_bits(i) {
                let bit = positions.next_bit();
                mask[bit >> 6] |= 1 << (bit & 63);
            }
        }
        Footprint {
            blocks: self.blocks_of(h.hi),
            masks,
        }
    }

    fn set_item(&mut self, item: &[u8]) -> u64 {
        let at = self.locate(item);
        let mut newly = 0;
        for (b, mask) in at.blocks.into_iter().zip(at.masks) {
            let block = &mut self.blocks[b].0;
            for (w, (word, m)) in block.iter_mut().zip(mask).enumerate() {
                let mut clear = m & !*word;
                newly += u64::from(clear.count_ones());
                *word |= m;
                if let Some(p) = &mut self.pending {
                    while clear != 0 {
                        p.push(
                            b as u64 * BLOCK_BITS
                                + w as u64 * 64
                                + u64::from(clear.trailing_zeros()),
                        );
                        clear &= clear - 1;
                    }
                }
            }
        }
        let ones = self.ones.get_mut();
        if *ones != UNKNOWN {
            *ones += newly;
        }
        newly
    }

    /// Number of set bits.
    pub fn ones(&self) -> u64 {
        let cached = self.ones.load(Ordering::Relaxed);
        if cached != UNKNOWN {
            return cached;
        }
        let n = self.words().iter().map(|w| u64::from(w.count_ones())).sum();
        self.ones.store(n, Ordering::Relaxed);
        n
    }

    fn words(&self) -> &[u64] {
        bytemuck::cast_slice(&self.blocks)
    }

    fn words_mut(&mut self) -> &mut [u64] {
        bytemuck::cast_slice_mut(&mut self.blocks)
    }

    /// Starts loading the item's blocks (a batch calls it for an item a few places ahead).
    pub fn prefetch_item(&self, item: &[u8]) {
        let h = hash_item(item, self.params.seed);
        let blocks = self.blocks_of(h.hi);
        for &b in &blocks[..self.layout.blocks().into()] {
            prefetch(&self.blocks[b]);
        }
    }
}

impl Clone for BlockedBloom {
    fn clone(&self) -> Self {
        Self {
            params: self.params,
            layout: self.layout,
            blocks: self.blocks.clone(),
            ones: AtomicU64::new(self.ones.load(Ordering::Relaxed)),
            pending: self.pending.clone(),
        }
    }
}

impl PartialEq for BlockedBloom {
    fn eq(&self, other: &Self) -> bool {
        self.params == other.params && self.layout == other.layout && self.blocks == other.blocks
    }
}
impl Eq for BlockedBloom {}

impl fmt::Debug for BlockedBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockedBloom")
            .field("params", &self.params)
            .field("layout", &self.layout)
            .field("ones", &self.ones())
            .finish()
    }
}

impl Lattice for BlockedBloom {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same(
            "blocked bloom",
            &(self.params, self.layout),
            &(other.params, other.layout),
        )?;
        for (a, b) in self.words_mut().iter_mut().zip(other.words()) {
            *a |= *b;
        }
        *self.ones.get_mut() = UNKNOWN;
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.layout == other.layout
            && self
                .words()
                .iter()
                .zip(other.words())
                .all(|(a, b)| a & !b == 0)
    }
}

impl Membership for BlockedBloom {
    /// Bit by bit, leaving at the first clear one: a lookup of an absent item reads about two
    /// bits of its line, and the few instructions per lookup let the CPU have the cache misses
    /// of several lookups in flight (building the whole mask first, as an add does, measured
    /// slower than `g_bloom` at 64 MiB).
    /// Two blocks: the first block's bits first, the second block only if they are all
    /// set (an absent item is mostly refused by its first block). The second block's line
    /// is asked for at once: left to the bit tests, a present item's two misses came one
    /// after the other (64 MiB, `k = 10`: as slow as `g_bloom`'s ten probes, twice one
    /// block's time).
    /// Three or four blocks: the same, every further block's line asked for at once.
    #[inline]
    fn contains(&self, item: &[u8]) -> bool {
        let h = hash_item(item, self.params.seed);
        let blocks = self.blocks_of(h.hi);
        let n = usize::from(self.layout.blocks());
        for &b in &blocks[1..n] {
            prefetch(&self.blocks[b]);
        }
        let mut positions = Positions::new(h.lo);
        let all_set = |block: &[u64; 8], positions: &mut Positions, bits: u32| {
            (0..bits).all(|_| {
                let bit = positions.next_bit();
                block[bit >> 6] & (1 << (bit & 63)) != 0
            })
        };
        blocks[..n]
            .iter()
            .enumerate()
            .all(|(i, &b)| all_set(&self.blocks[b].0, &mut positions, self.block_bits(i)))
    }

    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.set_item(item);
        Ok(())
    }

    fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError> {
        Ok(self.set_item(item) > 0)
    }

    /// Eq. 3.20 as for `g_bloom`: blocks fill unevenly, but the estimate of the items from
    /// the share of set bits holds within the same spread at the fills it is meant for.
    fn cardinality(&self) -> f64 {
        bloom_cardinality(&self.params, self.ones())
    }

    fn capacity(&self) -> u64 {
        self.params.capacity
    }

    fn load_factor(&self) -> f64 {
        self.cardinality() / self.params.capacity as f64
    }

    /// `(|S|/m)^k`, as for `g_bloom`: a lower bound here, since the uneven fill of the blocks
    /// adds to it (the 1.15-1.3x of BENCHMARKS.md).
    fn estimated_fpr(&self) -> f64 {
        bloom_estimated_fpr(&self.params, self.ones())
    }
}

impl DeltaState for BlockedBloom {
    type Delta = BloomDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(Vec::new);
    }

    fn take_delta(&mut self) -> Option<BloomDelta> {
        take_bloom_delta(&mut self.pending)
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, Vec::len)
    }

    /// Every bit of the item's masks in its blocks.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        if !Membership::contains(self, item) {
            return false;
        }
        let at = self.locate(item);
        let Some(pending) = &mut self.pending else {
            return false;
        };
        for (b, mask) in at.blocks.into_iter().zip(at.masks) {
            for (w, mut m) in mask.into_iter().enumerate() {
                while m != 0 {
                    pending.push(
                        b as u64 * BLOCK_BITS + w as u64 * 64 + u64::from(m.trailing_zeros()),
                    );
                    m &= m - 1;
                }
            }
        }
        true
    }

    fn check_delta(&self, delta: &BloomDelta) -> Result<(), FilterError> {
        check_bloom_delta(&self.params, delta)
    }

    fn merge_delta(&mut self, delta: &BloomDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        let words = bytemuck::cast_slice_mut::<Block, u64>(&mut self.blocks);
        for (n, &idx) in delta.bits.iter().enumerate() {
            if let Some(&ahead) = delta.bits.get(n + BITS_AHEAD) {
                prefetch(&words[(ahead >> 6) as usize]);
            }
            words[(idx >> 6) as usize] |= 1 << (idx & 63);
        }
        *self.ones.get_mut() = UNKNOWN;
        Ok(())
    }
}

impl CheckRemote for BlockedBloom {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &BloomDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

/// Serialized form: the parameters and the bit array (little-endian words) as one byte
/// string, as `g_bloom`'s; then the blocks per item, absent for one (every state before
/// the two-block layout, which therefore encodes and decodes as before). Last: the encoding
/// numbers the fields in order.
#[derive(Serialize, Deserialize)]
struct BlockedBloomRepr {
    params: BloomParams,
    #[serde(with = "serde_bytes")]
    bits: Vec<u8>,
    #[serde(default = "one_block", skip_serializing_if = "is_one_block")]
    blocks_per_item: u8,
}

fn one_block() -> u8 {
    1
}

fn is_one_block(blocks: &u8) -> bool {
    *blocks == 1
}

impl Serialize for BlockedBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut bits = Vec::with_capacity(self.blocks.len() * 64);
        for w in self.words() {
            bits.extend_from_slice(&w.to_le_bytes());
        }
        BlockedBloomRepr {
            params: self.params,
            bits,
            blocks_per_item: self.layout.blocks(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for BlockedBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let repr = BlockedBloomRepr::deserialize(d)?;
        if repr.params.bits % BLOCK_BITS != 0 {
            return Err(D::Error::custom(format!(
                "blocked bloom of {} bits: not whole 512-bit blocks",
                repr.params.bits
            )));
        }
        let params = repr.params.validated().map_err(D::Error::custom)?;
        let layout = BlockedLayout::from_blocks(repr.blocks_per_item).ok_or_else(|| {
            D::Error::custom(format!(
                "blocked bloom of {} blocks per item: 1 to 4",
                repr.blocks_per_item
            ))
        })?;
        // The length before the allocation: a forged `bits` must not allocate gigabytes.
        if repr.bits.len() as u64 != params.bits / 8 {
            return Err(D::Error::custom(format!(
                "blocked bloom bit array has {} bytes, parameters say {}",
                repr.bits.len(),
                params.bits / 8
            )));
        }
        let mut f = BlockedBloom::with_layout(params, layout).map_err(D::Error::custom)?;
        for (w, b) in f.words_mut().iter_mut().zip(repr.bits.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
        *f.ones.get_mut() = UNKNOWN;
        Ok(f)
    }
}

/// The `blocked_bloom` kind of a replica.
impl crate::core::kind::ReplicatedFilter for BlockedBloom {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::BlockedBloom;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        BlockedBloom::with_layout(
            BloomParams::with_capacity(spec.capacity, spec.fpr)?.with_seed(spec.seed()),
            BlockedLayout::for_fpr(spec.fpr),
        )
    }

    fn params_digest(&self) -> u64 {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(b"blocked_bloom");
        b.extend_from_slice(&HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.params.digest().to_le_bytes());
        // One block digests as before the layouts: replicas of either release agree.
        if self.layout != BlockedLayout::OneBlock {
            b.push(self.layout.blocks());
        }
        xxh3_64(&b)
    }

    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        h.update(bytemuck::cast_slice::<Block, u8>(&self.blocks));
    }

    fn prefetch(&self, item: &[u8]) {
        self.prefetch_item(item)
    }

    fn prefetch_ahead(&self) -> usize {
        // One or two lines per item: as many in flight as a cuckoo table's (two buckets).
        crate::core::prefetch::CUCKOO_ITEMS_AHEAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kind::{FilterKind, FilterSpec, ReplicatedFilter};

    /// The probability that `bits` positions of a block all hit set bits, the block having
    /// received a Poisson number of `per_visit`-bit visits of mean `visits` (Putze et al.).
    fn block_pass(visits: f64, per_visit: f64, bits: u32) -> f64 {
        let mut p = (-visits).exp();
        let mut sum = 0.0;
        for j in 0..2000 {
            if j > 0 {
                p *= visits / j as f64;
            }
            let set = 1.0 - (1.0 - 1.0 / BLOCK_BITS as f64).powf(per_visit * j as f64);
            sum += p * set.powi(bits as i32);
        }
        sum
    }

    /// The FPR of a blocked filter of `c` bits per item and `k` hashes in 512-bit blocks,
    /// spread over `b` blocks of `k/b` bits (the first `k % b` one more): each block then
    /// receives `b` times the visits, of `k/b` bits each on average.
    fn blocked_fpr_theory(c: f64, k: u32, layout: BlockedLayout) -> f64 {
        let per_block = BLOCK_BITS as f64 / c;
        let b = u32::from(layout.blocks());
        (0..b)
            .map(|i| {
                let bits = k / b + u32::from(i < k % b);
                block_pass(f64::from(b) * per_block, f64::from(k) / f64::from(b), bits)
            })
            .product()
    }

    /// Measured FPRs of a blocked filter and `g_bloom` at the same memory, `n` items sized
    /// for `fpr`, over `probes` absent items; and the blocked filter's theoretical FPR.
    fn fprs(fpr: f64, layout: BlockedLayout, n: u64, probes: u64) -> (f64, f64, f64) {
        let params = blocked_params(BloomParams::with_capacity(n, fpr).unwrap()).unwrap();
        let mut blocked = BlockedBloom::with_layout(params, layout).unwrap();
        let mut standard = crate::GBloom::new(params).unwrap();
        for i in 0..n {
            blocked.add(&i.to_le_bytes()).unwrap();
            standard.add(&i.to_le_bytes()).unwrap();
        }
        let rate = |f: &dyn Fn(&[u8]) -> bool| {
            (n..n + probes).filter(|i| f(&i.to_le_bytes())).count() as f64 / probes as f64
        };
        let theory = blocked_fpr_theory(params.bits as f64 / n as f64, params.hashes, layout);
        (
            rate(&|x| blocked.contains(x)),
            rate(&|x| standard.contains(x)),
            theory,
        )
    }

    /// The specification's bound: at the same memory, near 1% a blocked filter's FPR is
    /// within 1.15-1.3x of the standard filter's (measured: 1.18x against `g_bloom`); in one
    /// block the factor grows at lower targets (1.6x at 0.1%, as theory says), which two
    /// blocks bring back within it (1.1-1.15x), and three blocks at 0.01%. 200,000 items,
    /// 2,000,000 probes (8,000,000 at 0.01%, some 800 false positives): a few percent of
    /// sampling spread.
    #[test]
    fn fpr_is_within_the_specified_factor_of_g_bloom_at_equal_memory() {
        for (fpr, layout, max_ratio) in [
            (0.01, BlockedLayout::OneBlock, 1.3),
            (0.001, BlockedLayout::OneBlock, 1.75),
            (0.01, BlockedLayout::TwoBlocks, 1.15),
            (0.001, BlockedLayout::TwoBlocks, 1.3),
            (0.0001, BlockedLayout::ThreeBlocks, 1.3),
        ] {
            let probes = if fpr < 0.001 { 8_000_000 } else { 2_000_000 };
            let (blocked, standard, theory) = fprs(fpr, layout, 200_000, probes);
            let ratio = blocked / standard;
            assert!(
                (0.95..max_ratio).contains(&ratio),
                "fpr {fpr} {layout:?}: blocked {blocked}, standard {standard}, ratio {ratio}"
            );
            assert!(
                (blocked / theory - 1.0).abs() < 0.1,
                "fpr {fpr} {layout:?}: measured {blocked}, theory {theory}"
            );
        }
    }

    /// Where a spec switches to two blocks, one block's excess has passed 1.25x (theory);
    /// where it switches to three and to four, the fewer blocks' has passed 1.15x; and the
    /// layout keeps it within 1.2x (theory) down to 0.001%: the rule of
    /// [`BlockedLayout::for_fpr`]. (The formula takes a block's fill at a given load as its
    /// mean, so it runs a few percent low at large `k`: `benches/blocked.rs` measured 1.40x
    /// in two blocks at 0.01% where it says 1.30x, 2.96x in one.)
    #[test]
    fn the_layout_by_target_keeps_the_theoretical_excess_within_the_bound() {
        let fprs = [
            0.02, 0.01, 0.007, 0.005, 0.003, 0.001, 0.0005, 0.0003, 0.0002, 0.0001, 0.00005,
            0.00002, 0.00001,
        ];
        for fpr in fprs {
            let p = BloomParams::with_capacity(1_000_000, fpr).unwrap();
            let c = p.bits as f64 / 1e6;
            let standard = (1.0 - (-f64::from(p.hashes) / c).exp()).powi(p.hashes as i32);
            let layout = BlockedLayout::for_fpr(fpr);
            let excess = |layout| blocked_fpr_theory(c, p.hashes, layout) / standard;
            let bound = if layout == BlockedLayout::OneBlock {
                1.3
            } else {
                1.2
            };
            assert!(
                excess(layout) < bound,
                "{fpr}: {layout:?} {}",
                excess(layout)
            );
            let fewer = match layout {
                BlockedLayout::OneBlock => continue,
                BlockedLayout::TwoBlocks => (BlockedLayout::OneBlock, 1.25),
                BlockedLayout::ThreeBlocks => (BlockedLayout::TwoBlocks, 1.15),
                BlockedLayout::FourBlocks => (BlockedLayout::ThreeBlocks, 1.15),
            };
            assert!(
                excess(fewer.0) > fewer.1,
                "{fpr}: {:?} would do ({})",
                fewer.0,
                excess(fewer.0)
            );
        }
    }

    #[test]
    fn an_items_bits_lie_in_its_blocks() {
        let layouts = [
            BlockedLayout::OneBlock,
            BlockedLayout::TwoBlocks,
            BlockedLayout::ThreeBlocks,
            BlockedLayout::FourBlocks,
        ];
        for layout in layouts {
            let mut f = BlockedBloom::with_layout(
                BloomParams::with_capacity(10_000, 0.0001).unwrap(),
                layout,
            )
            .unwrap();
            let (k, n) = (f.params.hashes, usize::from(layout.blocks()));
            assert!(k > 7, "past the first 64 bits too");
            let mut apart = 0;
            for i in 0..1000u32 {
                let at = f.locate(&i.to_le_bytes());
                let mut one = BlockedBloom::with_layout(f.params, layout).unwrap();
                one.add(&i.to_le_bytes()).unwrap();
                let set: Vec<usize> = (0..one.blocks.len())
                    .filter(|&b| one.blocks[b] != Block::default())
                    .collect();
                let bits = |m: &[u64; 8]| m.iter().map(|w| w.count_ones()).sum::<u32>();
                let mut mine: Vec<usize> = at.blocks[..n].to_vec();
                mine.sort_unstable();
                mine.dedup();
                // Independent blocks may coincide, rarely; so may positions.
                assert_eq!(set, mine, "{layout:?}");
                apart += usize::from(mine.len() == n);
                for b in &mine {
                    let mut expected = [0u64; 8];
                    for j in (0..n).filter(|&j| at.blocks[j] == *b) {
                        for (w, m) in expected.iter_mut().zip(at.masks[j]) {
                            *w |= m;
                        }
                    }
                    assert_eq!(one.blocks[*b].0, expected, "{layout:?}");
                }
                for j in 0..MAX_BLOCKS {
                    let want = if j < n { f.block_bits(j) } else { 0 };
                    assert!(bits(&at.masks[j]) <= want && bits(&at.masks[j]) + 2 >= want);
                    if j >= n {
                        assert_eq!(at.blocks[j], at.blocks[0]);
                    }
                }
                assert_eq!((0..n).map(|j| f.block_bits(j)).sum::<u32>(), k);
                f.add(&i.to_le_bytes()).unwrap();
                assert!(f.contains(&i.to_le_bytes()));
            }
            assert!(
                apart > 900,
                "{layout:?}: {apart} of 1000 in {n} distinct blocks"
            );
        }
    }

    /// Two blocks split an item's bits as before there were more layouts: `⌈k/2⌉` in the
    /// first, the rest in the second (the encoding of existing two-block states depends on
    /// it).
    #[test]
    fn two_blocks_split_as_they_always_did() {
        let f = BlockedBloom::with_layout(
            BloomParams::with_capacity(10_000, 0.001).unwrap(),
            BlockedLayout::TwoBlocks,
        )
        .unwrap();
        let k = f.params.hashes;
        assert_eq!((f.block_bits(0), f.block_bits(1)), (k.div_ceil(2), k / 2));
    }

    /// One block encodes as before the layouts (two fields), two blocks say so in a third,
    /// last; a layout that does not exist is refused; layouts do not merge.
    #[test]
    fn the_layout_travels_in_the_state_and_keeps_replicas_apart() {
        let params = BloomParams::with_capacity(1_000, 0.001).unwrap();
        let fields =
            |f: &BlockedBloom| match serde_cbor::from_slice(&serde_cbor::to_vec(f).unwrap())
                .unwrap()
            {
                serde_cbor::Value::Map(m) => m.len(),
                v => panic!("{v:?}"),
            };
        let mut one = BlockedBloom::new(params).unwrap();
        let mut two = BlockedBloom::with_layout(params, BlockedLayout::TwoBlocks).unwrap();
        for f in [&mut one, &mut two] {
            f.add(b"apple").unwrap();
        }
        assert_eq!((fields(&one), fields(&two)), (2, 3));
        for f in [&one, &two] {
            let back: BlockedBloom =
                serde_cbor::from_slice(&serde_cbor::to_vec(f).unwrap()).unwrap();
            assert_eq!(&back, f);
            assert!(back.contains(b"apple"));
        }
        let five = serde_cbor::to_vec(&BlockedBloomRepr {
            params: one.params,
            bits: vec![0; (one.params.bits / 8) as usize],
            blocks_per_item: 5,
        })
        .unwrap();
        let err = serde_cbor::from_slice::<BlockedBloom>(&five).unwrap_err();
        assert!(err.to_string().contains("5 blocks per item"), "{err}");
        let mut three = BlockedBloom::with_layout(params, BlockedLayout::ThreeBlocks).unwrap();
        three.add(b"apple").unwrap();
        let back: BlockedBloom =
            serde_cbor::from_slice(&serde_cbor::to_vec(&three).unwrap()).unwrap();
        assert_eq!(back, three);
        assert_ne!(three.params_digest(), two.params_digest());
        assert!(matches!(
            one.clone().merge(&two),
            Err(FilterError::Incompatible(_))
        ));
        assert!(!one.le(&two) && !two.le(&one));
        assert_ne!(one.params_digest(), two.params_digest());
    }

    /// A spec at 0.5% and above takes one block, below two; and one block's parameter
    /// digest is what it was before the layouts (replicas of either release agree).
    #[test]
    fn a_spec_chooses_the_layout_by_its_target() {
        let make = |fpr| {
            BlockedBloom::from_spec(&FilterSpec::new(FilterKind::BlockedBloom, 1_000, fpr), 1)
                .unwrap()
        };
        assert_eq!(make(0.01).layout(), BlockedLayout::OneBlock);
        assert_eq!(make(0.005).layout(), BlockedLayout::OneBlock);
        assert_eq!(make(0.001).layout(), BlockedLayout::TwoBlocks);
        let f = make(0.01);
        let mut before = Vec::new();
        before.extend_from_slice(b"blocked_bloom");
        before.extend_from_slice(&HASH_VERSION.to_le_bytes());
        before.extend_from_slice(&f.params.digest().to_le_bytes());
        assert_eq!(f.params_digest(), xxh3_64(&before));
    }
}
