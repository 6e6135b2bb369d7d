//! One run of the simulation: nodes, their lives, the bus, and the checks.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::SimDisk;
use crate::ReplicaId;
use crate::replica::AnyFilter;
use crate::replica::core::{Adopted, Claiming, UnloggedMerges, frame_numbers_origin};
use crate::replica::durable::{DataDir, Identity, Reservation};
use crate::replica::metrics::Telemetry;
use crate::replica::recovery;
use crate::replica::wal::{DirectLog, SegmentId, WalError};
use crate::replica::{AckLevel, AckTracker, AntiEntropy, Timing, known_replicas, peers_needed};
use crate::replica::{ReplicaConfig, ReplicaError, SnapshotJob};
use crate::transport::registry::StaleWatch;
use crate::transport::{ClaimEntry, ClaimRecord};
use crate::wire::FilterKind;
use tokio::sync::oneshot;
use uuid::Uuid;

/// What one run does: its seed decides everything else.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub seed: u64,
    /// Events before the heal.
    pub steps: usize,
    /// The kinds a run picks from.
    pub kinds: Vec<FilterKind>,
    /// Replicas of the filter, one per node: a run has `min_nodes` to `max_nodes`.
    pub min_nodes: usize,
    pub max_nodes: usize,
    /// Adds at `replicated` as the product made them before it recorded their footprints:
    /// an add of an item the node had already set then has no delta for a peer to confirm,
    /// and is answered without one. For the test that shows the simulation finds it
    /// (`replicated_adds_without_footprints_are_found`).
    pub replicated_without_footprints: bool,
    /// The replicas start together, each looking at the registry before the others claimed
    /// their ids (a new filter); else each looks again once all have (a cluster that ran
    /// before).
    pub fresh_cluster: bool,
    /// `replicated` adds answered once durable when the last look found the replica alone,
    /// however old that look, as the product did before it asked for a fresh one
    /// (`AckTracker::committed_alone`). For the test that shows the simulation finds it
    /// (`lone_acks_on_a_stale_look_are_found`).
    pub lone_acks_unchecked: bool,
    /// Removes too, for the kinds that take them: an observed remove of an item some node
    /// added, logged and published as the product's `remove` is. Items ever removed leave
    /// the membership checks (a remove may win over an acknowledged add it observed);
    /// convergence is checked as ever.
    pub removes: bool,
    /// The filter's false positive rate: its fingerprints' width. A remove of an item whose
    /// fingerprint and buckets another item shares may take that item's entry (the cuckoo
    /// filter cannot tell them apart: a false negative the thesis allows), so runs that
    /// remove use wide fingerprints, where no two items of a run share them.
    pub fpr: f64,
    /// Every life numbers its frames from 1, as the product did before it numbered them from
    /// its clock (`frame_numbers_origin`): a peer's late acknowledgement of an earlier life's
    /// frame then acknowledges this life's frame of the same number. For the test that shows
    /// the simulation finds it (`stale_acknowledgements_of_an_earlier_life_are_found`).
    pub frames_numbered_from_one: bool,
}

