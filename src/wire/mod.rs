//! The wire format (docs/DESIGN.md sections 2 and 5): versioned CBOR envelopes carrying delta-states,
//! anti-entropy digests and chunks of full states between replicas.
//!
//! A frame (wire version 2) is, in order:
//!
//! | bytes | content |
//! |---|---|
//! | 4 | magic `b"crpf"` |
//! | 1 | version, [`WIRE_VERSION`] |
//! | 1 | flags: bit 0 ([`FLAG_SIGNED`]) says a MAC follows the envelope; the others are 0 |
//! | n | the packed CBOR (fields by index) of an [`Envelope`] |
//! | 32 | if signed: HMAC-SHA256 under a cluster key ([`AuthKeys`]) of every byte before it |
//! | 8 | xxh3-64 of every byte before it (header, envelope, MAC), little-endian |
//!
//! A receiver checks, in this order: size, magic, version (so that garbage and foreign
//! versions are rejected before anything else is read), the checksum (a frame damaged in
//! transit is rejected as a whole: a flipped bit in a `g_bloom` delta would otherwise set bits
//! for ever on every replica), the signature (see [`WireCodec`]), and only then parses the CBOR
//! and compares the envelope with what it expects ([`Expect`]). The filter states and deltas
//! inside a body are the core types' own serde encodings, also CBOR.
//!
//! ```
//! use crpf::wire::{AuthKeys, Body, Envelope, Expect, FilterKind, WireCodec};
//!
//! let env = Envelope::new("users", FilterKind::GBloom, 42, uuid::Uuid::nil(), 1, 7,
//!                         Body::Delta(vec![1, 2, 3]));
//! let expect = Expect { filter: "users".into(), kind: FilterKind::GBloom, params_digest: 42,
//!                       generation: 0, max_bytes: 1 << 20 };
//! // Without keys: frames carry a checksum only.
//! let bytes = env.encode();
//! assert_eq!(Envelope::decode(&bytes, &expect)?, env);
//! assert_eq!(Envelope::decode(&bytes[..10], &expect).unwrap_err().reason(), "truncated");
//!
//! // With a cluster key: frames are signed, and unsigned ones are refused.
//! let keys = AuthKeys::new([b"an example key of at least 32 bytes".to_vec()])?;
//! let codec = WireCodec::new(expect.clone(), Some(keys));
//! assert_eq!(codec.decode(&codec.encode(&env))?, env);
//! assert_eq!(codec.decode(&bytes).unwrap_err().reason(), "unsigned");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod auth;
pub mod batch;

pub use auth::{AuthKeys, KeyError, MAC_LEN, MIN_KEY_LEN};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::codec::CodecError;
use uuid::Uuid;

/// Version of the frame layout and envelope schema. A change of hashing (docs/DESIGN.md section 3)
/// changes the parameter digests instead. Version 1 had neither flags nor checksum.
pub const WIRE_VERSION: u8 = 2;

/// First bytes of every frame.
pub const MAGIC: &[u8; 4] = b"crpf";

/// Bytes before the CBOR envelope: magic, version, flags.
pub const HEADER_LEN: usize = MAGIC.len() + 2;

/// Bytes of the trailing xxh3-64 checksum.
pub const CHECKSUM_LEN: usize = 8;

/// The shortest frame that can be checked: a header and a checksum.
pub const MIN_FRAME_LEN: usize = HEADER_LEN + CHECKSUM_LEN;

/// Flag bit: an HMAC-SHA256 of [`MAC_LEN`] bytes follows the envelope.
pub const FLAG_SIGNED: u8 = 1;

/// Position of the flags byte.
const FLAGS_AT: usize = MAGIC.len() + 1;

/// The filter kinds (defined with the core's registry; re-exported here where envelopes name
/// them).
pub use crate::core::kind::FilterKind;

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
    /// The filter's incarnation (its generation in the filter catalog): a dropped and
    /// re-created name is a new filter, and nothing of the old one may merge into it. 0, the
    /// filters of configuration files, is not encoded, so their frames are as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

fn is_zero(g: &u64) -> bool {
    *g == 0
}

