//! Every metric shardlease emits, named in one place, and the handles the runtime emits them
//! through.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (the Prometheus exporter, say)
//! and they appear; install none and they cost next to nothing. Each worker keeps a
//! `WorkerMetrics` labelled with its `namespace` and `worker`, and each lease task a
//! `LeaseMetrics` that adds `shard`, so two workers in one process (or one worker's many shards)
//! never write the same series. Handles resolve their series at every call, so a recorder
//! installed after the workers were built still receives everything from then on.
//!
//! [`METRICS`] lists every metric with its type, labels and meaning; `docs/operations.md` lists
//! the same (a test checks that it names each one), and [`describe`] hands the descriptions to the
//! installed recorder (the Prometheus exporter prints them as `# HELP`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::Label;
use tokio::time::Instant;

use crate::lease::LeaseKey;
use crate::source::Batch;

/// Label: the namespace of the leases.
pub const NAMESPACE: &str = "namespace";
/// Label: the worker's configured id (an incarnation after a self-fence keeps it).
pub const WORKER: &str = "worker";
/// Label: the shard (lease key).
pub const SHARD: &str = "shard";
/// Label: the stream of a lease, on the per-shard metrics of a worker whose source consumes
/// several streams (keys `stream/shard`, see `MultiSource`).
pub const STREAM: &str = "stream";
/// Label: the store operation (`create_lease`, `list_leases`, ...).
pub const OPERATION: &str = "operation";
/// Label: the kind of a store error (`conflict`, `lease_lost`, `corrupt`, `config`,
/// `invalid_input`, `retryable`, `permanent`).
pub const KIND: &str = "kind";
/// Label key: the plug-in a panic came from (`lease store`, `shard source`, `checkpointer`,
/// `balancer`).
pub const PLUGIN: &str = "plugin";
/// Label key: one of a worker's loops (`heartbeat`, `watchdog`, `balance`, `shard_sync`,
/// `notices`).
pub const LOOP: &str = "loop";

/// Gauge: leases this worker is running.
pub const LEASES_HELD: &str = "shardlease_leases_held";
/// Gauge: leases whose processor fails with an error retrying cannot fix.
pub const LEASES_STUCK: &str = "shardlease_leases_stuck";
/// Gauge: worker records this worker listed at its last heartbeat.
pub const LIVE_WORKERS: &str = "shardlease_live_workers";
/// Counter: balance passes that listed the leases.
pub const BALANCE_PASSES: &str = "shardlease_balance_passes_total";
/// Counter: times this worker fenced itself.
pub const SELF_FENCED: &str = "shardlease_self_fenced_total";
/// Counter: listings that found every lease of the namespace gone.
pub const NAMESPACE_VANISHED: &str = "shardlease_namespace_vanished_total";
/// Counter: leases the store lost that this worker wrote back.
pub const LEASES_RESTORED: &str = "shardlease_leases_restored_total";
/// Counter: corrupt lease records seen in listings.
pub const CORRUPT_RECORDS: &str = "shardlease_corrupt_records_total";
/// Counter: leases taken (available ones and stuck claims).
pub const LEASES_TAKEN: &str = "shardlease_leases_taken_total";
/// Counter: handoff requests (claims) written.
pub const CLAIMS: &str = "shardlease_claims_total";
/// Counter: leases handed over to a claimant.
pub const HANDOFFS: &str = "shardlease_handoffs_total";
/// Counter: leases lost (a fenced write refused, or a claim left unanswered too long).
pub const LEASES_LOST: &str = "shardlease_leases_lost_total";
/// Counter: records processed successfully.
pub const RECORDS_PROCESSED: &str = "shardlease_records_processed_total";
/// Counter: payload bytes of the records processed successfully.
pub const BYTES_PROCESSED: &str = "shardlease_bytes_processed_total";
/// Histogram: seconds from handing a batch to the processor until it succeeded (retries included).
pub const BATCH_SECONDS: &str = "shardlease_batch_processing_seconds";
/// Gauge: how far behind the tip of the shard the last read was, in milliseconds.
pub const MILLIS_BEHIND_LATEST: &str = "shardlease_millis_behind_latest";
/// Gauge: seconds since this worker last checkpointed the lease (or started it).
pub const CHECKPOINT_AGE: &str = "shardlease_checkpoint_age_seconds";
/// Gauge: a lease's measured load, busy seconds per second of its processor (balancing by load).
pub const LEASE_LOAD: &str = "shardlease_lease_load";
/// Gauge: the sum of a worker's lease loads (balancing by load).
pub const WORKER_LOAD: &str = "shardlease_worker_load";
/// Counter: peers seen balancing by another mode than this worker (each counted once).
pub const BALANCE_MODE_MISMATCH: &str = "shardlease_balance_mode_mismatch_total";
/// Counter: errors returned by the record processor.
pub const PROCESSOR_ERRORS: &str = "shardlease_processor_errors_total";
/// Counter: record processor panics.
pub const PROCESSOR_PANICS: &str = "shardlease_processor_panics_total";
/// Histogram: seconds a store call took.
pub const STORE_CALL_SECONDS: &str = "shardlease_store_call_seconds";
/// Counter: store calls that returned an error.
pub const STORE_ERRORS: &str = "shardlease_store_errors_total";

