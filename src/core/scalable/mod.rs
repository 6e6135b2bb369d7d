//! Scalable filter series (thesis Spec. 5) and the scalable filters built on it (Specs. 6-8).

mod grow_only;
mod params;
pub mod partitioned;
mod sc_orcuckoo;
pub mod series;

pub use grow_only::{GrowOnlySub, ScGBloom, ScGCuckoo, ScalableGrowOnly};
pub use params::ScalableParams;
pub use partitioned::{
    Partitioned, PartitionedDelta, WriterScGBloom, WriterScGCuckoo, WriterScOrCuckoo, WriterSeries,
    writer_fpr,
};
pub use sc_orcuckoo::ScOrCuckoo;
