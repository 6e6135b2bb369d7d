//! A node's digest batcher: its replicas hand it their anti-entropy digests, and it publishes
//! them together on `<prefix>.$digests` ([`crate::wire::batch`]), a few messages a second
//! where each replica published one per anti-entropy interval. The node that receives a
//! batch hands each frame to its replica of the filter, as if it had come on the filter's
//! `state` subject.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::Transport;
use crate::wire::batch::DigestBatch;

/// How long a digest waits for others to go out with it.
pub const DIGEST_WINDOW: Duration = Duration::from_millis(20);

/// The most bytes of frames one batch carries (more go in several).
pub const MAX_BATCH_BYTES: usize = 64 << 10;

/// Digest batches, by `direction` (`in`, `out`).
pub const DIGEST_BATCHES: &str = "crpf_digest_batches_total";
/// Digests that went in batches, by `direction` (`in`, `out`).
pub const BATCHED_DIGESTS: &str = "crpf_batched_digests_total";
/// Digest batches refused whole (not a batch, or of another version).
pub const DIGEST_BATCHES_REJECTED: &str = "crpf_digest_batches_rejected_total";

/// Describes the batches' metrics.
pub(crate) fn describe() {
    metrics::describe_counter!(
        DIGEST_BATCHES,
        "Anti-entropy digest batches, by direction (in, out)"
    );
    metrics::describe_counter!(
        BATCHED_DIGESTS,
        "Anti-entropy digests that went in batches, by direction (in, out)"
    );
    metrics::describe_counter!(
        DIGEST_BATCHES_REJECTED,
        "Digest batches refused whole (not a batch, or of another version)"
    );
}

/// The digests queued by a node's replicas and not yet published.
#[derive(Debug, Default)]
pub struct DigestBatcher {
    pending: Mutex<DigestBatch>,
    queued: Notify,
}

impl DigestBatcher {
    /// Queues the frame of `filter`'s digest; it goes out within [`DIGEST_WINDOW`].
    pub fn push(&self, filter: &str, frame: Vec<u8>) {
        let first = {
            let mut pending = self.pending.lock().expect("digest batch lock");
            let first = pending.is_empty();
            pending.push(filter, frame);
            first
        };
        if first {
            // Kept as a permit if the publisher is busy: it looks again.
            self.queued.notify_one();
        }
    }

    fn take(&self) -> DigestBatch {
        std::mem::take(&mut *self.pending.lock().expect("digest batch lock"))
    }
}

/// Publishes on `subject` what the replicas queue in `batcher`: a window after the first of
/// them, everything queued by then, in batches of at most [`MAX_BATCH_BYTES`]. Runs until
/// aborted. A batch that cannot be published is lost like a digest would be: the next
/// round announces again.
pub(crate) async fn publish_digests(
    batcher: Arc<DigestBatcher>,
    transport: Arc<dyn Transport>,
    subject: String,
) {
    loop {
        batcher.queued.notified().await;
        tokio::time::sleep(DIGEST_WINDOW).await;
        for part in batcher.take().split(MAX_BATCH_BYTES) {
            let count = part.len() as u64;
            match transport
                .publish(subject.clone(), part.encode().into())
                .await
            {
                Ok(()) => {
                    metrics::counter!(DIGEST_BATCHES, "direction" => "out").increment(1);
                    metrics::counter!(BATCHED_DIGESTS, "direction" => "out").increment(count);
                }
                Err(e) => tracing::debug!(error = %e, "a digest batch was not published"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Bus, InProcessBus};
    use crate::wire::batch::decode_batch;
    use futures::StreamExt;

    #[tokio::test]
    async fn digests_queued_together_go_out_in_one_batch() {
        let bus = InProcessBus::new();
        let transport: Arc<dyn Transport> = Arc::new(bus.clone());
        let mut batches = bus.subscribe("p.$digests".into(), None).await.unwrap();
        let batcher = Arc::new(DigestBatcher::default());
        let task = tokio::spawn(publish_digests(
            batcher.clone(),
            transport,
            "p.$digests".into(),
        ));
        for i in 0..50 {
            batcher.push(&format!("f{i}"), vec![i as u8]);
        }
        let first = tokio::time::timeout(Duration::from_secs(5), batches.next())
            .await
            .unwrap()
            .unwrap();
        let items = decode_batch(&first.payload).unwrap();
        assert_eq!(items.len(), 50);
        assert_eq!(items[49], ("f49".to_string(), vec![49]));
        // A digest queued later goes in the next batch.
        batcher.push("late", vec![1]);
        let next = tokio::time::timeout(Duration::from_secs(5), batches.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(decode_batch(&next.payload).unwrap().len(), 1);
        task.abort();
    }
}
