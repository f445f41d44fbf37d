//! The heartbeat loop and self-fencing.
//!
//! One write per worker per interval (never one per lease), then one listing of worker records,
//! handed to the balance loop, which owns the liveness view (a peer that died or left triggers a
//! balance pass at once). The record
//! carries the worker's count of ownership changes (as the balance loop publishes it): a peer
//! whose count moved (or a worker that came) is the signal to list the leases again soon (no
//! sooner than half a balance interval after the last listing), so a quiet fleet reads worker
//! records, not leases. A worker that just changed something beats early (no sooner than a
//! quarter interval after its last beat) so that peers hear of it within about a heartbeat. The watchdog
//! fences this worker when no heartbeat has succeeded for `failover_timeout − heartbeat_interval`
//! since the last successful one was *sent*: every lease task stops before any peer can judge this
//! worker dead and take its leases.

use std::sync::Arc;

use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::events::Event;
use super::fleet_view::{self, FleetView};
use super::shared::{Incarnation, Shared, Timing, INCARNATION_SEPARATOR};
use crate::ids::WorkerId;
use crate::worker_record::WorkerRecord;

pub(crate) async fn heartbeat_loop(shared: Arc<Shared>) {
    let hb = shared.cfg.heartbeat_interval();
    let mut timing = Timing::new(&shared.cfg, shared.rng(3));
    let mut beat: u64 = WorkerRecord::first_beat();
    let mut changes = shared.changes.subscribe();
    // When the first heartbeat that succeeded was sent.
    let mut first_ok: Option<Instant> = None;
    let by_count = matches!(shared.cfg.balance(), crate::Balance::ByCount);
    let mut fleet = FleetView::new(by_count, shared.cfg.failover_timeout(), shared.rng(9));
    // The published change count the fleet signal last announced (`None`: not yet, for this
    // incarnation).
    let mut announced: Option<u64> = None;
    loop {
        beat += 1;
        let sent = Instant::now();
        let mut record = WorkerRecord::new(shared.id(), beat);
        let held = shared.held.borrow().clone();
        let running = held.iter().filter(|t| t.is_running()).count();
        record.lease_count = u32::try_from(running).unwrap_or(u32::MAX);
        record.capacity =
            shared.cfg.max_leases_per_worker().map(|m| u32::try_from(m).unwrap_or(u32::MAX));
        record.changes = *changes.borrow_and_update();
        if matches!(shared.cfg.balance(), crate::Balance::ByLoad(_)) {
            publish_loads(&shared, &held, &mut record);
        }
        match timeout(hb, shared.store.heartbeat(&record)).await {
            Ok(Ok(())) => {
                shared.metrics.heartbeat();
                if resume(&shared) {
                    info!(worker = %record.id, "heartbeat succeeded again; resuming as a new incarnation");
                    shared.tell(Event::Resumed);
                    remove_former_records(&shared);
                    announced = None;
                }
                // Peers read the record at their next full listing: announce a join (the first
                // beat of this incarnation) and every change of the published count.
                if fleet.gated()
                    && announced != Some(record.changes)
                    && fleet_view::signal(&shared, "joined or changed owners").await
                {
                    announced = Some(record.changes);
                }
                let first = *first_ok.get_or_insert(sent);
                fleet.start_hold_view_at(first + hb);
                shared.heartbeat_ok.send_replace(Some(sent));
            }
            Ok(Err(e)) => warn!(error = %crate::error::ErrorChain(&e), beat, "heartbeat failed"),
            Err(_) => warn!(beat, ?hb, "heartbeat timed out"),
        }
        if let Some(event) = fleet_view::observe(&shared, &mut fleet).await {
            shared.tell(event);
        }
        shared.metrics.leases_held(running);
        let now = Instant::now();
        held.iter().for_each(|t| t.metrics.refresh_checkpoint_age(now));
        let mut next = sent + timing.jittered(hb);
        // Until one interval after the first successful beat, the next beat waits for that
        // moment even when jittered shorter, so the listing of the workers that follows it is
        // the full view that ends the start hold (`balance::wait_for_first_view`); a beat
        // jittered earlier left the hold to the beat after, one more interval.
        if let Some(due) = first_ok.map(|first| first + hb) {
            if sent < due {
                next = next.max(due);
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(next) => {}
            moved = changes.changed() => {
                if moved.is_err() {
                    return;
                }
                // Publish a change early, but no more than four beats per interval.
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until((sent + hb / 4).min(next)) => {}
                    _ = shared.workers_changed.notified() => fleet.list_next(),
                    _ = shared.cancel.cancelled() => return,
                }
            }
            // A worker came or went: list now (all of them: its signal may not have landed).
            _ = shared.workers_changed.notified() => fleet.list_next(),
            _ = shared.cancel.cancelled() => return,
        }
    }
}

/// The loads' smoothing time, in balance intervals.
const LOAD_SMOOTHING_INTERVALS: u32 = 6;

