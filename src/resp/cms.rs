//! RedisBloom's count-min sketch commands on a `count_min_sketch` filter
//! ([`crate::CountMinSketch`]), with RedisBloom's replies and error texts:
//!
//! | Command | Reply |
//! |---|---|
//! | `CMS.INITBYDIM` *key width depth* | `OK`: a sketch of `depth` rows of `width` counters |
//! | `CMS.INITBYPROB` *key error probability* | `OK`: width `ceil(2/error)`, depth `ceil(log(probability)/log(1/2))` |
//! | `CMS.INCRBY` *key item increment* \[*item increment* ...\] | each item's estimate after its increment |
//! | `CMS.QUERY` *key item* \[*item* ...\] | each item's estimate |
//! | `CMS.MERGE` *dest numKeys src...* \[`WEIGHTS` *w...*\] | `OK`: the sources, weighted, folded into `dest` |
//! | `CMS.INFO` *key* | `width`, `depth`, `count` (a map in RESP3) |
//!
//! `CMS.INCRBY`, `CMS.QUERY` and `CMS.INFO` are the request API's typed requests
//! ([`Request::CmsIncrBy`], [`Request::CmsQuery`], [`Request::CmsInfo`]), sent as the
//! filters' commands are (a key found when the command is parsed goes the way of `BF.ADD`,
//! answered without a future where the replica answers at once). An increment is one update
//! (logged, replicated and acknowledged at the connection's level, `CRPF.ACK`) of this
//! replica's own counters, a grow-only update applied in the caller's thread like a
//! filter's add; each pair's estimate is read right after its increment under the same
//! write lock (RedisBloom answers pair by pair), so an increment another client made
//! meanwhile counts too.
//!
//! `CMS.MERGE` raises each counter of the destination to the weighted sum of the sources'
//! (RedisBloom sets it to the sum), as this replica's own increments of the shortfall: a
//! replicated counter never decreases, so a counter that already counts more keeps its count.
//! That is RedisBloom's answer wherever the destination counted no more than the sum (an
//! empty destination, or one among the sources at a weight of 1 or more). The refusals are
//! RedisBloom's: a weighted sum below zero or a counter's past `2^32 - 1` answers
//! `CMS: MERGE overflow` and changes nothing.

use bytes::Bytes;

use super::Keyspace;
use super::commands::{Command, KeyCommand, WRONGTYPE};
use super::parse::Args;
use super::reply::Reply;
use crate::api::{Request, Response};
use crate::replica::{AckLevel, AnyFilter, ReplicaHandle};
use crate::{CountMinSketch, FilterKind, FilterSpec};

/// Occurrences a `CMS.MERGE` sends in one update at most: the import's slices.
const MERGE_SLICE: usize = 8192;

/// A `CMS.*` command, its arguments as given: checked when it runs, in RedisBloom's order
/// (the key first, then the arguments).
#[derive(Debug)]
pub struct CmsCommand {
    verb: Verb,
    /// The key (subject name).
    name: String,
    /// The arguments after the key.
    args: Vec<Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    InitByDim,
    InitByProb,
    IncrBy,
    Query,
    Merge,
    Info,
}

/// The command `args` names (its name upper case in `name`), arity checked; `None` if no
/// `CMS.*` command has that name. `CMS.INCRBY`, `CMS.QUERY` and `CMS.INFO` on a sketch that
/// `filter` finds, with arguments that parse, are its requests; the rest (and those on a
/// key that is missing or of another type: they answer when they run, as RedisBloom's do in
/// a transaction) run as key commands.
pub fn command(
    name: &str,
    args: &Args,
    filter: &dyn Fn(&str) -> Option<ReplicaHandle>,
) -> Option<Command> {
    let n = args.len() - 1;
    let (verb, arity_ok) = match name {
        "CMS.INITBYDIM" => (Verb::InitByDim, n == 3),
        "CMS.INITBYPROB" => (Verb::InitByProb, n == 3),
        "CMS.INCRBY" => (Verb::IncrBy, n >= 3 && n % 2 == 1),
        "CMS.QUERY" => (Verb::Query, n >= 2),
        "CMS.MERGE" => (Verb::Merge, n >= 3),
        "CMS.INFO" => (Verb::Info, n == 1),
        _ => return None,
    };
    if !arity_ok {
        return Some(Command::Reply(Reply::err(format!(
            "wrong number of arguments for '{}' command",
            name.to_ascii_lowercase()
        ))));
    }
    if matches!(verb, Verb::IncrBy | Verb::Query | Verb::Info)
        && let Some(handle) = filter(&crate::names::subject_name(args.arg(1)))
        && handle.kind() == FilterKind::CountMinSketch
        && let Ok(request) = request(verb, args, 2)
    {
        return Some(Command::Filter(handle, request));
    }
    Some(Command::Key(KeyCommand::Cms(CmsCommand {
        verb,
        name: crate::names::subject_name(args.arg(1)).into_owned(),
        args: (2..args.len())
            .map(|i| Bytes::copy_from_slice(args.arg(i)))
            .collect(),
    })))
}

