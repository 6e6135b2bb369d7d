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
//! default `delta_interval_ms` (the full-state broadcast every 50 ms); with a `delta_interval_ms`, the delta protocol only. The server binary
//! is `$CRPF_NATS_SERVER` or `.tools/nats/bin/nats-server`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    // Adds in ticks of 1 ms (the runtime's timer resolution; bursts of 10 ms made the load
    // ten times burstier than the rate says), round-robin over the replicas; one add in 50 is timed until
    // every replica contains it. A thread of its own polls the timed adds every 100 µs
    // (`contains` reads the replicas' filters directly), so the figures are not rounded up to
    // the runtime's millisecond timer.
    let tick = Duration::from_millis(1);
    let per_tick = (rate / 1000).max(1);
    let total = rate * secs;
    let pending: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let adding = Arc::new(AtomicBool::new(true));
    let poller = {
        let (pending, adding, hs) = (pending.clone(), adding.clone(), hs.clone());
        std::thread::spawn(move || {
            let mut latencies = Vec::new();
            let mut drain_until = None;
            loop {
                // Checked outside the lock, so that the adding loop never waits for it.
                let mut waiting = std::mem::take(&mut *pending.lock().unwrap());
                waiting.retain(|(item, t0)| {
                    if hs.iter().all(|h| h.contains(item)) {
                        latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                        false
                    } else {
                        true
                    }
                });
                let mut p = pending.lock().unwrap();
                p.extend(waiting);
                let empty = p.is_empty();
                drop(p);
                if !adding.load(Ordering::Acquire) {
                    let until =
                        *drain_until.get_or_insert(Instant::now() + Duration::from_secs(10));
                    if empty || Instant::now() >= until {
                        return latencies;
                    }
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let start = Instant::now();
    let mut next = start;
    let mut i = 0u64;
    while i < total {
        for _ in 0..per_tick.min(total - i) {
            let item = format!("{name}-{i}").into_bytes();
            hs[(i % 3) as usize].add(item.clone()).await.unwrap();
            if i.is_multiple_of(50) {
                pending.lock().unwrap().push((item, Instant::now()));
            }
            i += 1;
        }
        next += tick;
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    adding.store(false, Ordering::Release);
    // Waited for without blocking: the replicas run on this thread.
    while !poller.is_finished() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut latencies = poller.join().unwrap();
    let unconverged = pending.lock().unwrap().len();

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
        unconverged,
        bytes_per_add: (after.0 - before.0) as f64 / total as f64,
        delta_bytes_per_add: (after.1 - before.1) as f64 / total as f64,
        state_bytes_per_add: (after.2 - before.2) as f64 / total as f64,
        state_bytes,
        state_pushes,
    }
}

/// A timed add: its item, and when its `add` returned.
type Sample = (Vec<u8>, Instant);

/// How often the naive protocol broadcasts its state, unless an interval is given.
const FULL_STATE_INTERVAL_MS: u64 = 50;

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
            // Broadcast the state every 50 ms (the delta interval of earlier releases; at the
            // 2 ms default the states alone would saturate the machine), not throttled below.
            cfg.delta_interval_ms = delta_interval_ms.unwrap_or(FULL_STATE_INTERVAL_MS);
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
