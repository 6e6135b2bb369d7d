//! The threads that write and fsync every log of the process ([`WalPool`]), and the completions they hand back ([`Pending`]).

use super::*;

/// The completion of a [`WalWriter`] command: await it, or [`Pending::wait`] outside an async
/// runtime.
#[derive(Debug)]
#[must_use = "an append is durable only once this completes"]
pub struct Pending<T>(pub(super) oneshot::Receiver<Result<T, WalError>>);

impl<T> Pending<T> {
    pub(super) fn ready(r: Result<T, WalError>) -> Self {
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
pub(super) enum Durability {
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
    pub(super) inner: Arc<PoolInner>,
}

impl std::fmt::Debug for WalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalPool")
            .field("threads", &self.threads())
            .finish()
    }
}

/// The process-wide pool: its size until it starts, then the pool.
pub(super) struct Global {
    threads: usize,
    pool: Option<WalPool>,
}

pub(super) static GLOBAL: Mutex<Global> = Mutex::new(Global {
    threads: DEFAULT_WRITER_THREADS,
    pool: None,
});

/// Locks, ignoring poisoning: nothing panics while holding these locks but an allocation.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
    pub(super) fn place(&self) -> Arc<Worker> {
        let worker = self.least_loaded();
        worker.logs.fetch_add(1, Ordering::Relaxed);
        worker.clone()
    }

    /// The live thread with the fewest logs.
    pub(super) fn least_loaded(&self) -> &Arc<Worker> {
        let workers = &self.inner.workers;
        workers
            .iter()
            .filter(|w| !lock(&w.queue).dead)
            .min_by_key(|w| w.logs.load(Ordering::Relaxed))
            // All dead: the commands are dropped, and answer `Closed`.
            .unwrap_or(&workers[0])
    }
}

pub(super) struct PoolInner {
    pub(super) workers: Vec<Arc<Worker>>,
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
pub(super) type LogId = u64;

pub(super) static NEXT_LOG: AtomicU64 = AtomicU64::new(1);

pub(super) enum Command {
    /// A new log's state; always its first command.
    Open(Box<Log>),
    /// A record, and whether its append waits for an fsync (durable) or only for the write.
    Append(Vec<u8>, Durability, oneshot::Sender<Result<(), WalError>>),
    /// The longest a logged frame waits for its fsync.
    SyncInterval(Duration),
    /// Fsyncs the frames written before it (none: done at once); fails once the log has.
    Sync(oneshot::Sender<Result<(), WalError>>),
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
pub(super) struct Worker {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Logs placed on this thread and not closed yet.
    pub(super) logs: AtomicUsize,
}

#[derive(Default)]
pub(super) struct Queue {
    commands: VecDeque<(LogId, Command)>,
    /// The pool is gone: end once the queue is empty.
    stop: bool,
    /// The thread panicked: commands are dropped (their completions answer `Closed`).
    dead: bool,
}

impl Worker {
    pub(super) fn send(&self, log: LogId, cmd: Command) {
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

    pub(super) fn run(self: Arc<Self>) {
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
    pub(super) fn periodic_syncs(
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
    pub(super) fn round(
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
pub(super) struct DeathGuard<'a>(&'a Worker);

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

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("logs", &self.logs.load(Ordering::Relaxed))
            .finish()
    }
}
