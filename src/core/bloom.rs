//! GBF: the grow-only Bloom filter (thesis Spec. 2).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::delta::{BloomDelta, CheckRemote, DeltaState};
use super::error::FilterError;
use super::hash::{BloomProbes, ItemHash, hash_item};
use super::lattice::{Lattice, Membership};
use super::params::BloomParams;

const UNKNOWN: u64 = u64::MAX;

/// A grow-only Bloom filter: a state-based CRDT whose merge is the bitwise OR (thesis Spec. 2).
///
/// ```
/// use crpf::{GBloom, Lattice, Membership};
///
/// let mut a = GBloom::with_capacity(1000, 0.01)?;
/// let mut b = GBloom::with_capacity(1000, 0.01)?;
/// a.add(b"apple")?;
/// assert!(!b.test_and_add(b"pear"));   // was absent, now added
/// a.merge(&b)?;
/// assert!(a.contains(b"apple") && a.contains(b"pear"));
/// assert!(b.le(&a));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub struct GBloom {
    params: BloomParams,
    words: Vec<u64>,
    /// Count of set bits, or `UNKNOWN` after a merge until someone needs it. Kept out of the
    /// merge loop so that merge stays a plain OR over the words.
    ones: AtomicU64,
    /// Bits set by local adds since the last `take_delta`, while tracking.
    pending: Option<Vec<u64>>,
}

impl GBloom {
    /// A filter sized for `capacity` elements at false positive rate `fpr` (Eq. 2.3, 2.4).
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Ok(Self::from_valid(BloomParams::with_capacity(capacity, fpr)?))
    }

    /// A filter with explicit parameters.
    ///
    /// ```
    /// let p = crpf::BloomParams { bits: 1 << 16, hashes: 5, seed: 42, capacity: 10_000 };
    /// let f = crpf::GBloom::new(p)?;
    /// assert_eq!(f.params().seed, 42);
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn new(params: BloomParams) -> Result<Self, FilterError> {
        Ok(Self::from_valid(params.validated()?))
    }

    fn from_valid(params: BloomParams) -> Self {
        let words = vec![0u64; params.bits.div_ceil(64) as usize];
        Self {
            params,
            words,
            ones: AtomicU64::new(0),
            pending: None,
        }
    }

    /// The filter's parameters.
    pub fn params(&self) -> &BloomParams {
        &self.params
    }

    #[inline]
    fn hash(&self, item: &[u8]) -> ItemHash {
        hash_item(item, self.params.seed)
    }

    #[inline]
    fn contains_hash(&self, h: ItemHash) -> bool {
        let mut probes = BloomProbes::new(h, self.params.bits);
        (0..self.params.hashes).all(|_| {
            let idx = probes.next_index();
            self.words[(idx >> 6) as usize] & (1 << (idx & 63)) != 0
        })
    }

    /// Sets the item's bits; returns how many were newly set.
    #[inline]
    fn set_hash(&mut self, h: ItemHash) -> u64 {
        let hashes = self.params.hashes;
        let mut probes = BloomProbes::new(h, self.params.bits);
        let words = &mut self.words;
        let mut newly = 0;
        // Two loops, so that the common untracked case stays branch-free: a data-dependent
        // branch on "was the bit clear" would serialize the cache-missing word loads.
        match &mut self.pending {
            None => {
                for _ in 0..hashes {
                    let idx = probes.next_index();
                    let word = &mut words[(idx >> 6) as usize];
                    let mask = 1u64 << (idx & 63);
                    newly += (*word & mask == 0) as u64;
                    *word |= mask;
                }
            }
            Some(pending) => {
                for _ in 0..hashes {
                    let idx = probes.next_index();
                    let word = &mut words[(idx >> 6) as usize];
                    let mask = 1u64 << (idx & 63);
                    if *word & mask == 0 {
                        newly += 1;
                        pending.push(idx);
                    }
                    *word |= mask;
                }
            }
        }
        let ones = self.ones.get_mut();
        if *ones != UNKNOWN {
            *ones += newly;
        }
        newly
    }

    /// Adds the item and returns whether it was (probably) present before
    /// (`TestAndAdd` of the usual Bloom filter API).
    pub fn test_and_add(&mut self, item: &[u8]) -> bool {
        self.set_hash(self.hash(item)) == 0
    }

    /// Adds the item only if it was absent; returns whether it was (probably) present
    /// (`TestOrAdd`). The state afterwards is the same as after [`GBloom::test_and_add`].
    pub fn test_or_add(&mut self, item: &[u8]) -> bool {
        let h = self.hash(item);
        if self.contains_hash(h) {
            true
        } else {
            self.set_hash(h);
            false
        }
    }

    /// Number of set bits `|S|`.
    pub fn ones(&self) -> u64 {
        let cached = self.ones.load(Ordering::Relaxed);
        if cached != UNKNOWN {
            return cached;
        }
        let n = self.words.iter().map(|w| w.count_ones() as u64).sum();
        self.ones.store(n, Ordering::Relaxed);
        n
    }

    /// The bit array as bytes (little-endian words, truncated to `bits / 8` rounded up): the
    /// serialized bits and the replica's state digest. Borrowed on little-endian targets, so
    /// that neither copies a filter of hundreds of megabytes.
    pub(crate) fn bit_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        let len = self.params.bits.div_ceil(8) as usize;
        if cfg!(target_endian = "little") {
            std::borrow::Cow::Borrowed(&bytemuck::cast_slice::<u64, u8>(&self.words)[..len])
        } else {
            let mut bits: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
            bits.truncate(len);
            std::borrow::Cow::Owned(bits)
        }
    }

    /// Share of bits set, `|S| / m`.
    pub fn fill_ratio(&self) -> f64 {
        self.ones() as f64 / self.params.bits as f64
    }

    /// The union of two compatible filters as a new filter.
    pub fn union(&self, other: &Self) -> Result<Self, FilterError> {
        let mut u = self.clone();
        u.merge(other)?;
        Ok(u)
    }
}

