//! t-digest (Dunning's merging digest) replicated as a state-based CRDT: RedisBloom's
//! `TDIGEST.*` with quantiles that converge.
//!
//! **One digest** ([`Digest`]) is RedisBloom's (its `t-digest-c`, reimplemented from its
//! description): centroids `(mean, weight)` sorted by mean, a buffer of unmerged ones of
//! `6·compression + 10` slots in all, compressed when full or read by one left-to-right pass
//! that merges neighbours while `w·c / (2π·N·ln N) ≤ q(1-q)` at both ends of the merged
//! centroid. The exact min and max are kept; quantile, CDF, rank and trimmed mean
//! interpolate between centroids as RedisBloom does, so one replica answers RedisBloom's
//! replies for the same adds while every value is its own centroid, and within its error
//! after (RedisBloom keeps its buffer compressed by every read, this state does not).
//!
//! **State.** Per writing replica, a *part*: its own values only, in at most
//! [`MAX_SEGMENTS`] digests (*segments*) each tagged with the writer's version it started
//! at, and the part's version, raised by every change its writer makes. Merge keeps, per
//! writer, the part of the higher version (a register with a single writer: no conflict).
//! A writer seals its segment when its delta is taken, so every version a peer can learn
//! from a delta starts or ends a segment. Beside the parts, a *reset floor* per writer
//! (merge: the maximum): a segment is visible only if it started at or after its writer's
//! floor.
//!
//! **Reads** join the visible segments, writers by id and segments in order, into one digest
//! compressed at the key's compression: a function of the state, so converged replicas
//! answer the same.
//!
//! **`RESET`** raises every writer's floor to the version of the part it holds: it removes
//! exactly the values it observed. A writer's adds it did not observe went into a later
//! segment (sealed at the delta the reset saw) and survive, as an OR-Set's concurrent adds
//! do. A writer drops its invisible segments at its next update. Two bounds: a reset that
//! saw a writer through a full state (anti-entropy) between two of its deltas removes the
//! segment that was open then, with the adds made to it since; and a writer keeps
//! [`MAX_SEGMENTS`] segments, merging its two oldest when it needs another, so a reset whose
//! view of it is older than its last few deltas removes the merged segment whole. In both
//! cases the reset wins over the few adds sharing a segment with what it saw.
//!
//! **Memory.** Per writing replica, at most [`MAX_SEGMENTS`] digests of `6·c + 10`
//! centroids (16 bytes each): [`TdigestParams::memory_bytes`]. Readers cost a floor each.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::causal::{ReplicaId, check_own_dots};
use crate::core::delta::{CheckRemote, DeltaState};
use crate::core::error::FilterError;
use crate::core::kind::{FilterKind, FilterSpec};
use crate::core::lattice::{Lattice, Membership};
use crate::core::params::MAX_FILTER_BYTES;

/// Segments a writer's part keeps at most: a reset's view of a writer older than its last
/// `MAX_SEGMENTS - 1` deltas may remove adds that followed it (see the module's doc).
pub const MAX_SEGMENTS: usize = 8;

/// A t-digest's shape: its compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TdigestParams {
    /// RedisBloom's compression (100 by default): centroids kept are about this many.
    pub compression: u32,
}

impl TdigestParams {
    /// RedisBloom's default compression.
    pub const DEFAULT_COMPRESSION: u32 = 100;
    /// Bytes of a centroid (mean and weight).
    pub const CENTROID_BYTES: u64 = 16;

    /// A digest of `compression`, checked.
    pub fn new(compression: u32) -> Result<Self, FilterError> {
        TdigestParams { compression }.validated()
    }

    /// The digest of a spec ([`FilterSpec::t_digest`]): `capacity` is the compression.
    pub fn from_spec(spec: &FilterSpec) -> Result<Self, FilterError> {
        let compression = u32::try_from(spec.capacity).map_err(|_| {
            FilterError::invalid("capacity", "a t-digest's compression is below 2^32")
        })?;
        Self::new(compression)
    }

    /// `Ok` if the compression is at least 1 and one writer's part fits
    /// [`MAX_FILTER_BYTES`].
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.compression == 0 {
            return Err(FilterError::invalid(
                "compression",
                "must be a positive integer",
            ));
        }
        let needed = self.memory_bytes();
        if needed > MAX_FILTER_BYTES {
            return Err(FilterError::TooLarge {
                needed,
                limit: MAX_FILTER_BYTES,
            });
        }
        Ok(self)
    }

    /// Centroids one digest holds at most, merged and buffered (RedisBloom's `cap`).
    pub fn capacity(&self) -> usize {
        6 * self.compression as usize + 10
    }

    /// Bytes of one writer's part at most: [`MAX_SEGMENTS`] full digests.
    pub fn memory_bytes(&self) -> u64 {
        (MAX_SEGMENTS as u64) * (6 * u64::from(self.compression) + 10) * Self::CENTROID_BYTES
    }

    /// Digest of the parameters.
    pub fn digest(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"t_digest/merging+parts");
        h.update(&self.compression.to_le_bytes());
        h.digest()
    }
}

/// One merging t-digest, as RedisBloom keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Digest {
    compression: f64,
    cap: usize,
    /// Sorted by mean (after a compression).
    merged: Vec<(f64, u64)>,
    merged_weight: u64,
    unmerged: Vec<(f64, u64)>,
    unmerged_weight: u64,
    min: f64,
    max: f64,
    compressions: u64,
}

/// What [`Digest::info`] reports (RedisBloom's `TDIGEST.INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DigestInfo {
    /// Centroids compressed.
    pub merged_nodes: u64,
    /// Centroids buffered.
    pub unmerged_nodes: u64,
    /// Weight compressed.
    pub merged_weight: u64,
    /// Weight buffered.
    pub unmerged_weight: u64,
    /// Compressions so far.
    pub compressions: u64,
}

