//! A fleet on the in-process fake: workers share a stream whose shards rotate every few changes
//! (parents still listed open after their children appear, children listed some calls late),
//! whose iterators expire and whose calls are throttled, while a writer keeps changing items.
//! Workers join and one leaves gracefully. Every change is processed exactly once per lineage,
//! in order per item, and no change of a child before the last change of its parent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{processor_fn, Config, Position, ShardSource, Worker, WorkerHandle};

use crate::change::{ChangeEvent, EventName};
use crate::config::ReadConfig;
use crate::fake::FakeStreams;
use crate::source::DynamoDbStreamsSource;

/// Every delivery: (shard, seq, key), in the order processors saw them.
type Log = Arc<Mutex<Vec<(String, String, String)>>>;

fn quick_reads() -> ReadConfig {
    ReadConfig {
        max_records: 3,
        min_call_interval: Duration::from_millis(5),
        idle_interval: Duration::from_millis(20),
        base_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(50),
        describe_calls_per_second: 200,
        listing_max_age: Duration::from_millis(20),
        children_retry_interval: Duration::from_millis(20),
        ..ReadConfig::default()
    }
}

fn start(
    id: &str,
    store: &Arc<dyn LeaseStore>,
    source: &Arc<dyn ShardSource>,
    log: &Log,
) -> WorkerHandle {
    let config = Config::new("ddb-fleet")
        .unwrap()
        .with_worker_id(id)
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon);
    let log = log.clone();
    let factory = processor_fn(move |ctx, batch| {
        let log = log.clone();
        async move {
            let mut log = log.lock().unwrap();
            for r in batch.records.iter() {
                let change = ChangeEvent::from_record(r).unwrap();
                log.push((
                    ctx.key().as_str().to_owned(),
                    r.seq.as_str().to_owned(),
                    change.key_json(),
                ));
            }
            Ok(())
        }
    });
    Worker::builder(config, store.clone(), source.clone(), factory).build().unwrap().start()
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reads_every_change_once_through_rotations_and_faults() {
    let fake = FakeStreams::with_lineages(3);
    fake.rotate_every(7).parent_listed_open_for(3).children_hidden_for(2).expire_every(11);
    let source: Arc<dyn ShardSource> =
        Arc::new(DynamoDbStreamsSource::with_api(fake.clone(), quick_reads()).unwrap());
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("ddb-fleet".parse().unwrap()));
    let log: Log = Arc::default();
    let written: Arc<Mutex<Vec<String>>> = Arc::default();
    let write = |from: usize, n: usize| {
        for i in from..from + n {
            let event = [EventName::Insert, EventName::Modify, EventName::Remove][i % 3];
            if let Some(seq) = fake.put(&format!("k{}", i % 20), event) {
                written.lock().unwrap().push(seq);
            }
        }
    };
    let all_read = |log: &Log, written: &Arc<Mutex<Vec<String>>>| {
        let seen: std::collections::HashSet<String> =
            log.lock().unwrap().iter().map(|(_, s, _)| s.clone()).collect();
        written.lock().unwrap().iter().all(|s| seen.contains(s))
    };

    write(0, 40);
    let a = start("a", &store, &source, &log);
    let b = start("b", &store, &source, &log);
    eventually("the first changes read", || all_read(&log, &written)).await;
    write(40, 40);
    fake.throttle_describe(3).throttle_get_records(5);
    let c = start("c", &store, &source, &log);
    write(80, 40);
    eventually("the changes after the join read", || all_read(&log, &written)).await;
    // A graceful leave: its leases are checkpointed, released and taken over.
    b.shutdown().await;
    write(120, 60);
    eventually("every change read", || all_read(&log, &written)).await;
    a.shutdown().await;
    c.shutdown().await;

    let events = log.lock().unwrap().clone();
    let written = written.lock().unwrap().clone();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, seq, _) in &events {
        *seen.entry(seq.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "read more than once: {twice:?}");
    assert_eq!(events.len(), written.len(), "exactly the changes written");

    // In order per item (one item's changes stay in one lineage; sequence numbers grow).
    let mut per_key: BTreeMap<&str, Vec<u128>> = BTreeMap::new();
    for (_, seq, key) in &events {
        per_key.entry(key.as_str()).or_default().push(seq.parse().unwrap());
    }
    for (key, seqs) in &per_key {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {seqs:?}");
    }

    // No change of a child before the last change of its parent.
    let shards = fake.all_records();
    let first = |shard: &str| events.iter().position(|(s, _, _)| s == shard);
    let last = |shard: &str| events.iter().rposition(|(s, _, _)| s == shard);
    let mut rotations = 0;
    for child in &shards {
        if let Some(parent) = &child.parent {
            rotations += 1;
            if let (Some(c), Some(p)) = (first(&child.id), last(parent)) {
                assert!(p < c, "{} read before its parent {parent} was done", child.id);
            }
        }
    }
    assert!(rotations >= 20, "the stream rotated: {rotations}");
    println!(
        "changes {} / read {} / rotations {rotations} / DescribeStream calls {} ({:.1} per rotation, 3 workers, throttled 3)",
        written.len(),
        events.len(),
        fake.describe_calls(),
        fake.describe_calls() as f64 / f64::from(rotations),
    );
}
