//! The `crpf eval` subcommand: its arguments and what it runs.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::error::EvalError;
use super::fpr::{self, FprOptions, Split};
use super::size::{self, SizeOptions};
use super::variant::Kind;
use super::workload::SyncMode;

/// `crpf eval`: the thesis's experiments (chapter 6).
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The experiment.
    #[command(subcommand)]
    pub command: EvalCommand,
}

/// The experiments.
#[derive(Debug, Clone, Subcommand)]
pub enum EvalCommand {
    /// Figure 6.1: empirical FPR against merge interval and workload split.
    Fpr(FprArgs),
    /// Tables 6.1 and 6.2: serialized and compressed size against set CRDTs.
    Size(SizeArgs),
    /// Redraws the Figure 6.1 panels and target checks from an `fpr.csv` (no rerun).
    Plot(PlotArgs),
    /// Counting cuckoo filter vs counting Bloom filter: FPR, sync accuracy and space.
    Ccf(CcfArgs),
}

/// `crpf eval ccf`.
#[derive(Debug, Clone, Args)]
pub struct CcfArgs {
    /// Options shared by the experiments.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Elements in each host's root set (default: 64000, or 4000 with --quick).
    #[arg(long)]
    pub elements: Option<u64>,
    /// Skip the figure.
    #[arg(long)]
    pub no_plots: bool,
}

impl CcfArgs {
    /// The options these arguments describe.
    pub fn options(&self) -> super::ccf::CcfOptions {
        let c = &self.common;
        let mut o = if c.quick {
            super::ccf::CcfOptions::quick(c.out.clone())
        } else {
            super::ccf::CcfOptions::full(c.out.clone())
        };
        o.elements = self.elements.unwrap_or(o.elements);
        o.reps = c.reps.unwrap_or(o.reps);
        o.seed = c.seed.unwrap_or(o.seed);
        o.jobs = c.jobs.unwrap_or(o.jobs);
        o.plots = !self.no_plots;
        o.progress = !c.no_progress;
        o
    }
}

/// `crpf eval plot`.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// The `fpr.csv` of an `eval fpr` run.
    #[arg(long)]
    pub data: PathBuf,
    /// Where the figures and `checks.csv` go.
    #[arg(long)]
    pub out: PathBuf,
}

/// Options shared by the experiments.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// A small grid that finishes in under a minute (for tests and smoke runs).
    #[arg(long)]
    pub quick: bool,
    /// Output directory.
    #[arg(long, default_value = "eval-out", env = "CRPF_EVAL_OUT")]
    pub out: PathBuf,
    /// Base seed (repetition r uses seed + r).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Repetitions (default: 5, or 2 with --quick).
    #[arg(long)]
    pub reps: Option<u32>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `crpf eval fpr`.
#[derive(Debug, Clone, Args)]
pub struct FprArgs {
    /// Options shared by the experiments.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Adds per run, as a power of two (default: 20, or 16 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=30))]
    pub adds_log2: Option<u32>,
    /// Probes per run, as a power of two (default: 20, or 16 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=30))]
    pub probes_log2: Option<u32>,
    /// Repetitions of the scalable filters (default: as --reps).
    #[arg(long)]
    pub reps_scalable: Option<u32>,
    /// Merge intervals in operations (default: 1000,...,10000000, or 100,1000,10000 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub intervals: Option<Vec<u64>>,
    /// Filter types (default: all six).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kinds: Option<Vec<Kind>>,
    /// Splits: d-(100-d), synced, all-local (default: 50-50,80-20,99-1,synced,all-local).
    #[arg(long, value_delimiter = ',')]
    pub splits: Option<Vec<Split>>,
    /// How replicas sync: exchanging delta-states or merging full states.
    #[arg(long, value_enum, default_value = "delta")]
    pub sync: SyncMode,
    /// Capacity ratio of successive scalable sub-filters (thesis: 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub growth: u32,
    /// Skip the figures.
    #[arg(long)]
    pub no_plots: bool,
}

/// `crpf eval size`.
#[derive(Debug, Clone, Args)]
pub struct SizeArgs {
    /// Options shared by the experiments.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Operations per workload, as a power of two (default: 20, or 16 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(4..=30))]
    pub ops_log2: Option<u32>,
}

