//! No panic anywhere in a worker leaves a shard without a reader for longer than the failover
//! timeout + a heartbeat + a pass (issue 50).
//!
//! A panic in a user plug-in (balancer, shard source, lease store) is contained to the call it
//! happened in: the worker goes on, the panic is counted in `shardlease_plugin_panics_total` and
//! logged at ERROR. A panic in one of the worker's own loops (a bug of ours, injected here through
//! the `fail_loop` test hook) stops the worker: its tasks are fenced, `is_running()` says false,
//! `stop_cause()` says why, `shardlease_worker_loop_failures_total` counts it, and its peers take
//! its leases once its heartbeat has stood still for the failover timeout.
//!
//! Paused time on a current-thread runtime, so the bounds are the configuration's, not the
//! machine's; each test prints which worker read each shard and how long the move took.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use shardlease_core::balancer::{Balancer, GreedyBalancer, Plan, Snapshot};
use shardlease_core::store::{
    LeaseStore, Listing, MemoryBackend, StoreDecorator, VersionedLease, WorkerRecord,
};
use shardlease_core::{
    Config, LeaseKey, MemorySource, Position, Result, ShardInfo, ShardReader, ShardSource,
    StopCause, WorkerId,
};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::logs;
use shardlease_testkit::recorder::Recorder;
use tokio::time::Instant;

const HB: Duration = Duration::from_secs(1);
const SHARDS: usize = 8;
const POLL: Duration = Duration::from_millis(50);
const LONG: Duration = Duration::from_secs(120);

fn config(ns: &str) -> Config {
    Config::new(ns).unwrap().with_heartbeat(HB).with_initial_position(Position::TrimHorizon)
}

/// The goal's bound: failover timeout + a heartbeat + a (jittered) pass.
fn bound(cfg: &Config) -> Duration {
    cfg.failover_timeout()
        + cfg.heartbeat_interval()
        + cfg.balance_interval().mul_f64(1.0 + cfg.jitter())
}

/// Runs `body` on a current-thread runtime with paused time, with a metrics recorder and the
/// logs captured; hands back the metrics and the logs.
fn run<F, Fut>(body: F) -> (Snapshotter, String)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (logs, _guard) = logs::capture();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || rt.block_on(body()));
    (snapshotter, logs.text())
}

