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
//! The loop is the one owner of the worker's coordination state ([`LoopState`]), kept in named
//! parts, one per file: the lease tasks and grants (`tasks`), the claims from both sides
//! (`claims`), who is alive (`membership`), the memory of the namespace (`recover`), the loads
//! (`loads`) and when the next pass runs (`schedule`); a pass is `view` then `execute`. Every
//! other task talks to it through one channel of events (`runtime::events`), which the loop
//! applies between its own steps; no lock guards any of it (docs/algorithm.md, "Who owns the
//! runtime's state"). At shutdown it collects how the tasks ended into the `ShutdownReport`.

mod claims;
mod execute;
mod loads;
mod membership;
mod recover;
mod schedule;
mod state;
mod tasks;
mod view;

pub(crate) use state::LoopState;
pub(crate) use tasks::{CheckpointSlot, LeaseTask};

use claims::next_unanswered_deadline;
use schedule::PassKind;
use view::pass;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use tracing::warn;

use super::events::Event;
use super::lease_task;
use super::shared::Shared;
use super::shutdown_report::{ReleasedLease, ShutdownReport};
use crate::lease::{transition, Epoch, LeaseKey};

/// How long a pass waits after a store notice, so that the notices of one burst (a leave
/// releasing every lease, a fleet's claims) are read by one listing (jittered).
pub(crate) const NOTICE_COALESCE: Duration = Duration::from_millis(5);

/// The shortest time between two passes brought forward by store notices. Two workers that
/// disagree for a moment (a claim that one makes and the other clears until it lists the
/// workers) would otherwise answer each other's notices back to back; at most one listing per
/// gap bounds that to a few writes a second until the next heartbeat settles it.
pub(crate) const NOTICE_GAP: Duration = Duration::from_millis(100);

/// Runs the worker's balance loop until the worker stops, owning its coordination state.
pub(crate) async fn balance_loop(shared: Arc<Shared>, mut events: UnboundedReceiver<Event>) {
    let mut state = LoopState::new(&shared);
    run(&shared, &mut events, &mut state).await;
    finish(&shared, &mut events, &mut state).await;
    // Dropping the receiver lets go of callers waiting for a pass; later requests fail at once.
}

/// Waits for the first pass's view of the workers. Applies events meanwhile; false when taking
/// stopped first.
///
/// The full view is a listing of worker records started at least one heartbeat interval after
/// this worker's first heartbeat: workers that start together see each other by then (each has
/// heartbeated) and split the free shards without churn, and every peer has listed this worker
/// (peers list the records every heartbeat), so it answers this worker's claims. Until then no
/// pass takes a free lease (`Membership::before_full_view`).
///
/// With the store's change stream open, peers hear of this worker's first heartbeat and of its
/// claims at once, so the first pass need not wait for the full view: it runs after the first
/// listing of the worker records that follows the first heartbeat, and only claims (a worker
/// joining a running fleet asks for its share at once; docs/algorithm.md, "Change
/// notification").
async fn wait_for_first_view(
    shared: &Shared,
    events: &mut UnboundedReceiver<Event>,
    state: &mut LoopState,
) -> bool {
    let mut ok = shared.heartbeat_ok.subscribe();
    let mut notified = shared.notified.subscribe();
    // The first successful heartbeat (later ones keep updating the channel).
    let mut first: Option<Instant> = None;
    loop {
        first = first.or(*ok.borrow_and_update());
        state.membership.set_full_view_at(first.map(|t| t + shared.cfg.heartbeat_interval()));
        let pushed = *notified.borrow_and_update();
        let listed_since = |at: Instant| state.membership.listed_since(at);
        if !state.membership.before_full_view() || (pushed && first.is_some_and(listed_since)) {
            return true;
        }
        tokio::select! {
            biased;
            _ = shared.stop_taking.cancelled() => return false,
            changed = ok.changed() => if changed.is_err() { return false },
            changed = notified.changed() => if changed.is_err() { return false },
            event = events.recv() => match event {
                Some(e) => state.apply_all(shared, e, events),
                None => return false,
            },
        }
    }
}

