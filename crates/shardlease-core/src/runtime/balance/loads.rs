//! Balancing by load: what the balance loop follows of the fleet's loads between listings, and
//! the load view it hands the balancer (docs/algorithm.md, "Balancing by load").
//!
//! The loads come from the heartbeat (this worker's own, measured) and from the worker records
//! (each peer's, published); the moves come from following each lease's owner from listing to
//! listing: a lease that changed owner cools down, its receiver sits out load moves while its
//! figures settle, its giver takes nothing for as long, and a round of moves stays under way
//! until both ends of its moves have planned again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::super::shared::Shared;
use super::LoopState;
use crate::ids::WorkerId;
use crate::lease::{Lease, LeaseKey};
use crate::worker_record::WorkerRecord;

/// What the balance loop remembers of a lease's owner, balancing by load (see
/// [`LoadTracker::owner_seen`]).
#[derive(Clone, Debug, PartialEq)]
struct SeenOwner {
    /// The owner at the last listing.
    owner: Option<WorkerId>,
    /// When this worker saw the owner change (never, for a lease seen with one owner only).
    moved_at: Option<Instant>,
    /// The lease's last load figure from before any move in progress.
    load: Option<f64>,
}

/// What the balance loop follows of the loads (see the module documentation). Empty and unused
/// balancing by count.
#[derive(Debug, Default)]
pub(crate) struct LoadTracker {
    /// This worker's lease loads, as its heartbeat last measured them.
    mine: Vec<crate::load::LeaseLoad>,
    /// What each peer last published of its loads.
    peers: BTreeMap<WorkerId, crate::balancer::PublishedLoad>,
    /// Per lease, its owner at the last listing, when this worker saw the owner change (never,
    /// for one seen once) and its last load figure from before any move in progress: a lease that
    /// moved waits out the load cooldown, counted at that figure.
    owner_seen: BTreeMap<LeaseKey, SeenOwner>,
    /// Until when each worker sits out load moves while its figures settle
    /// (see [`crate::balancer::LoadView::settling`]): it received a lease (an owner changing
    /// from one worker to another), or took one never seen owned.
    worker_moved: BTreeMap<WorkerId, Instant>,
    /// Until when each worker that gave a lease for load may give but not receive
    /// (`LoadView::gave`).
    worker_gave: BTreeMap<WorkerId, Instant>,
    /// The snapshot of the last listing, which a quiet pass plans on again with newer loads to
    /// see whether a listing is due ([`load_moves_due`]).
    snapshot: Option<crate::balancer::Snapshot>,
}

impl LoadTracker {
    /// This worker's loads, as its heartbeat just measured them.
    pub(crate) fn set_mine(&mut self, loads: Vec<crate::load::LeaseLoad>) {
        self.mine = loads;
    }

    /// The peers' published loads, from a listing of the worker records.
    pub(crate) fn set_peers(&mut self, records: &[WorkerRecord], me: &WorkerId) {
        self.peers = records
            .iter()
            .filter(|r| &r.id != me)
            .map(|r| {
                let load = crate::balancer::PublishedLoad::new(
                    r.load.unwrap_or(0.0),
                    r.lease_loads.clone(),
                );
                (r.id.clone(), load)
            })
            .collect();
    }

    /// Keeps the last listing's snapshot (balancing by load) for the quiet passes to plan on.
    pub(crate) fn keep_snapshot(&mut self, snapshot: Option<crate::balancer::Snapshot>) {
        self.snapshot = snapshot;
    }

