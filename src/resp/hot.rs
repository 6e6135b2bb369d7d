//! The commands a client sends most (`BF.ADD`, `BF.EXISTS`, `CF.ADD`, `CF.ADDNX`,
//! `CF.EXISTS`, and the batches `BF.MADD`, `BF.MEXISTS`, `CF.MEXISTS`, `CF.INSERT`/
//! `CF.INSERTNX key ITEMS ...`), answered without building a request of the request API: no
//! payload copy, headers, subject or JSON body, and no future to poll. With the server as the
//! bottleneck (`redis-benchmark -P 16`) that machinery cost more than the filter itself.
//!
//! Only the plain case is taken here: an existing key of the command's family, items within
//! the replica's limits, a query, or an add that the replica applies in the caller's thread (a
//! grow-only kind at `local`, `logged` or `durable`, the last answered once the commit that
//! carries it is fsynced). Every other case (a missing key created by its first add, a key
//! of the other family, a refused batch, an add the actor applies, a lock held by a merge)
//! goes the general way, [`super::commands::command`], which answers it as before. Replies and
//! error texts are the general path's.

use bytes::Bytes;

use super::commands::{Inserted, Reply, inserted_reply, refusal};
use super::parse::Args;
use crate::api::AddMode;
use crate::api::batch::encode_bitmap;
use crate::replica::{AckLevel, AddOutcome, BatchAdd, ReplicaError, ReplicaHandle, error_of};

/// What a command of this path does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    /// `EXISTS key item`.
    Exists,
    /// `ADD key item` in this mode.
    Add(AddMode),
    /// `MEXISTS key item...`.
    MExists,
    /// A batch add of the items from argument `from` on, answered as `answer` says.
    MAdd {
        mode: AddMode,
        answer: Inserted,
        from: usize,
    },
}

/// A command of this path, recognised by name and arity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HotCommand {
    /// `BF.*` (else `CF.*`).
    bloom: bool,
    verb: Verb,
}

impl HotCommand {
    /// The command `args` is, if it is one of this path's.
    pub(super) fn recognise(args: &Args) -> Option<HotCommand> {
        if args.len() < 3 {
            return None;
        }
        let name = args.arg(0);
        let (bloom, verb) = match name.get(..3)? {
            p if p.eq_ignore_ascii_case(b"BF.") => (true, &name[3..]),
            p if p.eq_ignore_ascii_case(b"CF.") => (false, &name[3..]),
            _ => return None,
        };
        let is = |word: &[u8]| verb.eq_ignore_ascii_case(word);
        let single = args.len() == 3;
        let verb = if single && is(b"EXISTS") {
            Verb::Exists
        } else if single && is(b"ADD") {
            // RedisBloom's BF.ADD answers whether the item was new; its CF.ADD always 1.
            Verb::Add(if bloom {
                AddMode::ReportNew
            } else {
                AddMode::Always
            })
        } else if single && !bloom && is(b"ADDNX") {
            Verb::Add(AddMode::IfAbsent)
        } else if is(b"MEXISTS") {
            Verb::MExists
        } else if bloom && is(b"MADD") {
            Verb::MAdd {
                mode: AddMode::ReportNew,
                answer: Inserted::Bloom,
                from: 2,
            }
        } else if !bloom
            && (is(b"INSERT") || is(b"INSERTNX"))
            && args.len() > 3
            && args.arg(2).eq_ignore_ascii_case(b"ITEMS")
        {
            // Only the form without options: they matter only to a key the add creates.
            let (mode, answer) = if is(b"INSERT") {
                (AddMode::Always, Inserted::Cuckoo)
            } else {
                (AddMode::IfAbsent, Inserted::CuckooNx)
            };
            Verb::MAdd {
                mode,
                answer,
                from: 3,
            }
        } else {
            return None;
        };
        Some(HotCommand { bloom, verb })
    }

