//! What each RESP command means for a crpf filter, and how the request API's answer reads as
//! a RESP reply. The key of every filter command is the filter's name: a filter of the node's
//! configuration, or of its filter catalog, which `BF.RESERVE`/`CF.RESERVE` and `DEL` change
//! ([`KeyCommand`]).
//!
//! | Command | Request API | Reply |
//! |---|---|---|
//! | `BF.ADD` *key item* | `add`, mode `report-new` | `1` if the item was new to this replica, else `0` |
//! | `CF.ADD` / `CF.ADDNX` *key item* | `add` / mode `if-absent` | `1` / `1` if added, `0` if it was there |
//! | `BF.MADD` *key item...*; `BF.INSERT`, `CF.INSERT`, `CF.INSERTNX` *key* \[options\] `ITEMS` *item...* | `madd` | an array as RedisBloom's ([`Inserted`]) |
//! | `BF.EXISTS`, `CF.EXISTS` *key item* | `contains` | `1` or `0` |
//! | `BF.MEXISTS`, `CF.MEXISTS` *key item...* | `mcontains` | an array of `1` and `0` |
//! | `CF.DEL` *key item* | `remove` | `1` if an occurrence was removed, else `0` |
//! | `CRPF.MDEL` *key item...* | `mremove` | an array of `1` and `0` |
//! | `CF.COUNT` *key item* | `count` | the multiplicity, or the entries matching (OR kinds) |
//! | `CRPF.STATS` *key* | `stats` | the stats JSON as a bulk string |
//! | `BF.INFO`, `BF.CARD`, `BF.DEBUG`, `CF.INFO`, `MEMORY USAGE` | (the replica's state, read directly) | [`super::redisbloom`] |
//! | `CRPF.IMPORT` *key format data* | (merged into the replica, the key created of the import's `m` and `k` if missing) | `OK`; *format* `bits-and-blooms` (Go's `WriteTo`) or `bits-and-blooms-json` (its `MarshalJSON`) |
//! | `CRPF.EXPORT` *key format* | (the replica's state, read directly) | the filter in that format, a bulk string |
//! | `CRPF.ACK` *level* | | `OK`: later updates of this connection wait for `local`, `logged`, `durable` or `replicated` (any [`AckLevel`] by name) |
//! | `HELLO` \[`2`\|`3` \[`AUTH default` *password*\] \[`SETNAME` *name*\]\] | | the server map; RESP3 after `HELLO 3` |
//! | `MULTI`, then commands, then `EXEC` or `DISCARD` | each queued command's | `QUEUED` each, then one array of their replies |
//!
//! In RESP3 the `1`/`0` of adds, queries and removes are booleans (`#t`/`#f`), as RedisBloom
//! sends them; counts stay integers. `EXEC` runs its commands one after the other, each
//! through its filter's actor or the catalog, while the connection runs nothing else; a
//! command refused while queueing (arity, unknown filter) aborts the transaction
//! (`EXECABORT`) before anything runs. `WATCH` is refused: a filter changes through
//! replication at any moment, so a watched key could never be trusted.
//!
//! As in RedisBloom, an add of the other family (`BF.ADD` on a cuckoo key) answers
//! `WRONGTYPE`, queries of a missing key (or one of the other family) answer `0`, and the
//! first add to a missing key creates it ([`KeyCommand::Create`]).

use bytes::Bytes;

use super::parse::Args;
use super::redisbloom;
use crate::api::batch;
use crate::api::{AddMode, Op, Response};
use crate::replica::{
    AckLevel, PendingResponse, ReplicaError, ReplicaHandle, error_of, header_text,
};

pub use super::reply::{Protocol, Reply};

/// How the answer of a batch add reads, by RedisBloom command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// `BF.MADD`, `BF.INSERT`: per item whether it was new, an error where it was refused.
    Bloom,
    /// `CF.INSERT`: `1` per item added, `-1` (RESP3 `false`) where the filter was full.
    Cuckoo,
    /// `CF.INSERTNX`: integers in both protocols, `1` added, `0` already there, `-1` full.
    CuckooNx,
}

pub use crate::api::Request;
use crate::api::Request as Api;

/// A command, checked: answered by the connection itself, or a request to a filter.
#[derive(Debug)]
pub enum Command {
    /// Answered at once.
    Reply(Reply),
    /// For the filter named by the key.
    Filter(ReplicaHandle, Request),
    /// `CRPF.ACK`: the level of this connection's later updates.
    SetAck(AckLevel),
    /// `AUTH`, with the password given, and whether a user name (`default`) came with it.
    Auth(Bytes, bool),
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
        /// The name given with `SETNAME`, if any.
        name: Option<Bytes>,
    },
    /// `MULTI`: queue the next commands until `EXEC` or `DISCARD`.
    Multi,
    /// `EXEC`: run the queued commands, their replies in one array.
    Exec,
    /// `DISCARD`: drop the queued commands.
    Discard,
    /// A command on the keys themselves: the filters the node hosts.
    Key(KeyCommand),
    /// `CLIENT ID`: the connection's id.
    ClientId,
    /// `CLIENT LIST [ID id...]`: the connections (all, or those with these ids).
    ClientList(Option<Vec<u64>>),
    /// `CLIENT INFO`: this connection, as `CLIENT LIST` shows it.
    ClientInfo,
    /// `CLIENT KILL`: close the connections this selects.
    ClientKill(ClientKill),
    /// `CLIENT SETNAME name`.
    ClientSetName(Bytes),
    /// `CLIENT GETNAME`.
    ClientGetName,
    /// `INFO [section...]`: the sections asked for (lower case), none for the default ones.
    Info(Vec<String>),
    /// `MONITOR`: stream the commands served.
    Monitor,
    /// `SLOWLOG GET [count]` (`-1`: all), `LEN`, `RESET`.
    SlowLog(SlowLog),
}

/// What `SLOWLOG` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowLog {
    /// `GET [count]`: the newest entries (10 by default; `-1`: all).
    Get(i64),
    /// `LEN`.
    Len,
    /// `RESET`.
    Reset,
}

/// Which connections `CLIENT KILL` closes: those matching every filter given.
#[derive(Debug, Default)]
pub struct ClientKill {
    /// `ID id`.
    pub id: Option<u64>,
    /// `ADDR ip:port` (or the old form's only argument).
    pub addr: Option<String>,
    /// `LADDR ip:port`.
    pub laddr: Option<String>,
    /// `SKIPME no`: the caller too (by default it is skipped).
    pub skip_me: bool,
    /// The old form (`CLIENT KILL ip:port`): answers `OK` or an error, not a count.
    pub old_form: bool,
}

