//! [`AnyFilter`]: one of the six core filters behind one type, so that a replica, its wire
//! messages and its snapshots handle every kind alike.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

pub use crate::core::kind::FilterSpec;
use crate::core::kind::{
    Counted, ImportRoom, ObservedRemove, Occurrence, ReplicatedFilter, for_each_filter_kind,
};
use crate::core::shared_bloom::BloomReader;
use crate::wire::{FilterKind, WireError, from_cbor, to_cbor};
use crate::{CausalContext, CheckRemote, DeltaState, Dot, FilterError, Lattice, ReplicaId};

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

/// Attempt to count occurrences in a filter that does not count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {0} filter does not count occurrences (counting_cuckoo does)")]
pub struct NotCounting(pub FilterKind);

/// A delta taken from a filter and not yet encoded. Taking it is a move; encoding a large one
/// takes tens of microseconds, which the taker spends after releasing the filter's lock, so
/// that updates and queries waiting on the lock do not wait for it.
pub struct TakenDelta(Box<dyn FnOnce() -> Vec<u8> + Send>);

impl TakenDelta {
    /// The delta's wire encoding (what [`AnyFilter::merge_delta_bytes`] takes).
    pub fn encode(self) -> Vec<u8> {
        (self.0)()
    }
}

/// What [`AnyFilter`] needs of each kind, object-safe: [`ReplicatedFilter`] with deltas and
/// states as bytes. Implemented once, for every [`ReplicatedFilter`].
trait DynFilter: Send + Sync {
    fn contains(&self, item: &[u8]) -> bool;
    fn add(&mut self, item: &[u8]) -> Result<Option<Dot>, FilterError>;
    fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError>;
    fn figures(&self) -> (f64, u64, f64, f64);
    fn track_deltas(&mut self, on: bool);
    fn pending_delta_len(&self) -> usize;
    fn record_footprint(&mut self, item: &[u8]) -> bool;
    fn take_delta_unencoded(&mut self) -> Option<TakenDelta>;
    /// `remote`: how to check a peer's delta (`None`: a local record, trusted).
    fn merge_delta_bytes(
        &mut self,
        bytes: &[u8],
        remote: Option<Remote<'_>>,
    ) -> Result<(), WireError>;
    fn encode_state(&self) -> Vec<u8>;
    fn encode_state_sized(&self, capacity: usize) -> Vec<u8>;
    fn encoded_state_len(&self) -> Option<u64>;
    fn encode_state_piece(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError>;
    fn merge_state_piece(
        &mut self,
        total_len: u64,
        offset: u64,
        piece: &[u8],
    ) -> Result<(), FilterError>;
    fn params_digest(&self) -> u64;
    fn digest_state(&self, h: &mut Xxh3);
    fn sub_filters(&self) -> usize;
    fn observed_remove(&self) -> Option<&dyn ObservedRemove>;
    fn observed_remove_mut(&mut self) -> Option<&mut dyn ObservedRemove>;
    fn counted(&self) -> Option<&dyn Counted>;
    fn shared_reader(&self) -> Option<BloomReader>;
    fn prefetch(&self, item: &[u8]);
    fn prefetch_add(&self, item: &[u8]);
    fn prefetch_ahead(&self) -> usize;
    fn counted_mut(&mut self) -> Option<&mut dyn Counted>;
    fn set_writer(&mut self, replica: ReplicaId);
    fn tick(&mut self, now_ms: u64) -> bool;
    fn contains_as_of(&self, item: &[u8], now_ms: u64) -> bool;
    fn live_occurrences(&self) -> Vec<Occurrence>;
    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError>;
    fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError>;
}

impl<F: ReplicatedFilter> DynFilter for F {
    fn contains(&self, item: &[u8]) -> bool {
        crate::Membership::contains(self, item)
    }
    fn add(&mut self, item: &[u8]) -> Result<Option<Dot>, FilterError> {
        match self.observed_remove_mut() {
            Some(or) => or.add_dot(item).map(Some),
            None => crate::Membership::add(self, item).map(|()| None),
        }
    }
    fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError> {
        match self.observed_remove_mut() {
            None => crate::Membership::add_new(self, item),
            Some(_) => {
                let new = !crate::Membership::contains(self, item);
                DynFilter::add(self, item).map(|_| new)
            }
        }
    }
    fn figures(&self) -> (f64, u64, f64, f64) {
        (
            self.cardinality(),
            self.capacity(),
            self.load_factor(),
            self.estimated_fpr(),
        )
    }
    fn track_deltas(&mut self, on: bool) {
        DeltaState::track_deltas(self, on)
    }
    fn pending_delta_len(&self) -> usize {
        DeltaState::pending_delta_len(self)
    }
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        DeltaState::record_footprint(self, item)
    }
    fn take_delta_unencoded(&mut self) -> Option<TakenDelta> {
        self.take_delta()
            .map(|d| TakenDelta(Box::new(move || to_cbor(&d))))
    }
    fn merge_delta_bytes(
        &mut self,
        bytes: &[u8],
        remote: Option<Remote<'_>>,
    ) -> Result<(), WireError> {
        let d = from_cbor(bytes)?;
        let Some(remote) = remote else {
            return self.merge_own_delta(&d).map_err(incompatible);
        };
        let maxima = self.delta_tag_maxima(&d);
        let adopt = match (remote.bounds, self.observed_remove()) {
            (Some(bounds), Some(or)) => bounds.check(or.replica(), or.clock(), &maxima)?,
            _ => {
                self.check_remote_delta(&d).map_err(remote_error)?;
                None
            }
        };
        self.check_remote_delta_as_of(&d, remote.now_ms)
            .map_err(remote_error)?;
        // Nothing changes unless the whole merge will.
        self.check_delta(&d).map_err(incompatible)?;
        if let (Some(clock), Some(or)) = (adopt, self.observed_remove_mut()) {
            or.advance_clock(clock);
        }
        self.merge_delta(&d).map_err(incompatible)
    }
    fn encode_state(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_state_into(&mut out);
        out
    }
    fn encoded_state_len(&self) -> Option<u64> {
        ReplicatedFilter::encoded_state_len(self)
    }
    fn encode_state_piece(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        ReplicatedFilter::encode_state_piece(self, offset, len, out)
    }
    fn merge_state_piece(
        &mut self,
        total_len: u64,
        offset: u64,
        piece: &[u8],
    ) -> Result<(), FilterError> {
        ReplicatedFilter::merge_state_piece(self, total_len, offset, piece)
    }
    fn encode_state_sized(&self, capacity: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(capacity);
        self.encode_state_into(&mut out);
        out
    }
    fn params_digest(&self) -> u64 {
        ReplicatedFilter::params_digest(self)
    }
    fn digest_state(&self, h: &mut Xxh3) {
        ReplicatedFilter::digest_state(self, h)
    }
    fn sub_filters(&self) -> usize {
        ReplicatedFilter::sub_filters(self)
    }
    fn observed_remove(&self) -> Option<&dyn ObservedRemove> {
        ReplicatedFilter::observed_remove(self)
    }
    fn observed_remove_mut(&mut self) -> Option<&mut dyn ObservedRemove> {
        ReplicatedFilter::observed_remove_mut(self)
    }
    fn counted(&self) -> Option<&dyn Counted> {
        ReplicatedFilter::counted(self)
    }
    fn shared_reader(&self) -> Option<BloomReader> {
        ReplicatedFilter::shared_reader(self)
    }
    fn prefetch(&self, item: &[u8]) {
        ReplicatedFilter::prefetch(self, item)
    }
    fn prefetch_add(&self, item: &[u8]) {
        ReplicatedFilter::prefetch_add(self, item)
    }
    fn prefetch_ahead(&self) -> usize {
        ReplicatedFilter::prefetch_ahead(self)
    }
    fn counted_mut(&mut self) -> Option<&mut dyn Counted> {
        ReplicatedFilter::counted_mut(self)
    }
    fn set_writer(&mut self, replica: ReplicaId) {
        ReplicatedFilter::set_writer(self, replica)
    }
    fn tick(&mut self, now_ms: u64) -> bool {
        ReplicatedFilter::tick(self, now_ms)
    }
    fn contains_as_of(&self, item: &[u8], now_ms: u64) -> bool {
        ReplicatedFilter::contains_as_of(self, item, now_ms)
    }
    fn live_occurrences(&self) -> Vec<Occurrence> {
        ReplicatedFilter::live_occurrences(self)
    }
    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        ReplicatedFilter::import_occurrences(self, occurrences, room)
    }
    fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        ReplicatedFilter::check_import(self, occurrences, room)
    }
}

