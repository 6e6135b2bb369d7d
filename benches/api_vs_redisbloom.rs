//! The request API of a `crpf node` over NATS next to RedisBloom, one Rust load generator for
//! both, in one run (issue 9).
//!
//! Starts a real `nats-server` (JetStream, for the node's replica id claim), a `crpf node` with a
//! `g_bloom` and a `g_cuckoo` filter (capacity 30M, fpr 0.01, `ack = "local"`: the answer comes
//! once the item is in memory, as RedisBloom answers), and Debian's `redis-server` with the
//! RedisBloom module (`scripts/install-bench-tools.sh`), all on free loopback ports. Each case
//! runs against every system with the same keys and the same number of requests in flight, on
//! one single-threaded tokio runtime (so the client takes at most one of the machine's cores,
//! whichever server it loads). The systems take turns: a case's measured time is split into
//! rounds (`CRPF_BENCH_ROUNDS`), and each round runs every system for its share, so that a
//! change in the machine's load over the seconds of a case weighs on all of them alike:
//!
//! - crpf: `async-nats` requests on `crpf.<f>.api.<op>`, payload the raw item (batches: the
//!   items framed `u32 LE length | bytes` on `madd` / `mcontains`);
//! - RedisBloom: the `redis` crate, one multiplexed connection (like the one NATS connection),
//!   no explicit pipelining: `BF.ADD` / `BF.EXISTS`, `CF.ADD` / `CF.EXISTS`; batches `BF.MADD` /
//!   `BF.MEXISTS`, `CF.INSERT` (`CRPF_BENCH_REDIS_CF_INSERT=CF.INSERTNX` for the set semantics
//!   of crpf's `g_cuckoo`) / `CF.MEXISTS`.
//!
//! - crpf over RESP (`resp`): the same node's Redis-protocol front end ([`crpf::resp`]),
//!   driven exactly like RedisBloom (same client, same commands), on filters of its own;
//!
//! - the NATS floor (`floor` in `CRPF_BENCH_SYSTEMS`): the same requests, on `floor.<f>.api.<op>`
//!   over the same nats-server, answered by a responder that does nothing but reply (this
//!   bench's own binary, started again with `CRPF_BENCH_ECHO`): async-nats on a current-thread
//!   Tokio runtime, replies of the node's shape and header. What crpf cannot beat while its
//!   API goes through a broker and async-nats: the table sets crpf beside it.
//!
//! Reported per case: items/s, p50 / p99 latency of a request, server CPU (utime + stime from
//! `/proc/<pid>/stat`: nats-server and crpf node together vs redis-server) absolute and per
//! item, and the ratios crpf / RedisBloom. Without RedisBloom the run says so and measures crpf
//! alone; if the node answers `madd` with an error, the batch cases are skipped with a notice.
//!
//! ```text
//! scripts/install-bench-tools.sh
//! cargo bench --bench api_vs_redisbloom
//! ```
//!
//! Settings (environment): `CRPF_BENCH_SECS` (measured seconds per case and system, default 3),
//! `CRPF_BENCH_ROUNDS` (turns they are split into, 3), `CRPF_BENCH_WARMUP_SECS` (0.5 before a
//! system's first turn, at most 0.1 before the others), `CRPF_BENCH_INFLIGHT` (single-item cases, "1,16,64"),
//! `CRPF_BENCH_BATCH` (items per batch, 100; 0: no batch cases), `CRPF_BENCH_BATCH_INFLIGHT` ("1,16"),
//! `CRPF_BENCH_CASES` (comma-separated alternatives; a case runs if its name, e.g. "bloom add"
//! or "cuckoo mcontains ×100", contains every word of one of them), `CRPF_BENCH_SYSTEMS` ("crpf,resp,redis,floor"),
//! `CRPF_BENCH_NODE_IO_THREADS` (the node's `io_threads`; default the node's default), `CRPF_BIN` (the `crpf` binary; default the
//! one Cargo built for this bench), `CRPF_NATS_SERVER`, `CRPF_REDIS_SERVER`, `CRPF_REDISBLOOM`.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::join_all;

/// Capacity and false positive rate of every filter, on both sides. A default run adds about
/// 10M items to each side's `bloom`: the capacity leaves room, because RedisBloom adds a
/// second, slower layer to a full filter and the comparison would then measure that.
const CAPACITY: u64 = 30_000_000;
const FPR: f64 = 0.01;
/// Bytes per item.
const ITEM_LEN: usize = 16;
/// Seeds of the items added, and of the items looked up but never added.
const ADD_SEED: u64 = 0x5EED_0A00;
const MISS_SEED: u64 = 0x5EED_0B00;
/// How long a single request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error>;

// ---------------------------------------------------------------------------------------------
// Settings

