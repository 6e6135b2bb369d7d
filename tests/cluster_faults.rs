//! `crpf node` processes on a real three-server NATS JetStream cluster, with faults.
//!
//! - Three nodes with `kv_replicas = 3`, started at the same moment as a fresh cluster, all
//!   become ready (issue 8: they used to exit with "replica id claim: ... no responders" while
//!   JetStream elected its leaders). Several trials, to catch the race.
//! - Concurrent adds and removes over the NATS request API while one node and one NATS server
//!   are killed with SIGKILL; the node restarts from its data directory, the replicas converge,
//!   stop gracefully, and every acknowledged add that was not removed must be in each node's
//!   final snapshot, at the `durable` and at the `replicated` ack level (the first also being
//!   the node's default with a data directory). `CRPF_TEST_ACK=local` runs the scenario at the
//!   `local` level instead, to measure what it loses: it then only reports.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crpf::replica::{AnyFilter, DataDir};
use nats_harness::{NatsServer, Proc, api_request, cluster_key_line, crpf, free_port, spawn_node};
use serde_json::Value;

const FILTER: &str = "faults";

/// The ack level the nodes' filters are configured with (`ack = "<level>"`): `level`, or
/// `$CRPF_TEST_ACK` to measure another one.
fn ack_level(level: &str) -> String {
    std::env::var("CRPF_TEST_ACK")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| level.to_string())
}

// ---------------------------------------------------------------------------------------------
// Nodes

struct Node {
    proc: Proc,
    name: String,
    config: PathBuf,
    data_dir: PathBuf,
}

impl Node {
    /// Writes the node's config (its own server first in the list, then the others) and starts
    /// it. Nothing waits here: callers start several nodes at the same moment.
    fn start(
        dir: &Path,
        i: usize,
        servers: &[String],
        ack: Option<&str>,
        extra_filters: usize,
    ) -> Node {
        let name = format!("node{i}");
        let data_dir = dir.join(&name);
        let config = dir.join(format!("{name}.toml"));
        let mut ordered: Vec<&String> = vec![&servers[i % servers.len()]];
        ordered.extend(servers.iter().filter(|s| **s != servers[i % servers.len()]));
        let servers = ordered
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let ack = ack.map(|a| format!("ack = \"{a}\"\n")).unwrap_or_default();
        let toml = format!(
            "[node]\nmetrics_addr = \"127.0.0.1:{metrics}\"\ndata_dir = \"{data}\"\nlog = \"warn\"\n{key}\n\
             [nats]\nservers = [{servers}]\nretry_on_initial_connect = true\nname = \"fault-{name}\"\n\
             kv_replicas = 3\nrequest_timeout_ms = 2000\nping_interval_ms = 2000\n\n\
             [[filters]]\nname = \"{FILTER}\"\n\
             filter = {{ kind = \"or_cuckoo\", capacity = 100000, fpr = 0.0002 }}\n\
             delta_interval_ms = 20\nanti_entropy_interval_ms = 500\nmin_push_interval_ms = 200\n\
             catch_up_timeout_ms = 1000\nsnapshot_interval_ms = 500\nmetrics_interval_ms = 500\n{ack}",
            metrics = free_port(),
            data = data_dir.display(),
            key = cluster_key_line(),
        );
        // More filters, each claiming and renewing its own id at every start.
        let toml = (0..extra_filters).fold(toml, |t, f| {
            t + &format!(
                "\n[[filters]]\nname = \"extra{f}\"\n\
                 filter = {{ kind = \"or_cuckoo\", capacity = 1000, fpr = 0.01 }}\n\
                 catch_up_timeout_ms = 1000\n"
            )
        });
        std::fs::write(&config, toml).unwrap();
        let proc = spawn_node(&name, &config, dir);
        Node {
            proc,
            name,
            config,
            data_dir,
        }
    }

    /// Starts the node again with the same config and data directory (its log goes on).
    fn restart(&mut self) {
        let dir = self.config.parent().unwrap().to_path_buf();
        self.proc = spawn_node(&self.name, &self.config, &dir);
    }
}

