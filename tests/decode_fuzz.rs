//! Property tests of every decoder: full states and delta-states of all nine filter types
//! (directly, and for the six replicated kinds through `AnyFilter::decode_state`, which is also
//! how snapshots' state payloads are read, and `AnyFilter::merge_delta_bytes`), fed mutated valid
//! encodings: bit flips, truncations, splices of other encodings, CBOR headers announcing huge
//! lengths, and structural edits (a parameter, counter or length replaced by an extreme value).
//!
//! A decode must never panic and never allocate more than [`LIMIT`] in one allocation or in
//! live bytes. A counting global allocator enforces it: it records what the decoding thread
//! allocates, and refuses (aborting the test binary with "memory allocation of N bytes failed")
//! any single request past [`HARD_CAP`], which a broken bound would otherwise turn into an
//! out-of-memory kill. Whatever decodes is then merged, compared and re-encoded, which must not
//! panic either.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::sync::LazyLock;

use crpf::{
    CheckRemote, CuckooParams, DeltaState, GBloom, GCuckoo, Lattice, Membership, OrCuckoo,
    Removable, ScGBloom, ScGCuckoo, ScOrCuckoo, ScalableParams, WriterScGBloom, WriterScGCuckoo,
    WriterScOrCuckoo,
};
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_cbor::Value;

/// Most a decode may allocate, in one allocation or in live bytes.
const LIMIT: usize = 64 << 20;
/// Requests past this are refused outright instead of being served and reported.
const HARD_CAP: usize = 1 << 30;

// ---------------------------------------------------------------- counting allocator

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Records an allocation of `size` bytes (negative: a release) by this thread, if armed;
/// `false` if the request must be refused.
fn record(size: isize) -> bool {
    // `try_with`: never panic inside the allocator, even during thread teardown.
    let armed = ARMED.try_with(Cell::get).unwrap_or(false);
    if !armed {
        return true;
    }
    let _ = LIVE.try_with(|l| {
        let live = l.get() + size;
        l.set(live);
        let _ = PEAK.try_with(|p| p.set(p.get().max(live)));
    });
    if size > 0 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(size as usize)));
    }
    size <= HARD_CAP as isize
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !record(layout.size() as isize) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !record(layout.size() as isize) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            if new_size > HARD_CAP {
                return std::ptr::null_mut();
            }
            let _ = LARGEST.try_with(|m| m.set(m.get().max(new_size)));
        }
        record(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and asserts that it allocated at most [`LIMIT`], in one allocation and live.
fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    LIVE.with(|c| c.set(0));
    PEAK.with(|c| c.set(0));
    LARGEST.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    let (peak, largest) = (PEAK.with(Cell::get), LARGEST.with(Cell::get));
    assert!(
        largest <= LIMIT && peak <= LIMIT as isize,
        "{what}: largest allocation {largest} bytes, peak live {peak} bytes (limit {LIMIT})"
    );
    out
}

#[test]
fn the_allocator_sees_allocations() {
    let v = bounded("small", || vec![0u8; 1000]);
    assert_eq!(LARGEST.with(Cell::get), 1000);
    drop(v);
    let big = std::panic::catch_unwind(|| bounded("big", || vec![0u8; LIMIT + 1].len()));
    assert!(
        big.is_err(),
        "an allocation over the limit must fail the check"
    );
}

// ---------------------------------------------------------------- mutations

/// One mutation of a valid encoding, chosen and parameterised by `seed`.
#[derive(Debug, Clone, Copy)]
struct Mutation {
    kind: u8,
    seed: u64,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (0..6u8, any::<u64>()).prop_map(|(kind, seed)| Mutation { kind, seed })
}

/// CBOR headers announcing huge lengths or values: byte string, text, array, map and unsigned
/// integer with 4- and 8-byte arguments.
fn huge_header(rng: &mut fastrand::Rng) -> Vec<u8> {
    let major = [0x00u8, 0x40, 0x60, 0x80, 0xa0][rng.usize(..5)];
    let arg: u64 = [
        1 << 31,
        u32::MAX as u64,
        1 << 32,
        1 << 40,
        1 << 48,
        1 << 62,
        u64::MAX,
        rng.u64(..),
    ][rng.usize(..8)];
    let mut h = Vec::new();
    if arg <= u32::MAX as u64 && rng.bool() {
        h.push(major | 26);
        h.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        h.push(major | 27);
        h.extend_from_slice(&arg.to_be_bytes());
    }
    h
}

/// Extreme values for a structural edit of an integer.
fn extreme_int(rng: &mut fastrand::Rng) -> i128 {
    let v: [i128; 22] = [
        0,
        1,
        2,
        3,
        -1,
        63,
        64,
        65,
        255,
        256,
        65_535,
        65_536,
        1 << 31,
        (1 << 32) - 1,
        1 << 32,
        1 << 40,
        (1 << 48) - 1,
        1 << 48,
        1 << 53,
        1 << 63,
        u64::MAX as i128,
        rng.u64(..) as i128,
    ];
    v[rng.usize(..v.len())]
}