/// The sum of a counter's values over the series whose label `key` is `value`.
fn counter(snapshotter: &Snapshotter, name: &str, key: &str, value: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == name && k.key().labels().any(|l| l.key() == key && l.value() == value)
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// Which running worker is reading each shard (a worker that stopped reads nothing).
fn readers(cluster: &Cluster) -> BTreeMap<LeaseKey, WorkerId> {
    let mut by_shard = BTreeMap::new();
    for id in cluster.running() {
        let h = cluster.handle(&id).unwrap();
        if h.is_running() {
            for k in h.held_leases() {
                by_shard.insert(k, id.clone());
            }
        }
    }
    by_shard
}

/// Waits until every one of the source's shards has a running reader and `also` holds, within
/// `limit` of now; prints who reads what and how long it took.
async fn every_shard_read_within(
    what: &str,
    cluster: &Cluster,
    limit: Duration,
    also: impl Fn(&BTreeMap<LeaseKey, WorkerId>) -> bool,
) {
    let started = Instant::now();
    wait_until(what, limit, POLL, || {
        let r = readers(cluster);
        let ok = r.len() == SHARDS && also(&r);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: readers {:?}", readers(cluster)));
    let took = started.elapsed();
    let mut by_worker: BTreeMap<WorkerId, Vec<String>> = BTreeMap::new();
    for (k, w) in readers(cluster) {
        by_worker.entry(w).or_default().push(k.as_str().trim_start_matches("shardId-0").to_owned());
    }
    println!("{what}: every shard read after {took:?} (bound {limit:?}): {by_worker:?}");
}

fn share(r: &BTreeMap<LeaseKey, WorkerId>, w: &str) -> usize {
    r.values().filter(|o| o.as_str() == w).count()
}

async fn cluster_with(ns: &str, cfg: Config) -> Cluster {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store(ns.parse().unwrap()));
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(SHARDS));
    let mut cluster = Cluster::new(store, source, Recorder::new().factory(), cfg);
    cluster.sync_shards().await.unwrap();
    cluster
}

/// The default balancer, except that it panics on some of worker `w1`'s calls.
#[derive(Debug)]
struct PanickyBalancer {
    calls: AtomicU32,
    /// The call of `w1` that panics (1-based), or every call from this one on.
    from: u32,
    every: bool,
}

impl PanickyBalancer {
    fn new(from: u32, every: bool) -> Arc<Self> {
        Arc::new(PanickyBalancer { calls: AtomicU32::new(0), from, every })
    }
}

impl Balancer for PanickyBalancer {
    fn plan(&self, snapshot: &Snapshot) -> Plan {
        if snapshot.me.as_str() == "w1" {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.from || (self.every && n > self.from) {
                panic!("balancer bug on call {}", if self.every { 0 } else { n });
            }
        }
        GreedyBalancer::default().plan(snapshot)
    }
}

#[test]
fn a_balancer_that_panics_once_costs_one_pass_and_strands_nothing() {
    let (metrics, logs) = run(|| async {
        let cfg = config("panic-once");
        let balancer = PanickyBalancer::new(4, false);
        let mut cluster =
            cluster_with("panic-once", cfg.clone()).await.with_balancer(balancer.clone());
        cluster.start_worker().unwrap();
        every_shard_read_within("w1 alone", &cluster, LONG, |_| true).await;
        // Past w1's fourth call before w2 joins, as in the report.
        wait_until("w1's 4th plan", LONG, POLL, || {
            let n = balancer.calls.load(Ordering::SeqCst);
            async move { n >= 4 }
        })
        .await
        .unwrap();
        cluster.start_worker().unwrap();
        every_shard_read_within("w2 joined", &cluster, bound(&cfg) * 2, |r| {
            share(r, "w1") == 4 && share(r, "w2") == 4
        })
        .await;
        let w1 = cluster.handle(&WorkerId::new("w1")).unwrap();
        assert!(w1.is_running() && w1.stop_cause().is_none());
        cluster.shutdown_all().await;
    });
    assert_eq!(counter(&metrics, "shardlease_plugin_panics_total", "plugin", "balancer"), 1);
    assert_eq!(logs.matches("a plug-in panicked").count(), 1, "{logs}");
    assert!(logs.contains("balancer bug on call 4"), "{logs}");
}

#[test]
fn a_balancer_that_always_panics_is_stood_in_for_and_strands_nothing() {
    let (metrics, logs) = run(|| async {
        let cfg = config("panic-always");
        let mut cluster = cluster_with("panic-always", cfg.clone())
            .await
            .with_balancer(PanickyBalancer::new(1, true));
        cluster.start_worker().unwrap();
        // The first passes plan nothing; the built-in balancer then plans for w1.
        every_shard_read_within(
            "w1 alone, its balancer always panicking",
            &cluster,
            bound(&cfg),
            |_| true,
        )
        .await;
        cluster.start_worker().unwrap();
        every_shard_read_within("w2 joined", &cluster, bound(&cfg) * 2, |r| {
            share(r, "w1") == 4 && share(r, "w2") == 4
        })
        .await;
        assert!(cluster.handle(&WorkerId::new("w1")).unwrap().is_running());
        cluster.shutdown_all().await;
    });
    assert!(counter(&metrics, "shardlease_plugin_panics_total", "plugin", "balancer") >= 3);
    // Logged once per distinct message, however many times it panicked.
    assert_eq!(logs.matches("a plug-in panicked").count(), 1, "{logs}");
    assert!(logs.contains("the built-in balancer plans"), "{logs}");
}

/// A memory source whose listing panics while `panicking` is set.
#[derive(Debug)]
struct PanickySource {
    inner: MemorySource,
    panicking: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl ShardSource for PanickySource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        if self.panicking.load(Ordering::SeqCst) {
            panic!("source listing bug");
        }
        self.inner.list_shards().await
    }
    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        self.inner.open(shard, from).await
    }
}