impl Digest {
    /// An empty digest of `params`.
    pub fn new(params: TdigestParams) -> Self {
        Digest {
            compression: f64::from(params.compression),
            cap: params.capacity(),
            merged: Vec::new(),
            merged_weight: 0,
            unmerged: Vec::new(),
            unmerged_weight: 0,
            min: f64::MAX,
            max: -f64::MAX,
            compressions: 0,
        }
    }

    /// Values (weights) in all.
    pub fn size(&self) -> u64 {
        self.merged_weight + self.unmerged_weight
    }

    /// The smallest value (meaningless while empty).
    pub fn min(&self) -> f64 {
        self.min
    }

    /// The largest value (meaningless while empty).
    pub fn max(&self) -> f64 {
        self.max
    }

    /// Centroids held, merged and buffered.
    pub fn centroids(&self) -> usize {
        self.merged.len() + self.unmerged.len()
    }

    /// The counts `TDIGEST.INFO` reports.
    pub fn info(&self) -> DigestInfo {
        DigestInfo {
            merged_nodes: self.merged.len() as u64,
            unmerged_nodes: self.unmerged.len() as u64,
            merged_weight: self.merged_weight,
            unmerged_weight: self.unmerged_weight,
            compressions: self.compressions,
        }
    }

    /// Whether `weight` more keeps the total within `i64` (RedisBloom's `long long`).
    fn fits(&self, weight: u64) -> bool {
        self.size()
            .checked_add(weight)
            .is_some_and(|t| t <= i64::MAX as u64)
    }

    /// Adds a centroid (RedisBloom's `td_add`), compressing first when the buffer is full.
    /// The caller checked `mean` finite, `weight` positive and [`Digest::fits`].
    fn add(&mut self, mean: f64, weight: u64) {
        if self.centroids() + 1 >= self.cap {
            self.compress();
        }
        self.min = self.min.min(mean);
        self.max = self.max.max(mean);
        self.unmerged.push((mean, weight));
        self.unmerged_weight = self.unmerged_weight.saturating_add(weight);
    }

    /// Adds every centroid of `other` and its bounds (RedisBloom's `td_merge`).
    fn absorb(&mut self, other: &Digest) {
        let mut other = other.clone();
        other.compress();
        for &(m, w) in &other.merged {
            self.add(m, w);
        }
        if other.size() > 0 {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
        }
    }

    /// RedisBloom's `td_compress`: sorts every centroid by mean and merges neighbours while
    /// the scale function allows.
    pub fn compress(&mut self) {
        if self.unmerged.is_empty() {
            return;
        }
        let mut nodes = std::mem::take(&mut self.merged);
        nodes.append(&mut self.unmerged);
        nodes.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = self.merged_weight.saturating_add(self.unmerged_weight);
        self.merged_weight = total;
        self.unmerged_weight = 0;
        self.compressions += 1;
        let total_f = total as f64;
        if total_f <= 1.0 {
            self.merged = nodes;
            return;
        }
        let normalizer = self.compression / (2.0 * std::f64::consts::PI * total_f * total_f.ln());
        let mut out: Vec<(f64, u64)> = Vec::with_capacity(nodes.len());
        let mut weight_so_far = 0.0;
        let mut nodes = nodes.into_iter();
        let Some(first) = nodes.next() else { return };
        out.push(first);
        for (mean, weight) in nodes {
            let cur = out.last_mut().expect("one pushed");
            let proposed = cur.1 as f64 + weight as f64;
            let z = proposed * normalizer;
            let q0 = weight_so_far / total_f;
            let q2 = (weight_so_far + proposed) / total_f;
            if z <= q0 * (1.0 - q0) && z <= q2 * (1.0 - q2) {
                cur.1 = cur.1.saturating_add(weight);
                cur.0 += (mean - cur.0) * weight as f64 / cur.1 as f64;
            } else {
                weight_so_far += cur.1 as f64;
                out.push((mean, weight));
            }
        }
        self.merged = out;
    }

    /// This digest compressed, for reads (a read leaves the state as it is).
    pub fn compressed(&self) -> Digest {
        let mut d = self.clone();
        d.compress();
        d
    }

    /// The compressed centroids `(mean, weight)`, by mean.
    pub fn merged_centroids(&self) -> Vec<(f64, u64)> {
        self.merged.clone()
    }

    fn mean(&self, i: usize) -> f64 {
        self.merged[i].0
    }

    fn weight(&self, i: usize) -> f64 {
        self.merged[i].1 as f64
    }

    /// RedisBloom's `td_cdf` (of a compressed digest): the fraction of values `<= value`,
    /// half of those equal counted; NaN while empty.
    pub fn cdf(&self, value: f64) -> f64 {
        let n = self.merged.len();
        if n == 0 {
            return f64::NAN;
        }
        if value < self.min {
            return 0.0;
        }
        if value > self.max {
            return 1.0;
        }
        if n == 1 {
            // RedisBloom's: every value within [min, max] answers one half.
            return 0.5;
        }
        let total = self.merged_weight as f64;
        let (first_mean, first_weight) = (self.mean(0), self.weight(0));
        if value < first_mean {
            let width = first_mean - self.min;
            return match width > 0.0 {
                true if value == self.min => 0.5 / total,
                true => (1.0 + (value - self.min) / width * (first_weight / 2.0 - 1.0)) / total,
                false => 0.0,
            };
        }
        let (last_mean, last_weight) = (self.mean(n - 1), self.weight(n - 1));
        if value > last_mean {
            let width = self.max - last_mean;
            return match width > 0.0 {
                true if value == self.max => 1.0 - 0.5 / total,
                true => {
                    1.0 - (1.0 + (self.max - value) / width * (last_weight / 2.0 - 1.0)) / total
                }
                false => 1.0,
            };
        }
        let mut so_far = 0.0;
        let mut it = 0;
        while it < n - 1 {
            if self.mean(it) == value {
                let mut dw = 0.0;
                while it < n && self.mean(it) == value {
                    dw += self.weight(it);
                    it += 1;
                }
                return (so_far + dw / 2.0) / total;
            }
            let (m, w) = (self.mean(it), self.weight(it));
            let (m_next, w_next) = (self.mean(it + 1), self.weight(it + 1));
            if m <= value && value < m_next {
                let dw = (w + w_next) / 2.0;
                if m_next - m <= 0.0 {
                    return (so_far + dw) / total;
                }
                let (mut left_excluded, mut right_excluded) = (0.0, 0.0);
                if w == 1.0 {
                    if w_next == 1.0 {
                        return (so_far + 1.0) / total;
                    }
                    left_excluded = 0.5;
                } else if w_next == 1.0 {
                    right_excluded = 0.5;
                }
                let base = so_far + w / 2.0 + left_excluded;
                let spread = dw - left_excluded - right_excluded;
                return (base + spread * (value - m) / (m_next - m)) / total;
            }
            so_far += w;
            it += 1;
        }
        1.0 - 0.5 / total
    }

