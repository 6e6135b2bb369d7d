//! Crash points: named steps of the durability cycle (log write, fsync, rotation, snapshot,
//! segment removal, park, resume, shutdown) where a test makes the process die at once, or
//! where a write fails, so that every step's crash is checked from outside the process
//! (tests/crash_points.rs): the process restarts and every acknowledged update must be there.
//!
//! Inert unless the environment names a point, read once:
//! - `CRPF_CRASH_AT=<point>[:<nth>][@<after>]`: the `nth` (default 1st) time the process
//!   reaches `point` (counting only once it has reached point `after`, if named), it aborts
//!   ([`std::process::abort`]: like `kill -9`, no destructor runs and nothing is flushed),
//!   after one line on stderr naming the point;
//! - `CRPF_FAIL_AT=<point>[:<nth>]`: the `nth` time a fallible step named `point` runs, it
//!   fails with an I/O error instead (once), as a full or failing disk would.
//!
//! Unarmed, a point costs a load of an initialised [`OnceLock`] and a branch.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The environment variable that arms a crash point.
pub const CRASH_AT: &str = "CRPF_CRASH_AT";
/// The environment variable that arms a failure point.
pub const FAIL_AT: &str = "CRPF_FAIL_AT";

/// Every crash point, for tests and documentation (each is reached where its name says).
pub const POINTS: &[&str] = &[
    WAL_BEFORE_WRITE,
    WAL_AFTER_WRITE,
    WAL_AFTER_FSYNC,
    WAL_ROTATE,
    WAL_REMOVE,
    SNAPSHOT_BEFORE_RENAME,
    SNAPSHOT_AFTER_RENAME,
    RESERVATION_BEFORE_RENAME,
    DATA_DIR_MADE,
    PARK_BEFORE_SNAPSHOT,
    PARK_STATE_TAKEN,
    PARK_PARKED,
    RESUME,
    RESTORED,
    RESUME_RESTORED,
    SHUTDOWN_BEFORE_SNAPSHOT,
    SHUTDOWN_AFTER_SNAPSHOT,
    NODE_STOPPED,
];

/// A log frame is about to be written.
pub const WAL_BEFORE_WRITE: &str = "wal.before_write";
/// A log frame is written, not fsynced.
pub const WAL_AFTER_WRITE: &str = "wal.after_write";
/// A durable frame is fsynced, its appends not answered yet.
pub const WAL_AFTER_FSYNC: &str = "wal.after_fsync";
/// A segment ends (synced), the next not begun.
pub const WAL_ROTATE: &str = "wal.rotate";
/// A covered segment was removed, others may remain (the directory not synced yet).
pub const WAL_REMOVE: &str = "wal.remove";
/// A snapshot's temporary file is written and synced, not renamed over the snapshot.
pub const SNAPSHOT_BEFORE_RENAME: &str = "snapshot.before_rename";
/// A snapshot is renamed and its directory synced; the segments it covers not removed.
pub const SNAPSHOT_AFTER_RENAME: &str = "snapshot.after_rename";
/// A tag reservation's temporary file is written and synced, not renamed.
pub const RESERVATION_BEFORE_RENAME: &str = "reservation.before_rename";
/// A new replica's data directory is made (with its log's directory and its catalog entry's
/// temporary file), nothing in it synced: its first save makes it durable.
pub const DATA_DIR_MADE: &str = "data_dir.made";
/// An idle replica is about to write the snapshot it parks on.
pub const PARK_BEFORE_SNAPSHOT: &str = "park.before_snapshot";
/// A parking replica's state is taken, its actor stopping; the node does not hold it yet.
pub const PARK_STATE_TAKEN: &str = "park.state_taken";
/// The node holds a parked replica's state.
pub const PARK_PARKED: &str = "park.parked";
/// A parked replica runs again, nothing of the request that woke it done yet.
pub const RESUME: &str = "resume";
/// The node holds a replica restored parked from its data directory as it starts.
pub const RESTORED: &str = "restored";
/// A replica restored parked runs again (its first resume), nothing of the request that
/// woke it done yet ([`RESUME`] counts the resumes of replicas parked while running).
pub const RESUME_RESTORED: &str = "resume.restored";
/// A stopping replica is about to write its final snapshot.
pub const SHUTDOWN_BEFORE_SNAPSHOT: &str = "shutdown.before_snapshot";
/// A stopping replica wrote its final snapshot (or had nothing to save).
pub const SHUTDOWN_AFTER_SNAPSHOT: &str = "shutdown.after_snapshot";
/// Every replica of a stopping node stopped; the process has not exited.
pub const NODE_STOPPED: &str = "node.stopped";

/// Every failure point.
pub const FAILS: &[&str] = &[FAIL_WAL_WRITE, FAIL_WAL_FSYNC, FAIL_SNAPSHOT_WRITE];

