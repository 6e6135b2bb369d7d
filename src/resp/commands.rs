//! What each RESP command means for a crpf filter, and how the request API's answer reads as
//! a RESP reply. The key of every filter command is the filter's name: a filter of the node's
//! configuration, or of its filter catalog, which `BF.RESERVE`/`CF.RESERVE` and `DEL` change
//! ([`KeyCommand`]).
//!
//! | Command | Request API | Reply |
//! |---|---|---|
//! | `BF.ADD`, `CF.ADD` *key item* | `add` | `1` |
//! | `BF.MADD` *key item...*; `BF.INSERT`, `CF.INSERT` *key* \[options\] `ITEMS` *item...* | `madd` | an array: `1` per item added, an error where one could not be |
//! | `BF.EXISTS`, `CF.EXISTS` *key item* | `contains` | `1` or `0` |
//! | `BF.MEXISTS`, `CF.MEXISTS` *key item...* | `mcontains` | an array of `1` and `0` |
//! | `CF.DEL` *key item* | `remove` | `1` if an occurrence was removed, else `0` |
//! | `CRPF.MDEL` *key item...* | `mremove` | an array of `1` and `0` |
//! | `CF.COUNT` *key item* | `count` | the multiplicity (counting kinds) |
//! | `CRPF.STATS` *key* | `stats` | the stats JSON as a bulk string |
//! | `CRPF.ACK` *level* | | `OK`: later updates of this connection wait for `local`, `durable` or `replicated` |
//! | `HELLO` \[`2`\|`3` \[`AUTH default` *password*\] \[`SETNAME` *name*\]\] | | the server map; RESP3 after `HELLO 3` |
//! | `MULTI`, then commands, then `EXEC` or `DISCARD` | each queued command's | `QUEUED` each, then one array of their replies |
//!
//! In RESP3 the `1`/`0` of adds, queries and removes are booleans (`#t`/`#f`), as RedisBloom
//! sends them; counts stay integers. `EXEC` runs its commands one after the other, each
//! through its filter's actor, while the connection runs nothing else; a command refused while
//! queueing (arity, unknown filter) aborts the transaction (`EXECABORT`) before anything runs.
//! `WATCH` is refused: a filter changes through replication at any moment, so a watched key
//! could never be trusted.
//!
//! As in RedisBloom, a `BF.*` command on a cuckoo kind (or `CF.*` on a Bloom kind) answers
//! `WRONGTYPE`, and the queries of a key that does not exist answer `0`.
//!
//! Unlike RedisBloom, an add answers `1` whether or not the item was there already (a
//! replicated filter cannot tell "new" from "added elsewhere first"), and the creation
//! options of `BF.INSERT`/`CF.INSERT` (`CAPACITY`, `ERROR`, `NOCREATE`...) are accepted and
//! ignored.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;

use super::parse::Args;
use crate::api::batch;
use crate::api::{ACK_HEADER, ERROR_HEADER, Op, REPLY_HEADER, ReplyFormat};
use crate::replica::{AckLevel, ApiResponse, PendingResponse, ReplicaHandle};

/// The protocol a connection speaks: RESP2 until `HELLO 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// RESP2: booleans as `:1`/`:0`, maps as flat arrays, null as `$-1`.
    #[default]
    Resp2,
    /// RESP3 (`HELLO 3`): `#t`/`#f`, `%` maps, `_` null.
    Resp3,
}

/// A reply, in either protocol ([`Reply::encode_as`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// `+<text>`.
    Simple(&'static str),
    /// `:<n>`.
    Int(i64),
    /// A boolean: RESP3 `#t`/`#f`, RESP2 `:1`/`:0` (RedisBloom's replies to adds and
    /// queries).
    Bool(bool),
    /// RESP3 `%<n>` and the pairs; RESP2 a flat array of keys and values.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `_`; RESP2 `$-1`.
    Null,
    /// `$<len>` and the bytes.
    Bulk(Bytes),
    /// `*<n>` and the elements.
    Array(Vec<Reply>),
    /// `*<n>` of `:1` and `:0` read from a checked bitmap of `n` results
    /// ([`batch::check_bitmap`]), a `0` as `refused` where given: a batch's answer without a
    /// `Reply` per item.
    Bits {
        /// The results, bit `i` of byte `i / 8` for item `i`.
        bitmap: Bytes,
        /// How many.
        items: usize,
        /// The reply of an item refused (else `:0`).
        refused: Option<Box<Reply>>,
    },
    /// `-<text>`: the text starts with the error's kind (`ERR`, `NOAUTH`...).
    Error(String),
}

impl Reply {
    /// An `ERR` error.
    pub fn err(text: impl std::fmt::Display) -> Self {
        Reply::Error(format!("ERR {text}"))
    }

    /// Appends the reply's RESP2 encoding.
    pub fn encode(&self, out: &mut BytesMut) {
        self.encode_as(out, Protocol::Resp2)
    }

