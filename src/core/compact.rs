//! Compact delta encodings: bit-packed byte strings inside the CBOR of the Bloom and
//! observed-remove cuckoo deltas, so that deltas published every few milliseconds (a few
//! updates each) stay small. A Bloom delta's bit indexes take the width of its largest index
//! (24 bits for a 10-million-bit filter, where CBOR takes 40); an observed-remove entry takes
//! its bucket and fingerprint at their widths and, for the usual tag (the previous entry's
//! replica, counter + 1), one bit, and the context is not sent at all: it is exactly the
//! listed tags, rebuilt by the receiver.
//!
//! Every release since this one reads the earlier CBOR forms too (a Bloom delta's index
//! array, an observed-remove delta's map with its context), from peers and from write-ahead
//! logs written before. The decoders refuse trailing or missing bits, and counts the input
//! cannot hold at the widths it declares; they reserve memory as entries are read, not as
//! counts announce. A Bloom delta names each bit once, so it holds at most `2^width` indexes:
//! decoded, at most about three times its size. An observed-remove entry takes as little as 3
//! bits on the wire (buckets and fingerprints of 1 bit) and 32 bytes decoded, so a forged
//! delta can decode to up to 85 times its size (`max_message_bytes` bounds it; with a cluster
//! key, unsigned frames are refused before they are decoded).

use bitstream_io::{BitRead, BitReader, LittleEndian};

use super::causal::{CausalContext, Dot, MAX_COUNTER, ReplicaId};
use super::codec::bits_for;
use super::error::FilterError;

/// Items a decoder reserves room for before reading them; beyond, the vector grows as they
/// come, so a count only costs memory once the input has delivered its items.
const RESERVE_AHEAD: usize = 4096;

/// Writes bits into a byte vector, least significant first, as bitstream-io's little-endian
/// `BitWriter` does (the reader below is that crate's; a test checks the two agree). Its own
/// accumulator because the crate's writer took ~75 instructions per index, about 500 of
/// every Bloom add's (its delta's seven indexes).
struct Bits {
    out: Vec<u8>,
    /// Bits not yet written out (fewer than 8 between calls), from the lowest.
    pending: u64,
    held: u32,
}

impl Bits {
    fn new() -> Self {
        Bits {
            out: Vec::new(),
            pending: 0,
            held: 0,
        }
    }

    fn bit(&mut self, b: bool) {
        self.put(1, u64::from(b));
    }

    /// The low `bits` bits of `v` (0 to 64).
    fn fixed(&mut self, bits: u32, v: u64) {
        let (mut bits, mut v) = (bits, v);
        while bits > 0 {
            // At most 56 at once: with up to 7 held, they fit the accumulator.
            let take = bits.min(56);
            self.put(take, v & ((1u64 << take) - 1));
            v = v.checked_shr(take).unwrap_or(0);
            bits -= take;
        }
    }

    /// `bits` (1 to 56) bits of `v`, which has no higher bit set.
    #[inline]
    fn put(&mut self, bits: u32, v: u64) {
        self.pending |= v << self.held;
        self.held += bits;
        let whole = self.held / 8;
        if whole > 0 {
            self.out
                .extend_from_slice(&self.pending.to_le_bytes()[..whole as usize]);
            // `whole` is at most 7 (63 bits held): the shift stays below 64.
            self.pending >>= whole * 8;
            self.held -= whole * 8;
        }
    }

    /// An Elias-gamma-like code of any `u64`: its bit length `L` in unary (`L` zeros and a
    /// one), then its `L - 1` bits below the leading one. 0 takes one bit, 1 two, small
    /// numbers few.
    fn number(&mut self, v: u64) {
        let len = bits_for(v);
        self.fixed(len, 0);
        self.put(1, 1);
        if len > 1 {
            self.fixed(len - 1, v & ((1u64 << (len - 1)) - 1));
        }
    }

    /// The bytes, the last padded with zero bits.
    fn finish(mut self) -> Vec<u8> {
        if self.held > 0 {
            self.out.push(self.pending as u8);
        }
        self.out
    }
}

/// Reads what [`Bits`] wrote, counting what it consumed so that the end can be checked.
struct Reader<'a> {
    r: BitReader<&'a [u8], LittleEndian>,
    total: u64,
    used: u64,
}

