//! Reassembly of full states sent in chunks: whole, or passed on piece by piece in order for
//! kinds that merge a state as it arrives.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use uuid::Uuid;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::wire::{StateChunk, WireError};

/// A transfer in progress.
struct Partial {
    transfer: u64,
    count: u32,
    total_len: u64,
    checksum: u64,
    /// Read from the sender's live state ([`StateChunk::live`]): no whole-state checksum.
    live: bool,
    received: Received,
    bytes: u64,
    /// When its last chunk came: a transfer paced by a slow receiver may take long, and is
    /// lost only once its chunks stop coming.
    touched: Instant,
}

/// What a transfer in progress keeps of its chunks.
enum Received {
    /// Chunks by index, allocated as they come (a header cannot make us allocate).
    Chunks(BTreeMap<u32, Vec<u8>>),
    /// Nothing: chunks are passed on in order as they come ([`Progress::Piece`]); the index
    /// of the next, and the hash of those passed on.
    Streamed { next: u32, hasher: Box<Xxh3> },
}

/// Transfers reassembled at once.
pub(crate) const MAX_TRANSFERS: usize = 16;
/// Senders whose recently completed transfers are remembered (to ignore late duplicates).
pub(crate) const MAX_REMEMBERED_SENDERS: usize = 1024;
/// Completed transfer ids remembered per sender.
const REMEMBERED_PER_SENDER: usize = 8;
/// A receiver of a [live](StateChunk::live) transfer reports its progress every this many
/// chunks merged ([`Progress::Piece::report`]); a sender keeps at most
/// [`PACING_WINDOW`] chunks ahead of its slowest receiver.
pub(crate) const PROGRESS_EVERY: u32 = 4;
/// Chunks a sender of a live transfer publishes beyond the last progress its slowest
/// receiver reported: 8 MiB at the default 512 KiB chunk, what either side holds of the
/// transfer besides its own state.
pub(crate) const PACING_WINDOW: u32 = 16;

/// Outcome of adding a chunk.
#[derive(Debug)]
pub(crate) enum Progress {
    /// More chunks to come.
    Pending,
    /// The whole state, its checksum verified.
    Complete(Vec<u8>),
    /// The next piece of a state passed on as it comes (a transfer of several chunks, when
    /// streaming): its bytes from `offset` on; with `last`, the whole state's length and
    /// checksum were verified.
    Piece {
        offset: u64,
        data: Vec<u8>,
        total_len: u64,
        last: bool,
        /// For a [live](StateChunk::live) transfer, every [`PROGRESS_EVERY`] chunks: the
        /// transfer id and the index of the next chunk, to report to the sender once this
        /// piece is merged (it paces the transfer by them).
        report: Option<(u64, u32)>,
    },
}

/// Transfers in progress, at most one per sender (a chunk of another transfer replaces the
/// unfinished one: one sender's messages arrive in order, so it started a new push), each
/// bounded by `max_state_bytes`, at most [`MAX_TRANSFERS`] at once (the stalest is abandoned
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
    /// Transfers of several chunks are passed on piece by piece, in order, instead of
    /// reassembled: a chunk out of order abandons its transfer.
    streamed: bool,
}

