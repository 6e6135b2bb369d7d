//! A wait-free concurrent grow-only Bloom filter (`spec-concurrent-bloom-filter.md`, sections 5
//! and 6): [`GBloom`]'s parameters, hashing and bits, with `add` and `contains` on `&self`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::bloom::{GBloom, bloom_cardinality, bloom_estimated_fpr};
use super::error::FilterError;
use super::hash::{BloomProbes, ItemHash, hash_item};
use super::huge_pages;
use super::lattice::Membership;
use super::params::BloomParams;

/// A grow-only Bloom filter that many threads add to and query at once, without a lock:
/// every word of the bit array is an [`AtomicU64`], an add is one atomic OR per probe and a
/// query one atomic load per probe. It is `Send + Sync`; share it behind an `Arc` (or a
/// scoped borrow).
///
/// Given the same parameters and items it has exactly the bits of a [`GBloom`] (same hash,
/// same probes), so it converts both ways ([`AtomicGBloom::snapshot`], `From`), serializes as
/// a `GBloom` (the bytes are interchangeable), and merges a `GBloom` state received from
/// another replica in place ([`AtomicGBloom::merge_from`]). The CRDT laws are those of the
/// `GBloom` its snapshots are.
///
/// # Progress
///
/// [`add`](AtomicGBloom::add), [`test_and_add`](AtomicGBloom::test_and_add) and
/// [`contains`](AtomicGBloom::contains) are wait-free: each does at most `k` atomic operations
/// and never retries or waits for another thread. (On targets whose `fetch_or` is a single
/// instruction: x86-64 `lock or`, AArch64 with LSE `ldset`. Where it compiles to an LL/SC
/// loop it is lock-free.) [`merge_from`](AtomicGBloom::merge_from) and
/// [`snapshot`](AtomicGBloom::snapshot) are wait-free too, `O(m / 64)` atomic operations.
///
/// # Happens-before contract (spec section 6)
///
/// *If an `add(x)` happens-before a `contains(x)`, the `contains` returns `true`.* The
/// happens-before edge is the caller's: the same thread, a channel send and receive, a mutex,
/// a `Release` store read by an `Acquire` load, a thread spawn or join. Why it holds with
/// relaxed atomics: each of `x`'s bits lives in one atomic word, every write to a word is an
/// OR (so every later value of the word still has the bit), and read-write coherence makes a
/// load that happens after an OR see that OR's value or a later one.
///
/// An `add` and a `contains` not ordered by happens-before are concurrent: the query may see
/// some of the add's bits and not others and answer `false`. That is not a false negative;
/// the add had not happened yet for that query. It is not a data race either (all accesses
/// are atomic). The same holds for [`merge_from`](AtomicGBloom::merge_from) (an add of every
/// element the merged state holds) and for snapshots: a snapshot has, word by word, every bit
/// of every add that happened before it and possibly some bits of concurrent ones, so a
/// snapshot is always `≤` a later snapshot and `≥` an earlier one.
///
/// Two differences from Go's sequentially consistent atomics, which the spec assumes: the
/// operations use `Relaxed` ordering, so (1) a `true` answer does *not* synchronise with the
/// adds that set the bits (a positive may be false anyway, so it must not be used to publish
/// other memory), and (2) there is no single total order of adds and queries across threads
/// (thread A adding `a` then querying `b` while B adds `b` then queries `a` may see neither).
/// Use an explicit synchronising operation when an algorithm needs either.
///
/// ```
/// use std::sync::Arc;
/// use crpf::{AtomicGBloom, GBloom, Lattice, Membership};
///
/// let f = Arc::new(AtomicGBloom::with_capacity(10_000, 0.01)?);
/// let writers: Vec<_> = (0..4u32)
///     .map(|t| {
///         let f = Arc::clone(&f);
///         std::thread::spawn(move || {
///             for i in 0..100u32 { f.add(&(t * 1000 + i).to_le_bytes()); }
///         })
///     })
///     .collect();
/// for w in writers { w.join().unwrap(); } // join: every add happened-before what follows
/// assert!((0..4u32).all(|t| f.contains(&(t * 1000 + 99).to_le_bytes())));
///
/// let mut g = GBloom::with_capacity(10_000, 0.01)?;
/// g.add(b"from a peer")?;
/// f.merge_from(&g)?;                          // a replica's state, merged in place
/// assert!(f.contains(b"from a peer"));
/// assert!(g.le(&f.snapshot()));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub struct AtomicGBloom {
    params: BloomParams,
    words: Box<[AtomicU64]>,
}

