//! Scalable filters that keep their FPR bound whatever the sync frequency: one scalable series
//! per writer.
//!
//! The thesis's scalable filters (Specs. 6-8) let every replica fill the first sub-filters on
//! its own; a merge then puts the elements of all replicas into sub-filters sized for one, and
//! the compounded FPR far exceeds its bound when replicas sync rarely (thesis Figure 6.1d-f).
//! No local rule can prevent that without coordination: a replica cannot know how much others
//! put into the sub-filter it is filling.
//!
//! Here each writer adds only into a series of its own, so every series is filled by one
//! replica and stays within its own scalable bound (Eq. 2.12) however replicas merge. (An
//! import of a dump, [`WriterScOrCuckoo::import`], re-adds its entries into the series they
//! came from under the importer's tags: it brings back what those writers added.) Writer
//! `w` gets the budget `ε / ((w + 1)(w + 2))`; these sum to at most `ε` over any number of
//! writers (a telescoping series), so the union of all series stays under `ε`. Writers may
//! be counted from a first id instead ([`Partitioned::with_first_writer`], the spec's
//! `first_writer`): replicas claim ids from 1, and counting from 1 gives the first writer
//! half the bound rather than a sixth.
//!
//! The cost is memory: writer `w`'s series needs `log2((w + 1)(w + 2))` more bits of FPR
//! resolution per element than a single series would (Bloom: about `1.44 × log2((w+1)(w+2))`
//! bits per element; cuckoo: that many more fingerprint bits, so one more than the thesis's
//! first sub-filter for writer 0, three more for writer 2, up to the 16-bit fingerprint limit),
//! and a query looks at every writer's series. Writer ids are meant to be small and dense, as
//! replicas claim them from a counter.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::grow_only::{GrowOnlySub, ScalableGrowOnly};
use super::params::ScalableParams;
use super::sc_orcuckoo::ScOrCuckoo;
use super::series::{compound, load};
use crate::core::causal::{Dot, ReplicaId, check_own_dots};
use crate::core::delta::{CheckRemote, DeltaState};
use crate::core::error::FilterError;
use crate::core::kind::{FilterKind, ImportRoom, Occurrence, tags_to_issue};
use crate::core::lattice::{Lattice, Membership, Removable};

/// A scalable series that can serve as one writer's partition.
pub trait WriterSeries:
    Lattice + Membership + DeltaState + Clone + Serialize + DeserializeOwned + fmt::Debug
{
    /// Whether an add of an already contained item is skipped (grow-only types) or adds a
    /// new tagged entry (observed-remove types).
    const DEDUPLICATES: bool;
    #[doc(hidden)]
    fn for_writer(params: ScalableParams, writer: ReplicaId) -> Result<Self, FilterError>;
    #[doc(hidden)]
    fn series_params(&self) -> &ScalableParams;
    #[doc(hidden)]
    fn remove_item(&mut self, _item: &[u8]) -> bool {
        false
    }
    /// Highest timestamp the series' writer may have issued (0 for untagged types).
    #[doc(hidden)]
    fn writer_clock(&self) -> u64 {
        0
    }
    #[doc(hidden)]
    fn advance_writer_clock(&mut self, _floor: u64) {}
    /// Highest timestamp of `replica`'s tags the series carries (0 for untagged types).
    #[doc(hidden)]
    fn max_dot_of(&self, _replica: ReplicaId) -> u64 {
        0
    }
    #[doc(hidden)]
    fn delta_max_dot_of(_delta: &Self::Delta, _replica: ReplicaId) -> u64 {
        0
    }
    /// Each replica id whose tags a delta of the series carries, with its highest timestamp.
    #[doc(hidden)]
    fn delta_tag_maxima(_delta: &Self::Delta) -> Vec<(ReplicaId, u64)> {
        Vec::new()
    }
    /// Whether the series can be writer `writer`'s: it issues tags as `writer`. (Only
    /// `writer` adds to it, but an import may re-add entries into it under the importer's
    /// tags: see [`WriterScOrCuckoo::import`].)
    #[doc(hidden)]
    fn check_writer(&self, _writer: ReplicaId) -> Result<(), FilterError> {
        Ok(())
    }
}

impl<F: GrowOnlySub> WriterSeries for ScalableGrowOnly<F> {
    const DEDUPLICATES: bool = true;
    fn for_writer(params: ScalableParams, _writer: ReplicaId) -> Result<Self, FilterError> {
        Self::new(params)
    }
    fn series_params(&self) -> &ScalableParams {
        self.params()
    }
}

impl WriterSeries for ScOrCuckoo {
    const DEDUPLICATES: bool = false;
    fn for_writer(params: ScalableParams, writer: ReplicaId) -> Result<Self, FilterError> {
        Self::new(params, writer)
    }
    fn series_params(&self) -> &ScalableParams {
        self.params()
    }
    fn remove_item(&mut self, item: &[u8]) -> bool {
        self.remove(item)
    }
    fn writer_clock(&self) -> u64 {
        self.clock()
    }
    fn advance_writer_clock(&mut self, floor: u64) {
        self.advance_clock(floor);
    }
    fn max_dot_of(&self, replica: ReplicaId) -> u64 {
        self.history().max(replica)
    }
    fn delta_max_dot_of(delta: &Self::Delta, replica: ReplicaId) -> u64 {
        delta.context.max(replica)
    }
    fn delta_tag_maxima(delta: &Self::Delta) -> Vec<(ReplicaId, u64)> {
        delta.context.maxima().collect()
    }
    /// Another replica's tags are allowed: an import re-adds a dump's entries into the series
    /// they came from, under the importer's tags ([`WriterScOrCuckoo::import`]).
    fn check_writer(&self, writer: ReplicaId) -> Result<(), FilterError> {
        if self.replica() != writer {
            return Err(FilterError::malformed(format!(
                "the series of writer {writer} issues tags as {}",
                self.replica()
            )));
        }
        Ok(())
    }
}

