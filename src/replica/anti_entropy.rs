//! Anti-entropy and readiness as a pure state machine: events in (a peer's message heard, a
//! digest announced, a state merged, time passing), actions out (ask for states, push ours,
//! become ready, forget a peer). No I/O and no clock of its own: every event carries `now`, so
//! the protocol is unit-tested here, step by step, and the actor only carries actions out.
//!
//! The protocol (docs/DESIGN.md section 3): replicas announce a digest of their state every
//! anti-entropy interval. An equal digest from a ready peer makes a starting replica ready; a
//! digest that keeps differing (three in a row, or one from a peer that is not ready) calls for
//! a push of our full state. A gap in a peer's sequence numbers means its messages were lost:
//! ask it for its state. A replica that hears no peer within the catch-up timeout is alone and
//! ready; one that hears peers but merges no state keeps asking, up to ten timeouts.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::ReplicaId;
use crate::replica::ticks::QUIET_DIGEST_MAX_FACTOR;

/// Sequence gaps one message can count: a forged `seq = u64::MAX` counts this many, no more.
pub(crate) const MAX_COUNTED_GAP: u64 = 1 << 20;

/// Consecutive differing digests of a ready peer before we push our state: fewer would push
/// for every update still in flight.
const MISMATCH_LIMIT: u32 = 3;

/// Catch-up timeouts after which a replica that hears peers but merged no state is ready anyway.
const CATCH_UP_ROUNDS: u32 = 10;

/// The protocol's timing and bounds (from [`super::ReplicaConfig`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// A peer heard within this is live (three anti-entropy intervals).
    pub live: Duration,
    /// A peer silent this long is forgotten.
    pub peer_expiry: Duration,
    /// At most one state request per peer per this (the minimum push interval).
    pub min_request_interval: Duration,
    /// Without a peer's state by then, a replica alone is ready.
    pub catch_up_timeout: Duration,
    /// Peers tracked at most.
    pub max_peers: usize,
}

/// What the actor must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Ask one peer (or every peer) for its full state.
    RequestState(Option<Uuid>),
    /// Push our full state (rate-limited by the actor).
    PushState,
    /// Become ready (once), for this reason.
    BecomeReady(&'static str),
    /// Count this many messages lost (sequence gaps).
    CountGaps(u64),
    /// Drop what is kept for this peer elsewhere (its partial state transfers).
    Forget(Uuid),
}

/// A message was refused because the peer table is full of live peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerTableFull;

/// What is known of one peer.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// Its replica id (may change when it restarts).
    pub replica: ReplicaId,
    pub last_seen: Instant,
    /// The number of its last sequenced message; none before the first.
    last_seq: Option<u64>,
    /// What its last two batched digests said it had sent, older first (see
    /// [`AntiEntropy::claimed`]).
    claims: [Option<u64>; 2],
    /// The state digest it last announced.
    pub digest: Option<u64>,
    /// Anti-entropy intervals to its next digest, as its last one said (a quiet peer spaces
    /// them out): it stays live that many times longer.
    spacing: u32,
    /// Consecutive digests that differed from ours.
    mismatches: u32,
    last_request: Option<Instant>,
}

/// Asks `peer` for its state after a loss rather than wait for the next round, once per
/// `min` interval.
fn ask_for_state(peer: &mut Peer, sender: Uuid, now: Instant, min: Duration) -> Option<Action> {
    if peer
        .last_request
        .is_none_or(|t| now.saturating_duration_since(t) >= min)
    {
        peer.last_request = Some(now);
        return Some(Action::RequestState(Some(sender)));
    }
    None
}

/// The state machine. See the module documentation.
#[derive(Debug)]
pub(crate) struct AntiEntropy {
    timing: Timing,
    peers: HashMap<Uuid, Peer>,
    started: Instant,
    ready: bool,
    last_catch_up_request: Option<Instant>,
    /// When our full state last went out.
    last_push: Option<Instant>,
}

