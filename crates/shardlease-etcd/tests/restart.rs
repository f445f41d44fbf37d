//! etcd restarts under running workers (SIGKILL, then the same data directory and ports). etcd
//! keeps what it acknowledged, so the workers must simply go on: no checkpoint lost or moved
//! back, no epoch going back, every record processed, both workers running. Their watches break
//! with the connection and are opened again (then each worker lists once).
//!
//! The test runs its own `etcd` on free loopback ports and kills only that process (the shared
//! test server is used by other tests and must never be restarted).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Config, Lease, LeaseStore, MemorySource, Position, ShardSource};
use shardlease_etcd::EtcdStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

async fn leases(store: &dyn LeaseStore) -> BTreeMap<String, Lease> {
    let listing = store.list_leases().await.unwrap();
    listing.items.into_iter().map(|v| (v.lease.key.as_str().to_owned(), v.lease)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_go_on_when_etcd_restarts() {
    let name = "workers_go_on_when_etcd_restarts";
    let Some(mut server) = common::PrivateEtcd::start_or_skip(name) else { return };
    let url = format!("{}?timeout_ms=1000&connect_timeout_ms=500", server.url());
    let store = EtcdStore::connect(&url, "restart").await.unwrap();
    let observer: Arc<dyn LeaseStore> = Arc::new(store);

    let source = MemorySource::new(4);
    let put = |from: usize, to: usize| {
        for i in from..to {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
    };
    put(0, 200);
    let rec = Recorder::new();
    let cfg = Config::new("restart")
        .unwrap()
        .with_heartbeat(Duration::from_millis(300))
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(observer.clone(), src, rec.factory(), cfg);
    cluster.start_workers(2).unwrap();
    let every = Duration::from_millis(50);
    cluster.wait_balanced(Duration::from_secs(30), every).await.unwrap();
    wait_until("the first 200 records", Duration::from_secs(30), every, || async {
        rec.distinct() == 200
    })
    .await
    .unwrap();
    // Let the checkpoints of the first 200 land.
    wait_until("checkpoints written", Duration::from_secs(30), every, || async {
        leases(&*observer).await.values().all(|l| matches!(l.checkpoint, Position::Sequence { .. }))
    })
    .await
    .unwrap();
    let before = leases(&*observer).await;

    server.kill();
    put(200, 250);
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.start().unwrap();

    put(250, 300);
    wait_until("every record, old and new", Duration::from_secs(60), every, || async {
        rec.distinct() == 300
    })
    .await
    .unwrap();
    let cov = cluster.wait_balanced(Duration::from_secs(60), every).await.unwrap();
    assert_eq!(cov.active, 4);
    assert!(rec.missing(&source).is_empty());
    let after = leases(&*observer).await;
    assert_eq!(after.len(), before.len(), "no lease lost");
    for (key, old) in &before {
        let new = &after[key];
        assert!(
            !old.checkpoint.would_regress_to(&new.checkpoint),
            "{key}: checkpoint went back from {:?} to {:?}",
            old.checkpoint,
            new.checkpoint
        );
        assert!(new.epoch >= old.epoch, "{key}: epoch {} before, {} after", old.epoch, new.epoch);
    }
    assert_eq!(cluster.running().len(), 2);
    for id in cluster.running() {
        assert!(cluster.handle(&id).unwrap().is_running(), "{id} keeps running");
    }
    println!("{name}: duplicates={} lost={}", rec.duplicates(), rec.lost());
    cluster.shutdown_all().await;
}
