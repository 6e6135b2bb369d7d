//! Write-ahead log: updates acknowledged at the `durable` level survive `kill -9` and power
//! loss between two snapshots.
//!
//! # Layout
//! A directory (by convention [`WAL_DIR`] inside the data directory) of segments named
//! `<id, 20 digits>.log`, ids increasing (gaps are fine). A segment is
//! - a header: `magic "crpfwal\0" | version | uuid (16) | replica id (u16 LE) | segment id (u64
//!   LE) | xxh3-64 of the preceding bytes (u64 LE)`, saying who wrote it and noticing a segment
//!   renamed to another id. Which segments a replay skips is the snapshot's covered mark's
//!   business, not the identity's: every segment above it is replayed, whoever of this
//!   directory's lives wrote it (see [`replay`]);
//! - then frames: `body length (u32 LE) | xxh3-64 of the body (u64 LE) | low 32 bits of the
//!   xxh3-64 of these 12 bytes (u32 LE) | body`, the body being the records of one group commit,
//!   each `length (u32 LE) | bytes`. The header's own checksum tells a damaged length from a
//!   torn tail.
//!
//! # Synced and written appends
//! An append is *durable* ([`WalWriter::append`]: the `durable` and `replicated` levels) or
//! *logged* ([`WalWriter::append_logged`]: `logged` and `local`). A durable frame is written,
//! then fsynced (with every frame written before it in its log: one log is one ordered stream
//! of frames, and an fsync covers the whole file) before its append completes and before the
//! next frame of the log is written. A logged frame is written (to the page cache: it survives
//! `kill -9` of the process) and its append completes at once; the log is fsynced by the next
//! durable append, rotation or close, or else by the *periodic sync*: at most
//! [`WalWriter::set_sync_interval`] after the first frame written since the last fsync, and
//! never while nothing was written since.
//!
//! So a crash of the process tears at most the last frame, and a crash of the machine tears
//! only frames written since the last fsync, which hold only logged records (acknowledged at a
//! level that allows losing them) and at most one durable frame (never acknowledged). Both
//! sit at the end of the last segment (a rotation fsyncs the segment it ends), which is where
//! the torn-tail rule looks: on replay, a last frame that is incomplete, whose body fails its
//! checksum while ending exactly at the end of the file, or that is unwritten (zero) space of
//! at most one frame, is cut off; so is, in the last segment, a stretch that does not check
//! and after which no frame checks (the image of several unsynced frames, partly written
//! back); anything else that does not check is [`DurableError::Corrupt`]. Lengths are checked against
//! [`WalLimits`] before anything is read, so a damaged length never becomes an allocation.
//! Records replayed before an error are sound (checksummed): the caller can keep what it
//! merged, move the log aside ([`quarantine`]) and take a snapshot.
//!
//! # Truncation at snapshots, and crashes between the steps
//! The actor (1) calls [`WalWriter::rotate`] at the moment it clones its state: appends queued
//! before go to segments `<= K`, later ones to segments `> K`, so the clone contains every
//! record of the segments `<= K`; (2) saves the snapshot with the clone atomically, recording
//! `K` in it; (3) calls [`WalWriter::remove_through`]`(K)`. A crash before (2) completes
//! leaves the old snapshot and every segment: the replay covers everything. After (2), the
//! segments `<= K` are redundant (merges are idempotent) whether (3) removed all, some or
//! none of them, and the segments `> K` hold what the snapshot lacks. Passing `K` back to
//! [`replay`] as `covered_through` skips those redundant segments, which also matters when the
//! replica restarted under a new identity: the old identity's segments are all `<= K` of the
//! first snapshot taken under the new one. Segments are created lazily, at the first append
//! after a rotation, so a start never leaves an empty segment of the new identity in front of
//! the snapshot that would vouch for it.
//!
//! A write or fsync error poisons the writer (after a failed fsync the file's state is unknown,
//! so it never writes again): every later append fails, and the caller falls back to a
//! snapshot and a new writer.
//!
//! # Threads
//! A node may hold 100,000 logs (one per filter), so no log has a thread of its own: a
//! [`WalPool`] of a few threads (by default the process-wide one, [`DEFAULT_WRITER_THREADS`])
//! serves them all, each log on one thread. A thread's round writes one frame for each of its
//! logs that has appends queued, then fsyncs each of those logs that has a durable append (a
//! failure stays with its log); between rounds it makes the periodic syncs that are due.
//!
//! `okaywal` was not used: it decides itself when to checkpoint (and recycles segment files),
//! whereas here the actor's snapshot timer decides, and it has no place for our identity
//! header; its format is also declared unstable.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::io::{self, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, mpsc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::oneshot;
use uuid::Uuid;
use xxhash_rust::xxh3::xxh3_64;

