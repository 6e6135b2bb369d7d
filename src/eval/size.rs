//! `crpf eval size`: Tables 6.1 and 6.2 (thesis 6.3). Serialized and gzip-compressed size of
//! GBF 5, GCF 4 and ORCF 4 against the set CRDTs of the `crdts` crate (GSet, and Orswot as the
//! ORSet), all serialized with the same codec (CBOR, `serde_cbor`), under `a`%-add workloads
//! run all local or split 50-50 and merged at the end.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use crdts::{CmRDT, CvRDT, GSet, Orswot};
use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Serialize;
use serde_bytes::ByteArray;

use super::error::EvalError;
use super::fpr::write_csv;
use super::par::{progress_bar, run_jobs};
use super::variant::{Config, Design, Kind, Variant, variants};
use super::workload::Keys;
use crate::{
    FilterError, GBloom, GCuckoo, Lattice, Membership, OrCuckoo, Removable, ScGBloom, ScGCuckoo,
    ScOrCuckoo, WriterScGBloom, WriterScGCuckoo, WriterScOrCuckoo,
};

/// A 16-byte key as the sets store it: CBOR encodes it as a 16-byte string (17 bytes), where a
/// `[u8; 16]` would be an array of 16 integers.
type Key = ByteArray<16>;

/// The data structures compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Structure {
    /// GBF 5.
    Gbf,
    /// GCF 4.
    Gcf,
    /// `crdts::GSet`.
    GSet,
    /// ORCF 4.
    Orcf,
    /// `crdts::Orswot`, the ORSet.
    OrSet,
    /// A scalable filter (not in the thesis's tables): the memory cost of the per-writer
    /// design against the thesis's.
    Scalable(Variant),
}

impl Structure {
    /// The name in the tables.
    pub fn label(self) -> &'static str {
        match self {
            Structure::Gbf => "GBF 5",
            Structure::Gcf => "GCF 4",
            Structure::GSet => "GSet",
            Structure::Orcf => "ORCF 4",
            Structure::OrSet => "ORSet",
            Structure::Scalable(v) => match (v.kind, v.design) {
                (Kind::ScGbf, Design::Thesis) => "ScGBF 5 (thesis)",
                (Kind::ScGbf, _) => "ScGBF 5 (per-writer)",
                (Kind::ScGcf, Design::Thesis) => "ScGCF 4 (thesis)",
                (Kind::ScGcf, _) => "ScGCF 4 (per-writer)",
                (Kind::ScOrcf, Design::Thesis) => "ScORCF 4 (thesis)",
                (Kind::ScOrcf, _) => "ScORCF 4 (per-writer)",
                _ => "non-scalable",
            },
        }
    }
}

/// One row of Table 6.1 or 6.2: a structure under a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Case {
    /// 1 for Table 6.1, 2 for Table 6.2, 3 for the scalable filters (not in the thesis).
    pub table: u8,
    /// Share of adds in the workload, in percent (the rest are removes of contained elements).
    pub add_percent: u8,
    /// Whether the workload is split 50-50 between two replicas (merged at the end).
    pub split: bool,
    /// The structure.
    pub structure: Structure,
}

impl Case {
    /// The rows of Tables 6.1 and 6.2, in the thesis's order, then those of the scalable
    /// filters (thesis design against per-writer design, 100% add).
    pub fn thesis() -> Vec<Case> {
        let mut v = Vec::new();
        for split in [false, true] {
            for structure in [Structure::Gbf, Structure::Gcf, Structure::GSet] {
                v.push(Case {
                    table: 1,
                    add_percent: 100,
                    split,
                    structure,
                });
            }
        }
        for split in [false, true] {
            for add_percent in [100, 80, 51] {
                for structure in [Structure::Orcf, Structure::OrSet] {
                    v.push(Case {
                        table: 2,
                        add_percent,
                        split,
                        structure,
                    });
                }
            }
        }
        for split in [false, true] {
            for variant in variants(&[Kind::ScGbf, Kind::ScGcf, Kind::ScOrcf]) {
                v.push(Case {
                    table: 3,
                    add_percent: 100,
                    split,
                    structure: Structure::Scalable(variant),
                });
            }
        }
        v
    }

