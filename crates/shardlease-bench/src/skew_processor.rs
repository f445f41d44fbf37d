//! The processor of the `skew` scenario: every record costs a fixed time, and each worker has
//! one core to pay it with.
//!
//! A worker is modelled as `--worker-cores` cores (default 1): its processors take turns at a
//! per-worker semaphore and pay the record cost asleep while they hold a permit. So a worker's load
//! is the share of its cores in use, and a worker past its cores falls behind, as a real one
//! would; waiting for a core counts as time in the processor, as waiting for a CPU does. The cost is paid asleep, not spinning, so
//! that eight workers on a two-core machine measure the balancer and not the machine's scheduler;
//! the runtime's load measure (the share of wall time spent inside the processor) cannot tell
//! the two apart. Sleeps are whole milliseconds at best, so each lease carries what it owes and
//! pays it once it reaches a millisecond: over time a lease pays exactly its records' cost.
//!
//! The tally also counts records delivered twice (a batch starting at or before the last record
//! processed of its shard), the core time each worker used, and each worker's processing lag
//! (from a record's write to the end of its batch).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use shardlease::{
    Batch, BoxError, CheckpointHandle, LeaseContext, LeaseKey, ProcessorFactory, RecordProcessor,
    SequenceNumber, WorkerId,
};

use crate::skew_load::stamped;

/// What one worker did since the last [`SkewTally::reset_window`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerWindow {
    /// Core time used, in seconds.
    pub busy_s: f64,
    /// Records processed.
    pub records: u64,
    /// Largest lag seen, in seconds.
    pub max_lag_s: f64,
    /// Sum of the lags of the batches (for the mean).
    pub lag_sum_s: f64,
    /// Batches seen.
    pub batches: u64,
}

impl WorkerWindow {
    /// Mean lag over the batches, in seconds.
    pub fn mean_lag_s(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.lag_sum_s / self.batches as f64
        }
    }
}

/// Shared state of every processor the factory makes.
#[derive(Debug)]
pub struct SkewTally {
    base: Instant,
    cost: Duration,
    /// Cores per worker; 0: as many as it has leases (no waiting).
    per_worker: usize,
    cores: Mutex<HashMap<WorkerId, Arc<tokio::sync::Semaphore>>>,
    last_seq: Mutex<HashMap<LeaseKey, SequenceNumber>>,
    window: Mutex<HashMap<WorkerId, WorkerWindow>>,
    records: AtomicU64,
    twice: AtomicU64,
}

impl SkewTally {
    /// A tally for records stamped from `base` that cost `cost` each, paid on `cores` cores per
    /// worker (0: no limit).
    pub fn new(base: Instant, cost: Duration, cores: usize) -> Arc<Self> {
        Arc::new(SkewTally {
            base,
            cost,
            per_worker: cores,
            cores: Mutex::default(),
            last_seq: Mutex::default(),
            window: Mutex::default(),
            records: AtomicU64::new(0),
            twice: AtomicU64::new(0),
        })
    }

    /// A factory of processors paying into this tally.
    pub fn factory(self: &Arc<Self>) -> Arc<dyn ProcessorFactory> {
        let tally = self.clone();
        Arc::new(move |ctx: &LeaseContext| -> Box<dyn RecordProcessor> {
            let core = tally.core(&ctx.token.owner);
            Box::new(CostlyProcessor {
                tally: tally.clone(),
                core,
                worker: ctx.token.owner.clone(),
                owed: 0.0,
            })
        })
    }

    /// Records delivered so far, duplicates included.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Records delivered again after they had been processed.
    pub fn processed_twice(&self) -> u64 {
        self.twice.load(Ordering::Relaxed)
    }

    /// What each worker did since the last reset, and starts a new window.
    pub fn reset_window(&self) -> HashMap<WorkerId, WorkerWindow> {
        std::mem::take(&mut *self.window.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn core(&self, worker: &WorkerId) -> Arc<tokio::sync::Semaphore> {
        let mut cores = self.cores.lock().unwrap_or_else(PoisonError::into_inner);
        let n = if self.per_worker == 0 {
            tokio::sync::Semaphore::MAX_PERMITS
        } else {
            self.per_worker
        };
        cores
            .entry(worker.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(n)))
            .clone()
    }

    /// Counts the batch's records already processed before, and notes its last one.
    fn note_sequence(&self, key: &LeaseKey, batch: &Batch) {
        let (Some(first), Some(last)) = (batch.records.first(), batch.records.last()) else {
            return;
        };
        let mut seqs = self.last_seq.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = seqs.get(key) {
            if first.seq <= *done {
                let again = batch.records.iter().filter(|r| r.seq <= *done).count();
                self.twice.fetch_add(again as u64, Ordering::Relaxed);
            }
        }
        if seqs.get(key).is_none_or(|done| last.seq > *done) {
            seqs.insert(key.clone(), last.seq.clone());
        }
    }

    fn note_window(&self, worker: &WorkerId, busy: Duration, records: u64, lag: Option<Duration>) {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let w = window.entry(worker.clone()).or_default();
        w.busy_s += busy.as_secs_f64();
        w.records += records;
        if let Some(lag) = lag {
            let lag = lag.as_secs_f64();
            w.max_lag_s = w.max_lag_s.max(lag);
            w.lag_sum_s += lag;
            w.batches += 1;
        }
    }
}

/// Pays each record's cost on its worker's core, then checkpoints the batch.
struct CostlyProcessor {
    tally: Arc<SkewTally>,
    core: Arc<tokio::sync::Semaphore>,
    worker: WorkerId,
    /// Seconds of cost owed and not yet paid (negative when a sleep overran).
    owed: f64,
}

#[async_trait]
impl RecordProcessor for CostlyProcessor {
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        let Some(first) = batch.records.first() else { return Ok(()) };
        let t = &self.tally;
        let n = batch.records.len() as u64;
        t.records.fetch_add(n, Ordering::Relaxed);
        t.note_sequence(&checkpointer.token().key, batch);
        self.owed += t.cost.as_secs_f64() * n as f64;
        let mut busy = Duration::ZERO;
        if self.owed >= 0.001 {
            let _core = self.core.acquire().await?;
            let start = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(self.owed)).await;
            busy = start.elapsed();
            self.owed -= busy.as_secs_f64();
        }
        let lag = stamped(t.base, &first.data).map(|at| at.elapsed());
        t.note_window(&self.worker, busy, n, lag);
        checkpointer.checkpoint_batch(batch).await?;
        Ok(())
    }
}