/// One scalable series per writer; see the [module documentation](self).
#[derive(Clone)]
pub struct Partitioned<F> {
    params: ScalableParams,
    writer: ReplicaId,
    /// The lowest writer id that writes: shares are counted from it (see [`writer_fpr`]).
    first_writer: ReplicaId,
    parts: BTreeMap<ReplicaId, F>,
    tracking: bool,
    rng: fastrand::Rng,
}

/// Scalable grow-only Bloom filter with a series per writer: the FPR bound holds at any sync
/// frequency.
///
/// ```
/// use crpf::{Lattice, Membership, ScalableParams, WriterScGBloom};
///
/// let params = ScalableParams::with_capacity(1000, 0.01)?;
/// let mut a = WriterScGBloom::new(params, 0)?;
/// let mut b = WriterScGBloom::new(params, 1)?;
/// for i in 0..20_000u32 {                      // each far past the first capacity, unsynced
///     a.add(&i.to_le_bytes())?;
///     b.add(&(i + 1_000_000).to_le_bytes())?;
/// }
/// a.merge(&b)?;
/// assert!(a.estimated_fpr() <= 0.01);
/// assert!(a.contains(&5u32.to_le_bytes()) && a.contains(&1_000_005u32.to_le_bytes()));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub type WriterScGBloom = Partitioned<super::grow_only::ScGBloom>;

/// Scalable grow-only cuckoo filter with a series per writer.
///
/// ```
/// use crpf::{Lattice, Membership, ScalableParams, WriterScGCuckoo};
///
/// let params = ScalableParams::with_capacity(1000, 0.01)?;
/// let (mut a, mut b) = (WriterScGCuckoo::new(params, 0)?, WriterScGCuckoo::new(params, 1)?);
/// for i in 0..10_000u32 { a.add(&i.to_le_bytes())?; b.add(&(i + 1 << 20).to_le_bytes())?; }
/// b.merge(&a)?;
/// assert!(b.estimated_fpr() <= 0.01 && b.contains(&9_999u32.to_le_bytes()));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub type WriterScGCuckoo = Partitioned<super::grow_only::ScGCuckoo>;

/// Scalable observed-remove cuckoo filter with a series per writer; any replica may remove
/// from any writer's series.
///
/// ```
/// use crpf::{Lattice, Membership, Removable, ScalableParams, WriterScOrCuckoo};
///
/// let params = ScalableParams::with_capacity(100, 0.01)?;
/// let (mut a, mut b) = (WriterScOrCuckoo::new(params, 0)?, WriterScOrCuckoo::new(params, 1)?);
/// a.add(b"x")?;
/// b.merge(&a)?;
/// assert!(b.remove(b"x"));
/// a.merge(&b)?;
/// assert!(!a.contains(b"x") && a.equivalent(&b));
/// # Ok::<(), crpf::FilterError>(())
/// ```
pub type WriterScOrCuckoo = Partitioned<ScOrCuckoo>;

/// FPR budget of writer `w` when writers are counted from `first`: `ε / ((r + 1)(r + 2))`
/// for its rank `r = w - first`, which sums to `ε` over all writers from `first` on. Writers
/// below `first` write nothing (`None`). Replicas claim their ids from 1, so a filter whose
/// writers count from 1 gives its first writer half the bound, where counting from 0 gives
/// it a sixth (and about 2.6 more bits per item in a Bloom series).
pub fn writer_fpr(fpr: f64, writer: ReplicaId, first: ReplicaId) -> Option<f64> {
    let r = f64::from(writer.checked_sub(first)?);
    Some(fpr / ((r + 1.0) * (r + 2.0)))
}

impl<F: WriterSeries> Partitioned<F> {
    /// A filter adding as `writer`, whose compounded FPR over all writers' series stays under
    /// `params.fpr`; `params.initial_capacity` is each series' first capacity. Writers count
    /// from 0.
    pub fn new(params: ScalableParams, writer: ReplicaId) -> Result<Self, FilterError> {
        Self::with_first_writer(params, writer, 0)
    }

    /// As [`Partitioned::new`], with writers counted from `first_writer` (see
    /// [`writer_fpr`]): the series of a writer below it are refused, and so are adds as one
    /// (a replica holds id 0 only until it claims one, from 1).
    ///
    /// ```
    /// use crpf::{Membership, ScalableParams, WriterScGBloom};
    ///
    /// let params = ScalableParams::with_capacity(1000, 0.01)?;
    /// let mut f = WriterScGBloom::with_first_writer(params, 1, 1)?;
    /// f.add(b"x")?;
    /// assert_eq!(f.part_params(1)?.fpr, 0.005); // half the bound, where `new` gives a sixth
    /// assert!(WriterScGBloom::with_first_writer(params, 0, 1)?.add(b"x").is_err());
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn with_first_writer(
        params: ScalableParams,
        writer: ReplicaId,
        first_writer: ReplicaId,
    ) -> Result<Self, FilterError> {
        let params = params.validated()?;
        let mut f = Self {
            params,
            writer,
            first_writer,
            parts: BTreeMap::new(),
            tracking: false,
            rng: fastrand::Rng::with_seed(params.seed ^ writer as u64),
        };
        // Fail now, not at the first add (a placeholder writer below the first fails then).
        let w = writer.max(first_writer);
        F::for_writer(f.part_params(w)?.validated()?, w)?;
        f.parts.clear();
        Ok(f)
    }

