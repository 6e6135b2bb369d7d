//! The observability stack as real processes on free loopback ports: a three-server NATS
//! cluster with JetStream, three `crpf node` processes from generated configs, and Prometheus
//! (Debian's package, installed into `.tools/prometheus` by `scripts/test.sh`) scraping them
//! every second. Every PromQL expression of the Grafana dashboards must return data, the scraped
//! gauges must agree with the `stats` API, SIGTERM must leave loadable snapshots; and the
//! `crpf` command line: config errors name their field, `crpf demo` runs to completion while
//! its exporter answers.
#![cfg(all(feature = "node", feature = "eval"))]

mod nats_harness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nats_harness::{NatsServer, Proc, cluster_key_line, crpf, free_port, http_get, wait_for};
use serde_json::Value;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// What `$__rate_interval` and `$__range` become in the dashboard's expressions.
const RATE_INTERVAL: &str = "30s";
const RANGE: &str = "5m";

// ---------------------------------------------------------------------------------------------
// Processes (`Proc`, `crpf`, `wait_for`: shared with the other real-process tests)

/// Prometheus: `$CRPF_PROMETHEUS`, else `.tools/prometheus/usr/bin/prometheus`. Never skips.
fn prometheus_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CRPF_PROMETHEUS").map(PathBuf::from) {
        assert!(p.exists(), "CRPF_PROMETHEUS={p:?} does not exist");
        return p;
    }
    let p = Path::new(MANIFEST_DIR).join(".tools/prometheus/usr/bin/prometheus");
    assert!(
        p.exists(),
        "prometheus not found at {}: run scripts/test.sh (it unpacks Debian's prometheus package \
         into .tools/prometheus) or set CRPF_PROMETHEUS to a prometheus binary",
        p.display()
    );
    p
}

// ---------------------------------------------------------------------------------------------

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Prometheus

struct Prometheus {
    proc: Proc,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[String]) -> Prometheus {
        let bin = prometheus_binary();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let targets = targets
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: crpf\n    static_configs:\n      - targets: [{targets}]\n"
            ),
        )
        .unwrap();
        let data = dir.join("prometheus-data");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let mut prom = Prometheus {
            proc: Proc::spawn("prometheus", cmd, dir.join("prometheus.log")),
            addr,
        };
        wait_for("prometheus to be ready", Duration::from_secs(30), || {
            prom.proc.assert_running();
            match http_get(&prom.addr, "/-/ready")? {
                (200, _) => Ok(()),
                (c, b) => Err(format!("{c}: {b}")),
            }
        });
        prom
    }

    /// The result vector of an instant query (an error for a failed query).
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let (code, body) = http_get(
            &self.addr,
            &format!("/api/v1/query?query={}", urlencode(expr)),
        )?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{code}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("query failed ({code}): {body}"));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    fn label_values(&self, label: &str, matcher: &str) -> Result<Vec<String>, String> {
        let (_, body) = http_get(
            &self.addr,
            &format!(
                "/api/v1/label/{label}/values?match[]={}",
                urlencode(matcher)
            ),
        )?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        Ok(v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The value of the single series an instant query returns.
    fn scalar(&self, expr: &str) -> Result<f64, String> {
        let r = self.query(expr)?;
        if r.len() != 1 {
            return Err(format!("{expr}: {} series: {r:?}", r.len()));
        }
        r[0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{expr}: bad sample {:?}", r[0]))
    }
}

// ---------------------------------------------------------------------------------------------
// The dashboard

struct Dashboard {
    file: PathBuf,
    json: Value,
}

fn dashboards() -> Vec<Dashboard> {
    let dir = Path::new(MANIFEST_DIR).join("grafana/dashboards");
    let mut out: Vec<Dashboard> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", file.display()));
            Dashboard { file, json }
        })
        .collect();
    out.sort_by(|a, b| a.file.cmp(&b.file));
    assert!(!out.is_empty(), "no dashboards in {}", dir.display());
    out
}