    /// Appends the reply's encoding in `protocol`.
    pub fn encode_as(&self, out: &mut BytesMut, protocol: Protocol) {
        let resp3 = protocol == Protocol::Resp3;
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Int(0) => out.put_slice(b":0\r\n"),
            Reply::Int(1) => out.put_slice(b":1\r\n"),
            Reply::Int(n) => line(out, b':', itoa::Buffer::new().format(*n).as_bytes()),
            Reply::Bool(b) => out.put_slice(match (resp3, b) {
                (true, true) => b"#t\r\n",
                (true, false) => b"#f\r\n",
                (false, true) => b":1\r\n",
                (false, false) => b":0\r\n",
            }),
            Reply::Null if resp3 => out.put_slice(b"_\r\n"),
            Reply::Null => out.put_slice(b"$-1\r\n"),
            Reply::Map(pairs) => {
                let (kind, n) = if resp3 {
                    (b'%', pairs.len())
                } else {
                    (b'*', 2 * pairs.len())
                };
                line(out, kind, itoa::Buffer::new().format(n).as_bytes());
                for (k, v) in pairs {
                    k.encode_as(out, protocol);
                    v.encode_as(out, protocol);
                }
            }
            Reply::Bulk(b) => {
                line(out, b'$', itoa::Buffer::new().format(b.len()).as_bytes());
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Reply::Array(items) => {
                line(
                    out,
                    b'*',
                    itoa::Buffer::new().format(items.len()).as_bytes(),
                );
                items.iter().for_each(|r| r.encode_as(out, protocol));
            }
            Reply::Bits {
                bitmap,
                items,
                refused,
            } => {
                line(out, b'*', itoa::Buffer::new().format(*items).as_bytes());
                for i in 0..*items {
                    // Checked when built from an answer; a short bitmap reads as zeros.
                    match (batch::bitmap_bit(bitmap, i), refused) {
                        (true, _) => Reply::Bool(true).encode_as(out, protocol),
                        (false, Some(e)) => e.encode_as(out, protocol),
                        (false, None) => Reply::Bool(false).encode_as(out, protocol),
                    }
                }
            }
            // One line: an error text must not end the reply early.
            Reply::Error(e) => {
                let text: String = e
                    .chars()
                    .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                    .collect();
                line(out, b'-', text.as_bytes());
            }
        }
    }
}

fn line(out: &mut BytesMut, kind: u8, body: &[u8]) {
    out.put_u8(kind);
    out.put_slice(body);
    out.put_slice(b"\r\n");
}

/// How the answer of a request reads as a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `add`: `1`.
    Added,
    /// `contains`: `1` or `0`.
    Found,
    /// `remove`: `1` or `0`.
    Removed,
    /// `count`: the number.
    Count,
    /// A batch of this many items answered as a bitmap: `1` and `0`, or for `madd` an error
    /// where an item was refused.
    Bits {
        /// Items in the batch.
        items: usize,
    },
    /// `stats`: the JSON as a bulk string.
    Json,
}

/// A request of the API that a command comes to.
#[derive(Debug)]
pub struct Request {
    /// The operation.
    pub op: Op,
    /// Its payload: the item, or a batch.
    pub payload: Bytes,
    /// How its answer reads (a batch's as a bitmap).
    pub shape: Shape,
}

/// A command, checked: answered by the connection itself, or a request to a filter.
#[derive(Debug)]
pub enum Command {
    /// Answered at once.
    Reply(Reply),
    /// For the filter named by the key.
    Filter(ReplicaHandle, Request),
    /// `CRPF.ACK`: the level of this connection's later updates.
    SetAck(AckLevel),
    /// `AUTH`, with the password given.
    Auth(Bytes),
    /// `AUTH` refused before the password is checked (arity, user name): answered as it is
    /// whether or not the connection is authenticated, as Redis does.
    AuthRefused(Reply),
    /// `QUIT`: answer `OK` and close.
    Quit,
    /// `HELLO [protover] [AUTH default password] [SETNAME name]`, checked.
    Hello {
        /// The protocol asked for, if any.
        protocol: Option<Protocol>,
        /// The password given with `AUTH`, if any.
        password: Option<Bytes>,
    },
    /// `MULTI`: queue the next commands until `EXEC` or `DISCARD`.
    Multi,
    /// `EXEC`: run the queued commands, their replies in one array.
    Exec,
    /// `DISCARD`: drop the queued commands.
    Discard,
    /// A command on the keys themselves: the filters the node hosts.
    Key(KeyCommand),
}

/// Commands on keys (filters), answered with the node's filter catalog
/// ([`super::FilterLookup`]).
#[derive(Debug)]
pub enum KeyCommand {
    /// `BF.RESERVE` / `CF.RESERVE`: create a filter of this spec.
    Reserve {
        /// The key.
        name: String,
        /// What it becomes.
        spec: crate::FilterSpec,
    },
    /// `DEL` / `UNLINK`: drop these filters; the reply counts those dropped.
    Delete(Vec<String>),
    /// `EXISTS`: how many of these keys exist (a key named twice counts twice).
    Exists(Vec<Vec<u8>>),
    /// `TYPE`: RedisBloom's type name of the key, or `none`.
    Type(Vec<u8>),
    /// `DBSIZE`: how many filters.
    DbSize,
    /// `KEYS pattern`, `SCAN cursor [MATCH pattern]`: the names matching a glob pattern.
    Keys {
        /// The pattern (`*` for `SCAN` without `MATCH`).
        pattern: Vec<u8>,
        /// Answer as `SCAN` does: cursor `0` and the names.
        scan: bool,
    },
}

