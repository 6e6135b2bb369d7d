//! The expiring (sliding-window) Bloom filter as a CRDT: elements expire a configured window
//! after they were added. Time is cut into epochs, each epoch is a grow-only Bloom filter
//! ([`GBloom`]), merge is per epoch, and a monotone low-watermark drops old epochs.
//!
//! Prior art: the sliding-window Bloom filter of Szepieniec and Værge
//! (`blog-bloom-and-cuckoo-filters.md`: the element's timestamp picks the window its bits go
//! to) and age-partitioned Bloom filters (Shtul, Baquero, Almeida 2020: a ring of generations,
//! the oldest dropped as a new one starts). Here the generations are epochs of a clock the
//! caller passes in, so that replicas agree on which generation an element belongs to without
//! coordinating anything but their clocks.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::bloom::{GBloom, check_bloom_delta};
use super::delta::{BloomDelta, CheckRemote, DeltaState};
use super::error::FilterError;
use super::hash::{HASH_VERSION, hash_item};
use super::lattice::{Lattice, Membership};
use super::params::{BloomParams, check_memory};

/// Parameters of an [`ExpiringBloom`]: each epoch's Bloom filter, the epoch length in the
/// caller's time unit, the window in epochs, and the clock skew (in epochs) replicas accept
/// from each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExpiringParams {
    /// Parameters of every epoch's filter (its capacity is per epoch).
    pub bloom: BloomParams,
    /// Length of an epoch, in the unit of the `now` arguments (milliseconds, say). At least 1.
    pub epoch_len: u64,
    /// Live epochs `W`: the newest epoch and the `W - 1` before it. 1 to [`Self::MAX_WINDOW`].
    pub window: u32,
    /// Most a replica's clock may be ahead of another's, in epochs `S < W`. States and deltas
    /// from further ahead are refused by [`ExpiringBloom::check_remote_at`].
    pub max_skew: u32,
}

impl ExpiringParams {
    /// Most epochs a window may have. Every live epoch is a separate filter queried by every
    /// `contains`, so a long window of short epochs is slow before it is large; 4096 is far
    /// past any useful setting.
    pub const MAX_WINDOW: u32 = 1 << 12;

    /// A window of `window` epochs of `epoch_len` time units, each holding `per_epoch_capacity`
    /// elements, with the false positive rate of the whole window at most `fpr`: each epoch is
    /// sized for `1 - (1 - fpr)^(1/W)` (slightly above `fpr / W`), so that a query over `W`
    /// full epochs stays under `fpr`.
    ///
    /// ```
    /// let p = crpf::ExpiringParams::with_window(10_000, 0.01, 60_000, 5, 1)?; // 5 minutes
    /// assert!(p.epoch_fpr() > 0.01 / 5.0 && p.epoch_fpr() < 0.01);
    /// assert_eq!(p.memory_bytes(), 5 * p.bloom.memory_bytes());
    /// # Ok::<(), crpf::FilterError>(())
    /// ```
    pub fn with_window(
        per_epoch_capacity: u64,
        fpr: f64,
        epoch_len: u64,
        window: u32,
        max_skew: u32,
    ) -> Result<Self, FilterError> {
        super::params::check_fpr(fpr)?;
        if window == 0 || window > Self::MAX_WINDOW {
            return Err(Self::bad_window(window));
        }
        let epoch_fpr = 1.0 - (1.0 - fpr).powf(1.0 / window as f64);
        Self {
            bloom: BloomParams::with_capacity(per_epoch_capacity, epoch_fpr)?,
            epoch_len,
            window,
            max_skew,
        }
        .validated()
    }

    fn bad_window(window: u32) -> FilterError {
        FilterError::invalid(
            "window",
            format!("{window} is not in 1..={}", Self::MAX_WINDOW),
        )
    }

    /// Checks the parameters; every constructor and decoder goes through here. The memory
    /// bound is that of a full window: `W` epoch filters together at most
    /// [`crate::MAX_FILTER_BYTES`].
    pub fn validated(self) -> Result<Self, FilterError> {
        let bloom = self.bloom.validated()?;
        if self.epoch_len == 0 {
            return Err(FilterError::invalid("epoch_len", "must be at least 1"));
        }
        if self.window == 0 || self.window > Self::MAX_WINDOW {
            return Err(Self::bad_window(self.window));
        }
        if self.max_skew >= self.window {
            return Err(FilterError::invalid(
                "max_skew",
                format!(
                    "{} epochs: must be below the window of {} epochs, or elements could expire \
                     as they are added",
                    self.max_skew, self.window
                ),
            ));
        }
        check_memory(self.memory_bytes())?;
        Ok(Self { bloom, ..self })
    }

    /// Bytes of a full window: `W` epoch filters.
    pub fn memory_bytes(&self) -> u64 {
        (self.window as u64).saturating_mul(self.bloom.memory_bytes())
    }

    /// FPR each epoch's filter is sized for at its capacity (Eq. 2.2).
    pub fn epoch_fpr(&self) -> f64 {
        self.bloom.fpr_after(self.bloom.capacity as f64)
    }