macro_rules! define_any_filter {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $ty:ty; )*) => {
        /// One of the registered filter kinds behind one type, so that a replica, its wire
        /// messages and its snapshots handle every kind alike. Generated from the registry
        /// (`crate::core::kind`).
        ///
        /// Each kind is boxed: the enum is two words, where inline it was as large as its
        /// largest kind (400 bytes), held by each of a node's 100,000 mostly small filters.
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub enum AnyFilter {
            $( $(#[$doc])* $variant(Box<$ty>), )*
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
                Ok(match spec.kind {
                    $( FilterKind::$variant => {
                        AnyFilter::$variant(Box::new(<$ty as ReplicatedFilter>::from_spec(spec, replica)?))
                    } )*
                })
            }

            /// The filter type.
            pub fn kind(&self) -> FilterKind {
                match self {
                    $( AnyFilter::$variant(_) => FilterKind::$variant, )*
                }
            }

            /// Decodes a full state of the given kind (validated by the core: never panics).
            pub fn decode_state(kind: FilterKind, bytes: &[u8]) -> Result<Self, WireError> {
                Ok(match kind {
                    $( FilterKind::$variant => AnyFilter::$variant(Box::new(from_cbor(bytes)?)), )*
                })
            }

            /// `self := self ⊔ other`; other kinds or parameters give an error and change
            /// nothing.
            pub fn merge(&mut self, other: &AnyFilter) -> Result<(), FilterError> {
                match (self, other) {
                    $( (AnyFilter::$variant(a), AnyFilter::$variant(b)) => a.merge(b), )*
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
                    $( (AnyFilter::$variant(a), AnyFilter::$variant(b)) => a.le(b), )*
                    _ => false,
                }
            }

            /// [`CheckRemote::check_remote`] of a state received from another replica, to call
            /// before merging it: [`FilterError::OwnDotAhead`] if it carries tags of this
            /// replica's own id above its clock; [`FilterError::Incompatible`] across kinds;
            /// [`FilterError::ClockAhead`] for a kind with a clock whose state is further ahead
            /// of `now_ms` (the wall clock, ms since the UNIX epoch) than its skew bound.
            pub fn check_remote_state(
                &self,
                other: &AnyFilter,
                now_ms: u64,
            ) -> Result<(), FilterError> {
                match (self, other) {
                    $( (AnyFilter::$variant(a), AnyFilter::$variant(b)) => a.check_remote(b)?, )*
                    // Refused as incompatible below.
                    _ => {}
                }
                self.check_remote_skew(other, now_ms)
            }

            /// The clock-skew half of [`AnyFilter::check_remote_state`].
            fn check_remote_skew(
                &self,
                other: &AnyFilter,
                now_ms: u64,
            ) -> Result<(), FilterError> {
                match (self, other) {
                    $( (AnyFilter::$variant(a), AnyFilter::$variant(b)) => {
                        a.check_remote_as_of(b, now_ms)
                    } )*
                    (a, b) => Err(FilterError::Incompatible(format!(
                        "{} state checked against a {} filter",
                        b.kind(),
                        a.kind()
                    ))),
                }
            }

            fn inner(&self) -> &dyn DynFilter {
                match self {
                    $( AnyFilter::$variant(f) => &**f, )*
                }
            }

            fn inner_mut(&mut self) -> &mut dyn DynFilter {
                match self {
                    $( AnyFilter::$variant(f) => &mut **f, )*
                }
            }
        }
    };
}
for_each_filter_kind!(define_any_filter);