fn extreme_float(rng: &mut fastrand::Rng) -> f64 {
    let v = [
        0.0,
        -0.0,
        1.0,
        0.5,
        2.0,
        1e-300,
        1e-12,
        f64::NAN,
        f64::INFINITY,
        f64::MIN_POSITIVE,
    ];
    v[rng.usize(..v.len())]
}

/// Every node of a CBOR value, as a mutable reference, in pre-order.
fn nodes(v: &mut Value) -> Vec<*mut Value> {
    let mut out = vec![v as *mut Value];
    match v {
        Value::Array(a) => a.iter_mut().for_each(|c| out.extend(nodes(c))),
        Value::Map(m) => m.values_mut().for_each(|c| out.extend(nodes(c))),
        Value::Tag(_, c) => out.extend(nodes(c)),
        _ => {}
    }
    out
}

/// Replaces one node of the decoded CBOR tree by an extreme or damaged version of itself.
fn edit_structure(bytes: &[u8], rng: &mut fastrand::Rng) -> Option<Vec<u8>> {
    let mut v: Value = serde_cbor::from_slice(bytes).ok()?;
    let all = nodes(&mut v);
    let target = all[rng.usize(..all.len())];
    // SAFETY: the pointers come from `nodes` on `v`, which is not otherwise touched until the
    // edit is done; exactly one of them is dereferenced.
    let node = unsafe { &mut *target };
    let replacement = match node {
        Value::Integer(_) => Value::Integer(extreme_int(rng)),
        Value::Float(_) => Value::Float(extreme_float(rng)),
        Value::Bytes(b) => {
            let mut b = b.clone();
            match rng.u8(..4) {
                0 => b.truncate(rng.usize(..=b.len())),
                1 => b.extend((0..rng.usize(1..64)).map(|_| rng.u8(..))),
                2 => b = b.repeat(2),
                _ => b.clear(),
            }
            Value::Bytes(b)
        }
        Value::Array(a) => {
            let mut a = a.clone();
            match rng.u8(..4) {
                0 if !a.is_empty() => {
                    a.remove(rng.usize(..a.len()));
                }
                1 if !a.is_empty() => {
                    let x = a[rng.usize(..a.len())].clone();
                    a.insert(rng.usize(..=a.len()), x);
                }
                2 => a.reverse(),
                _ => a.clear(),
            }
            Value::Array(a)
        }
        Value::Map(m) => {
            let mut m = m.clone();
            if let Some(k) = m.keys().nth(rng.usize(..m.len().max(1))).cloned() {
                m.remove(&k);
            }
            Value::Map(m)
        }
        _ => [Value::Null, Value::Bool(true), Value::Text("x".into())][rng.usize(..3)].clone(),
    };
    *node = replacement;
    serde_cbor::to_vec(&v).ok()
}

/// The mutated encoding: a sample of `samples` damaged by `m` (splices take from `samples` too).
fn mutate(samples: &[Vec<u8>], m: Mutation) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(m.seed);
    let mut b = samples[rng.usize(..samples.len())].clone();
    if b.is_empty() {
        return b;
    }
    match m.kind {
        0 => {
            for _ in 0..rng.usize(1..8) {
                let i = rng.usize(..b.len());
                b[i] ^= 1 << rng.u8(..8);
            }
        }
        1 => b.truncate(rng.usize(..b.len())),
        2 => {
            let other = &samples[rng.usize(..samples.len())];
            let from = rng.usize(..other.len());
            let chunk = &other[from..rng.usize(from..=other.len())];
            let at = rng.usize(..=b.len());
            let end = rng.usize(at..=b.len());
            b.splice(at..end, chunk.iter().copied());
        }
        3 => {
            let at = rng.usize(..b.len());
            let h = huge_header(&mut rng);
            if rng.bool() {
                b.splice(at..at, h);
            } else {
                let end = (at + h.len()).min(b.len());
                b.splice(at..end, h);
            }
        }
        _ => {
            if let Some(edited) = edit_structure(&b, &mut rng) {
                b = edited;
            }
        }
    }
    b
}

// ---------------------------------------------------------------- corpora

trait Target:
    DeltaState + CheckRemote + Lattice + Membership + Clone + Debug + Serialize + DeserializeOwned
{
    /// Removes, for the types that can.
    fn remove_item(&mut self, _item: &[u8]) {}
    /// An add to a decoded state, as its replica would make: `receiver` is the corpus's
    /// replica.
    fn add_local(&mut self, _receiver: &Self) {
        let _ = self.add(b"local");
    }
}

impl Target for GBloom {}
impl Target for crpf::GoBloom {}
impl Target for crpf::BlockedBloom {}
impl Target for GCuckoo {}
impl Target for ScGBloom {}
impl Target for ScGCuckoo {}
impl Target for WriterScGBloom {}
impl Target for WriterScGCuckoo {}
impl Target for OrCuckoo {
    fn remove_item(&mut self, item: &[u8]) {
        self.remove(item);
    }
}
impl Target for ScOrCuckoo {
    fn remove_item(&mut self, item: &[u8]) {
        self.remove(item);
    }
}
impl Target for WriterScOrCuckoo {
    fn remove_item(&mut self, item: &[u8]) {
        self.remove(item);
    }
}