/// Parses `CLIENT KILL`'s arguments (after `KILL`).
fn client_kill(args: &Args) -> Result<ClientKill, Reply> {
    let n = args.len() - 2;
    if n == 1 {
        return Ok(ClientKill {
            addr: Some(String::from_utf8_lossy(args.arg(2)).into_owned()),
            skip_me: false,
            old_form: true,
            ..Default::default()
        });
    }
    if n == 0 || !n.is_multiple_of(2) {
        return Err(Reply::err("syntax error"));
    }
    let mut kill = ClientKill {
        skip_me: true,
        ..Default::default()
    };
    for i in (2..args.len()).step_by(2) {
        let value = String::from_utf8_lossy(args.arg(i + 1)).into_owned();
        match args.arg(i).to_ascii_uppercase().as_slice() {
            b"ID" => {
                kill.id = Some(
                    value
                        .parse()
                        .map_err(|_| Reply::err("client-id should be greater than 0"))?,
                )
            }
            b"ADDR" => kill.addr = Some(value),
            b"LADDR" => kill.laddr = Some(value),
            b"SKIPME" => match value.to_ascii_lowercase().as_str() {
                "yes" => kill.skip_me = true,
                "no" => kill.skip_me = false,
                _ => return Err(Reply::err("syntax error")),
            },
            _ => return Err(Reply::err("syntax error")),
        }
    }
    Ok(kill)
}

/// Commands on keys (filters), answered with the node's filter catalog
/// ([`super::Keyspace`]).
#[derive(Debug)]
pub enum KeyCommand {
    /// `BF.RESERVE` / `CF.RESERVE`: create a filter of this spec.
    Reserve {
        /// The key.
        name: String,
        /// What it becomes.
        spec: crate::FilterSpec,
    },
    /// The first add to a key that does not exist: create it of `spec`, then send
    /// `request` to it.
    Create {
        /// The key.
        name: String,
        /// What it becomes.
        spec: crate::FilterSpec,
        /// The command's family: `BF.*` (else `CF.*`), for `WRONGTYPE` should another
        /// connection have created the key as the other family first.
        bloom: bool,
        /// The add.
        request: Box<Request>,
    },
    /// A command on a key that did not exist when it was parsed: sent to the key's filter if
    /// there is one when it runs (a `MULTI` that reserved it before), else answered `missing`.
    IfFound {
        /// The key's subject name.
        name: String,
        /// The command's family (`Some(true)`: `BF.*`, `Some(false)`: `CF.*`, `None`: crpf's
        /// own), for `WRONGTYPE` and for queries of the other family, which read a missing key.
        family: Option<bool>,
        /// The request.
        request: Box<Request>,
        /// The answer for a missing key.
        missing: Reply,
    },
    /// `DEL` / `UNLINK`: drop these filters; the reply counts those dropped.
    Delete(Vec<String>),
    /// A count-min sketch command ([`super::cms`]).
    Cms(super::cms::CmsCommand),
    /// A top-k command ([`super::topk`]).
    Topk(super::topk::TopkCommand),
    /// A t-digest command ([`super::tdigest`]).
    Tdigest(super::tdigest::TdigestCommand),
    /// `FLUSHDB` / `FLUSHALL`: drop every filter.
    FlushAll,
    /// A read of a key's figures, when its turn comes (after the connection's updates before
    /// it, and inside `EXEC` when `EXEC` runs).
    Read {
        /// The key's subject name.
        name: String,
        /// What is read.
        read: Read,
        /// The command's family: `BF.*` (`Some(true)`), `CF.*`, or neither.
        bloom: Option<bool>,
    },
    /// `BF.SCANDUMP` / `CF.SCANDUMP key iterator` ([`super::dump`]).
    ScanDump {
        /// The key.
        name: String,
        /// The iterator: 0 to start.
        iter: i64,
    },
    /// `BF.LOADCHUNK` / `CF.LOADCHUNK key iterator data` ([`super::dump`]).
    LoadChunk {
        /// The key.
        name: String,
        /// The iterator `SCANDUMP` gave with the data.
        iter: i64,
        /// The data.
        data: Bytes,
        /// The command's family: `BF.*` (else `CF.*`).
        bloom: bool,
    },
    /// `CRPF.IMPORT key format data`: a filter in another library's format merged into the
    /// key, created of its parameters if it does not exist ([`crate::replica::interop`]).
    Import {
        /// The key.
        name: String,
        /// The format of `data`.
        format: crate::GoFormat,
        /// The filter.
        data: Bytes,
    },
    /// `CRPF.EXPORT key format`: the key's filter in another library's format.
    Export {
        /// The key.
        name: String,
        /// The format.
        format: crate::GoFormat,
    },
    /// `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT key time [NX|XX|GT|LT]`: sets the key's
    /// expiry, computed when it runs.
    Expire {
        /// The key.
        name: String,
        /// The time: milliseconds from now, or since the epoch if `absolute`.
        ms: i64,
        /// `EXPIREAT`, `PEXPIREAT`.
        absolute: bool,
        /// The condition.
        when: ExpireWhen,
        /// The command's name, lower case, for Redis's refusal of a time out of range.
        command: &'static str,
    },
    /// `PERSIST key`: clears its expiry.
    Persist(String),
    /// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME key`.
    Ttl {
        /// The key.
        name: String,
        /// In milliseconds (else seconds, rounded).
        ms: bool,
        /// The time of expiry since the epoch (else the time left).
        absolute: bool,
    },
    /// `EXISTS`: how many of these keys exist (a key named twice counts twice).
    Exists(Vec<String>),
    /// `TYPE`: RedisBloom's type name of the key, or `none`.
    Type(String),
    /// `DBSIZE`: how many filters.
    DbSize,
    /// `RANDOMKEY`: a filter's name, picked at random (nil if none).
    RandomKey,
    /// `KEYS pattern`, `SCAN cursor [MATCH pattern] [TYPE type]`: the names matching a glob
    /// pattern.
    Keys {
        /// The pattern (`*` for `SCAN` without `MATCH`).
        pattern: Vec<u8>,
        /// Answer as `SCAN` does: cursor `0` and the names.
        scan: bool,
        /// Only keys of this type (`SCAN ... TYPE`).
        kind: Option<Vec<u8>>,
    },
}

/// The condition of an `EXPIRE` (Redis 7's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpireWhen {
    /// Always.
    #[default]
    Always,
    /// `NX`: only if the key has no expiry.
    Nx,
    /// `XX`: only if it has one.
    Xx,
    /// `GT`: only to a later time (no expiry is the latest of all).
    Gt,
    /// `LT`: only to an earlier one.
    Lt,
}

impl ExpireWhen {
    /// Whether an expiry at `new` may replace `current` (`None`: none).
    pub fn allows(self, current: Option<u64>, new: i128) -> bool {
        match (self, current) {
            (ExpireWhen::Always, _) => true,
            (ExpireWhen::Nx, c) => c.is_none(),
            (ExpireWhen::Xx, c) => c.is_some(),
            (ExpireWhen::Gt, None) => false,
            (ExpireWhen::Gt, Some(c)) => new > i128::from(c),
            (ExpireWhen::Lt, None) => true,
            (ExpireWhen::Lt, Some(c)) => new < i128::from(c),
        }
    }
}

