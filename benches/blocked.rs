//! Criterion benchmarks of `blocked_bloom` (each item's bits in one 512-bit block, `_two`:
//! in two) next to `g_bloom` and `fastbloom` at the same memory and `k`: lookups of 2^20 keys
//! absent from the filter and of 2^20 present ones, at 1 MiB, 64 MiB and 1 GiB of bits, each
//! filter filled to its design load (`m ln 2 / k` items: half its bits set), one at a time and
//! as a replica answers a batch (prefetching the lines of an item a few places ahead); and,
//! printed first, the false positive rate of each at equal memory, sized for 1%, 0.1% and
//! 0.01%.
//!
//! `cargo bench --bench blocked` (`CRPF_BLOCKED_MIB=1,64` for fewer sizes, `CRPF_BLOCKED_K=10`
//! for the `k` of 0.1%; BENCHMARKS.md).

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use crpf::{
    BlockedBloom, BlockedLayout, BloomParams, GBloom, Membership, ReplicatedFilter, SharedGBloom,
};

use common::{FRESH_SEED, KEY_SEED};

const LOOKUPS: usize = 1 << 20;

/// Hashes per item in the lookup groups: 7 (sized for 1%) unless `CRPF_BLOCKED_K` says.
fn lookup_k() -> u32 {
    std::env::var("CRPF_BLOCKED_K").map_or(7, |k| k.parse().expect("CRPF_BLOCKED_K: a number"))
}

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

/// The filters at `bits` bits and `k` hashes, each with `n` items.
struct Filled {
    /// As a replica holds it (a `SharedGBloom`: the same bits, read with relaxed atomic
    /// loads).
    g: SharedGBloom,
    /// One block per item.
    b: BlockedBloom,
    /// Two blocks per item.
    b2: BlockedBloom,
    f: fastbloom::BloomFilter,
}

fn filled(bits: u64, k: u32, n: u64) -> Filled {
    let params = BloomParams {
        bits,
        hashes: k,
        seed: 1,
        capacity: n,
    };
    let mut g = GBloom::new(params).unwrap();
    let mut b = BlockedBloom::new(params).unwrap();
    let mut b2 = BlockedBloom::with_layout(params, BlockedLayout::TwoBlocks).unwrap();
    let mut f = fastbloom::BloomFilter::with_num_bits(bits as usize).hashes(k);
    for i in 0..n {
        let key = key(KEY_SEED, i);
        g.add(&key).unwrap();
        b.add(&key).unwrap();
        b2.add(&key).unwrap();
        f.insert(&key[..]);
    }
    Filled {
        g: SharedGBloom::from(g),
        b,
        b2,
        f,
    }
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

/// False positive rates at equal memory (1 MiB, sized for 1%, 0.1% and 0.01%: `m ln²2 /
/// -ln p` items, `k` as `g_bloom` takes for `p`), over 2^24 absent keys (at 0.01%, about
/// 1,700 false positives: a 2.5% spread).
fn fpr_at_equal_memory() {
    let bits = 8u64 << 20;
    for p in [0.01f64, 0.001, 0.0001, 0.00001] {
        let n = (bits as f64 * 2f64.ln().powi(2) / -p.ln()) as u64;
        let k = BloomParams::with_capacity(n, p).unwrap().hashes;
        let Filled { g, b, b2, f } = filled(bits, k, n);
        let probes = 1u64 << 24;
        let rate = |hit: &dyn Fn(&[u8; 16]) -> bool| {
            (0..probes).filter(|&i| hit(&key(FRESH_SEED, i))).count() as f64 / probes as f64
        };
        let (rg, rb, rb2, rf) = (
            rate(&|key| g.contains(key)),
            rate(&|key| b.contains(key)),
            rate(&|key| b2.contains(key)),
            rate(&|key| f.contains(&key[..])),
        );
        // The layouts of more blocks (low targets), at the same bits and `k`.
        let more = |layout| {
            let params = *b.params();
            let mut m = BlockedBloom::with_layout(params, layout).unwrap();
            for i in 0..n {
                m.add(&key(KEY_SEED, i)).unwrap();
            }
            rate(&|key| m.contains(key))
        };
        let (rb3, rb4) = (
            more(BlockedLayout::ThreeBlocks),
            more(BlockedLayout::FourBlocks),
        );
        eprintln!(
            "FPR at 1 MiB sized for {p}, {n} items, k = {k}: g_bloom {rg:.6}, blocked_bloom \
             {rb:.6} ({:.2}x), two blocks {rb2:.6} ({:.2}x), three blocks {rb3:.6} ({:.2}x), \
             four blocks {rb4:.6} ({:.2}x), fastbloom {rf:.6} ({:.2}x); {p} takes {:?}",
            rb / rg,
            rb2 / rg,
            rb3 / rg,
            rb4 / rg,
            rf / rg,
            BlockedLayout::for_fpr(p)
        );
    }
}

fn lookups(c: &mut Criterion) {
    if std::env::var_os("CRPF_BLOCKED_NO_FPR").is_none() {
        fpr_at_equal_memory();
    }
    let k = lookup_k();
    for mib in sizes() {
        let bits = mib << 23;
        // Half the bits set: the load every filter is designed for.
        let n = (bits as f64 * std::f64::consts::LN_2 / f64::from(k)) as u64;
        let Filled { g, b, b2, f } = filled(bits, k, n);
        let present: Vec<[u8; 16]> = (0..LOOKUPS as u64)
            .map(|i| key(KEY_SEED, i * (n / LOOKUPS as u64).max(1) % n))
            .collect();
        let absent: Vec<[u8; 16]> = (0..LOOKUPS as u64).map(|i| key(FRESH_SEED, i)).collect();
        for (what, set) in [("absent", &absent), ("present", &present)] {
            let mut grp = c.benchmark_group(format!("lookup_{what}_{mib}MiB_k{k}"));
            grp.throughput(Throughput::Elements(LOOKUPS as u64));
            grp.bench_function("g_bloom", |bch| {
                bch.iter(|| set.iter().filter(|k| g.contains(&k[..])).count())
            });
            grp.bench_function("blocked_bloom", |bch| {
                bch.iter(|| set.iter().filter(|k| b.contains(&k[..])).count())
            });
            grp.bench_function("blocked_bloom_two", |bch| {
                bch.iter(|| set.iter().filter(|k| b2.contains(&k[..])).count())
            });
            grp.bench_function("g_bloom_batch", |bch| bch.iter(|| batched(&g, set)));
            grp.bench_function("blocked_bloom_batch", |bch| bch.iter(|| batched(&b, set)));
            grp.bench_function("blocked_bloom_two_batch", |bch| {
                bch.iter(|| batched(&b2, set))
            });
            grp.bench_function("fastbloom", |bch| {
                bch.iter(|| set.iter().filter(|k| f.contains(&k[..])).count())
            });
            grp.finish();
        }
        black_box((g, b, b2, f));
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
