//! Requests the node's subscriptions took for a catalog filter it does not serve yet (created
//! a moment ago, starting, catching up) or for a name it does not know: each waits in a task
//! of its own, up to [`MAX_HELD_REQUESTS`] at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::routing::Routed;
use super::{Inner, NODE_API_REQUESTS};
use crate::replica::{ReplicaError, ReplicaHandle};
use crate::transport::{Message, Transport};

/// Requests held, and catalog reads for requests to names the node does not know.
pub(super) struct Holds {
    /// Requests of the node's subscriptions waiting for their filter ([`API_HOLD`]).
    held: AtomicUsize,
    /// Catalog reads for requests to unknown names ([`API_LOOKUPS`]).
    lookups: Arc<tokio::sync::Semaphore>,
    /// The same for requests on own API subjects ([`OWN_API_LOOKUPS`]): a flood of those
    /// does not take the queue group's.
    own_lookups: Arc<tokio::sync::Semaphore>,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            held: AtomicUsize::new(0),
            lookups: Arc::new(tokio::sync::Semaphore::new(API_LOOKUPS)),
            own_lookups: Arc::new(tokio::sync::Semaphore::new(OWN_API_LOOKUPS)),
        }
    }
}

/// How long a request the node's API subscription took for a catalog filter it does not
/// serve yet (created a moment ago, or still catching up) waits for it; then it is refused
/// as not serving. Shorter than a client's usual timeout, so that the refusal is heard.
pub(super) const API_HOLD: Duration = Duration::from_secs(3);

/// Catalog reads in flight for requests on own API subjects
/// (`<prefix>.<filter>.replica.<node id>.api...`) to names the node does not know; a request
/// beyond them is left unanswered, as one for a name the catalog does not list.
pub(super) const OWN_API_LOOKUPS: usize = 16;

/// How often a held request looks at most whether its filter serves (and every 4 of these
/// without a change).
const HELD_LOOK_EVERY: Duration = Duration::from_millis(5);

/// Requests waiting so at most; more are refused as not serving at once.
pub(super) const MAX_HELD_REQUESTS: usize = 10_000;

/// Catalog reads in flight for requests to names the node does not know; a request beyond
/// them is left unanswered, as one for a name the catalog does not list.
pub(super) const API_LOOKUPS: usize = 64;

/// Why a request of the node's subscriptions waits in a task of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// For its filter to serve ([`hold_request`]); `own`: on its own API subject.
    Hold { own: bool },
    /// For the catalog to say whether the name is one ([`look_up_request`]).
    LookUp,
    /// The same for an own API subject ([`look_up_own_request`]).
    LookUpOwn,
}

/// One of the node's [`MAX_HELD_REQUESTS`] places for held requests, given back when dropped:
/// also by a task that panics or is cancelled (the node's runtime stopping), where a count
/// decremented by hand would stay taken for good.
pub(super) struct HeldSlot(Arc<Inner>);

impl HeldSlot {
    /// A place, if one is free.
    fn take(inner: &Arc<Inner>) -> Option<HeldSlot> {
        let taken = inner.holds.held.fetch_add(1, Ordering::AcqRel);
        let slot = HeldSlot(inner.clone());
        (taken < MAX_HELD_REQUESTS).then_some(slot)
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.0.holds.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    /// Waits up to `left` for `handle` to serve, unless its filter is dropped meanwhile
    /// ([`Inner::dropped_meanwhile`]): `false` then.
    pub(super) async fn wait_serving(
        &self,
        name: &str,
        handle: &ReplicaHandle,
        left: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + left;
        loop {
            if self.dropped_meanwhile(name) {
                return false;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if handle.wait_ready(left.min(Duration::from_millis(20))).await || left.is_zero() {
                return true;
            }
        }
    }
}

/// Answers `msg` in a task of its own (see [`Held`]). Beyond [`MAX_HELD_REQUESTS`] it is
/// refused at once.
pub(super) fn spawn_held(
    inner: Arc<Inner>,
    transport: Arc<dyn Transport>,
    msg: Message,
    why: Held,
) {
    let Some(slot) = HeldSlot::take(&inner) else {
        match why {
            // Perhaps another responder's: left to it.
            Held::LookUp => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "undecided").increment(1);
                return;
            }
            Held::LookUpOwn => {
                metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
                return;
            }
            Held::Hold { .. } => {}
        }
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "refused").increment(1);
        if let Some((to, headers, payload)) = inner.refuse(msg, &ReplicaError::NotServing) {
            tokio::spawn(async move { publish_reply(&transport, to, headers, payload).await });
        }
        return;
    };
    tokio::spawn(async move {
        let reply = match why {
            Held::Hold { own } => hold_request(&inner, msg, own).await,
            Held::LookUp => look_up_request(&inner, msg).await,
            Held::LookUpOwn => look_up_own_request(&inner, msg).await,
        };
        drop(slot);
        if let Some((to, headers, payload)) = reply {
            publish_reply(&transport, to, headers, payload).await;
        }
    });
}

