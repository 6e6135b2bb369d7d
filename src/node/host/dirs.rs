//! Where a catalog filter's data lives: one directory per incarnation
//! (`<name>.g<generation>`, its catalog entry kept in it, [`ENTRY_FILE`]), moved aside into
//! [`DROPPED_DIR`] when the filter is dropped, and matched with the catalog at the node's
//! start.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use futures::StreamExt;

use super::{CATALOG_CHANGES, Inner, PARALLEL_CHANGES};
use crate::names::is_subject_name;
use crate::node::follow::{DirStep, Offered, dir_step, offered_step};
use crate::transport::{Catalog, CatalogEntry};

/// Subject names longer than this get a hashed data directory ([`incarnation_dir`]): a
/// directory entry is at most 255 bytes on most file systems, and the generation (and, in
/// [`DROPPED_DIR`], the time of the drop) follow the name.
pub(super) const LONGEST_DIR_NAME: usize = 160;

/// The start of a hashed data directory's name (never a subject name's: those start with
/// `_k` or no `_`).
pub(super) const HASHED_DIR: &str = "_h";

/// `<name>.g<generation>`: the data directory of a catalog filter's incarnation; for a name
/// over [`LONGEST_DIR_NAME`] bytes, `_h<SHA-256 of the name, hex>.g<generation>` (its
/// [`ENTRY_FILE`] names the filter).
pub(super) fn incarnation_dir(name: &str, generation: u64) -> String {
    if name.len() <= LONGEST_DIR_NAME {
        return format!("{name}.g{generation}");
    }
    use sha2::Digest;
    let hash = sha2::Sha256::digest(name.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASHED_DIR}{hex}.g{generation}")
}

/// The name (or, for a hashed directory, its `_h<hash>` stem) and the generation of an
/// incarnation's data directory.
pub(super) fn parse_incarnation_dir(dir: &str) -> Option<(&str, u64)> {
    let (name, generation) = dir.rsplit_once(".g")?;
    let generation = generation.parse().ok()?;
    let hashed = name
        .strip_prefix(HASHED_DIR)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    ((is_subject_name(name) || hashed) && generation > 0).then_some((name, generation))
}

/// The filter of incarnation directory `dir` (`<base>/<dir>`), named `stem` and
/// `generation` by [`parse_incarnation_dir`]: the stem, or the name of a hashed
/// directory's entry file.
pub(super) fn incarnation_name(
    base: &Path,
    dir: &str,
    stem: &str,
    generation: u64,
) -> Option<String> {
    if !stem.starts_with(HASHED_DIR) {
        return Some(stem.to_string());
    }
    let bytes = std::fs::read(base.join(dir).join(ENTRY_FILE)).ok()?;
    let entry: CatalogEntry = serde_json::from_slice(&bytes).ok()?;
    (incarnation_dir(&entry.name, generation) == dir).then_some(entry.name)
}

/// Records `entry` in its incarnation's data directory ([`ENTRY_FILE`]).
pub(super) fn write_entry_file(
    dir: &Path,
    entry: &CatalogEntry,
) -> Result<(), crate::replica::DurableError> {
    crate::replica::durable::write_atomically(dir, ENTRY_FILE, &entry_file(entry))
}

/// What [`ENTRY_FILE`] holds for `entry`.
pub(super) fn entry_file(entry: &CatalogEntry) -> Vec<u8> {
    serde_json::to_vec_pretty(entry).expect("a catalog entry encodes")
}

/// The entry recorded in an incarnation's data directory, if it is there and is its own.
pub(super) fn read_entry_file(dir: &Path, name: &str, generation: u64) -> Option<CatalogEntry> {
    let bytes = std::fs::read(dir.join(ENTRY_FILE)).ok()?;
    let entry: CatalogEntry = serde_json::from_slice(&bytes).ok()?;
    (entry.name == name && entry.generation == generation).then_some(entry)
}

/// Writes `entry` into its incarnation's directory `dir` unless the file there holds it
/// already (compared as bytes: a restart reads it, and parsing it cost more than the rest
/// of a restore).
pub(super) fn record_entry(dir: &std::path::Path, entry: &CatalogEntry) {
    if std::fs::read(dir.join(ENTRY_FILE)).is_ok_and(|kept| kept == entry_file(entry)) {
        return;
    }
    if let Err(e) = write_entry_file(dir, entry) {
        tracing::warn!(filter = entry.name, error = %e, "could not record the catalog entry in the filter's data directory");
    }
}

