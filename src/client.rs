//! A typed client of the request API over [`async_nats`] (README, "Client").
//!
//! [`Client`] sends requests on the subjects of [`Subjects`]: to any ready replica of a filter
//! (the queue group) or, after [`Client::replica`], to one chosen replica. The batch operations
//! frame their items with [`crate::api::batch`] and ask for bitmap replies by default (see
//! [`Client::with_reply_format`]). Any NATS client in any language can do the same: the client
//! is a convenience, not a requirement.
//!
//! ```no_run
//! use crpf::client::Client;
//! use crpf::replica::AckLevel;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let sessions = Client::new(nats, "crpf", "sessions");
//! sessions.add("session-42", None).await?;
//! // One request, one commit: fsynced on the answering replica before the reply.
//! let added = sessions
//!     .madd(["session-43", "session-44"], Some(AckLevel::Durable))
//!     .await?;
//! assert!(added.all());
//! let found = sessions.mcontains(["session-42", "session-43"]).await?;
//! assert_eq!(found, [true, true]);
//! assert!(sessions.remove("session-42", None).await?);
//! // What replica 1 alone holds and says.
//! let stats = sessions.replica(1).stats().await?;
//! assert_eq!(stats.replica, 1);
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{HeaderMap, RequestErrorKind};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::ReplicaId;
use crate::api::batch::{self, BatchError};
use crate::api::{
    ACK_HEADER, ERROR_HEADER, FORMAT_HEADER, Op, REPLICA_HEADER, REPLY_HEADER, ReplyFormat,
};
use crate::replica::{AckLevel, ReplicaStats};
use crate::transport::Subjects;

/// How long a request waits for its reply unless [`Client::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Attempts a read makes unless [`Client::with_read_attempts`] says otherwise.
pub const DEFAULT_READ_ATTEMPTS: u32 = 3;

/// Replicas remembered as having answered, for reads sent again after a timeout.
const REMEMBERED_REPLICAS: usize = 16;

/// What a request can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// NATS could not carry the request (disconnected, payload over `max_payload`...).
    #[error("request on {subject}: {source}")]
    Transport {
        /// The request's subject.
        subject: String,
        /// What async-nats said.
        #[source]
        source: async_nats::RequestError,
    },
    /// Nobody serves the subject: no ready replica of the filter, or no replica of that id.
    /// (Where nodes follow the filter catalog, their subscriptions hear a replica's own
    /// subjects of every name: a replica nobody hosts then shows as [`ClientError::Timeout`].)
    #[error("no replica answers on {subject}")]
    NoResponders {
        /// The request's subject.
        subject: String,
    },
    /// No reply in time.
    #[error("no reply on {subject} within {timeout:?}")]
    Timeout {
        /// The request's subject.
        subject: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// The replica answered with an error (`{"error": "..."}`): a malformed request, an
    /// operation the filter does not support, an acknowledgement level not reached (the
    /// update may still be applied; see [`crate::replica::ReplicaError`]).
    #[error("replica error: {message}")]
    Server {
        /// The replica's message.
        message: String,
        /// The replica that answered (reply header `Crpf-Replica`).
        replica: Option<ReplicaId>,
    },
    /// A reply that is not what the operation answers.
    #[error("unexpected reply on {subject}: {reason}")]
    BadReply {
        /// The request's subject.
        subject: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An item that the batch framing cannot carry (over 4 GiB).
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// The reply of [`Client::madd`]. Each item is added entirely or not at all; the items that
/// could not be added (a full cuckoo filter...) do not make the request fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchAdd {
    /// Per item, in the order sent: whether it was added.
    pub added: Vec<bool>,
    /// Why some were not (the first error), if any.
    pub error: Option<String>,
}

impl BatchAdd {
    /// Items added.
    pub fn count(&self) -> usize {
        self.added.iter().filter(|a| **a).count()
    }

    /// Whether every item was added.
    pub fn all(&self) -> bool {
        self.added.iter().all(|a| *a)
    }
}

/// A client of one filter's request API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    nats: async_nats::Client,
    subjects: Subjects,
    replica: Option<ReplicaId>,
    timeout: Duration,
    format: ReplyFormat,
    read_attempts: u32,
    /// Replicas that answered, the latest first (shared by clones).
    answered: Arc<Mutex<VecDeque<ReplicaId>>>,
}

impl Client {
    /// A client of the filter whose key is `key` (any bytes, as RESP takes it: its subject
    /// name is [`crate::names::subject_name`]), under subject prefix `prefix`.
    pub fn for_key(nats: async_nats::Client, prefix: &str, key: impl AsRef<[u8]>) -> Self {
        Self::new(nats, prefix, &crate::names::subject_name(key.as_ref()))
    }