/// What an envelope carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
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
        /// In a node's digest batch (numbered 0, outside the sequence): the number of the
        /// sender's last numbered message when it announced, if all of them had been handed
        /// to the transport. Absent otherwise (and from earlier versions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent: Option<u64>,
        /// The sender's next digest comes within this many anti-entropy intervals (a quiet
        /// cluster spaces its digests out), so its receivers count it live that much longer.
        /// Absent for 1 (and from earlier versions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spacing: Option<u32>,
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
    // Struct variants are encoded by position (see the test `body_variants_keep_their_keys`):
    // new variants go last.
    /// A receiver merged the chunks before `next` of `target`'s transfer `transfer`: a sender
    /// paces a [live](StateChunk::live) push by its slowest receiver, so that neither side
    /// holds more than a window of chunks besides its own state. Not sequenced (`seq` 0):
    /// it leaves at once, ahead of whatever its sender queued (its own push, perhaps).
    StateProgress {
        /// The sender of the transfer.
        target: Uuid,
        /// Its transfer id.
        transfer: u64,
        /// The index of the first chunk not yet merged.
        next: u32,
    },
    /// Several consecutive commits' delta-states, oldest first, each merged as a
    /// [`Body::Delta`] would be: a sender whose commits go at its disk's pace publishes at
    /// most one message per delta interval. At most [`MAX_DELTAS_PER_MESSAGE`].
    Deltas(#[serde(deserialize_with = "bounded_deltas")] Vec<serde_bytes::ByteBuf>),
}

/// Deltas one [`Body::Deltas`] carries at most: a receiver refuses more while decoding, so
/// that a frame of many empty byte strings cannot make it allocate far more than the
/// frame's size.
pub const MAX_DELTAS_PER_MESSAGE: usize = 256;

/// Decodes the deltas of a [`Body::Deltas`], refusing more than [`MAX_DELTAS_PER_MESSAGE`].
fn bounded_deltas<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<serde_bytes::ByteBuf>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<serde_bytes::ByteBuf>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_DELTAS_PER_MESSAGE} byte strings")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(delta) = seq.next_element::<serde_bytes::ByteBuf>()? {
                if out.len() == MAX_DELTAS_PER_MESSAGE {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_DELTAS_PER_MESSAGE} deltas in one message"
                    )));
                }
                out.push(delta);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

impl Body {
    /// Whether it travels on the delta subject (the rest travel on the state subject).
    pub fn is_delta(&self) -> bool {
        matches!(
            self,
            Body::Delta(_) | Body::ConfirmedDelta(_) | Body::Deltas(_)
        )
    }
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
    /// xxh3-64 of the whole state: a reassembly that does not match is discarded (0 for a
    /// [live](StateChunk::live) transfer).
    pub checksum: u64,
    /// The bytes of this chunk.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Each chunk was read from the sender's live state as it went out (kinds merged piece by
    /// piece, whose every piece is a part of some state the sender held): the sender never
    /// holds the state a second time, encoded, and the chunks of one transfer may come from
    /// states a few updates apart, so there is no whole-state checksum; every frame's own
    /// checksum covers its bytes. Not encoded when false, so other frames are as before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub live: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
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
    /// The filter's incarnation ([`Envelope::generation`]).
    pub generation: u64,
    /// Largest frame accepted.
    pub max_bytes: usize,
}

