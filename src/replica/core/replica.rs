//! [`ReplicaCore`]: everything a replica decides with, in one owned value, and the decisions
//! that combine its parts (at rest, idle enough to park, ready, what a timer's firing does,
//! the next sequence number). The shell (the actor) holds one and carries out what it says;
//! nothing here touches a lock, a channel, a socket or the clock (`now` is passed in), so a
//! unit test builds one and steps it.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{
    CommitPipeline, DigestCache, Lease, PeerClocks, Pushes, RegistryView, Schedule, Snapshotter,
};
use crate::ReplicaId;
use crate::replica::anti_entropy::{AntiEntropy, Timing};
use crate::replica::config::ReplicaConfig;
use crate::replica::reassembly::Reassembly;
use crate::wire::FilterKind;

/// Filters whose initial state is larger stay awake: a park and a resume copy the state, and
/// an actor's few KB are little beside it.
pub(crate) const PARK_MAX_STATE_BYTES: u64 = 256 << 10;

/// What a replica is, fixed at its start, that its decisions depend on.
#[derive(Debug, Clone)]
pub(crate) struct Traits {
    /// Its figures go to the node-wide series only (`aggregate_metrics`).
    pub aggregate_metrics: bool,
    /// Its state moves with time (`expiring_bloom`): never at rest.
    pub moves_with_time: bool,
    /// Its state is small enough to park ([`PARK_MAX_STATE_BYTES`]).
    pub small: bool,
    /// It serves the request API (`serve_api`): ready once the API is subscribed.
    pub serve_api: bool,
    /// It issues its tags under its node's id (the node renews that id): the id outlives
    /// the replica's actor, which may then park.
    pub node_id: bool,
    /// `anti_entropy_interval_ms`, `metrics_interval_ms`, `peer_expiry_ms`.
    pub anti_entropy_interval: Duration,
    pub metrics_interval: Duration,
    pub peer_expiry: Duration,
    /// What bounds transfers coming in: `max_state_bytes`, and whether the kind merges a
    /// state piece by piece.
    pub max_state_bytes: u64,
    pub merges_pieces: bool,
    /// Its uuid: frames addressed to it.
    pub me: Uuid,
    /// `max_peers`: a frame from one more is refused.
    pub max_peers: usize,
    /// `delta_interval_ms`: how far apart flushes and published deltas go.
    pub delta_interval: Duration,
    /// `full_state_only`: the naive protocol (no deltas, a push after every change).
    pub full_state_only: bool,
    /// `replicated_timeout_ms` and `replicated_peers`: how long updates wait for their
    /// peers, and how many they wait for.
    pub replicated_timeout: Duration,
    pub replicated_peers: Option<usize>,
    /// Its replica id.
    pub id: ReplicaId,
    /// `id_lease_block`: the tags a renewal reserves ahead of the clock.
    pub lease_block: u64,
    /// Its kind issues tags (the lease reserves them).
    pub tagged: bool,
    /// `retire_after_ms`, and whether its kind retires ids gone silent (it reuses them).
    pub retire_after: Duration,
    pub reuses_ids: bool,
}

impl Traits {
    /// Whether a replica configured as `cfg` parks at all once idle (whatever its peers and
    /// id): under the node-wide series, not moving with time, small (see [`Self::of`]).
    pub(crate) fn parks(cfg: &ReplicaConfig) -> bool {
        let t = Self::of(cfg, cfg.filter.kind, true, (Uuid::nil(), 0));
        t.aggregate_metrics && !t.moves_with_time && t.small
    }

    /// The traits of a replica (`me`, of id `id`) configured as `cfg`, of `kind`, issuing
    /// its tags under its node's id or not.
    pub(crate) fn of(
        cfg: &ReplicaConfig,
        kind: FilterKind,
        node_id: bool,
        (me, id): (Uuid, ReplicaId),
    ) -> Self {
        Traits {
            aggregate_metrics: cfg.aggregate_metrics,
            moves_with_time: kind == FilterKind::ExpiringBloom,
            small: cfg
                .filter
                .memory_bytes()
                .is_ok_and(|b| b <= PARK_MAX_STATE_BYTES),
            serve_api: cfg.serve_api,
            node_id,
            anti_entropy_interval: ReplicaConfig::ms(cfg.anti_entropy_interval_ms),
            metrics_interval: ReplicaConfig::ms(cfg.metrics_interval_ms),
            peer_expiry: ReplicaConfig::ms(cfg.peer_expiry_ms),
            max_state_bytes: cfg.max_state_bytes,
            merges_pieces: cfg.filter.kind.merges_state_pieces(),
            me,
            max_peers: cfg.max_peers,
            delta_interval: ReplicaConfig::ms(cfg.delta_interval_ms),
            full_state_only: cfg.full_state_only,
            replicated_timeout: ReplicaConfig::ms(cfg.replicated_timeout_ms),
            replicated_peers: cfg.replicated_peers,
            id,
            lease_block: cfg.id_lease_block,
            tagged: kind.tagged(),
            retire_after: ReplicaConfig::ms(cfg.retire_after_ms),
            reuses_ids: kind.reuses_ids(),
        }
    }
}

