//! What one replica shares between its actor, its handles and its subscription tasks
//! ([`Shared`]: the filter cell and the flags threads coordinate through), and what a replica
//! starts with ([`Setup`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::{Inbound, commits, lifecycle, pump, reads};
use crate::replica::ReplicaError;
use crate::replica::config::ReplicaConfig;
use crate::replica::durable::{DataDir, Identity};
use crate::replica::filter::AnyFilter;
use crate::replica::metrics::Telemetry;
use crate::replica::wal::WalWriter;
use crate::transport::digests::DigestBatcher;
use crate::transport::{MessageStream, Transport};
use crate::wire::FilterKind;

/// What one replica shares between its actor, its handle and its inbound tasks.
pub(crate) struct Shared {
    /// The filter. The actor writes it, and so do the API's subscription tasks for `local`
    /// adds to grow-only kinds ([`updates`]); handles read it without queueing behind
    /// replication work in the mailbox.
    pub filter: RwLock<AnyFilter>,
    /// Reads the filter's bits without its lock, for the kinds that allow it (`g_bloom`):
    /// queries never wait for an update or a merge in progress.
    pub reader: Option<crate::BloomReader>,
    pub name: String,
    pub kind: FilterKind,
    pub identity: Identity,
    /// Ready, and whether the actor is gone, for those waiting outside it.
    pub lifecycle: lifecycle::Lifecycle,
    pub telemetry: Telemetry,
    /// Bytes of messages waiting in the inbound buffer, and their bound.
    pub inbound_bytes: AtomicU64,
    pub inbound_max_bytes: u64,
    /// The state changed outside the actor (an update applied in a subscription task) since
    /// the actor last looked: its digest is stale, and a snapshot and a push are due.
    pub direct_changes: AtomicBool,
    /// A commit was asked of the actor because the pending delta is full, and not yet made.
    pub commit_requested: AtomicBool,
    /// A flush of the pending delta is scheduled (or asked of the actor): an idle replica
    /// has no timer running for its deltas, and a change arms one ([`Shared::want_flush`]).
    pub flush_scheduled: AtomicBool,
    /// The number of the commit whose delta the next take carries: moved on by the actor
    /// under the write lock as it takes a delta, read under it by updates applied outside
    /// the actor that wait for their commit ([`commits`]).
    pub open_batch: AtomicU64,
    /// The highest commit that an update applied outside the actor needs fsynced (raised
    /// under the write lock, read by the commit that takes the update's delta).
    pub sync_through: AtomicU64,
    /// How far the commits got, for the [`CommitTicket`]s of those updates.
    pub commits: commits::Commits,
    /// A commit within a millisecond is asked of the actor (`logged` updates applied in a
    /// subscription task) and not yet scheduled.
    pub logged_commit_requested: AtomicBool,
    /// The write-ahead log failed and is not replaced yet: `logged` updates are answered as
    /// applied but not durable.
    pub wal_failed: AtomicBool,
    /// The replica shut down: updates are no longer applied (set under the write lock).
    pub closed: AtomicBool,
    /// A publisher task runs ([`pump::publish`]): one at a time, so that frames leave in
    /// the order they were queued, and none while nothing is queued (a task of its own for
    /// each of a node's 100,000 mostly idle replicas cost 640 bytes each).
    pub publishing: AtomicBool,
    /// Full-state pushes queued or going out: their chunks' numbers are taken, and some
    /// may not be published for a while (a batched digest claims no number meanwhile).
    pub pushes_out: std::sync::atomic::AtomicUsize,
    /// The replica shuts down because its filter was dropped: its API refuses for a moment
    /// longer ([`pump::API_LINGER`]), since no other replica will answer for it.
    pub dropped: AtomicBool,
    /// What a batch request may hold (`max_batch_items`, `max_item_bytes`).
    pub limits: crate::api::batch::Limits,
    /// Whether the replica serves the request API (`serve_api`), once ready.
    pub serve_api: bool,
    /// Answers requests of the API made in this process ([`ReplicaHandle::request`]); set
    /// once the API is served, and let go when the actor stops: the requests' path holds
    /// this `Shared`, so a cell kept for good kept every stopped replica (its filter among
    /// it) alive through the cycle.
    pub api: arc_swap::ArcSwapOption<reads::Reads>,
    /// Takes the messages the node routes to the replica
    /// ([`ReplicaConfig::routed_replication`]); set as the actor is made.
    pub replication_inlet: std::sync::OnceLock<pump::Inlet>,
    /// The time kinds whose elements expire go by, bounded by the peers' clock.
    pub clock: crate::replica::clock::ReplicaClock,
    /// Merges the log does not hold: adds record their whole footprint meanwhile.
    pub unlogged: Arc<crate::replica::core::UnloggedMerges>,
}

