//! Property tests of the CRDT laws for every filter (DESIGN.md section 2): merge idempotent,
//! commutative, associative up to equivalence; `le` agrees with merge; every update inflates;
//! no false negatives after any sequence of adds, removes and merges among three replicas;
//! failed adds change nothing; serde round trips preserve equivalence.
//!
//! Filters are tiny so that collisions, overflowing buckets, failed insertions and sub-filter
//! expansion all happen within a few dozen operations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use crpf::{
    BloomParams, CuckooParams, DeltaState, Dot, FilterError, GBloom, GCuckoo, Lattice, Membership,
    OrCuckoo, Removable, ScGBloom, ScGCuckoo, ScOrCuckoo, ScalableParams, WriterScGBloom,
    WriterScGCuckoo, WriterScOrCuckoo,
};
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

const UNIVERSE: u16 = 48;

fn item(i: u16) -> [u8; 2] {
    i.to_le_bytes()
}

trait Subject: DeltaState + Membership + Clone + Debug + Serialize + DeserializeOwned {
    fn make(replica: u16) -> Self;
    /// Adds and reports the tag issued, for types that issue tags.
    fn add_tracked(&mut self, it: &[u8]) -> Result<Option<Dot>, FilterError> {
        self.add(it).map(|_| None)
    }
    /// `None` if the type cannot remove; else the tag removed, if any.
    fn remove_tracked(&mut self, _it: &[u8]) -> Option<Option<Dot>> {
        None
    }
    /// The live tags, for types that have them.
    fn live(&self) -> Option<BTreeSet<Dot>> {
        None
    }
    /// Re-adds every live occurrence of `dump` as this replica's own updates (a `LOADCHUNK`
    /// of its dump): the tags issued, one per entry in the order of
    /// [`Subject::listed_dots`], for the types that issue them. `None` for the types without
    /// tags or counts, whose dumps are merged instead (`Op::Merge` covers that).
    fn import_from(&mut self, _dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        None
    }
    /// The live tags in the order the type lists its occurrences.
    fn listed_dots(&self) -> Vec<Dot> {
        Vec::new()
    }
    /// Whether a delta of an import may name a sub-filter too far past a receiver's last one
    /// for it to take (it catches up by a full state then): the scalable OR types.
    const DELTAS_MAY_RUN_AHEAD: bool = false;
}

thread_local! {
    /// The growth of the scalable subjects and the bucket size of the cuckoo ones (RedisBloom's
    /// `EXPANSION` and `BUCKETSIZE`): 2 and 4 unless a test runs [`shaped`]. Per thread: each
    /// test runs its cases on its own.
    static SHAPE: std::cell::Cell<(u32, u8)> = const { std::cell::Cell::new((2, 4)) };
}

/// Runs `f` with subjects of growth `growth` and buckets of `bucket_size` slots.
fn shaped(growth: u32, bucket_size: u8, f: impl FnOnce()) {
    SHAPE.set((growth, bucket_size));
    f();
    SHAPE.set((2, 4));
}

fn cuckoo_params(seed: u64) -> CuckooParams {
    CuckooParams {
        buckets: 6,
        bucket_size: SHAPE.get().1,
        fingerprint_bits: 5,
        max_kicks: 20,
        seed,
    }
}

fn scalable_params() -> ScalableParams {
    let (growth, bucket_size) = SHAPE.get();
    ScalableParams {
        initial_capacity: 6,
        fpr: 0.2,
        max_kicks: 20,
        growth,
        bucket_size,
        ..ScalableParams::with_capacity(6, 0.2).unwrap()
    }
}

impl Subject for GBloom {
    fn make(_: u16) -> Self {
        GBloom::new(BloomParams {
            bits: 200,
            hashes: 3,
            seed: 1,
            capacity: 40,
        })
        .unwrap()
    }
}

/// `go_bloom`: Go's bits-and-blooms hashing, the same lattice.
impl Subject for crpf::GoBloom {
    fn make(_: u16) -> Self {
        crpf::GoBloom::new(crpf::GoBloomParams {
            bits: 200,
            hashes: 3,
        })
        .unwrap()
    }
}

thread_local! {
    /// Whether the `blocked_bloom` replicas a test makes spread items over two blocks (each
    /// test runs its cases on a thread of its own).
    static TWO_BLOCKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `blocked_bloom`: two 512-bit blocks, so that items share blocks and bits; one block per
/// item, or two where the test says ([`TWO_BLOCKS`]).
impl Subject for crpf::BlockedBloom {
    fn make(_: u16) -> Self {
        let layout = if TWO_BLOCKS.get() {
            crpf::BlockedLayout::TwoBlocks
        } else {
            crpf::BlockedLayout::OneBlock
        };
        crpf::BlockedBloom::with_layout(
            BloomParams {
                bits: 1024,
                hashes: 3,
                seed: 1,
                capacity: 40,
            },
            layout,
        )
        .unwrap()
    }
}

/// The replica's `g_bloom` (bits shared with lock-free readers): a GBloom's laws.
impl Subject for crpf::SharedGBloom {
    fn make(_: u16) -> Self {
        crpf::SharedGBloom::new(BloomParams {
            bits: 200,
            hashes: 3,
            seed: 1,
            capacity: 40,
        })
        .unwrap()
    }
}

impl Subject for GCuckoo {
    fn make(_: u16) -> Self {
        GCuckoo::new(cuckoo_params(2)).unwrap()
    }
}

impl Subject for OrCuckoo {
    fn make(replica: u16) -> Self {
        OrCuckoo::new(cuckoo_params(3), replica).unwrap()
    }
    fn import_from(&mut self, dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        Some(self.import(&dump.live_occurrences()))
    }
    fn listed_dots(&self) -> Vec<Dot> {
        self.dots()
    }
    fn add_tracked(&mut self, it: &[u8]) -> Result<Option<Dot>, FilterError> {
        self.add_dot(it).map(Some)
    }
    fn remove_tracked(&mut self, it: &[u8]) -> Option<Option<Dot>> {
        Some(self.remove_dot(it))
    }
    fn live(&self) -> Option<BTreeSet<Dot>> {
        Some(self.dots().into_iter().collect())
    }
}

impl Subject for ScGBloom {
    fn make(_: u16) -> Self {
        ScGBloom::new(scalable_params()).unwrap()
    }
}

impl Subject for ScGCuckoo {
    fn make(_: u16) -> Self {
        ScGCuckoo::new(scalable_params()).unwrap()
    }
}

impl Subject for ScOrCuckoo {
    fn make(replica: u16) -> Self {
        ScOrCuckoo::new(scalable_params(), replica).unwrap()
    }
    fn import_from(&mut self, dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        Some(self.import(&dump.live_occurrences()))
    }
    fn listed_dots(&self) -> Vec<Dot> {
        self.dots()
    }
    const DELTAS_MAY_RUN_AHEAD: bool = true;
    fn add_tracked(&mut self, it: &[u8]) -> Result<Option<Dot>, FilterError> {
        self.add_dot(it).map(Some)
    }
    fn remove_tracked(&mut self, it: &[u8]) -> Option<Option<Dot>> {
        Some(self.remove_dot(it))
    }
    fn live(&self) -> Option<BTreeSet<Dot>> {
        Some(self.dots().into_iter().collect())
    }
}

impl Subject for WriterScGBloom {
    fn make(replica: u16) -> Self {
        WriterScGBloom::new(scalable_params(), replica).unwrap()
    }
}

impl Subject for WriterScGCuckoo {
    fn make(replica: u16) -> Self {
        WriterScGCuckoo::new(scalable_params(), replica).unwrap()
    }
}

impl Subject for WriterScOrCuckoo {
    fn make(replica: u16) -> Self {
        WriterScOrCuckoo::new(scalable_params(), replica).unwrap()
    }
    fn import_from(&mut self, dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        Some(self.import(&dump.live_occurrences()))
    }
    fn listed_dots(&self) -> Vec<Dot> {
        self.parts().flat_map(|(_, f)| f.dots()).collect()
    }
    const DELTAS_MAY_RUN_AHEAD: bool = true;
    fn remove_tracked(&mut self, it: &[u8]) -> Option<Option<Dot>> {
        // The partitioned type removes through `Removable`; recover the tag from the change.
        let before: BTreeSet<Dot> = self.live().unwrap();
        self.remove(it);
        let after = self.live().unwrap();
        Some(before.difference(&after).next().copied())
    }
    fn add_tracked(&mut self, it: &[u8]) -> Result<Option<Dot>, FilterError> {
        let before: BTreeSet<Dot> = self.live().unwrap();
        self.add(it)?;
        Ok(self.live().unwrap().difference(&before).next().copied())
    }
    fn live(&self) -> Option<BTreeSet<Dot>> {
        Some(self.parts().flat_map(|(_, f)| f.dots()).collect())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize, u16),
    Remove(usize, u16),
    Merge(usize, usize),
    /// Replica `.1` loads a dump of replica `.0`'s state (`Subject::import_from`).
    Import(usize, usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        5 => (0..3usize, 0..UNIVERSE).prop_map(|(r, i)| Op::Add(r, i)),
        2 => (0..3usize, 0..UNIVERSE).prop_map(|(r, i)| Op::Remove(r, i)),
        2 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Merge(a, b)),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Import(a, b)),
    ];
    prop::collection::vec(op, 1..80)
}

