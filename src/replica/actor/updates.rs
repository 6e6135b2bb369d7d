//! Updates of the request API (`add`, `remove`, `madd`, `mremove`): checked and applied here
//! for both ways they arrive. A kind without version tags has them applied in the subscription
//! task that received them, like queries ([`super::reads`]): an update answered at `local`
//! then costs no hand-off to the actor's thread and back, and only one that waits for a
//! commit goes on to the actor ([`super::Inbound::Settle`]). A tagged kind's updates must
//! first reserve tags from the replica's lease, which the actor holds, so they go to the actor.
//!
//! Either way an update (one item) is applied under the filter's write lock, so queries and
//! merges see it wholly or not at all; the updates of one subscription are applied in the
//! order they arrive; and the actor learns of changes made outside it
//! ([`Shared::direct_changes`]) before it digests, snapshots or commits the state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::Shared;
use super::local::check_item;
use super::reads::PREFETCH_AHEAD;
use super::request::{ApiReply, api_reply_format};
use crate::api::batch::{self, Limits};
use crate::api::{ACK_HEADER, Op, ReplyFormat};
use crate::replica::ReplicaError;
use crate::replica::ack::AckLevel;
use crate::replica::filter::{AnyFilter, NotRemovable};
use crate::replica::metrics::{OpKind, Telemetry};
use crate::replica::wall_clock_ms;
use crate::transport::Message;
use crate::wire::FilterKind;

/// An applied update: answered with `body` once it reached `level` (at once if it changed
/// nothing).
pub(super) struct Applied {
    pub level: AckLevel,
    pub changed: bool,
    pub body: ApiReply,
}

/// Everything needed to check and apply an update of the request API.
pub(crate) struct Updates {
    pub shared: Arc<Shared>,
    pub telemetry: Telemetry,
    pub kind: FilterKind,
    pub default_ack: AckLevel,
    /// Whether the replica has a write-ahead log (`durable` needs one).
    pub has_wal: bool,
    pub max_item_bytes: usize,
    pub limits: Limits,
    /// Pending delta entries at which a commit is due (`delta_max_updates`).
    pub delta_max_updates: usize,
}

impl Updates {
    /// Whether `op` is an update.
    pub(super) fn is_update(op: Op) -> bool {
        matches!(op, Op::Add | Op::Remove | Op::MAdd | Op::MRemove)
    }

    /// Whether updates are applied where they arrive: for kinds without version tags.
    pub(super) fn applied_off_the_actor(&self) -> bool {
        !self.kind.tagged()
    }

    /// The level a request asks for (`Crpf-Ack`, else the replica's default), refused if the
    /// replica cannot give it, before anything is applied.
    pub(super) fn level(&self, msg: &Message) -> Result<AckLevel, ReplicaError> {
        let level = match msg.headers.as_ref().and_then(|h| h.get(ACK_HEADER)) {
            None => self.default_ack,
            Some(v) => v.as_str().parse().map_err(ReplicaError::InvalidItem)?,
        };
        if level == AckLevel::Durable && !self.has_wal {
            return Err(ReplicaError::AckUnavailable(
                "`durable` needs a data_dir".into(),
            ));
        }
        Ok(level)
    }

    /// Whether the pending delta is due for a commit.
    pub(super) fn commit_due(&self) -> bool {
        self.filter_read().pending_delta_len() >= self.delta_max_updates
    }