fn walk<'a>(v: &'a Value, f: &mut impl FnMut(&'a serde_json::Map<String, Value>)) {
    match v {
        Value::Object(m) => {
            f(m);
            m.values().for_each(|x| walk(x, f));
        }
        Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
        _ => {}
    }
}

/// Every `expr` of the dashboard, in order.
fn exprs(d: &Dashboard) -> Vec<String> {
    let mut out = Vec::new();
    walk(&d.json, &mut |m| {
        if let Some(Value::String(e)) = m.get("expr") {
            out.push(e.clone());
        }
    });
    out
}

/// Substitutes the template variables: query variables (filter, replica) become `.*` (the
/// "All" value), constants their value, Grafana's intervals fixed durations.
fn substitute(d: &Dashboard, expr: &str) -> String {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for v in d.json["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = v["name"].as_str().unwrap().to_string();
        let value = match v["type"].as_str() {
            Some("constant") => v["query"].as_str().unwrap().to_string(),
            _ => v["allValue"].as_str().unwrap_or(".*").to_string(),
        };
        vars.insert(name, value);
    }
    vars.insert("__rate_interval".into(), RATE_INTERVAL.into());
    vars.insert("__interval".into(), "5s".into());
    vars.insert("__range".into(), RANGE.into());
    let mut out = expr.to_string();
    // Longest names first, so that `$filter_x` is not cut by `$filter`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        out = out
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    assert!(
        !out.contains('$'),
        "{}: unknown template variable in {expr:?} (after substitution: {out:?})",
        d.file.display()
    );
    out
}

/// The metric names src/replica/metrics.rs and the RESP front end (src/resp/mod.rs) declare
/// (their `"crpf_..."` string literals).
fn known_metrics() -> std::collections::BTreeSet<String> {
    let mut known = std::collections::BTreeSet::new();
    for file in ["src/replica/metrics.rs", "src/resp/mod.rs"] {
        let src = std::fs::read_to_string(Path::new(MANIFEST_DIR).join(file)).unwrap();
        known.extend(
            src.match_indices("\"crpf_")
                .filter_map(|(i, _)| src[i + 1..].split('"').next())
                .map(String::from),
        );
    }
    known
}

/// The `crpf_...` identifiers of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("crpf_"))
        .map(String::from)
        .collect()
}

