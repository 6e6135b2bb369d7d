//! Write-ahead log: updates acknowledged at the `durable` level survive `kill -9` and power
//! loss between two snapshots.
//!
//! # Layout
//! A directory (by convention [`WAL_DIR`] inside the data directory) of segments named
//! `<id, 20 digits>.log`, ids increasing (gaps are fine). A segment is
//! - a header: `magic "crpfwal\0" | version | uuid (16) | replica id (u16 LE) | segment id (u64
//!   LE) | xxh3-64 of the preceding bytes (u64 LE)`, so that a log of another identity is never
//!   replayed into this replica, and a segment renamed to another id is noticed;
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
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, BufReader, Read, Write};
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

use super::durable::{DurableError, Identity};
use crate::ReplicaId;

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

/// What [`replay`] found; hand it to [`WalWriter::start`].
#[derive(Debug)]
#[must_use = "start the writer with it"]
pub struct Replayed {
    /// Segments read (not counting those skipped as covered by the snapshot).
    pub segments: usize,
    /// Records passed to the callback.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes of a torn tail cut off (0 if the log ended cleanly).
    pub torn_bytes: u64,
    /// Whether a torn tail was cut off (a segment removed or truncated).
    pub torn: bool,
    /// Damaged regions skipped (a frame or segment header that fails its checksum, not at
    /// the torn tail): the replay went on at the next frame that checks.
    pub damaged_regions: u64,
    /// Their bytes.
    pub damaged_bytes: u64,
    dir: PathBuf,
    next: u64,
    limits: WalLimits,
}

/// Replays the log in `dir` (created if missing): passes every record of every segment above
/// `covered_through`, in order, to `on_record`, after checking that each such segment belongs
/// to `expected`. Cuts off a torn tail (see the module doc). On an error, the records passed
/// so far were sound (checksummed); the log should be moved aside ([`quarantine`]).
pub fn replay(
    dir: impl Into<PathBuf>,
    expected: Identity,
    covered_through: Option<SegmentId>,
    limits: WalLimits,
    mut on_record: impl FnMut(&[u8]),
) -> Result<Replayed, DurableError> {
    let dir = dir.into();
    create_dir(&dir)?;
    let segments = list_segments(&dir)?;
    // After every segment on disk, and after every segment the snapshot covers: a snapshot
    // that removed the segments it covers leaves none to count from, and a writer that
    // started again at 1 appended to segments the next replay skips as covered (acknowledged
    // `durable` adds lost at the crash after a clean restart).
    let next = segments
        .keys()
        .next_back()
        .map_or(1, |id| id + 1)
        .max(covered_through.map_or(1, |c| c.0 + 1));
    let mut out = Replayed {
        segments: 0,
        records: 0,
        bytes: 0,
        torn_bytes: 0,
        torn: false,
        damaged_regions: 0,
        damaged_bytes: 0,
        dir,
        next,
        limits,
    };
    let last = segments.keys().next_back().copied();
    for (&id, path) in &segments {
        if covered_through.is_some_and(|c| id <= c.0) {
            continue;
        }
        out.segments += 1;
        let scan = Scan {
            path,
            id,
            last: Some(id) == last,
            expected,
            limits,
        };
        scan.run(&mut out, &mut on_record)?;
    }
    if out.torn {
        sync_dir(&out.dir).map_err(io_err(&out.dir))?;
    }
    Ok(out)
}

/// Moves a log that cannot be replayed aside (kept for inspection): `wal` becomes
/// `wal.corrupt`, or `wal.corrupt.N` if that exists. Returns the new path.
pub fn quarantine(dir: &Path) -> Result<PathBuf, DurableError> {
    let name = dir
        .file_name()
        .map_or_else(|| WAL_DIR.into(), |n| n.to_string_lossy().into_owned());
    let to = (0..)
        .map(|n| match n {
            0 => dir.with_file_name(format!("{name}.corrupt")),
            n => dir.with_file_name(format!("{name}.corrupt.{n}")),
        })
        .find(|p| !p.exists())
        .expect("an unused name");
    fs::rename(dir, &to).map_err(io_err(dir))?;
    if let Some(parent) = to.parent() {
        sync_dir(parent).map_err(io_err(parent))?;
    }
    tracing::warn!(from = ?dir, to = ?to, "write-ahead log moved aside");
    Ok(to)
}

/// The outcome of reading one frame.
enum Step {
    /// A sound frame, ending at this offset.
    Frame(u64),
    /// The torn tail starts here.
    Torn,
    /// A frame that does not check in a way a torn write can explain (a blank or damaged
    /// header, a wrong body checksum): the torn tail if nothing after it checks, else damage.
    Unreadable(String),
}

/// Reads one segment.
struct Scan<'a> {
    path: &'a Path,
    id: u64,
    last: bool,
    expected: Identity,
    limits: WalLimits,
}

