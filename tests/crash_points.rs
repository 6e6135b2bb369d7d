//! Crash points (issue 47): real `crpf node` processes, one filter of every kind, adds
//! acknowledged at `durable` and `replicated` over RESP, and the process aborted at each step
//! of the durability cycle (`CRPF_CRASH_AT`: log write, fsync, rotation, snapshot, segment
//! removal, tag reservation, shutdown, park, resume), or a write failed (`CRPF_FAIL_AT`), as
//! an operator meets faults: every crash comes in a life that began with a clean restart (the
//! previous life ended with SIGTERM). The next life must start cleanly and find every add
//! that was ever acknowledged. Each life's figures are printed (`--nocapture`).

mod nats_harness;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crpf::FilterKind;
use crpf::replica::crash;
use nats_harness::{NatsServer, Proc, cluster_key_line, crpf, free_port, http_get};
use redis::aio::MultiplexedConnection;

const CAPACITY: u64 = 20_000;
/// How [`run`] begins the error of a request whose connection failed.
const GONE: &str = "connection lost: ";
/// What a node logs when a write fails as `CRPF_FAIL_AT` asks.
const INJECTED: &str = "injected I/O failure";
/// What an update answers when its write or fsync failed so.
const INJECTED_ANSWER: &str = "not durable: write-ahead log";
/// How long an armed point may take to be reached (it is reached within a second or two).
const REACH: Duration = Duration::from_secs(30);
/// One request's longest wait (a dying node's requests fail at once; this only bounds a bug).
const REQUEST: Duration = Duration::from_secs(10);

struct Filter {
    name: String,
    kind: FilterKind,
}

impl Filter {
    fn bloom(&self) -> bool {
        crpf::resp::redisbloom::is_bloom(self.kind)
    }
}

/// How a life with an armed point is driven to it.
#[derive(Clone, Copy, Debug)]
enum Drive {
    /// Adds until the process dies (the point is on the add path or the snapshot timer's).
    Adds,
    /// A few rounds of adds, then SIGTERM: the point is on the shutdown path.
    Term,
    /// A few rounds of adds, then `kill -9` (no point armed: the plain crash).
    Kill9,
    /// Adds until a write failed (`CRPF_FAIL_AT`), a few more, then `kill -9`.
    Fail,
    /// A few rounds of adds, then nothing: the replicas park (the point is on that path).
    Idle,
    /// Adds, then idle until filters parked, then adds (which resume them) until it dies.
    Parked,
    /// Adds, idle until filters parked, then SIGTERM.
    ParkedTerm,
    /// Catalog filters created, one of every kind, until the process dies (the point is
    /// on a create's path); the create it died in is kept and checked by the next life.
    Create,
    /// Catalog filters created, one of every kind, and `kill -9` as soon as the last was
    /// answered: every create answered is kept and checked by the next life.
    CreateKill9,
    /// A filter in Go's bits-and-blooms format imported at `replicated` into the `go_bloom`
    /// filter, and `kill -9` as soon as the import was answered.
    ImportKill9,
}

