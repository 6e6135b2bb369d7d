//! Three replicas of an observed-remove cuckoo filter in one program, on the in-process bus
//! (no server): concurrent adds and removes, then every replica agrees.
//!
//! ```text
//! cargo run --release --example replica_embedded
//! ```
//! With a NATS server instead, replace the bus by
//! `NatsTransport::connect(NatsConfig::with_servers(["nats://127.0.0.1:4222"])).await?`.

use std::sync::Arc;
use std::time::Duration;

use crpf::replica::{Replica, ReplicaConfig, ReplicaError};
use crpf::transport::{InProcessBus, Transport};
use crpf::wire::FilterKind;

#[actix::main]
async fn main() -> Result<(), ReplicaError> {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let cfg = ReplicaConfig::for_kind("sessions", FilterKind::OrCuckoo, 100_000, 0.001);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(cfg.clone(), bus.clone()).await?);
    }
    let [a, b, c] = &replicas[..] else {
        unreachable!()
    };
    println!(
        "replica ids: {:?}",
        replicas
            .iter()
            .map(|r| r.identity().replica)
            .collect::<Vec<_>>()
    );

    for i in 0..1000 {
        a.add(format!("user-{i}")).await?;
        b.add(format!("admin-{i}")).await?;
    }
    // c removes what it has seen of a's users, while a adds one of them again: add wins.
    assert!(
        c.wait_until(Duration::from_secs(10), |f| f.contains(b"user-7"))
            .await
    );
    c.remove("user-7").await?;
    a.add("user-7").await?;

    for r in &replicas {
        r.flush().await?;
    }
    let all_agree = |reps: &[crpf::replica::ReplicaHandle]| {
        let s = reps[0].snapshot();
        reps.iter().all(|r| r.read(|f| f.equivalent(&s)))
    };
    while !all_agree(&replicas) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for r in &replicas {
        let s = r.stats().await?;
        println!(
            "replica {}: {} elements, estimated fpr {:.2e}, {} deltas sent, {} merged, \
             contains user-7: {}, admin-999: {}",
            s.replica,
            s.figures.cardinality,
            s.figures.estimated_fpr,
            s.deltas_sent,
            s.deltas_merged,
            r.contains(b"user-7"),
            r.contains(b"admin-999"),
        );
    }
    for r in &replicas {
        r.shutdown().await?;
    }
    Ok(())
}
