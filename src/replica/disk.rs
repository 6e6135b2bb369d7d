//! The file operations the durable state makes (snapshots, tag reservations, the write-ahead
//! log), behind one trait: [`RealDisk`] in the product, a simulated disk in the deterministic
//! simulation (`src/sim/`), which can crash the process at any of these calls and lose what
//! was not synced. Only what durability needs is here, with its durability meaning: a
//! [`DiskFile::sync_all`] makes a file's bytes durable, [`Disk::sync_path`] of a directory its
//! entries (a created, renamed or removed name).

use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::group_sync;

/// A file opened for reading from its start; seekable.
pub trait ReadFile: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadFile for T {}

/// A file opened for writing.
pub trait DiskFile: Send {
    /// Writes all of `buf` at the end of what this handle wrote so far.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Cuts the file to `len` bytes (the handle writes on from there).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes the file's bytes and size durable (and its metadata).
    fn sync_all(&mut self) -> io::Result<()>;
    /// Makes the file's bytes and size durable.
    fn sync_data(&mut self) -> io::Result<()>;
}

/// The file system under a replica's data directory.
pub trait Disk: Send + Sync + Debug + 'static {
    /// The whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The file, for reading, and its length.
    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn ReadFile>, u64)>;
    /// Creates a file that must not exist yet.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// Creates a file, or empties an existing one.
    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// Opens an existing file for writing (at its start).
    fn open_write(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// The names in a directory.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether `path` is a directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// Whether anything is at `path`.
    fn exists(&self, path: &Path) -> bool;
    /// Creates a directory and its missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Renames a file or directory (replacing a file at `to`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes a file, or a directory's entries, durable.
    fn sync_path(&self, path: &Path) -> io::Result<()>;
    /// Makes every one of `paths` durable: together (one round of the real disk's group
    /// syncs), or, by default, in turn in the order given (files before the directories
    /// that name them: a crash between leaves no name whose file is not durable).
    fn sync_paths(&self, paths: &[&Path]) -> io::Result<()> {
        paths.iter().try_for_each(|p| self.sync_path(p))
    }
}

/// The machine's file system. Syncs of paths join the group syncs of other replicas
/// (`replica::group_sync`).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealDisk;

/// The process's [`RealDisk`], shared.
pub fn real() -> Arc<dyn Disk> {
    static REAL: OnceLock<Arc<dyn Disk>> = OnceLock::new();
    REAL.get_or_init(|| Arc::new(RealDisk)).clone()
}

struct RealFile(File);

impl DiskFile for RealFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)?;
        self.0.seek(io::SeekFrom::Start(len)).map(drop)
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Disk for RealDisk {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn ReadFile>, u64)> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok((Box::new(file), len))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile(f)))
    }

    fn create_truncate(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Box::new(RealFile(f)))
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let f = OpenOptions::new().write(true).open(path)?;
        Ok(Box::new(RealFile(f)))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_path(&self, path: &Path) -> io::Result<()> {
        group_sync::sync(path)
    }

    fn sync_paths(&self, paths: &[&Path]) -> io::Result<()> {
        group_sync::sync_many(paths)
    }
}

/// The directories of `path` that do not exist yet, deepest first.
pub(crate) fn missing_ancestors(disk: &dyn Disk, path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !disk.exists(p))
        .map(Path::to_path_buf)
        .collect()
}
