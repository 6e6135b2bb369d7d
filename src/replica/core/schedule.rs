//! When a replica wakes: its one periodic timer, which announces the digest every
//! anti-entropy interval (jittered, and spaced out while nobody listens or the cluster is
//! quiet, see [`crate::replica::ticks`]) and does the housekeeping (gauges, time passing,
//! snapshots due) every `metrics_interval_ms` while there is something to watch, or with the
//! digest while the replica is at rest. `now` is passed in: the shell reads the clock, a test
//! steps its own.
//!
//! The shell arms the timer for [`Schedule::plan`]'s deadline (on the process's grid), asks
//! [`Schedule::fired`] what to do when it fires, and arms it anew where a method answers
//! that the deadline moved earlier ([`Rearm`]).

use std::time::{Duration, Instant};

use crate::replica::ticks;

/// Whether the periodic timer, armed, must be armed anew: its deadline moved earlier.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rearm(pub bool);

/// The periodic timer to arm: due at `due`, on the grid of `grid_period`
/// ([`ticks::on_grid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Periodic {
    pub due: Instant,
    pub grid_period: Duration,
}

/// What the periodic timer's firing does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fired {
    /// Announce the digest (then tell [`Schedule::digest_sent`]).
    pub digest: bool,
    /// Do the housekeeping.
    pub housekeeping: bool,
}

/// A replica's digest spacing and housekeeping schedule.
#[derive(Debug)]
pub(crate) struct Schedule {
    /// `anti_entropy_interval_ms`.
    anti_entropy: Duration,
    /// `metrics_interval_ms`.
    metrics: Duration,
    /// The most a quiet replica stretches its interval ([`ticks::quiet_digest_max`]).
    quiet_max: u32,
    /// The digests' jitter.
    rng: fastrand::Rng,
    /// When the replica started.
    started: Instant,
    /// When the periodic timer last did the housekeeping.
    last_housekeeping: Instant,
    /// When the armed timer does the housekeeping.
    housekeeping_due: Instant,
    /// When the periodic timer announces the digest next.
    next_digest: Instant,
    /// Digests announced in a row with no live peer ([`ticks::lone_digest_factor`]).
    lone_digests: u32,
    /// Digests announced in a row with the state unchanged and equal to every live peer's
    /// ([`ticks::quiet_digest_factor`]).
    quiet_digests: u32,
    /// The state changed since the last digest was announced.
    changed_since_digest: bool,
    /// The periodic timer's deadline while it is armed, so that a peer appearing or a
    /// change can bring it forward.
    armed: Option<Instant>,
}

impl Schedule {
    /// The schedule of a replica started at `started`, with its intervals; `seed` seeds the
    /// jitter.
    pub(crate) fn new(
        anti_entropy: Duration,
        metrics: Duration,
        peer_expiry: Duration,
        started: Instant,
        seed: u64,
    ) -> Self {
        let quiet_max = ticks::quiet_digest_max(
            anti_entropy.as_millis() as u64,
            peer_expiry.as_millis() as u64,
        );
        Schedule {
            anti_entropy,
            metrics,
            quiet_max,
            rng: fastrand::Rng::with_seed(seed),
            started,
            last_housekeeping: started,
            housekeeping_due: started,
            next_digest: started,
            lone_digests: 0,
            quiet_digests: 0,
            changed_since_digest: false,
            armed: None,
        }
    }

    /// When the replica started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The actor runs: the first digest one (jittered) interval from `now`.
    pub(crate) fn start(&mut self, now: Instant) {
        self.next_digest = now + self.digest_delay();
    }

    /// The time to the next digest: the anti-entropy interval, jittered by a quarter either
    /// way so that replicas do not align.
    fn digest_delay(&mut self) -> Duration {
        self.anti_entropy.mul_f64(0.75 + 0.5 * self.rng.f64())
    }

    /// How often the housekeeping goes: every `metrics_interval_ms` while the replica is
    /// `busy` (something to watch, in flight or to snapshot); a replica at rest every
    /// anti-entropy interval (or `metrics_interval_ms` if longer), with its digest: of
    /// 100,000 filters most are quiet, and a wake-up each second for each cost a node more
    /// than its requests.
    fn housekeeping_delay(&self, busy: bool) -> Duration {
        match busy {
            true => self.metrics,
            false => self.anti_entropy.max(self.metrics),
        }
    }

    /// Arms the periodic timer (none is armed): the housekeeping and the digest at their
    /// times, both in one wake-up for a replica whose housekeeping is due every anti-entropy
    /// interval. The grid is that of the shorter of the two periods, so that the timers of
    /// many replicas fire together.
    pub(crate) fn plan(&mut self, busy: bool) -> Periodic {
        let housekeeping = self.housekeeping_delay(busy);
        // Folded into the digest only where its period is the digest's: with a longer
        // `metrics_interval_ms` a quiet replica looks after itself that much less often.
        self.housekeeping_due = if housekeeping == self.anti_entropy {
            self.next_digest
        } else {
            self.last_housekeeping + housekeeping
        };
        let due = self.housekeeping_due.min(self.next_digest);
        self.armed = Some(due);
        Periodic {
            due,
            grid_period: housekeeping.min(self.anti_entropy),
        }
    }