    /// A client of filter `filter` (its subject name, [`crate::names`]: a plain name is its
    /// own) under subject prefix `prefix` (`crpf` by default on the replicas), answered by
    /// any ready replica.
    pub fn new(nats: async_nats::Client, prefix: &str, filter: &str) -> Self {
        Client {
            nats,
            subjects: Subjects::new(prefix, filter),
            replica: None,
            timeout: DEFAULT_TIMEOUT,
            format: ReplyFormat::Bitmap,
            read_attempts: DEFAULT_READ_ATTEMPTS,
            answered: Arc::default(),
        }
    }

    /// The same client, answered by replica `id` alone (`<...>.replica.<id>.api.<op>`).
    pub fn replica(&self, id: ReplicaId) -> Self {
        Client {
            replica: Some(id),
            ..self.clone()
        }
    }

    /// The same client, answered by any ready replica again.
    pub fn any_replica(&self) -> Self {
        Client {
            replica: None,
            ..self.clone()
        }
    }

    /// The replica it targets, if one.
    pub fn target(&self) -> Option<ReplicaId> {
        self.replica
    }

    /// How long each request waits for its reply.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Attempts of a read (`contains`, `mcontains`, `count`, `mcount`, `stats`) sent to any
    /// replica (default [`DEFAULT_READ_ATTEMPTS`]): each waits `timeout / attempts`, and
    /// after a timeout the read goes again, at once, to any replica and to every replica that
    /// answered this client lately; the first answer wins. So a replica that stopped
    /// answering (stopped, overloaded, cut off: NATS keeps routing to it until its connection
    /// drops) costs a read one attempt, not its answer. Reads are safe to repeat; updates are
    /// never sent twice. 1: no second attempt. A client of one replica ([`Client::replica`])
    /// makes one attempt.
    pub fn with_read_attempts(mut self, attempts: u32) -> Self {
        self.read_attempts = attempts.max(1);
        self
    }

    /// The reply format the batch operations ask for: [`ReplyFormat::Bitmap`] (the default:
    /// one bit per item) or [`ReplyFormat::Json`]. The results are the same.
    pub fn with_reply_format(mut self, format: ReplyFormat) -> Self {
        self.format = format;
        self
    }

    /// The subject of `op` for this client's target.
    pub fn subject(&self, op: Op) -> String {
        match self.replica {
            Some(id) => self.subjects.replica_api_subject(id, op.name()),
            None => self.subjects.api_subject(op.name()),
        }
    }

    /// Adds `item`, acknowledged at `ack` (`None`: the replica's default level).
    pub async fn add(
        &self,
        item: impl AsRef<[u8]>,
        ack: Option<AckLevel>,
    ) -> Result<(), ClientError> {
        #[derive(Deserialize)]
        struct Reply {
            added: bool,
        }
        let r: Reply = self.single(Op::Add, item.as_ref(), ack).await?;
        self.expect(r.added, Op::Add, "`added` is false")
    }

    /// Removes `item` (OR kinds); `false` if it was not contained.
    pub async fn remove(
        &self,
        item: impl AsRef<[u8]>,
        ack: Option<AckLevel>,
    ) -> Result<bool, ClientError> {
        #[derive(Deserialize)]
        struct Reply {
            removed: bool,
        }
        let r: Reply = self.single(Op::Remove, item.as_ref(), ack).await?;
        Ok(r.removed)
    }

    /// Whether the filter contains `item` (false positives possible, no false negatives for
    /// what the answering replica has merged).
    pub async fn contains(&self, item: impl AsRef<[u8]>) -> Result<bool, ClientError> {
        #[derive(Deserialize)]
        struct Reply {
            contains: bool,
        }
        let r: Reply = self.single(Op::Contains, item.as_ref(), None).await?;
        Ok(r.contains)
    }

    /// The multiplicity of an item (counting kinds: `counting_cuckoo`; the others answer an
    /// error).
    pub async fn count(&self, item: impl AsRef<[u8]>) -> Result<u64, ClientError> {
        #[derive(Deserialize)]
        struct Reply {
            count: u64,
        }
        let r: Reply = self.single(Op::Count, item.as_ref(), None).await?;
        Ok(r.count)
    }

