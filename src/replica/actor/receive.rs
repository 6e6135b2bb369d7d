//! The receiving side of replication: a peer's frame is stepped into the core (anti-entropy,
//! the schedule, transfers coming in: what the frame does), and the merges it decides are
//! carried out here (a delta, a state whole or piece by piece, decoded off the actor's
//! thread when large), with their checks (kind, parameters, tags within the registry's
//! reservations).

use std::time::Instant;

use actix::prelude::*;
use uuid::Uuid;

use super::Replica;
use crate::ReplicaId;
use crate::replica::core::{Event, HeldFrame};
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::{self as m, Direction, MergeSource};
use crate::transport::Channel;
use crate::wire::{Body, Envelope, WireError};

/// States at least this large are decoded off the actor's thread.
const BLOCKING_THRESHOLD: usize = 256 << 10;

impl Replica {
    /// A peer's frame: counted, then stepped into the core, which decides what it does
    /// (merge it, answer it, ask for state, push ours, refuse it).
    pub(super) fn on_replication(
        &mut self,
        env: Envelope,
        frame_len: usize,
        ctx: &mut Context<Self>,
    ) {
        let channel = if env.body.is_delta() {
            Channel::Delta
        } else {
            Channel::State
        };
        self.telemetry.traffic(Direction::In, channel, frame_len);
        // Our digest, to compare a peer's with: the core never reads the state.
        let mine = matches!(env.body, Body::Digest { .. }).then(|| self.my_digest());
        self.step(Event::Frame { env, mine }, ctx);
    }

    pub(super) fn record_merge(&self, source: MergeSource, t: Instant, ok: bool) {
        self.telemetry.merge(source, ok, t.elapsed().as_secs_f64());
    }

    /// A transfer coming in completed: its state decoded (off the actor's thread when
    /// large) and merged.
    pub(super) fn decode_and_merge(
        &mut self,
        sender: Uuid,
        replica: ReplicaId,
        state: Vec<u8>,
        ctx: &mut Context<Self>,
    ) {
        self.telemetry
            .counter(m::STATE_TRANSFERS, &[("outcome", "complete")])
            .increment(1);
        let kind = self.io.expect.kind;
        let len = state.len();
        if len < BLOCKING_THRESHOLD {
            let result = AnyFilter::decode_state(kind, &state);
            self.merge_state(result, sender, replica, len, ctx);
        } else {
            let addr = ctx.address();
            actix::spawn(async move {
                let result =
                    tokio::task::spawn_blocking(move || AnyFilter::decode_state(kind, &state))
                        .await
                        .unwrap_or_else(|e| Err(WireError::Malformed(e.to_string())));
                addr.do_send(Decoded {
                    result,
                    sender,
                    replica,
                    len,
                });
            });
        }
    }

    /// Merges the next piece of a peer's full state as it comes (kinds that
    /// [merge states piece by piece](crate::wire::FilterKind::merges_state_pieces)): the
    /// replica never holds the peer's state whole, reassembled and decoded, next to its own.
    /// Each piece comes from a frame whose checksum (and signature, with keys) was checked,
    /// and joins a part of the peer's state: an inflation of its own, so a transfer cut
    /// short leaves a valid state, and the rest comes with the next push. Whether it merged.
    pub(super) fn merge_piece(
        &mut self,
        sender: Uuid,
        (offset, data, total_len): (u64, &[u8], u64),
        last: bool,
        ctx: &mut Context<Self>,
    ) -> bool {
        let t = Instant::now();
        let merged = self
            .write_to_merge()
            .merge_state_piece(total_len, offset, data);
        if let Err(e) = merged {
            self.record_merge(MergeSource::State, t, false);
            if let Some(transfers) = &mut self.core.transfers {
                transfers.forget_transfer(&sender);
            }
            self.telemetry
                .counter(m::STATE_TRANSFERS, &[("outcome", "rejected")])
                .increment(1);
            self.reject(&WireError::Incompatible(e.to_string()));
            return false;
        }
        self.core.changed();
        if !last {
            return true;
        }
        self.record_merge(MergeSource::State, t, true);
        self.telemetry
            .counter(m::STATE_TRANSFERS, &[("outcome", "complete")])
            .increment(1);
        tracing::debug!(%sender, bytes = total_len, "merged a peer's full state, piece by piece");
        self.state_merged(total_len as usize, ctx);
        true
    }