impl Reassembly {
    pub(super) fn new(max_state_bytes: u64, timeout: Duration, streamed: bool) -> Self {
        Reassembly {
            partial: HashMap::new(),
            done: HashMap::new(),
            max_state_bytes,
            timeout,
            streamed,
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
        if c.live && !self.streamed {
            // Only kinds merged piece by piece are sent live: one merged whole needs the
            // whole state's checksum.
            return Err(WireError::Chunk(
                "a live transfer of a kind merged whole".into(),
            ));
        }
        if c.count == 1 {
            self.partial.remove(&sender);
            let checksum = (!c.live).then_some(c.checksum);
            let state = finish(c.total_len, checksum, c.data)?;
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
                if self.streamed && c.index != 0 {
                    // Its beginning was missed: a piece cannot be placed without the ones
                    // before. The peer's state comes again (anti-entropy).
                    return Ok(Progress::Pending);
                }
                if !self.partial.contains_key(&sender) && self.partial.len() >= MAX_TRANSFERS {
                    let oldest = self
                        .partial
                        .iter()
                        .min_by_key(|(_, p)| p.touched)
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
                        live: c.live,
                        received: if self.streamed {
                            Received::Streamed {
                                next: 0,
                                hasher: Box::new(Xxh3::new()),
                            }
                        } else {
                            Received::Chunks(BTreeMap::new())
                        },
                        bytes: 0,
                        touched: Instant::now(),
                    },
                );
                self.partial.get_mut(&sender).expect("just inserted")
            }
        };
        if (p.count, p.total_len, p.checksum, p.live) != (c.count, c.total_len, c.checksum, c.live)
        {
            self.partial.remove(&sender);
            return Err(WireError::Chunk(
                "chunk header differs from its transfer".into(),
            ));
        }
        p.touched = Instant::now();
        let chunks = match &mut p.received {
            Received::Chunks(chunks) => chunks,
            Received::Streamed { next, hasher } => {
                if c.index < *next {
                    return Ok(Progress::Pending); // a duplicate
                }
                if c.index > *next {
                    let missing = *next;
                    self.partial.remove(&sender);
                    return Err(WireError::Chunk(format!("chunk {missing} missing")));
                }
                let offset = p.bytes;
                p.bytes += c.data.len() as u64;
                if p.bytes > p.total_len {
                    self.partial.remove(&sender);
                    return Err(WireError::Chunk("chunks longer than their state".into()));
                }
                if !p.live {
                    hasher.update(&c.data);
                }
                *next += 1;
                let last = *next == p.count;
                let report =
                    (p.live && !last && *next % PROGRESS_EVERY == 0).then_some((p.transfer, *next));
                if last {
                    let (bytes, digest) = (p.bytes, hasher.digest());
                    let (transfer, total_len, checksum, live) =
                        (p.transfer, p.total_len, p.checksum, p.live);
                    self.partial.remove(&sender);
                    if bytes != total_len {
                        return Err(WireError::Chunk(format!(
                            "state of {bytes} bytes, header says {total_len}"
                        )));
                    }
                    if !live && digest != checksum {
                        return Err(WireError::Chunk("checksum mismatch".into()));
                    }
                    self.completed(sender, transfer);
                }
                return Ok(Progress::Piece {
                    offset,
                    data: c.data,
                    total_len: c.total_len,
                    last,
                    report,
                });
            }
        };
        if chunks.contains_key(&c.index) {
            return Ok(Progress::Pending); // a duplicate
        }
        p.bytes += c.data.len() as u64;
        if p.bytes > p.total_len {
            self.partial.remove(&sender);
            return Err(WireError::Chunk("chunks longer than their state".into()));
        }
        chunks.insert(c.index, c.data);
        if chunks.len() < p.count as usize {
            return Ok(Progress::Pending);
        }
        let p = self.partial.remove(&sender).expect("present");
        let Received::Chunks(chunks) = p.received else {
            unreachable!("reassembled transfers keep their chunks")
        };
        let mut state = Vec::with_capacity(p.total_len as usize);
        for chunk in chunks.into_values() {
            state.extend_from_slice(&chunk);
        }
        let state = finish(p.total_len, Some(p.checksum), state)?;
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

    /// Abandons the sender's transfer in progress (a piece of it was refused).
    pub(super) fn forget_transfer(&mut self, sender: &Uuid) {
        self.partial.remove(sender);
    }

    /// Forgets what it knows of a sender (it expired as a peer).
    pub(super) fn forget(&mut self, sender: &Uuid) {
        self.partial.remove(sender);
        self.done.remove(sender);
    }

