//! Replicas (docs/DESIGN.md sections 1, 4, 5 and 6): an actix actor per filter replica that answers
//! local operations, publishes what it changed as delta-states, merges what its peers publish,
//! repairs losses by anti-entropy, and keeps its state in an optional data directory.
//!
//! The protocol, on the subjects of [`crate::transport::Subjects`]:
//! - **Deltas** (Almeida, Shoker, Baquero 2015). Local updates accumulate in the filter's
//!   delta-state, published on `.delta` every `delta_interval_ms` or as soon as it holds
//!   `delta_max_updates` updates. Receivers join it; joins are idempotent, commutative and
//!   associative, so late, duplicated or reordered deltas are harmless.
//! - **Anti-entropy** on `.state`. Every envelope carries a per-sender sequence number; a gap
//!   means lost messages, and the receiver asks that peer for its full state. Every
//!   `anti_entropy_interval_ms` each replica also publishes a digest that is equal for
//!   equivalent states; a replica whose digest differs from a peer's three times in a row
//!   (not just updates in flight, then) pushes its full state, in chunks below the server's
//!   `max_payload`. A starting or reconnecting replica asks everyone for their state.
//! - **Readiness**: a replica is ready once it merged a peer's state, or saw a ready peer with
//!   its own digest, or heard no peer at all within `catch_up_timeout_ms` (it is alone); one
//!   that hears peers keeps asking for their state, for up to ten timeouts. Only then does it
//!   join the request API's queue group.
//! - **Durability** (see [`durable`]): snapshots, and tag reservations written before tags are
//!   issued, so that no tag is ever issued twice.
//!
//! ```
//! use std::sync::Arc;
//! use crpf::replica::{Replica, ReplicaConfig};
//! use crpf::transport::InProcessBus;
//! use crpf::wire::FilterKind;
//!
//! #[actix::main]
//! async fn main() -> Result<(), crpf::replica::ReplicaError> {
//!     let bus = Arc::new(InProcessBus::new());
//!     let cfg = ReplicaConfig::for_kind("users", FilterKind::OrCuckoo, 10_000, 0.01).fast();
//!     let a = Replica::start(cfg.clone(), bus.clone()).await?;
//!     let b = Replica::start(cfg, bus).await?;
//!     a.add(b"alice").await?;
//!     b.wait_until(std::time::Duration::from_secs(10), |f| f.contains(b"alice")).await;
//!     assert!(b.contains(b"alice"));
//!     a.shutdown().await?;
//!     b.shutdown().await?;
//!     Ok(())
//! }
//! ```

mod ack;
mod actor;
mod anti_entropy;
mod clock;
mod config;
pub(crate) mod core;
pub mod crash;
pub mod disk;
pub mod durable;
mod filter;
pub(crate) mod group_sync;
pub mod interop;
pub mod metrics;
mod reassembly;
pub(crate) mod recovery;
pub mod service;
mod shared_id;
pub(crate) mod sketch;
pub(crate) mod tdigest;
mod ticks;
pub(crate) mod topk;
pub mod wal;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Addr};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

pub use ack::AckLevel;
#[cfg(test)]
pub(crate) use ack::{AckTracker, known_replicas, peers_needed};
pub use actor::ACK_HEADER;
pub use actor::CommitTicket;
pub(crate) use actor::FINAL_FLUSH_TIMEOUT;
pub use actor::ParkedAnswer;
#[cfg(test)]
pub(crate) use actor::SnapshotJob;
pub(crate) use actor::{API_LINGER, error_of, header_text, refusal};
pub use actor::{
    Add, Contains, FlushDelta, Import, Merge, PendingResponse, Persist, Remove, Replica,
    ReserveTags, Shutdown, Stats, TakeSnapshot,
};
pub(crate) use actor::{
    GroupApi, Park, ParkInto, Parked, answer_parked, parked_spacing, query_parked,
};
#[cfg(test)]
pub(crate) use anti_entropy::{AntiEntropy, Timing};
pub use config::{MAX_FSYNC_INTERVAL_MS, ReplicaConfig};
pub use durable::{DataDir, DurableError, Identity};
pub use filter::{
    AnyFilter, FilterSpec, FilterStats, NotCounting, NotRemovable, TagBounds, TakenDelta,
};
pub use shared_id::SharedId;

use crate::transport::{Renewal, Subjects, Transport, TransportError};
use crate::{Dot, FilterError, ReplicaId};
use actor::{Setup, Shared};