/// Counter: panics of a plug-in (store, source, checkpointer, balancer) that were contained: the
/// call counted as failed and the worker went on.
pub const PLUGIN_PANICS: &str = "shardlease_plugin_panics_total";
/// Counter: loops of a worker that failed (panicked, or ended while the worker ran): the worker
/// fenced itself and stopped.
pub const WORKER_LOOP_FAILURES: &str = "shardlease_worker_loop_failures_total";

/// The type of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Set to the current value.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

/// One metric: its name, type, labels and what it means.
#[derive(Clone, Copy, Debug)]
pub struct MetricInfo {
    /// The metric name.
    pub name: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// Its label keys.
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
}

const BY_WORKER: &[&str] = &[NAMESPACE, WORKER];
const BY_SHARD: &[&str] = &[NAMESPACE, WORKER, SHARD];

const fn info(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricInfo {
    MetricInfo { name, kind, labels, help }
}

/// Every metric the core emits (the Kinesis source adds its own, see docs/kinesis.md).
pub const METRICS: &[MetricInfo] = {
    use MetricKind::{Counter, Gauge, Histogram};
    &[
        info(LEASES_HELD, Gauge, BY_WORKER, "Leases this worker is running."),
        info(LEASES_STUCK, Gauge, BY_WORKER, "Leases whose processor fails with an error retrying cannot fix."),
        info(LIVE_WORKERS, Gauge, BY_WORKER, "Worker records in this worker's view at its last heartbeat (dead ones until removed)."),
        info(BALANCE_PASSES, Counter, BY_WORKER, "Balance passes that listed the leases."),
        info(SELF_FENCED, Counter, BY_WORKER, "Times this worker fenced itself (no heartbeat succeeded in time)."),
        info(NAMESPACE_VANISHED, Counter, BY_WORKER, "Listings that found every lease of the namespace gone."),
        info(LEASES_RESTORED, Counter, BY_WORKER, "Leases the store lost that this worker wrote back."),
        info(CORRUPT_RECORDS, Counter, BY_WORKER, "Corrupt lease records seen in listings."),
        info(LEASES_TAKEN, Counter, BY_SHARD, "Leases taken (available ones and stuck claims)."),
        info(CLAIMS, Counter, BY_SHARD, "Handoff requests (claims) written."),
        info(HANDOFFS, Counter, BY_SHARD, "Leases handed over to a claimant."),
        info(LEASES_LOST, Counter, BY_SHARD, "Leases lost: a fenced write refused, or a claim left unanswered too long."),
        info(RECORDS_PROCESSED, Counter, BY_SHARD, "Records processed successfully."),
        info(BYTES_PROCESSED, Counter, BY_SHARD, "Payload bytes of the records processed successfully."),
        info(BATCH_SECONDS, Histogram, BY_SHARD, "Seconds from handing a batch to the processor until it succeeded."),
        info(MILLIS_BEHIND_LATEST, Gauge, BY_SHARD, "How far behind the tip of the shard the last read was (0 once the lease task ends)."),
        info(CHECKPOINT_AGE, Gauge, BY_SHARD, "Seconds since this worker last checkpointed the lease or started it (0 once the lease task ends)."),
        info(LEASE_LOAD, Gauge, BY_SHARD, "The lease's measured load: its share of the worker's cores while in its processor, in busy seconds per second, smoothed (only when balancing by load)."),
        info(WORKER_LOAD, Gauge, BY_WORKER, "The sum of this worker's lease loads (only when balancing by load)."),
        info(BALANCE_MODE_MISMATCH, Counter, BY_WORKER, "Peers seen balancing by another mode than this worker (each counted once): a fleet must share one `Balance`."),
        info(PROCESSOR_ERRORS, Counter, BY_SHARD, "Errors returned by the record processor."),
        info(PROCESSOR_PANICS, Counter, BY_SHARD, "Record processor panics."),
        info(PLUGIN_PANICS, Counter, &[NAMESPACE, WORKER, PLUGIN], "Panics of a plug-in (store, source, checkpointer, balancer) contained as a failed call."),
        info(WORKER_LOOP_FAILURES, Counter, &[NAMESPACE, WORKER, LOOP], "Worker loops that failed (panicked or ended early): the worker fenced itself and stopped."),
        info(STORE_CALL_SECONDS, Histogram, &[NAMESPACE, OPERATION], "Seconds a store call took."),
        info(STORE_ERRORS, Counter, &[NAMESPACE, OPERATION, KIND], "Store calls that returned an error, by kind."),
    ]
};

/// Hands the description of every metric in [`METRICS`] to the installed recorder.
pub fn describe() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            MetricKind::Histogram => {
                metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help)
            }
        }
    }
}

