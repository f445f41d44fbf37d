//! Worker configuration: timings, limits and starting position, validated when a worker is built.
//!
//! Every rule here exists because breaking it silently breaks an invariant: a failover timeout
//! shorter than three heartbeats lets a live worker be judged dead by one slow write, and a zero
//! lease limit makes a worker that can never work. Violations are reported as `Error::Config`.
//!
//! Every option is set by a `with_*` method and read by the method named like it; the fields are
//! private. A `Config` stores what was set and nothing more: a timing nobody set is derived when
//! it is read, from the heartbeat interval (see [`Config::with_heartbeat`]), and a claim timeout
//! nobody set from the balance interval and the shutdown timeout it must outlast. So the order of
//! the `with_*` calls does not matter, and no derived timing can be left behind by a later call.
//! The derivations saturate: absurd inputs give timings [`Config::validate`] rejects by name,
//! never a panic.

use std::time::Duration;

use crate::balance_mode::Balance;
use crate::error::{Error, Result};
use crate::ids::{validate_name, Namespace, WorkerId};
use crate::position::Position;

/// The longest any configured duration may be (30 days): longer is surely a mistake, and every
/// sum of timings stays far from overflowing an `Instant`.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(30 * 86_400);

/// The heartbeat interval when none was set; the other default timings are its multiples.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);

/// The largest retry delay when neither it nor the heartbeat was set.
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(5);

