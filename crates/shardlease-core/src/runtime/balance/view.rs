//! One balance pass: list the leases, find what the store lost, reconcile the running lease tasks
//! with the listing, judge who is alive, and build the balancer's snapshot; then hand the plan to
//! `execute`. Everything a pass decides is decided here, from one listing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use tokio::sync::mpsc::UnboundedReceiver;

use super::super::events::Event;
use super::super::lease_task;
use super::super::shared::{Shared, StopReason, SyncRequest};
use crate::balancer::{is_active, Snapshot};
use crate::lease::{Lease, LeaseKey, VersionedLease, WorkerId};

use super::claims::{expired_claims, stop_unanswered_past_deadline, yield_unanswered_claims};
use super::execute::{execute, take_all};
use super::owner::SeenOwner;
use super::recover::{lost_leases, restore_lost};
use super::Owner;

/// What a pass that listed the leases found.
pub(crate) struct PassOutcome {
    /// Nothing in progress: the next pass may skip the listing unless something changes.
    pub settled: bool,
    /// Leases listed (decoded or not).
    pub leases: usize,
}

/// One balance pass: lists the leases and acts on them. `None` when the listing failed. The
/// ownership changes the pass wrote are published once, at its end.
pub(super) async fn pass(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    owner: &mut Owner,
) -> Option<PassOutcome> {
    owner.in_pass = true;
    let outcome = list_and_act(shared, events, owner).await;
    owner.in_pass = false;
    owner.publish_changes(shared);
    owner.publish_tasks(shared);
    outcome
}