/// The `kind` label of a store error.
pub(crate) fn error_kind(e: &crate::error::Error) -> &'static str {
    use crate::error::Error;
    match e {
        Error::Conflict { .. } => "conflict",
        Error::LeaseLost { .. } => "lease_lost",
        Error::Corrupt { .. } => "corrupt",
        Error::Config(_) => "config",
        Error::InvalidInput(_) => "invalid_input",
        Error::ReleaseLease(_) => "release_lease",
        Error::Backend { retryable: true, .. } => "retryable",
        Error::Backend { retryable: false, .. } => "permanent",
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn label(key: &'static str, value: &str) -> Label {
    Label::new(key, Arc::<str>::from(value))
}

/// What a worker counts about itself: read by `WorkerHandle::stats`, and bumped only by the
/// [`WorkerMetrics`] methods that also emit the matching metric, so the two never disagree.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub passes: AtomicU64,
    pub lease_listings: AtomicU64,
    pub taking_passes: AtomicU64,
    pub taken: AtomicU64,
    pub claims: AtomicU64,
    pub handoffs: AtomicU64,
    pub lost: AtomicU64,
    pub fenced: AtomicU64,
    pub records: AtomicU64,
    pub heartbeats: AtomicU64,
    pub stuck: AtomicU64,
}

impl Counters {
    /// The value of one counter.
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// One worker's metrics and counters, labelled with its namespace and configured id.
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    labels: Vec<Label>,
    /// Whether lease keys name their stream: per-shard metrics then carry a `stream` label.
    by_stream: bool,
    /// The counters behind `WorkerStats` (one source with the metrics).
    pub counters: Counters,
}

impl WorkerMetrics {
    pub(crate) fn new(namespace: &str, worker: &str) -> Self {
        WorkerMetrics {
            labels: vec![label(NAMESPACE, namespace), label(WORKER, worker)],
            by_stream: false,
            counters: Counters::default(),
        }
    }

