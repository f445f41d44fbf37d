//! The runtime's own bounds: a self-fence finishes within half a heartbeat however many leases
//! it stops and whatever `lease_lost` does, and the counters tell the truth about take-overs.
//!
//! Paused time, in-memory store and stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::Lease;
use shardlease_core::store::LeaseStore;
use shardlease_core::store::MemoryStore;
use shardlease_core::store::StoreDecorator;
use shardlease_core::store::Version;
use shardlease_core::{Config, Error, MemorySource, Position, Result, ShardSource, WorkerId};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::processors::Checkpointing;
use shardlease_testkit::Faults;
use shardlease_testkit::FaultyStore;
use tokio::time::Instant;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);

fn config() -> Config {
    Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(3)
}

/// A worker with 64 leases whose processors hang in `lease_lost` is cut off from the store: its
/// fence ends (it comes back as a new incarnation) within half a heartbeat of starting, not 64
/// half-heartbeats later.
#[tokio::test(start_paused = true)]
async fn a_fence_is_bounded_as_a_whole() {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let faults = Faults::new(1);
    let views = {
        let (base, faults) = (base.clone(), faults.clone());
        Arc::new(move |w: &WorkerId| -> Arc<dyn LeaseStore> {
            Arc::new(FaultyStore::new(base.clone(), faults.clone(), Some(w.clone())))
        })
    };
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(64));
    let factory = Checkpointing { hang_on_lease_lost: true, ..Default::default() }.factory();
    let mut cluster = Cluster::with_store_per_worker(base, views, source, factory, config());
    cluster.sync_shards().await.unwrap();
    let id = cluster.start_worker().unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    faults.partition(&id);
    let c = &cluster;
    let h = c.handle(&id).unwrap();
    wait_until("the fence starting", LONG, HB / 100, || async { h.stats().fenced > 0 })
        .await
        .unwrap();
    let started = Instant::now();
    wait_until("a new incarnation", LONG, HB / 100, || async { h.id() != id }).await.unwrap();
    let took = started.elapsed();
    assert!(took <= HB / 2 + HB / 10, "the fence took {took:?}");
    faults.heal(&id);
    cluster.shutdown_all().await;
}

/// Forwards to a store, but refuses this worker's lease updates while `stuck` is set: an owner
/// that is alive (it heartbeats) but can neither answer claims nor checkpoint.
#[derive(Debug)]
struct Stuck {
    inner: Arc<dyn LeaseStore>,
    stuck: Arc<AtomicBool>,
}

/// Only lease updates differ; every other call (the default-bodied ones included) reaches the
/// memory store through `StoreDecorator`'s forwarding.
#[async_trait]
impl StoreDecorator for Stuck {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        if self.stuck.load(Ordering::SeqCst) {
            return Err(Error::retryable("stuck"));
        }
        self.inner.update_lease(lease, expected).await
    }
}

/// A newcomer claims two leases from an owner that is stuck (it heartbeats, but can write no
/// lease); after the claim timeout it takes them over. The owner stops processing them first
/// (a heartbeat before the claim timeout, on its own clock), so no shard has two owners, and both
/// sides count it: `taken` on the claimant, `lost` on the old owner.
#[tokio::test(start_paused = true)]
async fn a_take_over_is_counted_by_both_sides() {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let stuck = Arc::new(AtomicBool::new(false));
    let views = {
        let (base, stuck) = (base.clone(), stuck.clone());
        Arc::new(move |w: &WorkerId| -> Arc<dyn LeaseStore> {
            let flag =
                if w.as_str() == "w1" { stuck.clone() } else { Arc::new(AtomicBool::new(false)) };
            Arc::new(Stuck { inner: base.clone(), stuck: flag })
        })
    };
    let memory = MemorySource::new(4);
    for i in 0..40 {
        memory.put(&format!("k{i}"), "x");
    }
    let source: Arc<dyn ShardSource> = Arc::new(memory.clone());
    let rec = shardlease_testkit::recorder::Recorder::new();
    let mut cluster = Cluster::with_store_per_worker(base, views, source, rec.factory(), config());
    cluster.sync_shards().await.unwrap();
    let owner = cluster.start_worker().unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    stuck.store(true, Ordering::SeqCst);
    for i in 0..40 {
        memory.put(&format!("more-{i}"), "x"); // the stuck owner reads, but cannot checkpoint
    }
    let newcomer = cluster.start_worker().unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    let c = &cluster;
    wait_until("the old owner stopping what it lost", LONG, HB / 10, || async {
        c.handle(&owner).unwrap().held_leases().len() == 2
    })
    .await
    .unwrap();
    let stats = cluster.stats();
    assert_eq!((stats[&newcomer].claims, stats[&newcomer].taken), (2, 2), "{stats:?}");
    assert_eq!(stats[&owner].lost, 2, "{stats:?}");
    // The stuck owner stopped processing before the claimant took the leases over.
    assert!(rec.overlaps().is_empty(), "{:?}", rec.overlaps());
    stuck.store(false, Ordering::SeqCst);
    cluster.shutdown_all().await;
}

/// A crashed worker's record (a process with a generated id never comes back) is removed once
/// its beat stood still for ten failover timeouts; a live worker's never is.
#[tokio::test(start_paused = true)]
async fn a_dead_workers_record_is_removed_after_ten_failover_timeouts() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(4));
    let factory = shardlease_testkit::recorder::Recorder::new().factory();
    let cfg = config();
    let failover = cfg.failover_timeout();
    let mut cluster = Cluster::new(store.clone(), source, factory, cfg);
    cluster.sync_shards().await.unwrap();
    let ids = cluster.start_workers(2).unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    cluster.crash(&ids[0]);
    let crashed = Instant::now();
    let listed = |id: WorkerId| {
        let store = store.clone();
        async move { store.list_workers().await.unwrap().items.iter().any(|r| r.id == id) }
    };
    assert!(listed(ids[0].clone()).await, "a crash leaves the record behind");
    wait_until("the dead record removed", LONG, HB / 10, || async {
        !listed(ids[0].clone()).await
    })
    .await
    .unwrap();
    assert!(crashed.elapsed() >= failover * 10, "removed after {:?}", crashed.elapsed());
    assert!(listed(ids[1].clone()).await, "the live worker's record stays");
    cluster.shutdown_all().await;
}
