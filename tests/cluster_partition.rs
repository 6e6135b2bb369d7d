//! `crpf node` processes on a real three-server NATS cluster whose routes go through TCP
//! proxies the test cuts (a route partition: every client connection stays up).
//!
//! - `replicated` means a peer has it (issue 47, item 4): the node on the cut-off server
//!   answers `replicated` adds with 504 for the whole partition, also once its peers have
//!   expired from its view (it used to answer them `{"added":true}` alone then), and answers
//!   them again after the heal.
//! - A replica whose id was retired during the partition takes it back after the heal (issue
//!   47, item 8): both a configured filter's own id and the node's id of its catalog filters;
//!   the node on the cut-off server answers tagged adds again without a restart.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use nats_harness::{
    NatsServer, Proc, api_request, cluster_key_line, free_port, http_get, spawn_node,
};

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

/// Ids unrenewed this long are retired: the partition lasts several times as long.
const RETIRE_AFTER_MS: u64 = 2_000;
/// A configured OR filter, whose replicas hold ids of their own.
const TAGGED: &str = "tagged";
/// An OR filter made through the catalog: its replicas issue tags under their node's id.
const CATALOG_TAGGED: &str = "cattagged";

/// Starts node `i` on `servers[i]` alone with [`TAGGED`] configured, ids renewed every 250 ms
/// and retired after [`RETIRE_AFTER_MS`]: its own and its node id alike. Answers the node
/// and its metrics and RESP addresses.
fn start_retiring_node(dir: &Path, i: usize, servers: &[String]) -> (Proc, String, String) {
    let name = format!("node{i}");
    let metrics = format!("127.0.0.1:{}", free_port());
    let resp = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[node]\nmetrics_addr = \"{metrics}\"\nlog = \"info\"\n{key}\n\
         [nats]\nservers = [\"{server}\"]\nretry_on_initial_connect = true\n\
         name = \"retire-{name}\"\nkv_replicas = 3\nrequest_timeout_ms = 2000\n\
         ping_interval_ms = 2000\n\n[resp]\nlisten = \"{resp}\"\n\n\
         [catalog]\nmetrics_filters = [\"{TAGGED}\"]\n\n\
         [catalog.defaults]\nretire_after_ms = {RETIRE_AFTER_MS}\nid_lease_renew_ms = 250\n\
         delta_interval_ms = 5\nanti_entropy_interval_ms = 250\n\n\
         [[filters]]\nname = \"{TAGGED}\"\n\
         filter = {{ kind = \"or_cuckoo\", capacity = 10000, fpr = 0.01 }}\nack = \"local\"\n\
         delta_interval_ms = 5\nanti_entropy_interval_ms = 250\npeer_expiry_ms = {PEER_EXPIRY_MS}\n\
         catch_up_timeout_ms = 1000\nid_lease_renew_ms = 250\nretire_after_ms = {RETIRE_AFTER_MS}\n",
        key = cluster_key_line(),
        server = servers[i],
    );
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, toml).unwrap();
    (spawn_node(&name, &config, dir), metrics, resp)
}

