//! The framing of the batch operations (`madd`, `mremove`, `mcontains`) and of their bitmap
//! replies.
//!
//! **Batch payload**: the items one after the other, each as its length in bytes, a `u32`
//! little-endian, then its bytes; nothing else (no count, no header, no padding):
//!
//! ```text
//! | len0: u32 LE | item0: len0 bytes | len1: u32 LE | item1 | ... |
//! ```
//!
//! A fixed-width length rather than a varint: four bytes per item are little next to the
//! NATS protocol's own overhead, and every language can write it in one line (Python
//! `struct.pack("<I", len(item)) + item`). The empty payload is the batch of no items.
//! Decoding checks, before anything is applied: every length is complete (`truncated length`)
//! and followed by that many bytes (`truncated item`), no item is empty or longer than
//! `max_item_bytes`, and there are at most `max_batch_items` items. Any violation refuses the
//! whole batch.
//!
//! **Bitmap reply**: bit `i` is the result of item `i`, little-endian within and across bytes
//! (item `i` is bit `i % 8` of byte `i / 8`), `ceil(n / 8)` bytes for `n` items, unused high
//! bits of the last byte zero.
//!
//! ```
//! use crpf::api::batch::{self, Limits};
//! let payload = batch::encode([&b"alice"[..], b"bob"]).unwrap();
//! assert_eq!(payload, b"\x05\0\0\0alice\x03\0\0\0bob");
//! let items = batch::decode(&payload, Limits::new(10, 64)).unwrap();
//! assert_eq!(items, [&b"alice"[..], b"bob"]);
//!
//! let bits = batch::encode_bitmap([true, false, true]);
//! assert_eq!(bits, [0b101]);
//! assert_eq!(batch::decode_bitmap(&bits, 3).unwrap(), [true, false, true]);
//! ```

use thiserror::Error;

/// Bytes of an item's length prefix.
pub const LEN_BYTES: usize = 4;

/// What a decoded batch may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Items at most (`max_batch_items`).
    pub max_items: usize,
    /// Bytes of one item at most (`max_item_bytes`).
    pub max_item_bytes: usize,
}

impl Limits {
    /// At most `max_items` items of at most `max_item_bytes` bytes each.
    pub fn new(max_items: usize, max_item_bytes: usize) -> Self {
        Limits {
            max_items,
            max_item_bytes,
        }
    }
}

/// A malformed batch or bitmap. Item indices count from 0.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Fewer than four bytes where an item's length starts.
    #[error("batch item {index}: truncated length ({available} of 4 bytes)")]
    TruncatedLength {
        /// The item.
        index: usize,
        /// Bytes left in the payload.
        available: usize,
    },
    /// Fewer bytes left than the length announces.
    #[error("batch item {index}: truncated item ({len} bytes announced, {available} left)")]
    TruncatedItem {
        /// The item.
        index: usize,
        /// Its announced length.
        len: usize,
        /// Bytes left in the payload.
        available: usize,
    },
    /// An item of length 0.
    #[error("batch item {index}: empty item")]
    EmptyItem {
        /// The item.
        index: usize,
    },
    /// An item longer than allowed.
    #[error("batch item {index}: item of {len} bytes exceeds max_item_bytes {max}")]
    ItemTooLarge {
        /// The item.
        index: usize,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More items than allowed.
    #[error("batch of more than {max} items exceeds max_batch_items")]
    TooManyItems {
        /// The limit.
        max: usize,
    },
    /// A bitmap whose length does not fit the number of items.
    #[error("bitmap of {len} bytes for {items} items (expected {expected})")]
    BitmapLength {
        /// Its length.
        len: usize,
        /// The items it answers.
        items: usize,
        /// `ceil(items / 8)`.
        expected: usize,
    },
    /// A bitmap with bits set past the last item.
    #[error("bitmap has bits set past its {items} items")]
    BitmapPadding {
        /// The items it answers.
        items: usize,
    },
}

/// Appends one item's frame to `buf`. Only an item over 4 GiB (the length does not fit)
/// is refused; limits are the receiver's to check.
pub fn encode_into(buf: &mut Vec<u8>, index: usize, item: &[u8]) -> Result<(), BatchError> {
    let len = u32::try_from(item.len()).map_err(|_| BatchError::ItemTooLarge {
        index,
        len: item.len(),
        max: u32::MAX as usize,
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(item);
    Ok(())
}

/// The payload of a batch of `items`.
pub fn encode<I, T>(items: I) -> Result<Vec<u8>, BatchError>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut buf = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        encode_into(&mut buf, index, item.as_ref())?;
    }
    Ok(buf)
}

/// Item `index` of a batch, of `len` bytes, against `limits`: neither empty nor too long.
pub(crate) fn check_item_len(index: usize, len: usize, limits: Limits) -> Result<(), BatchError> {
    if len == 0 {
        return Err(BatchError::EmptyItem { index });
    }
    if len > limits.max_item_bytes {
        return Err(BatchError::ItemTooLarge {
            index,
            len,
            max: limits.max_item_bytes,
        });
    }
    Ok(())
}

