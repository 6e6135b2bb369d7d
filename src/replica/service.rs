//! The NATS service API of a replica (NATS ADR-32, "NATS micro"): discovery and monitoring
//! requests on `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS`, each also as `$SRV.<VERB>.<name>`
//! and `$SRV.<VERB>.<name>.<id>`, answered with the JSON of the `io.nats.micro.v1` schemas, so
//! that `nats micro ls|info|stats` and any other micro tooling find the replicas of a filter.
//!
//! Every replica that serves the request API is one instance of the service `crpf-<filter>`
//! (version: the crate's), with a fresh id per start and metadata naming the filter, its kind
//! and the replica. Its endpoints are the operations of the request API ([`crate::api::Op`])
//! on their real subjects: `<prefix>.<filter>.api.<op>` in the queue group
//! `<prefix>.<filter>.api`, named `<op>`, and `<prefix>.<filter>.replica.<id>.api.<op>`
//! without a queue group, named `replica-<op>`. The replica keeps their statistics itself
//! (the request API reaches its actor through the [`crate::transport::Transport`], not through
//! async-nats's service endpoints): a request counts once it is answered, as an error if the
//! answer is one (it then carries the ADR-32 headers [`SERVICE_ERROR_HEADER`] and
//! [`SERVICE_ERROR_CODE_HEADER`]); its processing time runs from the moment the replica takes
//! it up to its answer, waiting for its acknowledgement level included. A request without a
//! known operation is answered with an error but belongs to no endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ReplicaId;
use crate::api::Op;
use crate::transport::Subjects;
use crate::wire::FilterKind;

/// The subject prefix of the service API.
pub const SERVICE_PREFIX: &str = "$SRV";

/// Reply header of an error answer (ADR-32): the error's text.
pub const SERVICE_ERROR_HEADER: &str = async_nats::service::NATS_SERVICE_ERROR;

/// Reply header of an error answer (ADR-32): an HTTP-like status code (400: a bad request,
/// 500: the replica failed, 503: unavailable, 504: not confirmed in time, 507: filter full).
pub const SERVICE_ERROR_CODE_HEADER: &str = async_nats::service::NATS_SERVICE_ERROR_CODE;

/// `type` of a `PING` answer.
pub const PING_RESPONSE: &str = "io.nats.micro.v1.ping_response";
/// `type` of an `INFO` answer.
pub const INFO_RESPONSE: &str = "io.nats.micro.v1.info_response";
/// `type` of a `STATS` answer.
pub const STATS_RESPONSE: &str = "io.nats.micro.v1.stats_response";

/// The service name of the replicas of `filter`: `crpf-<filter>` (filter names are subject
/// tokens, which are valid service names).
pub fn service_name(filter: &str) -> String {
    format!("{SERVICE_NAME_PREFIX}{filter}")
}

/// What [`service_name`] puts before the filter's name.
pub const SERVICE_NAME_PREFIX: &str = "crpf-";

/// The answer to `$SRV.PING` (`io.nats.micro.v1.ping_response`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingResponse {
    /// [`PING_RESPONSE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The service name, shared by every replica of the filter.
    pub name: String,
    /// This instance's id.
    pub id: String,
    /// The crate's version.
    pub version: String,
    /// `filter`, `kind`, `prefix`, `replica`, `uuid`.
    pub metadata: BTreeMap<String, String>,
}

/// The answer to `$SRV.INFO` (`io.nats.micro.v1.info_response`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoResponse {
    /// [`INFO_RESPONSE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The service name.
    pub name: String,
    /// This instance's id.
    pub id: String,
    /// The crate's version.
    pub version: String,
    /// As in [`PingResponse::metadata`].
    pub metadata: BTreeMap<String, String>,
    /// What the service is.
    pub description: String,
    /// The endpoints.
    pub endpoints: Vec<EndpointInfo>,
}

/// An endpoint in an `INFO` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointInfo {
    /// `<op>` or `replica-<op>`.
    pub name: String,
    /// The subject it answers on.
    pub subject: String,
    /// Its queue group; empty for the subjects of one replica, which have none.
    pub queue_group: String,
    /// `op` (the operation) and `payload` (`item`, `batch` or `none`).
    pub metadata: BTreeMap<String, String>,
}

/// The answer to `$SRV.STATS` (`io.nats.micro.v1.stats_response`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsResponse {
    /// [`STATS_RESPONSE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The service name.
    pub name: String,
    /// This instance's id.
    pub id: String,
    /// The crate's version.
    pub version: String,
    /// As in [`PingResponse::metadata`].
    pub metadata: BTreeMap<String, String>,
    /// When this instance started (RFC 3339, UTC).
    pub started: String,
    /// The endpoints' statistics, in the order of [`InfoResponse::endpoints`].
    pub endpoints: Vec<EndpointStats>,
}

