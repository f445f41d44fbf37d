//! Redis restarts under running workers and comes back empty (this project's servers keep
//! nothing on disk, and neither does a Redis without AOF). The workers must notice that their
//! leases are gone, stop processing them, get the leases recreated from the shard source by the
//! shard sync, own them again and go on processing.
//!
//! The test runs its own `redis-server` on a free loopback port (the shared test server must never
//! be restarted: other tests use it). It asserts what the core does today: every processor is
//! told its lease is lost, the leases come back at the initial position (`TrimHorizon` here), so
//! records since the lost checkpoints are delivered again, and processing resumes. Versions are
//! random, so no version handed out after the loss equals one from before it: no pre-restart
//! version can match a recreated record.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::VersionedLease;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Config, LeaseStore, MemorySource, Position, ShardSource, Version};
use shardlease_redis::RedisStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

async fn versions(store: &dyn LeaseStore) -> HashSet<Version> {
    let listing = store.list_leases().await.unwrap();
    listing.items.iter().map(|VersionedLease { version: v, .. }| *v).collect()
}

async fn epochs(store: &dyn LeaseStore) -> std::collections::BTreeMap<String, u64> {
    let listing = store.list_leases().await.unwrap();
    listing.items.iter().map(|v| (v.lease.key.as_str().to_owned(), v.lease.epoch.get())).collect()
}

/// A quick restart: the workers keep heartbeating through it, notice that the store lost their
/// leases (a refused checkpoint, a listing without them, their records gone) and put them back
/// from what they remember (docs/algorithm.md, "When the store loses writes").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_recover_when_redis_restarts_empty() {
    restart_scenario("workers_recover_when_redis_restarts_empty", Duration::from_millis(100)).await;
}

/// A restart after an outage longer than the failover timeout: the workers fence themselves
/// first (no heartbeat), then come back as fresh workers to an empty namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_recover_after_a_long_outage_and_an_empty_restart() {
    restart_scenario("workers_recover_after_a_long_outage", Duration::from_millis(2_000)).await;
}

async fn restart_scenario(name: &str, down: Duration) {
    init_logs();
    let Some(mut server) = common::PrivateRedis::start_or_skip(name, &[]) else { return };
    let store = RedisStore::builder(server.url())
        .namespace("restart")
        .response_timeout(Duration::from_millis(500))
        .connection_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let observer: Arc<dyn LeaseStore> = Arc::new(store.clone());

    let source = MemorySource::new(4);
    let put = |from: usize, to: usize| {
        for i in from..to {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
    };
    put(0, 200);
    let rec = Recorder::new();
    let mut cfg = Config::new("restart")
        .unwrap()
        .with_heartbeat(Duration::from_millis(200))
        .with_initial_position(Position::TrimHorizon);
    cfg.shard_sync_interval = Duration::from_millis(600);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(observer.clone(), src, rec.factory(), cfg);
    // No explicit shard sync: a worker syncs by itself when it finds the namespace empty.
    cluster.start_workers(2).unwrap();
    cluster.wait_balanced(Duration::from_secs(20), Duration::from_millis(50)).await.unwrap();
    let every = Duration::from_millis(50);
    wait_until("the first 200 records", Duration::from_secs(20), every, || async {
        rec.distinct() == 200
    })
    .await
    .unwrap();
    assert_eq!(rec.duplicates(), 0, "nothing is delivered twice before the restart");
    let versions_before = versions(&*observer).await;
    let epochs_before = epochs(&*observer).await;

    // Restart: SIGKILL, then the same port again, empty.
    server.kill();
    put(200, 250);
    tokio::time::sleep(down).await;
    server.start().unwrap();

    // The workers restore the leases they remember (or, after a long outage in which they fenced
    // themselves, the shard sync recreates them), and own them again. Whether a processor was
    // told its lease was lost depends on which the worker noticed first: a refused checkpoint
    // or the listing that shows the loss. (An empty namespace counts as balanced, so wait for
    // the four leases first.)
    wait_until("the four leases recreated", Duration::from_secs(30), every, || async {
        cluster.coverage().await.is_ok_and(|c| c.active == 4)
    })
    .await
    .unwrap();
    let cov = cluster.wait_balanced(Duration::from_secs(30), every).await.unwrap();
    assert_eq!(cov.active, 4);
    let versions_after = versions(&*observer).await;
    assert!(
        versions_after.is_disjoint(&versions_before),
        "a version from before the loss came back ({versions_before:?} / {versions_after:?})"
    );
    put(250, 300);
    wait_until("every record, old and new", Duration::from_secs(30), every, || async {
        rec.distinct() == 300
    })
    .await
    .unwrap();
    assert!(rec.missing(&source).is_empty());
    // Epochs never go back: every lease is at least at the epoch it had before the loss.
    let epochs_after = epochs(&*observer).await;
    for (key, before) in &epochs_before {
        let after = epochs_after.get(key).copied().unwrap_or(0);
        assert!(after >= *before, "{key}: epoch {before} before the loss, {after} after");
    }
    assert_eq!(cluster.running().len(), 2);
    for id in cluster.running() {
        assert!(cluster.handle(&id).unwrap().is_running(), "{id} keeps running");
    }
    let stats: Vec<_> =
        cluster.running().iter().map(|id| cluster.handle(id).unwrap().stats()).collect();
    println!(
        "{name}: after the restart duplicates={} lost={} stats={stats:?}",
        rec.duplicates(),
        rec.lost()
    );
    cluster.shutdown_all().await;
}