    /// The lowest writer id that writes.
    pub fn first_writer(&self) -> ReplicaId {
        self.first_writer
    }

    /// The parameters' digest: the series parameters', and where writers count from 1, that
    /// too (a replica of an earlier release, which counts from 0, then refuses this filter's
    /// states and deltas rather than reading them with other shares).
    fn params_digest_of_writers(&self) -> u64 {
        match self.first_writer {
            0 => self.params.digest(),
            first => {
                let mut b = self.params.digest().to_le_bytes().to_vec();
                b.extend_from_slice(b"first writer");
                b.extend_from_slice(&first.to_le_bytes());
                xxhash_rust::xxh3::xxh3_64(&b)
            }
        }
    }

    /// As [`Partitioned::new`] with default growth and tightening.
    pub fn with_capacity(
        initial_capacity: u64,
        fpr: f64,
        writer: ReplicaId,
    ) -> Result<Self, FilterError> {
        Self::new(
            ScalableParams::with_capacity(initial_capacity, fpr)?,
            writer,
        )
    }

    /// The parameters shared by all replicas.
    pub fn params(&self) -> &ScalableParams {
        &self.params
    }

    /// The writer this replica adds as.
    pub fn writer(&self) -> ReplicaId {
        self.writer
    }

    /// Highest timestamp this replica may have issued in its own series (0 for untagged types).
    pub fn clock(&self) -> u64 {
        self.parts.get(&self.writer).map_or(0, F::writer_clock)
    }

    /// Guarantees every future tag of this replica has a timestamp above `floor` (no effect on
    /// untagged types). A floor at or past [`crate::MAX_COUNTER`] leaves no timestamp: every
    /// add then fails with [`FilterError::ClockExhausted`].
    pub fn advance_clock(&mut self, floor: u64) {
        if F::DEDUPLICATES || floor == 0 || self.writer < self.first_writer {
            return; // grow-only series issue no tags; a placeholder writer adds nothing
        }
        if !self.parts.contains_key(&self.writer) {
            // The floor lives in our own series: start it (empty, so equivalent to none).
            match self.new_part(self.writer) {
                Ok(part) => {
                    self.parts.insert(self.writer, part);
                }
                Err(e) => {
                    // `new` built this very series' parameters, so this cannot happen.
                    tracing::error!(error = %e, "cannot start the own series to hold the clock");
                    return;
                }
            }
        }
        if let Some(own) = self.parts.get_mut(&self.writer) {
            own.advance_writer_clock(floor);
        }
    }

    /// The series of each writer seen so far.
    pub fn parts(&self) -> impl Iterator<Item = (ReplicaId, &F)> {
        self.parts.iter().map(|(w, f)| (*w, f))
    }

    /// Parameters of writer `w`'s series: its FPR budget and its own hash seeds; an error for
    /// a writer below [`Partitioned::first_writer`].
    pub fn part_params(&self, writer: ReplicaId) -> Result<ScalableParams, FilterError> {
        let fpr = writer_fpr(self.params.fpr, writer, self.first_writer).ok_or_else(|| {
            FilterError::invalid(
                "writer",
                format!(
                    "{writer} writes nothing here: writers count from {}",
                    self.first_writer
                ),
            )
        })?;
        Ok(ScalableParams {
            fpr,
            seed: self.params.seed.wrapping_add((writer as u64) << 32),
            ..self.params
        })
    }

    fn new_part(&self, writer: ReplicaId) -> Result<F, FilterError> {
        let mut f = F::for_writer(self.part_params(writer)?, writer)?;
        f.track_deltas(self.tracking);
        Ok(f)
    }

    fn check_compatible(&self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("scalable", &self.params, &other.params)?;
        FilterError::require_same("first writer", &self.first_writer, &other.first_writer)?;
        self.check_parts(other.parts.iter().map(|(w, f)| (*w, f)))
    }

    fn check_parts<'a>(
        &self,
        parts: impl Iterator<Item = (ReplicaId, &'a F)>,
    ) -> Result<(), FilterError>
    where
        F: 'a,
    {
        for (w, f) in parts {
            if *f.series_params() != self.part_params(w)? {
                return Err(FilterError::Incompatible(format!(
                    "series of writer {w} has foreign parameters"
                )));
            }
            f.check_writer(w)?;
        }
        Ok(())
    }
}

impl<F: WriterSeries> fmt::Debug for Partitioned<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partitioned")
            .field("params", &self.params)
            .field("writer", &self.writer)
            .field("first_writer", &self.first_writer)
            .field("parts", &self.parts)
            .finish()
    }
}

impl<F: WriterSeries> Lattice for Partitioned<F> {
    /// Writer-wise merge; a writer's series we lack is merged into bottom (copied).
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        self.check_compatible(other)?;
        for (w, theirs) in &other.parts {
            match self.parts.get_mut(w) {
                Some(mine) => mine.merge(theirs)?,
                None => {
                    let mut copy = theirs.clone();
                    copy.track_deltas(self.tracking); // not the sender's pending delta
                    self.parts.insert(*w, copy);
                }
            }
        }
        let ours = other.parts.iter().filter(|(w, _)| **w != self.writer);
        self.adopt_own_tags(ours.map(|(_, f)| f.max_dot_of(self.writer)).max());
        Ok(())
    }

    /// Writer-wise `le`, a missing series counting as bottom.
    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.first_writer == other.first_writer
            && self.parts.iter().all(|(w, mine)| match other.parts.get(w) {
                Some(theirs) => mine.le(theirs),
                None => {
                    mine.cardinality() == 0.0
                        && (self.part_params(*w))
                            .and_then(|p| F::for_writer(p, *w))
                            .is_ok_and(|b| mine.le(&b))
                }
            })
    }
}

