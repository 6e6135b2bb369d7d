//! Where a cuckoo table keeps its slots' payloads: nothing for GCF, and for ORCF a bit-packed
//! column of version tags that takes the bits the tags in it need rather than 64 per slot.
//!
//! A tag is `replica << 48 | timestamp`. The column stores `(index of the replica in a small
//! table of the replicas seen, timestamp)` at `replica_bits + counter_bits` bits per slot,
//! widening (and repacking every slot once) when a timestamp or a new replica does not fit.
//! A 10M-slot ORCF whose tags come from a few replicas takes 26 bits per slot instead of 64.

use std::collections::HashMap;

use crate::core::causal::{MAX_COUNTER, ReplicaId};

/// A payload column of a fixed number of slots, all starting at the default payload.
pub(crate) trait Column<P>: Clone + Send + Sync {
    fn new(slots: usize) -> Self;
    fn get(&self, slot: usize) -> P;
    fn set(&mut self, slot: usize, value: P);
    /// Starts loading the payloads of slots `first..first + n` (a hint, see
    /// [`crate::core::prefetch`]); nothing where there are none.
    #[inline(always)]
    fn prefetch(&self, _first: usize, _n: usize) {}
}

/// GCF entries carry nothing.
#[derive(Clone, Copy, Default)]
pub(crate) struct NoPayload;

impl Column<()> for NoPayload {
    fn new(_: usize) -> Self {
        NoPayload
    }
    #[inline(always)]
    fn get(&self, _: usize) {}
    #[inline(always)]
    fn set(&mut self, _: usize, _: ()) {}
}

/// Timestamp bits to start with: 16M adds per replica before the first widening.
const START_COUNTER_BITS: u32 = 24;
/// Widening step of the timestamp field (so that a growing clock repacks at most 3 times).
const COUNTER_STEP: u32 = 8;
const COUNTER_BITS_MAX: u32 = 48;

/// Version tags, bit-packed (see the module documentation).
#[derive(Clone)]
pub(crate) struct TagColumn {
    /// `slots * width` bits, plus one word so that a read never needs a bounds branch.
    words: Vec<u64>,
    slots: usize,
    counter_bits: u32,
    replica_bits: u32,
    /// The replicas seen, by index; index 0 is replica 0, so that all-zero bits are tag 0
    /// (an empty slot).
    replicas: Vec<ReplicaId>,
    index: HashMap<ReplicaId, u64>,
}

impl TagColumn {
    fn with_widths(slots: usize, counter_bits: u32, replica_bits: u32) -> Self {
        let width = (counter_bits + replica_bits) as usize;
        TagColumn {
            words: crate::core::huge_pages::zeroed_vec((slots * width).div_ceil(64) + 1),
            slots,
            counter_bits,
            replica_bits,
            replicas: vec![0],
            index: HashMap::from([(0, 0)]),
        }
    }

    #[inline(always)]
    fn width(&self) -> u32 {
        self.counter_bits + self.replica_bits
    }

    #[inline(always)]
    fn read(&self, slot: usize) -> u64 {
        let width = self.width();
        let bit = slot * width as usize;
        let (w, shift) = (bit / 64, (bit % 64) as u32);
        let mut v = self.words[w] >> shift;
        if shift + width > 64 {
            v |= self.words[w + 1] << (64 - shift);
        }
        v & mask(width)
    }

    #[inline(always)]
    fn write(&mut self, slot: usize, v: u64) {
        let width = self.width();
        let m = mask(width);
        let bit = slot * width as usize;
        let (w, shift) = (bit / 64, (bit % 64) as u32);
        self.words[w] = (self.words[w] & !(m << shift)) | (v << shift);
        if shift + width > 64 {
            let back = 64 - shift;
            self.words[w + 1] = (self.words[w + 1] & !(m >> back)) | (v >> back);
        }
    }

    /// The replica's index, added (widening the column if needed) when it is new.
    #[inline(always)]
    fn replica_index(&mut self, replica: ReplicaId) -> u64 {
        // A scan of a few ids beats hashing on the add path.
        if self.replicas.len() <= 8 {
            if let Some(i) = self.replicas.iter().position(|&r| r == replica) {
                return i as u64;
            }
        } else if let Some(&i) = self.index.get(&replica) {
            return i;
        }
        let i = self.replicas.len() as u64;
        if i >> self.replica_bits != 0 {
            self.repack(self.counter_bits, self.replica_bits + 2);
        }
        self.replicas.push(replica);
        self.index.insert(replica, i);
        i
    }

