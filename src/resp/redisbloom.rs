//! RedisBloom's grammar mapped onto crpf: the creation options of `BF.RESERVE`, `CF.RESERVE`,
//! `BF.INSERT`, `CF.INSERT` and `CRPF.RESERVE` as [`FilterSpec`]s, the defaults of a key
//! created by its first add, and the replies of `BF.INFO`, `CF.INFO` and `BF.CARD`, with
//! RedisBloom's texts where it refuses.
//!
//! A non-scaling Bloom filter is a `g_bloom`; a scaling one the scalable kind whose FPR bound
//! holds however rarely replicas sync (`writer_sc_g_bloom`). A cuckoo filter is an
//! `or_cuckoo` (removes as `CF.DEL` expects), scaling (`writer_sc_or_cuckoo`) unless
//! `EXPANSION 0`: RedisBloom's cuckoo filters grow by default too. `EXPANSION`, `BUCKETSIZE`
//! and `MAXITERATIONS` go into the spec ([`FilterSpec::growth`], [`FilterSpec::bucket_size`],
//! [`FilterSpec::max_kicks`]) and come back in `BF.INFO` / `CF.INFO` from the filter's own
//! parameters.

use super::parse::Args;
use super::reply::Reply;
use crate::replica::{AnyFilter, ReplicaHandle};
use crate::{CuckooParams, FilterKind, FilterSpec, Membership, ScalableParams};

/// RedisBloom's answer to creating a key that exists.
pub const EXISTS: &str = "ERR item exists";

/// `BF.ADD`'s defaults for a key it creates (RedisBloom's `ERROR_RATE`, `INITIAL_SIZE`).
pub const BF_DEFAULT_CAPACITY: u64 = 100;
/// See [`BF_DEFAULT_CAPACITY`].
pub const BF_DEFAULT_ERROR_RATE: f64 = 0.01;
/// `CF.ADD`'s default capacity for a key it creates (RedisBloom's `cf-initial-size`).
pub const CF_DEFAULT_CAPACITY: u64 = 1024;
/// The false positive rate of cuckoo filters made by `CF.*`, which give none.
pub const CF_FPR: f64 = 0.01;
/// Largest capacity RedisBloom accepts (2^30).
pub const MAX_CAPACITY: u64 = 1 << 30;
/// RedisBloom's default `EXPANSION`: each sub-filter twice its predecessor's size.
pub const SCALING_GROWTH: u64 = FilterSpec::DEFAULT_GROWTH as u64;
/// Largest `EXPANSION` RedisBloom takes from `BF.INSERT` and `CF.RESERVE`.
const MAX_EXPANSION: i64 = 32768;

/// Whether `kind` answers RedisBloom's `BF.*` commands (else its `CF.*` ones).
pub fn is_bloom(kind: FilterKind) -> bool {
    matches!(
        kind,
        FilterKind::GBloom
            | FilterKind::ScGBloom
            | FilterKind::WriterScGBloom
            | FilterKind::ExpiringBloom
            | FilterKind::GoBloom
            | FilterKind::BlockedBloom
    )
}

/// RedisBloom's type name of a filter kind (`TYPE`).
pub fn type_name(kind: FilterKind) -> &'static str {
    if kind == FilterKind::CountMinSketch {
        "CMSk-TYPE"
    } else if kind == FilterKind::TopK {
        "TopK-TYPE"
    } else if kind == FilterKind::TDigest {
        "TDIS-TYPE"
    } else if is_bloom(kind) {
        "MBbloom--"
    } else {
        "MBbloomCF"
    }
}

/// Replicas claim their ids from 1: a key's series per writer count from there, so that its
/// first writer has half the FPR bound, as RedisBloom's single series does
/// ([`FilterSpec::first_writer`]).
const FIRST_WRITER: crate::ReplicaId = 1;

/// The spec of a Bloom key created by its first add.
pub fn bf_default() -> FilterSpec {
    FilterSpec::new(
        FilterKind::WriterScGBloom,
        BF_DEFAULT_CAPACITY,
        BF_DEFAULT_ERROR_RATE,
    )
    .with_first_writer(FIRST_WRITER)
}

/// The spec of a cuckoo key created by its first add.
pub fn cf_default() -> FilterSpec {
    cf_spec(CF_DEFAULT_CAPACITY, FilterSpec::DEFAULT_GROWTH)
}

/// `expansion`: the growth of a scaling filter, 0 for one that does not scale.
fn cf_spec(capacity: u64, expansion: u32) -> FilterSpec {
    let kind = if expansion > 0 {
        FilterKind::WriterScOrCuckoo
    } else {
        FilterKind::OrCuckoo
    };
    // A filter that does not scale has no growth (0 leaves the spec as it was).
    FilterSpec::new(kind, capacity, CF_FPR)
        .with_growth(expansion)
        .with_first_writer(FIRST_WRITER)
}

