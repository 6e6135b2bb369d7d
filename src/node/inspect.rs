//! `crpf inspect`: what a replica's snapshot holds.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::NodeError;
use crate::replica::durable::SNAPSHOT_FILE;
use crate::replica::{AnyFilter, DataDir, FilterStats, Identity};
use crate::wire::FilterKind;

/// `crpf inspect FILE`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// A snapshot file (`state.snap`) or the data directory that holds one.
    pub path: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write the filter (a `go_bloom` one) in another library's format to `--out` instead of
    /// the summary: `bits-and-blooms` (Go's `WriteTo`, what its `ReadFrom` reads) or
    /// `bits-and-blooms-json` (its `MarshalJSON`).
    #[arg(long, value_name = "FORMAT", requires = "out")]
    pub export: Option<crate::GoFormat>,
    /// Where `--export` writes (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report {
    file: PathBuf,
    filter: String,
    kind: FilterKind,
    identity: Identity,
    params_digest: String,
    reserved_tags_up_to: u64,
    state_bytes: usize,
    figures: FilterStats,
}

/// Reads and checks a snapshot (its checksum, then the state itself) and prints a summary.
pub fn run_inspect(args: &InspectArgs) -> Result<(), NodeError> {
    let dir = if args.path.is_dir() {
        args.path.clone()
    } else if args.path.file_name().is_some_and(|n| n == SNAPSHOT_FILE) {
        args.path.parent().map(PathBuf::from).unwrap_or_default()
    } else {
        return Err(NodeError::Failed(format!(
            "{}: give a `{SNAPSHOT_FILE}` file or the data directory holding one",
            args.path.display()
        )));
    };
    let snap = DataDir::open(&dir)?
        .load_snapshot()?
        .ok_or_else(|| NodeError::Failed(format!("no {SNAPSHOT_FILE} in {}", dir.display())))?;
    let filter = AnyFilter::decode_state(snap.kind, &snap.state)
        .map_err(|e| NodeError::Failed(format!("the snapshot's state does not decode: {e}")))?;
    if let Some(format) = args.export {
        let bytes = crate::replica::interop::export(&filter, format)
            .map_err(|e| NodeError::Failed(e.to_string()))?;
        let out = args.out.as_deref().unwrap_or(std::path::Path::new("-"));
        if out == std::path::Path::new("-") {
            use std::io::Write;
            std::io::stdout()
                .write_all(&bytes)
                .map_err(|e| NodeError::Failed(format!("standard output: {e}")))?;
        } else {
            std::fs::write(out, &bytes)
                .map_err(|e| NodeError::Failed(format!("{}: {e}", out.display())))?;
        }
        return Ok(());
    }
    let report = Report {
        file: dir.join(SNAPSHOT_FILE),
        filter: snap.filter,
        kind: snap.kind,
        identity: snap.identity,
        params_digest: format!("{:016x}", snap.params_digest),
        reserved_tags_up_to: snap.reserved,
        state_bytes: snap.state.len(),
        figures: filter.stats(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| NodeError::Failed(e.to_string()))?
        );
    } else {
        let f = &report.figures;
        println!("snapshot      {}", report.file.display());
        println!("filter        {} ({:?})", report.filter, report.kind);
        println!(
            "replica       id {} uuid {}",
            report.identity.replica, report.identity.uuid
        );
        println!("parameters    digest {}", report.params_digest);
        println!(
            "tags reserved up to timestamp {}",
            report.reserved_tags_up_to
        );
        println!("state         {} bytes", report.state_bytes);
        println!(
            "cardinality   {:.0} of capacity {}",
            f.cardinality, f.capacity
        );
        println!("load factor   {:.2}%", 100.0 * f.load_factor);
        println!("estimated FPR {:.5}%", 100.0 * f.estimated_fpr);
        println!("sub-filters   {}", f.sub_filters);
        println!("clock         {}", f.clock);
    }
    Ok(())
}
