//! `BF.SCANDUMP`/`CF.SCANDUMP` and `BF.LOADCHUNK`/`CF.LOADCHUNK`: a filter's state dumped
//! in chunks and restored, in crpf's own encoding (not RedisBloom's).
//!
//! `SCANDUMP key 0` encodes the state once and keeps it for the next calls, so that the
//! chunks of one dump are of one state even while the filter changes; it answers a header
//! (magic, version, the filter's spec, the state's length and xxh3-64) and an iterator.
//! Each `SCANDUMP key <iterator>` answers the next chunk and iterator, `[0, ""]` at the end.
//! `LOADCHUNK key <iterator> <data>`, given the pairs in order, checks the header, the
//! order of the chunks, the length and the checksum, then loads the state into the key's
//! filter, creating it with the dumped spec if it does not exist. A key of another kind or
//! parameters is refused and left as it is.
//!
//! How a state is loaded depends on its kind:
//! - The kinds without version tags or per-replica counts (the Bloom kinds, `g_cuckoo` and
//!   its scalable forms) merge it: a restore is a CRDT merge, so loading into a filter that
//!   has moved on loses nothing of either.
//! - The observed-remove kinds (`or_cuckoo`, `sc_or_cuckoo`, `writer_sc_or_cuckoo`, what
//!   `CF.RESERVE` and `CF.ADD` make) and `counting_cuckoo` re-add every live occurrence of the
//!   dump (the same fingerprint in the same buckets of the same sub-filter and writer's
//!   series: the same membership and `CF.COUNT`) as adds of the loading replica, under fresh
//!   tags from its own reserved range (or as its own counts), through its ordinary update
//!   path: logged, published as deltas, acknowledged, and removable with `CF.DEL`
//!   ([`crate::replica::ReplicaHandle::import`]). The dumped tags are never merged as they
//!   are: they belong to the replicas (or the incarnation) that issued them, whose tags this
//!   cluster's replicas would refuse as unreserved, or issue again for other items. Loading
//!   into a key that holds items adds to them, as `CF.ADD` would: a dump loaded twice counts
//!   its items twice. Where a sub-filter would be left with more entries than its slots (or
//!   than the dump's held), the load is refused whole (`no room`) and changes nothing: a
//!   dump always loads into a new key of its spec.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::reply::Reply;
use crate::replica::{AnyFilter, ReplicaHandle};
use crate::{FilterKind, FilterSpec};

/// What starts a header chunk.
const MAGIC: &[u8; 8] = b"CRPFDUMP";
const VERSION: u8 = 1;
/// Bytes of state per chunk.
pub const CHUNK_BYTES: usize = 4 << 20;
/// Dumps (and loads) in progress at once; the oldest gives way.
const MAX_IN_PROGRESS: usize = 8;
/// A dump or load not continued for this long is dropped.
const IDLE: Duration = Duration::from_secs(300);
/// Largest state a load accepts (a dump of a larger one can still be taken), and the most
/// the loads in progress together may announce.
const MAX_LOAD_BYTES: u64 = 1 << 30;
/// Iterator bits of the chunk number; the dump's id above them.
const CHUNK_BITS: u32 = 20;

/// The header's fields after the magic and version.
#[derive(Serialize, Deserialize)]
struct Header {
    spec: FilterSpec,
    len: u64,
    xxh3: u64,
}

struct Dump {
    key: String,
    state: Bytes,
    used: Instant,
}

struct Load {
    spec: FilterSpec,
    len: u64,
    xxh3: u64,
    /// The iterator the next chunk comes with.
    next: i64,
    buf: Vec<u8>,
    used: Instant,
}

/// The dumps and loads in progress on a front end.
#[derive(Default)]
pub struct Dumps {
    inner: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u32,
    dumps: HashMap<u32, Dump>,
    loads: HashMap<String, Load>,
}

impl State {
    /// Drops what was not continued for [`IDLE`].
    fn expire(&mut self) {
        self.dumps.retain(|_, d| d.used.elapsed() < IDLE);
        self.loads.retain(|_, l| l.used.elapsed() < IDLE);
    }

    /// Room for one more dump or load: the least recently used gives way.
    fn make_room(&mut self) {
        self.expire();
        while self.dumps.len() >= MAX_IN_PROGRESS {
            let oldest = self
                .dumps
                .iter()
                .min_by_key(|(_, d)| d.used)
                .map(|(id, _)| *id);
            oldest.map(|id| self.dumps.remove(&id));
        }
        while self.loads.len() >= MAX_IN_PROGRESS {
            let oldest = self
                .loads
                .iter()
                .min_by_key(|(_, l)| l.used)
                .map(|(k, _)| k.clone());
            oldest.map(|k| self.loads.remove(&k));
        }
    }
}

