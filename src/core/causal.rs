//! Causal contexts: which version tags (dots) a replica has observed. Stored per replica as a
//! set of ranges, so that the common case (every dot up to `n`) is one range, while delta
//! states and replicas that skipped timestamps after a crash keep exact, non-contiguous sets.

use std::collections::BTreeMap;

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

/// The counters observed from one replica: disjoint ranges `first..=last`, keyed by `first`,
/// none adjacent to another (touching ranges are joined), so that equal sets are equal maps.
///
/// A replica issues its own dots in order, so most inserts extend the last range: that is
/// done in place, without a search (`rangemap`'s set removed and reinserted the range on every
/// dot, twice per add counting the pending delta's context: a fifth of an `or_cuckoo` add).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    #[inline]
    fn contains(&self, c: u64) -> bool {
        self.0
            .range(..=c)
            .next_back()
            .is_some_and(|(_, &last)| c <= last)
    }

    /// Adds `first..=last` (`first <= last`).
    #[inline]
    fn insert(&mut self, first: u64, last: u64) {
        debug_assert!(first <= last);
        // The fast paths: at or past the end of the last range.
        if let Some(mut tail) = self.0.last_entry() {
            let (tail_first, tail_last) = (*tail.key(), *tail.get());
            if first > tail_last.saturating_add(1) {
                self.0.insert(first, last);
                return;
            }
            if first >= tail_first {
                if last > tail_last {
                    *tail.get_mut() = last;
                }
                return;
            }
        } else {
            self.0.insert(first, last);
            return;
        }
        self.insert_slow(first, last);
    }

    /// Joins `first..=last` with every range it overlaps or touches.
    fn insert_slow(&mut self, mut first: u64, mut last: u64) {
        if let Some((&f, &l)) = self.0.range(..first).next_back()
            && l.saturating_add(1) >= first
        {
            if l >= last {
                return;
            }
            first = f;
        }
        let joined: Vec<u64> = self
            .0
            .range(first..=last.saturating_add(1))
            .map(|(&f, _)| f)
            .collect();
        for f in joined {
            let l = self.0.remove(&f).expect("listed");
            last = last.max(l);
        }
        self.0.insert(first, last);
    }

    /// Whether every counter of `first..=last` is in the set (one range holds them all, since
    /// touching ranges are joined).
    fn covers(&self, first: u64, last: u64) -> bool {
        self.0
            .range(..=first)
            .next_back()
            .is_some_and(|(_, &l)| last <= l)
    }

    fn last(&self) -> Option<u64> {
        self.0.last_key_value().map(|(_, &l)| l)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&f, &l)| (f, l))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A set of dots (the thesis' causal history `H`, generalised to a dot cloud).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CausalContext {
    /// No replica with an empty set, so that equal contexts are equal maps.
    per_replica: BTreeMap<ReplicaId, Ranges>,
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
            .is_some_and(|s| s.contains(dot.counter))
    }

    /// Whether the packed tag has been observed.
    #[inline]
    pub(crate) fn contains_tag(&self, tag: u64) -> bool {
        self.contains(Dot::unpack(tag))
    }

    /// Records a dot. A replica's next dot after its highest extends its last range in place.
    #[inline]
    pub fn insert(&mut self, dot: Dot) {
        self.insert_range(dot.replica, dot.counter, dot.counter);
    }

    /// Records the dots `first..=last` of `replica` (`first <= last`).
    #[inline]
    fn insert_range(&mut self, replica: ReplicaId, first: u64, last: u64) {
        match self.per_replica.get_mut(&replica) {
            Some(ranges) => ranges.insert(first, last),
            None => {
                self.per_replica
                    .insert(replica, Ranges(BTreeMap::from([(first, last)])));
            }
        }
    }

    /// `self := self ∪ other`.
    pub fn union(&mut self, other: &Self) {
        for (r, ranges) in &other.per_replica {
            match self.per_replica.get_mut(r) {
                Some(mine) => ranges.iter().for_each(|(f, l)| mine.insert(f, l)),
                None => {
                    self.per_replica.insert(*r, ranges.clone());
                }
            }
        }
    }

    /// `self ⊆ other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.per_replica
            .iter()
            .all(|(r, ranges)| match other.per_replica.get(r) {
                None => ranges.is_empty(),
                Some(theirs) => ranges.iter().all(|(f, l)| theirs.covers(f, l)),
            })
    }

    /// Each replica id observed, with its highest counter.
    pub fn maxima(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.per_replica
            .iter()
            .filter_map(|(r, s)| s.last().map(|last| (*r, last)))
    }

    /// Highest counter observed from `replica` (0 if none).
    #[inline]
    pub fn max(&self, replica: ReplicaId) -> u64 {
        self.per_replica
            .get(&replica)
            .and_then(Ranges::last)
            .unwrap_or(0)
    }

    /// Number of dots observed.
    pub fn dot_count(&self) -> u64 {
        self.per_replica
            .values()
            .flat_map(Ranges::iter)
            .map(|(f, l)| l - f + 1)
            .sum()
    }

    /// Replicas with at least one observed dot.
    pub fn replicas(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.per_replica.keys().copied()
    }

    /// Whether no dot has been observed.
    pub fn is_empty(&self) -> bool {
        self.per_replica.values().all(Ranges::is_empty)
    }

    /// The ranges observed per replica.
    pub fn ranges(&self) -> impl Iterator<Item = (ReplicaId, (u64, u64))> + '_ {
        self.per_replica
            .iter()
            .flat_map(|(r, s)| s.iter().map(move |range| (*r, range)))
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
                .map(|(r, set)| (*r, set.iter().collect()))
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
                ctx.insert_range(replica, first, last);
            }
        }
        Ok(ctx)
    }
}

