//! The balance loop: list the leases, reconcile the running lease tasks with what the store says,
//! ask the balancer for a plan, and carry it out with compare-and-set writes.
//!
//! Every write here is a CAS against the version just listed, so two workers acting on the same
//! snapshot can never both win; the loser simply skips to its next candidate.
//!
//! A pass lists the leases only when it may have something to do: the previous listing showed
//! work in progress (a plan, a claim, a lost or corrupt lease, a lease without a live owner), or
//! something changed since (a peer's published change count moved, a worker came, went or died,
//! this worker changed an owner, one of its lease tasks ended or had a write refused), or the
//! safety net is due. Otherwise the pass is quiet: in a settled fleet a worker reads worker
//! records every heartbeat and no leases. docs/algorithm.md explains why nothing is missed.
//!
//! The loop is the only writer of the lease-task map: it starts the tasks, and removes each when it
//! drains the `Exited` report the task sends on the loop's channel (docs/algorithm.md, "Who owns
//! the runtime's state"). At shutdown it collects those reports into the `ShutdownReport`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use tokio::sync::{mpsc, oneshot};

use super::shared::{lock, MyClaim, Shared, StopReason};
use super::shutdown_report::{ReleasedLease, ShutdownReport};
use super::{cas, lease_task, recovery};
use crate::balancer::{is_active, Plan, Snapshot};
use crate::error::Error;
use crate::lease::{Claim, Epoch, Lease, LeaseKey, Version, VersionedLease, WorkerId};
use crate::store::CreateOutcome;

/// The balance loop's receiving ends, created with the worker and handed to the loop at start.
pub(crate) struct Inbox {
    /// How lease tasks ended.
    pub exits: mpsc::UnboundedReceiver<lease_task::Exited>,
    /// Requests from the worker's handle.
    pub requests: mpsc::UnboundedReceiver<Request>,
}

/// A request to the balance loop.
pub(crate) enum Request {
    /// Answer after the next pass that lists the leases (`WorkerHandle::balance_now`).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    Pass(oneshot::Sender<()>),
    /// Collect how the lease tasks of a shutdown ended.
    Shutdown(Shutdown),
}

/// A shutdown's request for the lease tasks it stopped.
pub(crate) struct Shutdown {
    /// When a task still running is aborted and its lease released anyway.
    pub deadline: Instant,
    /// The tasks running when the shutdown began (each asked to stop already), by epoch.
    pub held: BTreeMap<LeaseKey, Epoch>,
    /// Where the report goes.
    pub reply: oneshot::Sender<ShutdownReport>,
}

/// State only the balance loop reads and writes, so it needs no lock.
#[derive(Default)]
pub(crate) struct LoopState {
    /// When the previous pass's listing was sent.
    previous_listing: Option<Instant>,
    /// Leases this worker owns that a peer claimed: the record version last listed, and the
    /// earliest moment that version can have been written (see `yield_unanswered_claims`).
    claims_on_mine: BTreeMap<LeaseKey, (Version, Instant)>,
    /// Since when each lost lease has been found lost, in passes without a break.
    lost_since: BTreeMap<LeaseKey, Instant>,
    /// Corrupt records already reported (reported once, then counted quietly).
    reported_corrupt: BTreeSet<String>,
    /// Reports of tasks that ended after taking stopped, drained before the shutdown asked for
    /// them: it collects them from here.
    exited_while_stopping: Vec<lease_task::Exited>,
}

pub(crate) async fn balance_loop(shared: Arc<Shared>, mut inbox: Inbox) {
    let mut state = LoopState::default();
    let early = run(&shared, &mut inbox, &mut state).await;
    finish(&shared, &mut inbox, &mut state, early).await;
    // Dropping the inbox lets go of callers waiting for a pass; later requests fail at once.
}