/// Moves a dropped filter's data directory `<base>/<dir>` aside into [`DROPPED_DIR`].
pub(super) fn move_aside(base: &Path, dir: &str, why: &str) {
    let from = base.join(dir);
    if !from.exists() {
        return;
    }
    let kept = base.join(DROPPED_DIR);
    let to = kept.join(format!("{dir}.{}", crate::transport::catalog::now_ms()));
    let moved = std::fs::create_dir_all(&kept)
        .and_then(|()| std::fs::rename(&from, &to))
        .and_then(|()| crate::replica::group_sync::sync(&kept))
        .and_then(|()| crate::replica::group_sync::sync(base));
    match moved {
        Ok(()) => {
            tracing::info!(from = %from.display(), to = %to.display(), why, "moved a dropped filter's data aside")
        }
        Err(e) => {
            tracing::warn!(dir = %from.display(), error = %e, "could not move a dropped filter's data aside")
        }
    }
}

/// The incarnation directory and the time of the drop of an entry of [`DROPPED_DIR`].
pub(super) fn parse_dropped_dir(entry: &str) -> Option<(&str, u64)> {
    let (dir, at) = entry.rsplit_once('.')?;
    parse_incarnation_dir(dir)?;
    Some((dir, at.parse().ok()?))
}

/// The file of a catalog filter's data directory that keeps its catalog entry, so that the
/// node can offer the filter back to a catalog that lost it (or, without NATS, to the
/// in-process catalog of its next start).
pub const ENTRY_FILE: &str = "catalog-entry.json";

/// The folder of `node.data_dir` where dropped filters' directories are kept
/// (`<name>.g<generation>.<dropped at, ms since the epoch>`) for `catalog.drop_retention_ms`.
/// A dot: no filter name has one.
pub const DROPPED_DIR: &str = ".dropped";

