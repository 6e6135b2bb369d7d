//! The commit pipeline's state: local updates are gathered into commits (one delta each),
//! appended to the write-ahead log one commit at a time (group commit: what arrives while one
//! is written goes into the next), published, and the updates that waited for a level are
//! answered ([`AckTracker`]). The shell carries out what it decides (timers, the log's
//! appends and syncs and their completion, publishing); every decision is here, without the
//! actor or the log's writer, and unit-tested.
//!
//! Commits and published deltas are paced apart: with a log, commits go at the log's pace (an
//! update that waits for the disk asks for one at once, and those that arrive during an fsync
//! share the next), while deltas go out at most once per `delta_interval_ms` (a written
//! commit's delta is [held](CommitPipeline::release) until then, and the deltas held meanwhile
//! travel in one message). A fast disk then adds fsyncs, not messages through nats-server; a
//! slow one adds neither.

use std::time::{Duration, Instant};

use crate::replica::ack::AckTracker;

/// The number of a replica's first commit (the pipeline's next at start, and
/// `Shared::open_batch` until the first take).
pub(crate) const FIRST_BATCH: u64 = 1;

/// Commits, the log they are written to, and the updates waiting for them (answered through
/// `R`).
pub(crate) struct CommitPipeline<R> {
    /// There is a write-ahead log (with a data directory): the shell holds its writer.
    logged: bool,
    /// The replacement of a failed log writer.
    recovery: WalRecovery,
    /// Updates waiting for their acknowledgement level.
    pub(crate) acks: AckTracker<R>,
    /// Number of the next commit (a commit carries every local update since the last one).
    next_batch: u64,
    /// A commit is being written to the log; the next waits for it.
    committing: bool,
    /// A commit was asked for while one was in flight.
    again: bool,
    /// A commit timer is armed (updates without a log, or `logged` ones, are gathered for
    /// a moment).
    commit_timer: bool,
    /// A timer for the flush of the pending delta is armed: none while nothing changed.
    flush_timer: bool,
    /// When the pending delta was last flushed.
    last_flush: Option<Instant>,
    /// When the commit being written to the log began.
    writing_since: Option<Instant>,
    /// Written commits' deltas waiting for their publication, oldest first.
    held: Vec<HeldDelta>,
    /// When the newest commit published so far began.
    published_since: Option<Instant>,
    /// A timer for the publication of the held deltas is armed.
    publish_timer: bool,
    /// The replica stops: nothing is held any more (no timer would fire).
    stopping: bool,
}

/// A written commit's delta, waiting for its publication.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HeldDelta {
    /// The commit.
    pub batch: u64,
    /// Its encoded delta.
    pub delta: Vec<u8>,
    /// When the commit began.
    began: Instant,
}

/// What to do with a written commit's delta ([`CommitPipeline::release`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Publish these deltas now, oldest first (the one just written last).
    Now(Vec<HeldDelta>),
    /// Held: arm a timer that publishes the held deltas after this delay.
    Later(Duration),
    /// Held: the armed timer publishes it with the others.
    Held,
}

impl<R> CommitPipeline<R> {
    /// A pipeline before its first commit, with a write-ahead log if `logged`.
    pub(crate) fn new(logged: bool) -> Self {
        CommitPipeline {
            logged,
            recovery: WalRecovery::default(),
            acks: AckTracker::default(),
            next_batch: FIRST_BATCH,
            committing: false,
            again: false,
            commit_timer: false,
            flush_timer: false,
            last_flush: None,
            writing_since: None,
            held: Vec::new(),
            published_since: None,
            publish_timer: false,
            stopping: false,
        }
    }

    /// Whether the replica has a write-ahead log (a data directory).
    pub(crate) fn logged(&self) -> bool {
        self.logged
    }

    /// The commit the next update goes into.
    pub(crate) fn next_batch(&self) -> u64 {
        self.next_batch
    }

    /// How long until the pending delta is flushed, given the last flush and
    /// `delta_interval_ms`: at once if the last is `interval` old (an add on an idle link
    /// travels at once), else when it will be (updates that come faster share deltas).
    pub(crate) fn flush_delay(&self, now: Instant, interval: Duration) -> Duration {
        self.last_flush.map_or(Duration::ZERO, |t| {
            (t + interval).saturating_duration_since(now)
        })
    }

    /// Arms the flush timer unless it is armed; whether the caller should start one.
    pub(crate) fn arm_flush_timer(&mut self) -> bool {
        !std::mem::replace(&mut self.flush_timer, true)
    }

