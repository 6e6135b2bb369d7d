//! The Figure 6.1 workload (thesis 6.2.1) on two replicas of one filter type: random 16-byte
//! keys added on replica A or B by a seeded coin, a sync every `interval` operations and a
//! final one, then the FPR of the merged state on keys never inserted.

use std::time::Instant;

use serde::Serialize;

use super::error::EvalError;
use super::variant::EvalFilter;
use crate::{FilterError, ReplicaId};

/// How the two replicas exchange state at a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Each sends the delta-state of its adds since the last sync. A sync makes the replicas
    /// equivalent, so these deltas cover everything the other lacks and the result is
    /// equivalent to a full-state merge (checked by [`check_delta_sync`]).
    Delta,
    /// Each merges the other's full state (10-30 ms per merge of a 2^20-slot cuckoo table).
    Full,
}

/// One run of the workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FprRun {
    /// Number of adds, split between the replicas.
    pub adds: u64,
    /// Number of fresh keys the merged state is queried with.
    pub probes: u64,
    /// Probability that an add goes to replica A (0.5 for a 50-50 split, 1.0 for all local).
    pub share_a: f64,
    /// Operations between syncs; `None` syncs only once, at the end.
    pub interval: Option<u64>,
    /// One shared filter takes every add (the ordinary filter): no second replica, no sync.
    pub shared: bool,
    /// How replicas sync.
    pub sync: SyncMode,
    /// Seed of the keys, the split coin and the probes.
    pub seed: u64,
}

/// What one run measured, on the merged state after the final sync.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FprOutcome {
    /// Adds the filters rejected (`FilterError::Full`); the keys are not in the filter.
    pub failed_adds: u64,
    /// Probes reported as contained.
    pub false_positives: u64,
    /// `false_positives / probes`.
    pub fpr: f64,
    /// The filter's own estimate ([`crate::Membership::estimated_fpr`]).
    pub estimated_fpr: f64,
    /// [`crate::Membership::load_factor`].
    pub load_factor: f64,
    /// [`crate::Membership::cardinality`].
    pub cardinality: f64,
    /// Entries in overflowing buckets.
    pub overflow: usize,
    /// Number of sub-filters.
    pub sub_filters: usize,
    /// Syncs done, the final one included.
    pub syncs: u64,
    /// Delta syncs where a replica rejected the other's delta and the two merged full states.
    pub full_fallbacks: u64,
    /// Wall time of the run in milliseconds.
    pub millis: u64,
}

/// Generates the workload's keys: uniform 128-bit integers (thesis 6.1), little-endian.
#[derive(Debug, Clone)]
pub struct Keys(fastrand::Rng);

impl Keys {
    /// Keys of the insert stream of a run.
    pub fn inserts(seed: u64) -> Self {
        Keys(fastrand::Rng::with_seed(seed))
    }
    /// Keys of the probe stream: an independent stream, so that probes are never inserted
    /// keys (a collision of two random 128-bit keys has probability about 2^-88 here).
    pub fn probes(seed: u64) -> Self {
        Keys(fastrand::Rng::with_seed(seed ^ 0x7072_6f62_6573_2121))
    }
    /// The next key.
    pub fn next_key(&mut self) -> [u8; 16] {
        self.0.u128(..).to_le_bytes()
    }
    /// A uniform number in `[0, 1)` from the same stream.
    pub fn coin(&mut self) -> f64 {
        self.0.f64()
    }
    /// A uniform index below `n`.
    pub fn index(&mut self, n: usize) -> usize {
        self.0.usize(..n)
    }
}

/// Syncs the two replicas so that both end in (a state equivalent to) `a ⊔ b`. Returns
/// whether a delta sync had to fall back to full states.
fn sync<F: EvalFilter>(a: &mut F, b: &mut F, mode: SyncMode) -> Result<bool, FilterError> {
    match mode {
        SyncMode::Delta => {
            let (da, db) = (a.take_delta(), b.take_delta());
            // A receiver rejects a delta it cannot place (a scalable filter's delta creating
            // sub-filters too far past its own last one). Replicas then catch up by merging
            // full states, as anti-entropy would; the rejected delta is covered by the state.
            let a_ok = db.is_none_or(|d| a.merge_delta(&d).is_ok());
            let b_ok = da.is_none_or(|d| b.merge_delta(&d).is_ok());
            if !a_ok {
                a.merge(b)?;
            }
            if !b_ok {
                b.merge(a)?;
            }
            Ok(!(a_ok && b_ok))
        }
        SyncMode::Full => {
            a.merge(b)?;
            // `a` now holds `a ⊔ b`, and `b ⊔ (a ⊔ b) = a ⊔ b`: one merge less to clone.
            b.merge(a)?;
            Ok(false)
        }
    }
}

