//! SFS, the scalable filter series (thesis Spec. 5): a list of sub-filters compared and merged
//! sub-filter-wise, the shorter list padded with bottom states.

use crate::core::error::FilterError;
use crate::core::lattice::{Lattice, Membership};

/// A sub-filter of a series: a lattice with a bottom state it can recognise.
pub trait SubFilter: Lattice + Membership + Clone {
    /// Whether the state is equivalent to a fresh, empty sub-filter.
    fn is_bottom(&self) -> bool;
}

impl SubFilter for crate::core::bloom::GBloom {
    fn is_bottom(&self) -> bool {
        self.ones() == 0
    }
}

impl SubFilter for crate::core::cuckoo::GCuckoo {
    fn is_bottom(&self) -> bool {
        self.cardinality() == 0.0
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Series<F> {
    pub subs: Vec<F>,
}

impl<F: SubFilter> Series<F> {
    pub(crate) fn contains(&self, item: &[u8]) -> bool {
        self.subs.iter().any(|f| f.contains(item))
    }

    /// Sub-filter-wise merge; sub-filters past our end are copied (merged into bottom).
    /// Callers check compatibility first, so that an error leaves `self` untouched.
    pub(crate) fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        for (i, theirs) in other.subs.iter().enumerate() {
            match self.subs.get_mut(i) {
                Some(mine) => mine.merge(theirs)?,
                None => self.subs.push(theirs.clone()),
            }
        }
        Ok(())
    }

    /// Sub-filter-wise `le`, padding the shorter series with bottom states.
    pub(crate) fn le(&self, other: &Self) -> bool {
        self.subs
            .iter()
            .enumerate()
            .all(|(i, mine)| match other.subs.get(i) {
                Some(theirs) => mine.le(theirs),
                None => mine.is_bottom(),
            })
    }

    pub(crate) fn cardinality(&self) -> f64 {
        self.subs.iter().map(|f| f.cardinality()).sum()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.subs
            .iter()
            .map(|f| f.capacity())
            .fold(0, u64::saturating_add)
    }

    /// Eq. 2.12: `1 - Π (1 - ε_i)` over the sub-filters' current estimates.
    pub(crate) fn compounded_fpr(&self) -> f64 {
        compound(self.subs.iter().map(|f| f.estimated_fpr()))
    }
}

/// `1 - Π (1 - ε_i)`.
pub(crate) fn compound(fprs: impl Iterator<Item = f64>) -> f64 {
    1.0 - fprs.map(|e| 1.0 - e).product::<f64>()
}

/// `cardinality / capacity`, 0 for an empty series.
pub(crate) fn load(cardinality: f64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        cardinality / capacity as f64
    }
}