    /// Adds a `stream` label to the per-shard metrics (a source whose keys name their stream).
    pub(crate) fn by_stream(mut self, yes: bool) -> Self {
        self.by_stream = yes;
        self
    }

    /// A pass that did not list the leases (nothing changed).
    pub(crate) fn balance_pass_quiet(&self) {
        bump(&self.counters.passes, 1);
    }

    /// A listing of the leases (a pass's, or a refresh of take candidates).
    pub(crate) fn lease_listing(&self) {
        bump(&self.counters.lease_listings, 1);
    }

    /// A pass that took at least one lease.
    pub(crate) fn taking_pass(&self) {
        bump(&self.counters.taking_passes, 1);
    }

    /// Records processed successfully (also counted per shard by [`LeaseMetrics::processed`]).
    pub(crate) fn records(&self, n: u64) {
        bump(&self.counters.records, n);
    }

    /// A successful heartbeat.
    pub(crate) fn heartbeat(&self) {
        bump(&self.counters.heartbeats, 1);
    }

    /// A lease became stuck (+1) or recovered (-1).
    pub(crate) fn stuck(&self, delta: i64) {
        let n = if delta >= 0 {
            self.counters.stuck.fetch_add(delta.unsigned_abs(), Ordering::SeqCst)
                + delta.unsigned_abs()
        } else {
            self.counters
                .stuck
                .fetch_sub(delta.unsigned_abs(), Ordering::SeqCst)
                .saturating_sub(delta.unsigned_abs())
        };
        self.leases_stuck(n);
    }

    fn for_shard(&self, shard: &LeaseKey) -> Vec<Label> {
        let mut labels = self.labels.clone();
        labels.push(label(SHARD, shard.as_str()));
        if self.by_stream {
            if let Some((stream, _)) = crate::multi_source::split_key(shard) {
                labels.push(label(STREAM, stream));
            }
        }
        labels
    }

    /// The metrics of one lease task of this worker.
    pub(crate) fn lease(&self, shard: &LeaseKey) -> LeaseMetrics {
        LeaseMetrics {
            labels: self.for_shard(shard),
            last_checkpoint: Mutex::new(Instant::now()),
            busy_nanos: std::sync::atomic::AtomicU64::new(0),
            load: Mutex::new(crate::load_meter::LoadMeter::new(0, Instant::now())),
            at_tip: AtomicBool::new(false),
        }
    }

