//! The write-ahead log under `kill -9`: a child process (this test binary, run as the ignored
//! test `crash_child`) appends from several threads, takes snapshots with rotations and
//! truncations, and prints every record once its append completed; it is SIGKILLed at a random
//! moment. Every record it printed must then be in the snapshot or replayed from the log.
//!
//! A SIGKILL keeps the page cache, so this checks the protocol (acknowledge only after the
//! write, torn tails, the rotate / snapshot / remove order), not the disk's fsync.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crpf::replica::durable::{DataDir, Identity, Snapshot};
use crpf::replica::wal::{self, SegmentId, WAL_DIR, WalLimits, WalWriter};
use crpf::wire::FilterKind;
use uuid::Uuid;

const CHILD_ENV: &str = "CRPF_WAL_CRASH_DIR";
const WORKERS: usize = 4;

fn identity() -> Identity {
    Identity {
        uuid: Uuid::from_u128(0x5eed),
        replica: 3,
    }
}

fn limits() -> WalLimits {
    WalLimits {
        max_record_bytes: 64 << 10,
    }
}

/// The record's name, before its padding.
fn name_of(record: &[u8]) -> String {
    let end = record.iter().position(|&b| b == b'|').expect("a separator");
    String::from_utf8(record[..end].to_vec()).expect("utf-8")
}

#[test]
#[ignore = "the child process of kill9_loses_no_acknowledged_record"]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let data = DataDir::open(&dir).unwrap();
    let replayed = wal::replay(
        data.path().join(WAL_DIR),
        identity(),
        None,
        limits(),
        |_| panic!("a fresh directory"),
    )
    .unwrap();
    let writer = WalWriter::start(replayed, identity()).unwrap();
    // The writer and what was issued, changed together: the order of the queue.
    let shared = Arc::new(Mutex::new((writer, Vec::<String>::new())));
    // Bounded, in case the parent never kills it.
    let deadline = Instant::now() + Duration::from_secs(60);

    let snapshots = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(3));
                // As the actor: rotate at the moment of the clone, save, then truncate.
                let (through, items) = {
                    let mut s = shared.lock().unwrap();
                    (s.0.rotate(), s.1.clone())
                };
                data.save_snapshot(&Snapshot {
                    identity: identity(),
                    filter: "crash".into(),
                    kind: FilterKind::GBloom,
                    params_digest: 0,
                    reserved: 0,
                    state: items.join("\n").into_bytes(),
                    wal_covered: Some(through.0),
                })
                .unwrap();
                let removed = shared.lock().unwrap().0.remove_through(through);
                removed.wait().unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|t| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while Instant::now() < deadline {
                    let name = format!("w{t}-{n}");
                    let mut record = format!("{name}|").into_bytes();
                    record.resize(record.len() + fastrand::usize(..9000), b'.');
                    let pending = {
                        let mut s = shared.lock().unwrap();
                        s.1.push(name.clone());
                        s.0.append(record)
                    };
                    pending.wait().unwrap();
                    println!("ACK {name} END");
                    n += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    snapshots.join().unwrap();
}

/// Runs the child until it acknowledged `target` records, kills it, and answers what it
/// acknowledged.
fn run_child(dir: &Path, target: usize) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "crash_child", "--nocapture"])
        .env(CHILD_ENV, dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    let mut killed = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // A line cut by the kill has no END, and is not a claim.
        if let Some(name) = line
            .strip_prefix("ACK ")
            .and_then(|l| l.strip_suffix(" END"))
        {
            acked.push(name.to_string());
        }
        if !killed && acked.len() >= target {
            child.kill().unwrap();
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the child ended on its own ({status}) after {} records",
        acked.len()
    );
    acked
}

