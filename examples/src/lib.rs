//! Shared helpers of the examples: a record processor that counts deliveries (so a demo can show
//! that nothing was lost and nothing processed twice), a view of who owns what, and a polling
//! wait with a deadline; the Prometheus example's fleet and exporter (`prometheus`, with the
//! `prometheus` feature); and [`btree_store`], a lease store written against the public API as an
//! outside user would write one.

pub mod btree_store;
pub mod cli;

use shardlease::Epoch;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

#[cfg(feature = "prometheus")]
pub mod prometheus;

/// The repository README's code, compiled as a doctest so it cannot drift from the API
/// (`cargo test -p shardlease-examples --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// docs/getting-started.md's code, compiled as a doctest for the same reason.
#[cfg(doctest)]
#[doc = include_str!("../../docs/getting-started.md")]
pub struct GettingStartedDoctests;

use shardlease::balancer::is_active;
use shardlease::store::{Lease, LeaseStore};
use shardlease::{
    processor_fn, Batch, LeaseKey, ProcessorFactory, SequenceNumber, WorkerHandle, WorkerId,
};

/// One record of one shard: the shard, the sequence number and the sub-sequence number.
pub type RecordId = (LeaseKey, SequenceNumber, u64);

/// A shared log of how often each record was delivered to a processor. Clone it freely.
#[derive(Clone, Debug, Default)]
pub struct DeliveryLog {
    deliveries: Arc<Mutex<HashMap<RecordId, u32>>>,
}

impl DeliveryLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RecordId, u32>> {
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one delivery of every record of `batch`, read from shard `shard`.
    pub fn record(&self, shard: &LeaseKey, batch: &Batch) {
        let mut d = self.lock();
        for r in batch.records.iter() {
            *d.entry((shard.clone(), r.seq.clone(), r.sub)).or_insert(0) += 1;
        }
    }

    /// A processor factory whose processors count every record they are given in this log.
    /// They checkpoint after each batch (that is what [`processor_fn`] does).
    pub fn factory(&self) -> Arc<dyn ProcessorFactory> {
        let log = self.clone();
        processor_fn(move |ctx, batch| {
            let log = log.clone();
            async move {
                log.record(ctx.key(), &batch);
                Ok(())
            }
        })
    }

    /// How many times `record` was delivered (0: not yet).
    pub fn deliveries(&self, record: &RecordId) -> u32 {
        self.lock().get(record).copied().unwrap_or(0)
    }

    /// Distinct records delivered at least once.
    pub fn distinct(&self) -> u64 {
        self.lock().len() as u64
    }

    /// Records delivered more than once.
    pub fn redelivered(&self) -> u64 {
        self.lock().values().filter(|n| **n > 1).count() as u64
    }
}

/// Who owns what, as the store says, compared with the workers that are running.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Distribution {
    /// Active leases: not finished, and every parent finished or gone.
    pub active: usize,
    /// Active leases per running worker (zero included).
    pub shares: BTreeMap<WorkerId, usize>,
    /// Active leases owned by a worker that is not running (crashed, or stopped without release).
    pub down: BTreeMap<WorkerId, usize>,
    /// Active leases with no owner.
    pub unowned: usize,
    /// Whether every running worker is processing exactly the active leases the store says it
    /// owns (so ownership has not just been written but acted upon).
    pub processing_matches: bool,
    /// Every lease (active or not) with its owner and epoch.
    pub leases: BTreeMap<LeaseKey, (Option<WorkerId>, Epoch)>,
    /// Finished leases (checkpoint at shard end).
    pub finished: BTreeSet<LeaseKey>,
}

impl Distribution {
    /// Reads every lease from `store` and compares ownership with the running `workers`.
    pub async fn read(
        store: &dyn LeaseStore,
        workers: &[Arc<WorkerHandle>],
    ) -> shardlease::Result<Self> {
        let listing = store.list_leases().await?;
        let corrupt: BTreeSet<LeaseKey> =
            listing.corrupt.iter().map(|c| LeaseKey::new(c.key.clone())).collect();
        let leases: Vec<Lease> = listing.items.into_iter().map(|v| v.lease).collect();
        let by_key: HashMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        let running: BTreeMap<WorkerId, &WorkerHandle> =
            workers.iter().filter(|h| h.is_running()).map(|h| (h.id(), h.as_ref())).collect();
        let mut d = Distribution {
            shares: running.keys().map(|w| (w.clone(), 0)).collect(),
            ..Distribution::default()
        };
        let mut owned: BTreeMap<&WorkerId, BTreeSet<&LeaseKey>> = BTreeMap::new();
        for l in &leases {
            d.leases.insert(l.key.clone(), (l.owner.clone(), l.epoch));
            if l.is_finished() {
                d.finished.insert(l.key.clone());
            }
            if !is_active(l, &by_key, &corrupt) {
                continue;
            }
            d.active += 1;
            match &l.owner {
                None => d.unowned += 1,
                Some(o) => match d.shares.get_mut(o) {
                    Some(n) => {
                        *n += 1;
                        owned.entry(o).or_default().insert(&l.key);
                    }
                    None => *d.down.entry(o.clone()).or_insert(0) += 1,
                },
            }
        }
        d.processing_matches = running.iter().all(|(id, h)| {
            let held: BTreeSet<LeaseKey> = h.held_leases().into_iter().collect();
            let store_says: BTreeSet<LeaseKey> =
                owned.get(id).into_iter().flatten().map(|k| (*k).clone()).collect();
            held == store_says
        });
        Ok(d)
    }

    /// Largest share minus smallest share among running workers.
    pub fn spread(&self) -> usize {
        let max = self.shares.values().max().copied().unwrap_or(0);
        let min = self.shares.values().min().copied().unwrap_or(0);
        max - min
    }

    /// Every active lease owned by a running worker that is processing it, and shares within one
    /// of each other.
    pub fn is_balanced(&self) -> bool {
        !self.shares.is_empty()
            && self.unowned == 0
            && self.down.is_empty()
            && self.spread() <= 1
            && self.processing_matches
    }

    /// The shares as one line: `w1:8 w2:8 w3:8 w4:8  unowned:0`, with leases of workers that are
    /// not running shown as `w2(down):8`.
    pub fn shares_line(&self) -> String {
        let mut s = String::new();
        for (w, n) in &self.shares {
            let _ = write!(s, "{w}:{n} ");
        }
        for (w, n) in &self.down {
            let _ = write!(s, "{w}(down):{n} ");
        }
        let _ = write!(s, " unowned:{}", self.unowned);
        s
    }

    /// How many leases present in both `self` and `later` have a different owner in `later`.
    pub fn owners_changed(&self, later: &Distribution) -> usize {
        self.leases
            .iter()
            .filter(|(k, (owner, _))| later.leases.get(*k).is_some_and(|(o, _)| o != owner))
            .count()
    }

    /// How many ownership changes (epoch increments; a release and a take count one each)
    /// happened between `self` and `later`, over the leases present in both.
    pub fn epoch_bumps(&self, later: &Distribution) -> u64 {
        self.leases
            .iter()
            .filter_map(|(k, (_, e))| {
                later.leases.get(k).map(|(_, e2)| e2.get().saturating_sub(e.get()))
            })
            .sum()
    }
}

/// Polls `check` every `every` until it yields `Some`, or fails with a message naming `what`
/// once `timeout` has passed. Sleeping is only the polling interval; the condition decides.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "timed out after {:.1} s waiting for {what}",
                timeout.as_secs_f64()
            ));
        }
        tokio::time::sleep(every).await;
    }
}
