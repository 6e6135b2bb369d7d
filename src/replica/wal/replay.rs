//! Reading a log back: [`replay`] after a snapshot, and [`quarantine`] for a log that cannot be.

use super::*;

/// What [`replay`] found; hand it to [`WalWriter::start`].
#[derive(Debug)]
#[must_use = "start the writer with it"]
pub struct Replayed {
    /// Segments read (not counting those skipped as covered by the snapshot).
    pub segments: usize,
    /// Records passed to the callback.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes of a torn tail cut off (0 if the log ended cleanly).
    pub torn_bytes: u64,
    /// Whether a torn tail was cut off (a segment removed or truncated).
    pub torn: bool,
    /// Damaged regions skipped (a frame or segment header that fails its checksum, not at
    /// the torn tail): the replay went on at the next frame that checks.
    pub damaged_regions: u64,
    /// Their bytes.
    pub damaged_bytes: u64,
    /// Segments written under another identity than the one expected (see [`replay`]).
    pub earlier_identities: u64,
    pub(super) dir: PathBuf,
    pub(super) next: u64,
    pub(super) limits: WalLimits,
    pub(super) disk: Arc<dyn Disk>,
}

impl Replayed {
    /// The segment a writer of this log starts at: after every segment on disk and every
    /// segment the snapshot covers.
    pub(crate) fn next_segment(&self) -> u64 {
        self.next
    }
}

/// Replays the log in `dir` (created if missing): passes every record of every segment above
/// `covered_through`, in order, to `on_record`. A segment written under another identity
/// than `expected` is replayed too, and counted ([`Replayed::earlier_identities`]): the
/// directory's replica wrote it under an identity it held before its newest snapshot's (a
/// replica that starts under a new id serves before its first snapshot is saved, and a crash
/// then leaves the older snapshot, or none, in front of that identity's segments). Cuts off
/// a torn tail (see the module doc). On an error, the records passed so far were sound
/// (checksummed); the log should be moved aside ([`quarantine`]).
pub fn replay(
    dir: impl Into<PathBuf>,
    expected: Identity,
    covered_through: Option<SegmentId>,
    limits: WalLimits,
    on_record: impl FnMut(&[u8]),
) -> Result<Replayed, DurableError> {
    replay_on(
        disk::real(),
        dir,
        expected,
        covered_through,
        limits,
        on_record,
    )
}

/// [`replay`] of a log on `disk`.
pub(crate) fn replay_on(
    disk: Arc<dyn Disk>,
    dir: impl Into<PathBuf>,
    expected: Identity,
    covered_through: Option<SegmentId>,
    limits: WalLimits,
    mut on_record: impl FnMut(&[u8]),
) -> Result<Replayed, DurableError> {
    let dir = dir.into();
    // Listed first: a directory that is there (every start but a new replica's) costs no
    // look before it is read.
    let segments = match list_segments_io(&*disk, &dir) {
        Ok(segments) => segments,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_dir(&*disk, &dir)?;
            BTreeMap::new()
        }
        Err(e) => return Err(io_err(&dir)(e)),
    };
    // After every segment on disk, and after every segment the snapshot covers: a snapshot
    // that removed the segments it covers leaves none to count from, and a writer that
    // started again at 1 appended to segments the next replay skips as covered (acknowledged
    // `durable` adds lost at the crash after a clean restart).
    let next = segments
        .keys()
        .next_back()
        .map_or(1, |id| id + 1)
        .max(covered_through.map_or(1, |c| c.0 + 1));
    #[cfg(test)]
    let next = match OLD_WRITER_START.get() {
        // The rule before issue 47's fix, for the simulation to show it finds that defect.
        true => segments.keys().next_back().map_or(1, |id| id + 1),
        false => next,
    };
    let mut out = Replayed {
        segments: 0,
        records: 0,
        bytes: 0,
        torn_bytes: 0,
        torn: false,
        damaged_regions: 0,
        damaged_bytes: 0,
        earlier_identities: 0,
        dir,
        next,
        limits,
        disk,
    };
    let last = segments.keys().next_back().copied();
    let disk = out.disk.clone();
    for (&id, path) in &segments {
        if covered_through.is_some_and(|c| id <= c.0) {
            continue;
        }
        out.segments += 1;
        let scan = Scan {
            disk: &*disk,
            path,
            id,
            last: Some(id) == last,
            expected,
            limits,
        };
        scan.run(&mut out, &mut on_record)?;
    }
    if out.torn {
        // The last segment was cut (and synced) or removed.
        out.disk.sync_path(&out.dir).map_err(io_err(&out.dir))?;
    } else if let Some(path) = last
        .filter(|l| covered_through.is_none_or(|c| *l > c.0))
        .and_then(|l| segments.get(&l))
    {
        // The torn-tail rule holds only if the last segment alone may hold unsynced frames:
        // the logged frames a crashed process left in the page cache were just replayed, and
        // the writer is about to begin a segment after them. Synced now, they cannot come
        // back torn in the middle of the log after a loss of power (which read as damage,
        // and the log, durable adds after it included, was moved aside). Its name too: a
        // crashed process may have begun it with logged frames only, never synced, and an
        // update of the next life that changes nothing rests on what it holds.
        disk.sync_path(path).map_err(io_err(path))?;
        out.disk.sync_path(&out.dir).map_err(io_err(&out.dir))?;
    }
    Ok(out)
}

