//! One run of the simulation: nodes, their lives, the bus, and the checks.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::SimDisk;
use crate::ReplicaId;
use crate::replica::AnyFilter;
use crate::replica::core::{Adopted, Claiming, UnloggedMerges};
use crate::replica::durable::{DataDir, Identity, Reservation};
use crate::replica::metrics::Telemetry;
use crate::replica::recovery;
use crate::replica::wal::{DirectLog, SegmentId, WalError};
use crate::replica::{ReplicaConfig, ReplicaError, SnapshotJob};
use crate::wire::FilterKind;
use tokio::sync::oneshot;

/// What one run does: its seed decides everything else.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub seed: u64,
    /// Events before the heal.
    pub steps: usize,
    /// The kinds a run picks from.
    pub kinds: Vec<FilterKind>,
    /// Replicas of the filter, one per node: a run has 1 to this many.
    pub max_nodes: usize,
}

impl Plan {
    /// A run of `seed` over every kind whose adds stay (not `expiring_bloom`).
    pub(crate) fn new(seed: u64) -> Self {
        Plan {
            seed,
            steps: 300,
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
}

enum Body {
    Delta(Vec<u8>),
    State(Vec<u8>),
}

struct Message {
    to: usize,
    from: usize,
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
    outcome: Outcome,
}

/// The registry's block of tags reserved at a time (the product's default is larger; small
/// here so that reservations are written often).
const TAG_BLOCK: u64 = 4;
const TRACE: usize = 80;

/// Runs `plan`; never panics on a violation (it is reported in the outcome).
pub(crate) fn run(plan: &Plan) -> Outcome {
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let kind = plan.kinds[rng.usize(..plan.kinds.len())];
    let n = rng.usize(1..=plan.max_nodes.max(1));
    let cfg = ReplicaConfig::for_kind("sim", kind, 200, 0.01);
    let nodes = (0..n)
        .map(|i| Node {
            disk: SimDisk::new(plan.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9)),
            dir: PathBuf::from(format!("/data/node{i}/sim")),
            life: None,
            durable: Vec::new(),
            logged: Vec::new(),
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
        outcome: Outcome::default(),
    };
    w.note(format!("seed {} kind {kind} nodes {n}", plan.seed));
    for i in 0..n {
        w.start(i);
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
        if self.trace.len() == TRACE {
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
        let i = self.rng.usize(..self.nodes.len());
        if self.nodes[i].life.is_none() {
            // A node that died comes back (most of the time soon).
            if self.rng.u8(..4) != 0 {
                self.start(i);
            }
            return;
        }
        match self.rng.u8(..100) {
            0..40 => self.add(i),
            40..55 => self.commit(i),
            55..58 => self.periodic_sync(i),
            58..64 => self.take_snapshot(i),
            64..70 => self.save_snapshot(i),
            70..84 => self.deliver(),
            84..88 => self.send_state(i),
            88..91 => self.clean_restart(i),
            91..95 => self.arm_crash(i),
            95 => self.arm_failure(i),
            96..98 => self.crash(i),
            _ => self.partition(),
        }
        self.reap(i);
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
                self.nodes[i].life = Some(life);
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
        let data = DataDir::open_on(disk, &self.nodes[i].dir).map_err(|e| e.to_string())?;
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
            .filter(|(_, item)| !life.filter.contains(item))
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

    fn add(&mut self, i: usize) {
        let level = match self.rng.u8(..10) {
            0..6 => Level::Durable,
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
        life.unlogged.record_add(&mut life.filter, &item);
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
                Level::Logged if life.waiting.is_empty() && !life.log.failed() => {
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

    fn publish(&mut self, from: usize, body: Body) {
        let peers: Vec<usize> = (0..self.nodes.len()).filter(|&j| j != from).collect();
        for to in peers {
            let body = match &body {
                Body::Delta(d) => Body::Delta(d.clone()),
                Body::State(s) => Body::State(s.clone()),
            };
            self.bus.push(Message { to, from, body });
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
        if !self.nodes[i].disk.crashed() {
            self.recover_log(i);
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
        let mut life = node.life.take().expect("alive");
        life.log.commit();
        collect(&mut life, &mut node.durable, &mut node.logged);
        while let Some(job) = life.taken.pop_front() {
            let _ = life.save(job);
        }
        let job = snapshot_job(&mut life, &cfg);
        let _ = life.save(job);
        life.log.close();
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
            1 => self.bus.push(Message {
                to: msg.to,
                from: msg.from,
                body: match &msg.body {
                    Body::Delta(d) => Body::Delta(d.clone()),
                    Body::State(s) => Body::State(s.clone()),
                },
            }),
            _ => {}
        }
        self.apply(msg);
    }

    fn apply(&mut self, msg: Message) {
        let kind = self.kind;
        let Some(life) = self.nodes[msg.to].life.as_mut() else {
            return;
        };
        life.unlogged.merged();
        let r = match &msg.body {
            Body::Delta(d) => life
                .filter
                .merge_remote_delta_bytes(d, 0)
                .map_err(|e| e.to_string()),
            Body::State(s) => AnyFilter::decode_state(kind, s)
                .map_err(|e| e.to_string())
                .and_then(|other| life.filter.merge(&other).map_err(|e| e.to_string())),
        };
        if let Err(e) = r {
            self.violation(format!(
                "node {}: a peer's message does not merge: {e}",
                msg.to
            ));
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
                .filter(|item| !life.filter.contains(item))
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
    }
}

/// The answers of the appends that completed: acknowledged adds recorded by level.
fn collect(life: &mut Life, durable: &mut Vec<Vec<u8>>, logged: &mut Vec<Vec<u8>>) {
    life.waiting.retain_mut(|w| match w.done.try_recv() {
        Ok(Ok(())) => {
            match w.level {
                Level::Durable => durable.push(w.item.clone()),
                Level::Logged => logged.push(w.item.clone()),
                Level::Local => {}
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
