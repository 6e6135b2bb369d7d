//! The registry as this replica last saw it (the other ids' reservations), and the frames
//! whose tags are above it, held until the next look (see the shell's `actor/unreserved.rs`
//! for why): how many may wait, when the next look may go, which held frames a look places.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::ReplicaId;
use crate::replica::filter::AnyFilter;
use crate::transport::ClaimEntry;

/// Most frames held at once; beyond, a frame above the view is refused at once (anti-entropy
/// brings an honest peer's updates again).
const MAX_HELD_FRAMES: usize = 256;
/// Most bytes of held deltas and states at once.
const MAX_HELD_BYTES: usize = 64 << 20;
/// Looks at the registry for held frames average at least this far apart, so that a sender of
/// forged tags costs the registry at most a few reads a second.
const MIN_LOOK_INTERVAL: Duration = Duration::from_millis(200);
/// Looks for held frames that may go at once, back to back, before [`MIN_LOOK_INTERVAL`]
/// spaces them: the first frames of a peer that claimed its id after this replica's last look
/// (a replica that just started) wait a round trip to the registry, not 200 ms.
const LOOK_BURST: usize = 3;

/// A frame waiting for a look at the registry.
pub(crate) enum HeldFrame {
    Delta {
        bytes: Vec<u8>,
        /// The sender and sequence number to acknowledge once merged (a confirmed delta).
        ack_to: Option<(Uuid, u64)>,
    },
    State {
        state: Box<AnyFilter>,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
    },
}

/// The registry as this replica last saw it, and the frames waiting for its next look.
#[derive(Default)]
pub(crate) struct RegistryView {
    /// Each other id's reservation (held) or floor (retired).
    reserved: HashMap<ReplicaId, u64>,
    /// When the look that gave `reserved` started.
    looked_at: Option<Instant>,
    held: Vec<(Instant, HeldFrame)>,
    held_bytes: usize,
    looking: bool,
    look_scheduled: bool,
    /// When the last [`LOOK_BURST`] looks for held frames started.
    held_looks: std::collections::VecDeque<Instant>,
}

impl RegistryView {
    /// Records a look at the registry that started at `started`. Reservations and floors
    /// only grow and records are never removed, so a look that finishes after a later one
    /// (the renewal's and a held frame's) cannot lower what is known.
    pub(crate) fn note(&mut self, claims: &[ClaimEntry], started: Instant) {
        for e in claims {
            let known = self.reserved.entry(e.id).or_insert(0);
            *known = (*known).max(e.record.floor());
        }
        self.looked_at = self.looked_at.max(Some(started));
    }

    /// How long the next look for held frames must wait: none while fewer than
    /// [`LOOK_BURST`] started within the last `LOOK_BURST` intervals.
    fn look_wait(&self, now: Instant) -> Duration {
        if self.held_looks.len() < LOOK_BURST {
            return Duration::ZERO;
        }
        let window = MIN_LOOK_INTERVAL * LOOK_BURST as u32;
        (self.held_looks[0] + window).saturating_duration_since(now)
    }

    fn look_started(&mut self, now: Instant) {
        if self.held_looks.len() == LOOK_BURST {
            self.held_looks.pop_front();
        }
        self.held_looks.push_back(now);
    }

    /// The reservation of `id`, if the registry holds a record of it.
    pub(crate) fn reserved(&self, id: ReplicaId) -> Option<u64> {
        self.reserved.get(&id).copied()
    }
}

/// What to do about the held frames' next look at the registry ([`RegistryView::next_look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Nothing: no frame held, or a look is under way or scheduled.
    None,
    /// Look now (it is counted as started; end it with [`RegistryView::look_ended`]).
    Now,
    /// Arm a timer for this long, then call [`RegistryView::look_timer_fired`] and ask again.
    After(Duration),
}

impl HeldFrame {
    /// The frame's bytes, counted against [`MAX_HELD_BYTES`].
    pub(crate) fn len(&self) -> usize {
        match self {
            HeldFrame::Delta { bytes, .. } => bytes.len(),
            HeldFrame::State { len, .. } => *len,
        }
    }
}

impl RegistryView {
    /// When the look that gave the view started.
    pub(crate) fn looked_at(&self) -> Option<Instant> {
        self.looked_at
    }

    /// Holds `frame`, refused at `now` for a tag above the view, if there is room: whether
    /// it was held (else the caller refuses it).
    pub(crate) fn hold(&mut self, frame: HeldFrame, now: Instant) -> bool {
        let len = frame.len();
        if self.held.len() >= MAX_HELD_FRAMES || self.held_bytes + len > MAX_HELD_BYTES {
            return false;
        }
        self.held_bytes += len;
        self.held.push((now, frame));
        true
    }

    /// Whether held frames wait for a look and none is under way.
    pub(crate) fn wants_look(&self) -> bool {
        !self.looking && !self.held.is_empty()
    }

    /// The held frames' next look at `now`: at once within the budget, else after a wait.
    pub(crate) fn next_look(&mut self, now: Instant) -> Look {
        if self.looking || self.look_scheduled || self.held.is_empty() {
            return Look::None;
        }
        let wait = self.look_wait(now);
        if !wait.is_zero() {
            self.look_scheduled = true;
            return Look::After(wait);
        }
        self.looking = true;
        self.look_started(now);
        Look::Now
    }