use super::crash;
use super::disk::{self, Disk, DiskFile};
use super::durable::{DurableError, Identity};
use crate::ReplicaId;

mod format;
mod pool;
mod replay;
#[cfg(test)]
mod tests;
mod writer;

use format::*;
pub use pool::*;
pub use replay::*;
pub use writer::*;

/// The log's directory inside a data directory.
pub const WAL_DIR: &str = "wal";

const MAGIC: &[u8; 8] = b"crpfwal\0";
const VERSION: u8 = 1;
const REPLICA_BYTES: usize = size_of::<ReplicaId>();
const SEGMENT_HEADER: usize = 8 + 1 + 16 + REPLICA_BYTES + 8 + 8;
const FRAME_HEADER: usize = 4 + 8 + 4;
const RECORD_HEADER: usize = 4;

/// Size limits, the same (or larger) for writing and replaying a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalLimits {
    /// Longest record accepted by `append`; on replay, a longer one is corruption. A group
    /// commit's frame holds at most this many bytes of records (plus their length prefixes).
    pub max_record_bytes: usize,
}

impl Default for WalLimits {
    fn default() -> Self {
        WalLimits {
            max_record_bytes: 16 << 20,
        }
    }
}

impl WalLimits {
    fn max_record(&self) -> usize {
        // The frame length is a u32.
        self.max_record_bytes.min(u32::MAX as usize - RECORD_HEADER)
    }

    fn max_frame(&self) -> usize {
        self.max_record() + RECORD_HEADER
    }
}

/// A segment's id: [`WalWriter::rotate`] answers the last segment written before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u64);

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:020}", self.0)
    }
}

/// What an append, or a removal, can fail with.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum WalError {
    /// Writing, syncing or removing failed. After a write or sync error the writer is
    /// poisoned and every later append fails with the same error.
    #[error("write-ahead log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error (shared by every append of the failed group commit).
        source: Arc<io::Error>,
    },
    /// The record is longer than [`WalLimits::max_record_bytes`].
    #[error("record of {len} bytes, the write-ahead log takes at most {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The writer's thread is gone (it panicked).
    #[error("the write-ahead log is closed")]
    Closed,
}

/// Counters of a [`WalWriter`], for metrics. Records per fsync = `appends / fsyncs`.
#[derive(Debug, Default)]
pub struct WalStats {
    /// Appends submitted.
    pub submitted: AtomicU64,
    /// Durable appends written and fsynced (acknowledged as durable).
    pub appends: AtomicU64,
    /// Logged appends written (fsynced later, by the periodic sync or a durable append).
    pub logged: AtomicU64,
    /// File fsyncs: one per group commit with a durable append, one per periodic sync.
    pub fsyncs: AtomicU64,
    /// Of `fsyncs`, those made by the periodic sync (logged appends only since the last).
    pub periodic_fsyncs: AtomicU64,
    /// Bytes written (frames and segment headers).
    pub bytes: AtomicU64,
    /// Segments created.
    pub segments_created: AtomicU64,
    /// Segments removed.
    pub segments_removed: AtomicU64,
    /// Appends and removals that failed.
    pub failures: AtomicU64,
}

impl WalStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