/// Everything a replica operation can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An empty or oversized item, or an unknown API operation.
    #[error("invalid request: {0}")]
    InvalidItem(String),
    /// A count the request would take past its bound ([`FilterError::Overflow`]): refused
    /// whole, as an invalid request (RESP answers it as RedisBloom does).
    #[error("invalid request: {0}")]
    Overflow(FilterError),
    /// Remove on a grow-only filter.
    #[error(transparent)]
    NotRemovable(#[from] NotRemovable),
    /// Count on a filter that does not count occurrences.
    #[error(transparent)]
    NotCounting(#[from] NotCounting),
    /// The filter refused (full, incompatible parameters...).
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// The transport failed (connecting, claiming an id).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The data directory failed; an add that could not reserve its tag is refused.
    #[error(transparent)]
    Durable(#[from] DurableError),
    /// The actor has stopped (an update waiting for its acknowledgement level may or may not
    /// have been applied).
    #[error("the replica has stopped")]
    Stopped,
    /// The update is applied locally, but the write-ahead log failed: it may be lost in a
    /// crash (unless replication carried it away first).
    #[error("applied locally but not durable: {0}")]
    NotDurable(String),
    /// The update is applied (and durable, with a data directory), but fewer peers than needed
    /// confirmed it in time: it will still reach them by replication.
    #[error(
        "applied locally but not yet confirmed by enough peers: {acked} of {needed} within {timeout_ms} ms"
    )]
    NotReplicated {
        /// Peers that confirmed.
        acked: usize,
        /// Peers needed.
        needed: usize,
        /// How long it waited.
        timeout_ms: u64,
    },
    /// The acknowledgement level cannot be given by this replica; nothing was applied.
    #[error("acknowledgement level unavailable: {0}")]
    AckUnavailable(String),
    /// The replica's id was retired while it could not renew its claim (a registry outage
    /// longer than `retire_after_ms`); it issues no tag under it until it takes the id back,
    /// which it tries at every renewal. Nothing was applied; retry. If another replica holds
    /// the id now (the log says so), restart this one: it keeps its data and claims another.
    #[error(
        "replica id {replica} was retired while this replica could not renew its claim: it takes the id back once the registry answers (retry); if another replica holds it now, restart this one to claim a new id"
    )]
    IdRetired {
        /// The lost id.
        replica: ReplicaId,
    },
    /// Every tag the id claim reserves is used and the registry has not confirmed more yet
    /// (it is unreachable, or slower than the adds). Nothing was applied; retry.
    #[error("no tag reserved: waiting for the replica id registry to confirm more")]
    TagsUnreserved,
    /// The actor's inbound buffer is full (it is behind on replication or requests); the
    /// request was not taken and nothing was applied. Retry later.
    #[error("the replica is busy: its inbound buffer is full")]
    Busy,
    /// The replica does not serve the request API: it is still catching up after its start,
    /// or `serve_api` is off. Nothing was applied; retry (another replica, or later).
    #[error(
        "the replica does not serve the request API yet: it is catching up (or serve_api is off)"
    )]
    NotServing,
    /// A request to a filter its node does not know: neither in the catalog nor replicated
    /// by anyone it hears (README, "Filters as data"). Nothing was applied.
    #[error("no filter named `{0}`")]
    UnknownFilter(String),
    /// An import ([`ReplicaHandle::import`]) stopped part way: the slices answered before
    /// the one that failed were added (that one too, for the failures that say they were
    /// applied: not durable, not replicated, stopped).
    #[error("the import stopped after {imported} of {total} occurrences were added: {cause}")]
    ImportStopped {
        /// Occurrences of the slices added before the failure.
        imported: u64,
        /// Occurrences the import was to add.
        total: u64,
        /// Why the slice failed.
        cause: Box<ReplicaError>,
    },
    /// An import at `replicated` whose delta (the bits it newly sets, packed) is larger than
    /// one message can carry beside the other updates of its commit: half of what the
    /// transport's `max_payload` leaves past an envelope (523,776 bytes at NATS's default
    /// 1 MiB). Nothing was merged; import at `durable`, or in parts.
    #[error(
        "an import at `replicated` travels as one acknowledged delta of at most {limit} bytes; \
         this one needs {bytes}: nothing merged (import it at `durable`, or in parts)"
    )]
    ImportTooLarge {
        /// The import's encoded delta.
        bytes: usize,
        /// The largest one taken.
        limit: usize,
    },
    /// An `expiring_bloom` replica's wall clock is further ahead of its live peers' than
    /// the skew bound allows (and one epoch more): its adds would land in an epoch its peers
    /// refuse, so none is applied until its clock is corrected. Reads answer as of its
    /// peers' window meanwhile.
    #[error(
        "this replica's clock is {ahead_epochs} epochs ahead of its peers' (max_skew_epochs is \
         {max_skew}): adds are refused until its clock is corrected"
    )]
    ClockAhead {
        /// Epochs the replica's clock is ahead of its live peers' (as estimated).
        ahead_epochs: u64,
        /// The filter's `max_skew_epochs`.
        max_skew: u32,
    },
}

/// Occurrences per slice of an import ([`ReplicaHandle::import`]): the default
/// `delta_max_updates`, whose delta fits a NATS message and a log record.
const IMPORT_SLICE: usize = 8192;

impl ReplicaError {
    /// A short, bounded label for metrics and stats.
    pub fn reason(&self) -> &'static str {
        match self {
            ReplicaError::Config(_) => "config",
            ReplicaError::InvalidItem(_) | ReplicaError::Overflow(_) => "invalid_request",
            ReplicaError::NotRemovable(_) => "not_removable",
            ReplicaError::NotCounting(_) => "not_counting",
            ReplicaError::Filter(FilterError::Full { .. } | FilterError::NoRoom { .. }) => "full",
            ReplicaError::Filter(_) => "filter",
            ReplicaError::Transport(_) => "transport",
            ReplicaError::Durable(_) => "durable",
            ReplicaError::Stopped => "stopped",
            ReplicaError::NotDurable(_) => "not_durable",
            ReplicaError::NotReplicated { .. } => "not_replicated",
            ReplicaError::AckUnavailable(_) => "ack_unavailable",
            ReplicaError::IdRetired { .. } => "id_retired",
            ReplicaError::TagsUnreserved => "tags_unreserved",
            ReplicaError::Busy => "busy",
            ReplicaError::NotServing => "not_serving",
            ReplicaError::ImportStopped { .. } => "import_stopped",
            ReplicaError::UnknownFilter(_) => "unknown_filter",
            ReplicaError::ClockAhead { .. } => "clock_ahead",
            ReplicaError::ImportTooLarge { .. } => "import_too_large",
        }
    }

    pub(crate) fn from_ack(failure: ack::AckFailure, timeout_ms: u64) -> Self {
        match failure {
            ack::AckFailure::NotDurable(e) => ReplicaError::NotDurable(e),
            ack::AckFailure::NotReplicated { acked, needed } => ReplicaError::NotReplicated {
                acked,
                needed,
                timeout_ms,
            },
            ack::AckFailure::Stopped => ReplicaError::Stopped,
        }
    }
}