impl<F: WriterSeries> Membership for Partitioned<F> {
    fn contains(&self, item: &[u8]) -> bool {
        self.parts.values().any(|f| f.contains(item))
    }

    /// Adds into this writer's own series (grow-only types skip items already contained). An
    /// error changes nothing.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        if F::DEDUPLICATES && self.contains(item) {
            return Ok(());
        }
        let created = !self.parts.contains_key(&self.writer);
        if created {
            let part = self.new_part(self.writer)?;
            self.parts.insert(self.writer, part);
        }
        let own = self.parts.get_mut(&self.writer).expect("just ensured");
        // A series' failed add leaves it exactly as it was; drop the series only if this call
        // created it. (An existing one, even empty, holds the history and clock of our tags.)
        let result = own.add(item);
        if result.is_err() && created {
            self.parts.remove(&self.writer);
        }
        result
    }

    fn cardinality(&self) -> f64 {
        self.parts.values().map(|f| f.cardinality()).sum()
    }

    /// Total capacity of the series (the first capacity while there is none).
    fn capacity(&self) -> u64 {
        let total = self
            .parts
            .values()
            .map(|f| f.capacity())
            .fold(0, u64::saturating_add);
        total.max(self.params.initial_capacity)
    }

    fn load_factor(&self) -> f64 {
        load(self.cardinality(), self.capacity())
    }

    /// `1 - Π (1 - ε_w)` over the writers' series, each itself Eq. 2.12.
    fn estimated_fpr(&self) -> f64 {
        compound(self.parts.values().map(|f| f.estimated_fpr()))
    }
}

impl<F: WriterSeries> Removable for Partitioned<F> {
    /// Removes from a random writer's series holding the item (observed-remove types only;
    /// grow-only types never remove and return `false`).
    fn remove(&mut self, item: &[u8]) -> bool {
        if F::DEDUPLICATES {
            return false;
        }
        let holding: Vec<ReplicaId> = self
            .parts
            .iter()
            .filter(|(_, f)| f.contains(item))
            .map(|(w, _)| *w)
            .collect();
        if holding.is_empty() {
            return false;
        }
        let w = holding[self.rng.usize(..holding.len())];
        self.parts.get_mut(&w).expect("listed").remove_item(item)
    }
}

/// Delta of a [`Partitioned`] filter: the deltas of the writers' series that changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedDelta<D> {
    /// `(writer, delta of its series)`, ascending by writer.
    pub parts: Vec<(ReplicaId, D)>,
}

impl<F: WriterSeries> DeltaState for Partitioned<F> {
    type Delta = PartitionedDelta<F::Delta>;

    fn track_deltas(&mut self, on: bool) {
        self.tracking = on;
        for f in self.parts.values_mut() {
            f.track_deltas(on);
        }
    }

    fn take_delta(&mut self) -> Option<Self::Delta> {
        let parts: Vec<_> = self
            .parts
            .iter_mut()
            .filter_map(|(w, f)| f.take_delta().map(|d| (*w, d)))
            .collect();
        (!parts.is_empty()).then_some(PartitionedDelta { parts })
    }

    fn pending_delta_len(&self) -> usize {
        self.parts.values().map(|f| f.pending_delta_len()).sum()
    }

    /// Grow-only series: the footprint in the first writer's series that holds the item,
    /// which an add skips (it may be another writer's). Observed-remove series: nothing, as
    /// each add records an entry of its own.
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        F::DEDUPLICATES
            && (self.parts.values_mut())
                .find(|f| f.contains(item))
                .is_some_and(|f| f.record_footprint(item))
    }

    fn check_delta(&self, delta: &Self::Delta) -> Result<(), FilterError> {
        if delta.parts.windows(2).any(|p| p[0].0 >= p[1].0) {
            return Err(FilterError::malformed("delta writers out of order"));
        }
        for (w, d) in &delta.parts {
            match self.parts.get(w) {
                Some(f) => f.check_delta(d)?,
                None => self.new_part(*w)?.check_delta(d)?,
            }
        }
        Ok(())
    }

    fn merge_delta(&mut self, delta: &Self::Delta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        self.join_delta(delta, F::merge_delta)
    }

    /// Each series joins its part as its own delta ([`DeltaState::merge_own_delta`]).
    fn merge_own_delta(&mut self, delta: &Self::Delta) -> Result<(), FilterError> {
        self.check_own_delta(delta)?;
        self.join_delta(delta, F::merge_own_delta)
    }

    fn check_own_delta(&self, delta: &Self::Delta) -> Result<(), FilterError> {
        if delta.parts.windows(2).any(|p| p[0].0 >= p[1].0) {
            return Err(FilterError::malformed("delta writers out of order"));
        }
        for (w, d) in &delta.parts {
            match self.parts.get(w) {
                Some(f) => f.check_own_delta(d)?,
                None => self.new_part(*w)?.check_own_delta(d)?,
            }
        }
        Ok(())
    }
}

