//! `skew`: a skewed stream balanced by count and then by load, on the same machine in one run.
//!
//! Each shard's share of `--rate` is drawn from Zipf(`--zipf`) on `1..=--zipf-max` (seeded), and
//! a producer writes each shard at its rate times a factor redrawn from `1 ± --noise` every four
//! balance intervals. Every record costs `--record-cost-us` on its worker's modelled cores (`--worker-cores`, default 1)
//! (see `skew_processor`). For each mode, in a fresh namespace: the fleet starts, covers the
//! stream, and is watched for 30 balance intervals (the settling phase), then for `--duration-s`
//! (the steady phase).
//!
//! A worker's expected load is the sum of its leases' rates times the cost, read off who owns what
//! at each poll; `max_mean_load_ratio` is the largest over the mean, at the end of the run.
//! `best_possible_ratio` is what the heaviest lease allows (it cannot be split here).
//! `seconds_to_settle` runs from full coverage to the poll after which the ratio stayed within the
//! target (`max(1 + margin, best possible)`); `balance_intervals_to_settle` counts from the first
//! poll at which every worker had published loads. The steady phase reports moves (and moves per
//! lease per hour), records per second, the core time each worker used (`measured_…`), and the
//! processing lag of the most loaded worker. Records processed twice are counted over the whole
//! run of each mode: moves are graceful handoffs, so it should be 0.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{Map, Value};
use shardlease::store::LeaseStore;
use shardlease::{Balance, LeaseKey, LoadBalance, MemorySource, WorkerId};

use crate::args::Policy;
use crate::error::BenchError;
use crate::fleet::{config_template, Coverage, Fleet, MoveCounter};
use crate::report::{round3, rounded, Report};
use crate::skew_load::{zipf_weights, SkewedProducer};
use crate::skew_processor::SkewTally;

use super::{finish, note_health, seconds, Goal, Run};

/// Balance intervals the settling phase lasts.
const SETTLE_INTERVALS: u32 = 30;

/// The stream both modes consume.
struct Stream {
    /// Each shard's expected load (records per second times the record cost).
    loads: Vec<f64>,
    /// Records per second of each shard.
    rates: Vec<f64>,
    /// The mean worker load: total load over workers.
    mean: f64,
    /// The ratio the heaviest lease allows.
    best: f64,
}

/// Runs the scenario: both modes, one report.
pub async fn run(run: &Run<'_>) -> Result<Report, BenchError> {
    let a = run.args;
    let seed = a.seed.unwrap_or(1);
    let weights =
        zipf_weights(a.shards, a.skew.exponent, a.skew.max, &mut StdRng::seed_from_u64(seed));
    let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let cost = a.skew.record_cost.as_secs_f64();
    let rates: Vec<f64> = weights.iter().map(|&w| a.rate as f64 * f64::from(w) / total).collect();
    let loads: Vec<f64> = rates.iter().map(|r| r * cost).collect();
    let mean = loads.iter().sum::<f64>() / a.workers as f64;
    let heaviest = loads.iter().copied().fold(0.0, f64::max);
    let best = if mean > 0.0 { (heaviest / mean).max(1.0) } else { 1.0 };
    let stream = Stream { loads, rates, mean, best };

    let mut r = run.report();
    r.set("rate", a.rate);
    r.set("record_cost_us", u64::try_from(a.skew.record_cost.as_micros()).unwrap_or(u64::MAX));
    r.set("zipf_exponent", a.skew.exponent);
    r.set("zipf_max", a.skew.max);
    r.set("noise", a.skew.noise);
    r.set("worker_cores", a.skew.worker_cores);
    r.set("load_floor", a.skew.floor);
    r.set("hot_shards", weights.iter().filter(|&&w| w == a.skew.max).count());
    r.set("heaviest_lease_load", rounded(heaviest));
    r.set("mean_worker_load", rounded(mean));
    r.set("best_possible_ratio", rounded(best));
    let (mut twice, mut fences, mut lost) = (0, 0, 0);
    // Each worker's processors share its modelled cores (with no limit, at most one per lease),
    // as a real worker's share the machine's.
    let cores = if a.skew.worker_cores == 0 { a.shards } else { a.skew.worker_cores };
    let by_load =
        Balance::ByLoad(LoadBalance::default().with_cores(cores).with_floor(a.skew.floor));
    for (name, balance) in [("by_count", Balance::ByCount), ("by_load", by_load)] {
        let mode = one_mode(run, &stream, balance, seed).await?;
        let count = |key: &str| mode.get(key).and_then(Value::as_u64).unwrap_or(0);
        twice += count("records_processed_twice");
        fences += count("self_fences");
        lost += count("leases_lost");
        r.set(name, Value::Object(mode));
    }
    r.records_processed_twice = Some(twice);
    r.set("self_fences", fences);
    r.set("leases_lost", lost);
    Ok(r)
}

