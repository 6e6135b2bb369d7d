//! Cuckoo-table filters: GCF and ORCF over one shared table implementation.

mod column;
mod gcuckoo;
mod orcuckoo;
pub(crate) mod table;

pub use gcuckoo::GCuckoo;
pub(crate) use gcuckoo::check_cuckoo_delta;
pub use orcuckoo::OrCuckoo;

// Counting cuckoo filter (issue 11) and its multiset synchronisation.
mod counting;
pub mod multiset_sync;
pub use counting::{CountingCuckoo, CountingCuckooDelta, SlotCounts};

/// ORCF table logic shared with the scalable ORCF.
pub(crate) mod orcuckoo_parts {
    pub(crate) use super::orcuckoo::{
        PackedTags, PendingOr, check_listed_dots, check_tags, count_matching, merge_tables,
        pack_tags, remove_random, table_le, unpack_tags,
    };
}
