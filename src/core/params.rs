//! Filter parameters: explicit structs for full control, and sizing from a capacity and a
//! target false positive rate.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::error::FilterError;
use super::hash::HASH_VERSION;

/// Seed used by the `with_capacity` constructors. Replicas must share a seed to merge.
pub const DEFAULT_SEED: u64 = 0x6372_7066_5f76_3031; // "crpf_v01"

/// Largest fingerprint the cuckoo tables store (fingerprints live in `u16` slots).
pub const MAX_FINGERPRINT_BITS: u8 = 16;

/// Most memory one filter may take, in bytes: 4 GiB. For a scalable filter this bounds all its
/// sub-filters together, at every expansion. Constructors and decoders reject parameters that
/// would take more ([`FilterError::TooLarge`]) before allocating anything, so that a tampered or
/// absurd parameter set (a few bytes on the wire) cannot make a replica allocate gigabytes; a
/// scalable filter that reaches the limit fails its adds with that error instead of growing.
pub const MAX_FILTER_BYTES: u64 = 1 << 32;

/// [`FilterError::TooLarge`] if `needed` bytes exceed [`MAX_FILTER_BYTES`].
pub(crate) fn check_memory(needed: u64) -> Result<(), FilterError> {
    if needed > MAX_FILTER_BYTES {
        Err(FilterError::TooLarge {
            needed,
            limit: MAX_FILTER_BYTES,
        })
    } else {
        Ok(())
    }
}

/// Load factor a cuckoo table with 4-slot buckets reaches reliably (Fan et al.: ~95%).
pub const CUCKOO_TARGET_LOAD: f64 = 0.95;

pub(crate) fn check_fpr(fpr: f64) -> Result<(), FilterError> {
    if fpr.is_finite() && fpr > 0.0 && fpr < 1.0 {
        Ok(())
    } else {
        Err(FilterError::invalid(
            "fpr",
            format!("{fpr} is not in (0, 1)"),
        ))
    }
}

pub(crate) fn check_kicks(max_kicks: u32) -> Result<(), FilterError> {
    if max_kicks > CuckooParams::MAX_KICKS {
        Err(FilterError::invalid(
            "max_kicks",
            format!("{max_kicks} exceeds {}", CuckooParams::MAX_KICKS),
        ))
    } else {
        Ok(())
    }
}

pub(crate) fn check_capacity(capacity: u64) -> Result<(), FilterError> {
    if capacity == 0 {
        Err(FilterError::invalid("capacity", "must be at least 1"))
    } else {
        Ok(())
    }
}

/// Parameters of a Bloom filter: `m` bits, `k` hash functions, the hash seed, and the number of
/// elements it was designed for (used for the load factor and by scalable series).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BloomParams {
    /// Number of bits `m`.
    pub bits: u64,
    /// Number of hash functions `k`.
    pub hashes: u32,
    /// Seed of the item hash.
    pub seed: u64,
    /// Number of elements the filter is designed to hold.
    pub capacity: u64,
}

impl BloomParams {
    /// Largest bit array accepted: [`MAX_FILTER_BYTES`] of bits.
    pub const MAX_BITS: u64 = MAX_FILTER_BYTES * 8;

    /// Optimal `m` and `k` for `capacity` elements at false positive rate `fpr` (Eq. 2.3, 2.4).
    ///
    /// ```
    /// let p = crpf::BloomParams::with_capacity(1 << 20, 0.01).unwrap();
    /// assert_eq!(p.hashes, 7);
    /// assert!(p.bits > 9 * (1 << 20));
    /// ```
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        check_capacity(capacity)?;
        check_fpr(fpr)?;
        let ln2 = std::f64::consts::LN_2;
        let bits = (-(capacity as f64) * fpr.ln() / (ln2 * ln2))
            .ceil()
            .max(1.0) as u64;
        let hashes = (-fpr.ln() / ln2).round().max(1.0) as u32;
        Self {
            bits,
            hashes,
            seed: DEFAULT_SEED,
            capacity,
        }
        .validated()
    }

    /// The same parameters with another hash seed.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// Checks the parameters; every constructor and decoder goes through here.
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.bits == 0 {
            return Err(FilterError::invalid("bits", "must be at least 1"));
        }
        check_memory(self.memory_bytes())?;
        if self.hashes == 0 || self.hashes > 64 {
            return Err(FilterError::invalid(
                "hashes",
                format!("{} is not in 1..=64", self.hashes),
            ));
        }
        check_capacity(self.capacity)?;
        Ok(self)
    }

    /// Bytes the bit array takes (whole 64-bit words).
    pub fn memory_bytes(&self) -> u64 {
        self.bits.div_ceil(64) * 8
    }

    /// Theoretical FPR after `n` insertions (Eq. 2.2 / 3.1).
    pub fn fpr_after(&self, n: f64) -> f64 {
        (1.0 - (-(self.hashes as f64) * n / self.bits as f64).exp()).powi(self.hashes as i32)
    }

    /// A stable digest of the parameters and hash version: replicas merge only equal digests.
    pub fn digest(&self) -> u64 {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(b"bloom");
        b.extend_from_slice(&HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.bits.to_le_bytes());
        b.extend_from_slice(&self.hashes.to_le_bytes());
        b.extend_from_slice(&self.seed.to_le_bytes());
        b.extend_from_slice(&self.capacity.to_le_bytes());
        xxh3_64(&b)
    }
}

