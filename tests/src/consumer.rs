//! The consumer program: a processor that tallies each record it is given and checkpoints after
//! every batch, and [`run_consumer`], an application's `main` without the argument parsing. No
//! store type is named anywhere in this file: the store is whatever the URL says.

use std::sync::Arc;
use std::time::Duration;

use shardlease::{
    async_trait, Batch, BoxError, CheckpointHandle, Config, LeaseContext, LeaseKey, Position,
    RecordProcessor, ShardSource, Worker, WorkerHandle,
};
use shardlease_examples::DeliveryLog;

/// The processor of one lease: its "work" is to count each record in a shared [`DeliveryLog`];
/// then it checkpoints after the batch's last record, fenced by the lease's epoch.
#[derive(Debug)]
pub struct Tally {
    key: LeaseKey,
    log: DeliveryLog,
}

impl Tally {
    /// A processor for the lease `key`, counting into `log`.
    pub fn new(key: LeaseKey, log: DeliveryLog) -> Self {
        Tally { key, log }
    }
}

#[async_trait]
impl RecordProcessor for Tally {
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        self.log.record(&self.key, batch);
        // Everything counted is "durable" here, so checkpoint at once: a graceful handoff then
        // gives the next owner exactly the records after this batch.
        checkpointer.checkpoint_batch(batch).await?;
        Ok(())
    }
}

/// Connects to the store named by `store_url` and starts a worker `worker_id` that consumes
/// `stream` from its oldest records, counting them into `log`. Every timing follows `heartbeat`
/// (see [`Config::with_heartbeat`]), with wide failover, shutdown and claim timeouts (below). The namespace is the URL's (`?namespace=`), as the store
/// reports it.
pub async fn run_consumer(
    store_url: &str,
    worker_id: &str,
    stream: Arc<dyn ShardSource>,
    log: &DeliveryLog,
    heartbeat: Duration,
) -> shardlease::Result<WorkerHandle> {
    let store = shardlease::connect(store_url).await?;
    let namespace = store.namespace().unwrap_or_default();
    // Failover and shutdown timeouts of 20 heartbeats (claim timeout 40) rather than the usual
    // 5 (7.5): the graceful steps must process nothing twice even when the test machine stalls for
    // a second or two, which at 5 heartbeats would cut a handoff's last batch short or get a live
    // worker judged dead. Only the crash step waits for the failover timeout.
    let config = Config::new(namespace)?
        .with_worker_id(worker_id)
        .with_heartbeat(heartbeat)
        .with_failover_timeout(heartbeat * 20)
        .with_shutdown_timeout(heartbeat * 20)
        .with_claim_timeout(heartbeat * 40)
        .with_initial_position(Position::TrimHorizon);
    let log = log.clone();
    let processors = move |ctx: &LeaseContext| -> Box<dyn RecordProcessor> {
        Box::new(Tally::new(ctx.key().clone(), log.clone()))
    };
    Ok(Worker::builder(config, store, stream, Arc::new(processors)).build()?.start())
}
