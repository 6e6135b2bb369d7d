//! `expiring_bloom` replicas whose wall clock steps ahead and back (issue 47, item 7), with the
//! clock injected per replica ([`ReplicaHandle::set_clock_offset_ms`]) on the in-process bus.
//!
//! - A replica whose clock jumps two hours ahead while its peers are live refuses local adds
//!   (`ClockAhead`) instead of advancing its state: it keeps its items, still merges its
//!   peers' new ones, and adds again once its clock is corrected. Its state used to jump with
//!   the clock: it dropped every item, and its peers refused its frames for good.
//! - A replica restarted from a data directory whose snapshot was taken while its clock was
//!   two hours ahead (alone, so nothing bounded it) repairs its state at start, and it and its
//!   peer then take each other's adds again.
#![cfg(feature = "node")]

mod replica_common;

use std::sync::Arc;
use std::time::Duration;

use crpf::ExpirySpec;
use crpf::replica::{Replica, ReplicaConfig, ReplicaError};
use crpf::transport::{InProcessBus, Transport};
use crpf::wire::FilterKind;
use replica_common::*;

const WAIT: Duration = Duration::from_secs(30);
const TWO_HOURS_MS: i64 = 2 * 3_600_000;

/// Epochs of a minute, a window of ten, one epoch of skew: the test's items stay live for its
/// whole run on an honest clock.
fn expiring() -> ReplicaConfig {
    let mut c = cfg("window", FilterKind::ExpiringBloom, 1000, 0.01);
    c.filter.expiry = Some(ExpirySpec {
        window_ms: 600_000,
        epochs: 10,
        max_skew_epochs: 1,
    });
    c
}

#[actix::test]
async fn a_replica_whose_clock_jumps_ahead_refuses_adds_and_keeps_its_state() {
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let hs = start_n(2, &expiring(), bus).await;
    let (a, b) = (&hs[0], &hs[1]);
    a.add(b"a1".to_vec()).await.unwrap();
    b.add(b"b1".to_vec()).await.unwrap();
    assert!(converged(&hs, WAIT).await);

    b.set_clock_offset_ms(TWO_HOURS_MS);
    match b.add(b"b2".to_vec()).await {
        Err(ReplicaError::ClockAhead {
            ahead_epochs,
            max_skew: 1,
        }) => assert!(ahead_epochs >= 119, "{ahead_epochs}"),
        other => panic!("an add on a clock two hours ahead: {other:?}"),
    }
    // Housekeeping comes and goes: the state keeps the peers' window.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(b.contains(b"a1") && b.contains(b"b1"), "b lost its items");
    a.add(b"a2".to_vec()).await.unwrap();
    assert!(
        b.wait_until(WAIT, |f| f.contains(b"a2")).await,
        "b no longer takes its peer's adds"
    );

    b.set_clock_offset_ms(0);
    b.add(b"b3".to_vec()).await.unwrap();
    assert!(
        a.wait_until(WAIT, |f| f.contains(b"b3")).await,
        "the peer refuses b's adds"
    );
    assert!(converged(&hs, WAIT).await);
    for item in [&b"a1"[..], b"b1", b"a2", b"b3"] {
        assert!(a.contains(item) && b.contains(item));
    }
    assert_eq!(rejects(a, "clock_ahead").await, 0, "b never sent its jump");
    stop(&hs).await;
}

#[actix::test]
async fn a_state_restored_from_ahead_of_a_corrected_clock_heals() {
    let dir = tempfile::tempdir().unwrap();
    let mut durable = expiring();
    durable.data_dir = Some(dir.path().to_path_buf());

    // Alone, with its clock two hours ahead: nothing bounds it, and its snapshot keeps it.
    let alone: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let b = Replica::start(durable.clone(), alone).await.unwrap();
    assert!(b.wait_ready(WAIT).await);
    b.set_clock_offset_ms(TWO_HOURS_MS);
    b.add(b"from the future".to_vec()).await.unwrap();
    let now_epoch = crpf::replica::AnyFilter::new(&durable.filter, 1)
        .unwrap()
        .clock_bounds()
        .map(|(len, _)| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
                / len
        })
        .unwrap();
    assert!(b.snapshot().clock_epoch().unwrap() >= now_epoch + 119);
    b.shutdown().await.unwrap();

    // Its clock corrected, it restarts beside a peer.
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let a = Replica::start(expiring(), bus.clone()).await.unwrap();
    assert!(a.wait_ready(WAIT).await);
    a.add(b"a1".to_vec()).await.unwrap();
    let b = Replica::start(durable, bus).await.unwrap();
    assert!(
        b.wait_until(WAIT, |f| f.clock_epoch().unwrap() <= now_epoch + 1)
            .await,
        "the restored state was not repaired"
    );
    assert!(
        !b.contains(b"from the future"),
        "the epochs beyond the clock are discarded"
    );
    b.add(b"b1".to_vec()).await.unwrap();
    assert!(
        a.wait_until(WAIT, |f| f.contains(b"b1")).await,
        "the peer refuses the restarted replica's adds"
    );
    assert!(
        b.wait_until(WAIT, |f| f.contains(b"a1")).await,
        "the restarted replica drops its peer's items"
    );
    assert!(converged(&[a.clone(), b.clone()], WAIT).await);
    stop(&[a, b]).await;
}
