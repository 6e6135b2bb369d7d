//! The top-k's operations of the request API (`topk.add`, `topk.query`, `topk.list`,
//! `topk.info`; RESP's `TOPK.ADD`/`INCRBY`, `QUERY`/`COUNT`, `LIST`, `INFO`), on the state
//! under its lock. An add is a grow-only update applied where the filters' adds are (in the
//! caller's thread unless it waits for the actor); each item's expelled item is judged right
//! after its own add under the same write lock, as RedisBloom answers item by item.

use super::ReplicaError;
use super::filter::AnyFilter;
use super::metrics::{OpKind, Telemetry};
use crate::TopK;
use crate::api::{Items, Request, Response};

fn not_a_topk(op: &str, f: &AnyFilter) -> ReplicaError {
    ReplicaError::InvalidItem(format!("{op} needs a top_k filter, not a {}", f.kind()))
}

fn topk<'a>(f: &'a AnyFilter, op: &str) -> Result<&'a TopK, ReplicaError> {
    match f {
        AnyFilter::TopK(t) => Ok(t),
        other => Err(not_a_topk(op, other)),
    }
}

/// Refuses an item over `max_item_bytes`.
fn check_items(items: &Items, max_item_bytes: usize) -> Result<(), ReplicaError> {
    match items.iter().position(|i| i.len() > max_item_bytes) {
        Some(i) => Err(ReplicaError::InvalidItem(format!(
            "item {i}: {} bytes, over max_item_bytes ({max_item_bytes})",
            items.get(i).len()
        ))),
        None => Ok(()),
    }
}

/// The items each add pushed out of the list, and whether the state changed.
type Added = (Vec<Option<Vec<u8>>>, bool);

/// Adds `increments[i]` to item `i`, in order, under the write lock `f` holds: the item each
/// add pushed out of the list, and whether the state changed. Checked whole first: a refusal
/// changes nothing.
pub(crate) fn add(
    f: &mut AnyFilter,
    items: &Items,
    increments: &[u64],
    max_item_bytes: usize,
    telemetry: &Telemetry,
) -> Result<Added, ReplicaError> {
    let r = (|| {
        if items.len() != increments.len() {
            return Err(ReplicaError::InvalidItem(format!(
                "{} items and {} increments",
                items.len(),
                increments.len()
            )));
        }
        check_items(items, max_item_bytes)?;
        let AnyFilter::TopK(t) = &mut *f else {
            return Err(not_a_topk("topk.add", f));
        };
        let before = t.own_version();
        let expelled: Vec<Option<Vec<u8>>> = items
            .iter()
            .zip(increments)
            .map(|(item, &n)| t.add(item, n))
            .collect();
        let changed = increments.iter().any(|&n| n > 0) || t.own_version() != before;
        Ok((expelled, changed))
    })();
    match &r {
        Ok((expelled, _)) => {
            let churn = expelled.iter().filter(|e| e.is_some()).count() as u64;
            telemetry.count_ops(OpKind::Add, expelled.len() as u64, 0);
            telemetry.topk_churn(churn);
        }
        Err(_) => telemetry.op(OpKind::Add, false),
    }
    r
}

/// The answer of `topk.query`, `topk.list` or `topk.info` from the state `f` (read-locked).
pub(crate) fn query(
    f: &AnyFilter,
    request: &Request,
    max_item_bytes: usize,
) -> Result<Response, ReplicaError> {
    match request {
        Request::TopkQuery { items } => {
            check_items(items, max_item_bytes)?;
            let t = topk(f, "topk.query")?;
            // One writer's heap is the list (a scan of k slots, no hashing); several writers'
            // heaps are ranked once for all the items.
            let list = (t.writers() > 1).then(|| t.list());
            Ok(Response::TopkQueried {
                listed: items
                    .iter()
                    .map(|i| match &list {
                        Some(list) => list.iter().any(|(l, _)| *l == i),
                        None => t.query(i),
                    })
                    .collect(),
                counts: items.iter().map(|i| t.count(i)).collect(),
            })
        }
        Request::TopkList { with_count } => {
            let t = topk(f, "topk.list")?;
            Ok(Response::TopkList {
                items: t.list().into_iter().map(|(i, n)| (i.to_vec(), n)).collect(),
                with_count: *with_count,
            })
        }
        Request::TopkInfo => {
            let p = topk(f, "topk.info")?.params();
            Ok(Response::TopkInfo {
                k: p.k,
                width: p.width,
                depth: p.depth,
                decay: p.decay,
            })
        }
        other => unreachable!("{:?} is not a top-k's query", other.op()),
    }
}
