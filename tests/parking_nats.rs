//! Replicas with peers park too (issue 53, item 1), across `crpf node` processes over a real
//! three-server NATS cluster: once a cluster is at rest no replica actor runs on any node
//! (`crpf_parked_filters` equals the filter count everywhere), and its parked replicas still
//! take every add made on another node (a delta wakes them), catch up after a node restart,
//! and after a route partition heals (a differing digest wakes them). Each node is checked
//! through its own RESP port, so the answer is that node's replica's.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use nats_harness::{
    NatsServer, Proc, api_request, cluster_key_line, free_port, http_get, spawn_node,
};
use serde_json::json;

/// Filters of each test: enough for batches of many digests, few enough for seconds.
const FILTERS: usize = 12;

struct Node {
    proc: Proc,
    name: String,
    config: std::path::PathBuf,
    resp: String,
    metrics: String,
}

impl Node {
    /// Node `i` on `servers` (`servers[i]` only if `own_server_only`: a node of a server
    /// that is cut off must stay on it), parking idle replicas after 400 ms, with RESP and
    /// a data directory.
    fn start(dir: &Path, i: usize, servers: &[String], own_server_only: bool) -> Node {
        let name = format!("node{i}");
        let own = &servers[i % servers.len()];
        let list = std::iter::once(own)
            .chain(servers.iter().filter(|s| *s != own && !own_server_only))
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let resp = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "[node]\nmetrics_addr = \"{metrics}\"\ndata_dir = \"{data}\"\nlog = \"info\"\n{key}\n\
                 [nats]\nservers = [{list}]\nretry_on_initial_connect = true\nkv_replicas = 3\n\
                 name = \"park-{name}\"\n\n\
                 [resp]\nlisten = \"{resp}\"\n\n\
                 [catalog]\npark_after_ms = 400\n\
                 [catalog.defaults]\ndelta_interval_ms = 10\nanti_entropy_interval_ms = 250\n\
                 min_push_interval_ms = 100\ncatch_up_timeout_ms = 300\nsnapshot_interval_ms = 500\n",
                data = dir.join(&name).display(),
                key = cluster_key_line(),
            ),
        )
        .unwrap();
        let proc = spawn_node(&name, &config, dir);
        Node {
            proc,
            name,
            config,
            resp,
            metrics,
        }
    }

    fn restart(&mut self) {
        let dir = self.config.parent().unwrap().to_path_buf();
        self.proc = spawn_node(&self.name, &self.config, &dir);
    }

    /// One RESP command to this node (a fresh connection), its reply or error text.
    fn resp(&self, args: &[&str]) -> Result<redis::Value, String> {
        nats_harness::resp_command(&self.resp, args)
    }

    /// Whether this node answers `BF.EXISTS filter item` with 1.
    fn has(&self, filter: &str, item: &str) -> bool {
        nats_harness::resp_has(&self.resp, filter, item)
    }

    /// `BF.ADD filter item` on this node, until it is answered.
    fn add(&self, filter: &str, item: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.resp(&["BF.ADD", filter, item]) {
                Ok(redis::Value::Int(_)) => return,
                other => assert!(
                    Instant::now() < deadline,
                    "{}: BF.ADD {filter} {item}: {other:?}",
                    self.name
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node's replica id for its catalog filters, as its log says it claimed it last.
    fn node_id(&self) -> String {
        let log = std::fs::read_to_string(&self.proc.log).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("claimed the node's replica id"))
            .filter_map(|l| l.split("replica=").nth(1)?.split(' ').next())
            .next_back()
            .unwrap_or_else(|| panic!("{}: no node id in its log", self.name))
            .to_string()
    }

    /// The sum of the metric lines of `series` (exactly that name, any labels).
    fn metric(&self, series: &str) -> f64 {
        let Ok((_, body)) = http_get(&self.metrics, "/metrics") else {
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

    /// `BF.ADD filter item` on this node at `durable` (answered once its log synced it).
    fn add_durable(&self, filter: &str, item: &str) {
        let client = redis::Client::open(format!("redis://{}/", self.resp)).unwrap();
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let _: () = redis::cmd("CRPF.ACK")
            .arg("durable")
            .query(&mut con)
            .unwrap();
        let added: Result<i64, _> = redis::cmd("BF.ADD").arg(filter).arg(item).query(&mut con);
        assert!(
            added.is_ok(),
            "{}: durable BF.ADD {filter} {item}: {added:?}",
            self.name
        );
    }

    /// A counter of this node's series `series` with `label` (`key="value"`), 0 if absent.
    fn counter(&self, series: &str, label: &str) -> f64 {
        let Ok((_, body)) = http_get(&self.metrics, "/metrics") else {
            return -1.0;
        };
        body.lines()
            .filter(|l| l.starts_with(&format!("{series}{{")) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits until this node's RESP port serves `filters` filters (its catalog loaded).
    fn wait_serving(&mut self, filters: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(self.resp(&["DBSIZE"]), Ok(redis::Value::Int(n)) if n as usize == filters) {
            self.proc.assert_running();
            assert!(
                Instant::now() < deadline,
                "{}: not serving its filters\n{}",
                self.name,
                self.proc.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn names() -> Vec<String> {
    (0..FILTERS).map(|i| format!("parked{i}")).collect()
}

/// Creates the test's filters through the catalog API (each asked again if unanswered).
async fn create_filters(client: &async_nats::Client) {
    for name in names() {
        let body =
            json!({"name": name, "filter": {"kind": "g_bloom", "capacity": 1000, "fpr": 0.01}});
        let mut last = String::new();
        let created = 'tries: {
            for _ in 0..3 {
                match api_request(
                    client,
                    "crpf.$catalog.create".into(),
                    serde_json::to_vec(&body).unwrap(),
                    Duration::from_secs(5),
                )
                .await
                {
                    Ok(v) => break 'tries Some(v),
                    Err(e) => last = e,
                }
            }
            None
        };
        assert!(created.is_some(), "create {name}: {last}");
    }
}

/// Waits until every node runs no replica actor: all its filters parked (a cluster at rest).
fn wait_all_parked(nodes: &mut [Node], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parked: Vec<f64> = nodes
            .iter()
            .map(|n| n.metric("crpf_parked_filters"))
            .collect();
        if parked.iter().all(|&p| p == FILTERS as f64) {
            return;
        }
        for n in nodes.iter_mut() {
            n.proc.assert_running();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: parked filters by node {parked:?}, not {FILTERS} each\n{}",
            nodes[0].proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `node` answers that every filter has `item`.
fn wait_everywhere(nodes: &[Node], item: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in nodes {
        for name in names() {
            while !node.has(&name, item) {
                assert!(
                    Instant::now() < deadline,
                    "{}: {name} never had {item}\n{}",
                    node.name,
                    node.proc.log_tail()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A cluster of three at rest parks every replica on every node (before, a replica with
/// peers never parked); an add through one node reaches the parked replicas of the others
/// (each delta wakes its replica and is merged), and the cluster parks again; a node that
/// was down while adds went on catches up at its start, and everything parks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_peers_park_and_still_take_every_add_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let servers = NatsServer::cluster(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &urls, false))
        .collect();
    for n in &mut nodes {
        n.wait_serving(0);
    }
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    create_filters(&client).await;
    for n in &mut nodes {
        n.wait_serving(FILTERS);
    }
    wait_all_parked(&mut nodes, "at rest after the creates");
    let digests = "crpf_parked_messages_total{body=\"digest\"}";
    let peers_digests_answered = nodes[0].metric(digests);

    // Adds through node 1 only: node 0's and node 2's parked replicas take them.
    for name in names() {
        nodes[1].add(&name, "alice");
    }
    wait_everywhere(&nodes, "alice");
    wait_all_parked(&mut nodes, "at rest after the adds");
    // Parked, their node answers the peers' equal digests for them (the next ones come
    // within a few anti-entropy intervals of the last park).
    let deadline = Instant::now() + Duration::from_secs(20);
    while nodes[0].metric(digests) <= peers_digests_answered {
        assert!(
            Instant::now() < deadline,
            "node0 answered no digest for its parked replicas"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Node 2 down while node 0 takes adds; back, it catches up, and all park again.
    nodes[2].proc.terminate(Duration::from_secs(30));
    for name in names() {
        nodes[0].add(&name, "bob");
    }
    nodes[2].restart();
    nodes[2].wait_serving(FILTERS);
    wait_everywhere(&nodes, "bob");
    wait_everywhere(&nodes, "alice");
    wait_all_parked(&mut nodes, "at rest after the restart");
    for mut n in nodes {
        n.proc.terminate(Duration::from_secs(30));
    }
}

/// A node cut off by a route partition takes adds its peers do not hear (its deltas are
/// lost to them); after the heal, its digests differ from the ones its peers' nodes kept
/// for their parked replicas, which wake and catch up; then the cluster parks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_differing_digest_wakes_parked_replicas_after_a_partition_heals() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, routes) = NatsServer::cluster_with_cuttable_last(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &urls, true))
        .collect();
    for n in &mut nodes {
        n.wait_serving(0);
    }
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    create_filters(&client).await;
    for n in &mut nodes {
        n.wait_serving(FILTERS);
    }
    wait_all_parked(&mut nodes, "at rest after the creates");
    routes.cut();
    for name in names() {
        nodes[2].add(&name, "carol");
    }
    // Not heard across the cut.
    assert!(!nodes[0].has("parked0", "carol"));
    routes.heal();
    wait_everywhere(&nodes, "carol");
    wait_all_parked(&mut nodes, "at rest after the heal");
    for mut n in nodes {
        n.proc.terminate(Duration::from_secs(30));
    }
}

/// What says a replica woke or moved a whole state: resumptions, pushes of a whole state and
/// merges of one, on one node.
fn wakes_and_states(node: &Node) -> [f64; 3] {
    [
        node.counter("crpf_parking_total", "change=\"resumed\""),
        node.metric("crpf_state_pushes_total"),
        node.counter("crpf_merges_total", "source=\"state\""),
    ]
}

/// A node of a cluster at rest restarts with its filters parked, restored from their
/// directories (no replica runs, nothing is asked of its peers): its digests, announced
/// at once, equal its peers', which stay parked; no whole state moves either way, and the
/// restarted replicas are confirmed by their peers' digests. Adds made on a peer while it
/// was down reach it after its restart (the peer's state differs, and is pushed to it).
/// Adds acknowledged at `durable` on it survive its crash, peers down too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_exchanges_digests_not_states_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let servers = NatsServer::cluster(3);
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(dir.path(), i, &urls, false))
        .collect();
    for n in &mut nodes {
        n.wait_serving(0);
    }
    let client = async_nats::connect(urls[0].clone()).await.unwrap();
    create_filters(&client).await;
    for n in &mut nodes {
        n.wait_serving(FILTERS);
    }
    for name in names() {
        nodes[2].add_durable(&name, "erin");
    }
    wait_everywhere(&nodes, "erin");
    wait_all_parked(&mut nodes, "at rest after the adds");

    // Nothing changes while node 2 is down.
    let peers_before: Vec<[f64; 3]> = nodes[..2].iter().map(wakes_and_states).collect();
    nodes[2].proc.terminate(Duration::from_secs(30));
    nodes[2].restart();
    nodes[2].wait_serving(FILTERS);
    let restored = "change=\"restored\"";
    assert_eq!(
        nodes[2].counter("crpf_parking_total", restored),
        FILTERS as f64,
        "node2 restored every filter parked\n{}",
        nodes[2].proc.log_tail()
    );
    // Queries on its own API subjects (and on the queue group's, whichever node takes them)
    // are answered from the kept states: nothing resumes, on any node.
    let id = nodes[2].node_id();
    let resumed: Vec<f64> = nodes
        .iter()
        .map(|n| n.counter("crpf_parking_total", "change=\"resumed\""))
        .collect();
    let queried: f64 = nodes
        .iter()
        .map(|n| n.metric("crpf_parked_queries_total").max(0.0))
        .sum();
    for name in names() {
        for (subject, item, expected) in [
            (
                format!("crpf.{name}.replica.{id}.api.contains"),
                "erin",
                true,
            ),
            (
                format!("crpf.{name}.replica.{id}.api.contains"),
                "never-added",
                false,
            ),
            (format!("crpf.{name}.api.contains"), "erin", true),
        ] {
            let answer = api_request(
                &client,
                subject.clone(),
                item.as_bytes().to_vec(),
                Duration::from_secs(5),
            )
            .await;
            assert_eq!(
                answer.as_ref().map(|v| v["contains"].clone()),
                Ok(json!(expected)),
                "{subject} {item}\n{}",
                nodes[2].proc.log_tail()
            );
        }
    }
    let queried_after: f64 = nodes
        .iter()
        .map(|n| n.metric("crpf_parked_queries_total").max(0.0))
        .sum();
    assert_eq!(
        queried_after - queried,
        3.0 * FILTERS as f64,
        "queries answered parked"
    );
    assert_eq!(
        resumed,
        nodes
            .iter()
            .map(|n| n.counter("crpf_parking_total", "change=\"resumed\""))
            .collect::<Vec<_>>(),
        "a query resumed a parked replica"
    );
    // Its peers' digests (each parked replica's, within its spacing) confirm them all.
    let deadline = Instant::now() + Duration::from_secs(20);
    while nodes[2].counter("crpf_parking_total", "change=\"confirmed\"") < FILTERS as f64 {
        assert!(
            Instant::now() < deadline,
            "node2's restored replicas not confirmed by their peers' digests\n{}",
            nodes[2].proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // It reads its filters over RESP too: answered parked, nothing resumes.
    for name in names() {
        assert!(nodes[2].has(&name, "erin"), "{name} lost erin");
    }
    assert_eq!(
        resumed[2],
        nodes[2].counter("crpf_parking_total", "change=\"resumed\""),
        "BF.EXISTS resumed a parked replica"
    );
    wait_all_parked(&mut nodes, "at rest after the restart");
    let peers_after: Vec<[f64; 3]> = nodes[..2].iter().map(wakes_and_states).collect();
    assert_eq!(
        peers_before, peers_after,
        "the peers of a restarted node woke or moved whole states (resumed, pushes, merges)"
    );
    let mine = wakes_and_states(&nodes[2]);
    assert_eq!(
        mine[1..],
        [0.0, 0.0],
        "node2 pushed or merged a whole state after a restart that changed nothing"
    );

    // Adds on node 0 while node 2 is down: back, it has them.
    nodes[2].proc.terminate(Duration::from_secs(30));
    for name in names() {
        nodes[0].add(&name, "frank");
    }
    nodes[2].restart();
    nodes[2].wait_serving(FILTERS);
    wait_everywhere(&nodes, "frank");
    wait_everywhere(&nodes, "erin");
    wait_all_parked(&mut nodes, "at rest after a restart that missed adds");

    // Node 2 alone takes adds at `durable`, then crashes; back (still alone), it has them.
    nodes[0].proc.terminate(Duration::from_secs(30));
    nodes[1].proc.terminate(Duration::from_secs(30));
    for name in names() {
        nodes[2].add_durable(&name, "gina");
    }
    nodes[2].proc.kill9();
    nodes[2].restart();
    nodes[2].wait_serving(FILTERS);
    // (Replayed, its replicas start and catch up, alone: wait until they serve.)
    wait_everywhere(&nodes[2..], "gina");
    wait_everywhere(&nodes[2..], "frank");
    // And a clean stop of a node alone, parked: still there.
    wait_all_parked(&mut nodes[2..], "node2 alone at rest");
    nodes[2].proc.terminate(Duration::from_secs(30));
    nodes[2].restart();
    nodes[2].wait_serving(FILTERS);
    wait_everywhere(&nodes[2..], "gina");
    nodes[0].restart();
    nodes[1].restart();
    wait_everywhere(&nodes, "gina");
    for mut n in nodes {
        n.proc.terminate(Duration::from_secs(30));
    }
}
