//! ScGBF and ScGCF (thesis Specs. 6 and 7): a series of grow-only sub-filters, adding to the
//! last one and expanding when it is full or, for cuckoo sub-filters, when an insertion fails.
//!
//! When a Bloom sub-filter is full: a cuckoo table counts its entries exactly, a Bloom
//! filter's estimate from its bits is off by a few percent either way (about 2% at 100
//! items), so a series filled to exactly its capacities grew a sub-filter early about half the
//! time, doubling its memory where RedisBloom's does not grow. A Bloom series therefore also
//! counts the items its own adds put into each sub-filter (`added`, merged by maximum: one
//! writer's counts only rise) and grows when the last one counted its capacity, as RedisBloom
//! does. The count is part of the state (and of deltas), so the schedule is a function of
//! the merged state; where a count is missing (states of earlier releases) or lags (a series
//! several replicas add to, each counting its own), the estimate still bounds the fill: at
//! [`ESTIMATE_SLACK`] past the capacity with a count, at the capacity without one. The counts
//! are a growth schedule, not membership: the order (`le`) and digests ignore them, so that
//! states with the same bits are equivalent whatever they counted.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::params::ScalableParams;
use super::series::{Series, SubFilter, load};
use crate::core::bloom::{GBloom, check_bloom_delta};
use crate::core::cuckoo::{GCuckoo, check_cuckoo_delta};
use crate::core::delta::{CheckRemote, DeltaState, MAX_SUBS_AHEAD, ScalableDelta};
use crate::core::error::FilterError;
use crate::core::lattice::{Lattice, Membership};

/// With a count of its items, a Bloom sub-filter is also full once its estimate is this far
/// past its capacity (a fraction): more than 4 standard deviations of the estimate at a
/// capacity of 100 (fewer below), so that it only acts where the count lags.
pub(crate) const ESTIMATE_SLACK: f64 = 0.1;

/// A grow-only sub-filter kind a scalable series can build.
pub trait GrowOnlySub: SubFilter + DeltaState + Serialize + DeserializeOwned + fmt::Debug {
    /// Whether the series counts the items added into each sub-filter to tell when it is full
    /// (the Bloom sub-filters, whose cardinality is an estimate).
    #[doc(hidden)]
    const COUNTS_ADDS: bool;
    #[doc(hidden)]
    fn build(params: &ScalableParams, index: usize) -> Result<Self, FilterError>;
    #[doc(hidden)]
    fn built_by(&self, params: &ScalableParams, index: usize) -> bool;
    /// Whether sub-filter `index` can be built, without allocating it.
    #[doc(hidden)]
    fn check_build(params: &ScalableParams, index: usize) -> Result<(), FilterError>;
    /// [`DeltaState::check_delta`] against sub-filter `index` that does not exist yet, without
    /// allocating it.
    #[doc(hidden)]
    fn check_delta_at(
        params: &ScalableParams,
        index: usize,
        delta: &Self::Delta,
    ) -> Result<(), FilterError>;
}

impl GrowOnlySub for GBloom {
    const COUNTS_ADDS: bool = true;
    fn build(params: &ScalableParams, index: usize) -> Result<Self, FilterError> {
        GBloom::new(params.bloom(index)?)
    }
    fn built_by(&self, params: &ScalableParams, index: usize) -> bool {
        params.bloom(index).is_ok_and(|p| &p == self.params())
    }
    fn check_build(params: &ScalableParams, index: usize) -> Result<(), FilterError> {
        params.bloom(index).map(|_| ())
    }
    fn check_delta_at(
        params: &ScalableParams,
        index: usize,
        delta: &Self::Delta,
    ) -> Result<(), FilterError> {
        check_bloom_delta(&params.bloom(index)?, delta)
    }
}

impl GrowOnlySub for GCuckoo {
    const COUNTS_ADDS: bool = false;
    fn build(params: &ScalableParams, index: usize) -> Result<Self, FilterError> {
        GCuckoo::new(params.cuckoo(index)?)
    }
    fn built_by(&self, params: &ScalableParams, index: usize) -> bool {
        params.cuckoo(index).is_ok_and(|p| &p == self.params())
    }
    fn check_build(params: &ScalableParams, index: usize) -> Result<(), FilterError> {
        params.cuckoo(index).map(|_| ())
    }
    fn check_delta_at(
        params: &ScalableParams,
        index: usize,
        delta: &Self::Delta,
    ) -> Result<(), FilterError> {
        check_cuckoo_delta(&params.cuckoo(index)?, delta)
    }
}

