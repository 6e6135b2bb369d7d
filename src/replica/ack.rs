//! Acknowledgement levels: how much must have happened to a local update before the replica
//! answers for it (after Akka Distributed Data's `WriteLocal` / `WriteMajority` / `WriteAll`).
//!
//! Local updates are committed in *batches*: the delta-state of every update since the last
//! commit is appended to the write-ahead log (when there is a data directory), fsynced once
//! for the whole batch (group commit), then published as one delta. [`AckTracker`] keeps the
//! updates waiting for their level and says which are answered as batches become durable,
//! their deltas are published, and peers acknowledge them. It does no I/O: the actor feeds it
//! events and sends the answers.

use std::collections::VecDeque;
use std::time::Instant;

use uuid::Uuid;

pub use crate::api::AckLevel;

/// Why a waiting update was answered with an error. The update itself stays applied locally:
/// a CRDT update cannot be taken back, so the error says how far it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckFailure {
    /// The write-ahead log failed.
    NotDurable(String),
    /// Too few peers acknowledged in time.
    NotReplicated {
        /// Acknowledgements received.
        acked: usize,
        /// Acknowledgements needed.
        needed: usize,
    },
    /// The replica stopped first.
    Stopped,
}

struct Waiting<R> {
    level: AckLevel,
    /// The commit that carries the update.
    batch: u64,
    /// Once durable and published (`Replicated` only): the envelope sequence number of its
    /// delta, the peers that acknowledged it, how many are needed, and until when.
    published: Option<Published>,
    responder: R,
}

struct Published {
    seq: u64,
    acked_by: Vec<Uuid>,
    needed: usize,
    deadline: Instant,
    /// Published while the last look at the registry found this replica alone: it needs a
    /// peer's acknowledgement, or a look that started at or after this instant and still
    /// finds it alone (see [`AckTracker::committed_alone`]).
    alone_since: Option<Instant>,
}

/// Updates waiting for their acknowledgement level, in commit order.
pub(crate) struct AckTracker<R> {
    waiting: VecDeque<Waiting<R>>,
    /// A look at the registry was asked for updates published alone and has not ended.
    look_asked: bool,
}

/// What an event resolved: responders to answer with success, and with an error.
pub(crate) struct Resolved<R> {
    pub ok: Vec<R>,
    pub failed: Vec<(R, AckFailure)>,
}

impl<R> Default for Resolved<R> {
    fn default() -> Self {
        Resolved {
            ok: Vec::new(),
            failed: Vec::new(),
        }
    }
}

impl<R> Resolved<R> {
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.ok.is_empty() && self.failed.is_empty()
    }
}

impl<R> Default for AckTracker<R> {
    fn default() -> Self {
        AckTracker {
            waiting: VecDeque::new(),
            look_asked: false,
        }
    }
}

impl<R> AckTracker<R> {
    /// An update carried by commit `batch` waits for `level` (not `Local` nor `Logged`,
    /// which are answered at once).
    pub(crate) fn wait(&mut self, level: AckLevel, batch: u64, responder: R) {
        debug_assert!(!level.answered_at_apply());
        self.waiting.push_back(Waiting {
            level,
            batch,
            published: None,
            responder,
        });
    }

    /// Updates waiting.
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any update waits for a commit not yet made (at or after `batch`).
    pub(super) fn wants_commit(&self, batch: u64) -> bool {
        self.waiting
            .iter()
            .any(|w| w.published.is_none() && w.batch >= batch)
    }

    /// Whether commit `batch` carries updates that wait for an fsync (`Durable`, and
    /// `Replicated` with a log); else its log append need not wait for one.
    pub(super) fn wants_sync(&self, batch: u64) -> bool {
        self.waiting
            .iter()
            .any(|w| w.published.is_none() && w.batch <= batch)
    }

    /// Whether commit `batch` carries updates that wait for peers (its delta then asks its
    /// receivers to acknowledge it).
    pub(crate) fn wants_confirmation(&self, batch: u64) -> bool {
        self.waiting
            .iter()
            .any(|w| w.level == AckLevel::Replicated && w.published.is_none() && w.batch <= batch)
    }

