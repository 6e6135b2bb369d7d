//! Frames whose tags this replica cannot yet place in the id registry: held until it reads the
//! registry again, then merged or refused (`tag_unreserved`).
//!
//! A replica's view of the other ids' reservations is as old as its last look at the registry
//! (every renewal). A replica that claimed its id since, or extended its reservation, sends
//! tags above that view quite honestly: refusing them at once would cost a full-state repair
//! each time. So a frame above the view waits for one fresh look (up to [`LOOK_BURST`] back
//! to back, then at most that many every `LOOK_BURST` x [`MIN_LOOK_INTERVAL`]); only what is
//! still above the registry then was issued by nobody.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use uuid::Uuid;

use super::Replica;
use crate::ReplicaId;
use crate::replica::SharedId;
use crate::replica::filter::{AnyFilter, TagBounds};
use crate::replica::metrics as m;
use crate::transport::ClaimEntry;
use crate::wire::WireError;

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
pub(super) enum HeldFrame {
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
    pub(super) fn note(&mut self, claims: &[ClaimEntry], started: Instant) {
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
    pub(super) fn reserved(&self, id: ReplicaId) -> Option<u64> {
        self.reserved.get(&id).copied()
    }
}

impl Replica {
    pub(super) fn registry_view_mut(&mut self) -> &mut RegistryView {
        self.registry_view.get_or_insert_default()
    }

    /// The bounds this replica holds received tags against: `None` when the check is off.
    pub(super) fn with_tag_bounds<T>(&self, f: impl FnOnce(Option<TagBounds<'_>>) -> T) -> T {
        if !self.cfg.check_tag_reservations || !self.expect.kind.tagged() {
            return f(None);
        }
        let view = self.registry_view.as_deref();
        let lookup = |id| view.and_then(|v| v.reserved(id));
        f(Some(TagBounds {
            own_reserved: self.lease.reserved(),
            reserved: &lookup,
        }))
    }

    /// Holds a frame refused for a tag above the registry as last seen, if there is room and
    /// the view predates the frame; whether it was held (else the caller refuses it).
    pub(super) fn hold(&mut self, frame: HeldFrame, ctx: &mut Context<Self>) -> bool {
        let len = match &frame {
            HeldFrame::Delta { bytes, .. } => bytes.len(),
            HeldFrame::State { len, .. } => *len,
        };
        let v = self.registry_view_mut();
        if v.held.len() >= MAX_HELD_FRAMES || v.held_bytes + len > MAX_HELD_BYTES {
            return false;
        }
        v.held_bytes += len;
        v.held.push((Instant::now(), frame));
        self.telemetry
            .counter(m::HELD_FRAMES, &[("outcome", "held")])
            .increment(1);
        self.look_for_held(ctx);
        true
    }

    /// Starts a look at the registry for the held frames, or schedules one if the last was
    /// too recent.
    fn look_for_held(&mut self, ctx: &mut Context<Self>) {
        match self.registry_view.as_deref() {
            Some(v) if !v.looking && !v.held.is_empty() => {}
            _ => return,
        }
        // The node lists its ids at every renewal: a listing newer than this replica's view
        // places the frames held before it without a look of this replica's own.
        if let Some(started) = self.note_shared_listing() {
            self.replay_held(started, ctx);
        }
        let v = self.registry_view_mut();
        if v.looking || v.look_scheduled || v.held.is_empty() {
            return;
        }
        let wait = v.look_wait(Instant::now());
        if !wait.is_zero() {
            v.look_scheduled = true;
            ctx.run_later(wait, |act, ctx| {
                act.registry_view_mut().look_scheduled = false;
                act.look_for_held(ctx);
            });
            return;
        }
        v.looking = true;
        let started = Instant::now();
        v.look_started(started);
        let namespace = match &self.lease.shared {
            Some(_) => SharedId::NAMESPACE.into(),
            None => self.cfg.registry_name(),
        };
        let t = self.transport.clone();
        let look = async move { t.replica_claims(namespace).await };
        ctx.spawn(look.into_actor(self).map(move |claims, act, ctx| {
            act.registry_view_mut().looking = false;
            match claims {
                Ok(claims) => {
                    act.registry_view_mut().note(&claims, started);
                    act.replay_held(started, ctx);
                }
                // Tried again within the look budget; the frames wait (bounded).
                Err(e) => act.lease_failed("reading the registry for held frames", &e),
            }
            act.look_for_held(ctx);
        }));
    }

    /// Takes the node's latest listing of its ids into the view, if it is newer than the
    /// view: when that listing started.
    pub(super) fn note_shared_listing(&mut self) -> Option<Instant> {
        let (claims, started) = self.lease.shared.as_ref()?.last_claims()?;
        if self.registry_view.as_ref().and_then(|v| v.looked_at) >= Some(started) {
            return None;
        }
        self.registry_view_mut().note(&claims, started);
        Some(started)
    }

    /// Merges or refuses the frames held before the look that started at `started`; later
    /// ones wait for the next look.
    fn replay_held(&mut self, started: Instant, ctx: &mut Context<Self>) {
        let v = self.registry_view_mut();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut v.held)
            .into_iter()
            .partition(|(at, _)| *at <= started);
        v.held = later;
        for (_, frame) in due {
            let len = match &frame {
                HeldFrame::Delta { bytes, .. } => bytes.len(),
                HeldFrame::State { len, .. } => *len,
            };
            self.registry_view_mut().held_bytes -= len;
            let merged = match frame {
                HeldFrame::Delta { bytes, ack_to } => {
                    let merged = self.merge_delta_checked(&bytes, false, ack_to, ctx);
                    if merged && let Some((sender, seq)) = ack_to {
                        self.send_ack(sender, seq);
                    }
                    merged
                }
                HeldFrame::State {
                    state,
                    sender,
                    replica,
                    len,
                } => self.merge_state_checked(*state, sender, replica, len, false, ctx),
            };
            let outcome = if merged { "merged" } else { "refused" };
            self.telemetry
                .counter(m::HELD_FRAMES, &[("outcome", outcome)])
                .increment(1);
        }
    }

    /// Merges a peer's delta, holding it for a fresh look at the registry if its tags are
    /// above the view and `may_hold`; whether it was merged now.
    pub(super) fn merge_delta_checked(
        &mut self,
        bytes: &[u8],
        may_hold: bool,
        ack_to: Option<(Uuid, u64)>,
        ctx: &mut Context<Self>,
    ) -> bool {
        let t = Instant::now();
        let now = self.shared.clock.now_ms();
        let r = self.with_tag_bounds(|bounds| {
            let mut f = self.write_to_merge();
            match bounds {
                Some(b) => f.merge_remote_delta_bytes_within(bytes, now, b),
                None => f.merge_remote_delta_bytes(bytes, now),
            }
        });
        match r {
            Ok(()) => {
                self.record_merge(crate::replica::metrics::MergeSource::Delta, t, true);
                self.telemetry.delta_merged();
                self.changed();
                true
            }
            Err(WireError::TagUnreserved { .. })
                if may_hold
                    && self.hold(
                        HeldFrame::Delta {
                            bytes: bytes.to_vec(),
                            ack_to,
                        },
                        ctx,
                    ) =>
            {
                false
            }
            Err(e) => {
                self.record_merge(crate::replica::metrics::MergeSource::Delta, t, false);
                self.reject(&e);
                false
            }
        }
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
}
