//! The RESP front end (`[resp]`, `crpf::resp`) of real `crpf node` processes, driven by the
//! `redis` crate and by raw sockets: RedisBloom's commands round trip on each kind, pipelined
//! replies come back in order, bad commands get errors, malformed framing closes only its own
//! connection and poisons nothing, `AUTH`, adds acknowledged at `durable` survive `kill -9`,
//! and adds over RESP replicate over a real NATS server to a node that serves them over RESP.

mod nats_harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nats_harness::{NatsServer, Proc, cluster_key_line, crpf, free_port, http_get};
use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Value};

/// A node and where it serves.
struct Node {
    proc: Proc,
    resp: String,
    metrics: String,
}

/// Writes a node config and starts `crpf node` on it. `extra` goes into `[resp]`; `nats`
/// adds a `[nats]` section; `data_dir` a `[node] data_dir`.
fn start_node(
    dir: &Path,
    name: &str,
    extra: &str,
    nats: Option<&str>,
    data_dir: Option<&Path>,
) -> Node {
    let resp = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut toml = format!("[node]\nmetrics_addr = \"{metrics}\"\nlog = \"warn\"\n");
    if let Some(d) = data_dir {
        toml += &format!("data_dir = \"{}\"\n", d.display());
    }
    if let Some(url) = nats {
        toml += &cluster_key_line();
        toml += &format!("\n[nats]\nservers = [\"{url}\"]\n");
    }
    toml += &format!("\n[resp]\nlisten = \"{resp}\"\n{extra}\n");
    for (filter, kind) in [
        ("bloom", "g_bloom"),
        ("sessions", "or_cuckoo"),
        ("views", "counting_cuckoo"),
    ] {
        toml += &format!(
            "\n[[filters]]\nname = \"{filter}\"\nfilter = {{ kind = \"{kind}\", capacity = 10000, \
             fpr = 0.01 }}\ndelta_interval_ms = 50\nanti_entropy_interval_ms = 500\n\
             catch_up_timeout_ms = 1000\n"
        );
    }
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, toml).unwrap();
    let mut proc = Proc::spawn(
        name,
        crpf(&["node", "--config", cfg.to_str().unwrap()]),
        dir.join(format!("{name}.log")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(&resp).is_err() {
        proc.assert_running();
        assert!(
            Instant::now() < deadline,
            "{name}: RESP not served within 60 s\n{}",
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Node {
        proc,
        resp,
        metrics,
    }
}

/// A connection (`password`: authenticated on connecting), once every filter of the node
/// answers.
async fn connect_with(node: &Node, password: &str) -> MultiplexedConnection {
    let mut con = nats_harness::resp_connection(&format!("redis://:{password}@{}/", node.resp))
        .await
        .unwrap();
    wait_ready(&mut con).await;
    con
}

async fn connect(node: &Node) -> MultiplexedConnection {
    connect_with(node, "").await
}

/// Waits until every filter answers (until it is ready: `LOADING`).
async fn wait_ready(con: &mut MultiplexedConnection) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for filter in ["bloom", "sessions", "views"] {
        loop {
            match run::<String>(con, &["CRPF.STATS", filter]).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(e.to_string().contains("BusyLoading"), "{filter}: {e}");
                    assert!(Instant::now() < deadline, "{filter} not ready in 60 s: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn run<T: redis::FromRedisValue>(
    con: &mut MultiplexedConnection,
    args: &[&str],
) -> RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(con).await
}

/// Runs a command that must answer the integer `want`.
async fn expect(con: &mut MultiplexedConnection, args: &[&str], want: i64) {
    let got: i64 = run(con, args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(got, want, "{args:?}");
}

/// The error text of a command that must fail.
async fn refused(con: &mut MultiplexedConnection, args: &[&str]) -> String {
    match run::<Value>(con, args).await {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{args:?} answered {v:?}, expected an error"),
    }
}

/// Sends raw bytes on a fresh connection and reads until the node closes it.
fn raw_exchange(node: &Node, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(&node.resp).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The node may answer and close before it has read all of a large request.
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of a metric sample whose line starts with `prefix` (0 if there is none yet).
fn metric(node: &Node, prefix: &str) -> f64 {
    let (code, body) = http_get(&node.metrics, "/metrics").unwrap();
    assert_eq!(code, 200);
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisbloom_commands_round_trip_on_every_kind() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    let mut con = connect(&node).await;

    assert_eq!(run::<String>(&mut con, &["PING"]).await.unwrap(), "PONG");
    // g_bloom
    expect(&mut con, &["BF.ADD", "bloom", "a"], 1).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "a"], 1).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "never"], 0).await;
    let added: Vec<i64> = run(&mut con, &["BF.MADD", "bloom", "x", "y", "z"])
        .await
        .unwrap();
    assert_eq!(added, [1, 1, 1]);
    let found: Vec<i64> = run(&mut con, &["BF.MEXISTS", "bloom", "x", "never", "z"])
        .await
        .unwrap();
    assert_eq!(found, [1, 0, 1]);
    let inserted: Vec<i64> = run(
        &mut con,
        &["BF.INSERT", "bloom", "CAPACITY", "5", "ITEMS", "w"],
    )
    .await
    .unwrap();
    assert_eq!(inserted, [1]);
    // or_cuckoo: removes
    let inserted: Vec<i64> = run(
        &mut con,
        &[
            "CF.INSERT",
            "sessions",
            "NOCREATE",
            "ITEMS",
            "s1",
            "s2",
            "s3",
        ],
    )
    .await
    .unwrap();
    assert_eq!(inserted, [1, 1, 1]);
    expect(&mut con, &["CF.EXISTS", "sessions", "s1"], 1).await;
    expect(&mut con, &["CF.DEL", "sessions", "s1"], 1).await;
    expect(&mut con, &["CF.EXISTS", "sessions", "s1"], 0).await;
    expect(&mut con, &["CF.DEL", "sessions", "s1"], 0).await;
    let removed: Vec<i64> = run(&mut con, &["CRPF.MDEL", "sessions", "s2", "never"])
        .await
        .unwrap();
    assert_eq!(removed, [1, 0]);
    let found: Vec<i64> = run(&mut con, &["CF.MEXISTS", "sessions", "s1", "s2", "s3"])
        .await
        .unwrap();
    assert_eq!(found, [0, 0, 1]);
    // counting_cuckoo: multiplicities
    for _ in 0..3 {
        expect(&mut con, &["CF.ADD", "views", "page"], 1).await;
    }
    expect(&mut con, &["CF.COUNT", "views", "page"], 3).await;
    expect(&mut con, &["CF.COUNT", "views", "other"], 0).await;
    // Queries of a key that does not exist answer "not there", as RedisBloom's do.
    expect(&mut con, &["BF.EXISTS", "nope", "a"], 0).await;
    expect(&mut con, &["CF.EXISTS", "nope", "a"], 0).await;
    expect(&mut con, &["CF.COUNT", "nope", "a"], 0).await;
    let none: Vec<i64> = run(&mut con, &["BF.MEXISTS", "nope", "a", "b"])
        .await
        .unwrap();
    assert_eq!(none, [0, 0]);
    // stats
    let stats: String = run(&mut con, &["CRPF.STATS", "bloom"]).await.unwrap();
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["filter"], "bloom", "{stats}");
    assert!(stats["cardinality"].as_f64().unwrap() >= 5.0, "{stats}");

    // Refused: by the front end, and by the replica (the same errors as over NATS).
    for (args, expected) in [
        (&["CRPF.MDEL", "nope", "a"][..], "no filter named `nope`"),
        // RedisBloom's families: BF on a cuckoo key, CF on a Bloom key.
        (
            &["BF.ADD", "sessions", "a"],
            "Operation against a key holding the wrong kind",
        ),
        (
            &["CF.ADD", "bloom", "a"],
            "Operation against a key holding the wrong kind",
        ),
        (
            &["BF.ADD", "bloom"],
            "wrong number of arguments for 'bf.add'",
        ),
        (
            &["BF.EXISTS", "bloom", "a", "b"],
            "wrong number of arguments",
        ),
        (
            &["CF.INSERT", "sessions", "CAPACITY", "9"],
            "wrong number of arguments",
        ),
        // Configured filters stay (the catalog's would go).
        (&["FLUSHALL"], "declared in this node's configuration"),
        // A configured filter's key exists already.
        (&["BF.RESERVE", "bloom", "0.01", "100"], "item exists"),
        // RedisBloom reads a key of the other family as missing here.
        (&["CF.DEL", "bloom", "a"], "found"),
        (&["BF.ADD", "bloom", ""], "empty item"),
        (&["CRPF.ACK", "eventually"], "eventually"),
        (&["CRPF.ACK", "durable"], "OK"),
    ] {
        if expected == "OK" {
            assert_eq!(run::<String>(&mut con, args).await.unwrap(), "OK");
            continue;
        }
        let e = refused(&mut con, args).await;
        assert!(e.contains(expected), "{args:?}: {e}");
    }
    // `durable` needs a data_dir, which this node has not: the update is refused.
    let e = refused(&mut con, &["BF.ADD", "bloom", "b"]).await;
    assert!(e.contains("durable"), "{e}");
    assert_eq!(
        run::<String>(&mut con, &["CRPF.ACK", "local"])
            .await
            .unwrap(),
        "OK"
    );

    // A pipeline of mixed commands: every reply, in order.
    let mut pipe = redis::pipe();
    for i in 0..2000 {
        let item = format!("p{i}");
        if i % 2 == 0 {
            pipe.cmd("BF.ADD").arg("bloom").arg(&item);
        } else {
            pipe.cmd("BF.EXISTS")
                .arg("bloom")
                .arg(format!("p{}", i - 1));
        }
    }
    let replies: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
    assert_eq!(replies, vec![1; 2000]);
    // Commands run in order even where an add goes through the actor (always, for a tagged
    // kind) and the query after it would be answered at once; and a command to another
    // filter waits for that add rather than overtaking it.
    let mut pipe = redis::pipe();
    for i in 0..500 {
        let item = format!("q{i}");
        pipe.cmd("CF.ADD").arg("sessions").arg(&item);
        pipe.cmd("CF.EXISTS").arg("sessions").arg(&item);
        pipe.cmd("BF.ADD").arg("bloom").arg(&item);
        pipe.cmd("CF.ADD").arg("views").arg(&item);
        pipe.cmd("CF.COUNT").arg("views").arg(&item);
        pipe.cmd("BF.EXISTS").arg("bloom").arg(&item);
    }
    let replies: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
    assert_eq!(replies.len(), 3000);
    for (i, r) in replies.iter().enumerate() {
        // A count may also include another item's occurrences with the same fingerprint.
        let ok = if i % 6 == 4 { *r >= 1 } else { *r == 1 };
        assert!(ok, "reply {i} (command {} of item q{}): {r}", i % 6, i / 6);
    }
    assert!(metric(&node, "crpf_resp_rejected_total{reason=\"unknown_filter\"}") >= 1.0);
    assert!(metric(&node, "crpf_resp_connections ") >= 1.0);
}

/// With the catalog off nothing parks: the declared filters keep series of their own,
/// whatever `declared_metrics` says (with it on, they record in the node-wide series).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_catalog_declared_filters_keep_series_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "[catalog]\nenabled = false", None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&node, "crpf_ready{filter=\"bloom\"") != 1.0 {
        assert!(
            Instant::now() < deadline,
            "no crpf_ready of its own for `bloom`\n{}",
            node.proc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on = start_node(dir.path(), "on", "", None, None);
    let _ = connect(&on).await;
    assert_eq!(metric(&on, "crpf_ready{filter=\"bloom\""), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_framing_closes_its_connection_and_poisons_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "max_request_bytes = 4096", None, None);
    let mut con = connect(&node).await;
    let added: Vec<i64> = run(&mut con, &["BF.MADD", "bloom", "kept1", "kept2"])
        .await
        .unwrap();
    assert_eq!(added, [1, 1]);

    let nested = b"*1\r\n".repeat(1 << 20);
    let too_large = b"*3\r\n$6\r\nBF.ADD\r\n$5\r\nbloom\r\n$100000\r\n".to_vec();
    for (bad, expected) in [
        (&b"*2\r\n$x\r\n"[..], "invalid bulk length"),
        (b"*1\r\n:5\r\n", "expected `$`"),
        (b"*2\r\n$6\r\nBF.ADD\r\n$5\r\nbloomXX", "expected `\\r\\n`"),
        (&nested, "expected `$`"),
        (&too_large, "exceeds the limit of 4096 bytes"),
        (&b"A".repeat(10_000), "exceeds the limit"),
    ] {
        // A command before the bad one is answered; nothing after it is read.
        let mut request = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n".to_vec();
        request.extend_from_slice(bad);
        request.extend_from_slice(b"*3\r\n$6\r\nBF.ADD\r\n$5\r\nbloom\r\n$6\r\nlater!\r\n");
        let answer = raw_exchange(&node, &request);
        assert!(
            answer.starts_with("$2\r\nhi\r\n-ERR Protocol error") && answer.contains(expected),
            "{:?}: {answer:?}",
            String::from_utf8_lossy(&bad[..bad.len().min(40)])
        );
        assert!(
            answer.ends_with("\r\n") && answer.matches("\r\n").count() == 3,
            "{answer:?}"
        );
    }
    // The node runs on; the other connection still works; the filter has what it had, and
    // none of the items after the bad requests.
    let found: Vec<i64> = run(
        &mut con,
        &["BF.MEXISTS", "bloom", "kept1", "kept2", "later!"],
    )
    .await
    .unwrap();
    assert_eq!(found, [1, 1, 0]);
    assert_eq!(
        metric(&node, "crpf_resp_rejected_total{reason=\"protocol\"}"),
        6.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_beyond_the_limits_are_answered_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // Four commands in progress at most, and 4 KiB of requests held.
    let extra = "max_pipeline = 4\nmax_request_bytes = 4096";
    let node = start_node(dir.path(), "node", extra, None, None);
    let _ready = connect(&node).await;
    // 300 commands in one write, then EOF: every one answered, in order, empty commands
    // not at all (as Redis does), before the node closes.
    let mut request = Vec::new();
    let mut expected = String::new();
    for i in 0..100 {
        let echo = format!("e{i}");
        request.extend_from_slice(format!("ECHO {echo}\r\n*0\r\n\r\n").as_bytes());
        expected += &format!("${}\r\n{echo}\r\n", echo.len());
        let add = format!("*3\r\n$6\r\nBF.ADD\r\n$5\r\nbloom\r\n$4\r\np{i:03}\r\n");
        request.extend_from_slice(add.as_bytes());
        expected += ":1\r\n";
        request.extend_from_slice(format!("BF.EXISTS bloom p{i:03}\r\n").as_bytes());
        expected += ":1\r\n";
    }
    let mut s = TcpStream::connect(&node.resp).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&request).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, expected);
    // Requests of 3 KiB each: never more than about 4 KiB held, all answered.
    let mut con = connect(&node).await;
    let big = "x".repeat(3000);
    let mut pipe = redis::pipe();
    for _ in 0..20 {
        pipe.cmd("ECHO").arg(&big);
    }
    let echoed: Vec<String> = pipe.query_async(&mut con).await.unwrap();
    assert_eq!(echoed, vec![big; 20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_is_required_once_set() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret-pass\n").unwrap();
    let extra = format!("password_file = \"{}\"", password.display());
    let node = start_node(dir.path(), "node", &extra, None, None);
    let mut con = nats_harness::resp_connection(&format!("redis://{}/", node.resp))
        .await
        .unwrap();
    assert!(
        refused(&mut con, &["BF.ADD", "bloom", "a"])
            .await
            .contains("NOAUTH")
    );
    // Nothing but logging in is even parsed before AUTH: no pattern matched, no state read.
    for args in [
        &["CONFIG", "GET", "*********************x"][..],
        &["BF.CARD", "bloom"],
        &["KEYS", "*"],
        &["INFO"],
    ] {
        assert!(refused(&mut con, args).await.contains("NOAUTH"), "{args:?}");
    }
    assert!(
        refused(&mut con, &["AUTH", "wrong"])
            .await
            .contains("WRONGPASS")
    );
    // AUTH's own refusals are answered as such before login, not NOAUTH (as Redis does).
    assert!(
        refused(&mut con, &["AUTH", "someone", "s3cret-pass"])
            .await
            .contains("WRONGPASS")
    );
    assert!(
        refused(&mut con, &["AUTH"])
            .await
            .contains("wrong number of arguments for 'auth' command"),
    );
    assert!(
        refused(&mut con, &["AUTH", "a", "b", "c"])
            .await
            .contains("syntax error"),
    );
    assert!(
        refused(&mut con, &["BF.EXISTS", "bloom", "a"])
            .await
            .contains("NOAUTH")
    );
    // Before AUTH, only small requests are read: a larger one is a protocol error (not
    // NOAUTH), and closes the connection.
    let mut args = vec!["BF.MEXISTS", "bloom"];
    args.extend(["x"; 20]);
    let packed = redis::cmd(args[0]).arg(&args[1..]).get_packed_command();
    let answer = raw_exchange(&node, &packed);
    assert_eq!(
        answer, "-ERR Protocol error: 22 arguments exceed the limit of 8\r\n",
        "{answer:?}"
    );
    assert_eq!(
        run::<String>(&mut con, &["AUTH", "s3cret-pass"])
            .await
            .unwrap(),
        "OK"
    );
    wait_ready(&mut con).await;
    expect(&mut con, &["BF.ADD", "bloom", "a"], 1).await;
    assert!(metric(&node, "crpf_resp_rejected_total{reason=\"auth\"}") >= 4.0);
    assert!(metric(&node, "crpf_resp_rejected_total{reason=\"wrong_arity\"}") >= 1.0);
    // The redis URL form authenticates on connecting.
    let mut authed = connect_with(&node, "s3cret-pass").await;
    expect(&mut authed, &["BF.EXISTS", "bloom", "a"], 1).await;
    // HELLO before login: only with AUTH, as redis-py 8 and go-redis send it.
    let packed = |ws: &[&str]| redis::cmd(ws[0]).arg(&ws[1..]).get_packed_command();
    let mut talk = packed(&["HELLO", "3"]);
    talk.extend(packed(&["HELLO", "3", "AUTH", "default", "wrong"]));
    talk.extend(packed(&[
        "HELLO",
        "3",
        "AUTH",
        "default",
        "s3cret-pass",
        "SETNAME",
        "me",
    ]));
    talk.extend(packed(&["BF.EXISTS", "bloom", "a"]));
    talk.extend(packed(&["QUIT"]));
    let answer = raw_exchange(&node, &talk);
    in_order(
        &answer,
        &[
            "-NOAUTH HELLO must be called with the client already authenticated",
            "-WRONGPASS",
            "%8\r\n$6\r\nserver\r\n$5\r\nredis\r\n",
            "$5\r\nproto\r\n:3\r\n",
            "#t\r\n+OK\r\n",
        ],
    );
}

/// `needles` occur in `haystack` in this order.
fn in_order(haystack: &str, needles: &[&str]) {
    let mut at = 0;
    for n in needles {
        match haystack[at..].find(n) {
            Some(i) => at += i + n.len(),
            None => panic!("{n:?} not found after byte {at} of {haystack:?}"),
        }
    }
}

/// Issue 24, points 1 and 2: RESP3 after `HELLO 3` (booleans where RedisBloom sends them),
/// and `MULTI`/`EXEC` as redis-py's default pipeline sends them: the queued commands run at
/// `EXEC`, their replies in one array; a refused RedisBloom command answers its error in that
/// array, any other refused command aborts the transaction before anything runs; `WATCH` is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_and_transactions_work_as_redis_clients_use_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    wait_ready(&mut connect(&node).await).await;
    let packed = |ws: &[&str]| redis::cmd(ws[0]).arg(&ws[1..]).get_packed_command();
    let script: &[(&[&str], &str)] = &[
        (
            &["HELLO", "3", "SETNAME", "resp3"],
            "%8\r\n$6\r\nserver\r\n$5\r\nredis\r\n",
        ),
        (&[], "$5\r\nproto\r\n:3\r\n"),
        (&["BF.ADD", "bloom", "r3"], "#t\r\n"),
        (&["BF.EXISTS", "bloom", "r3"], "#t\r\n"),
        (&["BF.EXISTS", "bloom", "never3"], "#f\r\n"),
        (
            &["BF.MEXISTS", "bloom", "r3", "never3"],
            "*2\r\n#t\r\n#f\r\n",
        ),
        (&["CF.COUNT", "views", "none"], ":0\r\n"),
        (&["MULTI"], "+OK\r\n"),
        (&["BF.ADD", "bloom", "t1"], "+QUEUED\r\n"),
        (&["BF.EXISTS", "bloom", "t1"], "+QUEUED\r\n"),
        (&["CF.ADD", "views", "v"], "+QUEUED\r\n"),
        (&["CF.COUNT", "views", "v"], "+QUEUED\r\n"),
        (&["PING"], "+QUEUED\r\n"),
        (&["EXEC"], "*5\r\n#t\r\n#t\r\n#t\r\n:1\r\n+PONG\r\n"),
        // A RedisBloom command's refusal is queued and answered in EXEC's array (Redis
        // queues a module's commands; they refuse when they run).
        (&["MULTI"], "+OK\r\n"),
        (&["BF.ADD", "bloom", "t2"], "+QUEUED\r\n"),
        (&["BF.ADD", "bloom"], "+QUEUED\r\n"),
        (
            &["EXEC"],
            "*2\r\n#t\r\n-ERR wrong number of arguments for 'bf.add' command\r\n",
        ),
        (&["BF.EXISTS", "bloom", "t2"], "#t\r\n"),
        // Any other refused command aborts the transaction before anything runs.
        (&["MULTI"], "+OK\r\n"),
        (&["BF.ADD", "bloom", "t4"], "+QUEUED\r\n"),
        (
            &["PING", "a", "b"],
            "-ERR wrong number of arguments for 'ping' command\r\n",
        ),
        (&["MULTI"], "-ERR MULTI calls can not be nested\r\n"),
        (
            &["EXEC"],
            "-EXECABORT Transaction discarded because of previous errors.\r\n",
        ),
        (&["BF.EXISTS", "bloom", "t4"], "#f\r\n"),
        (&["MULTI"], "+OK\r\n"),
        (&["BF.ADD", "bloom", "t3"], "+QUEUED\r\n"),
        (&["DISCARD"], "+OK\r\n"),
        (&["BF.EXISTS", "bloom", "t3"], "#f\r\n"),
        (&["EXEC"], "-ERR EXEC without MULTI\r\n"),
        (&["WATCH", "bloom"], "-ERR WATCH is not supported"),
        (&["HELLO", "4"], "-NOPROTO unsupported protocol version\r\n"),
        (&["HELLO", "2"], "*16\r\n$6\r\nserver\r\n"),
        (&[], "$5\r\nproto\r\n:2\r\n"),
        (&["BF.EXISTS", "bloom", "r3"], ":1\r\n"),
        (&["QUIT"], "+OK\r\n"),
    ];
    let mut talk = Vec::new();
    for (ws, _) in script {
        if !ws.is_empty() {
            talk.extend(packed(ws));
        }
    }
    let answer = raw_exchange(&node, &talk);
    in_order(&answer, &script.iter().map(|(_, a)| *a).collect::<Vec<_>>());
    // The transaction's add happened; the aborted and discarded ones did not.
    let mut con = connect(&node).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "t1"], 1).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "t2"], 1).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "t3"], 0).await;
    expect(&mut con, &["BF.EXISTS", "bloom", "t4"], 0).await;
    // redis-rs's atomic pipeline (MULTI/EXEC) over RESP2.
    let (a, b): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("BF.ADD")
        .arg("bloom")
        .arg("p1")
        .cmd("BF.EXISTS")
        .arg("bloom")
        .arg("p1")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((a, b), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_adds_over_resp_survive_kill9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let items: Vec<String> = (0..200).map(|i| format!("durable-{i}")).collect();
    let singles: Vec<String> = (0..300).map(|i| format!("single-{i}")).collect();
    let mut node = start_node(dir.path(), "node", "", None, Some(&data));
    {
        let mut con = connect(&node).await;
        assert_eq!(
            run::<String>(&mut con, &["CRPF.ACK", "durable"])
                .await
                .unwrap(),
            "OK"
        );
        let mut args = vec!["BF.MADD", "bloom"];
        args.extend(items.iter().map(String::as_str));
        assert_eq!(
            run::<Vec<i64>>(&mut con, &args).await.unwrap(),
            vec![1; 200]
        );
        for i in &items[..20] {
            expect(&mut con, &["CF.ADD", "sessions", i], 1).await;
        }
        // Single adds in one pipeline: applied where they arrive, each answered once the
        // group commit that carries it is fsynced.
        let mut pipe = redis::pipe();
        for i in &singles {
            pipe.cmd("BF.ADD").arg("bloom").arg(i);
        }
        let added: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
        assert_eq!(added, vec![1; singles.len()]);
    }
    node.proc.kill9();
    let node = start_node(dir.path(), "node-restarted", "", None, Some(&data));
    let mut con = connect(&node).await;
    let mut args = vec!["BF.MEXISTS", "bloom"];
    args.extend(items.iter().map(String::as_str));
    assert_eq!(
        run::<Vec<i64>>(&mut con, &args).await.unwrap(),
        vec![1; 200]
    );
    let mut args = vec!["CF.MEXISTS", "sessions"];
    args.extend(items[..20].iter().map(String::as_str));
    assert_eq!(run::<Vec<i64>>(&mut con, &args).await.unwrap(), vec![1; 20]);
    let mut args = vec!["BF.MEXISTS", "bloom"];
    args.extend(singles.iter().map(String::as_str));
    assert_eq!(
        run::<Vec<i64>>(&mut con, &args).await.unwrap(),
        vec![1; singles.len()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_over_resp_replicate_over_nats() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let a = start_node(dir.path(), "a", "", Some(&nats.url()), None);
    let b = start_node(dir.path(), "b", "", Some(&nats.url()), None);
    let (mut on_a, mut on_b) = (connect(&a).await, connect(&b).await);
    let items: Vec<String> = (0..100).map(|i| format!("replicated-{i}")).collect();
    let mut madd = vec!["CF.INSERT", "sessions", "ITEMS"];
    madd.extend(items.iter().map(String::as_str));
    assert_eq!(
        run::<Vec<i64>>(&mut on_a, &madd).await.unwrap(),
        vec![1; 100]
    );
    let mut mexists = vec!["CF.MEXISTS", "sessions"];
    mexists.extend(items.iter().map(String::as_str));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found: Vec<i64> = run(&mut on_b, &mexists).await.unwrap();
        if found == vec![1; 100] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b has {} of 100 after 30 s",
            found.iter().sum::<i64>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A remove on b reaches a.
    expect(&mut on_b, &["CF.DEL", "sessions", "replicated-0"], 1).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while run::<i64>(&mut on_a, &["CF.EXISTS", "sessions", "replicated-0"])
        .await
        .unwrap()
        == 1
    {
        assert!(
            Instant::now() < deadline,
            "the remove did not reach a in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 27, point 5: Redis's `timeout` closes connections idle that long, so idle clients
/// cannot hold every slot, and `maxclients` is the slots' name in Redis's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_timeout_and_maxclients_bounds_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(
        dir.path(),
        "idle",
        "timeout = 1\nmaxclients = 3",
        None,
        None,
    );
    let ping = |s: &mut TcpStream| -> std::io::Result<String> {
        s.write_all(b"PING\r\n")?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let open = || {
        let s = TcpStream::connect(&node.resp).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let (mut idle, mut busy) = (open(), open());
    assert_eq!(ping(&mut idle).unwrap(), "+PONG\r\n");
    // A client that keeps talking stays; one that says nothing for over a second is closed.
    for _ in 0..6 {
        assert_eq!(ping(&mut busy).unwrap(), "+PONG\r\n");
        std::thread::sleep(Duration::from_millis(400));
    }
    let mut buf = [0u8; 64];
    assert_eq!(
        idle.read(&mut buf).unwrap(),
        0,
        "the idle connection was closed"
    );
    // maxclients = 3: with `busy` and two more open, a fourth is refused.
    let (mut a, mut b) = (open(), open());
    assert_eq!(ping(&mut a).unwrap(), "+PONG\r\n");
    assert_eq!(ping(&mut b).unwrap(), "+PONG\r\n");
    let mut refused = open();
    let n = refused.read(&mut buf).unwrap_or(0);
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("max number of clients"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Once idle ones are closed, their slots serve new clients.
    std::thread::sleep(Duration::from_millis(2_500));
    let mut later = open();
    assert_eq!(ping(&mut later).unwrap(), "+PONG\r\n");
}

/// Issue 24: redis-py 8 with its defaults (`HELLO 3` on connecting, RESP3 replies, pipelines
/// wrapped in MULTI/EXEC) and its own Bloom and cuckoo commands. redis-py comes with
/// scripts/test.sh (PyPI `redis`, into .tools/py) or `CRPF_PYTHONPATH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_works_with_its_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    wait_ready(&mut connect(&node).await).await;
    let pythonpath = std::env::var("CRPF_PYTHONPATH")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/py").to_string());
    assert!(
        Path::new(&pythonpath).join("redis").exists(),
        "redis-py not found in {pythonpath}: run scripts/test.sh (it installs the PyPI package \
         redis into .tools/py) or set CRPF_PYTHONPATH"
    );
    let script = r#"
import sys, redis
host, port = sys.argv[1].rsplit(":", 1)
r = redis.Redis(host=host, port=int(port))
print("proto", r.execute_command("HELLO")[b"proto"])
print("ping", r.ping())
bf, cf = r.bf(), r.cf()
print("bf.add", bf.add("bloom", "py1"))
print("bf.exists", bf.exists("bloom", "py1"), bf.exists("bloom", "py-never"))
print("bf.mexists", bf.mexists("bloom", "py1", "py-never"))
print("bf.madd", bf.madd("bloom", "py3", "py4"))
print("cf.add", cf.add("sessions", "s-py"))
print("cf.exists", cf.exists("sessions", "s-py"))
print("cf.del", cf.delete("sessions", "s-py"))
print("cf.count", cf.count("views", "v-py"))
p = r.pipeline()
p.execute_command("BF.ADD", "bloom", "py2")
p.execute_command("BF.EXISTS", "bloom", "py2")
print("pipeline", p.execute())
try:
    bf.add("sessions", "x")
except redis.ResponseError as e:
    print("wrongtype", e)
print("bf.add again", bf.add("bloom", "py1"))
print("created", bf.add("py-new", "a"), r.type("py-new"))
info = bf.info("py-new")
print("bf.info", info.capacity, info.insertedNum, info.filterNum)
print("bf.card", bf.card("py-new"))
print("cf.addnx", cf.addnx("cf-new", "x"), cf.addnx("cf-new", "x"))
print("cf.insertnx", cf.insertnx("cf-new", ["x", "y"]))
print("cf.info", cf.info("cf-new").bucketSize)
chunks, it = [], 0
while True:
    it, data = bf.scandump("py-new", it)
    if it == 0:
        break
    chunks.append((it, data))
for it, data in chunks:
    bf.loadchunk("py-copy", it, data)
print("restored", bf.exists("py-copy", "a"), bf.exists("py-copy", "b"))
p = r.pipeline(transaction=False)
p.bf().add("bloom", "py5")
p.bf().exists("bloom", "py5")
print("plain pipeline", p.execute())
print("keys", sorted(r.scan_iter(match="py-*")))
print("flushed", r.delete("py-new", "py-copy"), r.exists("py-new"))
"#;
    let resp = node.resp.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", script, &resp])
            .env("PYTHONPATH", &pythonpath)
            .output()
            .expect("run python3")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "redis-py failed after printing {stdout:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "proto 3",
            "ping True",
            "bf.add True",
            "bf.exists True False",
            "bf.mexists [True, False]",
            "bf.madd [True, True]",
            "cf.add True",
            "cf.exists True",
            "cf.del True",
            "cf.count 0",
            "pipeline [True, True]",
            "wrongtype WRONGTYPE Operation against a key holding the wrong kind of value",
            "bf.add again False",
            "created True b'MBbloom--'",
            "bf.info 100 1 1",
            "bf.card 1",
            "cf.addnx True False",
            "cf.insertnx [0, 1]",
            "cf.info 4",
            "restored True False",
            "plain pipeline [True, True]",
            "keys [b'py-copy', b'py-new']",
            "flushed 2 0",
        ],
        "{stdout}"
    );
}

/// Issue 24 on the filter catalog: `BF.RESERVE` / `CF.RESERVE` create filters (their options
/// mapped onto crpf kinds, or refused), the key commands see them, `DEL` drops them, and a
/// key created again starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_filters_reserved_listed_and_deleted_by_commands() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    let mut con = connect(&node).await;
    let ok = |args: &'static [&'static str]| args;
    for args in [
        ok(&["BF.RESERVE", "tenant1", "0.01", "1000", "NONSCALING"]),
        ok(&["BF.RESERVE", "tenant2", "0.001", "500"]),
        ok(&["CF.RESERVE", "t3", "1000"]),
        ok(&[
            "CF.RESERVE",
            "t4",
            "1000",
            "EXPANSION",
            "2",
            "BUCKETSIZE",
            "4",
        ]),
    ] {
        assert_eq!(
            run::<String>(&mut con, args).await.unwrap(),
            "OK",
            "{args:?}"
        );
    }
    let long_key = "k".repeat(1025);
    for (args, expected) in [
        (
            &["BF.RESERVE", "tenant1", "0.01", "1000"][..],
            "item exists",
        ),
        (&["BF.RESERVE", "x", "abc", "100"], "bad error rate"),
        (
            &["BF.RESERVE", "x", "1.5", "100"],
            "(0 < error rate range < 1)",
        ),
        (
            &["BF.RESERVE", "x", "0.01", "0"],
            "capacity should be larger than 0",
        ),
        (
            &["BF.RESERVE", "x", "0.01", "100", "EXPANSION"],
            "no expansion",
        ),
        (
            &["BF.RESERVE", "x", "0.01", "100", "EXPANSION", "0"],
            "expansion should be greater or equal to 1",
        ),
        (
            &["CF.RESERVE", "x", "100", "BUCKETSIZE", "256"],
            "value must be an integer between 1 and 255",
        ),
        // RedisBloom's text, without an error code.
        (&["CF.RESERVE", "x", "0"], "Capacity"),
        // Any key but one over 1 KiB (a space or a colon is fine).
        (
            &["BF.RESERVE", &long_key, "0.01", "100"],
            "at most 1024 bytes",
        ),
        (&["DEL", "bloom"], "declared in this node's configuration"),
    ] {
        let e = refused(&mut con, args).await;
        assert!(e.contains(expected), "{args:?}: {e}");
    }
    // RedisBloom's other growths, bucket sizes and kick limits (issue 49), read back.
    for args in [
        &["BF.RESERVE", "e4", "0.01", "100", "EXPANSION", "4"][..],
        &[
            "CF.RESERVE",
            "b2",
            "100",
            "BUCKETSIZE",
            "2",
            "MAXITERATIONS",
            "20",
        ],
    ] {
        assert_eq!(run::<String>(&mut con, args).await.unwrap(), "OK");
    }
    let growth: Vec<i64> = run(&mut con, &["BF.INFO", "e4", "EXPANSION"])
        .await
        .unwrap();
    assert_eq!(growth, [4]);
    let info: std::collections::HashMap<String, i64> =
        run(&mut con, &["CF.INFO", "b2"]).await.unwrap();
    assert_eq!(
        (
            info["Bucket size"],
            info["Max iterations"],
            info["Expansion rate"]
        ),
        (2, 20, 2)
    );
    expect(&mut con, &["CF.ADD", "b2", "x"], 1).await;
    expect(&mut con, &["CF.EXISTS", "b2", "x"], 1).await;
    expect(&mut con, &["DEL", "e4", "b2"], 2).await;
    expect(&mut con, &["BF.ADD", "tenant1", "a"], 1).await;
    expect(&mut con, &["BF.ADD", "tenant2", "a"], 1).await;
    expect(&mut con, &["BF.EXISTS", "tenant1", "a"], 1).await;
    expect(&mut con, &["CF.ADD", "t3", "x"], 1).await;
    expect(&mut con, &["CF.DEL", "t3", "x"], 1).await;
    expect(&mut con, &["CF.ADD", "t4", "x"], 1).await;
    assert!(
        refused(&mut con, &["BF.ADD", "t3", "x"])
            .await
            .contains("wrong kind")
    );
    for (key, t) in [
        ("tenant1", "MBbloom--"),
        ("t3", "MBbloomCF"),
        ("nope", "none"),
    ] {
        assert_eq!(run::<String>(&mut con, &["TYPE", key]).await.unwrap(), t);
    }
    expect(&mut con, &["EXISTS", "tenant1", "t3", "nope", "t3"], 3).await;
    // The configured bloom, sessions and views, and the four reserved.
    expect(&mut con, &["DBSIZE"], 7).await;
    let keys: Vec<String> = run(&mut con, &["KEYS", "t*"]).await.unwrap();
    assert_eq!(keys, ["t3", "t4", "tenant1", "tenant2"]);
    let (cursor, keys): (String, Vec<String>) = run(
        &mut con,
        &["SCAN", "0", "MATCH", "tenant[12]", "COUNT", "10"],
    )
    .await
    .unwrap();
    assert_eq!((cursor.as_str(), keys.len()), ("0", 2));
    let stats: String = run(&mut con, &["CRPF.STATS", "tenant2"]).await.unwrap();
    assert!(stats.contains("writer_sc_g_bloom"), "{stats}");

    expect(&mut con, &["DEL", "tenant1", "t3", "nope"], 2).await;
    expect(&mut con, &["EXISTS", "tenant1", "t3"], 0).await;
    expect(&mut con, &["BF.EXISTS", "tenant1", "a"], 0).await;
    // Created again: a new incarnation, empty.
    assert_eq!(
        run::<String>(
            &mut con,
            &["BF.RESERVE", "tenant1", "0.01", "1000", "NONSCALING"]
        )
        .await
        .unwrap(),
        "OK"
    );
    expect(&mut con, &["BF.EXISTS", "tenant1", "a"], 0).await;
    expect(&mut con, &["UNLINK", "tenant1", "tenant2", "t4"], 3).await;
    expect(&mut con, &["DBSIZE"], 3).await;
}

/// A key's dump, as `BF.SCANDUMP` (or `CF.SCANDUMP`) gives it: the (iterator, data) pairs.
async fn scandump(
    con: &mut MultiplexedConnection,
    command: &str,
    key: &str,
) -> Vec<(i64, Vec<u8>)> {
    let mut chunks = Vec::new();
    let mut iter = 0i64;
    loop {
        let (next, data): (i64, Vec<u8>) = redis::cmd(command)
            .arg(key)
            .arg(iter)
            .query_async(con)
            .await
            .unwrap_or_else(|e| panic!("{command} {key} {iter}: {e}"));
        if next == 0 {
            return chunks;
        }
        chunks.push((next, data));
        iter = next;
    }
}

async fn loadchunk(
    con: &mut MultiplexedConnection,
    command: &str,
    key: &str,
    (iter, data): &(i64, Vec<u8>),
) -> RedisResult<String> {
    redis::cmd(command)
        .arg(key)
        .arg(*iter)
        .arg(data.as_slice())
        .query_async(con)
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn scandump_and_loadchunk_restore_bloom_keys_and_refuse_what_would_break() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    let mut con = connect(&node).await;
    let items: Vec<String> = (0..200).map(|i| format!("item-{i}")).collect();
    for reserve in [
        &["BF.RESERVE", "small", "0.01", "1000"][..],
        // About 5.4 MB of bits: more than one chunk.
        &["BF.RESERVE", "big", "0.001", "3000000", "NONSCALING"],
    ] {
        let key = reserve[1];
        assert_eq!(run::<String>(&mut con, reserve).await.unwrap(), "OK");
        let mut madd = vec!["BF.MADD", key];
        madd.extend(items.iter().map(String::as_str));
        run::<Vec<i64>>(&mut con, &madd).await.unwrap();
        let chunks = scandump(&mut con, "BF.SCANDUMP", key).await;
        assert!(chunks.len() >= 2, "{key}: a header and the state");
        if key == "big" {
            assert!(chunks.len() >= 3, "big spans chunks: {}", chunks.len());
        }
        let copy = format!("{key}-copy");
        for chunk in &chunks {
            assert_eq!(
                loadchunk(&mut con, "BF.LOADCHUNK", &copy, chunk)
                    .await
                    .unwrap(),
                "OK"
            );
        }
        for item in &items {
            expect(&mut con, &["BF.EXISTS", &copy, item], 1).await;
        }
        let t: String = run(&mut con, &["TYPE", &copy]).await.unwrap();
        assert_eq!(t, "MBbloom--");
        // Loading into a key that moved on merges: nothing of either is lost.
        expect(&mut con, &["BF.ADD", &copy, "later"], 1).await;
        for chunk in &chunks {
            loadchunk(&mut con, "BF.LOADCHUNK", &copy, chunk)
                .await
                .unwrap();
        }
        expect(&mut con, &["BF.EXISTS", &copy, "later"], 1).await;
        expect(&mut con, &["BF.EXISTS", &copy, "item-7"], 1).await;
    }

    // A damaged chunk loads nothing, and creates no key.
    let mut chunks = scandump(&mut con, "BF.SCANDUMP", "small").await;
    let last = chunks.last_mut().unwrap();
    let mid = last.1.len() / 2;
    last.1[mid] ^= 0x40;
    for chunk in &chunks[..chunks.len() - 1] {
        loadchunk(&mut con, "BF.LOADCHUNK", "damaged", chunk)
            .await
            .unwrap();
    }
    let e = loadchunk(&mut con, "BF.LOADCHUNK", "damaged", chunks.last().unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum"), "{e}");
    expect(&mut con, &["EXISTS", "damaged"], 0).await;
    // Out of order: refused, and the load abandoned.
    let chunks = scandump(&mut con, "BF.SCANDUMP", "big").await;
    loadchunk(&mut con, "BF.LOADCHUNK", "shuffled", &chunks[0])
        .await
        .unwrap();
    let e = loadchunk(&mut con, "BF.LOADCHUNK", "shuffled", &chunks[2])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of order"), "{e}");
    expect(&mut con, &["EXISTS", "shuffled"], 0).await;
    // Into a key of another shape: refused, the key unchanged.
    run::<String>(
        &mut con,
        &["BF.RESERVE", "other", "0.01", "50", "NONSCALING"],
    )
    .await
    .unwrap();
    let small = scandump(&mut con, "BF.SCANDUMP", "small").await;
    let mut last = Ok(String::new());
    for chunk in &small {
        last = loadchunk(&mut con, "BF.LOADCHUNK", "other", chunk).await;
    }
    let e = last.unwrap_err().to_string();
    assert!(e.contains("does not match `other`"), "{e}");
    expect(&mut con, &["BF.EXISTS", "other", "item-1"], 0).await;
    // An iterator from nowhere.
    let e = run::<Value>(&mut con, &["BF.SCANDUMP", "small", "12345678"])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("start again at iterator 0"), "{e}");
}

/// The `CF.COUNT` of each of `items` in `key`.
async fn counts(con: &mut MultiplexedConnection, key: &str, items: &[String]) -> Vec<i64> {
    let mut v = Vec::with_capacity(items.len());
    for item in items {
        v.push(run(con, &["CF.COUNT", key, item]).await.unwrap());
    }
    v
}

/// A field of a key's `CRPF.STATS`.
async fn stat(con: &mut MultiplexedConnection, key: &str, field: &str) -> serde_json::Value {
    let stats: String = run(con, &["CRPF.STATS", key]).await.unwrap();
    serde_json::from_str::<serde_json::Value>(&stats).unwrap()[field].clone()
}

/// Loads every chunk of `dump` into `key`: the last reply.
async fn load(
    con: &mut MultiplexedConnection,
    key: &str,
    dump: &[(i64, Vec<u8>)],
) -> RedisResult<String> {
    let mut last = Ok(String::new());
    for chunk in dump {
        last = loadchunk(con, "CF.LOADCHUNK", key, chunk).await;
        if last.is_err() {
            break;
        }
    }
    last
}

/// A RedisBloom user's backup and restore of cuckoo keys (`CF.SCANDUMP` loop, then
/// `CF.LOADCHUNK` loop into a new key): the observed-remove kinds (`writer_sc_or_cuckoo`, what
/// `CF.RESERVE` makes; `or_cuckoo`) and `counting_cuckoo` come back with the same membership
/// and `CF.COUNT`, as this replica's own adds (its tags, removable by `CF.DEL`), the original
/// untouched. Loads into an existing key add to it; a dump of another spec, one that does not
/// fit beside what the key holds, or a damaged one changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn cuckoo_dumps_load_as_the_loading_replicas_own_adds() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    let mut con = connect(&node).await;
    let items: Vec<String> = (0..150).map(|i| format!("item-{i}")).collect();
    let keys: [(&str, &[&str], &str); 3] = [
        // Capacity 100: 300 entries take several sub-filters.
        ("wsc", &["CF.RESERVE", "wsc", "100"], "writer_sc_or_cuckoo"),
        (
            "or",
            &["CF.RESERVE", "or", "1000", "EXPANSION", "0"],
            "or_cuckoo",
        ),
        (
            "cnt",
            &["CRPF.RESERVE", "cnt", "counting_cuckoo", "1000", "0.01"],
            "counting_cuckoo",
        ),
    ];
    let mut dumps = Vec::new();
    for (key, reserve, kind) in keys {
        assert_eq!(run::<String>(&mut con, reserve).await.unwrap(), "OK");
        // Item i added 1 + i % 3 times.
        for (i, item) in items.iter().enumerate() {
            for _ in 0..=(i % 3) {
                expect(&mut con, &["CF.ADD", key, item], 1).await;
            }
        }
        let stats: String = run(&mut con, &["CRPF.STATS", key]).await.unwrap();
        assert!(stats.contains(kind), "{stats}");
        let original = counts(&mut con, key, &items).await;
        assert!(original.iter().all(|&c| c >= 1));
        let entries: i64 = original.iter().sum();
        if key == "wsc" {
            assert!(stat(&mut con, key, "sub_filters").await.as_u64().unwrap() >= 3);
        }

        let dump = scandump(&mut con, "CF.SCANDUMP", key).await;
        let copy = format!("{key}-copy");
        assert_eq!(load(&mut con, &copy, &dump).await.unwrap(), "OK", "{key}");
        let t: String = run(&mut con, &["TYPE", &copy]).await.unwrap();
        assert_eq!(t, "MBbloomCF");
        let stats: String = run(&mut con, &["CRPF.STATS", &copy]).await.unwrap();
        assert!(stats.contains(kind), "{key}: the dumped spec: {stats}");
        assert_eq!(
            stat(&mut con, &copy, "sub_filters").await,
            stat(&mut con, key, "sub_filters").await,
            "{key}"
        );
        for item in &items {
            expect(&mut con, &["CF.EXISTS", &copy, item], 1).await;
        }
        assert_eq!(counts(&mut con, &copy, &items).await, original, "{key}");
        if kind != "counting_cuckoo" {
            // Every entry under a fresh tag of this replica's: its clock counts them.
            assert_eq!(stat(&mut con, &copy, "clock").await, entries, "{key}");
        }

        // Removable on the copy, occurrence by occurrence; the original keeps them.
        let two = items[1].as_str();
        assert_eq!(original[1], 2);
        expect(&mut con, &["CF.DEL", &copy, two], 1).await;
        expect(&mut con, &["CF.COUNT", &copy, two], 1).await;
        expect(&mut con, &["CF.DEL", &copy, two], 1).await;
        expect(&mut con, &["CF.EXISTS", &copy, two], 0).await;
        expect(&mut con, &["CF.DEL", &copy, two], 0).await;
        expect(&mut con, &["CF.COUNT", key, two], 2).await;
        assert_eq!(counts(&mut con, key, &items).await, original, "{key}");
        dumps.push((key, dump, original));
    }

    // Into a key that holds items, where they fit: added to them, as CF.ADD would.
    let (_, or_dump, or_counts) = &dumps[1];
    expect(&mut con, &["CF.ADD", "or-copy", "later"], 1).await;
    assert_eq!(load(&mut con, "or-copy", or_dump).await.unwrap(), "OK");
    let doubled = counts(&mut con, "or-copy", &items).await;
    for (i, (&now, &was)) in doubled.iter().zip(or_counts).enumerate() {
        let want = if i == 1 { was } else { 2 * was };
        assert_eq!(now, want, "{}", items[i]);
    }
    expect(&mut con, &["CF.EXISTS", "or-copy", "later"], 1).await;
    let (_, cnt_dump, cnt_counts) = &dumps[2];
    assert_eq!(load(&mut con, "cnt-copy", cnt_dump).await.unwrap(), "OK");
    expect(
        &mut con,
        &["CF.COUNT", "cnt-copy", &items[2]],
        2 * cnt_counts[2],
    )
    .await;

    // Refused, each leaving the key as it was.
    let (_, wsc_dump, _) = &dumps[0];
    let wsc_copy = counts(&mut con, "wsc-copy", &items).await;
    // Where it does not fit: the copy's full sub-filters would overflow.
    let e = load(&mut con, "wsc-copy", wsc_dump)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no room"), "{e}");
    assert_eq!(counts(&mut con, "wsc-copy", &items).await, wsc_copy);
    // Of another kind, and of another capacity.
    let e = load(&mut con, "wsc-copy", or_dump)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match `wsc-copy`"), "{e}");
    assert_eq!(counts(&mut con, "wsc-copy", &items).await, wsc_copy);
    assert_eq!(
        run::<String>(&mut con, &["CF.RESERVE", "small", "500", "EXPANSION", "0"])
            .await
            .unwrap(),
        "OK"
    );
    let e = load(&mut con, "small", or_dump)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match `small`"), "{e}");
    expect(&mut con, &["CF.EXISTS", "small", &items[0]], 0).await;
    // Damaged: nothing loaded.
    let mut damaged = or_dump.clone();
    let last = damaged.last_mut().unwrap();
    let mid = last.1.len() / 2;
    last.1[mid] ^= 0x40;
    let before = counts(&mut con, "or-copy", &items).await;
    let e = load(&mut con, "or-copy", &damaged)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum"), "{e}");
    assert_eq!(counts(&mut con, "or-copy", &items).await, before);
}

