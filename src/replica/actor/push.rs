//! A full-state push on its way out ([`StatePush`]) and the pace its receivers set for it
//! ([`Pacing`]); when a push may go, and which digest to announce, is the core's
//! ([`crate::replica::core::Pushes`], [`crate::replica::core::DigestCache`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uuid::Uuid;

use super::Shared;
use crate::replica::reassembly::PACING_WINDOW;
use crate::wire::{Body, Envelope, StateChunk, WireCodec, chunk_count, state_chunk};

/// Where a push's chunks come from.
pub(super) enum PushSource {
    /// One encoded buffer, and the whole state's xxh3-64 that every chunk carries.
    Encoded { state: Bytes, checksum: u64 },
    /// The live state, read a chunk at a time as it goes out (kinds merged piece by piece,
    /// [`StateChunk::live`]): the sender never holds the state twice; its receivers pace it.
    Live {
        shared: Arc<Shared>,
        total_len: u64,
        pacing: Arc<Pacing>,
    },
}

/// A full state on its way out, framed a chunk at a time by the publisher task, so that a
/// push holds the state about once (encoded, or not at all when read live) instead of as the
/// state, its chunks and their frames together. Its chunks' sequence numbers are reserved
/// when it is queued, so they stay in order with the messages queued around it.
pub(super) struct StatePush {
    pub(super) subject: String,
    pub(super) source: PushSource,
    pub(super) transfer: u64,
    pub(super) chunk_len: usize,
    /// Sequence number of the first chunk.
    pub(super) first_seq: u64,
    pub(super) codec: WireCodec,
    /// The envelope of every chunk but for its sequence number and body.
    pub(super) template: Envelope,
}

impl StatePush {
    /// Bytes of the encoded state.
    pub(super) fn len(&self) -> u64 {
        match &self.source {
            PushSource::Encoded { state, .. } => state.len() as u64,
            PushSource::Live { total_len, .. } => *total_len,
        }
    }

    pub(super) fn count(&self) -> usize {
        chunk_count(self.len() as usize, self.chunk_len)
    }

    /// The receivers' pace, for a live push.
    pub(super) fn pacing(&self) -> Option<&Pacing> {
        match &self.source {
            PushSource::Live { pacing, .. } => Some(pacing),
            PushSource::Encoded { .. } => None,
        }
    }

    /// The frame of chunk `i`; `None` if the live state could not be read (the push ends).
    pub(super) fn frame(&self, i: usize) -> Option<Vec<u8>> {
        let chunk = match &self.source {
            PushSource::Encoded { state, checksum } => {
                state_chunk(state, self.transfer, self.chunk_len, *checksum, i)
            }
            PushSource::Live {
                shared, total_len, ..
            } => {
                let mut data = Vec::with_capacity(self.chunk_len);
                let offset = (i * self.chunk_len) as u64;
                let filter = shared.filter.read().expect("filter lock poisoned");
                filter
                    .encode_state_piece(offset, self.chunk_len, &mut data)
                    .ok()?;
                drop(filter);
                StateChunk {
                    transfer: self.transfer,
                    index: i as u32,
                    count: self.count() as u32,
                    total_len: *total_len,
                    checksum: 0,
                    data,
                    live: true,
                }
            }
        };
        let mut env = self.template.clone();
        env.seq = self.first_seq + i as u64;
        env.body = Body::StateChunk(chunk);
        Some(self.codec.encode(&env))
    }
}

/// How long a live push waits for a receiver's report before it goes on without it: the
/// first report (none comes when no receiver merges pieces), or the next one of a receiver
/// that fell behind (it stopped, or abandoned the transfer).
pub(super) const PACING_STALL: Duration = Duration::from_secs(1);

/// Whether a live push's next chunk may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    Go,
    /// Not before a report, or this instant (when a silent receiver no longer counts).
    WaitUntil(Instant),
}

/// The receivers' progress through one live push ([`Body::StateProgress`]), reported to the
/// actor and read by the publisher task: a chunk goes only while every receiver heard from
/// lately is less than [`PACING_WINDOW`] chunks behind it, so that a receiver slower than
/// the link (one first touching the pages of a large filter) does not pile the state up in
/// its buffers. A receiver silent for [`PACING_STALL`] no longer counts.
pub(crate) struct Pacing {
    pub(super) transfer: u64,
    /// When its first chunk went out (it may have waited in the queue before).
    started: std::sync::OnceLock<Instant>,
    /// Per receiver: the next chunk it has not merged, and when it said so.
    receivers: Mutex<HashMap<Uuid, (u32, Instant)>>,
    reported: tokio::sync::Notify,
}

