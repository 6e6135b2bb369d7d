//! Digest batches: the anti-entropy digests of many filters of one node in one message, so
//! that a node's idle traffic is a few messages a second rather than one per filter per
//! anti-entropy interval (a node of 100,000 filters announced 20,000 a second).
//!
//! A batch is, in order: the magic [`BATCH_MAGIC`], the version [`BATCH_VERSION`], and the
//! CBOR of a list of `(filter, frame)` pairs. Each frame is a replica's own frame (see the
//! [module](super) above), which its receiver checks and verifies as if it had come on
//! `<prefix>.<filter>.state`: the batch adds no trust, so it needs no checksum or signature
//! of its own (a damaged batch fails to parse, or its damaged frames their checksums).
//!
//! ```
//! use crpf::wire::batch::{DigestBatch, decode_batch};
//!
//! let mut batch = DigestBatch::default();
//! batch.push("users", b"a frame".to_vec());
//! batch.push("sessions", b"another".to_vec());
//! let bytes = batch.encode();
//! let items = decode_batch(&bytes)?;
//! assert_eq!(items[1].0, "sessions");
//! assert_eq!(items[1].1, b"another");
//! assert!(decode_batch(b"crpf garbage").is_err());
//! # Ok::<(), crpf::wire::WireError>(())
//! ```

use serde_bytes::ByteBuf;

use super::WireError;

/// First bytes of a digest batch (a replica's frame starts with [`super::MAGIC`]).
pub const BATCH_MAGIC: &[u8; 4] = b"crpd";

/// Version of the batch layout.
pub const BATCH_VERSION: u8 = 1;

/// The list's CBOR after the magic and version.
const BATCH_HEADER_LEN: usize = BATCH_MAGIC.len() + 1;

/// Frames of several filters, gathered to go out as one message.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DigestBatch {
    items: Vec<(String, ByteBuf)>,
    bytes: usize,
}

impl DigestBatch {
    /// Adds the frame of `filter`.
    pub fn push(&mut self, filter: &str, frame: Vec<u8>) {
        self.bytes += filter.len() + frame.len();
        self.items.push((filter.to_string(), ByteBuf::from(frame)));
    }

    /// How many frames it holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The bytes of its names and frames (its encoding is a few bytes per item more).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The batch in parts of at most `max_bytes` of names and frames each (an item larger
    /// than that is a part of its own), in order.
    pub fn split(self, max_bytes: usize) -> Vec<DigestBatch> {
        let mut parts = Vec::new();
        let mut part = DigestBatch::default();
        for (name, frame) in self.items {
            let size = name.len() + frame.len();
            if !part.is_empty() && part.bytes + size > max_bytes {
                parts.push(std::mem::take(&mut part));
            }
            part.bytes += size;
            part.items.push((name, frame));
        }
        if !part.is_empty() {
            parts.push(part);
        }
        parts
    }

    /// The batch as it goes out.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BATCH_HEADER_LEN + self.bytes + 8 * self.items.len());
        out.extend_from_slice(BATCH_MAGIC);
        out.push(BATCH_VERSION);
        serde_cbor::to_writer(&mut out, &self.items).expect("a list of names and bytes encodes");
        out
    }
}

/// The `(filter, frame)` pairs of a batch; anything that is not one is refused whole.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, WireError> {
    let header = bytes
        .get(..BATCH_HEADER_LEN)
        .ok_or_else(|| WireError::Truncated(format!("digest batch of {} bytes", bytes.len())))?;
    if &header[..BATCH_MAGIC.len()] != BATCH_MAGIC {
        return Err(WireError::Malformed("not a digest batch".into()));
    }
    if header[BATCH_MAGIC.len()] != BATCH_VERSION {
        return Err(WireError::Malformed(format!(
            "digest batch version {}, expected {BATCH_VERSION}",
            header[BATCH_MAGIC.len()]
        )));
    }
    let items: Vec<(String, ByteBuf)> = serde_cbor::from_slice(&bytes[BATCH_HEADER_LEN..])
        .map_err(|e| WireError::Malformed(format!("digest batch: {e}")))?;
    Ok(items
        .into_iter()
        .map(|(name, frame)| (name, frame.into_vec()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_comes_back_as_it_went() {
        let mut batch = DigestBatch::default();
        assert!(batch.is_empty());
        for i in 0..100 {
            batch.push(&format!("f{i}"), vec![i as u8; i]);
        }
        assert_eq!(batch.len(), 100);
        let items = decode_batch(&batch.encode()).unwrap();
        assert_eq!(items.len(), 100);
        for (i, (name, frame)) in items.iter().enumerate() {
            assert_eq!(name, &format!("f{i}"));
            assert_eq!(frame, &vec![i as u8; i]);
        }
    }

    #[test]
    fn a_batch_splits_into_parts_of_a_bounded_size_in_order() {
        let mut batch = DigestBatch::default();
        for i in 0..10 {
            batch.push(&format!("f{i}"), vec![0; 98]);
        }
        batch.push("big", vec![0; 1000]);
        batch.push("last", vec![0; 10]);
        let parts = batch.split(300);
        let sizes: Vec<_> = parts.iter().map(DigestBatch::len).collect();
        assert_eq!(sizes, [3, 3, 3, 1, 1, 1]);
        assert!(parts[..3].iter().all(|p| p.bytes() <= 300));
        let names: Vec<_> = parts
            .iter()
            .flat_map(|p| decode_batch(&p.encode()).unwrap())
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.first().map(String::as_str), Some("f0"));
        assert_eq!(names[9..], ["f9", "big", "last"]);
        assert!(DigestBatch::default().split(10).is_empty());
    }

    #[test]
    fn anything_else_is_refused_whole() {
        let mut batch = DigestBatch::default();
        batch.push("f", vec![1, 2, 3]);
        let good = batch.encode();
        assert!(matches!(
            decode_batch(&good[..3]),
            Err(WireError::Truncated(_))
        ));
        // A replica's frame is not a batch.
        assert!(matches!(
            decode_batch(b"crpf\x02\x00"),
            Err(WireError::Malformed(_))
        ));
        let mut other_version = good.clone();
        other_version[4] = 9;
        assert!(decode_batch(&other_version).is_err());
        assert!(decode_batch(&good[..good.len() - 1]).is_err());
        // A list of something else.
        let mut foreign = BATCH_MAGIC.to_vec();
        foreign.push(BATCH_VERSION);
        serde_cbor::to_writer(&mut foreign, &vec![1u32, 2, 3]).unwrap();
        assert!(decode_batch(&foreign).is_err());
    }
}
