//! A plain counting Bloom filter (Fan et al., *Summary cache*), the baseline the CCF paper
//! compares against (its section 2.2 and 6.2): `m` counters, `k` probes, the multiplicity of an
//! element estimated as the minimum of its `k` counters (as in a count-min sketch). Not a
//! product type: it exists for `crpf eval ccf` and the `ccf` benchmark.

use crate::core::hash::{BloomProbes, hash_item};

/// A counting Bloom filter with 8-bit saturating counters: a counter that reaches 255 stays
/// there (it may hold more than it can count, so it is never decremented again), the usual
/// guard against the overflow the paper warns of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountingBloom {
    counters: Vec<u8>,
    hashes: u32,
    seed: u64,
}

impl CountingBloom {
    /// Bits per counter.
    pub const COUNTER_BITS: u32 = 8;

    /// `m` counters (at least 1) and `k` probes (1 to 64).
    pub fn new(counters: u64, hashes: u32, seed: u64) -> Self {
        CountingBloom {
            counters: vec![0; counters.max(1) as usize],
            hashes: hashes.clamp(1, 64),
            seed,
        }
    }

    /// `bits_per_element · n / 8` counters for `n` elements, with the optimal `k = (m/n) ln 2`
    /// (paper Eq. 3).
    pub fn with_bits_per_element(n: u64, bits_per_element: f64, seed: u64) -> Self {
        let m = (n as f64 * bits_per_element / Self::COUNTER_BITS as f64).ceil() as u64;
        let k = (m as f64 / n.max(1) as f64 * std::f64::consts::LN_2).round() as u32;
        Self::new(m, k, seed)
    }

    /// Number of counters `m`.
    pub fn len(&self) -> u64 {
        self.counters.len() as u64
    }

    /// Never: there is at least one counter.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Number of probes `k`.
    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Memory in bits (`m` counters of 8 bits).
    pub fn bits(&self) -> u64 {
        self.len() * Self::COUNTER_BITS as u64
    }

    #[inline]
    fn probes(&self, item: &[u8]) -> BloomProbes {
        BloomProbes::new(hash_item(item, self.seed), self.len())
    }

    /// Adds `n` occurrences.
    #[inline]
    pub fn insert(&mut self, item: &[u8], n: u64) {
        let mut p = self.probes(item);
        let add = n.min(255) as u8;
        for _ in 0..self.hashes {
            let c = &mut self.counters[p.next_index() as usize];
            *c = c.saturating_add(add);
        }
    }

    /// The estimated multiplicity: the smallest of the item's counters.
    #[inline]
    pub fn count(&self, item: &[u8]) -> u64 {
        let mut p = self.probes(item);
        let mut min = u8::MAX;
        for _ in 0..self.hashes {
            min = min.min(self.counters[p.next_index() as usize]);
            if min == 0 {
                break;
            }
        }
        min as u64
    }

    /// Removes `n` occurrences if the filter counts at least `n` (else nothing, `false`).
    /// Saturated counters stay saturated.
    #[inline]
    pub fn remove(&mut self, item: &[u8], n: u64) -> bool {
        if n == 0 || self.count(item) < n {
            return false;
        }
        let mut p = self.probes(item);
        for _ in 0..self.hashes {
            let c = &mut self.counters[p.next_index() as usize];
            if *c != u8::MAX {
                *c -= n as u8;
            }
        }
        true
    }

    /// Paper Eq. 2: `(1 - e^{-kn/m})^k` after `n` distinct elements.
    pub fn theoretical_fpr(&self, n: u64) -> f64 {
        let k = self.hashes as f64;
        (1.0 - (-k * n as f64 / self.len() as f64).exp()).powf(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_removes() {
        let mut f = CountingBloom::with_bits_per_element(100, 64.0, 1);
        assert_eq!(f.hashes(), 6);
        f.insert(b"a", 3);
        f.insert(b"b", 1);
        assert_eq!((f.count(b"a"), f.count(b"b"), f.count(b"c")), (3, 1, 0));
        assert!(!f.remove(b"b", 2));
        assert!(f.remove(b"a", 2));
        assert_eq!(f.count(b"a"), 1);
        f.insert(b"s", 300);
        assert_eq!(f.count(b"s"), 255, "saturates");
        assert!(f.remove(b"s", 10));
        assert_eq!(f.count(b"s"), 255, "saturated counters stay");
    }
}