impl Scan<'_> {
    fn corrupt(&self, offset: u64, reason: impl std::fmt::Display) -> DurableError {
        DurableError::Corrupt {
            path: self.path.to_path_buf(),
            reason: format!("at byte {offset}: {reason}"),
        }
    }

    /// Whether the bytes from `offset` to the end can be the image of one interrupted write:
    /// only in the last segment, and never more than one frame.
    fn may_be_torn(&self, offset: u64, file_len: u64, extra: usize) -> bool {
        self.last && file_len - offset <= (extra + FRAME_HEADER + self.limits.max_frame()) as u64
    }

    fn run(
        &self,
        out: &mut Replayed,
        on_record: &mut impl FnMut(&[u8]),
    ) -> Result<(), DurableError> {
        let io = io_err(self.path);
        let file = File::open(self.path).map_err(&io)?;
        let file_len = file.metadata().map_err(&io)?.len();
        let mut r = BufReader::with_capacity(1 << 16, file);

        let mut head = [0u8; SEGMENT_HEADER];
        let got = read_up_to(&mut r, &mut head).map_err(&io)?;
        // A blank header with nothing sound after it: created, then lost with every frame
        // written to it (only logged frames can be more than one).
        let blank = || -> Result<bool, DurableError> {
            Ok(is_zero(&head)
                && (self.may_be_torn(0, file_len, SEGMENT_HEADER)
                    || (self.last
                        && self
                            .next_sound_frame(SEGMENT_HEADER as u64, file_len)?
                            .is_none())))
        };
        if got < SEGMENT_HEADER || blank()? {
            if self.last {
                // Created, but its first group commit never completed.
                tracing::warn!(segment = ?self.path, bytes = file_len, "removing a torn write-ahead log segment");
                fs::remove_file(self.path).map_err(&io)?;
                out.torn_bytes += file_len;
                out.torn = true;
                return Ok(());
            }
            return Err(self.corrupt(0, "incomplete or blank segment header"));
        }
        match self.check_header(&head) {
            Ok(()) => {}
            // A header that fails its own checksum is damage, not another replica's log
            // (whose header checks, and is refused as foreign): its frames are checksummed
            // records of this directory's log, kept.
            Err(e @ DurableError::Corrupt { .. }) if header_damaged(&head) => {
                tracing::warn!(segment = ?self.path, error = %e, "damaged write-ahead log segment header: skipping it, keeping the frames after it");
                out.damaged_regions += 1;
                out.damaged_bytes += SEGMENT_HEADER as u64;
            }
            Err(e) => return Err(e),
        }

        let mut offset = SEGMENT_HEADER as u64;
        let mut body = Vec::new();
        while offset < file_len {
            let (reason, tearable) = match self.frame(&mut r, offset, file_len, &mut body) {
                Ok(Step::Frame(end)) => {
                    self.records(&body, offset, out, on_record)?;
                    offset = end;
                    continue;
                }
                Ok(Step::Torn) => return self.cut(offset, file_len, out),
                Ok(Step::Unreadable(reason)) => (reason, true),
                Err(DurableError::Corrupt { reason, .. }) => (reason, false),
                Err(e) => return Err(e),
            };
            let next = self.next_sound_frame(offset + 1, file_len)?;
            if next.is_none() && tearable && self.last {
                // Frames written since the last fsync (logged appends), partly written back
                // before the machine crashed: nothing after them checks.
                return self.cut(offset, file_len, out);
            }
            // Damage in the middle: go on at the next frame that checks.
            let to = next.unwrap_or(file_len);
            tracing::warn!(
                segment = ?self.path, offset, skipped = to - offset, reason,
                "damaged write-ahead log frame: skipped to the next frame that checks"
            );
            out.damaged_regions += 1;
            out.damaged_bytes += to - offset;
            offset = to;
            let mut file = File::open(self.path).map_err(&io)?;
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset)).map_err(&io)?;
            r = BufReader::with_capacity(1 << 16, file);
        }
        Ok(())
    }

    /// Cuts the torn tail off at `offset`.
    fn cut(&self, offset: u64, file_len: u64, out: &mut Replayed) -> Result<(), DurableError> {
        let io = io_err(self.path);
        let cut = file_len - offset;
        tracing::warn!(
            segment = ?self.path, offset, bytes = cut,
            "cutting a torn write-ahead log tail (never acknowledged, or logged and not synced)"
        );
        let f = OpenOptions::new()
            .write(true)
            .open(self.path)
            .map_err(&io)?;
        f.set_len(offset).map_err(&io)?;
        f.sync_all().map_err(&io)?;
        out.torn_bytes += cut;
        out.torn = true;
        Ok(())
    }

    /// Reads the frame at `offset` into `body`.
    fn frame(
        &self,
        r: &mut impl Read,
        offset: u64,
        file_len: u64,
        body: &mut Vec<u8>,
    ) -> Result<Step, DurableError> {
        let torn = |why: &str| {
            if self.last {
                Ok(Step::Torn)
            } else {
                Err(self.corrupt(offset, why))
            }
        };
        let remain = file_len - offset;
        if remain < FRAME_HEADER as u64 {
            return torn("incomplete frame header");
        }
        let mut fh = [0u8; FRAME_HEADER];
        r.read_exact(&mut fh).map_err(io_err(self.path))?;
        let len = u32::from_le_bytes(fh[..4].try_into().expect("4 bytes")) as usize;
        let sum = u64::from_le_bytes(fh[4..12].try_into().expect("8 bytes"));
        if is_zero(&fh) {
            // Space a crash left unwritten (never a frame: frames are not empty).
            return if self.may_be_torn(offset, file_len, 0) {
                Ok(Step::Torn)
            } else {
                Ok(Step::Unreadable(format!("at byte {offset}: empty frame")))
            };
        }
        if frame_check(&fh[..12]) != fh[12..] {
            return Ok(Step::Unreadable(format!(
                "at byte {offset}: frame header checksum mismatch"
            )));
        }
        if len == 0 || len > self.limits.max_frame() {
            return Err(self.corrupt(offset, format_args!("frame of {len} bytes")));
        }
        if (FRAME_HEADER + len) as u64 > remain {
            return torn("incomplete frame");
        }
        body.resize(len, 0);
        r.read_exact(body).map_err(io_err(self.path))?;
        let end = offset + (FRAME_HEADER + len) as u64;
        if xxh3_64(body) != sum {
            return if end == file_len {
                torn("checksum mismatch")
            } else {
                Ok(Step::Unreadable(format!(
                    "at byte {offset}: checksum mismatch"
                )))
            };
        }
        Ok(Step::Frame(end))
    }

    /// The offset of the first frame at or after `from` whose header and body check (the
    /// frame header's own checksum finds candidates; 1 in 2^32 of random bytes pass it, and
    /// the body checksum settles those); `None` if there is none before the end.
    fn next_sound_frame(&self, from: u64, file_len: u64) -> Result<Option<u64>, DurableError> {
        let io = io_err(self.path);
        let mut file = File::open(self.path).map_err(&io)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(from)).map_err(&io)?;
        let mut rest = Vec::with_capacity((file_len - from) as usize);
        file.read_to_end(&mut rest).map_err(&io)?;
        for at in 0..rest.len().saturating_sub(FRAME_HEADER - 1) {
            let fh = &rest[at..at + FRAME_HEADER];
            if is_zero(fh) || frame_check(&fh[..12]) != fh[12..] {
                continue;
            }
            let len = u32::from_le_bytes(fh[..4].try_into().expect("4 bytes")) as usize;
            let sum = u64::from_le_bytes(fh[4..12].try_into().expect("8 bytes"));
            let body = at + FRAME_HEADER;
            if len == 0 || len > self.limits.max_frame() || body + len > rest.len() {
                continue;
            }
            if xxh3_64(&rest[body..body + len]) == sum {
                return Ok(Some(from + at as u64));
            }
        }
        Ok(None)
    }

    fn check_header(&self, h: &[u8; SEGMENT_HEADER]) -> Result<(), DurableError> {
        let (content, sum) = h.split_at(SEGMENT_HEADER - 8);
        if &h[..8] != MAGIC {
            return Err(self.corrupt(0, "not a write-ahead log segment (bad magic)"));
        }
        if h[8] != VERSION {
            return Err(self.corrupt(0, format_args!("segment version {}", h[8])));
        }
        if xxh3_64(content).to_le_bytes() != sum {
            return Err(self.corrupt(0, "segment header checksum mismatch"));
        }
        let uuid = Uuid::from_bytes(h[9..25].try_into().expect("16 bytes"));
        let replica =
            ReplicaId::from_le_bytes(h[25..25 + REPLICA_BYTES].try_into().expect("replica id"));
        let at = 25 + REPLICA_BYTES;
        let id = u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        if id != self.id {
            return Err(self.corrupt(0, format_args!("header of segment {id}")));
        }
        let found = Identity { uuid, replica };
        if found != self.expected {
            return Err(DurableError::ForeignLog {
                path: self.path.to_path_buf(),
                found,
                expected: self.expected,
            });
        }
        Ok(())
    }

    fn records(
        &self,
        mut body: &[u8],
        offset: u64,
        out: &mut Replayed,
        on_record: &mut impl FnMut(&[u8]),
    ) -> Result<(), DurableError> {
        // The body checked: a bad structure here is a bug or a foreign writer, not a crash.
        while !body.is_empty() {
            if body.len() < RECORD_HEADER {
                return Err(self.corrupt(offset, "truncated record length"));
            }
            let (len, rest) = body.split_at(RECORD_HEADER);
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            if len > self.limits.max_record() || len > rest.len() {
                return Err(self.corrupt(offset, format_args!("record of {len} bytes")));
            }
            let (record, rest) = rest.split_at(len);
            on_record(record);
            out.records += 1;
            out.bytes += len as u64;
            body = rest;
        }
        Ok(())
    }
}

/// The completion of a [`WalWriter`] command: await it, or [`Pending::wait`] outside an async
/// runtime.
#[derive(Debug)]
#[must_use = "an append is durable only once this completes"]
pub struct Pending<T>(oneshot::Receiver<Result<T, WalError>>);

impl<T> Pending<T> {
    fn ready(r: Result<T, WalError>) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(r);
        Pending(rx)
    }

    /// Blocks until completion (not on an async runtime's thread).
    pub fn wait(self) -> Result<T, WalError> {
        self.0.blocking_recv().unwrap_or(Err(WalError::Closed))
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T, WalError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(WalError::Closed)))
    }
}

/// How an append reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Written and fsynced before it completes.
    Synced,
    /// Written before it completes; fsynced by the periodic sync, or earlier.
    Written,
}

/// The periodic sync's interval unless [`WalWriter::set_sync_interval`] says otherwise (the
/// default of the replica setting `fsync_interval_ms`).
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Threads of the process-wide pool unless [`WalPool::configure_global`] (the node's
/// `node.wal_threads`) says otherwise.
pub const DEFAULT_WRITER_THREADS: usize = 2;

/// What making or configuring a [`WalPool`] can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WalPoolError {
    /// A pool of no threads would never write.
    #[error("a write-ahead log pool needs at least one thread")]
    NoThreads,
    /// The process-wide pool is running with another size (it is sized once, at its start).
    #[error("the process-wide write-ahead log pool already runs {running} threads ({asked} asked)")]
    AlreadyStarted {
        /// Its threads.
        running: usize,
        /// The size asked for.
        asked: usize,
    },
    /// The operating system refused a thread.
    #[error("cannot start a write-ahead log thread: {0}")]
    Spawn(#[source] io::Error),
}

/// A fixed set of writer threads shared by many logs (DESIGN.md section 8: threads must not
/// grow with the number of filters). Each log is served by one thread, so its commands run in
/// the order they were issued; a thread serves its logs in rounds: it takes everything queued
/// for all of them, writes each log's frame, then fsyncs each log whose frame holds a durable
/// append (once per log and round) and answers that log's appends; logged appends are answered
/// once written, and their logs synced by the periodic sync, which the thread makes between
/// rounds (it sleeps until the next one is due). Appends from many filters that arrive during one
/// round's fsyncs share the next round. A log that fails answers its own appends with the
/// error; the other logs of the round are written and synced as usual.
///
/// [`WalWriter::start`] uses one process-wide pool: the threads are a process resource, the
/// writers are started deep in the replica's start and recovery paths, and one shared pool
/// keeps every caller's signature as it was. [`WalWriter::start_in`] takes an explicit pool
/// (tests, embedders that want their own). A pool's threads end once the pool and every writer
/// on it are gone (never, for the process-wide one).
#[derive(Clone)]
pub struct WalPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for WalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalPool")
            .field("threads", &self.threads())
            .finish()
    }
}

/// The process-wide pool: its size until it starts, then the pool.
struct Global {
    threads: usize,
    pool: Option<WalPool>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    threads: DEFAULT_WRITER_THREADS,
    pool: None,
});

/// Locks, ignoring poisoning: nothing panics while holding these locks but an allocation.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WalPool {
    /// Starts a pool of `threads` writer threads.
    pub fn new(threads: usize) -> Result<WalPool, WalPoolError> {
        if threads == 0 {
            return Err(WalPoolError::NoThreads);
        }
        // Built as the threads start, so that a failure stops those already running.
        let mut inner = PoolInner {
            workers: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let worker = Arc::new(Worker::default());
            let w = worker.clone();
            std::thread::Builder::new()
                .name(format!("crpf-wal-{i}"))
                .spawn(move || w.run())
                .map_err(WalPoolError::Spawn)?;
            inner.workers.push(worker);
        }
        Ok(WalPool {
            inner: Arc::new(inner),
        })
    }

    /// The process-wide pool, started at the first call.
    pub fn global() -> Result<WalPool, WalPoolError> {
        let mut g = lock(&GLOBAL);
        if let Some(pool) = &g.pool {
            return Ok(pool.clone());
        }
        let pool = WalPool::new(g.threads)?;
        tracing::debug!(threads = g.threads, "write-ahead log pool started");
        g.pool = Some(pool.clone());
        Ok(pool)
    }

    /// Sizes the process-wide pool; call it before the first writer starts. Asking again for
    /// the size it runs with is fine; another size, once it runs, is
    /// [`WalPoolError::AlreadyStarted`] (and the running pool stays as it is).
    pub fn configure_global(threads: usize) -> Result<(), WalPoolError> {
        if threads == 0 {
            return Err(WalPoolError::NoThreads);
        }
        let mut g = lock(&GLOBAL);
        match &g.pool {
            Some(pool) if pool.threads() != threads => Err(WalPoolError::AlreadyStarted {
                running: pool.threads(),
                asked: threads,
            }),
            Some(_) => Ok(()),
            None => {
                g.threads = threads;
                Ok(())
            }
        }
    }

    /// Its threads.
    pub fn threads(&self) -> usize {
        self.inner.workers.len()
    }

    /// The thread for a new log: the one serving the fewest open logs (filters come and go at
    /// run time, so a round robin over creations would drift), skipping threads that died.
    fn place(&self) -> Arc<Worker> {
        let worker = self.least_loaded();
        worker.logs.fetch_add(1, Ordering::Relaxed);
        worker.clone()
    }

    /// The live thread with the fewest logs.
    fn least_loaded(&self) -> &Arc<Worker> {
        let workers = &self.inner.workers;
        workers
            .iter()
            .filter(|w| !lock(&w.queue).dead)
            .min_by_key(|w| w.logs.load(Ordering::Relaxed))
            // All dead: the commands are dropped, and answer `Closed`.
            .unwrap_or(&workers[0])
    }
}

