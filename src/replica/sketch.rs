//! The count-min sketch's operations of the request API (`cms.incrby`, `cms.query`,
//! `cms.info`; RESP's `CMS.INCRBY`, `CMS.QUERY`, `CMS.INFO`), on the state under its lock.
//! An increment is a grow-only update: applied where the filters' adds are
//! ([`super::actor`]'s `Updates::apply`, in the caller's thread unless it waits for the actor),
//! each pair's estimate read right after its increment under the same write lock.

use super::ReplicaError;
use super::filter::AnyFilter;
use super::metrics::{OpKind, Telemetry};
use crate::CountMinSketch;
use crate::api::{Items, Request, Response};

/// The sketch `f` holds, or the refusal of `op` on another kind.
fn sketch<'a>(f: &'a AnyFilter, op: &str) -> Result<&'a CountMinSketch, ReplicaError> {
    match f {
        AnyFilter::CountMinSketch(s) => Ok(s),
        other => Err(not_a_sketch(op, other)),
    }
}

fn not_a_sketch(op: &str, f: &AnyFilter) -> ReplicaError {
    ReplicaError::InvalidItem(format!(
        "{op} needs a count_min_sketch filter, not a {}",
        f.kind()
    ))
}

/// Refuses an item over `max_item_bytes`; an empty one is a sketch's item like any.
fn check_items(items: &Items, max_item_bytes: usize) -> Result<(), ReplicaError> {
    match items.iter().position(|i| i.len() > max_item_bytes) {
        Some(i) => Err(ReplicaError::InvalidItem(format!(
            "item {i}: {} bytes, over max_item_bytes ({max_item_bytes})",
            items.get(i).len()
        ))),
        None => Ok(()),
    }
}

/// Adds `increments[i]` to this replica's counters of item `i`, in order, under the write
/// lock `f` holds: each item's estimate right after its own increment (RedisBloom's
/// `CMS.INCRBY` answers pair by pair). Checked whole first: a refusal changes nothing.
pub(crate) fn incr_by(
    f: &mut AnyFilter,
    items: &Items,
    increments: &[u64],
    max_item_bytes: usize,
    telemetry: &Telemetry,
) -> Result<Vec<u64>, ReplicaError> {
    let r = (|| {
        if items.len() != increments.len() {
            return Err(ReplicaError::InvalidItem(format!(
                "{} items and {} increments",
                items.len(),
                increments.len()
            )));
        }
        check_items(items, max_item_bytes)?;
        let AnyFilter::CountMinSketch(s) = &mut *f else {
            return Err(not_a_sketch("cms.incrby", f));
        };
        Ok(items
            .iter()
            .zip(increments)
            .map(|(item, &n)| s.increment(item, n))
            .collect::<Vec<u64>>())
    })();
    match &r {
        Ok(counts) => telemetry.count_ops(OpKind::Add, counts.len() as u64, 0),
        Err(_) => telemetry.op(OpKind::Add, false),
    }
    r
}

/// The answer of `cms.query` or `cms.info` from the state `f` (read-locked).
pub(crate) fn query(
    f: &AnyFilter,
    request: &Request,
    max_item_bytes: usize,
) -> Result<Response, ReplicaError> {
    match request {
        Request::CmsQuery { items } => {
            check_items(items, max_item_bytes)?;
            let s = sketch(f, "cms.query")?;
            Ok(Response::CmsCount(
                items.iter().map(|i| s.count(i)).collect(),
            ))
        }
        Request::CmsInfo => {
            let s = sketch(f, "cms.info")?;
            Ok(Response::CmsInfo {
                width: s.params().width,
                depth: s.params().depth,
                count: s.total(),
            })
        }
        other => unreachable!("{:?} is not a sketch's query", other.op()),
    }
}

/// The `cms.incrby` request of a NATS payload: a batch of pairs, each item followed by its
/// increment in decimal (what `CMS.INCRBY`'s arguments are).
pub(crate) fn incr_by_request(
    framed: Items,
    ack: Option<crate::api::AckLevel>,
) -> Result<Request, ReplicaError> {
    if !framed.len().is_multiple_of(2) {
        return Err(ReplicaError::InvalidItem(format!(
            "cms.incrby takes pairs (an item, then its increment): {} batch items",
            framed.len()
        )));
    }
    let increments = (1..framed.len())
        .step_by(2)
        .map(|i| {
            let text = framed.get(i);
            std::str::from_utf8(text)
                .ok()
                .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| {
                    ReplicaError::InvalidItem(format!(
                        "batch item {i}: an increment is a decimal number of 0 to 2^64 - 1, not `{}`",
                        String::from_utf8_lossy(&text[..text.len().min(32)])
                    ))
                })
        })
        .collect::<Result<Vec<u64>, _>>()?;
    Ok(Request::CmsIncrBy {
        items: framed.every_other(),
        increments,
        ack,
    })
}
