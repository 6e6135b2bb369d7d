//! The replica's telemetry (docs/DESIGN.md section 6): metrics recorded through the `metrics`
//! facade with labels `filter` and `replica`, and the counts `stats` reads (the facade has no
//! read side), both updated by one `Telemetry` method per event. The exporter is the node's
//! business; install its recorder before starting replicas, since handles taken before that
//! record nowhere.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use metrics::{Counter, Gauge, Histogram, Label, Unit};

pub(crate) use crate::transport::Channel;

/// The `filter` label of the series that filters created at run time without series of
/// their own add up in (see `catalog.metrics_filters`).
pub const AGGREGATE_FILTER: &str = "_catalog";
/// Estimated false positive rate of the current state.
pub const ESTIMATED_FPR: &str = "crpf_estimated_fpr";
/// Estimated elements / capacity.
pub const LOAD_FACTOR: &str = "crpf_load_factor";
/// Gauge: the configured target FPR (the compounded bound for scalable filters).
pub const TARGET_FPR: &str = "crpf_target_fpr";
/// Estimated number of elements.
pub const CARDINALITY: &str = "crpf_cardinality";
/// Design capacity or slots.
pub const CAPACITY: &str = "crpf_capacity";
/// Size of the encoded full state at its last encoding.
pub const STATE_BYTES: &str = "crpf_state_bytes";
/// Local updates not yet published as a delta.
pub const PENDING_DELTA: &str = "crpf_pending_delta_updates";
/// Merges of received deltas and states, by `source` and `outcome`.
pub const MERGES: &str = "crpf_merges_total";
/// Duration of merges, by `source`.
pub const MERGE_DURATION: &str = "crpf_merge_duration_seconds";
/// Local operations, by `op` and `outcome`.
pub const OPERATIONS: &str = "crpf_operations_total";
/// Messages, by `direction` and `channel`.
pub const MESSAGES: &str = "crpf_messages_total";
/// Payload bytes, by `direction` and `channel`.
pub const BYTES: &str = "crpf_bytes_total";
/// Rejected messages, by `reason`.
pub const REJECTS: &str = "crpf_rejects_total";
/// Signed replication frames taken without verifying them (a node without the cluster key).
pub const UNVERIFIED: &str = "crpf_unverified_frames_total";
/// Messages dropped because the replica's inbound buffer was full.
pub const DROPPED: &str = "crpf_dropped_messages_total";
/// Messages from peers that never arrived (gaps in their sequence numbers).
pub const SEQUENCE_GAPS: &str = "crpf_sequence_gaps_total";
/// Slow-consumer events of the connection (messages dropped client-side).
pub const SLOW_CONSUMER: &str = "crpf_slow_consumer_events_total";
/// 1 while the transport is connected.
pub const CONNECTED: &str = "crpf_nats_connected";
/// Disconnections of the transport.
pub const DISCONNECTS: &str = "crpf_nats_disconnects_total";
/// Seconds since the last message of each peer (label `peer`).
pub const PEER_STALENESS: &str = "crpf_peer_staleness_seconds";
/// Peers heard from recently.
pub const PEERS: &str = "crpf_peers";
/// 1 once the replica caught up after its start.
pub const READY: &str = "crpf_ready";
/// Full-state pushes (anti-entropy).
pub const STATE_PUSHES: &str = "crpf_state_pushes_total";
/// Incoming full-state transfers, by `outcome`.
pub const STATE_TRANSFERS: &str = "crpf_state_transfers_total";
/// Snapshots written to the data directory, by `outcome`.
pub const SNAPSHOTS: &str = "crpf_snapshots_total";
/// Durable reservations of tag timestamps.
pub const TAG_RESERVATIONS: &str = "crpf_tag_reservations_total";
/// Publishes the transport refused.
pub const PUBLISH_ERRORS: &str = "crpf_publish_errors_total";
/// Messages dropped because the outbound queue was full, by `channel`.
pub const OUTBOUND_DROPPED: &str = "crpf_outbound_dropped_total";
/// Request API errors (bad requests, refused operations), by `reason`; apart from
/// [`REJECTS`], which counts replication messages.
pub const API_ERRORS: &str = "crpf_api_errors_total";
/// Write-ahead log records appended and fsynced (commits with `durable` or `replicated`
/// updates).
pub const WAL_APPENDS: &str = "crpf_wal_appends_total";
/// Write-ahead log records written without waiting for an fsync (commits of `logged` and
/// `local` updates), synced by the periodic sync.
pub const WAL_LOGGED: &str = "crpf_wal_logged_appends_total";
/// Write-ahead log fsyncs (one per group commit with durable updates, one per periodic sync).
pub const WAL_FSYNCS: &str = "crpf_wal_fsyncs_total";
/// Write-ahead log bytes written.
pub const WAL_BYTES: &str = "crpf_wal_bytes_total";
/// Write-ahead log appends and removals that failed.
pub const WAL_FAILURES: &str = "crpf_wal_failures_total";
/// 1 while the write-ahead log takes durable updates, 0 from a failed append (a full disk)
/// until a new writer replaced the failed one (replicas with a data directory).
pub const DURABLE_OK: &str = "crpf_durable_ok";
/// Live peers whose last digest equals this replica's state digest.
pub const CONVERGED_PEERS: &str = "crpf_converged_peers";
/// Gauge (`count_min_sketch`): increments in all, by every replica (`CMS.INFO`'s count).
pub const CMS_COUNT: &str = "crpf_cms_count";
/// Gauge (`count_min_sketch`): counters per row.
pub const CMS_WIDTH: &str = "crpf_cms_width";
/// Gauge (`count_min_sketch`): rows.
pub const CMS_DEPTH: &str = "crpf_cms_depth";
/// Gauge (`count_min_sketch`): replicas whose counters the state holds (each takes
/// `4 * width * depth` bytes).
pub const CMS_WRITERS: &str = "crpf_cms_writers";
/// Gauge (`top_k`): items it lists at most (`TOPK.INFO`'s k).
pub const TOPK_K: &str = "crpf_topk_k";
/// Gauge (`top_k`): items listed now (at most k).
pub const TOPK_LISTED: &str = "crpf_topk_listed";
/// Gauge (`top_k`): replicas whose heaps the state holds (each takes its counters and k
/// slots).
pub const TOPK_WRITERS: &str = "crpf_topk_writers";
/// Heavy-hitter churn (`top_k`): items this replica's adds pushed out of its list.
pub const TOPK_EXPELLED: &str = "crpf_topk_expelled_total";
/// Gauge (`t_digest`): its compression (`TDIGEST.INFO`'s).
pub const TDIGEST_COMPRESSION: &str = "crpf_tdigest_compression";
/// Gauge (`t_digest`): centroids the state holds, every writer's segments (16 bytes each).
pub const TDIGEST_CENTROIDS: &str = "crpf_tdigest_centroids";
/// Gauge (`t_digest`): values reads see (`TDIGEST.INFO`'s observations).
pub const TDIGEST_OBSERVATIONS: &str = "crpf_tdigest_observations";
/// Gauge (`t_digest`): replicas whose parts the state holds.
pub const TDIGEST_WRITERS: &str = "crpf_tdigest_writers";
/// Ids of the filter in the replica id registry, by `state` (`live`, `retired`).
pub const REPLICA_IDS: &str = "crpf_replica_ids";
/// Ids this replica retired (their claims went unrenewed for `retire_after_ms`).
pub const RETIREMENTS: &str = "crpf_replica_retirements_total";
/// `expiring_bloom` states repaired because their clock was further ahead of the replica's
/// than the skew bound (its wall clock ran ahead, and was corrected).
pub const CLOCK_REWINDS: &str = "crpf_clock_rewinds_total";
/// Frames held for a fresh look at the id registry (their tags were above the reservations
/// last seen), and what became of them: `held`, then `merged` or `refused`.
pub const HELD_FRAMES: &str = "crpf_registry_held_frames_total";
/// Renewals of the id claim, and looks at the registry, that failed.
pub const ID_LEASE_FAILURES: &str = "crpf_id_lease_failures_total";
/// 1 once this replica's own id was retired under it (it adds no more; restart it).
pub const ID_LOST: &str = "crpf_replica_id_lost";

