//! The error type of the evaluation harness.

use std::path::PathBuf;

use thiserror::Error;

use crate::FilterError;

/// Everything that can go wrong while running an experiment or writing its outputs.
#[derive(Debug, Error)]
pub enum EvalError {
    /// A filter refused an operation the harness relies on (construction, merge).
    #[error("filter: {0}")]
    Filter(#[from] FilterError),
    /// Reading or writing an output file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a CSV file.
    #[error("csv: {0}")]
    Csv(#[from] csv::Error),
    /// Serializing a state to measure its size.
    #[error("cbor: {0}")]
    Cbor(#[from] serde_cbor::Error),
    /// Drawing a figure.
    #[error("plot {path}: {reason}")]
    Plot {
        /// The figure being drawn.
        path: PathBuf,
        /// What the plotting backend reported.
        reason: String,
    },
    /// Options that describe no experiment (an empty grid, a zero workload).
    #[error("invalid options: {0}")]
    Options(String),
    /// A consistency check of the harness failed (e.g. delta sync against full-state sync).
    #[error("check failed: {0}")]
    Check(String),
    /// A worker thread panicked.
    #[error("a worker thread panicked: {0}")]
    Worker(String),
}

impl EvalError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| EvalError::Io { path, source }
    }
}
