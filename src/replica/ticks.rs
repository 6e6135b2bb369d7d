//! Periodic work of many replicas on one shared grid of instants.
//!
//! A node of 10,000 quiet filters ran 4,000 timers a second (each replica's digest and
//! housekeeping, jittered so that replicas do not align), and nearly all of its idle CPU went
//! to the wake-ups and the one small socket write each: the thread parked and woke for every
//! timer, and the NATS connection wrote every digest on its own (`perf` of the idle node: 38%
//! in context switches, 20% in `writev`, 21% in `epoll_wait`). Rounding each deadline up to a
//! grid of a twentieth of its period keeps the jitter between replicas (a digest's, a quarter
//! of the period either way, spans ten slots) but fires the timers of one slot in one
//! wake-up, and their messages leave in one write.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Digests a replica that hears no peer announces at the anti-entropy interval before it
/// spaces them out ([`lone_digest_factor`]): peers starting together find each other at the
/// interval.
pub(crate) const LONE_DIGESTS_AT_INTERVAL: u32 = 3;

/// The most a lone replica's digest interval is stretched: 30 s on average at the default
/// 5 s (the jitter of a quarter either way is stretched with it).
pub(crate) const LONE_DIGEST_MAX_FACTOR: u32 = 6;

/// How many anti-entropy intervals a replica waits before its next digest when the last
/// `lone` digests in a row found no live peer: 1 for the first
/// [`LONE_DIGESTS_AT_INTERVAL`], then 2, 4, and [`LONE_DIGEST_MAX_FACTOR`] from then on.
/// Nobody hears a lone replica's digests (a peer that starts asks for states and announces
/// itself, and the replica then goes back to the interval at once), and of a node's 100,000
/// filters without peers each announced 0.2 digests a second, a quarter of a core between
/// the node and nats-server.
pub(crate) fn lone_digest_factor(lone: u32) -> u32 {
    spaced_out(lone, LONE_DIGESTS_AT_INTERVAL, LONE_DIGEST_MAX_FACTOR)
}

/// Digests a replica announces at the interval while it and every live peer announce the
/// same state, unchanged, before it spaces them out ([`quiet_digest_factor`]).
pub(crate) const QUIET_DIGESTS_AT_INTERVAL: u32 = 3;

/// The most a quiet replica's digest interval is stretched: 20 s on average at the default
/// 5 s. Its digests say so (`Body::Digest::spacing`), and its peers count it live that many
/// times longer (three stretched intervals, where it is three intervals otherwise); they
/// forget it after `peer_expiry_ms` (60 s) without a word, so [`quiet_digest_max`] keeps two
/// stretched intervals within that: a peer may miss one digest and still hear the next.
pub(crate) const QUIET_DIGEST_MAX_FACTOR: u32 = 4;

/// How many anti-entropy intervals a replica waits before its next digest when its last
/// `quiet` digests in a row found its state unchanged and equal to every live peer's: 1 for
/// the first [`QUIET_DIGESTS_AT_INTERVAL`], then 2, and then `max` (at most
/// [`QUIET_DIGEST_MAX_FACTOR`], less where `peer_expiry_ms` is shorter; see
/// [`quiet_digest_max`]). A converged, quiet cluster has nothing to repair: of a node's
/// 10,000 filters with two peers each, every replica woke for 0.6 digests a second, 3-5% of a
/// core for the node. A change anywhere brings the digests back to the interval at once
/// (on the replica that changed, on those that merge it, and on any that hears a digest
/// unlike its own), so a lost delta is found as soon as before. The price: a quiet peer
/// that dies is taken for live up to four times longer (60 s instead of 15 at the
/// defaults).
pub(crate) fn quiet_digest_factor(quiet: u32, max: u32) -> u32 {
    spaced_out(quiet, QUIET_DIGESTS_AT_INTERVAL, max)
}

/// The most a quiet replica stretches its digest interval given how long its peers wait
/// for it: twice the stretched interval, jitter included, within `peer_expiry_ms`.
pub(crate) fn quiet_digest_max(anti_entropy_interval_ms: u64, peer_expiry_ms: u64) -> u32 {
    let room = peer_expiry_ms * 2 / (5 * anti_entropy_interval_ms.max(1));
    u32::try_from(room)
        .unwrap_or(u32::MAX)
        .clamp(1, QUIET_DIGEST_MAX_FACTOR)
}