    /// Commits up to `batch` are durable, and the last of them was published as the delta of
    /// sequence number `seq` (`None`: nothing was published, the batch held no change).
    /// `Durable` updates are answered; `Replicated` ones now wait for `needed` peers until
    /// `deadline` (none needed: answered too).
    pub(crate) fn committed(
        &mut self,
        batch: u64,
        seq: Option<u64>,
        needed: usize,
        deadline: Instant,
    ) -> Resolved<R> {
        let mut out = Resolved::default();
        let mut keep = VecDeque::with_capacity(self.waiting.len());
        for mut w in self.waiting.drain(..) {
            if w.batch > batch || w.published.is_some() {
                keep.push_back(w);
                continue;
            }
            match (w.level, seq) {
                (AckLevel::Replicated, Some(seq)) if needed > 0 => {
                    w.published = Some(Published {
                        seq,
                        acked_by: Vec::new(),
                        needed,
                        deadline,
                        alone_since: None,
                    });
                    keep.push_back(w);
                }
                _ => out.ok.push(w.responder),
            }
        }
        self.waiting = keep;
        out
    }

    /// As [`AckTracker::committed`] when the last look at the registry found this replica
    /// alone: that look may have come before its peers claimed their ids, so alone is not
    /// taken on its word. `Replicated` updates wait for one peer's acknowledgement, or for a
    /// look that started at or after `now` ([`AckTracker::looked`]) to find it alone still.
    pub(crate) fn committed_alone(
        &mut self,
        batch: u64,
        seq: u64,
        now: Instant,
        deadline: Instant,
    ) -> Resolved<R> {
        let r = self.committed(batch, Some(seq), 1, deadline);
        for w in self.waiting.iter_mut() {
            if let Some(p) = &mut w.published
                && p.seq == seq
            {
                p.alone_since = Some(now);
            }
        }
        r
    }

    /// The earliest instant a look at the registry must start at or after to settle updates
    /// published alone ([`AckTracker::committed_alone`]); `None` if none waits for one.
    pub(crate) fn wants_look_since(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter_map(|w| w.published.as_ref()?.alone_since)
            .min()
    }

    /// The instant the next look at the registry must start at or after, if updates
    /// published alone wait for one and none is asked for yet (it is, from now on, until
    /// [`AckTracker::look_ended`]).
    pub(crate) fn look_to_ask(&mut self) -> Option<Instant> {
        if self.look_asked {
            return None;
        }
        let since = self.wants_look_since()?;
        self.look_asked = true;
        Some(since)
    }

    /// The look asked for by [`AckTracker::look_to_ask`] ended (pass what it found to
    /// [`AckTracker::looked`]).
    pub(crate) fn look_ended(&mut self) {
        self.look_asked = false;
    }

    /// A look at the registry that started at `started` counted the filter's replicas, of
    /// which `needed` peers make a majority: updates published alone before it now wait for
    /// that many (none: answered).
    pub(crate) fn looked(&mut self, started: Instant, needed: usize) -> Resolved<R> {
        for w in self.waiting.iter_mut() {
            if let Some(p) = &mut w.published
                && p.alone_since.is_some_and(|at| at <= started)
            {
                p.alone_since = None;
                p.needed = needed;
            }
        }
        self.take_acknowledged()
    }

    /// Commits up to `batch` are durable (their deltas may wait for their publication):
    /// `Durable` updates are answered; `Replicated` ones wait for theirs.
    pub(super) fn durable(&mut self, batch: u64) -> Resolved<R> {
        let ok = self
            .take_where(|w| w.level == AckLevel::Durable && w.batch <= batch)
            .into_iter()
            .map(|w| w.responder)
            .collect();
        Resolved {
            ok,
            failed: Vec::new(),
        }
    }

