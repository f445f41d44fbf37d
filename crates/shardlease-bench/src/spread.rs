//! `--clients K`: the workers' store calls spread over K clients of the same store.
//!
//! Workers in one process share one store by default, so on Redis or PostgreSQL every call of a
//! thousand workers goes through one client: a heartbeat waits behind every listing queued
//! before it, head-of-line blocking that a fleet of separate processes (each with its own
//! connection) never sees. This wrapper opens nothing itself: it takes K stores already opened
//! and sends each call to the next one in turn; batches and quiet updates go through as they are.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use shardlease::store::{CreateOutcome, Lease, LeaseStore, LeaseUpdate, StoreDecorator, Version};
use shardlease::Result;

/// K stores used in turn.
#[derive(Debug)]
pub struct Spread {
    stores: Vec<Arc<dyn LeaseStore>>,
    next: AtomicUsize,
}

impl Spread {
    /// `first` and `more` in turn; `first` alone when there is no other.
    pub fn wrap(first: Arc<dyn LeaseStore>, more: Vec<Arc<dyn LeaseStore>>) -> Arc<dyn LeaseStore> {
        if more.is_empty() {
            return first;
        }
        let mut stores = vec![first];
        stores.extend(more);
        Arc::new(Spread { stores, next: AtomicUsize::new(0) })
    }
}

#[async_trait]
impl StoreDecorator for Spread {
    fn inner(&self) -> &dyn LeaseStore {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.stores.len();
        &*self.stores[i]
    }
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.inner().update_lease_quietly(lease, expected).await
    }
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        self.inner().update_leases(updates).await
    }
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.inner().create_leases(leases).await
    }
}
