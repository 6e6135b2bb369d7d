//! The NATS edge of the request API: a NATS request (subject, headers, payload) read as a
//! typed [`Request`] ([`nats_request`]), and a [`Response`] or an error written as the reply's
//! body and headers ([`ApiReply`]); where an answer goes ([`ReplyTo`]: a NATS subject or a
//! caller in this process, who gets the typed answer) and who waits for an update's
//! acknowledgement level ([`Responder`]). Headers and JSON exist only here. Shared by the
//! actor and the subscription tasks that answer requests without it.

use bytes::Bytes;
use serde_json::json;
use tokio::sync::oneshot;

use crate::api::batch::{self, Limits};
use crate::api::{
    ACK_HEADER, ADD_MODE_HEADER, AckLevel, AddMode, AddOutcome, ERROR_HEADER, FAILED_HEADER,
    FORMAT_HEADER, Items, Op, REPLICA_HEADER, REPLY_HEADER, ReplyFormat, Request, Response,
};
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
}

impl ApiReply {
    fn json(body: &serde_json::Value) -> Self {
        ApiReply {
            payload: serde_json::to_vec(body).expect("JSON serialize").into(),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
        }
    }

    /// Bytes as they are (`export`: a filter in another library's format).
    fn raw(body: Vec<u8>) -> Self {
        ApiReply {
            payload: body.into(),
            ..Self::fixed(b"")
        }
    }

    /// A JSON body known at compile time: the single operations' answers, without serializing.
    fn fixed(body: &'static [u8]) -> Self {
        ApiReply {
            payload: Bytes::from_static(body),
            bitmap: false,
            error: None,
            failed: None,
            failure: None,
        }
    }

    /// The answer of `contains`.
    fn contains(found: bool) -> Self {
        Self::fixed(if found {
            b"{\"contains\":true}"
        } else {
            b"{\"contains\":false}"
        })
    }

    /// Names the refused items of a batch (none: no header).
    fn with_failed(mut self, failed: &[usize]) -> Self {
        if !failed.is_empty() {
            let list: Vec<String> = failed.iter().map(usize::to_string).collect();
            self.failed = Some(list.join(","));
        }
        self
    }

    fn bitmap(bits: &[bool], error: Option<String>) -> Self {
        ApiReply {
            payload: batch::encode_bitmap(bits.iter().copied()).into(),
            bitmap: true,
            error,
            failed: None,
            failure: None,
        }
    }
}

/// Where the answer of a request goes.
pub(crate) enum ReplyTo {
    /// A NATS requester: the reply subject (none: the request wants no reply), the format
    /// of a batch's answer, and the request's count on its service endpoint.
    Nats {
        subject: Option<String>,
        format: ReplyFormat,
        served: Option<Served>,
    },
    /// A caller in this process ([`crate::replica::ReplicaHandle::call`]): the typed answer.
    InProcess(oneshot::Sender<Result<Response, ReplicaError>>),
}