fn iterator(id: u32, chunk: i64) -> i64 {
    (i64::from(id) << CHUNK_BITS) | chunk
}

/// Whether `data` is a dump's header chunk.
pub fn is_header(data: &[u8]) -> bool {
    data.starts_with(MAGIC)
}

impl Dumps {
    /// Whether a load into `key` is in progress.
    pub fn loading(&self, key: &str) -> bool {
        let mut st = self.inner.lock().expect("dumps lock poisoned");
        st.expire();
        st.loads.contains_key(key)
    }

    /// `SCANDUMP key iterator` on `handle`'s filter, whose spec is `spec`.
    pub fn scan(&self, key: &str, handle: &ReplicaHandle, spec: FilterSpec, iter: i64) -> Reply {
        let pair = |iter: i64, data: Bytes| Reply::Array(vec![Reply::Int(iter), Reply::Bulk(data)]);
        if iter == 0 {
            // Encoded before the lock: other dumps and loads do not wait for it.
            let state = Bytes::from(handle.read(AnyFilter::encode_state));
            let mut st = self.inner.lock().expect("dumps lock poisoned");
            st.make_room();
            let header = Header {
                spec,
                len: state.len() as u64,
                xxh3: xxh3_64(&state),
            };
            let mut head = MAGIC.to_vec();
            head.push(VERSION);
            head.extend(serde_json::to_vec(&header).expect("a spec serializes"));
            // Ids from 1 below 2^31: an iterator stays a positive i64.
            st.next_id = st.next_id % ((1 << 31) - 1) + 1;
            let id = st.next_id;
            st.dumps.insert(
                id,
                Dump {
                    key: key.to_string(),
                    state,
                    used: Instant::now(),
                },
            );
            return pair(iterator(id, 1), Bytes::from(head));
        }
        let mut st = self.inner.lock().expect("dumps lock poisoned");
        st.expire();
        let id = u32::try_from(iter >> CHUNK_BITS).unwrap_or(0);
        let chunk = iter & ((1 << CHUNK_BITS) - 1);
        let Some(dump) = st
            .dumps
            .get_mut(&id)
            .filter(|d| d.key == key && iter > 0 && chunk > 0)
        else {
            return Reply::err("no such dump in progress: start again at iterator 0");
        };
        dump.used = Instant::now();
        // Chunk n (from 1) answers the state's part n - 1.
        let from = (chunk as usize - 1).saturating_mul(CHUNK_BYTES);
        if from >= dump.state.len() {
            st.dumps.remove(&id);
            return pair(0, Bytes::new());
        }
        let to = (from + CHUNK_BYTES).min(dump.state.len());
        pair(iterator(id, chunk + 1), dump.state.slice(from..to))
    }

    /// `LOADCHUNK key iterator data`: `Ok(None)` while chunks are missing, `Ok(Some)` the
    /// spec and the whole state once the last one came and checked.
    pub fn load(
        &self,
        key: &str,
        iter: i64,
        data: &[u8],
    ) -> Result<Option<(FilterSpec, AnyFilter)>, Reply> {
        let mut st = self.inner.lock().expect("dumps lock poisoned");
        st.expire();
        if let Some(rest) = data.strip_prefix(MAGIC.as_slice()) {
            let header = match rest.split_first() {
                Some((&VERSION, json)) => serde_json::from_slice::<Header>(json)
                    .map_err(|e| Reply::err(format!("bad dump header: {e}")))?,
                _ => return Err(Reply::err("bad dump header: unknown version")),
            };
            st.loads.remove(key);
            st.make_room();
            let announced: u64 = st.loads.values().map(|l| l.len).sum();
            if header.len.saturating_add(announced) > MAX_LOAD_BYTES {
                return Err(Reply::err(format!(
                    "a dump of {} bytes exceeds what loads may hold ({MAX_LOAD_BYTES} bytes, \
                     {announced} of them announced by loads in progress)",
                    header.len
                )));
            }
            st.loads.insert(
                key.to_string(),
                Load {
                    spec: header.spec,
                    len: header.len,
                    xxh3: header.xxh3,
                    next: iter.saturating_add(1),
                    buf: Vec::new(),
                    used: Instant::now(),
                },
            );
            return Ok(None);
        }
        let Some(load) = st.loads.get_mut(key) else {
            return Err(Reply::err(
                "no load in progress for this key: send the dump's header chunk first",
            ));
        };
        if iter != load.next {
            let expected = load.next;
            st.loads.remove(key);
            return Err(Reply::err(format!(
                "chunk out of order: iterator {iter}, expected {expected}; the load is abandoned"
            )));
        }
        if load.buf.len() as u64 + data.len() as u64 > load.len {
            st.loads.remove(key);
            return Err(Reply::err(
                "the dump's chunks are longer than its header says",
            ));
        }
        load.buf.extend_from_slice(data);
        load.next = load.next.saturating_add(1);
        load.used = Instant::now();
        if (load.buf.len() as u64) < load.len {
            return Ok(None);
        }
        let load = st.loads.remove(key).expect("present");
        drop(st);
        if xxh3_64(&load.buf) != load.xxh3 {
            return Err(Reply::err(
                "the dump's checksum does not match: nothing loaded",
            ));
        }
        let state = AnyFilter::decode_state(load.spec.kind, &load.buf)
            .map_err(|e| Reply::err(format!("the dump does not decode: {e}")))?;
        Ok(Some((load.spec, state)))
    }
}

