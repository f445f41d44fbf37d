//! Containment of the code a user plugs into a worker: the lease store, the shard source, the
//! checkpointer and the balancer.
//!
//! Those run inside the worker's own loops (the balance loop calls `Balancer::plan` and lists the
//! store, the shard sync lists the source, the heartbeat writes the store). A panic there used to
//! unwind the loop and end it, and the worker went on heartbeating with a dead loop: its leases
//! stood unread and, since it was alive, nobody took them. Here each plug-in is wrapped once, when
//! the worker is built, so that a panic costs the one call it happened in:
//! - a store, source or checkpointer call that panics returns a retryable [`Error::Backend`]
//!   naming the call and the panic, and the loop treats it as it treats any failure of that call
//!   (a pass skipped, a heartbeat failed: the watchdog fences a worker whose heartbeats keep
//!   failing, as for a store that is down);
//! - a balancer that panics plans nothing for that pass; one that panicked on each of
//!   [`FALLBACK_AFTER`] passes in a row is stood in for by the built-in balancer until it plans
//!   again, so a broken plug-in never leaves free leases unread.
//!
//! Each panic is counted (`shardlease_plugin_panics_total{plugin}`) and logged at ERROR once per
//! distinct message (then quietly counted): a plug-in that panics on every call does not flood the
//! logs. What is not a plug-in call (a bug in the runtime itself) is left to supervision
//! (`supervise`). docs/algorithm.md, "Supervision and containment".

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use tracing::error;

use crate::balancer::{Balancer, Plan, Snapshot};
use crate::checkpointer::Checkpointer;
use crate::error::{Error, Result};
use crate::ids::{Namespace, WorkerId};
use crate::lease::{Lease, LeaseKey, LeaseToken, Version, VersionedLease};
use crate::notify::ChangeStream;
use crate::position::Position;
use crate::source::{ShardInfo, ShardReader, ShardSource};
use crate::store::{CreateOutcome, FleetSignal, LeaseStore, LeaseUpdate, Listing};
use crate::worker_record::WorkerRecord;

/// After how many passes in a row whose balancer panicked the built-in balancer plans instead.
pub(crate) const FALLBACK_AFTER: u32 = 3;

/// How many distinct panic messages are logged at ERROR per worker; later ones are only counted.
const DISTINCT_MESSAGES_LOGGED: usize = 64;

/// The text of a panic's payload.
pub(crate) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Counts and logs the panics of one worker's plug-ins (see the module documentation).
#[derive(Debug)]
pub(crate) struct PanicLog {
    labels: Vec<metrics::Label>,
    /// `(plug-in, message)` pairs logged so far.
    logged: Mutex<BTreeSet<(&'static str, String)>>,
}

impl PanicLog {
    pub(crate) fn new(namespace: &str, worker: &str) -> Arc<Self> {
        Arc::new(PanicLog {
            labels: vec![
                metrics::Label::new(crate::telemetry::NAMESPACE, namespace.to_owned()),
                metrics::Label::new(crate::telemetry::WORKER, worker.to_owned()),
            ],
            logged: Mutex::new(BTreeSet::new()),
        })
    }

    /// Counts a panic of `plugin` in `call`, and logs it at ERROR the first time its message is
    /// seen.
    pub(crate) fn record(&self, plugin: &'static str, call: &'static str, message: &str) {
        let mut labels = self.labels.clone();
        labels.push(metrics::Label::new(crate::telemetry::PLUGIN, plugin));
        metrics::counter!(crate::telemetry::PLUGIN_PANICS, labels).increment(1);
        let first = {
            let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
            logged.len() < DISTINCT_MESSAGES_LOGGED && logged.insert((plugin, message.to_owned()))
        };
        if first {
            error!(
                plugin,
                call,
                panic = %message,
                "a plug-in panicked; the call counts as failed and the worker goes on (further \
                 panics with this message are only counted in shardlease_plugin_panics_total)"
            );
        }
    }
}

/// Runs one call of a plug-in, turning a panic into a retryable error naming the call.
async fn call<T>(
    log: &PanicLog,
    plugin: &'static str,
    name: &'static str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(r) => r,
        Err(p) => {
            let message = panic_message(p);
            log.record(plugin, name, &message);
            Err(Error::retryable(format!("the {plugin}'s {name} panicked: {message}")))
        }
    }
}

/// Runs one synchronous call of a plug-in, with `fallback` when it panics.
fn call_sync<T>(
    log: &PanicLog,
    plugin: &'static str,
    name: &'static str,
    fallback: T,
    f: impl FnOnce() -> T,
) -> T {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            log.record(plugin, name, &panic_message(p));
            fallback
        }
    }
}

/// A plug-in whose panics are errors of the call they happened in: a lease store, a shard
/// source or a checkpointer (see the module documentation).
pub(crate) struct Contained<T: ?Sized> {
    inner: Arc<T>,
    log: Arc<PanicLog>,
}

impl<T: ?Sized> Contained<T> {
    pub(crate) fn new(inner: Arc<T>, log: Arc<PanicLog>) -> Self {
        Contained { inner, log }
    }
}

impl<T: ?Sized + Debug> Debug for Contained<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The wrapped plug-in's own form (a store's says which store it is, free of secrets).
        self.inner.fmt(f)
    }
}

const STORE: &str = "lease store";