impl Plan {
    /// A run of `seed` over every kind whose adds stay (not `expiring_bloom`).
    pub(crate) fn new(seed: u64) -> Self {
        Plan {
            seed,
            steps: 300,
            min_nodes: 1,
            replicated_without_footprints: false,
            fresh_cluster: false,
            lone_acks_unchecked: false,
            removes: false,
            fpr: 0.01,
            frames_numbered_from_one: false,
            max_nodes: std::env::var("CRPF_SIM_NODES")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(1),
            kinds: FilterKind::ALL
                .iter()
                .copied()
                .filter(|k| *k != FilterKind::ExpiringBloom)
                .collect(),
        }
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The first violation, with the events that led to it; `None` if every check held.
    pub violation: Option<String>,
    /// Adds acknowledged at `durable`.
    pub durable_acks: u64,
    /// Adds acknowledged at `replicated`, and those of them whose node lost its disk after
    /// (checked at the end, unless a peer that held them lost them too).
    pub replicated_acks: u64,
    pub replicated_after_loss: u64,
    pub disk_losses: u64,
    pub crashes: u64,
    pub power_losses: u64,
    pub restarts: u64,
    pub snapshots: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Local,
    Logged,
    Durable,
    Replicated,
}

/// An add waiting for its log append.
struct Waiting {
    item: Vec<u8>,
    level: Level,
    done: oneshot::Receiver<Result<(), WalError>>,
}

/// A process of a node: the replica as it runs.
struct Life {
    data: DataDir,
    filter: AnyFilter,
    log: DirectLog,
    identity: Identity,
    /// Tags reserved on disk.
    reserved: u64,
    waiting: Vec<Waiting>,
    /// Snapshots taken (the log rotated, the state cloned), not saved yet: the actor saves
    /// them on another thread, so adds and crashes come in between.
    taken: VecDeque<SnapshotJob>,
    generation: u64,
    saved: Arc<Mutex<u64>>,
    telemetry: Telemetry,
    /// Merges from peers no saved snapshot holds (`Shared::unlogged`).
    unlogged: Arc<UnloggedMerges>,
    /// `replicated` adds waiting for their commit, then for their peers: the product's own
    /// tracker, fed as `Replica::committed`, `publish_delta` and the `Ack` handler feed it.
    acks: AckTracker<Vec<u8>>,
    /// Commits of `replicated` adds whose append (or sync) is under way, in commit order.
    committing: VecDeque<Commit>,
    batch: u64,
    /// The sequence number of the last confirmed delta published.
    seq: u64,
    /// Who is heard from: the live peers a majority is never smaller than.
    anti: AntiEntropy,
    /// The registry as last looked at (`Lease::watch`): the known replicas.
    watch: StaleWatch,
    looked: bool,
    /// The most replicas heard from at once since that look (`Replica::most_live`).
    most_live: usize,
    renewed: Instant,
}

/// A commit of a `replicated` add: its delta goes out once the log has it (none: the item
/// was already set, and the commit is a sync of the log).
struct Commit {
    batch: u64,
    delta: Option<Vec<u8>>,
    done: oneshot::Receiver<Result<(), WalError>>,
}

impl Life {
    /// The known replicas as `Lease::known_replicas` gives them: `None` before a look.
    fn known(&self) -> Option<usize> {
        (self.looked && self.watch.known_ids > 0).then_some(self.watch.known_ids)
    }
}

/// A claim in the registry.
struct Claim {
    id: ReplicaId,
    claimant: Uuid,
    revision: u64,
    retired: bool,
}

/// How often a running replica renews its claim (`id_lease_renew_ms`, shorter here).
const RENEW: Duration = Duration::from_millis(500);

/// An add acknowledged at `replicated`.
struct ReplicatedAck {
    item: Vec<u8>,
    origin: usize,
    /// Its node lost its disk since.
    disk_lost: bool,
    /// Its commit had no delta (the node had set the item already): answered without peers.
    without_delta: bool,
    /// Answered after a look at the registry, started after its publication, found its
    /// replica the filter's only one: nothing is promised beyond its node's disk.
    alone: bool,
}

/// A saved snapshot's covered mark and what removing the segments it covers came to.
type Saved = Option<(SegmentId, Result<usize, WalError>)>;

impl Life {
    /// Saves a snapshot taken earlier (`SnapshotJob::save`), then removes the log segments it
    /// covers, as `Replica::snapshot_saved_now` does. `Ok(None)`: a newer one was saved.
    fn save(&mut self, job: SnapshotJob) -> Result<Saved, ReplicaError> {
        let covered = job.save(&self.data, &self.telemetry, &self.saved)?;
        Ok(covered.map(|k| (k, self.log.remove_through(k))))
    }
}

struct Node {
    disk: SimDisk,
    dir: PathBuf,
    life: Option<Life>,
    /// Adds this node acknowledged at `durable`: never lost while its disk is.
    durable: Vec<Vec<u8>>,
    /// Adds acknowledged at `logged` since the last loss of power: they survive a crash of
    /// the process.
    logged: Vec<Vec<u8>>,
    /// The state its last life held when it ended (compared with what the next life starts
    /// with: what a peer forgot).
    ended: Option<AnyFilter>,
}

#[derive(Clone)]
enum Body {
    Delta(Vec<u8>),
    State(Vec<u8>),
    /// A delta its receivers acknowledge once merged (`Body::ConfirmedDelta`).
    Confirmed {
        delta: Vec<u8>,
        seq: u64,
    },
    /// `Body::Ack`: `target` merged the confirmed delta `seq`.
    Ack {
        target: Uuid,
        seq: u64,
    },
}

#[derive(Clone)]
struct Message {
    to: usize,
    from: usize,
    /// The sending life's uuid and id (the envelope's).
    sender: Uuid,
    replica: ReplicaId,
    body: Body,
}

struct World {
    rng: fastrand::Rng,
    cfg: ReplicaConfig,
    kind: FilterKind,
    nodes: Vec<Node>,
    bus: Vec<Message>,
    /// Node `i` is on side `side[i]`; messages cross sides only when healed.
    side: Vec<u8>,
    next_replica: ReplicaId,
    next_item: u64,
    /// Every item added so far, on any node: adds of items already held (by this node or a
    /// peer) are common, and must be as durable as the first.
    added: Vec<Vec<u8>>,
    trace: VecDeque<String>,
    trace_len: usize,
    outcome: Outcome,
    /// The simulated clock: an origin taken once, and the durations the run adds to it (no
    /// decision depends on the origin, only on the differences).
    now: Instant,
    /// The registry's claims: every id claimed in the run, with its claimant and its
    /// revision (which each renewal moves).
    registry: Vec<Claim>,
    replicated_without_footprints: bool,
    lone_acks_unchecked: bool,
    replicated: Vec<ReplicatedAck>,
    /// Items a node held in memory and its next life did not (a crash before a snapshot
    /// saved a peer's merge, or its disk lost): `replicated` adds of another origin that a
    /// peer forgot are not promised to survive the loss of their node's disk too.
    forgotten: BTreeSet<(Vec<u8>, usize)>,
    /// Whether the run removes ([`Plan::removes`], for a kind that can).
    removes: bool,
    /// [`Plan::frames_numbered_from_one`].
    frames_numbered_from_one: bool,
    /// When the run began: lives number their frames from the microseconds since.
    began: Instant,
    /// Items some node removed (a remove of one of their entries took effect there).
    removed: BTreeSet<Vec<u8>>,
}

/// The registry's block of tags reserved at a time (the product's default is larger; small
/// here so that reservations are written often).
const TAG_BLOCK: u64 = 4;
/// Events a failure report shows (`CRPF_SIM_TRACE=<n>` for more).
fn trace_len() -> usize {
    std::env::var("CRPF_SIM_TRACE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(80)
}

/// Runs `plan`; never panics on a violation (it is reported in the outcome).
pub(crate) fn run(plan: &Plan) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let kind = plan.kinds[rng.usize(..plan.kinds.len())];
    let n = rng.usize(plan.min_nodes.max(1)..=plan.max_nodes.max(plan.min_nodes).max(1));
    let mut cfg = ReplicaConfig::for_kind("sim", kind, 200, plan.fpr);
    // A peer silent for 3 intervals is no longer live: short, so that partitions outlast it.
    cfg.anti_entropy_interval_ms = 200;
    cfg.peer_expiry_ms = 2_000;
    // Ids of earlier lives (a start afresh takes a new one) leave the count of known
    // replicas once unrenewed this long; an hour would keep them for the whole run.
    cfg.retire_after_ms = 3_000;
    let nodes = (0..n)
        .map(|i| Node {
            disk: SimDisk::new(plan.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9)),
            // In the disk's root, which exists: a first start makes it as a node makes a
            // new filter's directory, nothing synced until its first save.
            dir: PathBuf::from(format!("/node{i}")),
            life: None,
            durable: Vec::new(),
            logged: Vec::new(),
            ended: None,
        })
        .collect();
    let mut w = World {
        rng,
        cfg,
        kind,
        nodes,
        bus: Vec::new(),
        side: vec![0; n],
        next_replica: 1,
        next_item: 0,
        added: Vec::new(),
        trace: VecDeque::new(),
        trace_len: trace_len(),
        outcome: Outcome::default(),
        now: Instant::now(),
        registry: Vec::new(),
        replicated_without_footprints: plan.replicated_without_footprints,
        lone_acks_unchecked: plan.lone_acks_unchecked,
        replicated: Vec::new(),
        forgotten: BTreeSet::new(),
        removes: plan.removes && kind.removable(),
        removed: BTreeSet::new(),
        frames_numbered_from_one: plan.frames_numbered_from_one,
        began: Instant::now(),
    };
    w.note(format!("seed {} kind {kind} nodes {n}", plan.seed));
    for i in 0..n {
        w.start(i);
    }
    if !plan.fresh_cluster {
        // Every replica claimed (a start that crashed is tried again) before any looks.
        for i in 0..n {
            let mut tries = 0;
            while w.nodes[i].life.is_none() && tries < 10 {
                w.start(i);
                tries += 1;
            }
        }
        for i in 0..n {
            if w.nodes[i].life.is_some() {
                w.look(i, true);
            }
        }
    }
    for _ in 0..plan.steps {
        if w.outcome.violation.is_some() {
            break;
        }
        w.step();
    }
    if w.outcome.violation.is_none() {
        w.heal();
    }
    w.outcome
}

