//! A record processor for tests that remembers every delivery, so a test can check the three
//! promises of the runtime: nothing lost, nothing processed twice in a graceful handoff, and no
//! child-shard record before every record of its parents.
//!
//! By default it checkpoints after every batch through the fenced handle, like a careful user
//! would; it can instead checkpoint every k batches and flush (slowly, if asked) in
//! `shutdown_requested`, like a batching sink. It can be told to fail or panic on the next calls
//! to exercise retries and panic containment. Each processor instance is tracked on its own, so
//! two owners processing one shard at the same time are caught even at the same epoch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::{
    Batch, BoxError, CheckpointHandle, LeaseContext, LeaseKey, MemorySource, Position,
    ProcessorFactory, RecordProcessor, SequenceNumber,
};

#[derive(Debug, Default)]
struct State {
    clock: u64,
    /// (shard, seq) → (deliveries, first delivery time, last delivery time)
    deliveries: BTreeMap<(LeaseKey, SequenceNumber), (u32, u64, u64)>,
    /// (shard, seq) → the processor instances that delivered it, in order (kept only for records
    /// delivered more than once, so a failure can say who read what again).
    again: BTreeMap<(LeaseKey, SequenceNumber), Vec<u64>>,
    /// (shard, seq) → the processor instance that delivered it first.
    first_by: BTreeMap<(LeaseKey, SequenceNumber), u64>,
    /// shard → processor instance → (epoch, first delivery time, last delivery time)
    spans: BTreeMap<LeaseKey, BTreeMap<u64, (u64, u64, u64)>>,
    /// Processor instances created so far.
    instances: u64,
    fail_next: u32,
    panic_next: u32,
    give_up_next: u32,
    gave_up: u64,
    errors_returned: u64,
    panics: u64,
    lost: u64,
    shard_ends: u64,
    shutdowns: u64,
    checkpoint_failures: u64,
    /// Processor instances that ended without hearing how their lease ended (no `lease_lost`,
    /// `shutdown_requested` or `shard_ended`), with the worker that ran them.
    silent: Vec<(u64, String)>,
}