    /// The multiplicity of every item, in one request (counting kinds).
    pub async fn mcount<I>(&self, items: I) -> Result<Vec<u64>, ClientError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let op = Op::MCount;
        let mut payload = Vec::new();
        let mut n = 0;
        for item in items {
            batch::encode_into(&mut payload, n, item.as_ref())?;
            n += 1;
        }
        let reply = self.read(op, payload.into(), None).await?;
        let value = self.json(op, &reply)?;
        let counts = value
            .get("count")
            .and_then(|v| serde_json::from_value::<Vec<u64>>(v.clone()).ok())
            .ok_or_else(|| self.bad(op, "no list of counts".into()))?;
        if counts.len() != n {
            return Err(self.bad(op, format!("{} counts for {n} items", counts.len())));
        }
        Ok(counts)
    }

    /// The answering replica's figures.
    pub async fn stats(&self) -> Result<ReplicaStats, ClientError> {
        self.single(Op::Stats, b"", None).await
    }

    /// Merges `filter`, in the Go library's `format` ([`crate::GoFormat`]), into the filter
    /// (a `go_bloom` filter of the same `m` and `k`; others are refused, naming both).
    pub async fn import(
        &self,
        format: crate::GoFormat,
        filter: impl Into<Bytes>,
    ) -> Result<(), ClientError> {
        self.import_at(format, filter, None).await
    }

    /// As [`Client::import`], answered at `ack` (`None`: the filter's default level): at
    /// `replicated`, once peers confirmed the delta it made (README, "Acknowledgement
    /// levels").
    pub async fn import_at(
        &self,
        format: crate::GoFormat,
        filter: impl Into<Bytes>,
        ack: Option<AckLevel>,
    ) -> Result<(), ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(FORMAT_HEADER, format.name());
        if let Some(level) = ack {
            headers.insert(crate::api::ACK_HEADER, level.name());
        }
        let reply = self
            .request(Op::Import, filter.into(), Some(headers))
            .await?;
        let value = self.json(Op::Import, &reply)?;
        let ok = value.get("imported") == Some(&serde_json::Value::Bool(true));
        self.expect(ok, Op::Import, "no `imported`")
    }

    /// The filter (`go_bloom`) in the Go library's `format` ([`crate::GoFormat`]).
    pub async fn export(&self, format: crate::GoFormat) -> Result<Vec<u8>, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(FORMAT_HEADER, format.name());
        let reply = self.read(Op::Export, Bytes::new(), Some(headers)).await?;
        // An error is the one JSON answer with the service API's error header.
        if header(&reply, crate::replica::service::SERVICE_ERROR_HEADER).is_some() {
            self.json(Op::Export, &reply)?;
        }
        Ok(reply.payload.to_vec())
    }

    /// Adds every item in one request, one commit and one acknowledgement at `ack`.
    pub async fn madd<I>(&self, items: I, ack: Option<AckLevel>) -> Result<BatchAdd, ClientError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let (added, error) = self.batch(Op::MAdd, items, ack).await?;
        Ok(BatchAdd { added, error })
    }

    /// Removes every item in one request (OR kinds): per item, whether it was contained.
    pub async fn mremove<I>(
        &self,
        items: I,
        ack: Option<AckLevel>,
    ) -> Result<Vec<bool>, ClientError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        Ok(self.batch(Op::MRemove, items, ack).await?.0)
    }

    /// Per item, in one request: whether the filter contains it.
    pub async fn mcontains<I>(&self, items: I) -> Result<Vec<bool>, ClientError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        Ok(self.batch(Op::MContains, items, None).await?.0)
    }

    /// Sends a raw request of `op`: the reply as it came (the tests use it for malformed
    /// payloads; applications rarely need it).
    pub async fn request(
        &self,
        op: Op,
        payload: Bytes,
        headers: Option<HeaderMap>,
    ) -> Result<async_nats::Message, ClientError> {
        self.send(self.subject(op), payload, headers, self.timeout)
            .await
    }

    /// A read: sent again after a timeout (see [`Client::with_read_attempts`]).
    async fn read(
        &self,
        op: Op,
        payload: Bytes,
        headers: Option<HeaderMap>,
    ) -> Result<async_nats::Message, ClientError> {
        if self.replica.is_some() || self.read_attempts <= 1 {
            return self.request(op, payload, headers).await;
        }
        let wait = self.timeout / self.read_attempts;
        let any = self.subject(op);
        for attempt in 1..=self.read_attempts {
            // The first attempt goes to any replica; after a timeout (which replica took it is
            // unknown), to every replica that answered lately as well, at once.
            let mut subjects = vec![any.clone()];
            if attempt > 1 {
                let answered = self.answered.lock().expect("client lock").clone();
                subjects.extend(
                    answered
                        .into_iter()
                        .map(|id| self.subjects.replica_api_subject(id, op.name())),
                );
            }
            let sends = subjects
                .into_iter()
                .map(|s| Box::pin(self.send(s, payload.clone(), headers.clone(), wait)));
            match futures::future::select_ok(sends).await {
                Ok((reply, _)) => return Ok(reply),
                Err(ClientError::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::Timeout {
            subject: any,
            timeout: self.timeout,
        })
    }

    async fn send(
        &self,
        subject: String,
        payload: Bytes,
        headers: Option<HeaderMap>,
        timeout: Duration,
    ) -> Result<async_nats::Message, ClientError> {
        let mut request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(timeout));
        if let Some(h) = headers {
            request = request.headers(h);
        }
        let reply = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|source| match source.kind() {
                RequestErrorKind::TimedOut => ClientError::Timeout { subject, timeout },
                RequestErrorKind::NoResponders => ClientError::NoResponders { subject },
                _ => ClientError::Transport { subject, source },
            })?;
        if let Some(id) = header(&reply, REPLICA_HEADER).and_then(|r| r.parse::<ReplicaId>().ok()) {
            let mut answered = self.answered.lock().expect("client lock");
            if answered.front() != Some(&id) {
                answered.retain(|r| *r != id);
                answered.push_front(id);
                answered.truncate(REMEMBERED_REPLICAS);
            }
        }
        Ok(reply)
    }

    async fn single<T: DeserializeOwned>(
        &self,
        op: Op,
        item: &[u8],
        ack: Option<AckLevel>,
    ) -> Result<T, ClientError> {
        let payload = Bytes::copy_from_slice(item);
        let reply = if op.is_update() {
            self.request(op, payload, ack_headers(ack)).await?
        } else {
            self.read(op, payload, ack_headers(ack)).await?
        };
        let value = self.json(op, &reply)?;
        serde_json::from_value(value).map_err(|e| self.bad(op, format!("{e}")))
    }

    async fn batch<I>(
        &self,
        op: Op,
        items: I,
        ack: Option<AckLevel>,
    ) -> Result<(Vec<bool>, Option<String>), ClientError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut payload = Vec::new();
        let mut n = 0;
        for item in items {
            batch::encode_into(&mut payload, n, item.as_ref())?;
            n += 1;
        }
        let mut headers = ack_headers(ack).unwrap_or_default();
        if self.format == ReplyFormat::Bitmap {
            headers.insert(REPLY_HEADER, ReplyFormat::Bitmap.name());
        }
        let reply = if op.is_update() {
            self.request(op, payload.into(), Some(headers)).await?
        } else {
            self.read(op, payload.into(), Some(headers)).await?
        };
        if header(&reply, REPLY_HEADER) == Some(ReplyFormat::Bitmap.name()) {
            let bits =
                batch::decode_bitmap(&reply.payload, n).map_err(|e| self.bad(op, e.to_string()))?;
            let error = header(&reply, ERROR_HEADER).map(str::to_string);
            return Ok((bits, error));
        }
        // JSON: asked for, or an error reply.
        let value = self.json(op, &reply)?;
        let bits = match op {
            Op::MAdd => {
                #[derive(Deserialize)]
                struct Reply {
                    added: usize,
                    #[serde(default)]
                    failed: Vec<usize>,
                    error: Option<String>,
                }
                let r: Reply =
                    serde_json::from_value(value).map_err(|e| self.bad(op, e.to_string()))?;
                let mut bits = vec![true; n];
                for i in r.failed {
                    *bits
                        .get_mut(i)
                        .ok_or_else(|| self.bad(op, format!("failed item {i} of {n}")))? = false;
                }
                let added = bits.iter().filter(|b| **b).count();
                if added != r.added {
                    return Err(self.bad(op, format!("{} added, {added} by `failed`", r.added)));
                }
                return Ok((bits, r.error));
            }
            Op::MRemove => value.get("removed"),
            _ => value.get("contains"),
        }
        .and_then(|v| serde_json::from_value::<Vec<bool>>(v.clone()).ok())
        .ok_or_else(|| self.bad(op, "no list of results".into()))?;
        if bits.len() != n {
            return Err(self.bad(op, format!("{} results for {n} items", bits.len())));
        }
        Ok((bits, None))
    }

    /// The JSON of a reply; an `{"error": ...}` is the replica's error.
    fn json(&self, op: Op, reply: &async_nats::Message) -> Result<serde_json::Value, ClientError> {
        let value: serde_json::Value = serde_json::from_slice(&reply.payload)
            .map_err(|e| self.bad(op, format!("not JSON: {e}")))?;
        if let Some(message) = value.get("error") {
            return Err(ClientError::Server {
                message: message
                    .as_str()
                    .map_or_else(|| message.to_string(), str::to_string),
                replica: header(reply, REPLICA_HEADER).and_then(|r| r.parse().ok()),
            });
        }
        Ok(value)
    }

    fn expect(&self, ok: bool, op: Op, reason: &str) -> Result<(), ClientError> {
        if ok {
            Ok(())
        } else {
            Err(self.bad(op, reason.into()))
        }
    }

    fn bad(&self, op: Op, reason: String) -> ClientError {
        ClientError::BadReply {
            subject: self.subject(op),
            reason,
        }
    }
}

fn ack_headers(ack: Option<AckLevel>) -> Option<HeaderMap> {
    ack.map(|level| {
        let mut h = HeaderMap::new();
        h.insert(ACK_HEADER, level.name());
        h
    })
}

fn header<'a>(reply: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    reply
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}