impl<F: WriterSeries> Partitioned<F> {
    /// Joins a checked delta, each series' part by `join`.
    fn join_delta(
        &mut self,
        delta: &PartitionedDelta<F::Delta>,
        join: impl Fn(&mut F, &F::Delta) -> Result<(), FilterError>,
    ) -> Result<(), FilterError> {
        for (w, d) in &delta.parts {
            if !self.parts.contains_key(w) {
                let part = self.new_part(*w)?;
                self.parts.insert(*w, part);
            }
            join(self.parts.get_mut(w).expect("just ensured"), d)?;
        }
        let ours = delta.parts.iter().filter(|(w, _)| *w != self.writer);
        self.adopt_own_tags(ours.map(|(_, d)| F::delta_max_dot_of(d, self.writer)).max());
        Ok(())
    }

    /// Our clock moves past `highest`, the highest of our tags that other writers' series
    /// hold (an import's, see [`WriterScOrCuckoo::import`]): our own series' history does not
    /// hold them, and no tag may be issued twice.
    fn adopt_own_tags(&mut self, highest: Option<u64>) {
        if let Some(highest) = highest.filter(|&h| h > self.clock()) {
            self.advance_clock(highest);
        }
    }
}

impl<F: WriterSeries> CheckRemote for Partitioned<F> {
    /// Our tags live only in our own series; every series is checked all the same.
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        let parts = other.parts.values();
        let highest = parts.map(|f| f.max_dot_of(self.writer)).max();
        check_own_dots(self.writer, self.clock(), highest.unwrap_or(0))
    }

    fn check_remote_delta(&self, delta: &Self::Delta) -> Result<(), FilterError> {
        let parts = delta.parts.iter();
        let highest = parts
            .map(|(_, d)| F::delta_max_dot_of(d, self.writer))
            .max();
        check_own_dots(self.writer, self.clock(), highest.unwrap_or(0))
    }

    fn delta_tag_maxima(&self, delta: &Self::Delta) -> Vec<(ReplicaId, u64)> {
        let mut maxima = std::collections::BTreeMap::new();
        for (id, max) in delta.parts.iter().flat_map(|(_, d)| F::delta_tag_maxima(d)) {
            let m = maxima.entry(id).or_insert(0);
            *m = max.max(*m);
        }
        maxima.into_iter().collect()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(bound(deserialize = "F: DeserializeOwned"))]
struct Repr<F> {
    params: ScalableParams,
    writer: ReplicaId,
    parts: Vec<(ReplicaId, F)>,
    /// Absent (0) in the encodings of filters whose writers count from 0, which are as before.
    /// Last: the encoding numbers the fields in order.
    #[serde(default)]
    first_writer: ReplicaId,
}

impl<F: WriterSeries> Serialize for Partitioned<F> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ReprRef<'a, F> {
            params: &'a ScalableParams,
            writer: ReplicaId,
            parts: Vec<(ReplicaId, &'a F)>,
            #[serde(skip_serializing_if = "is_zero")]
            first_writer: ReplicaId,
        }
        ReprRef {
            params: &self.params,
            writer: self.writer,
            first_writer: self.first_writer,
            parts: self.parts.iter().map(|(w, f)| (*w, f)).collect(),
        }
        .serialize(s)
    }
}

impl<'de, F: WriterSeries> Deserialize<'de> for Partitioned<F> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = Repr::<F>::deserialize(d)?;
        let mut f = Partitioned::<F>::with_first_writer(r.params, r.writer, r.first_writer)
            .map_err(D::Error::custom)?;
        f.check_parts(r.parts.iter().map(|(w, p)| (*w, p)))
            .map_err(D::Error::custom)?;
        let count = r.parts.len();
        f.parts = r.parts.into_iter().collect();
        if f.parts.len() != count {
            return Err(D::Error::custom(FilterError::malformed(
                "a writer's series appears twice",
            )));
        }
        Ok(f)
    }
}
fn is_zero(w: &ReplicaId) -> bool {
    *w == 0
}

impl<F: WriterSeries> Partitioned<F> {
    /// This writer's series, created if missing; `true` if this call created it.
    fn own_part(&mut self) -> Result<(&mut F, bool), FilterError> {
        let created = !self.parts.contains_key(&self.writer);
        if created {
            let part = self.new_part(self.writer)?;
            self.parts.insert(self.writer, part);
        }
        Ok((
            self.parts.get_mut(&self.writer).expect("just ensured"),
            created,
        ))
    }

    /// The writers' series by writer, for digests: each part as its own canonical form.
    fn digest_parts(
        &self,
        h: &mut xxhash_rust::xxh3::Xxh3,
        part: impl Fn(&F, &mut xxhash_rust::xxh3::Xxh3),
    ) {
        // An empty series equals none (grow-only series carry no clock).
        for (w, f) in self.parts.iter().filter(|(_, f)| f.cardinality() > 0.0) {
            h.update(&w.to_le_bytes());
            part(f, h);
        }
    }
}

