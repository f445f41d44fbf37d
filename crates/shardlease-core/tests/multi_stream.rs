//! A fleet on a `MultiSource` of two memory streams: every record of both is processed under
//! `stream/shard` keys, and once a stream is removed (zero grace) the runtime's shard sync
//! finishes its leases, fencing their owners, then deletes them; none comes back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, MemorySource, MultiSource, Position, ShardSource};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

async fn keys(store: &Arc<dyn LeaseStore>, prefix: &str) -> usize {
    let listing = store.list_leases().await.unwrap();
    listing.items.iter().filter(|v| v.lease.key.as_str().starts_with(prefix)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_stream_has_its_leases_finished_and_deleted() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("multi".parse().unwrap()));
    let (a, b) = (MemorySource::new(3), MemorySource::new(2));
    for i in 0..60 {
        a.put(&format!("a{i}"), format!("a{i}"));
        b.put(&format!("b{i}"), format!("b{i}"));
    }
    let multi = MultiSource::builder()
        .stream("a", Arc::new(a.clone()))
        .stream("b", Arc::new(b.clone()))
        .removal_grace(Duration::ZERO)
        .build()
        .unwrap();
    let rec = Recorder::new();
    let cfg = Config::new("multi")
        .unwrap()
        .with_heartbeat(Duration::from_millis(50))
        .with_shard_sync_interval(Duration::from_millis(200))
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(multi.clone());
    let mut cluster = Cluster::new(store.clone(), src, rec.factory(), cfg);
    cluster.start_workers(2).unwrap();
    let (t, p) = (Duration::from_secs(20), Duration::from_millis(20));
    wait_until("every record of both streams", t, p, || async { rec.distinct() == 120 })
        .await
        .unwrap();
    assert_eq!((keys(&store, "a/").await, keys(&store, "b/").await), (3, 2));
    multi.streams().remove("b").unwrap();
    wait_until("b's leases deleted", t, p, || async { keys(&store, "b/").await == 0 })
        .await
        .unwrap();
    // A full sync by hand: nothing of b is created again, a is untouched.
    cluster.sync_shards().await.unwrap();
    assert_eq!((keys(&store, "a/").await, keys(&store, "b/").await), (3, 0));
    for i in 0..30 {
        a.put(&format!("later{i}"), format!("later{i}"));
    }
    wait_until("a keeps being read", t, p, || async { rec.distinct() == 150 }).await.unwrap();
    assert_eq!(keys(&store, "b/").await, 0);
    cluster.shutdown_all().await;
}
