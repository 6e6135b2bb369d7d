//! The grow-only Bloom filter as a replica holds it: the bits of an [`AtomicGBloom`], which
//! [`BloomReader`]s query without any lock while the owner adds and merges.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::atomic_bloom::AtomicGBloom;
use super::bloom::{
    GBloom, bloom_cardinality, bloom_estimated_fpr, check_bloom_delta, encoding_prefix,
    take_bloom_delta,
};
use super::delta::{BloomDelta, CheckRemote, DeltaState};
use super::error::FilterError;
use super::hash::{BloomProbes, hash_item};
use super::lattice::{Lattice, Membership};
use super::params::BloomParams;
use super::prefetch::{BITS_AHEAD, prefetch};

/// A [`GBloom`] whose bits can be read by other threads while its owner updates it: the
/// registry's `g_bloom` kind. The owner (`&mut self`) adds, merges and records deltas exactly
/// as a `GBloom` does, with atomic ORs; [`SharedGBloom::reader`] hands out a [`BloomReader`]
/// that answers `contains` from the same bits, wait-free, without the owner's lock and
/// without waiting for it.
///
/// It has a `GBloom`'s state, laws and encoding (the bytes are interchangeable); a clone is a
/// copy with its own bits (readers of the original do not see the copy).
///
/// ```
/// use crpf::{Lattice, Membership, SharedGBloom};
///
/// let mut f = SharedGBloom::with_capacity(1000, 0.01)?;
/// let reader = f.reader();
/// let t = std::thread::spawn(move || {
///     // Queries from another thread, while the owner keeps adding.
///     (0..1000u32).filter(|i| reader.contains(&i.to_le_bytes())).count()
/// });
/// for i in 0..1000u32 {
///     f.add(&i.to_le_bytes())?;
/// }
/// assert!(t.join().unwrap() <= 1000);
/// assert!(f.reader().contains(&999u32.to_le_bytes()));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub struct SharedGBloom {
    bits: Arc<AtomicGBloom>,
    /// Indexes of bits newly set by local adds since the last `take_delta`, while tracking.
    pending: Option<Vec<u64>>,
    /// How many bits are set. The owner is the only writer, so it counts what it sets instead
    /// of scanning the words for every figure (a scan of a large filter took 6% of a busy
    /// replica's CPU, from the gauges alone).
    ones: u64,
}

/// Queries a [`SharedGBloom`]'s bits from any thread, without a lock: an add that
/// happened-before the query is contained (the contract of [`AtomicGBloom`]). It cannot
/// change the filter.
#[derive(Clone)]
pub struct BloomReader(Arc<AtomicGBloom>);

impl BloomReader {
    /// Whether the item may have been added (see [`AtomicGBloom::contains`]).
    #[inline]
    pub fn contains(&self, item: &[u8]) -> bool {
        self.0.contains(item)
    }

    /// Starts loading the item's words into the cache (see [`AtomicGBloom::prefetch`]).
    #[inline]
    pub fn prefetch(&self, item: &[u8]) {
        self.0.prefetch(item)
    }
}

impl fmt::Debug for BloomReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BloomReader").field(self.0.params()).finish()
    }
}

impl SharedGBloom {
    /// An empty filter with validated parameters.
    pub fn new(params: BloomParams) -> Result<Self, FilterError> {
        Ok(AtomicGBloom::new(params)?.into())
    }

