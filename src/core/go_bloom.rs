//! `go_bloom`: the Bloom filter of Go's `bits-and-blooms/bloom` (v3), bit for bit: its
//! hashing, its `m` and `k`, and its serialized forms (`WriteTo`/`ReadFrom` and
//! `MarshalJSON`). A filter a Go service built loads here and answers as Go's `Test` does;
//! one built here loads in Go. Like `g_bloom` it is a grow-only CRDT (merge is the OR of
//! equal-size bit sets), so a replica can merge the filters of many Go services and
//! replicate the union.
//!
//! Hashing, as the library does it (`baseHashes`, `location`): four 64-bit values `h`, the
//! two halves of MurmurHash3 x64-128 (seed 0) of the item and the two of the item with a
//! byte `1` appended; probe `i` of `k` is `h[i % 2] + i·h[2 + ((i + i % 2) % 4) / 2] mod m`.
//! Golden vectors written by the Go library itself pin both (`tests/golden.rs`).
//!
//! The binary form is the library's `WriteTo` (`ReadFrom` reads it): `m`, `k` and the bit
//! set's length as big-endian `u64`, then the bit set's words, big-endian (the concurrent
//! Bloom filter specification says little-endian; the library, which is what Go services
//! run, writes big-endian). The JSON form is `{"m":…,"k":…,"b":"…"}` with `b` the bit set's
//! binary form in URL-safe base64.

use std::fmt;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use super::bloom::{bloom_cardinality, bloom_estimated_fpr, check_bloom_delta, take_bloom_delta};
use super::delta::{BloomDelta, CheckRemote, DeltaState};
use super::error::FilterError;
use super::huge_pages;
use super::lattice::{Lattice, Membership};
use super::params::{BloomParams, MAX_FILTER_BYTES, check_capacity, check_fpr, check_memory};
use super::prefetch::{BITS_AHEAD, prefetch};

const UNKNOWN: u64 = u64::MAX;

/// Version of the hashing in the parameter digest: the library's, which never changes (Go
/// services depend on it), so only a change of this crate's reading of it would bump this.
const GO_HASH_VERSION: u32 = 1;

/// A `go_bloom` filter's parameters: the library's `m` and `k`, nothing else (it has no seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GoBloomParams {
    /// Bits `m`.
    pub bits: u64,
    /// Hash functions `k`.
    pub hashes: u32,
}

impl GoBloomParams {
    /// Most hash functions accepted. The library takes any `k`; `EstimateParameters` gives
    /// `k = ⌈log2(1/p)⌉`, 50 at `p = 1e-15`. Bounded so that a forged header (a few bytes)
    /// cannot make every add and lookup loop for ever.
    pub const MAX_HASHES: u32 = 256;

    /// The library's `EstimateParameters(n, p)`: `m = ⌈-n ln p / (ln 2)²⌉`,
    /// `k = ⌈ln 2 · m / n⌉`, computed in the same order so that the same `m` and `k` come out
    /// (checked against the library's own answers in `tests/golden.rs`).
    ///
    /// ```
    /// let p = crpf::GoBloomParams::estimate(10_000, 0.01).unwrap();
    /// assert_eq!((p.bits, p.hashes), (95_851, 7));
    /// ```
    pub fn estimate(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        check_capacity(capacity)?;
        check_fpr(fpr)?;
        let n = capacity as f64;
        let ln2 = 2f64.ln();
        let m = (-n * fpr.ln() / (ln2 * ln2)).ceil();
        let k = (ln2 * m / n).ceil();
        Self {
            bits: m as u64,
            hashes: k as u32,
        }
        .validated()
    }

