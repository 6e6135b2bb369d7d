//! A deterministic simulation of replicas of one filter, each on a node with its own simulated
//! disk ([`SimDisk`]), over a simulated bus that drops, duplicates, delays, reorders and
//! partitions, stepped by a seeded random schedule: adds at every acknowledgement level, group
//! commits, periodic syncs, snapshots taken and saved at different moments, clean restarts,
//! crashes of the process at any disk call, losses of power, and restarts from what the disk
//! kept. The product's own code does the work: the write-ahead log's writer and replay, the
//! data directory, recovery, the start decisions (`replica::core`) and the filters; the
//! simulation only chooses the order, as the actor and the pool's threads would.
//!
//! Adds at `replicated` take the product's path too: a commit of their own, its delta
//! published once the log has it, asking its receivers to confirm; `AckTracker` (the
//! actor's) answers them once `peers_needed(known_replicas(..))` peers did, with the known
//! replicas taken as the actor takes them: the registry's held ids at the last look
//! (`StaleWatch`, renewals and retirements of a registry on one side of the partitions), the
//! live peers (`AntiEntropy`, over a simulated clock), the most heard at once. Machines are
//! replaced too: a node loses its whole disk and comes back empty, with a new id.
//!
//! Checked after every restart: every add acknowledged at `durable` is there, and after a crash
//! of the process (not of the machine) every add acknowledged at `logged` too (a node whose
//! disk was lost owes neither). Checked at the end, after the partitions heal and every node
//! is up: the replicas converge, every durable add is in every replica, and so is every add
//! acknowledged at `replicated`, even where its node lost its disk since, unless a peer that
//! held it forgot it (a crash before a snapshot saved the merge: a second fault) or the
//! filter has one replica (at a look that started after the add was published). A run never
//! panics.
//!
//! It found two gaps of the product, both closed, and a test shows it finds each old way.
//! `replicated` adds of items the node had already set were answered without peers; they now
//! record the item's footprint (`Plan::replicated_without_footprints`). A new filter's replica
//! that looked at the registry before its peers claimed counted itself alone and answered
//! once durable; such an add now waits for a peer or a fresh look
//! (`Plan::lone_acks_unchecked`, in runs of `Plan::fresh_cluster`).
//!
//! [`run_catalog`] simulates nodes following one filter catalog through lost stores,
//! strangers, cut links, crashes and lost disks (`catalog.rs` says what it checks and found).
//!
//! `cargo test --release --lib sim::` runs [`DEFAULT_SEEDS`] seeds; `CRPF_SIM_SEEDS=<n>` runs
//! `n`, `CRPF_SIM_SEED=<seed>` replays one (a failure prints its seed and its last events).

mod catalog;
mod disk;
mod world;

pub(crate) use catalog::{CatalogOutcome, CatalogPlan, run_catalog};
pub(crate) use disk::SimDisk;
pub(crate) use world::{Plan, run};

/// Seeds run by default (within CI's time).
pub(crate) const DEFAULT_SEEDS: u64 = 1_000;

#[cfg(test)]
mod tests;
