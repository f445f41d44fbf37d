//! Never two owners at once: a process restarted under the same worker id re-takes its
//! predecessor's leases by compare-and-set with a new epoch (never resumes them), and a graceful
//! handoff whose processor flushes slowly is never cut short by the claimant's claim timeout.
//!
//! Paused time, a producer writing throughout, and the recorder's per-processor overlap check
//! (which also catches two processors at the same epoch).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardlease_core::Epoch;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryStore};
use shardlease_core::{Config, LeaseKey, MemorySource, Position, ShardSource};
use shardlease_testkit::audit::AuditLog;
use shardlease_testkit::cluster::{audited_faulty_views, wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::Faults;
use tokio_util::sync::CancellationToken;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);

struct World {
    cluster: Cluster,
    source: MemorySource,
    rec: Recorder,
    audit: AuditLog,
    producing: CancellationToken,
}

fn world(
    shards: usize,
    rec: Recorder,
    latency: Duration,
    tune: impl FnOnce(Config) -> Config,
) -> World {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let faults = Faults::new(5);
    faults.set_latency(latency, latency);
    let audit = AuditLog::new();
    let views = audited_faulty_views(base.clone(), faults, audit.clone());
    let source = MemorySource::new(shards);
    let cfg = Config::new("default")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(5)
        .with_idle_poll_interval(HB / 10);
    let cfg = tune(cfg);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let cluster = Cluster::with_store_per_worker(base, views, src, rec.factory(), cfg);
    let producing = CancellationToken::new();
    {
        let (source, stop) = (source.clone(), producing.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                i += 1;
                source.put(&format!("k{i}"), format!("r{i}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }
    World { cluster, source, rec, audit, producing }
}

impl World {
    async fn finish(mut self) -> Self {
        self.producing.cancel();
        let (rec, source) = (&self.rec, &self.source);
        wait_until("every record processed", LONG, HB, || async {
            rec.distinct() as u64 == source.produced()
        })
        .await
        .unwrap();
        self.cluster.shutdown_all().await;
        assert!(self.audit.violations().is_empty(), "{:?}", self.audit.violations());
        self
    }

    async fn epochs(&self) -> BTreeMap<LeaseKey, Epoch> {
        let leases = self.cluster.leases().await.unwrap();
        leases.into_iter().map(|l| (l.key, l.epoch)).collect()
    }
}

/// A process restarted under its old id (a StatefulSet pod) right after a crash, before any
/// peer noticed: every lease it runs is re-taken with a new epoch, never resumed at the epoch of
/// the process that died.
#[tokio::test(start_paused = true)]
async fn a_restart_under_the_same_id_retakes_every_lease_with_a_new_epoch() {
    let mut w = world(64, Recorder::new(), Duration::from_millis(10), |c| c);
    w.cluster.sync_shards().await.unwrap();
    let ids = w.cluster.start_workers(2).unwrap();
    w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
    let victim = ids[0].clone();
    let before = w.epochs().await;
    w.cluster.restart_as(&victim).unwrap();
    w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
    let after = w.epochs().await;
    let restarted = w.cluster.handle(&victim).unwrap().held_leases();
    assert!(!restarted.is_empty());
    for k in &restarted {
        assert!(after[k] > before[k], "{k} runs at epoch {} it had before the crash", after[k]);
    }
    let w = w.finish().await;
    assert!(w.rec.overlaps().is_empty(), "{:?}", w.rec.overlaps());
}

/// The same while a peer that judged the dead process dead is taking its leases over, with a
/// store slow enough (100 ms per call, 512 shards) that the takeover is still under way when the
/// restarted process makes its first pass: no shard is processed by two processors at once.
#[tokio::test(start_paused = true)]
async fn a_restart_under_the_same_id_during_a_takeover_never_runs_two_owners() {
    let mut w = world(512, Recorder::new(), Duration::from_millis(100), |c| {
        c.with_failover_timeout(HB * 8)
    });
    w.cluster.sync_shards().await.unwrap();
    let ids = w.cluster.start_workers(2).unwrap();
    w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
    let (victim, peer) = (ids[0].clone(), ids[1].clone());
    let held: Vec<LeaseKey> = w.cluster.handle(&victim).unwrap().held_leases();
    w.cluster.crash(&victim);
    let c = &w.cluster;
    wait_until("the peer taking over", LONG, HB / 20, || async {
        c.handle(&peer).unwrap().held_leases().iter().any(|k| held.contains(k))
    })
    .await
    .unwrap();
    w.cluster.restart_as(&victim).unwrap();
    w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
    let w = w.finish().await;
    assert!(w.rec.overlaps().is_empty(), "{:?}", w.rec.overlaps());
}

/// An owner whose processor buffers (checkpoints every 1000 batches) and flushes for 6.3 s in
/// `shutdown_requested` (its limit is 6.4 s) hands its leases to a newcomer. The claim timeout
/// (7.5 s) is shorter than noticing the claim plus the flush, but the owner acknowledges the claim
/// before it flushes, so the claimant waits: nothing is processed twice and no final checkpoint is
/// refused. Several seeds, so the owner notices the claim at different points of its pass cycle.
#[tokio::test(start_paused = true)]
async fn a_slow_flush_in_a_graceful_handoff_is_never_cut_short() {
    for seed in 1..=6 {
        let rec = Recorder::new()
            .with_checkpoint_every(1000)
            .with_shutdown_delay(Duration::from_millis(6_300));
        let mut w = world(8, rec, Duration::from_millis(1), |c| {
            c.with_shutdown_timeout(Duration::from_millis(6_400))
                .with_claim_timeout(Duration::from_millis(7_500))
                .with_rng_seed(seed)
        });
        w.cluster.sync_shards().await.unwrap();
        let first = w.cluster.start_worker().unwrap();
        w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
        tokio::time::sleep(HB * 3).await; // records flow to the first owner
        w.cluster.start_worker().unwrap();
        w.cluster.wait_balanced(LONG, HB / 2).await.unwrap();
        let stats = w.cluster.stats();
        let w = w.finish().await;
        assert_eq!(stats[&first].handoffs, 4, "seed {seed}: {stats:?}");
        assert_eq!(w.rec.duplicates(), 0, "seed {seed}: records processed twice");
        assert!(w.rec.overlaps().is_empty(), "seed {seed}: {:?}", w.rec.overlaps());
    }
}
