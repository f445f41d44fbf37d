//! The fleet scenario both sources run (polling on kinesalite, fan-out on ferrokinesis): two
//! workers, then a third that joins, share a stream of two shards through an in-memory lease
//! store while records are put before and after a split and a merge. Every record is processed
//! exactly once, and no record of a child shard is processed before the last record of each of
//! its parents. Also the delivery log and worker start-up the other fleet tests use.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    processor_fn, Batch, Config, LeaseContext, LeaseKey, Position, SequenceNumber, ShardSource,
    Worker, WorkerHandle,
};

use super::{eventually, Emulator};

const QUARTER: u128 = 1 << 126;

/// One processed user record: shard, sequence number, sub-sequence number.
pub type Id = (String, SequenceNumber, u64);

/// Every delivery, in the order processors saw them (one global order across workers).
#[derive(Clone, Default)]
pub struct Log {
    events: Arc<Mutex<Vec<(Id, String)>>>,
}

impl Log {
    pub fn events(&self) -> Vec<(Id, String)> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn ids(&self) -> BTreeSet<Id> {
        self.events().into_iter().map(|(id, _)| id).collect()
    }

    /// Records the deliveries of `batch` to the processor of `ctx`'s lease.
    pub fn record(&self, ctx: &LeaseContext, batch: &Batch) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        for r in batch.records.iter() {
            let id = (ctx.key().as_str().to_owned(), r.seq.clone(), r.sub);
            events.push((id, String::from_utf8_lossy(&r.data).into_owned()));
        }
    }

    pub fn factory(&self) -> Arc<dyn shardlease_core::ProcessorFactory> {
        let log = self.clone();
        processor_fn(move |ctx, batch| {
            let log = log.clone();
            async move {
                log.record(&ctx, &batch);
                Ok(())
            }
        })
    }
}

pub fn seq(s: &str) -> SequenceNumber {
    SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

pub async fn start(
    config: &Config,
    id: &str,
    store: &Arc<dyn LeaseStore>,
    source: &Arc<dyn ShardSource>,
    log: &Log,
) -> WorkerHandle {
    let config = config.clone().with_worker_id(id);
    Worker::builder(config, store.clone(), source.clone(), log.factory())
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start()
}

/// What a fleet run delivered.
#[derive(Debug)]
pub struct Outcome {
    /// Records put.
    pub records: usize,
    /// Deliveries to processors.
    pub processed: usize,
    /// Records delivered more than once.
    pub twice: usize,
    /// Leases handed over between workers.
    pub handoffs: u64,
}

/// Runs the scenario on `stream` (two shards, freshly created) read through `source`.
pub async fn reshard_fleet(k: &Emulator, stream: &str, source: Arc<dyn ShardSource>) -> Outcome {
    let stream = stream.to_owned();

    let store: Arc<dyn LeaseStore> = Arc::new(
        MemoryBackend::new().store("kinesis-fleet".parse().unwrap_or_else(|e| panic!("{e}"))),
    );
    let config = Config::new("kinesis-fleet")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon);
    let log = Log::default();
    let mut expected: BTreeMap<Id, String> = BTreeMap::new();
    let put = |round: &str, n: usize| {
        let k = &k;
        let stream = &stream;
        let round = round.to_owned();
        async move {
            let mut out = Vec::new();
            for i in 0..n {
                let data = format!("{round}-{i}");
                let (shard, s) = k.put(stream, &format!("key-{round}-{i}"), data.clone()).await;
                out.push(((shard, seq(&s), 0), data));
            }
            out
        }
    };
    expected.extend(put("before", 40).await);

    let a = start(&config, "worker-a", &store, &source, &log).await;
    let b = start(&config, "worker-b", &store, &source, &log).await;
    expected.extend(put("running", 40).await);
    let processed_so_far = |expected: &BTreeMap<Id, String>| {
        let want: BTreeSet<Id> = expected.keys().cloned().collect();
        let log = log.clone();
        async move { want.is_subset(&log.ids()).then_some(()) }
    };
    // Reshard while the readers sit at the tip of the shards they hold.
    eventually("the first records processed", || processed_so_far(&expected)).await;
    // Shard 0 (0 ..< 2^127) splits into 2 (0 ..< 2^126) and 3 (2^126 ..< 2^127).
    k.split(&stream, "shardId-000000000000", QUARTER).await;
    expected.extend(put("split", 40).await);
    eventually("the split's records processed", || processed_so_far(&expected)).await;
    // A third worker joins: leases are handed over (checkpoint, release) while batches are read
    // ahead, and nothing may be read twice or skipped for it.
    let c = start(&config, "worker-c", &store, &source, &log).await;
    // Every lease was held: the newcomer can only get one by a handoff.
    eventually("a lease handed to the newcomer", || async {
        (!c.held_leases().is_empty()).then_some(())
    })
    .await;
    expected.extend(put("joined", 40).await);
    // Shards 3 and 1 (2^127 ..= max) are adjacent: they merge into 4.
    k.merge(&stream, "shardId-000000000003", "shardId-000000000001").await;
    expected.extend(put("merged", 40).await);
    assert!(
        expected.keys().any(|(s, _, _)| s == "shardId-000000000004"),
        "records reach the merge"
    );

    let want: BTreeSet<Id> = expected.keys().cloned().collect();
    eventually("every record processed", || async { want.is_subset(&log.ids()).then_some(()) })
        .await;
    let handoffs: u64 = [&a, &b, &c].iter().map(|w| w.stats().handoffs).sum();
    assert!(handoffs >= 1, "the join moved a lease by handoff");
    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;

    let events = log.events();
    // Exactly once per shard, with the data that was put.
    let mut seen: HashMap<&Id, usize> = HashMap::new();
    for (id, data) in &events {
        *seen.entry(id).or_default() += 1;
        assert_eq!(expected.get(id), Some(data), "{id:?} was not put");
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let outcome =
        Outcome { records: expected.len(), processed: events.len(), twice: twice.len(), handoffs };
    println!(
        "records {} / processed {} / twice {} (handoffs {})",
        outcome.records, outcome.processed, outcome.twice, outcome.handoffs
    );
    assert!(twice.is_empty(), "processed more than once: {twice:?}");
    assert_eq!(events.len(), expected.len());
    // Children after parents: a child's first record after each parent's last.
    let listed = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    let first = |shard: &LeaseKey| events.iter().position(|(id, _)| id.0 == shard.as_str());
    let last = |shard: &LeaseKey| events.iter().rposition(|(id, _)| id.0 == shard.as_str());
    for child in &listed {
        for parent in &child.parents {
            if let (Some(c), Some(p)) = (first(&child.id), last(parent)) {
                assert!(p < c, "{} read before its parent {parent} was done", child.id);
            }
        }
    }
    assert_eq!(
        listed.iter().find(|s| s.id.as_str() == "shardId-000000000004").map(|s| s.parents.clone()),
        Some(vec![LeaseKey::from("shardId-000000000003"), LeaseKey::from("shardId-000000000001")])
    );
    outcome
}
