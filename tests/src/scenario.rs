//! The fleet scenario every store runs: three consumers start, a fourth joins, one leaves
//! gracefully, one crashes, while a producer keeps writing to an in-memory stream they all read.
//! After each step the scenario waits (polling, with a generous deadline) until the leases are
//! balanced again; before the crash it waits until every shard has been processed past what was
//! written when the graceful steps were over, so any record they delivered twice has been counted.
//! At the end the producer stops and every record written must be processed.
//!
//! What the engine guarantees, and so what a caller may assert: every record is processed; a
//! start, a join and a graceful leave process nothing twice (an owner checkpoints before it lets
//! a lease go); a crash may deliver again what its victim processed after its last checkpoint.

use shardlease::store::VersionedLease;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shardlease::store::LeaseStore;
use shardlease::{LeaseKey, MemorySource, SequenceNumber, ShardSource, WorkerHandle};
use shardlease_examples::{poll_until, DeliveryLog, Distribution};
use tokio::time::Instant;

use crate::consumer::run_consumer;

/// Shards of the stream the fleet shares.
pub const SHARDS: usize = 12;

/// How fast the scenario runs on one store.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// The workers' heartbeat interval; every other timing of theirs follows it (failover and
    /// shutdown 20×, claim 40×; see `run_consumer`).
    pub heartbeat: Duration,
    /// How long any one wait may take before the scenario fails.
    pub deadline: Duration,
    /// How often conditions are checked.
    pub poll: Duration,
    /// The producer writes one record every this often.
    pub produce_every: Duration,
}

impl Timing {
    /// Timings for a local server, `scale` times slower than the fastest (1 for memory, SQLite,
    /// PostgreSQL, MySQL, Redis and etcd; more for an emulator that answers a few hundred writes
    /// a second). Generous on purpose: the scenario must hold on a loaded 2-core machine.
    pub fn scaled(scale: u32) -> Self {
        let k = scale.max(1);
        Timing {
            heartbeat: Duration::from_millis(300) * k,
            deadline: Duration::from_secs(90) * k,
            poll: Duration::from_millis(50) * k,
            produce_every: Duration::from_millis(5) * k,
        }
    }
}

/// What one run of the scenario saw.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The store's name, for the result line.
    pub store: String,
    /// Records the producer wrote.
    pub produced: u64,
    /// Distinct records processed at least once.
    pub processed: u64,
    /// Records processed more than once by the start, the join and the graceful leave (the
    /// engine promises 0).
    pub twice_graceful: u64,
    /// Records processed more than once from the crash on (allowed: a replay since the crashed
    /// worker's last checkpoint).
    pub twice_after_crash: u64,
    /// How long each step took until the leases were balanced again.
    pub steps: Vec<(&'static str, Duration)>,
    /// The whole scenario, connect to shutdown.
    pub total: Duration,
}

impl Report {
    /// One line for the lead's table: records, processed twice, seconds.
    pub fn line(&self) -> String {
        let steps: Vec<String> =
            self.steps.iter().map(|(s, d)| format!("{s} {:.1}s", d.as_secs_f64())).collect();
        format!(
            "e2e {:<8} records={} processed={} twice_graceful={} twice_after_crash={} \
             total={:.1}s ({})",
            self.store,
            self.produced,
            self.processed,
            self.twice_graceful,
            self.twice_after_crash,
            self.total.as_secs_f64(),
            steps.join(", ")
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes records with varied partition keys until stopped, remembering the last record it wrote
/// to each shard.
struct Producer {
    stop: Arc<AtomicBool>,
    last: Arc<Mutex<BTreeMap<LeaseKey, SequenceNumber>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(source: MemorySource, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(BTreeMap::new()));
        let task = {
            let (stop, last) = (stop.clone(), last.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n: u64 = 0;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let customer = n.wrapping_mul(2_654_435_761) % 10_007;
                    let (shard, seq) = source.put(&format!("customer-{customer}"), format!("{n}"));
                    lock(&last).insert(shard, seq);
                    n += 1;
                }
            })
        };
        Producer { stop, last, task }
    }

    /// The last record written to each shard so far.
    fn marks(&self) -> BTreeMap<LeaseKey, SequenceNumber> {
        lock(&self.last).clone()
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
    }
}

/// The fleet: the running consumers and everything they share.
struct Fleet {
    url: String,
    source: MemorySource,
    log: DeliveryLog,
    timing: Timing,
    workers: Vec<Arc<WorkerHandle>>,
    observer: Arc<dyn LeaseStore>,
}

impl Fleet {
    async fn start_consumer(&mut self, id: &str) -> Result<Arc<WorkerHandle>, String> {
        let stream: Arc<dyn ShardSource> = Arc::new(self.source.clone());
        let handle = run_consumer(&self.url, id, stream, &self.log, self.timing.heartbeat)
            .await
            .map_err(|e| format!("starting consumer {id}: {e}"))?;
        let handle = Arc::new(handle);
        self.workers.push(handle.clone());
        Ok(handle)
    }

    fn running(&self) -> usize {
        self.workers.iter().filter(|w| w.is_running()).count()
    }

