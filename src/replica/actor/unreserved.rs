//! Frames whose tags this replica cannot yet place in the id registry: held until it reads the
//! registry again, then merged or refused (`tag_unreserved`).
//!
//! A replica's view of the other ids' reservations is as old as its last look at the registry
//! (every renewal). A replica that claimed its id since, or extended its reservation, sends
//! tags above that view quite honestly: refusing them at once would cost a full-state repair
//! each time. So a frame above the view waits for one fresh look (up to [`LOOK_BURST`] back
//! to back, then at most that many every `LOOK_BURST` x [`MIN_LOOK_INTERVAL`]); only what is
//! still above the registry then was issued by nobody.

use std::time::Instant;

use actix::prelude::*;
use uuid::Uuid;

use super::Replica;

use crate::replica::SharedId;
use crate::replica::core::{HeldFrame, Look, RegistryView, Timer};
use crate::replica::filter::TagBounds;
use crate::replica::metrics as m;
use crate::wire::WireError;

impl Replica {
    pub(super) fn registry_view_mut(&mut self) -> &mut RegistryView {
        self.core.registry_view.get_or_insert_default()
    }

    /// The bounds this replica holds received tags against: `None` when the check is off.
    pub(super) fn with_tag_bounds<T>(&self, f: impl FnOnce(Option<TagBounds<'_>>) -> T) -> T {
        if !self.cfg.check_tag_reservations || !self.io.expect.kind.tagged() {
            return f(None);
        }
        let view = self.core.registry_view.as_deref();
        let lookup = |id| view.and_then(|v| v.reserved(id));
        f(Some(TagBounds {
            own_reserved: self.core.lease.reserved(),
            reserved: &lookup,
        }))
    }

    /// Holds a frame refused for a tag above the registry as last seen, if there is room and
    /// the view predates the frame; whether it was held (else the caller refuses it).
    pub(super) fn hold(&mut self, frame: HeldFrame, ctx: &mut Context<Self>) -> bool {
        if !self.registry_view_mut().hold(frame, Instant::now()) {
            return false;
        }
        self.telemetry
            .counter(m::HELD_FRAMES, &[("outcome", "held")])
            .increment(1);
        self.look_for_held(ctx);
        true
    }

    /// Starts a look at the registry for the held frames, or schedules one if the last was
    /// too recent.
    pub(super) fn look_for_held(&mut self, ctx: &mut Context<Self>) {
        if !self
            .core
            .registry_view
            .as_deref()
            .is_some_and(RegistryView::wants_look)
        {
            return;
        }
        // The node lists its ids at every renewal: a listing newer than this replica's view
        // places the frames held before it without a look of this replica's own.
        if let Some(started) = self.note_shared_listing() {
            self.replay_held(started, ctx);
        }
        let started = Instant::now();
        match self.registry_view_mut().next_look(started) {
            Look::None => return,
            Look::After(wait) => {
                self.timers.arm(Timer::RegistryLook, wait, ctx);
                return;
            }
            Look::Now => {}
        }
        let namespace = match &self.core.lease.shared {
            Some(_) => SharedId::NAMESPACE.into(),
            None => self.cfg.registry_name(),
        };
        let t = self.io.transport.clone();
        let look = async move { t.replica_claims(namespace).await };
        ctx.spawn(look.into_actor(self).map(move |claims, act, ctx| {
            act.registry_view_mut().look_ended();
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
        let (claims, started) = self.core.lease.shared.as_ref()?.last_claims()?;
        if self.core.registry_view.as_ref().and_then(|v| v.looked_at()) >= Some(started) {
            return None;
        }
        self.registry_view_mut().note(&claims, started);
        Some(started)
    }

    /// Merges or refuses the frames held before the look that started at `started`; later
    /// ones wait for the next look.
    fn replay_held(&mut self, started: Instant, ctx: &mut Context<Self>) {
        for frame in self.registry_view_mut().take_due(started) {
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
                self.core.changed();
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