// Every method is forwarded to the same method of the inner store (none goes through another
// one, which would change what a store's native batch or quiet update does).
#[async_trait]
impl LeaseStore for Contained<dyn LeaseStore> {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        call(&self.log, STORE, "create_lease", self.inner.create_lease(lease)).await
    }
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        call(&self.log, STORE, "get_lease", self.inner.get_lease(key)).await
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        call(&self.log, STORE, "list_leases", self.inner.list_leases()).await
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        call(&self.log, STORE, "update_lease", self.inner.update_lease(lease, expected)).await
    }
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let fut = self.inner.update_lease_quietly(lease, expected);
        call(&self.log, STORE, "update_lease_quietly", fut).await
    }
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        call(&self.log, STORE, "update_leases", self.inner.update_leases(updates)).await
    }
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        call(&self.log, STORE, "create_leases", self.inner.create_leases(leases)).await
    }
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        call(&self.log, STORE, "delete_lease", self.inner.delete_lease(key, expected)).await
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        call(&self.log, STORE, "heartbeat", self.inner.heartbeat(record)).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        call(&self.log, STORE, "list_workers", self.inner.list_workers()).await
    }
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        call(&self.log, STORE, "remove_worker", self.inner.remove_worker(id)).await
    }
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        call(&self.log, STORE, "remove_worker_if", self.inner.remove_worker_if(id, beat)).await
    }
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        call(&self.log, STORE, "write_fleet_signal", self.inner.write_fleet_signal(token)).await
    }
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        call(&self.log, STORE, "read_fleet_signal", self.inner.read_fleet_signal()).await
    }
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        call(&self.log, STORE, "get_workers", self.inner.get_workers(ids)).await
    }
    fn namespace(&self) -> Option<Namespace> {
        call_sync(&self.log, STORE, "namespace", None, || self.inner.namespace())
    }
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        let stream =
            call(&self.log, STORE, "subscribe_changes", self.inner.subscribe_changes()).await?;
        let Some(stream) = stream else { return Ok(None) };
        // A stream that panics ends there: the notices loop subscribes again and lists once, as
        // after any lost subscription.
        let log = self.log.clone();
        let contained = AssertUnwindSafe(stream).catch_unwind().scan((), move |(), item| {
            futures::future::ready(match item {
                Ok(change) => Some(change),
                Err(p) => {
                    log.record(STORE, "change stream", &panic_message(p));
                    None
                }
            })
        });
        Ok(Some(contained.boxed()))
    }
}

// The readers a source opens run inside lease tasks, which contain their own panics (the lease
// is released or resumed).
const SOURCE: &str = "shard source";

#[async_trait]
impl ShardSource for Contained<dyn ShardSource> {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        call(&self.log, SOURCE, "list_shards", self.inner.list_shards()).await
    }
    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        call(&self.log, SOURCE, "open", self.inner.open(shard, from)).await
    }
    fn initial_position(&self, shard: &LeaseKey) -> Option<Position> {
        // `None` is the worker's configured start, the same as a source that sets none.
        call_sync(&self.log, SOURCE, "initial_position", None, || {
            self.inner.initial_position(shard)
        })
    }
    fn retired(&self, key: &LeaseKey) -> bool {
        // Not retired: a lease is kept (and read) rather than finished on a guess.
        call_sync(&self.log, SOURCE, "retired", false, || self.inner.retired(key))
    }
    fn keys_name_streams(&self) -> bool {
        call_sync(&self.log, SOURCE, "keys_name_streams", false, || self.inner.keys_name_streams())
    }
}

// A checkpointer's panic is an error of the checkpoint or fetch it happened in: an error of that
// lease (the processor sees it, and a fetch is retried with backoff).
const CHECKPOINTER: &str = "checkpointer";

#[async_trait]
impl Checkpointer for Contained<dyn Checkpointer> {
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()> {
        let fut = self.inner.checkpoint(token, position);
        call(&self.log, CHECKPOINTER, "checkpoint", fut).await
    }
    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>> {
        call(&self.log, CHECKPOINTER, "fetch", self.inner.fetch(key)).await
    }
    fn stores_in_lease(&self) -> bool {
        // Asked once per lease task; a panic says nothing about where positions live, and
        // `false` (fetch is the truth) is the answer that never reads a record's checkpoint as
        // the user's.
        call_sync(&self.log, CHECKPOINTER, "stores_in_lease", false, || {
            self.inner.stores_in_lease()
        })
    }
}

/// The balancer as the balance loop calls it: a panic plans nothing for that pass, and after
/// [`FALLBACK_AFTER`] passes in a row that panicked the built-in balancer plans instead, until the
/// plug-in plans without panicking again. Owned by the balance loop.
#[derive(Debug)]
pub(crate) struct GuardedBalancer {
    inner: Arc<dyn Balancer>,
    /// What plans when the plug-in keeps panicking.
    fallback: crate::balancer::GreedyBalancer,
    log: Arc<PanicLog>,
    /// Passes in a row whose plug-in panicked.
    panicked_in_a_row: u32,
}

impl GuardedBalancer {
    pub(crate) fn new(inner: Arc<dyn Balancer>, log: Arc<PanicLog>) -> Self {
        GuardedBalancer {
            inner,
            fallback: crate::balancer::GreedyBalancer::default(),
            log,
            panicked_in_a_row: 0,
        }
    }

    /// The plan of one pass (see the type's documentation).
    pub(crate) fn plan(&mut self, snapshot: &Snapshot) -> Plan {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.plan(snapshot))) {
            Ok(plan) => {
                self.panicked_in_a_row = 0;
                plan
            }
            Err(p) => {
                self.log.record("balancer", "plan", &panic_message(p));
                self.panicked_in_a_row = self.panicked_in_a_row.saturating_add(1);
                if self.panicked_in_a_row < FALLBACK_AFTER {
                    return Plan::default();
                }
                if self.panicked_in_a_row == FALLBACK_AFTER {
                    error!(
                        passes = FALLBACK_AFTER,
                        "the balancer panicked on every one of the last passes: the built-in \
                         balancer plans until it plans again, so no lease is left unread"
                    );
                }
                self.fallback.plan(snapshot)
            }
        }
    }
}
