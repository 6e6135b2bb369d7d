//! What the request API answers, and to whom: a reply's body and headers ([`ApiReply`]),
//! where it goes ([`ReplyTo`]), the reply of a request made in this process
//! ([`ApiResponse`]), and who waits for an update's acknowledgement level ([`Responder`]).
//! Shared by the actor and the subscription tasks that answer requests without it.

use bytes::Bytes;
use serde_json::json;
use tokio::sync::oneshot;

use crate::api::batch;
use crate::api::{ERROR_HEADER, FAILED_HEADER, REPLICA_HEADER, REPLY_HEADER, ReplyFormat};
use crate::replica::ReplicaError;
use crate::replica::service::{
    SERVICE_ERROR_CODE_HEADER, SERVICE_ERROR_HEADER, Served, ServiceError,
};
use crate::transport::Message;
use crate::{Dot, ReplicaId};

/// Longest error text carried in a reply header (the JSON body has no such bound).
const MAX_ERROR_HEADER: usize = 256;

/// What a request is answered with once it succeeded (an error is always JSON).
pub(crate) struct ApiReply {
    payload: Bytes,
    /// A bitmap rather than JSON: flagged by [`REPLY_HEADER`] in the reply.
    bitmap: bool,
    /// The first error of a partly failed `madd`, for [`ERROR_HEADER`].
    error: Option<String>,
    /// The refused items of a `madd` whose bitmap says which items were new, for
    /// [`FAILED_HEADER`].
    failed: Option<String>,
    /// An error answer: for the service API's error headers and counts.
    failure: Option<ServiceError>,
    /// The request it answers, counted on its service endpoint once sent.
    pub(super) served: Option<Served>,
}

impl ApiReply {
    pub(super) fn json(body: &serde_json::Value) -> Self {
        ApiReply {
            payload: serde_json::to_vec(body).expect("JSON serialize").into(),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
            served: None,
        }
    }

    /// Bytes as they are (`export`: a filter in another library's format).
    pub(super) fn raw(body: Vec<u8>) -> Self {
        ApiReply {
            payload: body.into(),
            ..Self::fixed(b"")
        }
    }

    /// A JSON body known at compile time: the single operations' answers, without serializing.
    pub(super) fn fixed(body: &'static [u8]) -> Self {
        ApiReply {
            payload: Bytes::from_static(body),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
            served: None,
        }
    }

    /// The answer of `contains`.
    pub(super) fn contains(found: bool) -> Self {
        Self::fixed(if found {
            b"{\"contains\":true}"
        } else {
            b"{\"contains\":false}"
        })
    }

    /// Names the refused items of a batch (none: no header).
    pub(super) fn with_failed(mut self, failed: &[usize]) -> Self {
        if !failed.is_empty() {
            let list: Vec<String> = failed.iter().map(usize::to_string).collect();
            self.failed = Some(list.join(","));
        }
        self
    }

    pub(super) fn bitmap(bits: &[bool], error: Option<String>) -> Self {
        ApiReply {
            payload: batch::encode_bitmap(bits.iter().copied()).into(),
            bitmap: true,
            error,
            failed: None,
            failure: None,
            served: None,
        }
    }
}

/// Where the reply of a request goes.
pub(crate) enum ReplyTo {
    /// A NATS reply subject.
    Subject(String),
    /// The caller of [`crate::replica::ReplicaHandle::request`], in this process.
    InProcess(oneshot::Sender<ApiResponse>),
}

/// The reply of a request of the API made in this process
/// ([`crate::replica::ReplicaHandle::request`]): what a NATS requester would receive.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    /// The reply's headers ([`REPLICA_HEADER`], [`REPLY_HEADER`] for a bitmap,
    /// [`ERROR_HEADER`], and the service API's error headers on an error reply).
    pub headers: async_nats::HeaderMap,
    /// The body: JSON, or a bitmap where the headers say so.
    pub payload: Bytes,
}

impl ApiResponse {
    /// The error of an error reply (the service API's `Nats-Service-Error` header).
    pub fn error(&self) -> Option<&str> {
        self.headers.get(SERVICE_ERROR_HEADER).map(|v| v.as_str())
    }

    /// Whether the body is a bitmap ([`crate::api::batch::decode_bitmap`]) rather than JSON.
    pub fn is_bitmap(&self) -> bool {
        self.headers
            .get(REPLY_HEADER)
            .is_some_and(|v| v.as_str() == ReplyFormat::Bitmap.name())
    }
}