/// Every operation: the filter is only a bit array, each bit's writes are ORs (see the
/// contract on [`AtomicGBloom`]).
const ORDER: Ordering = Ordering::Relaxed;

impl AtomicGBloom {
    /// A filter sized for `capacity` elements at false positive rate `fpr`, like
    /// [`GBloom::with_capacity`].
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::new(BloomParams::with_capacity(capacity, fpr)?)
    }

    /// An empty filter with explicit (validated) parameters.
    pub fn new(params: BloomParams) -> Result<Self, FilterError> {
        let params = params.validated()?;
        let words = huge_pages::zeroed_box(params.bits.div_ceil(64) as usize);
        Ok(Self { params, words })
    }

    /// The filter's parameters (those of its [`GBloom`] snapshots).
    pub fn params(&self) -> &BloomParams {
        &self.params
    }

    #[inline]
    fn probes(&self, item: &[u8]) -> BloomProbes {
        let h: ItemHash = hash_item(item, self.params.seed);
        BloomProbes::new(h, self.params.bits)
    }

    /// Adds the item: wait-free, `k` atomic ORs.
    #[inline]
    pub fn add(&self, item: &[u8]) {
        let mut probes = self.probes(item);
        for _ in 0..self.params.hashes {
            let idx = probes.next_index();
            self.words[(idx >> 6) as usize].fetch_or(1 << (idx & 63), ORDER);
        }
    }

    /// Starts loading the item's words into the cache, without waiting for them: a loop over
    /// many items that calls it for an item a few places ahead of the one it adds or queries
    /// overlaps the cache misses of a large filter across items.
    ///
    /// ```
    /// use crpf::AtomicGBloom;
    ///
    /// let f = AtomicGBloom::with_capacity(10_000, 0.01)?;
    /// let items: Vec<[u8; 4]> = (0..100u32).map(u32::to_le_bytes).collect();
    /// for (i, item) in items.iter().enumerate() {
    ///     if let Some(ahead) = items.get(i + 4) {
    ///         f.prefetch(ahead);
    ///     }
    ///     f.add(item);
    /// }
    /// assert!(f.contains(&7u32.to_le_bytes()));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    #[inline]
    pub fn prefetch(&self, item: &[u8]) {
        let mut probes = self.probes(item);
        for _ in 0..self.params.hashes {
            let idx = probes.next_index();
            crate::core::prefetch::prefetch(&self.words[(idx >> 6) as usize]);
        }
    }

    /// The words of the bit array.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    /// Adds the item and returns whether all its bits were set before (`TestAndAdd`). Two
    /// threads adding the same new item at once may both get `false`.
    #[inline]
    pub fn test_and_add(&self, item: &[u8]) -> bool {
        let mut probes = self.probes(item);
        let mut present = true;
        for _ in 0..self.params.hashes {
            let idx = probes.next_index();
            let mask = 1 << (idx & 63);
            present &= self.words[(idx >> 6) as usize].fetch_or(mask, ORDER) & mask != 0;
        }
        present
    }

    /// `true` if the item may have been added; `false` means no add of it happened-before
    /// this call (see the contract on [`AtomicGBloom`]). Wait-free, at most `k` atomic loads.
    #[inline]
    pub fn contains(&self, item: &[u8]) -> bool {
        let mut probes = self.probes(item);
        (0..self.params.hashes).all(|_| {
            let idx = probes.next_index();
            self.words[(idx >> 6) as usize].load(ORDER) & (1 << (idx & 63)) != 0
        })
    }

    /// ORs a [`GBloom`] state into this one, word by word with atomic ORs, while other threads
    /// keep adding and querying. Parameters that differ give [`FilterError::Incompatible`] and
    /// change nothing. An element of `other` is contained for every query the merge
    /// happens-before; a concurrent query may see part of the merge.
    pub fn merge_from(&self, other: &GBloom) -> Result<(), FilterError> {
        FilterError::require_same("bloom", &self.params, other.params())?;
        for (w, &o) in self.words.iter().zip(other.words()) {
            if o != 0 {
                w.fetch_or(o, ORDER);
            }
        }
        Ok(())
    }

    /// The current bits as a [`GBloom`] (which records no deltas): per-word consistent, with
    /// every add that happened-before the call, possibly parts of concurrent ones.
    pub fn snapshot(&self) -> GBloom {
        let words = self.words.iter().map(|w| w.load(ORDER)).collect();
        GBloom::from_words(self.params, words)
    }

    /// Number of set bits `|S|` (a per-word consistent count, `O(m / 64)`).
    pub fn ones(&self) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(ORDER).count_ones() as u64)
            .sum()
    }

    /// Share of bits set, `|S| / m`.
    pub fn fill_ratio(&self) -> f64 {
        self.ones() as f64 / self.params.bits as f64
    }

    /// Estimated number of elements: [`GBloom::approximated_size`] of the current bits
    /// (Swamidass-Baldi, accurate below fill [`GBloom::APPROX_SIZE_MAX_FILL`]).
    pub fn approximated_size(&self) -> u64 {
        self.snapshot().approximated_size()
    }

    /// Estimated false positive rate of the current bits, `(|S|/m)^k` (as
    /// [`GBloom`]'s).
    pub fn estimated_fpr(&self) -> f64 {
        bloom_estimated_fpr(&self.params, self.ones())
    }
}

