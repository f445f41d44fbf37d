//! One balance pass: list the leases, find what the store lost, reconcile the running lease tasks
//! with the listing, judge who is alive, and build the balancer's snapshot; then hand the plan to
//! `execute`. Everything a pass decides is decided here, from one listing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

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
use super::recover::{lost_leases, restore_lost};
use super::LoopState;

/// What a pass that listed the leases found.
pub(crate) struct PassOutcome {
    /// Nothing in progress: the next pass may skip the listing unless something changes.
    pub settled: bool,
    /// Leases listed (decoded or not).
    pub leases: usize,
    /// When a settled worker must list again whatever signals: the first failover deadline of
    /// an owner the listing names with no worker record.
    pub recheck_at: Option<Instant>,
}

/// One balance pass: lists the leases and acts on them. `None` when the listing failed. The
/// ownership changes the pass wrote are published once, at its end.
pub(super) async fn pass(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    state: &mut LoopState,
) -> Option<PassOutcome> {
    state.in_pass = true;
    let outcome = list_and_act(shared, events, state).await;
    state.in_pass = false;
    state.publish_changes(shared);
    state.tasks.publish(shared);
    outcome
}

/// What a pass sees once its listing is in and checked: the leases it may act on, and those it
/// must leave alone this pass.
struct PassView {
    /// When the listing was sent.
    list_sent: Instant,
    /// Leases listed, decoded or not.
    listed: usize,
    /// The usable leases: decoded, and not lost.
    leases: Vec<VersionedLease>,
    /// Leases that exist but cannot be used this pass: undecodable ones, and lost ones being
    /// restored. Their children stay blocked; the tasks of lost ones keep running (their owner
    /// restores them under its own name), and the next listing decides.
    withheld: BTreeSet<LeaseKey>,
    /// Whether the store lost any lease.
    any_lost: bool,
}

/// One pass, in its phases: list; check the listing against what the shard sync expects, what is
/// corrupt and what the store lost; judge the owners; reconcile the running tasks with the
/// listing; re-take what this id owns but was not granted; plan and carry out the plan.
pub(super) async fn list_and_act(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    state: &mut LoopState,
) -> Option<PassOutcome> {
    let view = list(shared, events, state).await?;
    let me = shared.id();
    let live = judge_owners(shared, state, &me, &view.leases).await;
    let now = Instant::now();
    // One index of the listing for the pass, and which leases are active decided once from it.
    let leases = &view.leases;
    let index: HashMap<&LeaseKey, &Lease> =
        leases.iter().map(|v| (&v.lease.key, &v.lease)).collect();
    let active: HashSet<&LeaseKey> = leases
        .iter()
        .filter(|v| is_active(&v.lease, &index, &view.withheld))
        .map(|v| &v.lease.key)
        .collect();
    let (resume, retake, stopped) =
        reconcile(shared, state, &me, leases, &index, &active, &view.withheld);
    let mut settled = !view.any_lost
        && view.withheld.is_empty()
        && resume.is_empty()
        && retake.is_empty()
        && stopped == 0
        && nothing_pending(&me, leases, &active, &live);
    for VersionedLease { lease, version } in resume {
        lease_task::spawn(shared, state, lease, version);
    }
    state.tasks.publish(shared);
    retake_ungranted(shared, state, retake).await;
    let starting = state.membership.before_full_view();
    let holding = starting || state.membership.holding_takes();
    let expired = expired_claims(shared, state, &me, leases, now);
    let mut snapshot = Snapshot {
        me: me.clone(),
        leases: leases.iter().map(|v| v.lease.clone()).collect(),
        withheld: view.withheld.clone(),
        live_workers: live,
        max_leases_per_worker: shared.cfg.max_leases_per_worker(),
        max_claims_per_pass: shared.cfg.max_claims_per_pass(),
        expired_claims: expired,
        seed: state.timing.random(),
        loads: None,
    };
    if let Some(timing) = super::loads::LoadTiming::of(shared) {
        state.loads.follow_owners(&timing, &snapshot.leases, now);
        snapshot.loads = Some(state.loads.view(&timing, &me, now));
    }
    let mut plan = state.balancer.plan(&snapshot);
    if tracing::enabled!(tracing::Level::DEBUG) {
        log_pass_view(&me, leases, &active, &snapshot, &plan);
    }
    // Balancing by load, the loads move while the leases stay put: a quiet pass plans again on
    // this snapshot with the loads of its time (`load_moves_due`). Kept, not copied.
    state.loads.keep_snapshot(snapshot.loads.is_some().then_some(snapshot));
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
        answered = execute(shared, state, &plan, &by_key).await;
    }
    // After the plan, which answers claims: only a claim this pass could not answer counts.
    yield_unanswered_claims(shared, state, &me, leases, view.list_sent, now, &answered);
    settled &= state.claims.none_mine();
    let recheck_at = state.membership.liveness().absent_owners_due(Instant::now());
    Some(PassOutcome { settled, leases: view.listed, recheck_at })
}

