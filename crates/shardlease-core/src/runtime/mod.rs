//! The worker runtime: builds a worker from a store, a source and a processor factory, runs its
//! loops (heartbeat, watchdog, balance, shard sync, store notices) and one task per held lease,
//! and shuts it down gracefully (or, for tests and benchmarks, crashes it).
//!
//! The balance loop owns the worker's coordination state; the other loops and the lease tasks
//! send it events (`events`) and read what it publishes. docs/algorithm.md, "Who owns the
//! runtime's state".

mod balance;
mod cas;
mod core_share;
mod events;
mod heartbeat;
mod heartbeat_thread;
mod lease_task;
mod notices;
mod recovery;
mod retire;
mod shard_sync;
mod shared;
mod shutdown_report;

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tracing::{error, info, warn, Instrument};

use crate::balancer::{Balancer, GreedyBalancer};
use crate::checkpointer::{Checkpointer, StoreCheckpointer};
use crate::config::Config;
use crate::error::Result;
use crate::ids::WorkerId;
use crate::lease::LeaseKey;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::store::LeaseStore;
pub use shared::INCARNATION_SEPARATOR;
use shared::{Receivers, Shared};
pub use shutdown_report::{ReleasedLease, ShutdownReport};

/// A configured worker, ready to [`start`](Worker::start).
pub struct Worker {
    shared: Arc<Shared>,
    /// The receiving ends of the balance loop's events and the sync loop's requests, handed to
    /// them at start.
    receivers: Receivers,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.shared.id())
            .field("namespace", &self.shared.cfg.namespace())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Worker`]; see [`Worker::builder`].
pub struct WorkerBuilder {
    config: Config,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    factory: Arc<dyn ProcessorFactory>,
    checkpointer: Option<Arc<dyn Checkpointer>>,
    balancer: Arc<dyn Balancer>,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("config", &self.config)
            .field("custom_checkpointer", &self.checkpointer.is_some())
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// Uses a custom checkpointer (positions in your own database) instead of the lease record.
    pub fn checkpointer(mut self, c: Arc<dyn Checkpointer>) -> Self {
        self.checkpointer = Some(c);
        self
    }

    /// Uses a custom balancer instead of the greedy one.
    pub fn balancer(mut self, b: Arc<dyn Balancer>) -> Self {
        self.balancer = b;
        self
    }

    /// Validates the configuration and builds the worker.
    pub fn build(self) -> Result<Worker> {
        self.config.validate()?;
        // The store decides where leases live (a URL's `?namespace=`, the namespace a store was
        // opened on); a `Config` naming another would be a second, silently ignored answer.
        if let Some(ns) = self.store.namespace() {
            if ns != *self.config.namespace() {
                return Err(crate::error::Error::Config(format!(
                    "the store is opened on namespace {:?} but the Config names {:?}; leases live \
                     in the store's namespace, so make the two agree",
                    ns.as_str(),
                    self.config.namespace().as_str()
                )));
            }
        }
        // The default checkpointer is kept by its type too, to feed its cache with what the
        // runtime reads and writes; a custom one gets nothing but the `Checkpointer` calls.
        let (checkpointer, default_checkpointer) = match self.checkpointer {
            Some(c) => (c, None),
            None => {
                let d = Arc::new(StoreCheckpointer::new(self.store.clone()));
                (d.clone() as Arc<dyn Checkpointer>, Some(d))
            }
        };
        let (shared, receivers) = Shared::new(
            self.config,
            self.store,
            self.source,
            self.factory,
            checkpointer,
            default_checkpointer,
            self.balancer,
        );
        Ok(Worker { shared: Arc::new(shared), receivers })
    }
}

impl Worker {
    /// A builder for a worker that reads `source`, coordinates through `store` and processes with
    /// processors from `factory`.
    pub fn builder(
        config: Config,
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
    ) -> WorkerBuilder {
        WorkerBuilder {
            config,
            store,
            source,
            factory,
            checkpointer: None,
            balancer: Arc::new(GreedyBalancer::default()),
        }
    }

    /// This worker's id.
    pub fn id(&self) -> WorkerId {
        self.shared.id()
    }

    /// Creates leases for the source's shards now, before starting (the worker also does this at
    /// start when the namespace is empty, and every `shard_sync_interval`).
    pub async fn sync_shards(&self) -> Result<()> {
        // Not started: no memory of the namespace yet.
        shard_sync::sync(&self.shared, &[]).await
    }

    /// Starts the worker's loops on the current tokio runtime.
    pub fn start(self) -> WorkerHandle {
        let Worker { shared, receivers } = self;
        let Receivers { events, sync } = receivers;
        let span = tracing::info_span!("worker", worker = %shared.cfg.worker_id(), namespace = %shared.cfg.namespace());
        info!(parent: &span, "worker starting");
        let dedicated = shared.cfg.dedicated_heartbeat_thread();
        let loops = vec![
            heartbeat_thread::spawn(
                dedicated,
                heartbeat::heartbeat_loop(shared.clone()).instrument(span.clone()),
            ),
            heartbeat_thread::spawn(
                dedicated,
                heartbeat::watchdog(shared.clone()).instrument(span.clone()),
            ),
            tokio::spawn(balance::balance_loop(shared.clone(), events).instrument(span.clone())),
            tokio::spawn(
                shard_sync::shard_sync_loop(shared.clone(), sync).instrument(span.clone()),
            ),
            tokio::spawn(notices::notice_loop(shared.clone()).instrument(span.clone())),
        ];
        WorkerHandle { shared, loops: Mutex::new(loops), shutdown: tokio::sync::Mutex::new(false) }
    }
}

/// Counters describing what a worker has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Balance passes run (with or without a listing of the leases).
    pub passes: u64,
    /// Balance passes that listed the leases. A quiet fleet lists only when some worker changed
    /// an owner, a worker came, went or died, or the safety net is due (see docs/algorithm.md).
    pub lease_listings: u64,
    /// Ownership changes this worker made (takes, handoffs, releases, claims, shard ends,
    /// creations, deletions, restores): the count its heartbeat publishes.
    pub changes: u64,
    /// Balance passes that took at least one lease.
    pub taking_passes: u64,
    /// Leases taken (available leases and stuck claims).
    pub taken: u64,
    /// Handoff requests written.
    pub claims: u64,
    /// Leases handed over to a claimant.
    pub handoffs: u64,
    /// Leases lost to a refused fenced write.
    pub lost: u64,
    /// Times this worker fenced itself.
    pub fenced: u64,
    /// Records processed successfully.
    pub records: u64,
    /// Successful heartbeats.
    pub heartbeats: u64,
    /// Leases stuck right now: their processor keeps failing with an error that retrying cannot
    /// fix (a checkpoint behind the stored one, invalid input). Each is logged once at ERROR
    /// with what to do, and retried with backoff up to a minute; the count drops when it recovers.
    pub stuck: u64,
}

/// Controls a running worker.
pub struct WorkerHandle {
    shared: Arc<Shared>,
    /// The join handles of the worker's loops, taken once (by `shutdown` or an abrupt stop). The
    /// lock guards these handles only, never coordination state (the balance loop owns that).
    loops: Mutex<Vec<JoinHandle<()>>>,
    /// Whether a shutdown ran: held across `shutdown` so that concurrent calls run it once (the
    /// second returns an empty report). Guards this flag only.
    shutdown: tokio::sync::Mutex<bool>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle").field("id", &self.shared.id()).finish_non_exhaustive()
    }
}

impl WorkerHandle {
    /// This worker's current id: the configured one, or `<id>#<random>` after a self-fence (a
    /// worker that fenced itself comes back as a new incarnation).
    pub fn id(&self) -> WorkerId {
        self.shared.id()
    }

    /// The leases this worker is processing now.
    pub fn held_leases(&self) -> Vec<LeaseKey> {
        self.shared.held_leases()
    }

    /// Whether the worker has fenced itself and not yet recovered.
    pub fn is_fenced(&self) -> bool {
        self.shared.is_fenced()
    }

    /// Whether the worker is still running (not shut down or crashed).
    pub fn is_running(&self) -> bool {
        !self.shared.cancel.is_cancelled()
    }

    /// What the worker has done so far.
    pub fn stats(&self) -> WorkerStats {
        let s = &self.shared.metrics.counters;
        let get = crate::telemetry::Counters::get;
        WorkerStats {
            passes: get(&s.passes),
            lease_listings: get(&s.lease_listings),
            changes: *self.shared.changes.borrow(),
            taking_passes: get(&s.taking_passes),
            taken: get(&s.taken),
            claims: get(&s.claims),
            handoffs: get(&s.handoffs),
            lost: get(&s.lost),
            fenced: get(&s.fenced),
            records: get(&s.records),
            heartbeats: get(&s.heartbeats),
            stuck: get(&s.stuck),
        }
    }

    /// Test hook (feature `test-util`). Asks the balance loop for a pass that lists the leases, now, and waits for it (normally
    /// the loop runs passes on its own). The loop is the only one to run passes, so this never
    /// races one of them; it returns at once when the worker is stopping, and without a pass
    /// while the worker is fenced.
    #[cfg(feature = "test-util")]
    pub async fn balance_now(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // An error means the loop has ended: no pass to wait for.
        if self.shared.events.send(events::Event::Request(events::Request::Pass(tx))).is_err() {
            return;
        }
        // An error means the loop ended without answering: nothing more to wait for.
        let _ = rx.await;
    }

    /// Runs one shard sync now (normally the sync loop does this on its own).
    pub async fn sync_shards(&self) -> Result<()> {
        shard_sync::sync_now(&self.shared).await
    }

    /// Graceful shutdown: stop taking, stop readers, let every processor checkpoint
    /// (`shutdown_requested`), release every lease (epoch + 1, checkpoint kept) and remove the
    /// worker record, all within `shutdown_timeout` (plus at most a heartbeat interval for
    /// processors cut short at the deadline, which hear `lease_lost` first). Idempotent: a second call returns an empty
    /// report.
    ///
    /// The report says what became of each lease, and in particular which processors had to be
    /// cut short ([`ShutdownReport::abandoned`]: their next owner processes again what followed
    /// the last checkpoint). An error means the worker record could not be removed; the worker
    /// has stopped all the same, and its peers treat it as dead after the failover timeout.
    pub async fn shutdown(&self) -> Result<ShutdownReport> {
        let mut done = self.shutdown.lock().await;
        if *done || self.shared.cancel.is_cancelled() {
            *done = true;
            return Ok(ShutdownReport::default());
        }
        let shared = &self.shared;
        info!(worker = %shared.id(), "shutting down");
        shared.stop_taking.cancel();
        let deadline = tokio::time::Instant::now() + shared.cfg.shutdown_timeout();
        // Every lease task sees this at once and stops gracefully, whatever the balance loop is
        // doing; the loop, which owns the tasks, collects how each of them ended (or cuts it short
        // at the deadline) and withdraws this worker's claims.
        shared.shutdown.send_replace(Some(deadline));
        let (reply, answer) = tokio::sync::oneshot::channel();
        shared.tell(events::Event::Request(events::Request::Shutdown { deadline, reply }));
        let report = match answer.await {
            Ok(report) => report,
            Err(_) => {
                // The balance loop is gone (it panicked): nobody can say how the tasks ended.
                error!("the balance loop ended before the shutdown; stopping the lease tasks as they are");
                let held = shared.held.borrow().clone();
                for t in held.iter() {
                    t.abort.abort();
                }
                let not_released = held.iter().map(|t| t.key.clone()).collect();
                ShutdownReport { not_released, ..Default::default() }
            }
        };
        shared.cancel.cancel();
        let loops = std::mem::take(&mut *lock(&self.loops));
        for l in loops {
            let _ = l.await;
        }
        let removed = remove_record(shared).await;
        *done = true;
        info!(
            released = report.released.len(),
            abandoned = report.abandoned.len(),
            not_released = report.not_released.len(),
            "shut down"
        );
        removed.map(|()| report)
    }

    /// Stops everything at once without releasing leases or removing the worker record, as if the
    /// process had died. Test hook (feature `test-util`), for tests, benchmarks and demos.
    #[cfg(feature = "test-util")]
    pub fn crash(&self) {
        self.stop_abruptly();
    }

    /// Stops every loop and task at once, releasing nothing (a crash, or a handle dropped
    /// without `shutdown()`).
    fn stop_abruptly(&self) {
        self.shared.stop_taking.cancel();
        self.shared.cancel.cancel();
        for l in lock(&self.loops).drain(..) {
            l.abort();
        }
        for t in self.shared.held.borrow().iter() {
            t.abort.abort();
        }
    }
}

/// Removes the worker record, then lists to confirm: a heartbeat that timed out on this side may
/// still land on the server after the removal and bring the record back.
async fn remove_record(shared: &Shared) -> Result<()> {
    let me = shared.id();
    let mut result = Ok(());
    for attempt in 0..3 {
        result = shared.store.remove_worker(&me).await;
        let back = match shared.store.list_workers().await {
            Ok(l) => l.items.iter().any(|r| r.id == me),
            Err(_) => false,
        };
        if !back {
            break;
        }
        warn!(
            attempt,
            "the worker record came back after removal (a late heartbeat); removing again"
        );
        tokio::time::sleep(shared.cfg.heartbeat_interval()).await;
    }
    result
}

/// Locks the handle's list of loop handles, recovering it if a panicking thread poisoned it.
/// The lock guards the join handles only (taken once, by `shutdown` or an abrupt stop), never
/// coordination state.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if !self.shared.cancel.is_cancelled() {
            warn!(worker = %self.shared.id(), "WorkerHandle dropped without shutdown(); stopping without releasing leases");
            self.stop_abruptly();
        }
    }
}
