//! Reassembly of full states sent in chunks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use uuid::Uuid;
use xxhash_rust::xxh3::xxh3_64;

use crate::wire::{StateChunk, WireError};

/// A transfer in progress.
struct Partial {
    transfer: u64,
    count: u32,
    total_len: u64,
    checksum: u64,
    /// Chunks by index, allocated as they come (a header cannot make us allocate).
    chunks: BTreeMap<u32, Vec<u8>>,
    bytes: u64,
    started: Instant,
}

/// Transfers reassembled at once.
pub(crate) const MAX_TRANSFERS: usize = 16;
/// Senders whose recently completed transfers are remembered (to ignore late duplicates).
pub(crate) const MAX_REMEMBERED_SENDERS: usize = 1024;
/// Completed transfer ids remembered per sender.
const REMEMBERED_PER_SENDER: usize = 8;

/// Outcome of adding a chunk.
#[derive(Debug)]
pub(crate) enum Progress {
    /// More chunks to come.
    Pending,
    /// The whole state, its checksum verified.
    Complete(Vec<u8>),
}

/// Transfers in progress, at most one per sender (a chunk of another transfer replaces the
/// unfinished one: one sender's messages arrive in order, so it started a new push), each
/// bounded by `max_state_bytes`, at most [`MAX_TRANSFERS`] at once (the oldest is abandoned
/// for a new one).
///
/// Transfer ids are only compared for equality, never ordered: a sender's ids start afresh
/// at every restart, and a forged id (even `u64::MAX`) then blocks nothing but itself.
pub(crate) struct Reassembly {
    partial: HashMap<Uuid, Partial>,
    /// Transfers recently completed per sender, with when: late duplicates of their chunks
    /// are ignored. Bounded in senders and ids per sender.
    done: HashMap<Uuid, (VecDeque<u64>, Instant)>,
    max_state_bytes: u64,
    timeout: Duration,
}

impl Reassembly {
    pub(super) fn new(max_state_bytes: u64, timeout: Duration) -> Self {
        Reassembly {
            partial: HashMap::new(),
            done: HashMap::new(),
            max_state_bytes,
            timeout,
        }
    }

    /// Adds a chunk (its header already checked for self-consistency by the wire layer).
    pub(super) fn add(&mut self, sender: Uuid, c: StateChunk) -> Result<Progress, WireError> {
        if c.total_len > self.max_state_bytes {
            return Err(WireError::Oversized {
                len: c.total_len as usize,
                limit: self.max_state_bytes as usize,
            });
        }
        if self
            .done
            .get(&sender)
            .is_some_and(|(ids, _)| ids.contains(&c.transfer))
        {
            return Ok(Progress::Pending);
        }
        if c.count == 1 {
            self.partial.remove(&sender);
            let state = finish(c.total_len, c.checksum, c.data)?;
            self.completed(sender, c.transfer);
            return Ok(Progress::Complete(state));
        }
        let p = match self.partial.get_mut(&sender) {
            Some(p) if p.transfer == c.transfer => p,
            _ => {
                // The first chunk seen of a new transfer (an older one is abandoned).
                if c.count as u64 > c.total_len.max(1) {
                    return Err(WireError::Chunk("more chunks than bytes".into()));
                }
                if !self.partial.contains_key(&sender) && self.partial.len() >= MAX_TRANSFERS {
                    let oldest = self
                        .partial
                        .iter()
                        .min_by_key(|(_, p)| p.started)
                        .map(|(s, _)| *s)
                        .expect("not empty");
                    self.partial.remove(&oldest);
                }
                self.partial.insert(
                    sender,
                    Partial {
                        transfer: c.transfer,
                        count: c.count,
                        total_len: c.total_len,
                        checksum: c.checksum,
                        chunks: BTreeMap::new(),
                        bytes: 0,
                        started: Instant::now(),
                    },
                );
                self.partial.get_mut(&sender).expect("just inserted")
            }
        };
        if (p.count, p.total_len, p.checksum) != (c.count, c.total_len, c.checksum) {
            self.partial.remove(&sender);
            return Err(WireError::Chunk(
                "chunk header differs from its transfer".into(),
            ));
        }
        if p.chunks.contains_key(&c.index) {
            return Ok(Progress::Pending); // a duplicate
        }
        p.bytes += c.data.len() as u64;
        if p.bytes > p.total_len {
            self.partial.remove(&sender);
            return Err(WireError::Chunk("chunks longer than their state".into()));
        }
        p.chunks.insert(c.index, c.data);
        if p.chunks.len() < p.count as usize {
            return Ok(Progress::Pending);
        }
        let p = self.partial.remove(&sender).expect("present");
        let mut state = Vec::with_capacity(p.total_len as usize);
        for chunk in p.chunks.into_values() {
            state.extend_from_slice(&chunk);
        }
        let state = finish(p.total_len, p.checksum, state)?;
        self.completed(sender, p.transfer);
        Ok(Progress::Complete(state))
    }