    /// The reply to this command (`args`) on `handle` (the key's filter), at the
    /// connection's `ack`; `None` if the general path must take it (nothing was applied).
    pub(super) fn answer(
        self,
        handle: &ReplicaHandle,
        args: &Args,
        ack: Option<AckLevel>,
    ) -> Option<HotReply> {
        if !super::cms::in_family(handle.kind(), self.bloom) {
            return None;
        }
        let single_add = matches!(self.verb, Verb::Add(_));
        let mut ticket = None;
        let answer = match self.verb {
            Verb::Exists => handle.contains_now(args.arg(2)).map(Reply::Bool),
            Verb::Add(mode) => handle.add_now(args.arg(2), mode, ack)?.map(|added| {
                ticket = added.ticket;
                Reply::Bool(mode == AddMode::Always || added.outcome == AddOutcome::New)
            }),
            Verb::MExists => {
                let items = within_limits(handle, args, 2)?;
                handle.mcontains_now(&items).map(|found| Reply::Bits {
                    bitmap: Bytes::from(encode_bitmap(found)),
                    items: items.len(),
                    refused: None,
                })
            }
            Verb::MAdd { mode, answer, from } => {
                let items = within_limits(handle, args, from)?;
                handle.madd_now(&items, mode, ack)?.map(|added| {
                    ticket = added.ticket;
                    batch_add_reply(answer, mode, added.outcome)
                })
            }
        };
        let reply = answer.unwrap_or_else(|e| error_reply(&e, single_add));
        Some(match ticket {
            None => HotReply::Now(reply),
            // A durable add, applied: answered once the commit that carries it is synced.
            Some(ticket) => HotReply::After(Box::pin(async move {
                match ticket.settled().await {
                    Ok(()) => reply,
                    Err(e) => error_reply(&e, single_add),
                }
            })),
        })
    }
}

/// The reply of a command of this path: now, or once a `durable` add's commit is done.
pub(super) enum HotReply {
    Now(Reply),
    After(futures::future::BoxFuture<'static, Reply>),
}

/// The items from argument `from` on, if the replica takes them as a batch (else the general
/// path answers the batch's refusal).
fn within_limits<'a>(handle: &ReplicaHandle, args: &'a Args, from: usize) -> Option<Vec<&'a [u8]>> {
    let limits = handle.limits();
    let items: Vec<&[u8]> = args.from(from).collect();
    let fits = items.len() <= limits.max_items
        && items
            .iter()
            .all(|i| !i.is_empty() && i.len() <= limits.max_item_bytes);
    fits.then_some(items)
}

/// A batch add's reply, as the general path gives it from the request's bitmap answer.
fn batch_add_reply(answer: Inserted, mode: AddMode, added: BatchAdd) -> Reply {
    let items = added.added.len();
    let error = added.error.as_ref().map(|e| error_of(e).0);
    // As the request API answers: with a mode, the bits say "new" and the refused items are
    // named; without, the bits say "added".
    let (bits, failed) = match mode {
        AddMode::Always => (added.added, &[][..]),
        _ => (added.new_items, &added.failed[..]),
    };
    let bitmap = Bytes::from(encode_bitmap(bits));
    inserted_reply(answer, bitmap, items, failed, error.as_deref())
}