impl From<actix::MailboxError> for ReplicaError {
    fn from(_: actix::MailboxError) -> Self {
        ReplicaError::Stopped
    }
}

/// A replica's figures (and the JSON of the API's `stats`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStats {
    /// Filter name.
    pub filter: String,
    /// Replica id.
    pub replica: ReplicaId,
    /// Replica uuid.
    pub uuid: Uuid,
    /// Caught up after its start.
    pub ready: bool,
    /// Transport connected.
    pub connected: bool,
    /// Peers heard from within three anti-entropy intervals.
    pub peers: usize,
    /// Updates not yet published.
    pub pending_delta: usize,
    /// Digest of the state (hex), equal on replicas with equivalent states.
    pub digest: String,
    /// Local updates waiting for their acknowledgement level.
    pub awaiting_ack: usize,
    /// Live peers whose last announced digest equals this one.
    pub converged_peers: usize,
    /// Ids of this filter held by running replicas in the registry, at the last look.
    pub live_ids: usize,
    /// Ids of this filter retired in the registry (free for new replicas), at the last look.
    pub retired_ids: usize,
    /// Whether this replica's own id was retired under it (see [`ReplicaError::IdRetired`]).
    pub id_lost: bool,
    /// The filter's figures.
    #[serde(flatten)]
    pub figures: FilterStats,
    /// Rejected replication messages by reason.
    pub rejects: BTreeMap<String, u64>,
    /// Request API errors by reason.
    pub api_errors: BTreeMap<String, u64>,
    /// Messages dropped because the outbound queue was full.
    pub outbound_dropped: u64,
    /// Messages dropped because the inbound buffer was full.
    pub dropped: u64,
    /// Transport disconnections since the start.
    pub disconnects: u64,
    /// Transport reconnections since the start (each re-announces the replica).
    pub reconnects: u64,
    /// Messages of peers that never arrived.
    pub sequence_gaps: u64,
    /// Deltas published.
    pub deltas_sent: u64,
    /// Deltas merged.
    pub deltas_merged: u64,
    /// Full-state pushes.
    pub state_pushes: u64,
    /// Peers' full states merged.
    pub states_merged: u64,
    /// Replication bytes published.
    pub bytes_sent: u64,
    /// Of which on the delta subject.
    pub delta_bytes_sent: u64,
    /// Of which on the state subject (digests, requests, full states).
    pub state_bytes_sent: u64,
    /// Replication bytes received (from other replicas).
    pub bytes_received: u64,
    /// Own replication messages the transport delivered back, dropped unread: 0 over NATS
    /// and the in-process bus, whose replication connections do not echo
    /// ([`crate::transport::Bus::replication_transport`]).
    #[serde(default)]
    pub echoes_received: u64,
    /// Digests of the whole state this replica computed (a pass over all of it for most kinds;
    /// `g_cuckoo` keeps its sum): for anti-entropy, when the state changed since the last one
    /// and a peer compares it.
    #[serde(default)]
    pub state_digests: u64,
    /// Size of the encoded state at its last encoding.
    pub state_bytes: u64,
}

/// What microservice code holds: sends the actor its messages, and reads the filter directly.
/// Cheap to clone (one reference count); usable from any thread or runtime.
#[derive(Clone)]
pub struct ReplicaHandle {
    // One `Arc` around the actor's address: cloning an actix `Addr` allocates (a sender task
    // and a flag) and bumps shared counters, which a RESP command that looks its filter up
    // paid on every request.
    parts: Arc<HandleParts>,
}

/// What a [`ReplicaHandle`] reaches.
struct HandleParts {
    addr: Addr<Replica>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ReplicaHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaHandle")
            .field("filter", &self.parts.shared.name)
            .field("identity", &self.parts.shared.identity)
            .finish()
    }
}

impl Replica {
    /// Starts a replica: restores the data directory if there is one, claims a replica id,
    /// subscribes, and starts the actor. Call it inside an actix System (`#[actix::main]`,
    /// `#[actix::test]` or `System::with_tokio_rt`): the actor and its tasks run on the
    /// current arbiter.
    pub async fn start(
        cfg: ReplicaConfig,
        transport: Arc<dyn Transport>,
    ) -> Result<ReplicaHandle, ReplicaError> {
        Self::start_with(cfg, transport, None).await
    }

    /// [`Replica::start`] under a node's shared id: a kind that may reuse ids issues its tags
    /// under `shared` (claimed and renewed once for all the node's replicas) instead of
    /// claiming an id of its own; other kinds claim their own as [`Replica::start`] does.
    /// Every replica of a filter must take its id the same way (ids of different registry
    /// namespaces may be equal).
    pub async fn start_with(
        cfg: ReplicaConfig,
        transport: Arc<dyn Transport>,
        shared: Option<Arc<SharedId>>,
    ) -> Result<ReplicaHandle, ReplicaError> {
        Self::start_hosted(cfg, transport, shared, None, None, |_| {}).await
    }