/// The request of `CMS.INCRBY`, `CMS.QUERY` or `CMS.INFO` with arguments `args[from..]`
/// (after the key), its items views of `args`' buffer (copied only if the request waits),
/// or RedisBloom's refusal of them.
fn request(verb: Verb, args: &Args, from: usize) -> Result<Request, Reply> {
    match verb {
        Verb::IncrBy => {
            let mut increments = Vec::with_capacity((args.len() - from) / 2);
            for i in (from + 1..args.len()).step_by(2) {
                increments.push(increment(args.arg(i))?);
            }
            Ok(Request::CmsIncrBy {
                items: args.items_at((from..args.len()).step_by(2)),
                increments,
                ack: None,
            })
        }
        Verb::Query => Ok(Request::CmsQuery {
            items: args.items(from),
        }),
        Verb::Info => Ok(Request::CmsInfo),
        other => unreachable!("{other:?} is no request"),
    }
}

/// An increment of `CMS.INCRBY`, or RedisBloom's refusal of it.
fn increment(n: &[u8]) -> Result<u64, Reply> {
    match parse_i64(n) {
        None => Err(error("CMS: Cannot parse number")),
        Some(n) if n < 0 => Err(error("CMS: Number cannot be negative")),
        Some(n) => Ok(n as u64),
    }
}

/// RedisBloom's reply to a sketch's answer.
pub(super) fn reply(response: Response) -> Reply {
    match response {
        Response::CmsIncremented(counts) => Reply::Array(
            counts
                .into_iter()
                .map(|n| match n >= u64::from(u32::MAX) {
                    true => error("CMS: INCRBY overflow"),
                    false => Reply::Int(n as i64),
                })
                .collect(),
        ),
        Response::CmsCount(counts) => {
            Reply::Array(counts.into_iter().map(|n| Reply::Int(clamp(n))).collect())
        }
        Response::CmsInfo {
            width,
            depth,
            count,
        } => Reply::Map(vec![
            (Reply::Simple("width"), Reply::Int(width.into())),
            (Reply::Simple("depth"), Reply::Int(depth.into())),
            (Reply::Simple("count"), Reply::Int(clamp(count))),
        ]),
        other => Reply::err(format!("unexpected answer: {other:?}")),
    }
}