    /// RedisBloom's walk to the value at `index` (a rank in weights), continuing from
    /// `(so_far, pos)` (ascending indexes continue where the last stopped).
    fn value_at(&self, index: f64, so_far: &mut f64, pos: &mut usize) -> f64 {
        let n = self.merged.len();
        let total = self.merged_weight as f64;
        let first_weight = self.weight(0);
        if first_weight > 1.0 && index < first_weight / 2.0 {
            return self.min
                + (index - 1.0) / (first_weight / 2.0 - 1.0) * (self.mean(0) - self.min);
        }
        if index > total - 1.0 {
            return self.max;
        }
        let (last_mean, last_weight) = (self.mean(n - 1), self.weight(n - 1));
        if last_weight > 1.0 && total - index <= last_weight / 2.0 {
            return self.max
                - (total - index - 1.0) / (last_weight / 2.0 - 1.0) * (self.max - last_mean);
        }
        while *pos < n - 1 {
            let i = *pos;
            let (m, w) = (self.mean(i), self.weight(i));
            let (m_next, w_next) = (self.mean(i + 1), self.weight(i + 1));
            let dw = (w + w_next) / 2.0;
            if *so_far + dw > index {
                let mut left_unit = 0.0;
                if w == 1.0 {
                    if index - *so_far < 0.5 {
                        return m;
                    }
                    left_unit = 0.5;
                }
                let mut right_unit = 0.0;
                if w_next == 1.0 {
                    if *so_far + dw - index <= 0.5 {
                        return m_next;
                    }
                    right_unit = 0.5;
                }
                let z1 = index - *so_far - left_unit;
                let z2 = *so_far + dw - index - right_unit;
                return weighted_average(m, z2, m_next, z1);
            }
            *so_far += dw;
            *pos += 1;
        }
        let z1 = index - total - last_weight / 2.0;
        let z2 = last_weight / 2.0 - z1;
        weighted_average(last_mean, z1, self.max, z2)
    }

    /// RedisBloom's `td_quantile` (of a compressed digest): the value below which the
    /// fraction `q` of the values lie; NaN while empty or outside `[0, 1]`.
    pub fn quantile(&self, q: f64) -> f64 {
        if !(0.0..=1.0).contains(&q) || self.merged.is_empty() {
            return f64::NAN;
        }
        if self.merged.len() == 1 {
            return self.mean(0);
        }
        let index = q * self.merged_weight as f64;
        if index < 1.0 {
            return self.min;
        }
        let (mut so_far, mut pos) = (self.weight(0) / 2.0, 0);
        self.value_at(index, &mut so_far, &mut pos)
    }

    /// `TDIGEST.QUANTILE`'s answers (of a compressed digest): each ascending run of `qs`
    /// walked once, as RedisBloom's `td_quantiles` walks it (which, unlike
    /// [`Digest::quantile`], does not answer the min below rank 1).
    pub fn quantiles(&self, qs: &[f64]) -> Vec<f64> {
        let n = self.merged.len();
        let mut out = Vec::with_capacity(qs.len());
        let mut i = 0;
        while i < qs.len() {
            let start = i;
            while i + 1 < qs.len() && qs[i] <= qs[i + 1] {
                i += 1;
            }
            let run = &qs[start..=i];
            i += 1;
            if n <= 1 {
                out.extend(
                    run.iter()
                        .map(|&q| match n == 1 && (0.0..=1.0).contains(&q) {
                            true => self.mean(0),
                            false => f64::NAN,
                        }),
                );
                continue;
            }
            let (mut so_far, mut pos) = (self.weight(0) / 2.0, 0);
            for &q in run {
                let index = q * self.merged_weight as f64;
                out.push(self.value_at(index, &mut so_far, &mut pos));
            }
        }
        out
    }

    /// RedisBloom's `td_trimmed_mean` (of a compressed digest): the mean of the values
    /// between the `low` and `high` fractions.
    pub fn trimmed_mean(&self, low: f64, high: f64) -> f64 {
        let n = self.merged.len();
        if n == 0 || !(0.0..=1.0).contains(&low) || !(0.0..=1.0).contains(&high) {
            return f64::NAN;
        }
        if n == 1 {
            return self.mean(0);
        }
        let total = self.merged_weight as f64;
        let (left, right) = ((total * low).floor(), (total * high).ceil());
        let (mut done, mut sum, mut count) = (0.0, 0.0, 0.0);
        for &(mean, weight) in &self.merged {
            let w = weight as f64;
            let mut add = w;
            add -= (left - done).max(0.0).min(add);
            add = (right - done).max(0.0).min(add);
            done += w;
            sum += mean * add;
            count += add;
            if done >= right {
                break;
            }
        }
        sum / count
    }

    /// `TDIGEST.RANK` (`reverse`: `REVRANK`) of `value` (of a compressed digest): -2 while
    /// empty, -1 or the size outside the values, else the CDF rounded as RedisBloom does.
    pub fn rank(&self, value: f64, reverse: bool) -> i64 {
        let size = self.size() as f64;
        if size == 0.0 {
            return -2;
        }
        if value < self.min {
            return if reverse { size as i64 } else { -1 };
        }
        if value > self.max {
            return if reverse { -1 } else { size as i64 };
        }
        let at = self.cdf(value) * size;
        match reverse {
            true => (size - at.round()).round() as i64,
            false => half_round_down(at) as i64,
        }
    }

