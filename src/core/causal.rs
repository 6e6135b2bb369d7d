//! Causal contexts: which version tags (dots) a replica has observed. Stored per replica as a
//! set of ranges, so that the common case (every dot up to `n`) is one range, while delta
//! states and replicas that skipped timestamps after a crash keep exact, non-contiguous sets.

use std::collections::BTreeMap;

use rangemap::RangeInclusiveSet;
use serde::{Deserialize, Serialize};

use super::error::FilterError;

/// A replica's identifier in version tags.
pub type ReplicaId = u16;

/// Largest counter a version tag can carry (tags pack replica and counter into 64 bits).
pub const MAX_COUNTER: u64 = (1 << 48) - 1;

/// A version tag: the replica that created an entry and its logical timestamp there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Dot {
    /// The creating replica.
    pub replica: ReplicaId,
    /// Its timestamp there, starting at 1.
    pub counter: u64,
}

impl Dot {
    pub(crate) fn pack(self) -> u64 {
        (self.replica as u64) << 48 | self.counter
    }
    pub(crate) fn unpack(tag: u64) -> Self {
        Dot {
            replica: (tag >> 48) as ReplicaId,
            counter: tag & MAX_COUNTER,
        }
    }
}

/// The tag after `clock` for `replica`, or [`FilterError::ClockExhausted`] once `clock` reached
/// [`MAX_COUNTER`]: checked arithmetic, so that no clock value can wrap a tag to 0.
pub(crate) fn next_dot(replica: ReplicaId, clock: u64) -> Result<Dot, FilterError> {
    match clock.checked_add(1).filter(|&c| c <= MAX_COUNTER) {
        Some(counter) => Ok(Dot { replica, counter }),
        None => Err(FilterError::ClockExhausted { replica }),
    }
}

/// Clamps a requested clock floor to [`MAX_COUNTER`]: a floor past the last timestamp leaves
/// none to issue, which the clamped clock says just as well (every add then fails with
/// [`FilterError::ClockExhausted`]), and the clock stays a value a state can carry.
pub(crate) fn clamp_clock(floor: u64) -> u64 {
    floor.min(MAX_COUNTER)
}

/// [`FilterError::OwnDotAhead`] if `highest`, the highest timestamp of `replica`'s dots that a
/// received state carries, is above `clock`: the check a replica makes on what it receives
/// before merging it (see [`crate::CheckRemote`]).
pub(crate) fn check_own_dots(
    replica: ReplicaId,
    clock: u64,
    highest: u64,
) -> Result<(), FilterError> {
    if highest > clock {
        Err(FilterError::OwnDotAhead {
            replica,
            counter: highest,
            clock,
        })
    } else {
        Ok(())
    }
}

/// A set of dots (the thesis' causal history `H`, generalised to a dot cloud).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CausalContext {
    per_replica: BTreeMap<ReplicaId, RangeInclusiveSet<u64>>,
}

impl CausalContext {
    /// The empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the dot has been observed.
    #[inline]
    pub fn contains(&self, dot: Dot) -> bool {
        self.per_replica
            .get(&dot.replica)
            .is_some_and(|s| s.contains(&dot.counter))
    }

    /// Whether the packed tag has been observed.
    #[inline]
    pub(crate) fn contains_tag(&self, tag: u64) -> bool {
        self.contains(Dot::unpack(tag))
    }

    /// Records a dot.
    pub fn insert(&mut self, dot: Dot) {
        self.per_replica
            .entry(dot.replica)
            .or_default()
            .insert(dot.counter..=dot.counter);
    }

    /// `self := self ∪ other`.
    pub fn union(&mut self, other: &Self) {
        for (r, ranges) in &other.per_replica {
            let mine = self.per_replica.entry(*r).or_default();
            for range in ranges.iter() {
                mine.insert(range.clone());
            }
        }
    }

    /// `self ⊆ other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.per_replica
            .iter()
            .all(|(r, ranges)| match other.per_replica.get(r) {
                None => ranges.is_empty(),
                Some(theirs) => ranges
                    .iter()
                    .all(|range| theirs.gaps(range).next().is_none()),
            })
    }

    /// Each replica id observed, with its highest counter.
    pub fn maxima(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.per_replica
            .iter()
            .filter_map(|(r, s)| s.last().map(|range| (*r, *range.end())))
    }

    /// Highest counter observed from `replica` (0 if none).
    pub fn max(&self, replica: ReplicaId) -> u64 {
        self.per_replica
            .get(&replica)
            .and_then(|s| s.last())
            .map_or(0, |r| *r.end())
    }

    /// Number of dots observed.
    pub fn dot_count(&self) -> u64 {
        self.per_replica
            .values()
            .flat_map(|s| s.iter())
            .map(|r| r.end() - r.start() + 1)
            .sum()
    }

    /// Replicas with at least one observed dot.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.per_replica.keys().copied()
    }

    /// Whether no dot has been observed.
    pub fn is_empty(&self) -> bool {
        self.per_replica.values().all(|s| s.is_empty())
    }

    /// The ranges observed per replica.
    pub fn ranges(&self) -> impl Iterator<Item = (ReplicaId, (u64, u64))> + '_ {
        self.per_replica.iter().flat_map(|(r, s)| {
            s.iter()
                .map(move |range| (*r, (*range.start(), *range.end())))
        })
    }
}

/// Serialized as `[(replica, [(first, last), ...]), ...]`.
#[derive(Serialize, Deserialize)]
struct CausalContextRepr(Vec<(ReplicaId, Vec<(u64, u64)>)>);

impl Serialize for CausalContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CausalContextRepr(
            self.per_replica
                .iter()
                .filter(|(_, set)| !set.is_empty())
                .map(|(r, set)| (*r, set.iter().map(|x| (*x.start(), *x.end())).collect()))
                .collect(),
        )
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for CausalContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = CausalContextRepr::deserialize(d)?;
        let mut ctx = CausalContext::new();
        for (replica, ranges) in repr.0 {
            for (first, last) in ranges {
                if first == 0 || first > last || last > MAX_COUNTER {
                    return Err(serde::de::Error::custom(FilterError::malformed(format!(
                        "invalid dot range {first}..={last} for replica {replica}"
                    ))));
                }
                ctx.per_replica
                    .entry(replica)
                    .or_default()
                    .insert(first..=last);
            }
        }
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(replica: ReplicaId, counter: u64) -> Dot {
        Dot { replica, counter }
    }

    #[test]
    fn union_subset_and_gaps() {
        let mut a = CausalContext::new();
        for c in [1, 2, 3, 7] {
            a.insert(dot(1, c));
        }
        assert!(a.contains(dot(1, 3)) && !a.contains(dot(1, 5)) && a.contains(dot(1, 7)));
        assert_eq!(a.max(1), 7);
        assert_eq!(a.dot_count(), 4);
        let mut b = CausalContext::new();
        b.insert(dot(1, 5));
        b.insert(dot(2, 1));
        assert!(!a.is_subset(&b) && !b.is_subset(&a));
        let mut u = a.clone();
        u.union(&b);
        assert!(a.is_subset(&u) && b.is_subset(&u));
        assert_eq!(
            Dot::unpack(dot(65535, MAX_COUNTER).pack()),
            dot(65535, MAX_COUNTER)
        );
    }
}
