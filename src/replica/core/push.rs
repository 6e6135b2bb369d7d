//! When a full-state push may go ([`Pushes`]: one per `min_push_interval`, one encoding at a
//! time, one timer for every peer that asked meanwhile), the transfer ids that tell a
//! restarted replica's transfers from old ones, and which digest to announce
//! ([`DigestCache`]). The shell carries out what these decide (the push itself, its
//! chunks and their pace: `actor/push.rs`).

use std::time::{Duration, Instant};

/// Room left in a frame for the envelope around a chunk.
pub(crate) const ENVELOPE_OVERHEAD: usize = 1024;

/// The shortest wait of a push put off: a timer of less fires in the runtime's next
/// millisecond anyway, and peers asking together then share one push.
const MIN_PUSH_WAIT: Duration = Duration::from_millis(10);

/// The length of a push's chunks: `chunk_bytes`, but a chunk and its envelope fit in one
/// message of the transport (`max_payload`).
pub(crate) fn chunk_len(chunk_bytes: usize, max_payload: usize) -> usize {
    chunk_bytes
        .min(max_payload.saturating_sub(ENVELOPE_OVERHEAD))
        .max(1)
}

/// What to do about a push asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushPlan {
    /// Encode and push now.
    Now,
    /// Arm a timer for this long, then ask [`Pushes::timer_fired`].
    After(Duration),
    /// A timer is armed already: that push serves this request too.
    Armed,
}

/// The full-state pushes of one replica.
pub(crate) struct Pushes {
    /// `min_push_interval_ms`.
    min_interval: Duration,
    last: Option<Instant>,
    timer: bool,
    /// A push is being encoded (off the actor's thread).
    encoding: bool,
    /// The state changed since the last push.
    changed: bool,
    /// Transfer ids: a random epoch per start in the high half, a counter in the low one,
    /// so that a restarted replica's transfers are never taken for old ones.
    transfer: u64,
}

impl Pushes {
    /// Pushes at most every `min_interval`, with transfer ids in `epoch`.
    pub(crate) fn new(min_interval: Duration, epoch: u32) -> Self {
        Pushes {
            min_interval,
            last: None,
            timer: false,
            encoding: false,
            changed: false,
            transfer: u64::from(epoch) << 32,
        }
    }

    /// A push is asked for at `now`: at once if the last is `min_interval` old and none is
    /// being encoded, else after a timer (one for every request meanwhile).
    pub(crate) fn plan(&mut self, now: Instant) -> PushPlan {
        if self.timer {
            return PushPlan::Armed;
        }
        let wait = self.last.map_or(Duration::ZERO, |t| {
            (t + self.min_interval).saturating_duration_since(now)
        });
        if wait.is_zero() && !self.encoding {
            return PushPlan::Now;
        }
        self.timer = true;
        PushPlan::After(wait.max(MIN_PUSH_WAIT))
    }

    /// The timer fired: whether to push now (else plan again: one is still being encoded).
    pub(crate) fn timer_fired(&mut self) -> bool {
        self.timer = false;
        !self.encoding
    }

    /// A push starts at `now`: its transfer id. The counter wraps within the epoch half
    /// (2^32 pushes).
    pub(crate) fn start(&mut self, now: Instant) -> u64 {
        self.last = Some(now);
        self.changed = false;
        self.encoding = true;
        self.transfer =
            (self.transfer & !0xffff_ffff) | (self.transfer.wrapping_add(1) & 0xffff_ffff);
        self.transfer
    }

    /// The push started last is encoded (or its encoding failed).
    pub(crate) fn encoded(&mut self) {
        self.encoding = false;
    }

    /// The state changed.
    pub(crate) fn changed(&mut self) {
        self.changed = true;
    }

    /// Whether the state changed since the last push.
    pub(crate) fn changed_since_last(&self) -> bool {
        self.changed
    }
}