    /// The flush timer fired.
    pub(crate) fn flush_timer_fired(&mut self) {
        self.flush_timer = false;
    }

    /// Whether a flush timer is armed.
    pub(crate) fn flush_timer_armed(&self) -> bool {
        self.flush_timer
    }

    /// Arms the commit timer unless it is armed; whether the caller should start one.
    pub(crate) fn arm_commit_timer(&mut self) -> bool {
        !std::mem::replace(&mut self.commit_timer, true)
    }

    /// The commit timer fired.
    pub(crate) fn commit_timer_fired(&mut self) {
        self.commit_timer = false;
    }

    /// A flush of the pending delta starts now: the number of the commit it makes, or `None`
    /// if a commit is being written (this one then follows it, with whatever came meanwhile).
    pub(crate) fn begin(&mut self, now: Instant) -> Option<u64> {
        self.last_flush = Some(now);
        if self.committing {
            self.again = true;
            return None;
        }
        let batch = self.next_batch;
        self.next_batch += 1;
        Some(batch)
    }

    /// Whether commit `batch` must be fsynced: updates in it wait for the disk (through the
    /// actor, or applied outside it up to `sync_through`). The others (`logged`, `local`) are
    /// synced by the log's periodic sync.
    pub(crate) fn must_sync(&self, batch: u64, sync_through: u64) -> bool {
        self.acks.wants_sync(batch) || sync_through >= batch
    }

    /// The delta of commit `batch` goes to the log: whether its append is fsynced
    /// ([`CommitPipeline::must_sync`]), or `None` without a log (nothing to wait for). Until
    /// [`CommitPipeline::written`], the next commit waits.
    pub(crate) fn append(&mut self, batch: u64, sync_through: u64) -> Option<bool> {
        if !self.logged {
            return None;
        }
        self.committing = true;
        self.writing_since = self.last_flush;
        Some(self.must_sync(batch, sync_through))
    }

    /// Commit `batch` has no delta: if it must be fsynced ([`CommitPipeline::must_sync`]),
    /// a sync of the log, since its updates may rest on earlier appends only written (an
    /// add of an item a `logged` add set); `None` if not, or without a log. Until
    /// [`CommitPipeline::written`], the next commit waits.
    pub(crate) fn sync(&mut self, batch: u64, sync_through: u64) -> bool {
        if !self.logged || !self.must_sync(batch, sync_through) {
            return false;
        }
        self.committing = true;
        self.writing_since = self.last_flush;
        true
    }

    /// The commit being written is written (or failed): whether another should start at
    /// once, because one was asked for meanwhile or updates wait for one not yet made; and
    /// when the written one began (for [`CommitPipeline::release`]).
    pub(crate) fn written(&mut self, now: Instant) -> (bool, Instant) {
        self.committing = false;
        let began = self.writing_since.take().unwrap_or(now);
        let again = std::mem::take(&mut self.again) || self.acks.wants_commit(self.next_batch);
        (again, began)
    }

    /// The written commit `batch`, begun at `began`, has `delta` to publish: now if the last
    /// publication is `interval` older than its beginning (commits paced by the interval, or
    /// a quiet link), or if updates in it wait for peers (`confirm`: their delta goes at
    /// once, with those held before it); else held until `interval` after the newest commit
    /// published began, with whatever is written meanwhile.
    pub(crate) fn release(
        &mut self,
        batch: u64,
        delta: Vec<u8>,
        began: Instant,
        confirm: bool,
        interval: Duration,
        now: Instant,
    ) -> Release {
        self.held.push(HeldDelta {
            batch,
            delta,
            began,
        });
        let due = self.published_since.map(|t| t + interval);
        match due {
            Some(due) if !confirm && !self.stopping && due > began && due > now => {
                if std::mem::replace(&mut self.publish_timer, true) {
                    Release::Held
                } else {
                    Release::Later(due - now)
                }
            }
            _ => Release::Now(self.take_held()),
        }
    }

    /// The replica stops: deltas are published as they are written from now on.
    pub(crate) fn stopping(&mut self) {
        self.stopping = true;
    }

    /// The held deltas, to publish now (the publication timer fired, or the replica stops).
    pub(crate) fn take_held(&mut self) -> Vec<HeldDelta> {
        if let Some(newest) = self.held.iter().map(|h| h.began).max() {
            self.published_since = Some(newest);
        }
        std::mem::take(&mut self.held)
    }

    /// The publication timer fired: the held deltas, to publish.
    pub(crate) fn publish_timer_fired(&mut self) -> Vec<HeldDelta> {
        self.publish_timer = false;
        self.take_held()
    }

