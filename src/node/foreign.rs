//! The names under a node's prefix that replicas outside its catalog replicate (configured
//! filters of other nodes, replicas embedded in other processes): heard on the node's
//! replication subscription. The node's queue subscription for the catalog filters' request
//! API also takes their requests, which their own subscriptions answer; the node must stay
//! silent on those rather than refuse them as unknown (a requester takes the first answer).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long after it was last heard a name counts as replicated elsewhere: longer than a
/// quiet replica's digests are apart (4 anti-entropy intervals of 5 s by default, capped by
/// `peer_expiry_ms`).
pub(super) const FOREIGN_EXPIRY: Duration = Duration::from_secs(120);

/// For how long after it was first heard a name is still checked against the catalog: the
/// deltas of a filter created a moment ago may come before the node's catalog watcher
/// tells of it.
pub(super) const FOREIGN_SETTLE: Duration = Duration::from_secs(5);

/// Most names remembered: a flood of made-up names cannot grow the node without bound.
const MAX_FOREIGN: usize = 65_536;

/// What the node knows of a name it does not host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard {
    /// Replicated elsewhere for a while: another replica's own subscription answers.
    Elsewhere,
    /// First heard a moment ago: perhaps a catalog filter the watcher has not told of yet.
    Lately,
    /// Not heard (or not lately).
    Never,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    first: Instant,
    last: Instant,
}

/// The names heard replicating outside the catalog, with when.
#[derive(Debug)]
pub(super) struct ForeignNames {
    names: HashMap<String, Seen>,
    pruned: Instant,
}

impl Default for ForeignNames {
    fn default() -> Self {
        Self {
            names: HashMap::new(),
            pruned: Instant::now(),
        }
    }
}

impl ForeignNames {
    /// `name` was heard replicating at `now`.
    pub(super) fn saw(&mut self, name: &str, now: Instant) {
        if let Some(seen) = self.names.get_mut(name) {
            seen.last = now;
            return;
        }
        if self.names.len() >= MAX_FOREIGN && now.duration_since(self.pruned) >= FOREIGN_SETTLE {
            // At most once per settle time: a full map of live names costs one pass then.
            self.names
                .retain(|_, s| now.duration_since(s.last) < FOREIGN_EXPIRY);
            self.pruned = now;
        }
        if self.names.len() < MAX_FOREIGN {
            let seen = Seen {
                first: now,
                last: now,
            };
            self.names.insert(name.to_owned(), seen);
        }
    }

    /// What is known of `name` at `now`.
    pub(super) fn heard(&self, name: &str, now: Instant) -> Heard {
        match self.names.get(name) {
            Some(s) if now.duration_since(s.last) >= FOREIGN_EXPIRY => Heard::Never,
            Some(s) if now.duration_since(s.first) < FOREIGN_SETTLE => Heard::Lately,
            Some(_) => Heard::Elsewhere,
            None => Heard::Never,
        }
    }

    /// Forgets `name` (the catalog has it now).
    pub(super) fn forget(&mut self, name: &str) {
        self.names.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_elsewhere_once_settled_and_until_it_expires() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        assert_eq!(f.heard("a", t0), Heard::Never);
        f.saw("a", t0);
        assert_eq!(f.heard("a", t0), Heard::Lately);
        let settled = t0 + FOREIGN_SETTLE;
        assert_eq!(f.heard("a", settled), Heard::Elsewhere);
        // Heard again: it stays, counted from the last time.
        f.saw("a", settled);
        assert_eq!(f.heard("a", settled + FOREIGN_EXPIRY / 2), Heard::Elsewhere);
        assert_eq!(f.heard("a", settled + FOREIGN_EXPIRY), Heard::Never);
        f.forget("a");
        assert_eq!(f.heard("a", settled), Heard::Never);
    }

    #[test]
    fn a_full_map_makes_room_from_expired_names_only() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        for i in 0..MAX_FOREIGN {
            f.saw(&i.to_string(), t0);
        }
        let later = t0 + FOREIGN_SETTLE;
        f.saw("new", later);
        assert_eq!(f.heard("new", later), Heard::Never, "no room: all live");
        // Once the first ones expired, the next new name finds room.
        let expired = t0 + FOREIGN_EXPIRY;
        f.saw("0", expired);
        f.saw("newer", expired);
        assert_eq!(f.heard("newer", expired), Heard::Lately);
        assert_eq!(f.names.len(), 2, "only the names heard lately stay");
    }
}