struct PoolInner {
    workers: Vec<Arc<Worker>>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every writer held the pool: their closes are queued before this.
        for w in &self.workers {
            lock(&w.queue).stop = true;
            w.wake.notify_one();
        }
    }
}

/// A log's id in its pool thread.
type LogId = u64;

static NEXT_LOG: AtomicU64 = AtomicU64::new(1);

enum Command {
    /// A new log's state; always its first command.
    Open(Box<Log>),
    /// A record, and whether its append waits for an fsync (durable) or only for the write.
    Append(Vec<u8>, Durability, oneshot::Sender<Result<(), WalError>>),
    /// The longest a logged frame waits for its fsync.
    SyncInterval(Duration),
    Rotate(u64),
    RemoveThrough(u64, oneshot::Sender<Result<usize, WalError>>),
    /// [`Command::RemoveThrough`] for a log not open on any thread, with its state: run, and
    /// the state dropped (the log is not opened for it).
    RemoveDetached(Box<Log>, u64, oneshot::Sender<Result<usize, WalError>>),
    /// Completes what is queued for the log, then forgets it; answers when done (if asked).
    Close(Option<mpsc::SyncSender<()>>),
    /// Holds the thread until the sender is dropped (tests: queue appends deterministically).
    #[cfg(test)]
    Hold(mpsc::Receiver<()>),
}

/// One pool thread: its queue of commands of all its logs.
#[derive(Default)]
struct Worker {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Logs placed on this thread and not closed yet.
    logs: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    commands: VecDeque<(LogId, Command)>,
    /// The pool is gone: end once the queue is empty.
    stop: bool,
    /// The thread panicked: commands are dropped (their completions answer `Closed`).
    dead: bool,
}

impl Worker {
    fn send(&self, log: LogId, cmd: Command) {
        let mut q = lock(&self.queue);
        if q.dead {
            drop(q);
            drop(cmd);
            return;
        }
        // The thread waits only on an empty queue.
        let wake = q.commands.is_empty();
        q.commands.push_back((log, cmd));
        drop(q);
        if wake {
            self.wake.notify_one();
        }
    }

    fn run(self: Arc<Self>) {
        let _dies = DeathGuard(&self);
        let mut logs: HashMap<LogId, Log> = HashMap::new();
        let mut round = VecDeque::new();
        // Periodic syncs to make, earliest first. An entry is stale (skipped) unless its log
        // is still open and still due at that instant: a durable append, a rotation or a
        // close synced it meanwhile.
        let mut due: BinaryHeap<Reverse<(Instant, LogId)>> = BinaryHeap::new();
        loop {
            {
                let mut q = lock(&self.queue);
                while q.commands.is_empty() && !q.stop {
                    let Some(Reverse((at, _))) = due.peek() else {
                        q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                        continue;
                    };
                    let now = Instant::now();
                    if *at <= now {
                        break;
                    }
                    q = self
                        .wake
                        .wait_timeout(q, *at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                if q.commands.is_empty() && q.stop {
                    // Every log was closed (and synced) before the pool went.
                    return;
                }
                // Everything queued now is this round: later commands wait for the next one,
                // so that a busy log never starves the round's fsyncs.
                std::mem::swap(&mut round, &mut q.commands);
            }
            self.round(&mut logs, &mut round, &mut due);
            Self::periodic_syncs(&mut logs, &mut due);
        }
    }

    /// Syncs the logs whose periodic sync is due.
    fn periodic_syncs(
        logs: &mut HashMap<LogId, Log>,
        due: &mut BinaryHeap<Reverse<(Instant, LogId)>>,
    ) {
        let now = Instant::now();
        while let Some(&Reverse((at, id))) = due.peek() {
            if at > now {
                break;
            }
            due.pop();
            if let Some(log) = logs.get_mut(&id)
                && log.sync_due == Some(at)
            {
                log.periodic_sync();
            }
        }
    }

    /// Runs one round: each log's commands in order, its appends gathered into one frame;
    /// then every log's frame written before any is synced: the disk gets the round's writes
    /// together, and a journaling filesystem can commit several logs' in one transaction.
    fn round(
        &self,
        logs: &mut HashMap<LogId, Log>,
        round: &mut VecDeque<(LogId, Command)>,
        due: &mut BinaryHeap<Reverse<(Instant, LogId)>>,
    ) {
        // Logs that gathered appends this round (a log may appear twice; the second time its
        // batch is empty, and is skipped).
        let mut gathered = Vec::new();
        // Logs with a command this round: those that may have written without syncing.
        let mut touched = Vec::new();
        while let Some((id, cmd)) = round.pop_front() {
            touched.push(id);
            match cmd {
                Command::Open(log) => {
                    logs.insert(id, *log);
                }
                Command::RemoveDetached(mut log, through, done) => {
                    log.execute(Command::RemoveThrough(through, done));
                }
                Command::Close(done) => {
                    if let Some(mut log) = logs.remove(&id) {
                        log.close();
                        self.logs.fetch_sub(1, Ordering::Relaxed);
                    }
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
                Command::Append(record, durability, done) => {
                    // Every log's commands follow its `Open` on this thread.
                    let log = logs.get_mut(&id).expect("a log opened on this thread");
                    if log.batch.waiters.is_empty() {
                        gathered.push(id);
                    }
                    log.gather(record, durability, done);
                }
                #[cfg(test)]
                Command::Hold(rx) => {
                    logs.get_mut(&id)
                        .expect("a log opened on this thread")
                        .commit();
                    let _ = rx.recv();
                    // What was queued while held joins this round, as if queued before the
                    // hold: tests count on one group commit for it.
                    round.extend(lock(&self.queue).commands.drain(..));
                }
                other => logs
                    .get_mut(&id)
                    .expect("a log opened on this thread")
                    .execute(other),
            }
        }
        let written: Vec<_> = gathered
            .into_iter()
            .filter_map(|id| Some((id, logs.get_mut(&id)?.write_batch()?)))
            .collect();
        for (id, frame) in written {
            logs.get_mut(&id)
                .expect("no command ran since the write")
                .sync_batch(frame);
        }
        // Logs left with unsynced frames (new ones only: a log already due keeps its time).
        for id in touched {
            if let Some(at) = logs.get_mut(&id).and_then(|l| l.newly_due.take()) {
                due.push(Reverse((at, id)));
            }
        }
    }
}

/// Marks a thread that panicked (a bug) as dead, and drops what was queued for it: its
/// waiters answer `Closed` instead of waiting forever.
struct DeathGuard<'a>(&'a Worker);

impl Drop for DeathGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dropped = {
                let mut q = lock(&self.0.queue);
                q.dead = true;
                std::mem::take(&mut q.commands)
            };
            tracing::error!(
                dropped = dropped.len(),
                "a write-ahead log thread panicked: its logs answer `closed`"
            );
        }
    }
}

/// The log's writer, on a thread of a [`WalPool`] that writes and fsyncs with group commit
/// (within the log and across the thread's logs). Commands run in the order they are issued.
/// Dropping it lets the thread finish the log's queue on its own; [`WalWriter::close`] waits
/// for that.
#[derive(Debug)]
pub struct WalWriter {
    log: LogId,
    pool: WalPool,
    /// Where the log is open: placed by its first command that needs it (an append, say).
    /// A log never written holds nothing on the pool's thread: of a node's 100,000 mostly
    /// idle filters, each held 300 bytes there.
    worker: OnceLock<Arc<Worker>>,
    current: u64,
    limits: WalLimits,
    dir: PathBuf,
    identity: Identity,
    stats: Arc<WalStats>,
    sync_interval: Duration,
    closed: bool,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("logs", &self.logs.load(Ordering::Relaxed))
            .finish()
    }
}

impl WalWriter {
    /// Starts the writer on a replayed log, on the process-wide [`WalPool`]; its segments will
    /// carry `identity`. The first segment is created at the first append.
    pub fn start(replayed: Replayed, identity: Identity) -> Result<WalWriter, DurableError> {
        let pool = Self::global_pool(&replayed.dir)?;
        Ok(Self::start_in(&pool, replayed, identity))
    }

    /// The process-wide [`WalPool`], for a log in `dir` (named by the error if it cannot run).
    fn global_pool(dir: &Path) -> Result<WalPool, DurableError> {
        WalPool::global().map_err(|e| DurableError::Io {
            path: dir.to_path_buf(),
            source: io::Error::other(e),
        })
    }

