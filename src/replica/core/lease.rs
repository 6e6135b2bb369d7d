//! What the replica knows of its id claim (a lease, see [`crate::transport::ClaimRecord`]):
//! the reservation confirmed, when to renew it and what to ask for, a lost claim, and the
//! other ids' claims watched for retirement; and what the replica does about it, stepped
//! ([`super::Event::Renew`], [`super::Event::Renewed`], [`super::Event::Listed`],
//! [`super::Event::TakenBack`]). The shell's `actor/lease.rs` talks to the registry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::start::same_lineage;
use super::{Effect, Effects, ReplicaCore};
use crate::replica::SharedId;
use crate::transport::ClaimRecord;
use crate::transport::registry::{StaleWatch, TakeBack};
use crate::transport::{ClaimEntry, Renewal, TransportError};

/// What the replica knows of its claim and of the other claims of its filter.
pub(crate) struct Lease {
    /// The highest tag timestamp the registry confirmed this replica may issue (its own
    /// claim; see [`Lease::reserved`]).
    reserved: u64,
    /// A renewal (and a look at the registry) is under way.
    busy: bool,
    /// The id was retired under this replica: it issues no more tags until it takes the id
    /// back.
    lost: bool,
    /// Every tag issued under the id by anyone is at or below it (raised by a take-back;
    /// the start's floor is in the clock already).
    floor: u64,
    /// Other ids' claims, to retire those gone silent.
    pub(crate) watch: StaleWatch,
    /// The node's id, when the replica issues its tags under it: the node renews it.
    pub shared: Option<Arc<SharedId>>,
}

impl Lease {
    pub(crate) fn new(reserved: u64, shared: Option<Arc<SharedId>>) -> Self {
        Lease {
            reserved,
            busy: false,
            lost: false,
            floor: 0,
            watch: StaleWatch::default(),
            shared,
        }
    }

    /// The floor the replica's clock moves up to before it issues a tag (see
    /// [`crate::transport::registry::take_back`]).
    pub(crate) fn floor(&self) -> u64 {
        self.shared.as_ref().map_or(self.floor, |s| s.floor())
    }

    /// Starts taking its own retired id back: whether to (the claim is lost, nothing else
    /// is under way, and the node does not hold the id). End it with
    /// [`Lease::renewal_ended`].
    pub(crate) fn begin_take_back(&mut self) -> bool {
        if self.busy || !self.lost || self.shared.is_some() {
            return false;
        }
        self.busy = true;
        true
    }

    /// The id is ours again, with tags above `floor` up to `reserved`.
    pub(crate) fn taken_back(&mut self, floor: u64, reserved: u64) {
        self.lost = false;
        self.floor = self.floor.max(floor);
        self.reserved = self.reserved.max(reserved);
    }

    /// The highest tag timestamp the registry confirmed.
    pub(crate) fn reserved(&self) -> u64 {
        self.shared.as_ref().map_or(self.reserved, |s| s.reserved())
    }

    /// The id was retired while it could not be renewed.
    pub(crate) fn lost(&self) -> bool {
        self.shared.as_ref().map_or(self.lost, |s| s.lost())
    }

    /// The filter's known replicas at the last look, for `replicated` (see
    /// [`StaleWatch::note_known`]; under the node's id, the node ids held); `None` before
    /// a look succeeded.
    pub(crate) fn known_replicas(&self) -> Option<usize> {
        let n = match &self.shared {
            Some(s) => s.id_counts().0,
            None => self.watch.known_ids,
        };
        (n > 0).then_some(n)
    }

    /// Ids of the registry namespace held and retired at the last look.
    pub(crate) fn id_counts(&self) -> (usize, usize) {
        match &self.shared {
            Some(s) => s.id_counts(),
            None => (self.watch.live_ids, self.watch.retired_ids),
        }
    }

    /// Whether its own claim should be renewed at once: half of the `block` of tags last
    /// reserved is used (`clock`), and no renewal is under way. Never for kinds without
    /// tags (`tagged`), nor a lost claim, nor under the node's id (the node renews that).
    pub(crate) fn running_low(&self, clock: u64, block: u64, tagged: bool) -> bool {
        self.shared.is_none()
            && tagged
            && !self.busy
            && !self.lost
            && clock + block / 2 >= self.reserved
    }

    /// Starts a renewal of its own claim: the reservation to ask for (a `block` above the
    /// `clock` for kinds with tags, never lower than the one held), or `None` if a renewal
    /// is under way, the claim is lost, or the node renews the id. End it with
    /// [`Lease::renewal_ended`], and pass the answer to [`Lease::renewed`].
    pub(crate) fn begin_renewal(&mut self, clock: u64, block: u64, tagged: bool) -> Option<u64> {
        if self.busy || self.lost || self.shared.is_some() {
            return None;
        }
        self.busy = true;
        Some(match tagged {
            true => self.reserved.max(clock + block),
            false => self.reserved,
        })
    }

