//! A lease store written the way an outside user writes one: against the public `shardlease`
//! API only, over a `Mutex<BTreeMap>`. It is the worked example of docs/implementing-a-store.md,
//! and `examples/tests/btree_store_conformance.rs` runs the whole conformance suite on it.
//!
//! Everything a real store needs is here in miniature: per-namespace records, create-if-absent,
//! compare-and-set on a version drawn at random (so a version never repeats for a key, even if
//! the data were rolled back), a conditional worker removal done atomically, and errors mapped
//! into `shardlease::Error`. There is no lease logic: that lives in the core.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use shardlease::store::{
    CreateOutcome, FleetSignal, Lease, LeaseStore, Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease::{async_trait, Error, LeaseKey, Namespace, Result, WorkerId};

/// The records of every namespace, keyed by `(namespace, key)` so one namespace is a range.
#[derive(Debug, Default)]
struct Tables {
    leases: BTreeMap<(String, String), VersionedLease>,
    workers: BTreeMap<(String, String), WorkerRecord>,
    /// Each namespace's fleet signal: the token last written.
    signals: BTreeMap<String, Version>,
}

/// The shared data behind any number of [`BTreeStore`]s (one per namespace), like a database
/// server behind its connections. Clone it freely.
#[derive(Clone, Debug, Default)]
pub struct BTreeBackend {
    tables: Arc<Mutex<Tables>>,
}

impl BTreeBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store serving `namespace` on this backend.
    pub fn store(&self, namespace: Namespace) -> BTreeStore {
        BTreeStore { tables: self.tables.clone(), namespace }
    }
}

/// One namespace of a [`BTreeBackend`].
#[derive(Clone, Debug)]
pub struct BTreeStore {
    tables: Arc<Mutex<Tables>>,
    namespace: Namespace,
}

impl BTreeStore {
    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic elsewhere while holding the lock leaves consistent maps (every write below is
        // one insert or remove), so a poisoned lock is still usable.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn id(&self, key: &str) -> (String, String) {
        (self.namespace.as_str().to_owned(), key.to_owned())
    }

    fn conflict(key: &LeaseKey, current: Option<&VersionedLease>) -> Error {
        Error::Conflict { key: key.clone(), current: current.cloned().map(Box::new) }
    }

    /// Test hook for the conformance suite's rollback case: writes `lease` at exactly `version`,
    /// bypassing compare-and-set, as a store restored from an old backup would hold it.
    pub fn restore_raw(&self, lease: &Lease, version: Version) {
        let id = self.id(lease.key.as_str());
        self.lock().leases.insert(id, VersionedLease::new(lease.clone(), version));
    }
}

#[async_trait]
impl LeaseStore for BTreeStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let mut t = self.lock();
        let id = self.id(lease.key.as_str());
        if t.leases.contains_key(&id) {
            return Ok(CreateOutcome::AlreadyExists);
        }
        let version = Version::random();
        t.leases.insert(id, VersionedLease::new(lease.clone(), version));
        Ok(CreateOutcome::Created(version))
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        Ok(self.lock().leases.get(&self.id(key.as_str())).cloned())
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let ns = self.namespace.as_str();
        let t = self.lock();
        Ok(Listing::ok(
            t.leases.iter().filter(|((n, _), _)| n == ns).map(|(_, v)| v.clone()).collect(),
        ))
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let mut t = self.lock();
        let id = self.id(lease.key.as_str());
        match t.leases.get(&id) {
            Some(VersionedLease { version: current, .. }) if *current == expected => {
                let version = Version::random_other_than(expected);
                t.leases.insert(id, VersionedLease::new(lease.clone(), version));
                Ok(version)
            }
            other => Err(Self::conflict(&lease.key, other)),
        }
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let mut t = self.lock();
        let id = self.id(key.as_str());
        match t.leases.get(&id) {
            Some(VersionedLease { version: current, .. }) if *current == expected => {
                t.leases.remove(&id);
                Ok(())
            }
            other => Err(Self::conflict(key, other)),
        }
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let id = self.id(record.id.as_str());
        let mut t = self.lock();
        // Never over a later (or the same) beat of the same process: a late write is dropped.
        if t.workers.get(&id).is_none_or(|w| WorkerRecord::heartbeat_replaces(w.beat, record.beat))
        {
            t.workers.insert(id, record.clone());
        }
        Ok(())
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        let ns = self.namespace.as_str();
        let t = self.lock();
        Ok(Listing::ok(
            t.workers.iter().filter(|((n, _), _)| n == ns).map(|(_, w)| w.clone()).collect(),
        ))
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.lock().workers.remove(&self.id(id.as_str()));
        Ok(())
    }

    /// Atomic under the one lock: a heartbeat cannot land between the check and the delete.
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let mut t = self.lock();
        let key = self.id(id.as_str());
        if t.workers.get(&key).is_some_and(|w| w.beat == beat) {
            t.workers.remove(&key);
            return Ok(true);
        }
        Ok(false)
    }

    /// One record per namespace, apart from the worker records so no listing returns it.
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.lock().signals.insert(self.namespace.as_str().to_owned(), token);
        Ok(())
    }

    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        let t = self.lock();
        Ok(t.signals
            .get(self.namespace.as_str())
            .map_or(FleetSignal::Missing, |v| FleetSignal::Token(*v)))
    }

    /// The named records only: a worker watching two peers reads two records.
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let t = self.lock();
        let mut ids: Vec<&WorkerId> = ids.iter().collect();
        ids.sort();
        ids.dedup();
        Ok(Listing::ok(
            ids.into_iter()
                .filter_map(|id| t.workers.get(&self.id(id.as_str())).cloned())
                .collect(),
        ))
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.namespace.clone())
    }
}