    /// What the balancer knows of the loads when the fleet balances by load: each live peer's
    /// published loads, this worker's own (all of its leases), and the leases in their cooldown.
    /// Also follows each lease's owner from listing to listing to time the cooldowns.
    pub(crate) fn view(
        &mut self,
        shared: &Shared,
        me: &crate::ids::WorkerId,
        leases: &[Lease],
        now: Instant,
    ) -> Option<crate::balancer::LoadView> {
        let crate::Balance::ByLoad(settings) = shared.cfg.balance() else { return None };
        let cooldown = settings.cooldown_or_default(shared.cfg.balance_interval());
        let latest = lease_figures(&self.peers, &self.mine, me, leases);
        let mut cooling = BTreeSet::new();
        let mut pinned = BTreeMap::new();
        let mut seen = BTreeMap::new();
        // A worker that received a lease sits out load moves for two balance intervals, the time its
        // catch-up on the moved lease takes to pass (while it lasts its other leases share its cores
        // differently); the giver may give again but takes nothing for as long (`LoadView::gave`);
        // a worker that took a lease while free sits out one interval, by when the lease has been
        // measured at the tip of its shard (its catch-up is not counted, see
        // `LeaseMetrics::handled`).
        let interval = shared.cfg.balance_interval();
        let (settle, round_window) = move_windows(interval, shared.cfg.jitter());
        let sit_out =
            |moved: &mut BTreeMap<crate::ids::WorkerId, Instant>, w: &crate::ids::WorkerId, d| {
                let until = now + d;
                let at = moved.entry(w.clone()).or_insert(until);
                *at = (*at).max(until);
            };
        // The round of moves is under way until the other receivers of a plan have claimed (at
        // their own passes) and both ends of each move have planned again (see `move_windows`).
        let mut round = false;
        for lease in leases {
            let key = &lease.key;
            let (moved_at, before_move) = match self.owner_seen.remove(key) {
                Some(seen) if seen.owner == lease.owner => (seen.moved_at, seen.load),
                // Taken while free, never seen owned and with no figure ever seen (a fleet's first
                // pass, a new child): no figure to pin and no load move to damp, so it does not
                // cool. Cooling every lease of a starting fleet held off every load move for a whole
                // cooldown (the `skew` bench settled 6 intervals late). A lease released since this
                // worker saw it owned (`moved_at` set) still cools, figure or not. Its new owner's
                // figures are still the catch-up of what waited while it had no owner (a starting
                // fleet's came out at twice their steady level), so that owner sits out load moves
                // until the lease has been measured at the tip of its shard for a while.
                Some(seen)
                    if seen.owner.is_none() && seen.load.is_none() && seen.moved_at.is_none() =>
                {
                    if let Some(to) = &lease.owner {
                        sit_out(&mut self.worker_moved, to, interval);
                    }
                    (None, None)
                }
                Some(seen) => {
                    // From one worker to another (a claim, a failover): the receiver's figures shift
                    // while it catches up; the giver's are right at once, but it takes nothing back
                    // for as long.
                    // A lease taken while free (a start, a release) changes no figure that counted.
                    if let (Some(from), Some(to)) = (&seen.owner, &lease.owner) {
                        sit_out(&mut self.worker_gave, from, settle);
                        sit_out(&mut self.worker_moved, to, settle);
                    }
                    (Some(now), seen.load)
                }
                None => (None, None),
            };
            let since_move = moved_at.map(|at| now.saturating_duration_since(at));
            round |= since_move.is_some_and(|d| d < round_window);
            let in_cooldown = since_move.is_some_and(|d| d < cooldown);
            // While it cools, a lease keeps the figure it had before it moved; afterwards its new
            // owner's figure counts (and is remembered for its next move).
            let load =
                if in_cooldown { before_move } else { latest.get(key).copied().or(before_move) };
            if in_cooldown {
                cooling.insert(key.clone());
                if let Some(l) = load {
                    pinned.insert(key.clone(), l);
                }
            }
            seen.insert(key.clone(), SeenOwner { owner: lease.owner.clone(), moved_at, load });
        }
        self.owner_seen = seen;
        self.worker_moved.retain(|_, until| now < *until);
        self.worker_gave.retain(|_, until| now < *until);
        let settling: BTreeSet<crate::ids::WorkerId> = self.worker_moved.keys().cloned().collect();
        let gave: BTreeSet<crate::ids::WorkerId> = self.worker_gave.keys().cloned().collect();
        let total: f64 = self.mine.iter().map(|l| l.load).sum();
        let mut view = crate::balancer::LoadView::new(settings.margin, settings.floor)
            .with_cooling(cooling)
            .with_pinned(pinned)
            .with_settling(settling)
            .with_gave(gave)
            .with_round_in_progress(round)
            .with_worker(me.clone(), crate::balancer::PublishedLoad::new(total, self.mine.clone()));
        for (w, load) in &self.peers {
            view = view.with_worker(w.clone(), load.clone());
        }
        Some(view)
    }
}

/// The figure each lease is counted at, from what the workers published: its current owner's
/// (this worker's own measure for its leases), or, when the owner published none for it (a lease
/// outside its top few, a lease it took a moment ago), the figure another worker published for
/// it.
///
/// The owner's figure comes first because other records can be stale: a record of a worker that
/// is dead, or of an earlier incarnation that a store rollback brought back, keeps the figures it
/// had when it stopped. Taking each lease's figure from whichever record came last in id order
/// let such a record override the live owner's figures until it was collected (ten failover
/// timeouts later), and its collection then looked like a load shift: soak seed 943 made a round
/// of moves in its steady state, a worker both giving and receiving.
fn lease_figures<'a>(
    peers: &'a BTreeMap<WorkerId, crate::balancer::PublishedLoad>,
    mine: &'a [crate::load::LeaseLoad],
    me: &WorkerId,
    leases: &'a [Lease],
) -> BTreeMap<&'a LeaseKey, f64> {
    let mut figures: BTreeMap<&LeaseKey, f64> = BTreeMap::new();
    for p in peers.values() {
        figures.extend(p.leases.iter().map(|l| (&l.key, l.load)));
    }
    for lease in leases {
        // This worker's own figures (all of its leases) go in last, below; a peer publishes
        // only its top few, so this scan is short.
        let owned = match &lease.owner {
            Some(o) if o != me => {
                peers.get(o).and_then(|p| p.leases.iter().find(|l| l.key == lease.key))
            }
            _ => None,
        };
        if let Some(l) = owned {
            figures.insert(&lease.key, l.load);
        }
    }
    figures.extend(mine.iter().map(|l| (&l.key, l.load)));
    figures
}

