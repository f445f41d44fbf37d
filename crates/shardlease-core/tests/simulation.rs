//! Deterministic simulation of a fleet under faults.
//!
//! Each seed builds a fresh world on a current-thread tokio runtime with paused time: an in-memory
//! store seen by every worker through an auditing view and a fault injector (errors, lost answers,
//! writes landing up to three heartbeats late, latency up to close to a heartbeat,
//! partitions, corrupt records), an in-memory stream with a
//! producer, and processors that checkpoint every k batches and may flush slowly at handoffs. The
//! seed also draws the start position (`TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP`) and a schedule of
//! crashes, joins, graceful leaves, partitions, splits, merges, nested resharding before any shard
//! sync, restarts under the same worker id, namespace wipes and rollbacks of the store to an
//! earlier copy. Invariants are checked throughout (no checkpoint from a non-owner, no checkpoint
//! moving back, no epoch going down) and at the end (every record processed, no child record
//! before its parents' last record, no two processors of one shard at once, even at the same
//! epoch, every active lease owned with shares within one).
//!
//! A third of the seeds balance by load (`Balance::ByLoad`): their processors pay a cost per record
//! and most records go to a few hot partition keys, a set that drifts (is drawn again) every few
//! tens of seconds, so the loads are skewed and moving; half of them start on a backlog, which the
//! first leases spend their first seconds catching up on. Once the events are over those seeds keep
//! the stream skewed but steady and check that the leases settle: over 30 heartbeats, at most two
//! rounds of moves (changes of owner no more than a balance interval apart) in one direction: no
//! lease moving twice and no worker both giving and receiving (unless the seed also draws stuck
//! processors, whose hangs and catch-ups are real load swings).
//!
//! A fifth of the seeds have processors give their lease up now and then (`Error::ReleaseLease`):
//! the lease is released and resumed from its checkpoint by a new processor.
//!
//! A quarter of the seeds also draw plug-in panics: a store call through a worker's view, the
//! balancer's `plan` and the source's `list_shards` panic now and then, as user code with a bug
//! would. The runtime contains them (a panicking store or source call is a failed call, a
//! panicking `plan` plans nothing for that pass), so every check above holds for those seeds too;
//! the panics stop with the other faults before the final checks.
//!
//! Two checks are relaxed after a store accident (a wipe or a rollback): two owners for a pass
//! and a parent read again after its children started are limits docs/algorithm.md documents
//! ("When the store loses writes"), so such a seed passes with its anomalies printed (the soak
//! counts them); `SHARDLEASE_SIM_STRICT=1` makes them failures. Everything else, and both checks
//! in every seed without an accident, fail the seed.
//!
//! Replay one seed: `SHARDLEASE_SIM_SEED=1234 cargo test -p shardlease-core --test simulation`.
//! Run more seeds: `SHARDLEASE_SIM_SEEDS=500 cargo test ...` (default 200; the first seed is
//! `SHARDLEASE_SIM_FIRST_SEED`, default 1), or `scripts/soak.sh` for 10,000 in release.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardlease_core::store::VersionedLease;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardlease_core::balancer::{Balancer, GreedyBalancer};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    Balance, Config, LeaseKey, LoadBalance, MemorySource, Position, ShardSource, WorkerId,
};
use shardlease_testkit::audit::AuditLog;
use shardlease_testkit::cluster::{audited_faulty_views, wait_until, Cluster};
use shardlease_testkit::faults::INJECTED_PANIC;
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::{Faults, Notifier, PanickyBalancer, PanickySource};

const HEARTBEAT: Duration = Duration::from_secs(1);

/// Heartbeats over which a balanced, drained fleet must stay quiet (fewer than the shard-sync
/// interval of 30 heartbeats, so at most one safety-net listing falls inside).
const QUIET_BEATS: u32 = 20;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn simulated_fleets_keep_every_invariant() {
    let seeds: Vec<u64> = match env_u64("SHARDLEASE_SIM_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env_u64("SHARDLEASE_SIM_FIRST_SEED").unwrap_or(1);
            let n = env_u64("SHARDLEASE_SIM_SEEDS").unwrap_or(200);
            (first..first + n).collect()
        }
    };
    run_seeds(&seeds);
}

