//! The filter catalog's request API over NATS, for any client: `<prefix>.$catalog.create`,
//! `.drop`, `.list` and `.info`, in the queue group `<prefix>.$catalog` (any node answers).
//! Requests and replies are JSON, with the request API's error convention (`{"error":"..."}`):
//!
//! | subject | request | reply |
//! |---|---|---|
//! | `.create` | `{"name":"n","filter":{"kind":"g_bloom","capacity":1000,"fpr":0.01}}` | `{"created":true,"name":"n","subject_name":"n","generation":7,"filter":{...}}` (`false`: it existed with this spec) |
//! | `.drop` | `{"name":"n"}` or the bare name | `{"dropped":true,"generation":7}` (`false`: no such filter) |
//! | `.info` | `{"name":"n"}` or the bare name | the entry: `name`, `subject_name`, `filter`, `generation`, `created_ms`, and `expires_ms` if it expires |
//! | `.expire` | `{"name":"n","expires_ms":1767225600000}` (ms since the epoch; `null`: never, as `PERSIST`) or `{"name":"n","ttl_ms":86400000}` | the entry with its new expiry, `{"dropped":true}` for a time past (as `EXPIRE` with one), or an error for no such filter |
//! | `.list` | empty, or `{"after":"n","limit":100}` | `{"filters":[entry, ...],"more":false}`: by subject name, at most 1,000 (`limit`) after the subject name `after`; `more` if there are further ones |
//!
//! `name` is the key, any UTF-8 string of at most 1 KiB; a key that is not UTF-8 is given
//! as `{"subject_name":...}` instead ([`crate::names`]), which every answer carries too.
//!
//! A create or drop is answered once the answering node has applied it (other nodes follow
//! within their watcher's delay).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::host::{HostError, Node};
use crate::FilterSpec;
use crate::transport::{CatalogEntry, Message, Transport, serve_subscription};

/// The catalog API's subjects under `prefix`: `<prefix>.$catalog.<op>`.
pub fn catalog_subject(prefix: &str, op: &str) -> String {
    format!("{prefix}.$catalog.{op}")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    subject_name: Option<String>,
    filter: FilterSpec,
}

/// A filter named by its key or by its subject name ([`crate::names`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    subject_name: Option<String>,
}

impl NameRequest {
    /// The subject name.
    fn subject_name(self) -> Result<String, Value> {
        match (self.name, self.subject_name) {
            (Some(key), None) => Ok(crate::names::subject_name(key.as_bytes()).into_owned()),
            (None, Some(name)) if crate::names::is_subject_name(&name) => Ok(name),
            (None, Some(name)) => Err(error(format!(
                "invalid request: `{name}` is no subject name"
            ))),
            _ => Err(error(
                "invalid request: give either `name` (the key) or `subject_name`",
            )),
        }
    }
}

/// An `expire`: a time, or a time from now.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpireRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    subject_name: Option<String>,
    /// Absent or `null` (without `ttl_ms`): no expiry.
    #[serde(default)]
    expires_ms: Option<u64>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

/// A page of `list`: the entries named after `after`, at most `limit` of them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListRequest {
    #[serde(default)]
    after: Option<String>,
    #[serde(default = "default_page")]
    limit: usize,
}

/// Entries per `list` reply by default, and at most: 1,000 entries of about 120 bytes stay
/// well under nats-server's 1 MiB `max_payload`.
const PAGE: usize = 1_000;

fn default_page() -> usize {
    PAGE
}

fn list_request(payload: &[u8]) -> Result<ListRequest, Value> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(ListRequest {
            after: None,
            limit: PAGE,
        });
    }
    let r: ListRequest = serde_json::from_slice(payload).map_err(|e| {
        error(format!(
            "invalid request: {e} (expected {{\"after\":...,\"limit\":...}})"
        ))
    })?;
    if r.limit == 0 || r.limit > PAGE {
        return Err(error(format!("invalid request: limit must be 1 to {PAGE}")));
    }
    Ok(r)
}

fn entry_json(e: &CatalogEntry) -> Value {
    let mut v = json!({
        "name": crate::names::display_key(&e.name),
        "subject_name": e.name,
        "filter": e.spec,
        "generation": e.generation,
        "created_ms": e.created_ms,
    });
    if let Some(at) = e.expires_ms {
        v["expires_ms"] = at.into();
    }
    v
}

fn error(text: impl std::fmt::Display) -> Value {
    json!({ "error": text.to_string() })
}

/// The subject name of the filter a drop or info request names: JSON `{"name":...}` (or
/// `{"subject_name":...}`) or the bare key.
fn name_of(payload: &[u8]) -> Result<String, Value> {
    if payload.first() == Some(&b'{') {
        serde_json::from_slice::<NameRequest>(payload)
            .map_err(|e| error(format!("invalid request: {e}")))?
            .subject_name()
    } else {
        std::str::from_utf8(payload)
            .map(|s| crate::names::subject_name(s.trim().as_bytes()).into_owned())
            .map_err(|_| error("invalid request: the name is not UTF-8"))
    }
}

