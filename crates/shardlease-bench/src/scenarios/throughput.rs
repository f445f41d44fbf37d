//! `throughput`: records per second through the runtime.
//!
//! The in-memory stream is pre-filled with `--records` records spread evenly over the shards, and
//! leases start at `TrimHorizon`. W workers run a no-op processor that checkpoints once per batch
//! (`--batch-limit` records). The run ends when every lease's checkpoint stands at its shard's
//! last record (so every record was processed). `records_per_sec` is `--records` over the time
//! from the first batch reaching a processor to the last checkpoint; `records_per_sec_from_start`
//! also counts the workers' start (first pass one heartbeat after start, by design).

use std::collections::BTreeMap;
use std::time::Instant;

use shardlease::Position;

use crate::counting_store::{per_second_per_worker, rates_json};
use crate::error::BenchError;
use crate::fleet::Fleet;
use crate::processors::Tally;
use crate::report::{round3, Report};
use crate::wait::{self, Check};

use super::{finish, note_health, seconds, Run};

/// Runs the scenario.
pub async fn run(run: &Run<'_>) -> Result<Report, BenchError> {
    let tally = Tally::new();
    let source = run.source();
    let shards = source.keys();
    let total = run.args.records;
    for i in 0..total {
        let Some(shard) = shards.get((i % shards.len() as u64) as usize) else { break };
        source.put_to_shard(shard, format!("record {i}").into_bytes())?;
    }
    // Where each lease's checkpoint stands once its shard is fully processed.
    let last: BTreeMap<String, Position> = shards
        .iter()
        .filter_map(|k| source.records(k).last().map(|r| (k.as_str().to_owned(), r.position())))
        .collect();
    let mut fleet = run.fleet(&source, tally.factory())?;
    let measured = measure(run, &mut fleet, &tally, &last).await;
    finish(&mut fleet, measured).await
}

async fn measure(
    run: &Run<'_>,
    fleet: &mut Fleet,
    tally: &Tally,
    last: &BTreeMap<String, Position>,
) -> Result<Report, BenchError> {
    fleet.sync_shards().await?;
    let total = run.args.records;
    let before = fleet.counted().counts();
    let start = Instant::now();
    fleet.start_workers(run.args.workers)?;
    let fleet = &*fleet;
    let timeout = run.timeout() + std::time::Duration::from_secs(total / 10_000);
    wait::until("every record processed and checkpointed", timeout, run.poll(), || async {
        let leases = fleet.leases().await?;
        let done = leases
            .iter()
            .filter(|l| last.get(l.key.as_str()).is_none_or(|p| &l.checkpoint == p))
            .count();
        Ok(if done == leases.len() && !leases.is_empty() {
            Check::Done(())
        } else {
            Check::NotYet(format!(
                "{done} of {} leases checkpointed at their last record, {} records delivered",
                leases.len(),
                tally.records()
            ))
        })
    })
    .await?;
    let ops = fleet.counted().counts().since(&before);
    let (Some(first), Some(done)) = (tally.first_batch(), tally.last_checkpoint()) else {
        return Err(BenchError::Setup("no batch was processed".into()));
    };
    let processing = done.saturating_duration_since(first).as_secs_f64();
    let from_start = done.saturating_duration_since(start).as_secs_f64();
    let workers = run.args.workers;

    let mut r = run.report();
    r.records_per_sec = (processing > 0.0).then(|| (total as f64 / processing).round());
    r.records_processed_twice = Some(tally.records().saturating_sub(total));
    r.store_reads_per_sec_per_worker =
        per_second_per_worker(ops.reads(), from_start, workers).as_f64();
    r.store_writes_per_sec_per_worker =
        per_second_per_worker(ops.writes(), from_start, workers).as_f64();
    r.set(
        "store_records_read_per_sec_per_worker",
        per_second_per_worker(ops.records_read, from_start, workers),
    );
    r.set(
        "store_records_written_per_sec_per_worker",
        per_second_per_worker(ops.records_written, from_start, workers),
    );
    r.set("records", total);
    r.set("records_delivered", tally.records());
    r.set("batch_limit", run.args.batch_limit);
    r.set("seconds_processing", round3(processing));
    r.set("seconds_from_start", seconds(start, done));
    r.set(
        "records_per_sec_from_start",
        if from_start > 0.0 { (total as f64 / from_start).round() } else { 0.0 },
    );
    r.set("ops_per_sec_per_worker", rates_json(&ops, from_start, workers));
    note_health(&mut r, fleet);
    Ok(r)
}