/// The general path's reply to a request that failed with `e` (`single_add`: an `ADD`): not
/// taken before the replica is ready, else refused by the filter.
fn error_reply(e: &ReplicaError, single_add: bool) -> Reply {
    if matches!(e, ReplicaError::NotServing) {
        return super::untaken_reply(e);
    }
    let (text, full) = error_of(e);
    refusal(&text, full, single_add)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::BytesMut;

    use super::*;
    use crate::replica::{Replica, ReplicaConfig};
    use crate::resp::commands::{self, Command, Protocol};
    use crate::resp::redisbloom::is_bloom;
    use crate::transport::InProcessBus;
    use crate::wire::FilterKind;
    use crate::{ExpirySpec, FilterSpec};

    #[test]
    fn recognises_its_commands_by_name_and_arity_only() {
        let hot = |ws: &[&str]| HotCommand::recognise(&Args::of(ws));
        let is = |bloom, verb| Some(HotCommand { bloom, verb });
        let madd = |mode, answer, from| Verb::MAdd { mode, answer, from };
        assert_eq!(
            hot(&["bf.add", "k", "x"]),
            is(true, Verb::Add(AddMode::ReportNew))
        );
        assert_eq!(
            hot(&["CF.Add", "k", "x"]),
            is(false, Verb::Add(AddMode::Always))
        );
        assert_eq!(
            hot(&["cf.addnx", "k", "x"]),
            is(false, Verb::Add(AddMode::IfAbsent))
        );
        assert_eq!(hot(&["BF.EXISTS", "k", "x"]), is(true, Verb::Exists));
        assert_eq!(hot(&["CF.EXISTS", "k", "x"]), is(false, Verb::Exists));
        assert_eq!(hot(&["bf.mexists", "k", "x", "y"]), is(true, Verb::MExists));
        assert_eq!(hot(&["CF.MEXISTS", "k", "x"]), is(false, Verb::MExists));
        assert_eq!(
            hot(&["BF.MADD", "k", "x", "y"]),
            is(true, madd(AddMode::ReportNew, Inserted::Bloom, 2))
        );
        assert_eq!(
            hot(&["cf.insert", "k", "items", "x"]),
            is(false, madd(AddMode::Always, Inserted::Cuckoo, 3))
        );
        assert_eq!(
            hot(&["CF.INSERTNX", "k", "ITEMS", "x", "y"]),
            is(false, madd(AddMode::IfAbsent, Inserted::CuckooNx, 3))
        );
        for other in [
            &["BF.ADD", "k"][..],
            &["BF.ADD", "k", "x", "y"],
            &["BF.EXISTS", "k", "x", "y"],
            &["BF.ADDNX", "k", "x"],
            &["CF.MADD", "k", "x"],
            &["BF.MEXISTS", "k"],
            &["CF.INSERT", "k", "ITEMS"],
            &["CF.INSERT", "k", "NOCREATE", "ITEMS", "x"],
            &["BF.INSERT", "k", "ITEMS", "x"],
            &["CF.DEL", "k", "x"],
            &["BF", "k", "x"],
            &["SET", "k", "x"],
        ] {
            assert_eq!(hot(other), None, "{other:?}");
        }
    }

    /// The reply of the general path: the command as a request, answered by the replica.
    async fn general(handle: &ReplicaHandle, ws: &[&str], ack: Option<AckLevel>) -> Reply {
        let h = handle.clone();
        match commands::command(&Args::of(ws), move |_| Some(h.clone())) {
            Command::Filter(handle, request) => {
                let response = commands::send(&handle, &request, ack, false).await;
                super::super::answer_reply(response, request.shape)
            }
            Command::Reply(reply) => reply,
            other => panic!("{ws:?}: {other:?}"),
        }
    }

    /// The reply of this path, or of the general one where this one hands the command on.
    async fn hot(handle: &ReplicaHandle, ws: &[&str], ack: Option<AckLevel>) -> (Reply, bool) {
        let args = Args::of(ws);
        let cmd = HotCommand::recognise(&args).expect("a hot command");
        match cmd.answer(handle, &args, ack) {
            Some(HotReply::Now(reply)) => (reply, true),
            Some(HotReply::After(later)) => (later.await, true),
            None => (general(handle, ws, ack).await, false),
        }
    }

    fn encoded(reply: &Reply) -> (Vec<u8>, Vec<u8>) {
        let mut resp2 = BytesMut::new();
        let mut resp3 = BytesMut::new();
        reply.encode_as(&mut resp2, Protocol::Resp2);
        reply.encode_as(&mut resp3, Protocol::Resp3);
        (resp2.to_vec(), resp3.to_vec())
    }

    async fn start(name: &str, spec: FilterSpec) -> ReplicaHandle {
        let cfg = ReplicaConfig::new(name, spec).fast();
        let handle = Replica::start(cfg, Arc::new(InProcessBus::new()))
            .await
            .unwrap();
        assert!(handle.wait_ready(Duration::from_secs(10)).await);
        handle
    }

    /// Two filters of one spec, each sent the same commands, one through this path and one
    /// through the general path, answer alike byte for byte in both protocols (refusals
    /// included); and this path takes what it should.
    #[actix::test]
    async fn answers_as_the_general_path_does_on_every_kind() {
        // Over the default `max_item_bytes` (1 MiB).
        let long = "x".repeat((1 << 20) + 1);
        for kind in [
            FilterKind::GBloom,
            FilterKind::ScGBloom,
            FilterKind::WriterScGBloom,
            FilterKind::ExpiringBloom,
            FilterKind::GCuckoo,
            FilterKind::OrCuckoo,
            FilterKind::WriterScOrCuckoo,
            FilterKind::CountingCuckoo,
        ] {
            let mut spec = FilterSpec::new(kind, 1_000, 0.01);
            if kind == FilterKind::ExpiringBloom {
                spec.expiry = Some(ExpirySpec::new(60_000));
            }
            let bloom = is_bloom(kind);
            let (a, b) = (start("a", spec.clone()).await, start("b", spec).await);
            let family = if bloom { "BF" } else { "CF" };
            let (add, exists) = (format!("{family}.ADD"), format!("{family}.EXISTS"));
            let (madd, mexists) = (format!("{family}.MADD"), format!("{family}.MEXISTS"));
            let local = None;
            let durable = Some(AckLevel::Durable);
            // Each step, and whether this path takes it: queries always, adds where the
            // replica applies them in place or refuses their level, batches only within the
            // limits.
            let in_place = !kind.tagged() && !kind.removable();
            let mut script: Vec<(Vec<&str>, Option<AckLevel>, bool)> = vec![
                (vec![&exists, "k", "x"], local, true),
                (vec![&add, "k", "x"], local, in_place),
                (vec![&add, "k", "x"], local, in_place),
                (vec![&exists, "k", "x"], local, true),
                (vec![&add, "k", ""], local, in_place),
                (vec![&exists, "k", ""], local, true),
                (vec![&add, "k", &long], local, in_place),
                (vec![&exists, "k", &long], local, true),
                // Refused before anything is applied: no write-ahead log.
                (vec![&add, "k", "y"], durable, true),
                (vec![&exists, "k", "y"], local, true),
                (vec![&mexists, "k", "x", "y", "w"], local, true),
                (vec![&mexists, "k", "x", ""], local, false),
                (vec![&mexists, "k", "x", &long], local, false),
            ];
            if bloom {
                script.extend([
                    (vec![&*madd, "k", "x", "v", "w"], local, in_place),
                    (vec![&madd, "k", "v", "u"], local, in_place),
                    (vec![&madd, "k", "t", ""], local, false),
                    (vec![&madd, "k", "t"], durable, true),
                ]);
            } else {
                script.extend([
                    (vec!["CF.ADDNX", "k", "z"], local, in_place),
                    (vec!["CF.ADDNX", "k", "z"], local, in_place),
                    (vec!["CF.INSERT", "k", "ITEMS", "x", "v"], local, in_place),
                    (vec!["CF.INSERTNX", "k", "ITEMS", "v", "u"], local, in_place),
                    (vec!["CF.INSERT", "k", "ITEMS", "t", ""], local, false),
                    (vec!["CF.INSERTNX", "k", "ITEMS", "t"], durable, true),
                ]);
            }
            script.push((vec![&mexists, "k", "v", "u", "t", "z"], local, true));
            for (ws, ack, takes) in &script {
                let (reply, took) = hot(&a, ws, *ack).await;
                let want = general(&b, ws, *ack).await;
                assert_eq!(
                    encoded(&reply),
                    encoded(&want),
                    "{kind}: {ws:.20?} at {ack:?}"
                );
                assert_eq!(took, *takes, "{kind}: {ws:.20?} at {ack:?}");
            }
            a.shutdown().await.unwrap();
            b.shutdown().await.unwrap();
        }
    }

    /// A full cuckoo filter refuses an add as RedisBloom does, on both paths, and keeps what
    /// it held.
    #[actix::test]
    async fn a_full_cuckoo_filter_refuses_alike() {
        let handle = start("full", FilterSpec::new(FilterKind::GCuckoo, 100, 0.01)).await;
        let mut refused = None;
        for i in 0..10_000 {
            let item = format!("i{i}");
            let (reply, took) = hot(&handle, &["CF.ADD", "k", &item], None).await;
            assert!(took);
            if reply != Reply::Bool(true) {
                refused = Some((i, reply));
                break;
            }
        }
        let (i, reply) = refused.expect("the filter fills up");
        assert_eq!(reply, Reply::Error("Filter is full".into()));
        let general = general(&handle, &["CF.ADD", "k", &format!("i{i}")], None).await;
        assert_eq!(general, reply);
        for j in 0..i {
            assert!(handle.contains(format!("i{j}").as_bytes()), "i{j} lost");
        }
        handle.shutdown().await.unwrap();
    }
}
