//! Durability: tag reservations written before a tag above them is issued, and snapshots
//! (taken on the actor's thread together with a log rotation, saved on another) that truncate
//! the write-ahead log they cover.

use std::sync::atomic::Ordering;

use actix::prelude::*;

use super::snapshots::SnapshotJob;
use super::{Replica, ReplicaError};
use crate::replica::core::Event;
use crate::replica::durable::{DataDir, Reservation};
use crate::replica::metrics as m;
use crate::replica::wal::{SegmentId, WalWriter};

impl Replica {
    /// Reserves tag timestamps durably before one above the reservation is issued.
    pub(super) fn reserve_tags(&mut self) -> Result<(), ReplicaError> {
        self.reserve_tags_for(1)
    }

    /// Reserves `n` more tags at once (a slice of an import, see [`super::local::Import`]):
    /// refused ([`ReplicaError::TagsUnreserved`]) unless the id claim covers them, and
    /// reserved durably (with a data directory) in one write. No-op for kinds without tags.
    pub(super) fn reserve_tags_for(&mut self, n: u64) -> Result<(), ReplicaError> {
        if !self.io.expect.kind.tagged() || n == 0 {
            return Ok(());
        }
        if self.core.lease.lost() {
            return Err(ReplicaError::IdRetired { replica: self.id() });
        }
        // Above every tag issued under the id before it was taken back after a retirement.
        let floor = self.core.lease.floor();
        if self.read().clock() < floor {
            self.write().advance_clock(floor);
        }
        let clock = self.read().clock();
        let need = clock.saturating_add(n);
        if need > crate::MAX_COUNTER {
            return Err(crate::FilterError::ClockExhausted { replica: self.id() }.into());
        }
        if need > self.core.lease.reserved() {
            return Err(ReplicaError::TagsUnreserved);
        }
        let Some(data) = self.core.snapshots.data() else {
            return Ok(());
        };
        if need <= self.core.reserved {
            return Ok(());
        }
        let reserved = need.saturating_add(self.cfg.tag_reserve_block);
        data.save_reservation(&Reservation {
            identity: self.shared.identity,
            reserved,
        })?;
        self.core.reserved = reserved;
        self.telemetry
            .counter(m::TAG_RESERVATIONS, &[])
            .increment(1);
        Ok(())
    }

    /// Tags below which adds need no new reservation (see [`Replica::reserve_tags`]): the
    /// lease's and, with a data directory, the durable one; unbounded for kinds without tags.
    pub(super) fn tag_limit(&self) -> u64 {
        if !self.io.expect.kind.tagged() {
            return u64::MAX;
        }
        let durable = if self.core.snapshots.data().is_some() {
            self.core.reserved
        } else {
            u64::MAX
        };
        self.core.lease.reserved().min(durable)
    }

    /// A log append failed: the writer never writes again (after a failed fsync the file's
    /// state is unknown). Durable updates fail until [`Replica::recover_wal`] replaces it,
    /// tried with backoff; the error is logged at most once per period.
    /// (The core arms the recovery's timer.)
    pub(super) fn wal_failed(&mut self, e: &str) {
        self.telemetry.gauge(m::DURABLE_OK, &[]).set(0.0);
        if let Some(suppressed) = self.io.limiter.allow("wal") {
            tracing::error!(
                filter = %self.cfg.name, error = %e, suppressed,
                "write-ahead log append failed: durable updates fail until the log recovers \
                 (retrying with backoff)"
            );
        }
        self.shared.wal_failed.store(true, Ordering::Release);
    }

    /// Replaces a failed log writer once the disk takes writes again: a snapshot that covers
    /// every segment the failed writer used (the last one may end in a partial frame), then a
    /// writer on new segments after them. Until then, tried again with a doubling delay (up
    /// to 5 s).
    pub(super) fn recover_wal(&mut self, ctx: &mut Context<Self>) {
        let retry = |act: &mut Self, ctx: &mut Context<Self>| act.step(Event::RecoveryFailed, ctx);
        if self.core.snapshots.writing() {
            return retry(self, ctx);
        }
        if self.snapshot_now().is_err() {
            return retry(self, ctx);
        }
        // The failed writer, dropped here, is forgotten by its pool thread. Without a log
        // there is nothing to replace: recovered.
        let reopened = match &self.io.wal {
            Some(wal) => wal.reopen().map(|w| self.io.wal = Some(w)),
            None => Ok(()),
        };
        match reopened {
            Ok(()) => {
                self.core.pipeline.reopened();
                self.shared.wal_failed.store(false, Ordering::Release);
                self.telemetry.gauge(m::DURABLE_OK, &[]).set(1.0);
                tracing::info!(filter = %self.cfg.name, "write-ahead log recovered: durable updates are taken again");
            }
            Err(e) => {
                tracing::warn!(filter = %self.cfg.name, error = %e, "write-ahead log: cannot start a new writer yet");
                retry(self, ctx)
            }
        }
    }