/// The grow-only per-writer kinds: the type alias and the registry's variant share a name.
macro_rules! writer_grow_only {
    ($kind:ident) => {
        impl crate::core::kind::ReplicatedFilter for $kind {
            const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::$kind;

            fn from_spec(
                spec: &crate::core::kind::FilterSpec,
                replica: ReplicaId,
            ) -> Result<Self, FilterError> {
                Self::with_first_writer(
                    crate::core::kind::scalable_params(spec)?,
                    replica,
                    spec.first_writer(),
                )
            }

            fn params_digest(&self) -> u64 {
                self.params_digest_of_writers()
            }

            /// Each writer's series that holds anything, by writer.
            fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
                self.digest_parts(h, |f, h| f.digest_state(h));
            }

            fn sub_filters(&self) -> usize {
                self.parts
                    .values()
                    .map(|f| f.sub_filters())
                    .sum::<usize>()
                    .max(1)
            }

            /// Adds from now on into `replica`'s series (without this every replica would
            /// fill writer 0's series, and the FPR bound would not hold).
            fn set_writer(&mut self, replica: ReplicaId) {
                self.writer = replica;
            }
        }
    };
}
writer_grow_only!(WriterScGBloom);
writer_grow_only!(WriterScGCuckoo);

impl WriterScOrCuckoo {
    /// Every entry, located by writer's series and sub-filter, in the order of
    /// [`crate::ObservedRemove::dots`] ([`crate::ReplicatedFilter::live_occurrences`]).
    pub fn live_occurrences(&self) -> Vec<Occurrence> {
        let mut v = Vec::new();
        for (w, f) in &self.parts {
            v.extend(
                f.live_occurrences()
                    .into_iter()
                    .map(|o| Occurrence { series: *w, ..o }),
            );
        }
        v
    }

    /// Re-adds `occurrences` (a dump's, located as in a filter of these parameters) under
    /// fresh tags of this replica, `count` entries each, and answers the tags, in order
    /// ([`crate::ReplicatedFilter::import_occurrences`]). Each goes into the writer's series
    /// and the sub-filter it came from, which alone its fingerprint fits: the one case where a
    /// series holds tags of a replica other than its writer (what each writer's series holds
    /// is still what that writer added, loaded again). Series and sub-filters are added as
    /// needed. All or nothing: a location that does not fit ([`FilterError::Incompatible`]), a
    /// sub-filter left past its room ([`FilterError::NoRoom`]: its slots, or what the dump's
    /// held if more) or past the limits, or too few timestamps left
    /// ([`FilterError::ClockExhausted`]) change nothing.
    ///
    /// ```
    /// use crpf::{Membership, Removable, ScalableParams, WriterScOrCuckoo};
    ///
    /// let params = ScalableParams::with_capacity(100, 0.01)?;
    /// let mut there = WriterScOrCuckoo::new(params, 0)?;
    /// for i in 0..300u32 { there.add(&i.to_le_bytes())?; }
    /// let mut here = WriterScOrCuckoo::new(params, 5)?;
    /// let tags = here.import(&there.live_occurrences())?;
    /// assert_eq!(tags.len(), 300);
    /// assert!(tags.iter().all(|t| t.replica == 5));
    /// assert!((0..300u32).all(|i| here.contains(&i.to_le_bytes())));
    /// assert!(here.remove(&7u32.to_le_bytes()) && !here.contains(&7u32.to_le_bytes()));
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn import(&mut self, occurrences: &[Occurrence]) -> Result<Vec<Dot>, FilterError> {
        let room = ImportRoom::of(FilterKind::WriterScOrCuckoo, occurrences);
        self.import_part(occurrences, &room)
    }

    /// [`WriterScOrCuckoo::import`] of a part of a dump, whose room (all of it) is `room`.
    pub fn import_part(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<Vec<Dot>, FilterError> {
        // Everything checked, and every series and sub-filter needed built, before anything
        // changes.
        let (new_parts, fresh) = self.prepare_import(occurrences, room)?;
        let start = self.clock();
        tags_to_issue(occurrences, self.writer, start)?;
        self.parts.extend(new_parts);
        for (w, subs) in fresh {
            self.parts.get_mut(&w).expect("built").append_subs(subs);
        }
        let mut dots = Vec::new();
        let mut counter = start;
        for o in occurrences.iter().filter(|o| o.count > 0) {
            let part = self.parts.get_mut(&o.series).expect("built");
            for _ in 0..o.count {
                counter += 1;
                let dot = Dot {
                    replica: self.writer,
                    counter,
                };
                part.place_occurrence(o, dot);
                dots.push(dot);
            }
        }
        // Tags placed in other writers' series are not in our own series' history.
        self.adopt_own_tags(Some(counter));
        Ok(dots)
    }

    /// Whether [`WriterScOrCuckoo::import_part`] would take `occurrences` now (leaving the
    /// clock aside): [`crate::ReplicatedFilter::check_import`].
    pub fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        self.prepare_import(occurrences, room).map(|_| ())
    }

    /// The series an import of `occurrences` adds (our own among them: it holds the clock of
    /// the tags issued) and the sub-filters it adds to each, all checked.
    #[allow(clippy::type_complexity)]
    fn prepare_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<
        (
            BTreeMap<ReplicaId, ScOrCuckoo>,
            Vec<(ReplicaId, Vec<crate::core::cuckoo::table::Table<u64>>)>,
        ),
        FilterError,
    > {
        let mut by_series: BTreeMap<ReplicaId, Vec<Occurrence>> = BTreeMap::new();
        for o in occurrences.iter().filter(|o| o.count > 0) {
            by_series.entry(o.series).or_default().push(*o);
        }
        if !by_series.is_empty() {
            by_series.entry(self.writer).or_default();
        }
        let mut new_parts = BTreeMap::new();
        let mut fresh = Vec::new();
        for (w, named) in by_series {
            let subs = match self.parts.get(&w) {
                Some(part) => part.subs_for(&named, w, room)?,
                None => {
                    let part = self.new_part(w)?;
                    let subs = part.subs_for(&named, w, room)?;
                    new_parts.insert(w, part);
                    subs
                }
            };
            fresh.push((w, subs));
        }
        Ok((new_parts, fresh))
    }
}

