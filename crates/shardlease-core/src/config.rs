//! Worker configuration: timings, limits and starting position, validated when a worker is built.
//!
//! Every rule here exists because breaking it silently breaks an invariant: a failover timeout
//! shorter than three heartbeats lets a live worker be judged dead by one slow write, and a zero
//! lease limit makes a worker that can never work. Violations are reported as `Error::Config`.
//!
//! Every option has a `with_*` method, and the order of the calls does not matter: the timings
//! [`Config::with_heartbeat`] derives (failover, balance, claim, shard sync, idle poll, shutdown,
//! retry delays) are derived only where no `with_*` call set them, and the claim timeout follows
//! the balance interval and the shutdown timeout it must outlast unless it was set itself.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::ids::{validate_name, Namespace, WorkerId};
use crate::position::Position;

/// The longest any configured duration may be (30 days): longer is surely a mistake, and every
/// sum of timings stays far from overflowing an `Instant`.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 86_400);

/// Configuration of one worker.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The application name. Leases and worker records live in the namespace the *store* was
    /// opened on (a URL's `?namespace=`, `"default"` otherwise); this must name the same one, and a
    /// worker built with a store that reports another is refused with `Error::Config`.
    pub namespace: Namespace,
    /// This worker's id; unique among live workers. Defaults to `host-pid-random`.
    pub worker_id: WorkerId,
    /// How often the worker writes its heartbeat and lists its peers. Default 2 s.
    pub heartbeat_interval: Duration,
    /// How long a peer's heartbeat may stand still before it is judged dead. Default 10 s;
    /// must be at least 3 × `heartbeat_interval`.
    pub failover_timeout: Duration,
    /// How often the balancer runs. Default 5 s.
    pub balance_interval: Duration,
    /// How often shards are listed to create leases for new ones. Default 60 s.
    pub shard_sync_interval: Duration,
    /// The most leases this worker holds. Default: no limit.
    pub max_leases_per_worker: Option<usize>,
    /// The most claims (handoff requests) per balance pass. Default: no limit.
    pub max_claims_per_pass: Option<usize>,
    /// How long a claimed lease's record must stand still before the claimant takes it by force.
    /// Default 3 × `balance_interval`; must be at least `balance_interval × (1 + jitter)` and
    /// `shutdown_timeout`, each plus a heartbeat (see `validate`).
    pub claim_timeout: Duration,
    /// How long a graceful shutdown may take before leases are released regardless. Default 10 s.
    pub shutdown_timeout: Duration,
    /// How long a reader waits after an empty read. Default 1 s. A shard that stays empty is
    /// polled less often, the wait doubling up to 4 × this (a record resets it), so thousands
    /// of idle leases do not keep the worker's threads busy.
    pub idle_poll_interval: Duration,
    /// Where a lease for a newly discovered shard starts. Default `Latest`.
    pub initial_position: Position,
    /// How many lease takes run at once in a balance pass. Default 16.
    pub take_concurrency: usize,
    /// First and largest delay when retrying a failed store call or processor call.
    pub retry_min_delay: Duration,
    /// Largest retry delay.
    pub retry_max_delay: Duration,
    /// Fraction of each interval added or removed at random (0.0 to 0.5). Default 0.1.
    pub jitter: f64,
    /// Seed for shuffles and jitter; `None` seeds from the OS. Tests set it for replayable runs.
    pub rng_seed: Option<u64>,
    /// Whether the heartbeat and the watchdog run on the process's heartbeat thread (one OS
    /// thread with its own tokio runtime, shared by every worker of the process) when the worker
    /// is started on a multi-threaded runtime. Default `true`: busy lease tasks then cannot delay
    /// a heartbeat into a self-fence. On a current-thread runtime (tests on paused time) they run
    /// on that runtime either way. See docs/algorithm.md, "Self-fencing".
    pub dedicated_heartbeat_thread: bool,
    /// The timings a `with_*` call set: never re-derived by a later call.
    explicit: Explicit,
}

/// Which derived timings the user set (by a `with_*` method). A field assigned directly is not
/// tracked: a later [`Config::with_heartbeat`] derives it again.
#[derive(Clone, Copy, Debug, Default)]
struct Explicit {
    heartbeat: bool,
    failover: bool,
    balance: bool,
    claim: bool,
    shard_sync: bool,
    idle_poll: bool,
    shutdown: bool,
    retry_min: bool,
    retry_max: bool,
}

impl Config {
    /// Defaults for `namespace` (which must be the store's, see [`Config::namespace`]) with a
    /// generated worker id. `Error::Config` when `namespace` breaks the [`Namespace`] rule
    /// (empty, longer than [`Namespace::MAX_BYTES`], control characters).
    pub fn new(namespace: impl AsRef<str>) -> Result<Self> {
        Ok(Config::for_namespace(Namespace::new(namespace.as_ref())?))
    }