/// The options of an `EXPIRE` after the time, with Redis 7's refusals.
fn expire_when(options: &[&[u8]]) -> Result<ExpireWhen, Reply> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for o in options {
        match o.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => {
                return Err(Reply::err(format!(
                    "Unsupported option {}",
                    String::from_utf8_lossy(o)
                )));
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::err(
            "NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(Reply::err(
            "GT and LT options at the same time are not compatible",
        ));
    }
    Ok(if nx {
        ExpireWhen::Nx
    } else if gt {
        ExpireWhen::Gt
    } else if lt {
        ExpireWhen::Lt
    } else if xx {
        ExpireWhen::Xx
    } else {
        ExpireWhen::Always
    })
}

/// What [`KeyCommand::Read`] reads.
#[derive(Debug, Clone, Copy)]
pub enum Read {
    /// `BF.CARD`.
    Card,
    /// `BF.INFO` and a field, if one.
    BfInfo(Option<redisbloom::BfField>),
    /// `CF.INFO`.
    CfInfo,
    /// `BF.DEBUG`.
    BfDebug,
    /// `CF.COMPACT` (nothing to compact: `OK` for a cuckoo key).
    Compact,
    /// `MEMORY USAGE`.
    Memory,
}

/// Redis's answer to a command on a key of another type.
pub(crate) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

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
pub fn command(args: &Args, filter: impl Fn(&str) -> Option<ReplicaHandle>) -> Command {
    command_with(args, filter, |_, _| None)
}