/// An endpoint's statistics in a `STATS` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointStats {
    /// As in [`EndpointInfo::name`].
    pub name: String,
    /// As in [`EndpointInfo::subject`].
    pub subject: String,
    /// As in [`EndpointInfo::queue_group`].
    pub queue_group: String,
    /// Requests answered.
    pub num_requests: u64,
    /// Of which answered with an error.
    pub num_errors: u64,
    /// The last error, `<code>:<text>`; empty if none.
    pub last_error: String,
    /// Nanoseconds spent on the requests, in total.
    pub processing_time: u64,
    /// Nanoseconds per request.
    pub average_processing_time: u64,
    /// The endpoint's own statistics: none (`null`). Present because micro clients (nats-py)
    /// read the key.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// An error answer's ADR-32 code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceError {
    pub code: u16,
    pub text: String,
}

#[derive(Debug, Default)]
struct Counts {
    requests: u64,
    errors: u64,
    last_error: Option<Box<str>>,
    processing: Duration,
}

/// One replica's service instance: its identity and its endpoints' statistics. Shared by the
/// actor and the tasks answering requests, which count them, and the task answering `$SRV`
/// requests. Compact: what an answer describes (metadata, endpoints, their subjects) is made
/// when asked for, and the statistics exist from the first request on (a node of 100,000
/// filters, most never asked, kept 14 KB of strings per filter here).
#[derive(Debug)]
pub(crate) struct ApiService {
    filter: String,
    prefix: String,
    kind: FilterKind,
    replica: ReplicaId,
    uuid: Uuid,
    /// This instance's id (unique per instance, ADR-32: a restarted replica is a new one).
    id: Uuid,
    started: time::OffsetDateTime,
    subjects: Arc<Subjects>,
    /// Per endpoint ([`Op::ALL`] on the filter's subjects, then on this replica's), once a
    /// request was counted.
    counts: std::sync::OnceLock<Box<[Mutex<Counts>]>>,
}

/// A request being served: counted on its endpoint by [`Served::finish`].
#[derive(Debug)]
pub(crate) struct Served {
    service: Arc<ApiService>,
    endpoint: Option<usize>,
    since: Instant,
}

impl Served {
    /// Counts the request, answered now, with `error` if the answer is one.
    pub(crate) fn finish(self, error: Option<&ServiceError>) {
        let Some(i) = self.endpoint else { return };
        let counts = self
            .service
            .counts
            .get_or_init(|| (0..2 * Op::ALL.len()).map(|_| Mutex::default()).collect());
        let mut c = counts[i].lock().expect("service counts lock");
        c.requests += 1;
        c.processing += self.since.elapsed();
        if let Some(e) = error {
            c.errors += 1;
            c.last_error = Some(format!("{}:{}", e.code, e.text).into());
        }
    }
}

/// The verbs of the service API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Ping,
    Info,
    Stats,
}

impl ApiService {
    /// The instance of replica `replica` (`uuid`) of `filter`, a filter of `kind` on
    /// `subjects` under `prefix`.
    pub(crate) fn new(
        subjects: &Arc<Subjects>,
        prefix: &str,
        filter: &str,
        kind: FilterKind,
        replica: ReplicaId,
        uuid: Uuid,
    ) -> Self {
        ApiService {
            filter: filter.to_string(),
            prefix: prefix.to_string(),
            kind,
            replica,
            uuid,
            id: Uuid::new_v4(),
            started: time::OffsetDateTime::now_utc(),
            subjects: subjects.clone(),
            counts: std::sync::OnceLock::new(),
        }
    }

    /// The service name.
    pub(crate) fn name(&self) -> String {
        service_name(&self.filter)
    }

    /// This instance's id.
    pub(crate) fn id(&self) -> String {
        self.id.simple().to_string()
    }

    /// The subscriptions that hear every service request for this instance: the verbs to all
    /// services, to this service, and to this instance (each `*` one verb).
    pub(crate) fn subscriptions(&self) -> [String; 3] {
        let name = self.name();
        [
            format!("{SERVICE_PREFIX}.*"),
            format!("{SERVICE_PREFIX}.*.{name}"),
            format!("{SERVICE_PREFIX}.*.{name}.{}", self.id()),
        ]
    }

    /// Starts counting a request of the request API on `subject` (on no endpoint if it names
    /// no known operation).
    pub(crate) fn serve(self: &Arc<Self>, subject: &str) -> Served {
        let endpoint = self.subjects.api_target(subject).and_then(|(replica, op)| {
            let i = Op::ALL.iter().position(|o| o.name() == op)?;
            Some(if replica.is_some() {
                Op::ALL.len() + i
            } else {
                i
            })
        });
        Served {
            service: self.clone(),
            endpoint,
            since: Instant::now(),
        }
    }