    /// Defaults for a namespace already checked.
    fn for_namespace(namespace: Namespace) -> Self {
        let balance_interval = Duration::from_secs(5);
        Config {
            namespace,
            worker_id: WorkerId::generate(),
            heartbeat_interval: Duration::from_secs(2),
            failover_timeout: Duration::from_secs(10),
            balance_interval,
            shard_sync_interval: Duration::from_secs(60),
            max_leases_per_worker: None,
            max_claims_per_pass: None,
            claim_timeout: balance_interval * 3,
            shutdown_timeout: Duration::from_secs(10),
            idle_poll_interval: Duration::from_secs(1),
            initial_position: Position::Latest,
            take_concurrency: 16,
            retry_min_delay: Duration::from_millis(100),
            retry_max_delay: Duration::from_secs(5),
            jitter: 0.1,
            rng_seed: None,
            dedicated_heartbeat_thread: true,
            explicit: Explicit::default(),
        }
    }

    /// Sets what no `with_*` call has set from what has been: the heartbeat's multiples (once a
    /// heartbeat was set) and the claim timeout, which must outlast a noticed claim (three
    /// balance intervals) and a handoff (the shutdown timeout plus two heartbeats).
    /// The arithmetic saturates: absurd inputs give timings that [`validate`](Self::validate)
    /// rejects by name, never a panic.
    fn derive(&mut self) {
        let e = self.explicit;
        if e.heartbeat {
            let h = self.heartbeat_interval;
            let times = |n: u32| h.saturating_mul(n);
            if !e.failover {
                self.failover_timeout = times(5);
            }
            if !e.balance {
                self.balance_interval = times(5) / 2;
            }
            if !e.shard_sync {
                self.shard_sync_interval = times(30);
            }
            if !e.idle_poll {
                self.idle_poll_interval = h / 2;
            }
            if !e.shutdown {
                self.shutdown_timeout = times(5);
            }
            if !e.retry_min {
                self.retry_min_delay = (h / 20).max(Duration::from_millis(1));
            }
            if !e.retry_max {
                self.retry_max_delay = h;
            }
        }
        if !e.claim {
            let handoff =
                self.shutdown_timeout.saturating_add(self.heartbeat_interval.saturating_mul(2));
            self.claim_timeout = self.balance_interval.saturating_mul(3).max(handoff);
        }
    }

