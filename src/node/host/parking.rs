//! Idle replicas parked as data, and resumed when something is for them
//! ([`crate::replica::Parked`]): a node of 100,000 filters, most of them idle, keeps the
//! state of each, not an actor with its task, timers, queues and pipeline.
//!
//! Every `park_after_ms / 4` the node looks at its running catalog replicas (and configured
//! ones in the node-wide series, [`Inner::may_park`]): one that nothing looked up since the
//! last look four times in a row is asked to park. The replica parks only
//! if it is idle and alone or converged with every live peer (see [`crate::replica`]'s
//! parking), and the node takes its state under its lock only if nothing looked it up
//! meanwhile: a request never finds a replica half parked. A lookup (a request, a replication
//! message, [`super::Node::filter`]) resumes a parked replica at once, from the state the node
//! kept, on the node's arbiter.
//!
//! A parked replica with peers stays in its cluster through its node: the node announces its
//! kept digest frame in its digest batches at the quiet spacing ([`announce_parked`]), so its
//! peers keep counting it live; and it answers a peer's message for it without waking it
//! when nothing needs the replica ([`Inner::wakes`]): an equal digest, or an acknowledgement
//! or a request addressed to another replica. Peers' digests are no lookup: they come
//! whether anything changed or not, and would keep every replica awake.
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{ApiQueue, Inner};
use crate::node::table::{Filter, Quiet, Resume};
use crate::replica::{
    Park, ParkInto, Parked, ParkedAnswer, Replica, ReplicaConfig, ReplicaHandle, answer_parked,
    crash, parked_spacing, query_parked,
};
use crate::transport::{CatalogEntry, Message, Subjects};
use crate::wire::{Body, Expect, WireCodec};

/// Looks in a row that find a replica untouched before it is asked to park.
pub(super) const IDLE_LOOKS: u8 = 4;

/// Park requests sent between two yields of the task: a look at 100,000 replicas does not
/// hold a runtime thread for long.
const PARKS_PER_TURN: usize = 1_000;

/// Catalog filters parked (gauge).
pub const PARKED_FILTERS: &str = "crpf_parked_filters";
/// Replicas parked and resumed, by `change` (parked, resumed).
pub const PARKING: &str = "crpf_parking_total";
/// Messages of peers for parked replicas answered without waking them, by `body` (digest,
/// other), and digests of parked replicas announced by their node.
pub const PARKED_MESSAGES: &str = "crpf_parked_messages_total";
/// Queries answered from parked replicas' kept states, without resuming them.
pub const PARKED_QUERIES: &str = "crpf_parked_queries_total";

/// A reply to publish (subject, headers, payload), or none if the request wants none.
pub(super) type ApiReply = Option<(String, async_nats::HeaderMap, bytes::Bytes)>;

/// Describes the metrics of parking.
pub(crate) fn describe() {
    metrics::describe_gauge!(
        PARKED_FILTERS,
        "Catalog filters whose idle replica this node parked (its state kept, its actor gone)"
    );
    metrics::describe_counter!(
        PARKING,
        "Catalog replicas parked and resumed on this node, by change (parked, resumed)"
    );
    metrics::describe_counter!(
        PARKED_QUERIES,
        "Queries (contains, counts, the sketches' reads) answered from parked replicas' kept \
         states without resuming them"
    );
    metrics::describe_counter!(
        PARKED_MESSAGES,
        "Peers' messages for parked replicas that needed no wake (equal digests, acks or \
         requests for others), by body, and parked replicas' digests announced (body=announced)"
    );
}

impl Inner {
    /// The reply to `msg`, a request for `name`, if its replica is parked and `msg` is a
    /// query its kept state answers ([`answer_parked`]); `None`: route it as any (resuming
    /// the replica if it is parked).
    pub(super) fn answer_parked(&self, name: &str, msg: &Message) -> Option<ApiReply> {
        let table = self.table.read().expect("table lock");
        let Quiet::Parked(parked, _) = table.find_quietly(name) else {
            return None;
        };
        let answered = answer_parked(parked, &Subjects::new(&self.prefix, name), msg);
        if answered.is_some() {
            metrics::counter!(PARKED_QUERIES).increment(1);
        }
        answered
    }