struct Settings {
    secs: f64,
    rounds: usize,
    /// RedisBloom's batch add to a cuckoo filter: `CF.INSERT`, as the issue measured, or
    /// `CF.INSERTNX`, with crpf's `g_cuckoo` semantics (an item already present is not
    /// inserted again, which costs a lookup in both buckets).
    redis_cf_insert: &'static str,
    warmup_secs: f64,
    inflight: Vec<usize>,
    batch: usize,
    batch_inflight: Vec<usize>,
    cases: Vec<String>,
    systems: Vec<String>,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

fn numbers(name: &str, default: &str) -> Result<Vec<usize>, BoxError> {
    list(&env_or(name, default))
        .iter()
        .map(|n| n.parse().map_err(|e| format!("{name}: `{n}`: {e}").into()))
        .collect()
}

impl Settings {
    fn from_env() -> Result<Self, BoxError> {
        let float = |name: &str, default: &str| -> Result<f64, BoxError> {
            let v = env_or(name, default);
            v.parse().map_err(|e| format!("{name}: `{v}`: {e}").into())
        };
        Ok(Settings {
            secs: float("CRPF_BENCH_SECS", "3")?,
            rounds: numbers("CRPF_BENCH_ROUNDS", "3")?[0].max(1),
            redis_cf_insert: match env_or("CRPF_BENCH_REDIS_CF_INSERT", "CF.INSERT").as_str() {
                "CF.INSERT" => "CF.INSERT",
                "CF.INSERTNX" => "CF.INSERTNX",
                other => {
                    return Err(format!(
                        "CRPF_BENCH_REDIS_CF_INSERT: `{other}`: CF.INSERT or CF.INSERTNX"
                    )
                    .into());
                }
            },
            warmup_secs: float("CRPF_BENCH_WARMUP_SECS", "0.5")?,
            inflight: numbers("CRPF_BENCH_INFLIGHT", "1,16,64")?,
            batch: numbers("CRPF_BENCH_BATCH", "100")?[0],
            batch_inflight: numbers("CRPF_BENCH_BATCH_INFLIGHT", "1,16")?,
            cases: list(&env_or("CRPF_BENCH_CASES", "")),
            systems: list(&env_or("CRPF_BENCH_SYSTEMS", "crpf,resp,redis,floor")),
        })
    }

