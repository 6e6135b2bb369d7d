//! The Prometheus exporter (metrics-exporter-prometheus) behind the `metrics` facade.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;
use thiserror::Error;

use crate::replica::metrics::{MERGE_DURATION, MERGE_DURATION_BUCKETS, describe};

/// How long a gauge may go without being set before its series is dropped.
pub const GAUGE_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Installs the global recorder and serves `/metrics` on `addr`. Must run before anything
/// records (docs/DESIGN.md section 7); histograms get real buckets so they aggregate across
/// replicas. A gauge not set for [`GAUGE_IDLE_TIMEOUT`] is dropped from the page: replicas
/// set theirs every `metrics_interval_ms`, so only the series of expired peers end (a page
/// must not grow with every sender ever heard). Outside a Tokio runtime the exporter runs on a thread of its own, so that it keeps
/// answering while the replicas are busy.
///
/// `setting` names where the address comes from (`--metrics-addr`, `node.metrics_addr`): a
/// taken port is the common failure (a node already runs), and the error says what to change.
pub fn install(addr: SocketAddr, setting: &'static str) -> Result<(), ExporterError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE_TIMEOUT))
        .set_buckets_for_metric(Matcher::Full(MERGE_DURATION.into()), MERGE_DURATION_BUCKETS)?
        .install()
        .map_err(|e| match e {
            BuildError::FailedToCreateHTTPListener(reason) => ExporterError::Listen {
                addr,
                reason,
                setting,
            },
            e => ExporterError::Build(e),
        })?;
    describe();
    Ok(())
}

/// Why the exporter did not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ExporterError {
    /// Its address could not be bound (taken, or not an address of this host).
    #[error(
        "metrics exporter cannot listen on {addr}: {reason}; set another address with {setting}"
    )]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the listener said.
        reason: String,
        /// The option or configuration field that sets the address.
        setting: &'static str,
    },
    /// Any other failure to build or install it.
    #[error("metrics exporter: {0}")]
    Build(#[from] BuildError),
}