    /// `TDIGEST.BYRANK` (`reverse`: `BYREVRANK`) of `rank` (of a compressed digest).
    pub fn by_rank(&self, rank: u64, reverse: bool) -> f64 {
        let size = self.size() as f64;
        let rank_f = rank as f64;
        if size == 0.0 {
            f64::NAN
        } else if rank == 0 {
            if reverse { self.max } else { self.min }
        } else if rank_f >= size {
            if reverse {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }
        } else {
            let r = if reverse { size - rank_f - 1.0 } else { rank_f };
            self.quantile(r / size)
        }
    }

    fn check(&self, params: TdigestParams) -> Result<(), FilterError> {
        let centroids = self.merged.iter().chain(&self.unmerged);
        if self.merged.len() + self.unmerged.len() > params.capacity() {
            return Err(FilterError::malformed("more centroids than the capacity"));
        }
        let mut sum = [0u64; 2];
        for (part, nodes) in [&self.merged, &self.unmerged].into_iter().enumerate() {
            for &(_, w) in nodes {
                sum[part] = sum[part]
                    .checked_add(w)
                    .ok_or_else(|| FilterError::malformed("weights overflow"))?;
            }
        }
        if sum != [self.merged_weight, self.unmerged_weight]
            || !self.fits(0)
            || centroids.clone().any(|&(m, w)| !m.is_finite() || w == 0)
            || centroids
                .clone()
                .any(|&(m, _)| m < self.min || m > self.max)
            || (self.size() > 0 && !(self.min.is_finite() && self.max.is_finite()))
        {
            return Err(FilterError::malformed("an inconsistent digest"));
        }
        Ok(())
    }
}

/// RedisBloom's `weighted_average`: between the two means whatever the rounding.
fn weighted_average(x1: f64, w1: f64, x2: f64, w2: f64) -> f64 {
    let (x1, w1, x2, w2) = if x1 <= x2 {
        (x1, w1, x2, w2)
    } else {
        (x2, w2, x1, w1)
    };
    let x = (x1 * w1 + x2 * w2) / (w1 + w2);
    x1.max(x.min(x2))
}

/// RedisBloom's `_halfRoundDown`: halves round towards zero.
fn half_round_down(f: f64) -> f64 {
    let int = f.trunc();
    let frac = f - int;
    if frac.abs() <= 0.5 {
        int
    } else if int >= 0.0 {
        int + 1.0
    } else {
        int - 1.0
    }
}

/// One segment of a writer's part: the values it added from version `start` on, until it
/// sealed the segment.
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    start: u64,
    digest: Digest,
}

/// One writer's values.
#[derive(Debug, Clone, PartialEq)]
struct Part {
    version: u64,
    segments: Vec<Segment>,
}

impl Part {
    /// A total order's key beyond the version (parts of one version differ only if two
    /// writers shared an id, or a state was forged): the join keeps the greater.
    fn key(&self) -> Vec<u64> {
        let mut k = Vec::new();
        for s in &self.segments {
            k.push(s.start);
            let d = &s.digest;
            for nodes in [&d.merged, &d.unmerged] {
                k.push(nodes.len() as u64);
                k.extend(nodes.iter().flat_map(|&(m, w)| [m.to_bits(), w]));
            }
            k.extend([d.min.to_bits(), d.max.to_bits(), d.compressions]);
        }
        k
    }

    fn cmp_join(&self, other: &Part) -> std::cmp::Ordering {
        self.version
            .cmp(&other.version)
            .then_with(|| self.key().cmp(&other.key()))
    }
}

/// A t-digest replicated by parts of every writer and reset floors (see the module's doc).
#[derive(Clone)]
pub struct TDigest {
    params: TdigestParams,
    writer: ReplicaId,
    parts: BTreeMap<ReplicaId, Part>,
    floors: BTreeMap<ReplicaId, u64>,
    /// The next add opens a segment (its delta was taken since the last).
    seal: bool,
    tracking: bool,
    /// Changes of this replica's part since the last delta.
    part_changes: usize,
    /// Whether a reset raised floors since the last delta.
    floors_changed: bool,
    /// [`TDigest::view`], made at the first read after a change (joining up to 8 segments
    /// per writer cost a `TDIGEST.QUANTILE` ~13 µs of CPU at each read); emptied by every
    /// change of `parts` or `floors` ([`TDigest::changed`]).
    view: std::sync::OnceLock<std::sync::Arc<Digest>>,
}

/// A delta of a [`TDigest`]: its writer's part and, after a reset, every floor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TdigestDelta {
    /// The writer's part, whole.
    pub parts: Vec<PartRepr>,
    /// `(writer, floor)`.
    pub floors: Vec<(ReplicaId, u64)>,
}

/// A part as encoded: writer, version, segments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartRepr(pub ReplicaId, pub u64, pub Vec<SegmentRepr>);

/// A segment as encoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentRepr {
    /// The writer's version it started at.
    pub start: u64,
    /// Smallest and largest value.
    pub bounds: (f64, f64),
    /// Compressed centroids `(mean, weight)`.
    pub merged: Vec<(f64, u64)>,
    /// Buffered centroids.
    pub unmerged: Vec<(f64, u64)>,
    /// Compressions so far.
    pub compressions: u64,
}

