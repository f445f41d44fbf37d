//! The scenarios, and what every run of one shares: a fresh namespace on the store, the worker
//! configuration built from the flags, the poll period and the deadline of every wait.
//!
//! - [`startup`]: N shards, W workers started together;
//! - [`membership`]: `join`, `leave` (graceful) and `crash` of one worker in a balanced fleet;
//! - [`steady`]: store operations per second per worker of a balanced, idle fleet;
//! - [`throughput`]: records per second through the runtime from a pre-filled stream;
//! - [`skew`]: a skewed stream balanced by count, then by load (not part of `all`: it runs for
//!   minutes).

pub mod membership;
pub mod skew;
pub mod startup;
pub mod steady;
pub mod throughput;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;
use shardlease::store::LeaseStore;
use shardlease::WorkerStats;
use shardlease::{Config, ProcessorFactory, WorkerId};

use crate::args::{Args, Policy};
use crate::error::BenchError;
use crate::fleet::{config_template, Coverage, Fleet, MoveCounter};
use crate::report::{round3, Report};
use crate::streams::BenchStreams;
use crate::wait::{self, Check};

/// A scenario of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// N shards, W workers started together.
    Startup,
    /// One worker joins a balanced fleet.
    Join,
    /// One worker of a balanced fleet shuts down gracefully.
    Leave,
    /// One worker of a balanced fleet crashes.
    Crash,
    /// Store cost of a balanced, idle fleet.
    Steady,
    /// Records per second through the runtime.
    Throughput,
    /// A skewed stream balanced by count, then by load.
    Skew,
}

impl Scenario {
    /// Every scenario, in the order `--scenario all` runs them.
    pub const ALL: [Scenario; 6] = [
        Scenario::Startup,
        Scenario::Join,
        Scenario::Leave,
        Scenario::Crash,
        Scenario::Steady,
        Scenario::Throughput,
    ];

    /// Every scenario `--scenario` can name: [`ALL`](Self::ALL) and the long `skew`.
    pub const NAMED: [Scenario; 7] = [
        Scenario::Startup,
        Scenario::Join,
        Scenario::Leave,
        Scenario::Crash,
        Scenario::Steady,
        Scenario::Throughput,
        Scenario::Skew,
    ];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Startup => "startup",
            Scenario::Join => "join",
            Scenario::Leave => "leave",
            Scenario::Crash => "crash",
            Scenario::Steady => "steady",
            Scenario::Throughput => "throughput",
            Scenario::Skew => "skew",
        }
    }

    /// The scenario with this name.
    pub fn from_name(name: &str) -> Option<Scenario> {
        Scenario::NAMED.into_iter().find(|s| s.name() == name)
    }
}

/// Everything one scenario run needs.
pub struct Run<'a> {
    /// The flags.
    pub args: &'a Args,
    /// The scenario being run.
    pub scenario: Scenario,
    /// The balancer policy of this run.
    pub policy: Policy,
    /// The fresh namespace of this run.
    pub namespace: String,
    /// The store, opened in that namespace.
    pub store: Arc<dyn LeaseStore>,
}

