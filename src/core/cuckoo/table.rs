//! The cuckoo hash table shared by GCF and ORCF: buckets of `c` slots plus overflow storage for
//! buckets that merges push past `c` entries, and the overflow-aware insertion of Algorithm 1
//! with an undo log, so that a failed insertion leaves the table exactly as it was.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::column::{Column, NoPayload, TagColumn};
use crate::core::codec::{pack, unpack};
use crate::core::error::FilterError;
use crate::core::hash::alt_index;
use crate::core::huge_pages;
use crate::core::params::CuckooParams;
use crate::core::prefetch::prefetch;

/// What an entry carries besides its fingerprint: nothing for GCF, a version tag for ORCF;
/// and how a table stores it per slot.
pub(crate) trait Payload: Copy + Default + Eq + fmt::Debug + Send + Sync + 'static {
    type Column: Column<Self>;
}
impl Payload for () {
    type Column = NoPayload;
}
impl Payload for u64 {
    type Column = TagColumn;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Entry<P> {
    pub fp: u16,
    pub payload: P,
}

impl<P: Payload> Entry<P> {
    fn empty() -> Self {
        Entry {
            fp: 0,
            payload: P::default(),
        }
    }
}

enum Undo<P> {
    Slot { slot: usize, old: Entry<P> },
    Overflow { bucket: usize, old: Vec<Entry<P>> },
}

/// The slots' fingerprints: one byte each where they fit in 8 bits (the default table is then
/// half the size and stays in cache longer), else two. A slot's fingerprint is whole in one
/// place, so a probe of a bucket loads one cache line (low and high bytes in two arrays
/// took two: `cuckoo madd` into 10-bit fingerprints spent a third of the actor's time on it).
#[derive(Clone)]
enum Fingerprints {
    Narrow(Vec<u8>),
    Wide(Vec<u16>),
}

/// A cuckoo hash table. Main slots of a bucket are filled from the front; a bucket has
/// overflow entries only while all its main slots are taken.
#[derive(Clone)]
pub(crate) struct Table<P: Payload> {
    params: CuckooParams,
    buckets: usize,
    c: usize,
    /// Each slot's fingerprint (0 = empty slot).
    fps: Fingerprints,
    /// Payloads of the main slots (bit-packed tags for ORCF).
    payloads: P::Column,
    overflow: BTreeMap<usize, Vec<Entry<P>>>,
    /// One bit per bucket: has overflow entries. Keeps the query fast path off the map.
    overflow_flags: Vec<u64>,
    len: usize,
    overflow_len: usize,
    rng: fastrand::Rng,
    /// Every entry outside its home bucket ([`home_and_other`]) has a full home. Then a
    /// lookup whose home bucket has a free slot is answered from that one bucket: one cache
    /// line instead of two. Inserts keep it (an entry goes home while its home has room, and
    /// a bucket that is full stays full); only taking an entry out can break it, and then
    /// the table stops relying on it.
    homes_kept: bool,
}

/// Kick quota used when a merge must place an entry whose buckets are both full: enough to
/// find room in a table that has some, small enough that merging a saturated table stays fast.
const MERGE_KICKS: i64 = 16;

impl<P: Payload> Table<P> {
    pub(crate) fn new(params: CuckooParams, rng_seed: u64) -> Self {
        let buckets = params.buckets as usize;
        let c = params.bucket_size as usize;
        Self {
            params,
            buckets,
            c,
            fps: if params.fingerprint_bits > 8 {
                Fingerprints::Wide(huge_pages::zeroed_vec(buckets * c))
            } else {
                Fingerprints::Narrow(huge_pages::zeroed_vec(buckets * c))
            },
            payloads: P::Column::new(buckets * c),
            overflow: BTreeMap::new(),
            overflow_flags: vec![0; buckets.div_ceil(64)],
            len: 0,
            overflow_len: 0,
            rng: fastrand::Rng::with_seed(rng_seed),
            homes_kept: true,
        }
    }