/// Why a frame or payload was rejected. [`WireError::reason`] is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
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
    /// The frame's checksum does not match its content: damaged in transit (or forged by
    /// something that does not know the format).
    #[error("frame checksum {got:#018x}, content hashes to {computed:#018x}")]
    Checksum {
        /// The checksum the frame carries.
        got: u64,
        /// The checksum of its content.
        computed: u64,
    },
    /// An unsigned frame, and this receiver requires signatures.
    #[error("unsigned message, and authenticated envelopes are required")]
    Unsigned,
    /// A signed frame whose MAC no accepted key verifies (another cluster key, or forged).
    #[error("signature verified by none of the accepted keys")]
    BadSignature,
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
    /// Of another incarnation of the filter (dropped and created again meanwhile).
    #[error("message of generation {got} of the filter, this one is generation {expected}")]
    Generation {
        /// The message's generation.
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
    /// A state or delta carrying tags of the receiver's own replica id beyond its clock: merged,
    /// it would push the clock toward exhaustion (only the replica itself issues its tags).
    #[error("tags of our own replica id ahead of our clock: {0}")]
    OwnTagAhead(String),
    /// A state or delta carrying a tag of another replica id above every timestamp the id
    /// registry reserves for that id: no replica issued it (forged, or a registry that lost its
    /// records). Held back first while the receiver reads the registry again.
    #[error(
        "tag ({replica}, {counter}) above what the id registry reserves for replica id {replica}"
    )]
    TagUnreserved {
        /// The id.
        replica: crate::ReplicaId,
        /// The tag's timestamp.
        counter: u64,
    },
    /// A state or delta whose clock is further ahead of the receiver's than the filter's skew
    /// bound (expiring kinds): merged, it would expire live elements early on every replica.
    #[error("clock ahead of ours beyond the skew bound: {0}")]
    ClockAhead(String),
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
            WireError::Checksum { .. } => "checksum",
            WireError::Unsigned => "unsigned",
            WireError::BadSignature => "bad_signature",
            WireError::Filter(_) => "filter",
            WireError::Kind { .. } => "kind",
            WireError::Params { .. } => "params",
            WireError::Generation { .. } => "generation",
            WireError::Incompatible(_) => "incompatible",
            WireError::Chunk(_) => "chunk",
            WireError::TooManyPeers(_) => "too_many_peers",
            WireError::OwnTagAhead(_) => "own_tag_ahead",
            WireError::TagUnreserved { .. } => "tag_unreserved",
            WireError::ClockAhead(_) => "clock_ahead",
            WireError::Subject(_) => "subject",
        }
    }
}

impl From<CodecError> for WireError {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Truncated(m) => WireError::Truncated(m),
            CodecError::Malformed(m) => WireError::Malformed(m),
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
            generation: 0,
        }
    }

    /// The envelope of an incarnation of the filter ([`Envelope::generation`]).
    pub fn with_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// The unsigned frame (see the module docs); [`WireCodec::encode`] signs.
    pub fn encode(&self) -> Vec<u8> {
        self.frame(None)
    }

    fn frame(&self, keys: Option<&AuthKeys>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + MAC_LEN + self.body_len());
        out.extend_from_slice(MAGIC);
        out.push(WIRE_VERSION);
        out.push(if keys.is_some() { FLAG_SIGNED } else { 0 });
        let mut ser = serde_cbor::Serializer::new(&mut out).packed_format();
        self.serialize(&mut ser)
            .expect("CBOR into a Vec cannot fail");
        if let Some(keys) = keys {
            let mac = keys.sign(&out);
            out.extend_from_slice(&mac);
        }
        let checksum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    fn body_len(&self) -> usize {
        match &self.body {
            Body::Delta(b) | Body::ConfirmedDelta(b) => b.len(),
            Body::Deltas(d) => d.iter().map(|b| b.len()).sum(),
            Body::StateChunk(c) => c.data.len(),
            _ => 0,
        }
    }

    /// Decodes a frame and checks that it is for the expected filter; never panics. A signed
    /// frame is accepted without checking its signature (its checksum is checked): use a
    /// [`WireCodec`] with keys to require and verify signatures.
    pub fn decode(bytes: &[u8], expect: &Expect) -> Result<Envelope, WireError> {
        Self::unframe(bytes, expect, None)
    }

    fn unframe(
        bytes: &[u8],
        expect: &Expect,
        keys: Option<&AuthKeys>,
    ) -> Result<Envelope, WireError> {
        if bytes.len() > expect.max_bytes {
            return Err(WireError::Oversized {
                len: bytes.len(),
                limit: expect.max_bytes,
            });
        }
        let magic_len = bytes.len().min(MAGIC.len());
        if bytes[..magic_len] != MAGIC[..magic_len] {
            return Err(WireError::Malformed("no crpf magic".into()));
        }
        // The version before anything else: another version may place its checksum elsewhere.
        if let Some(&version) = bytes.get(MAGIC.len())
            && version != WIRE_VERSION
        {
            return Err(WireError::Version(version));
        }
        if bytes.len() < MIN_FRAME_LEN {
            return Err(WireError::Truncated(format!("{} bytes", bytes.len())));
        }
        let (content, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
        let got = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        let computed = xxhash_rust::xxh3::xxh3_64(content);
        if got != computed {
            return Err(WireError::Checksum { got, computed });
        }
        let flags = content[FLAGS_AT];
        if flags & !FLAG_SIGNED != 0 {
            return Err(WireError::Malformed(format!("unknown flags {flags:#04x}")));
        }
        let cbor = if flags & FLAG_SIGNED != 0 {
            let Some(split) = content
                .len()
                .checked_sub(MAC_LEN)
                .filter(|&s| s >= HEADER_LEN)
            else {
                return Err(WireError::Truncated("signed frame without its MAC".into()));
            };
            let (signed, mac) = content.split_at(split);
            // Without keys a signed frame is taken on its checksum, as an unsigned one is:
            // a cluster can turn signatures on one node at a time.
            if let Some(keys) = keys
                && !keys.verify(signed, mac)
            {
                return Err(WireError::BadSignature);
            }
            &signed[HEADER_LEN..]
        } else {
            if keys.is_some() {
                return Err(WireError::Unsigned);
            }
            &content[HEADER_LEN..]
        };
        let env: Envelope = from_cbor(cbor)?;
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
        if env.generation != expect.generation {
            return Err(WireError::Generation {
                got: env.generation,
                expected: expect.generation,
            });
        }
        if let Body::StateChunk(c) = &env.body {
            c.check()?;
        }
        Ok(env)
    }
}