    /// Checks the parameters; every constructor and decoder goes through here.
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.bits == 0 {
            return Err(FilterError::invalid("bits", "must be at least 1"));
        }
        check_memory(self.memory_bytes())?;
        if self.hashes == 0 || self.hashes > Self::MAX_HASHES {
            return Err(FilterError::invalid(
                "hashes",
                format!("{} is not in 1..={}", self.hashes, Self::MAX_HASHES),
            ));
        }
        Ok(self)
    }

    /// Bytes the bit array takes (whole 64-bit words, as Go's bit set keeps them).
    pub fn memory_bytes(&self) -> u64 {
        self.bits.div_ceil(64).saturating_mul(8)
    }

    /// The elements at which `k` is optimal for `m`, `m ln 2 / k` (at least 1): the library
    /// keeps no capacity, so a filter read from its format has only this one.
    pub fn capacity(&self) -> u64 {
        ((self.bits as f64 * std::f64::consts::LN_2 / self.hashes as f64).round() as u64).max(1)
    }

    /// A stable digest of `m`, `k` and the hashing: replicas merge only equal digests.
    pub fn digest(&self) -> u64 {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(b"go_bloom");
        b.extend_from_slice(&GO_HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.bits.to_le_bytes());
        b.extend_from_slice(&self.hashes.to_le_bytes());
        xxh3_64(&b)
    }

    /// The same `m` and `k` as [`BloomParams`], for the estimators the Bloom kinds share.
    fn as_bloom(&self) -> BloomParams {
        BloomParams {
            bits: self.bits,
            hashes: self.hashes,
            seed: 0,
            capacity: self.capacity(),
        }
    }

    fn describe(&self) -> String {
        format!("m = {}, k = {}", self.bits, self.hashes)
    }
}

/// Why bytes or JSON in the library's format did not load. Nothing is loaded then.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GoFormatError {
    /// Shorter or longer than its header says.
    #[error("bits-and-blooms filter of {len} bytes, where its header says {expected}")]
    Length {
        /// Bytes given.
        len: u64,
        /// Bytes the header's `m` calls for.
        expected: u64,
    },
    /// The bit set's length is not `m`.
    #[error("bits-and-blooms bit set of {length} bits in a filter of m = {bits}")]
    BitSetLength {
        /// The bit set's length.
        length: u64,
        /// The filter's `m`.
        bits: u64,
    },
    /// A bit at or past `m` is set: no add of the library sets one.
    #[error("bits-and-blooms bit set has bits set past m = {bits}")]
    BitsPastEnd {
        /// The filter's `m`.
        bits: u64,
    },
    /// `m` or `k` no filter can be built from (or larger than crpf accepts).
    #[error("bits-and-blooms parameters: {0}")]
    Params(FilterError),
    /// Not the library's JSON.
    #[error("bits-and-blooms JSON: {0}")]
    Json(String),
}

impl From<GoFormatError> for FilterError {
    fn from(e: GoFormatError) -> Self {
        match e {
            GoFormatError::Params(e) => e,
            other => FilterError::Malformed(other.to_string()),
        }
    }
}

/// A format of the Go library in which filters are imported and exported
/// (`CRPF.IMPORT`/`CRPF.EXPORT`, the request API's `import`/`export`, `crpf inspect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoFormat {
    /// `bits-and-blooms`: the bytes of `WriteTo` / `ReadFrom`.
    Binary,
    /// `bits-and-blooms-json`: what `MarshalJSON` / `UnmarshalJSON` write and read.
    Json,
}

impl GoFormat {
    /// Every format, in the order messages list them.
    pub const ALL: [GoFormat; 2] = [GoFormat::Binary, GoFormat::Json];

    /// Its name in commands and headers.
    pub fn name(self) -> &'static str {
        match self {
            GoFormat::Binary => "bits-and-blooms",
            GoFormat::Json => "bits-and-blooms-json",
        }
    }

    /// The filter in this format.
    pub fn encode(self, f: &GoBloom) -> Vec<u8> {
        match self {
            GoFormat::Binary => f.to_go_bytes(),
            GoFormat::Json => f.to_go_json().into_bytes(),
        }
    }

    /// A filter from this format, whole or not at all.
    pub fn decode(self, bytes: &[u8]) -> Result<GoBloom, GoFormatError> {
        match self {
            GoFormat::Binary => GoBloom::from_go_bytes(bytes),
            GoFormat::Json => GoBloom::from_go_json(bytes),
        }
    }
}

impl fmt::Display for GoFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GoFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        GoFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown format `{s}`: {}",
                    GoFormat::ALL.map(GoFormat::name).join(", ")
                )
            })
    }
}