    /// Applies update `op` of `msg` at `level`. `reserve` reserves version tags before they
    /// are issued and answers the clock they reach (`u64::MAX` for an untagged kind). A batch
    /// is checked whole first (framing, limits, the kind), so that a refused batch changes
    /// nothing; its items are then applied in order, each all or nothing.
    pub(super) fn apply(
        &self,
        op: Op,
        level: AckLevel,
        msg: &Message,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
    ) -> Result<Applied, ReplicaError> {
        let applied = |changed, body| Applied {
            level,
            changed,
            body,
        };
        match op {
            Op::Add => {
                let item = &msg.payload[..];
                let r = check_item(item, self.max_item_bytes)
                    .and_then(|()| reserve())
                    .and_then(|_| {
                        let mut f = self.filter_write();
                        f.tick(wall_clock_ms());
                        f.add(item).map_err(ReplicaError::from)
                    });
                self.telemetry.op(OpKind::Add, r.is_ok());
                r?;
                Ok(applied(true, ApiReply::fixed(b"{\"added\":true}")))
            }
            Op::Remove => {
                let item = &msg.payload[..];
                let r = check_item(item, self.max_item_bytes)
                    .and_then(|()| self.filter_write().remove(item).map_err(ReplicaError::from));
                self.telemetry.op(OpKind::Remove, r.is_ok());
                let removed = r?.is_some();
                let body: &'static [u8] = if removed {
                    b"{\"removed\":true}"
                } else {
                    b"{\"removed\":false}"
                };
                Ok(applied(removed, ApiReply::fixed(body)))
            }
            Op::MAdd | Op::MRemove => {
                let format = api_reply_format(msg)?;
                if op == Op::MRemove && !self.kind.removable() {
                    return Err(NotRemovable(self.kind).into());
                }
                let items = batch::decode(&msg.payload, self.limits)
                    .map_err(|e| ReplicaError::InvalidItem(e.to_string()))?;
                let (changed, body) = if op == Op::MAdd {
                    self.madd(&items, format, reserve)
                } else {
                    self.mremove(&items, format)?
                };
                Ok(applied(changed, body))
            }
            _ => unreachable!("{op:?} is not an update"),
        }
    }

    fn mremove(
        &self,
        items: &[&[u8]],
        format: ReplyFormat,
    ) -> Result<(bool, ApiReply), ReplicaError> {
        let mut f = self.filter_write();
        let removed = items
            .iter()
            .map(|&i| f.remove(i).map(|d| d.is_some()))
            .collect::<Result<Vec<bool>, NotRemovable>>()?;
        drop(f);
        self.telemetry
            .count_ops(OpKind::Remove, items.len() as u64, 0);
        let body = match format {
            ReplyFormat::Json => ApiReply::json(&json!({ "removed": removed })),
            ReplyFormat::Bitmap => ApiReply::bitmap(&removed, None),
        };
        Ok((removed.contains(&true), body))
    }

    /// A batch add: a refused item (a full cuckoo table, tags not reserved) is reported and
    /// the others are applied.
    fn madd(
        &self,
        items: &[&[u8]],
        format: ReplyFormat,
        reserve: &mut dyn FnMut() -> Result<u64, ReplicaError>,
    ) -> (bool, ApiReply) {
        let mut added = Vec::with_capacity(items.len());
        let mut failed = Vec::new();
        let mut first_error: Option<ReplicaError> = None;
        let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut refused = |i: usize, e: ReplicaError, added: &mut Vec<bool>| {
            added.push(false);
            failed.push(i);
            *reasons.entry(e.reason()).or_default() += 1;
            first_error.get_or_insert(e);
        };
        let mut i = 0;
        while i < items.len() {
            // Tags are reserved before they are issued; then one write lock covers as many
            // items as the reservation does (all of them for untagged kinds): a lock per item
            // cost about a tenth of a batch.
            let limit = match reserve() {
                Ok(limit) => limit,
                Err(e) => {
                    refused(i, e, &mut added);
                    i += 1;
                    continue;
                }
            };
            let mut f = self.filter_write();
            f.tick(wall_clock_ms());
            let first = i;
            if first == 0 {
                items
                    .iter()
                    .take(PREFETCH_AHEAD)
                    .for_each(|i| f.prefetch(i));
            }
            while i < items.len() && f.clock() < limit {
                if let Some(ahead) = items.get(i + PREFETCH_AHEAD) {
                    f.prefetch(ahead);
                }
                match f.add(items[i]) {
                    Ok(_) => added.push(true),
                    Err(e) => refused(i, e.into(), &mut added),
                }
                i += 1;
            }
            drop(f);
            if i == first {
                // A reservation that succeeded leaves room for a tag: never loop forever if
                // it somehow did not.
                refused(i, ReplicaError::TagsUnreserved, &mut added);
                i += 1;
            }
        }
        let ok = (added.len() - failed.len()) as u64;
        self.telemetry
            .count_ops(OpKind::Add, ok, failed.len() as u64);
        for (reason, count) in reasons {
            self.telemetry.api_errors(reason, count);
        }
        let error = first_error.map(|e| e.to_string());
        let body = match format {
            ReplyFormat::Json => {
                let mut body = json!({"added": ok});
                if let Some(e) = &error {
                    body["failed"] = json!(failed);
                    body["error"] = json!(e);
                }
                ApiReply::json(&body)
            }
            ReplyFormat::Bitmap => ApiReply::bitmap(&added, error),
        };
        (ok > 0, body)
    }

    /// Tells the actor the state changed outside it (after the change is applied).
    pub(super) fn note_change(&self) {
        self.shared.direct_changes.store(true, Ordering::Release);
    }

    fn filter_write(&self) -> std::sync::RwLockWriteGuard<'_, AnyFilter> {
        self.shared.filter.write().expect("filter lock poisoned")
    }

    fn filter_read(&self) -> std::sync::RwLockReadGuard<'_, AnyFilter> {
        self.shared.filter.read().expect("filter lock poisoned")
    }
}
