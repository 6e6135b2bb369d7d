//! `crpf demo`: a few replicas in one process drive a workload and show, live, adds, merges,
//! convergence and the FPR estimate against the measured rate. The embedded default needs no
//! server (an in-process bus); `--nats URL` uses a real one.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Args;

use super::{NodeError, block_on_system, connect, exporter, stop};
use crate::replica::{Replica, ReplicaConfig, ReplicaHandle};
use crate::transport::NatsConfig;
use crate::wire::FilterKind;

/// `crpf demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// NATS server URL; without it the replicas talk over an in-process bus.
    #[arg(long)]
    pub nats: Option<String>,
    /// Seconds of workload before the final convergence check.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Number of replicas.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Filter type: any kind of the README's filter table (`expiring_bloom` with its default
    /// one-hour window, longer than the run).
    #[arg(long, default_value = "or_cuckoo")]
    pub kind: FilterKind,
    /// Elements the filter is sized for (the first sub-filter's, for scalable ones).
    #[arg(long, default_value_t = 200_000)]
    pub capacity: u64,
    /// Target false positive rate.
    #[arg(long, default_value_t = 0.01)]
    pub fpr: f64,
    /// Adds per second on each replica.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Where the Prometheus exporter listens.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics_addr: SocketAddr,
    /// Filter name (subject token).
    #[arg(long, default_value = "demo")]
    pub name: String,
}

const TICK: Duration = Duration::from_millis(100);
const PROBES: usize = 20_000;
const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

fn key(replica: usize, n: u64) -> Vec<u8> {
    format!("replica-{replica}-item-{n}").into_bytes()
}

/// The workload's ground truth: items added and not removed, per replica of origin.
struct Workload {
    live: Vec<BTreeSet<u64>>,
    next: Vec<u64>,
    adds: u64,
    removes: u64,
}

/// `crpf demo`: exits non-zero if the replicas did not converge or lost an element.
pub fn run_demo(args: &DemoArgs) -> Result<(), NodeError> {
    if args.replicas == 0 {
        return Err(NodeError::Failed("--replicas must be at least 1".into()));
    }
    exporter::install(args.metrics_addr, "--metrics-addr")?;
    let args = args.clone();
    block_on_system(
        crate::node::config::NodeSection::default().io_threads,
        async move {
            let nats = args
                .nats
                .as_ref()
                .map(|url| NatsConfig::with_servers([url.clone()]));
            let (transport, nats_handle) = connect(nats.as_ref()).await?;
            let cfg = ReplicaConfig::for_kind(&args.name, args.kind, args.capacity, args.fpr);
            let mut replicas = Vec::new();
            for _ in 0..args.replicas {
                replicas.push(Replica::start(cfg.clone(), transport.clone()).await?);
            }
            println!(
                "crpf demo: {} {:?} replicas over {}, {} adds/s each for {} s; metrics on http://{}/metrics",
                args.replicas,
                args.kind,
                transport.name(),
                args.rate,
                args.duration,
                args.metrics_addr
            );
            let removable = args.kind.removable();
            let mut work = Workload {
                live: vec![BTreeSet::new(); args.replicas],
                next: vec![0; args.replicas],
                adds: 0,
                removes: 0,
            };
            let per_tick = (args.rate / 10).max(1);
            let start = Instant::now();
            let mut last_report = Instant::now();
            let mut ticker = tokio::time::interval(TICK);
            while start.elapsed() < Duration::from_secs(args.duration) {
                ticker.tick().await;
                drive(&replicas, &mut work, per_tick, removable).await?;
                if last_report.elapsed() >= Duration::from_secs(1) {
                    last_report = Instant::now();
                    report(start, &replicas, &work).await?;
                }
            }
            println!("workload done; waiting for convergence");
            let deadline = Instant::now() + CONVERGE_WITHIN;
            while !converged(&replicas) && Instant::now() < deadline {
                tokio::time::sleep(TICK).await;
            }
            let ok = converged(&replicas);
            report(start, &replicas, &work).await?;
            let false_negatives = false_negatives(&replicas, &work);
            println!(
                "{} after {:.1} s: {} adds, {} removes, {} false negatives",
                if ok { "converged" } else { "NOT converged" },
                start.elapsed().as_secs_f64(),
                work.adds,
                work.removes,
                false_negatives
            );
            stop(replicas, nats_handle, || {}).await?;
            if !ok {
                return Err(NodeError::Failed("replicas did not converge".into()));
            }
            if false_negatives > 0
                && !matches!(
                    args.kind,
                    FilterKind::ScOrCuckoo | FilterKind::WriterScOrCuckoo
                )
            {
                return Err(NodeError::Failed(format!(
                    "{false_negatives} false negatives"
                )));
            }
            Ok(())
        },
    )
}

/// One tick of workload: adds on every replica; on observed-remove kinds, each replica also
/// removes one in five of its own earlier items (causally safe: the remover saw the add).
async fn drive(
    replicas: &[ReplicaHandle],
    work: &mut Workload,
    per_tick: u64,
    removable: bool,
) -> Result<(), NodeError> {
    for (r, handle) in replicas.iter().enumerate() {
        for _ in 0..per_tick {
            let n = work.next[r];
            work.next[r] += 1;
            match handle.add(key(r, n)).await {
                Ok(_) => {
                    work.live[r].insert(n);
                    work.adds += 1;
                }
                Err(e) => tracing::warn!(error = %e, "add failed"),
            }
            if removable && n % 5 == 4 {
                let victim = n - 2;
                if work.live[r].contains(&victim) && handle.remove(key(r, victim)).await? {
                    work.live[r].remove(&victim);
                    work.removes += 1;
                }
            }
        }
    }
    Ok(())
}

fn converged(replicas: &[ReplicaHandle]) -> bool {
    let first = replicas[0].snapshot();
    replicas[1..]
        .iter()
        .all(|r| r.read(|f| f.equivalent(&first)))
}

fn false_negatives(replicas: &[ReplicaHandle], work: &Workload) -> usize {
    replicas
        .iter()
        .map(|h| {
            h.read(|f| {
                (work.live.iter().enumerate())
                    .flat_map(|(r, live)| live.iter().map(move |&n| key(r, n)))
                    .filter(|k| !f.contains(k))
                    .count()
            })
        })
        .sum()
}

async fn report(
    start: Instant,
    replicas: &[ReplicaHandle],
    work: &Workload,
) -> Result<(), NodeError> {
    let mut line = format!(
        "t={:>4.0}s adds {:>7} removes {:>6} |",
        start.elapsed().as_secs_f64(),
        work.adds,
        work.removes
    );
    for h in replicas {
        let s = h.stats().await?;
        let measured = h.read(|f| {
            (0..PROBES)
                .filter(|i| f.contains(format!("absent-{i}").as_bytes()))
                .count() as f64
                / PROBES as f64
        });
        line.push_str(&format!(
            " r{} n={:.0} merges={} fpr est {:.3}% meas {:.3}% |",
            s.replica,
            s.figures.cardinality,
            s.deltas_merged + s.states_merged,
            100.0 * s.figures.estimated_fpr,
            100.0 * measured
        ));
    }
    line.push_str(if converged(replicas) {
        " converged"
    } else {
        " syncing"
    });
    println!("{line}");
    Ok(())
}
