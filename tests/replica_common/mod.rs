//! Helpers shared by the replica tests (in-process bus and NATS).
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crpf::Dot;
use crpf::replica::{AnyFilter, ReplicaConfig, ReplicaHandle, wal};
use crpf::wire::FilterKind;

/// The write-ahead log in `data_dir` (replica `a`'s), replayed from a copy into a fresh
/// filter of `cfg`'s spec, and what the replay found.
pub(crate) fn replay_log(
    data_dir: &std::path::Path,
    a: &ReplicaHandle,
    cfg: &ReplicaConfig,
) -> (AnyFilter, wal::Replayed) {
    let copy = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(data_dir.join(wal::WAL_DIR)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
    }
    let mut replayed = AnyFilter::new(&cfg.filter, 999).unwrap();
    let log = wal::replay(
        copy.path(),
        a.identity(),
        None,
        wal::WalLimits::default(),
        |record| replayed.merge_delta_bytes(record).unwrap(),
    )
    .unwrap();
    (replayed, log)
}

/// The tag reservation saved in the data directory `dir`.
pub(crate) fn saved_reservation(dir: &std::path::Path) -> u64 {
    crpf::replica::DataDir::open(dir)
        .unwrap()
        .load_reservation()
        .unwrap()
        .unwrap()
        .reserved
}

/// Fast timers for tests.
pub(crate) fn cfg(name: &str, kind: FilterKind, capacity: u64, fpr: f64) -> ReplicaConfig {
    ReplicaConfig::for_kind(name, kind, capacity, fpr).fast()
}

/// The join of every replica's state.
pub(crate) fn merge_all(handles: &[ReplicaHandle]) -> AnyFilter {
    let mut all = handles[0].snapshot();
    for h in &handles[1..] {
        all.merge(&h.snapshot()).expect("same parameters");
    }
    all
}