    /// Takes what a snapshot saves, on the actor's thread: the log is rotated at the same
    /// moment the state is cloned, so the clone holds every record of the segments up to the
    /// one it returns (see [`crate::replica::wal`]).
    fn snapshot_source(&mut self) -> SnapshotJob {
        let generation = self.core.snapshots.take();
        // The log's current segment ends here (see [`WalWriter::rotate`]).
        let wal_covered = self.io.wal.as_mut().map(WalWriter::rotate);
        // Under one lock: the merges counted are those the copy holds.
        let (filter, merges) = {
            let f = self.read();
            (f.clone(), self.shared.unlogged.mark())
        };
        SnapshotJob {
            generation,
            wal_covered,
            merges,
            filter,
            identity: self.shared.identity,
            name: self.cfg.name.clone(),
            kind: self.io.expect.kind,
            params_digest: self.io.expect.params_digest,
            reserved: self.core.reserved,
        }
    }

    /// Writes a snapshot in the background if the state changed since the last one.
    pub(super) fn snapshot_async(&mut self, ctx: &mut Context<Self>) {
        self.absorb_direct_changes();
        let Some((data, writing)) = self.core.snapshots.begin_periodic() else {
            return;
        };
        let job = self.snapshot_source();
        let (telemetry, saved) = (self.telemetry.clone(), self.core.snapshots.saved());
        let addr = ctx.address();
        actix::spawn(async move {
            let r = job.save_off_thread(data, telemetry, saved).await;
            writing.store(false, Ordering::Release);
            addr.do_send(SnapshotSaved(r));
        });
    }

    /// Writes a snapshot now, on the actor's thread (shutdown).
    pub(super) fn snapshot_now(&mut self) -> Result<(), ReplicaError> {
        let Some(data) = self.core.snapshots.data().cloned() else {
            return Ok(());
        };
        let job = self.snapshot_source();
        let r = job.save(&data, &self.telemetry, &self.core.snapshots.saved());
        let ok = r.is_ok();
        self.snapshot_saved_now(r)?;
        if ok {
            self.core.snapshots.written_now();
        }
        Ok(())
    }

    /// Writes a snapshot into `data` on a blocking thread, not the actors' (whose one thread
    /// serves every replica of the node: a create's first snapshot, fsynced there, made the
    /// creates of a node with a data directory wait for each other's fsyncs); answers what
    /// the save came to, for [`Replica::snapshot_saved_now`].
    pub(super) fn snapshot_off_thread(
        &mut self,
        data: DataDir,
    ) -> impl ActorFuture<Self, Output = Result<Option<SegmentId>, ReplicaError>> + use<> {
        self.core.snapshots.begin_persist();
        let job = self.snapshot_source();
        let save = job.save_off_thread(data, self.telemetry.clone(), self.core.snapshots.saved());
        save.into_actor(self).map(|r, act: &mut Self, _| {
            act.core.snapshots.persisted();
            r
        })
    }

    /// A snapshot was saved (or failed): counts it, and drops the log segments it covers.
    pub(super) fn snapshot_saved_now(
        &mut self,
        r: Result<Option<SegmentId>, ReplicaError>,
    ) -> Result<(), ReplicaError> {
        let outcome = if r.is_ok() { "ok" } else { "error" };
        self.telemetry
            .counter(m::SNAPSHOTS, &[("outcome", outcome)])
            .increment(1);
        self.core.snapshots.written(r.is_ok());
        match r {
            Ok(covered) => {
                if let (Some(wal), Some(k)) = (&self.io.wal, covered) {
                    let done = wal.remove_through(k);
                    actix::spawn(async move {
                        if let Err(e) = done.await {
                            tracing::warn!(error = %e, "removing covered log segments failed");
                        }
                    });
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(filter = %self.cfg.name, error = %e, "snapshot failed");
                Err(e)
            }
        }
    }
}

/// A background snapshot finished.
#[derive(Message)]
#[rtype(result = "()")]
struct SnapshotSaved(Result<Option<SegmentId>, ReplicaError>);

impl Handler<SnapshotSaved> for Replica {
    type Result = ();
    fn handle(&mut self, msg: SnapshotSaved, _: &mut Context<Self>) {
        let _ = self.snapshot_saved_now(msg.0);
    }
}