    /// The epoch a time falls in: `now / epoch_len`.
    pub fn epoch_of(&self, now: u64) -> u64 {
        now / self.epoch_len
    }

    /// A stable digest of the parameters and hash version.
    pub fn digest(&self) -> u64 {
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(b"expiring");
        b.extend_from_slice(&HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.bloom.digest().to_le_bytes());
        b.extend_from_slice(&self.epoch_len.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&self.max_skew.to_le_bytes());
        xxh3_64(&b)
    }
}

/// An expiring (sliding-window) grow-only Bloom filter, a state-based CRDT. Elements stay for
/// a window of `W` epochs and then disappear by themselves; no remove is needed.
///
/// # State and merge
///
/// The state is a clock `newest` (the newest epoch any replica that contributed to the state
/// has reached) and one [`GBloom`] per live epoch `e`, `newest - W < e ≤ newest`; the
/// low-watermark, the oldest live epoch, is `newest - W + 1`. Merge takes the larger `newest`,
/// drops the epochs that fall below the watermark, and ORs the remaining epochs pairwise.
/// Seen per epoch, an epoch's value is a Bloom filter until it is dropped, and "dropped" is
/// the top of that epoch's lattice; the dropped epochs always form a prefix. So the state is
/// a product of per-epoch lattices and merge is idempotent, commutative and associative;
/// every add (bits in an epoch) and every advance of the clock (epochs to the top) inflates.
///
/// Time never comes from a system clock: the caller passes it, as `now` in the unit of
/// `epoch_len` ([`ExpiringBloom::add_at`], [`ExpiringBloom::advance_to`],
/// [`ExpiringBloom::contains_at`]). [`Membership::add`] adds to the newest epoch the state
/// knows, [`Membership::contains`] answers over the live epochs of the state, so two replicas
/// with equal states answer equally whatever their clocks say.
///
/// # Where an add lands
///
/// `add_at(x, now)` first advances the clock to `now`'s epoch, then adds `x` to the *newest*
/// epoch of the state, which is `now`'s epoch or, if the state has merged a clock that is
/// ahead, that later epoch. An add is never refused and never lands in a dropped epoch.
///
/// # Lifetime, and what clock skew does
///
/// Without skew, an element added at time `t` is contained from `t` until the clock reaches
/// the end of the window of its epoch: for between `(W - 1)·epoch_len` and `W·epoch_len`.
///
/// With skew, let every replica's clock be at most `S·epoch_len` ahead of every other's, with
/// `S ≤ max_skew`. The watermark follows the fastest clock that has reached the state (a max is all
/// replicas can agree on without coordinating). Then:
///
/// - A replica whose clock is ahead puts its adds in a later epoch, which expires later, and
///   its clock, once merged, moves every replica's watermark forward: elements that others
///   added expire up to `S` epochs early.
/// - A replica whose clock is behind but has merged a faster state adds to that state's newest
///   epoch, so its elements live as long as anyone's. One that has not heard from the faster
///   replicas adds to its own newest epoch, which the others may already have dropped: the
///   add is contained on that replica until it merges their state, and dropped by every
///   replica whose watermark has passed that epoch, as soon as it merges. By the fastest
///   clock, that element's window had already ended. The state stays a lattice state: the
///   dropped epochs are a prefix below the max of the clocks.
///
/// So an element is contained on every replica that has received it for at least
/// `(W - S - 1)·epoch_len` after its add, and it is gone from a replica at most
/// `(W + S)·epoch_len` after its add, once that replica's own clock has been advanced (by
/// `advance_to` or `add_at`, which the caller does on a timer) or it has merged an advanced
/// state; `contains_at(x, now)` answers as of `now` without advancing. `max_skew < W` is
/// required. A received state or delta whose clock is more than `max_skew` epochs ahead of
/// the receiver's clock would expire everything early by that much, irreversibly (the
/// watermark never goes back): [`ExpiringBloom::check_remote_at`] refuses it
/// ([`FilterError::ClockAhead`]), and the receiver's caller should check before merging.
///
/// # FPR and memory
///
/// Every live epoch is a Bloom filter of [`ExpiringParams::bloom`]; an epoch is allocated at
/// its first add, so memory is `bloom.memory_bytes()` per live epoch that has elements, at most
/// [`ExpiringParams::memory_bytes`] (`W` epochs). The per-epoch estimates are those of each
/// epoch's filter ([`ExpiringBloom::live_epochs`]); a query is positive if any live epoch is,
/// so the window's FPR is `1 - Π(1 - f_e)` over the live epochs' FPRs `f_e` (at most `Σ f_e`),
/// which is what [`Membership::estimated_fpr`] reports. All epochs hash alike (one hash per
/// query), and their false positives are independent because different adds set their bits.
/// [`Membership::cardinality`] sums the epochs' estimates: an element added in several epochs
/// counts once per epoch.
///
/// ```
/// use crpf::{ExpiringBloom, ExpiringParams, Lattice, Membership};
///
/// // Epochs of 1000 ms, a window of 3 epochs, clocks at most 1 epoch apart.
/// let params = ExpiringParams::with_window(1000, 0.01, 1000, 3, 1)?;
/// let mut a = ExpiringBloom::new(params)?;
/// let mut b = ExpiringBloom::new(params)?;
/// a.add_at(b"session-1", 10_500);         // epoch 10
/// b.add_at(b"session-2", 11_200);         // epoch 11
/// b.check_remote_at(&a, 11_200)?;         // a's clock is not ahead of b's
/// b.merge(&a)?;
/// assert!(b.contains(b"session-1") && b.contains(b"session-2"));
/// b.advance_to(13_000);                   // epoch 13: the window is 11..=13
/// assert!(!b.contains(b"session-1") && b.contains(b"session-2"));
/// a.merge(&b)?;                           // the watermark travels with the state
/// assert!(!a.contains(b"session-1"));
/// # Ok::<(), crpf::FilterError>(())
/// ```
#[derive(Clone)]
pub struct ExpiringBloom {
    params: ExpiringParams,
    /// The newest epoch reached; the live epochs are `low()..=newest`.
    newest: u64,
    /// The live epochs that have elements, each below `newest - W` dropped.
    epochs: BTreeMap<u64, GBloom>,
    /// Whether epochs record delta-states.
    tracking: bool,
    /// A local advance moved `newest` since the last `take_delta`.
    advanced: bool,
}