/// The exact semantics a replica must show: the items it has observed being added (grow-only
/// types), or an ORSet of tags (observed-remove types).
#[derive(Debug, Clone, Default)]
struct Model {
    items: BTreeSet<u16>,
    live: BTreeMap<Dot, u16>,
    seen: BTreeSet<Dot>,
}

impl Model {
    fn merge(&mut self, other: &Model) {
        self.items.extend(&other.items);
        let keep: BTreeMap<Dot, u16> = self
            .live
            .iter()
            .filter(|(d, _)| other.live.contains_key(d) || !other.seen.contains(d))
            .chain(other.live.iter().filter(|(d, _)| !self.seen.contains(d)))
            .map(|(d, i)| (*d, *i))
            .collect();
        self.live = keep;
        self.seen.extend(&other.seen);
    }
}

fn merged<S: Subject>(a: &S, b: &S) -> S {
    let mut m = a.clone();
    m.merge(b).expect("compatible");
    m
}

fn assert_same_contents<S: Subject>(a: &S, b: &S) {
    for i in 0..UNIVERSE {
        assert_eq!(a.contains(&item(i)), b.contains(&item(i)), "item {i}");
    }
    assert_eq!(a.live(), b.live());
}

fn run<S: Subject>(ops: Vec<Op>) {
    let mut reps: Vec<S> = (0..3).map(|r| S::make(r as u16 + 1)).collect();
    let mut models = vec![Model::default(); 3];
    for op in ops {
        match op {
            Op::Add(r, i) => {
                let before = reps[r].clone();
                match reps[r].add_tracked(&item(i)) {
                    Ok(dot) => {
                        assert!(before.le(&reps[r]), "add must inflate");
                        models[r].items.insert(i);
                        if let Some(d) = dot {
                            assert!(
                                models.iter().all(|m| !m.seen.contains(&d)),
                                "tag {d:?} issued twice"
                            );
                            models[r].live.insert(d, i);
                            models[r].seen.insert(d);
                        }
                    }
                    Err(FilterError::Full { .. }) => {
                        assert!(before.equivalent(&reps[r]), "failed add changed the state");
                        assert_same_contents(&before, &reps[r]);
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Op::Remove(r, i) => {
                let before = reps[r].clone();
                if let Some(removed) = reps[r].remove_tracked(&item(i)) {
                    assert!(before.le(&reps[r]), "remove must inflate");
                    assert_eq!(removed.is_some(), before.contains(&item(i)));
                    if let Some(d) = removed {
                        assert!(
                            models[r].live.remove(&d).is_some(),
                            "removed a tag that was not live"
                        );
                    }
                }
            }
            Op::Merge(from, to) => {
                let (src, dst) = (reps[from].clone(), reps[to].clone());
                reps[to].merge(&src).unwrap();
                assert!(
                    src.le(&reps[to]) && dst.le(&reps[to]),
                    "merge is an upper bound"
                );
                let m = models[from].clone();
                models[to].merge(&m);
            }
            Op::Import(from, to) => {
                let (dump, before) = (reps[from].clone(), reps[to].clone());
                let Some(imported) = reps[to].import_from(&dump) else {
                    continue;
                };
                let tags = match imported {
                    Ok(tags) => tags,
                    // Tables this small fill: a dump that does not fit beside what the
                    // replica holds (its own, loaded into itself) is refused whole.
                    Err(FilterError::NoRoom { .. }) => {
                        assert!(
                            before.equivalent(&reps[to]),
                            "a failed import changed the state"
                        );
                        assert_same_contents(&before, &reps[to]);
                        continue;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                };
                assert!(before.le(&reps[to]), "an import must inflate");
                let m = models[from].clone();
                let listed = dump.listed_dots();
                if dump.live().is_none() {
                    // Counted: the dump's items, as this replica's own counts.
                    models[to].items.extend(&m.items);
                    continue;
                }
                // Each entry again, as an add of this replica: a fresh tag of its own.
                assert_eq!(tags.len(), listed.len());
                for (tag, src) in tags.into_iter().zip(listed) {
                    assert_eq!(tag.replica, to as u16 + 1, "a tag of another replica");
                    assert!(
                        models.iter().all(|m| !m.seen.contains(&tag)),
                        "tag {tag:?} issued twice"
                    );
                    let i = m.live[&src];
                    models[to].items.insert(i);
                    models[to].live.insert(tag, i);
                    models[to].seen.insert(tag);
                }
            }
        }
    }
    // No false negatives, and for tagged types exactly the ORSet's live tags.
    for (rep, model) in reps.iter().zip(&models) {
        match rep.live() {
            None => {
                for &i in &model.items {
                    assert!(rep.contains(&item(i)), "false negative for {i}");
                }
            }
            Some(live) => {
                assert_eq!(live, model.live.keys().copied().collect::<BTreeSet<_>>());
                for &i in model.live.values() {
                    assert!(rep.contains(&item(i)), "false negative for {i}");
                }
            }
        }
    }
    let [a, b, c] = [&reps[0], &reps[1], &reps[2]];
    // Idempotence, commutativity, associativity up to equivalence.
    assert!(merged(a, a).equivalent(a));
    assert!(merged(a, b).equivalent(&merged(b, a)));
    assert!(merged(&merged(a, b), c).equivalent(&merged(a, &merged(b, c))));
    // le agrees with merge, on incomparable and on ordered pairs.
    let ab = merged(a, b);
    for (x, y) in [(a, b), (b, a), (a, &ab), (&ab, a), (c, &ab)] {
        assert_eq!(x.le(y), merged(x, y).equivalent(y));
    }
    assert!(a.le(&ab) && b.le(&ab));
    // Serde round trip preserves equivalence and contents.
    for r in [a, b, c, &ab] {
        let bytes = serde_cbor::to_vec(r).unwrap();
        let back: S = serde_cbor::from_slice(&bytes).unwrap();
        assert!(back.equivalent(r));
        assert_same_contents(&back, r);
    }
}

/// Replicas exchange only delta-states, which arrive late, out of order, twice, or (with
/// `lossy`) not at all. Once every delta is delivered, or anti-entropy has merged full states
/// after losses, every replica is equivalent to the join of all full states.
fn run_deltas<S: Subject>(ops: Vec<Op>, seed: u64, lossy: bool) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut reps: Vec<S> = (0..3).map(|r| S::make(r as u16 + 1)).collect();
    for r in &mut reps {
        r.track_deltas(true);
    }
    let mut in_flight: Vec<(usize, S::Delta)> = Vec::new();
    let flush = |from: usize, rep: &mut S, in_flight: &mut Vec<(usize, S::Delta)>| {
        if let Some(d) = rep.take_delta() {
            for to in (0..3).filter(|&t| t != from) {
                in_flight.push((to, d.clone()));
            }
        }
    };
    // An import's delta may name a sub-filter too far ahead of a receiver, which refuses it
    // (changing nothing) until it has caught up; none other may be refused.
    let mut imported = false;
    let deliver = |rep: &mut S, d: &S::Delta, imported: bool| -> bool {
        let before = rep.clone();
        match rep.merge_delta(d) {
            Ok(()) => {
                assert!(before.le(rep), "a delta must inflate");
                true
            }
            Err(e) => {
                assert!(imported && S::DELTAS_MAY_RUN_AHEAD, "delta refused: {e}");
                assert!(rep.equivalent(&before), "a refused delta changed the state");
                false
            }
        }
    };
    let mut refused = false;
    for op in ops {
        match op {
            Op::Add(r, i) => {
                let _ = reps[r].add(&item(i));
            }
            Op::Remove(r, i) => {
                let _ = reps[r].remove_tracked(&item(i));
            }
            Op::Import(from, to) => {
                let dump = reps[from].clone();
                imported |= matches!(reps[to].import_from(&dump), Some(Ok(_)));
            }
            Op::Merge(from, _) => {
                flush(from, &mut reps[from], &mut in_flight);
                if !in_flight.is_empty() {
                    let k = rng.usize(..in_flight.len());
                    let (to, d) = in_flight.swap_remove(k);
                    if !deliver(&mut reps[to], &d, imported) || rng.bool() {
                        in_flight.push((to, d)); // delivered (again) later
                    }
                }
            }
        }
    }
    for (r, rep) in reps.iter_mut().enumerate() {
        flush(r, rep, &mut in_flight);
    }
    rng.shuffle(&mut in_flight);
    // Rounds until every delta not lost is taken or no more is: a refused one may fit once
    // the receiver took the others.
    let mut pending: Vec<(usize, S::Delta)> = in_flight
        .into_iter()
        .filter(|_| !(lossy && rng.u8(..3) == 0))
        .collect();
    loop {
        let n = pending.len();
        pending.retain(|(to, d)| !deliver(&mut reps[*to], d, imported));
        if pending.is_empty() || pending.len() == n {
            break;
        }
    }
    refused |= !pending.is_empty();
    if lossy || refused {
        // Anti-entropy: a ring of full-state merges, twice round.
        for k in 0..6 {
            let src = reps[k % 3].clone();
            reps[(k + 1) % 3].merge(&src).unwrap();
        }
    }
    let mut all = reps[0].clone();
    all.merge(&reps[1]).unwrap();
    all.merge(&reps[2]).unwrap();
    for (r, rep) in reps.iter().enumerate() {
        assert!(rep.equivalent(&all), "replica {r} did not converge");
        assert_same_contents(rep, &all);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test] fn gbloom_laws(ops in ops()) { run::<GBloom>(ops) }
    #[test] fn shared_gbloom_laws(ops in ops()) { run::<crpf::SharedGBloom>(ops) }
    #[test] fn go_bloom_laws(ops in ops()) { run::<crpf::GoBloom>(ops) }
    #[test] fn blocked_bloom_laws(ops in ops()) { run::<crpf::BlockedBloom>(ops) }
    #[test] fn go_bloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<crpf::GoBloom>(ops, seed, lossy) }
    #[test] fn blocked_bloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<crpf::BlockedBloom>(ops, seed, lossy) }
    #[test] fn blocked_bloom_two_blocks_laws(ops in ops()) { TWO_BLOCKS.set(true); run::<crpf::BlockedBloom>(ops) }
    #[test] fn blocked_bloom_two_blocks_deltas(ops in ops(), seed: u64, lossy: bool) { TWO_BLOCKS.set(true); run_deltas::<crpf::BlockedBloom>(ops, seed, lossy) }
    #[test] fn gcuckoo_laws(ops in ops()) { run::<GCuckoo>(ops) }
    #[test] fn orcuckoo_laws(ops in ops()) { run::<OrCuckoo>(ops) }
    #[test] fn sc_gbloom_laws(ops in ops()) { run::<ScGBloom>(ops) }
    #[test] fn sc_gcuckoo_laws(ops in ops()) { run::<ScGCuckoo>(ops) }
    #[test] fn sc_orcuckoo_laws(ops in ops()) { run::<ScOrCuckoo>(ops) }

    #[test] fn gbloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<GBloom>(ops, seed, lossy) }
    #[test] fn shared_gbloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<crpf::SharedGBloom>(ops, seed, lossy) }
    #[test] fn gcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<GCuckoo>(ops, seed, lossy) }
    #[test] fn orcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<OrCuckoo>(ops, seed, lossy) }
    #[test] fn sc_gbloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<ScGBloom>(ops, seed, lossy) }
    #[test] fn sc_gcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<ScGCuckoo>(ops, seed, lossy) }
    #[test] fn writer_sc_gbloom_laws(ops in ops()) { run::<WriterScGBloom>(ops) }
    #[test] fn writer_sc_gcuckoo_laws(ops in ops()) { run::<WriterScGCuckoo>(ops) }
    #[test] fn writer_sc_orcuckoo_laws(ops in ops()) { run::<WriterScOrCuckoo>(ops) }
    #[test] fn writer_sc_gbloom_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<WriterScGBloom>(ops, seed, lossy) }
    #[test] fn writer_sc_gcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<WriterScGCuckoo>(ops, seed, lossy) }
    #[test] fn writer_sc_orcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<WriterScOrCuckoo>(ops, seed, lossy) }
    #[test] fn sc_orcuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<ScOrCuckoo>(ops, seed, lossy) }

    // RedisBloom's other EXPANSION and BUCKETSIZE values (issue 49).
    #[test] fn sc_gbloom_growth_1_laws(ops in ops()) { shaped(1, 4, || run::<ScGBloom>(ops)) }
    #[test] fn writer_sc_gbloom_growth_1_deltas(ops in ops(), seed: u64, lossy: bool) { shaped(1, 4, || run_deltas::<WriterScGBloom>(ops, seed, lossy)) }
    #[test] fn writer_sc_gbloom_growth_3_laws(ops in ops()) { shaped(3, 4, || run::<WriterScGBloom>(ops)) }
    #[test] fn gcuckoo_buckets_1_laws(ops in ops()) { shaped(2, 1, || run::<GCuckoo>(ops)) }
    #[test] fn orcuckoo_buckets_2_laws(ops in ops()) { shaped(2, 2, || run::<OrCuckoo>(ops)) }
    #[test] fn orcuckoo_buckets_8_deltas(ops in ops(), seed: u64, lossy: bool) { shaped(2, 8, || run_deltas::<OrCuckoo>(ops, seed, lossy)) }
    #[test] fn writer_sc_orcuckoo_growth_1_buckets_2_laws(ops in ops()) { shaped(1, 2, || run::<WriterScOrCuckoo>(ops)) }
    #[test] fn writer_sc_orcuckoo_growth_4_buckets_8_deltas(ops in ops(), seed: u64, lossy: bool) { shaped(4, 8, || run_deltas::<WriterScOrCuckoo>(ops, seed, lossy)) }
    #[test] fn sc_gcuckoo_growth_3_buckets_3_laws(ops in ops()) { shaped(3, 3, || run::<ScGCuckoo>(ops)) }
}

/// Replicas whose adds fail for every reason an add can fail: a full cuckoo table, a series
/// that cannot grow past its first sub-filter (the second would exceed `MAX_FILTER_BYTES`),
/// and, for tagged types, replica 3 with six timestamps left.
trait Cramped: Subject {
    fn cramped(replica: u16) -> Self;
    fn clock_of(&self) -> u64 {
        0
    }
}

fn cramped_params() -> ScalableParams {
    ScalableParams {
        growth: u32::MAX,
        ..scalable_params()
    }
}

const LAST_TIMESTAMPS: u64 = crpf::MAX_COUNTER - 6;

impl Cramped for GCuckoo {
    fn cramped(r: u16) -> Self {
        Self::make(r)
    }
}
impl Cramped for OrCuckoo {
    fn cramped(r: u16) -> Self {
        let mut f = Self::make(r);
        if r == 3 {
            f.advance_clock(LAST_TIMESTAMPS);
        }
        f
    }
    fn clock_of(&self) -> u64 {
        self.clock()
    }
}
impl Cramped for ScGBloom {
    fn cramped(_: u16) -> Self {
        ScGBloom::new(cramped_params()).unwrap()
    }
}
impl Cramped for ScGCuckoo {
    fn cramped(_: u16) -> Self {
        ScGCuckoo::new(cramped_params()).unwrap()
    }
}
impl Cramped for ScOrCuckoo {
    fn cramped(r: u16) -> Self {
        let mut f = ScOrCuckoo::new(cramped_params(), r).unwrap();
        if r == 3 {
            f.advance_clock(LAST_TIMESTAMPS);
        }
        f
    }
    fn clock_of(&self) -> u64 {
        self.clock()
    }
}
impl Cramped for WriterScGBloom {
    fn cramped(r: u16) -> Self {
        WriterScGBloom::new(cramped_params(), r).unwrap()
    }
}
impl Cramped for WriterScGCuckoo {
    fn cramped(r: u16) -> Self {
        WriterScGCuckoo::new(cramped_params(), r).unwrap()
    }
}
impl Cramped for WriterScOrCuckoo {
    fn cramped(r: u16) -> Self {
        let mut f = WriterScOrCuckoo::new(cramped_params(), r).unwrap();
        if r == 3 {
            f.advance_clock(LAST_TIMESTAMPS);
        }
        f
    }
    fn clock_of(&self) -> u64 {
        self.clock()
    }
}

/// Everything a failed add must leave as it was: the encoded state, the clock, and the
/// pending delta.
fn snapshot<S: Cramped>(s: &S) -> (Vec<u8>, u64, usize, Vec<u8>) {
    let delta = s.clone().take_delta();
    (
        serde_cbor::to_vec(s).unwrap(),
        s.clock_of(),
        s.pending_delta_len(),
        serde_cbor::to_vec(&delta).unwrap(),
    )
}

/// A failed add changes nothing at all, and no tag is ever issued twice, whatever failed
/// before (DESIGN.md section 2 and 4).
fn run_failures<S: Cramped>(ops: Vec<Op>) {
    let mut reps: Vec<S> = (1..=3).map(S::cramped).collect();
    reps.iter_mut().for_each(|r| r.track_deltas(true));
    let mut issued = BTreeSet::new();
    let mut failures = 0;
    for op in ops {
        match op {
            Op::Add(r, i) => {
                let before = snapshot(&reps[r]);
                match reps[r].add_tracked(&item(i)) {
                    Ok(Some(dot)) => assert!(issued.insert(dot), "tag {dot:?} issued twice"),
                    Ok(None) => {}
                    Err(_) => {
                        failures += 1;
                        assert_eq!(snapshot(&reps[r]), before, "a failed add changed something");
                    }
                }
            }
            Op::Remove(r, i) => {
                let _ = reps[r].remove_tracked(&item(i));
            }
            Op::Merge(from, to) => {
                let src = reps[from].clone();
                reps[to].merge(&src).unwrap();
            }
            Op::Import(from, to) => {
                let dump = reps[from].clone();
                let before = snapshot(&reps[to]);
                match reps[to].import_from(&dump) {
                    Some(Ok(tags)) => {
                        for dot in tags {
                            assert!(issued.insert(dot), "tag {dot:?} issued twice");
                        }
                    }
                    Some(Err(_)) => {
                        failures += 1;
                        assert_eq!(
                            snapshot(&reps[to]),
                            before,
                            "a failed import changed something"
                        );
                    }
                    None => {}
                }
            }
        }
    }
    let _ = failures;
}

fn cramped_ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => (0..3usize, 0..UNIVERSE).prop_map(|(r, i)| Op::Add(r, i)),
        2 => (0..3usize, 0..UNIVERSE).prop_map(|(r, i)| Op::Remove(r, i)),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Merge(a, b)),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Import(a, b)),
    ];
    prop::collection::vec(op, 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]
    #[test] fn gcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<GCuckoo>(ops) }
    #[test] fn orcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<OrCuckoo>(ops) }
    #[test] fn sc_gbloom_failed_adds(ops in cramped_ops()) { run_failures::<ScGBloom>(ops) }
    #[test] fn sc_gcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<ScGCuckoo>(ops) }
    #[test] fn sc_orcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<ScOrCuckoo>(ops) }
    #[test] fn writer_sc_gbloom_failed_adds(ops in cramped_ops()) { run_failures::<WriterScGBloom>(ops) }
    #[test] fn writer_sc_gcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<WriterScGCuckoo>(ops) }
    #[test] fn writer_sc_orcuckoo_failed_adds(ops in cramped_ops()) { run_failures::<WriterScOrCuckoo>(ops) }
}