/// The sum of the metric lines starting with `series` on a node's exporter.
fn metric(addr: &str, series: &str) -> f64 {
    let Ok((_, body)) = http_get(addr, "/metrics") else {
        return 0.0;
    };
    body.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_retired_during_a_partition_are_taken_back_after_the_heal() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, routes) = NatsServer::cluster_with_cuttable_last(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes = Vec::new();
    let (mut metrics, mut resp) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (n, m, r) = start_retiring_node(dir.path(), i, &urls);
        nodes.push(n);
        metrics.push(m);
        resp.push(r);
    }
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    let create = serde_json::to_vec(&serde_json::json!({
        "name": CATALOG_TAGGED,
        "filter": {"kind": "or_cuckoo", "capacity": 10000, "fpr": 0.01},
    }))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while api_request(
        &client,
        "crpf.$catalog.create".into(),
        create.clone(),
        Duration::from_secs(5),
    )
    .await
    .is_err()
    {
        assert!(Instant::now() < deadline, "{}", nodes[0].log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Node2 (on the server that is cut off) takes adds over RESP: its own replicas answer.
    let isolated = &resp[2];
    for filter in [TAGGED, CATALOG_TAGGED] {
        cf_add_until(isolated, filter, "before", &nodes);
    }
    let id_before = replica_label(&metrics[2], TAGGED);
    let node_id = grep_log(&nodes[2], &["claimed the node's replica id"])
        .split("replica=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .expect("node2's node id in its log")
        .to_string();
    let keys = [
        format!("{TAGGED}.{id_before}"),
        format!("_node.ids.{node_id}"),
    ];
    let registry = async_nats::jetstream::new(client.clone())
        .get_key_value("crpf_replicas")
        .await
        .unwrap();

    routes.cut();
    // The majority side retires the cut-off node's ids (its filter's and its node's) once
    // they went unrenewed for RETIRE_AFTER_MS.
    let deadline = Instant::now() + Duration::from_secs(60);
    for key in &keys {
        loop {
            let record = registry.get(key).await.ok().flatten().unwrap_or_default();
            if String::from_utf8_lossy(&record).contains("retired") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} not retired: {}\n{}\n{}",
                String::from_utf8_lossy(&record),
                grep_log(&nodes[0], &["retire", "registry", "claim", "JetStream"]),
                grep_log(&nodes[1], &["retire", "registry", "claim", "JetStream"])
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    routes.heal();
    // The cut-off node finds its ids retired at its next renewals and takes them back (no
    // other node claims an id meanwhile): its log says so. (Not read from the registry: a
    // read may be answered by the cut-off server's stale copy for a while after the heal.)
    let deadline = Instant::now() + Duration::from_secs(60);
    let taken_back = |log: &str| {
        log.contains("took this replica's retired id back")
            && log.contains("took this node's retired replica id back")
    };
    while !taken_back(&grep_log(&nodes[2], &["took this"])) {
        assert!(
            Instant::now() < deadline,
            "{}",
            grep_log(&nodes[2], &["retired", "registry", "node's", "JetStream"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its tagged adds are answered, with no restart, under the same id.
    for filter in [TAGGED, CATALOG_TAGGED] {
        cf_add_until(isolated, filter, "after", &nodes);
    }
    assert_eq!(replica_label(&metrics[2], TAGGED), id_before);
    assert_eq!(metric(&metrics[2], "crpf_replica_id_lost{"), 0.0);
    for n in nodes.iter_mut() {
        n.assert_running();
    }
}

/// `CF.ADD filter item` on the node at `resp` until it is answered (within a minute).
fn cf_add_until(resp: &str, filter: &str, item: &str, nodes: &[Proc]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = redis::Client::open(format!("redis://{resp}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(3)))
            .and_then(|mut c| {
                redis::cmd("CF.ADD")
                    .arg(filter)
                    .arg(item)
                    .query::<i64>(&mut c)
            });
        match answer {
            Ok(_) => return,
            Err(e) if Instant::now() > deadline => {
                let logs: Vec<String> = nodes.iter().map(Proc::log_tail).collect();
                panic!(
                    "CF.ADD {filter} {item} never answered: {e}\n{}",
                    logs.join("\n")
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The `replica` label of `filter`'s series on a node's exporter.
fn replica_label(addr: &str, filter: &str) -> String {
    let (_, body) = http_get(addr, "/metrics").unwrap();
    let head = format!("{{filter=\"{filter}\",replica=\"");
    body.lines()
        .find_map(|l| {
            let rest = &l[l.find(&head)? + head.len()..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .unwrap_or_else(|| panic!("no series of {filter}"))
}

/// The lines of a node's log that name any of `words`.
fn grep_log(node: &Proc, words: &[&str]) -> String {
    let text = std::fs::read_to_string(&node.log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| words.iter().any(|w| l.contains(w)))
        .collect();
    format!("--- {} ---\n{}", node.name, lines.join("\n"))
}
