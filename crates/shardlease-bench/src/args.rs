//! Command-line flags, parsed with `clap` into a validated [`Args`].
//!
//! `clap` reports a malformed or missing flag; the rules that span several flags (the leave and
//! crash scenarios need two workers, the runtime's timing rules) are checked here afterwards and
//! reported through the same [`clap::Error`], so `main` prints every mistake the same way and exits
//! with status 2. Timing flags are checked against the runtime's own configuration rules
//! (`Config::validate`), so an invalid combination is refused before any worker starts.

use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::fleet::{config_template, Timings};
use crate::scenarios::Scenario;

const AFTER_HELP: &str = "\
Prints one JSON object per line per scenario run on stdout. Exit status: 0 when every run
finished, 1 when a run failed (its line has an \"error\" key), 2 for bad flags.";

/// Which balancer the workers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The default greedy balancer: whole share in one pass, then claims.
    Greedy,
    /// At most one new lease and one claim per pass (the Go KCL port's rate).
    OnePerPass,
}

impl Policy {
    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Greedy => "greedy",
            Policy::OnePerPass => "one-per-pass",
        }
    }
}

/// Validated command-line arguments.
#[derive(Clone, Debug)]
pub struct Args {
    /// Scenarios to run, in order.
    pub scenarios: Vec<Scenario>,
    /// The store URL as given (may hold a password; print it only through `redact_url`).
    pub store: String,
    /// Shards in total, over every stream.
    pub shards: usize,
    /// In-memory streams the shards are spread over (1: one plain stream; more: a
    /// `MultiSource`).
    pub streams: usize,
    /// Workers started together.
    pub workers: usize,
    /// Policies to run each scenario with, in order.
    pub policies: Vec<Policy>,
    /// Seed for workers and producer, when given.
    pub seed: Option<u64>,
    /// Heartbeat, balance and failover intervals.
    pub timings: Timings,
    /// Steady-state measurement window.
    pub duration: Duration,
    /// Records pre-filled for the throughput scenario.
    pub records: u64,
    /// Records per second written during join, leave and crash.
    pub rate: u64,
    /// Records per read batch.
    pub batch_limit: usize,
    /// Overrides every wait's deadline.
    pub timeout: Option<Duration>,
    /// Threads burning CPU beside the fleet for the whole run.
    pub cpu_hogs: usize,
    /// Whether the workers' store sends batches as single writes (the store contract's default
    /// bodies), the baseline of the stores' batch writes.
    pub unbatched: bool,
    /// Store connections the workers share (`--clients`), their calls spread over them in turn.
    pub clients: usize,
    /// Whether heartbeats run on the runtime's dedicated heartbeat thread.
    pub dedicated_heartbeat: bool,
    /// Overrides how often conditions are polled.
    pub poll: Option<Duration>,
    /// The skewed stream of the `skew` scenario.
    pub skew: Skew,
}

/// The flags of the `skew` scenario.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Skew {
    /// Zipf exponent of the shards' weights.
    pub exponent: f64,
    /// Largest weight (the hottest shard's rate over the coldest's).
    pub max: u32,
    /// What each record costs its worker.
    pub record_cost: Duration,
    /// Relative noise on each shard's rate, redrawn every four balance intervals.
    pub noise: f64,
    /// Cores each worker pays record costs with (0: no limit, no waiting).
    pub worker_cores: usize,
    /// `LoadBalance::floor` of the by-load run (busy seconds per second).
    pub floor: f64,
}

/// `--policy`: one balancer or both.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PolicyFlag {
    /// The default greedy balancer.
    Greedy,
    /// At most one new lease and one claim per pass (the Go KCL port's rate).
    OnePerPass,
    /// Each scenario once with each balancer.
    Both,
}

/// `--heartbeat-thread`: where heartbeats run.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum HeartbeatThread {
    /// The runtime's own heartbeat thread.
    Dedicated,
    /// Among the lease tasks, as before the runtime had a heartbeat thread.
    Shared,
}

