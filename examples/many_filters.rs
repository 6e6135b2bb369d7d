//! Creates (and optionally drops) many filters through the catalog API of running nodes
//! (`crpf.$catalog.create`, README "Filters as data") and reports the rate; with more than
//! one server URL, also how long a created filter takes to answer `contains` on a node
//! behind another server (issue 23's benchmark; BENCHMARKS.md gives the commands).
//!
//! ```text
//! cargo run --release --example many_filters -- --nats nats://127.0.0.1:4222 --count 10000
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// Server URLs; creates go to the first, visibility is checked through the others.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_delimiter = ',')]
    nats: Vec<String>,
    /// Filters to create.
    #[arg(long, default_value_t = 1_000)]
    count: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Capacity of each filter (g_bloom, 1%).
    #[arg(long, default_value_t = 1_000)]
    capacity: u64,
    /// Name prefix.
    #[arg(long, default_value = "f")]
    prefix: String,
    /// Number of the first filter created (`<prefix><first>` on): creators running at once
    /// through different servers each take their own range of one set of names.
    #[arg(long, default_value_t = 0)]
    first: usize,
    /// Drop them all afterwards (and report that rate too).
    #[arg(long)]
    drop: bool,
    /// Filters whose cross-node visibility is timed (created one at a time, then dropped).
    #[arg(long, default_value_t = 0)]
    visibility_samples: usize,
    /// Replica ids of the nodes behind the other servers (a node's catalog filters share its
    /// id, logged at its start): each must answer
    /// `contains` on its own subject before a create counts as visible, and stop answering
    /// before a drop counts as done. Empty: any replica, through the other server.
    #[arg(long, value_delimiter = ',')]
    far_replicas: Vec<u16>,
    /// Only wait (up to 10 minutes) until a node answers the catalog API, then exit.
    #[arg(long)]
    wait_api: bool,
    /// Only probe the filters `<prefix>0` to `<prefix><N-1>` (made before) on the own
    /// subjects of `--far-replicas` through the first server, `--concurrency` at once, each
    /// until it answers `contains` (a restarted node's filters serving), then exit.
    #[arg(long, default_value_t = 0)]
    probe: usize,
}