impl crate::core::kind::ReplicatedFilter for WriterScOrCuckoo {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::WriterScOrCuckoo;
    const REMOVABLE: bool = true;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        replica: ReplicaId,
    ) -> Result<Self, FilterError> {
        Self::with_first_writer(
            crate::core::kind::scalable_params(spec)?,
            replica,
            spec.first_writer(),
        )
    }

    fn params_digest(&self) -> u64 {
        self.params_digest_of_writers()
    }

    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        crate::core::kind::digest_observed_remove(self, h);
    }

    fn sub_filters(&self) -> usize {
        self.parts
            .values()
            .map(|f| f.sub_filters())
            .sum::<usize>()
            .max(1)
    }

    fn observed_remove(&self) -> Option<&dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn observed_remove_mut(&mut self) -> Option<&mut dyn crate::core::kind::ObservedRemove> {
        Some(self)
    }

    fn live_occurrences(&self) -> Vec<Occurrence> {
        WriterScOrCuckoo::live_occurrences(self)
    }

    fn import_occurrences(
        &mut self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<u64, FilterError> {
        self.import_part(occurrences, room)
            .map(|dots| dots.len() as u64)
    }

    fn check_import(
        &self,
        occurrences: &[Occurrence],
        room: &ImportRoom,
    ) -> Result<(), FilterError> {
        WriterScOrCuckoo::check_import(self, occurrences, room)
    }
}

/// The tag API over the writers' series: adds tag in this writer's own series, removes take a
/// random series holding the item (as [`Removable::remove`]), and the history joins every
/// series' history.
impl crate::core::kind::ObservedRemove for WriterScOrCuckoo {
    fn replica(&self) -> ReplicaId {
        self.writer
    }

    /// Adds from now on into `replica`'s series; the series of the former id stays, as that
    /// writer's.
    fn set_replica(&mut self, replica: ReplicaId) {
        self.writer = replica;
    }

    fn clock(&self) -> u64 {
        Partitioned::clock(self)
    }

    fn advance_clock(&mut self, floor: u64) {
        Partitioned::advance_clock(self, floor)
    }

    fn add_dot(&mut self, item: &[u8]) -> Result<crate::Dot, FilterError> {
        let (own, created) = self.own_part()?;
        let result = own.add_dot(item);
        if result.is_err() && created {
            self.parts.remove(&self.writer);
        }
        result
    }

    fn remove_dot(&mut self, item: &[u8]) -> Option<crate::Dot> {
        let holding: Vec<ReplicaId> = self
            .parts
            .iter()
            .filter(|(_, f)| f.contains(item))
            .map(|(w, _)| *w)
            .collect();
        if holding.is_empty() {
            return None;
        }
        let w = holding[self.rng.usize(..holding.len())];
        self.parts.get_mut(&w).expect("listed").remove_dot(item)
    }

    fn occurrences(&self, item: &[u8]) -> u64 {
        self.parts.values().map(|f| f.occurrences(item)).sum()
    }

    fn dots(&self) -> Vec<crate::Dot> {
        self.parts.values().flat_map(|f| f.dots()).collect()
    }

