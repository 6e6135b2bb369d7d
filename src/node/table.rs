//! The filters of a node, one entry a name, each in one explicit [`State`]; the transitions
//! between states are the methods of [`FilterTable`], which change the table and answer what
//! the caller must do (stop a replica, count a parked one, keep refusing requests a moment).
//!
//! Pure: no actor, no runtime, no I/O. The node keeps the table under one lock
//! (`RwLock<FilterTable>`), so a lookup, a route or a drop consults one place; the replica's
//! handle and its parked state are type parameters, so the transitions are tested here without
//! replicas.
//!
//! The life of one name:
//!
//! ```text
//!   (absent) --begin_start--> Starting --started--> Live <--resumed-- Resuming
//!   (absent) --host_parked--> Parked (a filter restored from its data directory)
//!                                |                   |  \--park--> Parked --begin_resume--^
//!                          start_failed            drop  stop_all     |          |
//!                                v                   v      v        drop    stop_all
//!                 (absent, or Dropping again)    Dropping Stopping    v          v
//!                                                    |      |      (absent)   (absent)
//!                                linger_over / routing_stopped
//!                                                    v
//!                                                 (absent)
//! ```
//!
//! The catalog as this node's watcher has seen it (`view`) is not in the table: it is what the
//! whole cluster hosts, entries of names this node never started among them, and it changes
//! when the watcher hears of a change, before this node applied it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use thiserror::Error;

use crate::FilterSpec;
use crate::transport::CatalogEntry;

/// A replica's handle as the table sees it: cloned out to callers, and told apart from
/// another replica of the same name (a new incarnation).
pub(crate) trait Handle: Clone {
    /// Whether both are handles of one replica.
    fn same(&self, other: &Self) -> bool;
}

/// A hosted filter: its catalog entry (generation 0 for a filter of the configuration file)
/// and what parking needs to know of its use.
#[derive(Debug)]
pub(crate) struct Filter {
    pub(crate) generation: u64,
    pub(crate) spec: FilterSpec,
    /// Of its catalog entry (for offering it back to a catalog that lost it).
    pub(crate) created_ms: u64,
    pub(crate) replaces: Option<u64>,
    /// Its catalog entry's expiry (`EXPIRE`), ms since the UNIX epoch.
    pub(crate) expires_ms: Option<u64>,
    /// Looked up since the node last looked for idle replicas. Atomic: lookups mark it under
    /// the table's read lock (the hot path).
    touched: AtomicBool,
    /// Looks in a row that found it untouched.
    idle_looks: AtomicU8,
    /// Handed out for good (`Node::filter`): it never parks (its caller may hold the handle).
    pinned: AtomicBool,
}

impl Filter {
    /// The filter of a catalog entry, as used a moment ago.
    pub(crate) fn new(entry: CatalogEntry) -> Self {
        let CatalogEntry {
            spec,
            generation,
            created_ms,
            replaces,
            expires_ms,
            ..
        } = entry;
        Filter {
            generation,
            spec,
            created_ms,
            replaces,
            expires_ms,
            touched: AtomicBool::new(true),
            idle_looks: AtomicU8::new(0),
            pinned: AtomicBool::new(false),
        }
    }

    /// Its catalog entry.
    pub(crate) fn entry(&self, name: &str) -> CatalogEntry {
        CatalogEntry {
            name: name.to_string(),
            spec: self.spec.clone(),
            generation: self.generation,
            created_ms: self.created_ms,
            replaces: self.replaces,
            expires_ms: self.expires_ms,
        }
    }

    /// Notes it as used (a load first: the hot path mostly finds it noted already).
    fn touch(&self) {
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
    }