/// The four base hashes of an item (`baseHashes` of the library).
#[inline]
pub fn go_base_hashes(item: &[u8]) -> [u64; 4] {
    // Reading a slice cannot fail.
    let a = murmur3::murmur3_x64_128(&mut &item[..], 0).unwrap_or_default();
    // The library's `sum256` continues the first hash's state with a virtual byte 1
    // appended, which is the hash of the item followed by that byte.
    let b = murmur3::murmur3_x64_128(&mut item.chain(&[1u8][..]), 0).unwrap_or_default();
    [a as u64, (a >> 64) as u64, b as u64, (b >> 64) as u64]
}

/// Probe `i` before the reduction modulo `m` (`location` of the library).
#[inline(always)]
pub fn go_location(h: &[u64; 4], i: u64) -> u64 {
    h[(i % 2) as usize].wrapping_add(i.wrapping_mul(h[2 + (((i + (i % 2)) % 4) / 2) as usize]))
}

/// A grow-only Bloom filter hashing and serializing as Go's `bits-and-blooms/bloom` does.
///
/// ```
/// use crpf::{GoBloom, Lattice, Membership};
///
/// let mut f = GoBloom::with_capacity(10_000, 0.01)?; // NewWithEstimates(10000, 0.01)
/// f.add(b"apple")?;
/// let bytes = f.to_go_bytes();                        // what WriteTo writes
/// assert_eq!(bytes.len(), 12_008);
/// let back = GoBloom::from_go_bytes(&bytes)?;         // what ReadFrom reads
/// assert!(back.contains(b"apple") && back.equivalent(&f));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub struct GoBloom {
    params: GoBloomParams,
    words: Vec<u64>,
    /// Count of set bits, or `UNKNOWN` after a merge until someone needs it.
    ones: AtomicU64,
    /// Bits set by local adds since the last `take_delta`, while tracking.
    pending: Option<Vec<u64>>,
}

