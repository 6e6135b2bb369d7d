//! RedisBloom's t-digest commands on a `t_digest` filter ([`crate::TDigest`]), with
//! RedisBloom's replies and error texts:
//!
//! | Command | Reply |
//! |---|---|
//! | `TDIGEST.CREATE` *key* \[`COMPRESSION` *c*\] | `OK` (compression 100 by default) |
//! | `TDIGEST.ADD` *key value* \[*value* ...\] | `OK` |
//! | `TDIGEST.MERGE` *dest numkeys src...* \[`COMPRESSION` *c*\] \[`OVERRIDE`\] | `OK` |
//! | `TDIGEST.RESET` *key* | `OK` |
//! | `TDIGEST.QUANTILE` *key q* \[*q* ...\] | per fraction, its value (doubles) |
//! | `TDIGEST.CDF` *key value* \[...\] | per value, the fraction at or below it |
//! | `TDIGEST.MIN`, `TDIGEST.MAX` *key* | the smallest, largest value |
//! | `TDIGEST.TRIMMED_MEAN` *key low high* | the mean between the two fractions |
//! | `TDIGEST.RANK`, `REVRANK` *key value* \[...\] | per value, its (reverse) rank |
//! | `TDIGEST.BYRANK`, `BYREVRANK` *key rank* \[...\] | per rank, its value |
//! | `TDIGEST.INFO` *key* | nine figures (a map in RESP3) |
//!
//! Doubles are RESP3 doubles, RESP2 bulk strings (`nan` while empty, `inf`, `-inf`).
//! `ADD`, `RESET` and `MERGE`'s change are the request API's updates
//! ([`Request::TdigestAdd`], [`Request::TdigestReset`]: logged, replicated, acknowledged at
//! the connection's level); the reads answer from the replica's state under its read lock.
//!
//! Differences, each because the key is replicated: `MERGE` adds the sources' centroids to
//! the destination as this replica's own values (after a reset with `OVERRIDE`), and keeps
//! the destination's compression where RedisBloom would rebuild it at another; reads leave
//! the digest as it is where RedisBloom's compress it, so `INFO`'s merged and unmerged
//! counts differ after a read (their sums do not), and answers differ from RedisBloom's
//! within the digest's error once adds follow reads on more values than it holds singly.

use bytes::Bytes;

use super::Keyspace;
use super::cms::{parse_f64, parse_i64};
use super::commands::{Command, KeyCommand, WRONGTYPE};
use super::parse::Args;
use super::reply::Reply;
use crate::api::Request;
use crate::replica::{AckLevel, AnyFilter, ReplicaHandle};
use crate::{FilterKind, FilterSpec, TDigest, TdigestParams};

/// A `TDIGEST.*` command, its arguments as given: checked when it runs, in RedisBloom's
/// order.
#[derive(Debug)]
pub struct TdigestCommand {
    verb: Verb,
    name: String,
    args: Vec<Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Create,
    Add,
    Merge,
    Reset,
    Quantile,
    Cdf,
    Min,
    Max,
    TrimmedMean,
    Rank,
    RevRank,
    ByRank,
    ByRevRank,
    Info,
}

fn error(text: &str) -> Reply {
    Reply::Error(format!("ERR T-Digest: {text}"))
}

fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!(
        "wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// The command `args` names (`name` upper case), arity checked; `None` if no `TDIGEST.*`
/// command has that name. `TDIGEST.ADD` on a digest that `filter` finds, with values that
/// parse and are finite, is its request, sent as `BF.ADD` is (applied in the connection's
/// task where the replica answers at once, not behind a future of its own); the rest run as
/// key commands, which check in RedisBloom's order.
pub fn command(
    name: &str,
    args: &Args,
    filter: &dyn Fn(&str) -> Option<ReplicaHandle>,
) -> Option<Command> {
    let n = args.len() - 1;
    let (verb, arity_ok) = match name {
        "TDIGEST.CREATE" => (Verb::Create, n == 1 || n == 3),
        "TDIGEST.ADD" => (Verb::Add, n >= 2),
        "TDIGEST.MERGE" => (Verb::Merge, n >= 3),
        "TDIGEST.RESET" => (Verb::Reset, n == 1),
        "TDIGEST.QUANTILE" => (Verb::Quantile, n >= 2),
        "TDIGEST.CDF" => (Verb::Cdf, n >= 2),
        "TDIGEST.MIN" => (Verb::Min, n == 1),
        "TDIGEST.MAX" => (Verb::Max, n == 1),
        "TDIGEST.TRIMMED_MEAN" => (Verb::TrimmedMean, n == 3),
        "TDIGEST.RANK" => (Verb::Rank, n >= 2),
        "TDIGEST.REVRANK" => (Verb::RevRank, n >= 2),
        "TDIGEST.BYRANK" => (Verb::ByRank, n >= 2),
        "TDIGEST.BYREVRANK" => (Verb::ByRevRank, n >= 2),
        "TDIGEST.INFO" => (Verb::Info, n == 1),
        _ => return None,
    };
    if !arity_ok {
        return Some(Command::Reply(wrong_arity(name)));
    }
    let name = crate::names::subject_name(args.arg(1));
    // `TDIGEST.ADD` with finite values, `TDIGEST.QUANTILE` with fractions in [0, 1] and
    // `TDIGEST.CDF` with numbers, on a digest: requests, answered in the connection's task.
    if matches!(verb, Verb::Add | Verb::Quantile | Verb::Cdf)
        && let Some(handle) = filter(&name)
        && handle.kind() == FilterKind::TDigest
        && let Some(numbers) = (2..args.len())
            .map(|i| parse_f64(args.arg(i)))
            .collect::<Option<Vec<f64>>>()
    {
        let request = match verb {
            Verb::Add if numbers.iter().all(|v| v.is_finite()) => Some(Request::TdigestAdd {
                values: numbers.into_iter().map(|v| (v, 1)).collect(),
                bounds: None,
                ack: None,
            }),
            Verb::Quantile if numbers.iter().all(|q| (0.0..=1.0).contains(q)) => {
                Some(Request::TdigestQuantile { quantiles: numbers })
            }
            Verb::Cdf => Some(Request::TdigestCdf { values: numbers }),
            _ => None,
        };
        if let Some(request) = request {
            return Some(Command::Filter(handle, request));
        }
    }
    Some(Command::Key(KeyCommand::Tdigest(TdigestCommand {
        verb,
        name: name.into_owned(),
        args: (2..args.len())
            .map(|i| Bytes::copy_from_slice(args.arg(i)))
            .collect(),
    })))
}

/// The digest `name`, or RedisBloom's refusal.
fn digest(lookup: &dyn Keyspace, name: &str) -> Result<ReplicaHandle, Reply> {
    match lookup.filter(name) {
        None => Err(error("key does not exist")),
        Some(h) if h.kind() != FilterKind::TDigest => Err(Reply::Error(WRONGTYPE.into())),
        Some(h) => Ok(h),
    }
}

/// Runs `f` on the digest `handle` serves.
fn with_digest<T>(handle: &ReplicaHandle, f: impl FnOnce(&TDigest) -> T) -> T {
    handle.read(|any| match any {
        AnyFilter::TDigest(t) => f(t),
        other => unreachable!("checked a t-digest, found a {}", other.kind()),
    })
}

/// RedisBloom's `RMUtil_ArgIndex`: where `word` is among `args`, any case.
fn arg_index(args: &[Bytes], word: &str) -> Option<usize> {
    args.iter()
        .position(|a| a.eq_ignore_ascii_case(word.as_bytes()))
}

/// A compression argument, or RedisBloom's refusal.
fn compression(arg: &[u8]) -> Result<i64, Reply> {
    match parse_i64(arg) {
        None => Err(error("error parsing compression parameter")),
        Some(c) if c <= 0 => Err(error(
            "compression parameter needs to be a positive integer",
        )),
        Some(c) => Ok(c),
    }
}

/// The spec of a digest of `compression`, if crpf holds one that large.
fn spec(compression: i64) -> Option<FilterSpec> {
    let c = u32::try_from(compression).ok()?;
    TdigestParams::new(c).ok()?;
    Some(FilterSpec::t_digest(c))
}

fn doubles(values: Vec<f64>) -> Reply {
    Reply::Array(values.into_iter().map(Reply::Double).collect())
}

/// Runs a `TDIGEST.*` command; `ack`: the connection's level for its updates.
pub async fn run(lookup: &dyn Keyspace, cmd: TdigestCommand, ack: Option<AckLevel>) -> Reply {
    let TdigestCommand { verb, name, args } = cmd;
    match verb {
        Verb::Create => return create(lookup, name, &args).await,
        Verb::Merge => return merge(lookup, name, &args, ack).await,
        _ => {}
    }
    let handle = match digest(lookup, &name) {
        Ok(h) => h,
        Err(refused) => return refused,
    };
    match verb {
        Verb::Add => {
            let mut values = Vec::with_capacity(args.len());
            for a in &args {
                match parse_f64(a) {
                    None => return error("error parsing val parameter"),
                    Some(v) if !v.is_finite() => {
                        return error("val parameter needs to be a finite number");
                    }
                    Some(v) => values.push((v, 1)),
                }
            }
            if with_digest(&handle, |t| t.size().checked_add(values.len() as u64))
                .is_none_or(|n| n > i64::MAX as u64)
            {
                return error("overflow detected");
            }
            let request = Request::TdigestAdd {
                values,
                bounds: None,
                ack: None,
            };
            update(&handle, request, ack)
                .await
                .unwrap_or(Reply::Simple("OK"))
        }
        Verb::Reset => update(&handle, Request::TdigestReset { ack: None }, ack)
            .await
            .unwrap_or(Reply::Simple("OK")),
        Verb::Quantile => {
            let mut qs = Vec::with_capacity(args.len());
            for a in &args {
                match parse_f64(a) {
                    None => return error("error parsing quantile"),
                    Some(q) if !(0.0..=1.0).contains(&q) => {
                        return error("quantile should be in [0,1]");
                    }
                    Some(q) => qs.push(q),
                }
            }
            doubles(with_digest(&handle, |t| t.view().quantiles(&qs)))
        }
        Verb::Cdf => {
            let Some(values) = args
                .iter()
                .map(|a| parse_f64(a))
                .collect::<Option<Vec<_>>>()
            else {
                return error("error parsing cdf");
            };
            let view = with_digest(&handle, TDigest::view);
            doubles(values.into_iter().map(|v| view.cdf(v)).collect())
        }
        Verb::Min | Verb::Max => {
            let view = with_digest(&handle, TDigest::view);
            Reply::Double(match (view.size(), verb) {
                (0, _) => f64::NAN,
                (_, Verb::Min) => view.min(),
                _ => view.max(),
            })
        }
        Verb::TrimmedMean => {
            let Some(low) = parse_f64(&args[0]) else {
                return error("error parsing low_cut_percentile");
            };
            let Some(high) = parse_f64(&args[1]) else {
                return error("error parsing high_cut_percentile");
            };
            if !(0.0..=1.0).contains(&low) || !(0.0..=1.0).contains(&high) {
                return error("low_cut_percentile and high_cut_percentile should be in [0,1]");
            }
            if low >= high {
                return error("low_cut_percentile should be lower than high_cut_percentile");
            }
            Reply::Double(with_digest(&handle, |t| t.view().trimmed_mean(low, high)))
        }
        Verb::Rank | Verb::RevRank => {
            let Some(values) = args
                .iter()
                .map(|a| parse_f64(a))
                .collect::<Option<Vec<_>>>()
            else {
                return error("error parsing value");
            };
            let view = with_digest(&handle, TDigest::view);
            let reverse = verb == Verb::RevRank;
            Reply::Array(
                values
                    .into_iter()
                    .map(|v| Reply::Int(view.rank(v, reverse)))
                    .collect(),
            )
        }
        Verb::ByRank | Verb::ByRevRank => {
            let mut ranks = Vec::with_capacity(args.len());
            for a in &args {
                match parse_i64(a) {
                    None => return error("error parsing rank"),
                    Some(r) if r < 0 => return error("rank needs to be non negative"),
                    Some(r) => ranks.push(r as u64),
                }
            }
            let view = with_digest(&handle, TDigest::view);
            let reverse = verb == Verb::ByRevRank;
            doubles(
                ranks
                    .into_iter()
                    .map(|r| view.by_rank(r, reverse))
                    .collect(),
            )
        }
        Verb::Info => with_digest(&handle, info),
        Verb::Create | Verb::Merge => unreachable!("run above"),
    }
}

/// Sends update `request` to `handle`: `None` once applied, else the refusal's reply.
async fn update(handle: &ReplicaHandle, request: Request, ack: Option<AckLevel>) -> Option<Reply> {
    let op = request.op();
    match super::commands::send(handle, request, ack, true).await {
        Ok(_) => None,
        Err(e) => Some(super::commands::reply(op, Err(e))),
    }
}

/// `TDIGEST.INFO`'s nine figures (a map in RESP3, pairs in RESP2).
fn info(t: &TDigest) -> Reply {
    let i = t.info();
    let int = |n: u64| Reply::Int(i64::try_from(n).unwrap_or(i64::MAX));
    let p = t.params();
    Reply::Map(vec![
        (Reply::Simple("Compression"), int(p.compression.into())),
        (Reply::Simple("Capacity"), int(p.capacity() as u64)),
        (Reply::Simple("Merged nodes"), int(i.merged_nodes)),
        (Reply::Simple("Unmerged nodes"), int(i.unmerged_nodes)),
        (Reply::Simple("Merged weight"), int(i.merged_weight)),
        (Reply::Simple("Unmerged weight"), int(i.unmerged_weight)),
        (
            Reply::Simple("Observations"),
            int(i.merged_weight.saturating_add(i.unmerged_weight)),
        ),
        (Reply::Simple("Total compressions"), int(i.compressions)),
        (Reply::Simple("Memory usage"), int(t.memory_bytes())),
    ])
}

async fn create(lookup: &dyn Keyspace, name: String, args: &[Bytes]) -> Reply {
    match lookup.filter(&name) {
        Some(h) if h.kind() == FilterKind::TDigest => return error("key already exists"),
        Some(_) => return Reply::Error(WRONGTYPE.into()),
        None => {}
    }
    let c = match args.len() {
        0 => i64::from(TdigestParams::DEFAULT_COMPRESSION),
        _ => {
            if arg_index(args, "COMPRESSION").is_none() {
                return error("wrong keyword");
            }
            match compression(&args[1]) {
                Ok(c) => c,
                Err(refused) => return refused,
            }
        }
    };
    // RedisBloom allocates what it is asked (or answers this); a crpf filter is bounded.
    let Some(spec) = spec(c) else {
        return error("allocation failed");
    };
    match lookup.create(name, spec).await {
        Ok(true) => Reply::Simple("OK"),
        Ok(false) => error("key already exists"),
        Err(e) => Reply::Error(e),
    }
}

/// A source's answer to a merge: its centroids and bounds (`None` while empty), and its
/// compression.
type Source = (Option<(Vec<(f64, u64)>, (f64, f64))>, u32);

fn source(t: &TDigest) -> Source {
    let view = t.view();
    let centroids = (view.size() > 0).then(|| (view.merged_centroids(), (view.min(), view.max())));
    (centroids, t.params().compression)
}

async fn merge(
    lookup: &dyn Keyspace,
    dest_name: String,
    args: &[Bytes],
    ack: Option<AckLevel>,
) -> Reply {
    let dest = match lookup.filter(&dest_name) {
        Some(h) if h.kind() != FilterKind::TDigest => return Reply::Error(WRONGTYPE.into()),
        other => other,
    };
    let Some(keys) = parse_i64(&args[0]) else {
        return error("error parsing numkeys");
    };
    if keys <= 0 {
        return error("numkeys needs to be a positive integer");
    }
    if keys > args.len() as i64 - 1 {
        return wrong_arity("TDIGEST.MERGE");
    }
    let keys = keys as usize;
    let rest = &args[1 + keys..];
    let mut chosen: Option<i64> = None;
    let mut over = false;
    if !rest.is_empty() {
        let at = arg_index(rest, "COMPRESSION");
        if let Some(at) = at {
            let Some(arg) = rest.get(at + 1) else {
                return wrong_arity("TDIGEST.MERGE");
            };
            match compression(arg) {
                Ok(c) => chosen = Some(c),
                Err(refused) => return refused,
            }
        }
        over = arg_index(rest, "OVERRIDE").is_some();
        if at.is_none() && !over {
            return error("wrong keyword");
        }
    }
    let mut sources = Vec::with_capacity(keys);
    for key in &args[1..=keys] {
        let key = crate::names::subject_name(key);
        let handle = match (&*key == dest_name.as_str(), &dest) {
            (true, Some(d)) => d.clone(),
            (true, None) => return error("key does not exist"),
            (false, _) => match digest(lookup, &key) {
                Ok(h) => h,
                Err(refused) => return refused,
            },
        };
        sources.push(with_digest(&handle, source));
    }
    let dest = match dest {
        Some(d) => d,
        None => {
            // RedisBloom's rule: the compression given, else the sources' largest.
            let c =
                chosen.unwrap_or_else(|| sources.iter().map(|s| i64::from(s.1)).max().unwrap_or(1));
            let Some(spec) = spec(c) else {
                return error("allocation of destination digest failed");
            };
            if let Err(e) = lookup.create(dest_name.clone(), spec).await {
                return Reply::Error(e);
            }
            match digest(lookup, &dest_name) {
                Ok(h) => h,
                Err(refused) => return refused,
            }
        }
    };
    let mut values = Vec::new();
    let mut bounds: Option<(f64, f64)> = None;
    for (centroids, _) in sources {
        if let Some((c, (lo, hi))) = centroids {
            values.extend(c);
            bounds = Some(bounds.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
        }
    }
    let kept = if over {
        0
    } else {
        with_digest(&dest, TDigest::size)
    };
    let added = values.iter().try_fold(0u64, |a, v| a.checked_add(v.1));
    if added
        .and_then(|a| a.checked_add(kept))
        .is_none_or(|n| n > i64::MAX as u64)
    {
        return error("overflow detected");
    }
    if over && let Some(refused) = update(&dest, Request::TdigestReset { ack: None }, ack).await {
        return refused;
    }
    if !values.is_empty() {
        let request = Request::TdigestAdd {
            values,
            bounds,
            ack: None,
        };
        if let Some(refused) = update(&dest, request, ack).await {
            return refused;
        }
    }
    Reply::Simple("OK")
}