    /// Commits up to `batch` could not be made durable: their updates are answered with the
    /// error.
    pub(crate) fn commit_failed(&mut self, batch: u64, error: &str) -> Resolved<R> {
        self.resolve_where(
            |w| w.batch <= batch && w.published.is_none(),
            |_| AckFailure::NotDurable(error.to_string()),
        )
    }

    /// Peer `peer` merged our delta of sequence number `seq`.
    pub(crate) fn acked(&mut self, peer: Uuid, seq: u64) -> Resolved<R> {
        for w in self.waiting.iter_mut() {
            if let Some(p) = &mut w.published
                && p.seq == seq
                && !p.acked_by.contains(&peer)
            {
                p.acked_by.push(peer);
            }
        }
        self.take_acknowledged()
    }

    /// Answers the published updates that have the acknowledgements they need.
    fn take_acknowledged(&mut self) -> Resolved<R> {
        let ok = self
            .take_where(|w| {
                w.published
                    .as_ref()
                    .is_some_and(|p| p.acked_by.len() >= p.needed)
            })
            .into_iter()
            .map(|w| w.responder)
            .collect();
        Resolved {
            ok,
            failed: Vec::new(),
        }
    }

    /// Published updates whose deadline passed are answered with `NotReplicated`.
    pub(crate) fn expire(&mut self, now: Instant) -> Resolved<R> {
        self.resolve_where(
            |w| w.published.as_ref().is_some_and(|p| p.deadline <= now),
            |w| {
                let p = w.published.as_ref().expect("filtered on published");
                AckFailure::NotReplicated {
                    acked: p.acked_by.len(),
                    needed: p.needed,
                }
            },
        )
    }

    /// Everything still waiting is answered: `durable_through` is the last commit known
    /// durable (a final snapshot makes every update durable), the rest fails with `Stopped`.
    pub(super) fn stop(&mut self, durable_through: Option<u64>) -> Resolved<R> {
        let mut out = Resolved::default();
        for w in self.waiting.drain(..) {
            let durable = durable_through.is_some_and(|b| w.batch <= b);
            if w.level == AckLevel::Durable && durable {
                out.ok.push(w.responder);
            } else {
                out.failed.push((w.responder, AckFailure::Stopped));
            }
        }
        out
    }

    fn resolve_where(
        &mut self,
        pick: impl Fn(&Waiting<R>) -> bool,
        why: impl Fn(&Waiting<R>) -> AckFailure,
    ) -> Resolved<R> {
        let failed = self
            .take_where(pick)
            .into_iter()
            .map(|w| {
                let e = why(&w);
                (w.responder, e)
            })
            .collect();
        Resolved {
            ok: Vec::new(),
            failed,
        }
    }

    /// Takes the waiting updates `pick` chooses out, in commit order; the rest keep theirs.
    fn take_where(&mut self, pick: impl Fn(&Waiting<R>) -> bool) -> Vec<Waiting<R>> {
        let mut taken = Vec::new();
        let mut keep = VecDeque::with_capacity(self.waiting.len());
        for w in self.waiting.drain(..) {
            if pick(&w) {
                taken.push(w);
            } else {
                keep.push_back(w);
            }
        }
        self.waiting = keep;
        taken
    }
}

/// Peer acknowledgements a `Replicated` update needs: `configured`, or else a majority of the
/// `known` replicas counting this one (with 3 replicas, 1 peer; alone, none).
///
/// `known` is what the id registry holds, not who is heard from: counting only the live
/// peers let a replica cut off from them decide alone, once they expired, that a majority had
/// the update (issue 47).
pub(crate) fn peers_needed(configured: Option<usize>, known: usize) -> usize {
    configured.unwrap_or(known.max(1) / 2)
}

