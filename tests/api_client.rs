//! The request API's batch operations, per-replica subjects and the typed client
//! (`crpf::client`), against a real `nats-server`: batch round trips for `or_cuckoo` and
//! `g_bloom` in both reply formats, malformed frames and limits from a raw NATS client, partial
//! failures of `madd`, each replica answering on its own subjects, and batch adds acknowledged
//! at `durable` (found in the write-ahead log) and `replicated` (merged by the peer).

mod nats_harness;
mod replica_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use crpf::api::batch;
use crpf::api::{ACK_HEADER, ERROR_HEADER, Op, REPLICA_HEADER, REPLY_HEADER, ReplyFormat};
use crpf::client::{Client, ClientError};
use crpf::replica::{AckLevel, ReplicaConfig, ReplicaHandle};
use crpf::wire::FilterKind;
use nats_harness::NatsServer;
use replica_common::{cfg, converged, replay_log, saved_reservation, start_serving as start, stop};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn items(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A raw request (plain async-nats, no crpf code): the reply.
async fn raw(
    nc: &async_nats::Client,
    subject: String,
    payload: Vec<u8>,
    headers: &[(&str, &str)],
) -> async_nats::Message {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    let request = async_nats::Request::new()
        .payload(payload.into())
        .headers(h)
        .timeout(Some(Duration::from_secs(10)));
    nc.send_request(subject.clone(), request)
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"))
}

fn header<'a>(m: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

fn json_of(m: &async_nats::Message) -> Value {
    serde_json::from_slice(&m.payload)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&m.payload)))
}

fn error_of(m: &async_nats::Message) -> String {
    let v = json_of(m);
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error reply: {v}"))
        .to_string()
}

fn frame(len: u32, bytes: &[u8]) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

