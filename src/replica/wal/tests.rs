use super::*;
use std::fs;

fn ident(n: u16) -> Identity {
    Identity {
        uuid: Uuid::from_u128(0xc0ffee + n as u128),
        replica: n,
    }
}

fn record(i: usize) -> Vec<u8> {
    // Lengths vary, some span several pages.
    let mut r = format!("record {i} ").into_bytes();
    r.resize(r.len() + (i * 37) % 300, i as u8);
    r
}

fn read_all(
    dir: &Path,
    id: Identity,
    through: Option<SegmentId>,
    limits: WalLimits,
) -> Result<(Vec<Vec<u8>>, Replayed), DurableError> {
    let mut out = Vec::new();
    let r = replay(dir, id, through, limits, |rec| out.push(rec.to_vec()))?;
    Ok((out, r))
}

fn records_in(dir: &Path) -> Vec<Vec<u8>> {
    read_all(dir, ident(1), None, WalLimits::default())
        .unwrap()
        .0
}

fn writer(dir: &Path, limits: WalLimits) -> WalWriter {
    let (_, r) = read_all(dir, ident(1), None, limits).unwrap();
    WalWriter::start(r, ident(1)).unwrap()
}

fn writer_in(pool: &WalPool, dir: &Path) -> WalWriter {
    let (_, r) = read_all(dir, ident(1), None, WalLimits::default()).unwrap();
    WalWriter::start_in(pool, r, ident(1))
}

fn segments(dir: &Path) -> Vec<u64> {
    list_segments_io(&disk::RealDisk, dir)
        .unwrap()
        .into_keys()
        .collect()
}

/// Two segments: records 0 and 1 in the first, 2 and 3 in the second, one frame each.
fn two_segments(dir: &Path) {
    let mut w = writer(dir, WalLimits::default());
    for i in 0..4 {
        if i == 2 {
            w.rotate();
        }
        w.append(record(i)).wait().unwrap();
    }
    w.close();
    assert_eq!(segments(dir), [1, 2]);
}

#[test]
fn round_trip_across_segments_and_rotations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(WAL_DIR);
    let mut w = writer(&dir, WalLimits::default());
    let mut expected = Vec::new();
    let mut pending = Vec::new();
    for i in 0..100 {
        if i % 30 == 0 {
            w.rotate();
        }
        if i == 50 {
            // Rotations without appends in between create no segment.
            w.rotate();
            w.rotate();
        }
        expected.push(record(i));
        pending.push(w.append(record(i)));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for p in pending {
            p.await.unwrap();
        }
    });
    let stats = w.stats();
    w.close();
    assert_eq!(stats.appends.load(Ordering::Relaxed), 100);
    // No segment 1 nor 4: nothing was appended between their rotations.
    assert_eq!(segments(&dir), [2, 3, 5, 6, 7]);
    assert_eq!(records_in(&dir), expected);

    // A second life appends after the first one's records.
    let mut w = writer(&dir, WalLimits::default());
    let first = w.segment();
    assert!(first.0 > *segments(&dir).last().unwrap());
    w.append(b"again".to_vec()).wait().unwrap();
    assert_eq!(w.rotate(), first);
    w.close();
    expected.push(b"again".to_vec());
    assert_eq!(records_in(&dir), expected);
}

#[test]
fn group_commit_shares_one_fsync() {
    let tmp = tempfile::tempdir().unwrap();
    let w = writer(tmp.path(), WalLimits::default());
    let release = w.hold();
    let pending: Vec<_> = (0..200).map(|i| w.append(record(i))).collect();
    drop(release);
    for p in pending {
        p.wait().unwrap();
    }
    let stats = w.stats();
    assert_eq!(stats.appends.load(Ordering::Relaxed), 200);
    assert_eq!(stats.fsyncs.load(Ordering::Relaxed), 1);
    w.close();
    assert_eq!(
        records_in(tmp.path()),
        (0..200).map(record).collect::<Vec<_>>()
    );
}