#[cfg(test)]
thread_local! {
    /// Starts the writer after the segments on disk only, ignoring what the snapshot covers
    /// (the defect fixed in `23b0a2f`), on this thread.
    pub(crate) static OLD_WRITER_START: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Moves a log that cannot be replayed aside (kept for inspection): `wal` becomes
/// `wal.corrupt`, or `wal.corrupt.N` if that exists. Returns the new path.
pub fn quarantine(dir: &Path) -> Result<PathBuf, DurableError> {
    quarantine_on(&*disk::real(), dir)
}

/// [`quarantine`] of a log on `disk`.
pub(crate) fn quarantine_on(disk: &dyn Disk, dir: &Path) -> Result<PathBuf, DurableError> {
    let name = dir
        .file_name()
        .map_or_else(|| WAL_DIR.into(), |n| n.to_string_lossy().into_owned());
    let to = (0..)
        .map(|n| match n {
            0 => dir.with_file_name(format!("{name}.corrupt")),
            n => dir.with_file_name(format!("{name}.corrupt.{n}")),
        })
        .find(|p| !disk.exists(p))
        .expect("an unused name");
    disk.rename(dir, &to).map_err(io_err(dir))?;
    if let Some(parent) = to.parent() {
        disk.sync_path(parent).map_err(io_err(parent))?;
    }
    tracing::warn!(from = ?dir, to = ?to, "write-ahead log moved aside");
    Ok(to)
}

/// The outcome of reading one frame.
pub(super) enum Step {
    /// A sound frame, ending at this offset.
    Frame(u64),
    /// The torn tail starts here.
    Torn,
    /// A frame that does not check in a way a torn write can explain (a blank or damaged
    /// header, a wrong body checksum): the torn tail if nothing after it checks, else damage.
    Unreadable(String),
}

/// Reads one segment.
pub(super) struct Scan<'a> {
    disk: &'a dyn Disk,
    path: &'a Path,
    id: u64,
    last: bool,
    expected: Identity,
    limits: WalLimits,
}

