//! The traits every filter implements: the lattice of the thesis (compare and merge) and
//! the approximate-membership operations.

use super::error::FilterError;

/// A join semilattice: the state order and its least upper bound (thesis Spec. 1, *compare* and
/// *merge*).
///
/// Laws every implementation keeps (property-tested for every filter):
/// merge is idempotent, commutative and associative up to equivalence (`a ≡ b` iff
/// `a.le(b) && b.le(a)`); `a.le(&(a ⊔ b))`; `a.le(b)` iff `a ⊔ b ≡ b`.
pub trait Lattice {
    /// `self := self ⊔ other`. States with different parameters give
    /// [`FilterError::Incompatible`] and leave `self` untouched.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError>;
    /// `self ≤ other` in the state order. `false` for states with different parameters.
    fn le(&self, other: &Self) -> bool;
    /// `self ≡ other`: each is `le` the other.
    fn equivalent(&self, other: &Self) -> bool {
        self.le(other) && other.le(self)
    }
}

/// Approximate membership over byte-string items.
pub trait Membership {
    /// `true` if the item may have been added; `false` means it certainly was not (or was removed).
    fn contains(&self, item: &[u8]) -> bool;
    /// Adds the item. On error the filter is exactly as it was before the call.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError>;
    /// Adds the item and says whether it was absent before (`contains` was false): RedisBloom's
    /// "new" answer. A Bloom filter tells it from the bits it had to set, in the same pass.
    fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError> {
        let new = !self.contains(item);
        self.add(item)?;
        Ok(new)
    }
    /// Estimated number of elements (Eq. 3.20 for Bloom filters, entries for cuckoo filters).
    fn cardinality(&self) -> f64;
    /// Number of elements the filter is designed for (Bloom) or slots it has (cuckoo).
    fn capacity(&self) -> u64;
    /// `cardinality / capacity`: how full the filter is.
    fn load_factor(&self) -> f64;
    /// Estimated false positive rate of the current state (Eq. 3.1, 3.7 or 2.12).
    fn estimated_fpr(&self) -> f64;
}

/// Filters that support removal (observed-remove semantics).
pub trait Removable {
    /// Removes one occurrence of the item; `false` if it was not contained.
    fn remove(&mut self, item: &[u8]) -> bool;
}
