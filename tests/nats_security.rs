//! Security against real `nats-server` processes (README, "Security"): the least-privilege
//! users of `configs/nats-server-permissions.conf` (replicas replicate, API clients cannot
//! publish replication traffic), authenticated envelopes (frames unsigned or signed with
//! another key are rejected and counted, even from an authorized publisher), and TLS with a
//! private CA generated here (replicas replicate, plaintext is refused).

mod nats_harness;
mod replica_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crpf::replica::{AnyFilter, Replica, ReplicaConfig, ReplicaHandle};
use crpf::transport::{NatsConfig, NatsTransport, Subjects, TlsConfig, Transport};
use crpf::wire::{
    AuthKeys, Body, CHECKSUM_LEN, Envelope, Expect, FilterKind, HEADER_LEN, WireCodec,
};
use nats_harness::NatsServer;
use replica_common::*;
use uuid::Uuid;
use xxhash_rust::xxh3::xxh3_64;

const WAIT: Duration = Duration::from_secs(60);
const REPLICA_PASSWORD: &str = "replica-secret";
const CLIENT_PASSWORD: &str = "client-secret";

/// The example configuration an operator starts from: the test runs exactly that file.
fn permissions_conf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/nats-server-permissions.conf")
}

fn server_with_users() -> NatsServer {
    NatsServer::with_config(
        &permissions_conf(),
        &[
            ("CRPF_REPLICA_PASSWORD", REPLICA_PASSWORD),
            ("CRPF_CLIENT_PASSWORD", CLIENT_PASSWORD),
        ],
    )
}

fn as_user(url: &str, user: &str, password: &str) -> NatsConfig {
    NatsConfig {
        user: Some(user.into()),
        password: Some(password.into()),
        ..NatsConfig::with_servers([url])
    }
}

async fn transport(cfg: NatsConfig) -> Arc<dyn Transport> {
    Arc::new(
        NatsTransport::connect(cfg)
            .await
            .expect("connect to nats-server"),
    )
}

/// A Bloom filter whose false positives are negligible: "not contained" means "not merged".
fn bloom_cfg(name: &str) -> ReplicaConfig {
    cfg(name, FilterKind::GBloom, 10_000, 1e-9)
}

/// A raw connection with server errors (permission violations) collected.
async fn raw_client(url: &str, user: &str, password: &str) -> (async_nats::Client, Errors) {
    let errors: Errors = Arc::default();
    let sink = errors.clone();
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .event_callback(move |ev| {
            if let async_nats::Event::ServerError(e) = ev {
                sink.lock().unwrap().push(e.to_string());
            }
            futures::future::ready(())
        })
        .connect(url)
        .await
        .expect("connect");
    (client, errors)
}

type Errors = Arc<Mutex<Vec<String>>>;

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A delta frame adding `item` to the filter of `cfg`, as a peer that is not a replica
/// would forge it, encoded by `codec` (signed or not).
fn forged_delta(cfg: &ReplicaConfig, codec: &WireCodec, item: &[u8]) -> Vec<u8> {
    let mut f = AnyFilter::new(&cfg.filter, 99).unwrap();
    f.track_deltas(true);
    f.add(item).unwrap();
    let env = Envelope::new(
        cfg.name.clone(),
        f.kind(),
        f.params_digest(),
        Uuid::new_v4(),
        99,
        1,
        Body::Delta(f.take_delta().unwrap()),
    );
    codec.encode(&env)
}

fn codec(cfg: &ReplicaConfig, keys: Option<AuthKeys>) -> WireCodec {
    let f = AnyFilter::new(&cfg.filter, 0).unwrap();
    WireCodec::new(
        Expect {
            filter: cfg.name.clone(),
            kind: f.kind(),
            params_digest: f.params_digest(),
            generation: 0,
            max_bytes: cfg.max_message_bytes,
        },
        keys,
    )
}

/// Starts a replica; on failure, shows the server's log (permission violations).
async fn start(server: &NatsServer, cfg: ReplicaConfig, t: Arc<dyn Transport>) -> ReplicaHandle {
    Replica::start(cfg, t)
        .await
        .unwrap_or_else(|e| panic!("replica start: {e}\nserver log:\n{}", server.log()))
}