    /// [`Replica::start_with`], telling `started` of the replica as soon as its actor runs
    /// (it may serve its API from then on), before its first snapshot is written; its
    /// digests go to `digest_batches` if there are some, its API's queue group subscriptions
    /// to `group_api` if given.
    pub(crate) async fn start_hosted(
        cfg: ReplicaConfig,
        transport: Arc<dyn Transport>,
        shared: Option<Arc<SharedId>>,
        digest_batches: Option<Arc<crate::transport::digests::DigestBatcher>>,
        group_api: Option<GroupApi>,
        started: impl FnOnce(&ReplicaHandle),
    ) -> Result<ReplicaHandle, ReplicaError> {
        cfg.validate().map_err(ReplicaError::Config)?;
        let shared_id = shared.filter(|_| cfg.filter.kind.reuses_ids());
        let mut fresh = AnyFilter::new(&cfg.filter, 0)?;
        let (data, restored, replayed) = match &cfg.data_dir {
            // Off this thread, which may be the actors': a new directory is made with syncs
            // (its entry, its log's directory) that filters created together share
            // (`group_sync`), and a restart's reads then overlap the actors' work (a node of
            // 100,000 filters started in 6.2 s, where read here it took 6.4-8.3 s).
            Some(dir) => {
                // `fresh` goes and comes back: a large filter's bits are not copied.
                let moved = (dir.clone(), cfg.clone(), fresh);
                let (opened, back) = tokio::task::spawn_blocking(move || {
                    let (dir, cfg, fresh) = moved;
                    (open_data(&dir, &cfg, &fresh), fresh)
                })
                .await
                .map_err(|e| ReplicaError::Config(format!("data directory task: {e}")))?;
                fresh = back;
                opened?
            }
            None => (None, None, None),
        };
        let claiming = core::Claiming::new(cfg.filter.kind, restored, fresh);
        let (uuid, replica, claim_floor) = match &shared_id {
            // Also while the node's id is lost: tagged adds wait for it to be taken back
            // (the floor then rises, and the clock with it before a tag is issued).
            Some(s) => {
                let id = s.identity();
                (id.uuid, id.replica, s.floor())
            }
            None => {
                let claim = transport
                    .claim_replica_id(cfg.registry_name(), claiming.uuid, claiming.preferred)
                    .await?;
                (claiming.uuid, claim.id, claim.floor)
            }
        };
        let preferred = claiming.preferred;
        let core::Adopted {
            filter,
            identity,
            reserved,
            unchanged,
            id_changed,
        } = claiming.settle(uuid, replica, claim_floor);
        let keep_id = preferred.is_some();
        if id_changed && shared_id.is_none() {
            tracing::warn!(
                preferred,
                replica,
                "the replica id of the snapshot is held by another replica: tags go under a new id"
            );
        }
        let lease_reserved = match &shared_id {
            Some(s) => s.reserved(),
            None => {
                // The registry records the tags this replica may issue before it issues
                // any: a replica that later takes over a retired id starts above them.
                let lease_reserved = reserved + cfg.id_lease_block;
                match transport
                    .renew_claim(cfg.registry_name(), replica, uuid, lease_reserved)
                    .await?
                {
                    Renewal::Held => {}
                    Renewal::Lost => return Err(ReplicaError::IdRetired { replica }),
                }
                lease_reserved
            }
        };
        // A restart that changed nothing (the same identity and reservation, the state its
        // snapshot's) writes nothing: four fsyncs per filter made a node of 10,000 filters
        // take 109 s to start from its data directory. A kind without tags has no
        // reservation to keep (recovery trusts its identity without one): its first snapshot
        // is all a new replica writes, two fsyncs of the four (creates of `g_bloom` filters
        // on a node with a data directory waited for those fsyncs). See `core::start`.
        let tagged = cfg.filter.kind.tagged();
        if let Some(d) = &data
            && !unchanged
            && tagged
        {
            // Record the identity now: its reservation before any tag, and a first snapshot
            // (below), which also covers the replayed log. Off this thread, which may be the
            // actors': the fsyncs of filters starting together then overlap.
            let (d, reservation) = (d.clone(), durable::Reservation { identity, reserved });
            tokio::task::spawn_blocking(move || d.save_reservation(&reservation))
                .await
                .map_err(|e| ReplicaError::Config(format!("reservation task: {e}")))??;
        }
        let wal = replayed
            .map(|r| {
                wal::WalWriter::start(r, identity).map(|mut w| {
                    w.set_sync_interval(ReplicaConfig::ms(cfg.fsync_interval_ms));
                    w
                })
            })
            .transpose()?;
        let subjects = Subjects::new(&cfg.prefix, &cfg.name);
        // Replication on a transport that does not echo, where there is one: a replica's own
        // deltas and full states (hundreds of megabytes) do not come back to it.
        let replication_transport = transport
            .replication_transport()
            .await?
            .unwrap_or_else(|| transport.clone());
        let replication = match cfg.routed_replication {
            true => None,
            false => Some(
                replication_transport
                    .subscribe(subjects.replication, None)
                    .await?,
            ),
        };
        let shared = Arc::new(
            Shared::new(
                filter,
                cfg.name.clone(),
                identity,
                metrics::Telemetry::new(&cfg.name, replica, cfg.filter.fpr, cfg.aggregate_metrics),
                cfg.inbound_max_bytes,
                crate::api::batch::Limits::new(cfg.max_batch_items, cfg.max_item_bytes),
                cfg.serve_api,
            )
            .with_log(wal.is_some()),
        );
        tracing::info!(
            filter = %cfg.name, kind = %shared.kind, replica, %uuid,
            transport = transport.name(), restored = keep_id, "starting replica"
        );
        let setup = Setup {
            cfg,
            shared: shared.clone(),
            transport,
            replication_transport,
            replication,
            data,
            wal,
            reserved,
            lease_reserved,
            shared_id,
            digest_batches,
            resumed: false,
            group_api,
            restored: false,
        };
        let addr = Replica::new(setup).start();
        let handle = ReplicaHandle::from_parts(addr, shared);
        started(&handle);
        if !unchanged {
            handle.persist().await?;
        }
        Ok(handle)
    }
}

