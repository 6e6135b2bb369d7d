//! The wire format (DESIGN.md sections 2 and 5): versioned CBOR envelopes carrying delta-states,
//! anti-entropy digests and chunks of full states between replicas.
//!
//! A frame is `b"crpf"`, one version byte, then the CBOR encoding (packed: fields by index) of an
//! [`Envelope`]. The magic and version come first so that garbage and foreign versions are
//! rejected before any CBOR is parsed. The filter states and deltas inside a body are the core
//! types' own serde encodings, also CBOR.
//!
//! ```
//! use crpf::wire::{Body, Envelope, FilterKind, Expect};
//!
//! let env = Envelope::new("users", FilterKind::GBloom, 42, uuid::Uuid::nil(), 1, 7,
//!                         Body::Delta(vec![1, 2, 3]));
//! let bytes = env.encode();
//! let expect = Expect { filter: "users".into(), kind: FilterKind::GBloom, params_digest: 42,
//!                       max_bytes: 1 << 20 };
//! assert_eq!(Envelope::decode(&bytes, &expect)?, env);
//! assert_eq!(Envelope::decode(&bytes[..10], &expect).unwrap_err().reason(), "truncated");
//! # Ok::<(), crpf::wire::WireError>(())
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

/// Version of the frame layout and envelope schema. A change of hashing (DESIGN.md section 3)
/// changes the parameter digests instead.
pub const WIRE_VERSION: u8 = 1;

/// First bytes of every frame.
pub const MAGIC: &[u8; 4] = b"crpf";

/// Bytes before the CBOR envelope.
pub const HEADER_LEN: usize = MAGIC.len() + 1;

/// The six filter types, as named on the wire and in configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FilterKind {
    /// [`crate::GBloom`]
    GBloom,
    /// [`crate::GCuckoo`]
    GCuckoo,
    /// [`crate::OrCuckoo`]
    OrCuckoo,
    /// [`crate::ScGBloom`]
    ScGBloom,
    /// [`crate::ScGCuckoo`]
    ScGCuckoo,
    /// [`crate::ScOrCuckoo`]
    ScOrCuckoo,
}

impl FilterKind {
    /// All kinds.
    pub const ALL: [FilterKind; 6] = [
        FilterKind::GBloom,
        FilterKind::GCuckoo,
        FilterKind::OrCuckoo,
        FilterKind::ScGBloom,
        FilterKind::ScGCuckoo,
        FilterKind::ScOrCuckoo,
    ];

    /// The configuration name (`g_bloom`, `or_cuckoo`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FilterKind::GBloom => "g_bloom",
            FilterKind::GCuckoo => "g_cuckoo",
            FilterKind::OrCuckoo => "or_cuckoo",
            FilterKind::ScGBloom => "sc_g_bloom",
            FilterKind::ScGCuckoo => "sc_g_cuckoo",
            FilterKind::ScOrCuckoo => "sc_or_cuckoo",
        }
    }

    /// Whether the kind supports removal (and so carries version tags).
    pub fn removable(self) -> bool {
        matches!(self, FilterKind::OrCuckoo | FilterKind::ScOrCuckoo)
    }
}

impl std::fmt::Display for FilterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FilterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FilterKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown filter kind `{s}`"))
    }
}

/// One message between replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Name of the replicated filter (the `<filter>` of the subjects).
    pub filter: String,
    /// Its type.
    pub kind: FilterKind,
    /// Digest of its parameters (`params.digest()`): only equal digests merge.
    pub params_digest: u64,
    /// The sending process (a replica's uuid); a replica ignores its own messages.
    pub sender: Uuid,
    /// The sender's replica id (version tags, metrics labels).
    pub replica: u16,
    /// Per-sender sequence number, +1 per envelope: gaps reveal lost messages.
    pub seq: u64,
    /// What it carries.
    pub body: Body,
}

