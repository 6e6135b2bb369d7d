//! `crpf node` processes on a real three-server NATS cluster whose routes go through TCP
//! proxies the test cuts (a route partition: every client connection stays up).
//!
//! - `replicated` means a peer has it (issue 47, item 4): the node on the cut-off server
//!   answers `replicated` adds with 504 for the whole partition, also once its peers have
//!   expired from its view (it used to answer them `{"added":true}` alone then), and answers
//!   them again after the heal.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use nats_harness::{NatsServer, Proc, api_request, cluster_key_line, free_port, spawn_node};

const FILTER: &str = "parted";
/// Peers unheard for this long expire from a replica's view: the partition lasts several
/// times as long, so that the isolated node answers with no live peer for most of it.
const PEER_EXPIRY_MS: u64 = 1_500;
const REPLICATED_TIMEOUT_MS: u64 = 500;

/// Starts node `i` on `servers[i]` alone (a client shuffles the servers it is given: node2
/// must be on the server that is cut off).
fn start_node(dir: &Path, i: usize, servers: &[String]) -> Proc {
    let name = format!("node{i}");
    let servers = format!("\"{}\"", servers[i]);
    let toml = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{metrics}\"\nlog = \"info\"\n{key}\n\
         [nats]\nservers = [{servers}]\nretry_on_initial_connect = true\nname = \"part-{name}\"\n\
         kv_replicas = 3\nrequest_timeout_ms = 2000\nping_interval_ms = 2000\n\n\
         [[filters]]\nname = \"{FILTER}\"\n\
         filter = {{ kind = \"g_bloom\", capacity = 10000, fpr = 0.01 }}\n\
         ack = \"replicated\"\nreplicated_timeout_ms = {REPLICATED_TIMEOUT_MS}\n\
         delta_interval_ms = 5\nanti_entropy_interval_ms = 250\npeer_expiry_ms = {PEER_EXPIRY_MS}\n\
         catch_up_timeout_ms = 1000\nmetrics_interval_ms = 500\n",
        metrics = free_port(),
        key = cluster_key_line(),
    );
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    spawn_node(&name, &config, dir)
}

/// An add at the filter's level (`replicated`): `Ok` when answered `{"added":true}`, else the
/// answer (or the absence of one).
async fn add(client: &async_nats::Client, item: &str) -> Result<(), String> {
    let subject = format!("crpf.{FILTER}.api.add");
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        client.request(subject, item.as_bytes().to_vec().into()),
    )
    .await
    .map_err(|_| "no reply".to_string())?
    .map_err(|e| e.to_string())?;
    let code = reply
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Service-Error-Code"))
        .map(|v| v.as_str().to_string());
    let body = String::from_utf8_lossy(&reply.payload).into_owned();
    match code {
        None if body.contains("\"added\":true") => Ok(()),
        code => Err(format!("{}: {body}", code.unwrap_or_default())),
    }
}

/// Adds `item` until one is answered `{"added":true}`; panics with the last answer and the logs
/// at the deadline.
async fn add_until_ok(client: &async_nats::Client, item: &str, timeout: Duration, nodes: &[Proc]) {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match add(client, item).await {
            Ok(()) => return,
            Err(e) => e,
        };
        if Instant::now() > deadline {
            let logs: Vec<String> = nodes.iter().map(Proc::log_tail).collect();
            panic!(
                "`{item}` never acknowledged replicated within {timeout:?}: {last}\n{}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until each server's client is answered `stats` by a distinct ready replica (a server
/// hands requests to its own clients' subscriptions first: node `i`'s, once it serves).
async fn wait_all_serving(clients: &[async_nats::Client], nodes: &mut [Proc]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut ids = std::collections::BTreeSet::new();
        for c in clients {
            let subject = format!("crpf.{FILTER}.api.stats");
            if let Ok(s) = api_request(c, subject, Vec::new(), Duration::from_secs(2)).await
                && s["ready"] == true
                && let Some(id) = s["replica"].as_u64()
            {
                ids.insert(id);
            }
        }
        if ids.len() == clients.len() {
            return;
        }
        for n in nodes.iter_mut() {
            n.assert_running();
        }
        assert!(Instant::now() < deadline, "only {ids:?} serve");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_by_a_route_partition_never_acknowledges_replicated() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, routes) = NatsServer::cluster_with_cuttable_last(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Proc> = (0..3).map(|i| start_node(dir.path(), i, &urls)).collect();
    let mut clients = Vec::new();
    for u in &urls {
        clients.push(async_nats::connect(u.clone()).await.unwrap());
    }
    wait_all_serving(&clients, &mut nodes).await;
    // A client of the server that is cut off: its requests reach only node2 in the partition.
    let isolated = clients[2].clone();
    // Every node up and heard by the others: node2's replicated add is confirmed.
    add_until_ok(&isolated, "before", Duration::from_secs(60), &nodes).await;

    routes.cut();
    // Requests already on their way to the other servers' replicas may still be answered
    // (or lost): probe once the cut-off server has seen its routes close (milliseconds).
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Over several peer expiries: node2's peers expire from its view within the first.
    let partition = Duration::from_millis(PEER_EXPIRY_MS * 5);
    let cut_at = Instant::now();
    let mut probes = 0;
    while cut_at.elapsed() < partition {
        let item = format!("during-{probes}");
        match add(&isolated, &item).await {
            Err(e) if e.starts_with("504") => {}
            other => panic!(
                "probe {probes}, {:.1} s into the partition: a replicated add of the isolated \
                 node was answered {other:?}, not 504 (no peer can have merged it)\n{}",
                cut_at.elapsed().as_secs_f64(),
                nodes[2].log_tail()
            ),
        }
        probes += 1;
    }
    eprintln!(
        "{probes} replicated probes on the isolated side over {:.1} s: all 504",
        cut_at.elapsed().as_secs_f64()
    );
    assert!(probes >= 3, "too few probes to tell: {probes}");

    routes.heal();
    add_until_ok(&isolated, "after", Duration::from_secs(60), &nodes).await;
    eprintln!(
        "acknowledged replicated again {:.1} s after the heal",
        (Instant::now() - cut_at - partition).as_secs_f64()
    );
    for n in nodes.iter_mut() {
        n.assert_running();
    }
}
