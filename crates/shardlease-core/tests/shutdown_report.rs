//! `WorkerHandle::shutdown` says what became of every lease: released where its processor left
//! it, or released after the processor was cut short (its batch abandoned). Before the report,
//! both returned `Ok(())` and only a WARN line told them apart.
//!
//! Paused time, in-memory store and stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::MemoryStore;
use shardlease_core::{Config, MemorySource, Position, ShardSource};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::processors::Checkpointing;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);
const SHARDS: usize = 8;

/// One worker holding every lease of a stream with records in each shard, all processed.
async fn fleet_with_records(hang_on_shutdown: bool) -> (Cluster, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let source = Arc::new(MemorySource::new(SHARDS));
    for i in 0..SHARDS * 4 {
        source.put(&format!("key-{i}"), vec![b'x'; 8]);
    }
    let factory = Checkpointing { hang_on_shutdown, ..Default::default() }.factory();
    let config = Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(11);
    let shards: Arc<dyn ShardSource> = source.clone();
    let mut cluster = Cluster::new(store.clone(), shards, factory, config);
    cluster.sync_shards().await.unwrap();
    let id = cluster.start_worker().unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    let c = &cluster;
    wait_until("every record processed", LONG, HB / 10, || async {
        c.handle(&id).unwrap().stats().records == (SHARDS * 4) as u64
    })
    .await
    .unwrap();
    (cluster, store)
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_reports_every_lease_released_at_its_checkpoint() {
    let (mut cluster, _store) = fleet_with_records(false).await;
    let id = cluster.running()[0].clone();
    let report = cluster.shutdown(&id).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.leases(), SHARDS, "{report:?}");
    assert_eq!(report.released.len(), SHARDS, "{report:?}");
    let leases = cluster.leases().await.unwrap();
    for released in &report.released {
        let stored = leases.iter().find(|l| l.key == released.key).unwrap();
        assert_eq!(stored.owner, None, "{} still owned", stored.key);
        assert_eq!(released.resumes_at, stored.checkpoint, "{}", stored.key);
        assert!(
            matches!(released.resumes_at, Position::Sequence { .. }),
            "{}: the processor's last checkpoint, not the start: {}",
            stored.key,
            released.resumes_at
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_that_cuts_processors_short_says_so_and_where_they_resume() {
    let (cluster, _store) = fleet_with_records(true).await;
    let id = cluster.running()[0].clone();
    let handle = cluster.handle(&id).unwrap();
    let report = handle.shutdown().await;
    assert!(!report.is_clean(), "{report:?}");
    assert!(report.released.is_empty(), "{report:?}");
    assert_eq!(report.abandoned.len(), SHARDS, "{report:?}");
    let leases = cluster.leases().await.unwrap();
    for abandoned in &report.abandoned {
        let stored = leases.iter().find(|l| l.key == abandoned.key).unwrap();
        assert_eq!(stored.owner, None, "{} still owned", stored.key);
        assert_eq!(abandoned.resumes_at, stored.checkpoint, "{}", stored.key);
    }
    // A second call has nothing left to report.
    let again = handle.shutdown().await;
    assert_eq!(again.leases(), 0);
}
