//! The registry of filter kinds: one list (`for_each_filter_kind!`) from which the
//! [`FilterKind`] enum here and the replica layer's `AnyFilter` are generated, and the two
//! traits every listed type implements in its own file: [`ReplicatedFilter`] (what a replica
//! needs of any filter) and [`ObservedRemove`] (the tag API of the kinds that remove).
//!
//! Adding a kind: implement [`ReplicatedFilter`] (and [`ObservedRemove`] if it removes) next to
//! the type, and add one line to `for_each_filter_kind!` with a new, never reused wire id.

use std::num::{NonZeroU8, NonZeroU16, NonZeroU32};

use serde::de::{DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use xxhash_rust::xxh3::Xxh3;

use super::causal::{CausalContext, Dot, ReplicaId};
use super::delta::CheckRemote;
use super::error::FilterError;
use super::lattice::{Lattice, Membership};
use super::params::DEFAULT_SEED;

/// The registry: calls `$m!` with one line per kind, `Variant = wire id, "config name", type`.
/// Wire ids are the kind's identity in envelopes and snapshots: never change or reuse one.
macro_rules! for_each_filter_kind {
    ($m:ident) => {
        $m! {
            /// [`crate::GBloom`]: grow-only Bloom filter (thesis GBF), held by a replica as a
            /// [`crate::SharedGBloom`] so that queries read it without a lock.
            GBloom = 0, "g_bloom", $crate::core::shared_bloom::SharedGBloom;
            /// [`crate::GCuckoo`]: grow-only cuckoo filter (GCF).
            GCuckoo = 1, "g_cuckoo", $crate::core::cuckoo::GCuckoo;
            /// [`crate::OrCuckoo`]: observed-remove cuckoo filter (ORCF).
            OrCuckoo = 2, "or_cuckoo", $crate::core::cuckoo::OrCuckoo;
            /// [`crate::ScGBloom`]: scalable GBF (thesis ScGBF).
            ScGBloom = 3, "sc_g_bloom", $crate::core::scalable::ScGBloom;
            /// [`crate::ScGCuckoo`]: scalable GCF (ScGCF).
            ScGCuckoo = 4, "sc_g_cuckoo", $crate::core::scalable::ScGCuckoo;
            /// [`crate::ScOrCuckoo`]: scalable ORCF (ScORCF).
            ScOrCuckoo = 5, "sc_or_cuckoo", $crate::core::scalable::ScOrCuckoo;
            /// [`crate::WriterScGBloom`]: scalable GBF with a series per writer, which keeps
            /// its FPR bound at any sync frequency.
            WriterScGBloom = 6, "writer_sc_g_bloom", $crate::core::scalable::WriterScGBloom;
            /// [`crate::WriterScGCuckoo`]: scalable GCF with a series per writer.
            WriterScGCuckoo = 7, "writer_sc_g_cuckoo", $crate::core::scalable::WriterScGCuckoo;
            /// [`crate::WriterScOrCuckoo`]: scalable ORCF with a series per writer.
            WriterScOrCuckoo = 8, "writer_sc_or_cuckoo", $crate::core::scalable::WriterScOrCuckoo;
            /// [`crate::ExpiringBloom`]: sliding-window Bloom filter, elements expire after
            /// [`FilterSpec::expiry`]'s window.
            ExpiringBloom = 9, "expiring_bloom", $crate::core::expiring::ExpiringBloom;
            /// [`crate::CountingCuckoo`]: counting cuckoo filter (CCF), a multiset.
            CountingCuckoo = 10, "counting_cuckoo", $crate::core::cuckoo::CountingCuckoo;
            /// [`crate::GoBloom`]: grow-only Bloom filter hashing and serializing as Go's
            /// `bits-and-blooms/bloom` does, so that Go services' filters load and merge.
            GoBloom = 11, "go_bloom", $crate::core::go_bloom::GoBloom;
            /// [`crate::BlockedBloom`]: grow-only blocked Bloom filter (each item's bits in
            /// one 512-bit block), for large filters: one cache miss per lookup.
            BlockedBloom = 12, "blocked_bloom", $crate::core::blocked_bloom::BlockedBloom;
            /// [`crate::CountMinSketch`]: count-min sketch with a G-counter per counter by
            /// replica (RedisBloom's `CMS.*`); `capacity` is its width, `fpr` `2^-depth`.
            CountMinSketch = 13, "count_min_sketch", $crate::core::cms::CountMinSketch;
            /// [`crate::TopK`]: top-k heavy hitters, a count-min sketch's G-counters and a
            /// heap per writer (RedisBloom's `TOPK.*`); `capacity` is `k`, `fpr` the decay,
            /// [`FilterSpec::shape`] the width and depth ([`FilterSpec::top_k`]).
            TopK = 14, "top_k", $crate::core::topk::TopK;
            /// [`crate::TDigest`]: t-digest of the values added, a part per writer and reset
            /// floors (RedisBloom's `TDIGEST.*`); `capacity` is the compression.
            TDigest = 15, "t_digest", $crate::core::tdigest::TDigest;
        }
    };
}
// Used by the replica layer (`AnyFilter`), which only the `node` feature builds.
#[allow(unused_imports)]
pub(crate) use for_each_filter_kind;

macro_rules! define_filter_kind {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $ty:ty; )*) => {
        /// The filter types a replica can hold, as named in configuration and identified on
        /// the wire (see [`FilterKind::wire_id`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum FilterKind {
            $( $(#[$doc])* $variant, )*
        }

        impl FilterKind {
            /// Every kind, in wire id order.
            pub const ALL: &'static [FilterKind] = &[$(FilterKind::$variant),*];

            /// The configuration name (`g_bloom`, `or_cuckoo`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $( FilterKind::$variant => $name, )*
                }
            }

            /// The kind's stable id in envelopes and snapshots.
            pub fn wire_id(self) -> u8 {
                match self {
                    $( FilterKind::$variant => $id, )*
                }
            }

            /// The kind of a wire id.
            pub fn from_wire_id(id: u8) -> Option<FilterKind> {
                match id {
                    $( $id => Some(FilterKind::$variant), )*
                    _ => None,
                }
            }

            /// Whether the kind removes: by tags ([`FilterKind::tagged`]) or by counts
            /// ([`FilterKind::counting`]).
            pub fn removable(self) -> bool {
                self.tagged() || self.counting()
            }

            /// Whether the kind issues version tags (the observed-remove kinds), which a
            /// replica reserves durably and in the id registry before it issues them.
            pub fn tagged(self) -> bool {
                match self {
                    $( FilterKind::$variant => <$ty as ReplicatedFilter>::REMOVABLE, )*
                }
            }

            /// Whether the kind counts occurrences ([`Counted`]).
            pub fn counting(self) -> bool {
                match self {
                    $( FilterKind::$variant => <$ty as ReplicatedFilter>::COUNTING, )*
                }
            }

            /// Whether the kind reads the wall clock ([`ReplicatedFilter::CLOCKED`]).
            pub fn clocked(self) -> bool {
                match self {
                    $( FilterKind::$variant => <$ty as ReplicatedFilter>::CLOCKED, )*
                }
            }

            /// Whether the kind merges full states piece by piece
            /// ([`ReplicatedFilter::MERGES_STATE_PIECES`]).
            pub fn merges_state_pieces(self) -> bool {
                match self {
                    $( FilterKind::$variant => <$ty as ReplicatedFilter>::MERGES_STATE_PIECES, )*
                }
            }

            /// Whether a replica id of the kind may serve a later run: a restart that keeps
            /// its id, or a new replica taking over a retired one (see
            /// [`ReplicatedFilter::REUSES_IDS`]).
            pub fn reuses_ids(self) -> bool {
                match self {
                    $( FilterKind::$variant => <$ty as ReplicatedFilter>::REUSES_IDS, )*
                }
            }
        }

        $( const _: () = assert!(matches!(<$ty as ReplicatedFilter>::KIND, FilterKind::$variant)); )*
    };
}
for_each_filter_kind!(define_filter_kind);