impl World {
    fn note(&mut self, event: String) {
        if self.trace.len() == self.trace_len {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    fn violation(&mut self, what: String) {
        if self.outcome.violation.is_some() {
            return;
        }
        let mut report = format!("{what}\nkind {}; last events:\n", self.kind);
        for e in &self.trace {
            let _ = writeln!(report, "  {e}");
        }
        self.outcome.violation = Some(report);
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(self.rng.u64(..40));
        let i = self.rng.usize(..self.nodes.len());
        if self.nodes[i].life.is_none() {
            // A node that died comes back (most of the time soon).
            if self.rng.u8(..4) != 0 {
                self.start(i);
            }
            return;
        }
        // `replicated` adds whose peers did not answer in time fail (`Replica::publish_delta`'s
        // timer).
        let now = self.now;
        let life = self.nodes[i].life.as_mut().expect("alive");
        let _ = life.acks.expire(now);
        let wants_look = life.acks.wants_look_since().is_some();
        self.renew();
        // The look asked for adds published alone (`Replica::look_for_alone`) comes soon.
        if wants_look && self.rng.bool() {
            return self.look(i, false);
        }
        match self.rng.u16(..1000) {
            0..120 if self.removes => self.remove(i),
            0..380 => self.add(i),
            380..520 => self.commit(i),
            520..550 => self.periodic_sync(i),
            550..610 => self.take_snapshot(i),
            610..670 => self.save_snapshot(i),
            670..830 => self.deliver(),
            830..870 => self.send_state(i),
            870..900 => self.clean_restart(i),
            900..940 => self.arm_crash(i),
            940..950 => self.arm_failure(i),
            950..970 => self.crash(i),
            970..980 => self.look(i, false),
            980..985 => self.lose_disk(i),
            _ => self.partition(),
        }
        self.reap(i);
    }

    /// Running replicas on the registry's side renew their claims.
    fn renew(&mut self) {
        let now = self.now;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let Some(life) = node.life.as_mut() else {
                continue;
            };
            if self.side[i] != 0 || now.saturating_duration_since(life.renewed) < RENEW {
                continue;
            }
            life.renewed = now;
            if let Some(c) = self
                .registry
                .iter_mut()
                .find(|c| c.id == life.identity.replica)
            {
                // Its own id retired meanwhile (a partition longer than `retire_after_ms`):
                // taken back (`Replica::take_back_id`).
                c.revision += 1;
                c.retired = false;
            }
        }
    }

    /// The registry looked at (`Replica::renew_lease`'s listing): from the registry's side of
    /// a partition only (it is on side 0); a failed look keeps the last count.
    /// At a start it succeeds: the id was just claimed there.
    fn look(&mut self, i: usize, at_start: bool) {
        if self.side[i] != 0 && !at_start {
            self.note(format!("node {i}: registry look failed"));
            return;
        }
        let now = self.now;
        let claims: Vec<ClaimEntry> = self
            .registry
            .iter()
            .map(|c| ClaimEntry {
                id: c.id,
                record: match c.retired {
                    true => ClaimRecord::Retired { floor: 0 },
                    false => ClaimRecord::Held {
                        claimant: c.claimant,
                        reserved: 0,
                    },
                },
                revision: c.revision,
            })
            .collect();
        let window = ReplicaConfig::ms(self.cfg.retire_after_ms);
        let retire_after = match self.kind.reuses_ids() {
            true => window,
            false => Duration::ZERO,
        };
        let life = self.nodes[i].life.as_mut().expect("alive");
        let me = life.identity.replica;
        let stale = life.watch.stale(me, &claims, now, retire_after);
        life.watch.note_known(me, &claims, now, window);
        // Ids unrenewed that long are retired (`Replica::retire_stale`), unless heard from.
        for e in stale {
            let heard = life.anti.peers().any(|(_, p)| {
                p.replica == e.id && now.saturating_duration_since(p.last_seen) < retire_after
            });
            if !heard && let Some(c) = self.registry.iter_mut().find(|c| c.id == e.id) {
                c.retired = true;
            }
        }
        life.looked = true;
        let live = life.anti.live_peers(now);
        life.most_live = live + 1;
        let known = life.watch.known_ids;
        // Adds published while the last look found the replica alone (`Replica::
        // looked_for_alone`).
        let needed = peers_needed(None, known_replicas(life.known(), life.most_live, live));
        let ok = life.acks.looked(now, needed).ok;
        self.note(format!("node {i}: registry look: {known} known"));
        self.replicated_ok(i, ok, &[], needed == 0);
    }

    /// The machine is replaced: its process and its whole disk are gone, and it comes back
    /// empty (a new uuid, a new id; the old id stays claimed). Nothing acknowledged there at
    /// `durable` or `logged` is promised any more; what it acknowledged at `replicated` is.
    fn lose_disk(&mut self, i: usize) {
        self.note(format!("node {i}: disk lost"));
        self.outcome.disk_losses += 1;
        if let Some(life) = self.nodes[i].life.take() {
            self.nodes[i].ended = Some(life.filter);
        }
        let seed = self.rng.u64(..);
        let node = &mut self.nodes[i];
        node.disk = SimDisk::new(seed);
        node.durable.clear();
        node.logged.clear();
        for r in self.replicated.iter_mut().filter(|r| r.origin == i) {
            r.disk_lost = true;
        }
    }

    /// A node whose disk crashed is dead: its process is gone, whatever it did after.
    fn reap(&mut self, i: usize) {
        if self.nodes[i].disk.crashed() && self.nodes[i].life.is_some() {
            self.note(format!(
                "node {i}: crashed at disk call {}",
                self.nodes[i].disk.steps()
            ));
            self.die(i);
        }
    }

    fn die(&mut self, i: usize) {
        self.outcome.crashes += 1;
        let node = &mut self.nodes[i];
        if let Some(mut life) = node.life.take() {
            // Answers already given stand: an append whose fsync completed was durable.
            collect(&mut life, &mut node.durable, &mut node.logged);
            node.ended = Some(life.filter);
        }
        if self.rng.u8(..3) == 0 {
            self.outcome.power_losses += 1;
            self.nodes[i].disk.power_loss();
            self.nodes[i].logged.clear();
            self.note(format!("node {i}: power lost"));
        } else {
            self.nodes[i].disk.restart();
        }
    }

    /// Starts node `i` from its disk, as `Replica::start_hosted` does: recovery, the start
    /// decisions, the reservation before serving, the first snapshot taken as it runs.
    fn start(&mut self, i: usize) {
        self.nodes[i].disk.restart();
        // A crash during the start is a crash too.
        if self.rng.u8(..8) == 0 {
            let at = self.nodes[i].disk.steps() + 1 + self.rng.u64(..12);
            self.nodes[i].disk.crash_at(at);
        }
        match self.try_start(i) {
            Ok(life) => {
                self.outcome.restarts += 1;
                let files = self.nodes[i].disk.listing();
                self.note(format!(
                    "node {i}: started as {:?}, clock {}, disk {files:?}",
                    life.identity.replica,
                    life.filter.clock()
                ));
                self.check_recovered(i, &life);
                self.forgot(i, &life.filter);
                self.nodes[i].life = Some(life);
                self.look(i, true);
                // The first snapshot after a start that changed something: taken now, saved
                // later (the actor runs, and serves, meanwhile).
            }
            Err(e) => {
                self.note(format!("node {i}: start failed: {e}"));
                if self.nodes[i].disk.crashed() {
                    self.die(i);
                } else {
                    self.violation(format!("node {i}: start failed without a crash: {e}"));
                }
            }
        }
    }

    fn try_start(&mut self, i: usize) -> Result<Life, String> {
        let disk: Arc<dyn crate::replica::disk::Disk> = Arc::new(self.nodes[i].disk.clone());
        let data =
            DataDir::open_new_on(disk, &self.nodes[i].dir, &[]).map_err(|e| e.to_string())?;
        let fresh = AnyFilter::new(&self.cfg.filter, 0).map_err(|e| e.to_string())?;
        let recovered = recovery::restore(&data, &self.cfg, &fresh).map_err(|e| e.to_string())?;
        // Crashes tear only what was never acknowledged: the log always parses and merges.
        if recovered.unmerged > 0 {
            self.violation(format!(
                "node {i}: {} log records do not merge",
                recovered.unmerged
            ));
        }
        if let Some(why) = &recovered.quarantined {
            self.violation(format!("node {i}: log moved aside: {why}"));
        }
        let claiming = Claiming::new(self.kind, recovered.state, fresh);
        // The registry grants the id asked for (no other replica holds it here), or a new one.
        let replica = claiming.preferred.unwrap_or_else(|| {
            self.next_replica += 1;
            self.next_replica
        });
        let uuid = claiming.uuid;
        match self.registry.iter_mut().find(|c| c.id == replica) {
            Some(claim) => {
                claim.claimant = uuid;
                claim.revision += 1;
                claim.retired = false;
            }
            None => self.registry.push(Claim {
                id: replica,
                claimant: uuid,
                revision: 1,
                retired: false,
            }),
        }
        let Adopted {
            filter,
            identity,
            reserved,
            unchanged,
            ..
        } = claiming.settle(uuid, replica, 0);
        if !unchanged && self.kind.tagged() {
            data.save_reservation(&Reservation { identity, reserved })
                .map_err(|e| e.to_string())?;
        }
        let log = DirectLog::start(recovered.wal, identity);
        // As the actor numbers them ([`frame_numbers_origin`]).
        let seq = match self.frames_numbered_from_one {
            true => 0,
            false => frame_numbers_origin(self.now.duration_since(self.began)),
        };
        let mut life = Life {
            data,
            filter,
            log,
            identity,
            reserved,
            waiting: Vec::new(),
            taken: VecDeque::new(),
            generation: 0,
            saved: Arc::new(Mutex::new(0)),
            telemetry: Telemetry::new("sim", 1, 0.01, true),
            unlogged: Arc::new(UnloggedMerges::new(true)),
            acks: AckTracker::default(),
            committing: VecDeque::new(),
            batch: 0,
            seq,
            anti: AntiEntropy::new(
                Timing {
                    live: ReplicaConfig::ms(self.cfg.anti_entropy_interval_ms * 3),
                    peer_expiry: ReplicaConfig::ms(self.cfg.peer_expiry_ms),
                    min_request_interval: ReplicaConfig::ms(self.cfg.min_push_interval_ms),
                    catch_up_timeout: ReplicaConfig::ms(self.cfg.catch_up_timeout_ms),
                    max_peers: self.cfg.max_peers,
                },
                self.now,
            ),
            watch: StaleWatch::default(),
            looked: false,
            most_live: 1,
            renewed: self.now,
        };
        if !unchanged {
            let job = snapshot_job(&mut life, &self.cfg);
            life.taken.push_back(job);
        }
        Ok(life)
    }

    /// What a restarted node must hold: every add it acknowledged at `durable`, and at
    /// `logged` unless the machine lost power since.
    fn check_recovered(&mut self, i: usize, life: &Life) {
        let node = &self.nodes[i];
        let lost: Vec<String> = node
            .durable
            .iter()
            .map(|item| ("durable", item))
            .chain(node.logged.iter().map(|item| ("logged", item)))
            .filter(|(_, item)| !self.removed.contains(*item) && !life.filter.contains(item))
            .map(|(level, item)| format!("{} ({level})", String::from_utf8_lossy(item)))
            .collect();
        if !lost.is_empty() {
            self.violation(format!(
                "node {i}: acknowledged adds lost after a restart: {}\ndisk: {:?}",
                lost.join(", "),
                node.disk.listing()
            ));
        }
    }

    /// Items node `i`'s last life held that its new one does not: forgotten (see
    /// [`World::forgotten`]).
    fn forgot(&mut self, i: usize, now_held: &AnyFilter) {
        let Some(before) = self.nodes[i].ended.take() else {
            return;
        };
        for item in &self.added {
            if before.contains(item) && !now_held.contains(item) {
                self.forgotten.insert((item.clone(), i));
            }
        }
    }

    fn add(&mut self, i: usize) {
        let level = match self.rng.u8(..10) {
            0..4 => Level::Durable,
            4..6 => Level::Replicated,
            6..8 => Level::Logged,
            _ => Level::Local,
        };
        let item = if !self.added.is_empty() && self.rng.u8(..4) == 0 {
            self.added[self.rng.usize(..self.added.len())].clone()
        } else {
            self.next_item += 1;
            let item = format!("i{}", self.next_item).into_bytes();
            self.added.push(item.clone());
            item
        };
        let tagged = self.kind.tagged();
        let node = &mut self.nodes[i];
        let life = node.life.as_mut().expect("alive");
        // A tag above the reservation is reserved on disk first (`Replica::reserve_tags`).
        if tagged && life.filter.clock() + 1 > life.reserved {
            let reserved = life.filter.clock() + 1 + TAG_BLOCK;
            let r = Reservation {
                identity: life.identity,
                reserved,
            };
            if life.data.save_reservation(&r).is_err() {
                self.note(format!("node {i}: reservation failed"));
                return;
            }
            life.reserved = reserved;
        }
        if let Err(e) = life.filter.add(&item) {
            // A full cuckoo table: refused, nothing changed.
            self.note(format!("node {i}: add refused: {e}"));
            return;
        }
        // A `replicated` add's delta holds the item's whole footprint, as `Updates::apply`
        // records it: a peer must confirm the item, set before or not.
        if level == Level::Replicated && !self.replicated_without_footprints {
            life.filter.record_footprint(&item);
        } else {
            life.unlogged.record_add(&mut life.filter, &item);
        }
        if level == Level::Replicated {
            // A commit of its own, published once the log has it (`Replica::committed`); a
            // commit without a delta is a sync of the log (`Replica::flush_delta`).
            life.batch += 1;
            let batch = life.batch;
            let delta = life.filter.take_delta();
            let done = match &delta {
                Some(d) => life.log.append(d.clone(), true),
                None => life.log.sync(),
            };
            life.acks.wait(AckLevel::Replicated, batch, item.clone());
            let logged = delta.is_some();
            life.committing.push_back(Commit { batch, delta, done });
            self.note(format!(
                "node {i}: add {} at Replicated (commit {batch}{})",
                String::from_utf8_lossy(&item),
                if logged { "" } else { ", nothing to log" }
            ));
            return;
        }
        let Some(delta) = life.filter.take_delta() else {
            // Its commit has nothing to append; at `durable` it waits for a sync of the log
            // (`Replica::flush_delta`), which fails once the log has. At `logged` it rests
            // on what earlier commits wrote: counted only when none is in flight.
            match level {
                Level::Durable => {
                    let done = life.log.sync();
                    life.waiting.push(Waiting {
                        item: item.clone(),
                        level,
                        done,
                    });
                }
                Level::Logged
                    if life.waiting.is_empty()
                        && life.committing.is_empty()
                        && !life.log.failed() =>
                {
                    node.logged.push(item.clone())
                }
                _ => {}
            }
            self.note(format!(
                "node {i}: add {} at {level:?}, nothing to log",
                String::from_utf8_lossy(&item)
            ));
            return;
        };
        let done = life.log.append(delta.clone(), level == Level::Durable);
        life.waiting.push(Waiting {
            item: item.clone(),
            level,
            done,
        });
        self.note(format!(
            "node {i}: add {} at {level:?}",
            String::from_utf8_lossy(&item)
        ));
        self.publish(i, Body::Delta(delta));
    }

    /// An observed remove of an item some node added, at `durable`: the entries it observes
    /// leave, its delta is appended to the log and published (`Replica`'s remove).
    fn remove(&mut self, i: usize) {
        if self.added.is_empty() {
            return;
        }
        let item = self.added[self.rng.usize(..self.added.len())].clone();
        let life = self.nodes[i].life.as_mut().expect("alive");
        match life.filter.remove(&item) {
            Ok(Some(_)) => {}
            Ok(None) => {
                // Not observed here: nothing to remove, nothing to log.
                return;
            }
            Err(e) => return self.violation(format!("node {i}: remove refused: {e}")),
        }
        self.removed.insert(item.clone());
        let Some(delta) = life.filter.take_delta() else {
            return self.violation(format!("node {i}: a remove without a delta"));
        };
        // Its answer is not checked (the item left the checks): the append only has to
        // happen, as the product's does.
        drop(life.log.append(delta.clone(), true));
        self.note(format!(
            "node {i}: remove {}",
            String::from_utf8_lossy(&item)
        ));
        self.publish(i, Body::Delta(delta));
    }

    fn publish(&mut self, from: usize, body: Body) {
        let life = self.nodes[from].life.as_ref().expect("alive");
        let (sender, replica) = (life.identity.uuid, life.identity.replica);
        let peers: Vec<usize> = (0..self.nodes.len()).filter(|&j| j != from).collect();
        for to in peers {
            self.bus.push(Message {
                to,
                from,
                sender,
                replica,
                body: body.clone(),
            });
        }
    }

    fn commit(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let life = node.life.as_mut().expect("alive");
        life.log.commit();
        let before = node.durable.len();
        collect(life, &mut node.durable, &mut node.logged);
        self.outcome.durable_acks += (self.nodes[i].durable.len() - before) as u64;
        self.note(format!("node {i}: group commit"));
        self.publish_commits(i);
        if !self.nodes[i].disk.crashed() {
            self.recover_log(i);
        }
    }

    /// The commits of `replicated` adds the log finished, in order, as `Replica::committed`
    /// and `publish_delta` take them: a failed one fails its adds; a written one's delta goes
    /// out asking its receivers to confirm, its adds waiting for as many peers as the
    /// product's rule says (`peers_needed` of `known_replicas`); one without a delta is
    /// answered (`answer_without_delta`, with no held delta to send in its stead).
    fn publish_commits(&mut self, i: usize) {
        let (now, configured) = (self.now, self.cfg.replicated_peers);
        let lone_unchecked = self.lone_acks_unchecked;
        let timeout = ReplicaConfig::ms(self.cfg.replicated_timeout_ms);
        let life = self.nodes[i].life.as_mut().expect("alive");
        let (mut ok, mut out, mut notes) = (Vec::new(), Vec::new(), Vec::new());
        let mut unconfirmed = Vec::new();
        while let Some(c) = life.committing.front_mut() {
            let result = match c.done.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => break,
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(oneshot::error::TryRecvError::Closed) => Err("writer gone".to_owned()),
            };
            let c = life.committing.pop_front().expect("looked at");
            match (result, c.delta) {
                (Err(e), _) => {
                    let _ = life.acks.commit_failed(c.batch, &e);
                }
                (Ok(()), None) => {
                    let r = life.acks.committed(c.batch, None, 0, now);
                    unconfirmed.extend(r.ok.iter().cloned());
                    ok.extend(r.ok);
                }
                (Ok(()), Some(delta)) => {
                    life.seq += 1;
                    let live = life.anti.live_peers(now);
                    life.most_live = life.most_live.max(live + 1);
                    let known = known_replicas(life.known(), life.most_live, live);
                    let needed = peers_needed(configured, known);
                    let alone = needed == 0 && configured.is_none() && !lone_unchecked;
                    let r = match alone {
                        true => life
                            .acks
                            .committed_alone(c.batch, life.seq, now, now + timeout),
                        false => {
                            life.acks
                                .committed(c.batch, Some(life.seq), needed, now + timeout)
                        }
                    };
                    ok.extend(r.ok);
                    notes.push(format!(
                        "node {i}: commit {} published as {}, {needed} of {known} needed{}",
                        c.batch,
                        life.seq,
                        if alone {
                            " (alone: a look to come)"
                        } else {
                            ""
                        }
                    ));
                    out.push(Body::Confirmed {
                        delta,
                        seq: life.seq,
                    });
                }
            }
        }
        for n in notes {
            self.note(n);
        }
        // A frame takes at least a microsecond to make (what numbering lives from the clock
        // rests on).
        self.now += Duration::from_micros(out.len() as u64);
        for body in out {
            self.publish(i, body);
        }
        self.replicated_ok(i, ok, &unconfirmed, false);
    }

