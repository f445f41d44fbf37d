//! Worker configuration: timings, limits and starting position, validated when a worker is built.
//!
//! Every rule here exists because breaking it silently breaks an invariant: a failover timeout
//! shorter than three heartbeats lets a live worker be judged dead by one slow write, and a zero
//! lease limit makes a worker that can never work. Violations are reported as `Error::Config`.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::ids::{validate_name, Namespace, WorkerId};
use crate::position::Position;

/// Configuration of one worker.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The application name; all leases and worker records live under it.
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
    /// How long a claimed lease's owner has to hand it over before the claimant takes it.
    /// Default 3 × `balance_interval`.
    pub claim_timeout: Duration,
    /// How long a graceful shutdown may take before leases are released regardless. Default 10 s.
    pub shutdown_timeout: Duration,
    /// How long a reader waits after an empty read. Default 1 s.
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
}

impl Config {
    /// Defaults for `namespace` with a generated worker id.
    pub fn new(namespace: impl Into<Namespace>) -> Self {
        let balance_interval = Duration::from_secs(5);
        Config {
            namespace: namespace.into(),
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
        }
    }

    /// Scales every timing from one heartbeat interval, keeping the default ratios
    /// (failover 5×, balance 2.5×, claim timeout 7.5×, shard sync 30×). Handy for tests and demos.
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat_interval = heartbeat;
        self.failover_timeout = heartbeat * 5;
        self.balance_interval = heartbeat * 5 / 2;
        self.claim_timeout = heartbeat * 15 / 2;
        self.shard_sync_interval = heartbeat * 30;
        self.idle_poll_interval = heartbeat / 2;
        self.shutdown_timeout = heartbeat * 5;
        self.retry_min_delay = (heartbeat / 20).max(Duration::from_millis(1));
        self.retry_max_delay = heartbeat;
        self
    }

    /// Sets the worker id (builder style).
    pub fn with_worker_id(mut self, id: impl Into<WorkerId>) -> Self {
        self.worker_id = id.into();
        self
    }

    /// Sets the initial position (builder style).
    pub fn with_initial_position(mut self, p: Position) -> Self {
        self.initial_position = p;
        self
    }

    /// Checks every rule; the first violation is returned as `Error::Config`.
    pub fn validate(&self) -> Result<()> {
        validate_name("namespace", self.namespace.as_str())?;
        validate_name("worker id", self.worker_id.as_str())?;
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
        for (name, d) in positive {
            if d.is_zero() {
                return Err(Error::Config(format!("{name} must be greater than zero")));
            }
        }
        if self.failover_timeout < self.heartbeat_interval * 3 {
            return Err(Error::Config(format!(
                "failover_timeout ({:?}) must be at least 3 × heartbeat_interval ({:?}), or one \
                 slow heartbeat would get a live worker judged dead",
                self.failover_timeout, self.heartbeat_interval
            )));
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

    fn err(c: Config) -> String {
        match c.validate() {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert!(Config::new("app").validate().is_ok());
        assert!(Config::new("app").with_heartbeat(Duration::from_millis(50)).validate().is_ok());
    }

    #[test]
    fn violations_are_named() {
        let mut c = Config::new("app");
        c.failover_timeout = c.heartbeat_interval * 2;
        assert!(err(c).contains("failover_timeout"));
        let mut c = Config::new("app");
        c.max_leases_per_worker = Some(0);
        assert!(err(c).contains("max_leases_per_worker"));
        assert!(err(Config::new("")).contains("namespace must not be empty"));
        assert!(err(Config::new("app").with_worker_id("")).contains("worker id"));
        assert!(err(Config::new("a\nb")).contains("control"));
        let mut c = Config::new("app");
        c.heartbeat_interval = Duration::ZERO;
        assert!(err(c).contains("heartbeat_interval"));
        let mut c = Config::new("app");
        c.jitter = 2.0;
        assert!(err(c).contains("jitter"));
        let c = Config::new("app").with_initial_position(Position::ShardEnd);
        assert!(err(c).contains("initial_position"));
        let mut c = Config::new("app");
        c.max_claims_per_pass = Some(0);
        assert!(err(c).contains("max_claims_per_pass"));
    }
}