/// Waits until every replica is equivalent to the join of all; `false` on timeout.
pub(crate) async fn converged(handles: &[ReplicaHandle], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let all = merge_all(handles);
        if handles.iter().all(|h| h.read(|f| f.equivalent(&all))) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a workload did: the tag of every add with its item, and the tags removes took out.
#[derive(Default, Debug, Clone)]
pub(crate) struct Log {
    pub adds: Vec<(Vec<u8>, Dot)>,
    pub removed: BTreeSet<Dot>,
}

impl Log {
    pub(crate) fn extend(&mut self, other: Log) {
        self.adds.extend(other.adds);
        self.removed.extend(other.removed);
    }
}

/// Random adds (of `prefix`-named items and of items shared by every workload) and removes of
/// items this replica has seen, `ops` in all.
pub(crate) async fn workload(h: &ReplicaHandle, prefix: &str, seed: u64, ops: usize) -> Log {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut log = Log::default();
    for i in 0..ops {
        let item = if rng.bool() {
            format!("{prefix}-{i}").into_bytes()
        } else {
            // Shared items, each added a few times at most: a cuckoo pair holds at most
            // 2 * 4 copies of one fingerprint, after which adds fail with `Full`.
            format!("shared-{}", rng.usize(..ops)).into_bytes()
        };
        if rng.f64() < 0.3 {
            if let Some(dot) = h.remove_dot(item).await.expect("remove") {
                log.removed.insert(dot);
            }
        } else {
            let dot = h
                .add(item.clone())
                .await
                .expect("add")
                .expect("OR kinds tag adds");
            log.adds.push((item, dot));
        }
        if i.is_multiple_of(16) {
            tokio::task::yield_now().await;
        }
    }
    log
}

/// Checks the observed-remove semantics on converged replicas: the live tags are exactly the
/// tags added and not removed, no tag was issued twice, and an element with a live add is
/// contained everywhere.
pub(crate) fn check_or_semantics(handles: &[ReplicaHandle], log: &Log) {
    let mut seen = BTreeSet::new();
    for (_, dot) in &log.adds {
        assert!(seen.insert(*dot), "tag {dot:?} issued twice");
    }
    let expected: BTreeSet<Dot> = log
        .adds
        .iter()
        .map(|(_, d)| *d)
        .filter(|d| !log.removed.contains(d))
        .collect();
    let mut live_items: HashMap<&[u8], usize> = HashMap::new();
    for (item, dot) in &log.adds {
        if !log.removed.contains(dot) {
            *live_items.entry(item).or_default() += 1;
        }
    }
    for h in handles {
        let dots: BTreeSet<Dot> = h.read(|f| f.dots()).into_iter().collect();
        assert_eq!(dots, expected, "replica {} live tags", h.identity().replica);
        for item in live_items.keys() {
            assert!(
                h.contains(item),
                "replica {} lost {:?}",
                h.identity().replica,
                item
            );
        }
    }
}

/// How many replication messages the replica rejected for `reason`.
pub(crate) async fn rejects(h: &ReplicaHandle, reason: &str) -> u64 {
    h.stats()
        .await
        .unwrap()
        .rejects
        .get(reason)
        .copied()
        .unwrap_or(0)
}

/// Two replicas of one filter on one shared transport (one NATS connection, one bus), both
/// pushing full states after every change: each hears the other (they converge, and what
/// `a` received is exactly what `b` sent) and none of its own messages come back to it.
pub(crate) async fn shared_transport_without_echo(
    t: std::sync::Arc<dyn crpf::transport::Transport>,
    timeout: Duration,
) {
    use crpf::replica::Replica;
    let mut cfg = cfg("echo", FilterKind::GBloom, 50_000, 0.01);
    // Every change is followed by a full-state push (several chunks of this size).
    cfg.full_state_only = true;
    cfg.chunk_bytes = 16 << 10;
    let a = Replica::start(cfg.clone(), t.clone()).await.unwrap();
    let b = Replica::start(cfg, t).await.unwrap();
    for i in 0..100u32 {
        let h = if i % 2 == 0 { &a } else { &b };
        h.add(format!("item-{i}")).await.unwrap();
    }
    assert!(converged(&[a.clone(), b.clone()], timeout).await);
    // `a` hears all that `b` sends (it subscribed first); `b` missed what `a` published
    // before it started. Digests keep flowing: wait for a moment with none in flight.
    let deadline = Instant::now() + timeout;
    let (sa, sb) = loop {
        let (sa, sb) = (a.stats().await.unwrap(), b.stats().await.unwrap());
        if sa.bytes_received == sb.bytes_sent {
            break (sa, sb);
        }
        assert!(
            Instant::now() < deadline,
            "received bytes never matched the other's sent bytes: {sa:?} {sb:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(sb.bytes_received > 0 && sb.bytes_received <= sa.bytes_sent);
    assert!(sa.state_pushes > 0 && sb.state_pushes > 0, "{sa:?} {sb:?}");
    assert!(
        sa.state_bytes_sent > 16 << 10,
        "a pushed several chunks: {sa:?}"
    );
    assert_eq!((sa.echoes_received, sb.echoes_received), (0, 0));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A transport on a connection of its own to the NATS server at `url`.
pub(crate) async fn connect(url: &str) -> std::sync::Arc<dyn crpf::transport::Transport> {
    std::sync::Arc::new(
        crpf::transport::NatsTransport::connect(crpf::transport::NatsConfig::with_servers([url]))
            .await
            .expect("connect to nats-server"),
    )
}

/// Starts `n` replicas of `cfg` on one transport.
pub(crate) async fn start_n(
    n: usize,
    cfg: &ReplicaConfig,
    t: std::sync::Arc<dyn crpf::transport::Transport>,
) -> Vec<ReplicaHandle> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(
            crpf::replica::Replica::start(cfg.clone(), t.clone())
                .await
                .unwrap(),
        );
    }
    v
}

/// Shuts every replica down (final snapshots).
pub(crate) async fn stop(handles: &[ReplicaHandle]) {
    for h in handles {
        h.shutdown().await.unwrap();
    }
}

/// Starts a replica on a connection of its own to `url`, waits until it is ready, and checks
/// that it answers at once on its own API subjects and the filter's (readiness waits for the
/// server to confirm the API's subscriptions).
pub(crate) async fn start_serving(cfg: ReplicaConfig, url: &str) -> ReplicaHandle {
    let wait = Duration::from_secs(60);
    let name = cfg.name.clone();
    let h = crpf::replica::Replica::start(cfg, connect(url).await)
        .await
        .unwrap();
    assert!(h.wait_ready(wait).await, "replica not ready");
    let client = crpf::client::Client::new(async_nats::connect(url).await.unwrap(), "crpf", &name)
        .with_timeout(Duration::from_secs(10));
    for c in [client.replica(h.identity().replica), client] {
        if let Err(e) = c.stats().await {
            panic!("a ready replica did not answer its API: {e}");
        }
    }
    h
}