    /// Adds node `i` acknowledged at `replicated` (durable too); `alone`: after a look found
    /// its replica the only one.
    fn replicated_ok(
        &mut self,
        i: usize,
        items: Vec<Vec<u8>>,
        without_delta: &[Vec<u8>],
        alone: bool,
    ) {
        for item in items {
            let without_delta = without_delta.contains(&item);
            self.note(format!(
                "node {i}: {} acknowledged at Replicated",
                String::from_utf8_lossy(&item)
            ));
            self.outcome.replicated_acks += 1;
            self.nodes[i].durable.push(item.clone());
            self.replicated.push(ReplicatedAck {
                item,
                origin: i,
                disk_lost: false,
                without_delta,
                alone,
            });
        }
    }

    fn periodic_sync(&mut self, i: usize) {
        let life = self.nodes[i].life.as_mut().expect("alive");
        life.log.periodic_sync();
        self.note(format!("node {i}: periodic sync"));
    }

    /// A periodic snapshot taken on the actor's thread: the log rotated, the state cloned.
    fn take_snapshot(&mut self, i: usize) {
        let cfg = self.cfg.clone();
        let life = self.nodes[i].life.as_mut().expect("alive");
        let job = snapshot_job(life, &cfg);
        let covered = job.wal_covered;
        life.taken.push_back(job);
        self.note(format!("node {i}: snapshot taken, covers {covered:?}"));
    }

