//! The names under a node's prefix that replicas outside its catalog replicate (configured
//! filters of other nodes, replicas embedded in other processes): heard on the node's
//! replication subscription. The node's queue subscription for the catalog filters' request
//! API also takes their requests, which their own subscriptions answer; the node must stay
//! silent on those rather than refuse them as unknown (a requester takes the first answer).
//!
//! A name heard is not taken for one of those on hearsay: the catalog must have said it does
//! not list it, within [`RECHECK`] (a filter created a moment ago replicates before the
//! node's watcher tells of it). A dropped catalog filter is not one either, though its
//! stopping replicas still publish a moment after the drop. Any name the catalog does not
//! list is left unanswered in any case (a bare responder is never heard replicating): what
//! is known here spares the catalog a read per request.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long after it was last heard a name counts as replicated elsewhere: far longer than
/// a quiet or lone replica's digests are apart, so that a replica is not forgotten between
/// them (and then refused as unknown while its own subscription answers too).
pub(super) const FOREIGN_EXPIRY: Duration = Duration::from_secs(600);

/// How long the catalog's "not listed" holds for a name heard replicating.
pub(super) const RECHECK: Duration = Duration::from_secs(5);

/// How long it holds for a name nobody was heard replicating: a client that keeps asking for
/// a dropped or mistyped filter costs the catalog one read per name and second, not one per
/// request. (A create seen by the node's watcher ends it at once.)
pub(super) const UNLISTED_TTL: Duration = Duration::from_secs(1);

/// Most names remembered, and most drops: a flood of made-up names cannot grow the node
/// without bound.
const MAX_NAMES: usize = 65_536;

/// What the node knows of a name it does not host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Heard {
    /// Replicated elsewhere, and not in the catalog when it last looked: another replica's
    /// own subscription answers.
    Elsewhere,
    /// Replicated, but the catalog has not been asked lately: perhaps a filter created a
    /// moment ago.
    Unchecked,
    /// Not heard replicating, and not in the catalog when it looked a moment ago
    /// ([`UNLISTED_TTL`]).
    Unlisted,
    /// Not heard (or not for a long while), and not looked up lately.
    Never,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    last: Instant,
    /// When the catalog last said it does not list the name.
    absent: Option<Instant>,
}

/// The names heard replicating outside the catalog, and the catalog filters dropped lately.
#[derive(Debug)]
pub(super) struct ForeignNames {
    names: HashMap<String, Seen>,
    dropped: HashMap<String, Instant>,
    /// Names not heard replicating that the catalog said it does not list, and when.
    unlisted: HashMap<String, Instant>,
    pruned: Instant,
}

impl Default for ForeignNames {
    fn default() -> Self {
        Self {
            names: HashMap::new(),
            dropped: HashMap::new(),
            unlisted: HashMap::new(),
            pruned: Instant::now(),
        }
    }
}

impl ForeignNames {
    /// `name` was heard replicating at `now` (not for a catalog filter dropped lately).
    pub(super) fn saw(&mut self, name: &str, now: Instant) {
        self.unlisted.remove(name);
        if let Some(seen) = self.names.get_mut(name) {
            seen.last = now;
            return;
        }
        if self
            .dropped
            .get(name)
            .is_some_and(|d| now.duration_since(*d) < FOREIGN_EXPIRY)
        {
            return;
        }
        self.make_room(now);
        if self.names.len() < MAX_NAMES {
            let seen = Seen {
                last: now,
                absent: None,
            };
            self.names.insert(name.to_owned(), seen);
        }
    }

    /// The catalog said at `now` that it does not list `name`.
    pub(super) fn absent(&mut self, name: &str, now: Instant) {
        if let Some(seen) = self.names.get_mut(name) {
            seen.absent = Some(now);
            return;
        }
        self.make_room(now);
        if self.unlisted.len() < MAX_NAMES {
            self.unlisted.insert(name.to_owned(), now);
        }
    }

    /// What is known of `name` at `now`.
    pub(super) fn heard(&self, name: &str, now: Instant) -> Heard {
        match self.names.get(name) {
            Some(s) if now.duration_since(s.last) >= FOREIGN_EXPIRY => Heard::Never,
            Some(s) if s.absent.is_some_and(|a| now.duration_since(a) < RECHECK) => {
                Heard::Elsewhere
            }
            Some(_) => Heard::Unchecked,
            None => match self.unlisted.get(name) {
                Some(at) if now.duration_since(*at) < UNLISTED_TTL => Heard::Unlisted,
                _ => Heard::Never,
            },
        }
    }

    /// Whether the catalog dropped `name` and has not listed it again since.
    pub(super) fn was_dropped(&self, name: &str) -> bool {
        self.dropped.contains_key(name)
    }

    /// Whether the catalog dropped `name` less than `within` before `now` and has not listed
    /// it again since.
    pub(super) fn dropped_within(&self, name: &str, now: Instant, within: Duration) -> bool {
        self.dropped
            .get(name)
            .is_some_and(|d| now.duration_since(*d) < within)
    }