/// Whether `kind` belongs to the family of `BF.*` (`bloom`) or `CF.*` commands: a sketch
/// belongs to neither, and answers them as RedisBloom answers a key of another type.
pub fn in_family(kind: FilterKind, bloom: bool) -> bool {
    !matches!(
        kind,
        FilterKind::CountMinSketch | FilterKind::TopK | FilterKind::TDigest
    ) && super::redisbloom::is_bloom(kind) == bloom
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// The sketch `name`, or RedisBloom's refusal.
fn sketch(lookup: &dyn Keyspace, name: &str) -> Result<ReplicaHandle, Reply> {
    match lookup.filter(name) {
        None => Err(error("CMS: key does not exist")),
        Some(h) if h.kind() != FilterKind::CountMinSketch => Err(Reply::Error(WRONGTYPE.into())),
        Some(h) => Ok(h),
    }
}

/// Runs `f` on the sketch `handle` serves.
fn with_sketch<T>(handle: &ReplicaHandle, f: impl FnOnce(&CountMinSketch) -> T) -> T {
    handle.read(|any| match any {
        AnyFilter::CountMinSketch(s) => f(s),
        other => unreachable!("checked a sketch, found a {}", other.kind()),
    })
}

/// `Redis`'s integer parse (`RedisModule_StringToLongLong`): an optional `-`, digits, no
/// spaces, no `+`, within `i64`.
pub(super) fn parse_i64(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.starts_with('+') || s.len() > 20 {
        return None;
    }
    s.parse().ok()
}

/// `RedisModule_StringToDouble`: a float with nothing around it.
pub(super) fn parse_f64(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.is_empty() || s.trim() != s {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| !v.is_nan())
}

/// Runs a `CMS.*` command; `ack`: the connection's level for its updates.
pub async fn run(lookup: &dyn Keyspace, cmd: CmsCommand, ack: Option<AckLevel>) -> Reply {
    let CmsCommand { verb, name, args } = cmd;
    match verb {
        Verb::InitByDim | Verb::InitByProb => init(lookup, verb, name, &args).await,
        Verb::IncrBy | Verb::Query | Verb::Info => match sketch(lookup, &name) {
            Ok(h) => match request(verb, &Args::of(&args), 0) {
                Ok(request) => {
                    let op = request.op();
                    let answer = super::commands::send(&h, request, ack, true).await;
                    super::commands::reply(op, answer)
                }
                Err(refused) => refused,
            },
            Err(refused) => refused,
        },
        Verb::Merge => match sketch(lookup, &name) {
            Ok(h) => merge(lookup, &h, &args, ack).await,
            Err(refused) => refused,
        },
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn init(lookup: &dyn Keyspace, verb: Verb, name: String, args: &[Bytes]) -> Reply {
    if lookup.filter(&name).is_some() {
        return error("CMS: key already exists");
    }
    let spec = if verb == Verb::InitByDim {
        let width = parse_i64(&args[0]).filter(|&w| w >= 1);
        let Some(width) = width else {
            return error("CMS: invalid width");
        };
        let depth = parse_i64(&args[1]).filter(|&d| d >= 1);
        let Some(depth) = depth else {
            return error("CMS: invalid depth");
        };
        if width.checked_mul(depth).is_none() {
            return error("CMS: invalid init arguments");
        }
        let (Ok(width), Ok(depth)) = (u32::try_from(width), u32::try_from(depth)) else {
            return error("CMS: Insufficient memory to create the key");
        };
        FilterSpec::count_min(width, depth)
    } else {
        let error_rate = parse_f64(&args[0]).filter(|&e| e > 0.0 && e < 1.0);
        let Some(error_rate) = error_rate else {
            return error("CMS: invalid overestimation value");
        };
        let probability = parse_f64(&args[1]).filter(|&p| p > 0.0 && p < 1.0);
        let Some(probability) = probability else {
            return error("CMS: invalid prob value");
        };
        match crate::CmsParams::from_error(error_rate, probability) {
            Ok(p) => FilterSpec::count_min(p.width, p.depth),
            Err(_) => return error("CMS: Insufficient memory to create the key"),
        }
    };
    // RedisBloom allocates what it is asked (or answers this); a crpf filter is bounded.
    if spec.memory_bytes().is_err() {
        return error("CMS: Insufficient memory to create the key");
    }
    match lookup.create(name, spec).await {
        Ok(true) => Reply::Simple("OK"),
        Ok(false) => error("CMS: key already exists"),
        Err(e) => Reply::Error(e),
    }
}

async fn merge(
    lookup: &dyn Keyspace,
    dest: &ReplicaHandle,
    args: &[Bytes],
    ack: Option<AckLevel>,
) -> Reply {
    let Some(keys) = parse_i64(&args[0]) else {
        return error("CMS: invalid numkeys");
    };
    if keys <= 0 {
        return error("CMS: Number of keys must be positive");
    }
    let rest = &args[1..];
    let weights_at = rest.iter().position(|a| a.eq_ignore_ascii_case(b"WEIGHTS"));
    match weights_at {
        None if keys as usize != rest.len() => {
            return error("CMS: wrong number of keys");
        }
        Some(at) if at as i64 != keys || rest.len() as i64 != 1 + keys * 2 => {
            return error("CMS: wrong number of keys/weights");
        }
        _ => {}
    }
    let keys = keys as usize;
    let shape = with_sketch(dest, |s| *s.params());
    let mut sources = Vec::with_capacity(keys);
    for i in 0..keys {
        let weight = match weights_at {
            None => 1,
            Some(_) => match parse_i64(&rest[keys + 1 + i]) {
                Some(w) => w,
                None => return error("CMS: invalid weight value"),
            },
        };
        let handle = match sketch(lookup, &crate::names::subject_name(&rest[i])) {
            Ok(h) => h,
            Err(refused) => return refused,
        };
        let snapshot = with_sketch(&handle, Clone::clone);
        let p = snapshot.params();
        if (p.width, p.depth) != (shape.width, shape.depth) {
            return error("CMS: width/depth is not equal");
        }
        sources.push((snapshot, weight));
    }
    let weighted: Vec<(&CountMinSketch, i64)> = sources.iter().map(|(s, w)| (s, *w)).collect();
    let occurrences = match with_sketch(dest, |d| d.weighted_occurrences(&weighted)) {
        Ok(o) => o,
        Err(crate::FilterError::Incompatible(_)) => {
            // Same width and depth, another seed: not RedisBloom's case (it has none).
            return error("CMS: width/depth is not equal");
        }
        Err(_) => return error("CMS: MERGE overflow"),
    };
    let mut slices = occurrences.chunks(MERGE_SLICE).peekable();
    while let Some(slice) = slices.next() {
        if let Err(e) = dest.add_located(slice.to_vec(), ack).await {
            let reply = super::untaken_reply(&e);
            if slices.peek().is_some() || occurrences.len() > MERGE_SLICE {
                tracing::warn!(error = %e, "a CMS.MERGE stopped part way");
            }
            return reply;
        }
    }
    Reply::Simple("OK")
}
