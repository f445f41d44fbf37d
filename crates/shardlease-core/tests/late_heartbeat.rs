//! A heartbeat that lands late (after the worker's next ones, as a SQLite statement left running
//! in its own task does) must not show peers the worker's beat going back: they would take it for
//! a store that lost writes and hold every take for a while. The store keeps the later beat
//! (`LeaseStore::heartbeat`). Paused time; the fleet's logs must never say the records went back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{LeaseStore, MemoryStore, StoreDecorator, WorkerRecord};
use shardlease_core::{Config, Error, MemorySource, Position, Result, ShardSource, WorkerId};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

const HB: Duration = Duration::from_secs(1);

/// The heartbeat this store delays (counted from 1).
const LATE: u64 = 20;

/// Delays heartbeat number [`LATE`]: the caller gets an error at once, and the write lands 3.5
/// heartbeats later, after three newer ones. The two heartbeats after it are swallowed (reported
/// as written), so a late write that did land stays in the store long enough for every peer to
/// list it.
#[derive(Debug)]
struct LateHeartbeat {
    inner: Arc<dyn LeaseStore>,
    count: AtomicU64,
    landed: Arc<AtomicBool>,
}

#[async_trait]
impl StoreDecorator for LateHeartbeat {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if n == LATE {
            let (inner, record, landed) = (self.inner.clone(), record.clone(), self.landed.clone());
            tokio::spawn(async move {
                tokio::time::sleep(HB * 7 / 2).await;
                inner.heartbeat(&record).await.unwrap();
                landed.store(true, Ordering::SeqCst);
            });
            return Err(Error::retryable("the heartbeat did not complete in time"));
        }
        if (LATE + 4..LATE + 6).contains(&n) {
            return Ok(());
        }
        self.inner.heartbeat(record).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_late_heartbeat_never_shows_peers_a_beat_going_back() {
    let (logs, _guard) = shardlease_testkit::logs::capture();
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let landed = Arc::new(AtomicBool::new(false));
    let late = Arc::new(LateHeartbeat {
        inner: base.clone(),
        count: AtomicU64::new(0),
        landed: landed.clone(),
    });
    let slow_one = WorkerId::from("w1");
    let views = {
        let (base, late) = (base.clone(), late.clone());
        Arc::new(move |id: &WorkerId| -> Arc<dyn LeaseStore> {
            if *id == slow_one {
                late.clone()
            } else {
                base.clone()
            }
        })
    };
    let source = MemorySource::new(4);
    let cfg = Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source);
    let rec = Recorder::new();
    let mut cluster = Cluster::with_store_per_worker(base, views, src, rec.factory(), cfg);
    cluster.sync_shards().await.unwrap();
    let ids = cluster.start_workers(2).unwrap();
    assert_eq!(ids[0].as_str(), "w1");
    wait_until("the late heartbeat landed and peers listed since", HB * 120, HB / 4, || async {
        landed.load(Ordering::SeqCst) && late.count.load(Ordering::SeqCst) >= LATE + 8
    })
    .await
    .unwrap();
    cluster.shutdown_all().await;
    let text = logs.text();
    assert!(text.contains("heartbeat failed"), "the late heartbeat was reported as failed");
    assert!(
        !text.contains("went back in time"),
        "a late heartbeat moved the beat back:\n{}",
        text.lines().filter(|l| l.contains("went back")).collect::<Vec<_>>().join("\n")
    );
}