/// Runs passes until taking stops; returns the shutdown's request if it arrived meanwhile.
async fn run(shared: &Arc<Shared>, inbox: &mut Inbox, state: &mut LoopState) -> Option<Shutdown> {
    // Step 6 of the design: the first pass waits for a listing of worker records started at least
    // one heartbeat interval after this worker's first heartbeat, so workers that start together
    // see each other (each has heartbeated by then) and split the shards without churn.
    let mut ok = shared.heartbeat_ok.subscribe();
    let first = tokio::select! {
        biased;
        r = ok.wait_for(Option::is_some) => match r {
            Ok(t) => t.unwrap_or_else(Instant::now),
            Err(_) => return None,
        },
        _ = shared.stop_taking.cancelled() => return None,
    };
    let ready = first + shared.cfg.heartbeat_interval();
    let mut listed = shared.workers_listed.subscribe();
    tokio::select! {
        biased;
        r = listed.wait_for(|t| t.is_some_and(|t| t >= ready)) => if r.is_err() { return None },
        _ = shared.stop_taking.cancelled() => return None,
    }
    let mut listed_at: Option<(u64, Instant)> = None;
    let mut settled = false;
    let mut safety_net = shared.cfg.shard_sync_interval();
    // Callers of `balance_now` answered after the coming pass.
    let mut answering: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Taken before the pass: a request arriving during it waits for the next one.
        while let Ok(request) = inbox.requests.try_recv() {
            match request {
                Request::Pass(reply) => answering.push(reply),
                Request::Shutdown(s) => return Some(s),
            }
        }
        drain_exits(shared, &mut inbox.exits, state);
        if shared.stop_taking.is_cancelled() {
            return None;
        }
        if !shared.fenced.load(Ordering::SeqCst) {
            // Read before listing: a reason to list that arrives during the pass is kept for the
            // next one.
            let wanted = shared.listing_wanted.load(Ordering::SeqCst);
            let quiet = settled
                && listed_at.is_some_and(|(seen, at)| seen == wanted && at.elapsed() < safety_net);
            if quiet {
                shared.bump(&shared.stats.passes, 1);
            } else {
                let started = Instant::now();
                match pass(shared, inbox, state).await {
                    Some(outcome) => {
                        listed_at = Some((wanted, started));
                        settled = outcome.settled;
                        safety_net =
                            shared.jittered(safety_net_interval(&shared.cfg, outcome.leases));
                    }
                    None => settled = false,
                }
            }
        }
        for reply in answering.drain(..) {
            let _ = reply.send(());
        }
        // Wake at a claim's deadline too: the task must stop before the claimant may take it.
        let now = Instant::now();
        let mut wake = now + shared.jittered(shared.cfg.balance_interval());
        if let Some(deadline) = next_unanswered_deadline(shared, state, now) {
            wake = wake.min(deadline);
        }
        // While it waits, the loop drains what its tasks report, so the task map stays current
        // between passes (a task that ended is removed within moments, not at the next pass).
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(wake) => break,
                _ = shared.balance_now.notified() => break,
                _ = shared.peer_changed.notified() => {
                    // A peer's change (a claim on a lease of mine, a lease handed to me) is
                    // answered at once rather than at the regular pass, but no sooner than half
                    // an interval after the last listing, so a fleet changing owners together does
                    // not list back to back. The deadline only comes closer: a stream of signals
                    // never puts the pass off.
                    let soonest = listed_at.map(|(_, at)| at + shared.cfg.balance_interval() / 2);
                    match soonest {
                        Some(at) if at > Instant::now() => wake = wake.min(at),
                        _ => break,
                    }
                }
                _ = shared.stop_taking.cancelled() => return None,
                Some(exited) = inbox.exits.recv() => on_exit(shared, state, exited),
                Some(request) = inbox.requests.recv() => match request {
                    Request::Pass(reply) => {
                        answering.push(reply);
                        break;
                    }
                    Request::Shutdown(s) => return Some(s),
                },
            }
        }
    }
}

/// Removes from the task map a task that reported its end, and forgets its grant, both only if
/// they are still the ones of that task (a later task for the key has its own epoch).
fn on_exit(shared: &Shared, state: &mut LoopState, exited: lease_task::Exited) {
    {
        let mut tasks = lock(&shared.tasks);
        if tasks.get(&exited.key).is_some_and(|t| t.epoch == exited.epoch) {
            tasks.remove(&exited.key);
        }
        let mut granted = lock(&shared.granted);
        if granted.get(&exited.key) == Some(&exited.epoch) {
            granted.remove(&exited.key);
        }
    }
    // Whatever ended the task, the next pass looks at the lease again.
    shared.listing_wanted.fetch_add(1, Ordering::SeqCst);
    // Checked after the removal: a shutdown reads the map (under its lock) only after taking
    // stopped, so a task it found there is removed after that read, and kept here for its report.
    if shared.stop_taking.is_cancelled() {
        state.exited_while_stopping.push(exited);
    }
}

/// Drains every report waiting in the channel.
fn drain_exits(
    shared: &Shared,
    exits: &mut mpsc::UnboundedReceiver<lease_task::Exited>,
    state: &mut LoopState,
) {
    while let Ok(exited) = exits.try_recv() {
        on_exit(shared, state, exited);
    }
}

