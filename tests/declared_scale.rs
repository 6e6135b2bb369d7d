//! 1,000 filters declared in a node's configuration file (`[[filters]]`) over a real
//! nats-server (issue 52): they start and idle without a JetStream round trip per filter
//! (they share the node's replica id, as catalog filters do, where their kind has no tags),
//! the node's subscriptions take their `$SRV` and own API subjects (one subscription of each
//! filter is left, its queue group's, which the node keeps), and each still answers its API
//! once. Counts, not times: the server's JetStream API requests, subscriptions and messages.
//! With the default `declared_metrics = "node"` idle declared filters park as catalog ones
//! do, alone and with a peer on another node, and resume for a request or a peer's delta;
//! parked, they send the server nothing.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nats_harness::{
    NatsServer, Proc, api_request, cluster_key_line, count_replies, crpf, free_port, http_get,
    resp_command, resp_has, spawn_node,
};
use serde_json::Value;

const FILTERS: usize = 1_000;

/// A configured filter renews its own id claim this often (ms) where it keeps one: the idle
/// window below spans several renewals.
const RENEW_MS: u64 = 500;

fn monitor_json(monitor: u16, path: &str) -> Value {
    let (_, body) = http_get(&format!("127.0.0.1:{monitor}"), path).unwrap();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// JetStream API requests the server has answered so far.
fn jetstream_requests(monitor: u16) -> u64 {
    monitor_json(monitor, "/jsz")["api"]["total"]
        .as_u64()
        .expect("api.total")
}

/// Replicas that reported ready in `node`'s log (its `replica ready` lines): in the
/// node-wide series (the default) a declared filter has no `crpf_ready` of its own.
fn ready(node: &Proc) -> usize {
    std::fs::read_to_string(&node.log).map_or(0, |log| log.matches("replica ready").count())
}

/// Messages the server has taken in from its clients so far.
fn messages_in(monitor: u16) -> u64 {
    monitor_json(monitor, "/varz")["in_msgs"]
        .as_u64()
        .expect("in_msgs")
}

/// Anti-entropy interval (ms) of the first test's filters: the idle window spans several.
const INTERVAL_MS: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_declared_filters_start_and_idle_without_a_round_trip_each() {
    let monitor = free_port();
    let server = NatsServer::start_with_config(&format!("http: \"127.0.0.1:{monitor}\"\n"));
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    // The default configuration but for its times (declared filters in the node-wide
    // series, so that idle ones park), scaled down to the test's.
    let mut config = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{metrics}\"\n\
         log = \"warn,crpf::replica::actor=info\"\n{}\n[nats]\nservers = [\"{}\"]\n\n\
         [catalog]\npark_after_ms = 300\n\
         [catalog.defaults]\nanti_entropy_interval_ms = {INTERVAL_MS}\n\n",
        cluster_key_line(),
        server.url()
    );
    for i in 0..FILTERS {
        config.push_str(&format!(
            "[[filters]]\nname = \"d{i}\"\nid_lease_renew_ms = {RENEW_MS}\n\
             anti_entropy_interval_ms = {INTERVAL_MS}\n\
             filter = {{ kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }}\n"
        ));
    }
    let path = dir.path().join("node.toml");
    std::fs::write(&path, config).unwrap();
    let before_start = jetstream_requests(monitor);
    let mut node = Proc::spawn(
        "node",
        crpf(&["node", "--config", path.to_str().unwrap()]),
        dir.path().join("node.log"),
    );
    loop {
        node.assert_running();
        if ready(&node) >= FILTERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The start: the node's own few requests (its id's claim and renewal, the catalog's
    // bucket, listing and watch), not two or more per filter.
    let at_start = jetstream_requests(monitor) - before_start;
    eprintln!("JetStream API requests while {FILTERS} declared filters started: {at_start}");
    assert!(
        at_start < 100,
        "{at_start} JetStream requests to start {FILTERS} declared filters\n{}",
        node.log_tail()
    );
    // Subscriptions: the node's own (a dozen) and one per filter, its API's queue group
    // (each filter had seven: the group's two, its own two, `$SRV`'s three).
    let subscriptions = monitor_json(monitor, "/varz")["subscriptions"]
        .as_u64()
        .unwrap();
    eprintln!("subscriptions: {subscriptions}");
    assert!(
        subscriptions < FILTERS as u64 + 100,
        "{subscriptions} subscriptions for {FILTERS} declared filters"
    );

    // Idle over several of a filter's own renewal intervals: the node renews its one id,
    // the filters nothing.
    let idle_from = jetstream_requests(monitor);
    tokio::time::sleep(Duration::from_millis(RENEW_MS * 6)).await;
    let idle = jetstream_requests(monitor) - idle_from;
    eprintln!("JetStream API requests over 6 renewal intervals idle: {idle}");
    assert!(
        idle < 50,
        "{idle} JetStream requests from {FILTERS} idle declared filters"
    );

    // Each still answers its API, once, on the queue group's subject and on its own under
    // the node's id, and the service protocol by its name.
    let client = async_nats::connect(server.url()).await.unwrap();
    let timeout = Duration::from_secs(10);
    let added = client
        .request("crpf.d7.api.add", Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&added.payload).unwrap()["added"],
        true
    );
    let id = added
        .headers
        .as_ref()
        .and_then(|h| h.get("Crpf-Replica"))
        .expect("Crpf-Replica")
        .to_string();
    let own = format!("crpf.d7.replica.{id}.api.contains");
    let found = api_request(&client, own.clone(), b"x".to_vec(), timeout)
        .await
        .unwrap();
    assert_eq!(found["contains"], true, "{own}: {found}");
    assert_eq!(count_replies(&client, own.clone(), b"x").await, 1, "{own}");
    assert_eq!(
        count_replies(&client, "crpf.d8.api.contains".into(), b"x").await,
        1
    );
    let root = api_request(&client, "crpf.d9.api".into(), Vec::new(), timeout)
        .await
        .unwrap();
    assert!(root["error"].is_string(), "{root}");
    let ping = api_request(&client, "$SRV.PING.crpf-d5".into(), Vec::new(), timeout)
        .await
        .unwrap();
    assert_eq!(ping["metadata"]["filter"], "d5", "{ping}");
    assert_eq!(
        count_replies(&client, "$SRV.PING.crpf-d5".into(), b"x").await,
        1
    );

    // By default idle declared filters park, as catalog ones do: then nothing of theirs
    // goes to the server. Awake, each alone sent a digest at least every six intervals
    // (over 600 messages in the window below); parked, the node sends its id's renewal.
    wait_parked(
        &mut node,
        metrics,
        FILTERS,
        "idle with the default configuration",
    );
    let from = messages_in(monitor);
    tokio::time::sleep(Duration::from_millis(INTERVAL_MS * 8)).await;
    let idle = messages_in(monitor) - from;
    eprintln!("messages into the server over 8 intervals, {FILTERS} parked: {idle}");
    assert!(
        idle < 20,
        "{idle} messages from {FILTERS} parked declared filters\n{}",
        node.log_tail()
    );
    // A parked one still answers, once.
    assert_eq!(
        count_replies(&client, "crpf.d8.api.contains".into(), b"x").await,
        1
    );
    node.terminate(Duration::from_secs(30));
}

