//! Every processor the runtime created hears how its lease ended, exactly once: `lease_lost`,
//! `shutdown_requested` or `shard_ended`, on every path, also when it is stuck in
//! `process_records` when the lease goes. A processor that is never told keeps its resources
//! and, worse, may go on writing to its sink for a lease that is someone else's now.
//!
//! Paused time, in-memory store and stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::MemoryStore;
use shardlease_core::{
    Batch, BoxError, CheckpointHandle, Config, Epoch, LeaseContext, LeaseKey, MemorySource,
    Position, ProcessorFactory, RecordProcessor, ShardSource,
};
use shardlease_testkit::cluster::{wait_until, Cluster};

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);

/// How each processor instance (a lease at an epoch) was told its lease ended.
type Farewells = Arc<Mutex<BTreeMap<(LeaseKey, Epoch), Vec<&'static str>>>>;

/// Hangs forever in its first `process_records` (user code stuck on a sink), and records every
/// hook that tells it the lease ended.
struct Stuck {
    key: (LeaseKey, Epoch),
    log: Farewells,
    hang: bool,
}

impl Stuck {
    fn told(&self, what: &'static str) {
        self.log.lock().unwrap().entry(self.key.clone()).or_default().push(what);
    }
}

#[async_trait]
impl RecordProcessor for Stuck {
    async fn process_records(&mut self, _: &Batch, _: &CheckpointHandle) -> Result<(), BoxError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.told("lease_lost");
    }

    async fn shard_ended(&mut self, cp: &CheckpointHandle) -> Result<(), BoxError> {
        self.told("shard_ended");
        cp.checkpoint(Position::ShardEnd).await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &CheckpointHandle) -> Result<(), BoxError> {
        self.told("shutdown_requested");
        Ok(())
    }
}

struct Factory {
    log: Farewells,
    hang: bool,
}

impl ProcessorFactory for Factory {
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        self.log.lock().unwrap().insert((ctx.key().clone(), ctx.epoch()), Vec::new());
        Box::new(Stuck {
            key: (ctx.key().clone(), ctx.epoch()),
            log: self.log.clone(),
            hang: self.hang,
        })
    }
}

/// A worker whose processors hang in their first batch holds both leases; a second worker joins
/// and claims one. The owner acknowledges the claim, its processor never returns, the handoff's
/// deadline passes and the lease goes to the claimant. The stuck processor must hear
/// `lease_lost` (before the fix it heard nothing: the graceful stop's deadline passed during the
/// batch, and the task ended without a word to it).
#[tokio::test(start_paused = true)]
async fn a_processor_stuck_in_a_batch_hears_lease_lost_when_its_lease_is_handed_over() {
    let log: Farewells = Arc::default();
    let mut cluster = one_worker(2, true, &log).await;
    let first = cluster.running()[0].clone();
    let second = cluster.start_worker().unwrap();
    holds(&cluster, &second, 1).await;
    let moved = cluster.handle(&second).unwrap().held_leases()[0].clone();
    let c = &cluster;
    wait_until("the first worker's task of the moved lease ended", LONG, HB / 10, || async {
        !c.handle(&first).unwrap().held_leases().contains(&moved)
    })
    .await
    .unwrap();
    let first_epoch =
        log.lock().unwrap().keys().filter(|(k, _)| *k == moved).map(|(_, e)| *e).min().unwrap();
    let told = log.lock().unwrap()[&(moved.clone(), first_epoch)].clone();
    assert_eq!(told, vec!["lease_lost"], "the stuck processor of {moved} at {first_epoch}");
}

/// One worker holding `shards` leases, its processors hanging in their first batch or not.
async fn one_worker(shards: usize, hang: bool, log: &Farewells) -> Cluster {
    let store = Arc::new(MemoryStore::new());
    let source = Arc::new(MemorySource::new(shards));
    for i in 0..shards * 4 {
        source.put(&format!("key-{i}"), vec![b'x'; 8]);
    }
    let config = Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(9);
    let shards_source: Arc<dyn ShardSource> = source;
    let factory: Arc<dyn ProcessorFactory> = Arc::new(Factory { log: log.clone(), hang });
    let mut cluster = Cluster::new(store, shards_source, factory, config);
    cluster.sync_shards().await.unwrap();
    let id = cluster.start_worker().unwrap();
    holds(&cluster, &id, shards).await;
    cluster
}

/// Waits until worker `id` runs `n` leases.
async fn holds(cluster: &Cluster, id: &shardlease_core::WorkerId, n: usize) {
    let what = format!("{id} holds {n} leases");
    wait_until(&what, LONG, HB / 10, || async {
        cluster.handle(id).unwrap().held_leases().len() == n
    })
    .await
    .unwrap();
}

/// A shutdown tells every processor once: `shutdown_requested` when it is free to checkpoint,
/// `lease_lost` when it is stuck in a batch past the shutdown's deadline (before the fix: nothing).
#[tokio::test(start_paused = true)]
async fn a_shutdown_tells_every_processor_once_stuck_or_not() {
    for (hang, want, abandoned) in [(false, "shutdown_requested", 0), (true, "lease_lost", 3)] {
        let log: Farewells = Arc::default();
        let cluster = one_worker(3, hang, &log).await;
        let id = cluster.running()[0].clone();
        if !hang {
            let c = &cluster;
            wait_until("every record processed", LONG, HB / 10, || async {
                c.handle(&id).unwrap().stats().records == 12
            })
            .await
            .unwrap();
        }
        let report = cluster.handle(&id).unwrap().shutdown().await;
        assert_eq!(report.abandoned.len(), abandoned, "hang {hang}: {report:?}");
        assert_eq!(report.leases(), 3, "hang {hang}: {report:?}");
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 3, "{log:?}");
        for (lease, told) in log.iter() {
            assert_eq!(told, &vec![want], "hang {hang}: {lease:?}");
        }
    }
}
