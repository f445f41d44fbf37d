//! The membership view: who is alive, as this worker judges it from the heartbeat's listings of
//! the worker records (docs/algorithm.md, "Liveness"), what each peer last published of its
//! ownership changes, and the holds on takes that the fleet's state calls for (the start hold,
//! and the hold after the store went back in time). Owned by the balance loop.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::super::events::Observation;
use super::super::fleet_view;
use super::super::shared::Shared;
use crate::ids::WorkerId;
use crate::liveness::Liveness;
use crate::worker_record::WorkerRecord;

/// Why a worker record's removal may wait: how many failover timeouts a worker's heartbeat must
/// stand still before its record is removed. A worker that stopped heartbeating fenced itself
/// after one failover timeout and comes back under a new id, so its record is garbage long before
/// this; a process restarted under the same id beats again, and the removal is conditional on the
/// beat, so it never loses a live record.
const DEAD_RECORD_AGE_IN_FAILOVERS: u32 = 10;

/// The membership view (see the module documentation).
pub(crate) struct Membership {
    /// Who is alive, from the heartbeat's listings of the worker records.
    liveness: Liveness,
    /// Each peer's published count of ownership changes, as last listed.
    peers: Option<BTreeMap<WorkerId, u64>>,
    /// When the latest full listing of the worker records was sent.
    workers_listed: Option<Instant>,
    /// Until when this worker takes no lease that merely looks available: the store was seen
    /// going back in time (a worker's beat went backwards), so a lease may look free only because
    /// its owner's writes were lost; its running owner repairs it within a pass.
    hold_takes_until: Option<Instant>,
    /// The start hold: until a listing of the worker records sent at or after this moment (one
    /// heartbeat interval after this worker's first heartbeat), its passes take no lease that
    /// is free, only claim, so workers started together split the free leases on one view
    /// (docs/algorithm.md, "Starting together"). `None` before the first heartbeat.
    full_view_at: Option<Instant>,
    /// Whether a peer left or died during the start hold, which ends it: that peer's leases are
    /// free now, and holding them until the full view would leave them unread for up to a
    /// heartbeat interval, while taking them costs at most a handoff to a worker that started
    /// together with this one and is not yet seen (docs/algorithm.md, "Starting together").
    fleet_changed_in_hold: bool,
    /// Peers already warned about for balancing by another mode (once per peer and process).
    other_mode_warned: BTreeSet<WorkerId>,
}

/// What a listing of the worker records calls for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// A peer left, died or went back in time, or the start hold ended: list at a pass now.
    pub list_now: bool,
    /// A peer's published change count moved, or a worker came: list soon.
    pub peer_moved: bool,
}

impl Membership {
    pub(crate) fn new(failover: Duration) -> Self {
        Membership {
            liveness: Liveness::new(failover),
            peers: None,
            workers_listed: None,
            hold_takes_until: None,
            full_view_at: None,
            fleet_changed_in_hold: false,
            other_mode_warned: BTreeSet::new(),
        }
    }

    /// The liveness view.
    pub(crate) fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The liveness view, to judge owners by (see `view::live_set`).
    pub(crate) fn liveness_mut(&mut self) -> &mut Liveness {
        &mut self.liveness
    }

    /// Sets when the start hold's full view is due (one heartbeat interval after the first
    /// successful heartbeat).
    pub(crate) fn set_full_view_at(&mut self, at: Option<Instant>) {
        self.full_view_at = at;
    }

    /// Whether a listing of the worker records sent at or after `at` has been seen.
    pub(crate) fn listed_since(&self, at: Instant) -> bool {
        self.workers_listed.is_some_and(|t| t >= at)
    }

    /// Whether takes are on hold (the store was seen going back in time).
    pub(crate) fn holding_takes(&self) -> bool {
        self.hold_takes_until.is_some_and(|until| Instant::now() < until)
    }

    /// Whether the start hold is on: this worker has not yet listed the worker records one
    /// heartbeat interval after its first heartbeat (see [`Membership::full_view_at`]), and no peer
    /// left or died meanwhile ([`Membership::fleet_changed_in_hold`]).
    pub(crate) fn before_full_view(&self) -> bool {
        if self.fleet_changed_in_hold {
            return false;
        }
        match self.full_view_at {
            None => true,
            Some(at) => self.workers_listed.is_none_or(|listed| listed < at),
        }
    }

    /// Warns once per peer that balances by the other mode (its record publishes a load when it
    /// balances by load, and none when it balances by count): the two rules disagree on where
    /// leases belong, so such a fleet may move leases back and forth.
    fn check_balance_modes(&mut self, shared: &Shared, records: &[WorkerRecord]) {
        let by_load = matches!(shared.cfg.balance(), crate::Balance::ByLoad(_));
        let me = shared.id();
        for r in records.iter().filter(|r| r.id != me) {
            if r.load.is_some() != by_load && self.other_mode_warned.insert(r.id.clone()) {
                let (mine, theirs) =
                    if by_load { ("by load", "by count") } else { ("by count", "by load") };
                shared.metrics.balance_mode_mismatch();
                warn!(
                    peer = %r.id,
                    mine,
                    theirs,
                    "a peer balances by another mode: every worker of a fleet must use the same \
                     `Balance`, or leases may move back and forth between the two rules"
                );
            }
        }
    }