/// Reads of a key's figures (`CF.INFO`, `BF.CARD`) take their turn among the connection's
/// commands: after the adds pipelined before them, and inside `EXEC` when it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_figures_come_after_the_updates_before_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "node", "", None, None);
    wait_ready(&mut connect(&node).await).await;
    let packed = |ws: &[&str]| redis::cmd(ws[0]).arg(&ws[1..]).get_packed_command();
    let mut talk = Vec::new();
    for ws in [
        &["CF.RESERVE", "ordered", "1000"][..],
        &["CF.ADD", "ordered", "x"],
        &["CF.INFO", "ordered"],
        &["MULTI"],
        &["CF.ADD", "ordered", "y"],
        &["CF.INFO", "ordered"],
        &["EXEC"],
        &["BF.ADD", "b", "1"],
        &["BF.ADD", "b", "2"],
        &["BF.CARD", "b"],
        &["QUIT"],
    ] {
        talk.extend(packed(ws));
    }
    let answer = raw_exchange(&node, &talk);
    in_order(
        &answer,
        &[
            "+OK\r\n",
            ":1\r\n",
            "+Number of items inserted\r\n:1\r\n",
            "+OK\r\n",
            "+QUEUED\r\n+QUEUED\r\n",
            "*2\r\n:1\r\n*16\r\n",
            "+Number of items inserted\r\n:2\r\n",
            ":1\r\n:1\r\n:2\r\n",
        ],
    );
}

