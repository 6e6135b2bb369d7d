//! What a node does with the catalog's records, decided without I/O: the rules that keep a
//! filter hosted until a key holder drops it, whatever the store loses or a stranger writes.
//! `host/following.rs` and `host/dirs.rs` carry the decisions out; the simulation
//! (`crate::sim::catalog`) steps them against a store that loses everything and strangers
//! that write, delete and replay.

use crate::transport::catalog::chosen_generation;
use crate::transport::{CatalogChange, CatalogEntry, Reoffered};

/// Whether `entry` follows the drop of the `generation` a node holds: only then does it take
/// the name from that generation (a sealed entry written again later, a replay, names the
/// drop it followed when it was first written, not the one since).
pub(crate) fn follows_drop_of(entry: &CatalogEntry, generation: u64) -> bool {
    entry.generation > generation && entry.replaces.is_some_and(|r| r >= generation)
}

/// Whether `entry` takes the name from the `generation` a node holds: it follows that
/// generation's drop, or a key holder created the name anew while the catalog had lost the
/// held one (its generation, chosen by its create and sealed, is later; the held one's data
/// is moved aside, not deleted). A later generation that is a store's revision (a record of
/// before generations were chosen) may be a replay written again: only its drop counts.
pub(crate) fn supersedes(entry: &CatalogEntry, generation: u64) -> bool {
    follows_drop_of(entry, generation)
        || (entry.generation > generation && chosen_generation(entry.generation))
}

/// What to do with a change of the catalog's watch for a name this node hosts at
/// `hosted` (its generation; `None`: not hosted).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FollowStep {
    /// Nothing: a configured filter (the file decides), an older generation, or a drop of
    /// nothing this node hosts.
    Nothing,
    /// Host the entry (nothing of the name is hosted).
    Host,
    /// The generation hosted: its expiry may have changed.
    Refresh,
    /// Stop the hosted generation (a key holder dropped it), then host the entry.
    Replace,
    /// Stop the hosted generation, which a key holder dropped.
    Unhost,
    /// Count a record nobody may act on and offer what is hosted back to the catalog.
    Reject(&'static str),
}

/// The step for `change` of the catalog (`configured`: the name is in the node's file).
pub(crate) fn follow_step(
    hosted: Option<u64>,
    configured: bool,
    change: &CatalogChange,
) -> FollowStep {
    match change {
        CatalogChange::Current => FollowStep::Nothing,
        CatalogChange::Rejected { reason, .. } => FollowStep::Reject(reason),
        _ if configured => FollowStep::Nothing,
        CatalogChange::Put(entry) => match hosted {
            None => FollowStep::Host,
            Some(g) if g == entry.generation => FollowStep::Refresh,
            // The catalog has an older record than the one hosted (written again over it,
            // or a lost store's record created meanwhile): the hosted one is offered back.
            Some(g) if g > entry.generation => FollowStep::Reject("older_than_hosted"),
            Some(g) if supersedes(entry, g) => FollowStep::Replace,
            Some(_) => FollowStep::Reject("replaced_without_drop"),
        },
        CatalogChange::Dropped { generation, .. } => match hosted {
            Some(g) if generation.is_none_or(|d| g <= d) => FollowStep::Unhost,
            // The drop of an older generation than the one hosted: the catalog's record of
            // the hosted one is gone (written over by a record of before): offered back.
            Some(_) => FollowStep::Reject("older_than_hosted"),
            None => FollowStep::Nothing,
        },
    }
}

/// What a starting node does with the data directory of `name`'s `generation`, given what
/// the catalog's listing holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DirStep {
    /// The listing has this generation: it is hosted as listed.
    Listed,
    /// A key holder dropped it while the node was down: move it aside.
    Dropped,
    /// A key holder created the name anew while the catalog had lost it: move it aside.
    Superseded,
    /// The catalog does not know it (lost, or a record nobody may act on): offer it back.
    Offer,
}

/// The step for a data directory of a name's `generation`, given the catalog's live entry
/// of the name (`listed`) and the generation whose drop it recorded (`dropped`).
pub(crate) fn dir_step(
    generation: u64,
    listed: Option<&CatalogEntry>,
    dropped: Option<u64>,
) -> DirStep {
    match listed {
        Some(e) if e.generation == generation => return DirStep::Listed,
        Some(e) if follows_drop_of(e, generation) => return DirStep::Dropped,
        Some(e) if supersedes(e, generation) => return DirStep::Superseded,
        _ => {}
    }
    if dropped.is_some_and(|g| g >= generation) {
        return DirStep::Dropped;
    }
    DirStep::Offer
}

/// What became of a directory offered back at a start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Offered {
    /// Host this entry (restored, or listed with the directory's generation).
    Host(CatalogEntry),
    /// Dropped by a key holder: move it aside.
    Dropped,
    /// A key holder created the name anew while the catalog had lost it: move it aside.
    Superseded,
    /// The catalog lists a later generation (this one) that may be a replay (a revision,
    /// not chosen by its create) and does not follow its drop: keep the data, host nothing
    /// of it.
    Kept(u64),
}

