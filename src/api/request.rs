//! The request API as types: one [`Request`] per operation with its options as fields, and
//! one [`Response`] per answer. Every way a request arrives maps onto these (a NATS request
//! by its subject, headers and payload, at the NATS edge of the replica; a RESP command, in
//! `crate::resp`; a call in this process), and one implementation answers each operation.
//! NATS headers and JSON exist only at the NATS edge.

use bytes::Bytes;

use super::batch::{self, BatchError, Limits};
use super::{AckLevel, AddMode, Op};
use crate::GoFormat;

/// The items of a batch request: spans of one buffer (a NATS payload in the batch framing,
/// or the arguments of a RESP command), not a copy or a reference count per item.
#[derive(Debug, Clone, Default)]
pub struct Items {
    buf: Bytes,
    spans: Vec<(usize, usize)>,
}

impl Items {
    /// The items at `spans` of `buf` (each `start..end` within it).
    pub fn new(buf: Bytes, spans: Vec<(usize, usize)>) -> Self {
        debug_assert!(spans.iter().all(|&(a, b)| a <= b && b <= buf.len()));
        Items { buf, spans }
    }

    /// A copy of `items` in one buffer.
    pub fn of<I, T>(items: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for item in items {
            let start = buf.len();
            buf.extend_from_slice(item.as_ref());
            spans.push((start, buf.len()));
        }
        Items {
            buf: buf.into(),
            spans,
        }
    }

    /// The items of a payload in the batch framing ([`batch::decode`]), checked as it checks
    /// them.
    pub fn framed(payload: Bytes, limits: Limits) -> Result<Self, BatchError> {
        let spans = {
            let items = batch::decode(&payload, limits)?;
            let base = payload.as_ptr() as usize;
            items
                .iter()
                .map(|i| {
                    let start = i.as_ptr() as usize - base;
                    (start, start + i.len())
                })
                .collect()
        };
        Ok(Items {
            buf: payload,
            spans,
        })
    }

    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// No items.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Item `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let (a, b) = self.spans[i];
        &self.buf[a..b]
    }

    /// The items, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.spans.iter().map(|&(a, b)| &self.buf[a..b])
    }

    /// The items as slices, for the filters' batch operations.
    pub fn slices(&self) -> Vec<&[u8]> {
        self.iter().collect()
    }

    /// Items 0, 2, 4...: the items of a batch of pairs (`cms.incrby`'s item and increment),
    /// views of the same buffer.
    pub fn every_other(self) -> Self {
        Items {
            spans: self.spans.into_iter().step_by(2).collect(),
            buf: self.buf,
        }
    }

    /// Checks the items against `limits` as [`batch::decode`] checks a framed batch, with
    /// its errors.
    pub fn check(&self, limits: Limits) -> Result<(), BatchError> {
        for (index, item) in self.iter().enumerate() {
            if index >= limits.max_items {
                return Err(BatchError::TooManyItems {
                    max: limits.max_items,
                });
            }
            batch::check_item_len(index, item.len(), limits)?;
        }
        Ok(())
    }

    /// Bytes of the items in the batch framing: what a NATS request carries.
    pub fn framed_len(&self) -> usize {
        self.spans
            .iter()
            .map(|&(a, b)| b - a + batch::LEN_BYTES)
            .sum()
    }

    /// The items in a buffer of their own: a request that waits (for the actor) then keeps
    /// only its items alive, not the whole buffer they arrived in.
    pub fn compact(self) -> Self {
        let len: usize = self.spans.iter().map(|&(a, b)| b - a).sum();
        if len == self.buf.len() {
            return self;
        }
        let mut buf = Vec::with_capacity(len);
        let spans = self
            .spans
            .iter()
            .map(|&(a, b)| {
                let start = buf.len();
                buf.extend_from_slice(&self.buf[a..b]);
                (start, buf.len())
            })
            .collect();
        Items {
            buf: buf.into(),
            spans,
        }
    }
}