    /// A filter for `capacity` elements at false positive rate `fpr`, as
    /// [`GBloom::with_capacity`].
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::new(BloomParams::with_capacity(capacity, fpr)?)
    }

    /// The parameters.
    pub fn params(&self) -> &BloomParams {
        self.bits.params()
    }

    /// The full state's encoding: its prefix (the parameters and the bit array's header),
    /// and its whole length (the prefix, then the bit array's bytes).
    fn encoding_layout(&self) -> (Vec<u8>, u64) {
        let prefix = encoding_prefix(self.params());
        let total = prefix.len() as u64 + self.params().bits.div_ceil(8);
        (prefix, total)
    }

    /// A reader of these bits for other threads.
    pub fn reader(&self) -> BloomReader {
        BloomReader(self.bits.clone())
    }

    /// The current bits as a [`GBloom`].
    pub fn snapshot(&self) -> GBloom {
        self.bits.snapshot()
    }

    /// How many bits are set.
    pub fn ones(&self) -> u64 {
        self.ones
    }

    /// ORs `words` (another state's, same parameters) into these bits.
    fn or_words(&mut self, words: impl Iterator<Item = u64>) {
        for (w, o) in self.bits.words().iter().zip(words) {
            if o != 0 {
                let old = or_word(w, o);
                self.ones += u64::from((old | o).count_ones() - old.count_ones());
            }
        }
    }

    /// ORs `bytes`, the bit array's little-endian bytes from byte `at` on (in range), into
    /// the bits: whole words where the bytes cover them, bytes at the ends.
    fn or_bytes(&mut self, at: usize, bytes: &[u8]) {
        let words = self.bits.words();
        let mut ones = 0u64;
        let mut or_at = |word: usize, bits: u64| {
            if bits != 0 {
                let old = or_word(&words[word], bits);
                ones += u64::from((old | bits).count_ones() - old.count_ones());
            }
        };
        let (mut pos, mut rest) = (at, bytes);
        while !rest.is_empty() {
            let (word, shift) = (pos / 8, pos % 8);
            let take = (8 - shift).min(rest.len());
            let mut b = [0u8; 8];
            b[shift..shift + take].copy_from_slice(&rest[..take]);
            or_at(word, u64::from_le_bytes(b));
            pos += take;
            rest = &rest[take..];
        }
        self.ones += ones;
    }

    /// Sets the item's bits; `newly_set` gets the index of each bit that was clear. Every word
    /// is loaded first, so that the cache misses of a large filter overlap.
    fn set_bits(&mut self, item: &[u8], mut newly_set: impl FnMut(u64)) {
        let p = *self.params();
        let mut probes = BloomProbes::new(hash_item(item, p.seed), p.bits);
        let words = self.bits.words();
        let mut probed = [0u64; 64];
        let k = (p.hashes as usize).min(64);
        let mut warm = 0u64;
        for slot in probed.iter_mut().take(k) {
            let idx = probes.next_index();
            *slot = idx;
            warm ^= words[(idx >> 6) as usize].load(Ordering::Relaxed);
        }
        std::hint::black_box(warm);
        for &idx in &probed[..k] {
            let mask = 1 << (idx & 63);
            if or_word(&words[(idx >> 6) as usize], mask) & mask == 0 {
                self.ones += 1;
                newly_set(idx);
            }
        }
    }
}

/// ORs `bits` into a word and answers its value before. A load and a store, not an atomic
/// read-modify-write (a locked instruction, several times slower): the owner (`&mut
/// SharedGBloom`) is the only writer, [`BloomReader`]s only load, and both are atomic, so
/// there is no race and a reader sees the word before or after, never torn.
#[inline]
fn or_word(w: &std::sync::atomic::AtomicU64, bits: u64) -> u64 {
    let old = w.load(Ordering::Relaxed);
    if old | bits != old {
        w.store(old | bits, Ordering::Relaxed);
    }
    old
}

impl From<AtomicGBloom> for SharedGBloom {
    fn from(bits: AtomicGBloom) -> Self {
        SharedGBloom {
            ones: bits.ones(),
            bits: Arc::new(bits),
            pending: None,
        }
    }
}

impl From<GBloom> for SharedGBloom {
    fn from(g: GBloom) -> Self {
        AtomicGBloom::from(g).into()
    }
}

/// A copy with its own bits and no pending delta (as a `GBloom` clone's pending delta would
/// be the original's, a copy's is not meant to be published).
impl Clone for SharedGBloom {
    fn clone(&self) -> Self {
        SharedGBloom {
            bits: Arc::new(AtomicGBloom::clone(&self.bits)),
            pending: self.pending.clone(),
            ones: self.ones,
        }
    }
}

impl fmt::Debug for SharedGBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedGBloom")
            .field("bits", &self.bits)
            .finish()
    }
}

impl Lattice for SharedGBloom {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("bloom", self.params(), other.params())?;
        self.or_words(other.bits.words().iter().map(|w| w.load(Ordering::Relaxed)));
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params() == other.params()
            && (self.bits.words().iter())
                .zip(other.bits.words())
                .all(|(a, b)| {
                    let a = a.load(Ordering::Relaxed);
                    a & b.load(Ordering::Relaxed) == a
                })
    }
}