#[test]
fn group_commit_splits_at_the_frame_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = WalLimits {
        max_record_bytes: 1000,
    };
    let w = writer(tmp.path(), limits);
    let release = w.hold();
    // 104 bytes each with their length: 9 fit in a frame of at most 1004.
    let pending: Vec<_> = (0..50u8).map(|i| w.append(vec![i; 100])).collect();
    let big = w.append(vec![7; 1000]);
    let too_big = w.append(vec![7; 1001]);
    drop(release);
    for p in pending {
        p.wait().unwrap();
    }
    big.wait().unwrap();
    assert!(matches!(
        too_big.wait(),
        Err(WalError::TooLarge {
            len: 1001,
            max: 1000
        })
    ));
    let stats = w.stats();
    assert_eq!(stats.fsyncs.load(Ordering::Relaxed), 50_u64.div_ceil(9) + 1);
    w.close();
    let (got, _) = read_all(tmp.path(), ident(1), None, limits).unwrap();
    assert_eq!(got.len(), 51);
    // Replaying with a smaller limit than the writer's takes the larger frames for
    // damage (skipped), never for an allocation.
    let small = WalLimits {
        max_record_bytes: 500,
    };
    let (got, r) = read_all(tmp.path(), ident(1), None, small).unwrap();
    assert!(got.len() < 51 && r.damaged_regions > 0);
}

