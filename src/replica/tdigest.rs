//! The t-digest's operations of the request API (`tdigest.add`, `tdigest.reset`,
//! `tdigest.quantile`, `tdigest.cdf`, `tdigest.info`; RESP's `TDIGEST.ADD`, `MERGE`,
//! `RESET`), on the state under its lock. An add or a reset is an inflation without tags,
//! applied where the filters' adds are (in the caller's thread unless it waits for the
//! actor).

use super::ReplicaError;
use super::filter::AnyFilter;
use super::metrics::{OpKind, Telemetry};
use crate::TDigest;
use crate::api::{Items, Request, Response};

fn not_a_tdigest(op: &str, f: &AnyFilter) -> ReplicaError {
    ReplicaError::InvalidItem(format!("{op} needs a t_digest filter, not a {}", f.kind()))
}

fn tdigest<'a>(f: &'a AnyFilter, op: &str) -> Result<&'a TDigest, ReplicaError> {
    match f {
        AnyFilter::TDigest(t) => Ok(t),
        other => Err(not_a_tdigest(op, other)),
    }
}

/// What an update adds: `(value, weight)` pairs, and a merged source's min and max.
pub(crate) type Weighted<'a> = (&'a [(f64, u64)], Option<(f64, f64)>);

/// Adds `values` (and `bounds`) as this replica's under the write lock `f` holds, or resets
/// (`values` `None`): whether the state changed. A refusal changes nothing.
pub(crate) fn update(
    f: &mut AnyFilter,
    values: Option<Weighted<'_>>,
    telemetry: &Telemetry,
) -> Result<bool, ReplicaError> {
    let op = if values.is_some() {
        "tdigest.add"
    } else {
        "tdigest.reset"
    };
    let AnyFilter::TDigest(t) = &mut *f else {
        telemetry.op(OpKind::Add, false);
        return Err(not_a_tdigest(op, f));
    };
    match values {
        Some((values, bounds)) => match t.add_weighted(values, bounds) {
            Ok(()) => {
                telemetry.count_ops(OpKind::Add, values.len() as u64, 0);
                Ok(!values.is_empty())
            }
            Err(e) => {
                telemetry.op(OpKind::Add, false);
                Err(match e {
                    e @ crate::FilterError::Overflow { .. } => ReplicaError::Overflow(e),
                    e => ReplicaError::InvalidItem(e.to_string()),
                })
            }
        },
        None => {
            telemetry.op(OpKind::Remove, true);
            Ok(t.reset())
        }
    }
}

/// The answer of `tdigest.quantile`, `tdigest.cdf` or `tdigest.info` from the state `f`
/// (read-locked).
pub(crate) fn query(f: &AnyFilter, request: &Request) -> Result<Response, ReplicaError> {
    match request {
        Request::TdigestQuantile { quantiles } => {
            if let Some(q) = quantiles.iter().find(|q| !(0.0..=1.0).contains(*q)) {
                return Err(ReplicaError::InvalidItem(format!(
                    "a quantile is in [0, 1], not {q}"
                )));
            }
            let t = tdigest(f, "tdigest.quantile")?;
            Ok(Response::TdigestValues(t.view().quantiles(quantiles)))
        }
        Request::TdigestCdf { values } => {
            let view = tdigest(f, "tdigest.cdf")?.view();
            Ok(Response::TdigestValues(
                values.iter().map(|&v| view.cdf(v)).collect(),
            ))
        }
        Request::TdigestInfo => {
            let t = tdigest(f, "tdigest.info")?;
            let view = t.view();
            let bounds = match view.size() {
                0 => (f64::NAN, f64::NAN),
                _ => (view.min(), view.max()),
            };
            Ok(Response::TdigestInfo {
                compression: t.params().compression,
                observations: view.size(),
                centroids: t.centroids() as u64,
                writers: t.writers() as u64,
                bounds,
            })
        }
        other => unreachable!("{:?} is not a t-digest's query", other.op()),
    }
}

/// The numbers of a NATS payload: a batch of decimal texts (`what` names them in errors).
pub(crate) fn numbers(framed: &Items, what: &str) -> Result<Vec<f64>, ReplicaError> {
    (0..framed.len())
        .map(|i| {
            let text = framed.get(i);
            std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|v| !v.is_nan())
                .ok_or_else(|| {
                    ReplicaError::InvalidItem(format!(
                        "batch item {i}: {what} is a decimal number, not `{}`",
                        String::from_utf8_lossy(&text[..text.len().min(32)])
                    ))
                })
        })
        .collect()
}
