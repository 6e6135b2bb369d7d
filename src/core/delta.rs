//! Delta-states (Almeida, Shoker, Baquero 2015): what a replica's local updates changed, small
//! enough to publish after every few updates. Joining a delta gives the same state as merging
//! the sender's full state would have, for what the delta covers; deltas may arrive late,
//! twice or out of order. Lost ones are repaired by merging full states (anti-entropy).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::causal::{CausalContext, Dot};
use super::compact;
use super::error::FilterError;
use super::lattice::Lattice;

/// A filter that can record its local updates as delta-states.
///
/// ```
/// use crpf::{DeltaState, GBloom, Lattice, Membership};
///
/// let mut sender = GBloom::with_capacity(1000, 0.01)?;
/// let mut receiver = sender.clone();
/// sender.track_deltas(true);
/// sender.add(b"x")?;
/// let delta = sender.take_delta().expect("x changed the state");
/// receiver.merge_delta(&delta)?;
/// assert!(receiver.equivalent(&sender));
/// assert!(sender.take_delta().is_none());
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub trait DeltaState: Lattice {
    /// The delta-state type.
    type Delta: Serialize + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static;

    /// Starts (or stops) recording local updates. Off by default, so that filters that are not
    /// replicated pay nothing. Turning it on starts from an empty delta.
    fn track_deltas(&mut self, on: bool);

    /// The delta accumulated since the last call, or `None` if nothing changed.
    fn take_delta(&mut self) -> Option<Self::Delta>;

    /// Number of updates in the accumulated delta (to publish by size).
    fn pending_delta_len(&self) -> usize;

    /// Records in the pending delta, while tracking, all of the state that `item`'s membership
    /// rests on, as an add that found none of it would have. A replica whose state holds parts
    /// merged from elsewhere, which its own log does not hold, calls it after an add: else an
    /// add it acknowledged as durable could rest on bits that a crash loses with the merge.
    /// Whether anything was recorded: `false` when not tracking, when `item` is not contained,
    /// and for the kinds whose every add records an entry of its own (observed-remove and
    /// counting kinds).
    ///
    /// ```
    /// use crpf::{DeltaState, GBloom, Lattice, Membership};
    ///
    /// let mut peer = GBloom::with_capacity(1000, 0.01)?;
    /// peer.add(b"x")?;
    /// let mut mine = GBloom::with_capacity(1000, 0.01)?;
    /// mine.track_deltas(true);
    /// mine.merge(&peer)?;
    /// mine.add(b"x")?; // every bit was set by the merge: nothing recorded
    /// assert!(mine.take_delta().is_none());
    /// assert!(mine.record_footprint(b"x"));
    /// let mut replayed = GBloom::with_capacity(1000, 0.01)?;
    /// replayed.merge_delta(&mine.take_delta().expect("recorded"))?;
    /// assert!(replayed.contains(b"x"));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    fn record_footprint(&mut self, item: &[u8]) -> bool;

    /// Whether a delta fits this state's parameters; `merge_delta` fails exactly when this does.
    fn check_delta(&self, delta: &Self::Delta) -> Result<(), FilterError>;

    /// Joins a delta-state received from another replica. A delta that does not fit the
    /// parameters gives an error and leaves the state untouched.
    fn merge_delta(&mut self, delta: &Self::Delta) -> Result<(), FilterError>;

    /// Joins a delta-state this replica made itself (a record of its write-ahead log), which
    /// no one forged: as [`DeltaState::merge_delta`], except that a scalable kind may create
    /// sub-filters further than [`MAX_SUBS_AHEAD`] past its last one (within its limits).
    /// A replay starts from an older state than the one the delta was taken from, and an
    /// import ([`crate::ReplicatedFilter::import_occurrences`]) re-adds entries into the
    /// sub-filters they came from, however far past the last one. Default:
    /// [`DeltaState::merge_delta`].
    fn merge_own_delta(&mut self, delta: &Self::Delta) -> Result<(), FilterError> {
        self.merge_delta(delta)
    }

    /// Whether a delta of this replica's own fits ([`DeltaState::merge_own_delta`] fails
    /// exactly when this does). Default: [`DeltaState::check_delta`].
    fn check_own_delta(&self, delta: &Self::Delta) -> Result<(), FilterError> {
        self.check_delta(delta)
    }
}

