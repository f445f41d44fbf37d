//! End to end through enhanced fan-out on the in-process ferrokinesis: the fleet scenario of
//! [`common::fleet`] (two workers, a third joining so leases move between workers while their
//! subscriptions are open, a split and a merge), with subscription sessions of 400 ms so
//! they also end and renew throughout. Every record is processed exactly once, children after
//! parents. Then workers join, leave and crash under a steady producer.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use common::ferro::{fan_out, ferrokinesis};
use common::fleet::{reshard_fleet, seq, start, Id, Log};
use common::{eventually, fast_reads};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, Position, ShardSource, WorkerHandle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reads_everything_once_while_leases_move_between_subscribed_workers() {
    let k = ferrokinesis(Duration::from_millis(400)).await;
    let stream = k.create_stream(2).await;
    let source: Arc<dyn ShardSource> =
        Arc::new(k.fan_out_source(&stream, fan_out("fleet"), fast_reads()).await);
    let outcome = reshard_fleet(&k, &stream, source).await;
    assert!(outcome.handoffs >= 1);
}

/// Workers come and go while a producer writes: three start, a fourth joins, one leaves
/// gracefully, one crashes. Each worker builds its own source (finding the one consumer), as
/// separate processes would. Nothing is processed twice up to the crash (an owner checkpoints
/// before it lets a lease go); the crash may deliver again what its victim processed after its
/// last checkpoint; every record is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_join_leave_and_crash_while_subscribed() {
    let k = ferrokinesis(Duration::from_secs(1)).await;
    let shards = 4;
    let stream = k.create_stream(shards).await;
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("efo-churn".parse().unwrap_or_else(|e| panic!("{e}"))));
    let config = Config::new("efo-churn")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon);
    let log = Log::default();
    let worker = |id: &'static str| {
        let (k, stream, store, config, log) = (&k, &stream, &store, &config, &log);
        async move {
            let source: Arc<dyn ShardSource> =
                Arc::new(k.fan_out_source(stream, fan_out("churn"), fast_reads()).await);
            start(config, id, store, &source, log).await
        }
    };
    // The producer: one record every 10 ms until told to stop; returns what it put.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (client, stream, stop) = (k.client.clone(), stream.clone(), stop.clone());
        tokio::spawn(async move {
            let mut put: BTreeSet<Id> = BTreeSet::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let out = client
                    .put_record()
                    .stream_name(&stream)
                    .partition_key(format!("{:016x}", rand::random::<u64>()))
                    .data(Blob::new(format!("r{i}")))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("put: {e:?}"));
                put.insert((out.shard_id, seq(&out.sequence_number), 0));
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            put
        })
    };
    let held = |ws: &[&WorkerHandle]| ws.iter().map(|w| w.held_leases().len()).sum::<usize>();
    let n = usize::try_from(shards).unwrap_or(0);
    let w0 = worker("w0").await;
    let w1 = worker("w1").await;
    let w2 = worker("w2").await;
    eventually("every lease held", || async { (held(&[&w0, &w1, &w2]) == n).then_some(()) }).await;
    let w3 = worker("w3").await;
    eventually("a lease handed to the newcomer", || async {
        (!w3.held_leases().is_empty()).then_some(())
    })
    .await;
    w1.shutdown().await;
    eventually("the leaver's leases taken", || async {
        (held(&[&w0, &w2, &w3]) == n).then_some(())
    })
    .await;
    // Up to the crash nothing may have been processed twice.
    let so_far = log.ids().len();
    eventually("more records processed after the leave", || async {
        (log.ids().len() > so_far + 10).then_some(())
    })
    .await;
    let twice_graceful = log.events().len() - log.ids().len();
    drop(w2); // a crash: nothing released, no record removed
    eventually("the crashed worker's leases taken", || async {
        (held(&[&w0, &w3]) == n).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let put = producer.await.unwrap_or_else(|e| panic!("{e}"));
    eventually("every record processed", || async { put.is_subset(&log.ids()).then_some(()) })
        .await;
    w0.shutdown().await;
    w3.shutdown().await;
    let events = log.events();
    let mut seen: HashMap<&Id, usize> = HashMap::new();
    for (id, _) in &events {
        *seen.entry(id).or_default() += 1;
    }
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "efo churn: records {} / processed {} / twice {} (before the crash {twice_graceful})",
        put.len(),
        events.len(),
        twice
    );
    assert_eq!(twice_graceful, 0, "a start, a join or a leave processed something twice");
    assert!(seen.keys().all(|id| put.contains(*id)), "processed a record that was not put");
}