/// A scalable grow-only filter over sub-filters of type `F` (see [`ScGBloom`], [`ScGCuckoo`]).
#[derive(Clone)]
pub struct ScalableGrowOnly<F> {
    params: ScalableParams,
    series: Series<F>,
    /// Items this series' adds put into each sub-filter, where known ([`GrowOnlySub::COUNTS_ADDS`]
    /// kinds only; see the [module documentation](self)). At most as long as the series.
    added: Vec<Option<u64>>,
    /// Whether sub-filters record delta-states.
    tracking: bool,
}

/// Scalable grow-only Bloom filter (thesis Spec. 6).
///
/// ```
/// use crpf::{Lattice, Membership, ScGBloom};
///
/// let mut a = ScGBloom::with_capacity(100, 0.01)?;
/// let mut b = a.clone();
/// for i in 0..1000u32 { a.add(&i.to_le_bytes())?; }   // grows past its first capacity
/// b.add(b"other")?;
/// a.merge(&b)?;
/// assert!(a.sub_filters() > 1);
/// assert!(a.contains(b"other") && a.contains(&999u32.to_le_bytes()));
/// assert!(a.estimated_fpr() <= 0.01);
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub type ScGBloom = ScalableGrowOnly<GBloom>;

/// Scalable grow-only cuckoo filter (thesis Spec. 7).
///
/// ```
/// use crpf::{Lattice, Membership, ScGCuckoo};
///
/// let mut a = ScGCuckoo::with_capacity(100, 0.05)?;
/// for i in 0..1000u32 { a.add(&i.to_le_bytes())?; }   // expands when an insert fails
/// assert!(a.sub_filters() > 1);
/// assert!((0..1000u32).all(|i| a.contains(&i.to_le_bytes())));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub type ScGCuckoo = ScalableGrowOnly<GCuckoo>;

impl<F: GrowOnlySub> ScalableGrowOnly<F> {
    /// A series whose first sub-filter holds `initial_capacity` elements, with compounded FPR
    /// bounded by `fpr`.
    pub fn with_capacity(initial_capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::new(ScalableParams::with_capacity(initial_capacity, fpr)?)
    }

    /// A series with explicit parameters. Its first sub-filter is allocated at the first add.
    pub fn new(params: ScalableParams) -> Result<Self, FilterError> {
        let params = params.validated()?;
        F::check_build(&params, 0)?; // fail now, not at the first add
        Ok(Self {
            params,
            series: Series { subs: Vec::new() },
            added: Vec::new(),
            tracking: false,
        })
    }

    /// The series' parameters.
    pub fn params(&self) -> &ScalableParams {
        &self.params
    }

    /// Number of sub-filters.
    pub fn sub_filters(&self) -> usize {
        self.series.subs.len()
    }

    /// The sub-filters, oldest first.
    pub fn subs(&self) -> &[F] {
        &self.series.subs
    }

    /// Items counted into sub-filter `i`, if known.
    pub fn added(&self, i: usize) -> Option<u64> {
        self.added.get(i).copied().flatten()
    }

    /// Spec. 5's *expand* condition on the last sub-filter (none: full): its count reached
    /// its capacity or, as a bound should the count lag, its estimate passed it by
    /// [`ESTIMATE_SLACK`]; without a count, its estimate reached it.
    fn last_is_full(&self) -> bool {
        let Some(last) = self.series.subs.last() else {
            return true;
        };
        let capacity = last.capacity() as f64;
        match self.added(self.series.subs.len() - 1) {
            Some(n) => {
                n as f64 >= capacity || last.cardinality() >= capacity * (1.0 + ESTIMATE_SLACK)
            }
            None => last.cardinality() >= capacity,
        }
    }

    fn add_expanding(&mut self, item: &[u8]) -> Result<(), FilterError> {
        if self.last_is_full() {
            self.force_expand()?;
        }
        let last = self.series.subs.last_mut().expect("expanded");
        let result = match last.add(item) {
            Err(FilterError::Full { .. }) => {
                self.force_expand()?;
                self.series.subs.last_mut().expect("expanded").add(item)
            }
            other => other,
        };
        if result.is_ok() {
            let i = self.series.subs.len() - 1;
            if let Some(Some(n)) = self.added.get_mut(i) {
                *n += 1;
            }
        }
        result
    }

    /// Spec. 5 *forceExpand*: appends an empty sub-filter, whose count (of the kinds that
    /// count) starts at 0: only adds of this series fill it.
    fn force_expand(&mut self) -> Result<(), FilterError> {
        let mut next = F::build(&self.params, self.series.subs.len())?;
        next.track_deltas(self.tracking);
        self.series.subs.push(next);
        if F::COUNTS_ADDS {
            self.added.resize(self.series.subs.len() - 1, None);
            self.added.push(Some(0));
        }
        Ok(())
    }