/// Seeds the soak once failed, each for a defect fixed since (replay is deterministic, so they
/// keep drawing the same histories): 649 and 2433 (a lease nobody remembered recreated at
/// `LATEST`), 3215 (a lost parent not recreated because its children had leases), 3460 (peers
/// waiting for an owner restarted under the same id), 452 (a claim left on a finished lease kept
/// the fleet listing), 17414 (an owner whose claim deadline fell between passes still processing
/// when the claimant took the lease), 14453, 2800 and 11369 (a lost parent left missing while its
/// restore waited for its owner, so a worker that never saw it started its merge child, after
/// which the parent looked collected), 14432 (a newcomer after a wipe of leases and worker
/// records took the namespace for a new application and pinned the lost leases at `LATEST`),
/// 15795 (the quiet-fleet window opened before a dead peer's record was removed), 3669 (a
/// process that had seen the leases created them at `LATEST` after a wipe), 14424 (a lost lease
/// created under an owner whose memory was out of date was never restored), 28549, 29025 and
/// 36781 (no store accident: a worker back from a partition took a lease from an owner it had
/// judged dead before the partition, which had come back meanwhile), 27842 and 36934 (a lease a
/// rollback brought back unfinished after it had ended was left to its owner for a grace, and a
/// wipe within it caught it unfinished), 38158 (no defect of the fleet: a lease restored after a
/// wipe ran to its end and was collected with its children, and the repair check only counted a
/// lease collected while one of its own children was listed past its start), 6916 (a worker
/// re-took a lease whose checkpoint a rollback had moved back, kept the later checkpoint in its
/// memory, and restored it under its own running task, whose next checkpoints were then refused
/// as moves backwards: the lease stopped for good), 5613 (no defect of the fleet: after a
/// rollback the periodic shard sync created a collected lease again, which a worker restored
/// finished, within the quiet window; that window now starts one shard-sync interval after an
/// accident), 4795 (balancing by load: a steady fleet sat with a pair just short of a move's
/// line, and noise crossed it twice; a settled fleet now starts moving only for a clear gain),
/// 2194 (no defect of the fleet: one plan's two moves, counted as two by a check that now counts
/// rounds of moves), 6575 (no defect of the fleet: the rest of one plan landed a settling time
/// after its first move, both from the same giver to the same receiver).
#[test]
fn seeds_that_once_failed_pass() {
    run_seeds(&[
        649, 2433, 3215, 3460, 452, 17414, 14453, 2800, 11369, 14432, 15795, 3669, 14424, 28549,
        29025, 36781, 27842, 36934, 38158, 1499, 6916, 5613, 4795, 2194, 6575,
    ]);
}

/// Keeps the panics the simulation injects from printing (thousands of backtrace lines a soak):
/// a panic whose message begins with [`INJECTED_PANIC`] is not printed, every other one is, by
/// the hook installed before. Installed once per process (both tests share it).
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            if message.is_some_and(|m| m.starts_with(INJECTED_PANIC)) {
                return;
            }
            previous(info);
        }));
    });
}

fn run_seeds(seeds: &[u64]) {
    quiet_injected_panics();
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let mut failures = Vec::new();
    for seed in seeds.iter().copied() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = rt.block_on(simulate(seed));
        match outcome {
            Ok(summary) => println!("seed {seed}: ok ({summary})"),
            Err(e) => {
                println!("seed {seed}: FAILED: {e}");
                failures.push(format!(
                    "seed {seed}: {e}\n  replay: SHARDLEASE_SIM_SEED={seed} cargo test -p shardlease-core --test simulation -- --nocapture"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}

#[derive(Debug)]
enum Event {
    Crash,
    Join,
    Leave,
    Partition(Duration),
    Split,
    Merge,
    /// A crashed process comes back under the same worker id (a StatefulSet pod).
    Restart,
    /// The store loses every record (a Redis restarted without persistence).
    Wipe,
    /// The store goes back to an earlier copy (a failover to a lagging replica).
    Rollback,
    /// A lease record cannot be decoded for a while.
    Corrupt(Duration),
    /// A shard splits and one child splits or merges again before any shard sync ran, while
    /// the parent's lease lags behind.
    NestedResharding,
    /// A crash that takes the crashed worker's watchers with it (its predecessors in the ring of
    /// worker ids): nobody left times it until the ring is listed again.
    CrashWithWatchers(usize),
    /// The fleet signal alone goes back to a token read earlier (a lagging replica of that one
    /// record).
    SignalBack,
}

/// What a seed draws besides its events.
#[derive(Debug)]
struct Draw {
    start: Position,
    checkpoint_every: u32,
    shutdown_delay: Duration,
    latency_max: Duration,
    error_rate: f64,
    /// Writes that land late (timed out for the caller, applied later, after the caller's next
    /// writes): their probability and longest delay. Drawn from an RNG of their own, so every
    /// other draw of a seed is what it was before they existed.
    late_writes: (f64, Duration),
    /// Processors stuck at the start of a batch: every n-th instance, for how long (long enough,
    /// often, for a handoff's or a shutdown's deadline to pass while it hangs). Drawn from an RNG
    /// of its own, like the late writes.
    stuck_batches: Option<(u64, Duration)>,
    /// Balancing by load with a skewed, drifting stream, for a third of the seeds. Drawn from an
    /// RNG of its own, like the late writes.
    load: Option<LoadDraw>,
    /// Change notification (a store that pushes, like PostgreSQL or Redis), for half the seeds:
    /// the share of notices lost (pub/sub is at most once). Subscriptions also drop at a wipe,
    /// a rollback and a partition, as a server restart or a lost connection ends them. Drawn
    /// from an RNG of its own, like the late writes.
    notifications: Option<f64>,
    /// Plug-in panics, for a quarter of the seeds. Drawn from an RNG of its own, like the late
    /// writes.
    panics: Option<PanicDraw>,
    /// Processors that give their lease up (`Error::ReleaseLease`, as the MultiLang daemon does
    /// when its child dies), for a fifth of the seeds: how many, one armed before each event.
    /// Drawn from an RNG of its own, like the late writes.
    give_ups: bool,
}

/// The probabilities of the plug-in panics of a seed that draws them.
#[derive(Debug)]
struct PanicDraw {
    /// Of a store call through a worker's view (`Faults::set_panic_rate`).
    store: f64,
    /// Of a balance pass's `Balancer::plan`.
    balancer: f64,
    /// Of a `ShardSource::list_shards` (shard syncs, the recovery of lost leases).
    source: f64,
}

fn draw(rng: &mut StdRng) -> Draw {
    let start = match rng.random_range(0..3) {
        0 => Position::TrimHorizon,
        1 => Position::Latest,
        _ => Position::AtTimestamp { millis: shardlease_core::store::now_millis() as i64 - 1_000 },
    };
    Draw {
        start,
        checkpoint_every: if rng.random_bool(0.5) { 1 } else { rng.random_range(2..6) },
        // Up to 80% of the shutdown timeout (5 heartbeats), spent flushing at every handoff.
        shutdown_delay: if rng.random_bool(0.3) {
            Duration::from_millis(rng.random_range(100..4_000))
        } else {
            Duration::ZERO
        },
        // Mostly a fast store; sometimes one whose calls take close to a heartbeat (the
        // heartbeat's own timeout), which keeps workers near the self-fence margin.
        latency_max: if rng.random_bool(0.15) {
            Duration::from_millis(rng.random_range(400..950))
        } else {
            Duration::from_millis(rng.random_range(2..60))
        },
        error_rate: rng.random_range(0.0..0.2),
        late_writes: (0.0, Duration::ZERO),
        stuck_batches: None,
        load: None,
        notifications: None,
        panics: None,
        give_ups: false,
    }
}

/// A skewed, drifting stream for a seed that balances by load.
#[derive(Debug)]
struct LoadDraw {
    /// What each record costs its processor (slept, so measured as busy time).
    record_cost: Duration,
    /// Records written every 100 ms, on average (instead of 2.5): enough that a load is
    /// measured, not guessed from a handful of records.
    records_per_tick: u32,
    /// How many hot partition keys there are at a time.
    hot_keys: u32,
    /// The share of the records that go to a hot key.
    hot_share: f64,
    /// How often the hot keys are drawn again (never: the skew does not drift).
    drift: Option<Duration>,
    /// The cores each worker's load is counted on (`LoadBalance::cores`): the processors sleep,
    /// so they never wait for one another, and 1 or 2 cores count their overlaps as shared.
    cores: usize,
    /// Records waiting, with the same skew, before the first workers start (a fleet starting on
    /// a backlog, unless it starts at LATEST): its leases spend their first seconds catching up,
    /// which is no measure of their load.
    backlog: u32,
}

/// Balancing by load for a third of the seeds: 100 to 300 records a second at 2 to 6 ms each
/// (a fifth of a core to nearly two), 1 to 4 hot keys taking half to 90% of the records, drifting
/// every 10 to 60 s in two seeds of three.
fn draw_load(seed: u64) -> Option<LoadDraw> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x10ad_ba1a);
    rng.random_bool(1.0 / 3.0).then(|| LoadDraw {
        record_cost: Duration::from_micros(rng.random_range(2_000..=6_000)),
        records_per_tick: rng.random_range(10..=30),
        hot_keys: rng.random_range(1..=4),
        hot_share: rng.random_range(0.5..0.9),
        drift: rng.random_bool(2.0 / 3.0).then(|| Duration::from_secs(rng.random_range(10..=60))),
        cores: StdRng::seed_from_u64(seed ^ 0xc0de5).random_range(1..=4),
        backlog: {
            let mut b = StdRng::seed_from_u64(seed ^ 0xbac_100c);
            if b.random_bool(0.5) {
                b.random_range(50..=2_000)
            } else {
                0
            }
        },
    })
}

/// Change notification for half the seeds, losing up to 30% of the notices.
fn draw_notifications(seed: u64) -> Option<f64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0071_f1ca_7105);
    rng.random_bool(0.5)
        .then(|| if rng.random_bool(0.5) { 0.0 } else { rng.random_range(0.0..0.3) })
}

