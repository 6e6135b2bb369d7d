//! Replicas on the in-process bus: convergence, loss repair, bad input, durability, the API.

mod replica_common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crpf::replica::durable::{HWM_FILE, SNAPSHOT_FILE};
use crpf::replica::{AnyFilter, Replica, ReplicaError};
use crpf::transport::{
    FaultConfig, FaultyTransport, IdRegistry, InProcessBus, Subjects, Transport,
};
use crpf::wire::{Body, Envelope, FilterKind};
use replica_common::*;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

#[actix::test]
async fn three_or_replicas_converge_under_concurrent_adds_and_removes() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let cfg = cfg("orset", FilterKind::OrCuckoo, 20_000, 0.001);
    let hs = start_n(3, &cfg, bus).await;
    let ids: std::collections::BTreeSet<_> = hs.iter().map(|h| h.identity().replica).collect();
    assert_eq!(ids.len(), 3, "distinct replica ids");
    let (a, b, c) = futures::join!(
        workload(&hs[0], "a", 1, 1500),
        workload(&hs[1], "b", 2, 1500),
        workload(&hs[2], "c", 3, 1500)
    );
    let mut log = a;
    log.extend(b);
    log.extend(c);
    assert!(converged(&hs, WAIT).await, "replicas did not converge");
    check_or_semantics(&hs, &log);
    for h in &hs {
        let s = h.stats().await.unwrap();
        assert!(s.deltas_sent > 0 && s.deltas_merged > 0, "{s:?}");
        assert!(s.rejects.is_empty(), "{s:?}");
    }
    stop(&hs).await;
}

#[actix::test]
async fn every_kind_replicates() {
    for &kind in FilterKind::ALL {
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        let hs = start_n(2, &cfg("k", kind, 2_000, 0.01), bus).await;
        for i in 0..500u32 {
            hs[(i % 2) as usize]
                .add(i.to_le_bytes().to_vec())
                .await
                .unwrap();
        }
        assert!(converged(&hs, WAIT).await, "{kind}");
        for h in &hs {
            assert!((0..500u32).all(|i| h.contains(&i.to_le_bytes())), "{kind}");
        }
        if !kind.removable() {
            assert!(matches!(
                hs[0].remove(b"x".to_vec()).await,
                Err(ReplicaError::NotRemovable(_))
            ));
        }
        stop(&hs).await;
    }
}

#[actix::test]
async fn anti_entropy_repairs_lost_deltas() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    // Every replica loses 40% of the deltas it publishes; states travel intact.
    let faulty: Vec<FaultyTransport> = (0..3)
        .map(|i| {
            FaultyTransport::new(
                bus.clone(),
                FaultConfig {
                    drop_delta: 0.4,
                    drop_state: 0.0,
                    seed: i,
                },
            )
        })
        .collect();
    let mut cfg = cfg("lossy", FilterKind::ScOrCuckoo, 500, 0.01);
    cfg.delta_max_updates = 8;
    let mut hs = Vec::new();
    for f in &faulty {
        hs.push(
            Replica::start(cfg.clone(), Arc::new(f.clone()))
                .await
                .unwrap(),
        );
    }
    let (a, b, c) = futures::join!(
        workload(&hs[0], "a", 11, 800),
        workload(&hs[1], "b", 12, 800),
        workload(&hs[2], "c", 13, 800)
    );
    let mut log = a;
    log.extend(b);
    log.extend(c);
    assert!(converged(&hs, WAIT).await, "anti-entropy did not repair");
    check_or_semantics(&hs, &log);
    let dropped: u64 = faulty.iter().map(|f| f.dropped()).sum();
    assert!(dropped > 10, "the fault injector dropped {dropped} deltas");
    let mut gaps = 0;
    let mut merged_states = 0;
    for h in &hs {
        let s = h.stats().await.unwrap();
        gaps += s.sequence_gaps;
        merged_states += s.states_merged;
    }
    assert!(
        gaps > 0 && merged_states > 0,
        "gaps {gaps}, states merged {merged_states}"
    );
    stop(&hs).await;
}

#[actix::test]
async fn late_starter_and_healed_partition_converge() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let cfg = cfg("late", FilterKind::GBloom, 10_000, 0.01);
    let a = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    for i in 0..1000u32 {
        a.add(i.to_le_bytes().to_vec()).await.unwrap();
    }
    a.flush().await.unwrap();
    // B starts after A's deltas are gone: it catches up from A's state before it is ready.
    let b = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert!(b.wait_ready(WAIT).await);
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);

    // C is cut off while everyone adds, then heals.
    let cut = FaultyTransport::new(bus.clone(), FaultConfig::default());
    let c = Replica::start(cfg, Arc::new(cut.clone())).await.unwrap();
    assert!(c.wait_ready(WAIT).await);
    cut.set_partitioned(true);
    for i in 1000..1500u32 {
        a.add(i.to_le_bytes().to_vec()).await.unwrap();
        c.add((i + 10_000).to_le_bytes().to_vec()).await.unwrap();
    }
    // Cut off: nothing of a's reaches c while the partition lasts.
    assert!(!c.contains(&1400u32.to_le_bytes()) || !a.contains(&11_400u32.to_le_bytes()));
    cut.set_partitioned(false);
    let all = [a.clone(), b.clone(), c.clone()];
    assert!(converged(&all, WAIT).await, "partition did not heal");
    assert!(
        all.iter()
            .all(|h| h.contains(&11_400u32.to_le_bytes()) && h.contains(&1400u32.to_le_bytes()))
    );
    stop(&all).await;
}

#[actix::test]
async fn bad_input_is_rejected_counted_and_harmless() {
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let mut cfg = cfg("strict", FilterKind::OrCuckoo, 1000, 0.01);
    cfg.max_message_bytes = 64 << 10;
    let h = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    h.add(b"kept".to_vec()).await.unwrap();
    assert!(h.wait_ready(WAIT).await);
    // The valid delta below comes from a replica of id 9, as the registry records it.
    hold_id(&bus, "strict", 9, 1 << 20).await;
    let before = h.snapshot();
    let subjects = Subjects::new("crpf", "strict");
    let me = h.snapshot();
    let env =
        |kind, digest, body| Envelope::new("strict", kind, digest, Uuid::new_v4(), 9, 1, body);
    let good_delta = {
        let mut other = AnyFilter::new(&cfg.filter, 9).unwrap();
        other.track_deltas(true);
        other.add(b"x").unwrap();
        other.take_delta().unwrap()
    };
    let digest = me.params_digest();
    let mut v2 = env(
        FilterKind::OrCuckoo,
        digest,
        Body::Delta(good_delta.clone()),
    )
    .encode();
    v2[4] = 99;
    let valid = env(
        FilterKind::OrCuckoo,
        digest,
        Body::Delta(good_delta.clone()),
    )
    .encode();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed", b"garbage bytes".to_vec()),
        ("malformed", vec![0xff; 100]),
        ("version", v2),
        ("truncated", valid[..10].to_vec()),
        // Cut (or damaged) beyond the header: the checksum no longer matches.
        ("checksum", valid[..valid.len() - 3].to_vec()),
        (
            "kind",
            env(FilterKind::GBloom, digest, Body::Delta(good_delta.clone())).encode(),
        ),
        (
            "params",
            env(
                FilterKind::OrCuckoo,
                digest ^ 1,
                Body::Delta(good_delta.clone()),
            )
            .encode(),
        ),
        (
            "filter",
            Envelope::new(
                "other",
                FilterKind::OrCuckoo,
                digest,
                Uuid::new_v4(),
                9,
                1,
                Body::StateRequest { target: None },
            )
            .encode(),
        ),
        ("oversized", {
            let mut b = valid.clone();
            b.resize(70 << 10, 0);
            b
        }),
        // Decodes as an envelope, but the delta inside is garbage.
        (
            "malformed",
            env(FilterKind::OrCuckoo, digest, Body::Delta(vec![0x13, 0x37])).encode(),
        ),
        // A state chunk whose bytes do not match its checksum.
        (
            "chunk",
            env(
                FilterKind::OrCuckoo,
                digest,
                Body::StateChunk(crpf::wire::StateChunk {
                    transfer: 1,
                    index: 0,
                    count: 1,
                    total_len: 3,
                    checksum: 0,
                    data: vec![1, 2, 3],
                    live: false,
                }),
            )
            .encode(),
        ),
        // A chunk read live (no whole-state checksum) of a kind whose states merge whole.
        (
            "chunk",
            env(
                FilterKind::OrCuckoo,
                digest,
                Body::StateChunk(crpf::wire::StateChunk {
                    transfer: 2,
                    index: 0,
                    count: 2,
                    total_len: 6,
                    checksum: 0,
                    data: vec![1, 2, 3],
                    live: true,
                }),
            )
            .encode(),
        ),
    ];
    // Frames that decode as envelopes are checked against their subject first: a delta body
    // belongs on `.delta` only, the others on `.state` only.
    let delta_body = |bytes: &[u8]| {
        Envelope::decode(
            bytes,
            &crpf::wire::Expect {
                filter: "strict".into(),
                kind: FilterKind::OrCuckoo,
                params_digest: digest,
                generation: 0,
                max_bytes: 64 << 10,
            },
        )
        .ok()
        .map(|e| matches!(e.body, Body::Delta(_)))
    };
    let mut expected = std::collections::BTreeMap::new();
    for (reason, bytes) in &cases {
        for (subject, is_delta_subject) in [(&subjects.delta, true), (&subjects.state, false)] {
            t.publish(subject.clone(), Bytes::from(bytes.clone()))
                .await
                .unwrap();
            let reason = match delta_body(bytes) {
                Some(d) if d != is_delta_subject => "subject",
                _ => reason,
            };
            *expected.entry(reason.to_string()).or_insert(0u64) += 1;
        }
    }
    // A valid delta on the state subject, or on a subject that is neither, is not merged.
    for subject in [
        subjects.state.clone(),
        "crpf.strict.bogus".to_string(),
        "crpf.strict.deltas".to_string(),
    ] {
        t.publish(subject, Bytes::from(valid.clone()))
            .await
            .unwrap();
        *expected.entry("subject".to_string()).or_insert(0u64) += 1;
    }
    // A request on the bare API subject is the API's to answer (an API error), not a
    // replication reject.
    t.publish(subjects.api_root.clone(), Bytes::from(valid.clone()))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = h.stats().await.unwrap();
        if s.rejects == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rejects {:?}, expected {expected:?}",
            s.rejects
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        h.snapshot().equivalent(&before),
        "bad input changed the state"
    );
    wait_for(|| async {
        let s = h.stats().await.unwrap();
        s.api_errors.get("invalid_request") == Some(&1)
    })
    .await;
    // Still serving, and a valid message still merges.
    assert!(h.add(b"after".to_vec()).await.is_ok());
    t.publish(subjects.delta.clone(), Bytes::from(valid))
        .await
        .unwrap();
    assert!(h.wait_until(WAIT, |f| f.contains(b"x")).await);
    // Items the API refuses.
    assert!(matches!(
        h.add(Vec::new()).await,
        Err(ReplicaError::InvalidItem(_))
    ));
    assert!(matches!(
        h.add(vec![1; (1 << 20) + 1]).await,
        Err(ReplicaError::InvalidItem(_))
    ));
    h.shutdown().await.unwrap();
}