impl Pacing {
    pub(super) fn new(transfer: u64) -> Self {
        Pacing {
            transfer,
            started: std::sync::OnceLock::new(),
            receivers: Mutex::new(HashMap::new()),
            reported: tokio::sync::Notify::new(),
        }
    }

    /// `receiver` merged the chunks before `next`.
    pub(super) fn report(&self, receiver: Uuid, next: u32, now: Instant) {
        let mut receivers = self.receivers.lock().expect("pacing lock poisoned");
        let entry = receivers.entry(receiver).or_insert((0, now));
        *entry = (entry.0.max(next), now);
        drop(receivers);
        self.reported.notify_one();
    }

    /// Whether chunk `index` may go at `now` (asked for every chunk, from the first on).
    pub(super) fn pace(&self, index: u32, now: Instant) -> Pace {
        let started = *self.started.get_or_init(|| now);
        if index < PACING_WINDOW {
            return Pace::Go;
        }
        let receivers = self.receivers.lock().expect("pacing lock poisoned");
        if receivers.is_empty() {
            // Nobody reported yet: wait a while for the first, then go unpaced.
            let until = started + PACING_STALL;
            return if now < until {
                Pace::WaitUntil(until)
            } else {
                Pace::Go
            };
        }
        // The earliest a lagging receiver still heard from falls silent.
        receivers
            .values()
            .filter(|(next, heard)| {
                next.saturating_add(PACING_WINDOW) <= index && now < *heard + PACING_STALL
            })
            .map(|(_, heard)| *heard + PACING_STALL)
            .min()
            .map_or(Pace::Go, Pace::WaitUntil)
    }

    /// Waits until chunk `index` may go.
    pub(super) async fn wait(&self, index: u32) {
        loop {
            // A report between the check and the wait leaves a permit: no wake-up is lost.
            match self.pace(index, Instant::now()) {
                Pace::Go => return,
                Pace::WaitUntil(until) => {
                    let _ = tokio::time::timeout_at(until.into(), self.reported.notified()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live push runs a window ahead of its slowest receiver, waits at most
    /// [`PACING_STALL`] for a first report or for a silent receiver, and is not held by a
    /// receiver that is done or fast.
    #[test]
    fn a_live_push_keeps_a_window_ahead_of_its_slowest_receiver() {
        let t = Instant::now();
        let p = Pacing::new(1);
        let (fast, slow) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert_eq!(p.pace(0, t), Pace::Go);
        assert_eq!(p.pace(PACING_WINDOW - 1, t), Pace::Go);
        // Past the window, nobody heard from: wait for a first report, then go unpaced.
        assert_eq!(p.pace(PACING_WINDOW, t), Pace::WaitUntil(t + PACING_STALL));
        assert_eq!(p.pace(PACING_WINDOW, t + PACING_STALL), Pace::Go);
        let t1 = t + Duration::from_millis(10);
        p.report(fast, 40, t1);
        p.report(slow, 4, t1);
        assert_eq!(p.pace(4 + PACING_WINDOW - 1, t1), Pace::Go);
        assert_eq!(
            p.pace(4 + PACING_WINDOW, t1),
            Pace::WaitUntil(t1 + PACING_STALL),
            "held by the slow one"
        );
        // A report never moves a receiver back (they arrive in order, but a duplicate may not).
        p.report(slow, 2, t1);
        let t2 = t1 + Duration::from_millis(10);
        p.report(slow, 8, t2);
        assert_eq!(p.pace(4 + PACING_WINDOW, t2), Pace::Go);
        assert_eq!(
            p.pace(8 + PACING_WINDOW, t2),
            Pace::WaitUntil(t2 + PACING_STALL)
        );
        // Silent for the stall: it no longer counts.
        assert_eq!(p.pace(8 + PACING_WINDOW, t2 + PACING_STALL), Pace::Go);
    }

    #[tokio::test]
    async fn a_waiting_push_goes_on_at_a_report() {
        let p = Arc::new(Pacing::new(1));
        p.report(Uuid::from_u128(1), 0, Instant::now());
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.wait(PACING_WINDOW + 3).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        p.report(Uuid::from_u128(1), 4, Instant::now());
        tokio::time::timeout(Duration::from_millis(500), waiter)
            .await
            .expect("went on at the report")
            .unwrap();
    }
}
