//! The shell's timers, by name: the core says which timer to set for when
//! ([`crate::replica::core::Effect::SetTimer`], and the schedule's periodic one), and
//! [`Timers`] arms it, cancels it, and forgets it when it fires; its firing is stepped into
//! the core as [`crate::replica::core::Event::Timer`]. At most one timer is armed under a
//! name; the core's parts know which they asked for.
//!
//! Not here: the expiry of updates waiting for their peers (one per confirmed delta, several
//! at once; each expires whatever is due) and the lease's renewal interval (for the life of
//! the actor).

use std::time::Duration;

use actix::prelude::*;

use super::Replica;
use crate::replica::core::{Event, Timer};

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

    /// Arms `name` to fire after `delay` (stepped into the core); one armed under the name
    /// already is cancelled (the core asks for one at a time).
    pub(super) fn arm(&mut self, name: Timer, delay: Duration, ctx: &mut Context<Replica>) {
        debug_assert!(!self.armed(name), "{name:?} armed twice");
        self.cancel(name, ctx);
        let handle = ctx.run_later(delay, move |act, ctx| {
            act.timers.take(name);
            act.step(Event::Timer(name), ctx)
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
