//! The on-disk format: segment headers, frame checks, segment names, and the file helpers.

use super::*;

/// Best effort, so that an unacknowledged frame is not in the way of a later writer; the
/// writer is poisoned either way.
pub(super) fn roll_back(file: &mut dyn DiskFile, len: u64) {
    let _ = file.set_len(len).and_then(|()| file.sync_all());
}

pub(super) fn segment_header(identity: Identity, id: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8] = VERSION;
    h[9..25].copy_from_slice(identity.uuid.as_bytes());
    h[25..25 + REPLICA_BYTES].copy_from_slice(&identity.replica.to_le_bytes());
    let at = 25 + REPLICA_BYTES;
    h[at..at + 8].copy_from_slice(&id.to_le_bytes());
    let sum = xxh3_64(&h[..at + 8]);
    h[at + 8..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The frame header's own checksum, of its first 12 bytes.
/// Whether a segment header fails its own checksum (damage), as opposed to a sound header
/// that names another segment or identity.
pub(super) fn header_damaged(h: &[u8; SEGMENT_HEADER]) -> bool {
    let (content, sum) = h.split_at(SEGMENT_HEADER - 8);
    xxh3_64(content).to_le_bytes() != sum
}

pub(super) fn frame_check(head: &[u8]) -> [u8; 4] {
    (xxh3_64(head) as u32).to_le_bytes()
}

pub(super) fn segment_name(id: u64) -> String {
    format!("{}.log", SegmentId(id))
}

pub(super) fn list_segments_io(disk: &dyn Disk, dir: &Path) -> io::Result<BTreeMap<u64, PathBuf>> {
    let mut out = BTreeMap::new();
    for name in disk.list_dir(dir)? {
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        if stem.len() == 20
            && stem.bytes().all(|b| b.is_ascii_digit())
            && let Ok(id) = stem.parse()
        {
            out.insert(id, dir.join(&name));
        }
    }
    Ok(out)
}

pub(super) fn create_dir(disk: &dyn Disk, dir: &Path) -> Result<(), DurableError> {
    if disk.is_dir(dir) {
        return Ok(());
    }
    disk.create_dir_all(dir).map_err(io_err(dir))?;
    // The new directory's entry must be durable before a segment in it is.
    if let Some(parent) = dir.parent() {
        disk.sync_path(parent).map_err(io_err(parent))?;
    }
    Ok(())
}

pub(super) fn io_err(path: &Path) -> impl Fn(io::Error) -> DurableError + '_ {
    move |source| DurableError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Reads until `buf` is full or the end of the file; answers how many bytes were read.
pub(super) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