/// Delta of an [`ExpiringBloom`]: the sender's clock and, per live epoch, the bits its local
/// adds set. Joining it raises the receiver's clock to `newest` (dropping what falls below the
/// watermark) and sets the bits of the epochs still live.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiringDelta {
    /// The sender's newest epoch when it took the delta.
    pub newest: u64,
    /// `(epoch, bits)`, epochs ascending, all within the window ending at `newest`.
    pub epochs: Vec<(u64, BloomDelta)>,
}

impl ExpiringBloom {
    /// An empty filter (clock at epoch 0) with validated parameters.
    pub fn new(params: ExpiringParams) -> Result<Self, FilterError> {
        Ok(Self {
            params: params.validated()?,
            newest: 0,
            epochs: BTreeMap::new(),
            tracking: false,
            advanced: false,
        })
    }

    /// [`ExpiringParams::with_window`] and [`ExpiringBloom::new`].
    pub fn with_window(
        per_epoch_capacity: u64,
        fpr: f64,
        epoch_len: u64,
        window: u32,
        max_skew: u32,
    ) -> Result<Self, FilterError> {
        Self::new(ExpiringParams::with_window(
            per_epoch_capacity,
            fpr,
            epoch_len,
            window,
            max_skew,
        )?)
    }

    /// The filter's parameters.
    pub fn params(&self) -> &ExpiringParams {
        &self.params
    }

    /// The newest epoch this state has reached (its clock).
    pub fn newest_epoch(&self) -> u64 {
        self.newest
    }

    /// The low-watermark: the oldest live epoch, `newest - W + 1` (0 early on).
    pub fn oldest_live_epoch(&self) -> u64 {
        self.newest.saturating_sub(self.params.window as u64 - 1)
    }

    /// The live epochs that have elements, oldest first, with their filters (whose
    /// `estimated_fpr`, `cardinality` and `params().memory_bytes()` are the per-epoch figures).
    pub fn live_epochs(&self) -> impl Iterator<Item = (u64, &GBloom)> {
        self.epochs.iter().map(|(e, f)| (*e, f))
    }

    /// Bytes the allocated epoch filters take.
    pub fn memory_bytes(&self) -> u64 {
        self.epochs.len() as u64 * self.params.bloom.memory_bytes()
    }

    /// Advances the clock to `now`'s epoch (nothing if the state is already there or past it)
    /// and drops the epochs that leave the window. Returns how many allocated epochs it
    /// dropped.
    pub fn advance_to(&mut self, now: u64) -> usize {
        let before = self.newest;
        let dropped = self.raise_to(self.params.epoch_of(now));
        if self.tracking && self.newest != before {
            self.advanced = true;
        }
        dropped
    }

    /// Advances the clock to `now` ([`ExpiringBloom::advance_to`]) and adds the item to the
    /// newest epoch (see "Where an add lands" above).
    pub fn add_at(&mut self, item: &[u8], now: u64) {
        self.advance_to(now);
        self.add_newest(item);
    }

    /// Whether the item may have been added and is live *as of `now`*: the answer
    /// [`Membership::contains`] would give after `advance_to(now)`, without changing the state.
    /// A `now` before the state's clock answers over the state's window.
    pub fn contains_at(&self, item: &[u8], now: u64) -> bool {
        let low = self.oldest_live_epoch().max(
            self.params
                .epoch_of(now)
                .saturating_sub(self.params.window as u64 - 1),
        );
        let h = hash_item(item, self.params.bloom.seed);
        self.epochs.range(low..).any(|(_, f)| f.contains_hashed(h))
    }