    /// Joins counts `(index, items)` into ours: the larger where both know one.
    fn join_added(&mut self, theirs: impl Iterator<Item = (usize, u64)>) {
        for (i, n) in theirs {
            if i >= self.series.subs.len() {
                continue; // never past the series (callers merged its sub-filters first)
            }
            if self.added.len() <= i {
                self.added.resize(i + 1, None);
            }
            let mine = &mut self.added[i];
            *mine = Some(mine.map_or(n, |m| m.max(n)));
        }
    }
}

impl<F: GrowOnlySub> fmt::Debug for ScalableGrowOnly<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScalableGrowOnly")
            .field("params", &self.params)
            .field("subs", &self.series.subs)
            .finish()
    }
}

impl<F: GrowOnlySub> Lattice for ScalableGrowOnly<F> {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("scalable", &self.params, &other.params)?;
        let known = self.series.subs.len();
        self.series.merge(&other.series)?;
        // Sub-filters copied from the other side must not carry its pending deltas.
        for sub in &mut self.series.subs[known..] {
            sub.track_deltas(self.tracking);
        }
        let theirs = other.added.iter().enumerate();
        self.join_added(theirs.filter_map(|(i, n)| n.map(|n| (i, n))));
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params == other.params && self.series.le(&other.series)
    }
}

impl<F: GrowOnlySub> Membership for ScalableGrowOnly<F> {
    fn contains(&self, item: &[u8]) -> bool {
        self.series.contains(item)
    }

    /// Specs. 6 and 7: no-op if contained; otherwise add to the last sub-filter, expanding
    /// first if it is full and again if the insertion fails. An error changes nothing.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        if self.contains(item) {
            return Ok(());
        }
        let subs_before = self.series.subs.len();
        let result = self.add_expanding(item);
        if result.is_err() {
            // Failed insertions roll themselves back; only sub-filters this call appended
            // remain to drop, so that a failed add leaves the filter exactly as it was.
            self.series.subs.truncate(subs_before);
            self.added.truncate(subs_before);
        }
        result
    }

    fn cardinality(&self) -> f64 {
        self.series.cardinality()
    }

    /// Total capacity of the sub-filters (that of the first one while there is none).
    fn capacity(&self) -> u64 {
        self.series.capacity().max(self.params.initial_capacity)
    }

    fn load_factor(&self) -> f64 {
        load(self.cardinality(), self.capacity())
    }

    /// Eq. 2.12 over the sub-filters' current estimates.
    fn estimated_fpr(&self) -> f64 {
        self.series.compounded_fpr()
    }
}

impl<F: GrowOnlySub> DeltaState for ScalableGrowOnly<F> {
    type Delta = ScalableDelta<F::Delta>;

    fn track_deltas(&mut self, on: bool) {
        self.tracking = on;
        for sub in &mut self.series.subs {
            sub.track_deltas(on);
        }
    }

    fn take_delta(&mut self) -> Option<Self::Delta> {
        let subs: Vec<(u32, F::Delta)> = (self.series.subs.iter_mut().enumerate())
            .filter_map(|(i, f)| f.take_delta().map(|d| (i as u32, d)))
            .collect();
        // An add that counted set bits, so its sub-filter has a delta to carry the count.
        let added = (subs.iter())
            .filter_map(|(i, _)| self.added(*i as usize).map(|n| (*i, n)))
            .collect();
        (!subs.is_empty()).then_some(ScalableDelta { subs, added })
    }

    fn pending_delta_len(&self) -> usize {
        self.series.subs.iter().map(|f| f.pending_delta_len()).sum()
    }