/// After the last pass: waits for the shutdown's request (taking stops before it is sent), then
/// collects how each task the shutdown stopped ended, until its deadline. A task still running
/// then is aborted and its lease released anyway (abandoned).
async fn finish(
    shared: &Arc<Shared>,
    inbox: &mut Inbox,
    state: &mut LoopState,
    early: Option<Shutdown>,
) {
    let request = match early {
        Some(s) => s,
        None => loop {
            match inbox.requests.recv().await {
                Some(Request::Shutdown(s)) => break s,
                // No more passes: the caller is let go at once.
                Some(Request::Pass(_)) => {}
                None => return,
            }
        },
    };
    let Shutdown { deadline, mut held, reply } = request;
    let mut report = ShutdownReport::default();
    let mut record = |held: &mut BTreeMap<LeaseKey, Epoch>, exited: lease_task::Exited| {
        if held.get(&exited.key) != Some(&exited.epoch) {
            return;
        }
        held.remove(&exited.key);
        let key = exited.key;
        match exited.outcome {
            lease_task::Ended::Released(resumes_at) => {
                report.released.push(ReleasedLease { key, resumes_at });
            }
            lease_task::Ended::NotReleased => report.not_released.push(key),
            lease_task::Ended::Nothing => report.ended.push(key),
        }
    };
    drain_exits(shared, &mut inbox.exits, state);
    for exited in std::mem::take(&mut state.exited_while_stopping) {
        record(&mut held, exited);
    }
    while !held.is_empty() {
        tokio::select! {
            biased;
            exited = inbox.exits.recv() => match exited {
                Some(exited) => {
                    on_exit(shared, state, exited);
                    for exited in std::mem::take(&mut state.exited_while_stopping) {
                        record(&mut held, exited);
                    }
                }
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    for (key, epoch) in held {
        let task = lock(&shared.tasks).remove(&key);
        if let Some(t) = task {
            t.abort.abort();
        }
        warn!(shard = %key, "lease task did not stop in time; releasing its lease anyway");
        let token = crate::lease::LeaseToken { key: key.clone(), owner: shared.id(), epoch };
        match lease_task::transfer(shared, &token, None).await {
            lease_task::Ended::Released(resumes_at) => {
                report.abandoned.push(ReleasedLease { key, resumes_at });
            }
            _ => report.not_released.push(key),
        }
    }
    report.sort();
    let _ = reply.send(report);
}

/// What a full safety-net listing may cost a worker, in lease records read per second, when the
/// shard-sync interval would cost more: the listing that catches changes made outside the fleet
/// is stretched so that a quiet fleet's reads stay independent of its lease count.
pub(crate) const SAFETY_NET_RECORDS_PER_SEC: u32 = 10;

/// How long a settled worker goes without listing the leases when nothing signals a change: the
/// shard-sync interval, stretched to keep the listing within [`SAFETY_NET_RECORDS_PER_SEC`].
pub(crate) fn safety_net_interval(cfg: &crate::config::Config, leases: usize) -> Duration {
    let budget = Duration::from_secs(leases as u64 / u64::from(SAFETY_NET_RECORDS_PER_SEC));
    cfg.shard_sync_interval().max(budget).min(crate::config::MAX_DURATION)
}

/// What a pass that listed the leases found.
pub(crate) struct PassOutcome {
    /// Nothing in progress: the next pass may skip the listing unless something changes.
    pub settled: bool,
    /// Leases listed (decoded or not).
    pub leases: usize,
}

/// One balance pass: lists the leases and acts on them. `None` when the listing failed. The
/// ownership changes the pass wrote are published once, at its end.
async fn pass(
    shared: &Arc<Shared>,
    inbox: &mut Inbox,
    state: &mut LoopState,
) -> Option<PassOutcome> {
    let changes = shared.changes.load(Ordering::SeqCst);
    let outcome = list_and_act(shared, inbox, state).await;
    if shared.changes.load(Ordering::SeqCst) != changes {
        shared.publish_now.notify_one();
    }
    outcome
}

async fn list_and_act(
    shared: &Arc<Shared>,
    inbox: &mut Inbox,
    state: &mut LoopState,
) -> Option<PassOutcome> {
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
    // with the listing (they would otherwise count as running for this pass).
    drain_exits(shared, &mut inbox.exits, state);
    shared.bump(&shared.stats.lease_listings, 1);
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
        let mut last = lock(&shared.last_sync);
        if last.as_ref().is_some_and(|l| l.misses_any(&keys)) {
            *last = None;
            shared.sync_now.notify_one();
        }
    }
    report_corrupt(shared, state, &listing.corrupt);
    let corrupt: BTreeSet<LeaseKey> =
        listing.corrupt.iter().map(|c| LeaseKey::new(c.key.clone())).collect();
    let lost = lost_leases(shared, &listing.items, &corrupt, list_sent).await;
    let any_lost = !lost.is_empty();
    let mut leases = listing.items;
    // Leases that exist but cannot be used this pass: undecodable ones, and lost ones being
    // restored. Their children stay blocked; the tasks of lost ones keep running (their owner
    // restores them under its own name), and the next listing decides.
    let mut withheld = corrupt;
    if lost.is_empty() {
        state.lost_since.clear();
    } else {
        withheld.extend(lost.iter().map(|l| l.key().clone()));
        leases.retain(|v| !withheld.contains(&v.lease.key));
        let vanished = leases.is_empty() && listing.corrupt.is_empty();
        restore_lost(shared, state, lost, vanished).await;
    }
    let me = shared.id();
    let fresh_view = look_again_at_owners_judged_dead(shared, &me, &leases).await;
    let now = Instant::now();
    let mut live = live_set(shared, &me, &leases);
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
    let (resume, retake, stopped) = reconcile(shared, &me, &leases, &index, &active, &withheld);
    let mut settled = !any_lost
        && withheld.is_empty()
        && resume.is_empty()
        && retake.is_empty()
        && stopped == 0
        && nothing_pending(shared, &me, &leases, &active);
    for VersionedLease { lease, version } in resume {
        lease_task::spawn(shared, lease, version);
    }
    let holding = lock(&shared.hold_takes_until).is_some_and(|until| Instant::now() < until);
    // Concurrently (bounded), like the takes: a join's newcomer re-takes every lease handed to it
    // in one pass, and one at a time that cost a store round trip each (about a second for four
    // on a busy SQLite file).
    if !holding {
        for chunk in retake.chunks(shared.cfg.take_concurrency()) {
            join_all(chunk.iter().map(|v| async move {
                if take(shared, v).await {
                    info!(shard = %v.lease.key, "re-took by compare-and-set a lease this process was not granted");
                }
            }))
            .await;
        }
    }
    let expired = expired_claims(shared, &me, &leases, now);
    let snapshot = Snapshot {
        me: me.clone(),
        leases: leases.iter().map(|v| v.lease.clone()).collect(),
        withheld,
        live_workers: live,
        max_leases_per_worker: shared.cfg.max_leases_per_worker(),
        max_claims_per_pass: shared.cfg.max_claims_per_pass(),
        expired_claims: expired,
        seed: shared.random(),
    };
    let mut plan = shared.balancer.plan(&snapshot);
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
        debug!(take = plan.take_count, "the store went back in time: no takes this pass");
        plan.take_count = 0;
        plan.take_over.clear();
        settled = false;
    }
    shared.bump(&shared.stats.passes, 1);
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
        answered = execute(shared, &plan, &by_key).await;
    }
    // After the plan, which answers claims: only a claim this pass could not answer counts.
    yield_unanswered_claims(shared, state, &me, &leases, list_sent, now, &answered);
    settled &= lock(&shared.my_claims).is_empty();
    Some(PassOutcome { settled, leases: listed })
}