/// `expansion`: as [`cf_spec`]'s.
fn bf_spec(capacity: u64, fpr: f64, expansion: u32) -> FilterSpec {
    let kind = if expansion > 0 {
        FilterKind::WriterScGBloom
    } else {
        FilterKind::GBloom
    };
    FilterSpec::new(kind, capacity, fpr)
        .with_growth(expansion)
        .with_first_writer(FIRST_WRITER)
}

/// An `EXPANSION` RedisBloom took (at least 1), as a growth factor: RedisBloom stores an
/// `unsigned`, cutting larger values to their low 32 bits; crpf takes the largest instead (a
/// second sub-filter that large exceeds the memory limit either way).
fn growth(e: i64) -> u32 {
    u32::try_from(e).unwrap_or(u32::MAX)
}

/// Argument `i` (counted after the command's name) as text; not UTF-8 reads as empty, which
/// no number parses from.
fn text(args: &Args, i: usize) -> &str {
    std::str::from_utf8(args.arg(i + 1)).unwrap_or("")
}

/// An integer as Redis reads one (`string2ll`): an optional `-` and digits without a
/// leading zero, within i64, nothing else.
fn integer(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let canonical = (digits == "0" && s == "0") || !digits.starts_with('0');
    if digits.is_empty() || !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A float as Redis reads one (`strtod`): `inf` is a number, an overflow or NaN is not.
fn float(s: &str) -> Option<f64> {
    let f = s.parse::<f64>().ok().filter(|f| !f.is_nan())?;
    let named_infinity = s
        .trim_start_matches(['-', '+'])
        .to_ascii_lowercase()
        .starts_with("inf");
    (f.is_finite() || named_infinity).then_some(f)
}

/// `BF.RESERVE key error_rate capacity [EXPANSION e] [NONSCALING]` (arity checked).
pub fn bf_reserve(args: &Args) -> Result<FilterSpec, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let fpr = float(text(args, 1)).ok_or_else(|| Reply::err("bad error rate"))?;
    if !(fpr > 0.0 && fpr < 1.0) {
        // RedisBloom 2.8's text, its trailing space included.
        return Err(Reply::err("(0 < error rate range < 1) "));
    }
    let capacity = integer(text(args, 2)).ok_or_else(|| Reply::err("bad capacity"))?;
    if capacity < 1 {
        return Err(Reply::err("(capacity should be larger than 0)"));
    }
    if capacity > MAX_CAPACITY as i64 {
        return Err(Reply::err(format!(
            "capacity must be in the range [1, {MAX_CAPACITY}]"
        )));
    }
    let (mut nonscaling, mut expansion) = (false, None);
    let mut i = 3;
    while i < n {
        if arg(i).eq_ignore_ascii_case(b"NONSCALING") {
            nonscaling = true;
            i += 1;
        } else if arg(i).eq_ignore_ascii_case(b"EXPANSION") {
            if i + 1 >= n {
                return Err(Reply::err("no expansion"));
            }
            expansion =
                Some(integer(text(args, i + 1)).ok_or_else(|| Reply::err("bad expansion"))?);
            i += 2;
        } else {
            return Err(Reply::err("syntax error"));
        }
    }
    let expansion = match expansion {
        Some(e) if e < 1 => {
            return Err(Reply::err("expansion should be greater or equal to 1"));
        }
        Some(_) if nonscaling => {
            return Err(Reply::Error("Nonscaling filters cannot expand".into()));
        }
        Some(e) => growth(e),
        None if nonscaling => 0,
        None => FilterSpec::DEFAULT_GROWTH,
    };
    Ok(bf_spec(capacity as u64, fpr, expansion))
}

