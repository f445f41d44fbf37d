//! [`StoreDecorator`]: the one place a [`LeaseStore`] wrapper's forwarding is written (the trait's
//! documentation says why it exists and how to use it).

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::Result;
use crate::ids::{Namespace, WorkerId};
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::notify::ChangeStream;
use crate::store::{
    check_distinct_keys, CreateOutcome, FleetSignal, LeaseStore, LeaseUpdate, Listing,
    DEFAULT_BATCH_CONCURRENCY,
};
use crate::worker_record::WorkerRecord;

/// A [`LeaseStore`] wrapper: each method defaults to calling the same method of
/// [`inner`](StoreDecorator::inner).
///
/// A decorator (fault injection, auditing, call counting, metrics) changes a few methods of the
/// store it wraps and must pass every other one through unchanged, including the methods with a
/// default body in [`LeaseStore`] (`update_lease_quietly`, `remove_worker_if`, `namespace`,
/// `subscribe_changes`, `update_leases`, `create_leases`), or the
/// wrapped store's native behaviour is silently lost. Writing that forwarding by hand in each
/// decorator meant that a new store method had to be added to every one of them.
///
/// Here every method of [`StoreDecorator`] forwards to [`StoreDecorator::inner`] by default, and
/// every `StoreDecorator` (that is `Debug`) is a [`LeaseStore`]. A decorator implements `inner`
/// and overrides only what it changes; a new `LeaseStore` method is added to this trait and
/// to the blanket impl, once.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use shardlease_core::store::{Lease, LeaseStore, StoreDecorator, Version};
/// use shardlease_core::Result;
///
/// /// Counts compare-and-set writes; everything else passes through.
/// #[derive(Debug)]
/// struct CountUpdates {
///     inner: Arc<dyn LeaseStore>,
///     updates: AtomicU64,
/// }
///
/// #[async_trait::async_trait]
/// impl StoreDecorator for CountUpdates {
///     fn inner(&self) -> &dyn LeaseStore {
///         &*self.inner
///     }
///     async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
///         self.updates.fetch_add(1, Ordering::Relaxed);
///         self.inner.update_lease(lease, expected).await
///     }
/// }
/// ```
#[async_trait]
pub trait StoreDecorator: Send + Sync {
    /// The wrapped store.
    fn inner(&self) -> &dyn LeaseStore;

    /// See [`LeaseStore::create_lease`].
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        self.inner().create_lease(lease).await
    }
    /// See [`LeaseStore::get_lease`].
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        self.inner().get_lease(key).await
    }
    /// See [`LeaseStore::list_leases`].
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        self.inner().list_leases().await
    }
    /// See [`LeaseStore::update_lease`].
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.inner().update_lease(lease, expected).await
    }
    /// See [`LeaseStore::update_lease_quietly`]. The default goes through this decorator's own
    /// [`update_lease`](StoreDecorator::update_lease), so a decorator that changes updates (a
    /// fault, an audit) sees quiet ones too; the write is then announced like any update, which
    /// is safe (a spurious notice costs subscribers a listing). A decorator that forwards updates
    /// unchanged overrides this to call the inner store's `update_lease_quietly`.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        StoreDecorator::update_lease(self, lease, expected).await
    }
    /// See [`LeaseStore::update_leases`].
    ///
    /// Default: this decorator's [`update_lease`](StoreDecorator::update_lease) for each item,
    /// [`DEFAULT_BATCH_CONCURRENCY`] at a time (the body of [`LeaseStore::update_leases`]), so a
    /// decorator that changes single writes (injects faults, counts, audits) sees the writes of
    /// a batch too. The wrapped store's own batch is used only by a decorator that overrides this
    /// method, as the decorators of this workspace do (doing for the batch what they do for one
    /// write, e.g. counting its items).
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        use futures::StreamExt;
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        // Futures do nothing until polled: `buffered` starts them a few at a time.
        let writes: Vec<_> = updates
            .iter()
            .map(|u| StoreDecorator::update_lease(self, &u.lease, u.expected))
            .collect();
        Ok(futures::stream::iter(writes).buffered(DEFAULT_BATCH_CONCURRENCY).collect().await)
    }
    /// See [`LeaseStore::create_leases`].
    ///
    /// Default: this decorator's [`create_lease`](StoreDecorator::create_lease) for each lease,
    /// in order (see [`update_leases`](StoreDecorator::update_leases) for why not the wrapped
    /// store's batch).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let mut outcomes = Vec::with_capacity(leases.len());
        for lease in leases {
            outcomes.push(StoreDecorator::create_lease(self, lease).await?);
        }
        Ok(outcomes)
    }
    /// See [`LeaseStore::delete_lease`].
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.inner().delete_lease(key, expected).await
    }
    /// See [`LeaseStore::heartbeat`].
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.inner().heartbeat(record).await
    }
    /// See [`LeaseStore::list_workers`].
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.inner().list_workers().await
    }
    /// See [`LeaseStore::remove_worker`].
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.inner().remove_worker(id).await
    }
    /// See [`LeaseStore::remove_worker_if`] (the inner store's atomic version, not the default).
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        self.inner().remove_worker_if(id, beat).await
    }
    /// See [`LeaseStore::write_fleet_signal`].
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.inner().write_fleet_signal(token).await
    }
    /// See [`LeaseStore::read_fleet_signal`].
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        self.inner().read_fleet_signal().await
    }
    /// See [`LeaseStore::get_workers`] (the inner store's multi-key read, not the default).
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        self.inner().get_workers(ids).await
    }
    /// See [`LeaseStore::namespace`].
    fn namespace(&self) -> Option<Namespace> {
        self.inner().namespace()
    }
    /// See [`LeaseStore::subscribe_changes`].
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        self.inner().subscribe_changes().await
    }
}

