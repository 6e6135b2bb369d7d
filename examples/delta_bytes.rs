//! The bytes a delta of each sketch kind carries per update (issue 50), at the shapes
//! `scripts/resp-vs-redisbloom.sh` measures: a count-min sketch of 2000 x 5, a top 50 of
//! 2000 x 5, a t-digest of compression 100. For each kind, `n` updates of random items
//! (integers below 10^8, as `redis-benchmark -r 100000000` draws them; the t-digest adds them as
//! values) go into one delta, encoded as a replica publishes it (the body of the envelope,
//! without its header and signature); printed: the delta's bytes and bytes per update.
//! A replica sends one delta per `delta_interval_ms` (or sooner, at `delta_max_updates`) with
//! every update since the last, so `n` is the updates per interval. The state is warm: 100,000
//! updates before, their deltas taken every 1,000.
//!
//!     cargo run --release --example delta_bytes

use crpf::replica::{AnyFilter, FilterSpec};

fn main() {
    let kinds = [
        ("count_min_sketch 2000x5", FilterSpec::count_min(2000, 5)),
        ("top_k 50 2000x5", FilterSpec::top_k(50, 2000, 5, 0.9)),
        ("t_digest 100", FilterSpec::t_digest(100)),
    ];
    println!(
        "{:<24} {:>8} {:>12} {:>14}",
        "kind", "updates", "delta bytes", "bytes/update"
    );
    for (name, spec) in &kinds {
        for n in [1u64, 16, 256, 4096, 65536] {
            let mut f = AnyFilter::new(spec, 3).unwrap();
            let mut rng = fastrand::Rng::with_seed(50);
            // A warm state first, as a replica under load holds it: 100,000 updates, a delta
            // taken every 1,000 (a t-digest's part then has its 8 segments), then the measured
            // updates.
            f.track_deltas(true);
            for i in 0..100_000 {
                f.add(rng.u64(0..100_000_000).to_string().as_bytes())
                    .unwrap();
                if i % 1000 == 999 {
                    f.take_delta();
                }
            }
            for _ in 0..n {
                f.add(rng.u64(0..100_000_000).to_string().as_bytes())
                    .unwrap();
            }
            let delta = f.take_delta().map_or(0, |d| d.len());
            println!(
                "{name:<24} {n:>8} {delta:>12} {:>14.2}",
                delta as f64 / n as f64
            );
        }
    }
}
