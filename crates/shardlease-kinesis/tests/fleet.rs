//! End to end on kinesalite (polling): the fleet scenario of [`common::fleet`] (join, split,
//! merge; every record exactly once, children after parents), then a worker restarts and resumes
//! inside a KPL aggregate from its checkpoint.

mod common;

use shardlease_core::store::VersionedLease;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::fleet::{reshard_fleet, seq, start, Log};
use common::{emulator, eventually, fast_reads};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, LeaseKey, Position, ShardSource, Worker};
use shardlease_kinesis::kpl::{self, UserRecord};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_read_everything_once_across_a_split_and_a_merge() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(2).await;
    let source: Arc<dyn ShardSource> = Arc::new(k.source(&stream, fast_reads()).await);
    reshard_fleet(&k, &stream, source).await;
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
    first.shutdown().await;

    // A new worker picks up at the checkpoint: user records 3, 4, 5 and nothing before.
    let log = Log::default();
    let second = start(&config, "second", &store, &source, &log).await;
    eventually("the rest of the aggregate", || async { (log.events().len() >= 3).then_some(()) })
        .await;
    second.shutdown().await;
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