impl FilterKind {
    /// Whether the kind keeps a scalable series per writer (`writer_sc_*`), whose FPR shares
    /// count writers from [`FilterSpec::first_writer`].
    pub fn per_writer(self) -> bool {
        matches!(
            self,
            FilterKind::WriterScGBloom | FilterKind::WriterScGCuckoo | FilterKind::WriterScOrCuckoo
        )
    }
}

impl std::fmt::Display for FilterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FilterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FilterKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown filter kind `{s}`"))
    }
}

/// By name in human-readable formats (TOML, JSON), by wire id in binary ones (CBOR).
impl Serialize for FilterKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(self.name())
        } else {
            s.serialize_u8(self.wire_id())
        }
    }
}

/// Accepts a name or a wire id in any format.
impl<'de> Deserialize<'de> for FilterKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KindVisitor;
        impl Visitor<'_> for KindVisitor {
            type Value = FilterKind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a filter kind name or wire id")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FilterKind, E> {
                u8::try_from(v)
                    .ok()
                    .and_then(FilterKind::from_wire_id)
                    .ok_or_else(|| E::custom(format!("unknown filter kind id {v}")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FilterKind, E> {
                v.parse().map_err(E::custom)
            }
        }
        if d.is_human_readable() {
            d.deserialize_str(KindVisitor)
        } else {
            d.deserialize_u8(KindVisitor)
        }
    }
}