impl Timing {
    /// The anti-entropy timing of a replica configured as `cfg`.
    pub(crate) fn of(cfg: &ReplicaConfig) -> Self {
        Timing {
            live: ReplicaConfig::ms(cfg.anti_entropy_interval_ms * 3),
            peer_expiry: ReplicaConfig::ms(cfg.peer_expiry_ms),
            min_request_interval: ReplicaConfig::ms(cfg.min_push_interval_ms),
            catch_up_timeout: ReplicaConfig::ms(cfg.catch_up_timeout_ms),
            max_peers: cfg.max_peers,
        }
    }

    /// The timing of a replica resumed from a restored, unconfirmed state: it decides it is
    /// alone only after a parked peer's node would have announced that peer's digest (every
    /// `spacing` anti-entropy intervals, [`crate::replica::parked_spacing`]), and one more.
    pub(crate) fn restored(mut self, cfg: &ReplicaConfig) -> Self {
        let spacing = u64::from(crate::replica::parked_spacing(cfg).unwrap_or(1));
        let announced = ReplicaConfig::ms(cfg.anti_entropy_interval_ms * (spacing + 1));
        self.catch_up_timeout = self.catch_up_timeout.max(announced);
        self
    }
}

/// What the shell knows of the state outside the core, read where a decision needs it (the
/// filter's lock and the flags its subscription tasks set).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Outside {
    /// The state changed outside the actor since it last looked (`Shared::direct_changes`).
    pub direct_changes: bool,
    /// Updates not yet taken into a delta.
    pub pending_delta: usize,
}

/// What would go on in the shell after its actor stopped: requests between threads on their
/// way, frames queued, pushes going out. Idle is all of it `false`/zero.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InFlight {
    /// The replica shut down (`Shared::closed`).
    pub closed: bool,
    /// A flush, a commit or a `logged` commit asked of the actor and not yet taken.
    pub asked: bool,
    /// The publisher task runs, or frames wait for it.
    pub publishing: bool,
    /// Full-state pushes queued or going out, or paced by their receivers.
    pub pushes: bool,
    /// Messages wait in the inbound buffer.
    pub inbound: bool,
}

/// What becoming ready does ([`ReplicaCore::becoming_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Subscribe the request API first; ready once it is.
    StartApi,
    /// Ready now: tell those waiting.
    Now,
}

/// A replica's decision state (see the module documentation). Its parts are public to the
/// shell, which drives each; the decisions that combine parts are its methods.
pub(crate) struct ReplicaCore<R> {
    pub traits: Traits,
    /// The last sequence number taken.
    pub seq: u64,
    /// Peers, digests and readiness (the protocol's decisions).
    pub anti_entropy: AntiEntropy,
    /// State transfers in progress and recently completed, made by the first chunk: most
    /// replicas of a node of many filters never receive one.
    pub transfers: Option<Box<Reassembly>>,
    /// The digest, cached until the state changes.
    pub digests: DigestCache,
    /// When full-state pushes may go.
    pub pushes: Pushes,
    /// Snapshots into the data directory, if the replica has one.
    pub snapshots: Snapshotter,
    /// Commits and the updates waiting for their acknowledgement level.
    pub pipeline: CommitPipeline<R>,
    /// The id claim and the other ids of the filter.
    pub lease: Lease,
    /// The other ids' reservations as last seen, and frames waiting for the next look; made
    /// by the first use (only tagged kinds look).
    pub registry_view: Option<Box<RegistryView>>,
    /// Kinds whose elements expire: the live peers' clocks; made by the first peer's.
    pub peer_clocks: Option<Box<PeerClocks>>,
    /// The most replicas (this one included) live at once since this replica's last listing
    /// of the registry (ever, under the node's id): counted by `replicated` beside the
    /// registry's (see [`crate::replica::ack::known_replicas`]).
    pub most_live: usize,
    /// The tags reserved durably (written to the data directory before one above is issued).
    pub reserved: u64,
    /// The request API was started (it is once, at the first readiness).
    pub api_started: bool,
    /// It parked: its node keeps its state.
    pub parked: bool,
    /// It resumed after parking: ready at once (it was, and alone).
    pub resumed: bool,
    /// It resumed from a state restored from its data directory that no peer confirmed
    /// yet: it serves, but is ready (caught up) only once a ready peer's digest equals its
    /// own or it merged a peer's state, or it heard no peer within the catch-up timeout
    /// stretched to a parked peer's digest spacing ([`Timing::restored`]).
    pub restored: bool,
    /// When the periodic timer fires, and what for.
    pub schedule: Schedule,
}