/// Configuration of one worker.
///
/// Set options with the `with_*` methods and read them with the methods named like the options.
/// A timing nobody set is derived when it is read, from the heartbeat interval (see
/// [`Config::with_heartbeat`]), and a claim timeout nobody set from the balance interval and the
/// shutdown timeout it must outlast, so the order of the `with_*` calls does not matter. Every
/// rule [`Config::validate`] checks exists because breaking it silently breaks an invariant (a
/// failover timeout shorter than three heartbeats lets one slow write get a live worker judged
/// dead); any value gives `Ok` or `Error::Config` naming the option, never a panic, and no
/// duration may exceed 30 days.
///
/// The fields are private, so a timing cannot be changed without the timings that follow it:
///
/// ```compile_fail,E0616
/// let mut config = shardlease_core::Config::new("orders")?;
/// config.shutdown_timeout = std::time::Duration::from_secs(20);
/// # Ok::<(), shardlease_core::Error>(())
/// ```
///
/// ```
/// # use std::time::Duration;
/// let config = shardlease_core::Config::new("orders")?
///     .with_shutdown_timeout(Duration::from_secs(20));
/// // The claim timeout outlasts the longer handoff: shutdown + 2 heartbeats.
/// assert_eq!(config.claim_timeout(), Duration::from_secs(24));
/// config.validate()?;
/// # Ok::<(), shardlease_core::Error>(())
/// ```
///
/// Its `Debug` shows every option as its method reads it, derived timings included.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    namespace: Namespace,
    worker_id: WorkerId,
    // The timings a `with_*` call set; `None` is derived when read.
    heartbeat: Option<Duration>,
    failover: Option<Duration>,
    balance: Option<Duration>,
    claim: Option<Duration>,
    shard_sync: Option<Duration>,
    idle_poll: Option<Duration>,
    shutdown: Option<Duration>,
    retry_min: Option<Duration>,
    retry_max: Option<Duration>,
    max_leases_per_worker: Option<usize>,
    max_claims_per_pass: Option<usize>,
    initial_position: Position,
    take_concurrency: usize,
    jitter: f64,
    rng_seed: Option<u64>,
    dedicated_heartbeat_thread: bool,
    balance_mode: Balance,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("namespace", &self.namespace)
            .field("worker_id", &self.worker_id)
            .field("heartbeat_interval", &self.heartbeat_interval())
            .field("failover_timeout", &self.failover_timeout())
            .field("balance_interval", &self.balance_interval())
            .field("shard_sync_interval", &self.shard_sync_interval())
            .field("max_leases_per_worker", &self.max_leases_per_worker)
            .field("max_claims_per_pass", &self.max_claims_per_pass)
            .field("claim_timeout", &self.claim_timeout())
            .field("shutdown_timeout", &self.shutdown_timeout())
            .field("idle_poll_interval", &self.idle_poll_interval())
            .field("initial_position", &self.initial_position)
            .field("take_concurrency", &self.take_concurrency)
            .field("retry_min_delay", &self.retry_min_delay())
            .field("retry_max_delay", &self.retry_max_delay())
            .field("jitter", &self.jitter)
            .field("rng_seed", &self.rng_seed)
            .field("dedicated_heartbeat_thread", &self.dedicated_heartbeat_thread)
            .field("balance", &self.balance_mode)
            .finish()
    }
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
        Config {
            namespace,
            worker_id: WorkerId::generate(),
            heartbeat: None,
            failover: None,
            balance: None,
            claim: None,
            shard_sync: None,
            idle_poll: None,
            shutdown: None,
            retry_min: None,
            retry_max: None,
            max_leases_per_worker: None,
            max_claims_per_pass: None,
            initial_position: Position::Latest,
            take_concurrency: 16,
            jitter: 0.1,
            rng_seed: None,
            dedicated_heartbeat_thread: true,
            balance_mode: Balance::ByCount,
        }
    }

    // ----- Reading the options -----

    /// The application name. Leases and worker records live in the namespace the *store* was
    /// opened on (a URL's `?namespace=`, `"default"` otherwise); this must name the same one, and a
    /// worker built with a store that reports another is refused with `Error::Config`.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// This worker's id; unique among live workers. Defaults to `host-pid-random`.
    pub fn worker_id(&self) -> &WorkerId {
        &self.worker_id
    }

    /// How often the worker writes its heartbeat and lists its peers. Default 2 s.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat.unwrap_or(DEFAULT_HEARTBEAT)
    }

    /// `n` heartbeat intervals, saturating.
    fn beats(&self, n: u32) -> Duration {
        self.heartbeat_interval().saturating_mul(n)
    }

    /// How long a peer's heartbeat may stand still before it is judged dead. Default
    /// 5 × [`heartbeat_interval`](Self::heartbeat_interval) (10 s); must be at least 3 × it.
    pub fn failover_timeout(&self) -> Duration {
        self.failover.unwrap_or_else(|| self.beats(5))
    }

    /// How often the balancer runs. Default 2.5 × [`heartbeat_interval`](Self::heartbeat_interval)
    /// (5 s).
    pub fn balance_interval(&self) -> Duration {
        self.balance.unwrap_or_else(|| self.beats(5) / 2)
    }

    /// How often shards are listed to create leases for new ones. Default 30 ×
    /// [`heartbeat_interval`](Self::heartbeat_interval) (60 s).
    pub fn shard_sync_interval(&self) -> Duration {
        self.shard_sync.unwrap_or_else(|| self.beats(30))
    }

    /// The most leases this worker holds. Default: no limit.
    pub fn max_leases_per_worker(&self) -> Option<usize> {
        self.max_leases_per_worker
    }

    /// The most claims (handoff requests) per balance pass. Default: no limit.
    pub fn max_claims_per_pass(&self) -> Option<usize> {
        self.max_claims_per_pass
    }

    /// What the balancer evens out: lease counts (the default) or measured loads.
    pub fn balance(&self) -> &Balance {
        &self.balance_mode
    }

    /// How long a claimed lease's record must stand still before the claimant takes it by force.
    /// Default: the larger of 3 × [`balance_interval`](Self::balance_interval) (15 s) and
    /// [`shutdown_timeout`](Self::shutdown_timeout) + 2 heartbeats, so it follows both unless it
    /// was set itself. Must be at least `balance_interval × (1 + jitter)` and `shutdown_timeout`,
    /// each plus a heartbeat (see [`validate`](Self::validate)).
    pub fn claim_timeout(&self) -> Duration {
        self.claim.unwrap_or_else(|| {
            let handoff = self.shutdown_timeout().saturating_add(self.beats(2));
            self.balance_interval().saturating_mul(3).max(handoff)
        })
    }

    /// How long a graceful shutdown may take before leases are released regardless. Default 5 ×
    /// [`heartbeat_interval`](Self::heartbeat_interval) (10 s).
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown.unwrap_or_else(|| self.beats(5))
    }

    /// How long a reader waits after an empty read. Default ½ ×
    /// [`heartbeat_interval`](Self::heartbeat_interval) (1 s). A shard that stays empty is polled
    /// less often, the wait doubling up to 4 × this (a record resets it), so thousands of idle
    /// leases do not keep the worker's threads busy.
    pub fn idle_poll_interval(&self) -> Duration {
        self.idle_poll.unwrap_or_else(|| self.heartbeat_interval() / 2)
    }

    /// Where a lease for a newly discovered shard starts. Default `Latest`.
    pub fn initial_position(&self) -> &Position {
        &self.initial_position
    }

    /// How many lease takes go to the store at once in a balance pass. Default 16. The takes are
    /// written in store batches (`LeaseStore::update_leases`) of this many, or of 128 when that
    /// is more, since a batch costs about one round trip whatever its length; a store without a
    /// batch of its own writes a batch's items 16 at a time.
    pub fn take_concurrency(&self) -> usize {
        self.take_concurrency
    }

    /// First delay when retrying a failed store call or processor call. Default ¹⁄₂₀ ×
    /// [`heartbeat_interval`](Self::heartbeat_interval), at least 1 ms (100 ms).
    pub fn retry_min_delay(&self) -> Duration {
        self.retry_min
            .unwrap_or_else(|| (self.heartbeat_interval() / 20).max(Duration::from_millis(1)))
    }

    /// Largest retry delay. Default 5 s, or [`heartbeat_interval`](Self::heartbeat_interval) once a
    /// heartbeat was set.
    pub fn retry_max_delay(&self) -> Duration {
        self.retry_max.unwrap_or(self.heartbeat.unwrap_or(DEFAULT_RETRY_MAX))
    }

    /// Fraction of each interval added or removed at random (0.0 to 0.5). Default 0.1.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Seed for shuffles and jitter; `None` (the default) seeds from the OS. Tests set it for
    /// replayable runs.
    pub fn rng_seed(&self) -> Option<u64> {
        self.rng_seed
    }

    /// Whether the heartbeat and the watchdog run on the process's heartbeat thread (one OS
    /// thread with its own tokio runtime, shared by every worker of the process) when the worker
    /// is started on a multi-threaded runtime. Default `true`: busy lease tasks then cannot delay
    /// a heartbeat into a self-fence. On a current-thread runtime (tests on paused time) they run
    /// on that runtime either way. See docs/algorithm.md, "Self-fencing".
    pub fn dedicated_heartbeat_thread(&self) -> bool {
        self.dedicated_heartbeat_thread
    }

    // ----- Setting the options -----

    /// Sets the heartbeat interval; every timing no other `with_*` call set is derived from it
    /// with the default ratios (failover 5×, balance 2.5×, claim timeout 7.5×, shard sync 30×,
    /// shutdown 5×, idle poll ½×, retry delays ¹⁄₂₀× to 1×). Handy for tests and demos.
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// Sets [`failover_timeout`](Self::failover_timeout).
    pub fn with_failover_timeout(mut self, d: Duration) -> Self {
        self.failover = Some(d);
        self
    }

    /// Sets [`balance_interval`](Self::balance_interval) (the claim timeout follows, unless set).
    pub fn with_balance_interval(mut self, d: Duration) -> Self {
        self.balance = Some(d);
        self
    }

    /// Sets [`claim_timeout`](Self::claim_timeout).
    pub fn with_claim_timeout(mut self, d: Duration) -> Self {
        self.claim = Some(d);
        self
    }

    /// Sets [`shard_sync_interval`](Self::shard_sync_interval).
    pub fn with_shard_sync_interval(mut self, d: Duration) -> Self {
        self.shard_sync = Some(d);
        self
    }

    /// Sets [`idle_poll_interval`](Self::idle_poll_interval).
    pub fn with_idle_poll_interval(mut self, d: Duration) -> Self {
        self.idle_poll = Some(d);
        self
    }

    /// Sets [`shutdown_timeout`](Self::shutdown_timeout) (the claim timeout follows, unless set).
    pub fn with_shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown = Some(d);
        self
    }

    /// Sets [`retry_min_delay`](Self::retry_min_delay) and
    /// [`retry_max_delay`](Self::retry_max_delay).
    pub fn with_retry_delays(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = Some(min);
        self.retry_max = Some(max);
        self
    }

    /// Sets [`max_leases_per_worker`](Self::max_leases_per_worker).
    pub fn with_max_leases_per_worker(mut self, n: usize) -> Self {
        self.max_leases_per_worker = Some(n);
        self
    }

    /// Sets [`balance`](Self::balance). Every worker of a fleet must balance the same way.
    pub fn with_balance(mut self, balance: Balance) -> Self {
        self.balance_mode = balance;
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

    /// Sets [`worker_id`](Self::worker_id).
    pub fn with_worker_id(mut self, id: impl Into<WorkerId>) -> Self {
        self.worker_id = id.into();
        self
    }

    /// Sets [`initial_position`](Self::initial_position).
    pub fn with_initial_position(mut self, p: Position) -> Self {
        self.initial_position = p;
        self
    }

    /// Checks every rule; the first violation is returned as `Error::Config`. Any value of any
    /// option gives `Ok` or `Error::Config`, never a panic.
    pub fn validate(&self) -> Result<()> {
        validate_name("worker id", self.worker_id.as_str())?;
        if self.worker_id.as_str().contains(crate::runtime::INCARNATION_SEPARATOR) {
            return Err(Error::Config(format!(
                "worker id must not contain '{}' (it separates the id from the suffix a worker \
                 takes when it comes back after fencing itself)",
                crate::runtime::INCARNATION_SEPARATOR
            )));
        }
        let heartbeat = self.heartbeat_interval();
        let failover = self.failover_timeout();
        let balance = self.balance_interval();
        let claim = self.claim_timeout();
        let shutdown = self.shutdown_timeout();
        let (retry_min, retry_max) = (self.retry_min_delay(), self.retry_max_delay());
        let positive = [
            ("heartbeat_interval", heartbeat),
            ("failover_timeout", failover),
            ("balance_interval", balance),
            ("shard_sync_interval", self.shard_sync_interval()),
            ("claim_timeout", claim),
            ("shutdown_timeout", shutdown),
            ("idle_poll_interval", self.idle_poll_interval()),
            ("retry_min_delay", retry_min),
            ("retry_max_delay", retry_max),
        ];
        for (name, d) in positive {
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
        // Checked before it scales the balance interval below: NaN or infinity there would panic.
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(Error::Config(format!(
                "jitter must be within 0.0..=0.5, got {}",
                self.jitter
            )));
        }
        if failover < heartbeat.saturating_mul(3) {
            return Err(Error::Config(format!(
                "failover_timeout ({failover:?}) must be at least 3 × heartbeat_interval \
                 ({heartbeat:?}), or one slow heartbeat would get a live worker judged dead",
            )));
        }
        // A claimant takes a claimed lease by force once its record stood still for the claim
        // timeout. The owner notices a claim within a (jittered) balance interval and acknowledges
        // it with a write, then has `shutdown_timeout` to finish its batch, let the processor
        // flush and transfer; each of those windows must end a heartbeat before the claimant
        // gives up on it, or a slow but legitimate handoff gets two owners.
        let noticing = balance.mul_f64(1.0 + self.jitter);
        for (what, window) in
            [("balance_interval × (1 + jitter)", noticing), ("shutdown_timeout", shutdown)]
        {
            if claim < window.saturating_add(heartbeat) {
                return Err(Error::Config(format!(
                    "claim_timeout ({claim:?}) must be at least {what} ({window:?}) + \
                     heartbeat_interval ({heartbeat:?}): a claimant must not take a lease by force \
                     while its owner is still handing it over",
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
        if let Balance::ByLoad(load) = &self.balance_mode {
            load.validate()?;
        }
        if self.take_concurrency == 0 {
            return Err(Error::Config("take_concurrency must be at least 1".into()));
        }
        if retry_max < retry_min {
            return Err(Error::Config("retry_max_delay must be ≥ retry_min_delay".into()));
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
        let c = app();
        let c = c.clone().with_failover_timeout(c.heartbeat_interval() * 2);
        assert!(err(c).contains("failover_timeout"));
        assert!(err(app().with_max_leases_per_worker(0)).contains("max_leases_per_worker"));
        for (bad, why) in [("", "namespace must not be empty"), ("a\nb", "control")] {
            match Config::new(bad) {
                Err(Error::Config(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("expected a config error, got {other:?}"),
            }
        }
        assert!(err(app().with_worker_id("")).contains("worker id"));
        assert!(err(app().with_heartbeat(Duration::ZERO)).contains("heartbeat_interval"));
        assert!(err(app().with_jitter(2.0)).contains("jitter"));
        let c = app().with_initial_position(Position::ShardEnd);
        assert!(err(c).contains("initial_position"));
        assert!(err(app().with_max_claims_per_pass(0)).contains("max_claims_per_pass"));
        assert!(err(app().with_worker_id("w#1")).contains("must not contain '#'"));
        assert!(err(app().with_take_concurrency(0)).contains("take_concurrency"));
        let c = app().with_retry_delays(Duration::from_secs(2), Duration::from_secs(1));
        assert!(err(c).contains("retry_max_delay"));
    }

    /// A jitter that is not a number in range is named, never a panic: it used to scale the
    /// balance interval before it was checked, and `mul_f64(NaN)` panics.
    #[test]
    fn a_jitter_out_of_range_is_an_error_not_a_panic() {
        for j in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.1, 0.6, f64::MAX] {
            let e = err(app().with_jitter(j));
            assert!(e.contains("jitter"), "{j}: {e}");
        }
        assert!(app().with_jitter(0.5).validate().is_ok());
        assert!(app().with_jitter(0.0).validate().is_ok());
    }

    #[test]
    fn huge_durations_are_errors_not_panics() {
        let e = err(app().with_heartbeat(Duration::MAX));
        assert!(e.contains("at most 30 days"), "{e}");
        let max = Duration::MAX;
        for (c, name) in [
            (app().with_heartbeat(max).with_failover_timeout(max), "heartbeat_interval"),
            (app().with_shard_sync_interval(max), "shard_sync_interval"),
            (app().with_idle_poll_interval(max), "idle_poll_interval"),
            (app().with_retry_delays(Duration::from_secs(1), max), "retry_max_delay"),
            (app().with_claim_timeout(MAX_DURATION + Duration::from_nanos(1)), "claim_timeout"),
        ] {
            let e = err(c);
            assert!(e.contains("at most 30 days") && e.contains(name), "{e}");
        }
        // Derived timings saturate instead of overflowing.
        let c = app().with_heartbeat(max);
        assert_eq!((c.failover_timeout(), c.claim_timeout()), (max, max));
        assert_eq!(c.balance_interval(), max / 2);
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
            assert_eq!(c.heartbeat_interval(), hb);
            assert_eq!(c.failover_timeout(), failover);
            assert_eq!(c.shutdown_timeout(), shutdown);
            // Derived from the heartbeat: nobody set them.
            assert_eq!(c.balance_interval(), Duration::from_millis(250));
            assert_eq!(c.shard_sync_interval(), Duration::from_secs(3));
            // The claim timeout outlasts the longer handoff the shutdown timeout allows.
            assert_eq!(c.claim_timeout(), shutdown + hb * 2);
            assert!(c.validate().is_ok(), "{c:?}");
        }
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        // An explicit claim timeout stays put whatever follows.
        let c = app().with_claim_timeout(Duration::from_secs(60)).with_heartbeat(hb);
        assert_eq!(c.claim_timeout(), Duration::from_secs(60));
    }

    /// `Config::new` and `with_heartbeat` keep the ratios they always had.
    #[test]
    fn derived_defaults_are_unchanged() {
        let c = app();
        assert_eq!(c.heartbeat_interval(), Duration::from_secs(2));
        assert_eq!(c.failover_timeout(), Duration::from_secs(10));
        assert_eq!(c.balance_interval(), Duration::from_secs(5));
        assert_eq!(c.shard_sync_interval(), Duration::from_secs(60));
        assert_eq!(c.shutdown_timeout(), Duration::from_secs(10));
        assert_eq!(c.idle_poll_interval(), Duration::from_secs(1));
        assert_eq!(c.claim_timeout(), Duration::from_secs(15));
        assert_eq!(c.retry_min_delay(), Duration::from_millis(100));
        assert_eq!(c.retry_max_delay(), Duration::from_secs(5));
        assert_eq!((c.take_concurrency(), c.jitter()), (16, 0.1));
        assert_eq!((c.max_leases_per_worker(), c.max_claims_per_pass()), (None, None));
        assert_eq!((c.initial_position(), c.rng_seed()), (&Position::Latest, None));
        assert!(c.dedicated_heartbeat_thread());
        let c = app().with_heartbeat(Duration::from_secs(2));
        assert_eq!(c.claim_timeout(), Duration::from_secs(15));
        assert_eq!(c.failover_timeout(), Duration::from_secs(10));
        assert_eq!(c.balance_interval(), Duration::from_secs(5));
        assert_eq!(c.retry_max_delay(), Duration::from_secs(2));
        let c = app().with_heartbeat(Duration::from_millis(10));
        assert_eq!(c.retry_min_delay(), Duration::from_millis(1));
        assert_eq!(c.idle_poll_interval(), Duration::from_millis(5));
    }

    /// A longer shutdown timeout moves the claim timeout along (assigning the field used to leave
    /// the claim timeout behind, and the worker was refused at build).
    #[test]
    fn a_longer_shutdown_timeout_moves_the_claim_timeout() {
        let c = app().with_shutdown_timeout(Duration::from_secs(20));
        assert_eq!(c.claim_timeout(), Duration::from_secs(24));
        assert!(c.validate().is_ok(), "{c:?}");
        let c = app().with_balance_interval(Duration::from_secs(10));
        assert_eq!(c.claim_timeout(), Duration::from_secs(30));
        assert!(c.validate().is_ok(), "{c:?}");
    }

    #[test]
    fn a_claim_timeout_shorter_than_a_handoff_is_rejected() {
        let c = app();
        let c = c
            .clone()
            .with_shutdown_timeout(c.claim_timeout())
            .with_claim_timeout(c.claim_timeout());
        let e = err(c);
        assert!(e.contains("claim_timeout") && e.contains("shutdown_timeout"), "{e}");
        let c = app();
        let c = c
            .clone()
            .with_balance_interval(c.claim_timeout())
            .with_claim_timeout(c.claim_timeout());
        assert!(err(c).contains("balance_interval"));
    }
}