/// Measures shardlease's start-up, failover, balance, store cost and throughput on any store.
#[derive(Parser, Debug)]
#[command(name = "shardlease-bench", after_help = AFTER_HELP, allow_negative_numbers = true)]
struct Flags {
    /// startup | join | leave | crash | steady | throughput | all (those six) | skew
    #[arg(long, value_name = "S", value_parser = scenarios)]
    scenario: ScenarioList,
    /// Coordination store, e.g. memory:// (passwords are redacted in the output).
    #[arg(long, value_name = "URL", value_parser = store_url)]
    store: String,
    /// Shards (leases) in total, at least 1.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    shards: usize,
    /// Spread the shards over K in-memory streams read through one multi-stream source (N/K
    /// each, the remainder to the first ones; lease keys `s0/shardId-…`); 1 to N, not with skew.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = at_least_one)]
    streams: usize,
    /// Workers started together (leave and crash need at least 2).
    #[arg(long, value_name = "W", value_parser = at_least_one)]
    workers: usize,
    /// The balancer: greedy, one-per-pass (the Go KCL port's rate), or both in turn.
    #[arg(long, value_name = "P", value_enum, default_value_t = PolicyFlag::Greedy)]
    policy: PolicyFlag,
    /// Seed for worker shuffles/jitter and the producer (namespaces stay random).
    #[arg(long, value_name = "K")]
    seed: Option<u64>,
    /// Heartbeat interval in milliseconds.
    #[arg(long, value_name = "H", default_value_t = 100, value_parser = at_least_one_u64)]
    heartbeat_ms: u64,
    /// Balance interval in milliseconds.
    #[arg(long, value_name = "B", default_value_t = 250, value_parser = at_least_one_u64)]
    balance_ms: u64,
    /// Failover timeout in milliseconds (at least 3 x heartbeat).
    #[arg(long, value_name = "F", default_value_t = 500, value_parser = at_least_one_u64)]
    failover_ms: u64,
    /// steady: measurement window in seconds.
    #[arg(long, value_name = "D", default_value = "3", value_parser = seconds)]
    duration_s: Duration,
    /// throughput: records pre-filled in the stream.
    #[arg(long, value_name = "R", default_value_t = 200_000, value_parser = at_least_one_u64)]
    records: u64,
    /// join/leave/crash/skew: records per second written while measuring.
    #[arg(long, value_name = "R", default_value_t = 2_000, value_parser = at_least_one_u64)]
    rate: u64,
    /// Records per read batch.
    #[arg(long, value_name = "L", default_value_t = 100, value_parser = at_least_one)]
    batch_limit: usize,
    /// Poll the lease table every P ms while waiting for coverage and balance (default: a tenth
    /// of the heartbeat, 2 to 50 ms, less often for big tables).
    #[arg(long, value_name = "P", value_parser = at_least_one_u64)]
    poll_ms: Option<u64>,
    /// Give up waiting for any condition after T seconds (default: derived from the timings, the
    /// policy and the sizes).
    #[arg(long, value_name = "T", value_parser = seconds)]
    timeout_s: Option<Duration>,
    /// Burn CPU beside the fleet: K spinning threads, and K tasks on the bench's runtime
    /// computing 1.5 heartbeats at a time without yielding.
    #[arg(long, value_name = "K", default_value_t = 0)]
    cpu_hogs: usize,
    /// Send the store's batch writes as single writes (the store contract's default bodies:
    /// updates 16 at a time, creations one after another), to compare against its batches.
    #[arg(long)]
    unbatched: bool,
    /// Open the store K times and spread the workers' calls over the K clients in turn (one
    /// client, shared by every worker, by default). A thousand workers in one process on one
    /// Redis or PostgreSQL connection queue every heartbeat behind every listing, which
    /// separate processes do not.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = at_least_one)]
    clients: usize,
    /// dedicated: the runtime's own heartbeat thread; shared: the heartbeat runs among the lease
    /// tasks, as before it had a thread.
    #[arg(long, value_name = "T", value_enum, default_value_t = HeartbeatThread::Dedicated)]
    heartbeat_thread: HeartbeatThread,
    /// skew: the Zipf exponent each shard's weight is drawn with.
    #[arg(long, value_name = "S", default_value_t = 1.1, value_parser = positive)]
    zipf: f64,
    /// skew: the largest weight, i.e. how many times a cold shard's rate the hottest one gets.
    #[arg(long, value_name = "K", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    zipf_max: u32,
    /// skew: what each record costs its worker's (single, modelled) core, in microseconds; 0
    /// makes a quiet stream.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    record_cost_us: u64,
    /// skew: relative noise on each shard's rate, redrawn every four balance intervals.
    #[arg(long, value_name = "N", default_value_t = 0.2, value_parser = fraction)]
    noise: f64,
    /// skew: cores each worker pays record costs with (its processors wait for one); 0: no limit.
    #[arg(long, value_name = "C", default_value_t = 1)]
    worker_cores: usize,
    /// skew: the floor of the by-load run, busy seconds per second (each lease also costs twice
    /// it); default LoadBalance's.
    #[arg(long, value_name = "F", default_value_t = shardlease::LoadBalance::default().floor, value_parser = positive)]
    load_floor: f64,
}

