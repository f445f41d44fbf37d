//! An in-memory [`LeaseStore`]: the reference implementation of the store contract.
//!
//! It exists so that unit tests, the demo, simulations and single-process deployments can run the
//! whole lease algorithm without any external service, and so the conformance suite has a store
//! whose behaviour is obviously right to compare the real backends against.
//!
//! A [`MemoryBackend`] is one "server": it holds many namespaces. A [`MemoryStore`] is a handle on
//! one namespace of a backend. Every operation takes one `std::sync::Mutex` (never held across an
//! `.await`), which makes each record linearizable.
//!
//! Every write draws a fresh random version ([`Version::random`]), so a version never repeats for
//! a key: not after a delete and re-create (no ABA), and not after the namespace was rolled back
//! with [`MemoryStore::restore`] (see the `snapshot` module), which a counter could not promise.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::ids::{Namespace, WorkerId};
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::store::{
    check_distinct_keys, CreateOutcome, FleetSignal, LeaseStore, LeaseUpdate, Listing,
};
use crate::worker_record::WorkerRecord;

/// The records of one namespace.
#[derive(Clone, Default)]
pub(super) struct NamespaceState {
    pub(super) leases: BTreeMap<LeaseKey, VersionedLease>,
    pub(super) workers: BTreeMap<WorkerId, WorkerRecord>,
    /// The fleet signal ([`LeaseStore::write_fleet_signal`]); rolled back and wiped with the rest.
    pub(super) fleet_signal: Option<Version>,
}

/// What a backend shares between its handles.
struct BackendInner {
    namespaces: Mutex<HashMap<Namespace, Arc<Mutex<NamespaceState>>>>,
}

/// An in-memory coordination "server" holding any number of namespaces.
///
/// Cheap to clone: clones share the same data. Use [`MemoryBackend::global`] for the process-wide
/// instance behind `memory://` URLs, or [`MemoryBackend::new`] for an isolated one (tests).
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<BackendInner>,
}

impl MemoryBackend {
    /// A new, empty backend, isolated from every other.
    pub fn new() -> Self {
        MemoryBackend { inner: Arc::new(BackendInner { namespaces: Mutex::new(HashMap::new()) }) }
    }

    /// The process-wide shared backend (what `memory://` URLs connect to). Every call returns a
    /// handle on the same data.
    pub fn global() -> MemoryBackend {
        static GLOBAL: OnceLock<MemoryBackend> = OnceLock::new();
        GLOBAL.get_or_init(MemoryBackend::new).clone()
    }

    /// A store for `namespace` in this backend. Stores for the same namespace share their records;
    /// stores for different namespaces never see each other's.
    /// `Namespace` is checked where it is made: `backend.store("orders".parse()?)`.
    pub fn store(&self, namespace: Namespace) -> MemoryStore {
        let state = {
            let mut namespaces = lock(&self.inner.namespaces);
            Arc::clone(namespaces.entry(namespace.clone()).or_default())
        };
        MemoryStore { backend: self.clone(), namespace, state }
    }

    /// The namespaces that have been opened in this backend, sorted.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let mut names: Vec<Namespace> = lock(&self.inner.namespaces).keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether `self` and `other` are handles on the same backend.
    pub fn same_as(&self, other: &MemoryBackend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let namespaces = lock(&self.inner.namespaces).len();
        f.debug_struct("MemoryBackend").field("namespaces", &namespaces).finish_non_exhaustive()
    }
}

/// A [`LeaseStore`] over one namespace of a [`MemoryBackend`].
///
/// It exists so the whole runtime can be run, tested and demonstrated in one process with no
/// external service (unit and conformance tests, simulations that roll the store back with
/// [`MemoryStore::snapshot`] and [`MemoryStore::restore`], `memory://` URLs), and follows the same
/// contract as the real backends: compare-and-set with versions that never repeat, even across a
/// rollback. Cheap to clone: clones share the same records.
#[derive(Clone)]
pub struct MemoryStore {
    backend: MemoryBackend,
    pub(super) namespace: Namespace,
    state: Arc<Mutex<NamespaceState>>,
}

impl MemoryStore {
    /// The `"default"` namespace of a fresh, private backend.
    pub fn new() -> Self {
        MemoryBackend::new().store(Namespace::default())
    }

    /// The backend this store belongs to.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }

    /// How many leases the namespace holds.
    pub fn lease_count(&self) -> usize {
        self.lock().leases.len()
    }

