//! Bad input and faults, each with a clear error or log line and nothing lost: invalid config,
//! a corrupt lease record, a processor that fails, one that panics, a store failing 20% of
//! calls, and a worker partitioned from the store past its failover timeout.
//!
//! Runs on a current-thread runtime with paused time, so long timeouts cost nothing and the log
//! lines of every task land in this test's capture.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardlease_core::store::VersionedLease;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend, StoreCheckpointer};
use shardlease_core::{
    Checkpointer, Config, Error, LeaseKey, MemorySource, Position, SequenceNumber, ShardSource,
    Worker,
};
use shardlease_testkit::audit::AuditLog;
use shardlease_testkit::cluster::{audited_faulty_views, wait_until, Cluster};
use shardlease_testkit::logs::capture;
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::Faults;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);

/// Log lines captured for assertions.
struct World {
    cluster: Cluster,
    source: MemorySource,
    rec: Recorder,
    faults: Faults,
    audit: AuditLog,
}

fn world(shards: usize, records: usize, seed: u64) -> World {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("faults".parse().unwrap()));
    let faults = Faults::new(seed);
    let audit = AuditLog::new();
    let store_for = audited_faulty_views(base.clone(), faults.clone(), audit.clone());
    let source = MemorySource::new(shards);
    for i in 0..records {
        source.put(&format!("k{i}"), format!("r{i}"));
    }
    let rec = Recorder::new();
    let cfg = Config::new("faults")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(seed);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let cluster = Cluster::with_store_per_worker(base, store_for, src, rec.factory(), cfg);
    World { cluster, source, rec, faults, audit }
}

impl World {
    async fn all_processed(&self) {
        let (rec, n) = (&self.rec, self.source.produced() as usize);
        wait_until("every record processed", LONG, HB, || async { rec.distinct() == n })
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e}: {} of {n}; missing {:?}",
                    rec.distinct(),
                    rec.missing(&self.source).first()
                )
            });
        assert!(self.audit.violations().is_empty(), "{:?}", self.audit.violations());
        assert!(self.rec.overlaps().is_empty(), "{:?}", self.rec.overlaps());
    }
}

