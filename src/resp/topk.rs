//! RedisBloom's top-k commands on a `top_k` filter ([`crate::TopK`]), with RedisBloom's
//! replies and error texts:
//!
//! | Command | Reply |
//! |---|---|
//! | `TOPK.RESERVE` *key k* \[*width depth decay*\] | `OK` (width 8, depth 7, decay 0.9 by default) |
//! | `TOPK.ADD` *key item* \[*item* ...\] | per item, the item its add pushed out of the list, or nil |
//! | `TOPK.INCRBY` *key item increment* \[...\] | as `TOPK.ADD`; increments 0 to 100,000 |
//! | `TOPK.QUERY` *key item* \[*item* ...\] | per item, 1 if listed (RESP3 booleans) |
//! | `TOPK.COUNT` *key item* \[*item* ...\] | per item, its estimated count |
//! | `TOPK.LIST` *key* \[`WITHCOUNT`\] | the list, best first (with counts) |
//! | `TOPK.INFO` *key* | `k`, `width`, `depth`, `decay` (a map in RESP3) |
//!
//! `ADD`/`INCRBY`, `QUERY`/`COUNT`, `LIST` and `INFO` are the request API's typed requests
//! ([`Request::TopkAdd`], [`Request::TopkQuery`], [`Request::TopkList`],
//! [`Request::TopkInfo`]), sent as the filters' commands are. An add is one update of this
//! replica's counts and heap (logged, replicated, acknowledged at the connection's level).
//! The answers are judged against this replica's view: its list is the k best of every
//! writer's heap it holds (see [`crate::TopK`]); with one writer they are RedisBloom's.
//! Counts are a count-min sketch's (never below the truth), not HeavyKeeper's, so
//! `TOPK.COUNT` answers as RedisBloom wherever an item has a row of its own.
//!
//! One refusal differs: RedisBloom answers an invalid increment in the middle of a
//! `TOPK.INCRBY` with an array shorter than it announced (a client waits for the rest); here
//! the whole command is refused, changing nothing, with RedisBloom's error text.

use bytes::Bytes;

use super::Keyspace;
use super::cms::{parse_f64, parse_i64};
use super::commands::{Command, KeyCommand, WRONGTYPE};
use super::parse::Args;
use super::reply::Reply;
use crate::api::{Items, Request, Response};
use crate::replica::{AckLevel, ReplicaHandle};
use crate::{FilterKind, FilterSpec};

/// A `TOPK.*` command that runs as a key command (the key missing, of another type, or
/// arguments refused): checked when it runs, in RedisBloom's order.
#[derive(Debug)]
pub struct TopkCommand {
    verb: Verb,
    name: String,
    args: Vec<Bytes>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Reserve,
    Add,
    IncrBy,
    Query,
    Count,
    List,
    Info,
}

const INCREMENT_ERROR: &str = "TopK: increment must be an integer greater or equal to 0    \
                        and smaller or equal to 100,000";

/// The command `args` names (`name` upper case), arity checked; `None` if no `TOPK.*`
/// command has that name.
pub fn command(
    name: &str,
    args: &Args,
    filter: &dyn Fn(&str) -> Option<ReplicaHandle>,
) -> Option<Command> {
    let n = args.len() - 1;
    let (verb, arity_ok) = match name {
        "TOPK.RESERVE" => (Verb::Reserve, n == 2 || n == 5),
        "TOPK.ADD" => (Verb::Add, n >= 2),
        "TOPK.INCRBY" => (Verb::IncrBy, n >= 3 && n % 2 == 1),
        "TOPK.QUERY" => (Verb::Query, n >= 2),
        "TOPK.COUNT" => (Verb::Count, n >= 2),
        "TOPK.LIST" => (Verb::List, n == 1 || n == 2),
        "TOPK.INFO" => (Verb::Info, n == 1),
        _ => return None,
    };
    if !arity_ok {
        return Some(Command::Reply(Reply::err(format!(
            "wrong number of arguments for '{}' command",
            name.to_ascii_lowercase()
        ))));
    }
    // `TOPK.COUNT` answers what `TOPK.QUERY`'s request does, as a key command that picks
    // the counts.
    if !matches!(verb, Verb::Reserve | Verb::Count)
        && let Some(handle) = filter(&crate::names::subject_name(args.arg(1)))
        && handle.kind() == FilterKind::TopK
    {
        let from = |i: usize| args.arg(i);
        if let Ok(request) = request(verb, &mut (2..args.len()).map(from)) {
            return Some(Command::Filter(handle, request));
        }
    }
    Some(Command::Key(KeyCommand::Topk(TopkCommand {
        verb,
        name: crate::names::subject_name(args.arg(1)).into_owned(),
        args: (2..args.len())
            .map(|i| Bytes::copy_from_slice(args.arg(i)))
            .collect(),
    })))
}

