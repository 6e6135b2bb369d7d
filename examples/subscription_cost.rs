//! What one queue-group subscription costs a process (issue 52: a declared filter keeps one,
//! in its filter's group, where catalog filters share the node's): the resident size before
//! and after `N` async-nats queue subscriptions, then after a task serving each. With jemalloc,
//! as the `crpf` binary allocates.
//!
//! ```text
//! cargo run --release --example subscription_cost -- nats://127.0.0.1:4222 10000
//! ```

use futures::StreamExt;

#[cfg(all(feature = "jemalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The process's resident size (`VmRSS`), in bytes.
fn resident() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .expect("VmRSS")
        * 1024.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let n: usize = args.next().map_or(10_000, |n| n.parse().expect("a count"));
    let client = async_nats::connect(url).await.expect("connect");
    client.flush().await.expect("flush");
    let before = resident();
    let mut subscriptions = Vec::with_capacity(n);
    for i in 0..n {
        let subscription = client
            .queue_subscribe(format!("crpf.d{i}.api.>"), format!("crpf.d{i}.api"))
            .await
            .expect("subscribe");
        subscriptions.push(subscription);
    }
    client.flush().await.expect("flush");
    let subscribed = resident();
    let mut tasks = Vec::with_capacity(n);
    for mut subscription in subscriptions {
        tasks.push(tokio::spawn(async move {
            while let Some(message) = subscription.next().await {
                std::hint::black_box(message);
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let served = resident();
    let per = |bytes: f64| bytes / n as f64;
    println!(
        "{n} queue subscriptions: {:.0} B each; a task serving each: {:.0} B more each",
        per(subscribed - before),
        per(served - subscribed)
    );
}