    /// How many worker records the namespace holds.
    pub fn worker_count(&self) -> usize {
        self.lock().workers.len()
    }

    /// Writes `lease` with exactly `version`, whatever the record holds now (created if
    /// missing), bypassing compare-and-set: the conformance suite's rollback hook, which puts a
    /// record back the way it was before later writes. Test-only; never call it from a worker.
    #[doc(hidden)]
    pub fn restore_raw(&self, lease: &Lease, version: Version) {
        self.lock().leases.insert(lease.key.clone(), VersionedLease::new(lease.clone(), version));
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, NamespaceState> {
        lock(&self.state)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (every critical section
/// below leaves the state consistent before anything can panic).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn conflict(key: &LeaseKey, current: Option<&VersionedLease>) -> Error {
    Error::Conflict { key: key.clone(), current: current.cloned().map(Box::new) }
}

/// `create_lease` on the locked state.
fn create_locked(state: &mut NamespaceState, lease: &Lease) -> CreateOutcome {
    if state.leases.contains_key(&lease.key) {
        return CreateOutcome::AlreadyExists;
    }
    let version = Version::random();
    state.leases.insert(lease.key.clone(), VersionedLease::new(lease.clone(), version));
    CreateOutcome::Created(version)
}

/// `update_lease` on the locked state.
fn update_locked(state: &mut NamespaceState, lease: &Lease, expected: Version) -> Result<Version> {
    match state.leases.get_mut(&lease.key) {
        Some(current) if current.version == expected => {
            let version = Version::random_other_than(expected);
            *current = VersionedLease::new(lease.clone(), version);
            Ok(version)
        }
        current => Err(conflict(&lease.key, current.as_deref())),
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        Ok(create_locked(&mut self.lock(), lease))
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        Ok(self.lock().leases.get(key).cloned())
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        Ok(Listing::ok(self.lock().leases.values().cloned().collect()))
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        update_locked(&mut self.lock(), lease, expected)
    }

    /// Every item under one lock: the batch is atomic, each item judged on its own.
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        let mut state = self.lock();
        Ok(updates.iter().map(|u| update_locked(&mut state, &u.lease, u.expected)).collect())
    }

    /// Every lease under one lock: created together, so in order.
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let mut state = self.lock();
        Ok(leases.iter().map(|l| create_locked(&mut state, l)).collect())
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let mut state = self.lock();
        match state.leases.get(key) {
            Some(current) if current.version == expected => {
                state.leases.remove(key);
                Ok(())
            }
            current => Err(conflict(key, current)),
        }
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let mut state = self.lock();
        let stale = state
            .workers
            .get(&record.id)
            .is_some_and(|w| !WorkerRecord::heartbeat_replaces(w.beat, record.beat));
        if !stale {
            state.workers.insert(record.id.clone(), record.clone());
        }
        Ok(())
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        Ok(Listing::ok(self.lock().workers.values().cloned().collect()))
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.lock().workers.remove(id);
        Ok(())
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let mut state = self.lock();
        let current = state.workers.get(id).is_some_and(|w| w.beat == beat);
        if current {
            state.workers.remove(id);
        }
        Ok(current)
    }

    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.lock().fleet_signal = Some(token);
        Ok(())
    }

    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        Ok(self.lock().fleet_signal.map_or(FleetSignal::Missing, FleetSignal::Token))
    }

    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let state = self.lock();
        let mut items: Vec<WorkerRecord> =
            ids.iter().filter_map(|id| state.workers.get(id).cloned()).collect();
        items.sort_by(|a, b| a.id.cmp(&b.id));
        items.dedup_by(|a, b| a.id == b.id);
        Ok(Listing::ok(items))
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.namespace.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Epoch;
    use crate::position::Position;

    fn lease(key: &str) -> Lease {
        Lease::new(key, Position::TrimHorizon)
    }

    fn created(outcome: CreateOutcome) -> Version {
        match outcome {
            CreateOutcome::Created(v) => v,
            CreateOutcome::AlreadyExists => panic!("expected Created"),
        }
    }

    #[tokio::test]
    async fn create_is_idempotent() {
        let store = MemoryStore::new();
        let v = created(store.create_lease(&lease("a")).await.unwrap());
        let mut other = lease("a");
        other.epoch = Epoch(7);
        assert_eq!(store.create_lease(&other).await.unwrap(), CreateOutcome::AlreadyExists);
        let VersionedLease { lease: got, version: gv } =
            store.get_lease(&"a".into()).await.unwrap().unwrap();
        assert_eq!((got, gv), (lease("a"), v));
        assert_eq!(store.lease_count(), 1);
        assert!(store.get_lease(&"missing".into()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn update_is_compare_and_set() {
        let store = MemoryStore::new();
        let v1 = created(store.create_lease(&lease("a")).await.unwrap());
        let owned = lease("a").transferred_to(Some("w1".into()));
        let v2 = store.update_lease(&owned, v1).await.unwrap();
        assert_ne!(v2, v1);

        // A stale version conflicts and reports the current record.
        let stale = lease("a").transferred_to(Some("w2".into()));
        match store.update_lease(&stale, v1).await {
            Err(Error::Conflict { key, current: Some(current) }) => {
                assert_eq!(key, LeaseKey::from("a"));
                assert_eq!(*current, VersionedLease::new(owned.clone(), v2));
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(
            store.get_lease(&"a".into()).await.unwrap(),
            Some(VersionedLease::new(owned, v2))
        );

        // A missing record conflicts with no current record.
        match store.update_lease(&lease("nope"), v1).await {
            Err(Error::Conflict { key, current: None }) => assert_eq!(key.as_str(), "nope"),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(store.lease_count(), 1);
    }

    #[tokio::test]
    async fn delete_is_compare_and_set() {
        let store = MemoryStore::new();
        let v1 = created(store.create_lease(&lease("a")).await.unwrap());
        let v2 = store.update_lease(&lease("a"), v1).await.unwrap();
        match store.delete_lease(&"a".into(), v1).await {
            Err(Error::Conflict { current: Some(current), .. }) => assert_eq!(current.version, v2),
            other => panic!("expected a conflict, got {other:?}"),
        }
        store.delete_lease(&"a".into(), v2).await.unwrap();
        assert!(store.get_lease(&"a".into()).await.unwrap().is_none());
        assert!(matches!(
            store.delete_lease(&"a".into(), v2).await,
            Err(Error::Conflict { current: None, .. })
        ));
        assert_eq!(store.lease_count(), 0);
    }

    #[tokio::test]
    async fn versions_are_never_reused() {
        let store = MemoryStore::new();
        let v1 = created(store.create_lease(&lease("a")).await.unwrap());
        store.delete_lease(&"a".into(), v1).await.unwrap();
        let v2 = created(store.create_lease(&lease("a")).await.unwrap());
        assert_ne!(v1, v2, "a re-created record must not get its old version back (ABA)");
        // The old version cannot write the new record.
        assert!(matches!(
            store.update_lease(&lease("a"), v1).await,
            Err(Error::Conflict { current: Some(_), .. })
        ));
        // Versions are random, so they differ across namespaces and backends too.
        let other = store.backend().store("other".parse().unwrap());
        let v3 = created(other.create_lease(&lease("a")).await.unwrap());
        assert!(v3 != v1 && v3 != v2);
        assert!([v1, v2, v3].iter().all(|v| v.0 >= 1 && v.0 <= Version::MAX_RANDOM));
    }

    #[tokio::test]
    async fn a_record_put_back_by_hand_still_gets_fresh_versions() {
        let store = MemoryStore::new();
        let v1 = created(store.create_lease(&lease("a")).await.unwrap());
        let b = lease("a").transferred_to(Some("b".into()));
        let v2 = store.update_lease(&b, v1).await.unwrap();
        store.restore_raw(&lease("a"), v1);
        assert_eq!(
            store.get_lease(&"a".into()).await.unwrap(),
            Some(VersionedLease::new(lease("a"), v1))
        );
        let c = lease("a").transferred_to(Some("c".into()));
        let v3 = store.update_lease(&c, v1).await.unwrap();
        assert_ne!(v3, v2, "a rolled-back record must not hand out a version again");
        match store.update_lease(&b, v2).await {
            Err(Error::Conflict { current: Some(current), .. }) => {
                assert_eq!(*current, VersionedLease::new(c, v3))
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn namespaces_are_isolated() {
        let backend = MemoryBackend::new();
        let a = backend.store("app-a".parse().unwrap());
        let b = backend.store("app-b".parse().unwrap());
        let a2 = backend.store("app-a".parse().unwrap());
        a.create_lease(&lease("shard")).await.unwrap();
        a.heartbeat(&WorkerRecord::new("w".into(), 1)).await.unwrap();
        assert_eq!(a2.lease_count(), 1, "same namespace, same records");
        assert_eq!(b.lease_count(), 0);
        assert!(b.list_workers().await.unwrap().items.is_empty());
        assert_eq!(LeaseStore::namespace(&a), Some(Namespace::new("app-a").unwrap()));
        assert_eq!(
            backend.namespaces(),
            vec![Namespace::new("app-a").unwrap(), Namespace::new("app-b").unwrap()]
        );
        // A separate backend shares nothing.
        assert_eq!(MemoryBackend::new().store("app-a".parse().unwrap()).lease_count(), 0);
        assert_eq!(LeaseStore::namespace(&MemoryStore::new()), Some(Namespace::default()));
    }

    #[tokio::test]
    async fn global_backend_is_shared() {
        let ns = format!("global-test-{}", rand::random::<u64>());
        MemoryBackend::global().store(ns.parse().unwrap()).create_lease(&lease("x")).await.unwrap();
        assert_eq!(MemoryBackend::global().store(ns.parse().unwrap()).lease_count(), 1);
        assert!(MemoryBackend::global().same_as(&MemoryBackend::global()));
        assert!(!MemoryBackend::new().same_as(&MemoryBackend::global()));
    }

    #[tokio::test]
    async fn heartbeat_upserts_and_remove_is_idempotent() {
        let store = MemoryStore::new();
        store.heartbeat(&WorkerRecord::new("w2".into(), 1)).await.unwrap();
        store.heartbeat(&WorkerRecord::new("w1".into(), 1)).await.unwrap();
        store.heartbeat(&WorkerRecord::new("w2".into(), 2)).await.unwrap();
        let workers = store.list_workers().await.unwrap().items;
        let beats: Vec<(&str, u64)> = workers.iter().map(|w| (w.id.as_str(), w.beat)).collect();
        assert_eq!(beats, vec![("w1", 1), ("w2", 2)]);
        store.remove_worker(&"w1".into()).await.unwrap();
        store.remove_worker(&"w1".into()).await.unwrap();
        store.remove_worker(&"never".into()).await.unwrap();
        assert_eq!(store.worker_count(), 1);
    }

    #[tokio::test]
    async fn remove_worker_if_checks_the_beat() {
        let store = MemoryStore::new();
        store.heartbeat(&WorkerRecord::new("w".into(), 3)).await.unwrap();
        assert!(!store.remove_worker_if(&"w".into(), 2).await.unwrap(), "stale beat");
        assert_eq!(store.worker_count(), 1);
        assert!(store.remove_worker_if(&"w".into(), 3).await.unwrap());
        assert_eq!(store.worker_count(), 0);
        assert!(!store.remove_worker_if(&"w".into(), 3).await.unwrap(), "missing record");
        let named = LeaseStore::namespace(&store);
        assert_eq!(named.as_ref().map(Namespace::as_str), Some("default"));
    }

    #[tokio::test]
    async fn listings_are_sorted_by_key() {
        let store = MemoryStore::new();
        for key in ["c", "a", "b"] {
            store.create_lease(&lease(key)).await.unwrap();
        }
        let listing = store.list_leases().await.unwrap();
        let keys: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        assert_eq!(keys, vec!["a", "b", "c"]);
        assert!(listing.corrupt.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers_exactly_one_wins() {
        let store = MemoryStore::new();
        let v = created(store.create_lease(&lease("a")).await.unwrap());
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut l = lease("a").transferred_to(Some(format!("w{i}").as_str().into()));
                l.epoch = Epoch(i);
                store.update_lease(&l, v).await.is_ok()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.unwrap());
        }
        assert_eq!(wins, 1);

        let creators: Vec<_> = (0..16)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { store.create_lease(&lease("b")).await.unwrap() })
            })
            .collect();
        let mut created_count = 0;
        for t in creators {
            created_count += usize::from(matches!(t.await.unwrap(), CreateOutcome::Created(_)));
        }
        assert_eq!(created_count, 1);
    }

    #[test]
    fn debug_does_not_dump_records() {
        let store = MemoryStore::new();
        let s = format!("{store:?}");
        assert!(s.contains("default"), "{s}");
        assert!(format!("{:?}", store.backend()).contains("MemoryBackend"));
    }
}
