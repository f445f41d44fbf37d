//! The conformance suite's factory over the in-memory store, so the suite itself is tested and
//! the core's simulations can open namespaces the same way backend tests do.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, MemoryBackend, Version};
use shardlease_core::{Namespace, Result};

use crate::suite::StoreFactory;

/// A [`StoreFactory`] over one shared [`MemoryBackend`]: every store it opens lives in that
/// backend, so two stores opened on one namespace see the same data.
#[derive(Clone, Debug, Default)]
pub struct MemoryFactory {
    backend: MemoryBackend,
}

impl MemoryFactory {
    /// A factory over a new, empty backend.
    pub fn new() -> Self {
        MemoryFactory { backend: MemoryBackend::new() }
    }

    /// A factory over an existing backend.
    pub fn with_backend(backend: MemoryBackend) -> Self {
        MemoryFactory { backend }
    }

    /// The backend every store of this factory lives in.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }
}

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.backend.store(Namespace::new(namespace)?)))
    }

    fn name(&self) -> String {
        "memory".to_owned()
    }

    /// Puts the record back with [`MemoryStore::restore_raw`](shardlease_core::store::MemoryStore),
    /// through a new handle on the namespace (it shares the records of `store`).
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