    /// The answer of `request` (RESP's) for `name`, with its filter's kind, if its replica is
    /// parked and `request` is a query its kept state answers ([`query_parked`]).
    pub(super) fn query_parked(
        &self,
        name: &str,
        request: &crate::api::Request,
    ) -> Option<ParkedAnswer> {
        let table = self.table.read().expect("table lock");
        let Quiet::Parked(parked, _) = table.find_quietly(name) else {
            return None;
        };
        let answer = query_parked(parked, request)?;
        metrics::counter!(PARKED_QUERIES).increment(1);
        Some(answer)
    }

    /// The running replica of `name`, resumed if it was parked; with `pin`, it never parks
    /// from then on.
    pub(super) fn replica_pinned(&self, name: &str, pin: bool) -> Option<ReplicaHandle> {
        {
            let table = self.table.read().expect("table lock");
            if let Some(handle) = table.use_hosted(name, pin)? {
                return Some(handle.clone());
            }
        }
        self.resume(name)
    }

    /// Resumes the parked replica of `name` (or finds it running already): `None` if the node
    /// does not host it.
    pub(super) fn resume(&self, name: &str) -> Option<ReplicaHandle> {
        let mut table = self.table.write().expect("table lock");
        // Also while the node's id is lost: reads and untagged adds need no id, and tagged
        // adds are refused (`id_retired`) until the node takes it back.
        let resumable = self.shared_id.clone().zip(self.replication.get().cloned());
        let (parked, spec, generation) = match table.begin_resume(name, resumable.is_some()) {
            Resume::NotHosted | Resume::Kept => return None,
            Resume::Live(handle) => return Some(handle),
            Resume::Take {
                parked,
                spec,
                generation,
            } => (parked, spec, generation),
        };
        let (shared_id, replication) = resumable.expect("taken only if resumable");
        // A configured filter's settings are the file's, and its digests go alone.
        let (cfg, digest_batches) = match self.declared.get(name) {
            Some(cfg) => (cfg.clone(), None),
            None => (
                self.replica_config(name, spec, generation),
                self.digest_batches.clone(),
            ),
        };
        let restored = parked.restored;
        let resumed = Replica::resume(
            cfg,
            parked,
            (self.transport.clone(), replication),
            shared_id,
            digest_batches,
            &self.arbiter,
        );
        let (outcome, handle) = match resumed {
            Ok(handle) => (Ok(handle.clone()), Some(handle)),
            Err((e, parked)) => {
                tracing::warn!(filter = name, error = %e, "a parked filter could not resume");
                (Err(parked), None)
            }
        };
        table
            .resumed(name, outcome)
            .expect("resuming under the table's lock");
        if handle.is_some() {
            metrics::counter!(PARKING, "change" => "resumed").increment(1);
            metrics::gauge!(PARKED_FILTERS).decrement(1.0);
            crash::point(match restored {
                true => crash::RESUME_RESTORED,
                false => crash::RESUME,
            });
        }
        handle
    }