/// Probes every filter of `names` on the own subject of each of `replicas` through `nats`
/// until it answers `contains`, `concurrency` at once: how long until all did.
async fn probe_all(
    nats: &async_nats::Client,
    names: &[String],
    replicas: &[u16],
    concurrency: usize,
) {
    let started = Instant::now();
    let subjects: Vec<String> = names
        .iter()
        .flat_map(|n| {
            replicas
                .iter()
                .map(move |id| format!("crpf.{n}.replica.{id}.api.contains"))
        })
        .collect();
    let probe = |subject: String| {
        let nats = nats.clone();
        async move {
            let mut tries = 0u32;
            loop {
                tries += 1;
                let r = tokio::time::timeout(
                    Duration::from_secs(2),
                    nats.request(subject.clone(), Bytes::from_static(b"x")),
                )
                .await;
                if matches!(r, Ok(Ok(ref m)) if m.payload.starts_with(b"{\"contains\"")) {
                    return tries;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let mut in_flight = FuturesUnordered::new();
    let (mut next, mut retried) = (0, 0u64);
    while next < subjects.len() || !in_flight.is_empty() {
        while next < subjects.len() && in_flight.len() < concurrency {
            in_flight.push(probe(subjects[next].clone()));
            next += 1;
        }
        if let Some(tries) = in_flight.next().await {
            retried += u64::from(tries - 1);
        }
    }
    println!(
        "answered: {} filters in {:.2} s ({retried} probes asked again)",
        subjects.len(),
        started.elapsed().as_secs_f64()
    );
}

async fn request(nats: &async_nats::Client, op: &str, body: Value) -> Value {
    let reply = nats
        .request(
            format!("crpf.$catalog.{op}"),
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .expect("catalog request");
    serde_json::from_slice(&reply.payload).expect("JSON reply")
}

async fn run_all(
    nats: &async_nats::Client,
    op: &'static str,
    names: &[String],
    concurrency: usize,
    body: impl Fn(&str) -> Value,
) -> f64 {
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut next = 0;
    let mut errors = 0;
    while next < names.len() || !in_flight.is_empty() {
        while next < names.len() && in_flight.len() < concurrency {
            in_flight.push(request(nats, op, body(&names[next])));
            next += 1;
        }
        if let Some(reply) = in_flight.next().await
            && reply.get("error").is_some()
        {
            errors += 1;
            if errors <= 3 {
                eprintln!("{op}: {reply}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{op}: {} filters in {secs:.2} s = {:.0} filters/s ({errors} errors)",
        names.len(),
        names.len() as f64 / secs
    );
    secs
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut opts = async_nats::ConnectOptions::new();
    opts = opts.request_timeout(Some(Duration::from_secs(60)));
    let nats = opts.connect(args.nats[0].as_str()).await.expect("connect");
    if args.wait_api {
        let deadline = Instant::now() + Duration::from_secs(600);
        while Instant::now() < deadline {
            let listed = tokio::time::timeout(
                Duration::from_secs(2),
                nats.request("crpf.$catalog.list", Bytes::new()),
            )
            .await;
            if listed.is_ok_and(|r| r.is_ok_and(|m| m.payload.starts_with(b"{\"filters\""))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no node answered the catalog API within 10 minutes");
    }
    if args.probe > 0 {
        let names: Vec<String> = (0..args.probe)
            .map(|i| format!("{}{i}", args.prefix))
            .collect();
        probe_all(&nats, &names, &args.far_replicas, args.concurrency).await;
        return;
    }
    let capacity = args.capacity;
    let spec = move || json!({"kind": "g_bloom", "capacity": capacity, "fpr": 0.01});
    let names: Vec<String> = (args.first..args.first + args.count)
        .map(|i| format!("{}{i}", args.prefix))
        .collect();
    run_all(
        &nats,
        "create",
        &names,
        args.concurrency,
        |n| json!({"name": n, "filter": spec()}),
    )
    .await;

    if args.visibility_samples > 0 && args.nats.len() > 1 {
        let far = async_nats::connect(args.nats[1].as_str())
            .await
            .expect("connect");
        let subjects = |name: &str| -> Vec<String> {
            if args.far_replicas.is_empty() {
                vec![format!("crpf.{name}.api.contains")]
            } else {
                args.far_replicas
                    .iter()
                    .map(|id| format!("crpf.{name}.replica.{id}.api.contains"))
                    .collect()
            }
        };
        let answers = |subject: String| {
            let far = far.clone();
            async move {
                // Short: a request that reached a replica as it stopped gets no answer.
                let r = tokio::time::timeout(
                    Duration::from_millis(250),
                    far.request(subject, Bytes::from_static(b"x")),
                )
                .await;
                // A probe left unanswered costs the sample its 250 ms: counted, so that
                // such a sample is told from a slow replica.
                let unanswered = r.is_err();
                (
                    matches!(r, Ok(Ok(m)) if m.payload.starts_with(b"{\"contains\"")),
                    unanswered,
                )
            }
        };
        // Probes every far replica of `name` until `contains` is answered (`true`), or no
        // longer is (`false`): how many went unanswered on the way.
        let until = |name: &str, answered: bool| {
            let (subjects, answers) = (subjects(name), &answers);
            async move {
                let mut unanswered = 0;
                for subject in subjects {
                    loop {
                        let (yes, timed_out) = answers(subject.clone()).await;
                        unanswered += usize::from(timed_out);
                        if yes == answered {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                unanswered
            }
        };
        let (mut created, mut dropped) = (Vec::new(), Vec::new());
        let mut slow = Vec::new();
        for i in 0..args.visibility_samples {
            let name = format!("{}vis{i}", args.prefix);
            let started = Instant::now();
            let reply = request(&nats, "create", json!({"name": name, "filter": spec()})).await;
            // A refused create would be probed for ever.
            assert!(reply.get("error").is_none(), "create {name}: {reply}");
            // Visible once every far replica serves it.
            let unanswered = until(&name, true).await;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            if ms > 200.0 {
                slow.push(format!(
                    "create {i}: {ms:.1} ms, {unanswered} probes unanswered"
                ));
            }
            created.push(ms);
            let started = Instant::now();
            request(&nats, "drop", json!({"name": name})).await;
            // Dropped once no far replica answers any more ("no responders").
            let unanswered = until(&name, false).await;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            if ms > 200.0 {
                slow.push(format!(
                    "drop {i}: {ms:.1} ms, {unanswered} probes unanswered"
                ));
            }
            dropped.push(ms);
        }
        for s in &slow {
            println!("  above 200 ms: {s}");
        }
        for (what, ms) in [
            ("created -> contains answered", &mut created),
            ("dropped -> no longer answered", &mut dropped),
        ] {
            ms.sort_by(f64::total_cmp);
            let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
            println!(
                "{what} through another server{}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples)",
                if args.far_replicas.is_empty() {
                    ""
                } else {
                    " by every far replica"
                },
                pct(0.5),
                pct(0.99),
                pct(1.0),
                ms.len()
            );
        }
    }

    if args.drop {
        run_all(
            &nats,
            "drop",
            &names,
            args.concurrency,
            |n| json!({"name": n}),
        )
        .await;
    }
}
