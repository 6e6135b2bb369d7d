//! Replica configuration (serde, with defaults: the node layer loads it from TOML).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ack::AckLevel;
use super::filter::FilterSpec;
use crate::transport::is_token;
use crate::wire::{AuthKeys, FilterKind};

/// The largest `fsync_interval_ms`: a minute of acknowledged updates is as much as a crash of
/// the machine may take at `logged`.
pub const MAX_FSYNC_INTERVAL_MS: u64 = 60_000;

/// How one replica of one filter behaves. Only `name` and `filter` have no default.
///
/// ```
/// let cfg: crpf::replica::ReplicaConfig = serde_json::from_str(r#"{
///     "name": "sessions",
///     "filter": {"kind": "or_cuckoo", "capacity": 100000, "fpr": 0.01},
///     "data_dir": "/var/lib/crpf/sessions"
/// }"#).unwrap();
/// assert_eq!(cfg.prefix, "crpf");
/// assert_eq!(cfg.delta_interval_ms, 2);
/// cfg.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// The filter's name: one subject token (`[A-Za-z0-9_-]`, at most 64 bytes).
    pub name: String,
    /// Its type and size; equal on every replica.
    pub filter: FilterSpec,
    /// Subject prefix.
    #[serde(default = "d::prefix")]
    pub prefix: String,
    /// The longest a local update waits for its delta to be published. An update on a quiet
    /// link (no delta published for this long) goes at once; under load the updates of one
    /// interval share a delta, so that a busy replica publishes at most one every interval
    /// (and one per `delta_max_updates`). At 2 ms an add reached the other replicas within
    /// 4.3 ms (p99, 10,000 adds/s over three replicas), where 50 ms gave 52 ms; the deltas'
    /// compact encoding keeps the bytes per add below what 50 ms cost before at that rate
    /// (BENCHMARKS.md, "Replication latency"). A longer interval sends fewer bytes per add at
    /// low rates, where each delta carries few adds.
    #[serde(default = "d::delta_interval_ms")]
    pub delta_interval_ms: u64,
    /// Publish the pending delta as soon as it holds this many entries (a Bloom add sets up
    /// to `k` bits, each an entry). Updates waiting for `durable` or `replicated` are
    /// committed within a millisecond whatever this says: it bounds a delta's size and how
    /// often a busy replica publishes. Each publish costs a wake-up of the actor, an envelope
    /// and a message through nats-server: at 1024, `g_bloom` adds at 2.4M items/s published
    /// 16,000 deltas a second, and 8192 gave 15-30% more adds per CPU second (CHANGELOG.md,
    /// benchmark history).
    /// A delta of 8192 entries is 40 KB (`g_bloom`) to 200 KB (`or_cuckoo`), well under
    /// nats-server's 1 MiB `max_payload`.
    #[serde(default = "d::delta_max_updates")]
    pub delta_max_updates: usize,
    /// Interval of anti-entropy digests (with ±25% jitter so replicas do not synchronise).
    #[serde(default = "d::anti_entropy_interval_ms")]
    pub anti_entropy_interval_ms: u64,
    /// Least time between two full-state pushes of this replica (one push serves every peer).
    #[serde(default = "d::min_push_interval_ms")]
    pub min_push_interval_ms: u64,
    /// Instead of deltas, broadcast the full state at every delta interval (the naive
    /// state-based protocol; for comparisons).
    #[serde(default)]
    pub full_state_only: bool,
    /// How long a starting replica waits to hear a peer's state before it declares itself
    /// ready anyway (it may be alone).
    #[serde(default = "d::catch_up_timeout_ms")]
    pub catch_up_timeout_ms: u64,
    /// Where the replica keeps its snapshot, identity and tag reservations; none: in memory.
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Snapshot interval (only when the state changed), with a data directory.
    #[serde(default = "d::snapshot_interval_ms")]
    pub snapshot_interval_ms: u64,
    /// Tag timestamps reserved durably per write of the reservation file (OR kinds with a data
    /// directory): a larger block means fewer fsyncs and a larger gap after a crash.
    #[serde(default = "d::tag_reserve_block")]
    pub tag_reserve_block: u64,
    /// Largest replication message accepted (a single frame).
    #[serde(default = "d::max_message_bytes")]
    pub max_message_bytes: usize,
    /// Largest full state accepted from a peer (after reassembly).
    #[serde(default = "d::max_state_bytes")]
    pub max_state_bytes: u64,
    /// Chunk size of full-state transfers; capped below the server's `max_payload`.
    #[serde(default = "d::chunk_bytes")]
    pub chunk_bytes: usize,
    /// Largest item of an add/remove/contains (default 1 MiB).
    #[serde(default = "d::max_item_bytes")]
    pub max_item_bytes: usize,
    /// Most items of one batch request of the API (`madd`, `mremove`, `mcontains`); a larger
    /// batch is refused whole. A batch is also bounded by the server's `max_payload`.
    #[serde(default = "d::max_batch_items")]
    pub max_batch_items: usize,
    /// Messages received but not yet handled that the replica buffers; more are dropped and
    /// counted (`crpf_dropped_messages_total`). Anti-entropy repairs a lost replication
    /// message; a request gets no reply over NATS and [`crate::replica::ReplicaError::Busy`]
    /// over RESP or in process. (Requests answered in the subscription tasks, queries and
    /// `local` adds to grow-only kinds, do not pass through it.)
    #[serde(default = "d::inbound_buffer")]
    pub inbound_buffer: usize,
    /// Bytes the inbound buffer may hold (chunks of states are large); more are dropped and
    /// counted like a full buffer.
    #[serde(default = "d::inbound_max_bytes")]
    pub inbound_max_bytes: u64,
    /// Serve the request API (`<prefix>.<filter>.api.*`) once ready.
    #[serde(default = "d::yes")]
    pub serve_api: bool,
    /// Interval of the gauges (fpr, load, cardinality, staleness...) while they may move: a
    /// quiet replica without peers sets them with its (spaced-out) digests.
    #[serde(default = "d::metrics_interval_ms")]
    pub metrics_interval_ms: u64,
    /// Default acknowledgement level of local updates (per request: the API's `Crpf-Ack`
    /// header, [`super::ReplicaHandle::add_with`]). Unset: `durable` with a data directory,
    /// `local` without.
    #[serde(default)]
    pub ack: Option<AckLevel>,
    /// With a data directory: the longest a commit written to the write-ahead log without an
    /// fsync (updates at `logged` and `local`) waits for one; the log is synced at most this
    /// often, and only when something was written since. A crash of the machine loses at
    /// most this window of `logged` updates (a crash of the process, none that was written).
    /// 1 to 60,000 ms; default 1,000 (Redis's `appendfsync everysec`).
    #[serde(default = "d::fsync_interval_ms")]
    pub fsync_interval_ms: u64,
    /// Peer acknowledgements a `replicated` update needs; unset: a majority of the live
    /// replicas, this one included.
    #[serde(default)]
    pub replicated_peers: Option<usize>,
    /// How long a `replicated` update waits for its peers before it is answered with an
    /// error (it stays applied and durable locally).
    #[serde(default = "d::replicated_timeout_ms")]
    pub replicated_timeout_ms: u64,
    /// Peers (sender uuids) tracked at once; a message of a new sender beyond this is
    /// rejected (`too_many_peers`) unless a silent peer can be evicted. Bounds what forged
    /// senders can make a replica remember.
    #[serde(default = "d::max_peers")]
    pub max_peers: usize,
    /// A peer not heard from for this long is forgotten (its staleness series ends).
    #[serde(default = "d::peer_expiry_ms")]
    pub peer_expiry_ms: u64,
    /// Messages waiting to be published; beyond this they are dropped and counted
    /// (`crpf_outbound_dropped_total`): deltas are repaired by anti-entropy.
    #[serde(default = "d::outbound_buffer")]
    pub outbound_buffer: usize,
    /// How often the replica renews its id claim in the registry, and looks there for ids
    /// to retire. Renewals also extend the tags the claim reserves. (A replica under its
    /// node's shared id renews none: the node's `[catalog.defaults]` setting applies.)
    #[serde(default = "d::id_lease_renew_ms")]
    pub id_lease_renew_ms: u64,
    /// Tag timestamps the id claim reserves ahead of the clock (OR kinds): an add past the
    /// reservation waits for the registry, so a larger block rides out longer registry
    /// outages; a retired id is reused above its holder's reservation.
    #[serde(default = "d::id_lease_block")]
    pub id_lease_block: u64,
    /// An id whose claim was not renewed for this long, and whose replica was not heard
    /// from, is retired by this replica, so that a new replica can take it (above every tag
    /// its holder may have issued). 0: never retire ids.
    #[serde(default = "d::retire_after_ms")]
    pub retire_after_ms: u64,
    /// Refuse received tags (OR kinds) of an id above what the id registry reserves for it
    /// (`tag_unreserved`): no replica issued them. Defence in depth where frames are not
    /// signed. Turn it off only to recover a cluster whose registry bucket was lost while
    /// states still carry the tags of ids no longer recorded there.
    #[serde(default = "d::check_tag_reservations")]
    pub check_tag_reservations: bool,
    /// Cluster keys of authenticated envelopes: when set, every frame is signed
    /// (HMAC-SHA256) with the first key, and frames not signed by one of them are rejected
    /// (`unsigned`, `bad_signature`). Key material, not a path: never in a file of filters
    /// (the node fills it from `node.auth_key_file`), never serialized, never logged.
    #[serde(skip)]
    pub auth_keys: Option<AuthKeys>,
    /// The filter's incarnation in the filter catalog ([`crate::transport::CatalogEntry`]),
    /// set by the node for filters created at run time; 0 for the filters of a configuration
    /// file. Envelopes, replica id claims and the data directory carry it, so that nothing of
    /// a dropped filter reaches one created again under its name.
    #[serde(skip)]
    pub generation: u64,
    /// Record the replica's metrics in the node-wide series of filters without their own
    /// (`filter="_catalog"`): the node sets it for filters created at run time that
    /// `catalog.metrics_filters` does not name.
    #[serde(skip)]
    pub aggregate_metrics: bool,
    /// The filter was created a moment ago (the node sets it for a catalog filter created
    /// less than `catch_up_timeout_ms` before its replica starts): there is no state to catch
    /// up with, so the replica is ready, and serves its API, at once; the first updates of
    /// its peers reach it by replication.
    #[serde(skip)]
    pub new_incarnation: bool,
    /// A catalog filter of a node, which serves some of its subjects on subscriptions it
    /// shares among its catalog filters, where the replica makes none of its own: the NATS
    /// service protocol (`$SRV`), the request API's subject without an operation
    /// (`<prefix>.<filter>.api`), and, if the replica replicates under the node's id, its own
    /// API subjects (`<prefix>.<filter>.replica.<id>.api[.<op>]`).
    #[serde(skip)]
    pub catalog_hosted: bool,
    /// The node hands the replica the messages of its replication subject from one
    /// subscription it shares among its filters (`<prefix>.*.*`), where the replica makes
    /// none of its own: a subscription's buffer is ~6 KB, a quarter of what a small filter
    /// cost a node of 100,000.
    /// The node also hands it its transport's connection events (one receiver for all).
    /// Set by the node, which must then route the replica's messages to it: a replica of
    /// one's own with it set hears no replication and no connection event.
    #[doc(hidden)]
    #[serde(skip)]
    pub routed_replication: bool,
    /// The node takes the request API's operations of all its catalog filters on one queue
    /// subscription ([`crate::transport::Subjects::node_api`]) and routes them to the
    /// replica, which then makes no subscription of its own for them.
    #[doc(hidden)]
    #[serde(skip)]
    pub routed_api: bool,
    /// Files (name, bytes) a new data directory is made with, durable with its first
    /// snapshot in the same two sync rounds: the node's catalog entry of the filter.
    #[doc(hidden)]
    #[serde(skip)]
    pub data_dir_files: Vec<(String, Vec<u8>)>,
}

