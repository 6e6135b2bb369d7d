//! GCF: the grow-only cuckoo filter (thesis Spec. 3, Algorithm 1).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::table::{Entry, Table, TableRepr};
use crate::core::delta::{CheckRemote, CuckooDelta, DeltaState};
use crate::core::error::FilterError;
use crate::core::hash::{cuckoo_position, hash_item};
use crate::core::kind::SetSum;
use crate::core::lattice::{Lattice, Membership};
use crate::core::params::CuckooParams;

/// A grow-only cuckoo filter (thesis Spec. 3). Its state is a set of `(bucket, fingerprint)`
/// entries ordered by inclusion of their *universes* (entries and their duals); merge adds the
/// other's entries not already present in either candidate bucket, `S ∪ (S' \ D(S))`, letting
/// buckets overflow when they must, since a merge cannot fail.
///
/// ```
/// use crpf::{GCuckoo, Lattice, Membership};
///
/// let mut a = GCuckoo::with_capacity(1000, 0.03)?;
/// let mut b = a.clone();
/// a.add(b"apple")?;
/// b.add(b"pear")?;
/// a.merge(&b)?;
/// assert!(a.contains(b"apple") && a.contains(b"pear"));
/// assert_eq!(a.cardinality(), 2.0);
/// assert!(b.le(&a) && !a.le(&b));
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct GCuckoo {
    table: Table<()>,
    /// Entries inserted by local adds since the last `take_delta`, while tracking.
    pending: Option<Vec<(u64, u16)>>,
    /// The sum of its distinct canonical entries ([`GCuckoo::for_each_canonical`]), kept as
    /// entries arrive: a pass over every entry took half a second at 8.6M entries, at every
    /// anti-entropy interval. Every insert is of an entry not yet contained, and kicks keep
    /// an entry's canonical (lower candidate) bucket, so adding each insert keeps it exact.
    digest: SetSum,
}

/// Adds one canonical entry to a digest. The element is the bucket (u64 LE) and then the
/// fingerprint (u16 LE), 10 bytes, hashed where it is built (see [`SetSum::add`]).
#[inline(always)]
fn add_to_digest(sum: &mut SetSum, canonical_bucket: u64, fp: u16) {
    let e = (canonical_bucket as u128 | (fp as u128) << 64).to_le_bytes();
    sum.add(&e[..10]);
}

impl GCuckoo {
    /// A filter for `capacity` elements at false positive rate `fpr`: 4-slot buckets, the
    /// fingerprint length from Eq. 2.10, 500 kicks.
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::new(CuckooParams::with_capacity(capacity, fpr)?)
    }

    /// A filter with explicit parameters.
    ///
    /// ```
    /// let p = crpf::CuckooParams { buckets: 1000, bucket_size: 4, fingerprint_bits: 12,
    ///                              max_kicks: 100, seed: 7 };
    /// let f = crpf::GCuckoo::new(p)?;
    /// assert_eq!(f.params().buckets, 1000);
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn new(params: CuckooParams) -> Result<Self, FilterError> {
        let params = params.validated()?;
        Ok(Self {
            table: Table::new(params, params.seed),
            pending: None,
            digest: SetSum::default(),
        })
    }

    /// Counts a newly inserted entry in the digest.
    fn inserted(&mut self, bucket: usize, fp: u16) {
        let canonical = bucket.min(self.table.alt(bucket, fp)) as u64;
        add_to_digest(&mut self.digest, canonical, fp);
    }

    /// The digest's sum from a pass over every entry (a decoded state's, whose entries may
    /// repeat).
    fn scanned_digest(&self) -> SetSum {
        let mut sum = SetSum::default();
        self.for_each_canonical(|b, fp| add_to_digest(&mut sum, b, fp));
        sum
    }

    /// The filter's parameters.
    pub fn params(&self) -> &CuckooParams {
        self.table.params()
    }

    /// Entries stored beyond their bucket's `c` slots (only merges create them).
    pub fn overflow_len(&self) -> usize {
        self.table.overflow_len()
    }

    #[inline]
    fn position(&self, item: &[u8]) -> (usize, u16) {
        let p = self.params();
        cuckoo_position(
            hash_item(item, p.seed),
            p.buckets,
            p.fingerprint_bits as u32,
        )
    }

    /// Calls `f(lower of its two candidate buckets, fingerprint)` once per distinct entry: the
    /// same set for every placement, so equivalent states give the same calls (its state
    /// digest is made of them). Without collecting or sorting them: an entry is
    /// skipped if an equal one comes earlier in its bucket or sits in its lower alternate
    /// bucket (whose turn came first), since equal entries can only sit in those two buckets.
    pub(crate) fn for_each_canonical(&self, mut f: impl FnMut(u64, u16)) {
        let t = &self.table;
        for b in 0..self.params().buckets as usize {
            for (k, e) in t.bucket_entries(b).enumerate() {
                let a = t.alt(b, e.fp);
                let dup = t.bucket_entries(b).take(k).any(|x| x.fp == e.fp)
                    || (a < b && t.bucket_has_fp(a, e.fp));
                if !dup {
                    f(b.min(a) as u64, e.fp);
                }
            }
        }
    }

    /// Merges one `(bucket, fingerprint)` entry of another replica (a delta-state entry).
    pub(crate) fn merge_entry(&mut self, bucket: usize, fp: u16) {
        if !self.table.contains_fp(bucket, fp) {
            self.table.place_merged(bucket, Entry { fp, payload: () });
            self.inserted(bucket, fp);
        }
    }
}

