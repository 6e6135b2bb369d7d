//! Whether a replica is ready and whether its actor is gone, for those who wait on either
//! outside the actor: handles waiting for the catch-up, and the tasks forwarding a
//! subscription, which end when the actor does.
//!
//! Two flags and one [`Notify`], all inline in the replica's `Shared`: a `watch` channel cost
//! each replica a 384-byte allocation, and a node holds 100,000 of them, nearly all idle.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Ready (set once, when the replica caught up) and gone (set once, when its actor stopped).
#[derive(Debug, Default)]
pub(crate) struct Lifecycle {
    ready: AtomicBool,
    gone: AtomicBool,
    /// Wakes every waiter when either flag is set; each looks again at its own.
    changed: Notify,
}

impl Lifecycle {
    /// Whether the replica caught up after its start.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The replica caught up: wakes those waiting for it.
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// The actor stopped: wakes the tasks that end with it.
    pub(crate) fn set_gone(&self) {
        self.gone.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Returns once the replica is ready.
    pub(crate) async fn ready(&self) {
        self.until(|l| l.is_ready()).await
    }

    /// Returns once the actor is gone.
    pub(crate) async fn gone(&self) {
        self.until(|l| l.gone.load(Ordering::Acquire)).await
    }

    async fn until(&self, done: impl Fn(&Self) -> bool) {
        loop {
            // Registered before the flag is read: a `notify_waiters` between the two is not
            // missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(self) {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn waiters_wake_on_their_own_flag_only() {
        let l = Arc::new(Lifecycle::default());
        let ready = tokio::spawn({
            let l = l.clone();
            async move { l.ready().await }
        });
        let gone = tokio::spawn({
            let l = l.clone();
            async move { l.gone().await }
        });
        tokio::task::yield_now().await;
        l.set_ready();
        tokio::time::timeout(Duration::from_secs(5), ready)
            .await
            .expect("woken by set_ready")
            .unwrap();
        assert!(l.is_ready());
        // Woken too, it looks again and keeps waiting.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!gone.is_finished());
        l.set_gone();
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .expect("woken by set_gone")
            .unwrap();
    }

    #[tokio::test]
    async fn a_flag_set_before_the_wait_returns_at_once() {
        let l = Lifecycle::default();
        l.set_gone();
        l.set_ready();
        tokio::time::timeout(Duration::from_secs(1), async {
            l.ready().await;
            l.gone().await;
        })
        .await
        .expect("no wait for flags already set");
    }
}
