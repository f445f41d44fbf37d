//! Nothing is lost at `LATEST` and `AT_TIMESTAMP` starts: a lease that changes hands before its
//! first record resumes where its first owner opened the shard (not at a newer `LATEST`), and a
//! shard that closed before any shard sync saw it is still read when an ancestor's lease leads
//! into it.
//!
//! Paused time; processors poll idle shards only every minute, so a record written after a reader
//! opened stays unread until the lease changes hands, which is the window these tests are about.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardlease_core::store::VersionedLease;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{LeaseStore, MemoryStore};
use shardlease_core::{
    Config, LeaseKey, MemorySource, Position, Result, ShardInfo, ShardReader, ShardSource,
};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(300);

/// A source that counts how often each shard was opened, so a test can wait for a reader to be
/// open before it writes the record that reader must not lose.
#[derive(Debug, Clone)]
struct OpenCounting {
    inner: MemorySource,
    opens: Arc<Mutex<BTreeMap<LeaseKey, usize>>>,
}

impl OpenCounting {
    fn new(inner: MemorySource) -> Self {
        OpenCounting { inner, opens: Arc::default() }
    }

    fn opened(&self, key: &LeaseKey) -> usize {
        self.opens.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

#[async_trait]
impl ShardSource for OpenCounting {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        self.inner.list_shards().await
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        let r = self.inner.open(shard, from).await;
        *self.opens.lock().unwrap().entry(shard.clone()).or_default() += 1;
        r
    }
}

struct World {
    cluster: Cluster,
    store: Arc<dyn LeaseStore>,
    source: MemorySource,
    counting: OpenCounting,
    rec: Recorder,
}

fn world(shards: usize, initial: Position) -> World {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let source = MemorySource::new(shards);
    let counting = OpenCounting::new(source.clone());
    let rec = Recorder::new();
    let cfg = Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(initial)
        .with_idle_poll_interval(Duration::from_secs(60))
        .with_rng_seed(11);
    let src: Arc<dyn ShardSource> = Arc::new(counting.clone());
    let cluster = Cluster::new(store.clone(), src, rec.factory(), cfg);
    World { cluster, store, source, counting, rec }
}

impl World {
    async fn wait_opened(&self, keys: &[LeaseKey]) {
        let c = &self.counting;
        wait_until("every reader open", LONG, HB / 10, || async {
            keys.iter().all(|k| c.opened(k) > 0)
        })
        .await
        .unwrap();
    }

