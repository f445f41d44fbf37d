//! The suite must have teeth: stores with the bugs real backends tend to have must fail the case
//! meant to catch them, and every namespace a failing case opened must still be cleaned up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::FutureExt;
use shardlease_core::store::{
    CreateOutcome, Lease, LeaseStore, Listing, MemoryBackend, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};
use shardlease_testkit::{suite, FnFactory, StoreFactory};

/// A bug to plant in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// Updates ignore the expected version.
    LastWriterWins,
    /// Conflicts do not say what the record is now.
    ConflictWithoutCurrent,
    /// A list misses its last record (a paging off-by-one).
    ListDropsOne,
    /// Every namespace is the same one.
    SharedNamespace,
    /// Removing a missing worker is an error.
    RemoveMissingFails,
    /// Conditional removal ignores the beat.
    RemoveIfIgnoresBeat,
    /// A heartbeat overwrites whatever is stored (a plain upsert, last writer wins).
    HeartbeatOverwrites,
    /// A heartbeat never replaces a greater beat, even of another process (compares the beats
    /// but not the processes).
    HeartbeatIgnoresProcess,
    /// A heartbeat keeps every field but the published lease loads.
    HeartbeatDropsLeaseLoads,
    /// A heartbeat with no lease loads leaves the previously published ones in place.
    HeartbeatKeepsOldLeaseLoads,
}

#[derive(Debug)]
struct Broken {
    inner: Arc<dyn LeaseStore>,
    bug: Bug,
}

#[async_trait]
impl LeaseStore for Broken {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        self.inner.create_lease(lease).await
    }
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        self.inner.get_lease(key).await
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let mut listing = self.inner.list_leases().await?;
        if self.bug == Bug::ListDropsOne {
            listing.items.pop();
        }
        Ok(listing)
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let expected = match (self.bug, self.inner.get_lease(&lease.key).await?) {
            (Bug::LastWriterWins, Some(VersionedLease { version: current, .. })) => current,
            _ => expected,
        };
        match self.inner.update_lease(lease, expected).await {
            Err(Error::Conflict { key, .. }) if self.bug == Bug::ConflictWithoutCurrent => {
                Err(Error::Conflict { key, current: None })
            }
            other => other,
        }
    }
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.inner.delete_lease(key, expected).await
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        match self.bug {
            Bug::HeartbeatOverwrites => self.inner.remove_worker(&record.id).await?,
            Bug::HeartbeatIgnoresProcess => {
                let listed = self.inner.list_workers().await?;
                if listed.items.iter().any(|w| w.id == record.id && w.beat >= record.beat) {
                    return Ok(());
                }
                self.inner.remove_worker(&record.id).await?;
            }
            Bug::HeartbeatDropsLeaseLoads => {
                let mut stripped = record.clone();
                stripped.lease_loads.clear();
                return self.inner.heartbeat(&stripped).await;
            }
            Bug::HeartbeatKeepsOldLeaseLoads if record.lease_loads.is_empty() => {
                let listed = self.inner.list_workers().await?;
                let mut kept = record.clone();
                if let Some(old) = listed.items.iter().find(|w| w.id == record.id) {
                    kept.lease_loads = old.lease_loads.clone();
                }
                return self.inner.heartbeat(&kept).await;
            }
            _ => {}
        }
        self.inner.heartbeat(record).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.inner.list_workers().await
    }
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        if self.bug == Bug::RemoveMissingFails {
            let listed = self.inner.list_workers().await?;
            if !listed.items.iter().any(|w| &w.id == id) {
                return Err(Error::permanent(format!("no such worker {id}")));
            }
        }
        self.inner.remove_worker(id).await
    }
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        if self.bug == Bug::RemoveIfIgnoresBeat {
            self.inner.remove_worker(id).await?;
            return Ok(true);
        }
        self.inner.remove_worker_if(id, beat).await
    }
    fn namespace(&self) -> Option<Namespace> {
        self.inner.namespace()
    }
}

struct BrokenFactory {
    backend: MemoryBackend,
    bug: Bug,
    cleaned: Mutex<Vec<String>>,
}

impl BrokenFactory {
    fn new(bug: Bug) -> Self {
        BrokenFactory { backend: MemoryBackend::new(), bug, cleaned: Mutex::new(Vec::new()) }
    }
}

#[async_trait]
impl StoreFactory for BrokenFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        let ns = if self.bug == Bug::SharedNamespace { "shared" } else { namespace };
        Ok(Arc::new(Broken {
            inner: Arc::new(self.backend.store(Namespace::new(ns)?)),
            bug: self.bug,
        }))
    }
    async fn cleanup(&self, namespace: &str) -> Result<()> {
        self.cleaned.lock().unwrap().push(namespace.to_owned());
        Ok(())
    }
    fn name(&self) -> String {
        format!("broken({:?})", self.bug)
    }
}