impl GoBloom {
    /// A filter of the library's `NewWithEstimates(capacity, fpr)`.
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Ok(Self::from_valid(GoBloomParams::estimate(capacity, fpr)?))
    }

    /// A filter of the library's `New(m, k)`.
    pub fn new(params: GoBloomParams) -> Result<Self, FilterError> {
        Ok(Self::from_valid(params.validated()?))
    }

    fn from_valid(params: GoBloomParams) -> Self {
        Self {
            params,
            words: huge_pages::zeroed_vec(params.bits.div_ceil(64) as usize),
            ones: AtomicU64::new(0),
            pending: None,
        }
    }

    /// The filter's `m` and `k`.
    pub fn params(&self) -> &GoBloomParams {
        &self.params
    }

    /// The item's `k` bit indexes, in the library's order.
    pub fn locations(&self, item: &[u8]) -> impl Iterator<Item = u64> + use<> {
        let h = go_base_hashes(item);
        let m = self.params.bits;
        (0..u64::from(self.params.hashes)).map(move |i| go_location(&h, i) % m)
    }

    fn contains_hashes(&self, h: &[u64; 4]) -> bool {
        let m = self.params.bits;
        (0..u64::from(self.params.hashes)).all(|i| {
            let idx = go_location(h, i) % m;
            self.words[(idx >> 6) as usize] & (1 << (idx & 63)) != 0
        })
    }

    /// Sets the item's bits; how many were clear.
    fn set_item(&mut self, item: &[u8]) -> u64 {
        let h = go_base_hashes(item);
        let m = self.params.bits;
        let mut newly = 0;
        for i in 0..u64::from(self.params.hashes) {
            let idx = go_location(&h, i) % m;
            let word = &mut self.words[(idx >> 6) as usize];
            let mask = 1u64 << (idx & 63);
            if *word & mask == 0 {
                *word |= mask;
                newly += 1;
                if let Some(p) = &mut self.pending {
                    p.push(idx);
                }
            }
        }
        let ones = self.ones.get_mut();
        if *ones != UNKNOWN {
            *ones += newly;
        }
        newly
    }

    /// Adds the item; whether it was (probably) present before (`TestAndAdd`).
    pub fn test_and_add(&mut self, item: &[u8]) -> bool {
        self.set_item(item) == 0
    }

    /// Number of set bits.
    pub fn ones(&self) -> u64 {
        let cached = self.ones.load(Ordering::Relaxed);
        if cached != UNKNOWN {
            return cached;
        }
        let n = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
        self.ones.store(n, Ordering::Relaxed);
        n
    }

    /// Bytes of [`GoBloom::to_go_bytes`] for these parameters.
    pub fn go_bytes_len(params: &GoBloomParams) -> u64 {
        24 + params.memory_bytes()
    }

    /// The library's `WriteTo` of this filter: `m`, `k`, the bit set's length (`m`), then
    /// its words, all big-endian `u64`.
    pub fn to_go_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::go_bytes_len(&self.params) as usize);
        out.extend_from_slice(&self.params.bits.to_be_bytes());
        out.extend_from_slice(&u64::from(self.params.hashes).to_be_bytes());
        self.write_bit_set(&mut out);
        out
    }

    /// The bit set's own `WriteTo`: its length, then its words.
    fn write_bit_set(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.params.bits.to_be_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_be_bytes());
        }
    }

    /// Reads the library's `WriteTo` bytes (exactly one filter, nothing after it). Damaged
    /// input (truncated, extended, a bit set of another length, bits past `m`, parameters
    /// out of range) is refused whole.
    pub fn from_go_bytes(bytes: &[u8]) -> Result<Self, GoFormatError> {
        let u64_at = |at: usize| -> Option<u64> {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        };
        let (Some(m), Some(k)) = (u64_at(0), u64_at(8)) else {
            return Err(GoFormatError::Length {
                len: bytes.len() as u64,
                expected: 24,
            });
        };
        let params = GoBloomParams {
            bits: m,
            hashes: u32::try_from(k).unwrap_or(u32::MAX),
        }
        .validated()
        .map_err(GoFormatError::Params)?;
        Self::from_bit_set(params, &bytes[16..])
    }

    /// A filter of `params` from its bit set's `WriteTo` bytes.
    fn from_bit_set(params: GoBloomParams, set: &[u8]) -> Result<Self, GoFormatError> {
        let expected = 8 + params.memory_bytes();
        if set.len() as u64 != expected {
            return Err(GoFormatError::Length {
                len: set.len() as u64 + 16,
                expected: expected + 16,
            });
        }
        let length = u64::from_be_bytes(set[..8].try_into().expect("8 bytes"));
        if length != params.bits {
            return Err(GoFormatError::BitSetLength {
                length,
                bits: params.bits,
            });
        }
        let mut f = Self::from_valid(params);
        for (w, b) in f.words.iter_mut().zip(set[8..].chunks_exact(8)) {
            *w = u64::from_be_bytes(b.try_into().expect("8 bytes"));
        }
        let tail = params.bits % 64;
        if tail != 0 && f.words.last().is_some_and(|w| w >> tail != 0) {
            return Err(GoFormatError::BitsPastEnd { bits: params.bits });
        }
        *f.ones.get_mut() = UNKNOWN;
        Ok(f)
    }

    /// The library's `MarshalJSON`: `{"m":…,"k":…,"b":"…"}`, `b` the bit set's `WriteTo`
    /// bytes in URL-safe base64 with padding (the bit set's default).
    pub fn to_go_json(&self) -> String {
        let mut set = Vec::with_capacity(8 + self.params.memory_bytes() as usize);
        self.write_bit_set(&mut set);
        format!(
            r#"{{"m":{},"k":{},"b":"{}"}}"#,
            self.params.bits,
            self.params.hashes,
            base64::engine::general_purpose::URL_SAFE.encode(set)
        )
    }

    /// Reads the library's JSON (what `MarshalJSON` writes, `UnmarshalJSON` reads); refused
    /// whole if damaged, as [`GoBloom::from_go_bytes`].
    pub fn from_go_json(json: &[u8]) -> Result<Self, GoFormatError> {
        #[derive(Deserialize)]
        struct Repr {
            m: u64,
            k: u64,
            b: String,
        }
        let r: Repr =
            serde_json::from_slice(json).map_err(|e| GoFormatError::Json(e.to_string()))?;
        // Within the filter size limit before decoding: the string is already in memory, so
        // this only keeps a forged `m` from failing later and more confusingly.
        if r.b.len() as u64 > MAX_FILTER_BYTES * 2 {
            return Err(GoFormatError::Params(FilterError::TooLarge {
                needed: r.b.len() as u64,
                limit: MAX_FILTER_BYTES,
            }));
        }
        let set = base64::engine::general_purpose::URL_SAFE
            .decode(r.b.as_bytes())
            .map_err(|e| GoFormatError::Json(format!("field b: {e}")))?;
        let params = GoBloomParams {
            bits: r.m,
            hashes: u32::try_from(r.k).unwrap_or(u32::MAX),
        }
        .validated()
        .map_err(GoFormatError::Params)?;
        Self::from_bit_set(params, &set)
    }

    /// Merges a filter read from the library's format into this one (an import): refused,
    /// naming both, if its `m` or `k` differs.
    pub fn merge_import(&mut self, other: &GoBloom) -> Result<(), FilterError> {
        self.check_import(other)?;
        self.merge(other)
    }

    /// What an import of `other` changes, as a delta, ascending: the bits `other` sets that
    /// this filter lacks, or with `whole` every bit `other` sets (its whole footprint, for a
    /// state whose merged bits no saved snapshot holds: see
    /// `crate::replica::core::UnloggedMerges`). An import at `replicated` travels as such a
    /// delta (`crate::replica::core::import`). Refused, naming both, if its `m` or `k` differs.
    pub fn import_delta(&self, other: &GoBloom, whole: bool) -> Result<BloomDelta, FilterError> {
        self.check_import(other)?;
        let mut bits = Vec::new();
        for (w, (&mine, &theirs)) in self.words.iter().zip(&other.words).enumerate() {
            let mut set = if whole { theirs } else { theirs & !mine };
            while set != 0 {
                bits.push(((w as u64) << 6) | u64::from(set.trailing_zeros()));
                set &= set - 1;
            }
        }
        Ok(BloomDelta { bits })
    }

    /// Sets `delta`'s bits as a local update: every one of them joins the pending delta
    /// (while tracking), for the commit pipeline to log and publish. How many were clear.
    pub fn apply_as_local(&mut self, delta: &BloomDelta) -> Result<u64, FilterError> {
        self.check_delta(delta)?;
        let mut newly = 0;
        for &idx in &delta.bits {
            let word = &mut self.words[(idx >> 6) as usize];
            let mask = 1u64 << (idx & 63);
            newly += u64::from(*word & mask == 0);
            *word |= mask;
        }
        if let Some(p) = &mut self.pending {
            p.extend_from_slice(&delta.bits);
        }
        let ones = self.ones.get_mut();
        if *ones != UNKNOWN {
            *ones += newly;
        }
        Ok(newly)
    }

    /// Whether [`GoBloom::merge_import`] takes `other`: the same `m` and `k`, else an error
    /// naming both.
    pub fn check_import(&self, other: &GoBloom) -> Result<(), FilterError> {
        if self.params == other.params {
            return Ok(());
        }
        Err(FilterError::Incompatible(format!(
            "the imported filter has {}, this one {}: nothing merged",
            other.params.describe(),
            self.params.describe()
        )))
    }

    /// The bit array as bytes, little-endian words truncated to `m / 8` rounded up (crpf's own
    /// encoding of the state, as `g_bloom`'s).
    fn bit_bytes(&self) -> Vec<u8> {
        let mut bits: Vec<u8> = Vec::with_capacity(self.words.len() * 8);
        for w in &self.words {
            bits.extend_from_slice(&w.to_le_bytes());
        }
        bits.truncate(self.params.bits.div_ceil(8) as usize);
        bits
    }
}