    /// A renewal (with its look at the registry) or a take-back is under way.
    pub(crate) fn renewing(&self) -> bool {
        self.busy
    }

    /// The renewal started by [`Lease::begin_renewal`] is over: the next may start.
    pub(crate) fn renewal_ended(&mut self) {
        self.busy = false;
    }

    /// The registry answered a renewal (the periodic one, or an import's) that asked for
    /// `want` (`None`: it failed; try again later). Answers whether the claim was lost by
    /// it: the id was retired while the replica could not renew, and it issues no more tags.
    pub(crate) fn renewed(&mut self, want: u64, renewal: Option<Renewal>) -> bool {
        match renewal {
            Some(Renewal::Held) => {
                self.reserved = self.reserved.max(want);
                false
            }
            Some(Renewal::Lost) => !std::mem::replace(&mut self.lost, true),
            None => false,
        }
    }

    /// The reservation `n` more tags above `clock` need, if the one held falls short
    /// (`None`: enough, no tags, or the claim is lost).
    pub(crate) fn shortfall(&self, clock: u64, n: u64, tagged: bool) -> Option<u64> {
        if !tagged || n == 0 || self.lost() {
            return None;
        }
        let need = clock.saturating_add(n);
        (need > self.reserved()).then_some(need)
    }
}

impl<R> ReplicaCore<R> {
    /// The renewal is due (the lease's interval), or tags were `issued` (then only once
    /// half the block is used), with the state's tag clock at `clock`: a retired id is
    /// taken back first, then the claim renewed (and the registry listed) unless a renewal
    /// is under way, the claim is lost, or the node renews the id (it is told what is used).
    pub(super) fn renew(&mut self, clock: u64, issued: bool, out: &mut Effects<R>) {
        let (block, tagged) = (self.traits.lease_block, self.traits.tagged);
        if self.lease.shared.is_some() {
            if issued && tagged {
                out.push(Effect::WantReservation { clock });
            }
            return;
        }
        if issued && !self.lease.running_low(clock, block, tagged) {
            return;
        }
        self.take_back(clock, out);
        if let Some(want) = self.lease.begin_renewal(clock, block, tagged) {
            out.push(Effect::Renew { want });
        }
    }

    /// Takes its own id back after a retirement, if it was lost and nothing else is under
    /// way: the same identity, tags above the retirement's floor, so nothing written changes.
    fn take_back(&mut self, clock: u64, out: &mut Effects<R>) {
        if self.lease.begin_take_back() {
            let want = clock.saturating_add(self.traits.lease_block);
            out.push(Effect::TakeBack { want });
        }
    }

    /// The registry answered a renewal that asked for `want`: the replica's own
    /// (`periodic`, which ends it, and a take-back may follow) or an import's.
    pub(super) fn renewed(
        &mut self,
        want: u64,
        renewal: Result<Renewal, TransportError>,
        periodic: bool,
        clock: u64,
        out: &mut Effects<R>,
    ) {
        if periodic {
            self.lease.renewal_ended();
        }
        if self.lease.renewed(want, renewal.as_ref().ok().copied()) {
            out.push(Effect::IdLost);
        }
        if let Err(error) = renewal {
            let what = "renewing the claim";
            out.push(Effect::LeaseFailed { what, error });
        }
        if periodic {
            self.take_back(clock, out);
        }
    }

