//! The binary encoding of states, deltas and snapshots: CBOR with fields as integer keys
//! (serde_cbor's packed format), one home for the wire envelopes, the replica's snapshots and
//! write-ahead log, and the evaluation's size figures alike; and the bit packing inside it
//! (fingerprints at their bit width, packed tags).

use bitstream_io::{BitRead, BitReader, BitWrite, BitWriter, LittleEndian};
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use super::error::FilterError;

/// Why bytes did not decode.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    /// The input ended early.
    #[error("truncated: {0}")]
    Truncated(String),
    /// The input is not a valid encoding of the type (including values its checks refuse).
    #[error("malformed: {0}")]
    Malformed(String),
}

/// Encodes `value` (packed CBOR, which [`from_cbor`] reads back).
pub fn to_cbor<T: Serialize>(value: &T) -> Vec<u8> {
    serde_cbor::ser::to_vec_packed(value).expect("CBOR into a Vec cannot fail")
}

/// Decodes bytes produced by [`to_cbor`]; truncated input gives [`CodecError::Truncated`].
pub fn from_cbor<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    serde_cbor::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            CodecError::Truncated(e.to_string())
        } else {
            CodecError::Malformed(e.to_string())
        }
    })
}

/// Packs each value into `bits` bits (values must fit; `bits` may be 0).
pub(crate) fn pack(values: impl IntoIterator<Item = u64>, bits: u32) -> Vec<u8> {
    let mut w = BitWriter::endian(Vec::new(), LittleEndian);
    if bits > 0 {
        for v in values {
            debug_assert!(
                bits == 64 || v >> bits == 0,
                "{v} does not fit in {bits} bits"
            );
            w.write_var::<u64>(bits, v)
                .expect("writing to a Vec cannot fail");
        }
    }
    w.byte_align().expect("writing to a Vec cannot fail");
    w.into_writer()
}

/// Unpacks exactly `count` values of `bits` bits; the input must have exactly the bytes they
/// take, so that truncated or padded input is rejected.
pub(crate) fn unpack(bytes: &[u8], bits: u32, count: usize) -> Result<Vec<u64>, FilterError> {
    let needed = (count as u128 * bits as u128).div_ceil(8);
    if bytes.len() as u128 != needed {
        return Err(FilterError::malformed(format!(
            "packed array has {} bytes, {count} values of {bits} bits need {needed}",
            bytes.len()
        )));
    }
    if bits == 0 {
        return Ok(vec![0; count]);
    }
    let mut r = BitReader::endian(bytes, LittleEndian);
    (0..count)
        .map(|_| {
            r.read_var::<u64>(bits)
                .map_err(|e| FilterError::malformed(e.to_string()))
        })
        .collect()
}

/// Bits needed to store values up to and including `max`.
pub(crate) fn bits_for(max: u64) -> u32 {
    64 - max.leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let vals: Vec<u64> = (0..1000).map(|i| (i * 7919) % 512).collect();
        let packed = pack(vals.iter().copied(), 9);
        assert_eq!(packed.len(), (1000 * 9usize).div_ceil(8));
        assert_eq!(unpack(&packed, 9, 1000).unwrap(), vals);
        assert!(unpack(&packed[..packed.len() - 1], 9, 1000).is_err());
        assert!(unpack(&packed, 9, 1001).is_err());
        assert_eq!(bits_for(0), 0);
        assert_eq!(bits_for(1), 1);
        assert_eq!(bits_for(255), 8);
        assert_eq!(bits_for(256), 9);
    }

    #[test]
    fn round_trips_and_tells_truncated_from_malformed() {
        let v = (7u64, vec![1u8, 2, 3], "x".to_string());
        let bytes = to_cbor(&v);
        assert_eq!(from_cbor::<(u64, Vec<u8>, String)>(&bytes), Ok(v));
        assert!(matches!(
            from_cbor::<(u64, Vec<u8>, String)>(&bytes[..bytes.len() - 1]),
            Err(CodecError::Truncated(_))
        ));
        assert!(matches!(
            from_cbor::<u64>(b"\x61x"),
            Err(CodecError::Malformed(_))
        ));
    }
}
