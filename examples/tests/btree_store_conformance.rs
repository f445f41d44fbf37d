//! The whole conformance suite on the example store of `examples/src/btree_store.rs`: what
//! docs/implementing-a-store.md asks of a store written outside this workspace. The factory is
//! the few lines such a store's author writes; the suite is one macro call.

use std::sync::Arc;

use shardlease::store::LeaseStore;
use shardlease_examples::btree_store::BTreeBackend;
use shardlease_testkit::FnFactory;

/// Opens namespaces of one shared backend, as a factory over a server opens them; the rollback
/// case's hook goes through the store's test-only raw write.
fn factory() -> FnFactory {
    let backend = BTreeBackend::default();
    let raw = backend.clone();
    FnFactory::new("btree (example)", move |ns| {
        Ok(Arc::new(backend.store(ns)) as Arc<dyn LeaseStore>)
    })
    .with_restore_raw(move |ns, lease, version| {
        raw.store(ns).restore_raw(lease, version);
        Ok(())
    })
}

shardlease_testkit::store_conformance_tests!(factory());