/// Which filter a replica holds and how it is sized. Every replica of a filter must use the same
/// spec: the parameter digest on the wire enforces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilterSpec {
    /// The filter type.
    pub kind: FilterKind,
    /// Elements the filter holds (scalable kinds: its first sub-filter, or each writer's).
    pub capacity: u64,
    /// Target false positive rate (scalable kinds: the compounded bound).
    pub fpr: f64,
    /// Hash seed; [`DEFAULT_SEED`] if absent.
    #[serde(default)]
    pub seed: Option<u64>,
    /// The window of `expiring_bloom` ([`ExpirySpec::default`] if absent); no other kind has
    /// one. `capacity` is then the elements added per window, `fpr` the window's.
    #[serde(default)]
    pub expiry: Option<ExpirySpec>,
    /// `go_bloom` only: its `m` and `k` as given, instead of the estimate for `capacity` and
    /// `fpr` (what importing a Go service's filter into a new key creates). Absent from the
    /// encoding when absent, so that every other spec encodes as before.
    /// Boxed: a spec travels inside the RESP front end's commands, which it would otherwise
    /// make larger than an error path should carry (absent for every kind but one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Box<BloomShape>>,
    /// Scalable kinds: each sub-filter's capacity over its predecessor's (RedisBloom's
    /// `EXPANSION`), at least 1; [`FilterSpec::DEFAULT_GROWTH`] if absent. The FPR bound holds
    /// at any growth (the sub-filters' FPRs shrink geometrically whatever their sizes). This
    /// and the two below are absent from the encoding when absent, so that specs without
    /// them encode, and older nodes decode them, as before. (Non-zero types: a spec travels
    /// inside the RESP front end's commands, which these keep as small as they were.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<NonZeroU32>,
    /// Cuckoo kinds: slots per bucket (RedisBloom's `BUCKETSIZE`), 1 to 255;
    /// [`CuckooParams::DEFAULT_BUCKET_SIZE`](crate::CuckooParams::DEFAULT_BUCKET_SIZE) if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_size: Option<NonZeroU8>,
    /// Cuckoo kinds: the kick quota of an insertion (RedisBloom's `MAXITERATIONS`);
    /// [`CuckooParams::DEFAULT_MAX_KICKS`](crate::CuckooParams::DEFAULT_MAX_KICKS) if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kicks: Option<NonZeroU32>,
    /// Per-writer kinds: the lowest writer id that writes, from which the writers' shares of
    /// the FPR bound are counted ([`crate::writer_fpr`]); 0 if absent. Replicas claim their ids
    /// from 1: with 1, the first writer has half the bound (as a single series has), not a
    /// sixth. The RESP front end creates its keys so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_writer: Option<NonZeroU16>,
}

/// A Bloom filter's `m` and `k`, as a spec names them ([`FilterSpec::shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BloomShape {
    /// Bits `m`.
    pub bits: u64,
    /// Hash functions `k`.
    pub hashes: u32,
}

/// How long the elements of an `expiring_bloom` live, in wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpirySpec {
    /// The window: an element lives between `window_ms·(epochs - 1)/epochs` and `window_ms`
    /// after its add (time is cut into `epochs` epochs of `window_ms / epochs`).
    pub window_ms: u64,
    /// Epochs per window (default 8): more epochs expire more precisely and cost more
    /// memory per element (each live epoch is its own Bloom filter).
    #[serde(default = "ExpirySpec::default_epochs")]
    pub epochs: u32,
    /// Clock skew between replicas the filter accepts, in epochs (default 1, below
    /// `epochs`): states and deltas further ahead are refused.
    #[serde(default = "ExpirySpec::default_max_skew")]
    pub max_skew_epochs: u32,
}

impl ExpirySpec {
    fn default_epochs() -> u32 {
        8
    }

    fn default_max_skew() -> u32 {
        1
    }

    /// A window of `window_ms` with the default epochs and skew bound.
    pub fn new(window_ms: u64) -> Self {
        ExpirySpec {
            window_ms,
            epochs: Self::default_epochs(),
            max_skew_epochs: Self::default_max_skew(),
        }
    }

    /// Length of one epoch in milliseconds.
    pub fn epoch_ms(&self) -> u64 {
        self.window_ms / u64::from(self.epochs.max(1))
    }
}

/// One hour in 8 epochs of 7.5 minutes, clocks at most one epoch (7.5 minutes) apart.
impl Default for ExpirySpec {
    fn default() -> Self {
        Self::new(3_600_000)
    }
}

impl FilterSpec {
    /// A spec with the default seed.
    pub fn new(kind: FilterKind, capacity: u64, fpr: f64) -> Self {
        FilterSpec {
            kind,
            capacity,
            fpr,
            seed: None,
            expiry: None,
            shape: None,
            growth: None,
            bucket_size: None,
            max_kicks: None,
            first_writer: None,
        }
    }

    /// Default [`FilterSpec::growth`].
    pub const DEFAULT_GROWTH: u32 = 2;

    /// This spec with scalable sub-filters growing by `growth` (kept absent at the default,
    /// so that the spec equals and encodes as one that never named it; 0, which no series
    /// takes, too).
    pub fn with_growth(self, growth: u32) -> Self {
        FilterSpec {
            growth: NonZeroU32::new(growth).filter(|g| g.get() != Self::DEFAULT_GROWTH),
            ..self
        }
    }

    /// This spec with writers counted from `first` ([`FilterSpec::first_writer`]) if its kind
    /// has a series per writer (absent at 0, and for the other kinds).
    pub fn with_first_writer(self, first: ReplicaId) -> Self {
        FilterSpec {
            first_writer: NonZeroU16::new(first).filter(|_| self.kind.per_writer()),
            ..self
        }
    }

    /// This spec with cuckoo buckets of `bucket_size` slots (absent at the default, and at 0,
    /// which no table takes).
    pub fn with_bucket_size(self, bucket_size: u8) -> Self {
        let default = crate::CuckooParams::DEFAULT_BUCKET_SIZE;
        FilterSpec {
            bucket_size: NonZeroU8::new(bucket_size).filter(|b| b.get() != default),
            ..self
        }
    }