/// One mode's run in its own namespace; its figures as a JSON object.
async fn one_mode(
    run: &Run<'_>,
    stream: &Stream,
    balance: Balance,
    seed: u64,
) -> Result<Map<String, Value>, BenchError> {
    let a = run.args;
    let mode = match &balance {
        Balance::ByLoad(_) => "load",
        _ => "count",
    };
    let namespace = format!("{}-{mode}", run.namespace);
    let store = shardlease::connect_namespace(&a.store, &namespace).await?;
    let source = MemorySource::new(a.shards).with_batch_limit(a.batch_limit);
    let keys: Vec<LeaseKey> = source.shards().into_iter().map(|s| s.id).collect();
    let base = Instant::now();
    let tally = SkewTally::new(base, a.skew.record_cost, a.skew.worker_cores);
    let config = config_template(&namespace, &a.timings, a.seed)?
        .with_dedicated_heartbeat_thread(a.dedicated_heartbeat)
        .with_balance(balance.clone());
    let mut fleet = Fleet::new(
        store.clone(),
        Arc::new(source.clone()),
        tally.factory(),
        config,
        Policy::Greedy,
    );
    fleet.sync_shards().await?;
    let producer = SkewedProducer::start(
        source,
        keys.clone(),
        stream.rates.clone(),
        a.skew.noise,
        a.timings.balance * 4,
        base,
        seed,
    );
    let load_of: HashMap<LeaseKey, f64> = keys.into_iter().zip(stream.loads.clone()).collect();
    let measured = measure(run, &mut fleet, &*store, &tally, &load_of, stream, &balance).await;
    producer.stop().await;
    let report = finish(&mut fleet, measured).await?;
    Ok(report.extra)
}

/// Expected loads per running worker (zero for one that owns nothing) and the max/mean ratio.
fn expected(
    cov: &Coverage,
    load_of: &HashMap<LeaseKey, f64>,
    mean: f64,
) -> (BTreeMap<WorkerId, f64>, f64) {
    let mut per: BTreeMap<WorkerId, f64> = cov.shares.keys().map(|w| (w.clone(), 0.0)).collect();
    for (key, owner) in &cov.owners {
        if let Some(owner) = owner {
            *per.entry(owner.clone()).or_default() += load_of.get(key).copied().unwrap_or(0.0);
        }
    }
    let max = per.values().copied().fold(0.0, f64::max);
    (per, if mean > 0.0 { max / mean } else { 1.0 })
}

/// The largest over the mean of `values` (1 when they are all 0).
fn max_over_mean(values: impl IntoIterator<Item = f64>, n: usize) -> f64 {
    let v: Vec<f64> = values.into_iter().collect();
    let mean = v.iter().sum::<f64>() / n.max(1) as f64;
    if mean > 0.0 {
        v.iter().copied().fold(0.0, f64::max) / mean
    } else {
        1.0
    }
}