/// Where a replica's frames start numbering: microseconds of the wall clock at its start.
/// A process keeps its uuid across restarts; numbered from 1 again, a peer's acknowledgement
/// of the last life's frame `n`, arriving late, acknowledged this life's frame `n`, and a
/// `replicated` add was answered that no peer held (the simulation with removes found it).
/// A life sends far fewer than one frame a microsecond, so each numbers above every earlier
/// one; receivers take a jump forward past [`MAX_COUNTED_GAP`] for a restart, as they take a
/// step back (from earlier versions, which count from 1).
///
/// [`MAX_COUNTED_GAP`]: crate::replica::anti_entropy::MAX_COUNTED_GAP
pub(crate) fn frame_numbers_origin(since_unix_epoch: std::time::Duration) -> u64 {
    u64::try_from(since_unix_epoch.as_micros()).unwrap_or(u64::MAX / 2)
}

impl<R> ReplicaCore<R> {
    /// A replica's core at its start (`now`), from its parts that hold what it starts with.
    /// `seed` seeds the digests' jitter.
    pub(crate) fn new(
        traits: Traits,
        anti_entropy: Timing,
        (snapshots, pipeline, lease): (Snapshotter, CommitPipeline<R>, Lease),
        pushes: Pushes,
        (reserved, resumed): (u64, bool),
        now: Instant,
        seed: u64,
    ) -> Self {
        let schedule = Schedule::new(
            traits.anti_entropy_interval,
            traits.metrics_interval,
            traits.peer_expiry,
            now,
            seed,
        );
        ReplicaCore {
            traits,
            seq: 0,
            anti_entropy: AntiEntropy::new(anti_entropy, now),
            transfers: None,
            digests: DigestCache::default(),
            pushes,
            snapshots,
            pipeline,
            lease,
            registry_view: None,
            peer_clocks: None,
            most_live: 1,
            reserved,
            api_started: false,
            parked: false,
            resumed,
            restored: false,
            schedule,
        }
    }

    /// Numbers this life's frames after `origin`: the wall clock in microseconds at the
    /// replica's start ([`frame_numbers_origin`]).
    pub(crate) fn number_frames_after(&mut self, origin: u64) {
        self.seq = origin;
    }

    /// The next sequence number of the replica's frames.
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// `live` peers are live now: counted in [`ReplicaCore::most_live`].
    pub(crate) fn note_live(&mut self, live: usize) {
        self.most_live = self.most_live.max(live + 1);
    }

    /// The state changed: its digest is stale, and a snapshot is due.
    pub(crate) fn changed(&mut self) {
        self.schedule.changed();
        self.digests.invalidate();
        self.snapshots.changed();
    }

    /// A local change: as [`ReplicaCore::changed`], and a push is due too.
    pub(crate) fn local_change(&mut self) {
        self.changed();
        self.pushes.changed();
    }

    /// The transfers coming in, made by the first chunk.
    pub(crate) fn transfers_mut(&mut self) -> &mut Reassembly {
        let t = &self.traits;
        self.transfers.get_or_insert_with(|| {
            let timeout = (t.anti_entropy_interval * 3).max(Duration::from_secs(5));
            Box::new(Reassembly::new(t.max_state_bytes, timeout, t.merges_pieces))
        })
    }