fn count(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Issue 25: logged appends complete once written, without an fsync each; the periodic
/// sync makes one fsync for what was written, and none while nothing was written since.
#[test]
fn logged_appends_are_synced_by_the_periodic_sync_not_per_append() {
    let pool = WalPool::new(1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer_in(&pool, tmp.path());
    w.set_sync_interval(Duration::from_secs(3600));
    for i in 0..50 {
        w.append_logged(record(i)).wait().unwrap();
    }
    let s = w.stats();
    assert_eq!(count(&s.logged), 50);
    assert_eq!(count(&s.appends), 0);
    assert_eq!(count(&s.fsyncs), 0, "no fsync per logged append");
    // Written: readable (they survive the process) before any fsync.
    assert_eq!(
        records_in(tmp.path()),
        (0..50).map(record).collect::<Vec<_>>()
    );
    // A durable append after them: its one fsync covers the whole log, in order.
    w.append(record(50)).wait().unwrap();
    assert_eq!((count(&s.appends), count(&s.fsyncs)), (1, 1));
    assert_eq!(count(&s.periodic_fsyncs), 0);
    w.close();
    assert_eq!(
        records_in(tmp.path()),
        (0..51).map(record).collect::<Vec<_>>()
    );

    // A short interval: the periodic sync comes by itself.
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer_in(&pool, tmp.path());
    w.set_sync_interval(Duration::from_millis(30));
    for i in 0..20 {
        w.append_logged(record(i)).wait().unwrap();
    }
    let s = w.stats();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&s.periodic_fsyncs) == 0 {
        assert!(Instant::now() < deadline, "no periodic sync");
        std::thread::sleep(Duration::from_millis(5));
    }
    let synced = count(&s.fsyncs);
    assert_eq!(synced, count(&s.periodic_fsyncs), "only periodic syncs");
    assert!(synced <= 20, "{synced} fsyncs for 20 logged appends");
    // Nothing written since: no more syncs, however long the log waits.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(count(&s.fsyncs), synced);
    // Written again: synced again.
    w.append_logged(record(20)).wait().unwrap();
    while count(&s.periodic_fsyncs) == synced {
        assert!(Instant::now() < deadline, "no second periodic sync");
        std::thread::sleep(Duration::from_millis(5));
    }
    w.close();
    assert_eq!(
        records_in(tmp.path()),
        (0..21).map(record).collect::<Vec<_>>()
    );
}

/// A sync without a record (a commit without a delta, whose updates rest on earlier ones):
/// done at once before anything was written, one fsync for logged frames written and not
/// synced, none when everything is synced.
#[test]
fn a_sync_fsyncs_what_was_written_and_only_that() {
    let pool = WalPool::new(1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer_in(&pool, tmp.path());
    w.set_sync_interval(Duration::from_secs(3600));
    let s = w.stats();
    w.sync().wait().unwrap();
    assert_eq!(count(&s.fsyncs), 0, "nothing written");
    w.append_logged(record(0)).wait().unwrap();
    assert_eq!(count(&s.fsyncs), 0);
    w.sync().wait().unwrap();
    assert_eq!(count(&s.fsyncs), 1, "the logged frame is synced");
    w.sync().wait().unwrap();
    assert_eq!(count(&s.fsyncs), 1, "nothing written since");
    w.append(record(1)).wait().unwrap();
    w.sync().wait().unwrap();
    assert_eq!(count(&s.fsyncs), 2, "the durable append synced itself");
    w.close();
    assert_eq!(records_in(tmp.path()), vec![record(0), record(1)]);
}

/// Only the last segment may end in unsynced frames: a rotation syncs the segment it
/// ends, and a close syncs what was written.
#[test]
fn rotation_and_close_sync_logged_frames() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer(tmp.path(), WalLimits::default());
    w.set_sync_interval(Duration::from_secs(3600));
    w.append_logged(record(0)).wait().unwrap();
    let s = w.stats();
    w.rotate();
    // Nothing written since: a second rotation syncs nothing.
    w.rotate();
    w.append_logged(record(1)).wait().unwrap();
    assert_eq!(count(&s.fsyncs), 1);
    w.close();
    assert_eq!(count(&s.fsyncs), 2);
    assert_eq!(count(&s.periodic_fsyncs), 0);
    assert_eq!(segments(tmp.path()), [1, 3]);
    assert_eq!(records_in(tmp.path()), [record(0), record(1)]);
}

/// A crash of the machine may leave several unsynced frames at the end of the last
/// segment, partly written back: the stretch after which nothing checks is a torn tail
/// (cut), however long; the same in an earlier segment is damage (skipped, kept).
#[test]
fn unsynced_frames_torn_by_a_machine_crash_are_cut() {
    let tmp = tempfile::tempdir().unwrap();
    // Frames of at most 404 bytes: the stretch lost is more than one of them.
    let limits = WalLimits {
        max_record_bytes: 400,
    };
    let mut w = writer(tmp.path(), limits);
    w.set_sync_interval(Duration::from_secs(3600));
    for i in 0..10 {
        w.append_logged(record(i)).wait().unwrap();
    }
    w.close();
    let good = fs::read(tmp.path().join(segment_name(1))).unwrap();
    let frame = |k: usize| FRAME_HEADER + RECORD_HEADER + record(k).len();
    let fifth: usize = SEGMENT_HEADER + (0..5).map(frame).sum::<usize>();
    let five: Vec<_> = (0..5).map(record).collect();
    // Frames 5 to 9 lost: blank (the size grew, the data never landed), or blank with
    // a few blocks of them written back.
    let mut blank = good.clone();
    blank[fifth..].fill(0);
    let mut partly = blank.clone();
    let end = good.len();
    // Inside frames, none whole (a whole one would be sound, and kept).
    partly[end - 40..end - 10].copy_from_slice(&good[end - 40..end - 10]);
    // Frame 5's header landed, its body did not.
    partly[fifth..fifth + FRAME_HEADER].copy_from_slice(&good[fifth..fifth + FRAME_HEADER]);
    partly[fifth + 100..fifth + 150].copy_from_slice(&good[fifth + 100..fifth + 150]);
    for (name, bytes) in [("blank", &blank), ("partly written back", &partly)] {
        assert!(
            end - fifth > limits.max_frame() + FRAME_HEADER,
            "more than a frame lost"
        );
        let copy = with_last(tmp.path(), bytes);
        let (got, r) =
            read_all(copy.path(), ident(1), None, limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, five, "{name}");
        assert!(r.torn, "{name}");
        assert_eq!(r.torn_bytes, (end - fifth) as u64, "{name}");
        assert_eq!(r.damaged_regions, 0, "{name}");
        let len = fs::metadata(copy.path().join(segment_name(1)))
            .unwrap()
            .len();
        assert_eq!(len, fifth as u64, "{name}: cut");
    }
    // A segment whose header never landed either: removed.
    let zeros = vec![0u8; good.len()];
    let copy = with_last(tmp.path(), &zeros);
    let (got, r) = read_all(copy.path(), ident(1), None, limits).unwrap();
    assert!(got.is_empty() && r.torn);
    assert!(segments(copy.path()).is_empty());
    // Not the last segment: damage, skipped, and the next segment is replayed.
    let two = tempfile::tempdir().unwrap();
    let mut w = writer(two.path(), limits);
    for i in 0..10 {
        w.append_logged(record(i)).wait().unwrap();
    }
    w.rotate();
    w.append(b"later".to_vec()).wait().unwrap();
    w.close();
    assert_eq!(fs::read(two.path().join(segment_name(1))).unwrap(), good);
    fs::write(two.path().join(segment_name(1)), &blank).unwrap();
    let (got, r) = read_all(two.path(), ident(1), None, limits).unwrap();
    let mut expected = five.clone();
    expected.push(b"later".to_vec());
    assert_eq!(got, expected);
    assert_eq!((r.damaged_regions, r.torn), (1, false));
}

/// Copies the log with the last segment replaced by `last`.
fn with_last(dir: &Path, last: &[u8]) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    let segs = list_segments_io(&disk::RealDisk, dir).unwrap();
    let (&last_id, _) = segs.last_key_value().unwrap();
    for (id, path) in &segs {
        let to = copy.path().join(segment_name(*id));
        if *id == last_id {
            fs::write(to, last).unwrap();
        } else {
            fs::copy(path, to).unwrap();
        }
    }
    copy
}