    /// `Ok` if a state received from another replica is within the skew bound: its clock is at
    /// most `max_skew` epochs ahead of `now`'s epoch (this replica's clock). Otherwise
    /// [`FilterError::ClockAhead`]: merging it would expire live elements more than `max_skew`
    /// epochs early on this replica and, through it, on all others.
    pub fn check_remote_at(&self, other: &Self, now: u64) -> Result<(), FilterError> {
        self.check_clock(other.newest, now)
    }

    /// [`ExpiringBloom::check_remote_at`] for a received delta.
    pub fn check_remote_delta_at(
        &self,
        delta: &ExpiringDelta,
        now: u64,
    ) -> Result<(), FilterError> {
        self.check_clock(delta.newest, now)
    }

    fn check_clock(&self, remote_newest: u64, now: u64) -> Result<(), FilterError> {
        let local = self.params.epoch_of(now);
        if remote_newest > local.saturating_add(self.params.max_skew as u64) {
            Err(FilterError::ClockAhead {
                remote_epoch: remote_newest,
                local_epoch: local,
                max_skew: self.params.max_skew,
            })
        } else {
            Ok(())
        }
    }

    /// Repairs a state whose clock is more than `max_skew` epochs ahead of `now`'s epoch (it
    /// was advanced by a clock that ran ahead and was corrected since, perhaps restored from a
    /// snapshot taken meanwhile): the clock goes back to `now`'s epoch and the epochs beyond it
    /// are discarded. Returns the clock it had, if it repaired.
    ///
    /// Not a lattice operation: the clock only ever grows by merges, and this lowers it. It is
    /// safe because no honest replica holds such a state: every receiver refuses one further
    /// ahead of its own clock than `max_skew` ([`ExpiringBloom::check_remote_at`]), so the
    /// discarded epochs never reached a replica that could send them back, and the peers'
    /// states (which the state refused while it was ahead) merge again afterwards.
    pub fn rewind_if_ahead(&mut self, now: u64) -> Option<u64> {
        let local = self.params.epoch_of(now);
        if self.newest <= local.saturating_add(self.params.max_skew as u64) {
            return None;
        }
        let was = std::mem::replace(&mut self.newest, local);
        self.epochs.split_off(&(local + 1));
        Some(was)
    }

    /// Raises `newest` to `epoch` if it is ahead and drops what leaves the window.
    fn raise_to(&mut self, epoch: u64) -> usize {
        if epoch <= self.newest {
            return 0;
        }
        self.newest = epoch;
        let keep = self.epochs.split_off(&self.oldest_live_epoch());
        std::mem::replace(&mut self.epochs, keep).len()
    }

    /// The filter of a live epoch, allocated (empty) at first use.
    fn epoch_mut(&mut self, epoch: u64) -> Result<&mut GBloom, FilterError> {
        debug_assert!(epoch >= self.oldest_live_epoch() && epoch <= self.newest);
        Ok(match self.epochs.entry(epoch) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let mut f = GBloom::new(self.params.bloom)?;
                f.track_deltas(self.tracking);
                v.insert(f)
            }
        })
    }

    fn add_newest(&mut self, item: &[u8]) {
        let newest = self.newest;
        // The parameters were validated, so building an epoch's filter cannot fail.
        if let Ok(f) = self.epoch_mut(newest) {
            let _ = f.add(item);
        }
    }
}

impl fmt::Debug for ExpiringBloom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpiringBloom")
            .field("params", &self.params)
            .field("newest", &self.newest)
            .field("epochs", &self.epochs)
            .finish()
    }
}

impl Lattice for ExpiringBloom {
    fn merge(&mut self, other: &Self) -> Result<(), FilterError> {
        FilterError::require_same("expiring", &self.params, &other.params)?;
        self.raise_to(other.newest);
        let low = self.oldest_live_epoch();
        for (&e, theirs) in other.epochs.range(low..) {
            match self.epochs.entry(e) {
                Entry::Occupied(mut o) => o.get_mut().merge(theirs)?,
                Entry::Vacant(v) => {
                    // A copy must not carry the other side's pending delta.
                    let mut f = theirs.clone();
                    f.track_deltas(self.tracking);
                    v.insert(f);
                }
            }
        }
        Ok(())
    }

    fn le(&self, other: &Self) -> bool {
        if self.params != other.params || self.newest > other.newest {
            return false;
        }
        // Epochs below the other's watermark are dropped there: the top of their lattice.
        self.epochs
            .range(other.oldest_live_epoch()..)
            .all(|(e, mine)| match other.epochs.get(e) {
                Some(theirs) => mine.le(theirs),
                None => mine.ones() == 0,
            })
    }
}

impl Membership for ExpiringBloom {
    /// Over the live epochs of the state (see [`ExpiringBloom::contains_at`] for "as of now").
    fn contains(&self, item: &[u8]) -> bool {
        let h = hash_item(item, self.params.bloom.seed);
        self.epochs.values().any(|f| f.contains_hashed(h))
    }

    /// Adds to the newest epoch the state knows, without advancing the clock
    /// ([`ExpiringBloom::add_at`] advances it first). Never fails.
    fn add(&mut self, item: &[u8]) -> Result<(), FilterError> {
        let newest = self.newest;
        self.epoch_mut(newest)?.add(item)
    }