#[test]
fn dashboards_use_the_provisioned_datasource() {
    let prov = std::fs::read_to_string(
        Path::new(MANIFEST_DIR).join("grafana/provisioning/datasources/prometheus.yml"),
    )
    .unwrap();
    let uid = prov
        .lines()
        .find_map(|l| l.trim().strip_prefix("uid:"))
        .expect("the provisioned datasource has a fixed uid")
        .trim()
        .to_string();
    let dash_prov = std::fs::read_to_string(
        Path::new(MANIFEST_DIR).join("grafana/provisioning/dashboards/crpf.yml"),
    )
    .unwrap();
    assert!(dash_prov.contains("path: /var/lib/grafana/dashboards"));
    for d in dashboards() {
        let mut bad = Vec::new();
        let mut n = 0;
        walk(&d.json, &mut |m| {
            if let Some(ds) = m.get("datasource")
                && (ds["type"] == "prometheus" || ds.is_string())
            {
                n += 1;
                if ds["uid"].as_str() != Some(uid.as_str()) {
                    bad.push(ds.clone());
                }
            }
        });
        assert!(n > 0, "{}: no prometheus datasource", d.file.display());
        assert!(
            bad.is_empty(),
            "{}: datasources other than uid {uid}: {bad:?}",
            d.file.display()
        );
        assert!(!exprs(&d).is_empty());
        // Every metric a query names is one the replicas record (src/replica/metrics.rs), so
        // that the `or 0 * ...` fallbacks of never-fired counters cannot hide a typo.
        let known = known_metrics();
        for e in exprs(&d) {
            for name in metric_names(&e) {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                assert!(
                    known.contains(&name) || known.contains(base),
                    "{}: {name} in {e:?} is not a metric of src/replica/metrics.rs or src/resp",
                    d.file.display()
                );
            }
        }
        // Every target of every panel has a query.
        for p in d.json["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().into_iter().flatten() {
                assert!(
                    t["expr"].is_string(),
                    "{}: target without expr: {t}",
                    d.file.display()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The stack

struct Node {
    proc: Proc,
    metrics: String,
    resp: String,
    data_dir: PathBuf,
}

const FILTERS: &[(&str, &str)] = &[
    ("sessions", "or_cuckoo"),
    ("seen_urls", "g_bloom"),
    ("tokens", "writer_sc_or_cuckoo"),
    ("recent", "expiring_bloom"),
    ("page_views", "counting_cuckoo"),
    ("hits", "count_min_sketch"),
    ("heavy", "top_k"),
    ("latency", "t_digest"),
];

/// A filter's parameters in the node's configuration: 20,000 items at 1% for the filters (the
/// sketch's width and rows), a top 5 of a 2000 x 5 table, a t-digest of compression 100.
fn filter_spec(kind: &str) -> String {
    match kind {
        "top_k" => {
            "{ kind = \"top_k\", capacity = 5, fpr = 0.9, shape = { bits = 2000, hashes = 5 } }"
                .into()
        }
        "t_digest" => "{ kind = \"t_digest\", capacity = 100, fpr = 0.5 }".into(),
        _ => format!("{{ kind = \"{kind}\", capacity = 20000, fpr = 0.01 }}"),
    }
}

fn node_toml(metrics: &str, resp: &str, data_dir: &Path, nats_url: &str, i: usize) -> String {
    let mut s = format!(
        "[node]\nmetrics_addr = \"{metrics}\"\ndata_dir = \"{}\"\nlog = \"warn\"\n{}\n\
         [nats]\nservers = [\"{nats_url}\"]\nretry_on_initial_connect = true\nname = \"stack-node{i}\"\n\n\
         [resp]\nlisten = \"{resp}\"\n\n\
         [catalog]\ndeclared_metrics = \"own\"\n",
        data_dir.display(),
        cluster_key_line()
    );
    // The dashboards show each filter: series of their own (the default is the node's).
    for (name, kind) in FILTERS {
        s += &format!(
            "\n[[filters]]\nname = \"{name}\"\nfilter = {}\n\
             delta_interval_ms = 50\nanti_entropy_interval_ms = 500\nmin_push_interval_ms = 200\n\
             catch_up_timeout_ms = 1000\nsnapshot_interval_ms = 300\nmetrics_interval_ms = 100\n",
            filter_spec(kind)
        );
    }
    s
}

fn start_node(dir: &Path, i: usize, nats_url: &str) -> Node {
    let metrics = format!("127.0.0.1:{}", free_port());
    let resp = format!("127.0.0.1:{}", free_port());
    let data_dir = dir.join(format!("node{i}"));
    let cfg = dir.join(format!("node{i}.toml"));
    std::fs::write(&cfg, node_toml(&metrics, &resp, &data_dir, nats_url, i)).unwrap();
    let cmd = crpf(&["node", "--config", cfg.to_str().unwrap()]);
    Node {
        proc: Proc::spawn(&format!("node{i}"), cmd, dir.join(format!("node{i}.log"))),
        metrics,
        resp,
        data_dir,
    }
}

/// Sends RESP commands (each a list of arguments) on `conn` and reads one reply line each.
fn resp_commands(conn: &mut std::net::TcpStream, commands: &[&[&str]]) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut out = Vec::new();
    for args in commands {
        let mut req = format!("*{}\r\n", args.len());
        for a in *args {
            req += &format!("${}\r\n{a}\r\n", a.len());
        }
        conn.write_all(req.as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(&mut *conn).read_line(&mut line).unwrap();
        out.push(line.trim_end().to_string());
    }
    out
}

/// Every expression of every dashboard returns data within 40 s; `check` may demand more of
/// a result (the substituted expression, its series). The results, by expression.
async fn every_query_returns_data(
    prom: &Prometheus,
    check: impl Fn(&str, &[Value]) -> bool,
) -> Vec<(String, String, usize)> {
    let mut results: Vec<(String, String, usize)> = Vec::new();
    for d in dashboards() {
        for e in exprs(&d) {
            let q = substitute(&d, &e);
            results.push((e, q, 0));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let mut errors = Vec::new();
        for (_, q, n) in results.iter_mut().filter(|r| r.2 == 0) {
            match tokio::task::block_in_place(|| prom.query(q)) {
                Ok(r) if !r.is_empty() && check(q, &r) => *n = r.len(),
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        assert!(errors.is_empty(), "PromQL errors: {errors:#?}");
        if results.iter().all(|r| r.2 > 0) {
            return results;
        }
        if Instant::now() > deadline {
            let empty: Vec<&String> = results.iter().filter(|r| r.2 == 0).map(|r| &r.1).collect();
            panic!("dashboard expressions without data: {empty:#?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn request(client: &async_nats::Client, subject: String, item: &[u8]) -> Value {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(subject.clone(), item.to_vec().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("{subject}: no reply within 10 s"))
    .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("{subject}: reply is not JSON: {e}"))
}

fn figure(stats: &Value, name: &str) -> f64 {
    stats
        .get(name)
        .or_else(|| stats.get("figures").and_then(|f| f.get(name)))
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("stats without {name}: {stats}"))
}

fn replica_label(stats: &Value) -> String {
    match &stats["replica"] {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        v => panic!("stats without a replica id: {v} in {stats}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_serves_every_dashboard_query_and_gauges_match_stats() {
    let dir = tempfile::tempdir().unwrap();
    let servers = NatsServer::cluster(3);
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| start_node(dir.path(), i, &servers[i].url()))
        .collect();

    // Every exporter answers.
    for n in nodes.iter_mut() {
        let addr = n.metrics.clone();
        wait_for(
            &format!("{} /metrics", n.proc.name),
            Duration::from_secs(30),
            || {
                n.proc.assert_running();
                match http_get(&addr, "/metrics")? {
                    (200, body) if body.contains("crpf_ready") => Ok(()),
                    (c, _) => Err(format!("status {c}, no crpf_ready yet")),
                }
            },
        );
    }
    let targets: Vec<String> = nodes.iter().map(|n| n.metrics.clone()).collect();
    let prom = Prometheus::start(dir.path(), &targets);

    // The request API, from a plain NATS client, once the replicas serve it.
    let client = async_nats::connect(servers[0].url()).await.unwrap();
    for (name, _) in FILTERS {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let subject = format!("crpf.{name}.api.stats");
            match tokio::time::timeout(
                Duration::from_secs(2),
                client.request(subject, Vec::new().into()),
            )
            .await
            {
                Ok(Ok(_)) => break,
                _ if Instant::now() > deadline => {
                    for n in &nodes {
                        eprintln!("{}", n.proc.log_tail());
                    }
                    panic!("crpf.{name}.api.stats never answered");
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    // Adds (both filters) and removes (the OR cuckoo filter).
    for i in 0..300 {
        let item = format!("item-{i}");
        for (name, _) in FILTERS {
            let r = request(&client, format!("crpf.{name}.api.add"), item.as_bytes()).await;
            assert!(r.get("added").is_some(), "add {item} to {name}: {r}");
        }
    }
    for i in 0..100 {
        let item = format!("item-{i}");
        let r = request(&client, "crpf.sessions.api.remove".into(), item.as_bytes()).await;
        assert_eq!(r["removed"], true, "remove {item}: {r}");
    }
    let r = request(&client, "crpf.seen_urls.api.contains".into(), b"item-7").await;
    assert_eq!(r["contains"], true, "{r}");
    // The top-k's own adds, whose churn its row shows: item `hh-i` added i + 1 times, in
    // order, so each later item overtakes the top 5 and pushes one out. The t-digest's values.
    let heavy: Vec<String> = (0..30)
        .flat_map(|i| std::iter::repeat_n(format!("hh-{i}"), i + 1))
        .collect();
    let mut expelled = 0;
    for chunk in heavy.chunks(100) {
        let payload = crpf::api::batch::encode(chunk).unwrap();
        let r = request(&client, "crpf.heavy.api.topk.add".into(), &payload).await;
        let e = r["expelled"]
            .as_array()
            .unwrap_or_else(|| panic!("topk.add: {r}"));
        expelled += e.iter().filter(|x| !x.is_null()).count();
    }
    assert!(expelled > 0, "no item pushed out");
    let values: Vec<String> = (1..=100).map(|v| v.to_string()).collect();
    let r = request(
        &client,
        "crpf.latency.api.tdigest.add".into(),
        &crpf::api::batch::encode(&values).unwrap(),
    )
    .await;
    assert_eq!(r["ok"], true, "tdigest.add: {r}");
    // RESP commands on every node, over connections left open.
    let mut resp: Vec<std::net::TcpStream> = Vec::new();
    for n in nodes.iter_mut() {
        let addr = n.resp.clone();
        let mut conn = wait_for(&format!("RESP on {addr}"), Duration::from_secs(60), || {
            n.proc.assert_running();
            std::net::TcpStream::connect(&addr).map_err(|e| format!("{e}\n{}", n.proc.log_tail()))
        });
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // The node may still be starting (its filters answer `-LOADING` until then): the
        // NATS API above may have been answered by the other nodes.
        wait_for(
            &format!("RESP on {addr} past LOADING"),
            Duration::from_secs(60),
            || {
                n.proc.assert_running();
                let reply = resp_commands(&mut conn, &[&["BF.EXISTS", "seen_urls", "probe"]]);
                if reply[0].starts_with("-LOADING") {
                    Err(format!("{reply:?}\n{}", n.proc.log_tail()))
                } else {
                    Ok(())
                }
            },
        );
        // An item of each node's own: one another node added would answer 0 (not new).
        let item = format!("resp-item-{addr}");
        let replies = resp_commands(
            &mut conn,
            &[
                &["BF.ADD", "seen_urls", &item],
                &["BF.EXISTS", "seen_urls", &item],
                &["PING"],
            ],
        );
        assert_eq!(replies, [":1", ":1", "+PONG"], "{}", n.resp);
        resp.push(conn);
    }

    // The dashboard's template variables have values.
    let prom = &prom;
    tokio::task::block_in_place(|| {
        wait_for(
            "label values of filter and replica",
            Duration::from_secs(20),
            || {
                let filters = prom.label_values("filter", "crpf_estimated_fpr")?;
                let replicas = prom.label_values("replica", "crpf_estimated_fpr")?;
                if filters.len() == FILTERS.len() && replicas.len() >= 3 {
                    Ok(())
                } else {
                    Err(format!("filters {filters:?}, replicas {replicas:?}"))
                }
            },
        )
    });
    // ... and so do the dashboards' own variable queries, `label_values(<selector>, <label>)`.
    for d in dashboards() {
        for v in d.json["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if v["type"] != "query" {
                continue;
            }
            let q = v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .unwrap_or_else(|| panic!("{}: variable without a query: {v}", d.file.display()));
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{}: not a label_values query: {q}", d.file.display()));
            let (selector, label) = inner.rsplit_once(',').unwrap();
            let selector = substitute(&d, selector.trim());
            let label = label.trim().to_string();
            let values = tokio::task::block_in_place(|| {
                wait_for(
                    &format!("values of {q}"),
                    Duration::from_secs(20),
                    || match prom.label_values(&label, &selector)? {
                        v if v.is_empty() => Err("none".into()),
                        v => Ok(v),
                    },
                )
            });
            eprintln!("dashboard variable ok: {q} = {values:?}");
        }
    }

    // Every panel shows data under this load, where nothing failed: counters that only
    // failures create (rejects, errors) must fall back to 0, not "No data".
    let results = every_query_returns_data(prom, |_, _| true).await;
    for (e, _, n) in &results {
        eprintln!("dashboard query ok ({n} series): {e}");
    }

    // Failures of each kind a panel breaks down by reason: garbage on the replication subject
    // (every replica rejects it), an API request the filter refuses, an unknown RESP command.
    // Those panels then show the reasons themselves, not only their 0 fallback.
    for _ in 0..3 {
        client
            .publish(
                "crpf.sessions.delta",
                b"not a crpf envelope".to_vec().into(),
            )
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    let r = request(&client, "crpf.seen_urls.api.remove".into(), b"item-7").await;
    assert!(r.get("error").is_some(), "remove on a g_bloom: {r}");
    for conn in resp.iter_mut() {
        let replies = resp_commands(conn, &[&["NO.SUCH.COMMAND"]]);
        assert!(
            replies[0].starts_with("-ERR unknown command"),
            "{replies:?}"
        );
    }
    let by_reason = |q: &str, r: &[Value]| {
        !q.contains("reason)") || r.iter().any(|s| s["metric"]["reason"].is_string())
    };
    let results = every_query_returns_data(prom, by_reason).await;
    let reasons = results.iter().filter(|r| r.1.contains("reason)")).count();
    assert!(reasons >= 3, "panels by reason: {results:#?}");
    drop(resp);

    // The scraped gauges agree with the stats API of the same replica (adds stopped; a replica
    // that answers may still merge its peers' last deltas, so retry until both settle).
    for (name, _) in FILTERS {
        let mut last;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let stats = request(&client, format!("crpf.{name}.api.stats"), b"").await;
            let replica = replica_label(&stats);
            let sel = format!("{{filter=\"{name}\",replica=\"{replica}\"}}");
            let (fpr, load) = (
                figure(&stats, "estimated_fpr"),
                figure(&stats, "load_factor"),
            );
            let scraped = tokio::task::block_in_place(|| {
                Ok::<_, String>((
                    prom.scalar(&format!("crpf_estimated_fpr{sel}"))?,
                    prom.scalar(&format!("crpf_load_factor{sel}"))?,
                ))
            });
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 + 0.01 * a.abs().max(b.abs());
            match scraped {
                Ok((sf, sl)) if close(fpr, sf) && close(load, sl) && load > 0.0 => break,
                Ok((sf, sl)) => {
                    last = format!(
                        "{name} r{replica}: stats fpr {fpr} load {load}, scraped fpr {sf} load {sl}"
                    )
                }
                Err(e) => last = e,
            }
            assert!(
                Instant::now() < deadline,
                "gauges never matched stats: {last}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // The sketch's own gauges (its dashboard row): its count, which `stats` has as its
    // cardinality, its shape (capacity 20000 is the width, fpr 0.01 seven rows), and the
    // replicas that wrote.
    let mut last;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = request(&client, "crpf.hits.api.stats".into(), b"").await;
        let sel = format!("{{filter=\"hits\",replica=\"{}\"}}", replica_label(&stats));
        let count = figure(&stats, "cardinality");
        let scraped = tokio::task::block_in_place(|| {
            [
                "crpf_cms_count",
                "crpf_cms_width",
                "crpf_cms_depth",
                "crpf_cms_writers",
            ]
            .map(|m| prom.scalar(&format!("{m}{sel}")))
            .into_iter()
            .collect::<Result<Vec<f64>, String>>()
        });
        match scraped {
            Ok(g)
                if g[0] == count && count >= 300.0 && g[1..3] == [20000.0, 7.0] && g[3] >= 1.0 =>
            {
                break;
            }
            Ok(g) => last = format!("stats count {count}, scraped {g:?}"),
            Err(e) => last = e,
        }
        assert!(Instant::now() < deadline, "sketch gauges: {last}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The top-k's and the t-digest's gauges (their row): k and the items listed (a top 5,
    // full), writers, the churn counted (every replica's, as their replies said); the digest's observations as `stats` counts them,
    // its compression and centroids.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = request(&client, "crpf.latency.api.stats".into(), b"").await;
        let sel = format!(
            "{{filter=\"latency\",replica=\"{}\"}}",
            replica_label(&stats)
        );
        let observations = figure(&stats, "cardinality");
        let scraped = tokio::task::block_in_place(|| {
            let mut g = [
                "crpf_tdigest_observations",
                "crpf_tdigest_compression",
                "crpf_tdigest_centroids",
                "crpf_tdigest_writers",
            ]
            .map(|m| prom.scalar(&format!("{m}{sel}")))
            .into_iter()
            .collect::<Result<Vec<f64>, String>>()?;
            for m in ["crpf_topk_k", "crpf_topk_listed", "crpf_topk_writers"] {
                g.push(prom.scalar(&format!("max({m}{{filter=\"heavy\"}})"))?);
            }
            g.push(prom.scalar("sum(crpf_topk_expelled_total{filter=\"heavy\"})")?);
            Ok::<_, String>(g)
        });
        match scraped {
            Ok(g)
                if g[0] == observations
                    && observations >= 400.0
                    && g[1] == 100.0
                    && g[2] > 0.0
                    && g[3] >= 1.0
                    && g[4..6] == [5.0, 5.0]
                    && g[6] >= 1.0
                    && g[7] == expelled as f64 =>
            {
                break;
            }
            Ok(g) => {
                last =
                    format!("stats observations {observations}, expelled {expelled}, scraped {g:?}")
            }
            Err(e) => last = e,
        }
        assert!(
            Instant::now() < deadline,
            "top-k and t-digest gauges: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(client);

    // SIGTERM: the node exits cleanly and leaves snapshots `crpf inspect` loads.
    let n = &mut nodes[0];
    n.proc.terminate(Duration::from_secs(30));
    for (name, _) in FILTERS {
        let path = n.data_dir.join(name);
        let out = crpf(&["inspect", path.to_str().unwrap()]).output().unwrap();
        assert!(
            out.status.success(),
            "crpf inspect {} failed: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The command line

/// Runs `crpf node` with a config (and env overrides), expecting a quick non-zero exit whose
/// output names `field`.
fn config_error(toml: &str, env: &[(&str, &str)], field: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, toml).unwrap();
    let mut cmd = crpf(&["node", "--config", cfg.to_str().unwrap()]);
    cmd.envs(env.iter().copied());
    fails_naming(cmd, &[field]);
}

/// Runs `cmd`, expecting a non-zero exit (within 30 s, a hang guard) whose output names every
/// one of `names`; the output.
fn fails_naming(cmd: Command, names: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let what = format!("{cmd:?}");
    let mut p = Proc::spawn("crpf", cmd, dir.path().join("out.log"));
    let status = p
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{what} kept running\n{}", p.log_tail()));
    let out = std::fs::read_to_string(&p.log).unwrap();
    assert!(!status.success(), "{what} succeeded:\n{out}");
    for name in names {
        assert!(
            out.contains(name),
            "the error of {what} does not name `{name}`:\n{out}"
        );
    }
    out
}

/// A node or demo pointed at a server without JetStream stops at once (not after the 5 min
/// claim timeout), saying how to start the server.
#[test]
fn a_server_without_jetstream_is_refused_at_once_naming_js() {
    let plain = NatsServer::start_without_jetstream();
    let metrics = format!("127.0.0.1:{}", free_port());
    fails_naming(
        crpf(&["demo", "--nats", &plain.url(), "--metrics-addr", &metrics]),
        &["nats-server -js"],
    );
    let dir = tempfile::tempdir().unwrap();
    let filter =
        "[[filters]]\nname = \"f\"\nfilter = { kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }\n";
    // Connected at start: refused by the check at connect, even with no filter of its own (a
    // node serving only the catalog's). Connecting in the background
    // (`retry_on_initial_connect`): refused at its first replica id claim.
    for (name, extra, filters) in [
        ("catalog-only", "", ""),
        ("retrying", "retry_on_initial_connect = true\n", filter),
    ] {
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[node]\nmetrics_addr = \"127.0.0.1:{}\"\n{}[nats]\nservers = [\"{}\"]\n{extra}{filters}",
                free_port(),
                cluster_key_line(),
                plain.url()
            ),
        )
        .unwrap();
        fails_naming(
            crpf(&["node", "--config", cfg.to_str().unwrap()]),
            &["nats-server -js"],
        );
    }
}

/// A port already taken (a node runs, and the demo wants the same metrics port) is named,
/// with the option or field that moves it.
#[test]
fn a_taken_port_is_named_with_the_setting_that_moves_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = fails_naming(
        crpf(&["demo", "--metrics-addr", &addr, "--duration", "1"]),
        &[&addr, "--metrics-addr"],
    );
    // Said once, not repeated as its own cause.
    let once = |out: &str| assert_eq!(out.matches("Address already in use").count(), 1, "{out}");
    once(&out);
    let dir = tempfile::tempdir().unwrap();
    let filter =
        "[[filters]]\nname = \"f\"\nfilter = { kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }\n";
    let free = format!("127.0.0.1:{}", free_port());
    for (name, toml, setting) in [
        (
            "metrics",
            format!("[node]\nmetrics_addr = \"{addr}\"\n{filter}"),
            "node.metrics_addr",
        ),
        (
            "resp",
            format!("[node]\nmetrics_addr = \"{free}\"\n[resp]\nlisten = \"{addr}\"\n{filter}"),
            "resp.listen",
        ),
    ] {
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, toml).unwrap();
        once(&fails_naming(
            crpf(&["node", "--config", cfg.to_str().unwrap()]),
            &[&addr, setting],
        ));
    }
    drop(taken);
}

#[test]
fn config_errors_exit_nonzero_naming_the_field() {
    let addr = format!("127.0.0.1:{}", free_port());
    let filter =
        "[[filters]]\nname = \"f\"\nfilter = { kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }\n";
    // Unknown field.
    config_error(
        &format!("[node]\nmetrics_addr = \"{addr}\"\nmetrics_adress = \"x\"\n{filter}"),
        &[],
        "metrics_adress",
    );
    // Unknown field in a filter.
    config_error(
        &format!("[node]\nmetrics_addr = \"{addr}\"\n{filter}delta_intervall_ms = 5\n"),
        &[],
        "delta_intervall_ms",
    );
    // Missing required value.
    config_error(
        &format!("[node]\nmetrics_addr = \"{addr}\"\n[[filters]]\nname = \"f\"\n"),
        &[],
        "`filter`",
    );
    config_error(
        &format!(
            "[node]\nmetrics_addr = \"{addr}\"\n[[filters]]\n\
             filter = {{ kind = \"g_bloom\", capacity = 1000, fpr = 0.01 }}\n"
        ),
        &[],
        "`name`",
    );
    // Bad address, in the file and from the environment.
    config_error(
        &format!("[node]\nmetrics_addr = \"not-an-address\"\n{filter}"),
        &[],
        "metrics_addr",
    );
    config_error(
        &format!("[node]\nmetrics_addr = \"{addr}\"\n{filter}"),
        &[("CRPF_NODE__METRICS_ADDR", "999.1.2.3:x")],
        "metrics_addr",
    );
}

/// ... and logs, to a file here, without the terminal's colour codes.
#[test]
fn demo_runs_to_completion_and_exports_metrics_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = crpf(&[
        "demo",
        "--duration",
        "3",
        "--metrics-addr",
        &addr,
        "--capacity",
        "20000",
        "--rate",
        "200",
    ]);
    cmd.env("RUST_LOG", "info");
    let mut p = Proc::spawn("crpf demo", cmd, dir.path().join("demo.log"));
    // The exporter answers while the demo runs.
    let body = wait_for("the demo's /metrics", Duration::from_secs(30), || {
        p.assert_running();
        match http_get(&addr, "/metrics")? {
            (200, b) if b.contains("crpf_estimated_fpr") => Ok(b),
            (c, _) => Err(format!("status {c}, no crpf_estimated_fpr yet")),
        }
    });
    assert!(body.contains("filter=\"demo\""), "{body}");
    let status = p
        .wait_exit(Duration::from_secs(90))
        .unwrap_or_else(|| panic!("crpf demo --duration 3 did not finish\n{}", p.log_tail()));
    assert!(
        status.success(),
        "crpf demo failed: {status}\n{}",
        p.log_tail()
    );
    let log = std::fs::read_to_string(&p.log).unwrap();
    assert!(log.contains(" INFO "), "no log line:\n{log}");
    assert!(
        !log.contains('\x1b'),
        "colour codes in a log file:\n{log:?}"
    );
}
