//! The request API's vocabulary, shared by replicas and clients: operation names, the header
//! names, reply formats and the batch framing ([`batch`]). Pure: no I/O, no feature needed, so
//! that a client in another program can reuse it without the replica machinery.
//!
//! A request is a NATS request on `<prefix>.<filter>.api.<op>` (any ready replica answers, in
//! the queue group `<prefix>.<filter>.api`) or on `<prefix>.<filter>.replica.<id>.api.<op>`
//! (replica `<id>` answers); see [`crate::transport::Subjects`] and the README's "Subjects".

mod ack;
pub mod batch;
#[cfg(feature = "node")]
mod request;

pub use ack::AckLevel;
#[cfg(feature = "node")]
pub use request::{AddOutcome, BatchAdded, Items, Request, Response};

use std::fmt;
use std::str::FromStr;

/// Request header: the acknowledgement level of an update (`local`, `logged`, `durable`, `replicated`).
pub const ACK_HEADER: &str = "Crpf-Ack";

/// Request header of the batch operations: `json` (the default) or `bitmap`, the format of the
/// reply. A bitmap reply carries this header too, with the value `bitmap`: a reply without it
/// is JSON (an error reply always is).
pub const REPLY_HEADER: &str = "Crpf-Reply";

/// Reply header on every reply of the API: the id of the replica that answered.
pub const REPLICA_HEADER: &str = "Crpf-Replica";

/// Reply header of a bitmap reply to `madd` in which some items could not be added: the first
/// error (the bitmap says which items).
pub const ERROR_HEADER: &str = "Crpf-Error";

/// Request header of `add` and `madd`: `report-new` or `if-absent` ([`AddMode`]); absent,
/// every item is added and the reply does not say whether it was there before.
pub const ADD_MODE_HEADER: &str = "Crpf-Add-Mode";

/// Reply header of a bitmap reply to `madd` with an [`AddMode`] in which some items could not
/// be added: their indexes, comma-separated (the bitmap's zeros then also mean "already
/// there").
pub const FAILED_HEADER: &str = "Crpf-Failed";

/// Request header of `import` and `export`: the format of the filter, `bits-and-blooms` (the
/// default: Go's `WriteTo` bytes) or `bits-and-blooms-json` ([`crate::GoFormat`]).
pub const FORMAT_HEADER: &str = "Crpf-Format";

/// Items a batch holds at most unless configured (`max_batch_items`).
pub const DEFAULT_MAX_BATCH_ITEMS: usize = 10_000;