/// The scenarios `--scenario` names (clap needs one type per flag value).
#[derive(Clone, Debug)]
struct ScenarioList(Vec<Scenario>);

fn scenarios(s: &str) -> Result<ScenarioList, String> {
    if s == "all" {
        return Ok(ScenarioList(Scenario::ALL.to_vec()));
    }
    Scenario::from_name(s).map(|one| ScenarioList(vec![one])).ok_or_else(|| {
        let names: Vec<_> = Scenario::NAMED.iter().map(|s| s.name()).collect();
        format!("unknown scenario `{s}`; expected one of: {}, all", names.join(", "))
    })
}

fn store_url(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty (e.g. memory://)".to_owned());
    }
    Ok(s.to_owned())
}

fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err("must be a positive whole number".to_owned()),
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    usize::try_from(at_least_one_u64(s)?).map_err(|_| "is too large".to_owned())
}

fn positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err("must be a number above 0 (at most 100)".to_owned()),
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err("must be at least 0 and below 1".to_owned()),
    }
}

fn seconds(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e7 => Ok(Duration::from_secs_f64(v)),
        _ => Err("must be a positive number of seconds".to_owned()),
    }
}

/// The usage text `--help` prints.
pub fn usage() -> String {
    Flags::command().render_help().to_string()
}

/// Parses the arguments after the program name. The error prints itself (`clap::Error::exit`
/// prints it and exits 0 for `--help`, 2 for a mistake); it never contains more of the store URL
/// than the flag's value as typed.
pub fn parse<I, S>(argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let mut command = Flags::command();
    let argv = std::iter::once(std::ffi::OsString::from("shardlease-bench"))
        .chain(argv.into_iter().map(Into::into));
    let matches = command.try_get_matches_from_mut(argv)?;
    let flags = Flags::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    validate(flags).map_err(|(kind, msg)| command.error(kind, msg))
}