    pub(crate) fn leases_held(&self, n: usize) {
        metrics::gauge!(LEASES_HELD, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn leases_stuck(&self, n: u64) {
        metrics::gauge!(LEASES_STUCK, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn worker_load(&self, load: f64) {
        metrics::gauge!(WORKER_LOAD, self.labels.clone()).set(load);
    }

    pub(crate) fn balance_mode_mismatch(&self) {
        metrics::counter!(BALANCE_MODE_MISMATCH, self.labels.clone()).increment(1);
    }

    pub(crate) fn live_workers(&self, n: usize) {
        metrics::gauge!(LIVE_WORKERS, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn balance_pass(&self) {
        bump(&self.counters.passes, 1);
        metrics::counter!(BALANCE_PASSES, self.labels.clone()).increment(1);
    }

    pub(crate) fn self_fenced(&self) {
        bump(&self.counters.fenced, 1);
        metrics::counter!(SELF_FENCED, self.labels.clone()).increment(1);
    }

    pub(crate) fn loop_failed(&self, which: &'static str) {
        let mut labels = self.labels.clone();
        labels.push(label(LOOP, which));
        metrics::counter!(WORKER_LOOP_FAILURES, labels).increment(1);
    }

    pub(crate) fn namespace_vanished(&self) {
        metrics::counter!(NAMESPACE_VANISHED, self.labels.clone()).increment(1);
    }

    pub(crate) fn restored(&self, n: usize) {
        metrics::counter!(LEASES_RESTORED, self.labels.clone()).increment(n as u64);
    }

    pub(crate) fn corrupt(&self, n: usize) {
        metrics::counter!(CORRUPT_RECORDS, self.labels.clone()).increment(n as u64);
    }

    pub(crate) fn taken(&self, shard: &LeaseKey) {
        bump(&self.counters.taken, 1);
        metrics::counter!(LEASES_TAKEN, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn claimed(&self, shard: &LeaseKey) {
        bump(&self.counters.claims, 1);
        metrics::counter!(CLAIMS, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn handed_over(&self, shard: &LeaseKey) {
        bump(&self.counters.handoffs, 1);
        metrics::counter!(HANDOFFS, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn lost(&self, shard: &LeaseKey) {
        bump(&self.counters.lost, 1);
        metrics::counter!(LEASES_LOST, self.for_shard(shard)).increment(1);
    }
}

/// One lease task's metrics, labelled with the namespace, the worker and the shard. The task
/// calls [`ended`](LeaseMetrics::ended) on its way out, which sets its gauges to 0.
#[derive(Debug)]
pub(crate) struct LeaseMetrics {
    labels: Vec<Label>,
    /// When this worker last checkpointed the lease, or started its task.
    last_checkpoint: Mutex<Instant>,
    /// Nanoseconds spent in the processor, in all.
    busy_nanos: std::sync::atomic::AtomicU64,
    /// The load meter (`load_meter.rs`).
    load: Mutex<crate::load_meter::LoadMeter>,
    /// The task has processed a batch at the tip of its shard since it started.
    at_tip: AtomicBool,
}

impl LeaseMetrics {
    /// A batch was read: its lag, when the source knows it.
    pub(crate) fn read(&self, batch: &Batch) {
        if let Some(ms) = batch.millis_behind {
            metrics::gauge!(MILLIS_BEHIND_LATEST, self.labels.clone()).set(ms as f64);
        }
    }

    /// A batch with records was processed successfully in `took` (retries included), `busy` of
    /// it counting toward the lease's load (its share of the worker's cores, balancing by load).
    pub(crate) fn processed(&self, batch: &Batch, took: Duration, busy: Duration) {
        let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
        metrics::counter!(RECORDS_PROCESSED, self.labels.clone())
            .increment(batch.records.len() as u64);
        metrics::counter!(BYTES_PROCESSED, self.labels.clone()).increment(bytes as u64);
        metrics::histogram!(BATCH_SECONDS, self.labels.clone()).record(took.as_secs_f64());
        let nanos = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        self.busy_nanos.fetch_add(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    /// The lease's load as of `now`: busy seconds per second, each sample weighed by the time it
    /// covers and smoothed exponentially with time constant `tau` (`load_meter.rs`: until `tau`
    /// has passed, the plain average since the task first reached the tip of its shard, see
    /// [`LeaseMetrics::handled`]). The heartbeat loop calls this every beat when balancing by load.
    pub(crate) fn sample_load(&self, now: Instant, tau: Duration) -> f64 {
        let busy = self.busy_nanos.load(std::sync::atomic::Ordering::Relaxed);
        let load = lock(&self.load).sample(busy, now, tau);
        metrics::gauge!(LEASE_LOAD, self.labels.clone()).set(load);
        load
    }

    /// A batch was read and, if it had records, processed by `now`. The first one at the tip of
    /// the shard (empty, or with no lag) starts the load meter afresh: until then the task was
    /// catching up on the records that waited while the lease had no owner, at whatever share
    /// of the cores it could get, which says nothing of the lease's steady load (a starting
    /// fleet's figures came out at twice their level).
    pub(crate) fn handled(&self, batch: &Batch, now: Instant) {
        // Read first: a steady task is at the tip on every batch, and needs no write for it.
        if self.at_tip.load(Ordering::Relaxed) {
            return;
        }
        let at_tip = batch.records.is_empty() || batch.millis_behind == Some(0);
        if at_tip && !self.at_tip.swap(true, Ordering::Relaxed) {
            let busy = self.busy_nanos.load(Ordering::Relaxed);
            *lock(&self.load) = crate::load_meter::LoadMeter::new(busy, now);
        }
    }

    pub(crate) fn processor_error(&self) {
        metrics::counter!(PROCESSOR_ERRORS, self.labels.clone()).increment(1);
    }

    pub(crate) fn processor_panic(&self) {
        metrics::counter!(PROCESSOR_PANICS, self.labels.clone()).increment(1);
    }

    /// A checkpoint of the lease was written at `now`.
    pub(crate) fn checkpointed(&self, now: Instant) {
        *lock(&self.last_checkpoint) = now;
        metrics::gauge!(CHECKPOINT_AGE, self.labels.clone()).set(0.0);
    }

    /// Sets the checkpoint age as of `now` (the heartbeat loop calls this every beat).
    pub(crate) fn refresh_checkpoint_age(&self, now: Instant) {
        let last = *lock(&self.last_checkpoint);
        let age = now.saturating_duration_since(last);
        metrics::gauge!(CHECKPOINT_AGE, self.labels.clone()).set(age.as_secs_f64());
    }

    /// The lease task ends: its gauges go to 0 (the facade cannot remove a series), so a shard
    /// this worker no longer runs neither shows a stale lag nor an ever-growing checkpoint age.
    pub(crate) fn ended(&self) {
        metrics::gauge!(MILLIS_BEHIND_LATEST, self.labels.clone()).set(0.0);
        metrics::gauge!(CHECKPOINT_AGE, self.labels.clone()).set(0.0);
        metrics::gauge!(LEASE_LOAD, self.labels.clone()).set(0.0);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use super::*;
    use crate::position::SequenceNumber;
    use crate::source::Record;

    /// One recorded series: name, sorted labels, value.
    type Series = (String, Vec<(String, String)>, DebugValue);

    /// Every series recorded.
    fn series(s: &Snapshotter) -> Vec<Series> {
        s.snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| {
                let key = k.key();
                let mut labels: Vec<(String, String)> =
                    key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
                labels.sort();
                (key.name().to_owned(), labels, v)
            })
            .collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<_> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        v.sort();
        v
    }

    fn value(all: &[Series], name: &str, with: &[(&str, &str)]) -> Option<DebugValue> {
        let want = labels(with);
        let (_, _, v) = all.iter().find(|(n, l, _)| n == name && *l == want)?;
        // `DebugValue` is not `Clone`.
        Some(match v {
            DebugValue::Counter(c) => DebugValue::Counter(*c),
            DebugValue::Gauge(g) => DebugValue::Gauge(*g),
            DebugValue::Histogram(h) => DebugValue::Histogram(h.clone()),
        })
    }

    fn gauge(v: Option<DebugValue>) -> f64 {
        match v {
            Some(DebugValue::Gauge(g)) => g.into_inner(),
            other => panic!("expected a gauge, got {other:?}"),
        }
    }

    fn batch(sizes: &[usize], millis_behind: Option<u64>) -> Batch {
        let records = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| Record {
                seq: SequenceNumber::from(i as u64 + 1),
                sub: 0,
                partition_key: "p".into(),
                data: Bytes::from(vec![0u8; *n]),
                arrival_millis: 0,
            })
            .collect();
        Batch { records, millis_behind, end: None }
    }

    #[test]
    fn two_workers_in_one_process_keep_separate_gauges() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let a = WorkerMetrics::new("orders", "w1");
            let b = WorkerMetrics::new("orders", "w2");
            a.leases_held(3);
            b.leases_held(5);
            a.lease(&"shard-0".into()).read(&batch(&[], Some(1200)));
            b.lease(&"shard-0".into()).read(&batch(&[], Some(7)));
        });
        let all = series(&snapshotter);
        let w1 = [(NAMESPACE, "orders"), (WORKER, "w1")];
        let w2 = [(NAMESPACE, "orders"), (WORKER, "w2")];
        assert_eq!(gauge(value(&all, LEASES_HELD, &w1)), 3.0);
        assert_eq!(gauge(value(&all, LEASES_HELD, &w2)), 5.0);
        let s1 = [(NAMESPACE, "orders"), (WORKER, "w1"), (SHARD, "shard-0")];
        let s2 = [(NAMESPACE, "orders"), (WORKER, "w2"), (SHARD, "shard-0")];
        assert_eq!(gauge(value(&all, MILLIS_BEHIND_LATEST, &s1)), 1200.0);
        assert_eq!(gauge(value(&all, MILLIS_BEHIND_LATEST, &s2)), 7.0);
    }

    #[test]
    fn per_lease_figures_carry_namespace_worker_and_shard() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let t0 = Instant::now();
        metrics::with_local_recorder(&recorder, || {
            let w = WorkerMetrics::new("ns", "w1");
            let shard: LeaseKey = "shard-7".into();
            let lease = w.lease(&shard);
            let b = batch(&[10, 20, 30], Some(42));
            lease.read(&b);
            lease.processed(&b, Duration::from_millis(250), Duration::from_millis(250));
            lease.processor_error();
            w.taken(&shard);
            w.handed_over(&shard);
            w.lost(&shard);
            w.claimed(&shard);
            w.self_fenced();
            lease.checkpointed(t0);
            lease.refresh_checkpoint_age(t0 + Duration::from_secs(9));
        });
        let all = series(&snapshotter);
        let shard = [(NAMESPACE, "ns"), (WORKER, "w1"), (SHARD, "shard-7")];
        assert_eq!(value(&all, RECORDS_PROCESSED, &shard), Some(DebugValue::Counter(3)));
        assert_eq!(value(&all, BYTES_PROCESSED, &shard), Some(DebugValue::Counter(60)));
        match value(&all, BATCH_SECONDS, &shard) {
            Some(DebugValue::Histogram(h)) => {
                assert_eq!(h.iter().map(|v| v.into_inner()).collect::<Vec<_>>(), vec![0.25])
            }
            other => panic!("expected a histogram, got {other:?}"),
        }
        assert_eq!(gauge(value(&all, MILLIS_BEHIND_LATEST, &shard)), 42.0);
        assert_eq!(gauge(value(&all, CHECKPOINT_AGE, &shard)), 9.0);
        for name in [PROCESSOR_ERRORS, LEASES_TAKEN, HANDOFFS, LEASES_LOST, CLAIMS] {
            assert_eq!(value(&all, name, &shard), Some(DebugValue::Counter(1)), "{name}");
        }
        let worker = [(NAMESPACE, "ns"), (WORKER, "w1")];
        assert_eq!(value(&all, SELF_FENCED, &worker), Some(DebugValue::Counter(1)));
        // Every series is labelled as METRICS says.
        for (name, got, _) in &all {
            let info = METRICS.iter().find(|m| m.name == name).unwrap();
            let mut keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
            let mut want = info.labels.to_vec();
            keys.sort_unstable();
            want.sort_unstable();
            assert_eq!(keys, want, "labels of {name}");
        }
    }

    #[test]
    fn an_ended_lease_task_zeroes_its_gauges() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let t0 = Instant::now();
        metrics::with_local_recorder(&recorder, || {
            let lease = WorkerMetrics::new("ns", "w1").lease(&"s".into());
            lease.read(&batch(&[1], Some(5000)));
            lease.refresh_checkpoint_age(t0 + Duration::from_secs(60));
            lease.ended();
        });
        let all = series(&snapshotter);
        let shard = [(NAMESPACE, "ns"), (WORKER, "w1"), (SHARD, "s")];
        assert_eq!(gauge(value(&all, MILLIS_BEHIND_LATEST, &shard)), 0.0);
        assert_eq!(gauge(value(&all, CHECKPOINT_AGE, &shard)), 0.0);
    }

    #[test]
    fn every_metric_is_unique_and_listed_in_the_operations_guide() {
        let guide = include_str!("../../../docs/operations.md");
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len(), "a metric is listed twice");
        for m in METRICS {
            assert!(
                guide.contains(&format!("`{}`", m.name)),
                "docs/operations.md misses {}",
                m.name
            );
        }
    }
}
