//! The worker runtime: builds a worker from a store, a source and a processor factory, runs its
//! loops (heartbeat, watchdog, balance, shard sync, store notices) and one task per held lease,
//! and shuts it down gracefully (or, for tests and benchmarks, crashes it).
//!
//! The balance loop owns the worker's coordination state; the other loops and the lease tasks
//! send it events (`events`) and read what it publishes. docs/algorithm.md, "Who owns the
//! runtime's state".

mod balance;
mod cas;
mod contain;
mod core_share;
mod events;
mod fleet_view;
mod heartbeat;
mod heartbeat_thread;
mod lease_task;
mod notices;
mod recovery;
mod retire;
mod shard_sync;
mod shared;
mod shutdown_report;
mod supervise;

use std::sync::{Arc, Mutex};

use futures::FutureExt;
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
use supervise::{supervised, Loop};
pub use supervise::{LoopFailure, StopCause};

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
        // Every plug-in is wrapped once, here, so that its panics cost the call they happen in
        // and not the loop that made it (see `contain`).
        let panics = contain::PanicLog::new(
            self.config.namespace().as_str(),
            self.config.worker_id().as_str(),
        );
        let store: Arc<dyn LeaseStore> =
            Arc::new(contain::Contained::new(self.store, panics.clone()));
        let source: Arc<dyn ShardSource> =
            Arc::new(contain::Contained::new(self.source, panics.clone()));
        // The default checkpointer is kept by its type too, to feed its cache with what the
        // runtime reads and writes; a custom one gets nothing but the `Checkpointer` calls.
        let (checkpointer, default_checkpointer) = match self.checkpointer {
            Some(c) => (
                Arc::new(contain::Contained::new(c, panics.clone())) as Arc<dyn Checkpointer>,
                None,
            ),
            None => {
                let d = Arc::new(StoreCheckpointer::new(store.clone()));
                (d.clone() as Arc<dyn Checkpointer>, Some(d))
            }
        };
        let (shared, receivers) = Shared::new(
            self.config,
            store,
            source,
            self.factory,
            checkpointer,
            default_checkpointer,
            self.balancer,
            panics,
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
        // Every loop runs supervised: one that fails stops the worker (see `supervise`).
        let run = |which: Loop, body: futures::future::BoxFuture<'static, ()>| {
            supervised(shared.clone(), which, body).instrument(span.clone())
        };
        let loops = vec![
            heartbeat_thread::spawn(
                dedicated,
                run(Loop::Heartbeat, heartbeat::heartbeat_loop(shared.clone()).boxed()),
            ),
            heartbeat_thread::spawn(
                dedicated,
                run(Loop::Watchdog, heartbeat::watchdog(shared.clone()).boxed()),
            ),
            tokio::spawn(run(Loop::Balance, balance::balance_loop(shared.clone(), events).boxed())),
            tokio::spawn(run(
                Loop::ShardSync,
                shard_sync::shard_sync_loop(shared.clone(), sync).boxed(),
            )),
            tokio::spawn(run(Loop::Notices, notices::notice_loop(shared.clone()).boxed())),
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

    /// Whether the worker is still running: not shut down, crashed, or stopped by a failed loop
    /// (see [`stop_cause`](Self::stop_cause)).
    pub fn is_running(&self) -> bool {
        !self.shared.cancel.is_cancelled()
    }

    /// Why the worker stopped, once it has: a shutdown, an abrupt stop, or one of its loops
    /// failing ([`StopCause::LoopFailed`]: the worker fenced itself, and its peers take its leases
    /// after the failover timeout). `None` while it runs.
    pub fn stop_cause(&self) -> Option<StopCause> {
        self.shared.stop_cause.borrow().clone()
    }

    /// Waits until the worker stops, however it stops, and says why (for a shutdown: as soon as
    /// it begins; `shutdown()` itself returns when it is over). An application that runs a
    /// worker for the life of its process selects on this beside its termination signal: a worker
    /// whose loop failed has stopped reading, and the process should exit (or start a new
    /// worker) rather than carry on without it.
    pub async fn stopped(&self) -> StopCause {
        let mut rx = self.shared.stop_cause.subscribe();
        loop {
            if let Some(cause) = rx.borrow_and_update().clone() {
                return cause;
            }
            if rx.changed().await.is_err() {
                return StopCause::Abrupt;
            }
        }
    }

    /// Test hook (feature `test-util`): makes one of the worker's loops panic, as a bug in it
    /// would. `name` is one of `heartbeat`, `watchdog`, `balance`, `shard_sync`, `notices`;
    /// false for another name.
    #[cfg(feature = "test-util")]
    pub fn fail_loop(&self, name: &str) -> bool {
        let Some(which) = Loop::from_name(name) else { return false };
        self.shared.inject_failure.send_replace(Some(which));
        true
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
    /// processors cut short at the deadline, which hear `lease_lost` first, and a few heartbeat
    /// intervals for the record's removal). Idempotent: a second call returns an empty report.
    ///
    /// The report says what became of each lease, and in particular which processors had to be
    /// cut short ([`ShutdownReport::abandoned`]: their next owner processes again what followed
    /// the last checkpoint). It is returned whatever happened: a record that could not be
    /// removed is [`ShutdownReport::record_error`] (the worker has stopped all the same, and its
    /// peers treat it as dead after the failover timeout), and a worker that had stopped before
    /// the call (a loop failed) says so in [`ShutdownReport::cause`], with no lease listed: its
    /// tasks were fenced, not released.
    pub async fn shutdown(&self) -> ShutdownReport {
        let mut done = self.shutdown.lock().await;
        if *done {
            return ShutdownReport::default();
        }
        if self.shared.cancel.is_cancelled() {
            *done = true;
            let cause = self.stop_cause();
            info!(worker = %self.shared.id(), ?cause, "shutdown of a worker that had stopped already");
            return ShutdownReport { cause, ..Default::default() };
        }
        let shared = &self.shared;
        info!(worker = %shared.id(), "shutting down");
        supervise::set_cause(shared, StopCause::Shutdown);
        shared.stop_taking.cancel();
        let deadline = tokio::time::Instant::now() + shared.cfg.shutdown_timeout();
        // Every lease task sees this at once and stops gracefully, whatever the balance loop is
        // doing; the loop, which owns the tasks, collects how each of them ended (or cuts it short
        // at the deadline) and withdraws this worker's claims.
        shared.shutdown.send_replace(Some(deadline));
        let (reply, answer) = tokio::sync::oneshot::channel();
        shared.tell(events::Event::Request(events::Request::Shutdown { deadline, reply }));
        let mut report = match answer.await {
            Ok(report) => report,
            Err(_) => {
                // The balance loop is gone (it failed during the shutdown, and supervision logged
                // why): nobody can say how the tasks ended.
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
        if let Err(e) = remove_record(shared).await {
            let e = crate::error::ErrorChain(&e).to_string();
            warn!(error = %e, "removing the worker record failed; peers judge this worker dead after the failover timeout");
            report.record_error = Some(e);
        }
        report.cause = self.stop_cause();
        *done = true;
        info!(
            released = report.released.len(),
            abandoned = report.abandoned.len(),
            not_released = report.not_released.len(),
            "shut down"
        );
        report
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
        supervise::set_cause(&self.shared, StopCause::Abrupt);
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
    let limit = shared.cfg.heartbeat_interval();
    let timed_out = || crate::error::Error::retryable("removing the worker record timed out");
    let mut result = Ok(());
    for attempt in 0..3 {
        result = tokio::time::timeout(limit, shared.store.remove_worker(&me))
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        let mine = std::slice::from_ref(&me);
        let back = match tokio::time::timeout(limit, shared.store.get_workers(mine)).await {
            Ok(Ok(l)) => l.items.iter().any(|r| r.id == me),
            _ => false,
        };
        if !back {
            // Peers that read only the fleet signal and a few neighbours list again, and see
            // the leave at their next heartbeat.
            if result.is_ok() {
                fleet_view::signal(shared, "left").await;
            }
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
