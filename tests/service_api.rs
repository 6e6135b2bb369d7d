//! The NATS service API (ADR-32: `$SRV.PING|INFO|STATS`) of replicas against a real
//! `nats-server`, asked from a plain async-nats client: every running replica answers, on the
//! three subjects of each verb, with the JSON of the `io.nats.micro.v1` schemas (checked field
//! by field, and parsed with async-nats's own micro types); INFO lists every operation of the
//! request API on its real subject and queue group; STATS counts the requests each replica
//! served and the errors it answered (with the ADR-32 error headers); a stopped replica no
//! longer answers.

mod nats_harness;
mod replica_common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::service::{NATS_SERVICE_ERROR, NATS_SERVICE_ERROR_CODE};
use crpf::api::{Op, REPLICA_HEADER};
use crpf::replica::service::{InfoResponse, PingResponse, StatsResponse};
use crpf::wire::FilterKind;
use futures::StreamExt;
use nats_harness::NatsServer;
use replica_common::{cfg, start_serving as start};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Publishes a service request on `subject` and gathers answers until `enough` says the ones
/// so far are all that is expected (or the deadline passes: then they are returned as they
/// are, for the caller's assertions to fail on).
async fn gather(
    nc: &async_nats::Client,
    subject: &str,
    enough: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let inbox = nc.new_inbox();
    let mut answers = nc.subscribe(inbox.clone()).await.unwrap();
    nc.publish_with_reply(subject.to_string(), inbox, "".into())
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while !enough(&got) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, answers.next()).await {
            Ok(Some(m)) => got.push(
                serde_json::from_slice(&m.payload)
                    .unwrap_or_else(|e| panic!("{subject}: not JSON ({e}): {:?}", m.payload)),
            ),
            _ => break,
        }
    }
    got
}

/// One answer, from one service instance.
async fn ask(nc: &async_nats::Client, subject: String) -> Value {
    let m = nc
        .request(subject.clone(), "".into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&m.payload).unwrap()
}

/// The `metadata.replica` of each answer.
fn replicas(answers: &[Value]) -> BTreeSet<String> {
    answers
        .iter()
        .map(|a| a["metadata"]["replica"].as_str().unwrap().to_string())
        .collect()
}

/// Checks the fields every answer has (ADR-32), and the crpf identity of the instance.
fn check_identity(v: &Value, kind: &str, filter: &str) {
    for key in ["type", "name", "id", "version", "metadata"] {
        assert!(v.get(key).is_some(), "no `{key}` in {v}");
    }
    assert_eq!(v["type"], format!("io.nats.micro.v1.{kind}_response"));
    assert_eq!(v["name"], format!("crpf-{filter}"));
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(!v["id"].as_str().unwrap().is_empty());
    assert_eq!(v["metadata"]["filter"], filter);
    assert_eq!(v["metadata"]["prefix"], "crpf");
    assert!(v["metadata"]["uuid"].as_str().is_some());
    let name = v["name"].as_str().unwrap();
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{name}"
    );
}