impl Replica {
    /// Runs a parked replica again ([`actor::Parked`]), on `arbiter`, under its node's id
    /// `shared_id`: at once, from the state its node kept (nothing read, claimed or
    /// written), ready as it was. Its replication is routed by its node
    /// ([`ReplicaConfig::routed_replication`]), its digests go to `digest_batches`.
    pub(crate) fn resume(
        cfg: ReplicaConfig,
        parked: Box<Parked>,
        transports: (Arc<dyn Transport>, Arc<dyn Transport>),
        shared_id: Arc<SharedId>,
        digest_batches: Option<Arc<crate::transport::digests::DigestBatcher>>,
        arbiter: &actix::ArbiterHandle,
    ) -> Result<ReplicaHandle, (ReplicaError, Box<Parked>)> {
        debug_assert!(
            cfg.routed_replication,
            "a node routes a parked replica's replication"
        );
        debug_assert_eq!(
            shared_id.identity(),
            parked.identity,
            "parked under the node's id"
        );
        let data = cfg.data_dir.clone().map(DataDir::existing);
        let wal = match (&data, parked.wal_next) {
            (Some(d), Some(next)) => {
                let dir = d.path().join(wal::WAL_DIR);
                let sync = ReplicaConfig::ms(cfg.fsync_interval_ms);
                match wal::WalWriter::resume_at(dir, d.disk().clone(), parked.identity, next, sync)
                {
                    Ok(w) => Some(w),
                    Err(e) => return Err((e.into(), parked)),
                }
            }
            _ => None,
        };
        let (transport, replication_transport) = transports;
        let seq = parked.seq;
        let restored = parked
            .unconfirmed
            .load(std::sync::atomic::Ordering::Relaxed);
        let shared = Arc::new(
            Shared::new(
                parked.filter,
                cfg.name.clone(),
                parked.identity,
                parked.telemetry,
                cfg.inbound_max_bytes,
                crate::api::batch::Limits::new(cfg.max_batch_items, cfg.max_item_bytes),
                cfg.serve_api,
            )
            .with_log(wal.is_some()),
        );
        let setup = Setup {
            cfg,
            shared: shared.clone(),
            transport,
            replication_transport,
            replication: None,
            data,
            wal,
            reserved: parked.reserved,
            lease_reserved: shared_id.reserved(),
            shared_id: Some(shared_id),
            digest_batches,
            resumed: true,
            // Its node serves its queue group already (or it has none).
            group_api: None,
            restored,
        };
        let mut replica = Replica::new(setup);
        replica.prepare_resumed();
        replica.resumed_at(seq);
        let addr = Replica::start_in_arbiter(arbiter, move |_| replica);
        Ok(ReplicaHandle::from_parts(addr, shared))
    }
}

impl Replica {
    /// A replica of a node's catalog filter, restored from its data directory without
    /// running it: parked at once, as if it had parked before its node stopped
    /// ([`actor::Parked`], its digest announced not ready, see
    /// [`actor::restored_announcement`]). Only if the directory alone is its state: a
    /// snapshot under the node's id `shared_id` and nothing logged beyond it (a log record
    /// replayed, a torn tail or damage cut off, another identity: `None`, and the replica
    /// starts as any, which saves what it recovered before it serves). The log is replayed
    /// (and its last segment synced) here as at any start: nothing acknowledged is left
    /// out, and its writer goes on after every segment when the replica resumes.
    pub(crate) async fn restore_parked(
        cfg: ReplicaConfig,
        shared_id: &SharedId,
    ) -> Result<Option<Parked>, ReplicaError> {
        let under = RestoreUnder::of(shared_id);
        // Off this thread, as a start's reads are; the digest and the frame too (a pass over
        // the state, and a signature).
        tokio::task::spawn_blocking(move || Replica::restore_parked_now(cfg, under))
            .await
            .map_err(|e| ReplicaError::Config(format!("data directory task: {e}")))?
    }

    /// [`Replica::restore_parked`] on this thread, which may block (a node restores its
    /// filters in batches on a few blocking threads: one hand-off to a blocking thread per
    /// filter cost a restart of 100,000 filters a third of its CPU in thread wake-ups).
    pub(crate) fn restore_parked_now(
        cfg: ReplicaConfig,
        under: RestoreUnder,
    ) -> Result<Option<Parked>, ReplicaError> {
        cfg.validate().map_err(ReplicaError::Config)?;
        let Some(dir) = cfg.data_dir.clone() else {
            return Ok(None);
        };
        // Only what would park running (an `expiring_bloom`, whose window moves, or a large
        // state never does).
        if !cfg.routed_replication || !cfg.filter.kind.reuses_ids() || !core::Traits::parks(&cfg) {
            return Ok(None);
        }
        // Only a directory with a snapshot, which opens as `DataDir::open_on` would open it
        // (it does nothing more to one with a snapshot); one without, or none at all, is
        // left to the replica's start, which makes or repairs it.
        let data = DataDir::existing(dir);
        let fresh = AnyFilter::new(&cfg.filter, 0)?;
        let Some(recovered) = recovery::restore_on_snapshot(&data, &cfg, &fresh)? else {
            return Ok(None);
        };
        let (Some(restored), replayed) = (recovered.state, recovered.wal) else {
            return Ok(None);
        };
        if !restored.snapshot_is_state {
            return Ok(None);
        }
        let kind = cfg.filter.kind;
        let claiming = core::Claiming::new(kind, Some(restored), fresh);
        let adopted = claiming.settle(under.uuid, under.replica, under.floor);
        if !adopted.unchanged {
            return Ok(None);
        }
        let filter = adopted.filter;
        let digest = filter.state_digest();
        let announce = actor::restored_announcement(
            &cfg,
            (filter.kind(), filter.params_digest()),
            adopted.identity,
            digest,
        );
        let telemetry = metrics::Telemetry::new(
            &cfg.name,
            under.replica,
            cfg.filter.fpr,
            cfg.aggregate_metrics,
        );
        Ok(Some(Parked {
            filter,
            identity: adopted.identity,
            telemetry,
            wal_next: Some(replayed.next_segment()),
            reserved: adopted.reserved,
            seq: 0,
            digest,
            announce: Some(announce),
            unconfirmed: std::sync::atomic::AtomicBool::new(true),
            restored: true,
            limits: crate::api::batch::Limits::new(cfg.max_batch_items, cfg.max_item_bytes),
        }))
    }
}

