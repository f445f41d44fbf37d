//! A custom checkpointer that keeps positions outside the lease records (the sink's database, for
//! effectively-once output): the runtime resumes from its positions, never mistakes the lease
//! records' unchanged start for a store that lost writes, and a shard whose end only the custom
//! checkpointer recorded is still marked finished in the lease store so its children start.
//!
//! Current-thread runtime with paused time, so the logs of every task land in the capture.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    Checkpointer, Config, Error, LeaseKey, LeaseToken, MemorySource, Position, Result, ShardSource,
};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::logs::capture;
use shardlease_testkit::recorder::Recorder;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);

/// Positions in a map, fenced by epoch (a newer epoch's write wins, an older one is refused).
#[derive(Debug, Default)]
struct MapCheckpointer(Mutex<HashMap<LeaseKey, (u64, Position)>>);

#[async_trait]
impl Checkpointer for MapCheckpointer {
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()> {
        let mut map = self.0.lock().unwrap();
        match map.get(&token.key) {
            Some((epoch, _)) if *epoch > token.epoch.get() => {
                Err(Error::LeaseLost { key: token.key.clone(), epoch: token.epoch })
            }
            _ => {
                map.insert(token.key.clone(), (token.epoch.get(), position.clone()));
                Ok(())
            }
        }
    }

    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>> {
        Ok(self.0.lock().unwrap().get(key).map(|(_, p)| p.clone()))
    }
}

/// A cluster over a fresh memory store whose workers keep their positions in `cp`.
fn cluster(source: &MemorySource, rec: &Recorder, cp: Arc<dyn Checkpointer>) -> Cluster {
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("custom".parse().unwrap()));
    let cfg = Config::new("custom")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    Cluster::new(store, src, rec.factory(), cfg).with_checkpointer(cp)
}

#[tokio::test(start_paused = true)]
async fn positions_kept_elsewhere_are_not_taken_for_lost_writes() {
    let (logs, _g) = capture();
    let source = MemorySource::new(4);
    let rec = Recorder::new();
    let cp = Arc::new(MapCheckpointer::default());
    let mut c = cluster(&source, &rec, cp.clone());
    c.sync_shards().await.unwrap();
    let ids = c.start_workers(2).unwrap();
    for i in 0..400 {
        source.put(&format!("k{i}"), "x");
        if i == 200 {
            // A failover: the survivor resumes the crashed worker's shards from `fetch`.
            c.crash(&ids[0]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = source.produced() as usize;
    wait_until("every record processed", LONG, HB, || async { rec.distinct() == n }).await.unwrap();
    c.wait_balanced(LONG, HB).await.unwrap();
    let text = logs.text();
    assert!(!text.contains("lost or rolled back"), "{text}");
    // The lease records still hold their start; the positions are the checkpointer's.
    for lease in c.leases().await.unwrap() {
        assert_eq!(lease.checkpoint, Position::TrimHorizon, "{lease:?}");
        assert!(matches!(cp.fetch(&lease.key).await.unwrap(), Some(Position::Sequence { .. })));
    }
    c.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_shard_end_only_the_checkpointer_recorded_still_finishes_the_lease() {
    let (logs, _g) = capture();
    let source = MemorySource::new(1);
    let parent = source.open_shards()[0].id.clone();
    source.put_to_shard(&parent, "before the split").unwrap();
    let (low, high) = source.split(&parent).unwrap();
    let rec = Recorder::new();
    // The previous owner checkpointed ShardEnd in the sink's database and stopped before it
    // marked the lease record finished.
    let cp = Arc::new(MapCheckpointer::default());
    cp.0.lock().unwrap().insert(parent.clone(), (1, Position::ShardEnd));
    let mut c = cluster(&source, &rec, cp);
    c.sync_shards().await.unwrap();
    c.start_workers(1).unwrap();
    let store = c.store().clone();
    wait_until("the parent finished and both children owned", LONG, HB, || async {
        let leases = store.list_leases().await.unwrap().items;
        let get = |k: &LeaseKey| leases.iter().find(|v| &v.lease.key == k).map(|v| v.lease.clone());
        get(&parent).is_some_and(|l| l.is_finished())
            && [&low, &high].iter().all(|k| get(k).is_some_and(|l| l.owner.is_some()))
    })
    .await
    .unwrap();
    // The parent's record was not processed again, and the lease was marked finished by its
    // owner, not repaired as if the store had lost a write.
    assert_eq!(rec.distinct(), 0);
    let text = logs.text();
    assert!(!text.contains("lost or rolled back"), "{text}");
    c.shutdown_all().await;
}

/// A checkpointer whose first `fetch` panics: the lease task dies outside the processor (whose
/// panics are caught), in the runtime's own code.
#[derive(Debug, Default)]
struct PanicsOnce {
    inner: MapCheckpointer,
    panicked: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Checkpointer for PanicsOnce {
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()> {
        self.inner.checkpoint(token, position).await
    }

    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>> {
        if !self.panicked.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("the checkpointer's fetch panicked (on purpose)");
        }
        self.inner.fetch(key).await
    }
}

/// A lease task that dies of a panic outside the processor still reports its end to the balance
/// loop, which forgets it and starts the lease again. Before, the dead task stayed in the task map
/// and the shard was never read again (the runtime took the lease as running).
#[tokio::test(start_paused = true)]
async fn a_lease_task_that_panics_outside_the_processor_is_started_again() {
    let source = MemorySource::new(1);
    let rec = Recorder::new();
    let cp = Arc::new(PanicsOnce::default());
    let mut c = cluster(&source, &rec, cp.clone());
    c.sync_shards().await.unwrap();
    c.start_workers(1).unwrap();
    for i in 0..20 {
        source.put(&format!("k{i}"), "x");
    }
    let n = source.produced() as usize;
    wait_until("every record processed", LONG, HB, || async { rec.distinct() == n }).await.unwrap();
    assert!(cp.panicked.load(std::sync::atomic::Ordering::SeqCst));
    c.shutdown_all().await;
}