    /// The workload label of the tables.
    pub fn workload(&self) -> String {
        format!(
            "{}% add, {}",
            self.add_percent,
            if self.split {
                "50-50 split"
            } else {
                "all local"
            }
        )
    }

    /// The thesis's row: load factor, serialized MB and BPE, compressed MB and BPE.
    pub fn thesis_values(&self) -> Option<[f64; 5]> {
        use Structure::*;
        Some(
            match (self.table, self.add_percent, self.split, self.structure) {
                (1, 100, false, Gbf) | (1, 100, true, Gbf) => [1.00, 1.01, 1.01, 0.91, 0.91],
                (1, 100, false, Gcf) => [0.96, 1.05, 1.05, 1.04, 1.04],
                (1, 100, true, Gcf) => [0.98, 3.73, 3.62, 1.59, 1.54],
                (1, 100, _, GSet) => [1.00, 23.07, 22.00, 17.16, 16.37],
                (2, 100, false, Orcf) => [0.96, 8.39, 8.37, 4.75, 4.74],
                (2, 100, false, OrSet) => [1.00, 51.38, 49.00, 21.16, 20.18],
                (2, 80, false, Orcf) => [0.60, 8.39, 13.34, 3.42, 5.44],
                (2, 80, false, OrSet) => [0.60, 30.83, 49.00, 12.66, 20.13],
                (2, 51, false, Orcf) => [0.02, 8.39, 400.14, 0.19, 9.16],
                (2, 51, false, OrSet) => [0.02, 1.03, 49.00, 0.44, 20.87],
                (2, 100, true, Orcf) => [1.00, 12.54, 11.96, 5.71, 5.45],
                (2, 100, true, OrSet) => [1.00, 51.38, 49.00, 21.45, 20.46],
                (2, 80, true, Orcf) => [0.60, 9.25, 14.70, 3.54, 5.62],
                (2, 80, true, OrSet) => [0.60, 30.83, 49.00, 12.86, 20.44],
                (2, 51, true, Orcf) => [0.02, 8.39, 381.81, 0.20, 9.10],
                (2, 51, true, OrSet) => [0.02, 1.03, 49.00, 0.45, 21.25],
                _ => return None,
            },
        )
    }
}

/// The experiment and where its outputs go.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeOptions {
    /// Operations per workload (thesis: 2^20).
    pub ops: u64,
    /// Repetitions (thesis: 5).
    pub reps: u32,
    /// Base seed; repetition `r` uses `seed + r`.
    pub seed: u64,
    /// Worker threads.
    pub jobs: usize,
    /// Output directory (the experiment writes under `size/`).
    pub out: PathBuf,
    /// Whether to show a progress bar.
    pub progress: bool,
}

impl SizeOptions {
    /// The thesis setup: 2^20 operations, 5 repetitions.
    pub fn full(out: PathBuf) -> Self {
        Self {
            ops: 1 << 20,
            reps: 5,
            seed: 0x6372_7066_7369_7a65,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            out,
            progress: true,
        }
    }

    /// A small setup for tests: 2^16 operations, 2 repetitions.
    pub fn quick(out: PathBuf) -> Self {
        Self {
            ops: 1 << 16,
            reps: 2,
            ..Self::full(out)
        }
    }

    /// The directory the experiment writes to.
    pub fn dir(&self) -> PathBuf {
        self.out.join("size")
    }
}

/// What one run of a case measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeOutcome {
    /// Elements the merged structure represents: keys added (and accepted) and not removed.
    pub elements: u64,
    /// Entries stored (cuckoo filters; the element count otherwise).
    pub entries: f64,
    /// Load factor: the filter's own, or elements over operations for sets.
    pub load_factor: f64,
    /// Adds a cuckoo filter rejected.
    pub failed_adds: u64,
    /// CBOR size in bytes.
    pub serialized: u64,
    /// Gzip (level 6) size of the CBOR bytes.
    pub compressed: u64,
}

