//! The shardlease side of a child: a [`RecordProcessor`] per lease that runs one child and turns
//! each hook into the MultiLang message the KCL would send, made by [`MultiLangFactory`].
//!
//! A child that fails (exits, crashes, writes a non-JSON line, answers the wrong `responseFor`,
//! stops answering past `timeoutInSeconds`) costs its lease alone: the child is killed, nothing
//! it says is checkpointed any more, and the lease is given up so the shard resumes from its last
//! checkpoint (the records it was given since are delivered again, to a new child): the processor
//! returns [`Error::ReleaseLease`], on which the runtime tells it `lease_lost` and releases the
//! lease (an ordinary error would retry the same batch with a new child, skipping what the dead
//! one had been given but not acknowledged). The next child for that shard starts after a backoff
//! that doubles with each failure in a row. Other leases and the daemon carry on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardlease::{
    Batch, BoxError, CheckpointHandle, Error, LeaseContext, Position, ProcessorFactory,
    RecordProcessor,
};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::{error, warn};

use crate::child::{ChildProcess, Fault};
use crate::exchange::{exchange, CheckpointScope};
use crate::protocol::ToChild;
use crate::settings::ChildSettings;
use crate::telemetry;

/// Counts of what the children did, for tests and reports (the same events are counted in the
/// `metrics` facade, [`crate::telemetry`]).
#[derive(Debug, Default)]
pub struct ChildStats {
    started: AtomicU64,
    faults: AtomicU64,
    killed_after_eof: AtomicU64,
    leases_given_up: AtomicU64,
}

impl ChildStats {
    /// Children started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }
    /// Children that failed (any [`Fault`]).
    pub fn faults(&self) -> u64 {
        self.faults.load(Ordering::SeqCst)
    }
    /// Children killed because they did not exit once their stdin was closed.
    pub fn killed_after_eof(&self) -> u64 {
        self.killed_after_eof.load(Ordering::SeqCst)
    }
    /// Leases given up because their child failed.
    pub fn leases_given_up(&self) -> u64 {
        self.leases_given_up.load(Ordering::SeqCst)
    }
}

/// What every processor of one daemon shares.
#[derive(Debug)]
struct Shared {
    settings: ChildSettings,
    stats: Arc<ChildStats>,
    /// Per shard: failures in a row and when the last one happened.
    failures: Mutex<HashMap<String, (u32, Instant)>>,
    /// Children being told goodbye in the background (`leaseLost`, EOF, exit or kill).
    farewells: TaskTracker,
}

/// Makes one [`MultiLangProcessor`] per lease.
#[derive(Clone, Debug)]
pub struct MultiLangFactory {
    shared: Arc<Shared>,
}

impl MultiLangFactory {
    /// A factory running children as `settings` say.
    pub fn new(settings: ChildSettings) -> Self {
        MultiLangFactory {
            shared: Arc::new(Shared {
                settings,
                stats: Arc::default(),
                failures: Mutex::default(),
                farewells: TaskTracker::new(),
            }),
        }
    }

    /// The counts of what the children did.
    pub fn stats(&self) -> Arc<ChildStats> {
        self.shared.stats.clone()
    }

    /// Waits until every child told goodbye has exited or been killed (each within the exit
    /// bound of the settings).
    pub async fn wait_for_children(&self) {
        self.shared.farewells.close();
        self.shared.farewells.wait().await;
    }
}

impl ProcessorFactory for MultiLangFactory {
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        Box::new(MultiLangProcessor {
            shared: self.shared.clone(),
            shard: ctx.key().to_string(),
            child: None,
            last_delivered: None,
            in_flight: false,
        })
    }
}

/// The processor of one lease: one child at a time.
#[derive(Debug)]
pub struct MultiLangProcessor {
    shared: Arc<Shared>,
    shard: String,
    child: Option<ChildProcess>,
    /// The last record handed to the child (what a checkpoint without a sequence number means).
    last_delivered: Option<Position>,
    /// Set while a message awaits its status: a future dropped there leaves the child out of step.
    in_flight: bool,
}

impl Shared {
    fn backoff_for(&self, shard: &str) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let (n, at) = failures.get(shard)?;
        let exp = n.saturating_sub(1).min(16);
        let wait = self
            .settings
            .restart_backoff
            .saturating_mul(1u32 << exp)
            .min(self.settings.restart_backoff_max);
        let ready = *at + wait;
        let now = Instant::now();
        (ready > now).then(|| ready - now)
    }

    fn record_failure(&self, shard: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let entry = failures.entry(shard.to_owned()).or_insert((0, Instant::now()));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = Instant::now();
    }

    fn record_success(&self, shard: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(shard);
    }
}

impl MultiLangProcessor {
    /// Counts and logs `fault`, kills the child.
    async fn fault(&mut self, during: &'static str, fault: &Fault) {
        self.shared.stats.faults.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(telemetry::CHILD_FAULTS, "shard" => self.shard.clone(), "fault" => fault.kind())
            .increment(1);
        self.shared.record_failure(&self.shard);
        let pid = self.child.as_ref().and_then(ChildProcess::pid);
        error!(shard = %self.shard, pid, during, fault = fault.kind(), error = %fault, "child failed; killing it");
        if let Some(mut child) = self.child.take() {
            child.kill().await;
        }
        self.in_flight = false;
    }