    /// This spec with a cuckoo kick quota of `max_kicks` (absent at the default, and at 0).
    pub fn with_max_kicks(self, max_kicks: u32) -> Self {
        let default = crate::CuckooParams::DEFAULT_MAX_KICKS;
        FilterSpec {
            max_kicks: NonZeroU32::new(max_kicks).filter(|k| k.get() != default),
            ..self
        }
    }

    /// [`FilterSpec::growth`] or its default.
    pub fn growth(&self) -> u32 {
        self.growth.map_or(Self::DEFAULT_GROWTH, NonZeroU32::get)
    }

    /// [`FilterSpec::bucket_size`] or its default.
    pub fn bucket_size(&self) -> u8 {
        (self.bucket_size).map_or(crate::CuckooParams::DEFAULT_BUCKET_SIZE, NonZeroU8::get)
    }

    /// [`FilterSpec::first_writer`] or 0.
    pub fn first_writer(&self) -> ReplicaId {
        self.first_writer.map_or(0, NonZeroU16::get)
    }

    /// [`FilterSpec::max_kicks`] or its default.
    pub fn max_kicks(&self) -> u32 {
        (self.max_kicks).map_or(crate::CuckooParams::DEFAULT_MAX_KICKS, NonZeroU32::get)
    }

    /// The table of a cuckoo kind that is not scalable: `capacity` elements at `fpr`, in
    /// buckets of [`FilterSpec::bucket_size`] slots, kicking at most
    /// [`FilterSpec::max_kicks`] times, with the spec's seed.
    pub fn cuckoo_params(&self) -> Result<crate::CuckooParams, FilterError> {
        let p = crate::CuckooParams::with_capacity_and_bucket_size(
            self.capacity,
            self.fpr,
            self.bucket_size(),
        )?;
        crate::CuckooParams {
            max_kicks: self.max_kicks(),
            seed: self.seed(),
            ..p
        }
        .validated()
    }

    /// A `go_bloom` spec of exactly these `m` and `k` (capacity and error rate as they
    /// imply: the elements at which `k` is optimal, and the FPR there).
    pub fn go_bloom(params: crate::GoBloomParams) -> Self {
        let capacity = params.capacity();
        let fpr = crate::BloomParams {
            bits: params.bits,
            hashes: params.hashes,
            seed: 0,
            capacity,
        }
        .fpr_after(capacity as f64)
        .clamp(1e-300, 0.999_999);
        FilterSpec {
            shape: Some(Box::new(BloomShape {
                bits: params.bits,
                hashes: params.hashes,
            })),
            ..FilterSpec::new(FilterKind::GoBloom, capacity, fpr)
        }
    }

    /// This spec with an expiry window (for `expiring_bloom`).
    pub fn with_expiry(self, expiry: ExpirySpec) -> Self {
        FilterSpec {
            expiry: Some(expiry),
            ..self
        }
    }

    /// The hash seed.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or(DEFAULT_SEED)
    }

    /// Bytes a new filter of this spec takes, computed from its parameters without building
    /// it: a node checks a filter created at run time against its memory limit before
    /// allocating anything. Scalable kinds count their first sub-filter (they grow with what
    /// is added), `expiring_bloom` every epoch of its window; cuckoo kinds count every slot's
    /// version tag ([`crate::CuckooParams::memory_bytes`]).
    ///
    /// ```
    /// use crpf::{FilterKind, FilterSpec};
    /// let bloom = FilterSpec::new(FilterKind::GBloom, 1_000, 0.01).memory_bytes().unwrap();
    /// assert!((1_000..2_000).contains(&bloom)); // 9,586 bits
    /// assert!(FilterSpec::new(FilterKind::GBloom, 1_000, 2.0).memory_bytes().is_err());
    /// ```
    pub fn memory_bytes(&self) -> Result<u64, FilterError> {
        use crate::core::params::BloomParams;
        let bloom =
            || BloomParams::with_capacity(self.capacity, self.fpr).map(|p| p.memory_bytes());
        let cuckoo = || self.cuckoo_params().map(|p| p.memory_bytes());
        match self.kind {
            FilterKind::GBloom | FilterKind::ScGBloom | FilterKind::WriterScGBloom => bloom(),
            FilterKind::BlockedBloom => BloomParams::with_capacity(self.capacity, self.fpr)
                .and_then(crate::core::blocked_bloom::blocked_params)
                .map(|p| p.memory_bytes()),
            FilterKind::ExpiringBloom => {
                let epochs = self.expiry.unwrap_or_default().epochs.max(1);
                Ok(bloom()?.saturating_mul(u64::from(epochs)))
            }
            FilterKind::GCuckoo
            | FilterKind::OrCuckoo
            | FilterKind::ScGCuckoo
            | FilterKind::ScOrCuckoo
            | FilterKind::WriterScGCuckoo
            | FilterKind::WriterScOrCuckoo
            | FilterKind::CountingCuckoo => cuckoo(),
            FilterKind::GoBloom => match self.shape.as_deref() {
                Some(shape) => crate::GoBloomParams {
                    bits: shape.bits,
                    hashes: shape.hashes,
                }
                .validated(),
                None => crate::GoBloomParams::estimate(self.capacity, self.fpr),
            }
            .map(|p| p.memory_bytes()),
            // One writer's counters; each further writing replica as much again.
            FilterKind::CountMinSketch => {
                crate::core::cms::CmsParams::from_spec(self).map(|p| p.memory_bytes())
            }
            // One writer's counters and heap slots; each further writing replica as much again.
            FilterKind::TopK => {
                crate::core::topk::TopkParams::from_spec(self).map(|p| p.memory_bytes())
            }
            // One writer's segments at most; each further writing replica as much again.
            FilterKind::TDigest => {
                crate::core::tdigest::TdigestParams::from_spec(self).map(|p| p.memory_bytes())
            }
        }
    }

    /// A `t_digest` of RedisBloom's `compression` (`TDIGEST.CREATE`): its capacity is the
    /// compression (its fpr unused, 0.5).
    pub fn t_digest(compression: u32) -> Self {
        FilterSpec::new(FilterKind::TDigest, u64::from(compression), 0.5)
    }

    /// A `top_k` listing `k` items with RedisBloom's `width`, `depth` and `decay`
    /// (`TOPK.RESERVE`): its capacity is `k`, its fpr the decay, its [`FilterSpec::shape`] the
    /// width (`bits`) and depth (`hashes`), RedisBloom's defaults (8, 7) if absent.
    pub fn top_k(k: u32, width: u32, depth: u32, decay: f64) -> Self {
        FilterSpec {
            shape: Some(Box::new(BloomShape {
                bits: u64::from(width),
                hashes: depth,
            })),
            ..FilterSpec::new(FilterKind::TopK, u64::from(k), decay)
        }
    }

    /// A `count_min_sketch` of `depth` rows of `width` counters (RedisBloom's
    /// `CMS.INITBYDIM`): its capacity is the width, its fpr `2^-depth`, the probability that
    /// an estimate exceeds the sketch's bound.
    pub fn count_min(width: u32, depth: u32) -> Self {
        FilterSpec::new(
            FilterKind::CountMinSketch,
            u64::from(width),
            0.5f64.powi(depth.min(crate::core::cms::CmsParams::MAX_DEPTH + 1) as i32),
        )
    }
}

