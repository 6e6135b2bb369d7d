//! Durability: the replica's data directory.
//!
//! Two files, each written atomically (temporary file, fsync, rename, fsync of the directory)
//! and framed as `magic | version | length (u64 LE) | xxh3-64 of the payload (u64 LE) | payload`,
//! so that a torn or tampered file is detected and never loaded:
//! - `state.snap`: the identity (uuid, replica id) and the full state, at an interval and on
//!   shutdown;
//! - `tags.hwm`: the identity and the reserved tag high-water mark, written *before* any tag
//!   above the previous mark is issued. A restart advances the clock past it, so no tag is
//!   issued twice (docs/DESIGN.md section 4) even if the snapshot is older than the crash.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;
use xxhash_rust::xxh3::xxh3_64;

use super::crash;
use super::disk::{self, Disk};
use crate::ReplicaId;
use crate::core::codec::{from_cbor, to_cbor};
use crate::wire::FilterKind;

const SNAP_MAGIC: &[u8; 8] = b"crpfsnap";
const HWM_MAGIC: &[u8; 8] = b"crpftags";
const FILE_VERSION: u8 = 1;
const FRAME_HEADER: usize = 8 + 1 + 8 + 8;

/// Name of the snapshot file.
pub const SNAPSHOT_FILE: &str = "state.snap";
/// Name of the tag reservation file.
pub const HWM_FILE: &str = "tags.hwm";

/// What can go wrong with the data directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DurableError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is torn, truncated or tampered with (bad frame or checksum).
    #[error("{path}: corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The snapshot belongs to another filter, kind or parameters.
    #[error("{path}: snapshot of {found}, this replica is {expected}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What the snapshot is.
        found: String,
        /// What the configuration says.
        expected: String,
    },
}

/// Who a replica is: its uuid (the claimant of its id in the KV bucket) and replica id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The replica's uuid.
    pub uuid: Uuid,
    /// Its replica id.
    pub replica: ReplicaId,
}

/// The content of `state.snap`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Whose state it is.
    pub identity: Identity,
    /// Filter name.
    pub filter: String,
    /// Filter type.
    pub kind: FilterKind,
    /// Parameter digest.
    pub params_digest: u64,
    /// The tag reservation when the snapshot was taken.
    pub reserved: u64,
    /// The encoded state.
    #[serde(with = "serde_bytes")]
    pub state: Vec<u8>,
    /// The last write-ahead log segment whose records the state holds (see
    /// [`super::wal`]): a restart replays only the later ones.
    #[serde(default)]
    pub wal_covered: Option<u64>,
}

/// The content of `tags.hwm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Whose reservation it is.
    pub identity: Identity,
    /// No tag above this timestamp has been issued under `identity.replica`.
    pub reserved: u64,
}

/// A replica's data directory.
#[derive(Debug, Clone)]
pub struct DataDir {
    path: PathBuf,
    disk: Arc<dyn Disk>,
    /// A directory made by [`DataDir::open_new`] whose first save has not been made: what
    /// that save makes durable with it (shared by the clones: the actor's snapshot jobs).
    fresh: Arc<Mutex<Option<Fresh>>>,
}

/// What a new data directory makes durable with its first save (issue 53: a create cost
/// a node six sync rounds, four of them before its answer: the directory's entry, its log
/// directory's, the first snapshot's file and name; then the catalog entry's file and name).
/// Made durable in the first save's two rounds instead: its temporary file with these files
/// and directory entries, then, once renamed, the directory's entries.
#[derive(Debug, Default)]
struct Fresh {
    /// Files written with the directory as `<name>.tmp`, renamed to `<name>` by the first
    /// save (after its first round made them durable).
    files: Vec<String>,
    /// Directories whose entries are not durable yet: the new directory (its log's
    /// directory, its files) and its parent (the new directory).
    dirs: Vec<PathBuf>,
}