impl ApiReply {
    /// The body and headers of `response` to a NATS request, a batch's in `format`.
    pub(super) fn of(response: Response, format: ReplyFormat) -> ApiReply {
        let json_or_bitmap = |field: &str, bits: &[bool]| match format {
            ReplyFormat::Json => ApiReply::json(&json!({ field: bits })),
            ReplyFormat::Bitmap => ApiReply::bitmap(bits, None),
        };
        match response {
            Response::Added { mode, outcome } => ApiReply::fixed(match (mode, outcome) {
                (AddMode::Always, _) => b"{\"added\":true}",
                (_, AddOutcome::New) => b"{\"added\":true,\"new\":true}",
                (_, AddOutcome::Known) => b"{\"added\":true,\"new\":false}",
                (_, AddOutcome::Skipped) => b"{\"added\":false,\"new\":false}",
            }),
            Response::Removed(true) => ApiReply::fixed(b"{\"removed\":true}"),
            Response::Removed(false) => ApiReply::fixed(b"{\"removed\":false}"),
            Response::Contains(found) => ApiReply::contains(found),
            Response::Count(n) => ApiReply::json(&json!({ "count": n })),
            Response::MAdded(added) => match format {
                ReplyFormat::Json => {
                    let mut body = json!({"added": added.count()});
                    if added.mode != AddMode::Always {
                        body["new"] = json!(added.new_items);
                    }
                    if let Some(e) = &added.error {
                        body["failed"] = json!(added.failed);
                        body["error"] = json!(e);
                    }
                    ApiReply::json(&body)
                }
                ReplyFormat::Bitmap if added.mode == AddMode::Always => {
                    ApiReply::bitmap(&added.added, added.error)
                }
                // Zeros mean "already there" too: the refused items are named.
                ReplyFormat::Bitmap => ApiReply::bitmap(&added.new_items, added.error.clone())
                    .with_failed(&added.failed),
            },
            Response::MRemoved(removed) => json_or_bitmap("removed", &removed),
            Response::MContains(found) => json_or_bitmap("contains", &found),
            Response::MCount(counts) => ApiReply::json(&json!({ "count": counts })),
            Response::Stats(stats) => ApiReply::json(&stats),
            Response::Imported => ApiReply::fixed(b"{\"imported\":true}"),
            Response::Exported(bytes) => ApiReply::raw(bytes),
            Response::CmsIncremented(counts) | Response::CmsCount(counts) => {
                ApiReply::json(&json!({ "count": counts }))
            }
            Response::CmsInfo {
                width,
                depth,
                count,
            } => ApiReply::json(&json!({"width": width, "depth": depth, "count": count})),
            Response::TopkAdded(expelled) => {
                let lossy = |e: Vec<u8>| String::from_utf8_lossy(&e).into_owned();
                let expelled: Vec<Option<String>> =
                    expelled.into_iter().map(|e| e.map(lossy)).collect();
                ApiReply::json(&json!({ "expelled": expelled }))
            }
            Response::TopkQueried { listed, counts } => {
                ApiReply::json(&json!({ "listed": listed, "count": counts }))
            }
            Response::TopkList { items, .. } => {
                let (items, counts): (Vec<String>, Vec<u64>) = items
                    .into_iter()
                    .map(|(i, n)| (String::from_utf8_lossy(&i).into_owned(), n))
                    .unzip();
                ApiReply::json(&json!({ "items": items, "count": counts }))
            }
            Response::TopkInfo {
                k,
                width,
                depth,
                decay,
            } => ApiReply::json(&json!({"k": k, "width": width, "depth": depth, "decay": decay})),
            Response::TdigestUpdated => ApiReply::json(&json!({"ok": true})),
            // JSON has no NaN or infinity: null.
            Response::TdigestValues(values) => ApiReply::json(&json!({ "values": values })),
            Response::TdigestInfo {
                compression,
                observations,
                centroids,
                writers,
                bounds,
            } => ApiReply::json(&json!({
                "compression": compression,
                "observations": observations,
                "centroids": centroids,
                "writers": writers,
                "min": bounds.0,
                "max": bounds.1,
            })),
        }
    }

    /// The reply to a NATS request answered `result`, a batch's in `format`.
    pub(super) fn of_result(result: Result<Response, ReplicaError>, format: ReplyFormat) -> Self {
        match result {
            Ok(response) => ApiReply::of(response, format),
            Err(e) => failure_reply(&e),
        }
    }