#[test]
fn a_shard_source_whose_listing_panics_fails_that_sync_only() {
    let (metrics, logs) = run(|| async {
        let cfg = config("source-panic").with_shard_sync_interval(HB * 5);
        let source =
            Arc::new(PanickySource { inner: MemorySource::new(SHARDS), panicking: false.into() });
        let store: Arc<dyn LeaseStore> =
            Arc::new(MemoryBackend::new().store("source-panic".parse().unwrap()));
        let mut cluster =
            Cluster::new(store, source.clone(), Recorder::new().factory(), cfg.clone());
        cluster.sync_shards().await.unwrap();
        source.panicking.store(true, Ordering::SeqCst);
        cluster.start_worker().unwrap();
        every_shard_read_within(
            "w1, its source's listing panicking",
            &cluster,
            bound(&cfg),
            |_| true,
        )
        .await;
        let w1 = cluster.handle(&WorkerId::new("w1")).unwrap();
        let err = w1.sync_shards().await.unwrap_err().to_string();
        assert!(err.contains("panicked") && err.contains("source listing bug"), "{err}");
        // Several periodic syncs panic meanwhile; the worker goes on.
        tokio::time::sleep(cfg.shard_sync_interval() * 3).await;
        assert!(w1.is_running() && w1.stop_cause().is_none());
        assert_eq!(readers(&cluster).len(), SHARDS);
        // Once the listing works again, so does the sync.
        source.panicking.store(false, Ordering::SeqCst);
        w1.sync_shards().await.unwrap();
        cluster.shutdown_all().await;
    });
    assert!(counter(&metrics, "shardlease_plugin_panics_total", "plugin", "shard source") >= 3);
    assert_eq!(logs.matches("a plug-in panicked").count(), 1, "{logs}");
}

/// One worker's view of the store, whose listings of leases or heartbeats panic on demand.
#[derive(Debug)]
struct PanickyStore {
    inner: Arc<dyn LeaseStore>,
    /// Listings of the leases left to panic.
    list_panics: Arc<AtomicU32>,
    /// Whether every heartbeat panics.
    heartbeat_panics: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl StoreDecorator for PanickyStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let left = self.list_panics.load(Ordering::SeqCst);
        if left > 0 {
            self.list_panics.store(left - 1, Ordering::SeqCst);
            panic!("store listing bug");
        }
        self.inner.list_leases().await
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        if self.heartbeat_panics.load(Ordering::SeqCst) {
            panic!("store heartbeat bug");
        }
        self.inner.heartbeat(record).await
    }
}

#[test]
fn a_store_that_panics_in_the_balance_loop_and_in_the_heartbeat_strands_nothing() {
    let (metrics, logs) = run(|| async {
        let cfg = config("store-panic");
        let base: Arc<dyn LeaseStore> =
            Arc::new(MemoryBackend::new().store("store-panic".parse().unwrap()));
        let list_panics = Arc::new(AtomicU32::new(0));
        let heartbeat_panics = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let views = Arc::new(Mutex::new(Vec::new()));
        let store_for = {
            let (base, list_panics, heartbeat_panics) =
                (base.clone(), list_panics.clone(), heartbeat_panics.clone());
            Arc::new(move |id: &WorkerId| -> Arc<dyn LeaseStore> {
                views.lock().unwrap().push(id.clone());
                if id.as_str() == "w1" {
                    Arc::new(PanickyStore {
                        inner: base.clone(),
                        list_panics: list_panics.clone(),
                        heartbeat_panics: heartbeat_panics.clone(),
                    })
                } else {
                    base.clone()
                }
            })
        };
        let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(SHARDS));
        let mut cluster = Cluster::with_store_per_worker(
            base,
            store_for,
            source,
            Recorder::new().factory(),
            cfg.clone(),
        );
        cluster.sync_shards().await.unwrap();
        // w1's first listings of the leases panic: those passes fail, later ones take.
        list_panics.store(3, Ordering::SeqCst);
        cluster.start_worker().unwrap();
        every_shard_read_within("w1, its first 3 listings panicking", &cluster, LONG, |_| true)
            .await;
        assert_eq!(list_panics.load(Ordering::SeqCst), 0);
        cluster.start_worker().unwrap();
        every_shard_read_within("w2 joined", &cluster, LONG, |r| {
            share(r, "w1") == 4 && share(r, "w2") == 4
        })
        .await;
        // Now every heartbeat of w1 panics: it fences itself, and w2 takes everything.
        heartbeat_panics.store(true, Ordering::SeqCst);
        every_shard_read_within("w1's heartbeats panicking", &cluster, bound(&cfg), |r| {
            share(r, "w2") == SHARDS
        })
        .await;
        let w1 = cluster.handle(&WorkerId::new("w1")).unwrap();
        assert!(w1.is_fenced(), "a worker whose heartbeats fail fences itself");
        assert!(w1.is_running(), "and keeps trying: a store error, not a failed loop");
        cluster.shutdown_all().await;
    });
    assert!(counter(&metrics, "shardlease_plugin_panics_total", "plugin", "lease store") >= 4);
    assert!(logs.contains("store listing bug") && logs.contains("store heartbeat bug"), "{logs}");
}

