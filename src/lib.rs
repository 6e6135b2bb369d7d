//! # crpf: conflict-free replicated probabilistic filters
//!
//! Bloom and cuckoo filters as state-based CRDTs (after *Conflict-Free Replicated
//! Probabilistic Filter*): replicas update them concurrently, without coordination, and
//! converge by merging states.
//!
//! | type | thesis | updates | merge |
//! |---|---|---|---|
//! | [`GBloom`] | GBF, Spec. 2 | add | bitwise OR |
//! | [`GCuckoo`] | GCF, Spec. 3 | add | union of universes through the dual table |
//! | [`OrCuckoo`] | ORCF, Spec. 4 | add, remove | observed-remove, add wins |
//! | [`ScGBloom`] | ScGBF, Spec. 6 | add | sub-filter-wise |
//! | [`ScGCuckoo`] | ScGCF, Spec. 7 | add | sub-filter-wise |
//! | [`ScOrCuckoo`] | ScORCF, Spec. 8 | add, remove | sub-filter-wise, shared history |
//! | [`ExpiringBloom`] | sliding window (issue 11) | add, time passes | epoch-wise OR, max of clocks |
//! | [`AtomicGBloom`] | GBF shared by threads | add on `&self` | atomic OR (via its `GBloom` snapshot) |
//! | [`SharedGBloom`] | GBF, a replica's `g_bloom` | add; [`BloomReader`]s query without a lock | bitwise OR |
//! | [`CountingCuckoo`] | CCF (Li, Luo, Guo) | add, remove, count | per-source PN-counters, pointwise max |
//! | [`CountMinSketch`] | count-min sketch (issue 50) | increment, count, weighted merge | a G-counter per counter by replica, pointwise max |
//! | [`TopK`] | top-k heavy hitters (issue 50) | add, list, query, count | count-min G-counters and a heap per writer, highest version |
//! | [`TDigest`] | t-digest (issue 50) | add values, quantile, CDF, rank, reset | a digest per writer (highest version) and reset floors (maximum) |
//!
//! ```
//! use crpf::{GBloom, Lattice, Membership};
//!
//! let mut here = GBloom::with_capacity(10_000, 0.01)?;
//! let mut there = here.clone();
//! here.add(b"alice")?;
//! there.add(b"bob")?;
//! here.merge(&there)?;
//! assert!(here.contains(b"alice") && here.contains(b"bob"));
//! # Ok::<(), crpf::FilterError>(())
//! ```
//!
//! The layers: [`core`] is pure and synchronous (no I/O); [`api`] is the request API's
//! vocabulary and batch framing (pure too); with the `node` feature, `replica`, `transport`,
//! `wire` and the typed NATS client `client`.

// The README's examples are doctests too (not rendered: the crate docs above are their own).
#[cfg(all(doctest, feature = "node"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub mod api;
#[cfg(feature = "node")]
pub mod client;
pub mod core;
#[cfg(feature = "eval")]
pub mod eval;
pub mod names;
#[cfg(feature = "node")]
pub mod node;
#[cfg(feature = "node")]
pub mod replica;
#[cfg(feature = "node")]
pub mod resp;
#[cfg(all(test, feature = "node"))]
mod sim;
#[cfg(feature = "node")]
pub mod transport;
#[cfg(feature = "node")]
pub mod wire;

pub use crate::core::blocked_bloom::{BlockedBloom, BlockedLayout};
pub use crate::core::bloom::GBloom;
pub use crate::core::causal::{CausalContext, Dot, MAX_COUNTER, ReplicaId};
pub use crate::core::cms::{CmsDelta, CmsParams, CountMinSketch};
pub use crate::core::cuckoo::{GCuckoo, OrCuckoo};
pub use crate::core::tdigest::{
    Digest, DigestInfo, PartRepr, SegmentRepr, TDigest, TdigestDelta, TdigestParams,
};
pub use crate::core::topk::{HeapRepr, TopK, TopkDelta, TopkParams};
// Counting cuckoo filter (issue 11).
pub use crate::core::cuckoo::multiset_sync::MultisetDiff;
pub use crate::core::cuckoo::{CountingCuckoo, CountingCuckooDelta, SlotCounts};
pub use crate::core::delta::{
    BloomDelta, CheckRemote, CuckooDelta, DeltaState, OrCuckooDelta, ScOrCuckooDelta, ScalableDelta,
};
pub use crate::core::error::FilterError;
pub use crate::core::go_bloom::{GoBloom, GoBloomParams, GoFormat, GoFormatError};
pub use crate::core::kind::{
    Counted, ExpirySpec, FilterKind, FilterSpec, ImportRoom, ObservedRemove, Occurrence,
    ReplicatedFilter,
};
pub use crate::core::lattice::{Lattice, Membership, Removable};
pub use crate::core::params::{BloomParams, CuckooParams, DEFAULT_SEED, MAX_FILTER_BYTES};
pub use crate::core::scalable::{
    GrowOnlySub, Partitioned, PartitionedDelta, ScGBloom, ScGCuckoo, ScOrCuckoo, ScalableGrowOnly,
    ScalableParams, WriterScGBloom, WriterScGCuckoo, WriterScOrCuckoo, WriterSeries, writer_fpr,
};

// ---- issue 11: expiring and wait-free concurrent Bloom filters.
pub use crate::core::atomic_bloom::AtomicGBloom;
pub use crate::core::expiring::{ExpiringBloom, ExpiringDelta, ExpiringParams};
pub use crate::core::shared_bloom::{BloomReader, SharedGBloom};