struct Case {
    /// `CRPF_CRASH_AT` or `CRPF_FAIL_AT` and its value.
    env: Option<(&'static str, String)>,
    drive: Drive,
}

fn crash_at(point: &str, nth: u32, drive: Drive) -> Case {
    Case {
        env: Some((crash::CRASH_AT, format!("{point}:{nth}"))),
        drive,
    }
}

/// Crashes at the `nth` reach of `point` counted from the first reach of point `after`.
fn crash_after(point: &str, nth: u32, after: &str, drive: Drive) -> Case {
    Case {
        env: Some((crash::CRASH_AT, format!("{point}:{nth}@{after}"))),
        drive,
    }
}

fn fail_at(point: &str, nth: u32) -> Case {
    Case {
        env: Some((crash::FAIL_AT, format!("{point}:{nth}"))),
        drive: Drive::Fail,
    }
}

/// One node's data directory through its lives, and every add acknowledged in any of them.
struct Bench {
    dir: tempfile::TempDir,
    nats: Option<String>,
    /// The filters come from the catalog (made with `CRPF.RESERVE`), not the configuration.
    catalog: bool,
    filters: Vec<Filter>,
    acked: BTreeMap<String, Vec<String>>,
    next_item: u64,
    lives: u32,
    losses: Vec<String>,
    /// `snapshot_interval_ms`: short, so that snapshots (with their rotation and segment
    /// removal) come often; or long, so that a parking replica writes its own.
    snapshot_ms: u64,
}

/// One process of the node.
struct Life {
    proc: Proc,
    name: String,
    resp: String,
    metrics: String,
    /// Connections at `durable` and at `replicated`.
    cons: Option<(MultiplexedConnection, MultiplexedConnection)>,
    /// Adds acknowledged in this life.
    acked: usize,
    /// Adds answered with an error while the process ran.
    refused: usize,
    first_refusal: Option<String>,
}

impl Life {
    fn exited(&mut self) -> Option<ExitStatus> {
        self.proc.wait_exit(Duration::ZERO)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.proc.log).unwrap_or_default()
    }

    fn metric(&self, prefix: &str) -> f64 {
        let Ok((200, body)) = http_get(&self.metrics, "/metrics") else {
            return 0.0;
        };
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

async fn run<T: redis::FromRedisValue>(
    con: &mut MultiplexedConnection,
    args: &[&str],
) -> Result<T, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match tokio::time::timeout(REQUEST, cmd.query_async(con)).await {
        Ok(r) => r.map_err(|e| {
            // The node died under the request: no answer, neither acknowledged nor refused.
            if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                format!("{GONE}{e}")
            } else {
                e.to_string()
            }
        }),
        Err(_) => Err(format!("{args:?}: no answer in {REQUEST:?}")),
    }
}