#[test]
fn a_failed_loop_stops_its_worker_and_peers_take_its_leases_within_the_bound() {
    for name in ["balance", "heartbeat", "watchdog", "shard_sync", "notices"] {
        let ns = format!("loop-{}", name.replace('_', "-"));
        let (metrics, logs) = run(|| async {
            let cfg = config(&ns);
            let mut cluster = cluster_with(&ns, cfg.clone()).await;
            cluster.start_workers(2).unwrap();
            every_shard_read_within(&format!("{name}: both running"), &cluster, LONG, |r| {
                share(r, "w1") == 4 && share(r, "w2") == 4
            })
            .await;
            let w1 = cluster.handle(&WorkerId::new("w1")).unwrap();
            assert!(w1.fail_loop(name));
            let stopped = tokio::time::timeout(HB, w1.stopped()).await.expect("stops at once");
            let StopCause::LoopFailed(failure) = stopped else { panic!("{stopped:?}") };
            assert_eq!(failure.loop_name, name);
            assert!(failure.panicked && failure.message.contains("injected"), "{failure:?}");
            assert!(!w1.is_running());
            assert!(w1.held_leases().is_empty(), "its tasks stop at once");
            every_shard_read_within(
                &format!("{name} loop of w1 failed"),
                &cluster,
                bound(&cfg),
                |r| share(r, "w2") == SHARDS,
            )
            .await;
            let report = cluster.handle(&WorkerId::new("w1")).unwrap().shutdown().await;
            assert!(matches!(report.cause, Some(StopCause::LoopFailed(_))), "{report:?}");
            assert_eq!(report.leases(), 0, "fenced, not released: {report:?}");
            assert!(!report.is_clean());
            cluster.shutdown_all().await;
        });
        assert_eq!(counter(&metrics, "shardlease_worker_loop_failures_total", "loop", name), 1);
        assert!(logs.contains("a worker loop failed"), "{logs}");
    }
}

#[test]
fn a_graceful_shutdown_says_so_and_returns_its_report() {
    run(|| async {
        let cfg = config("graceful");
        let mut cluster = cluster_with("graceful", cfg).await;
        let id = cluster.start_worker().unwrap();
        every_shard_read_within("w1", &cluster, LONG, |_| true).await;
        let h = cluster.handle(&id).unwrap();
        let report = h.shutdown().await;
        assert_eq!(report.cause, Some(StopCause::Shutdown));
        assert_eq!(report.released.len(), SHARDS);
        assert!(report.record_error.is_none() && report.is_clean(), "{report:?}");
        assert_eq!(h.stop_cause(), Some(StopCause::Shutdown));
        // A second call returns an empty report.
        assert_eq!(h.shutdown().await, shardlease_core::ShutdownReport::default());
    });
}