/// Valid encodings of one type's states and deltas, and a replica to merge into.
struct Corpus<T: Target> {
    states: Vec<Vec<u8>>,
    deltas: Vec<Vec<u8>>,
    receiver: T,
}

/// Three replicas that add, remove and merge enough to fill their sub-filters, overflow their
/// buckets and carry several replicas' tags; their states and deltas, in both CBOR layouts
/// (with field names, and the packed one the wire uses).
fn corpus<T: Target>(make: impl Fn(u16) -> T) -> Corpus<T> {
    let mut reps: Vec<T> = (0..3).map(|r| make(r + 1)).collect();
    reps.iter_mut().for_each(|r| r.track_deltas(true));
    let (mut states, mut deltas) = (Vec::new(), Vec::new());
    let encode = |v: &dyn erased::Encode, out: &mut Vec<Vec<u8>>| {
        out.push(v.named());
        out.push(v.packed());
    };
    for round in 0..4u32 {
        for (r, rep) in reps.iter_mut().enumerate() {
            for i in 0..12u32 {
                let _ = rep.add(&(round * 1000 + r as u32 * 100 + i).to_le_bytes());
            }
            rep.remove_item(&(round * 1000 + r as u32 * 100).to_le_bytes());
            if let Some(d) = rep.take_delta() {
                encode(&d, &mut deltas);
            }
        }
        let src = reps[round as usize % 3].clone();
        reps[(round as usize + 1) % 3].merge(&src).unwrap();
    }
    for rep in &reps {
        encode(rep, &mut states);
    }
    Corpus {
        states,
        deltas,
        receiver: reps.pop().unwrap(),
    }
}

mod erased {
    use serde::Serialize;

    /// Both CBOR layouts of a value, behind a trait object.
    pub(crate) trait Encode {
        fn named(&self) -> Vec<u8>;
        fn packed(&self) -> Vec<u8>;
    }
    impl<T: Serialize> Encode for T {
        fn named(&self) -> Vec<u8> {
            serde_cbor::to_vec(self).unwrap()
        }
        fn packed(&self) -> Vec<u8> {
            serde_cbor::ser::to_vec_packed(self).unwrap()
        }
    }
}

fn cuckoo_params() -> CuckooParams {
    CuckooParams {
        buckets: 5,
        bucket_size: 4,
        fingerprint_bits: 9,
        max_kicks: 10,
        seed: 3,
    }
}

fn scalable_params() -> ScalableParams {
    ScalableParams {
        max_kicks: 10,
        ..ScalableParams::with_capacity(8, 0.1).unwrap()
    }
}

static GBLOOM: LazyLock<Corpus<GBloom>> = LazyLock::new(|| {
    corpus(|_| {
        GBloom::new(crpf::BloomParams {
            bits: 300,
            hashes: 4,
            seed: 1,
            capacity: 60,
        })
        .unwrap()
    })
});
static GO_BLOOM: LazyLock<Corpus<crpf::GoBloom>> = LazyLock::new(|| {
    corpus(|_| {
        crpf::GoBloom::new(crpf::GoBloomParams {
            bits: 300,
            hashes: 4,
        })
        .unwrap()
    })
});
static BLOCKED_BLOOM: LazyLock<Corpus<crpf::BlockedBloom>> = LazyLock::new(|| {
    corpus(|_| {
        crpf::BlockedBloom::new(crpf::BloomParams {
            bits: 1024,
            hashes: 4,
            seed: 3,
            capacity: 60,
        })
        .unwrap()
    })
});
/// Two blocks per item: a state with the layout's field.
static BLOCKED_BLOOM_TWO: LazyLock<Corpus<crpf::BlockedBloom>> = LazyLock::new(|| {
    corpus(|_| {
        crpf::BlockedBloom::with_layout(
            crpf::BloomParams {
                bits: 1024,
                hashes: 4,
                seed: 3,
                capacity: 60,
            },
            crpf::BlockedLayout::TwoBlocks,
        )
        .unwrap()
    })
});
static GCUCKOO: LazyLock<Corpus<GCuckoo>> =
    LazyLock::new(|| corpus(|_| GCuckoo::new(cuckoo_params()).unwrap()));
static ORCUCKOO: LazyLock<Corpus<OrCuckoo>> =
    LazyLock::new(|| corpus(|r| OrCuckoo::new(cuckoo_params(), r).unwrap()));
static SC_GBLOOM: LazyLock<Corpus<ScGBloom>> =
    LazyLock::new(|| corpus(|_| ScGBloom::new(scalable_params()).unwrap()));
static SC_GCUCKOO: LazyLock<Corpus<ScGCuckoo>> =
    LazyLock::new(|| corpus(|_| ScGCuckoo::new(scalable_params()).unwrap()));
static SC_ORCUCKOO: LazyLock<Corpus<ScOrCuckoo>> =
    LazyLock::new(|| corpus(|r| ScOrCuckoo::new(scalable_params(), r).unwrap()));
static W_GBLOOM: LazyLock<Corpus<WriterScGBloom>> =
    LazyLock::new(|| corpus(|r| WriterScGBloom::new(scalable_params(), r).unwrap()));
static W_GCUCKOO: LazyLock<Corpus<WriterScGCuckoo>> =
    LazyLock::new(|| corpus(|r| WriterScGCuckoo::new(scalable_params(), r).unwrap()));