/// How long the receiver of a load move sits out load moves and its giver takes none (see
/// `load_view`), and how long a round of load moves stays under way after a lease changed owner
/// (`LoadView::round_in_progress`), for a balance interval and its jitter (a fraction).
///
/// A round must outlast the sit-out of its moves by a pass (an interval and its jitter): a worker
/// still outside the band once the figures show the move then moves again at the round's line,
/// instead of sitting short of the start line until noise crosses it (docs/algorithm.md,
/// "Balancing by load", has the figures).
fn move_windows(interval: Duration, jitter: f64) -> (Duration, Duration) {
    // `Config` bounds the interval and the jitter, as for the other jittered waits.
    let settle = interval * 2;
    (settle, settle + interval.mul_f64(1.0 + jitter) + interval / 2)
}

/// Balancing by load, whether a quiet pass must list after all: planned again on the last
/// listing's snapshot with the loads measured since (and the cooldowns as of now), the balancer
/// would claim. In a settled fleet nothing but the loads changed since that listing (any other
/// change asks for a listing anyway), so this is the plan a listing would give, found without
/// reading a lease: a load shift is acted on within a balance interval, and a fleet whose loads
/// hold still reads no leases (docs/algorithm.md, "Balancing by load").
pub(super) fn load_moves_due(shared: &Shared, state: &mut LoopState) -> bool {
    let Some(mut snapshot) = state.loads.snapshot.take() else { return false };
    let me = snapshot.me.clone();
    snapshot.loads = state.loads.view(shared, &me, &snapshot.leases, Instant::now());
    snapshot.seed = state.timing.random();
    let due = !state.balancer.plan(&snapshot).claims.is_empty();
    state.loads.snapshot = Some(snapshot);
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_at_its_owners_figure_not_at_a_stale_record_of_another_worker() {
        use crate::balancer::PublishedLoad;
        use crate::load::LeaseLoad;
        use crate::position::Position;
        let me = WorkerId::new("w3");
        let owned = |key: &str, owner: &str| {
            let mut l = Lease::new(key, Position::TrimHorizon);
            l.owner = Some(WorkerId::new(owner));
            l
        };
        let leases = vec![owned("a", "w1"), owned("b", "w3"), owned("c", "w1")];
        let peers = BTreeMap::from([
            (WorkerId::new("w1"), PublishedLoad::new(0.1, vec![LeaseLoad::new("a", 0.1)])),
            // An old incarnation's record, back after a rollback: stale figures for a and c.
            (
                WorkerId::new("w2"),
                PublishedLoad::new(0.9, vec![LeaseLoad::new("a", 0.5), LeaseLoad::new("c", 0.4)]),
            ),
        ]);
        let mine = vec![LeaseLoad::new("b", 0.2)];
        let figures = lease_figures(&peers, &mine, &me, &leases);
        let get = |k: &str| figures.get(&LeaseKey::new(k)).copied();
        assert_eq!(get("a"), Some(0.1), "the owner's figure, not the stale record's");
        assert_eq!(get("b"), Some(0.2), "this worker's own measure");
        assert_eq!(get("c"), Some(0.4), "no figure from its owner: another record's");
    }

    #[test]
    fn a_round_of_load_moves_outlasts_the_sit_out_of_its_moves_by_a_pass() {
        for ms in [100, 2_500, 30_000] {
            let interval = Duration::from_millis(ms);
            for jitter in [0.0, 0.1, 0.5] {
                let (settle, round) = move_windows(interval, jitter);
                assert_eq!(settle, interval * 2);
                // The next pass of a receiver whose sit-out just ended still falls in the round.
                assert!(settle + interval.mul_f64(1.0 + jitter) < round, "{ms} ms, {jitter}");
                // And the round ends: a settled fleet is back on the start line soon after.
                assert!(round <= interval * 5, "{ms} ms, {jitter}");
            }
        }
    }
}
