#![warn(missing_docs)]
//! The pure CRDT core: filters as state-based CRDTs, their parameters, hashing, estimators
//! and serialized forms. Synchronous, no I/O.

pub mod blocked_bloom;
pub mod bloom;
pub mod causal;
pub mod cms;
pub mod codec;
pub(crate) mod compact;
pub mod cuckoo;
pub mod delta;
pub mod error;
pub mod go_bloom;
pub mod hash;
pub(crate) mod huge_pages;
pub mod kind;
pub mod lattice;
pub mod params;
pub(crate) mod prefetch;
pub mod scalable;
pub mod shared_bloom;
pub mod tdigest;
pub mod topk;

// ---- issue 11: expiring and wait-free concurrent Bloom filters.
pub mod atomic_bloom;
pub mod expiring;