/// Measures the running leases' loads, puts the heaviest and the total in `record`, and hands
/// them all to the balance loop (docs/algorithm.md, "Balancing by load"). The loads are smoothed
/// over six balance intervals (the default cooldown): a move is decided on a trend, not on one
/// busy second or a burst. Over two, the figures followed every burst of a stream whose rates
/// wander by ±20% every four intervals, and the `skew` bench moved leases for it in its steady
/// state. A young lease is not slowed by this: until the smoothing time has passed its figure is
/// the plain average since it reached the tip of its shard (`load_meter.rs`).
fn publish_loads(
    shared: &Shared,
    held: &[std::sync::Arc<super::shared::HeldLease>],
    record: &mut WorkerRecord,
) {
    let now = Instant::now();
    let tau = shared.cfg.balance_interval().saturating_mul(LOAD_SMOOTHING_INTERVALS);
    let mut loads: Vec<crate::load::LeaseLoad> = held
        .iter()
        .filter(|t| t.is_running())
        .map(|t| {
            // Finite and not negative whatever the clock did: etcd's JSON would write NaN as null.
            let load = t.metrics.sample_load(now, tau);
            let load = if load.is_finite() { load.max(0.0) } else { 0.0 };
            crate::load::LeaseLoad::new(t.key.clone(), load)
        })
        .collect();
    let total: f64 = loads.iter().map(|l| l.load).sum();
    // Heaviest first (ties: by key), and only the first few sorted: a worker of thousands of
    // leases selects its top K in linear time.
    let heavier = |a: &crate::load::LeaseLoad, b: &crate::load::LeaseLoad| {
        b.load.total_cmp(&a.load).then_with(|| a.key.cmp(&b.key))
    };
    let k = crate::load::MAX_PUBLISHED_LEASE_LOADS;
    if loads.len() > k {
        loads.select_nth_unstable_by(k - 1, heavier);
    }
    let mut top: Vec<_> = loads.iter().take(k).cloned().collect();
    top.sort_by(heavier);
    record.load = Some(total);
    record.lease_loads = top;
    shared.metrics.worker_load(total);
    shared.tell(Event::Loads(loads));
}

/// Removes the records of this process's earlier incarnations, from a task of its own and each
/// removal bounded by a heartbeat interval: the beat that resumed counts at once, and a slow store
/// delays no later beat. A record left behind (a removal that failed) is judged dead by peers and
/// collected as a long-dead record.
fn remove_former_records(shared: &Arc<Shared>) {
    let former = shared.incarnation.borrow().former.clone();
    if former.is_empty() {
        return;
    }
    let store = shared.store.clone();
    let limit = shared.cfg.heartbeat_interval();
    tokio::spawn(async move {
        for old in former.iter() {
            match timeout(limit, store.remove_worker(old)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    debug!(error = %crate::error::ErrorChain(&e), worker = %old, "removing the record of an earlier incarnation failed")
                }
                Err(_) => {
                    debug!(worker = %old, "removing the record of an earlier incarnation timed out")
                }
            }
        }
    });
}

/// Makes a fenced incarnation live again after a successful heartbeat; true when it was fenced.
fn resume(shared: &Shared) -> bool {
    shared.incarnation.send_if_modified(|i| {
        let fenced = !i.live;
        i.live = true;
        fenced
    })
}

/// Fences the worker when heartbeats stop succeeding, before peers may judge it dead.
pub(crate) async fn watchdog(shared: Arc<Shared>) {
    let limit = shared.cfg.failover_timeout().saturating_sub(shared.cfg.heartbeat_interval());
    let mut rng = shared.rng(4);
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
                if *rx.borrow() == Some(sent) && !shared.is_fenced() {
                    fence(&shared, &mut rng).await;
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

/// Stops every lease task (they write nothing) and starts over as a new incarnation that takes
/// nothing until a heartbeat succeeds again. The tasks stop on their incarnation's fence token,
/// without waiting for the balance loop (which may be waiting on the very store that failed);
/// the loop hears of the fence and forgets the old incarnation's claims and grants.
pub(crate) async fn fence(shared: &Shared, rng: &mut rand::rngs::StdRng) {
    use rand::Rng;
    shared.metrics.self_fenced();
    // Start over as a new worker: peers that judged the old incarnation dead (possibly from a
    // listing older than our recovery) must never mistake the new one for it.
    let suffix: u32 = rng.random();
    let new =
        WorkerId::new(format!("{}{INCARNATION_SEPARATOR}{suffix:08x}", shared.cfg.worker_id()));
    let old = shared.incarnation.borrow().clone();
    let mut former: Vec<WorkerId> = old.former.as_ref().clone();
    former.push(old.id.clone());
    shared.incarnation.send_replace(Incarnation {
        id: new.clone(),
        former: Arc::new(former),
        fence: CancellationToken::new(),
        live: false,
    });
    old.fence.cancel();
    shared.tell(Event::Fenced { old: old.id.clone() });
    let running: Vec<_> = shared.held.borrow().iter().filter(|t| t.is_running()).cloned().collect();
    error!(
        leases = running.len(),
        "no successful heartbeat for failover_timeout − heartbeat_interval: stopping every lease \
         before peers can judge this worker dead"
    );
    super::shared::end_or_abort(&running, shared.cfg.heartbeat_interval() / 2).await;
    info!(old = %old.id, %new, "fenced; will come back as a new incarnation");
}