/// The reply to a request for a catalog filter this node does not serve yet, once its
/// replica serves; refused as not serving if it does not within [`API_HOLD`]. `own`: on the
/// filter's own API subject of the node's id ([`Routed::OwnApi`]) rather than the queue
/// group's, where a filter dropped before its replica started, or back as a kind that keeps
/// an id of its own (its replica subscribes), is no longer the node's to answer.
pub(super) async fn hold_request(
    inner: &Arc<Inner>,
    msg: Message,
    own: bool,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    if own {
        // Own API subjects are the node's only under its id.
        inner.shared_id.as_ref()?;
    }
    metrics::counter!(NODE_API_REQUESTS, "outcome" => "held").increment(1);
    let deadline = tokio::time::Instant::now() + API_HOLD;
    let mut changes = inner.changes.subscribe();
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let mut seen_listed = false;
    loop {
        let looked = tokio::time::Instant::now();
        if inner.stopping.load(Ordering::SeqCst) {
            return inner.refuse(msg, &ReplicaError::Stopped);
        }
        if let Some(reply) = inner.answer_parked(&name, &msg) {
            return reply;
        }
        let target = match own {
            true => inner.routed_target(&name, Routed::OwnApi),
            false => inner.api_target(&name),
        };
        if let Some((handle, final_)) = target {
            if !final_ {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if !inner.wait_serving(&name, &handle, left).await {
                    // Dropped while its replica started.
                    let dropped = match own {
                        true => ReplicaError::Stopped,
                        false => ReplicaError::UnknownFilter(name),
                    };
                    return inner.refuse(msg, &dropped);
                }
            }
            return match handle.serving_api() || final_ {
                true => handle.route_own_api(msg),
                false => inner.refuse(msg, &ReplicaError::NotServing),
            };
        }
        if own {
            let listed = {
                let view = inner.view.read().expect("view lock");
                view.get(&name).map(|e| inner.routes_own_api(e.spec.kind))
            };
            match listed {
                Some(false) => return None,
                Some(true) => seen_listed = true,
                None if seen_listed => return None,
                None => {}
            }
        }
        // Started replicas show in `starting` without a change: looked at again meanwhile.
        let next = deadline.min(looked + HELD_LOOK_EVERY * 4);
        match tokio::time::timeout_at(next, changes.changed()).await {
            Err(_) if tokio::time::Instant::now() >= deadline => {
                return inner.refuse(msg, &ReplicaError::NotServing);
            }
            Err(_) => {}
            // Any filter's change wakes every held request: a start that hosts 100,000
            // filters would have each look at the table 100,000 times. One look per
            // interval at most.
            Ok(_) => tokio::time::sleep_until(deadline.min(looked + HELD_LOOK_EVERY)).await,
        }
    }
}

