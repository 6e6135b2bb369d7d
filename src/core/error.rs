//! The one error type of the core.

use thiserror::Error;

/// Everything that can go wrong in the pure filter core.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
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