pub(super) async fn list_and_act(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    owner: &mut Owner,
) -> Option<PassOutcome> {
    let list_sent = Instant::now();
    let listing = match shared.store.list_leases().await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing leases failed; skipping this balance pass");
            stop_unanswered_past_deadline(shared, owner, Instant::now());
            return None;
        }
    };
    // Tasks that ended while the listing was on its way leave the map before it is reconciled
    // with the listing (they would otherwise count as running for this pass).
    owner.drain(shared, events);
    shared.metrics.lease_listing();
    let listed = listing.items.len() + listing.corrupt.len();
    {
        // A lease the last shard sync saw is gone (the store lost it, or a peer collected it):
        // the next sync lists the leases and creates what is missing, at once.
        let keys: BTreeSet<&str> = listing
            .items
            .iter()
            .map(|v| v.lease.key.as_str())
            .chain(listing.corrupt.iter().map(|c| c.key.as_str()))
            .collect();
        // Asked once per published expectation: the sync loop publishes a new one after the
        // full sync this asks for.
        let expected = shared.expected.borrow().clone();
        if let Some(e) = expected {
            let asked = owner.missed.as_ref().is_some_and(|m| Arc::ptr_eq(m, &e));
            if !asked && e.iter().any(|k| !keys.contains(k.as_str())) {
                owner.missed = Some(e);
                let _ = shared.sync.send(SyncRequest::Now(None));
            }
        }
    }
    report_corrupt(shared, owner, &listing.corrupt);
    let corrupt: BTreeSet<LeaseKey> =
        listing.corrupt.iter().map(|c| LeaseKey::new(c.key.clone())).collect();
    let lost = lost_leases(shared, owner, &listing.items, &corrupt, list_sent).await;
    let any_lost = !lost.is_empty();
    let mut leases = listing.items;
    // Leases that exist but cannot be used this pass: undecodable ones, and lost ones being
    // restored. Their children stay blocked; the tasks of lost ones keep running (their owner
    // restores them under its own name), and the next listing decides.
    let mut withheld = corrupt;
    if lost.is_empty() {
        owner.lost_since.clear();
    } else {
        withheld.extend(lost.iter().map(|l| l.key().clone()));
        leases.retain(|v| !withheld.contains(&v.lease.key));
        let vanished = leases.is_empty() && listing.corrupt.is_empty();
        restore_lost(shared, owner, lost, vanished).await;
    }
    let me = shared.id();
    let fresh_view = look_again_at_owners_judged_dead(shared, owner, &me, &leases).await;
    let now = Instant::now();
    let mut live = live_set(owner, &me, &leases);
    if !fresh_view {
        // No view of the workers newer than the listing: nobody's leases are taken this pass.
        live.extend(leases.iter().filter_map(|v| v.lease.owner.clone()));
    }
    // One index of the listing for the pass, and which leases are active decided once from it.
    let index: HashMap<&LeaseKey, &Lease> =
        leases.iter().map(|v| (&v.lease.key, &v.lease)).collect();
    let active: HashSet<&LeaseKey> = leases
        .iter()
        .filter(|v| is_active(&v.lease, &index, &withheld))
        .map(|v| &v.lease.key)
        .collect();
    let (resume, retake, stopped) =
        reconcile(shared, owner, &me, &leases, &index, &active, &withheld);
    let mut settled = !any_lost
        && withheld.is_empty()
        && resume.is_empty()
        && retake.is_empty()
        && stopped == 0
        && nothing_pending(owner, &me, &leases, &active);
    for VersionedLease { lease, version } in resume {
        lease_task::spawn(shared, owner, lease, version);
    }
    owner.publish_tasks(shared);
    let starting = owner.before_full_view();
    let rolled_back = owner.holding_takes();
    let holding = rolled_back || starting;
    // Before the full view (a start with the change stream open), only the leases handed over in
    // answer to this worker's own claims are re-taken; one this id owned before is left for the
    // pass after the hold, like a free lease.
    let retake: Vec<VersionedLease> = if starting {
        retake.into_iter().filter(|v| owner.my_claims.contains_key(&v.lease.key)).collect()
    } else {
        retake
    };
    // Concurrently (bounded), like the takes: a join's newcomer re-takes every lease handed to it
    // in one pass, and one at a time that cost a store round trip each (about a second for four
    // on a busy SQLite file).
    if !rolled_back {
        for chunk in retake.chunks(shared.cfg.take_concurrency()) {
            let chunk: Vec<&VersionedLease> = chunk.iter().collect();
            let won = take_all(shared, owner, &chunk).await;
            for (v, won) in chunk.iter().zip(won) {
                if won {
                    info!(shard = %v.lease.key, "re-took by compare-and-set a lease this process was not granted");
                }
            }
        }
    }
    let expired = expired_claims(shared, owner, &me, &leases, now);
    let mut snapshot = Snapshot {
        me: me.clone(),
        leases: leases.iter().map(|v| v.lease.clone()).collect(),
        withheld,
        live_workers: live,
        max_leases_per_worker: shared.cfg.max_leases_per_worker(),
        max_claims_per_pass: shared.cfg.max_claims_per_pass(),
        expired_claims: expired,
        seed: owner.timing.random(),
        loads: None,
    };
    snapshot.loads = load_view(shared, owner, &me, &snapshot.leases, now);
    let mut plan = owner.balancer.plan(&snapshot);
    // Balancing by load, the loads move while the leases stay put: a quiet pass plans again on
    // this snapshot with the loads of its time (`load_moves_due`).
    owner.load_snapshot = snapshot.loads.is_some().then(|| snapshot.clone());
    if tracing::enabled!(tracing::Level::DEBUG) {
        let available: Vec<&LeaseKey> = leases
            .iter()
            .filter(|v| active.contains(&v.lease.key))
            .filter(|v| v.lease.owner.as_ref().is_none_or(|o| !snapshot.live_workers.contains(o)))
            .map(|v| &v.lease.key)
            .take(3)
            .collect();
        let mine = leases
            .iter()
            .filter(|v| active.contains(&v.lease.key) && v.lease.is_owned_by(&me))
            .count();
        debug!(
            listed = leases.len(),
            active = active.len(),
            withheld = snapshot.withheld.len(),
            live = ?snapshot.live_workers,
            mine,
            ?available,
            take = plan.take_count,
            claims = plan.claims.len(),
            "pass view"
        );
    }
    if holding && (plan.take_count > 0 || !plan.take_over.is_empty()) {
        if starting {
            debug!(
                take = plan.take_count,
                "starting: claims only until the full view of the workers"
            );
        } else {
            debug!(take = plan.take_count, "the store went back in time: no takes this pass");
        }
        plan.take_count = 0;
        plan.take_over.clear();
        settled = false;
    }
    shared.metrics.balance_pass();
    let mut answered = BTreeSet::new();
    if !plan.is_empty() {
        settled = false;
        debug!(
            take = plan.take_count,
            claims = plan.claims.len(),
            handoffs = plan.handoffs.len(),
            "balance plan"
        );
        let by_key: BTreeMap<&LeaseKey, &VersionedLease> =
            leases.iter().map(|v| (&v.lease.key, v)).collect();
        answered = execute(shared, owner, &plan, &by_key).await;
    }
    // After the plan, which answers claims: only a claim this pass could not answer counts.
    yield_unanswered_claims(shared, owner, &me, &leases, list_sent, now, &answered);
    settled &= owner.my_claims.is_empty();
    Some(PassOutcome { settled, leases: listed })
}

