//! Parameters of a scalable series and of each of its sub-filters.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::core::error::FilterError;
use crate::core::hash::HASH_VERSION;
use crate::core::params::{
    BloomParams, CuckooParams, DEFAULT_SEED, MAX_FINGERPRINT_BITS, check_capacity, check_fpr,
    check_kicks, check_memory,
};

/// Parameters of a scalable filter: sub-filter `i` holds `initial_capacity * growth^i`
/// elements at FPR `fpr * (1 - tightening) * tightening^i`, so the compounded FPR stays under
/// `fpr` (Eq. 2.12). Every sub-filter's parameters follow from these, so replicas agree on them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalableParams {
    /// Elements the first sub-filter holds.
    pub initial_capacity: u64,
    /// Bound on the compounded false positive rate.
    pub fpr: f64,
    /// Capacity ratio of successive sub-filters (2 by default).
    pub growth: u32,
    /// FPR ratio `q` of successive sub-filters, in (0, 1) (0.5 by default).
    pub tightening: f64,
    /// Slots per bucket of cuckoo sub-filters.
    pub bucket_size: u8,
    /// Kick quota of cuckoo sub-filters.
    pub max_kicks: u32,
    /// Hash seed of the first sub-filter; sub-filter `i` uses `seed + i`, so that their false
    /// positives are independent.
    pub seed: u64,
}

impl ScalableParams {
    /// Most sub-filters a series may have. Sub-filter parameters are defined for indexes below
    /// it only; a full series fails its adds with [`FilterError::TooManySubFilters`]. (With the
    /// default growth of 2, the last one would hold `2^63` times the first capacity.)
    pub const MAX_SUB_FILTERS: usize = 64;

    /// Defaults for the given first capacity and compounded FPR bound.
    ///
    /// ```
    /// let p = crpf::ScalableParams::with_capacity(1000, 0.01)?;
    /// assert_eq!((p.growth, p.tightening), (2, 0.5));
    /// assert!(p.sub_fpr(0) + p.sub_fpr(1) + p.sub_fpr(2) < 0.01);
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn with_capacity(initial_capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self {
            initial_capacity,
            fpr,
            growth: 2,
            tightening: 0.5,
            bucket_size: CuckooParams::DEFAULT_BUCKET_SIZE,
            max_kicks: CuckooParams::DEFAULT_MAX_KICKS,
            seed: DEFAULT_SEED,
        }
        .validated()
    }

    /// Checks the parameters; every constructor goes through here.
    pub fn validated(self) -> Result<Self, FilterError> {
        check_capacity(self.initial_capacity)?;
        check_fpr(self.fpr)?;
        if self.growth == 0 {
            return Err(FilterError::invalid("growth", "must be at least 1"));
        }
        if !(self.tightening > 0.0 && self.tightening < 1.0) {
            return Err(FilterError::invalid(
                "tightening",
                format!("{} is not in (0, 1)", self.tightening),
            ));
        }
        if self.bucket_size == 0 {
            return Err(FilterError::invalid("bucket_size", "must be at least 1"));
        }
        check_kicks(self.max_kicks)?;
        Ok(self)
    }

    /// Target FPR of sub-filter `i`.
    pub fn sub_fpr(&self, i: usize) -> f64 {
        self.fpr * (1.0 - self.tightening) * self.tightening.powi(i as i32)
    }

    /// Elements sub-filter `i` is designed for.
    pub fn sub_capacity(&self, i: usize) -> u64 {
        (self.growth as u64)
            .checked_pow(i as u32)
            .and_then(|g| g.checked_mul(self.initial_capacity))
            .unwrap_or(u64::MAX >> 8)
    }

    fn sub_seed(&self, i: usize) -> u64 {
        self.seed.wrapping_add(i as u64)
    }

    /// Parameters of Bloom sub-filter `i`: an error if `i` is not below
    /// [`Self::MAX_SUB_FILTERS`], or if sub-filters `0..=i` together would take more than
    /// [`crate::MAX_FILTER_BYTES`] ([`FilterError::TooLarge`]). Every expansion and every decoded
    /// sub-filter goes through here, so that a series can never outgrow the bound.
    pub fn bloom(&self, i: usize) -> Result<BloomParams, FilterError> {
        self.within_bounds(i, Self::bloom_alone, BloomParams::memory_bytes)
    }

    /// Parameters of cuckoo sub-filter `i`, with the bounds of [`ScalableParams::bloom`]: one
    /// more fingerprint bit per halving of the FPR, up to the 16 bits the tables store (past
    /// that the compounded bound no longer holds, and [`crate::Membership::estimated_fpr`] says
    /// so).
    pub fn cuckoo(&self, i: usize) -> Result<CuckooParams, FilterError> {
        self.within_bounds(i, Self::cuckoo_alone, CuckooParams::memory_bytes)
    }

    /// Sub-filter `i`'s parameters from `alone`, if `i` is below the sub-filter limit and the
    /// series up to and including it stays within the memory limit.
    fn within_bounds<P>(
        &self,
        i: usize,
        alone: impl Fn(&Self, usize) -> Result<P, FilterError>,
        bytes: impl Fn(&P) -> u64,
    ) -> Result<P, FilterError> {
        if i >= Self::MAX_SUB_FILTERS {
            return Err(FilterError::TooManySubFilters {
                limit: Self::MAX_SUB_FILTERS,
            });
        }
        let mut total = 0u64;
        for j in 0..i {
            total = total.saturating_add(bytes(&alone(self, j)?));
        }
        let p = alone(self, i)?;
        check_memory(total.saturating_add(bytes(&p)))?;
        Ok(p)
    }

    fn bloom_alone(&self, i: usize) -> Result<BloomParams, FilterError> {
        Ok(BloomParams::with_capacity(
            self.sub_capacity(i),
            self.sub_fpr(i).max(f64::MIN_POSITIVE),
        )?
        .with_seed(self.sub_seed(i)))
    }

    fn cuckoo_alone(&self, i: usize) -> Result<CuckooParams, FilterError> {
        let c = self.bucket_size;
        let bits = (2.0 * c as f64 / self.sub_fpr(i))
            .log2()
            .ceil()
            .clamp(1.0, MAX_FINGERPRINT_BITS as f64);
        let fpr_at_bits = 2.0 * c as f64 / 2f64.powi(bits as i32);
        let p = CuckooParams::with_capacity_and_bucket_size(
            self.sub_capacity(i),
            fpr_at_bits.min(0.999),
            c,
        )?;
        CuckooParams {
            fingerprint_bits: bits as u8,
            max_kicks: self.max_kicks,
            seed: self.sub_seed(i),
            ..p
        }
        .validated()
    }

    /// A stable digest of the parameters and hash version.
    pub fn digest(&self) -> u64 {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(b"scalable");
        b.extend_from_slice(&HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.initial_capacity.to_le_bytes());
        b.extend_from_slice(&self.fpr.to_bits().to_le_bytes());
        b.extend_from_slice(&self.growth.to_le_bytes());
        b.extend_from_slice(&self.tightening.to_bits().to_le_bytes());
        b.push(self.bucket_size);
        b.extend_from_slice(&self.max_kicks.to_le_bytes());
        b.extend_from_slice(&self.seed.to_le_bytes());
        xxh3_64(&b)
    }
}
