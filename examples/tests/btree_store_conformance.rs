//! The whole conformance suite on the example store of `examples/src/btree_store.rs`: what
//! docs/implementing-a-store.md asks of a store written outside this workspace. The factory is
//! the few lines such a store's author writes; the suite is one macro call.

use std::sync::Arc;

use shardlease::{async_trait, Lease, LeaseStore, Namespace, Result, Version};
use shardlease_examples::btree_store::BTreeBackend;
use shardlease_testkit::StoreFactory;

/// Opens namespaces of one shared backend, as a factory over a server opens them.
#[derive(Default)]
struct BTreeFactory {
    backend: BTreeBackend,
}

#[async_trait]
impl StoreFactory for BTreeFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.backend.store(Namespace::new(namespace)?)))
    }

    fn name(&self) -> String {
        "btree (example)".to_owned()
    }

    /// The rollback case's hook, through the store's test-only raw write.
    async fn restore_raw(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        self.backend.store(Namespace::new(namespace)?).restore_raw(lease, version);
        Ok(true)
    }
}

shardlease_testkit::store_conformance_tests!(BTreeFactory::default());
