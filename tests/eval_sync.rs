//! The FPR experiment syncs replicas by exchanging delta-states; these tests check that this
//! gives what full-state merges give: equivalent states at every sync, and the same FPR.
#![cfg(feature = "eval")]

use crpf::eval::fpr::run_point;
use crpf::eval::variant::{Config, EvalFilter, Kind, VariantVisitor, variants};
use crpf::eval::workload::{FprRun, SyncMode, check_delta_sync};
use crpf::{FilterError, ReplicaId};

struct CheckSync(FprRun);

impl VariantVisitor for CheckSync {
    type Output = Result<u64, crpf::eval::EvalError>;
    fn visit<F, M>(self, make: M) -> Self::Output
    where
        F: EvalFilter,
        M: Fn(ReplicaId) -> Result<F, FilterError> + Sync,
    {
        check_delta_sync(make, &self.0)
    }
}

fn run(adds: u64, share_a: f64, interval: u64, sync: SyncMode, seed: u64) -> FprRun {
    FprRun {
        adds,
        probes: 1 << 15,
        share_a,
        interval: Some(interval),
        shared: false,
        sync,
        seed,
    }
}

#[test]
fn delta_sync_is_equivalent_to_full_state_join_at_every_sync() {
    // Small filters filled past capacity, so that cuckoo tables overflow and scalable series
    // grow while the replicas diverge between syncs.
    let adds = 1 << 12;
    let config = Config::thesis(adds);
    for v in variants(&Kind::ALL) {
        for (share_a, interval) in [(0.5, 97), (0.8, 1000)] {
            let r = run(adds, share_a, interval, SyncMode::Delta, 7);
            let checked = v
                .visit(&config, 11, CheckSync(r))
                .unwrap()
                .unwrap_or_else(|e| panic!("{v} split {share_a} every {interval}: {e}"));
            assert_eq!(checked, adds.div_ceil(interval), "{v}: syncs checked");
        }
    }
}

#[test]
fn delta_and_full_state_sync_give_the_same_fpr() {
    let adds = 1 << 15;
    let config = Config::thesis(adds);
    for v in variants(&Kind::ALL) {
        for interval in [300, 5000] {
            let delta =
                run_point(v, &config, &run(adds, 0.5, interval, SyncMode::Delta, 3)).unwrap();
            let full = run_point(v, &config, &run(adds, 0.5, interval, SyncMode::Full, 3)).unwrap();
            if v.kind == Kind::Gbf {
                // Bit sets: the same keys give the same state, whatever the sync.
                assert_eq!(delta.fpr, full.fpr, "{v}");
                continue;
            }
            // Cuckoo placement after a merge may differ (any of an entry's two buckets is
            // equivalent), so later kicks and rejected adds may too; the FPR may differ only by
            // noise. Same keys and probes: the difference is far below independent noise.
            let p = full.fpr;
            let tol = 3.0 * (2.0 * p * (1.0 - p) / (1u64 << 15) as f64).sqrt();
            assert!(
                (delta.fpr - full.fpr).abs() <= tol,
                "{v} every {interval}: delta {} vs full {}",
                delta.fpr,
                full.fpr
            );
            assert!(
                (delta.load_factor - full.load_factor).abs() < 0.01,
                "{v} every {interval}: load {} vs {}",
                delta.load_factor,
                full.load_factor
            );
        }
    }
}