/// What an envelope carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    /// A delta-state (the core delta type's CBOR).
    Delta(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Anti-entropy announcement: a digest equal for equivalent states. A receiver whose own
    /// digest differs pushes its full state.
    Digest {
        /// The state digest.
        digest: u64,
        /// Whether the sender has caught up after its start.
        ready: bool,
    },
    /// Asks peers to push their full state: all of them (a replica that starts or
    /// reconnects), or one whose messages went missing (a gap in its sequence numbers).
    StateRequest {
        /// The peer asked, or every peer.
        target: Option<Uuid>,
    },
    /// One chunk of a full state (the core state type's CBOR), so that states larger than the
    /// server's `max_payload` replicate.
    StateChunk(StateChunk),
    /// A delta-state whose receivers acknowledge it with an [`Body::Ack`] once merged (it
    /// carries updates acknowledged at the `replicated` level).
    ConfirmedDelta(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A receiver merged the delta of sequence number `seq` from `target`.
    Ack {
        /// The sender of the delta.
        target: Uuid,
        /// Its envelope's sequence number.
        seq: u64,
    },
}

/// A chunk of a full state transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChunk {
    /// Transfer id, unique per sender.
    pub transfer: u64,
    /// Index of this chunk, `0..count`.
    pub index: u32,
    /// Number of chunks.
    pub count: u32,
    /// Length of the whole state in bytes.
    pub total_len: u64,
    /// xxh3-64 of the whole state: a reassembly that does not match is discarded.
    pub checksum: u64,
    /// The bytes of this chunk.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// What a receiver accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    /// Filter name.
    pub filter: String,
    /// Filter type.
    pub kind: FilterKind,
    /// Parameter digest.
    pub params_digest: u64,
    /// Largest frame accepted.
    pub max_bytes: usize,
}

/// Why a frame or payload was rejected. [`WireError::reason`] is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Larger than the receiver's limit.
    #[error("message of {len} bytes exceeds the limit of {limit}")]
    Oversized {
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Ends before a complete frame.
    #[error("truncated message: {0}")]
    Truncated(String),
    /// Not a crpf frame, or undecodable.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A crpf frame of another wire version.
    #[error("wire version {0}, expected {WIRE_VERSION}")]
    Version(u8),
    /// For another filter name.
    #[error("message for filter `{0}`")]
    Filter(String),
    /// For another filter type.
    #[error("message for a {got} filter, this one is {expected}")]
    Kind {
        /// The message's kind.
        got: FilterKind,
        /// Ours.
        expected: FilterKind,
    },
    /// Built with other parameters.
    #[error("parameter digest {got:#x}, expected {expected:#x}")]
    Params {
        /// The message's digest.
        got: u64,
        /// Ours.
        expected: u64,
    },
    /// A state or delta that decodes but does not fit the filter.
    #[error("incompatible content: {0}")]
    Incompatible(String),
    /// A chunk inconsistent with its transfer, or a reassembled state whose checksum differs.
    #[error("bad state chunk: {0}")]
    Chunk(String),
    /// A message of a new sender while the receiver tracks as many live peers as it may.
    #[error("a new sender beyond max_peers = {0} live peers")]
    TooManyPeers(usize),
    /// Arrived on a subject that does not carry it (a delta on the state subject, a state on
    /// the delta subject, anything on a subject that is neither).
    #[error("wrong subject: {0}")]
    Subject(String),
}

impl WireError {
    /// Short, bounded label for the `reason` of `crpf_rejects_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::Oversized { .. } => "oversized",
            WireError::Truncated(_) => "truncated",
            WireError::Malformed(_) => "malformed",
            WireError::Version(_) => "version",
            WireError::Filter(_) => "filter",
            WireError::Kind { .. } => "kind",
            WireError::Params { .. } => "params",
            WireError::Incompatible(_) => "incompatible",
            WireError::Chunk(_) => "chunk",
            WireError::TooManyPeers(_) => "too_many_peers",
            WireError::Subject(_) => "subject",
        }
    }

    fn from_cbor(e: serde_cbor::Error) -> Self {
        if e.is_eof() {
            WireError::Truncated(e.to_string())
        } else {
            WireError::Malformed(e.to_string())
        }
    }
}

impl Envelope {
    /// An envelope.
    pub fn new(
        filter: impl Into<String>,
        kind: FilterKind,
        params_digest: u64,
        sender: Uuid,
        replica: u16,
        seq: u64,
        body: Body,
    ) -> Self {
        Envelope {
            filter: filter.into(),
            kind,
            params_digest,
            sender,
            replica,
            seq,
            body,
        }
    }

