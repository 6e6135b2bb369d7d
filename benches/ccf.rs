//! Criterion benchmarks of the counting cuckoo filter (`CountingCuckoo`) against a plain
//! counting Bloom filter (`crpf::eval::cbf::CountingBloom`, the CCF paper's baseline) and, for
//! insert, query and delete of single occurrences, the `cuckoofilter` crate.
//!
//! `cargo bench --bench ccf` (see BENCHMARKS.md, section "Counting cuckoo filter").

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use crpf::eval::cbf::CountingBloom;
use crpf::{CountingCuckoo, CuckooParams, Membership, Removable};
use cuckoofilter::CuckooFilter;
use std::hash::DefaultHasher;

use common::{FRESH_SEED, KEY_SEED, keys};

/// Distinct elements (root-set size) per filter.
const N: usize = 1 << 16;

/// The CCF: 12-bit fingerprints in 4-slot buckets at 90% load, about 0.18% FPR (paper Eq. 7),
/// 22 bits per element in the paper's accounting (12-bit fingerprint, 8-bit counter).
fn ccf() -> CountingCuckoo {
    let p = CuckooParams {
        buckets: (N as f64 / 3.6).ceil() as u64,
        bucket_size: 4,
        fingerprint_bits: 12,
        max_kicks: 500,
        seed: 42,
    };
    CountingCuckoo::new(p, 1).unwrap()
}

/// The CBF at the same FPR: 13 counters per element (`0.6185^13` ≈ 0.2%), k = 9, 104 bits
/// per element.
fn cbf() -> CountingBloom {
    CountingBloom::with_bits_per_element(N as u64, 104.0, 42)
}

fn crate_cf() -> CuckooFilter<DefaultHasher> {
    CuckooFilter::with_capacity(N)
}

fn bench(c: &mut Criterion) {
    let fresh = keys(N, FRESH_SEED);
    let keys = keys(N, KEY_SEED);

    let mut g = c.benchmark_group("ccf_insert");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("CountingCuckoo", |b| {
        b.iter_batched(
            ccf,
            |mut f| {
                let failed = keys.iter().filter(|k| f.add(&k[..]).is_err()).count();
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("CountingBloom", |b| {
        b.iter_batched(
            cbf,
            |mut f| {
                for k in &keys {
                    f.insert(k, 1);
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("cuckoofilter", |b| {
        b.iter_batched(
            crate_cf,
            |mut f| {
                let failed = keys.iter().filter(|k| f.add(&k[..]).is_err()).count();
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let (mut fc, mut fb, mut fx) = (ccf(), cbf(), crate_cf());
    let mut failed = 0;
    for k in &keys {
        failed += fc.add(k).is_err() as usize;
        fb.insert(k, 1);
        let _ = fx.add(&k[..]);
    }
    let fpr = |hit: &dyn Fn(&[u8]) -> bool| {
        fresh.iter().filter(|k| hit(&k[..])).count() as f64 / N as f64
    };
    eprintln!(
        "{N} keys: CountingCuckoo {failed} failed inserts, load {:.3}; measured FPR: \
         CountingCuckoo {:.5}, CountingBloom {:.5}, cuckoofilter {:.5}",
        fc.load_factor(),
        fpr(&|k| fc.contains(k)),
        fpr(&|k| fb.count(k) > 0),
        fpr(&|k| fx.contains(k)),
    );

    for (group, set) in [("ccf_query_hit", &keys), ("ccf_query_miss", &fresh)] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(N as u64));
        g.bench_function("CountingCuckoo", |b| {
            b.iter(|| set.iter().map(|k| fc.count(&k[..])).sum::<u64>())
        });
        g.bench_function("CountingBloom", |b| {
            b.iter(|| set.iter().map(|k| fb.count(&k[..])).sum::<u64>())
        });
        g.bench_function("cuckoofilter", |b| {
            b.iter(|| set.iter().filter(|k| fx.contains(&k[..])).count())
        });
        g.finish();
    }

    let mut g = c.benchmark_group("ccf_delete");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("CountingCuckoo", |b| {
        b.iter_batched(
            || fc.clone(),
            |mut f| {
                let n = keys.iter().filter(|k| f.remove(&k[..])).count();
                (f, black_box(n))
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("CountingBloom", |b| {
        b.iter_batched(
            || fb.clone(),
            |mut f| {
                let n = keys.iter().filter(|k| f.remove(&k[..], 1)).count();
                (f, black_box(n))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