#[test]
fn incompatible_merge_leaves_state_untouched() {
    let mut a = GBloom::with_capacity(100, 0.01).unwrap();
    a.add(b"x").unwrap();
    let b = GBloom::with_capacity(100, 0.02).unwrap();
    let before = a.clone();
    assert!(matches!(a.merge(&b), Err(FilterError::Incompatible(_))));
    assert_eq!(a, before);
    let mut c = GCuckoo::with_capacity(100, 0.01).unwrap();
    c.add(b"x").unwrap();
    let d = GCuckoo::new(c.params().with_seed(9)).unwrap();
    assert!(matches!(c.merge(&d), Err(FilterError::Incompatible(_))));
    assert!(c.contains(b"x") && c.cardinality() == 1.0);
    let mut e = OrCuckoo::with_capacity(100, 0.01, 1).unwrap();
    let f = OrCuckoo::with_capacity(200, 0.01, 2).unwrap();
    assert!(e.merge(&f).is_err());
    let mut g = ScGBloom::with_capacity(100, 0.01).unwrap();
    assert!(
        g.merge(&ScGBloom::with_capacity(100, 0.02).unwrap())
            .is_err()
    );
    let mut h = ScOrCuckoo::with_capacity(100, 0.01, 1).unwrap();
    assert!(
        h.merge(&ScOrCuckoo::with_capacity(101, 0.01, 1).unwrap())
            .is_err()
    );
}