/// Whether a listing shows nothing waiting for a worker to act: every active lease unclaimed and
/// owned by this worker or by one whose heartbeat moves. (A lease of a worker that stopped
/// beating needs passes until its failover timeout is up and someone takes it.) A claim left on a
/// lease that finished since (its shard ended while the handoff was pending) waits for nobody:
/// counting it kept a quiet fleet listing every lease on every pass for as long as the finished
/// lease stayed in the store.
fn nothing_pending(
    shared: &Shared,
    me: &WorkerId,
    leases: &[VersionedLease],
    active: &HashSet<&LeaseKey>,
) -> bool {
    let live = lock(&shared.liveness).live_workers();
    leases.iter().all(|VersionedLease { lease: l, .. }| {
        !active.contains(&l.key)
            || (l.live_claim().is_none()
                && l.owner.as_ref().is_some_and(|o| o == me || live.contains(o)))
    })
}

/// The leases the store lost, compared with this worker's memory (see `recovery`). Vanished ones
/// are checked against the stream's lineage to rule out those the shard sync collected while this
/// worker was not looking (a one-off listing of the shards, only when something vanished).
async fn lost_leases(
    shared: &Shared,
    listed: &[VersionedLease],
    corrupt: &BTreeSet<LeaseKey>,
    list_sent: Instant,
) -> Vec<recovery::Lost> {
    let lost = {
        let mut memory = lock(&shared.remembered);
        let fresh = recovery::fresh_keys(&mut memory, list_sent);
        recovery::compare(&mut memory, listed, corrupt, &fresh)
    };
    if lost.iter().all(|l| l.now.is_some()) {
        return lost;
    }
    match shared.source.list_shards().await {
        Ok(shards) => {
            let mut children: BTreeMap<LeaseKey, Vec<LeaseKey>> = BTreeMap::new();
            for s in shards {
                for p in s.parents {
                    children.entry(p).or_default().push(s.id.clone());
                }
            }
            recovery::forget_collected(&mut lock(&shared.remembered), lost, &children, listed)
        }
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing shards to tell lost leases from collected ones failed");
            lost
        }
    }
}

