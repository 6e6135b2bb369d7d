//! The shell's timers, by name: the core says which timer to set for when (a
//! [`crate::replica::core::PushPlan::After`], a [`crate::replica::core::Release::Later`], a
//! [`crate::replica::core::Look::After`], the schedule's [`crate::replica::core::Periodic`],
//! ...), and [`Timers`] arms it, cancels it, and forgets it when it fires. At most one timer
//! is armed under a name; the core's parts know which they asked for.
//!
//! Not here: the expiry of updates waiting for their peers (one per confirmed delta, several
//! at once; each expires whatever is due) and the lease's renewal interval (for the life of
//! the actor).

use std::time::Duration;

use actix::prelude::*;

use super::Replica;

/// A timer of the replica's, by what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The digest and the housekeeping ([`crate::replica::core::Schedule`]).
    Periodic,
    /// The flush of the pending delta.
    Flush,
    /// A commit within a millisecond.
    Commit,
    /// The publication of written commits' held deltas.
    Publish,
    /// A full-state push put off by `min_push_interval`.
    Push,
    /// A look at the registry for held frames, over its budget.
    RegistryLook,
    /// An attempt at replacing a failed log writer.
    WalRecovery,
}

/// The armed timers' handles. The periodic one is inline (nearly every replica has it
/// armed, and a node holds 100,000 replicas); the others, rarer, in a list that holds no
/// allocation while empty.
#[derive(Default)]
pub(super) struct Timers {
    periodic: Option<SpawnHandle>,
    others: Vec<(Timer, SpawnHandle)>,
}

impl Timers {
    /// Whether a timer is armed under `name`.
    pub(super) fn armed(&self, name: Timer) -> bool {
        match name {
            Timer::Periodic => self.periodic.is_some(),
            _ => self.others.iter().any(|(n, _)| *n == name),
        }
    }

    /// Arms `name` to run `f` after `delay`; one armed under the name already is cancelled
    /// (the core asks for one at a time).
    pub(super) fn arm<F>(&mut self, name: Timer, delay: Duration, ctx: &mut Context<Replica>, f: F)
    where
        F: FnOnce(&mut Replica, &mut Context<Replica>) + 'static,
    {
        debug_assert!(!self.armed(name), "{name:?} armed twice");
        self.cancel(name, ctx);
        let handle = ctx.run_later(delay, move |act, ctx| {
            act.timers.take(name);
            f(act, ctx)
        });
        match name {
            Timer::Periodic => self.periodic = Some(handle),
            _ => self.others.push((name, handle)),
        }
    }

    /// Cancels the timer armed under `name`: whether one was.
    pub(super) fn cancel(&mut self, name: Timer, ctx: &mut Context<Replica>) -> bool {
        match self.take(name) {
            Some(handle) => ctx.cancel_future(handle),
            None => false,
        }
    }

    /// Forgets the timer armed under `name` (it fired, or is being cancelled).
    fn take(&mut self, name: Timer) -> Option<SpawnHandle> {
        match name {
            Timer::Periodic => self.periodic.take(),
            _ => {
                let i = self.others.iter().position(|(n, _)| *n == name)?;
                let (_, handle) = self.others.swap_remove(i);
                if self.others.is_empty() {
                    // Back to no allocation: most replicas arm these rarely.
                    self.others = Vec::new();
                }
                Some(handle)
            }
        }
    }
}