    /// Gives the lease up after a fault: the error to return, on which the runtime releases the
    /// lease and the shard resumes from its last checkpoint.
    fn give_up(&self, during: &'static str) -> BoxError {
        self.shared.stats.leases_given_up.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(telemetry::LEASES_GIVEN_UP, "shard" => self.shard.clone()).increment(1);
        Box::new(Error::ReleaseLease(format!(
            "multilang child of shard {} failed during {during}",
            self.shard
        )))
    }

    async fn call(&mut self, msg: &ToChild, scope: CheckpointScope<'_>) -> Result<(), Fault> {
        let Some(child) = self.child.as_mut() else {
            return Err(Fault::Exited { awaiting: msg.action() });
        };
        self.in_flight = true;
        exchange(child, msg, scope, self.shared.settings.response_timeout).await?;
        self.in_flight = false;
        Ok(())
    }

    /// Tells the child goodbye in the background: `leaseLost` when `lease_lost` (its status
    /// awaited up to the exit bound), then EOF, then its exit awaited up to the bound, then kill.
    fn farewell(&mut self, lease_lost: bool) {
        let Some(mut child) = self.child.take() else { return };
        let shared = self.shared.clone();
        let shard = self.shard.clone();
        let out_of_step = self.in_flight;
        self.shared.farewells.spawn(async move {
            let bound = shared.settings.exit_timeout;
            if out_of_step {
                warn!(shard = %shard, "child interrupted in the middle of a message; killing it");
                child.kill().await;
                return;
            }
            if lease_lost {
                let told =
                    exchange(&mut child, &ToChild::LeaseLost, CheckpointScope::None, Some(bound));
                if let Err(e) = told.await {
                    warn!(shard = %shard, error = %e, "child did not acknowledge leaseLost");
                }
            }
            if child.finish(bound).await {
                shared.stats.killed_after_eof.fetch_add(1, Ordering::SeqCst);
                metrics::counter!(telemetry::CHILDREN_KILLED, "shard" => shard).increment(1);
            }
        });
    }
}

#[async_trait]
impl RecordProcessor for MultiLangProcessor {
    async fn initialize(&mut self, ctx: &LeaseContext) -> Result<(), BoxError> {
        if let Some(wait) = self.shared.backoff_for(&self.shard) {
            warn!(shard = %self.shard, ?wait, "waiting before starting this shard's next child");
            tokio::time::sleep(wait).await;
        }
        let child = match ChildProcess::spawn(&self.shared.settings.command, &self.shard) {
            Ok(c) => c,
            Err(fault) => {
                self.fault("start", &fault).await;
                return Err(fault.into());
            }
        };
        self.shared.stats.started.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(telemetry::CHILDREN_STARTED).increment(1);
        self.child = Some(child);
        self.last_delivered = None;
        let msg = ToChild::initialize(&self.shard, &ctx.start);
        if let Err(fault) = self.call(&msg, CheckpointScope::None).await {
            // Nothing was delivered yet: the runtime retries `initialize` (a new child) after
            // its backoff.
            self.fault("initialize", &fault).await;
            return Err(fault.into());
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        if batch.records.is_empty() && !self.shared.settings.call_for_empty_batches {
            return Ok(());
        }
        let last = batch.last_position().or_else(|| self.last_delivered.clone());
        let msg = ToChild::process_records(batch);
        let scope = CheckpointScope::UpTo { handle: checkpointer, last: last.as_ref() };
        if let Err(fault) = self.call(&msg, scope).await {
            self.fault("processRecords", &fault).await;
            return Err(self.give_up("processRecords"));
        }
        self.last_delivered = last;
        self.shared.record_success(&self.shard);
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.farewell(true);
    }

    async fn shard_ended(&mut self, checkpointer: &CheckpointHandle) -> Result<(), BoxError> {
        let scope = CheckpointScope::ShardEnd { handle: checkpointer };
        let Some(child) = self.child.as_mut() else {
            return Err(self.give_up("shardEnded"));
        };
        self.in_flight = true;
        let result =
            exchange(child, &ToChild::ShardEnded, scope, self.shared.settings.response_timeout)
                .await;
        self.in_flight = false;
        match result {
            Err(fault) => {
                self.fault("shardEnded", &fault).await;
                Err(self.give_up("shardEnded"))
            }
            Ok(outcome) if outcome.written.iter().any(Position::is_shard_end) => {
                self.farewell(false);
                Ok(())
            }
            Ok(_) => Err(format!(
                "the child of shard {} answered shardEnded without checkpointing the shard's \
                 end (checkpoint with no sequence number); its children cannot start until it does",
                self.shard
            )
            .into()),
        }
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        let last = self.last_delivered.clone();
        let scope = CheckpointScope::UpTo { handle: checkpointer, last: last.as_ref() };
        match self.call(&ToChild::ShutdownRequested, scope).await {
            Ok(()) => {
                // As the KCL does after a requested shutdown: the lease goes, `leaseLost` follows.
                self.farewell(true);
                Ok(())
            }
            Err(fault) => {
                self.fault("shutdownRequested", &fault).await;
                Err(fault.into())
            }
        }
    }
}

impl Drop for MultiLangProcessor {
    fn drop(&mut self) {
        // A processor dropped with its child (a hook cut short by a stop): say goodbye all the
        // same, in the background, when a runtime is there to do it; else the child is killed
        // as it is dropped (`kill_on_drop`).
        if self.child.is_some() && tokio::runtime::Handle::try_current().is_ok() {
            self.farewell(true);
        }
    }
}
