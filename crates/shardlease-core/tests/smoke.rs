//! Quick end-to-end check of the runtime on the in-memory store and source.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, MemorySource, Position, ShardSource};
use shardlease_testkit::cluster::Cluster;
use shardlease_testkit::recorder::Recorder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_split_and_process_everything() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("smoke".parse().unwrap()));
    let source = MemorySource::new(8);
    for i in 0..400 {
        source.put(&format!("k{i}"), format!("v{i}"));
    }
    let rec = Recorder::new();
    let cfg = Config::new("smoke")
        .unwrap()
        .with_heartbeat(Duration::from_millis(50))
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(store, src, rec.factory(), cfg);
    cluster.sync_shards().await.unwrap();
    cluster.start_workers(2).unwrap();
    let cov =
        cluster.wait_balanced(Duration::from_secs(10), Duration::from_millis(20)).await.unwrap();
    assert_eq!(cov.active, 8);
    shardlease_testkit::cluster::wait_until(
        "all records",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { rec.distinct() == 400 },
    )
    .await
    .unwrap();
    cluster.shutdown_all().await;
    assert!(rec.missing(&source).is_empty());
}