/// The sum of the lines of `series` (exactly that name, any labels) on `metrics`' endpoint.
fn metric(metrics: u16, series: &str) -> f64 {
    let Ok((_, body)) = http_get(&format!("127.0.0.1:{metrics}"), "/metrics") else {
        return -1.0;
    };
    body.lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `node` (metrics on `metrics`) has `n` parked filters.
fn wait_parked(node: &mut Proc, metrics: u16, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let parked = metric(metrics, "crpf_parked_filters");
        if parked == n as f64 {
            return;
        }
        node.assert_running();
        assert!(
            Instant::now() < deadline,
            "{what}: {parked} parked filters, not {n}\n{}",
            node.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node's configuration: `filters` declared `g_bloom` filters named `<prefix>0..`, in the
/// node-wide series (said, though the default), parking after 300 ms, with a data directory (and RESP on `resp`).
fn parking_config(
    dir: &Path,
    name: &str,
    (server, metrics, resp): (&str, u16, u16),
    (prefix, filters): (&str, usize),
) -> std::path::PathBuf {
    let mut config = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{metrics}\"\ndata_dir = \"{}\"\nlog = \"warn\"\n{}\n\
         [nats]\nservers = [\"{server}\"]\nretry_on_initial_connect = true\n\n\
         [resp]\nlisten = \"127.0.0.1:{resp}\"\n\n\
         [catalog]\npark_after_ms = 300\ndeclared_metrics = \"node\"\n\
         [catalog.defaults]\nanti_entropy_interval_ms = 250\n\n",
        dir.join(name).display(),
        cluster_key_line(),
    );
    for i in 0..filters {
        config.push_str(&format!(
            "[[filters]]\nname = \"{prefix}{i}\"\nanti_entropy_interval_ms = 250\n\
             delta_interval_ms = 10\nmin_push_interval_ms = 100\ncatch_up_timeout_ms = 300\n\
             filter = {{ kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }}\n"
        ));
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

/// 1,000 declared filters in the node-wide series park once idle (no actor runs: the
/// node's parked gauge counts them all); a request on a parked one's queue group resumes it
/// and is answered (an add at `durable`, then `contains`), and it parks again; the add
/// survives the node's kill and restart (nothing acknowledged at `durable` is lost across
/// park and resume).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_declared_filters_park_and_a_request_resumes_one() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (metrics, resp) = (free_port(), free_port());
    let config = parking_config(
        dir.path(),
        "node",
        (&server.url(), metrics, resp),
        ("d", FILTERS),
    );
    let mut node = spawn_node("node", &config, dir.path());
    wait_parked(&mut node, metrics, FILTERS, "idle after the start");

    let client = async_nats::connect(server.url()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Crpf-Ack", "durable");
    let added = client
        .request_with_headers("crpf.d7.api.add", headers, "durable-x".into())
        .await
        .unwrap();
    let added: Value = serde_json::from_slice(&added.payload).unwrap();
    assert_eq!(added["added"], true, "{added}");
    let timeout = Duration::from_secs(10);
    let found = api_request(
        &client,
        "crpf.d7.api.contains".into(),
        b"durable-x".to_vec(),
        timeout,
    )
    .await
    .unwrap();
    assert_eq!(found["contains"], true, "{found}");
    assert!(metric(metrics, "crpf_parking_total{change=\"resumed\"}") >= 1.0);
    wait_parked(&mut node, metrics, FILTERS, "idle again after the add");
    // Parked, it still answers, over NATS and RESP (each resumes it).
    let found = api_request(
        &client,
        "crpf.d7.api.contains".into(),
        b"durable-x".to_vec(),
        timeout,
    )
    .await
    .unwrap();
    assert_eq!(found["contains"], true, "{found}");

    node.kill9();
    let mut node = spawn_node("node", &config, dir.path());
    let resp = format!("127.0.0.1:{resp}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !resp_has(&resp, "d7", "durable-x") {
        node.assert_running();
        assert!(
            Instant::now() < deadline,
            "the durable add was lost at the kill\n{}",
            node.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!resp_has(&resp, "d8", "durable-x"));
    node.terminate(Duration::from_secs(30));
}

/// A declared filter with a peer on another node parks on both (each node announces its
/// parked replica's digest and answers the peer's equal ones); adds through one node's
/// replica wake the other's parked replica (a delta), both converge, and both park again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_filters_with_a_peer_park_and_converge_after_adds() {
    const PEERED: usize = 4;
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<(Proc, u16, String)> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let (metrics, resp) = (free_port(), free_port());
            let config = parking_config(
                dir.path(),
                name,
                (&server.url(), metrics, resp),
                ("p", PEERED),
            );
            let proc = spawn_node(name, &config, dir.path());
            (proc, metrics, format!("127.0.0.1:{resp}"))
        })
        .collect();
    for (proc, metrics, _) in &mut nodes {
        wait_parked(proc, *metrics, PEERED, "at rest after the start");
    }
    let digests = "crpf_parked_messages_total{body=\"digest\"}";
    let answered = metric(nodes[1].1, digests);

    for i in 0..PEERED {
        let name = format!("p{i}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(
            resp_command(&nodes[0].2, &["BF.ADD", &name, "alice"]),
            Ok(redis::Value::Int(_))
        ) {
            assert!(Instant::now() < deadline, "BF.ADD {name} on a");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for i in 0..PEERED {
        let name = format!("p{i}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !resp_has(&nodes[1].2, &name, "alice") {
            nodes[1].0.assert_running();
            assert!(
                Instant::now() < deadline,
                "b's {name} never had alice\n{}",
                nodes[1].0.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (proc, metrics, _) in &mut nodes {
        wait_parked(proc, *metrics, PEERED, "at rest after the adds");
    }
    // Parked on both, each node answers the other's equal digests for its replicas.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(nodes[1].1, digests) <= answered {
        assert!(
            Instant::now() < deadline,
            "b answered no digest for its parked replicas"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for (mut proc, _, _) in nodes {
        proc.terminate(Duration::from_secs(30));
    }
}