    /// The registry's claims, listed from `started` on (after a renewal): the view of the
    /// other ids, the replicas a `replicated` update counts, and the ids to retire (their
    /// claims unrenewed for `retire_after_ms` and their replicas unheard meanwhile).
    pub(super) fn listed(
        &mut self,
        claims: Result<Vec<ClaimEntry>, TransportError>,
        started: Instant,
        now: Instant,
        out: &mut Effects<R>,
    ) {
        let mut claims = match claims {
            Ok(claims) => claims,
            Err(error) => {
                let what = "listing claims";
                out.push(Effect::LeaseFailed { what, error });
                return self.looked_for_alone(None, now, out);
            }
        };
        // A kind whose ids serve one run only: the claims its earlier runs still hold (their
        // uuids share this one's lineage, see `core::start`) are retired, not counted. Those
        // runs ended (one process has the data directory) and their ids are never used
        // again; counted, they made a lone node restarted twice refuse every `replicated`
        // update of such a filter for `retire_after_ms` (an hour), waiting for them.
        if !self.traits.reuses_ids {
            let me = (self.traits.id, self.traits.me);
            let (earlier, held): (Vec<ClaimEntry>, Vec<ClaimEntry>) =
                claims.into_iter().partition(|e| {
                    e.id != me.0
                        && e.record.retirable()
                        && matches!(e.record, ClaimRecord::Held { claimant, .. }
                            if same_lineage(claimant, me.1))
                });
            claims = held;
            for e in earlier {
                out.push(Effect::Retire(e));
            }
        }
        // The listing counts every replica held now: those heard from since are counted
        // afresh.
        self.most_live = self.anti_entropy.live_peers(now) + 1;
        self.registry_view
            .get_or_insert_default()
            .note(&claims, started);
        // A kind whose ids serve one run only never retires one (a retired id is reused).
        let window = self.traits.retire_after;
        let retire_after = match self.traits.reuses_ids {
            true => window,
            false => Duration::ZERO,
        };
        let me = self.traits.id;
        let stale = self.lease.watch.stale(me, &claims, now, retire_after);
        // Whether or not the kind retires ids, one silent for `retire_after_ms` no longer
        // counts among the replicas a `replicated` update waits for.
        self.lease.watch.note_known(me, &claims, now, window);
        let (live, retired) = self.lease.id_counts();
        out.push(Effect::IdCounts { live, retired });
        for entry in stale {
            let heard = self.anti_entropy.peers().any(|(_, p)| {
                p.replica == entry.id && now.saturating_duration_since(p.last_seen) < retire_after
            });
            if !heard {
                out.push(Effect::Retire(entry));
            }
        }
        self.looked_for_alone(Some(started), now, out);
    }

    /// Taking the retired id back ended.
    pub(super) fn taken_back(&mut self, r: Result<TakeBack, TransportError>, out: &mut Effects<R>) {
        self.lease.renewal_ended();
        match r {
            Ok(TakeBack::Taken { floor, reserved }) => {
                self.lease.taken_back(floor, reserved);
                out.push(Effect::IdTakenBack { floor });
            }
            Ok(TakeBack::HeldByOther) => out.push(Effect::IdHeldByOther),
            Err(error) => {
                let what = "taking the retired id back";
                out.push(Effect::LeaseFailed { what, error });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 1_000;

    #[test]
    fn a_claim_is_renewed_when_half_its_block_is_used_one_renewal_at_a_time() {
        let mut lease = Lease::new(BLOCK, None);
        assert!(!lease.running_low(BLOCK / 2 - 1, BLOCK, true));
        assert!(lease.running_low(BLOCK / 2, BLOCK, true));
        assert!(
            !lease.running_low(BLOCK, BLOCK, false),
            "no tags, nothing runs low"
        );
        let want = lease.begin_renewal(BLOCK / 2, BLOCK, true).unwrap();
        assert_eq!(want, BLOCK / 2 + BLOCK);
        assert!(!lease.running_low(BLOCK, BLOCK, true), "one under way");
        assert_eq!(lease.begin_renewal(BLOCK, BLOCK, true), None);
        assert!(!lease.renewed(want, Some(Renewal::Held)));
        assert_eq!(lease.reserved(), want);
        assert_eq!(
            lease.begin_renewal(BLOCK, BLOCK, true),
            None,
            "not ended yet"
        );
        lease.renewal_ended();
        // A renewal answered late, for less, never lowers the reservation.
        assert!(!lease.renewed(BLOCK, Some(Renewal::Held)));
        assert_eq!(lease.reserved(), want);
        // A failed renewal leaves it as it was, and the next may start.
        lease.begin_renewal(0, BLOCK, false).unwrap();
        assert!(!lease.renewed(BLOCK * 9, None));
        lease.renewal_ended();
        assert_eq!(lease.reserved(), want);
        assert_eq!(
            lease.begin_renewal(0, BLOCK, false),
            Some(want),
            "without tags: as held"
        );
    }

    #[test]
    fn a_lost_claim_is_reported_once_and_never_renewed_or_extended() {
        let mut lease = Lease::new(BLOCK, None);
        let want = lease.begin_renewal(0, BLOCK, true).unwrap();
        assert!(lease.renewed(want, Some(Renewal::Lost)), "lost now");
        assert!(!lease.renewed(want, Some(Renewal::Lost)), "reported once");
        assert!(lease.lost());
        assert_eq!(lease.begin_renewal(0, BLOCK, true), None);
        assert!(!lease.running_low(BLOCK, BLOCK, true));
        assert_eq!(lease.shortfall(0, BLOCK * 2, true), None);
    }

    #[test]
    fn an_import_needs_more_only_beyond_the_reservation() {
        let lease = Lease::new(BLOCK, None);
        assert_eq!(lease.shortfall(500, 500, true), None);
        assert_eq!(lease.shortfall(500, 501, true), Some(1_001));
        assert_eq!(lease.shortfall(500, 0, true), None);
        assert_eq!(lease.shortfall(500, 10_000, false), None);
        assert_eq!(lease.shortfall(u64::MAX - 1, 10, true), Some(u64::MAX));
    }
}