    /// A snapshot taken earlier saved (on another thread), then the segments it covers removed.
    fn save_snapshot(&mut self, i: usize) {
        let life = self.nodes[i].life.as_mut().expect("alive");
        let Some(job) = life.taken.pop_front() else {
            return;
        };
        let note = match life.save(job) {
            Ok(Some((k, removed))) => {
                self.outcome.snapshots += 1;
                format!("node {i}: snapshot saved, removed through {k:?}: {removed:?}")
            }
            Ok(None) => format!("node {i}: snapshot superseded"),
            Err(e) => format!("node {i}: snapshot failed: {e}"),
        };
        self.note(note);
    }

    /// A clean stop (`Shutdown`): appends completed, a final snapshot, the log closed; then
    /// the next life.
    fn clean_restart(&mut self, i: usize) {
        let cfg = self.cfg.clone();
        let node = &mut self.nodes[i];
        node.life.as_mut().expect("alive").log.commit();
        // The deltas of written commits go out; adds still waiting for peers are answered
        // `Stopped` (`AckTracker::stop`).
        self.publish_commits(i);
        let node = &mut self.nodes[i];
        let mut life = node.life.take().expect("alive");
        collect(&mut life, &mut node.durable, &mut node.logged);
        while let Some(job) = life.taken.pop_front() {
            let _ = life.save(job);
        }
        let job = snapshot_job(&mut life, &cfg);
        let _ = life.save(job);
        life.log.close();
        node.ended = Some(life.filter);
        self.note(format!("node {i}: clean stop"));
        if self.nodes[i].disk.crashed() {
            self.note(format!("node {i}: crashed while stopping"));
            return self.die(i);
        }
        self.start(i);
    }