/// How a replica checks a peer's state or delta before merging it.
#[derive(Clone, Copy)]
pub(crate) struct Remote<'a> {
    /// The wall clock (ms since the UNIX epoch), for kinds whose elements expire.
    pub(crate) now_ms: u64,
    /// What the id registry reserves for each replica id; `None`: tags are checked against
    /// this replica's own clock only ([`CheckRemote`]).
    pub(crate) bounds: Option<TagBounds<'a>>,
}

/// The highest timestamp each replica id's holder may have issued, as the id registry records
/// it (docs/DESIGN.md section 4): the defence of the observed-remove kinds against forged tags
/// when frames are not signed.
///
/// - A tag of another id above that id's reservation (or of an id without a record) was
///   issued by no replica: [`WireError::TagUnreserved`], nothing merged. Merged, it would
///   make the id's holder refuse every state that carries it, for good.
/// - A tag of our own id above our clock but within our own reservation can only be forged
///   (a restarted replica resumes above its reservation): our clock moves past it, so that
///   the state merges and none of our tags is issued twice. Above our reservation:
///   [`WireError::OwnTagAhead`].
#[derive(Clone, Copy)]
pub struct TagBounds<'a> {
    /// The reservation the registry confirmed for this replica's own id.
    pub own_reserved: u64,
    /// The reservation (or retirement floor) of another id; `None`: no record of it.
    pub reserved: &'a dyn Fn(ReplicaId) -> Option<u64>,
}

impl TagBounds<'_> {
    /// Checks `maxima` (each id's highest timestamp in what was received) for a replica of
    /// id `own` at `clock`: the clock to advance to before merging, if any.
    pub fn check(
        &self,
        own: ReplicaId,
        clock: u64,
        maxima: &[(ReplicaId, u64)],
    ) -> Result<Option<u64>, WireError> {
        let mut adopt = None;
        for &(id, counter) in maxima {
            if id == own {
                if counter > clock {
                    if counter > self.own_reserved {
                        return Err(WireError::OwnTagAhead(format!(
                            "tag ({id}, {counter}) above this replica's clock {clock} and \
                             reservation {}",
                            self.own_reserved
                        )));
                    }
                    adopt = Some(counter);
                }
            } else if (self.reserved)(id).is_none_or(|r| counter > r) {
                return Err(WireError::TagUnreserved {
                    replica: id,
                    counter,
                });
            }
        }
        Ok(adopt)
    }
}

/// A remote state or delta refused before merging: tags of our own id ahead of our clock
/// (which would exhaust it) have their own reason.
pub(crate) fn remote_error(e: FilterError) -> WireError {
    match e {
        FilterError::OwnDotAhead { .. } => WireError::OwnTagAhead(e.to_string()),
        FilterError::ClockAhead { .. } => WireError::ClockAhead(e.to_string()),
        e => incompatible(e),
    }
}

fn incompatible(e: FilterError) -> WireError {
    WireError::Incompatible(e.to_string())
}

impl AnyFilter {
    /// Digest of the parameters (the envelope's `params_digest`).
    pub fn params_digest(&self) -> u64 {
        self.inner().params_digest()
    }

    /// Membership test.
    pub fn contains(&self, item: &[u8]) -> bool {
        self.inner().contains(item)
    }

    /// Starts loading the cache lines `item` will touch (a hint for batches, see
    /// [`ReplicatedFilter::prefetch`]).
    pub fn prefetch(&self, item: &[u8]) {
        self.inner().prefetch(item)
    }

    /// [`AnyFilter::prefetch`] for an add of `item` ([`ReplicatedFilter::prefetch_add`]).
    pub fn prefetch_add(&self, item: &[u8]) {
        self.inner().prefetch_add(item)
    }

    /// How many items ahead a batch prefetches ([`ReplicatedFilter::prefetch_ahead`]).
    pub fn prefetch_ahead(&self) -> usize {
        self.inner().prefetch_ahead()
    }

    /// Adds the item; OR kinds return the tag they issued.
    pub fn add(&mut self, item: &[u8]) -> Result<Option<Dot>, FilterError> {
        self.inner_mut().add(item)
    }

    /// Adds the item and says whether it was absent before ([`crate::Membership::add_new`]);
    /// the OR kinds issue a tag as [`AnyFilter::add`] does.
    pub fn add_new(&mut self, item: &[u8]) -> Result<bool, FilterError> {
        self.inner_mut().add_new(item)
    }