    /// It never parks from now on.
    pub(crate) fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }

    pub(crate) fn pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed)
    }

    /// One look for idle replicas: whether this one is due to be asked to park (untouched
    /// for `looks` looks in a row; then counted from 0 again, so that a replica that stays
    /// awake, having peers, is asked once per `looks` looks, not at every one).
    fn idle_look(&self, looks: u8) -> bool {
        if self.touched.swap(false, Ordering::Relaxed) {
            self.idle_looks.store(0, Ordering::Relaxed);
            return false;
        }
        let seen = self.idle_looks.fetch_add(1, Ordering::Relaxed) + 1;
        if seen < looks {
            return false;
        }
        self.idle_looks.store(0, Ordering::Relaxed);
        true
    }
}

/// Where one name of the node is in its life.
#[derive(Debug)]
pub(crate) enum State<H, P> {
    /// Its replica's actor runs and is routed to (it may serve its API), its first snapshot
    /// is being written: not hosted yet. `routes_own`: whether the node routes its own API
    /// subjects. `dropped`: the replica of the incarnation dropped before it, still refusing
    /// requests for a moment (back to [`State::Dropping`] if this start fails).
    Starting {
        handle: H,
        routes_own: bool,
        dropped: Option<H>,
    },
    /// Hosted, its replica running.
    Live { filter: Filter, handle: H },
    /// Hosted, its idle replica parked as data (no actor).
    Parked { filter: Filter, parked: Box<P> },
    /// Hosted, its parked replica being resumed: only ever seen under the table's write
    /// lock, between [`FilterTable::begin_resume`] and [`FilterTable::resumed`].
    Resuming { filter: Filter },
    /// Dropped: its replica stops and, for a moment, refuses requests to its own API
    /// subjects, as its own subscriptions did.
    Dropping { handle: H },
    /// The node stops: its replica is stopping, still routed its replication (acks of its
    /// `replicated` updates among it); `refusing`: it also takes (and refuses) requests to
    /// its own API subjects.
    Stopping { handle: H, refusing: bool },
}

/// A [`State`]'s name, for refusals and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Absent,
    Starting,
    Live,
    Parked,
    Resuming,
    Dropping,
    Stopping,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Absent => "absent",
            Kind::Starting => "starting",
            Kind::Live => "live",
            Kind::Parked => "parked",
            Kind::Resuming => "resuming",
            Kind::Dropping => "dropping",
            Kind::Stopping => "stopping",
        })
    }
}

impl<H, P> State<H, P> {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            State::Starting { .. } => Kind::Starting,
            State::Live { .. } => Kind::Live,
            State::Parked { .. } => Kind::Parked,
            State::Resuming { .. } => Kind::Resuming,
            State::Dropping { .. } => Kind::Dropping,
            State::Stopping { .. } => Kind::Stopping,
        }
    }

    /// The hosted filter (live, parked or resuming).
    pub(crate) fn filter(&self) -> Option<&Filter> {
        match self {
            State::Live { filter, .. }
            | State::Parked { filter, .. }
            | State::Resuming { filter } => Some(filter),
            _ => None,
        }
    }
}

/// A transition the state of the name does not allow; the table is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot {transition} filter `{name}`: it is {state}")]
pub(crate) struct Refused {
    pub(crate) name: String,
    pub(crate) state: Kind,
    pub(crate) transition: &'static str,
}

/// What a drop leaves the caller to do.
#[derive(Debug, PartialEq)]
pub(crate) struct Dropped<H> {
    /// The generation dropped (its data directory goes aside).
    pub(crate) generation: u64,
    /// The replica to stop (`None`: it was parked, nothing runs).
    pub(crate) running: Option<H>,
    /// It was parked: one parked filter fewer.
    pub(crate) was_parked: bool,
    /// Its replica refuses requests to its own API subjects until
    /// [`FilterTable::linger_over`].
    pub(crate) lingers: bool,
}

/// What stopping every hosted filter leaves the caller to do.
#[derive(Debug, PartialEq)]
pub(crate) struct Stopped<H> {
    /// The replicas to stop, by name.
    pub(crate) running: Vec<(String, H)>,
    /// Parked filters let go (a parked replica's last snapshot is its final one).
    pub(crate) parked: usize,
}