    /// Sum of the live epochs' Eq. 3.20 estimates.
    fn cardinality(&self) -> f64 {
        self.epochs.values().map(Membership::cardinality).sum()
    }

    /// Elements a full window holds: `W` times the per-epoch capacity.
    fn capacity(&self) -> u64 {
        (self.params.window as u64).saturating_mul(self.params.bloom.capacity)
    }

    fn load_factor(&self) -> f64 {
        self.cardinality() / self.capacity() as f64
    }

    /// The window's FPR, `1 - Π(1 - f_e)` over the live epochs.
    fn estimated_fpr(&self) -> f64 {
        1.0 - self
            .epochs
            .values()
            .map(|f| 1.0 - f.estimated_fpr())
            .product::<f64>()
    }
}

impl DeltaState for ExpiringBloom {
    type Delta = ExpiringDelta;

    fn track_deltas(&mut self, on: bool) {
        self.tracking = on;
        self.advanced = false;
        for f in self.epochs.values_mut() {
            f.track_deltas(on);
        }
    }

    fn take_delta(&mut self) -> Option<ExpiringDelta> {
        if !self.tracking {
            return None;
        }
        let epochs: Vec<(u64, BloomDelta)> = (self.epochs.iter_mut())
            .filter_map(|(e, f)| f.take_delta().map(|d| (*e, d)))
            .collect();
        if epochs.is_empty() && !self.advanced {
            return None;
        }
        self.advanced = false;
        Some(ExpiringDelta {
            newest: self.newest,
            epochs,
        })
    }

    fn pending_delta_len(&self) -> usize {
        let bits: usize = self.epochs.values().map(|f| f.pending_delta_len()).sum();
        bits + self.advanced as usize
    }

    /// The item's bits in the newest epoch, where an add puts it (an older epoch holding it
    /// expires sooner than the add promised).
    fn record_footprint(&mut self, item: &[u8]) -> bool {
        let newest = self.newest;
        self.epochs
            .get_mut(&newest)
            .is_some_and(|f| f.record_footprint(item))
    }

    /// Epochs strictly ascending, within the window that ends at the delta's clock, and bits
    /// within the epoch filter.
    fn check_delta(&self, delta: &ExpiringDelta) -> Result<(), FilterError> {
        let low = delta.newest.saturating_sub(self.params.window as u64 - 1);
        let mut prev: Option<u64> = None;
        for (e, d) in &delta.epochs {
            if prev.is_some_and(|p| p >= *e) || *e < low || *e > delta.newest {
                return Err(FilterError::malformed(format!(
                    "delta epoch {e} out of order or outside the window {low}..={}",
                    delta.newest
                )));
            }
            prev = Some(*e);
            check_bloom_delta(&self.params.bloom, d)?;
        }
        Ok(())
    }

    fn merge_delta(&mut self, delta: &ExpiringDelta) -> Result<(), FilterError> {
        self.check_delta(delta)?;
        self.raise_to(delta.newest);
        let low = self.oldest_live_epoch();
        for (e, d) in &delta.epochs {
            if *e >= low && !d.bits.is_empty() {
                self.epoch_mut(*e)?.merge_delta(d)?;
            }
        }
        Ok(())
    }
}

impl CheckRemote for ExpiringBloom {
    /// Grow-only: no tags, nothing to check. The clock check needs the receiver's time:
    /// [`ExpiringBloom::check_remote_at`].
    fn check_remote(&self, _other: &Self) -> Result<(), FilterError> {
        Ok(())
    }
    fn check_remote_delta(&self, _delta: &ExpiringDelta) -> Result<(), FilterError> {
        Ok(())
    }
}

/// The expiring filter in a replica: time is the wall clock in milliseconds, the spec's
/// `capacity` is the elements added per window, and its `fpr` the window's.
impl crate::core::kind::ReplicatedFilter for ExpiringBloom {
    const KIND: crate::core::kind::FilterKind = crate::core::kind::FilterKind::ExpiringBloom;
    const CLOCKED: bool = true;

    fn from_spec(
        spec: &crate::core::kind::FilterSpec,
        _replica: crate::ReplicaId,
    ) -> Result<Self, FilterError> {
        let expiry = spec.expiry.unwrap_or_default();
        if expiry.epochs == 0 || expiry.window_ms / u64::from(expiry.epochs) == 0 {
            return Err(FilterError::invalid(
                "expiry",
                format!(
                    "a window of {} ms cannot be cut into {} epochs of at least 1 ms",
                    expiry.window_ms, expiry.epochs
                ),
            ));
        }
        let per_epoch = spec.capacity.div_ceil(u64::from(expiry.epochs)).max(1);
        let mut params = ExpiringParams::with_window(
            per_epoch,
            spec.fpr,
            expiry.epoch_ms(),
            expiry.epochs,
            expiry.max_skew_epochs,
        )?;
        params.bloom.seed = spec.seed();
        ExpiringBloom::new(params)
    }

    fn params_digest(&self) -> u64 {
        self.params.digest()
    }