impl Membership for SharedGBloom {
    fn contains(&self, item: &[u8]) -> bool {
        self.bits.contains(item)
    }

    /// Sets the item's bits with atomic ORs, recording the newly set ones while tracking.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        match self.pending.take() {
            None => self.set_bits(item, |_| {}),
            Some(mut pending) => {
                self.set_bits(item, |idx| pending.push(idx));
                self.pending = Some(pending);
            }
        }
        Ok(())
    }

    fn cardinality(&self) -> f64 {
        bloom_cardinality(self.params(), self.ones)
    }

    fn capacity(&self) -> u64 {
        self.params().capacity
    }

    fn load_factor(&self) -> f64 {
        self.cardinality() / self.params().capacity as f64
    }

    fn estimated_fpr(&self) -> f64 {
        bloom_estimated_fpr(self.params(), self.ones)
    }
}

impl DeltaState for SharedGBloom {
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
        if !self.bits.contains(item) {
            return false;
        }
        let Some(pending) = &mut self.pending else {
            return false;
        };
        let p = *self.bits.params();
        let mut probes = BloomProbes::new(hash_item(item, p.seed), p.bits);
        pending.extend((0..p.hashes).map(|_| probes.next_index()));
        true
    }

    fn check_delta(&self, delta: &BloomDelta) -> Result<(), FilterError> {
        check_bloom_delta(self.params(), delta)
    }

    fn merge_delta(&mut self, delta: &BloomDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        let words = self.bits.words();
        for (n, &idx) in delta.bits.iter().enumerate() {
            // A delta's bits are scattered over the filter: overlap their cache misses.
            if let Some(&ahead) = delta.bits.get(n + BITS_AHEAD) {
                prefetch(&words[(ahead >> 6) as usize]);
            }
            let mask = 1 << (idx & 63);
            if or_word(&words[(idx >> 6) as usize], mask) & mask == 0 {
                self.ones += 1;
            }
        }
        Ok(())
    }
}

impl CheckRemote for SharedGBloom {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }

    fn check_remote_delta(&self, _delta: &BloomDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

/// Exactly a [`GBloom`]'s encoding.
impl Serialize for SharedGBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.bits.serialize(s)
    }
}

/// Decoded and validated as a [`GBloom`].
impl<'de> Deserialize<'de> for SharedGBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        GBloom::deserialize(d).map(Self::from)
    }
}

/// The `g_bloom` kind of a replica.
impl crate::core::kind::ReplicatedFilter for SharedGBloom {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::GBloom;