/// `CF.RESERVE key capacity [BUCKETSIZE b] [MAXITERATIONS m] [EXPANSION e]` (arity
/// checked): RedisBloom's ranges, each value into the spec (`EXPANSION 0`: not scaling).
pub fn cf_reserve(args: &Args) -> Result<FilterSpec, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let capacity = integer(text(args, 1)).ok_or_else(|| Reply::Error("Bad capacity".into()))?;
    let mut expansion = FilterSpec::DEFAULT_GROWTH;
    let mut bucket_size = None;
    let mut max_kicks = CuckooParams::DEFAULT_MAX_KICKS;
    // Options come in pairs after the capacity (the arity checked that).
    let mut i = 2;
    while i < n {
        let value = text(args, i + 1);
        // RedisBloom's range of each option, and its texts.
        let within = |option: &str, min: i64, max: i64| -> Result<i64, Reply> {
            match integer(value) {
                None => Err(Reply::Error(format!("Couldn't parse {option}"))),
                Some(v) if !(min..=max).contains(&v) => Err(Reply::Error(format!(
                    "{option}: value must be an integer between {min} and {max}, inclusive."
                ))),
                Some(v) => Ok(v),
            }
        };
        // The ranges fit the fields' types: the conversions below cannot fail.
        if arg(i).eq_ignore_ascii_case(b"BUCKETSIZE") {
            bucket_size = Some(within("BUCKETSIZE", 1, 255)? as u8);
        } else if arg(i).eq_ignore_ascii_case(b"MAXITERATIONS") {
            max_kicks = within("MAXITERATIONS", 1, 65535)? as u32;
        } else if arg(i).eq_ignore_ascii_case(b"EXPANSION") {
            expansion = within("EXPANSION", 0, MAX_EXPANSION)? as u32;
        } else {
            return Err(Reply::err("syntax error"));
        }
        i += 2;
    }
    check_cf_capacity(capacity, bucket_size)?;
    let bucket_size = bucket_size.unwrap_or(CuckooParams::DEFAULT_BUCKET_SIZE);
    Ok(cf_spec(capacity as u64, expansion)
        .with_bucket_size(bucket_size)
        .with_max_kicks(max_kicks))
}

/// RedisBloom's default bucket size, which its least capacity (two buckets) is counted in
/// when `BUCKETSIZE` is not given.
const REDISBLOOM_BUCKET_SIZE: u8 = 2;

/// `bucket_size`: the `BUCKETSIZE` given: RedisBloom's least capacity is two buckets of it.
fn check_cf_capacity(capacity: i64, bucket_size: Option<u8>) -> Result<(), Reply> {
    let least = 2 * i64::from(bucket_size.unwrap_or(REDISBLOOM_BUCKET_SIZE));
    if capacity < least {
        Err(Reply::Error(
            "Capacity must be at least (BucketSize * 2)".into(),
        ))
    } else if capacity > MAX_CAPACITY as i64 {
        Err(Reply::Error(format!(
            "Capacity must be in the range [2 * BUCKETSIZE, {MAX_CAPACITY}]"
        )))
    } else {
        Ok(())
    }
}

/// What `BF.INSERT` / `CF.INSERT` ask for besides their items.
#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    /// The spec of the key if the insert creates it; `None`: `NOCREATE`.
    pub create: Option<FilterSpec>,
    /// The first item, counted after the command's name.
    pub items_from: usize,
}

/// Why an insert's options were refused: an error reply, or the wrong number of arguments.
#[derive(Debug)]
pub enum Refused {
    /// The reply.
    Reply(Reply),
    /// Answered as the command's wrong arity.
    Arity,
}

/// An option of an insert: a flag, or one with the value after it.
enum InsertOption {
    Flag,
    Valued,
}

/// Walks an insert's options after the key up to `ITEMS`: `option` handles one (its upper
/// case name and the argument after it, if any) and says whether it took that value. The
/// index of the first item (counted after the command's name); no `ITEMS`, no item after it,
/// or a valued option without a value: the wrong number of arguments.
fn insert_items_from(
    args: &Args,
    mut option: impl FnMut(&[u8], Option<&str>) -> Result<InsertOption, Refused>,
) -> Result<usize, Refused> {
    let n = args.len() - 1;
    let mut i = 1;
    loop {
        if i >= n {
            return Err(Refused::Arity);
        }
        let name = args.arg(i + 1).to_ascii_uppercase();
        if name == b"ITEMS" {
            break;
        }
        let value = (i + 1 < n).then(|| text(args, i + 1));
        i += match option(&name, value)? {
            InsertOption::Flag => 1,
            InsertOption::Valued => 2,
        };
    }
    if i + 1 >= n {
        return Err(Refused::Arity);
    }
    Ok(i + 1)
}

/// RedisBloom's refusal of an insert's option (no `ERR` code).
fn insert_refused(text: &str) -> Refused {
    Refused::Reply(Reply::Error(text.into()))
}

