//! One replica id for every filter a node hosts from the catalog (DESIGN.md section 8).
//!
//! A replica of a configured filter claims an id of its own and renews it every
//! `id_lease_renew_ms` (two to four JetStream requests). At 100,000 filters that is 10,000 to
//! 40,000 registry requests a second and 200,000 at a start, so a node claims one id in the
//! registry namespace [`SharedId::NAMESPACE`] and its catalog replicas issue their tags under
//! it. The same lease rules hold (see [`crate::transport::ClaimRecord`]): no replica issues a
//! tag above the reservation the registry confirmed for the id, an id nobody renewed for
//! `retire_after` is retired with a floor at or above that reservation, and a later holder
//! starts above the floor.
//!
//! Why no tag is issued twice for one filter incarnation: every tag any replica ever issued
//! under the id is below the reservation the registry records. A replica that starts without
//! the durable state of its incarnation under this id (a new filter, a lost data directory, a
//! state written under another id) moves its clock to [`SharedId::floor`], the reservation
//! recorded before this node claimed the id again; one that restores its own state continues
//! from it and its saved reservation, which are below that floor too.
//!
//! Node ids count down from [`ReplicaId::MAX`] (registry key `_node.ids.1` is replica id
//! 65535, `.2` is 65534, ...) while a filter's own claims count up from 1, so the ids of the
//! two namespaces never meet in one state: not when an embedder starts a replica of a catalog
//! filter with its own claim, nor in the state of an incarnation that a node of an earlier
//! release hosted under per-filter claims.
//!
//! Kinds whose ids serve one run only (`counting_cuckoo`) keep a claim per replica.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

use super::ReplicaError;
use super::durable::Identity;
use super::metrics as m;
use crate::ReplicaId;
use crate::transport::registry::StaleWatch;
use crate::transport::{ClaimEntry, LogLimiter, Renewal, Transport, TransportError};

/// A node's replica id, shared by the replicas it hosts from the catalog, and the task that
/// renews it.
#[derive(Debug)]
pub struct SharedId {
    identity: Identity,
    /// The id's key in the registry namespace (see [`SharedId::replica_of`]).
    key: ReplicaId,
    floor: u64,
    block: u64,
    /// The highest tag timestamp the registry confirmed.
    reserved: AtomicU64,
    /// The highest reservation a replica asked for (its clock plus a block).
    wanted: AtomicU64,
    lost: AtomicBool,
    live_ids: AtomicUsize,
    retired_ids: AtomicUsize,
    /// The claims of the namespace as last listed, and when that listing started.
    claims: Mutex<Option<(Arc<Vec<ClaimEntry>>, Instant)>>,
    /// Wakes the renewal task: a replica runs low on tags, or the id is dropped.
    wake: Arc<Notify>,
}

impl Drop for SharedId {
    fn drop(&mut self) {
        // The renewal task holds a weak reference only: let it see that it may end.
        self.wake.notify_one();
    }
}

impl SharedId {
    /// The registry namespace of node ids: keys `_node.ids.<id>` in the `crpf_replicas`
    /// bucket. No filter's namespace looks like it (a configured filter's is its name, a
    /// subject token without dots; a catalog filter's `<name>.g<generation>`).
    pub const NAMESPACE: &'static str = "_node.ids";

    /// The replica id of registry key `key` (1 and up): counting down from the top.
    pub fn replica_of(key: ReplicaId) -> ReplicaId {
        ReplicaId::MAX - key.wrapping_sub(1)
    }

    /// Claims an id for `uuid` (`preferred`: the replica id it held before, if any) and
    /// records a first reservation of `block` tags above its floor.
    pub async fn claim(
        transport: &Arc<dyn Transport>,
        uuid: Uuid,
        preferred: Option<ReplicaId>,
        block: u64,
    ) -> Result<Arc<SharedId>, ReplicaError> {
        let ns = Self::NAMESPACE.to_string();
        let preferred = preferred.map(Self::replica_of); // the map is its own inverse
        let claim = transport
            .claim_replica_id(ns.clone(), uuid, preferred)
            .await?;
        let reserved = claim.floor.saturating_add(block);
        match transport.renew_claim(ns, claim.id, uuid, reserved).await? {
            Renewal::Held => {}
            Renewal::Lost => {
                return Err(ReplicaError::IdRetired {
                    replica: Self::replica_of(claim.id),
                });
            }
        }
        Ok(Arc::new(SharedId {
            identity: Identity {
                uuid,
                replica: Self::replica_of(claim.id),
            },
            key: claim.id,
            floor: claim.floor,
            block,
            reserved: AtomicU64::new(reserved),
            wanted: AtomicU64::new(reserved),
            lost: AtomicBool::new(false),
            live_ids: AtomicUsize::new(0),
            retired_ids: AtomicUsize::new(0),
            claims: Mutex::new(None),
            wake: Arc::new(Notify::new()),
        }))
    }

    /// The node's uuid and id.
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// Every tag issued under the id before this claim is at or below it.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The highest tag timestamp the registry confirmed.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// The id was retired while the node could not renew it: no more tags under it.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Ids of the namespace held and retired at the last listing.
    pub fn id_counts(&self) -> (usize, usize) {
        (
            self.live_ids.load(Ordering::Relaxed),
            self.retired_ids.load(Ordering::Relaxed),
        )
    }

    /// The claims as last listed and when that listing started.
    pub(crate) fn last_claims(&self) -> Option<(Arc<Vec<ClaimEntry>>, Instant)> {
        self.claims.lock().expect("claims lock").clone()
    }