/// The items of a batch payload, borrowed from it, checked against `limits`.
pub fn decode(payload: &[u8], limits: Limits) -> Result<Vec<&[u8]>, BatchError> {
    // Every item takes at least five bytes: this bounds the allocation on any input.
    let mut items = Vec::with_capacity((payload.len() / (LEN_BYTES + 1)).min(limits.max_items));
    let mut rest = payload;
    while !rest.is_empty() {
        let index = items.len();
        if index >= limits.max_items {
            return Err(BatchError::TooManyItems {
                max: limits.max_items,
            });
        }
        let Some((len, tail)) = rest.split_first_chunk::<LEN_BYTES>() else {
            return Err(BatchError::TruncatedLength {
                index,
                available: rest.len(),
            });
        };
        let len = u32::from_le_bytes(*len) as usize;
        check_item_len(index, len, limits)?;
        if len > tail.len() {
            return Err(BatchError::TruncatedItem {
                index,
                len,
                available: tail.len(),
            });
        }
        let (item, tail) = tail.split_at(len);
        items.push(item);
        rest = tail;
    }
    Ok(items)
}

/// Bytes of the bitmap of `items` results.
pub fn bitmap_len(items: usize) -> usize {
    items.div_ceil(8)
}

/// The bitmap of a sequence of results (bit `i` = result `i`).
pub fn encode_bitmap(bits: impl IntoIterator<Item = bool>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, bit) in bits.into_iter().enumerate() {
        if i % 8 == 0 {
            out.push(0);
        }
        if bit {
            *out.last_mut().expect("pushed above") |= 1 << (i % 8);
        }
    }
    out
}

/// The `items` results of a bitmap; its length must be `ceil(items / 8)` and its unused bits
/// zero.
pub fn decode_bitmap(bytes: &[u8], items: usize) -> Result<Vec<bool>, BatchError> {
    check_bitmap(bytes, items)?;
    Ok((0..items).map(|i| bitmap_bit(bytes, i)).collect())
}

/// Result `i` of a bitmap (see [`check_bitmap`]); `false` past its end.
#[inline]
pub fn bitmap_bit(bytes: &[u8], i: usize) -> bool {
    bytes.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1)
}