/// What a replica holds to write and read its frames: what it accepts, and its cluster keys if
/// envelopes are authenticated.
///
/// With keys, every frame it encodes is signed with the first key, and it decodes only frames
/// signed with one of its keys (others are [`WireError::Unsigned`] or
/// [`WireError::BadSignature`]). Without, it encodes unsigned frames and decodes signed and
/// unsigned ones alike. The checksum applies either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireCodec {
    expect: Expect,
    keys: Option<AuthKeys>,
}

impl WireCodec {
    /// A codec for `expect`, authenticated if `keys` is given.
    pub fn new(expect: Expect, keys: Option<AuthKeys>) -> Self {
        WireCodec { expect, keys }
    }

    /// What it accepts.
    pub fn expect(&self) -> &Expect {
        &self.expect
    }

    /// Whether frames are signed and signatures required.
    pub fn authenticated(&self) -> bool {
        self.keys.is_some()
    }

    /// The frame of `env`, signed if the codec has keys.
    pub fn encode(&self, env: &Envelope) -> Vec<u8> {
        env.frame(self.keys.as_ref())
    }

    /// Whether it takes `bytes` (a frame it decoded) without verifying its signature: a
    /// signed frame and no keys to verify it with (a node without the cluster's key beside
    /// nodes that have it; see [`WireCodec`]).
    pub fn takes_unverified(&self, bytes: &[u8]) -> bool {
        self.keys.is_none() && bytes.get(FLAGS_AT).is_some_and(|f| f & FLAG_SIGNED != 0)
    }

