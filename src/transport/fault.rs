//! Fault injection: a transport wrapper that loses messages on purpose.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use uuid::Uuid;

use super::{
    Bus, Channel, Claim, ClaimEntry, IdRegistry, MessageStream, Renewal, Subjects, Transport,
    TransportError, TransportEvent,
};
use crate::ReplicaId;

/// How often a [`FaultyTransport`] loses what it publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultConfig {
    /// Probability that a publish on a `.delta` subject is silently lost.
    pub drop_delta: f64,
    /// Probability that a publish on a `.state` subject is silently lost.
    pub drop_state: f64,
    /// Seed of the loss pattern (reproducible runs).
    pub seed: u64,
}

/// Wraps a transport and silently loses a share of its publishes, as core NATS may. While
/// [`FaultyTransport::set_partitioned`] is on, it loses everything it sends and receives,
/// like a replica cut off from its peers. Publishes still return `Ok`.
#[derive(Clone)]
pub struct FaultyTransport {
    inner: Arc<dyn Transport>,
    cfg: FaultConfig,
    rng: Arc<Mutex<fastrand::Rng>>,
    dropped: Arc<AtomicU64>,
    partitioned: Arc<AtomicBool>,
}

impl FaultyTransport {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Transport>, cfg: FaultConfig) -> Self {
        FaultyTransport {
            inner,
            rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(cfg.seed))),
            cfg,
            dropped: Arc::new(AtomicU64::new(0)),
            partitioned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Messages lost on purpose so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Cuts (or restores) this transport's traffic in both directions.
    pub fn set_partitioned(&self, on: bool) {
        self.partitioned.store(on, Ordering::Relaxed);
    }

    fn lose(&self, subject: &str) -> bool {
        let p = if self.partitioned.load(Ordering::Relaxed) {
            1.0
        } else {
            match Subjects::channel_of(subject) {
                Some(Channel::Delta) => self.cfg.drop_delta,
                Some(Channel::State) => self.cfg.drop_state,
                // A node's digest batch is state traffic too.
                None if subject.rsplit('.').next() == Some(super::digests::DIGESTS_TOKEN) => {
                    self.cfg.drop_state
                }
                Some(Channel::Api) | None => 0.0,
            }
        };
        p > 0.0 && self.rng.lock().expect("rng lock").f64() < p
    }
}

impl Bus for FaultyTransport {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn publish(
        &self,
        subject: String,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        if self.lose(&subject) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return futures::future::ready(Ok(())).boxed();
        }
        self.inner.publish(subject, payload)
    }

    fn publish_with_headers(
        &self,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<(), TransportError>> {
        if self.lose(&subject) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return futures::future::ready(Ok(())).boxed();
        }
        self.inner.publish_with_headers(subject, headers, payload)
    }

    fn subscribe(
        &self,
        subject: String,
        queue_group: Option<String>,
    ) -> BoxFuture<'static, Result<MessageStream, TransportError>> {
        let partitioned = self.partitioned.clone();
        let dropped = self.dropped.clone();
        let fut = self.inner.subscribe(subject, queue_group);
        async move {
            let s = fut.await?;
            Ok(s.filter(move |_| {
                let cut = partitioned.load(Ordering::Relaxed);
                if cut {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                futures::future::ready(!cut)
            })
            .boxed())
        }
        .boxed()
    }

    fn request(
        &self,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, TransportError>> {
        self.inner.request(subject, payload, timeout)
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    fn events(&self) -> broadcast::Receiver<TransportEvent> {
        self.inner.events()
    }

    fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        self.inner.flush()
    }

    fn round_trip(&self) -> BoxFuture<'static, Result<(), TransportError>> {
        self.inner.round_trip()
    }
}

impl IdRegistry for FaultyTransport {
    fn claim_replica_id(
        &self,
        filter: String,
        claimant: Uuid,
        preferred: Option<ReplicaId>,
    ) -> BoxFuture<'static, Result<Claim, TransportError>> {
        self.inner.claim_replica_id(filter, claimant, preferred)
    }

    fn renew_claim(
        &self,
        filter: String,
        id: ReplicaId,
        claimant: Uuid,
        reserved: u64,
    ) -> BoxFuture<'static, Result<Renewal, TransportError>> {
        self.inner.renew_claim(filter, id, claimant, reserved)
    }

    fn replica_claims(
        &self,
        filter: String,
    ) -> BoxFuture<'static, Result<Vec<ClaimEntry>, TransportError>> {
        self.inner.replica_claims(filter)
    }

    fn retire_claim(
        &self,
        filter: String,
        id: ReplicaId,
        revision: u64,
        floor: u64,
    ) -> BoxFuture<'static, Result<bool, TransportError>> {
        self.inner.retire_claim(filter, id, revision, floor)
    }
}
