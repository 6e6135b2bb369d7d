//! What the benchmark examples share: a loopback `nats-server` with JetStream.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running server, stopped when dropped.
pub(crate) struct Server(std::process::Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `$CRPF_NATS_SERVER` (or `.tools/nats/bin/nats-server`) on a free loopback port;
/// returns it and its URL.
pub(crate) fn start_server() -> (Server, String) {
    let bin = std::env::var_os("CRPF_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/nats/bin/nats-server")
        });
    assert!(
        bin.exists(),
        "no nats-server at {bin:?}: run scripts/test.sh --no-run first"
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Server(child, dir), format!("nats://127.0.0.1:{port}"))
}

/// The `q`-quantile of sorted values.
#[allow(dead_code)] // not every example reports quantiles
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}
