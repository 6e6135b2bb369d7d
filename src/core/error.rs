//! The one error type of the core.

use thiserror::Error;

use super::causal::ReplicaId;

/// Everything that can go wrong in the pure filter core.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FilterError {
    /// A cuckoo insertion ran out of kicks. The filter is exactly as it was before the call.
    #[error("filter is full: insertion ran out of {max_kicks} kicks")]
    Full {
        /// The kick quota that was exhausted.
        max_kicks: u32,
    },
    /// Merge or comparison of states built with different parameters. `self` is untouched.
    #[error("incompatible states: {0}")]
    Incompatible(String),
    /// Parameters no filter can be built from.
    #[error("invalid parameter `{field}`: {reason}")]
    InvalidParams {
        /// The offending parameter.
        field: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A serialized state that is truncated, tampered with or inconsistent.
    #[error("malformed state: {0}")]
    Malformed(String),
    /// The replica has issued every timestamp a tag can carry
    /// ([`crate::core::causal::MAX_COUNTER`]): it can add again only under a new replica id.
    /// The filter is exactly as it was before the call.
    #[error("replica {replica} exhausted the timestamps of its version tags")]
    ClockExhausted {
        /// The replica id whose timestamps are used up.
        replica: ReplicaId,
    },
    /// A state or delta received from another replica carries a tag of this replica's own id
    /// above this replica's clock. Only this replica issues tags under its id, so the sender
    /// shares the id or forged the tag; merging it would push the clock up to that tag (up to
    /// exhausting it) or make a future tag look already observed. Nothing was merged.
    #[error(
        "remote state carries tag ({replica}, {counter}) of this replica, above its clock {clock}"
    )]
    OwnDotAhead {
        /// This replica's id.
        replica: ReplicaId,
        /// The highest timestamp of that id the remote state carries.
        counter: u64,
        /// This replica's clock.
        clock: u64,
    },
    /// Building the filter, or growing a scalable filter by another sub-filter, would take more
    /// memory than [`crate::core::params::MAX_FILTER_BYTES`]. Nothing was allocated or changed.
    #[error("the filter would take {needed} bytes; at most {limit} are allowed")]
    TooLarge {
        /// Bytes the filter would take (a scalable filter: all its sub-filters together).
        needed: u64,
        /// The limit.
        limit: u64,
    },
    /// A scalable filter already has the most sub-filters it may have
    /// ([`crate::ScalableParams::MAX_SUB_FILTERS`]). Nothing was changed.
    #[error("a scalable filter has at most {limit} sub-filters")]
    TooManySubFilters {
        /// The limit.
        limit: usize,
    },

    /// An import ([`crate::ReplicatedFilter::import_occurrences`]) would leave a sub-filter
    /// with more entries than it has room for: its slots, as adds would, or what the dumped
    /// filter's own sub-filter held, if more ([`crate::ImportRoom`]). Nothing was changed.
    #[error(
        "no room: the import would leave sub-filter {sub} of series {series} with {entries} entries, past its room of {room}"
    )]
    NoRoom {
        /// The writer's series (0 for the kinds without series).
        series: ReplicaId,
        /// The sub-filter (0 for the kinds without sub-filters).
        sub: u32,
        /// Entries it would hold.
        entries: u64,
        /// Entries it may hold.
        room: u64,
    },

    // ---- issue 11: expiring filter.
    /// A state or delta received from another replica has a clock (its newest epoch) more than
    /// `max_skew` epochs ahead of this replica's clock. Merging it would move the
    /// low-watermark forward and expire live elements early on every replica, irreversibly;
    /// see [`crate::ExpiringBloom`]. Nothing was merged.
    #[error(
        "remote clock at epoch {remote_epoch} is more than {max_skew} epochs ahead of this replica's epoch {local_epoch}"
    )]
    ClockAhead {
        /// The newest epoch of the received state or delta.
        remote_epoch: u64,
        /// This replica's epoch.
        local_epoch: u64,
        /// The skew bound of the filter's parameters, in epochs.
        max_skew: u32,
    },
    /// A count would pass its bound (a t-digest's values beyond `2^63 - 1`, RedisBloom's
    /// bound). The filter is exactly as it was before the call.
    #[error("{what} would overflow")]
    Overflow {
        /// What would overflow.
        what: &'static str,
    },
}

impl FilterError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        FilterError::InvalidParams {
            field,
            reason: reason.into(),
        }
    }
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        FilterError::Malformed(reason.into())
    }

    /// `Ok` if two states' parameters are equal, else [`FilterError::Incompatible`] naming
    /// both: the one check every merge makes before it touches `self`.
    pub(crate) fn require_same<P: PartialEq + std::fmt::Debug>(
        what: &str,
        mine: &P,
        theirs: &P,
    ) -> Result<(), Self> {
        if mine == theirs {
            Ok(())
        } else {
            Err(FilterError::Incompatible(format!(
                "{what} parameters differ: {mine:?} vs {theirs:?}"
            )))
        }
    }
}
