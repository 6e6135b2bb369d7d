//! The node's subscription tasks for its catalog filters: each message to [`super::routing`],
//! its reply published, or the request handed to [`super::held`] to wait.

use std::sync::{Arc, Weak};

use futures::StreamExt;
use tokio::sync::broadcast;

use super::held::{Held, publish_reply, spawn_held};
use super::routing::{ApiRoute, Routed};
use super::{Inner, stopped};
use crate::replica::GroupApi;
use crate::transport::{
    Message, MessageStream, Transport, TransportEvent, event_stream, serve_subscription,
};

/// Routes the requests on `subject` (in `queue`, if any; see [`Routed`]) to the replicas of
/// the filters they are for, until the node stops. These were 3 of each replica's 5
/// subscriptions, with a channel buffer of ~6 KB each.
pub(super) async fn serve_replica_apis(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    (subject, queue): (String, Option<String>),
    initial: Option<MessageStream>,
    routed: Routed,
) {
    // Not when the node starts stopping: its replicas answer until they stopped.
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    let replying = transport.clone();
    serve_subscription(transport, (subject, queue), initial, stopped, |msg| {
        let routed = inner.upgrade().map(|i| (i.route(msg, routed), i));
        let transport = replying.clone();
        async move {
            let reply = match routed {
                Some((ApiRoute::Reply(reply), _)) => Some(reply),
                Some((ApiRoute::LookUpOwn(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::LookUpOwn);
                    None
                }
                Some((ApiRoute::HoldOwn(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::Hold { own: true });
                    None
                }
                // `route` holds nothing itself: a hold follows a look-up here.
                Some((ApiRoute::Silent | ApiRoute::Hold(_) | ApiRoute::LookUp(_), _)) | None => {
                    None
                }
            };
            if let Some((to, headers, payload)) = reply
                && let Err(e) = transport.publish_with_headers(to, headers, payload).await
            {
                tracing::debug!(error = %e, "a reply of a replica's API was not sent");
            }
        }
    })
    .await
}

impl Inner {
    /// Where a configured filter's replica hands its API's queue group subscriptions as it
    /// starts to serve them: the node serves them from then on, beyond the replica's actor
    /// (which may park), in the filter's own group, until it stops routing.
    pub(super) fn serve_group_api(self: &Arc<Self>) -> GroupApi {
        let inner = Arc::downgrade(self);
        Box::new(move |subscriptions| {
            let Some(node) = inner.upgrade() else {
                return;
            };
            let mut routers = node.tasks.routers.lock().expect("routers lock");
            if node
                .routing_stopped
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                // The node stopped routing (its routers are gone): nothing would stop these.
                return;
            }
            for (stream, subject, queue) in subscriptions {
                let task = serve_replica_apis(
                    inner.clone(),
                    node.transport.clone(),
                    (subject, Some(queue)),
                    stream,
                    Routed::Group,
                );
                routers.push(tokio::spawn(task));
            }
        })
    }
}

/// Takes the request API's operations of every catalog filter (`subject`, `<prefix>.*.api.>`,
/// in the node's queue group) and routes each to its replica, until the node stopped its
/// replicas. One subscription of the node where each replica had one (~7 KB each).
pub(super) async fn serve_node_api(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    (subject, queue): (String, String),
    initial: Option<MessageStream>,
) {
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    let replying = transport.clone();
    serve_subscription(transport, (subject, Some(queue)), initial, stopped, |msg| {
        let routed = inner.upgrade().map(|i| (i.route_api(msg), i));
        let transport = replying.clone();
        async move {
            let reply = match routed {
                Some((ApiRoute::Reply(reply), _)) => Some(reply),
                Some((ApiRoute::Hold(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::Hold { own: false });
                    None
                }
                Some((ApiRoute::LookUp(msg), inner)) => {
                    spawn_held(inner, transport.clone(), msg, Held::LookUp);
                    None
                }
                // Only own API subjects are held or looked up that way.
                Some((ApiRoute::Silent | ApiRoute::LookUpOwn(_) | ApiRoute::HoldOwn(_), _))
                | None => None,
            };
            if let Some((to, headers, payload)) = reply {
                publish_reply(&transport, to, headers, payload).await;
            }
        }
    })
    .await
}

/// Hands each message on `subject` to `route` (the replication subjects, `<prefix>.*.*`, to
/// [`Inner::route_replication`]; other nodes' digest batches, `<prefix>.$digests`, to
/// [`Inner::route_digest_batch`]), in the order they came (a gap in a sender's sequence
/// means a loss), until the node stops. Each replica had its own replication subscription,
/// with a channel buffer of ~6 KB.
pub(super) async fn serve_routed(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    subject: String,
    initial: Option<MessageStream>,
    route: fn(&Inner, Message),
) {
    let stopped = stopped(inner.clone(), |i| &i.routing_stopped);
    serve_subscription(transport, (subject, None), initial, stopped, |msg| {
        if let Some(inner) = inner.upgrade() {
            route(&inner, msg);
        }
        std::future::ready(())
    })
    .await
}

/// Hands each connection event of the node's transport to every replica whose replication
/// the node routes, as their own receivers of it did (one each cost a replica 200 bytes),
/// until the node is gone. In order: one replica's full buffer holds the rest back a moment.
pub(super) async fn forward_events(
    inner: Weak<Inner>,
    events: broadcast::Receiver<TransportEvent>,
) {
    let mut events = std::pin::pin!(event_stream(events));
    while let Some(ev) = events.next().await {
        let Some(handles) = inner.upgrade().map(|i| i.routed_handles()) else {
            return;
        };
        for handle in handles {
            handle.route_event(ev).await;
        }
    }
}