impl From<GBloom> for AtomicGBloom {
    fn from(g: GBloom) -> Self {
        let params = *g.params();
        // Advised while untouched, so that the copy faults in huge pages.
        let mut words: Box<[AtomicU64]> = huge_pages::zeroed_box(g.words().len());
        for (to, &from) in words.iter_mut().zip(g.words()) {
            *to.get_mut() = from;
        }
        Self { params, words }
    }
}

impl From<AtomicGBloom> for GBloom {
    fn from(a: AtomicGBloom) -> Self {
        let words = a.words.into_vec().into_iter().map(AtomicU64::into_inner);
        GBloom::from_words(a.params, words.collect())
    }
}

impl Clone for AtomicGBloom {
    /// A copy of a [`snapshot`](AtomicGBloom::snapshot).
    fn clone(&self) -> Self {
        self.snapshot().into()
    }
}

impl fmt::Debug for AtomicGBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtomicGBloom")
            .field("params", &self.params)
            .field("ones", &self.ones())
            .finish()
    }
}

/// The `&mut` API of the other filters, for code generic over [`Membership`]; with exclusive
/// access there is no concurrency to speak of.
impl Membership for AtomicGBloom {
    fn contains(&self, item: &[u8]) -> bool {
        AtomicGBloom::contains(self, item)
    }
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        AtomicGBloom::add(self, item);
        Ok(())
    }
    /// From one count of the bits, without copying them into a snapshot.
    fn cardinality(&self) -> f64 {
        bloom_cardinality(&self.params, self.ones())
    }
    fn capacity(&self) -> u64 {
        self.params.capacity
    }
    fn load_factor(&self) -> f64 {
        self.cardinality() / self.params.capacity as f64
    }
    fn estimated_fpr(&self) -> f64 {
        AtomicGBloom::estimated_fpr(self)
    }
}

/// Serialized exactly as a [`GBloom`] (its snapshot), so either type reads the other's bytes.
impl Serialize for AtomicGBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.snapshot().serialize(s)
    }
}