#[test]
fn torn_tail_is_cut_at_every_offset() {
    let tmp = tempfile::tempdir().unwrap();
    two_segments(tmp.path());
    let good = fs::read(tmp.path().join(segment_name(2))).unwrap();
    let last_frame = good.len() - FRAME_HEADER - RECORD_HEADER - record(3).len();
    let first3: Vec<_> = (0..3).map(record).collect();
    for cut in last_frame..good.len() {
        let copy = with_last(tmp.path(), &good[..cut]);
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default())
            .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(got, first3, "cut at {cut}");
        assert_eq!(r.torn_bytes, (cut - last_frame) as u64);
        let len = fs::metadata(copy.path().join(segment_name(2)))
            .unwrap()
            .len();
        assert_eq!(len, last_frame as u64, "cut at {cut}");
        // The cut log replays cleanly, and a writer appends after it.
        let (_, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(r.torn_bytes, 0);
        let w = WalWriter::start(r, ident(1)).unwrap();
        w.append(b"after".to_vec()).wait().unwrap();
        w.close();
        assert_eq!(records_in(copy.path()).len(), 4);
    }
    // A segment cut inside its header never completed its first commit: it goes.
    for cut in 0..SEGMENT_HEADER {
        let copy = with_last(tmp.path(), &good[..cut]);
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(got, first3[..2], "header cut at {cut}");
        assert!(r.torn);
        assert_eq!(segments(copy.path()), [1]);
    }
    // A last frame whose body fails its checksum.
    for i in last_frame + FRAME_HEADER..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        let copy = with_last(tmp.path(), &bad);
        let (got, _) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
        assert_eq!(got, first3, "flipped byte {i}");
    }
    // Zeroed space after the end (a crash after the size grew, before the data landed).
    let mut zeros = good.clone();
    zeros.resize(good.len() + 3000, 0);
    let copy = with_last(tmp.path(), &zeros);
    let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(r.torn_bytes, 3000);
}