/// Runs passes until taking stops.
async fn run(shared: &Arc<Shared>, events: &mut UnboundedReceiver<Event>, state: &mut LoopState) {
    if !wait_for_first_view(shared, events, state).await {
        return;
    }
    loop {
        // Callers waiting now are answered after the coming pass; one asking during it waits for
        // the next.
        let answering = std::mem::take(&mut state.answering);
        state.drain(shared, events);
        let kind = state.schedule.begin(Instant::now());
        if shared.stop_taking.is_cancelled() {
            state.answering.extend(answering);
            return;
        }
        if !shared.is_fenced() {
            // Balancing by load, a quiet pass plans again on the last listing's snapshot with the
            // newer loads: a move due lists after all.
            let listing = match kind {
                PassKind::List(token) => Some(token),
                PassKind::Quiet if loads::load_moves_due(shared, state) => {
                    Some(state.schedule.listing_now(Instant::now()))
                }
                PassKind::Quiet => None,
            };
            match listing {
                None => shared.metrics.balance_pass_quiet(),
                Some(token) => {
                    let outcome = pass(shared, events, state).await.map(|outcome| {
                        let net = safety_net_interval(&shared.cfg, outcome.leases);
                        let mut net = state.timing.jittered(net);
                        if let Some(at) = outcome.recheck_at {
                            // The net counts from this listing's start, a moment ago.
                            net = net.min(at.saturating_duration_since(Instant::now()));
                        }
                        (outcome.settled, net)
                    });
                    state.schedule.listed(token, outcome);
                }
            }
        }
        for reply in answering {
            let _ = reply.send(());
        }
        // Wake at a claim's deadline too: the task must stop before the claimant may take it.
        let now = Instant::now();
        let mut wake = now + state.timing.jittered(shared.cfg.balance_interval());
        if let Some(deadline) = next_unanswered_deadline(shared, state, now) {
            wake = wake.min(deadline);
        }
        // While it waits, the loop applies what the other tasks tell it, so its state stays
        // current between passes (a task that ended is removed within moments, not at the next
        // pass).
        let half_interval = shared.cfg.balance_interval() / 2;
        loop {
            if !state.answering.is_empty() {
                break;
            }
            match state.schedule.wake(wake, Instant::now(), half_interval) {
                Some(at) => wake = at,
                None => break,
            }
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(wake) => break,
                _ = shared.stop_taking.cancelled() => return,
                event = events.recv() => match event {
                    Some(e) => state.apply_all(shared, e, events),
                    None => return,
                },
            }
        }
    }
}

/// After the last pass: waits for the shutdown's request (taking stops before it is sent), then
/// collects how each task ended, until the shutdown's deadline and a heartbeat more: a task whose
/// processor is cut short at the deadline tells it `lease_lost` (bounded by half a heartbeat) and
/// releases the lease itself. A task still running then is aborted and its lease released anyway
/// (abandoned). Last, this worker's pending claims are withdrawn.
async fn finish(
    shared: &Arc<Shared>,
    events: &mut UnboundedReceiver<Event>,
    state: &mut LoopState,
) {
    // No more passes: callers waiting for one are let go at once.
    state.answering.clear();
    let (deadline, reply) = loop {
        if let Some(request) = state.shutdown.take() {
            break request;
        }
        // A worker stopped by a failed loop sends no request: nothing to collect.
        let event = tokio::select! {
            biased;
            e = events.recv() => e,
            _ = shared.cancel.cancelled() => return,
        };
        match event {
            Some(e) => {
                state.apply(shared, e);
                state.answering.clear();
            }
            None => return,
        }
    };
    // Every task still in the map was running when taking stopped, or ended since; those that
    // ended since and were removed already wait in `exited_while_stopping`.
    let mut held: BTreeMap<LeaseKey, Epoch> =
        state.tasks.iter().map(|(k, t)| (k.clone(), t.epoch)).collect();
    for e in state.tasks.exited_while_stopping() {
        held.entry(e.key.clone()).or_insert(e.epoch);
    }
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
    let until = deadline + shared.cfg.heartbeat_interval();
    loop {
        for exited in state.tasks.take_exited_while_stopping() {
            record(&mut held, exited);
        }
        if held.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            event = events.recv() => match event {
                Some(e) => state.apply_all(shared, e, events),
                None => break,
            },
            _ = tokio::time::sleep_until(until) => break,
        }
    }
    for (key, epoch) in held {
        if let Some(t) = state.tasks.remove(&key) {
            t.abort();
        }
        warn!(shard = %key, "lease task did not stop in time; releasing its lease anyway");
        let token = crate::lease::LeaseToken { key: key.clone(), owner: shared.id(), epoch };
        match lease_task::transfer(shared, &mut state.timing, &token, None).await {
            lease_task::Ended::Released(resumes_at) | lease_task::Ended::Abandoned(resumes_at) => {
                report.abandoned.push(ReleasedLease { key, resumes_at });
            }
            _ => report.not_released.push(key),
        }
    }
    state.tasks.publish(shared);
    withdraw_claims(shared, state).await;
    report.sort();
    let _ = reply.send(report);
}

/// Withdraws this worker's pending claims before it leaves. A peer that already answered one hands
/// the lease to this worker: such a lease is released at once rather than left to a departed owner
/// (it would otherwise wait a failover timeout).
async fn withdraw_claims(shared: &Shared, state: &mut LoopState) {
    let me = shared.id();
    let claimed: Vec<LeaseKey> = state.claims.mine();
    for key in claimed {
        let outcome = super::cas::write(
            shared,
            &mut state.timing,
            &key,
            None,
            super::cas::Policy::PERSIST,
            "withdraw a claim",
            |l| transition::withdraw_claim(l, &me, crate::clock::now_millis()),
        )
        .await;
        if let super::cas::Outcome::Written(..) = outcome {
            state.changed(shared, 1);
        }
    }
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