mod d {
    pub(super) fn prefix() -> String {
        "crpf".into()
    }
    pub(super) fn delta_interval_ms() -> u64 {
        2
    }
    pub(super) fn delta_max_updates() -> usize {
        8192
    }
    pub(super) fn anti_entropy_interval_ms() -> u64 {
        5_000
    }
    pub(super) fn min_push_interval_ms() -> u64 {
        1_000
    }
    pub(super) fn catch_up_timeout_ms() -> u64 {
        2_000
    }
    pub(super) fn snapshot_interval_ms() -> u64 {
        30_000
    }
    pub(super) fn tag_reserve_block() -> u64 {
        4_096
    }
    pub(super) fn max_message_bytes() -> usize {
        8 << 20
    }
    pub(super) fn max_state_bytes() -> u64 {
        256 << 20
    }
    pub(super) fn chunk_bytes() -> usize {
        512 << 10
    }
    /// RedisBloom takes items of any size; 1 MiB is NATS's default `max_payload`, which bounds
    /// an item sent over the request API anyway (RESP's `max_request_bytes` bounds its own).
    pub(super) fn max_item_bytes() -> usize {
        1 << 20
    }
    pub(super) fn max_batch_items() -> usize {
        crate::api::DEFAULT_MAX_BATCH_ITEMS
    }
    pub(super) fn inbound_buffer() -> usize {
        65_536
    }
    pub(super) fn inbound_max_bytes() -> u64 {
        256 << 20
    }
    pub(super) fn yes() -> bool {
        true
    }
    pub(super) fn metrics_interval_ms() -> u64 {
        1_000
    }
    pub(super) fn replicated_timeout_ms() -> u64 {
        5_000
    }
    pub(super) fn fsync_interval_ms() -> u64 {
        1_000
    }
    pub(super) fn max_peers() -> usize {
        256
    }
    pub(super) fn peer_expiry_ms() -> u64 {
        60_000
    }
    pub(super) fn outbound_buffer() -> usize {
        65_536
    }
    pub(super) fn id_lease_renew_ms() -> u64 {
        10_000
    }
    pub(super) fn id_lease_block() -> u64 {
        1 << 20
    }
    pub(super) fn check_tag_reservations() -> bool {
        true
    }
    pub(super) fn retire_after_ms() -> u64 {
        3_600_000
    }
}