/// Fails a log frame's write.
pub const FAIL_WAL_WRITE: &str = "wal.write";
/// Fails a log fsync.
pub const FAIL_WAL_FSYNC: &str = "wal.fsync";
/// Fails a snapshot's write.
pub const FAIL_SNAPSHOT_WRITE: &str = "snapshot.write";

/// A point named by the environment, and how often it was reached.
struct Armed {
    point: String,
    nth: u64,
    hits: AtomicU64,
    /// Reaches of `point` count only once this point was reached: a step that comes a
    /// varying number of times before the one a drill means (a log fsync after a resume:
    /// how many came before the filters parked depends on the machine's pace).
    after: Option<(String, AtomicBool)>,
}

impl Armed {
    fn from_env(var: &str, known: &[&str]) -> Option<Armed> {
        let spec = std::env::var(var).ok()?;
        let (armed, after) = match spec.split_once('@') {
            Some((armed, after)) => (armed, Some(after)),
            None => (spec.as_str(), None),
        };
        let (point, nth) = match armed.rsplit_once(':') {
            Some((p, n)) => (p, n.parse().unwrap_or(0)),
            None => (armed, 1),
        };
        if nth == 0 || !known.contains(&point) || after.is_some_and(|a| !known.contains(&a)) {
            // Said at once: a drill whose point never comes would otherwise wait in vain.
            eprintln!("crpf: {var}={spec} names no point (known: {known:?}, nth from 1): ignored");
            return None;
        }
        Some(Armed {
            point: point.to_string(),
            nth,
            hits: AtomicU64::new(0),
            after: after.map(|a| (a.to_string(), AtomicBool::new(false))),
        })
    }

    /// Whether this reach of `name` is the armed one.
    fn reached(&self, name: &str) -> Option<u64> {
        if let Some((after, seen)) = &self.after {
            if after == name {
                seen.store(true, Ordering::Release);
            } else if self.point == name && !seen.load(Ordering::Acquire) {
                return None;
            }
        }
        if self.point != name {
            return None;
        }
        let n = self.hits.fetch_add(1, Ordering::Relaxed) + 1;
        (n == self.nth).then_some(n)
    }
}

static CRASH: OnceLock<Option<Armed>> = OnceLock::new();
static FAIL: OnceLock<Option<Armed>> = OnceLock::new();

fn armed(
    cell: &'static OnceLock<Option<Armed>>,
    var: &str,
    known: &[&str],
) -> Option<&'static Armed> {
    cell.get_or_init(|| Armed::from_env(var, known)).as_ref()
}

/// The process reached `name`: aborts it if `CRPF_CRASH_AT` names this reach.
#[inline]
pub fn point(name: &'static str) {
    if let Some(a) = armed(&CRASH, CRASH_AT, POINTS) {
        crash(a, name);
    }
}

#[cold]
fn crash(a: &Armed, name: &str) {
    if let Some(n) = a.reached(name) {
        // Unbuffered, before anything else: the test checks which point ended the process.
        eprintln!("crpf: crash point {name} (reach {n}): aborting");
        std::process::abort();
    }
}

/// A fallible step named `name`: an injected error if `CRPF_FAIL_AT` names this run of it.
#[inline]
pub fn fail(name: &'static str) -> std::io::Result<()> {
    match armed(&FAIL, FAIL_AT, FAILS) {
        None => Ok(()),
        Some(a) => injected(a, name),
    }
}

#[cold]
fn injected(a: &Armed, name: &str) -> std::io::Result<()> {
    match a.reached(name) {
        None => Ok(()),
        Some(n) => {
            tracing::error!(point = name, reach = n, "injected I/O failure ({FAIL_AT})");
            Err(std::io::Error::other(format!(
                "injected failure at {name} ({FAIL_AT})"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_is_reached_at_its_nth_time_only() {
        let a = Armed {
            point: "p".into(),
            nth: 3,
            hits: AtomicU64::new(0),
            after: None,
        };
        assert_eq!(a.reached("q"), None);
        assert_eq!(a.reached("p"), None);
        assert_eq!(a.reached("p"), None);
        assert_eq!(a.reached("p"), Some(3));
        assert_eq!(a.reached("p"), None);
    }

    #[test]
    fn a_point_armed_after_another_counts_from_that_one_on() {
        let a = Armed {
            point: "p".into(),
            nth: 2,
            hits: AtomicU64::new(0),
            after: Some(("q".into(), AtomicBool::new(false))),
        };
        for _ in 0..5 {
            assert_eq!(a.reached("p"), None);
        }
        assert_eq!(a.reached("q"), None);
        assert_eq!(a.reached("p"), None);
        assert_eq!(a.reached("p"), Some(2));
        assert_eq!(a.reached("p"), None);
    }

    #[test]
    fn every_point_name_is_distinct() {
        let mut names = [POINTS, FAILS].concat();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POINTS.len() + FAILS.len());
    }
}