/// Runs the workload: adds with a sync every `interval` operations and a final sync, then
/// probes the merged state. `make(r)` builds replica `r`'s empty state (A is 0, B is 1).
pub fn run_fpr<F: EvalFilter>(
    make: impl Fn(ReplicaId) -> Result<F, FilterError>,
    run: &FprRun,
) -> Result<FprOutcome, EvalError> {
    run_with_hook(make, run, |_, _| Ok(()))
}

/// As [`run_fpr`], calling `before_sync(a, b)` before every sync.
fn run_with_hook<F: EvalFilter>(
    make: impl Fn(ReplicaId) -> Result<F, FilterError>,
    run: &FprRun,
    mut before_sync: impl FnMut(&F, &F) -> Result<(), EvalError>,
) -> Result<FprOutcome, EvalError> {
    if run.adds == 0 || run.probes == 0 {
        return Err(EvalError::Options("a run needs adds and probes".into()));
    }
    let start = Instant::now();
    let (mut a, mut b) = (make(0)?, make(1)?);
    if run.sync == SyncMode::Delta {
        a.track_deltas(true);
        b.track_deltas(true);
    }
    let mut keys = Keys::inserts(run.seed);
    let share_a = if run.shared { 1.0 } else { run.share_a };
    let mut failed_adds = 0;
    let mut syncs = 0;
    let mut full_fallbacks = 0;
    for op in 1..=run.adds {
        let key = keys.next_key();
        let target = if keys.coin() < share_a {
            &mut a
        } else {
            &mut b
        };
        match target.add(&key) {
            Ok(()) => {}
            Err(FilterError::Full { .. }) => failed_adds += 1,
            Err(e) => return Err(e.into()),
        }
        if !run.shared && run.interval.is_some_and(|i| op % i == 0) && op != run.adds {
            before_sync(&a, &b)?;
            full_fallbacks += u64::from(sync(&mut a, &mut b, run.sync)?);
            syncs += 1;
        }
    }
    if !run.shared {
        before_sync(&a, &b)?;
        full_fallbacks += u64::from(sync(&mut a, &mut b, run.sync)?);
        syncs += 1;
    }

    let mut probes = Keys::probes(run.seed);
    let false_positives = (0..run.probes)
        .filter(|_| a.contains(&probes.next_key()))
        .count() as u64;
    Ok(FprOutcome {
        failed_adds,
        false_positives,
        fpr: false_positives as f64 / run.probes as f64,
        estimated_fpr: a.estimated_fpr(),
        load_factor: a.load_factor(),
        cardinality: a.cardinality(),
        overflow: a.overflow(),
        sub_filters: a.sub_filters(),
        syncs,
        full_fallbacks,
        millis: start.elapsed().as_millis() as u64,
    })
}

/// Runs the workload with delta syncs and checks, at every sync, that delta-syncing the two
/// replicas gives states equivalent to the full-state join `a ⊔ b` of their states before the
/// sync. Returns the number of syncs checked. Expensive (clones and a full merge per sync):
/// meant for small configurations in tests.
pub fn check_delta_sync<F: EvalFilter>(
    make: impl Fn(ReplicaId) -> Result<F, FilterError>,
    run: &FprRun,
) -> Result<u64, EvalError> {
    let mut checked = 0;
    let run = FprRun {
        sync: SyncMode::Delta,
        ..*run
    };
    run_with_hook(make, &run, |a, b| {
        let mut join = a.clone();
        join.merge(b)?;
        // Clones carry the pending deltas, so this is the sync the run is about to do.
        let (mut a2, mut b2) = (a.clone(), b.clone());
        sync(&mut a2, &mut b2, SyncMode::Delta)?;
        if !(a2.equivalent(&join) && b2.equivalent(&join)) {
            return Err(EvalError::Check(format!(
                "delta sync {checked} is not equivalent to the full-state join"
            )));
        }
        checked += 1;
        Ok(())
    })?;
    Ok(checked)
}