/// [`command`], a query (`BF.EXISTS`, `BF.MEXISTS`, `CF.EXISTS`, `CF.MEXISTS`, `CF.COUNT`)
/// for a filter that `parked` answers from its kept state answered at once, its replica
/// left parked: what it would answer (a parked state changes only by resuming).
pub fn command_with(
    args: &Args,
    filter: impl Fn(&str) -> Option<ReplicaHandle>,
    parked: impl Fn(&str, &Request) -> Option<super::ParkedAnswer>,
) -> Command {
    if args.is_empty() {
        // An empty command: Redis answers nothing, but a reply keeps replies and requests
        // paired for the client.
        return Command::Reply(Reply::err("empty command"));
    }
    // Upper-cased on the stack: no allocation for the name of every command.
    let mut upper = [0u8; 32];
    let raw = args.arg(0);
    let owned;
    let name: &str = match raw.len() <= upper.len() && raw.is_ascii() {
        true => {
            let upper = &mut upper[..raw.len()];
            upper.copy_from_slice(raw);
            upper.make_ascii_uppercase();
            // SAFETY: checked ASCII just above, and upper-casing keeps it ASCII.
            unsafe { std::str::from_utf8_unchecked(upper) }
        }
        false => {
            owned = String::from_utf8_lossy(raw).to_ascii_uppercase();
            &owned
        }
    };
    // Arguments after the name.
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let wrong_arity = || {
        Command::Reply(Reply::err(format!(
            "wrong number of arguments for '{}' command",
            name.to_ascii_lowercase()
        )))
    };
    let arity = |ok: bool| -> Result<(), Command> { if ok { Ok(()) } else { Err(wrong_arity()) } };
    // RedisBloom's families: a BF command on a cuckoo key (or a CF command on a Bloom key) is
    // WRONGTYPE; queries of a missing key answer "not there", as RedisBloom's do.
    let family = if name.starts_with("BF.") {
        Some(true)
    } else if name.starts_with("CF.") {
        Some(false)
    } else {
        None
    };
    // The key's subject name ([`crate::names`]): what filters are found and made by.
    let key = |i: usize| crate::names::subject_name(arg(i));
    let key_name = || key(0).into_owned();
    // The key's filter, checked against the command's family; Err: the reply to a key that
    // exists with the wrong type; Ok(None): no such key.
    let existing = || -> Result<Option<ReplicaHandle>, Command> {
        match filter(&key(0)) {
            Some(handle)
                if family.is_some_and(|bloom| !super::cms::in_family(handle.kind(), bloom)) =>
            {
                Err(Command::Reply(Reply::Error(WRONGTYPE.into())))
            }
            found => Ok(found),
        }
    };
    // A request for the key's filter; `create`: the spec of the key if the command creates
    // it.
    let on_filter = |request: Request, create: Option<crate::FilterSpec>| -> Command {
        let query = matches!(request.op(), Op::Contains | Op::MContains | Op::Count);
        // A key of the other family is looked up below, as a running one is.
        if query
            && let Some((kind, answer)) = parked(&key(0), &request)
            && family.is_none_or(|bloom| super::cms::in_family(kind, bloom))
        {
            return Command::Reply(reply(request.op(), answer));
        }
        match existing() {
            Ok(Some(handle)) => return Command::Filter(handle, request),
            Ok(None) => {}
            // RedisBloom's queries read a key of the other family as a missing one, and so
            // does `CF.DEL`; its adds answer WRONGTYPE.
            Err(_) if query || request.op() == Op::Remove => {}
            Err(wrong) => return wrong,
        }
        if let Some(spec) = create {
            // Refused before the key is made: an add the replica would refuse must not leave
            // a new key behind (options never have empty values that got this far).
            if args.from(2).any(<[u8]>::is_empty) {
                return Command::Reply(Reply::err("invalid request: empty item"));
            }
            return Command::Key(KeyCommand::Create {
                name: key_name(),
                spec,
                bloom: family == Some(true),
                request: Box::new(request),
            });
        }
        let missing = match (family, request.op()) {
            (Some(_), Op::Count) => Reply::Int(0),
            (Some(_), Op::Contains) => Reply::Bool(false),
            (Some(_), Op::MContains) => Reply::Array(vec![Reply::Bool(false); n - 1]),
            (Some(_), Op::Remove) => Reply::Error("Not found".into()),
            // `NOCREATE`.
            (Some(_), _) => Reply::err("not found"),
            (None, _) => {
                let key = arg(0);
                Reply::err(format!(
                    "no filter named `{}` on this node",
                    String::from_utf8_lossy(&key[..key.len().min(64)])
                ))
            }
        };
        // Looked up again when it runs: in a `MULTI`, a `RESERVE` queued before it may have
        // made the key (its queries answered as for a missing key).
        Command::Key(KeyCommand::IfFound {
            name: key_name(),
            family,
            request: Box::new(request),
            missing,
        })
    };
    // Argument `i` (counted after the name), and the items from argument `from` on: views
    // of the request's buffer (copied if the request waits, see `Request::compact`).
    let item = |i: usize| args.bytes(i + 1);
    let items = |from: usize| args.items(from + 1);
    let add = |mode: AddMode| Api::Add {
        item: item(1),
        mode,
        ack: None,
    };
    let madd = |from: usize, mode: AddMode| Api::MAdd {
        items: items(from),
        mode,
        ack: None,
    };
    // A copy: a view would keep the whole read buffer alive while the request waits.
    let single = |i: usize| Bytes::copy_from_slice(args.arg(i + 1));
    let reserve = |spec: Result<crate::FilterSpec, Reply>| match spec {
        Ok(spec) => Command::Key(KeyCommand::Reserve {
            name: key_name(),
            spec,
        }),
        Err(refused) => Command::Reply(refused),
    };
    // An insert's options; Err: their refusal.
    let insert_options = |parsed: Result<redisbloom::Insert, redisbloom::Refused>| match parsed {
        Ok(insert) => Ok(insert),
        Err(redisbloom::Refused::Arity) => Err(wrong_arity()),
        Err(redisbloom::Refused::Reply(reply)) => Err(Command::Reply(reply)),
    };
    // A read of the key's figures, at its turn among this connection's commands.
    let read = |read: Read| {
        Command::Key(KeyCommand::Read {
            name: key_name(),
            read,
            bloom: family,
        })
    };
    let checked = (|| -> Result<Command, Command> {
        Ok(match name {
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
                Command::Auth(single(n - 1), n == 2)
            }
            "CLIENT" => {
                arity(n >= 1)?;
                let sub = arg(0).to_ascii_uppercase();
                match sub.as_slice() {
                    b"ID" => {
                        arity(n == 1)?;
                        Command::ClientId
                    }
                    // Client libraries send these on connecting; nothing in them matters here.
                    b"SETNAME" => {
                        arity(n == 2)?;
                        Command::ClientSetName(single(1))
                    }
                    b"SETINFO" | b"NO-EVICT" | b"NO-TOUCH" | b"REPLY" => {
                        Command::Reply(Reply::Simple("OK"))
                    }
                    b"GETNAME" => Command::ClientGetName,
                    b"LIST" => {
                        if n == 1 {
                            Command::ClientList(None)
                        } else if n >= 3 && arg(1).eq_ignore_ascii_case(b"ID") {
                            let ids: Result<Vec<u64>, _> = args
                                .from(3)
                                .map(|id| String::from_utf8_lossy(id).parse::<u64>())
                                .collect();
                            match ids {
                                Ok(ids) => Command::ClientList(Some(ids)),
                                Err(_) => Command::Reply(Reply::err("Invalid client ID")),
                            }
                        } else {
                            Command::Reply(Reply::err("syntax error"))
                        }
                    }
                    b"INFO" => {
                        arity(n == 1)?;
                        Command::ClientInfo
                    }
                    b"KILL" => match client_kill(args) {
                        Ok(kill) => Command::ClientKill(kill),
                        Err(refused) => Command::Reply(refused),
                    },
                    b"HELP" => Command::Reply(super::introspect::client_help()),
                    _ => Command::Reply(Reply::err(format!(
                        "unknown subcommand '{}'. Try CLIENT HELP.",
                        String::from_utf8_lossy(&sub[..sub.len().min(64)])
                    ))),
                }
            }
            "COMMAND" => Command::Reply(super::introspect::command(args)),
            // Every node takes writes: to a client it is a master without Redis replicas
            // (filters replicate among nodes over NATS).
            "ROLE" => {
                arity(n == 0)?;
                Command::Reply(Reply::Array(vec![
                    Reply::Bulk(Bytes::from_static(b"master")),
                    Reply::Int(0),
                    Reply::Array(Vec::new()),
                ]))
            }
            "TIME" => {
                arity(n == 0)?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                Command::Reply(Reply::Array(vec![
                    Reply::Bulk(Bytes::from(now.as_secs().to_string())),
                    Reply::Bulk(Bytes::from(now.subsec_micros().to_string())),
                ]))
            }
            "MODULE" => {
                arity(n >= 1)?;
                if arg(0).eq_ignore_ascii_case(b"LIST") {
                    arity(n == 1)?;
                    Command::Reply(Reply::Array(vec![super::introspect::bf_module()]))
                } else {
                    Command::Reply(Reply::err(
                        "MODULE LOAD/UNLOAD are not supported: crpf's commands are built in",
                    ))
                }
            }
            "RANDOMKEY" => {
                arity(n == 0)?;
                Command::Key(KeyCommand::RandomKey)
            }
            // Tools (redis-benchmark, redis-cli) read settings at start; none is Redis's here,
            // and none is set over RESP (the node's configuration file holds them).
            "CONFIG" => {
                arity(n >= 1)?;
                if arg(0).eq_ignore_ascii_case(b"GET") {
                    arity(n >= 2)?;
                    // The two that tools ask about: crpf keeps no RDB file and no AOF (its
                    // durability is the filters' `ack` and write-ahead log).
                    const KNOWN: [(&str, &str); 2] = [("save", ""), ("appendonly", "no")];
                    let text = |s: &str| Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()));
                    Command::Reply(Reply::Map(
                        KNOWN
                            .iter()
                            .filter(|(k, _)| {
                                args.from(2)
                                    .any(|p| glob_match(&p.to_ascii_lowercase(), k.as_bytes()))
                            })
                            .map(|(k, v)| (text(k), text(v)))
                            .collect(),
                    ))
                } else {
                    Command::Reply(Reply::err(
                        "CONFIG SET/RESETSTAT/REWRITE are not supported: crpf's settings live in \
                         the node's configuration file",
                    ))
                }
            }
            "MONITOR" => {
                arity(n == 0)?;
                Command::Monitor
            }
            "SLOWLOG" => {
                arity(n >= 1)?;
                let sub = arg(0).to_ascii_uppercase();
                let sub_arity = |ok: bool| -> Result<(), Command> {
                    if ok {
                        Ok(())
                    } else {
                        Err(Command::Reply(Reply::err(format!(
                            "wrong number of arguments for 'slowlog|{}' command",
                            String::from_utf8_lossy(&sub).to_ascii_lowercase()
                        ))))
                    }
                };
                match sub.as_slice() {
                    b"GET" => {
                        if n > 2 {
                            return Err(Command::Reply(Reply::err(format!(
                                "unknown subcommand or wrong number of arguments for '{}'. Try SLOWLOG HELP.",
                                String::from_utf8_lossy(arg(0))
                            ))));
                        }
                        let count = match n {
                            1 => 10,
                            _ => match std::str::from_utf8(arg(1)).map(str::parse::<i64>) {
                                Ok(Ok(c)) if c >= -1 => c,
                                _ => {
                                    return Err(Command::Reply(Reply::err(
                                        "count should be greater than or equal to -1",
                                    )));
                                }
                            },
                        };
                        Command::SlowLog(SlowLog::Get(count))
                    }
                    b"LEN" => {
                        sub_arity(n == 1)?;
                        Command::SlowLog(SlowLog::Len)
                    }
                    b"RESET" => {
                        sub_arity(n == 1)?;
                        Command::SlowLog(SlowLog::Reset)
                    }
                    _ => Command::Reply(Reply::err(format!(
                        "unknown subcommand '{}'. Try SLOWLOG HELP.",
                        String::from_utf8_lossy(&arg(0)[..arg(0).len().min(64)])
                    ))),
                }
            }
            "INFO" => Command::Info(
                args.from(1)
                    .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
                    .collect(),
            ),
            "MEMORY" => {
                arity(n >= 1)?;
                if !arg(0).eq_ignore_ascii_case(b"USAGE") {
                    return Err(Command::Reply(Reply::err(format!(
                        "unknown subcommand '{}'. Try MEMORY HELP.",
                        String::from_utf8_lossy(&arg(0)[..arg(0).len().min(64)])
                    ))));
                }
                // `SAMPLES n` is a hint for aggregate types; a filter is measured whole.
                if n != 2 && n != 4 {
                    return Err(Command::Reply(Reply::err(
                        "wrong number of arguments for 'memory|usage' command",
                    )));
                }
                Command::Key(KeyCommand::Read {
                    name: key(1).into_owned(),
                    read: Read::Memory,
                    bloom: None,
                })
            }
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
                if n != 0 {
                    // Redis discards the transaction, if any, and says so.
                    return Ok(Command::Reply(Reply::Error(
                        "EXECABORT Transaction discarded because of: wrong number of arguments \
                         for 'exec' command"
                            .into(),
                    )));
                }
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
                match std::str::from_utf8(arg(0)).map(str::parse::<i32>) {
                    Ok(Ok(0)) => Command::Reply(Reply::Simple("OK")),
                    Ok(Ok(_)) => Command::Reply(Reply::err("DB index is out of range")),
                    _ => Command::Reply(Reply::err("value is not an integer or out of range")),
                }
            }
            "BF.ADD" => {
                arity(n == 2)?;
                let add = add(AddMode::ReportNew);
                on_filter(add, Some(redisbloom::bf_default()))
            }
            "CF.ADD" | "CF.ADDNX" => {
                arity(n == 2)?;
                let add = if name == "CF.ADD" {
                    add(AddMode::Always)
                } else {
                    add(AddMode::IfAbsent)
                };
                on_filter(add, Some(redisbloom::cf_default()))
            }
            "BF.EXISTS" | "CF.EXISTS" => {
                arity(n == 2)?;
                let query = Api::Contains { item: item(1) };
                on_filter(query, None)
            }
            "CF.DEL" => {
                arity(n == 2)?;
                let remove = Api::Remove {
                    item: item(1),
                    ack: None,
                };
                on_filter(remove, None)
            }
            "CF.COUNT" => {
                arity(n == 2)?;
                on_filter(Api::Count { item: item(1) }, None)
            }
            "BF.MADD" => {
                arity(n >= 2)?;
                let add = madd(1, AddMode::ReportNew);
                on_filter(add, Some(redisbloom::bf_default()))
            }
            "BF.MEXISTS" | "CF.MEXISTS" => {
                arity(n >= 2)?;
                let query = Api::MContains { items: items(1) };
                on_filter(query, None)
            }
            "CRPF.MDEL" => {
                arity(n >= 2)?;
                let items = items(1);
                let remove = Api::MRemove { items, ack: None };
                on_filter(remove, None)
            }
            "BF.INSERT" => {
                arity(n >= 3)?;
                let insert = insert_options(redisbloom::bf_insert(args))?;
                let from = insert.items_from;
                let add = madd(from, AddMode::ReportNew);
                on_filter(add, insert.create)
            }
            "CF.INSERT" | "CF.INSERTNX" => {
                arity(n >= 3)?;
                let insert = insert_options(redisbloom::cf_insert(args))?;
                let from = insert.items_from;
                let mode = if name == "CF.INSERT" {
                    AddMode::Always
                } else {
                    AddMode::IfAbsent
                };
                let add = madd(from, mode);
                on_filter(add, insert.create)
            }
            "BF.CARD" => {
                arity(n == 1)?;
                read(Read::Card)
            }
            "BF.INFO" => {
                arity(n == 1 || n == 2)?;
                let field = match n {
                    2 => Some(redisbloom::BfField::parse(arg(1)).ok_or_else(|| {
                        Command::Reply(Reply::Error("Invalid information value".into()))
                    })?),
                    _ => None,
                };
                read(Read::BfInfo(field))
            }
            "CF.INFO" => {
                arity(n == 1)?;
                read(Read::CfInfo)
            }
            "BF.DEBUG" => {
                arity(n == 1)?;
                read(Read::BfDebug)
            }
            "BF.SCANDUMP" | "CF.SCANDUMP" => {
                arity(n == 2)?;
                let bloom = family == Some(true);
                let iter = std::str::from_utf8(arg(1))
                    .ok()
                    .and_then(|i| i.parse::<i64>().ok());
                // RedisBloom's order: a Bloom dump looks at the key first, a cuckoo dump at
                // the position; a negative Bloom iterator is past the end.
                let key = if bloom { Some(existing()?) } else { None };
                let iter = match iter {
                    Some(i) if i < 0 && bloom && key.as_ref().is_some_and(Option::is_some) => {
                        return Ok(Command::Reply(Reply::Array(vec![
                            Reply::Int(0),
                            Reply::Bulk(Bytes::new()),
                        ])));
                    }
                    Some(i) if i >= 0 || bloom => i,
                    _ if bloom && key.as_ref().is_some_and(Option::is_none) => {
                        return Ok(Command::Reply(Reply::err("not found")));
                    }
                    _ => {
                        return Err(Command::Reply(Reply::Error(
                            if bloom {
                                "Second argument must be numeric"
                            } else {
                                "Invalid position"
                            }
                            .into(),
                        )));
                    }
                };
                match key.map_or_else(existing, Ok)? {
                    Some(_) => Command::Key(KeyCommand::ScanDump {
                        name: key_name(),
                        iter,
                    }),
                    None => Command::Reply(Reply::err("not found")),
                }
            }
            "BF.LOADCHUNK" | "CF.LOADCHUNK" => {
                arity(n == 3)?;
                let iter = std::str::from_utf8(arg(1))
                    .ok()
                    .and_then(|i| i.parse::<i64>().ok())
                    .filter(|i| *i != 0 || family == Some(true));
                let Some(iter) = iter else {
                    return Err(Command::Reply(if family == Some(true) {
                        Reply::err("Second argument must be numeric")
                    } else {
                        Reply::Error("Invalid position".into())
                    }));
                };
                existing()?;
                Command::Key(KeyCommand::LoadChunk {
                    name: key_name(),
                    iter,
                    data: single(2),
                    bloom: family == Some(true),
                })
            }
            // crpf's cuckoo filters keep no deleted slots to compact.
            "CF.COMPACT" => {
                arity(n == 1)?;
                read(Read::Compact)
            }
            "CRPF.STATS" => {
                arity(n == 1)?;
                let stats = Api::Stats;
                on_filter(stats, None)
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
                reserve(redisbloom::bf_reserve(args))
            }
            "CF.RESERVE" => {
                arity(n >= 2 && n.is_multiple_of(2) && n <= 8)?;
                reserve(redisbloom::cf_reserve(args))
            }
            "CRPF.RESERVE" => {
                arity(n >= 4)?;
                reserve(redisbloom::crpf_reserve(args))
            }
            "CRPF.IMPORT" | "CRPF.EXPORT" => {
                let import = name == "CRPF.IMPORT";
                arity(n == if import { 3 } else { 2 })?;
                let format = match String::from_utf8_lossy(arg(1)).parse::<crate::GoFormat>() {
                    Ok(format) => format,
                    Err(e) => return Err(Command::Reply(Reply::err(e))),
                };
                Command::Key(if import {
                    KeyCommand::Import {
                        name: key_name(),
                        format,
                        data: single(2),
                    }
                } else {
                    KeyCommand::Export {
                        name: key_name(),
                        format,
                    }
                })
            }
            "DEL" | "UNLINK" => {
                arity(n >= 1)?;
                Command::Key(KeyCommand::Delete(
                    args.from(1)
                        .map(|k| crate::names::subject_name(k).into_owned())
                        .collect(),
                ))
            }
            "FLUSHDB" | "FLUSHALL" => {
                if n > 1
                    || n == 1
                        && !arg(0).eq_ignore_ascii_case(b"ASYNC")
                        && !arg(0).eq_ignore_ascii_case(b"SYNC")
                {
                    return Err(Command::Reply(Reply::err("syntax error")));
                }
                Command::Key(KeyCommand::FlushAll)
            }
            "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => {
                arity(n >= 2)?;
                let Some(time) = std::str::from_utf8(arg(1))
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                else {
                    return Err(Command::Reply(Reply::err(
                        "value is not an integer or out of range",
                    )));
                };
                let options: Vec<&[u8]> = (2..n).map(arg).collect();
                let when = expire_when(&options).map_err(Command::Reply)?;
                let (seconds, absolute, command) = match name {
                    "EXPIRE" => (true, false, "expire"),
                    "PEXPIRE" => (false, false, "pexpire"),
                    "EXPIREAT" => (true, true, "expireat"),
                    _ => (false, true, "pexpireat"),
                };
                let ms = if seconds {
                    time.checked_mul(1000)
                } else {
                    Some(time)
                };
                let Some(ms) = ms else {
                    return Err(Command::Reply(Reply::err(format!(
                        "invalid expire time in '{command}' command"
                    ))));
                };
                Command::Key(KeyCommand::Expire {
                    name: key_name(),
                    ms,
                    absolute,
                    when,
                    command,
                })
            }
            "PERSIST" => {
                arity(n == 1)?;
                Command::Key(KeyCommand::Persist(key_name()))
            }
            "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => {
                arity(n == 1)?;
                Command::Key(KeyCommand::Ttl {
                    name: key_name(),
                    ms: name.starts_with('P'),
                    absolute: name.ends_with("TIME"),
                })
            }
            "EXISTS" => {
                arity(n >= 1)?;
                Command::Key(KeyCommand::Exists(
                    args.from(1)
                        .map(|k| crate::names::subject_name(k).into_owned())
                        .collect(),
                ))
            }
            "TYPE" => {
                arity(n == 1)?;
                Command::Key(KeyCommand::Type(key_name()))
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
                    kind: None,
                })
            }
            // One pass: every name at once, cursor 0 (a client iterating gets all of them in
            // its first call, which SCAN's contract allows).
            "SCAN" => {
                arity(n >= 1)?;
                if !std::str::from_utf8(arg(0)).is_ok_and(|c| c.parse::<u64>().is_ok()) {
                    return Err(Command::Reply(Reply::err("invalid cursor")));
                }
                let mut pattern = b"*".to_vec();
                let mut kind = None;
                let mut i = 1;
                while i < n {
                    let option = arg(i);
                    if i + 1 >= n {
                        return Err(Command::Reply(Reply::err("syntax error")));
                    } else if option.eq_ignore_ascii_case(b"MATCH") {
                        pattern = arg(i + 1).to_vec();
                    } else if option.eq_ignore_ascii_case(b"COUNT") {
                        // A hint; every key comes in one call anyway.
                        match std::str::from_utf8(arg(i + 1)).map(str::parse::<i64>) {
                            Ok(Ok(c)) if c >= 1 => {}
                            Ok(Ok(_)) => {
                                return Err(Command::Reply(Reply::err("syntax error")));
                            }
                            _ => {
                                return Err(Command::Reply(Reply::err(
                                    "value is not an integer or out of range",
                                )));
                            }
                        }
                    } else if option.eq_ignore_ascii_case(b"TYPE") {
                        kind = Some(arg(i + 1).to_vec());
                    } else {
                        return Err(Command::Reply(Reply::err("syntax error")));
                    }
                    i += 2;
                }
                Command::Key(KeyCommand::Keys {
                    pattern,
                    scan: true,
                    kind,
                })
            }
            cms if cms.starts_with("CMS.") => super::cms::command(cms, args, &filter)
                .unwrap_or_else(|| Command::Reply(Reply::err(unknown_command(args)))),
            topk if topk.starts_with("TOPK.") => super::topk::command(topk, args, &filter)
                .unwrap_or_else(|| Command::Reply(Reply::err(unknown_command(args)))),
            td if td.starts_with("TDIGEST.") => super::tdigest::command(td, args, &filter)
                .unwrap_or_else(|| Command::Reply(Reply::err(unknown_command(args)))),
            _ => Command::Reply(Reply::err(unknown_command(args))),
        })
    })();
    checked.unwrap_or_else(|refused| refused)
}

