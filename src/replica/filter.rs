//! [`AnyFilter`]: one of the six core filters behind one type, so that a replica, its wire
//! messages and its snapshots handle every kind alike.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::wire::{FilterKind, WireError, from_cbor, to_cbor};
use crate::{
    BloomParams, CausalContext, CheckRemote, CuckooParams, DEFAULT_SEED, DeltaState, Dot,
    FilterError, GBloom, GCuckoo, Lattice, Membership, OrCuckoo, ReplicaId, ScGBloom, ScGCuckoo,
    ScOrCuckoo, ScalableParams,
};

/// Which filter a replica holds and how it is sized. Every replica of a filter must use the same
/// spec: the parameter digest on the wire enforces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilterSpec {
    /// The filter type.
    pub kind: FilterKind,
    /// Elements the filter holds (scalable kinds: its first sub-filter).
    pub capacity: u64,
    /// Target false positive rate (scalable kinds: the compounded bound).
    pub fpr: f64,
    /// Hash seed; [`DEFAULT_SEED`] if absent.
    #[serde(default)]
    pub seed: Option<u64>,
}

impl FilterSpec {
    /// A spec with the default seed.
    pub fn new(kind: FilterKind, capacity: u64, fpr: f64) -> Self {
        FilterSpec {
            kind,
            capacity,
            fpr,
            seed: None,
        }
    }
}

/// The statistics of a filter (and the `stats` reply of the request API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilterStats {
    /// Filter type.
    pub kind: FilterKind,
    /// Estimated number of elements.
    pub cardinality: f64,
    /// Design capacity (Bloom) or slots (cuckoo).
    pub capacity: u64,
    /// `cardinality / capacity`.
    pub load_factor: f64,
    /// Estimated false positive rate.
    pub estimated_fpr: f64,
    /// Sub-filters of a scalable filter (1 otherwise).
    pub sub_filters: usize,
    /// Highest tag timestamp this replica may have issued (0 for kinds without tags).
    pub clock: u64,
}

/// Attempt to remove from a grow-only filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {0} filter does not support remove")]
pub struct NotRemovable(pub FilterKind);

/// One of the six filter types.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum AnyFilter {
    /// GBF
    GBloom(GBloom),
    /// GCF
    GCuckoo(GCuckoo),
    /// ORCF
    OrCuckoo(OrCuckoo),
    /// ScGBF
    ScGBloom(ScGBloom),
    /// ScGCF
    ScGCuckoo(ScGCuckoo),
    /// ScORCF
    ScOrCuckoo(ScOrCuckoo),
}

macro_rules! each {
    ($self:expr, $f:ident => $e:expr) => {
        match $self {
            AnyFilter::GBloom($f) => $e,
            AnyFilter::GCuckoo($f) => $e,
            AnyFilter::OrCuckoo($f) => $e,
            AnyFilter::ScGBloom($f) => $e,
            AnyFilter::ScGCuckoo($f) => $e,
            AnyFilter::ScOrCuckoo($f) => $e,
        }
    };
}

/// A remote state or delta refused before merging: tags of our own id ahead of our clock
/// (which would exhaust it) have their own reason.
pub(crate) fn remote_error(e: FilterError) -> WireError {
    match e {
        FilterError::OwnDotAhead { .. } => WireError::OwnTagAhead(e.to_string()),
        e => incompatible(e),
    }
}

fn incompatible(e: FilterError) -> WireError {
    WireError::Incompatible(e.to_string())
}