    /// [`WalWriter::start`] on the threads of `pool`.
    pub fn start_in(pool: &WalPool, replayed: Replayed, identity: Identity) -> WalWriter {
        Self::open(
            pool.clone(),
            replayed.dir,
            identity,
            replayed.limits,
            replayed.next,
            Arc::new(WalStats::default()),
            DEFAULT_SYNC_INTERVAL,
        )
    }

    /// A writer of the log in `dir` that starts at segment `next`, not opened yet: a parked
    /// replica's, resumed (its last snapshot covers every segment before `next`).
    pub(crate) fn resume_at(
        dir: PathBuf,
        identity: Identity,
        next: u64,
        sync_interval: Duration,
    ) -> Result<WalWriter, DurableError> {
        let pool = Self::global_pool(&dir)?;
        Ok(Self::open(
            pool,
            dir,
            identity,
            WalLimits::default(),
            next,
            Arc::new(WalStats::default()),
            sync_interval,
        ))
    }

    /// The segment a writer that takes over from this one starts at: after every segment
    /// this one wrote.
    pub(crate) fn next_segment(&self) -> u64 {
        match self.is_open() {
            true => self.current + 1,
            false => self.current,
        }
    }

    /// A writer to replace this one after it failed (a full disk, say; a failed writer never
    /// writes again): it appends to segments after every one this writer used, and counts
    /// in the same [`WalStats`]. Save a snapshot that covers this writer's segments first
    /// (rotate, snapshot, then reopen): the failed segment may end in a partial frame, which
    /// a replay only forgives at the very end of the log.
    pub fn reopen(&self) -> Result<WalWriter, DurableError> {
        Ok(Self::open(
            self.pool.clone(),
            self.dir.clone(),
            self.identity,
            self.limits,
            self.current + 1,
            self.stats.clone(),
            self.sync_interval,
        ))
    }

    fn open(
        pool: WalPool,
        dir: PathBuf,
        identity: Identity,
        limits: WalLimits,
        first: u64,
        stats: Arc<WalStats>,
        sync_interval: Duration,
    ) -> WalWriter {
        WalWriter {
            log: NEXT_LOG.fetch_add(1, Ordering::Relaxed),
            pool,
            worker: OnceLock::new(),
            current: first,
            limits,
            dir,
            identity,
            stats,
            sync_interval,
            closed: false,
        }
    }

    /// Appends a record; completes once it is written and fsynced, together with every
    /// other append queued meanwhile (one fsync for all of them) and every logged append
    /// issued before it (their frames precede it in the same file).
    pub fn append(&self, record: Vec<u8>) -> Pending<()> {
        self.append_as(record, Durability::Synced)
    }

    /// Appends a record without waiting for an fsync: completes once it is written (it then
    /// survives a crash of the process, not yet one of the machine). The log is fsynced at
    /// most [`WalWriter::set_sync_interval`] later, or earlier by a durable append, a
    /// rotation or a close.
    pub fn append_logged(&self, record: Vec<u8>) -> Pending<()> {
        self.append_as(record, Durability::Written)
    }

    /// The longest a logged append waits for its fsync ([`DEFAULT_SYNC_INTERVAL`] unless
    /// set). Applies to frames written from now on; kept by [`WalWriter::reopen`].
    pub fn set_sync_interval(&mut self, interval: Duration) {
        self.sync_interval = interval;
        // Not open yet: it opens with this interval.
        if self.is_open() {
            self.send(Command::SyncInterval(interval));
        }
    }

    fn append_as(&self, record: Vec<u8>, durability: Durability) -> Pending<()> {
        WalStats::add(&self.stats.submitted, 1);
        let max = self.limits.max_record();
        if record.len() > max {
            WalStats::add(&self.stats.failures, 1);
            return Pending::ready(Err(WalError::TooLarge {
                len: record.len(),
                max,
            }));
        }
        let (tx, rx) = oneshot::channel();
        self.send(Command::Append(record, durability, tx));
        Pending(rx)
    }

    /// Ends the current segment: appends issued before this call are in segments up to the
    /// answer, later ones in newer segments. Nothing is written until the next append.
    pub fn rotate(&mut self) -> SegmentId {
        let done = self.current;
        self.current += 1;
        // Not open yet: nothing was written, and it opens at the new segment.
        if self.is_open() {
            self.send(Command::Rotate(self.current));
        }
        SegmentId(done)
    }

    /// Deletes every segment up to and including `id` (never the current one); answers how
    /// many were deleted.
    pub fn remove_through(&self, id: SegmentId) -> Pending<usize> {
        let (tx, rx) = oneshot::channel();
        if self.is_open() {
            self.send(Command::RemoveThrough(id.0, tx));
        } else {
            // Nothing written yet: the segments are older ones (replayed at the start), and
            // their removal needs no open log (a snapshot would open every idle replica's).
            let cmd = Command::RemoveDetached(Box::new(self.new_log()), id.0, tx);
            self.pool.least_loaded().send(self.log, cmd);
        }
        Pending(rx)
    }

    /// The segment appends go to now.
    pub fn segment(&self) -> SegmentId {
        SegmentId(self.current)
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The writer's counters.
    pub fn stats(&self) -> Arc<WalStats> {
        self.stats.clone()
    }

    /// Completes everything queued for this log (the pool's other logs go on), then returns.
    pub fn close(mut self) {
        self.closed = true;
        if !self.is_open() {
            return;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Command::Close(Some(tx)));
        // A thread that died dropped the command: nothing more will be written either way.
        if rx.recv().is_err() {
            tracing::error!(dir = ?self.dir, "the write-ahead log thread stopped before closing the log");
        }
    }

    /// Whether the log is open on a pool thread (something needed it: an append, say).
    pub(crate) fn is_open(&self) -> bool {
        self.worker.get().is_some()
    }

    /// The log's state on its thread, as it opens (at the writer's segment and settings).
    fn new_log(&self) -> Log {
        Log {
            dir: self.dir.clone(),
            identity: self.identity,
            limits: self.limits,
            current: self.current,
            file: None,
            stats: self.stats.clone(),
            failed: None,
            batch: Batch::default(),
            sync_interval: self.sync_interval,
            sync_due: None,
            newly_due: None,
        }
    }

    fn send(&self, cmd: Command) {
        let worker = self.worker.get_or_init(|| {
            let worker = self.pool.place();
            worker.send(self.log, Command::Open(Box::new(self.new_log())));
            worker
        });
        // A dead thread drops the command, and with it the completion: it answers `Closed`.
        worker.send(self.log, cmd);
    }

    #[cfg(test)]
    fn hold(&self) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel();
        self.send(Command::Hold(rx));
        tx
    }
}

impl Drop for WalWriter {
    fn drop(&mut self) {
        if !self.closed && self.is_open() {
            self.send(Command::Close(None));
        }
    }
}

/// Appends of one group commit.
#[derive(Default)]
struct Batch {
    body: Vec<u8>,
    waiters: Vec<oneshot::Sender<Result<(), WalError>>>,
    /// Some append waits for the fsync: the frame is synced in its round.
    durable: bool,
    /// Of `waiters`, the logged appends (for the counters).
    logged: u64,
}

/// A durable frame written but not synced yet.
struct Written {
    waiters: Vec<oneshot::Sender<Result<(), WalError>>>,
    logged: u64,
    /// Where it starts in its segment (a failed sync cuts it off there).
    start: u64,
}

/// The segment being written.
struct Segment {
    file: File,
    /// Bytes of complete frames written.
    written: u64,
    /// Created, and the directory entry not synced yet.
    new: bool,
}

/// A log's state, on its pool thread.
struct Log {
    dir: PathBuf,
    identity: Identity,
    limits: WalLimits,
    current: u64,
    file: Option<Segment>,
    stats: Arc<WalStats>,
    failed: Option<WalError>,
    batch: Batch,
    /// The longest a written frame waits for its fsync.
    sync_interval: Duration,
    /// When the periodic sync is due: set by the first frame written after an fsync.
    sync_due: Option<Instant>,
    /// A due time set since the pool thread last looked (it schedules the sync).
    newly_due: Option<Instant>,
}

impl Log {
    /// Adds an append to the round's frame; a full frame is committed first on its own.
    fn gather(
        &mut self,
        record: Vec<u8>,
        durability: Durability,
        done: oneshot::Sender<Result<(), WalError>>,
    ) {
        let add = RECORD_HEADER + record.len();
        if !self.batch.body.is_empty() && self.batch.body.len() + add > self.limits.max_frame() {
            self.commit();
        }
        let body = &mut self.batch.body;
        body.reserve(add);
        body.extend_from_slice(&(record.len() as u32).to_le_bytes());
        body.extend_from_slice(&record);
        match durability {
            Durability::Synced => self.batch.durable = true,
            Durability::Written => self.batch.logged += 1,
        }
        self.batch.waiters.push(done);
    }

    /// Writes (and syncs, if durable) the gathered appends now (before another command of
    /// this log).
    fn commit(&mut self) {
        if let Some(frame) = self.write_batch() {
            self.sync_batch(frame);
        }
    }

    /// Completes what was gathered and syncs what was written: the log is closed.
    fn close(&mut self) {
        self.commit();
        self.sync_written();
    }

    fn execute(&mut self, cmd: Command) {
        // The commands before this one are complete first.
        self.commit();
        match cmd {
            Command::Open(..)
            | Command::Close(..)
            | Command::Append(..)
            | Command::RemoveDetached(..) => {
                unreachable!("handled by the round")
            }
            Command::SyncInterval(interval) => self.sync_interval = interval,
            Command::Rotate(next) => {
                // Only the last segment may end in unsynced frames (the torn-tail rule looks
                // there only): the segment that ends is synced first.
                self.sync_written();
                self.file = None;
                self.current = next;
            }
            Command::RemoveThrough(id, done) => {
                let r = self.remove_through(id);
                if let Err(e) = &r {
                    WalStats::add(&self.stats.failures, 1);
                    tracing::warn!(error = %e, "cannot remove write-ahead log segments");
                }
                let _ = done.send(r);
            }
            #[cfg(test)]
            Command::Hold(..) => unreachable!("handled by the round"),
        }
    }