/// A request of the API: the operation, its item or items, and its options.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Request {
    /// `add`: adds `item`; `mode` says what the answer tells beyond "applied".
    Add {
        /// The item.
        item: Bytes,
        /// What the answer tells.
        mode: AddMode,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `remove` (OR kinds).
    Remove {
        /// The item.
        item: Bytes,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `contains`.
    Contains {
        /// The item.
        item: Bytes,
    },
    /// `count` (counting kinds): the item's multiplicity.
    Count {
        /// The item.
        item: Bytes,
    },
    /// `madd`: adds each item; one refused item does not refuse the others.
    MAdd {
        /// The items.
        items: Items,
        /// What the answer tells of each.
        mode: AddMode,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `mremove` (OR kinds).
    MRemove {
        /// The items.
        items: Items,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `mcontains`.
    MContains {
        /// The items.
        items: Items,
    },
    /// `mcount` (counting kinds).
    MCount {
        /// The items.
        items: Items,
    },
    /// `stats`: the replica's figures.
    Stats,
    /// `import` (`go_bloom`): merges `filter`, in `format`, into the replica's.
    Import {
        /// The filter's format.
        format: GoFormat,
        /// The filter.
        filter: Bytes,
        /// The acknowledgement level (`None`: the replica's default); at `durable` it is
        /// answered once a snapshot holding it is saved.
        ack: Option<AckLevel>,
    },
    /// `export` (`go_bloom`): the filter in `format`.
    Export {
        /// The format asked for.
        format: GoFormat,
    },
    /// `cms.incrby` (`count_min_sketch`, `CMS.INCRBY`): adds `increments[i]` to this
    /// replica's counters of item `i`, in order, all or nothing. Items may be empty (a sketch
    /// only hashes them).
    CmsIncrBy {
        /// The items.
        items: Items,
        /// Each item's increment (as many as items).
        increments: Vec<u64>,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `cms.query` (`count_min_sketch`, `CMS.QUERY`): each item's estimate.
    CmsQuery {
        /// The items.
        items: Items,
    },
    /// `cms.info` (`count_min_sketch`, `CMS.INFO`): the sketch's shape and increments.
    CmsInfo,
    /// `topk.add` (`top_k`, `TOPK.ADD`, `TOPK.INCRBY`): adds `increments[i]` to item `i`'s
    /// count, in order, all or nothing.
    TopkAdd {
        /// The items.
        items: Items,
        /// Each item's increment (as many as items).
        increments: Vec<u64>,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `topk.query` (`top_k`, `TOPK.QUERY`, `TOPK.COUNT`): whether each item is listed, and
    /// its estimated count.
    TopkQuery {
        /// The items.
        items: Items,
    },
    /// `topk.list` (`top_k`, `TOPK.LIST`): the list, best first.
    TopkList {
        /// Whether the reply carries the counts (`WITHCOUNT`).
        with_count: bool,
    },
    /// `topk.info` (`top_k`, `TOPK.INFO`): its shape.
    TopkInfo,
    /// `tdigest.add` (`t_digest`, `TDIGEST.ADD`, `TDIGEST.MERGE`): adds each `(value,
    /// weight)` as this replica's, and `bounds` (a merged source's min and max) if given; all
    /// or nothing.
    TdigestAdd {
        /// `(value, weight)`: finite values, positive weights.
        values: Vec<(f64, u64)>,
        /// The smallest and largest value the values stand for (a source's), if more than
        /// their own.
        bounds: Option<(f64, f64)>,
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `tdigest.reset` (`t_digest`, `TDIGEST.RESET`): removes every value this replica has
    /// seen.
    TdigestReset {
        /// The acknowledgement level (`None`: the replica's default).
        ack: Option<AckLevel>,
    },
    /// `tdigest.quantile` (`t_digest`, `TDIGEST.QUANTILE`): the value at each fraction.
    TdigestQuantile {
        /// Fractions in `[0, 1]`.
        quantiles: Vec<f64>,
    },
    /// `tdigest.cdf` (`t_digest`, `TDIGEST.CDF`): the fraction of values at or below each.
    TdigestCdf {
        /// The values.
        values: Vec<f64>,
    },
    /// `tdigest.info` (`t_digest`): its compression and figures.
    TdigestInfo,
}

impl Request {
    /// Its operation.
    pub fn op(&self) -> Op {
        match self {
            Request::Add { .. } => Op::Add,
            Request::Remove { .. } => Op::Remove,
            Request::Contains { .. } => Op::Contains,
            Request::Count { .. } => Op::Count,
            Request::MAdd { .. } => Op::MAdd,
            Request::MRemove { .. } => Op::MRemove,
            Request::MContains { .. } => Op::MContains,
            Request::MCount { .. } => Op::MCount,
            Request::Stats => Op::Stats,
            Request::Import { .. } => Op::Import,
            Request::Export { .. } => Op::Export,
            Request::CmsIncrBy { .. } => Op::CmsIncrBy,
            Request::CmsQuery { .. } => Op::CmsQuery,
            Request::CmsInfo => Op::CmsInfo,
            Request::TopkAdd { .. } => Op::TopkAdd,
            Request::TopkQuery { .. } => Op::TopkQuery,
            Request::TopkList { .. } => Op::TopkList,
            Request::TopkInfo => Op::TopkInfo,
            Request::TdigestAdd { .. } => Op::TdigestAdd,
            Request::TdigestReset { .. } => Op::TdigestReset,
            Request::TdigestQuantile { .. } => Op::TdigestQuantile,
            Request::TdigestCdf { .. } => Op::TdigestCdf,
            Request::TdigestInfo => Op::TdigestInfo,
        }
    }

    /// The acknowledgement level an update asks for (`None`: the replica's default, or not
    /// an update).
    pub fn ack(&self) -> Option<AckLevel> {
        match self {
            Request::Add { ack, .. }
            | Request::Remove { ack, .. }
            | Request::MAdd { ack, .. }
            | Request::MRemove { ack, .. }
            | Request::CmsIncrBy { ack, .. }
            | Request::TopkAdd { ack, .. }
            | Request::TdigestAdd { ack, .. }
            | Request::TdigestReset { ack }
            | Request::Import { ack, .. } => *ack,
            _ => None,
        }
    }

    /// Sets the acknowledgement level of an update (nothing for other requests).
    pub fn with_ack(mut self, level: Option<AckLevel>) -> Self {
        if let Request::Add { ack, .. }
        | Request::Remove { ack, .. }
        | Request::MAdd { ack, .. }
        | Request::MRemove { ack, .. }
        | Request::CmsIncrBy { ack, .. }
        | Request::TopkAdd { ack, .. }
        | Request::TdigestAdd { ack, .. }
        | Request::TdigestReset { ack }
        | Request::Import { ack, .. } = &mut self
        {
            *ack = level;
        }
        self
    }

    /// Bytes of the request's payload as NATS carries it: for the traffic metrics, alike
    /// whichever way the request came.
    pub fn payload_len(&self) -> usize {
        match self {
            Request::Add { item, .. }
            | Request::Remove { item, .. }
            | Request::Contains { item }
            | Request::Count { item } => item.len(),
            Request::MAdd { items, .. }
            | Request::MRemove { items, .. }
            | Request::MContains { items }
            | Request::MCount { items }
            | Request::CmsQuery { items }
            | Request::TopkQuery { items } => items.framed_len(),
            // `topk.add`'s payload is its items (each added once).
            Request::TopkAdd { items, .. } => items.framed_len(),
            // Each increment framed as its decimal digits.
            Request::CmsIncrBy {
                items, increments, ..
            } => {
                let digits = |n: u64| n.checked_ilog10().unwrap_or(0) as usize + 1;
                items.framed_len()
                    + increments
                        .iter()
                        .map(|&n| batch::LEN_BYTES + digits(n))
                        .sum::<usize>()
            }
            Request::Import { filter, .. } => filter.len(),
            // Each number framed as its shortest decimal text.
            Request::TdigestAdd { values, .. } => values
                .iter()
                .map(|(v, _)| batch::LEN_BYTES + v.to_string().len())
                .sum(),
            Request::TdigestQuantile { quantiles: values } | Request::TdigestCdf { values } => {
                values
                    .iter()
                    .map(|v| batch::LEN_BYTES + v.to_string().len())
                    .sum()
            }
            Request::TdigestReset { .. } | Request::TdigestInfo => 0,
            Request::Stats
            | Request::Export { .. }
            | Request::CmsInfo
            | Request::TopkList { .. }
            | Request::TopkInfo => 0,
        }
    }

    /// The request with its items in buffers of their own ([`Items::compact`]), for a request
    /// that waits.
    pub fn compact(self) -> Self {
        let own = |b: Bytes| Bytes::copy_from_slice(&b);
        match self {
            Request::Add { item, mode, ack } => Request::Add {
                item: own(item),
                mode,
                ack,
            },
            Request::Remove { item, ack } => Request::Remove {
                item: own(item),
                ack,
            },
            Request::Contains { item } => Request::Contains { item: own(item) },
            Request::Count { item } => Request::Count { item: own(item) },
            Request::MAdd { items, mode, ack } => Request::MAdd {
                items: items.compact(),
                mode,
                ack,
            },
            Request::MRemove { items, ack } => Request::MRemove {
                items: items.compact(),
                ack,
            },
            Request::MContains { items } => Request::MContains {
                items: items.compact(),
            },
            Request::MCount { items } => Request::MCount {
                items: items.compact(),
            },
            Request::CmsIncrBy {
                items,
                increments,
                ack,
            } => Request::CmsIncrBy {
                items: items.compact(),
                increments,
                ack,
            },
            Request::CmsQuery { items } => Request::CmsQuery {
                items: items.compact(),
            },
            Request::TopkAdd {
                items,
                increments,
                ack,
            } => Request::TopkAdd {
                items: items.compact(),
                increments,
                ack,
            },
            Request::TopkQuery { items } => Request::TopkQuery {
                items: items.compact(),
            },
            other => other,
        }
    }
}

/// What adding one item came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddOutcome {
    /// Added, and it was not contained before (told only by the modes that ask).
    New,
    /// Added; contained already, or the mode did not ask ([`AddMode::Always`]).
    Known,
    /// Not added: contained already ([`AddMode::IfAbsent`]).
    Skipped,
}

/// What a batch add came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchAdded {
    /// The mode it was made in.
    pub mode: AddMode,
    /// Per item, whether it is in the filter after the add (false where refused).
    pub added: Vec<bool>,
    /// Per item, whether it was absent before its add (empty for [`AddMode::Always`]; false
    /// where refused).
    pub new_items: Vec<bool>,
    /// The refused items, in order.
    pub failed: Vec<usize>,
    /// The first refusal's error text.
    pub error: Option<String>,
}

impl BatchAdded {
    /// Items added (or, with [`AddMode::IfAbsent`], there after the add).
    pub fn count(&self) -> usize {
        self.added.len() - self.failed.len()
    }

    /// The bits of its bitmap answer: "new" with a mode, else "added".
    pub fn bits(&self) -> &[bool] {
        match self.mode {
            AddMode::Always => &self.added,
            _ => &self.new_items,
        }
    }
}

/// The answer of a [`Request`] that succeeded.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Response {
    /// Of `add` in `mode`.
    Added {
        /// The mode it was made in.
        mode: AddMode,
        /// What it came to.
        outcome: AddOutcome,
    },
    /// Of `remove`: whether the item was there.
    Removed(bool),
    /// Of `contains`.
    Contains(bool),
    /// Of `count`.
    Count(u64),
    /// Of `madd`.
    MAdded(BatchAdded),
    /// Of `mremove`: per item, whether it was there.
    MRemoved(Vec<bool>),
    /// Of `mcontains`.
    MContains(Vec<bool>),
    /// Of `mcount`.
    MCount(Vec<u64>),
    /// Of `stats`: the replica's figures, as the API's JSON has them.
    Stats(serde_json::Value),
    /// Of `import`.
    Imported,
    /// Of `export`: the filter in the format asked for.
    Exported(Vec<u8>),
    /// Of `cms.incrby`: each item's estimate right after its increment (RedisBloom answers
    /// `CMS: INCRBY overflow` for one at `2^32 - 1` or more).
    CmsIncremented(Vec<u64>),
    /// Of `cms.query`: each item's estimate.
    CmsCount(Vec<u64>),
    /// Of `cms.info`.
    CmsInfo {
        /// Counters per row.
        width: u32,
        /// Rows.
        depth: u32,
        /// Increments in all, by every replica.
        count: u64,
    },
    /// Of `topk.add`: the item each add pushed out of the list, if one.
    TopkAdded(Vec<Option<Vec<u8>>>),
    /// Of `topk.query`: whether each item is listed, and its estimated count.
    TopkQueried {
        /// Listed.
        listed: Vec<bool>,
        /// Estimated counts.
        counts: Vec<u64>,
    },
    /// Of `topk.list`: the items, best first, with their counts.
    TopkList {
        /// `(item, estimated count)`.
        items: Vec<(Vec<u8>, u64)>,
        /// Whether the counts were asked for (`WITHCOUNT`).
        with_count: bool,
    },
    /// Of `tdigest.add` and `tdigest.reset`.
    TdigestUpdated,
    /// Of `tdigest.quantile` and `tdigest.cdf`: one value each (NaN while empty).
    TdigestValues(Vec<f64>),
    /// Of `tdigest.info`.
    TdigestInfo {
        /// The compression.
        compression: u32,
        /// Values reads see.
        observations: u64,
        /// Centroids held (every writer's segments).
        centroids: u64,
        /// Replicas whose parts the state holds.
        writers: u64,
        /// The smallest and largest value (NaN while empty).
        bounds: (f64, f64),
    },
    /// Of `topk.info`.
    TopkInfo {
        /// Items listed.
        k: u32,
        /// Counters per row.
        width: u32,
        /// Rows.
        depth: u32,
        /// RedisBloom's decay (reported, not applied).
        decay: f64,
    },
}

impl Response {
    /// Of `add`, whether the answer counts as "yes" for RedisBloom's commands: added where
    /// the mode does not ask, else new.
    pub fn added_new(mode: AddMode, outcome: AddOutcome) -> bool {
        mode == AddMode::Always || outcome == AddOutcome::New
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_items_are_views_of_the_payload_and_checked_alike() {
        let limits = Limits::new(3, 4);
        let payload = Bytes::from(batch::encode(["ab", "cde"]).unwrap());
        let items = Items::framed(payload.clone(), limits).unwrap();
        assert_eq!(items.slices(), vec![&b"ab"[..], b"cde"]);
        assert_eq!(items.framed_len(), payload.len());
        assert_eq!(items.check(limits), Ok(()));
        for bad in [vec!["a", "b", "c", "d"], vec!["a", ""], vec!["a", "abcde"]] {
            let framed = Items::framed(Bytes::from(batch::encode(&bad).unwrap()), limits);
            assert_eq!(Items::of(&bad).check(limits), framed.map(|_| ()), "{bad:?}");
        }
        let compact = Items::new(Bytes::from_static(b"xxabyycd"), vec![(2, 4), (6, 8)]).compact();
        assert_eq!(compact.slices(), vec![&b"ab"[..], b"cd"]);
        assert_eq!(compact.buf.len(), 4);
    }
}