/// The reply to a request for a name the node does not know: held for the filter if the
/// catalog lists it (its watcher had not told of it yet), else none: whoever serves the name
/// outside the catalog answers, if anyone does ([`Inner::route_api`]). Without an answer of
/// the catalog it gets none either.
pub(super) async fn look_up_request(
    inner: &Arc<Inner>,
    msg: Message,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let catalog = inner.catalog.clone()?;
    let undecided = || {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "undecided").increment(1);
        None
    };
    let Ok(permit) = inner.holds.lookups.clone().try_acquire_owned() else {
        return undecided();
    };
    let listed = tokio::time::timeout(API_HOLD, catalog.get(name.clone())).await;
    drop(permit);
    match listed {
        Ok(Ok(Some(_))) => hold_request(inner, msg, false).await,
        Ok(Ok(None)) => {
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "unknown").increment(1);
            not_in_catalog(inner, &name);
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(filter = name, error = %e, "the catalog could not say whether a requested filter exists");
            undecided()
        }
        Err(_) => undecided(),
    }
}

/// The reply to a request on a filter's own API subject of the node's id for a name the
/// node's watcher has not told of: if the catalog lists it under a kind that replicates
/// under the node's id (created a moment ago), the request waits for its replica to serve,
/// as on the queue group ([`hold_request`]); otherwise it is left to whoever has the name
/// outside the catalog (no answer).
pub(super) async fn look_up_own_request(
    inner: &Arc<Inner>,
    msg: Message,
) -> Option<(String, async_nats::HeaderMap, Bytes)> {
    let name = inner.filter_of(&msg.subject)?.to_owned();
    let catalog = inner.catalog.clone()?;
    let Ok(permit) = inner.holds.own_lookups.clone().try_acquire_owned() else {
        metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
        return None;
    };
    let listed = tokio::time::timeout(API_HOLD, catalog.get(name.clone())).await;
    drop(permit);
    let entry = match listed {
        Ok(Ok(Some(entry))) => entry,
        Ok(Ok(None)) => {
            metrics::counter!(NODE_API_REQUESTS, "outcome" => "elsewhere").increment(1);
            not_in_catalog(inner, &name);
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!(filter = name, error = %e, "the catalog could not say whether a requested filter exists");
            return None;
        }
        Err(_) => return None,
    };
    if !inner.routes_own_api(entry.spec.kind) {
        // Its replica subscribes its own subjects, under an id of its own.
        return None;
    }
    hold_request(inner, msg, true).await
}

/// The catalog just said it lists no filter `name`: noted as absent (another responder may
/// serve it), unless the watcher saw it created meanwhile. The view's lock first, as `saw`
/// takes them: a create the watcher saw while the catalog was read is not undone here.
fn not_in_catalog(inner: &Inner, name: &str) {
    let view = inner.view.read().expect("view lock");
    if !view.contains_key(name) {
        let mut foreign = inner.foreign.lock().expect("foreign lock");
        foreign.absent(name, Instant::now());
    }
}

pub(super) async fn publish_reply(
    transport: &Arc<dyn Transport>,
    to: String,
    headers: async_nats::HeaderMap,
    payload: Bytes,
) {
    if let Err(e) = transport.publish_with_headers(to, headers, payload).await {
        tracing::debug!(error = %e, "a reply of a catalog filter's API was not sent");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::node::NodeConfig;
    use crate::node::host::Node;

    /// A place for a held request is given back however its task ends: a panic too.
    #[actix::test]
    async fn a_held_request_gives_its_place_back_even_if_its_task_panics() {
        let cfg = NodeConfig::from_toml_str("").unwrap();
        let bus = Arc::new(crate::transport::InProcessBus::new());
        let node = Node::start(cfg, bus, None).await.unwrap();
        let inner = &node.inner;
        let mut slots: Vec<_> = (0..MAX_HELD_REQUESTS)
            .map(|_| HeldSlot::take(inner).expect("a free place"))
            .collect();
        assert!(HeldSlot::take(inner).is_none(), "beyond the limit");
        let slot = slots.pop();
        let task = tokio::spawn(async move {
            let _slot = slot;
            panic!("a held request's task panicked");
        });
        assert!(task.await.is_err());
        assert!(HeldSlot::take(inner).is_some(), "the panicked task's place");
        drop(slots);
        assert_eq!(inner.holds.held.load(Ordering::Acquire), 0);
        node.shutdown().await.unwrap();
    }
}