/// Redis's answer to a command on a key of another type.
pub(crate) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Whether `kind` answers RedisBloom's `BF.*` commands (else its `CF.*` ones).
fn is_bloom(kind: crate::FilterKind) -> bool {
    use crate::FilterKind as K;
    matches!(
        kind,
        K::GBloom | K::ScGBloom | K::WriterScGBloom | K::ExpiringBloom
    )
}

/// Redis's answer to a wrong user name or password.
pub(crate) const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Why a command is refused before it reaches a filter, for the `reason` label of
/// `crpf_resp_rejected_total`.
pub(crate) fn rejected_reason(reply: &Reply) -> Option<&'static str> {
    let Reply::Error(e) = reply else { return None };
    Some(if e.starts_with("ERR unknown command") {
        "unknown_command"
    } else if e.starts_with("ERR wrong number") {
        "wrong_arity"
    } else if e.starts_with("ERR no filter") {
        "unknown_filter"
    } else if e.starts_with("NOAUTH") || e.starts_with("WRONGPASS") {
        "auth"
    } else {
        "invalid"
    })
}

/// What `args` (the command's name first) asks for; `filter` finds a filter by name.
pub fn command(args: &Args, filter: impl Fn(&[u8]) -> Option<ReplicaHandle>) -> Command {
    if args.is_empty() {
        // An empty command: Redis answers nothing, but a reply keeps replies and requests
        // paired for the client.
        return Command::Reply(Reply::err("empty command"));
    }
    let name = String::from_utf8_lossy(args.arg(0)).to_ascii_uppercase();
    // Arguments after the name.
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let arity = |ok: bool| -> Result<(), Command> {
        if ok {
            Ok(())
        } else {
            Err(Command::Reply(Reply::err(format!(
                "wrong number of arguments for '{}' command",
                name.to_ascii_lowercase()
            ))))
        }
    };
    // RedisBloom's families: a BF command on a cuckoo key (or a CF command on a Bloom key) is
    // WRONGTYPE; queries of a missing key answer "not there", as RedisBloom's do.
    let family = if name.starts_with("BF.") {
        Some(true)
    } else if name.starts_with("CF.") {
        Some(false)
    } else {
        None
    };
    let on_filter = |op: Op, shape: Shape, payload: Bytes| -> Command {
        let key = arg(0);
        match filter(key) {
            Some(handle) if family.is_some_and(|bloom| bloom != is_bloom(handle.kind())) => {
                Command::Reply(Reply::Error(WRONGTYPE.into()))
            }
            Some(handle) => Command::Filter(handle, Request { op, payload, shape }),
            None if family.is_some() && matches!(op, Op::Contains | Op::Count) => {
                Command::Reply(match op {
                    Op::Count => Reply::Int(0),
                    _ => Reply::Bool(false),
                })
            }
            None if family.is_some() && op == Op::MContains => {
                Command::Reply(Reply::Array(vec![Reply::Bool(false); args.len() - 2]))
            }
            None => Command::Reply(Reply::err(format!(
                "no filter named `{}` on this node",
                String::from_utf8_lossy(&key[..key.len().min(64)])
            ))),
        }
    };
    // The items from argument `from` (counted after the name) on, in the batch framing.
    let batch = |op: Op, from: usize| -> Command {
        let items = args.from(from + 1);
        let count = items.len();
        let mut payload = Vec::with_capacity(args.from(from + 1).map(|i| i.len() + 4).sum());
        for (index, item) in items.enumerate() {
            if let Err(e) = batch::encode_into(&mut payload, index, item) {
                return Command::Reply(Reply::err(e));
            }
        }
        on_filter(op, Shape::Bits { items: count }, payload.into())
    };
    // A copy: a view would keep the whole read buffer alive while the request waits.
    let single = |i: usize| Bytes::copy_from_slice(args.arg(i + 1));
    let checked = (|| -> Result<Command, Command> {
        Ok(match name.as_str() {
            "PING" => {
                arity(n <= 1)?;
                match n {
                    1 => Command::Reply(Reply::Bulk(single(0))),
                    _ => Command::Reply(Reply::Simple("PONG")),
                }
            }
            "ECHO" => {
                arity(n == 1)?;
                Command::Reply(Reply::Bulk(single(0)))
            }
            "QUIT" => Command::Quit,
            "AUTH" => {
                // `AUTH password` or `AUTH default password` (Redis 6 ACL form). Refusals are
                // Redis 7's, word for word.
                let refused = match n {
                    0 => Some(Reply::err("wrong number of arguments for 'auth' command")),
                    3.. => Some(Reply::err("syntax error")),
                    2 if arg(0) != b"default" => Some(Reply::Error(WRONGPASS.into())),
                    _ => None,
                };
                if let Some(refused) = refused {
                    return Ok(Command::AuthRefused(refused));
                }
                Command::Auth(single(n - 1))
            }
            // Client libraries send these on connecting; nothing in them matters here.
            "CLIENT"
                if n >= 1
                    && (arg(0).eq_ignore_ascii_case(b"SETNAME")
                        || arg(0).eq_ignore_ascii_case(b"SETINFO")) =>
            {
                Command::Reply(Reply::Simple("OK"))
            }
            "COMMAND" => Command::Reply(Reply::Array(Vec::new())),
            "HELLO" => match hello(args) {
                Ok(hello) => hello,
                // Answered as they are, authenticated or not, as Redis does.
                Err(refused) => Command::AuthRefused(refused),
            },
            "MULTI" => {
                arity(n == 0)?;
                Command::Multi
            }
            "EXEC" => {
                arity(n == 0)?;
                Command::Exec
            }
            "DISCARD" => {
                arity(n == 0)?;
                Command::Discard
            }
            // Optimistic locking cannot hold: a filter changes by replication at any moment.
            // Refused, so that no client believes its transaction was guarded.
            "WATCH" => Command::Reply(Reply::err(
                "WATCH is not supported: a crpf filter changes through replication at any \
                 moment, so no key can be watched",
            )),
            "UNWATCH" => Command::Reply(Reply::Simple("OK")),
            "SELECT" => {
                arity(n == 1)?;
                if arg(0) == b"0" {
                    Command::Reply(Reply::Simple("OK"))
                } else {
                    Command::Reply(Reply::err("DB index is out of range"))
                }
            }
            "BF.ADD" | "CF.ADD" => {
                arity(n == 2)?;
                on_filter(Op::Add, Shape::Added, single(1))
            }
            "BF.EXISTS" | "CF.EXISTS" => {
                arity(n == 2)?;
                on_filter(Op::Contains, Shape::Found, single(1))
            }
            "CF.DEL" => {
                arity(n == 2)?;
                on_filter(Op::Remove, Shape::Removed, single(1))
            }
            "CF.COUNT" => {
                arity(n == 2)?;
                on_filter(Op::Count, Shape::Count, single(1))
            }
            "BF.MADD" => {
                arity(n >= 2)?;
                batch(Op::MAdd, 1)
            }
            "BF.MEXISTS" | "CF.MEXISTS" => {
                arity(n >= 2)?;
                batch(Op::MContains, 1)
            }
            "CRPF.MDEL" => {
                arity(n >= 2)?;
                batch(Op::MRemove, 1)
            }
            "BF.INSERT" | "CF.INSERT" => {
                // Options (ignored) between the key and `ITEMS`.
                let items = (1..n).find(|&i| arg(i).eq_ignore_ascii_case(b"ITEMS"));
                arity(items.is_some_and(|i| i + 1 < n))?;
                batch(Op::MAdd, items.unwrap_or_default() + 1)
            }
            "CRPF.STATS" => {
                arity(n == 1)?;
                on_filter(Op::Stats, Shape::Json, Bytes::new())
            }
            "CRPF.ACK" => {
                arity(n == 1)?;
                match String::from_utf8_lossy(arg(0)).parse::<AckLevel>() {
                    Ok(level) => Command::SetAck(level),
                    Err(e) => Command::Reply(Reply::err(e)),
                }
            }
            "BF.RESERVE" => {
                arity((3..=6).contains(&n))?;
                match bf_reserve(args) {
                    Ok(spec) => Command::Key(KeyCommand::Reserve {
                        name: String::from_utf8_lossy(arg(0)).into_owned(),
                        spec,
                    }),
                    Err(refused) => Command::Reply(refused),
                }
            }
            "CF.RESERVE" => {
                arity(n >= 2 && n.is_multiple_of(2) && n <= 8)?;
                match cf_reserve(args) {
                    Ok(spec) => Command::Key(KeyCommand::Reserve {
                        name: String::from_utf8_lossy(arg(0)).into_owned(),
                        spec,
                    }),
                    Err(refused) => Command::Reply(refused),
                }
            }
            "DEL" | "UNLINK" => {
                arity(n >= 1)?;
                Command::Key(KeyCommand::Delete(
                    args.from(1)
                        .map(|k| String::from_utf8_lossy(k).into_owned())
                        .collect(),
                ))
            }
            "EXISTS" => {
                arity(n >= 1)?;
                Command::Key(KeyCommand::Exists(
                    args.from(1).map(<[u8]>::to_vec).collect(),
                ))
            }
            "TYPE" => {
                arity(n == 1)?;
                Command::Key(KeyCommand::Type(arg(0).to_vec()))
            }
            "DBSIZE" => {
                arity(n == 0)?;
                Command::Key(KeyCommand::DbSize)
            }
            "KEYS" => {
                arity(n == 1)?;
                Command::Key(KeyCommand::Keys {
                    pattern: arg(0).to_vec(),
                    scan: false,
                })
            }
            // One pass: every name at once, cursor 0 (a client iterating gets all of them in
            // its first call, which SCAN's contract allows).
            "SCAN" => {
                arity(n >= 1)?;
                let mut pattern = b"*".to_vec();
                let mut i = 1;
                while i < n {
                    let option = arg(i);
                    if i + 1 < n && option.eq_ignore_ascii_case(b"MATCH") {
                        pattern = arg(i + 1).to_vec();
                    } else if i + 1 < n
                        && (option.eq_ignore_ascii_case(b"COUNT")
                            || option.eq_ignore_ascii_case(b"TYPE"))
                    {
                        // A hint, and a type filter of which every key here is one of two.
                    } else {
                        return Err(Command::Reply(Reply::err("syntax error")));
                    }
                    i += 2;
                }
                Command::Key(KeyCommand::Keys {
                    pattern,
                    scan: true,
                })
            }
            _ => Command::Reply(Reply::err(format!(
                "unknown command '{}'",
                name.chars().take(64).collect::<String>()
            ))),
        })
    })();
    checked.unwrap_or_else(|refused| refused)
}