async fn must_fail(what: &str, case: impl Future<Output = ()>) {
    let outcome = AssertUnwindSafe(case).catch_unwind().await;
    assert!(outcome.is_err(), "{what}: the suite should have caught the bug");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bug_fails_its_case() {
    let f = BrokenFactory::new(Bug::LastWriterWins);
    must_fail("last writer wins", suite::update_is_compare_and_set(&f)).await;
    must_fail("last writer wins", suite::delete_is_compare_and_set(&f)).await;

    let f = BrokenFactory::new(Bug::ConflictWithoutCurrent);
    must_fail("conflict without current", suite::update_is_compare_and_set(&f)).await;
    must_fail("conflict without current", suite::concurrent_increments(&f)).await;

    let f = BrokenFactory::new(Bug::ListDropsOne);
    must_fail("list drops one", suite::list_many_leases_n(&f, 100)).await;

    let f = BrokenFactory::new(Bug::SharedNamespace);
    must_fail("shared namespace", suite::namespaces_are_isolated(&f)).await;

    let f = BrokenFactory::new(Bug::RemoveMissingFails);
    must_fail("remove missing fails", suite::worker_records(&f)).await;

    let f = BrokenFactory::new(Bug::RemoveIfIgnoresBeat);
    must_fail("remove_if ignores the beat", suite::remove_worker_if_checks_the_beat(&f)).await;

    for bug in [Bug::HeartbeatOverwrites, Bug::HeartbeatIgnoresProcess] {
        let f = BrokenFactory::new(bug);
        suite::worker_records(&f).await; // a plain upsert passes the upsert case ...
        must_fail(
            "heartbeat moves the beat back",
            suite::a_heartbeat_never_moves_the_beat_back(&f),
        )
        .await; // ... but lets a late heartbeat move the beat back, or a restart be ignored
    }

    for bug in [Bug::HeartbeatDropsLeaseLoads, Bug::HeartbeatKeepsOldLeaseLoads] {
        let f = BrokenFactory::new(bug);
        suite::worker_records(&f).await; // records without loads read back fine ...
        must_fail("lease loads lost or stale", suite::worker_records_keep_lease_loads(&f)).await;
    }

    let f = counter_factory();
    suite::update_is_compare_and_set(&f).await; // a counter passes the plain CAS case ...
    must_fail(
        "counter versions", // ... but hands out versions again after a rollback
        suite::a_rolled_back_record_never_accepts_a_stale_version(&f),
    )
    .await;
}

/// The attribute where [`CounterVersions`] keeps its version.
const COUNTER: &str = "test.counter-version";

/// A store whose versions count the writes of a record (1, 2, 3, ... kept in the record itself,
/// like a SQL `version = version + 1` column): unique while nothing is lost, repeated after a
/// rollback.
#[derive(Debug)]
struct CounterVersions {
    inner: Arc<dyn LeaseStore>,
}

impl CounterVersions {
    fn outer(VersionedLease { mut lease, .. }: VersionedLease) -> VersionedLease {
        let v = lease.attributes.remove(COUNTER).and_then(|v| v.parse().ok()).unwrap_or(0);
        VersionedLease::new(lease, Version(v))
    }

    fn with_counter(lease: &Lease, v: u64) -> Lease {
        let mut lease = lease.clone();
        lease.attributes.insert(COUNTER.to_owned(), v.to_string());
        lease
    }

    fn conflict(key: &LeaseKey, current: Option<VersionedLease>) -> Error {
        Error::Conflict { key: key.clone(), current: current.map(|c| Box::new(Self::outer(c))) }
    }
}

#[async_trait]
impl LeaseStore for CounterVersions {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        Ok(match self.inner.create_lease(&Self::with_counter(lease, 1)).await? {
            CreateOutcome::Created(_) => CreateOutcome::Created(Version(1)),
            CreateOutcome::AlreadyExists => CreateOutcome::AlreadyExists,
        })
    }
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        Ok(self.inner.get_lease(key).await?.map(Self::outer))
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let listing = self.inner.list_leases().await?;
        Ok(Listing::ok(listing.items.into_iter().map(Self::outer).collect()))
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let current = self.inner.get_lease(&lease.key).await?;
        match current {
            Some(c) if Self::outer(c.clone()).version == expected => {
                let next = Self::with_counter(lease, expected.0 + 1);
                match self.inner.update_lease(&next, c.version).await {
                    Ok(_) => Ok(Version(expected.0 + 1)),
                    Err(Error::Conflict { key, current }) => {
                        Err(Self::conflict(&key, current.map(|c| *c)))
                    }
                    Err(e) => Err(e),
                }
            }
            other => Err(Self::conflict(&lease.key, other)),
        }
    }
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        match self.inner.get_lease(key).await? {
            Some(c) if Self::outer(c.clone()).version == expected => {
                self.inner.delete_lease(key, c.version).await
            }
            other => Err(Self::conflict(key, other)),
        }
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.inner.heartbeat(record).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.inner.list_workers().await
    }
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.inner.remove_worker(id).await
    }
    // Worker records are not versioned here: the inner store's atomic conditional delete, not
    // the trait's default (which removes nothing).
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        self.inner.remove_worker_if(id, beat).await
    }
}

/// Stores whose versions are [`CounterVersions`], over one memory backend.
fn counter_factory() -> FnFactory {
    let backend = MemoryBackend::new();
    let raw = backend.clone();
    FnFactory::new("counter-versions", move |ns| {
        Ok(Arc::new(CounterVersions { inner: Arc::new(backend.store(ns)) }) as Arc<dyn LeaseStore>)
    })
    .with_restore_raw(move |ns, lease, version| {
        raw.store(ns)
            .restore_raw(&CounterVersions::with_counter(lease, version.0), Version::random());
        Ok(())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_case_still_cleans_up_every_namespace() {
    let f = BrokenFactory::new(Bug::ListDropsOne);
    must_fail("list drops one", suite::namespaces_are_isolated(&f)).await;
    let cleaned = f.cleaned.lock().unwrap().clone();
    assert_eq!(cleaned.len(), 2, "both namespaces cleaned: {cleaned:?}");
    assert!(cleaned[1].starts_with(&cleaned[0]), "{cleaned:?}");

    let f = BrokenFactory::new(Bug::ListDropsOne);
    suite::worker_records(&f).await;
    assert_eq!(f.cleaned.lock().unwrap().len(), 1, "a passing case cleans up too");
}