    /// A write, sync or rename soon fails once (a full disk).
    fn arm_failure(&mut self, i: usize) {
        let at = self.nodes[i].disk.steps() + 1 + self.rng.u64(..10);
        self.nodes[i].disk.fail_at(at);
        self.note(format!("node {i}: disk call {at} will fail"));
    }

    /// `Replica::recover_wal`: after a failed append, a snapshot that covers every segment
    /// the failed writer used, then a writer on new segments.
    fn recover_log(&mut self, i: usize) {
        let cfg = self.cfg.clone();
        let life = self.nodes[i].life.as_mut().expect("alive");
        if !life.log.failed() || !life.taken.is_empty() {
            return;
        }
        let job = snapshot_job(life, &cfg);
        let note = match life.save(job) {
            Ok(_) => {
                life.log = life.log.reopen();
                format!("node {i}: log recovered")
            }
            Err(e) => format!("node {i}: log not recovered yet: {e}"),
        };
        self.note(note);
    }

    fn arm_crash(&mut self, i: usize) {
        let at = self.nodes[i].disk.steps() + 1 + self.rng.u64(..30);
        self.nodes[i].disk.crash_at(at);
        self.note(format!("node {i}: will crash at disk call {at}"));
    }

    fn crash(&mut self, i: usize) {
        self.note(format!("node {i}: killed"));
        self.die(i);
    }