    /// Moves every slot to new widths (only ever wider).
    #[cold]
    fn repack(&mut self, counter_bits: u32, replica_bits: u32) {
        let mut wider = TagColumn::with_widths(self.slots, counter_bits, replica_bits);
        for slot in 0..self.slots {
            let v = self.read(slot);
            let (r, c) = (v >> self.counter_bits, v & mask(self.counter_bits));
            wider.write(slot, r << counter_bits | c);
        }
        wider.replicas = std::mem::take(&mut self.replicas);
        wider.index = std::mem::take(&mut self.index);
        *self = wider;
    }
}

#[inline(always)]
fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    }
}

impl Column<u64> for TagColumn {
    fn new(slots: usize) -> Self {
        TagColumn::with_widths(slots, START_COUNTER_BITS, 2)
    }

    #[inline(always)]
    fn get(&self, slot: usize) -> u64 {
        let v = self.read(slot);
        let replica = self.replicas[(v >> self.counter_bits) as usize];
        u64::from(replica) << 48 | (v & mask(self.counter_bits))
    }

    /// The words holding the slots' bits: their first and last cache lines (a 4-slot
    /// bucket's tags take 104 bits at 26 per slot, so at most two lines).
    #[inline(always)]
    fn prefetch(&self, first: usize, n: usize) {
        let width = self.width() as usize;
        let (start, end) = (first * width / 64, ((first + n) * width - 1) / 64);
        let (Some(a), Some(b)) = (self.words.get(start), self.words.get(end)) else {
            return;
        };
        crate::core::prefetch::prefetch(a);
        // By address: the allocator aligns the words to 16 bytes, not to a cache line.
        if (a as *const u64 as usize) >> 6 != (b as *const u64 as usize) >> 6 {
            crate::core::prefetch::prefetch(b);
        }
    }

    #[inline(always)]
    fn set(&mut self, slot: usize, tag: u64) {
        let counter = tag & MAX_COUNTER;
        if counter >> self.counter_bits != 0 {
            let needed = 64 - counter.leading_zeros();
            let bits = needed.max(self.counter_bits + COUNTER_STEP);
            self.repack(bits.min(COUNTER_BITS_MAX), self.replica_bits);
        }
        let r = self.replica_index((tag >> 48) as ReplicaId);
        self.write(slot, r << self.counter_bits | counter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_read_back_through_every_widening() {
        let mut rng = fastrand::Rng::with_seed(3);
        let slots = 1000;
        let mut col = TagColumn::new(slots);
        let mut model = vec![0u64; slots];
        // Counters grow past 24, 32 and 40 bits and replicas past 3, 15 and 63 (the table
        // of replicas widens by 2 bits at a time); every value is checked after each step.
        for step in 0..6000u64 {
            let slot = rng.usize(..slots);
            let replica = rng.u64(..(1 + step / 40).min(65_536));
            let counter = match step % 4 {
                0 => 0,
                1 => rng.u64(1..1 << 20),
                _ => rng.u64(1..=(1u64 << (20 + step * 28 / 6000)).min(MAX_COUNTER)),
            };
            let tag = if counter == 0 {
                0
            } else {
                replica << 48 | counter
            };
            col.set(slot, tag);
            model[slot] = tag;
            if step % 500 == 0 || step > 5990 {
                for (s, &t) in model.iter().enumerate() {
                    assert_eq!(col.get(s), t, "slot {s} at step {step}");
                }
            }
        }
        assert!(col.counter_bits == COUNTER_BITS_MAX && col.replica_bits >= 8);
        // The extremes fit too.
        let top = u64::from(u16::MAX) << 48 | MAX_COUNTER;
        col.set(0, top);
        col.set(1, 0);
        assert_eq!((col.get(0), col.get(1)), (top, 0));
    }

    #[test]
    fn a_few_replicas_take_26_bits_per_slot() {
        let mut col = TagColumn::new(1 << 20);
        for (slot, r) in [(0usize, 1u64), (5, 2), (9, 3)] {
            col.set(slot, r << 48 | 1_000_000);
        }
        assert_eq!(col.width(), 26);
        assert!(col.words.len() * 8 <= (1 << 20) * 26 / 8 + 8);
    }
}