#[async_trait]
impl<T: StoreDecorator + Debug> LeaseStore for T {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        StoreDecorator::create_lease(self, lease).await
    }
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        StoreDecorator::get_lease(self, key).await
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        StoreDecorator::list_leases(self).await
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        StoreDecorator::update_lease(self, lease, expected).await
    }
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        StoreDecorator::update_lease_quietly(self, lease, expected).await
    }
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        StoreDecorator::update_leases(self, updates).await
    }
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        StoreDecorator::create_leases(self, leases).await
    }
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        StoreDecorator::delete_lease(self, key, expected).await
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        StoreDecorator::heartbeat(self, record).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        StoreDecorator::list_workers(self).await
    }
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        StoreDecorator::remove_worker(self, id).await
    }
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        StoreDecorator::remove_worker_if(self, id, beat).await
    }
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        StoreDecorator::write_fleet_signal(self, token).await
    }
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        StoreDecorator::read_fleet_signal(self).await
    }
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        StoreDecorator::get_workers(self, ids).await
    }
    fn namespace(&self) -> Option<Namespace> {
        StoreDecorator::namespace(self)
    }
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        StoreDecorator::subscribe_changes(self).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::position::Position;

    /// Overrides nothing: every call must reach the memory store, the default-bodied ones too.
    #[derive(Debug)]
    struct PassThrough(Arc<MemoryStore>);

    impl StoreDecorator for PassThrough {
        fn inner(&self) -> &dyn LeaseStore {
            &*self.0
        }
    }

    #[tokio::test]
    async fn every_method_reaches_the_inner_store() {
        let inner = Arc::new(MemoryStore::new());
        let store: Arc<dyn LeaseStore> = Arc::new(PassThrough(inner.clone()));
        let lease = Lease::new("k", Position::TrimHorizon);
        let CreateOutcome::Created(v) = store.create_lease(&lease).await.unwrap() else {
            panic!("fresh store")
        };
        let v = store.update_lease(&lease, v).await.unwrap();
        let other = Lease::new("k2", Position::TrimHorizon);
        let made = store.create_leases(std::slice::from_ref(&other)).await.unwrap();
        let [CreateOutcome::Created(v2)] = made[..] else { panic!("fresh key: {made:?}") };
        let batch = [LeaseUpdate::new(other.clone(), v2)];
        let written = store.update_leases(&batch).await.unwrap();
        let v2 = *written[0].as_ref().unwrap();
        assert_eq!(inner.get_lease(&other.key).await.unwrap().map(|v| v.version), Some(v2));
        store.delete_lease(&other.key, v2).await.unwrap();
        assert_eq!(
            inner.get_lease(&lease.key).await.unwrap().map(|VersionedLease { version: v, .. }| v),
            Some(v)
        );
        assert_eq!(store.list_leases().await.unwrap().items.len(), 1);
        store.delete_lease(&lease.key, v).await.unwrap();
        assert!(store.get_lease(&lease.key).await.unwrap().is_none());
        store.heartbeat(&WorkerRecord::new("w".into(), 2)).await.unwrap();
        assert_eq!(store.list_workers().await.unwrap().items.len(), 1);
        assert!(!store.remove_worker_if(&"w".into(), 1).await.unwrap());
        assert!(store.remove_worker_if(&"w".into(), 2).await.unwrap());
        store.remove_worker(&"w".into()).await.unwrap();
        assert_eq!(store.namespace(), LeaseStore::namespace(&*inner));
        assert!(store.namespace().is_some(), "the memory store knows its namespace");
        assert_eq!(
            store.subscribe_changes().await.unwrap().is_some(),
            LeaseStore::subscribe_changes(&*inner).await.unwrap().is_some()
        );
    }
}
