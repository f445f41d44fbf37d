//! The heartbeat loop, peer liveness, and self-fencing.
//!
//! One write per worker per interval (never one per lease), then one listing of worker records to
//! update the liveness view; a peer that died or left triggers a balance pass at once. The record
//! carries the worker's count of ownership changes: a peer whose count moved (or a worker that
//! came) is the signal to list the leases again soon (no sooner than half a balance interval after
//! the last listing), so a quiet fleet reads worker records, not leases. A worker that just changed something beats early (no sooner than a
//! quarter interval after its last beat) so that peers hear of it within about a heartbeat. The watchdog
//! fences this worker when no heartbeat has succeeded for `failover_timeout − heartbeat_interval`
//! since the last successful one was *sent*: every lease task stops before any peer can judge this
//! worker dead and take its leases.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::task::AbortHandle;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::shared::{lock, Shared, StopReason};
use crate::worker_record::WorkerRecord;

pub(crate) async fn heartbeat_loop(shared: Arc<Shared>) {
    let hb = shared.cfg.heartbeat_interval();
    let mut beat: u64 = WorkerRecord::first_beat();
    // Each peer's published count of ownership changes, as last listed.
    let mut peers: Option<BTreeMap<crate::ids::WorkerId, u64>> = None;
    loop {
        beat += 1;
        let sent = Instant::now();
        let mut record = WorkerRecord::new(shared.id(), beat);
        record.lease_count = shared.held().len() as u32;
        record.capacity = shared.cfg.max_leases_per_worker().map(|m| m as u32);
        record.changes = shared.changes.load(Ordering::SeqCst);
        match timeout(hb, shared.store.heartbeat(&record)).await {
            Ok(Ok(())) => {
                shared.bump(&shared.stats.heartbeats, 1);
                if shared.fenced.swap(false, Ordering::SeqCst) {
                    info!(worker = %record.id, "heartbeat succeeded again; resuming as a new incarnation");
                    shared.want_listing();
                    let former: Vec<_> = lock(&shared.former_ids).iter().cloned().collect();
                    for old in former {
                        if let Err(e) = shared.store.remove_worker(&old).await {
                            debug!(error = %crate::error::ErrorChain(&e), worker = %old, "removing the record of an earlier incarnation failed");
                        }
                    }
                }
                shared.heartbeat_ok.send_replace(Some(sent));
            }
            Ok(Err(e)) => warn!(error = %crate::error::ErrorChain(&e), beat, "heartbeat failed"),
            Err(_) => warn!(beat, ?hb, "heartbeat timed out"),
        }
        let list_started = Instant::now();
        match timeout(hb, shared.store.list_workers()).await {
            Ok(Ok(listing)) => {
                for c in &listing.corrupt {
                    warn!(worker = %c.key, reason = %c.reason, "corrupt worker record skipped");
                }
                let change = shared.observe_workers(&listing.items, list_started);
                if !change.went_back.is_empty() {
                    // A running owner repairs what it runs within a (jittered) pass; give it that
                    // and a heartbeat before taking anything that only looks available.
                    let grace = shared.cfg.balance_interval().mul_f64(1.0 + shared.cfg.jitter())
                        + shared.cfg.heartbeat_interval();
                    *lock(&shared.hold_takes_until) = Some(Instant::now() + grace);
                    warn!(
                        workers = ?change.went_back,
                        ?grace,
                        "worker records went back in time (the store lost writes): taking no \
                         lease that looks available for a while, so their owners repair them first"
                    );
                }
                let me = shared.id();
                let now: BTreeMap<_, _> = listing
                    .items
                    .iter()
                    .filter(|r| r.id != me)
                    .map(|r| (r.id.clone(), r.changes))
                    .collect();
                let moved = peers.as_ref() != Some(&now);
                if moved {
                    debug!("a peer changed owners, came or went: the next pass lists the leases");
                }
                peers = Some(now);
                shared.workers_listed.send_replace(Some(list_started));
                remove_long_dead(&shared).await;
                shared.metrics.live_workers(listing.items.len());
                if change.needs_balance() || !change.went_back.is_empty() {
                    shared.want_listing();
                } else if moved {
                    // Listed soon (a claim on this worker's leases is answered, a lease handed to
                    // it resumed, without waiting for the regular pass), but no sooner than half
                    // a balance interval after the last listing: with many workers changing
                    // owners together (a fleet starting, a rolling deploy), a pass per signal
                    // would list the leases back to back on every worker.
                    shared.peer_moved();
                }
            }
            Ok(Err(e)) => warn!(error = %crate::error::ErrorChain(&e), "listing workers failed"),
            Err(_) => warn!("listing workers timed out"),
        }
        {
            let tasks = lock(&shared.tasks);
            shared.metrics.leases_held(tasks.values().filter(|t| t.is_running()).count());
            let now = Instant::now();
            tasks.values().for_each(|t| t.metrics.refresh_checkpoint_age(now));
        }
        let next = sent + shared.jittered(hb);
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(next) => {}
            _ = shared.publish_now.notified() => {
                // Publish a change early, but no more than four beats per interval.
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until((sent + hb / 4).min(next)) => {}
                    _ = shared.workers_changed.notified() => {}
                    _ = shared.cancel.cancelled() => return,
                }
            }
            _ = shared.workers_changed.notified() => {} // a worker came or went: list now
            _ = shared.cancel.cancelled() => return,
        }
    }
}