/// The first phase: lists the leases, applies what happened meanwhile, asks for a full shard
/// sync when a lease it expects is missing, reports corrupt records, and restores what the store
/// lost. `None` when the listing failed.
async fn list(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    state: &mut LoopState,
) -> Option<PassView> {
    let list_sent = Instant::now();
    let listing = match shared.store.list_leases().await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing leases failed; skipping this balance pass");
            stop_unanswered_past_deadline(shared, state, Instant::now());
            return None;
        }
    };
    // Tasks that ended while the listing was on its way leave the map before it is reconciled
    // with the listing (they would otherwise count as running for this pass), and the memory
    // takes in the checkpoints written meanwhile before it is compared with the listing.
    state.drain(shared, events);
    state.sync_checkpoints();
    shared.metrics.lease_listing();
    let listed = listing.items.len() + listing.corrupt.len();
    ask_sync_for_missing(shared, state, &listing);
    report_corrupt(shared, state, &listing.corrupt);
    let corrupt: BTreeSet<LeaseKey> =
        listing.corrupt.iter().map(|c| LeaseKey::new(c.key.clone())).collect();
    let lost = lost_leases(shared, state, &listing.items, &corrupt, list_sent).await;
    let any_lost = !lost.is_empty();
    let mut leases = listing.items;
    let mut withheld = corrupt;
    if lost.is_empty() {
        state.memory.clear_lost();
    } else {
        withheld.extend(lost.iter().map(|l| l.key().clone()));
        leases.retain(|v| !withheld.contains(&v.lease.key));
        let vanished = leases.is_empty() && listing.corrupt.is_empty();
        restore_lost(shared, state, lost, vanished).await;
    }
    Some(PassView { list_sent, listed, leases, withheld, any_lost })
}

/// A lease the last shard sync saw is gone (the store lost it, or a peer collected it): the next
/// sync lists the leases and creates what is missing, at once. Asked once per published
/// expectation: the sync loop publishes a new one after the full sync this asks for.
fn ask_sync_for_missing(
    shared: &Shared,
    state: &mut LoopState,
    listing: &crate::store::Listing<VersionedLease>,
) {
    let Some(expected) = shared.expected.borrow().clone() else { return };
    if state.missed.as_ref().is_some_and(|m| Arc::ptr_eq(m, &expected)) {
        return;
    }
    let keys: BTreeSet<&str> = listing
        .items
        .iter()
        .map(|v| v.lease.key.as_str())
        .chain(listing.corrupt.iter().map(|c| c.key.as_str()))
        .collect();
    if expected.iter().any(|k| !keys.contains(k.as_str())) {
        state.missed = Some(expected);
        let _ = shared.sync.send(SyncRequest::Now(None));
    }
}

