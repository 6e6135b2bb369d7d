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
//! Node ids count up from 1 like a filter's own, and stay as few as the nodes that run at
//! once (retired ids are taken first): the writer series kinds give writer `w` the FPR budget
//! `fpr / ((w + 1)(w + 2))`, so small ids keep their filters small. The ids of the node
//! namespace and of a filter's own claims may be equal, so every replica of a catalog filter
//! must be hosted by a node (the catalog only ever starts them there); a catalog filter is
//! never a configured one. A configured filter takes the node's id too where its kind has no
//! tags (nothing it issues under the id must stay unique): 10,000 of them claiming and
//! renewing their own kept nats-server 75% busy. Configured filters of tagged kinds keep their
//! own claims: a replica of theirs outside any node (embedded, or on a node without a
//! catalog) claims in the filter's namespace, and one tag issued twice loses elements.
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
use crate::transport::registry::{self, StaleWatch, TakeBack};
use crate::transport::{ClaimEntry, LogLimiter, Renewal, Transport, TransportError};

/// A node's replica id, shared by the replicas it hosts from the catalog, and the task that
/// renews it.
#[derive(Debug)]
pub struct SharedId {
    identity: Identity,
    /// Every tag issued under the id by anyone is at or below it; raised when the node takes
    /// its retired id back.
    floor: AtomicU64,
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
    /// The reservation confirmed, for those waiting for more.
    confirmed: tokio::sync::watch::Sender<u64>,
    /// When the last listing that counted the ids started, for those waiting for a fresh one.
    looked: tokio::sync::watch::Sender<Option<Instant>>,
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

    /// Claims an id for `uuid` (`preferred`: the replica id it held before, if any) and
    /// records a first reservation of `block` tags above its floor.
    pub async fn claim(
        transport: &Arc<dyn Transport>,
        uuid: Uuid,
        preferred: Option<ReplicaId>,
        block: u64,
    ) -> Result<Arc<SharedId>, ReplicaError> {
        let ns = Self::NAMESPACE.to_string();
        let claim = transport
            .claim_replica_id(ns.clone(), uuid, preferred)
            .await?;
        let reserved = claim.floor.saturating_add(block);
        match transport.renew_claim(ns, claim.id, uuid, reserved).await? {
            Renewal::Held => {}
            Renewal::Lost => return Err(ReplicaError::IdRetired { replica: claim.id }),
        }
        Ok(Arc::new(SharedId {
            identity: Identity {
                uuid,
                replica: claim.id,
            },
            floor: AtomicU64::new(claim.floor),
            block,
            reserved: AtomicU64::new(reserved),
            wanted: AtomicU64::new(reserved),
            lost: AtomicBool::new(false),
            live_ids: AtomicUsize::new(0),
            retired_ids: AtomicUsize::new(0),
            claims: Mutex::new(None),
            wake: Arc::new(Notify::new()),
            confirmed: tokio::sync::watch::channel(reserved).0,
            looked: tokio::sync::watch::channel(None).0,
        }))
    }

    /// The node's uuid and id.
    pub fn identity(&self) -> Identity {
        self.identity
    }

    /// Every tag issued under the id before this claim (or before the node took it back
    /// after its retirement) is at or below it: a replica's clock moves up to it before it
    /// issues a tag.
    pub fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    /// The highest tag timestamp the registry confirmed.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// The id was retired while the node could not renew it and is not taken back (yet, or
    /// another node holds it): no more tags under it.
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

