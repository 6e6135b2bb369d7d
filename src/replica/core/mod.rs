//! The replica's decisions without I/O: what the shell (the actor, its transports, its data
//! directory) carries out, and what the deterministic simulation (`src/sim/`) runs too.
//! [`ReplicaCore`] owns the decision state; each part owns its own, with its tests
//! (docs/DESIGN.md, "The replica's core").

mod clocks;
mod import;
mod lease;
mod pipeline;
mod push;
mod registry;
mod replica;
mod schedule;
mod snapshots;
mod start;
mod step;
mod unlogged;

pub(crate) use clocks::PeerClocks;
pub(crate) use import::{ImportPath, admit_replicated_import, import_level, import_path};
pub(crate) use lease::Lease;
pub(crate) use pipeline::{CommitPipeline, FIRST_BATCH, HeldDelta, Release};
pub(crate) use push::{DigestCache, ENVELOPE_OVERHEAD, PushPlan, Pushes, chunk_len};
pub(crate) use registry::{HeldFrame, Look, RegistryView};
pub(crate) use replica::{InFlight, Outside, Ready, ReplicaCore, Traits, frame_numbers_origin};
pub(crate) use schedule::{Rearm, Schedule};
pub(crate) use snapshots::Snapshotter;
pub(crate) use start::{Adopted, Claiming};
pub(crate) use step::{Effect, Effects, Event, Timer};
#[cfg(test)]
pub(crate) use unlogged::NO_FOOTPRINTS;
pub(crate) use unlogged::{MergesHeld, UnloggedMerges};
