//! The `crpf` command line. Each subcommand's arguments and `run` live in the library module
//! that implements it (`crpf::eval::cli` for `eval`), so that adding one (`node`, `demo`,
//! `inspect`) is a variant here and an arm in `main`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Conflict-free replicated probabilistic filters.
#[derive(Debug, Parser)]
#[command(name = "crpf", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the thesis's experiments (Figure 6.1, Tables 6.1 and 6.2).
    Eval(crpf::eval::EvalArgs),
}

fn main() -> ExitCode {
    // Logs go to stderr (RUST_LOG, default warn) so that stdout keeps the summaries.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Eval(args) => crpf::eval::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error chain, one cause per line.
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}