/// Whether a listing shows nothing waiting for a worker to act: every active lease unclaimed and
/// owned by this worker or by one whose heartbeat moves. (A lease of a worker that stopped
/// beating needs passes until its failover timeout is up and someone takes it.) A claim left on a
/// lease that finished since (its shard ended while the handoff was pending) waits for nobody:
/// counting it kept a quiet fleet listing every lease on every pass for as long as the finished
/// lease stayed in the store.
pub(super) fn nothing_pending(
    owner: &Owner,
    me: &WorkerId,
    leases: &[VersionedLease],
    active: &HashSet<&LeaseKey>,
) -> bool {
    let live = owner.liveness.live_workers();
    leases.iter().all(|VersionedLease { lease: l, .. }| {
        !active.contains(&l.key)
            || (l.live_claim().is_none()
                && l.owner.as_ref().is_some_and(|o| o == me || live.contains(o)))
    })
}

pub(super) fn report_corrupt(
    shared: &Shared,
    owner: &mut Owner,
    corrupt: &[crate::store::CorruptRecord],
) {
    if corrupt.is_empty() {
        return;
    }
    shared.metrics.corrupt(corrupt.len());
    let reported = &mut owner.reported_corrupt;
    for c in corrupt {
        if reported.insert(c.key.clone()) {
            warn!(shard = %c.key, reason = %c.reason, "corrupt lease record skipped; the other leases go on");
        }
    }
}