    /// Hosts the catalog filter of `entry` parked, restored from its data directory
    /// ([`Replica::restore_parked`]) without running its replica, if the node parks
    /// replicas and may park this one, and its directory alone is its state; whether it
    /// did (if not, the caller starts the replica as any). Its digest is announced (not
    /// ready) with the node's next batch: a peer whose state is equal answers nothing, one
    /// whose state differs pushes its own, which wakes the replica.
    pub(super) async fn host_restored(&self, entry: &CatalogEntry, cfg: &ReplicaConfig) -> bool {
        let Some(shared_id) = self
            .shared_id
            .as_ref()
            .filter(|_| self.may_restore(entry, cfg))
        else {
            return false;
        };
        let parked = match Replica::restore_parked(cfg.clone(), shared_id).await {
            Ok(Some(parked)) => parked,
            Ok(None) => return false,
            Err(e) => {
                tracing::debug!(filter = entry.name, error = %e, "not restored parked: starting it");
                return false;
            }
        };
        if self.stopping.load(Ordering::SeqCst) {
            return false;
        }
        let hosted = self.table.write().expect("table lock").host_parked(
            &entry.name,
            Filter::new(entry.clone()),
            Box::new(parked),
        );
        if let Err(e) = hosted {
            tracing::warn!(error = %e, "a restored filter could not be hosted parked: starting it");
            return false;
        }
        metrics::counter!(PARKING, "change" => "restored").increment(1);
        metrics::gauge!(PARKED_FILTERS).increment(1.0);
        crash::point(crash::RESTORED);
        self.changed();
        true
    }

    /// Whether the parked replica `parked` of `name`'s `generation` must wake for `payload`,
    /// a frame of a peer on its `channel` (`delta`, `state`, or a digest batch's `None`): no
    /// for a frame that says nothing the replica needs (its own echo, a digest equal to its
    /// kept one, an acknowledgement or request addressed to another replica) or that it
    /// would refuse (not one of its frames: another subject, another incarnation, a bad
    /// signature); yes for anything else (a delta, a state, a differing digest, a request to
    /// it or to all). A frame that wakes it is handed to it: nothing is dropped that the
    /// running replica would take.
    pub(super) fn wakes(
        &self,
        name: &str,
        generation: u64,
        parked: &Parked,
        channel: Option<&str>,
        payload: &[u8],
    ) -> bool {
        if !matches!(channel, None | Some("delta" | "state")) {
            return false;
        }
        let expect = Expect {
            filter: name.to_string(),
            kind: parked.filter.kind(),
            params_digest: parked.filter.params_digest(),
            generation,
            // The frame is in memory already; one over the replica's limit wakes it, and
            // it refuses the frame as it would have.
            max_bytes: usize::MAX,
        };
        let Ok(env) = WireCodec::new(expect, self.auth_keys.clone()).decode(payload) else {
            return false;
        };
        match unneeded(&env, parked.identity.uuid, parked.digest) {
            Some(Unneeded::Echo) => false,
            Some(Unneeded::Counted(body)) => {
                metrics::counter!(PARKED_MESSAGES, "body" => body).increment(1);
                // A ready peer has the state a restored replica was restored with: it
                // missed nothing while its node was down.
                if matches!(env.body, Body::Digest { ready: true, .. })
                    && parked.unconfirmed.swap(false, Ordering::Relaxed)
                {
                    metrics::counter!(PARKING, "change" => "confirmed").increment(1);
                }
                false
            }
            None => true,
        }
    }

    /// Whether the replica of `name` (hosted as `h`, running and not pinned) may be asked
    /// to park: running under the node's id, its subjects routed by the node, with its
    /// metrics in the node-wide series; a configured filter's also on the anti-entropy
    /// timing of the catalog's, at which the node announces parked replicas' digests. The
    /// replica decides the rest.
    fn may_park(&self, name: &str, h: &Filter) -> bool {
        if let Some(cfg) = self.declared.get(name) {
            let catalog = &self.announce_timing;
            return cfg.aggregate_metrics
                && (cfg.anti_entropy_interval_ms, cfg.peer_expiry_ms) == *catalog;
        }
        self.may_park_spec(name, h.spec.kind)
    }

    /// [`Inner::may_park`] of a filter of `kind`.
    pub(super) fn may_park_spec(&self, name: &str, kind: crate::FilterKind) -> bool {
        !self.configured.contains(name)
            && self.routes_own_api(kind)
            && self.settings.api_queue == ApiQueue::Node
            && !self.settings.metrics_filters.iter().any(|f| f == name)
    }

