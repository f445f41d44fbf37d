//! Command-line flags, parsed by hand (no argument-parsing dependency) into a validated [`Args`].
//!
//! Every mistake is reported as an [`ArgsError`] naming the flag, so `main` can print it and exit
//! with status 2. Timing flags are checked against the runtime's own configuration rules
//! (`Config::validate`), so an invalid combination is refused before any worker starts.

use std::fmt;
use std::time::Duration;

use crate::fleet::{config_template, Timings};
use crate::scenarios::Scenario;

/// The usage text printed by `--help` and after a flag error.
pub const USAGE: &str = "\
usage: shardlease-bench --scenario S --store URL --shards N --workers W [options]

  --scenario S        startup | join | leave | crash | steady | throughput | all
  --store URL         coordination store, e.g. memory:// (passwords are redacted in the output)
  --shards N          shards (leases) in the stream, at least 1
  --workers W         workers started together (leave and crash need at least 2)

options:
  --policy P          greedy (default) | one-per-pass (the Go KCL port's rate) | both
  --seed K            seed for worker shuffles/jitter and the producer (namespaces stay random)
  --heartbeat-ms H    heartbeat interval (default 100)
  --balance-ms B      balance interval (default 250)
  --failover-ms F     failover timeout (default 500; must be at least 3 x heartbeat)
  --duration-s D      steady: measurement window in seconds (default 3)
  --records R         throughput: records pre-filled in the stream (default 200000)
  --rate R            join/leave/crash: records per second written while measuring (default 2000)
  --batch-limit L     records per read batch (default 100)
  --poll-ms P         poll the lease table every P ms while waiting for coverage and balance
                      (default: a tenth of the heartbeat, 2 to 50 ms, less often for big tables)
  --timeout-s T       give up waiting for any condition after T seconds (default: derived from
                      the timings, the policy and the sizes)
  --cpu-hogs K        burn CPU beside the fleet (default 0): K spinning threads, and K tasks on
                      the bench's runtime computing 1.5 heartbeats at a time without yielding
  --heartbeat-thread T  dedicated (default: the runtime's own heartbeat thread) | shared (the
                      heartbeat runs among the lease tasks, as before it had a thread)
  -h, --help          print this help

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
    /// Shards in the stream.
    pub shards: usize,
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
    /// Whether heartbeats run on the runtime's dedicated heartbeat thread.
    pub dedicated_heartbeat: bool,
    /// Overrides how often conditions are polled.
    pub poll: Option<Duration>,
}

/// A command-line mistake (or a request for help).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `-h` / `--help`: print the usage and exit successfully.
    Help,
    /// A bad or missing flag, with a message naming it.
    Invalid(String),
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Help => f.write_str("help requested"),
            ArgsError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ArgsError {}

fn invalid(msg: impl Into<String>) -> ArgsError {
    ArgsError::Invalid(msg.into())
}

/// Raw flag values before validation.
#[derive(Default)]
struct Raw {
    scenario: Option<String>,
    store: Option<String>,
    shards: Option<String>,
    workers: Option<String>,
    policy: Option<String>,
    seed: Option<String>,
    heartbeat_ms: Option<String>,
    balance_ms: Option<String>,
    failover_ms: Option<String>,
    duration_s: Option<String>,
    records: Option<String>,
    rate: Option<String>,
    batch_limit: Option<String>,
    timeout_s: Option<String>,
    cpu_hogs: Option<String>,
    heartbeat_thread: Option<String>,
    poll_ms: Option<String>,
}

impl Raw {
    fn slot(&mut self, flag: &str) -> Option<&mut Option<String>> {
        Some(match flag {
            "--scenario" => &mut self.scenario,
            "--store" => &mut self.store,
            "--shards" => &mut self.shards,
            "--workers" => &mut self.workers,
            "--policy" => &mut self.policy,
            "--seed" => &mut self.seed,
            "--heartbeat-ms" => &mut self.heartbeat_ms,
            "--balance-ms" => &mut self.balance_ms,
            "--failover-ms" => &mut self.failover_ms,
            "--duration-s" => &mut self.duration_s,
            "--records" => &mut self.records,
            "--rate" => &mut self.rate,
            "--batch-limit" => &mut self.batch_limit,
            "--timeout-s" => &mut self.timeout_s,
            "--cpu-hogs" => &mut self.cpu_hogs,
            "--heartbeat-thread" => &mut self.heartbeat_thread,
            "--poll-ms" => &mut self.poll_ms,
            _ => return None,
        })
    }
}