/// The node's id a catalog filter is restored parked under ([`Replica::restore_parked_now`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RestoreUnder {
    uuid: uuid::Uuid,
    replica: ReplicaId,
    floor: u64,
}

impl RestoreUnder {
    /// The node's id as `shared_id` has it now.
    pub(crate) fn of(shared_id: &SharedId) -> Self {
        let id = shared_id.identity();
        RestoreUnder {
            uuid: id.uuid,
            replica: id.replica,
            floor: shared_id.floor(),
        }
    }
}

/// A replica's data directory opened, and what it recovers from it.
type OpenedData = (
    Option<DataDir>,
    Option<recovery::Restored>,
    Option<wal::Replayed>,
);

fn open_data(
    dir: &Path,
    cfg: &ReplicaConfig,
    fresh: &AnyFilter,
) -> Result<OpenedData, ReplicaError> {
    let data = DataDir::open_new(dir, &cfg.data_dir_files)?;
    let recovered = recovery::restore(&data, cfg, fresh)?;
    Ok((Some(data), recovered.state, Some(recovered.wal)))
}

impl ReplicaHandle {
    /// The actor's address, to send it [`Add`], [`Remove`], [`Contains`], [`Stats`],
    /// [`TakeSnapshot`], [`Merge`], [`Persist`], [`FlushDelta`] or [`Shutdown`].
    pub fn addr(&self) -> &Addr<Replica> {
        &self.parts.addr
    }

    /// Filter name.
    pub fn name(&self) -> &str {
        &self.parts.shared.name
    }

    /// The filter's kind.
    pub fn kind(&self) -> crate::FilterKind {
        self.parts.shared.kind
    }

    /// Whether it serves the request API now (it was asked to, and is ready).
    pub(crate) fn serving_api(&self) -> bool {
        self.parts.shared.api.load().is_some()
    }

    /// Whether `other` is a handle of the same replica (not another incarnation of its name).
    pub(crate) fn same_replica(&self, other: &ReplicaHandle) -> bool {
        Arc::ptr_eq(&self.parts.shared, &other.parts.shared)
    }

    /// Hands the replica a message of its replication subject that the node's shared
    /// subscription received ([`ReplicaConfig::routed_replication`]): decoded and checked,
    /// then into its inbound buffer (or dropped, and counted). Nothing for a replica that
    /// subscribes itself.
    pub(crate) fn route_replication(&self, msg: crate::transport::Message) {
        actor::route_replication(&self.parts.shared, msg, false)
    }

    /// Hands the replica a connection event of the transport it was started on, received by
    /// its node for it ([`ReplicaConfig::routed_replication`]); waits while its inbound buffer
    /// is full. Nothing for a replica that takes its own events.
    pub(crate) async fn route_event(&self, ev: crate::transport::TransportEvent) {
        actor::route_event(&self.parts.shared, ev).await
    }

    /// [`ReplicaHandle::route_replication`] for a frame of a digest batch: anything but a
    /// digest outside the sequence is refused (and counted).
    pub(crate) fn route_batched_digest(&self, msg: crate::transport::Message) {
        actor::route_replication(&self.parts.shared, msg, true)
    }

    /// A request to this replica's own API subjects, received by its node for it
    /// ([`ReplicaConfig::catalog_hosted`]): answered as the replica's own subscription
    /// would. The reply to publish, if any.
    pub(crate) fn route_own_api(
        &self,
        msg: crate::transport::Message,
    ) -> Option<(String, async_nats::HeaderMap, bytes::Bytes)> {
        actor::route_own_api(&self.parts.shared, msg)
    }

    /// Its instance of the NATS service API, once it serves its API: ready, its API's
    /// subscriptions confirmed by the server (the endpoints the instance announces answer).
    pub(crate) fn service(&self) -> Option<Arc<service::ApiService>> {
        if !self.parts.shared.lifecycle.is_ready() {
            return None;
        }
        self.parts
            .shared
            .api
            .load()
            .as_ref()
            .map(|reads| reads.service.clone())
    }

    /// The replica's uuid and id.
    pub fn identity(&self) -> Identity {
        self.parts.shared.identity
    }

    /// Adds an item at the replica's default acknowledgement level; OR kinds answer the tag
    /// they issued.
    pub async fn add(&self, item: impl Into<Vec<u8>>) -> Result<Option<Dot>, ReplicaError> {
        self.add_with(item, None).await
    }

    /// Adds an item, answering once the update reached `ack` (unset: the default level).
    /// On [`ReplicaError::NotDurable`] and [`ReplicaError::NotReplicated`] the item is added
    /// locally all the same.
    pub async fn add_with(
        &self,
        item: impl Into<Vec<u8>>,
        ack: impl Into<Option<AckLevel>>,
    ) -> Result<Option<Dot>, ReplicaError> {
        let (item, ack) = (item.into(), ack.into());
        self.parts.addr.send(Add { item, ack }).await?
    }

    /// Removes one occurrence of an item (OR kinds); `false` if it was not contained.
    pub async fn remove(&self, item: impl Into<Vec<u8>>) -> Result<bool, ReplicaError> {
        Ok(self.remove_dot(item).await?.is_some())
    }

    /// Removes one occurrence of an item (OR kinds) and answers the tag of the entry removed.
    pub async fn remove_dot(&self, item: impl Into<Vec<u8>>) -> Result<Option<Dot>, ReplicaError> {
        self.remove_with(item, None).await
    }

    /// Removes one occurrence of an item (OR kinds), answering once the update reached `ack`;
    /// answers the tag of the entry removed.
    pub async fn remove_with(
        &self,
        item: impl Into<Vec<u8>>,
        ack: impl Into<Option<AckLevel>>,
    ) -> Result<Option<Dot>, ReplicaError> {
        let (item, ack) = (item.into(), ack.into());
        self.parts.addr.send(Remove { item, ack }).await?
    }