/// Shared log of deliveries; clone it freely.
#[derive(Clone, Debug)]
pub struct Recorder {
    state: Arc<Mutex<State>>,
    checkpoint_every: u32,
    shutdown_delay: Duration,
    /// Every n-th processor instance hangs this long at the start of its first batch.
    stuck: Option<(u64, Duration)>,
    /// What each record costs: slept at the start of every batch, so the runtime measures it as
    /// busy time (a load, when balancing by load).
    record_cost: Duration,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            state: Arc::default(),
            checkpoint_every: 1,
            shutdown_delay: Duration::ZERO,
            stuck: None,
            record_cost: Duration::ZERO,
        }
    }
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Processors of this recorder checkpoint after every `k`-th batch (at least 1) and flush the
    /// rest in `shutdown_requested`.
    pub fn with_checkpoint_every(mut self, k: u32) -> Self {
        self.checkpoint_every = k.max(1);
        self
    }

    /// Processors of this recorder spend `d` in `shutdown_requested` before their final
    /// checkpoint, like a sink flushing a buffer.
    pub fn with_shutdown_delay(mut self, d: Duration) -> Self {
        self.shutdown_delay = d;
        self
    }

    /// Every `every`-th processor instance (at least 1) hangs for `d` at the start of its first
    /// batch, before it delivers anything: user code stuck on a sink. A handoff or a shutdown
    /// whose deadline passes meanwhile cuts it short (it must then hear `lease_lost`).
    pub fn with_stuck_batches(mut self, every: u64, d: Duration) -> Self {
        self.stuck = Some((every.max(1), d));
        self
    }

    /// Processors of this recorder spend `cost` per record (asleep) at the start of every batch:
    /// work the runtime measures as the lease's load.
    pub fn with_record_cost(mut self, cost: Duration) -> Self {
        self.record_cost = cost;
        self
    }

    /// Processor instances that ended without hearing how their lease ended, each with the worker
    /// id (incarnation suffix included) that ran it. A processor dropped by a crash hears nothing;
    /// every other one hears `lease_lost`, `shutdown_requested` or `shard_ended` first.
    pub fn silent_endings(&self) -> Vec<(u64, String)> {
        self.lock().silent.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A factory whose processors log into this recorder.
    pub fn factory(&self) -> Arc<dyn ProcessorFactory> {
        let rec = self.clone();
        Arc::new(move |ctx: &LeaseContext| -> Box<dyn RecordProcessor> {
            let instance = {
                let mut st = rec.lock();
                st.instances += 1;
                st.instances
            };
            Box::new(RecordingProcessor {
                rec: rec.clone(),
                instance,
                owner: ctx.token.owner.to_string(),
                batches: 0,
                pending: None,
                told: false,
                hung: false,
            })
        })
    }

    /// The next `n` calls to `process_records` (any shard) return an error.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_next = n;
    }

    /// The next `n` calls to `process_records` (any shard) panic.
    pub fn panic_next(&self, n: u32) {
        self.lock().panic_next = n;
    }

    /// The next `n` calls to `process_records` (any shard) give their lease up
    /// ([`shardlease_core::Error::ReleaseLease`]), after delivering the batch's records
    /// without checkpointing them.
    pub fn give_up_next(&self, n: u32) {
        self.lock().give_up_next = n;
    }

    /// Leases given up by processors on request.
    pub fn gave_up(&self) -> u64 {
        self.lock().gave_up
    }

    /// Distinct records delivered at least once.
    pub fn distinct(&self) -> usize {
        self.lock().deliveries.len()
    }

    /// Deliveries beyond the first, summed over all records.
    pub fn duplicates(&self) -> u64 {
        self.lock().deliveries.values().map(|(n, _, _)| u64::from(n.saturating_sub(1))).sum()
    }

    /// Who processed what twice, a line per shard: how many records, their sequence numbers'
    /// range, and each processor instance involved with its epoch and the logical times of its
    /// first and last delivery (empty when nothing was processed twice). Printed by tests when
    /// a duplicate assertion fails, so a run on a loaded CI machine says what happened.
    pub fn duplicate_report(&self) -> Vec<String> {
        let st = self.lock();
        let mut by_shard: BTreeMap<&LeaseKey, Vec<(&SequenceNumber, &Vec<u64>)>> = BTreeMap::new();
        for ((shard, seq), who) in &st.again {
            by_shard.entry(shard).or_default().push((seq, who));
        }
        let mut out = Vec::new();
        for (shard, recs) in by_shard {
            let mut instances: Vec<u64> =
                recs.iter().flat_map(|(_, w)| w.iter().copied()).collect();
            instances.sort_unstable();
            instances.dedup();
            let spans = st.spans.get(shard);
            let who: Vec<String> = instances
                .iter()
                .map(|i| match spans.and_then(|s| s.get(i)) {
                    Some((epoch, first, last)) => {
                        format!("instance {i} at epoch {epoch} delivered t={first}..{last}")
                    }
                    None => format!("instance {i}"),
                })
                .collect();
            let (lo, hi) = (recs[0].0, recs[recs.len() - 1].0);
            out.push(format!(
                "{shard}: {} records again (seq {lo} to {hi}); {}",
                recs.len(),
                who.join("; ")
            ));
        }
        out
    }

    /// Errors returned by processors on request.
    pub fn errors_returned(&self) -> u64 {
        self.lock().errors_returned
    }

    /// Panics raised by processors on request.
    pub fn panics(&self) -> u64 {
        self.lock().panics
    }

    /// `lease_lost` calls seen.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }

    /// Checkpoints after a batch that failed (the processor returned the error, so the runtime
    /// delivered the batch again).
    pub fn checkpoint_failures(&self) -> u64 {
        self.lock().checkpoint_failures
    }

    /// `shutdown_requested` calls seen.
    pub fn shutdowns(&self) -> u64 {
        self.lock().shutdowns
    }

    /// Records of `source` never delivered.
    pub fn missing(&self, source: &MemorySource) -> Vec<(LeaseKey, SequenceNumber)> {
        let st = self.lock();
        let mut out = Vec::new();
        for shard in source.shards() {
            for r in source.records(&shard.id) {
                let k = (shard.id.clone(), r.seq.clone());
                if !st.deliveries.contains_key(&k) {
                    out.push(k);
                }
            }
        }
        out
    }

    /// Shards processed by two owners at once: a processor instance delivering a record after
    /// another instance of the same shard, created later, started delivering. Each lease task has
    /// its own instance, so this catches two owners at the same epoch too (a restarted process
    /// resuming a lease without a new epoch). Graceful handoffs, crashes and self-fencing never
    /// cause it.
    pub fn overlaps(&self) -> Vec<String> {
        let st = self.lock();
        let mut out = Vec::new();
        for (key, spans) in &st.spans {
            let mut spans: Vec<&(u64, u64, u64)> = spans.values().collect();
            spans.sort_by_key(|(_, first, _)| *first);
            for (i, (e1, _, last)) in spans.iter().enumerate() {
                for (e2, first, _) in &spans[i + 1..] {
                    if last > first {
                        out.push(format!(
                            "{key}: a processor at epoch {e1} delivered at t={last} after one at epoch {e2} started at t={first}"
                        ));
                    }
                }
            }
        }
        out
    }

    /// Children whose first record was delivered before the last delivery of a parent's record.
    pub fn order_violations(&self, source: &MemorySource) -> Vec<String> {
        let st = self.lock();
        let mut first: BTreeMap<&LeaseKey, u64> = BTreeMap::new();
        let mut last: BTreeMap<&LeaseKey, u64> = BTreeMap::new();
        for ((shard, _), (_, f, l)) in &st.deliveries {
            let e = first.entry(shard).or_insert(*f);
            *e = (*e).min(*f);
            let e = last.entry(shard).or_insert(*l);
            *e = (*e).max(*l);
        }
        let mut out = Vec::new();
        for shard in source.shards() {
            let Some(child_first) = first.get(&shard.id) else { continue };
            for p in &shard.parents {
                if let Some(parent_last) = last.get(p) {
                    if parent_last > child_first {
                        out.push(format!(
                            "child {} delivered a record (t={child_first}) before parent {p} finished (t={parent_last})",
                            shard.id
                        ));
                    }
                }
            }
        }
        out
    }
}