    /// A peer's full state (of `len` bytes encoded) was merged, whole or piece by piece.
    fn state_merged(&mut self, len: usize, ctx: &mut Context<Self>) {
        self.telemetry.state_merged();
        if len >= BLOCKING_THRESHOLD {
            release_freed_heap();
        }
        let actions = self.core.anti_entropy.state_merged();
        self.carry_out(actions, ctx);
    }

    pub(super) fn merge_state(
        &mut self,
        result: Result<AnyFilter, WireError>,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
        ctx: &mut Context<Self>,
    ) {
        let other = match result {
            Ok(o) if o.params_digest() == self.io.expect.params_digest => o,
            Ok(o) => {
                return self.reject(&WireError::Params {
                    got: o.params_digest(),
                    expected: self.io.expect.params_digest,
                });
            }
            Err(e) => {
                self.record_merge(MergeSource::State, Instant::now(), false);
                return self.reject(&e);
            }
        };
        self.merge_state_checked(other, sender, replica, len, true, ctx);
    }

    /// Merges a peer's full state of the right kind and parameters, holding it for a fresh
    /// look at the registry if its tags are above the view and `may_hold`; whether it was
    /// merged now.
    pub(super) fn merge_state_checked(
        &mut self,
        other: AnyFilter,
        sender: Uuid,
        replica: ReplicaId,
        len: usize,
        may_hold: bool,
        ctx: &mut Context<Self>,
    ) -> bool {
        let now = self.shared.clock.now_ms();
        let checked = self.with_tag_bounds(|bounds| {
            let f = self.read();
            match bounds {
                Some(b) => f.check_remote_state_within(&other, now, b),
                None => f
                    .check_remote_state(&other, now)
                    .map(|()| None)
                    .map_err(crate::replica::filter::remote_error),
            }
        });
        let adopt = match checked {
            Ok(adopt) => adopt,
            Err(e) => {
                if may_hold && matches!(e, WireError::TagUnreserved { .. }) {
                    let frame = HeldFrame::State {
                        state: Box::new(other),
                        sender,
                        replica,
                        len,
                    };
                    if self.hold(frame, ctx) {
                        return false;
                    }
                }
                self.record_merge(MergeSource::State, Instant::now(), false);
                self.reject(&e);
                return false;
            }
        };
        let t = Instant::now();
        let r = {
            let mut f = self.write_to_merge();
            // A forged tag of our own id within our reservation: our clock moves past it.
            if let Some(clock) = adopt {
                f.advance_clock(clock);
            }
            f.merge(&other)
        };
        self.record_merge(MergeSource::State, t, r.is_ok());
        match r {
            Ok(()) => {
                if let Some(epoch) = other.clock_epoch() {
                    self.note_peer_clock(sender, epoch);
                }
                self.core.changed();
                tracing::debug!(peer = replica, %sender, "merged a peer's full state");
                self.state_merged(len, ctx);
                true
            }
            Err(e) => {
                self.reject(&WireError::Incompatible(e.to_string()));
                false
            }
        }
    }
}

/// Gives the heap's free pages back to the operating system once a large state was merged:
/// its chunks and frames (each under the 1 MiB mmap threshold a node sets) came from the
/// heap, whose freed pages glibc keeps, so a replica that caught up stayed near its peak
/// (1.6-1.9x the state, `scripts/catch-up-rss.sh`).
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::task::spawn_blocking(|| {
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe { libc::malloc_trim(0) };
    });
}

/// A large peer state decoded off the actor's thread.
#[derive(Message)]
#[rtype(result = "()")]
struct Decoded {
    result: Result<AnyFilter, WireError>,
    sender: Uuid,
    replica: ReplicaId,
    /// Bytes of the encoded state.
    len: usize,
}

impl Handler<Decoded> for Replica {
    type Result = ();
    fn handle(&mut self, msg: Decoded, ctx: &mut Context<Self>) {
        self.merge_state(msg.result, msg.sender, msg.replica, msg.len, ctx);
    }
}