    /// The clock and, per live epoch that holds anything, its bits.
    fn digest_state(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        h.update(&self.newest.to_le_bytes());
        for (e, f) in self.epochs.iter().filter(|(_, f)| f.ones() > 0) {
            h.update(&e.to_le_bytes());
            f.digest_state(h);
        }
    }

    fn sub_filters(&self) -> usize {
        self.epochs.len().max(1)
    }

    fn tick(&mut self, now_ms: u64) -> bool {
        let before = self.newest;
        self.advance_to(now_ms);
        self.newest != before
    }

    fn contains_as_of(&self, item: &[u8], now_ms: u64) -> bool {
        self.contains_at(item, now_ms)
    }

    fn check_remote_as_of(&self, other: &Self, now_ms: u64) -> Result<(), FilterError> {
        self.check_remote_at(other, now_ms)
    }

    fn check_remote_delta_as_of(
        &self,
        delta: &ExpiringDelta,
        now_ms: u64,
    ) -> Result<(), FilterError> {
        self.check_remote_delta_at(delta, now_ms)
    }
}

/// Serialized form: the parameters, the clock, and the live epochs with their filters.
#[derive(Deserialize)]
struct Repr {
    params: ExpiringParams,
    newest: u64,
    epochs: Vec<(u64, GBloom)>,
}