impl PartRepr {
    fn to_part(&self, params: TdigestParams) -> Result<(ReplicaId, Part), FilterError> {
        let PartRepr(id, version, segments) = self;
        if segments.len() > MAX_SEGMENTS {
            return Err(FilterError::malformed("more segments than a part keeps"));
        }
        if segments.windows(2).any(|w| w[0].start >= w[1].start)
            || segments.last().is_some_and(|s| s.start >= *version)
        {
            return Err(FilterError::malformed("segments out of order or ahead"));
        }
        let mut out = Vec::with_capacity(segments.len());
        for s in segments {
            if s.merged.len() + s.unmerged.len() > params.capacity() {
                return Err(FilterError::malformed("more centroids than the capacity"));
            }
            let mut d = Digest::new(params);
            d.merged = s.merged.clone();
            d.unmerged = s.unmerged.clone();
            d.merged_weight = s.merged.iter().fold(0u64, |a, c| a.saturating_add(c.1));
            d.unmerged_weight = s.unmerged.iter().fold(0u64, |a, c| a.saturating_add(c.1));
            (d.min, d.max) = s.bounds;
            d.compressions = s.compressions;
            if d.size() == 0 {
                (d.min, d.max) = (f64::MAX, -f64::MAX);
            }
            d.check(params)?;
            out.push(Segment {
                start: s.start,
                digest: d,
            });
        }
        Ok((
            *id,
            Part {
                version: *version,
                segments: out,
            },
        ))
    }
}

impl Part {
    fn to_repr(&self, id: ReplicaId) -> PartRepr {
        PartRepr(
            id,
            self.version,
            self.segments
                .iter()
                .map(|s| SegmentRepr {
                    start: s.start,
                    bounds: (s.digest.min, s.digest.max),
                    merged: s.digest.merged.clone(),
                    unmerged: s.digest.unmerged.clone(),
                    compressions: s.digest.compressions,
                })
                .collect(),
        )
    }
}

impl TDigest {
    /// An empty digest whose local adds count as `writer`'s.
    pub fn new(params: TdigestParams, writer: ReplicaId) -> Self {
        TDigest {
            params,
            writer,
            parts: BTreeMap::new(),
            floors: BTreeMap::new(),
            seal: true,
            tracking: false,
            part_changes: 0,
            floors_changed: false,
            view: std::sync::OnceLock::new(),
        }
    }

    /// `parts` or `floors` changed (or may have): the view is made anew at the next read.
    fn changed(&mut self) {
        self.view.take();
    }

    /// The shape.
    pub fn params(&self) -> &TdigestParams {
        &self.params
    }

    /// The replica local adds count under.
    pub fn writer(&self) -> ReplicaId {
        self.writer
    }

    /// Replicas whose parts the state holds.
    pub fn writers(&self) -> usize {
        self.parts.len()
    }

    /// The version of this replica's part (0 before its first change).
    pub fn own_version(&self) -> u64 {
        self.parts.get(&self.writer).map_or(0, |p| p.version)
    }

    fn floor(&self, id: ReplicaId) -> u64 {
        self.floors.get(&id).copied().unwrap_or(0)
    }

    /// The segments reads see, writers by id, each writer's in order.
    fn visible(&self) -> impl Iterator<Item = &Digest> {
        self.parts.iter().flat_map(move |(id, p)| {
            let floor = self.floor(*id);
            p.segments
                .iter()
                .filter(move |s| s.start >= floor)
                .map(|s| &s.digest)
        })
    }

    /// Centroids held in all (every segment, visible or not).
    pub fn centroids(&self) -> usize {
        self.parts
            .values()
            .flat_map(|p| &p.segments)
            .map(|s| s.digest.centroids())
            .sum()
    }

    /// Bytes the centroids take.
    pub fn memory_bytes(&self) -> u64 {
        self.centroids() as u64 * TdigestParams::CENTROID_BYTES
    }

    /// The digest reads answer from: the visible segments joined, compressed. One segment
    /// alone is itself compressed (RedisBloom's answers for one writer); several are
    /// compressed once, every segment's centroids together, so that the centroids are sized
    /// for the whole (merging them one by one, as `TDIGEST.MERGE` does, compresses at each
    /// full buffer for a partial total: BENCHMARKS.md measured the difference).
    /// Made once per change of the state and shared by the reads until the next.
    pub fn view(&self) -> std::sync::Arc<Digest> {
        self.view
            .get_or_init(|| std::sync::Arc::new(self.make_view()))
            .clone()
    }

    fn make_view(&self) -> Digest {
        let segments: Vec<&Digest> = self.visible().filter(|d| d.size() > 0).collect();
        match segments[..] {
            [] => return Digest::new(self.params),
            [one] => return one.compressed(),
            _ => {}
        }
        let mut out = Digest::new(self.params);
        for d in segments {
            // Past 2^63 values (no replica adds so many: a forged state) the rest is left out.
            if !out.fits(d.size()) {
                continue;
            }
            let d = d.compressed();
            out.unmerged.extend_from_slice(&d.merged);
            out.unmerged_weight += d.merged_weight;
            out.min = out.min.min(d.min);
            out.max = out.max.max(d.max);
        }
        out.compress();
        out
    }

    /// `TDIGEST.INFO`'s counts over the visible segments.
    pub fn info(&self) -> DigestInfo {
        self.visible().fold(DigestInfo::default(), |a, d| {
            let i = d.info();
            DigestInfo {
                merged_nodes: a.merged_nodes + i.merged_nodes,
                unmerged_nodes: a.unmerged_nodes + i.unmerged_nodes,
                merged_weight: a.merged_weight.saturating_add(i.merged_weight),
                unmerged_weight: a.unmerged_weight.saturating_add(i.unmerged_weight),
                compressions: a.compressions + i.compressions,
            }
        })
    }

    /// Values seen in all.
    pub fn size(&self) -> u64 {
        self.visible().fold(0u64, |a, d| a.saturating_add(d.size()))
    }

    /// Drops this replica's segments below its floor (a reset saw them): a new version.
    fn drop_invisible_own(&mut self) {
        self.changed();
        let floor = self.floor(self.writer);
        if let Some(p) = self.parts.get_mut(&self.writer) {
            let before = p.segments.len();
            p.segments.retain(|s| s.start >= floor);
            if p.segments.len() != before {
                p.version = p.version.saturating_add(1);
                self.part_changes += usize::from(self.tracking);
            }
        }
    }