/// The replica's digest: cached until the state changes, and the last one computed kept for
/// announcing while nobody compares it (a digest is a pass over the whole state for some
/// kinds: 0.14 s of the actor's thread for an `or_cuckoo` of 8.6M entries).
#[derive(Debug, Default)]
pub(crate) struct DigestCache {
    current: Option<u64>,
    announced: Option<u64>,
}

impl DigestCache {
    /// The digest of the state, computed with `compute` unless cached.
    pub(crate) fn get(&mut self, compute: impl FnOnce() -> u64) -> u64 {
        if let Some(d) = self.current {
            return d;
        }
        let d = compute();
        self.current = Some(d);
        self.announced = Some(d);
        d
    }

    /// The digest to announce: with no live peer, the last one computed, even if the state
    /// changed since (a replica that appears announces its own, and comparing with it
    /// computes ours afresh).
    pub(crate) fn announced(&mut self, live_peers: usize, compute: impl FnOnce() -> u64) -> u64 {
        match self.announced {
            Some(d) if live_peers == 0 => d,
            _ => self.get(compute),
        }
    }

    /// The state changed: the cached digest is stale.
    pub(crate) fn invalidate(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_millis(500);

    #[test]
    fn pushes_keep_their_interval_and_share_one_timer() {
        let t = Instant::now();
        let mut p = Pushes::new(MIN, 7);
        assert_eq!(p.plan(t), PushPlan::Now);
        let first = p.start(t);
        assert_eq!(first >> 32, 7, "in the epoch");
        // Asked for again at once: after the interval, one timer for every request.
        assert_eq!(
            p.plan(t + Duration::from_millis(100)),
            PushPlan::After(Duration::from_millis(400))
        );
        assert_eq!(p.plan(t + Duration::from_millis(200)), PushPlan::Armed);
        // Still encoding when the timer fires: planned again, never two encodings at once.
        assert!(!p.timer_fired());
        assert_eq!(p.plan(t + MIN), PushPlan::After(MIN_PUSH_WAIT));
        p.encoded();
        assert!(p.timer_fired());
        assert_eq!(p.start(t + MIN), first + 1);
        p.encoded();
        assert_eq!(p.plan(t + MIN * 2), PushPlan::Now);
    }

    #[test]
    fn transfer_ids_wrap_within_their_epoch() {
        let mut p = Pushes::new(MIN, u32::MAX);
        p.transfer = (u64::from(u32::MAX) << 32) | 0xffff_fffe;
        let t = Instant::now();
        assert_eq!(p.start(t), u64::MAX);
        assert_eq!(
            p.start(t),
            u64::from(u32::MAX) << 32,
            "the counter wraps, the epoch stays"
        );
    }

    #[test]
    fn a_push_clears_the_changes_it_carries() {
        let mut p = Pushes::new(MIN, 1);
        assert!(!p.changed_since_last());
        p.changed();
        assert!(p.changed_since_last());
        p.start(Instant::now());
        assert!(!p.changed_since_last());
    }

    #[test]
    fn chunks_and_their_envelope_fit_one_message() {
        assert_eq!(chunk_len(512 << 10, 1 << 20), 512 << 10);
        assert_eq!(
            chunk_len(512 << 10, 64 << 10),
            (64 << 10) - ENVELOPE_OVERHEAD
        );
        assert_eq!(chunk_len(512 << 10, 100), 1);
    }

    #[test]
    fn a_digest_is_computed_once_per_state_and_kept_for_announcing_alone() {
        let mut d = DigestCache::default();
        let mut passes = 0;
        let mut compute = |v: u64| {
            passes += 1;
            v
        };
        assert_eq!(d.get(|| compute(1)), 1);
        assert_eq!(d.get(|| compute(2)), 1, "cached");
        d.invalidate();
        // Alone: the last one computed, no pass over the state.
        assert_eq!(d.announced(0, || compute(3)), 1);
        // With a live peer: computed afresh.
        assert_eq!(d.announced(1, || compute(3)), 3);
        assert_eq!(passes, 2);
    }
}