/// Buckets for [`MERGE_DURATION`] (seconds), for the exporter's `set_buckets`.
pub const MERGE_DURATION_BUCKETS: &[f64] = &[
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0,
];

/// Describes every metric once (units and help texts).
pub fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use metrics::{describe_counter as c, describe_gauge as g, describe_histogram as h};
        g!(
            ESTIMATED_FPR,
            "Estimated false positive rate of the replica's state"
        );
        g!(LOAD_FACTOR, "Estimated elements divided by capacity");
        g!(
            TARGET_FPR,
            "Configured target false positive rate (for scalable filters, the compounded bound)"
        );
        g!(CARDINALITY, "Estimated number of elements");
        g!(
            CAPACITY,
            "Elements (Bloom) or slots (cuckoo) the filter is sized for"
        );
        g!(STATE_BYTES, Unit::Bytes, "Size of the encoded full state");
        g!(PENDING_DELTA, "Local updates not yet published as a delta");
        c!(
            MERGES,
            "Merges of received deltas and states, by source and outcome"
        );
        h!(
            MERGE_DURATION,
            Unit::Seconds,
            "Duration of merges, by source"
        );
        c!(OPERATIONS, "Local operations, by op and outcome");
        c!(
            MESSAGES,
            "Replication and API messages, by direction and channel"
        );
        c!(
            BYTES,
            Unit::Bytes,
            "Payload bytes, by direction and channel"
        );
        c!(REJECTS, "Rejected messages, by reason");
        c!(
            UNVERIFIED,
            "Signed replication frames taken without verifying them (this node has no cluster key)"
        );
        c!(
            DROPPED,
            "Messages dropped because the inbound buffer was full"
        );
        c!(
            SEQUENCE_GAPS,
            "Messages of peers that never arrived (sequence gaps)"
        );
        c!(
            SLOW_CONSUMER,
            "Slow-consumer events: messages dropped client-side"
        );
        g!(CONNECTED, "1 while the transport is connected");
        c!(DISCONNECTS, "Disconnections of the transport");
        g!(
            PEER_STALENESS,
            Unit::Seconds,
            "Seconds since the last message of a peer"
        );
        g!(
            PEERS,
            "Peers heard from within three anti-entropy intervals"
        );
        g!(READY, "1 once the replica caught up after its start");
        g!(
            CMS_COUNT,
            "Count-min sketch: increments in all, by every replica"
        );
        g!(CMS_WIDTH, "Count-min sketch: counters per row");
        g!(CMS_DEPTH, "Count-min sketch: rows");
        g!(
            CMS_WRITERS,
            "Count-min sketch: replicas whose counters the state holds"
        );
        g!(TOPK_K, "Top-k: items it lists at most");
        g!(TOPK_LISTED, "Top-k: items listed now");
        g!(TOPK_WRITERS, "Top-k: replicas whose heaps the state holds");
        c!(
            TOPK_EXPELLED,
            "Top-k: items this replica's adds pushed out of its list (heavy-hitter churn)"
        );
        g!(TDIGEST_COMPRESSION, "t-digest: its compression");
        g!(
            TDIGEST_CENTROIDS,
            "t-digest: centroids held, every writer's segments"
        );
        g!(TDIGEST_OBSERVATIONS, "t-digest: values reads see");
        g!(TDIGEST_WRITERS, "t-digest: replicas whose parts the state holds");
        c!(STATE_PUSHES, "Full-state pushes (anti-entropy)");
        c!(STATE_TRANSFERS, "Incoming full-state transfers, by outcome");
        c!(
            SNAPSHOTS,
            "Snapshots written to the data directory, by outcome"
        );
        c!(TAG_RESERVATIONS, "Durable reservations of tag timestamps");
        c!(PUBLISH_ERRORS, "Publishes the transport refused");
        c!(
            OUTBOUND_DROPPED,
            "Messages dropped because the outbound queue was full, by channel"
        );
        c!(API_ERRORS, "Request API errors, by reason");
        c!(WAL_APPENDS, "Write-ahead log records appended and fsynced");
        c!(
            WAL_LOGGED,
            "Write-ahead log records written without waiting for an fsync"
        );
        c!(
            WAL_FSYNCS,
            "Write-ahead log fsyncs, one per durable group commit or periodic sync"
        );
        c!(WAL_BYTES, Unit::Bytes, "Write-ahead log bytes written");
        c!(
            WAL_FAILURES,
            "Write-ahead log appends and removals that failed"
        );
        g!(
            DURABLE_OK,
            "1 while the write-ahead log takes durable updates, 0 after a failed append until a new writer replaced it"
        );
        g!(
            CONVERGED_PEERS,
            "Live peers whose last digest equals this replica's state digest"
        );
        g!(
            REPLICA_IDS,
            "Ids of the filter in the replica id registry, by state (live, retired)"
        );
        c!(RETIREMENTS, "Replica ids this replica retired");
        c!(
            CLOCK_REWINDS,
            "expiring_bloom states whose clock, ahead of the replica's by more than the skew, was set back"
        );
        c!(
            HELD_FRAMES,
            "Frames held for a fresh look at the id registry, by outcome (held, merged, refused)"
        );
        c!(
            ID_LEASE_FAILURES,
            "Failed renewals of the id claim and looks at the registry"
        );
        g!(
            ID_LOST,
            "1 once this replica's id was retired under it (restart it)"
        );
    });
}

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    In,
    Out,
}

