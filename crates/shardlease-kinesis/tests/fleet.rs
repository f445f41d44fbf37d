//! End to end: two workers (then a third that joins) share a kinesalite stream through an in-memory lease store while
//! records are put before and after a split and a merge. Every record is processed exactly once,
//! and no record of a child shard is processed before the last record of each of its parents.
//! Then a worker restarts and resumes inside a KPL aggregate from its checkpoint.

mod common;

use shardlease_core::store::VersionedLease;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{emulator, eventually, fast_reads};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    processor_fn, Config, LeaseKey, Position, SequenceNumber, ShardSource, Worker, WorkerHandle,
};
use shardlease_kinesis::kpl::{self, UserRecord};

const QUARTER: u128 = 1 << 126;

/// One processed user record: shard, sequence number, sub-sequence number.
type Id = (String, SequenceNumber, u64);

/// Every delivery, in the order processors saw them (one global order across workers).
#[derive(Clone, Default)]
struct Log {
    events: Arc<Mutex<Vec<(Id, String)>>>,
}

impl Log {
    fn events(&self) -> Vec<(Id, String)> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn ids(&self) -> BTreeSet<Id> {
        self.events().into_iter().map(|(id, _)| id).collect()
    }

    fn factory(&self) -> Arc<dyn shardlease_core::ProcessorFactory> {
        let log = self.clone();
        processor_fn(move |ctx, batch| {
            let log = log.clone();
            async move {
                let mut events = log.events.lock().unwrap_or_else(|p| p.into_inner());
                for r in batch.records.iter() {
                    let id = (ctx.key().as_str().to_owned(), r.seq.clone(), r.sub);
                    events.push((id, String::from_utf8_lossy(&r.data).into_owned()));
                }
                Ok(())
            }
        })
    }
}

fn seq(s: &str) -> SequenceNumber {
    SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

async fn start(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_read_everything_once_across_a_split_and_a_merge() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(2).await;
    let source: Arc<dyn ShardSource> = Arc::new(k.source(&stream, fast_reads()).await);
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
    a.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    b.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    c.shutdown().await.unwrap_or_else(|e| panic!("{e}"));

    let events = log.events();
    // Exactly once per shard, with the data that was put.
    let mut seen: HashMap<&Id, usize> = HashMap::new();
    for (id, data) in &events {
        *seen.entry(id).or_default() += 1;
        assert_eq!(expected.get(id), Some(data), "{id:?} was not put");
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
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
    k.delete(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_resumes_inside_an_aggregate() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(1).await;
    let mut read = fast_reads();
    read.max_records = 1; // one Kinesis record per batch
    let source: Arc<dyn ShardSource> = Arc::new(k.source(&stream, read).await);
    let store: Arc<dyn LeaseStore> = Arc::new(
        MemoryBackend::new().store("kinesis-resume".parse().unwrap_or_else(|e| panic!("{e}"))),
    );
    let config = Config::new("kinesis-resume")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon);
    let users: Vec<UserRecord> = (0..6)
        .map(|i| UserRecord {
            partition_key: format!("u{i}"),
            explicit_hash_key: None,
            data: Bytes::from(format!("u{i}")),
        })
        .collect();
    let (_, agg) = k.put(&stream, "agg", kpl::aggregate(&users)).await;
    let agg = seq(&agg);

    // A processor that checkpoints user record by user record and stops after the third.
    let processed = Arc::new(Mutex::new(Vec::<u64>::new()));
    let factory = {
        let processed = processed.clone();
        let factory: Arc<dyn shardlease_core::ProcessorFactory> =
            Arc::new(move |_ctx: &shardlease_core::LeaseContext| {
                Box::new(Partial { processed: processed.clone() })
                    as Box<dyn shardlease_core::RecordProcessor>
            });
        factory
    };
    let cfg = config.clone().with_worker_id("first");
    let first = Worker::builder(cfg, store.clone(), source.clone(), factory)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start();
    eventually("three user records checkpointed", || async {
        let VersionedLease { lease, .. } =
            store.get_lease(&LeaseKey::from("shardId-000000000000")).await.ok()??;
        (lease.checkpoint == Position::Sequence { seq: agg.clone(), sub: 2 }).then_some(())
    })
    .await;
    first.shutdown().await.unwrap_or_else(|e| panic!("{e}"));

    // A new worker picks up at the checkpoint: user records 3, 4, 5 and nothing before.
    let log = Log::default();
    let second = start(&config, "second", &store, &source, &log).await;
    eventually("the rest of the aggregate", || async { (log.events().len() >= 3).then_some(()) })
        .await;
    second.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let subs: Vec<u64> = log.events().iter().map(|((_, _, sub), _)| *sub).collect();
    assert_eq!(subs, [3, 4, 5]);
    assert_eq!(*processed.lock().unwrap_or_else(|p| p.into_inner()), [0, 1, 2]);
    k.delete(&stream).await;
}

/// Processes user records one at a time, checkpointing each, and stops after three: later
/// batches fail (retried) so the checkpoint stays inside the aggregate.
struct Partial {
    processed: Arc<Mutex<Vec<u64>>>,
}

#[async_trait::async_trait]
impl shardlease_core::RecordProcessor for Partial {
    async fn process_records(
        &mut self,
        batch: &shardlease_core::Batch,
        checkpointer: &shardlease_core::CheckpointHandle,
    ) -> Result<(), shardlease_core::BoxError> {
        for r in batch.records.iter() {
            let done = self.processed.lock().unwrap_or_else(|p| p.into_inner()).len();
            if done >= 3 {
                return Err("stopping here on purpose".into());
            }
            self.processed.lock().unwrap_or_else(|p| p.into_inner()).push(r.sub);
            checkpointer.checkpoint(r.position()).await?;
        }
        Ok(())
    }
}