    /// Where the replica `handle` of `name`'s `generation` parks: into the node's table, if
    /// it is still that replica there and nothing looked it up since it was asked.
    fn park_into(
        self: &Arc<Self>,
        name: String,
        generation: u64,
        handle: ReplicaHandle,
    ) -> ParkInto {
        let inner = Arc::downgrade(self);
        Box::new(move |close| {
            let Some(inner) = inner.upgrade() else {
                return false;
            };
            if inner.stopping.load(Ordering::SeqCst) {
                return false;
            }
            let mut table = inner.table.write().expect("table lock");
            if !table.park(&name, generation, &handle, close) {
                return false;
            }
            metrics::counter!(PARKING, "change" => "parked").increment(1);
            metrics::gauge!(PARKED_FILTERS).increment(1.0);
            crash::point(crash::PARK_PARKED);
            true
        })
    }
}

/// Why a parked replica needs no wake for a frame ([`unneeded`]).
#[derive(Debug, PartialEq, Eq)]
enum Unneeded {
    /// Its own (an echo).
    Echo,
    /// Counted under this `body`: an equal digest (`digest`), or an acknowledgement, state
    /// request or transfer progress addressed to another replica (`other`).
    Counted(&'static str),
}

/// Whether a peer's frame `env` says nothing a parked replica of uuid `me` and state digest
/// `digest` needs (see [`Inner::wakes`]); `None`: it must wake for it.
fn unneeded(env: &crate::wire::Envelope, me: uuid::Uuid, digest: u64) -> Option<Unneeded> {
    if env.sender == me {
        return Some(Unneeded::Echo);
    }
    match env.body {
        Body::Digest { digest: theirs, .. } if theirs == digest => {
            Some(Unneeded::Counted("digest"))
        }
        Body::Ack { target, .. } | Body::StateProgress { target, .. } if target != me => {
            Some(Unneeded::Counted("other"))
        }
        Body::StateRequest {
            target: Some(target),
        } if target != me => Some(Unneeded::Counted("other")),
        _ => None,
    }
}

/// Every `every`, asks the replicas untouched for [`IDLE_LOOKS`] looks in a row to park, and
/// announces the parked ones' digests ([`announce_parked`]), until the node stops.
pub(super) async fn park_idle(inner: Weak<Inner>, every: Duration) {
    tokio::join!(ask_idle(inner.clone(), every), announce_parked(inner));
}

/// Every anti-entropy interval, hands the node's digest batcher the kept digest frames of a
/// slice of its parked replicas with peers: each once every [`parked_spacing`] intervals (the
/// spacing its frame states, so its peers count it live three times as long), the slices
/// spread by a byte of each frame's checksum. Until the node stops.
pub(super) async fn announce_parked(inner: Weak<Inner>) {
    let (interval, spacing) = {
        let Some(node) = inner.upgrade() else {
            return;
        };
        // Every catalog filter takes the node's defaults for these.
        let spec = crate::FilterSpec::new(crate::FilterKind::GBloom, 1_000, 0.01);
        let cfg = node.settings.defaults.replica_config("_", spec);
        (
            crate::replica::ReplicaConfig::ms(cfg.anti_entropy_interval_ms),
            parked_spacing(&cfg).unwrap_or(1),
        )
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0u32;
    loop {
        ticks.tick().await;
        let Some(node) = inner.upgrade() else {
            return;
        };
        if node.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (Some(batches), Some(replication)) =
            (node.digest_batches.clone(), node.replication.get().cloned())
        else {
            return;
        };
        let slice = round % spacing;
        // At the first round, every one: those restored as the node started are compared
        // by their peers at once (one whose state differs is pushed it).
        let all = round == 0;
        round = round.wrapping_add(1);
        let (alone, frames): (Vec<(String, Vec<u8>)>, Vec<_>) = {
            let table = node.table.read().expect("table lock");
            table
                .iter_parked()
                .filter_map(|(name, _, parked)| {
                    let frame = parked.announce.as_deref()?;
                    let byte = u32::from(frame.last().copied().unwrap_or(0));
                    (all || byte % spacing == slice).then(|| (name.clone(), frame.to_vec()))
                })
                .partition(|(name, _)| node.declared.contains_key(name))
        };
        if frames.is_empty() && alone.is_empty() {
            continue;
        }
        let announced = (frames.len() + alone.len()) as u64;
        metrics::counter!(PARKED_MESSAGES, "body" => "announced").increment(announced);
        if !frames.is_empty() {
            batches.push_all(frames);
        }
        // A configured filter's digests go alone, on its `state` subject, as its replica
        // sent them: replicas outside any node hear those, not the node's batches.
        for (name, frame) in alone {
            let subject = format!("{}.{name}.state", node.prefix);
            if let Err(e) = replication.publish(subject, frame.into()).await {
                tracing::debug!(filter = name, error = %e, "a parked filter's digest was not announced");
            }
        }
    }
}

/// Every `every`, asks the replicas untouched for [`IDLE_LOOKS`] looks in a row to park,
/// until the node stops.
async fn ask_idle(inner: Weak<Inner>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(node) = inner.upgrade() else {
            return;
        };
        if node.stopping.load(Ordering::SeqCst) {
            return;
        }
        let idle = {
            let table = node.table.read().expect("table lock");
            table.idle(IDLE_LOOKS, |name, h| node.may_park(name, h))
        };
        for chunk in idle.chunks(PARKS_PER_TURN) {
            for (name, generation, handle) in chunk {
                let into = node.park_into(name.clone(), *generation, handle.clone());
                handle.addr().do_send(Park(into));
            }
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::wire::{Envelope, FilterKind};

    fn from(sender: u128, body: Body) -> Envelope {
        Envelope::new(
            "f",
            FilterKind::GBloom,
            1,
            Uuid::from_u128(sender),
            2,
            0,
            body,
        )
    }

    fn digest(d: u64) -> Body {
        Body::Digest {
            digest: d,
            ready: true,
            sent: Some(3),
            spacing: Some(4),
        }
    }

    /// A parked replica (uuid 1, digest 7) wakes for whatever it needs, and only for that.
    #[test]
    fn a_parked_replica_wakes_for_what_it_needs_only() {
        let me = Uuid::from_u128(1);
        let other = Uuid::from_u128(9);
        let check = |body: Body| unneeded(&from(5, body), me, 7);
        assert_eq!(check(digest(7)), Some(Unneeded::Counted("digest")));
        assert_eq!(check(digest(8)), None, "a differing digest wakes it");
        assert_eq!(check(Body::Delta(vec![1])), None, "a delta wakes it");
        assert_eq!(check(Body::ConfirmedDelta(vec![1])), None);
        assert_eq!(check(Body::Deltas(Vec::new())), None);
        assert_eq!(check(Body::StateRequest { target: None }), None);
        assert_eq!(check(Body::StateRequest { target: Some(me) }), None);
        assert_eq!(
            check(Body::StateRequest {
                target: Some(other)
            }),
            Some(Unneeded::Counted("other"))
        );
        assert_eq!(check(Body::Ack { target: me, seq: 4 }), None);
        assert_eq!(
            check(Body::Ack {
                target: other,
                seq: 4
            }),
            Some(Unneeded::Counted("other"))
        );
        let progress = |target| Body::StateProgress {
            target,
            transfer: 1,
            next: 2,
        };
        assert_eq!(check(progress(me)), None);
        assert_eq!(check(progress(other)), Some(Unneeded::Counted("other")));
        // Its own frames, whatever they say.
        assert_eq!(unneeded(&from(1, digest(8)), me, 7), Some(Unneeded::Echo));
    }
}