impl Inner {
    /// Removes the dropped filters' directories kept longer than `catalog.drop_retention_ms`.
    pub(super) fn purge_dropped_dirs(&self) {
        let Some(base) = &self.data_dir else {
            return;
        };
        let Ok(kept) = std::fs::read_dir(base.join(DROPPED_DIR)) else {
            return;
        };
        let now = crate::transport::catalog::now_ms();
        for d in kept.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let Some((_, at)) = parse_dropped_dir(&name) else {
                continue;
            };
            if now.saturating_sub(at) < self.settings.drop_retention_ms {
                continue;
            }
            match std::fs::remove_dir_all(d.path()) {
                Ok(()) => {
                    tracing::info!(dir = %d.path().display(), "removed a dropped filter's data after its retention")
                }
                Err(e) => {
                    tracing::warn!(dir = %d.path().display(), error = %e, "could not remove a dropped filter's kept data")
                }
            }
        }
    }

    /// Matches the catalog filters' data directories with the catalog at the start: a
    /// directory whose drop the catalog recorded (its generation dropped, or replaced by a
    /// create that followed that drop) is moved aside; one the catalog does not know is
    /// offered back to it with the entry kept in it. Answers the entries offered back, to be
    /// hosted as the listed ones are.
    pub(super) async fn reconcile_dirs(
        &self,
        catalog: &Arc<dyn Catalog>,
        listing: &crate::transport::Listing,
    ) -> Vec<CatalogEntry> {
        let Some(base) = self.data_dir.clone() else {
            return Vec::new();
        };
        let Ok(dirs) = std::fs::read_dir(&base) else {
            return Vec::new();
        };
        let live: HashMap<&str, &CatalogEntry> =
            listing.live.iter().map(|e| (e.name.as_str(), e)).collect();
        let mut unknown = Vec::new();
        for d in dirs.flatten() {
            let dir = d.file_name().to_string_lossy().into_owned();
            let Some((stem, generation)) = parse_incarnation_dir(&dir) else {
                continue;
            };
            let Some(name) = incarnation_name(&base, &dir, stem, generation) else {
                tracing::warn!(
                    dir = %d.path().display(),
                    "a hashed filter directory without its entry: kept, not hosted"
                );
                continue;
            };
            let name = name.as_str();
            // A hosted generation's record is the follow's to act on (a drop stops its
            // replica before its directory moves).
            let hosted = || {
                let table = self.table.read().expect("table lock");
                table
                    .hosted(name)
                    .is_some_and(|h| h.generation == generation)
            };
            if self.configured.contains(name) || hosted() {
                continue;
            }
            match dir_step(
                generation,
                live.get(name).copied(),
                listing.dropped.get(name).copied(),
            ) {
                DirStep::Listed => continue,
                DirStep::Dropped => {
                    move_aside(&base, &dir, "dropped while this node was down");
                    continue;
                }
                DirStep::Superseded => {
                    move_aside(&base, &dir, "created anew while the catalog had lost it");
                    continue;
                }
                DirStep::Offer => {}
            }
            match read_entry_file(&d.path(), name, generation) {
                Some(entry) => unknown.push((dir, entry)),
                None => tracing::warn!(
                    dir = %d.path().display(),
                    "the catalog does not list this filter and its directory has no entry to offer back: kept, not hosted"
                ),
            }
        }
        let offers = unknown.into_iter().map(|(dir, entry)| {
            let catalog = catalog.clone();
            async move { (dir, entry.clone(), catalog.reoffer(entry).await) }
        });
        let mut offers = futures::stream::iter(offers).buffer_unordered(PARALLEL_CHANGES);
        let mut restored_entries = Vec::new();
        while let Some((dir, entry, answer)) = offers.next().await {
            let restored = matches!(answer, Ok(crate::transport::Reoffered::Restored));
            match answer.map(|answer| offered_step(&entry, answer)) {
                Ok(Offered::Host(e)) => {
                    if restored {
                        metrics::counter!(CATALOG_CHANGES, "change" => "offered_back").increment(1);
                        tracing::info!(
                            filter = entry.name,
                            generation = entry.generation,
                            "offered a filter the catalog did not list back to it"
                        );
                    }
                    restored_entries.push(e);
                }
                Ok(Offered::Dropped) => {
                    move_aside(&base, &dir, "dropped while this node was down");
                }
                Ok(Offered::Superseded) => {
                    move_aside(&base, &dir, "created anew while the catalog had lost it");
                }
                Ok(Offered::Kept(listed)) => {
                    tracing::warn!(
                        filter = entry.name,
                        kept = entry.generation,
                        listed,
                        "the catalog lists another incarnation of a filter this node has data of: kept, not hosted"
                    );
                }
                Err(e) => {
                    tracing::warn!(filter = entry.name, error = %e, "could not offer a filter back to the catalog: its data is kept");
                }
            }
        }
        restored_entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnation_dirs_round_trip_and_configured_dirs_are_not_taken_for_them() {
        assert_eq!(incarnation_dir("tenant-7", 42), "tenant-7.g42");
        assert_eq!(
            parse_incarnation_dir("tenant-7.g42"),
            Some(("tenant-7", 42))
        );
        assert_eq!(parse_incarnation_dir("a.g1.g2"), None);
        for configured in [
            "sessions", "gauges", "x.g0", "x.gx", ".g5", "_x.g1", "_h12.g1",
        ] {
            assert_eq!(parse_incarnation_dir(configured), None, "{configured}");
        }
        // Keys of any bytes: their subject names; past 160 bytes, a hash that fits a file
        // name with the generation and a drop time after it.
        let name = crate::names::subject_name(b"bf:users:2026");
        let dir = incarnation_dir(&name, 3);
        assert_eq!(parse_incarnation_dir(&dir), Some((&*name, 3)));
        let long = crate::names::subject_name(&[0xFF; crate::names::MAX_KEY_BYTES]);
        let dir = incarnation_dir(&long, u64::MAX);
        assert!(dir.len() + ".1234567890123".len() < 255, "{dir}");
        let (stem, g) = parse_incarnation_dir(&dir).unwrap();
        assert!(stem.starts_with(HASHED_DIR) && g == u64::MAX);
        assert_ne!(
            dir,
            incarnation_dir(&crate::names::subject_name(&[0xFE; 1024]), u64::MAX)
        );
    }
}