/// Stuck processors for half the seeds: every 2nd to 6th processor instance hangs 1 to 9
/// heartbeats at the start of its first batch (the shutdown timeout, a handoff's deadline, is 5).
fn draw_stuck_batches(seed: u64) -> Option<(u64, Duration)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x57c4_b47c);
    rng.random_bool(0.5).then(|| (rng.random_range(2..=6), HEARTBEAT * rng.random_range(1..=9)))
}

/// Plug-in panics for a quarter of the seeds: up to 2% of the store calls, 20% of the balance
/// passes' plans and 30% of the shard listings panic.
fn draw_panics(seed: u64) -> Option<PanicDraw> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9a41_c50f_91a6);
    rng.random_bool(0.25).then(|| PanicDraw {
        store: rng.random_range(0.0..0.02),
        balancer: rng.random_range(0.0..0.2),
        source: rng.random_range(0.0..0.3),
    })
}

/// A big fleet for an eighth of the seeds that balance by count: 16 to 160 workers from the
/// start, so most heartbeats read only the fleet signal and two watched peers, and a worker is
/// timed by its watchers alone (docs/algorithm.md, "A fleet too large to list each heartbeat").
/// Drawn from an RNG of its own, like the late writes.
fn draw_big_fleet(seed: u64) -> Option<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb16_f1ee7);
    rng.random_bool(0.125).then(|| rng.random_range(16..=160))
}

/// Late writes for a third of the seeds: up to 1 in 10 writes, landing up to 3 heartbeats late.
fn draw_late_writes(seed: u64) -> (f64, Duration) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1a7e_0f1a_7e00);
    if rng.random_bool(1.0 / 3.0) {
        (rng.random_range(0.01..0.1), HEARTBEAT * rng.random_range(1..=3))
    } else {
        (0.0, Duration::ZERO)
    }
}