    pub(crate) fn params(&self) -> &CuckooParams {
        &self.params
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn overflow_len(&self) -> usize {
        self.overflow_len
    }
    pub(crate) fn slots(&self) -> usize {
        self.buckets * self.c
    }
    pub(crate) fn load_factor(&self) -> f64 {
        self.len as f64 / self.slots() as f64
    }
    pub(crate) fn rng(&mut self) -> &mut fastrand::Rng {
        &mut self.rng
    }
    #[inline(always)]
    pub(crate) fn alt(&self, bucket: usize, fp: u16) -> usize {
        alt_index(bucket, fp, self.buckets)
    }

    /// Whether bucket `b` has overflow entries. Most tables have none at all, and then no flag
    /// is read: the flags of a large table miss the cache like its buckets (`cuckoo madd`
    /// into 8M buckets spent a third of its add on them once huge pages took the TLB misses).
    #[inline(always)]
    fn has_overflow(&self, b: usize) -> bool {
        self.overflow_len != 0 && self.overflow_flags[b >> 6] & (1 << (b & 63)) != 0
    }
    fn set_overflow_flag(&mut self, b: usize, on: bool) {
        if on {
            self.overflow_flags[b >> 6] |= 1 << (b & 63);
        } else {
            self.overflow_flags[b >> 6] &= !(1 << (b & 63));
        }
    }
    #[inline(always)]
    fn fp_at(&self, slot: usize) -> u16 {
        match &self.fps {
            Fingerprints::Narrow(fps) => fps[slot].into(),
            Fingerprints::Wide(fps) => fps[slot],
        }
    }
    #[inline(always)]
    fn set_fp(&mut self, slot: usize, fp: u16) {
        match &mut self.fps {
            Fingerprints::Narrow(fps) => fps[slot] = fp as u8,
            Fingerprints::Wide(fps) => fps[slot] = fp,
        }
    }
    #[inline(always)]
    fn get(&self, slot: usize) -> Entry<P> {
        Entry {
            fp: self.fp_at(slot),
            payload: self.payloads.get(slot),
        }
    }
    /// Entries in the main slots of bucket `b` (they fill from the front, so the count is
    /// where the zero lanes start: no branch per slot for 4-slot buckets).
    #[inline(always)]
    fn main_count(&self, b: usize) -> usize {
        match (&self.fps, self.c) {
            (Fingerprints::Narrow(fps), 4) => {
                (u32::BITS - bucket_bytes(fps, b).leading_zeros()).div_ceil(8) as usize
            }
            (Fingerprints::Wide(fps), 4) => {
                (u64::BITS - bucket_word(fps, b).leading_zeros()).div_ceil(16) as usize
            }
            _ => self.count_to_first_empty(b),
        }
    }

    /// Main slots of bucket `b` before its first empty one, by looking at each.
    fn count_to_first_empty(&self, b: usize) -> usize {
        (0..self.c)
            .position(|k| self.fp_at(b * self.c + k) == 0)
            .unwrap_or(self.c)
    }
    /// Entries in bucket `b`, overflow included.
    pub(crate) fn occupancy(&self, b: usize) -> usize {
        let n = self.main_count(b);
        if n == self.c && self.has_overflow(b) {
            n + self.overflow[&b].len()
        } else {
            n
        }
    }

    /// Starts loading the fingerprints of the buckets a lookup of `(b, fp)` reads first: the
    /// home alone while lookups stop there, else both candidate buckets (a hint for batches,
    /// see [`crate::core::prefetch`]).
    #[inline]
    pub(crate) fn prefetch(&self, b: usize, fp: u16) {
        let (home, other) = home_and_other(b, self.alt(b, fp), fp);
        self.prefetch_bucket(home);
        if !self.lookups_stop_at_home() {
            self.prefetch_bucket(other);
        }
    }

    /// [`Table::prefetch`] for an insertion of `(b, fp)`: also the payloads of the slots it
    /// would write (ORCF's tags sit in an array of their own, and writing one missed the cache
    /// on almost every add into a large table: a third of an `or_cuckoo` batch add).
    #[inline]
    pub(crate) fn prefetch_insert(&self, b: usize, fp: u16) {
        let (home, other) = home_and_other(b, self.alt(b, fp), fp);
        self.prefetch_bucket(home);
        self.payloads.prefetch(home * self.c, self.c);
        if !self.lookups_stop_at_home() {
            self.prefetch_bucket(other);
            self.payloads.prefetch(other * self.c, self.c);
        }
    }

    /// Whether lookups look at the home bucket first and stop there if it has room. Homes
    /// fill up as the table does: from half full on, the other bucket is needed often enough
    /// that testing both at once, without a branch on the home, is faster.
    #[inline(always)]
    fn lookups_stop_at_home(&self) -> bool {
        self.homes_kept && self.len * 2 < self.slots()
    }

    #[inline(always)]
    fn prefetch_bucket(&self, bucket: usize) {
        let slot = bucket * self.c;
        match &self.fps {
            Fingerprints::Narrow(fps) => fps.get(slot).map(prefetch),
            Fingerprints::Wide(fps) => fps.get(slot).map(prefetch),
        };
    }

    /// Whether bucket `b`'s main slots are all taken (they fill from the front).
    #[inline(always)]
    fn is_full(&self, b: usize) -> bool {
        self.fp_at(b * self.c + self.c - 1) != 0
    }

    /// Whether the main slots of bucket `b` hold fingerprint `fp`.
    #[inline(always)]
    fn bucket_main_has_fp(&self, b: usize, fp: u16) -> bool {
        match (&self.fps, self.c) {
            (Fingerprints::Narrow(fps), 4) => has_byte(bucket_bytes(fps, b), fp as u8),
            (Fingerprints::Wide(fps), 4) => has_lane(bucket_word(fps, b), fp),
            _ => (0..self.c).any(|k| self.fp_at(b * self.c + k) == fp),
        }
    }

    /// Whether bucket `b` holds fingerprint `fp`.
    #[inline(always)]
    pub(crate) fn bucket_has_fp(&self, b: usize, fp: u16) -> bool {
        self.bucket_main_has_fp(b, fp) || self.overflow_has_fp(b, fp)
    }

    /// Whether the overflow of bucket `b` holds fingerprint `fp` (no map lookup unless the
    /// bucket is flagged).
    #[inline(always)]
    fn overflow_has_fp(&self, b: usize, fp: u16) -> bool {
        self.has_overflow(b) && self.overflow[&b].iter().any(|e| e.fp == fp)
    }

    /// Whether either candidate bucket of `(b, fp)` holds `fp`.
    #[inline(always)]
    pub(crate) fn contains_fp(&self, b: usize, fp: u16) -> bool {
        let a = self.alt(b, fp);
        if self.lookups_stop_at_home() {
            let (home, other) = home_and_other(b, a, fp);
            if self.bucket_main_has_fp(home, fp) {
                return true;
            }
            if !self.is_full(home) {
                // Homes kept: an entry equal to this one outside its home means a full home.
                return false;
            }
            return self.bucket_has_fp(other, fp) || self.overflow_has_fp(home, fp);
        }
        // Both buckets tested without a branch between them (`|`), so that the two loads
        // overlap instead of waiting on an unpredictable early exit; overflow only where
        // flagged.
        (self.bucket_main_has_fp(b, fp) | self.bucket_main_has_fp(a, fp))
            || self.overflow_has_fp(b, fp)
            || self.overflow_has_fp(a, fp)
    }

    /// The entries of bucket `b`, main slots first.
    pub(crate) fn bucket_entries(&self, b: usize) -> impl Iterator<Item = Entry<P>> + '_ {
        let main = (0..self.main_count(b)).map(move |k| self.get(b * self.c + k));
        let over = self
            .has_overflow(b)
            .then(|| self.overflow[&b].iter().copied());
        main.chain(over.into_iter().flatten())
    }