impl AntiEntropy {
    pub(crate) fn new(timing: Timing, started: Instant) -> Self {
        AntiEntropy {
            timing,
            peers: HashMap::new(),
            started,
            ready: false,
            last_catch_up_request: None,
            last_push: None,
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready
    }

    /// A replication message of `sender` (as replica `replica`) numbered `seq` (0: outside
    /// the sequence, such as a digest that went in a node's batch): tracks the peer and looks
    /// for lost messages. Refused when the table is full of live peers, so that forged
    /// senders cannot push real peers out.
    pub(crate) fn heard(
        &mut self,
        sender: Uuid,
        replica: ReplicaId,
        seq: u64,
        now: Instant,
    ) -> Result<Vec<Action>, PeerTableFull> {
        let mut actions = Vec::new();
        if !self.peers.contains_key(&sender) {
            match self.make_room(now) {
                Some(Some(evicted)) => actions.push(Action::Forget(evicted)),
                Some(None) => {}
                None => return Err(PeerTableFull),
            }
        }
        let peer = self.peers.entry(sender).or_insert(Peer {
            replica,
            last_seen: now,
            last_seq: None,
            claims: [None; 2],
            digest: None,
            spacing: 1,
            mismatches: 0,
            last_request: None,
        });
        peer.replica = replica;
        peer.last_seen = now;
        if seq == 0 {
            // It came another way than the numbered ones (a batch), and maybe after later
            // ones: it says nothing of the count.
            return Ok(actions);
        }
        // One publisher's messages arrive in order on one subscription, so a jump means lost
        // messages, and a step back, or a jump past what a loss can count, means the peer
        // restarted (its count starts over, from 1 in earlier versions, from its clock now:
        // `frame_numbers_origin`).
        let restarted = peer
            .last_seq
            .is_some_and(|last| seq <= last || seq - last > MAX_COUNTED_GAP);
        let gap = match peer.last_seq {
            Some(last) if !restarted => seq - last - 1,
            _ => 0,
        };
        if restarted {
            // Restarted: what it claimed before counts no more.
            peer.claims = [None; 2];
        }
        peer.last_seq = Some(seq);
        if gap > 0 {
            actions.push(Action::CountGaps(gap));
            actions.extend(ask_for_state(
                peer,
                sender,
                now,
                self.timing.min_request_interval,
            ));
        }
        Ok(actions)
    }

    /// A batched digest of `sender` (already [`heard`](Self::heard)) said it had sent up to
    /// `sent`. Batches go another way than the numbered messages, so this claim is checked
    /// two digests later, two anti-entropy intervals on: numbers up to it not heard by then
    /// were lost (the gap a next numbered message would have shown, had there been one).
    /// Two, not one: a node busy routing (a restart's catch-up of many filters) may lag
    /// behind by seconds, and every filter would then take its lag for losses and ask for
    /// states, which would add to it.
    pub(crate) fn claimed(&mut self, sender: Uuid, sent: u64, now: Instant) -> Vec<Action> {
        let min = self.timing.min_request_interval;
        let Some(peer) = self.peers.get_mut(&sender) else {
            return Vec::new();
        };
        let [older, newer] = peer.claims;
        peer.claims = [newer, Some(sent)];
        let Some(before) = older else {
            return Vec::new();
        };
        match peer.last_seq {
            // Nothing numbered heard since we started: count on from its claim.
            None => {
                peer.last_seq = Some(before);
                Vec::new()
            }
            // More than a message can count: forged or replayed, not a loss to chase.
            Some(last) if before > last && before - last > MAX_COUNTED_GAP => Vec::new(),
            Some(last) if before > last => {
                peer.last_seq = Some(before);
                let gap = (before - last).min(MAX_COUNTED_GAP);
                let mut actions = vec![Action::CountGaps(gap)];
                actions.extend(ask_for_state(peer, sender, now, min));
                actions
            }
            Some(_) => Vec::new(),
        }
    }

    /// `sender` (already [`heard`](Self::heard)) announced `digest`, and its next within
    /// `spacing` anti-entropy intervals (none: 1); ours is `mine`.
    pub(crate) fn digest(
        &mut self,
        sender: Uuid,
        digest: u64,
        peer_ready: bool,
        spacing: Option<u32>,
        mine: u64,
        now: Instant,
    ) -> Vec<Action> {
        let pushed_lately = self
            .last_push
            .is_some_and(|t| now.saturating_duration_since(t) < self.timing.catch_up_timeout);
        let Some(peer) = self.peers.get_mut(&sender) else {
            return Vec::new();
        };
        peer.digest = Some(digest);
        // Bounded: a peer may not make itself live for longer than the quietest spacing.
        peer.spacing = spacing.unwrap_or(1).clamp(1, QUIET_DIGEST_MAX_FACTOR);
        if digest == mine {
            peer.mismatches = 0;
            return if peer_ready {
                self.become_ready("a peer has the same state")
            } else {
                Vec::new()
            };
        }
        peer.mismatches += 1;
        // A mismatch that persists is not just updates in flight: a loss our sequence numbers
        // cannot see (from a replica that has left since, say). A peer that is not ready is
        // catching up: push at once, unless our state went out within a catch-up timeout:
        // that push is on its way to it (a joiner announces its digest as it asks for states,
        // and the state went out twice). If it was lost, the peer asks again after its
        // timeout. (Our own lost deltas show as gaps at the peer, which asks.)
        if peer.mismatches >= MISMATCH_LIMIT || (!peer_ready && !pushed_lately) {
            peer.mismatches = 0;
            vec![Action::PushState]
        } else {
            Vec::new()
        }
    }

    /// A peer's full state was merged.
    pub(crate) fn state_merged(&mut self) -> Vec<Action> {
        self.become_ready("merged a peer's state")
    }

    /// Our full state went out: it answers every mismatch seen so far.
    pub(crate) fn pushed(&mut self, now: Instant) {
        self.last_push = Some(now);
        for p in self.peers.values_mut() {
            p.mismatches = 0;
        }
    }

    /// Time passed: forgets peers silent for `peer_expiry`, and catches up (readiness without
    /// a peer's state).
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Action> {
        let expiry = self.timing.peer_expiry;
        let gone: Vec<Uuid> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last_seen) >= expiry)
            .map(|(u, _)| *u)
            .collect();
        let mut actions = Vec::new();
        for u in gone {
            self.peers.remove(&u);
            actions.push(Action::Forget(u));
        }
        actions.extend(self.catch_up(now));
        actions
    }

    fn catch_up(&mut self, now: Instant) -> Vec<Action> {
        if self.ready {
            return Vec::new();
        }
        let timeout = self.timing.catch_up_timeout;
        let waited = now.saturating_duration_since(self.started);
        if waited < timeout {
            return Vec::new();
        }
        if self.peers.is_empty() {
            self.become_ready("no peer heard within catch_up_timeout: alone")
        } else if waited >= timeout * CATCH_UP_ROUNDS {
            self.become_ready("peers heard but no state merged within 10 catch_up_timeouts")
        } else if self
            .last_catch_up_request
            .is_none_or(|t| now.saturating_duration_since(t) >= timeout)
        {
            self.last_catch_up_request = Some(now);
            vec![Action::RequestState(None)]
        } else {
            Vec::new()
        }
    }

    /// Ready at once, without catching up: there is nothing to catch up with (a filter
    /// incarnation created a moment ago).
    pub(crate) fn ready_now(&mut self, why: &'static str) -> Vec<Action> {
        self.become_ready(why)
    }

    fn become_ready(&mut self, why: &'static str) -> Vec<Action> {
        if std::mem::replace(&mut self.ready, true) {
            Vec::new()
        } else {
            vec![Action::BecomeReady(why)]
        }
    }

    /// Room for a new peer: `Some(None)` under the cap, `Some(Some(evicted))` after evicting
    /// the stalest peer if it is no longer live, `None` if every tracked peer is live.
    fn make_room(&mut self, now: Instant) -> Option<Option<Uuid>> {
        if self.peers.len() < self.timing.max_peers {
            return Some(None);
        }
        let stalest = self
            .peers
            .iter()
            .min_by_key(|(_, p)| p.last_seen)
            .filter(|(_, p)| !self.is_live(p, now))
            .map(|(u, _)| *u)?;
        self.peers.remove(&stalest);
        Some(Some(stalest))
    }

    fn is_live(&self, p: &Peer, now: Instant) -> bool {
        now.saturating_duration_since(p.last_seen) < self.timing.live * p.spacing
    }

    /// Whether `sender` is a live peer.
    pub(crate) fn is_live_sender(&self, sender: &Uuid, now: Instant) -> bool {
        self.peers.get(sender).is_some_and(|p| self.is_live(p, now))
    }

    /// Whether `sender` is in the peer table (heard, and not expired).
    pub(crate) fn knows(&self, sender: &Uuid) -> bool {
        self.peers.contains_key(sender)
    }

    /// Peers heard within [`Timing::live`].
    pub(crate) fn live_peers(&self, now: Instant) -> usize {
        self.peers.values().filter(|p| self.is_live(p, now)).count()
    }

    /// Whether some live peer announced a digest (only then is ours worth computing).
    pub(crate) fn has_live_digest(&self, now: Instant) -> bool {
        self.peers
            .values()
            .any(|p| self.is_live(p, now) && p.digest.is_some())
    }

    /// Live peers whose last announced digest is `mine`.
    pub(crate) fn converged_peers(&self, mine: u64, now: Instant) -> usize {
        self.peers
            .values()
            .filter(|p| self.is_live(p, now) && p.digest == Some(mine))
            .count()
    }

    /// Every tracked peer with its uuid, for staleness gauges and logs.
    pub(crate) fn peers(&self) -> impl Iterator<Item = (&Uuid, &Peer)> {
        self.peers.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn timing() -> Timing {
        Timing {
            live: 300 * MS,
            peer_expiry: 1000 * MS,
            min_request_interval: 50 * MS,
            catch_up_timeout: 100 * MS,
            max_peers: 3,
        }
    }

    fn machine() -> (AntiEntropy, Instant) {
        let t0 = Instant::now();
        (AntiEntropy::new(timing(), t0), t0)
    }

    fn uuid(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn messages_in_sequence_count_no_gap() {
        let (mut ae, t0) = machine();
        for seq in 1..=5 {
            assert_eq!(ae.heard(uuid(1), 1, seq, t0), Ok(vec![]));
        }
        // The first message of a peer is never a gap, whatever its number.
        assert_eq!(ae.heard(uuid(2), 2, 1000, t0), Ok(vec![]));
    }

    #[test]
    fn a_gap_is_counted_and_the_peer_asked_for_its_state_once_per_interval() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        assert_eq!(
            ae.heard(uuid(1), 1, 5, t0),
            Ok(vec![
                Action::CountGaps(3),
                Action::RequestState(Some(uuid(1)))
            ])
        );
        // Another gap within the request interval: counted, not asked again.
        assert_eq!(
            ae.heard(uuid(1), 1, 7, t0 + 10 * MS),
            Ok(vec![Action::CountGaps(1)])
        );
        assert_eq!(
            ae.heard(uuid(1), 1, 9, t0 + 60 * MS),
            Ok(vec![
                Action::CountGaps(1),
                Action::RequestState(Some(uuid(1)))
            ])
        );
    }

    #[test]
    fn unsequenced_messages_move_no_count_and_make_no_gap() {
        let (mut ae, t0) = machine();
        // Heard first outside the sequence: its first numbered message is no gap.
        assert_eq!(ae.heard(uuid(1), 1, 0, t0), Ok(vec![]));
        assert_eq!(ae.heard(uuid(1), 1, 40, t0), Ok(vec![]));
        // A batched digest that overtook or trailed numbered ones changes nothing...
        assert_eq!(ae.heard(uuid(1), 1, 0, t0), Ok(vec![]));
        assert_eq!(ae.heard(uuid(1), 1, 41, t0), Ok(vec![]));
        // ...and a real gap is still one.
        assert_eq!(
            ae.heard(uuid(1), 1, 43, t0),
            Ok(vec![
                Action::CountGaps(1),
                Action::RequestState(Some(uuid(1)))
            ])
        );
        // It keeps the peer alive.
        assert_eq!(ae.live_peers(t0 + 10 * MS), 1);
    }

    #[test]
    fn a_batched_claim_not_met_two_digests_later_is_a_loss() {
        let (mut ae, t0) = machine();
        let p = uuid(1);
        ae.heard(p, 1, 3, t0).unwrap();
        // It says it sent up to 5; 4 and 5 come after the batch: no loss.
        ae.heard(p, 1, 0, t0).unwrap();
        assert_eq!(ae.claimed(p, 5, t0), vec![]);
        ae.heard(p, 1, 4, t0).unwrap();
        ae.heard(p, 1, 0, t0 + 300 * MS).unwrap();
        assert_eq!(ae.claimed(p, 7, t0 + 300 * MS), vec![]);
        // 5 comes late (a receiving node lagging behind), but before the claim is checked.
        ae.heard(p, 1, 5, t0 + 550 * MS).unwrap();
        assert_eq!(
            ae.claimed(p, 7, t0 + 600 * MS),
            vec![],
            "5 was claimed, and came"
        );
        // 6 and 7 never come: the claim two digests after shows it.
        assert_eq!(
            ae.claimed(p, 7, t0 + 900 * MS),
            vec![Action::CountGaps(2), Action::RequestState(Some(p))]
        );
        // Counted once: the next numbered message follows on.
        assert_eq!(ae.heard(p, 1, 8, t0 + 950 * MS), Ok(vec![]));
        assert_eq!(ae.claimed(p, 8, t0 + 1200 * MS), vec![]);
    }

    #[test]
    fn a_claim_beyond_what_a_message_can_count_is_no_loss() {
        let (mut ae, t0) = machine();
        let p = uuid(1);
        ae.heard(p, 1, 3, t0).unwrap();
        assert_eq!(ae.claimed(p, u64::MAX, t0), vec![]);
        assert_eq!(ae.claimed(p, 3, t0 + 300 * MS), vec![]);
        assert_eq!(
            ae.claimed(p, 3, t0 + 600 * MS),
            vec![],
            "forged or replayed"
        );
        assert_eq!(
            ae.heard(p, 1, 4, t0 + 400 * MS),
            Ok(vec![]),
            "the count goes on"
        );
    }

    #[test]
    fn a_claim_of_a_peer_never_heard_numbered_or_restarted_is_a_baseline() {
        let (mut ae, t0) = machine();
        let p = uuid(1);
        ae.heard(p, 1, 0, t0).unwrap();
        assert_eq!(ae.claimed(p, 500, t0), vec![]);
        assert_eq!(ae.claimed(p, 500, t0 + 300 * MS), vec![]);
        assert_eq!(ae.claimed(p, 500, t0 + 600 * MS), vec![]);
        assert_eq!(ae.heard(p, 1, 501, t0 + 700 * MS), Ok(vec![]));
        // It restarts and counts from 1: its old claims are no loss.
        ae.claimed(p, 501, t0 + 800 * MS);
        assert_eq!(ae.heard(p, 1, 1, t0 + 900 * MS), Ok(vec![]));
        for i in 1..=3 {
            assert_eq!(ae.claimed(p, 1, t0 + (900 + 300 * i) * MS), vec![]);
        }
    }

    #[test]
    fn a_restarted_peer_counting_from_one_again_is_no_gap() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 500, t0).unwrap();
        assert_eq!(ae.heard(uuid(1), 4, 1, t0), Ok(vec![]));
        assert_eq!(ae.heard(uuid(1), 4, 2, t0), Ok(vec![]));
        assert_eq!(
            ae.peers().next().unwrap().1.replica,
            4,
            "its new id is kept"
        );
    }

    #[test]
    fn a_forged_sequence_number_counts_no_gap() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        let a = ae.heard(uuid(1), 1, u64::MAX, t0).unwrap();
        assert_eq!(a, vec![], "past what a loss can count: a restart");
        // And nothing wraps after it.
        let a = ae.heard(uuid(1), 1, u64::MAX, t0 + 100 * MS).unwrap();
        assert_eq!(a, vec![]);
        let a = ae.heard(uuid(1), 1, 2, t0 + 200 * MS).unwrap();
        assert_eq!(a, vec![], "a step back is a restart, not a gap");
        // Within what a loss can count, a jump is one.
        let a = ae
            .heard(uuid(1), 1, 2 + MAX_COUNTED_GAP, t0 + 300 * MS)
            .unwrap();
        assert_eq!(a[0], Action::CountGaps(MAX_COUNTED_GAP - 1));
    }

    #[test]
    fn a_restarted_peer_numbering_from_its_clock_is_no_gap() {
        let (mut ae, t0) = machine();
        let life = crate::replica::core::frame_numbers_origin(Duration::from_secs(1_800_000_000));
        ae.heard(uuid(1), 1, life + 1, t0).unwrap();
        ae.heard(uuid(1), 1, life + 2, t0).unwrap();
        // Restarted two seconds later: numbered from its clock again.
        let next = crate::replica::core::frame_numbers_origin(Duration::from_secs(1_800_000_002));
        assert_eq!(ae.heard(uuid(1), 1, next + 1, t0 + 100 * MS), Ok(vec![]));
        assert_eq!(ae.heard(uuid(1), 1, next + 2, t0 + 100 * MS), Ok(vec![]));
        // A loss within the new life still counts.
        let a = ae.heard(uuid(1), 1, next + 5, t0 + 200 * MS).unwrap();
        assert_eq!(a[0], Action::CountGaps(2));
    }

    #[test]
    fn an_equal_digest_from_a_ready_peer_makes_us_ready_once() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        assert_eq!(
            ae.digest(uuid(1), 7, false, None, 7, t0),
            vec![],
            "peer not ready"
        );
        assert!(!ae.is_ready());
        assert_eq!(
            ae.digest(uuid(1), 7, true, None, 7, t0),
            vec![Action::BecomeReady("a peer has the same state")]
        );
        assert!(ae.is_ready());
        assert_eq!(
            ae.digest(uuid(1), 7, true, None, 7, t0),
            vec![],
            "only once"
        );
    }

    #[test]
    fn a_digest_of_an_unknown_sender_changes_nothing() {
        let (mut ae, t0) = machine();
        assert_eq!(ae.digest(uuid(9), 7, true, None, 7, t0), vec![]);
        assert!(!ae.is_ready());
    }

    #[test]
    fn a_persistent_mismatch_pushes_our_state_and_a_transient_one_does_not() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        assert_eq!(ae.digest(uuid(1), 1, true, None, 2, t0), vec![]);
        assert_eq!(ae.digest(uuid(1), 1, true, None, 2, t0), vec![]);
        assert_eq!(
            ae.digest(uuid(1), 1, true, None, 2, t0),
            vec![Action::PushState]
        );
        // The count starts over after a push.
        assert_eq!(ae.digest(uuid(1), 1, true, None, 2, t0), vec![]);
        // An equal digest in between resets it.
        assert_eq!(ae.digest(uuid(1), 2, true, None, 2, t0).len(), 1, "ready");
        assert_eq!(ae.digest(uuid(1), 1, true, None, 2, t0), vec![]);
        assert_eq!(ae.digest(uuid(1), 1, true, None, 2, t0), vec![]);
        ae.pushed(t0);
        assert_eq!(
            ae.digest(uuid(1), 1, true, None, 2, t0),
            vec![],
            "a push resets it too"
        );
    }

    #[test]
    fn a_mismatch_with_a_peer_that_is_catching_up_pushes_at_once() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        assert_eq!(
            ae.digest(uuid(1), 1, false, None, 2, t0),
            vec![Action::PushState]
        );
    }

    #[test]
    fn a_peer_catching_up_is_not_sent_our_state_twice_within_a_catch_up_timeout() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        // It asked for our state (pushed), and its digest, sent as it asked, comes after.
        ae.pushed(t0);
        assert_eq!(ae.digest(uuid(1), 1, false, None, 2, t0 + 10 * MS), vec![]);
        assert_eq!(ae.digest(uuid(1), 1, false, None, 2, t0 + 99 * MS), vec![]);
        // Still not ready a catch-up timeout later: that push was lost.
        assert_eq!(
            ae.digest(uuid(1), 1, false, None, 2, t0 + 100 * MS),
            vec![Action::PushState]
        );
    }

    #[test]
    fn a_merged_state_makes_us_ready() {
        let (mut ae, _) = machine();
        assert_eq!(
            ae.state_merged(),
            vec![Action::BecomeReady("merged a peer's state")]
        );
        assert_eq!(ae.state_merged(), vec![]);
    }

    #[test]
    fn alone_a_replica_is_ready_after_the_catch_up_timeout() {
        let (mut ae, t0) = machine();
        assert_eq!(ae.tick(t0 + 99 * MS), vec![]);
        assert_eq!(
            ae.tick(t0 + 100 * MS),
            vec![Action::BecomeReady(
                "no peer heard within catch_up_timeout: alone"
            )]
        );
        assert_eq!(ae.tick(t0 + 200 * MS), vec![]);
    }

    #[test]
    fn hearing_peers_without_their_state_asks_every_timeout_then_gives_up_waiting() {
        let (mut ae, t0) = machine();
        let mut t = t0;
        let mut requests = 0;
        let mut ready_at = None;
        while ready_at.is_none() {
            t += 10 * MS;
            // The peer stays live: it keeps talking.
            ae.heard(uuid(1), 1, 1, t).unwrap();
            for a in ae.tick(t) {
                match a {
                    Action::RequestState(None) => requests += 1,
                    Action::BecomeReady(_) => ready_at = Some(t),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert_eq!(ready_at, Some(t0 + 1000 * MS), "ten catch-up timeouts");
        assert_eq!(
            requests, 9,
            "one request per timeout from the first timeout on"
        );
    }

    #[test]
    fn silent_peers_expire_and_are_forgotten() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        ae.heard(uuid(2), 2, 1, t0 + 500 * MS).unwrap();
        assert_eq!(ae.live_peers(t0 + 500 * MS), 1);
        let a = ae.tick(t0 + 1000 * MS);
        assert!(a.contains(&Action::Forget(uuid(1))));
        assert!(!a.contains(&Action::Forget(uuid(2))));
        assert_eq!(ae.peers().count(), 1);
    }

    #[test]
    fn the_peer_table_evicts_only_peers_that_are_no_longer_live() {
        let (mut ae, t0) = machine();
        for n in 1..=3 {
            ae.heard(uuid(n), n as u16, 1, t0 + (n as u32) * MS)
                .unwrap();
        }
        // Full of live peers: a newcomer (a forged sender, say) is refused.
        assert_eq!(ae.heard(uuid(4), 4, 1, t0 + 10 * MS), Err(PeerTableFull));
        // Known peers still get through.
        assert!(ae.heard(uuid(2), 2, 2, t0 + 10 * MS).is_ok());
        // Once peer 1 is no longer live, the newcomer takes its place.
        let a = ae.heard(uuid(4), 4, 1, t0 + 302 * MS).unwrap();
        assert_eq!(a, vec![Action::Forget(uuid(1))]);
        assert_eq!(ae.peers().count(), 3);
    }

    #[test]
    fn converged_peers_are_the_live_ones_announcing_our_digest() {
        let (mut ae, t0) = machine();
        for n in 1..=3 {
            ae.heard(uuid(n), n as u16, 1, t0).unwrap();
        }
        assert!(!ae.has_live_digest(t0));
        ae.digest(uuid(1), 7, true, None, 7, t0);
        ae.digest(uuid(2), 7, true, None, 7, t0);
        ae.digest(uuid(3), 8, true, None, 7, t0);
        assert!(ae.has_live_digest(t0));
        assert_eq!(ae.converged_peers(7, t0), 2);
        // Peer 2 falls silent: no longer counted.
        ae.heard(uuid(1), 1, 2, t0 + 200 * MS).unwrap();
        assert_eq!(ae.converged_peers(7, t0 + 350 * MS), 1);
        assert_eq!(ae.live_peers(t0 + 350 * MS), 1);
    }

    #[test]
    fn a_peer_that_spaces_its_digests_out_stays_live_until_its_next_is_late() {
        let (mut ae, t0) = machine();
        ae.heard(uuid(1), 1, 1, t0).unwrap();
        ae.heard(uuid(2), 2, 1, t0).unwrap();
        ae.digest(uuid(1), 7, true, Some(4), 7, t0);
        // A forged spacing counts as the quietest one, no more.
        ae.digest(uuid(2), 7, true, Some(u32::MAX), 7, t0);
        // Live for 4 x 300 ms, instead of 300.
        assert_eq!(ae.live_peers(t0 + 1_199 * MS), 2);
        assert_eq!(ae.converged_peers(7, t0 + 1_199 * MS), 2);
        assert_eq!(ae.live_peers(t0 + 1_200 * MS), 0);
        // Its next digest, at the interval again, says nothing: back to 300 ms.
        ae.heard(uuid(1), 1, 2, t0 + 1_000 * MS).unwrap();
        ae.digest(uuid(1), 7, true, None, 7, t0 + 1_000 * MS);
        assert_eq!(ae.live_peers(t0 + 1_299 * MS), 1);
        assert_eq!(ae.live_peers(t0 + 1_300 * MS), 0);
    }
}
