//! Parking: a replica that is idle and alone gives up its actor and leaves its state with its
//! node, as data ([`Parked`]); the node runs it again ([`crate::replica::Replica::resume`]) as
//! soon as a request or a message is for it. Of a node's 100,000 mostly idle filters, each
//! actor (its task, timers, queues, subjects, codec and commit pipeline) cost ~5 KB beside a
//! 1.2 KB state.
//!
//! Only a replica without peers parks: one with peers announces digests to them and hears
//! theirs, and parked it would fall silent (its peers would take it for gone, and count on no
//! acknowledgement of it for `replicated` updates). Any message of a peer wakes a parked
//! replica: a peer starting later finds it as it would a running one.

use std::sync::atomic::Ordering;

use actix::prelude::*;

use super::Replica;
use crate::replica::core::InFlight;
use crate::replica::durable::Identity;
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::Telemetry;

/// What a parked replica leaves with its node: its state, and what resumes it without
/// reading its data directory.
pub(crate) struct Parked {
    pub filter: AnyFilter,
    pub identity: Identity,
    /// Its counts go on from where they were (`stats`).
    pub telemetry: Telemetry,
    /// With a data directory (its configuration's), the segment of the log its writer goes
    /// on at: after every one written so far, which its last snapshot covers. (Nothing else
    /// of its directory or writer is kept: 100,000 parked replicas held 35 MB of paths and
    /// writers that their configurations give again.)
    pub wal_next: Option<u64>,
    /// The tags reserved durably.
    pub reserved: u64,
}

/// Where a parking replica's state goes. The actor calls it with a function that closes the
/// replica and gives its [`Parked`]; the node calls that only if the replica is still the one
/// it hosts under its name and was not looked up since the node asked it to park (under its
/// lock: no request finds the replica closing), and answers whether it did.
pub(crate) type ParkInto = Box<dyn FnOnce(&mut dyn FnMut() -> Parked) -> bool + Send>;

/// Asks the replica to park if it is idle and alone; answers whether it parked.
#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct Park(pub ParkInto);

impl Replica {
    /// Whether the replica may park now but for its snapshot (see the module documentation
    /// and [`crate::replica::core::ReplicaCore::is_idle`]).
    fn idle_and_alone(&self) -> bool {
        let asked = |flag: &std::sync::atomic::AtomicBool| flag.load(Ordering::Acquire);
        let s = &self.shared;
        let in_flight = InFlight {
            closed: asked(&s.closed),
            asked: asked(&s.flush_scheduled)
                || asked(&s.commit_requested)
                || asked(&s.logged_commit_requested),
            publishing: asked(&s.publishing) || !self.chans.outbound_rx.is_empty(),
            pushes: s.pushes_out.load(Ordering::Acquire) > 0 || !self.pacings.is_empty(),
            inbound: !self.chans.inbound_tx.is_empty(),
        };
        self.core.is_idle(self.outside(), in_flight)
    }

    /// Closes the replica for good (as a shutdown does, with nothing left to flush or save)
    /// and gives what resumes it.
    fn close_for_parking(&mut self, ctx: &mut Context<Self>) -> Parked {
        self.close_to_updates();
        self.core.pipeline.stopping();
        let durable = self
            .core
            .snapshots
            .data()
            .is_some()
            .then_some(self.core.pipeline.next_batch());
        self.answer_stopped(durable);
        self.core.parked = true;
        ctx.stop();
        // The writer closes its log (if it wrote one); a resumed one starts a segment after.
        let wal_next = self.io.wal.take().map(|w| w.next_segment());
        let filter = self.read().clone();
        crate::replica::crash::point(crate::replica::crash::PARK_STATE_TAKEN);
        Parked {
            filter,
            identity: self.shared.identity,
            telemetry: self.telemetry.clone(),
            wal_next,
            reserved: self.core.reserved,
        }
    }
}

impl Handler<Park> for Replica {
    type Result = bool;

    fn handle(&mut self, Park(into): Park, ctx: &mut Context<Self>) -> bool {
        if !self.idle_and_alone() {
            return false;
        }
        if !self.core.snapshots.settled() {
            // Idle but for changes not saved yet (the periodic snapshot is not due): saved
            // now, so that the next ask finds the replica settled.
            if !self.core.snapshots.writing() {
                crate::replica::crash::point(crate::replica::crash::PARK_BEFORE_SNAPSHOT);
                self.snapshot_async(ctx);
            }
            return false;
        }
        into(&mut || self.close_for_parking(ctx))
    }
}