    /// Decodes and checks a frame (see [`Envelope::decode`]), verifying its signature if the
    /// codec has keys; never panics.
    pub fn decode(&self, bytes: &[u8]) -> Result<Envelope, WireError> {
        Envelope::unframe(bytes, &self.expect, self.keys.as_ref())
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
    let checksum = xxhash_rust::xxh3::xxh3_64(state);
    (0..chunk_count(state.len(), chunk_len))
        .map(|i| state_chunk(state, transfer, chunk_len, checksum, i))
        .collect()
}

/// Number of chunks [`chunk_state`] splits a state of `len` bytes into (one for an empty state).
pub fn chunk_count(len: usize, chunk_len: usize) -> usize {
    len.div_ceil(chunk_len.max(1)).max(1)
}

/// Chunk `index` of [`chunk_state`], made alone (so that a sender can make them one at a time
/// from one encoded state); `checksum` is the state's xxh3-64.
pub fn state_chunk(
    state: &[u8],
    transfer: u64,
    chunk_len: usize,
    checksum: u64,
    index: usize,
) -> StateChunk {
    let chunk_len = chunk_len.max(1);
    let start = (index * chunk_len).min(state.len());
    let end = (start + chunk_len).min(state.len());
    StateChunk {
        transfer,
        index: index as u32,
        count: chunk_count(state.len(), chunk_len) as u32,
        total_len: state.len() as u64,
        checksum,
        data: state[start..end].to_vec(),
        live: false,
    }
}

pub use crate::core::codec::to_cbor;

/// Decodes bytes produced by [`to_cbor`] as a wire message part; truncated input gives
/// [`WireError::Truncated`].
pub fn from_cbor<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    crate::core::codec::from_cbor(bytes).map_err(WireError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect() -> Expect {
        Expect {
            filter: "f".into(),
            kind: FilterKind::OrCuckoo,
            params_digest: 9,
            generation: 0,
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
    fn chunks_made_one_at_a_time_match_the_split() {
        for len in [0usize, 1, 299, 300, 301, 1000] {
            let state: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let all = chunk_state(&state, 9, 300);
            assert_eq!(all.len(), chunk_count(len, 300));
            let sum = xxhash_rust::xxh3::xxh3_64(&state);
            for (i, c) in all.iter().enumerate() {
                assert_eq!(&state_chunk(&state, 9, 300, sum, i), c, "{len} {i}");
            }
            let joined: Vec<u8> = all.iter().flat_map(|c| c.data.clone()).collect();
            assert_eq!(joined, state);
        }
    }

    #[test]
    fn round_trips_every_body() {
        let state: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut bodies = vec![
            Body::Delta(vec![0xff; 10]),
            Body::Digest {
                digest: 77,
                ready: true,
                sent: None,
                spacing: None,
            },
            Body::Digest {
                digest: 78,
                ready: true,
                sent: Some(9),
                spacing: Some(4),
            },
            Body::StateRequest { target: None },
            Body::StateRequest {
                target: Some(Uuid::from_u128(8)),
            },
            Body::StateProgress {
                target: Uuid::from_u128(9),
                transfer: u64::MAX,
                next: 3,
            },
            Body::StateChunk(StateChunk {
                live: true,
                checksum: 0,
                ..state_chunk(&state, 5, 300, 0, 1)
            }),
            Body::Deltas(vec![
                vec![1, 2].into(),
                Vec::new().into(),
                vec![0xff; 300].into(),
            ]),
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

    /// A body is encoded as a map of one entry whose key is, in the packed format, the
    /// variant's name for the newtype variants but its position for the struct variants
    /// (serde_cbor's rule): a struct variant inserted before others would renumber them, and
    /// earlier versions would misread or refuse them. New variants go last.
    /// A run of deltas is bounded while it is decoded, so that a frame of empty byte strings
    /// cannot make its receiver allocate many times its size.
    #[test]
    fn a_run_of_more_than_the_bound_of_deltas_is_refused() {
        let run = |n: usize| env(Body::Deltas(vec![Vec::new().into(); n])).encode();
        let ok = Envelope::decode(&run(MAX_DELTAS_PER_MESSAGE), &expect()).unwrap();
        assert!(matches!(ok.body, Body::Deltas(d) if d.len() == MAX_DELTAS_PER_MESSAGE));
        let refused = Envelope::decode(&run(MAX_DELTAS_PER_MESSAGE + 1), &expect());
        assert!(
            format!("{:?}", refused.unwrap_err()).contains("more than"),
            "refused with the reason"
        );
    }

    #[test]
    fn body_variants_keep_their_keys() {
        let target = Uuid::from_u128(1);
        let by_name = [
            (Body::Delta(Vec::new()), "Delta"),
            (
                Body::StateChunk(chunk_state(b"x", 1, 10).remove(0)),
                "StateChunk",
            ),
            (Body::ConfirmedDelta(Vec::new()), "ConfirmedDelta"),
            (Body::Deltas(Vec::new()), "Deltas"),
        ];
        for (body, name) in by_name {
            let bytes = to_cbor(&body);
            assert_eq!(bytes[0], 0xa1, "{body:?}: a map of one entry");
            assert_eq!(bytes[1], 0x60 | name.len() as u8, "{body:?}: a text key");
            assert_eq!(&bytes[2..2 + name.len()], name.as_bytes(), "{body:?}");
        }
        let by_position = [
            (
                Body::Digest {
                    digest: 1,
                    ready: true,
                    sent: None,
                    spacing: None,
                },
                1,
            ),
            (Body::StateRequest { target: None }, 2),
            (Body::Ack { target, seq: 1 }, 5),
            (
                Body::StateProgress {
                    target,
                    transfer: 1,
                    next: 4,
                },
                6,
            ),
        ];
        for (body, position) in by_position {
            let bytes = to_cbor(&body);
            assert_eq!(bytes[0], 0xa1, "{body:?}: a map of one entry");
            assert_eq!(bytes[1], position, "{body:?}: keyed by its position");
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
        assert_eq!(reason(&good[..MIN_FRAME_LEN - 1], &ex), "truncated");
        assert_eq!(reason(&good[..good.len() - 1], &ex), "checksum");
        let mut v1 = good.clone();
        v1[4] = 1;
        assert_eq!(reason(&v1, &ex), "version");
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
        // Another incarnation of the filter, both ways round.
        assert_eq!(
            reason(
                &good,
                &Expect {
                    generation: 7,
                    ..ex.clone()
                }
            ),
            "generation"
        );
        assert_eq!(
            reason(
                &env(Body::StateRequest { target: None })
                    .with_generation(7)
                    .encode(),
                &ex
            ),
            "generation"
        );
        let bad_chunk = env(Body::StateChunk(StateChunk {
            transfer: 1,
            index: 3,
            count: 2,
            total_len: 1,
            checksum: 0,
            data: vec![],
            live: false,
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
            // With a valid checksum, so that the damage reaches the CBOR parser.
            let _ = Envelope::decode(&reseal(&b[..b.len() - CHECKSUM_LEN]), &expect());
            let _ = Envelope::decode(&reseal(&b[..n.saturating_sub(CHECKSUM_LEN)]), &expect());
        }
    }

    /// `content` with its checksum appended: what a sender that knows the format (but maybe
    /// not the key) can produce.
    fn reseal(content: &[u8]) -> Vec<u8> {
        let mut b = content.to_vec();
        b.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(content).to_le_bytes());
        b
    }

    fn keys(seeds: &[u8]) -> AuthKeys {
        AuthKeys::new(seeds.iter().map(|&s| vec![s; MIN_KEY_LEN])).unwrap()
    }

    fn bodies() -> Vec<Body> {
        let state: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut bodies = vec![
            Body::Delta(vec![0xff; 10]),
            Body::Delta(Vec::new()),
            Body::Digest {
                digest: 77,
                ready: false,
                sent: None,
                spacing: None,
            },
            Body::StateRequest { target: None },
        ];
        bodies.extend(
            chunk_state(&state, 4, 300)
                .into_iter()
                .map(Body::StateChunk),
        );
        bodies
    }

    #[test]
    fn round_trips_with_and_without_key() {
        let plain = WireCodec::new(expect(), None);
        let signed = WireCodec::new(expect(), Some(keys(&[1])));
        assert!(!plain.authenticated() && signed.authenticated());
        for b in bodies() {
            let e = env(b);
            let (p, s) = (plain.encode(&e), signed.encode(&e));
            assert_eq!(p, e.encode());
            assert_eq!(s.len(), p.len() + MAC_LEN);
            assert_eq!(s[FLAGS_AT], FLAG_SIGNED);
            assert_eq!(plain.decode(&p).unwrap(), e);
            assert_eq!(signed.decode(&s).unwrap(), e);
            // Without keys, signed frames of others decode too (on their checksum).
            assert_eq!(plain.decode(&s).unwrap(), e);
            assert_eq!(Envelope::decode(&s, &expect()).unwrap(), e);
        }
    }

    #[test]
    fn any_flipped_bit_is_rejected() {
        let e = env(Body::Delta(vec![0x5a; 24]));
        for codec in [
            WireCodec::new(expect(), None),
            WireCodec::new(expect(), Some(keys(&[1]))),
        ] {
            let good = codec.encode(&e);
            for i in 0..good.len() {
                for bit in 0..8 {
                    let mut b = good.clone();
                    b[i] ^= 1 << bit;
                    let want = match i {
                        0..4 => "malformed",
                        4 => "version",
                        _ => "checksum",
                    };
                    let got = codec.decode(&b).unwrap_err().reason();
                    assert_eq!(got, want, "byte {i} bit {bit}");
                }
            }
        }
    }

    #[test]
    fn resealed_tampering_fails_the_signature() {
        // Someone who recomputes the checksum but has no key: every change of the envelope or
        // of the MAC is a bad signature, dropping the signed flag makes it unsigned.
        let codec = WireCodec::new(expect(), Some(keys(&[1])));
        let good = codec.encode(&env(Body::Delta(vec![0x5a; 24])));
        let content = &good[..good.len() - CHECKSUM_LEN];
        for i in HEADER_LEN..content.len() {
            let mut c = content.to_vec();
            c[i] ^= 0x10;
            assert_eq!(
                codec.decode(&reseal(&c)).unwrap_err().reason(),
                "bad_signature"
            );
        }
        let mut c = content.to_vec();
        c[FLAGS_AT] = 0;
        assert_eq!(codec.decode(&reseal(&c)).unwrap_err().reason(), "unsigned");
        c[FLAGS_AT] = 0x81;
        assert_eq!(codec.decode(&reseal(&c)).unwrap_err().reason(), "malformed");
        // A signed flag on a frame too short to hold a MAC.
        let mut c = content[..HEADER_LEN + 4].to_vec();
        c[FLAGS_AT] = FLAG_SIGNED;
        assert_eq!(codec.decode(&reseal(&c)).unwrap_err().reason(), "truncated");
    }

    #[test]
    fn truncated_frames_are_rejected() {
        for codec in [
            WireCodec::new(expect(), None),
            WireCodec::new(expect(), Some(keys(&[1]))),
        ] {
            let good = codec.encode(&env(Body::Delta(vec![3; 50])));
            for n in 0..good.len() {
                let reason = codec.decode(&good[..n]).unwrap_err().reason();
                let want = if n < MIN_FRAME_LEN {
                    "truncated"
                } else {
                    "checksum"
                };
                assert_eq!(reason, want, "{n} of {} bytes", good.len());
            }
        }
    }

    #[test]
    fn wrong_key_and_unsigned_frames_are_refused() {
        let e = env(Body::Digest {
            digest: 1,
            ready: true,
            sent: None,
            spacing: None,
        });
        let ours = WireCodec::new(expect(), Some(keys(&[1])));
        let theirs = WireCodec::new(expect(), Some(keys(&[2])));
        let plain = WireCodec::new(expect(), None);
        assert_eq!(
            ours.decode(&theirs.encode(&e)).unwrap_err(),
            WireError::BadSignature
        );
        assert_eq!(
            ours.decode(&plain.encode(&e)).unwrap_err(),
            WireError::Unsigned
        );
        // The signature is checked before the envelope is even parsed.
        let elsewhere = WireCodec::new(
            Expect {
                filter: "g".into(),
                ..expect()
            },
            Some(keys(&[1])),
        );
        assert_eq!(
            elsewhere.decode(&theirs.encode(&e)).unwrap_err().reason(),
            "bad_signature"
        );
        assert_eq!(
            elsewhere.decode(&ours.encode(&e)).unwrap_err().reason(),
            "filter"
        );
    }

    #[test]
    fn keys_rotate_without_a_flag_day() {
        let e = env(Body::Delta(vec![9; 9]));
        let before = WireCodec::new(expect(), Some(keys(&[1])));
        // Step 1: the new key (2) is accepted everywhere, still signing with the old one.
        let accepting = WireCodec::new(expect(), Some(keys(&[1, 2])));
        // Step 2: signing with the new key, still accepting the old one.
        let switched = WireCodec::new(expect(), Some(keys(&[2, 1])));
        // Step 3: the old key is gone.
        let after = WireCodec::new(expect(), Some(keys(&[2])));
        for (from, to) in [
            (&before, &accepting),
            (&accepting, &before),
            (&accepting, &switched),
            (&switched, &accepting),
            (&switched, &after),
            (&after, &switched),
        ] {
            assert_eq!(to.decode(&from.encode(&e)).unwrap(), e);
        }
        // Steps two apart do not talk: the old key must have been retired everywhere first.
        assert_eq!(
            before.decode(&switched.encode(&e)).unwrap_err().reason(),
            "bad_signature"
        );
        assert_eq!(
            after.decode(&accepting.encode(&e)).unwrap_err().reason(),
            "bad_signature"
        );
    }
}

#[cfg(test)]
mod golden {
    use super::*;

    fn golden_env() -> Envelope {
        Envelope::new(
            "users",
            FilterKind::ScOrCuckoo,
            0x0123_4567_89ab_cdef,
            Uuid::from_u128(0x00112233_4455_6677_8899_aabbccddeeff),
            7,
            42,
            Body::Digest {
                digest: 0xfeed,
                ready: true,
                sent: None,
                spacing: None,
            },
        )
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn expect() -> Expect {
        Expect {
            filter: "users".into(),
            kind: FilterKind::ScOrCuckoo,
            params_digest: 0x0123_4567_89ab_cdef,
            generation: 0,
            max_bytes: 1 << 10,
        }
    }

    /// Pins wire format version 2: a change here breaks replicas of older releases.
    #[test]
    fn envelope_bytes_are_stable() {
        let frame = golden_env().encode();
        assert_eq!(hex(&frame), GOLDEN);
        assert_eq!(Envelope::decode(&frame, &expect()).unwrap(), golden_env());
    }

    /// The signed layout, with the key `[0x42; 32]`.
    #[test]
    fn signed_envelope_bytes_are_stable() {
        let keys = AuthKeys::new([[0x42u8; 32]]).unwrap();
        let codec = WireCodec::new(expect(), Some(keys));
        let frame = codec.encode(&golden_env());
        assert_eq!(hex(&frame), GOLDEN_SIGNED);
        assert_eq!(codec.decode(&frame).unwrap(), golden_env());
    }

    /// Frames of version 1 (no flags, no checksum) are refused by their version.
    #[test]
    fn version_1_frames_are_refused() {
        let v1: Vec<u8> = (0..GOLDEN_V1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&GOLDEN_V1[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(
            Envelope::decode(&v1, &expect()).unwrap_err(),
            WireError::Version(1)
        );
    }

    /// `crpf`, version 2, flags 0, then a 7-field packed map: name, kind (variant 5),
    /// parameter digest, 16 uuid bytes, replica 7, seq 42, body `{1: {0: 0xfeed, 1: true}}`
    /// (variant `Digest`), then the xxh3-64 of all that, little-endian.
    const GOLDEN: &str = "637270660200a7006575736572730105021b0123456789abcdef035000112233\
                          445566778899aabbccddeeff040705182a06a101a20019feed01f5\
                          c826cd97c2d36168";

    /// `crpf`, version 2, flags 1, the same envelope, its HMAC-SHA256 (cross-checked with
    /// Python's `hmac`), the checksum.
    const GOLDEN_SIGNED: &str = "637270660201a7006575736572730105021b0123456789abcdef0350001122\
                                 33445566778899aabbccddeeff040705182a06a101a20019feed01f5\
                                 b520089431db1272eb484aa45cce41ccf303ef78a8bec3b81f8eb1eaa4ac85d1\
                                 3eb2d18cc83d2c94";

    /// The same envelope in wire version 1: `crpf`, version 1, the packed map.
    const GOLDEN_V1: &str = "6372706601a7006575736572730105021b0123456789abcdef035000112233445566\
                             778899aabbccddeeff040705182a06a101a20019feed01f5";
}

#[cfg(test)]
mod digest_claims {
    use super::*;

    fn digest(sent: Option<u64>) -> Envelope {
        Envelope::new(
            "f",
            FilterKind::GBloom,
            9,
            Uuid::from_u128(1),
            2,
            0,
            Body::Digest {
                digest: 1,
                ready: true,
                sent,
                spacing: None,
            },
        )
    }

    /// A batched digest's claim travels; a digest without one encodes as before (the golden
    /// frames above pin that).
    #[test]
    fn a_batched_digest_carries_its_claim() {
        let expect = Expect {
            filter: "f".into(),
            kind: FilterKind::GBloom,
            params_digest: 9,
            generation: 0,
            max_bytes: 1 << 10,
        };
        let with = digest(Some(41));
        assert_eq!(Envelope::decode(&with.encode(), &expect).unwrap(), with);
        assert!(with.encode().len() > digest(None).encode().len());
    }

    /// A body of an earlier version (a `Digest` of two fields) decodes one with a claim:
    /// fields go by index, and an unknown one is skipped.
    #[test]
    fn an_earlier_digest_body_reads_one_with_a_claim() {
        #[derive(Debug, PartialEq, Deserialize)]
        enum EarlierBody {
            Delta(#[serde(with = "serde_bytes")] Vec<u8>),
            Digest { digest: u64, ready: bool },
        }
        let body = Body::Digest {
            digest: 5,
            ready: true,
            sent: Some(41),
            spacing: None,
        };
        let bytes = to_cbor(&body);
        let earlier: EarlierBody = from_cbor(&bytes).unwrap();
        assert_eq!(
            earlier,
            EarlierBody::Digest {
                digest: 5,
                ready: true
            }
        );
    }
}