    /// The JSON answer to a service request on `subject`; `None` if it is not one for this
    /// instance (another service's, an unknown verb).
    pub(crate) fn answer(&self, subject: &str) -> Option<Bytes> {
        let mut tokens = subject.split('.');
        if tokens.next() != Some(SERVICE_PREFIX) {
            return None;
        }
        let verb = match tokens.next()? {
            "PING" => Verb::Ping,
            "INFO" => Verb::Info,
            "STATS" => Verb::Stats,
            _ => return None,
        };
        let rest: Vec<&str> = tokens.collect();
        let named =
            |name: &str| name.strip_prefix(SERVICE_NAME_PREFIX) == Some(self.filter.as_str());
        let mine = match rest[..] {
            [] => true,
            [name] => named(name),
            [name, id] => {
                named(name) && id == self.id.simple().encode_lower(&mut Uuid::encode_buffer())
            }
            _ => false,
        };
        if !mine {
            return None;
        }
        let json = match verb {
            Verb::Ping => serde_json::to_vec(&self.ping()),
            Verb::Info => serde_json::to_vec(&self.info()),
            Verb::Stats => serde_json::to_vec(&self.stats()),
        };
        Some(json.expect("service answers serialize").into())
    }

    /// `filter`, `kind`, `prefix`, `replica`, `uuid`.
    fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("filter".to_string(), self.filter.clone()),
            ("kind".to_string(), self.kind.name().to_string()),
            ("prefix".to_string(), self.prefix.clone()),
            ("replica".to_string(), self.replica.to_string()),
            ("uuid".to_string(), self.uuid.to_string()),
        ])
    }

    /// The endpoints, in their order: [`Op::ALL`] on the filter's subjects (in its queue
    /// group), then on this replica's (in none).
    fn endpoints(&self) -> impl Iterator<Item = EndpointInfo> + '_ {
        let endpoint = |name: String, subject: String, queue_group: String, op: Op| {
            let payload = match op {
                Op::Stats
                | Op::Export
                | Op::CmsInfo
                | Op::TopkList
                | Op::TopkInfo
                | Op::TdigestReset
                | Op::TdigestInfo => "none",
                Op::CmsIncrBy
                | Op::CmsQuery
                | Op::TopkAdd
                | Op::TopkQuery
                | Op::TdigestAdd
                | Op::TdigestQuantile
                | Op::TdigestCdf => "batch",
                Op::Import => "filter",
                op if op.is_batch() => "batch",
                _ => "item",
            };
            EndpointInfo {
                name,
                subject,
                queue_group,
                metadata: BTreeMap::from([
                    ("op".to_string(), op.name().to_string()),
                    ("payload".to_string(), payload.to_string()),
                ]),
            }
        };
        let shared = Op::ALL.into_iter().map(move |op| {
            endpoint(
                op.name().to_string(),
                self.subjects.api_subject(op.name()),
                self.subjects.api_queue.clone(),
                op,
            )
        });
        let own = Op::ALL.into_iter().map(move |op| {
            endpoint(
                format!("replica-{}", op.name()),
                self.subjects.replica_api_subject(self.replica, op.name()),
                String::new(),
                op,
            )
        });
        shared.chain(own)
    }

    fn ping(&self) -> PingResponse {
        PingResponse {
            kind: PING_RESPONSE.into(),
            name: self.name(),
            id: self.id(),
            version: env!("CARGO_PKG_VERSION").into(),
            metadata: self.metadata(),
        }
    }

    fn info(&self) -> InfoResponse {
        InfoResponse {
            kind: INFO_RESPONSE.into(),
            name: self.name(),
            id: self.id(),
            version: env!("CARGO_PKG_VERSION").into(),
            metadata: self.metadata(),
            description: format!(
                "crpf replicated {} filter `{}`, replica {}",
                self.kind.name(),
                self.filter,
                self.replica
            ),
            endpoints: self.endpoints().collect(),
        }
    }

    fn stats(&self) -> StatsResponse {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let counts = self.counts.get();
        let endpoints = self
            .endpoints()
            .enumerate()
            .map(|(i, e)| {
                let c = counts.map(|c| c[i].lock().expect("service counts lock"));
                let (requests, errors, processing) =
                    c.as_ref().map_or((0, 0, Duration::ZERO), |c| {
                        (c.requests, c.errors, c.processing)
                    });
                EndpointStats {
                    name: e.name,
                    subject: e.subject,
                    queue_group: e.queue_group,
                    num_requests: requests,
                    num_errors: errors,
                    last_error: c
                        .as_ref()
                        .and_then(|c| c.last_error.as_deref())
                        .unwrap_or_default()
                        .to_string(),
                    processing_time: nanos(processing),
                    average_processing_time: match requests {
                        0 => 0,
                        n => nanos(processing / u32::try_from(n).unwrap_or(u32::MAX)),
                    },
                    data: serde_json::Value::Null,
                }
            })
            .collect();
        StatsResponse {
            kind: STATS_RESPONSE.into(),
            name: self.name(),
            id: self.id(),
            version: env!("CARGO_PKG_VERSION").into(),
            metadata: self.metadata(),
            started: started_text(self.started),
            endpoints,
        }
    }
}