    /// A replica's clock reached `clock`: renews at once when less than half a block of the
    /// reservation is left above it.
    pub(crate) fn want(&self, clock: u64) {
        let want = clock.saturating_add(self.block);
        let before = self.wanted.fetch_max(want, Ordering::AcqRel);
        if want > before && clock.saturating_add(self.block / 2) >= self.reserved() {
            self.wake.notify_one();
        }
    }

    /// Renews the claim every `every` (and when a replica runs low on tags), and retires the
    /// ids of the namespace nobody renewed for `retire_after` (zero: never). Ends when every
    /// other reference to the id is gone.
    pub fn spawn_renewals(
        self: &Arc<Self>,
        transport: Arc<dyn Transport>,
        every: Duration,
        retire_after: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let wake = self.wake.clone();
        tokio::spawn(async move {
            let limiter = LogLimiter::new(Duration::from_secs(60));
            let mut watch = StaleWatch::default();
            loop {
                // `notify_one` keeps a permit when nobody waits: no wake-up is missed.
                let _ = tokio::time::timeout(every, wake.notified()).await;
                let Some(id) = weak.upgrade() else { return };
                if id.lost() {
                    return;
                }
                id.renew(&transport, &mut watch, retire_after, &limiter)
                    .await;
            }
        })
    }

    async fn renew(
        &self,
        transport: &Arc<dyn Transport>,
        watch: &mut StaleWatch,
        retire_after: Duration,
        limiter: &LogLimiter,
    ) {
        let ns = Self::NAMESPACE.to_string();
        let want = self.wanted.load(Ordering::Acquire).max(self.reserved());
        let (uuid, replica, key) = (self.identity.uuid, self.identity.replica, self.key);
        match transport.renew_claim(ns.clone(), key, uuid, want).await {
            Ok(Renewal::Held) => {
                self.reserved.fetch_max(want, Ordering::AcqRel);
            }
            Ok(Renewal::Lost) => {
                self.lost.store(true, Ordering::Release);
                metrics::gauge!(m::ID_LOST, "filter" => m::AGGREGATE_FILTER).set(1.0);
                tracing::error!(
                    replica,
                    "this node's replica id was retired while it could not renew its claim: \
                     its catalog filters issue no more tags (adds to OR filters fail); \
                     restart the node to claim a new id"
                );
                return;
            }
            Err(e) => return failed(limiter, "renewing the node's claim", &e),
        }
        let started = Instant::now();
        let claims = match transport.replica_claims(ns.clone()).await {
            Ok(c) => c,
            Err(e) => return failed(limiter, "listing node ids", &e),
        };
        let stale = watch.stale(key, &claims, started, retire_after);
        self.live_ids.store(watch.live_ids, Ordering::Relaxed);
        self.retired_ids.store(watch.retired_ids, Ordering::Relaxed);
        for (state, n) in [("live", watch.live_ids), ("retired", watch.retired_ids)] {
            metrics::gauge!(m::REPLICA_IDS, "filter" => m::AGGREGATE_FILTER, "state" => state)
                .set(n as f64);
        }
        *self.claims.lock().expect("claims lock") = Some((Arc::new(claims), started));
        for e in stale {
            // At or above the holder's reservation: every tag it may have issued.
            let floor = e.record.floor();
            match transport
                .retire_claim(ns.clone(), e.id, e.revision, floor)
                .await
            {
                Ok(true) => {
                    metrics::counter!(m::RETIREMENTS, "filter" => m::AGGREGATE_FILTER).increment(1);
                    tracing::info!(
                        retired = Self::replica_of(e.id),
                        floor,
                        "retired a node id whose claim was not renewed"
                    );
                }
                // Renewed, or retired by another node, meanwhile.
                Ok(false) => {}
                Err(e) => failed(limiter, "retiring a node id", &e),
            }
        }
    }
}

fn failed(limiter: &LogLimiter, what: &'static str, e: &TransportError) {
    metrics::counter!(m::ID_LEASE_FAILURES, "filter" => m::AGGREGATE_FILTER).increment(1);
    if let Some(suppressed) = limiter.allow("lease") {
        tracing::warn!(error = %e, suppressed, "replica id registry: {what} failed; retrying");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::InProcessBus;

    #[tokio::test]
    async fn one_claim_serves_many_and_renews_when_a_replica_runs_low() {
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        let uuid = Uuid::new_v4();
        let id = SharedId::claim(&bus, uuid, None, 100).await.unwrap();
        assert_eq!((id.floor(), id.reserved()), (0, 100));
        let renewals = id.spawn_renewals(bus.clone(), Duration::from_secs(3600), Duration::ZERO);
        // Far from the reservation: nothing asked.
        id.want(10);
        // Within half a block of it: renewed at once, a block above the clock.
        id.want(60);
        for _ in 0..200 {
            if id.reserved() == 160 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(id.reserved(), 160);
        let claims = bus
            .replica_claims(SharedId::NAMESPACE.into())
            .await
            .unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].record.floor(), 160);
        assert_eq!(id.identity().replica, SharedId::replica_of(claims[0].id));
        assert_eq!(id.identity().replica, ReplicaId::MAX);
        let replica = id.identity().replica;
        // The same uuid takes its id back above everything reserved before.
        drop(id);
        renewals.await.unwrap();
        let again = SharedId::claim(&bus, uuid, Some(replica), 100)
            .await
            .unwrap();
        assert_eq!(again.identity().replica, replica);
        assert_eq!(again.floor(), 160);
        // Another node gets another id.
        let other = SharedId::claim(&bus, Uuid::new_v4(), None, 100)
            .await
            .unwrap();
        assert_ne!(other.identity().replica, again.identity().replica);
    }
}