static W_ORCUCKOO: LazyLock<Corpus<WriterScOrCuckoo>> =
    LazyLock::new(|| corpus(|r| WriterScOrCuckoo::new(scalable_params(), r).unwrap()));

// ---------------------------------------------------------------- the checks

/// Whatever decodes must survive every operation a replica applies to a received state.
fn exercise_state<T: Target>(receiver: &T, state: &T) {
    let _ = receiver.check_remote(state);
    let mut merged = receiver.clone();
    if merged.merge(state).is_ok() {
        assert!(
            receiver.le(&merged) && state.le(&merged),
            "merge is an upper bound"
        );
    }
    let _ = state.le(receiver);
    let _ = (
        state.contains(b"x"),
        state.cardinality(),
        state.estimated_fpr(),
    );
    let bytes = serde_cbor::to_vec(state).unwrap();
    let back: T = serde_cbor::from_slice(&bytes).expect("an accepted state re-decodes");
    assert!(back.equivalent(state), "round trip of an accepted state");
    let mut local = state.clone();
    local.add_local(receiver);
}

fn fuzz_state<T: Target>(c: &Corpus<T>, m: Mutation) {
    let bytes = mutate(&c.states, m);
    let decoded = bounded("state decode", || serde_cbor::from_slice::<T>(&bytes));
    if let Ok(state) = decoded {
        bounded("state merge", || exercise_state(&c.receiver, &state));
    }
}

fn fuzz_delta<T: Target>(c: &Corpus<T>, m: Mutation) {
    let bytes = mutate(&c.deltas, m);
    let decoded = bounded("delta decode", || {
        serde_cbor::from_slice::<T::Delta>(&bytes)
    });
    if let Ok(delta) = decoded {
        bounded("delta merge", || {
            let _ = c.receiver.check_remote_delta(&delta);
            let mut r = c.receiver.clone();
            let before = r.clone();
            match r.merge_delta(&delta) {
                Ok(()) => assert!(before.le(&r), "a delta inflates"),
                Err(_) => assert!(r.equivalent(&before), "a rejected delta changed the state"),
            }
        });
    }
}

/// Bytes and JSON in the Go library's formats, mutated: they load whole or not at all (an
/// accepted input writes back as the same filter), and never panic or allocate past bounds.
fn fuzz_go_formats(c: &Corpus<crpf::GoBloom>, m: Mutation) {
    let samples: Vec<Vec<u8>> = c
        .states
        .iter()
        .filter_map(|s| serde_cbor::from_slice::<crpf::GoBloom>(s).ok())
        .flat_map(|f| [f.to_go_bytes(), f.to_go_json().into_bytes()])
        .collect();
    let bytes = mutate(&samples, m);
    if let Ok(f) = bounded("go bytes", || crpf::GoBloom::from_go_bytes(&bytes)) {
        assert_eq!(
            f.to_go_bytes(),
            bytes,
            "an accepted input is exactly one filter"
        );
        bounded("go merge", || exercise_state(&c.receiver, &f));
    }
    if let Ok(f) = bounded("go json", || crpf::GoBloom::from_go_json(&bytes)) {
        let again = crpf::GoBloom::from_go_json(f.to_go_json().as_bytes()).unwrap();
        assert_eq!(again, f);
        bounded("go merge", || exercise_state(&c.receiver, &f));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test] fn gbloom_state(m in mutation()) { fuzz_state(&GBLOOM, m) }
    #[test] fn go_bloom_state(m in mutation()) { fuzz_state(&GO_BLOOM, m) }
    #[test] fn blocked_bloom_state(m in mutation()) { fuzz_state(&BLOCKED_BLOOM, m) }
    #[test] fn go_bloom_delta(m in mutation()) { fuzz_delta(&GO_BLOOM, m) }
    #[test] fn blocked_bloom_delta(m in mutation()) { fuzz_delta(&BLOCKED_BLOOM, m) }
    #[test] fn blocked_bloom_two_blocks_state(m in mutation()) { fuzz_state(&BLOCKED_BLOOM_TWO, m) }
    #[test] fn go_bloom_library_formats(m in mutation()) { fuzz_go_formats(&GO_BLOOM, m) }
    #[test] fn gcuckoo_state(m in mutation()) { fuzz_state(&GCUCKOO, m) }
    #[test] fn orcuckoo_state(m in mutation()) { fuzz_state(&ORCUCKOO, m) }
    #[test] fn sc_gbloom_state(m in mutation()) { fuzz_state(&SC_GBLOOM, m) }
    #[test] fn sc_gcuckoo_state(m in mutation()) { fuzz_state(&SC_GCUCKOO, m) }
    #[test] fn sc_orcuckoo_state(m in mutation()) { fuzz_state(&SC_ORCUCKOO, m) }
    #[test] fn writer_sc_gbloom_state(m in mutation()) { fuzz_state(&W_GBLOOM, m) }
    #[test] fn writer_sc_gcuckoo_state(m in mutation()) { fuzz_state(&W_GCUCKOO, m) }
    #[test] fn writer_sc_orcuckoo_state(m in mutation()) { fuzz_state(&W_ORCUCKOO, m) }

    #[test] fn gbloom_delta(m in mutation()) { fuzz_delta(&GBLOOM, m) }
    #[test] fn gcuckoo_delta(m in mutation()) { fuzz_delta(&GCUCKOO, m) }
    #[test] fn orcuckoo_delta(m in mutation()) { fuzz_delta(&ORCUCKOO, m) }
    #[test] fn sc_gbloom_delta(m in mutation()) { fuzz_delta(&SC_GBLOOM, m) }
    #[test] fn sc_gcuckoo_delta(m in mutation()) { fuzz_delta(&SC_GCUCKOO, m) }
    #[test] fn sc_orcuckoo_delta(m in mutation()) { fuzz_delta(&SC_ORCUCKOO, m) }
    #[test] fn writer_sc_gbloom_delta(m in mutation()) { fuzz_delta(&W_GBLOOM, m) }
    #[test] fn writer_sc_gcuckoo_delta(m in mutation()) { fuzz_delta(&W_GCUCKOO, m) }
    #[test] fn writer_sc_orcuckoo_delta(m in mutation()) { fuzz_delta(&W_ORCUCKOO, m) }
}