    /// Waits until every active lease is processed by a running worker, shares within one, with
    /// exactly `running` workers sharing all [`SHARDS`] leases.
    async fn until_balanced(&self, step: &str) -> Result<Distribution, String> {
        let want = self.running();
        let last = Mutex::new(String::from("(nothing read yet)"));
        let last = &last;
        let found = poll_until(
            &format!("the leases to balance after {step}"),
            self.timing.deadline,
            self.timing.poll,
            || async move {
                let d = Distribution::read(self.observer.as_ref(), &self.workers).await.ok()?;
                *lock(last) = d.shares_line();
                (d.is_balanced() && d.active == SHARDS && d.shares.len() == want).then_some(d)
            },
        )
        .await;
        found.map_err(|e| format!("{e}; last seen: {}", lock(last)))
    }

    /// Waits until every shard has been processed up to `marks` (the last record written to each
    /// shard at some moment): a shard is read in order, so everything before is processed too.
    async fn until_caught_up(
        &self,
        marks: &BTreeMap<LeaseKey, SequenceNumber>,
    ) -> Result<(), String> {
        poll_until(
            "every shard to be processed up to the records written before the crash",
            self.timing.deadline,
            self.timing.poll,
            || async move {
                marks
                    .iter()
                    .all(|(k, s)| self.log.deliveries(&(k.clone(), s.clone(), 0)) > 0)
                    .then_some(())
            },
        )
        .await
    }

    /// Waits until every record written has been processed at least once.
    async fn until_drained(&self) -> Result<(), String> {
        let produced = self.source.produced();
        poll_until(
            "every record written to be processed",
            self.timing.deadline,
            self.timing.poll,
            || async move { (self.log.distinct() >= produced).then_some(()) },
        )
        .await
        .map_err(|e| format!("{e}: {} of {produced} processed", self.log.distinct()))
    }

    /// Shuts every running worker down gracefully; returns the first error.
    async fn shutdown_all(&self) -> Result<(), String> {
        let mut first = Ok(());
        for w in self.workers.iter().filter(|w| w.is_running()) {
            if let Some(e) = w.shutdown().await.record_error {
                first = first.and(Err(format!("shutting down {}: {e}", w.id())));
            }
        }
        first
    }

    /// Deletes what the run left in the store (the leases and the crashed worker's record), so
    /// shared test servers do not fill up; best effort, through the public store API.
    async fn clean_up(&self) {
        if let Ok(listing) = self.observer.list_leases().await {
            for VersionedLease { lease, version } in listing.items {
                let _ = self.observer.delete_lease(&lease.key, version).await;
            }
        }
        if let Ok(workers) = self.observer.list_workers().await {
            for w in workers.items {
                let _ = self.observer.remove_worker(&w.id).await;
            }
        }
    }
}

/// Runs the scenario with consumers connecting to `url` (which should name a fresh namespace)
/// and reports what it saw; an `Err` says which wait timed out or which call failed. The caller
/// asserts on the report.
pub async fn fleet_scenario(store: &str, url: &str, timing: Timing) -> Result<Report, String> {
    let t0 = Instant::now();
    let observer = shardlease::connect(url)
        .await
        .map_err(|e| format!("{store}: connecting to {}: {e}", shardlease::redact_url(url)))?;
    let existing = observer.list_leases().await.map_err(|e| e.to_string())?;
    if !existing.items.is_empty() {
        return Err(format!("{store}: the namespace already holds leases; use a fresh one"));
    }
    let source = MemorySource::new(SHARDS);
    let mut fleet = Fleet {
        url: url.to_owned(),
        source: source.clone(),
        log: DeliveryLog::new(),
        timing,
        workers: Vec::new(),
        observer,
    };
    let producer = Producer::start(source, timing.produce_every);
    let outcome = steps(&mut fleet, producer).await;
    let shut = fleet.shutdown_all().await;
    fleet.clean_up().await;
    let (mut report, ()) = (outcome?, shut?);
    report.store = store.to_owned();
    report.total = t0.elapsed();
    Ok(report)
}

async fn steps(fleet: &mut Fleet, producer: Producer) -> Result<Report, String> {
    let mut steps = Vec::new();

    let t = Instant::now();
    for id in ["w1", "w2", "w3"] {
        fleet.start_consumer(id).await?;
    }
    fleet.until_balanced("the start of 3 consumers").await?;
    steps.push(("start", t.elapsed()));

    let t = Instant::now();
    fleet.start_consumer("w4").await?;
    fleet.until_balanced("w4 joined").await?;
    steps.push(("join", t.elapsed()));

    let t = Instant::now();
    let leaving = fleet.workers[0].clone();
    if let Some(e) = leaving.shutdown().await.record_error {
        return Err(format!("graceful leave of w1: {e}"));
    }
    fleet.until_balanced("w1 left").await?;
    steps.push(("leave", t.elapsed()));

    // Every record a graceful step could have delivered twice lies before these marks.
    fleet.until_caught_up(&producer.marks()).await?;
    let twice_graceful = fleet.log.redelivered();

    let t = Instant::now();
    fleet.workers[1].crash();
    fleet.until_balanced("w2 crashed").await?;
    steps.push(("crash", t.elapsed()));

    producer.stop().await;
    let t = Instant::now();
    fleet.until_drained().await?;
    steps.push(("drain", t.elapsed()));

    Ok(Report {
        store: String::new(),
        produced: fleet.source.produced(),
        processed: fleet.log.distinct(),
        twice_graceful,
        twice_after_crash: fleet.log.redelivered().saturating_sub(twice_graceful),
        steps,
        total: Duration::ZERO,
    })
}