impl fmt::Debug for GCuckoo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GCuckoo")
            .field("params", self.params())
            .field("len", &self.table.len())
            .field("overflow", &self.table.overflow_len())
            .finish()
    }
}

impl Lattice for GCuckoo {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("cuckoo", self.params(), other.params())?;
        other.table.for_each(|b, e| self.merge_entry(b, e.fp));
        Ok(())
    }

    /// `U(S) ⊆ U(S')` (Eq. 3.4).
    fn le(&self, other: &Self) -> bool {
        if self.params() != other.params() {
            return false;
        }
        let mut all = true;
        self.table
            .for_each(|b, e| all &= other.table.contains_fp(b, e.fp));
        all
    }
}

impl Membership for GCuckoo {
    #[inline]
    fn contains(&self, item: &[u8]) -> bool {
        let (b, fp) = self.position(item);
        self.table.contains_fp(b, fp)
    }

    /// Adds the item unless it is already contained. `Err(Full)` leaves the filter as it was.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        let (b, fp) = self.position(item);
        if self.table.contains_fp(b, fp) {
            return Ok(());
        }
        self.table.insert(b, Entry { fp, payload: () })?;
        self.inserted(b, fp);
        if let Some(pending) = &mut self.pending {
            pending.push((b as u64, fp));
        }
        Ok(())
    }

    fn cardinality(&self) -> f64 {
        self.table.len() as f64
    }

    fn capacity(&self) -> u64 {
        self.table.slots() as u64
    }

    fn load_factor(&self) -> f64 {
        self.table.load_factor()
    }

    /// Eq. 3.7 at the table's average load factor, in its first-order form `2cᾱ/(2^l - 1)`:
    /// a GCF holds each fingerprint at most once per bucket pair, so a query matches at most
    /// one entry and the expected number of matches is the FPR itself (the power form would
    /// underestimate it by about `cᾱ/2^l`, 1.3% at 8 bits).
    fn estimated_fpr(&self) -> f64 {
        self.params().fpr_at_load_unique(self.load_factor())
    }
}

impl DeltaState for GCuckoo {
    type Delta = CuckooDelta;

    fn track_deltas(&mut self, on: bool) {
        self.pending = on.then(Vec::new);
    }

    fn take_delta(&mut self) -> Option<CuckooDelta> {
        let pending = self.pending.as_mut()?;
        (!pending.is_empty()).then(|| CuckooDelta {
            entries: std::mem::take(pending),
        })
    }

    fn pending_delta_len(&self) -> usize {
        self.pending.as_ref().map_or(0, Vec::len)
    }

    /// The item's entry, by its primary bucket (wherever a kick put it).
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        let (b, fp) = self.position(item);
        if !self.table.contains_fp(b, fp) {
            return false;
        }
        let Some(pending) = &mut self.pending else {
            return false;
        };
        pending.push((b as u64, fp));
        true
    }

    fn check_delta(&self, delta: &CuckooDelta) -> Result<(), FilterError> {
        check_cuckoo_delta(self.params(), delta)
    }

    fn merge_delta(&mut self, delta: &CuckooDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        for &(b, fp) in &delta.entries {
            self.merge_entry(b as usize, fp);
        }
        Ok(())
    }
}