impl Clone for GoBloom {
    fn clone(&self) -> Self {
        Self {
            params: self.params,
            words: self.words.clone(),
            ones: AtomicU64::new(self.ones.load(Ordering::Relaxed)),
            pending: self.pending.clone(),
        }
    }
}

impl PartialEq for GoBloom {
    fn eq(&self, other: &Self) -> bool {
        self.params == other.params && self.words == other.words
    }
}
impl Eq for GoBloom {}

impl fmt::Debug for GoBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoBloom")
            .field("params", &self.params)
            .field("ones", &self.ones())
            .finish()
    }
}

impl Lattice for GoBloom {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("go_bloom", &self.params, &other.params)?;
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

impl Membership for GoBloom {
    fn contains(&self, item: &[u8]) -> bool {
        self.contains_hashes(&go_base_hashes(item))
    }

    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.set_item(item);
        Ok(())
    }

    fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError> {
        Ok(self.set_item(item) > 0)
    }

    fn cardinality(&self) -> f64 {
        bloom_cardinality(&self.params.as_bloom(), self.ones())
    }

    fn capacity(&self) -> u64 {
        self.params.capacity()
    }

    fn load_factor(&self) -> f64 {
        self.cardinality() / self.params.capacity() as f64
    }

    fn estimated_fpr(&self) -> f64 {
        bloom_estimated_fpr(&self.params.as_bloom(), self.ones())
    }
}