/// The parameters of a scalable kind sized by `spec`.
pub(crate) fn scalable_params(
    spec: &FilterSpec,
) -> Result<crate::core::scalable::ScalableParams, FilterError> {
    let p = crate::core::scalable::ScalableParams::with_capacity(spec.capacity, spec.fpr)?;
    crate::core::scalable::ScalableParams {
        seed: spec.seed(),
        growth: spec.growth(),
        bucket_size: spec.bucket_size(),
        max_kicks: spec.max_kicks(),
        ..p
    }
    .validated()
}

/// What a replica needs of a filter type, implemented once per type (in its own file).
pub trait ReplicatedFilter:
    Lattice + Membership + CheckRemote + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Its kind in the registry.
    const KIND: FilterKind;
    /// Whether it removes: then it implements [`ObservedRemove`] and
    /// [`ReplicatedFilter::observed_remove`] returns it.
    const REMOVABLE: bool = false;
    /// Whether it counts occurrences: then it implements [`Counted`] and
    /// [`ReplicatedFilter::counted`] returns it.
    const COUNTING: bool = false;
    /// Whether an id may serve a later run of a replica. The tagged kinds continue safely above
    /// a floor (reservations, retirement floors); a kind whose per-id state a later run could
    /// not continue (per-id counts, which only that id raises) takes a new id at every start
    /// and never a retired one.
    const REUSES_IDS: bool = true;
    /// Whether the kind reads the clock a replica passes in ([`ReplicatedFilter::tick`],
    /// [`ReplicatedFilter::contains_as_of`]): a replica reads no clock for the others.
    const CLOCKED: bool = false;
    /// Whether a peer's full state is merged piece by piece as its chunks arrive
    /// ([`ReplicatedFilter::merge_state_piece`]), so that a replica catching up never holds
    /// it whole.
    const MERGES_STATE_PIECES: bool = false;

    /// An empty filter sized by `spec` (whose kind is [`ReplicatedFilter::KIND`]); kinds
    /// with tags issue them as `replica`.
    fn from_spec(spec: &FilterSpec, replica: ReplicaId) -> Result<Self, FilterError>;

    /// Appends the full state's encoding (what decoding the kind reads back) to `out`. The
    /// default serializes; a kind may write the same bytes without an intermediate copy.
    fn encode_state_into(&self, out: &mut Vec<u8>) {
        let mut ser = serde_cbor::Serializer::new(out).packed_format();
        self.serialize(&mut ser)
            .expect("CBOR into a Vec cannot fail");
    }

    /// The length of the full state's encoding, for kinds that [merge states piece by
    /// piece](ReplicatedFilter::MERGES_STATE_PIECES) (their parameters fix it); `None` for
    /// the others.
    fn encoded_state_len(&self) -> Option<u64> {
        None
    }

    /// Appends bytes `offset..offset + len` (cut at the end) of the full state's encoding,
    /// read from the state as it is now, for kinds that [merge states piece by
    /// piece](ReplicatedFilter::MERGES_STATE_PIECES): a push is then written a chunk at a time
    /// rather than encoded whole beside the state. Pieces read at different moments join
    /// parts of states this replica held, which a receiver may merge like any piece. The
    /// other kinds refuse.
    fn encode_state_piece(
        &self,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        let _ = (offset, len, out);
        Err(FilterError::Incompatible(format!(
            "a {} state is encoded whole, not in pieces",
            Self::KIND
        )))
    }

    /// Joins bytes `offset..` of a peer's encoded full state (of `total_len` bytes, for
    /// these parameters) into this one, for kinds that [merge states piece by
    /// piece](ReplicatedFilter::MERGES_STATE_PIECES): each piece joins a part of the peer's
    /// state, which is an inflation on its own. A piece that does not fit the encoding
    /// changes nothing. The other kinds refuse.
    fn merge_state_piece(
        &mut self,
        total_len: u64,
        offset: u64,
        piece: &[u8],
    ) -> Result<(), FilterError> {
        let _ = (total_len, offset, piece);
        Err(FilterError::Incompatible(format!(
            "a {} state is merged whole, not in pieces",
            Self::KIND
        )))
    }

    /// Digest of the parameters: replicas exchange state only with equal digests.
    fn params_digest(&self) -> u64;

    /// Feeds a canonical form of the state to `h`: equal for equivalent states whatever their
    /// layout (cuckoo placements, which slot holds which tag), so that replicas can tell
    /// whether they agree by comparing digests.
    fn digest_state(&self, h: &mut Xxh3);

    /// Sub-filters of a scalable filter (1 otherwise).
    fn sub_filters(&self) -> usize {
        1
    }

    /// Makes this replica's future updates `replica`'s (called once its id is claimed): the
    /// OR kinds issue their tags under it, the per-writer kinds add into its series.
    fn set_writer(&mut self, replica: ReplicaId) {
        if let Some(f) = self.observed_remove_mut() {
            f.set_replica(replica)
        }
    }

    /// Time passed: `now_ms` is the wall clock (milliseconds since the UNIX epoch), which
    /// the replica passes in (the core reads no clock). Kinds whose elements expire move their
    /// window; whether the state changed. Default: nothing to do.
    fn tick(&mut self, _now_ms: u64) -> bool {
        false
    }

    /// Membership as of `now_ms` (see [`ReplicatedFilter::tick`]); default `contains`.
    fn contains_as_of(&self, item: &[u8], _now_ms: u64) -> bool {
        self.contains(item)
    }

    /// What [`CheckRemote::check_remote`] cannot check without the time: a kind with a clock
    /// refuses a state further ahead of `now_ms` than its skew bound. Default: `Ok`.
    fn check_remote_as_of(&self, _other: &Self, _now_ms: u64) -> Result<(), FilterError> {
        Ok(())
    }

    /// [`ReplicatedFilter::check_remote_as_of`] for a delta.
    fn check_remote_delta_as_of(
        &self,
        _delta: &<Self as crate::core::delta::DeltaState>::Delta,
        _now_ms: u64,
    ) -> Result<(), FilterError> {
        Ok(())
    }

    /// Starts loading the cache lines `item` will touch, without waiting: batches call it for
    /// an item a few places ahead so that the cache misses of a large filter overlap across
    /// items. Only a hint; default nothing.
    fn prefetch(&self, _item: &[u8]) {}

    /// [`prefetch`](Self::prefetch) for an add of the item rather than a query: kinds whose
    /// adds write lines a query does not read (ORCF's tags) load those too. Default
    /// [`prefetch`](Self::prefetch).
    fn prefetch_add(&self, item: &[u8]) {
        self.prefetch(item)
    }

    /// How many places ahead of the current item a batch calls [`prefetch`](Self::prefetch):
    /// what keeps enough cache misses in flight depends on the lines an item touches. 0, the
    /// default, for kinds that do not prefetch.
    fn prefetch_ahead(&self) -> usize {
        0
    }

    /// A lock-free reader of the state, for the kinds that have one (`g_bloom`): the replica
    /// answers queries through it without taking the state's lock.
    fn shared_reader(&self) -> Option<crate::core::shared_bloom::BloomReader> {
        None
    }

    /// The counting API, for the kinds that count.
    fn counted(&self) -> Option<&dyn Counted> {
        None
    }

    /// The counting API, mutably.
    fn counted_mut(&mut self) -> Option<&mut dyn Counted> {
        None
    }

    /// The tag API, for the kinds that remove.
    fn observed_remove(&self) -> Option<&dyn ObservedRemove> {
        None
    }

    /// The tag API, mutably.
    fn observed_remove_mut(&mut self) -> Option<&mut dyn ObservedRemove> {
        None
    }

    /// Every live occurrence of the state, located ([`Occurrence`]): what
    /// [`ReplicatedFilter::import_occurrences`] re-adds into another filter of the same
    /// parameters. The observed-remove kinds list one per entry, in the order of
    /// [`ObservedRemove::dots`]; `counting_cuckoo` one per slot with a positive multiplicity.
    /// Empty for the other kinds, which have no tags or counts of a replica: a restore merges
    /// their states instead.
    fn live_occurrences(&self) -> Vec<Occurrence> {
        Vec::new()
    }

    /// Re-adds `occurrences`, located as in a filter of the same parameters (its
    /// [`ReplicatedFilter::live_occurrences`], a dump's, whole or a part of them), as this
    /// replica's own updates: each entry of an observed-remove kind under a fresh tag of this
    /// replica, each counted slot as this replica's own count. The tags and counts of the
    /// filter they came from belong to other replicas (or another incarnation), so they are
    /// never merged as they are. Each goes into the sub-filter (and writer's series) it came
    /// from, placed as an add would be, or, where the kicks run out, overflowing its bucket as
    /// a merge would; no sub-filter is left with more entries than `room` allows. Answers the
    /// occurrences added. All or nothing: an error ([`ReplicatedFilter::check_import`]'s,
    /// [`FilterError::ClockExhausted`]) changes nothing. Kinds without tags or counts refuse
    /// ([`FilterError::Incompatible`]): merge their states.
    fn import_occurrences(
        &mut self,
        _occurrences: &[Occurrence],
        _room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        Err(not_imported(Self::KIND))
    }

    /// Whether [`ReplicatedFilter::import_occurrences`] would take `occurrences` now: each
    /// fits the parameters ([`FilterError::Incompatible`]), no sub-filter would be left past
    /// its room ([`FilterError::NoRoom`]), no sub-filter past the limits, no count past
    /// [`crate::MAX_COUNTER`]. Checks a whole dump before its parts are imported one by one.
    fn check_import(
        &self,
        _occurrences: &[Occurrence],
        _room: &ImportRoom,
    ) -> Result<(), FilterError> {
        Err(not_imported(Self::KIND))
    }
}