/// 1 for the first `at_interval` digests in a row, then doubling up to `max`.
fn spaced_out(in_a_row: u32, at_interval: u32, max: u32) -> u32 {
    match in_a_row.saturating_sub(at_interval) {
        0 => 1,
        n => (1u32 << n.min(8)).min(max),
    }
}

/// Slots per period: the jitter left between replicas.
const SLOTS_PER_PERIOD: u32 = 20;

/// The coarsest grid: a deadline moves later by less than this.
const MAX_GRID: Duration = Duration::from_millis(250);

/// The origin of the grid, shared by every replica of the process.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The grid for work that recurs every `period`: a twentieth of it, at most 250 ms, and a
/// millisecond (the timers' resolution) at least.
pub(crate) fn grid(period: Duration) -> Duration {
    (period / SLOTS_PER_PERIOD).clamp(Duration::from_millis(1), MAX_GRID)
}

/// `delay`, lengthened so that it ends on the process's grid for `period` (see [`grid`]).
pub(crate) fn on_grid(delay: Duration, period: Duration) -> Duration {
    let now = epoch().elapsed();
    round_up(now, delay, grid(period)) - now
}

/// The first multiple of `grid` at or after `now + delay` (all measured from the epoch).
fn round_up(now: Duration, delay: Duration, grid: Duration) -> Duration {
    let due = (now + delay).as_nanos();
    let grid = grid.as_nanos().max(1);
    let slots = due.div_ceil(grid);
    Duration::from_nanos(u64::try_from(slots * grid).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_replica_spaces_its_digests_out_up_to_a_bound() {
        let factors: Vec<u32> = (0..9).map(lone_digest_factor).collect();
        assert_eq!(factors, [1, 1, 1, 1, 2, 4, 6, 6, 6]);
        assert_eq!(lone_digest_factor(u32::MAX), LONE_DIGEST_MAX_FACTOR);
    }

    #[test]
    fn a_quiet_replica_spaces_its_digests_out_within_its_peers_patience() {
        let max = quiet_digest_max(5_000, 60_000);
        assert_eq!(max, QUIET_DIGEST_MAX_FACTOR);
        let factors: Vec<u32> = (0..8).map(|q| quiet_digest_factor(q, max)).collect();
        assert_eq!(factors, [1, 1, 1, 1, 2, 4, 4, 4]);
        // Two stretched intervals with their jitter (x 1.25) stay within the expiry.
        for (interval, expiry) in [
            (5_000u64, 60_000u64),
            (300, 5_000),
            (5_000, 30_000),
            (20, 100),
        ] {
            let max = u64::from(quiet_digest_max(interval, expiry));
            assert!(
                max == 1 || 2 * interval * max * 5 / 4 <= expiry,
                "{interval} {expiry}"
            );
        }
        assert_eq!(
            quiet_digest_max(5_000, 10_000),
            1,
            "no room: at the interval"
        );
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn deadlines_round_up_to_the_grid_and_never_come_early() {
        let grid = 250 * MS;
        // 1.1 s + 3.9 s = 5.0 s: already on the grid.
        assert_eq!(round_up(1100 * MS, 3900 * MS, grid), 5000 * MS);
        // 5.001 s -> 5.25 s.
        assert_eq!(round_up(1100 * MS, 3901 * MS, grid), 5250 * MS);
        // Two replicas whose jittered deadlines fall in one slot fire together.
        assert_eq!(
            round_up(10 * MS, 4_800 * MS, grid),
            round_up(200 * MS, 4_700 * MS, grid)
        );
    }

    #[test]
    fn the_grid_is_a_twentieth_of_the_period_within_bounds() {
        assert_eq!(grid(5000 * MS), 250 * MS);
        assert_eq!(grid(60_000 * MS), 250 * MS);
        assert_eq!(grid(1000 * MS), 50 * MS);
        assert_eq!(grid(10 * MS), MS);
        assert_eq!(grid(Duration::ZERO), MS);
    }

    #[test]
    fn a_delay_on_the_grid_is_at_least_the_delay_asked_and_less_than_a_grid_more() {
        for ms in [0, 1, 7, 300, 999, 3750, 6250] {
            let delay = ms * MS;
            let period = 5000 * MS;
            let got = on_grid(delay, period);
            assert!(got >= delay, "{got:?} < {delay:?}");
            // The clock moves between this test's call and the read inside `on_grid`.
            assert!(got < delay + grid(period) + MS, "{got:?} for {delay:?}");
        }
    }
}