/// Issue 27, point 3: a damaged frame or segment header before the tail loses only the
/// records it touches; every intact, checksummed record after it is replayed.
#[test]
fn damage_before_the_tail_loses_only_what_it_touches() {
    let tmp = tempfile::tempdir().unwrap();
    two_segments(tmp.path());
    let seg1 = fs::read(tmp.path().join(segment_name(1))).unwrap();
    let seg2 = fs::read(tmp.path().join(segment_name(2))).unwrap();
    let frame = |k: usize| FRAME_HEADER + RECORD_HEADER + record(k).len();
    let all: Vec<_> = (0..4).map(record).collect();
    let without = |k: usize| -> Vec<Vec<u8>> {
        all.iter()
            .enumerate()
            .filter(|(i, _)| *i != k)
            .map(|(_, r)| r.clone())
            .collect()
    };
    // Every byte of the first segment (header and its last frame included), and every
    // byte of the last segment but its last frame (a flip there is a torn tail).
    let cases = (0..seg1.len())
        .map(|i| (1, i))
        .chain((0..SEGMENT_HEADER + frame(2)).map(|i| (2, i)));
    for (seg, i) in cases {
        let copy = tempfile::tempdir().unwrap();
        for (id, bytes) in [(1, &seg1), (2, &seg2)] {
            let mut b = bytes.clone();
            if id == seg {
                b[i] ^= 0x04;
            }
            fs::write(copy.path().join(segment_name(id)), b).unwrap();
        }
        let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default())
            .unwrap_or_else(|e| panic!("segment {seg} byte {i}: {e}"));
        let expected = match (seg, i) {
            (_, i) if i < SEGMENT_HEADER => all.clone(),
            (1, i) if i < SEGMENT_HEADER + frame(0) => without(0),
            (1, _) => without(1),
            _ => without(2),
        };
        assert_eq!(got, expected, "segment {seg} byte {i}");
        assert_eq!(r.damaged_regions, 1, "segment {seg} byte {i}");
    }
    // A torn tail in a segment that is not the last is damage too: its frame is lost.
    let copy = tempfile::tempdir().unwrap();
    fs::write(copy.path().join(segment_name(1)), &seg1[..seg1.len() - 1]).unwrap();
    fs::write(copy.path().join(segment_name(2)), &seg2).unwrap();
    let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
    assert_eq!(got, without(1));
    assert_eq!(r.damaged_bytes, (frame(1) - 1) as u64);
    // A huge claimed length is refused before anything is allocated.
    let mut huge = seg2[..SEGMENT_HEADER].to_vec();
    let mut fh = [0u8; FRAME_HEADER];
    fh[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    let check = frame_check(&fh[..12]);
    fh[12..].copy_from_slice(&check);
    huge.extend_from_slice(&fh);
    huge.extend_from_slice(&seg2[SEGMENT_HEADER..]);
    let copy = with_last(tmp.path(), &huge);
    let (got, r) = read_all(copy.path(), ident(1), None, WalLimits::default()).unwrap();
    assert_eq!(got, all, "the frames after the bad length are kept");
    assert_eq!(r.damaged_bytes, FRAME_HEADER as u64);
    // 4 bytes flipped in the middle of a long log: only the frames they touch are lost.
    let long = tempfile::tempdir().unwrap();
    let w = writer(long.path(), WalLimits::default());
    for i in 0..300 {
        w.append(record(i)).wait().unwrap();
    }
    w.close();
    let seg = long.path().join(segment_name(1));
    let mut bytes = fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 4] {
        *b ^= 0xff;
    }
    fs::write(&seg, bytes).unwrap();
    let (got, r) = read_all(long.path(), ident(1), None, WalLimits::default()).unwrap();
    assert!(
        got.len() >= 298 && got.len() < 300,
        "{} of 300 records kept",
        got.len()
    );
    assert!(got.iter().all(|g| (0..300).any(|i| record(i) == *g)));
    assert_eq!(got.last(), Some(&record(299)));
    assert_eq!(r.damaged_regions, 1);
}