    /// The frame: magic, version, packed CBOR.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.body_len());
        out.extend_from_slice(MAGIC);
        out.push(WIRE_VERSION);
        let mut ser = serde_cbor::Serializer::new(&mut out).packed_format();
        self.serialize(&mut ser)
            .expect("CBOR into a Vec cannot fail");
        out
    }

    fn body_len(&self) -> usize {
        match &self.body {
            Body::Delta(b) | Body::ConfirmedDelta(b) => b.len(),
            Body::StateChunk(c) => c.data.len(),
            _ => 0,
        }
    }

    /// Decodes a frame and checks that it is for the expected filter; never panics.
    pub fn decode(bytes: &[u8], expect: &Expect) -> Result<Envelope, WireError> {
        if bytes.len() > expect.max_bytes {
            return Err(WireError::Oversized {
                len: bytes.len(),
                limit: expect.max_bytes,
            });
        }
        if bytes.len() < HEADER_LEN {
            return if MAGIC.starts_with(bytes) {
                Err(WireError::Truncated(format!("{} bytes", bytes.len())))
            } else {
                Err(WireError::Malformed("no crpf magic".into()))
            };
        }
        if &bytes[..MAGIC.len()] != MAGIC {
            return Err(WireError::Malformed("no crpf magic".into()));
        }
        let version = bytes[MAGIC.len()];
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let env: Envelope =
            serde_cbor::from_slice(&bytes[HEADER_LEN..]).map_err(WireError::from_cbor)?;
        if env.filter != expect.filter {
            return Err(WireError::Filter(env.filter));
        }
        if env.kind != expect.kind {
            return Err(WireError::Kind {
                got: env.kind,
                expected: expect.kind,
            });
        }
        if env.params_digest != expect.params_digest {
            return Err(WireError::Params {
                got: env.params_digest,
                expected: expect.params_digest,
            });
        }
        if let Body::StateChunk(c) = &env.body {
            c.check()?;
        }
        Ok(env)
    }
}

impl StateChunk {
    /// Consistency of the chunk header with itself (not with its siblings).
    fn check(&self) -> Result<(), WireError> {
        if self.count == 0 || self.index >= self.count {
            return Err(WireError::Chunk(format!(
                "chunk {} of {}",
                self.index, self.count
            )));
        }
        if self.data.len() as u64 > self.total_len {
            return Err(WireError::Chunk("chunk longer than its state".into()));
        }
        Ok(())
    }
}