/// A local operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Add,
    Remove,
    Contains,
}

/// What a merge joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeSource {
    Delta,
    State,
    Local,
}

impl Direction {
    const ALL: [Direction; 2] = [Direction::In, Direction::Out];
    pub(crate) fn label(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

impl OpKind {
    const ALL: [OpKind; 3] = [OpKind::Add, OpKind::Remove, OpKind::Contains];
    pub(crate) fn label(self) -> &'static str {
        match self {
            OpKind::Add => "add",
            OpKind::Remove => "remove",
            OpKind::Contains => "contains",
        }
    }
}

impl MergeSource {
    const ALL: [MergeSource; 3] = [MergeSource::Delta, MergeSource::State, MergeSource::Local];
    pub(crate) fn label(self) -> &'static str {
        match self {
            MergeSource::Delta => "delta",
            MergeSource::State => "state",
            MergeSource::Local => "local",
        }
    }
}

/// The channels traffic is counted on, in the order of the handles.
const CHANNELS: [Channel; 3] = [Channel::Delta, Channel::State, Channel::Api];

/// The label of a channel.
pub(crate) fn channel_label(c: Channel) -> &'static str {
    match c {
        Channel::Delta => "delta",
        Channel::State => "state",
        Channel::Api => "api",
    }
}