    /// Removes one occurrence of the item (the kinds that remove); `Ok(None)` if it was not
    /// contained. The OR kinds name the tag of the entry removed, the counting kinds the
    /// occurrence ([`Counted::remove_one`]).
    pub fn remove(&mut self, item: &[u8]) -> Result<Option<Dot>, NotRemovable> {
        let kind = self.kind();
        let inner = self.inner_mut();
        if let Some(or) = inner.observed_remove_mut() {
            return Ok(or.remove_dot(item));
        }
        match inner.counted_mut() {
            Some(c) => Ok(c.remove_one(item)),
            None => Err(NotRemovable(kind)),
        }
    }

    /// A reader that answers `contains` from this state's bits without its lock, for the
    /// kinds that have one (`g_bloom`): it keeps reading this state as it changes.
    pub fn shared_reader(&self) -> Option<BloomReader> {
        self.inner().shared_reader()
    }

    /// The multiplicity of the item: for the kinds that count, [`Counted::count`]; for the
    /// observed-remove kinds, the live entries matching it
    /// ([`crate::core::kind::ObservedRemove::occurrences`]).
    pub fn count(&self, item: &[u8]) -> Result<u64, NotCounting> {
        let inner = self.inner();
        if let Some(c) = inner.counted() {
            return Ok(c.count(item));
        }
        match inner.observed_remove() {
            Some(or) => Ok(or.occurrences(item)),
            None => Err(NotCounting(self.kind())),
        }
    }

    /// Entries removed anywhere among the adds this state observed: the dots of its causal
    /// history less its live entries (`CF.INFO`'s "Number of items deleted"); 0 for the kinds
    /// without observed removes. The same on every replica once they converge.
    pub fn removed(&self) -> u64 {
        let Some(or) = self.inner().observed_remove() else {
            return 0;
        };
        let mut live = 0u64;
        or.for_each_dot(&mut |_| live += 1);
        or.history().dot_count().saturating_sub(live)
    }

    /// Current figures.
    pub fn stats(&self) -> FilterStats {
        let (cardinality, capacity, load_factor, estimated_fpr) = self.inner().figures();
        FilterStats {
            kind: self.kind(),
            cardinality,
            capacity,
            load_factor,
            estimated_fpr,
            sub_filters: self.inner().sub_filters(),
            clock: self.clock(),
        }
    }

    /// Starts or stops recording local updates as a delta.
    pub fn track_deltas(&mut self, on: bool) {
        self.inner_mut().track_deltas(on)
    }

    /// Number of updates in the pending delta.
    pub fn pending_delta_len(&self) -> usize {
        self.inner().pending_delta_len()
    }

    /// Records the item's whole footprint in the pending delta
    /// ([`DeltaState::record_footprint`]): for a replica whose state holds merges its log does
    /// not, so that the add it just made is in its log whatever set its bits first.
    pub fn record_footprint(&mut self, item: &[u8]) -> bool {
        self.inner_mut().record_footprint(item)
    }

    /// The pending delta, encoded, or `None` if nothing changed.
    pub fn take_delta(&mut self) -> Option<Vec<u8>> {
        self.take_delta_unencoded().map(TakenDelta::encode)
    }

    /// The pending delta, to encode once the filter's lock is released (see [`TakenDelta`]).
    pub fn take_delta_unencoded(&mut self) -> Option<TakenDelta> {
        self.inner_mut().take_delta_unencoded()
    }

    /// As [`AnyFilter::merge_remote_delta_bytes`], checking the delta's tags against the id
    /// registry's reservations ([`TagBounds`]) instead of this replica's clock alone.
    pub fn merge_remote_delta_bytes_within(
        &mut self,
        bytes: &[u8],
        now_ms: u64,
        bounds: TagBounds<'_>,
    ) -> Result<(), WireError> {
        self.inner_mut().merge_delta_bytes(
            bytes,
            Some(Remote {
                now_ms,
                bounds: Some(bounds),
            }),
        )
    }

    /// As [`AnyFilter::check_remote_state`], checking the state's tags against the id
    /// registry's reservations ([`TagBounds`]): the clock to advance to before merging it,
    /// if any.
    pub fn check_remote_state_within(
        &self,
        other: &AnyFilter,
        now_ms: u64,
        bounds: TagBounds<'_>,
    ) -> Result<Option<u64>, WireError> {
        let (Some(mine), Some(theirs)) = (self.observed_remove(), other.observed_remove()) else {
            self.check_remote_state(other, now_ms)
                .map_err(remote_error)?;
            return Ok(None);
        };
        let maxima: Vec<_> = theirs.history().maxima().collect();
        let adopt = bounds.check(mine.replica(), mine.clock(), &maxima)?;
        // The own-id check is the one above; the kind's clock-skew check remains.
        self.check_remote_skew(other, now_ms)
            .map_err(remote_error)?;
        Ok(adopt)
    }

    /// Decodes and joins an encoded delta of this replica's own (a record of its write-ahead
    /// log: [`DeltaState::merge_own_delta`], which trusts its sub-filter indexes); a delta
    /// that does not decode or fit changes nothing.
    pub fn merge_delta_bytes(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.inner_mut().merge_delta_bytes(bytes, None)
    }

    /// As [`AnyFilter::merge_delta_bytes`] for a delta received from another replica: first
    /// rejects one carrying tags of this replica's own id above its clock
    /// ([`CheckRemote::check_remote_delta`], [`FilterError::OwnDotAhead`], here as
    /// [`WireError::OwnTagAhead`]) and, for kinds with a clock, one further ahead of `now_ms`
    /// than their skew bound ([`WireError::ClockAhead`]).
    pub fn merge_remote_delta_bytes(&mut self, bytes: &[u8], now_ms: u64) -> Result<(), WireError> {
        self.inner_mut().merge_delta_bytes(
            bytes,
            Some(Remote {
                now_ms,
                bounds: None,
            }),
        )
    }

