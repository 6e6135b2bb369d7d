//! The `crpf` command line. Each subcommand's arguments and `run` live in the library module
//! that implements it (`crpf::eval::cli` for `eval`), so that adding one (`node`, `demo`,
//! `inspect`) is a variant here and an arm in `main`.

use std::io::IsTerminal;
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
    /// Runs the replicas a configuration declares, over NATS or an in-process bus, with a
    /// Prometheus exporter, until SIGINT/SIGTERM (final snapshots, NATS drained).
    Node(crpf::node::NodeArgs),
    /// Runs a few replicas in one process, drives a workload, and shows convergence and FPR
    /// live (no server needed; `--nats URL` for a real one).
    Demo(crpf::node::DemoArgs),
    /// Prints what a replica's snapshot holds.
    Inspect(crpf::node::InspectArgs),
    /// Writes a new cluster key (`node.auth_key_file`; the same file on every node).
    Keygen(crpf::node::KeygenArgs),
    /// Runs the thesis's experiments (Figure 6.1, Tables 6.1 and 6.2).
    Eval(crpf::eval::EvalArgs),
}

/// jemalloc returns what is freed to the system (a node's parked replicas, say: see
/// CHANGELOG.md's benchmark history, "Many filters"), which glibc's malloc mostly keeps.
#[cfg(all(feature = "jemalloc", target_os = "linux"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Purged by a thread of jemalloc's own (one: it has little to do), so that an idle node,
    // whose threads no longer allocate, gives back what it freed within seconds.
    #[cfg(all(feature = "jemalloc", target_os = "linux"))]
    if let Err(e) = tikv_jemalloc_ctl::max_background_threads::write(1)
        .and_then(|()| tikv_jemalloc_ctl::background_thread::write(true))
    {
        eprintln!("jemalloc background purging not enabled: {e}");
    }
    let cli = Cli::parse();
    // Logs go to stderr so that stdout keeps the summaries: RUST_LOG, else a node's `[node]
    // log` (read here, before the node starts; a config that does not load is reported by the
    // node itself), else info for a node and warn otherwise.
    let default_level = match &cli.command {
        Command::Node(args) => crpf::node::NodeConfig::load(&args.config)
            .map(|c| c.node.log)
            .unwrap_or_else(|_| "info".into()),
        _ => "warn".into(),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // A loaded config's `log` was validated.
        EnvFilter::try_new(&default_level).unwrap_or_else(|_| EnvFilter::new("info"))
    });
    // Colours only on a terminal: escape codes make a log file or a pipe hard to read.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result: Result<(), Box<dyn std::error::Error>> = match &cli.command {
        Command::Node(args) => crpf::node::run_node(args).map_err(Into::into),
        Command::Demo(args) => crpf::node::run_demo(args).map_err(Into::into),
        Command::Inspect(args) => crpf::node::run_inspect(args).map_err(Into::into),
        Command::Keygen(args) => crpf::node::run_keygen(args).map_err(Into::into),
        Command::Eval(args) => crpf::eval::run(args).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error chain, one cause per line (a cause the line above already quotes is
            // not repeated).
            let mut above = e.to_string();
            eprintln!("error: {above}");
            let mut source = e.source();
            while let Some(s) = source {
                let line = s.to_string();
                if !above.contains(&line) {
                    eprintln!("  caused by: {line}");
                }
                above = line;
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}