/// Waits until the node has parked `n` filters (`crpf_parked_filters`).
async fn parked(node: &Node, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(node, "crpf_parked_filters") < n {
        assert!(
            Instant::now() < deadline,
            "{n} filters not parked in 20 s\n{}",
            node.proc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Keys created by commands park once idle (their replicas alone on the node), and every
/// command answers a parked key as if it had never parked: reads (answered from the kept
/// state, without resuming it), adds, removes, listings, types, deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_keys_answer_every_command_as_if_they_never_parked() {
    // Over NATS: the catalog (JetStream KV) outlives the node, which is killed below.
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let catalog = "\n[catalog]\npark_after_ms = 300\n";
    let node = start_node(dir.path(), "node", catalog, Some(&nats.url()), Some(&data));
    let mut con = connect(&node).await;
    expect(&mut con, &["BF.ADD", "k", "alice"], 1).await;
    let ok: String = run(&mut con, &["CF.RESERVE", "c", "1000"]).await.unwrap();
    assert_eq!(ok, "OK");
    expect(&mut con, &["CF.ADD", "c", "x"], 1).await;
    parked(&node, 2.0).await;
    expect(&mut con, &["BF.EXISTS", "k", "alice"], 1).await;
    expect(&mut con, &["BF.EXISTS", "k", "nobody"], 0).await;
    expect(&mut con, &["CF.EXISTS", "c", "x"], 1).await;
    // Queries are answered from the kept states: nothing resumed.
    assert_eq!(metric(&node, "crpf_parking_total{change=\"resumed\"}"), 0.0);
    assert_eq!(metric(&node, "crpf_parked_queries_total"), 3.0);
    parked(&node, 2.0).await;
    let added: Vec<i64> = run(&mut con, &["BF.MADD", "k", "bob", "carol"])
        .await
        .unwrap();
    assert_eq!(added, [1, 1]);
    expect(&mut con, &["CF.DEL", "c", "x"], 1).await;
    expect(&mut con, &["CF.ADD", "c", "y"], 1).await;
    parked(&node, 2.0).await;
    let found: Vec<i64> = run(&mut con, &["BF.MEXISTS", "k", "alice", "bob", "carol"])
        .await
        .unwrap();
    assert_eq!(found, [1, 1, 1]);
    expect(&mut con, &["CF.EXISTS", "c", "x"], 0).await;
    parked(&node, 2.0).await;
    let kind: String = run(&mut con, &["TYPE", "k"]).await.unwrap();
    assert_eq!(kind, "MBbloom--");
    let mut keys: Vec<String> = run(&mut con, &["KEYS", "*"]).await.unwrap();
    keys.sort();
    assert_eq!(keys, ["bloom", "c", "k", "sessions", "views"]);
    expect(&mut con, &["DBSIZE"], 5).await;
    expect(&mut con, &["DEL", "k"], 1).await;
    expect(&mut con, &["EXISTS", "k"], 0).await;
    // The updates resumed them (`BF.MADD`, `CF.DEL`), the queries did not.
    assert!(metric(&node, "crpf_parking_total{change=\"resumed\"}") >= 2.0);
    assert!(metric(&node, "crpf_parked_queries_total") >= 5.0);
    // A parked replica's state is on disk (it parks only once its snapshot holds every
    // change): killed and restarted, the node has what the resumed replicas took.
    parked(&node, 1.0).await;
    drop(con);
    drop(node);
    let node = start_node(dir.path(), "node2", catalog, Some(&nats.url()), Some(&data));
    let mut con = connect(&node).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = run::<i64>(&mut con, &["CF.EXISTS", "c", "y"]).await {
        assert!(e.to_string().contains("BusyLoading"), "{e}");
        assert!(Instant::now() < deadline, "c not ready in 30 s: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    expect(&mut con, &["CF.EXISTS", "c", "y"], 1).await;
    expect(&mut con, &["CF.EXISTS", "c", "x"], 0).await;
    expect(&mut con, &["EXISTS", "k"], 0).await;
}

/// What tools and client test harnesses read (issue 49, items 3 and 6): `INFO` carries
/// `cluster_enabled`, `loading`, `role` and the `Stats` counters with true values; `HELLO` and
/// `MODULE LIST` name the `bf` module; `CLIENT LIST`/`INFO` show the connections with their
/// names and protocols, `CLIENT KILL` closes one (the other stays); `ROLE`, `TIME` and
/// `RANDOMKEY` answer as Redis's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_read_info_modules_and_clients() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), "tools", "", None, None);
    let mut con = connect(&node).await;
    let info: String = run(&mut con, &["INFO"]).await.unwrap();
    for field in [
        "cluster_enabled:0",
        "loading:0",
        "role:master",
        "blocked_clients:0",
        "rejected_connections:0",
        "module:name=bf,ver=20802",
    ] {
        assert!(info.contains(field), "{field} in {info}");
    }
    let count = |info: &str, field: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{field} in {info}"))
            .trim()
            .parse()
            .unwrap()
    };
    let commands = count(&info, "total_commands_processed");
    let connections = count(&info, "total_connections_received");
    assert!(commands >= 3 && connections >= 1, "{info}");
    let later: String = run(&mut con, &["INFO", "stats"]).await.unwrap();
    assert!(
        count(&later, "total_commands_processed") > commands,
        "{later}"
    );

    let modules: Vec<std::collections::HashMap<String, Value>> =
        run(&mut con, &["MODULE", "LIST"]).await.unwrap();
    assert_eq!(modules.len(), 1);
    assert_eq!(
        modules[0].get("name"),
        Some(&Value::BulkString(b"bf".to_vec()))
    );
    assert_eq!(modules[0].get("ver"), Some(&Value::Int(20802)));
    let hello: std::collections::HashMap<String, Value> =
        run(&mut con, &["HELLO", "2"]).await.unwrap();
    assert!(
        matches!(hello.get("modules"), Some(Value::Array(m)) if m.len() == 1),
        "{hello:?}"
    );

    let role: Vec<Value> = run(&mut con, &["ROLE"]).await.unwrap();
    assert_eq!(role[0], Value::BulkString(b"master".to_vec()));
    let (secs, micros): (u64, u64) = run(&mut con, &["TIME"]).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(secs.abs_diff(now) <= 5 && micros < 1_000_000);
    // Three configured filters: RANDOMKEY names one of them.
    let key: String = run(&mut con, &["RANDOMKEY"]).await.unwrap();
    assert!(
        ["bloom", "sessions", "views"].contains(&key.as_str()),
        "{key}"
    );

    // Two named connections: each sees both, its own with CLIENT INFO.
    let _: () = run(&mut con, &["CLIENT", "SETNAME", "first"])
        .await
        .unwrap();
    let mut other = TcpStream::connect(&node.resp).unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    other
        .write_all(b"HELLO 3 SETNAME second\r\nCLIENT ID\r\n")
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).ends_with("\r\n:") {
        let n = other.read(&mut buf).unwrap();
        assert!(n > 0, "closed");
        seen.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&seen).contains("\r\n:") {
            break;
        }
    }
    let list: String = run(&mut con, &["CLIENT", "LIST"]).await.unwrap();
    let lines: Vec<&str> = list.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("name=first") && l.contains("resp=2"))
            && lines
                .iter()
                .any(|l| l.contains("name=second") && l.contains("resp=3")),
        "{list}"
    );
    let mine: String = run(&mut con, &["CLIENT", "INFO"]).await.unwrap();
    assert!(mine.contains("name=first"), "{mine}");
    let second_id: String = lines
        .iter()
        .find(|l| l.contains("name=second"))
        .and_then(|l| l.split(' ').next()?.strip_prefix("id="))
        .unwrap()
        .to_string();
    let killed: i64 = run(&mut con, &["CLIENT", "KILL", "ID", &second_id])
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // The other connection is closed; this one stays.
    let mut rest = Vec::new();
    let _ = other.read_to_end(&mut rest);
    let pong: String = run(&mut con, &["PING"]).await.unwrap();
    assert_eq!(pong, "PONG");
    let list: String = run(&mut con, &["CLIENT", "LIST"]).await.unwrap();
    assert!(!list.contains("name=second"), "{list}");

    // A batch larger than the filter takes (`max_batch_items`, 10,000) is refused with an
    // error and the connection stays (issue 49, item 5: a protocol error closed it).
    let mut madd = redis::cmd("BF.MADD");
    madd.arg("bloom");
    for i in 0..12_000 {
        madd.arg(format!("item{i}"));
    }
    let err = madd.query_async::<Value>(&mut con).await.unwrap_err();
    assert!(err.to_string().contains("max_batch_items"), "{err}");
    // Items far over the old 4,096-byte limit are taken (issue 49, item 5).
    let big = "x".repeat(200_000);
    expect(&mut con, &["BF.ADD", "bloom", &big], 1).await;
    expect(&mut con, &["BF.EXISTS", "bloom", &big], 1).await;
    let pong: String = run(&mut con, &["PING"]).await.unwrap();
    assert_eq!(pong, "PONG");
}