impl DataDir {
    /// A data directory known to exist (a parked replica's, resumed): nothing is checked or
    /// made.
    pub(crate) fn existing(path: PathBuf) -> Self {
        DataDir {
            path,
            disk: disk::real(),
            fresh: Arc::default(),
        }
    }

    /// [`DataDir::open`], where a directory it makes in an existing parent is made with its
    /// log's directory and `files` (name, bytes) and nothing synced: its first save
    /// ([`DataDir::save_snapshot`] or [`DataDir::save_reservation`]) makes all of it durable
    /// in that save's two sync rounds. Nothing in it is durable before that save returns:
    /// a replica saves before it answers anything (its first snapshot, at its start), and a
    /// log's first synced segment syncs the directories above it too (`wal::writer`). An
    /// existing directory (or one deeper than a missing parent) opens as
    /// [`DataDir::open`] does, and `files` are not written.
    pub(crate) fn open_new(
        path: impl Into<PathBuf>,
        files: &[(String, Vec<u8>)],
    ) -> Result<Self, DurableError> {
        Self::open_new_on(disk::real(), path, files)
    }

    /// [`DataDir::open_new`] on `disk`.
    pub(crate) fn open_new_on(
        disk: Arc<dyn Disk>,
        path: impl Into<PathBuf>,
        files: &[(String, Vec<u8>)],
    ) -> Result<Self, DurableError> {
        let path = path.into();
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty() && disk.is_dir(p))
            .map(Path::to_path_buf);
        let Some(parent) = parent.filter(|_| !disk.exists(&path)) else {
            return Self::open_on(disk, path);
        };
        let wal = path.join(super::wal::WAL_DIR);
        disk.create_dir_all(&wal).map_err(io_at(&wal))?;
        for (name, bytes) in files {
            write_temporary(&*disk, &path, name, bytes)?;
        }
        crash::point(crash::DATA_DIR_MADE);
        let fresh = Fresh {
            files: files.iter().map(|(n, _)| n.clone()).collect(),
            dirs: vec![path.clone(), parent],
        };
        Ok(DataDir {
            path,
            disk,
            fresh: Arc::new(Mutex::new(Some(fresh))),
        })
    }

    /// Opens (creating it if needed) a data directory. A directory it creates has its entry
    /// fsynced in its parent: what is made durable inside it later (a snapshot, a
    /// `durable` add's log record) is then found after a crash of the machine.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, DurableError> {
        Self::open_on(disk::real(), path)
    }

    /// [`DataDir::open`] on `disk` (the simulation's).
    pub(crate) fn open_on(
        disk: Arc<dyn Disk>,
        path: impl Into<PathBuf>,
    ) -> Result<Self, DurableError> {
        let path = path.into();
        // The directories made (deepest first), whose entries are synced. A directory without
        // a snapshot may be one whose making a crash interrupted before its entry was synced:
        // its entry, and its parents', are synced again (it holds nothing durable until then).
        if !disk.is_dir(&path) {
            create_dir_synced(&*disk, &path)?;
        } else if !disk.exists(&path.join(SNAPSHOT_FILE)) {
            let ancestors: Vec<PathBuf> = path
                .ancestors()
                .take_while(|p| !p.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .collect();
            sync_entries(&*disk, &ancestors)?;
        }
        Ok(DataDir {
            path,
            disk,
            fresh: Arc::default(),
        })
    }

    /// Whether `path` holds no data directory yet: opening it creates one.
    pub fn is_new(path: &Path) -> bool {
        !path.is_dir()
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file system it is on.
    pub(crate) fn disk(&self) -> &Arc<dyn Disk> {
        &self.disk
    }

    /// The snapshot, `Ok(None)` if there is none.
    pub fn load_snapshot(&self) -> Result<Option<Snapshot>, DurableError> {
        self.load(SNAPSHOT_FILE, SNAP_MAGIC)
    }

    /// Writes the snapshot atomically.
    pub fn save_snapshot(&self, snap: &Snapshot) -> Result<(), DurableError> {
        self.save(SNAPSHOT_FILE, SNAP_MAGIC, &to_cbor(snap))
    }

    /// The tag reservation, `Ok(None)` if there is none.
    pub fn load_reservation(&self) -> Result<Option<Reservation>, DurableError> {
        self.load(HWM_FILE, HWM_MAGIC)
    }

    /// Writes the tag reservation atomically and durably.
    pub fn save_reservation(&self, r: &Reservation) -> Result<(), DurableError> {
        self.save(HWM_FILE, HWM_MAGIC, &to_cbor(r))
    }

    /// Moves a corrupt file aside (kept for inspection, never loaded).
    pub fn quarantine(&self, name: &str) {
        let from = self.path.join(name);
        let to = self.path.join(format!("{name}.corrupt"));
        if let Err(e) = self.disk.rename(&from, &to) {
            tracing::warn!(file = ?from, error = %e, "cannot move corrupt file aside");
        }
    }

    fn load<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        magic: &[u8; 8],
    ) -> Result<Option<T>, DurableError> {
        let path = self.path.join(name);
        let bytes = match self.disk.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(DurableError::Io { path, source }),
        };
        let corrupt = |reason: String| DurableError::Corrupt {
            path: path.clone(),
            reason,
        };
        let payload = unframe(&bytes, magic).map_err(corrupt)?;
        from_cbor(payload)
            .map(Some)
            .map_err(|e| corrupt(e.to_string()))
    }

    fn save(&self, name: &str, magic: &[u8; 8], payload: &[u8]) -> Result<(), DurableError> {
        // Held through the save: a second save waits until the first made the directory
        // durable. Kept if the save fails: the next one makes it durable.
        let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let with = fresh.as_ref().map(|f| {
            let files: Vec<(PathBuf, PathBuf)> = f
                .files
                .iter()
                .map(|n| (self.path.join(format!("{n}.tmp")), self.path.join(n)))
                .collect();
            (files, f.dirs.clone())
        });
        let bytes = frame(magic, payload);
        match &with {
            None => write_atomically_on(&*self.disk, &self.path, name, &bytes),
            Some((files, dirs)) => {
                write_first_on(&*self.disk, &self.path, name, &bytes, files, dirs)?;
                *fresh = None;
                Ok(())
            }
        }
    }
}