/// The crpf kind and spec of `BF.RESERVE key error_rate capacity [EXPANSION e] [NONSCALING]`,
/// with RedisBloom's refusals: a non-scaling filter is a `g_bloom`; a scaling one the
/// scalable kind whose FPR bound holds however rarely replicas sync (`writer_sc_g_bloom`).
fn bf_reserve(args: &Args) -> Result<crate::FilterSpec, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let text = |i: usize| std::str::from_utf8(arg(i)).unwrap_or("");
    let fpr: f64 = text(1).parse().map_err(|_| Reply::err("bad error rate"))?;
    if !(fpr > 0.0 && fpr < 1.0) {
        return Err(Reply::err(
            "error rate must be in the range (0.000000, 1.000000)",
        ));
    }
    let capacity: u64 = text(2).parse().map_err(|_| Reply::err("bad capacity"))?;
    if capacity == 0 {
        return Err(Reply::err("capacity must be in the range [1, 1073741824]"));
    }
    let (mut nonscaling, mut expansion) = (false, None);
    let mut i = 3;
    while i < n {
        if arg(i).eq_ignore_ascii_case(b"NONSCALING") {
            nonscaling = true;
            i += 1;
        } else if arg(i).eq_ignore_ascii_case(b"EXPANSION") {
            let e: u64 = match i + 1 < n {
                true => text(i + 1)
                    .parse()
                    .map_err(|_| Reply::err("bad expansion"))?,
                false => return Err(Reply::err("no expansion")),
            };
            expansion = Some(e);
            i += 2;
        } else {
            return Err(Reply::err("syntax error"));
        }
    }
    let scaling = match expansion {
        Some(0) => false,
        Some(_) if nonscaling => {
            return Err(Reply::Error("Nonscaling filters cannot expand".into()));
        }
        Some(SCALING_GROWTH) | None => !nonscaling,
        Some(_) => return Err(expansion_refused()),
    };
    let kind = if scaling {
        crate::FilterKind::WriterScGBloom
    } else {
        crate::FilterKind::GBloom
    };
    Ok(crate::FilterSpec::new(kind, capacity, fpr))
}

