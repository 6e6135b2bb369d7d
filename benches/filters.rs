//! Criterion benchmarks: crpf filters side by side with `fastbloom`, `bloomfilter` and
//! `cuckoofilter` on the same keys, plus the merge of two half-filled replicas of every type.
//!
//! `cargo bench --bench filters` (see BENCHMARKS.md).

mod common;

use std::hash::DefaultHasher;
use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use crpf::{
    GBloom, GCuckoo, Lattice, Membership, OrCuckoo, ReplicatedFilter, ScGBloom, ScGCuckoo,
    ScOrCuckoo,
};
use xxhash_rust::xxh3::{Xxh3DefaultBuilder, xxh3_64};

use common::{CUCKOO_FPR, FRESH_SEED, KEY_SEED, MAIN_FPR, N, keys, thesis_cuckoo};

/// Wall-clock time (criterion's default) unless `CRPF_BENCH_CLOCK=thread-cpu`, which measures
/// the benchmark thread's CPU time instead, so that time the thread spends descheduled on a
/// shared machine is not counted.
struct Clock {
    thread_cpu: bool,
}

static WALL: WallTime = WallTime;

impl Clock {
    fn from_env() -> Self {
        let thread_cpu = std::env::var("CRPF_BENCH_CLOCK").is_ok_and(|v| v == "thread-cpu");
        if thread_cpu {
            eprintln!("measuring thread CPU time (CRPF_BENCH_CLOCK=thread-cpu)");
        }
        Clock { thread_cpu }
    }

    fn now_ns(&self) -> u64 {
        if self.thread_cpu {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec.
            let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        } else {
            static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            EPOCH
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_nanos() as u64
        }
    }
}

impl Measurement for Clock {
    type Intermediate = u64;
    type Value = Duration;

