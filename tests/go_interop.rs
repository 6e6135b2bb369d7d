//! Filters travel between crpf's `go_bloom` kind and Go's `bits-and-blooms/bloom` (3.3.1, from
//! Debian's packages): `tests/go/bloomtool.go`, built here with the real library, writes
//! filters crpf must read exactly, and reads the filters crpf writes.
//!
//! Go comes from `CRPF_GO` (a `go` command set up as `scripts/install-go.sh` sets up
//! `.tools/go/bin/go`: GOPATH mode with the packaged library), else `.tools/go/bin/go`, which
//! `scripts/test.sh` installs. Without either the tests say so and pass without checking
//! anything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crpf::{GoBloom, GoBloomParams, Lattice, Membership};

/// The built `bloomtool`, or `None` (said once) where there is no Go.
fn bloomtool() -> Option<&'static Path> {
    static TOOL: OnceLock<Option<PathBuf>> = OnceLock::new();
    TOOL.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let go = match std::env::var_os("CRPF_GO") {
            Some(go) => PathBuf::from(go),
            None => root.join(".tools/go/bin/go"),
        };
        if !go.exists() {
            eprintln!(
                "SKIPPED: no Go at {go:?}: run scripts/install-go.sh (or scripts/test.sh), or \
                 set CRPF_GO, to check crpf against Go's bits-and-blooms/bloom"
            );
            return None;
        }
        let out = root.join("target/tmp/go-interop");
        std::fs::create_dir_all(&out).unwrap();
        let bin = out.join("bloomtool");
        let built = Command::new(&go)
            .arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(root.join("tests/go/bloomtool.go"))
            .output()
            .expect("go runs");
        assert!(
            built.status.success(),
            "building tests/go/bloomtool.go with {go:?} failed: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        Some(bin)
    })
    .as_deref()
}

/// Runs `bloomtool` with `args`: its standard output.
pub fn go(args: &[&str]) -> String {
    let out = Command::new(bloomtool().expect("checked by the caller"))
        .args(args)
        .output()
        .expect("bloomtool runs");
    assert!(
        out.status.success(),
        "bloomtool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh scratch directory under target/tmp.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp/go-interop")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn item(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}{i}").into_bytes()
}

/// Go's `Test` of `prefix<i>` for `i` in `from..to`, from a filter file.
fn go_test(file: &Path, prefix: &str, from: u64, to: u64) -> Vec<bool> {
    let out = go(&[
        "test",
        file.to_str().unwrap(),
        prefix,
        &from.to_string(),
        &to.to_string(),
    ]);
    let bits: Vec<bool> = out.trim_end().bytes().map(|b| b == b'1').collect();
    assert_eq!(bits.len() as u64, to - from);
    bits
}