/// The refusal of an import by a kind without tags or counts.
fn not_imported(kind: FilterKind) -> FilterError {
    FilterError::Incompatible(format!(
        "a {kind} filter re-adds no occurrences: merge its states"
    ))
}

/// How many entries an import ([`ReplicatedFilter::import_occurrences`]) may leave in each
/// sub-filter: its slots, as adds would, or, if more, as many as the dumped filter's own
/// sub-filter held. A state merged from replicas that filled a table concurrently holds more
/// than its slots; it still loads into an empty filter of its spec, while a dump loaded into
/// a filter that holds items too must fit beside them, and repeated loads cannot overflow a
/// table without bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportRoom {
    held: std::collections::BTreeMap<(ReplicaId, u32), u64>,
}

impl ImportRoom {
    /// The room of a dump of `kind` whose live occurrences are `occurrences` (all of them):
    /// the entries each of its sub-filters held, a counted slot being one entry whatever its
    /// count.
    pub fn of(kind: FilterKind, occurrences: &[Occurrence]) -> Self {
        let mut held = std::collections::BTreeMap::new();
        for o in occurrences.iter().filter(|o| o.count > 0) {
            let entries = if kind.counting() { 1 } else { o.count };
            let h: &mut u64 = held.entry((o.series, o.sub)).or_default();
            *h = h.saturating_add(entries);
        }
        ImportRoom { held }
    }