/// Replaces `dir/name` with `bytes` atomically and durably: a temporary file written and
/// synced, renamed over it, and the directory synced (the rename is durable only then). The
/// syncs join those of other replicas ([`group_sync`]).
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), DurableError> {
    write_atomically_on(&*disk::real(), dir, name, bytes)
}

/// [`write_atomically`] on `disk`.
pub(crate) fn write_atomically_on(
    disk: &dyn Disk,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), DurableError> {
    let (tmp, path) = write_temporary(disk, dir, name, bytes)?;
    let (before_rename, after_rename) = rename_points(name);
    disk.sync_path(&tmp).map_err(io_at(&tmp))?;
    if let Some(p) = before_rename {
        crash::point(p);
    }
    disk.rename(&tmp, &path).map_err(io_at(&path))?;
    disk.sync_path(dir).map_err(io_at(dir))?;
    if let Some(p) = after_rename {
        crash::point(p);
    }
    Ok(())
}

/// Makes `path` and its missing ancestors, each one's entry synced in its parent: a crash of
/// the machine keeps the directory (and what is synced in it). The node's data directory too,
/// which its lock now makes before any filter's.
pub(crate) fn create_dir_synced(disk: &dyn Disk, path: &Path) -> Result<(), DurableError> {
    let made = disk::missing_ancestors(disk, path);
    disk.create_dir_all(path).map_err(io_at(path))?;
    sync_entries(disk, &made)
}

