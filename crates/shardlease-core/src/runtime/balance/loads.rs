//! Balancing by load: what the balance loop follows of the fleet's loads between listings, and
//! the load view it hands the balancer (docs/algorithm.md, "Balancing by load").
//!
//! The loads come from the heartbeat (this worker's own, measured) and from the worker records
//! (each peer's, published); the moves come from following each lease's owner from listing to
//! listing: a lease that changed owner cools down, its receiver sits out load moves while its
//! figures settle, and until the round of moves is over its giver takes nothing and it gives
//! nothing; a round of moves stays under way
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

/// What a load view is computed with: the fleet's load settings, its balance interval and that
/// interval's jitter. None balancing by count.
#[derive(Clone, Debug)]
pub(crate) struct LoadTiming {
    settings: crate::LoadBalance,
    interval: Duration,
    jitter: f64,
}

impl LoadTiming {
    /// The worker's, when it balances by load.
    pub(crate) fn of(shared: &Shared) -> Option<Self> {
        let crate::Balance::ByLoad(settings) = shared.cfg.balance() else { return None };
        let (interval, jitter) = (shared.cfg.balance_interval(), shared.cfg.jitter());
        Some(LoadTiming { settings: settings.clone(), interval, jitter })
    }
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
    /// Until when each worker that gave a lease may give but not receive (`LoadView::gave`).
    worker_gave: BTreeMap<WorkerId, Instant>,
    /// Until when each worker that received a lease may receive but not give
    /// (`LoadView::received`).
    worker_received: BTreeMap<WorkerId, Instant>,
    /// The snapshot of the last listing, which a quiet pass plans on again with newer loads to
    /// see whether a listing is due ([`load_moves_due`]).
    snapshot: Option<crate::balancer::Snapshot>,
    /// The leases whose owner changed lately, and when this worker saw it: those in their
    /// cooldown, or whose move keeps the round under way (`move_windows`). A pass reads these,
    /// not every lease's memory.
    recent: BTreeMap<LeaseKey, Instant>,
}

impl LoadTracker {
    /// This worker's loads, as its heartbeat just measured them.
    pub(crate) fn set_mine(&mut self, loads: Vec<crate::load::LeaseLoad>) {
        self.mine = loads;
    }