    /// The catalog lists `name` now.
    pub(super) fn listed(&mut self, name: &str) {
        self.names.remove(name);
        self.dropped.remove(name);
        self.unlisted.remove(name);
    }

    /// The catalog dropped `name` at `now`: what its replicas still publish is not taken
    /// for a replica outside the catalog.
    pub(super) fn dropped(&mut self, name: &str, now: Instant) {
        self.names.remove(name);
        self.make_room(now);
        if self.dropped.len() < MAX_NAMES {
            self.dropped.insert(name.to_owned(), now);
        }
    }

    /// Forgets the names and drops not heard of for [`FOREIGN_EXPIRY`] (and the unlisted
    /// names older than [`UNLISTED_TTL`]) once a map is full,
    /// at most once per [`RECHECK`] (a full map of live names costs one pass then).
    fn make_room(&mut self, now: Instant) {
        let full = [self.names.len(), self.dropped.len(), self.unlisted.len()]
            .into_iter()
            .any(|n| n >= MAX_NAMES);
        if full && now.duration_since(self.pruned) >= RECHECK {
            self.unlisted
                .retain(|_, at| now.duration_since(*at) < UNLISTED_TTL);
            self.names
                .retain(|_, s| now.duration_since(s.last) < FOREIGN_EXPIRY);
            self.dropped
                .retain(|_, d| now.duration_since(*d) < FOREIGN_EXPIRY);
            self.pruned = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_elsewhere_while_the_catalog_lately_said_it_has_none() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        assert_eq!(f.heard("a", t0), Heard::Never);
        f.saw("a", t0);
        assert_eq!(f.heard("a", t0), Heard::Unchecked);
        f.absent("a", t0);
        assert_eq!(f.heard("a", t0), Heard::Elsewhere);
        // Asked again after a while: a create may have come since.
        assert_eq!(f.heard("a", t0 + RECHECK), Heard::Unchecked);
        // Heard again it stays, counted from the last time.
        let later = t0 + FOREIGN_EXPIRY / 2;
        f.saw("a", later);
        assert_eq!(f.heard("a", later + FOREIGN_EXPIRY / 2), Heard::Unchecked);
        assert_eq!(f.heard("a", later + FOREIGN_EXPIRY), Heard::Never);
        f.listed("a");
        assert_eq!(f.heard("a", later), Heard::Never);
    }

    #[test]
    fn a_name_nobody_replicates_stays_unlisted_for_a_moment_unless_created_or_heard() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        f.absent("typo", t0);
        assert_eq!(f.heard("typo", t0), Heard::Unlisted);
        assert_eq!(f.heard("typo", t0 + UNLISTED_TTL), Heard::Never);
        f.absent("new", t0);
        f.listed("new");
        assert_eq!(f.heard("new", t0), Heard::Never, "created meanwhile");
        f.absent("embedded", t0);
        f.saw("embedded", t0);
        assert_eq!(
            f.heard("embedded", t0),
            Heard::Unchecked,
            "heard replicating"
        );
    }

    #[test]
    fn a_dropped_filters_late_traffic_does_not_make_it_foreign() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        f.saw("gone", t0);
        f.dropped("gone", t0);
        f.saw("gone", t0 + RECHECK);
        assert_eq!(f.heard("gone", t0 + RECHECK), Heard::Never);
        // Long after, a replica of that name outside the catalog counts again.
        let much_later = t0 + FOREIGN_EXPIRY;
        f.saw("gone", much_later);
        assert_eq!(f.heard("gone", much_later), Heard::Unchecked);
        // Its tombstone goes when the catalog lists the name again.
        f.dropped("gone", much_later);
        assert!(f.was_dropped("gone") && !f.was_dropped("other"));
        let a_minute = Duration::from_secs(60);
        assert!(f.dropped_within("gone", much_later, a_minute));
        assert!(!f.dropped_within("gone", much_later + a_minute, a_minute));
        assert!(
            f.was_dropped("gone"),
            "a starting replica still hears of the drop"
        );
        f.listed("gone");
        assert!(!f.was_dropped("gone"));
        f.saw("gone", much_later);
        assert_eq!(f.heard("gone", much_later), Heard::Unchecked);
    }

    #[test]
    fn a_full_map_makes_room_from_expired_names_only() {
        let t0 = Instant::now();
        let mut f = ForeignNames::default();
        for i in 0..MAX_NAMES {
            f.saw(&i.to_string(), t0);
        }
        let later = t0 + RECHECK;
        f.saw("new", later);
        assert_eq!(f.heard("new", later), Heard::Never, "no room: all live");
        // Once the first ones expired, the next new name finds room.
        let expired = t0 + FOREIGN_EXPIRY;
        f.saw("0", expired);
        f.saw("newer", expired);
        assert_eq!(f.heard("newer", expired), Heard::Unchecked);
        assert_eq!(f.names.len(), 2, "only the names heard lately stay");
    }
}