#[actix::test]
async fn request_api_answers_json() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut api_cfg = cfg("api", FilterKind::OrCuckoo, 1000, 0.01);
    // Below the 1 MiB default, so that an item over it is easy to send.
    api_cfg.max_item_bytes = 4_096;
    let hs = start_n(2, &api_cfg, bus.clone()).await;
    for h in &hs {
        assert!(h.wait_ready(WAIT).await);
    }
    let s = Subjects::new("crpf", "api");
    let req = |op: &str, item: &[u8]| {
        bus.request(
            s.api_subject(op),
            Bytes::copy_from_slice(item),
            Duration::from_secs(5),
        )
    };
    let json = |b: Bytes| serde_json::from_slice::<serde_json::Value>(&b).unwrap();
    assert_eq!(
        json(req("add", b"k").await.unwrap()),
        serde_json::json!({"added": true})
    );
    assert!(converged(&hs, WAIT).await);
    assert_eq!(
        json(req("contains", b"k").await.unwrap()),
        serde_json::json!({"contains": true})
    );
    assert_eq!(
        json(req("remove", b"k").await.unwrap()),
        serde_json::json!({"removed": true})
    );
    assert!(converged(&hs, WAIT).await);
    assert_eq!(
        json(req("contains", b"k").await.unwrap()),
        serde_json::json!({"contains": false})
    );
    assert_eq!(
        json(req("remove", b"k").await.unwrap()),
        serde_json::json!({"removed": false})
    );
    let stats = json(req("stats", b"").await.unwrap());
    assert_eq!(stats["filter"], "api");
    assert_eq!(stats["kind"], "or_cuckoo");
    assert!(stats["capacity"].as_u64().unwrap() >= 1000);
    for (item, _) in [(&b""[..], "empty"), (&[7u8; 5000][..], "max_item_bytes")] {
        let e = json(req("add", item).await.unwrap());
        assert!(e["error"].as_str().is_some(), "{e}");
    }
    let e = json(req("frobnicate", b"x").await.unwrap());
    assert!(e["error"].as_str().unwrap().contains("unknown operation"));
    // Every API subject gets a reply: no operation, or more tokens after it.
    let e = json(
        bus.request(
            s.api_root.clone(),
            Bytes::from_static(b"x"),
            Duration::from_secs(5),
        )
        .await
        .expect("a request on the bare API subject is answered"),
    );
    assert!(e["error"].as_str().unwrap().contains("no operation"), "{e}");
    let e = json(
        req("add.more", b"x")
            .await
            .expect("api.add.more is answered"),
    );
    assert!(
        e["error"].as_str().unwrap().contains("unknown operation"),
        "{e}"
    );
    stop(&hs).await;
}