/// Parameters of a cuckoo table: `buckets` buckets of `bucket_size` slots holding
/// `fingerprint_bits`-bit fingerprints, at most `max_kicks` displacements per insertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CuckooParams {
    /// Number of buckets `m` (any positive number; not necessarily a power of two).
    pub buckets: u64,
    /// Slots per bucket `c` (default 4).
    pub bucket_size: u8,
    /// Fingerprint length `l` in bits, 1 to 16.
    pub fingerprint_bits: u8,
    /// Kick quota of Algorithm 1 (default 500).
    pub max_kicks: u32,
    /// Seed of the item hash.
    pub seed: u64,
}

impl CuckooParams {
    /// Default slots per bucket.
    pub const DEFAULT_BUCKET_SIZE: u8 = 4;
    /// Default kick quota.
    pub const DEFAULT_MAX_KICKS: u32 = 500;
    /// Largest table accepted (2^32 buckets; [`MAX_FILTER_BYTES`] bounds it further).
    pub const MAX_BUCKETS: u64 = 1 << 32;
    /// Largest kick quota accepted. A failed insertion keeps an undo record per kick (tens of
    /// bytes), so the quota bounds that memory (2^16 kicks: a few MiB) as well as the time.
    pub const MAX_KICKS: u32 = 1 << 16;

    /// Buckets for `capacity` elements at the target load, and the fingerprint length that
    /// keeps Eq. 2.10 (`2c / 2^l`) at or under `fpr`.
    ///
    /// ```
    /// let p = crpf::CuckooParams::with_capacity(1 << 20, 0.03125).unwrap();
    /// assert_eq!((p.bucket_size, p.fingerprint_bits), (4, 8));
    /// assert!(p.buckets * 4 >= 1 << 20);
    /// ```
    pub fn with_capacity(capacity: u64, fpr: f64) -> Result<Self, FilterError> {
        Self::with_capacity_and_bucket_size(capacity, fpr, Self::DEFAULT_BUCKET_SIZE)
    }

    /// As [`CuckooParams::with_capacity`] with another bucket size.
    pub fn with_capacity_and_bucket_size(
        capacity: u64,
        fpr: f64,
        bucket_size: u8,
    ) -> Result<Self, FilterError> {
        check_capacity(capacity)?;
        check_fpr(fpr)?;
        if bucket_size == 0 {
            return Err(FilterError::invalid("bucket_size", "must be at least 1"));
        }
        let bits = (2.0 * bucket_size as f64 / fpr).log2().ceil().max(1.0);
        if bits > MAX_FINGERPRINT_BITS as f64 {
            return Err(FilterError::invalid(
                "fpr",
                format!(
                    "{fpr} needs {bits}-bit fingerprints; at most {MAX_FINGERPRINT_BITS} are supported"
                ),
            ));
        }
        let buckets = (capacity as f64 / (bucket_size as f64 * CUCKOO_TARGET_LOAD))
            .ceil()
            .max(1.0);
        Self {
            buckets: buckets as u64,
            bucket_size,
            fingerprint_bits: bits as u8,
            max_kicks: Self::DEFAULT_MAX_KICKS,
            seed: DEFAULT_SEED,
        }
        .validated()
    }

    /// The same parameters with another hash seed.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// Checks the parameters; every constructor goes through here.
    pub fn validated(self) -> Result<Self, FilterError> {
        if self.buckets == 0 || self.buckets > Self::MAX_BUCKETS {
            return Err(FilterError::invalid(
                "buckets",
                format!("{} is not in 1..=2^32", self.buckets),
            ));
        }
        // Any size a `u8` holds, as RedisBloom's `BUCKETSIZE` (1 to 255): lookups scan a
        // bucket slot by slot past 4, which large buckets pay for in time, not correctness.
        if self.bucket_size == 0 {
            return Err(FilterError::invalid("bucket_size", "must be at least 1"));
        }
        if self.fingerprint_bits == 0 || self.fingerprint_bits > MAX_FINGERPRINT_BITS {
            return Err(FilterError::invalid(
                "fingerprint_bits",
                format!(
                    "{} is not in 1..={MAX_FINGERPRINT_BITS}",
                    self.fingerprint_bits
                ),
            ));
        }
        check_kicks(self.max_kicks)?;
        check_memory(self.memory_bytes())?;
        Ok(self)
    }