    fn partition(&mut self) {
        if self.side.iter().any(|&s| s != 0) {
            self.side.fill(0);
            self.note("healed".into());
        } else {
            for s in &mut self.side {
                *s = self.rng.u8(..2);
            }
            let side = self.side.clone();
            self.note(format!("partitioned {side:?}"));
        }
    }

    /// Delivers (or drops, or duplicates) one message, in any order.
    fn deliver(&mut self) {
        if self.bus.is_empty() {
            return;
        }
        let k = self.rng.usize(..self.bus.len());
        let msg = self.bus.swap_remove(k);
        if self.side[msg.from] != self.side[msg.to] {
            // Cut off: lost.
            return;
        }
        match self.rng.u8(..20) {
            0 => return,
            1 => self.bus.push(msg.clone()),
            _ => {}
        }
        self.apply(msg);
    }

    fn apply(&mut self, msg: Message) {
        let (kind, now) = (self.kind, self.now);
        let Some(life) = self.nodes[msg.to].life.as_mut() else {
            return;
        };
        let _ = life.anti.heard(msg.sender, msg.replica, 0, now);
        let r = match &msg.body {
            Body::Ack { target, seq } => {
                if *target == life.identity.uuid {
                    let r = life.acks.acked(msg.sender, *seq);
                    self.replicated_ok(msg.to, r.ok, &[], false);
                }
                return;
            }
            Body::Delta(d) | Body::Confirmed { delta: d, .. } => {
                life.unlogged.merged();
                life.filter
                    .merge_remote_delta_bytes(d, 0)
                    .map_err(|e| e.to_string())
            }
            Body::State(s) => {
                life.unlogged.merged();
                AnyFilter::decode_state(kind, s)
                    .map_err(|e| e.to_string())
                    .and_then(|other| life.filter.merge(&other).map_err(|e| e.to_string()))
            }
        };
        match r {
            Err(e) => self.violation(format!(
                "node {}: a peer's message does not merge: {e}",
                msg.to
            )),
            Ok(()) => {
                if let Body::Confirmed { seq, .. } = msg.body {
                    // Merged: acknowledged to its sender (`Replica::send_ack`).
                    let (sender, replica) = (life.identity.uuid, life.identity.replica);
                    self.bus.push(Message {
                        to: msg.from,
                        from: msg.to,
                        sender,
                        replica,
                        body: Body::Ack {
                            target: msg.sender,
                            seq,
                        },
                    });
                }
            }
        }
    }