/// The request of a verb with arguments `args` (after the key), or RedisBloom's refusal.
fn request(verb: Verb, args: &mut dyn Iterator<Item = &[u8]>) -> Result<Request, Reply> {
    Ok(match verb {
        Verb::Add => {
            let items: Vec<&[u8]> = args.collect();
            Request::TopkAdd {
                increments: vec![1; items.len()],
                items: Items::of(items),
                ack: None,
            }
        }
        Verb::IncrBy => {
            let mut items = Vec::new();
            let mut increments = Vec::new();
            while let (Some(item), Some(n)) = (args.next(), args.next()) {
                match parse_i64(n) {
                    Some(n) if (0..=100_000).contains(&n) => increments.push(n as u64),
                    _ => return Err(Reply::Error(INCREMENT_ERROR.into())),
                }
                items.push(item);
            }
            Request::TopkAdd {
                items: Items::of(items),
                increments,
                ack: None,
            }
        }
        Verb::Query | Verb::Count => Request::TopkQuery {
            items: Items::of(args),
        },
        Verb::List => match args.next() {
            None => Request::TopkList { with_count: false },
            // RedisBloom compares as many letters as given (`strncasecmp`).
            Some(a) if a.len() <= 9 && a.eq_ignore_ascii_case(&b"WITHCOUNT"[..a.len()]) => {
                Request::TopkList { with_count: true }
            }
            Some(_) => return Err(Reply::Error("WITHCOUNT keyword expected".into())),
        },
        Verb::Info => Request::TopkInfo,
        Verb::Reserve => unreachable!("TOPK.RESERVE is no request"),
    })
}

/// RedisBloom's reply to a top-k's answer; `count`: `TOPK.COUNT`'s (else `TOPK.QUERY`'s).
pub(super) fn reply(response: Response, count: bool) -> Reply {
    let item = |i: Vec<u8>| Reply::Bulk(Bytes::from(i));
    match response {
        Response::TopkAdded(expelled) => Reply::Array(
            expelled
                .into_iter()
                .map(|e| e.map_or(Reply::Null, item))
                .collect(),
        ),
        Response::TopkQueried { counts, .. } if count => {
            Reply::Array(counts.into_iter().map(|n| Reply::Int(clamp(n))).collect())
        }
        Response::TopkQueried { listed, .. } => Reply::Array(
            listed
                .into_iter()
                .map(|l| Reply::IntOrBool {
                    resp2: i64::from(l),
                    resp3: l,
                })
                .collect(),
        ),
        Response::TopkList { items, with_count } => {
            let mut out = Vec::new();
            // RedisBloom stops at the first slot that counts 0.
            for (i, n) in items.into_iter().take_while(|(_, n)| *n > 0) {
                out.push(item(i));
                if with_count {
                    out.push(Reply::Int(clamp(n)));
                }
            }
            Reply::Array(out)
        }
        Response::TopkInfo {
            k,
            width,
            depth,
            decay,
        } => Reply::Map(vec![
            (Reply::Simple("k"), Reply::Int(k.into())),
            (Reply::Simple("width"), Reply::Int(width.into())),
            (Reply::Simple("depth"), Reply::Int(depth.into())),
            (Reply::Simple("decay"), Reply::Double(decay)),
        ]),
        other => Reply::err(format!("unexpected answer: {other:?}")),
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// Runs a `TOPK.*` command; `ack`: the connection's level for its updates.
pub async fn run(lookup: &dyn Keyspace, cmd: TopkCommand, ack: Option<AckLevel>) -> Reply {
    let TopkCommand { verb, name, args } = cmd;
    if verb == Verb::Reserve {
        return reserve(lookup, name, &args).await;
    }
    // `TOPK.LIST` checks its keyword before the key.
    if verb == Verb::List
        && let Err(refused) = request(verb, &mut args.iter().map(|a| &a[..]))
    {
        return refused;
    }
    let handle = match lookup.filter(&name) {
        None => return error("TopK: key does not exist"),
        Some(h) if h.kind() != FilterKind::TopK => return Reply::Error(WRONGTYPE.into()),
        Some(h) => h,
    };
    match request(verb, &mut args.iter().map(|a| &a[..])) {
        Ok(request) => {
            let op = request.op();
            let answer = super::commands::send(&handle, request, ack, true).await;
            match answer {
                Ok(response) => reply(response, verb == Verb::Count),
                Err(e) => super::commands::reply(op, Err(e)),
            }
        }
        Err(refused) => refused,
    }
}

async fn reserve(lookup: &dyn Keyspace, name: String, args: &[Bytes]) -> Reply {
    if lookup.filter(&name).is_some() {
        return error("TopK: key already exists");
    }
    let dimension = |a: &Bytes| {
        parse_i64(a)
            .filter(|&v| (1..=i64::from(u32::MAX)).contains(&v))
            .map(|v| v as u32)
    };
    let Some(k) = dimension(&args[0]) else {
        return error("TopK: invalid k");
    };
    let spec = if args.len() == 4 {
        let Some(width) = dimension(&args[1]) else {
            return error("TopK: invalid width");
        };
        let Some(depth) = dimension(&args[2]) else {
            return error("TopK: invalid depth");
        };
        let Some(decay) = parse_f64(&args[3]).filter(|&d| d > 0.0 && d <= 1.0) else {
            return error("TopK: invalid decay value. must be '<= 1' & '> 0'");
        };
        FilterSpec::top_k(k, width, depth, decay)
    } else {
        FilterSpec::top_k(
            k,
            crate::TopkParams::DEFAULT_WIDTH,
            crate::TopkParams::DEFAULT_DEPTH,
            crate::TopkParams::DEFAULT_DECAY,
        )
    };
    // RedisBloom allocates what it is asked (or answers this); a crpf filter is bounded.
    if spec.memory_bytes().is_err() {
        return error("ERR Insufficient memory to create topk data structure");
    }
    match lookup.create(name, spec).await {
        Ok(true) => Reply::Simple("OK"),
        Ok(false) => error("TopK: key already exists"),
        Err(e) => Reply::Error(e),
    }
}
