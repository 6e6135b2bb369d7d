//! Where a message for a catalog filter goes: the replica the table has for its name (live,
//! resumed if parked, starting, or refusing as dropped or stopping), a hold until it serves,
//! a look-up in the catalog, or nowhere (a name outside the catalog is not the node's).

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Inner, NODE_API_REQUESTS};
use crate::names::is_subject_name;
use crate::node::config::ApiQueue;
use crate::node::foreign::Heard;
use crate::node::table::{Found, Quiet};
use crate::replica::{ReplicaError, ReplicaHandle, refusal};
use crate::transport::Message;
use crate::transport::digests::{BATCHED_DIGESTS, DIGEST_BATCHES, DIGEST_BATCHES_REJECTED};
use crate::wire::batch::decode_batch;

/// How long after the watcher saw a catalog filter dropped the node refuses its name as
/// unknown on the request API's queue group: a client still asking hears of the drop at once.
/// Later the name is any name the catalog does not list, left unanswered: a responder outside
/// the catalog may have taken it.
pub(super) const DROPPED_REFUSAL: Duration = Duration::from_secs(60);

/// Where [`Inner::target`] found the replica of a name.
pub(super) enum Target {
    /// Hosted and running (resumed if it was parked).
    Live(ReplicaHandle),
    /// Starting; whether the node routes its own API subjects.
    Starting(ReplicaHandle, bool),
    /// Dropped a moment ago: it refuses requests.
    Dropping(ReplicaHandle),
    /// Stopping with the node; whether it takes its own API subjects' requests.
    Stopping(ReplicaHandle, bool),
}

/// The subjects of its catalog filters a node serves on subscriptions of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Routed {
    /// The NATS service protocol ([`SERVICE_SUBJECTS`]).
    Service,
    /// `<prefix>.*.api`: the request API without an operation, answered with an error by
    /// every node whose replica serves (the requester takes the first answer).
    ApiRoot,
    /// `<prefix>.*.replica.<node id>.api[.>]`: the own API subjects of the filters that
    /// replicate under the node's id.
    OwnApi,
    /// `<prefix>.<filter>.api.>` in the filter's queue group: the operations of a
    /// configured filter whose replica handed its subscription over ([`GroupApi`]).
    ///
    /// [`GroupApi`]: crate::replica::GroupApi
    Group,
}

/// Where [`Inner::route_api`] sends a request.
pub(super) enum ApiRoute {
    /// The reply (subject, headers, payload), at once.
    Reply((String, async_nats::HeaderMap, Bytes)),
    /// None from this node: a replica's own subscription answers it (or it wants none).
    Silent,
    /// A catalog filter this node does not serve yet: it waits for it ([`hold_request`]).
    Hold(Message),
    /// A name the node does not know: the catalog says whether it is one
    /// ([`look_up_request`]); if not, it gets no answer.
    LookUp(Message),
    /// The same on a filter's own API subject of the node's id ([`Routed::OwnApi`]),
    /// where a name the catalog does not list gets no answer ([`look_up_own_request`]).
    LookUpOwn(Message),
    /// A catalog filter's replica that does not serve yet, on its own API subject of the
    /// node's id: it waits for it ([`hold_request`]).
    HoldOwn(Message),
}

impl ApiRoute {
    /// The reply, if the request wants one.
    fn answer(reply: Option<(String, async_nats::HeaderMap, Bytes)>) -> Self {
        reply.map_or(ApiRoute::Silent, ApiRoute::Reply)
    }
}

