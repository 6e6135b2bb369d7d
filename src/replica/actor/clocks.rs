//! Kinds whose elements expire: the peers' clocks this replica bounds its own by, and the
//! repair of a state whose clock ran ahead (see [`crate::replica::clock`]).

use std::time::Instant;

use uuid::Uuid;

use super::Replica;
use crate::replica::clock::ReplicaClock;
use crate::replica::metrics as m;

impl Replica {
    /// A peer's frame carrying its clock (`epoch`) was merged: the peers' clock is at least
    /// there.
    pub(super) fn note_peer_clock(&mut self, sender: Uuid, epoch: u64) {
        let Some((len, _)) = self.read().clock_bounds() else {
            return;
        };
        if epoch == 0 {
            // A state no clock has advanced yet (a replica that just started, of a version
            // that does not tick at start): it says nothing of its sender's clock.
            return;
        }
        let base = ReplicaClock::peer_base(epoch, len);
        let newest = self
            .core
            .peer_clocks
            .get_or_insert_default()
            .note(sender, base);
        self.shared.clock.set_peers_base(newest);
    }

    /// A peer's delta (`bytes`) was merged: its clock, for kinds that have one.
    pub(super) fn delta_clock(&mut self, sender: Uuid, bytes: &[u8]) {
        if !self.io.expect.kind.clocked() {
            return;
        }
        let epoch = self.read().delta_clock_epoch(bytes);
        if let Some(epoch) = epoch {
            self.note_peer_clock(sender, epoch);
        }
    }

    /// Time passes for kinds whose elements expire: the window moves to this replica's time
    /// (bounded by its peers'), and the move travels to the peers in the next delta.
    pub(super) fn tick_clock(&mut self) {
        if !self.io.expect.kind.clocked() {
            return;
        }
        let now = self.shared.clock.for_reads(self.read().clock_bounds());
        if self.write().tick(now) {
            self.local_change();
        }
    }

    /// Forgets the clocks of peers no longer live, and repairs a state whose clock is more
    /// than the skew bound ahead of this replica's (bounded) time: one advanced while the
    /// wall clock ran ahead, before any peer was heard, or restored from a snapshot taken
    /// then. Called at start and at every housekeeping, before the state is ticked.
    pub(super) fn keep_clock(&mut self) {
        if !self.io.expect.kind.clocked() {
            return;
        }
        // (Also when there is no table: a replica resumed from parking starts without one.)
        let newest = self.core.peer_clocks.as_mut().and_then(|clocks| {
            let (ae, now) = (&self.core.anti_entropy, Instant::now());
            clocks.keep_live(|sender| ae.is_live_sender(sender, now))
        });
        self.shared.clock.set_peers_base(newest);
        let bounds = self.read().clock_bounds();
        let now = self.shared.clock.for_reads(bounds);
        let rewound = self.write().rewind_if_ahead(now);
        if let Some(was) = rewound {
            self.telemetry.counter(m::CLOCK_REWINDS, &[]).increment(1);
            tracing::warn!(
                filter = %self.cfg.name,
                state_epoch = was,
                epoch = bounds.map_or(0, |(len, _)| now / len),
                "the filter's clock was ahead of this replica's by more than the skew bound \
                 (its wall clock ran ahead, and was corrected): the epochs beyond its clock \
                 are discarded, and its peers' states merge again"
            );
            self.mark_local_change();
        }
    }
}
