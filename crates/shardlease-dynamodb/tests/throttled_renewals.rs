//! Throttled renewals do not drop leases: a fleet on the DynamoDB store keeps every lease, under
//! the same epoch, while every other heartbeat and every other worker listing of each worker
//! fails with the retryable error a throttled call ends in (what `throttling.rs` shows the store
//! returns once the SDK's retries run out). Runs on the emulator named by
//! `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Listing, StoreDecorator, WorkerRecord};
use shardlease_core::{
    Config, Epoch, Error, LeaseKey, MemorySource, Position, Result, ShardSource, WorkerId,
};
use shardlease_testkit::cluster::{wait_until, Cluster, StoreForWorker};
use shardlease_testkit::recorder::Recorder;

/// One worker's view of the store: every other heartbeat and every other worker listing fails
/// as throttled.
#[derive(Debug)]
struct Throttled {
    inner: Arc<dyn LeaseStore>,
    beats: AtomicU64,
    listings: AtomicU64,
    /// Throttled calls of every view.
    throttled: Arc<AtomicU64>,
}

impl Throttled {
    fn throttle(&self, what: &str) -> Error {
        self.throttled.fetch_add(1, Ordering::SeqCst);
        Error::retryable(format!(
            "dynamodb: {what}: service error: ProvisionedThroughputExceededException (injected)"
        ))
    }
}

/// Only the heartbeat and the worker listing differ; every other call (the default-bodied ones
/// included) reaches the DynamoDB store through `StoreDecorator`'s forwarding.
#[async_trait]
impl StoreDecorator for Throttled {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        if self.beats.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            return Err(self.throttle("heartbeat"));
        }
        self.inner.heartbeat(record).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        if self.listings.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            return Err(self.throttle("listing workers"));
        }
        self.inner.list_workers().await
    }
}

fn owners(leases: &[Lease]) -> BTreeMap<LeaseKey, (Option<WorkerId>, Epoch)> {
    leases.iter().map(|l| (l.key.clone(), (l.owner.clone(), l.epoch))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_heartbeats_and_listings_drop_no_lease() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("throttled-renewals");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    let inner: Arc<dyn LeaseStore> = Arc::new(factory.open("renewals").await.unwrap());
    let throttled = Arc::new(AtomicU64::new(0));
    let (view_of, counter) = (inner.clone(), throttled.clone());
    let store_for: StoreForWorker = Arc::new(move |_: &WorkerId| -> Arc<dyn LeaseStore> {
        Arc::new(Throttled {
            inner: view_of.clone(),
            beats: AtomicU64::new(0),
            listings: AtomicU64::new(0),
            throttled: counter.clone(),
        })
    });
    let source = MemorySource::new(8);
    let src: Arc<dyn ShardSource> = Arc::new(source);
    let recorder = Recorder::new();
    // One-second heartbeats (the emulator is slow); failover after five.
    let config = Config::new("renewals")
        .unwrap()
        .with_heartbeat(Duration::from_secs(1))
        .with_initial_position(Position::TrimHorizon);
    let mut cluster =
        Cluster::with_store_per_worker(inner, store_for, src, recorder.factory(), config);
    cluster.sync_shards().await.unwrap();
    cluster.start_workers(2).unwrap();
    cluster.wait_balanced(Duration::from_secs(60), Duration::from_millis(100)).await.unwrap();
    let before = owners(&cluster.leases().await.unwrap());
    let throttled_before = throttled.load(Ordering::SeqCst);

    // Twenty throttled calls later (about five heartbeat intervals: longer than the failover
    // timeout), nobody has lost, fenced or moved anything.
    wait_until(
        "twenty more throttled calls",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { throttled.load(Ordering::SeqCst) >= throttled_before + 20 },
    )
    .await
    .unwrap();
    let after = owners(&cluster.leases().await.unwrap());
    assert_eq!(after, before, "every lease kept its owner and epoch");
    for (id, stats) in cluster.stats() {
        assert_eq!((stats.lost, stats.fenced), (0, 0), "{id}: {stats:?}");
    }
    cluster.shutdown_all().await;
    common::delete_table(&endpoint, &table).await.unwrap();
}