/// An operation of the request API: the last token of its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `add`: payload the item; reply `{"added":true}`.
    Add,
    /// `remove` (OR kinds): payload the item; reply `{"removed":bool}`.
    Remove,
    /// `contains`: payload the item; reply `{"contains":bool}`.
    Contains,
    /// `stats`: payload ignored; reply the replica's figures.
    Stats,
    /// `madd`: payload a [`batch`] of items; reply `{"added":N}` or a bitmap.
    MAdd,
    /// `mremove` (OR kinds): payload a batch; reply `{"removed":[bool...]}` or a bitmap.
    MRemove,
    /// `mcontains`: payload a batch; reply `{"contains":[bool...]}` or a bitmap.
    MContains,
    /// `count` (counting kinds): payload the item; reply `{"count":N}`, its multiplicity.
    Count,
    /// `mcount` (counting kinds): payload a batch; reply `{"count":[N...]}` (JSON only).
    MCount,
    /// `import` (`go_bloom`): payload a filter in the format of [`FORMAT_HEADER`], merged into
    /// the replica's; reply `{"imported":true}`. A filter of other `m` or `k` is refused,
    /// naming both; damaged input loads nothing.
    Import,
    /// `export` (`go_bloom`): payload ignored; reply the filter in the format of
    /// [`FORMAT_HEADER`] (not JSON, unless that format is; an error reply is JSON).
    Export,
    /// `cms.incrby` (`count_min_sketch`): payload a [`batch`] of pairs, each item followed by
    /// its increment in decimal; reply `{"count":[N...]}`, each item's estimate right after
    /// its increment (`CMS.INCRBY`).
    CmsIncrBy,
    /// `cms.query` (`count_min_sketch`): payload a [`batch`] of items; reply
    /// `{"count":[N...]}`, their estimates (`CMS.QUERY`).
    CmsQuery,
    /// `cms.info` (`count_min_sketch`): payload ignored; reply
    /// `{"width":W,"depth":D,"count":N}` (`CMS.INFO`).
    CmsInfo,
    /// `topk.add` (`top_k`): payload a [`batch`] of items, each added once; reply
    /// `{"expelled":[item|null...]}`, the item each add pushed out of the list (`TOPK.ADD`).
    TopkAdd,
    /// `topk.query` (`top_k`): payload a [`batch`] of items; reply
    /// `{"listed":[bool...],"count":[N...]}` (`TOPK.QUERY`, `TOPK.COUNT`).
    TopkQuery,
    /// `topk.list` (`top_k`): payload ignored; reply `{"items":[...],"count":[N...]}`, best
    /// first (`TOPK.LIST WITHCOUNT`).
    TopkList,
    /// `topk.info` (`top_k`): payload ignored; reply `{"k":K,"width":W,"depth":D,"decay":F}`
    /// (`TOPK.INFO`).
    TopkInfo,
    /// `tdigest.add` (`t_digest`): payload a [`batch`] of decimal numbers, each added once
    /// (`TDIGEST.ADD`); reply `{"ok":true}`.
    TdigestAdd,
    /// `tdigest.reset` (`t_digest`): payload ignored; removes every value this replica has
    /// seen (`TDIGEST.RESET`); reply `{"ok":true}`.
    TdigestReset,
    /// `tdigest.quantile` (`t_digest`): payload a [`batch`] of fractions in `[0, 1]`; reply
    /// `{"values":[F|null...]}` (`TDIGEST.QUANTILE`; null for NaN, while empty).
    TdigestQuantile,
    /// `tdigest.cdf` (`t_digest`): payload a [`batch`] of decimal numbers; reply
    /// `{"values":[F|null...]}` (`TDIGEST.CDF`).
    TdigestCdf,
    /// `tdigest.info` (`t_digest`): payload ignored; reply `{"compression":C,
    /// "observations":N,"centroids":N,"writers":N,"min":F|null,"max":F|null}`.
    TdigestInfo,
}

impl Op {
    /// Every operation, in the order error messages list them.
    pub const ALL: [Op; 23] = [
        Op::Add,
        Op::Remove,
        Op::Contains,
        Op::Stats,
        Op::MAdd,
        Op::MRemove,
        Op::MContains,
        Op::Count,
        Op::MCount,
        Op::Import,
        Op::Export,
        Op::CmsIncrBy,
        Op::CmsQuery,
        Op::CmsInfo,
        Op::TopkAdd,
        Op::TopkQuery,
        Op::TopkList,
        Op::TopkInfo,
        Op::TdigestAdd,
        Op::TdigestReset,
        Op::TdigestQuantile,
        Op::TdigestCdf,
        Op::TdigestInfo,
    ];