    /// The periodic timer fired at `now` (the shell plans the next one after): what is due.
    pub(crate) fn fired(&mut self, now: Instant) -> Fired {
        self.armed = None;
        let housekeeping = now >= self.housekeeping_due;
        if housekeeping {
            self.last_housekeeping = now;
        }
        Fired {
            digest: now >= self.next_digest,
            housekeeping,
        }
    }

    /// The digest of a firing was announced at `now` with `spacing` intervals to the next
    /// ([`Schedule::announce`]), while `live_peers` were live: the next one's time, spaced
    /// out further while nobody listens.
    pub(crate) fn digest_sent(&mut self, now: Instant, spacing: u32, live_peers: usize) {
        self.lone_digests = match live_peers {
            0 => self.lone_digests.saturating_add(1),
            _ => 0,
        };
        let factor = ticks::lone_digest_factor(self.lone_digests).max(spacing);
        self.next_digest = now + self.digest_delay() * factor;
    }

    /// A digest is announced: `live` peers live, the replica `ready`, `converged` of them
    /// announcing its digest. The intervals until the next one (more than 1 while the
    /// cluster is quiet: nothing changed since the last digest and every live peer
    /// announced ours), which the digest tells its receivers.
    pub(crate) fn announce(&mut self, live: usize, ready: bool, converged: usize) -> u32 {
        let changed = std::mem::take(&mut self.changed_since_digest);
        let quiet = live > 0 && ready && !changed && converged == live;
        self.quiet_digests = match quiet {
            true => self.quiet_digests.saturating_add(1),
            false => 0,
        };
        ticks::quiet_digest_factor(self.quiet_digests, self.quiet_max)
    }

    /// The state changed.
    pub(crate) fn changed(&mut self) {
        self.changed_since_digest = true;
    }

    /// Whether the state changed since the last digest was announced.
    pub(crate) fn changed_since_digest(&self) -> bool {
        self.changed_since_digest
    }

    /// A peer's frame arrived at `now`, from a peer `known` before or not: a replica that
    /// spaced out its digests for want of a peer goes back to the interval, and so does a
    /// quiet one for a peer not heard before (one starting, or back, which does not know how
    /// far apart our digests are and would take us for gone).
    pub(crate) fn heard(&mut self, now: Instant, known: bool) -> Rearm {
        let mut rearm = false;
        if self.lone_digests > ticks::LONE_DIGESTS_AT_INTERVAL {
            rearm |= self.digest_at_interval(now).0;
        }
        if !known {
            rearm |= self.quiet_ended(now).0;
        }
        Rearm(rearm)
    }

    /// The state changed (a flush is being armed) at `now`: the quiet ends, and a lone
    /// replica's timer, armed for its spaced-out digest (its housekeeping goes with it), is
    /// brought forward to a busy replica's housekeeping, so that snapshots and gauges do not
    /// wait for the digest.
    pub(crate) fn busy_again(&mut self, now: Instant) -> Rearm {
        let ended = self.quiet_ended(now).0;
        if self.lone_digests <= ticks::LONE_DIGESTS_AT_INTERVAL {
            return Rearm(ended);
        }
        let soon = now + self.metrics;
        Rearm(ended || self.armed.is_some_and(|due| due > soon))
    }

    /// The state changed, or a peer announced another, while this replica spaced out its
    /// digests for a quiet cluster: back to the anti-entropy interval from `now`, so that a
    /// lost delta is found as soon as without the spacing.
    pub(crate) fn quiet_ended(&mut self, now: Instant) -> Rearm {
        match std::mem::take(&mut self.quiet_digests) > ticks::QUIET_DIGESTS_AT_INTERVAL {
            true => self.digest_at_interval(now),
            false => Rearm(false),
        }
    }

