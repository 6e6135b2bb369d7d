//! Criterion benchmarks of `blocked_bloom` (each item's bits in one 512-bit block) next to
//! `g_bloom` and `fastbloom` at the same memory and `k`: lookups of 2^20 keys absent from the
//! filter and of 2^20 present ones, at 1 MiB, 64 MiB and 1 GiB of bits, each filter filled to
//! its design load (`m ln 2 / k` items: half its bits set), one at a time and as a replica
//! answers a batch (prefetching the lines of an item a few places ahead); and, printed first,
//! the false positive rate of each at equal memory, sized for 1%.
//!
//! `cargo bench --bench blocked` (`CRPF_BLOCKED_MIB=1,64` for fewer sizes; BENCHMARKS.md).

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use crpf::{BlockedBloom, BloomParams, GBloom, Membership, ReplicatedFilter, SharedGBloom};

use common::{FRESH_SEED, KEY_SEED, MAIN_FPR};

const LOOKUPS: usize = 1 << 20;
const K: u32 = 7;

/// Item `i` of a key stream: 16 bytes, distinct per `(seed, i)`.
fn key(seed: u64, i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&seed.to_le_bytes());
    k[8..].copy_from_slice(&i.to_le_bytes());
    k
}

fn sizes() -> Vec<u64> {
    std::env::var("CRPF_BLOCKED_MIB")
        .unwrap_or_else(|_| "1,64,1024".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("CRPF_BLOCKED_MIB: MiB, comma-separated")
        })
        .collect()
}

/// The three filters at `bits` bits and `k = 7`, each with `n` items; `g_bloom` as a replica
/// holds it (a `SharedGBloom`: the same bits, read with relaxed atomic loads).
fn filled(bits: u64, n: u64) -> (SharedGBloom, BlockedBloom, fastbloom::BloomFilter) {
    let params = BloomParams {
        bits,
        hashes: K,
        seed: 1,
        capacity: n,
    };
    let mut g = GBloom::new(params).unwrap();
    let mut b = BlockedBloom::new(params).unwrap();
    let mut f = fastbloom::BloomFilter::with_num_bits(bits as usize).hashes(K);
    for i in 0..n {
        let k = key(KEY_SEED, i);
        g.add(&k).unwrap();
        b.add(&k).unwrap();
        f.insert(&k[..]);
    }
    (SharedGBloom::from(g), b, f)
}

/// Lookups as a replica answers a batch (`mcontains`): the lines of the item a few places
/// ahead are prefetched ([`ReplicatedFilter::prefetch`]), so that misses overlap.
fn batched<F: ReplicatedFilter>(f: &F, set: &[[u8; 16]]) -> usize {
    let ahead = f.prefetch_ahead();
    let mut found = 0;
    for (i, k) in set.iter().enumerate() {
        if let Some(next) = set.get(i + ahead) {
            f.prefetch(next);
        }
        found += usize::from(f.contains(k));
    }
    found
}

/// False positive rates at equal memory (1 MiB, sized for 1%: `m / 9.585` items), over
/// 2^22 absent keys.
fn fpr_at_equal_memory() {
    let bits = 8u64 << 20;
    let n = (bits as f64 * 2f64.ln().powi(2) / -MAIN_FPR.ln()) as u64;
    let (g, b, f) = filled(bits, n);
    let probes = 1u64 << 22;
    let rate = |hit: &dyn Fn(&[u8; 16]) -> bool| {
        (0..probes).filter(|&i| hit(&key(FRESH_SEED, i))).count() as f64 / probes as f64
    };
    let (rg, rb, rf) = (
        rate(&|k| g.contains(k)),
        rate(&|k| b.contains(k)),
        rate(&|k| f.contains(&k[..])),
    );
    eprintln!(
        "FPR at 1 MiB, {n} items, k = {K}: g_bloom {rg:.5}, blocked_bloom {rb:.5} ({:.2}x), \
         fastbloom {rf:.5} ({:.2}x)",
        rb / rg,
        rf / rg
    );
}

fn lookups(c: &mut Criterion) {
    fpr_at_equal_memory();
    for mib in sizes() {
        let bits = mib << 23;
        // Half the bits set: the load every filter is designed for.
        let n = (bits as f64 * std::f64::consts::LN_2 / f64::from(K)) as u64;
        let (g, b, f) = filled(bits, n);
        let present: Vec<[u8; 16]> = (0..LOOKUPS as u64)
            .map(|i| key(KEY_SEED, i * (n / LOOKUPS as u64).max(1) % n))
            .collect();
        let absent: Vec<[u8; 16]> = (0..LOOKUPS as u64).map(|i| key(FRESH_SEED, i)).collect();
        for (what, set) in [("absent", &absent), ("present", &present)] {
            let mut grp = c.benchmark_group(format!("lookup_{what}_{mib}MiB"));
            grp.throughput(Throughput::Elements(LOOKUPS as u64));
            grp.bench_function("g_bloom", |bch| {
                bch.iter(|| set.iter().filter(|k| g.contains(&k[..])).count())
            });
            grp.bench_function("blocked_bloom", |bch| {
                bch.iter(|| set.iter().filter(|k| b.contains(&k[..])).count())
            });
            grp.bench_function("g_bloom_batch", |bch| bch.iter(|| batched(&g, set)));
            grp.bench_function("blocked_bloom_batch", |bch| bch.iter(|| batched(&b, set)));
            grp.bench_function("fastbloom", |bch| {
                bch.iter(|| set.iter().filter(|k| f.contains(&k[..])).count())
            });
            grp.finish();
        }
        black_box((g, b, f));
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        // No plots: they need fonts a headless machine may lack.
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = lookups
}
criterion_main!(benches);
