//! The Prometheus exporter (metrics-exporter-prometheus) behind the `metrics` facade.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use crate::replica::metrics::{MERGE_DURATION, MERGE_DURATION_BUCKETS, describe};

/// Installs the global recorder and serves `/metrics` on `addr`. Must run before anything
/// records (DESIGN.md section 7); histograms get real buckets so they aggregate across
/// replicas. Outside a Tokio runtime the exporter runs on a thread of its own, so that it keeps
/// answering while the replicas are busy.
pub fn install(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(MERGE_DURATION.into()), MERGE_DURATION_BUCKETS)?
        .install()?;
    describe();
    Ok(())
}
