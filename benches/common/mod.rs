//! Shared workload of the benchmarks: fixed-seed random 16-byte keys.

#![allow(dead_code)]

/// Number of keys every benchmark works on.
pub(crate) const N: usize = 1 << 20;

/// Seed of the keys that are inserted.
pub(crate) const KEY_SEED: u64 = 0x5EED_0001;
/// Seed of the fresh keys used for misses and measured false positive rates.
pub(crate) const FRESH_SEED: u64 = 0x5EED_0002;

/// The false positive rate the Bloom and merge benchmarks size for.
pub(crate) const MAIN_FPR: f64 = 0.01;
/// The false positive rate of 8-bit fingerprints in 4-slot buckets (`2 * 4 / 2^8`): what the
/// `cuckoofilter` crate has, and the thesis configuration.
pub(crate) const CUCKOO_FPR: f64 = 0.03125;

/// `n` random 16-byte keys from a fastrand generator seeded with `seed`.
pub(crate) fn keys(n: usize, seed: u64) -> Vec<[u8; 16]> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            let mut k = [0u8; 16];
            rng.fill(&mut k);
            k
        })
        .collect()
}

/// The thesis / `cuckoofilter::with_capacity(2^20)` geometry: 2^18 buckets of 4 slots, 8-bit
/// fingerprints, 500 kicks, i.e. 2^20 slots for the 2^20 keys.
pub(crate) fn thesis_cuckoo() -> crpf::CuckooParams {
    crpf::CuckooParams {
        buckets: 1 << 18,
        bucket_size: 4,
        fingerprint_bits: 8,
        max_kicks: 500,
        seed: 42,
    }
}