    /// A peer was heard while this replica spaced out its digests for want of one, or the
    /// quiet ended: back to the anti-entropy interval from `now`, so that the peer does not
    /// take it for gone.
    fn digest_at_interval(&mut self, now: Instant) -> Rearm {
        self.lone_digests = 0;
        let next = now + self.digest_delay();
        if next >= self.next_digest {
            return Rearm(false);
        }
        self.next_digest = next;
        Rearm(self.armed.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// At the defaults: digests every 5 s, housekeeping every second, peers expire after 60.
    fn schedule(t0: Instant) -> Schedule {
        let mut s = Schedule::new(5 * S, S, 60 * S, t0, 7);
        s.start(t0);
        s
    }

    fn within_jitter(from: Instant, at: Instant, intervals: u32) {
        let d = at - from;
        let base = 5 * S * intervals;
        assert!(
            d >= base.mul_f64(0.75) && d <= base.mul_f64(1.25),
            "{d:?} for {intervals} intervals"
        );
    }

    #[test]
    fn the_first_digest_is_one_jittered_interval_away_and_not_due_before() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        within_jitter(t0, s.next_digest, 1);
        // At rest: housekeeping goes with the digest, on the digest's grid.
        let p = s.plan(false);
        assert_eq!(p.due, s.next_digest);
        assert_eq!(p.grid_period, 5 * S);
        let early = s.fired(p.due - Duration::from_millis(1));
        assert_eq!(
            early,
            Fired {
                digest: false,
                housekeeping: false
            }
        );
        s.plan(false);
        assert_eq!(
            s.fired(p.due),
            Fired {
                digest: true,
                housekeeping: true
            }
        );
    }

    #[test]
    fn a_busy_replica_keeps_house_every_metrics_interval() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        let p = s.plan(true);
        assert_eq!(p.due, t0 + S, "housekeeping first");
        assert_eq!(p.grid_period, S);
        let f = s.fired(t0 + S);
        assert!(f.housekeeping && !f.digest);
        // The next one a metrics interval after the last.
        assert_eq!(s.plan(true).due, t0 + 2 * S);
    }

    #[test]
    fn a_lone_replica_spaces_its_digests_out_and_comes_back_when_a_peer_speaks() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        let mut now = t0;
        // Lone digests: the first ones at the interval, then 2, 4, 6 intervals apart.
        for factor in [1, 1, 1, 2, 4, 6, 6] {
            now = s.next_digest;
            s.plan(false);
            assert!(s.fired(now).digest);
            let spacing = s.announce(0, true, 0);
            assert_eq!(spacing, 1, "no peer: not quiet");
            s.digest_sent(now, spacing, 0);
            within_jitter(now, s.next_digest, factor);
        }
        // Armed for the spaced-out digest, a peer is heard: back to the interval, the timer
        // brought forward.
        s.plan(false);
        let far = s.next_digest;
        assert_eq!(s.heard(now, true), Rearm(true));
        assert!(s.next_digest < far);
        within_jitter(now, s.next_digest, 1);
        // And only once: the next frame changes nothing.
        assert_eq!(s.heard(now, true), Rearm(false));
    }

    #[test]
    fn a_quiet_cluster_spaces_digests_out_until_a_change_or_a_newcomer() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        // Converged with its one peer, nothing changing: 1, 1, 1, then 2 and 4 intervals.
        let spacings: Vec<u32> = (0..6).map(|_| s.announce(1, true, 1)).collect();
        assert_eq!(spacings, [1, 1, 1, 2, 4, 4]);
        // A change since the last digest: at the interval.
        s.changed();
        assert!(s.changed_since_digest());
        assert_eq!(s.announce(1, true, 1), 1);
        assert!(!s.changed_since_digest());
        // Not converged, or not ready: at the interval too.
        for _ in 0..6 {
            s.announce(1, true, 1);
        }
        assert_eq!(s.announce(1, true, 0), 1);
        for _ in 0..6 {
            s.announce(1, true, 1);
        }
        assert_eq!(s.announce(1, false, 1), 1);
        // Spaced out and armed: a peer not heard before brings the digest back.
        for _ in 0..6 {
            s.announce(1, true, 1);
        }
        let now = t0 + 20 * S;
        s.digest_sent(now, 4, 1);
        within_jitter(now, s.next_digest, 4);
        s.plan(false);
        assert_eq!(s.heard(now, false), Rearm(true));
        within_jitter(now, s.next_digest, 1);
        // A known peer's frame leaves a quiet replica's spacing alone.
        for _ in 0..6 {
            s.announce(1, true, 1);
        }
        s.digest_sent(now, 4, 1);
        assert_eq!(s.heard(now, true), Rearm(false));
    }

    #[test]
    fn a_change_brings_a_lone_replicas_housekeeping_forward() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        let mut now = t0;
        for _ in 0..6 {
            now = s.next_digest;
            s.digest_sent(now, 1, 0);
        }
        // At rest, armed for its spaced-out digest, 20-30 s away.
        assert!(s.plan(false).due > now + 10 * S);
        assert_eq!(s.busy_again(now), Rearm(true));
        // Re-planned busy: the housekeeping comes a metrics interval after the last.
        let p = s.plan(true);
        assert!(p.due <= now + S, "{:?}", p.due - now);
        // Already due soon: nothing to bring forward.
        assert_eq!(s.busy_again(now), Rearm(false));
    }

    #[test]
    fn nothing_is_rearmed_while_the_timer_runs() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        for _ in 0..6 {
            let now = s.next_digest;
            s.digest_sent(now, 1, 0);
        }
        s.plan(false);
        let now = s.next_digest - 15 * S;
        s.fired(now);
        // Within the timer's own run (it plans the next itself): no armed timer to move.
        assert_eq!(s.heard(now, true), Rearm(false));
        assert_eq!(s.lone_digests, 0, "back to the interval all the same");
    }
}