fn truncated<E: std::fmt::Display>(e: E) -> FilterError {
    FilterError::malformed(format!("compact delta: {e}"))
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader {
            r: BitReader::endian(bytes, LittleEndian),
            total: bytes.len() as u64 * 8,
            used: 0,
        }
    }

    fn left(&self) -> u64 {
        self.total - self.used
    }

    fn bit(&mut self) -> Result<bool, FilterError> {
        self.used += 1;
        self.r.read_bit().map_err(truncated)
    }

    fn fixed(&mut self, bits: u32) -> Result<u64, FilterError> {
        if bits == 0 {
            return Ok(0);
        }
        self.used += u64::from(bits);
        self.r.read_var::<u64>(bits).map_err(truncated)
    }

    fn number(&mut self) -> Result<u64, FilterError> {
        // A bit length over 64 is refused before reading on: a run of zeros cannot make the
        // reader scan the whole input for one number.
        let mut len = 0u32;
        while !self.bit()? {
            len += 1;
            if len > 64 {
                return Err(FilterError::malformed(
                    "compact delta: a number over 64 bits",
                ));
            }
        }
        Ok(match len {
            0 => 0,
            1 => 1,
            _ => (1u64 << (len - 1)) | self.fixed(len - 1)?,
        })
    }

    /// A count of items that take at least `min_bits` each: no more than the input holds.
    fn count(&mut self, min_bits: u64) -> Result<usize, FilterError> {
        let n = self.number()?;
        if n > self.left() / min_bits.max(1) {
            return Err(FilterError::malformed(format!(
                "compact delta: {n} items cannot fit in {} bits",
                self.left()
            )));
        }
        Ok(n as usize)
    }

    /// The input must end here, with fewer than 8 padding bits, all zero.
    fn end(mut self) -> Result<(), FilterError> {
        let rest = self.left();
        if rest >= 8 || self.fixed(rest as u32)? != 0 {
            return Err(FilterError::malformed("compact delta: bytes after its end"));
        }
        Ok(())
    }
}

/// Bloom bit indexes, in any order: their count, the width of the largest (at least 1), and
/// each at that width.
pub(crate) fn encode_indexes(indexes: &[u64]) -> Vec<u8> {
    let width = bits_for(indexes.iter().copied().max().unwrap_or(0)).max(1);
    let mut w = Bits::new();
    w.number(indexes.len() as u64);
    w.fixed(7, u64::from(width));
    for &i in indexes {
        w.fixed(width, i);
    }
    w.finish()
}

/// Reads [`encode_indexes`]'s bytes.
pub(crate) fn decode_indexes(bytes: &[u8]) -> Result<Vec<u64>, FilterError> {
    let mut r = Reader::new(bytes);
    let n = r.number()?;
    let width = r.fixed(7)? as u32;
    if !(1..=64).contains(&width) {
        return Err(FilterError::malformed(format!(
            "compact delta: index width {width}"
        )));
    }
    // Distinct bits: no more than the width can name.
    let nameable = if width < 64 { 1u64 << width } else { u64::MAX };
    if n > r.left() / u64::from(width) || n > nameable {
        return Err(FilterError::malformed(format!(
            "compact delta: {n} indexes of {width} bits in {} bits",
            r.left()
        )));
    }
    let mut indexes = Vec::with_capacity((n as usize).min(RESERVE_AHEAD));
    for _ in 0..n {
        indexes.push(r.fixed(width)?);
    }
    r.end()?;
    Ok(indexes)
}

/// An observed-remove entry: sub-filter (0 for the single-table kind), bucket, fingerprint and
/// tag.
pub(crate) type TaggedEntry = (u32, u64, u16, Dot);

/// The entries and removed entries of an observed-remove delta, whose context is exactly their
/// tags. `subs`: whether the kind has sub-filters (a column the single-table kind leaves out).
pub(crate) fn encode_tagged(
    subs: bool,
    entries: impl ExactSizeIterator<Item = TaggedEntry> + Clone,
    removed: impl ExactSizeIterator<Item = TaggedEntry> + Clone,
) -> Vec<u8> {
    let all = entries.clone().chain(removed.clone());
    let (max_bucket, max_fp) = all.fold((0, 0), |(b, f), e| (b.max(e.1), f.max(e.2)));
    let bucket_bits = bits_for(max_bucket).max(1);
    let fp_bits = bits_for(u64::from(max_fp)).max(1);
    let mut w = Bits::new();
    w.number(entries.len() as u64);
    w.number(removed.len() as u64);
    w.fixed(7, u64::from(bucket_bits));
    w.fixed(5, u64::from(fp_bits));
    let mut prev: Option<TaggedEntry> = None;
    for e @ (sub, bucket, fp, dot) in entries.chain(removed) {
        if subs {
            let same = prev.is_some_and(|p| p.0 == sub);
            w.bit(same);
            if !same {
                w.number(u64::from(sub));
            }
        }
        w.fixed(bucket_bits, bucket);
        w.fixed(fp_bits, u64::from(fp));
        // Local adds issue consecutive tags: most entries follow their predecessor's.
        let next = prev.is_some_and(|p| {
            p.3.replica == dot.replica && p.3.counter.checked_add(1) == Some(dot.counter)
        });
        w.bit(next);
        if !next {
            w.fixed(16, u64::from(dot.replica));
            w.number(dot.counter);
        }
        prev = Some(e);
    }
    w.finish()
}