fn channel_index(c: Channel) -> usize {
    match c {
        Channel::Delta => 0,
        Channel::State => 1,
        Channel::Api => 2,
    }
}

/// Handles of the metrics recorded per message or operation, registered once: looking a
/// handle up by its labels on every request cost a third of the actor's time.
struct Hot {
    /// `[direction][channel]`: (messages, bytes).
    traffic: Vec<Vec<(Counter, Counter)>>,
    /// `[op][ok, error]`.
    ops: Vec<[Counter; 2]>,
    /// `[source][ok, rejected]`, and the duration histogram per source.
    merges: Vec<([Counter; 2], Histogram)>,
}

/// The counters and histograms of one set of labels (a replica's, or the node-wide ones).
struct Handles {
    hot: Arc<Hot>,
    sequence_gaps: Counter,
    state_pushes: Counter,
    disconnects: Counter,
    dropped: Counter,
}

impl Handles {
    fn new(labels: &[Label]) -> Self {
        let with = |extra: &[(&'static str, &str)]| {
            let mut l = labels.to_vec();
            l.extend(extra.iter().map(|(k, v)| Label::new(*k, v.to_string())));
            l
        };
        let hot = Hot {
            traffic: Direction::ALL
                .iter()
                .map(|d| {
                    CHANNELS
                        .iter()
                        .map(|c| {
                            let l =
                                with(&[("direction", d.label()), ("channel", channel_label(*c))]);
                            (
                                metrics::counter!(MESSAGES, l.clone()),
                                metrics::counter!(BYTES, l),
                            )
                        })
                        .collect()
                })
                .collect(),
            ops: OpKind::ALL
                .iter()
                .map(|op| {
                    ["ok", "error"].map(|o| {
                        metrics::counter!(OPERATIONS, with(&[("op", op.label()), ("outcome", o)]))
                    })
                })
                .collect(),
            merges: MergeSource::ALL
                .iter()
                .map(|s| {
                    let counters = ["ok", "rejected"].map(|o| {
                        metrics::counter!(MERGES, with(&[("source", s.label()), ("outcome", o)]))
                    });
                    let h = metrics::histogram!(MERGE_DURATION, with(&[("source", s.label())]));
                    (counters, h)
                })
                .collect(),
        };
        let l = labels.to_vec();
        Handles {
            hot: Arc::new(hot),
            sequence_gaps: metrics::counter!(SEQUENCE_GAPS, l.clone()),
            state_pushes: metrics::counter!(STATE_PUSHES, l.clone()),
            disconnects: metrics::counter!(DISCONNECTS, l.clone()),
            dropped: metrics::counter!(DROPPED, l),
        }
    }
}

/// Counts `stats` reports, kept beside the metrics (the facade has no read side).
#[derive(Default)]
pub(crate) struct Counts {
    pub rejects: Mutex<BTreeMap<&'static str, u64>>,
    /// Request API errors by reason (apart from the wire's `rejects`).
    pub api_errors: Mutex<BTreeMap<&'static str, u64>>,
    pub dropped: AtomicU64,
    pub sequence_gaps: AtomicU64,
    pub deltas_sent: AtomicU64,
    pub deltas_merged: AtomicU64,
    pub state_pushes: AtomicU64,
    pub states_merged: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub delta_bytes_sent: AtomicU64,
    pub state_bytes_sent: AtomicU64,
    /// Own replication messages the transport delivered back (and that were dropped).
    pub echoes: AtomicU64,
    /// Digests of the whole state computed.
    pub state_digests: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Size of the encoded state at its last encoding.
    pub state_bytes: AtomicU64,
    pub disconnects: AtomicU64,
    pub reconnects: AtomicU64,
    /// Messages dropped because the outbound queue was full.
    pub outbound_dropped: AtomicU64,
}

impl Counts {
    fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn bump_reason(map: &Mutex<BTreeMap<&'static str, u64>>, reason: &'static str, n: u64) {
        *map.lock().expect("counts lock").entry(reason).or_default() += n;
    }