struct RecordingProcessor {
    rec: Recorder,
    instance: u64,
    /// The worker running it.
    owner: String,
    batches: u32,
    /// The end of the last batch processed but not yet checkpointed.
    pending: Option<Position>,
    /// Whether it heard how its lease ended.
    told: bool,
    /// Whether it already hung (see [`Recorder::with_stuck_batches`]).
    hung: bool,
}

impl Drop for RecordingProcessor {
    fn drop(&mut self) {
        if !self.told {
            let who = (self.instance, std::mem::take(&mut self.owner));
            self.rec.lock().silent.push(who);
        }
    }
}

#[async_trait]
impl RecordProcessor for RecordingProcessor {
    async fn process_records(
        &mut self,
        batch: &Batch,
        cp: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        let key = cp.token().key.clone();
        if let Some((every, d)) = self.rec.stuck {
            if !self.hung && self.instance.is_multiple_of(every) {
                self.hung = true;
                tokio::time::sleep(d).await;
            }
        }
        if !self.rec.record_cost.is_zero() && !batch.records.is_empty() {
            let n = u32::try_from(batch.records.len()).unwrap_or(u32::MAX);
            tokio::time::sleep(self.rec.record_cost.saturating_mul(n)).await;
        }
        {
            let mut st = self.rec.lock();
            if st.panic_next > 0 {
                st.panic_next -= 1;
                st.panics += 1;
                drop(st);
                panic!("requested panic while processing {key}");
            }
            if st.fail_next > 0 {
                st.fail_next -= 1;
                st.errors_returned += 1;
                return Err(format!("requested failure while processing {key}").into());
            }
            let epoch = cp.token().epoch.get();
            for r in batch.records.iter() {
                st.clock += 1;
                let t = st.clock;
                let span = st
                    .spans
                    .entry(key.clone())
                    .or_default()
                    .entry(self.instance)
                    .or_insert((epoch, t, t));
                span.2 = t;
                let k = (key.clone(), r.seq.clone());
                let e = st.deliveries.entry(k.clone()).or_insert((0, t, t));
                e.0 += 1;
                e.2 = t;
                if e.0 == 1 {
                    st.first_by.insert(k, self.instance);
                } else {
                    let first = st.first_by.get(&k).copied().unwrap_or_default();
                    st.again.entry(k).or_insert_with(|| vec![first]).push(self.instance);
                }
            }
            if st.give_up_next > 0 && !batch.records.is_empty() {
                st.give_up_next -= 1;
                st.gave_up += 1;
                let why = format!("requested give-up while processing {key}");
                return Err(shardlease_core::Error::ReleaseLease(why).into());
            }
        }
        self.batches += 1;
        if self.batches.is_multiple_of(self.rec.checkpoint_every) {
            if let Err(e) = cp.checkpoint_batch(batch).await {
                // Returned to the runtime, which delivers the batch again: counted, so a test
                // that finds records processed twice can tell a retry from a second owner.
                self.rec.lock().checkpoint_failures += 1;
                return Err(e.into());
            }
            self.pending = None;
        } else if let Some(p) = batch.last_position() {
            self.pending = Some(p);
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.told = true;
        self.rec.lock().lost += 1;
    }

    async fn shard_ended(&mut self, cp: &CheckpointHandle) -> Result<(), BoxError> {
        self.told = true;
        cp.checkpoint(Position::ShardEnd).await?;
        self.pending = None;
        self.rec.lock().shard_ends += 1;
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &CheckpointHandle) -> Result<(), BoxError> {
        self.told = true;
        self.rec.lock().shutdowns += 1;
        if !self.rec.shutdown_delay.is_zero() {
            tokio::time::sleep(self.rec.shutdown_delay).await;
        }
        if let Some(p) = self.pending.take() {
            cp.checkpoint(p).await?;
        }
        Ok(())
    }
}
