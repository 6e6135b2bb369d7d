//! Items of the request API: the checks an item passes before it reaches a filter, and the
//! prefetching of a batch's items ahead of their turn.

use crate::replica::ReplicaError;

/// An item of a single operation: not empty, at most `max_item_bytes`.
pub(super) fn check_item(item: &[u8], max_item_bytes: usize) -> Result<(), ReplicaError> {
    if item.is_empty() {
        return Err(ReplicaError::InvalidItem("empty item".into()));
    }
    if item.len() > max_item_bytes {
        return Err(ReplicaError::InvalidItem(format!(
            "item of {} bytes exceeds max_item_bytes {max_item_bytes}",
            item.len(),
        )));
    }
    Ok(())
}

/// Prefetches for a loop about to handle `items[n]`: the item `ahead` places on, and at the
/// first item also the `ahead` before that one, so that each item is prefetched once, ahead
/// of its turn. Nothing if `ahead` is 0.
#[inline(always)]
pub(super) fn prefetch_items_ahead<T>(items: &[T], n: usize, ahead: usize, prefetch: impl Fn(&T)) {
    if ahead == 0 {
        return;
    }
    if n == 0 {
        items.iter().take(ahead).for_each(&prefetch);
    }
    if let Some(next) = items.get(n + ahead) {
        prefetch(next);
    }
}

/// `answer` of every item, in order, each prefetched `ahead` items before its turn
/// ([`prefetch_items_ahead`]).
pub(super) fn map_prefetched<T>(
    items: &[&[u8]],
    ahead: usize,
    prefetch: impl Fn(&[u8]),
    mut answer: impl FnMut(&[u8]) -> T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        prefetch_items_ahead(items, n, ahead, |i| prefetch(i));
        out.push(answer(item));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn every_item_is_answered_in_order_and_prefetched_once_ahead_of_its_turn() {
        let items: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i]).collect();
        let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        for ahead in [0, 1, 4, 8, 20] {
            // Each event: (prefetched, item) or (answered, item).
            let events = RefCell::new(Vec::new());
            let answers = map_prefetched(
                &items,
                ahead,
                |i| events.borrow_mut().push((true, i[0])),
                |i| {
                    events.borrow_mut().push((false, i[0]));
                    i[0] * 2
                },
            );
            assert_eq!(answers, (0..10).map(|i| i * 2).collect::<Vec<u8>>());
            let events = events.into_inner();
            let prefetched: Vec<u8> = events.iter().filter(|e| e.0).map(|e| e.1).collect();
            if ahead == 0 {
                assert!(prefetched.is_empty());
                continue;
            }
            assert_eq!(prefetched, (0..10).collect::<Vec<u8>>(), "ahead {ahead}");
            for item in 0..10u8 {
                let at = |p: bool| events.iter().position(|&e| e == (p, item)).unwrap();
                let answered_before = events[..at(true)].iter().filter(|e| !e.0).count();
                assert_eq!(
                    answered_before,
                    (item as usize).saturating_sub(ahead),
                    "item {item}, ahead {ahead}"
                );
                assert!(at(true) < at(false));
            }
        }
    }
}