async fn simulate(seed: u64) -> Result<String, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut d = draw(&mut rng);
    d.late_writes = draw_late_writes(seed);
    d.stuck_batches = draw_stuck_batches(seed);
    d.notifications = draw_notifications(seed);
    d.load = draw_load(seed);
    d.panics = draw_panics(seed);
    d.give_ups = StdRng::seed_from_u64(seed ^ 0x6e7e_a11e).random_bool(0.2);
    let mem = MemoryBackend::new().store("sim".parse().unwrap());
    let notifier = Notifier::new(seed);
    let base: Arc<dyn LeaseStore> = match d.notifications {
        Some(loss) => {
            notifier.set_loss(loss);
            Arc::new(notifier.wrap(Arc::new(mem.clone())))
        }
        None => Arc::new(mem.clone()),
    };
    let faults = Faults::new(seed);
    faults.set_error_rate(d.error_rate);
    faults.set_latency(Duration::from_millis(1), d.latency_max);
    faults.set_late_writes(d.late_writes.0, d.late_writes.1);
    let audit = AuditLog::new();
    let store_for = audited_faulty_views(base.clone(), faults.clone(), audit.clone());
    let shards = rng.random_range(2..12);
    let source = MemorySource::new(shards).with_batch_limit(rng.random_range(1..20));
    let mut rec = Recorder::new()
        .with_checkpoint_every(d.checkpoint_every)
        .with_shutdown_delay(d.shutdown_delay);
    if let Some((every, hang)) = d.stuck_batches {
        rec = rec.with_stuck_batches(every, hang);
    }
    if let Some(load) = &d.load {
        rec = rec.with_record_cost(load.record_cost);
    }
    let cfg = Config::new("sim")
        .unwrap()
        .with_heartbeat(HEARTBEAT)
        .with_initial_position(d.start.clone())
        .with_rng_seed(seed)
        .with_idle_poll_interval(Duration::from_millis(200));
    let cfg = match &d.load {
        Some(l) => cfg.with_balance(Balance::ByLoad(LoadBalance::default().with_cores(l.cores))),
        None => cfg,
    };
    let shard_sync = cfg.shard_sync_interval();
    let balance_interval = cfg.balance_interval();
    // The balancer every seed uses (by count or by load, as the configuration says) and the
    // source, each behind a wrapper that panics at the seed's rate once the workers run (never,
    // without plug-in panics: no draw is then made).
    let panicky_balancer =
        Arc::new(PanickyBalancer::new(Arc::new(GreedyBalancer::default()), seed ^ 0xba1a, 0.0));
    let panicky_source = Arc::new(PanickySource::new(Arc::new(source.clone()), seed ^ 0x50c, 0.0));
    let src: Arc<dyn ShardSource> = panicky_source.clone();
    let balancer: Arc<dyn Balancer> = panicky_balancer.clone();
    let mut cluster =
        Cluster::with_store_per_worker(base.clone(), store_for, src, rec.factory(), cfg)
            .with_balancer(balancer);
    // Plug-in panics stop with the other faults.
    let clear_faults = || {
        faults.clear();
        rec.give_up_next(0);
        panicky_balancer.clear();
        panicky_source.clear();
    };

    // The initial shard sync goes through the fault-free view and source; the workers' own syncs
    // face faults.
    cluster.sync_shards().await.map_err(|e| e.to_string())?;
    if let Some(p) = &d.panics {
        faults.set_panic_rate(p.store);
        panicky_balancer.set_rate(p.balancer);
        panicky_source.set_rate(p.source);
    }

    if let Some(l) = d.load.as_ref().filter(|l| l.backlog > 0 && d.start != Position::Latest) {
        let mut brng = StdRng::seed_from_u64(seed ^ 0xbac_10c5);
        for i in 0..l.backlog {
            let key = if brng.random_bool(l.hot_share) {
                format!("hot-1-{}", brng.random_range(0..l.hot_keys))
            } else {
                format!("pk-{}", brng.random_range(0..10_000))
            };
            source.put(&key, format!("b{i}"));
        }
    }
    let first_workers = rng.random_range(1..=4);
    let big = draw_big_fleet(seed).filter(|_| d.load.is_none());
    let first_workers = big.unwrap_or(first_workers);
    // What only the new events draw, from an RNG of their own so every other draw of a seed is
    // what it was before they existed: crashes that take the watchers too, and the signal
    // going back.
    let mut watch_rng = StdRng::seed_from_u64(seed ^ 0x3a7c_4e55);
    let mut old_signal = None;
    cluster.start_workers(first_workers).map_err(|e| e.to_string())?;
    if d.start == Position::Latest {
        // Records written before a LATEST lease is first opened are skipped by definition; the
        // promise is about every record after that. Produce once every lease is pinned.
        let observer = base.clone();
        wait_until("every LATEST lease pinned", Duration::from_secs(300), HEARTBEAT, || async {
            observer
                .list_leases()
                .await
                .is_ok_and(|l| l.items.iter().all(|v| v.lease.checkpoint != Position::Latest))
        })
        .await
        .map_err(|e| format!("{e}; {d:?}"))?;
    }

    let producing = tokio_util::sync::CancellationToken::new();
    // Set when the skew of a load seed stops drifting (the settling check).
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let source = source.clone();
        let stop = producing.clone();
        let frozen = frozen.clone();
        let mut prng = StdRng::seed_from_u64(seed ^ 0x5eed);
        let skew = d.load.as_ref().map(|l| (l.hot_keys, l.hot_share, l.drift));
        let per_tick = d.load.as_ref().map_or(1..5, |l| l.records_per_tick..l.records_per_tick * 2);
        tokio::spawn(async move {
            let mut i = 0u64;
            // Which draw of hot keys is current, and when the next one is due.
            let (mut generation, mut next_drift) = (0u64, tokio::time::Instant::now());
            while !stop.is_cancelled() {
                if let Some((_, _, Some(every))) = skew {
                    let now = tokio::time::Instant::now();
                    if now >= next_drift && !frozen.load(std::sync::atomic::Ordering::Relaxed) {
                        generation += 1;
                        next_drift = now + every;
                    }
                }
                for _ in 0..prng.random_range(per_tick.clone()) {
                    i += 1;
                    let key = match skew {
                        Some((hot, share, _)) if prng.random_bool(share) => {
                            format!("hot-{generation}-{}", prng.random_range(0..hot))
                        }
                        _ => format!("pk-{}", prng.random_range(0..10_000)),
                    };
                    source.put(&key, format!("r{i}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let mut events = Vec::new();
    let mut copy = None;
    let steps = rng.random_range(4..12);
    // Workers whose process died (crashed, or restarted under the same id): their processors
    // are dropped without a word, as a real process's would be.
    let mut dropped_abruptly: std::collections::BTreeSet<String> = Default::default();
    for _ in 0..steps {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..8_000))).await;
        if rng.random_bool(0.3) {
            copy = Some(mem.snapshot());
        }
        if d.give_ups {
            // The next batch with records, on whichever lease, gives its lease up.
            rec.give_up_next(1);
        }
        let running = cluster.running();
        if watch_rng.random_bool(0.2) {
            let signal = base.read_fleet_signal().await.map_err(|e| e.to_string())?;
            match old_signal.replace(signal) {
                Some(older @ shardlease_core::store::FleetSignal::Token(token))
                    if watch_rng.random_bool(0.5) =>
                {
                    base.write_fleet_signal(token).await.map_err(|e| e.to_string())?;
                    old_signal = Some(older);
                    events.push(Event::SignalBack);
                }
                _ => {}
            }
        }
        let event = match rng.random_range(0..12) {
            0 if running.len() > 3 && watch_rng.random_bool(0.5) => {
                Event::CrashWithWatchers(watch_rng.random_range(1..=2))
            }
            0 if running.len() > 1 => Event::Crash,
            1 if running.len() < big.map_or(6, |n| n + 2) => Event::Join,
            2 if running.len() > 1 => Event::Leave,
            3 => Event::Partition(Duration::from_millis(rng.random_range(500..15_000))),
            4 => Event::Split,
            5 => Event::Merge,
            6 if !running.is_empty() => Event::Restart,
            7 if rng.random_bool(0.5) => Event::Wipe,
            8 if copy.is_some() => Event::Rollback,
            9 => Event::Corrupt(Duration::from_millis(rng.random_range(500..10_000))),
            10 => Event::NestedResharding,
            _ => Event::Join,
        };
        match &event {
            Event::Crash => {
                let w = &running[rng.random_range(0..running.len())];
                dropped_abruptly.insert(w.to_string());
                cluster.crash(w);
            }
            Event::CrashWithWatchers(watchers) => {
                let mut ring = running.clone();
                ring.sort();
                let i = rng.random_range(0..ring.len());
                for k in 0..=*watchers {
                    let w = &ring[(i + ring.len() - k) % ring.len()];
                    dropped_abruptly.insert(w.to_string());
                    cluster.crash(w);
                }
            }
            Event::SignalBack => {}
            Event::Join => {
                cluster.start_worker().map_err(|e| e.to_string())?;
            }
            Event::Leave => {
                let w = running[rng.random_range(0..running.len())].clone();
                cluster.shutdown(&w).await.ok();
            }
            Event::Partition(d) => {
                if let Some(w) = running.get(rng.random_range(0..running.len().max(1))) {
                    let (faults, w, d) = (faults.clone(), w.clone(), *d);
                    faults.partition(&w);
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        faults.heal(&w);
                    });
                }
            }
            Event::Split => {
                let open = source.open_shards();
                if open.len() < 16 {
                    let s = &open[rng.random_range(0..open.len())];
                    source.split(&s.id).map_err(|e| e.to_string())?;
                }
            }
            Event::Merge => {
                if let Some((a, b)) = adjacent_pair(&source, &mut rng) {
                    source.merge(&a, &b).map_err(|e| e.to_string())?;
                }
            }
            Event::Restart => {
                let w = running[rng.random_range(0..running.len())].clone();
                dropped_abruptly.insert(w.to_string());
                cluster.restart_as(&w).map_err(|e| e.to_string())?;
            }
            Event::Wipe | Event::Rollback => {
                // The fleet restores what it remembers, and a process remembers the leases from
                // its first listing on. A fleet whose only processes restarted a moment ago and
                // still fail to list knows nothing: a store losing everything then is, to that
                // fleet, a new application (under `LATEST` the records since the last
                // checkpoints are skipped, the limit docs/algorithm.md states in "When the store
                // loses writes"). The accident waits until a running process has listed once.
                let someone_listed = wait_until(
                    "a running worker listed the leases",
                    Duration::from_secs(300),
                    HEARTBEAT,
                    || async { cluster.stats().values().any(|s| s.lease_listings > 0) },
                )
                .await;
                if let Err(e) = someone_listed {
                    return Err(format!("{e} before {event:?}; events {events:?}"));
                }
                let listed = base.list_leases().await.map_err(|e| e.to_string())?.items;
                match (&event, &copy) {
                    (Event::Rollback, Some(c)) => mem.restore(c),
                    _ => mem.wipe(),
                }
                // A server that lost its data restarted or failed over: its subscribers' streams
                // end (a no-op without notification).
                notifier.drop_subscriptions();
                // The running workers remember what the store forgot and restore it; a fleet
                // that lost that memory too (all restarted) could not, so wait for the repair
                // before drawing the next event.
                let observer = base.clone();
                let repaired = wait_until(
                    "the store repaired by the fleet",
                    Duration::from_secs(300),
                    HEARTBEAT,
                    || async { repaired(&observer, &source, &listed).await },
                )
                .await;
                if let Err(e) = repaired {
                    let left = unrepaired(&base, &source, &listed).await;
                    return Err(format!(
                        "{e} after {event:?} (not back: {left:?}); events {events:?}"
                    ));
                }
            }
            Event::Corrupt(d) => {
                let keys: Vec<LeaseKey> = base
                    .list_leases()
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .map(|v| v.lease.key)
                    .collect();
                if let Some(k) = keys.get(rng.random_range(0..keys.len().max(1))).cloned() {
                    let (faults, d) = (faults.clone(), *d);
                    faults.corrupt(&k);
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        faults.uncorrupt(&k);
                    });
                }
            }
            Event::NestedResharding => {
                let open = source.open_shards();
                if open.len() < 14 {
                    let s = &open[rng.random_range(0..open.len())];
                    let (a, b) = source.split(&s.id).map_err(|e| e.to_string())?;
                    if rng.random_bool(0.5) {
                        source.merge(&a, &b).map_err(|e| e.to_string())?;
                    } else {
                        source.split(&a).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        events.push(event);
        let v = audit.violations();
        if !v.is_empty() {
            return Err(format!("invariant broken after {events:?}: {v:?}"));
        }
    }

    // A load seed: faults stop and the skew stops drifting while records keep coming; once the
    // loads are measured (a few time constants) and the cooldowns are over, no lease moves.
    // Stuck processors make real load swings (a hang, then the catch-up of what waited), so
    // seeds drawing them keep the safety checks but not this one.
    if d.load.is_some() && d.stuck_batches.is_none() {
        clear_faults();
        frozen.store(true, std::sync::atomic::Ordering::Relaxed);
        if cluster.running().is_empty() {
            cluster.start_worker().map_err(|e| e.to_string())?;
        }
        tokio::time::sleep(HEARTBEAT * 90).await;
        // One round of moves is a figure crossing a boundary once (a late heartbeat, a burst,
        // the end of a cooldown showing a moved lease's new figure), acted on by one plan whose
        // moves can take a balance interval or two to be claimed and handed over, and the rest
        // of a plan can wait a settling time more (the receiver of a move sits out load moves
        // until its figures show it): so two rounds at most, in one direction. A third round, a
        // lease moving twice, or a worker that both gives and receives is the start of a flap.
        let moves = moves_over(&base, HEARTBEAT, 30).await?;
        let polls_per_round = balance_interval.as_millis().div_ceil(HEARTBEAT.as_millis()) + 1;
        let rounds =
            moves.windows(2).filter(|w| u128::from(w[1].at - w[0].at) > polls_per_round).count()
                + usize::from(!moves.is_empty());
        let mut keys: Vec<&LeaseKey> = moves.iter().map(|m| &m.key).collect();
        keys.sort();
        let moved_twice = keys.windows(2).any(|w| w[0] == w[1]);
        let both_ways = moves.iter().any(|m| moves.iter().any(|o| o.to == m.from));
        if rounds > 2 || moved_twice || both_ways {
            return Err(format!(
                "leases did not settle under a steady skewed load: {} moves in {rounds} rounds \
                 over 30 heartbeats ({:?}); {d:?}; events {events:?}",
                moves.len(),
                moves
                    .iter()
                    .map(|m| format!("{}: {} → {} at beat {}", m.key, m.from, m.to, m.at))
                    .collect::<Vec<_>>()
            ));
        }
    }

    // Faults stop; the fleet must converge and process everything.
    producing.cancel();
    producer.await.map_err(|e| e.to_string())?;
    clear_faults();
    if cluster.running().is_empty() {
        cluster.start_worker().map_err(|e| e.to_string())?;
    }
    let produced = source.produced();
    wait_until("every produced record processed", Duration::from_secs(300), HEARTBEAT, || async {
        rec.distinct() as u64 == produced
    })
    .await
    .map_err(|e| {
        format!(
            "{e}: {} of {produced} processed, missing {:?}; {d:?}; events {events:?}",
            rec.distinct(),
            rec.missing(&source).first()
        )
    })?;
    if d.load.is_some() {
        // The loads fade out (smoothed over six balance intervals, 15 heartbeats) and the leases
        // go back to a balance by count; the quiet window below starts after that.
        tokio::time::sleep(HEARTBEAT * 90).await;
    }
    // A dead peer's record is removed once it has been dead long enough: a change every worker
    // notices (and lists for), so the quiet window below starts after it.
    let observer = base.clone();
    wait_until(
        "only running workers' records left",
        Duration::from_secs(300),
        HEARTBEAT,
        || async {
            // Current ids: a self-fenced worker runs on under a new incarnation's id.
            let running: Vec<WorkerId> = cluster
                .running()
                .iter()
                .filter_map(|w| cluster.handle(w))
                .map(|h| h.id())
                .collect();
            observer.list_workers().await.is_ok_and(|l| {
                l.items.iter().all(|r| running.contains(&r.id)) && l.corrupt.is_empty()
            })
        },
    )
    .await
    .map_err(|e| format!("{e}; events {events:?}"))?;
    if events.iter().any(|e| matches!(e, Event::Wipe | Event::Rollback)) {
        // A store that lost writes may have lost the leases of shards the fleet had finished
        // and collected; the periodic shard sync creates those again and
        // the workers that remember them restore them as finished, work that may fall after the
        // fleet looks balanced (seed 5613). The quiet window below starts after one shard-sync
        // interval, so it still fails a fleet that goes round creating and collecting them.
        tokio::time::sleep(shard_sync).await;
    }
    let cov = cluster
        .wait_balanced(Duration::from_secs(120), HEARTBEAT)
        .await
        .map_err(|e| format!("{e}; {d:?}; events {events:?}"))?;
    // Balanced and drained, the fleet goes quiet whatever its history (docs/algorithm.md,
    // "Listing only when something changed"): over QUIET_BEATS heartbeats a worker lists the
    // leases at most once per five heartbeats (the last changes settling, a long-dead peer's
    // record removed, the safety net), never on every pass (8 times here).
    let listings = |c: &Cluster| -> BTreeMap<String, u64> {
        c.stats().into_iter().map(|(id, s)| (id.to_string(), s.lease_listings)).collect()
    };
    tokio::time::sleep(HEARTBEAT * 3).await;
    let before = listings(&cluster);
    tokio::time::sleep(HEARTBEAT * QUIET_BEATS).await;
    let after = listings(&cluster);
    let noisy: Vec<String> = after
        .iter()
        .filter_map(|(id, n)| {
            let listed = n - before.get(id).copied().unwrap_or(0);
            (listed > u64::from(QUIET_BEATS / 5)).then(|| format!("{id} listed {listed} times"))
        })
        .collect();
    if !noisy.is_empty() {
        return Err(format!(
            "a quiet fleet kept listing the leases over {QUIET_BEATS} heartbeats: {noisy:?}; {d:?}; events {events:?}"
        ));
    }
    let v = audit.violations();
    if !v.is_empty() {
        return Err(format!("invariant broken: {v:?}; {d:?}; events {events:?}"));
    }
    // Every processor hears how its lease ended (`lease_lost`, `shutdown_requested` or
    // `shard_ended`), stuck in a batch or not, unless its process died (a crash, a restart).
    let silent: Vec<(u64, String)> = rec
        .silent_endings()
        .into_iter()
        .filter(|(_, owner)| {
            let configured = owner.split(shardlease_core::INCARNATION_SEPARATOR).next();
            !configured.is_some_and(|w| dropped_abruptly.contains(w))
        })
        .collect();
    if !silent.is_empty() {
        return Err(format!(
            "processors ended without hearing how their lease ended: {silent:?}; {d:?}; events {events:?}"
        ));
    }
    let overlaps = rec.overlaps();
    let order = rec.order_violations(&source);
    // After the store lost writes, two owners for a pass and a parent read again after its
    // children started are documented limits (docs/algorithm.md, "When the store loses
    // writes"): reported, and failures only with SHARDLEASE_SIM_STRICT=1. Without a store
    // accident they are always failures.
    let accident = events.iter().any(|e| matches!(e, Event::Wipe | Event::Rollback));
    let strict = !accident || std::env::var_os("SHARDLEASE_SIM_STRICT").is_some();
    let mut anomalies = Vec::new();
    if !overlaps.is_empty() {
        let m = format!("a shard was processed by two owners at once: {overlaps:?}");
        if strict {
            return Err(format!("{m}; {d:?}; events {events:?}"));
        }
        anomalies.push(m);
    }
    if !order.is_empty() {
        let m = format!("parent/child order broken: {order:?}");
        if strict {
            return Err(format!("{m}; {d:?}; events {events:?}"));
        }
        anomalies.push(m);
    }
    // No worker of the fleet stopped on its own: a plug-in's panic costs the call it happened in
    // (the runtime contains it), and a loop that fails for any other reason is a runtime bug.
    let stopped: Vec<String> = cluster
        .running()
        .iter()
        .filter_map(|w| cluster.handle(w).and_then(|h| h.stop_cause()).map(|c| format!("{w}: {c}")))
        .collect();
    if !stopped.is_empty() {
        return Err(format!("workers stopped on their own: {stopped:?}; {d:?}; events {events:?}"));
    }
    cluster.shutdown_all().await;
    let summary = format!(
        "{shards} shards → {} active, {} workers at the end, {produced} records, {} duplicates, {d:?}, {} injected errors, {} late writes, {}events {events:?}",
        cov.active,
        cov.shares.len(),
        rec.duplicates(),
        faults.injected_errors(),
        faults.late_writes(),
        match &d.panics {
            Some(_) => format!(
                "plug-in panics drawn: {} injected (store {}, balancer {}, source {}), ",
                faults.injected_panics() + panicky_balancer.panics() + panicky_source.panics(),
                faults.injected_panics(),
                panicky_balancer.panics(),
                panicky_source.panics()
            ),
            None => String::new(),
        }
    );
    if anomalies.is_empty() {
        Ok(summary)
    } else {
        Ok(format!(
            "POST-ACCIDENT ANOMALIES (documented limits): {}; {summary}",
            anomalies.join("; ")
        ))
    }
}

/// A change of owner seen by `moves_over`.
struct Move {
    /// The look (1 to `times`) that saw it.
    at: u32,
    key: LeaseKey,
    from: WorkerId,
    to: WorkerId,
}

/// The changes of owner seen by listing the leases every `every`, `times` times: a lease owned by
/// one worker at one look and by another at the next (a new lease's first owner is not a move).
async fn moves_over(
    store: &Arc<dyn LeaseStore>,
    every: Duration,
    times: u32,
) -> Result<Vec<Move>, String> {
    let owners = || async {
        store.list_leases().await.map_err(|e| e.to_string()).map(|l| {
            l.items
                .into_iter()
                .filter_map(|v| v.lease.owner.map(|o| (v.lease.key, o)))
                .collect::<BTreeMap<LeaseKey, WorkerId>>()
        })
    };
    let mut last = owners().await?;
    let mut moves = Vec::new();
    for at in 1..=times {
        tokio::time::sleep(every).await;
        let now = owners().await?;
        for (key, owner) in &now {
            if let Some(before) = last.get(key).filter(|b| *b != owner) {
                moves.push(Move { at, key: key.clone(), from: before.clone(), to: owner.clone() });
            }
        }
        last = now;
    }
    Ok(moves)
}

/// Whether every unfinished lease listed before an accident is back, at least as far along, or
/// finished and collected since: a descendant of it (in the stream's lineage) has moved past its
/// start. Collection is transitive: shard sync deletes a finished lease once its children moved
/// on, and those children in turn once theirs did, after which no lease names the first one as a
/// parent (docs/algorithm.md, "Deleting finished leases"; the fleet's own memory tells a
/// collected lease from a lost one the same way).
async fn repaired(
    store: &Arc<dyn LeaseStore>,
    source: &MemorySource,
    before: &[VersionedLease],
) -> bool {
    unrepaired(store, source, before).await.is_some_and(|left| left.is_empty())
}

/// The unfinished leases listed before an accident that are not back yet (see [`repaired`]),
/// each with what the store holds for it; `None` when the store or the stream cannot be listed.
async fn unrepaired(
    store: &Arc<dyn LeaseStore>,
    source: &MemorySource,
    before: &[VersionedLease],
) -> Option<Vec<String>> {
    let now = store.list_leases().await.ok()?.items;
    let mut children: BTreeMap<LeaseKey, Vec<LeaseKey>> = BTreeMap::new();
    for shard in source.list_shards().await.ok()? {
        for p in shard.parents {
            children.entry(p).or_default().push(shard.id.clone());
        }
    }
    for v in &now {
        for p in &v.lease.parents {
            children.entry(p.clone()).or_default().push(v.lease.key.clone());
        }
    }
    let moved_on = |key: &LeaseKey| {
        now.iter().any(|v| {
            &v.lease.key == key
                && matches!(v.lease.checkpoint, Position::Sequence { .. } | Position::ShardEnd)
        })
    };
    let collected = |key: &LeaseKey| {
        let mut stack: Vec<&LeaseKey> = children.get(key).into_iter().flatten().collect();
        let mut seen = std::collections::BTreeSet::new();
        while let Some(k) = stack.pop() {
            if !seen.insert(k) {
                continue;
            }
            if moved_on(k) {
                return true;
            }
            stack.extend(children.get(k).into_iter().flatten());
        }
        false
    };
    let left = before
        .iter()
        .map(|v| &v.lease)
        .filter(|old| !old.is_finished())
        .filter_map(|old| match now.iter().find(|v| v.lease.key == old.key) {
            Some(VersionedLease { lease: l, .. }) => (!not_behind(&old.checkpoint, &l.checkpoint))
                .then(|| {
                    format!(
                        "{} at {} (owner {:?}) now at {} (owner {:?})",
                        old.key, old.checkpoint, old.owner, l.checkpoint, l.owner
                    )
                }),
            None => (!collected(&old.key)).then(|| {
                format!(
                    "{} at {} (owner {:?}) missing, no descendant moved on",
                    old.key, old.checkpoint, old.owner
                )
            }),
        })
        .collect();
    Some(left)
}

/// Whether reading from `now` reads everything reading from `old` would.
fn not_behind(old: &Position, now: &Position) -> bool {
    match old {
        Position::Sequence { .. } | Position::ShardEnd => !old.would_regress_to(now),
        Position::TrimHorizon => !matches!(now, Position::Latest | Position::AtTimestamp { .. }),
        Position::AtTimestamp { millis: a } => match now {
            Position::Latest => false,
            Position::AtTimestamp { millis: b } => b <= a,
            _ => true,
        },
        Position::Latest => true,
    }
}

fn adjacent_pair(source: &MemorySource, rng: &mut StdRng) -> Option<(LeaseKey, LeaseKey)> {
    let mut open = source.open_shards();
    open.sort_by_key(|s| s.hash_range.as_ref().map(|r| r.start));
    let pairs: Vec<_> = open
        .windows(2)
        .filter(|w| match (&w[0].hash_range, &w[1].hash_range) {
            (Some(a), Some(b)) => a.end.checked_add(1) == Some(b.start),
            _ => false,
        })
        .map(|w| (w[0].id.clone(), w[1].id.clone()))
        .collect();
    if pairs.is_empty() {
        None
    } else {
        Some(pairs[rng.random_range(0..pairs.len())].clone())
    }
}