    /// Time passed (`now_ms`: the wall clock in milliseconds since the UNIX epoch): kinds whose
    /// elements expire move their window. Whether the state changed.
    pub fn tick(&mut self, now_ms: u64) -> bool {
        self.inner_mut().tick(now_ms)
    }

    /// For kinds whose elements expire: the epoch length (ms) and the skew bound (epochs).
    pub fn clock_bounds(&self) -> Option<(u64, u32)> {
        match self {
            AnyFilter::ExpiringBloom(f) => Some((f.params().epoch_len, f.params().max_skew)),
            _ => None,
        }
    }

    /// For kinds whose elements expire: the newest epoch the state reached (its clock).
    pub fn clock_epoch(&self) -> Option<u64> {
        match self {
            AnyFilter::ExpiringBloom(f) => Some(f.newest_epoch()),
            _ => None,
        }
    }

    /// For kinds whose elements expire: the sender's clock (newest epoch) in a delta's wire
    /// encoding, if it decodes.
    pub fn delta_clock_epoch(&self, bytes: &[u8]) -> Option<u64> {
        match self {
            AnyFilter::ExpiringBloom(_) => from_cbor::<crate::core::expiring::ExpiringDelta>(bytes)
                .ok()
                .map(|d| d.newest),
            _ => None,
        }
    }

    /// For kinds whose elements expire: repairs a state whose clock is more than the skew
    /// bound ahead of `now_ms` ([`crate::ExpiringBloom::rewind_if_ahead`]); the clock it had,
    /// if it did.
    pub fn rewind_if_ahead(&mut self, now_ms: u64) -> Option<u64> {
        match self {
            AnyFilter::ExpiringBloom(f) => f.rewind_if_ahead(now_ms),
            _ => None,
        }
    }

    /// Membership as of `now_ms`: for kinds whose elements expire, over the window ending
    /// then; for the others, [`AnyFilter::contains`].
    pub fn contains_as_of(&self, item: &[u8], now_ms: u64) -> bool {
        self.inner().contains_as_of(item, now_ms)
    }

    /// The full state, encoded.
    pub fn encode_state(&self) -> Vec<u8> {
        self.inner().encode_state()
    }

    /// The length of the full state's encoding, for kinds that [merge states piece by
    /// piece](FilterKind::merges_state_pieces); `None` for the others.
    pub fn encoded_state_len(&self) -> Option<u64> {
        self.inner().encoded_state_len()
    }

    /// Appends bytes `offset..offset + len` (cut at the end) of the full state's encoding,
    /// read from the state as it is, for kinds that [merge states piece by
    /// piece](FilterKind::merges_state_pieces) (see
    /// [`ReplicatedFilter::encode_state_piece`]); the others refuse.
    pub fn encode_state_piece(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        self.inner().encode_state_piece(offset, len, out)
    }

    /// Joins bytes `offset..` of a peer's full state, `total_len` bytes encoded, for kinds
    /// that [merge states piece by piece](FilterKind::merges_state_pieces) (see
    /// [`ReplicatedFilter::merge_state_piece`]); a piece that does not fit changes nothing.
    pub fn merge_state_piece(
        &mut self,
        total_len: u64,
        offset: u64,
        piece: &[u8],
    ) -> Result<(), FilterError> {
        self.inner_mut().merge_state_piece(total_len, offset, piece)
    }

    /// [`AnyFilter::encode_state`] into a buffer of `capacity` bytes to start with: with the
    /// size of the last encoding, a large state's buffer is not regrown (each doubling holds
    /// the old and the new buffer for a moment).
    pub fn encode_state_sized(&self, capacity: usize) -> Vec<u8> {
        self.inner().encode_state_sized(capacity)
    }

    /// `le` both ways.
    pub fn equivalent(&self, other: &AnyFilter) -> bool {
        self.le(other) && other.le(self)
    }

    /// A digest that is equal for equivalent states whatever their layout (cuckoo placements,
    /// tags' slots), so that anti-entropy can tell replicas that agree from ones that do not
    /// ([`ReplicatedFilter::digest_state`]; nothing is serialized).
    pub fn state_digest(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(&self.params_digest().to_le_bytes());
        self.inner().digest_state(&mut h);
        h.digest()
    }

    /// The tag API of OR kinds.
    pub fn observed_remove(&self) -> Option<&dyn ObservedRemove> {
        self.inner().observed_remove()
    }

    /// The replica id tags are issued under (0 for kinds without tags).
    pub fn replica(&self) -> ReplicaId {
        self.observed_remove().map_or(0, |f| f.replica())
    }

    /// Makes future updates `replica`'s: OR kinds issue their tags under it, per-writer kinds
    /// add into its series (no effect on the other kinds).
    pub fn set_replica(&mut self, replica: ReplicaId) {
        self.inner_mut().set_writer(replica)
    }

    /// Highest timestamp this replica may have issued (0 for kinds without tags).
    pub fn clock(&self) -> u64 {
        self.observed_remove().map_or(0, |f| f.clock())
    }

    /// Never issue a timestamp at or below `floor` (no effect on kinds without tags).
    pub fn advance_clock(&mut self, floor: u64) {
        if let Some(f) = self.inner_mut().observed_remove_mut() {
            f.advance_clock(floor)
        }
    }