impl AnyFilter {
    /// An empty filter built from the spec; OR kinds issue tags as `replica`.
    ///
    /// ```
    /// use crpf::replica::{AnyFilter, FilterSpec};
    /// use crpf::wire::FilterKind;
    ///
    /// let mut f = AnyFilter::new(&FilterSpec::new(FilterKind::OrCuckoo, 1000, 0.01), 1)?;
    /// let dot = f.add(b"x")?.expect("OR filters tag their adds");
    /// assert_eq!((dot.replica, dot.counter), (1, 1));
    /// assert!(f.contains(b"x"));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn new(spec: &FilterSpec, replica: ReplicaId) -> Result<Self, FilterError> {
        let seed = spec.seed.unwrap_or(DEFAULT_SEED);
        let bloom =
            || BloomParams::with_capacity(spec.capacity, spec.fpr).map(|p| p.with_seed(seed));
        let cuckoo =
            || CuckooParams::with_capacity(spec.capacity, spec.fpr).map(|p| p.with_seed(seed));
        let scalable = || {
            ScalableParams::with_capacity(spec.capacity, spec.fpr)
                .and_then(|p| ScalableParams { seed, ..p }.validated())
        };
        Ok(match spec.kind {
            FilterKind::GBloom => AnyFilter::GBloom(GBloom::new(bloom()?)?),
            FilterKind::GCuckoo => AnyFilter::GCuckoo(GCuckoo::new(cuckoo()?)?),
            FilterKind::OrCuckoo => AnyFilter::OrCuckoo(OrCuckoo::new(cuckoo()?, replica)?),
            FilterKind::ScGBloom => AnyFilter::ScGBloom(ScGBloom::new(scalable()?)?),
            FilterKind::ScGCuckoo => AnyFilter::ScGCuckoo(ScGCuckoo::new(scalable()?)?),
            FilterKind::ScOrCuckoo => AnyFilter::ScOrCuckoo(ScOrCuckoo::new(scalable()?, replica)?),
        })
    }

    /// The filter type.
    pub fn kind(&self) -> FilterKind {
        match self {
            AnyFilter::GBloom(_) => FilterKind::GBloom,
            AnyFilter::GCuckoo(_) => FilterKind::GCuckoo,
            AnyFilter::OrCuckoo(_) => FilterKind::OrCuckoo,
            AnyFilter::ScGBloom(_) => FilterKind::ScGBloom,
            AnyFilter::ScGCuckoo(_) => FilterKind::ScGCuckoo,
            AnyFilter::ScOrCuckoo(_) => FilterKind::ScOrCuckoo,
        }
    }

    /// Digest of the parameters (the envelope's `params_digest`).
    pub fn params_digest(&self) -> u64 {
        match self {
            AnyFilter::GBloom(f) => f.params().digest(),
            AnyFilter::GCuckoo(f) => f.params().digest(),
            AnyFilter::OrCuckoo(f) => f.params().digest(),
            AnyFilter::ScGBloom(f) => f.params().digest(),
            AnyFilter::ScGCuckoo(f) => f.params().digest(),
            AnyFilter::ScOrCuckoo(f) => f.params().digest(),
        }
    }

    /// Membership test.
    pub fn contains(&self, item: &[u8]) -> bool {
        each!(self, f => f.contains(item))
    }

    /// Adds the item; OR kinds return the tag they issued.
    pub fn add(&mut self, item: &[u8]) -> Result<Option<Dot>, FilterError> {
        match self {
            AnyFilter::OrCuckoo(f) => f.add_dot(item).map(Some),
            AnyFilter::ScOrCuckoo(f) => f.add_dot(item).map(Some),
            other => each!(other, f => f.add(item)).map(|_| None),
        }
    }

    /// Removes one occurrence of the item (OR kinds only); `Ok(None)` if it was not contained.
    pub fn remove(&mut self, item: &[u8]) -> Result<Option<Dot>, NotRemovable> {
        match self {
            AnyFilter::OrCuckoo(f) => Ok(f.remove_dot(item)),
            AnyFilter::ScOrCuckoo(f) => Ok(f.remove_dot(item)),
            other => Err(NotRemovable(other.kind())),
        }
    }

    /// Current figures.
    pub fn stats(&self) -> FilterStats {
        let sub_filters = match self {
            AnyFilter::ScGBloom(f) => f.sub_filters(),
            AnyFilter::ScGCuckoo(f) => f.sub_filters(),
            AnyFilter::ScOrCuckoo(f) => f.sub_filters(),
            _ => 1,
        };
        each!(self, f => FilterStats {
            kind: self.kind(),
            cardinality: f.cardinality(),
            capacity: f.capacity(),
            load_factor: f.load_factor(),
            estimated_fpr: f.estimated_fpr(),
            sub_filters,
            clock: self.clock(),
        })
    }

    /// Starts or stops recording local updates as a delta.
    pub fn track_deltas(&mut self, on: bool) {
        each!(self, f => f.track_deltas(on))
    }

    /// Number of updates in the pending delta.
    pub fn pending_delta_len(&self) -> usize {
        each!(self, f => f.pending_delta_len())
    }

    /// The pending delta, encoded, or `None` if nothing changed.
    pub fn take_delta(&mut self) -> Option<Vec<u8>> {
        each!(self, f => f.take_delta().map(|d| to_cbor(&d)))
    }

    /// Decodes and joins an encoded delta; a delta that does not decode or fit changes nothing.
    pub fn merge_delta_bytes(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.merge_delta_bytes_checked(bytes, false)
    }

    /// As [`AnyFilter::merge_delta_bytes`] for a delta received from another replica: first
    /// rejects one carrying tags of this replica's own id above its clock
    /// ([`CheckRemote::check_remote_delta`], [`FilterError::OwnDotAhead`], here as
    /// [`WireError::Incompatible`]).
    pub fn merge_remote_delta_bytes(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.merge_delta_bytes_checked(bytes, true)
    }

    fn merge_delta_bytes_checked(&mut self, bytes: &[u8], remote: bool) -> Result<(), WireError> {
        each!(self, f => {
            let d = from_cbor(bytes)?;
            if remote {
                f.check_remote_delta(&d).map_err(remote_error)?;
            }
            f.merge_delta(&d).map_err(incompatible)
        })
    }

    /// [`CheckRemote::check_remote`] of a state received from another replica, to call before
    /// merging it: [`FilterError::OwnDotAhead`] if it carries tags of this replica's own id
    /// above its clock; [`FilterError::Incompatible`] across kinds.
    pub fn check_remote_state(&self, other: &AnyFilter) -> Result<(), FilterError> {
        match (self, other) {
            (AnyFilter::GBloom(a), AnyFilter::GBloom(b)) => a.check_remote(b),
            (AnyFilter::GCuckoo(a), AnyFilter::GCuckoo(b)) => a.check_remote(b),
            (AnyFilter::OrCuckoo(a), AnyFilter::OrCuckoo(b)) => a.check_remote(b),
            (AnyFilter::ScGBloom(a), AnyFilter::ScGBloom(b)) => a.check_remote(b),
            (AnyFilter::ScGCuckoo(a), AnyFilter::ScGCuckoo(b)) => a.check_remote(b),
            (AnyFilter::ScOrCuckoo(a), AnyFilter::ScOrCuckoo(b)) => a.check_remote(b),
            (a, b) => Err(FilterError::Incompatible(format!(
                "{} state checked against a {} filter",
                b.kind(),
                a.kind()
            ))),
        }
    }

    /// The full state, encoded.
    pub fn encode_state(&self) -> Vec<u8> {
        each!(self, f => to_cbor(f))
    }

    /// [`AnyFilter::encode_state`] into a buffer of `capacity` bytes to start with: with the
    /// size of the last encoding, a large state's buffer is not regrown (each doubling holds
    /// the old and the new buffer for a moment).
    pub fn encode_state_sized(&self, capacity: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(capacity);
        let mut ser = serde_cbor::Serializer::new(&mut out).packed_format();
        each!(self, f => f.serialize(&mut ser)).expect("CBOR into a Vec cannot fail");
        out
    }

    /// Decodes a full state of the given kind (validated by the core: never panics).
    pub fn decode_state(kind: FilterKind, bytes: &[u8]) -> Result<Self, WireError> {
        Ok(match kind {
            FilterKind::GBloom => AnyFilter::GBloom(from_cbor(bytes)?),
            FilterKind::GCuckoo => AnyFilter::GCuckoo(from_cbor(bytes)?),
            FilterKind::OrCuckoo => AnyFilter::OrCuckoo(from_cbor(bytes)?),
            FilterKind::ScGBloom => AnyFilter::ScGBloom(from_cbor(bytes)?),
            FilterKind::ScGCuckoo => AnyFilter::ScGCuckoo(from_cbor(bytes)?),
            FilterKind::ScOrCuckoo => AnyFilter::ScOrCuckoo(from_cbor(bytes)?),
        })
    }

    /// `self := self ⊔ other`; other kinds or parameters give an error and change nothing.
    pub fn merge(&mut self, other: &AnyFilter) -> Result<(), FilterError> {
        match (self, other) {
            (AnyFilter::GBloom(a), AnyFilter::GBloom(b)) => a.merge(b),
            (AnyFilter::GCuckoo(a), AnyFilter::GCuckoo(b)) => a.merge(b),
            (AnyFilter::OrCuckoo(a), AnyFilter::OrCuckoo(b)) => a.merge(b),
            (AnyFilter::ScGBloom(a), AnyFilter::ScGBloom(b)) => a.merge(b),
            (AnyFilter::ScGCuckoo(a), AnyFilter::ScGCuckoo(b)) => a.merge(b),
            (AnyFilter::ScOrCuckoo(a), AnyFilter::ScOrCuckoo(b)) => a.merge(b),
            (a, b) => Err(FilterError::Incompatible(format!(
                "{} state merged into a {} filter",
                b.kind(),
                a.kind()
            ))),
        }
    }

    /// `self ≤ other`; `false` across kinds.
    pub fn le(&self, other: &AnyFilter) -> bool {
        match (self, other) {
            (AnyFilter::GBloom(a), AnyFilter::GBloom(b)) => a.le(b),
            (AnyFilter::GCuckoo(a), AnyFilter::GCuckoo(b)) => a.le(b),
            (AnyFilter::OrCuckoo(a), AnyFilter::OrCuckoo(b)) => a.le(b),
            (AnyFilter::ScGBloom(a), AnyFilter::ScGBloom(b)) => a.le(b),
            (AnyFilter::ScGCuckoo(a), AnyFilter::ScGCuckoo(b)) => a.le(b),
            (AnyFilter::ScOrCuckoo(a), AnyFilter::ScOrCuckoo(b)) => a.le(b),
            _ => false,
        }
    }

    /// `le` both ways.
    pub fn equivalent(&self, other: &AnyFilter) -> bool {
        self.le(other) && other.le(self)
    }

    /// A digest that is equal for equivalent states whatever their layout (cuckoo placements,
    /// tags' slots), so that anti-entropy can tell replicas that agree from ones that do not.
    /// It reads the state in place: Bloom words are hashed as they are, and the entries of
    /// cuckoo kinds and the tags of OR kinds go into an order-free sum of per-entry hashes,
    /// so that a filter of hundreds of megabytes is neither encoded nor collected to digest it.
    pub fn state_digest(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(&self.params_digest().to_le_bytes());
        match self {
            AnyFilter::GBloom(f) => h.update(&f.bit_bytes()),
            AnyFilter::GCuckoo(f) => digest_cuckoo(&mut h, f),
            AnyFilter::ScGBloom(f) => {
                for (i, sub) in f.subs().iter().enumerate().filter(|(_, s)| s.ones() > 0) {
                    h.update(&(i as u64).to_le_bytes());
                    h.update(&sub.bit_bytes());
                }
            }
            AnyFilter::ScGCuckoo(f) => {
                for (i, sub) in f.subs().iter().enumerate() {
                    if sub.cardinality() > 0.0 {
                        h.update(&(i as u64).to_le_bytes());
                        digest_cuckoo(&mut h, sub);
                    }
                }
            }
            AnyFilter::OrCuckoo(_) | AnyFilter::ScOrCuckoo(_) => {
                // An ORCF state is its history and its live tags (a tag names one entry).
                let mut sum = SetSum::default();
                match self {
                    AnyFilter::OrCuckoo(f) => f.for_each_tag(|t| sum.add(&t.to_le_bytes())),
                    AnyFilter::ScOrCuckoo(f) => f.for_each_tag(|t| sum.add(&t.to_le_bytes())),
                    _ => unreachable!("OR kinds only"),
                }
                sum.finish(&mut h);
                h.update(b"history");
                for (r, (a, b)) in self.history().expect("OR kind").ranges() {
                    h.update(&r.to_le_bytes());
                    h.update(&a.to_le_bytes());
                    h.update(&b.to_le_bytes());
                }
            }
        }
        h.digest()
    }

    /// The replica id tags are issued under (0 for kinds without tags).
    pub fn replica(&self) -> ReplicaId {
        match self {
            AnyFilter::OrCuckoo(f) => f.replica(),
            AnyFilter::ScOrCuckoo(f) => f.replica(),
            _ => 0,
        }
    }

    /// Issues future tags under another id (no effect on kinds without tags).
    pub fn set_replica(&mut self, replica: ReplicaId) {
        match self {
            AnyFilter::OrCuckoo(f) => f.set_replica(replica),
            AnyFilter::ScOrCuckoo(f) => f.set_replica(replica),
            _ => {}
        }
    }

    /// Highest timestamp this replica may have issued (0 for kinds without tags).
    pub fn clock(&self) -> u64 {
        match self {
            AnyFilter::OrCuckoo(f) => f.clock(),
            AnyFilter::ScOrCuckoo(f) => f.clock(),
            _ => 0,
        }
    }

    /// Never issue a timestamp at or below `floor` (no effect on kinds without tags).
    pub fn advance_clock(&mut self, floor: u64) {
        match self {
            AnyFilter::OrCuckoo(f) => f.advance_clock(floor),
            AnyFilter::ScOrCuckoo(f) => f.advance_clock(floor),
            _ => {}
        }
    }

    /// Tags of the live entries (empty for kinds without tags).
    pub fn dots(&self) -> Vec<Dot> {
        match self {
            AnyFilter::OrCuckoo(f) => f.dots(),
            AnyFilter::ScOrCuckoo(f) => f.dots(),
            _ => Vec::new(),
        }
    }

    /// The causal history of OR kinds.
    pub fn history(&self) -> Option<&CausalContext> {
        match self {
            AnyFilter::OrCuckoo(f) => Some(f.history()),
            AnyFilter::ScOrCuckoo(f) => Some(f.history()),
            _ => None,
        }
    }
}