async fn measure(
    run: &Run<'_>,
    fleet: &mut Fleet,
    store: &dyn LeaseStore,
    tally: &SkewTally,
    load_of: &HashMap<LeaseKey, f64>,
    stream: &Stream,
    balance: &Balance,
) -> Result<Report, BenchError> {
    let a = run.args;
    let start = Instant::now();
    fleet.start_workers(a.workers)?;
    let fleet = &*fleet;
    let moves = RefCell::new(MoveCounter::default());
    let (_, covered_at) = run.wait_for(fleet, Goal::Covered, &moves).await?;
    let moves_at_coverage = moves.borrow().moves();
    let margin = match balance {
        Balance::ByLoad(LoadBalance { margin, .. }) => *margin,
        _ => LoadBalance::default().margin,
    };
    let target = (1.0 + margin).max(stream.best);

    // Settling: watch who owns what; the ratio must reach the target and stay there.
    let settle_end = covered_at + a.timings.balance * SETTLE_INTERVALS;
    let mut settled_at: Option<Instant> = None;
    let mut loads_at: Option<Instant> = None;
    while Instant::now() < settle_end {
        let cov = fleet.coverage().await?;
        moves.borrow_mut().observe(&cov);
        let now = Instant::now();
        let (_, ratio) = expected(&cov, load_of, stream.mean);
        if ratio <= target + 1e-9 && cov.is_covered() {
            settled_at.get_or_insert(now);
        } else {
            settled_at = None;
        }
        if loads_at.is_none() {
            let workers = store.list_workers().await?.items;
            if !workers.is_empty() && workers.iter().all(|w| !w.lease_loads.is_empty()) {
                loads_at = Some(now);
            }
        }
        tokio::time::sleep(run.poll()).await;
    }
    let settle_moves = moves.borrow().moves();

    // Steady state: count moves, records and each worker's core time.
    let _ = tally.reset_window();
    let window_start = Instant::now();
    let window_end = window_start + a.duration;
    let mut last = fleet.coverage().await?;
    while Instant::now() < window_end {
        tokio::time::sleep(run.poll().max(Duration::from_millis(20))).await;
        last = fleet.coverage().await?;
        moves.borrow_mut().observe(&last);
    }
    let window = tally.reset_window();
    let window_s = window_start.elapsed().as_secs_f64();
    let steady_moves = moves.borrow().moves() - settle_moves;
    let (per, ratio) = expected(&last, load_of, stream.mean);
    let running = fleet.running().len();
    let busy: Vec<f64> =
        per.keys().map(|w| window.get(w).map_or(0.0, |x| x.busy_s / window_s)).collect();
    let records: u64 = window.values().map(|w| w.records).sum();
    let most_loaded = per
        .iter()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map(|(w, _)| window.get(w).copied().unwrap_or_default())
        .unwrap_or_default();
    let published = store.list_workers().await?.items;
    let published_ratio =
        max_over_mean(published.iter().map(|w| w.load.unwrap_or(0.0)), published.len());

    let mut r = Report::default();
    r.set("seconds_to_full_coverage", seconds(start, covered_at));
    r.set("target_ratio", rounded(target));
    r.set("max_mean_load_ratio", rounded(ratio));
    r.set("settled", settled_at.is_some());
    r.set(
        "seconds_to_settle",
        settled_at.map_or(Value::Null, |at| Value::from(seconds(covered_at, at))),
    );
    let interval = a.timings.balance.as_secs_f64();
    r.set(
        "balance_intervals_to_settle",
        match (settled_at, loads_at) {
            (Some(s), Some(l)) => rounded(s.saturating_duration_since(l).as_secs_f64() / interval),
            (Some(_), None) => Value::from(0),
            _ => Value::Null,
        },
    );
    r.set("moves_while_settling", settle_moves - moves_at_coverage);
    r.set("moves_in_steady_state", steady_moves);
    r.set("steady_state_s", round3(window_s));
    r.set(
        "moves_per_lease_per_hour",
        rounded(steady_moves as f64 / a.shards.max(1) as f64 / (window_s / 3600.0)),
    );
    r.set("records_per_sec", (records as f64 / window_s).round());
    r.set("measured_max_mean_load_ratio", rounded(max_over_mean(busy.iter().copied(), running)));
    r.set("published_max_mean_load_ratio", rounded(published_ratio));
    r.set("worker_loads", Value::Array(per.values().map(|&l| rounded(l)).collect()));
    r.set("most_loaded_worker_max_lag_s", rounded(most_loaded.max_lag_s));
    r.set("most_loaded_worker_mean_lag_s", rounded(most_loaded.mean_lag_s()));
    r.set("max_lag_s", rounded(window.values().map(|w| w.max_lag_s).fold(0.0, f64::max)));
    r.set("records_processed_twice", tally.processed_twice());
    note_health(&mut r, fleet);
    Ok(r)
}