// ---------------------------------------------------------------- issue 11: expiring and
// atomic Bloom filters. The expiring filter runs the generic laws above (all in one epoch) and
// its own, with replicas whose clocks tick independently; the atomic filter is checked to be
// bit for bit the `GBloom` it snapshots to, under the same operations, so the GBloom laws
// carry over.

mod issue11 {
    use super::*;
    use crpf::{AtomicGBloom, ExpiringBloom, ExpiringParams};

    const EPOCH: u64 = 10;

    fn expiring_params() -> ExpiringParams {
        ExpiringParams {
            bloom: BloomParams {
                bits: 120,
                hashes: 3,
                seed: 5,
                capacity: 20,
            },
            epoch_len: EPOCH,
            window: 3,
            max_skew: 1,
        }
    }

    impl Subject for ExpiringBloom {
        fn make(_: u16) -> Self {
            ExpiringBloom::new(expiring_params()).unwrap()
        }
    }

    #[derive(Debug, Clone)]
    enum TOp {
        Add(usize, u16),
        /// Replica's clock moves forward by this many time units (a quarter epoch to 2.5).
        Tick(usize, u64),
        Merge(usize, usize),
    }

    fn timed_ops() -> impl Strategy<Value = Vec<TOp>> {
        let op = prop_oneof![
            5 => (0..3usize, 0..UNIVERSE).prop_map(|(r, i)| TOp::Add(r, i)),
            2 => (0..3usize, 0..25u64).prop_map(|(r, dt)| TOp::Tick(r, dt)),
            2 => (0..3usize, 0..3usize).prop_map(|(a, b)| TOp::Merge(a, b)),
        ];
        prop::collection::vec(op, 1..80)
    }

    /// What a replica must hold: its clock and the (epoch, item) pairs of the live window.
    #[derive(Debug, Clone, Default)]
    struct TModel {
        newest: u64,
        items: BTreeSet<(u64, u16)>,
    }

    impl TModel {
        fn raise(&mut self, epoch: u64) {
            self.newest = self.newest.max(epoch);
            let low = self.newest.saturating_sub(2);
            self.items.retain(|(e, _)| *e >= low);
        }
        fn merge(&mut self, other: &TModel) {
            self.items.extend(&other.items);
            self.raise(other.newest);
        }
    }

    /// Idempotence, commutativity, associativity, `le` agreeing with merge, serde round trip.
    fn lattice_laws<S: Subject>(a: &S, b: &S, c: &S) {
        assert!(merged(a, a).equivalent(a));
        assert!(merged(a, b).equivalent(&merged(b, a)));
        assert!(merged(&merged(a, b), c).equivalent(&merged(a, &merged(b, c))));
        let ab = merged(a, b);
        for (x, y) in [(a, b), (b, a), (a, &ab), (&ab, a), (c, &ab)] {
            assert_eq!(x.le(y), merged(x, y).equivalent(y));
        }
        assert!(a.le(&ab) && b.le(&ab));
        for r in [a, b, c, &ab] {
            let bytes = serde_cbor::to_vec(r).unwrap();
            let back: S = serde_cbor::from_slice(&bytes).unwrap();
            assert!(back.equivalent(r));
            assert_same_contents(&back, r);
        }
    }

    /// Replicas add at their own clocks, tick and merge. Every add and tick inflates; each
    /// replica holds exactly the epochs of its model's live window and clock, with no false
    /// negative for a live element; the laws hold on the end states.
    fn run_expiring(ops: Vec<TOp>) {
        let mut reps: Vec<ExpiringBloom> = (0..3).map(ExpiringBloom::make).collect();
        let mut clocks = [0u64; 3];
        let mut models = vec![TModel::default(); 3];
        for op in ops {
            match op {
                TOp::Add(r, i) => {
                    let before = reps[r].clone();
                    reps[r].add_at(&item(i), clocks[r]);
                    assert!(before.le(&reps[r]), "add must inflate");
                    models[r].raise(clocks[r] / EPOCH);
                    let e = models[r].newest;
                    models[r].items.insert((e, i));
                }
                TOp::Tick(r, dt) => {
                    clocks[r] += dt;
                    let before = reps[r].clone();
                    reps[r].advance_to(clocks[r]);
                    assert!(before.le(&reps[r]), "advancing the clock must inflate");
                    models[r].raise(clocks[r] / EPOCH);
                }
                TOp::Merge(from, to) => {
                    let (src, dst) = (reps[from].clone(), reps[to].clone());
                    reps[to].merge(&src).unwrap();
                    assert!(src.le(&reps[to]) && dst.le(&reps[to]));
                    let m = models[from].clone();
                    models[to].merge(&m);
                }
            }
        }
        for (rep, model) in reps.iter().zip(&models) {
            assert_eq!(rep.newest_epoch(), model.newest);
            let epochs: BTreeSet<u64> = rep.live_epochs().map(|(e, _)| e).collect();
            let live: BTreeSet<u64> = model.items.iter().map(|(e, _)| *e).collect();
            assert_eq!(epochs, live, "dropped epochs still held, or live ones lost");
            for (_, i) in &model.items {
                assert!(rep.contains(&item(*i)), "false negative for live {i}");
            }
        }
        lattice_laws(&reps[0], &reps[1], &reps[2]);
    }