/// Redis 7's text for an unknown command: its name as given and the start of its arguments.
fn unknown_command(args: &Args) -> String {
    let clip = |b: &[u8], n: usize| String::from_utf8_lossy(&b[..b.len().min(n)]).into_owned();
    let mut listed = String::new();
    for a in args.from(1) {
        if listed.len() >= 128 {
            break;
        }
        listed += &format!("'{}' ", clip(a, 128 - listed.len()));
    }
    format!(
        "unknown command '{}', with args beginning with: {listed}",
        clip(args.arg(0), 128)
    )
}

/// Whether `name` matches the glob `pattern` (Redis's `KEYS`: `*`, `?`, `[...]`, `\`).
pub fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    // Iterative, with the last `*` as the only backtracking point: O(pattern x name) steps
    // and no recursion, so a client's pattern of many `*` can neither hang a worker nor
    // overflow its stack.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if let Some((matched, next)) = glob_step(pattern, p, name[n]) {
            if matched {
                p = next;
                n += 1;
                continue;
            }
        } else if pattern.get(p) == Some(&b'*') {
            star = Some((p, n));
            p += 1;
            continue;
        }
        match star {
            // The last `*` takes one more byte of the name.
            Some((sp, sn)) => {
                star = Some((sp, sn + 1));
                p = sp + 1;
                n = sn + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// One element of `pattern` at `p` against byte `c`: whether it matches and where the
/// pattern goes on; `None` at the end of the pattern or at a `*`.
fn glob_step(pattern: &[u8], p: usize, c: u8) -> Option<(bool, usize)> {
    match pattern.get(p)? {
        b'*' => None,
        b'?' => Some((true, p + 1)),
        b'[' => {
            let rest = &pattern[p + 1..];
            let Some(end) = rest.iter().position(|&b| b == b']') else {
                // No closing bracket: a literal `[`.
                return Some((c == b'[', p + 1));
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
            Some((hit != negate, p + 1 + end + 1))
        }
        b'\\' if p + 1 < pattern.len() => Some((pattern[p + 1] == c, p + 2)),
        &literal => Some((literal == c, p + 1)),
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`, with Redis 7's refusals.
fn hello(args: &Args) -> Result<Command, Reply> {
    let n = args.len() - 1;
    let arg = |i: usize| args.arg(i + 1);
    let mut protocol = None;
    let mut password = None;
    let mut name = None;
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
            name = Some(Bytes::copy_from_slice(arg(i + 1)));
            i += 2;
        } else {
            return Err(Reply::err(format!(
                "Syntax error in HELLO option '{}'",
                option.chars().take(64).collect::<String>()
            )));
        }
    }
    Ok(Command::Hello {
        protocol,
        password,
        name,
    })
}

/// Sends `request` to `handle`, an update with the connection's acknowledgement level if it
/// chose one; through the actor if `queued` ([`ReplicaHandle::call_queued`]).
pub fn send(
    handle: &ReplicaHandle,
    request: Request,
    ack: Option<AckLevel>,
    queued: bool,
) -> PendingResponse {
    let request = match ack {
        Some(_) => request.with_ack(ack),
        None => request,
    };
    if queued {
        handle.call_queued(request)
    } else {
        handle.call(request)
    }
}

/// [`inserted`] from its parts: the bitmap, the refused items (sorted) and the first
/// refusal's text.
pub(super) fn inserted_reply(
    answer: Inserted,
    bitmap: Bytes,
    items: usize,
    failed: &[usize],
    error: Option<&str>,
) -> Reply {
    let bit = |i| batch::bitmap_bit(&bitmap, i);
    match answer {
        Inserted::Cuckoo => Reply::Bits {
            bitmap: bitmap.clone(),
            items,
            refused: error.map(|_| {
                Box::new(Reply::IntOrBool {
                    resp2: -1,
                    resp3: false,
                })
            }),
        },
        Inserted::Bloom if failed.is_empty() => Reply::Bits {
            bitmap: bitmap.clone(),
            items,
            refused: None,
        },
        Inserted::Bloom => {
            let refused = Reply::err(error.unwrap_or("item refused"));
            Reply::Array(
                (0..items)
                    .map(|i| match failed.binary_search(&i) {
                        Ok(_) => refused.clone(),
                        Err(_) => Reply::Bool(bit(i)),
                    })
                    .collect(),
            )
        }
        Inserted::CuckooNx => Reply::Array(
            (0..items)
                .map(|i| match failed.binary_search(&i) {
                    Ok(_) => Reply::Int(-1),
                    Err(_) => Reply::Int(i64::from(bit(i))),
                })
                .collect(),
        ),
    }
}

/// The reply to a request the filter refused with `text` (`full`: its code says the filter
/// was full; `single_add`: the command was a single add).
pub(super) fn refusal(text: &str, full: bool, single_add: bool) -> Reply {
    if full && single_add {
        // RedisBloom's answer to an add into a full cuckoo filter.
        return Reply::Error("Filter is full".into());
    }
    Reply::err(text)
}

/// The reply to a command whose request `op` was answered `answer`, as RedisBloom's
/// command replies: the command is told by the request (a batch add's by its mode).
pub fn reply(op: Op, answer: Result<Response, ReplicaError>) -> Reply {
    let response = match answer {
        Ok(response) => response,
        // Not taken before the replica is ready: answered as Redis answers while loading.
        Err(e @ ReplicaError::NotServing) => return super::untaken_reply(&e),
        // A `TDIGEST.ADD` past 2^63 - 1 values in all: RedisBloom's refusal.
        Err(ReplicaError::Overflow(_)) if op == Op::TdigestAdd => {
            return Reply::Error("ERR T-Digest: overflow detected".into());
        }
        Err(e) => {
            let (text, full) = error_of(&e);
            return refusal(&text, full, op == Op::Add);
        }
    };
    let bits = |bits: &[bool], refused: Option<Box<Reply>>| Reply::Bits {
        bitmap: Bytes::from(batch::encode_bitmap(bits.iter().copied())),
        items: bits.len(),
        refused,
    };
    match response {
        Response::Added { mode, outcome } => Reply::Bool(Response::added_new(mode, outcome)),
        Response::Contains(found) | Response::Removed(found) => Reply::Bool(found),
        Response::Count(n) => Reply::Int(i64::try_from(n).unwrap_or(i64::MAX)),
        Response::MContains(found) | Response::MRemoved(found) => bits(&found, None),
        Response::MAdded(added) => {
            let answer = match added.mode {
                AddMode::ReportNew => Inserted::Bloom,
                AddMode::Always => Inserted::Cuckoo,
                AddMode::IfAbsent => Inserted::CuckooNx,
            };
            let bitmap = Bytes::from(batch::encode_bitmap(added.bits().iter().copied()));
            let error = added.error.as_deref().map(header_text);
            inserted_reply(
                answer,
                bitmap,
                added.added.len(),
                &added.failed,
                error.as_deref(),
            )
        }
        Response::Stats(stats) => Reply::Bulk(Bytes::from(
            serde_json::to_vec(&stats).expect("JSON serialize"),
        )),
        sketch @ (Response::CmsIncremented(_)
        | Response::CmsCount(_)
        | Response::CmsInfo { .. }) => super::cms::reply(sketch),
        // `TOPK.COUNT` is sent as a key command, which picks the counts itself.
        topk @ (Response::TopkAdded(_)
        | Response::TopkQueried { .. }
        | Response::TopkList { .. }
        | Response::TopkInfo { .. }) => super::topk::reply(topk, false),
        Response::TdigestUpdated => Reply::Simple("OK"),
        Response::TdigestValues(values) => {
            Reply::Array(values.into_iter().map(Reply::Double).collect())
        }
        other => Reply::err(format!("unexpected answer: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn encoded(r: &Reply) -> String {
        let mut out = BytesMut::new();
        r.encode(&mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn a_tdigest_overflow_is_answered_as_redisbloom_does() {
        let overflow = crate::FilterError::Overflow { what: "the count" };
        let reply = super::reply(Op::TdigestAdd, Err(ReplicaError::Overflow(overflow)));
        assert_eq!(encoded(&reply), "-ERR T-Digest: overflow detected\r\n");
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
    fn many_stars_cost_linear_work_not_exponential() {
        // Recursion tried every split of the name for every star: this took ~10^16 steps.
        let pattern = format!("{}x", "*".repeat(200_000));
        assert!(!glob_match(
            pattern.as_bytes(),
            "appendonly".repeat(20).as_bytes()
        ));
        assert!(glob_match(pattern.as_bytes(), b"x"));
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
            ("", "x", false),
            ("*", "", true),
            ("**", "ab", true),
            ("a*", "a", true),
            ("*x", "", false),
            ("*a*b*c", "xxaybzzc", true),
            ("*a*b*c", "xxaybzzcd", false),
            ("t*n*1", "tenant1", true),
            ("[ab", "[ab", true),
            ("[ab", "a", false),
            ("*[0-9]", "key7", true),
            ("?*?", "a", false),
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
                &["BF.RESERVE", "k", "0.01", "100", "EXPANSION", "2"],
                K::WriterScGBloom,
            ),
            (&["CF.RESERVE", "k", "100"], K::WriterScOrCuckoo),
            (&["CF.RESERVE", "k", "100", "EXPANSION", "0"], K::OrCuckoo),
            (
                &["CF.RESERVE", "k", "100", "EXPANSION", "2"],
                K::WriterScOrCuckoo,
            ),
            (
                &["CF.RESERVE", "k", "100", "MAXITERATIONS", "500"],
                K::WriterScOrCuckoo,
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
        // RedisBloom's other values are taken (issue 49); out of its ranges, refused.
        let s = spec(&["CF.RESERVE", "k", "100", "MAXITERATIONS", "20"]);
        assert_eq!((s.kind, s.max_kicks()), (K::WriterScOrCuckoo, 20));
        assert!(refused(&["CF.RESERVE", "k", "100", "MAXITERATIONS", "0"]).contains("between"));
    }

    fn no_filter(_: &str) -> Option<ReplicaHandle> {
        None
    }

    fn words(ws: &[&str]) -> Args {
        Args::of(ws)
    }

    fn refused(ws: &[&str]) -> String {
        match command(&words(ws), no_filter) {
            Command::Reply(Reply::Error(e)) | Command::AuthRefused(Reply::Error(e)) => e,
            // A missing key's answer (outside a transaction, given at once).
            Command::Key(KeyCommand::IfFound {
                missing: Reply::Error(e),
                ..
            }) => e,
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
        assert!(refused(&["CRPF.MDEL", "nope", "x"]).starts_with("ERR no filter named `nope`"));
        assert!(refused(&["FLUSHALL", "NOW"]).starts_with("ERR syntax error"));
        assert_eq!(refused(&["CF.DEL", "nope", "x"]), "Not found");
        // Read when its turn comes (KeyCommand::Read), not when parsed.
        assert!(matches!(
            command(&words(&["BF.INFO", "nope"]), no_filter),
            Command::Key(KeyCommand::Read { .. })
        ));
        assert_eq!(
            refused(&["BF.ADD", "new", ""]),
            "ERR invalid request: empty item",
            "refused before the key is made"
        );
        assert_eq!(
            refused(&["BF.INSERT", "nope", "NOCREATE", "ITEMS", "x"]),
            "ERR not found"
        );
        // The first add to a key creates it, with RedisBloom's defaults mapped onto crpf.
        for (ws, kind, mode) in [
            (
                &["BF.ADD", "new", "x"][..],
                crate::FilterKind::WriterScGBloom,
                AddMode::ReportNew,
            ),
            (
                &["BF.MADD", "new", "x", "y"],
                crate::FilterKind::WriterScGBloom,
                AddMode::ReportNew,
            ),
            (
                &["CF.ADD", "new", "x"],
                crate::FilterKind::WriterScOrCuckoo,
                AddMode::Always,
            ),
            (
                &["CF.ADDNX", "new", "x"],
                crate::FilterKind::WriterScOrCuckoo,
                AddMode::IfAbsent,
            ),
            (
                &["CF.INSERTNX", "new", "ITEMS", "x"],
                crate::FilterKind::WriterScOrCuckoo,
                AddMode::IfAbsent,
            ),
            (
                &["BF.INSERT", "new", "NONSCALING", "ITEMS", "x"],
                crate::FilterKind::GBloom,
                AddMode::ReportNew,
            ),
        ] {
            match command(&words(ws), no_filter) {
                Command::Key(KeyCommand::Create {
                    name,
                    spec,
                    request,
                    ..
                }) => {
                    let add_mode = match *request {
                        Request::Add { mode, .. } | Request::MAdd { mode, .. } => mode,
                        other => panic!("{ws:?} gave {other:?}"),
                    };
                    assert_eq!(
                        (name.as_str(), spec.kind, add_mode),
                        ("new", kind, mode),
                        "{ws:?}"
                    );
                }
                other => panic!("{ws:?} gave {other:?}"),
            }
        }
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
            matches!(command(&words(&["AUTH", "default", "pw"]), no_filter), Command::Auth(p, true) if &p[..] == b"pw")
        );
    }

    #[test]
    fn answers_read_as_redisbloom_replies() {
        use crate::api::{AddOutcome, BatchAdded};
        assert_eq!(
            reply(Op::Contains, Ok(Response::Contains(true))),
            Reply::Bool(true)
        );
        assert_eq!(
            reply(Op::Remove, Ok(Response::Removed(false))),
            Reply::Bool(false)
        );
        assert_eq!(reply(Op::Count, Ok(Response::Count(7))), Reply::Int(7));
        let added = |mode, outcome| reply(Op::Add, Ok(Response::Added { mode, outcome }));
        assert_eq!(added(AddMode::Always, AddOutcome::Known), Reply::Bool(true));
        assert_eq!(
            added(AddMode::ReportNew, AddOutcome::Known),
            Reply::Bool(false)
        );
        assert_eq!(added(AddMode::IfAbsent, AddOutcome::New), Reply::Bool(true));
        // A batch's answer encodes as the array of its results would.
        let found = Ok(Response::MContains(vec![true, false, true]));
        assert_eq!(
            encoded(&reply(Op::MContains, found)),
            encoded(&Reply::Array(vec![
                Reply::Int(1),
                Reply::Int(0),
                Reply::Int(1)
            ]))
        );
        // BF.MADD names the refused item's error in its place.
        let madd = |mode| {
            let added = BatchAdded {
                mode,
                added: vec![true, false, true],
                new_items: vec![true, false, false],
                failed: vec![1],
                error: Some("filter is full".into()),
            };
            encoded(&reply(Op::MAdd, Ok(Response::MAdded(added))))
        };
        assert_eq!(
            madd(AddMode::ReportNew),
            "*3\r\n:1\r\n-ERR filter is full\r\n:0\r\n"
        );
        // CF.INSERTNX: -1 where refused.
        assert_eq!(madd(AddMode::IfAbsent), "*3\r\n:1\r\n:-1\r\n:0\r\n");
        let invalid = ReplicaError::InvalidItem("empty item".into());
        assert_eq!(
            reply(Op::Add, Err(invalid)),
            Reply::err("invalid request: empty item")
        );
        let full = ReplicaError::Filter(crate::FilterError::Full { max_kicks: 1 });
        assert_eq!(
            reply(Op::Add, Err(full)),
            Reply::Error("Filter is full".into())
        );
        assert!(matches!(
            reply(Op::Contains, Err(ReplicaError::NotServing)),
            Reply::Error(e) if e.starts_with("LOADING")
        ));
    }
}