    /// A request of the request API (README, "Subjects") made in this process, answered
    /// typed, as a NATS requester would be answered (without NATS, headers or JSON). Queries,
    /// and adds to grow-only kinds at `local`, `logged` and `durable`, are applied and
    /// answered in the caller's thread (a `durable` one once the commit that carries it is
    /// synced); everything else through the actor, in the order it arrives there. Fails
    /// like the request would, or if it was not taken ([`ReplicaError::NotServing`] before
    /// the replica is ready, as NATS requests only reach ready replicas;
    /// [`ReplicaError::Busy`], [`ReplicaError::Stopped`]), or the replica stopped before
    /// answering.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use crpf::replica::{Replica, ReplicaConfig};
    /// # use crpf::api::{AddMode, AddOutcome, Request, Response};
    /// # #[actix::main]
    /// # async fn main() {
    /// let cfg = ReplicaConfig::for_kind("users", crpf::FilterKind::GBloom, 1_000, 0.01);
    /// let bus = Arc::new(crpf::transport::InProcessBus::new());
    /// let filter = Replica::start(cfg, bus).await.unwrap();
    /// filter.wait_ready(std::time::Duration::from_secs(10)).await;
    /// let add = Request::Add { item: "alice".into(), mode: AddMode::ReportNew, ack: None };
    /// let added = filter.call(add).await.unwrap();
    /// assert_eq!(added, Response::Added { mode: AddMode::ReportNew, outcome: AddOutcome::New });
    /// let found = filter.call(Request::Contains { item: "alice".into() }).await;
    /// assert_eq!(found.unwrap(), Response::Contains(true));
    /// # filter.shutdown().await.unwrap();
    /// # }
    /// ```
    pub fn call(&self, request: crate::api::Request) -> PendingResponse {
        self.call_via(request, false)
    }

    /// [`ReplicaHandle::call`] through the actor, whatever the request: it then runs after
    /// every request already in the actor's inbound buffer. For a caller that must keep the
    /// order of its requests while an earlier one is still with the actor (a query would
    /// otherwise be answered at once, before that earlier update is applied).
    pub fn call_queued(&self, request: crate::api::Request) -> PendingResponse {
        self.call_via(request, true)
    }

    fn call_via(&self, request: crate::api::Request, queued: bool) -> PendingResponse {
        match self.parts.shared.api.load().as_ref() {
            Some(api) => api.call(request, queued),
            None => PendingResponse::Ready(Some(Err(self.parts.shared.not_serving()))),
        }
    }

    /// What a batch request to this replica may hold (`max_batch_items`, `max_item_bytes`).
    pub fn limits(&self) -> crate::api::batch::Limits {
        self.parts.shared.limits
    }

    /// Whether the replica serves the request API (`serve_api`; from the moment it is ready).
    pub fn serves_api(&self) -> bool {
        self.parts.shared.serve_api
    }

    /// Steps this replica's wall clock by `offset_ms` from the system's (0: the system's),
    /// as a clock that jumps would: for tests of the kinds whose elements expire.
    #[doc(hidden)]
    pub fn set_clock_offset_ms(&self, offset_ms: i64) {
        self.parts.shared.clock.set_offset_ms(offset_ms);
    }

    /// Membership test, read directly from the state: it never waits behind replication work
    /// queued for the actor (at most behind one merge in progress).
    pub fn contains(&self, item: &[u8]) -> bool {
        match &self.parts.shared.reader {
            Some(r) => r.contains(item),
            None => self.read(|f| {
                f.contains_as_of(item, self.parts.shared.clock.for_reads(f.clock_bounds()))
            }),
        }
    }

    /// The multiplicity of an item, for the kinds that count (`counting_cuckoo`); read
    /// without the actor's mailbox, like [`ReplicaHandle::contains`].
    pub fn count(&self, item: &[u8]) -> Result<u64, ReplicaError> {
        Ok(self.read(|f| f.count(item))?)
    }