    const MERGES_STATE_PIECES: bool = true;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        Self::new(BloomParams::with_capacity(spec.capacity, spec.fpr)?.with_seed(spec.seed()))
    }

    /// The same bytes as serializing (a `GBloom`'s encoding), written from the shared words
    /// as they are read: serializing goes through a snapshot of the words, which doubled
    /// what a push of a large filter held.
    fn encode_state_into(&self, out: &mut Vec<u8>) {
        let array_len = self.params().bits.div_ceil(8) as usize;
        let prefix = encoding_prefix(self.params());
        out.reserve(prefix.len() + array_len);
        out.extend_from_slice(&prefix);
        let start = out.len();
        for w in self.bits.words() {
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        out.truncate(start + array_len);
    }

    fn encoded_state_len(&self) -> Option<u64> {
        Some(self.encoding_layout().1)
    }

    /// The same bytes as [`encode_state_into`](crate::core::kind::ReplicatedFilter::encode_state_into)'s at `offset..`, read
    /// from the shared words one at a time.
    fn encode_state_piece(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        let (prefix, total) = self.encoding_layout();
        let start = prefix.len() as u64;
        if offset > total {
            return Err(FilterError::malformed("a piece past the end of the state"));
        }
        let end = offset.saturating_add(len as u64).min(total);
        out.reserve((end - offset) as usize);
        if offset < start {
            out.extend_from_slice(&prefix[offset as usize..end.min(start) as usize]);
        }
        // Bytes `from..to` of the bit array, word by word.
        let (from, to) = (offset.max(start) - start, end.max(start) - start);
        let words = self.bits.words();
        let mut at = from;
        while at < to {
            let word = words[(at / 8) as usize]
                .load(Ordering::Relaxed)
                .to_le_bytes();
            let (skip, take) = ((at % 8) as usize, (to - at).min(8 - at % 8) as usize);
            out.extend_from_slice(&word[skip..skip + take]);
            at += take as u64;
        }
        Ok(())
    }

    /// The piece's bytes within the encoding's prefix must be this filter's (its parameters
    /// and the bit array's header); those within the bit array are ORed in.
    fn merge_state_piece(
        &mut self,
        total_len: u64,
        offset: u64,
        piece: &[u8],
    ) -> Result<(), FilterError> {
        let (prefix, total) = self.encoding_layout();
        let start = prefix.len() as u64;
        if total_len != total {
            return Err(FilterError::malformed(format!(
                "a state of {total_len} bytes, where these parameters encode in {total}"
            )));
        }
        let end = offset
            .checked_add(piece.len() as u64)
            .filter(|&end| end <= total_len)
            .ok_or_else(|| FilterError::malformed("a piece past the end of its state"))?;
        let in_prefix = (end.min(start)).saturating_sub(offset) as usize;
        if in_prefix > 0
            && piece[..in_prefix] != prefix[offset as usize..offset as usize + in_prefix]
        {
            return Err(FilterError::malformed(
                "a state's parameters or layout differ from this filter's",
            ));
        }
        let bits = &piece[in_prefix..];
        let at = (offset.max(start) - start) as usize;
        // No bit past the last: the decoder refuses a state with one, and so does this.
        let tail = self.params().bits % 8;
        if end == total_len && tail != 0 && bits.last().is_some_and(|&last| last >> tail != 0) {
            return Err(FilterError::malformed("bits set past the bit array's end"));
        }
        self.or_bytes(at, bits);
        Ok(())
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    /// The bits, as a `GBloom`'s digest feeds them (equal states, equal digests).
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        // Through a buffer of many words: one `update` per word cost a busy replica 6% of
        // its thread at every digest of a 36 MB filter.
        const WORDS: usize = 512;
        let len = self.params().bits.div_ceil(8) as usize;
        let mut buf = [0u8; WORDS * 8];
        let mut fed = 0;
        for chunk in self.bits.words().chunks(WORDS) {
            for (w, out) in chunk.iter().zip(buf.chunks_exact_mut(8)) {
                out.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            let take = (len - fed).min(chunk.len() * 8);
            h.update(&buf[..take]);
            fed += take;
        }
    }

    fn shared_reader(&self) -> Option<BloomReader> {
        Some(self.reader())
    }

    fn prefetch(&self, item: &[u8]) {
        self.bits.prefetch(item)
    }

    fn prefetch_ahead(&self) -> usize {
        crate::core::prefetch::BLOOM_ITEMS_AHEAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kind::ReplicatedFilter;

    fn params() -> BloomParams {
        BloomParams::with_capacity(4000, 0.01).unwrap().with_seed(7)
    }

    #[test]
    fn same_bits_deltas_encoding_and_digest_as_a_gbloom() {
        let mut s = SharedGBloom::new(params()).unwrap();
        let mut g = GBloom::new(params()).unwrap();
        s.track_deltas(true);
        g.track_deltas(true);
        for i in 0..3000u32 {
            s.add(&i.to_le_bytes()).unwrap();
            g.add(&i.to_le_bytes()).unwrap();
        }
        assert_eq!(s.snapshot(), g);
        assert_eq!(s.take_delta(), g.take_delta());
        assert_eq!(
            serde_cbor::to_vec(&s).unwrap(),
            serde_cbor::to_vec(&g).unwrap()
        );
        let (mut hs, mut hg) = (
            xxhash_rust::xxh3::Xxh3::new(),
            xxhash_rust::xxh3::Xxh3::new(),
        );
        s.digest_state(&mut hs);
        g.digest_state(&mut hg);
        assert_eq!(hs.digest(), hg.digest());
        assert_eq!(s.cardinality(), g.cardinality());
    }

    #[test]
    fn a_delta_names_each_newly_set_bit_once_and_rebuilds_the_state() {
        // A small filter, so that probes of one item and of different items collide often.
        let p = BloomParams {
            bits: 301,
            hashes: 9,
            seed: 3,
            capacity: 30,
        };
        let mut s = SharedGBloom::new(p).unwrap();
        let mut g = GBloom::new(p).unwrap();
        s.add(b"before").unwrap();
        g.add(b"before").unwrap();
        let (s0, g0) = (s.clone(), g.clone());
        s.track_deltas(true);
        g.track_deltas(true);
        for i in 0..60u32 {
            s.add(&i.to_le_bytes()).unwrap();
            g.add(&i.to_le_bytes()).unwrap();
        }
        let (ds, dg) = (s.take_delta().unwrap(), g.take_delta().unwrap());
        for (delta, before, after) in [(&ds, s0.ones(), s.ones()), (&dg, g0.ones(), g.ones())] {
            let mut unique = delta.bits.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), delta.bits.len(), "a bit named twice");
            assert_eq!(delta.bits.len() as u64, after - before);
        }
        let (mut rs, mut rg) = (s0, g0);
        rs.merge_delta(&ds).unwrap();
        rg.merge_delta(&dg).unwrap();
        assert!(rs.le(&s) && s.le(&rs));
        assert!(rg.le(&g) && g.le(&rg));
    }

    #[test]
    fn merge_and_le_are_a_gbloom_s_and_a_clone_has_its_own_bits() {
        let mut a = SharedGBloom::new(params()).unwrap();
        let mut b = SharedGBloom::new(params()).unwrap();
        a.add(b"a").unwrap();
        b.add(b"b").unwrap();
        let copy = a.clone();
        let reader = a.reader();
        a.merge(&b).unwrap();
        assert!(b.le(&a) && copy.le(&a) && !a.le(&copy));
        assert!(reader.contains(b"b"), "the reader sees the merge");
        assert!(!copy.contains(b"b"), "the copy does not share bits");
        let mut d = SharedGBloom::new(params()).unwrap();
        d.track_deltas(true);
        d.add(b"d").unwrap();
        let delta = d.take_delta().unwrap();
        a.merge_delta(&delta).unwrap();
        assert!(reader.contains(b"d"));
        let other = SharedGBloom::new(params().with_seed(8)).unwrap();
        assert!(a.merge(&other).is_err());
    }

    /// The kept count of set bits is the scanned one after every way bits get set.
    #[test]
    fn the_kept_count_of_set_bits_is_the_scanned_one() {
        let scanned = |f: &SharedGBloom| f.bits.ones();
        let mut a = SharedGBloom::new(params()).unwrap();
        let mut b = SharedGBloom::new(params()).unwrap();
        b.track_deltas(true);
        for i in 0..1500u32 {
            a.add(&i.to_le_bytes()).unwrap();
            b.add(&(i + 1000).to_le_bytes()).unwrap();
        }
        assert_eq!(a.ones(), scanned(&a));
        let delta = b.take_delta().unwrap();
        let mut c = a.clone();
        c.merge_delta(&delta).unwrap();
        c.merge_delta(&delta).unwrap();
        assert_eq!(c.ones(), scanned(&c));
        a.merge(&b).unwrap();
        a.merge(&b).unwrap();
        assert_eq!((a.ones(), c.ones()), (scanned(&a), scanned(&a)));
        let back: SharedGBloom = serde_cbor::from_slice(&serde_cbor::to_vec(&a).unwrap()).unwrap();
        assert_eq!(back.ones(), scanned(&a));
        assert_eq!(a.cardinality(), a.snapshot().cardinality());
        assert_eq!(a.estimated_fpr(), a.snapshot().estimated_fpr());
    }

    /// The owner adds on one thread while readers query on others: every add the owner
    /// published (here through a channel, a happens-before edge) is contained for a reader.
    #[test]
    fn readers_see_every_add_that_happened_before_without_a_lock() {
        let mut f = SharedGBloom::new(BloomParams::with_capacity(100_000, 0.01).unwrap()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let reader = f.reader();
        let check = std::thread::spawn(move || {
            let mut seen = 0;
            for i in rx {
                assert!(reader.contains(&i.to_le_bytes()), "add {i} not visible");
                seen += 1;
            }
            seen
        });
        f.track_deltas(true);
        for i in 0..50_000u32 {
            f.add(&i.to_le_bytes()).unwrap();
            tx.send(i).unwrap();
        }
        drop(tx);
        assert_eq!(check.join().unwrap(), 50_000);
    }
}
