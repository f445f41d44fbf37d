//! `--unbatched`: a store wrapper that sends every batch write as single writes.
//!
//! The stores' batch writes (one round trip for many compare-and-sets) are measured against the
//! store contract's default bodies: a [`StoreDecorator`] that overrides nothing but `inner` sends
//! `update_leases` and `create_leases` through its own single writes, which is exactly what a store
//! without a batch does. Everything else reaches the wrapped store unchanged.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease::store::{Lease, LeaseStore, StoreDecorator, Version};
use shardlease::Result;

/// The wrapped store with its batches replaced by the contract's default bodies.
#[derive(Debug)]
pub struct Unbatched(Arc<dyn LeaseStore>);

impl Unbatched {
    /// Wraps `store`.
    pub fn wrap(store: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
        Arc::new(Unbatched(store))
    }
}

#[async_trait]
impl StoreDecorator for Unbatched {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.0
    }
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.0.update_lease_quietly(lease, expected).await
    }
}
