//! A plan carried out as compare-and-set writes: the takes of a pass (bounded concurrency, stale
//! candidates refreshed), the take-overs of timed-out claims, the claims, the handoffs and the
//! cleared claims. Every write is a transition of `lease::transition` issued through `cas::write`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::super::shared::{Shared, StopReason};
use super::super::{cas, lease_task};
use crate::balancer::Plan;
use crate::lease::transition;
use crate::lease::{Lease, LeaseKey, Version, VersionedLease, WorkerId};

use super::claims::{acknowledge_claim, clear_claim};
use super::LoopState;

/// Carries out a plan; returns the claims on this worker's leases it answered (acknowledged for a
/// handoff, or cleared).
pub(super) async fn execute(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    plan: &Plan,
    by_key: &BTreeMap<&LeaseKey, &VersionedLease>,
) -> BTreeSet<LeaseKey> {
    let mut answered = BTreeSet::new();
    take_share(shared, state, plan, by_key).await;
    for key in &plan.take_over {
        if let Some(v) = by_key.get(key) {
            if take(shared, state, v).await {
                shared.metrics.taken(key);
                info!(shard = %key, "owner did not hand over a claimed lease in time; took it");
            }
        }
    }
    // Claims are written concurrently (bounded), so an owner's next listing sees all of them and
    // answers them in one round.
    let me = shared.id();
    let claims: Vec<(Lease, Version, WorkerId, super::super::shared::Timing)> = plan
        .claims
        .iter()
        .filter_map(|(key, current)| {
            by_key.get(key).map(|v| (v.lease.clone(), v.version, current.clone()))
        })
        .map(|(l, v, w)| (l, v, w, state.timing.fork()))
        .collect();
    let written: Vec<Option<(LeaseKey, Version, WorkerId)>> = futures::stream::iter(claims)
        .map(|(lease, version, current, mut timing)| {
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
                let outcome = cas::write(
                    shared,
                    &mut timing,
                    &lease.key,
                    listed,
                    cas::Policy::PERSIST,
                    "claim",
                    |l| transition::claim(&lease, l, &me),
                )
                .await;
                match outcome {
                    cas::Outcome::Written(_, v) => Some((lease.key.clone(), v, current)),
                    cas::Outcome::Declined(_) | cas::Outcome::GaveUp => None,
                }
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect()
        .await;
    for (key, v, current) in written.into_iter().flatten() {
        state.claims.made(key.clone(), v);
        state.changed(shared, 1);
        shared.metrics.claimed(&key);
        debug!(shard = %key, from = %current, "claimed");
    }
    // Handoffs: acknowledge every claim first, concurrently (bounded), so an owner answering
    // hundreds of claims restarts every claimant's clock within one pass.
    let mut running = Vec::new();
    for (key, to) in &plan.handoffs {
        // A task that ended (its report not applied yet) wrote all it will: the lease is handed
        // over directly, if the listed token still holds.
        let task = state
            .tasks
            .get(key)
            .filter(|t| t.is_running())
            .map(|t| (t.epoch, t.stop.borrow().is_none()));
        match task {
            Some((epoch, true)) => {
                running.push((key.clone(), to.clone(), epoch, state.timing.fork()))
            }
            Some((_, false)) => {} // already stopping
            None => {
                if let Some(token) = by_key.get(key).and_then(|v| v.lease.token()) {
                    lease_task::transfer(shared, &mut state.timing, &token, Some(to.clone())).await;
                }
            }
        }
    }
    let acks = futures::stream::iter(running)
        .map(|(key, to, epoch, timing)| {
            let shared = shared.clone();
            async move {
                // The write restarts the claimant's claim timeout, which validation keeps longer
                // than the deadline given to the task here, so the claimant never takes the lease
                // by force while the processor still flushes.
                let sent = Instant::now();
                let acked = acknowledge_claim(&shared, timing, &key, epoch, &to).await;
                acked.then_some((key, to, epoch, sent))
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect::<Vec<_>>()
        .await;
    for (key, to, epoch, sent) in acks.into_iter().flatten() {
        answered.insert(key.clone());
        let deadline = sent + shared.cfg.shutdown_timeout();
        if let Some(t) = state.tasks.get(&key) {
            if t.epoch == epoch && t.stop.borrow().is_none() {
                t.stop.send_replace(Some(StopReason::Handoff { to, deadline }));
            }
        }
    }
    for key in &plan.clear_claims {
        if let Some(v) = by_key.get(key) {
            if clear_claim(shared, state, v).await {
                answered.insert(key.clone());
            }
        }
    }
    answered
}

/// Takes written per store batch (`LeaseStore::update_leases`) at least, when `take_concurrency`
/// is lower: a batch costs about one round trip whatever its length.
pub(super) const TAKE_BATCH: usize = 128;

/// Refreshes of a pass's take candidates at most, before the rest is left to the next pass.
pub(super) const MAX_CANDIDATE_REFRESHES: usize = 8;

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
pub(super) async fn take_share(
    shared: &Arc<Shared>,
    state: &mut LoopState,
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
    // The chunk whose writes are on their way. While the chunks come back without a conflict,
    // the next chunk is sent before this one's outcomes are applied (its lease tasks started),
    // so the store writes one while this worker starts the tasks of the other; chosen as if the
    // chunk on its way were all won, so no more than the plan's count is ever sent. After a
    // conflict the chunks go one at a time again, so a stale candidate list costs at most one
    // chunk sent ahead before the refresh (docs/algorithm.md, "Stale take candidates").
    let mut in_flight: Option<(Vec<&VersionedLease>, tokio::task::JoinHandle<Vec<TakeWrite>>)> =
        None;
    let mut last_clean = false;
    loop {
        let on_the_way = in_flight.as_ref().map_or(0, |(chunk, _)| chunk.len());
        let mut next = None;
        let stopped = shared.stop_taking.is_cancelled() || shared.is_fenced();
        let may_send = in_flight.is_none() || last_clean;
        if taken + on_the_way < plan.take_count && !stopped && may_send {
            let missing = plan.take_count - taken;
            if conflicts >= missing.max(shared.cfg.take_concurrency()) && !candidates.is_empty() {
                // The refresh decides on every outcome so far.
                if let Some((chunk, writes)) = in_flight.take() {
                    let (won, tried) = took_chunk(shared, state, &chunk, writes).await;
                    taken += won;
                    conflicts += tried - won;
                    last_clean = won == tried;
                    continue;
                }
                if refreshes == MAX_CANDIDATE_REFRESHES {
                    debug!(
                        taken,
                        missing, "take candidates keep going stale; the next pass goes on"
                    );
                    break;
                }
                refreshes += 1;
                conflicts = 0;
                let Some(fresh) = refresh_candidates(shared, state, &mut candidates).await else {
                    break;
                };
                debug!(taken, missing, candidates = fresh, "take candidates refreshed");
                continue;
            }
            // One store batch (`update_leases`) per chunk: `take_concurrency` leases, or more up
            // to `TAKE_BATCH`, since a batch costs about one round trip whatever its length.
            let want = (missing - on_the_way).min(shared.cfg.take_concurrency().max(TAKE_BATCH));
            let chunk: Vec<&VersionedLease> =
                candidates.drain(..want.min(candidates.len())).collect();
            if !chunk.is_empty() {
                let writes = send_takes(shared, &chunk);
                next = Some((chunk, writes));
            }
        }
        match std::mem::replace(&mut in_flight, next) {
            Some((chunk, writes)) => {
                let (won, tried) = took_chunk(shared, state, &chunk, writes).await;
                taken += won;
                conflicts += tried - won;
                last_clean = won == tried;
            }
            None if in_flight.is_none() => break,
            None => {}
        }
    }
    // Published once for the whole share (the pass publishes again at its end): once per chunk
    // cost a copy of the growing map per 16 takes, a tenth of a second at 10,000 leases.
    state.tasks.publish(shared);
    if taken > 0 {
        shared.metrics.taking_pass();
        info!(taken, "took leases");
    }
}

/// Keeps of `candidates` those whose record a new listing shows unchanged (the same version).
/// The number kept, or `None` when the listing failed or takes are on hold
/// (the store went back in time meanwhile): the pass then stops taking.
pub(super) async fn refresh_candidates(
    shared: &Shared,
    state: &mut LoopState,
    candidates: &mut VecDeque<&VersionedLease>,
) -> Option<usize> {
    let listing = match shared.store.list_leases().await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing leases to refresh take candidates failed; the next pass goes on");
            return None;
        }
    };
    shared.metrics.lease_listing();
    if state.membership.holding_takes() {
        return None;
    }
    let now: HashMap<&LeaseKey, Version> =
        listing.items.iter().map(|v| (&v.lease.key, v.version)).collect();
    candidates.retain(|c| now.get(&c.lease.key) == Some(&c.version));
    Some(candidates.len())
}

/// The outcome of one take's write.
pub(super) enum TakeWrite {
    /// Written: the record and its version.
    Won(Lease, Version),
    /// Someone else acted first, or the record moved.
    Lost,
    /// The store kept failing: the write may have landed all the same.
    Uncertain,
}

/// Writes takes by compare-and-set (owner = me, a new epoch) against the listed records, as one
/// batch of the store (`cas::write_once_batch`): each ends as its own single write would.
pub(super) async fn take_writes(shared: &Shared, listed: &[&VersionedLease]) -> Vec<TakeWrite> {
    let me = shared.id();
    let outcomes = cas::write_once_batch(shared, listed, "take the lease", |l| {
        transition::take(l, &me, crate::clock::now_millis())
    })
    .await;
    outcomes
        .into_iter()
        .map(|outcome| match outcome {
            cas::Outcome::Written(next, v) => TakeWrite::Won(next, v),
            cas::Outcome::Declined(_) => TakeWrite::Lost,
            cas::Outcome::GaveUp => TakeWrite::Uncertain,
        })
        .collect()
}

/// Applies a take's write: a lease won is granted, remembered, counted and started (or, when
/// taking stopped meanwhile, given back at once). True when the lease was won.
async fn took(shared: &Arc<Shared>, state: &mut LoopState, outcome: TakeWrite) -> bool {
    match outcome {
        TakeWrite::Won(next, v) => {
            state.tasks.grant(next.key.clone(), next.epoch);
            state.memory.remember_taken(&next, Instant::now());
            state.changed(shared, 1);
            if !lease_task::spawn(shared, state, next.clone(), v) {
                if shared.stop_taking.is_cancelled() {
                    // Shutting down: give back what this pass took at the last moment.
                    if let Some(token) = next.token() {
                        lease_task::transfer(shared, &mut state.timing, &token, None).await;
                    }
                    return false;
                }
                debug!(shard = %next.key, "not started now (fenced, or a task is still stopping)");
            }
            true
        }
        TakeWrite::Lost => false,
        TakeWrite::Uncertain => {
            // The write may have landed all the same: look again at the next pass.
            state.schedule.want_listing();
            false
        }
    }
}

/// Sends the take writes of `chunk` (`take_writes`) as a task of their own, so they go on while
/// the balance loop applies the chunk before.
fn send_takes(
    shared: &Arc<Shared>,
    chunk: &[&VersionedLease],
) -> tokio::task::JoinHandle<Vec<TakeWrite>> {
    let shared = shared.clone();
    let listed: Vec<VersionedLease> = chunk.iter().map(|v| (*v).clone()).collect();
    let writes = async move {
        let listed: Vec<&VersionedLease> = listed.iter().collect();
        take_writes(&shared, &listed).await
    };
    tokio::spawn(tracing::Instrument::in_current_span(writes))
}

/// Applies the take writes of `chunk` sent by [`send_takes`] (`took`): how many leases were won,
/// and how many were tried. Writes whose task failed count as uncertain (looked at again by the
/// next pass).
async fn took_chunk(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    chunk: &[&VersionedLease],
    writes: tokio::task::JoinHandle<Vec<TakeWrite>>,
) -> (usize, usize) {
    let outcomes = match writes.await {
        Ok(outcomes) if outcomes.len() == chunk.len() => outcomes,
        _ => std::iter::repeat_with(|| TakeWrite::Uncertain).take(chunk.len()).collect(),
    };
    let mut won = 0;
    for (v, outcome) in chunk.iter().zip(outcomes) {
        if took(shared, state, outcome).await {
            shared.metrics.taken(&v.lease.key);
            won += 1;
        }
    }
    (won, chunk.len())
}

/// Takes `listed` leases by compare-and-set, the writes in one batch, and starts their tasks.
/// One bool per lease: whether it was won.
pub(super) async fn take_all(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    listed: &[&VersionedLease],
) -> Vec<bool> {
    if shared.stop_taking.is_cancelled() || shared.is_fenced() {
        return vec![false; listed.len()];
    }
    let outcomes = take_writes(shared, listed).await;
    let mut won = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        won.push(took(shared, state, outcome).await);
    }
    won
}

/// Takes one lease by compare-and-set (owner = me, a new epoch) and starts its task. False on
/// conflict or error.
pub(super) async fn take(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    listed: &VersionedLease,
) -> bool {
    take_all(shared, state, &[listed]).await.first().copied().unwrap_or(false)
}