    /// Anti-entropy: a node's whole state to its peers.
    fn send_state(&mut self, i: usize) {
        let state = self.nodes[i]
            .life
            .as_ref()
            .expect("alive")
            .filter
            .encode_state();
        self.publish(i, Body::State(state));
    }

    /// The end: partitions heal, every node runs, the bus drains, states are exchanged; then
    /// the replicas agree and each holds every durable add.
    fn heal(&mut self) {
        self.side.fill(0);
        self.note("heal".into());
        for i in 0..self.nodes.len() {
            let mut tries = 0;
            while self.nodes[i].life.is_none() && tries < 10 {
                self.start(i);
                tries += 1;
            }
            if self.nodes[i].life.is_none() {
                return self.violation(format!("node {i} does not start"));
            }
        }
        for i in 0..self.nodes.len() {
            self.commit(i);
        }
        while let Some(msg) = self.bus.pop() {
            self.apply(msg);
        }
        for i in 0..self.nodes.len() {
            self.send_state(i);
        }
        while let Some(msg) = self.bus.pop() {
            self.apply(msg);
        }
        let durable: Vec<Vec<u8>> = self
            .nodes
            .iter()
            .flat_map(|n| n.durable.iter().cloned())
            .collect();
        for i in 0..self.nodes.len() {
            let life = self.nodes[i].life.as_ref().expect("started");
            let missing: Vec<String> = durable
                .iter()
                .filter(|item| !self.removed.contains(*item) && !life.filter.contains(item))
                .map(|item| String::from_utf8_lossy(item).into_owned())
                .collect();
            if !missing.is_empty() {
                return self.violation(format!(
                    "node {i}: durable adds missing after the heal: {}",
                    missing.join(", ")
                ));
            }
            let first = &self.nodes[0].life.as_ref().expect("started").filter;
            if !life.filter.equivalent(first) {
                return self.violation(format!("node {i} and node 0 do not converge"));
            }
        }
        self.check_replicated();
    }

    /// Every add acknowledged at `replicated` is in every replica, even where its node lost
    /// its disk since: unless the filter has one replica, or had at a look that started after
    /// the add's publication (then it is answered once durable),
    /// or a peer that held it forgot it (a second fault: what is promised is the loss of
    /// one disk).
    fn check_replicated(&mut self) {
        if self.nodes.len() < 2 {
            return;
        }
        let mut lost = Vec::new();
        for r in &self.replicated {
            let forgotten = (0..self.nodes.len())
                .any(|j| j != r.origin && self.forgotten.contains(&(r.item.clone(), j)));
            if forgotten || r.alone || self.removed.contains(&r.item) {
                continue;
            }
            if r.disk_lost {
                self.outcome.replicated_after_loss += 1;
            }
            let missing: Vec<usize> = (0..self.nodes.len())
                .filter(|&j| {
                    !self.nodes[j]
                        .life
                        .as_ref()
                        .expect("started")
                        .filter
                        .contains(&r.item)
                })
                .collect();
            if !missing.is_empty() {
                lost.push(format!(
                    "{} (node {}{}{}; missing on {missing:?})",
                    String::from_utf8_lossy(&r.item),
                    r.origin,
                    if r.disk_lost {
                        ", its disk lost since"
                    } else {
                        ""
                    },
                    if r.without_delta {
                        ", answered without a delta"
                    } else {
                        ""
                    }
                ));
            }
        }
        if !lost.is_empty() {
            self.violation(format!(
                "replicated adds lost after the heal: {}",
                lost.join(", ")
            ));
        }
    }
}

/// The answers of the appends that completed: acknowledged adds recorded by level.
fn collect(life: &mut Life, durable: &mut Vec<Vec<u8>>, logged: &mut Vec<Vec<u8>>) {
    life.waiting.retain_mut(|w| match w.done.try_recv() {
        Ok(Ok(())) => {
            match w.level {
                Level::Durable => durable.push(w.item.clone()),
                Level::Logged => logged.push(w.item.clone()),
                Level::Local | Level::Replicated => {}
            }
            false
        }
        Ok(Err(_)) => false,
        Err(oneshot::error::TryRecvError::Empty) => true,
        Err(oneshot::error::TryRecvError::Closed) => false,
    });
}

/// A snapshot taken now (`Replica::snapshot_source`): the log rotated at the moment the state
/// is cloned.
fn snapshot_job(life: &mut Life, cfg: &ReplicaConfig) -> SnapshotJob {
    life.generation += 1;
    SnapshotJob {
        generation: life.generation,
        wal_covered: Some(life.log.rotate()),
        filter: life.filter.clone(),
        merges: life.unlogged.mark(),
        identity: life.identity,
        name: cfg.name.clone(),
        kind: life.filter.kind(),
        params_digest: life.filter.params_digest(),
        reserved: life.reserved,
    }
}