    /// Every live occurrence, located: an entry of the observed-remove kinds, a counted slot
    /// of `counting_cuckoo` ([`ReplicatedFilter::live_occurrences`]); empty for the other
    /// kinds.
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        self.inner().live_occurrences()
    }

    /// Re-adds `occurrences` of a filter of the same kind and parameters (a dump's, whole or
    /// a part, the room of all of it `room`) as this replica's own updates: under fresh tags
    /// of its own, or as its own counts ([`ReplicatedFilter::import_occurrences`]); the
    /// occurrences added. All or nothing. The kinds without tags or counts refuse: merge
    /// their states.
    pub fn import(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        self.inner_mut().import_occurrences(occurrences, room)
    }

    /// Whether [`AnyFilter::import`] would take `occurrences` now, the clock aside
    /// ([`ReplicatedFilter::check_import`]).
    pub fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        self.inner().check_import(occurrences, room)
    }

    /// The tags re-adding `occurrences` into a filter of `kind` issues: one per occurrence
    /// counted for the tagged kinds, none for the others.
    pub fn tags_for_import(kind: FilterKind, occurrences: &[Occurrence]) -> u64 {
        if kind.tagged() {
            occurrences
                .iter()
                .fold(0u64, |n, o| n.saturating_add(o.count))
        } else {
            0
        }
    }

    /// Tags of the live entries (empty for kinds without tags).
    pub fn dots(&self) -> Vec<Dot> {
        self.observed_remove().map_or_else(Vec::new, |f| f.dots())
    }

    /// The causal history of OR kinds.
    pub fn history(&self) -> Option<std::borrow::Cow<'_, CausalContext>> {
        self.observed_remove().map(|f| f.history())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: FilterKind) -> FilterSpec {
        sized_spec(kind, 200, 0.01)
    }

    fn sized_spec(kind: FilterKind, capacity: u64, fpr: f64) -> FilterSpec {
        let spec = FilterSpec::new(kind, capacity, fpr);
        if kind == FilterKind::ExpiringBloom {
            // No time passes here: every add lands in one epoch, so size that one for all.
            spec.with_expiry(crate::ExpirySpec {
                epochs: 1,
                max_skew_epochs: 0,
                ..Default::default()
            })
        } else {
            spec
        }
    }

    /// A replica starts its filter as writer 0 and takes its id once claimed: every per-writer
    /// kind must then add into that id's series (the grow-only ones once kept filling
    /// writer 0's, on every replica, and broke their FPR bound).
    #[test]
    fn per_writer_kinds_add_into_the_series_of_the_id_set() {
        use crate::core::scalable::Partitioned;
        fn writers<F: crate::core::scalable::WriterSeries>(p: &Partitioned<F>) -> Vec<ReplicaId> {
            p.parts().map(|(w, _)| w).collect()
        }
        for kind in [
            FilterKind::WriterScGBloom,
            FilterKind::WriterScGCuckoo,
            FilterKind::WriterScOrCuckoo,
        ] {
            let mut f = AnyFilter::new(&spec(kind), 0).unwrap();
            f.set_replica(3);
            f.add(b"x").unwrap();
            let found = match &f {
                AnyFilter::WriterScGBloom(p) => writers(p),
                AnyFilter::WriterScGCuckoo(p) => writers(p),
                AnyFilter::WriterScOrCuckoo(p) => writers(p),
                _ => unreachable!(),
            };
            assert_eq!(found, vec![3], "{kind}");
        }
    }

    /// What a replica logs of an add of items a peer's merge brought, with their footprints,
    /// replayed on its state from before the merge, holds them all: for every kind.
    #[test]
    fn an_add_and_its_footprint_hold_the_item_without_the_merge() {
        for &kind in FilterKind::ALL {
            let items: Vec<[u8; 4]> = (0..100u32).map(u32::to_le_bytes).collect();
            let mut peer = AnyFilter::new(&spec(kind), 2).unwrap();
            for i in &items {
                peer.add(i).unwrap();
            }
            let mut mine = AnyFilter::new(&spec(kind), 1).unwrap();
            let before = mine.clone();
            mine.track_deltas(true);
            mine.merge(&peer).unwrap();
            for i in &items {
                mine.add(i).unwrap();
                let recorded = mine.record_footprint(i);
                let tagged = kind.tagged() || kind.counting();
                assert_eq!(
                    recorded, !tagged,
                    "{kind}: each add of a tagged kind logs itself"
                );
            }
            let mut replayed = before;
            replayed
                .merge_delta_bytes(&mine.take_delta().expect("adds logged"))
                .unwrap();
            for i in &items {
                assert!(replayed.contains(i), "{kind}");
            }
            // Not tracking: nothing to record into.
            let mut untracked = AnyFilter::new(&spec(kind), 1).unwrap();
            untracked.add(&items[0]).unwrap();
            assert!(!untracked.record_footprint(&items[0]), "{kind}");
        }
    }

    #[test]
    fn every_kind_replicates_by_delta_and_state() {
        for &kind in FilterKind::ALL {
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
    fn a_full_default_delta_of_every_kind_fits_one_nats_message() {
        // A commit is due at `delta_max_updates` entries; one entry more may come with the
        // last add (a Bloom add sets up to k bits). nats-server's default max_payload is
        // 1 MiB; the envelope around the delta needs less than 1 KiB.
        let max =
            crate::replica::ReplicaConfig::new("f", spec(FilterKind::GBloom)).delta_max_updates;
        for &kind in FilterKind::ALL {
            let mut f =
                AnyFilter::new(&sized_spec(kind, 1_000_000, 0.001), ReplicaId::MAX).unwrap();
            // Tags as large as a long-lived replica's, each encoded at full width.
            f.advance_clock(crate::MAX_COUNTER / 2);
            f.track_deltas(true);
            let mut i = 0u64;
            while f.pending_delta_len() < max {
                f.add(&i.to_le_bytes()).unwrap();
                i += 1;
            }
            let bytes = f.take_delta().unwrap().len();
            assert!(bytes < (1 << 20) - 1024, "{kind}: {bytes} bytes");
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
        for &kind in FilterKind::ALL {
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
        for &kind in FilterKind::ALL {
            let mut mine = AnyFilter::new(&spec(kind), 1).unwrap();
            mine.add(b"mine").unwrap();
            let mut impostor = AnyFilter::new(&spec(kind), 1).unwrap();
            impostor.track_deltas(true);
            impostor.advance_clock(crate::MAX_COUNTER - 1);
            impostor.add(b"x").unwrap();
            if !kind.tagged() {
                // A kind without a clock to advance (t_digest's per-id version) is ahead of
                // ours by its count of adds.
                impostor.add(b"z").unwrap();
            }
            let delta = impostor.take_delta().unwrap();
            let before = mine.clone();
            // The kinds that count per id (`count_min_sketch` too, which does not remove).
            if kind.removable() || !kind.reuses_ids() {
                assert!(matches!(
                    mine.check_remote_state(&impostor, 0),
                    Err(FilterError::OwnDotAhead { replica: 1, .. })
                ));
                assert!(matches!(
                    mine.merge_remote_delta_bytes(&delta, 0),
                    Err(WireError::OwnTagAhead(_))
                ));
                // The counting kinds count per id: another run's counts under our id are
                // refused alike (they have no clock).
                let clock = if kind.tagged() { 1 } else { 0 };
                assert!(mine.equivalent(&before) && mine.clock() == clock, "{kind}");
            } else {
                assert!(mine.check_remote_state(&impostor, 0).is_ok());
                mine.merge_remote_delta_bytes(&delta, 0).unwrap();
            }
            let mut peer = AnyFilter::new(&spec(kind), 2).unwrap();
            peer.track_deltas(true);
            peer.add(b"y").unwrap();
            let delta = peer.take_delta().unwrap();
            assert!(mine.check_remote_state(&peer, 0).is_ok());
            mine.merge_remote_delta_bytes(&delta, 0).unwrap();
            assert!(mine.contains(b"y"));
        }
    }

    #[test]
    fn tags_are_held_against_the_registrys_reservations() {
        let reserved = |id: ReplicaId| match id {
            2 => Some(100),
            3 => Some(0),
            _ => None,
        };
        let bounds = TagBounds {
            own_reserved: 50,
            reserved: &reserved,
        };
        // Ours at or below our clock, others within their reservations: nothing to do.
        assert_eq!(bounds.check(1, 10, &[(1, 10), (2, 100)]).unwrap(), None);
        // Ours above our clock within our reservation: the clock moves past it.
        assert_eq!(bounds.check(1, 10, &[(1, 42), (2, 7)]).unwrap(), Some(42));
        assert!(matches!(
            bounds.check(1, 10, &[(1, 51)]),
            Err(WireError::OwnTagAhead(_))
        ));
        for maxima in [[(2, 101)], [(3, 1)], [(9, 1)]] {
            assert!(matches!(
                bounds.check(1, 10, &maxima),
                Err(WireError::TagUnreserved { .. })
            ));
        }

        // Through a filter: a delta above its id's reservation changes nothing.
        let or_spec = spec(FilterKind::OrCuckoo);
        let mut mine = AnyFilter::new(&or_spec, 1).unwrap();
        let mut peer = AnyFilter::new(&or_spec, 2).unwrap();
        peer.track_deltas(true);
        peer.advance_clock(100);
        peer.add(b"x").unwrap();
        let delta = peer.take_delta().unwrap();
        let before = mine.clone();
        assert!(matches!(
            mine.merge_remote_delta_bytes_within(&delta, 0, bounds),
            Err(WireError::TagUnreserved {
                replica: 2,
                counter: 101
            })
        ));
        assert!(mine.equivalent(&before));
        // Our own id just above our clock: merged, and our clock moved past it.
        let mut forged = AnyFilter::new(&or_spec, 1).unwrap();
        forged.track_deltas(true);
        forged.advance_clock(30);
        forged.add(b"y").unwrap();
        let delta = forged.take_delta().unwrap();
        mine.merge_remote_delta_bytes_within(&delta, 0, bounds)
            .unwrap();
        assert!(mine.contains(b"y") && mine.clock() == 31);
        assert_eq!(
            mine.check_remote_state_within(&forged, 0, bounds).unwrap(),
            None
        );
        // Untagged kinds carry nothing to check.
        let mut bloom = AnyFilter::new(&spec(FilterKind::GBloom), 1).unwrap();
        let mut other = AnyFilter::new(&spec(FilterKind::GBloom), 7).unwrap();
        other.track_deltas(true);
        other.add(b"z").unwrap();
        let d = other.take_delta().unwrap();
        bloom
            .merge_remote_delta_bytes_within(&d, 0, bounds)
            .unwrap();
        assert!(bloom.contains(b"z"));
    }

    #[test]
    fn add_new_is_true_exactly_when_the_item_was_not_contained() {
        for kind in FilterKind::ALL {
            let mut spec = FilterSpec::new(*kind, 200, 0.05);
            if *kind == FilterKind::ExpiringBloom {
                spec.expiry = Some(crate::ExpirySpec::default());
            }
            let mut f = AnyFilter::new(&spec, 1).unwrap();
            for i in 0..300u32 {
                // Items come back: some are contained already, some collide (false positives).
                let item = (i % 170).to_le_bytes();
                let before = f.contains(&item);
                match f.add_new(&item) {
                    Ok(new) => assert_eq!(new, !before, "{kind}, item {i}"),
                    Err(_) => assert_eq!(f.contains(&item), before, "{kind}: a refused add"),
                }
                assert!(f.contains(&item) || before, "{kind}");
            }
        }
    }

    #[test]
    fn the_or_kinds_count_the_entries_an_item_has_and_the_grow_only_ones_refuse() {
        for kind in [
            FilterKind::OrCuckoo,
            FilterKind::ScOrCuckoo,
            FilterKind::WriterScOrCuckoo,
        ] {
            let mut f = AnyFilter::new(&FilterSpec::new(kind, 1_000, 0.001), 1).unwrap();
            assert_eq!(f.count(b"x").unwrap(), 0, "{kind}");
            f.add(b"x").unwrap();
            f.add(b"x").unwrap();
            f.add(b"y").unwrap();
            assert_eq!(f.count(b"x").unwrap(), 2, "{kind}");
            f.remove(b"x").unwrap();
            assert_eq!(f.count(b"x").unwrap(), 1, "{kind}");
            // A replica that merged it counts the same.
            let mut other = AnyFilter::new(&FilterSpec::new(kind, 1_000, 0.001), 2).unwrap();
            other.merge(&f).unwrap();
            assert_eq!(other.count(b"x").unwrap(), 1, "{kind}");
        }
        let g = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, 1_000, 0.01), 1).unwrap();
        assert!(g.count(b"x").is_err());
    }

    /// A `g_bloom` state merged piece by piece, in pieces of any size, is the state merged
    /// whole; a piece that does not fit (another filter's parameters, a wrong length, bits
    /// past the array) changes nothing; the other kinds merge states whole only.
    #[test]
    fn a_g_bloom_state_merged_in_pieces_is_the_state_merged_whole() {
        // Bit arrays whose CBOR headers take 1, 3 and 5 bytes.
        for capacity in [8, 1_000, 100_000] {
            let spec = FilterSpec::new(FilterKind::GBloom, capacity, 0.01);
            assert!(spec.kind.merges_state_pieces());
            let mut sender = AnyFilter::new(&spec, 1).unwrap();
            for i in 0..capacity.min(5_000) as u32 {
                sender.add(&i.to_le_bytes()).unwrap();
            }
            let state = sender.encode_state();
            let AnyFilter::GBloom(shared) = &sender else {
                unreachable!()
            };
            // Written from the words, the encoding is the serialized one byte for byte.
            assert_eq!(state, to_cbor(shared), "{capacity}");
            let total = state.len() as u64;
            assert_eq!(sender.encoded_state_len(), Some(total));
            // Read in pieces, the encoding is the whole one's bytes.
            for piece_len in [1, 7, 13, 4096, state.len() + 9] {
                let mut pieces = Vec::new();
                for offset in (0..total).step_by(piece_len) {
                    sender
                        .encode_state_piece(offset, piece_len, &mut pieces)
                        .unwrap();
                }
                assert_eq!(pieces, state, "{capacity}, pieces of {piece_len}");
            }
            assert!(
                sender
                    .encode_state_piece(total + 1, 1, &mut Vec::new())
                    .is_err()
            );
            for piece_len in [1, 7, 13, 4096] {
                let mut receiver = AnyFilter::new(&spec, 2).unwrap();
                receiver.add(b"own").unwrap();
                let mut whole = receiver.clone();
                whole.merge(&sender).unwrap();
                for (n, piece) in state.chunks(piece_len).enumerate() {
                    let offset = (n * piece_len) as u64;
                    receiver.merge_state_piece(total, offset, piece).unwrap();
                }
                assert!(
                    receiver.equivalent(&whole),
                    "{capacity}, pieces of {piece_len}"
                );
                // The count of set bits is kept as the pieces come.
                assert_eq!(receiver.stats().cardinality, whole.stats().cardinality);
            }
            // Misfits.
            let mut receiver = AnyFilter::new(&spec, 2).unwrap();
            let before = receiver.clone();
            let other = FilterSpec::new(FilterKind::GBloom, capacity, 0.02);
            let foreign = AnyFilter::new(&other, 1).unwrap().encode_state();
            let refused = [
                receiver.merge_state_piece(total + 1, 0, &state[..1]),
                receiver.merge_state_piece(total, total - 1, &state[..2]),
                receiver.merge_state_piece(foreign.len() as u64, 0, &foreign),
                receiver.merge_state_piece(total, 0, &[state[0] ^ 1]),
            ];
            for r in refused {
                assert!(r.is_err());
            }
            let mut past_end = state.clone();
            if let Some(last) = past_end.last_mut() {
                *last = 0xff;
            }
            // A full last byte is past the array unless its bit count is a multiple of 8.
            let r = receiver.merge_state_piece(total, total - 1, &past_end[past_end.len() - 1..]);
            let bits = match &receiver {
                AnyFilter::GBloom(f) => f.params().bits,
                _ => unreachable!(),
            };
            assert_eq!(r.is_err(), bits % 8 != 0, "{capacity}");
            if bits % 8 != 0 {
                assert!(receiver.equivalent(&before), "refusals change nothing");
            }
        }
        for kind in [
            FilterKind::GCuckoo,
            FilterKind::OrCuckoo,
            FilterKind::ScGBloom,
        ] {
            assert!(!kind.merges_state_pieces(), "{kind}");
            let mut f = AnyFilter::new(&FilterSpec::new(kind, 1_000, 0.01), 1).unwrap();
            let state = f.encode_state();
            assert!(f.merge_state_piece(state.len() as u64, 0, &state).is_err());
            assert_eq!(f.encoded_state_len(), None);
            assert!(f.encode_state_piece(0, 1, &mut Vec::new()).is_err());
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