impl FprArgs {
    /// The options these arguments describe.
    pub fn options(&self) -> FprOptions {
        let c = &self.common;
        let mut o = if c.quick {
            FprOptions::quick(c.out.clone())
        } else {
            FprOptions::full(c.out.clone())
        };
        if let Some(n) = self.adds_log2 {
            o.adds = 1 << n;
        }
        if let Some(n) = self.probes_log2 {
            o.probes = 1 << n;
        }
        if let Some(r) = c.reps {
            o.reps = r;
            o.reps_scalable = r;
        }
        if let Some(r) = self.reps_scalable {
            o.reps_scalable = r;
        }
        if let Some(i) = &self.intervals {
            o.intervals = i.clone();
        }
        if let Some(k) = &self.kinds {
            o.kinds = k.clone();
        }
        if let Some(s) = &self.splits {
            o.splits = s.clone();
        }
        if let Some(s) = c.seed {
            o.seed = s;
        }
        if let Some(j) = c.jobs {
            o.jobs = j;
        }
        o.sync = self.sync;
        o.growth = self.growth;
        o.plots = !self.no_plots;
        o.progress = !c.no_progress;
        o
    }
}

impl SizeArgs {
    /// The options these arguments describe.
    pub fn options(&self) -> SizeOptions {
        let c = &self.common;
        let mut o = if c.quick {
            SizeOptions::quick(c.out.clone())
        } else {
            SizeOptions::full(c.out.clone())
        };
        if let Some(n) = self.ops_log2 {
            o.ops = 1 << n;
        }
        if let Some(r) = c.reps {
            o.reps = r;
        }
        if let Some(s) = c.seed {
            o.seed = s;
        }
        if let Some(j) = c.jobs {
            o.jobs = j;
        }
        o.progress = !c.no_progress;
        o
    }
}

/// Prints how many points met their targets, and the ones that did not.
fn print_checks(checks: &[fpr::CheckRow]) {
    let graded: Vec<_> = checks
        .iter()
        .filter(|c| c.target != fpr::Target::None)
        .collect();
    let passed = graded.iter().filter(|c| c.pass).count();
    let strict = graded.iter().filter(|c| c.strict).count();
    println!(
        "targets: {passed}/{} points met (with 3-sigma sampling allowance), {strict}/{} \
         without it",
        graded.len(),
        graded.len()
    );
    for c in graded.iter().filter(|c| !c.pass) {
        println!(
            "  missed: {} {} {} interval {:?}: fpr {:.5} vs {:?} {:.5}",
            c.kind, c.design, c.split, c.interval, c.fpr, c.target, c.limit
        );
    }
}

/// Runs `crpf eval ...` and prints a summary and where the outputs went.
pub fn run(args: &EvalArgs) -> Result<(), EvalError> {
    match &args.command {
        EvalCommand::Fpr(a) => {
            let opts = a.options();
            let started = std::time::Instant::now();
            let report = fpr::run(&opts)?;
            println!(
                "eval fpr: {} points in {:.1}s",
                report.points.len(),
                started.elapsed().as_secs_f64()
            );
            print_checks(&report.checks);
            for f in &report.files {
                println!("wrote {}", f.display());
            }
        }
        EvalCommand::Plot(a) => {
            let report = fpr::replot(&a.data, &a.out)?;
            print_checks(&report.checks);
            for f in &report.files {
                println!("wrote {}", f.display());
            }
        }
        EvalCommand::Ccf(a) => {
            let report = super::ccf::run(&a.options())?;
            println!("structure,parameter,bpe,fpr,fpr_theory,accuracy_query,accuracy_decoding");
            for r in &report.rows {
                println!(
                    "{},{},{:.2},{:.6},{:.6},{:.6},{}",
                    r.structure,
                    r.parameter,
                    r.bpe,
                    r.fpr,
                    r.fpr_theory,
                    r.accuracy_query,
                    r.accuracy_decoding
                        .map_or(String::new(), |a| format!("{a:.6}"))
                );
            }
            for f in &report.files {
                println!("wrote {}", f.display());
            }
        }
        EvalCommand::Size(a) => {
            let opts = a.options();
            let started = std::time::Instant::now();
            let report = size::run(&opts)?;
            println!(
                "eval size: {} rows in {:.1}s\n",
                report.rows.len(),
                started.elapsed().as_secs_f64()
            );
            println!("{}", report.markdown);
            for f in &report.files {
                println!("wrote {}", f.display());
            }
        }
    }
    Ok(())
}