    /// Counts the request on its service endpoint, and makes the reply (subject, headers
    /// naming `replica`, payload) if the request wants one.
    pub(super) fn finish(
        self,
        replica: ReplicaId,
        served: Option<Served>,
        subject: Option<String>,
    ) -> Option<(String, async_nats::HeaderMap, Bytes)> {
        // Served even without a reply subject (a request published without one).
        if let Some(served) = served {
            served.finish(self.failure.as_ref());
        }
        let to = subject?;
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
    /// A request of the API: where the answer goes, and the answer of a success.
    Api { reply: ReplyTo, response: Response },
    /// A [`crate::replica::ReplicaHandle`] call.
    Handle {
        tx: oneshot::Sender<Result<Option<Dot>, ReplicaError>>,
        dot: Option<Dot>,
    },
}

/// The request of NATS request `msg`, whose subject ends in operation `op` (`None`: no
/// operation; `api_root`: the subject without one, for the error), and the format its
/// answer is asked in; batches are checked against `limits`. What the headers say is read
/// here and nowhere else.
pub(crate) fn nats_request(
    op: Option<&str>,
    api_root: &str,
    msg: &Message,
    limits: Limits,
) -> Result<(Request, ReplyFormat), ReplicaError> {
    let op = match op.unwrap_or("") {
        "" => {
            return Err(ReplicaError::InvalidItem(format!(
                "no operation: send to {api_root}.<{}>",
                Op::ALL.map(Op::name).join("|")
            )));
        }
        op => op.parse::<Op>().map_err(ReplicaError::InvalidItem)?,
    };
    let ack = match op.is_update() || op == Op::Import {
        true => header(msg, ACK_HEADER)?,
        false => None::<AckLevel>,
    };
    let format = match op.is_batch() {
        true => header(msg, REPLY_HEADER)?.unwrap_or_default(),
        false => ReplyFormat::Json,
    };
    let mode = || header(msg, ADD_MODE_HEADER).map(Option::unwrap_or_default);
    if op == Op::MCount && format != ReplyFormat::Json {
        return Err(ReplicaError::InvalidItem(
            "mcount replies in JSON only (its counts are not bits)".into(),
        ));
    }
    let items = || {
        Items::framed(msg.payload.clone(), limits)
            .map_err(|e| ReplicaError::InvalidItem(e.to_string()))
    };
    let go_format = || header(msg, FORMAT_HEADER).map(|f| f.unwrap_or(crate::GoFormat::Binary));
    let item = msg.payload.clone();
    let request = match op {
        Op::Add => Request::Add {
            mode: mode()?,
            item,
            ack,
        },
        Op::Remove => Request::Remove { item, ack },
        Op::Contains => Request::Contains { item },
        Op::Count => Request::Count { item },
        Op::MAdd => Request::MAdd {
            mode: mode()?,
            items: items()?,
            ack,
        },
        Op::MRemove => Request::MRemove {
            items: items()?,
            ack,
        },
        Op::MContains => Request::MContains { items: items()? },
        Op::MCount => Request::MCount { items: items()? },
        Op::Stats => Request::Stats,
        Op::Import => Request::Import {
            format: go_format()?,
            filter: item,
            ack,
        },
        Op::Export => Request::Export {
            format: go_format()?,
        },
        Op::CmsIncrBy => crate::replica::sketch::incr_by_request(items()?, ack)?,
        Op::CmsQuery => Request::CmsQuery { items: items()? },
        Op::CmsInfo => Request::CmsInfo,
        Op::TopkAdd => {
            let items = items()?;
            Request::TopkAdd {
                increments: vec![1; items.len()],
                items,
                ack,
            }
        }
        Op::TopkQuery => Request::TopkQuery { items: items()? },
        Op::TopkList => Request::TopkList { with_count: true },
        Op::TopkInfo => Request::TopkInfo,
        Op::TdigestAdd => Request::TdigestAdd {
            values: crate::replica::tdigest::numbers(&items()?, "a value")?
                .into_iter()
                .map(|v| (v, 1))
                .collect(),
            bounds: None,
            ack,
        },
        Op::TdigestReset => Request::TdigestReset { ack },
        Op::TdigestQuantile => Request::TdigestQuantile {
            quantiles: crate::replica::tdigest::numbers(&items()?, "a quantile")?,
        },
        Op::TdigestCdf => Request::TdigestCdf {
            values: crate::replica::tdigest::numbers(&items()?, "a value")?,
        },
        Op::TdigestInfo => Request::TdigestInfo,
    };
    Ok((request, format))
}

/// The value of header `name` of `msg`, if it has one.
fn header<T: std::str::FromStr<Err = String>>(
    msg: &Message,
    name: &str,
) -> Result<Option<T>, ReplicaError> {
    match msg.headers.as_ref().and_then(|h| h.get(name)) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .parse()
            .map(Some)
            .map_err(ReplicaError::InvalidItem),
    }
}

/// The ADR-32 code of an error answer, HTTP-like: what the request did wrong (400), what the
/// replica cannot do now (503), what was not confirmed in time (504), a full filter (507), and
/// the replica's own failures (500).
fn service_code(e: &ReplicaError) -> u16 {
    use crate::FilterError;
    match e {
        ReplicaError::InvalidItem(_)
        | ReplicaError::Overflow(_)
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
        ReplicaError::ImportTooLarge { .. } => 413,
        ReplicaError::Config(_)
        | ReplicaError::Filter(_)
        | ReplicaError::Durable(_)
        | ReplicaError::NotDurable(_)
        | ReplicaError::ImportStopped { .. } => 500,
    }
}

/// The text an error reply to a request carries for `e` (its `Nats-Service-Error`), and
/// whether its code says the filter was full: for a caller in this process that answers in
/// its own protocol (the RESP front end).
pub(crate) fn error_of(e: &ReplicaError) -> (String, bool) {
    (header_text(&e.to_string()), service_code(e) == 507)
}

/// An error message fit for a header value: one line, bounded.
pub(crate) fn header_text(e: &str) -> String {
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
