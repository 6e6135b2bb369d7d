//! One log's writer: [`WalWriter`], the handle, and `Log`, the segments and group commits it drives on a pool thread.

use super::*;

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
    disk: Arc<dyn Disk>,
    identity: Identity,
    stats: Arc<WalStats>,
    sync_interval: Duration,
    closed: bool,
}

impl WalWriter {
    /// Starts the writer on a replayed log, on the process-wide [`WalPool`]; its segments will
    /// carry `identity`. The first segment is created at the first append.
    pub fn start(replayed: Replayed, identity: Identity) -> Result<WalWriter, DurableError> {
        let pool = Self::global_pool(&replayed.dir)?;
        Ok(Self::start_in(&pool, replayed, identity))
    }

    /// The process-wide [`WalPool`], for a log in `dir` (named by the error if it cannot run).
    pub(super) fn global_pool(dir: &Path) -> Result<WalPool, DurableError> {
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
            replayed.disk,
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
        disk: Arc<dyn Disk>,
        identity: Identity,
        next: u64,
        sync_interval: Duration,
    ) -> Result<WalWriter, DurableError> {
        let pool = Self::global_pool(&dir)?;
        Ok(Self::open(
            pool,
            dir,
            disk,
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
            self.disk.clone(),
            self.identity,
            self.limits,
            self.current + 1,
            self.stats.clone(),
            self.sync_interval,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        pool: WalPool,
        dir: PathBuf,
        disk: Arc<dyn Disk>,
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
            disk,
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

    pub(super) fn append_as(&self, record: Vec<u8>, durability: Durability) -> Pending<()> {
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

    /// Completes once every append issued before it is fsynced (logged ones included):
    /// for updates that wait for the disk and rest on what earlier appends wrote, with no
    /// record of their own to append. Fails if the log has.
    pub fn sync(&self) -> Pending<()> {
        if !self.is_open() {
            // Nothing written since the start: what was replayed is synced.
            return Pending::ready(Ok(()));
        }
        let (tx, rx) = oneshot::channel();
        self.send(Command::Sync(tx));
        Pending(rx)
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
    pub(super) fn new_log(&self) -> Log {
        Log::new(
            (self.dir.clone(), self.disk.clone()),
            self.identity,
            self.limits,
            self.current,
            self.stats.clone(),
            self.sync_interval,
        )
    }

    pub(super) fn send(&self, cmd: Command) {
        let worker = self.worker.get_or_init(|| {
            let worker = self.pool.place();
            worker.send(self.log, Command::Open(Box::new(self.new_log())));
            worker
        });
        // A dead thread drops the command, and with it the completion: it answers `Closed`.
        worker.send(self.log, cmd);
    }

    #[cfg(test)]
    pub(super) fn hold(&self) -> mpsc::Sender<()> {
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
pub(super) struct Batch {
    body: Vec<u8>,
    pub(super) waiters: Vec<oneshot::Sender<Result<(), WalError>>>,
    /// Some append waits for the fsync: the frame is synced in its round.
    durable: bool,
    /// Of `waiters`, the logged appends (for the counters).
    logged: u64,
}

/// A durable frame written but not synced yet.
pub(super) struct Written {
    waiters: Vec<oneshot::Sender<Result<(), WalError>>>,
    logged: u64,
    /// Where it starts in its segment (a failed sync cuts it off there).
    start: u64,
}

/// The segment being written.
pub(super) struct Segment {
    file: Box<dyn DiskFile>,
    /// Bytes of complete frames written.
    written: u64,
    /// Created, and the directory entry not synced yet.
    new: bool,
}

/// A log's state, on its pool thread.
pub(super) struct Log {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    identity: Identity,
    limits: WalLimits,
    current: u64,
    file: Option<Segment>,
    stats: Arc<WalStats>,
    failed: Option<WalError>,
    pub(super) batch: Batch,
    /// The longest a written frame waits for its fsync.
    sync_interval: Duration,
    /// When the periodic sync is due: set by the first frame written after an fsync.
    pub(super) sync_due: Option<Instant>,
    /// A due time set since the pool thread last looked (it schedules the sync).
    pub(super) newly_due: Option<Instant>,
    /// The log directory's own entry was synced in its parent by this writer: a life that
    /// crashed after making the directory, before syncing its parent, left a directory a
    /// loss of power takes away with every segment synced in it later.
    pub(super) dir_entry_synced: bool,
}

impl Log {
    /// A log at segment `current`, nothing opened yet.
    pub(super) fn new(
        (dir, disk): (PathBuf, Arc<dyn Disk>),
        identity: Identity,
        limits: WalLimits,
        current: u64,
        stats: Arc<WalStats>,
        sync_interval: Duration,
    ) -> Log {
        Log {
            dir,
            disk,
            identity,
            limits,
            current,
            file: None,
            stats,
            failed: None,
            batch: Batch::default(),
            sync_interval,
            sync_due: None,
            newly_due: None,
            dir_entry_synced: false,
        }
    }

    /// Adds an append to the round's frame; a full frame is committed first on its own.
    pub(super) fn gather(
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
    pub(super) fn commit(&mut self) {
        if let Some(frame) = self.write_batch() {
            self.sync_batch(frame);
        }
    }

    /// Completes what was gathered and syncs what was written: the log is closed.
    pub(super) fn close(&mut self) {
        self.commit();
        self.sync_written();
    }

    pub(super) fn execute(&mut self, cmd: Command) {
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
            Command::Sync(done) => {
                self.sync_written();
                let _ = done.send(self.failed.clone().map_or(Ok(()), Err));
            }
            Command::Rotate(next) => {
                // Only the last segment may end in unsynced frames (the torn-tail rule looks
                // there only): the segment that ends is synced first.
                self.sync_written();
                crash::point(crash::WAL_ROTATE);
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

    pub(super) fn remove_through(&mut self, id: u64) -> Result<usize, WalError> {
        let wal_io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: io::Error| WalError::Io {
                path,
                source: Arc::new(e),
            }
        };
        let segments = list_segments_io(&*self.disk, &self.dir).map_err(wal_io(&self.dir))?;
        let mut removed = 0;
        let mut result = Ok(());
        for (sid, path) in segments.range(..=id.min(self.current - 1)) {
            match self.disk.remove_file(path) {
                Ok(()) => {
                    removed += 1;
                    crash::point(crash::WAL_REMOVE);
                }
                Err(e) => {
                    tracing::warn!(segment = sid, error = %e, "cannot remove a write-ahead log segment");
                    result = Err(wal_io(path)(e));
                }
            }
        }
        if removed > 0 {
            WalStats::add(&self.stats.segments_removed, removed as u64);
            self.disk.sync_path(&self.dir).map_err(wal_io(&self.dir))?;
        }
        result.map(|()| removed)
    }

    /// The first half of a group commit: writes the gathered appends as one frame. Answers
    /// the frame if it waits for its fsync; `None` if nothing was gathered, the write failed
    /// (its appends were answered), or it holds only logged appends (answered now, and
    /// synced by the periodic sync).
    pub(super) fn write_batch(&mut self) -> Option<Written> {
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
    pub(super) fn sync_batch(&mut self, frame: Written) {
        let r = self.sync_file(false);
        if r.is_ok() {
            crash::point(crash::WAL_AFTER_FSYNC);
        }
        if r.is_err()
            && let Some(seg) = &mut self.file
        {
            // The frame was never acknowledged; the logged frames before it stay.
            roll_back(&mut *seg.file, frame.start);
            seg.written = frame.start;
        }
        self.finish(frame.waiters, frame.logged, r);
    }

    /// The periodic sync of the frames written since the last fsync.
    pub(super) fn periodic_sync(&mut self) {
        if self.failed.is_some() {
            self.sync_due = None;
            return;
        }
        if let Err(e) = self.sync_file(true) {
            self.poison(e);
        }
    }

    /// Syncs frames written and not synced yet, if any (a rotation, a close).
    pub(super) fn sync_written(&mut self) {
        if self.sync_due.is_none() || self.failed.is_some() {
            return;
        }
        if let Err(e) = self.sync_file(false) {
            self.poison(e);
        }
    }

    pub(super) fn poison(&mut self, e: WalError) {
        WalStats::add(&self.stats.failures, 1);
        if self.failed.is_none() {
            tracing::error!(dir = ?self.dir, error = %e, "write-ahead log failed: no more durable appends");
            self.failed = Some(e);
        }
    }

    pub(super) fn finish(
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

    pub(super) fn segment_path(&self) -> PathBuf {
        self.dir.join(segment_name(self.current))
    }

    /// Writes one frame, creating the segment first if needed; answers where the frame
    /// starts. A durable frame's [`Log::sync_file`] follows before anything else is written.
    pub(super) fn write_frame(&mut self, body: &[u8]) -> Result<u64, WalError> {
        let path = self.segment_path();
        let wal_io = |e: io::Error| WalError::Io {
            path: path.clone(),
            source: Arc::new(e),
        };
        let mut buf = Vec::with_capacity(SEGMENT_HEADER + FRAME_HEADER + body.len());
        if self.file.is_none() {
            let f = self.disk.create_new(&path).map_err(wal_io)?;
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
        crash::point(crash::WAL_BEFORE_WRITE);
        let written = crash::fail(crash::FAIL_WAL_WRITE).and_then(|()| seg.file.write_all(&buf));
        if let Err(e) = written {
            roll_back(&mut *seg.file, start);
            return Err(wal_io(e));
        }
        crash::point(crash::WAL_AFTER_WRITE);
        seg.written += buf.len() as u64;
        WalStats::add(&self.stats.bytes, buf.len() as u64);
        Ok(start)
    }

    /// Syncs the segment being written (every frame written to it so far), and its directory
    /// entry if it is new.
    pub(super) fn sync_file(&mut self, periodic: bool) -> Result<(), WalError> {
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
        r.and_then(|()| crash::fail(crash::FAIL_WAL_FSYNC))
            .map_err(wal_io)?;
        WalStats::add(&self.stats.fsyncs, 1);
        if periodic {
            WalStats::add(&self.stats.periodic_fsyncs, 1);
        }
        if seg.new {
            if self.dir_entry_synced {
                self.disk.sync_path(&self.dir).map_err(&wal_io)?;
            } else {
                // The segment's name, the log directory's and, once a life, the data
                // directory's entry in its parent, in one round: a new data directory's
                // entries are made durable by its first save (`DataDir::open_new`), and a
                // durable append may come before it.
                let above: Vec<&Path> = std::iter::once(self.dir.as_path())
                    .chain(self.dir.ancestors().skip(1).take(2))
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect();
                self.disk.sync_paths(&above).map_err(&wal_io)?;
                self.dir_entry_synced = true;
            }
            seg.new = false;
        }
        self.sync_due = None;
        Ok(())
    }
}

/// A log written on the caller's thread, one step at a time: what a pool thread does for a
/// [`WalWriter`], without the thread, so that the deterministic simulation (`src/sim/`) runs
/// the writer's own code in an order it chooses.
#[cfg(test)]
pub(crate) struct DirectLog {
    log: Log,
}

#[cfg(test)]
impl DirectLog {
    /// The writer of a replayed log, as [`WalWriter::start`] would make it.
    pub(crate) fn start(replayed: Replayed, identity: Identity) -> DirectLog {
        let log = Log::new(
            (replayed.dir, replayed.disk),
            identity,
            replayed.limits,
            replayed.next,
            Arc::new(WalStats::default()),
            DEFAULT_SYNC_INTERVAL,
        );
        DirectLog { log }
    }

    /// Queues an append for the next [`DirectLog::commit`]; `durable` waits for its fsync.
    pub(crate) fn append(
        &mut self,
        record: Vec<u8>,
        durable: bool,
    ) -> oneshot::Receiver<Result<(), WalError>> {
        let (tx, rx) = oneshot::channel();
        let durability = match durable {
            true => Durability::Synced,
            false => Durability::Written,
        };
        self.log.gather(record, durability, tx);
        rx
    }

    /// [`WalWriter::sync`], at once.
    pub(crate) fn sync(&mut self) -> oneshot::Receiver<Result<(), WalError>> {
        let (tx, rx) = oneshot::channel();
        self.log.execute(Command::Sync(tx));
        rx
    }

    /// A pool thread's round: writes what was queued as one frame, fsynced if durable.
    pub(crate) fn commit(&mut self) {
        self.log.commit();
    }

    /// The periodic sync of logged frames.
    pub(crate) fn periodic_sync(&mut self) {
        self.log.periodic_sync();
    }

    /// [`WalWriter::rotate`].
    pub(crate) fn rotate(&mut self) -> SegmentId {
        let done = self.log.current;
        self.log.execute(Command::Rotate(done + 1));
        SegmentId(done)
    }

    /// [`WalWriter::remove_through`].
    pub(crate) fn remove_through(&mut self, id: SegmentId) -> Result<usize, WalError> {
        self.log.commit();
        self.log.remove_through(id.0)
    }

    /// Whether an append or sync failed (the writer never writes again).
    pub(crate) fn failed(&self) -> bool {
        self.log.failed.is_some()
    }

    /// [`WalWriter::reopen`]: a writer on the segments after this one's.
    pub(crate) fn reopen(&self) -> DirectLog {
        let log = &self.log;
        let log = Log::new(
            (log.dir.clone(), log.disk.clone()),
            log.identity,
            log.limits,
            log.current + 1,
            log.stats.clone(),
            log.sync_interval,
        );
        DirectLog { log }
    }

    /// [`WalWriter::close`].
    pub(crate) fn close(mut self) {
        self.log.close();
    }
}
