//! A fleet of workers in one process, for lease-loop tests, simulations and benchmarks: start,
//! stop, crash and add workers, and wait for conditions on the store (never on sleeps).

use shardlease_core::store::VersionedLease;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::balancer::is_active;
use shardlease_core::balancer::Balancer;
use shardlease_core::store::{Lease, LeaseStore};
use shardlease_core::WorkerStats;
use shardlease_core::{
    Checkpointer, Config, LeaseKey, ProcessorFactory, Result, ShardSource, ShutdownReport, Worker,
    WorkerHandle, WorkerId,
};

/// A shutdown's report, or an error when it could not remove the worker record.
fn record_removed(report: ShutdownReport) -> Result<ShutdownReport> {
    match &report.record_error {
        Some(e) => Err(shardlease_core::Error::retryable(format!(
            "removing the worker record failed: {e}"
        ))),
        None => Ok(report),
    }
}

/// Makes the store view a worker uses (the same store for all, or one fault-injecting view each).
pub type StoreForWorker = Arc<dyn Fn(&WorkerId) -> Arc<dyn LeaseStore> + Send + Sync>;

/// Polls `check` every `every` until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> std::result::Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(every).await;
    }
}

/// Who owns what, as the store says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Active leases (not finished, parents finished or gone).
    pub active: usize,
    /// Active leases with no owner or an owner that is not running.
    pub uncovered: usize,
    /// Active leases per running worker (zero included), by the id it started with.
    pub shares: BTreeMap<WorkerId, usize>,
    /// The owner of each active lease as the store names it (`None` when unowned).
    pub owners: BTreeMap<LeaseKey, Option<WorkerId>>,
    /// The uncovered active leases themselves, as listed (what a stuck run prints).
    pub uncovered_leases: Vec<Lease>,
}

impl Coverage {
    /// Largest share.
    pub fn max_share(&self) -> usize {
        self.shares.values().max().copied().unwrap_or(0)
    }

    /// Smallest share.
    pub fn min_share(&self) -> usize {
        self.shares.values().min().copied().unwrap_or(0)
    }

    /// Largest share minus smallest share.
    pub fn spread(&self) -> usize {
        self.max_share() - self.min_share()
    }

    /// There is at least one active lease and every one is owned by a running worker.
    pub fn is_covered(&self) -> bool {
        self.active > 0 && self.uncovered == 0
    }

    /// Every active lease owned by a running worker and shares within one of each other.
    pub fn is_balanced(&self) -> bool {
        self.uncovered == 0 && self.spread() <= 1
    }
}

/// A fleet of workers sharing one store and one source.
pub struct Cluster {
    store_for: StoreForWorker,
    observer: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    factory: Arc<dyn ProcessorFactory>,
    template: Config,
    balancer: Option<Arc<dyn Balancer>>,
    checkpointer: Option<Arc<dyn Checkpointer>>,
    workers: BTreeMap<WorkerId, WorkerHandle>,
    /// The last counters of workers shut down or crashed, by the id they started with, so a
    /// failing test can print what every worker did.
    departed: BTreeMap<WorkerId, WorkerStats>,
    started: u32,
}