    fn remove_through(&mut self, id: u64) -> Result<usize, WalError> {
        let wal_io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: io::Error| WalError::Io {
                path,
                source: Arc::new(e),
            }
        };
        let segments = list_segments_io(&self.dir).map_err(wal_io(&self.dir))?;
        let mut removed = 0;
        let mut result = Ok(());
        for (sid, path) in segments.range(..=id.min(self.current - 1)) {
            match fs::remove_file(path) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(segment = sid, error = %e, "cannot remove a write-ahead log segment");
                    result = Err(wal_io(path)(e));
                }
            }
        }
        if removed > 0 {
            WalStats::add(&self.stats.segments_removed, removed as u64);
            sync_dir(&self.dir).map_err(wal_io(&self.dir))?;
        }
        result.map(|()| removed)
    }

    /// The first half of a group commit: writes the gathered appends as one frame. Answers
    /// the frame if it waits for its fsync; `None` if nothing was gathered, the write failed
    /// (its appends were answered), or it holds only logged appends (answered now, and
    /// synced by the periodic sync).
    fn write_batch(&mut self) -> Option<Written> {
        if self.batch.waiters.is_empty() {
            return None;
        }
        let waiters = std::mem::take(&mut self.batch.waiters);
        let body = std::mem::take(&mut self.batch.body);
        let durable = std::mem::take(&mut self.batch.durable);
        let logged = std::mem::take(&mut self.batch.logged);
        let r = match &self.failed {
            Some(e) => Err(e.clone()),
            None => self.write_frame(&body),
        };
        // The buffer's capacity serves the next rounds.
        self.batch.body = body;
        self.batch.body.clear();
        match r {
            Ok(start) if durable => Some(Written {
                waiters,
                logged,
                start,
            }),
            Ok(_) => {
                if self.sync_due.is_none() {
                    let at = Instant::now() + self.sync_interval;
                    self.sync_due = Some(at);
                    self.newly_due = Some(at);
                }
                self.finish(waiters, logged, Ok(()));
                None
            }
            Err(e) => {
                self.finish(waiters, logged, Err(e));
                None
            }
        }
    }

    /// The second half: syncs the frame (and every frame written before it), then answers
    /// its appends.
    fn sync_batch(&mut self, frame: Written) {
        let r = self.sync_file(false);
        if r.is_err()
            && let Some(seg) = &mut self.file
        {
            // The frame was never acknowledged; the logged frames before it stay.
            roll_back(&seg.file, frame.start);
            seg.written = frame.start;
        }
        self.finish(frame.waiters, frame.logged, r);
    }

    /// The periodic sync of the frames written since the last fsync.
    fn periodic_sync(&mut self) {
        if self.failed.is_some() {
            self.sync_due = None;
            return;
        }
        if let Err(e) = self.sync_file(true) {
            self.poison(e);
        }
    }

    /// Syncs frames written and not synced yet, if any (a rotation, a close).
    fn sync_written(&mut self) {
        if self.sync_due.is_none() || self.failed.is_some() {
            return;
        }
        if let Err(e) = self.sync_file(false) {
            self.poison(e);
        }
    }

    fn poison(&mut self, e: WalError) {
        WalStats::add(&self.stats.failures, 1);
        if self.failed.is_none() {
            tracing::error!(dir = ?self.dir, error = %e, "write-ahead log failed: no more durable appends");
            self.failed = Some(e);
        }
    }

    fn finish(
        &mut self,
        waiters: Vec<oneshot::Sender<Result<(), WalError>>>,
        logged: u64,
        r: Result<(), WalError>,
    ) {
        let n = waiters.len() as u64;
        match &r {
            Ok(()) => {
                WalStats::add(&self.stats.appends, n - logged);
                WalStats::add(&self.stats.logged, logged);
            }
            Err(e) => {
                WalStats::add(&self.stats.failures, n);
                if self.failed.is_none() {
                    tracing::error!(dir = ?self.dir, error = %e, "write-ahead log failed: no more durable appends");
                    self.failed = Some(e.clone());
                }
            }
        }
        for w in waiters {
            let _ = w.send(r.clone());
        }
    }

    fn segment_path(&self) -> PathBuf {
        self.dir.join(segment_name(self.current))
    }

    /// Writes one frame, creating the segment first if needed; answers where the frame
    /// starts. A durable frame's [`Log::sync_file`] follows before anything else is written.
    fn write_frame(&mut self, body: &[u8]) -> Result<u64, WalError> {
        let path = self.segment_path();
        let wal_io = |e: io::Error| WalError::Io {
            path: path.clone(),
            source: Arc::new(e),
        };
        let mut buf = Vec::with_capacity(SEGMENT_HEADER + FRAME_HEADER + body.len());
        if self.file.is_none() {
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(wal_io)?;
            WalStats::add(&self.stats.segments_created, 1);
            self.file = Some(Segment {
                file: f,
                written: 0,
                new: true,
            });
            buf.extend_from_slice(&segment_header(self.identity, self.current));
        }
        let at = buf.len();
        buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(&xxh3_64(body).to_le_bytes());
        let check = frame_check(&buf[at..]);
        buf.extend_from_slice(&check);
        buf.extend_from_slice(body);
        let seg = self.file.as_mut().expect("opened above");
        let start = seg.written;
        if let Err(e) = seg.file.write_all(&buf) {
            roll_back(&seg.file, start);
            return Err(wal_io(e));
        }
        seg.written += buf.len() as u64;
        WalStats::add(&self.stats.bytes, buf.len() as u64);
        Ok(start)
    }

    /// Syncs the segment being written (every frame written to it so far), and its directory
    /// entry if it is new.
    fn sync_file(&mut self, periodic: bool) -> Result<(), WalError> {
        let path = self.segment_path();
        let wal_io = |e: io::Error| WalError::Io {
            path: path.clone(),
            source: Arc::new(e),
        };
        let Some(seg) = self.file.as_mut() else {
            self.sync_due = None;
            return Ok(());
        };
        let r = if seg.new {
            seg.file.sync_all()
        } else {
            // The file exists: its data (and size) is what must reach the disk.
            seg.file.sync_data()
        };
        r.map_err(wal_io)?;
        WalStats::add(&self.stats.fsyncs, 1);
        if periodic {
            WalStats::add(&self.stats.periodic_fsyncs, 1);
        }
        if seg.new {
            sync_dir(&self.dir).map_err(wal_io)?;
            seg.new = false;
        }
        self.sync_due = None;
        Ok(())
    }
}

/// Best effort, so that an unacknowledged frame is not in the way of a later writer; the
/// writer is poisoned either way.
fn roll_back(file: &File, len: u64) {
    let _ = file.set_len(len).and_then(|()| file.sync_all());
}

fn segment_header(identity: Identity, id: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8] = VERSION;
    h[9..25].copy_from_slice(identity.uuid.as_bytes());
    h[25..25 + REPLICA_BYTES].copy_from_slice(&identity.replica.to_le_bytes());
    let at = 25 + REPLICA_BYTES;
    h[at..at + 8].copy_from_slice(&id.to_le_bytes());
    let sum = xxh3_64(&h[..at + 8]);
    h[at + 8..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The frame header's own checksum, of its first 12 bytes.
/// Whether a segment header fails its own checksum (damage), as opposed to a sound header
/// that names another segment or identity.
fn header_damaged(h: &[u8; SEGMENT_HEADER]) -> bool {
    let (content, sum) = h.split_at(SEGMENT_HEADER - 8);
    xxh3_64(content).to_le_bytes() != sum
}

fn frame_check(head: &[u8]) -> [u8; 4] {
    (xxh3_64(head) as u32).to_le_bytes()
}

fn segment_name(id: u64) -> String {
    format!("{}.log", SegmentId(id))
}

fn list_segments_io(dir: &Path) -> io::Result<BTreeMap<u64, PathBuf>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        if stem.len() == 20
            && stem.bytes().all(|b| b.is_ascii_digit())
            && let Ok(id) = stem.parse()
        {
            out.insert(id, entry.path());
        }
    }
    Ok(out)
}

fn list_segments(dir: &Path) -> Result<BTreeMap<u64, PathBuf>, DurableError> {
    list_segments_io(dir).map_err(io_err(dir))
}