/// Parses the arguments after the program name.
pub fn parse<I, S>(argv: I) -> Result<Args, ArgsError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut raw = Raw::default();
    let mut it = argv.into_iter().map(Into::into);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Err(ArgsError::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let Some(slot) = raw.slot(&flag) else {
            return Err(invalid(if flag.starts_with('-') {
                format!("unknown flag `{flag}`")
            } else {
                format!("unexpected argument `{arg}` (flags take the form --name value)")
            }));
        };
        if slot.is_some() {
            return Err(invalid(format!("`{flag}` given more than once")));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().ok_or_else(|| invalid(format!("`{flag}` needs a value")))?,
        };
        *slot = Some(value);
    }
    validate(raw)
}

fn required(v: Option<String>, flag: &str) -> Result<String, ArgsError> {
    v.ok_or_else(|| invalid(format!("`{flag}` is required")))
}

fn number<T: std::str::FromStr>(v: &str, flag: &str, what: &str) -> Result<T, ArgsError> {
    v.trim().parse().map_err(|_| invalid(format!("`{flag}` must be {what}, got `{v}`")))
}

fn at_least_one(v: Option<String>, flag: &str, default: Option<u64>) -> Result<u64, ArgsError> {
    let n = match (v, default) {
        (Some(v), _) => number::<u64>(&v, flag, "a positive whole number")?,
        (None, Some(d)) => d,
        (None, None) => return Err(invalid(format!("`{flag}` is required"))),
    };
    if n == 0 {
        return Err(invalid(format!("`{flag}` must be at least 1")));
    }
    Ok(n)
}

fn millis(v: Option<String>, flag: &str, default: u64) -> Result<Duration, ArgsError> {
    Ok(Duration::from_millis(at_least_one(v, flag, Some(default))?))
}

fn seconds(v: Option<String>, flag: &str) -> Result<Option<Duration>, ArgsError> {
    let Some(v) = v else { return Ok(None) };
    let s: f64 = number(&v, flag, "a number of seconds")?;
    if !s.is_finite() || s <= 0.0 || s > 1e7 {
        return Err(invalid(format!("`{flag}` must be a positive number of seconds, got `{v}`")));
    }
    Ok(Some(Duration::from_secs_f64(s)))
}

fn to_usize(n: u64, flag: &str) -> Result<usize, ArgsError> {
    usize::try_from(n).map_err(|_| invalid(format!("`{flag}` is too large")))
}