/// The replicas a `Replicated` update's majority is taken of: the ids the registry held at
/// the last look and renewed within `retire_after_ms` (`held_ids`, this replica's included),
/// and never fewer than the most replicas heard from at once since that look (`most_live`,
/// this one included: those that claimed their ids after it), nor than those heard from now
/// (`live_peers` and this one). A look that fails keeps the last count: a replica cut off
/// from the registry is cut off from its peers too, and must not shrink its majority to
/// itself.
pub(crate) fn known_replicas(
    held_ids: Option<usize>,
    most_live: usize,
    live_peers: usize,
) -> usize {
    held_ids.unwrap_or(0).max(most_live).max(live_peers + 1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn durable_updates_are_answered_when_their_batch_is() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Durable, 1, "a");
        t.wait(AckLevel::Durable, 2, "b");
        assert!(t.wants_commit(2));
        let r = t.committed(1, Some(10), 1, later());
        assert_eq!(r.ok, vec!["a"]);
        assert_eq!(t.len(), 1);
        let r = t.committed(2, None, 1, later());
        assert_eq!(r.ok, vec!["b"]);
        assert!(!t.wants_commit(0));
    }

    #[test]
    fn durable_updates_are_answered_before_their_delta_is_published() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Durable, 1, "d1");
        t.wait(AckLevel::Replicated, 1, "r1");
        t.wait(AckLevel::Durable, 2, "d2");
        assert_eq!(t.durable(1).ok, vec!["d1"]);
        assert_eq!(t.len(), 2, "the replicated one waits for its publication");
        assert!(t.wants_confirmation(1));
        assert_eq!(t.committed(1, Some(4), 0, later()).ok, vec!["r1"]);
        assert_eq!(t.durable(2).ok, vec!["d2"]);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn replicated_updates_wait_for_distinct_peers() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Replicated, 1, "r");
        t.wait(AckLevel::Durable, 1, "d");
        let r = t.committed(1, Some(7), 2, later());
        assert_eq!(r.ok, vec!["d"]);
        let (p, q) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert!(t.acked(p, 6).is_empty(), "another delta");
        assert!(t.acked(p, 7).is_empty());
        assert!(t.acked(p, 7).is_empty(), "the same peer twice counts once");
        assert_eq!(t.acked(q, 7).ok, vec!["r"]);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn replicated_without_peers_needed_is_answered_when_durable() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Replicated, 3, "r");
        assert_eq!(t.committed(3, Some(1), 0, later()).ok, vec!["r"]);
    }

    #[test]
    fn failures_say_how_far_the_update_got() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Durable, 1, "d1");
        t.wait(AckLevel::Durable, 2, "d2");
        let r = t.commit_failed(1, "disk full");
        assert_eq!(
            r.failed,
            vec![("d1", AckFailure::NotDurable("disk full".into()))]
        );
        t.wait(AckLevel::Replicated, 2, "r");
        let now = Instant::now();
        assert_eq!(t.committed(2, Some(5), 1, now).ok, vec!["d2"]);
        t.acked(Uuid::from_u128(9), 4);
        let r = t.expire(now);
        assert_eq!(
            r.failed,
            vec![(
                "r",
                AckFailure::NotReplicated {
                    acked: 0,
                    needed: 1
                }
            )]
        );
    }

    #[test]
    fn stopping_answers_everything() {
        let mut t = AckTracker::default();
        t.wait(AckLevel::Durable, 1, "d");
        t.wait(AckLevel::Replicated, 1, "r");
        let r = t.stop(Some(1));
        assert_eq!(r.ok, vec!["d"]);
        assert_eq!(r.failed, vec![("r", AckFailure::Stopped)]);
    }

    #[test]
    fn majority_counts_this_replica() {
        assert_eq!(peers_needed(None, 0), 0);
        assert_eq!(peers_needed(None, 1), 0, "alone");
        assert_eq!(peers_needed(None, 2), 1);
        assert_eq!(peers_needed(None, 3), 1);
        assert_eq!(peers_needed(None, 5), 2);
        assert_eq!(peers_needed(Some(3), 1), 3);
    }

    #[test]
    fn the_majority_is_of_the_known_replicas_not_the_live_ones() {
        // Three ids held, no peer heard from (cut off): one peer still needed.
        assert_eq!(peers_needed(None, known_replicas(Some(3), 1, 0)), 1);
        // The registry not read yet: the most heard from at once count, and those heard now.
        assert_eq!(peers_needed(None, known_replicas(None, 3, 0)), 1);
        assert_eq!(peers_needed(None, known_replicas(None, 1, 2)), 1);
        assert_eq!(
            peers_needed(None, known_replicas(Some(1), 1, 0)),
            0,
            "alone"
        );
        // Peers that claimed their ids after the last look count once heard, even silent.
        assert_eq!(peers_needed(None, known_replicas(Some(1), 3, 0)), 1);
    }

    #[test]
    fn levels_parse_by_name() {
        assert_eq!("Durable".parse::<AckLevel>().unwrap(), AckLevel::Durable);
        assert!("all".parse::<AckLevel>().is_err());
        for level in AckLevel::ALL {
            assert_eq!(level.name().parse::<AckLevel>().unwrap(), level);
            let json = serde_json::to_string(&level).unwrap();
            assert_eq!(json, format!("\"{}\"", level.name()));
        }
        assert_eq!(" logged ".parse::<AckLevel>().unwrap(), AckLevel::Logged);
        assert!(AckLevel::Logged.answered_at_apply() && AckLevel::Logged.needs_log());
    }

    #[test]
    fn only_waiting_updates_make_a_commit_sync() {
        let mut t = AckTracker::default();
        assert!(
            !t.wants_sync(1),
            "nothing waits: the commit's append need not sync"
        );
        t.wait(AckLevel::Durable, 2, "d");
        assert!(!t.wants_sync(1));
        assert!(t.wants_sync(2));
        assert_eq!(t.committed(2, Some(3), 0, later()).ok, vec!["d"]);
        assert!(!t.wants_sync(3));
    }

    #[test]
    fn an_update_published_alone_waits_for_a_later_look_or_a_peer() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut t = AckTracker::default();
        t.wait(AckLevel::Replicated, 1, "a");
        t.wait(AckLevel::Replicated, 2, "b");
        assert!(t.committed_alone(1, 10, t0 + s, later()).is_empty());
        assert!(t.committed_alone(2, 11, t0 + 3 * s, later()).is_empty());
        assert_eq!(t.wants_look_since(), Some(t0 + s));
        assert_eq!(t.look_to_ask(), Some(t0 + s));
        assert_eq!(t.look_to_ask(), None, "one look asked at a time");
        t.look_ended();
        // A look that started before the publication says nothing of who claimed since.
        assert!(t.looked(t0, 0).is_empty());
        // One that started after it, still alone: answered; the later one waits on.
        assert_eq!(t.looked(t0 + 2 * s, 0).ok, vec!["a"]);
        assert_eq!(t.wants_look_since(), Some(t0 + 3 * s));
        // A peer's acknowledgement answers it without a look.
        assert_eq!(t.acked(Uuid::new_v4(), 11).ok, vec!["b"]);
        assert_eq!(t.wants_look_since(), None);
    }

    #[test]
    fn a_look_that_finds_peers_makes_an_update_published_alone_wait_for_them() {
        let t0 = Instant::now();
        let mut t = AckTracker::default();
        t.wait(AckLevel::Replicated, 1, "a");
        assert!(t.committed_alone(1, 10, t0, later()).is_empty());
        // Five replicas now: two peers needed.
        let (p, q) = (Uuid::new_v4(), Uuid::new_v4());
        assert!(t.looked(t0, 2).is_empty());
        assert!(t.acked(p, 10).is_empty());
        assert_eq!(t.acked(q, 10).ok, vec!["a"]);
        // And one not acknowledged in time fails as not replicated.
        t.wait(AckLevel::Replicated, 2, "b");
        let deadline = t0 + Duration::from_secs(5);
        assert!(t.committed_alone(2, 11, t0, deadline).is_empty());
        let r = t.expire(deadline);
        assert_eq!(
            r.failed,
            vec![(
                "b",
                AckFailure::NotReplicated {
                    acked: 0,
                    needed: 1
                }
            )]
        );
    }
}
