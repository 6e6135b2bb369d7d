//! Cost of each acknowledgement level: 3 replicas (each with its own connection and data
//! directory) on a loopback `nats-server`, clients adding through the NATS request API with
//! the `Crpf-Ack` header, a fixed number of requests in flight. Reports acknowledged adds/s
//! and the request latency (p50/p99) per level.
//!
//! ```text
//! scripts/test.sh --no-run   # installs nats-server into .tools/nats
//! cargo run --release --example ack_bench -- [seconds per level] [in flight] [kind] [levels]
//! ```
//! Defaults: 5 s per level, 16 requests in flight, `or_cuckoo` sized for 2M elements, every
//! level (`local,logged,durable,replicated`).
//! The data directories are in the system's temporary folder: on tmpfs, `durable` costs no
//! real fsync; point `TMPDIR` at a real disk to measure one.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crpf::replica::{ACK_HEADER, AckLevel, Replica, ReplicaConfig, ReplicaHandle};
use crpf::transport::{NatsConfig, NatsTransport, Transport};
use crpf::wire::FilterKind;
use futures::StreamExt;

use common::{percentile, start_server};

struct Outcome {
    errors: u64,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn start_replicas(
    url: &str,
    kind: FilterKind,
    dirs: &[tempfile::TempDir],
) -> Vec<ReplicaHandle> {
    let mut hs = Vec::new();
    for dir in dirs {
        let mut cfg = ReplicaConfig::for_kind("bench", kind, 2_000_000, 0.01);
        cfg.data_dir = Some(dir.path().to_path_buf());
        cfg.catch_up_timeout_ms = 300;
        let t: Arc<dyn Transport> = Arc::new(
            NatsTransport::connect(NatsConfig::with_servers([url]))
                .await
                .expect("connect"),
        );
        hs.push(Replica::start(cfg, t).await.expect("start replica"));
    }
    for h in &hs {
        assert!(h.wait_ready(Duration::from_secs(30)).await, "not ready");
    }
    hs
}

async fn run(url: &str, level: AckLevel, secs: u64, in_flight: usize) -> Outcome {
    let client = async_nats::connect(url).await.expect("client");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let tasks = (0..in_flight).map(|w| {
        let client = client.clone();
        async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(ACK_HEADER, level.name());
                let item = format!("{level}-{w}-{i}");
                i += 1;
                let t = Instant::now();
                let reply = client
                    .request_with_headers("crpf.bench.api.add", headers, item.into())
                    .await;
                match reply {
                    Ok(m) if m.payload.as_ref() == br#"{"added":true}"# => {
                        lat.push(t.elapsed().as_secs_f64() * 1e3)
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }
    });
    let started = Instant::now();
    let results = futures::stream::iter(tasks)
        .buffer_unordered(in_flight)
        .collect::<Vec<_>>()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut lat: Vec<f64> = results.iter().flat_map(|(l, _)| l.clone()).collect();
    let errors = results.iter().map(|(_, e)| e).sum();
    lat.sort_by(f64::total_cmp);
    Outcome {
        errors,
        per_sec: lat.len() as f64 / elapsed,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    }
}

#[actix::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).map_or(5, |s| s.parse().expect("seconds"));
    let in_flight: usize = args.get(2).map_or(16, |s| s.parse().expect("in flight"));
    let kind: FilterKind = args
        .get(3)
        .map_or(FilterKind::OrCuckoo, |s| s.parse().expect("kind"));
    // Levels to run, comma-separated (default: all of them).
    let levels: Vec<AckLevel> = args.get(4).map_or(AckLevel::ALL.to_vec(), |s| {
        s.split(',').map(|l| l.parse().expect("level")).collect()
    });
    let (_server, url) = start_server();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let hs = start_replicas(&url, kind, &dirs).await;
    println!(
        "{kind}, 3 replicas, {in_flight} requests in flight, {secs} s per level, data dirs under {}",
        std::env::temp_dir().display()
    );
    println!("| level | acked adds/s | p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|");
    for level in levels {
        let o = run(&url, level, secs, in_flight).await;
        println!(
            "| {level} | {:.0} | {:.2} | {:.2} | {} |",
            o.per_sec, o.p50_ms, o.p99_ms, o.errors
        );
    }
    for h in &hs {
        h.shutdown().await.expect("shutdown");
    }
}