impl Run<'_> {
    /// The report with the fixed keys and the settings filled in.
    pub fn report(&self) -> Report {
        let a = self.args;
        let mut r = Report {
            scenario: self.scenario.name().to_owned(),
            store: shardlease::redact_url(&a.store),
            policy: self.policy.name().to_owned(),
            shards: a.shards,
            workers: a.workers,
            ..Report::default()
        };
        r.set("streams", a.streams);
        r.set("namespace", self.namespace.clone());
        r.set("heartbeat_ms", millis(a.timings.heartbeat));
        r.set("balance_ms", millis(a.timings.balance));
        r.set("failover_ms", millis(a.timings.failover));
        r.set("poll_ms", millis(self.poll()));
        r.set("seed", a.seed.map_or(Value::Null, Value::from));
        r.set("cpu_hogs", a.cpu_hogs);
        r.set("unbatched", a.unbatched);
        r.set("clients", a.clients);
        r.set("heartbeat_thread", if a.dedicated_heartbeat { "dedicated" } else { "shared" });
        r
    }

    /// The worker configuration template.
    pub fn config(&self) -> Result<Config, BenchError> {
        let c = config_template(&self.namespace, &self.args.timings, self.args.seed)?;
        Ok(c.with_dedicated_heartbeat_thread(self.args.dedicated_heartbeat))
    }

    /// `--shards` shards over `--streams` in-memory streams, with the `--batch-limit`.
    pub fn source(&self) -> BenchStreams {
        BenchStreams::new(self.args.shards, self.args.streams, self.args.batch_limit)
    }

    /// A fleet on this run's store reading `streams`, not started.
    pub fn fleet(
        &self,
        streams: &BenchStreams,
        factory: Arc<dyn ProcessorFactory>,
    ) -> Result<Fleet, BenchError> {
        Ok(Fleet::new(self.store.clone(), streams.source()?, factory, self.config()?, self.policy))
    }

    /// How often conditions are polled: `--poll-ms`, or derived from the timings and the size.
    pub fn poll(&self) -> Duration {
        self.args
            .poll
            .unwrap_or_else(|| wait::poll_period(self.args.timings.heartbeat, self.args.shards))
    }

    /// The deadline of every wait: `--timeout-s`, or enough for the timings and, with the
    /// one-per-pass policy, for one pass per lease of a worker's share.
    pub fn timeout(&self) -> Duration {
        if let Some(t) = self.args.timeout {
            return t;
        }
        let t = &self.args.timings;
        let base = Duration::from_secs(10) + t.balance * 40 + t.failover * 4;
        match self.policy {
            Policy::Greedy => base,
            Policy::OnePerPass => {
                let share = self.args.shards.div_ceil(self.args.workers.max(1)) as f64;
                base + t.balance.mul_f64((share + 2.0) * 2.0)
            }
        }
    }

    /// Polls who owns what until `goal` is reached, feeding every observation to `moves`;
    /// returns the coverage that reached it and when.
    pub async fn wait_for(
        &self,
        fleet: &Fleet,
        goal: Goal,
        moves: &RefCell<MoveCounter>,
    ) -> Result<(Coverage, Instant), BenchError> {
        let what = match goal {
            Goal::Covered => "every active lease owned by a running worker",
            Goal::Balanced => "every lease owned and shares within one",
        };
        wait::until(what, self.timeout(), self.poll(), || async {
            let c = fleet.coverage().await?;
            moves.borrow_mut().observe(&c);
            let reached = match goal {
                Goal::Covered => c.is_covered(),
                Goal::Balanced => c.is_covered() && c.is_balanced() && fleet.tasks_match(&c),
            };
            Ok(if reached {
                Check::Done(c)
            } else {
                Check::NotYet(format!(
                    "{} of {} active leases uncovered, shares {:?}, tasks match: {}, first \
                     uncovered: {:?}",
                    c.uncovered,
                    c.active,
                    c.shares.values().collect::<Vec<_>>(),
                    fleet.tasks_match(&c),
                    c.uncovered_leases.iter().take(3).collect::<Vec<_>>()
                ))
            })
        })
        .await
    }
}

/// What [`Run::wait_for`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// Every active lease owned by a running worker.
    Covered,
    /// Covered, shares within one of each other, and every worker running exactly what it owns.
    Balanced,
}

/// Notes on `report` how often the running workers fenced themselves and lost leases to a refused
/// fenced write: both should be zero in a healthy run, and explain odd figures when they are not.
pub fn note_health(report: &mut Report, fleet: &Fleet) {
    let stats = fleet.stats();
    report.set("self_fences", stats.values().map(|s| s.fenced).sum::<u64>());
    report.set("leases_lost", stats.values().map(|s| s.lost).sum::<u64>());
}