fn logs(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| n.proc.log_tail())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The log lines of the nodes that contain `needle`.
fn lines_in_logs(nodes: &[Node], needle: &str) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|n| {
            std::fs::read_to_string(&n.proc.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(needle))
                .map(|l| format!("{}: {l}", n.name))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn subject(op: &str) -> String {
    format!("crpf.{FILTER}.api.{op}")
}

/// Asks `stats` `rounds` times (the API's queue group spreads the requests over the ready
/// replicas) and keeps the latest answer of each replica id. Only ready replicas serve the API.
async fn stats_by_replica(client: &async_nats::Client, rounds: usize) -> BTreeMap<u64, Value> {
    let mut by = BTreeMap::new();
    for _ in 0..rounds {
        if let Ok(s) =
            api_request(client, subject("stats"), Vec::new(), Duration::from_secs(2)).await
            && let Some(id) = s["replica"].as_u64()
        {
            by.insert(id, s);
        }
    }
    by
}

/// Waits until `n` distinct replicas answer the API, panicking (with the logs) if a node exits
/// meanwhile or the deadline passes.
async fn wait_ready(client: &async_nats::Client, nodes: &mut [Node], n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        for node in nodes.iter_mut() {
            node.proc.assert_running();
        }
        let by = stats_by_replica(client, 12).await;
        let ready = by.values().filter(|s| s["ready"] == true).count();
        if ready >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {ready} of {n} replicas ready after {timeout:?}: {by:?}\n{}",
            logs(nodes)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Start-up on a fresh cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_kv_replicas_3_all_start_on_a_fresh_cluster() {
    for trial in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let servers = NatsServer::cluster(3);
        let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
        // All three at the same moment, while JetStream is still electing its leaders.
        let mut nodes: Vec<Node> = (0..3)
            .map(|i| Node::start(dir.path(), i, &urls, None, 0))
            .collect();
        let started = Instant::now();
        let client = async_nats::connect(urls[0].clone()).await.unwrap();
        wait_ready(&client, &mut nodes, 3, Duration::from_secs(120)).await;
        let retries = lines_in_logs(&nodes, "retrying the replica id claim");
        eprintln!(
            "trial {trial}: 3 of 3 nodes ready after {:.1} s; claim retries logged: {}",
            started.elapsed().as_secs_f64(),
            retries.len()
        );
        for l in retries.iter().take(6) {
            eprintln!("  {l}");
        }
        drop(client);
        drop(nodes);
        drop(servers);
    }
}

// ---------------------------------------------------------------------------------------------
// Restarts alone after server kills (issue 27, point 1)

/// Single nodes restart from their data directories again and again against a 3-server cluster
/// with `kv_replicas = 3`, with NATS servers killed and restarted in between, so that the node
/// often talks to a server whose JetStream replica is still catching up. A node used to exit
/// with "replica id N was retired" when a read of the registry came from such a lagging
/// follower although the claim was its own. Every restart must come back ready with the
/// replica id it had. `CRPF_TEST_RESTARTS` sets the number of restarts (default 9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_restart_alone_after_server_kills_with_kv_replicas_3() {
    let restarts: usize = std::env::var("CRPF_TEST_RESTARTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let dir = tempfile::tempdir().unwrap();
    let mut servers = NatsServer::cluster(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &urls, None, 3))
        .collect();
    // Server 0 is never killed: the test's own client stays on it.
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    wait_ready(&client, &mut nodes, 3, Duration::from_secs(120)).await;
    let ids_before: BTreeSet<u64> = stats_by_replica(&client, 24).await.into_keys().collect();
    let mut failures = Vec::new();
    for round in 0..restarts {
        // Nodes 1 and 2 in turn, each first on its own server, which was just killed and
        // started again (its JetStream replica lags the other two for a while).
        let k = 1 + round % 2;
        servers[k].kill();
        nodes[k].proc.kill9();
        // Restarted while its own server is down: it claims through another server.
        nodes[k].restart();
        tokio::time::sleep(Duration::from_millis(300)).await;
        servers[k].restart();
        nodes[k].proc.kill9();
        // And again at once, now on its own server, which is catching up.
        nodes[k].restart();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(60);
        let ready = loop {
            if let Some(status) = nodes[k].proc.wait_exit(Duration::ZERO) {
                failures.push(format!(
                    "round {round}: node{k} exited with {status}: {}",
                    nodes[k].proc.log_tail()
                ));
                nodes[k].restart();
                break false;
            }
            let by = stats_by_replica(&client, 12).await;
            if by.values().filter(|s| s["ready"] == true).count() == 3 {
                // The exit came within milliseconds of the first renewal: a node that stays
                // up a while longer is past it.
                tokio::time::sleep(Duration::from_secs(1)).await;
                if nodes[k].proc.wait_exit(Duration::ZERO).is_none() {
                    break true;
                }
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: node{k} not ready\n{}",
                logs(&nodes)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        eprintln!(
            "round {round}: node{k} restarted alone; ready: {ready} after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if !ready {
            wait_ready(&client, &mut nodes, 3, Duration::from_secs(120)).await;
        }
    }
    let ids_after: BTreeSet<u64> = stats_by_replica(&client, 24).await.into_keys().collect();
    eprintln!(
        "{} of {restarts} single-node restarts failed; replica ids before {ids_before:?}, after \
         {ids_after:?}",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Each node took its own id back from its data directory.
    assert_eq!(ids_before, ids_after);
    for n in nodes.iter_mut() {
        n.proc.terminate(Duration::from_secs(30));
    }
}

// ---------------------------------------------------------------------------------------------
// Acknowledged adds under SIGKILL

/// What one load task saw.
#[derive(Default)]
struct Outcome {
    /// Items whose add was answered `{"added":true}`.
    acked: Vec<String>,
    /// Items whose remove was answered `{"removed":true}`.
    removed: HashSet<String>,
    /// Items whose remove got no answer: they may or may not be removed.
    uncertain: HashSet<String>,
    /// Adds without an answer (timeouts, no responders) or with an error answer.
    adds_unacked: u64,
    /// First few errors, for the report.
    errors: BTreeMap<String, u64>,
}

/// Counts a failure by its kind (error texts start with the subject).
fn note(out: &mut Outcome, e: String) {
    let key = e.split(": ").last().unwrap_or(&e).to_string();
    *out.errors.entry(key).or_default() += 1;
}

/// Adds unique items and removes some of its own acknowledged ones, until `deadline` or
/// `max_ops` operations.
async fn load(
    client: async_nats::Client,
    task: usize,
    deadline: Instant,
    max_ops: usize,
) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(task as u64);
    let mut out = Outcome::default();
    let mut live: Vec<String> = Vec::new();
    let timeout = Duration::from_secs(2);
    for i in 0..max_ops {
        if Instant::now() >= deadline {
            break;
        }
        if !live.is_empty() && rng.f64() < 0.2 {
            let item = live.swap_remove(rng.usize(..live.len()));
            match api_request(
                &client,
                subject("remove"),
                item.clone().into_bytes(),
                timeout,
            )
            .await
            {
                Ok(v) if v["removed"] == true => {
                    out.removed.insert(item);
                }
                // Not removed (the replica that answered had not seen the add yet, or refused):
                // the add stands.
                Ok(v) => {
                    if v.get("error").is_some() {
                        note(&mut out, format!("remove: {}", v["error"]));
                    }
                    live.push(item);
                }
                Err(e) => {
                    note(&mut out, e);
                    out.uncertain.insert(item);
                }
            }
        } else {
            let item = format!("t{task}-{i}");
            match api_request(&client, subject("add"), item.clone().into_bytes(), timeout).await {
                Ok(v) if v == serde_json::json!({"added": true}) => {
                    out.acked.push(item.clone());
                    live.push(item);
                }
                Ok(v) => {
                    note(&mut out, format!("add: {v}"));
                    out.adds_unacked += 1;
                }
                Err(e) => {
                    note(&mut out, e);
                    out.adds_unacked += 1;
                }
            }
        }
    }
    out
}

/// Waits until every live replica reports no pending delta and the same state digest, twice
/// in a row; `false` at the deadline (with each replica's figures and refusals printed).
async fn wait_converged(client: &async_nats::Client, n: usize, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut previous: Option<Vec<(u64, String)>> = None;
    let mut last = BTreeMap::new();
    while Instant::now() < deadline {
        let by = stats_by_replica(client, 15).await;
        let view: Vec<(u64, String)> = by
            .iter()
            .map(|(id, s)| (*id, format!("{}/{}", s["digest"], s["pending_delta"])))
            .collect();
        let settled = by.len() >= n
            && by.values().all(|s| s["pending_delta"] == 0)
            && by
                .values()
                .all(|s| s["digest"] == by.values().next().unwrap()["digest"]);
        if settled && previous.as_ref() == Some(&view) {
            return true;
        }
        previous = settled.then_some(view);
        last = by;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    for (id, s) in &last {
        eprintln!(
            "not converged: replica {id}: cardinality {} digest {} pending {} rejects {} \
             states merged {} deltas merged {} sequence gaps {}",
            s["cardinality"],
            s["digest"],
            s["pending_delta"],
            s["rejects"],
            s["states_merged"],
            s["deltas_merged"],
            s["sequence_gaps"]
        );
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_acks_survive_sigkill_of_a_node_and_a_server() {
    sigkill_scenario("durable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_acks_survive_sigkill_of_a_node_and_a_server() {
    sigkill_scenario("replicated").await;
}

async fn sigkill_scenario(level: &str) {
    const TASKS: usize = 4;
    const MAX_OPS_PER_TASK: usize = 2_500;
    const LOAD_FOR: Duration = Duration::from_secs(10);

    let ack = Some(ack_level(level));
    let dir = tempfile::tempdir().unwrap();
    let mut servers = NatsServer::cluster(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &urls, ack.as_deref(), 0))
        .collect();
    // The client talks to server 0, which stays up.
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    wait_ready(&client, &mut nodes, 3, Duration::from_secs(120)).await;

    let deadline = Instant::now() + LOAD_FOR;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| tokio::spawn(load(client.clone(), t, deadline, MAX_OPS_PER_TASK)))
        .collect();

    // Mid-load: node 1 and server 2 die; node 1 comes back from its data directory.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    nodes[1].proc.kill9();
    eprintln!("SIGKILL node1");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    servers[2].kill();
    eprintln!("SIGKILL nats server s2");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    nodes[1].restart();
    eprintln!("restarted node1 with its data directory");

    let mut outcome = Outcome::default();
    for t in tasks {
        let o = t.await.unwrap();
        outcome.acked.extend(o.acked);
        outcome.removed.extend(o.removed);
        outcome.uncertain.extend(o.uncertain);
        outcome.adds_unacked += o.adds_unacked;
        for (k, v) in o.errors {
            *outcome.errors.entry(k).or_default() += v;
        }
    }

    wait_ready(&client, &mut nodes, 3, Duration::from_secs(120)).await;
    let converged = wait_converged(&client, 3, Duration::from_secs(30)).await;
    drop(client);
    // A graceful stop: every node publishes what is pending and writes its final snapshot.
    for n in nodes.iter_mut() {
        n.proc.terminate(Duration::from_secs(30));
    }

    let expected: BTreeSet<&String> = outcome
        .acked
        .iter()
        .filter(|i| !outcome.removed.contains(*i) && !outcome.uncertain.contains(*i))
        .collect();
    let mut missing: Vec<BTreeSet<&String>> = Vec::new();
    let mut finals: Vec<AnyFilter> = Vec::new();
    for n in &nodes {
        let path = n.data_dir.join(FILTER);
        // The snapshot file is what `crpf inspect` reads...
        let out = crpf(&["inspect", "--json", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "crpf inspect {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // ... and its state answers membership.
        let snap = DataDir::open(&path)
            .unwrap()
            .load_snapshot()
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no snapshot", n.name));
        let filter = AnyFilter::decode_state(snap.kind, &snap.state).unwrap();
        finals.push(filter.clone());
        missing.push(
            expected
                .iter()
                .filter(|i| !filter.contains(i.as_bytes()))
                .copied()
                .collect(),
        );
    }
    let lost_everywhere: BTreeSet<&String> =
        missing.iter().skip(1).fold(missing[0].clone(), |acc, m| {
            acc.intersection(m).copied().collect()
        });
    let missing_somewhere: BTreeSet<&String> = missing.iter().flatten().copied().collect();

    eprintln!(
        "ack level: {}\n\
         acknowledged adds: {} ({} adds unacknowledged); acknowledged removes: {}; \
         removes without an answer: {}\n\
         expected in every replica: {}\n\
         LOST acknowledged adds (in no replica): {}\n\
         missing per replica: {:?}; converged before the stop: {converged}\n\
         request failures: {:?}\n\
         sample of lost: {:?}",
        ack.as_deref().unwrap_or_default(),
        outcome.acked.len(),
        outcome.adds_unacked,
        outcome.removed.len(),
        outcome.uncertain.len(),
        expected.len(),
        lost_everywhere.len(),
        missing.iter().map(BTreeSet::len).collect::<Vec<_>>(),
        outcome.errors,
        lost_everywhere.iter().take(10).collect::<Vec<_>>(),
    );

    assert!(
        outcome.acked.len() >= 100,
        "the load hardly ran: {} acknowledged adds; {:?}",
        outcome.acked.len(),
        outcome.errors
    );
    if missing_somewhere.len() != lost_everywhere.len() {
        eprintln!("{}\n{}", diagnose_divergence(&nodes, &finals), logs(&nodes));
    }
    // Whatever the ack level, the replicas converge: each misses exactly what all miss.
    assert_eq!(
        missing_somewhere.len(),
        lost_everywhere.len(),
        "replicas diverge: missing per replica {:?}",
        missing.iter().map(BTreeSet::len).collect::<Vec<_>>()
    );
    if ack.as_deref() != Some("local") {
        assert!(
            lost_everywhere.is_empty(),
            "{} acknowledged adds lost with ack = {:?}: {:?}",
            lost_everywhere.len(),
            ack,
            lost_everywhere.iter().take(20).collect::<Vec<_>>()
        );
    }
}

/// What tells diverged final states apart: per node, the tags live elsewhere but not here
/// (and whether its history claims to have seen them: a remove, or a tag issued twice), and
/// which states are below which.
fn diagnose_divergence(nodes: &[Node], finals: &[AnyFilter]) -> String {
    let dots: Vec<BTreeSet<crpf::Dot>> = finals
        .iter()
        .map(|f| f.dots().into_iter().collect())
        .collect();
    let mut out = String::from("divergence:\n");
    for (i, f) in finals.iter().enumerate() {
        let elsewhere: BTreeSet<crpf::Dot> = dots
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, d)| d.iter().copied())
            .collect();
        let lacking: Vec<crpf::Dot> = elsewhere.difference(&dots[i]).copied().collect();
        let history = f.history();
        let seen = lacking
            .iter()
            .filter(|d| history.as_ref().is_some_and(|h| h.contains(**d)))
            .count();
        let le: Vec<usize> = (0..finals.len()).filter(|j| f.le(&finals[*j])).collect();
        out += &format!(
            "  {} (replica {}, clock {}): {} tags live, lacks {} live elsewhere ({} of them in its \
             history), le {:?}; sample {:?}\n",
            nodes[i].name,
            f.replica(),
            f.clock(),
            dots[i].len(),
            lacking.len(),
            seen,
            le,
            lacking.iter().take(8).collect::<Vec<_>>()
        );
    }
    out
}