/// Splits an encoded state into chunks of at most `chunk_len` bytes.
pub fn chunk_state(state: &[u8], transfer: u64, chunk_len: usize) -> Vec<StateChunk> {
    let chunk_len = chunk_len.max(1);
    let checksum = xxhash_rust::xxh3::xxh3_64(state);
    let count = state.len().div_ceil(chunk_len).max(1);
    let mut chunks: Vec<StateChunk> = state
        .chunks(chunk_len)
        .enumerate()
        .map(|(i, data)| StateChunk {
            transfer,
            index: i as u32,
            count: count as u32,
            total_len: state.len() as u64,
            checksum,
            data: data.to_vec(),
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(StateChunk {
            transfer,
            index: 0,
            count: 1,
            total_len: 0,
            checksum,
            data: Vec::new(),
        });
    }
    chunks
}

/// CBOR with fields as integer keys (serde_cbor's packed format, which `from_slice` reads
/// back): of states, deltas and envelopes.
pub fn to_cbor<T: Serialize>(value: &T) -> Vec<u8> {
    serde_cbor::ser::to_vec_packed(value).expect("CBOR into a Vec cannot fail")
}

/// Decodes CBOR produced by [`to_cbor`]; truncated input gives [`WireError::Truncated`].
pub fn from_cbor<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    serde_cbor::from_slice(bytes).map_err(WireError::from_cbor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect() -> Expect {
        Expect {
            filter: "f".into(),
            kind: FilterKind::OrCuckoo,
            params_digest: 9,
            max_bytes: 1 << 16,
        }
    }

    fn env(body: Body) -> Envelope {
        Envelope::new(
            "f",
            FilterKind::OrCuckoo,
            9,
            Uuid::from_u128(5),
            3,
            11,
            body,
        )
    }

    #[test]
    fn round_trips_every_body() {
        let state: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut bodies = vec![
            Body::Delta(vec![0xff; 10]),
            Body::Digest {
                digest: 77,
                ready: true,
            },
            Body::StateRequest { target: None },
            Body::StateRequest {
                target: Some(Uuid::from_u128(8)),
            },
        ];
        bodies.extend(
            chunk_state(&state, 4, 300)
                .into_iter()
                .map(Body::StateChunk),
        );
        for b in bodies {
            let e = env(b);
            assert_eq!(Envelope::decode(&e.encode(), &expect()).unwrap(), e);
        }
    }

    #[test]
    fn packed_envelope_is_small() {
        let e = env(Body::Delta(vec![0; 8]));
        // magic + version + 7 fields, a 16-byte uuid: well under 64 bytes.
        assert!(e.encode().len() < 64, "{}", e.encode().len());
    }

    #[test]
    fn rejects_by_reason() {
        let good = env(Body::StateRequest { target: None }).encode();
        let ex = expect();
        let reason = |b: &[u8], ex: &Expect| Envelope::decode(b, ex).unwrap_err().reason();
        assert_eq!(reason(b"hello world", &ex), "malformed");
        assert_eq!(reason(b"", &ex), "truncated");
        assert_eq!(reason(&good[..good.len() - 1], &ex), "truncated");
        let mut v2 = good.clone();
        v2[4] = 2;
        assert_eq!(reason(&v2, &ex), "version");
        assert_eq!(
            reason(
                &good,
                &Expect {
                    max_bytes: 8,
                    ..ex.clone()
                }
            ),
            "oversized"
        );
        assert_eq!(
            reason(
                &good,
                &Expect {
                    filter: "g".into(),
                    ..ex.clone()
                }
            ),
            "filter"
        );
        assert_eq!(
            reason(
                &good,
                &Expect {
                    kind: FilterKind::GBloom,
                    ..ex.clone()
                }
            ),
            "kind"
        );
        assert_eq!(
            reason(
                &good,
                &Expect {
                    params_digest: 1,
                    ..ex.clone()
                }
            ),
            "params"
        );
        let bad_chunk = env(Body::StateChunk(StateChunk {
            transfer: 1,
            index: 3,
            count: 2,
            total_len: 1,
            checksum: 0,
            data: vec![],
        }))
        .encode();
        assert_eq!(reason(&bad_chunk, &ex), "chunk");
    }

    #[test]
    fn garbage_never_panics() {
        let good = env(Body::Delta(vec![1; 40])).encode();
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..rng.usize(1..4) {
                let i = rng.usize(HEADER_LEN..b.len());
                b[i] = rng.u8(..);
            }
            let _ = Envelope::decode(&b, &expect());
            let n = rng.usize(..b.len());
            let _ = Envelope::decode(&b[..n], &expect());
        }
    }

    #[test]
    fn kinds_parse_by_name() {
        for k in FilterKind::ALL {
            assert_eq!(k.name().parse::<FilterKind>().unwrap(), k);
        }
        assert!("bloom".parse::<FilterKind>().is_err());
    }
}

#[cfg(test)]
mod golden {
    use super::*;

    /// Pins wire format version 1: a change here breaks replicas of older releases.
    #[test]
    fn envelope_bytes_are_stable() {
        let env = Envelope::new(
            "users",
            FilterKind::ScOrCuckoo,
            0x0123_4567_89ab_cdef,
            Uuid::from_u128(0x00112233_4455_6677_8899_aabbccddeeff),
            7,
            42,
            Body::Digest {
                digest: 0xfeed,
                ready: true,
            },
        );
        let hex: String = env.encode().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN);
    }

    /// `crpf`, version 1, then a 7-field packed map: name, kind (variant 5), parameter digest,
    /// 16 uuid bytes, replica 7, seq 42, body `{1: {0: 0xfeed, 1: true}}` (variant `Digest`).
    const GOLDEN: &str = "6372706601a7006575736572730105021b0123456789abcdef035000112233445566\
                          778899aabbccddeeff040705182a06a101a20019feed01f5";
}