impl Scan<'_> {
    pub(super) fn corrupt(&self, offset: u64, reason: impl std::fmt::Display) -> DurableError {
        DurableError::Corrupt {
            path: self.path.to_path_buf(),
            reason: format!("at byte {offset}: {reason}"),
        }
    }

    /// Whether the bytes from `offset` to the end can be the image of one interrupted write:
    /// only in the last segment, and never more than one frame.
    pub(super) fn may_be_torn(&self, offset: u64, file_len: u64, extra: usize) -> bool {
        self.last && file_len - offset <= (extra + FRAME_HEADER + self.limits.max_frame()) as u64
    }

    pub(super) fn run(
        &self,
        out: &mut Replayed,
        on_record: &mut impl FnMut(&[u8]),
    ) -> Result<(), DurableError> {
        let io = io_err(self.path);
        let (file, file_len) = self.disk.open_read(self.path).map_err(&io)?;
        let mut r = BufReader::with_capacity(1 << 16, file);

        let mut head = [0u8; SEGMENT_HEADER];
        let got = read_up_to(&mut r, &mut head).map_err(&io)?;
        // A blank header with nothing sound after it: created, then lost with every frame
        // written to it (only logged frames can be more than one).
        let blank = || -> Result<bool, DurableError> {
            Ok(is_zero(&head)
                && (self.may_be_torn(0, file_len, SEGMENT_HEADER)
                    || (self.last
                        && self
                            .next_sound_frame(SEGMENT_HEADER as u64, file_len)?
                            .is_none())))
        };
        if got < SEGMENT_HEADER || blank()? {
            if self.last {
                // Created, but its first group commit never completed.
                tracing::warn!(segment = ?self.path, bytes = file_len, "removing a torn write-ahead log segment");
                self.disk.remove_file(self.path).map_err(&io)?;
                out.torn_bytes += file_len;
                out.torn = true;
                return Ok(());
            }
            // Not the last, yet never synced: no frame in it ever was (an fsync makes its
            // header durable with it), and a later sync of the directory kept its name. A
            // crash of the process right after a snapshot was renamed, before the directory
            // was synced, lets the next life trust that snapshot and write segments after
            // this one; a loss of power then brings the older snapshot back, and this
            // segment sits in the middle of the log. Nothing in it was acknowledged beyond
            // `logged`: skipped.
            let holds_frames = got == SEGMENT_HEADER
                && self
                    .next_sound_frame(SEGMENT_HEADER as u64, file_len)?
                    .is_some();
            if !holds_frames {
                tracing::warn!(segment = ?self.path, bytes = file_len,
                    "skipping a write-ahead log segment that was never synced");
                out.torn_bytes += file_len;
                return Ok(());
            }
            return Err(self.corrupt(0, "incomplete or blank segment header"));
        }
        match self.check_header(&head) {
            // Written by this directory's replica under an identity it held before it saved
            // a snapshot under its present one (a start under a new id serves before its
            // first snapshot is saved): its records are this filter's all the same.
            Ok(found) if found != self.expected => {
                tracing::info!(segment = ?self.path, ?found, expected = ?self.expected,
                    "write-ahead log segment of an earlier identity of this replica: replayed");
                out.earlier_identities += 1;
            }
            Ok(_) => {}
            // A header that fails its own checksum is damage: its frames are checksummed
            // records of this directory's log, kept.
            Err(e @ DurableError::Corrupt { .. }) if header_damaged(&head) => {
                tracing::warn!(segment = ?self.path, error = %e, "damaged write-ahead log segment header: skipping it, keeping the frames after it");
                out.damaged_regions += 1;
                out.damaged_bytes += SEGMENT_HEADER as u64;
            }
            Err(e) => return Err(e),
        }

        let mut offset = SEGMENT_HEADER as u64;
        let mut body = Vec::new();
        while offset < file_len {
            let (reason, tearable) = match self.frame(&mut r, offset, file_len, &mut body) {
                Ok(Step::Frame(end)) => {
                    self.records(&body, offset, out, on_record)?;
                    offset = end;
                    continue;
                }
                Ok(Step::Torn) => return self.cut(offset, file_len, out),
                Ok(Step::Unreadable(reason)) => (reason, true),
                Err(DurableError::Corrupt { reason, .. }) => (reason, false),
                Err(e) => return Err(e),
            };
            let next = self.next_sound_frame(offset + 1, file_len)?;
            if next.is_none() && tearable && self.last {
                // Frames written since the last fsync (logged appends), partly written back
                // before the machine crashed: nothing after them checks.
                return self.cut(offset, file_len, out);
            }
            // Damage in the middle: go on at the next frame that checks.
            let to = next.unwrap_or(file_len);
            tracing::warn!(
                segment = ?self.path, offset, skipped = to - offset, reason,
                "damaged write-ahead log frame: skipped to the next frame that checks"
            );
            out.damaged_regions += 1;
            out.damaged_bytes += to - offset;
            offset = to;
            let (mut file, _) = self.disk.open_read(self.path).map_err(&io)?;
            file.seek(std::io::SeekFrom::Start(offset)).map_err(&io)?;
            r = BufReader::with_capacity(1 << 16, file);
        }
        Ok(())
    }

    /// Cuts the torn tail off at `offset`.
    pub(super) fn cut(
        &self,
        offset: u64,
        file_len: u64,
        out: &mut Replayed,
    ) -> Result<(), DurableError> {
        let io = io_err(self.path);
        let cut = file_len - offset;
        tracing::warn!(
            segment = ?self.path, offset, bytes = cut,
            "cutting a torn write-ahead log tail (never acknowledged, or logged and not synced)"
        );
        let mut f = self.disk.open_write(self.path).map_err(&io)?;
        f.set_len(offset).map_err(&io)?;
        f.sync_all().map_err(&io)?;
        out.torn_bytes += cut;
        out.torn = true;
        Ok(())
    }

    /// Reads the frame at `offset` into `body`.
    pub(super) fn frame(
        &self,
        r: &mut impl Read,
        offset: u64,
        file_len: u64,
        body: &mut Vec<u8>,
    ) -> Result<Step, DurableError> {
        let torn = |why: &str| {
            if self.last {
                Ok(Step::Torn)
            } else {
                Err(self.corrupt(offset, why))
            }
        };
        let remain = file_len - offset;
        if remain < FRAME_HEADER as u64 {
            return torn("incomplete frame header");
        }
        let mut fh = [0u8; FRAME_HEADER];
        r.read_exact(&mut fh).map_err(io_err(self.path))?;
        let len = u32::from_le_bytes(fh[..4].try_into().expect("4 bytes")) as usize;
        let sum = u64::from_le_bytes(fh[4..12].try_into().expect("8 bytes"));
        if is_zero(&fh) {
            // Space a crash left unwritten (never a frame: frames are not empty).
            return if self.may_be_torn(offset, file_len, 0) {
                Ok(Step::Torn)
            } else {
                Ok(Step::Unreadable(format!("at byte {offset}: empty frame")))
            };
        }
        if frame_check(&fh[..12]) != fh[12..] {
            return Ok(Step::Unreadable(format!(
                "at byte {offset}: frame header checksum mismatch"
            )));
        }
        if len == 0 || len > self.limits.max_frame() {
            return Err(self.corrupt(offset, format_args!("frame of {len} bytes")));
        }
        if (FRAME_HEADER + len) as u64 > remain {
            return torn("incomplete frame");
        }
        body.resize(len, 0);
        r.read_exact(body).map_err(io_err(self.path))?;
        let end = offset + (FRAME_HEADER + len) as u64;
        if xxh3_64(body) != sum {
            return if end == file_len {
                torn("checksum mismatch")
            } else {
                Ok(Step::Unreadable(format!(
                    "at byte {offset}: checksum mismatch"
                )))
            };
        }
        Ok(Step::Frame(end))
    }

    /// The offset of the first frame at or after `from` whose header and body check (the
    /// frame header's own checksum finds candidates; 1 in 2^32 of random bytes pass it, and
    /// the body checksum settles those); `None` if there is none before the end.
    pub(super) fn next_sound_frame(
        &self,
        from: u64,
        file_len: u64,
    ) -> Result<Option<u64>, DurableError> {
        let io = io_err(self.path);
        let (mut file, _) = self.disk.open_read(self.path).map_err(&io)?;
        file.seek(std::io::SeekFrom::Start(from)).map_err(&io)?;
        let mut rest = Vec::with_capacity((file_len - from) as usize);
        file.read_to_end(&mut rest).map_err(&io)?;
        for at in 0..rest.len().saturating_sub(FRAME_HEADER - 1) {
            let fh = &rest[at..at + FRAME_HEADER];
            if is_zero(fh) || frame_check(&fh[..12]) != fh[12..] {
                continue;
            }
            let len = u32::from_le_bytes(fh[..4].try_into().expect("4 bytes")) as usize;
            let sum = u64::from_le_bytes(fh[4..12].try_into().expect("8 bytes"));
            let body = at + FRAME_HEADER;
            if len == 0 || len > self.limits.max_frame() || body + len > rest.len() {
                continue;
            }
            if xxh3_64(&rest[body..body + len]) == sum {
                return Ok(Some(from + at as u64));
            }
        }
        Ok(None)
    }

    /// Checks a segment header; answers whose segment it is.
    pub(super) fn check_header(&self, h: &[u8; SEGMENT_HEADER]) -> Result<Identity, DurableError> {
        let (content, sum) = h.split_at(SEGMENT_HEADER - 8);
        if &h[..8] != MAGIC {
            return Err(self.corrupt(0, "not a write-ahead log segment (bad magic)"));
        }
        if h[8] != VERSION {
            return Err(self.corrupt(0, format_args!("segment version {}", h[8])));
        }
        if xxh3_64(content).to_le_bytes() != sum {
            return Err(self.corrupt(0, "segment header checksum mismatch"));
        }
        let uuid = Uuid::from_bytes(h[9..25].try_into().expect("16 bytes"));
        let replica =
            ReplicaId::from_le_bytes(h[25..25 + REPLICA_BYTES].try_into().expect("replica id"));
        let at = 25 + REPLICA_BYTES;
        let id = u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        if id != self.id {
            return Err(self.corrupt(0, format_args!("header of segment {id}")));
        }
        Ok(Identity { uuid, replica })
    }

    pub(super) fn records(
        &self,
        mut body: &[u8],
        offset: u64,
        out: &mut Replayed,
        on_record: &mut impl FnMut(&[u8]),
    ) -> Result<(), DurableError> {
        // The body checked: a bad structure here is a bug or a foreign writer, not a crash.
        while !body.is_empty() {
            if body.len() < RECORD_HEADER {
                return Err(self.corrupt(offset, "truncated record length"));
            }
            let (len, rest) = body.split_at(RECORD_HEADER);
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            if len > self.limits.max_record() || len > rest.len() {
                return Err(self.corrupt(offset, format_args!("record of {len} bytes")));
            }
            let (record, rest) = rest.split_at(len);
            on_record(record);
            out.records += 1;
            out.bytes += len as u64;
            body = rest;
        }
        Ok(())
    }
}