/// A row of `size.csv`: a case averaged over repetitions, with the thesis's values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeRow {
    /// 1 or 2.
    pub table: u8,
    /// Workload label.
    pub workload: String,
    /// Structure label.
    pub crdt: String,
    /// Repetitions averaged.
    pub reps: u32,
    /// Operations per workload.
    pub ops: u64,
    /// Mean number of elements represented.
    pub elements: f64,
    /// Mean number of entries stored.
    pub entries: f64,
    /// Mean load factor.
    pub load_factor: f64,
    /// Mean number of rejected adds.
    pub failed_adds: f64,
    /// Mean serialized size, in MB (10^6 bytes, as the thesis's numbers imply).
    pub serialized_mb: f64,
    /// Mean serialized bytes per element.
    pub serialized_bpe: f64,
    /// Mean compressed size in MB.
    pub compressed_mb: f64,
    /// Mean compressed bytes per element.
    pub compressed_bpe: f64,
    /// Thesis: load factor.
    pub thesis_load_factor: Option<f64>,
    /// Thesis: serialized MB.
    pub thesis_serialized_mb: Option<f64>,
    /// Thesis: serialized bytes per element.
    pub thesis_serialized_bpe: Option<f64>,
    /// Thesis: compressed MB.
    pub thesis_compressed_mb: Option<f64>,
    /// Thesis: compressed bytes per element.
    pub thesis_compressed_bpe: Option<f64>,
}

/// What the experiment wrote.
#[derive(Debug, Clone)]
pub struct SizeReport {
    /// The rows of both tables.
    pub rows: Vec<SizeRow>,
    /// The markdown tables.
    pub markdown: String,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// A structure the size workload runs on.
trait Subject: Sized {
    fn add(&mut self, key: &Key) -> bool;
    fn remove(&mut self, key: &Key) -> Result<(), EvalError>;
    fn join(&mut self, other: &Self) -> Result<(), EvalError>;
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError>;
    fn entries(&self, elements: u64) -> f64;
    fn load(&self, elements: u64, ops: u64) -> f64;
}

fn grow_only(what: &str) -> EvalError {
    EvalError::Options(format!("{what} is grow-only: its workloads are 100% add"))
}

fn filter_add<F: Membership>(f: &mut F, key: &Key) -> bool {
    match f.add(key.as_slice()) {
        Ok(()) => true,
        Err(FilterError::Full { .. }) => false,
        Err(e) => unreachable!("add failed with {e}"),
    }
}

impl Subject for GBloom {
    fn add(&mut self, key: &Key) -> bool {
        filter_add(self, key)
    }
    fn remove(&mut self, _: &Key) -> Result<(), EvalError> {
        Err(grow_only("GBF"))
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        Ok(self.merge(other)?)
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(self)?)
    }
    fn entries(&self, elements: u64) -> f64 {
        elements as f64
    }
    fn load(&self, _: u64, _: u64) -> f64 {
        self.load_factor()
    }
}

impl Subject for GCuckoo {
    fn add(&mut self, key: &Key) -> bool {
        filter_add(self, key)
    }
    fn remove(&mut self, _: &Key) -> Result<(), EvalError> {
        Err(grow_only("GCF"))
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        Ok(self.merge(other)?)
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(self)?)
    }
    fn entries(&self, _: u64) -> f64 {
        self.cardinality()
    }
    fn load(&self, _: u64, _: u64) -> f64 {
        self.load_factor()
    }
}

impl Subject for OrCuckoo {
    fn add(&mut self, key: &Key) -> bool {
        filter_add(self, key)
    }
    fn remove(&mut self, key: &Key) -> Result<(), EvalError> {
        // Only live keys are removed, and a filter has no false negatives, so this finds one.
        if Removable::remove(self, key.as_slice()) {
            Ok(())
        } else {
            Err(EvalError::Check("ORCF lost a live key".into()))
        }
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        Ok(self.merge(other)?)
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(self)?)
    }
    fn entries(&self, _: u64) -> f64 {
        self.cardinality()
    }
    fn load(&self, _: u64, _: u64) -> f64 {
        self.load_factor()
    }
}

