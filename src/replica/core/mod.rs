//! The replica's decisions without I/O: what the shell (the actor, its transports, its data
//! directory) carries out, and what the deterministic simulation (`src/sim/`) runs too. The
//! rest of the replica moves here step by step (docs/DESIGN.md, "The replica's core").

mod start;
mod unlogged;

pub(crate) use start::{Adopted, Claiming};
#[cfg(test)]
pub(crate) use unlogged::NO_FOOTPRINTS;
pub(crate) use unlogged::{MergesHeld, UnloggedMerges};