#[test]
fn invalid_config_is_a_clear_error_when_the_worker_is_built() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("app".parse().unwrap()));
    let source: Arc<dyn ShardSource> = Arc::new(MemorySource::new(1));
    let cases: Vec<(Config, &str)> = vec![
        (
            {
                let c = Config::new("app").unwrap();
                let twice = c.heartbeat_interval() * 2;
                c.with_failover_timeout(twice)
            },
            "failover_timeout",
        ),
        (Config::new("app").unwrap().with_max_leases_per_worker(0), "max_leases_per_worker"),
        (Config::new("app").unwrap().with_worker_id(""), "worker id"),
        (Config::new("app").unwrap().with_worker_id("w#2"), "must not contain '#'"),
        // The store is opened on "app": a Config naming another namespace is refused.
        (Config::new("other").unwrap(), "opened on namespace \"app\""),
    ];
    for (cfg, needle) in cases {
        let built =
            Worker::builder(cfg, store.clone(), source.clone(), Recorder::new().factory()).build();
        match built {
            Err(Error::Config(m)) => assert!(m.contains(needle), "{m}"),
            Err(e) => panic!("expected a config error about {needle}, got {e}"),
            Ok(_) => panic!("expected a config error about {needle}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_lease_is_reported_and_the_others_keep_going() {
    let (logs, _g) = capture();
    let mut w = world(6, 600, 1);
    w.cluster.sync_shards().await.unwrap();
    let bad = LeaseKey::new("shardId-000000000003");
    w.faults.corrupt(&bad);
    w.cluster.start_workers(2).unwrap();
    let rec = &w.rec;
    let good: usize = w
        .source
        .shards()
        .iter()
        .filter(|s| s.id != bad)
        .map(|s| w.source.records(&s.id).len())
        .sum();
    wait_until("every record of the good shards", LONG, HB, || async { rec.distinct() == good })
        .await
        .unwrap();
    assert!(logs.text().contains("corrupt lease record skipped"), "{}", logs.text());
    assert!(logs.text().contains("shardId-000000000003"));
    // Once the record is readable again (repaired by an operator), it is processed too.
    w.faults.uncorrupt(&bad);
    w.all_processed().await;
    w.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn processor_errors_are_retried_and_nothing_is_skipped() {
    let (logs, _g) = capture();
    let mut w = world(4, 400, 2);
    w.rec.fail_next(7);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_workers(2).unwrap();
    w.all_processed().await;
    assert_eq!(w.rec.errors_returned(), 7);
    assert!(
        logs.text().contains("record processor failed; retrying the same input"),
        "{}",
        logs.text()
    );
    w.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_processor_panic_is_contained_and_the_shard_resumes() {
    let (logs, _g) = capture();
    let mut w = world(4, 400, 3);
    w.rec.panic_next(3);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_workers(2).unwrap();
    w.all_processed().await;
    assert_eq!(w.rec.panics(), 3);
    let text = logs.text();
    assert!(text.contains("record processor panicked; releasing the lease"), "{text}");
    assert!(text.contains("lease released"), "{text}");
    w.cluster.shutdown_all().await;
}

/// A processor that gives its lease up (`Error::ReleaseLease`, as the MultiLang daemon does when
/// its child process dies) is told the lease is lost, the lease is released, and a new processor
/// resumes the shard from its checkpoint: the records delivered to the one that gave up and not
/// checkpointed are delivered again, none is skipped, and nothing counts as a panic.
#[tokio::test(start_paused = true)]
async fn a_processor_that_gives_its_lease_up_releases_it_and_the_shard_resumes() {
    let (logs, _g) = capture();
    let mut w = world(4, 400, 7);
    w.rec.give_up_next(3);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_workers(2).unwrap();
    w.all_processed().await;
    assert_eq!(w.rec.gave_up(), 3);
    assert_eq!(w.rec.panics(), 0);
    assert!(w.rec.duplicates() > 0, "the batches given up were delivered again");
    assert!(w.rec.lost() >= 3, "each processor that gave up heard lease_lost: {}", w.rec.lost());
    let text = logs.text();
    assert!(text.contains("record processor gave the lease up; releasing it"), "{text}");
    assert!(text.contains("requested give-up while processing"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    w.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_store_failing_a_fifth_of_calls_loses_nothing() {
    let mut w = world(8, 0, 4);
    w.cluster.sync_shards().await.unwrap();
    w.faults.set_error_rate(0.2);
    w.faults.set_latency(Duration::from_millis(1), Duration::from_millis(30));
    w.cluster.start_workers(3).unwrap();
    // A minute of records, so heartbeats, balance passes and checkpoints all meet the faults.
    let source = w.source.clone();
    for i in 0..1_200 {
        source.put(&format!("k{i}"), "x");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.all_processed().await;
    assert!(
        w.faults.injected_errors() > 100,
        "faults were injected: {}",
        w.faults.injected_errors()
    );
    w.faults.clear();
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    w.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_worker_stops_before_its_leases_move_and_its_late_checkpoint_is_refused() {
    let (logs, _g) = capture();
    let mut w = world(6, 0, 5);
    w.cluster.sync_shards().await.unwrap();
    let ids = w.cluster.start_workers(2).unwrap();
    w.cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    let (a, b) = (ids[0].clone(), ids[1].clone());
    let held: Vec<_> = w
        .cluster
        .leases()
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.owner.as_ref() == Some(&a))
        .collect();
    assert_eq!(held.len(), 3);
    let stale = held[0].token().unwrap();

    // Records keep flowing while A is cut off from the store, past its failover timeout.
    let producer = {
        let source = w.source.clone();
        tokio::spawn(async move {
            for i in 0..600 {
                source.put(&format!("p{i}"), "x");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    w.faults.partition(&a);
    let cluster = &w.cluster;
    wait_until("B owns every lease", LONG, HB / 10, || async {
        let cov = cluster.coverage().await.unwrap();
        cov.shares.get(&b) == Some(&6)
    })
    .await
    .unwrap();
    // A fenced itself (and stopped processing) before B took anything: no shard was processed
    // under two epochs at once.
    let a_handle = w.cluster.handle(&a).unwrap();
    assert!(a_handle.stats().fenced >= 1, "{:?}", a_handle.stats());
    assert!(a_handle.held_leases().is_empty());
    assert!(
        logs.text().contains("no successful heartbeat for failover_timeout"),
        "{}",
        logs.text()
    );
    assert!(w.rec.overlaps().is_empty(), "{:?}", w.rec.overlaps());

    // Healed, A's late checkpoint with its old token is refused and changes nothing.
    w.faults.heal(&a);
    let store = w.cluster.store().clone();
    let before = store.get_lease(&stale.key).await.unwrap().unwrap().lease.checkpoint;
    let late = StoreCheckpointer::new(store.clone())
        .checkpoint(&stale, &Position::sequence(SequenceNumber::from(u128::MAX)))
        .await;
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
    assert_eq!(store.get_lease(&stale.key).await.unwrap().unwrap().lease.checkpoint, before);

    // A comes back as a new incarnation and the fleet rebalances; nothing was lost.
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    assert_ne!(w.cluster.handle(&a).unwrap().id(), a, "A returned under a new incarnation id");
    producer.await.unwrap();
    w.all_processed().await;
    w.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_vanished_namespace_is_reported_loudly_and_rebuilt_from_the_last_listing() {
    let (logs, _g) = capture();
    let mut w = world(4, 200, 6);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_workers(2).unwrap();
    w.all_processed().await;
    // Let every worker list the leases once more, so they have seen the final checkpoints.
    let cluster = &w.cluster;
    let passes = |c: &Cluster| -> Vec<u64> {
        c.running().iter().map(|id| c.handle(id).unwrap().stats().passes).collect()
    };
    let seen = passes(cluster);
    wait_until("a balance pass on every worker", LONG, HB, || async {
        passes(cluster).iter().zip(&seen).all(|(now, then)| now > then)
    })
    .await
    .unwrap();
    // The store loses everything (think: Redis restarted without persistence).
    let store = w.cluster.store().clone();
    let before = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: l, version: v } in &before {
        store.delete_lease(&l.key, *v).await.unwrap();
    }
    let cluster = &w.cluster;
    wait_until("leases recreated and owned", LONG, HB, || async {
        let cov = cluster.coverage().await.unwrap();
        cov.active == 4 && cluster.is_balanced().await
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", logs.text()));
    let text = logs.text();
    assert!(text.contains("every lease of the namespace vanished"), "{text}");
    assert!(text.contains("ERROR"), "{text}");
    // Rebuilt from what the workers remember: epochs never go down (downstream fencing tokens
    // never move backwards; an owner still running a lease keeps its epoch) and processing resumes
    // from checkpoints, not from scratch.
    let after = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: old, .. } in &before {
        let new = &after.iter().find(|v| v.lease.key == old.key).unwrap().lease;
        assert!(new.epoch >= old.epoch, "{old:?} → {new:?}");
    }
    assert!(
        after.iter().any(|v| matches!(v.lease.checkpoint, Position::Sequence { .. })),
        "resumed from checkpoints: {after:?}"
    );
    for i in 0..100 {
        w.source.put(&format!("after-{i}"), "x");
    }
    w.all_processed().await;
    assert_eq!(w.rec.duplicates(), 0, "resumed from the final checkpoints");
    w.cluster.shutdown_all().await;
}

/// The lease listings each running worker's balance passes have made so far (a quiet pass does
/// not look at the store, so only a listing shows that a worker saw what a test changed there).
fn passes(c: &Cluster) -> Vec<u64> {
    c.running().iter().map(|id| c.handle(id).unwrap().stats().lease_listings).collect()
}

/// Waits until every running worker has listed the leases `n` more times.
async fn more_passes(c: &Cluster, n: u64) {
    let seen = passes(c);
    wait_until("more balance passes on every worker", LONG, HB, || async {
        passes(c).iter().zip(&seen).all(|(now, then)| *now >= then + n)
    })
    .await
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_parent_blocks_its_children_until_it_is_repaired() {
    let (logs, _g) = capture();
    let mut w = world(1, 30, 7);
    let parent = w.source.shards()[0].id.clone();
    w.source.split(&parent).unwrap();
    for i in 0..20 {
        w.source.put(&format!("child-{i}"), "to a child");
    }
    w.cluster.sync_shards().await.unwrap();
    w.faults.corrupt(&parent);
    w.cluster.start_workers(2).unwrap();
    more_passes(&w.cluster, 10).await;
    assert_eq!(w.rec.distinct(), 0, "a child started while its parent was unreadable");
    assert!(logs.text().contains("corrupt lease record skipped"), "{}", logs.text());
    w.faults.uncorrupt(&parent);
    w.all_processed().await;
    let order = w.rec.order_violations(&w.source);
    assert!(order.is_empty(), "{order:?}");
    w.cluster.shutdown_all().await;
}

/// The store loses every lease and a worker that never saw them (a fresh process) re-creates
/// them at the initial position before the running workers notice: the running workers still
/// restore their last checkpoints (nothing is processed again) and epochs only go up.
#[tokio::test(start_paused = true)]
async fn a_wiped_namespace_is_restored_even_when_a_fresh_create_got_there_first() {
    let (logs, _g) = capture();
    let mut w = world(4, 200, 8);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_workers(2).unwrap();
    w.all_processed().await;
    more_passes(&w.cluster, 1).await;
    let store = w.cluster.store().clone();
    let before = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: l, version: v } in &before {
        store.delete_lease(&l.key, *v).await.unwrap();
    }
    w.cluster.sync_shards().await.unwrap(); // a fresh worker's shard sync, at TRIM_HORIZON
    more_passes(&w.cluster, 2).await;
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    let after = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: old, .. } in &before {
        let new = &after.iter().find(|v| v.lease.key == old.key).unwrap().lease;
        assert!(new.epoch >= old.epoch, "{old:?} → {new:?}");
        assert!(!old.checkpoint.would_regress_to(&new.checkpoint), "{old:?} → {new:?}");
    }
    let text = logs.text();
    assert!(text.contains("every lease of the namespace vanished"), "{text}");
    assert!(text.contains("lost leases"), "{text}");
    for i in 0..100 {
        w.source.put(&format!("after-{i}"), "x");
    }
    w.all_processed().await;
    assert_eq!(w.rec.duplicates(), 0, "processing resumed from the restored checkpoints");
    w.cluster.shutdown_all().await;
}

/// The store rolls back to an older copy of every lease (a failover to a lagging replica): older
/// checkpoints, older owners, older epochs. Both workers remember newer ones and restore them,
/// racing each other; no epoch ends below what was handed out before the rollback (an owner that
/// kept running its lease keeps its epoch).
#[tokio::test(start_paused = true)]
async fn a_rolled_back_store_is_repaired_and_epochs_never_go_backwards() {
    let (logs, _g) = capture();
    let mut w = world(6, 300, 9);
    w.cluster.sync_shards().await.unwrap();
    w.cluster.start_worker().unwrap();
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    let store = w.cluster.store().clone();
    let old_copy = store.list_leases().await.unwrap().items;
    // Owners change (a join moves half the leases), checkpoints advance.
    w.cluster.start_worker().unwrap();
    for i in 0..300 {
        w.source.put(&format!("more-{i}"), "x");
    }
    w.all_processed().await;
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    more_passes(&w.cluster, 1).await;
    let newest = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: old, .. } in &old_copy {
        let VersionedLease { version: v, .. } =
            newest.iter().find(|v| v.lease.key == old.key).unwrap();
        store.update_lease(old, *v).await.unwrap();
    }
    more_passes(&w.cluster, 2).await;
    w.cluster.wait_balanced(LONG, HB).await.unwrap();
    let repaired = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: l, .. } in &repaired {
        let VersionedLease { lease: before, .. } =
            newest.iter().find(|v| v.lease.key == l.key).unwrap();
        assert!(
            l.epoch >= before.epoch,
            "{} at epoch {} after {} was handed out: {}",
            l.key,
            l.epoch,
            before.epoch,
            logs.text()
        );
        assert!(!before.checkpoint.would_regress_to(&l.checkpoint), "{before:?} → {l:?}");
    }
    for i in 0..100 {
        w.source.put(&format!("after-{i}"), "x");
    }
    w.all_processed().await;
    assert_eq!(w.rec.duplicates(), 0, "processing resumed from the newest checkpoints");
    assert!(w.audit.violations().is_empty(), "{:?}", w.audit.violations());
    w.cluster.shutdown_all().await;
}

/// A processor error that retrying cannot fix (here a checkpoint behind the stored one, wrapped
/// by the user's own error type) is logged once at ERROR with what to do, counted as a stuck
/// lease, and retried with a backoff that grows to a minute instead of being spun on; the lease
/// recovers as soon as the processor does.
#[tokio::test(start_paused = true)]
async fn an_error_retrying_cannot_fix_marks_the_lease_stuck_and_backs_off() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[derive(Debug)]
    struct Wrapped(Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("writing the batch's summary")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    struct Stubborn {
        failing: Arc<AtomicBool>,
        attempts: Arc<AtomicU64>,
    }
    #[async_trait::async_trait]
    impl shardlease_core::RecordProcessor for Stubborn {
        async fn process_records(
            &mut self,
            batch: &shardlease_core::Batch,
            cp: &shardlease_core::CheckpointHandle,
        ) -> std::result::Result<(), shardlease_core::BoxError> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) {
                let e = Error::InvalidInput("checkpoint would move backwards".into());
                return Err(Box::new(Wrapped(e)));
            }
            cp.checkpoint_batch(batch).await?;
            Ok(())
        }
    }

    let (logs, _g) = capture();
    let failing = Arc::new(AtomicBool::new(true));
    let attempts = Arc::new(AtomicU64::new(0));
    let factory = {
        let (failing, attempts) = (failing.clone(), attempts.clone());
        move |_: &shardlease_core::LeaseContext| -> Box<dyn shardlease_core::RecordProcessor> {
            Box::new(Stubborn { failing: failing.clone(), attempts: attempts.clone() })
        }
    };
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("stuck".parse().unwrap()));
    let source = MemorySource::new(1);
    source.put("k", "a record");
    let cfg = Config::new("stuck")
        .unwrap()
        .with_heartbeat(Duration::from_secs(1))
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(store, src, Arc::new(factory), cfg);
    cluster.sync_shards().await.unwrap();
    let id = cluster.start_worker().unwrap();
    let stats = || cluster.handle(&id).unwrap().stats();
    wait_until(
        "the lease marked stuck",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { stats().stuck == 1 },
    )
    .await
    .unwrap();
    // Ten minutes stuck: the delay grows to a minute, so a few dozen attempts, not thousands
    // (the usual retry delay here is one heartbeat at most: 600 or more).
    let before = attempts.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(600)).await;
    let during = attempts.load(Ordering::SeqCst) - before;
    assert!((5..=30).contains(&during), "{during} attempts in ten minutes");
    assert_eq!(stats().stuck, 1);
    let text = logs.text();
    assert_eq!(text.matches("the lease is stuck").count(), 1, "{text}");
    assert!(text.contains("checkpoint would move backwards"), "the cause is logged: {text}");
    failing.store(false, Ordering::SeqCst);
    wait_until(
        "the lease recovered",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { stats().stuck == 0 && stats().records == 1 },
    )
    .await
    .unwrap();
    cluster.shutdown_all().await;
}