/// Go's filter (10,000 items at 1%) in both of its forms loads in crpf with the same `m`, `k`
/// and bits: every Go item is contained, and crpf answers as Go's `Test` on 100,000 others
/// (about 1% of them false positives, the same ones). Then crpf adds its own items and
/// writes the filter back in both forms: Go reads it, and `Test` is true for every item of
/// either side and agrees with crpf on the others.
#[test]
fn filters_round_trip_between_go_and_crpf_in_both_forms() {
    if bloomtool().is_none() {
        return;
    }
    let dir = scratch("round-trip");
    let go_file = dir.join("go.bin");
    go(&[
        "make",
        "10000",
        "0.01",
        "go-",
        "0",
        "10000",
        go_file.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&go_file).unwrap();
    assert_eq!(bytes.len(), 12_008, "NewWithEstimates(10000, 0.01)");
    let from_bytes = GoBloom::from_go_bytes(&bytes).unwrap();
    let json = std::fs::read(dir.join("go.bin.json")).unwrap();
    let from_json = GoBloom::from_go_json(&json).unwrap();
    assert_eq!(from_bytes, from_json);
    assert_eq!(
        *from_bytes.params(),
        GoBloomParams::estimate(10_000, 0.01).unwrap()
    );
    assert!((0..10_000).all(|i| from_bytes.contains(&item("go-", i))));
    let go_says = go_test(&go_file, "other-", 0, 100_000);
    let crpf_says: Vec<bool> = (0..100_000)
        .map(|i| from_bytes.contains(&item("other-", i)))
        .collect();
    assert_eq!(crpf_says, go_says);
    let false_positives = go_says.iter().filter(|&&b| b).count();
    assert!((500..1_500).contains(&false_positives), "{false_positives}");

    let mut f = from_bytes;
    for i in 0..5_000 {
        f.add(&item("crpf-", i)).unwrap();
    }
    let back = dir.join("crpf.bin");
    std::fs::write(&back, f.to_go_bytes()).unwrap();
    let back_json = dir.join("crpf.json");
    std::fs::write(&back_json, f.to_go_json()).unwrap();
    for file in [&back, &back_json] {
        assert!(go_test(file, "crpf-", 0, 5_000).iter().all(|&b| b));
        assert!(go_test(file, "go-", 0, 10_000).iter().all(|&b| b));
        let go_says = go_test(file, "other-", 0, 20_000);
        let crpf_says: Vec<bool> = (0..20_000)
            .map(|i| f.contains(&item("other-", i)))
            .collect();
        assert_eq!(crpf_says, go_says, "{file:?}");
    }
    // And a merge of two Go filters is their union, as Go's Merge makes it.
    let other = dir.join("other.bin");
    go(&[
        "make",
        "10000",
        "0.01",
        "more-",
        "0",
        "3000",
        other.to_str().unwrap(),
    ]);
    let mut union = GoBloom::from_go_bytes(&std::fs::read(&go_file).unwrap()).unwrap();
    let more = GoBloom::from_go_bytes(&std::fs::read(&other).unwrap()).unwrap();
    union.merge_import(&more).unwrap();
    assert!(more.le(&union));
    assert!((0..3_000).all(|i| union.contains(&item("more-", i))));
}

// ---------------------------------------------------------------- through nodes

mod nats_harness;

use std::time::{Duration, Instant};

use crpf::GoFormat;
use crpf::client::{Client, ClientError};
use crpf::replica::AckLevel;
use nats_harness::{NatsServer, Proc, cluster_key_line, crpf, free_port};
use redis::aio::MultiplexedConnection;

/// A node over `nats` serving RESP; its filters are made by imports (the catalog).
fn start_node(dir: &Path, name: &str, nats: &str) -> (Proc, String) {
    let resp = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\n{}\n[nats]\nservers = [\"{nats}\"]\n\
         \n[resp]\nlisten = \"{resp}\"\n",
        free_port(),
        cluster_key_line()
    );
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, toml).unwrap();
    let mut proc = Proc::spawn(
        name,
        crpf(&["node", "--config", cfg.to_str().unwrap()]),
        dir.join(format!("{name}.log")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(&resp).is_err() {
        proc.assert_running();
        assert!(Instant::now() < deadline, "{name}: no RESP within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    (proc, resp)
}

async fn connect(resp: &str) -> MultiplexedConnection {
    nats_harness::resp_connection(&format!("redis://{resp}/"))
        .await
        .unwrap()
}

async fn call(con: &mut MultiplexedConnection, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(con).await
}

async fn import(
    con: &mut MultiplexedConnection,
    key: &str,
    format: GoFormat,
    data: &[u8],
) -> redis::RedisResult<redis::Value> {
    call(
        con,
        &[
            b"CRPF.IMPORT",
            key.as_bytes(),
            format.name().as_bytes(),
            data,
        ],
    )
    .await
}

async fn export(con: &mut MultiplexedConnection, key: &str, format: GoFormat) -> Vec<u8> {
    match call(
        con,
        &[b"CRPF.EXPORT", key.as_bytes(), format.name().as_bytes()],
    )
    .await
    {
        Ok(redis::Value::BulkString(b)) => b,
        other => panic!("CRPF.EXPORT {key}: {other:?}"),
    }
}

/// `BF.MEXISTS` of `prefix<i>` for `i` in `from..to`, 10,000 a command.
async fn mexists(
    con: &mut MultiplexedConnection,
    key: &str,
    prefix: &str,
    from: u64,
    to: u64,
) -> Vec<bool> {
    let mut found = Vec::new();
    let mut at = from;
    while at < to {
        let end = (at + 10_000).min(to);
        let items: Vec<Vec<u8>> = (at..end).map(|i| item(prefix, i)).collect();
        let mut args: Vec<&[u8]> = vec![b"BF.MEXISTS", key.as_bytes()];
        args.extend(items.iter().map(Vec::as_slice));
        let got: Vec<i64> = redis::from_redis_value(call(con, &args).await.unwrap()).unwrap();
        found.extend(got.into_iter().map(|b| b == 1));
        at = end;
    }
    found
}

/// Two Go services' filters, imported on two nodes (over RESP on one, the NATS request API on
/// the other), converge to their union on both; crpf answers as Go's `Test` does on 100,000
/// other items; crpf's own adds (`BF.ADD`) export over RESP and NATS, in both formats, to
/// bytes Go reads with every item in; an import of another `m`/`k` is refused naming both,
/// and a damaged one loads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_filters_merge_across_nodes_and_travel_over_resp_and_nats() {
    if bloomtool().is_none() {
        return;
    }
    let dir = scratch("nodes");
    let (one, two, three) = (
        dir.join("one.bin"),
        dir.join("two.bin"),
        dir.join("three.bin"),
    );
    for (file, prefix) in [(&one, "one-"), (&two, "two-"), (&three, "three-")] {
        go(&[
            "make",
            "10000",
            "0.01",
            prefix,
            "0",
            "4000",
            file.to_str().unwrap(),
        ]);
    }
    let (one_bytes, two_json, three_bytes) = (
        std::fs::read(&one).unwrap(),
        std::fs::read(dir.join("two.bin.json")).unwrap(),
        std::fs::read(&three).unwrap(),
    );
    let nats = NatsServer::start();
    let (_a, resp_a) = start_node(&dir, "a", &nats.url());
    let (_b, resp_b) = start_node(&dir, "b", &nats.url());
    let mut on_a = connect(&resp_a).await;
    let ok = import(&mut on_a, "shared", GoFormat::Binary, &one_bytes)
        .await
        .unwrap();
    assert_eq!(ok, redis::Value::Okay);
    // The second service's filter (its JSON) into node b, once b hosts the filter the
    // import on a created (before, b would create it itself: the same spec, also fine).
    let mut on_b_resp = connect(&resp_b).await;
    let ok = import(&mut on_b_resp, "shared", GoFormat::Json, &two_json)
        .await
        .unwrap();
    assert_eq!(ok, redis::Value::Okay);
    // A third through the NATS request API (whichever node answers).
    let nc = async_nats::connect(nats.url()).await.unwrap();
    let on_b = Client::new(nc, "crpf", "shared").with_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = on_b.import(GoFormat::Binary, three_bytes.clone()).await {
        assert!(
            Instant::now() < deadline,
            "no node took the import over NATS: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both converge to the union of the two Go filters: Go's Merge, bit for bit.
    let mut union = GoBloom::from_go_bytes(&one_bytes).unwrap();
    union
        .merge_import(&GoBloom::from_go_json(&two_json).unwrap())
        .unwrap();
    union
        .merge_import(&GoBloom::from_go_bytes(&three_bytes).unwrap())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a_has = export(&mut on_a, "shared", GoFormat::Binary).await;
        let b_has = export(&mut on_b_resp, "shared", GoFormat::Binary).await;
        if a_has == union.to_go_bytes() && b_has == a_has {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not converge to the union in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        mexists(&mut on_a, "shared", "one-", 0, 4000)
            .await
            .iter()
            .all(|&b| b)
    );
    assert!(
        mexists(&mut on_a, "shared", "two-", 0, 4000)
            .await
            .iter()
            .all(|&b| b)
    );
    assert!(
        mexists(&mut on_b_resp, "shared", "three-", 0, 4000)
            .await
            .iter()
            .all(|&b| b)
    );
    let union_file = dir.join("union.bin");
    std::fs::write(&union_file, union.to_go_bytes()).unwrap();
    assert_eq!(
        mexists(&mut on_a, "shared", "other-", 0, 100_000).await,
        go_test(&union_file, "other-", 0, 100_000)
    );

    // crpf's adds go out to Go, over RESP and over NATS, in both formats.
    for i in 0..500 {
        let added = call(&mut on_a, &[b"BF.ADD", b"shared", &item("crpf-", i)]).await;
        assert!(added.is_ok(), "{added:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let from_b = loop {
        let json = export(&mut on_b_resp, "shared", GoFormat::Json).await;
        let f = GoBloom::from_go_json(&json).unwrap();
        if (0..500).all(|i| f.contains(&item("crpf-", i))) {
            break json;
        }
        assert!(Instant::now() < deadline, "b did not get a's adds in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let from_a = export(&mut on_a, "shared", GoFormat::Binary).await;
    let over_nats = on_b.export(GoFormat::Binary).await.unwrap();
    assert_eq!(
        over_nats, from_a,
        "converged: the same bytes whichever node answers"
    );
    for (name, bytes) in [("from-b.json", from_b), ("from-a.bin", from_a)] {
        let file = dir.join(name);
        std::fs::write(&file, bytes).unwrap();
        for prefix in ["crpf-", "one-", "two-", "three-"] {
            assert!(
                go_test(&file, prefix, 0, 500).iter().all(|&b| b),
                "{name} {prefix}"
            );
        }
    }

    // Another m and k: refused, naming both, over RESP and NATS; the filter is unchanged.
    let small = dir.join("small.bin");
    go(&[
        "make",
        "1000",
        "0.001",
        "x-",
        "0",
        "10",
        small.to_str().unwrap(),
    ]);
    let small_bytes = std::fs::read(&small).unwrap();
    let before = export(&mut on_a, "shared", GoFormat::Binary).await;
    let refused = import(&mut on_a, "shared", GoFormat::Binary, &small_bytes)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("m = 14378, k = 10") && refused.contains("m = 95851, k = 7"),
        "{refused}"
    );
    let refused = on_b
        .import(GoFormat::Binary, small_bytes.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("m = 14378, k = 10") && refused.contains("m = 95851, k = 7"),
        "{refused}"
    );
    // Damaged: truncated, or a bit set of another length.
    let mut damaged = one_bytes.clone();
    damaged[23] ^= 1;
    for bad in [&one_bytes[..one_bytes.len() - 1], &damaged[..]] {
        assert!(
            import(&mut on_a, "shared", GoFormat::Binary, bad)
                .await
                .is_err()
        );
        assert!(
            import(&mut on_a, "fresh", GoFormat::Binary, bad)
                .await
                .is_err()
        );
    }
    assert_eq!(export(&mut on_a, "shared", GoFormat::Binary).await, before);
    let exists: i64 =
        redis::from_redis_value(call(&mut on_a, &[b"EXISTS", b"fresh"]).await.unwrap()).unwrap();
    assert_eq!(exists, 0, "a damaged import created no key");
}

/// A configured `go_bloom` filter with a data directory: a Go filter imported and items added
/// over RESP survive a stop in its snapshot, and `crpf inspect --export` writes them (both
/// formats) for Go, whose `Test` finds every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_exports_a_snapshot_for_go() {
    if bloomtool().is_none() {
        return;
    }
    let dir = scratch("inspect");
    let go_file = dir.join("go.bin");
    go(&[
        "make",
        "10000",
        "0.01",
        "go-",
        "0",
        "2000",
        go_file.to_str().unwrap(),
    ]);
    let data = dir.join("data");
    let resp = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\ndata_dir = \"{}\"\n\
         \n[resp]\nlisten = \"{resp}\"\n\n[[filters]]\nname = \"users\"\n\
         filter = {{ kind = \"go_bloom\", capacity = 10000, fpr = 0.01 }}\n",
        free_port(),
        data.display()
    );
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, toml).unwrap();
    let mut node = Proc::spawn(
        "node",
        crpf(&["node", "--config", cfg.to_str().unwrap()]),
        dir.join("node.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut con = loop {
        node.assert_running();
        if std::net::TcpStream::connect(&resp).is_ok() {
            let mut con = connect(&resp).await;
            if call(&mut con, &[b"CRPF.STATS", b"users"]).await.is_ok() {
                break con;
            }
        }
        assert!(Instant::now() < deadline, "users not served within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let go_bytes = std::fs::read(&go_file).unwrap();
    let ok = import(&mut con, "users", GoFormat::Binary, &go_bytes)
        .await
        .unwrap();
    assert_eq!(ok, redis::Value::Okay);
    for i in 0..300 {
        call(&mut con, &[b"BF.ADD", b"users", &item("crpf-", i)])
            .await
            .unwrap();
    }
    for (present, want) in [
        (item("go-", 7), 1),
        (item("crpf-", 7), 1),
        (item("none-", 7), 0),
    ] {
        let found: i64 = redis::from_redis_value(
            call(&mut con, &[b"BF.EXISTS", b"users", &present])
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(found, want);
    }
    let served = export(&mut con, "users", GoFormat::Binary).await;
    drop(con);
    node.terminate(Duration::from_secs(30));
    for (format, name) in [(GoFormat::Binary, "out.bin"), (GoFormat::Json, "out.json")] {
        let out_file = dir.join(name);
        let out = crpf(&[
            "inspect",
            data.join("users").to_str().unwrap(),
            "--export",
            format.name(),
            "--out",
            out_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let written = std::fs::read(&out_file).unwrap();
        assert_eq!(format.decode(&written).unwrap().to_go_bytes(), served);
        assert!(go_test(&out_file, "go-", 0, 2000).iter().all(|&b| b));
        assert!(go_test(&out_file, "crpf-", 0, 300).iter().all(|&b| b));
    }
}

/// An import over the NATS request API, at the replica's default level (`durable`, with a
/// data directory), is on disk when it is answered: a merge reaches disk only with a
/// snapshot (the log holds the replica's own updates), so the answer waits for one. The node
/// is killed (`kill -9`) right after the answer, long before its periodic snapshot (an hour);
/// its next life finds every imported item. Go is not needed: the filter is written as Go's
/// `WriteTo` writes it (`GoBloom::to_go_bytes`, pinned against the library by the golden
/// vectors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_over_nats_is_durable_when_answered() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\ndata_dir = \"{}\"\n{}\n\
             [nats]\nservers = [\"{}\"]\n\n[[filters]]\nname = \"imported\"\n\
             filter = {{ kind = \"go_bloom\", capacity = 10000, fpr = 0.01 }}\n\
             snapshot_interval_ms = 3600000\n",
            free_port(),
            dir.path().join("data").display(),
            cluster_key_line(),
            nats.url()
        ),
    )
    .unwrap();
    let go = go_filter(10_000, "go-", 2000);
    let client = Client::new(
        async_nats::connect(nats.url()).await.unwrap(),
        "crpf",
        "imported",
    )
    .with_timeout(Duration::from_secs(5));
    let mut node = Proc::spawn(
        "first",
        crpf(&["node", "--config", config.to_str().unwrap()]),
        dir.path().join("first.log"),
    );
    serving(&client, &mut node).await;
    let items: Vec<Vec<u8>> = (0..2000).map(|i| item("go-", i)).collect();
    client
        .import(GoFormat::Binary, go.to_go_bytes())
        .await
        .unwrap();
    node.kill9();

    let mut node = Proc::spawn(
        "second",
        crpf(&["node", "--config", config.to_str().unwrap()]),
        dir.path().join("second.log"),
    );
    serving(&client, &mut node).await;
    let found = client.mcontains(&items).await.unwrap();
    let lost = found.iter().filter(|&&f| !f).count();
    assert_eq!(lost, 0, "imported items lost at the crash after the answer");
    node.terminate(Duration::from_secs(30));
}

/// Issue 51's follow-up: an import at `replicated` travels as a delta its peers confirm, as
/// an add's does. Three nodes, each filter asking both peers (`replicated_peers = 2`) and
/// anti-entropy once in ten minutes, so that only the import's own delta can bring it to the
/// peers in the test's time: once the import is answered, each of the three replicas, asked
/// alone, holds every imported item. An import whose delta is over the size one message
/// carries is refused, nothing merged; and with a peer killed, an import at `replicated` is
/// answered `not confirmed by enough peers`, not as replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_at_replicated_is_on_the_peers_when_answered() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    let resp = format!("127.0.0.1:{}", free_port());
    let mut nodes: Vec<Proc> = (0..3)
        .map(|i| {
            // Node 0 serves RESP too, for `CRPF.IMPORT` after `CRPF.ACK replicated`.
            let resp_section = match i {
                0 => format!("\n[resp]\nlisten = \"{resp}\"\n"),
                _ => String::new(),
            };
            let config = dir.path().join(format!("node{i}.toml"));
            std::fs::write(
                &config,
                format!(
                    "[node]\nmetrics_addr = \"127.0.0.1:{}\"\nlog = \"warn\"\ndata_dir = \"{}\"\n{}\n\
                     [nats]\nservers = [\"{}\"]\n\n\
                     [[filters]]\nname = \"imported\"\n\
                     filter = {{ kind = \"go_bloom\", capacity = 10000, fpr = 0.01 }}\n\
                     replicated_peers = 2\nreplicated_timeout_ms = 3000\n\
                     anti_entropy_interval_ms = 600000\npeer_expiry_ms = 1800000\n\n\
                     [[filters]]\nname = \"big\"\n\
                     filter = {{ kind = \"go_bloom\", capacity = 400000, fpr = 0.01 }}\n{}",
                    free_port(),
                    dir.path().join(format!("data{i}")).display(),
                    cluster_key_line(),
                    nats.url(),
                    resp_section
                ),
            )
            .unwrap();
            Proc::spawn(
                &format!("node{i}"),
                crpf(&["node", "--config", config.to_str().unwrap()]),
                dir.path().join(format!("node{i}.log")),
            )
        })
        .collect();
    let nc = async_nats::connect(nats.url()).await.unwrap();
    let client = Client::new(nc.clone(), "crpf", "imported").with_timeout(Duration::from_secs(30));
    // The three replicas, each ready (the queue group spreads `stats` over the ready ones).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut ids = std::collections::BTreeSet::new();
    while ids.len() < 3 {
        for n in nodes.iter_mut() {
            n.assert_running();
        }
        assert!(
            Instant::now() < deadline,
            "only replicas {ids:?} ready in 120 s"
        );
        if let Ok(s) = client.stats().await
            && s.ready
        {
            ids.insert(s.replica);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let go = go_filter(10_000, "rep-", 2000);
    client
        .import_at(
            GoFormat::Binary,
            go.to_go_bytes(),
            Some(AckLevel::Replicated),
        )
        .await
        .unwrap();
    let items: Vec<Vec<u8>> = (0..2000).map(|i| item("rep-", i)).collect();
    assert_eq!(
        held_by(&client, &ids, &items).await,
        vec![2000; 3],
        "an import answered at replicated is on every replica it waited for"
    );

    // The same over RESP, at the connection's level.
    let mut con = connect(&resp).await;
    call(&mut con, &[b"CRPF.ACK", b"replicated"]).await.unwrap();
    let by_resp = go_filter(10_000, "resp-", 2000);
    let answer = import(
        &mut con,
        "imported",
        GoFormat::Binary,
        &by_resp.to_go_bytes(),
    )
    .await;
    assert_eq!(answer, Ok(redis::Value::Okay));
    let items: Vec<Vec<u8>> = (0..2000).map(|i| item("resp-", i)).collect();
    assert_eq!(
        held_by(&client, &ids, &items).await,
        vec![2000; 3],
        "a RESP import answered at replicated is on every replica it waited for"
    );

    // Over half a message of delta (~1.2 MB of new bits against 523,776 bytes): refused
    // whole, with the sizes, on whichever replica took it.
    let big_client = Client::new(nc.clone(), "crpf", "big").with_timeout(Duration::from_secs(30));
    let big = go_filter(400_000, "big-", 200_000);
    let message = refused_at_replicated(&big_client, &big, "a too large import").await;
    assert!(
        message.contains("travels as one acknowledged delta"),
        "{message}"
    );
    let sample: Vec<Vec<u8>> = (0..2000).map(|i| item("big-", i)).collect();
    let found = big_client.mcontains(&sample).await.unwrap();
    assert!(
        found.iter().filter(|&&f| f).count() < 100,
        "a refused import merged"
    );

    // A peer down: both peers are asked for, one cannot confirm.
    nodes[2].kill9();
    let down = go_filter(10_000, "down-", 2000);
    let message = refused_at_replicated(&client, &down, "an import with a peer down").await;
    assert!(
        message.contains("not yet confirmed by enough peers"),
        "{message}"
    );
    let answer = import(&mut con, "imported", GoFormat::Binary, &down.to_go_bytes()).await;
    let refused = answer.expect_err("a RESP import with a peer down answered OK");
    assert!(
        refused
            .to_string()
            .contains("not yet confirmed by enough peers"),
        "{refused}"
    );
    for mut n in nodes.into_iter().take(2) {
        n.terminate(Duration::from_secs(30));
    }
}

/// How many of `items` each replica of `ids`, asked alone, holds.
/// A `bits-and-blooms` filter sized for `capacity` at 1% holding `item(prefix, 0..n)`.
fn go_filter(capacity: u64, prefix: &str, n: u64) -> GoBloom {
    let mut go = GoBloom::new(GoBloomParams::estimate(capacity, 0.01).unwrap()).unwrap();
    for i in 0..n {
        go.add(&item(prefix, i)).unwrap();
    }
    go
}

/// The server's message refusing `go` imported at `replicated` (`what` names the case if it
/// was answered otherwise).
async fn refused_at_replicated(client: &Client, go: &GoBloom, what: &str) -> String {
    let answer = client
        .import_at(
            GoFormat::Binary,
            go.to_go_bytes(),
            Some(AckLevel::Replicated),
        )
        .await;
    match answer {
        Err(ClientError::Server { message, .. }) => message,
        other => panic!("{what} at replicated answered {other:?}"),
    }
}

async fn held_by(
    client: &Client,
    ids: &std::collections::BTreeSet<crpf::ReplicaId>,
    items: &[Vec<u8>],
) -> Vec<usize> {
    let mut held = Vec::new();
    for &id in ids {
        let found = client.replica(id).mcontains(items).await.unwrap();
        held.push(found.iter().filter(|&&f| f).count());
    }
    held
}

/// Waits until `node` answers requests to `client`'s filter.
async fn serving(client: &Client, node: &mut Proc) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.stats().await.is_err() {
        node.assert_running();
        assert!(
            Instant::now() < deadline,
            "{}: not serving in 60 s",
            node.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