    /// Every word of one of the comma-separated alternatives is in the case's name.
    fn wants(&self, case: &str) -> bool {
        self.cases.is_empty()
            || self
                .cases
                .iter()
                .any(|alt| alt.split_whitespace().all(|w| case.contains(w)))
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `$var` if set, else `default` under the repository.
fn tool(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A child process killed (by its pid) and reaped when dropped; output in a log file.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Proc, BoxError> {
        let out = std::fs::File::create(&log)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out));
        let child = cmd
            .spawn()
            .map_err(|e| format!("start {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc { name, child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error with the end of the log if the process has exited.
    fn check_running(&mut self) -> Result<(), BoxError> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                Err(format!("{} exited with {status}\n{}", self.name, self.tail()).into())
            }
        }
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_port(p: &mut Proc, port: u16) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        p.check_running()?;
        if Instant::now() > deadline {
            return Err(format!("{} does not listen on port {port}", p.name).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn start_nats(dir: &Path) -> Result<(Proc, u16), BoxError> {
    let bin = tool("CRPF_NATS_SERVER", ".tools/nats/bin/nats-server");
    if !bin.exists() {
        return Err(format!(
            "{} not found: run scripts/install-bench-tools.sh (or set CRPF_NATS_SERVER)",
            bin.display()
        )
        .into());
    }
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.join("jetstream"));
    let mut p = Proc::spawn("nats-server", cmd, dir.join("nats.log"))?;
    wait_port(&mut p, port)?;
    Ok((p, port))
}

fn crpf_bin() -> Result<PathBuf, BoxError> {
    let p = std::env::var_os("CRPF_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_crpf").map(PathBuf::from))
        .ok_or("no crpf binary: set CRPF_BIN (build it with `cargo build --release`)")?;
    if !p.exists() {
        return Err(format!("crpf binary {} does not exist", p.display()).into());
    }
    Ok(p)
}

/// The node's filters served over RESP (`resp` in `CRPF_BENCH_SYSTEMS`) are its own: the
/// items added over NATS do not fill them.
const RESP_KEY_PREFIX: &str = "resp_";

fn start_node(dir: &Path, nats_port: u16, resp_port: u16) -> Result<Proc, BoxError> {
    let config = dir.join("node.toml");
    // No data_dir: state in memory only, and `ack = "local"` answers once the item is applied
    // in memory (with a data_dir the default would be `durable`, an fsync per batch).
    // `CRPF_BENCH_FILTER_TOML`: more settings for every filter, to measure tuning;
    // `CRPF_BENCH_NODE_TOML`: sections appended to the node's file (e.g. `[catalog]`).
    let extra = std::env::var("CRPF_BENCH_FILTER_TOML").unwrap_or_default();
    let filter = |name: &str, kind: &str| {
        format!(
            "[[filters]]\nname = \"{name}\"\nfilter = {{ kind = \"{kind}\", capacity = {CAPACITY}, \
             fpr = {FPR} }}\nack = \"local\"\n{extra}\n"
        )
    };
    std::fs::write(
        &config,
        format!(
            // Unsigned frames, as in the runs recorded before nodes over NATS required a
            // cluster key: one node on loopback, nothing to authenticate against.
            "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\nallow_unauthenticated = true\n{}\n[nats]\nservers = \
             [\"nats://127.0.0.1:{nats_port}\"]\n\n[resp]\nlisten = \"127.0.0.1:{resp_port}\"\n\n{}\n{}\n{}\n{}",
            free_port(),
            std::env::var("CRPF_BENCH_NODE_IO_THREADS")
                .map(|v| format!("io_threads = {v}\n"))
                .unwrap_or_default(),
            filter("bloom", "g_bloom"),
            filter("cuckoo", "g_cuckoo"),
            filter(&format!("{RESP_KEY_PREFIX}bloom"), "g_bloom"),
            filter(&format!("{RESP_KEY_PREFIX}cuckoo"), "g_cuckoo"),
        ) + &std::env::var("CRPF_BENCH_NODE_TOML").unwrap_or_default(),
    )?;
    let mut cmd = Command::new(crpf_bin()?);
    cmd.arg("node").arg("--config").arg(&config);
    cmd.env_remove("RUST_LOG");
    // Configuration overrides of the caller's shell would change what is measured.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CRPF_") && k.contains("__") {
            cmd.env_remove(k);
        }
    }
    Proc::spawn("crpf node", cmd, dir.join("node.log"))
}

/// redis-server with RedisBloom, or why there is none.
fn start_redis(dir: &Path) -> Result<(Proc, u16), String> {
    let bin = tool("CRPF_REDIS_SERVER", ".tools/redis/bin/redis-server");
    let module = tool("CRPF_REDISBLOOM", ".tools/redis/redisbloom.so");
    for p in [&bin, &module] {
        if !p.exists() {
            return Err(format!(
                "{} not found (run scripts/install-bench-tools.sh)",
                p.display()
            ));
        }
    }
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        // In memory only, like the node: no snapshots, no append-only file.
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .arg("--loadmodule")
        .arg(module);
    let mut p =
        Proc::spawn("redis-server", cmd, dir.join("redis.log")).map_err(|e| e.to_string())?;
    wait_port(&mut p, port).map_err(|e| e.to_string())?;
    Ok((p, port))
}

// ---------------------------------------------------------------------------------------------
// CPU time from /proc

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of a process (all its threads), in seconds.
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 of the whole line are the 12th and 13th after the name.
    match (f.get(11), f.get(12)) {
        (Some(u), Some(s)) => (u + s) / clock_ticks(),
        _ => 0.0,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

// ---------------------------------------------------------------------------------------------
// Workload

#[derive(Clone, Copy, PartialEq, Eq)]
enum Filter {
    Bloom,
    Cuckoo,
}

impl Filter {
    fn name(self) -> &'static str {
        match self {
            Filter::Bloom => "bloom",
            Filter::Cuckoo => "cuckoo",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Contains,
}

impl Op {
    fn name(self, batch: bool) -> &'static str {
        match (self, batch) {
            (Op::Add, false) => "add",
            (Op::Contains, false) => "contains",
            (Op::Add, true) => "madd",
            (Op::Contains, true) => "mcontains",
        }
    }
}

/// A 16-byte item: the `n`-th of the stream `seed` (xxh3-128 of `n`, so both systems get the
/// same pseudo-random items).
fn item(seed: u64, n: u64) -> [u8; ITEM_LEN] {
    xxhash_rust::xxh3::xxh3_128_with_seed(&n.to_le_bytes(), seed).to_le_bytes()
}

/// Which items a system has been given; lookups ask for added and never-added items in turn.
#[derive(Default)]
struct Keys {
    added: Cell<u64>,
    misses: Cell<u64>,
    lookups: Cell<u64>,
}

impl Keys {
    fn next(&self, op: Op) -> [u8; ITEM_LEN] {
        match op {
            Op::Add => {
                let n = self.added.get();
                self.added.set(n + 1);
                item(ADD_SEED, n)
            }
            Op::Contains => {
                let n = self.lookups.get();
                self.lookups.set(n + 1);
                let added = self.added.get();
                if n.is_multiple_of(2) && added > 0 {
                    item(ADD_SEED, (n / 2).wrapping_mul(0x9E37_79B9) % added)
                } else {
                    let m = self.misses.get();
                    self.misses.set(m + 1);
                    item(MISS_SEED, m)
                }
            }
        }
    }
}

/// Where requests go.
enum Target {
    /// A crpf node (`prefix` "crpf") or the NATS floor ("floor").
    Crpf {
        client: async_nats::Client,
        prefix: &'static str,
    },
    /// RedisBloom, or a crpf node's RESP front end (keys `prefix` + the filter's name), with
    /// `cf_insert` its batch add to a cuckoo filter.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        prefix: &'static str,
        cf_insert: &'static str,
    },
}

impl Target {
    /// One request for `items` (one item: the single-item operation; more: the batch one).
    async fn request(
        &self,
        filter: Filter,
        op: Op,
        batch: bool,
        items: &[[u8; ITEM_LEN]],
    ) -> Result<(), String> {
        match self {
            Target::Crpf { client, prefix } => {
                let subject = format!("{prefix}.{}.api.{}", filter.name(), op.name(batch));
                let payload = if batch {
                    frame(items)
                } else {
                    Bytes::copy_from_slice(&items[0])
                };
                let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.request(subject, payload))
                    .await
                    .map_err(|_| "timeout".to_string())?
                    .map_err(|e| e.to_string())?;
                // Every answer is a JSON object; errors are `{"error": ...}`.
                if reply.payload.starts_with(b"{\"error\"") {
                    return Err(String::from_utf8_lossy(&reply.payload).into_owned());
                }
                Ok(())
            }
            Target::Redis {
                conn,
                prefix,
                cf_insert,
            } => {
                let command = match (filter, op, batch) {
                    (Filter::Bloom, Op::Add, false) => "BF.ADD",
                    (Filter::Bloom, Op::Contains, false) => "BF.EXISTS",
                    (Filter::Bloom, Op::Add, true) => "BF.MADD",
                    (Filter::Bloom, Op::Contains, true) => "BF.MEXISTS",
                    (Filter::Cuckoo, Op::Add, false) => "CF.ADD",
                    (Filter::Cuckoo, Op::Contains, false) => "CF.EXISTS",
                    (Filter::Cuckoo, Op::Add, true) => cf_insert,
                    (Filter::Cuckoo, Op::Contains, true) => "CF.MEXISTS",
                };
                let mut cmd = redis::cmd(command);
                cmd.arg(format!("{prefix}{}", filter.name()));
                if command.starts_with("CF.INSERT") {
                    cmd.arg("ITEMS");
                }
                for i in items {
                    cmd.arg(&i[..]);
                }
                let mut conn = conn.clone();
                cmd.query_async::<redis::Value>(&mut conn)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// The batch framing of crpf's `madd` / `mcontains`: `u32 LE length | bytes` per item.
fn frame(items: &[[u8; ITEM_LEN]]) -> Bytes {
    crpf::api::batch::encode(items)
        .expect("16-byte items fit the framing")
        .into()
}

/// What one case measured against one system.
#[derive(Clone, Default)]
struct Sample {
    /// Latencies of the requests, until [`Sample::finish`] takes their percentiles.
    lat: Vec<u32>,
    requests: u64,
    items: u64,
    errors: u64,
    first_error: Option<String>,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
    /// Server CPU seconds: nats-server + crpf node, or redis-server.
    server_cpu: f64,
    /// crpf and the floor: of which nats-server.
    nats_cpu: f64,
    /// The load generator's own CPU seconds.
    client_cpu: f64,
}

impl Sample {
    /// Adds the figures of another turn of the same case and system.
    fn absorb(&mut self, turn: Sample) {
        self.lat.extend(turn.lat);
        self.requests += turn.requests;
        self.items += turn.items;
        self.errors += turn.errors;
        self.first_error = self.first_error.take().or(turn.first_error);
        self.secs += turn.secs;
        self.server_cpu += turn.server_cpu;
        self.nats_cpu += turn.nats_cpu;
        self.client_cpu += turn.client_cpu;
    }

    /// Takes the percentiles of the latencies of every turn, and drops them: a full run
    /// would otherwise keep every latency.
    fn finish(&mut self) {
        let mut lat = std::mem::take(&mut self.lat);
        lat.sort_unstable();
        self.p50_us = percentile(&lat, 0.50);
        self.p99_us = percentile(&lat, 0.99);
    }

    fn items_per_sec(&self) -> f64 {
        self.items as f64 / self.secs
    }
    fn cpu_us_per_item(&self) -> f64 {
        self.server_cpu * 1e6 / self.items.max(1) as f64
    }
}

/// Server pids whose CPU a system is charged with (the first is NATS for crpf and the floor).
struct System {
    name: &'static str,
    target: Target,
    pids: Vec<String>,
    keys: [Keys; 2],
}

impl System {
    fn keys(&self, f: Filter) -> &Keys {
        &self.keys[f as usize]
    }
}

/// Runs `inflight` request loops until `secs` have passed; latencies of requests that began
/// before the end.
async fn drive(
    sys: &System,
    filter: Filter,
    op: Op,
    batch: usize,
    inflight: usize,
    secs: f64,
) -> (Vec<u32>, u64, u64, Option<String>) {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let errors = Cell::new(0u64);
    let first_error = RefCell::new(None);
    let (keys, errs, first) = (sys.keys(filter), &errors, &first_error);
    let loops = (0..inflight).map(move |_| async move {
        let mut lat = Vec::new();
        let mut items = Vec::with_capacity(batch);
        while Instant::now() < end {
            items.clear();
            items.extend((0..batch).map(|_| keys.next(op)));
            let t = Instant::now();
            let r = sys.target.request(filter, op, batch > 1, &items).await;
            lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            if let Err(e) = r {
                errs.set(errs.get() + 1);
                first.borrow_mut().get_or_insert(e);
            }
        }
        lat
    });
    let lat: Vec<u32> = join_all(loops).await.into_iter().flatten().collect();
    let requests = lat.len() as u64;
    (lat, requests, errors.get(), first_error.into_inner())
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

/// One turn of a case on one system: `warmup` seconds unmeasured, then `secs` measured.
async fn run_turn(
    sys: &System,
    filter: Filter,
    op: Op,
    batch: usize,
    inflight: usize,
    (warmup, secs): (f64, f64),
) -> Sample {
    drive(sys, filter, op, batch, inflight, warmup).await;
    let cpu = |pids: &[String]| pids.iter().map(|p| cpu_secs(p)).sum::<f64>();
    let (server0, nats0, client0) = (cpu(&sys.pids), cpu(&sys.pids[..1]), cpu_secs("self"));
    let t = Instant::now();
    let (lat, requests, errors, first_error) = drive(sys, filter, op, batch, inflight, secs).await;
    let secs = t.elapsed().as_secs_f64();
    Sample {
        lat,
        // Taken over every turn by `finish`.
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        requests,
        items: requests * batch as u64,
        errors,
        first_error,
        secs,
        server_cpu: cpu(&sys.pids) - server0,
        nats_cpu: if sys.name == "crpf" || sys.name == "floor" {
            cpu(&sys.pids[..1]) - nats0
        } else {
            0.0
        },
        client_cpu: cpu_secs("self") - client0,
    }
}

// ---------------------------------------------------------------------------------------------
// Setup

async fn crpf_ready(client: &async_nats::Client, prefix: &str) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    for f in ["bloom", "cuckoo"] {
        loop {
            let r = tokio::time::timeout(
                Duration::from_secs(2),
                client.request(format!("{prefix}.{f}.api.stats"), Bytes::new()),
            )
            .await;
            if let Ok(Ok(m)) = r
                && serde_json::from_slice::<serde_json::Value>(&m.payload)
                    .ok()
                    .and_then(|v| v.get("ready").and_then(|r| r.as_bool()))
                    == Some(true)
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{prefix} filter {f} not ready within 60 s").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Whether the node serves `madd` (a build without batch operations answers with an error).
async fn crpf_has_batches(client: &async_nats::Client) -> Result<(), String> {
    let probe = [item(MISS_SEED ^ 1, 0)];
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        client.request("crpf.bloom.api.madd", frame(&probe)),
    )
    .await;
    match r {
        Ok(Ok(m)) if !m.payload.starts_with(b"{\"error\"") => Ok(()),
        Ok(Ok(m)) => Err(String::from_utf8_lossy(&m.payload).into_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 5 s".into()),
    }
}

/// One multiplexed connection to a RESP server on `port` (RedisBloom or the node's front end).
async fn redis_connection(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(REQUEST_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())
}

async fn redis_setup(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    let conn = redis_connection(port).await?;
    let run = |args: Vec<String>| {
        let mut conn = conn.clone();
        async move {
            let mut c = redis::cmd(&args[0]);
            for a in &args[1..] {
                c.arg(a);
            }
            c.query_async::<redis::Value>(&mut conn)
                .await
                .map_err(|e| format!("{}: {e}", args.join(" ")))
        }
    };
    let words = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
    // RedisBloom's defaults otherwise: a non-scaling-in-practice Bloom filter (it would only
    // grow past 10M items) and a cuckoo filter of 2-slot buckets with 8-bit fingerprints.
    run(words(&format!("BF.RESERVE bloom {FPR} {CAPACITY}"))).await?;
    run(words(&format!("CF.RESERVE cuckoo {CAPACITY}"))).await?;
    Ok(conn)
}

/// A connection to the node's RESP front end, once it answers.
async fn resp_connection(port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    let conn = redis_connection(port)
        .await
        .map_err(|e| format!("RESP front end: {e}"))?;
    let mut c = conn.clone();
    redis::cmd("PING")
        .query_async::<String>(&mut c)
        .await
        .map_err(|e| format!("RESP front end: {e}"))?;
    Ok(conn)
}

async fn redis_info(conn: &redis::aio::MultiplexedConnection, command: &str) -> String {
    let mut conn = conn.clone();
    match redis::cmd(command)
        .arg(if command.starts_with("BF") {
            "bloom"
        } else {
            "cuckoo"
        })
        .query_async::<Vec<redis::Value>>(&mut conn)
        .await
    {
        Ok(v) => v
            .chunks(2)
            .map(|kv| {
                let s = |v: &redis::Value| match v {
                    redis::Value::SimpleString(s) => s.clone(),
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    redis::Value::Int(i) => i.to_string(),
                    other => format!("{other:?}"),
                };
                format!("{} {}", s(&kv[0]), kv.get(1).map(s).unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => e.to_string(),
    }
}

async fn crpf_cardinality(client: &async_nats::Client, f: &str) -> String {
    match client
        .request(format!("crpf.{f}.api.stats"), Bytes::new())
        .await
    {
        Ok(m) => serde_json::from_slice::<serde_json::Value>(&m.payload)
            .ok()
            .map(|v| {
                format!(
                    "cardinality {:.0}, capacity {}, estimated fpr {:.2e}",
                    v["cardinality"].as_f64().unwrap_or(f64::NAN),
                    v["capacity"],
                    v["estimated_fpr"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .unwrap_or_default(),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Report

fn fmt_ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

struct Row {
    case: String,
    inflight: usize,
    crpf: Option<Sample>,
    redis: Option<Sample>,
    floor: Option<Sample>,
    /// crpf's RESP front end.
    resp: Option<Sample>,
}

/// The table of `system` (crpf over NATS, or over RESP) against RedisBloom.
fn ratio_table(out: &mut String, rows: &[Row], system: fn(&Row) -> &Option<Sample>) {
    let num = |s: &Option<Sample>, f: fn(&Sample) -> f64| s.as_ref().map_or(f64::NAN, f);
    out.push_str(
        "| case | in flight | crpf items/s | RedisBloom items/s | ratio | crpf p50 µs | RB p50 µs \
         | ratio | crpf p99 µs | RB p99 µs | ratio | crpf CPU µs/item | RB CPU µs/item | ratio |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows.iter().filter(|r| system(r).is_some()) {
        let cells = [
            (Sample::items_per_sec as fn(&Sample) -> f64),
            |s: &Sample| s.p50_us,
            |s: &Sample| s.p99_us,
            Sample::cpu_us_per_item,
        ];
        let _ = write!(out, "| {} | {} |", r.case, r.inflight);
        for f in cells {
            let (a, b) = (num(system(r), f), num(&r.redis, f));
            let _ = write!(
                out,
                " {} | {} | {} |",
                fmt_num(a),
                fmt_num(b),
                fmt_ratio(a, b)
            );
        }
        out.push('\n');
    }
}

fn report(rows: &[Row]) -> String {
    let mut out = String::new();
    let num = |s: &Option<Sample>, f: fn(&Sample) -> f64| s.as_ref().map_or(f64::NAN, f);
    out.push_str(
        "ratio = crpf / RedisBloom (items/s below 1, latency or CPU above 1: crpf is behind); \
         latency of one request (a batch for ×N cases); CPU = server CPU (nats-server + crpf \
         node, or redis-server) per item.\n\n",
    );
    if rows.iter().any(|r| r.crpf.is_some()) {
        out.push_str("crpf over NATS (the request API):\n\n");
        ratio_table(&mut out, rows, |r| &r.crpf);
    }
    if rows.iter().any(|r| r.resp.is_some()) {
        out.push_str(
            "\ncrpf over RESP (the node's Redis-protocol front end, the same redis-rs client and \
             commands as RedisBloom; CPU = the crpf node's):\n\n",
        );
        ratio_table(&mut out, rows, |r| &r.resp);
    }
    if rows.iter().any(|r| r.floor.is_some()) {
        out.push_str(
            "\nThe NATS floor: the same requests over the same nats-server, answered by a \
             responder that only replies. `node` CPU = the server side's CPU minus \
             nats-server's, per item.\n\n| case | in flight | floor items/s | crpf / floor | \
             floor p50 µs | floor node CPU µs/item | crpf node CPU µs/item | RB CPU µs/item \
             |\n|---|---|---|---|---|---|---|---|\n",
        );
        let node = |s: &Sample| (s.server_cpu - s.nats_cpu) * 1e6 / s.items.max(1) as f64;
        for r in rows {
            let Some(f) = &r.floor else { continue };
            let crpf = r.crpf.as_ref();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.case,
                r.inflight,
                fmt_num(f.items_per_sec()),
                fmt_ratio(
                    crpf.map_or(f64::NAN, Sample::items_per_sec),
                    f.items_per_sec()
                ),
                fmt_num(f.p50_us),
                fmt_num(node(f)),
                fmt_num(crpf.map_or(f64::NAN, node)),
                fmt_num(num(&r.redis, Sample::cpu_us_per_item)),
            );
        }
    }
    out.push_str(
        "\nDetail (CPU in seconds over the measured interval; `of which NATS` is nats-server's \
         part of crpf's server CPU; cores = server CPU / wall time):\n\n",
    );
    out.push_str(
        "| case | in flight | system | requests | items | errors | secs | server CPU s | of which \
         NATS s | server cores | client CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        for (name, s) in [
            ("crpf", &r.crpf),
            ("crpf RESP", &r.resp),
            ("RedisBloom", &r.redis),
            ("NATS floor", &r.floor),
        ] {
            if let Some(s) = s {
                let _ = writeln!(
                    out,
                    "| {} | {} | {name} | {} | {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
                    r.case,
                    r.inflight,
                    s.requests,
                    s.items,
                    s.errors,
                    s.secs,
                    s.server_cpu,
                    if name == "crpf" || name == "NATS floor" {
                        format!("{:.2}", s.nats_cpu)
                    } else {
                        "-".into()
                    },
                    s.server_cpu / s.secs,
                    s.client_cpu,
                );
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The NATS floor

/// Set to a NATS URL, the bench's binary runs [`echo_responder`] instead of the bench.
const ECHO_ROLE: &str = "CRPF_BENCH_ECHO";

/// Answers every request on `floor.>` with what a node would answer, without a filter: one
/// queue subscription, replies with the one header a node's replies carry (`Crpf-Replica`),
/// on a current-thread runtime (the cheapest per request that was measured: a runtime of two
/// workers cost 5.3 µs per request where this costs 3.3).
fn echo_responder(url: &str) -> Result<(), BoxError> {
    use futures::StreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = async_nats::connect(url).await?;
        let mut requests = client
            .queue_subscribe("floor.>", "floor".to_string())
            .await?;
        while let Some(m) = requests.next().await {
            let Some(reply) = m.reply else { continue };
            let op = m.subject.rsplit('.').next().unwrap_or("");
            let body = match op {
                "stats" => Bytes::from_static(b"{\"ready\":true}"),
                "add" => Bytes::from_static(b"{\"added\":true}"),
                "contains" => Bytes::from_static(b"{\"contains\":false}"),
                "madd" => format!("{{\"added\":{}}}", framed_items(&m.payload)?).into(),
                _ => {
                    let n = framed_items(&m.payload)?;
                    format!("{{\"contains\":[{}]}}", vec!["false"; n].join(",")).into()
                }
            };
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Crpf-Replica", "1");
            client.publish_with_headers(reply, headers, body).await?;
        }
        Ok(())
    })
}

/// How many items a batch frame holds (decoded as a node decodes it).
fn framed_items(frame: &[u8]) -> Result<usize, crpf::api::batch::BatchError> {
    let limits = crpf::api::batch::Limits::new(usize::MAX, usize::MAX);
    crpf::api::batch::decode(frame, limits).map(|items| items.len())
}

/// A client of `url` once the server behind `prefix` answers `stats` as ready; else the
/// error with the tail of `server`'s log.
async fn ready_client(
    url: String,
    prefix: &str,
    server: &mut Proc,
) -> Result<async_nats::Client, BoxError> {
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .connect(url)
        .await?;
    if let Err(e) = crpf_ready(&client, prefix).await {
        server.check_running()?;
        return Err(format!("{e}\n{}", server.tail()).into());
    }
    Ok(client)
}

// ---------------------------------------------------------------------------------------------

fn main() -> Result<(), BoxError> {
    if let Ok(url) = std::env::var(ECHO_ROLE) {
        return echo_responder(&url);
    }
    let s = Settings::from_env()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(s))
}

async fn run(s: Settings) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let load_start = load_average();
    let started = Instant::now();
    println!("# Request API: crpf node over NATS vs RedisBloom\n");

    let mut systems = Vec::new();
    let mut procs = Vec::new();
    let mut crpf_batches = false;
    let wanted = |name: &str| s.systems.iter().any(|x| x == name);
    // One nats-server for crpf and the floor: its CPU is charged to whichever runs.
    let nats = if wanted("crpf") || wanted("floor") || wanted("resp") {
        let (nats, port) = start_nats(dir.path())?;
        let pid = nats.pid().to_string();
        procs.push(nats);
        Some((pid, port))
    } else {
        None
    };
    if let (true, Some((nats_pid, nats_port))) = (wanted("crpf") || wanted("resp"), &nats) {
        let nats_port = *nats_port;
        let resp_port = free_port();
        let mut node = start_node(dir.path(), nats_port, resp_port)?;
        let client =
            ready_client(format!("nats://127.0.0.1:{nats_port}"), "crpf", &mut node).await?;
        match crpf_has_batches(&client).await {
            Ok(()) => crpf_batches = true,
            Err(e) => {
                println!("crpf batch ops: not available in this build (madd answered: {e})\n")
            }
        }
        println!(
            "crpf: nats-server pid {}, crpf node pid {} ({}), filters g_bloom `bloom` and \
             g_cuckoo `cuckoo`, capacity {CAPACITY}, fpr {FPR}, ack = \"local\", no data_dir",
            nats_pid,
            node.pid(),
            crpf_bin()?.display()
        );
        if wanted("crpf") {
            systems.push(System {
                name: "crpf",
                target: Target::Crpf {
                    client,
                    prefix: "crpf",
                },
                pids: vec![nats_pid.clone(), node.pid().to_string()],
                keys: Default::default(),
            });
        }
        if wanted("resp") {
            let conn = resp_connection(resp_port)
                .await
                .map_err(|e| format!("{e}\n{}", node.tail()))?;
            println!(
                "crpf RESP: the same node on 127.0.0.1:{resp_port}, its own filters \
                 `{RESP_KEY_PREFIX}bloom` and `{RESP_KEY_PREFIX}cuckoo` (same kinds and sizes), \
                 one multiplexed redis-rs connection as for RedisBloom"
            );
            systems.push(System {
                name: "resp",
                target: Target::Redis {
                    conn,
                    prefix: RESP_KEY_PREFIX,
                    // Its adds are NX already; it has no CF.INSERTNX.
                    cf_insert: "CF.INSERT",
                },
                pids: vec![node.pid().to_string()],
                keys: Default::default(),
            });
        }
        procs.push(node);
    }
    if let (true, Some((nats_pid, nats_port))) = (wanted("floor"), &nats) {
        let url = format!("nats://127.0.0.1:{nats_port}");
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.env(ECHO_ROLE, &url);
        let mut echo = Proc::spawn("NATS floor responder", cmd, dir.path().join("echo.log"))?;
        let client = ready_client(url, "floor", &mut echo).await?;
        println!(
            "NATS floor: responder pid {} (this bench's binary) on floor.<f>.api.<op>, same \
             nats-server",
            echo.pid()
        );
        systems.push(System {
            name: "floor",
            target: Target::Crpf {
                client,
                prefix: "floor",
            },
            pids: vec![nats_pid.clone(), echo.pid().to_string()],
            keys: Default::default(),
        });
        procs.push(echo);
    }
    if wanted("redis") {
        let started = match start_redis(dir.path()) {
            Ok((p, port)) => match redis_setup(port).await {
                Ok(conn) => Ok((p, conn)),
                Err(e) => Err(format!("{e}\n{}", p.tail())),
            },
            Err(e) => Err(e),
        };
        match started {
            Ok((p, conn)) => {
                println!(
                    "RedisBloom: redis-server pid {} with {}, BF.RESERVE bloom {FPR} {CAPACITY}, \
                     CF.RESERVE cuckoo {CAPACITY}, one multiplexed connection, no pipelining",
                    p.pid(),
                    tool("CRPF_REDISBLOOM", ".tools/redis/redisbloom.so").display()
                );
                systems.push(System {
                    name: "redis",
                    target: Target::Redis {
                        conn,
                        prefix: "",
                        cf_insert: s.redis_cf_insert,
                    },
                    pids: vec![p.pid().to_string()],
                    keys: Default::default(),
                });
                procs.push(p);
            }
            Err(e) => println!("RedisBloom: not available ({e}); measuring crpf alone"),
        }
    }
    println!(
        "client: one current-thread tokio runtime; {ITEM_LEN}-byte items; {} s per case and \
         system in {} turns taken in rotation, after a {} s warm-up; load average at start \
         {load_start}; {} CPUs\n",
        s.secs,
        s.rounds,
        s.warmup_secs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    // Adds before lookups, so that half the lookups ask for items that were added.
    let mut plan = Vec::new();
    // `CRPF_BENCH_BATCH=0`: no batch cases.
    let batches: &[bool] = if s.batch == 0 {
        &[false]
    } else {
        &[false, true]
    };
    for &batch in batches {
        for op in [Op::Add, Op::Contains] {
            for filter in [Filter::Bloom, Filter::Cuckoo] {
                let (size, inflights) = if batch {
                    (s.batch, &s.batch_inflight)
                } else {
                    (1, &s.inflight)
                };
                for &k in inflights {
                    let case = if batch {
                        format!("{} {} ×{size}", filter.name(), op.name(true))
                    } else {
                        format!("{} {}", filter.name(), op.name(false))
                    };
                    if s.wants(&case) {
                        plan.push((case, filter, op, size, batch, k));
                    }
                }
            }
        }
    }

    let mut rows = Vec::new();
    for (case, filter, op, size, batch, k) in plan {
        let mut row = Row {
            case: case.clone(),
            inflight: k,
            crpf: None,
            redis: None,
            floor: None,
            resp: None,
        };
        let turn_secs = s.secs / s.rounds as f64;
        let mut samples: Vec<Option<Sample>> = systems.iter().map(|_| None).collect();
        for round in 0..s.rounds {
            let warmup = if round == 0 {
                s.warmup_secs
            } else {
                s.warmup_secs.min(0.1)
            };
            for (sys, sample) in systems.iter().zip(&mut samples) {
                if batch && sys.name != "redis" && !crpf_batches {
                    continue;
                }
                let turn = run_turn(sys, filter, op, size, k, (warmup, turn_secs)).await;
                match sample {
                    Some(sample) => sample.absorb(turn),
                    None => *sample = Some(turn),
                }
            }
        }
        for (sys, sample) in systems.iter().zip(samples) {
            let Some(mut sample) = sample else { continue };
            sample.finish();
            eprintln!(
                "{case:>18} in flight {k:>2} {:>5}: {:>9.0} items/s, p50 {:>6.0} µs, p99 {:>6.0} \
                 µs, server CPU {:.2} µs/item, errors {}",
                sys.name,
                sample.items_per_sec(),
                sample.p50_us,
                sample.p99_us,
                sample.cpu_us_per_item(),
                sample.errors
            );
            if let Some(e) = &sample.first_error {
                eprintln!("    first error: {e}");
            }
            match sys.name {
                "crpf" => row.crpf = Some(sample),
                "floor" => row.floor = Some(sample),
                "resp" => row.resp = Some(sample),
                _ => row.redis = Some(sample),
            }
        }
        rows.push(row);
    }
    for p in &mut procs {
        p.check_running()?;
    }

    println!("{}", report(&rows));
    for sys in &systems {
        match &sys.target {
            // The floor has no filters to describe.
            Target::Crpf {
                prefix: "floor", ..
            } => {}
            Target::Crpf { client, .. } => {
                for f in ["bloom", "cuckoo"] {
                    println!("crpf {f}: {}", crpf_cardinality(client, f).await);
                }
            }
            // The node's figures are on its NATS side.
            Target::Redis { prefix, .. } if !prefix.is_empty() => {}
            Target::Redis { conn, .. } => {
                println!("RedisBloom bloom: {}", redis_info(conn, "BF.INFO").await);
                println!("RedisBloom cuckoo: {}", redis_info(conn, "CF.INFO").await);
            }
        }
    }
    println!(
        "\nload average at start {load_start}, at end {}; run took {:.0} s",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
