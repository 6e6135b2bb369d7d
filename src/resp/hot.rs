//! The single-item commands a client sends most (`BF.ADD`, `BF.EXISTS`, `CF.ADD`, `CF.ADDNX`,
//! `CF.EXISTS`), answered without building a request of the request API: no payload copy,
//! headers, subject or JSON body, and no future to poll. With the server as the bottleneck
//! (`redis-benchmark -P 16`) that machinery cost more than the filter itself.
//!
//! Only the plain case is taken here: an existing key of the command's family, a query, or an
//! add that the replica applies in the caller's thread (a grow-only kind at `local`). Every
//! other case (a missing key created by its first add, a key of the other family, an add the
//! actor applies, a lock held by a merge) goes the general way, [`super::commands::command`],
//! which answers it as before. Replies and error texts are the general path's.

use super::commands::Reply;
use super::parse::Args;
use super::redisbloom::is_bloom;
use crate::api::AddMode;
use crate::replica::{AckLevel, AddOutcome, ReplicaError, ReplicaHandle, error_of};

/// A command of this path, recognised by name and arity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HotCommand {
    /// `BF.*` (else `CF.*`).
    bloom: bool,
    /// An add in this mode (else `EXISTS`).
    add: Option<AddMode>,
}

impl HotCommand {
    /// The command `args` is, if it is one of this path's: `NAME key item`.
    pub(super) fn recognise(args: &Args) -> Option<HotCommand> {
        if args.len() != 3 {
            return None;
        }
        let name = args.arg(0);
        let (bloom, verb) = match name.get(..3)? {
            p if p.eq_ignore_ascii_case(b"BF.") => (true, &name[3..]),
            p if p.eq_ignore_ascii_case(b"CF.") => (false, &name[3..]),
            _ => return None,
        };
        let add = if verb.eq_ignore_ascii_case(b"EXISTS") {
            None
        } else if verb.eq_ignore_ascii_case(b"ADD") {
            // RedisBloom's BF.ADD answers whether the item was new; its CF.ADD always 1.
            Some(if bloom {
                AddMode::ReportNew
            } else {
                AddMode::Always
            })
        } else if !bloom && verb.eq_ignore_ascii_case(b"ADDNX") {
            Some(AddMode::IfAbsent)
        } else {
            return None;
        };
        Some(HotCommand { bloom, add })
    }

    /// The reply to this command on `handle` (the key's filter) for `item`, at the
    /// connection's `ack`; `None` if the general path must take it (nothing was applied).
    pub(super) fn answer(
        self,
        handle: &ReplicaHandle,
        item: &[u8],
        ack: Option<AckLevel>,
    ) -> Option<Reply> {
        if is_bloom(handle.kind()) != self.bloom {
            return None;
        }
        let answer = match self.add {
            None => handle.contains_now(item),
            Some(mode) => handle.add_now(item, mode, ack)?.map(|outcome| match mode {
                AddMode::Always => true,
                _ => outcome == AddOutcome::New,
            }),
        };
        Some(match answer {
            Ok(yes) => Reply::Bool(yes),
            Err(e) => error_reply(&e, self.add.is_some()),
        })
    }
}

/// The general path's reply to a request that failed with `e`.
fn error_reply(e: &ReplicaError, add: bool) -> Reply {
    if matches!(e, ReplicaError::NotServing) {
        // What Redis answers while it loads its data: clients know to retry.
        return Reply::Error(format!("LOADING {e}"));
    }
    let (text, full) = error_of(e);
    if full && add {
        // RedisBloom's answer to an add into a full cuckoo filter.
        return Reply::Error("Filter is full".into());
    }
    Reply::err(text)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::BytesMut;

    use super::*;
    use crate::replica::{Replica, ReplicaConfig};
    use crate::resp::commands::{self, Command, Protocol};
    use crate::transport::InProcessBus;
    use crate::wire::FilterKind;
    use crate::{ExpirySpec, FilterSpec};

    #[test]
    fn recognises_its_commands_by_name_and_arity_only() {
        let hot = |ws: &[&str]| HotCommand::recognise(&Args::of(ws));
        let add = |bloom, mode| Some(HotCommand { bloom, add: mode });
        assert_eq!(
            hot(&["bf.add", "k", "x"]),
            add(true, Some(AddMode::ReportNew))
        );
        assert_eq!(
            hot(&["CF.Add", "k", "x"]),
            add(false, Some(AddMode::Always))
        );
        assert_eq!(
            hot(&["cf.addnx", "k", "x"]),
            add(false, Some(AddMode::IfAbsent))
        );
        assert_eq!(hot(&["BF.EXISTS", "k", "x"]), add(true, None));
        assert_eq!(hot(&["CF.EXISTS", "k", "x"]), add(false, None));
        for other in [
            &["BF.ADD", "k"][..],
            &["BF.ADD", "k", "x", "y"],
            &["BF.ADDNX", "k", "x"],
            &["BF.MADD", "k", "x"],
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
        match cmd.answer(handle, args.arg(2), ack) {
            Some(reply) => (reply, true),
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
        let long = "x".repeat(70_000);
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
            let mut script: Vec<(Vec<&str>, Option<AckLevel>)> = vec![
                (vec![&exists, "k", "x"], None),
                (vec![&add, "k", "x"], None),
                (vec![&add, "k", "x"], None),
                (vec![&exists, "k", "x"], None),
                (vec![&add, "k", ""], None),
                (vec![&exists, "k", ""], None),
                (vec![&add, "k", &long], None),
                (vec![&exists, "k", &long], None),
                // Refused before anything is applied: no write-ahead log.
                (vec![&add, "k", "y"], Some(AckLevel::Durable)),
                (vec![&exists, "k", "y"], None),
            ];
            if !bloom {
                script.push((vec!["CF.ADDNX", "k", "z"], None));
                script.push((vec!["CF.ADDNX", "k", "z"], None));
            }
            for (ws, ack) in &script {
                let (reply, took) = hot(&a, ws, *ack).await;
                let want = general(&b, ws, *ack).await;
                assert_eq!(
                    encoded(&reply),
                    encoded(&want),
                    "{kind}: {ws:.20?} at {ack:?}"
                );
                // Queries always; adds where the replica applies them in place, or refuses
                // their level.
                let in_place = !kind.tagged() && !kind.removable();
                let query = ws[0].ends_with("EXISTS");
                assert_eq!(
                    took,
                    query || in_place || ack.is_some(),
                    "{kind}: {ws:.20?} at {ack:?}"
                );
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