    /// Adds the centroids `(value, weight)` as this replica's (`TDIGEST.ADD` adds weight 1;
    /// `TDIGEST.MERGE` a source's centroids), with `bounds` (a source's min and max) if
    /// given. All or nothing: a value not finite, a weight of 0 or a total past `i64`
    /// changes nothing.
    pub fn add_weighted(
        &mut self,
        values: &[(f64, u64)],
        bounds: Option<(f64, f64)>,
    ) -> Result<(), FilterError> {
        if values.iter().any(|&(v, w)| !v.is_finite() || w == 0)
            || bounds.is_some_and(|(a, b)| !(a.is_finite() && b.is_finite() && a <= b))
        {
            return Err(FilterError::invalid(
                "value",
                "values are finite numbers of positive weight",
            ));
        }
        let weight = values
            .iter()
            .try_fold(0u64, |a, v| a.checked_add(v.1))
            .filter(|&w| {
                // RedisBloom's bound: the values of every writer, this add's included.
                w.checked_add(self.size())
                    .is_some_and(|total| total <= i64::MAX as u64)
            })
            .ok_or(FilterError::Overflow {
                what: "the count of values",
            })?;
        if values.is_empty() {
            return Ok(());
        }
        if self.own_version() >= u64::MAX - 1 {
            return Err(FilterError::ClockExhausted {
                replica: self.writer,
            });
        }
        let own_size = self.parts.get(&self.writer).map_or(0, |p| {
            p.segments
                .iter()
                .fold(0u64, |a, s| a.saturating_add(s.digest.size()))
        });
        if own_size
            .checked_add(weight)
            .is_none_or(|t| t > i64::MAX as u64)
        {
            return Err(FilterError::Overflow {
                what: "the count of values",
            });
        }
        self.drop_invisible_own();
        self.changed();
        let params = self.params;
        let part = self.parts.entry(self.writer).or_insert(Part {
            version: 0,
            segments: Vec::new(),
        });
        if self.seal || part.segments.is_empty() {
            // A sealed segment takes only its centroids from now on.
            if let Some(last) = part.segments.last_mut() {
                last.digest.compress();
            }
            if part.segments.len() >= MAX_SEGMENTS {
                let second = part.segments.remove(1);
                part.segments[0].digest.absorb(&second.digest);
            }
            part.segments.push(Segment {
                start: part.version,
                digest: Digest::new(params),
            });
            self.seal = false;
        }
        let d = &mut part.segments.last_mut().expect("one pushed").digest;
        for &(v, w) in values {
            d.add(v, w);
        }
        if let Some((lo, hi)) = bounds {
            d.min = d.min.min(lo);
            d.max = d.max.max(hi);
        }
        part.version += 1;
        self.part_changes += usize::from(self.tracking) * values.len();
        Ok(())
    }

    /// Adds values of weight 1 (`TDIGEST.ADD`).
    pub fn add_values(&mut self, values: &[f64]) -> Result<(), FilterError> {
        let weighted: Vec<(f64, u64)> = values.iter().map(|&v| (v, 1)).collect();
        self.add_weighted(&weighted, None)
    }

    /// `TDIGEST.RESET`: removes every value this state holds (every writer's floor raised to
    /// the version of its part here); whether anything changed.
    pub fn reset(&mut self) -> bool {
        self.changed();
        let mut changed = false;
        for (id, p) in &self.parts {
            let floor = self.floors.entry(*id).or_insert(0);
            if p.version > *floor {
                *floor = p.version;
                changed = true;
            }
        }
        self.floors_changed |= changed && self.tracking;
        self.drop_invisible_own();
        changed
    }

    fn join_part(&mut self, id: ReplicaId, part: &Part) {
        match self.parts.get(&id) {
            Some(mine) if mine.cmp_join(part).is_ge() => {}
            _ => {
                self.changed();
                self.parts.insert(id, part.clone());
            }
        }
    }

    fn join_floors(&mut self, floors: impl Iterator<Item = (ReplicaId, u64)>) {
        self.changed();
        for (id, f) in floors {
            let mine = self.floors.entry(id).or_insert(0);
            *mine = (*mine).max(f);
        }
    }

    fn checked_parts(&self, reprs: &[PartRepr]) -> Result<Vec<(ReplicaId, Part)>, FilterError> {
        if reprs.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(FilterError::malformed("parts not strictly ascending"));
        }
        reprs.iter().map(|r| r.to_part(self.params)).collect()
    }

    fn own_ahead(
        &self,
        parts: impl Iterator<Item = (ReplicaId, u64)>,
        floors: impl Iterator<Item = (ReplicaId, u64)>,
    ) -> Result<(), FilterError> {
        let me = self.writer;
        for (id, v) in parts.chain(floors) {
            if id == me {
                check_own_dots(me, self.own_version(), v)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for TDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TDigest")
            .field("params", &self.params)
            .field("writer", &self.writer)
            .field("parts", &self.parts.len())
            .field("floors", &self.floors)
            .field("size", &self.size())
            .finish()
    }
}

impl Lattice for TDigest {
    /// Per writer the part of the higher version; floors their maximum.
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("t-digest", &self.params, &other.params)?;
        for (id, p) in &other.parts {
            self.join_part(*id, p);
        }
        self.join_floors(other.floors.iter().map(|(i, f)| (*i, *f)));
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        self.params == other.params
            && self.parts.iter().all(|(id, p)| match other.parts.get(id) {
                Some(o) => p.cmp_join(o).is_le(),
                None => p.version == 0 && p.segments.is_empty(),
            })
            && self.floors.iter().all(|(id, f)| other.floor(*id) >= *f)
    }
}

/// The value an item names: its text as a number, else its bytes as a little-endian
/// integer (up to 8 bytes): what [`Membership`] adds and looks for.
fn item_value(item: &[u8]) -> Result<f64, FilterError> {
    if let Some(v) = std::str::from_utf8(item)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|v| v.is_finite())
    {
        return Ok(v);
    }
    if item.len() <= 8 {
        let mut b = [0u8; 8];
        b[..item.len()].copy_from_slice(item);
        return Ok(u64::from_le_bytes(b) as f64);
    }
    Err(FilterError::invalid(
        "item",
        "a t-digest adds numbers (text, or an integer of up to 8 bytes)",
    ))
}