    /// A count by its field, for `stats`.
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Counts by reason, for `stats`.
    pub(crate) fn by_reason(map: &Mutex<BTreeMap<&'static str, u64>>) -> BTreeMap<String, u64> {
        map.lock()
            .expect("counts lock")
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }
}

/// One replica's telemetry: its metric handles (with its labels) and its [`Counts`], updated
/// together by one method per event. Cheap to clone, and two pointers wide: a replica keeps
/// one in its actor and one in its shared part, and the filters recording in the node-wide
/// series share one [`Series`] (at 100,000 filters, 290 bytes inline twice and a labels
/// vector each were 0.6 KB per filter).
#[derive(Clone)]
pub(crate) struct Telemetry {
    series: Arc<Series>,
    counts: Arc<Counts>,
}

/// The metric handles of one replica, or of every filter recording in the node-wide series.
pub(crate) struct Series {
    /// Series shared with other filters ([`Telemetry::new`]).
    aggregate: bool,
    labels: Vec<Label>,
    hot: Arc<Hot>,
    pub fpr: Gauge,
    pub load: Gauge,
    pub cardinality: Gauge,
    pub capacity: Gauge,
    pub state_bytes: Gauge,
    pub pending: Gauge,
    pub connected: Gauge,
    pub ready: Gauge,
    pub peers: Gauge,
    pub converged: Gauge,
    pub target_fpr: Gauge,
    /// A count-min sketch's gauges ([`CMS_COUNT`], [`CMS_WIDTH`], [`CMS_DEPTH`],
    /// [`CMS_WRITERS`]): made at the first figures of a sketch, so that no other kind exports
    /// them.
    sketch: std::sync::OnceLock<[Gauge; 4]>,
    /// A top-k's gauges ([`TOPK_K`], [`TOPK_LISTED`], [`TOPK_WRITERS`]) and churn counter
    /// ([`TOPK_EXPELLED`]), made at a top-k's first figures or expulsion.
    topk: std::sync::OnceLock<[Gauge; 3]>,
    topk_churn: std::sync::OnceLock<Counter>,
    /// A t-digest's gauges ([`TDIGEST_COMPRESSION`], [`TDIGEST_CENTROIDS`],
    /// [`TDIGEST_OBSERVATIONS`], [`TDIGEST_WRITERS`]), made at a t-digest's first figures.
    tdigest: std::sync::OnceLock<[Gauge; 4]>,
    dropped: Counter,
    sequence_gaps: Counter,
    state_pushes: Counter,
    disconnects: Counter,
}

impl std::ops::Deref for Telemetry {
    type Target = Series;