/// A grow-only use of any filter (the scalable rows are 100%-add workloads).
struct AddOnly<F>(F);

impl<F: Membership + Lattice + Serialize> Subject for AddOnly<F> {
    fn add(&mut self, key: &Key) -> bool {
        filter_add(&mut self.0, key)
    }
    fn remove(&mut self, _: &Key) -> Result<(), EvalError> {
        Err(grow_only("the scalable rows"))
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        Ok(self.0.merge(&other.0)?)
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(&self.0)?)
    }
    fn entries(&self, _: u64) -> f64 {
        self.0.cardinality()
    }
    fn load(&self, _: u64, _: u64) -> f64 {
        self.0.load_factor()
    }
}

impl Subject for GSet<Key> {
    fn add(&mut self, key: &Key) -> bool {
        self.insert(*key);
        true
    }
    fn remove(&mut self, _: &Key) -> Result<(), EvalError> {
        Err(grow_only("GSet"))
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        CvRDT::merge(self, other.clone());
        Ok(())
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(self)?)
    }
    fn entries(&self, elements: u64) -> f64 {
        elements as f64
    }
    fn load(&self, elements: u64, ops: u64) -> f64 {
        elements as f64 / ops as f64
    }
}

/// An Orswot that knows its actor.
struct OrSet {
    set: Orswot<Key, u8>,
    actor: u8,
}

impl Subject for OrSet {
    fn add(&mut self, key: &Key) -> bool {
        let ctx = self.set.read_ctx().derive_add_ctx(self.actor);
        let op = self.set.add(*key, ctx);
        self.set.apply(op);
        true
    }
    fn remove(&mut self, key: &Key) -> Result<(), EvalError> {
        let ctx = self.set.contains(key).derive_rm_ctx();
        let op = self.set.rm(*key, ctx);
        self.set.apply(op);
        Ok(())
    }
    fn join(&mut self, other: &Self) -> Result<(), EvalError> {
        CvRDT::merge(&mut self.set, other.set.clone());
        Ok(())
    }
    fn to_cbor(&self) -> Result<Vec<u8>, EvalError> {
        Ok(serde_cbor::to_vec(&self.set)?)
    }
    fn entries(&self, elements: u64) -> f64 {
        elements as f64
    }
    fn load(&self, elements: u64, ops: u64) -> f64 {
        elements as f64 / ops as f64
    }
}

fn gzip_len(bytes: &[u8]) -> Result<u64, EvalError> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(bytes)
        .and_then(|_| gz.finish())
        .map(|v| v.len() as u64)
        .map_err(EvalError::io("<gzip>"))
}

/// Runs the workload of `case` on two replicas built by `make` (replica 1 idle when all
/// local), merges B into A, and measures A.
fn run_subject<S: Subject>(
    make: impl Fn(u8) -> Result<S, EvalError>,
    case: &Case,
    ops: u64,
    seed: u64,
) -> Result<SizeOutcome, EvalError> {
    let mut replicas = [make(0)?, make(1)?];
    let mut live: [Vec<Key>; 2] = [Vec::new(), Vec::new()];
    let mut keys = Keys::inserts(seed);
    let add_share = case.add_percent as f64 / 100.0;
    let mut failed_adds = 0;
    for _ in 0..ops {
        let r = usize::from(case.split && keys.coin() >= 0.5);
        // Removes are only generated for elements the replica contains (thesis 6.1).
        let is_add = live[r].is_empty() || keys.coin() < add_share;
        if is_add {
            let key = Key::new(keys.next_key());
            if replicas[r].add(&key) {
                live[r].push(key);
            } else {
                failed_adds += 1;
            }
        } else {
            let i = keys.index(live[r].len());
            let key = live[r].swap_remove(i);
            replicas[r].remove(&key)?;
        }
    }
    let [mut a, b] = replicas;
    if case.split {
        a.join(&b)?;
    }
    let elements = (live[0].len() + live[1].len()) as u64;
    let cbor = a.to_cbor()?;
    Ok(SizeOutcome {
        elements,
        entries: a.entries(elements),
        load_factor: a.load(elements, ops),
        failed_adds,
        serialized: cbor.len() as u64,
        compressed: gzip_len(&cbor)?,
    })
}