    /// A listing of the worker records: the liveness view, the peers' published change counts,
    /// the holds, and what they call for.
    pub(crate) fn seen(&mut self, shared: &Shared, observation: &Observation) -> Seen {
        let Observation { records, notices, observed, gated, sent, received } = observation;
        let (records, sent) = (records.as_slice(), *sent);
        let mut seen = Seen::default();
        let change = self.observe(records, observed.as_ref(), notices, sent, *received);
        if let (true, Some(watched)) = (*gated, observed) {
            // Deaths this worker judged on its own clock among the peers it watches are
            // announced, so peers that do not watch the dead worker count it out at once rather
            // than a failover timeout after their next full listing. Only the watchers announce:
            // a death judged at a full listing is judged by every worker alike, and a fleet whose
            // store is overloaded (heartbeats timing out everywhere) had every worker announce
            // every death it listed (128,114 notice writes timed out in one bench run of a
            // thousand workers on PostgreSQL).
            let me = shared.id();
            let dead: Vec<(WorkerId, u64)> = change
                .newly_dead
                .iter()
                .filter(|w| watched.contains(*w) && !change.by_notice.contains(w) && **w != me)
                .filter_map(|w| records.iter().find(|r| &r.id == w).map(|r| (w.clone(), r.beat)))
                .collect();
            fleet_view::announce_deaths(shared, dead);
        }
        self.check_balance_modes(shared, records);
        if !change.went_back.is_empty() {
            // A running owner repairs what it runs within a (jittered) pass; give it that and a
            // heartbeat before taking anything that only looks available.
            let grace = shared.cfg.balance_interval().mul_f64(1.0 + shared.cfg.jitter())
                + shared.cfg.heartbeat_interval();
            self.hold_takes_until = Some(Instant::now() + grace);
            warn!(
                workers = ?change.went_back,
                ?grace,
                "worker records went back in time (the store lost writes): taking no lease that \
                 looks available for a while, so their owners repair them first"
            );
        }
        let me = shared.id();
        let read = records.iter().filter(|r| r.id != me).map(|r| (r.id.clone(), r.changes));
        let moved = match (observed, self.peers.as_mut()) {
            // A read of a few peers updates their entries in place: the others are as the last
            // full listing showed them, and copying the whole map on every heartbeat cost O(W).
            (Some(ids), Some(peers)) => {
                let read: BTreeMap<_, _> = read.collect();
                let mut moved = false;
                for id in ids.iter().filter(|id| **id != me) {
                    let was = match read.get(id) {
                        Some(changes) => peers.insert(id.clone(), *changes),
                        None => peers.remove(id),
                    };
                    moved |= was != read.get(id).copied();
                }
                moved
            }
            (_, peers) => {
                let now: BTreeMap<_, _> = read.collect();
                let moved = peers.is_none_or(|p| *p != now);
                self.peers = Some(now);
                moved
            }
        };
        if moved {
            debug!("a peer changed owners, came or went: the next pass lists the leases");
        }
        let held = self.before_full_view();
        if observed.is_none() {
            // Only a full listing shows every peer that started with this one: a read of the
            // watched peers (the pacing of full listings may put one first) ends no start hold.
            self.workers_listed = self.workers_listed.max(Some(sent));
        }
        if held && change.needs_balance() {
            debug!(left = ?change.vanished, died = ?change.newly_dead, "a peer left or died during the start hold: ending it");
            self.fleet_changed_in_hold = true;
        }
        if held && !self.before_full_view() {
            // The start hold is over: the pass that takes the free leases runs now.
            seen.list_now = true;
        }
        self.remove_long_dead(shared);
        shared.metrics.live_workers(self.liveness.known());
        seen.list_now |= change.needs_balance() || !change.went_back.is_empty();
        seen.peer_moved = moved;
        seen
    }

    /// Updates the liveness view from a listing of worker records, and logs the peers judged
    /// dead or gone since the last view. The heartbeat's listings and a take-over's fresh look
    /// at the workers both observe through here.
    pub(crate) fn observe(
        &mut self,
        records: &[WorkerRecord],
        observed: Option<&BTreeSet<WorkerId>>,
        notices: &[(WorkerId, u64)],
        sent: Instant,
        received: Instant,
    ) -> crate::liveness::LivenessChange {
        let change = self.liveness.observe_some(records, observed, notices, sent, received);
        for w in &change.newly_dead {
            if change.by_notice.contains(w) {
                info!(worker = %w, "peer judged dead (a peer watching it announced its death)");
            } else {
                info!(worker = %w, "peer judged dead (heartbeat stood still for the failover timeout)");
            }
        }
        for w in &change.vanished {
            info!(worker = %w, "peer left");
        }
        change
    }

    /// Removes, from a task of its own, the records of workers dead for
    /// [`DEAD_RECORD_AGE_IN_FAILOVERS`] failover timeouts (crashed processes with generated ids
    /// would otherwise leave one record each, listed by every worker on every heartbeat forever).
    fn remove_long_dead(&mut self, shared: &Shared) {
        let age = shared.cfg.failover_timeout().saturating_mul(DEAD_RECORD_AGE_IN_FAILOVERS);
        let garbage = self.liveness.long_dead(age);
        if garbage.is_empty() {
            return;
        }
        let store = shared.store.clone();
        let limit: Duration = shared.cfg.heartbeat_interval();
        tokio::spawn(async move {
            for (id, beat) in garbage {
                match tokio::time::timeout(limit, store.remove_worker_if(&id, beat)).await {
                    Ok(Ok(true)) => {
                        info!(worker = %id, beat, ?age, "removed the record of a long-dead worker")
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => {
                        debug!(worker = %id, error = %crate::error::ErrorChain(&e), "removing a long-dead worker's record failed")
                    }
                    Err(_) => {
                        debug!(worker = %id, "removing a long-dead worker's record timed out")
                    }
                }
            }
        });
    }
}