async fn answer(node: &Node, op: &str, payload: &[u8]) -> Value {
    let host = |r: Result<Value, HostError>| r.unwrap_or_else(error);
    match op {
        "create" => match serde_json::from_slice::<CreateRequest>(payload) {
            Ok(r) => match (NameRequest {
                name: r.name,
                subject_name: r.subject_name,
            })
            .subject_name()
            {
                Ok(name) => host(node.create_filter(&name, r.filter).await.map(|c| {
                    let mut v = entry_json(&c.entry);
                    v["created"] = c.new.into();
                    v
                })),
                Err(e) => e,
            },
            Err(e) => error(format!(
                "invalid request: {e} (expected {{\"name\":...,\"filter\":{{\"kind\":...,\"capacity\":...,\"fpr\":...}}}})"
            )),
        },
        "drop" => match name_of(payload) {
            Ok(name) => host(node.drop_filter(&name).await.map(|e| match e {
                Some(e) => json!({ "dropped": true, "generation": e.generation }),
                None => json!({ "dropped": false }),
            })),
            Err(e) => e,
        },
        "info" => match name_of(payload) {
            Ok(name) => match node.filter_info(&name).await {
                Ok(Some(e)) => entry_json(&e),
                Ok(None) => error(format!(
                    "no filter named `{}`",
                    crate::names::display_key(&name)
                )),
                Err(e) => error(e),
            },
            Err(e) => e,
        },
        "expire" => match serde_json::from_slice::<ExpireRequest>(payload) {
            Ok(r) => {
                let at = match (r.expires_ms, r.ttl_ms) {
                    (Some(_), Some(_)) => {
                        return error("invalid request: give `expires_ms` or `ttl_ms`, not both");
                    }
                    (at, None) => at,
                    (None, Some(ttl)) => {
                        Some(crate::transport::catalog::now_ms().saturating_add(ttl))
                    }
                };
                let named = NameRequest {
                    name: r.name,
                    subject_name: r.subject_name,
                }
                .subject_name();
                match named {
                    Ok(name) => match node.set_expiry(&name, at).await {
                        Ok(super::host::Expiry::Set(e)) => entry_json(&e),
                        Ok(super::host::Expiry::Dropped) => json!({ "dropped": true }),
                        Ok(super::host::Expiry::Missing) => error(format!(
                            "no filter named `{}`",
                            crate::names::display_key(&name)
                        )),
                        Err(e) => error(e),
                    },
                    Err(e) => e,
                }
            }
            Err(e) => error(format!(
                "invalid request: {e} (expected {{\"name\":...,\"expires_ms\":...}} or {{\"name\":...,\"ttl_ms\":...}})"
            )),
        },
        "list" => match list_request(payload) {
            Ok(page) => match node.catalog_entries().await {
                Ok(all) => {
                    // By name; a page at a time, so that a reply stays under max_payload.
                    let mut after: Vec<&CatalogEntry> = all
                        .iter()
                        .filter(|e| page.after.as_ref().is_none_or(|a| e.name > *a))
                        .collect();
                    let more = after.len() > page.limit;
                    after.truncate(page.limit);
                    json!({
                        "filters": after.into_iter().map(entry_json).collect::<Vec<_>>(),
                        "more": more,
                    })
                }
                Err(e) => error(e),
            },
            Err(e) => e,
        },
        other => error(format!(
            "unknown catalog operation `{other}` (create, drop, info, list, expire)"
        )),
    }
}

async fn respond(node: Node, transport: std::sync::Arc<dyn Transport>, m: Message) {
    let Some(reply) = m.reply else {
        return;
    };
    let op = m.subject.rsplit('.').next().unwrap_or_default().to_string();
    let value = answer(&node, &op, &m.payload).await;
    let outcome = if value.get("error").is_some() {
        "error"
    } else {
        "ok"
    };
    metrics::counter!(CATALOG_REQUESTS, "op" => op_label(&op), "outcome" => outcome).increment(1);
    let body = Bytes::from(serde_json::to_vec(&value).expect("JSON encodes"));
    if let Err(e) = transport.publish(reply, body).await {
        tracing::debug!(error = %e, "catalog API reply not sent");
    }
}

/// A bounded label for the operation.
fn op_label(op: &str) -> &'static str {
    match op {
        "create" => "create",
        "drop" => "drop",
        "info" => "info",
        "list" => "list",
        "expire" => "expire",
        _ => "unknown",
    }
}

/// Catalog API requests, by `op` and `outcome` (counter).
pub const CATALOG_REQUESTS: &str = "crpf_catalog_requests_total";

/// Serves the catalog API of `node` on `transport` until the node stops; subscribes again
/// whenever the subscription ends.
pub async fn serve(node: Node, transport: std::sync::Arc<dyn Transport>, prefix: String) {
    metrics::describe_counter!(
        CATALOG_REQUESTS,
        "Requests of the filter catalog API, by op and outcome"
    );
    let subject = catalog_subject(&prefix, "*");
    let queue = format!("{prefix}.$catalog");
    let stopping = node.clone();
    serve_subscription(
        transport.clone(),
        (subject, Some(queue)),
        None,
        move || stopping.is_stopping(),
        |m| {
            actix::spawn(respond(node.clone(), transport.clone(), m));
            std::future::ready(())
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_bare_or_in_json() {
        assert_eq!(name_of(b"tenant-7").unwrap(), "tenant-7");
        assert_eq!(name_of(br#"{"name":"tenant-7"}"#).unwrap(), "tenant-7");
        let bad = name_of(br#"{"nom":"x"}"#).unwrap_err();
        assert!(bad["error"].as_str().unwrap().contains("invalid request"));
        // Any key: its subject name, given or made.
        assert_eq!(name_of(b"bf:x").unwrap(), "_kbf_3Ax");
        assert_eq!(name_of(br#"{"name":"a b"}"#).unwrap(), "_ka_20b");
        assert_eq!(name_of(br#"{"subject_name":"_k_FF"}"#).unwrap(), "_k_FF");
        assert!(name_of(br#"{"subject_name":"a.b"}"#).is_err());
        assert!(name_of(br#"{"name":"a","subject_name":"a"}"#).is_err());
    }
}