/// Lists the worker records again when the listing names an owner this worker judges dead, and
/// returns whether the view of the workers is newer than the listing (always, when no such
/// owner is named).
///
/// The judgement may be older than the listing: this worker's own listings of the workers failed
/// for a while (a partition, store errors, a self-fence it just came back from), and the owner
/// came back since, or a process restarted under its id took the lease again. Taking the lease
/// from it then would run it twice until its owner's next fenced write. A process writes its
/// heartbeat before it takes anything, so a listing of the workers started after this listing
/// of the leases returned shows every owner named in it alive, if it is.
pub(super) async fn look_again_at_owners_judged_dead(
    shared: &Shared,
    owner: &mut Owner,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> bool {
    let judged_dead = {
        let former = shared.incarnation.borrow().former.clone();
        let live = owner.liveness.live_workers();
        leases
            .iter()
            .filter_map(|v| v.lease.owner.as_ref())
            .any(|o| o != me && !former.contains(o) && !live.contains(o))
    };
    if !judged_dead {
        return true;
    }
    let started = Instant::now();
    match tokio::time::timeout(shared.cfg.heartbeat_interval(), shared.store.list_workers()).await {
        Ok(Ok(listing)) => {
            owner.observe_workers(&listing.items, started, Instant::now());
            true
        }
        Ok(Err(e)) => {
            debug!(error = %crate::error::ErrorChain(&e), "listing workers before a take-over failed; taking nobody's leases this pass");
            false
        }
        Err(_) => {
            debug!(
                "listing workers before a take-over timed out; taking nobody's leases this pass"
            );
            false
        }
    }
}

/// Workers judged alive: those with a moving heartbeat, owners whose record this worker has not
/// seen for less than the failover timeout, and this worker itself.
pub(super) fn live_set(
    owner: &mut Owner,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> BTreeSet<WorkerId> {
    let liveness = &mut owner.liveness;
    let mut live = liveness.live_workers();
    live.insert(me.clone());
    let owners: BTreeSet<&WorkerId> =
        leases.iter().filter_map(|v| v.lease.owner.as_ref()).collect();
    for owner in &owners {
        if !live.contains(*owner) && liveness.is_alive(owner) {
            live.insert((*owner).clone());
        }
    }
    // Records never seen beating that own and claim nothing are left out of the shares: most
    // often a worker that crashed a moment ago, whose leases its peers took over already, which
    // would otherwise count for a whole failover timeout (a newcomer then aims at too small a
    // share and needs a second round of claims). Leaving them out makes no lease available and
    // answers no claim (they own and claim nothing in this listing, and every write is a
    // compare-and-set against it); a live one is counted again once its beat moves, within
    // about a heartbeat (docs/algorithm.md, "Records never seen beating").
    let unproven = liveness.unproven();
    if !unproven.is_empty() {
        let named: BTreeSet<&WorkerId> = leases
            .iter()
            .flat_map(|v| v.lease.owner.iter().chain(v.lease.claim.iter().map(|c| &c.by)))
            .collect();
        live.retain(|w| w == me || named.contains(w) || !unproven.contains(w));
    }
    liveness.retain_absent(&owners);
    live
}

/// Stops tasks whose lease moved on (not those of `withheld` leases, which this pass cannot see),
/// and returns the active leases this worker owns but is not running, in two groups:
/// - granted to this process at exactly the listed epoch (it took the lease while an older task
///   for the key was still stopping, or a peer handed it over answering this process's claim):
///   resumed directly;
/// - anything else the store says this worker (or an earlier incarnation of it) owns: re-taken by
///   compare-and-set with a new epoch. A predecessor process with the same id may have held it and
///   a peer that judged that process dead may be taking it right now; the CAS makes exactly one
///   of the two win. A listing older than a handoff this worker made also lands here, and its
///   CAS fails against the newer version.
#[allow(clippy::type_complexity)]
pub(super) fn reconcile(
    shared: &Arc<Shared>,
    owner: &mut Owner,
    me: &WorkerId,
    leases: &[VersionedLease],
    by_key: &HashMap<&LeaseKey, &Lease>,
    active: &HashSet<&LeaseKey>,
    withheld: &BTreeSet<LeaseKey>,
) -> (Vec<VersionedLease>, Vec<VersionedLease>, usize) {
    let mut stopped = 0;
    {
        for (key, task) in owner.tasks.iter().filter(|(k, _)| !withheld.contains(*k)) {
            let still_mine =
                by_key.get(key).is_some_and(|l| l.is_owned_by(me) && l.epoch == task.epoch);
            if !still_mine
                && task.is_running()
                && task.stop.borrow().as_ref().is_none_or(|r| !r.is_abrupt())
            {
                info!(shard = %key, "lease moved on; stopping its task");
                shared.metrics.lost(key);
                task.stop.send_replace(Some(StopReason::LeaseLost));
                stopped += 1;
            }
        }
    }
    if shared.stop_taking.is_cancelled() || shared.is_fenced() {
        return (Vec::new(), Vec::new(), stopped);
    }
    let former = shared.incarnation.borrow().former.clone();
    let tasks = &owner.tasks;
    let granted = &owner.granted;
    // A lease claimed by a peer is not restarted here: the plan hands it over or clears the claim.
    let idle = leases.iter().filter(|VersionedLease { lease, .. }| {
        lease.owner.as_ref().is_some_and(|o| o == me || former.contains(o))
            && active.contains(&lease.key)
            && !tasks.contains_key(&lease.key)
            && lease.live_claim().is_none_or(|c| &c.by == me)
    });
    // Only a lease this process was granted (took itself, at this epoch) is resumed as it stands.
    // One handed to this id is re-taken by compare-and-set: two processes under one id can hold
    // the same claim, and the write lets exactly one of them run it (docs/algorithm.md, "Why a
    // handed-over lease is re-taken").
    let (resume, retake) = idle.cloned().partition(|VersionedLease { lease: l, .. }| {
        l.is_owned_by(me) && granted.get(&l.key) == Some(&l.epoch)
    });
    (resume, retake, stopped)
}

/// How long the receiver of a load move sits out load moves and its giver takes none (see
/// `load_view`), and how long a round of load moves stays under way after a lease changed owner
/// (`LoadView::round_in_progress`), for a balance interval and its jitter (a fraction).
///
/// A round must outlast the sit-out of its moves by a pass (an interval and its jitter): a worker
/// still outside the band once the figures show the move then moves again at the round's line. A
/// round that ended first (1.5 intervals, against a sit-out of 2) left such a worker short of the
/// start line: the `skew` bench's seed 7 sat at 1.21 of the mean for 23 intervals before noise
/// crossed the line.
fn move_windows(interval: Duration, jitter: f64) -> (Duration, Duration) {
    // `Config` bounds the interval and the jitter, as for the other jittered waits.
    let settle = interval * 2;
    (settle, settle + interval.mul_f64(1.0 + jitter) + interval / 2)
}

/// What the balancer knows of the loads when the fleet balances by load: each live peer's
/// published loads, this worker's own (all of its leases), and the leases in their cooldown.
/// Also follows each lease's owner from listing to listing to time the cooldowns.
fn load_view(
    shared: &Shared,
    owner: &mut Owner,
    me: &crate::ids::WorkerId,
    leases: &[Lease],
    now: Instant,
) -> Option<crate::balancer::LoadView> {
    let crate::Balance::ByLoad(settings) = shared.cfg.balance() else { return None };
    let cooldown = settings.cooldown_or_default(shared.cfg.balance_interval());
    // The latest figure published for each lease, by whoever owned it.
    let mut latest: BTreeMap<&LeaseKey, f64> = BTreeMap::new();
    for p in owner.peer_loads.values() {
        latest.extend(p.leases.iter().map(|l| (&l.key, l.load)));
    }
    latest.extend(owner.my_loads.iter().map(|l| (&l.key, l.load)));
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
        let (moved_at, before_move) = match owner.owner_seen.remove(key) {
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
                    sit_out(&mut owner.worker_moved, to, interval);
                }
                (None, None)
            }
            Some(seen) => {
                // From one worker to another (a claim, a failover): the receiver's figures shift
                // while it catches up; the giver's are right at once, but it takes nothing back
                // for as long.
                // A lease taken while free (a start, a release) changes no figure that counted.
                if let (Some(from), Some(to)) = (&seen.owner, &lease.owner) {
                    sit_out(&mut owner.worker_gave, from, settle);
                    sit_out(&mut owner.worker_moved, to, settle);
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
        let load = if in_cooldown { before_move } else { latest.get(key).copied().or(before_move) };
        if in_cooldown {
            cooling.insert(key.clone());
            if let Some(l) = load {
                pinned.insert(key.clone(), l);
            }
        }
        seen.insert(key.clone(), SeenOwner { owner: lease.owner.clone(), moved_at, load });
    }
    owner.owner_seen = seen;
    owner.worker_moved.retain(|_, until| now < *until);
    owner.worker_gave.retain(|_, until| now < *until);
    let settling: BTreeSet<crate::ids::WorkerId> = owner.worker_moved.keys().cloned().collect();
    let gave: BTreeSet<crate::ids::WorkerId> = owner.worker_gave.keys().cloned().collect();
    let total: f64 = owner.my_loads.iter().map(|l| l.load).sum();
    let mut view = crate::balancer::LoadView::new(settings.margin, settings.floor)
        .with_cooling(cooling)
        .with_pinned(pinned)
        .with_settling(settling)
        .with_gave(gave)
        .with_round_in_progress(round)
        .with_worker(
            me.clone(),
            crate::balancer::PublishedLoad::new(total, owner.my_loads.clone()),
        );
    for (w, load) in &owner.peer_loads {
        view = view.with_worker(w.clone(), load.clone());
    }
    Some(view)
}

/// Balancing by load, whether a quiet pass must list after all: planned again on the last
/// listing's snapshot with the loads measured since (and the cooldowns as of now), the balancer
/// would claim. In a settled fleet nothing but the loads changed since that listing (any other
/// change asks for a listing anyway), so this is the plan a listing would give, found without
/// reading a lease: a load shift is acted on within a balance interval, and a fleet whose loads
/// hold still reads no leases (docs/algorithm.md, "Balancing by load").
pub(super) fn load_moves_due(shared: &Shared, owner: &mut Owner) -> bool {
    let Some(mut snapshot) = owner.load_snapshot.take() else { return false };
    let me = snapshot.me.clone();
    snapshot.loads = load_view(shared, owner, &me, &snapshot.leases, Instant::now());
    snapshot.seed = owner.timing.random();
    let due = !owner.balancer.plan(&snapshot).claims.is_empty();
    owner.load_snapshot = Some(snapshot);
    due
}

#[cfg(test)]
mod tests {
    use super::*;

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