impl Inner {
    /// The filter a subject under the node's prefix is about (`<prefix>.<filter>...`).
    pub(super) fn filter_of<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('.')?
            .split('.')
            .next()
    }

    /// Where the replica of `name` is, in one look at the table (a parked one resumed).
    pub(super) fn target(&self, name: &str) -> Option<Target> {
        {
            let table = self.table.read().expect("table lock");
            match table.find(name) {
                Found::Absent => return None,
                Found::Live(h) => return Some(Target::Live(h.clone())),
                Found::Starting(h, routes) => return Some(Target::Starting(h.clone(), routes)),
                Found::Dropping(h) => return Some(Target::Dropping(h.clone())),
                Found::Stopping(h, own) => return Some(Target::Stopping(h.clone(), own)),
                Found::Parked => {}
            }
        }
        self.resume(name).map(Target::Live)
    }

    /// The replica of catalog filter `name` that takes its requests: hosted or starting,
    /// or (`true`) dropped a moment ago or stopping with the node, which refuses them.
    pub(super) fn api_target(&self, name: &str) -> Option<(ReplicaHandle, bool)> {
        Some(match self.target(name)? {
            Target::Live(h) | Target::Starting(h, _) => (h, false),
            Target::Dropping(h) | Target::Stopping(h, _) => (h, true),
        })
    }

    /// The catalog filter `name` (not a configured one) a request on a subject the node routes
    /// is for (`routed`, on `<prefix>.<filter>.api` or
    /// `<prefix>.<filter>.replica.<node id>.api[.<op>]`): hosted and serving its API (for the first, which every node answers for its own replica), or
    /// (for the second) hosted, replicating under the node's id ([`Inner::routes_own_api`]),
    /// or (`true`) dropped a moment ago, which refuses them. A hosted or starting replica of
    /// the name goes first: a re-created filter's, not the dropped one's still lingering.
    pub(super) fn routed_target(
        &self,
        name: &str,
        routed: Routed,
    ) -> Option<(ReplicaHandle, bool)> {
        let (handle, routes, dropped) = match self.target(name)? {
            Target::Live(handle) => {
                let routes = self.routes_own_api(handle.kind());
                (handle, routes, false)
            }
            Target::Starting(handle, routes) => (handle, routes, false),
            Target::Dropping(handle) => (handle, true, true),
            Target::Stopping(handle, refusing) => (handle, refusing, true),
        };
        match routed {
            Routed::ApiRoot => (!dropped && handle.serving_api()).then_some((handle, false)),
            _ => routes.then_some((handle, dropped)),
        }
    }

    /// The replicas hosted or starting (those whose replication the node does not route take
    /// no routed message, [`ReplicaHandle::route_event`]).
    pub(super) fn routed_handles(&self) -> Vec<ReplicaHandle> {
        self.table.read().expect("table lock").routed_handles()
    }

    /// Routes a request on a subject the node serves for its catalog filters (`routed`). On
    /// its own API subjects, a catalog filter whose replica does not serve yet (starting,
    /// catching up, or not started: the watcher saw the create) is waited for, and a name
    /// the watcher has not told of is looked up in the catalog (created a moment ago), as
    /// on the queue group: such a request was refused at once, or left unanswered.
    pub(super) fn route(&self, msg: Message, routed: Routed) -> ApiRoute {
        let Some(name) = self.filter_of(&msg.subject) else {
            return ApiRoute::Silent;
        };
        if routed != Routed::ApiRoot
            && let Some(reply) = self.answer_parked(name, &msg)
        {
            return ApiRoute::answer(reply);
        }
        if routed == Routed::Group {
            // Its replica's own subscription, kept by the node: the replica (resumed if
            // parked) answers as it did, refusals while it stops included.
            return match self.target(name) {
                Some(
                    Target::Live(h)
                    | Target::Starting(h, _)
                    | Target::Dropping(h)
                    | Target::Stopping(h, _),
                ) => ApiRoute::answer(h.route_own_api(msg)),
                None => ApiRoute::Silent,
            };
        }
        if self.configured.contains(name) && !self.configured_routed.contains(name) {
            // Its own subscriptions answer (its id may equal the node's: another namespace).
            return ApiRoute::Silent;
        }
        if let Some((handle, dropped)) = self.routed_target(name, routed) {
            if routed == Routed::OwnApi && !handle.serving_api() {
                if self.dropped_meanwhile(name) {
                    return ApiRoute::answer(self.refuse(msg, &ReplicaError::Stopped));
                }
                if !dropped {
                    // Starting or catching up: held until it serves, as on the queue group.
                    return ApiRoute::HoldOwn(msg);
                }
            }
            return ApiRoute::answer(handle.route_own_api(msg));
        }
        if routed != Routed::OwnApi || self.shared_id.is_none() {
            return ApiRoute::Silent;
        }
        let listed = self
            .view
            .read()
            .expect("view lock")
            .get(name)
            .map(|e| self.routes_own_api(e.spec.kind));
        match listed {
            // Listed, its replica not started yet.
            Some(true) => ApiRoute::HoldOwn(msg),
            Some(false) => ApiRoute::Silent,
            // Not known to the watcher yet: perhaps created a moment ago (a request sent
            // right after the create was left unanswered here), perhaps a replica outside
            // the catalog with the same id. The catalog tells.
            None if !is_subject_name(name) => ApiRoute::Silent,
            None => match self
                .foreign
                .lock()
                .expect("foreign lock")
                .heard(name, Instant::now())
            {
                Heard::Elsewhere | Heard::Unlisted => ApiRoute::Silent,
                Heard::Unchecked | Heard::Never => ApiRoute::LookUpOwn(msg),
            },
        }
    }

    /// Where a request the node's API subscription took goes ([`serve_node_api`]).
    pub(super) fn route_api(&self, msg: Message) -> ApiRoute {
        let Some(name) = self.filter_of(&msg.subject) else {
            return ApiRoute::Silent;
        };
        if self.configured_here.contains(name) {
            // Its own subscription, in its filter's group, answers.
            return ApiRoute::Silent;
        }
        if self.configured.contains(name) {
            // Configured under another prefix: a catalog filter of this name is not hosted
            // here (the configured one stays; its start logged why). A name the catalog does
            // not list is not the node's to answer.
            if self.view.read().expect("view lock").contains_key(name) {
                return ApiRoute::answer(self.refuse(msg, &ReplicaError::NotServing));
            }
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
            return ApiRoute::Silent;
        }
        if let Some(reply) = self.answer_parked(name, &msg) {
            return ApiRoute::answer(reply);
        }
        if let Some((handle, final_)) = self.api_target(name) {
            if final_ || handle.serving_api() {
                return ApiRoute::answer(handle.route_own_api(msg));
            }
            if self.dropped_meanwhile(name) {
                return self.refuse_dropped(name.to_owned(), msg);
            }
            return ApiRoute::Hold(msg);
        }
        if self.view.read().expect("view lock").contains_key(name) {
            return ApiRoute::Hold(msg);
        }
        let now = Instant::now();
        let foreign = self.foreign.lock().expect("foreign lock");
        if foreign.dropped_within(name, now, DROPPED_REFUSAL) {
            // The watcher saw it dropped a moment ago (and its replica, if it ever started
            // here, is gone): a catalog filter's name, refused without asking the catalog.
            drop(foreign);
            return self.refuse_dropped(name.to_owned(), msg);
        }
        // Any other name is not the node's to answer: the requester takes the first answer,
        // and a refusal here would beat the reply of whoever serves the name outside the
        // catalog (a filter configured on another node, an embedded replica, any service on
        // the prefix), which the node cannot tell is there. Only a filter the catalog lists
        // (created a moment ago, ahead of the watcher) is waited for.
        match foreign.heard(name, now) {
            Heard::Elsewhere => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
                ApiRoute::Silent
            }
            Heard::Unlisted => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
                ApiRoute::Silent
            }
            Heard::Unchecked | Heard::Never => ApiRoute::LookUp(msg),
        }
    }

    /// Refuses a request for `name`, which the watcher saw dropped, as for an unknown filter
    /// (and counts it so, wherever the route found the drop).
    pub(super) fn refuse_dropped(&self, name: String, msg: Message) -> ApiRoute {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
        let unknown = ReplicaError::UnknownFilter(name);
        ApiRoute::answer(self.refuse(msg, &unknown))
    }

    /// The node's refusal `e` of a request its API subscription took.
    pub(super) fn refuse(
        &self,
        msg: Message,
        e: &ReplicaError,
    ) -> Option<(String, async_nats::HeaderMap, Bytes)> {
        let id = self.shared_id.as_ref().map_or(0, |s| s.identity().replica);
        refusal(id, msg, e)
    }

    /// Whether the watcher saw `name` dropped (and not created again) while its replica
    /// still starts: the drop waits behind the create's start, and a request must not wait
    /// for a replica that stops as soon as it has started.
    pub(super) fn dropped_meanwhile(&self, name: &str) -> bool {
        self.foreign.lock().expect("foreign lock").was_dropped(name)
    }

    /// Hands a message of a replication subject (`<prefix>.<filter>.*`) to the replica of the
    /// filter it is for, hosted or starting, if the node routes its replication; a parked one
    /// is resumed for it, unless it needs none of it ([`Inner::wakes`]). Anything else (a
    /// filter the node does not host; a request on `<prefix>.<filter>.api`, which the same
    /// pattern covers) is not for it.
    ///
    /// Handed over under the table's read lock: a replica parks under its write lock, and
    /// only with nothing in its buffer then, so a message is either seen by the parking
    /// replica (which then stays) or finds it parked (and resumes it). None is left in the
    /// buffer of a replica gone.
    pub(super) fn route_replication(&self, msg: Message) {
        let Some(name) = self.filter_of(&msg.subject) else {
            return;
        };
        let channel = msg.subject.rsplit('.').next();
        let mut resumed = false;
        loop {
            {
                let table = self.table.read().expect("table lock");
                match table.find(name) {
                    Found::Live(h) | Found::Starting(h, _) | Found::Stopping(h, _) => {
                        return h.route_replication(msg);
                    }
                    Found::Absent | Found::Dropping(_) => {
                        drop(table);
                        return self.heard_elsewhere(name, &msg.subject);
                    }
                    Found::Parked => {
                        if let Quiet::Parked(parked, generation) = table.find_quietly(name)
                            && (resumed
                                || !self.wakes(name, generation, parked, channel, &msg.payload))
                        {
                            // Not needed; or resumed, and parked again at once (it could not
                            // run: logged).
                            return;
                        }
                    }
                }
            }
            // Resumed (or being resumed by another lookup, which this one waits for), then
            // handed the message in the next turn.
            self.resume(name);
            resumed = true;
        }
    }

    /// Notes `name` as replicated outside the catalog if `subject` is its delta or state
    /// subject and the catalog does not list it ([`ForeignNames`]).
    pub(super) fn heard_elsewhere(&self, name: &str, subject: &str) {
        if self.settings.api_queue != ApiQueue::Node || !is_subject_name(name) {
            return;
        }
        // `<prefix>.<name>.delta` or `.state` (the pattern is `<prefix>.*.*`).
        let channel = subject.rsplit('.').next();
        if !matches!(channel, Some("delta" | "state")) {
            return;
        }
        // The view's lock held meanwhile, taken first as `saw` does: a create or drop seen
        // at the same time is not undone here.
        let view = self.view.read().expect("view lock");
        if !view.contains_key(name) {
            let mut foreign = self.foreign.lock().expect("foreign lock");
            foreign.saw(name, Instant::now());
        }
    }

    /// Hands each digest of another node's batch to this node's replica of its filter, as if
    /// it had come on the filter's `state` subject (where its replica checks it as any
    /// frame). A batch that is not one is refused whole, and counted.
    pub(super) fn route_digest_batch(&self, payload: &[u8]) {
        let items = match decode_batch(payload) {
            Ok(items) => items,
            Err(e) => {
                metrics::counter!(DIGEST_BATCHES_REJECTED).increment(1);
                tracing::debug!(error = %e, "a digest batch was refused");
                return;
            }
        };
        metrics::counter!(DIGEST_BATCHES, "direction" => "in").increment(1);
        metrics::counter!(BATCHED_DIGESTS, "direction" => "in").increment(items.len() as u64);
        for (name, frame) in items {
            // A name that is no subject token is no filter of this node.
            if !is_subject_name(&name) {
                continue;
            }
            self.route_batched_digest(&name, frame);
        }
    }

    /// Hands a peer's batched digest frame for `name` to its replica, without noting it as
    /// used (digests come whether anything changed or not); a parked replica is compared
    /// with, and resumed (and handed the frame) only if the digest differs from its own.
    fn route_batched_digest(&self, name: &str, frame: Vec<u8>) {
        let msg = Message {
            subject: format!("{}.{name}.state", self.prefix),
            payload: frame.into(),
            reply: None,
            headers: None,
        };
        let mut resumed = false;
        loop {
            {
                let table = self.table.read().expect("table lock");
                match table.find_quietly(name) {
                    Quiet::Found(
                        Found::Live(h) | Found::Starting(h, _) | Found::Stopping(h, _),
                    ) => return h.route_batched_digest(msg),
                    Quiet::Found(Found::Parked) => {}
                    Quiet::Found(Found::Absent | Found::Dropping(_)) => return,
                    Quiet::Parked(parked, generation) => {
                        if resumed || !self.wakes(name, generation, parked, None, &msg.payload) {
                            return;
                        }
                    }
                }
            }
            self.resume(name);
            resumed = true;
        }
    }
}