impl DeltaState for GoBloom {
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

    /// All `k` bits of the item.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        let h = go_base_hashes(item);
        if !self.contains_hashes(&h) {
            return false;
        }
        let Some(pending) = &mut self.pending else {
            return false;
        };
        let m = self.params.bits;
        pending.extend((0..u64::from(self.params.hashes)).map(|i| go_location(&h, i) % m));
        true
    }

    fn check_delta(&self, delta: &BloomDelta) -> Result<(), FilterError> {
        check_bloom_delta(&self.params.as_bloom(), delta)
    }

    fn merge_delta(&mut self, delta: &BloomDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for (n, &idx) in delta.bits.iter().enumerate() {
            if let Some(&ahead) = delta.bits.get(n + BITS_AHEAD) {
                prefetch(&self.words[(ahead >> 6) as usize]);
            }
            self.words[(idx >> 6) as usize] |= 1 << (idx & 63);
        }
        *self.ones.get_mut() = UNKNOWN;
        Ok(())
    }
}

impl CheckRemote for GoBloom {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &BloomDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

/// crpf's encoding of the state (snapshots, the wire): the parameters and the bit array as
/// one byte string, as `g_bloom`'s.
#[derive(Serialize, Deserialize)]
struct GoBloomRepr {
    params: GoBloomParams,
    #[serde(with = "serde_bytes")]
    bits: Vec<u8>,
}

impl Serialize for GoBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        GoBloomRepr {
            params: self.params,
            bits: self.bit_bytes(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for GoBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = GoBloomRepr::deserialize(d)?;
        let params = repr.params.validated().map_err(serde::de::Error::custom)?;
        let expected = params.bits.div_ceil(8);
        if repr.bits.len() as u64 != expected {
            return Err(serde::de::Error::custom(format!(
                "go_bloom bit array has {} bytes, parameters say {expected}",
                repr.bits.len()
            )));
        }
        let mut f = GoBloom::from_valid(params);
        for (word, chunk) in f.words.iter_mut().zip(repr.bits.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_le_bytes(b);
        }
        let tail = params.bits % 64;
        if tail != 0 && f.words.last().is_some_and(|w| w >> tail != 0) {
            return Err(serde::de::Error::custom(
                "bits set past the end of the go_bloom bit array",
            ));
        }
        *f.ones.get_mut() = UNKNOWN;
        Ok(f)
    }
}

/// The `go_bloom` kind of a replica.
impl crate::core::kind::ReplicatedFilter for GoBloom {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::GoBloom;

    /// `m` and `k` as the spec names them ([`crate::FilterSpec::shape`], what an import
    /// creates), else the library's estimate for its capacity and error rate.
    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        match spec.shape.as_deref() {
            Some(shape) => GoBloom::new(GoBloomParams {
                bits: shape.bits,
                hashes: shape.hashes,
            }),
            None => GoBloom::with_capacity(spec.capacity, spec.fpr),
        }
    }

