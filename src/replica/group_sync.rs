//! Group syncs: the fsyncs that many replicas ask for at once, made as one.
//!
//! A filter created on a node with a data directory makes four things durable before it
//! serves: its directory's entry, its log directory's entry, its first snapshot and that
//! snapshot's name. Each was its own fsync, and on a virtualised disk a burst of creates
//! spent its time in the kernel's fsync path (issue 23: 1,200 creates/s with a data
//! directory, 3,170 without). Here a caller's file or directory joins the next round of its
//! file system: one thread makes the round, the others wait for it. A round of one file is
//! that file's fsync, as before; a round of several is one `syncfs` of their file system
//! (Linux), which makes every one of them durable with one journal commit and one cache
//! flush. Elsewhere a round fsyncs each of its files in turn.
//!
//! A caller's file is durable once a round that began after the caller asked has ended;
//! rounds of one file system never overlap, so a round that was already under way when it
//! asked does not count. A round's error is every one of its callers' error.
//!
//! `syncfs` writes back whatever else is dirty on that file system too: rounds of many
//! files are what a burst of creates or snapshots makes, and a quiet node's single syncs
//! stay plain fsyncs.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// Makes `path` (a file or a directory) durable, in the next round of its file system.
pub(crate) fn sync(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    let device = device_of(&file)?;
    group_of(device).sync(vec![file])
}

/// Makes every one of `paths` durable in one round (issue 53: a new filter's directory,
/// its files and its entry in the node's data directory, in one round where they took
/// four): those on one file system join its next round together; those on others (rare:
/// a data directory spanning mounts) are synced in turn, each in a round of its own system.
pub(crate) fn sync_many(paths: &[&Path]) -> io::Result<()> {
    let mut by_device: Vec<(u64, Vec<File>)> = Vec::new();
    for path in paths {
        let file = File::open(path)?;
        let device = device_of(&file)?;
        match by_device.iter_mut().find(|(d, _)| *d == device) {
            Some((_, files)) => files.push(file),
            None => by_device.push((device, vec![file])),
        }
    }
    by_device
        .into_iter()
        .try_for_each(|(device, files)| group_of(device).sync(files))
}

/// Rounds ended so far on `path`'s file system (for tests).
#[cfg(test)]
fn rounds_of(path: &Path) -> u64 {
    let device = device_of(&File::open(path).unwrap()).unwrap();
    let group = group_of(device);
    group.lock().finished
}

#[cfg(unix)]
fn device_of(file: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(file.metadata()?.dev())
}

#[cfg(not(unix))]
fn device_of(_: &File) -> io::Result<u64> {
    Ok(0)
}

fn group_of(device: u64) -> Arc<Group> {
    static GROUPS: OnceLock<Mutex<HashMap<u64, Arc<Group>>>> = OnceLock::new();
    let groups = GROUPS.get_or_init(Default::default);
    let mut groups = groups.lock().unwrap_or_else(|e| e.into_inner());
    groups.entry(device).or_default().clone()
}

/// The rounds of one file system.
#[derive(Default)]
struct Group {
    state: Mutex<State>,
    round_ended: Condvar,
}

#[derive(Default)]
struct State {
    /// Files that asked since the last round began.
    waiting: Vec<File>,
    /// Rounds begun.
    begun: u64,
    /// Rounds ended (one runs at a time: `begun` or `begun - 1`).
    finished: u64,
    /// Failed rounds whose callers have not all read the error yet: round, error, readers
    /// left.
    failures: Vec<(u64, io::ErrorKind, String, usize)>,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync(&self, files: Vec<File>) -> io::Result<()> {
        let mut state = self.lock();
        state.waiting.extend(files);
        // The round that takes this file: the next to begin.
        let round = state.begun + 1;
        loop {
            if state.finished >= round {
                return Self::outcome(&mut state, round);
            }
            if state.finished == state.begun {
                // No round under way: this caller makes the next one, with everyone waiting.
                let files = std::mem::take(&mut state.waiting);
                state.begun += 1;
                let this = state.begun;
                let callers = files.len();
                drop(state);
                let result = sync_together(&files);
                drop(files);
                state = self.lock();
                state.finished = this;
                if let Err(e) = result {
                    state
                        .failures
                        .push((this, e.kind(), e.to_string(), callers));
                }
                self.round_ended.notify_all();
                continue;
            }
            state = self
                .round_ended
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn outcome(state: &mut State, round: u64) -> io::Result<()> {
        let Some(at) = state.failures.iter().position(|f| f.0 == round) else {
            return Ok(());
        };
        let failure = &mut state.failures[at];
        let error = io::Error::new(failure.1, failure.2.clone());
        failure.3 -= 1;
        if failure.3 == 0 {
            state.failures.swap_remove(at);
        }
        Err(error)
    }
}

/// One round: the file's own fsync when it is alone, else one sync of their file system.
fn sync_together(files: &[File]) -> io::Result<()> {
    match files {
        [] => Ok(()),
        [one] => one.sync_all(),
        many => sync_file_system(many),
    }
}

#[cfg(target_os = "linux")]
fn sync_file_system(files: &[File]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open (borrowed from a live `File`) for the whole call.
    match unsafe { libc::syncfs(files[0].as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(not(target_os = "linux"))]
fn sync_file_system(files: &[File]) -> io::Result<()> {
    files.iter().try_for_each(File::sync_all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lone_sync_and_a_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a");
        std::fs::write(&file, b"x").unwrap();
        sync(&file).unwrap();
        sync(dir.path()).unwrap();
        let missing = sync(&dir.path().join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    /// Callers that ask while a round is under way are made durable together, by one round
    /// that begins after they asked.
    #[test]
    fn callers_waiting_on_a_round_share_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let group = Arc::new(Group::default());
        // A round under way, begun before any of the callers asked.
        group.lock().begun = 1;
        let callers: Vec<_> = (0..8)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::fs::write(&path, b"x").unwrap();
                let group = group.clone();
                std::thread::spawn(move || group.sync(vec![File::open(&path).unwrap()]))
            })
            .collect();
        while group.lock().waiting.len() < 8 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // None of them counts the earlier round as theirs.
        std::thread::sleep(Duration::from_millis(20));
        assert!(callers.iter().all(|c| !c.is_finished()));
        {
            let mut state = group.lock();
            state.finished = 1;
            group.round_ended.notify_all();
        }
        for caller in callers {
            caller.join().unwrap().unwrap();
        }
        let state = group.lock();
        assert_eq!(
            (state.begun, state.finished),
            (2, 2),
            "one round for all eight"
        );
        assert!(state.waiting.is_empty());
    }

    /// A failed round fails each of its callers, once, and not the callers of later rounds.
    #[test]
    fn a_failed_round_fails_each_of_its_callers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let group = Group::default();
        {
            let mut state = group.lock();
            state.begun = 3;
            state.finished = 3;
            state
                .failures
                .push((3, io::ErrorKind::Other, "disk".into(), 2));
            let first = Group::outcome(&mut state, 3).unwrap_err();
            assert_eq!(first.to_string(), "disk");
            Group::outcome(&mut state, 3).unwrap_err();
            assert!(state.failures.is_empty(), "read by both callers");
        }
        group.sync(vec![File::open(&path).unwrap()]).unwrap();
    }

    #[test]
    fn syncs_from_many_threads_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let before = rounds_of(dir.path());
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::thread::spawn(move || {
                    std::fs::write(&path, b"x").unwrap();
                    sync(&path)
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        // Other tests sync on this file system too: at least one round was made.
        assert!(rounds_of(dir.path()) > before);
    }
}