#[actix::test]
async fn big_states_replicate_in_chunks() {
    // 1 MiB max_payload, like a default NATS server; the state is over 8 MiB.
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::with_limits(1 << 20, 65_536));
    let cfg = cfg("big", FilterKind::GBloom, 7_500_000, 0.01);
    let a = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert!(a.snapshot().encode_state().len() >= 8 << 20);
    for i in 0..2000u32 {
        a.add(i.to_le_bytes().to_vec()).await.unwrap();
    }
    a.flush().await.unwrap();
    let b = Replica::start(cfg, bus).await.unwrap();
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);
    let s = b.stats().await.unwrap();
    assert!(s.states_merged >= 1, "{s:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A `g_bloom` state of many chunks is read live as it goes out and paced by its receivers:
/// two joiners whose inbound buffers hold only a little more than the pacing window (16
/// chunks) get the whole state without dropping a message, while the sender keeps adding
/// (chunks of one transfer then come from states a few adds apart). Unpaced, the sender
/// would put all of its ~75 chunks in their buffers at once.
#[actix::test]
async fn a_live_push_is_paced_by_its_receivers() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("paced", FilterKind::GBloom, 500_000, 0.01);
    cfg.chunk_bytes = 8 << 10;
    let a = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert!(a.wait_ready(WAIT).await);
    let chunks = a.snapshot().encode_state().len() / (8 << 10);
    assert!(chunks > 60, "{chunks} chunks");
    for i in 0..20_000u32 {
        a.add(i.to_le_bytes().to_vec()).await.unwrap();
    }
    let mut joiner = cfg.clone();
    joiner.max_message_bytes = 64 << 10;
    joiner.inbound_max_bytes = 20 * (9 << 10);
    let adding = {
        let a = a.clone();
        tokio::spawn(async move {
            for i in 20_000..22_000u32 {
                a.add(i.to_le_bytes().to_vec()).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let b = Replica::start(joiner.clone(), bus.clone()).await.unwrap();
    let c = Replica::start(joiner, bus).await.unwrap();
    assert!(b.wait_ready(WAIT).await && c.wait_ready(WAIT).await);
    adding.await.unwrap();
    assert!(converged(&[a.clone(), b.clone(), c.clone()], WAIT).await);
    for h in [&b, &c] {
        assert!((0..22_000u32).all(|i| h.contains(&i.to_le_bytes())));
        let s = h.stats().await.unwrap();
        assert!(s.states_merged >= 1, "{s:?}");
        assert_eq!(s.dropped, 0, "nothing dropped: {s:?}");
        assert!(s.rejects.is_empty(), "{s:?}");
    }
    stop(&[a, b, c]).await;
}

#[actix::test]
async fn restart_from_data_dir_keeps_identity_and_never_reuses_tags() {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("durable", FilterKind::OrCuckoo, 5000, 0.01);
    cfg.data_dir = Some(dir.path().join("r1"));
    cfg.tag_reserve_block = 100;
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    let id = h.identity();
    let mut dots = Vec::new();
    for i in 0..250u32 {
        dots.push(h.add(i.to_le_bytes().to_vec()).await.unwrap().unwrap());
    }
    // A snapshot now, then more adds that only the reservation file knows about.
    h.persist().await.unwrap();
    for i in 250..300u32 {
        dots.push(h.add(i.to_le_bytes().to_vec()).await.unwrap().unwrap());
    }
    // Simulate a crash: stop the actor without the final snapshot, by restoring the older
    // snapshot file after a clean shutdown.
    let snap = std::fs::read(dir.path().join("r1").join(SNAPSHOT_FILE)).unwrap();
    h.shutdown().await.unwrap();
    std::fs::write(dir.path().join("r1").join(SNAPSHOT_FILE), &snap).unwrap();

    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert_eq!(h.identity(), id, "restored identity");
    assert!((0..250u32).all(|i| h.contains(&i.to_le_bytes())));
    let max_before = dots.iter().map(|d| d.counter).max().unwrap();
    let next = h.add(b"after restart".to_vec()).await.unwrap().unwrap();
    assert_eq!(next.replica, id.replica);
    assert!(
        next.counter > max_before,
        "tag {next:?} at or below {max_before}"
    );
    h.shutdown().await.unwrap();

    // A damaged snapshot is never loaded: the replica starts afresh under a new id.
    let path = dir.path().join("r1").join(SNAPSHOT_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert_ne!(h.identity().replica, id.replica);
    assert_ne!(h.identity().uuid, id.uuid);
    assert!(h.snapshot().dots().is_empty(), "a fresh state");
    h.shutdown().await.unwrap();

    // A snapshot without its reservation file keeps the state but issues tags under a new id.
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    let id2 = h.identity();
    h.add(b"y".to_vec()).await.unwrap();
    h.shutdown().await.unwrap();
    std::fs::remove_file(dir.path().join("r1").join(HWM_FILE)).unwrap();
    let h = Replica::start(cfg, bus).await.unwrap();
    assert!(h.contains(b"y"));
    assert_ne!(h.identity().replica, id2.replica);
    h.shutdown().await.unwrap();
}

/// A restart that changed nothing, and a stop with nothing new, write no file (their fsyncs
/// made a node of 10,000 filters take minutes to start); any change is written as before.
#[actix::test]
async fn a_restart_that_changed_nothing_writes_nothing() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("quiet", FilterKind::GBloom, 5000, 0.01);
    cfg.data_dir = Some(dir.path().join("r"));
    // Every file is replaced by a rename when written: a new inode.
    let inode = || {
        std::fs::metadata(dir.path().join("r").join(SNAPSHOT_FILE))
            .unwrap()
            .ino()
    };
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    let id = h.identity();
    for i in 0..100u32 {
        h.add(i.to_le_bytes().to_vec()).await.unwrap();
    }
    h.shutdown().await.unwrap();
    let written = inode();
    // A kind without tags keeps no reservation: its identity needs none.
    assert!(!dir.path().join("r").join(HWM_FILE).exists());

    for _ in 0..2 {
        let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
        assert_eq!(h.identity(), id);
        assert!((0..100u32).all(|i| h.contains(&i.to_le_bytes())));
        assert_eq!(inode(), written, "an unchanged start wrote");
        h.shutdown().await.unwrap();
        assert_eq!(inode(), written, "a stop with nothing new wrote");
    }

    // A change is saved at the stop, and found at the next start.
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    h.add(b"later".to_vec()).await.unwrap();
    h.shutdown().await.unwrap();
    let after = inode();
    assert_ne!(after, written, "the change's snapshot");
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert!(h.contains(b"later"));
    assert_eq!(h.identity(), id);
    h.shutdown().await.unwrap();
    assert_eq!(inode(), after);

    // A kind with tags keeps its reservation beside the snapshot, and without it the
    // identity cannot be kept: written afresh under a new one.
    let mut cfg = cfg.clone();
    cfg.name = "tagged".into();
    cfg.filter = crpf::FilterSpec::new(FilterKind::OrCuckoo, 5000, 0.01);
    cfg.data_dir = Some(dir.path().join("t"));
    let h = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    let id = h.identity();
    h.add(b"x".to_vec()).await.unwrap();
    h.shutdown().await.unwrap();
    assert!(dir.path().join("t").join(HWM_FILE).exists());
    std::fs::remove_file(dir.path().join("t").join(HWM_FILE)).unwrap();
    let h = Replica::start(cfg, bus).await.unwrap();
    assert!(h.contains(b"x"));
    assert_ne!(h.identity().uuid, id.uuid);
    assert!(dir.path().join("t").join(HWM_FILE).exists());
    h.shutdown().await.unwrap();
}

#[actix::test]
async fn a_snapshot_of_another_filter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("one", FilterKind::GBloom, 1000, 0.01);
    cfg.data_dir = Some(dir.path().to_path_buf());
    Replica::start(cfg.clone(), bus.clone())
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    cfg.filter.capacity = 2000;
    let err = Replica::start(cfg, bus).await.unwrap_err();
    assert!(matches!(err, ReplicaError::Durable(_)), "{err}");
}

/// Issue 8, finding 5: no single message may poison a replica. Each forged message below is
/// well-formed (it passes every frame check); what it tries to move is bounded or refused,
/// and the replica's state and clock stay as they were.
#[actix::test]
async fn forged_messages_move_no_clock_sequence_or_transfer_state() {
    use crpf::wire::chunk_state;
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let mut cfg = cfg("poison", FilterKind::OrCuckoo, 1000, 0.01);
    cfg.max_peers = 8;
    let h = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    assert!(h.wait_ready(WAIT).await);
    h.add(b"kept".to_vec()).await.unwrap();
    let subjects = Subjects::new("crpf", "poison");
    let me = h.identity().replica;
    let digest = h.snapshot().params_digest();
    let clock = h.read(|f| f.clock());
    let env = |sender: Uuid, seq: u64, body| {
        Envelope::new("poison", FilterKind::OrCuckoo, digest, sender, 9, seq, body).encode()
    };
    let publish = |subject: &String, frame: Vec<u8>| {
        let (t, subject) = (t.clone(), subject.clone());
        async move { t.publish(subject, Bytes::from(frame)).await.unwrap() }
    };

    // 1. A delta whose removed entry carries OUR id with a timestamp near the end of the
    //    clock (the 193-byte message that stopped all adds forever).
    let poisoned = {
        let mut f = AnyFilter::new(&cfg.filter, me).unwrap();
        f.advance_clock(crpf::MAX_COUNTER - 10);
        f.track_deltas(true);
        f.add(b"poison").unwrap();
        f.remove(b"poison").unwrap();
        f
    };
    let mut poisoned_delta = poisoned.clone();
    let delta = poisoned_delta.take_delta().unwrap();
    let forger = Uuid::new_v4();
    publish(&subjects.delta, env(forger, 1, Body::Delta(delta))).await;
    // 2. The same as a full state.
    for (i, c) in chunk_state(&poisoned.encode_state(), 1, 1 << 20)
        .into_iter()
        .enumerate()
    {
        publish(
            &subjects.state,
            env(forger, 2 + i as u64, Body::StateChunk(c)),
        )
        .await;
    }
    wait_for(|| async { rejects(&h, "own_tag_ahead").await == 2 }).await;
    assert_eq!(
        h.read(|f| f.clock()),
        clock,
        "a remote message moved our clock"
    );
    assert!(h.add(b"still adds".to_vec()).await.is_ok());

    // 3. A sequence number of u64::MAX: past what a loss can count, so taken for a restart
    //    (no gap, no wrap); the sender's next message (its count restarted) is no gap
    //    either, and a jump of 10 after it counts 10.
    let gaps = h.stats().await.unwrap().sequence_gaps;
    let seqs = Uuid::new_v4();
    for seq in [1, u64::MAX, 2, 13] {
        let body = Body::StateRequest {
            target: Some(Uuid::nil()),
        };
        publish(&subjects.state, env(seqs, seq, body)).await;
    }
    wait_for(|| async { h.stats().await.unwrap().sequence_gaps > gaps }).await;
    let after = h.stats().await.unwrap().sequence_gaps;
    assert_eq!(after - gaps, 10, "the forged number counted gaps");

    // 4. A full state with transfer id u64::MAX, then one with transfer id 1 from the same
    //    sender: both merge (ids are only compared for equality).
    // One peer's state as it grows (distinct items under one replica id need one filter),
    // under ids the registry holds (tags of ids it does not are refused: see
    // `forged_tags_are_held_against_the_registry`).
    for id in [55, 77] {
        hold_id(&bus, "poison", id, 1 << 20).await;
    }
    let mut peer = AnyFilter::new(&cfg.filter, 77).unwrap();
    let sender = Uuid::new_v4();
    for (transfer, seq, item) in [(u64::MAX, 1, b"first".as_slice()), (1, 2, b"second")] {
        peer.add(item).unwrap();
        for c in chunk_state(&peer.encode_state(), transfer, 1 << 20) {
            publish(&subjects.state, env(sender, seq, Body::StateChunk(c))).await;
        }
    }
    assert!(
        h.wait_until(WAIT, |f| f.contains(b"first") && f.contains(b"second"))
            .await
    );

    // 5. A flood of forged senders: at most `max_peers` are tracked, the rest rejected.
    for _ in 0..40 {
        let digest_msg = Body::Digest {
            digest: 1,
            ready: false,
            sent: None,
            spacing: None,
        };
        publish(&subjects.state, env(Uuid::new_v4(), 1, digest_msg)).await;
    }
    wait_for(|| async { rejects(&h, "too_many_peers").await > 0 }).await;
    assert!(h.stats().await.unwrap().peers <= 8);

    // 6. Replaying a valid delta changes nothing the first merge did not.
    let mut other = AnyFilter::new(&cfg.filter, 55).unwrap();
    other.track_deltas(true);
    other.add(b"replayed").unwrap();
    let d = other.take_delta().unwrap();
    // (From a peer already tracked: the flood above filled every place for new ones.)
    let replayer = sender;
    publish(&subjects.delta, env(replayer, 3, Body::Delta(d.clone()))).await;
    assert!(h.wait_until(WAIT, |f| f.contains(b"replayed")).await);
    let once = h.snapshot();
    for seq in 4..7 {
        publish(&subjects.delta, env(replayer, seq, Body::Delta(d.clone()))).await;
    }
    h.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        h.snapshot().equivalent(&once),
        "a replayed delta changed the state"
    );
    h.shutdown().await.unwrap();
}

/// Claims `id` of `filter` in the bus's registry for a replica that is not running, with
/// tags reserved up to `reserved`.
async fn hold_id(bus: &InProcessBus, filter: &str, id: u16, reserved: u64) {
    let claimant = Uuid::new_v4();
    let claim = bus
        .claim_replica_id(filter.into(), claimant, Some(id))
        .await
        .unwrap();
    assert_eq!(claim.id, id, "id {id} is taken");
    bus.renew_claim(filter.into(), id, claimant, reserved)
        .await
        .unwrap();
}

/// Issue 27, point 4, without a cluster key: a forged tag of an id above what the registry
/// reserves for it (or of an id it does not hold) is merged by no replica, so the id's
/// holder never sees it in an honest peer's state; a forged tag of an id within its
/// reservation merges everywhere, and its holder moves its clock past it instead of refusing
/// its peers' states. The replicas stay converged and their adds keep arriving.
#[actix::test]
async fn forged_tags_are_held_against_the_registry() {
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let cfg = cfg("tags", FilterKind::OrCuckoo, 1000, 0.01);
    let mut hs = Vec::new();
    for i in 0..3 {
        let h = Replica::start(cfg.clone(), t.clone()).await.unwrap();
        assert!(h.wait_ready(WAIT).await);
        h.add(format!("item{i}").into_bytes()).await.unwrap();
        hs.push(h);
    }
    assert!(converged(&hs, WAIT).await);
    let victim = &hs[2];
    let victim_id = victim.identity().replica;
    let digest = victim.snapshot().params_digest();
    let forger = Uuid::new_v4();
    let publish = |seq: u64, delta: Vec<u8>| {
        let t = t.clone();
        async move {
            let env = Envelope::new(
                "tags",
                FilterKind::OrCuckoo,
                digest,
                forger,
                9,
                seq,
                Body::Delta(delta),
            );
            t.publish(
                Subjects::new("crpf", "tags").delta,
                Bytes::from(env.encode()),
            )
            .await
            .unwrap()
        }
    };
    let forged = |id: u16, clock: u64, item: &[u8]| {
        let mut f = AnyFilter::new(&cfg.filter, id).unwrap();
        f.advance_clock(clock);
        f.track_deltas(true);
        f.add(item).unwrap();
        f.take_delta().unwrap()
    };

    // 1. Near the end of the victim's clock (the attack that split the replicas for good):
    //    refused by its peers after a fresh look at the registry, by the victim as its own.
    publish(1, forged(victim_id, crpf::MAX_COUNTER - 10, b"high")).await;
    // 2. Of an id nobody holds.
    publish(2, forged(4000, 5, b"nobody's")).await;
    for h in &hs[..2] {
        wait_for(|| async { rejects(h, "tag_unreserved").await == 2 }).await;
    }
    wait_for(|| async { rejects(victim, "own_tag_ahead").await == 1 }).await;
    wait_for(|| async { rejects(victim, "tag_unreserved").await == 1 }).await;
    for h in &hs {
        assert!(!h.contains(b"high") && !h.contains(b"nobody's"));
    }

    // 3. Just above the victim's clock, within its reservation: merged everywhere; the
    //    victim's clock moves past it, and its next adds still arrive.
    let clock = victim.read(|f| f.clock());
    publish(3, forged(victim_id, clock + 3, b"low")).await;
    for h in &hs {
        assert!(h.wait_until(WAIT, |f| f.contains(b"low")).await);
    }
    assert!(victim.read(|f| f.clock()) >= clock + 4);
    victim.add(b"after".to_vec()).await.unwrap();
    victim.remove(b"item2".to_vec()).await.unwrap();
    for h in &hs {
        assert!(
            h.wait_until(WAIT, |f| f.contains(b"after") && !f.contains(b"item2"))
                .await
        );
    }
    assert!(converged(&hs, WAIT).await);
    for h in &hs {
        assert_eq!(
            rejects(h, "own_tag_ahead").await,
            u64::from(h.identity().replica == victim_id)
        );
    }
    stop(&hs).await;
}

async fn wait_for<F: std::future::Future<Output = bool>>(cond: impl Fn() -> F) {
    let deadline = std::time::Instant::now() + WAIT;
    while !cond().await {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A `replicated` update is answered only once peers merged it, even when it fills the pending
/// delta and so commits at once: with no peer to confirm, it fails with `NotReplicated`
/// (still applied locally) instead of succeeding unconfirmed.
#[actix::test]
async fn replicated_updates_are_never_answered_unconfirmed() {
    use crpf::replica::AckLevel;
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("confirm", FilterKind::OrCuckoo, 1000, 0.01);
    cfg.delta_max_updates = 1;
    cfg.replicated_peers = Some(1);
    cfg.replicated_timeout_ms = 200;
    let h = Replica::start(cfg, bus).await.unwrap();
    assert!(h.wait_ready(WAIT).await);
    for item in [b"a".as_slice(), b"b", b"c"] {
        let r = h.add_with(item.to_vec(), AckLevel::Replicated).await;
        assert!(
            matches!(
                r,
                Err(ReplicaError::NotReplicated {
                    acked: 0,
                    needed: 1,
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(h.contains(item), "applied locally all the same");
    }
    h.shutdown().await.unwrap();
}

/// A replica whose last look at the registry found it alone does not take that look's word
/// for a `replicated` add: a peer claimed its id since (a new filter's replicas start
/// together) and cannot be heard, so the add fails as not replicated instead of being
/// answered once durable with no other copy.
#[actix::test]
async fn a_replicated_add_alone_on_an_old_look_asks_the_registry_again() {
    use crpf::replica::AckLevel;
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("fresh", FilterKind::GBloom, 1000, 0.01);
    cfg.delta_max_updates = 1;
    cfg.replicated_timeout_ms = 300;
    // No renewal's look during the test: only the add's own.
    cfg.id_lease_renew_ms = 600_000;
    let cut = FaultyTransport::new(bus.clone(), FaultConfig::default());
    let a = Replica::start(cfg.clone(), Arc::new(cut.clone()))
        .await
        .unwrap();
    assert!(a.wait_ready(WAIT).await);
    a.add_with(b"alone".to_vec(), AckLevel::Replicated)
        .await
        .expect("alone, and the registry says so");
    // Cut off from its peers (not from the registry), then a peer claims its id.
    cut.set_partitioned(true);
    let b = Replica::start(cfg, bus.clone()).await.unwrap();
    assert!(b.wait_ready(WAIT).await);
    let r = a.add_with(b"x".to_vec(), AckLevel::Replicated).await;
    assert!(
        matches!(r, Err(ReplicaError::NotReplicated { acked: 0, .. })),
        "answered with no copy elsewhere: {r:?}"
    );
    assert!(a.contains(b"x"), "applied locally all the same");
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// Pruning: the id of a replica gone for `retire_after_ms` is retired by the others and taken
/// by a new replica, which issues tags above every tag the old holder may have issued (its
/// reservation); the old holder, back from its data directory, carries on under another id.
/// Nothing is lost and no tag is issued twice. A replica whose own id is retired under it
/// (cut off from the registry) takes it back by itself and adds above the retirement's floor;
/// only if another replica took the id first does it refuse adds (issue 47, item 8: it
/// refused them until a restart).
#[actix::test]
async fn gone_replicas_ids_are_retired_and_reused_without_reissuing_a_tag() {
    use crpf::transport::ClaimRecord;
    let dir = tempfile::tempdir().unwrap();
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let mut cfg = cfg("retire", FilterKind::OrCuckoo, 5000, 0.01);
    cfg.id_lease_renew_ms = 50;
    cfg.id_lease_block = 40;
    cfg.peer_expiry_ms = 1_000;
    cfg.retire_after_ms = 1_000;
    let a = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    let mut b_cfg = cfg.clone();
    b_cfg.data_dir = Some(dir.path().join("b"));
    b_cfg.retire_after_ms = 0;
    let b = Replica::start(b_cfg.clone(), t.clone()).await.unwrap();
    let b_id = b.identity().replica;
    let mut dots = Vec::new();
    // More adds than one reservation holds: the claim is extended as the clock nears its end.
    for i in 0..150u32 {
        dots.push(b.add(format!("b{i}")).await.unwrap().unwrap());
    }
    assert!(a.wait_until(WAIT, |f| f.contains(b"b149")).await);
    b.shutdown().await.unwrap();
    let reserved = match bus.replica_claims("retire".into()).await.unwrap()[..] {
        [_, b_claim] => b_claim.record.floor(),
        ref other => panic!("{other:?}"),
    };

    // a retires b's id once the claim went unrenewed (and b unheard) for retire_after_ms.
    let claims = || async { bus.replica_claims("retire".into()).await.unwrap() };
    wait_for(|| async {
        claims()
            .await
            .iter()
            .any(|e| e.id == b_id && matches!(e.record, ClaimRecord::Retired { .. }))
    })
    .await;
    let floor = claims()
        .await
        .iter()
        .find(|e| e.id == b_id)
        .unwrap()
        .record
        .floor();
    let b_max = dots.iter().map(|d| d.counter).max().unwrap();
    assert!(floor >= b_max, "floor {floor} below b's tag {b_max}");
    // Above what b may have issued unseen, too: its whole reservation.
    assert!(
        floor >= reserved,
        "floor {floor} below b's reservation {reserved}"
    );
    wait_for(|| async { a.stats().await.unwrap().retired_ids == 1 }).await;

    // A new replica takes the retired id and starts above the floor.
    let c = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    assert_eq!(c.identity().replica, b_id, "the retired id is reused");
    for i in 0..50u32 {
        let dot = c.add(format!("c{i}")).await.unwrap().unwrap();
        assert!(dot.counter > floor, "{dot:?} at or below the floor {floor}");
        dots.push(dot);
    }
    // b comes back from its data directory: its id is c's now, so it adds under another.
    let b = Replica::start(b_cfg, t.clone()).await.unwrap();
    assert_ne!(b.identity().replica, b_id);
    for i in 150..200u32 {
        dots.push(b.add(format!("b{i}")).await.unwrap().unwrap());
    }
    let hs = [a.clone(), b.clone(), c.clone()];
    assert!(converged(&hs, WAIT).await, "replicas did not converge");
    for h in &hs {
        assert!((0..200).all(|i| h.contains(format!("b{i}").as_bytes())));
        assert!((0..50).all(|i| h.contains(format!("c{i}").as_bytes())));
    }
    let unique: std::collections::HashSet<_> = dots.iter().collect();
    assert_eq!(unique.len(), dots.len(), "a tag was issued twice");

    // a's id retired under it (as by a replica that could not see a's renewals; here with a
    // floor far above a's clock, as if a later holder had come and gone): a takes it back at
    // its next renewal, with no restart, and issues its next tags above the floor.
    let a_id = a.identity().replica;
    let a_floor = 10_000;
    retire(&bus, "retire", a_id, a_floor).await;
    // (Adds before a's renewal sees the retirement are a's own: below its reservation.)
    let deadline = std::time::Instant::now() + WAIT;
    for n in 0.. {
        let dot = wait_for_ok(|| a.add(format!("taken back {n}")))
            .await
            .unwrap();
        assert_eq!(dot.replica, a_id);
        dots.push(dot);
        if dot.counter > a_floor {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not taken back: {dot:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Retired again, and another replica holds the id before a could take it back: a adds
    // no more (and says so); what it has stays readable.
    retire(&bus, "retire", a_id, 0).await;
    let other = Uuid::new_v4();
    let stolen = bus
        .claim_replica_id("retire".into(), other, Some(a_id))
        .await
        .unwrap();
    assert_eq!(stolen.id, a_id);
    wait_for(|| async { a.stats().await.unwrap().id_lost }).await;
    match a.add("after").await {
        Err(ReplicaError::IdRetired { replica }) => assert_eq!(replica, a_id),
        other => panic!("expected IdRetired, got {other:?}"),
    }
    // It left no claim of its own behind (only a's id, b's and c's ids are in the registry).
    assert_eq!(claims().await.len(), 3, "{:?}", claims().await);
    assert!(a.contains(b"c49") && a.contains(b"taken back 0"));
    let unique: std::collections::HashSet<_> = dots.iter().collect();
    assert_eq!(unique.len(), dots.len(), "a tag was issued twice");
    stop(&hs).await;
}

/// Retires `id` of `filter` with `floor`, whatever its holder renews meanwhile (a renewal
/// between the listing and the compare-and-set wins: try again).
async fn retire(bus: &InProcessBus, filter: &str, id: crpf::ReplicaId, floor: u64) {
    loop {
        let entry = bus
            .replica_claims(filter.into())
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.id == id)
            .unwrap();
        if bus
            .retire_claim(filter.into(), id, entry.revision, floor)
            .await
            .unwrap()
        {
            return;
        }
    }
}

/// Retries `op` until it succeeds (within [`WAIT`]).
async fn wait_for_ok<T, E: std::fmt::Debug, F: std::future::Future<Output = Result<T, E>>>(
    mut op: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match op().await {
            Ok(t) => return t,
            Err(e) if std::time::Instant::now() > deadline => panic!("still failing: {e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[actix::test]
async fn replicas_sharing_the_bus_hear_each_other_but_not_themselves() {
    shared_transport_without_echo(Arc::new(InProcessBus::new()), WAIT).await;
}

/// A `g_bloom` state is merged piece by piece as its chunks arrive. Chunks lost on the way
/// abandon their transfer (what was merged of it stays: a part of the peer's state, never
/// more) and a later push completes it.
#[actix::test]
async fn a_state_merged_in_pieces_gets_through_lost_chunks() {
    let bus = Arc::new(InProcessBus::new());
    let lossy = |seed| -> Arc<dyn Transport> {
        Arc::new(FaultyTransport::new(
            bus.clone(),
            FaultConfig {
                drop_delta: 0.0,
                drop_state: 0.15,
                seed,
            },
        ))
    };
    let mut cfg = cfg("pieces", FilterKind::GBloom, 50_000, 0.01);
    // Every change is followed by a full-state push, of about 8 chunks.
    cfg.full_state_only = true;
    cfg.chunk_bytes = 8 << 10;
    let a = Replica::start(cfg.clone(), lossy(1)).await.unwrap();
    assert!(a.wait_ready(WAIT).await);
    for i in 0..2_000u32 {
        a.add(i.to_le_bytes().to_vec()).await.unwrap();
    }
    let b = Replica::start(cfg, lossy(2)).await.unwrap();
    b.add(b"b's own".to_vec()).await.unwrap();
    assert!(b.wait_ready(WAIT).await);
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);
    assert!((0..2_000u32).all(|i| b.contains(&i.to_le_bytes())));
    assert!(a.contains(b"b's own"));
    let s = b.stats().await.unwrap();
    assert!(s.states_merged >= 1, "{s:?}");
    stop(&[a, b]).await;
}

#[actix::test]
async fn replicas_on_a_transport_that_echoes_drop_their_own_messages() {
    // A transport without a no-echo channel (the fault injector, here with no faults) hands
    // a replica its own messages back: it drops them by sender and counts them.
    let bus = InProcessBus::new();
    let t: Arc<dyn Transport> = Arc::new(FaultyTransport::new(
        Arc::new(bus),
        FaultConfig {
            drop_delta: 0.0,
            drop_state: 0.0,
            seed: 1,
        },
    ));
    let mut cfg = cfg("echoes", FilterKind::GBloom, 1_000, 0.01);
    cfg.full_state_only = true;
    let h = Replica::start(cfg, t).await.unwrap();
    h.add(b"x".to_vec()).await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while h.stats().await.unwrap().echoes_received == 0 {
        assert!(std::time::Instant::now() < deadline, "no echo counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.stats().await.unwrap().bytes_received, 0);
    h.shutdown().await.unwrap();
}

/// An expiring filter's clock travels with its states and deltas, and a merged clock moves
/// every replica's window: one from further ahead than the skew bound (a forged far-future
/// epoch, or a replica whose clock is wrong) is refused and counted, and expires nothing.
#[actix::test]
async fn expiring_states_and_deltas_from_beyond_the_skew_bound_are_refused() {
    use crpf::ExpirySpec;
    use crpf::wire::chunk_state;
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let mut cfg = cfg("window", FilterKind::ExpiringBloom, 1000, 0.01);
    // Epochs of a minute, a window of 10: the element below stays for the test's whole run.
    cfg.filter.expiry = Some(ExpirySpec {
        window_ms: 600_000,
        epochs: 10,
        max_skew_epochs: 1,
    });
    let h = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    assert!(h.wait_ready(WAIT).await);
    h.add(b"kept".to_vec()).await.unwrap();
    let subjects = Subjects::new("crpf", "window");
    let digest = h.snapshot().params_digest();
    let env = |seq: u64, body| {
        let sender = Uuid::from_u128(7);
        Envelope::new(
            "window",
            FilterKind::ExpiringBloom,
            digest,
            sender,
            9,
            seq,
            body,
        )
        .encode()
    };
    let publish = |subject: &String, frame: Vec<u8>| {
        let (t, subject) = (t.clone(), subject.clone());
        async move { t.publish(subject, Bytes::from(frame)).await.unwrap() }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // A peer's state after one add at `at_ms` on its clock, and its delta.
    let peer_at = |at_ms: u64, item: &[u8]| {
        let mut f = AnyFilter::new(&cfg.filter, 9).unwrap();
        f.track_deltas(true);
        f.tick(at_ms);
        f.add(item).unwrap();
        let delta = f.take_delta().unwrap();
        (f, delta)
    };
    // A peer whose clock is an hour ahead: its window no longer holds "kept"'s epoch.
    let (ahead, delta) = peer_at(now + 3_600_000, b"from the future");
    publish(&subjects.delta, env(1, Body::Delta(delta))).await;
    for (i, c) in chunk_state(&ahead.encode_state(), 1, 1 << 20)
        .into_iter()
        .enumerate()
    {
        publish(&subjects.state, env(2 + i as u64, Body::StateChunk(c))).await;
    }
    wait_for(|| async { rejects(&h, "clock_ahead").await == 2 }).await;
    assert!(
        h.contains(b"kept"),
        "a far-ahead clock expired our elements"
    );
    assert!(!h.contains(b"from the future"));

    // Within the bound (one epoch ahead): merged, and nothing live expires.
    let (_, delta) = peer_at(now + 60_000, b"from a minute ahead");
    publish(&subjects.delta, env(10, Body::Delta(delta))).await;
    assert!(
        h.wait_until(WAIT, |f| f.contains(b"from a minute ahead"))
            .await
    );
    assert!(h.contains(b"kept"));
    assert_eq!(rejects(&h, "clock_ahead").await, 2);
    h.shutdown().await.unwrap();
}

/// A counting replica's id serves one run: restarted from its data directory it keeps every
/// count and takes a new id, and its peer's state (which counts under the old id) still
/// merges, which a kept id would refuse as its own counts running ahead.
#[actix::test]
async fn a_restarted_counting_replica_keeps_its_counts_under_a_new_id() {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let c = cfg("counts", FilterKind::CountingCuckoo, 1000, 0.01);
    let peer = Replica::start(c.clone(), bus.clone()).await.unwrap();
    let mut durable = c.clone();
    durable.data_dir = Some(dir.path().to_path_buf());
    let h = Replica::start(durable.clone(), bus.clone()).await.unwrap();
    for _ in 0..5 {
        h.add(b"apple".to_vec()).await.unwrap();
    }
    assert!(h.remove(b"apple".to_vec()).await.unwrap());
    let first = h.identity();
    assert!(converged(&[peer.clone(), h.clone()], WAIT).await);
    h.shutdown().await.unwrap();

    let h = Replica::start(durable, bus).await.unwrap();
    assert_ne!(
        h.identity().replica,
        first.replica,
        "a counting id serves one run"
    );
    assert_eq!(
        h.count(b"apple").unwrap(),
        4,
        "the counts survive the restart"
    );
    h.add(b"apple".to_vec()).await.unwrap();
    peer.add(b"apple".to_vec()).await.unwrap();
    assert!(converged(&[peer.clone(), h.clone()], WAIT).await);
    assert_eq!(
        (h.count(b"apple").unwrap(), peer.count(b"apple").unwrap()),
        (6, 6)
    );
    assert_eq!(rejects(&h, "own_tag_ahead").await, 0);
    assert!(matches!(
        Replica::start(
            cfg("plain", FilterKind::GBloom, 100, 0.01),
            Arc::new(InProcessBus::new())
        )
        .await
        .unwrap()
        .count(b"apple"),
        Err(ReplicaError::NotCounting(_))
    ));
    stop(&[peer, h]).await;
}

/// A counting delta that carries a count past 2^48 - 1 is refused and counted: merged, it would
/// leave its source unable to add at that slot. One at the bound merges.
#[actix::test]
async fn forged_counts_beyond_the_bound_are_refused() {
    use crpf::{CountingCuckooDelta, MAX_COUNTER};
    let bus = Arc::new(InProcessBus::new());
    let t: Arc<dyn Transport> = bus.clone();
    let c = cfg("counts", FilterKind::CountingCuckoo, 1000, 0.01);
    let h = Replica::start(c.clone(), t.clone()).await.unwrap();
    assert!(h.wait_ready(WAIT).await);
    h.add(b"kept".to_vec()).await.unwrap();
    let subjects = Subjects::new("crpf", "counts");
    let digest = h.snapshot().params_digest();
    let sender = Uuid::from_u128(7);
    // The slot of "forged" as a peer with replica id 9 places it.
    let mut peer = AnyFilter::new(&c.filter, 9).unwrap();
    peer.track_deltas(true);
    peer.add(b"forged").unwrap();
    let real: CountingCuckooDelta = serde_cbor::from_slice(&peer.take_delta().unwrap()).unwrap();
    let (bucket, fp, _) = real.entries[0].clone();
    // A delta from replica 9 counting `added` occurrences of "forged", as message `seq`.
    let publish_count = |seq: u64, added: u64| {
        let delta = CountingCuckooDelta {
            entries: vec![(bucket, fp, vec![(9, added, 0)])],
        };
        let body = Body::Delta(serde_cbor::to_vec(&delta).unwrap());
        let frame = Envelope::new(
            "counts",
            FilterKind::CountingCuckoo,
            digest,
            sender,
            9,
            seq,
            body,
        );
        let (t, subject) = (t.clone(), subjects.delta.clone());
        async move {
            t.publish(subject, Bytes::from(frame.encode()))
                .await
                .unwrap()
        }
    };
    publish_count(1, MAX_COUNTER + 1).await;
    publish_count(2, u64::MAX).await;
    wait_for(|| async { rejects(&h, "incompatible").await == 2 }).await;
    assert_eq!(h.count(b"forged").unwrap(), 0);
    assert_eq!(h.count(b"kept").unwrap(), 1);

    publish_count(3, MAX_COUNTER).await;
    assert!(
        h.wait_until(WAIT, |f| f.count(b"forged").ok() == Some(MAX_COUNTER))
            .await
    );
    h.shutdown().await.unwrap();
}

/// A digest may be a pass over the whole state (0.14 s for an `or_cuckoo` of 8.6M entries):
/// a replica alone announces the last one it computed instead of computing one every
/// anti-entropy interval while it takes updates; with a peer to compare with, it computes.
#[actix::test]
async fn a_lone_replica_does_not_digest_its_state_at_every_interval() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("digests", FilterKind::GCuckoo, 10_000, 0.01);
    cfg.anti_entropy_interval_ms = 20;
    let a = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    let updates = |h: crpf::replica::ReplicaHandle, from: u32| async move {
        // Updates over about 25 intervals, so that the state always changed since a digest.
        for i in from..from + 50 {
            h.add(i.to_le_bytes().to_vec()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    updates(a.clone(), 0).await;
    let alone = a.stats().await.unwrap().state_digests;
    // The first announcement, and the one `stats` reports.
    assert!(
        alone <= 3,
        "{alone} digests computed with nobody to compare them"
    );

    let b = Replica::start(cfg, bus).await.unwrap();
    updates(a.clone(), 1_000).await;
    let paired = a.stats().await.unwrap().state_digests - alone;
    assert!(
        paired >= 5,
        "{paired} digests computed over 25 intervals with a peer comparing them"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Digests from `sender` heard on `stream` within `window`.
async fn digests_within(
    stream: &mut crpf::transport::MessageStream,
    sender: Uuid,
    expect: &crpf::wire::Expect,
    window: Duration,
) -> usize {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + window;
    let mut n = 0;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, stream.next()).await {
        if let Ok(env) = Envelope::decode(&msg.payload, expect)
            && env.sender == sender
            && matches!(env.body, Body::Digest { .. })
        {
            n += 1;
        }
    }
    n
}

/// Nobody hears a lone replica's digests: after a few at the anti-entropy interval it spaces
/// them out, up to six intervals apart; once a peer appears it announces at the interval again,
/// as long as the state changes. Once the two agree and nothing changes, they space them out
/// again (up to four intervals apart), until the next change.
#[actix::test]
async fn a_replica_spaces_out_its_digests_while_alone_or_quiet() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut cfg = cfg("lone", FilterKind::GBloom, 1_000, 0.01);
    cfg.anti_entropy_interval_ms = 20;
    let subjects = Subjects::new(&cfg.prefix, &cfg.name);
    let mut state = bus.subscribe(subjects.state, None).await.unwrap();
    let a = Replica::start(cfg.clone(), bus.clone()).await.unwrap();
    assert!(a.wait_ready(WAIT).await);
    let expect = crpf::wire::Expect {
        filter: cfg.name.clone(),
        kind: FilterKind::GBloom,
        params_digest: a.snapshot().params_digest(),
        generation: 0,
        max_bytes: 1 << 20,
    };
    let uuid = a.identity().uuid;
    // 100 intervals: 80 digests or more at the interval, about 20 spaced out.
    let window = Duration::from_millis(2_000);
    let lone = digests_within(&mut state, uuid, &expect, window).await;
    assert!(
        lone <= 50,
        "{lone} digests in 100 intervals with nobody to hear them"
    );
    let b = Replica::start(cfg, bus).await.unwrap();
    // An add every other interval.
    let adds = |items: std::ops::Range<u32>| {
        let b = b.clone();
        async move {
            for i in items {
                b.add(i.to_le_bytes().to_vec()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }
    };
    // 75 intervals with a change every other one: 60 or more at the interval.
    let window = Duration::from_millis(1_500);
    let (paired, ()) = tokio::join!(
        digests_within(&mut state, uuid, &expect, window),
        adds(0..38)
    );
    assert!(
        paired >= 40,
        "{paired} digests in 75 intervals with a peer and changes"
    );
    // Converged and quiet: 100 intervals, about 25 digests 4 intervals apart.
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);
    let window = Duration::from_millis(2_000);
    let quiet = digests_within(&mut state, uuid, &expect, window).await;
    assert!(quiet <= 50, "{quiet} digests in 100 quiet intervals");
    // Their digests say how far apart they are: each still counts the other live.
    for h in [&a, &b] {
        let s = h.stats().await.unwrap();
        assert_eq!(s.converged_peers, 1, "{s:?}");
    }
    // A change brings them back to the interval at once.
    let window = Duration::from_millis(1_000);
    let (busy, ()) = tokio::join!(
        digests_within(&mut state, uuid, &expect, window),
        adds(100..125)
    );
    assert!(busy >= 28, "{busy} digests in 50 intervals of changes");
    stop(&[a, b]).await;
}

/// `n` replicas, once each caught up (a start-up state push would carry later adds too).
async fn start_ready(
    n: usize,
    cfg: &crpf::replica::ReplicaConfig,
    bus: Arc<dyn Transport>,
) -> Vec<crpf::replica::ReplicaHandle> {
    let hs = start_n(n, cfg, bus).await;
    for h in &hs {
        assert!(h.wait_ready(WAIT).await);
    }
    hs
}

/// Issue 25: the delta flush. An update on a quiet link is published at once, in its own
/// delta; the updates that follow within `delta_interval_ms` wait for it and share one delta;
/// once the link has been quiet for an interval, the next update goes at once again. With an
/// interval of minutes, what arrives early can only have gone at once.
#[actix::test]
async fn an_update_on_a_quiet_link_goes_at_once_and_those_after_it_share_the_next_delta() {
    for kind in [FilterKind::GBloom, FilterKind::OrCuckoo] {
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        let mut cfg = cfg("flush", kind, 10_000, 0.01);
        cfg.delta_interval_ms = 600_000;
        // No anti-entropy within the test: only deltas carry the adds.
        cfg.anti_entropy_interval_ms = 600_000;
        cfg.peer_expiry_ms = 3 * cfg.anti_entropy_interval_ms;
        let hs = start_ready(2, &cfg, bus).await;
        let (a, b) = (&hs[0], &hs[1]);
        let sent = || async { a.stats().await.unwrap().deltas_sent };
        let before = sent().await;
        a.add(b"first".to_vec()).await.unwrap();
        wait_for(|| async { b.contains(b"first") }).await;
        assert_eq!(sent().await, before + 1, "{kind}: the first add went alone");
        for i in 0..50u32 {
            a.add(i.to_le_bytes().to_vec()).await.unwrap();
        }
        // They wait for the interval: a while later, B has none of them, and no delta went.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // (Bar the filter's false positives, 1% each.)
        let seen = (0..50u32).filter(|i| b.contains(&i.to_le_bytes())).count();
        assert!(seen <= 5, "{kind}: {seen} of 50 on B");
        assert_eq!(sent().await, before + 1, "{kind}");
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();

        // The same with an interval of 300 ms: the 50 travel together once it has passed,
        // and after a quiet interval an add goes at once again.
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        cfg.delta_interval_ms = 300;
        let hs = start_ready(2, &cfg, bus).await;
        let (a, b) = (&hs[0], &hs[1]);
        let sent = || async { a.stats().await.unwrap().deltas_sent };
        let before = sent().await;
        a.add(b"first".to_vec()).await.unwrap();
        for i in 0..50u32 {
            a.add(i.to_le_bytes().to_vec()).await.unwrap();
        }
        wait_for(|| async { (0..50u32).all(|i| b.contains(&i.to_le_bytes())) }).await;
        let batched = sent().await - before;
        assert!(batched <= 3, "{kind}: 51 adds in {batched} deltas");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let quiet = sent().await;
        a.add(b"after a quiet interval".to_vec()).await.unwrap();
        wait_for(|| async { b.contains(b"after a quiet interval") }).await;
        assert_eq!(sent().await, quiet + 1, "{kind}");
        stop(&hs).await;
    }
}

/// The body of the next message `sender` published on `stream`.
async fn next_delta_from(
    stream: &mut crpf::transport::MessageStream,
    sender: Uuid,
    expect: &crpf::wire::Expect,
) -> Body {
    use futures::StreamExt;
    loop {
        let msg = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("a message in time")
            .expect("the stream goes on");
        let env = Envelope::decode(&msg.payload, expect).unwrap();
        if env.sender == sender {
            return env.body;
        }
    }
}

/// Issue 25: durable commits go at the log's pace, their deltas at the interval's. Each
/// durable update is answered once its commit is fsynced, before its delta goes out; the
/// deltas of the commits written within an interval travel together, and a stopping replica
/// publishes what it held. With an interval of minutes, none may go before the stop; an
/// observed-remove add and its remove, in two commits of one message, leave the item absent.
#[actix::test]
async fn durable_commits_go_at_the_logs_pace_and_their_deltas_at_the_intervals() {
    for kind in [FilterKind::GBloom, FilterKind::OrCuckoo] {
        let dir = tempfile::tempdir().unwrap();
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        let mut b_cfg = cfg("paced", kind, 10_000, 0.01);
        b_cfg.delta_interval_ms = 600_000;
        // No anti-entropy within the test: only deltas carry the adds.
        b_cfg.anti_entropy_interval_ms = 600_000;
        b_cfg.peer_expiry_ms = 3 * b_cfg.anti_entropy_interval_ms;
        let mut a_cfg = b_cfg.clone();
        a_cfg.data_dir = Some(dir.path().join("a"));
        assert_eq!(a_cfg.default_ack(), crpf::replica::AckLevel::Durable);
        let subjects = Subjects::new(&a_cfg.prefix, &a_cfg.name);
        let mut deltas = bus.subscribe(subjects.delta, None).await.unwrap();
        let a = Replica::start(a_cfg, bus.clone()).await.unwrap();
        let b = Replica::start(b_cfg, bus).await.unwrap();
        assert!(a.wait_ready(WAIT).await && b.wait_ready(WAIT).await);
        let sent = || async { a.stats().await.unwrap().deltas_sent };
        let merged = || async { b.stats().await.unwrap().deltas_merged };
        let (sent_before, merged_before) = (sent().await, merged().await);
        a.add(b"first".to_vec()).await.unwrap();
        wait_for(|| async { b.contains(b"first") }).await;
        assert_eq!(
            sent().await,
            sent_before + 1,
            "{kind}: the first went at once"
        );
        // One after the other: a commit (and an fsync) each, every one answered.
        let items: Vec<Vec<u8>> = (0..30u32).map(|i| i.to_le_bytes().to_vec()).collect();
        for item in &items {
            a.add(item.clone()).await.unwrap();
        }
        if kind.removable() {
            a.add(b"gone".to_vec()).await.unwrap();
            a.remove(b"gone".to_vec()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen = items.iter().filter(|i| b.contains(i)).count();
        assert!(seen <= 4, "{kind}: {seen} of 30 on B before the interval");
        assert_eq!(
            sent().await,
            sent_before + 1,
            "{kind}: held for the interval"
        );
        // What went out so far: the first add's delta alone.
        let expect = crpf::wire::Expect {
            filter: "paced".into(),
            kind,
            params_digest: b.snapshot().params_digest(),
            generation: 0,
            max_bytes: 1 << 20,
        };
        let a_uuid = a.identity().uuid;
        assert!(
            matches!(
                next_delta_from(&mut deltas, a_uuid, &expect).await,
                Body::Delta(_)
            ),
            "{kind}"
        );
        a.shutdown().await.unwrap();
        // At the stop: every held commit's delta in one message.
        let commits = items.len() + 2 * usize::from(kind.removable());
        match next_delta_from(&mut deltas, a_uuid, &expect).await {
            Body::Deltas(run) => assert_eq!(run.len(), commits, "{kind}"),
            other => panic!("{kind}: {other:?}"),
        }
        wait_for(|| async { items.iter().all(|i| b.contains(i)) }).await;
        let s = b.stats().await.unwrap();
        assert!(
            s.deltas_merged > merged_before + commits as u64,
            "{kind}: every commit's delta merged ({s:?})"
        );
        assert!(s.rejects.is_empty(), "{kind}: {s:?}");
        if kind.removable() {
            assert!(
                !b.contains(b"gone"),
                "{kind}: the remove travelled with its add"
            );
        }
        b.shutdown().await.unwrap();
    }
}

/// A dump of another cluster's filter (`LOADCHUNK` over RESP) re-added through a replica's
/// update path: every entry under a fresh tag of the importer's id, reserved in the registry
/// (past the claim's block: renewed first) and durably; in slices, each logged and published;
/// a peer merges them and removes one; the log replays to the importer's state.
#[actix::test]
async fn an_import_re_adds_a_dump_as_the_importers_own_logged_and_replicated_adds() {
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let mut c = cfg("imported", FilterKind::WriterScOrCuckoo, 1000, 0.01);
    c.id_lease_block = 1000;
    let mut durable = c.clone();
    durable.data_dir = Some(dir.path().join("a"));
    durable.tag_reserve_block = 64;
    // No snapshot in the test's time: the log alone holds the import.
    durable.snapshot_interval_ms = 3_600_000;
    let a = Replica::start(durable.clone(), bus.clone()).await.unwrap();
    let b = Replica::start(c.clone(), bus.clone()).await.unwrap();
    // Another cluster's two writers (ids 40 and 41), items added once or twice.
    let mut dump = AnyFilter::new(&c.filter, 40).unwrap();
    let mut other = AnyFilter::new(&c.filter, 41).unwrap();
    for i in 0..6000u32 {
        dump.add(&i.to_le_bytes()).unwrap();
        other.add(&(i + 100_000).to_le_bytes()).unwrap();
        if i % 2 == 0 {
            other.add(&(i + 100_000).to_le_bytes()).unwrap();
        }
    }
    dump.merge(&other).unwrap();
    let entries = dump.dots().len() as u64;
    assert_eq!(entries, 15_000, "more than one slice");

    // Another spec is refused, changing nothing.
    let mut wrong = AnyFilter::new(
        &cfg("x", FilterKind::WriterScOrCuckoo, 2000, 0.01).filter,
        40,
    )
    .unwrap();
    wrong.add(b"w").unwrap();
    assert!(matches!(
        a.import(&wrong).await,
        Err(ReplicaError::Filter(crpf::FilterError::Incompatible(_)))
    ));
    assert!(a.snapshot().dots().is_empty());

    assert_eq!(a.import(&dump).await.unwrap(), entries);
    let me = a.identity().replica;
    let state = a.snapshot();
    let dots = state.dots();
    assert_eq!(dots.len() as u64, entries);
    assert!(
        dots.iter().all(|d| d.replica == me),
        "only the importer's tags"
    );
    assert!(
        !state
            .history()
            .unwrap()
            .replicas()
            .any(|r| r == 40 || r == 41)
    );
    for i in (0..6000u32).step_by(7) {
        let (x, y) = (i.to_le_bytes(), (i + 100_000).to_le_bytes());
        assert_eq!(state.count(&x).unwrap(), dump.count(&x).unwrap());
        assert_eq!(state.count(&y).unwrap(), dump.count(&y).unwrap());
    }
    // Every tag issued was reserved first, durably.
    let reserved = saved_reservation(&dir.path().join("a"));
    assert!(
        state.clock() == entries && reserved >= entries,
        "{reserved}"
    );

    // The log, replayed from the start, rebuilds the import (each slice a record of its own).
    let (replayed, log) = replay_log(&dir.path().join("a"), &a, &c);
    assert!(log.records > 1, "{log:?}");
    assert!(replayed.equivalent(&state));

    // The peer merges them, and its remove reaches the importer.
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);
    assert!(b.contains(&7u32.to_le_bytes()));
    assert!(b.remove(7u32.to_le_bytes().to_vec()).await.unwrap());
    assert!(
        a.wait_until(WAIT, |f| !f.contains(&7u32.to_le_bytes()))
            .await
    );
    let stats = a.stats().await.unwrap();
    assert!(stats.deltas_sent > 1, "{stats:?}");
    assert!(stats.rejects.is_empty(), "{stats:?}");
    assert!(b.stats().await.unwrap().rejects.is_empty());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// Issue 50: three replicas of a count-min sketch increment concurrently (by 1 through `add`,
/// by any amount through `CMS.INCRBY`'s typed request, or as located occurrences, the path
/// `CMS.MERGE` takes); once converged, each answers exactly
/// what one sketch fed every increment answers, counter by counter. A restarted replica keeps
/// its counts under a new id, as the counting kinds do.
#[actix::test]
async fn three_sketch_replicas_answer_as_one_sketch_fed_everything() {
    use crpf::{CountMinSketch, ReplicatedFilter};
    let dir = tempfile::tempdir().unwrap();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let c = cfg("sketch", FilterKind::CountMinSketch, 200, 0.01);
    let mut hs = start_n(2, &c, bus.clone()).await;
    let mut durable = c.clone();
    durable.data_dir = Some(dir.path().to_path_buf());
    hs.push(Replica::start(durable.clone(), bus.clone()).await.unwrap());
    // The typed requests are served once a replica is ready.
    for h in &hs {
        assert!(h.wait_ready(WAIT).await);
    }
    let mut single = CountMinSketch::from_spec(&c.filter, 99).unwrap();
    // A skewed stream: item k drawn with weight ~ 1/k, increments 1..=4.
    let mut rng = fastrand::Rng::with_seed(50);
    let streams: Vec<Vec<(Vec<u8>, u64)>> = (0..3)
        .map(|_| {
            (0..400)
                .map(|_| {
                    let k = (1000.0 / (1.0 + rng.f64() * 999.0)) as u32;
                    (format!("item-{k}").into_bytes(), rng.u64(1..=4))
                })
                .collect()
        })
        .collect();
    for (item, n) in streams.iter().flatten() {
        single.increment(item, *n);
    }
    let sketch = |h: &crpf::replica::ReplicaHandle| {
        h.read(|f| match f {
            AnyFilter::CountMinSketch(s) => (**s).clone(),
            other => panic!("a {} filter", other.kind()),
        })
    };
    let run = |h: crpf::replica::ReplicaHandle, stream: Vec<(Vec<u8>, u64)>| async move {
        for (i, (item, n)) in stream.into_iter().enumerate() {
            if n == 1 && i % 2 == 0 {
                h.add(item).await.unwrap();
            } else if i % 3 != 0 {
                let incr = crpf::api::Request::CmsIncrBy {
                    items: crpf::api::Items::of([&item]),
                    increments: vec![n],
                    ack: None,
                };
                match h.call(incr).await.unwrap() {
                    crpf::api::Response::CmsIncremented(counts) => assert!(counts[0] >= n),
                    other => panic!("{other:?}"),
                }
            } else {
                let mut occurrences = Vec::new();
                h.read(|f| match f {
                    AnyFilter::CountMinSketch(s) => s.item_occurrences(&item, n, &mut occurrences),
                    other => panic!("a {} filter", other.kind()),
                });
                assert_eq!(h.add_located(occurrences, None).await.unwrap(), n);
            }
        }
    };
    futures::join!(
        run(hs[0].clone(), streams[0].clone()),
        run(hs[1].clone(), streams[1].clone()),
        run(hs[2].clone(), streams[2].clone())
    );
    assert!(converged(&hs, WAIT).await, "replicas did not converge");
    let check = |s: &CountMinSketch, single: &CountMinSketch, what: &str| {
        assert_eq!(s.total(), single.total(), "{what}");
        for k in 0..1000u32 {
            let item = format!("item-{k}").into_bytes();
            assert_eq!(s.count(&item), single.count(&item), "{what}: item {k}");
        }
        for row in 0..s.params().depth {
            for col in 0..s.params().width {
                assert_eq!(
                    s.cell_count(row, col),
                    single.cell_count(row, col),
                    "{what}"
                );
            }
        }
    };
    for (r, h) in hs.iter().enumerate() {
        let s = sketch(h);
        assert_eq!(s.writers(), 3, "replica {r}: each writer's counters once");
        check(&s, &single, &format!("replica {r}"));
        assert_eq!(rejects(h, "own_tag_ahead").await, 0);
    }

    // Restarted from its data directory: the same counts, a new id, and its next increments
    // still merge everywhere.
    let first = hs[2].identity();
    hs[2].shutdown().await.unwrap();
    hs[2] = Replica::start(durable, bus).await.unwrap();
    assert_ne!(
        hs[2].identity().replica,
        first.replica,
        "a sketch's id serves one run"
    );
    check(&sketch(&hs[2]), &single, "restarted");
    hs[2].add(b"item-1".to_vec()).await.unwrap();
    single.increment(b"item-1", 1);
    assert!(
        converged(&hs, WAIT).await,
        "replicas did not converge after the restart"
    );
    for h in &hs {
        check(&sketch(h), &single, "after the restart");
    }
    stop(&hs).await;
}