/// Syncs the entry of each of `dirs` in its parent.
fn sync_entries(disk: &dyn Disk, dirs: &[PathBuf]) -> Result<(), DurableError> {
    for dir in dirs {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            disk.sync_path(parent).map_err(io_at(parent))?;
        }
    }
    Ok(())
}

/// The error of an I/O call on `path`.
fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> DurableError + use<> {
    let path = path.to_path_buf();
    move |source| DurableError::Io { path, source }
}

/// The crash points before and after the rename of the files whose crash a test checks (the
/// node's id file has none).
fn rename_points(name: &str) -> (Option<&'static str>, Option<&'static str>) {
    match name {
        SNAPSHOT_FILE => (
            Some(crash::SNAPSHOT_BEFORE_RENAME),
            Some(crash::SNAPSHOT_AFTER_RENAME),
        ),
        HWM_FILE => (Some(crash::RESERVATION_BEFORE_RENAME), None),
        _ => (None, None),
    }
}

/// Writes `bytes` to `dir/<name>.tmp`, not synced: the temporary file and the final path.
fn write_temporary(
    disk: &dyn Disk,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(PathBuf, PathBuf), DurableError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = disk.create_truncate(&tmp).map_err(io_at(&tmp))?;
    if name == SNAPSHOT_FILE {
        crash::fail(crash::FAIL_SNAPSHOT_WRITE).map_err(io_at(&tmp))?;
    }
    f.write_all(bytes).map_err(io_at(&tmp))?;
    Ok((tmp, path))
}

/// [`write_atomically_on`] as a new directory's first save ([`Fresh`]): the temporary
/// file synced in one round with the directory's other new `files` (temporary, final) and
/// the entries of `dirs`, then every file renamed and the directory synced.
fn write_first_on(
    disk: &dyn Disk,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    files: &[(PathBuf, PathBuf)],
    dirs: &[PathBuf],
) -> Result<(), DurableError> {
    let (tmp, path) = write_temporary(disk, dir, name, bytes)?;
    let (before_rename, after_rename) = rename_points(name);
    // Files first, then the directories that name them (the order a disk without a
    // round of its own syncs them in).
    let mut round: Vec<&Path> = vec![&tmp];
    round.extend(files.iter().map(|(t, _)| t.as_path()));
    round.extend(dirs.iter().map(PathBuf::as_path));
    disk.sync_paths(&round).map_err(io_at(dir))?;
    if let Some(p) = before_rename {
        crash::point(p);
    }
    for (from, to) in files {
        disk.rename(from, to).map_err(io_at(to))?;
    }
    disk.rename(&tmp, &path).map_err(io_at(&path))?;
    disk.sync_path(dir).map_err(io_at(dir))?;
    if let Some(p) = after_rename {
        crash::point(p);
    }
    Ok(())
}