    /// Position within bucket `b` of an entry equal to `e`.
    pub(crate) fn find_exact(&self, b: usize, e: Entry<P>) -> Option<usize> {
        self.bucket_entries(b).position(|x| x == e)
    }

    /// Whether `e` sits at `b` or at its alternate bucket.
    pub(crate) fn has_exact_either(&self, b: usize, e: Entry<P>) -> bool {
        self.find_exact(b, e).is_some() || self.find_exact(self.alt(b, e.fp), e).is_some()
    }

    /// Calls `f(bucket, entry)` for every entry: main slots in bucket order, then overflow.
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize, Entry<P>)) {
        for b in 0..self.buckets {
            for k in 0..self.c {
                let slot = b * self.c + k;
                if self.fp_at(slot) == 0 {
                    break;
                }
                f(b, self.get(slot));
            }
        }
        for (&b, v) in &self.overflow {
            for &e in v {
                f(b, e);
            }
        }
    }

    fn set_slot(&mut self, slot: usize, e: Entry<P>, log: Option<&mut Vec<Undo<P>>>) {
        if let Some(log) = log {
            log.push(Undo::Slot {
                slot,
                old: self.get(slot),
            });
        }
        self.set_fp(slot, e.fp);
        self.payloads.set(slot, e.payload);
    }

    fn log_overflow(&self, b: usize, log: Option<&mut Vec<Undo<P>>>) {
        if let Some(log) = log {
            log.push(Undo::Overflow {
                bucket: b,
                old: self.overflow.get(&b).cloned().unwrap_or_default(),
            });
        }
    }

    /// Appends `e` to bucket `b`, into the overflow if its main slots are taken.
    fn push(&mut self, b: usize, e: Entry<P>, log: Option<&mut Vec<Undo<P>>>) {
        let n = self.main_count(b);
        if n < self.c {
            self.set_slot(b * self.c + n, e, log);
        } else {
            self.log_overflow(b, log);
            self.overflow.entry(b).or_default().push(e);
            self.set_overflow_flag(b, true);
            self.overflow_len += 1;
        }
        self.len += 1;
    }

    fn overflow_take(&mut self, b: usize, k: usize, log: Option<&mut Vec<Undo<P>>>) -> Entry<P> {
        self.log_overflow(b, log);
        let v = self
            .overflow
            .get_mut(&b)
            .expect("overflow flag without entries");
        let e = v.swap_remove(k);
        if v.is_empty() {
            self.overflow.remove(&b);
            self.set_overflow_flag(b, false);
        }
        self.overflow_len -= 1;
        e
    }

    /// Removes and returns the `k`-th entry of bucket `b`, keeping main slots filled from the
    /// front (an overflow entry, if any, moves into the freed main slot).
    pub(crate) fn take(&mut self, b: usize, k: usize) -> Entry<P> {
        // A full bucket without overflow has room afterwards, while entries whose home it is
        // may sit in their other bucket. (One that was not full has no such entries; one
        // with overflow stays full.)
        if self.occupancy(b) == self.c {
            self.homes_kept = false;
        }
        self.take_at(b, k, None)
    }

    fn take_at(&mut self, b: usize, k: usize, mut log: Option<&mut Vec<Undo<P>>>) -> Entry<P> {
        let n = self.main_count(b);
        let victim = if k >= n {
            self.overflow_take(b, k - n, log)
        } else {
            let slot = b * self.c + k;
            let victim = self.get(slot);
            if self.has_overflow(b) {
                let last = self.overflow[&b].len() - 1;
                let moved = self.overflow_take(b, last, log.as_deref_mut());
                self.set_slot(slot, moved, log);
            } else {
                let last = b * self.c + n - 1;
                if last != slot {
                    let moved = self.get(last);
                    self.set_slot(slot, moved, log.as_deref_mut());
                }
                self.set_slot(last, Entry::empty(), log);
            }
            victim
        };
        self.len -= 1;
        victim
    }

    /// Removes an entry equal to `e` from bucket `b` or its alternate; `false` if none.
    pub(crate) fn remove_exact(&mut self, b: usize, e: Entry<P>) -> bool {
        for bucket in [b, self.alt(b, e.fp)] {
            if let Some(k) = self.find_exact(bucket, e) {
                self.take(bucket, k);
                return true;
            }
        }
        false
    }

    /// Algorithm 1 (*cuckooInsert*): inserts `e` whose primary bucket is `i1`, displacing
    /// entries and smoothing out overflowing buckets. On `Err(Full)` every change is undone.
    ///
    /// Where both buckets have room, Algorithm 1 chooses at random; here the entry's home
    /// bucket is chosen, itself uniform over the buckets, which keeps homes
    /// (`homes_kept`) and so lets lookups stop at the home bucket. The home is examined
    /// first, the other bucket only when the home is full.
    pub(crate) fn insert(&mut self, i1: usize, e: Entry<P>) -> Result<(), FilterError> {
        let (home, other) = home_and_other(i1, self.alt(i1, e.fp), e.fp);
        if self.occupancy(home) < self.c {
            self.push(home, e, None);
            return Ok(());
        }
        if self.occupancy(other) < self.c {
            self.push(other, e, None);
            return Ok(());
        }
        let start = if self.rng.bool() { home } else { other };
        if self.kick_insert(start, e, self.params.max_kicks as i64) {
            Ok(())
        } else {
            Err(FilterError::Full {
                max_kicks: self.params.max_kicks,
            })
        }
    }

    /// *cuckooInsertImpl* with an explicit stack instead of recursion (the quota may be large).
    /// Returns `false`, with the table restored, when the quota runs out.
    fn kick_insert(&mut self, start: usize, e: Entry<P>, mut quota: i64) -> bool {
        let saved = (self.len, self.overflow_len);
        let mut log = Vec::new();
        let mut stack = vec![(start, e)];
        let c = self.c;
        while let Some(&(b, e)) = stack.last() {
            if quota < 0 {
                self.rollback(log, saved);
                return false;
            }
            let n = self.occupancy(b);
            if n < c {
                self.push(b, e, Some(&mut log));
                stack.pop();
            } else if n == c {
                // Displace a random entry and move it to its alternate bucket.
                let slot = b * c + self.rng.usize(..c);
                let victim = self.get(slot);
                self.set_slot(slot, e, Some(&mut log));
                *stack.last_mut().expect("non-empty") = (self.alt(b, victim.fp), victim);
                quota -= 1;
            } else {
                // Overflowing: re-home a random excess entry first, then retry `e` here.
                let k = self.rng.usize(..n);
                let victim = self.take_at(b, k, Some(&mut log));
                stack.push((self.alt(b, victim.fp), victim));
                quota -= 1;
            }
        }
        true
    }

    fn rollback(&mut self, log: Vec<Undo<P>>, (len, overflow_len): (usize, usize)) {
        for undo in log.into_iter().rev() {
            match undo {
                Undo::Slot { slot, old } => {
                    self.set_fp(slot, old.fp);
                    self.payloads.set(slot, old.payload);
                }
                Undo::Overflow { bucket, old } => {
                    self.set_overflow_flag(bucket, !old.is_empty());
                    if old.is_empty() {
                        self.overflow.remove(&bucket);
                    } else {
                        self.overflow.insert(bucket, old);
                    }
                }
            }
        }
        self.len = len;
        self.overflow_len = overflow_len;
    }

    /// Places an entry arriving by merge. Any position in its two buckets is equivalent, so
    /// it goes where there is room, tries a few kicks, and only then overflows (a merge must
    /// always succeed, thesis 3.3.2).
    pub(crate) fn place_merged(&mut self, b: usize, e: Entry<P>) {
        let (home, other) = home_and_other(b, self.alt(b, e.fp), e.fp);
        let (at_home, at_other) = (self.occupancy(home), self.occupancy(other));
        if at_home < self.c {
            self.push(home, e, None);
        } else if at_other < self.c {
            self.push(other, e, None);
        } else if !self.kick_insert(home, e, MERGE_KICKS) {
            self.push(if at_other < at_home { other } else { home }, e, None);
        }
    }

    /// Places an entry re-added from elsewhere (an import, see
    /// [`crate::ReplicatedFilter::import_occurrences`]): as an add would (Algorithm 1), and
    /// where that runs out of kicks, as a merge would ([`Table::place_merged`]): it fitted
    /// where it came from, so it is never refused.
    pub(crate) fn place_imported(&mut self, b: usize, e: Entry<P>) {
        if self.insert(b, e).is_err() {
            self.place_merged(b, e);
        }
    }

    /// Whether `homes_kept` holds, from a pass over the entries: a state decoded from the
    /// wire may have been laid out by another policy (Algorithm 1's random choice, or a
    /// replica that removed entries).
    fn every_entry_home_or_home_full(&self) -> bool {
        (0..self.buckets).all(|b| {
            self.bucket_entries(b).all(|e| {
                let home = home_and_other(b, self.alt(b, e.fp), e.fp).0;
                home == b || self.is_full(home)
            })
        })
    }

    /// Serialized form: main fingerprints packed at `l` bits, overflow buckets as ascending
    /// index gaps with counts and packed fingerprints. Payloads are the owner's business, in
    /// [`Table::for_each`] order.
    pub(crate) fn to_repr(&self) -> TableRepr {
        let l = self.params.fingerprint_bits as u32;
        let mut gaps = Vec::with_capacity(self.overflow.len());
        let mut counts = Vec::with_capacity(self.overflow.len());
        let mut prev = 0;
        for (&b, v) in &self.overflow {
            gaps.push((b - prev) as u64);
            counts.push(v.len() as u64);
            prev = b;
        }
        TableRepr {
            fps: pack((0..self.slots()).map(|s| self.fp_at(s) as u64), l),
            overflow_gaps: gaps,
            overflow_counts: counts,
            overflow_fps: pack(self.overflow.values().flatten().map(|e| e.fp as u64), l),
        }
    }

    /// Rebuilds a table from its serialized form and the payloads in `for_each` order,
    /// rejecting anything that could not have come from [`Table::to_repr`].
    pub(crate) fn from_repr(
        params: CuckooParams,
        repr: &TableRepr,
        payloads: impl FnOnce(usize) -> Result<Vec<P>, FilterError>,
        rng_seed: u64,
    ) -> Result<Self, FilterError> {
        let params = params.validated()?;
        let l = params.fingerprint_bits as u32;
        // Check the size before allocating, so a tampered bucket count cannot exhaust memory.
        let slots = params.slots() as usize;
        let main = unpack(&repr.fps, l, slots)?;
        let mut t = Self::new(params, rng_seed);
        if repr.overflow_gaps.len() != repr.overflow_counts.len() {
            return Err(FilterError::malformed(
                "overflow gaps and counts differ in length",
            ));
        }
        let over_total = repr
            .overflow_counts
            .iter()
            .try_fold(0u64, |a, &n| a.checked_add(n));
        let over_total = over_total
            .filter(|&n| n <= t.slots() as u64 * 64)
            .ok_or_else(|| FilterError::malformed("overflow count out of range"))?;
        let over = unpack(&repr.overflow_fps, l, over_total as usize)?;
        for (slot, &fp) in main.iter().enumerate() {
            t.set_fp(slot, fp as u16);
        }
        for b in 0..t.buckets {
            // Not `main_count`: it trusts the slots to fill from the front.
            let n = t.count_to_first_empty(b);
            if (n..t.c).any(|k| t.fp_at(b * t.c + k) != 0) {
                return Err(FilterError::malformed(format!(
                    "bucket {b} has a hole in its slots"
                )));
            }
            t.len += n;
        }
        let mut bucket = 0usize;
        let mut fps = over.into_iter();
        for (i, (&gap, &count)) in repr
            .overflow_gaps
            .iter()
            .zip(&repr.overflow_counts)
            .enumerate()
        {
            bucket = bucket
                .checked_add(gap as usize)
                .filter(|&b| b < t.buckets && (i == 0 || gap > 0))
                .ok_or_else(|| {
                    FilterError::malformed("overflow bucket index out of order or range")
                })?;
            if count == 0 || t.main_count(bucket) < t.c {
                return Err(FilterError::malformed(format!(
                    "bucket {bucket} overflows while not full"
                )));
            }
            let v: Vec<Entry<P>> = fps
                .by_ref()
                .take(count as usize)
                .map(|fp| Entry {
                    fp: fp as u16,
                    payload: P::default(),
                })
                .collect();
            if v.iter().any(|e| e.fp == 0) {
                return Err(FilterError::malformed("zero fingerprint in overflow"));
            }
            t.len += v.len();
            t.overflow_len += v.len();
            t.overflow.insert(bucket, v);
            t.set_overflow_flag(bucket, true);
        }
        t.homes_kept = t.every_entry_home_or_home_full();
        let payloads = payloads(t.len)?;
        if payloads.len() != t.len {
            return Err(FilterError::malformed(
                "payload count differs from entry count",
            ));
        }
        let mut it = payloads.into_iter();
        for slot in 0..t.slots() {
            if t.fp_at(slot) != 0 {
                t.payloads.set(slot, it.next().expect("counted"));
            }
        }
        for v in t.overflow.values_mut() {
            for e in v {
                e.payload = it.next().expect("counted");
            }
        }
        Ok(t)
    }
}