#[test]
fn segments_of_an_earlier_identity_are_replayed_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    two_segments(tmp.path());
    // A restart under a new identity that crashed before its first snapshot was saved: the
    // segments above the older snapshot's mark are this replica's records all the same.
    for other in [
        ident(2),
        Identity {
            uuid: Uuid::from_u128(7),
            replica: 1,
        },
    ] {
        let (got, r) = read_all(tmp.path(), other, None, WalLimits::default()).unwrap();
        assert_eq!(got, records_in(tmp.path()));
        assert_eq!((r.segments, r.earlier_identities), (2, 2));
    }
    let (_, r) = read_all(tmp.path(), ident(1), None, WalLimits::default()).unwrap();
    assert_eq!(r.earlier_identities, 0);
    // Segments covered by the snapshot are skipped, whoever wrote them.
    let (got, r) = read_all(
        tmp.path(),
        ident(2),
        Some(SegmentId(2)),
        WalLimits::default(),
    )
    .unwrap();
    assert!(got.is_empty());
    assert_eq!(r.segments, 0);
    let (got, _) = read_all(
        tmp.path(),
        ident(1),
        Some(SegmentId(1)),
        WalLimits::default(),
    )
    .unwrap();
    assert_eq!(got, [record(2), record(3)]);

    // A restart under a new identity: the old segments stay until the first snapshot
    // under the new one covers them, and the new identity's segment comes after.
    let (_, r) = read_all(tmp.path(), ident(1), None, WalLimits::default()).unwrap();
    let mut w = WalWriter::start(r, ident(2)).unwrap();
    let through = w.rotate();
    assert_eq!(segments(tmp.path()), [1, 2]);
    w.append(b"new".to_vec()).wait().unwrap();
    assert_eq!(w.remove_through(through).wait().unwrap(), 2);
    w.close();
    let (got, _) = read_all(tmp.path(), ident(2), Some(through), WalLimits::default()).unwrap();
    assert_eq!(got, [b"new".to_vec()]);
}

#[test]
fn remove_through_deletes_exactly_the_older_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer(tmp.path(), WalLimits::default());
    let mut ids = Vec::new();
    for i in 0..5 {
        w.append(record(i)).wait().unwrap();
        ids.push(w.rotate());
    }
    w.append(record(5)).wait().unwrap();
    assert_eq!(segments(tmp.path()), [1, 2, 3, 4, 5, 6]);
    assert_eq!(w.remove_through(ids[1]).wait().unwrap(), 2);
    assert_eq!(segments(tmp.path()), [3, 4, 5, 6]);
    assert_eq!(w.remove_through(ids[1]).wait().unwrap(), 0);
    // Never the segment being written, whatever the caller asks.
    assert_eq!(w.remove_through(SegmentId(u64::MAX)).wait().unwrap(), 3);
    assert_eq!(segments(tmp.path()), [6]);
    w.append(record(6)).wait().unwrap();
    let stats = w.stats();
    w.close();
    assert_eq!(stats.segments_removed.load(Ordering::Relaxed), 5);
    assert_eq!(stats.segments_created.load(Ordering::Relaxed), 6);
    assert_eq!(records_in(tmp.path()), [record(5), record(6)]);
}

/// A snapshot covered segments 1..=3 and removed them all; the next life (a clean restart)
/// writes after them, so its records are replayed, not skipped as covered.
#[test]
fn a_writer_after_a_snapshot_that_removed_every_segment_appends_beyond_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = writer(tmp.path(), WalLimits::default());
    for i in 0..3 {
        w.append(record(i)).wait().unwrap();
        w.rotate();
    }
    let covered = SegmentId(3);
    assert_eq!(w.remove_through(covered).wait().unwrap(), 3);
    w.close();
    assert!(segments(tmp.path()).is_empty());

    for life in 0..3 {
        let (_, r) = read_all(tmp.path(), ident(1), Some(covered), WalLimits::default()).unwrap();
        let w = WalWriter::start(r, ident(1)).unwrap();
        assert!(w.segment().0 > covered.0, "life {life}: {:?}", w.segment());
        w.append(record(10 + life)).wait().unwrap();
        w.close();
    }
    let (got, _) = read_all(tmp.path(), ident(1), Some(covered), WalLimits::default()).unwrap();
    assert_eq!(got, [record(10), record(11), record(12)]);
}