    fn deref(&self) -> &Series {
        &self.series
    }
}

impl Series {
    fn new(filter: &str, replica: u16, target_fpr: f64, aggregate: bool) -> Self {
        let labels = if aggregate {
            vec![
                Label::new("filter", AGGREGATE_FILTER),
                Label::new("replica", ""),
            ]
        } else {
            vec![
                Label::new("filter", filter.to_string()),
                Label::new("replica", replica.to_string()),
            ]
        };
        let l = labels.clone();
        let target = if aggregate {
            Gauge::noop()
        } else {
            metrics::gauge!(TARGET_FPR, l.clone())
        };
        target.set(target_fpr);
        let handles = Handles::new(&labels);
        let gauge = |name: &'static str| {
            if aggregate {
                Gauge::noop()
            } else {
                metrics::gauge!(name, l.clone())
            }
        };
        Series {
            aggregate,
            hot: handles.hot,
            sequence_gaps: handles.sequence_gaps,
            state_pushes: handles.state_pushes,
            disconnects: handles.disconnects,
            target_fpr: target,
            converged: gauge(CONVERGED_PEERS),
            fpr: gauge(ESTIMATED_FPR),
            load: gauge(LOAD_FACTOR),
            cardinality: gauge(CARDINALITY),
            capacity: gauge(CAPACITY),
            state_bytes: gauge(STATE_BYTES),
            pending: gauge(PENDING_DELTA),
            connected: gauge(CONNECTED),
            ready: gauge(READY),
            peers: gauge(PEERS),
            sketch: std::sync::OnceLock::new(),
            topk: std::sync::OnceLock::new(),
            topk_churn: std::sync::OnceLock::new(),
            tdigest: std::sync::OnceLock::new(),
            dropped: handles.dropped,
            labels,
        }
    }
}

impl Telemetry {
    /// The telemetry of one replica; with `aggregate`, its series are the node-wide ones of
    /// filters without their own (`filter="_catalog"`, no replica): counters and histograms
    /// add up across those filters, and gauges, which would only overwrite each other, are
    /// not recorded (`stats` still reads every figure).
    pub(crate) fn new(filter: &str, replica: u16, target_fpr: f64, aggregate: bool) -> Self {
        describe();
        // The node-wide series are the same handles for every filter that records in them:
        // made once (a node of 100,000 filters made 60 lookups in the registry, and kept
        // 1.8 KB of handles, for each). Made with the recorder installed then: the exporter
        // is installed before anything records (`node::exporter::install`).
        let series = if aggregate {
            static AGGREGATE: std::sync::OnceLock<Arc<Series>> = std::sync::OnceLock::new();
            AGGREGATE
                .get_or_init(|| Arc::new(Series::new(filter, replica, target_fpr, true)))
                .clone()
        } else {
            Arc::new(Series::new(filter, replica, target_fpr, false))
        };
        Telemetry {
            series,
            counts: Arc::default(),
        }
    }