fn create_dir(dir: &Path) -> Result<(), DurableError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    // The new directory's entry must be durable before a segment in it is.
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(io_err(parent))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    super::group_sync::sync(dir)
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> DurableError + '_ {
    move |source| DurableError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Reads until `buf` is full or the end of the file; answers how many bytes were read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(n: u16) -> Identity {
        Identity {
            uuid: Uuid::from_u128(0xc0ffee + n as u128),
            replica: n,
        }
    }

    fn record(i: usize) -> Vec<u8> {
        // Lengths vary, some span several pages.
        let mut r = format!("record {i} ").into_bytes();
        r.resize(r.len() + (i * 37) % 300, i as u8);
        r
    }

    fn read_all(
        dir: &Path,
        id: Identity,
        through: Option<SegmentId>,
        limits: WalLimits,
    ) -> Result<(Vec<Vec<u8>>, Replayed), DurableError> {
        let mut out = Vec::new();
        let r = replay(dir, id, through, limits, |rec| out.push(rec.to_vec()))?;
        Ok((out, r))
    }

    fn records_in(dir: &Path) -> Vec<Vec<u8>> {
        read_all(dir, ident(1), None, WalLimits::default())
            .unwrap()
            .0
    }

    fn writer(dir: &Path, limits: WalLimits) -> WalWriter {
        let (_, r) = read_all(dir, ident(1), None, limits).unwrap();
        WalWriter::start(r, ident(1)).unwrap()
    }

    fn writer_in(pool: &WalPool, dir: &Path) -> WalWriter {
        let (_, r) = read_all(dir, ident(1), None, WalLimits::default()).unwrap();
        WalWriter::start_in(pool, r, ident(1))
    }

    fn segments(dir: &Path) -> Vec<u64> {
        list_segments_io(dir).unwrap().into_keys().collect()
    }

    /// Two segments: records 0 and 1 in the first, 2 and 3 in the second, one frame each.
    fn two_segments(dir: &Path) {
        let mut w = writer(dir, WalLimits::default());
        for i in 0..4 {
            if i == 2 {
                w.rotate();
            }
            w.append(record(i)).wait().unwrap();
        }
        w.close();
        assert_eq!(segments(dir), [1, 2]);
    }

    #[test]
    fn round_trip_across_segments_and_rotations() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(WAL_DIR);
        let mut w = writer(&dir, WalLimits::default());
        let mut expected = Vec::new();
        let mut pending = Vec::new();
        for i in 0..100 {
            if i % 30 == 0 {
                w.rotate();
            }
            if i == 50 {
                // Rotations without appends in between create no segment.
                w.rotate();
                w.rotate();
            }
            expected.push(record(i));
            pending.push(w.append(record(i)));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            for p in pending {
                p.await.unwrap();
            }
        });
        let stats = w.stats();
        w.close();
        assert_eq!(stats.appends.load(Ordering::Relaxed), 100);
        // No segment 1 nor 4: nothing was appended between their rotations.
        assert_eq!(segments(&dir), [2, 3, 5, 6, 7]);
        assert_eq!(records_in(&dir), expected);

        // A second life appends after the first one's records.
        let mut w = writer(&dir, WalLimits::default());
        let first = w.segment();
        assert!(first.0 > *segments(&dir).last().unwrap());
        w.append(b"again".to_vec()).wait().unwrap();
        assert_eq!(w.rotate(), first);
        w.close();
        expected.push(b"again".to_vec());
        assert_eq!(records_in(&dir), expected);
    }

    #[test]
    fn group_commit_shares_one_fsync() {
        let tmp = tempfile::tempdir().unwrap();
        let w = writer(tmp.path(), WalLimits::default());
        let release = w.hold();
        let pending: Vec<_> = (0..200).map(|i| w.append(record(i))).collect();
        drop(release);
        for p in pending {
            p.wait().unwrap();
        }
        let stats = w.stats();
        assert_eq!(stats.appends.load(Ordering::Relaxed), 200);
        assert_eq!(stats.fsyncs.load(Ordering::Relaxed), 1);
        w.close();
        assert_eq!(
            records_in(tmp.path()),
            (0..200).map(record).collect::<Vec<_>>()
        );
    }

    #[test]
    fn group_commit_splits_at_the_frame_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let limits = WalLimits {
            max_record_bytes: 1000,
        };
        let w = writer(tmp.path(), limits);
        let release = w.hold();
        // 104 bytes each with their length: 9 fit in a frame of at most 1004.
        let pending: Vec<_> = (0..50u8).map(|i| w.append(vec![i; 100])).collect();
        let big = w.append(vec![7; 1000]);
        let too_big = w.append(vec![7; 1001]);
        drop(release);
        for p in pending {
            p.wait().unwrap();
        }
        big.wait().unwrap();
        assert!(matches!(
            too_big.wait(),
            Err(WalError::TooLarge {
                len: 1001,
                max: 1000
            })
        ));
        let stats = w.stats();
        assert_eq!(stats.fsyncs.load(Ordering::Relaxed), 50_u64.div_ceil(9) + 1);
        w.close();
        let (got, _) = read_all(tmp.path(), ident(1), None, limits).unwrap();
        assert_eq!(got.len(), 51);
        // Replaying with a smaller limit than the writer's takes the larger frames for
        // damage (skipped), never for an allocation.
        let small = WalLimits {
            max_record_bytes: 500,
        };
        let (got, r) = read_all(tmp.path(), ident(1), None, small).unwrap();
        assert!(got.len() < 51 && r.damaged_regions > 0);
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Issue 25: logged appends complete once written, without an fsync each; the periodic
    /// sync makes one fsync for what was written, and none while nothing was written since.
    #[test]
    fn logged_appends_are_synced_by_the_periodic_sync_not_per_append() {
        let pool = WalPool::new(1).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer_in(&pool, tmp.path());
        w.set_sync_interval(Duration::from_secs(3600));
        for i in 0..50 {
            w.append_logged(record(i)).wait().unwrap();
        }
        let s = w.stats();
        assert_eq!(count(&s.logged), 50);
        assert_eq!(count(&s.appends), 0);
        assert_eq!(count(&s.fsyncs), 0, "no fsync per logged append");
        // Written: readable (they survive the process) before any fsync.
        assert_eq!(
            records_in(tmp.path()),
            (0..50).map(record).collect::<Vec<_>>()
        );
        // A durable append after them: its one fsync covers the whole log, in order.
        w.append(record(50)).wait().unwrap();
        assert_eq!((count(&s.appends), count(&s.fsyncs)), (1, 1));
        assert_eq!(count(&s.periodic_fsyncs), 0);
        w.close();
        assert_eq!(
            records_in(tmp.path()),
            (0..51).map(record).collect::<Vec<_>>()
        );

        // A short interval: the periodic sync comes by itself.
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer_in(&pool, tmp.path());
        w.set_sync_interval(Duration::from_millis(30));
        for i in 0..20 {
            w.append_logged(record(i)).wait().unwrap();
        }
        let s = w.stats();
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&s.periodic_fsyncs) == 0 {
            assert!(Instant::now() < deadline, "no periodic sync");
            std::thread::sleep(Duration::from_millis(5));
        }
        let synced = count(&s.fsyncs);
        assert_eq!(synced, count(&s.periodic_fsyncs), "only periodic syncs");
        assert!(synced <= 20, "{synced} fsyncs for 20 logged appends");
        // Nothing written since: no more syncs, however long the log waits.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(count(&s.fsyncs), synced);
        // Written again: synced again.
        w.append_logged(record(20)).wait().unwrap();
        while count(&s.periodic_fsyncs) == synced {
            assert!(Instant::now() < deadline, "no second periodic sync");
            std::thread::sleep(Duration::from_millis(5));
        }
        w.close();
        assert_eq!(
            records_in(tmp.path()),
            (0..21).map(record).collect::<Vec<_>>()
        );
    }

    /// Only the last segment may end in unsynced frames: a rotation syncs the segment it
    /// ends, and a close syncs what was written.
    #[test]
    fn rotation_and_close_sync_logged_frames() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), WalLimits::default());
        w.set_sync_interval(Duration::from_secs(3600));
        w.append_logged(record(0)).wait().unwrap();
        let s = w.stats();
        w.rotate();
        // Nothing written since: a second rotation syncs nothing.
        w.rotate();
        w.append_logged(record(1)).wait().unwrap();
        assert_eq!(count(&s.fsyncs), 1);
        w.close();
        assert_eq!(count(&s.fsyncs), 2);
        assert_eq!(count(&s.periodic_fsyncs), 0);
        assert_eq!(segments(tmp.path()), [1, 3]);
        assert_eq!(records_in(tmp.path()), [record(0), record(1)]);
    }

    /// A crash of the machine may leave several unsynced frames at the end of the last
    /// segment, partly written back: the stretch after which nothing checks is a torn tail
    /// (cut), however long; the same in an earlier segment is damage (skipped, kept).
    #[test]
    fn unsynced_frames_torn_by_a_machine_crash_are_cut() {
        let tmp = tempfile::tempdir().unwrap();
        // Frames of at most 404 bytes: the stretch lost is more than one of them.
        let limits = WalLimits {
            max_record_bytes: 400,
        };
        let mut w = writer(tmp.path(), limits);
        w.set_sync_interval(Duration::from_secs(3600));
        for i in 0..10 {
            w.append_logged(record(i)).wait().unwrap();
        }
        w.close();
        let good = fs::read(tmp.path().join(segment_name(1))).unwrap();
        let frame = |k: usize| FRAME_HEADER + RECORD_HEADER + record(k).len();
        let fifth: usize = SEGMENT_HEADER + (0..5).map(frame).sum::<usize>();
        let five: Vec<_> = (0..5).map(record).collect();
        // Frames 5 to 9 lost: blank (the size grew, the data never landed), or blank with
        // a few blocks of them written back.
        let mut blank = good.clone();
        blank[fifth..].fill(0);
        let mut partly = blank.clone();
        let end = good.len();
        // Inside frames, none whole (a whole one would be sound, and kept).
        partly[end - 40..end - 10].copy_from_slice(&good[end - 40..end - 10]);
        // Frame 5's header landed, its body did not.
        partly[fifth..fifth + FRAME_HEADER].copy_from_slice(&good[fifth..fifth + FRAME_HEADER]);
        partly[fifth + 100..fifth + 150].copy_from_slice(&good[fifth + 100..fifth + 150]);
        for (name, bytes) in [("blank", &blank), ("partly written back", &partly)] {
            assert!(
                end - fifth > limits.max_frame() + FRAME_HEADER,
                "more than a frame lost"
            );
            let copy = with_last(tmp.path(), bytes);
            let (got, r) = read_all(copy.path(), ident(1), None, limits)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, five, "{name}");
            assert!(r.torn, "{name}");
            assert_eq!(r.torn_bytes, (end - fifth) as u64, "{name}");
            assert_eq!(r.damaged_regions, 0, "{name}");
            let len = fs::metadata(copy.path().join(segment_name(1)))
                .unwrap()
                .len();
            assert_eq!(len, fifth as u64, "{name}: cut");
        }
        // A segment whose header never landed either: removed.
        let zeros = vec![0u8; good.len()];
        let copy = with_last(tmp.path(), &zeros);
        let (got, r) = read_all(copy.path(), ident(1), None, limits).unwrap();
        assert!(got.is_empty() && r.torn);
        assert!(segments(copy.path()).is_empty());
        // Not the last segment: damage, skipped, and the next segment is replayed.
        let two = tempfile::tempdir().unwrap();
        let mut w = writer(two.path(), limits);
        for i in 0..10 {
            w.append_logged(record(i)).wait().unwrap();
        }
        w.rotate();
        w.append(b"later".to_vec()).wait().unwrap();
        w.close();
        assert_eq!(fs::read(two.path().join(segment_name(1))).unwrap(), good);
        fs::write(two.path().join(segment_name(1)), &blank).unwrap();
        let (got, r) = read_all(two.path(), ident(1), None, limits).unwrap();
        let mut expected = five.clone();
        expected.push(b"later".to_vec());
        assert_eq!(got, expected);
        assert_eq!((r.damaged_regions, r.torn), (1, false));
    }

    /// Copies the log with the last segment replaced by `last`.
    fn with_last(dir: &Path, last: &[u8]) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        let segs = list_segments_io(dir).unwrap();
        let (&last_id, _) = segs.last_key_value().unwrap();
        for (id, path) in &segs {
            let to = copy.path().join(segment_name(*id));
            if *id == last_id {
                fs::write(to, last).unwrap();
            } else {
                fs::copy(path, to).unwrap();
            }
        }
        copy
    }

    #[test]
    fn torn_tail_is_cut_at_every_offset() {
        let tmp = tempfile::tempdir().unwrap();
        two_segments(tmp.path());
        let good = fs::read(tmp.path().join(segment_name(2))).unwrap();
        let last_frame = good.len() - FRAME_HEADER - RECORD_HEADER - record(3).len();
        let first3: Vec<_> = (0..3).map(record).collect();
        for cut in last_frame..good.len() {
            let copy = with_last(tmp.path(), &good[..cut]);
            let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default())
                .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(got, first3, "cut at {cut}");
            assert_eq!(r.torn_bytes, (cut - last_frame) as u64);
            let len = fs::metadata(copy.path().join(segment_name(2)))
                .unwrap()
                .len();
            assert_eq!(len, last_frame as u64, "cut at {cut}");
            // The cut log replays cleanly, and a writer appends after it.
            let (_, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
            assert_eq!(r.torn_bytes, 0);
            let w = WalWriter::start(r, ident(1)).unwrap();
            w.append(b"after".to_vec()).wait().unwrap();
            w.close();
            assert_eq!(records_in(copy.path()).len(), 4);
        }
        // A segment cut inside its header never completed its first commit: it goes.
        for cut in 0..SEGMENT_HEADER {
            let copy = with_last(tmp.path(), &good[..cut]);
            let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
            assert_eq!(got, first3[..2], "header cut at {cut}");
            assert!(r.torn);
            assert_eq!(segments(copy.path()), [1]);
        }
        // A last frame whose body fails its checksum.
        for i in last_frame + FRAME_HEADER..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let copy = with_last(tmp.path(), &bad);
            let (got, _) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
            assert_eq!(got, first3, "flipped byte {i}");
        }
        // Zeroed space after the end (a crash after the size grew, before the data landed).
        let mut zeros = good.clone();
        zeros.resize(good.len() + 3000, 0);
        let copy = with_last(tmp.path(), &zeros);
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(r.torn_bytes, 3000);
    }

    /// Issue 27, point 3: a damaged frame or segment header before the tail loses only the
    /// records it touches; every intact, checksummed record after it is replayed.
    #[test]
    fn damage_before_the_tail_loses_only_what_it_touches() {
        let tmp = tempfile::tempdir().unwrap();
        two_segments(tmp.path());
        let seg1 = fs::read(tmp.path().join(segment_name(1))).unwrap();
        let seg2 = fs::read(tmp.path().join(segment_name(2))).unwrap();
        let frame = |k: usize| FRAME_HEADER + RECORD_HEADER + record(k).len();
        let all: Vec<_> = (0..4).map(record).collect();
        let without = |k: usize| -> Vec<Vec<u8>> {
            all.iter()
                .enumerate()
                .filter(|(i, _)| *i != k)
                .map(|(_, r)| r.clone())
                .collect()
        };
        // Every byte of the first segment (header and its last frame included), and every
        // byte of the last segment but its last frame (a flip there is a torn tail).
        let cases = (0..seg1.len())
            .map(|i| (1, i))
            .chain((0..SEGMENT_HEADER + frame(2)).map(|i| (2, i)));
        for (seg, i) in cases {
            let copy = tempfile::tempdir().unwrap();
            for (id, bytes) in [(1, &seg1), (2, &seg2)] {
                let mut b = bytes.clone();
                if id == seg {
                    b[i] ^= 0x04;
                }
                fs::write(copy.path().join(segment_name(id)), b).unwrap();
            }
            let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default())
                .unwrap_or_else(|e| panic!("segment {seg} byte {i}: {e}"));
            let expected = match (seg, i) {
                (_, i) if i < SEGMENT_HEADER => all.clone(),
                (1, i) if i < SEGMENT_HEADER + frame(0) => without(0),
                (1, _) => without(1),
                _ => without(2),
            };
            assert_eq!(got, expected, "segment {seg} byte {i}");
            assert_eq!(r.damaged_regions, 1, "segment {seg} byte {i}");
        }
        // A torn tail in a segment that is not the last is damage too: its frame is lost.
        let copy = tempfile::tempdir().unwrap();
        fs::write(copy.path().join(segment_name(1)), &seg1[..seg1.len() - 1]).unwrap();
        fs::write(copy.path().join(segment_name(2)), &seg2).unwrap();
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(got, without(1));
        assert_eq!(r.damaged_bytes, (frame(1) - 1) as u64);
        // A huge claimed length is refused before anything is allocated.
        let mut huge = seg2[..SEGMENT_HEADER].to_vec();
        let mut fh = [0u8; FRAME_HEADER];
        fh[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let check = frame_check(&fh[..12]);
        fh[12..].copy_from_slice(&check);
        huge.extend_from_slice(&fh);
        huge.extend_from_slice(&seg2[SEGMENT_HEADER..]);
        let copy = with_last(tmp.path(), &huge);
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(got, all, "the frames after the bad length are kept");
        assert_eq!(r.damaged_bytes, FRAME_HEADER as u64);
        // 4 bytes flipped in the middle of a long log: only the frames they touch are lost.
        let long = tempfile::tempdir().unwrap();
        let w = writer(long.path(), WalLimits::default());
        for i in 0..300 {
            w.append(record(i)).wait().unwrap();
        }
        w.close();
        let seg = long.path().join(segment_name(1));
        let mut bytes = fs::read(&seg).unwrap();
        let mid = bytes.len() / 2;
        for b in &mut bytes[mid..mid + 4] {
            *b ^= 0xff;
        }
        fs::write(&seg, bytes).unwrap();
        let (got, r) = read_all(long.path(), ident(1), None, WalLimits::default()).unwrap();
        assert!(
            got.len() >= 298 && got.len() < 300,
            "{} of 300 records kept",
            got.len()
        );
        assert!(got.iter().all(|g| (0..300).any(|i| record(i) == *g)));
        assert_eq!(got.last(), Some(&record(299)));
        assert_eq!(r.damaged_regions, 1);
    }

    #[test]
    fn a_log_of_another_identity_is_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        two_segments(tmp.path());
        for other in [
            ident(2),
            Identity {
                uuid: Uuid::from_u128(7),
                replica: 1,
            },
        ] {
            let r = read_all(tmp.path(), other, None, WalLimits::default());
            assert!(
                matches!(r, Err(DurableError::ForeignLog { found, .. }) if found == ident(1)),
                "{r:?}"
            );
        }
        // Segments covered by the snapshot are skipped, whoever wrote them.
        let (got, r) = read_all(
            tmp.path(),
            ident(2),
            Some(SegmentId(2)),
            WalLimits::default(),
        )
        .unwrap();
        assert!(got.is_empty());
        assert_eq!(r.segments, 0);
        let (got, _) = read_all(
            tmp.path(),
            ident(1),
            Some(SegmentId(1)),
            WalLimits::default(),
        )
        .unwrap();
        assert_eq!(got, [record(2), record(3)]);

        // A restart under a new identity: the old segments stay until the first snapshot
        // under the new one covers them, and the new identity's segment comes after.
        let (_, r) = read_all(tmp.path(), ident(1), None, WalLimits::default()).unwrap();
        let mut w = WalWriter::start(r, ident(2)).unwrap();
        let through = w.rotate();
        assert_eq!(segments(tmp.path()), [1, 2]);
        w.append(b"new".to_vec()).wait().unwrap();
        assert_eq!(w.remove_through(through).wait().unwrap(), 2);
        w.close();
        let (got, _) = read_all(tmp.path(), ident(2), Some(through), WalLimits::default()).unwrap();
        assert_eq!(got, [b"new".to_vec()]);
    }

    #[test]
    fn remove_through_deletes_exactly_the_older_segments() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), WalLimits::default());
        let mut ids = Vec::new();
        for i in 0..5 {
            w.append(record(i)).wait().unwrap();
            ids.push(w.rotate());
        }
        w.append(record(5)).wait().unwrap();
        assert_eq!(segments(tmp.path()), [1, 2, 3, 4, 5, 6]);
        assert_eq!(w.remove_through(ids[1]).wait().unwrap(), 2);
        assert_eq!(segments(tmp.path()), [3, 4, 5, 6]);
        assert_eq!(w.remove_through(ids[1]).wait().unwrap(), 0);
        // Never the segment being written, whatever the caller asks.
        assert_eq!(w.remove_through(SegmentId(u64::MAX)).wait().unwrap(), 3);
        assert_eq!(segments(tmp.path()), [6]);
        w.append(record(6)).wait().unwrap();
        let stats = w.stats();
        w.close();
        assert_eq!(stats.segments_removed.load(Ordering::Relaxed), 5);
        assert_eq!(stats.segments_created.load(Ordering::Relaxed), 6);
        assert_eq!(records_in(tmp.path()), [record(5), record(6)]);
    }

    /// A snapshot covered segments 1..=3 and removed them all; the next life (a clean restart)
    /// writes after them, so its records are replayed, not skipped as covered.
    #[test]
    fn a_writer_after_a_snapshot_that_removed_every_segment_appends_beyond_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), WalLimits::default());
        for i in 0..3 {
            w.append(record(i)).wait().unwrap();
            w.rotate();
        }
        let covered = SegmentId(3);
        assert_eq!(w.remove_through(covered).wait().unwrap(), 3);
        w.close();
        assert!(segments(tmp.path()).is_empty());

        for life in 0..3 {
            let (_, r) =
                read_all(tmp.path(), ident(1), Some(covered), WalLimits::default()).unwrap();
            let w = WalWriter::start(r, ident(1)).unwrap();
            assert!(w.segment().0 > covered.0, "life {life}: {:?}", w.segment());
            w.append(record(10 + life)).wait().unwrap();
            w.close();
        }
        let (got, _) = read_all(tmp.path(), ident(1), Some(covered), WalLimits::default()).unwrap();
        assert_eq!(got, [record(10), record(11), record(12)]);
    }

    #[test]
    fn quarantine_moves_the_log_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(WAL_DIR);
        for n in 0..2 {
            two_segments(&dir);
            let to = quarantine(&dir).unwrap();
            let name = if n == 0 {
                "wal.corrupt"
            } else {
                "wal.corrupt.1"
            };
            assert_eq!(to, tmp.path().join(name));
            assert_eq!(segments(&to), [1, 2]);
            assert!(!dir.exists());
        }
    }

    #[test]
    fn a_pool_takes_at_least_one_thread_and_the_global_size_is_set_once() {
        assert!(matches!(WalPool::new(0), Err(WalPoolError::NoThreads)));
        assert!(matches!(
            WalPool::configure_global(0),
            Err(WalPoolError::NoThreads)
        ));
        let running = WalPool::global().unwrap().threads();
        WalPool::configure_global(running).unwrap();
        assert!(matches!(
            WalPool::configure_global(running + 1),
            Err(WalPoolError::AlreadyStarted { running: r, asked }) if r == running && asked == running + 1
        ));
        assert_eq!(WalPool::global().unwrap().threads(), running);
    }

    /// How many logs are open on the pool's threads.
    fn open_logs(pool: &WalPool) -> usize {
        let workers = &pool.inner.workers;
        workers.iter().map(|w| w.logs.load(Ordering::Relaxed)).sum()
    }

    /// A writer holds nothing on the pool's threads until it is written: a rotation, a new
    /// sync interval and the removal of older segments (a snapshot's, after a restart) leave
    /// its log unopened; its first append opens it, at the segment the rotation moved to.
    #[test]
    fn a_log_opens_at_its_first_append() {
        let pool = WalPool::new(2).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        two_segments(tmp.path());
        let mut w = writer_in(&pool, tmp.path());
        w.set_sync_interval(Duration::from_millis(5));
        let covered = w.rotate();
        assert_eq!(covered, SegmentId(3));
        assert_eq!(w.remove_through(SegmentId(2)).wait().unwrap(), 2);
        assert_eq!(segments(tmp.path()), Vec::<u64>::new());
        assert_eq!(open_logs(&pool), 0);
        w.append_logged(record(7)).wait().unwrap();
        assert_eq!(open_logs(&pool), 1);
        assert_eq!(segments(tmp.path()), [4]);
        w.close();
        assert_eq!(open_logs(&pool), 0);
        assert_eq!(records_in(tmp.path()), [record(7)]);
        // Closed or dropped unopened: nothing to wait for, nothing left behind.
        writer_in(&pool, tmp.path()).close();
        drop(writer_in(&pool, tmp.path()));
        assert_eq!(open_logs(&pool), 0);
    }

    /// Logs sharing pool threads, their commands interleaved (with rotations, and rounds made
    /// large by a hold): each log's records replay in the order they were appended.
    #[test]
    fn interleaved_logs_keep_their_order_and_replay() {
        const LOGS: usize = 40;
        let pool = WalPool::new(2).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<_> = (0..LOGS).map(|i| tmp.path().join(i.to_string())).collect();
        let mut writers: Vec<_> = dirs.iter().map(|d| writer_in(&pool, d)).collect();
        let mut expected = vec![Vec::new(); LOGS];
        let mut pending = Vec::new();
        let mut rng = fastrand::Rng::with_seed(23);
        // Both threads held: the first rounds gather appends of many logs.
        let mut holds = Some([writers[0].hold(), writers[1].hold()]);
        for n in 0..4000 {
            if n == 1000 {
                holds = None;
            }
            let i = rng.usize(..LOGS);
            if rng.u8(..50) == 0 {
                writers[i].rotate();
            }
            let rec = format!("log {i} record {n}").into_bytes();
            expected[i].push(rec.clone());
            pending.push(writers[i].append(rec));
            if holds.is_none() && rng.u8(..200) == 0 {
                // Wait for one now and then: later appends come in later rounds.
                let k = rng.usize(..pending.len());
                pending.swap_remove(k).wait().unwrap();
            }
        }
        for p in pending {
            p.wait().unwrap();
        }
        let mut appends = 0;
        for w in writers {
            appends += w.stats().appends.load(Ordering::Relaxed);
            w.close();
        }
        assert_eq!(appends, 4000);
        for (dir, expected) in dirs.iter().zip(&expected) {
            assert_eq!(&records_in(dir), expected, "{dir:?}");
        }
    }

    /// A log whose segment cannot be created (its directory replaced by a file: refused to
    /// root too) fails its own appends; another log of the same thread and round succeeds.
    #[test]
    fn a_failing_log_does_not_fail_another_of_its_round() {
        let pool = WalPool::new(1).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
        let a = writer_in(&pool, &a_dir);
        let b = writer_in(&pool, &b_dir);
        fs::remove_dir_all(&a_dir).unwrap();
        fs::write(&a_dir, b"not a directory").unwrap();
        let release = a.hold();
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        for i in 0..20 {
            pa.push(a.append(record(i)));
            pb.push(b.append(record(i)));
        }
        drop(release);
        for p in pa {
            assert!(matches!(p.wait(), Err(WalError::Io { .. })));
        }
        for p in pb {
            p.wait().unwrap();
        }
        // A stays failed; B goes on.
        assert!(matches!(
            a.append(record(20)).wait(),
            Err(WalError::Io { .. })
        ));
        b.append(record(20)).wait().unwrap();
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(sa.failures.load(Ordering::Relaxed), 21);
        assert_eq!(sa.appends.load(Ordering::Relaxed), 0);
        assert_eq!(sb.failures.load(Ordering::Relaxed), 0);
        assert_eq!(sb.appends.load(Ordering::Relaxed), 21);
        // The 20 of the shared round in one fsync, then the last one.
        assert_eq!(sb.fsyncs.load(Ordering::Relaxed), 2);
        a.close();
        b.close();
        assert_eq!(records_in(&b_dir), (0..21).map(record).collect::<Vec<_>>());
    }

    /// `close` of a log whose thread is busy with another log returns only once every append
    /// queued before it completed; the other log goes on.
    #[test]
    fn closing_a_log_while_another_is_busy_completes_its_queue() {
        let pool = WalPool::new(1).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
        let a = writer_in(&pool, &a_dir);
        let b = writer_in(&pool, &b_dir);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (busy_tx, busy_rx) = mpsc::channel();
        let busy = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut pending = std::collections::VecDeque::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    pending.push_back(b.append(record(n)));
                    n += 1;
                    if n == 100 {
                        busy_tx.send(()).unwrap();
                    }
                    if pending.len() > 64 {
                        pending.pop_front().unwrap().wait().unwrap();
                    }
                }
                for p in pending {
                    p.wait().unwrap();
                }
                b.close();
                n
            })
        };
        busy_rx.recv().unwrap();
        let mut pa: Vec<_> = (0..500).map(|i| a.append(record(i))).collect();
        a.close();
        for (i, p) in pa.iter_mut().enumerate() {
            assert!(
                matches!(p.0.try_recv(), Ok(Ok(()))),
                "append {i} not complete when close returned"
            );
        }
        stop.store(true, Ordering::Relaxed);
        let n = busy.join().unwrap();
        assert_eq!(records_in(&a_dir), (0..500).map(record).collect::<Vec<_>>());
        assert_eq!(records_in(&b_dir), (0..n).map(record).collect::<Vec<_>>());
    }
}