/// The step after offering `entry` (a directory's) back and hearing `answer`.
pub(crate) fn offered_step(entry: &CatalogEntry, answer: Reoffered) -> Offered {
    match answer {
        Reoffered::Restored => Offered::Host(entry.clone()),
        Reoffered::Dropped(_) => Offered::Dropped,
        Reoffered::Listed(e) if follows_drop_of(&e, entry.generation) => Offered::Dropped,
        Reoffered::Listed(e) if supersedes(&e, entry.generation) => Offered::Superseded,
        Reoffered::Listed(e) if e.generation == entry.generation => Offered::Host(e),
        Reoffered::Listed(e) => Offered::Kept(e.generation),
    }
}

/// Whether a hosted filter that a new watch's first part has no record of is offered back:
/// the catalog lost it (a lost store). Configured filters are the file's.
pub(crate) fn lost_by_catalog(recorded: bool, configured: bool) -> bool {
    !recorded && !configured
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FilterSpec;

    fn entry(generation: u64, replaces: Option<u64>) -> CatalogEntry {
        CatalogEntry {
            name: "f".into(),
            spec: FilterSpec::new(crate::wire::FilterKind::GBloom, 1000, 0.01),
            generation,
            created_ms: 0,
            replaces,
            expires_ms: None,
        }
    }

    #[test]
    fn a_later_generation_takes_the_name_only_after_the_drop_of_the_hosted_one() {
        let put = |g, r| CatalogChange::Put(entry(g, r));
        assert_eq!(follow_step(None, false, &put(5, None)), FollowStep::Host);
        assert_eq!(
            follow_step(Some(5), false, &put(5, None)),
            FollowStep::Refresh
        );
        assert_eq!(
            follow_step(Some(6), false, &put(5, None)),
            FollowStep::Reject("older_than_hosted")
        );
        assert_eq!(
            follow_step(Some(5), false, &put(9, Some(5))),
            FollowStep::Replace
        );
        assert_eq!(
            follow_step(Some(5), false, &put(9, Some(4))),
            FollowStep::Reject("replaced_without_drop")
        );
        assert_eq!(
            follow_step(Some(5), true, &put(9, Some(5))),
            FollowStep::Nothing
        );
        // A generation chosen by its create (and sealed) is a key holder's: it takes the name
        // without a drop (the store had lost the hosted one), where a revision may be a replay.
        let chosen = crate::transport::catalog::CHOSEN_GENERATIONS;
        assert_eq!(
            follow_step(Some(5), false, &put(chosen, None)),
            FollowStep::Replace
        );
        assert_eq!(
            follow_step(Some(chosen + 1), false, &put(chosen, None)),
            FollowStep::Reject("older_than_hosted")
        );
    }

    #[test]
    fn a_drop_stops_its_generation_and_older_ones_only() {
        let dropped = |g| CatalogChange::Dropped {
            name: "f".into(),
            generation: g,
        };
        assert_eq!(
            follow_step(Some(5), false, &dropped(Some(5))),
            FollowStep::Unhost
        );
        assert_eq!(
            follow_step(Some(5), false, &dropped(Some(7))),
            FollowStep::Unhost
        );
        assert_eq!(
            follow_step(Some(5), false, &dropped(Some(4))),
            FollowStep::Reject("older_than_hosted")
        );
        assert_eq!(
            follow_step(Some(5), false, &dropped(None)),
            FollowStep::Unhost
        );
        assert_eq!(
            follow_step(None, false, &dropped(Some(5))),
            FollowStep::Nothing
        );
        assert_eq!(
            follow_step(Some(5), true, &dropped(Some(5))),
            FollowStep::Nothing
        );
        let rejected = CatalogChange::Rejected {
            name: "f".into(),
            reason: "unsigned_drop",
        };
        assert_eq!(
            follow_step(Some(5), false, &rejected),
            FollowStep::Reject("unsigned_drop")
        );
    }

    #[test]
    fn a_start_keeps_what_the_catalog_does_not_know_and_offers_it_back() {
        assert_eq!(dir_step(5, None, None), DirStep::Offer);
        assert_eq!(dir_step(5, Some(&entry(5, None)), None), DirStep::Listed);
        assert_eq!(dir_step(4, Some(&entry(5, None)), None), DirStep::Offer);
        assert_eq!(
            dir_step(4, Some(&entry(9, Some(4))), None),
            DirStep::Dropped
        );
        assert_eq!(dir_step(4, None, Some(4)), DirStep::Dropped);
        assert_eq!(dir_step(5, None, Some(4)), DirStep::Offer);
        let kept = entry(5, None);
        assert_eq!(
            offered_step(&kept, Reoffered::Restored),
            Offered::Host(kept.clone())
        );
        assert_eq!(offered_step(&kept, Reoffered::Dropped(5)), Offered::Dropped);
        assert_eq!(
            offered_step(&kept, Reoffered::Listed(entry(9, Some(5)))),
            Offered::Dropped
        );
        assert_eq!(
            offered_step(&kept, Reoffered::Listed(entry(9, None))),
            Offered::Kept(9)
        );
        let chosen = crate::transport::catalog::CHOSEN_GENERATIONS;
        assert_eq!(
            offered_step(&kept, Reoffered::Listed(entry(chosen, None))),
            Offered::Superseded
        );
        assert_eq!(
            dir_step(4, Some(&entry(chosen, None)), None),
            DirStep::Superseded
        );
        // An older generation listed than the directory's: offered back over it.
        assert_eq!(dir_step(4, Some(&entry(3, None)), None), DirStep::Offer);
    }
}
