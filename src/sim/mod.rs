//! A deterministic simulation of replicas of one filter, each on a node with its own simulated
//! disk ([`SimDisk`]), over a simulated bus that drops, duplicates, delays, reorders and
//! partitions, stepped by a seeded random schedule: adds at every acknowledgement level, group
//! commits, periodic syncs, snapshots taken and saved at different moments, clean restarts,
//! crashes of the process at any disk call, losses of power, and restarts from what the disk
//! kept. The product's own code does the work: the write-ahead log's writer and replay, the
//! data directory, recovery, the start decisions (`replica::core`) and the filters; the
//! simulation only chooses the order, as the actor and the pool's threads would.
//!
//! Checked after every restart: every add acknowledged at `durable` is there, and after a crash
//! of the process (not of the machine) every add acknowledged at `logged` too. Checked at the
//! end, after the partitions heal and every node is up: the replicas converge, and every
//! durable add is in every replica. A run never panics.
//!
//! `cargo test --release --lib sim::` runs [`DEFAULT_SEEDS`] seeds; `CRPF_SIM_SEEDS=<n>` runs
//! `n`, `CRPF_SIM_SEED=<seed>` replays one (a failure prints its seed and its last events).

mod disk;
mod world;

pub(crate) use disk::SimDisk;
pub(crate) use world::{Plan, run};

/// Seeds run by default (within CI's time).
pub(crate) const DEFAULT_SEEDS: u64 = 1_000;

#[cfg(test)]
mod tests;