impl ApiReply {
    /// Counts the request on its service endpoint, and makes the reply (where to, headers
    /// naming `replica`, payload) if the request wants one.
    pub(super) fn finish(
        mut self,
        replica: ReplicaId,
        reply: Option<ReplyTo>,
    ) -> Option<(ReplyTo, async_nats::HeaderMap, Bytes)> {
        // Served even without a reply subject (a request published without one).
        if let Some(served) = self.served.take() {
            served.finish(self.failure.as_ref());
        }
        let to = reply?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(REPLICA_HEADER, replica.to_string());
        if self.bitmap {
            headers.insert(REPLY_HEADER, ReplyFormat::Bitmap.name());
        }
        if let Some(e) = &self.error {
            headers.insert(ERROR_HEADER, header_text(e));
        }
        if let Some(failed) = &self.failed {
            headers.insert(FAILED_HEADER, failed.as_str());
        }
        if let Some(f) = &self.failure {
            headers.insert(SERVICE_ERROR_HEADER, f.text.as_str());
            headers.insert(SERVICE_ERROR_CODE_HEADER, f.code.to_string());
        }
        Some((to, headers, self.payload))
    }
}

/// The error answer to a request.
pub(super) fn failure_reply(e: &ReplicaError) -> ApiReply {
    let mut body = ApiReply::json(&json!({"error": e.to_string()}));
    body.failure = Some(ServiceError {
        code: service_code(e),
        text: header_text(&e.to_string()),
    });
    body
}

/// Who gets the answer of an update waiting for its acknowledgement level.
pub(crate) enum Responder {
    /// A request of the API: the reply subject and the reply of a success.
    Api {
        reply: Option<ReplyTo>,
        body: ApiReply,
    },
    /// A [`crate::replica::ReplicaHandle`] call.
    Handle {
        tx: oneshot::Sender<Result<Option<Dot>, ReplicaError>>,
        dot: Option<Dot>,
    },
}

/// The reply format a batch request asks for in its `Crpf-Reply` header (JSON by default).
pub(super) fn api_reply_format(msg: &Message) -> Result<ReplyFormat, ReplicaError> {
    match msg.headers.as_ref().and_then(|h| h.get(REPLY_HEADER)) {
        None => Ok(ReplyFormat::Json),
        Some(v) => v.as_str().parse().map_err(ReplicaError::InvalidItem),
    }
}

/// The ADR-32 code of an error answer, HTTP-like: what the request did wrong (400), what the
/// replica cannot do now (503), what was not confirmed in time (504), a full filter (507), and
/// the replica's own failures (500).
fn service_code(e: &ReplicaError) -> u16 {
    use crate::FilterError;
    match e {
        ReplicaError::InvalidItem(_)
        | ReplicaError::NotRemovable(_)
        | ReplicaError::NotCounting(_) => 400,
        ReplicaError::Filter(FilterError::Full { .. } | FilterError::NoRoom { .. }) => 507,
        ReplicaError::AckUnavailable(_)
        | ReplicaError::Stopped
        | ReplicaError::Transport(_)
        | ReplicaError::TagsUnreserved
        | ReplicaError::Busy
        | ReplicaError::NotServing
        | ReplicaError::ClockAhead { .. }
        | ReplicaError::IdRetired { .. } => 503,
        ReplicaError::NotReplicated { .. } => 504,
        ReplicaError::UnknownFilter(_) => 404,
        ReplicaError::Config(_)
        | ReplicaError::Filter(_)
        | ReplicaError::Durable(_)
        | ReplicaError::NotDurable(_)
        | ReplicaError::ImportStopped { .. } => 500,
    }
}

/// The text an error reply to a request carries for `e` (its `Nats-Service-Error`), and
/// whether its code says the filter was full: for a caller that answers in this process
/// without an [`ApiResponse`] (the RESP front end's hot path).
pub(crate) fn error_of(e: &ReplicaError) -> (String, bool) {
    (header_text(&e.to_string()), service_code(e) == 507)
}

/// An error message fit for a header value: one line, bounded.
fn header_text(e: &str) -> String {
    e.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_ERROR_HEADER)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_is_one_bounded_line() {
        assert_eq!(header_text("a\r\nb"), "a  b");
        assert_eq!(header_text(&"x".repeat(1000)).len(), MAX_ERROR_HEADER);
    }
}