impl Membership for TDigest {
    /// Whether the item's value lies between the smallest and largest value seen.
    fn contains(&self, item: &[u8]) -> bool {
        let Ok(v) = item_value(item) else {
            return false;
        };
        let (lo, hi) = self
            .visible()
            .filter(|d| d.size() > 0)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), d| {
                (lo.min(d.min()), hi.max(d.max()))
            });
        lo <= v && v <= hi
    }

    /// Adds the item's value (`item_value`) once.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        self.add_values(&[item_value(item)?])
    }

    /// Values seen.
    fn cardinality(&self) -> f64 {
        self.size() as f64
    }

    /// The compression.
    fn capacity(&self) -> u64 {
        u64::from(self.params.compression)
    }

    /// Centroids held over one digest's capacity.
    fn load_factor(&self) -> f64 {
        self.centroids() as f64 / self.params.capacity() as f64
    }

    /// Not a membership filter: 0.
    fn estimated_fpr(&self) -> f64 {
        0.0
    }
}

impl DeltaState for TDigest {
    type Delta = TdigestDelta;

    fn track_deltas(&mut self, on: bool) {
        self.tracking = on;
        self.part_changes = 0;
        self.floors_changed = false;
    }

    fn take_delta(&mut self) -> Option<TdigestDelta> {
        let parts = match std::mem::take(&mut self.part_changes) > 0 {
            true => self
                .parts
                .get(&self.writer)
                .map(|p| vec![p.to_repr(self.writer)])
                .unwrap_or_default(),
            false => Vec::new(),
        };
        let floors = match std::mem::take(&mut self.floors_changed) {
            true => self.floors.iter().map(|(i, f)| (*i, *f)).collect(),
            false => Vec::new(),
        };
        // What peers learn ends a segment: a reset that saw it leaves later adds alone.
        self.seal = true;
        (!parts.is_empty() || !floors.is_empty()).then_some(TdigestDelta { parts, floors })
    }

    fn pending_delta_len(&self) -> usize {
        self.part_changes + usize::from(self.floors_changed)
    }

    /// This replica's part.
    fn record_footprint(&mut self, _item: &[u8]) -> bool {
        if !self.tracking || !self.parts.contains_key(&self.writer) {
            return false;
        }
        self.part_changes = self.part_changes.max(1);
        true
    }

    fn check_delta(&self, delta: &TdigestDelta) -> Result<(), FilterError> {
        self.checked_parts(&delta.parts).map(|_| ())
    }

    fn merge_delta(&mut self, delta: &TdigestDelta) -> Result<(), FilterError> {
        let parts = self.checked_parts(&delta.parts)?;
        for (id, p) in &parts {
            self.join_part(*id, p);
        }
        self.join_floors(delta.floors.iter().copied());
        Ok(())
    }
}

impl CheckRemote for TDigest {
    /// Only this replica raises its part's version, and a floor of its id is a version it
    /// made: a state holding more comes from a replica sharing the id.
    fn check_remote(&self, other: &Self) -> Result<(), FilterError> {
        self.own_ahead(
            other.parts.iter().map(|(i, p)| (*i, p.version)),
            other.floors.iter().map(|(i, f)| (*i, *f)),
        )
    }

    fn check_remote_delta(&self, delta: &TdigestDelta) -> Result<(), FilterError> {
        self.own_ahead(
            delta.parts.iter().map(|p| (p.0, p.1)),
            delta.floors.iter().copied(),
        )
    }
}

impl crate::core::kind::ReplicatedFilter for TDigest {
    const KIND: FilterKind = FilterKind::TDigest;
    /// Per-id versions, which only an id's own run raises: a new id at every start.
    const REUSES_IDS: bool = false;

    fn from_spec(spec: &FilterSpec, replica: ReplicaId) -> Result<Self, FilterError> {
        Ok(Self::new(TdigestParams::from_spec(spec)?, replica))
    }

    fn params_digest(&self) -> u64 {
        self.params.digest()
    }

    /// Every part (version and contents) and floor, in id order.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        for (id, p) in &self.parts {
            h.update(&id.to_le_bytes());
            h.update(&p.version.to_le_bytes());
            for k in p.key() {
                h.update(&k.to_le_bytes());
            }
        }
        h.update(b"floors");
        for (id, f) in &self.floors {
            h.update(&id.to_le_bytes());
            h.update(&f.to_le_bytes());
        }
    }

    fn set_writer(&mut self, replica: ReplicaId) {
        self.writer = replica;
        self.seal = true;
    }
}

#[derive(Serialize, Deserialize)]
struct TdigestRepr {
    params: TdigestParams,
    writer: ReplicaId,
    parts: Vec<PartRepr>,
    floors: Vec<(ReplicaId, u64)>,
}