    /// Runs a read-only closure on the current state.
    pub fn read<T>(&self, f: impl FnOnce(&AnyFilter) -> T) -> T {
        f(&self
            .parts
            .shared
            .filter
            .read()
            .expect("filter lock poisoned"))
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> AnyFilter {
        self.read(Clone::clone)
    }

    /// The replica's figures.
    pub async fn stats(&self) -> Result<ReplicaStats, ReplicaError> {
        Ok(self.parts.addr.send(Stats).await?)
    }

    /// Merges a full state from elsewhere.
    pub async fn merge(&self, state: AnyFilter) -> Result<(), ReplicaError> {
        self.parts.addr.send(Merge(state)).await?
    }

    /// Re-adds every live occurrence of `dump`, a state of the same kind and parameters (a
    /// dump of another filter, or of another incarnation of this one), as this replica's own
    /// updates: for the observed-remove kinds each entry under a fresh tag of this replica,
    /// from the range its id claim reserves; for `counting_cuckoo` each counted slot as this
    /// replica's own count. The dump's tags and counts are never merged as they are: they
    /// belong to the replicas that made them (merged here, this filter's replicas would
    /// refuse them as unreserved, or they would collide with tags their owner issues later).
    /// The occurrences go in the sub-filter (and writer's series) they came from, so the
    /// filter answers membership and `count` for the dumped items as the dump did, and its
    /// replicas remove them like any entry. Answers the occurrences added.
    ///
    /// The tags needed are reserved first; then the occurrences go through the actor in
    /// slices of 8192, each one update (logged, published as a delta and acknowledged as
    /// adds are; `durable` with a write-ahead log, so that no log record outgrows its limit).
    /// A dump of another kind or parameters, one that does not fit beside what the filter
    /// holds ([`crate::FilterError::NoRoom`]: a sub-filter is left with no more entries than
    /// its slots, or than the dump's held), or tags that cannot be reserved, change
    /// nothing. A slice that fails after others were added ends the import with
    /// [`ReplicaError::ImportStopped`]. The kinds without tags or counts refuse: merge their
    /// states ([`ReplicaHandle::merge`]).
    pub async fn import(&self, dump: &AnyFilter) -> Result<u64, ReplicaError> {
        let digest = self.read(AnyFilter::params_digest);
        if dump.kind() != self.kind() || dump.params_digest() != digest {
            return Err(FilterError::Incompatible(format!(
                "a {} dump of other parameters imported into a {} filter",
                dump.kind(),
                self.kind()
            ))
            .into());
        }
        if !self.kind().removable() {
            return Err(FilterError::Incompatible(format!(
                "a {} filter re-adds no occurrences: merge its states",
                self.kind()
            ))
            .into());
        }
        let occurrences = dump.live_occurrences();
        let room = Arc::new(crate::ImportRoom::of(self.kind(), &occurrences));
        let total = occurrences
            .iter()
            .fold(0u64, |n, o| n.saturating_add(o.count));
        // The whole dump checked first (each slice is again): a dump that does not fit
        // changes nothing.
        self.read(|f| f.check_import(&occurrences, &room))?;
        let tags = AnyFilter::tags_for_import(self.kind(), &occurrences);
        self.parts.addr.send(ReserveTags(tags)).await??;
        let mut imported = 0u64;
        for slice in occurrences.chunks(IMPORT_SLICE) {
            let import = Import {
                occurrences: slice.to_vec(),
                room: room.clone(),
                ack: None,
            };
            match self
                .parts
                .addr
                .send(import)
                .await
                .map_err(ReplicaError::from)
            {
                Ok(Ok(n)) => imported += n,
                Ok(Err(e)) | Err(e) => {
                    let applied = matches!(
                        e,
                        ReplicaError::NotDurable(_)
                            | ReplicaError::NotReplicated { .. }
                            | ReplicaError::Stopped
                    );
                    if imported == 0 && !applied {
                        return Err(e);
                    }
                    return Err(ReplicaError::ImportStopped {
                        imported,
                        total,
                        cause: Box::new(e),
                    });
                }
            }
        }
        tracing::debug!(filter = %self.name(), imported, "imported a dump's occurrences");
        Ok(imported)
    }

    /// Adds `occurrences`, located as in this filter ([`ReplicatedFilter::import_occurrences`]
    /// of its kind), as this replica's own update, in one update: logged, published and
    /// acknowledged at `ack` (default as [`ReplicaHandle::import`]) as an add is. What a
    /// count-min sketch's increments are (`CMS.INCRBY`, `CMS.MERGE`: its counters, located
    /// by row and column); all or nothing. The kinds with tags refuse (they reserve tags
    /// first: [`ReplicaHandle::import`]). Answers what the kind's import answers.
    ///
    /// [`ReplicatedFilter::import_occurrences`]: crate::ReplicatedFilter::import_occurrences
    pub async fn add_located(
        &self,
        occurrences: Vec<crate::Occurrence>,
        ack: Option<AckLevel>,
    ) -> Result<u64, ReplicaError> {
        if self.kind().tagged() {
            return Err(FilterError::Incompatible(format!(
                "a {} filter's occurrences are imported with tags",
                self.kind()
            ))
            .into());
        }
        let import = Import {
            occurrences,
            room: Arc::new(crate::ImportRoom::default()),
            ack,
        };
        self.parts.addr.send(import).await?
    }

    /// Writes a snapshot to the data directory now (no-op without one).
    pub async fn persist(&self) -> Result<(), ReplicaError> {
        self.parts.addr.send(Persist).await?
    }

    /// Publishes the pending delta now.
    pub async fn flush(&self) -> Result<(), ReplicaError> {
        Ok(self.parts.addr.send(FlushDelta).await?)
    }

    /// Whether the replica caught up after its start.
    pub fn is_ready(&self) -> bool {
        self.parts.shared.lifecycle.is_ready()
    }

    /// Waits until the replica is ready; `false` on timeout.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.parts.shared.lifecycle.ready())
            .await
            .is_ok()
    }

    /// Polls the state until `cond` holds; `false` on timeout. For tests and tools.
    pub async fn wait_until(&self, timeout: Duration, cond: impl Fn(&AnyFilter) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.read(&cond) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Publishes what is pending, writes a final snapshot and stops the actor; returns once the
    /// transport has sent what was queued (or after 5 s).
    pub async fn shutdown(&self) -> Result<(), ReplicaError> {
        self.parts.addr.send(Shutdown).await?
    }

    /// [`ReplicaHandle::shutdown`], waiting for the last publications until `flush_by` at
    /// the latest.
    pub(crate) async fn shutdown_by(
        &self,
        flush_by: tokio::time::Instant,
    ) -> Result<(), ReplicaError> {
        self.parts.addr.send(actor::ShutdownBy(flush_by)).await?
    }

    /// Shuts the replica down because its filter was dropped everywhere: unlike after
    /// [`ReplicaHandle::shutdown`], its request API goes on refusing requests for a moment
    /// (half a second), so that those the NATS server still routes here are refused rather
    /// than left to time out. A replica that merely stops must not linger: a live replica
    /// of the filter (another node's, or its own restart under the same id) answers them.
    pub async fn shutdown_dropped(&self) -> Result<(), ReplicaError> {
        self.parts
            .shared
            .dropped
            .store(true, std::sync::atomic::Ordering::Release);
        self.shutdown().await
    }
}

/// The replica's one clock: wall-clock milliseconds since the UNIX epoch, passed to the filters
/// whose elements expire (the core reads no clock). A clock before 1970 reads as 0.
pub(crate) fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