/// The rules that span several flags.
fn validate(f: Flags) -> Result<Args, (ErrorKind, String)> {
    let scenarios = f.scenario.0;
    if f.workers < 2 && scenarios.iter().any(|s| matches!(s, Scenario::Leave | Scenario::Crash)) {
        return Err((
            ErrorKind::ValueValidation,
            "the leave and crash scenarios need `--workers` of at least 2 (one must remain)".into(),
        ));
    }
    if f.streams > f.shards {
        return Err((
            ErrorKind::ValueValidation,
            format!(
                "`--streams` {} is more than `--shards` {}: every stream needs at least one shard",
                f.streams, f.shards
            ),
        ));
    }
    if f.streams > 1 && scenarios.contains(&Scenario::Skew) {
        return Err((
            ErrorKind::ValueValidation,
            "the skew scenario reads one stream: `--streams` must be 1".into(),
        ));
    }
    let timings = Timings {
        heartbeat: Duration::from_millis(f.heartbeat_ms),
        balance: Duration::from_millis(f.balance_ms),
        failover: Duration::from_millis(f.failover_ms),
    };
    // The runtime's own rules, checked now so no scenario starts with a configuration it refuses.
    if let Err(e) = config_template("bench-flag-check", &timings, None).and_then(|c| c.validate()) {
        let msg = match e {
            shardlease::Error::Config(m) => m,
            other => other.to_string(),
        };
        return Err((
            ErrorKind::ValueValidation,
            format!(
                "the timing flags are refused by the runtime: {msg} (given --heartbeat-ms {} \
                 --balance-ms {} --failover-ms {})",
                f.heartbeat_ms, f.balance_ms, f.failover_ms
            ),
        ));
    }
    let policies = match f.policy {
        PolicyFlag::Greedy => vec![Policy::Greedy],
        PolicyFlag::OnePerPass => vec![Policy::OnePerPass],
        PolicyFlag::Both => vec![Policy::Greedy, Policy::OnePerPass],
    };
    Ok(Args {
        scenarios,
        store: f.store,
        shards: f.shards,
        streams: f.streams,
        workers: f.workers,
        policies,
        seed: f.seed,
        timings,
        duration: f.duration_s,
        records: f.records,
        rate: f.rate,
        batch_limit: f.batch_limit,
        timeout: f.timeout_s,
        cpu_hogs: f.cpu_hogs,
        unbatched: f.unbatched,
        clients: f.clients,
        dedicated_heartbeat: matches!(f.heartbeat_thread, HeartbeatThread::Dedicated),
        poll: f.poll_ms.map(Duration::from_millis),
        skew: Skew {
            exponent: f.zipf,
            max: f.zipf_max,
            record_cost: Duration::from_micros(f.record_cost_us),
            noise: f.noise,
            worker_cores: f.worker_cores,
            floor: f.load_floor,
        },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(s: &str) -> Result<Args, clap::Error> {
        parse(s.split_whitespace())
    }

    fn message(s: &str) -> String {
        match args(s) {
            Err(e) if e.kind() != ErrorKind::DisplayHelp => e.to_string(),
            other => panic!("expected an error for `{s}`, got {other:?}"),
        }
    }

    const BASE: &str = "--scenario startup --store memory:// --shards 8 --workers 2";

    #[test]
    fn defaults_and_inline_values() {
        let a = args(BASE).unwrap();
        assert_eq!(a.scenarios, vec![Scenario::Startup]);
        assert_eq!((a.shards, a.workers), (8, 2));
        assert_eq!(a.streams, 1, "one stream unless asked");
        assert_eq!(a.policies, vec![Policy::Greedy]);
        assert_eq!(a.timings.heartbeat, Duration::from_millis(100));
        assert_eq!(a.timings.balance, Duration::from_millis(250));
        assert_eq!(a.timings.failover, Duration::from_millis(500));
        assert_eq!(a.duration, Duration::from_secs(3));
        assert_eq!((a.records, a.rate, a.batch_limit, a.cpu_hogs), (200_000, 2_000, 100, 0));
        assert!(a.dedicated_heartbeat);
        let a = args(&format!("{BASE} --policy=both --seed=7 --duration-s 0.5")).unwrap();
        assert_eq!(a.policies, vec![Policy::Greedy, Policy::OnePerPass]);
        assert_eq!(a.seed, Some(7));
        assert_eq!(a.duration, Duration::from_millis(500));
        let a = args("--scenario all --store memory:// --shards 4 --workers 3").unwrap();
        assert_eq!(a.scenarios, Scenario::ALL.to_vec());
        assert_eq!(a.poll, None, "polling derived from the timings unless given");
        let a = args(&format!("{BASE} --poll-ms 2 --heartbeat-thread shared")).unwrap();
        assert_eq!(a.poll, Some(Duration::from_millis(2)));
        assert!(!a.dedicated_heartbeat);
        assert!(args(&format!("{BASE} --poll-ms 0")).is_err());
        let a = args("--scenario skew --store memory:// --shards 64 --workers 8").unwrap();
        assert_eq!(a.scenarios, vec![Scenario::Skew]);
        assert_eq!(
            a.skew,
            Skew {
                exponent: 1.1,
                max: 10,
                record_cost: Duration::from_millis(1),
                noise: 0.2,
                worker_cores: 1,
                floor: shardlease::LoadBalance::default().floor,
            }
        );
        let a = args(&format!(
            "{BASE} --zipf 2 --zipf-max 3 --record-cost-us 0 --noise 0 --worker-cores 0"
        ))
        .unwrap();
        let quiet = Skew {
            exponent: 2.0,
            max: 3,
            record_cost: Duration::ZERO,
            noise: 0.0,
            worker_cores: 0,
            floor: shardlease::LoadBalance::default().floor,
        };
        assert_eq!(a.skew, quiet);
        assert!(!Scenario::ALL.contains(&Scenario::Skew), "`all` stays quick");
        assert_eq!(args(&format!("{BASE} --streams 3")).unwrap().streams, 3);
        assert_eq!(args(&format!("{BASE} --streams=8")).unwrap().streams, 8);
    }

    #[test]
    fn mistakes_are_named() {
        assert!(message("--store memory:// --shards 8 --workers 2").contains("--scenario"));
        assert!(message("--scenario nope --store memory:// --shards 1 --workers 1")
            .contains("unknown scenario `nope`"));
        assert!(message(&format!("{BASE} --bogus 1")).contains("--bogus"));
        let m = message(&format!("{BASE} --seed"));
        assert!(m.contains("--seed") && m.contains("value is required"), "{m}");
        assert!(message(&format!("{BASE} --shards 3")).contains("cannot be used multiple times"));
        let m = message("--scenario startup --store memory:// --shards x --workers 1");
        assert!(m.contains("--shards") && m.contains("must be a positive whole number"), "{m}");
        assert!(message("--scenario startup --store memory:// --shards 0 --workers 1")
            .contains("at least 1"));
        assert!(message("--scenario crash --store memory:// --shards 4 --workers 1")
            .contains("at least 2"));
        let m = message(&format!("{BASE} --policy fast"));
        assert!(m.contains("--policy") && m.contains("greedy, one-per-pass, both"), "{m}");
        assert!(message(&format!("{BASE} --duration-s -1")).contains("--duration-s"));
        assert!(message("--scenario startup --store= --shards 1 --workers 1").contains("--store"));
        assert!(message(&format!("{BASE} --noise 1")).contains("below 1"));
        assert!(message(&format!("{BASE} --zipf 0")).contains("above 0"));
        assert!(message(&format!("{BASE} --zipf-max 0")).contains("--zipf-max"));
        let m = message(&format!("{BASE} --streams 0"));
        assert!(m.contains("--streams") && m.contains("at least 1"), "{m}");
        let m = message(&format!("{BASE} --streams 9"));
        assert!(m.contains("`--streams` 9 is more than `--shards` 8"), "{m}");
        assert!(message(&format!("{BASE} --streams two")).contains("--streams"));
        let m = message("--scenario skew --store memory:// --shards 8 --workers 2 --streams 2");
        assert!(m.contains("skew") && m.contains("`--streams` must be 1"), "{m}");
        assert_eq!(args("--help").unwrap_err().kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn timing_rules_of_the_runtime_are_enforced() {
        let m = message(&format!("{BASE} --heartbeat-ms 200 --failover-ms 500"));
        assert!(m.contains("failover_timeout"), "{m}");
        assert!(m.contains("--failover-ms 500"), "{m}");
    }

    #[test]
    fn help_lists_every_flag() {
        let help = usage();
        for flag in [
            "--scenario",
            "--store",
            "--shards",
            "--streams",
            "--workers",
            "--policy",
            "--seed",
            "--heartbeat-ms",
            "--balance-ms",
            "--failover-ms",
            "--duration-s",
            "--records",
            "--rate",
            "--batch-limit",
            "--poll-ms",
            "--timeout-s",
            "--cpu-hogs",
            "--heartbeat-thread",
            "--zipf",
            "--zipf-max",
            "--record-cost-us",
            "--noise",
            "--worker-cores",
        ] {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
    }
}