    /// The item's footprint in the first sub-filter that holds it (an add skips an item any
    /// of them holds). Replaying it recreates the sub-filters before that one, if need be.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        (self.series.subs.iter_mut())
            .find(|f| f.contains(item))
            .is_some_and(|f| f.record_footprint(item))
    }

    fn check_delta(&self, delta: &Self::Delta) -> Result<(), FilterError> {
        let known = self.series.subs.len();
        let mut prev: Option<u32> = None;
        for (i, d) in &delta.subs {
            let i_us = *i as usize;
            if prev.is_some_and(|p| p >= *i) || i_us >= known + MAX_SUBS_AHEAD {
                return Err(FilterError::malformed(format!(
                    "delta for sub-filter {i} out of order or too far ahead of {known}"
                )));
            }
            prev = Some(*i);
            match self.series.subs.get(i_us) {
                Some(f) => f.check_delta(d)?,
                None => F::check_delta_at(&self.params, i_us, d)?,
            }
        }
        // Counts only of the sub-filters the delta carries, in order.
        let mut prev: Option<u32> = None;
        for (i, _) in &delta.added {
            if prev.is_some_and(|p| p >= *i) || !delta.subs.iter().any(|(j, _)| j == i) {
                return Err(FilterError::malformed(format!(
                    "delta counts sub-filter {i} out of order or without its delta"
                )));
            }
            prev = Some(*i);
        }
        Ok(())
    }

    fn merge_delta(&mut self, delta: &Self::Delta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for (i, d) in &delta.subs {
            while self.series.subs.len() <= *i as usize {
                self.force_expand()?;
            }
            self.series.subs[*i as usize].merge_delta(d)?;
        }
        self.join_added(delta.added.iter().map(|(i, n)| (*i as usize, *n)));
        Ok(())
    }
}

impl<F: GrowOnlySub> CheckRemote for ScalableGrowOnly<F> {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &Self::Delta) -> Result<(), FilterError> {
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(bound(deserialize = "F: DeserializeOwned"))]
struct Repr<F> {
    params: ScalableParams,
    subs: Vec<F>,
    /// Absent in states of earlier releases and of the kinds that do not count.
    #[serde(default)]
    added: Vec<Option<u64>>,
}

impl<F: GrowOnlySub> Serialize for ScalableGrowOnly<F> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ReprRef<'a, F> {
            params: &'a ScalableParams,
            subs: &'a [F],
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            added: &'a [Option<u64>],
        }
        ReprRef {
            params: &self.params,
            subs: &self.series.subs,
            added: &self.added,
        }
        .serialize(s)
    }
}

impl<'de, F: GrowOnlySub> Deserialize<'de> for ScalableGrowOnly<F> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = Repr::<F>::deserialize(d)?;
        let params = repr.params.validated().map_err(serde::de::Error::custom)?;
        F::check_build(&params, 0).map_err(serde::de::Error::custom)?;
        if let Some(i) = repr
            .subs
            .iter()
            .enumerate()
            .position(|(i, f)| !f.built_by(&params, i))
        {
            return Err(serde::de::Error::custom(FilterError::malformed(format!(
                "sub-filter {i} does not have the parameters of its position"
            ))));
        }
        if repr.added.len() > repr.subs.len() || (!F::COUNTS_ADDS && !repr.added.is_empty()) {
            return Err(serde::de::Error::custom(FilterError::malformed(
                "counts of sub-filters the series does not have",
            )));
        }
        Ok(Self {
            params,
            series: Series { subs: repr.subs },
            added: repr.added,
            tracking: false,
        })
    }
}

impl crate::core::kind::ReplicatedFilter for ScGBloom {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::ScGBloom;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        ScGBloom::new(crate::core::kind::scalable_params(spec)?)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    /// The sub-filters holding anything, by index: an empty sub-filter equals none.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        for (i, sub) in self.subs().iter().enumerate().filter(|(_, s)| s.ones() > 0) {
            h.update(&(i as u64).to_le_bytes());
            sub.digest_state(h);
        }
    }

    fn sub_filters(&self) -> usize {
        ScalableGrowOnly::sub_filters(self)
    }
}