    fn completed(&mut self, sender: Uuid, transfer: u64) {
        if !self.done.contains_key(&sender) && self.done.len() >= MAX_REMEMBERED_SENDERS {
            let oldest = self
                .done
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(s, _)| *s)
                .expect("not empty");
            self.done.remove(&oldest);
        }
        let (ids, at) = self
            .done
            .entry(sender)
            .or_insert_with(|| (VecDeque::new(), Instant::now()));
        if ids.len() >= REMEMBERED_PER_SENDER {
            ids.pop_front();
        }
        ids.push_back(transfer);
        *at = Instant::now();
    }

    /// Forgets what it knows of a sender (it expired as a peer).
    pub(super) fn forget(&mut self, sender: &Uuid) {
        self.partial.remove(sender);
        self.done.remove(sender);
    }

    /// Drops transfers older than the timeout (their missing chunks were lost); returns how
    /// many.
    pub(super) fn expire(&mut self) -> usize {
        let before = self.partial.len();
        let timeout = self.timeout;
        self.partial.retain(|_, p| p.started.elapsed() < timeout);
        before - self.partial.len()
    }

    /// Transfers in progress.
    pub(super) fn in_progress(&self) -> usize {
        self.partial.len()
    }
}

fn finish(total_len: u64, checksum: u64, state: Vec<u8>) -> Result<Vec<u8>, WireError> {
    if state.len() as u64 != total_len {
        return Err(WireError::Chunk(format!(
            "state of {} bytes, header says {total_len}",
            state.len()
        )));
    }
    if xxh3_64(&state) != checksum {
        return Err(WireError::Chunk("checksum mismatch".into()));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::chunk_state;

    #[test]
    fn reassembles_in_any_order_with_duplicates() {
        let state: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut chunks = chunk_state(&state, 1, 999);
        chunks.reverse();
        chunks.push(chunks[3].clone());
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60));
        let s = Uuid::from_u128(1);
        let mut done = None;
        for c in chunks {
            if let Progress::Complete(st) = r.add(s, c).unwrap() {
                done = Some(st);
            }
        }
        assert_eq!(done.unwrap(), state);
        assert_eq!(r.in_progress(), 0);
    }

    #[test]
    fn rejects_tampering_and_oversize() {
        let state = vec![5u8; 5000];
        let s = Uuid::from_u128(1);
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60));
        let mut chunks = chunk_state(&state, 1, 1000);
        chunks[2].data[0] ^= 1;
        let results: Vec<_> = chunks.into_iter().map(|c| r.add(s, c)).collect();
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err().reason(),
            "chunk"
        );
        let mut small = Reassembly::new(100, Duration::from_secs(60));
        let c = chunk_state(&state, 2, 1000).remove(0);
        assert_eq!(small.add(s, c).unwrap_err().reason(), "oversized");
        // Another transfer supersedes an unfinished one, whatever its id.
        let mut r = Reassembly::new(1 << 20, Duration::ZERO);
        r.add(s, chunk_state(&state, 4, 1000).remove(0)).unwrap();
        r.add(s, chunk_state(&state, 3, 1000).remove(0)).unwrap();
        assert_eq!(r.in_progress(), 1);
        assert_eq!(r.expire(), 1);
        // A header claiming a billion chunks allocates nothing, and transfers are bounded.
        let mut r = Reassembly::new(u64::MAX, Duration::from_secs(60));
        for i in 0..(MAX_TRANSFERS as u128 + 5) {
            let c = StateChunk {
                transfer: 1,
                index: 0,
                count: 1 << 30,
                total_len: 1 << 40,
                checksum: 0,
                data: vec![0; 10],
            };
            assert!(matches!(
                r.add(Uuid::from_u128(i), c),
                Ok(Progress::Pending)
            ));
        }
        assert_eq!(r.in_progress(), MAX_TRANSFERS);
    }

    /// Finding: a state re-sent with transfer id 2^64-1 made every later (smaller) id of
    /// that sender look old, disabling its anti-entropy; and a restarted sender's ids were
    /// ignored until they passed the old ones.
    #[test]
    fn a_completed_id_blocks_only_itself() {
        let state = vec![9u8; 3000];
        let s = Uuid::from_u128(7);
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60));
        for c in chunk_state(&state, u64::MAX, 1000) {
            r.add(s, c).unwrap();
        }
        // A replay of the same transfer is ignored...
        for c in chunk_state(&state, u64::MAX, 1000) {
            assert!(matches!(r.add(s, c).unwrap(), Progress::Pending));
        }
        // ...but any other id, smaller or not, completes.
        let mut complete = 0;
        for id in [1, 5, 2] {
            for c in chunk_state(&state, id, 1000) {
                if let Progress::Complete(st) = r.add(s, c).unwrap() {
                    assert_eq!(st, state);
                    complete += 1;
                }
            }
        }
        assert_eq!(complete, 3);
    }

    #[test]
    fn remembered_senders_are_bounded() {
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60));
        for i in 0..(MAX_REMEMBERED_SENDERS as u128 + 100) {
            for c in chunk_state(b"x", 1, 1000) {
                r.add(Uuid::from_u128(i), c).unwrap();
            }
        }
        assert_eq!(r.done.len(), MAX_REMEMBERED_SENDERS);
        r.forget(&Uuid::from_u128(MAX_REMEMBERED_SENDERS as u128 + 99));
        assert_eq!(r.done.len(), MAX_REMEMBERED_SENDERS - 1);
    }
}
