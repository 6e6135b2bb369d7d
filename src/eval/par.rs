//! Runs independent jobs on a few threads, with a progress bar.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::error::EvalError;

/// A progress bar on stderr (drawn only on a terminal), or a hidden one.
pub(crate) fn progress_bar(len: u64, visible: bool, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} runs, eta {eta} {msg}",
        )
        .expect("static template"),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// Runs `f` on every job with `threads` workers pulling from a shared index, and returns the
/// results in job order. Stops handing out jobs after the first error, and returns it.
pub(crate) fn run_jobs<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    bar: &ProgressBar,
    f: impl Fn(&J) -> Result<R, EvalError> + Sync,
) -> Result<Vec<R>, EvalError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<R, EvalError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.clamp(1, jobs.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        let r = f(job);
                        failed.fetch_or(r.is_err(), Ordering::Relaxed);
                        results.lock().expect("no panics while locked")[i] = Some(r);
                        bar.inc(1);
                    }
                })
            })
            .collect();
        for w in workers {
            if let Err(panic) = w.join() {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                results
                    .lock()
                    .expect("no panics while locked")
                    .push(Some(Err(EvalError::Worker(msg))));
            }
        }
    });
    let results = results.into_inner().expect("workers joined");
    // Jobs are handed out in order and every started job stores its result, so the first
    // error is the one that stopped the others; a slot left empty means a panic.
    let mut out = Vec::with_capacity(jobs.len());
    let mut missing = false;
    for r in results {
        match r {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => return Err(e),
            None => missing = true,
        }
    }
    if missing || out.len() != jobs.len() {
        return Err(EvalError::Worker("jobs were left unfinished".into()));
    }
    Ok(out)
}