impl Clone for GBloom {
    fn clone(&self) -> Self {
        Self {
            params: self.params,
            words: self.words.clone(),
            ones: AtomicU64::new(self.ones.load(Ordering::Relaxed)),
            pending: self.pending.clone(),
        }
    }
}

impl PartialEq for GBloom {
    fn eq(&self, other: &Self) -> bool {
        self.params == other.params && self.words == other.words
    }
}
impl Eq for GBloom {}

impl fmt::Debug for GBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GBloom")
            .field("params", &self.params)
            .field("ones", &self.ones())
            .finish()
    }
}

impl Lattice for GBloom {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("bloom", &self.params, &other.params)?;
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= *b;
        }
        *self.ones.get_mut() = UNKNOWN;
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self
                .words
                .iter()
                .zip(&other.words)
                .all(|(a, b)| a & !b == 0)
    }
}

impl Membership for GBloom {
    #[inline]
    fn contains(&self, item: &[u8]) -> bool {
        self.contains_hash(self.hash(item))
    }

    #[inline]
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.set_hash(self.hash(item));
        Ok(())
    }

    /// Eq. 3.20, `-(m/k) ln(1 - |S|/m)`; a saturated filter reports the value at `|S| = m - 1`.
    fn cardinality(&self) -> f64 {
        let m = self.params.bits as f64;
        let x = (self.ones() as f64).min(m - 1.0).max(0.0);
        -(m / self.params.hashes as f64) * (1.0 - x / m).ln()
    }

    fn capacity(&self) -> u64 {
        self.params.capacity
    }

    fn load_factor(&self) -> f64 {
        self.cardinality() / self.params.capacity as f64
    }

    /// Eq. 3.1 with the Eq. 3.20 estimate of `Σn`, which simplifies to `(|S|/m)^k`.
    fn estimated_fpr(&self) -> f64 {
        self.fill_ratio().powi(self.params.hashes as i32)
    }
}

impl DeltaState for GBloom {
    type Delta = BloomDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(Vec::new);
    }

    fn take_delta(&mut self) -> Option<BloomDelta> {
        let pending = self.pending.as_mut()?;
        if pending.is_empty() {
            return None;
        }
        let mut bits = std::mem::take(pending);
        bits.sort_unstable();
        bits.dedup();
        Some(BloomDelta { bits })
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, Vec::len)
    }

    fn check_delta(&self, delta: &BloomDelta) -> Result<(), FilterError> {
        check_bloom_delta(&self.params, delta)
    }

    fn merge_delta(&mut self, delta: &BloomDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for &idx in &delta.bits {
            self.words[(idx >> 6) as usize] |= 1 << (idx & 63);
        }
        *self.ones.get_mut() = UNKNOWN;
        Ok(())
    }
}

/// Whether a delta fits a filter with these parameters (without needing the filter).
pub(crate) fn check_bloom_delta(
    params: &BloomParams,
    delta: &BloomDelta,
) -> Result<(), FilterError> {
    match delta.bits.iter().find(|&&i| i >= params.bits) {
        Some(bad) => Err(FilterError::malformed(format!(
            "delta bit {bad} out of range"
        ))),
        None => Ok(()),
    }
}

impl CheckRemote for GBloom {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &BloomDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

/// Serialized form: the parameters and the bit array as one byte string.
#[derive(Serialize, Deserialize)]
struct GBloomRepr {
    params: BloomParams,
    #[serde(with = "serde_bytes")]
    bits: Vec<u8>,
}

/// [`GBloomRepr`] borrowing the bits, so that encoding a large filter does not copy them first.
#[derive(Serialize)]
struct GBloomReprRef<'a> {
    params: BloomParams,
    bits: &'a serde_bytes::Bytes,
}

impl Serialize for GBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        GBloomReprRef {
            params: self.params,
            bits: serde_bytes::Bytes::new(&self.bit_bytes()),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for GBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = GBloomRepr::deserialize(d)?;
        GBloom::try_from(repr).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<GBloomRepr> for GBloom {
    type Error = FilterError;
    fn try_from(repr: GBloomRepr) -> Result<Self, FilterError> {
        let params = repr.params.validated()?;
        let expected = params.bits.div_ceil(8);
        if repr.bits.len() as u64 != expected {
            return Err(FilterError::malformed(format!(
                "bloom bit array has {} bytes, parameters say {expected}",
                repr.bits.len()
            )));
        }
        let mut f = GBloom::from_valid(params);
        for (word, chunk) in f.words.iter_mut().zip(repr.bits.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_le_bytes(b);
        }
        let tail = params.bits % 64;
        if tail != 0 && f.words.last().is_some_and(|w| w >> tail != 0) {
            return Err(FilterError::malformed(
                "bits set past the end of the bloom bit array",
            ));
        }
        *f.ones.get_mut() = UNKNOWN;
        Ok(f)
    }
}
