//! How far the replica's commits got, for updates applied outside the actor that wait for
//! theirs: a `durable` add applied where its request arrives holds a [`CommitTicket`] for the
//! commit that carries it, and is answered once the log reports that commit synced (or
//! failed, or the replica stopped).
//!
//! The ticket's commit number is read under the filter's write lock, where the actor also
//! takes each commit's delta and moves the number on ([`Shared::open_batch`]): an update
//! applied before a take is in that commit, one applied after it in the next. Under the same
//! lock the update raises [`Shared::sync_through`], so that the commit that carries it knows
//! it must be fsynced.
//!
//! [`Shared::open_batch`]: super::Shared::open_batch
//! [`Shared::sync_through`]: super::Shared::sync_through

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::replica::ReplicaError;

/// Failed commits remembered for their waiters (a failed log fails every commit until it is
/// replaced, so a waiter finds its own among the last ones).
const REMEMBERED_FAILURES: usize = 256;

/// The replica's commits so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommitProgress {
    /// Every commit up to this one is done: written, and fsynced where an update waiting
    /// for it asked (its failure, if it failed, is in `failed`).
    done_through: u64,
    /// Recent commits whose log append failed, with why.
    failed: VecDeque<(u64, String)>,
    /// The replica stopped: commits not done by then never will be.
    stopped: bool,
}

/// Where the actor reports its commits. The channel the tickets wait on is made with the
/// first ticket: a `watch` channel is a 384-byte allocation, and most replicas of a node of
/// many filters never have an update wait for its commit outside the actor.
#[derive(Debug, Default)]
pub(crate) struct Commits(Mutex<Reported>);

#[derive(Debug, Default)]
struct Reported {
    progress: CommitProgress,
    /// Made by the first ticket; every report after it goes out on it too.
    waiters: Option<watch::Sender<CommitProgress>>,
}

impl Commits {
    /// Records a change of the progress, and wakes the tickets if it changed anything.
    fn report(&self, change: impl FnOnce(&mut CommitProgress) -> bool) {
        let mut r = self.0.lock().expect("commits lock");
        if change(&mut r.progress)
            && let Some(tx) = &r.waiters
        {
            tx.send_replace(r.progress.clone());
        }
    }

    /// Commit `batch` is done; `failure`: its log append failed.
    pub(crate) fn done(&self, batch: u64, failure: Option<&str>) {
        self.report(|p| {
            if let Some(why) = failure {
                if p.failed.len() == REMEMBERED_FAILURES {
                    p.failed.pop_front();
                }
                p.failed.push_back((batch, why.to_string()));
            }
            let moved = batch > p.done_through;
            p.done_through = p.done_through.max(batch);
            moved || failure.is_some()
        });
    }

    /// The replica stopped; `durable_through`: every commit up to it is durable (the final
    /// snapshot holds it).
    pub(crate) fn stopped(&self, durable_through: Option<u64>) {
        self.report(|p| {
            if let Some(through) = durable_through {
                p.done_through = p.done_through.max(through);
            }
            p.stopped = true;
            true
        });
    }

    /// A ticket for commit `batch`.
    pub(crate) fn ticket(&self, batch: u64) -> CommitTicket {
        let mut r = self.0.lock().expect("commits lock");
        let Reported { progress, waiters } = &mut *r;
        let tx = waiters.get_or_insert_with(|| watch::Sender::new(progress.clone()));
        CommitTicket {
            progress: tx.subscribe(),
            batch,
        }
    }
}

/// An update applied outside the actor, waiting for the commit that carries it.
#[derive(Debug)]
pub struct CommitTicket {
    progress: watch::Receiver<CommitProgress>,
    batch: u64,
}

impl CommitTicket {
    /// Once the commit is done: `Ok` if it was, [`ReplicaError::NotDurable`] if its log
    /// append failed, [`ReplicaError::Stopped`] if the replica stopped first. The update
    /// stays applied in every case.
    pub async fn settled(mut self) -> Result<(), ReplicaError> {
        let batch = self.batch;
        let progress = self
            .progress
            .wait_for(|p| p.done_through >= batch || p.stopped)
            .await
            .map_err(|_| ReplicaError::Stopped)?;
        if progress.done_through < batch {
            return Err(ReplicaError::Stopped);
        }
        match progress.failed.iter().find(|(b, _)| *b == batch) {
            Some((_, why)) => Err(ReplicaError::NotDurable(why.clone())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ticket_settles_with_its_commit_its_failure_or_the_stop() {
        let commits = Commits::default();
        let (two, three, four) = (commits.ticket(2), commits.ticket(3), commits.ticket(4));
        let early = commits.ticket(1);
        commits.done(1, None);
        assert!(early.settled().await.is_ok());
        // Commit 2 is done, and 3 failed: each ticket learns its own.
        commits.done(2, None);
        commits.done(3, Some("disk full"));
        assert!(two.settled().await.is_ok());
        assert!(
            matches!(three.settled().await, Err(ReplicaError::NotDurable(w)) if w == "disk full")
        );
        // Stopped before commit 4, with nothing written by the stop: not durable.
        let five = commits.ticket(5);
        commits.stopped(None);
        assert!(matches!(four.settled().await, Err(ReplicaError::Stopped)));
        assert!(matches!(five.settled().await, Err(ReplicaError::Stopped)));
        // A stop whose final snapshot holds everything settles the rest.
        let commits = Commits::default();
        let six = commits.ticket(6);
        // A ticket taken after its commit was reported settles at once.
        commits.done(2, None);
        assert!(commits.ticket(2).settled().await.is_ok());
        commits.stopped(Some(7));
        assert!(six.settled().await.is_ok());
    }
}