    /// The peers' published loads, from a listing of the worker records: the live peers' only.
    /// A record of a worker judged dead (or of an earlier incarnation brought back by a store
    /// rollback) keeps the figures it had when it stopped; counting them until the record is
    /// collected, ten failover timeouts later, made that collection look like a load shift.
    pub(crate) fn set_peers(
        &mut self,
        records: &[WorkerRecord],
        me: &WorkerId,
        live: &BTreeSet<WorkerId>,
    ) {
        self.peers = records
            .iter()
            .filter(|r| &r.id != me && live.contains(&r.id))
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

    /// Follows each lease's owner from the last listing to this one (a listing pass only: a quiet
    /// pass sees no owner change): a lease whose owner changed starts its cooldown, its receiver
    /// sits out load moves while its figures settle, and until the round is over it gives nothing
    /// and its giver takes nothing.
    /// The loads themselves are updated by [`view`](Self::view), at every pass.
    pub(crate) fn follow_owners(&mut self, timing: &LoadTiming, leases: &[Lease], now: Instant) {
        // A worker that received a lease sits out load moves for two balance intervals, the time
        // its catch-up on the moved lease takes to pass (while it lasts its other leases share its
        // cores differently); the giver may give again but takes nothing until the round is over
        // (`LoadView::gave`); a worker that took a lease while free sits out one interval, by when
        // the lease has been measured at the tip of its shard (its catch-up is not counted, see
        // `LeaseMetrics::handled`).
        let interval = timing.interval;
        let (settle, round) = move_windows(interval, timing.jitter);
        let sit_out = |moved: &mut BTreeMap<WorkerId, Instant>, w: &WorkerId, d| {
            let until = now + d;
            let at = moved.entry(w.clone()).or_insert(until);
            *at = (*at).max(until);
        };
        let mut seen = BTreeMap::new();
        for lease in leases {
            let key = &lease.key;
            let (moved_at, before_move) = match self.owner_seen.remove(key) {
                Some(seen) if seen.owner == lease.owner => (seen.moved_at, seen.load),
                // Taken while free, never seen owned and with no figure ever seen (a fleet's first
                // pass, a new child): no figure to pin and no load move to damp, so it does not
                // cool. Cooling every lease of a starting fleet held off every load move for a
                // whole cooldown. A lease released since this worker saw it owned (`moved_at` set)
                // still cools, figure or not. Its new owner's figures are still the catch-up of
                // what waited while it had no owner, so that owner sits out load moves until the
                // lease has been measured at the tip of its shard for a while.
                Some(seen)
                    if seen.owner.is_none() && seen.load.is_none() && seen.moved_at.is_none() =>
                {
                    if let Some(to) = &lease.owner {
                        sit_out(&mut self.worker_moved, to, interval);
                    }
                    (None, None)
                }
                Some(seen) => {
                    // From one worker to another (a claim, a failover): the receiver's figures
                    // shift while it catches up; the giver's are right at once, but it takes
                    // nothing back for as long. A lease taken while free (a start, a release)
                    // changes no figure that counted.
                    // Until the round is over, each end keeps its side: the giver receives
                    // nothing and the receiver gives nothing (`LoadView::gave`, `received`).
                    if let (Some(from), Some(to)) = (&seen.owner, &lease.owner) {
                        sit_out(&mut self.worker_gave, from, round);
                        sit_out(&mut self.worker_moved, to, settle);
                        sit_out(&mut self.worker_received, to, round);
                    }
                    self.recent.insert(key.clone(), now);
                    (Some(now), seen.load)
                }
                None => (None, None),
            };
            seen.insert(
                key.clone(),
                SeenOwner { owner: lease.owner.clone(), moved_at, load: before_move },
            );
        }
        self.owner_seen = seen;
        let owner_seen = &self.owner_seen;
        self.recent.retain(|key, _| owner_seen.contains_key(key));
    }

    /// What the balancer knows of the loads when the fleet balances by load: each live peer's
    /// published loads, this worker's own (all of its leases), and the leases in their cooldown,
    /// as of `now`, over the owners of the last listing ([`follow_owners`](Self::follow_owners)).
    /// Its cost is in the figures published and the leases that moved lately, not in the leases:
    /// a quiet pass plans on the kept snapshot with it ([`load_moves_due`]).
    pub(crate) fn view(
        &mut self,
        timing: &LoadTiming,
        me: &WorkerId,
        now: Instant,
    ) -> crate::balancer::LoadView {
        let settings = &timing.settings;
        let cooldown = settings.cooldown_or_default(timing.interval);
        let (_, round_window) = move_windows(timing.interval, timing.jitter);
        let since = |at: &Instant| now.saturating_duration_since(*at);
        // A lease that moved cools for the cooldown; the round of moves is under way until the
        // other receivers of a plan have claimed (at their own passes) and both ends of each move
        // have planned again (see `move_windows`).
        self.recent.retain(|_, at| since(at) < cooldown.max(round_window));
        let round = self.recent.values().any(|at| since(at) < round_window);
        let cooling: BTreeSet<LeaseKey> = self
            .recent
            .iter()
            .filter(|(_, at)| since(at) < cooldown)
            .map(|(k, _)| k.clone())
            .collect();
        // Outside its cooldown, a lease's latest figure is remembered: while it cools after its
        // next move it keeps that figure, from before the move.
        for (key, load) in lease_figures(&self.peers, &self.mine, &self.owner_seen) {
            if cooling.contains(key) {
                continue;
            }
            if let Some(seen) = self.owner_seen.get_mut(key) {
                seen.load = Some(load);
            }
        }
        let pinned: BTreeMap<LeaseKey, f64> = cooling
            .iter()
            .filter_map(|k| self.owner_seen.get(k).and_then(|s| s.load).map(|l| (k.clone(), l)))
            .collect();
        self.worker_moved.retain(|_, until| now < *until);
        self.worker_gave.retain(|_, until| now < *until);
        self.worker_received.retain(|_, until| now < *until);
        let settling: BTreeSet<WorkerId> = self.worker_moved.keys().cloned().collect();
        let gave: BTreeSet<WorkerId> = self.worker_gave.keys().cloned().collect();
        let received: BTreeSet<WorkerId> = self.worker_received.keys().cloned().collect();
        let total: f64 = self.mine.iter().map(|l| l.load).sum();
        let mut view = crate::balancer::LoadView::new(settings.margin, settings.floor)
            .with_cooling(cooling)
            .with_pinned(pinned)
            .with_settling(settling)
            .with_gave(gave)
            .with_received(received)
            .with_round_in_progress(round)
            .with_worker(me.clone(), crate::balancer::PublishedLoad::new(total, self.mine.clone()));
        for (w, load) in &self.peers {
            view = view.with_worker(w.clone(), load.clone());
        }
        view
    }
}

/// The figure each lease is counted at, from what the live workers published: its owner's at the
/// last listing (this worker's own measure for its leases), or, when the owner published none for it (a lease
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
    owners: &BTreeMap<LeaseKey, SeenOwner>,
) -> BTreeMap<&'a LeaseKey, f64> {
    let mut figures: BTreeMap<&LeaseKey, f64> = BTreeMap::new();
    let mut from_owner: BTreeSet<&LeaseKey> = BTreeSet::new();
    for (id, p) in peers {
        for l in &p.leases {
            let by_owner = owners.get(&l.key).and_then(|s| s.owner.as_ref()) == Some(id);
            if by_owner {
                from_owner.insert(&l.key);
                figures.insert(&l.key, l.load);
            } else if !from_owner.contains(&l.key) {
                figures.insert(&l.key, l.load);
            }
        }
    }
    // This worker's own measure (all of its leases) last: it is the owner's for its leases.
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
    let Some(timing) = LoadTiming::of(shared) else { return false };
    let Some(mut snapshot) = state.loads.snapshot.take() else { return false };
    let me = snapshot.me.clone();
    snapshot.loads = Some(state.loads.view(&timing, &me, Instant::now()));
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
        let owned = |key: &str, owner: &str| {
            let mut l = Lease::new(key, Position::TrimHorizon);
            l.owner = Some(WorkerId::new(owner));
            l
        };
        let leases = [owned("a", "w1"), owned("b", "w3"), owned("c", "w1")];
        let owners: BTreeMap<LeaseKey, SeenOwner> = leases
            .iter()
            .map(|l| {
                let seen = SeenOwner { owner: l.owner.clone(), moved_at: None, load: None };
                (l.key.clone(), seen)
            })
            .collect();
        let peers = BTreeMap::from([
            (WorkerId::new("w1"), PublishedLoad::new(0.1, vec![LeaseLoad::new("a", 0.1)])),
            // An old incarnation's record, back after a rollback: stale figures for a and c.
            (
                WorkerId::new("w2"),
                PublishedLoad::new(0.9, vec![LeaseLoad::new("a", 0.5), LeaseLoad::new("c", 0.4)]),
            ),
        ]);
        let mine = vec![LeaseLoad::new("b", 0.2)];
        let figures = lease_figures(&peers, &mine, &owners);
        let get = |k: &str| figures.get(&LeaseKey::new(k)).copied();
        assert_eq!(get("a"), Some(0.1), "the owner's figure, not the stale record's");
        assert_eq!(get("b"), Some(0.2), "this worker's own measure");
        assert_eq!(get("c"), Some(0.4), "no figure from its owner: another record's");
    }

    #[test]
    fn only_live_peers_publish_figures() {
        use crate::load::LeaseLoad;
        let record = |id: &str, key: &str, load: f64| {
            let mut r = WorkerRecord::new(WorkerId::new(id), 7);
            r.load = Some(load);
            r.lease_loads = vec![LeaseLoad::new(key, load)];
            r
        };
        // w2 is a dead worker's record (or an old incarnation's, back after a rollback).
        let records = [record("w1", "a", 0.1), record("w2", "a", 0.9), record("w3", "b", 0.2)];
        let live = BTreeSet::from([WorkerId::new("w1"), WorkerId::new("w3")]);
        let mut t = LoadTracker::default();
        t.set_peers(&records, &WorkerId::new("w3"), &live);
        let peers: Vec<&str> = t.peers.keys().map(WorkerId::as_str).collect();
        assert_eq!(peers, ["w1"], "neither this worker nor a dead record");
    }

    #[test]
    fn a_moved_lease_cools_at_its_figure_from_before_the_move_and_quiet_views_follow_the_figures() {
        use crate::balancer::PublishedLoad;
        use crate::load::LeaseLoad;
        use crate::position::Position;
        let owned = |key: &str, owner: &str| {
            let mut l = Lease::new(key, Position::TrimHorizon);
            l.owner = Some(WorkerId::new(owner));
            l
        };
        let publish = |t: &mut LoadTracker, figures: &[(&str, &str, f64)]| {
            t.peers.clear();
            for (w, key, load) in figures {
                let p = t
                    .peers
                    .entry(WorkerId::new(*w))
                    .or_insert_with(|| PublishedLoad::new(0.0, Vec::new()));
                p.leases.push(LeaseLoad::new(*key, *load));
                p.total += load;
            }
        };
        let timing = LoadTiming {
            settings: crate::LoadBalance::default(),
            interval: Duration::from_secs(1),
            jitter: 0.0,
        };
        let cooldown = timing.settings.cooldown_or_default(timing.interval);
        let (_, round) = move_windows(timing.interval, timing.jitter);
        let me = WorkerId::new("w3");
        let (w1, w2) = (WorkerId::new("w1"), WorkerId::new("w2"));
        let t0 = Instant::now();
        let mut t = LoadTracker::default();
        t.follow_owners(&timing, &[owned("a", "w1"), owned("b", "w2")], t0);
        publish(&mut t, &[("w1", "a", 0.7), ("w2", "b", 0.2)]);
        let v = t.view(&timing, &me, t0);
        assert!(v.cooling.is_empty() && v.pinned.is_empty() && !v.round_in_progress);
        // A quiet view a moment later: a's figure moved; it is what a move would pin.
        publish(&mut t, &[("w1", "a", 0.6), ("w2", "b", 0.2)]);
        t.view(&timing, &me, t0 + timing.interval / 2);
        // The next listing sees a with w2: it cools at its figure from before the move.
        let t1 = t0 + timing.interval;
        t.follow_owners(&timing, &[owned("a", "w2"), owned("b", "w2")], t1);
        publish(&mut t, &[("w2", "a", 2.5), ("w2", "b", 0.2)]);
        let v = t.view(&timing, &me, t1);
        assert_eq!(v.cooling, BTreeSet::from([LeaseKey::new("a")]));
        assert_eq!(v.pinned.get(&LeaseKey::new("a")), Some(&0.6));
        assert!(v.settling.contains(&w2) && v.gave.contains(&w1) && v.round_in_progress);
        assert_eq!(v.received, BTreeSet::from([w2.clone()]));
        // Quiet views: still cooling within the cooldown, the round over after its window, and
        // after the cooldown the lease counts at its new owner's figure, remembered for its next
        // move.
        let v = t.view(&timing, &me, t1 + cooldown.min(round) / 2);
        assert!(v.cooling.contains(&LeaseKey::new("a")));
        let v = t.view(&timing, &me, t1 + cooldown.max(round));
        assert!(v.cooling.is_empty() && v.pinned.is_empty() && !v.round_in_progress);
        assert!(v.settling.is_empty() && v.gave.is_empty() && v.received.is_empty());
        assert_eq!(t.owner_seen[&LeaseKey::new("a")].load, Some(2.5));
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