    /// Entries sub-filter `sub` of `series`, of `slots` slots, may hold after an import.
    pub fn of_sub(&self, series: ReplicaId, sub: u32, slots: u64) -> u64 {
        slots.max(self.held.get(&(series, sub)).copied().unwrap_or(0))
    }

    /// [`FilterError::NoRoom`] if sub-filter `sub` of `series`, of `slots` slots, would hold
    /// `entries` entries past its room.
    pub(crate) fn check(
        &self,
        series: ReplicaId,
        sub: u32,
        slots: u64,
        entries: u64,
    ) -> Result<(), FilterError> {
        let room = self.of_sub(series, sub, slots);
        if entries > room {
            return Err(FilterError::NoRoom {
                series,
                sub,
                entries,
                room,
            });
        }
        Ok(())
    }
}

/// One live occurrence of a cuckoo-table filter where it sits, without its item: what a dump
/// of one filter carries into another of the same parameters
/// ([`ReplicatedFilter::live_occurrences`], [`ReplicatedFilter::import_occurrences`]). The
/// same fingerprint in the same bucket pair of the same sub-filter is the same membership and
/// the same `CF.COUNT` multiplicity as the item gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Occurrence {
    /// The writer whose series holds it (the per-writer kinds; 0 for the others).
    pub series: ReplicaId,
    /// Its sub-filter (the scalable kinds; 0 for the others).
    pub sub: u32,
    /// One of its two candidate buckets.
    pub bucket: u64,
    /// Its fingerprint.
    pub fp: u16,
    /// Occurrences there: 1 for an entry of an observed-remove kind (each has its own tag;
    /// more re-add that many entries), the multiplicity of a slot of `counting_cuckoo`.
    pub count: u64,
}

impl Occurrence {
    /// The occurrence at `(bucket, fp)` of a filter without series or sub-filters.
    pub fn at(bucket: u64, fp: u16, count: u64) -> Self {
        Occurrence {
            series: 0,
            sub: 0,
            bucket,
            fp,
            count,
        }
    }
}

/// The tags re-adding `occurrences` issues (their counts' sum), or
/// [`FilterError::ClockExhausted`] if a replica at `clock` has fewer timestamps left: checked
/// before anything is placed.
pub(crate) fn tags_to_issue(
    occurrences: &[Occurrence],
    replica: ReplicaId,
    clock: u64,
) -> Result<u64, FilterError> {
    let n = occurrences
        .iter()
        .try_fold(0u64, |n, o| n.checked_add(o.count))
        .ok_or(FilterError::ClockExhausted { replica })?;
    match clock.checked_add(n) {
        Some(last) if last <= crate::core::causal::MAX_COUNTER => Ok(n),
        _ => Err(FilterError::ClockExhausted { replica }),
    }
}