#[test]
fn quarantine_moves_the_log_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(WAL_DIR);
    for n in 0..2 {
        two_segments(&dir);
        let to = quarantine(&dir).unwrap();
        let name = if n == 0 {
            "wal.corrupt"
        } else {
            "wal.corrupt.1"
        };
        assert_eq!(to, tmp.path().join(name));
        assert_eq!(segments(&to), [1, 2]);
        assert!(!dir.exists());
    }
}

#[test]
fn a_pool_takes_at_least_one_thread_and_the_global_size_is_set_once() {
    assert!(matches!(WalPool::new(0), Err(WalPoolError::NoThreads)));
    assert!(matches!(
        WalPool::configure_global(0),
        Err(WalPoolError::NoThreads)
    ));
    let running = WalPool::global().unwrap().threads();
    WalPool::configure_global(running).unwrap();
    assert!(matches!(
        WalPool::configure_global(running + 1),
        Err(WalPoolError::AlreadyStarted { running: r, asked }) if r == running && asked == running + 1
    ));
    assert_eq!(WalPool::global().unwrap().threads(), running);
}

/// How many logs are open on the pool's threads.
fn open_logs(pool: &WalPool) -> usize {
    let workers = &pool.inner.workers;
    workers.iter().map(|w| w.logs.load(Ordering::Relaxed)).sum()
}

/// A writer holds nothing on the pool's threads until it is written: a rotation, a new
/// sync interval and the removal of older segments (a snapshot's, after a restart) leave
/// its log unopened; its first append opens it, at the segment the rotation moved to.
#[test]
fn a_log_opens_at_its_first_append() {
    let pool = WalPool::new(2).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    two_segments(tmp.path());
    let mut w = writer_in(&pool, tmp.path());
    w.set_sync_interval(Duration::from_millis(5));
    let covered = w.rotate();
    assert_eq!(covered, SegmentId(3));
    assert_eq!(w.remove_through(SegmentId(2)).wait().unwrap(), 2);
    assert_eq!(segments(tmp.path()), Vec::<u64>::new());
    assert_eq!(open_logs(&pool), 0);
    w.append_logged(record(7)).wait().unwrap();
    assert_eq!(open_logs(&pool), 1);
    assert_eq!(segments(tmp.path()), [4]);
    w.close();
    assert_eq!(open_logs(&pool), 0);
    assert_eq!(records_in(tmp.path()), [record(7)]);
    // Closed or dropped unopened: nothing to wait for, nothing left behind.
    writer_in(&pool, tmp.path()).close();
    drop(writer_in(&pool, tmp.path()));
    assert_eq!(open_logs(&pool), 0);
}