/// Starts replica B of `c` beside `a`, and `n` items added through `client` at `replicated`:
/// once answered, B has merged them all. Answers B and the items.
async fn replicated_batch(
    c: ReplicaConfig,
    url: &str,
    a: &ReplicaHandle,
    client: &Client,
    n: usize,
) -> (ReplicaHandle, Vec<String>) {
    let b = start(c, url).await;
    let deadline = Instant::now() + WAIT;
    while a.stats().await.unwrap().peers < 1 {
        assert!(Instant::now() < deadline, "A never heard B");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spread = items("r", n);
    let r = client
        .madd(&spread, Some(AckLevel::Replicated))
        .await
        .unwrap();
    assert!(r.all(), "{r:?}");
    let missing = spread.iter().filter(|i| !b.contains(i.as_bytes())).count();
    assert_eq!(
        missing, 0,
        "acknowledged as replicated, not merged by the peer"
    );
    (b, spread)
}

#[actix::test]
async fn batches_round_trip_through_the_client_for_or_cuckoo_and_g_bloom() {
    let server = NatsServer::start();
    let nc = async_nats::connect(server.url()).await.unwrap();
    for (name, kind) in [("b_or", FilterKind::OrCuckoo), ("b_gb", FilterKind::GBloom)] {
        let h = start(cfg(name, kind, 20_000, 0.001), &server.url()).await;
        for format in [ReplyFormat::Bitmap, ReplyFormat::Json] {
            let client = Client::new(nc.clone(), "crpf", name).with_reply_format(format);
            let present = items(&format!("{name}-{}", format.name()), 1000);
            let r = client.madd(&present, None).await.unwrap();
            assert_eq!(r.added.len(), 1000);
            assert!(r.all() && r.error.is_none(), "{kind:?} {format:?}: {r:?}");
            assert!(present.iter().all(|i| h.contains(i.as_bytes())));
            assert_eq!(
                client.mcontains(&present).await.unwrap(),
                vec![true; 1000],
                "{kind:?} {format:?}"
            );
            // Items never added: the replica's own answers, item by item, and few of them
            // false positives.
            let absent = items(&format!("absent-{}", format.name()), 1000);
            let found = client.mcontains(&absent).await.unwrap();
            let local: Vec<bool> = absent.iter().map(|i| h.contains(i.as_bytes())).collect();
            assert_eq!(found, local);
            assert!(found.iter().filter(|f| **f).count() < 50, "{found:?}");

            if kind == FilterKind::OrCuckoo {
                let (gone, kept) = present.split_at(500);
                assert_eq!(client.mremove(gone, None).await.unwrap(), vec![true; 500]);
                assert_eq!(client.mcontains(kept).await.unwrap(), vec![true; 500]);
                let found = client.mcontains(gone).await.unwrap();
                let local: Vec<bool> = gone.iter().map(|i| h.contains(i.as_bytes())).collect();
                assert_eq!(found, local);
                assert!(found.iter().filter(|f| **f).count() < 25, "{found:?}");
            } else {
                match client.mremove(&present[..3], None).await {
                    Err(ClientError::Server { message, replica }) => {
                        assert!(message.contains("does not support remove"), "{message}");
                        assert_eq!(replica, Some(h.identity().replica));
                    }
                    other => panic!("mremove on g_bloom: {other:?}"),
                }
            }
        }

        // The single operations through the client.
        let client = Client::new(nc.clone(), "crpf", name);
        client.add("single", None).await.unwrap();
        assert!(client.contains("single").await.unwrap());
        let stats = client.stats().await.unwrap();
        assert_eq!(stats.filter, name);
        assert_eq!(stats.replica, h.identity().replica);
        if kind == FilterKind::OrCuckoo {
            assert!(client.remove("single", None).await.unwrap());
        }
        assert!(matches!(
            client.add("", None).await,
            Err(ClientError::Server { message, .. }) if message.contains("empty item")
        ));

        // The reply formats on the wire, from a raw client.
        let subject = format!("crpf.{name}.api.madd");
        let three = batch::encode(["x1", "x2", "x3"]).unwrap();
        let m = raw(&nc, subject.clone(), three.clone(), &[]).await;
        assert_eq!(json_of(&m), json!({"added": 3}));
        assert_eq!(header(&m, REPLY_HEADER), None);
        let id = h.identity().replica.to_string();
        assert_eq!(header(&m, REPLICA_HEADER), Some(id.as_str()));
        let m = raw(&nc, subject, three.clone(), &[(REPLY_HEADER, "bitmap")]).await;
        assert_eq!(&m.payload[..], [0b111]);
        assert_eq!(header(&m, REPLY_HEADER), Some("bitmap"));
        assert_eq!(header(&m, ERROR_HEADER), None);
        let m = raw(&nc, format!("crpf.{name}.api.mcontains"), three, &[]).await;
        assert_eq!(json_of(&m), json!({"contains": [true, true, true]}));
        // The empty batch.
        let m = raw(&nc, format!("crpf.{name}.api.mcontains"), vec![], &[]).await;
        assert_eq!(json_of(&m), json!({"contains": []}));
        assert!(client.madd(Vec::<&[u8]>::new(), None).await.unwrap().all());
        h.shutdown().await.unwrap();
    }
}

/// Every malformed batch is refused whole, with a JSON error naming what is wrong, and
/// changes nothing.
#[actix::test]
async fn malformed_batches_and_limits_get_error_replies() {
    let server = NatsServer::start();
    let mut c = cfg("limits", FilterKind::OrCuckoo, 10_000, 0.01);
    c.max_batch_items = 8;
    c.max_item_bytes = 16;
    let h = start(c, &server.url()).await;
    let nc = async_nats::connect(server.url()).await.unwrap();
    // A valid first item, then the defect.
    let first = frame(10, b"first-item");
    let with = |defect: Vec<u8>| [first.clone(), defect].concat();
    let nine: Vec<u8> = batch::encode(items("i", 9)).unwrap();
    // (operation, payload, request headers, what the error says)
    type Case<'a> = (Op, Vec<u8>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            Op::MAdd,
            with(vec![3, 0]),
            vec![],
            "item 1: truncated length",
        ),
        (
            Op::MAdd,
            with(frame(5, b"abc")),
            vec![],
            "item 1: truncated item",
        ),
        (Op::MAdd, with(frame(0, b"")), vec![], "item 1: empty item"),
        (
            Op::MAdd,
            with(frame(17, &[b'z'; 17])),
            vec![],
            "exceeds max_item_bytes 16",
        ),
        (
            Op::MAdd,
            nine.clone(),
            vec![],
            "more than 8 items exceeds max_batch_items",
        ),
        (
            Op::MAdd,
            first.clone(),
            vec![(REPLY_HEADER, "cbor")],
            "unknown Crpf-Reply `cbor`",
        ),
        (
            Op::MAdd,
            first.clone(),
            vec![(ACK_HEADER, "forever")],
            "unknown ack level",
        ),
        (
            Op::MAdd,
            first.clone(),
            vec![(ACK_HEADER, "durable")],
            "`durable` needs a data_dir",
        ),
        (Op::MRemove, with(vec![1]), vec![], "truncated length"),
        (Op::MRemove, nine.clone(), vec![], "max_batch_items"),
        (Op::MContains, with(frame(9, b"")), vec![], "truncated item"),
        (Op::MContains, nine, vec![], "max_batch_items"),
    ];
    let n = cases.len() as u64;
    let id = h.identity().replica.to_string();
    for (op, payload, headers, expected) in cases {
        let m = raw(&nc, format!("crpf.limits.api.{op}"), payload, &headers).await;
        let e = error_of(&m);
        assert!(
            e.contains(expected),
            "{op} {headers:?}: `{e}`, not `{expected}`"
        );
        // Errors are JSON even when a bitmap was asked for, and name the replica.
        assert_eq!(header(&m, REPLY_HEADER), None);
        assert_eq!(header(&m, REPLICA_HEADER), Some(id.as_str()));
    }
    assert!(!h.contains(b"first-item"), "a refused batch was applied");
    let stats = h.stats().await.unwrap();
    assert_eq!(stats.figures.cardinality, 0.0);
    assert_eq!(stats.api_errors.get("invalid_request"), Some(&(n - 1)));
    assert_eq!(stats.api_errors.get("ack_unavailable"), Some(&1));

    // At the limits exactly: accepted.
    let eight = items("i", 8);
    let m = raw(
        &nc,
        "crpf.limits.api.madd".into(),
        batch::encode(&eight).unwrap(),
        &[],
    )
    .await;
    assert_eq!(json_of(&m), json!({"added": 8}));
    let client = Client::new(nc.clone(), "crpf", "limits");
    assert!(client.madd([[b'y'; 16]], None).await.unwrap().all());
    // Through the client, the same refusals are typed.
    match client.madd([[b'y'; 17]], None).await {
        Err(ClientError::Server { message, .. }) => {
            assert!(message.contains("max_item_bytes"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    match client.mcontains(items("j", 9)).await {
        Err(ClientError::Server { message, .. }) => {
            assert!(message.contains("max_batch_items"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    h.shutdown().await.unwrap();
}

/// Items a full cuckoo filter cannot take fail one by one; the reply says which.
#[actix::test]
async fn madd_reports_the_items_a_full_filter_refused() {
    let server = NatsServer::start();
    let h = start(cfg("tiny", FilterKind::OrCuckoo, 64, 0.01), &server.url()).await;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "tiny");
    let batch1 = items("t", 500);
    let r = client.madd(&batch1, None).await.unwrap();
    let added = r.count();
    assert!(
        added > 0 && added < 500,
        "{added} of 500 added to a 64-item filter"
    );
    assert!(r.error.as_deref().unwrap().contains("full"), "{r:?}");
    for (item, ok) in batch1.iter().zip(&r.added) {
        if *ok {
            assert!(
                h.contains(item.as_bytes()),
                "{item} reported added, not contained"
            );
        }
    }
    // In JSON: the count, the indices that failed, and the first error.
    let batch2 = items("u", 100);
    let m = raw(
        &nc,
        "crpf.tiny.api.madd".into(),
        batch::encode(&batch2).unwrap(),
        &[],
    )
    .await;
    let v = json_of(&m);
    let failed = v["failed"].as_array().expect("failed indices").len();
    assert!(failed > 0, "{v}");
    assert_eq!(v["added"].as_u64().unwrap() as usize + failed, 100, "{v}");
    assert!(v["error"].as_str().unwrap().contains("full"), "{v}");
    // Bitmap replies carry the first error in a header.
    let m = raw(
        &nc,
        "crpf.tiny.api.madd".into(),
        batch::encode(items("v", 100)).unwrap(),
        &[(REPLY_HEADER, "bitmap")],
    )
    .await;
    assert_eq!(m.payload.len(), 13);
    assert!(header(&m, ERROR_HEADER).unwrap().contains("full"));
    let stats = h.stats().await.unwrap();
    assert!(stats.api_errors["full"] >= (500 - added + failed) as u64);
    h.shutdown().await.unwrap();
}

/// Each replica answers `<...>.replica.<id>.api.<op>` itself, from its own state.
#[actix::test]
async fn each_replica_answers_on_its_own_subjects() {
    let server = NatsServer::start();
    // Nothing leaves a replica unless flushed: no delta interval, no anti-entropy rounds in
    // the test's time, no commit by size.
    let mut c = cfg("solo", FilterKind::OrCuckoo, 10_000, 0.01);
    c.delta_interval_ms = 3_600_000;
    c.delta_max_updates = 1 << 20;
    c.anti_entropy_interval_ms = 3_600_000;
    c.peer_expiry_ms = 3 * 3_600_000;
    let a = start(c.clone(), &server.url()).await;
    let b = start(c, &server.url()).await;
    let (ida, idb) = (a.identity().replica, b.identity().replica);
    assert_ne!(ida, idb);
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "solo");
    for (h, id) in [(&a, ida), (&b, idb)] {
        let s = client.replica(id).stats().await.unwrap();
        assert_eq!((s.replica, s.uuid), (id, h.identity().uuid));
        assert_eq!(client.replica(id).target(), Some(id));
    }
    let nobody = ida.max(idb) + 10;
    assert!(matches!(
        client.replica(nobody).stats().await,
        Err(ClientError::NoResponders { subject }) if subject == format!("crpf.solo.replica.{nobody}.api.stats")
    ));
    // The queue group: one of them.
    let any = client.stats().await.unwrap().replica;
    assert!(any == ida || any == idb);

    // An update on an idle link is published at once; later ones wait for the (hour-long)
    // delta interval. So after a first add has reached B...
    client
        .replica(ida)
        .add("first", Some(AckLevel::Local))
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while !client.replica(idb).contains("first").await.unwrap() {
        assert!(Instant::now() < deadline, "B never merged A's first delta");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...an item added on A alone: B does not have it until A publishes.
    client
        .replica(ida)
        .add("only-on-a", Some(AckLevel::Local))
        .await
        .unwrap();
    assert!(client.replica(ida).contains("only-on-a").await.unwrap());
    let m = raw(
        &nc,
        format!("crpf.solo.replica.{idb}.api.contains"),
        b"only-on-a".to_vec(),
        &[],
    )
    .await;
    assert_eq!(json_of(&m), json!({"contains": false}));
    assert_eq!(header(&m, REPLICA_HEADER), Some(idb.to_string().as_str()));
    let r = client
        .replica(ida)
        .madd(["a1", "a2"], Some(AckLevel::Local))
        .await
        .unwrap();
    assert!(r.all());
    assert_eq!(
        client.replica(idb).mcontains(["a1", "a2"]).await.unwrap(),
        [false, false]
    );
    a.flush().await.unwrap();
    let deadline = Instant::now() + WAIT;
    while client
        .replica(idb)
        .mcontains(["only-on-a", "a1", "a2"])
        .await
        .unwrap()
        != [true; 3]
    {
        assert!(Instant::now() < deadline, "B never merged A's delta");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The bare per-replica subject gets an error, like the shared one.
    let m = raw(&nc, format!("crpf.solo.replica.{ida}.api"), vec![], &[]).await;
    assert!(error_of(&m).contains("no operation"));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A `durable` batch is in the write-ahead log when it is answered; a `replicated` one is
/// merged by the peer.
#[actix::test]
async fn acknowledged_batch_adds_are_durable_or_replicated() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg("acked", FilterKind::OrCuckoo, 20_000, 0.001);
    // No snapshot in the test's time: the log alone holds what was acknowledged. No commit
    // by time or size either: only the acknowledgement level makes one.
    c.snapshot_interval_ms = 3_600_000;
    c.delta_interval_ms = 3_600_000;
    c.delta_max_updates = 1 << 20;
    let mut durable = c.clone();
    durable.data_dir = Some(dir.path().join("a"));
    // A batch far larger than one tag reservation: reserved block by block as it goes.
    durable.tag_reserve_block = 64;
    let a = start(durable.clone(), &server.url()).await;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "acked").replica(a.identity().replica);
    let logged = items("d", 3000);
    let r = client.madd(&logged, Some(AckLevel::Durable)).await.unwrap();
    assert!(r.all(), "{r:?}");
    let clock = a.read(|f| f.clock());
    let reserved = saved_reservation(&dir.path().join("a"));
    assert!(
        clock >= 3000 && reserved >= clock,
        "every tag issued was reserved first: clock {clock}, reserved {reserved}"
    );
    let (replayed, log) = replay_log(&dir.path().join("a"), &a, &durable);
    assert!(!log.torn, "{log:?}");
    assert!(log.records > 0);
    let missing = logged
        .iter()
        .filter(|i| !replayed.contains(i.as_bytes()))
        .count();
    assert_eq!(missing, 0, "acknowledged as durable, not in the log");

    // Replicated: B has merged the batch when A answers.
    let (b, spread) = replicated_batch(c, &server.url(), &a, &client, 2000).await;
    // `mremove` shares the commit machinery.
    let removed = client
        .mremove(&spread[..10], Some(AckLevel::Replicated))
        .await
        .unwrap();
    assert_eq!(removed, [true; 10]);
    assert_eq!(a.stats().await.unwrap().awaiting_ack, 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Adds at `local` to a grow-only kind are applied in the subscription task that receives them,
/// not on the actor; adds that wait for a commit go to the actor. What the actor does for them
/// all still happens: an add acknowledged at `durable` is in the write-ahead log, one at
/// `replicated` is merged by the peer, a pending delta filled by `local` adds is committed at
/// once (no periodic commit in the test's time), and the state's digest covers them.
#[actix::test]
async fn updates_applied_off_the_actor_are_committed_logged_replicated_and_digested() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg("direct", FilterKind::GCuckoo, 20_000, 0.001);
    c.snapshot_interval_ms = 3_600_000;
    c.delta_interval_ms = 3_600_000;
    c.delta_max_updates = 1_000;
    let mut durable = c.clone();
    durable.data_dir = Some(dir.path().join("a"));
    let a = start(durable.clone(), &server.url()).await;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "direct").replica(a.identity().replica);
    let log_holds = |items: &[String]| {
        let (replayed, log) = replay_log(&dir.path().join("a"), &a, &durable);
        assert!(!log.torn, "{log:?}");
        items.iter().all(|i| replayed.contains(i.as_bytes()))
    };

    let logged = items("d", 300);
    let r = client.madd(&logged, Some(AckLevel::Durable)).await.unwrap();
    assert!(r.all(), "{r:?}");
    client
        .add("d-single", Some(AckLevel::Durable))
        .await
        .unwrap();
    assert!(
        log_holds(&logged) && log_holds(&["d-single".to_string()]),
        "acknowledged as durable, not in the log"
    );

    // At `local` the answer comes at once; a batch that fills the pending delta has the
    // subscription task ask the actor for a commit, which the log then holds.
    let full = items("l", 1_500);
    let r = client.madd(&full, Some(AckLevel::Local)).await.unwrap();
    assert!(r.all(), "{r:?}");
    let deadline = Instant::now() + WAIT;
    while !log_holds(&full) {
        assert!(
            Instant::now() < deadline,
            "a full pending delta was never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The digest covers what was applied outside the actor.
    let before = a.stats().await.unwrap().digest;
    client.add("after", Some(AckLevel::Local)).await.unwrap();
    let after = a.stats().await.unwrap().digest;
    assert_ne!(
        before, after,
        "the digest missed an update applied off the actor"
    );

    let (b, _) = replicated_batch(c, &server.url(), &a, &client, 500).await;
    let s = a.stats().await.unwrap();
    assert_eq!(s.awaiting_ack, 0, "{s:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Queries are answered off the actor, from the shared state. While one client adds (each
/// add acknowledged before the next) to a scalable filter that keeps expanding, and a second
/// replica's deltas are merged meanwhile, concurrent queries of the acknowledged items to the
/// same replica never miss one: no torn state, and nothing acknowledged but not yet visible.
#[actix::test]
async fn queries_off_the_actor_never_miss_an_acknowledged_add() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let server = NatsServer::start();
    let url = server.url();
    // A small first sub-filter: the adds below go through several expansions.
    let c = cfg("reads", FilterKind::ScOrCuckoo, 200, 0.01);
    let a = start(c.clone(), &url).await;
    let b = start(c, &url).await;
    let nc = async_nats::connect(&url).await.unwrap();
    let client = Client::new(nc, "crpf", "reads").replica(a.identity().replica);
    let items = items("r", 2_000);
    let acked = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));

    let writer = {
        let (client, items, acked, done) =
            (client.clone(), items.clone(), acked.clone(), done.clone());
        async move {
            for (i, item) in items.iter().enumerate() {
                client.add(item, None).await.unwrap();
                acked.store(i + 1, Ordering::Release);
            }
            done.store(true, Ordering::Release);
        }
    };
    let other = {
        let (b, done) = (b.clone(), done.clone());
        async move {
            let mut i = 0;
            while !done.load(Ordering::Acquire) {
                b.add(format!("other-{i}")).await.unwrap();
                i += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let reader = |single: bool| {
        let (client, items, acked, done) =
            (client.clone(), items.clone(), acked.clone(), done.clone());
        async move {
            let mut queries = 0u32;
            while !done.load(Ordering::Acquire) {
                let n = acked.load(Ordering::Acquire);
                if n == 0 {
                    tokio::task::yield_now().await;
                    continue;
                }
                if single {
                    let last = &items[n - 1];
                    assert!(client.contains(last).await.unwrap(), "{last} missed");
                } else {
                    let found = client.mcontains(&items[..n]).await.unwrap();
                    let missed: Vec<_> = (0..n).filter(|&i| !found[i]).collect();
                    assert!(missed.is_empty(), "acknowledged adds missed: {missed:?}");
                }
                queries += 1;
            }
            queries
        }
    };
    let ((), (), q1, q2) = futures::join!(writer, other, reader(true), reader(false));
    assert!(q1 > 0 && q2 > 0, "the readers never ran: {q1} {q2}");
    let s = a.stats().await.unwrap();
    // The reads did run across expansions and merges.
    assert!(s.figures.sub_filters > 1 && s.deltas_merged > 0, "{s:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// `count` and `mcount` answer multiplicities of a counting filter; other kinds answer an
/// error that says so.
#[actix::test]
async fn count_and_mcount_answer_multiplicities() {
    let server = NatsServer::start();
    let h = start(
        cfg("bag", FilterKind::CountingCuckoo, 1000, 0.01),
        &server.url(),
    )
    .await;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "bag");
    for _ in 0..3 {
        client.add("pear", None).await.unwrap();
    }
    assert!(client.madd(["pear", "plum"], None).await.unwrap().all());
    assert!(client.remove("plum", None).await.unwrap());
    assert!(
        !client.remove("plum", None).await.unwrap(),
        "never below zero"
    );
    assert_eq!(client.count("pear").await.unwrap(), 4);
    assert_eq!(
        client.mcount(["pear", "plum", "fig"]).await.unwrap(),
        vec![4, 0, 0]
    );
    assert_eq!(h.count(b"pear").unwrap(), 4);

    let g = start(cfg("set", FilterKind::GBloom, 1000, 0.01), &server.url()).await;
    let plain = Client::new(nc, "crpf", "set");
    match plain.count("pear").await {
        Err(ClientError::Server { message, .. }) => {
            assert!(message.contains("does not count"), "{message}")
        }
        other => panic!("count on g_bloom: {other:?}"),
    }
    stop(&[h, g]).await;
}

/// Issue 27, point 5: a replica that stops answering (SIGSTOP: its NATS connection stays up,
/// so the queue group keeps routing to it) costs a read one attempt, not its answer.
#[actix::test]
async fn reads_go_around_a_stopped_replica() {
    use nats_harness::{cluster_key_line, free_port, spawn_node};
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..2 {
        let config = dir.path().join(format!("node{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\n{}\n\
                 [nats]\nservers = [\"{}\"]\n\n[catalog]\nenabled = false\n\n\
                 [[filters]]\nname = \"reads\"\n\
                 filter = {{ kind = \"g_bloom\", capacity = 10000, fpr = 0.001 }}\n\
                 delta_interval_ms = 20\nanti_entropy_interval_ms = 300\ncatch_up_timeout_ms = 500\n",
                free_port(),
                cluster_key_line(),
                server.url()
            ),
        )
        .unwrap();
        nodes.push(spawn_node(&format!("node{i}"), &config, dir.path()));
    }
    let nc = async_nats::connect(server.url()).await.unwrap();
    let client = Client::new(nc, "crpf", "reads").with_timeout(Duration::from_secs(3));
    // Both replicas ready, and known to the client (it learns them from their answers).
    let deadline = Instant::now() + WAIT;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "replicas answering: {seen:?}");
        if let Ok(s) = client.stats().await
            && s.ready
        {
            seen.insert(s.replica);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.add("present", None).await.unwrap();
    for id in &seen {
        let one = client.replica(*id);
        let deadline = Instant::now() + WAIT;
        while !one.contains("present").await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "replica {id} never merged the add"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    assert_eq!(unsafe { libc::kill(nodes[1].pid(), libc::SIGSTOP) }, 0);
    let reads = 20;
    let mut answered = 0;
    for _ in 0..reads {
        if client.contains("present").await.unwrap() {
            answered += 1;
        }
    }
    // Without the second attempt, the stopped replica takes its share of the reads.
    let single = client
        .clone()
        .with_timeout(Duration::from_millis(300))
        .with_read_attempts(1);
    let mut timed_out = 0;
    for _ in 0..reads {
        match single.contains("present").await {
            Ok(true) => {}
            Err(ClientError::Timeout { .. }) => timed_out += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(unsafe { libc::kill(nodes[1].pid(), libc::SIGCONT) }, 0);
    assert_eq!(answered, reads, "reads with retries that found the item");
    assert!(
        timed_out > 0,
        "no read went to the stopped replica: the check above proves nothing"
    );
    println!(
        "{reads} of {reads} reads answered with retries; {timed_out} of {reads} timed out without"
    );
    for mut n in nodes {
        n.terminate(Duration::from_secs(20));
    }
}

/// Adds acknowledged at `durable` of items a peer added first (so that their bits, or their
/// entry, came with a merge the log does not hold) are in the log all the same: for every
/// kind whose add of a held item changes nothing, by every way an add arrives (a batch and a
/// single add over NATS, an add of the handle). Replayed alone, the log holds them all: a
/// crash before the next snapshot loses none. (The deterministic simulation found this loss;
/// see `UnloggedMerges`.)
#[actix::test]
async fn durable_adds_of_items_a_peer_added_first_are_logged() {
    let server = NatsServer::start();
    for kind in [
        FilterKind::GBloom,
        FilterKind::BlockedBloom,
        FilterKind::GoBloom,
        FilterKind::ScGBloom,
        FilterKind::WriterScGBloom,
        FilterKind::GCuckoo,
        FilterKind::ScGCuckoo,
        FilterKind::WriterScGCuckoo,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("peer-first-{kind}");
        let mut c = cfg(&name, kind, 20_000, 0.001);
        // No snapshot in the test's time: the log alone holds what was acknowledged.
        c.snapshot_interval_ms = 3_600_000;
        let mut durable = c.clone();
        durable.data_dir = Some(dir.path().join("a"));
        let a = start(durable.clone(), &server.url()).await;
        let b = start(c, &server.url()).await;
        let batch = items("batch", 200);
        let single = items("single", 5);
        let by_handle = items("handle", 5);
        let all: Vec<&String> = batch.iter().chain(&single).chain(&by_handle).collect();
        for i in &all {
            b.add(i.as_bytes()).await.unwrap();
        }
        assert!(
            converged(&[a.clone(), b.clone()], Duration::from_secs(20)).await,
            "{kind}: A never merged B's adds"
        );
        let client = Client::new(
            async_nats::connect(server.url()).await.unwrap(),
            "crpf",
            &name,
        )
        .replica(a.identity().replica);
        let r = client.madd(&batch, Some(AckLevel::Durable)).await.unwrap();
        assert!(r.all(), "{kind}: {r:?}");
        for i in &single {
            client.add(i, Some(AckLevel::Durable)).await.unwrap();
        }
        for i in &by_handle {
            a.add_with(i.as_bytes(), AckLevel::Durable).await.unwrap();
        }
        let (replayed, log) = replay_log(&dir.path().join("a"), &a, &durable);
        assert!(!log.torn, "{kind}: {log:?}");
        let missing: Vec<&&String> = all
            .iter()
            .filter(|i| !replayed.contains(i.as_bytes()))
            .collect();
        assert!(
            missing.is_empty(),
            "{kind}: acknowledged as durable, not in the log: {} of {}",
            missing.len(),
            all.len()
        );
        stop(&[a, b]).await;
    }
}

/// Issue 50: the count-min sketch's operations over NATS (plain async-nats, no crpf code):
/// `cms.incrby` (a batch of pairs, each item then its increment in decimal) answers each
/// item's estimate right after its increment, as `CMS.INCRBY` does; `cms.query` and
/// `cms.info` read; an increment acknowledged `replicated` is in the peer's own answer; a
/// malformed request or another kind is refused with nothing changed.
#[actix::test]
async fn cms_operations_increment_query_and_describe_a_sketch() {
    let server = NatsServer::start();
    let c = cfg("hits", FilterKind::CountMinSketch, 200, 0.01);
    let a = start(c.clone(), &server.url()).await;
    let b = start(c, &server.url()).await;
    let deadline = Instant::now() + WAIT;
    while a.stats().await.unwrap().peers < 1 || b.stats().await.unwrap().peers < 1 {
        assert!(
            Instant::now() < deadline,
            "the replicas never heard each other"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ida = a.identity().replica;
    let idb = b.identity().replica;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let pairs = |pairs: &[(&str, &str)]| {
        let flat: Vec<&str> = pairs.iter().flat_map(|(i, n)| [*i, *n]).collect();
        batch::encode(&flat).unwrap()
    };
    let on_a = |op: &str| format!("crpf.hits.replica.{ida}.api.{op}");
    let on_b = |op: &str| format!("crpf.hits.replica.{idb}.api.{op}");
    let ack = [(ACK_HEADER, "replicated")];

    // Pair by pair: the second `a` sees the first.
    let m = raw(
        &nc,
        on_a("cms.incrby"),
        pairs(&[("a", "3"), ("b", "1"), ("a", "2"), ("c", "0")]),
        &ack,
    )
    .await;
    assert_eq!(json_of(&m), json!({"count": [3, 1, 5, 0]}));
    assert_eq!(header(&m, REPLICA_HEADER), Some(ida.to_string().as_str()));
    // Acknowledged as replicated: B answers it from its own state.
    let query = batch::encode(["a", "b", "c", "never"]).unwrap();
    let m = raw(&nc, on_b("cms.query"), query.clone(), &[]).await;
    assert_eq!(json_of(&m), json!({"count": [5, 1, 0, 0]}));
    let m = raw(&nc, on_b("cms.info"), vec![], &[]).await;
    assert_eq!(json_of(&m), json!({"width": 200, "depth": 7, "count": 6}));
    // Through the queue group, either replica, and an increment from each counts.
    let m = raw(&nc, on_b("cms.incrby"), pairs(&[("a", "10")]), &ack).await;
    assert_eq!(json_of(&m), json!({"count": [15]}));
    let m = raw(&nc, "crpf.hits.api.cms.query".into(), query, &[]).await;
    assert_eq!(json_of(&m), json!({"count": [15, 1, 0, 0]}));

    // Refused whole: an odd batch, an increment that is not a number of 0 to 2^64 - 1.
    for (payload, says) in [
        (batch::encode(["a", "1", "b"]).unwrap(), "pairs"),
        (pairs(&[("a", "1"), ("b", "-1")]), "increment"),
        (pairs(&[("a", "1"), ("b", "x")]), "increment"),
        (pairs(&[("a", "18446744073709551616")]), "increment"),
    ] {
        let m = raw(&nc, on_a("cms.incrby"), payload, &[]).await;
        let e = error_of(&m);
        assert!(e.contains(says), "{e}");
    }
    let m = raw(&nc, on_a("cms.info"), vec![], &[]).await;
    assert_eq!(json_of(&m)["count"], 16, "nothing refused was applied");

    // Another kind refuses the sketch's operations.
    let g = start(cfg("set", FilterKind::GBloom, 1000, 0.01), &server.url()).await;
    for op in ["cms.incrby", "cms.query", "cms.info"] {
        let m = raw(&nc, format!("crpf.set.api.{op}"), pairs(&[("a", "1")]), &[]).await;
        let e = error_of(&m);
        assert!(e.contains("count_min_sketch"), "{op}: {e}");
    }
    assert!(!g.contains(b"a"));
    stop(&[a, b, g]).await;
}

/// Issue 50: the t-digest's operations over NATS (plain async-nats): `tdigest.add` (a batch
/// of decimal numbers) acknowledged `replicated` is in the peer's own answers;
/// `tdigest.quantile`, `tdigest.cdf` and `tdigest.info` read (null for NaN); `tdigest.reset`
/// removes what its replica saw, on both; a malformed request or another kind is refused
/// with nothing changed.
#[actix::test]
async fn tdigest_operations_add_read_and_reset_a_digest() {
    let server = NatsServer::start();
    let c = cfg("latency", FilterKind::TDigest, 100, 0.5);
    let a = start(c.clone(), &server.url()).await;
    let b = start(c, &server.url()).await;
    let deadline = Instant::now() + WAIT;
    while a.stats().await.unwrap().peers < 1 || b.stats().await.unwrap().peers < 1 {
        assert!(
            Instant::now() < deadline,
            "the replicas never heard each other"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ida = a.identity().replica;
    let idb = b.identity().replica;
    let nc = async_nats::connect(server.url()).await.unwrap();
    let on_a = |op: &str| format!("crpf.latency.replica.{ida}.api.{op}");
    let on_b = |op: &str| format!("crpf.latency.replica.{idb}.api.{op}");
    let ack = [(ACK_HEADER, "replicated")];

    let m = raw(
        &nc,
        on_b("tdigest.quantile"),
        batch::encode(["0.5"]).unwrap(),
        &[],
    )
    .await;
    assert_eq!(json_of(&m), json!({"values": [null]}), "empty: NaN");
    let m = raw(
        &nc,
        on_a("tdigest.add"),
        batch::encode(["1", "2", "3", "4", "5"]).unwrap(),
        &ack,
    )
    .await;
    assert_eq!(json_of(&m), json!({"ok": true}));
    // Acknowledged as replicated: B answers from its own state, as RedisBloom would.
    let qs = batch::encode(["0", "0.5", "0.8", "1"]).unwrap();
    let m = raw(&nc, on_b("tdigest.quantile"), qs.clone(), &[]).await;
    assert_eq!(json_of(&m), json!({"values": [1.0, 3.0, 5.0, 5.0]}));
    let m = raw(
        &nc,
        on_b("tdigest.cdf"),
        batch::encode(["1", "5", "0", "9"]).unwrap(),
        &[],
    )
    .await;
    assert_eq!(json_of(&m), json!({"values": [0.1, 0.9, 0.0, 1.0]}));
    let m = raw(
        &nc,
        on_b("tdigest.add"),
        batch::encode(["10"]).unwrap(),
        &ack,
    )
    .await;
    assert_eq!(json_of(&m), json!({"ok": true}));
    let m = raw(&nc, on_a("tdigest.info"), vec![], &[]).await;
    let info = json_of(&m);
    assert_eq!(info["compression"], 100);
    assert_eq!(info["observations"], 6);
    assert_eq!(info["writers"], 2);
    assert_eq!(
        (info["min"].clone(), info["max"].clone()),
        (json!(1.0), json!(10.0))
    );

    // Refused whole: a value that is not a number, a quantile outside [0, 1].
    let m = raw(
        &nc,
        on_a("tdigest.add"),
        batch::encode(["7", "x"]).unwrap(),
        &[],
    )
    .await;
    assert!(error_of(&m).contains("decimal"), "{}", error_of(&m));
    let m = raw(
        &nc,
        on_a("tdigest.add"),
        batch::encode(["inf"]).unwrap(),
        &[],
    )
    .await;
    assert!(error_of(&m).contains("finite"), "{}", error_of(&m));
    let m = raw(
        &nc,
        on_a("tdigest.quantile"),
        batch::encode(["1.5"]).unwrap(),
        &[],
    )
    .await;
    assert!(error_of(&m).contains("[0, 1]"), "{}", error_of(&m));
    let m = raw(&nc, on_a("tdigest.info"), vec![], &[]).await;
    assert_eq!(
        json_of(&m)["observations"],
        6,
        "nothing refused was applied"
    );

    // A reset at A removes what A saw, on B too once replicated.
    let m = raw(&nc, on_a("tdigest.reset"), vec![], &ack).await;
    assert_eq!(json_of(&m), json!({"ok": true}));
    let m = raw(&nc, on_b("tdigest.info"), vec![], &[]).await;
    assert_eq!(json_of(&m)["observations"], 0);
    let m = raw(&nc, "crpf.latency.api.tdigest.quantile".into(), qs, &[]).await;
    assert_eq!(json_of(&m), json!({"values": [null, null, null, null]}));

    // Another kind refuses the digest's operations.
    let g = start(cfg("set", FilterKind::GBloom, 1000, 0.01), &server.url()).await;
    for op in [
        "tdigest.add",
        "tdigest.quantile",
        "tdigest.info",
        "tdigest.reset",
    ] {
        let m = raw(
            &nc,
            format!("crpf.set.api.{op}"),
            batch::encode(["1"]).unwrap(),
            &[],
        )
        .await;
        let e = error_of(&m);
        assert!(e.contains("t_digest"), "{op}: {e}");
    }
    stop(&[a, b, g]).await;
}

/// Issue 50: three `top_k` replicas over a real nats-server, each adding its third of one
/// skewed stream through `topk.add` on its own subjects, all three at once. Once converged,
/// every replica holds every writer's heap and lists the same items with the same counts
/// (`topk.list`), and that list is the exact top k of every add: the table is wide enough that
/// the heavy items' counters are exact, so the merged list is not only common but right.
#[actix::test]
async fn three_topk_replicas_writing_concurrently_list_the_same_top_k() {
    let server = NatsServer::start();
    let mut c = cfg("heavy", FilterKind::TopK, 5, 0.9);
    c.filter = crpf::FilterSpec::top_k(5, 2000, 5, 0.9);
    let mut hs = Vec::new();
    for _ in 0..3 {
        hs.push(start(c.clone(), &server.url()).await);
    }
    let deadline = Instant::now() + WAIT;
    for h in &hs {
        while h.stats().await.unwrap().peers < 2 {
            assert!(
                Instant::now() < deadline,
                "the replicas never heard each other"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Six heavy items (the sixth just outside the top 5) among 600 light ones, shuffled and
    // dealt round-robin to the three writers.
    let heavy = [300u64, 250, 200, 150, 100, 60];
    let mut stream: Vec<String> = Vec::new();
    for (i, n) in heavy.iter().enumerate() {
        stream.extend((0..*n).map(|_| format!("hot-{i}")));
    }
    stream.extend((0..600).flat_map(|i| std::iter::repeat_n(format!("cold-{i}"), 1 + i % 2)));
    let mut rng = fastrand::Rng::with_seed(50);
    rng.shuffle(&mut stream);
    let nc = async_nats::connect(server.url()).await.unwrap();
    let write = |r: usize| {
        let nc = nc.clone();
        let id = hs[r].identity().replica;
        let mine: Vec<String> = stream.iter().skip(r).step_by(3).cloned().collect();
        async move {
            for chunk in mine.chunks(16) {
                let subject = format!("crpf.heavy.replica.{id}.api.topk.add");
                let m = raw(&nc, subject, batch::encode(chunk).unwrap(), &[]).await;
                let expelled = json_of(&m)["expelled"].as_array().cloned();
                assert_eq!(expelled.map(|e| e.len()), Some(chunk.len()), "{m:?}");
            }
        }
    };
    futures::join!(write(0), write(1), write(2));
    assert!(converged(&hs, WAIT).await, "replicas did not converge");

    let expected: Vec<Value> = (0..5).map(|i| json!(format!("hot-{i}"))).collect();
    let counts: Vec<Value> = heavy[..5].iter().map(|n| json!(n)).collect();
    let mut lists = Vec::new();
    for h in &hs {
        let writers = h.read(|f| match f {
            crpf::replica::AnyFilter::TopK(t) => t.writers(),
            other => panic!("a {} filter", other.kind()),
        });
        assert_eq!(writers, 3, "every writer's heap on every replica");
        let subject = format!("crpf.heavy.replica.{}.api.topk.list", h.identity().replica);
        let list = json_of(&raw(&nc, subject, vec![], &[]).await);
        assert_eq!(list["items"], json!(expected), "{list}");
        assert_eq!(list["count"], json!(counts), "{list}");
        let s = h.stats().await.unwrap();
        assert!(s.deltas_sent > 0 && s.deltas_merged > 0, "{s:?}");
        assert!(s.rejects.is_empty(), "{s:?}");
        lists.push(list);
    }
    assert!(lists.windows(2).all(|w| w[0] == w[1]), "{lists:?}");
    hs.reverse();
    stop(&hs).await;
}