/// `BF.INSERT key [CAPACITY c] [ERROR e] [EXPANSION x] [NOCREATE] [NONSCALING] ITEMS item...`.
pub fn bf_insert(args: &Args) -> Result<Insert, Refused> {
    let (mut capacity, mut fpr) = (BF_DEFAULT_CAPACITY, BF_DEFAULT_ERROR_RATE);
    let (mut create, mut nonscaling, mut expansion) = (true, false, SCALING_GROWTH as i64);
    // RedisBloom's `BF.INSERT` takes up to 32768 (`BF.RESERVE` any `unsigned`).
    let items_from = insert_items_from(args, |option, value| {
        let value = || value.ok_or(Refused::Arity);
        Ok(match option {
            b"CAPACITY" => {
                let c = integer(value()?)
                    .filter(|c| *c <= MAX_CAPACITY as i64)
                    .ok_or_else(|| insert_refused("Bad capacity"))?;
                if c < 1 {
                    return Err(insert_refused("Bad argument received"));
                }
                capacity = c as u64;
                InsertOption::Valued
            }
            b"ERROR" => {
                fpr = float(value()?)
                    .filter(|e| e.is_finite())
                    .ok_or_else(|| insert_refused("Bad error rate"))?;
                if !(fpr > 0.0 && fpr < 1.0) {
                    return Err(insert_refused("Bad argument received"));
                }
                InsertOption::Valued
            }
            b"EXPANSION" => {
                expansion = integer(value()?)
                    .filter(|e| *e <= MAX_EXPANSION)
                    .ok_or_else(|| insert_refused("Bad expansion"))?;
                if expansion < 0 {
                    return Err(insert_refused("Bad argument received"));
                }
                InsertOption::Valued
            }
            b"NOCREATE" => {
                create = false;
                InsertOption::Flag
            }
            b"NONSCALING" => {
                nonscaling = true;
                InsertOption::Flag
            }
            _ => return Err(insert_refused("Unknown argument received")),
        })
    })?;
    // `NONSCALING` or `EXPANSION 0`: not scaling.
    let expansion = if nonscaling { 0 } else { expansion as u32 };
    Ok(Insert {
        create: create.then(|| bf_spec(capacity, fpr, expansion)),
        items_from,
    })
}

/// `CF.INSERT` / `CF.INSERTNX key [CAPACITY c] [NOCREATE] ITEMS item...`.
pub fn cf_insert(args: &Args) -> Result<Insert, Refused> {
    let mut capacity = CF_DEFAULT_CAPACITY as i64;
    let mut create = true;
    let items_from = insert_items_from(args, |option, value| {
        Ok(match option {
            b"CAPACITY" => {
                capacity = integer(value.ok_or(Refused::Arity)?)
                    .ok_or_else(|| insert_refused("Bad capacity"))?;
                check_cf_capacity(capacity, None).map_err(Refused::Reply)?;
                InsertOption::Valued
            }
            b"NOCREATE" => {
                create = false;
                InsertOption::Flag
            }
            _ => return Err(insert_refused("Unknown argument received")),
        })
    })?;
    Ok(Insert {
        create: create.then(|| cf_spec(capacity as u64, FilterSpec::DEFAULT_GROWTH)),
        items_from,
    })
}

/// `CRPF.RESERVE key kind capacity fpr [WINDOW ms] [EPOCHS n] [SEED s]`: any crpf kind,
/// those RedisBloom lacks among them (`expiring_bloom`, `counting_cuckoo`, the per-writer
/// and plain scalable kinds).
pub fn crpf_reserve(args: &Args) -> Result<FilterSpec, Reply> {
    let n = args.len() - 1;
    let kind: FilterKind = text(args, 1).parse().map_err(|e: String| {
        let kinds: Vec<&str> = FilterKind::ALL.iter().map(|k| k.name()).collect();
        Reply::err(format!("{e} (one of {})", kinds.join(", ")))
    })?;
    let capacity = integer(text(args, 2))
        .filter(|c| *c >= 1)
        .ok_or_else(|| Reply::err("bad capacity: a positive integer"))?;
    let fpr = float(text(args, 3))
        .filter(|e| *e > 0.0 && *e < 1.0)
        .ok_or_else(|| Reply::err("bad false positive rate: a number in (0, 1)"))?;
    let mut spec = FilterSpec::new(kind, capacity as u64, fpr);
    let mut expiry = crate::ExpirySpec::default();
    let mut timed = false;
    let mut i = 4;
    while i < n {
        let option = args.arg(i + 1).to_ascii_uppercase();
        let Some(value) = (i + 1 < n).then(|| text(args, i + 1)) else {
            return Err(Reply::err("syntax error"));
        };
        let number = |what: &str| {
            integer(value)
                .filter(|v| *v >= 0)
                .ok_or_else(|| Reply::err(format!("bad {what}: a non-negative integer")))
        };
        match option.as_slice() {
            b"WINDOW" => {
                expiry.window_ms = number("WINDOW")? as u64;
                timed = true;
            }
            b"EPOCHS" => {
                expiry.epochs =
                    u32::try_from(number("EPOCHS")?).map_err(|_| Reply::err("bad EPOCHS"))?;
                timed = true;
            }
            b"SEED" => spec.seed = Some(number("SEED")? as u64),
            _ => return Err(Reply::err("syntax error")),
        }
        i += 2;
    }
    if timed && kind != FilterKind::ExpiringBloom {
        return Err(Reply::err("WINDOW and EPOCHS are for expiring_bloom only"));
    }
    if kind == FilterKind::ExpiringBloom {
        spec.expiry = Some(expiry);
    }
    spec.memory_bytes().map_err(Reply::err)?;
    Ok(spec)
}

