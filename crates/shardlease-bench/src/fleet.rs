//! A fleet of workers in this process sharing one store and one source, with the chosen balancer:
//! start, stop and crash workers, read who owns what, and clean the namespace up afterwards.
//!
//! Workers write through a [`CountingStore`] so scenarios can report the store cost; the bench's
//! own observations go through the uncounted store underneath, so they never inflate the figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use shardlease::balancer::is_active;
use shardlease::runtime::WorkerStats;
use shardlease::{
    Balancer, Config, GreedyBalancer, Lease, LeaseStore, OnePerPassBalancer, Position,
    ProcessorFactory, ShardSource, Worker, WorkerHandle, WorkerId,
};

use crate::args::Policy;
use crate::counting_store::CountingStore;
use crate::error::BenchError;

/// The timing flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Balance interval.
    pub balance: Duration,
    /// Failover timeout.
    pub failover: Duration,
}

/// The configuration every worker of a run starts from: the runtime's ratios scaled from the
/// heartbeat (`Config::with_heartbeat`), then the balance interval and failover timeout from the
/// flags and a claim timeout of three balance intervals. Leases start at `TrimHorizon` so every
/// record a scenario writes is delivered.
pub fn config_template(namespace: &str, t: &Timings, seed: Option<u64>) -> Config {
    let mut c = Config::new(namespace)
        .with_heartbeat(t.heartbeat)
        .with_initial_position(Position::TrimHorizon);
    c.balance_interval = t.balance;
    c.failover_timeout = t.failover;
    c.claim_timeout = t.balance * 3;
    c.rng_seed = seed;
    c
}

/// The balancer of a policy.
pub fn balancer(policy: Policy) -> Arc<dyn Balancer> {
    match policy {
        Policy::Greedy => Arc::new(GreedyBalancer::default()),
        Policy::OnePerPass => Arc::new(OnePerPassBalancer::default()),
    }
}

/// Who owns what, as the store says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Active leases (not finished, parents finished or gone).
    pub active: usize,
    /// Active leases with no owner, or an owner that is not a running worker of the fleet.
    pub uncovered: usize,
    /// Active leases per running worker (zero included), by the id the fleet started it with.
    pub shares: BTreeMap<WorkerId, usize>,
    /// Owner of each active lease as the store names it (`None` when unowned).
    pub owners: BTreeMap<String, Option<WorkerId>>,
}

impl Coverage {
    /// Every active lease is owned by a running worker (and there is at least one).
    pub fn is_covered(&self) -> bool {
        self.active > 0 && self.uncovered == 0
    }

    /// Largest share.
    pub fn max_share(&self) -> usize {
        self.shares.values().max().copied().unwrap_or(0)
    }

    /// Smallest share.
    pub fn min_share(&self) -> usize {
        self.shares.values().min().copied().unwrap_or(0)
    }

    /// Covered and shares within one of each other.
    pub fn is_balanced(&self) -> bool {
        self.is_covered() && self.max_share() - self.min_share() <= 1
    }
}

/// Counts changes of owner across successive observations: a lease seen owned by one worker and
/// later by another is one move, whether it was handed over or released (or abandoned) and taken.
/// A lease's first owner is not a move. Epochs are not used: the runtime may bump a lease's epoch
/// without a change of owner (re-taking a lease it was handed, say).
#[derive(Clone, Debug, Default)]
pub struct MoveCounter {
    last_owner: HashMap<String, WorkerId>,
    moves: u64,
}

impl MoveCounter {
    /// Notes who owns what now.
    pub fn observe(&mut self, cov: &Coverage) {
        for (key, owner) in &cov.owners {
            let Some(owner) = owner else { continue };
            if let Some(previous) = self.last_owner.insert(key.clone(), owner.clone()) {
                if &previous != owner {
                    self.moves += 1;
                }
            }
        }
    }

    /// Moves seen so far.
    pub fn moves(&self) -> u64 {
        self.moves
    }
}

/// A fleet of workers sharing one store and one source.
pub struct Fleet {
    observer: Arc<dyn LeaseStore>,
    counted: Arc<CountingStore>,
    source: Arc<dyn ShardSource>,
    factory: Arc<dyn ProcessorFactory>,
    template: Config,
    policy: Policy,
    workers: BTreeMap<WorkerId, WorkerHandle>,
    started: u64,
}

impl Fleet {
    /// A fleet on `store` (the workers' calls are counted, the bench's are not).
    pub fn new(
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
        template: Config,
        policy: Policy,
    ) -> Self {
        Fleet {
            counted: Arc::new(CountingStore::new(store.clone())),
            observer: store,
            source,
            factory,
            template,
            policy,
            workers: BTreeMap::new(),
            started: 0,
        }
    }

    /// The counting view the workers use.
    pub fn counted(&self) -> &CountingStore {
        &self.counted
    }

    fn worker(
        &self,
        id: WorkerId,
        store: Arc<dyn LeaseStore>,
        n: u64,
    ) -> Result<Worker, BenchError> {
        let mut cfg = self.template.clone().with_worker_id(id);
        cfg.rng_seed = self.template.rng_seed.map(|s| s.wrapping_mul(31).wrapping_add(n));
        Ok(Worker::builder(cfg, store, self.source.clone(), self.factory.clone())
            .balancer(balancer(self.policy))
            .build()?)
    }