    fn params_digest(&self) -> u64 {
        self.params.digest()
    }

    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        for w in &self.words {
            h.update(&w.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_bytes_load_nothing() {
        let mut f = GoBloom::new(GoBloomParams {
            bits: 100,
            hashes: 3,
        })
        .unwrap();
        f.add(b"x").unwrap();
        let good = f.to_go_bytes();
        assert_eq!(GoBloom::from_go_bytes(&good).unwrap(), f);
        for cut in 0..good.len() {
            assert!(GoBloom::from_go_bytes(&good[..cut]).is_err(), "{cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(GoBloom::from_go_bytes(&longer).is_err());
        let mut past = good.clone();
        let last_word = past.len() - 8;
        past[last_word] |= 0x80; // bit 127 of a 100-bit set: words are big-endian
        assert_eq!(
            GoBloom::from_go_bytes(&past).unwrap_err(),
            GoFormatError::BitsPastEnd { bits: 100 }
        );
        let mut length = good.clone();
        length[23] = 99;
        assert!(matches!(
            GoBloom::from_go_bytes(&length),
            Err(GoFormatError::BitSetLength { length: 99, .. })
        ));
        let mut k0 = good;
        k0[15] = 0;
        assert!(matches!(
            GoBloom::from_go_bytes(&k0),
            Err(GoFormatError::Params(_))
        ));
        // A forged m of petabytes is refused before anything is allocated.
        let mut huge = vec![0xffu8; 8];
        huge.extend(3u64.to_be_bytes());
        huge.extend(u64::MAX.to_be_bytes());
        assert!(matches!(
            GoBloom::from_go_bytes(&huge),
            Err(GoFormatError::Params(FilterError::TooLarge { .. }))
        ));
    }

    #[test]
    fn json_round_trips_and_damaged_json_loads_nothing() {
        let mut f = GoBloom::with_capacity(1000, 0.01).unwrap();
        for i in 0..500u32 {
            f.add(&i.to_le_bytes()).unwrap();
        }
        let json = f.to_go_json();
        assert_eq!(GoBloom::from_go_json(json.as_bytes()).unwrap(), f);
        assert!(GoBloom::from_go_json(&json.as_bytes()[..json.len() - 3]).is_err());
        let bad_b64 = json.replacen("\"b\":\"", "\"b\":\"*", 1);
        assert!(GoBloom::from_go_json(bad_b64.as_bytes()).is_err());
        let other_m = json.replacen("\"m\":", "\"m\":1", 1);
        assert!(GoBloom::from_go_json(other_m.as_bytes()).is_err());
    }

    #[test]
    fn an_import_as_a_delta_records_what_it_sets_and_joins_as_a_merge() {
        let mut mine = GoBloom::with_capacity(10_000, 0.01).unwrap();
        let mut theirs = GoBloom::with_capacity(10_000, 0.01).unwrap();
        for i in 0..300u32 {
            mine.add(format!("mine-{i}").as_bytes()).unwrap();
            theirs.add(format!("theirs-{i}").as_bytes()).unwrap();
        }
        theirs.add(b"mine-0").unwrap();
        let mut merged = mine.clone();
        merged.merge(&theirs).unwrap();
        mine.track_deltas(true);
        let new = mine.import_delta(&theirs, false).unwrap();
        let whole = mine.import_delta(&theirs, true).unwrap();
        // The new bits are those `theirs` sets and `mine` lacks; the whole footprint is every
        // bit `theirs` sets, the new ones among them.
        assert_eq!(whole.bits.len() as u64, theirs.ones());
        assert!(new.bits.len() < whole.bits.len());
        assert!(new.bits.iter().all(|b| whole.bits.contains(b)));
        let set = mine.apply_as_local(&new).unwrap();
        assert_eq!(set, new.bits.len() as u64);
        assert_eq!(
            mine, merged,
            "applied as a delta, an import joins as a merge does"
        );
        assert_eq!(mine.ones(), merged.ones());
        // Its bits are in the pending delta, which a peer joins to the same state.
        let pending = mine.take_delta().unwrap();
        assert_eq!(pending.bits, new.bits);
        // Nothing left to import; other `m`/`k` refused.
        assert!(mine.import_delta(&theirs, false).unwrap().bits.is_empty());
        let other = GoBloom::with_capacity(1_000, 0.001).unwrap();
        assert!(mine.import_delta(&other, false).is_err());
    }

    #[test]
    fn an_import_of_other_m_or_k_names_both() {
        let mut mine = GoBloom::with_capacity(10_000, 0.01).unwrap();
        let theirs = GoBloom::with_capacity(1_000, 0.001).unwrap();
        let before = mine.clone();
        let err = mine.merge_import(&theirs).unwrap_err().to_string();
        assert!(
            err.contains("m = 14378, k = 10") && err.contains("m = 95851, k = 7"),
            "{err}"
        );
        assert_eq!(mine, before);
    }
}
