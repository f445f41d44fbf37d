//! [`CountingStore`]: a [`LeaseStore`] wrapper that counts every call by operation, so a test or
//! the bench can tell what a fleet costs the store (reads and writes, calls and records).
//!
//! Reads are `get_lease`, `list_leases`, `list_workers`, `read_fleet_signal` and `get_workers`;
//! writes are `create_lease`, `update_lease`, `delete_lease`, `heartbeat`, `remove_worker`,
//! `remove_worker_if` and `write_fleet_signal`. A call is
//! counted when it is made, whatever its outcome; compare-and-set conflicts are also counted on
//! their own. `namespace` is forwarded and not counted (it is not a call to the store).
//!
//! Calls are not what a store pays for: a listing of 10,000 leases is one call but 10,000 rows,
//! items or keys read. So records are counted too: every record a read returns (corrupt ones
//! included; a `get_lease` counts one even when the key is absent, as a store reads the key), and
//! one record per write call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::{
    CreateOutcome, FleetSignal, Lease, LeaseStore, Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Result, WorkerId};

/// The operations of the store contract, in reporting order.
pub const OPERATIONS: [&str; OPERATION_COUNT] = [
    "create_lease",
    "get_lease",
    "list_leases",
    "update_lease",
    "delete_lease",
    "heartbeat",
    "list_workers",
    "remove_worker",
    "remove_worker_if",
    "write_fleet_signal",
    "read_fleet_signal",
    "get_workers",
];

/// How many operations [`OPERATIONS`] names.
pub const OPERATION_COUNT: usize = 12;

/// Whether an operation of [`OPERATIONS`] reads (as opposed to writes).
pub fn is_read(op: &str) -> bool {
    matches!(op, "get_lease" | "list_leases" | "list_workers" | "read_fleet_signal" | "get_workers")
}

/// Calls per operation, indexed like [`OPERATIONS`], plus conflicts of `update_lease`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Calls per operation, in the order of [`OPERATIONS`].
    pub calls: [u64; OPERATION_COUNT],
    /// `update_lease` calls refused with a conflict.
    pub update_conflicts: u64,
    /// Records (rows, items, keys) the read calls returned.
    pub records_read: u64,
    /// Records the write calls wrote (one per call).
    pub records_written: u64,
}

impl OpCounts {
    /// Calls of one operation of [`OPERATIONS`] (0 for an unknown name).
    pub fn of(&self, op: &str) -> u64 {
        self.by_op().find(|(o, _)| *o == op).map_or(0, |(_, n)| n)
    }

    /// Calls of the read operations.
    pub fn reads(&self) -> u64 {
        self.by_op().filter(|(op, _)| is_read(op)).map(|(_, n)| n).sum()
    }

    /// Calls of the write operations.
    pub fn writes(&self) -> u64 {
        self.by_op().filter(|(op, _)| !is_read(op)).map(|(_, n)| n).sum()
    }

    /// `(operation, calls)` pairs in the order of [`OPERATIONS`].
    pub fn by_op(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        OPERATIONS.iter().copied().zip(self.calls.iter().copied())
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &OpCounts) -> OpCounts {
        let mut out = OpCounts {
            update_conflicts: self.update_conflicts.saturating_sub(earlier.update_conflicts),
            records_read: self.records_read.saturating_sub(earlier.records_read),
            records_written: self.records_written.saturating_sub(earlier.records_written),
            ..OpCounts::default()
        };
        for (o, (now, then)) in out.calls.iter_mut().zip(self.calls.iter().zip(&earlier.calls)) {
            *o = now.saturating_sub(*then);
        }
        out
    }
}

/// A store that forwards to another and counts every call. Cheap to clone the `Arc` it lives in;
/// all clones share the counters.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn LeaseStore>,
    calls: [AtomicU64; OPERATION_COUNT],
    update_conflicts: AtomicU64,
    records_read: AtomicU64,
}