impl Shared {
    /// What a replica shares with its handles and tasks, before anything happened: no change,
    /// request or commit yet, not closed, the API not served.
    pub(crate) fn new(
        filter: AnyFilter,
        name: String,
        identity: Identity,
        telemetry: Telemetry,
        inbound_max_bytes: u64,
        limits: crate::api::batch::Limits,
        serve_api: bool,
    ) -> Self {
        Shared {
            unlogged: Default::default(),
            kind: filter.kind(),
            reader: filter.shared_reader(),
            filter: RwLock::new(filter),
            name,
            identity,
            lifecycle: Default::default(),
            telemetry,
            inbound_bytes: Default::default(),
            inbound_max_bytes,
            direct_changes: Default::default(),
            commit_requested: Default::default(),
            flush_scheduled: Default::default(),
            open_batch: AtomicU64::new(crate::replica::core::FIRST_BATCH),
            sync_through: Default::default(),
            commits: Default::default(),
            logged_commit_requested: Default::default(),
            wal_failed: Default::default(),
            closed: Default::default(),
            publishing: Default::default(),
            pushes_out: Default::default(),
            dropped: Default::default(),
            api: Default::default(),
            replication_inlet: Default::default(),
            clock: Default::default(),
            limits,
            serve_api,
        }
    }

    /// With a write-ahead log: adds record their footprints while the state holds merges
    /// the log does not ([`crate::replica::core::UnloggedMerges`]).
    pub(crate) fn with_log(mut self, logged: bool) -> Self {
        self.unlogged = Arc::new(crate::replica::core::UnloggedMerges::new(logged));
        self
    }

    /// Why the replica's API takes no request: it stopped (its API let go), or it does not
    /// serve yet.
    pub(crate) fn not_serving(&self) -> ReplicaError {
        match self.closed.load(Ordering::Acquire) {
            true => ReplicaError::Stopped,
            false => ReplicaError::NotServing,
        }
    }

    /// The state changed: unless a flush is already scheduled, asks the actor for one
    /// ([`Inbound::Wake`]). A full inbound buffer drops the request; the housekeeping tick
    /// then notices the pending delta.
    pub(crate) fn want_flush(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(&self.flush_scheduled, to_actor, Inbound::Wake);
    }

    /// A `logged` update was applied outside the actor: asks for a commit within a
    /// millisecond ([`Inbound::LoggedCommit`]) unless one is asked for already. A full
    /// inbound buffer drops the request; the delta's periodic commit then carries it.
    pub(crate) fn want_logged_commit(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(
            &self.logged_commit_requested,
            to_actor,
            Inbound::LoggedCommit,
        );
    }

    /// Asks the actor for a commit now ([`Inbound::Commit`]) unless one is asked for
    /// already. A full inbound buffer drops the request; the periodic commit comes soon
    /// enough.
    pub(crate) fn want_commit(&self, to_actor: &flume::Sender<Inbound>) {
        ask_once(&self.commit_requested, to_actor, Inbound::Commit);
    }
}

/// Sends `ask` to the actor unless `asked` says it is on its way (the actor clears it when
/// it handles it); `asked` is cleared again if the inbound buffer is full. A load first: on
/// the hot path the request is mostly made already, and a swap would take the line from the
/// actor's core every time.
fn ask_once(asked: &AtomicBool, to_actor: &flume::Sender<Inbound>, ask: Inbound) {
    if !asked.load(Ordering::Acquire)
        && !asked.swap(true, Ordering::AcqRel)
        && to_actor.try_send(ask).is_err()
    {
        asked.store(false, Ordering::Release);
    }
}

/// Everything a replica needs to start, prepared by [`super::Replica::start`].
pub(crate) struct Setup {
    pub cfg: ReplicaConfig,
    pub shared: Arc<Shared>,
    pub transport: Arc<dyn Transport>,
    /// Publishes and subscribes replication (no echo where the transport can): see
    /// [`Transport::replication_transport`].
    pub replication_transport: Arc<dyn Transport>,
    /// Its own replication subscription; none if the node routes its replication subject
    /// ([`ReplicaConfig::routed_replication`]).
    pub replication: Option<MessageStream>,
    pub data: Option<DataDir>,
    /// The write-ahead log, with a data directory.
    pub wal: Option<WalWriter>,
    pub reserved: u64,
    /// The tags the registry confirmed this replica may issue.
    pub lease_reserved: u64,
    /// The node's id, when the replica issues its tags under it (see [`crate::replica::SharedId`]).
    pub shared_id: Option<Arc<crate::replica::SharedId>>,
    /// Where its digests go, when its node publishes them in batches.
    pub digest_batches: Option<Arc<DigestBatcher>>,
    /// It resumes after parking (`parking`): ready at once, as it was.
    pub resumed: bool,
    /// Its node serves its API's queue group subscriptions ([`GroupApi`]).
    pub group_api: Option<GroupApi>,
    /// It resumes from a state its node restored from its data directory, not yet
    /// confirmed by a peer's equal digest (`Parked::unconfirmed`): it serves at once but
    /// catches up as a starting replica does, by digests, without asking for states.
    pub restored: bool,
}

/// Takes a replica's subscriptions in its API's queue group (stream or `None` to subscribe
/// again, subject, group) once it serves them, for its node to serve for as long as the node
/// routes (a configured filter's replica may then park: the subscription outlives its actor).
pub(crate) type GroupApi =
    Box<dyn FnOnce(Vec<(Option<crate::transport::MessageStream>, String, String)>) + Send>;