/// The tag API of observed-remove filters (thesis Spec. 4 and 8): adds issue version tags,
/// removes name the tag they remove, and the causal history records every tag observed.
pub trait ObservedRemove {
    /// The replica id tags are issued under.
    fn replica(&self) -> ReplicaId;
    /// Issues future tags under another id (its timestamps continue from what it observed).
    fn set_replica(&mut self, replica: ReplicaId);
    /// Highest timestamp this replica may have issued.
    fn clock(&self) -> u64;
    /// Never issue a timestamp at or below `floor`.
    fn advance_clock(&mut self, floor: u64);
    /// Adds the item, returning the tag issued.
    fn add_dot(&mut self, item: &[u8]) -> Result<Dot, FilterError>;
    /// Removes one occurrence of the item, returning the tag of the entry removed.
    fn remove_dot(&mut self, item: &[u8]) -> Option<Dot>;
    /// Live entries matching the item (its fingerprint where it may sit): how many times it
    /// was added and not removed, plus any other item sharing them (RedisBloom's `CF.COUNT`).
    fn occurrences(&self, item: &[u8]) -> u64;
    /// Tags of the live entries.
    fn dots(&self) -> Vec<Dot>;
    /// Calls `f` with the tag of every live entry, in no particular order, without collecting
    /// them.
    fn for_each_dot(&self, f: &mut dyn FnMut(Dot)) {
        self.dots().into_iter().for_each(f)
    }
    /// Every tag observed, live or removed (borrowed where the filter keeps one history,
    /// joined where it keeps one per series).
    fn history(&self) -> std::borrow::Cow<'_, CausalContext>;
}

/// The API of kinds that count occurrences (a multiset): adds count one more occurrence
/// ([`crate::Membership::add`]), removes take one that is live, never below zero.
pub trait Counted {
    /// The multiplicity of the item (that of every element sharing its slot, for a false
    /// positive).
    fn count(&self, item: &[u8]) -> u64;
    /// Removes one live occurrence of the item and names it (its source replica and its number
    /// among that source's occurrences of the item); `None`, changing nothing, at multiplicity 0.
    fn remove_one(&mut self, item: &[u8]) -> Option<Dot>;
}

/// Feeds an observed-remove state to a digest: its live tags (a tag names one entry), as an
/// order-free sum, and its history. Shared by the OR kinds' [`ReplicatedFilter::digest_state`].
pub(crate) fn digest_observed_remove(f: &dyn ObservedRemove, h: &mut Xxh3) {
    let mut sum = SetSum::default();
    f.for_each_dot(&mut |d| sum.add(&d.pack().to_le_bytes()));
    sum.finish(h);
    h.update(b"history");
    for (r, (a, b)) in f.history().ranges() {
        h.update(&r.to_le_bytes());
        h.update(&a.to_le_bytes());
        h.update(&b.to_le_bytes());
    }
}

/// An order-free digest of a multiset: the count and the wrapping sum of each element's
/// xxh3-128. Equal multisets give equal sums in any order; different ones collide with
/// probability about 2^-128 (the elements are not chosen against the hash). Lets a state
/// digest read entries where they lie, without collecting and sorting them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SetSum {
    count: u64,
    sum: u128,
}

impl SetSum {
    /// Inlined so that an element built in registers (the cuckoo kinds' 10-byte entries) is
    /// hashed from them: called through a slice in memory, its two partial writes were read
    /// back across their boundary, which store forwarding cannot serve (a tenth of a
    /// `g_cuckoo` add in the node's profile).
    #[inline(always)]
    pub(crate) fn add(&mut self, element: &[u8]) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(xxhash_rust::xxh3::xxh3_128(element));
    }

    pub(crate) fn finish(&self, h: &mut Xxh3) {
        h.update(&self.count.to_le_bytes());
        h.update(&self.sum.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_wire_ids_round_trip_and_are_unique() {
        for (i, k) in FilterKind::ALL.iter().enumerate() {
            assert_eq!(FilterKind::from_wire_id(k.wire_id()), Some(*k));
            assert_eq!(k.name().parse::<FilterKind>(), Ok(*k));
            assert!(
                FilterKind::ALL[..i]
                    .iter()
                    .all(|o| o.wire_id() != k.wire_id())
            );
        }
        assert!("bloom".parse::<FilterKind>().is_err());
        assert_eq!(FilterKind::from_wire_id(255), None);
    }

    #[cfg(feature = "node")]
    #[test]
    fn serialized_by_name_in_json_and_by_id_in_cbor() {
        let k = FilterKind::ScOrCuckoo;
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"sc_or_cuckoo\"");
        assert_eq!(serde_cbor::ser::to_vec_packed(&k).unwrap(), [0x05]);
        let back: FilterKind = serde_cbor::from_slice(&[0x05]).unwrap();
        assert_eq!(back, k);
        assert!(serde_cbor::from_slice::<FilterKind>(&[0x18, 0xff]).is_err());
    }
}