    fn history(&self) -> std::borrow::Cow<'_, crate::CausalContext> {
        let mut h = crate::CausalContext::new();
        for f in self.parts.values() {
            h.union(f.history());
        }
        std::borrow::Cow::Owned(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kind::ObservedRemove;

    fn params() -> ScalableParams {
        ScalableParams::with_capacity(40, 0.01).unwrap()
    }

    /// Writers 0 and 1 each added their own items, and merged.
    fn dumped() -> WriterScOrCuckoo {
        let mut a = WriterScOrCuckoo::new(params(), 0).unwrap();
        let mut b = WriterScOrCuckoo::new(params(), 1).unwrap();
        for i in 0..150u32 {
            a.add(&i.to_le_bytes()).unwrap();
            b.add(&(i + 1000).to_le_bytes()).unwrap();
            b.add(&(i + 1000).to_le_bytes()).unwrap();
        }
        a.merge(&b).unwrap();
        a
    }

    fn items() -> impl Iterator<Item = [u8; 4]> {
        (0..150u32).chain(1000..1150).map(u32::to_le_bytes)
    }

    /// Writers counted from 1: the first has half the bound, the shares of writers 1 to 50
    /// stay under it, writer 0 writes nothing (its adds, series and deltas are refused), and
    /// such a filter neither merges nor compares with one counting from 0.
    #[test]
    fn writers_counted_from_one() {
        let from_one = |w| WriterScGBloom::with_first_writer(params(), w, 1).unwrap();
        let mut a = from_one(1);
        let mut b = from_one(2);
        assert_eq!(a.part_params(1).unwrap().fpr, 0.005);
        assert!((b.part_params(2).unwrap().fpr - 0.01 / 6.0).abs() < 1e-15);
        let shares: f64 = (1..=50).map(|w| a.part_params(w).unwrap().fpr).sum();
        assert!(shares < 0.01, "{shares}");
        assert!(a.part_params(0).is_err());
        assert!(
            from_one(0).add(b"x").is_err(),
            "a placeholder writer adds nothing"
        );

        a.track_deltas(true);
        b.add(b"y").unwrap();
        a.add(b"x").unwrap();
        let delta = a.take_delta().unwrap();
        b.merge_delta(&delta).unwrap();
        a.merge(&b).unwrap();
        assert!(a.contains(b"y") && b.contains(b"x"));
        // Round trip: the first writer is in the encoding (and only where it is not 0).
        let bytes = serde_cbor::to_vec(&a).unwrap();
        let back: WriterScGBloom = serde_cbor::from_slice(&bytes).unwrap();
        assert!(back.le(&a) && a.le(&back) && back.first_writer() == 1);
        let fields = |bytes: &[u8]| match serde_cbor::from_slice(bytes).unwrap() {
            serde_cbor::Value::Map(m) => m.len(),
            v => panic!("{v:?}"),
        };
        assert_eq!(fields(&bytes), 4, "the first writer is encoded");
        let zero = serde_cbor::to_vec(&WriterScGBloom::new(params(), 1).unwrap()).unwrap();
        assert_eq!(fields(&zero), 3, "counting from 0 encodes as before");
        // A series of writer 0 under a filter counting from 1: refused.
        let mut foreign = WriterScGBloom::new(params(), 0).unwrap();
        foreign.track_deltas(true);
        foreign.add(b"z").unwrap();
        assert!(a.merge_delta(&foreign.take_delta().unwrap()).is_err());
        // Shares differ: the filters do not mix.
        let mut zero = WriterScGBloom::new(params(), 1).unwrap();
        zero.add(b"x").unwrap();
        assert!(a.merge(&zero).is_err() && zero.merge(&a).is_err());
        assert!(!zero.le(&a) && !a.le(&zero));
        use crate::core::kind::ReplicatedFilter;
        assert_ne!(a.params_digest(), zero.params_digest());
    }

    #[test]
    fn an_import_goes_into_each_writers_series_under_the_importers_tags() {
        let dump = dumped();
        // Writer 7 of another cluster, which holds an item of its own.
        let mut f = WriterScOrCuckoo::new(params(), 7).unwrap();
        f.add(b"mine").unwrap();
        f.track_deltas(true);
        let before = f.clone();
        let tags = f.import(&dump.live_occurrences()).unwrap();
        assert_eq!(tags.len(), 450);
        assert!(tags.iter().all(|t| t.replica == 7 && t.counter > 1));
        for item in items() {
            assert_eq!(f.occurrences(&item), dump.occurrences(&item));
        }
        let subs = |f: &WriterScOrCuckoo| -> Vec<(ReplicaId, usize)> {
            f.parts()
                .filter(|(w, _)| *w != 7)
                .map(|(w, p)| (w, p.sub_filters()))
                .collect()
        };
        assert_eq!(subs(&f), subs(&dump));
        assert!(f.contains(b"mine"));
        // Writers 0's and 1's series now hold writer 7's tags; its clock covers them.
        assert_eq!(f.clock(), tags.len() as u64 + 1);
        let next = f.add_dot(b"after").unwrap();
        assert!(next.counter > tags.iter().map(|t| t.counter).max().unwrap());
        // It encodes and decodes, merges into writer 1's replica, and replicates by delta.
        let back: WriterScOrCuckoo =
            serde_cbor::from_slice(&serde_cbor::to_vec(&f).unwrap()).unwrap();
        assert!(back.equivalent(&f));
        let delta = f.take_delta().unwrap();
        let mut peer = WriterScOrCuckoo::new(params(), 1).unwrap();
        peer.merge(&before).unwrap();
        peer.check_remote_delta(&delta).unwrap();
        peer.merge_delta(&delta).unwrap();
        assert!(peer.equivalent(&f));
        peer.merge(&f).unwrap();
        // The peer removes an imported occurrence, and the importer takes the remove.
        assert!(peer.remove(&1000u32.to_le_bytes()));
        f.merge(&peer).unwrap();
        assert_eq!(f.occurrences(&1000u32.to_le_bytes()), 1);
    }

    #[test]
    fn a_replayed_import_moves_the_clock_past_its_tags() {
        let dump = dumped();
        let mut f = WriterScOrCuckoo::new(params(), 5).unwrap();
        let before = f.clone();
        f.track_deltas(true);
        let tags = f.import(&dump.live_occurrences()).unwrap();
        let delta = f.take_delta().unwrap();
        // The log's records replayed on the state before: the tags in writers 0's and 1's
        // series are ours, and are never issued again.
        let mut replayed = before.clone();
        replayed.merge_own_delta(&delta).unwrap();
        assert!(replayed.equivalent(&f));
        assert_eq!(replayed.clock(), tags.len() as u64);
        // Likewise a merge of a state that holds them.
        let mut merged = before;
        merged.merge(&f).unwrap();
        assert_eq!(merged.clock(), tags.len() as u64);
    }

    #[test]
    fn a_refused_import_changes_nothing() {
        let dump = dumped();
        let mut f = WriterScOrCuckoo::new(params(), 2).unwrap();
        f.add(b"x").unwrap();
        let encoded = |f: &WriterScOrCuckoo| serde_cbor::to_vec(f).unwrap();
        let before = encoded(&f);
        let good = dump.live_occurrences();
        let mut bad = good.clone();
        bad.push(Occurrence {
            bucket: u64::MAX,
            ..good[0]
        });
        assert!(matches!(f.import(&bad), Err(FilterError::Incompatible(_))));
        assert_eq!(encoded(&f), before);
        f.advance_clock(crate::MAX_COUNTER - 3);
        let before = encoded(&f);
        assert!(matches!(
            f.import(&good),
            Err(FilterError::ClockExhausted { .. })
        ));
        assert_eq!(encoded(&f), before);
    }
}