    /// Waits (up to `timeout`) until the registry confirmed tags up to `need`, asking the
    /// renewal task for them (and a block more) at once; whether it did.
    pub(crate) async fn reserved_at_least(&self, need: u64, timeout: Duration) -> bool {
        let mut confirmed = self.confirmed.subscribe();
        self.wanted
            .fetch_max(need.saturating_add(self.block), Ordering::AcqRel);
        self.wake.notify_one();
        tokio::time::timeout(timeout, confirmed.wait_for(|r| *r >= need))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits (up to `timeout`) for a listing of the ids that started at or after `since`,
    /// asking the renewal task for one at once; when the first such listing started.
    pub(crate) async fn looked_since(&self, since: Instant, timeout: Duration) -> Option<Instant> {
        let mut looked = self.looked.subscribe();
        self.wake.notify_one();
        let fresh = looked.wait_for(|at| at.is_some_and(|at| at >= since));
        match tokio::time::timeout(timeout, fresh).await {
            Ok(Ok(at)) => *at,
            _ => None,
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
                    // Each round until it is ours again (another node may hold it for good:
                    // one listing a round is all that costs).
                    id.take_back(&transport, &limiter).await;
                    continue;
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
        let Identity { uuid, replica } = self.identity;
        match transport.renew_claim(ns.clone(), replica, uuid, want).await {
            Ok(Renewal::Held) => {
                self.reserved.fetch_max(want, Ordering::AcqRel);
                self.confirmed.send_if_modified(|r| {
                    let grew = want > *r;
                    *r = (*r).max(want);
                    grew
                });
            }
            Ok(Renewal::Lost) => {
                self.lost.store(true, Ordering::Release);
                metrics::gauge!(m::ID_LOST, "filter" => m::AGGREGATE_FILTER).set(1.0);
                tracing::warn!(
                    replica,
                    "this node's replica id was retired while it could not renew its claim: \
                     taking it back above the retirement's floor (adds to OR filters wait)"
                );
                self.take_back(transport, limiter).await;
                return;
            }
            Err(e) => return failed(limiter, "renewing the node's claim", &e),
        }
        let started = Instant::now();
        let claims = match transport.replica_claims(ns.clone()).await {
            Ok(c) => c,
            Err(e) => return failed(limiter, "listing node ids", &e),
        };
        let stale = watch.stale(replica, &claims, started, retire_after);
        self.live_ids.store(watch.live_ids, Ordering::Relaxed);
        self.retired_ids.store(watch.retired_ids, Ordering::Relaxed);
        for (state, n) in [("live", watch.live_ids), ("retired", watch.retired_ids)] {
            metrics::gauge!(m::REPLICA_IDS, "filter" => m::AGGREGATE_FILTER, "state" => state)
                .set(n as f64);
        }
        *self.claims.lock().expect("claims lock") = Some((Arc::new(claims), started));
        self.looked.send_replace(Some(started));
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
                        retired = e.id,
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

impl SharedId {
    /// Takes the retired id back (see [`registry::take_back`]): tags go on above the
    /// retirement's floor, under the same identity, so nothing the replicas wrote changes.
    async fn take_back(&self, transport: &Arc<dyn Transport>, limiter: &LogLimiter) {
        let Identity { uuid, replica } = self.identity;
        let want = self.wanted.load(Ordering::Acquire);
        match registry::take_back(
            transport.as_ref(),
            Self::NAMESPACE,
            replica,
            uuid,
            self.block,
            want,
        )
        .await
        {
            Ok(TakeBack::Taken { floor, reserved }) => {
                // The floor first: a replica that sees the id kept sees the floor too.
                self.floor.fetch_max(floor, Ordering::AcqRel);
                self.reserved.fetch_max(reserved, Ordering::AcqRel);
                self.confirmed.send_if_modified(|r| {
                    let grew = reserved > *r;
                    *r = (*r).max(reserved);
                    grew
                });
                self.lost.store(false, Ordering::Release);
                metrics::gauge!(m::ID_LOST, "filter" => m::AGGREGATE_FILTER).set(0.0);
                tracing::info!(
                    replica,
                    floor,
                    "took this node's retired replica id back: its catalog filters issue tags \
                     above the retirement's floor"
                );
            }
            Ok(TakeBack::HeldByOther) => {
                if let Some(suppressed) = limiter.allow("held_by_other") {
                    tracing::error!(
                        replica,
                        suppressed,
                        "this node's replica id was retired and another node holds it now: \
                         its catalog filters issue no tags (adds to OR filters fail); restart \
                         the node to claim a new id"
                    );
                }
            }
            Err(e) => failed(limiter, "taking the node's retired id back", &e),
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
        assert_eq!(id.identity().replica, claims[0].id);
        assert_eq!(id.identity().replica, 1);
        let replica = id.identity().replica;
        // An import waits for a reservation that covers it.
        assert!(id.reserved_at_least(500, Duration::from_secs(10)).await);
        assert!(id.reserved() >= 500);
        let before_import = id.reserved();
        // The same uuid takes its id back above everything reserved before.
        drop(id);
        renewals.await.unwrap();
        let again = SharedId::claim(&bus, uuid, Some(replica), 100)
            .await
            .unwrap();
        assert_eq!(again.identity().replica, replica);
        assert_eq!(again.floor(), before_import);
        // Another node gets another id.
        let other = SharedId::claim(&bus, Uuid::new_v4(), None, 100)
            .await
            .unwrap();
        assert_ne!(other.identity().replica, again.identity().replica);
    }

    /// Issue 47, item 8: a node whose id was retired while it was cut off from the registry
    /// refused tagged adds until a restart. It takes the id back at its next renewal, with a
    /// floor at or above the retirement's; another node holding it by then keeps it.
    #[tokio::test]
    async fn a_retired_node_id_is_taken_back_at_the_next_renewal() {
        let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
        let ns = || SharedId::NAMESPACE.to_string();
        let id = SharedId::claim(&bus, Uuid::new_v4(), None, 100)
            .await
            .unwrap();
        let replica = id.identity().replica;
        let renewals = id.spawn_renewals(bus.clone(), Duration::from_millis(20), Duration::ZERO);
        let retire = |floor| {
            let bus = bus.clone();
            async move {
                loop {
                    let e = bus.replica_claims(ns()).await.unwrap()[0];
                    if bus
                        .retire_claim(ns(), e.id, e.revision, floor)
                        .await
                        .unwrap()
                    {
                        return;
                    }
                }
            }
        };
        retire(9_000).await;
        let mut taken = false;
        for _ in 0..500 {
            if !id.lost() && id.floor() == 9_000 {
                taken = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(taken, "lost {}, floor {}", id.lost(), id.floor());
        assert_eq!(id.identity().replica, replica);
        assert!(id.reserved() >= 9_100);
        // Retired again and claimed by another node first: lost, and it stays so.
        retire(0).await;
        let other = bus
            .claim_replica_id(ns(), Uuid::new_v4(), Some(replica))
            .await
            .unwrap();
        assert_eq!(other.id, replica);
        for _ in 0..500 {
            if id.lost() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(id.lost());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(id.lost());
        assert_eq!(bus.replica_claims(ns()).await.unwrap().len(), 1);
        drop(id);
        renewals.await.unwrap();
    }
}