/// An empty writer-partitioned series with parameters `p`, encoded in 40-odd bytes and decoded.
fn decode_with_params(p: ScalableParams) -> Result<WriterScGBloom, serde_cbor::Error> {
    let mut v: Value =
        serde_cbor::from_slice(&serde_cbor::to_vec(&W_GBLOOM.receiver).unwrap()).unwrap();
    if let Value::Map(m) = &mut v {
        m.insert(
            Value::Text("params".into()),
            serde_cbor::value::to_value(p).unwrap(),
        );
        m.insert(Value::Text("parts".into()), Value::Array(vec![]));
    }
    serde_cbor::from_slice(&serde_cbor::to_vec(&v).unwrap())
}

/// The parameter sets adversarial tests found: each arrives in a few bytes and used to make
/// the decoder or the first expansion allocate gigabytes. Now each is rejected (or, for a
/// series, fails at the expansion) before anything is allocated.
#[test]
fn absurd_parameters_allocate_nothing() {
    let tiny = scalable_params();
    let absurd = [
        ScalableParams {
            initial_capacity: 1 << 40,
            fpr: 1e-9,
            ..tiny
        },
        ScalableParams {
            max_kicks: 1 << 31,
            ..tiny
        },
    ];
    for p in absurd {
        assert!(bounded("absurd writer series", || decode_with_params(p)).is_err());
        assert!(bounded("absurd series", || ScGBloom::new(p)).is_err());
        assert!(bounded("absurd series", || WriterScGCuckoo::new(p, 0)).is_err());
        assert!(bounded("absurd series", || ScOrCuckoo::new(p, 0)).is_err());
    }
    // Within the limits but large (a 160 MiB first sub-filter): building or decoding a series
    // allocates nothing until an element needs the sub-filter.
    let large = ScalableParams {
        initial_capacity: 1 << 28,
        ..tiny
    };
    bounded("large writer series", || decode_with_params(large)).unwrap();
    bounded("large series", || ScGBloom::new(large)).unwrap();
    bounded("large series", || WriterScGCuckoo::new(large, 0)).unwrap();
    bounded("large series", || ScOrCuckoo::new(large, 0)).unwrap();
    // A growth of u32::MAX: the first sub-filter is fine, the second would take 10 GB.
    let mut f = ScGBloom::new(ScalableParams {
        growth: u32::MAX,
        ..tiny
    })
    .unwrap();
    let mut failed = None;
    for i in 0..100u32 {
        let before = serde_cbor::to_vec(&f).unwrap();
        if let Err(e) = bounded("expansion", || f.add(&i.to_le_bytes())) {
            assert_eq!(
                serde_cbor::to_vec(&f).unwrap(),
                before,
                "a failed add changed the state"
            );
            failed = Some(e);
            break;
        }
    }
    assert!(
        matches!(failed, Some(crpf::FilterError::TooLarge { .. })),
        "{failed:?}"
    );
    let p = CuckooParams {
        max_kicks: 1 << 31,
        ..cuckoo_params()
    };
    assert!(GCuckoo::new(p).is_err() && OrCuckoo::new(p, 1).is_err());
}

#[cfg(feature = "node")]
mod any_filter {
    //! The replica's own entry points, for the six replicated kinds: `AnyFilter::decode_state`
    //! (network states and snapshot payloads) and `AnyFilter::merge_delta_bytes` /
    //! `merge_remote_delta_bytes` (network deltas).

    use super::*;
    use crpf::replica::{AnyFilter, FilterSpec};
    use crpf::wire::FilterKind;

    struct AnyCorpus {
        states: Vec<Vec<u8>>,
        deltas: Vec<Vec<u8>>,
        receiver: AnyFilter,
    }