/// Each sub-filter of crpf's scalable kinds is this many times its predecessor's size.
const SCALING_GROWTH: u64 = 2;

fn expansion_refused() -> Reply {
    Reply::err(format!(
        "crpf's scalable filters grow by {SCALING_GROWTH}: EXPANSION {SCALING_GROWTH} (or 0: \
         not scaling) only"
    ))
}

/// The false positive rate of filters created by `CF.RESERVE`, which gives none.
const CF_RESERVE_FPR: f64 = 0.01;

/// The crpf kind and spec of `CF.RESERVE key capacity [BUCKETSIZE b] [MAXITERATIONS m]
/// [EXPANSION e]`: an `or_cuckoo` (removes as RedisBloom's `CF.DEL`), or with `EXPANSION 2`
/// its scalable kind `writer_sc_or_cuckoo`; bucket size and kicks are crpf's (4 and its
/// default), other values refused.
fn cf_reserve(args: &Args) -> Result<crate::FilterSpec, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let text = |i: usize| std::str::from_utf8(arg(i)).unwrap_or("");
    let capacity: u64 = text(1)
        .parse()
        .ok()
        .filter(|c| *c > 0)
        .ok_or_else(|| Reply::Error("Bad capacity".into()))?;
    let mut scaling = false;
    // Options come in pairs after the capacity (the arity checked that).
    let mut i = 2;
    while i < n {
        let value = text(i + 1);
        // crpf's bucket size and kick limit are fixed: only their own values pass.
        let fixed = |option: &str, fixed: u64, what: &str| -> Result<(), Reply> {
            let v: u64 = value
                .parse()
                .map_err(|_| Reply::Error(format!("Couldn't parse {option}")))?;
            if v == fixed {
                Ok(())
            } else {
                Err(Reply::err(format!(
                    "crpf's cuckoo filters {what} {fixed}: {option} {fixed} only"
                )))
            }
        };
        if arg(i).eq_ignore_ascii_case(b"BUCKETSIZE") {
            let size = crate::CuckooParams::DEFAULT_BUCKET_SIZE;
            fixed("BUCKETSIZE", size.into(), "have buckets of")?;
        } else if arg(i).eq_ignore_ascii_case(b"MAXITERATIONS") {
            let kicks = crate::CuckooParams::DEFAULT_MAX_KICKS;
            fixed("MAXITERATIONS", kicks.into(), "kick at most")?;
        } else if arg(i).eq_ignore_ascii_case(b"EXPANSION") {
            let e: u64 = value
                .parse()
                .map_err(|_| Reply::Error("Couldn't parse EXPANSION".into()))?;
            match e {
                0 => scaling = false,
                SCALING_GROWTH => scaling = true,
                _ => return Err(expansion_refused()),
            }
        } else {
            return Err(Reply::err("syntax error"));
        }
        i += 2;
    }
    let kind = if scaling {
        crate::FilterKind::WriterScOrCuckoo
    } else {
        crate::FilterKind::OrCuckoo
    };
    Ok(crate::FilterSpec::new(kind, capacity, CF_RESERVE_FPR))
}