/// The refusal of a dump into key `name` of another kind or parameters (`theirs`, if known;
/// else its kind).
pub fn mismatch(
    name: &str,
    dumped: &FilterSpec,
    theirs: Option<&FilterSpec>,
    kind: FilterKind,
) -> Reply {
    let key = theirs.map_or_else(|| kind.to_string(), describe);
    Reply::err(format!(
        "the dump ({}) does not match `{name}` ({key}): nothing loaded; load it into a new key",
        describe(dumped)
    ))
}

/// A spec as a user reads it: kind, capacity, error rate.
fn describe(spec: &FilterSpec) -> String {
    format!(
        "{}, capacity {}, error rate {}",
        spec.kind, spec.capacity, spec.fpr
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind's dump loads (what is done with it is the key's replica's business:
    /// `ReplicaHandle::import` for the kinds with tags or counts).
    #[test]
    fn dumps_of_every_kind_load_tagged_and_counted_ones_too() {
        for kind in [
            FilterKind::OrCuckoo,
            FilterKind::WriterScOrCuckoo,
            FilterKind::CountingCuckoo,
            FilterKind::GBloom,
        ] {
            let spec = FilterSpec::new(kind, 1000, 0.01);
            let mut f = AnyFilter::new(&spec, 3).unwrap();
            f.add(b"x").unwrap();
            f.add(b"x").unwrap();
            let state = f.encode_state();
            let mut head = MAGIC.to_vec();
            head.push(VERSION);
            let header = Header {
                spec: spec.clone(),
                len: state.len() as u64,
                xxh3: xxh3_64(&state),
            };
            head.extend(serde_json::to_vec(&header).unwrap());
            let dumps = Dumps::default();
            assert!(dumps.load("k", 1, &head).unwrap().is_none(), "{kind}");
            let (loaded_spec, loaded) = dumps.load("k", 2, &state).unwrap().unwrap();
            assert_eq!(loaded_spec, spec);
            let occurrences = loaded.live_occurrences();
            let counted: u64 = occurrences.iter().map(|o| o.count).sum();
            assert_eq!(counted, if kind.removable() { 2 } else { 0 }, "{kind}");
        }
    }

    #[test]
    fn loads_check_order_length_and_checksum() {
        let dumps = Dumps::default();
        let mut f = AnyFilter::new(&FilterSpec::new(FilterKind::GBloom, 1000, 0.01), 1).unwrap();
        f.add(b"x").unwrap();
        let state = f.encode_state();
        let header = |len: u64, xxh3: u64| {
            let mut h = MAGIC.to_vec();
            h.push(VERSION);
            h.extend(
                serde_json::to_vec(&Header {
                    spec: FilterSpec::new(FilterKind::GBloom, 1000, 0.01),
                    len,
                    xxh3,
                })
                .unwrap(),
            );
            h
        };
        let good = header(state.len() as u64, xxh3_64(&state));
        assert!(dumps.load("k", 5, &good).unwrap().is_none());
        let (half, rest) = state.split_at(state.len() / 2);
        assert!(dumps.load("k", 6, half).unwrap().is_none());
        let (spec, loaded) = dumps.load("k", 7, rest).unwrap().unwrap();
        assert_eq!(spec.kind, FilterKind::GBloom);
        assert!(loaded.contains(b"x"));
        // Out of order: abandoned.
        dumps.load("k", 5, &good).unwrap();
        assert!(dumps.load("k", 7, half).is_err());
        assert!(
            dumps.load("k", 6, half).is_err(),
            "no load in progress any more"
        );
        // A wrong checksum loads nothing.
        dumps.load("k", 5, &header(state.len() as u64, 1)).unwrap();
        assert!(dumps.load("k", 6, &state).is_err());
        // A chunk without a header.
        assert!(dumps.load("other", 2, &state).is_err());
        // The largest iterator a client could send: no overflow.
        assert!(dumps.load("k", i64::MAX, &good).unwrap().is_none());
        assert!(dumps.load("k", i64::MAX, &state).is_ok());
    }
}