fn validate(raw: Raw) -> Result<Args, ArgsError> {
    let scenario = required(raw.scenario, "--scenario")?;
    let scenarios = if scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        vec![Scenario::from_name(&scenario).ok_or_else(|| {
            invalid(format!(
                "unknown scenario `{scenario}`; expected one of: {}, all",
                Scenario::ALL.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
            ))
        })?]
    };
    let store = required(raw.store, "--store")?;
    if store.trim().is_empty() {
        return Err(invalid("`--store` must not be empty (e.g. memory://)"));
    }
    let shards = to_usize(at_least_one(raw.shards, "--shards", None)?, "--shards")?;
    let workers = to_usize(at_least_one(raw.workers, "--workers", None)?, "--workers")?;
    if workers < 2 && scenarios.iter().any(|s| matches!(s, Scenario::Leave | Scenario::Crash)) {
        return Err(invalid(
            "the leave and crash scenarios need `--workers` of at least 2 (one must remain)",
        ));
    }
    let policies = match raw.policy.as_deref() {
        None | Some("greedy") => vec![Policy::Greedy],
        Some("one-per-pass") => vec![Policy::OnePerPass],
        Some("both") => vec![Policy::Greedy, Policy::OnePerPass],
        Some(other) => {
            return Err(invalid(format!(
                "unknown policy `{other}`; expected greedy, one-per-pass or both"
            )))
        }
    };
    let seed = raw.seed.map(|v| number::<u64>(&v, "--seed", "a whole number")).transpose()?;
    let timings = Timings {
        heartbeat: millis(raw.heartbeat_ms, "--heartbeat-ms", 100)?,
        balance: millis(raw.balance_ms, "--balance-ms", 250)?,
        failover: millis(raw.failover_ms, "--failover-ms", 500)?,
    };
    // The runtime's own rules, checked now so no scenario starts with a configuration it refuses.
    if let Err(e) = config_template("bench-flag-check", &timings, None).validate() {
        let msg = match e {
            shardlease::Error::Config(m) => m,
            other => other.to_string(),
        };
        return Err(invalid(format!(
            "the timing flags are refused by the runtime: {msg} (given --heartbeat-ms {} \
             --balance-ms {} --failover-ms {})",
            timings.heartbeat.as_millis(),
            timings.balance.as_millis(),
            timings.failover.as_millis()
        )));
    }
    let duration = seconds(raw.duration_s, "--duration-s")?.unwrap_or(Duration::from_secs(3));
    let records = at_least_one(raw.records, "--records", Some(200_000))?;
    let rate = at_least_one(raw.rate, "--rate", Some(2_000))?;
    let batch_limit =
        to_usize(at_least_one(raw.batch_limit, "--batch-limit", Some(100))?, "--batch-limit")?;
    let timeout = seconds(raw.timeout_s, "--timeout-s")?;
    let cpu_hogs = match raw.cpu_hogs {
        Some(v) => to_usize(number::<u64>(&v, "--cpu-hogs", "a whole number")?, "--cpu-hogs")?,
        None => 0,
    };
    let dedicated_heartbeat = match raw.heartbeat_thread.as_deref() {
        None | Some("dedicated") => true,
        Some("shared") => false,
        Some(other) => {
            return Err(invalid(format!(
                "--heartbeat-thread must be dedicated or shared, not {other:?}"
            )))
        }
    };
    let poll = match raw.poll_ms {
        Some(v) => Some(millis(Some(v), "--poll-ms", 0)?),
        None => None,
    };
    Ok(Args {
        scenarios,
        store,
        shards,
        workers,
        policies,
        seed,
        timings,
        duration,
        records,
        rate,
        batch_limit,
        timeout,
        cpu_hogs,
        dedicated_heartbeat,
        poll,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, ArgsError> {
        parse(s.split_whitespace())
    }

    fn message(s: &str) -> String {
        match args(s) {
            Err(ArgsError::Invalid(m)) => m,
            other => panic!("expected an error for `{s}`, got {other:?}"),
        }
    }

    const BASE: &str = "--scenario startup --store memory:// --shards 8 --workers 2";

    #[test]
    fn defaults_and_inline_values() {
        let a = args(BASE).unwrap();
        assert_eq!(a.scenarios, vec![Scenario::Startup]);
        assert_eq!((a.shards, a.workers), (8, 2));
        assert_eq!(a.policies, vec![Policy::Greedy]);
        assert_eq!(a.timings.heartbeat, Duration::from_millis(100));
        assert_eq!(a.timings.balance, Duration::from_millis(250));
        assert_eq!(a.timings.failover, Duration::from_millis(500));
        let a = args(&format!("{BASE} --policy=both --seed=7 --duration-s 0.5")).unwrap();
        assert_eq!(a.policies, vec![Policy::Greedy, Policy::OnePerPass]);
        assert_eq!(a.seed, Some(7));
        assert_eq!(a.duration, Duration::from_millis(500));
        let a = args("--scenario all --store memory:// --shards 4 --workers 3").unwrap();
        assert_eq!(a.scenarios, Scenario::ALL.to_vec());
        assert_eq!(a.poll, None, "polling derived from the timings unless given");
        let a = args(&format!("{BASE} --poll-ms 2")).unwrap();
        assert_eq!(a.poll, Some(Duration::from_millis(2)));
        assert!(args(&format!("{BASE} --poll-ms 0")).is_err());
    }

    #[test]
    fn mistakes_are_named() {
        assert!(message("--store memory:// --shards 8 --workers 2").contains("--scenario"));
        assert!(message("--scenario nope --store memory:// --shards 1 --workers 1")
            .contains("unknown scenario `nope`"));
        assert!(message(&format!("{BASE} --bogus 1")).contains("unknown flag `--bogus`"));
        assert!(message(&format!("{BASE} --seed")).contains("`--seed` needs a value"));
        assert!(message(&format!("{BASE} --shards 3")).contains("more than once"));
        assert!(message("--scenario startup --store memory:// --shards x --workers 1")
            .contains("`--shards` must be a positive whole number"));
        assert!(message("--scenario startup --store memory:// --shards 0 --workers 1")
            .contains("at least 1"));
        assert!(message("--scenario crash --store memory:// --shards 4 --workers 1")
            .contains("at least 2"));
        assert!(message(&format!("{BASE} --policy fast")).contains("unknown policy"));
        assert!(message(&format!("{BASE} --duration-s -1")).contains("--duration-s"));
        assert!(matches!(args("--help"), Err(ArgsError::Help)));
    }

    #[test]
    fn timing_rules_of_the_runtime_are_enforced() {
        let m = message(&format!("{BASE} --heartbeat-ms 200 --failover-ms 500"));
        assert!(m.contains("failover_timeout"), "{m}");
        assert!(m.contains("--failover-ms 500"), "{m}");
    }
}