    /// Caught up: whether to start the request API first (once) or be ready now.
    pub(crate) fn becoming_ready(&mut self) -> Ready {
        if self.traits.serve_api && !self.api_started {
            self.api_started = true;
            return Ready::StartApi;
        }
        Ready::Now
    }

    /// Whether nothing but a snapshot may be due: its figures go to the node-wide series only
    /// or it has no peer (its own series then stand still: no peer's staleness grows), it is
    /// caught up, nothing is in flight (a transfer, a commit, a change not taken into a
    /// delta), and its state does not move with time. Housekeeping is then rare, and (with
    /// more) the replica may park. (10,000 configured filters, each with its own series,
    /// woke every `metrics_interval_ms` alone: 8-10% of a core for the node, issue 52.)
    pub(crate) fn at_rest(&self, outside: Outside) -> bool {
        (self.traits.aggregate_metrics || self.anti_entropy.peers().next().is_none())
            && !self.traits.moves_with_time
            && self.anti_entropy.is_ready()
            && self.transfers.as_ref().is_none_or(|t| t.in_progress() == 0)
            && !self.pipeline.busy()
            && !outside.direct_changes
            && outside.pending_delta == 0
    }

    /// Whether the housekeeping goes every `metrics_interval_ms` (something to watch, in
    /// flight or to snapshot) rather than with the digest ([`Schedule::plan`]).
    pub(crate) fn busy(&self, outside: Outside) -> bool {
        !self.at_rest(outside) || self.snapshots.has_unsaved()
    }