    /// Bytes a table with these parameters takes at most: the fingerprint (1 or 2 bytes) and
    /// the 8-byte version tag of every slot, counted whichever filter holds the table (a GCF
    /// stores no tags), so that one bound serves them all. Overflow entries that merges add
    /// come on top, in proportion to the states merged rather than to the parameters.
    pub fn memory_bytes(&self) -> u64 {
        let fp_bytes = if self.fingerprint_bits > 8 { 2 } else { 1 };
        self.slots().saturating_mul(fp_bytes + 8)
    }

    /// Whether `(bucket, fp)` is an entry a table with these parameters can hold.
    pub fn holds_entry(&self, bucket: u64, fp: u16) -> bool {
        bucket < self.buckets && fp != 0 && (fp as u32) < (1u32 << self.fingerprint_bits)
    }

    /// Number of slots `m * c`.
    pub fn slots(&self) -> u64 {
        self.buckets * self.bucket_size as u64
    }

    /// Eq. 3.7: FPR at average load factor `load`, with the `2^l - 1` non-zero fingerprints.
    pub fn fpr_at_load(&self, load: f64) -> f64 {
        let fp_space = ((1u64 << self.fingerprint_bits) - 1) as f64;
        1.0 - (1.0 - 1.0 / fp_space).powf(2.0 * self.bucket_size as f64 * load)
    }

    /// Eq. 3.7's first-order form `2cᾱ / (2^l - 1)`: the expected number of matching entries.
    /// Exact for a table that holds at most one entry per bucket pair and fingerprint (GCF,
    /// whose adds skip contained items), where a query matches at most one entry.
    pub fn fpr_at_load_unique(&self, load: f64) -> f64 {
        let fp_space = ((1u64 << self.fingerprint_bits) - 1) as f64;
        (2.0 * self.bucket_size as f64 * load / fp_space).min(1.0)
    }

    /// A stable digest of the parameters and hash version.
    pub fn digest(&self) -> u64 {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(b"cuckoo");
        b.extend_from_slice(&HASH_VERSION.to_le_bytes());
        b.extend_from_slice(&self.buckets.to_le_bytes());
        b.push(self.bucket_size);
        b.push(self.fingerprint_bits);
        b.extend_from_slice(&self.max_kicks.to_le_bytes());
        b.extend_from_slice(&self.seed.to_le_bytes());
        xxh3_64(&b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_parameters_are_errors_not_panics() {
        assert!(BloomParams::with_capacity(0, 0.01).is_err());
        for fpr in [0.0, 1.0, -0.5, 2.0, f64::NAN, f64::INFINITY] {
            assert!(BloomParams::with_capacity(100, fpr).is_err(), "{fpr}");
            assert!(CuckooParams::with_capacity(100, fpr).is_err(), "{fpr}");
        }
        assert!(
            CuckooParams::with_capacity(100, 1e-9).is_err(),
            "needs > 16-bit fingerprints"
        );
        let p = CuckooParams::with_capacity(100, 0.01).unwrap();
        assert!(
            CuckooParams {
                fingerprint_bits: 17,
                ..p
            }
            .validated()
            .is_err()
        );
        assert!(
            CuckooParams {
                fingerprint_bits: 0,
                ..p
            }
            .validated()
            .is_err()
        );
        assert!(CuckooParams { buckets: 0, ..p }.validated().is_err());
        assert!(
            CuckooParams {
                bucket_size: 0,
                ..p
            }
            .validated()
            .is_err()
        );
        let b = BloomParams::with_capacity(100, 0.01).unwrap();
        assert!(BloomParams { hashes: 0, ..b }.validated().is_err());
        assert!(BloomParams { bits: 0, ..b }.validated().is_err());
    }

    #[test]
    fn thesis_configurations() {
        // GBF 5 at 3.125%: k = round(5.0) = 5.
        assert_eq!(
            BloomParams::with_capacity(1 << 20, 0.03125).unwrap().hashes,
            5
        );
        // GCF 4 at 3.125%: 2*4/2^8.
        let c = CuckooParams::with_capacity(1 << 20, 0.03125).unwrap();
        assert_eq!(c.fingerprint_bits, 8);
    }
}

#[cfg(test)]
mod golden {
    use super::*;
    use crate::ScalableParams;

    /// Parameter digests carry the hash version: replicas that hash differently never merge.
    /// If this fails, the wire format changed.
    #[test]
    fn parameter_digests_are_pinned() {
        let b = BloomParams::with_capacity(1000, 0.01).unwrap();
        let c = CuckooParams::with_capacity(1000, 0.01).unwrap();
        let s = ScalableParams::with_capacity(1000, 0.01).unwrap();
        assert_eq!(
            [b.digest(), c.digest(), s.digest()],
            [
                0xfe19_22bf_b7e5_eb8f,
                0xbd09_fd71_8509_f033,
                0xf827_3896_5117_d03a
            ]
        );
    }
}