    /// Delta-states only, late, duplicated, reordered or (lossy) lost then repaired by
    /// anti-entropy, with clocks ticking: all replicas converge to the join of all states.
    fn run_expiring_deltas(ops: Vec<TOp>, seed: u64, lossy: bool) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut reps: Vec<ExpiringBloom> = (0..3).map(ExpiringBloom::make).collect();
        reps.iter_mut().for_each(|r| r.track_deltas(true));
        let mut clocks = [0u64; 3];
        let mut in_flight: Vec<(usize, crpf::ExpiringDelta)> = Vec::new();
        let flush = |from: usize, rep: &mut ExpiringBloom, q: &mut Vec<_>| {
            if let Some(d) = rep.take_delta() {
                for to in (0..3).filter(|&t| t != from) {
                    q.push((to, d.clone()));
                }
            }
        };
        for op in ops {
            match op {
                TOp::Add(r, i) => reps[r].add_at(&item(i), clocks[r]),
                TOp::Tick(r, dt) => {
                    clocks[r] += dt;
                    reps[r].advance_to(clocks[r]);
                }
                TOp::Merge(from, _) => {
                    flush(from, &mut reps[from], &mut in_flight);
                    if !in_flight.is_empty() {
                        let (to, d) = in_flight.swap_remove(rng.usize(..in_flight.len()));
                        let before = reps[to].clone();
                        reps[to].merge_delta(&d).unwrap();
                        assert!(before.le(&reps[to]), "a delta must inflate");
                        if rng.bool() {
                            in_flight.push((to, d));
                        }
                    }
                }
            }
        }
        for (r, rep) in reps.iter_mut().enumerate() {
            flush(r, rep, &mut in_flight);
        }
        rng.shuffle(&mut in_flight);
        for (to, d) in in_flight {
            if !(lossy && rng.u8(..3) == 0) {
                reps[to].merge_delta(&d).unwrap();
            }
        }
        if lossy {
            for k in 0..6 {
                let src = reps[k % 3].clone();
                reps[(k + 1) % 3].merge(&src).unwrap();
            }
        }
        let mut all = reps[0].clone();
        all.merge(&reps[1]).unwrap();
        all.merge(&reps[2]).unwrap();
        for (r, rep) in reps.iter().enumerate() {
            assert!(rep.equivalent(&all), "replica {r} did not converge");
            assert_same_contents(rep, &all);
        }
    }

    fn bloom_params() -> BloomParams {
        BloomParams {
            bits: 200,
            hashes: 3,
            seed: 1,
            capacity: 40,
        }
    }

    /// The same adds and merges on `AtomicGBloom`s (through `&self`) and on `GBloom`s: after
    /// every step the snapshots are exactly the `GBloom`s, so every `GBloom` law holds of them;
    /// adds and merges inflate the snapshots; a merged-in state is `≤` the result.
    fn run_atomic(ops: Vec<Op>) {
        let atomic: Vec<AtomicGBloom> = (0..3)
            .map(|_| AtomicGBloom::new(bloom_params()).unwrap())
            .collect();
        let mut plain: Vec<GBloom> = (0..3)
            .map(|_| GBloom::new(bloom_params()).unwrap())
            .collect();
        for op in ops {
            let (r, before) = match op {
                Op::Add(r, i) | Op::Remove(r, i) => {
                    let before = atomic[r].snapshot();
                    assert_eq!(
                        atomic[r].test_and_add(&item(i)),
                        plain[r].test_and_add(&item(i))
                    );
                    (r, before)
                }
                // A grow-only filter's dump is merged when loaded.
                Op::Merge(from, to) | Op::Import(from, to) => {
                    let before = atomic[to].snapshot();
                    let src = atomic[from].snapshot();
                    atomic[to].merge_from(&src).unwrap();
                    assert!(src.le(&atomic[to].snapshot()));
                    let p = plain[from].clone();
                    plain[to].merge(&p).unwrap();
                    (to, before)
                }
            };
            assert!(before.le(&atomic[r].snapshot()), "an update must inflate");
            assert_eq!(atomic[r].snapshot(), plain[r], "differs from GBloom");
        }
        let snaps: Vec<GBloom> = atomic.iter().map(AtomicGBloom::snapshot).collect();
        lattice_laws(&snaps[0], &snaps[1], &snaps[2]);
        // The intersection is the meet of the bit arrays: below both, above anything below
        // both, and it keeps every element of both sides.
        let i = snaps[0].intersect(&snaps[1]).unwrap();
        assert!(i.le(&snaps[0]) && i.le(&snaps[1]));
        let both = snaps[2]
            .intersect(&snaps[0])
            .unwrap()
            .intersect(&snaps[1])
            .unwrap();
        assert!(both.le(&i));
        for x in 0..UNIVERSE {
            if snaps[0].contains(&item(x)) && snaps[1].contains(&item(x)) {
                assert!(i.contains(&item(x)));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test] fn expiring_laws(ops in ops()) { run::<ExpiringBloom>(ops) }
        #[test] fn expiring_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<ExpiringBloom>(ops, seed, lossy) }
        #[test] fn expiring_timed_laws(ops in timed_ops()) { run_expiring(ops) }
        #[test] fn expiring_timed_deltas(ops in timed_ops(), seed: u64, lossy: bool) { run_expiring_deltas(ops, seed, lossy) }
        #[test] fn atomic_gbloom_is_gbloom(ops in ops()) { run_atomic(ops) }
    }

    #[test]
    fn expiring_incompatible_merge_leaves_state_untouched() {
        let mut a = ExpiringBloom::make(1);
        a.add_at(b"x", 25);
        let before = a.clone();
        let b = ExpiringBloom::new(ExpiringParams {
            window: 4,
            ..expiring_params()
        })
        .unwrap();
        assert!(matches!(a.merge(&b), Err(FilterError::Incompatible(_))));
        assert_eq!(
            serde_cbor::to_vec(&a).unwrap(),
            serde_cbor::to_vec(&before).unwrap()
        );
        let g = GBloom::new(bloom_params().with_seed(2)).unwrap();
        assert!(
            AtomicGBloom::new(bloom_params())
                .unwrap()
                .merge_from(&g)
                .is_err()
        );
        assert!(GBloom::new(bloom_params()).unwrap().intersect(&g).is_err());
    }
}
// ---------------------------------------------------------------- counting cuckoo filter (issue 11)

use crpf::CountingCuckoo;

/// 16-bit fingerprints, so that the `UNIVERSE` items have distinct slot keys (checked by
/// `counting_items_do_not_collide`) and the model below can be per item; 6 buckets, so that
/// tables fill, kicks fail and merges overflow buckets.
fn counting_params() -> CuckooParams {
    CuckooParams {
        fingerprint_bits: 16,
        ..cuckoo_params(4)
    }
}

impl Subject for CountingCuckoo {
    fn make(replica: u16) -> Self {
        CountingCuckoo::new(counting_params(), replica).unwrap()
    }
    fn import_from(&mut self, dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        Some(self.import(&dump.live_occurrences()).map(|_| Vec::new()))
    }
}

impl Cramped for CountingCuckoo {
    fn cramped(r: u16) -> Self {
        Self::make(r)
    }
}

#[test]
fn counting_items_do_not_collide() {
    // Every item in its own slot: adding each once to a large table gives UNIVERSE slots.
    let mut f = CountingCuckoo::new(
        CuckooParams {
            max_kicks: 500,
            ..counting_params()
        },
        1,
    )
    .unwrap();
    let mut added = 0;
    for i in 0..UNIVERSE {
        if f.add(&item(i)).is_ok() {
            added += 1;
        }
    }
    assert_eq!(f.slot_count(), added, "two items share a slot key");
    assert!(
        added >= COUNT_ITEMS as usize,
        "the items of `run_counting` were all checked"
    );
}

#[derive(Debug, Clone)]
enum CountOp {
    /// Replica, item, occurrences.
    Add(usize, u16, u64),
    /// Replica, item, occurrences.
    Remove(usize, u16, u64),
    Merge(usize, usize),
}

const COUNT_REPLICAS: usize = 4;
const COUNT_ITEMS: u16 = 12;

fn count_ops() -> impl Strategy<Value = Vec<CountOp>> {
    let r = 0..COUNT_REPLICAS;
    let op = prop_oneof![
        5 => (r.clone(), 0..COUNT_ITEMS, 1..4u64).prop_map(|(r, i, n)| CountOp::Add(r, i, n)),
        4 => (r.clone(), 0..COUNT_ITEMS, 1..4u64).prop_map(|(r, i, n)| CountOp::Remove(r, i, n)),
        3 => (r.clone(), r).prop_map(|(a, b)| CountOp::Merge(a, b)),
    ];
    prop::collection::vec(op, 1..100)
}

