//! Workers started together split the leases in their first pass, with no handoffs afterwards
//! (the first pass waits for a worker listing taken a heartbeat after the first heartbeat, so
//! every worker sees every peer). Paused time makes the check deterministic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, MemorySource, Position, ShardSource};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

#[tokio::test(start_paused = true)]
async fn eight_workers_started_together_take_128_each_in_one_pass_without_churn() {
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("startup".parse().unwrap()));
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(1024));
    let cfg = Config::new("startup")
        .unwrap()
        .with_heartbeat(Duration::from_secs(1))
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(7);
    let mut cluster = Cluster::new(store, source, Recorder::new().factory(), cfg);
    cluster.sync_shards().await.unwrap();
    let ids = cluster.start_workers(8).unwrap();
    let cov =
        cluster.wait_balanced(Duration::from_secs(120), Duration::from_millis(100)).await.unwrap();
    assert!(cov.shares.values().all(|n| *n == 128), "{cov:?}");
    // A few more balance passes on every worker: nothing moves.
    let c = &cluster;
    wait_until(
        "three passes on every worker",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { ids.iter().all(|id| c.handle(id).unwrap().stats().passes >= 3) },
    )
    .await
    .unwrap();
    for id in &ids {
        let s = cluster.handle(id).unwrap().stats();
        assert_eq!((s.taking_passes, s.taken, s.claims, s.handoffs), (1, 128, 0, 0), "{id}: {s:?}");
    }
    cluster.shutdown_all().await;
}