/// The fields of `BF.INFO key [field]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BfField {
    /// `CAPACITY`.
    Capacity,
    /// `SIZE`: bytes.
    Size,
    /// `FILTERS`: sub-filters.
    Filters,
    /// `ITEMS`: the estimated number of items.
    Items,
    /// `EXPANSION`.
    Expansion,
}

impl BfField {
    const ALL: [BfField; 5] = [
        BfField::Capacity,
        BfField::Size,
        BfField::Filters,
        BfField::Items,
        BfField::Expansion,
    ];

    /// The field named by `BF.INFO`'s argument.
    pub fn parse(name: &[u8]) -> Option<Self> {
        let name = name.to_ascii_uppercase();
        BfField::ALL
            .into_iter()
            .find(|f| f.argument().as_bytes() == name.as_slice())
    }

    fn argument(self) -> &'static str {
        match self {
            BfField::Capacity => "CAPACITY",
            BfField::Size => "SIZE",
            BfField::Filters => "FILTERS",
            BfField::Items => "ITEMS",
            BfField::Expansion => "EXPANSION",
        }
    }

    fn label(self) -> &'static str {
        match self {
            BfField::Capacity => "Capacity",
            BfField::Size => "Size",
            BfField::Filters => "Number of filters",
            BfField::Items => "Number of items inserted",
            BfField::Expansion => "Expansion rate",
        }
    }
}

/// A filter's figures for the `*.INFO` replies, read from the replica directly.
struct Figures {
    capacity: u64,
    bytes: u64,
    filters: u64,
    items: u64,
    settings: Settings,
}

/// What RedisBloom's options set, as the filter's own parameters hold them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    /// The growth of a scaling kind (`EXPANSION`); `None` for the others.
    growth: Option<u32>,
    /// Slots per bucket of the cuckoo kinds (`BUCKETSIZE`).
    bucket_size: u8,
    /// Kick quota of the cuckoo kinds (`MAXITERATIONS`).
    max_kicks: u32,
}

impl Settings {
    fn of_series(p: &ScalableParams) -> Self {
        Settings {
            growth: Some(p.growth),
            bucket_size: p.bucket_size,
            max_kicks: p.max_kicks,
        }
    }

    fn of_table(p: &CuckooParams) -> Self {
        Settings {
            growth: None,
            bucket_size: p.bucket_size,
            max_kicks: p.max_kicks,
        }
    }
}

/// The settings of filter `f` (the defaults for kinds without them).
fn settings(f: &AnyFilter) -> Settings {
    match f {
        AnyFilter::ScGBloom(f) => Settings::of_series(f.params()),
        AnyFilter::ScGCuckoo(f) => Settings::of_series(f.params()),
        AnyFilter::ScOrCuckoo(f) => Settings::of_series(f.params()),
        AnyFilter::WriterScGBloom(f) => Settings::of_series(f.params()),
        AnyFilter::WriterScGCuckoo(f) => Settings::of_series(f.params()),
        AnyFilter::WriterScOrCuckoo(f) => Settings::of_series(f.params()),
        AnyFilter::GCuckoo(f) => Settings::of_table(f.params()),
        AnyFilter::OrCuckoo(f) => Settings::of_table(f.params()),
        AnyFilter::CountingCuckoo(f) => Settings::of_table(f.params()),
        _ => Settings {
            growth: None,
            bucket_size: CuckooParams::DEFAULT_BUCKET_SIZE,
            max_kicks: CuckooParams::DEFAULT_MAX_KICKS,
        },
    }
}

/// `with_bytes`: also the encoded state's length, which takes an encoding of the whole state.
fn figures(handle: &ReplicaHandle, with_bytes: bool) -> Figures {
    handle.read(|f| {
        let stats = f.stats();
        Figures {
            capacity: stats.capacity,
            bytes: if with_bytes {
                f.encode_state().len() as u64
            } else {
                0
            },
            filters: stats.sub_filters as u64,
            items: counted_items(f)
                .unwrap_or(stats.cardinality)
                .round()
                .max(0.0) as u64,
            settings: settings(f),
        }
    })
}