impl Bench {
    fn new(nats: Option<String>, catalog: bool, snapshot_ms: u64) -> Self {
        let filters = FilterKind::ALL
            .iter()
            .map(|&kind| Filter {
                name: if catalog {
                    format!("c_{}", kind.name())
                } else {
                    kind.name().to_string()
                },
                kind,
            })
            .collect();
        Bench {
            dir: tempfile::tempdir().unwrap(),
            nats,
            catalog,
            filters,
            acked: BTreeMap::new(),
            next_item: 0,
            lives: 0,
            losses: Vec::new(),
            snapshot_ms,
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn config(&self, resp: &str, metrics: &str) -> String {
        let replica = format!(
            "snapshot_interval_ms = {}\ndelta_interval_ms = 20\ncatch_up_timeout_ms = 200\n",
            self.snapshot_ms
        );
        let mut t = format!(
            "[node]\nmetrics_addr = \"{metrics}\"\nlog = \"warn\"\ndata_dir = \"{}\"\n",
            self.data().display()
        );
        if let Some(url) = &self.nats {
            t += &cluster_key_line();
            t += &format!("\n[nats]\nservers = [\"{url}\"]\n");
        }
        t += &format!("\n[resp]\nlisten = \"{resp}\"\n");
        // Declared filters stay awake, as before `declared_metrics` defaulted to "node": their
        // cases crash a running replica (the catalog's cases crash parked ones).
        let declared = if self.catalog {
            ""
        } else {
            "declared_metrics = \"own\"\n"
        };
        t += &format!("\n[catalog]\npark_after_ms = 300\n{declared}[catalog.defaults]\n{replica}");
        if !self.catalog {
            for f in &self.filters {
                t += &format!(
                    "\n[[filters]]\nname = \"{}\"\nfilter = {{ kind = \"{}\", capacity = \
                     {CAPACITY}, fpr = 0.01 }}\ntag_reserve_block = 8\n{replica}",
                    f.name,
                    f.kind.name()
                );
            }
        }
        t
    }

    /// Starts a life (with `env`, a point armed); `None` if it died before it was ready.
    async fn start(&mut self, env: Option<&(&'static str, String)>) -> (Life, bool) {
        self.lives += 1;
        let name = format!("life{}", self.lives);
        let resp = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let cfg = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, self.config(&resp, &metrics)).unwrap();
        let mut cmd = crpf(&["node", "--config", cfg.to_str().unwrap()]);
        if let Some((var, value)) = env {
            cmd.env(var, value);
        }
        let proc = Proc::spawn(&name, cmd, self.dir.path().join(format!("{name}.log")));
        let mut life = Life {
            proc,
            name,
            resp,
            metrics,
            cons: None,
            acked: 0,
            refused: 0,
            first_refusal: None,
        };
        let ready = self.ready(&mut life).await;
        (life, ready)
    }

    /// Connects (at both levels) once every filter answers; false if the process died first.
    async fn ready(&mut self, life: &mut Life) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        let wait = |life: &mut Life, what: &str| {
            assert!(
                Instant::now() < deadline,
                "{}: {what} in 60 s\n{}",
                life.name,
                life.proc.log_tail()
            );
        };
        while std::net::TcpStream::connect(&life.resp).is_err() {
            if life.exited().is_some() {
                return false;
            }
            wait(life, "RESP not served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let url = format!("redis://{}/", life.resp);
        let mut cons = Vec::new();
        for level in ["durable", "replicated"] {
            let Ok(mut con) = nats_harness::resp_connection(&url).await else {
                assert!(life.exited().is_some(), "{}: cannot connect", life.name);
                return false;
            };
            if let Err(e) = run::<String>(&mut con, &["CRPF.ACK", level]).await {
                assert!(
                    life.exited().is_some(),
                    "{}: CRPF.ACK {level}: {e}",
                    life.name
                );
                return false;
            }
            cons.push(con);
        }
        let con = &mut cons[0];
        if self.catalog && self.lives == 1 {
            for f in &self.filters {
                let cap = CAPACITY.to_string();
                let args = ["CRPF.RESERVE", &f.name, f.kind.name(), &cap, "0.01"];
                let ok: String = run(con, &args).await.unwrap();
                assert_eq!(ok, "OK");
            }
        }
        for f in &self.filters {
            loop {
                match run::<String>(con, &["CRPF.STATS", &f.name]).await {
                    Ok(_) => break,
                    Err(e) => {
                        if life.exited().is_some() {
                            return false;
                        }
                        // The connection lost as the process dies: a point armed at the
                        // start (a restored replica's first resume, for this request).
                        if !(e.contains("LOADING") || e.contains("BusyLoading"))
                            && life.proc.wait_exit(Duration::from_secs(10)).is_some()
                        {
                            return false;
                        }
                        assert!(
                            e.contains("LOADING") || e.contains("BusyLoading"),
                            "{}: {}: {e}",
                            life.name,
                            f.name
                        );
                        wait(life, "filters not ready");
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let replicated = cons.pop().unwrap();
        life.cons = Some((cons.pop().unwrap(), replicated));
        true
    }

    /// One add to every filter, all at once, alternately at `durable` and `replicated`;
    /// those answered are acknowledged.
    async fn round(&mut self, life: &mut Life) {
        let (durable, replicated) = life.cons.clone().expect("connected");
        let n = self.next_item;
        self.next_item += 1;
        let adds = self.filters.iter().enumerate().map(|(i, f)| {
            let mut con = if (n as usize + i).is_multiple_of(2) {
                durable.clone()
            } else {
                replicated.clone()
            };
            let item = format!("{}-{n}", f.name);
            let sketch = f.kind == FilterKind::CountMinSketch;
            let top_k = f.kind == FilterKind::TopK;
            let digest = f.kind == FilterKind::TDigest;
            let cmd = if sketch {
                "CMS.INCRBY"
            } else if top_k {
                "TOPK.ADD"
            } else if digest {
                "TDIGEST.ADD"
            } else if f.bloom() {
                "BF.ADD"
            } else {
                "CF.ADD"
            };
            let name = f.name.clone();
            async move {
                // A sketch's add is an increment by 1 (its reply an array of estimates).
                let r = if sketch {
                    run::<Vec<i64>>(&mut con, &[cmd, &name, &item, "1"])
                        .await
                        .map(|_| 1)
                } else if top_k {
                    // Counted: its reply is what the add pushed out of the list.
                    run::<Vec<Option<String>>>(&mut con, &[cmd, &name, &item])
                        .await
                        .map(|_| 1)
                } else if digest {
                    // A value (the item's number); checked by the digest's count.
                    run::<String>(&mut con, &[cmd, &name, &n.to_string()])
                        .await
                        .map(|_| 1)
                } else {
                    run::<i64>(&mut con, &[cmd, &name, &item]).await
                };
                (name, item, r)
            }
        });
        let answers = futures::future::join_all(adds).await;
        let alive = life.exited().is_none();
        for (name, item, r) in answers {
            match r {
                Ok(_) => {
                    life.acked += 1;
                    self.acked.entry(name).or_default().push(item);
                }
                Err(e) if alive && !e.starts_with(GONE) => {
                    life.refused += 1;
                    life.first_refusal.get_or_insert(format!("{name}: {e}"));
                }
                Err(_) => {}
            }
        }
    }

    /// Creates a catalog filter of every kind (`c_<kind>_<life>`), one at a time, until one
    /// is not answered (the process died under it). Those answered, and the one the process
    /// died under (its record is in the catalog: the node writes its directory after it),
    /// join the filters every later life checks and adds to.
    async fn creates(&mut self, life: &mut Life) {
        let (mut con, _) = life.cons.clone().expect("connected");
        for &kind in FilterKind::ALL {
            let name = format!("c_{}_{}", kind.name(), self.lives);
            let cap = CAPACITY.to_string();
            let args = ["CRPF.RESERVE", &name, kind.name(), &cap, "0.01"];
            let answer = run::<String>(&mut con, &args).await;
            self.filters.push(Filter { name, kind });
            match answer {
                Ok(ok) => assert_eq!(ok, "OK"),
                Err(e) if e.starts_with(GONE) => return,
                Err(e) => panic!("{}: CRPF.RESERVE: {e}", life.name),
            }
        }
    }

    /// Makes a catalog `go_bloom` filter (`g_src_<life>`), adds 50 items to it, exports it in
    /// Go's bits-and-blooms format and imports that at `replicated` into the `go_bloom` filter
    /// of every life (the same `m` and `k`): once answered, its items are acknowledged there.
    async fn import_go(&mut self, life: &mut Life) {
        let (mut durable, mut replicated) = life.cons.clone().expect("connected");
        let target = self
            .filters
            .iter()
            .find(|f| f.kind == FilterKind::GoBloom && f.name.starts_with("c_"))
            .expect("a go_bloom filter")
            .name
            .clone();
        let source = format!("g_src_{}", self.lives);
        let cap = CAPACITY.to_string();
        let args = ["CRPF.RESERVE", &source, "go_bloom", &cap, "0.01"];
        let ok: String = run(&mut durable, &args).await.unwrap();
        assert_eq!(ok, "OK");
        self.filters.push(Filter {
            name: source.clone(),
            kind: FilterKind::GoBloom,
        });
        let items: Vec<String> = (0..50).map(|i| format!("{source}-{i}")).collect();
        for item in &items {
            let _: i64 = run(&mut durable, &["BF.ADD", &source, item]).await.unwrap();
            self.acked
                .entry(source.clone())
                .or_default()
                .push(item.clone());
        }
        let data: Vec<u8> = redis::cmd("CRPF.EXPORT")
            .arg(&source)
            .arg("bits-and-blooms")
            .query_async(&mut durable)
            .await
            .unwrap();
        let answer: String = redis::cmd("CRPF.IMPORT")
            .arg(&target)
            .arg("bits-and-blooms")
            .arg(&data)
            .query_async(&mut replicated)
            .await
            .unwrap_or_else(|e| panic!("{}: CRPF.IMPORT {target}: {e}", life.name));
        assert_eq!(answer, "OK");
        self.acked.entry(target).or_default().extend(items);
    }

    async fn rounds(&mut self, life: &mut Life, n: usize) {
        for _ in 0..n {
            self.round(life).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for the process to die by itself (an armed point), adding meanwhile if `adding`.
    async fn death(&mut self, life: &mut Life, what: &str, adding: bool) -> ExitStatus {
        let deadline = Instant::now() + REACH;
        loop {
            if adding {
                self.round(life).await;
            }
            if let Some(status) = life.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not reached in {REACH:?}\n{}",
                life.name,
                life.proc.log_tail()
            );
            let pause = if adding { 10 } else { 20 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Waits until the node holds `n` parked filters, or for the process to die (its exit).
    async fn parked(life: &mut Life, n: f64) -> Option<ExitStatus> {
        let deadline = Instant::now() + REACH;
        while life.metric("crpf_parked_filters") < n {
            if let Some(status) = life.exited() {
                return Some(status);
            }
            assert!(
                Instant::now() < deadline,
                "{}: {n} filters not parked\n{}",
                life.name,
                life.proc.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    fn sigterm(life: &Life) {
        assert_eq!(unsafe { libc::kill(life.proc.pid(), libc::SIGTERM) }, 0);
    }

    /// Runs one case: a life with its point armed, driven to it; then a clean life that
    /// checks every acknowledged add and ends with SIGTERM (so that the next case's crash
    /// follows a clean restart).
    async fn case(&mut self, case: &Case) {
        let label = match (&case.env, case.drive) {
            (Some((v, p)), _) => format!("{v}={p}"),
            (None, Drive::CreateKill9) => "kill -9 after creates".to_string(),
            (None, Drive::ImportKill9) => "kill -9 after an import".to_string(),
            (None, _) => "kill -9".to_string(),
        };
        let (mut life, ready) = self.start(case.env.as_ref()).await;
        let point = case
            .env
            .as_ref()
            .map(|(_, p)| p.rsplit_once(':').map_or(p.as_str(), |(p, _)| p));
        let status = if !ready {
            life.exited().expect("not ready: died")
        } else {
            match case.drive {
                Drive::Adds => self.death(&mut life, &label, true).await,
                Drive::Term => {
                    self.rounds(&mut life, 3).await;
                    Self::sigterm(&life);
                    self.death(&mut life, &label, false).await
                }
                Drive::Kill9 => {
                    self.rounds(&mut life, 3).await;
                    assert!(life.exited().is_none(), "{}: died", life.name);
                    life.proc.kill9();
                    ExitStatus::from_raw(libc::SIGKILL)
                }
                Drive::Fail => {
                    let deadline = Instant::now() + REACH;
                    while !life.log().contains(INJECTED) {
                        assert!(Instant::now() < deadline, "{label}: never failed");
                        self.round(&mut life).await;
                    }
                    self.rounds(&mut life, 3).await;
                    assert!(life.exited().is_none(), "{}: died", life.name);
                    life.proc.kill9();
                    ExitStatus::from_raw(libc::SIGKILL)
                }
                Drive::Idle => {
                    self.rounds(&mut life, 2).await;
                    self.death(&mut life, &label, false).await
                }
                Drive::Create => {
                    self.rounds(&mut life, 2).await;
                    self.creates(&mut life).await;
                    self.death(&mut life, &label, false).await
                }
                Drive::CreateKill9 | Drive::ImportKill9 => {
                    self.rounds(&mut life, 2).await;
                    match case.drive {
                        Drive::CreateKill9 => self.creates(&mut life).await,
                        _ => self.import_go(&mut life).await,
                    }
                    assert!(life.exited().is_none(), "{}: died", life.name);
                    life.proc.kill9();
                    ExitStatus::from_raw(libc::SIGKILL)
                }
                Drive::Parked | Drive::ParkedTerm => {
                    self.rounds(&mut life, 2).await;
                    match Self::parked(&mut life, 1.0).await {
                        // Died at its point already: on a slow machine a filter may park
                        // (after 300 ms idle) between two rounds, and the next round's add
                        // wakes it. The checks below are the same.
                        Some(status) => status,
                        None if matches!(case.drive, Drive::Parked) => {
                            self.death(&mut life, &label, true).await
                        }
                        None => {
                            Self::sigterm(&life);
                            self.death(&mut life, &label, false).await
                        }
                    }
                }
            }
        };
        match (case.drive, point) {
            (Drive::Fail, Some(point)) => {
                // A failed log write or fsync is answered as failed, never acknowledged (and
                // a failed snapshot fails no update: the log holds them).
                let refused = life.first_refusal.as_deref().unwrap_or_default();
                if point.starts_with("wal.") {
                    assert!(refused.contains(INJECTED_ANSWER), "{label}: {refused:?}");
                } else {
                    assert_eq!(life.refused, 0, "{label}: {refused}");
                }
            }
            (_, Some(point)) => {
                // A lone node confirms its `replicated` adds at once: its earlier runs' ids
                // are no peers (a new id per run of the sketch kinds counted as one for an
                // hour, each such add then refused after 5 s).
                assert_eq!(life.refused, 0, "{label}: {:?}", life.first_refusal);
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGABRT),
                    "{label}: {status}\n{}",
                    life.proc.log_tail()
                );
                assert!(
                    life.log().contains(&format!("crash point {point} ")),
                    "{label}: aborted elsewhere\n{}",
                    life.proc.log_tail()
                );
            }
            (_, None) => assert_eq!(life.refused, 0, "{label}: {:?}", life.first_refusal),
        }
        let (acked, refused) = (life.acked, life.refused);
        let refusal = life.first_refusal.take().unwrap_or_default();
        drop(life);
        let lost = self.restart_and_check(&label, true).await;
        eprintln!(
            "{label:<40} acked in the crashed life {acked:>4} (refused {refused}{}), \
             all acked {:>5}, lost {lost}",
            if refusal.is_empty() {
                String::new()
            } else {
                format!(": {refusal}")
            },
            self.acked.values().map(Vec::len).sum::<usize>()
        );
    }

    /// A clean life: starts, finds every acknowledged add, adds a little, stops with
    /// SIGTERM (`kill -9` unless `clean_stop`). Answers how many acknowledged adds were
    /// missing.
    async fn restart_and_check(&mut self, label: &str, clean_stop: bool) -> usize {
        let (mut life, ready) = self.start(None).await;
        assert!(
            ready,
            "{label}: the restart did not start\n{}",
            life.proc.log_tail()
        );
        let (mut con, _) = life.cons.clone().unwrap();
        let mut lost = 0;
        let mut by_filter = Vec::new();
        for f in &self.filters {
            let items = self.acked.get(&f.name).map_or(&[][..], Vec::as_slice);
            let mut missing = 0;
            if f.kind == FilterKind::TDigest {
                // Values are not looked up one by one: the digest counts at least every
                // acknowledged add (those answered as lost may be there too).
                let info: BTreeMap<String, redis::Value> =
                    run(&mut con, &["TDIGEST.INFO", &f.name]).await.unwrap();
                let observations = match info.get("Observations") {
                    Some(redis::Value::Int(n)) => *n as usize,
                    other => panic!("TDIGEST.INFO {}: {other:?}", f.name),
                };
                missing = items.len().saturating_sub(observations);
            }
            let lookups = if f.kind == FilterKind::TDigest {
                &[][..]
            } else {
                items
            };
            for chunk in lookups.chunks(500) {
                let cmd = if f.kind == FilterKind::CountMinSketch {
                    "CMS.QUERY"
                } else if f.kind == FilterKind::TopK {
                    // Its count, not its place in the list.
                    "TOPK.COUNT"
                } else if f.bloom() {
                    "BF.MEXISTS"
                } else {
                    "CF.MEXISTS"
                };
                let mut args = vec![cmd, f.name.as_str()];
                args.extend(chunk.iter().map(String::as_str));
                let found: Vec<i64> = run(&mut con, &args).await.unwrap();
                missing += found.iter().filter(|&&x| x == 0).count();
            }
            if missing > 0 {
                by_filter.push(format!("{} {missing}/{}", f.name, items.len()));
            }
            lost += missing;
        }
        if lost > 0 {
            self.losses
                .push(format!("{label}: lost {lost} ({})", by_filter.join(", ")));
        }
        let errors: Vec<String> = life
            .log()
            .lines()
            .filter(|l| l.contains("ERROR"))
            .map(str::to_string)
            .collect();
        assert!(
            errors.is_empty(),
            "{label}: the restart logged errors:\n{}",
            errors.join("\n")
        );
        self.rounds(&mut life, 2).await;
        if clean_stop {
            life.proc.terminate(Duration::from_secs(30));
        } else {
            life.proc.kill9();
        }
        lost
    }

    /// Panics with every loss found.
    fn assert_nothing_lost(&self) {
        assert!(
            self.losses.is_empty(),
            "acknowledged adds lost:\n{}",
            self.losses.join("\n")
        );
    }
}

/// Configured filters of every kind on the in-process bus: every point of the log, the
/// snapshot, the tag reservation and the shutdown, the plain `kill -9`, and failed writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_add_survives_a_crash_at_every_point() {
    let mut bench = Bench::new(None, false, 100);
    // The first life: from nothing to a clean stop (every later crash follows a restart).
    bench.restart_and_check("first life", true).await;
    let cases = [
        Case {
            env: None,
            drive: Drive::Kill9,
        },
        crash_at(crash::WAL_BEFORE_WRITE, 30, Drive::Adds),
        crash_at(crash::WAL_AFTER_WRITE, 30, Drive::Adds),
        crash_at(crash::WAL_AFTER_FSYNC, 30, Drive::Adds),
        crash_at(crash::WAL_ROTATE, 6, Drive::Adds),
        crash_at(crash::WAL_REMOVE, 6, Drive::Adds),
        crash_at(crash::SNAPSHOT_BEFORE_RENAME, 6, Drive::Adds),
        crash_at(crash::SNAPSHOT_AFTER_RENAME, 6, Drive::Adds),
        crash_at(crash::RESERVATION_BEFORE_RENAME, 5, Drive::Adds),
        crash_at(crash::SHUTDOWN_BEFORE_SNAPSHOT, 6, Drive::Term),
        crash_at(crash::SHUTDOWN_AFTER_SNAPSHOT, 6, Drive::Term),
        crash_at(crash::NODE_STOPPED, 1, Drive::Term),
        fail_at(crash::FAIL_WAL_WRITE, 20),
        fail_at(crash::FAIL_WAL_FSYNC, 20),
        fail_at(crash::FAIL_SNAPSHOT_WRITE, 2),
    ];
    for case in &cases {
        bench.case(case).await;
    }
    // Crashes in a row: each life after a crash crashes too.
    for i in 0..3 {
        let label = format!("kill -9 after a crash ({})", i + 1);
        let lost = bench.restart_and_check(&label, false).await;
        eprintln!("{label:<40} lost {lost}");
    }
    let lost = bench.restart_and_check("the last life", true).await;
    eprintln!("{:<40} lost {lost}", "the last life");
    bench.assert_nothing_lost();
}

/// Catalog filters of every kind over NATS (the catalog outlives the node), parking when
/// idle: every point of parking and resuming, crashes after a resume, around creates, and
/// after a `replicated` import.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_add_survives_a_crash_around_parking() {
    let nats = NatsServer::start();
    let mut bench = Bench::new(Some(nats.url()), true, 60_000);
    bench.restart_and_check("first life", true).await;
    let cases = [
        crash_at(crash::PARK_BEFORE_SNAPSHOT, 1, Drive::Idle),
        crash_at(crash::PARK_STATE_TAKEN, 1, Drive::Idle),
        crash_at(crash::PARK_PARKED, 1, Drive::Idle),
        crash_at(crash::RESUME, 1, Drive::Parked),
        // At a restart after a clean stop, as the filters are restored parked, and at the
        // first resume of one (the life's first request to it).
        crash_at(crash::RESTORED, 1, Drive::Idle),
        crash_at(crash::RESUME_RESTORED, 1, Drive::Idle),
        // The first frame synced after a resume (how many came before the filters parked
        // depends on the machine's pace).
        crash_after(crash::WAL_AFTER_FSYNC, 1, crash::RESUME, Drive::Parked),
        crash_at(crash::NODE_STOPPED, 1, Drive::ParkedTerm),
        crash_at(crash::SHUTDOWN_BEFORE_SNAPSHOT, 3, Drive::Term),
        // A create's new data directory made, nothing synced (its first snapshot syncs it),
        // and at the first snapshot's points of a create; then every create answered and
        // the process killed at once.
        crash_at(crash::DATA_DIR_MADE, 1, Drive::Create),
        crash_after(
            crash::SNAPSHOT_BEFORE_RENAME,
            1,
            crash::DATA_DIR_MADE,
            Drive::Create,
        ),
        crash_after(
            crash::SNAPSHOT_AFTER_RENAME,
            1,
            crash::DATA_DIR_MADE,
            Drive::Create,
        ),
        Case {
            env: None,
            drive: Drive::CreateKill9,
        },
        // A `replicated` import answered, then `kill -9`: every imported item is there.
        Case {
            env: None,
            drive: Drive::ImportKill9,
        },
    ];
    for case in &cases {
        bench.case(case).await;
    }
    bench.assert_nothing_lost();
}

/// One process per data directory: a second node on it waits for the first to let go, then
/// refuses to start, naming the directory; once the first is gone, a node starts on it.
#[test]
fn a_second_process_on_a_data_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = |n: usize| {
        let metrics = format!("127.0.0.1:{}", free_port());
        let path = dir.path().join(format!("n{n}.toml"));
        let toml = format!(
            "[node]\nmetrics_addr = \"{metrics}\"\nlog = \"warn\"\ndata_dir = \"{}\"\n\n\
             [[filters]]\nname = \"f\"\nfilter = {{ kind = \"g_bloom\", capacity = 1000, \
             fpr = 0.01 }}\n",
            data.display()
        );
        std::fs::write(&path, toml).unwrap();
        (path, metrics)
    };
    let (first_config, metrics) = config(0);
    let mut first = nats_harness::spawn_node("first", &first_config, dir.path());
    // The exporter answers once the lock is held (it is taken first).
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(&metrics, "/metrics").is_err() {
        first.assert_running();
        assert!(Instant::now() < deadline, "{}", first.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut second = nats_harness::spawn_node("second", &config(1).0, dir.path());
    let status = second
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("a second node started\n{}", second.log_tail()));
    assert!(!status.success());
    let log = second.log_tail();
    assert!(
        log.contains("is in use by another process") && log.contains(&data.display().to_string()),
        "{log}"
    );
    first.assert_running();
    first.kill9();
    let (third_config, metrics) = config(2);
    let mut third = nats_harness::spawn_node("third", &third_config, dir.path());
    while http_get(&metrics, "/metrics").is_err() {
        third.assert_running();
        assert!(Instant::now() < deadline, "{}", third.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
    third.terminate(Duration::from_secs(30));
}