#[test]
fn kill9_loses_no_acknowledged_record() {
    for round in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let target = fastrand::usize(1..1500);
        let acked = run_child(tmp.path(), target);

        let data = DataDir::open(tmp.path()).unwrap();
        let snap = data.load_snapshot().unwrap();
        let mut have: HashSet<String> = HashSet::new();
        let through = snap.map(|s| {
            have.extend(
                String::from_utf8(s.state)
                    .unwrap()
                    .lines()
                    .map(str::to_string),
            );
            SegmentId(s.wal_covered.expect("the snapshot records its segments"))
        });
        let in_snapshot = have.len();
        let mut replayed = 0;
        let r = wal::replay(
            tmp.path().join(WAL_DIR),
            identity(),
            through,
            limits(),
            |rec| {
                replayed += 1;
                have.insert(name_of(rec));
            },
        )
        .unwrap();
        eprintln!(
            "round {round}: {} acknowledged, {in_snapshot} in the snapshot (through {through:?}), \
             {replayed} replayed from {} segments, {} torn bytes cut",
            acked.len(),
            r.segments,
            r.torn_bytes
        );
        assert!(acked.len() >= target);
        let lost: Vec<_> = acked.iter().filter(|a| !have.contains(*a)).collect();
        assert!(lost.is_empty(), "round {round}: lost {lost:?}");
        // The cut log replays cleanly the second time.
        let again = wal::replay(
            tmp.path().join(WAL_DIR),
            identity(),
            through,
            limits(),
            |_| {},
        )
        .unwrap();
        assert!(!again.torn);
    }
}

const POOL_CHILD_ENV: &str = "CRPF_WAL_POOL_DIR";
const LOGS: usize = 1000;

/// The threads of this process (entries of `/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// The threads named after the pool's (`crpf-wal-N`).
fn pool_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
            comm.is_ok_and(|c| c.starts_with("crpf-wal-"))
        })
        .count()
}

/// 1,000 open file descriptors at once (a round writes every log's segment before it syncs
/// them): raise the soft limit where it is lower (1024 on many systems).
fn raise_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to fill, then to read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let want = (4 * LOGS as libc::rlim_t).min(lim.rlim_max);
        if lim.rlim_cur < want {
            lim.rlim_cur = want;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

#[test]
#[ignore = "the child process of a_thousand_logs_add_no_threads"]
fn pool_child() {
    let Ok(dir) = std::env::var(POOL_CHILD_ENV) else {
        return;
    };
    raise_open_files();
    let before = threads();
    let pool = wal::WalPool::global().unwrap();
    let with_pool = threads();
    assert_eq!(with_pool, before + pool.threads(), "the pool's threads");

    let dirs: Vec<_> = (0..LOGS)
        .map(|i| Path::new(&dir).join(i.to_string()).join(WAL_DIR))
        .collect();
    let writers: Vec<_> = dirs
        .iter()
        .map(|d| {
            let r = wal::replay(d, identity(), None, limits(), |_| panic!("a new log")).unwrap();
            WalWriter::start(r, identity()).unwrap()
        })
        .collect();
    assert_eq!(threads(), with_pool, "{LOGS} logs open");

    // Interleaved across the logs: three rounds of one append to each.
    let mut pending = Vec::new();
    for round in 0..3 {
        for (i, w) in writers.iter().enumerate() {
            pending.push(w.append(format!("{i}|{round}").into_bytes()));
        }
    }
    for p in pending {
        p.wait().unwrap();
    }
    assert_eq!(threads(), with_pool, "{LOGS} logs written");
    let fsyncs: u64 = writers
        .iter()
        .map(|w| w.stats().fsyncs.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    for w in writers {
        w.close();
    }
    assert_eq!(threads(), with_pool, "{LOGS} logs closed");
    // Named by each thread once it runs: they all served logs by now.
    assert_eq!(pool_threads(), pool.threads());
    for (i, d) in dirs.iter().enumerate() {
        let mut got = Vec::new();
        let _ = wal::replay(d, identity(), None, limits(), |r| got.push(r.to_vec())).unwrap();
        let want: Vec<_> = (0..3).map(|r| format!("{i}|{r}").into_bytes()).collect();
        assert_eq!(got, want, "log {i}");
    }
    println!(
        "POOL OK {} threads for {LOGS} logs, {fsyncs} fsyncs for {} appends",
        pool.threads(),
        3 * LOGS
    );
}

/// DESIGN.md section 8: threads do not grow with the number of filters. Counted in a child
/// process of its own, where no other test starts or ends threads meanwhile.
#[test]
fn a_thousand_logs_add_no_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "pool_child", "--nocapture"])
        .env(POOL_CHILD_ENV, tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("POOL OK"),
        "child: {}\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!(
        "{}",
        stdout.lines().find(|l| l.contains("POOL OK")).unwrap()
    );
}