/// The check a replica makes on every state and delta it receives from another replica, before
/// merging it.
///
/// Only a replica itself issues tags under its id (ids are never shared, and a restarted replica
/// restores its clock floor before it merges anything), so a received state or delta that
/// carries a tag of the receiver's own id *above the receiver's clock* is forged or comes from
/// a replica sharing the id. Merging it would advance the receiver's clock to that tag (a tag
/// `(r, 2^48 - 1)` would exhaust it for good), or make the receiver's next tags look already
/// observed, so that their adds vanish on merge. Grow-only types carry no tags: their checks
/// always pass.
///
/// ```
/// use crpf::{CheckRemote, FilterError, Lattice, Membership, OrCuckoo};
///
/// let mine = OrCuckoo::with_capacity(100, 0.01, 1)?;
/// let mut impostor = OrCuckoo::with_capacity(100, 0.01, 1)?; // same id
/// impostor.advance_clock(1 << 40);
/// impostor.add(b"x")?;
/// assert!(matches!(mine.check_remote(&impostor), Err(FilterError::OwnDotAhead { .. })));
/// let peer = OrCuckoo::with_capacity(100, 0.01, 2)?;
/// assert!(mine.check_remote(&peer).is_ok());
/// # Ok::<(), FilterError>(())
/// ```
pub trait CheckRemote: DeltaState {
    /// `Ok` if a state received from another replica may be merged: it carries no tag of this
    /// replica's id above this replica's clock; else [`FilterError::OwnDotAhead`].
    fn check_remote(&self, other: &Self) -> Result<(), FilterError>;
    /// The same check for a received delta-state.
    fn check_remote_delta(&self, delta: &Self::Delta) -> Result<(), FilterError>;
    /// Each replica id whose tags a received delta carries, with its highest timestamp (none
    /// for types without tags): what a receiver holds against the timestamps each id's holder
    /// may have issued (its reservation in the id registry, docs/DESIGN.md section 4).
    fn delta_tag_maxima(&self, _delta: &Self::Delta) -> Vec<(crate::ReplicaId, u64)> {
        Vec::new()
    }
}

/// Delta of a [`crate::GBloom`]: the bits local adds set, in the order they were set.
/// Encoded bit-packed (`src/core/compact.rs`); the CBOR array of earlier releases is read too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BloomDelta {
    /// Indexes of newly set bits.
    #[serde(with = "packed_indexes")]
    pub bits: Vec<u64>,
}

/// Delta of a [`crate::GCuckoo`]: the entries local adds inserted, by primary bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CuckooDelta {
    /// `(bucket, fingerprint)` pairs.
    pub entries: Vec<(u64, u16)>,
}

/// Delta of an [`crate::OrCuckoo`]: the entries local adds inserted, the entries local removes
/// deleted, and a causal context of exactly their dots (a dot cloud, not contiguous). Joining it
/// touches only the entries it lists, and gives the same state as the lattice join of
/// `(entries, context)` would. Encoded compactly (`src/core/compact.rs`: the context is left out,
/// being exactly the listed dots); the CBOR map of earlier releases is read too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrCuckooDelta {
    /// `(bucket, fingerprint, tag)` of added entries that are still live.
    pub entries: Vec<(u64, u16, Dot)>,
    /// `(bucket, fingerprint, tag)` of entries removed, so that a receiver finds them without
    /// scanning its table.
    pub removed: Vec<(u64, u16, Dot)>,
    /// Exactly the dots of `entries` and `removed`.
    pub context: CausalContext,
}

/// Delta of a scalable grow-only filter: the deltas of its sub-filters, by index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScalableDelta<D> {
    /// `(sub-filter index, delta)`, ascending by index.
    pub subs: Vec<(u32, D)>,
    /// `(sub-filter index, items added)` of the Bloom sub-filters in `subs` whose count the
    /// series knows ([`crate::ScGBloom`]'s growth schedule), ascending by index. Absent from
    /// the encoding when empty (the cuckoo kinds', and every delta of earlier releases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<(u32, u64)>,
}

/// Delta of a [`crate::ScOrCuckoo`]: entries by sub-filter, and the shared context. Encoded
/// as [`OrCuckooDelta`] is, with a sub-filter column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScOrCuckooDelta {
    /// `(sub-filter index, bucket, fingerprint, tag)` of added entries that are still live.
    pub entries: Vec<(u32, u64, u16, Dot)>,
    /// `(sub-filter index, bucket, fingerprint, tag)` of entries removed.
    pub removed: Vec<(u32, u64, u16, Dot)>,
    /// Exactly the dots of `entries` and `removed`.
    pub context: CausalContext,
}

/// The bit indexes of a [`BloomDelta`]: written as [`compact::encode_indexes`] bytes, read
/// from those or from the CBOR array of earlier releases.
mod packed_indexes {
    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    use super::compact;

    pub(super) fn serialize<S: Serializer>(bits: &[u64], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&compact::encode_indexes(bits))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        struct Indexes;
        impl<'de> Visitor<'de> for Indexes {
            type Value = Vec<u64>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("packed bit indexes or an array of them")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u64>, E> {
                compact::decode_indexes(v).map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
                // The size hint is the sender's word: capped, the vector grows as items come.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(i) = seq.next_element()? {
                    out.push(i);
                }
                Ok(out)
            }
        }
        d.deserialize_any(Indexes)
    }
}

/// What the two observed-remove deltas share for their encoding.
trait TaggedDelta: Sized {
    /// Whether entries name a sub-filter.
    const SUBS: bool;
    /// An entry as the type lists it.
    type Entry: Serialize + serde::de::DeserializeOwned;
    fn to_tagged(e: &Self::Entry) -> compact::TaggedEntry;
    fn from_tagged(e: compact::TaggedEntry) -> Self::Entry;
    fn parts(&self) -> (&[Self::Entry], &[Self::Entry], &CausalContext);
    fn from_parts(
        entries: Vec<Self::Entry>,
        removed: Vec<Self::Entry>,
        context: CausalContext,
    ) -> Self;
}