    async fn wait_all_processed(&self) -> std::result::Result<(), String> {
        let (rec, source) = (&self.rec, &self.source);
        wait_until("every record processed", LONG, HB / 2, || async {
            rec.distinct() as u64 == source.produced()
        })
        .await
        .map_err(|e| format!("{e}: missing {:?}", rec.missing(source)))
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap()
}

#[derive(Debug, Clone, Copy)]
enum Change {
    Handoff,
    Shutdown,
    Crash,
}

/// A `LATEST` lease whose owner opened the shard but read nothing yet, then handed over, released
/// at shutdown, or lost in a crash: the record written in between is processed by the next owner.
#[tokio::test(start_paused = true)]
async fn a_latest_lease_changing_hands_before_its_first_record_loses_nothing() {
    for change in [Change::Handoff, Change::Shutdown, Change::Crash] {
        let mut w = world(2, Position::Latest);
        w.cluster.sync_shards().await.unwrap();
        let a = w.cluster.start_worker().unwrap();
        let keys: Vec<LeaseKey> = w.source.shards().into_iter().map(|s| s.id).collect();
        w.wait_opened(&keys).await;
        for k in &keys {
            w.source.put_to_shard(k, format!("after the first open of {k}")).unwrap();
        }
        match change {
            Change::Handoff => {
                w.cluster.start_worker().unwrap();
                w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
            }
            Change::Shutdown => {
                w.cluster.shutdown(&a).await.unwrap();
                w.cluster.start_worker().unwrap();
            }
            Change::Crash => {
                w.cluster.crash(&a);
                w.cluster.start_worker().unwrap();
            }
        }
        let r = w.wait_all_processed().await;
        assert!(r.is_ok(), "{change:?}: {r:?}");
        w.cluster.shutdown_all().await;
    }
}

/// The store lost one lease (a restore from an old backup, a failover that dropped it) while no
/// running process remembers it: the only worker that ran it crashed. A `LATEST` start skips
/// history only for a namespace's first leases; here the application has run (the other lease
/// moved past `LATEST`), so the lost lease is created again from the shard's first record and
/// the record written after its last checkpoint is processed (with the earlier ones again),
/// instead of the lease being pinned at the new tip.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_nobody_remembers_is_not_recreated_at_latest() {
    let mut w = world(2, Position::Latest);
    w.cluster.sync_shards().await.unwrap();
    let a = w.cluster.start_worker().unwrap();
    let keys: Vec<LeaseKey> = w.source.shards().into_iter().map(|s| s.id).collect();
    w.wait_opened(&keys).await;
    for k in &keys {
        w.source.put_to_shard(k, format!("read by the first worker on {k}")).unwrap();
    }
    w.wait_all_processed().await.unwrap();
    w.cluster.crash(&a);
    w.source.put_to_shard(&keys[1], "after the last checkpoint").unwrap();
    let VersionedLease { version, .. } = w.store.get_lease(&keys[1]).await.unwrap().unwrap();
    w.store.delete_lease(&keys[1], version).await.unwrap();
    w.cluster.start_worker().unwrap();
    w.wait_all_processed().await.unwrap();
    w.cluster.shutdown_all().await;
}

/// A new application whose workers start together at `LATEST`: each finds an empty namespace,
/// waits two heartbeats and looks again, and must not take the others (which beat meanwhile) for
/// an established fleet: the leases are created at `LATEST`, so what was written before the start
/// is skipped and what comes after is processed.
#[tokio::test(start_paused = true)]
async fn workers_of_a_new_application_starting_together_start_at_latest() {
    let mut w = world(3, Position::Latest);
    for k in w.source.shards().into_iter().map(|s| s.id) {
        w.source.put_to_shard(&k, "before the application started").unwrap();
    }
    let before = w.source.produced();
    w.cluster.start_workers(3).unwrap();
    let keys: Vec<LeaseKey> = w.source.shards().into_iter().map(|s| s.id).collect();
    w.wait_opened(&keys).await;
    for k in &keys {
        w.source.put_to_shard(k, "after the start").unwrap();
    }
    let rec = &w.rec;
    wait_until("the records after the start processed", LONG, HB / 2, || async {
        rec.distinct() as u64 == w.source.produced() - before
    })
    .await
    .unwrap();
    tokio::time::sleep(HB * 10).await;
    assert_eq!(w.rec.distinct() as u64, w.source.produced() - before, "history was read");
    w.cluster.shutdown_all().await;
}

/// The store loses everything, worker records included (a Redis restarted without persistence),
/// and a new process starts at once at `LATEST`: it finds an empty namespace and no established
/// fleet. Had it taken that for a new application, it would create the leases at `LATEST` and pin
/// them at the new tip before the running worker restored them, skipping every record written
/// since their last checkpoints. It looks again after two heartbeats instead, by when the
/// running worker has written its record again, and leaves the leases to that worker's restore.
#[tokio::test(start_paused = true)]
async fn a_newcomer_after_a_wipe_of_leases_and_workers_does_not_start_at_latest() {
    let mut w = world(2, Position::Latest);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_worker().unwrap();
    let keys: Vec<LeaseKey> = w.source.shards().into_iter().map(|s| s.id).collect();
    w.wait_opened(&keys).await;
    for k in &keys {
        w.source.put_to_shard(k, format!("before the wipe on {k}")).unwrap();
    }
    w.wait_all_processed().await.unwrap();
    // The running worker lists (and remembers) the leases at their checkpoints.
    tokio::time::sleep(HB * 5).await;
    for k in &keys {
        w.source.put_to_shard(k, format!("after the last checkpoint on {k}")).unwrap();
    }
    for VersionedLease { lease, version } in w.store.list_leases().await.unwrap().items {
        w.store.delete_lease(&lease.key, version).await.unwrap();
    }
    for r in w.store.list_workers().await.unwrap().items {
        w.store.remove_worker(&r.id).await.unwrap();
    }
    w.cluster.start_worker().unwrap();
    w.wait_all_processed().await.unwrap();
    w.cluster.shutdown_all().await;
}

/// The store lost a closed shard's lease and kept (or got back) its children's leases at their
/// start: a child lease that has not read anything proves nothing about its parent, so shard sync
/// creates the parent's lease again and its records are processed (before the children's).
#[tokio::test(start_paused = true)]
async fn a_lost_parent_whose_children_did_not_move_on_is_created_again() {
    use shardlease_core::store::Lease;
    let mut w = world(1, Position::TrimHorizon);
    let parent = w.source.shards()[0].id.clone();
    w.source.put_to_shard(&parent, "in the parent").unwrap();
    let (low, high) = w.source.split(&parent).unwrap();
    for kid in [&low, &high] {
        w.source.put_to_shard(kid, format!("in {kid}")).unwrap();
        let lease = Lease::new(kid.clone(), Position::TrimHorizon).with_parents([parent.clone()]);
        w.store.create_lease(&lease).await.unwrap();
    }
    w.cluster.start_worker().unwrap();
    w.wait_all_processed().await.unwrap();
    assert!(
        w.rec.order_violations(&w.source).is_empty(),
        "{:?}",
        w.rec.order_violations(&w.source)
    );
    w.cluster.shutdown_all().await;
}

/// The same at `AT_TIMESTAMP`: the lease is reopened at the timestamp or later, never past a
/// record written after the first open.
#[tokio::test(start_paused = true)]
async fn an_at_timestamp_lease_changing_hands_loses_nothing() {
    let mut w = world(2, Position::AtTimestamp { millis: now_millis() - 1_000 });
    w.source.put("before", "before the start");
    w.cluster.sync_shards().await.unwrap();
    let a = w.cluster.start_worker().unwrap();
    let keys: Vec<LeaseKey> = w.source.shards().into_iter().map(|s| s.id).collect();
    w.wait_opened(&keys).await;
    for k in &keys {
        w.source.put_to_shard(k, "after the first open").unwrap();
    }
    w.cluster.shutdown(&a).await.unwrap();
    w.cluster.start_worker().unwrap();
    w.wait_all_processed().await.unwrap();
    w.cluster.shutdown_all().await;
}

/// Q is leased and lagging; Q splits, one child splits again (or the two children merge) before
/// any shard sync saw the child open. The child must be created unfinished (its parent's lease
/// leads into it) and the grandchildren after it: every record is processed, parents first.
#[tokio::test(start_paused = true)]
async fn nested_resharding_while_a_parent_lags_loses_nothing() {
    let starts = [Position::Latest, Position::AtTimestamp { millis: now_millis() - 1_000 }];
    for (merge, initial) in [false, true].into_iter().flat_map(|m| starts.clone().map(|p| (m, p))) {
        let mut w = world(1, initial.clone());
        w.cluster.sync_shards().await.unwrap();
        w.cluster.start_worker().unwrap();
        let q = w.source.shards()[0].id.clone();
        w.wait_opened(std::slice::from_ref(&q)).await;
        for i in 0..10 {
            w.source.put(&format!("q{i}"), "to q");
        }
        let (c1, c2) = w.source.split(&q).unwrap();
        for i in 0..20 {
            w.source.put(&format!("c{i}"), "to a child");
        }
        if merge {
            w.source.merge(&c1, &c2).unwrap();
        } else {
            w.source.split(&c1).unwrap();
        }
        for i in 0..20 {
            w.source.put(&format!("g{i}"), "to a grandchild");
        }
        // The shard sync sees the children closed for the first time, while Q still lags.
        w.cluster.sync_shards().await.unwrap();
        let r = w.wait_all_processed().await;
        assert!(r.is_ok(), "merge={merge} {initial}: {r:?}");
        let order = w.rec.order_violations(&w.source);
        assert!(order.is_empty(), "merge={merge} {initial}: {order:?}");
        w.cluster.shutdown_all().await;
    }
}
