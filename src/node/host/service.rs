//! The NATS service protocol (`$SRV`) for every catalog filter the node hosts, on three
//! subscriptions of the node rather than three per replica.

use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::{Inner, stopped};
use crate::transport::{MessageStream, Transport, serve_subscription};

/// The NATS service protocol's subjects (a verb to every service, to one service, to one
/// instance), each one subscription of the node for all its catalog filters.
pub(super) const SERVICE_SUBJECTS: [&str; 3] = ["$SRV.*", "$SRV.*.*", "$SRV.*.*.*"];

/// Answers the NATS service protocol on `subject` for every catalog filter the node hosts
/// (those that serve their API), until the node stops. Three subscriptions per replica were
/// 3 of its 8, with a channel buffer of ~6 KB each, and 300,000 subscriptions in nats-server
/// for 100,000 filters.
pub(super) async fn serve_services(
    inner: Weak<Inner>,
    transport: Arc<dyn Transport>,
    subject: String,
    initial: Option<MessageStream>,
) {
    let stopped = stopped(inner.clone(), |i| &i.stopping);
    let answering = transport.clone();
    serve_subscription(transport, (subject, None), initial, stopped, |msg| {
        let answers = match (inner.upgrade(), msg.reply) {
            (Some(inner), Some(reply)) => Some((inner.service_answers(&msg.subject), reply)),
            _ => None,
        };
        let transport = answering.clone();
        async move {
            let Some((answers, reply)) = answers else {
                return;
            };
            for answer in answers {
                if let Err(e) = transport.publish(reply.clone(), answer).await {
                    tracing::debug!(error = %e, "a service protocol answer was not sent");
                }
            }
        }
    })
    .await
}

impl Inner {
    /// The answers of the catalog filters' service instances to the service request on
    /// `subject` (`$SRV.<verb>`, `$SRV.<verb>.<service>`, `$SRV.<verb>.<service>.<id>`).
    pub(super) fn service_answers(&self, subject: &str) -> Vec<Bytes> {
        let service = subject.split('.').nth(2);
        // The instances first, the answers (JSON of each) outside the lock: a `$SRV.PING` to
        // 100,000 filters must not hold up the creates and drops meanwhile.
        // To every service: the running replicas (parked ones are not woken for a census).
        // To one filter's: its replica, resumed if it was parked.
        let instances: Vec<_> = match service {
            None => {
                let table = self.table.read().expect("table lock");
                table
                    .iter_hosted()
                    .filter(|(name, ..)| self.answers_service_of(name))
                    .filter_map(|(.., running)| running?.service())
                    .collect()
            }
            Some(service) => service
                .strip_prefix(crate::replica::service::SERVICE_NAME_PREFIX)
                .filter(|name| self.answers_service_of(name))
                .and_then(|name| self.replica_pinned(name, false))
                .and_then(|h| h.service())
                .into_iter()
                .collect(),
        };
        instances.iter().filter_map(|s| s.answer(subject)).collect()
    }

    /// Whether the node answers `$SRV` for filter `name`: a catalog filter's, or a configured
    /// one it routes ([`Inner::configured_routed`]).
    pub(super) fn answers_service_of(&self, name: &str) -> bool {
        !self.configured.contains(name) || self.configured_routed.contains(name)
    }
}