impl Cluster {
    /// A cluster whose workers all use `store`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
        template: Config,
    ) -> Self {
        let s = store.clone();
        Self::with_store_per_worker(store, Arc::new(move |_| s.clone()), source, factory, template)
    }

    /// A cluster where each worker gets its own view of the store (fault injection, auditing);
    /// `observer` is the test's own undisturbed view.
    pub fn with_store_per_worker(
        observer: Arc<dyn LeaseStore>,
        store_for: StoreForWorker,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
        template: Config,
    ) -> Self {
        Cluster {
            store_for,
            observer,
            source,
            factory,
            template,
            balancer: None,
            checkpointer: None,
            workers: BTreeMap::new(),
            departed: BTreeMap::new(),
            started: 0,
        }
    }

    /// Workers started from now on use `balancer` instead of the default one.
    pub fn with_balancer(mut self, balancer: Arc<dyn Balancer>) -> Self {
        self.balancer = Some(balancer);
        self
    }

    /// Workers started from now on keep positions in `checkpointer` instead of the lease records.
    pub fn with_checkpointer(mut self, checkpointer: Arc<dyn Checkpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// The test's view of the store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.observer
    }

    /// The configuration of worker number `n` (`w<n>`, its own RNG seed).
    fn config_for(&self, n: u32) -> Config {
        let cfg = self.template.clone().with_worker_id(WorkerId::new(format!("w{n}")));
        match self.template.rng_seed() {
            Some(s) => cfg.with_rng_seed(s.wrapping_mul(31).wrapping_add(u64::from(n))),
            None => cfg,
        }
    }

    /// Builds the next worker (id `w1`, `w2`, ...) without starting it.
    pub fn build_worker(&mut self) -> Result<Worker> {
        self.started += 1;
        let cfg = self.config_for(self.started);
        let store = (self.store_for)(cfg.worker_id());
        self.worker(cfg, store)
    }

    fn worker(&self, cfg: Config, store: Arc<dyn LeaseStore>) -> Result<Worker> {
        let mut builder = Worker::builder(cfg, store, self.source.clone(), self.factory.clone());
        if let Some(c) = &self.checkpointer {
            builder = builder.checkpointer(c.clone());
        }
        match &self.balancer {
            Some(b) => builder.balancer(b.clone()).build(),
            None => builder.build(),
        }
    }

    /// Creates the leases for the source's shards now, through a worker that is never started
    /// and through the test's own view of the store (no faults, not counted).
    pub async fn sync_shards(&mut self) -> Result<()> {
        self.worker(self.config_for(0), self.observer.clone())?.sync_shards().await
    }

    /// Starts one more worker and returns its id.
    pub fn start_worker(&mut self) -> Result<WorkerId> {
        let w = self.build_worker()?;
        let h = w.start();
        let id = h.id();
        self.workers.insert(id.clone(), h);
        Ok(id)
    }

    /// Starts a new process under an id used before, as a restarted pod with a stable name does.
    /// A worker still running under that id is crashed first (its handle dropped).
    pub fn restart_as(&mut self, id: &WorkerId) -> Result<()> {
        self.crash(id);
        self.started += 1;
        let cfg = self.config_for(self.started).with_worker_id(id.clone());
        let store = (self.store_for)(id);
        let h = self.worker(cfg, store)?.start();
        self.workers.insert(id.clone(), h);
        Ok(())
    }

    /// Starts `n` more workers.
    pub fn start_workers(&mut self, n: usize) -> Result<Vec<WorkerId>> {
        (0..n).map(|_| self.start_worker()).collect()
    }

    /// The running workers.
    pub fn running(&self) -> Vec<WorkerId> {
        self.workers.keys().cloned().collect()
    }

    /// A running worker's handle.
    pub fn handle(&self, id: &WorkerId) -> Option<&WorkerHandle> {
        self.workers.get(id)
    }

    /// Shuts a worker down gracefully; what became of its leases (empty for an unknown id). An
    /// error when the worker record could not be removed ([`ShutdownReport::record_error`]): a
    /// test fleet's store is expected to answer.
    pub async fn shutdown(&mut self, id: &WorkerId) -> Result<ShutdownReport> {
        match self.workers.remove(id) {
            Some(h) => {
                let report = h.shutdown().await;
                self.departed.insert(id.clone(), h.stats());
                record_removed(report)
            }
            None => Ok(ShutdownReport::default()),
        }
    }

    /// Crashes a worker (no release, record left behind).
    pub fn crash(&mut self, id: &WorkerId) {
        if let Some(h) = self.workers.remove(id) {
            h.crash();
            self.departed.insert(id.clone(), h.stats());
        }
    }

    /// Shuts every worker down.
    pub async fn shutdown_all(&mut self) {
        let _ = self.try_shutdown_all().await;
    }

    /// Shuts every worker down, all at once; the first error, if any.
    pub async fn try_shutdown_all(&mut self) -> Result<()> {
        let all: Vec<_> = std::mem::take(&mut self.workers).into_iter().collect();
        let results = futures::future::join_all(all.iter().map(|(_, h)| h.shutdown())).await;
        self.departed.extend(all.iter().map(|(id, h)| (id.clone(), h.stats())));
        results.into_iter().try_for_each(|r| record_removed(r).map(drop))
    }

    /// Every lease, as the store says.
    pub async fn leases(&self) -> Result<Vec<Lease>> {
        Ok(self.observer.list_leases().await?.items.into_iter().map(|v| v.lease).collect())
    }

    /// Who owns what right now.
    pub async fn coverage(&self) -> Result<Coverage> {
        let listing = self.observer.list_leases().await?;
        let corrupt = listing.corrupt.iter().map(|c| LeaseKey::new(c.key.clone())).collect();
        let leases: Vec<Lease> = listing.items.into_iter().map(|v| v.lease).collect();
        let by_key: HashMap<_, _> = leases.iter().map(|l| (&l.key, l)).collect();
        // Owners are named by a worker's current id, which changes when it fences itself and
        // comes back as a new incarnation; shares are reported under the id it started with.
        let current: HashMap<WorkerId, &WorkerId> =
            self.workers.iter().map(|(base, h)| (h.id(), base)).collect();
        let mut cov = Coverage {
            shares: self.workers.keys().map(|w| (w.clone(), 0)).collect(),
            ..Coverage::default()
        };
        for l in &leases {
            if !is_active(l, &by_key, &corrupt) {
                continue;
            }
            cov.active += 1;
            cov.owners.insert(l.key.clone(), l.owner.clone());
            match l.owner.as_ref().and_then(|o| current.get(o)).and_then(|b| cov.shares.get_mut(*b))
            {
                Some(n) => *n += 1,
                None => {
                    cov.uncovered += 1;
                    cov.uncovered_leases.push(l.clone());
                }
            }
        }
        Ok(cov)
    }

    /// Whether every active lease is owned by a running worker that is processing it, with
    /// shares within one of each other.
    pub async fn is_balanced(&self) -> bool {
        let Ok(cov) = self.coverage().await else { return false };
        cov.is_balanced() && self.tasks_match(&cov)
    }

    /// Whether every running worker is processing exactly the leases `cov` says it owns (a lease
    /// handed over is not held until the new owner's task runs).
    pub fn tasks_match(&self, cov: &Coverage) -> bool {
        cov.shares
            .iter()
            .all(|(w, n)| self.workers.get(w).is_some_and(|h| h.held_leases().len() == *n))
    }

    /// Every running worker's counters, by the id it started with.
    pub fn stats(&self) -> BTreeMap<WorkerId, WorkerStats> {
        self.workers.iter().map(|(id, h)| (id.clone(), h.stats())).collect()
    }

    /// Every worker's counters, running or departed (shut down or crashed: their last counters),
    /// a line each, by the id it started with: what a failing test prints.
    pub fn stats_report(&self) -> Vec<String> {
        let running = self.workers.iter().map(|(id, h)| (id, "running", h.stats()));
        let departed = self.departed.iter().map(|(id, s)| (id, "departed", s.clone()));
        running.chain(departed).map(|(id, state, s)| format!("{id} ({state}): {s:?}")).collect()
    }

    /// Shuts every worker down, then deletes every lease and worker record of the namespace (a
    /// crashed worker leaves its record behind), so runs on a shared store leave nothing.
    pub async fn teardown(&mut self) -> Result<()> {
        let stopped = self.try_shutdown_all().await;
        for VersionedLease { lease, version } in self.observer.list_leases().await?.items {
            // A conflict means something still writes; the namespace is the run's own: ignore it.
            let _ = self.observer.delete_lease(&lease.key, version).await;
        }
        for record in self.observer.list_workers().await?.items {
            self.observer.remove_worker(&record.id).await?;
        }
        stopped
    }

    /// Waits until [`is_balanced`](Self::is_balanced), polling every `every`.
    pub async fn wait_balanced(
        &self,
        timeout: Duration,
        every: Duration,
    ) -> std::result::Result<Coverage, String> {
        let r =
            wait_until("every active lease owned and shares within one", timeout, every, || {
                self.is_balanced()
            })
            .await;
        let cov = self.coverage().await.map_err(|e| e.to_string())?;
        r.map(|()| cov.clone()).map_err(|e| format!("{e}; last coverage {cov:?}"))
    }
}

/// Per-worker views of `base` for simulations: each worker's calls pass through a fault injector
/// (errors, latency, its own partition) and then an auditor checking the fencing invariants.
pub fn audited_faulty_views(
    base: Arc<dyn LeaseStore>,
    faults: crate::Faults,
    audit: crate::audit::AuditLog,
) -> StoreForWorker {
    Arc::new(move |w: &WorkerId| -> Arc<dyn LeaseStore> {
        let audited: Arc<dyn LeaseStore> =
            Arc::new(crate::audit::AuditStore::new(base.clone(), Some(w.clone()), audit.clone()));
        Arc::new(crate::FaultyStore::new(audited, faults.clone(), Some(w.clone())))
    })
}
