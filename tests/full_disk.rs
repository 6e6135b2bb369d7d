//! A full disk is not permanent (issue 27, point 2): with the data directory on a 2 MiB tmpfs,
//! `durable` adds fail with a clear error once the disk is full, and succeed again soon after
//! space returns, without a restart; every add acknowledged before, during and after is in
//! a crash image of the data directory taken then.
//!
//! Mounting a tmpfs needs root, as CI and the developers' machines run.
#![cfg(feature = "node")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crpf::replica::{Replica, ReplicaConfig, ReplicaError};
use crpf::transport::InProcessBus;
use crpf::wire::FilterKind;

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fills the file system of `dir` with a file of its own; returns the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    path
}

#[actix::test]
async fn durable_adds_succeed_again_once_a_full_disk_has_room() {
    let disk = Tmpfs::mount("2m");
    let data = disk.path().join("filter");
    let mut cfg = ReplicaConfig::for_kind("disk", FilterKind::OrCuckoo, 10_000, 0.01).fast();
    cfg.data_dir = Some(data.clone());
    let replica = Replica::start(cfg.clone(), Arc::new(InProcessBus::new()))
        .await
        .unwrap();
    let mut acked = Vec::new();
    let mut next = 0u32;
    let add = |item: u32| {
        let r = replica.clone();
        async move { r.add(format!("item-{item}").into_bytes()).await }
    };
    for _ in 0..100 {
        add(next).await.unwrap();
        acked.push(next);
        next += 1;
    }

    // The disk fills up: adds fail, saying why, and change nothing that was acknowledged.
    let filler = fill(disk.path());
    let mut failure = None;
    for _ in 0..10_000 {
        match add(next).await {
            Ok(_) => acked.push(next),
            Err(e) => {
                failure = Some(e);
                next += 1;
                break;
            }
        }
        next += 1;
    }
    let failure = failure.expect("adds fail once the disk is full");
    assert!(
        matches!(&failure, ReplicaError::NotDurable(m) if m.contains("No space left")),
        "{failure}"
    );
    // Still failing while the disk is full (nothing restarts the writer meanwhile).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(add(next).await.is_err());
    next += 1;

    // Space returns: adds succeed again without a restart.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    loop {
        match add(next).await {
            Ok(_) => {
                acked.push(next);
                next += 1;
                break;
            }
            Err(e) => {
                assert!(
                    freed.elapsed() < Duration::from_secs(60),
                    "adds still fail 60 s after space returned: {e}"
                );
                next += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    eprintln!(
        "durable adds succeed again {:.2} s after space returned",
        freed.elapsed().as_secs_f64()
    );
    for _ in 0..100 {
        add(next).await.unwrap();
        acked.push(next);
        next += 1;
    }

    // A crash image of the data directory now: every acknowledged add is in it.
    let image = tempfile::tempdir().unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(image.path())
        .status()
        .unwrap();
    assert!(status.success());
    let mut restored_cfg = cfg;
    restored_cfg.data_dir = Some(image.path().join("filter"));
    let restored = Replica::start(restored_cfg, Arc::new(InProcessBus::new()))
        .await
        .unwrap();
    let missing: Vec<u32> = acked
        .iter()
        .copied()
        .filter(|i| !restored.contains(format!("item-{i}").as_bytes()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged adds missing after restoring: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    restored.shutdown().await.unwrap();
    replica.shutdown().await.unwrap();
}
