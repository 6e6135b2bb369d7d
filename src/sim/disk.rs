//! A simulated disk: files and directories in memory, with what survives a crash of the
//! machine kept apart from what the process sees, and a crash of the process at any call.
//!
//! The model is the contract the durable code relies on, no more:
//! - a file's bytes are durable up to its last `sync_all`/`sync_data` (or a
//!   [`Disk::sync_path`] of it); after a power loss it holds those bytes plus, when it was
//!   appended to since, a random part of the appended bytes (written back or not);
//! - a name (a file or directory created, renamed or removed) is durable once its directory is
//!   synced; after a power loss each directory lists what it listed at its last sync;
//! - a crash of the process (`kill -9`) loses nothing the process wrote: the next life sees
//!   exactly the disk as it was. The crash happens *at* a call: a write may be cut short, and
//!   from then on every call fails, so nothing the dead process does later reaches the disk.
//!
//! Every call counts as one step; [`SimDisk::crash_at`] picks the step that crashes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::replica::disk::{Disk, DiskFile, ReadFile};

type Inode = u64;

#[derive(Debug, Default, Clone)]
struct Contents {
    /// What the process reads.
    data: Vec<u8>,
    /// What survives a power loss.
    synced: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    /// Names the process sees.
    files: BTreeMap<PathBuf, Inode>,
    dirs: BTreeSet<PathBuf>,
    /// Names as of each directory's last sync (what a power loss leaves).
    durable_files: BTreeMap<PathBuf, Inode>,
    durable_dirs: BTreeSet<PathBuf>,
    inodes: HashMap<Inode, Contents>,
    next_inode: Inode,
    /// Calls made so far.
    steps: u64,
    /// The call at which the process dies.
    crash_at: Option<u64>,
    crashed: bool,
    /// Calls that fail once with an I/O error (a full disk), by step.
    fail_at: BTreeSet<u64>,
    /// Decides torn writes and write-backs (seeded by [`SimDisk::new`]).
    rng: fastrand::Rng,
}

/// The simulated disk of one node (shared by its replicas and its lives).
#[derive(Debug, Clone)]
pub(crate) struct SimDisk {
    state: Arc<Mutex<State>>,
}

fn crashed() -> io::Error {
    io::Error::other("simulated crash: the process is dead")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display()))
}

impl State {
    /// Counts a call; fails it if the process is dead, dies at it, or fails it as asked.
    /// Answers whether the process dies at this very call (a write is then cut short).
    fn step(&mut self) -> io::Result<bool> {
        if self.crashed {
            return Err(crashed());
        }
        self.steps += 1;
        if self.crash_at == Some(self.steps) {
            self.crashed = true;
            return Ok(true);
        }
        if self.fail_at.remove(&self.steps) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated failure",
            ));
        }
        Ok(false)
    }

    fn parent_exists(&self, path: &Path) -> bool {
        path.parent()
            .is_none_or(|p| p.as_os_str().is_empty() || self.dirs.contains(p))
    }

    fn inode(&mut self) -> Inode {
        self.next_inode += 1;
        self.inodes.insert(self.next_inode, Contents::default());
        self.next_inode
    }
}