/// Decoded (and validated) as a [`GBloom`].
impl<'de> Deserialize<'de> for AtomicGBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        GBloom::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    use super::*;
    use crate::core::lattice::Lattice;

    fn key(writer: u32, i: u32) -> [u8; 8] {
        let mut k = [0u8; 8];
        k[..4].copy_from_slice(&writer.to_le_bytes());
        k[4..].copy_from_slice(&i.to_le_bytes());
        k
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<AtomicGBloom>();
    }

    #[test]
    fn same_bits_as_gbloom_and_conversions_round_trip() {
        let p = BloomParams::with_capacity(5000, 0.01).unwrap().with_seed(9);
        let a = AtomicGBloom::new(p).unwrap();
        let mut g = GBloom::new(p).unwrap();
        for i in 0..3000u32 {
            let k = i.to_le_bytes();
            assert_eq!(a.test_and_add(&k), g.test_and_add(&k), "item {i}");
        }
        assert_eq!(a.snapshot(), g);
        assert_eq!(a.ones(), g.ones());
        assert_eq!(a.approximated_size(), g.approximated_size());
        let bytes = serde_cbor::to_vec(&a).unwrap();
        assert_eq!(bytes, serde_cbor::to_vec(&g).unwrap(), "same encoding");
        let back: AtomicGBloom = serde_cbor::from_slice(&bytes).unwrap();
        assert_eq!(back.snapshot(), g);
        let round: GBloom = AtomicGBloom::from(g.clone()).into();
        assert_eq!(round, g);
        let other = GBloom::with_capacity(5000, 0.01).unwrap(); // another seed
        assert!(matches!(
            a.merge_from(&other),
            Err(FilterError::Incompatible(_))
        ));
        assert_eq!(a.snapshot(), g, "a refused merge changes nothing");
    }

    /// Spec section 6: writers add and hand each item over (channel, or a `Release` counter
    /// the reader `Acquire`s) to readers that query it at once, while other adds and queries
    /// run concurrently. Every handed-over item must be contained: the handoff makes the add
    /// happen-before the query. Several rounds on fresh filters, small enough that adds and
    /// queries keep hitting the same words.
    #[test]
    fn no_false_negative_for_adds_that_happened_before() {
        const WRITERS: u32 = 3;
        const PER_WRITER: u32 = 4000;
        for round in 0..6u64 {
            let f = AtomicGBloom::new(BloomParams {
                bits: 1 << 15,
                hashes: 4,
                seed: round,
                capacity: 12_000,
            })
            .unwrap();
            let published: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
            let done = AtomicBool::new(false);
            let (tx, rx) = mpsc::channel::<[u8; 8]>();
            std::thread::scope(|s| {
                let (f, published, done) = (&f, &published, &done);
                for w in 0..WRITERS {
                    let tx = tx.clone();
                    s.spawn(move || {
                        for i in 0..PER_WRITER {
                            let k = key(w, i);
                            f.add(&k);
                            if i % 7 == 0 {
                                tx.send(k).unwrap();
                            }
                            // Everything up to i is added before this store.
                            published[w as usize].store(i as u64 + 1, Ordering::Release);
                        }
                    });
                }
                drop(tx);
                // Channel reader: every received item was added before its send.
                s.spawn(move || {
                    let mut got = 0;
                    for k in rx {
                        assert!(f.contains(&k), "false negative for a received item");
                        got += 1;
                    }
                    assert!(got > 0);
                });
                // Counter readers: items below an acquired count were added before it.
                for r in 0..2u32 {
                    s.spawn(move || {
                        let mut rng = fastrand::Rng::with_seed(round * 10 + r as u64);
                        loop {
                            let finished = done.load(Ordering::Acquire);
                            for w in 0..WRITERS {
                                let upto = published[w as usize].load(Ordering::Acquire) as u32;
                                if upto > 0 {
                                    for _ in 0..16 {
                                        let i = rng.u32(..upto);
                                        assert!(
                                            f.contains(&key(w, i)),
                                            "false negative: writer {w} item {i} of {upto}"
                                        );
                                    }
                                    // The most recent one: the tightest race with the writer.
                                    assert!(f.contains(&key(w, upto - 1)));
                                }
                                // Concurrent queries: any answer is allowed.
                                let _ = f.contains(&key(w, upto));
                            }
                            if finished {
                                break;
                            }
                        }
                    });
                }
                // Concurrent state merges from a "peer".
                s.spawn(move || {
                    let mut peer = GBloom::new(*f.params()).unwrap();
                    for i in 0..500u32 {
                        crate::core::lattice::Membership::add(&mut peer, &key(99, i)).unwrap();
                        if i % 50 == 0 {
                            f.merge_from(&peer).unwrap();
                            assert!(peer.le(&f.snapshot()), "merged state not in a snapshot");
                        }
                    }
                    f.merge_from(&peer).unwrap();
                });
                // Signal the readers once the writers have joined... scope joins all, so
                // writers finish on their own; a watcher flips `done` when counters are full.
                s.spawn(move || {
                    while published
                        .iter()
                        .any(|p| p.load(Ordering::Acquire) < PER_WRITER as u64)
                    {
                        std::thread::yield_now();
                    }
                    done.store(true, Ordering::Release);
                });
            });
            // After the scope (joined): everything is contained, and the bits are those of
            // a sequential GBloom with the same items, whatever the interleaving.
            let mut g = GBloom::new(*f.params()).unwrap();
            for w in (0..WRITERS).chain([99]) {
                let n = if w == 99 { 500 } else { PER_WRITER };
                for i in 0..n {
                    crate::core::lattice::Membership::add(&mut g, &key(w, i)).unwrap();
                }
            }
            assert_eq!(f.snapshot(), g, "round {round}: lost or extra bits");
        }
    }

    /// Snapshots taken while threads add only grow: each is `≤` the next.
    #[test]
    fn snapshots_are_monotone_under_concurrent_adds() {
        let f = AtomicGBloom::with_capacity(2000, 0.05).unwrap();
        std::thread::scope(|s| {
            let f = &f;
            for t in 0..2u32 {
                s.spawn(move || {
                    for i in 0..5000u32 {
                        f.add(&key(t, i));
                    }
                });
            }
            s.spawn(move || {
                let mut prev = f.snapshot();
                for _ in 0..200 {
                    let next = f.snapshot();
                    assert!(prev.le(&next), "a later snapshot lost bits");
                    prev = next;
                }
            });
        });
    }
}