    /// Creates a lease for every shard of the source now, through a worker that never starts and
    /// through the uncounted store (creation is not part of any figure).
    pub async fn sync_shards(&self) -> Result<(), BenchError> {
        let w = self.worker(WorkerId::new("bench-sync"), self.observer.clone(), 0)?;
        Ok(w.sync_shards().await?)
    }

    /// Starts one more worker (ids `w1`, `w2`, ...; `w1.1` and so on after a self-fence) and
    /// returns the id it started with, by which the fleet knows it.
    pub fn start_worker(&mut self) -> Result<WorkerId, BenchError> {
        self.started += 1;
        let id = WorkerId::new(format!("w{}", self.started));
        let counted: Arc<dyn LeaseStore> = self.counted.clone();
        let handle = self.worker(id.clone(), counted, self.started)?.start();
        self.workers.insert(id.clone(), handle);
        Ok(id)
    }

    /// Starts `n` more workers, back to back.
    pub fn start_workers(&mut self, n: usize) -> Result<Vec<WorkerId>, BenchError> {
        (0..n).map(|_| self.start_worker()).collect()
    }

    /// The running workers' ids.
    pub fn running(&self) -> Vec<WorkerId> {
        self.workers.keys().cloned().collect()
    }

    /// Gracefully shuts one worker down (checkpoint, release, remove its record).
    pub async fn shutdown(&mut self, id: &WorkerId) -> Result<(), BenchError> {
        match self.workers.remove(id) {
            Some(h) => Ok(h.shutdown().await?),
            None => Ok(()),
        }
    }

    /// Crashes one worker: everything stops, nothing is released, its record stays behind.
    pub fn crash(&mut self, id: &WorkerId) {
        if let Some(h) = self.workers.remove(id) {
            h.crash();
        }
    }

    /// Every running worker's counters.
    pub fn stats(&self) -> BTreeMap<WorkerId, WorkerStats> {
        self.workers.iter().map(|(id, h)| (id.clone(), h.stats())).collect()
    }

    /// Every active lease, as the store says.
    pub async fn leases(&self) -> Result<Vec<Lease>, BenchError> {
        Ok(self.observer.list_leases().await?.items.into_iter().map(|(l, _)| l).collect())
    }

    /// Who owns what right now. A worker that fenced itself comes back under a new id (a new
    /// incarnation); leases count toward a worker's share only under its current id.
    pub async fn coverage(&self) -> Result<Coverage, BenchError> {
        let leases = self.leases().await?;
        let by_key: HashMap<_, _> = leases.iter().map(|l| (&l.key, l)).collect();
        let current: HashMap<WorkerId, &WorkerId> =
            self.workers.iter().map(|(name, h)| (WorkerId::new(h.id().as_str()), name)).collect();
        let mut cov = Coverage {
            shares: self.workers.keys().map(|w| (w.clone(), 0)).collect(),
            ..Coverage::default()
        };
        for l in &leases {
            if !is_active(l, &by_key) {
                continue;
            }
            cov.active += 1;
            cov.owners.insert(l.key.as_str().to_owned(), l.owner.clone());
            let name = l.owner.as_ref().and_then(|o| current.get(o));
            match name.and_then(|n| cov.shares.get_mut(*n)) {
                Some(n) => *n += 1,
                None => cov.uncovered += 1,
            }
        }
        Ok(cov)
    }

    /// Whether every worker is processing exactly the leases the store says it owns (a lease
    /// handed over is not "held" until the new owner's task runs).
    pub fn tasks_match(&self, cov: &Coverage) -> bool {
        cov.shares
            .iter()
            .all(|(w, n)| self.workers.get(w).is_some_and(|h| h.held_leases().len() == *n))
    }

    /// Shuts every running worker down gracefully, all at once.
    pub async fn shutdown_all(&mut self) -> Result<(), BenchError> {
        let all: Vec<_> = std::mem::take(&mut self.workers).into_values().collect();
        let results = futures::future::join_all(all.iter().map(WorkerHandle::shutdown)).await;
        results.into_iter().collect::<shardlease::Result<Vec<()>>>()?;
        Ok(())
    }

    /// Stops every worker and deletes every lease and worker record of the namespace (a crashed
    /// worker leaves its record behind), so runs on a shared store leave nothing.
    pub async fn teardown(&mut self) -> Result<(), BenchError> {
        let stopped = self.shutdown_all().await;
        for (lease, version) in self.observer.list_leases().await?.items {
            // A conflict means something still writes; the namespace is unique, so ignore it.
            let _ = self.observer.delete_lease(&lease.key, version).await;
        }
        for record in self.observer.list_workers().await?.items {
            self.observer.remove_worker(&record.id).await?;
        }
        stopped
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A run that failed half-way must not leave workers running into the next run.
        for h in self.workers.values() {
            h.crash();
        }
    }
}