impl crate::core::kind::ReplicatedFilter for ScGCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::ScGCuckoo;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        ScGCuckoo::new(crate::core::kind::scalable_params(spec)?)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    /// The sub-filters holding anything, by index, each canonically.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        for (i, sub) in self.subs().iter().enumerate() {
            if sub.cardinality() > 0.0 {
                h.update(&(i as u64).to_le_bytes());
                sub.digest_state(h);
            }
        }
    }

    fn sub_filters(&self) -> usize {
        ScalableGrowOnly::sub_filters(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(capacity: u64, fpr: f64, growth: u32) -> ScGBloom {
        ScGBloom::new(ScalableParams {
            growth,
            ..ScalableParams::with_capacity(capacity, fpr).unwrap()
        })
        .unwrap()
    }

    fn fill(f: &mut ScGBloom, set: u32, n: u32) {
        for i in 0..n {
            f.add(format!("{set}-{i}").as_bytes()).unwrap();
        }
    }

    fn counted(f: &ScGBloom) -> u64 {
        (0..f.sub_filters()).filter_map(|i| f.added(i)).sum()
    }

    /// Adds items of `set` until the series counted `total` (as RedisBloom, an item that is
    /// already a false positive is not added, nor counted).
    fn fill_to(f: &mut ScGBloom, set: &str, total: u64) {
        let mut i = 0;
        while counted(f) < total {
            f.add(format!("{set}-{i}").as_bytes()).unwrap();
            i += 1;
        }
    }

    /// Issue 49: RedisBloom's schedule. Filled to exactly its capacities, a series has exactly
    /// the sub-filters they need, for every item set (the estimate alone grew one early about
    /// half the time), and grows at the next item.
    #[test]
    fn a_bloom_series_fills_each_sub_filter_to_its_capacity() {
        for set in 0..20 {
            for (capacity, fpr, growth, subs) in [
                (100, 0.01, 2, 2),
                (1000, 0.0001, 2, 1),
                (100, 0.01, 4, 2),
                (50, 0.01, 1, 3),
            ] {
                let mut f = series(capacity, fpr, growth);
                let full: u64 = (0..subs).map(|i| f.params().sub_capacity(i)).sum();
                fill_to(&mut f, &set.to_string(), full);
                assert_eq!(f.sub_filters(), subs, "{capacity} {growth} set {set}");
                assert_eq!(f.added(subs - 1), Some(f.params().sub_capacity(subs - 1)));
                fill_to(&mut f, &format!("{set}-next"), full + 1);
                assert_eq!(f.sub_filters(), subs + 1, "{capacity} {growth} set {set}");
            }
        }
    }

    /// Any growth keeps the compounded FPR bound (the sub-filters' FPRs shrink geometrically
    /// whatever their sizes).
    #[test]
    fn any_growth_keeps_the_fpr_bound() {
        for growth in [1, 3, 4, 10] {
            let mut f = series(100, 0.01, growth);
            fill(&mut f, 0, 3_000);
            assert!(f.sub_filters() > 1, "{growth}");
            assert!(f.estimated_fpr() <= 0.01, "{growth}: {}", f.estimated_fpr());
            let sizes: Vec<u64> = f.subs().iter().map(|s| s.capacity()).collect();
            assert!(
                sizes.windows(2).all(|w| w[1] == w[0] * growth as u64),
                "{sizes:?}"
            );
        }
    }

    /// The counts travel in states and deltas, so that whoever continues the series (a writer
    /// restarting from a peer's state) grows where the series would have.
    #[test]
    fn counts_travel_in_states_and_deltas_and_merge_by_maximum() {
        let mut a = series(100, 0.01, 2);
        a.track_deltas(true);
        fill_to(&mut a, "1", 150);
        let delta = a.take_delta().unwrap();
        assert_eq!(delta.added, vec![(0, 100), (1, 50)]);
        let mut by_delta = series(100, 0.01, 2);
        by_delta.merge_delta(&delta).unwrap();
        let mut by_state = series(100, 0.01, 2);
        by_state.merge(&a).unwrap();
        let bytes = serde_cbor::ser::to_vec_packed(&a).unwrap();
        let decoded: ScGBloom = serde_cbor::from_slice(&bytes).unwrap();
        for mut b in [by_delta, by_state, decoded] {
            assert_eq!((b.added(0), b.added(1)), (Some(100), Some(50)));
            fill_to(&mut b, "2", 300);
            assert_eq!(b.sub_filters(), 2);
            fill_to(&mut b, "3", 301);
            assert_eq!(b.sub_filters(), 3);
        }
    }

    /// A state of an earlier release has no counts: it decodes, and its sub-filters are full
    /// by the estimate as before; sub-filters it grows count.
    #[test]
    fn a_state_without_counts_decodes_and_grows_by_its_estimate() {
        let mut a = series(100, 0.01, 2);
        fill(&mut a, 3, 50);
        // What earlier releases encoded: the parameters and the sub-filters.
        #[derive(Serialize)]
        struct Earlier<'a> {
            params: &'a ScalableParams,
            subs: &'a [GBloom],
        }
        let earlier = Earlier {
            params: a.params(),
            subs: a.subs(),
        };
        let bytes = serde_cbor::ser::to_vec_packed(&earlier).unwrap();
        let mut b: ScGBloom = serde_cbor::from_slice(&bytes).unwrap();
        assert_eq!(b.added(0), None);
        let mut n = 50;
        while b.sub_filters() == 1 {
            b.add(format!("3-{n}").as_bytes()).unwrap();
            n += 1;
        }
        assert!(b.subs()[0].cardinality() >= 100.0);
        assert_eq!(b.added(1), Some(1));
        assert!(b.equivalent(&{
            let mut c: ScGBloom = serde_cbor::from_slice(&bytes).unwrap();
            c.merge(&b).unwrap();
            c
        }));
    }
}