/// Sub-filter `i`'s items: the count of its series' adds where known (RedisBloom's count of
/// new adds), else the estimate from its bits.
fn sub_items(s: &crate::ScGBloom, i: usize) -> f64 {
    s.added(i)
        .map_or_else(|| s.subs()[i].cardinality(), |n| n as f64)
}

/// The items of a scalable Bloom filter, as [`sub_items`] counts them over every sub-filter
/// (of every writer's series); `None` for the other kinds, whose figure is their estimate.
fn counted_items(f: &AnyFilter) -> Option<f64> {
    let series = |s: &crate::ScGBloom| (0..s.sub_filters()).map(|i| sub_items(s, i)).sum();
    match f {
        AnyFilter::ScGBloom(s) => Some(series(s)),
        AnyFilter::WriterScGBloom(w) => Some(w.parts().map(|(_, s)| series(s)).sum::<f64>()),
        _ => None,
    }
}

/// Bytes the filter's state takes (`MEMORY USAGE`): its encoding's length.
pub fn memory_usage(handle: &ReplicaHandle) -> u64 {
    handle.read(|f| f.encode_state().len() as u64)
}

/// `BF.CARD`: the number of items. A scalable kind's series count their new adds as RedisBloom
/// does (`counted_items`: each writer counts its own, and replicas agree once they
/// converge); the others estimate from the bits (the same on every replica once they
/// converge).
pub fn bf_card(handle: &ReplicaHandle) -> Reply {
    Reply::Int(figures(handle, false).items as i64)
}

/// `BF.INFO key [field]`.
pub fn bf_info(handle: &ReplicaHandle, field: Option<BfField>) -> Reply {
    let with_bytes = matches!(field, None | Some(BfField::Size));
    let f = figures(handle, with_bytes);
    let value = |field| match field {
        BfField::Capacity => Reply::Int(f.capacity as i64),
        BfField::Size => Reply::Int(f.bytes as i64),
        BfField::Filters => Reply::Int(f.filters as i64),
        BfField::Items => Reply::Int(f.items as i64),
        BfField::Expansion => match f.settings.growth {
            Some(growth) => Reply::Int(growth.into()),
            None => Reply::Null,
        },
    };
    match field {
        // One field: RESP3 a map of one, RESP2 the bare value (as RedisBloom).
        Some(field) => Reply::FieldOrValue(
            Box::new(Reply::Simple(field.label())),
            Box::new(value(field)),
        ),
        None => Reply::Map(
            BfField::ALL
                .into_iter()
                .map(|field| (Reply::Simple(field.label()), value(field)))
                .collect(),
        ),
    }
}

/// `CF.INFO key`.
pub fn cf_info(handle: &ReplicaHandle) -> Reply {
    let f = figures(handle, true);
    let bucket = u64::from(f.settings.bucket_size);
    let expansion = f.settings.growth.map_or(0, u64::from);
    let pairs = [
        ("Size", f.bytes),
        ("Number of buckets", f.capacity / bucket),
        ("Number of filters", f.filters),
        ("Number of items inserted", f.items),
        // Removes anywhere in the cluster that this replica's state observed.
        ("Number of items deleted", handle.read(|f| f.removed())),
        ("Bucket size", bucket),
        ("Expansion rate", expansion),
        ("Max iterations", u64::from(f.settings.max_kicks)),
    ];
    Reply::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Reply::Simple(k), Reply::Int(v as i64)))
            .collect(),
    )
}

