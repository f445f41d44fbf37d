//! The no-op record processor the benchmark runs where records are not inspected: it counts
//! records, stamps when the first batch arrived and when the last checkpoint was written, and
//! checkpoints once per batch through the fenced handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use shardlease::{
    Batch, BoxError, CheckpointHandle, LeaseContext, ProcessorFactory, RecordProcessor,
};

/// Shared counters of every processor made by one [`Tally::factory`] (a no-op that counts).
#[derive(Debug)]
pub struct Tally {
    base: Instant,
    records: AtomicU64,
    first_batch_nanos: AtomicU64,
    last_checkpoint_nanos: AtomicU64,
}

impl Tally {
    /// Fresh counters; instants are measured from now.
    pub fn new() -> Arc<Self> {
        Arc::new(Tally {
            base: Instant::now(),
            records: AtomicU64::new(0),
            first_batch_nanos: AtomicU64::new(u64::MAX),
            last_checkpoint_nanos: AtomicU64::new(0),
        })
    }

    /// A factory of processors counting into this tally.
    pub fn factory(self: &Arc<Self>) -> Arc<dyn ProcessorFactory> {
        let tally = self.clone();
        Arc::new(move |_ctx: &LeaseContext| -> Box<dyn RecordProcessor> {
            Box::new(NoopProcessor { tally: tally.clone() })
        })
    }

    /// Records delivered to processors so far (duplicates included).
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// When the first non-empty batch reached a processor.
    pub fn first_batch(&self) -> Option<Instant> {
        match self.first_batch_nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(self.base + Duration::from_nanos(n)),
        }
    }

    /// When the last checkpoint so far was written.
    pub fn last_checkpoint(&self) -> Option<Instant> {
        match self.last_checkpoint_nanos.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n)),
        }
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX - 1).max(1)
    }
}

/// Does nothing with records but count them; checkpoints after every batch.
struct NoopProcessor {
    tally: Arc<Tally>,
}

#[async_trait]
impl RecordProcessor for NoopProcessor {
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        if batch.records.is_empty() {
            return Ok(());
        }
        let t = &self.tally;
        t.first_batch_nanos.fetch_min(t.nanos(), Ordering::Relaxed);
        t.records.fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        checkpointer.checkpoint_batch(batch).await?;
        t.last_checkpoint_nanos.fetch_max(t.nanos(), Ordering::Relaxed);
        Ok(())
    }
}