    /// The subject token.
    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Remove => "remove",
            Op::Contains => "contains",
            Op::Stats => "stats",
            Op::MAdd => "madd",
            Op::MRemove => "mremove",
            Op::MContains => "mcontains",
            Op::Count => "count",
            Op::MCount => "mcount",
            Op::Import => "import",
            Op::Export => "export",
            Op::CmsIncrBy => "cms.incrby",
            Op::CmsQuery => "cms.query",
            Op::CmsInfo => "cms.info",
            Op::TopkAdd => "topk.add",
            Op::TopkQuery => "topk.query",
            Op::TopkList => "topk.list",
            Op::TopkInfo => "topk.info",
            Op::TdigestAdd => "tdigest.add",
            Op::TdigestReset => "tdigest.reset",
            Op::TdigestQuantile => "tdigest.quantile",
            Op::TdigestCdf => "tdigest.cdf",
            Op::TdigestInfo => "tdigest.info",
        }
    }

    /// Whether it changes the filter (`add`, `remove`, `madd`, `mremove`, `cms.incrby`): it
    /// takes an acknowledgement level ([`ACK_HEADER`]).
    pub fn is_update(self) -> bool {
        matches!(
            self,
            Op::Add
                | Op::Remove
                | Op::MAdd
                | Op::MRemove
                | Op::CmsIncrBy
                | Op::TopkAdd
                | Op::TdigestAdd
                | Op::TdigestReset
        )
    }

    /// Whether it only reads (`contains`, `mcontains`, `count`, `mcount`, `cms.query`,
    /// `cms.info`).
    pub fn is_query(self) -> bool {
        matches!(
            self,
            Op::Contains
                | Op::MContains
                | Op::Count
                | Op::MCount
                | Op::CmsQuery
                | Op::CmsInfo
                | Op::TopkQuery
                | Op::TopkList
                | Op::TopkInfo
                | Op::TdigestQuantile
                | Op::TdigestCdf
                | Op::TdigestInfo
        )
    }

    /// Whether its payload is a batch.
    pub fn is_batch(self) -> bool {
        matches!(self, Op::MAdd | Op::MRemove | Op::MContains | Op::MCount)
    }

    /// `add, remove, ...`: for error messages.
    pub fn list() -> String {
        Op::ALL.map(Op::name).join(", ")
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| format!("unknown operation `{s}` ({})", Op::list()))
    }
}

/// The format of a batch operation's reply, chosen by the request's [`REPLY_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyFormat {
    /// JSON: `{"added":N}`, `{"removed":[true,false]}`, `{"contains":[...]}`.
    #[default]
    Json,
    /// One bit per item, little-endian ([`batch::encode_bitmap`]): `ceil(n / 8)` bytes.
    Bitmap,
}

impl ReplyFormat {
    /// The header value.
    pub fn name(self) -> &'static str {
        match self {
            ReplyFormat::Json => "json",
            ReplyFormat::Bitmap => "bitmap",
        }
    }
}

impl FromStr for ReplyFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [ReplyFormat::Json, ReplyFormat::Bitmap]
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown {REPLY_HEADER} `{s}` (json or bitmap)"))
    }
}

/// What an `add` or `madd` answers beyond "applied", chosen by [`ADD_MODE_HEADER`]. Whether
/// an item is new is judged by this replica alone, under its write lock: two replicas adding
/// one new item at the same moment may both call it new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddMode {
    /// Add; the reply says only that it was applied (`{"added":true}`).
    #[default]
    Always,
    /// Add, and say whether the item was absent before (`{"added":true,"new":bool}`, a
    /// batch's bitmap bit = new): RedisBloom's `BF.ADD` answer, for the dedup idiom
    /// `if BF.ADD key item: process(item)`.
    ReportNew,
    /// Add only an item absent before (`{"added":bool,"new":bool}`, equal): `CF.ADDNX`.
    IfAbsent,
}

impl AddMode {
    /// The header value.
    pub fn name(self) -> &'static str {
        match self {
            AddMode::Always => "always",
            AddMode::ReportNew => "report-new",
            AddMode::IfAbsent => "if-absent",
        }
    }
}

impl FromStr for AddMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [AddMode::Always, AddMode::ReportNew, AddMode::IfAbsent]
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!("unknown {ADD_MODE_HEADER} `{s}` (always, report-new or if-absent)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>(), Ok(op));
        }
        assert!("madd.x".parse::<Op>().unwrap_err().contains("mcontains"));
        assert_eq!(" Bitmap ".parse(), Ok(ReplyFormat::Bitmap));
        assert_eq!("json".parse(), Ok(ReplyFormat::Json));
        assert!("cbor".parse::<ReplyFormat>().is_err());
        assert_eq!("If-Absent".parse(), Ok(AddMode::IfAbsent));
        assert!(
            "maybe"
                .parse::<AddMode>()
                .unwrap_err()
                .contains("report-new")
        );
    }
}