/// The home and the other of the candidate buckets `b` and `a = alt(b, fp)` of an entry with
/// fingerprint `fp`: the same for both, so the entry has one home wherever it sits. Which of
/// the two is home is decided by a bit of the fingerprint, so homes spread evenly over the
/// buckets (the lower one would load low buckets first).
#[inline(always)]
fn home_and_other(b: usize, a: usize, fp: u16) -> (usize, usize) {
    let (low, high) = if b <= a { (b, a) } else { (a, b) };
    if fp & 1 == 0 {
        (low, high)
    } else {
        (high, low)
    }
}

/// Whether any 16-bit lane of `word` equals `fp` (the SWAR zero-lane test on `word ^ fp…fp`;
/// exact, since it only asks whether some lane is zero). Empty slots are 0 and `fp` never is.
#[inline(always)]
fn has_lane(word: u64, fp: u16) -> bool {
    const ONES: u64 = 0x0001_0001_0001_0001;
    const HIGHS: u64 = 0x8000_8000_8000_8000;
    let x = word ^ (fp as u64).wrapping_mul(ONES);
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// The four fingerprints of 4-slot bucket `b` as 16-bit lanes of one word.
#[inline(always)]
fn bucket_word(fps: &[u16], b: usize) -> u64 {
    let s = &fps[b * 4..b * 4 + 4];
    (0..4).fold(0, |w, k| w | u64::from(s[k]) << (16 * k))
}

/// The four 8-bit fingerprints of 4-slot bucket `b` as one word.
#[inline(always)]
fn bucket_bytes(fps: &[u8], b: usize) -> u32 {
    let s = &fps[b * 4..b * 4 + 4];
    u32::from_le_bytes([s[0], s[1], s[2], s[3]])
}

/// Whether any byte of `word` equals `fp` (the same test on 8-bit lanes).
#[inline(always)]
fn has_byte(word: u32, fp: u8) -> bool {
    const ONES: u32 = 0x0101_0101;
    const HIGHS: u32 = 0x8080_8080;
    let x = word ^ (fp as u32).wrapping_mul(ONES);
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// The packed serialized form of a table (see [`Table::to_repr`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TableRepr {
    #[serde(with = "serde_bytes")]
    pub fps: Vec<u8>,
    pub overflow_gaps: Vec<u64>,
    pub overflow_counts: Vec<u64>,
    #[serde(with = "serde_bytes")]
    pub overflow_fps: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(buckets: u64) -> CuckooParams {
        CuckooParams {
            buckets,
            bucket_size: 4,
            fingerprint_bits: 8,
            max_kicks: 50,
            seed: 1,
        }
    }

    fn snapshot(t: &Table<u64>) -> Vec<(usize, Entry<u64>)> {
        let mut v = Vec::new();
        t.for_each(|b, e| v.push((b, e)));
        v.sort_by_key(|(b, e)| (*b, e.fp, e.payload));
        v
    }

    #[test]
    fn lane_test_matches_a_scan() {
        let mut rng = fastrand::Rng::with_seed(4);
        for _ in 0..100_000 {
            let lanes: [u16; 4] =
                std::array::from_fn(|_| if rng.bool() { 0 } else { rng.u16(1..=6) });
            let word = lanes.iter().rev().fold(0u64, |w, &l| w << 16 | l as u64);
            let fp = rng.u16(1..=6);
            assert_eq!(has_lane(word, fp), lanes.contains(&fp), "{lanes:?} {fp}");
        }
        assert!(
            has_lane(0xFFFF_0000_0000_0000, 0xFFFF) && !has_lane(0xFFFE_0000_0000_0000, 0xFFFF)
        );
    }

    #[test]
    fn byte_test_matches_a_scan() {
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..100_000 {
            let lanes: [u8; 4] =
                std::array::from_fn(|_| if rng.bool() { 0 } else { rng.u8(1..=6) });
            let fp = rng.u8(1..=6);
            assert_eq!(
                has_byte(u32::from_le_bytes(lanes), fp),
                lanes.contains(&fp),
                "{lanes:?} {fp}"
            );
        }
        assert!(has_byte(0xFF00_0000, 0xFF) && !has_byte(0x7F00_0000, 0xFF));
    }

    #[test]
    fn failed_insert_restores_the_exact_table() {
        let mut t: Table<u64> = Table::new(params(8), 3);
        let mut rng = fastrand::Rng::with_seed(9);
        let mut failures = 0;
        for tag in 1..200u64 {
            let before = snapshot(&t);
            let (len, over) = (t.len(), t.overflow_len());
            let e = Entry {
                fp: rng.u16(1..=255),
                payload: tag,
            };
            if t.insert(rng.usize(..8), e).is_err() {
                failures += 1;
                assert_eq!(snapshot(&t), before);
                assert_eq!((t.len(), t.overflow_len()), (len, over));
            }
            assert!(t.homes_kept && t.every_entry_home_or_home_full());
        }
        assert!(failures > 0);
    }

    #[test]
    fn insert_smooths_out_overflow_and_rolls_back_through_it() {
        let mut t: Table<u64> = Table::new(params(16), 5);
        // Merge-style placement overfills bucket 0 (kicks find room elsewhere, so force it).
        for tag in 1..=12u64 {
            t.push(
                0,
                Entry {
                    fp: 7,
                    payload: tag,
                },
                None,
            );
        }
        assert_eq!(t.occupancy(0), 12);
        assert_eq!(t.overflow_len(), 8);
        let mut rng = fastrand::Rng::with_seed(1);
        for tag in 100..160u64 {
            let before = snapshot(&t);
            let e = Entry {
                fp: rng.u16(1..=255),
                payload: tag,
            };
            let b = rng.usize(..16);
            if t.insert(b, e).is_err() {
                assert_eq!(snapshot(&t), before);
            } else {
                assert!(t.has_exact_either(b, e));
            }
        }
        // Every original entry is still in one of its two buckets.
        for tag in 1..=12u64 {
            assert!(t.has_exact_either(
                0,
                Entry {
                    fp: 7,
                    payload: tag
                }
            ));
        }
    }

    #[test]
    fn repr_round_trip_and_tamper_detection() {
        let mut t: Table<u64> = Table::new(params(8), 3);
        for tag in 1..=40u64 {
            t.push(
                (tag % 3) as usize,
                Entry {
                    fp: (tag % 200 + 1) as u16,
                    payload: tag,
                },
                None,
            );
        }
        let mut payloads = Vec::new();
        t.for_each(|_, e| payloads.push(e.payload));
        let repr = t.to_repr();
        let back =
            Table::<u64>::from_repr(*t.params(), &repr, |_| Ok(payloads.clone()), 0).unwrap();
        assert_eq!(snapshot(&back), snapshot(&t));
        let mut bad = repr.clone();
        bad.fps[0] = 0; // a hole before occupied slots of bucket 0
        assert!(Table::<u64>::from_repr(*t.params(), &bad, |_| Ok(payloads.clone()), 0).is_err());
        let mut bad = repr.clone();
        bad.overflow_counts[0] += 1;
        assert!(Table::<u64>::from_repr(*t.params(), &bad, |_| Ok(payloads.clone()), 0).is_err());
        let mut bad = repr;
        bad.overflow_gaps[0] = 1000;
        assert!(Table::<u64>::from_repr(*t.params(), &bad, |_| Ok(payloads.clone()), 0).is_err());
    }

    /// Whether `fp` sits in either candidate bucket, by looking at both.
    fn in_either(t: &Table<u64>, b: usize, fp: u16) -> bool {
        t.bucket_has_fp(b, fp) || t.bucket_has_fp(t.alt(b, fp), fp)
    }

    /// Random lookups, half of them of entries the table holds, answer as a look at both
    /// buckets does.
    fn assert_lookups_exact(t: &Table<u64>, rng: &mut fastrand::Rng, bits: u32) {
        let mut held = Vec::new();
        t.for_each(|b, e| held.push((b, e.fp)));
        for k in 0..4000 {
            let (b, fp) = if k % 2 == 0 && !held.is_empty() {
                let (b, fp) = held[rng.usize(..held.len())];
                if rng.bool() {
                    (t.alt(b, fp), fp)
                } else {
                    (b, fp)
                }
            } else {
                (rng.usize(..t.buckets), rng.u16(1..(1 << bits)))
            };
            assert_eq!(t.contains_fp(b, fp), in_either(t, b, fp), "({b}, {fp})");
        }
    }

    #[test]
    fn inserts_kicks_and_merges_keep_homes_and_lookups_stay_exact() {
        for (bits, buckets) in [(8u8, 64u64), (12, 64), (8, 1000), (12, 1000)] {
            let p = CuckooParams {
                fingerprint_bits: bits,
                ..params(buckets)
            };
            let mut t: Table<u64> = Table::new(p, 5);
            let mut rng = fastrand::Rng::with_seed(buckets + bits as u64);
            // Past full: inserts start failing, and merges then overflow buckets.
            for tag in 0..(buckets * 5) {
                let e = Entry {
                    fp: rng.u16(1..(1 << bits)),
                    payload: tag,
                };
                let b = rng.usize(..buckets as usize);
                if tag % 3 == 0 {
                    t.place_merged(b, e);
                } else {
                    let _ = t.insert(b, e);
                }
                if tag % 97 == 0 {
                    assert!(t.every_entry_home_or_home_full(), "after {tag}");
                    assert_lookups_exact(&t, &mut rng, bits as u32);
                }
            }
            assert!(t.overflow_len() > 0, "the test reaches overflow");
            assert!(t.homes_kept && t.every_entry_home_or_home_full());
            assert_lookups_exact(&t, &mut rng, bits as u32);
        }
    }

    #[test]
    fn a_take_stops_lookups_relying_on_homes() {
        let mut t: Table<u64> = Table::new(params(16), 2);
        let mut rng = fastrand::Rng::with_seed(9);
        for tag in 0..200 {
            let fp = rng.u16(1..256);
            t.place_merged(rng.usize(..16), Entry { fp, payload: tag });
        }
        // Empty a full home while an entry of it sits in its other bucket.
        let mut victim = None;
        t.for_each(|b, e| {
            let (home, _) = home_and_other(b, t.alt(b, e.fp), e.fp);
            if home != b && victim.is_none() {
                victim = Some((b, e.fp, home));
            }
        });
        let (b, fp, home) = victim.expect("a full table has entries away from home");
        // Out of a bucket with room (none here is full and without overflow): homes hold.
        let mut sparse: Table<u64> = Table::new(params(64), 2);
        for tag in 0..40 {
            let _ = sparse.insert(
                tag as usize,
                Entry {
                    fp: 1 + tag as u16,
                    payload: tag,
                },
            );
        }
        let roomy = (0..64)
            .find(|&b| (1..4).contains(&sparse.occupancy(b)))
            .unwrap();
        sparse.take(roomy, 0);
        assert!(sparse.homes_kept && sparse.every_entry_home_or_home_full());
        assert_lookups_exact(&sparse, &mut rng, 8);
        while t.occupancy(home) > 0 {
            t.take(home, 0);
        }
        assert!(!t.homes_kept);
        assert!(t.contains_fp(b, fp) && t.contains_fp(home, fp));
        assert_lookups_exact(&t, &mut rng, 8);
    }

    #[test]
    fn a_decoded_table_relies_on_homes_only_where_they_hold() {
        let kept: Table<u64> = {
            let mut t = Table::new(params(32), 1);
            for tag in 0..60 {
                let _ = t.insert(
                    tag as usize % 32,
                    Entry {
                        fp: (tag % 250 + 1) as u16,
                        payload: tag,
                    },
                );
            }
            t
        };
        // Laid out by Algorithm 1's random choice: an entry away from a home with room.
        let mut random = Table::new(params(32), 1);
        let (b, fp) = (0..32)
            .flat_map(|b| (1..256u16).map(move |fp| (b, fp)))
            .find(|&(b, fp)| home_and_other(b, random.alt(b, fp), fp).0 != b)
            .unwrap();
        random.push(b, Entry { fp, payload: 7 }, None);
        for (t, homes) in [(kept, true), (random, false)] {
            let mut payloads = Vec::new();
            t.for_each(|_, e| payloads.push(e.payload));
            let back =
                Table::<u64>::from_repr(*t.params(), &t.to_repr(), |_| Ok(payloads), 0).unwrap();
            assert_eq!(back.homes_kept, homes);
            assert_eq!(snapshot(&back), snapshot(&t));
            assert_lookups_exact(&back, &mut fastrand::Rng::with_seed(3), 8);
        }
    }

    #[test]
    fn homes_spread_over_the_buckets() {
        let t: Table<u64> = Table::new(params(1000), 1);
        let mut rng = fastrand::Rng::with_seed(8);
        let mut low_quarter = 0;
        for _ in 0..100_000 {
            let (b, fp) = (rng.usize(..1000), rng.u16(1..256));
            if home_and_other(b, t.alt(b, fp), fp).0 < 250 {
                low_quarter += 1;
            }
        }
        // The lower of the two would give the lowest quarter about 44% of the homes.
        assert!((23_000..27_000).contains(&low_quarter), "{low_quarter}");
    }
}