impl ReplicaConfig {
    /// Defaults for a filter named `name` of the given spec.
    pub fn new(name: impl Into<String>, filter: FilterSpec) -> Self {
        ReplicaConfig {
            name: name.into(),
            filter,
            prefix: d::prefix(),
            delta_interval_ms: d::delta_interval_ms(),
            delta_max_updates: d::delta_max_updates(),
            anti_entropy_interval_ms: d::anti_entropy_interval_ms(),
            min_push_interval_ms: d::min_push_interval_ms(),
            full_state_only: false,
            catch_up_timeout_ms: d::catch_up_timeout_ms(),
            data_dir: None,
            snapshot_interval_ms: d::snapshot_interval_ms(),
            tag_reserve_block: d::tag_reserve_block(),
            max_message_bytes: d::max_message_bytes(),
            max_state_bytes: d::max_state_bytes(),
            chunk_bytes: d::chunk_bytes(),
            max_item_bytes: d::max_item_bytes(),
            max_batch_items: d::max_batch_items(),
            inbound_buffer: d::inbound_buffer(),
            inbound_max_bytes: d::inbound_max_bytes(),
            serve_api: true,
            metrics_interval_ms: d::metrics_interval_ms(),
            ack: None,
            replicated_peers: None,
            replicated_timeout_ms: d::replicated_timeout_ms(),
            fsync_interval_ms: d::fsync_interval_ms(),
            max_peers: d::max_peers(),
            peer_expiry_ms: d::peer_expiry_ms(),
            outbound_buffer: d::outbound_buffer(),
            id_lease_renew_ms: d::id_lease_renew_ms(),
            id_lease_block: d::id_lease_block(),
            retire_after_ms: d::retire_after_ms(),
            check_tag_reservations: d::check_tag_reservations(),
            auth_keys: None,
            generation: 0,
            aggregate_metrics: false,
            new_incarnation: false,
            data_dir_files: Vec::new(),
            catalog_hosted: false,
            routed_api: false,
            routed_replication: false,
        }
    }