/// Whether a delta fits a filter with these parameters (without needing the filter).
pub(crate) fn check_cuckoo_delta(p: &CuckooParams, delta: &CuckooDelta) -> Result<(), FilterError> {
    match delta.entries.iter().find(|(b, fp)| !p.holds_entry(*b, *fp)) {
        Some(bad) => Err(FilterError::malformed(format!(
            "delta entry {bad:?} out of range"
        ))),
        None => Ok(()),
    }
}

impl CheckRemote for GCuckoo {
    /// Grow-only: no tags, nothing to check.
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &CuckooDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct GCuckooRepr {
    params: CuckooParams,
    table: TableRepr,
}

impl Serialize for GCuckoo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        GCuckooRepr {
            params: *self.params(),
            table: self.table.to_repr(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for GCuckoo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = GCuckooRepr::deserialize(d)?;
        let table = Table::from_repr(
            repr.params,
            &repr.table,
            |n| Ok(vec![(); n]),
            repr.params.seed,
        )
        .map_err(serde::de::Error::custom)?;
        let mut f = GCuckoo {
            table,
            pending: None,
            digest: SetSum::default(),
        };
        f.digest = f.scanned_digest();
        Ok(f)
    }
}

impl crate::core::kind::ReplicatedFilter for GCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::GCuckoo;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        GCuckoo::new(spec.cuckoo_params()?)
    }

    fn params_digest(&self) -> u64 {
        self.params().digest()
    }

    fn prefetch(&self, item: &[u8]) {
        let (b, fp) = self.position(item);
        self.table.prefetch(b, fp);
    }

    fn prefetch_ahead(&self) -> usize {
        crate::core::prefetch::CUCKOO_ITEMS_AHEAD
    }

    /// Its distinct entries, canonically placed, as an order-free sum: placements differ
    /// between equivalent states. Kept as entries arrive, so a digest reads no entry.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        self.digest.finish(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kind::ReplicatedFilter;

    #[test]
    fn a_digest_element_is_bucket_then_fingerprint_in_ten_bytes() {
        // Digests are compared between replicas of different builds: the element's bytes
        // must not change with how they are put together.
        let mut built = SetSum::default();
        add_to_digest(&mut built, 0x0807_0605_0403_0201, 0x0a09);
        let mut spelled = SetSum::default();
        spelled.add(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(built, spelled);
    }

    fn params() -> CuckooParams {
        // Few buckets, so that adds kick entries around and merges spill into overflow.
        CuckooParams {
            buckets: 16,
            bucket_size: 4,
            fingerprint_bits: 8,
            max_kicks: 50,
            seed: 5,
        }
    }

    fn check(f: &GCuckoo) {
        assert_eq!(f.digest, f.scanned_digest(), "kept digest drifted");
    }

    #[test]
    fn the_kept_digest_is_the_scanned_one_through_adds_kicks_merges_and_decoding() {
        let (mut a, mut b) = (
            GCuckoo::new(params()).unwrap(),
            GCuckoo::new(params()).unwrap(),
        );
        b.track_deltas(true);
        for i in 0..200u32 {
            // Some adds fail (a full table) and must leave the digest as they leave the table.
            let _ = a.add(&i.to_le_bytes());
            let _ = b.add(&(i + 100).to_le_bytes());
            check(&a);
            check(&b);
        }
        let delta = b.take_delta().expect("b added");
        let mut c = a.clone();
        c.merge_delta(&delta).unwrap();
        check(&c);
        a.merge(&b).unwrap();
        check(&a);
        assert!(a.overflow_len() > 0, "merges spilled into overflow");
        let decoded: GCuckoo = serde_cbor::from_slice(&serde_cbor::to_vec(&a).unwrap()).unwrap();
        check(&decoded);
        let digest = |f: &GCuckoo| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            f.digest_state(&mut h);
            h.digest()
        };
        assert_eq!(digest(&decoded), digest(&a));
        // Equivalent states with other placements: the same digest.
        let mut d = b.clone();
        d.merge(&a).unwrap();
        assert!(d.le(&a) && a.le(&d));
        assert_eq!(digest(&d), digest(&a));
    }
}