    fn start(&self) -> u64 {
        self.now_ns()
    }
    fn end(&self, start: u64) -> Duration {
        Duration::from_nanos(self.now_ns() - start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

type Crit = Criterion<Clock>;

/// Keys inserted in the cuckoo add/contains benchmarks: 95% of the 2^20 slots, the load a
/// 4-slot cuckoo table reaches reliably.
const CUCKOO_FILL: usize = N * 95 / 100;

fn bloom(c: &mut Crit) {
    let keys = keys(N, KEY_SEED);
    let fresh = keys_fresh();

    let mk_gbloom = || GBloom::with_capacity(N as u64, MAIN_FPR).unwrap();
    let mk_fast = || fastbloom::BloomFilter::with_false_pos(MAIN_FPR).expected_items(N);
    let mk_fast_xxh3 = || {
        fastbloom::BloomFilter::with_false_pos(MAIN_FPR)
            .hasher(Xxh3DefaultBuilder::new())
            .expected_items(N)
    };
    let mk_bf =
        || bloomfilter::Bloom::<[u8]>::new_for_fp_rate_with_seed(N, MAIN_FPR, &[7; 32]).unwrap();

    {
        let p = *mk_gbloom().params();
        let f = mk_fast();
        let b = mk_bf();
        eprintln!(
            "bloom sizing at fpr {MAIN_FPR}: GBloom m={} k={}; fastbloom m={} k={}; bloomfilter m={} k={}",
            p.bits,
            p.hashes,
            f.num_bits(),
            f.num_hashes(),
            b.len(),
            b.number_of_hash_functions()
        );
    }

    let mut g = c.benchmark_group("bloom_add");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("GBloom", |bch| {
        bch.iter_batched(
            mk_gbloom,
            |mut f| {
                for k in &keys {
                    f.add(k).unwrap();
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("fastbloom_default", |bch| {
        bch.iter_batched(
            mk_fast,
            |mut f| {
                for k in &keys {
                    f.insert(&k[..]);
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("fastbloom_xxh3_hasher", |bch| {
        bch.iter_batched(
            mk_fast_xxh3,
            |mut f| {
                for k in &keys {
                    f.insert(&k[..]);
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("fastbloom_xxh3_prehashed", |bch| {
        bch.iter_batched(
            mk_fast,
            |mut f| {
                for k in &keys {
                    f.insert_hash(xxh3_64(k));
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("bloomfilter", |bch| {
        bch.iter_batched(
            mk_bf,
            |mut f| {
                for k in &keys {
                    f.set(&k[..]);
                }
                f
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    // Filled filters for the queries.
    let mut gb = mk_gbloom();
    let mut fb = mk_fast();
    let mut fx = mk_fast_xxh3();
    let mut fp = mk_fast();
    let mut bf = mk_bf();
    for k in &keys {
        gb.add(k).unwrap();
        fb.insert(&k[..]);
        fx.insert(&k[..]);
        fp.insert_hash(xxh3_64(k));
        bf.set(&k[..]);
    }

    for (group, set) in [
        ("bloom_contains_hit", &keys),
        ("bloom_contains_miss", &fresh),
    ] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(N as u64));
        g.bench_function("GBloom", |b| {
            b.iter(|| set.iter().filter(|k| gb.contains(&k[..])).count())
        });
        g.bench_function("fastbloom_default", |b| {
            b.iter(|| set.iter().filter(|k| fb.contains(&k[..])).count())
        });
        g.bench_function("fastbloom_xxh3_hasher", |b| {
            b.iter(|| set.iter().filter(|k| fx.contains(&k[..])).count())
        });
        g.bench_function("fastbloom_xxh3_prehashed", |b| {
            b.iter(|| {
                set.iter()
                    .filter(|k| fp.contains_hash(xxh3_64(&k[..])))
                    .count()
            })
        });
        g.bench_function("bloomfilter", |b| {
            b.iter(|| set.iter().filter(|k| bf.check(&k[..])).count())
        });
        g.finish();
    }
}

fn keys_fresh() -> Vec<[u8; 16]> {
    keys(N, FRESH_SEED)
}

type CrateCuckoo = cuckoofilter::CuckooFilter<DefaultHasher>;

fn cuckoo(c: &mut Crit) {
    let keys = keys(N, KEY_SEED);
    let fresh = keys_fresh();
    let fill = &keys[..CUCKOO_FILL];

    let mk_gc = || GCuckoo::new(thesis_cuckoo()).unwrap();
    let mk_cf = || CrateCuckoo::with_capacity(N);
    // The ORCF on the same table (tags in every slot: its add writes one, its query does not).
    let mk_or = || OrCuckoo::new(thesis_cuckoo(), 1).unwrap();

    let mut g = c.benchmark_group("cuckoo_add");
    g.throughput(Throughput::Elements(CUCKOO_FILL as u64));
    g.bench_function("GCuckoo", |b| {
        b.iter_batched(
            mk_gc,
            |mut f| {
                let mut failed = 0usize;
                for k in fill {
                    failed += f.add(k).is_err() as usize;
                }
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("OrCuckoo", |b| {
        b.iter_batched(
            mk_or,
            |mut f| {
                let mut failed = 0usize;
                for k in fill {
                    failed += f.add(k).is_err() as usize;
                }
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("cuckoofilter", |b| {
        b.iter_batched(
            mk_cf,
            |mut f| {
                let mut failed = 0usize;
                for k in fill {
                    failed += f.add(&k[..]).is_err() as usize;
                }
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("GCuckoo_with_capacity_all_keys", |b| {
        b.iter_batched(
            || GCuckoo::with_capacity(N as u64, CUCKOO_FPR).unwrap(),
            |mut f| {
                let mut failed = 0usize;
                for k in &keys {
                    failed += f.add(k).is_err() as usize;
                }
                (f, black_box(failed))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let mut gc = mk_gc();
    let mut cf = mk_cf();
    let mut or = mk_or();
    let (mut gfail, mut cfail) = (0, 0);
    for k in fill {
        let _ = or.add(k);
        gfail += gc.add(k).is_err() as usize;
        cfail += cf.add(&k[..]).is_err() as usize;
    }
    eprintln!(
        "cuckoo fill of {CUCKOO_FILL} keys into 2^20 slots: GCuckoo {gfail} failed, cuckoofilter {cfail} failed"
    );

    for (group, set) in [
        ("cuckoo_contains_hit", fill),
        ("cuckoo_contains_miss", &fresh[..]),
    ] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(set.len() as u64));
        g.bench_function("GCuckoo", |b| {
            b.iter(|| set.iter().filter(|k| gc.contains(&k[..])).count())
        });
        g.bench_function("OrCuckoo", |b| {
            b.iter(|| set.iter().filter(|k| or.contains(&k[..])).count())
        });
        g.bench_function("cuckoofilter", |b| {
            b.iter(|| set.iter().filter(|k| cf.contains(&k[..])).count())
        });
        g.finish();
    }
}

/// Capacity of the large table of [`cuckoo_large`]: the API benchmark's, 64 MB of buckets.
const LARGE_CAPACITY: u64 = 30_000_000;
/// Keys added to it: a tenth of its capacity, where a node's filter spends most of its life.
const LARGE_KEYS: usize = 3_000_000;
/// Items per batch, as in the request API's `madd`/`mcontains` of the API benchmark.
const BATCH: usize = 100;

/// `op` on every key, a batch at a time, prefetching [`ReplicatedFilter::prefetch_ahead`]
/// items ahead as the node's batches do (`src/replica/actor/`).
fn batched<F: ReplicatedFilter>(f: &mut F, keys: &[[u8; 16]], op: impl FnMut(&mut F, &[u8])) {
    batched_with(f, keys, F::prefetch, op)
}

/// [`batched`] adds: prefetching what an add writes ([`ReplicatedFilter::prefetch_add`]), as
/// the node's `madd` does.
fn batched_adds<F: ReplicatedFilter>(f: &mut F, keys: &[[u8; 16]]) {
    batched_with(f, keys, F::prefetch_add, |f, k| f.add(k).unwrap())
}

fn batched_with<F: ReplicatedFilter>(
    f: &mut F,
    keys: &[[u8; 16]],
    prefetch: impl Fn(&F, &[u8]),
    mut op: impl FnMut(&mut F, &[u8]),
) {
    let ahead = f.prefetch_ahead();
    for batch in keys.chunks(BATCH) {
        batch.iter().take(ahead).for_each(|k| prefetch(f, k));
        for (i, k) in batch.iter().enumerate() {
            if let Some(next) = batch.get(i + ahead) {
                prefetch(f, next);
            }
            op(f, k);
        }
    }
}

/// Times `fill` on a fresh filter from `make`, which is left out of the time.
fn bench_fresh<F, M: Measurement>(
    g: &mut criterion::BenchmarkGroup<'_, M>,
    name: &str,
    make: impl Fn() -> F,
    fill: impl Fn(&mut F),
) {
    g.bench_function(name, |b| {
        b.iter_batched(
            &make,
            |mut f| {
                fill(&mut f);
                f
            },
            BatchSize::PerIteration,
        )
    });
}

/// A table too large for the caches, as a node's filter is: adds into a fresh table, and
/// lookups (half of them of added keys), one key at a time and in prefetched batches, beside
/// `cuckoofilter` one key at a time (it has no batch operation).
fn cuckoo_large(c: &mut Crit) {
    let added = keys(LARGE_KEYS, KEY_SEED);
    let lookups: Vec<[u8; 16]> = added
        .iter()
        .step_by(2)
        .chain(keys(LARGE_KEYS / 2, FRESH_SEED).iter())
        .copied()
        .collect();
    let mk_gc = || GCuckoo::with_capacity(LARGE_CAPACITY, MAIN_FPR).unwrap();
    let mk_cf = || CrateCuckoo::with_capacity(LARGE_CAPACITY as usize);

    let mut g = c.benchmark_group("cuckoo_large_add");
    g.throughput(Throughput::Elements(LARGE_KEYS as u64));
    // Failed adds are counted by the `cuckoo` groups; a tenth of capacity has none.
    bench_fresh(&mut g, "GCuckoo", mk_gc, |f| {
        added.iter().for_each(|k| {
            let _ = f.add(k);
        })
    });
    bench_fresh(&mut g, "GCuckoo_batches", mk_gc, |f| {
        batched_adds(f, &added)
    });
    bench_fresh(&mut g, "cuckoofilter", mk_cf, |f| {
        added.iter().for_each(|k| {
            let _ = f.add(&k[..]);
        })
    });
    g.finish();

    let mut gc = mk_gc();
    let mut cf = mk_cf();
    for k in &added {
        gc.add(k).unwrap();
        cf.add(&k[..]).unwrap();
    }
    let mut g = c.benchmark_group("cuckoo_large_contains");
    g.throughput(Throughput::Elements(lookups.len() as u64));
    g.bench_function("GCuckoo", |b| {
        b.iter(|| lookups.iter().filter(|k| gc.contains(&k[..])).count())
    });
    g.bench_function("GCuckoo_batches", |b| {
        b.iter(|| {
            let mut hits = 0;
            batched(&mut gc, &lookups, |f, k| hits += f.contains(k) as usize);
            hits
        })
    });
    g.bench_function("cuckoofilter", |b| {
        b.iter(|| lookups.iter().filter(|k| cf.contains(&k[..])).count())
    });
    g.finish();
}

/// Two replicas with 2^19 keys each (a 50-50 split of the 2^20 keys).
fn replicas<F: Membership>(mut make: impl FnMut(u16) -> F, keys: &[[u8; 16]]) -> (F, F) {
    let (a_keys, b_keys) = keys.split_at(keys.len() / 2);
    let mut a = make(1);
    let mut b = make(2);
    for k in a_keys {
        a.add(k).unwrap();
    }
    for k in b_keys {
        b.add(k).unwrap();
    }
    (a, b)
}

fn bench_merge<F: Lattice + Clone>(
    g: &mut criterion::BenchmarkGroup<'_, Clock>,
    name: &str,
    (a, b): &(F, F),
) {
    g.bench_function(name, |bch| {
        bch.iter_batched(
            || a.clone(),
            |mut x| {
                x.merge(b).unwrap();
                x
            },
            BatchSize::LargeInput,
        )
    });
}

fn merge(c: &mut Crit) {
    let keys = keys(N, KEY_SEED);
    let n = N as u64;

    let gbloom = replicas(|_| GBloom::with_capacity(n, MAIN_FPR).unwrap(), &keys);
    let words = gbloom.0.params().bits.div_ceil(64) as usize;

    let mut g = c.benchmark_group("merge");
    bench_merge(&mut g, "GBloom", &gbloom);

    // The floor for a Bloom merge: OR of two word arrays of the GBloom's size.
    let mut rng = fastrand::Rng::with_seed(3);
    let wa: Vec<u64> = (0..words).map(|_| rng.u64(..)).collect();
    let wb: Vec<u64> = (0..words).map(|_| rng.u64(..)).collect();
    g.bench_function("or_loop_vec_u64", |bch| {
        bch.iter_batched(
            || wa.clone(),
            |mut x| {
                for (a, b) in x.iter_mut().zip(black_box(&wb)) {
                    *a |= *b;
                }
                x
            },
            BatchSize::LargeInput,
        )
    });

    let base = fastbloom::BloomFilter::with_false_pos(MAIN_FPR).expected_items(N);
    let (fa, fb) = {
        let (mut a, mut b) = (base.clone(), base.clone());
        let (ka, kb) = keys.split_at(N / 2);
        ka.iter().for_each(|k| {
            a.insert(&k[..]);
        });
        kb.iter().for_each(|k| {
            b.insert(&k[..]);
        });
        (a, b)
    };
    g.bench_function("fastbloom_union", |bch| {
        bch.iter_batched(
            || fa.clone(),
            |mut x| {
                x.union(&fb);
                x
            },
            BatchSize::LargeInput,
        )
    });

    bench_merge(
        &mut g,
        "GCuckoo",
        &replicas(|_| GCuckoo::with_capacity(n, MAIN_FPR).unwrap(), &keys),
    );
    bench_merge(
        &mut g,
        "OrCuckoo",
        &replicas(|r| OrCuckoo::with_capacity(n, MAIN_FPR, r).unwrap(), &keys),
    );
    bench_merge(
        &mut g,
        "ScGBloom",
        &replicas(|_| ScGBloom::with_capacity(n, MAIN_FPR).unwrap(), &keys),
    );
    bench_merge(
        &mut g,
        "ScGCuckoo",
        &replicas(|_| ScGCuckoo::with_capacity(n, MAIN_FPR).unwrap(), &keys),
    );
    bench_merge(
        &mut g,
        "ScOrCuckoo",
        &replicas(
            |r| ScOrCuckoo::with_capacity(n, MAIN_FPR, r).unwrap(),
            &keys,
        ),
    );
    g.finish();
}

/// Keys of the batch-add benchmark: 1M into a table of [`LARGE_CAPACITY`], in batches of
/// [`BATCH`] as the node's `madd` gets them.
const BATCH_ADD_KEYS: usize = 1_000_000;
/// Pending delta entries at which the node commits a delta (`delta_max_updates`' default).
const DELTA_MAX_UPDATES: usize = 8192;
/// Keys between the deltas the `*_core` cases take: whole batches, about
/// [`DELTA_MAX_UPDATES`].
const DELTA_PART: usize = DELTA_MAX_UPDATES / BATCH * BATCH;

/// The node's `madd` (`src/replica/actor/updates.rs`, add mode `always`) on a replica's
/// [`crpf::replica::AnyFilter`] that tracks deltas, without the request and the lock around
/// it: per batch of [`BATCH`], each item prefetched `prefetch_ahead()` items ahead, the clock
/// checked against the tag reservation and the item added; and the delta taken (not encoded:
/// the actor encodes it outside the lock) once [`DELTA_MAX_UPDATES`] are pending.
#[cfg(feature = "node")]
fn madd_into(f: &mut crpf::replica::AnyFilter, keys: &[[u8; 16]]) -> usize {
    // The tag reservation's limit, which `madd` checks the clock against before each add.
    let limit = black_box(u64::MAX);
    let mut failed = 0;
    for batch in keys.chunks(BATCH) {
        let items: Vec<&[u8]> = batch.iter().map(|k| &k[..]).collect();
        f.tick(0);
        let ahead = f.prefetch_ahead();
        for (i, item) in items.iter().enumerate() {
            if ahead > 0 {
                if i == 0 {
                    items.iter().take(ahead).for_each(|k| f.prefetch_add(k));
                }
                if let Some(next) = items.get(i + ahead) {
                    f.prefetch_add(next);
                }
            }
            if f.clock() >= limit {
                break;
            }
            failed += f.add(item).is_err() as usize;
        }
        if f.pending_delta_len() >= DELTA_MAX_UPDATES {
            black_box(f.take_delta_unencoded());
        }
    }
    failed
}

/// Issue 25, point 5: `or_cuckoo`'s batch adds beside `g_cuckoo`'s, on the same capacity
/// (the API benchmark's 30M at fpr 0.01), keys and batches, through the replica's path with
/// delta tracking (`*_madd`, with the `node` feature) and on the core filter alone (`*_core`,
/// prefetched batches with delta tracking, a delta taken every [`DELTA_PART`] keys).
///
/// Into a filter that already holds [`BATCH_ADD_KEYS`] other keys, as a node's long-lived
/// filter does: the pages of a fresh table are zeroed by the kernel when first written, which
/// a fresh filter per iteration would count against its first keys (the ORCF's tag column
/// doubles what is zeroed).
fn batch_add(c: &mut Crit) {
    let added = keys(BATCH_ADD_KEYS, KEY_SEED);
    let warm = keys(BATCH_ADD_KEYS, FRESH_SEED);
    let mut g = c.benchmark_group("or_cuckoo_batch_add");
    g.throughput(Throughput::Elements(BATCH_ADD_KEYS as u64));
    #[cfg(feature = "node")]
    {
        use crpf::replica::{AnyFilter, FilterSpec};
        use crpf::wire::FilterKind;

        let any = |kind| {
            let warm = &warm;
            move || {
                let spec = FilterSpec::new(kind, LARGE_CAPACITY, MAIN_FPR);
                let mut f = AnyFilter::new(&spec, 1).unwrap();
                f.track_deltas(true);
                assert_eq!(madd_into(&mut f, warm), 0);
                black_box(f.take_delta_unencoded());
                f
            }
        };
        for (name, kind) in [
            ("g_cuckoo_madd", FilterKind::GCuckoo),
            ("or_cuckoo_madd", FilterKind::OrCuckoo),
        ] {
            bench_fresh(&mut g, name, any(kind), |f| {
                assert_eq!(madd_into(f, &added), 0);
            });
        }
    }
    fn core_adds<F: ReplicatedFilter>(f: &mut F, keys: &[[u8; 16]]) {
        for part in keys.chunks(DELTA_PART) {
            batched_adds(f, part);
            black_box(f.take_delta());
        }
    }
    fn warmed<F: ReplicatedFilter>(mut f: F, warm: &[[u8; 16]]) -> F {
        f.track_deltas(true);
        core_adds(&mut f, warm);
        f
    }
    bench_fresh(
        &mut g,
        "g_cuckoo_core",
        || {
            warmed(
                GCuckoo::with_capacity(LARGE_CAPACITY, MAIN_FPR).unwrap(),
                &warm,
            )
        },
        |f| core_adds(f, &added),
    );
    bench_fresh(
        &mut g,
        "or_cuckoo_core",
        || {
            warmed(
                OrCuckoo::with_capacity(LARGE_CAPACITY, MAIN_FPR, 1).unwrap(),
                &warm,
            )
        },
        |f| core_adds(f, &added),
    );
    g.finish();
}

fn config() -> Crit {
    Criterion::default()
        .with_measurement(Clock::from_env())
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bloom, cuckoo, cuckoo_large, merge, batch_add
}
criterion_main!(benches);