/// What [`FilterTable::begin_resume`] found.
#[derive(Debug)]
pub(crate) enum Resume<H, P> {
    /// Not hosted (absent, starting, dropping, stopping).
    NotHosted,
    /// Running: its handle (noted as used).
    Live(H),
    /// Parked, and the caller may not resume it now: left parked.
    Kept,
    /// Parked, now [`State::Resuming`]: the caller resumes it from `parked` and answers
    /// [`FilterTable::resumed`] under the same lock.
    Take {
        parked: Box<P>,
        spec: FilterSpec,
        generation: u64,
    },
}

/// Where the node finds the replica of a name, for routing.
#[derive(Debug, PartialEq)]
pub(crate) enum Found<'a, H> {
    /// Not in the table.
    Absent,
    /// Hosted and running (noted as used).
    Live(&'a H),
    /// Hosted, parked (or being resumed): the caller resumes it.
    Parked,
    /// Its replica starts; whether the node routes its own API subjects.
    Starting(&'a H, bool),
    /// Dropped a moment ago: its replica refuses.
    Dropping(&'a H),
    /// Stopping with the node; whether it takes its own API subjects' requests (to refuse).
    Stopping(&'a H, bool),
}

/// Where [`FilterTable::find_quietly`] found the replica of a name.
#[derive(Debug, PartialEq)]
pub(crate) enum Quiet<'a, H, P> {
    /// As [`FilterTable::find`] (a live one not noted as used).
    Found(Found<'a, H>),
    /// Parked: its kept state, and its generation.
    Parked(&'a P, u64),
}

/// The filters of a node, by name. See the module's documentation.
#[derive(Debug)]
pub(crate) struct FilterTable<H, P> {
    entries: HashMap<String, State<H, P>, foldhash::fast::RandomState>,
    /// Entries live, parked or resuming (kept, not counted: the node asks at every change,
    /// and a count over 100,000 entries each time made its start quadratic).
    hosted: usize,
}

impl<H, P> Default for FilterTable<H, P> {
    fn default() -> Self {
        FilterTable {
            entries: HashMap::default(),
            hosted: 0,
        }
    }
}

impl<H: Handle, P> FilterTable<H, P> {
    /// The state of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&State<H, P>> {
        self.entries.get(name)
    }

    /// The name of the state of `name`.
    pub(crate) fn kind(&self, name: &str) -> Kind {
        self.get(name).map_or(Kind::Absent, State::kind)
    }

    /// The hosted filter `name` (live, parked or resuming).
    pub(crate) fn hosted(&self, name: &str) -> Option<&Filter> {
        self.get(name)?.filter()
    }

    /// How many filters are hosted.
    pub(crate) fn hosted_len(&self) -> usize {
        self.hosted
    }

    /// The hosted filters, with the replica of each that runs.
    pub(crate) fn iter_hosted(&self) -> impl Iterator<Item = (&String, &Filter, Option<&H>)> {
        self.entries.iter().filter_map(|(name, s)| match s {
            State::Live { filter, handle } => Some((name, filter, Some(handle))),
            State::Parked { filter, .. } | State::Resuming { filter } => Some((name, filter, None)),
            _ => None,
        })
    }

    /// Hosted `name`: its running replica, noted as used (`None` if parked or resuming);
    /// with `pin`, it never parks from now on.
    pub(crate) fn use_hosted(&self, name: &str, pin: bool) -> Option<Option<&H>> {
        let state = self.get(name)?;
        let filter = state.filter()?;
        if pin {
            filter.pin();
        }
        match state {
            State::Live { handle, .. } => {
                filter.touch();
                Some(Some(handle))
            }
            _ => Some(None),
        }
    }

    /// Where the replica of `name` is, for a route (a live one noted as used).
    pub(crate) fn find(&self, name: &str) -> Found<'_, H> {
        match self.get(name) {
            None => Found::Absent,
            Some(State::Live { filter, handle }) => {
                filter.touch();
                Found::Live(handle)
            }
            Some(State::Parked { .. } | State::Resuming { .. }) => Found::Parked,
            Some(State::Starting {
                handle, routes_own, ..
            }) => Found::Starting(handle, *routes_own),
            Some(State::Dropping { handle }) => Found::Dropping(handle),
            Some(State::Stopping { handle, refusing }) => Found::Stopping(handle, *refusing),
        }
    }

    /// The replicas whose actors run and are hosted or starting (those the node's
    /// connection events go to).
    pub(crate) fn routed_handles(&self) -> Vec<H> {
        self.entries
            .values()
            .filter_map(|s| match s {
                State::Live { handle, .. } | State::Starting { handle, .. } => Some(handle.clone()),
                _ => None,
            })
            .collect()
    }

    fn refused<T>(&self, name: &str, transition: &'static str) -> Result<T, Refused> {
        Err(Refused {
            name: name.to_string(),
            state: self.kind(name),
            transition,
        })
    }

    /// The replica `handle` of `name` runs (its actor started): routed to from now on.
    /// Refused if the name has a replica already (hosted, starting, stopping); a dropped
    /// one that still refuses is kept behind the new one.
    pub(crate) fn begin_start(
        &mut self,
        name: &str,
        handle: H,
        routes_own: bool,
    ) -> Result<(), Refused> {
        let dropped = match self.entries.get(name) {
            None => None,
            Some(State::Dropping { handle }) => Some(handle.clone()),
            Some(_) => return self.refused(name, "start"),
        };
        self.entries.insert(
            name.to_string(),
            State::Starting {
                handle,
                routes_own,
                dropped,
            },
        );
        Ok(())
    }

    /// The starting replica `handle` of `name` wrote its first snapshot: hosted, as
    /// `filter`. Refused unless that replica is the one starting.
    pub(crate) fn started(
        &mut self,
        name: &str,
        handle: &H,
        filter: Filter,
    ) -> Result<(), Refused> {
        match self.entries.get(name) {
            Some(State::Starting { handle: h, .. }) if h.same(handle) => {}
            _ => return self.refused(name, "host"),
        }
        self.entries.insert(
            name.to_string(),
            State::Live {
                filter,
                handle: handle.clone(),
            },
        );
        self.hosted += 1;
        Ok(())
    }

    /// `name`, absent, hosted as `filter` and parked at once as `parked`: a filter restored
    /// from its data directory as its node starts, without running its replica. Refused if
    /// the name is in the table in any state.
    pub(crate) fn host_parked(
        &mut self,
        name: &str,
        filter: Filter,
        parked: Box<P>,
    ) -> Result<(), Refused> {
        if self.entries.contains_key(name) {
            return self.refused(name, "host parked");
        }
        self.entries
            .insert(name.to_string(), State::Parked { filter, parked });
        self.hosted += 1;
        Ok(())
    }

    /// The start of `name`'s replica failed: the name is as before it (a dropped replica
    /// that still refuses, or nothing). Refused unless it is starting.
    pub(crate) fn start_failed(&mut self, name: &str) -> Result<(), Refused> {
        if !matches!(self.entries.get(name), Some(State::Starting { .. })) {
            return self.refused(name, "fail the start of");
        }
        if let Some(State::Starting {
            dropped: Some(handle),
            ..
        }) = self.entries.remove(name)
        {
            self.entries
                .insert(name.to_string(), State::Dropping { handle });
        }
        Ok(())
    }

    /// Drops hosted `name` if its generation is at most `at_most` (`None`: any).
    /// `refuses(filter)`: whether its replica, if it runs, refuses requests to its own API
    /// subjects a moment ([`State::Dropping`]); otherwise the name leaves the table at once.
    pub(crate) fn drop_filter(
        &mut self,
        name: &str,
        at_most: Option<u64>,
        refuses: impl FnOnce(&Filter) -> bool,
    ) -> Result<Dropped<H>, Refused> {
        let newer = match self.entries.get(name) {
            Some(State::Live { filter, .. } | State::Parked { filter, .. }) => {
                at_most.is_some_and(|g| filter.generation > g)
            }
            _ => return self.refused(name, "drop"),
        };
        if newer {
            return self.refused(name, "drop an older generation of");
        }
        self.hosted -= 1;
        match self.entries.remove(name).expect("looked up") {
            State::Live { filter, handle } => {
                let lingers = refuses(&filter);
                if lingers {
                    let kept = handle.clone();
                    self.entries
                        .insert(name.to_string(), State::Dropping { handle: kept });
                }
                Ok(Dropped {
                    generation: filter.generation,
                    running: Some(handle),
                    was_parked: false,
                    lingers,
                })
            }
            State::Parked { filter, .. } => Ok(Dropped {
                generation: filter.generation,
                running: None,
                was_parked: true,
                lingers: false,
            }),
            _ => unreachable!("matched above"),
        }
    }

    /// The dropped replica `handle` of `name` stops refusing: it leaves the table (unless
    /// another incarnation took the name meanwhile). Whether it was there.
    pub(crate) fn linger_over(&mut self, name: &str, handle: &H) -> bool {
        match self.entries.get_mut(name) {
            Some(State::Dropping { handle: h }) if h.same(handle) => {
                self.entries.remove(name);
                true
            }
            Some(State::Starting { dropped, .. })
                if dropped.as_ref().is_some_and(|h| h.same(handle)) =>
            {
                *dropped = None;
                true
            }
            _ => false,
        }
    }

    /// The node stops: every live replica is to be stopped ([`State::Stopping`], still
    /// routed to; `refusing(name, filter)`: also its own API subjects' requests, to refuse
    /// them); parked ones leave the table. Starting and dropping ones are left as they are.
    pub(crate) fn stop_all(&mut self, refusing: impl Fn(&str, &Filter) -> bool) -> Stopped<H> {
        let hosted: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, s)| matches!(s, State::Live { .. } | State::Parked { .. }))
            .map(|(name, _)| name.clone())
            .collect();
        let mut stopped = Stopped {
            running: Vec::new(),
            parked: 0,
        };
        for name in hosted {
            self.hosted -= 1;
            match self.entries.remove(&name).expect("listed") {
                State::Live { filter, handle } => {
                    let refusing = refusing(&name, &filter);
                    stopped.running.push((name.clone(), handle.clone()));
                    self.entries
                        .insert(name, State::Stopping { handle, refusing });
                }
                State::Parked { .. } => stopped.parked += 1,
                _ => unreachable!("listed as live or parked"),
            }
        }
        stopped
    }

    /// The node stopped routing: the dropping and stopping replicas are let go (starting
    /// ones forget the dropped replica behind them).
    pub(crate) fn routing_stopped(&mut self) {
        self.entries.retain(|_, s| match s {
            State::Dropping { .. } | State::Stopping { .. } => false,
            State::Starting { dropped, .. } => {
                *dropped = None;
                true
            }
            _ => true,
        });
    }

    /// Asks for the replica of hosted `name` to run: its handle if it does; if it is parked
    /// and `may_resume`, its parked state, the name then [`State::Resuming`] until
    /// [`FilterTable::resumed`].
    pub(crate) fn begin_resume(&mut self, name: &str, may_resume: bool) -> Resume<H, P> {
        let Some(state) = self.entries.get_mut(name) else {
            return Resume::NotHosted;
        };
        match state {
            State::Live { filter, handle } => {
                filter.touch();
                return Resume::Live(handle.clone());
            }
            State::Parked { .. } if may_resume => {}
            State::Parked { .. } | State::Resuming { .. } => return Resume::Kept,
            _ => return Resume::NotHosted,
        }
        let Some(State::Parked { filter, parked }) = self.entries.remove(name) else {
            unreachable!("matched above")
        };
        let (spec, generation) = (filter.spec.clone(), filter.generation);
        self.entries
            .insert(name.to_string(), State::Resuming { filter });
        Resume::Take {
            parked,
            spec,
            generation,
        }
    }

    /// The resumption of `name` ended: live with `Ok(handle)`, parked again with
    /// `Err(parked)`. Refused unless it is resuming.
    pub(crate) fn resumed(
        &mut self,
        name: &str,
        outcome: Result<H, Box<P>>,
    ) -> Result<(), Refused> {
        if !matches!(self.entries.get(name), Some(State::Resuming { .. })) {
            return self.refused(name, "end the resumption of");
        }
        let Some(State::Resuming { filter }) = self.entries.remove(name) else {
            unreachable!("matched above")
        };
        let state = match outcome {
            Ok(handle) => {
                filter.touched.store(true, Ordering::Relaxed);
                filter.idle_looks.store(0, Ordering::Relaxed);
                State::Live { filter, handle }
            }
            Err(parked) => State::Parked { filter, parked },
        };
        self.entries.insert(name.to_string(), state);
        Ok(())
    }

    /// One look for idle replicas: the live ones `may_park` allows that were untouched for
    /// `looks` looks in a row, to be asked to park (name, generation, replica).
    pub(crate) fn idle(
        &self,
        looks: u8,
        may_park: impl Fn(&str, &Filter) -> bool,
    ) -> Vec<(String, u64, H)> {
        self.entries
            .iter()
            .filter_map(|(name, s)| match s {
                State::Live { filter, handle }
                    if !filter.pinned() && may_park(name, filter) && filter.idle_look(looks) =>
                {
                    Some((name.clone(), filter.generation, handle.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Parks the replica `handle` of `name`'s `generation` as `close()` makes it, if it is
    /// still that replica there, running, and nothing looked it up or pinned it since it was
    /// asked (`close` is called only then, and may still refuse: `None`). Whether it parked.
    pub(crate) fn park(
        &mut self,
        name: &str,
        generation: u64,
        handle: &H,
        close: impl FnOnce() -> Option<P>,
    ) -> bool {
        let Some(State::Live { filter, handle: h }) = self.entries.get(name) else {
            return false;
        };
        if filter.generation != generation
            || !h.same(handle)
            || filter.touched.load(Ordering::Relaxed)
            || filter.pinned()
        {
            return false;
        }
        let Some(parked) = close() else {
            return false;
        };
        let Some(State::Live { filter, .. }) = self.entries.remove(name) else {
            unreachable!("matched above")
        };
        self.entries.insert(
            name.to_string(),
            State::Parked {
                filter,
                parked: Box::new(parked),
            },
        );
        true
    }

    /// Where the replica of `name` is, for a message that must not keep it awake (a peer's
    /// digest, which comes whether anything changed or not): as [`FilterTable::find`], a
    /// live one not noted as used, and a parked one's kept state and generation.
    pub(crate) fn find_quietly(&self, name: &str) -> Quiet<'_, H, P> {
        match self.get(name) {
            Some(State::Live { handle, .. }) => Quiet::Found(Found::Live(handle)),
            Some(State::Parked { filter, parked }) => Quiet::Parked(parked, filter.generation),
            _ => Quiet::Found(self.find(name)),
        }
    }

    /// The parked replicas, with their generation.
    pub(crate) fn iter_parked(&self) -> impl Iterator<Item = (&String, u64, &P)> {
        self.entries.iter().filter_map(|(name, s)| match s {
            State::Parked { filter, parked } => Some((name, filter.generation, &**parked)),
            _ => None,
        })
    }

    /// Sets the expiry of hosted `name`'s `generation`: whether it changed.
    pub(crate) fn set_expiry(
        &mut self,
        name: &str,
        generation: u64,
        expires_ms: Option<u64>,
    ) -> bool {
        match self.entries.get_mut(name) {
            Some(
                State::Live { filter, .. }
                | State::Parked { filter, .. }
                | State::Resuming { filter },
            ) if filter.generation == generation && filter.expires_ms != expires_ms => {
                filter.expires_ms = expires_ms;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