/// `BF.DEBUG key`: RedisBloom's lines, `size:` (the number of items, as `BF.CARD`) and one per
/// sub-filter (each writer's series in writer order, oldest sub-filter first) with its bytes,
/// bits, hash functions, capacity, items (counted, else estimated) and target FPR. Bloom kinds without
/// sub-filters of their own parameters (`blocked_bloom`, `go_bloom`, `expiring_bloom`)
/// answer the first line only.
pub fn bf_debug(handle: &ReplicaHandle) -> Reply {
    handle.read(|f| {
        let items = counted_items(f)
            .unwrap_or_else(|| f.stats().cardinality)
            .round()
            .max(0.0) as u64;
        let mut lines = vec![format!("size:{items}")];
        let mut first_line = None;
        let mut series_lines = Vec::new();
        let mut series = |s: &crate::ScGBloom| {
            for (i, sub) in s.subs().iter().enumerate() {
                let p = s.params();
                series_lines.push(link(sub.params(), sub_items(s, i), p.sub_fpr(i)));
            }
        };
        let mut first = |p: &ScalableParams| {
            first_line = p.bloom(0).ok().map(|b| link(&b, 0.0, p.sub_fpr(0)));
        };
        match f {
            AnyFilter::GBloom(b) => {
                let p = b.params();
                lines.push(link(p, b.cardinality(), p.fpr_after(p.capacity as f64)));
            }
            // Before the first add (which allocates it), the first sub-filter it will add to,
            // as RedisBloom lists the one it allocated at creation.
            AnyFilter::ScGBloom(s) if s.sub_filters() == 0 => first(s.params()),
            AnyFilter::ScGBloom(s) => series(s),
            AnyFilter::WriterScGBloom(w) if w.parts().next().is_none() => {
                if let Ok(p) = w.part_params(w.writer().max(w.first_writer())) {
                    first(&p)
                }
            }
            AnyFilter::WriterScGBloom(w) => {
                for (_, s) in w.parts() {
                    series(s);
                }
            }
            _ => {}
        }
        lines.extend(first_line);
        lines.extend(series_lines);
        Reply::Array(
            lines
                .into_iter()
                .map(|l| Reply::Bulk(bytes::Bytes::from(l)))
                .collect(),
        )
    })
}

/// One sub-filter's line of `BF.DEBUG`, in RedisBloom's format (crpf hashes 64 bits wide).
fn link(p: &crate::BloomParams, items: f64, ratio: f64) -> String {
    format!(
        "bytes:{} bits:{} hashes:{} hashwidth:64 capacity:{} size:{} ratio:{}",
        p.bits.div_ceil(8),
        p.bits,
        p.hashes,
        p.capacity,
        items.round().max(0.0) as u64,
        printf_g(ratio),
    )
}

