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

mod claims;
mod execute;
mod recover;
mod view;

use claims::next_unanswered_deadline;
use view::pass;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::lease_task;
use super::shared::{lock, Shared};
use super::shutdown_report::{ReleasedLease, ShutdownReport};
use crate::lease::{Epoch, LeaseKey, Version};
use tokio::sync::{mpsc, oneshot};

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
    pub(super) previous_listing: Option<Instant>,
    /// Leases this worker owns that a peer claimed: the record version last listed, and the
    /// earliest moment that version can have been written (see `yield_unanswered_claims`).
    pub(super) claims_on_mine: BTreeMap<LeaseKey, (Version, Instant)>,
    /// Since when each lost lease has been found lost, in passes without a break.
    pub(super) lost_since: BTreeMap<LeaseKey, Instant>,
    /// Corrupt records already reported (reported once, then counted quietly).
    pub(super) reported_corrupt: BTreeSet<String>,
    /// Reports of tasks that ended after taking stopped, drained before the shutdown asked for
    /// them: it collects them from here.
    pub(super) exited_while_stopping: Vec<lease_task::Exited>,
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
    let ready = first + shared.cfg.heartbeat_interval;
    let mut listed = shared.workers_listed.subscribe();
    tokio::select! {
        biased;
        r = listed.wait_for(|t| t.is_some_and(|t| t >= ready)) => if r.is_err() { return None },
        _ = shared.stop_taking.cancelled() => return None,
    }
    let mut listed_at: Option<(u64, Instant)> = None;
    let mut settled = false;
    let mut safety_net = shared.cfg.shard_sync_interval;
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
        let mut wake = now + shared.jittered(shared.cfg.balance_interval);
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
                    let soonest = listed_at.map(|(_, at)| at + shared.cfg.balance_interval / 2);
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
/// collects how each task the shutdown stopped ended, until its deadline and a heartbeat more: a
/// task whose processor is cut short at the deadline tells it `lease_lost` (bounded by half a
/// heartbeat) and releases the lease itself. A task still running then is aborted and its lease
/// released anyway (abandoned).
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
            lease_task::Ended::Abandoned(resumes_at) => {
                report.abandoned.push(ReleasedLease { key, resumes_at });
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
            _ = tokio::time::sleep_until(deadline + shared.cfg.heartbeat_interval) => break,
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
            lease_task::Ended::Released(resumes_at) | lease_task::Ended::Abandoned(resumes_at) => {
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
    cfg.shard_sync_interval.max(budget).min(crate::config::MAX_DURATION)
}