/// How many failover timeouts a worker's heartbeat must stand still before its record is removed.
/// A worker that stopped heartbeating fenced itself after one failover timeout and comes back
/// under a new id, so its record is garbage long before this; a process restarted under the same
/// id beats again, and the removal is conditional on the beat, so it never loses a live record.
const DEAD_RECORD_AGE_IN_FAILOVERS: u32 = 10;

/// Removes the records of workers dead for [`DEAD_RECORD_AGE_IN_FAILOVERS`] failover timeouts
/// (crashed processes with generated ids would otherwise leave one record each, listed by every
/// worker on every heartbeat forever).
async fn remove_long_dead(shared: &Shared) {
    let age = shared.cfg.failover_timeout().saturating_mul(DEAD_RECORD_AGE_IN_FAILOVERS);
    let garbage = lock(&shared.liveness).long_dead(age);
    for (id, beat) in garbage {
        match timeout(shared.cfg.heartbeat_interval(), shared.store.remove_worker_if(&id, beat))
            .await
        {
            Ok(Ok(true)) => {
                info!(worker = %id, beat, ?age, "removed the record of a long-dead worker")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                debug!(worker = %id, error = %crate::error::ErrorChain(&e), "removing a long-dead worker's record failed")
            }
            Err(_) => debug!(worker = %id, "removing a long-dead worker's record timed out"),
        }
    }
}

/// Fences the worker when heartbeats stop succeeding, before peers may judge it dead.
pub(crate) async fn watchdog(shared: Arc<Shared>) {
    let limit = shared.cfg.failover_timeout().saturating_sub(shared.cfg.heartbeat_interval());
    let mut rx = shared.heartbeat_ok.subscribe();
    loop {
        let last = *rx.borrow_and_update();
        let Some(sent) = last else {
            tokio::select! {
                biased;
                r = rx.changed() => if r.is_err() { return },
                _ = shared.cancel.cancelled() => return,
            }
            continue;
        };
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(sent + limit) => {
                if *rx.borrow() == Some(sent) && !shared.fenced.load(Ordering::SeqCst) {
                    fence(&shared).await;
                }
                tokio::select! {
                    biased;
                    r = rx.changed() => if r.is_err() { return },
                    _ = shared.cancel.cancelled() => return,
                }
            }
            r = rx.changed() => if r.is_err() { return },
            _ = shared.cancel.cancelled() => return,
        }
    }
}

/// Stops every lease task (they write nothing), forgets pending claims, and pauses balancing
/// until a heartbeat succeeds again.
pub(crate) async fn fence(shared: &Shared) {
    shared.fenced.store(true, Ordering::SeqCst);
    shared.bump(&shared.stats.fenced, 1);
    shared.metrics.self_fenced();
    // The task map is the balance loop's: the fence only reads it. The tasks it stops report
    // their end to the loop, which removes them (it runs no pass while this worker is fenced).
    let running: Vec<(CancellationToken, AbortHandle)> = {
        let tasks = lock(&shared.tasks);
        for t in tasks.values() {
            t.stop.send_replace(Some(StopReason::Fenced));
        }
        tasks
            .values()
            .filter(|t| t.is_running())
            .map(|t| (t.done.clone(), t.abort.clone()))
            .collect()
    };
    error!(
        leases = running.len(),
        "no successful heartbeat for failover_timeout − heartbeat_interval: stopping every lease \
         before peers can judge this worker dead"
    );
    // One deadline for the whole fence, not one per task: with thousands of leases, half a
    // heartbeat each would outlast the failover timeout.
    let deadline = Instant::now() + shared.cfg.heartbeat_interval() / 2;
    let ended = futures::future::join_all(running.iter().map(|(done, _)| done.cancelled()));
    if tokio::time::timeout_at(deadline, ended).await.is_err() {
        for (_, abort) in &running {
            abort.abort();
        }
    }
    lock(&shared.my_claims).clear();
    lock(&shared.granted).clear();
    // Start over as a new worker: peers that judged the old incarnation dead (possibly from a
    // listing older than our recovery) must never mistake the new one for it.
    let (old, new) = shared.reincarnate();
    info!(%old, %new, "fenced; will come back as a new incarnation");
}