    /// Whether anything is in flight or waiting: updates for their level, a failed log for
    /// its replacement, a delta for its flush or its publication.
    pub(crate) fn busy(&self) -> bool {
        self.acks.len() > 0
            || self.recovery.pending
            || self.flush_timer
            || self.publish_timer
            || !self.held.is_empty()
    }

    /// Whether nothing of the pipeline would go on after its replica stopped: not
    /// [`CommitPipeline::busy`], and no commit being written, asked for or timed.
    pub(crate) fn idle(&self) -> bool {
        !self.busy() && !self.committing && !self.again && !self.commit_timer
    }

    /// Whether the log failed and is not replaced yet.
    pub(crate) fn wal_failing(&self) -> bool {
        self.recovery.pending
    }

    /// A log append failed: the delay before the first attempt at replacing the writer, or
    /// `None` if one is already scheduled.
    pub(crate) fn wal_failed(&mut self) -> Option<Duration> {
        if self.recovery.pending {
            return None;
        }
        self.recovery.pending = true;
        Some(self.recovery.delay)
    }

    /// An attempt at replacing the failed writer did not succeed: the delay before the next,
    /// doubled each time up to [`WalRecovery::MAX_DELAY`].
    pub(crate) fn retry_delay(&mut self) -> Duration {
        self.recovery.delay = (self.recovery.delay * 2).min(WalRecovery::MAX_DELAY);
        self.recovery.delay
    }

    /// The shell replaced the failed writer (or had none to replace): recovered, and the
    /// next failure's backoff starts over.
    pub(crate) fn reopened(&mut self) {
        self.recovery = WalRecovery::default();
    }
}

/// The replacement of a failed log writer: scheduled or not, and the delay before the next
/// attempt.
struct WalRecovery {
    pending: bool,
    delay: Duration,
}

impl WalRecovery {
    const FIRST_DELAY: Duration = Duration::from_millis(100);
    const MAX_DELAY: Duration = Duration::from_secs(5);
}