    fn any_corpus(kind: FilterKind) -> AnyCorpus {
        let spec = FilterSpec::new(kind, 40, 0.05);
        let mut reps: Vec<AnyFilter> = (1..=3).map(|r| AnyFilter::new(&spec, r).unwrap()).collect();
        reps.iter_mut().for_each(|r| r.track_deltas(true));
        let mut deltas = Vec::new();
        for round in 0..3u32 {
            for (r, rep) in reps.iter_mut().enumerate() {
                for i in 0..30u32 {
                    let _ = rep.add(&(round * 1000 + r as u32 * 100 + i).to_le_bytes());
                }
                let _ = rep.remove(&(round * 1000 + r as u32 * 100).to_le_bytes());
                deltas.extend(rep.take_delta());
            }
            let src = reps[round as usize % 3].clone();
            reps[(round as usize + 1) % 3].merge(&src).unwrap();
        }
        AnyCorpus {
            states: reps.iter().map(AnyFilter::encode_state).collect(),
            deltas,
            receiver: reps.pop().unwrap(),
        }
    }

    static CORPORA: LazyLock<Vec<AnyCorpus>> =
        LazyLock::new(|| FilterKind::ALL.iter().copied().map(any_corpus).collect());

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn decode_state_of_every_kind(k in 0..FilterKind::ALL.len(), m in mutation()) {
            let c = &CORPORA[k];
            let kind = FilterKind::ALL[k];
            let bytes = mutate(&c.states, m);
            let decoded = bounded("AnyFilter::decode_state", || AnyFilter::decode_state(kind, &bytes));
            if let Ok(state) = decoded {
                bounded("AnyFilter merge", || {
                    let _ = c.receiver.check_remote_state(&state, 0);
                    let mut r = c.receiver.clone();
                    if r.merge(&state).is_ok() {
                        assert!(state.le(&r) && c.receiver.le(&r));
                    }
                    let again = AnyFilter::decode_state(kind, &state.encode_state());
                    assert!(again.expect("an accepted state re-decodes").equivalent(&state));
                    let _ = (state.stats(), state.state_digest());
                });
            }
        }

        #[test]
        fn merge_delta_bytes_of_every_kind(k in 0..FilterKind::ALL.len(), m in mutation(), remote: bool) {
            let c = &CORPORA[k];
            let bytes = mutate(&c.deltas, m);
            bounded("AnyFilter::merge_delta_bytes", || {
                let mut r = c.receiver.clone();
                let before = r.clone();
                let result = if remote {
                    r.merge_remote_delta_bytes(&bytes, 0)
                } else {
                    r.merge_delta_bytes(&bytes)
                };
                match result {
                    Ok(()) => assert!(before.le(&r)),
                    Err(_) => assert!(r.equivalent(&before), "a rejected delta changed the state"),
                }
            });
        }
    }
}

// ---------------------------------------------------------------- issue 11: expiring and
// atomic Bloom filters.

mod issue11 {
    use super::*;
    use crpf::{AtomicGBloom, BloomParams, ExpiringBloom, ExpiringParams};

    impl Target for ExpiringBloom {}

    fn expiring_params() -> ExpiringParams {
        ExpiringParams {
            bloom: BloomParams {
                bits: 150,
                hashes: 3,
                seed: 4,
                capacity: 20,
            },
            epoch_len: 10,
            window: 3,
            max_skew: 1,
        }
    }

    /// Three replicas whose clocks run a little apart, adding and merging over several epochs,
    /// so that the states hold several epochs and the deltas carry clock moves.
    static EXPIRING: LazyLock<Corpus<ExpiringBloom>> = LazyLock::new(|| {
        let mut reps: Vec<ExpiringBloom> = (0..3)
            .map(|_| ExpiringBloom::new(expiring_params()).unwrap())
            .collect();
        reps.iter_mut().for_each(|r| r.track_deltas(true));
        let (mut states, mut deltas) = (Vec::new(), Vec::new());
        for round in 0..6u64 {
            for (r, rep) in reps.iter_mut().enumerate() {
                let now = round * 7 + r as u64 * 4;
                for i in 0..8u32 {
                    rep.add_at(
                        &(round as u32 * 1000 + r as u32 * 100 + i).to_le_bytes(),
                        now,
                    );
                }
                if let Some(d) = rep.take_delta() {
                    deltas.push(serde_cbor::to_vec(&d).unwrap());
                    deltas.push(serde_cbor::ser::to_vec_packed(&d).unwrap());
                }
            }
            let src = reps[round as usize % 3].clone();
            reps[(round as usize + 1) % 3].merge(&src).unwrap();
        }
        for rep in &reps {
            states.push(serde_cbor::to_vec(rep).unwrap());
            states.push(serde_cbor::ser::to_vec_packed(rep).unwrap());
        }
        Corpus {
            states,
            deltas,
            receiver: reps.pop().unwrap(),
        }
    });

    /// `AtomicGBloom` decodes as a `GBloom`: mutated `GBloom` states, then merged into a
    /// receiver in place and re-encoded.
    fn fuzz_atomic(m: Mutation) {
        let bytes = mutate(&GBLOOM.states, m);
        let decoded = bounded("atomic decode", || {
            serde_cbor::from_slice::<AtomicGBloom>(&bytes)
        });
        if let Ok(state) = decoded {
            bounded("atomic merge", || {
                let receiver = AtomicGBloom::from(GBLOOM.receiver.clone());
                let snap = state.snapshot();
                if receiver.merge_from(&snap).is_ok() {
                    assert!(snap.le(&receiver.snapshot()));
                }
                let _ = (state.contains(b"x"), state.approximated_size());
                let again: AtomicGBloom =
                    serde_cbor::from_slice(&serde_cbor::to_vec(&state).unwrap()).unwrap();
                assert_eq!(again.snapshot(), snap);
            });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]
        #[test] fn expiring_state(m in mutation()) { fuzz_state(&EXPIRING, m) }
        #[test] fn expiring_delta(m in mutation()) { fuzz_delta(&EXPIRING, m) }
        #[test] fn atomic_gbloom_state(m in mutation()) { fuzz_atomic(m) }
    }

