//! A node's digest batcher: its replicas hand it their anti-entropy digests, and it publishes
//! them together on `<prefix>.$digests` ([`crate::wire::batch`]), a few messages a second
//! where each replica published one per anti-entropy interval. The node that receives a
//! batch hands each frame to its replica of the filter, as if it had come on the filter's
//! `state` subject.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::Transport;
use crate::wire::batch::DigestBatch;

/// The last token of the subject of digest batches, `<prefix>.$digests` (no filter name
/// has a `$`).
pub const DIGESTS_TOKEN: &str = "$digests";

/// How long a digest waits for others to go out with it.
pub const DIGEST_WINDOW: Duration = Duration::from_millis(20);

/// The most bytes of frames one batch carries (more go in several; fewer under a server's
/// smaller `max_payload`).
pub const MAX_BATCH_BYTES: usize = 64 << 10;

/// Room left in a message for a batch's framing beside its frames.
const BATCH_FRAMING: usize = 4 << 10;

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

/// The digests queued by a node's replicas and not yet published: the newest of each filter
/// (an older one says nothing the newer does not), so that what waits while the server is
/// unreachable stays within one digest per filter.
#[derive(Debug, Default)]
pub struct DigestBatcher {
    pending: Mutex<HashMap<String, Vec<u8>>>,
    queued: Notify,
}

impl DigestBatcher {
    /// Queues the frame of `filter`'s digest (in place of one still queued); it goes out
    /// within [`DIGEST_WINDOW`] once the server takes what is published.
    pub fn push(&self, filter: &str, frame: Vec<u8>) {
        let first = {
            let mut pending = self.pending.lock().expect("digest batch lock");
            let first = pending.is_empty();
            match pending.get_mut(filter) {
                Some(queued) => *queued = frame,
                None => {
                    pending.insert(filter.to_string(), frame);
                }
            }
            first
        };
        if first {
            // Kept as a permit if the publisher is busy: it looks again.
            self.queued.notify_one();
        }
    }

    /// Queues the frames of many filters' digests at once (one lock), as [`Self::push`] each.
    pub fn push_all(&self, frames: impl IntoIterator<Item = (String, Vec<u8>)>) {
        let first = {
            let mut pending = self.pending.lock().expect("digest batch lock");
            let first = pending.is_empty();
            pending.extend(frames);
            first && !pending.is_empty()
        };
        if first {
            self.queued.notify_one();
        }
    }

    /// What is queued, as one batch.
    fn take(&self) -> DigestBatch {
        let pending = std::mem::take(&mut *self.pending.lock().expect("digest batch lock"));
        let mut batch = DigestBatch::default();
        for (filter, frame) in pending {
            batch.push(&filter, frame);
        }
        batch
    }
}

/// Publishes on `subject` what the replicas queue in `batcher`: a window after the first of
/// them, everything queued by then, in batches of at most [`MAX_BATCH_BYTES`] (or what the
/// server's `max_payload` allows). Runs until aborted, or until `stopped` says so (it looks
/// every second). A batch that cannot be published is lost like a digest would be: the next
/// round announces again.
pub(crate) async fn publish_digests(
    batcher: Arc<DigestBatcher>,
    transport: Arc<dyn Transport>,
    subject: String,
    stopped: impl Fn() -> bool,
) {
    loop {
        tokio::select! {
            _ = batcher.queued.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                if stopped() {
                    return;
                }
                continue;
            }
        }
        tokio::time::sleep(DIGEST_WINDOW).await;
        let max_bytes = transport
            .max_payload()
            .saturating_sub(BATCH_FRAMING)
            .clamp(1, MAX_BATCH_BYTES);
        for part in batcher.take().split(max_bytes) {
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

    /// A publisher of batches on `bus`, what it publishes, and its task.
    async fn publisher(
        bus: &InProcessBus,
    ) -> (
        Arc<DigestBatcher>,
        crate::transport::MessageStream,
        tokio::task::JoinHandle<()>,
    ) {
        let transport: Arc<dyn Transport> = Arc::new(bus.clone());
        let batches = bus.subscribe("p.$digests".into(), None).await.unwrap();
        let batcher = Arc::new(DigestBatcher::default());
        let task = tokio::spawn(publish_digests(
            batcher.clone(),
            transport,
            "p.$digests".into(),
            || false,
        ));
        (batcher, batches, task)
    }

    #[tokio::test]
    async fn digests_queued_together_go_out_in_one_batch() {
        let (batcher, mut batches, task) = publisher(&InProcessBus::new()).await;
        for i in 0..50 {
            batcher.push(&format!("f{i}"), vec![i as u8]);
        }
        // A newer digest of a filter replaces the one queued.
        batcher.push("f7", vec![77]);
        let first = tokio::time::timeout(Duration::from_secs(5), batches.next())
            .await
            .unwrap()
            .unwrap();
        let mut items = decode_batch(&first.payload).unwrap();
        items.sort();
        assert_eq!(items.len(), 50);
        assert!(items.contains(&("f49".to_string(), vec![49])));
        assert!(items.contains(&("f7".to_string(), vec![77])));
        // A digest queued later goes in the next batch.
        batcher.push("late", vec![1]);
        let next = tokio::time::timeout(Duration::from_secs(5), batches.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(decode_batch(&next.payload).unwrap().len(), 1);
        task.abort();
    }

    #[tokio::test]
    async fn batches_fit_the_servers_max_payload() {
        let bus = InProcessBus::with_limits(16 << 10, 1024);
        let (batcher, mut batches, task) = publisher(&bus).await;
        for i in 0..100 {
            batcher.push(&format!("f{i}"), vec![0; 500]);
        }
        let mut got = 0;
        while got < 100 {
            let msg = tokio::time::timeout(Duration::from_secs(5), batches.next())
                .await
                .expect("all 100 digests, in several batches")
                .unwrap();
            assert!(msg.payload.len() <= 16 << 10);
            got += decode_batch(&msg.payload).unwrap().len();
        }
        assert_eq!(got, 100);
        task.abort();
    }

    #[tokio::test]
    async fn the_publisher_ends_once_stopped() {
        let bus = InProcessBus::new();
        let transport: Arc<dyn Transport> = Arc::new(bus.clone());
        let batcher = Arc::new(DigestBatcher::default());
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            publish_digests(batcher, transport, "p.$digests".into(), || true),
        )
        .await;
        assert!(ended.is_ok());
    }
}
