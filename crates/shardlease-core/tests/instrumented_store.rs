//! The instrumented store decorator forwards every method of the store contract, the ones with a
//! default body included (a store's native conditional removal, namespace and change
//! notification must survive the wrapping), and records each call's latency and errors labelled
//! by operation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use shardlease_core::store::{
    ChangeStream, CreateOutcome, InstrumentedStore, Lease, LeaseStore, Listing, MemoryBackend,
    MemoryStore, StoreChange, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Position, Result, WorkerId};

/// A memory store that logs which method was called, and overrides every default-bodied method
/// with something the default would not do (so a decorator falling back to the default shows).
#[derive(Debug, Default)]
struct Probe {
    inner: MemoryStore,
    calls: Mutex<Vec<&'static str>>,
}

impl Probe {
    fn log(&self, m: &'static str) {
        self.calls.lock().unwrap().push(m);
    }
    fn calls(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[async_trait]
impl LeaseStore for Probe {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        self.log("create_lease");
        self.inner.create_lease(lease).await
    }
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        self.log("get_lease");
        self.inner.get_lease(key).await
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        self.log("list_leases");
        self.inner.list_leases().await
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.log("update_lease");
        self.inner.update_lease(lease, expected).await
    }
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.log("delete_lease");
        self.inner.delete_lease(key, expected).await
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.log("heartbeat");
        self.inner.heartbeat(record).await
    }
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.log("list_workers");
        self.inner.list_workers().await
    }
    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.log("remove_worker");
        self.inner.remove_worker(id).await
    }
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        self.log("remove_worker_if");
        self.inner.remove_worker_if(id, beat).await
    }
    fn namespace(&self) -> Option<Namespace> {
        self.log("namespace");
        Some(Namespace::new("probe-ns").unwrap())
    }
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        self.log("subscribe_changes");
        let change = StoreChange::Lease { key: "k".into(), before: None, after: None };
        Ok(Some(futures::stream::iter([change]).boxed()))
    }
}

#[tokio::test]
async fn every_method_is_forwarded_to_the_wrapped_store() {
    let probe = Arc::new(Probe::default());
    let store = InstrumentedStore::new(probe.clone());
    assert_eq!(probe.calls(), ["namespace"], "new() reads the namespace for its label");
    let me = WorkerId::new("w1");

    let lease = Lease::new("k", Position::TrimHorizon);
    let CreateOutcome::Created(v1) = store.create_lease(&lease).await.unwrap() else {
        panic!("not created")
    };
    assert_eq!(probe.calls(), ["create_lease"]);
    let VersionedLease { lease: got, version: v } =
        store.get_lease(&"k".into()).await.unwrap().unwrap();
    assert_eq!((got.key.as_str(), v), ("k", v1));
    assert_eq!(probe.calls(), ["get_lease"]);
    assert_eq!(store.list_leases().await.unwrap().items.len(), 1);
    assert_eq!(probe.calls(), ["list_leases"]);
    let v2 = store.update_lease(&lease, v1).await.unwrap();
    assert_eq!(probe.calls(), ["update_lease"]);
    store.delete_lease(&"k".into(), v2).await.unwrap();
    assert_eq!(probe.calls(), ["delete_lease"]);
    assert!(probe.inner.get_lease(&"k".into()).await.unwrap().is_none());

    store.heartbeat(&WorkerRecord::new(me.clone(), 5)).await.unwrap();
    assert_eq!(probe.calls(), ["heartbeat"]);
    assert_eq!(store.list_workers().await.unwrap().items.len(), 1);
    assert_eq!(probe.calls(), ["list_workers"]);
    // The store's own conditional removal, not the default's list-then-remove.
    assert!(!store.remove_worker_if(&me, 4).await.unwrap());
    assert!(store.remove_worker_if(&me, 5).await.unwrap());
    assert_eq!(probe.calls(), ["remove_worker_if", "remove_worker_if"]);
    store.remove_worker(&me).await.unwrap();
    assert_eq!(probe.calls(), ["remove_worker"]);

    assert_eq!(store.namespace(), Some(Namespace::new("probe-ns").unwrap()));
    assert_eq!(probe.calls(), ["namespace"]);
    let changes = store.subscribe_changes().await.unwrap().expect("the probe's stream");
    assert_eq!(changes.collect::<Vec<_>>().await.len(), 1);
    assert_eq!(probe.calls(), ["subscribe_changes"]);
}

#[test]
fn calls_are_timed_and_errors_counted_by_operation_and_kind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let inner = MemoryBackend::new().store("instrumented".parse().unwrap());
            let store = InstrumentedStore::new(Arc::new(inner));
            let lease = Lease::new("k", Position::TrimHorizon);
            let CreateOutcome::Created(v1) = store.create_lease(&lease).await.unwrap() else {
                panic!("not created")
            };
            store.list_leases().await.unwrap();
            store.list_leases().await.unwrap();
            // A compare-and-set against a version the record does not have.
            let stale = store.update_lease(&lease, Version::random_other_than(v1)).await;
            assert!(matches!(stale, Err(Error::Conflict { .. })), "{stale:?}");
        })
    });
    let mut timed = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |k: &str| key.labels().find(|l| l.key() == k).map(|l| l.value().to_owned());
        assert_eq!(label("namespace").as_deref(), Some("instrumented"), "{key:?}");
        let op = label("operation").unwrap();
        match (key.name(), value) {
            ("shardlease_store_call_seconds", DebugValue::Histogram(h)) => {
                timed.insert(op, h.len());
            }
            ("shardlease_store_errors_total", DebugValue::Counter(n)) => {
                errors.push((op, label("kind").unwrap(), n));
            }
            other => panic!("unexpected series {other:?}"),
        }
    }
    let expected: std::collections::BTreeMap<String, usize> =
        [("create_lease", 1), ("list_leases", 2), ("update_lease", 1)]
            .into_iter()
            .map(|(k, n)| (k.to_owned(), n))
            .collect();
    assert_eq!(timed, expected);
    assert_eq!(errors, [("update_lease".to_owned(), "conflict".to_owned(), 1)]);
}
