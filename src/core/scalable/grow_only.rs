//! ScGBF and ScGCF (thesis Specs. 6 and 7): a series of grow-only sub-filters, adding to the
//! last one and expanding when it is full or, for cuckoo sub-filters, when an insertion fails.

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

/// A grow-only sub-filter kind a scalable series can build.
pub trait GrowOnlySub: SubFilter + DeltaState + Serialize + DeserializeOwned + fmt::Debug {
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

    fn add_expanding(&mut self, item: &[u8]) -> Result<(), FilterError> {
        if self.series.last_is_full() {
            self.force_expand()?;
        }
        let last = self.series.subs.last_mut().expect("expanded");
        match last.add(item) {
            Err(FilterError::Full { .. }) => {
                self.force_expand()?;
                self.series.subs.last_mut().expect("expanded").add(item)
            }
            other => other,
        }
    }

    /// Spec. 5 *forceExpand*: appends an empty sub-filter.
    fn force_expand(&mut self) -> Result<(), FilterError> {
        let mut next = F::build(&self.params, self.series.subs.len())?;
        next.track_deltas(self.tracking);
        self.series.subs.push(next);
        Ok(())
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
        (!subs.is_empty()).then_some(ScalableDelta { subs })
    }

    fn pending_delta_len(&self) -> usize {
        self.series.subs.iter().map(|f| f.pending_delta_len()).sum()
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
}

impl<F: GrowOnlySub> Serialize for ScalableGrowOnly<F> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ReprRef<'a, F> {
            params: &'a ScalableParams,
            subs: &'a [F],
        }
        ReprRef {
            params: &self.params,
            subs: &self.series.subs,
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
        Ok(Self {
            params,
            series: Series { subs: repr.subs },
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