impl Serialize for ExpiringBloom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ReprRef<'a> {
            params: &'a ExpiringParams,
            newest: u64,
            epochs: Vec<(u64, &'a GBloom)>,
        }
        ReprRef {
            params: &self.params,
            newest: self.newest,
            epochs: self.epochs.iter().map(|(e, f)| (*e, f)).collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ExpiringBloom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = Repr::deserialize(d)?;
        Self::try_from(repr).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<Repr> for ExpiringBloom {
    type Error = FilterError;
    fn try_from(repr: Repr) -> Result<Self, FilterError> {
        let mut f = ExpiringBloom::new(repr.params)?;
        f.newest = repr.newest;
        let low = f.oldest_live_epoch();
        let mut prev: Option<u64> = None;
        for (e, bloom) in repr.epochs {
            if prev.is_some_and(|p| p >= e) || e < low || e > f.newest {
                return Err(FilterError::malformed(format!(
                    "epoch {e} out of order or outside the window {low}..={}",
                    f.newest
                )));
            }
            prev = Some(e);
            if bloom.params() != &f.params.bloom {
                return Err(FilterError::malformed(format!(
                    "epoch {e} has other bloom parameters than the filter"
                )));
            }
            f.epochs.insert(e, bloom);
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 1000; // time units per epoch
    const W: u32 = 4;

    fn params(max_skew: u32) -> ExpiringParams {
        // Big enough for the few hundred elements below that a false positive is unlikely;
        // the hashes are seeded, so the tests are deterministic either way.
        ExpiringParams::with_window(2000, 1e-6, LEN, W, max_skew).unwrap()
    }

    fn item(i: u32) -> [u8; 4] {
        i.to_le_bytes()
    }

    #[test]
    fn a_state_ahead_of_a_corrected_clock_rewinds_and_merges_again() {
        let mut honest = ExpiringBloom::new(params(1)).unwrap();
        let mut stepped = ExpiringBloom::new(params(1)).unwrap();
        honest.add_at(&item(1), 10 * LEN);
        stepped.merge(&honest).unwrap();
        // The clock steps 100 epochs ahead: an add there drops everything else.
        stepped.add_at(&item(2), 110 * LEN);
        assert!(honest.check_remote_at(&stepped, 10 * LEN).is_err());
        // Within the skew: nothing to repair.
        assert_eq!(stepped.rewind_if_ahead(109 * LEN), None);
        // Corrected: back to its epoch, the future epochs gone, and the peer's state merges.
        assert_eq!(stepped.rewind_if_ahead(10 * LEN + 5), Some(110));
        assert_eq!(stepped.newest_epoch(), 10);
        assert!(!stepped.contains(&item(2)) && !stepped.contains(&item(1)));
        assert!(honest.check_remote_at(&stepped, 10 * LEN).is_ok());
        stepped.merge(&honest).unwrap();
        assert!(stepped.contains(&item(1)));
        stepped.add_at(&item(3), 10 * LEN + 10);
        honest.merge(&stepped).unwrap();
        assert!(honest.contains(&item(3)) && honest.newest_epoch() == 10);
    }

    /// A replica: its filter and its clock offset from real time (the skew).
    struct Replica {
        f: ExpiringBloom,
        offset: i64,
    }

    impl Replica {
        fn now(&self, real: u64) -> u64 {
            (real as i64 + self.offset) as u64
        }
    }

    /// Everyone merges everyone's state (after the clock check), in a ring, twice round; or,
    /// `via_deltas`, everyone sends its delta to everyone else.
    fn gossip(reps: &mut [Replica], real: u64, via_deltas: bool) {
        let n = reps.len();
        if via_deltas {
            let deltas: Vec<Option<ExpiringDelta>> =
                reps.iter_mut().map(|r| r.f.take_delta()).collect();
            for (from, d) in deltas.iter().enumerate() {
                let Some(d) = d else { continue };
                for (_, r) in reps.iter_mut().enumerate().filter(|(to, _)| *to != from) {
                    let now = r.now(real);
                    r.f.check_remote_delta_at(d, now).unwrap();
                    r.f.merge_delta(d).unwrap();
                }
            }
            return;
        }
        for k in 0..2 * n {
            let (from, to) = (k % n, (k + 1) % n);
            let src = reps[from].f.clone();
            let now = reps[to].now(real);
            reps[to].f.check_remote_at(&src, now).unwrap();
            reps[to].f.merge(&src).unwrap();
        }
    }

    /// Real time advances in steps of a quarter epoch; each replica adds elements at its own
    /// clock, advances on every step, and gossips every step. Each element is checked on every
    /// replica against the stated bounds: contained for `(W - S - 1)` epochs after the add,
    /// gone `(W + S)` epochs after it. Replicated by full states, then by delta-states.
    fn lifetimes(offsets: &[i64], max_skew: u32) {
        lifetimes_with(offsets, max_skew, false);
        lifetimes_with(offsets, max_skew, true);
    }

    fn lifetimes_with(offsets: &[i64], max_skew: u32, via_deltas: bool) {
        let skew_epochs = {
            let (lo, hi) = (offsets.iter().min().unwrap(), offsets.iter().max().unwrap());
            ((hi - lo) as u64).div_ceil(LEN)
        };
        assert!(skew_epochs <= max_skew as u64);
        let mut reps: Vec<Replica> = offsets
            .iter()
            .map(|&offset| {
                let mut f = ExpiringBloom::new(params(max_skew)).unwrap();
                f.track_deltas(via_deltas);
                Replica { f, offset }
            })
            .collect();
        let start = 100 * LEN;
        let mut added: Vec<(u32, u64)> = Vec::new(); // (item, real time of the add)
        let mut next_item = 0;
        let step = LEN / 4;
        for s in 0..(12 * 4) {
            let real = start + s * step;
            for r in reps.iter_mut() {
                let now = r.now(real);
                r.f.advance_to(now);
                if s < 16 {
                    r.f.add_at(&item(next_item), now);
                    added.push((next_item, real));
                    next_item += 1;
                }
            }
            gossip(&mut reps, real, via_deltas);
            for &(it, at) in &added {
                let age = real - at;
                for (ri, r) in reps.iter().enumerate() {
                    let c = r.f.contains(&item(it));
                    if age < (W as u64 - skew_epochs - 1) * LEN {
                        assert!(c, "item {it} added at {at} gone at {real} on replica {ri}");
                    }
                    if age >= (W as u64 + skew_epochs) * LEN {
                        assert!(!c, "item {it} added at {at} still there at {real} on {ri}");
                    }
                }
            }
            for r in &reps {
                assert!(r.f.epochs.len() <= W as usize);
                assert!(r.f.memory_bytes() <= r.f.params.memory_bytes());
            }
        }
        // Converged: every replica has the same state.
        for r in &reps[1..] {
            assert!(r.f.equivalent(&reps[0].f));
        }
    }

    #[test]
    fn contained_during_the_window_and_gone_after_without_skew() {
        lifetimes(&[0, 0, 0], 0);
    }

    #[test]
    fn contained_during_the_window_and_gone_after_with_skew() {
        // One replica a little over half an epoch ahead, one a whole epoch behind.
        lifetimes(&[0, 600, -1000], 2);
        lifetimes(&[0, 999], 1);
    }

    /// Without skew the lifetime is exactly the window: `(W-1)` to `W` epochs.
    #[test]
    fn exact_window_without_skew() {
        let mut f = ExpiringBloom::new(params(0)).unwrap();
        f.add_at(b"x", 10 * LEN + 999); // epoch 10, at its very end
        f.add_at(b"y", 11 * LEN); // epoch 11, at its very start
        f.advance_to(13 * LEN + 999);
        assert!(f.contains(b"x") && f.contains(b"y"));
        f.advance_to(14 * LEN); // epoch 14: window 11..=14
        assert!(!f.contains(b"x") && f.contains(b"y"));
        assert!(f.contains_at(b"y", 14 * LEN + 999) && !f.contains_at(b"y", 15 * LEN));
        assert!(f.contains(b"y"), "contains_at changed nothing");
        f.advance_to(3 * LEN); // the clock never goes back
        assert_eq!(f.newest_epoch(), 14);
    }

    /// A replica far behind, that has not heard from the others, adds into an epoch they have
    /// dropped: it holds the element until it merges their state, they never take it in.
    #[test]
    fn an_add_in_an_epoch_others_dropped_vanishes_on_merge() {
        let p = ExpiringParams {
            max_skew: 3,
            ..params(0)
        };
        let mut ahead = ExpiringBloom::new(p).unwrap();
        let mut behind = ExpiringBloom::new(p).unwrap();
        ahead.add_at(b"a", 20 * LEN);
        behind.add_at(b"b", 16 * LEN); // epoch 16 < 20 - 4 + 1
        assert!(behind.contains(b"b"));
        let mut merged = ahead.clone();
        merged.merge(&behind).unwrap();
        assert!(!merged.contains(b"b") && merged.contains(b"a"));
        assert!(
            merged.equivalent(&ahead),
            "nothing of epoch 16 was taken in"
        );
        assert!(
            behind.check_remote_at(&ahead, 16 * LEN).is_err(),
            "4 epochs ahead"
        );
        assert!(behind.check_remote_at(&ahead, 17 * LEN).is_ok());
        behind.merge(&ahead).unwrap();
        assert!(!behind.contains(b"b") && behind.contains(b"a"));
        assert!(behind.equivalent(&ahead));
        // Having merged, the slow replica adds to the newest epoch it knows (20), not to 17.
        behind.add_at(b"c", 17 * LEN);
        assert_eq!(behind.live_epochs().last().unwrap().0, 20);
    }

    #[test]
    fn a_state_from_too_far_ahead_is_refused() {
        let f = ExpiringBloom::new(params(1)).unwrap();
        let mut future = f.clone();
        future.add_at(b"x", 50 * LEN);
        assert_eq!(
            f.check_remote_at(&future, 48 * LEN + 999),
            Err(FilterError::ClockAhead {
                remote_epoch: 50,
                local_epoch: 48,
                max_skew: 1
            })
        );
        assert!(f.check_remote_at(&future, 49 * LEN).is_ok());
        let mut t = future.clone();
        t.track_deltas(true);
        t.add_at(b"y", 51 * LEN);
        let d = t.take_delta().unwrap();
        assert!(f.check_remote_delta_at(&d, 49 * LEN).is_err());
        assert!(f.check_remote_delta_at(&d, 50 * LEN).is_ok());
    }

    #[test]
    fn parameters_are_bounded() {
        let p = params(1);
        assert!(ExpiringParams { window: 0, ..p }.validated().is_err());
        assert!(ExpiringParams { epoch_len: 0, ..p }.validated().is_err());
        assert!(ExpiringParams { max_skew: W, ..p }.validated().is_err());
        assert!(
            ExpiringParams {
                window: ExpiringParams::MAX_WINDOW + 1,
                max_skew: 0,
                ..p
            }
            .validated()
            .is_err()
        );
        // 4096 epochs of 3.6 MiB: over MAX_FILTER_BYTES together, though each is fine.
        let big = ExpiringParams {
            bloom: BloomParams::with_capacity(1 << 21, 0.001).unwrap(),
            window: ExpiringParams::MAX_WINDOW,
            ..p
        };
        assert!(matches!(big.validated(), Err(FilterError::TooLarge { .. })));
        assert!(ExpiringBloom::new(big).is_err());
    }

    #[test]
    fn window_fpr_is_the_combination_of_the_epochs() {
        let p = ExpiringParams::with_window(1000, 0.05, LEN, 3, 0).unwrap();
        let mut f = ExpiringBloom::new(p).unwrap();
        for e in 0..3u64 {
            for i in 0..1000u32 {
                f.add_at(&(e as u32 * 10_000 + i).to_le_bytes(), e * LEN);
            }
        }
        let per: Vec<f64> = f.live_epochs().map(|(_, g)| g.estimated_fpr()).collect();
        assert_eq!(per.len(), 3);
        let combined = 1.0 - per.iter().map(|x| 1.0 - x).product::<f64>();
        assert!((f.estimated_fpr() - combined).abs() < 1e-12);
        assert!(combined <= per.iter().sum::<f64>());
        // Measured over fresh keys: near the estimate, and under the window's target.
        let fresh = 200_000u32;
        let fp = (0..fresh)
            .filter(|i| f.contains(&(1_000_000 + i).to_le_bytes()))
            .count() as f64
            / fresh as f64;
        assert!(
            (fp - combined).abs() < 0.25 * combined,
            "{fp} vs {combined}"
        );
        assert!(fp < 0.05 * 1.1, "{fp}");
        assert_eq!(f.memory_bytes(), 3 * p.bloom.memory_bytes());
    }

    #[test]
    fn delta_carries_the_clock() {
        let mut a = ExpiringBloom::new(params(1)).unwrap();
        let mut b = a.clone();
        a.track_deltas(true);
        a.add_at(b"x", 5 * LEN);
        b.merge_delta(&a.take_delta().unwrap()).unwrap();
        assert!(b.equivalent(&a));
        a.advance_to(20 * LEN); // no add, only the clock moved: still a delta
        assert_eq!(a.pending_delta_len(), 1);
        let d = a.take_delta().unwrap();
        assert!(d.epochs.is_empty());
        b.merge_delta(&d).unwrap();
        assert!(b.equivalent(&a) && !b.contains(b"x"));
        assert!(a.take_delta().is_none());
        let bad = ExpiringDelta {
            newest: 20,
            epochs: vec![(16, BloomDelta { bits: vec![1] })],
        };
        let before = b.clone();
        assert!(b.merge_delta(&bad).is_err(), "epoch 16 is outside 17..=20");
        assert!(b.equivalent(&before));
    }
}