    /// The timer of a [`Look::After`] fired.
    pub(crate) fn look_timer_fired(&mut self) {
        self.look_scheduled = false;
    }

    /// The look of a [`Look::Now`] ended (done or failed).
    pub(crate) fn look_ended(&mut self) {
        self.looking = false;
    }

    /// The frames held before the look that started at `started`, to merge or refuse now;
    /// later ones wait for the next look.
    pub(crate) fn take_due(&mut self, started: Instant) -> Vec<HeldFrame> {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(at, _)| *at <= started);
        self.held = later;
        self.held_bytes -= due.iter().map(|(_, f)| f.len()).sum::<usize>();
        due.into_iter().map(|(_, f)| f).collect()
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::transport::ClaimRecord;

    fn held(id: ReplicaId, reserved: u64) -> ClaimEntry {
        ClaimEntry {
            id,
            record: ClaimRecord::Held {
                claimant: Uuid::new_v4(),
                reserved,
            },
            revision: reserved,
        }
    }

    #[test]
    fn a_late_look_never_lowers_what_is_known() {
        let mut view = RegistryView::default();
        let (t0, t1) = (Instant::now(), Instant::now() + Duration::from_secs(1));
        view.note(&[held(1, 100), held(2, 50)], t1);
        // An older look finishing later.
        view.note(
            &[
                held(1, 40),
                ClaimEntry {
                    id: 3,
                    record: ClaimRecord::Retired { floor: 7 },
                    revision: 1,
                },
            ],
            t0,
        );
        assert_eq!(
            (
                view.reserved(1),
                view.reserved(2),
                view.reserved(3),
                view.reserved(4)
            ),
            (Some(100), Some(50), Some(7), None)
        );
        assert_eq!(view.looked_at, Some(t1));
    }

    #[test]
    fn looks_for_held_frames_go_at_once_in_a_burst_then_a_few_a_second() {
        let mut view = RegistryView::default();
        let t0 = Instant::now();
        for i in 0..LOOK_BURST as u32 {
            let now = t0 + Duration::from_millis(i.into());
            assert_eq!(view.look_wait(now), Duration::ZERO);
            view.look_started(now);
        }
        let now = t0 + Duration::from_millis(10);
        let wait = view.look_wait(now);
        assert_eq!(
            wait,
            MIN_LOOK_INTERVAL * LOOK_BURST as u32 - Duration::from_millis(10)
        );
        // Over any window of LOOK_BURST intervals, at most LOOK_BURST looks.
        let mut at = now + wait;
        for _ in 0..10 {
            assert_eq!(view.look_wait(at), Duration::ZERO);
            view.look_started(at);
            let w = view.look_wait(at);
            assert!(w > Duration::ZERO);
            at += w;
        }
        assert!(at - t0 >= MIN_LOOK_INTERVAL * 10);
    }

    fn delta(len: usize) -> HeldFrame {
        HeldFrame::Delta {
            bytes: vec![0; len],
            ack_to: None,
        }
    }

    #[test]
    fn frames_are_held_within_bounds_and_a_look_places_those_before_it() {
        let mut view = RegistryView::default();
        let t0 = Instant::now();
        assert_eq!(view.next_look(t0), Look::None, "nothing held");
        assert!(view.hold(delta(10), t0));
        assert!(
            !view.hold(delta(MAX_HELD_BYTES), t0),
            "over the bytes bound"
        );
        assert!(view.wants_look());
        assert_eq!(view.next_look(t0), Look::Now);
        assert!(!view.wants_look(), "one look at a time");
        assert_eq!(view.next_look(t0), Look::None);
        let t1 = t0 + Duration::from_millis(5);
        assert!(view.hold(delta(20), t1));
        view.look_ended();
        // The look started at t0 places the frame held then, not the later one.
        let due = view.take_due(t0);
        assert_eq!(due.iter().map(HeldFrame::len).collect::<Vec<_>>(), [10]);
        assert_eq!(view.held_bytes, 20);
        assert_eq!(view.take_due(t1).len(), 1);
        assert_eq!(view.held_bytes, 0);
        for _ in 0..MAX_HELD_FRAMES {
            assert!(view.hold(delta(1), t1));
        }
        assert!(!view.hold(delta(1), t1), "over the frames bound");
    }

    #[test]
    fn a_look_over_budget_waits_once_for_its_timer() {
        let mut view = RegistryView::default();
        let t0 = Instant::now();
        assert!(view.hold(delta(1), t0));
        for _ in 0..LOOK_BURST {
            assert_eq!(view.next_look(t0), Look::Now);
            view.look_ended();
        }
        let Look::After(wait) = view.next_look(t0) else {
            panic!("over the burst: a wait");
        };
        assert_eq!(view.next_look(t0), Look::None, "its timer is armed");
        view.look_timer_fired();
        assert_eq!(view.next_look(t0 + wait), Look::Now);
    }
}