/// What [`decode_tagged`] gives: entries, removed entries, and their tags as the context.
pub(crate) type DecodedTagged = (Vec<TaggedEntry>, Vec<TaggedEntry>, CausalContext);

/// Reads [`encode_tagged`]'s bytes; the context is rebuilt from the listed tags (a tag listed
/// twice is left for the delta's own check, which refuses it).
pub(crate) fn decode_tagged(subs: bool, bytes: &[u8]) -> Result<DecodedTagged, FilterError> {
    let mut r = Reader::new(bytes);
    // Each entry takes at least 3 bits (bucket, fingerprint, tag flag); both counts together
    // are checked against the widths below.
    let n_entries = r.count(3)?;
    let n_removed = r.count(3)?;
    let bucket_bits = r.fixed(7)? as u32;
    let fp_bits = r.fixed(5)? as u32;
    if !(1..=64).contains(&bucket_bits) || !(1..=16).contains(&fp_bits) {
        return Err(FilterError::malformed(format!(
            "compact delta: widths {bucket_bits} (bucket), {fp_bits} (fingerprint)"
        )));
    }
    let min_entry_bits = u64::from(bucket_bits + fp_bits) + 1 + u64::from(subs);
    if (n_entries + n_removed) as u64 > r.left() / min_entry_bits {
        return Err(FilterError::malformed(format!(
            "compact delta: {} entries of at least {min_entry_bits} bits in {} bits",
            n_entries + n_removed,
            r.left()
        )));
    }
    let mut context = CausalContext::new();
    let mut prev: Option<TaggedEntry> = None;
    let mut read = |n: usize, r: &mut Reader<'_>| -> Result<Vec<TaggedEntry>, FilterError> {
        let mut out = Vec::with_capacity(n.min(RESERVE_AHEAD));
        for _ in 0..n {
            let sub = if !subs {
                0
            } else if r.bit()? {
                // One encoding per delta: "the same as before" needs an entry before.
                prev.map(|p| p.0).ok_or_else(|| {
                    FilterError::malformed("compact delta: the first sub-filter refers to none")
                })?
            } else {
                u32::try_from(r.number()?)
                    .map_err(|_| FilterError::malformed("compact delta: sub-filter index"))?
            };
            let bucket = r.fixed(bucket_bits)?;
            let fp = r.fixed(fp_bits)? as u16;
            let dot = match (r.bit()?, prev) {
                (true, Some(p)) => Dot {
                    replica: p.3.replica,
                    counter: p.3.counter + 1,
                },
                (true, None) => {
                    return Err(FilterError::malformed(
                        "compact delta: the first tag refers to none before it",
                    ));
                }
                (false, _) => Dot {
                    replica: r.fixed(16)? as ReplicaId,
                    counter: r.number()?,
                },
            };
            if dot.counter == 0 || dot.counter > MAX_COUNTER {
                return Err(FilterError::malformed(format!(
                    "compact delta: tag counter {}",
                    dot.counter
                )));
            }
            context.insert(dot);
            let e = (sub, bucket, fp, dot);
            out.push(e);
            prev = Some(e);
        }
        Ok(out)
    };
    let entries = read(n_entries, &mut r)?;
    let removed = read(n_removed, &mut r)?;
    r.end()?;
    Ok((entries, removed, context))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::causal::dot;

    /// The writer agrees bit for bit with bitstream-io's little-endian one (the format's
    /// reference, and the reader's crate) on random sequences of its three kinds of writes.
    #[test]
    fn the_writer_writes_what_bitstream_io_writes() {
        use bitstream_io::{BitWrite, BitWriter};
        let mut rng = fastrand::Rng::with_seed(47);
        for _ in 0..2_000 {
            let mut ours = Bits::new();
            let mut theirs = BitWriter::endian(Vec::new(), LittleEndian);
            for _ in 0..rng.usize(0..40) {
                match rng.u8(0..3) {
                    0 => {
                        let b = rng.bool();
                        ours.bit(b);
                        theirs.write_bit(b).unwrap();
                    }
                    1 => {
                        let width = rng.u32(0..=64);
                        let v = rng.u64(..) >> (64 - width.max(1));
                        let v = if width == 0 { 0 } else { v };
                        ours.fixed(width, v);
                        if width > 0 {
                            theirs.write_var::<u64>(width, v).unwrap();
                        }
                    }
                    _ => {
                        let v = rng.u64(..) >> rng.u32(0..64);
                        ours.number(v);
                        let len = bits_for(v);
                        theirs.write_unary::<1>(len).unwrap();
                        if len > 1 {
                            theirs
                                .write_var::<u64>(len - 1, v & ((1u64 << (len - 1)) - 1))
                                .unwrap();
                        }
                    }
                }
            }
            theirs.byte_align().unwrap();
            assert_eq!(ours.finish(), theirs.into_writer());
        }
    }

    #[test]
    fn indexes_round_trip_at_the_width_of_the_largest() {
        for indexes in [
            vec![],
            vec![0],
            vec![5, 1, 9_600_000, 3],
            (0..1000).map(|i| i * 9_973 % 9_600_000).collect(),
            vec![u64::MAX, 0],
        ] {
            let bytes = encode_indexes(&indexes);
            assert_eq!(decode_indexes(&bytes).unwrap(), indexes);
        }
        // 700 indexes below 2^24 take 3 bytes each, plus 4 bytes of header.
        let many: Vec<u64> = (0..700).map(|i| (i * 13_001) % (1 << 24)).collect();
        assert!(encode_indexes(&many).len() <= 700 * 3 + 4);
    }

    #[test]
    fn tagged_entries_round_trip_and_rebuild_their_context() {
        let entries: Vec<TaggedEntry> = vec![
            (0, 17, 0x3ff, dot(2, 1)),
            (0, 40_000, 1, dot(2, 2)),
            (1, 3, 0xffff, dot(2, 3)),
            (1, 3, 5, dot(7, MAX_COUNTER)),
        ];
        let removed: Vec<TaggedEntry> = vec![(0, 9, 12, dot(1, 44)), (3, 9, 13, dot(1, 45))];
        for subs in [true, false] {
            let strip = |v: &[TaggedEntry]| -> Vec<TaggedEntry> {
                v.iter()
                    .map(|&(s, b, f, d)| (if subs { s } else { 0 }, b, f, d))
                    .collect()
            };
            let (e, r) = (strip(&entries), strip(&removed));
            let bytes = encode_tagged(subs, e.iter().copied(), r.iter().copied());
            let (de, dr, ctx) = decode_tagged(subs, &bytes).unwrap();
            assert_eq!((de, dr), (e.clone(), r.clone()));
            assert_eq!(ctx.dot_count(), 6);
            assert!(e.iter().chain(&r).all(|x| ctx.contains(x.3)));
        }
    }

    #[test]
    fn consecutive_tags_cost_one_bit_each() {
        // 100 adds of one replica into a 65,536-bucket table with 12-bit fingerprints: 16 + 12
        // + 1 bits each.
        let entries: Vec<TaggedEntry> = (0..100)
            .map(|i| (0, (i * 7_919) % 65_536, (i % 4096) as u16, dot(3, 1000 + i)))
            .collect();
        let bytes = encode_tagged(false, entries.iter().copied(), std::iter::empty());
        assert!(
            bytes.len() <= (100 * 29usize).div_ceil(8) + 10,
            "{}",
            bytes.len()
        );
    }

    #[test]
    fn damaged_input_is_refused_without_large_allocations() {
        let entries: Vec<TaggedEntry> = (0..50u64)
            .map(|i| ((i % 3) as u32, i, 7, dot(1, i + 1)))
            .collect();
        let good = encode_tagged(true, entries.iter().copied(), std::iter::empty());
        for cut in 0..good.len() {
            assert!(decode_tagged(true, &good[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode_tagged(true, &longer).is_err());
        let idx = encode_indexes(&[1, 2, 3]);
        for cut in 0..idx.len() {
            assert!(decode_indexes(&idx[..cut]).is_err());
        }
        // A count of 2^63 announced in a few bytes is refused before any allocation.
        let mut w = Bits::new();
        w.number(1 << 63);
        w.fixed(7, 1);
        assert!(decode_indexes(&w.finish()).is_err());
        let mut w = Bits::new();
        w.number(1 << 40);
        w.number(0);
        assert!(decode_tagged(false, &w.finish()).is_err());
        // More indexes than their width can name (each bit is named once).
        let mut w = Bits::new();
        w.number(5);
        w.fixed(7, 2);
        w.fixed(10, 0);
        assert!(decode_indexes(&w.finish()).is_err());
        // More entries than the declared widths leave room for.
        let mut w = Bits::new();
        w.number(10);
        w.number(0);
        w.fixed(7, 8);
        w.fixed(5, 8);
        w.fixed(30, 0);
        assert!(decode_tagged(false, &w.finish()).is_err());
        // Zeros only: a number longer than 64 bits.
        assert!(decode_indexes(&[0; 20]).is_err());
        // Counter 0 and counters over the clock's range are not tags.
        for c in [0, MAX_COUNTER + 1] {
            let bytes = encode_tagged(false, [(0, 1, 1, dot(1, c))].into_iter(), [].into_iter());
            assert!(decode_tagged(false, &bytes).is_err());
        }
    }
}