/// Who counts as alive for this pass: see [`live_set`]. Without a view of the workers newer
/// than the listing, every owner named in it does (nobody's leases are taken this pass).
async fn judge_owners(
    shared: &Shared,
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> BTreeSet<WorkerId> {
    let fresh_view = look_again_at_owners_judged_dead(shared, state, me, leases).await;
    let mut live = live_set(state, me, leases);
    if !fresh_view {
        live.extend(leases.iter().filter_map(|v| v.lease.owner.clone()));
    }
    live
}

/// Re-takes by compare-and-set the leases this id owns but this process was not granted (see
/// [`reconcile`]), concurrently (bounded), like the takes: a join's newcomer re-takes every lease
/// handed to it in one pass. Before the full view (a start with the change stream open), only the
/// leases handed over in answer to this worker's own claims are re-taken; one this id owned before
/// is left for the pass after the hold, like a free lease. Nothing while the store is seen going
/// back in time.
async fn retake_ungranted(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    retake: Vec<VersionedLease>,
) {
    if state.membership.holding_takes() {
        return;
    }
    let retake: Vec<VersionedLease> = if state.membership.before_full_view() {
        retake.into_iter().filter(|v| state.claims.is_mine(&v.lease.key)).collect()
    } else {
        retake
    };
    for chunk in retake.chunks(shared.cfg.take_concurrency()) {
        let chunk: Vec<&VersionedLease> = chunk.iter().collect();
        let won = take_all(shared, state, &chunk).await;
        for (v, won) in chunk.iter().zip(won) {
            if won {
                info!(shard = %v.lease.key, "re-took by compare-and-set a lease this process was not granted");
            }
        }
    }
}

/// What a pass saw, at DEBUG.
fn log_pass_view(
    me: &WorkerId,
    leases: &[VersionedLease],
    active: &HashSet<&LeaseKey>,
    snapshot: &Snapshot,
    plan: &crate::balancer::Plan,
) {
    let available: Vec<&LeaseKey> = leases
        .iter()
        .filter(|v| active.contains(&v.lease.key))
        .filter(|v| v.lease.owner.as_ref().is_none_or(|o| !snapshot.live_workers.contains(o)))
        .map(|v| &v.lease.key)
        .take(3)
        .collect();
    let mine =
        leases.iter().filter(|v| active.contains(&v.lease.key) && v.lease.is_owned_by(me)).count();
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

/// Whether a listing shows nothing waiting for this worker to act: every active lease owned by
/// a worker of `live` (the pass's: this worker, those whose heartbeat moves, and owners with no
/// record yet within their failover timeout, which the pass lists again at its end, see
/// [`PassOutcome::recheck_at`]), and no claim by or on this worker. (A lease of a worker that
/// stopped beating needs passes until its failover timeout is up and someone takes it.) An owner
/// with no record is most often a worker that joined since this worker's last full listing of the
/// workers, which the pacing of full listings may put off for a while: counting its leases as
/// pending had every worker list every lease each pass meanwhile. A claim left on a lease that finished since (its shard ended while the handoff was
/// pending) waits for nobody: counting it kept a quiet fleet listing every lease on every pass for
/// as long as the finished lease stayed in the store.
///
/// A claim between two other live workers is theirs to settle: the owner answers it, the
/// claimant times it out, and whatever either writes (a handoff, a cleared or taken-over claim)
/// moves their count of changes, which makes this worker list again. Counting it kept every
/// bystander listing every lease each pass for as long as any handoff was pending anywhere in the
/// fleet: 512 workers settling 2,048 leases on Redis read lease records at
/// `W × N / balance interval` and never converged.
pub(super) fn nothing_pending(
    me: &WorkerId,
    leases: &[VersionedLease],
    active: &HashSet<&LeaseKey>,
    live: &BTreeSet<WorkerId>,
) -> bool {
    leases.iter().all(|VersionedLease { lease: l, .. }| {
        let owned_live = l.owner.as_ref().is_some_and(|o| o == me || live.contains(o));
        let claim_of_mine =
            l.live_claim().is_some_and(|c| &c.by == me || l.owner.as_ref() == Some(me));
        !active.contains(&l.key) || (owned_live && !claim_of_mine)
    })
}

pub(super) fn report_corrupt(
    shared: &Shared,
    state: &mut LoopState,
    corrupt: &[crate::store::CorruptRecord],
) {
    if corrupt.is_empty() {
        return;
    }
    shared.metrics.corrupt(corrupt.len());
    let reported = &mut state.reported_corrupt;
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
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> bool {
    let judged_dead: BTreeSet<WorkerId> = {
        let former = shared.incarnation.borrow().former.clone();
        let live = state.membership.liveness().live_workers();
        leases
            .iter()
            .filter_map(|v| v.lease.owner.as_ref())
            .filter(|o| *o != me && !former.contains(o) && !live.contains(*o))
            .cloned()
            .collect()
    };
    if judged_dead.is_empty() {
        return true;
    }
    // Only those owners' records: what is asked is whether they beat since, and a fleet of
    // thousands costs a few records, not a listing.
    let ids: Vec<WorkerId> = judged_dead.iter().cloned().collect();
    let started = Instant::now();
    let limit = shared.cfg.heartbeat_interval();
    match tokio::time::timeout(limit, shared.store.get_workers(&ids)).await {
        Ok(Ok(listing)) => {
            let records: Vec<_> =
                listing.items.into_iter().filter(|r| r.notice_of().is_none()).collect();
            state.membership.observe(&records, Some(&judged_dead), &[], started, Instant::now());
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
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> BTreeSet<WorkerId> {
    let liveness = state.membership.liveness_mut();
    let mut live = liveness.live_workers();
    live.insert(me.clone());
    let owners: BTreeSet<&WorkerId> =
        leases.iter().filter_map(|v| v.lease.owner.as_ref()).collect();
    for w in &owners {
        if !live.contains(*w) && liveness.is_alive(w) {
            live.insert((*w).clone());
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
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
    by_key: &HashMap<&LeaseKey, &Lease>,
    active: &HashSet<&LeaseKey>,
    withheld: &BTreeSet<LeaseKey>,
) -> (Vec<VersionedLease>, Vec<VersionedLease>, usize) {
    let mut stopped = 0;
    {
        for (key, task) in state.tasks.iter().filter(|(k, _)| !withheld.contains(*k)) {
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
    let tasks = &state.tasks;
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
        l.is_owned_by(me) && tasks.granted(&l.key) == Some(l.epoch)
    });
    (resume, retake, stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Claim, Version};
    use crate::Position;

    fn lease(key: &str, owner: Option<&str>, claim_by: Option<&str>) -> VersionedLease {
        let mut l = Lease::new(LeaseKey::new(key), Position::TrimHorizon);
        l.owner = owner.map(WorkerId::new);
        l.claim = claim_by.map(|by| Claim { by: WorkerId::new(by), at: l.epoch });
        VersionedLease { lease: l, version: Version(1) }
    }

    /// What keeps `me` listing: only what it must act on or watch for.
    #[test]
    fn only_what_concerns_this_worker_keeps_it_listing() {
        let me = WorkerId::new("me");
        let live: BTreeSet<WorkerId> = ["me", "a", "b"].into_iter().map(WorkerId::new).collect();
        // (what, owner, claimant, pending?)
        let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            ("mine, unclaimed", Some("me"), None, false),
            ("a live peer's, unclaimed", Some("a"), None, false),
            ("a claim between two other live workers", Some("a"), Some("b"), false),
            ("a claim on my lease", Some("me"), Some("a"), true),
            ("my claim on a peer's lease", Some("a"), Some("me"), true),
            ("no owner", None, None, true),
            ("an owner not live", Some("dead"), None, true),
            ("a claim on a lease whose owner is not live", Some("dead"), Some("a"), true),
        ];
        for (what, owner, claim, pending) in cases {
            let leases = [lease("k", *owner, *claim)];
            let active: HashSet<&LeaseKey> = leases.iter().map(|v| &v.lease.key).collect();
            assert_eq!(!nothing_pending(&me, &leases, &active, &live), *pending, "{what}");
            let inactive = HashSet::new();
            assert!(nothing_pending(&me, &leases, &inactive, &live), "{what}, lease inactive");
        }
    }
}