/// `x` as C's `printf("%g")` writes it (RedisBloom's ratios): 6 significant digits, trailing
/// zeros dropped, an exponent (`5e-05`) below 1e-4 or from 1e6.
fn printf_g(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    // The exponent after rounding to 6 digits, as %g decides it.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{x:.*}", (5 - exp) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ws: &[&str]) -> Args {
        Args::of(ws)
    }

    #[test]
    fn insert_options_make_the_spec_of_a_new_key() {
        let bf = |ws: &[&str]| bf_insert(&args(ws));
        let i = bf(&[
            "BF.INSERT",
            "k",
            "CAPACITY",
            "500",
            "ERROR",
            "0.001",
            "ITEMS",
            "a",
        ])
        .unwrap();
        let spec = i.create.unwrap();
        assert_eq!(
            (spec.kind, spec.capacity, spec.fpr, i.items_from),
            (FilterKind::WriterScGBloom, 500, 0.001, 6)
        );
        let i = bf(&["BF.INSERT", "k", "NONSCALING", "ITEMS", "a", "b"]).unwrap();
        assert_eq!(i.create.unwrap().kind, FilterKind::GBloom);
        let i = bf(&["BF.INSERT", "k", "EXPANSION", "0", "ITEMS", "a"]).unwrap();
        assert_eq!(i.create.unwrap().kind, FilterKind::GBloom);
        assert_eq!(
            bf(&["BF.INSERT", "k", "NOCREATE", "ITEMS", "a"])
                .unwrap()
                .create,
            None
        );
        assert!(matches!(
            bf(&["BF.INSERT", "k", "ITEMS"]),
            Err(Refused::Arity)
        ));
        assert!(matches!(
            bf(&["BF.INSERT", "k", "CAPACITY"]),
            Err(Refused::Arity)
        ));
        for (ws, text) in [
            (
                &["BF.INSERT", "k", "CAPACITY", "0", "ITEMS", "a"][..],
                "Bad argument received",
            ),
            (
                &["BF.INSERT", "k", "CAPACITY", "x", "ITEMS", "a"],
                "Bad capacity",
            ),
            (
                &["BF.INSERT", "k", "ERROR", "1", "ITEMS", "a"],
                "Bad argument received",
            ),
            (
                &["BF.INSERT", "k", "ERROR", "nan", "ITEMS", "a"],
                "Bad error rate",
            ),
            (
                &["BF.INSERT", "k", "FOO", "ITEMS", "a"],
                "Unknown argument received",
            ),
        ] {
            match bf(ws) {
                Err(Refused::Reply(Reply::Error(e))) => assert_eq!(e, text, "{ws:?}"),
                other => panic!("{ws:?}: {other:?}"),
            }
        }
        let i = cf_insert(&args(&["CF.INSERT", "k", "CAPACITY", "5000", "ITEMS", "a"])).unwrap();
        let spec = i.create.unwrap();
        assert_eq!(
            (spec.kind, spec.capacity),
            (FilterKind::WriterScOrCuckoo, 5000)
        );
        assert!(matches!(
            cf_insert(&args(&["CF.INSERT", "k", "CAPACITY", "1", "ITEMS", "a"])),
            Err(Refused::Reply(_))
        ));
    }

    #[test]
    fn ratios_print_as_printf_g() {
        for (x, g) in [
            (0.005, "0.005"),
            (0.0025, "0.0025"),
            (0.0008333333333333334, "0.000833333"),
            (0.00005, "5e-05"),
            (1.25e-7, "1.25e-07"),
            (0.1, "0.1"),
        ] {
            assert_eq!(printf_g(x), g);
        }
    }

    #[test]
    fn redisbloom_options_go_into_the_spec() {
        let bf = |ws: &[&str]| bf_reserve(&args(ws));
        let spec = bf(&["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "4"]).unwrap();
        assert_eq!((spec.kind, spec.growth()), (FilterKind::WriterScGBloom, 4));
        let spec = bf(&["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "2"]).unwrap();
        assert_eq!(
            spec,
            FilterSpec::new(FilterKind::WriterScGBloom, 100, 0.01).with_first_writer(1)
        );
        assert_eq!(spec.growth, None, "the default is absent from the spec");
        let spec = bf(&["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "99999999999"]).unwrap();
        assert_eq!(spec.growth(), u32::MAX);
        let cf = |ws: &[&str]| cf_reserve(&args(ws));
        let spec = cf(&[
            "CF.RESERVE",
            "k",
            "1000",
            "BUCKETSIZE",
            "255",
            "MAXITERATIONS",
            "10",
            "EXPANSION",
            "1",
        ])
        .unwrap();
        assert_eq!(
            (
                spec.kind,
                spec.bucket_size(),
                spec.max_kicks(),
                spec.growth()
            ),
            (FilterKind::WriterScOrCuckoo, 255, 10, 1)
        );
        let spec = cf(&[
            "CF.RESERVE",
            "k",
            "1000",
            "EXPANSION",
            "0",
            "BUCKETSIZE",
            "1",
        ])
        .unwrap();
        assert_eq!((spec.kind, spec.bucket_size()), (FilterKind::OrCuckoo, 1));
        assert_eq!(
            spec.growth, None,
            "a filter that does not scale has no growth"
        );
        assert!(spec.memory_bytes().is_ok());
        // RedisBloom's least capacity is two buckets of the size given.
        assert!(cf(&["CF.RESERVE", "k", "7", "BUCKETSIZE", "4"]).is_err());
        assert!(cf(&["CF.RESERVE", "k", "8", "BUCKETSIZE", "4"]).is_ok());
        assert!(cf(&["CF.RESERVE", "k", "1000", "BUCKETSIZE", "256"]).is_err());
        assert!(cf(&["CF.RESERVE", "k", "1000", "MAXITERATIONS", "65536"]).is_err());
    }

    #[test]
    fn crpf_reserve_takes_every_kind_and_the_window_of_expiring_ones() {
        let spec = crpf_reserve(&args(&[
            "CRPF.RESERVE",
            "k",
            "expiring_bloom",
            "1000",
            "0.01",
            "WINDOW",
            "60000",
            "EPOCHS",
            "6",
        ]))
        .unwrap();
        assert_eq!(spec.kind, FilterKind::ExpiringBloom);
        assert_eq!(spec.expiry.unwrap().window_ms, 60_000);
        assert_eq!(spec.expiry.unwrap().epochs, 6);
        for kind in FilterKind::ALL {
            if *kind == FilterKind::ExpiringBloom {
                continue;
            }
            let spec =
                crpf_reserve(&args(&["CRPF.RESERVE", "k", kind.name(), "100", "0.01"])).unwrap();
            assert_eq!(spec.kind, *kind);
        }
        let refused = |ws: &[&str]| match crpf_reserve(&args(ws)) {
            Err(Reply::Error(e)) => e,
            other => panic!("{ws:?}: {other:?}"),
        };
        assert!(refused(&["CRPF.RESERVE", "k", "bloom", "100", "0.01"]).contains("g_bloom"));
        assert!(refused(&["CRPF.RESERVE", "k", "g_bloom", "0", "0.01"]).contains("capacity"));
        assert!(refused(&["CRPF.RESERVE", "k", "g_bloom", "10", "1.5"]).contains("rate"));
        assert!(
            refused(&["CRPF.RESERVE", "k", "g_bloom", "10", "0.1", "WINDOW", "5"])
                .contains("expiring_bloom only")
        );
    }
}