/// Logs sharing pool threads, their commands interleaved (with rotations, and rounds made
/// large by a hold): each log's records replay in the order they were appended.
#[test]
fn interleaved_logs_keep_their_order_and_replay() {
    const LOGS: usize = 40;
    let pool = WalPool::new(2).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..LOGS).map(|i| tmp.path().join(i.to_string())).collect();
    let mut writers: Vec<_> = dirs.iter().map(|d| writer_in(&pool, d)).collect();
    let mut expected = vec![Vec::new(); LOGS];
    let mut pending = Vec::new();
    let mut rng = fastrand::Rng::with_seed(23);
    // Both threads held: the first rounds gather appends of many logs.
    let mut holds = Some([writers[0].hold(), writers[1].hold()]);
    for n in 0..4000 {
        if n == 1000 {
            holds = None;
        }
        let i = rng.usize(..LOGS);
        if rng.u8(..50) == 0 {
            writers[i].rotate();
        }
        let rec = format!("log {i} record {n}").into_bytes();
        expected[i].push(rec.clone());
        pending.push(writers[i].append(rec));
        if holds.is_none() && rng.u8(..200) == 0 {
            // Wait for one now and then: later appends come in later rounds.
            let k = rng.usize(..pending.len());
            pending.swap_remove(k).wait().unwrap();
        }
    }
    for p in pending {
        p.wait().unwrap();
    }
    let mut appends = 0;
    for w in writers {
        appends += w.stats().appends.load(Ordering::Relaxed);
        w.close();
    }
    assert_eq!(appends, 4000);
    for (dir, expected) in dirs.iter().zip(&expected) {
        assert_eq!(&records_in(dir), expected, "{dir:?}");
    }
}

/// A log whose segment cannot be created (its directory replaced by a file: refused to
/// root too) fails its own appends; another log of the same thread and round succeeds.
#[test]
fn a_failing_log_does_not_fail_another_of_its_round() {
    let pool = WalPool::new(1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = writer_in(&pool, &a_dir);
    let b = writer_in(&pool, &b_dir);
    fs::remove_dir_all(&a_dir).unwrap();
    fs::write(&a_dir, b"not a directory").unwrap();
    let release = a.hold();
    let (mut pa, mut pb) = (Vec::new(), Vec::new());
    for i in 0..20 {
        pa.push(a.append(record(i)));
        pb.push(b.append(record(i)));
    }
    drop(release);
    for p in pa {
        assert!(matches!(p.wait(), Err(WalError::Io { .. })));
    }
    for p in pb {
        p.wait().unwrap();
    }
    // A stays failed; B goes on.
    assert!(matches!(
        a.append(record(20)).wait(),
        Err(WalError::Io { .. })
    ));
    b.append(record(20)).wait().unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.failures.load(Ordering::Relaxed), 21);
    assert_eq!(sa.appends.load(Ordering::Relaxed), 0);
    assert_eq!(sb.failures.load(Ordering::Relaxed), 0);
    assert_eq!(sb.appends.load(Ordering::Relaxed), 21);
    // The 20 of the shared round in one fsync, then the last one.
    assert_eq!(sb.fsyncs.load(Ordering::Relaxed), 2);
    a.close();
    b.close();
    assert_eq!(records_in(&b_dir), (0..21).map(record).collect::<Vec<_>>());
}

/// `close` of a log whose thread is busy with another log returns only once every append
/// queued before it completed; the other log goes on.
#[test]
fn closing_a_log_while_another_is_busy_completes_its_queue() {
    let pool = WalPool::new(1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = writer_in(&pool, &a_dir);
    let b = writer_in(&pool, &b_dir);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (busy_tx, busy_rx) = mpsc::channel();
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut pending = std::collections::VecDeque::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                pending.push_back(b.append(record(n)));
                n += 1;
                if n == 100 {
                    busy_tx.send(()).unwrap();
                }
                if pending.len() > 64 {
                    pending.pop_front().unwrap().wait().unwrap();
                }
            }
            for p in pending {
                p.wait().unwrap();
            }
            b.close();
            n
        })
    };
    busy_rx.recv().unwrap();
    let mut pa: Vec<_> = (0..500).map(|i| a.append(record(i))).collect();
    a.close();
    for (i, p) in pa.iter_mut().enumerate() {
        assert!(
            matches!(p.0.try_recv(), Ok(Ok(()))),
            "append {i} not complete when close returned"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let n = busy.join().unwrap();
    assert_eq!(records_in(&a_dir), (0..500).map(record).collect::<Vec<_>>());
    assert_eq!(records_in(&b_dir), (0..n).map(record).collect::<Vec<_>>());
}
