//! `join`, `leave` and `crash`: one worker arrives in, or leaves, a balanced fleet while records
//! flow.
//!
//! A producer writes `--rate` records per second for the whole run and a [`Recorder`] counts every
//! delivery. Once the `--workers` fleet is balanced, the event happens (a worker starts; the first
//! worker shuts down gracefully; the first worker crashes, releasing nothing). The run reports,
//! from the event:
//! - `seconds_to_full_coverage` (leave, crash): until every active lease is owned by a running
//!   worker; `null` for join, where coverage is never lost;
//! - `seconds_to_balanced`, `max_share` / `min_share` once balanced, and `lease_moves` (changes of
//!   owner seen from the event until balanced; the ideal is the departed worker's share for leave
//!   and crash, and the newcomer's share for join);
//! - `records_processed_twice`: deliveries beyond the first caused after the event, counted once
//!   the producer stopped and every record written was delivered (0 expected for a graceful
//!   handoff; a crash may redeliver what was processed but not checkpointed).

use std::cell::RefCell;
use std::time::Instant;

use shardlease_testkit::recorder::Recorder;

use crate::error::BenchError;
use crate::fleet::{Fleet, MoveCounter};
use crate::producer::Producer;
use crate::report::Report;
use crate::streams::BenchStreams;
use crate::wait::{self, Check};

use super::{finish, note_health, seconds, stats_delta, Goal, Run};

/// What happens to the balanced fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// One more worker starts.
    Join,
    /// One worker shuts down gracefully.
    Leave,
    /// One worker crashes.
    Crash,
}

/// Runs the scenario for `event`.
pub async fn run(run: &Run<'_>, event: Event) -> Result<Report, BenchError> {
    let recorder = Recorder::new();
    let source = run.source();
    let mut fleet = run.fleet(&source, recorder.factory())?;
    let producer = Producer::start(source.clone(), run.args.rate, run.args.seed);
    let measured = measure(run, &mut fleet, event, &recorder, producer, &source).await;
    finish(&mut fleet, measured).await
}

async fn measure(
    run: &Run<'_>,
    fleet: &mut Fleet,
    event: Event,
    recorder: &Recorder,
    producer: Producer,
    source: &BenchStreams,
) -> Result<Report, BenchError> {
    fleet.sync_shards().await?;
    fleet.start_workers(run.args.workers)?;
    let (before, _) = run.wait_for(fleet, Goal::Balanced, &RefCell::default()).await?;
    let moves = RefCell::new(MoveCounter::default());
    moves.borrow_mut().observe(&before);
    let stats_before = fleet.stats();
    let duplicates_before = recorder.duplicates();
    let victim = fleet.running().into_iter().next();

    let start = Instant::now();
    let mut r = run.report();
    match (event, &victim) {
        (Event::Join, _) => {
            let id = fleet.start_worker()?;
            r.set("joined", id.as_str());
        }
        (Event::Leave, Some(id)) => {
            fleet.shutdown(id).await?;
            r.set("seconds_in_shutdown_call", seconds(start, Instant::now()));
            r.set("left", id.as_str());
        }
        (Event::Crash, Some(id)) => {
            fleet.crash(id);
            r.set("crashed", id.as_str());
        }
        (_, None) => return Err(BenchError::Setup("no worker to stop".into())),
    }
    let fleet = &*fleet;
    if event != Event::Join {
        let (_, covered_at) = run.wait_for(fleet, Goal::Covered, &moves).await?;
        r.seconds_to_full_coverage = Some(seconds(start, covered_at));
    }
    let (balanced, balanced_at) = run.wait_for(fleet, Goal::Balanced, &moves).await?;
    r.seconds_to_balanced = Some(seconds(start, balanced_at));
    r.max_share = Some(balanced.max_share());
    r.min_share = Some(balanced.min_share());
    r.set("lease_moves", moves.borrow().moves());
    // Moves seen less than half a balance interval apart count as one round of handoffs.
    let rounds = moves.borrow().rounds(run.args.timings.balance / 2);
    r.set("handoff_rounds", rounds.len());
    r.set("moves_per_round", rounds);
    let stats_after = fleet.stats();
    r.set("handoffs", stats_delta(&stats_before, &stats_after, |s| s.handoffs));
    r.set("claims", stats_delta(&stats_before, &stats_after, |s| s.claims));
    r.set("taken", stats_delta(&stats_before, &stats_after, |s| s.taken));

    producer.stop().await;
    let produced = source.produced();
    wait::until("every record written to be delivered", run.timeout(), run.poll(), || async {
        let distinct = recorder.distinct() as u64;
        Ok(if distinct >= produced {
            Check::Done(())
        } else {
            Check::NotYet(format!("{distinct} of {produced} records delivered"))
        })
    })
    .await?;
    r.records_processed_twice = Some(recorder.duplicates().saturating_sub(duplicates_before));
    r.set("records_produced", produced);
    r.set("rate", run.args.rate);
    r.set("lease_lost_calls", recorder.lost());
    note_health(&mut r, fleet);
    Ok(r)
}