    /// The name the filter's replica id claims go under in the registry: the filter's name,
    /// and `<name>.g<generation>` for an incarnation created at run time (a new incarnation
    /// starts with no claims).
    pub fn registry_name(&self) -> String {
        if self.generation == 0 {
            self.name.clone()
        } else {
            format!("{}.g{}", self.name, self.generation)
        }
    }

    /// Defaults for a filter of `kind` sized for `capacity` elements at `fpr`.
    pub fn for_kind(name: impl Into<String>, kind: FilterKind, capacity: u64, fpr: f64) -> Self {
        Self::new(name, FilterSpec::new(kind, capacity, fpr))
    }

    /// With authenticated envelopes under these keys (see [`ReplicaConfig::auth_keys`]).
    pub fn with_auth_keys(mut self, keys: AuthKeys) -> Self {
        self.auth_keys = Some(keys);
        self
    }

    /// Short intervals for tests and demos on one machine. The delta interval stays at 10 ms,
    /// above the 2 ms default: tests that add fast get fewer, larger deltas.
    pub fn fast(mut self) -> Self {
        self.delta_interval_ms = 10;
        self.anti_entropy_interval_ms = 300;
        self.min_push_interval_ms = 100;
        self.catch_up_timeout_ms = 300;
        self.snapshot_interval_ms = 500;
        self.metrics_interval_ms = 200;
        self.peer_expiry_ms = 5_000;
        self.id_lease_renew_ms = 500;
        self
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        // A subject name of any key (catalog filters), or a token (`_node`, configured ones).
        if !is_token(&self.name) && !crate::names::is_subject_name(&self.name) {
            return Err(format!(
                "filter name `{}` must be one subject token ([A-Za-z0-9_-], 1 to 64 bytes) or a key's subject name (crpf::names)",
                self.name
            ));
        }
        if self.prefix.is_empty() || !self.prefix.split('.').all(is_token) {
            return Err(format!(
                "prefix `{}` must be dot-separated tokens",
                self.prefix
            ));
        }
        if self.filter.expiry.is_some() && self.filter.kind != FilterKind::ExpiringBloom {
            return Err(format!(
                "filter.expiry is for expiring_bloom only, not {}",
                self.filter.kind
            ));
        }
        // Fields a kind does not read are refused rather than ignored: a filter made with
        // one would not be what its spec says.
        if self.filter.shape.is_some()
            && !matches!(self.filter.kind, FilterKind::GoBloom | FilterKind::TopK)
        {
            return Err(format!(
                "filter.shape is for go_bloom only, or top_k, not {}",
                self.filter.kind
            ));
        }
        if self.filter.first_writer.is_some() && !self.filter.kind.per_writer() {
            return Err(format!(
                "filter.first_writer is for the per-writer kinds (writer_sc_*) only, not {}",
                self.filter.kind
            ));
        }
        for (name, v) in [
            ("delta_interval_ms", self.delta_interval_ms),
            ("anti_entropy_interval_ms", self.anti_entropy_interval_ms),
            ("snapshot_interval_ms", self.snapshot_interval_ms),
            ("metrics_interval_ms", self.metrics_interval_ms),
            ("tag_reserve_block", self.tag_reserve_block),
            ("delta_max_updates", self.delta_max_updates as u64),
            ("chunk_bytes", self.chunk_bytes as u64),
            ("max_item_bytes", self.max_item_bytes as u64),
            ("max_batch_items", self.max_batch_items as u64),
            ("inbound_buffer", self.inbound_buffer as u64),
            ("max_peers", self.max_peers as u64),
            ("outbound_buffer", self.outbound_buffer as u64),
            ("id_lease_renew_ms", self.id_lease_renew_ms),
            ("id_lease_block", self.id_lease_block),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.inbound_max_bytes < self.max_message_bytes as u64 {
            return Err("inbound_max_bytes must be at least max_message_bytes".into());
        }
        if let Some(level) = self.ack
            && level.needs_log()
            && self.data_dir.is_none()
        {
            return Err(format!("ack = \"{level}\" needs a data_dir"));
        }
        if let Some(level) = self.ack
            && level.needs_log()
            && self.full_state_only
        {
            return Err(format!(
                "ack = \"{level}\" needs a log of deltas, which full_state_only does not keep"
            ));
        }
        if !(1..=MAX_FSYNC_INTERVAL_MS).contains(&self.fsync_interval_ms) {
            return Err(format!(
                "fsync_interval_ms must be 1 to {MAX_FSYNC_INTERVAL_MS} (it bounds what a crash of the machine loses at `logged`)"
            ));
        }
        if self.replicated_timeout_ms == 0 {
            return Err("replicated_timeout_ms must be positive".into());
        }
        if self.peer_expiry_ms < self.anti_entropy_interval_ms * 3 {
            return Err("peer_expiry_ms must be at least three anti_entropy_interval_ms".into());
        }
        // A holder gets at least three chances to renew before its id can be retired.
        if self.retire_after_ms != 0 && self.retire_after_ms < self.id_lease_renew_ms * 3 {
            return Err("retire_after_ms must be 0 or at least three id_lease_renew_ms".into());
        }
        if self.max_message_bytes < 1024 {
            return Err("max_message_bytes must be at least 1024".into());
        }
        Ok(())
    }

    /// The acknowledgement level of updates that do not ask for one.
    pub fn default_ack(&self) -> AckLevel {
        self.ack.unwrap_or(if self.data_dir.is_some() {
            AckLevel::Durable
        } else {
            AckLevel::Local
        })
    }

    pub(crate) fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kind::BloomShape;

    #[test]
    fn fields_a_kind_does_not_read_are_refused() {
        let cfg = |spec: FilterSpec| ReplicaConfig::new("f", spec);
        let shaped = |kind| FilterSpec {
            shape: Some(Box::new(BloomShape {
                bits: 8192,
                hashes: 7,
            })),
            ..FilterSpec::new(kind, 1000, 0.01)
        };
        assert!(cfg(shaped(FilterKind::GoBloom)).validate().is_ok());
        let e = cfg(shaped(FilterKind::GBloom)).validate().unwrap_err();
        assert!(e.contains("go_bloom only"), "{e}");
        let first = |kind| FilterSpec {
            first_writer: std::num::NonZeroU16::new(1),
            ..FilterSpec::new(kind, 1000, 0.01)
        };
        assert!(cfg(first(FilterKind::WriterScOrCuckoo)).validate().is_ok());
        let e = cfg(first(FilterKind::ScGBloom)).validate().unwrap_err();
        assert!(e.contains("per-writer kinds"), "{e}");
    }
}