/// Runs one case once.
pub fn run_case(case: &Case, ops: u64, seed: u64) -> Result<SizeOutcome, EvalError> {
    let config = Config::thesis(ops);
    let hash_seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    match case.structure {
        Structure::Gbf => {
            let p = config.bloom(hash_seed)?;
            run_subject(|_| Ok(GBloom::new(p)?), case, ops, seed)
        }
        Structure::Gcf => {
            let p = config.cuckoo(hash_seed)?;
            run_subject(|_| Ok(GCuckoo::new(p)?), case, ops, seed)
        }
        Structure::Orcf => {
            let p = config.cuckoo(hash_seed)?;
            run_subject(|r| Ok(OrCuckoo::new(p, r as u16)?), case, ops, seed)
        }
        Structure::GSet => run_subject(|_| Ok(GSet::<Key>::new()), case, ops, seed),
        Structure::Scalable(v) => {
            let p = config.scalable(hash_seed)?;
            let r = |w: u8| w as u16;
            match (v.kind, v.design) {
                (Kind::ScGbf, Design::Thesis) => {
                    run_subject(|_| Ok(AddOnly(ScGBloom::new(p)?)), case, ops, seed)
                }
                (Kind::ScGcf, Design::Thesis) => {
                    run_subject(|_| Ok(AddOnly(ScGCuckoo::new(p)?)), case, ops, seed)
                }
                (Kind::ScOrcf, Design::Thesis) => {
                    run_subject(|w| Ok(AddOnly(ScOrCuckoo::new(p, r(w))?)), case, ops, seed)
                }
                (Kind::ScGbf, _) => run_subject(
                    |w| Ok(AddOnly(WriterScGBloom::new(p, r(w))?)),
                    case,
                    ops,
                    seed,
                ),
                (Kind::ScGcf, _) => run_subject(
                    |w| Ok(AddOnly(WriterScGCuckoo::new(p, r(w))?)),
                    case,
                    ops,
                    seed,
                ),
                (Kind::ScOrcf, _) => run_subject(
                    |w| Ok(AddOnly(WriterScOrCuckoo::new(p, r(w))?)),
                    case,
                    ops,
                    seed,
                ),
                _ => Err(EvalError::Options(format!("{v} is not scalable"))),
            }
        }
        Structure::OrSet => run_subject(
            |actor| {
                Ok(OrSet {
                    set: Orswot::new(),
                    actor,
                })
            },
            case,
            ops,
            seed,
        ),
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (n, s) = xs.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    s / n.max(1) as f64
}

fn bpe(bytes: u64, elements: u64) -> f64 {
    if elements == 0 {
        f64::INFINITY
    } else {
        bytes as f64 / elements as f64
    }
}

/// Renders the rows as the two markdown tables, our values next to the thesis's.
pub fn markdown(rows: &[SizeRow]) -> String {
    let mut md = String::new();
    for (table, caption) in [
        (1, "Table 6.1: grow-only filters and grow-only sets"),
        (2, "Table 6.2: observed-remove filters and sets"),
        (
            3,
            "Scalable filters, thesis design against per-writer design (not in the thesis)",
        ),
    ] {
        let rows: Vec<&SizeRow> = rows.iter().filter(|r| r.table == table).collect();
        if rows.is_empty() {
            continue;
        }
        let ops = rows[0].ops;
        let reps = rows[0].reps;
        let _ = writeln!(
            md,
            "**{caption}** ({ops} operations, mean of {reps} runs; \"thesis\" columns from the \
             thesis; MB = 10^6 bytes, BPE = bytes per element)\n"
        );
        let t = if table == 3 { "" } else { " (thesis)" };
        let _ = writeln!(
            md,
            "| Workload | CRDT | Load factor{t} | Serialized MB{t} | Serialized BPE{t} | \
             Compressed MB{t} | Compressed BPE{t} |"
        );
        md.push_str("|---|---|---|---|---|---|---|\n");
        let fmt_t = |v: Option<f64>, pct: bool| match v {
            Some(v) if pct => format!(" ({:.0}%)", v * 100.0),
            Some(v) => format!(" ({v:.2})"),
            None => String::new(),
        };
        for r in rows {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0}%{} | {:.2}{} | {:.2}{} | {:.2}{} | {:.2}{} |",
                r.workload,
                r.crdt,
                r.load_factor * 100.0,
                fmt_t(r.thesis_load_factor, true),
                r.serialized_mb,
                fmt_t(r.thesis_serialized_mb, false),
                r.serialized_bpe,
                fmt_t(r.thesis_serialized_bpe, false),
                r.compressed_mb,
                fmt_t(r.thesis_compressed_mb, false),
                r.compressed_bpe,
                fmt_t(r.thesis_compressed_bpe, false),
            );
        }
        md.push('\n');
    }
    md
}

