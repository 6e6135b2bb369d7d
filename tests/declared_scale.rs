//! 1,000 filters declared in a node's configuration file (`[[filters]]`) over a real
//! nats-server (issue 52): they start and idle without a JetStream round trip per filter
//! (they share the node's replica id, as catalog filters do, where their kind has no tags),
//! the node's subscriptions take their `$SRV` and own API subjects (one subscription of each
//! filter is left, its queue group's), and each still answers its API once. Counts, not
//! times: the server's JetStream API requests and subscriptions.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::time::Duration;

use bytes::Bytes;
use nats_harness::{
    NatsServer, Proc, api_request, cluster_key_line, count_replies, crpf, free_port, http_get,
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

/// Filters whose `crpf_ready` is 1 on the node's metrics endpoint.
fn ready(metrics: u16) -> usize {
    http_get(&format!("127.0.0.1:{metrics}"), "/metrics").map_or(0, |(_, body)| {
        body.lines()
            .filter(|l| l.starts_with("crpf_ready{") && l.ends_with(" 1"))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_declared_filters_start_and_idle_without_a_round_trip_each() {
    let monitor = free_port();
    let server = NatsServer::start_with_config(&format!("http: \"127.0.0.1:{monitor}\"\n"));
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let mut config = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{metrics}\"\nlog = \"warn\"\n{}\n[nats]\nservers = [\"{}\"]\n\n[catalog]\n\n",
        cluster_key_line(),
        server.url()
    );
    for i in 0..FILTERS {
        config.push_str(&format!(
            "[[filters]]\nname = \"d{i}\"\nid_lease_renew_ms = {RENEW_MS}\n\
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
        if ready(metrics) == FILTERS {
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
    node.terminate(Duration::from_secs(30));
}
