//! Every metric shardlease emits, named in one place, and the handles the runtime emits them
//! through.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (the Prometheus exporter, say)
//! and they appear; install none and they cost next to nothing. Each worker keeps a
//! [`WorkerMetrics`] labelled with its `namespace` and `worker`, and each lease task a
//! [`LeaseMetrics`] that adds `shard`, so two workers in one process (or one worker's many shards)
//! never write the same series. Handles resolve their series at every call, so a recorder
//! installed after the workers were built still receives everything from then on.
//!
//! [`METRICS`] lists every metric with its type, labels and meaning; `docs/operations.md` lists
//! the same (a test checks that it names each one), and [`describe`] hands the descriptions to the
//! installed recorder (the Prometheus exporter prints them as `# HELP`).

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
/// Label: the store operation (`create_lease`, `list_leases`, ...).
pub const OPERATION: &str = "operation";
/// Label: the kind of a store error (see [`error_kind`]).
pub const KIND: &str = "kind";

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
/// Counter: errors returned by the record processor.
pub const PROCESSOR_ERRORS: &str = "shardlease_processor_errors_total";
/// Counter: record processor panics.
pub const PROCESSOR_PANICS: &str = "shardlease_processor_panics_total";
/// Histogram: seconds a store call took.
pub const STORE_CALL_SECONDS: &str = "shardlease_store_call_seconds";
/// Counter: store calls that returned an error.
pub const STORE_ERRORS: &str = "shardlease_store_errors_total";

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
        info(LIVE_WORKERS, Gauge, BY_WORKER, "Worker records listed at the last heartbeat."),
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
        info(PROCESSOR_ERRORS, Counter, BY_SHARD, "Errors returned by the record processor."),
        info(PROCESSOR_PANICS, Counter, BY_SHARD, "Record processor panics."),
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
pub fn error_kind(e: &crate::error::Error) -> &'static str {
    use crate::error::Error;
    match e {
        Error::Conflict { .. } => "conflict",
        Error::LeaseLost { .. } => "lease_lost",
        Error::Corrupt { .. } => "corrupt",
        Error::Config(_) => "config",
        Error::InvalidInput(_) => "invalid_input",
        Error::Backend { retryable: true, .. } => "retryable",
        Error::Backend { retryable: false, .. } => "permanent",
        Error::Shutdown => "shutdown",
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn label(key: &'static str, value: &str) -> Label {
    Label::new(key, Arc::<str>::from(value))
}

/// One worker's metrics, labelled with its namespace and configured id.
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    labels: Vec<Label>,
}

impl WorkerMetrics {
    pub(crate) fn new(namespace: &str, worker: &str) -> Self {
        WorkerMetrics { labels: vec![label(NAMESPACE, namespace), label(WORKER, worker)] }
    }

    fn for_shard(&self, shard: &LeaseKey) -> Vec<Label> {
        let mut labels = self.labels.clone();
        labels.push(label(SHARD, shard.as_str()));
        labels
    }

    /// The metrics of one lease task of this worker.
    pub(crate) fn lease(&self, shard: &LeaseKey) -> LeaseMetrics {
        LeaseMetrics { labels: self.for_shard(shard), last_checkpoint: Mutex::new(Instant::now()) }
    }

    pub(crate) fn leases_held(&self, n: usize) {
        metrics::gauge!(LEASES_HELD, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn leases_stuck(&self, n: u64) {
        metrics::gauge!(LEASES_STUCK, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn live_workers(&self, n: usize) {
        metrics::gauge!(LIVE_WORKERS, self.labels.clone()).set(n as f64);
    }

    pub(crate) fn balance_pass(&self) {
        metrics::counter!(BALANCE_PASSES, self.labels.clone()).increment(1);
    }

    pub(crate) fn self_fenced(&self) {
        metrics::counter!(SELF_FENCED, self.labels.clone()).increment(1);
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
        metrics::counter!(LEASES_TAKEN, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn claimed(&self, shard: &LeaseKey) {
        metrics::counter!(CLAIMS, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn handed_over(&self, shard: &LeaseKey) {
        metrics::counter!(HANDOFFS, self.for_shard(shard)).increment(1);
    }

    pub(crate) fn lost(&self, shard: &LeaseKey) {
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
}

impl LeaseMetrics {
    /// A batch was read: its lag, when the source knows it.
    pub(crate) fn read(&self, batch: &Batch) {
        if let Some(ms) = batch.millis_behind {
            metrics::gauge!(MILLIS_BEHIND_LATEST, self.labels.clone()).set(ms as f64);
        }
    }

    /// A batch with records was processed successfully in `took` (retries included).
    pub(crate) fn processed(&self, batch: &Batch, took: Duration) {
        let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
        metrics::counter!(RECORDS_PROCESSED, self.labels.clone()).increment(batch.records.len() as u64);
        metrics::counter!(BYTES_PROCESSED, self.labels.clone()).increment(bytes as u64);
        metrics::histogram!(BATCH_SECONDS, self.labels.clone()).record(took.as_secs_f64());
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
    }
}