/// A dot, shortly (for the tests of the modules that build contexts and deltas).
#[cfg(test)]
pub(crate) fn dot(replica: ReplicaId, counter: u64) -> Dot {
    Dot { replica, counter }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

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

    /// A step on a context and on its model, a plain set of dots.
    #[derive(Debug, Clone)]
    enum Step {
        /// The replica's next dot after its highest (how a replica issues its own).
        Next(ReplicaId),
        /// Any dot (a remote one, or one of a delta).
        Dot(ReplicaId, u64),
        /// The union with a context of these dots and ranges.
        Union(Vec<(ReplicaId, u64, u64)>),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..3u16).prop_map(Step::Next),
            3 => (0..3u16, 1..60u64).prop_map(|(r, c)| Step::Dot(r, c)),
            1 => prop::collection::vec((0..3u16, 1..60u64, 0..8u64), 0..5).prop_map(|v| {
                Step::Union(v.into_iter().map(|(r, c, n)| (r, c, c + n)).collect())
            }),
        ]
    }

    type Model = BTreeSet<(ReplicaId, u64)>;

    fn apply(ctx: &mut CausalContext, model: &mut Model, step: &Step) {
        match *step {
            Step::Next(r) => {
                let d = dot(r, ctx.max(r) + 1);
                ctx.insert(d);
                model.insert((r, d.counter));
            }
            Step::Dot(r, c) => {
                ctx.insert(dot(r, c));
                model.insert((r, c));
            }
            Step::Union(ref ranges) => {
                let mut other = CausalContext::new();
                for &(r, first, last) in ranges {
                    // Half as ranges, half dot by dot in descending order (the slow path).
                    if first % 2 == 0 {
                        other.insert_range(r, first, last);
                    } else {
                        (first..=last).rev().for_each(|c| other.insert(dot(r, c)));
                    }
                    model.extend((first..=last).map(|c| (r, c)));
                }
                ctx.union(&other);
            }
        }
    }

    /// Everything the context answers, against the model; and its ranges are canonical
    /// (ascending, disjoint, not touching), so that equal sets are equal contexts.
    fn check(ctx: &CausalContext, model: &Model) {
        for r in 0..3u16 {
            for c in 0..70u64 {
                assert_eq!(
                    ctx.contains(dot(r, c)),
                    model.contains(&(r, c)),
                    "({r}, {c})"
                );
            }
            let max = model.range((r, 0)..=(r, u64::MAX)).next_back();
            assert_eq!(ctx.max(r), max.map_or(0, |d| d.1));
        }
        assert_eq!(ctx.dot_count(), model.len() as u64);
        assert_eq!(ctx.is_empty(), model.is_empty());
        let mut prev: Option<(ReplicaId, u64)> = None;
        for (r, (first, last)) in ctx.ranges() {
            assert!(first <= last);
            if let Some((pr, pl)) = prev {
                assert!(pr < r || pl + 1 < first, "ranges not canonical: {ctx:?}");
            }
            prev = Some((r, last));
        }
        let replicas: BTreeSet<ReplicaId> = model.iter().map(|d| d.0).collect();
        assert!(ctx.replicas().eq(replicas.iter().copied()));
        let decoded: CausalContext =
            serde_cbor::from_slice(&serde_cbor::to_vec(ctx).unwrap()).unwrap();
        assert_eq!(&decoded, ctx);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The range representation (with its in-place fast path for a replica's next dot)
        /// answers as the plain set of dots does, through random interleavings of own dots,
        /// remote dots and unions; and subsets and equality are the sets'.
        #[test]
        fn ranges_equal_the_plain_set_of_dots(
            a_steps in prop::collection::vec(step(), 0..60),
            b_steps in prop::collection::vec(step(), 0..60),
        ) {
            let (mut a, mut am) = (CausalContext::new(), Model::new());
            let (mut b, mut bm) = (CausalContext::new(), Model::new());
            for s in &a_steps {
                apply(&mut a, &mut am, s);
                check(&a, &am);
            }
            for s in &b_steps {
                apply(&mut b, &mut bm, s);
            }
            check(&b, &bm);
            prop_assert_eq!(a.is_subset(&b), am.is_subset(&bm));
            prop_assert_eq!(b.is_subset(&a), bm.is_subset(&am));
            prop_assert_eq!(a == b, am == bm);
            let mut u = a.clone();
            u.union(&b);
            let um: Model = am.union(&bm).copied().collect();
            check(&u, &um);
            prop_assert!(a.is_subset(&u) && b.is_subset(&u));
        }
    }
}