fn digest_cuckoo(h: &mut Xxh3, f: &GCuckoo) {
    let mut sum = SetSum::default();
    f.for_each_canonical(|b, fp| {
        let mut e = [0u8; 10];
        e[..8].copy_from_slice(&b.to_le_bytes());
        e[8..].copy_from_slice(&fp.to_le_bytes());
        sum.add(&e);
    });
    sum.finish(h);
}

/// An order-free digest of a multiset: the count and the wrapping sum of each element's
/// xxh3-128. Equal multisets give equal sums in any order; different ones collide with
/// probability about 2^-128 (the elements are not chosen against the hash).
#[derive(Default)]
struct SetSum {
    count: u64,
    sum: u128,
}

impl SetSum {
    fn add(&mut self, element: &[u8]) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(xxh3_128(element));
    }

    fn finish(&self, h: &mut Xxh3) {
        h.update(&self.count.to_le_bytes());
        h.update(&self.sum.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: FilterKind) -> FilterSpec {
        FilterSpec::new(kind, 200, 0.01)
    }

    #[test]
    fn every_kind_replicates_by_delta_and_state() {
        for kind in FilterKind::ALL {
            let mut a = AnyFilter::new(&spec(kind), 1).unwrap();
            let mut b = AnyFilter::new(&spec(kind), 2).unwrap();
            a.track_deltas(true);
            for i in 0..150u32 {
                a.add(&i.to_le_bytes()).unwrap();
            }
            if kind.removable() {
                assert!(a.remove(&5u32.to_le_bytes()).unwrap().is_some());
            } else {
                assert_eq!(a.remove(b"x"), Err(NotRemovable(kind)));
            }
            let d = a.take_delta().unwrap();
            b.merge_delta_bytes(&d).unwrap();
            assert!(a.equivalent(&b), "{kind}");
            assert_eq!(a.state_digest(), b.state_digest(), "{kind}");
            let c = AnyFilter::decode_state(kind, &a.encode_state()).unwrap();
            assert!(c.equivalent(&a));
            b.add(b"more").unwrap();
            assert_ne!(a.state_digest(), b.state_digest(), "{kind}");
            a.merge(&b).unwrap();
            assert_eq!(a.state_digest(), b.state_digest(), "{kind}");
        }
    }

    #[test]
    fn cuckoo_digest_ignores_placement() {
        // The same elements added in different orders land in different slots.
        let mut a = AnyFilter::new(&spec(FilterKind::GCuckoo), 0).unwrap();
        let mut b = a.clone();
        for i in 0..190u32 {
            a.add(&i.to_le_bytes()).unwrap();
        }
        for i in (0..190u32).rev() {
            b.add(&i.to_le_bytes()).unwrap();
        }
        assert!(a.equivalent(&b));
        assert_eq!(a.state_digest(), b.state_digest());
    }

    #[test]
    fn digest_is_equal_exactly_for_equivalent_states() {
        // States from overlapping subsets, each added in two orders (cuckoo placements and
        // tag slots differ) and some merged: digests agree exactly where `equivalent` does.
        let mut rng = fastrand::Rng::with_seed(11);
        for kind in FilterKind::ALL {
            let mut states = Vec::new();
            for round in 0..6u32 {
                let items: Vec<u32> = (0..120).filter(|_| rng.u8(..4) > 0).collect();
                // Every OR filter adds under its own id: two issuing one id's tags to other
                // items is the id collision the registry prevents (the digest takes a tag
                // for its entry).
                let id = |k: u32| {
                    if kind.removable() {
                        (10 + 2 * round + k) as u16
                    } else {
                        1
                    }
                };
                let mut fwd = AnyFilter::new(&spec(kind), id(0)).unwrap();
                for i in &items {
                    fwd.add(&i.to_le_bytes()).unwrap();
                }
                let mut rev = AnyFilter::new(&spec(kind), id(1)).unwrap();
                for i in items.iter().rev() {
                    rev.add(&i.to_le_bytes()).unwrap();
                }
                if round % 2 == 1 {
                    let mut other = AnyFilter::new(&spec(kind), 2).unwrap();
                    other.add(&round.to_le_bytes()).unwrap();
                    fwd.merge(&other).unwrap();
                    other.merge(&fwd).unwrap();
                    states.push(other);
                }
                states.push(fwd);
                states.push(rev);
            }
            let mut equal_pairs = 0;
            for a in &states {
                for b in &states {
                    let same = a.state_digest() == b.state_digest();
                    assert_eq!(same, a.equivalent(b), "{kind}");
                    equal_pairs += usize::from(same);
                }
            }
            assert!(equal_pairs > states.len(), "{kind}: no equivalent pairs");
        }
    }

    #[test]
    fn remote_states_and_deltas_with_our_tags_ahead_are_rejected() {
        for kind in FilterKind::ALL {
            let mut mine = AnyFilter::new(&spec(kind), 1).unwrap();
            mine.add(b"mine").unwrap();
            let mut impostor = AnyFilter::new(&spec(kind), 1).unwrap();
            impostor.track_deltas(true);
            impostor.advance_clock(crate::MAX_COUNTER - 1);
            impostor.add(b"x").unwrap();
            let delta = impostor.take_delta().unwrap();
            let before = mine.clone();
            if kind.removable() {
                assert!(matches!(
                    mine.check_remote_state(&impostor),
                    Err(FilterError::OwnDotAhead { replica: 1, .. })
                ));
                assert!(matches!(
                    mine.merge_remote_delta_bytes(&delta),
                    Err(WireError::OwnTagAhead(_))
                ));
                assert!(mine.equivalent(&before) && mine.clock() == 1, "{kind}");
            } else {
                assert!(mine.check_remote_state(&impostor).is_ok());
                mine.merge_remote_delta_bytes(&delta).unwrap();
            }
            let mut peer = AnyFilter::new(&spec(kind), 2).unwrap();
            peer.track_deltas(true);
            peer.add(b"y").unwrap();
            let delta = peer.take_delta().unwrap();
            assert!(mine.check_remote_state(&peer).is_ok());
            mine.merge_remote_delta_bytes(&delta).unwrap();
            assert!(mine.contains(b"y"));
        }
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut a = AnyFilter::new(&spec(FilterKind::OrCuckoo), 1).unwrap();
        a.add(b"x").unwrap();
        let before = a.clone();
        assert!(a.merge_delta_bytes(b"\xff\x00garbage").is_err());
        let other = AnyFilter::new(&spec(FilterKind::GBloom), 1).unwrap();
        assert!(a.merge(&other).is_err());
        assert!(AnyFilter::decode_state(FilterKind::GBloom, &a.encode_state()).is_err());
        assert!(a.equivalent(&before));
    }
}
