//! A fleet of workers in this process sharing one store and one source, with the chosen balancer:
//! start, stop and crash workers, read who owns what, and clean the namespace up afterwards.
//!
//! Workers write through a [`CountingStore`] so scenarios can report the store cost; the bench's
//! own observations go through the uncounted store underneath, so they never inflate the figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use shardlease::balancer::{Balancer, GreedyBalancer, OnePerPassBalancer};
use shardlease::store::{Lease, LeaseStore};
use shardlease::WorkerStats;
use shardlease::{Config, LeaseKey, Position, ProcessorFactory, ShardSource, WorkerId};
use shardlease_testkit::cluster::Cluster;

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
/// flags. A handoff may take as long as a failover (the shutdown timeout is the larger of the
/// two): a loaded machine must not cut a handoff's last batch short and count its records twice.
/// The claim timeout follows (`Config::with_claim_timeout` is left unset). Leases start at
/// `TrimHorizon` so every record a scenario writes is delivered. `Error::Config` when the
/// namespace breaks the namespace rule.
pub fn config_template(
    namespace: &str,
    t: &Timings,
    seed: Option<u64>,
) -> shardlease::Result<Config> {
    let c = Config::new(namespace)?
        .with_heartbeat(t.heartbeat)
        .with_balance_interval(t.balance)
        .with_failover_timeout(t.failover)
        .with_initial_position(Position::TrimHorizon);
    let shutdown = c.shutdown_timeout().max(t.failover);
    let c = c.with_shutdown_timeout(shutdown);
    Ok(match seed {
        Some(seed) => c.with_rng_seed(seed),
        None => c,
    })
}

/// The balancer of a policy.
pub fn balancer(policy: Policy) -> Arc<dyn Balancer> {
    match policy {
        Policy::Greedy => Arc::new(GreedyBalancer::default()),
        Policy::OnePerPass => Arc::new(OnePerPassBalancer::default()),
    }
}

/// Who owns what, as the store says (the testkit's view, shared with the conformance suite).
pub use shardlease_testkit::cluster::Coverage;

/// Counts changes of owner across successive observations: a lease seen owned by one worker and
/// later by another is one move, whether it was handed over or released (or abandoned) and taken.
/// A lease's first owner is not a move. Epochs are not used: the runtime may bump a lease's epoch
/// without a change of owner (re-taking a lease of an earlier incarnation, say).
#[derive(Clone, Debug, Default)]
pub struct MoveCounter {
    last_owner: HashMap<LeaseKey, WorkerId>,
    moves: u64,
    /// When observations saw moves, and how many.
    seen: Vec<(std::time::Instant, u64)>,
}

impl MoveCounter {
    /// Notes who owns what now.
    pub fn observe(&mut self, cov: &Coverage) {
        let before = self.moves;
        for (key, owner) in &cov.owners {
            let Some(owner) = owner else { continue };
            if let Some(previous) = self.last_owner.insert(key.clone(), owner.clone()) {
                if &previous != owner {
                    self.moves += 1;
                }
            }
        }
        if self.moves > before {
            self.seen.push((std::time::Instant::now(), self.moves - before));
        }
    }

    /// Moves seen so far.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// The moves grouped in rounds: observations with moves less than `gap` apart belong to one
    /// round. Returns the number of moves of each round, in order.
    pub fn rounds(&self, gap: std::time::Duration) -> Vec<u64> {
        let mut rounds: Vec<u64> = Vec::new();
        let mut last: Option<std::time::Instant> = None;
        for (at, n) in &self.seen {
            match (last, rounds.last_mut()) {
                (Some(l), Some(r)) if at.saturating_duration_since(l) < gap => *r += n,
                _ => rounds.push(*n),
            }
            last = Some(*at);
        }
        rounds
    }
}

/// The testkit's [`Cluster`] with the run's balancer, its workers writing through a
/// [`CountingStore`] while the bench observes through the uncounted store underneath.
pub struct Fleet {
    cluster: Cluster,
    counted: Arc<CountingStore>,
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
        let counted = Arc::new(CountingStore::new(store.clone()));
        let view: Arc<dyn LeaseStore> = counted.clone();
        let cluster = Cluster::with_store_per_worker(
            store,
            Arc::new(move |_| view.clone()),
            source,
            factory,
            template,
        )
        .with_balancer(balancer(policy));
        Fleet { cluster, counted }
    }

    /// The counting view the workers use.
    pub fn counted(&self) -> &CountingStore {
        &self.counted
    }

    /// Creates a lease for every shard of the source now, through the uncounted store (creation is
    /// not part of any figure).
    pub async fn sync_shards(&mut self) -> Result<(), BenchError> {
        Ok(self.cluster.sync_shards().await?)
    }

    /// Starts one more worker (ids `w1`, `w2`, ...; `w1.1` and so on after a self-fence) and
    /// returns the id it started with, by which the fleet knows it.
    pub fn start_worker(&mut self) -> Result<WorkerId, BenchError> {
        Ok(self.cluster.start_worker()?)
    }

    /// Starts `n` more workers, back to back.
    pub fn start_workers(&mut self, n: usize) -> Result<Vec<WorkerId>, BenchError> {
        Ok(self.cluster.start_workers(n)?)
    }

    /// The running workers' ids.
    pub fn running(&self) -> Vec<WorkerId> {
        self.cluster.running()
    }

    /// Gracefully shuts one worker down (checkpoint, release, remove its record).
    pub async fn shutdown(&mut self, id: &WorkerId) -> Result<(), BenchError> {
        self.cluster.shutdown(id).await?;
        Ok(())
    }

    /// Crashes one worker: everything stops, nothing is released, its record stays behind.
    pub fn crash(&mut self, id: &WorkerId) {
        self.cluster.crash(id);
    }

    /// Every running worker's counters.
    pub fn stats(&self) -> BTreeMap<WorkerId, WorkerStats> {
        self.cluster.stats()
    }

    /// Every lease, as the store says.
    pub async fn leases(&self) -> Result<Vec<Lease>, BenchError> {
        Ok(self.cluster.leases().await?)
    }

    /// Who owns what right now, shares under the id each worker started with.
    pub async fn coverage(&self) -> Result<Coverage, BenchError> {
        Ok(self.cluster.coverage().await?)
    }

    /// Whether every worker is processing exactly the leases the store says it owns.
    pub fn tasks_match(&self, cov: &Coverage) -> bool {
        self.cluster.tasks_match(cov)
    }

    /// Stops every worker (a worker still running when the fleet is dropped is crashed, so a run
    /// that failed half-way leaves none behind) and deletes every lease and worker record of the
    /// namespace.
    pub async fn teardown(&mut self) -> Result<(), BenchError> {
        Ok(self.cluster.teardown().await?)
    }
}
