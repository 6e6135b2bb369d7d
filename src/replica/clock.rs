//! The time a replica passes to the kinds whose elements expire (`expiring_bloom`), kept
//! from splitting the cluster when its wall clock runs ahead of its peers' (issue 47).
//!
//! An expiring state's clock only grows: one advanced by a clock that jumped ahead drops every
//! live epoch, and the peers refuse its frames (`clock_ahead`) for good, since it never comes
//! back. So the replica bounds its own time by its peers': it estimates their clock from the
//! newest epoch they sent (on the monotonic clock since, so that a step of its own wall clock
//! does not move the estimate) and never advances its state, nor answers, past `max_skew`
//! epochs beyond it. Local adds more than one epoch further ahead than that are refused: they
//! would land in an epoch the peers refuse. One epoch of slack, because the estimate lags a
//! peer's clock by as much as the time its newest epoch took to reach this replica.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use super::ReplicaError;

/// No peer's clock is known.
const UNKNOWN: i64 = i64::MIN;

/// Milliseconds on the process's monotonic clock.
pub(crate) fn monotonic_ms() -> i64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as i64
}

/// A replica's wall clock and its estimate of its live peers' clock.
#[derive(Debug)]
pub(crate) struct ReplicaClock {
    /// Added to the system's wall clock: a step injected by a test (0 otherwise).
    offset_ms: AtomicI64,
    /// The live peers' clock minus the monotonic clock, at the newest of them
    /// ([`ReplicaClock::peer_base`]); [`UNKNOWN`] when none is known.
    peers_base_ms: AtomicI64,
}

impl Default for ReplicaClock {
    fn default() -> Self {
        ReplicaClock {
            offset_ms: AtomicI64::new(0),
            peers_base_ms: AtomicI64::new(UNKNOWN),
        }
    }
}

impl ReplicaClock {
    /// The wall clock (ms since the UNIX epoch), with the injected step.
    pub(crate) fn now_ms(&self) -> u64 {
        let wall = super::wall_clock_ms() as i64;
        wall.saturating_add(self.offset_ms.load(Ordering::Relaxed))
            .max(0) as u64
    }

    /// Steps the wall clock by `ms` from the system's (tests).
    pub(crate) fn set_offset_ms(&self, ms: i64) {
        self.offset_ms.store(ms, Ordering::Relaxed);
    }

    /// What a peer's newest `epoch` (of `epoch_len` ms) received now says of its clock: at
    /// least the epoch's start, as of now on the monotonic clock.
    pub(crate) fn peer_base(epoch: u64, epoch_len: u64) -> i64 {
        (epoch.saturating_mul(epoch_len) as i64).saturating_sub(monotonic_ms())
    }

    /// Sets the live peers' clock (the largest [`ReplicaClock::peer_base`] among them; `None`:
    /// no live peer has sent its clock, and this replica's own is all there is).
    pub(crate) fn set_peers_base(&self, base: Option<i64>) {
        self.peers_base_ms
            .store(base.unwrap_or(UNKNOWN), Ordering::Relaxed);
    }

    /// The live peers' clock now, estimated.
    fn peers_ms(&self) -> Option<u64> {
        match self.peers_base_ms.load(Ordering::Relaxed) {
            UNKNOWN => None,
            base => Some(base.saturating_add(monotonic_ms()).max(0) as u64),
        }
    }

    /// The time to advance the state to and answer as of, for a kind with `bounds` (epoch
    /// length, skew bound): the wall clock, or at most the end of the epoch `max_skew` past
    /// the peers' clock; and, if the wall clock is further ahead than one epoch past that,
    /// how many epochs ahead of the peers' it is.
    fn bounded(&self, bounds: Option<(u64, u32)>) -> (u64, Option<u64>) {
        let now = self.now_ms();
        let (Some((len, skew)), Some(peers)) = (bounds, self.peers_ms()) else {
            return (now, None);
        };
        let (own, theirs) = (now / len, peers / len);
        let allowed = theirs.saturating_add(u64::from(skew));
        if own <= allowed {
            return (now, None);
        }
        let end_of_allowed = allowed.saturating_add(1).saturating_mul(len) - 1;
        let ahead = own - theirs;
        (
            end_of_allowed,
            (ahead > u64::from(skew) + 1).then_some(ahead),
        )
    }

    /// The time reads answer as of ([`ReplicaClock::bounded`]).
    pub(crate) fn for_reads(&self, bounds: Option<(u64, u32)>) -> u64 {
        self.bounded(bounds).0
    }

    /// The time a local update advances the state to, or [`ReplicaError::ClockAhead`] when
    /// this replica's clock is too far ahead of its peers' for its adds to be accepted.
    pub(crate) fn for_updates(&self, bounds: Option<(u64, u32)>) -> Result<u64, ReplicaError> {
        match self.bounded(bounds) {
            (now, None) => Ok(now),
            (_, Some(ahead_epochs)) => Err(ReplicaError::ClockAhead {
                ahead_epochs,
                max_skew: bounds.map_or(0, |b| b.1),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 60_000;

    #[test]
    fn alone_the_wall_clock_is_all_there_is() {
        let c = ReplicaClock::default();
        c.set_offset_ms(7_200_000);
        let t = c.for_updates(Some((LEN, 1))).unwrap();
        assert!(t >= super::super::wall_clock_ms() + 7_000_000);
    }

    #[test]
    fn a_clock_ahead_of_its_peers_is_bounded_then_refused() {
        let c = ReplicaClock::default();
        let now = c.now_ms();
        let epoch = now / LEN;
        c.set_peers_base(Some(ReplicaClock::peer_base(epoch, LEN)));
        let bounds = Some((LEN, 1));
        // In step with the peers: the wall clock.
        let t = c.for_updates(bounds).unwrap();
        assert!(t >= now && t / LEN == epoch);
        // Two epochs ahead (one past the skew): bounded to the skew, still accepted.
        c.set_offset_ms(2 * LEN as i64);
        assert_eq!(c.for_updates(bounds).unwrap() / LEN, epoch + 1);
        assert_eq!(c.for_reads(bounds) / LEN, epoch + 1);
        // Two hours ahead: refused, and reads answer as of the peers' window.
        c.set_offset_ms(7_200_000);
        match c.for_updates(bounds) {
            Err(ReplicaError::ClockAhead {
                ahead_epochs,
                max_skew: 1,
            }) => assert!(ahead_epochs >= 119, "{ahead_epochs}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.for_reads(bounds) / LEN, epoch + 1);
        // Corrected.
        c.set_offset_ms(0);
        assert!(c.for_updates(bounds).is_ok());
        // Kinds without a clock are never bounded.
        c.set_offset_ms(7_200_000);
        assert!(c.for_updates(None).is_ok());
    }
}