/// Runs every case, writes `size.csv` and `size.md` under `<out>/size/`, and returns them.
pub fn run(opts: &SizeOptions) -> Result<SizeReport, EvalError> {
    if opts.ops == 0 || opts.reps == 0 {
        return Err(EvalError::Options(
            "need operations and at least one repetition".into(),
        ));
    }
    let dir = opts.dir();
    std::fs::create_dir_all(&dir).map_err(EvalError::io(&dir))?;
    let cases = Case::thesis();
    let jobs: Vec<(Case, u32)> = (0..opts.reps)
        .flat_map(|rep| cases.iter().map(move |&c| (c, rep)))
        .collect();
    tracing::info!(
        runs = jobs.len(),
        ops = opts.ops,
        "running the size experiment"
    );
    let bar = progress_bar(jobs.len() as u64, opts.progress, "eval size");
    let outcomes = run_jobs(&jobs, opts.jobs, &bar, |(case, rep)| {
        run_case(case, opts.ops, opts.seed.wrapping_add(*rep as u64))
    })?;
    bar.finish_and_clear();

    let rows: Vec<SizeRow> = cases
        .iter()
        .map(|case| {
            let runs: Vec<&SizeOutcome> = jobs
                .iter()
                .zip(&outcomes)
                .filter(|((c, _), _)| c == case)
                .map(|(_, o)| o)
                .collect();
            let thesis = case.thesis_values();
            let t = |i: usize| thesis.map(|v| v[i]);
            SizeRow {
                table: case.table,
                workload: case.workload(),
                crdt: case.structure.label().into(),
                reps: runs.len() as u32,
                ops: opts.ops,
                elements: mean(runs.iter().map(|o| o.elements as f64)),
                entries: mean(runs.iter().map(|o| o.entries)),
                load_factor: mean(runs.iter().map(|o| o.load_factor)),
                failed_adds: mean(runs.iter().map(|o| o.failed_adds as f64)),
                serialized_mb: mean(runs.iter().map(|o| o.serialized as f64 / 1e6)),
                serialized_bpe: mean(runs.iter().map(|o| bpe(o.serialized, o.elements))),
                compressed_mb: mean(runs.iter().map(|o| o.compressed as f64 / 1e6)),
                compressed_bpe: mean(runs.iter().map(|o| bpe(o.compressed, o.elements))),
                thesis_load_factor: t(0),
                thesis_serialized_mb: t(1),
                thesis_serialized_bpe: t(2),
                thesis_compressed_mb: t(3),
                thesis_compressed_bpe: t(4),
            }
        })
        .collect();
    let md = markdown(&rows);
    let csv_path = dir.join("size.csv");
    write_csv(&csv_path, &rows)?;
    let md_path = dir.join("size.md");
    std::fs::write(&md_path, &md).map_err(EvalError::io(&md_path))?;
    Ok(SizeReport {
        rows,
        markdown: md,
        files: vec![csv_path, md_path],
    })
}