/// Whether `name` matches the glob `pattern` (Redis's `KEYS`: `*`, `?`, `[...]`, `\`).
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_match(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && glob_match(rest, &name[1..]),
        Some((b'[', rest)) => {
            let Some(end) = rest.iter().position(|&c| c == b']') else {
                return name.first() == Some(&b'[') && glob_match(rest, &name[1..]);
            };
            let Some((&c, tail)) = name.split_first() else {
                return false;
            };
            let (negate, set) = match &rest[..end] {
                [b'^', set @ ..] => (true, set),
                set => (false, set),
            };
            let mut hit = false;
            let mut j = 0;
            while j < set.len() {
                if j + 2 < set.len() && set[j + 1] == b'-' {
                    hit |= (set[j]..=set[j + 2]).contains(&c);
                    j += 3;
                } else {
                    hit |= set[j] == c;
                    j += 1;
                }
            }
            hit != negate && glob_match(&rest[end + 1..], tail)
        }
        Some((b'\\', [escaped, rest @ ..])) => {
            name.first() == Some(escaped) && glob_match(rest, &name[1..])
        }
        Some((&c, rest)) => name.first() == Some(&c) && glob_match(rest, &name[1..]),
    }
}

/// RedisBloom's type name of a filter kind (`TYPE`).
pub fn type_name(kind: crate::FilterKind) -> &'static str {
    if is_bloom(kind) {
        "MBbloom--"
    } else {
        "MBbloomCF"
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`, with Redis 7's refusals.
fn hello(args: &Args) -> Result<Command, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let mut protocol = None;
    let mut password = None;
    let mut i = 0;
    if n >= 1 {
        protocol = Some(match arg(0) {
            b"2" => Protocol::Resp2,
            b"3" => Protocol::Resp3,
            v if std::str::from_utf8(v).is_ok_and(|v| v.parse::<i64>().is_ok()) => {
                return Err(Reply::Error("NOPROTO unsupported protocol version".into()));
            }
            _ => {
                return Err(Reply::err(
                    "Protocol version is not an integer or out of range",
                ));
            }
        });
        i = 1;
    }
    while i < n {
        let option = String::from_utf8_lossy(arg(i)).to_string();
        if option.eq_ignore_ascii_case("AUTH") && i + 2 < n {
            if arg(i + 1) != b"default" {
                return Err(Reply::Error(WRONGPASS.into()));
            }
            password = Some(Bytes::copy_from_slice(arg(i + 2)));
            i += 3;
        } else if option.eq_ignore_ascii_case("SETNAME") && i + 1 < n {
            i += 2;
        } else {
            return Err(Reply::err(format!(
                "Syntax error in HELLO option '{}'",
                option.chars().take(64).collect::<String>()
            )));
        }
    }
    Ok(Command::Hello { protocol, password })
}

/// Sends `request` to `handle`, a batch asking for a bitmap, an update with the connection's
/// acknowledgement level if it chose one; through the actor if `queued`
/// ([`ReplicaHandle::request_queued`]).
pub fn send(
    handle: &ReplicaHandle,
    request: &Request,
    ack: Option<AckLevel>,
    queued: bool,
) -> PendingResponse {
    let mut headers = None::<async_nats::HeaderMap>;
    if matches!(request.shape, Shape::Bits { .. }) {
        headers
            .get_or_insert_default()
            .insert(REPLY_HEADER, ReplyFormat::Bitmap.name());
    }
    if let Some(level) = ack
        && request.op.is_update()
    {
        headers
            .get_or_insert_default()
            .insert(ACK_HEADER, level.to_string());
    }
    let payload = request.payload.clone();
    if queued {
        handle.request_queued(request.op, payload, headers)
    } else {
        handle.request(request.op, payload, headers)
    }
}

/// The reply to a command whose request was answered with `response`.
pub fn reply(shape: Shape, response: &ApiResponse) -> Reply {
    if let Some(e) = response.error() {
        return Reply::err(e);
    }
    let body = &response.payload[..];
    let json = |field: &str| -> Option<serde_json::Value> {
        #[derive(Deserialize)]
        struct Object(serde_json::Map<String, serde_json::Value>);
        serde_json::from_slice::<Object>(body)
            .ok()
            .and_then(|mut o| o.0.remove(field))
    };
    let flag = |field: &str| json(field).and_then(|v| v.as_bool());
    let unexpected = || {
        Reply::err(format!(
            "unexpected answer: {}",
            String::from_utf8_lossy(body)
        ))
    };
    match shape {
        Shape::Added => Reply::Bool(true),
        // The answers of single queries are fixed texts: no JSON parse on the hot path.
        Shape::Found => match body {
            b"{\"contains\":true}" => Reply::Bool(true),
            b"{\"contains\":false}" => Reply::Bool(false),
            _ => flag("contains").map_or_else(unexpected, Reply::Bool),
        },
        Shape::Removed => flag("removed").map_or_else(unexpected, Reply::Bool),
        Shape::Count => json("count")
            .and_then(|v| v.as_i64())
            .map_or_else(unexpected, Reply::Int),
        Shape::Json => Reply::Bulk(response.payload.clone()),
        Shape::Bits { items } => {
            if !response.is_bitmap() {
                return unexpected();
            }
            if batch::check_bitmap(body, items).is_err() {
                return unexpected();
            }
            Reply::Bits {
                bitmap: response.payload.clone(),
                items,
                // A `madd` that refused some items says why once, for the first.
                refused: response
                    .headers
                    .get(ERROR_HEADER)
                    .map(|e| Box::new(Reply::err(e))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(r: &Reply) -> String {
        let mut out = BytesMut::new();
        r.encode(&mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn replies_encode_as_resp2() {
        assert_eq!(encoded(&Reply::Simple("PONG")), "+PONG\r\n");
        assert_eq!(encoded(&Reply::Int(-42)), ":-42\r\n");
        assert_eq!(
            encoded(&Reply::Bulk(Bytes::from_static(b"a\r\nb"))),
            "$4\r\na\r\nb\r\n"
        );
        assert_eq!(
            encoded(&Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(0),
                Reply::err("no\r\nway")
            ])),
            "*3\r\n:1\r\n:0\r\n-ERR no  way\r\n"
        );
    }

    #[test]
    fn resp3_has_booleans_maps_and_null_and_resp2_their_old_forms() {
        let reply = Reply::Array(vec![
            Reply::Bool(true),
            Reply::Bool(false),
            Reply::Map(vec![(
                Reply::Bulk(Bytes::from_static(b"proto")),
                Reply::Int(3),
            )]),
            Reply::Null,
        ]);
        let as_ = |p| {
            let mut out = BytesMut::new();
            reply.encode_as(&mut out, p);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(
            as_(Protocol::Resp3),
            "*4\r\n#t\r\n#f\r\n%1\r\n$5\r\nproto\r\n:3\r\n_\r\n"
        );
        assert_eq!(
            as_(Protocol::Resp2),
            "*4\r\n:1\r\n:0\r\n*2\r\n$5\r\nproto\r\n:3\r\n$-1\r\n"
        );
    }

    #[test]
    fn globs_match_as_redis_keys_does() {
        for (pattern, name, hit) in [
            ("*", "anything", true),
            ("t*", "tenant1", true),
            ("t*", "bloom", false),
            ("tenant?", "tenant1", true),
            ("tenant?", "tenant12", false),
            ("tenant[12]", "tenant2", true),
            ("tenant[^12]", "tenant2", false),
            ("tenant[a-c]", "tenantb", true),
            ("a\\*", "a*", true),
            ("a\\*", "ab", false),
            ("", "", true),
        ] {
            assert_eq!(
                glob_match(pattern.as_bytes(), name.as_bytes()),
                hit,
                "{pattern} {name}"
            );
        }
    }

    #[test]
    fn reserve_options_map_onto_crpf_kinds() {
        let spec = |ws: &[&str]| match command(&words(ws), no_filter) {
            Command::Key(KeyCommand::Reserve { spec, .. }) => spec,
            other => panic!("{ws:?} gave {other:?}"),
        };
        use crate::FilterKind as K;
        for (ws, kind) in [
            (&["BF.RESERVE", "k", "0.01", "100"][..], K::WriterScGBloom),
            (&["BF.RESERVE", "k", "0.01", "100", "NONSCALING"], K::GBloom),
            (
                &["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "0"],
                K::GBloom,
            ),
            (
                &["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "2"],
                K::WriterScGBloom,
            ),
            (&["CF.RESERVE", "k", "100"], K::OrCuckoo),
            (
                &["CF.RESERVE", "k", "100", "EXPANSION", "2"],
                K::WriterScOrCuckoo,
            ),
            (
                &["CF.RESERVE", "k", "100", "MAXITERATIONS", "500"],
                K::OrCuckoo,
            ),
        ] {
            let s = spec(ws);
            assert_eq!((s.kind, s.capacity), (kind, 100), "{ws:?}");
        }
        let nonscaling_expanding = [
            "BF.RESERVE",
            "k",
            "0.01",
            "100",
            "NONSCALING",
            "EXPANSION",
            "2",
        ];
        assert_eq!(
            refused(&nonscaling_expanding),
            "Nonscaling filters cannot expand"
        );
        assert!(refused(&["CF.RESERVE", "k", "100", "MAXITERATIONS", "20"]).contains("500"));
    }

    fn no_filter(_: &[u8]) -> Option<ReplicaHandle> {
        None
    }

    fn words(ws: &[&str]) -> Args {
        Args::of(ws)
    }

    fn refused(ws: &[&str]) -> String {
        match command(&words(ws), no_filter) {
            Command::Reply(Reply::Error(e)) | Command::AuthRefused(Reply::Error(e)) => e,
            other => panic!("{ws:?} gave {other:?}"),
        }
    }

    #[test]
    fn commands_are_checked_before_any_filter_sees_them() {
        assert!(
            refused(&["bf.add", "k"]).starts_with("ERR wrong number of arguments for 'bf.add'")
        );
        assert!(refused(&["CF.INSERT", "k", "CAPACITY", "10"]).starts_with("ERR wrong number"));
        assert!(refused(&["CF.INSERT", "k", "ITEMS"]).starts_with("ERR wrong number"));
        assert!(refused(&["BF.ADD", "nope", "x"]).starts_with("ERR no filter named `nope`"));
        assert!(refused(&["FLUSHALL"]).starts_with("ERR unknown command 'FLUSHALL'"));
        assert!(refused(&["CRPF.ACK", "eventually"]).starts_with("ERR"));
        assert!(refused(&["AUTH", "admin", "pw"]).starts_with("WRONGPASS"));
        // Answered as they are before login too (not NOAUTH), with Redis 7's words.
        for (ws, answer) in [
            (
                &["AUTH"][..],
                "ERR wrong number of arguments for 'auth' command",
            ),
            (&["AUTH", "a", "b", "c"], "ERR syntax error"),
            (&["AUTH", "admin", "pw"], WRONGPASS),
        ] {
            assert!(
                matches!(command(&words(ws), no_filter), Command::AuthRefused(Reply::Error(e)) if e == answer),
                "{ws:?}"
            );
        }
        assert_eq!(
            rejected_reason(&Reply::Error(refused(&["BF.ADD", "k"]))),
            Some("wrong_arity")
        );
        assert_eq!(
            rejected_reason(&Reply::Error(refused(&["X"]))),
            Some("unknown_command")
        );
        assert!(matches!(
            command(&words(&["ping"]), no_filter),
            Command::Reply(Reply::Simple("PONG"))
        ));
        assert!(matches!(
            command(&words(&["CRPF.ACK", "durable"]), no_filter),
            Command::SetAck(AckLevel::Durable)
        ));
        assert!(
            matches!(command(&words(&["AUTH", "default", "pw"]), no_filter), Command::Auth(p) if &p[..] == b"pw")
        );
    }

    fn response(payload: &'static [u8], headers: &[(&str, &str)]) -> ApiResponse {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, *v);
        }
        ApiResponse {
            headers: h,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn answers_read_as_redisbloom_replies() {
        let none: &[(&str, &str)] = &[];
        assert_eq!(
            reply(Shape::Found, &response(b"{\"contains\":true}", none)),
            Reply::Bool(true)
        );
        assert_eq!(
            reply(Shape::Found, &response(b"{ \"contains\" : false }", none)),
            Reply::Bool(false)
        );
        assert_eq!(
            reply(Shape::Removed, &response(b"{\"removed\":true}", none)),
            Reply::Bool(true)
        );
        assert_eq!(
            reply(Shape::Count, &response(b"{\"count\":7}", none)),
            Reply::Int(7)
        );
        let bitmap = [(REPLY_HEADER, "bitmap")];
        let bits = batch::encode_bitmap([true, false, true]);
        let bits: &'static [u8] = Box::leak(bits.into_boxed_slice());
        // A batch's answer encodes as the array of its results would.
        assert_eq!(
            encoded(&reply(Shape::Bits { items: 3 }, &response(bits, &bitmap))),
            encoded(&Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(1)
            ]))
        );
        let refused = [(REPLY_HEADER, "bitmap"), (ERROR_HEADER, "filter is full")];
        assert_eq!(
            encoded(&reply(Shape::Bits { items: 3 }, &response(bits, &refused))),
            encoded(&Reply::Array(vec![
                Reply::Int(1),
                Reply::err("filter is full"),
                Reply::Int(1)
            ]))
        );
        assert_eq!(
            encoded(&reply(Shape::Bits { items: 3 }, &response(bits, &refused))),
            "*3\r\n:1\r\n-ERR filter is full\r\n:1\r\n"
        );
        let failed = [(
            async_nats::service::NATS_SERVICE_ERROR,
            "invalid request: empty item",
        )];
        assert_eq!(
            reply(Shape::Added, &response(b"{\"error\":\"...\"}", &failed)),
            Reply::err("invalid request: empty item")
        );
        // A bitmap of the wrong length is not taken for an answer.
        assert!(matches!(
            reply(Shape::Bits { items: 30 }, &response(bits, &bitmap)),
            Reply::Error(_)
        ));
    }
}