/// Writes back leases the store lost (see `recovery`): created again when they vanished,
/// replaced by compare-and-set when they were rolled back or re-created at the initial position.
/// A lease this worker runs is kept (its task goes on); one another live worker owned is left to
/// that worker for a pass, unless this worker saw it finished (nothing to wait for). A restore
/// that loses a race is retried at the next pass, which finds the lease lost again.
async fn restore_lost(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    lost: Vec<recovery::Lost>,
    vanished: bool,
) {
    let total = lost.len();
    if vanished {
        error!(
            leases = total,
            held = shared.held().len(),
            "every lease of the namespace vanished from the store: checkpoints written since this \
             worker last listed them are LOST (those records will be processed again); restoring \
             the leases as this worker last saw them"
        );
        shared.metrics.namespace_vanished();
    } else {
        error!(
            leases = total,
            "the store lost or rolled back writes (a checkpoint moved backwards, an epoch went \
             down or an unfinished lease vanished): restoring those leases as this worker last \
             saw them"
        );
    }
    let me = shared.id();
    let writes: Vec<(Lease, Option<Version>)> = {
        let tasks = lock(&shared.tasks);
        let mut liveness = lock(&shared.liveness);
        let since = &mut state.lost_since;
        let keys: BTreeSet<&LeaseKey> = lost.iter().map(|l| l.key()).collect();
        since.retain(|k, _| keys.contains(k));
        let now = Instant::now();
        // A live owner runs a pass within a (jittered) balance interval; give it that and a
        // heartbeat to repair the leases it runs itself, without interrupting them.
        let grace = shared.cfg.balance_interval().mul_f64(1.0 + shared.cfg.jitter())
            + shared.cfg.heartbeat_interval();
        let restart_window = grace + shared.cfg.failover_timeout();
        lost.iter()
            .filter_map(|l| {
                let first = *since.entry(l.key().clone()).or_insert(now);
                let standing = recovery::Standing {
                    me: &me,
                    running_at: tasks.get(l.key()).filter(|t| t.is_running()).map(|t| t.epoch),
                    // This worker knows whether it runs a lease it owned; it never waits for itself.
                    owner_alive: l
                        .seen
                        .owner
                        .as_ref()
                        .is_some_and(|o| *o != me && liveness.is_alive(o)),
                    // An owner whose process started a moment ago (restarted under the same
                    // id) knows only what it listed since; waiting for it to repair a lease it
                    // may never have seen lets a fresh create win (see `recovery`).
                    owner_had_time: now.saturating_duration_since(first) >= grace
                        || l.seen.owner.as_ref().is_some_and(|o| {
                            *o != me && liveness.started_within(o, restart_window)
                        }),
                };
                l.restoration(&standing).map(|r| (r, l.now.as_ref().map(|v| v.version)))
            })
            .collect()
    };
    let waiting = total - writes.len();
    let store = &shared.store;
    let results: Vec<bool> = futures::stream::iter(writes)
        .map(|(lease, over)| {
            let me = me.clone();
            async move {
                let done = match over {
                    None => store
                        .create_lease(&lease)
                        .await
                        .map(|o| matches!(o, CreateOutcome::Created(_))),
                    Some(v) => store.update_lease(&lease, v).await.map(|_| true),
                };
                debug!(
                    shard = %lease.key,
                    owner = ?lease.owner,
                    epoch = %lease.epoch,
                    checkpoint = %lease.checkpoint,
                    written = ?done.as_ref().ok(),
                    "restoring a lost lease"
                );
                match done {
                    Ok(true) => {
                        if lease.is_owned_by(&me) {
                            lock(&shared.granted).insert(lease.key.clone(), lease.epoch);
                        }
                        shared.remember(&lease);
                        true
                    }
                    Ok(false) | Err(Error::Conflict { .. }) => false,
                    Err(e) => {
                        warn!(shard = %lease.key, error = %crate::error::ErrorChain(&e), "restoring a lost lease failed");
                        false
                    }
                }
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect()
        .await;
    let restored = results.iter().filter(|ok| **ok).count();
    shared.changed(restored as u64);
    shared.metrics.restored(restored);
    error!(
        restored,
        not_restored = total - restored,
        left_to_their_owner = waiting,
        "restored {restored} of {total} lost leases; the others are checked again at the next \
         pass (left to their live owner this pass: {waiting})"
    );
    if vanished {
        if let Err(e) = super::shard_sync::sync_after_loss(shared).await {
            warn!(error = %crate::error::ErrorChain(&e), "shard sync after the namespace vanished failed");
        }
    }
    if restored > 0 {
        // Take what was restored unowned without waiting a whole interval. (Only then: a pass
        // that merely waits for an owner must not start another at once.)
        shared.want_listing();
    }
}

fn report_corrupt(shared: &Shared, state: &mut LoopState, corrupt: &[crate::store::CorruptRecord]) {
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
async fn look_again_at_owners_judged_dead(
    shared: &Shared,
    me: &WorkerId,
    leases: &[VersionedLease],
) -> bool {
    let judged_dead = {
        let former = lock(&shared.former_ids).clone();
        let live = lock(&shared.liveness).live_workers();
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
            shared.observe_workers(&listing.items, started);
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
fn live_set(shared: &Shared, me: &WorkerId, leases: &[VersionedLease]) -> BTreeSet<WorkerId> {
    let mut liveness = lock(&shared.liveness);
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
fn reconcile(
    shared: &Arc<Shared>,
    me: &WorkerId,
    leases: &[VersionedLease],
    by_key: &HashMap<&LeaseKey, &Lease>,
    active: &HashSet<&LeaseKey>,
    withheld: &BTreeSet<LeaseKey>,
) -> (Vec<VersionedLease>, Vec<VersionedLease>, usize) {
    let mut stopped = 0;
    {
        let tasks = lock(&shared.tasks);
        for (key, task) in tasks.iter().filter(|(k, _)| !withheld.contains(*k)) {
            let still_mine =
                by_key.get(key).is_some_and(|l| l.is_owned_by(me) && l.epoch == task.epoch);
            if !still_mine
                && task.is_running()
                && task.stop.borrow().as_ref().is_none_or(|r| !r.is_abrupt())
            {
                info!(shard = %key, "lease moved on; stopping its task");
                shared.bump(&shared.stats.lost, 1);
                shared.metrics.lost(key);
                task.stop.send_replace(Some(StopReason::LeaseLost));
                stopped += 1;
            }
        }
    }
    if shared.stop_taking.is_cancelled() || shared.fenced.load(Ordering::SeqCst) {
        return (Vec::new(), Vec::new(), stopped);
    }
    let former = lock(&shared.former_ids).clone();
    let tasks = lock(&shared.tasks);
    let granted = lock(&shared.granted).clone();
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

/// The owner's side of the claim timeout. A claimant takes a claimed lease by force once the
/// record has stood still for the claim timeout on its clock. An owner that cannot answer (its
/// acknowledgement or clear keeps failing) and writes nothing else must stop processing first, or
/// the lease has two owners. The owner times the same standstill from the send time of the listing
/// *before* the one that showed the record's current version (no later than the write itself, so
/// no later than the claimant's clock start) and stops the task a heartbeat before the claim
/// timeout; the lease is then handed over, or the claim cleared, by a later pass.
fn yield_unanswered_claims(
    shared: &Shared,
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
    list_sent: Instant,
    now: Instant,
    answered: &BTreeSet<LeaseKey>,
) {
    let previous = state.previous_listing.replace(list_sent).unwrap_or(list_sent);
    let claimed: BTreeMap<&LeaseKey, Version> = leases
        .iter()
        .filter(|v| v.lease.is_owned_by(me) && v.lease.live_claim().is_some_and(|c| &c.by != me))
        .filter(|v| !answered.contains(&v.lease.key))
        .map(|v| (&v.lease.key, v.version))
        .collect();
    {
        let watched = &mut state.claims_on_mine;
        watched.retain(|k, _| claimed.contains_key(k));
        for (key, version) in claimed {
            let (seen, since) = watched.entry(key.clone()).or_insert((version, previous));
            if *seen != version {
                *seen = version;
                *since = previous;
            }
        }
    }
    stop_unanswered_past_deadline(shared, state, now);
}

/// How long a claim on one of this worker's leases may stand unanswered, from the send time of
/// the listing before the one that showed the record's current version, before its task stops.
fn unanswered_claim_limit(shared: &Shared) -> Duration {
    shared.cfg.claim_timeout().saturating_sub(shared.cfg.heartbeat_interval())
}

/// The earliest moment after `now` a watched claim on this worker's leases reaches its limit:
/// the balance loop wakes then, whatever its interval, so the task stops before the claimant may
/// take it. (Deadlines already past were acted on when they passed.)
fn next_unanswered_deadline(shared: &Shared, state: &LoopState, now: Instant) -> Option<Instant> {
    let limit = unanswered_claim_limit(shared);
    state.claims_on_mine.values().map(|(_, since)| *since + limit).filter(|d| *d > now).min()
}

/// Stops the tasks of leases whose claim has stood unanswered past the limit. Also called when a
/// pass cannot list: not knowing whether the claim was answered, the task stops all the same
/// (the claimant's clock does not wait for this worker's store errors).
fn stop_unanswered_past_deadline(shared: &Shared, state: &LoopState, now: Instant) {
    let limit = unanswered_claim_limit(shared);
    let watched = &state.claims_on_mine;
    let tasks = lock(&shared.tasks);
    for (key, (_, since)) in watched.iter() {
        if now.saturating_duration_since(*since) < limit {
            continue;
        }
        if let Some(t) = tasks.get(key).filter(|t| t.is_running()) {
            if t.stop.borrow().as_ref().is_none_or(|r| !r.is_abrupt()) {
                warn!(shard = %key, "a claim on this lease went unanswered for almost the claim timeout; stopping its task before the claimant takes it");
                shared.bump(&shared.stats.lost, 1);
                shared.metrics.lost(key);
                t.stop.send_replace(Some(StopReason::LeaseLost));
            }
        }
    }
}

/// This worker's claims still standing, pruned; returns those whose lease record has not changed
/// for the claim timeout (the owner is alive but stuck: it neither answers nor checkpoints).
fn expired_claims(
    shared: &Shared,
    me: &WorkerId,
    leases: &[VersionedLease],
    now: Instant,
) -> BTreeSet<LeaseKey> {
    // A claim on a lease that finished since is moot: nothing is left to hand over.
    let standing: BTreeMap<&LeaseKey, Version> = leases
        .iter()
        .filter(|v| !v.lease.is_owned_by(me) && !v.lease.is_finished())
        .filter(|v| v.lease.live_claim().is_some_and(|c| &c.by == me))
        .map(|v| (&v.lease.key, v.version))
        .collect();
    let mut mine = lock(&shared.my_claims);
    mine.retain(|k, _| standing.contains_key(k));
    // A claim of mine the store holds but this worker did not record (its write was applied but
    // the answer lost) is watched like any other: the balancer counts it toward my share, so it
    // must be followed until answered (the lease handed to this id, then re-taken) or timed out.
    for (key, version) in &standing {
        mine.entry((*key).clone()).or_insert(MyClaim { since: now, seen: *version });
    }
    let mut expired = BTreeSet::new();
    for (key, claim) in mine.iter_mut() {
        let Some(current) = standing.get(key) else { continue };
        if *current != claim.seen {
            // The owner wrote since (a checkpoint, or the acknowledgement of this claim that
            // starts its handoff): it is not stuck; restart the clock.
            claim.since = now;
            claim.seen = *current;
        } else if now.saturating_duration_since(claim.since) >= shared.cfg.claim_timeout() {
            expired.insert(key.clone());
        }
    }
    expired
}

/// Carries out a plan; returns the claims on this worker's leases it answered (acknowledged for a
/// handoff, or cleared).
async fn execute(
    shared: &Arc<Shared>,
    plan: &Plan,
    by_key: &BTreeMap<&LeaseKey, &VersionedLease>,
) -> BTreeSet<LeaseKey> {
    let mut answered = BTreeSet::new();
    take_share(shared, plan, by_key).await;
    for key in &plan.take_over {
        if let Some(v) = by_key.get(key) {
            if take(shared, v).await {
                shared.bump(&shared.stats.taken, 1);
                shared.metrics.taken(key);
                info!(shard = %key, "owner did not hand over a claimed lease in time; took it");
            }
        }
    }
    // Claims are written concurrently (bounded), so an owner's next listing sees all of them and
    // answers them in one round.
    let me = shared.id();
    let claims: Vec<(Lease, Version, WorkerId)> = plan
        .claims
        .iter()
        .filter_map(|(key, owner)| {
            by_key.get(key).map(|v| (v.lease.clone(), v.version, owner.clone()))
        })
        .collect();
    futures::stream::iter(claims)
        .map(|(lease, version, owner)| {
            let me = me.clone();
            async move {
                let listed = Some(VersionedLease::new(lease.clone(), version));
                // A conflict that is only the owner's checkpoint (most of them on a store as slow
                // as SQLite: the owner checkpoints between this listing and the claim) is retried
                // against the current record, so all of a pass's claims land in that pass. Any
                // other move (a new owner or epoch, a claim written or cleared, the shard ended)
                // drops the claim: the next pass decides again from a new listing. Re-deciding on
                // any record would claim again right after an owner cleared a claim and moved on
                // (a fleet then listed on every pass, found by the simulation).
                let outcome =
                    cas::write(shared, &lease.key, listed, cas::Policy::PERSIST, "claim", |l| {
                        only_checkpoint_moved(&lease, l).then(|| Lease {
                            claim: Some(Claim { by: me.clone(), at: l.epoch }),
                            ..l.clone()
                        })
                    })
                    .await;
                match outcome {
                    cas::Outcome::Written(_, v) => {
                        let claim = MyClaim { since: Instant::now(), seen: v };
                        lock(&shared.my_claims).insert(lease.key.clone(), claim);
                        shared.changed(1);
                        shared.bump(&shared.stats.claims, 1);
                        shared.metrics.claimed(&lease.key);
                        debug!(shard = %lease.key, from = %owner, "claimed");
                    }
                    cas::Outcome::Declined | cas::Outcome::GaveUp => {}
                }
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect::<Vec<()>>()
        .await;
    // Handoffs: acknowledge every claim first, concurrently (bounded), so an owner answering
    // hundreds of claims restarts every claimant's clock within one pass.
    let mut running = Vec::new();
    for (key, to) in &plan.handoffs {
        // A task that ended (its report not drained yet) wrote all it will: the lease is handed
        // over directly, if the listed token still holds.
        let task = lock(&shared.tasks)
            .get(key)
            .filter(|t| t.is_running())
            .map(|t| (t.epoch, t.stop.borrow().is_none()));
        match task {
            Some((epoch, true)) => running.push((key.clone(), to.clone(), epoch)),
            Some((_, false)) => {} // already stopping
            None => {
                if let Some(token) = by_key.get(key).and_then(|v| v.lease.token()) {
                    lease_task::transfer(shared, &token, Some(to.clone())).await;
                }
            }
        }
    }
    let acks = futures::stream::iter(running)
        .map(|(key, to, epoch)| {
            let shared = shared.clone();
            async move {
                // The write restarts the claimant's claim timeout, which validation keeps longer
                // than the deadline given to the task here, so the claimant never takes the lease
                // by force while the processor still flushes.
                let sent = Instant::now();
                let acked = acknowledge_claim(&shared, &key, epoch, &to).await;
                acked.then_some((key, to, epoch, sent))
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect::<Vec<_>>()
        .await;
    for (key, to, epoch, sent) in acks.into_iter().flatten() {
        answered.insert(key.clone());
        let deadline = sent + shared.cfg.shutdown_timeout();
        if let Some(t) = lock(&shared.tasks).get(&key) {
            if t.epoch == epoch && t.stop.borrow().is_none() {
                t.stop.send_replace(Some(StopReason::Handoff { to, deadline }));
            }
        }
    }
    for key in &plan.clear_claims {
        if let Some(v) = by_key.get(key) {
            if clear_claim(shared, v).await {
                answered.insert(key.clone());
            }
        }
    }
    answered
}

/// Refreshes of a pass's take candidates at most, before the rest is left to the next pass.
const MAX_CANDIDATE_REFRESHES: usize = 8;

/// Takes up to the plan's `take_count` of its candidates, with bounded concurrency. A conflict
/// skips to the next candidate, so one pass reaches full share even when peers race for the same
/// leases.
///
/// A candidate list goes stale when peers take leases between the listing and the takes (workers
/// that start together at 10,000 leases: the last to write found most of their candidates taken).
/// Walking it costs a round trip per conflict, a few at a time once little of the share is
/// missing; at 10,000 × 16 on Redis that made a first pass last up to a minute. So once the
/// conflicts since the last listing reach what is still missing (and at least one round of
/// `take_concurrency`), the candidates are refreshed with one listing: only those whose record is
/// unchanged since the plan's listing stay candidates (unchanged, they are still available by the
/// plan's judgement, and a take of them is the same compare-and-set the plan would have written).
/// docs/algorithm.md, "Stale take candidates".
async fn take_share(
    shared: &Arc<Shared>,
    plan: &Plan,
    by_key: &BTreeMap<&LeaseKey, &VersionedLease>,
) {
    let mut taken = 0;
    let mut conflicts = 0;
    let mut refreshes = 0;
    if plan.take_count == 0 {
        return;
    }
    // The untried candidates, each with the record the plan decided on.
    let mut candidates: VecDeque<&VersionedLease> =
        plan.take_candidates.iter().filter_map(|k| by_key.get(k).copied()).collect();
    while taken < plan.take_count && !shared.stop_taking.is_cancelled() {
        let missing = plan.take_count - taken;
        if conflicts >= missing.max(shared.cfg.take_concurrency()) && !candidates.is_empty() {
            if refreshes == MAX_CANDIDATE_REFRESHES {
                debug!(taken, missing, "take candidates keep going stale; the next pass goes on");
                break;
            }
            refreshes += 1;
            conflicts = 0;
            let Some(fresh) = refresh_candidates(shared, &mut candidates).await else { break };
            debug!(taken, missing, candidates = fresh, "take candidates refreshed");
            continue;
        }
        let want = missing.min(shared.cfg.take_concurrency());
        let chunk: Vec<&VersionedLease> = candidates.drain(..want.min(candidates.len())).collect();
        if chunk.is_empty() {
            break;
        }
        let tried = chunk.len();
        let results = join_all(chunk.iter().map(|&v| async move {
            let ok = take(shared, v).await;
            if ok {
                shared.metrics.taken(&v.lease.key);
            }
            ok
        }))
        .await;
        let won = results.into_iter().filter(|ok| *ok).count();
        taken += won;
        conflicts += tried - won;
    }
    if taken > 0 {
        shared.bump(&shared.stats.taking_passes, 1);
        shared.bump(&shared.stats.taken, taken as u64);
        info!(taken, "took leases");
    }
}

/// Keeps of `candidates` those whose record a new listing shows unchanged (the same version).
/// The number kept, or `None` when the listing failed or takes are on hold
/// (the store went back in time meanwhile): the pass then stops taking.
async fn refresh_candidates(
    shared: &Shared,
    candidates: &mut VecDeque<&VersionedLease>,
) -> Option<usize> {
    let listing = match shared.store.list_leases().await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing leases to refresh take candidates failed; the next pass goes on");
            return None;
        }
    };
    shared.bump(&shared.stats.lease_listings, 1);
    if lock(&shared.hold_takes_until).is_some_and(|until| Instant::now() < until) {
        return None;
    }
    let now: HashMap<&LeaseKey, Version> =
        listing.items.iter().map(|v| (&v.lease.key, v.version)).collect();
    candidates.retain(|c| now.get(&c.lease.key) == Some(&c.version));
    Some(candidates.len())
}

/// Whether `now` differs from the `listed` record a claim was decided on by its checkpoint (and
/// attributes) only: same owner, same epoch, same parents, the same claim (none, or a stale one),
/// and not finished since. A claim meeting such a record is still the claim its pass decided.
fn only_checkpoint_moved(listed: &Lease, now: &Lease) -> bool {
    now.owner == listed.owner
        && now.epoch == listed.epoch
        && now.claim == listed.claim
        && now.parents == listed.parents
        && !now.is_finished()
}

/// Clears a claim on a lease this worker owns. The owner checkpoints all the time, so the listed
/// version is often stale: on a conflict, re-decide from the current record (a claim left standing
/// would let the claimant take the lease after the claim timeout). True when it cleared it.
async fn clear_claim(shared: &Shared, listed: &VersionedLease) -> bool {
    let claim = listed.lease.live_claim().cloned();
    let me = shared.id();
    let key = listed.lease.key.clone();
    let outcome = cas::write(
        shared,
        &key,
        Some(listed.clone()),
        cas::Policy::PERSIST,
        "clear a claim",
        |l| {
            (l.is_owned_by(&me) && l.live_claim() == claim.as_ref())
                .then(|| Lease { claim: None, ..l.clone() })
        },
    )
    .await;
    match outcome {
        cas::Outcome::Written(next, v) => {
            shared.observe(&next, v);
            shared.changed(1);
            true
        }
        cas::Outcome::Declined | cas::Outcome::GaveUp => false,
    }
}

/// Acknowledges `to`'s claim on a lease this worker runs at `epoch` with a write that changes
/// nothing but the record's version (which restarts the claimant's claim timeout). False when the
/// lease or the claim moved on, or the store kept failing: the handoff is then left to a later
/// pass.
async fn acknowledge_claim(shared: &Shared, key: &LeaseKey, epoch: Epoch, to: &WorkerId) -> bool {
    let me = shared.id();
    // Read first: the listing's version is likely stale (the owner checkpoints all the time).
    let mut decisions = 0;
    let mut last_standing = false;
    let outcome = cas::write(shared, key, None, cas::Policy::PERSIST, "acknowledge a claim", |l| {
        let standing =
            l.is_owned_by(&me) && l.epoch == epoch && l.live_claim().is_some_and(|c| &c.by == to);
        decisions += 1;
        last_standing = standing;
        standing.then(|| l.clone())
    })
    .await;
    // Why a claim stays unanswered shows in the log: `last_standing` with many decisions means
    // the owner's own checkpoints kept moving the record under the acknowledgement.
    if let cas::Outcome::Declined | cas::Outcome::GaveUp = outcome {
        let gave_up = matches!(outcome, cas::Outcome::GaveUp);
        debug!(shard = %key, to = %to, decisions, last_standing, gave_up, "claim not acknowledged");
    }
    match outcome {
        cas::Outcome::Written(lease, v) => {
            shared.observe(&lease, v);
            debug!(shard = %key, to = %to, "claim acknowledged; handing over");
            true
        }
        cas::Outcome::Declined | cas::Outcome::GaveUp => false,
    }
}

/// Takes one lease by CAS (owner = me, epoch + 1) and starts its task. False on conflict/error.
async fn take(shared: &Arc<Shared>, listed: &VersionedLease) -> bool {
    if shared.stop_taking.is_cancelled() || shared.fenced.load(Ordering::SeqCst) {
        return false;
    }
    let me = shared.id();
    let lease = &listed.lease;
    let listed = Some(listed.clone());
    let outcome =
        cas::write(shared, &lease.key, listed, cas::Policy::ONCE, "take the lease", |l| {
            Some(Lease {
                epoch: recovery::next_epoch(l.epoch),
                ..l.transferred_to(Some(me.clone()))
            })
        })
        .await;
    match outcome {
        cas::Outcome::Written(next, v) => {
            lock(&shared.granted).insert(next.key.clone(), next.epoch);
            shared.remember(&next);
            shared.changed(1);
            if !lease_task::spawn(shared, next.clone(), v) {
                if shared.stop_taking.is_cancelled() {
                    // Shutting down: give back what this pass took at the last moment.
                    if let Some(token) = next.token() {
                        lease_task::transfer(shared, &token, None).await;
                    }
                    return false;
                }
                debug!(shard = %next.key, "not started now (fenced, or a task is still stopping)");
            }
            true
        }
        cas::Outcome::Declined => false,
        cas::Outcome::GaveUp => {
            // The write may have landed all the same: look again at the next pass.
            shared.listing_wanted.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
}