    /// Sets the heartbeat interval and scales every timing not set by another `with_*` call from
    /// it, keeping the default ratios (failover 5×, balance 2.5×, claim timeout 7.5×, shard sync
    /// 30×, shutdown 5×, idle poll ½×, retry delays ¹⁄₂₀× to 1×). Handy for tests and demos.
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat_interval = heartbeat;
        self.explicit.heartbeat = true;
        self.derive();
        self
    }

    /// Sets [`failover_timeout`](Self::failover_timeout).
    pub fn with_failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self.explicit.failover = true;
        self.derive();
        self
    }

    /// Sets [`balance_interval`](Self::balance_interval) (the claim timeout follows, unless set).
    pub fn with_balance_interval(mut self, d: Duration) -> Self {
        self.balance_interval = d;
        self.explicit.balance = true;
        self.derive();
        self
    }

    /// Sets [`claim_timeout`](Self::claim_timeout).
    pub fn with_claim_timeout(mut self, d: Duration) -> Self {
        self.claim_timeout = d;
        self.explicit.claim = true;
        self.derive();
        self
    }

    /// Sets [`shard_sync_interval`](Self::shard_sync_interval).
    pub fn with_shard_sync_interval(mut self, d: Duration) -> Self {
        self.shard_sync_interval = d;
        self.explicit.shard_sync = true;
        self.derive();
        self
    }

    /// Sets [`idle_poll_interval`](Self::idle_poll_interval).
    pub fn with_idle_poll_interval(mut self, d: Duration) -> Self {
        self.idle_poll_interval = d;
        self.explicit.idle_poll = true;
        self.derive();
        self
    }

    /// Sets [`shutdown_timeout`](Self::shutdown_timeout) (the claim timeout follows, unless set).
    pub fn with_shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self.explicit.shutdown = true;
        self.derive();
        self
    }

    /// Sets [`retry_min_delay`](Self::retry_min_delay) and
    /// [`retry_max_delay`](Self::retry_max_delay).
    pub fn with_retry_delays(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min_delay = min;
        self.retry_max_delay = max;
        self.explicit.retry_min = true;
        self.explicit.retry_max = true;
        self.derive();
        self
    }

    /// Sets [`max_leases_per_worker`](Self::max_leases_per_worker).
    pub fn with_max_leases_per_worker(mut self, n: usize) -> Self {
        self.max_leases_per_worker = Some(n);
        self
    }

    /// Sets [`max_claims_per_pass`](Self::max_claims_per_pass).
    pub fn with_max_claims_per_pass(mut self, n: usize) -> Self {
        self.max_claims_per_pass = Some(n);
        self
    }

    /// Sets [`take_concurrency`](Self::take_concurrency).
    pub fn with_take_concurrency(mut self, n: usize) -> Self {
        self.take_concurrency = n;
        self
    }

    /// Sets [`jitter`](Self::jitter).
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// Sets [`rng_seed`](Self::rng_seed), for replayable runs.
    pub fn with_rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }

    /// Sets [`dedicated_heartbeat_thread`](Self::dedicated_heartbeat_thread).
    pub fn with_dedicated_heartbeat_thread(mut self, on: bool) -> Self {
        self.dedicated_heartbeat_thread = on;
        self
    }

    /// Sets the worker id.
    pub fn with_worker_id(mut self, id: impl Into<WorkerId>) -> Self {
        self.worker_id = id.into();
        self
    }

    /// Sets the initial position.
    pub fn with_initial_position(mut self, p: Position) -> Self {
        self.initial_position = p;
        self
    }

    /// Checks every rule; the first violation is returned as `Error::Config`.
    pub fn validate(&self) -> Result<()> {
        validate_name("worker id", self.worker_id.as_str())?;
        if self.worker_id.as_str().contains(crate::runtime::INCARNATION_SEPARATOR) {
            return Err(Error::Config(format!(
                "worker id must not contain '{}' (it separates the id from the suffix a worker \
                 takes when it comes back after fencing itself)",
                crate::runtime::INCARNATION_SEPARATOR
            )));
        }
        let positive = [
            ("heartbeat_interval", self.heartbeat_interval),
            ("failover_timeout", self.failover_timeout),
            ("balance_interval", self.balance_interval),
            ("shard_sync_interval", self.shard_sync_interval),
            ("claim_timeout", self.claim_timeout),
            ("shutdown_timeout", self.shutdown_timeout),
            ("idle_poll_interval", self.idle_poll_interval),
            ("retry_min_delay", self.retry_min_delay),
        ];
        for (name, d) in positive.into_iter().chain([("retry_max_delay", self.retry_max_delay)]) {
            if d.is_zero() {
                return Err(Error::Config(format!("{name} must be greater than zero")));
            }
            if d > MAX_DURATION {
                return Err(Error::Config(format!(
                    "{name} must be at most {} days, got {d:?}",
                    MAX_DURATION.as_secs() / 86_400
                )));
            }
        }
        if self.failover_timeout < self.heartbeat_interval * 3 {
            return Err(Error::Config(format!(
                "failover_timeout ({:?}) must be at least 3 × heartbeat_interval ({:?}), or one \
                 slow heartbeat would get a live worker judged dead",
                self.failover_timeout, self.heartbeat_interval
            )));
        }
        // A claimant takes a claimed lease by force once its record stood still for the claim
        // timeout. The owner notices a claim within a (jittered) balance interval and acknowledges
        // it with a write, then has `shutdown_timeout` to finish its batch, let the processor
        // flush and transfer; each of those windows must end a heartbeat before the claimant
        // gives up on it, or a slow but legitimate handoff gets two owners.
        let noticing = self.balance_interval.mul_f64(1.0 + self.jitter.clamp(0.0, 0.5));
        for (what, window) in [
            ("balance_interval × (1 + jitter)", noticing),
            ("shutdown_timeout", self.shutdown_timeout),
        ] {
            if self.claim_timeout < window.saturating_add(self.heartbeat_interval) {
                return Err(Error::Config(format!(
                    "claim_timeout ({:?}) must be at least {what} ({window:?}) + heartbeat_interval \
                     ({:?}): a claimant must not take a lease by force while its owner is still \
                     handing it over",
                    self.claim_timeout, self.heartbeat_interval
                )));
            }
        }
        if self.max_leases_per_worker == Some(0) {
            return Err(Error::Config(
                "max_leases_per_worker must be at least 1 (use None for no limit)".into(),
            ));
        }
        if self.max_claims_per_pass == Some(0) {
            return Err(Error::Config(
                "max_claims_per_pass must be at least 1 (use None for no limit)".into(),
            ));
        }
        if self.take_concurrency == 0 {
            return Err(Error::Config("take_concurrency must be at least 1".into()));
        }
        if self.retry_max_delay < self.retry_min_delay {
            return Err(Error::Config("retry_max_delay must be ≥ retry_min_delay".into()));
        }
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(Error::Config(format!(
                "jitter must be within 0.0..=0.5, got {}",
                self.jitter
            )));
        }
        if matches!(self.initial_position, Position::Sequence { .. } | Position::ShardEnd) {
            return Err(Error::Config(
                "initial_position must be TrimHorizon, Latest or AtTimestamp".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> Config {
        Config::new("app").unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(c: Config) -> String {
        match c.validate() {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert!(app().validate().is_ok());
        assert!(app().with_heartbeat(Duration::from_millis(50)).validate().is_ok());
    }

    #[test]
    fn violations_are_named() {
        let mut c = app();
        c.failover_timeout = c.heartbeat_interval * 2;
        assert!(err(c).contains("failover_timeout"));
        let mut c = app();
        c.max_leases_per_worker = Some(0);
        assert!(err(c).contains("max_leases_per_worker"));
        for (bad, why) in [("", "namespace must not be empty"), ("a\nb", "control")] {
            match Config::new(bad) {
                Err(Error::Config(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("expected a config error, got {other:?}"),
            }
        }
        assert!(err(app().with_worker_id("")).contains("worker id"));
        let mut c = app();
        c.heartbeat_interval = Duration::ZERO;
        assert!(err(c).contains("heartbeat_interval"));
        let mut c = app();
        c.jitter = 2.0;
        assert!(err(c).contains("jitter"));
        let c = app().with_initial_position(Position::ShardEnd);
        assert!(err(c).contains("initial_position"));
        let mut c = app();
        c.max_claims_per_pass = Some(0);
        assert!(err(c).contains("max_claims_per_pass"));
        assert!(err(app().with_worker_id("w#1")).contains("must not contain '#'"));
    }

    #[test]
    fn huge_durations_are_errors_not_panics() {
        let e = err(app().with_heartbeat(Duration::MAX));
        assert!(e.contains("at most 30 days"), "{e}");
        for set in [
            |c: &mut Config| c.heartbeat_interval = Duration::MAX,
            |c: &mut Config| c.shard_sync_interval = Duration::MAX,
            |c: &mut Config| c.idle_poll_interval = Duration::MAX,
            |c: &mut Config| c.retry_max_delay = Duration::MAX,
        ] {
            let mut c = app();
            set(&mut c);
            assert!(err(c).contains("at most 30 days"));
        }
    }

    /// The order of `with_*` calls does not matter, and `with_heartbeat` keeps what was set.
    #[test]
    fn builder_calls_commute_and_keep_what_was_set() {
        let hb = Duration::from_millis(100);
        let failover = Duration::from_secs(5);
        let shutdown = Duration::from_secs(3);
        let a = app()
            .with_worker_id("w")
            .with_failover_timeout(failover)
            .with_shutdown_timeout(shutdown)
            .with_heartbeat(hb);
        let b = app()
            .with_worker_id("w")
            .with_heartbeat(hb)
            .with_shutdown_timeout(shutdown)
            .with_failover_timeout(failover);
        for c in [&a, &b] {
            assert_eq!(c.heartbeat_interval, hb);
            assert_eq!(c.failover_timeout, failover);
            assert_eq!(c.shutdown_timeout, shutdown);
            // Derived from the heartbeat: nobody set them.
            assert_eq!(c.balance_interval, Duration::from_millis(250));
            assert_eq!(c.shard_sync_interval, Duration::from_secs(3));
            // The claim timeout outlasts the longer handoff the shutdown timeout allows.
            assert_eq!(c.claim_timeout, shutdown + hb * 2);
            assert!(c.validate().is_ok(), "{c:?}");
        }
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        // An explicit claim timeout stays put whatever follows.
        let c = app().with_claim_timeout(Duration::from_secs(60)).with_heartbeat(hb);
        assert_eq!(c.claim_timeout, Duration::from_secs(60));
    }

    /// `Config::new` and `with_heartbeat` keep the ratios they always had.
    #[test]
    fn derived_defaults_are_unchanged() {
        let c = app();
        assert_eq!(c.claim_timeout, Duration::from_secs(15));
        assert_eq!(c.retry_max_delay, Duration::from_secs(5));
        let c = app().with_heartbeat(Duration::from_secs(2));
        assert_eq!(c.claim_timeout, Duration::from_secs(15));
        assert_eq!(c.failover_timeout, Duration::from_secs(10));
        assert_eq!(c.balance_interval, Duration::from_secs(5));
        assert_eq!(c.retry_max_delay, Duration::from_secs(2));
    }

    #[test]
    fn a_claim_timeout_shorter_than_a_handoff_is_rejected() {
        let mut c = app();
        c.shutdown_timeout = c.claim_timeout;
        let e = err(c);
        assert!(e.contains("claim_timeout") && e.contains("shutdown_timeout"), "{e}");
        let mut c = app();
        c.balance_interval = c.claim_timeout;
        assert!(err(c).contains("balance_interval"));
    }
}