impl SimDisk {
    /// An empty disk whose torn writes and write-backs follow `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        let state = State {
            rng: fastrand::Rng::with_seed(seed),
            ..State::default()
        };
        let mut dirs = BTreeSet::new();
        dirs.insert(PathBuf::from("/"));
        SimDisk {
            state: Arc::new(Mutex::new(State {
                dirs: dirs.clone(),
                durable_dirs: dirs,
                ..state
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls made so far.
    pub(crate) fn steps(&self) -> u64 {
        self.lock().steps
    }

    /// The process dies at call `step` (counted from the disk's creation).
    pub(crate) fn crash_at(&self, step: u64) {
        self.lock().crash_at = Some(step);
    }

    /// The call `step` fails once with an I/O error, as a full disk would.
    pub(crate) fn fail_at(&self, step: u64) {
        self.lock().fail_at.insert(step);
    }

    /// Whether the process died.
    pub(crate) fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The next life of a process that died (or was stopped): the disk as it was, every call
    /// allowed again.
    pub(crate) fn restart(&self) {
        let mut s = self.lock();
        s.crashed = false;
        s.crash_at = None;
        s.fail_at.clear();
    }

    /// The machine lost power: only what was synced stays, with a random part of what was
    /// appended since written back. Then [`SimDisk::restart`].
    pub(crate) fn power_loss(&self) {
        let mut guard = self.lock();
        let s = &mut *guard;
        // A directory whose own entry (or a parent's) was not synced is lost with what is
        // under it.
        let durable = &s.durable_dirs;
        let kept: BTreeSet<PathBuf> = durable
            .iter()
            .filter(|d| {
                d.ancestors()
                    .skip(1)
                    .all(|a| a.as_os_str().is_empty() || durable.contains(a))
            })
            .cloned()
            .collect();
        s.durable_dirs = kept.clone();
        s.dirs = kept;
        // A file whose directory's own entry was lost (a directory made or moved and its
        // parent not synced since) is lost with it.
        let dirs = &s.dirs;
        s.files = s
            .durable_files
            .iter()
            .filter(|(p, _)| p.parent().is_some_and(|d| dirs.contains(d)))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        s.durable_files = s.files.clone();
        let live: BTreeSet<Inode> = s.files.values().copied().collect();
        s.inodes.retain(|i, _| live.contains(i));
        let mut inodes: Vec<Inode> = s.inodes.keys().copied().collect();
        inodes.sort_unstable();
        for i in inodes {
            let c = s.inodes.get_mut(&i).expect("listed");
            let mut after = c.synced.clone();
            if c.data.len() > c.synced.len() && c.data.starts_with(&c.synced) {
                let extra = &c.data[c.synced.len()..];
                let kept = s.rng.usize(..=extra.len());
                after.extend_from_slice(&extra[..kept]);
            }
            c.data = after.clone();
            c.synced = after;
        }
        drop(guard);
        self.restart();
    }

    /// Every file and its length (for a failing seed's report).
    pub(crate) fn listing(&self) -> Vec<(PathBuf, usize)> {
        let s = self.lock();
        s.files
            .iter()
            .map(|(p, i)| (p.clone(), s.inodes[i].data.len()))
            .collect()
    }
}

/// A file being written: where the next write goes.
struct SimFile {
    disk: SimDisk,
    inode: Inode,
    pos: usize,
}

impl DiskFile for SimFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut s = self.disk.lock();
        let dies = s.step()?;
        // Dying in the middle of the call: a part of it may have reached the file.
        let n = if dies {
            let n = buf.len();
            s.rng.usize(..=n)
        } else {
            buf.len()
        };
        let c = s.inodes.get_mut(&self.inode).expect("open file");
        let end = self.pos + n;
        if c.data.len() < end {
            c.data.resize(end, 0);
        }
        c.data[self.pos..end].copy_from_slice(&buf[..n]);
        self.pos = end;
        if dies { Err(crashed()) } else { Ok(()) }
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut s = self.disk.lock();
        if s.step()? {
            return Err(crashed());
        }
        let c = s.inodes.get_mut(&self.inode).expect("open file");
        c.data.resize(len as usize, 0);
        self.pos = len as usize;
        Ok(())
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.sync_data()
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let mut s = self.disk.lock();
        if s.step()? {
            return Err(crashed());
        }
        let c = s.inodes.get_mut(&self.inode).expect("open file");
        c.synced = c.data.clone();
        Ok(())
    }
}

impl SimDisk {
    /// Opens `path` for writing: a new file (failing if one exists, with `exclusive`), or the
    /// existing one emptied (with `truncate`) or as it is.
    fn open_file(&self, path: &Path, exclusive: bool, truncate: bool) -> io::Result<SimFile> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        if !s.parent_exists(path) || s.dirs.contains(path) {
            return Err(not_found(path));
        }
        let inode = match s.files.get(path).copied() {
            Some(_) if exclusive => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}", path.display()),
                ));
            }
            Some(i) => {
                if truncate {
                    s.inodes.get_mut(&i).expect("named").data.clear();
                }
                i
            }
            None if exclusive || truncate => {
                let i = s.inode();
                s.files.insert(path.to_path_buf(), i);
                i
            }
            None => return Err(not_found(path)),
        };
        Ok(SimFile {
            disk: self.clone(),
            inode,
            pos: 0,
        })
    }
}

impl Disk for SimDisk {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        let i = *s.files.get(path).ok_or_else(|| not_found(path))?;
        Ok(s.inodes[&i].data.clone())
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn ReadFile>, u64)> {
        let data = self.read(path)?;
        let len = data.len() as u64;
        Ok((Box::new(Cursor::new(data)), len))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(self.open_file(path, true, false)?))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(self.open_file(path, false, true)?))
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(self.open_file(path, false, false)?))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        if !s.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let child = |p: &PathBuf| {
            (p.parent() == Some(dir))
                .then(|| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
                .flatten()
        };
        Ok(s.files
            .keys()
            .chain(s.dirs.iter())
            .filter_map(child)
            .collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.lock().dirs.contains(path)
    }

    fn exists(&self, path: &Path) -> bool {
        let s = self.lock();
        s.dirs.contains(path) || s.files.contains_key(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        for p in path.ancestors() {
            if !p.as_os_str().is_empty() {
                s.dirs.insert(p.to_path_buf());
            }
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        if !s.parent_exists(to) {
            return Err(not_found(to));
        }
        if let Some(i) = s.files.remove(from) {
            s.files.insert(to.to_path_buf(), i);
            return Ok(());
        }
        if !s.dirs.contains(from) {
            return Err(not_found(from));
        }
        // A directory moves with everything under it.
        let moved = |p: &Path| to.join(p.strip_prefix(from).expect("under it"));
        let dirs: Vec<PathBuf> = s
            .dirs
            .iter()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        for d in dirs {
            s.dirs.remove(&d);
            s.dirs.insert(moved(&d));
        }
        let files: Vec<(PathBuf, Inode)> = s
            .files
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in files {
            s.files.remove(&p);
            s.files.insert(moved(&p), i);
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        s.files
            .remove(path)
            .map(drop)
            .ok_or_else(|| not_found(path))
    }

    fn sync_path(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if s.step()? {
            return Err(crashed());
        }
        if let Some(&i) = s.files.get(path) {
            let c = s.inodes.get_mut(&i).expect("named");
            c.synced = c.data.clone();
            return Ok(());
        }
        if !s.dirs.contains(path) {
            return Err(not_found(path));
        }
        // The directory's entries as the process sees them become the durable ones. A moved
        // directory's contents come along with its new name (their own entries are synced
        // in their own directories, or were before the move).
        let s = &mut *s;
        let under = |p: &Path| p.parent() == Some(path);
        s.durable_files.retain(|p, _| !under(p));
        s.durable_dirs.retain(|p| !under(p));
        for (p, i) in &s.files {
            if under(p) {
                s.durable_files.insert(p.clone(), *i);
            }
        }
        for p in &s.dirs {
            if under(p) {
                s.durable_dirs.insert(p.clone());
            }
        }
        Ok(())
    }
}