impl CountingStore {
    /// Counts a failed compare-and-set.
    fn conflicted<T>(&self, r: &Result<T>) {
        if matches!(r, Err(Error::Conflict { .. })) {
            self.update_conflicts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        CountingStore {
            inner,
            calls: Default::default(),
            update_conflicts: AtomicU64::new(0),
            records_read: AtomicU64::new(0),
        }
    }

    /// The calls counted so far.
    pub fn counts(&self) -> OpCounts {
        let mut calls = [0; OPERATION_COUNT];
        for (c, a) in calls.iter_mut().zip(&self.calls) {
            *c = a.load(Ordering::Relaxed);
        }
        let records_written =
            OPERATIONS.iter().zip(calls).filter(|(op, _)| !is_read(op)).map(|(_, n)| n).sum();
        OpCounts {
            calls,
            update_conflicts: self.update_conflicts.load(Ordering::Relaxed),
            records_read: self.records_read.load(Ordering::Relaxed),
            records_written,
        }
    }

    fn read(&self, records: usize) {
        self.records_read.fetch_add(records as u64, Ordering::Relaxed);
    }

    fn count(&self, index: usize) {
        if let Some(c) = self.calls.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl shardlease_core::store::StoreDecorator for CountingStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        self.count(0);
        self.inner.create_lease(lease).await
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        self.count(1);
        self.read(1);
        self.inner.get_lease(key).await
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        self.count(2);
        let listing = self.inner.list_leases().await?;
        self.read(listing.items.len() + listing.corrupt.len());
        Ok(listing)
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.count(3);
        let r = self.inner.update_lease(lease, expected).await;
        self.conflicted(&r);
        r
    }

    /// Counted as an update (the same compare-and-set), passed on as quiet.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.count(3);
        let r = self.inner.update_lease_quietly(lease, expected).await;
        self.conflicted(&r);
        r
    }

    /// The wrapped store's batch, counted as one update per item (and each conflict).
    async fn update_leases(
        &self,
        updates: &[shardlease_core::store::LeaseUpdate],
    ) -> Result<Vec<Result<Version>>> {
        for _ in updates {
            self.count(3);
        }
        let outcomes = self.inner.update_leases(updates).await?;
        for r in &outcomes {
            self.conflicted(r);
        }
        Ok(outcomes)
    }

    /// The wrapped store's batch, counted as one create per lease.
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        for _ in leases {
            self.count(0);
        }
        self.inner.create_leases(leases).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.count(4);
        self.inner.delete_lease(key, expected).await
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.count(5);
        self.inner.heartbeat(record).await
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.count(6);
        let listing = self.inner.list_workers().await?;
        self.read(listing.items.len() + listing.corrupt.len());
        Ok(listing)
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.count(7);
        self.inner.remove_worker(id).await
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        self.count(8);
        self.inner.remove_worker_if(id, beat).await
    }

    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.count(9);
        self.inner.write_fleet_signal(token).await
    }

    /// One record read (the signal), present or not, as a `get_lease` of a missing key.
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        self.count(10);
        self.read(1);
        self.inner.read_fleet_signal().await
    }

    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        self.count(11);
        let listing = self.inner.get_workers(ids).await?;
        self.read(listing.items.len() + listing.corrupt.len());
        Ok(listing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlease_core::store::MemoryStore;
    use shardlease_core::Position;

    #[tokio::test]
    async fn counts_each_operation_and_classifies_reads_and_writes() {
        let store = CountingStore::new(Arc::new(MemoryStore::new()));
        let lease = Lease::new("k", Position::Latest);
        let CreateOutcome::Created(v) = store.create_lease(&lease).await.unwrap() else {
            panic!("not created")
        };
        store.get_lease(&lease.key).await.unwrap();
        store.list_leases().await.unwrap();
        let v2 = store.update_lease(&lease, v).await.unwrap();
        assert!(store.update_lease(&lease, v).await.is_err());
        store.heartbeat(&WorkerRecord::new(WorkerId::new("w"), 1)).await.unwrap();
        store.list_workers().await.unwrap();
        store.remove_worker(&WorkerId::new("w")).await.unwrap();
        assert!(!store.remove_worker_if(&WorkerId::new("w"), 1).await.unwrap());
        store.delete_lease(&lease.key, v2).await.unwrap();
        store.write_fleet_signal(Version(3)).await.unwrap();
        assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Token(Version(3)));
        store.heartbeat(&WorkerRecord::new(WorkerId::new("v"), 1)).await.unwrap();
        let ids = [WorkerId::new("v"), WorkerId::new("missing")];
        assert_eq!(store.get_workers(&ids).await.unwrap().items.len(), 1);
        assert_eq!(store.namespace().map(|n| n.to_string()).as_deref(), Some("default"));
        let c = store.counts();
        assert_eq!(c.calls, [1, 1, 1, 2, 1, 2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(c.update_conflicts, 1);
        // get (1) + the listing of one lease (1) + the listing of one worker (1) + the signal
        // (1) + the one named worker that exists (1).
        assert_eq!((c.records_read, c.records_written), (5, 9));
        assert_eq!((c.reads(), c.writes()), (5, 9));
        assert_eq!(c.since(&c), OpCounts::default());
    }
}
