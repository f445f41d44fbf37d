//! Hostile values for every `Config` option: whatever a user sets, `validate()` and
//! `Worker::builder(..).build()` answer `Ok` or `Error::Config`, never panic, the order of the
//! `with_*` calls does not matter, and a configuration that validates keeps the timing rules the
//! runtime relies on.
//!
//! The values are a hand-written table per option (edges of each type, the 30-day bound ± 1 ns,
//! `Duration::MAX`, NaN and the infinities, `usize::MAX`); every option is tried alone, every pair
//! of options in both orders, and many whole configurations drawn from the table with a seeded
//! generator, so a failure names a replayable case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, Error, MemorySource, Position, ShardSource, Worker};

/// The longest duration any option may take (30 days), as `Config`'s documentation states.
const MAX_DURATION: Duration = Duration::from_secs(30 * 86_400);
use shardlease_testkit::recorder::Recorder;

/// One `with_*` call with one value.
struct Setter {
    /// The option it sets; two setters of one option are not combined.
    option: &'static str,
    /// The call, for failure messages.
    label: String,
    apply: Box<dyn Fn(Config) -> Config>,
}

fn durations() -> Vec<Duration> {
    let ns = Duration::from_nanos(1);
    vec![
        Duration::ZERO,
        ns,
        Duration::from_millis(1),
        Duration::from_millis(50),
        Duration::from_secs(2),
        MAX_DURATION / 5,
        MAX_DURATION / 3,
        MAX_DURATION - ns,
        MAX_DURATION,
        MAX_DURATION + ns,
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

fn floats() -> Vec<f64> {
    vec![
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN,
        -1.0,
        -0.0,
        0.0,
        f64::from_bits(1), // the smallest subnormal
        f64::MIN_POSITIVE,
        0.1,
        0.5,
        f64::from_bits(0.5f64.to_bits() + 1), // just above the bound
        1.0,
        f64::MAX,
    ]
}

fn counts() -> Vec<usize> {
    vec![0, 1, 2, 16, u32::MAX as usize, (u32::MAX as usize).saturating_add(1), usize::MAX]
}

/// Every option with every hostile value.
fn setters() -> Vec<Setter> {
    let mut all = Vec::new();
    let mut add = |option: &'static str, label: String, apply: Box<dyn Fn(Config) -> Config>| {
        all.push(Setter { option, label, apply });
    };
    type WithDuration = fn(Config, Duration) -> Config;
    let timings: [(&'static str, WithDuration); 7] = [
        ("heartbeat", Config::with_heartbeat),
        ("failover_timeout", Config::with_failover_timeout),
        ("balance_interval", Config::with_balance_interval),
        ("claim_timeout", Config::with_claim_timeout),
        ("shard_sync_interval", Config::with_shard_sync_interval),
        ("idle_poll_interval", Config::with_idle_poll_interval),
        ("shutdown_timeout", Config::with_shutdown_timeout),
    ];
    for (option, with) in timings {
        for d in durations() {
            add(option, format!("{option}({d:?})"), Box::new(move |c| with(c, d)));
        }
    }
    for min in durations() {
        for max in durations() {
            let label = format!("retry_delays({min:?}, {max:?})");
            add("retry_delays", label, Box::new(move |c| c.with_retry_delays(min, max)));
        }
    }
    for n in counts() {
        add(
            "max_leases",
            format!("max_leases({n})"),
            Box::new(move |c| c.with_max_leases_per_worker(n)),
        );
        add(
            "max_claims",
            format!("max_claims({n})"),
            Box::new(move |c| c.with_max_claims_per_pass(n)),
        );
        add(
            "take",
            format!("take_concurrency({n})"),
            Box::new(move |c| c.with_take_concurrency(n)),
        );
    }
    for j in floats() {
        add("jitter", format!("jitter({j:?})"), Box::new(move |c| c.with_jitter(j)));
    }
    for seed in [0, 1, u64::MAX] {
        add("rng_seed", format!("rng_seed({seed})"), Box::new(move |c| c.with_rng_seed(seed)));
    }
    for on in [false, true] {
        let label = format!("dedicated_heartbeat_thread({on})");
        add("dedicated", label, Box::new(move |c| c.with_dedicated_heartbeat_thread(on)));
    }
    let ids = [
        String::new(),
        "w".to_owned(),
        "w#1".to_owned(),
        "a\nb".to_owned(),
        "\u{7f}".to_owned(),
        "x".repeat(200),
        "x".repeat(201),
        "é".repeat(100),
        "é".repeat(101),
    ];
    for id in ids {
        let label = format!("worker_id({id:?})");
        add("worker_id", label, Box::new(move |c| c.with_worker_id(id.as_str())));
    }
    let positions = [
        Position::TrimHorizon,
        Position::Latest,
        Position::AtTimestamp { millis: i64::MIN },
        Position::AtTimestamp { millis: i64::MAX },
        Position::sequence(1u64),
        Position::ShardEnd,
    ];
    for p in positions {
        let label = format!("initial_position({p:?})");
        add("initial_position", label, Box::new(move |c| c.with_initial_position(p.clone())));
    }
    all
}

/// A valid base with a fixed worker id, so two configurations compare by their `Debug`.
fn base() -> Config {
    Config::new("app").unwrap().with_worker_id("w")
}

/// What the test reads of a configuration: every option, through the public surface.
#[derive(Debug)]
struct Seen {
    heartbeat: Duration,
    failover: Duration,
    balance: Duration,
    claim: Duration,
    shard_sync: Duration,
    idle_poll: Duration,
    shutdown: Duration,
    retry_min: Duration,
    retry_max: Duration,
    max_leases: Option<usize>,
    max_claims: Option<usize>,
    take: usize,
    jitter: f64,
    position: Position,
    worker_id: String,
}

fn seen(c: &Config) -> Seen {
    Seen {
        heartbeat: c.heartbeat_interval(),
        failover: c.failover_timeout(),
        balance: c.balance_interval(),
        claim: c.claim_timeout(),
        shard_sync: c.shard_sync_interval(),
        idle_poll: c.idle_poll_interval(),
        shutdown: c.shutdown_timeout(),
        retry_min: c.retry_min_delay(),
        retry_max: c.retry_max_delay(),
        max_leases: c.max_leases_per_worker(),
        max_claims: c.max_claims_per_pass(),
        take: c.take_concurrency(),
        jitter: c.jitter(),
        position: c.initial_position().clone(),
        worker_id: c.worker_id().as_str().to_owned(),
    }
}

/// Validates `c` (no panic, `Ok` or `Error::Config`) and, when it is valid, checks the rules a
/// valid configuration promises. `Ok(true)` when valid.
fn check(c: &Config, case: &str) -> bool {
    let outcome = catch_unwind(AssertUnwindSafe(|| (c.validate(), seen(c), format!("{c:?}"))));
    let (verdict, s, _) = match outcome {
        Ok(v) => v,
        Err(_) => panic!("validate panicked for {case}"),
    };
    match verdict {
        Ok(()) => {}
        Err(Error::Config(_)) => return false,
        Err(e) => panic!("{case}: expected Ok or Error::Config, got {e:?}"),
    }
    let positive = [
        s.heartbeat,
        s.failover,
        s.balance,
        s.claim,
        s.shard_sync,
        s.idle_poll,
        s.shutdown,
        s.retry_min,
        s.retry_max,
    ];
    for d in positive {
        assert!(!d.is_zero() && d <= MAX_DURATION, "{case}: a timing out of range: {s:?}");
    }
    assert!((0.0..=0.5).contains(&s.jitter), "{case}: {s:?}");
    let three_beats = s.heartbeat.checked_mul(3).unwrap();
    assert!(s.failover >= three_beats, "{case}: failover < 3 × heartbeat: {s:?}");
    let noticing = s.balance.mul_f64(1.0 + s.jitter).checked_add(s.heartbeat).unwrap();
    assert!(s.claim >= noticing, "{case}: claim < balance × (1 + jitter) + heartbeat: {s:?}");
    let handoff = s.shutdown.checked_add(s.heartbeat).unwrap();
    assert!(s.claim >= handoff, "{case}: claim < shutdown + heartbeat: {s:?}");
    assert!(s.retry_min <= s.retry_max, "{case}: {s:?}");
    assert!(s.max_leases != Some(0) && s.max_claims != Some(0) && s.take > 0, "{case}: {s:?}");
    assert!(!matches!(s.position, Position::Sequence { .. } | Position::ShardEnd), "{case}");
    assert!(!s.worker_id.is_empty() && !s.worker_id.contains('#'), "{case}");
    true
}

#[test]
fn every_config_option_alone_validates_or_is_a_config_error() {
    let mut valid = 0;
    for s in setters() {
        let c = catch_unwind(AssertUnwindSafe(|| (s.apply)(base())))
            .unwrap_or_else(|_| panic!("{} panicked", s.label));
        valid += usize::from(check(&c, &s.label));
    }
    // The table holds valid values too: the rules above were checked on some.
    assert!(valid > 50, "only {valid} valid");
}

#[test]
fn every_pair_of_config_options_commutes_and_never_panics() {
    let all = setters();
    let mut valid = 0;
    for a in &all {
        for b in all.iter().filter(|b| b.option != a.option) {
            let case = format!("{} then {}", a.label, b.label);
            let (ab, ba) = catch_unwind(AssertUnwindSafe(|| {
                ((b.apply)((a.apply)(base())), (a.apply)((b.apply)(base())))
            }))
            .unwrap_or_else(|_| panic!("{case} panicked"));
            assert_eq!(format!("{ab:?}"), format!("{ba:?}"), "{case}: the order mattered");
            valid += usize::from(check(&ab, &case));
        }
    }
    assert!(valid > 1_000, "only {valid} valid");
}

/// A small deterministic generator (splitmix64), so a failing draw is replayable by its index.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whole configurations: any subset of the options, each with a value from its table, applied in
/// two random orders; the two are alike, and `Worker::builder(..).build()` agrees with
/// `validate()`.
#[test]
fn random_whole_configs_validate_or_are_config_errors_when_built() {
    let all = setters();
    let mut options: Vec<&'static str> = all.iter().map(|s| s.option).collect();
    options.sort_unstable();
    options.dedup();
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("app".parse().unwrap()));
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(1));
    let factory = Recorder::new().factory();
    let valid_alone: Vec<bool> = all.iter().map(|s| (s.apply)(base()).validate().is_ok()).collect();
    let mut state = 7;
    let mut valid = 0;
    for draw in 0..20_000 {
        let mut picked: Vec<&Setter> = Vec::new();
        for option in &options {
            if next(&mut state).is_multiple_of(3) {
                continue;
            }
            // Half the draws take only values that are valid alone, so that many whole
            // configurations are valid and the timing rules get checked on them.
            let tame = draw % 2 == 1;
            let choices: Vec<&Setter> = all
                .iter()
                .zip(&valid_alone)
                .filter(|(s, ok)| s.option == *option && (**ok || !tame))
                .map(|(s, _)| s)
                .collect();
            picked.push(choices[(next(&mut state) % choices.len() as u64) as usize]);
        }
        let mut shuffled = picked.clone();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, (next(&mut state) % (i as u64 + 1)) as usize);
        }
        let labels: Vec<&str> = picked.iter().map(|s| s.label.as_str()).collect();
        let case = format!("draw {draw}: {}", labels.join(", "));
        let (c, d) = catch_unwind(AssertUnwindSafe(|| {
            let c = picked.iter().fold(base(), |c, s| (s.apply)(c));
            let d = shuffled.iter().fold(base(), |c, s| (s.apply)(c));
            (c, d)
        }))
        .unwrap_or_else(|_| panic!("{case} panicked"));
        assert_eq!(format!("{c:?}"), format!("{d:?}"), "{case}: the order mattered");
        let ok = check(&c, &case);
        valid += usize::from(ok);
        let built = catch_unwind(AssertUnwindSafe(|| {
            Worker::builder(c, store.clone(), source.clone(), factory.clone()).build()
        }))
        .unwrap_or_else(|_| panic!("{case}: build panicked"));
        match built {
            Ok(_) => assert!(ok, "{case}: built though validate refused it"),
            Err(Error::Config(m)) => assert!(!ok, "{case}: valid but refused at build: {m}"),
            Err(e) => panic!("{case}: expected Ok or Error::Config, got {e:?}"),
        }
    }
    assert!(valid > 2_000, "only {valid} valid");
}

/// A namespace is checked by `Config::new`: hostile ones are errors, never panics.
#[test]
fn hostile_namespaces_are_config_errors() {
    for ns in ["", "\0", "a\nb", &"x".repeat(201), &"é".repeat(101)] {
        match catch_unwind(|| Config::new(ns)) {
            Ok(Err(Error::Config(_))) => {}
            other => panic!("namespace {ns:?}: expected Error::Config, got {other:?}"),
        }
    }
    let long = "x".repeat(200);
    for ns in ["a", "orders/eu", long.as_str()] {
        let c = Config::new(ns).unwrap();
        assert_eq!(c.namespace().as_str(), ns);
        assert!(c.validate().is_ok());
    }
}