/// What a replica has observed, by update: `(id, item, occurrences)` of the adds and the
/// (effective) removes. Unions on merge.
#[derive(Debug, Clone, Default)]
struct CountModel {
    adds: BTreeSet<(u64, u16, u64)>,
    removes: BTreeSet<(u64, u16, u64)>,
}

impl CountModel {
    fn sum(set: &BTreeSet<(u64, u16, u64)>, i: u16) -> u64 {
        set.iter().filter(|e| e.1 == i).map(|e| e.2).sum()
    }
    /// The bounds a replica's multiplicity must keep: every observed add counts (adds are never
    /// lost) and every observed remove takes at most what it removed (concurrent removes of
    /// one occurrence count once), so `adds - removes <= count <= adds`.
    fn check(&self, f: &CountingCuckoo, what: &str) {
        for i in 0..COUNT_ITEMS {
            let (a, r) = (Self::sum(&self.adds, i), Self::sum(&self.removes, i));
            let c = f.count(&item(i));
            assert!(
                a.saturating_sub(r) <= c && c <= a,
                "{what}: item {i} counted {c}, observed {a} added and {r} removed"
            );
            if a > r {
                assert!(f.contains(&item(i)), "{what}: false negative for {i}");
            }
        }
    }
}

/// Increments and decrements at several replicas, merged (full states, or with `deltas`
/// delta-states delivered late, twice and out of order) in random orders. Checks at every
/// step that updates inflate, removes are refused exactly at 0 and the bounds of
/// [`CountModel::check`] hold; at the end, that the lattice laws hold and that every replica,
/// whatever the order it merged in, has the same multiplicity of every element, with each
/// source's adds counted exactly.
fn run_counting(ops: Vec<CountOp>, seed: u64, deltas: bool) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut reps: Vec<CountingCuckoo> = (0..COUNT_REPLICAS)
        .map(|r| CountingCuckoo::make(r as u16 + 1))
        .collect();
    reps.iter_mut().for_each(|r| r.track_deltas(deltas));
    let mut models = vec![CountModel::default(); COUNT_REPLICAS];
    // Successful adds of each item at each replica: the `added` counts every replica must end
    // up with.
    let mut added: BTreeMap<(u16, u16), u64> = BTreeMap::new();
    let mut in_flight: Vec<(usize, crpf::CountingCuckooDelta)> = Vec::new();
    for (id, op) in ops.into_iter().enumerate() {
        let id = id as u64;
        match op {
            CountOp::Add(r, i, n) => {
                let before = reps[r].clone();
                match reps[r].add_count(&item(i), n) {
                    Ok(m) => {
                        assert!(before.le(&reps[r]) && !reps[r].le(&before), "add inflates");
                        assert_eq!(m, before.count(&item(i)) + n);
                        models[r].adds.insert((id, i, n));
                        *added.entry((i, r as u16 + 1)).or_default() += n;
                    }
                    Err(FilterError::Full { .. }) => {
                        assert!(before.equivalent(&reps[r]), "failed add changed the state");
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            CountOp::Remove(r, i, n) => {
                let before = reps[r].clone();
                let had = before.count(&item(i));
                let done = reps[r].remove_count(&item(i), n);
                assert_eq!(done, n.min(had), "removes what the local view has, no more");
                assert_eq!(reps[r].count(&item(i)), had - done);
                assert!(before.le(&reps[r]), "remove inflates");
                if done > 0 {
                    models[r].removes.insert((id, i, done));
                }
            }
            CountOp::Merge(from, to) if deltas => {
                if let Some(d) = reps[from].take_delta() {
                    for t in (0..COUNT_REPLICAS).filter(|&t| t != from) {
                        in_flight.push((t, d.clone()));
                    }
                }
                if !in_flight.is_empty() {
                    let (t, d) = in_flight.swap_remove(rng.usize(..in_flight.len()));
                    let before = reps[t].clone();
                    reps[t].merge_delta(&d).unwrap();
                    assert!(before.le(&reps[t]), "a delta inflates");
                    if rng.bool() {
                        in_flight.push((t, d));
                    }
                }
                // A delta carries only part of a state, so the bounds are checked on full
                // merges; delta-states are checked against them at the end.
                let _ = to;
            }
            CountOp::Merge(from, to) => {
                let (src, dst) = (reps[from].clone(), reps[to].clone());
                reps[to].merge(&src).unwrap();
                assert!(src.le(&reps[to]) && dst.le(&reps[to]), "upper bound");
                let m = models[from].clone();
                models[to].adds.extend(m.adds);
                models[to].removes.extend(m.removes);
            }
        }
        if !deltas {
            for (r, (rep, model)) in reps.iter().zip(&models).enumerate() {
                model.check(rep, &format!("replica {r}"));
            }
        }
    }
    // Lattice laws over the final states, removes included.
    let [a, b, c, d] = [&reps[0], &reps[1], &reps[2], &reps[3]];
    let m = |x: &CountingCuckoo, y: &CountingCuckoo| {
        let mut z = x.clone();
        z.merge(y).unwrap();
        z
    };
    assert!(m(a, a).equivalent(a));
    assert!(m(a, b).equivalent(&m(b, a)));
    assert!(m(&m(a, b), c).equivalent(&m(a, &m(b, c))));
    let ab = m(a, b);
    for (x, y) in [(a, b), (b, a), (a, &ab), (&ab, a), (c, &ab), (d, &ab)] {
        assert_eq!(x.le(y), m(x, y).equivalent(y));
    }
    // Convergence: every replica joins the others' full states in its own random order.
    let finals: Vec<CountingCuckoo> = (0..COUNT_REPLICAS)
        .map(|r| {
            let mut order: Vec<usize> = (0..COUNT_REPLICAS).filter(|&o| o != r).collect();
            rng.shuffle(&mut order);
            let mut f = reps[r].clone();
            for o in order {
                f.merge(&reps[o]).unwrap();
            }
            f
        })
        .collect();
    let all_model = models.iter().fold(CountModel::default(), |mut acc, m| {
        acc.adds.extend(m.adds.iter().copied());
        acc.removes.extend(m.removes.iter().copied());
        acc
    });
    for (r, f) in finals.iter().enumerate() {
        assert!(f.equivalent(&finals[0]), "replica {r} did not converge");
        assert_eq!(f.entries(), finals[0].entries());
        all_model.check(f, "converged");
        for i in 0..COUNT_ITEMS {
            assert_eq!(f.count(&item(i)), finals[0].count(&item(i)));
            // Every successful add is counted under its replica, exactly once.
            for (src, p, n) in f.counts(&item(i)) {
                assert_eq!(p, added.get(&(i, src)).copied().unwrap_or(0));
                assert!(n <= p, "removed more than added");
            }
        }
    }
    // Delta-states: once every delta is delivered, each replica is the join of all states.
    if deltas {
        for (r, rep) in reps.iter_mut().enumerate() {
            if let Some(d) = rep.take_delta() {
                for t in (0..COUNT_REPLICAS).filter(|&t| t != r) {
                    in_flight.push((t, d.clone()));
                }
            }
        }
        rng.shuffle(&mut in_flight);
        for (t, d) in in_flight {
            reps[t].merge_delta(&d).unwrap();
        }
        for (r, rep) in reps.iter().enumerate() {
            assert!(
                rep.equivalent(&finals[0]),
                "replica {r}: deltas did not converge"
            );
        }
    }
    // Serde round trip of the converged state.
    let bytes = serde_cbor::to_vec(&finals[0]).unwrap();
    let back: CountingCuckoo = serde_cbor::from_slice(&bytes).unwrap();
    assert!(back.equivalent(&finals[0]));
    assert_eq!(back.entries(), finals[0].entries());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test] fn counting_cuckoo_laws(ops in ops()) { run::<CountingCuckoo>(ops) }
    #[test] fn counting_cuckoo_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<CountingCuckoo>(ops, seed, lossy) }
    #[test] fn counting_cuckoo_failed_adds(ops in cramped_ops()) { run_failures::<CountingCuckoo>(ops) }
    #[test] fn counting_multiplicities_converge(ops in count_ops(), seed: u64) { run_counting(ops, seed, false) }
    #[test] fn counting_multiplicities_converge_by_deltas(ops in count_ops(), seed: u64) { run_counting(ops, seed, true) }
}
// ---------------------------------------------------------------- count-min sketch (issue 50)

use crpf::{CmsParams, CountMinSketch};

/// 7 counters in 3 rows: the `UNIVERSE` items collide in every row, so that estimates exceed
/// true counts and the sum over writers is what keeps them from falling below.
fn cms_params() -> CmsParams {
    CmsParams::new(7, 3).unwrap()
}

impl Subject for CountMinSketch {
    fn make(replica: u16) -> Self {
        CountMinSketch::new(cms_params(), replica)
    }
    /// `CMS.MERGE` of the dump: its counts, as this replica's own increments.
    fn import_from(&mut self, dump: &Self) -> Option<Result<Vec<Dot>, FilterError>> {
        Some(
            self.import_occurrences(&dump.live_occurrences())
                .map(|_| Vec::new()),
        )
    }
}

#[derive(Debug, Clone)]
enum CmsOp {
    /// Replica, item, increment.
    Incr(usize, u16, u64),
    /// Receiver, sender: a full state.
    Merge(usize, usize),
    /// Sender: its delta goes in flight to the other two.
    Flush(usize),
    /// Delivers the in-flight delta at this index (modulo), keeping a copy if `.1`.
    Deliver(usize, bool),
}

fn cms_ops() -> impl Strategy<Value = Vec<CmsOp>> {
    let op = prop_oneof![
        6 => (0..3usize, 0..UNIVERSE, 0..5u64).prop_map(|(r, i, n)| CmsOp::Incr(r, i, n)),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| CmsOp::Merge(a, b)),
        2 => (0..3usize).prop_map(CmsOp::Flush),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(k, again)| CmsOp::Deliver(k, again)),
    ];
    prop::collection::vec(op, 1..120)
}