    /// A window of absurd memory (each epoch fine, all together over the limit) arrives in a
    /// few bytes: rejected before anything is allocated. A large valid one allocates nothing
    /// until an element needs an epoch.
    #[test]
    fn expiring_absurd_parameters_allocate_nothing() {
        let encode = |p: ExpiringParams| {
            let mut v: Value =
                serde_cbor::from_slice(&serde_cbor::to_vec(&EXPIRING.receiver).unwrap()).unwrap();
            if let Value::Map(m) = &mut v {
                m.insert(
                    Value::Text("params".into()),
                    serde_cbor::value::to_value(p).unwrap(),
                );
                m.insert(Value::Text("epochs".into()), Value::Array(vec![]));
            }
            serde_cbor::to_vec(&v).unwrap()
        };
        let huge = ExpiringParams {
            bloom: BloomParams::with_capacity(1 << 24, 0.001).unwrap(), // 29 MiB an epoch
            window: ExpiringParams::MAX_WINDOW,
            ..expiring_params()
        };
        let bytes = encode(huge);
        assert!(
            bounded("absurd window", || serde_cbor::from_slice::<ExpiringBloom>(
                &bytes
            ))
            .is_err()
        );
        assert!(bounded("absurd window", || ExpiringBloom::new(huge)).is_err());
        let large = ExpiringParams {
            window: 100,
            ..huge
        }; // 2.9 GB when full
        let bytes = encode(large);
        bounded("large window", || {
            serde_cbor::from_slice::<ExpiringBloom>(&bytes)
        })
        .unwrap();
        bounded("large window", || ExpiringBloom::new(large)).unwrap();
        // Delta epochs outside the window they claim are rejected without allocating.
        let mut r = EXPIRING.receiver.clone();
        let far = crpf::ExpiringDelta {
            newest: u64::MAX,
            epochs: vec![(0, crpf::BloomDelta { bits: vec![1] })],
        };
        assert!(bounded("delta", || r.merge_delta(&far)).is_err());
    }
}
// ---------------------------------------------------------------- counting cuckoo filter (issue 11)

use crpf::CountingCuckoo;

impl Target for CountingCuckoo {
    fn remove_item(&mut self, item: &[u8]) {
        self.remove(item);
    }
}

/// Every replica adds a few elements twice, so that counters carry several replicas' counts
/// and removed occurrences.
static COUNTING: LazyLock<Corpus<CountingCuckoo>> = LazyLock::new(|| {
    corpus(|r| {
        let mut f = CountingCuckoo::new(cuckoo_params(), r).unwrap();
        for i in 0..6u32 {
            let _ = f.add_count(&i.to_le_bytes(), 1 + u64::from(r));
        }
        f
    })
});

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test] fn counting_cuckoo_state(m in mutation()) { fuzz_state(&COUNTING, m) }
    #[test] fn counting_cuckoo_delta(m in mutation()) { fuzz_delta(&COUNTING, m) }
}

#[test]
fn counting_cuckoo_absurd_parameters_allocate_nothing() {
    let p = CuckooParams {
        max_kicks: 1 << 31,
        ..cuckoo_params()
    };
    assert!(bounded("absurd ccf", || CountingCuckoo::new(p, 1)).is_err());
    let p = CuckooParams {
        buckets: 1 << 32,
        ..cuckoo_params()
    };
    assert!(bounded("huge ccf", || CountingCuckoo::new(p, 1)).is_err());
}

// ---------------------------------------------------------------- count-min sketch (issue 50)

use crpf::{CmsParams, CountMinSketch};

/// A replica increments only its own sketch, whose parameters its spec gave: a sketch
/// allocates a writer's counters (`4·width·depth` bytes, up to `MAX_FILTER_BYTES`) at its
/// first increment, which a forged state's parameters name without carrying them. So the
/// add goes to a decoded state of the corpus's parameters only (one of other parameters is
/// refused by every merge, and by the parameter digest before that).
impl Target for CountMinSketch {
    fn add_local(&mut self, receiver: &Self) {
        if self.params() == receiver.params() {
            self.increment(b"local", 3);
        }
    }
}

/// Every replica counts a few items several times, so that states carry several writers.
static CMS: LazyLock<Corpus<CountMinSketch>> = LazyLock::new(|| {
    corpus(|r| {
        let mut f = CountMinSketch::new(CmsParams::new(9, 4).unwrap(), r);
        for i in 0..6u32 {
            f.increment(&i.to_le_bytes(), 1 + u64::from(r));
        }
        f
    })
});

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test] fn count_min_sketch_state(m in mutation()) { fuzz_state(&CMS, m) }
    #[test] fn count_min_sketch_delta(m in mutation()) { fuzz_delta(&CMS, m) }
}

