//! A store decorator that gives every backend spans and metrics without the backend writing them:
//! each call runs in a `tracing` span named `store` (fields `operation` and `namespace`, never a
//! URL), its latency goes to the [`STORE_CALL_SECONDS`](crate::telemetry::STORE_CALL_SECONDS)
//! histogram and its errors to [`STORE_ERRORS`](crate::telemetry::STORE_ERRORS) by
//! [`error_kind`](crate::telemetry::error_kind). `shardlease::connect` wraps the stores it opens
//! in it.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use metrics::Label;
use tracing::Instrument;

use crate::error::Result;
use crate::ids::{Namespace, WorkerId};
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::notify::ChangeStream;
use crate::store::{CreateOutcome, FleetSignal, LeaseStore, LeaseUpdate, Listing};
use crate::store_decorator::StoreDecorator;
use crate::telemetry::{error_kind, KIND, NAMESPACE, OPERATION, STORE_CALL_SECONDS, STORE_ERRORS};
use crate::worker_record::WorkerRecord;

/// A [`LeaseStore`] that forwards every method to another, inside a span, timing it.
///
/// Conflicts are counted as errors of kind `conflict`: they are the normal outcome of a lost
/// compare-and-set race, so alert on the other kinds.
#[derive(Clone, Debug)]
pub struct InstrumentedStore {
    inner: Arc<dyn LeaseStore>,
    namespace: Arc<str>,
}

impl InstrumentedStore {
    /// Wraps `inner`; its metrics are labelled with the namespace the store reports (empty when
    /// it reports none).
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        let namespace = inner.namespace().map(|n| n.as_str().to_owned()).unwrap_or_default();
        InstrumentedStore { inner, namespace: namespace.into() }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let span = tracing::debug_span!("store", operation, namespace = %self.namespace);
        let started = Instant::now();
        let result = fut.instrument(span).await;
        let took = started.elapsed();
        let namespace = Label::new(NAMESPACE, self.namespace.clone());
        let op = Label::new(OPERATION, operation);
        metrics::histogram!(STORE_CALL_SECONDS, vec![namespace.clone(), op.clone()])
            .record(took.as_secs_f64());
        if let Err(e) = &result {
            let kind = Label::new(KIND, error_kind(e));
            metrics::counter!(STORE_ERRORS, vec![namespace, op, kind]).increment(1);
        }
        result
    }
}

/// Built on [`StoreDecorator`], so a store method added later is forwarded (uninstrumented)
/// rather than silently answered by the trait's default body.
#[async_trait]
impl StoreDecorator for InstrumentedStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        self.call("create_lease", self.inner.create_lease(lease)).await
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        self.call("get_lease", self.inner.get_lease(key)).await
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        self.call("list_leases", self.inner.list_leases()).await
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.call("update_lease", self.inner.update_lease(lease, expected)).await
    }

    /// Counted and timed as an `update_lease`: the store does the same compare-and-set.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.call("update_lease", self.inner.update_lease_quietly(lease, expected)).await
    }

    /// The wrapped store's batch, timed as one call (operation `update_leases`); each item that
    /// failed (a conflict, mostly) is counted as an error of that operation, as a single write's
    /// failure is.
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        let outcomes = self.call("update_leases", self.inner.update_leases(updates)).await?;
        for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
            let namespace = Label::new(NAMESPACE, self.namespace.clone());
            let op = Label::new(OPERATION, "update_leases");
            let kind = Label::new(KIND, error_kind(e));
            metrics::counter!(STORE_ERRORS, vec![namespace, op, kind]).increment(1);
        }
        Ok(outcomes)
    }

    /// The wrapped store's batch, as one call (operation `create_leases`).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.call("create_leases", self.inner.create_leases(leases)).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.call("delete_lease", self.inner.delete_lease(key, expected)).await
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.call("heartbeat", self.inner.heartbeat(record)).await
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.call("list_workers", self.inner.list_workers()).await
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.call("remove_worker", self.inner.remove_worker(id)).await
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        self.call("remove_worker_if", self.inner.remove_worker_if(id, beat)).await
    }

    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.call("write_fleet_signal", self.inner.write_fleet_signal(token)).await
    }

    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        self.call("read_fleet_signal", self.inner.read_fleet_signal()).await
    }

    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        self.call("get_workers", self.inner.get_workers(ids)).await
    }

    fn namespace(&self) -> Option<Namespace> {
        self.inner.namespace()
    }

    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        self.call("subscribe_changes", self.inner.subscribe_changes()).await
    }
}