impl Serialize for TDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TdigestRepr {
            params: self.params,
            writer: self.writer,
            parts: self.parts.iter().map(|(i, p)| p.to_repr(*i)).collect(),
            floors: self.floors.iter().map(|(i, f)| (*i, *f)).collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let r = TdigestRepr::deserialize(d)?;
        let params = r.params.validated().map_err(D::Error::custom)?;
        let mut t = TDigest::new(params, r.writer);
        let parts = t.checked_parts(&r.parts).map_err(D::Error::custom)?;
        if r.floors.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(D::Error::custom("floors not strictly ascending"));
        }
        t.parts = parts.into_iter().collect();
        t.floors = r.floors.into_iter().collect();
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_redisblooms_bound_are_refused_as_an_overflow_changing_nothing() {
        let mut t = TDigest::new(TdigestParams::new(100).unwrap(), 1);
        t.add_weighted(&[(1.0, i64::MAX as u64 - 1)], None).unwrap();
        let before = t.size();
        let refused = t.add_weighted(&[(2.0, 1), (3.0, 1)], None);
        assert!(
            matches!(refused, Err(FilterError::Overflow { .. })),
            "{refused:?}"
        );
        assert_eq!(t.size(), before);
        t.add_weighted(&[(2.0, 1)], None).unwrap();
        assert_eq!(t.size(), i64::MAX as u64);
    }

    fn digest(c: u32, values: impl IntoIterator<Item = f64>) -> TDigest {
        let mut t = TDigest::new(TdigestParams::new(c).unwrap(), 1);
        let v: Vec<f64> = values.into_iter().collect();
        t.add_values(&v).unwrap();
        t
    }

    /// redis-py's `test_bloom.py` t-digest answers (RedisBloom's).
    #[test]
    fn answers_as_redisbloom_on_small_digests() {
        let v = digest(100, [1.0, 2.0, 3.0, 4.0, 5.0]).view();
        assert_eq!(v.quantiles(&[0.5, 0.8]), [3.0, 5.0]);
        assert_eq!(v.quantiles(&[0.5, 0.9]), [3.0, 5.0]);
        assert_eq!([v.cdf(1.0), v.cdf(5.0)], [0.1, 0.9]);
        assert_eq!(v.by_rank(0, false), 1.0);
        assert_eq!(v.by_rank(2, false), 3.0);
        assert_eq!(v.by_rank(100, false), f64::INFINITY);
        assert_eq!(v.by_rank(0, true), 5.0);
        assert_eq!(v.by_rank(100, true), f64::NEG_INFINITY);
        let v = digest(100, (1..10).map(f64::from)).view();
        assert_eq!(v.trimmed_mean(0.1, 0.9), 5.0);
        assert_eq!(v.trimmed_mean(0.4, 0.5), 4.5);
        let v = digest(500, (0..20).map(f64::from)).view();
        let ranks: Vec<i64> = [-1.0, 0.0, 10.0, -20.0, 20.0, 9.0]
            .map(|x| v.rank(x, false))
            .to_vec();
        assert_eq!(ranks, [-1, 0, 10, -1, 20, 9]);
        let rev: Vec<i64> = [20.0, 0.0, 21.0, 10.0].map(|x| v.rank(x, true)).to_vec();
        assert_eq!(rev, [-1, 19, -1, 9]);
        let v = digest(500, (1..10000).map(|x| f64::from(x) * 0.01)).view();
        assert_eq!(v.quantiles(&[1.0])[0], v.max());
        assert_eq!(v.quantiles(&[0.0])[0], v.min());
        assert_eq!((v.quantiles(&[0.01])[0] * 100.0).round() / 100.0, 1.0);
        assert_eq!((v.quantiles(&[0.99])[0] * 100.0).round() / 100.0, 99.0);
        let empty = TDigest::new(TdigestParams::new(100).unwrap(), 1).view();
        assert!(empty.quantiles(&[0.5])[0].is_nan() && empty.cdf(1.0).is_nan());
        assert!(empty.by_rank(0, false).is_nan() && empty.rank(1.0, false) == -2);
    }

    #[test]
    fn compression_bounds_centroids() {
        let t = digest(100, (0..100_000).map(|i| f64::from(i).sin()));
        let v = t.view();
        assert!(v.centroids() <= 200, "{} centroids", v.centroids());
        assert!(t.centroids() <= TdigestParams::new(100).unwrap().capacity());
        assert!(t.memory_bytes() <= TdigestParams::new(100).unwrap().memory_bytes());
    }

    /// A writer publishing a delta every thousand values for a million values, and three
    /// writers merged: memory stays within the bound, quantiles within a fraction of a
    /// percent (uniform values).
    #[test]
    fn memory_stays_bounded_and_quantiles_close_across_deltas_and_writers() {
        let p = TdigestParams::new(100).unwrap();
        let mut reps: Vec<TDigest> = (1..=3).map(|r| TDigest::new(p, r)).collect();
        let mut rng = fastrand::Rng::with_seed(7);
        for r in &mut reps {
            r.track_deltas(true);
            for _ in 0..333 {
                let values: Vec<f64> = (0..1000).map(|_| rng.f64()).collect();
                r.add_values(&values).unwrap();
                let _ = r.take_delta();
                let own = r.parts.get(&r.writer).unwrap();
                assert!(own.segments.len() <= MAX_SEGMENTS);
                assert!(
                    r.memory_bytes() <= p.memory_bytes(),
                    "{} bytes",
                    r.memory_bytes()
                );
            }
        }
        let mut all = reps[0].clone();
        for r in &reps[1..] {
            all.merge(r).unwrap();
        }
        assert!(all.memory_bytes() <= 3 * p.memory_bytes());
        let view = all.view();
        assert_eq!(view.size(), 999_000);
        for q in [0.5, 0.99, 0.999] {
            let got = view.quantiles(&[q])[0];
            assert!((got - q).abs() < 0.005, "p{q}: {got}");
        }
    }

    #[test]
    fn reset_removes_what_it_saw_and_concurrent_adds_survive() {
        let p = TdigestParams::new(100).unwrap();
        let (mut a, mut b) = (TDigest::new(p, 1), TDigest::new(p, 2));
        a.track_deltas(true);
        b.track_deltas(true);
        a.add_values(&[1.0, 2.0]).unwrap();
        b.add_values(&[10.0]).unwrap();
        let da = a.take_delta().unwrap();
        let db = b.take_delta().unwrap();
        a.merge_delta(&db).unwrap();
        b.merge_delta(&da).unwrap();
        // b resets what it saw while a adds 3 concurrently.
        assert!(b.reset());
        a.add_values(&[3.0]).unwrap();
        let (da, db) = (a.take_delta().unwrap(), b.take_delta().unwrap());
        a.merge_delta(&db).unwrap();
        b.merge_delta(&da).unwrap();
        assert!(a.equivalent(&b));
        assert_eq!(a.size(), 1);
        assert_eq!(b.view().min(), 3.0);
        // a's next add drops what the reset removed.
        a.add_values(&[4.0]).unwrap();
        assert_eq!(a.size(), 2);
        assert_eq!(a.view().max(), 4.0);
    }
}