/// Milliseconds as a JSON number.
pub fn millis(d: Duration) -> Value {
    Value::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Seconds from `from` to `to`, rounded to the millisecond.
pub fn seconds(from: Instant, to: Instant) -> f64 {
    round3(to.saturating_duration_since(from).as_secs_f64())
}

/// How much `field` grew, summed over workers, between two snapshots of the fleet's counters
/// (a worker absent from `before` counts from zero; one absent from `after` is left out).
pub fn stats_delta(
    before: &BTreeMap<WorkerId, WorkerStats>,
    after: &BTreeMap<WorkerId, WorkerStats>,
    field: fn(&WorkerStats) -> u64,
) -> u64 {
    after.iter().map(|(w, s)| field(s).saturating_sub(before.get(w).map_or(0, field))).sum()
}

/// Runs `scenario` once with `policy` in a fresh namespace of the store.
pub async fn run(
    args: &Args,
    scenario: Scenario,
    policy: Policy,
) -> Result<Report, (Report, BenchError)> {
    let namespace = format!("bench-{}-{:016x}", scenario.name(), rand::rng().random::<u64>());
    let store = match shardlease::connect_namespace(&args.store, &namespace).await {
        Ok(s) => s,
        Err(e) => {
            let run = Run {
                args,
                scenario,
                policy,
                namespace,
                store: Arc::new(shardlease::store::MemoryStore::new()),
            };
            return Err((run.report(), e.into()));
        }
    };
    let mut more = Vec::new();
    for _ in 1..args.clients {
        match shardlease::connect_namespace(&args.store, &namespace).await {
            Ok(s) => more.push(s),
            Err(e) => {
                let run = Run { args, scenario, policy, namespace, store };
                return Err((run.report(), e.into()));
            }
        }
    }
    let store = crate::spread::Spread::wrap(store, more);
    let store = if args.unbatched { crate::unbatched::Unbatched::wrap(store) } else { store };
    let run = Run { args, scenario, policy, namespace, store };
    let result = match scenario {
        Scenario::Startup => startup::run(&run).await,
        Scenario::Join => membership::run(&run, membership::Event::Join).await,
        Scenario::Leave => membership::run(&run, membership::Event::Leave).await,
        Scenario::Crash => membership::run(&run, membership::Event::Crash).await,
        Scenario::Steady => steady::run(&run).await,
        Scenario::Throughput => throughput::run(&run).await,
        Scenario::Skew => skew::run(&run).await,
    };
    result.map_err(|e| (run.report(), e))
}

/// Tears the fleet down whatever happened, then returns the measurement (or its error first).
/// A timeout's message says how often the workers fenced themselves, the usual reason a fleet
/// under CPU pressure never settles.
pub async fn finish(
    fleet: &mut Fleet,
    measured: Result<Report, BenchError>,
) -> Result<Report, BenchError> {
    let measured = measured.map_err(|e| match e {
        BenchError::Timeout { what, after, last } => {
            let stats = fleet.stats();
            let fences: u64 = stats.values().map(|s| s.fenced).sum();
            let lost: u64 = stats.values().map(|s| s.lost).sum();
            let last = format!("{last} (so far the workers fenced themselves {fences} times and lost {lost} leases to refused writes)");
            BenchError::Timeout { what, after, last }
        }
        other => other,
    });
    let torn_down = fleet.teardown().await;
    let mut report = measured?;
    // The figures were measured before the teardown: a shutdown that fails (a fleet of a
    // thousand workers whose store is slow to answer) says so in the line, but keeps them.
    if let Err(e) = torn_down {
        report.set("teardown_error", e.to_string());
    }
    if let Some(kib) = peak_rss_kib() {
        report.set("peak_rss_mib", (kib as f64 / 1024.0).round());
    }
    Ok(report)
}

/// The process's peak resident memory so far, in KiB (`VmHWM` of `/proc/self/status`; `None`
/// where there is no such file).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