#[actix::test]
async fn replicas_replicate_and_clients_cannot_publish_replication_traffic() {
    let server = server_with_users();
    let url = server.url();
    let cfg = bloom_cfg("perm");
    let subjects = Subjects::new(&cfg.prefix, &cfg.name);
    let data = tempfile::tempdir().unwrap();
    let durable = ReplicaConfig {
        data_dir: Some(data.path().to_path_buf()),
        ..cfg.clone()
    };
    let replica_user = || transport(as_user(&url, "crpf-replica", REPLICA_PASSWORD));
    // The round trip that readiness waits for is within the replica user's permissions.
    replica_user().await.round_trip().await.unwrap();
    let first = start(&server, cfg.clone(), replica_user().await).await;
    let second = start(&server, durable.clone(), replica_user().await).await;
    // Replica ids were claimed in JetStream KV with the replica user's permissions, and a
    // restarted replica gets its id back (reading the claim).
    let id = second.identity();
    assert_ne!(first.identity().replica, id.replica);
    second.shutdown().await.unwrap();
    let second = start(&server, durable, replica_user().await).await;
    assert_eq!(second.identity(), id);
    let hs = vec![first, second];
    for h in &hs {
        assert!(h.wait_ready(WAIT).await);
    }
    hs[0].add(b"from-a".to_vec()).await.unwrap();
    hs[1].add(b"from-b".to_vec()).await.unwrap();
    assert!(converged(&hs, WAIT).await, "replicas did not converge");
    assert!(
        hs.iter()
            .all(|h| h.contains(b"from-a") && h.contains(b"from-b"))
    );

    // The client user uses the API...
    let (client, errors) = raw_client(&url, "crpf-client", CLIENT_PASSWORD).await;
    let reply = client
        .request(subjects.api_subject("add"), "via-api".into())
        .await
        .expect("API request");
    assert_eq!(&reply.payload[..], br#"{"added":true}"#);
    for h in &hs {
        assert!(h.wait_until(WAIT, |f| f.contains(b"via-api")).await);
    }
    // ...and the API of one chosen replica (its subscription is the replica user's too).
    let one = subjects.replica_api_subject(hs[1].identity().replica, "contains");
    let deadline = Instant::now() + WAIT;
    let reply = loop {
        match client.request(one.clone(), "via-api".into()).await {
            Ok(reply) => break reply,
            Err(e) => assert!(Instant::now() < deadline, "{one}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(&reply.payload[..], br#"{"contains":true}"#);
    // ...and finds the replicas through the NATS service API (subscribed by the replica user).
    let ping = format!("$SRV.PING.crpf-{}", cfg.name);
    let reply = client.request(ping.clone(), "".into()).await;
    let reply = reply.unwrap_or_else(|e| panic!("{ping}: {e}"));
    let pong: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(pong["type"], "io.nats.micro.v1.ping_response");
    // ...but its publish of a well-formed delta is refused by the server, and so is listening
    // to replication.
    let frame = forged_delta(&cfg, &codec(&cfg, None), b"injected");
    client
        .publish(subjects.delta.clone(), frame.clone().into())
        .await
        .unwrap();
    let _sub = client
        .subscribe(subjects.replication.clone())
        .await
        .unwrap();
    client.flush().await.unwrap();
    wait_for(
        "the server to refuse the client's publish and subscription",
        || {
            let e = errors.lock().unwrap();
            e.iter()
                .any(|e| e.contains("Permissions Violation for Publish"))
                && e.iter()
                    .any(|e| e.contains("Permissions Violation for Subscription"))
        },
    )
    .await;
    assert!(
        server.log().contains(&format!(
            "Publish Violation - Subject \"{}\"",
            subjects.delta
        )),
        "{}",
        server.log()
    );
    // Published after the refused delta on the same connection, so handled after it would
    // have been delivered.
    client
        .request(subjects.api_subject("add"), "marker".into())
        .await
        .expect("API request");
    for h in &hs {
        assert!(h.wait_until(WAIT, |f| f.contains(b"marker")).await);
        assert!(!h.contains(b"injected"), "a client's delta was merged");
        assert!(h.stats().await.unwrap().rejects.is_empty());
    }

    // The same frame from a replica user is merged: the refusal above was the server's.
    let (peer, peer_errors) = raw_client(&url, "crpf-replica", REPLICA_PASSWORD).await;
    peer.publish(subjects.delta.clone(), frame.into())
        .await
        .unwrap();
    peer.flush().await.unwrap();
    for h in &hs {
        assert!(h.wait_until(WAIT, |f| f.contains(b"injected")).await);
    }
    assert!(peer_errors.lock().unwrap().is_empty());
    stop(&hs).await;
    // Everything a replica does is within its permissions (the example grants enough).
    let log = server.log();
    assert!(
        !log.contains("user:crpf-replica\" - Publish Violation")
            && !log.contains("user:crpf-replica\" - Subscription Violation"),
        "{log}"
    );
}

#[actix::test]
async fn authenticated_envelopes_reject_unsigned_and_wrongly_signed_frames() {
    let server = server_with_users();
    let url = server.url();
    let key = AuthKeys::new([b"the cluster key: 32 bytes or more".to_vec()]).unwrap();
    let wrong = AuthKeys::new([b"another cluster's key, also long".to_vec()]).unwrap();
    let cfg = bloom_cfg("signed").with_auth_keys(key.clone());
    let subjects = Subjects::new(&cfg.prefix, &cfg.name);
    let mut hs = Vec::new();
    for _ in 0..2 {
        let t = transport(as_user(&url, "crpf-replica", REPLICA_PASSWORD)).await;
        hs.push(start(&server, cfg.clone(), t).await);
    }
    futures::join!(
        workload_adds(&hs[0], "a", 300),
        workload_adds(&hs[1], "b", 300)
    );
    assert!(
        converged(&hs, WAIT).await,
        "signed replicas did not converge"
    );
    for h in &hs {
        assert_eq!(h.stats().await.unwrap().rejects.len(), 0);
    }

    // An authorized publisher (the replica user) without the key.
    let (peer, _) = raw_client(&url, "crpf-replica", REPLICA_PASSWORD).await;
    for (item, codec) in [
        (&b"unsigned"[..], codec(&cfg, None)),
        (&b"wrong-key"[..], codec(&cfg, Some(wrong.clone()))),
        (&b"signed"[..], codec(&cfg, Some(key.clone()))),
    ] {
        peer.publish(
            subjects.delta.clone(),
            forged_delta(&cfg, &codec, item).into(),
        )
        .await
        .unwrap();
    }
    peer.flush().await.unwrap();
    for h in &hs {
        // The correctly signed one is merged (the others were sent before it).
        assert!(h.wait_until(WAIT, |f| f.contains(b"signed")).await);
        let deadline = Instant::now() + WAIT;
        while rejects(h, "unsigned").await < 1 || rejects(h, "bad_signature").await < 1 {
            assert!(Instant::now() < deadline, "{:?}", h.stats().await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(rejects(h, "unsigned").await, 1);
        assert_eq!(rejects(h, "bad_signature").await, 1);
        assert!(!h.contains(b"unsigned") && !h.contains(b"wrong-key"));
    }

    // Every attack of issue 27 point 4, unsigned, from the replica user: a delta setting many
    // bits (its items, merged, would all read present), forged senders (digests) to fill the
    // peer slots, a sequence gap of u64::MAX, state requests. None moves any state or counter
    // but `unsigned`.
    let probes: Vec<Vec<u8>> = (0..8_000u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let present = |h: &ReplicaHandle| probes.iter().filter(|p| h.contains(p)).count();
    let before: Vec<_> = futures::future::join_all(hs.iter().map(|h| h.stats()))
        .await
        .into_iter()
        .map(|s| s.unwrap())
        .collect();
    let unsigned = codec(&cfg, None);
    let saturated = {
        let mut f = AnyFilter::new(&cfg.filter, 77).unwrap();
        f.track_deltas(true);
        for p in &probes {
            f.add(p).unwrap();
        }
        f.take_delta().unwrap()
    };
    let frame = |sender: Uuid, seq: u64, body: Body| {
        let env = Envelope::new(
            cfg.name.clone(),
            hs[0].snapshot().kind(),
            hs[0].snapshot().params_digest(),
            sender,
            77,
            seq,
            body,
        );
        unsigned.encode(&env)
    };
    let forger = Uuid::new_v4();
    let mut frames = vec![
        (
            subjects.delta.clone(),
            frame(forger, 1, Body::Delta(saturated)),
        ),
        (
            subjects.state.clone(),
            frame(forger, u64::MAX, Body::StateRequest { target: None }),
        ),
    ];
    for _ in 0..300 {
        let digest = Body::Digest {
            digest: 1,
            ready: true,
            sent: None,
            spacing: None,
        };
        frames.push((subjects.state.clone(), frame(Uuid::new_v4(), 1, digest)));
    }
    let sent = frames.len() as u64;
    for (subject, f) in frames {
        peer.publish(subject, f.into()).await.unwrap();
    }
    peer.flush().await.unwrap();
    for (h, b) in hs.iter().zip(&before) {
        let deadline = Instant::now() + WAIT;
        while rejects(h, "unsigned").await < b.rejects["unsigned"] + sent {
            assert!(Instant::now() < deadline, "{:?}", h.stats().await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let after = h.stats().await.unwrap();
        assert!(present(h) < 10, "the forged delta's items read present");
        assert!(
            after.peers <= b.peers,
            "{} peers, {} before",
            after.peers,
            b.peers
        );
        assert_eq!(after.sequence_gaps, b.sequence_gaps);
        assert_eq!(after.rejects.len(), b.rejects.len(), "{:?}", after.rejects);
    }

    // A replica of another cluster key: both sides reject each other's frames.
    let t = transport(as_user(&url, "crpf-replica", REPLICA_PASSWORD)).await;
    let mut other_cfg = cfg.clone();
    other_cfg.auth_keys = Some(wrong);
    let other = Replica::start(other_cfg, t).await.unwrap();
    other.add(b"other-cluster".to_vec()).await.unwrap();
    other.flush().await.unwrap();
    let deadline = Instant::now() + WAIT;
    while rejects(&other, "bad_signature").await < 1 || rejects(&hs[0], "bad_signature").await < 2 {
        assert!(Instant::now() < deadline, "no bad signatures counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The signed replicas still converge, on their own items only.
    hs[0].add(b"late".to_vec()).await.unwrap();
    assert!(hs[1].wait_until(WAIT, |f| f.contains(b"late")).await);
    assert!(converged(&hs, WAIT).await);
    assert!(hs.iter().all(|h| !h.contains(b"other-cluster")));
    assert!(!other.contains(b"late"));
    other.shutdown().await.unwrap();
    stop(&hs).await;
}

#[actix::test]
async fn a_delta_damaged_in_transit_is_rejected_not_merged() {
    let server = server_with_users();
    let url = server.url();
    let cfg = bloom_cfg("damaged");
    let subjects = Subjects::new(&cfg.prefix, &cfg.name);
    let mut hs = Vec::new();
    for _ in 0..2 {
        let t = transport(as_user(&url, "crpf-replica", REPLICA_PASSWORD)).await;
        hs.push(start(&server, cfg.clone(), t).await);
    }
    // Capture a real delta off the wire.
    let (tap, tap_errors) = raw_client(&url, "crpf-replica", REPLICA_PASSWORD).await;
    let mut deltas = tap.subscribe(subjects.delta.clone()).await.unwrap();
    // A round trip (flush only writes): once the server answers, it has the subscription.
    tap.request("$JS.API.INFO", "".into()).await.unwrap();
    hs[0].add(b"captured".to_vec()).await.unwrap();
    hs[0].flush().await.unwrap();
    let frame = tokio::time::timeout(WAIT, futures::StreamExt::next(&mut deltas))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no delta: {:?}\n{}",
                tap_errors.lock().unwrap(),
                server.log()
            )
        })
        .unwrap()
        .payload
        .to_vec();
    assert!(converged(&hs, WAIT).await);
    let base = hs[1].snapshot();

    // A single flipped bit that, were the frame not checksummed, would decode and set bits.
    let plain = codec(&cfg, None);
    let content_len = frame.len() - CHECKSUM_LEN;
    let damaged = (HEADER_LEN * 8..content_len * 8)
        .find_map(|bit| {
            let mut b = frame.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            let mut resealed = b[..content_len].to_vec();
            resealed.extend_from_slice(&xxh3_64(&resealed).to_le_bytes());
            let Body::Delta(d) = plain.decode(&resealed).ok()?.body else {
                return None;
            };
            let mut f = base.clone();
            f.merge_delta_bytes(&d).ok()?;
            (!f.equivalent(&base)).then_some(b)
        })
        .expect("a bit whose flip changes the state");
    tap.publish(subjects.delta.clone(), damaged.into())
        .await
        .unwrap();
    tap.flush().await.unwrap();
    for h in &hs {
        let deadline = Instant::now() + WAIT;
        while rejects(h, "checksum").await < 1 {
            assert!(Instant::now() < deadline, "{:?}", h.stats().await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            h.snapshot().equivalent(&base),
            "the damaged delta was merged"
        );
    }
    stop(&hs).await;
}

/// `n` adds of `prefix`-named items.
async fn workload_adds(h: &ReplicaHandle, prefix: &str, n: usize) {
    for i in 0..n {
        h.add(format!("{prefix}-{i}").into_bytes()).await.unwrap();
        if i % 32 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// A private CA and a certificate for `127.0.0.1`/`localhost` signed by it, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "crpf test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server-cert.pem"),
        key: dir.join("server-key.pem"),
    };
    std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
    std::fs::write(&pki.cert, cert.pem()).unwrap();
    std::fs::write(&pki.key, key.serialize_pem()).unwrap();
    pki
}

#[actix::test]
async fn tls_replicas_replicate_and_plaintext_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let conf = dir.path().join("tls.conf");
    std::fs::write(
        &conf,
        format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n}}\n",
            pki.cert, pki.key
        ),
    )
    .unwrap();
    let server = NatsServer::with_config(&conf, &[]);
    let url = format!("tls://127.0.0.1:{}", server.port);
    let tls = NatsConfig {
        tls: Some(TlsConfig {
            required: true,
            ca_file: Some(pki.ca.clone()),
            ..TlsConfig::default()
        }),
        ..NatsConfig::with_servers([url.as_str()])
    };
    let cfg = bloom_cfg("tls");
    let mut hs = Vec::new();
    for _ in 0..2 {
        hs.push(
            Replica::start(cfg.clone(), transport(tls.clone()).await)
                .await
                .unwrap(),
        );
    }
    hs[0].add(b"over-tls".to_vec()).await.unwrap();
    assert!(hs[1].wait_until(WAIT, |f| f.contains(b"over-tls")).await);
    assert!(converged(&hs, WAIT).await);

    // Without the private CA, the server's certificate is not trusted.
    let untrusted = NatsConfig {
        connection_timeout_ms: 10_000,
        ..NatsConfig::with_servers([url.as_str()])
    };
    assert!(NatsTransport::connect(untrusted).await.is_err());

    // A plaintext client speaking the protocol gets no service: the server requires TLS and
    // drops the connection instead of answering its PING.
    let answer = tokio::task::spawn_blocking({
        let port = server.port;
        move || plaintext_ping(port)
    })
    .await
    .unwrap();
    assert!(
        answer.info.contains("\"tls_required\":true"),
        "{}",
        answer.info
    );
    assert!(
        !answer.rest.contains("PONG"),
        "plaintext answered: {}",
        answer.rest
    );
    assert!(
        answer.closed,
        "the server kept the plaintext connection open"
    );
    stop(&hs).await;
}

struct PlainAnswer {
    info: String,
    rest: String,
    /// The server closed the connection (rather than the read timing out).
    closed: bool,
}

/// Connects without TLS, sends CONNECT and PING, and reads until the server closes.
fn plaintext_ping(port: u16) -> PlainAnswer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    let _ = s.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n");
    let mut rest = Vec::new();
    // End of stream or a reset: either way the server hung up (a timeout is not that).
    let closed = match reader.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    PlainAnswer {
        info,
        rest: String::from_utf8_lossy(&rest).into_owned(),
        closed,
    }
}
