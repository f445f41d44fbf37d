//! `steady`: what a balanced fleet costs the store when nothing happens.
//!
//! W workers balance N leases of an idle stream (no records flow, so no checkpoints: idle lease
//! tasks poll the source, not the store). Then every store call the workers make is counted for
//! `--duration-s`. Heartbeats are one write per worker per interval and leases are not renewed
//! one by one, so writes per worker should be about one per heartbeat interval whatever N is.
//! Reports reads and writes per second per worker, per operation in `ops_per_sec_per_worker`, and
//! `writes_per_heartbeat_per_worker` (≈ 1 expected). Calls hide what a listing costs, so the
//! records read and written (rows, items, keys) are reported too:
//! `store_records_read_per_sec_per_worker` is the figure that must not grow with N.

use std::cell::RefCell;
use std::time::Instant;

use serde_json::Value;

use crate::counting_store::{per_second_per_worker, rates_json};
use crate::error::BenchError;
use crate::fleet::{Fleet, MoveCounter};
use crate::processors::Tally;
use crate::report::{round3, rounded, Report};

use super::{finish, note_health, seconds, Goal, Run};

/// Runs the scenario.
pub async fn run(run: &Run<'_>) -> Result<Report, BenchError> {
    let tally = Tally::new();
    let mut fleet = run.fleet(&run.source(), tally.factory())?;
    let measured = measure(run, &mut fleet).await;
    finish(&mut fleet, measured).await
}

async fn measure(run: &Run<'_>, fleet: &mut Fleet) -> Result<Report, BenchError> {
    fleet.sync_shards().await?;
    let start = Instant::now();
    fleet.start_workers(run.args.workers)?;
    let fleet = &*fleet;
    let moves = RefCell::new(MoveCounter::default());
    let (balanced, balanced_at) = run.wait_for(fleet, Goal::Balanced, &moves).await?;
    // Balanced is not yet quiet: the passes right after the last move list the leases once more
    // to see that nothing is left to do. Wait until no worker has listed for two balance
    // intervals (bounded by the run's timeout), so the window measures the steady state.
    let listings =
        |f: &Fleet| -> Vec<u64> { f.stats().values().map(|s| s.lease_listings).collect() };
    let settle_deadline = Instant::now() + run.timeout();
    let mut seen = listings(fleet);
    loop {
        tokio::time::sleep(run.args.timings.balance * 2).await;
        let now = listings(fleet);
        if now == seen || Instant::now() >= settle_deadline {
            break;
        }
        seen = now;
    }
    let listings_before: u64 = listings(fleet).iter().sum();

    // The measurement window: the fleet is left alone, and only its own calls are counted.
    let before = fleet.counted().counts();
    let window_start = Instant::now();
    tokio::time::sleep(run.args.duration).await;
    let ops = fleet.counted().counts().since(&before);
    let listings_in_window = listings(fleet).iter().sum::<u64>() - listings_before;
    let window = window_start.elapsed().as_secs_f64();
    let end = fleet.coverage().await?;
    let workers = run.args.workers;

    let mut r = run.report();
    r.seconds_to_balanced = Some(seconds(start, balanced_at));
    r.max_share = Some(balanced.max_share());
    r.min_share = Some(balanced.min_share());
    let reads = per_second_per_worker(ops.reads(), window, workers);
    let writes = per_second_per_worker(ops.writes(), window, workers);
    r.store_reads_per_sec_per_worker = reads.as_f64();
    r.store_writes_per_sec_per_worker = writes.as_f64();
    r.set(
        "store_records_read_per_sec_per_worker",
        per_second_per_worker(ops.records_read, window, workers),
    );
    r.set(
        "store_records_written_per_sec_per_worker",
        per_second_per_worker(ops.records_written, window, workers),
    );
    r.set("leases", balanced.active);
    r.set("lease_listings_in_window", listings_in_window);
    r.set("window_s", round3(window));
    r.set("ops_per_sec_per_worker", rates_json(&ops, window, workers));
    r.set(
        "ops_total",
        Value::Object(ops.by_op().map(|(op, n)| (op.to_owned(), n.into())).collect()),
    );
    let heartbeat = run.args.timings.heartbeat.as_secs_f64();
    r.set(
        "writes_per_heartbeat_per_worker",
        writes.as_f64().map_or(Value::Null, |w| rounded(w * heartbeat)),
    );
    r.set("balanced_at_end", end.is_covered() && end.is_balanced() && fleet.tasks_match(&end));
    note_health(&mut r, fleet);
    Ok(r)
}