impl Default for WalRecovery {
    fn default() -> Self {
        WalRecovery {
            pending: false,
            delay: Self::FIRST_DELAY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::ack::AckLevel;

    #[test]
    fn commits_are_numbered_and_one_is_written_at_a_time() {
        let mut p = CommitPipeline::<u32>::new(true);
        let now = Instant::now();
        assert_eq!(p.begin(now), Some(FIRST_BATCH));
        assert_eq!(
            p.append(FIRST_BATCH, 0),
            Some(false),
            "nothing waits for the disk"
        );
        // Asked for while the first is written: it follows, once.
        assert_eq!(p.begin(now), None);
        assert_eq!(p.begin(now), None);
        assert!(p.written(now).0, "the flush asked for meanwhile goes next");
        assert_eq!(p.begin(now), Some(FIRST_BATCH + 1));
        assert_eq!(
            p.append(FIRST_BATCH + 1, FIRST_BATCH + 1),
            Some(true),
            "an update applied outside the actor waits for the disk"
        );
        let (again, began) = p.written(now);
        assert!(!again, "nothing asked for, nothing waiting");
        assert_eq!(began, now, "when the written commit began");
        assert_eq!(p.next_batch(), FIRST_BATCH + 2);
    }

    #[test]
    fn without_a_log_commits_never_wait_for_each_other() {
        let mut p = CommitPipeline::<u32>::new(false);
        let now = Instant::now();
        assert_eq!(p.begin(now), Some(1));
        assert_eq!(p.append(1, 1), None);
        assert!(!p.sync(1, 1), "no log to sync");
        assert_eq!(p.begin(now), Some(2));
        assert!(!p.wal_failing());
    }

    #[test]
    fn updates_waiting_for_the_disk_make_their_commit_sync_and_call_for_the_next() {
        let mut p = CommitPipeline::<u32>::new(false);
        assert!(!p.must_sync(1, 0));
        // Applied outside the actor, in commit 1, waiting for the disk.
        assert!(p.must_sync(1, 1));
        assert!(!p.must_sync(2, 1));
        // Through the actor: a durable update in the next commit.
        p.acks.wait(AckLevel::Durable, p.next_batch(), 7);
        assert!(p.must_sync(1, 0));
        assert!(p.busy());
        // A commit written while it waits for one not yet made: another goes at once.
        assert_eq!(p.begin(Instant::now()), Some(1));
        p.acks.wait(AckLevel::Durable, p.next_batch(), 8);
        assert!(p.written(Instant::now()).0);
    }

    #[test]
    fn a_flush_waits_for_the_interval_since_the_last_one() {
        let mut p = CommitPipeline::<u32>::new(false);
        let t = Instant::now();
        let interval = Duration::from_millis(50);
        assert_eq!(
            p.flush_delay(t, interval),
            Duration::ZERO,
            "none yet: at once"
        );
        p.begin(t);
        assert_eq!(
            p.flush_delay(t + Duration::from_millis(20), interval),
            Duration::from_millis(30)
        );
        assert_eq!(
            p.flush_delay(t + Duration::from_millis(80), interval),
            Duration::ZERO
        );
        // One timer at a time, for flushes and for commits.
        assert!(p.arm_flush_timer());
        assert!(!p.arm_flush_timer());
        assert!(p.flush_timer_armed() && p.busy());
        p.flush_timer_fired();
        assert!(p.arm_flush_timer());
        assert!(p.arm_commit_timer());
        assert!(!p.arm_commit_timer());
        p.commit_timer_fired();
        assert!(p.arm_commit_timer());
    }

    #[test]
    fn written_deltas_go_out_at_most_once_per_interval_unless_peers_wait() {
        let mut p = CommitPipeline::<u32>::new(false);
        let t = Instant::now();
        let ms = Duration::from_millis;
        let interval = ms(2);
        let batches = |r: Release| match r {
            Release::Now(held) => held.iter().map(|h| h.batch).collect::<Vec<_>>(),
            other => panic!("expected a publication, got {other:?}"),
        };
        // Nothing published yet: at once.
        assert_eq!(batches(p.release(1, vec![1], t, false, interval, t)), [1]);
        // Commits at a fast disk's pace: held until the interval since the last one
        // published began, one timer for all of them.
        let t2 = t + ms(1) / 4;
        assert_eq!(
            p.release(2, vec![2], t2, false, interval, t2 + ms(1) / 4),
            Release::Later(ms(2) - ms(1) / 2)
        );
        assert_eq!(
            p.release(3, vec![3], t + ms(1), false, interval, t + ms(1)),
            Release::Held
        );
        assert!(p.busy());
        let held = p.publish_timer_fired();
        assert_eq!(held.iter().map(|h| h.batch).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(held[1].delta, [3]);
        assert!(!p.busy());
        // The interval now runs from the newest published commit's beginning (t + 1 ms).
        assert_eq!(
            p.release(4, vec![4], t + ms(2), false, interval, t + ms(2)),
            Release::Later(ms(1))
        );
        // A commit that updates wait for peers in goes at once, after the held ones.
        assert_eq!(
            batches(p.release(5, vec![5], t + ms(2), true, interval, t + ms(2))),
            [4, 5]
        );
        assert!(
            p.publish_timer_fired().is_empty(),
            "the timer finds nothing held"
        );
        // Commits paced by the interval (each begun an interval after the last) go at once,
        // however long their write took.
        let later = t + ms(4);
        assert_eq!(
            batches(p.release(6, vec![6], later, false, interval, later + ms(3))),
            [6]
        );
        assert_eq!(
            batches(p.release(7, vec![7], later + interval, false, interval, later + ms(3))),
            [7]
        );
        // A commit written after its due time goes at once, without a timer.
        let t8 = later + ms(3);
        assert_eq!(
            batches(p.release(8, vec![8], t8, false, interval, t8 + ms(3))),
            [8]
        );
        // The stop takes what is held.
        let t9 = t8 + ms(1) / 2;
        assert!(matches!(
            p.release(9, vec![9], t9, false, interval, t9),
            Release::Later(_)
        ));
        p.stopping();
        assert_eq!(p.take_held().len(), 1);
        // Written after: out at once.
        let t10 = t9 + ms(1) / 4;
        assert_eq!(
            batches(p.release(10, vec![10], t10, false, interval, t10)),
            [10]
        );
    }

    #[test]
    fn a_failed_log_is_replaced_with_backoff_once_at_a_time() {
        let mut p = CommitPipeline::<u32>::new(true);
        assert_eq!(p.wal_failed(), Some(WalRecovery::FIRST_DELAY));
        assert_eq!(p.wal_failed(), None, "already scheduled");
        assert!(p.wal_failing() && p.busy());
        let delays: Vec<_> = (0..8).map(|_| p.retry_delay()).collect();
        assert_eq!(delays[0], WalRecovery::FIRST_DELAY * 2);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), WalRecovery::MAX_DELAY);
        p.reopened();
        assert!(!p.wal_failing());
        assert_eq!(
            p.wal_failed(),
            Some(WalRecovery::FIRST_DELAY),
            "the backoff starts over"
        );
    }
}