/// The CBOR map of earlier releases (packed: fields by index).
#[derive(Deserialize)]
struct TaggedDeltaMap<E> {
    entries: Vec<E>,
    removed: Vec<E>,
    context: CausalContext,
}

/// [`TaggedDeltaMap`], borrowed to be written.
#[derive(Serialize)]
struct TaggedDeltaMapRef<'a, E> {
    entries: &'a [E],
    removed: &'a [E],
    context: &'a CausalContext,
}

fn serialize_tagged<T: TaggedDelta, S: serde::Serializer>(d: &T, s: S) -> Result<S::Ok, S::Error> {
    let (entries, removed, context) = d.parts();
    let listed = entries.iter().chain(removed).map(|e| T::to_tagged(e).3);
    if context.dot_count() != (entries.len() + removed.len()) as u64
        || !listed.clone().all(|dot| context.contains(dot))
    {
        // Not the exact context the compact form rebuilds (no delta a filter takes is like
        // this, but the type allows it): the map keeps it.
        return TaggedDeltaMapRef {
            entries,
            removed,
            context,
        }
        .serialize(s);
    }
    s.serialize_bytes(&compact::encode_tagged(
        T::SUBS,
        entries.iter().map(T::to_tagged),
        removed.iter().map(T::to_tagged),
    ))
}

fn deserialize_tagged<'de, T: TaggedDelta, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<T, D::Error> {
    struct Tagged<T>(std::marker::PhantomData<T>);
    impl<'de, T: TaggedDelta> serde::de::Visitor<'de> for Tagged<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a compact observed-remove delta or its map")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<T, E> {
            let (e, r, context) = compact::decode_tagged(T::SUBS, v).map_err(E::custom)?;
            let list = |v: Vec<compact::TaggedEntry>| v.into_iter().map(T::from_tagged).collect();
            Ok(T::from_parts(list(e), list(r), context))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let m = TaggedDeltaMap::<T::Entry>::deserialize(
                serde::de::value::MapAccessDeserializer::new(map),
            )?;
            Ok(T::from_parts(m.entries, m.removed, m.context))
        }
    }
    d.deserialize_any(Tagged(std::marker::PhantomData))
}

/// Implements [`TaggedDelta`] (with the conversions of its entries) and serde for an
/// observed-remove delta type with fields `entries`, `removed` and `context`.
macro_rules! tagged_delta {
    ($t:ty, subs: $subs:expr, entry: $entry:ty, to: $to:expr, from: $from:expr) => {
        impl TaggedDelta for $t {
            const SUBS: bool = $subs;
            type Entry = $entry;
            fn to_tagged(e: &Self::Entry) -> compact::TaggedEntry {
                $to(e)
            }
            fn from_tagged(e: compact::TaggedEntry) -> Self::Entry {
                $from(e)
            }
            fn parts(&self) -> (&[Self::Entry], &[Self::Entry], &CausalContext) {
                (&self.entries, &self.removed, &self.context)
            }
            fn from_parts(
                entries: Vec<Self::Entry>,
                removed: Vec<Self::Entry>,
                context: CausalContext,
            ) -> Self {
                Self {
                    entries,
                    removed,
                    context,
                }
            }
        }

        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize_tagged(self, s)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                deserialize_tagged(d)
            }
        }
    };
}

tagged_delta!(
    OrCuckooDelta,
    subs: false,
    entry: (u64, u16, Dot),
    to: |&(b, fp, dot): &(u64, u16, Dot)| (0, b, fp, dot),
    from: |(_, b, fp, dot): compact::TaggedEntry| (b, fp, dot)
);
tagged_delta!(
    ScOrCuckooDelta,
    subs: true,
    entry: compact::TaggedEntry,
    to: |e: &compact::TaggedEntry| *e,
    from: |e| e
);

/// Sub-filters a delta may create beyond the receiver's last one. A receiver further behind
/// rejects the delta and catches up by anti-entropy, so that a forged index cannot make it
/// allocate sub-filters of absurd size.
pub const MAX_SUBS_AHEAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::causal::dot;
    use crate::core::codec::{from_cbor, to_cbor};

    #[test]
    fn a_context_that_is_not_exactly_the_listed_tags_keeps_the_map_form() {
        // Listed a, context b: the compact form would rebuild the context as {a}.
        let mut context = CausalContext::new();
        context.insert(dot(1, 9));
        let odd = OrCuckooDelta {
            entries: vec![(3, 7, dot(1, 1))],
            removed: vec![],
            context,
        };
        let back: OrCuckooDelta = from_cbor(&to_cbor(&odd)).unwrap();
        assert_eq!(back, odd);
        // The usual delta takes the compact form, and comes back equal too.
        let mut context = CausalContext::new();
        context.insert(dot(1, 1));
        let usual = OrCuckooDelta {
            context,
            ..odd.clone()
        };
        let bytes = to_cbor(&usual);
        assert!(bytes.len() < to_cbor(&odd).len());
        assert_eq!(from_cbor::<OrCuckooDelta>(&bytes).unwrap(), usual);
    }
}
