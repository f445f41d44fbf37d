//! The conformance suite's factory over the in-memory store, so the suite itself is tested and
//! the core's simulations can open namespaces the same way backend tests do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, MemoryBackend, Version};
use shardlease_core::{Namespace, Result};

use crate::notifying::Notifier;
use crate::suite::StoreFactory;

/// A [`StoreFactory`] over one shared [`MemoryBackend`]: every store it opens lives in that
/// backend, so two stores opened on one namespace see the same data.
/// With [`MemoryFactory::with_notifications`], each namespace's stores announce their writes
/// through one [`Notifier`] of that namespace.
#[derive(Clone, Debug, Default)]
pub struct MemoryFactory {
    backend: MemoryBackend,
    notifiers: Option<Arc<Mutex<HashMap<String, Notifier>>>>,
}

impl MemoryFactory {
    /// A factory over a new, empty backend.
    pub fn new() -> Self {
        MemoryFactory { backend: MemoryBackend::new(), notifiers: None }
    }

    /// A factory over an existing backend.
    pub fn with_backend(backend: MemoryBackend) -> Self {
        MemoryFactory { backend, notifiers: None }
    }

    /// The same factory, its stores announcing changes in process ([`crate::NotifyingStore`]), so
    /// the suite's notification cases run on the in-memory store.
    pub fn with_notifications(self) -> Self {
        MemoryFactory { notifiers: Some(Arc::default()), ..self }
    }

    /// The notifier of `namespace`, when notification is on.
    fn notifier(&self, namespace: &str) -> Option<Notifier> {
        let notifiers = self.notifiers.as_ref()?;
        let mut map = notifiers.lock().unwrap_or_else(|e| e.into_inner());
        let seed = map.len() as u64;
        Some(map.entry(namespace.to_owned()).or_insert_with(|| Notifier::new(seed)).clone())
    }

    /// The backend every store of this factory lives in.
    pub fn backend(&self) -> &MemoryBackend {
        &self.backend
    }
}

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        let store: Arc<dyn LeaseStore> = Arc::new(self.backend.store(Namespace::new(namespace)?));
        Ok(match self.notifier(namespace) {
            Some(notifier) => Arc::new(notifier.wrap(store)),
            None => store,
        })
    }

    fn name(&self) -> String {
        if self.notifiers.is_some() {
            "memory (notifying)".to_owned()
        } else {
            "memory".to_owned()
        }
    }

    /// With notifications: ends the namespace's open streams.
    async fn drop_subscriptions(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
    ) -> Result<bool> {
        match self.notifier(namespace) {
            Some(notifier) => {
                notifier.drop_subscriptions();
                Ok(true)
            }
            None => Ok(false),
        }
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