/// What a replica has seen: (replica, its increment number) -> (item, n).
type CmsSeen = BTreeMap<(usize, usize), (u16, u64)>;

/// Three replicas increment concurrently and exchange full states and deltas (late, twice,
/// out of order): every increment inflates, no estimate falls below the increments a replica
/// has seen, and once all is delivered each replica holds exactly the counters (every
/// estimate, every count) of one sketch fed all the increments.
fn run_cms(ops: Vec<CmsOp>) {
    let mut reps: Vec<CountMinSketch> =
        (0..3).map(|r| CountMinSketch::make(r as u16 + 1)).collect();
    for r in &mut reps {
        r.track_deltas(true);
    }
    let mut single = CountMinSketch::make(9);
    let mut seen: Vec<CmsSeen> = vec![BTreeMap::new(); 3];
    let mut made = [0usize; 3];
    let mut in_flight: Vec<(usize, crpf::CmsDelta, CmsSeen)> = Vec::new();
    let mut unsent: Vec<CmsSeen> = vec![BTreeMap::new(); 3];
    for op in ops {
        match op {
            CmsOp::Incr(r, i, n) => {
                let before = reps[r].clone();
                let estimate = reps[r].increment(&item(i), n);
                single.increment(&item(i), n);
                assert!(before.le(&reps[r]), "an increment must inflate");
                assert_eq!(estimate, reps[r].count(&item(i)));
                made[r] += 1;
                seen[r].insert((r, made[r]), (i, n));
                unsent[r].insert((r, made[r]), (i, n));
            }
            CmsOp::Merge(to, from) => {
                let (src, dst) = (reps[from].clone(), reps[to].clone());
                reps[to].merge(&src).unwrap();
                assert!(
                    src.le(&reps[to]) && dst.le(&reps[to]),
                    "merge is an upper bound"
                );
                let s = seen[from].clone();
                seen[to].extend(s);
            }
            CmsOp::Flush(from) => {
                if let Some(d) = reps[from].take_delta() {
                    let carried = std::mem::take(&mut unsent[from]);
                    for to in (0..3).filter(|&t| t != from) {
                        in_flight.push((to, d.clone(), carried.clone()));
                    }
                }
            }
            CmsOp::Deliver(k, again) => {
                if in_flight.is_empty() {
                    continue;
                }
                let k = k % in_flight.len();
                let (to, d, carried) = in_flight[k].clone();
                let before = reps[to].clone();
                reps[to].merge_delta(&d).unwrap();
                assert!(before.le(&reps[to]), "a delta must inflate");
                seen[to].extend(carried);
                if !again {
                    in_flight.swap_remove(k);
                }
            }
        }
        // No estimate below what the replica has seen of the item.
        for (rep, s) in reps.iter().zip(&seen) {
            for i in 0..UNIVERSE {
                let truth: u64 = s.values().filter(|(x, _)| *x == i).map(|(_, n)| n).sum();
                assert!(rep.count(&item(i)) >= truth, "an estimate below the truth");
            }
        }
    }
    for (r, rep) in reps.iter_mut().enumerate() {
        if let Some(d) = rep.take_delta() {
            for to in (0..3).filter(|&t| t != r) {
                in_flight.push((to, d.clone(), BTreeMap::new()));
            }
        }
    }
    for (to, d, _) in in_flight {
        reps[to].merge_delta(&d).unwrap();
    }
    let mut all = reps[0].clone();
    all.merge(&reps[1]).unwrap();
    all.merge(&reps[2]).unwrap();
    for rep in &reps {
        assert!(rep.equivalent(&all), "deltas alone converge");
        for i in 0..UNIVERSE {
            assert_eq!(rep.count(&item(i)), single.count(&item(i)), "item {i}");
        }
        assert_eq!(rep.total(), single.total());
        for row in 0..cms_params().depth {
            for col in 0..cms_params().width {
                assert_eq!(rep.cell_count(row, col), single.cell_count(row, col));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test] fn count_min_sketch_laws(ops in ops()) { run::<CountMinSketch>(ops) }
    #[test] fn count_min_sketch_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<CountMinSketch>(ops, seed, lossy) }
    #[test] fn count_min_sketch_equals_one_sketch_fed_everything(ops in cms_ops()) { run_cms(ops) }
}

/// `merge_weighted` raises every counter to the weighted sum of the sources' as this
/// replica's own counts (RedisBloom's `CMS.MERGE` sets it), never lowering one; all or
/// nothing: a weighted sum below zero or past a counter changes nothing.
#[test]
fn count_min_sketch_weighted_merge_is_an_inflation_or_nothing() {
    let mut a = CountMinSketch::make(1);
    let mut b = CountMinSketch::make(2);
    for i in 0..UNIVERSE {
        a.increment(&item(i), u64::from(i % 3));
        b.increment(&item(i), 1);
    }
    let mut dest = CountMinSketch::make(3);
    dest.track_deltas(true);
    dest.increment(b"own", 200);
    let before = dest.clone();
    assert!(
        dest.merge_weighted(&[(&a, 1), (&b, -1)]).is_err(),
        "a cell below zero"
    );
    assert!(dest.equivalent(&before) && dest.total() == 200);
    dest.merge_weighted(&[(&a, 2), (&b, 3)]).unwrap();
    assert!(before.le(&dest));
    // Each counter the larger of what it held and the weighted sum.
    for row in 0..cms_params().depth {
        for col in 0..cms_params().width {
            let sum = 2 * a.cell_count(row, col) + 3 * b.cell_count(row, col);
            assert_eq!(
                dest.cell_count(row, col),
                before.cell_count(row, col).max(sum)
            );
        }
    }
    assert_eq!(dest.total(), 200u64.max(2 * a.total() + 3 * b.total()));
    assert_eq!(dest.writers(), 1, "this replica's own counts");
    // Replicated by its delta like an increment.
    let mut peer = CountMinSketch::make(4);
    peer.merge_delta(&dest.take_delta().unwrap()).unwrap();
    assert!(peer.equivalent(&dest));
    // Into an empty sketch: exactly the weighted sums, RedisBloom's answer.
    let mut empty = CountMinSketch::make(5);
    empty.merge_weighted(&[(&a, 2), (&b, 3)]).unwrap();
    for row in 0..cms_params().depth {
        for col in 0..cms_params().width {
            let sum = 2 * a.cell_count(row, col) + 3 * b.cell_count(row, col);
            assert_eq!(empty.cell_count(row, col), sum);
        }
    }
    assert_eq!(empty.total(), 2 * a.total() + 3 * b.total());
}

// ---------------------------------------------------------------- top-k (issue 50)

use crpf::{TopK, TopkParams};

/// k = 3 of the `UNIVERSE` items, counted in rows of 7 (14 counters): heaps expel, and
/// estimates exceed true counts.
fn topk_params() -> TopkParams {
    TopkParams::new(3, 7, 3, 0.9).unwrap()
}

impl Subject for TopK {
    fn make(replica: u16) -> Self {
        TopK::new(topk_params(), replica)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test] fn top_k_laws(ops in ops()) { run::<TopK>(ops) }
    #[test] fn top_k_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<TopK>(ops, seed, lossy) }
    #[test] fn top_k_synchronised_replicas_list_as_one_fed_everything(
        adds in prop::collection::vec((0..3usize, 0..12u8, 1..4u64), 1..150),
        by_delta: bool,
    ) { run_topk_synchronised(adds, by_delta)? }
}

/// Three replicas add (replica, item, n), each add judged against a view holding every earlier
/// add (the replicas exchange full states or deltas after each), with exact counts (a row of
/// 1000 counters for 12 items): the merged list holds exactly the items one top-k fed every
/// add lists, wherever the k-th count is not tied with the next, with the same counts.
fn run_topk_synchronised(adds: Vec<(usize, u8, u64)>, by_delta: bool) -> Result<(), TestCaseError> {
    let p = TopkParams::new(3, 500, 4, 0.9).unwrap();
    let mut reps: Vec<TopK> = (1..=3).map(|r| TopK::new(p, r)).collect();
    for r in &mut reps {
        r.track_deltas(true);
    }
    let mut single = TopK::new(p, 9);
    let mut truth: BTreeMap<u8, u64> = BTreeMap::new();
    for (r, i, n) in adds {
        let before = reps[r].clone();
        reps[r].add(&[i], n);
        assert!(before.le(&reps[r]), "an add inflates");
        single.add(&[i], n);
        *truth.entry(i).or_default() += n;
        if by_delta {
            let d = reps[r].take_delta().expect("an add leaves a delta");
            for (_, rep) in reps.iter_mut().enumerate().filter(|(to, _)| *to != r) {
                rep.merge_delta(&d).unwrap();
            }
        } else {
            let src = reps[r].clone();
            for rep in reps.iter_mut() {
                rep.merge(&src).unwrap();
            }
        }
    }
    for (&i, &n) in &truth {
        prop_assume!(single.count(&[i]) == n, "counts exact");
    }
    let owned = |t: &TopK| -> Vec<(Vec<u8>, u64)> {
        t.list().into_iter().map(|(i, n)| (i.to_vec(), n)).collect()
    };
    let want = owned(&single);
    let mut ranked: Vec<u64> = truth.values().copied().collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    let k = p.k as usize;
    for rep in &reps {
        assert!(rep.equivalent(&reps[0]), "replicas converged");
        let got = owned(rep);
        let counts = |l: &[(Vec<u8>, u64)]| l.iter().map(|(_, n)| *n).collect::<Vec<_>>();
        assert_eq!(counts(&got), counts(&want), "the same counts listed");
        assert_eq!(
            counts(&want),
            ranked[..ranked.len().min(k)],
            "the true top k"
        );
        // Items strictly above the first count left out are listed by both.
        let cut = ranked.get(k).copied().unwrap_or(0);
        for (item, n) in want.iter().filter(|(_, n)| *n > cut) {
            assert!(got.contains(&(item.clone(), *n)), "{item:?} ({n}) missing");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- t-digest (issue 50)

use crpf::{TDigest, TdigestParams};

impl Subject for TDigest {
    fn make(replica: u16) -> Self {
        TDigest::new(TdigestParams::new(100).unwrap(), replica)
    }
}

#[derive(Debug, Clone)]
enum TdOp {
    /// Replica `.0` adds a value.
    Add(usize),
    /// Replica `.0` resets.
    Reset(usize),
    /// Replica `.0`'s delta goes to the other two.
    Send(usize),
    /// Replica `.1` merges replica `.0`'s full state.
    Merge(usize, usize),
}

fn td_ops() -> impl Strategy<Value = Vec<TdOp>> {
    let op = prop_oneof![
        5 => (0..3usize).prop_map(TdOp::Add),
        1 => (0..3usize).prop_map(TdOp::Reset),
        3 => (0..3usize).prop_map(TdOp::Send),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| TdOp::Merge(a, b)),
    ];
    prop::collection::vec(op, 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test] fn t_digest_laws(ops in ops()) { run::<TDigest>(ops) }
    #[test] fn t_digest_deltas(ops in ops(), seed: u64, lossy: bool) { run_deltas::<TDigest>(ops, seed, lossy) }
    #[test] fn t_digest_resets_remove_what_they_saw(ops in td_ops(), full_states: bool) {
        run_tdigest_resets(ops, full_states)
    }
}

/// The values a digest's reads see, every one its own centroid (a compression of 1000 keeps
/// the few values of a test apart).
fn td_values(t: &TDigest) -> BTreeSet<u64> {
    t.view()
        .merged_centroids()
        .into_iter()
        .map(|(v, w)| {
            assert_eq!(w, 1, "values apart");
            v as u64
        })
        .collect()
}

/// Three replicas add unique values, reset, and exchange deltas (and, with `full_states`,
/// full states). Model: replica t has seen each writer's first `seen[t][w]` values and
/// removed its first `removed[t][w]`; a reset removes what its replica has seen. Every
/// update inflates, and reads never see a value a reset removed, nor miss one added and
/// seen. Exactly the model's values while views of writers came by deltas only and no writer
/// merged segments (at most `MAX_SEGMENTS - 1` deltas of adds each); once converged,
/// replicas read the same.
fn run_tdigest_resets(ops: Vec<TdOp>, full_states: bool) {
    let p = TdigestParams::new(1000).unwrap();
    let mut reps: Vec<TDigest> = (1..=3).map(|r| TDigest::new(p, r)).collect();
    for r in &mut reps {
        r.track_deltas(true);
    }
    let mut added = [0u64; 3];
    let mut seen = [[0u64; 3]; 3];
    let mut removed = [[0u64; 3]; 3];
    let mut reset_since_send = [false; 3];
    let mut seals = [0usize; 3];
    let mut added_since_send = [false; 3];
    let mut exact = true;
    let value = |w: usize, n: u64| (w as u64 + 1) * 1000 + n;
    for op in ops {
        match op {
            TdOp::Add(r) => {
                let before = reps[r].clone();
                added[r] += 1;
                reps[r].add_values(&[value(r, added[r]) as f64]).unwrap();
                assert!(before.le(&reps[r]), "an add inflates");
                seen[r][r] = added[r];
                added_since_send[r] = true;
            }
            TdOp::Reset(r) => {
                let before = reps[r].clone();
                let removed_any = reps[r].reset();
                assert!(before.le(&reps[r]), "a reset inflates");
                assert!(
                    td_values(&reps[r]).is_empty(),
                    "a reset empties its replica"
                );
                for (gone, saw) in removed[r].iter_mut().zip(seen[r]) {
                    *gone = (*gone).max(saw);
                }
                // A reset that removed nothing has nothing to send: the next delta carries
                // its replica's floors only if one since removed something (then all of
                // them, those merged in since included).
                reset_since_send[r] |= removed_any;
            }
            TdOp::Send(r) => {
                if added_since_send[r] {
                    seals[r] += 1;
                }
                added_since_send[r] = false;
                let Some(d) = reps[r].take_delta() else {
                    continue;
                };
                for t in (0..3).filter(|&t| t != r) {
                    let before = reps[t].clone();
                    reps[t].merge_delta(&d).unwrap();
                    assert!(before.le(&reps[t]), "a delta inflates");
                    seen[t][r] = seen[t][r].max(seen[r][r]);
                    if reset_since_send[r] {
                        let sent = removed[r];
                        for (mine, theirs) in removed[t].iter_mut().zip(sent) {
                            *mine = (*mine).max(theirs);
                        }
                    }
                }
                reset_since_send[r] = false;
            }
            TdOp::Merge(from, to) => {
                if !full_states || from == to {
                    continue;
                }
                // A full state shows segments still open: the model's exactness ends.
                exact = false;
                let src = reps[from].clone();
                let before = reps[to].clone();
                reps[to].merge(&src).unwrap();
                assert!(before.le(&reps[to]) && src.le(&reps[to]));
                let (saw, gone) = (seen[from], removed[from]);
                for (mine, theirs) in seen[to].iter_mut().zip(saw) {
                    *mine = (*mine).max(theirs);
                }
                for (mine, theirs) in removed[to].iter_mut().zip(gone) {
                    *mine = (*mine).max(theirs);
                }
            }
        }
        exact &= seals.iter().all(|&s| s < crpf::core::tdigest::MAX_SEGMENTS);
        for t in 0..3 {
            let got = td_values(&reps[t]);
            let want: BTreeSet<u64> = (0..3)
                .flat_map(|w| (removed[t][w] + 1..=seen[t][w]).map(move |n| value(w, n)))
                .collect();
            for v in &got {
                let (w, n) = ((v / 1000 - 1) as usize, v % 1000);
                assert!(
                    n > removed[t][w],
                    "replica {t} reads {v}, which a reset removed"
                );
            }
            if exact {
                assert_eq!(got, want, "replica {t}");
            }
        }
    }
    // Converged (every state merged into every replica): one answer.
    let all = reps.iter().skip(1).fold(reps[0].clone(), |mut a, r| {
        a.merge(r).unwrap();
        a
    });
    for r in &mut reps {
        r.merge(&all).unwrap();
        assert!(r.equivalent(&all));
        assert_eq!(td_values(r), td_values(&all));
    }
}