/// A STATS answer's endpoints by name.
fn endpoints(stats: &Value) -> BTreeMap<String, Value> {
    stats["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

fn count(e: &Value, key: &str) -> u64 {
    e[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` not an integer: {e}"))
}

#[actix::test]
async fn every_replica_answers_ping_info_and_stats_with_real_counts() {
    let server = NatsServer::start();
    let url = server.url();
    let mut svc = Vec::new();
    for _ in 0..3 {
        svc.push(start(cfg("svc", FilterKind::OrCuckoo, 10_000, 0.01), &url).await);
    }
    let other = start(cfg("other", FilterKind::GBloom, 10_000, 0.01), &url).await;
    let svc_ids: BTreeSet<String> = svc
        .iter()
        .map(|h| h.identity().replica.to_string())
        .collect();
    let nc = async_nats::connect(&url).await.unwrap();

    // PING: every replica of every filter answers `$SRV.PING`, and only the filter's replicas
    // answer `$SRV.PING.crpf-svc`.
    let all = gather(&nc, "$SRV.PING", |got| got.len() >= 4).await;
    assert_eq!(all.len(), 4, "{all:?}");
    let mut ids = BTreeSet::new();
    for a in &all {
        let filter = a["metadata"]["filter"].as_str().unwrap();
        check_identity(a, "ping", filter);
        assert!(
            ids.insert(a["id"].as_str().unwrap().to_string()),
            "ids unique"
        );
        let typed: async_nats::service::PingResponse =
            serde_json::from_value(a.clone()).expect("async-nats reads the PING answer");
        assert_eq!(typed.kind, "io.nats.micro.v1.ping_response");
        serde_json::from_value::<PingResponse>(a.clone()).unwrap();
    }
    let by_filter = |f: &str| -> Vec<Value> {
        all.iter()
            .filter(|a| a["metadata"]["filter"] == f)
            .cloned()
            .collect()
    };
    assert_eq!(replicas(&by_filter("svc")), svc_ids);
    assert_eq!(by_filter("other").len(), 1);
    assert_eq!(by_filter("other")[0]["metadata"]["kind"], "g_bloom");
    let pings = gather(&nc, "$SRV.PING.crpf-svc", |got| got.len() >= 3).await;
    assert_eq!(replicas(&pings), svc_ids);
    assert!(pings.iter().all(|p| p["name"] == "crpf-svc"), "{pings:?}");

    // The instance of replica `svc[0]`, addressed by its service id.
    let target = svc[0].identity().replica;
    let sid = by_filter("svc")
        .iter()
        .find(|a| a["metadata"]["replica"].as_str() == Some(&target.to_string()))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let ping = ask(&nc, format!("$SRV.PING.crpf-svc.{sid}")).await;
    assert_eq!(ping["id"], sid.as_str());

    // INFO: every operation, on the filter's subject in its queue group and on the replica's
    // own subject.
    for subject in [
        "$SRV.INFO".to_string(),
        "$SRV.INFO.crpf-svc".to_string(),
        format!("$SRV.INFO.crpf-svc.{sid}"),
    ] {
        let infos = gather(&nc, &subject, |got| {
            got.iter().any(|i| i["id"] == sid.as_str())
        })
        .await;
        let info = infos
            .into_iter()
            .find(|i| i["id"] == sid.as_str())
            .unwrap_or_else(|| panic!("{subject}: no answer of {sid}"));
        check_identity(&info, "info", "svc");
        assert!(info["description"].as_str().unwrap().contains("svc"));
        let eps = info["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2 * Op::ALL.len(), "{info}");
        let listed: BTreeMap<&str, (&str, &str)> = eps
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap(),
                    (
                        e["subject"].as_str().unwrap(),
                        e["queue_group"].as_str().unwrap(),
                    ),
                )
            })
            .collect();
        for op in Op::ALL {
            let shared = format!("crpf.svc.api.{op}");
            assert_eq!(listed[op.name()], (shared.as_str(), "crpf.svc.api"));
            let own = format!("crpf.svc.replica.{target}.api.{op}");
            assert_eq!(listed[format!("replica-{op}").as_str()], (own.as_str(), ""));
        }
        let typed: async_nats::service::Info =
            serde_json::from_value(info.clone()).expect("async-nats reads the INFO answer");
        assert_eq!(typed.endpoints.len(), 2 * Op::ALL.len());
        serde_json::from_value::<InfoResponse>(info).unwrap();
    }

    // STATS before.
    let stats_of = |v: Vec<Value>| -> Vec<Value> {
        v.into_iter()
            .filter(|s| s["name"] == "crpf-svc")
            .collect::<Vec<_>>()
    };
    let before = ask(&nc, format!("$SRV.STATS.crpf-svc.{sid}")).await;
    let before = endpoints(&before);
    let (adds0, madds0, madd_errors0) = (
        count(&before["replica-add"], "num_requests"),
        count(&before["replica-madd"], "num_requests"),
        count(&before["replica-madd"], "num_errors"),
    );

    // Requests to the chosen replica: five adds, one malformed batch, one empty item.
    let own = |op: &str| format!("crpf.svc.replica.{target}.api.{op}");
    for i in 0..5 {
        let m = nc
            .request(own("add"), format!("item-{i}").into_bytes().into())
            .await
            .unwrap();
        let headers = m.headers.clone().unwrap_or_default();
        assert!(headers.get(NATS_SERVICE_ERROR).is_none(), "{headers:?}");
    }
    // A frame announcing 100 bytes that holds 5.
    let mut malformed = 100u32.to_le_bytes().to_vec();
    malformed.extend_from_slice(b"short");
    let m = nc
        .request(own("madd"), malformed.into())
        .await
        .expect("an error answer");
    let headers: HeaderMap = m.headers.clone().expect("error headers");
    assert_eq!(
        headers.get(NATS_SERVICE_ERROR_CODE).map(|v| v.as_str()),
        Some("400")
    );
    let text = headers
        .get(NATS_SERVICE_ERROR)
        .unwrap()
        .as_str()
        .to_string();
    assert!(text.starts_with("invalid request"), "{text}");
    assert_eq!(
        headers.get(REPLICA_HEADER).map(|v| v.as_str()),
        Some(target.to_string().as_str())
    );
    // The crpf error body is unchanged.
    let body: Value = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(body["error"], text.as_str());
    let m = nc.request(own("add"), "".into()).await.unwrap();
    assert_eq!(
        m.headers
            .as_ref()
            .and_then(|h| h.get(NATS_SERVICE_ERROR_CODE))
            .map(|v| v.as_str()),
        Some("400")
    );

    let after = ask(&nc, format!("$SRV.STATS.crpf-svc.{sid}")).await;
    check_identity(&after, "stats", "svc");
    for key in ["started", "endpoints"] {
        assert!(after.get(key).is_some(), "no `{key}` in {after}");
    }
    let typed: async_nats::service::Stats =
        serde_json::from_value(after.clone()).expect("async-nats reads the STATS answer");
    assert_eq!(typed.endpoints.len(), 2 * Op::ALL.len());
    serde_json::from_value::<StatsResponse>(after.clone()).unwrap();
    let eps = endpoints(&after);
    for e in eps.values() {
        for key in [
            "name",
            "subject",
            "num_requests",
            "num_errors",
            "last_error",
            "processing_time",
            "average_processing_time",
        ] {
            assert!(e.get(key).is_some(), "no `{key}` in {e}");
        }
    }
    let add = &eps["replica-add"];
    assert_eq!(count(add, "num_requests"), adds0 + 6);
    assert_eq!(count(add, "num_errors"), 1);
    assert!(add["last_error"].as_str().unwrap().starts_with("400:"));
    assert!(count(add, "processing_time") > 0);
    assert_eq!(
        count(add, "average_processing_time"),
        count(add, "processing_time") / count(add, "num_requests")
    );
    let madd = &eps["replica-madd"];
    assert_eq!(count(madd, "num_requests"), madds0 + 1);
    assert_eq!(count(madd, "num_errors"), madd_errors0 + 1);
    let last = typed
        .endpoints
        .iter()
        .find(|e| e.name == "replica-madd")
        .unwrap()
        .last_error
        .clone()
        .expect("async-nats reads the last error");
    assert_eq!(last.code, 400);
    assert!(
        last.status.starts_with("invalid request"),
        "{}",
        last.status
    );
    // Nothing of this reached the filter's shared `add` endpoint.
    assert_eq!(
        count(&eps["add"], "num_requests"),
        count(&before["add"], "num_requests")
    );

    // Requests to the queue group: each counted by the one replica that served it.
    let sum_contains = |stats: &[Value]| -> u64 {
        stats
            .iter()
            .map(|s| count(&endpoints(s)["contains"], "num_requests"))
            .sum()
    };
    let three = |got: &[Value]| stats_of(got.to_vec()).len() >= 3;
    let before = stats_of(gather(&nc, "$SRV.STATS.crpf-svc", three).await);
    assert_eq!(replicas(&before), svc_ids);
    for i in 0..12 {
        let m = nc
            .request(
                "crpf.svc.api.contains",
                format!("item-{i}").into_bytes().into(),
            )
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&m.payload).unwrap();
        assert!(body["contains"].is_boolean(), "{body}");
    }
    // Through `$SRV.STATS` this time (all services), keeping the filter's.
    let after = stats_of(
        gather(&nc, "$SRV.STATS", |got| {
            stats_of(got.to_vec()).len() >= 3 && got.len() >= 4
        })
        .await,
    );
    assert_eq!(replicas(&after), svc_ids);
    assert_eq!(sum_contains(&after), sum_contains(&before) + 12);

    // A stopped replica's instance is gone: its subjects have no responders any more.
    let stopped = svc.pop().unwrap();
    let stopped_id = stopped.identity().replica.to_string();
    stopped.shutdown().await.unwrap();
    let gone = pings
        .iter()
        .find(|p| p["metadata"]["replica"] == stopped_id.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        match nc
            .request(format!("$SRV.PING.crpf-svc.{gone}"), "".into())
            .await
        {
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => break,
            other => {
                assert!(Instant::now() < deadline, "still answering: {other:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    for h in svc.into_iter().chain([other]) {
        h.shutdown().await.unwrap();
    }
}
