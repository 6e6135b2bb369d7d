//! Replication benchmark: 3 replicas on a loopback `nats-server`, a steady stream of adds
//! spread over them, and for each protocol (delta-states, naive full-state broadcast):
//! convergence latency (add on one replica until contained on all three, p50/p99) and wire
//! bytes per add.
//!
//! ```text
//! scripts/test.sh --no-run   # installs nats-server into .tools/nats
//! cargo run --release --example replica_bench -- [adds_per_sec] [seconds] [kind] [capacity] [delta_interval_ms]
//! ```
//! Defaults: 10000 adds/s for 10 s, `or_cuckoo`, capacity 200000, fpr 0.01, the replicas'
//! default `delta_interval_ms`; with a `delta_interval_ms`, the delta protocol only. The server binary
//! is `$CRPF_NATS_SERVER` or `.tools/nats/bin/nats-server`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crpf::replica::{Replica, ReplicaConfig, ReplicaHandle};
use crpf::transport::{NatsConfig, NatsTransport};
use crpf::wire::FilterKind;

use common::{percentile, start_server};

struct Outcome {
    adds: u64,
    achieved_rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    samples: usize,
    unconverged: usize,
    bytes_per_add: f64,
    delta_bytes_per_add: f64,
    state_bytes_per_add: f64,
    state_bytes: u64,
    state_pushes: u64,
}

async fn run(url: &str, name: &str, cfg: ReplicaConfig, rate: u64, secs: u64) -> Outcome {
    let mut hs: Vec<ReplicaHandle> = Vec::new();
    for _ in 0..3 {
        let t = NatsTransport::connect(NatsConfig::with_servers([url]))
            .await
            .unwrap();
        hs.push(Replica::start(cfg.clone(), Arc::new(t)).await.unwrap());
    }
    for h in &hs {
        assert!(h.wait_ready(Duration::from_secs(30)).await);
    }
    let mut before = (0, 0, 0);
    for h in &hs {
        let s = h.stats().await.unwrap();
        before.0 += s.bytes_sent;
        before.1 += s.delta_bytes_sent;
        before.2 += s.state_bytes_sent;
    }
    // Adds in ticks of 10 ms, round-robin over the replicas; one add in 50 is timed until
    // every replica contains it.
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let total = rate * secs;
    let mut pending: Vec<(Vec<u8>, Instant)> = Vec::new();
    let mut latencies = Vec::new();
    let start = Instant::now();
    let mut next = start;
    let mut i = 0u64;
    while i < total {
        for _ in 0..per_tick.min(total - i) {
            let item = format!("{name}-{i}").into_bytes();
            hs[(i % 3) as usize].add(item.clone()).await.unwrap();
            if i.is_multiple_of(50) {
                pending.push((item, Instant::now()));
            }
            i += 1;
        }
        pending.retain(|(item, t0)| {
            if hs.iter().all(|h| h.contains(item)) {
                latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                false
            } else {
                true
            }
        });
        next += tick;
        let now = Instant::now();
        if next > now {
            // Poll the pending samples at 1 ms granularity while waiting for the next tick.
            while Instant::now() < next {
                tokio::time::sleep(Duration::from_millis(1)).await;
                pending.retain(|(item, t0)| {
                    if hs.iter().all(|h| h.contains(item)) {
                        latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                        false
                    } else {
                        true
                    }
                });
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let drain = Instant::now() + Duration::from_secs(10);
    while !pending.is_empty() && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(1)).await;
        pending.retain(|(item, t0)| {
            if hs.iter().all(|h| h.contains(item)) {
                latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                false
            } else {
                true
            }
        });
    }
    let mut after = (0, 0, 0);
    let mut state_bytes = 0;
    let mut state_pushes = 0;
    for h in &hs {
        let s = h.stats().await.unwrap();
        after.0 += s.bytes_sent;
        after.1 += s.delta_bytes_sent;
        after.2 += s.state_bytes_sent;
        state_bytes = state_bytes.max(s.state_bytes);
        state_pushes += s.state_pushes;
    }
    for h in &hs {
        h.shutdown().await.unwrap();
    }
    latencies.sort_by(f64::total_cmp);
    Outcome {
        adds: total,
        achieved_rate: total as f64 / elapsed,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        samples: latencies.len(),
        unconverged: pending.len(),
        bytes_per_add: (after.0 - before.0) as f64 / total as f64,
        delta_bytes_per_add: (after.1 - before.1) as f64 / total as f64,
        state_bytes_per_add: (after.2 - before.2) as f64 / total as f64,
        state_bytes,
        state_pushes,
    }
}

#[actix::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate: u64 = args
        .first()
        .map_or(10_000, |s| s.parse().expect("adds_per_sec"));
    let secs: u64 = args.get(1).map_or(10, |s| s.parse().expect("seconds"));
    let kind: FilterKind = args
        .get(2)
        .map_or(FilterKind::OrCuckoo, |s| s.parse().expect("kind"));
    let capacity: u64 = args
        .get(3)
        .map_or(200_000, |s| s.parse().expect("capacity"));
    let delta_interval_ms: Option<u64> = args.get(4).map(|s| s.parse().expect("delta_interval_ms"));
    let (_server, url) = start_server();
    println!(
        "3 replicas, loopback nats-server, {kind} capacity {capacity} fpr 0.01, \
         {rate} adds/s for {secs} s, adds round-robin over the replicas"
    );
    println!();
    println!(
        "| protocol | adds | achieved adds/s | latency p50 (ms) | p99 (ms) | max (ms) | samples | wire bytes/add | of which deltas | of which states, digests | state size (bytes) | full-state pushes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let protocols: &[(&str, bool)] = match delta_interval_ms {
        Some(_) => &[("delta-state", false)],
        None => &[("delta-state", false), ("full-state broadcast", true)],
    };
    for &(label, full) in protocols {
        let mut cfg =
            ReplicaConfig::for_kind(format!("bench_{}", full as u8), kind, capacity, 0.01);
        cfg.full_state_only = full;
        if let Some(ms) = delta_interval_ms {
            cfg.delta_interval_ms = ms;
        }
        if full {
            // Broadcast the state at every delta interval, not throttled below it.
            cfg.min_push_interval_ms = cfg.delta_interval_ms;
        }
        let o = run(&url, label, cfg, rate, secs).await;
        println!(
            "| {label} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {}{} | {:.1} | {:.1} | {:.1} | {} | {} |",
            o.adds,
            o.achieved_rate,
            o.p50_ms,
            o.p99_ms,
            o.max_ms,
            o.samples,
            if o.unconverged > 0 {
                format!(" ({} never converged)", o.unconverged)
            } else {
                String::new()
            },
            o.bytes_per_add,
            o.delta_bytes_per_add,
            o.state_bytes_per_add,
            o.state_bytes,
            o.state_pushes
        );
    }
}