/// Whether `bytes` is a bitmap of `items` results, as [`decode_bitmap`] checks it, without
/// decoding it.
pub fn check_bitmap(bytes: &[u8], items: usize) -> Result<(), BatchError> {
    let expected = bitmap_len(items);
    if bytes.len() != expected {
        return Err(BatchError::BitmapLength {
            len: bytes.len(),
            items,
            expected,
        });
    }
    if !items.is_multiple_of(8) && bytes[expected - 1] >> (items % 8) != 0 {
        return Err(BatchError::BitmapPadding { items });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WIDE: Limits = Limits {
        max_items: usize::MAX,
        max_item_bytes: usize::MAX,
    };

    fn frame(len: u32, bytes: &[u8]) -> Vec<u8> {
        let mut v = len.to_le_bytes().to_vec();
        v.extend_from_slice(bytes);
        v
    }

    #[test]
    fn round_trip_and_layout() {
        let items: Vec<&[u8]> = vec![b"a", b"bc", &[0u8; 300], b"\xff"];
        let payload = encode(&items).unwrap();
        assert_eq!(&payload[..5], b"\x01\0\0\0a");
        assert_eq!(&payload[11..15], &300u32.to_le_bytes());
        assert_eq!(
            payload.len(),
            items.iter().map(|i| 4 + i.len()).sum::<usize>()
        );
        assert_eq!(decode(&payload, Limits::new(4, 300)).unwrap(), items);
        // The empty payload is the empty batch.
        assert_eq!(encode(std::iter::empty::<&[u8]>()).unwrap(), b"");
        assert!(decode(b"", Limits::new(0, 1)).unwrap().is_empty());
    }

    #[test]
    fn every_malformed_case_is_named() {
        let ok = frame(2, b"ab");
        // A length cut short: 1 to 3 bytes where a length should be.
        for cut in 1..4 {
            let mut p = ok.clone();
            p.extend_from_slice(&[7; 3][..cut]);
            assert_eq!(
                decode(&p, WIDE),
                Err(BatchError::TruncatedLength {
                    index: 1,
                    available: cut
                })
            );
        }
        // An item shorter than its length.
        let mut p = ok.clone();
        p.extend(frame(5, b"abc"));
        let e = decode(&p, WIDE).unwrap_err();
        assert_eq!(
            e,
            BatchError::TruncatedItem {
                index: 1,
                len: 5,
                available: 3
            }
        );
        assert!(e.to_string().contains("truncated item"), "{e}");
        // An empty item.
        let mut p = ok.clone();
        p.extend(frame(0, b""));
        p.extend(frame(1, b"x"));
        assert_eq!(decode(&p, WIDE), Err(BatchError::EmptyItem { index: 1 }));
        // An item over the limit, even if the payload is cut short after its length (the
        // length alone condemns it).
        let p = frame(65, &[1; 10]);
        let e = decode(&p, Limits::new(10, 64)).unwrap_err();
        assert_eq!(
            e,
            BatchError::ItemTooLarge {
                index: 0,
                len: 65,
                max: 64
            }
        );
        assert!(e.to_string().contains("max_item_bytes 64"), "{e}");
        let p = frame(u32::MAX, b"");
        assert!(matches!(
            decode(&p, Limits::new(10, 64)),
            Err(BatchError::ItemTooLarge { .. })
        ));
        // A length announcing more than there is, under a wide limit.
        assert!(matches!(
            decode(&p, WIDE),
            Err(BatchError::TruncatedItem {
                len: 4294967295,
                available: 0,
                ..
            })
        ));
    }

    #[test]
    fn item_count_limit_is_exact() {
        let items: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i + 1]).collect();
        let p = encode(&items).unwrap();
        assert_eq!(decode(&p, Limits::new(5, 1)).unwrap().len(), 5);
        let e = decode(&p, Limits::new(4, 1)).unwrap_err();
        assert_eq!(e, BatchError::TooManyItems { max: 4 });
        assert!(e.to_string().contains("max_batch_items"), "{e}");
        // At the limit, trailing garbage counts as one item too many.
        let mut p = encode(&items[..4]).unwrap();
        p.push(0);
        assert_eq!(
            decode(&p, Limits::new(4, 1)),
            Err(BatchError::TooManyItems { max: 4 })
        );
        // An item of exactly max_item_bytes passes.
        let p = encode([[9u8; 64]]).unwrap();
        assert_eq!(decode(&p, Limits::new(1, 64)).unwrap(), [&[9u8; 64][..]]);
    }

    #[test]
    fn bitmaps() {
        assert_eq!(encode_bitmap([]), Vec::<u8>::new());
        assert_eq!(encode_bitmap([true]), [1]);
        let bits: Vec<bool> = (0..17).map(|i| i % 3 == 0).collect();
        let b = encode_bitmap(bits.iter().copied());
        assert_eq!(b, [0b0100_1001, 0b1001_0010, 0b0000_0000]);
        assert_eq!(decode_bitmap(&b, 17).unwrap(), bits);
        assert_eq!(
            decode_bitmap(&b, 16),
            Err(BatchError::BitmapLength {
                len: 3,
                items: 16,
                expected: 2
            })
        );
        assert_eq!(
            decode_bitmap(&[0b0000_0100], 2),
            Err(BatchError::BitmapPadding { items: 2 })
        );
        assert_eq!(decode_bitmap(&[0xff], 8).unwrap(), [true; 8]);
        assert_eq!(decode_bitmap(&[], 0).unwrap(), Vec::<bool>::new());
    }

    proptest! {
        #[test]
        fn decode_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            max_items in 0usize..64,
            max_item_bytes in 0usize..600,
        ) {
            if let Ok(items) = decode(&bytes, Limits::new(max_items, max_item_bytes)) {
                // Whatever decodes is within the limits and re-encodes to the same bytes:
                // the framing has one encoding per batch.
                prop_assert!(items.len() <= max_items);
                prop_assert!(items.iter().all(|i| !i.is_empty() && i.len() <= max_item_bytes));
                prop_assert_eq!(encode(&items).unwrap(), bytes);
            }
        }

        #[test]
        fn decode_never_panics_on_plausible_frames(
            items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
        ) {
            // Valid frames damaged by a cut or a flipped byte reach the deeper branches.
            let mut p = encode(&items).unwrap();
            if !p.is_empty() {
                let i = flip.index(p.len());
                p[i] ^= 0xa5;
                p.truncate(cut.index(p.len() + 1));
            }
            let _ = decode(&p, Limits::new(16, 32));
        }

        #[test]
        fn round_trip(
            items in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..80), 0..50),
        ) {
            let p = encode(&items).unwrap();
            let back = decode(&p, Limits::new(50, 80)).unwrap();
            prop_assert_eq!(back, items.iter().map(Vec::as_slice).collect::<Vec<_>>());
        }

        #[test]
        fn bitmap_round_trip(bits in proptest::collection::vec(any::<bool>(), 0..100)) {
            let b = encode_bitmap(bits.iter().copied());
            prop_assert_eq!(b.len(), bitmap_len(bits.len()));
            prop_assert_eq!(decode_bitmap(&b, bits.len()).unwrap(), bits);
        }

        #[test]
        fn decode_bitmap_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..20),
            items in 0usize..200,
        ) {
            let _ = decode_bitmap(&bytes, items);
        }
    }
}