#[test]
fn count_min_sketch_absurd_parameters_allocate_nothing() {
    for (width, depth) in [
        (0, 4),
        (9, 0),
        (9, CmsParams::MAX_DEPTH + 1),
        (u32::MAX, 1000),
    ] {
        assert!(bounded("absurd sketch", || CmsParams::new(width, depth)).is_err());
    }
    // A state naming the largest sketch it may, without its counters, decodes to nothing
    // allocated.
    let huge = CountMinSketch::new(
        CmsParams {
            width: 1 << 22,
            depth: 1 << 8,
            seed: 0,
        },
        1,
    );
    let bytes = serde_cbor::to_vec(&huge).unwrap();
    let back: CountMinSketch = bounded("huge sketch", || serde_cbor::from_slice(&bytes).unwrap());
    assert_eq!(back.writers(), 0);
    assert!(bounded("its figures", || back.estimated_fpr() == 0.0));
}

// ---------------------------------------------------------------- top-k (issue 50)

use crpf::{TopK, TopkParams};

/// As the count-min sketch: a writer's counters and heap are allocated at its first add, so
/// the add goes to a decoded state of the corpus's parameters only.
impl Target for TopK {
    fn add_local(&mut self, receiver: &Self) {
        if self.params() == receiver.params() {
            self.add(b"local", 3);
        }
    }
}

/// Every replica adds a few items several times: states carry several writers' counts and
/// heaps (k = 4 of 6 items, so that heaps expel).
static TOPK: LazyLock<Corpus<TopK>> = LazyLock::new(|| {
    corpus(|r| {
        let mut f = TopK::new(TopkParams::new(4, 9, 4, 0.9).unwrap(), r);
        for i in 0..6u32 {
            f.add(&i.to_le_bytes(), 1 + u64::from(u32::from(r) * i % 5));
        }
        f
    })
});

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test] fn top_k_state(m in mutation()) { fuzz_state(&TOPK, m) }
    #[test] fn top_k_delta(m in mutation()) { fuzz_delta(&TOPK, m) }
}

#[test]
fn top_k_absurd_parameters_allocate_nothing() {
    for (k, width, depth, decay) in [
        (0, 8, 7, 0.9),
        (3, 0, 7, 0.9),
        (3, 8, 0, 0.9),
        (3, 8, 7, 0.0),
        (3, 8, 7, 1.5),
        (3, 8, 7, f64::NAN),
        (3, u32::MAX, 1000, 0.9),
        (u32::MAX, 8, 7, 0.9),
    ] {
        assert!(bounded("absurd top-k", || TopkParams::new(k, width, depth, decay)).is_err());
    }
    // A state naming the largest top-k it may, without its counters or heaps, decodes to
    // nothing allocated.
    let huge = TopK::new(
        TopkParams {
            k: TopkParams::MAX_K,
            width: 1 << 20,
            depth: 1 << 8,
            decay: 0.9,
            seed: 0,
        },
        1,
    );
    let bytes = serde_cbor::to_vec(&huge).unwrap();
    let back: TopK = bounded("huge top-k", || serde_cbor::from_slice(&bytes).unwrap());
    assert_eq!(back.writers(), 0);
    assert!(bounded("its list", || back.list().is_empty()));
}

// ---------------------------------------------------------------- t-digest (issue 50)

use crpf::{TDigest, TdigestParams};

impl Target for TDigest {}

/// Every replica adds values, the first resets once: states carry several writers' parts
/// (segments sealed by deltas) and floors.
static TDIGEST: LazyLock<Corpus<TDigest>> = LazyLock::new(|| {
    corpus(|r| {
        let mut f = TDigest::new(TdigestParams::new(20).unwrap(), r);
        f.track_deltas(true);
        for i in 0..40u32 {
            let v = f64::from(i * u32::from(r)) * 0.5 - 3.0;
            f.add_values(&[v, v * v]).unwrap();
            if i % 9 == 0 {
                let _ = f.take_delta();
            }
        }
        if r == 1 {
            f.reset();
            f.add_values(&[7.0]).unwrap();
        }
        f
    })
});

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test] fn t_digest_state(m in mutation()) { fuzz_state(&TDIGEST, m) }
    #[test] fn t_digest_delta(m in mutation()) { fuzz_delta(&TDIGEST, m) }
}

#[test]
fn t_digest_absurd_parameters_allocate_nothing() {
    assert!(TdigestParams::new(0).is_err());
    assert!(bounded("huge t-digest", || TdigestParams::new(u32::MAX)).is_err());
    // The largest digest allowed decodes without allocating its centroids.
    let mut c = u32::MAX / 8;
    while TdigestParams::new(c).is_err() {
        c /= 2;
    }
    let huge = TDigest::new(TdigestParams::new(c).unwrap(), 1);
    let bytes = serde_cbor::to_vec(&huge).unwrap();
    let back: TDigest = bounded("huge t-digest", || serde_cbor::from_slice(&bytes).unwrap());
    assert_eq!(back.writers(), 0);
    assert!(bounded("its view", || back.view().quantiles(&[0.5])[0].is_nan()));
}