    fn with(&self, extra: &[(&'static str, &str)]) -> Vec<Label> {
        let mut l = self.labels.clone();
        l.extend(extra.iter().map(|(k, v)| Label::new(*k, v.to_string())));
        l
    }

    pub(crate) fn counter(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Counter {
        metrics::counter!(name, self.with(extra))
    }

    pub(crate) fn gauge(&self, name: &'static str, extra: &[(&'static str, &str)]) -> Gauge {
        if self.aggregate {
            return Gauge::noop();
        }
        metrics::gauge!(name, self.with(extra))
    }

    /// The gauges of the kinds that have figures of their own (a count-min sketch's count,
    /// width, depth and writers), set with the others.
    pub(crate) fn kind_figures(&self, f: &crate::replica::AnyFilter) {
        if let crate::replica::AnyFilter::CountMinSketch(s) = f {
            let [count, width, depth, writers] = self.sketch.get_or_init(|| {
                [CMS_COUNT, CMS_WIDTH, CMS_DEPTH, CMS_WRITERS].map(|name| self.gauge(name, &[]))
            });
            count.set(s.total() as f64);
            width.set(f64::from(s.params().width));
            depth.set(f64::from(s.params().depth));
            writers.set(s.writers() as f64);
        }
        if let crate::replica::AnyFilter::TopK(t) = f {
            let [k, listed, writers] = self.topk.get_or_init(|| {
                [TOPK_K, TOPK_LISTED, TOPK_WRITERS].map(|name| self.gauge(name, &[]))
            });
            k.set(f64::from(t.params().k));
            listed.set(t.list().len() as f64);
            writers.set(t.writers() as f64);
        }
        if let crate::replica::AnyFilter::TDigest(t) = f {
            let [compression, centroids, observations, writers] = self.tdigest.get_or_init(|| {
                [
                    TDIGEST_COMPRESSION,
                    TDIGEST_CENTROIDS,
                    TDIGEST_OBSERVATIONS,
                    TDIGEST_WRITERS,
                ]
                .map(|name| self.gauge(name, &[]))
            });
            compression.set(f64::from(t.params().compression));
            centroids.set(t.centroids() as f64);
            observations.set(t.size() as f64);
            writers.set(t.writers() as f64);
        }
    }

    /// Counts `n` items a top-k's adds pushed out of its list.
    pub(crate) fn topk_churn(&self, n: u64) {
        if n > 0 {
            self.topk_churn
                .get_or_init(|| self.counter(TOPK_EXPELLED, &[]))
                .increment(n);
        }
    }

    /// What `stats` reads.
    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Counts a message and its bytes (replication bytes also in [`Counts`]).
    pub(crate) fn traffic(&self, direction: Direction, channel: Channel, bytes: usize) {
        let (messages, total) = &self.hot.traffic[direction as usize][channel_index(channel)];
        messages.increment(1);
        total.increment(bytes as u64);
        let (c, n) = (&self.counts, bytes as u64);
        match (direction, channel) {
            (_, Channel::Api) => {}
            (Direction::In, _) => Counts::bump(&c.bytes_received, n),
            (Direction::Out, Channel::Delta) => {
                Counts::bump(&c.bytes_sent, n);
                Counts::bump(&c.delta_bytes_sent, n);
            }
            (Direction::Out, Channel::State) => {
                Counts::bump(&c.bytes_sent, n);
                Counts::bump(&c.state_bytes_sent, n);
            }
        }
    }

    /// A signed replication frame taken without verifying it.
    pub(crate) fn unverified(&self) {
        self.counter(UNVERIFIED, &[]).increment(1);
    }

    /// A replication message rejected, for `reason`.
    pub(crate) fn reject(&self, reason: &'static str) {
        Counts::bump_reason(&self.counts.rejects, reason, 1);
        self.counter(REJECTS, &[("reason", reason)]).increment(1);
    }

    /// `n` request API errors for `reason`.
    pub(crate) fn api_errors(&self, reason: &'static str, n: u64) {
        Counts::bump_reason(&self.counts.api_errors, reason, n);
        self.counter(API_ERRORS, &[("reason", reason)]).increment(n);
    }

    /// `n` messages of a peer lost (a gap in its sequence numbers).
    pub(crate) fn sequence_gaps(&self, n: u64) {
        Counts::bump(&self.counts.sequence_gaps, n);
        self.sequence_gaps.increment(n);
    }

    /// A message dropped because the inbound buffer was full.
    pub(crate) fn inbound_dropped(&self) {
        Counts::bump(&self.counts.dropped, 1);
        self.dropped.increment(1);
    }

    /// A message dropped because the outbound queue was full.
    pub(crate) fn outbound_dropped(&self, channel: &'static str) {
        Counts::bump(&self.counts.outbound_dropped, 1);
        self.counter(OUTBOUND_DROPPED, &[("channel", channel)])
            .increment(1);
    }

    /// A publish the transport refused.
    pub(crate) fn publish_error(&self, channel: Channel) {
        self.counter(PUBLISH_ERRORS, &[("channel", channel_label(channel))])
            .increment(1);
    }

    /// An own message the transport delivered back.
    pub(crate) fn echo(&self) {
        Counts::bump(&self.counts.echoes, 1);
    }

    /// A digest of the whole state computed.
    pub(crate) fn state_digest(&self) {
        Counts::bump(&self.counts.state_digests, 1);
    }

    /// A delta published.
    pub(crate) fn delta_sent(&self) {
        Counts::bump(&self.counts.deltas_sent, 1);
    }

    /// A peer's delta merged.
    pub(crate) fn delta_merged(&self) {
        Counts::bump(&self.counts.deltas_merged, 1);
    }

    /// A peer's full state merged.
    pub(crate) fn state_merged(&self) {
        Counts::bump(&self.counts.states_merged, 1);
    }

    /// The full state was encoded (`bytes` long) for a push.
    pub(crate) fn state_pushed(&self, bytes: usize) {
        self.state_encoded(bytes);
        Counts::bump(&self.counts.state_pushes, 1);
        self.state_pushes.increment(1);
    }

    /// The full state was encoded, `bytes` long (a push or a snapshot).
    pub(crate) fn state_encoded(&self, bytes: usize) {
        self.counts
            .state_bytes
            .store(bytes as u64, Ordering::Relaxed);
    }

    /// Size of the state at its last encoding.
    pub(crate) fn last_state_bytes(&self) -> u64 {
        Counts::get(&self.counts.state_bytes)
    }

    /// The transport connected (again).
    pub(crate) fn connected(&self) {
        self.connected.set(1.0);
        Counts::bump(&self.counts.reconnects, 1);
    }

    /// The transport lost its connection.
    pub(crate) fn disconnected(&self) {
        self.connected.set(0.0);
        Counts::bump(&self.counts.disconnects, 1);
        self.disconnects.increment(1);
    }

    /// Counts a batch's item operations (one metric update per batch, not per item).
    pub(crate) fn count_ops(&self, op: OpKind, ok: u64, failed: u64) {
        let [ok_counter, error_counter] = &self.hot.ops[op as usize];
        ok_counter.increment(ok);
        error_counter.increment(failed);
    }

    /// Counts a local operation.
    pub(crate) fn op(&self, op: OpKind, ok: bool) {
        self.hot.ops[op as usize][usize::from(!ok)].increment(1);
    }

    /// Counts a merge and records its duration.
    pub(crate) fn merge(&self, source: MergeSource, ok: bool, seconds: f64) {
        let (counters, duration) = &self.hot.merges[source as usize];
        counters[usize::from(!ok)].increment(1);
        duration.record(seconds);
    }
}
