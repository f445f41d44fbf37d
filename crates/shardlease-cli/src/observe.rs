//! What the fleet looks like "now", judged the way workers judge it: without comparing anyone's
//! wall clock. A worker is alive when its heartbeat `beat` moves between two listings of the
//! worker records taken a window apart on this process's own monotonic clock (a worker seen only
//! in the second listing is alive too, as a newcomer is for the runtime). One listing cannot say
//! who is alive, so every command that needs liveness costs one window of waiting.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use shardlease::store::{CorruptRecord, LeaseStore, Version, VersionedLease, WorkerRecord};
use shardlease::{LeaseKey, WorkerId};

use crate::error::CliError;

/// A worker as seen over the observation window.
#[derive(Clone, Debug)]
pub struct WorkerView {
    /// Its record at the end of the window.
    pub record: WorkerRecord,
    /// Whether its beat moved during the window (or it appeared during it).
    pub alive: bool,
}

/// Two listings of the namespace, a window apart.
#[derive(Debug)]
pub struct Observation {
    /// The leases as listed at the start of the window, by key, with their version.
    pub leases_before: HashMap<LeaseKey, Version>,
    /// The leases as listed at the end of the window.
    pub leases: Vec<VersionedLease>,
    /// Lease records that could not be decoded (end of the window).
    pub corrupt_leases: Vec<CorruptRecord>,
    /// Workers at the end of the window, by id.
    pub workers: BTreeMap<WorkerId, WorkerView>,
    /// Worker records that could not be decoded (end of the window).
    pub corrupt_workers: Vec<CorruptRecord>,
    /// How long the window was.
    pub window: Duration,
}

impl Observation {
    /// Lists the workers and leases, waits `window`, and lists them again.
    pub async fn take(store: &dyn LeaseStore, window: Duration) -> Result<Observation, CliError> {
        let first_workers = store.list_workers().await.map_err(CliError::Store)?;
        let first_leases = store.list_leases().await.map_err(CliError::Store)?;
        tokio::time::sleep(window).await;
        let workers = store.list_workers().await.map_err(CliError::Store)?;
        let leases = store.list_leases().await.map_err(CliError::Store)?;
        let before: HashMap<&WorkerId, u64> =
            first_workers.items.iter().map(|w| (&w.id, w.beat)).collect();
        // Death notices (`<id>#dead`) are records about workers, not workers.
        let views = workers
            .items
            .into_iter()
            .filter(|record| record.notice_of().is_none())
            .map(|record| {
                let alive = before.get(&record.id).is_none_or(|b| *b != record.beat);
                (record.id.clone(), WorkerView { record, alive })
            })
            .collect();
        Ok(Observation {
            leases_before: first_leases
                .items
                .into_iter()
                .map(|VersionedLease { lease: l, version: v }| (l.key, v))
                .collect(),
            leases: leases.items,
            corrupt_leases: leases.corrupt,
            workers: views,
            corrupt_workers: workers.corrupt,
            window,
        })
    }

    /// Whether `id` is alive as seen now. An owner without a worker record is not: nothing
    /// shows it beating.
    pub fn is_alive(&self, id: &WorkerId) -> bool {
        self.workers.get(id).is_some_and(|w| w.alive)
    }

    /// Whether `key` was listed at the same version at both ends of the window (nobody wrote it
    /// for the whole window).
    pub fn unchanged(&self, key: &LeaseKey, version: Version) -> bool {
        self.leases_before.get(key) == Some(&version)
    }
}
