//! Kinds whose elements expire: the live peers' clocks, which bound this replica's own
//! (see [`crate::replica::clock`]). The shell reads the frames and the filter; this keeps
//! the largest clock each peer sent and says which is the newest.

use std::collections::HashMap;

use uuid::Uuid;

/// Each live peer's clock, as [`crate::replica::clock::ReplicaClock::peer_base`]s: the
/// largest each sent.
#[derive(Debug, Default)]
pub(crate) struct PeerClocks(HashMap<Uuid, i64>);

impl PeerClocks {
    /// `sender` sent a frame whose clock is at `base`: the newest clock of the peers now.
    pub(crate) fn note(&mut self, sender: Uuid, base: i64) -> Option<i64> {
        // The largest: a later frame of the same epoch says less of its clock than the first.
        let known = self.0.entry(sender).or_insert(base);
        *known = (*known).max(base);
        self.newest()
    }

    /// Forgets the clocks of peers no longer live: the newest of those left.
    pub(crate) fn keep_live(&mut self, mut live: impl FnMut(&Uuid) -> bool) -> Option<i64> {
        self.0.retain(|sender, _| live(sender));
        self.newest()
    }

    fn newest(&self) -> Option<i64> {
        self.0.values().max().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_clock_is_the_largest_of_the_live_peers() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut c = PeerClocks::default();
        assert_eq!(c.note(a, 10), Some(10));
        assert_eq!(c.note(b, 30), Some(30));
        // A later frame with a smaller base says less: the largest is kept.
        assert_eq!(c.note(b, 20), Some(30));
        assert_eq!(c.keep_live(|p| *p == a), Some(10), "b is gone");
        assert_eq!(c.keep_live(|_| false), None);
    }
}
