//! A [`StoreFactory`] from closures, for a store living in process (a map behind a mutex, an
//! embedded database): the few lines a store's author writes to run the conformance suite,
//! without a factory type and its trait impl.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::{Namespace, Result};

use crate::suite::StoreFactory;

type Open = dyn Fn(Namespace) -> Result<Arc<dyn LeaseStore>> + Send + Sync;
type Restore = dyn Fn(Namespace, &Lease, Version) -> Result<()> + Send + Sync;

/// A factory whose stores `open` makes, one per checked namespace; with
/// [`with_restore_raw`](FnFactory::with_restore_raw), the rollback hook too.
///
/// ```text
/// let backend = MyBackend::default();
/// let raw = backend.clone();
/// let factory = FnFactory::new("mine", move |ns| Ok(Arc::new(backend.store(ns)) as _))
///     .with_restore_raw(move |ns, lease, version| Ok(raw.store(ns).restore_raw(lease, version)));
/// shardlease_testkit::store_conformance_tests!(factory());
/// ```
pub struct FnFactory {
    name: String,
    open: Box<Open>,
    restore: Option<Box<Restore>>,
}

impl FnFactory {
    /// A factory called `name` (for messages) opening stores with `open`.
    pub fn new(
        name: impl Into<String>,
        open: impl Fn(Namespace) -> Result<Arc<dyn LeaseStore>> + Send + Sync + 'static,
    ) -> Self {
        FnFactory { name: name.into(), open: Box::new(open), restore: None }
    }

    /// The rollback hook (see [`StoreFactory::restore_raw`]): writes a lease at exactly a
    /// version into a namespace, bypassing compare-and-set.
    pub fn with_restore_raw(
        mut self,
        restore: impl Fn(Namespace, &Lease, Version) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.restore = Some(Box::new(restore));
        self
    }
}

impl std::fmt::Debug for FnFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnFactory").field("name", &self.name).finish_non_exhaustive()
    }
}

#[async_trait]
impl StoreFactory for FnFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        (self.open)(Namespace::new(namespace)?)
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    async fn restore_raw(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        match &self.restore {
            Some(restore) => restore(Namespace::new(namespace)?, lease, version).map(|()| true),
            None => Ok(false),
        }
    }
}