fn frame(magic: &[u8; 8], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(magic);
    out.push(FILE_VERSION);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn unframe<'a>(bytes: &'a [u8], magic: &[u8; 8]) -> Result<&'a [u8], String> {
    if bytes.len() < FRAME_HEADER {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    if &bytes[..8] != magic {
        return Err("bad magic".into());
    }
    if bytes[8] != FILE_VERSION {
        return Err(format!("file version {}", bytes[8]));
    }
    let len = u64::from_le_bytes(bytes[9..17].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(bytes[17..25].try_into().expect("8 bytes"));
    let payload = &bytes[FRAME_HEADER..];
    if payload.len() as u64 != len {
        return Err(format!(
            "payload of {} bytes, header says {len}",
            payload.len()
        ));
    }
    if xxh3_64(payload) != sum {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn snap() -> Snapshot {
        Snapshot {
            identity: Identity {
                uuid: Uuid::from_u128(1),
                replica: 4,
            },
            filter: "f".into(),
            kind: FilterKind::OrCuckoo,
            params_digest: 3,
            reserved: 100,
            state: vec![7; 1000],
            wal_covered: Some(3),
        }
    }

    #[test]
    fn round_trip_and_damage_detection() {
        let dir = tempfile::tempdir().unwrap();
        let d = DataDir::open(dir.path().join("x")).unwrap();
        assert!(d.load_snapshot().unwrap().is_none());
        assert!(d.load_reservation().unwrap().is_none());
        d.save_snapshot(&snap()).unwrap();
        assert_eq!(d.load_snapshot().unwrap().unwrap(), snap());
        let r = Reservation {
            identity: snap().identity,
            reserved: 5000,
        };
        d.save_reservation(&r).unwrap();
        assert_eq!(d.load_reservation().unwrap().unwrap(), r);

        let path = d.path().join(SNAPSHOT_FILE);
        let good = fs::read(&path).unwrap();
        // Torn write: any prefix is detected.
        for cut in [0, 5, FRAME_HEADER, good.len() / 2, good.len() - 1] {
            fs::write(&path, &good[..cut]).unwrap();
            assert!(
                matches!(d.load_snapshot(), Err(DurableError::Corrupt { .. })),
                "{cut}"
            );
        }
        // Tampering: any flipped byte is detected.
        for i in [0, 8, 10, 20, FRAME_HEADER + 3, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            fs::write(&path, &bad).unwrap();
            assert!(
                matches!(d.load_snapshot(), Err(DurableError::Corrupt { .. })),
                "{i}"
            );
        }
        d.quarantine(SNAPSHOT_FILE);
        assert!(d.load_snapshot().unwrap().is_none());
        assert!(d.path().join("state.snap.corrupt").exists());
    }

    /// Issue 53: a new directory made by `open_new` holds nothing durable until its first
    /// save, and everything (its log's directory, its files, the snapshot) once that save
    /// returned: a loss of power before it leaves no directory or an empty one, after it
    /// the whole directory.
    #[test]
    fn a_new_directory_is_durable_with_its_first_save() {
        use crate::sim::SimDisk;
        let files = [("entry.json".to_string(), b"{}".to_vec())];
        let path = PathBuf::from("/node/f.g1");
        let sim = SimDisk::new(1);
        sim.create_dir_all(Path::new("/node")).unwrap();
        sim.sync_path(Path::new("/")).unwrap();
        let disk: Arc<dyn Disk> = Arc::new(sim.clone());
        let d = DataDir::open_new_on(disk.clone(), &path, &files).unwrap();
        assert!(disk.is_dir(&path.join(super::super::wal::WAL_DIR)));
        assert!(
            !disk.exists(&path.join("entry.json")),
            "renamed by the first save"
        );
        // Before the first save: nothing of it survives a loss of power.
        let before = SimDisk::new(2);
        before.create_dir_all(Path::new("/node")).unwrap();
        before.sync_path(Path::new("/")).unwrap();
        let lost: Arc<dyn Disk> = Arc::new(before.clone());
        DataDir::open_new_on(lost.clone(), &path, &files).unwrap();
        before.power_loss();
        assert!(!lost.exists(&path));
        // After it: all of it does, and the next save is an ordinary one.
        d.save_snapshot(&snap()).unwrap();
        sim.power_loss();
        assert_eq!(d.load_snapshot().unwrap().unwrap(), snap());
        assert_eq!(disk.read(&path.join("entry.json")).unwrap(), b"{}");
        assert!(disk.is_dir(&path.join(super::super::wal::WAL_DIR)));
        assert!(!disk.exists(&path.join("entry.json.tmp")));
        d.save_snapshot(&snap()).unwrap();
        // An existing directory opens as before: its files are not written again.
        let again = DataDir::open_new_on(disk.clone(), &path, &[("other".into(), vec![1])]);
        assert!(again.unwrap().load_snapshot().unwrap().is_some());
        assert!(!disk.exists(&path.join("other.tmp")));
    }
}