    /// Whether the replica may park now but for its snapshot and its peers: at rest, under
    /// the node-wide metric series, under the node's id, small, and nothing waiting in the
    /// core or in the shell (a commit asked for, a push, a queued message). With peers, the
    /// shell also asks that every live one announced our digest (it computes the digest):
    /// its node then announces ours and compares theirs while it is parked.
    pub(crate) fn is_idle(&self, outside: Outside, in_flight: InFlight) -> bool {
        let InFlight {
            closed,
            asked,
            publishing,
            pushes,
            inbound,
        } = in_flight;
        self.at_rest(outside)
            && self.traits.aggregate_metrics
            && self.traits.node_id
            && self.traits.small
            && self.pipeline.idle()
            && !(closed || asked || publishing || pushes || inbound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ack::AckLevel;

    const S: Duration = Duration::from_secs(1);

    fn traits() -> Traits {
        Traits {
            aggregate_metrics: true,
            moves_with_time: false,
            small: true,
            serve_api: false,
            node_id: true,
            anti_entropy_interval: 5 * S,
            metrics_interval: S,
            peer_expiry: 60 * S,
            max_state_bytes: 1 << 20,
            merges_pieces: false,
            me: Uuid::from_u128(1),
            max_peers: 8,
            delta_interval: Duration::from_millis(50),
            full_state_only: false,
            replicated_timeout: 5 * S,
            replicated_peers: None,
            id: 1,
            lease_block: 1_000,
            tagged: true,
            retire_after: 60 * S,
            reuses_ids: true,
        }
    }

    fn timing() -> Timing {
        Timing {
            live: 15 * S,
            peer_expiry: 60 * S,
            min_request_interval: S,
            catch_up_timeout: 2 * S,
            max_peers: 8,
        }
    }

    fn core(t0: Instant, traits: Traits) -> ReplicaCore<u32> {
        let timing = timing();
        let parts = (
            Snapshotter::new(None, 30 * S, t0),
            CommitPipeline::new(false),
            Lease::new(0, None),
        );
        let mut c = ReplicaCore::new(traits, timing, parts, Pushes::new(S, 1), (0, false), t0, 1);
        let _ = c.anti_entropy.ready_now("a test");
        c
    }

    #[test]
    fn an_idle_replica_is_at_rest_alone_small_and_nothing_in_flight() {
        let t0 = Instant::now();
        let c = core(t0, traits());
        let (out, fl) = (Outside::default(), InFlight::default());
        assert!(c.at_rest(out) && c.is_idle(out, fl) && !c.busy(out));
        // Each thing outside the core that keeps it awake.
        let outside = [
            Outside {
                direct_changes: true,
                ..out
            },
            Outside {
                pending_delta: 1,
                ..out
            },
        ];
        for o in outside {
            assert!(!c.at_rest(o) && !c.is_idle(o, fl) && c.busy(o), "{o:?}");
        }
        let in_flight = [
            InFlight { closed: true, ..fl },
            InFlight { asked: true, ..fl },
            InFlight {
                publishing: true,
                ..fl
            },
            InFlight { pushes: true, ..fl },
            InFlight {
                inbound: true,
                ..fl
            },
        ];
        for f in in_flight {
            assert!(c.at_rest(out) && !c.is_idle(out, f), "{f:?}");
        }
        // What the replica is.
        for t in [
            Traits {
                aggregate_metrics: false,
                ..traits()
            },
            Traits {
                small: false,
                ..traits()
            },
        ] {
            assert!(!core(t0, t).is_idle(out, fl));
        }
        let expiring = core(
            t0,
            Traits {
                moves_with_time: true,
                ..traits()
            },
        );
        assert!(!expiring.at_rest(out) && expiring.busy(out));
    }

    #[test]
    fn an_update_waiting_or_a_catch_up_keeps_a_replica_awake_with_or_without_peers() {
        let t0 = Instant::now();
        let (out, fl) = (Outside::default(), InFlight::default());
        // A peer heard: at rest under the node-wide series, and idle (whether the peer has
        // our state is the shell's to check).
        let mut c = core(t0, traits());
        let _ = c.anti_entropy.heard(Uuid::from_u128(9), 2, 1, t0);
        assert!(c.at_rest(out) && c.is_idle(out, fl));
        // With series of its own, a peer's staleness moves: not at rest.
        let mut own = core(
            t0,
            Traits {
                aggregate_metrics: false,
                ..traits()
            },
        );
        let _ = own.anti_entropy.heard(Uuid::from_u128(9), 2, 1, t0);
        assert!(!own.at_rest(out));
        // An update waiting for its level.
        let mut c = core(t0, traits());
        c.pipeline.acks.wait(AckLevel::Durable, 1, 7);
        assert!(!c.at_rest(out) && !c.is_idle(out, fl));
        // Not caught up yet.
        let timing = timing();
        let c = ReplicaCore::<u32>::new(
            traits(),
            timing,
            (
                Snapshotter::new(None, 30 * S, t0),
                CommitPipeline::new(false),
                Lease::new(0, None),
            ),
            Pushes::new(S, 1),
            (0, false),
            t0,
            1,
        );
        assert!(!c.at_rest(out));
        // Under an id of its own (not the node's): never parks.
        let own_id = core(
            t0,
            Traits {
                node_id: false,
                ..traits()
            },
        );
        assert!(own_id.at_rest(out) && !own_id.is_idle(out, fl));
    }

    #[test]
    fn the_api_starts_once_before_readiness() {
        let t0 = Instant::now();
        let mut c = core(
            t0,
            Traits {
                serve_api: true,
                ..traits()
            },
        );
        assert_eq!(c.becoming_ready(), Ready::StartApi);
        assert_eq!(c.becoming_ready(), Ready::Now);
        let mut no_api = core(t0, traits());
        assert_eq!(no_api.becoming_ready(), Ready::Now);
    }

    #[test]
    fn sequence_numbers_and_the_most_live_only_grow() {
        let mut c = core(Instant::now(), traits());
        assert_eq!((c.next_seq(), c.next_seq()), (1, 2));
        c.note_live(3);
        c.note_live(1);
        assert_eq!(c.most_live, 4);
    }

    /// A replica resumed from a restored state decides it is alone only after a parked
    /// peer's node would have announced that peer's digest, and one interval more.
    #[test]
    fn a_restored_replica_waits_a_parked_peers_spacing_before_it_is_alone() {
        let cfg = ReplicaConfig::for_kind("t", crate::FilterKind::GBloom, 100, 0.01);
        let spacing = u64::from(crate::replica::parked_spacing(&cfg).unwrap_or(1));
        assert!(
            spacing > 1,
            "the defaults space a parked replica's digests out"
        );
        let timing = Timing::of(&cfg).restored(&cfg);
        let want = ReplicaConfig::ms(cfg.anti_entropy_interval_ms * (spacing + 1));
        assert_eq!(timing.catch_up_timeout, want);
        assert!(want > Timing::of(&cfg).catch_up_timeout);
        // A longer catch-up timeout of its own is kept.
        let mut slow = cfg.clone();
        slow.catch_up_timeout_ms = 3_600_000;
        assert_eq!(
            Timing::of(&slow).restored(&slow).catch_up_timeout,
            ReplicaConfig::ms(3_600_000)
        );
    }
}