    /// Drops transfers whose last chunk came longer than the timeout ago (their missing
    /// chunks were lost); returns how many.
    pub(super) fn expire(&mut self) -> usize {
        let before = self.partial.len();
        let timeout = self.timeout;
        self.partial.retain(|_, p| p.touched.elapsed() < timeout);
        before - self.partial.len()
    }

    /// Transfers in progress.
    pub(super) fn in_progress(&self) -> usize {
        self.partial.len()
    }
}

/// The reassembled state, its length and (unless it was read live) its checksum checked.
fn finish(total_len: u64, checksum: Option<u64>, state: Vec<u8>) -> Result<Vec<u8>, WireError> {
    if state.len() as u64 != total_len {
        return Err(WireError::Chunk(format!(
            "state of {} bytes, header says {total_len}",
            state.len()
        )));
    }
    if checksum.is_some_and(|sum| xxh3_64(&state) != sum) {
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
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), false);
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

    /// Streamed, a transfer comes out as its pieces in order, each once; the last one says the
    /// whole checked out. A chunk out of order abandons the transfer; a transfer whose
    /// beginning was missed is ignored; a damaged one fails at its end.
    #[test]
    fn streams_pieces_in_order_and_refuses_gaps() {
        let state: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let s = Uuid::from_u128(1);
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), true);
        let mut chunks = chunk_state(&state, 1, 999);
        chunks.insert(3, chunks[2].clone());
        let mut rebuilt = Vec::new();
        let mut lasts = 0;
        for c in chunks.clone() {
            match r.add(s, c).unwrap() {
                Progress::Piece {
                    offset,
                    data,
                    total_len,
                    last,
                    report,
                } => {
                    assert_eq!(report, None, "only live transfers report");
                    assert_eq!(offset, rebuilt.len() as u64);
                    assert_eq!(total_len, state.len() as u64);
                    rebuilt.extend(data);
                    lasts += usize::from(last);
                }
                Progress::Pending => {}
                Progress::Complete(_) => panic!("streamed"),
            }
        }
        assert_eq!((rebuilt, lasts), (state.clone(), 1));
        assert_eq!(r.in_progress(), 0);
        // A replay of the completed transfer is ignored.
        assert!(matches!(
            r.add(s, chunks[0].clone()).unwrap(),
            Progress::Pending
        ));
        // Out of order: refused, and the transfer abandoned.
        let chunks = chunk_state(&state, 2, 999);
        assert!(matches!(
            r.add(s, chunks[0].clone()),
            Ok(Progress::Piece { .. })
        ));
        assert_eq!(r.add(s, chunks[2].clone()).unwrap_err().reason(), "chunk");
        assert_eq!(r.in_progress(), 0);
        // Joined mid-transfer: ignored.
        assert!(matches!(
            r.add(s, chunks[1].clone()).unwrap(),
            Progress::Pending
        ));
        assert_eq!(r.in_progress(), 0);
        // Damaged: every piece is passed on, and the end reports the mismatch.
        let mut chunks = chunk_state(&state, 3, 999);
        chunks[4].data[0] ^= 1;
        let results: Vec<_> = chunks.into_iter().map(|c| r.add(s, c)).collect();
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err().reason(),
            "chunk"
        );
        // One chunk: the whole state, as when reassembling.
        let one = chunk_state(&state, 4, 1 << 20).remove(0);
        assert!(matches!(r.add(s, one).unwrap(), Progress::Complete(st) if st == state));
    }

    fn live(chunks: Vec<StateChunk>) -> Vec<StateChunk> {
        chunks
            .into_iter()
            .map(|c| StateChunk {
                live: true,
                checksum: 0,
                ..c
            })
            .collect()
    }

    /// A live transfer has no whole-state checksum: its pieces pass on in order, every
    /// [`PROGRESS_EVERY`] of them with a report to send (none with the last); its length is
    /// still checked, and a reassembling receiver (a kind merged whole) refuses it.
    #[test]
    fn live_transfers_stream_and_report_their_progress() {
        let state: Vec<u8> = (0..10_000u32).map(|i| (i * 3) as u8).collect();
        let s = Uuid::from_u128(1);
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), true);
        let chunks = live(chunk_state(&state, 6, 500));
        let count = chunks.len() as u32;
        let mut rebuilt = Vec::new();
        let mut reports = Vec::new();
        for c in chunks.clone() {
            let Progress::Piece {
                data, report, last, ..
            } = r.add(s, c).unwrap()
            else {
                panic!("streamed");
            };
            rebuilt.extend(data);
            reports.extend(report);
            assert!(!last || report.is_none());
        }
        assert_eq!(rebuilt, state);
        let expected: Vec<_> = (1..count)
            .filter(|n| n % PROGRESS_EVERY == 0)
            .map(|n| (6, n))
            .collect();
        assert_eq!(reports, expected);
        assert_eq!(r.in_progress(), 0);
        // A header that changes between chunks (live or not) abandons the transfer.
        let mut mixed = live(chunk_state(&state, 7, 500));
        mixed[1].live = false;
        r.add(s, mixed[0].clone()).unwrap();
        assert_eq!(r.add(s, mixed[1].clone()).unwrap_err().reason(), "chunk");
        // Short of its length: refused at the end.
        let mut short = live(chunk_state(&state, 8, 500));
        short.last_mut().unwrap().data.pop();
        let results: Vec<_> = short.into_iter().map(|c| r.add(s, c)).collect();
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err().reason(),
            "chunk"
        );
        // One live chunk: the whole state.
        let one = live(chunk_state(&state, 9, 1 << 20)).remove(0);
        assert!(matches!(r.add(s, one.clone()).unwrap(), Progress::Complete(st) if st == state));
        // Reassembling: refused.
        let mut whole = Reassembly::new(1 << 20, Duration::from_secs(60), false);
        assert_eq!(whole.add(s, one).unwrap_err().reason(), "chunk");
        let first = live(chunk_state(&state, 10, 500)).remove(0);
        assert_eq!(whole.add(s, first).unwrap_err().reason(), "chunk");
        assert_eq!(whole.in_progress(), 0);
    }

    #[test]
    fn rejects_tampering_and_oversize() {
        let state = vec![5u8; 5000];
        let s = Uuid::from_u128(1);
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), false);
        let mut chunks = chunk_state(&state, 1, 1000);
        chunks[2].data[0] ^= 1;
        let results: Vec<_> = chunks.into_iter().map(|c| r.add(s, c)).collect();
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err().reason(),
            "chunk"
        );
        let mut small = Reassembly::new(100, Duration::from_secs(60), false);
        let c = chunk_state(&state, 2, 1000).remove(0);
        assert_eq!(small.add(s, c).unwrap_err().reason(), "oversized");
        // Another transfer supersedes an unfinished one, whatever its id.
        let mut r = Reassembly::new(1 << 20, Duration::ZERO, false);
        r.add(s, chunk_state(&state, 4, 1000).remove(0)).unwrap();
        r.add(s, chunk_state(&state, 3, 1000).remove(0)).unwrap();
        assert_eq!(r.in_progress(), 1);
        assert_eq!(r.expire(), 1);
        // A header claiming a billion chunks allocates nothing, and transfers are bounded.
        let mut r = Reassembly::new(u64::MAX, Duration::from_secs(60), false);
        for i in 0..(MAX_TRANSFERS as u128 + 5) {
            let c = StateChunk {
                transfer: 1,
                index: 0,
                count: 1 << 30,
                total_len: 1 << 40,
                checksum: 0,
                data: vec![0; 10],
                live: false,
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
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), false);
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
        let mut r = Reassembly::new(1 << 20, Duration::from_secs(60), false);
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