/// `started` as micro clients parse it: RFC 3339 in UTC with exactly six fractional digits
/// (nats-py reads it with `%Y-%m-%dT%H:%M:%S.%fZ`, which takes at most six, and needs them).
fn started_text(t: time::OffsetDateTime) -> String {
    let format = time::format_description::parse_borrowed::<1>(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z",
    )
    .expect("a valid format description");
    t.to_offset(time::UtcOffset::UTC)
        .format(&format)
        .expect("every UTC time formats")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn started_has_six_fractional_digits() {
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_789).unwrap();
        assert_eq!(started_text(t), "2023-11-14T22:13:20.123456Z");
        let whole = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(started_text(whole), "2023-11-14T22:13:20.000000Z");
    }

    fn service() -> Arc<ApiService> {
        let subjects = Arc::new(Subjects::new("crpf", "users"));
        Arc::new(ApiService::new(
            &subjects,
            "crpf",
            "users",
            FilterKind::OrCuckoo,
            3,
            Uuid::nil(),
        ))
    }

    fn json(b: Option<Bytes>) -> serde_json::Value {
        serde_json::from_slice(&b.expect("an answer")).unwrap()
    }

    #[test]
    fn answers_its_verbs_on_all_three_subjects_only() {
        let s = service();
        let id = s.id().to_string();
        for verb in ["PING", "INFO", "STATS"] {
            for subject in [
                format!("$SRV.{verb}"),
                format!("$SRV.{verb}.crpf-users"),
                format!("$SRV.{verb}.crpf-users.{id}"),
            ] {
                let v = json(s.answer(&subject));
                assert_eq!(
                    v["type"],
                    format!("io.nats.micro.v1.{}_response", verb.to_lowercase())
                );
                assert_eq!(v["name"], "crpf-users");
                assert_eq!(v["id"], id.as_str());
                assert_eq!(v["metadata"]["replica"], "3");
            }
            for other in [
                format!("$SRV.{verb}.crpf-other"),
                format!("$SRV.{verb}.crpf-users.someone-else"),
                format!("$SRV.{verb}.crpf-users.{id}.x"),
            ] {
                assert_eq!(s.answer(&other), None, "{other}");
            }
        }
        assert_eq!(s.answer("$SRV.SCHEMA"), None);
        assert_eq!(s.answer("$SRVX.PING"), None);
        // Each start is a new instance.
        assert_ne!(service().id(), id);
    }

    #[test]
    fn counts_requests_on_their_endpoints() {
        let s = service();
        s.serve("crpf.users.api.add").finish(None);
        s.serve("crpf.users.api.add").finish(Some(&ServiceError {
            code: 400,
            text: "bad".into(),
        }));
        s.serve("crpf.users.replica.3.api.mcontains").finish(None);
        // No endpoint: not counted anywhere.
        s.serve("crpf.users.api.bogus").finish(None);
        s.serve("crpf.users.api").finish(None);
        let stats = s.stats();
        let by_name: BTreeMap<&str, &EndpointStats> = stats
            .endpoints
            .iter()
            .map(|e| (e.name.as_str(), e))
            .collect();
        let add = by_name["add"];
        assert_eq!((add.num_requests, add.num_errors), (2, 1));
        assert_eq!(add.last_error, "400:bad");
        assert_eq!(add.subject, "crpf.users.api.add");
        assert_eq!(add.queue_group, "crpf.users.api");
        let own = by_name["replica-mcontains"];
        assert_eq!((own.num_requests, own.num_errors), (1, 0));
        assert_eq!(own.subject, "crpf.users.replica.3.api.mcontains");
        assert_eq!(own.queue_group, "");
        let total: u64 = stats.endpoints.iter().map(|e| e.num_requests).sum();
        assert_eq!(total, 3);
        assert_eq!(stats.endpoints.len(), 2 * Op::ALL.len());
        assert!(
            time::OffsetDateTime::parse(
                &stats.started,
                &time::format_description::well_known::Rfc3339
            )
            .is_ok(),
            "{}",
            stats.started
        );
    }
}
