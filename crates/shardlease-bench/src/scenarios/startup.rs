//! `startup`: N shards, W workers started together.
//!
//! Leases are created first with a shard sync (creation is not timed). Then all workers start at
//! once and the run reports:
//! - `passes_to_full_coverage`: the largest number of lease-taking balance passes any worker had
//!   run when every active lease was owned (read once the counters account for every lease, since
//!   a pass counts itself after its last take lands in the store);
//! - `seconds_to_full_coverage`, `seconds_to_balanced` (shares within one, every worker running
//!   what it owns), `max_share` / `min_share` once balanced;
//! - `moves_after_first_pass`: changes of owner after each lease's first owner, from the start
//!   until balanced, as seen by polling the store (a lease seen owned by one worker, then by
//!   another, is one move; see [`MoveCounter`]). `moves_before_full_coverage` says how many of
//!   them happened before every lease was owned (the greedy policy covers everything in its first
//!   pass, so for it they all come after).

use std::cell::RefCell;
use std::time::Instant;

use crate::error::BenchError;
use crate::fleet::{Fleet, MoveCounter};
use crate::processors::Tally;
use crate::report::Report;
use crate::wait::{self, Check};

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
    let (covered, covered_at) = run.wait_for(fleet, Goal::Covered, &moves).await?;
    let moves_before_coverage = moves.borrow().moves();
    let active = covered.active as u64;
    let (stats, _) = wait::until(
        "the workers' counters to account for every lease",
        run.timeout(),
        run.poll(),
        || async {
            let stats = fleet.stats();
            let taken: u64 = stats.values().map(|s| s.taken).sum();
            Ok(if taken >= active {
                Check::Done(stats)
            } else {
                Check::NotYet(format!("{taken} of {active} takes counted"))
            })
        },
    )
    .await?;
    let passes = stats.values().map(|s| s.taking_passes).max().unwrap_or(0);
    let (balanced, balanced_at) = run.wait_for(fleet, Goal::Balanced, &moves).await?;
    let after = fleet.stats();
    let sum = |f: fn(&shardlease::WorkerStats) -> u64| -> u64 { after.values().map(f).sum() };

    let mut r = run.report();
    r.passes_to_full_coverage = Some(passes);
    r.seconds_to_full_coverage = Some(seconds(start, covered_at));
    r.moves_after_first_pass = Some(moves.borrow().moves());
    r.seconds_to_balanced = Some(seconds(start, balanced_at));
    r.max_share = Some(balanced.max_share());
    r.min_share = Some(balanced.min_share());
    r.set("active_leases", balanced.active);
    r.set("moves_before_full_coverage", moves_before_coverage);
    r.set("taken", sum(|s| s.taken));
    r.set("claims", sum(|s| s.claims));
    r.set("handoffs", sum(|s| s.handoffs));
    r.set("max_balance_passes", after.values().map(|s| s.passes).max().unwrap_or(0));
    r.set(
        "max_taking_passes_at_balanced",
        after.values().map(|s| s.taking_passes).max().unwrap_or(0),
    );
    note_health(&mut r, fleet);
    Ok(r)
}
