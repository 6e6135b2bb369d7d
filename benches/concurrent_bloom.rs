//! Criterion benchmark (issue 11): crpf's wait-free `AtomicGBloom` next to fastbloom's
//! `AtomicBloomFilter`, adding and querying 2^20 keys split among 1, 2 and 4 threads that
//! share one filter.
//!
//! `cargo bench --no-default-features --bench concurrent_bloom` (see BENCHMARKS.md).
//! Wall-clock time: the threads run in parallel, so per-thread CPU time would not show
//! contention.

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use crpf::AtomicGBloom;
use fastbloom::AtomicBloomFilter;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

use common::{FRESH_SEED, KEY_SEED, MAIN_FPR, N, keys};

const THREADS: [usize; 3] = [1, 2, 4];

/// Runs `work` on each of `threads` chunks of `keys`, one scoped thread per chunk.
fn split<K: Sync>(keys: &[K], threads: usize, work: impl Fn(&[K]) + Sync) {
    let work = &work;
    std::thread::scope(|s| {
        for chunk in keys.chunks(keys.len().div_ceil(threads)) {
            s.spawn(move || work(chunk));
        }
    });
}

fn concurrent(c: &mut Criterion) {
    let fresh = keys(N, FRESH_SEED);
    let keys = keys(N, KEY_SEED);
    // Queries: half inserted keys, half fresh ones, interleaved.
    let queries: Vec<[u8; 16]> = keys
        .iter()
        .zip(&fresh)
        .flat_map(|(a, b)| [*a, *b])
        .take(N)
        .collect();

    let mk_crpf = || AtomicGBloom::with_capacity(N as u64, MAIN_FPR).unwrap();
    let mk_fast = || AtomicBloomFilter::with_false_pos(MAIN_FPR).expected_items(N);
    let mk_fast_xxh3 = || {
        AtomicBloomFilter::with_false_pos(MAIN_FPR)
            .hasher(Xxh3DefaultBuilder::new())
            .expected_items(N)
    };
    {
        let (a, f) = (mk_crpf(), mk_fast());
        eprintln!(
            "sizing at fpr {MAIN_FPR}: AtomicGBloom m={} k={}; fastbloom m={} k={}",
            a.params().bits,
            a.params().hashes,
            f.num_bits(),
            f.num_hashes()
        );
    }

    let mut g = c.benchmark_group("atomic_bloom_add");
    g.throughput(Throughput::Elements(N as u64));
    for t in THREADS {
        g.bench_with_input(BenchmarkId::new("AtomicGBloom", t), &t, |b, &t| {
            b.iter_batched(
                mk_crpf,
                |f| {
                    split(&keys, t, |ks| ks.iter().for_each(|k| f.add(k)));
                    f
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_with_input(BenchmarkId::new("fastbloom_default", t), &t, |b, &t| {
            b.iter_batched(
                mk_fast,
                |f| {
                    split(&keys, t, |ks| {
                        ks.iter().for_each(|k| {
                            f.insert(&k[..]);
                        })
                    });
                    f
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_with_input(BenchmarkId::new("fastbloom_xxh3_hasher", t), &t, |b, &t| {
            b.iter_batched(
                mk_fast_xxh3,
                |f| {
                    split(&keys, t, |ks| {
                        ks.iter().for_each(|k| {
                            f.insert(&k[..]);
                        })
                    });
                    f
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();

    let (a, f, fx) = (mk_crpf(), mk_fast(), mk_fast_xxh3());
    for k in &keys {
        a.add(k);
        f.insert(&k[..]);
        fx.insert(&k[..]);
    }
    let mut g = c.benchmark_group("atomic_bloom_contains");
    g.throughput(Throughput::Elements(N as u64));
    for t in THREADS {
        g.bench_with_input(BenchmarkId::new("AtomicGBloom", t), &t, |b, &t| {
            b.iter(|| {
                split(&queries, t, |qs| {
                    black_box(qs.iter().filter(|q| a.contains(&q[..])).count());
                })
            })
        });
        g.bench_with_input(BenchmarkId::new("fastbloom_default", t), &t, |b, &t| {
            b.iter(|| {
                split(&queries, t, |qs| {
                    black_box(qs.iter().filter(|q| f.contains(&q[..])).count());
                })
            })
        });
        g.bench_with_input(BenchmarkId::new("fastbloom_xxh3_hasher", t), &t, |b, &t| {
            b.iter(|| {
                split(&queries, t, |qs| {
                    black_box(qs.iter().filter(|q| fx.contains(&q[..])).count());
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = concurrent
}
criterion_main!(benches);
