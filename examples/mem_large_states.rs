//! Memory of large states: the peak resident memory (VmHWM of /proc/self/status) of the state
//! digest of a large GBloom, of a replica's full-state push over a loopback `nats-server`, and
//! the resident memory of a filled `or_cuckoo`; plus how long encoding a large state takes
//! next to cloning it (a push encodes under the filter's read lock).
//!
//! ```text
//! cargo run --release --no-default-features --features node --example mem_large_states -- digest 100000000
//! cargo run --release --no-default-features --features node --example mem_large_states -- push 100000000
//! cargo run --release --no-default-features --features node --example mem_large_states -- orcuckoo 10000000
//! cargo run --release --no-default-features --features node --example mem_large_states -- lock 100000000
//! ```
//! Run one phase per process: the peak is reset (`/proc/self/clear_refs`) before the measured
//! step, so it shows that step's high-water mark over what was resident before it. The server
//! binary is `$CRPF_NATS_SERVER` or `.tools/nats/bin/nats-server`. Filters use fpr 0.01.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crpf::replica::{AnyFilter, FilterSpec, Replica, ReplicaConfig};
use crpf::transport::{NatsConfig, NatsTransport};
use crpf::wire::FilterKind;

const FPR: f64 = 0.01;

/// A field of /proc/self/status in MiB.
fn status_mib(field: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    kb / 1024.0
}

/// Resets VmHWM to the current resident size (Linux 4.0+).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

fn report(step: &str, rss_before: f64) {
    println!(
        "{step}: RSS before {rss_before:.1} MiB, after {:.1} MiB, high-water {:.1} MiB (+{:.1} MiB over before)",
        status_mib("VmRSS"),
        status_mib("VmHWM"),
        status_mib("VmHWM") - rss_before
    );
}

/// A filter whose pages are all resident (a fresh one is lazily zeroed memory that reads
/// as the shared zero page): 2M elements set bits on every page.
fn gbloom(n: u64) -> AnyFilter {
    let mut f = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, n, FPR), 1).unwrap();
    for i in 0..2_000_000u64 {
        f.add(&i.to_le_bytes()).unwrap();
    }
    let bytes = f.encode_state().len();
    println!(
        "GBloom of capacity {n}: {:.1} MB encoded",
        bytes as f64 / 1e6
    );
    f
}

fn digest(n: u64) {
    let f = gbloom(n);
    let rss = status_mib("VmRSS");
    reset_peak();
    let t = Instant::now();
    let d = f.state_digest();
    let took = t.elapsed();
    report(&format!("state_digest ({d:016x}, {took:.2?})"), rss);
}

fn lock(n: u64) {
    let f = gbloom(n);
    let best = |what: &str, mut op: Box<dyn FnMut() -> usize>| {
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            std::hint::black_box(op());
            best = best.min(t.elapsed());
        }
        println!("{what}: best of 3 {best:.2?}");
    };
    let g = f.clone();
    best(
        "GBloom clone",
        Box::new(move || g.clone().params_digest() as usize),
    );
    let g = f.clone();
    best(
        "GBloom encode_state",
        Box::new(move || g.encode_state().len()),
    );
    let mut or =
        AnyFilter::new(&FilterSpec::new(FilterKind::OrCuckoo, 10_000_000, FPR), 1).unwrap();
    for i in 0..9_000_000u64 {
        let _ = or.add(&i.to_le_bytes());
    }
    let o = or.clone();
    best(
        "or_cuckoo 10M (9M in) clone",
        Box::new(move || o.clone().params_digest() as usize),
    );
    best(
        "or_cuckoo 10M (9M in) encode_state",
        Box::new(move || or.encode_state().len()),
    );
}

fn orcuckoo(n: u64) {
    let rss = status_mib("VmRSS");
    let mut f = AnyFilter::new(&FilterSpec::new(FilterKind::OrCuckoo, n, FPR), 1).unwrap();
    let mut failed = 0u64;
    for i in 0..n {
        failed += f.add(&i.to_le_bytes()).is_err() as u64;
    }
    let slots = f.stats().capacity;
    let grown = status_mib("VmRSS") - rss;
    println!(
        "or_cuckoo of capacity {n} ({slots} slots, {} in, {failed} failed): +{grown:.1} MiB resident, {:.2} bytes per slot",
        n - failed,
        grown * 1048576.0 / slots as f64
    );
}

async fn push(n: u64) {
    let (_server, url) = common::start_server();
    let t = Arc::new(
        NatsTransport::connect(NatsConfig::with_servers([url]))
            .await
            .unwrap(),
    );
    let mut cfg = ReplicaConfig::for_kind("big", FilterKind::GBloom, n, FPR);
    // Every change is followed by a full-state push.
    cfg.full_state_only = true;
    cfg.catch_up_timeout_ms = 100;
    let h = Replica::start(cfg, t).await.unwrap();
    h.wait_ready(Duration::from_secs(30)).await;
    // Every page of the replica's filter written, as a filter in use has them.
    h.merge(gbloom(n)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = h.stats().await.unwrap();
    let rss = status_mib("VmRSS");
    reset_peak();
    let t = Instant::now();
    h.add(b"x".to_vec()).await.unwrap();
    let s = loop {
        let s = h.stats().await.unwrap();
        if s.state_pushes > before.state_pushes
            && s.state_bytes > 0
            && s.state_bytes_sent >= before.state_bytes_sent + s.state_bytes
        {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    h.flush().await.unwrap();
    let took = t.elapsed();
    // Whatever comes back (an echo) arrives meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    report(
        &format!(
            "full-state push of {:.1} MB ({:.1} MB framed, {took:.2?})",
            s.state_bytes as f64 / 1e6,
            (s.state_bytes_sent - before.state_bytes_sent) as f64 / 1e6,
        ),
        rss,
    );
    h.shutdown().await.unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = |default: u64| args.get(1).and_then(|a| a.parse().ok()).unwrap_or(default);
    match args.first().map(String::as_str) {
        Some("digest") => digest(n(100_000_000)),
        Some("lock") => lock(n(100_000_000)),
        Some("orcuckoo") => orcuckoo(n(10_000_000)),
        Some("push") => {
            let n = n(100_000_000);
            actix::System::with_tokio_rt(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
            })
            .block_on(push(n));
        }
        _ => eprintln!("usage: mem_large_states digest|push|orcuckoo|lock [n]"),
    }
}
