//! Persisting how far a lease has got, fenced by the lease's epoch.
//!
//! The default [`StoreCheckpointer`] keeps positions inside the lease record and writes them with
//! the store's compare-and-set, so a worker that lost its lease (a zombie) can never move a
//! checkpoint. Users who want effectively-once output can implement [`Checkpointer`] on their own
//! database and write the position in the same transaction as their output, checking the epoch.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseKey, LeaseToken, Version, VersionedLease};
use crate::position::Position;
use crate::store::LeaseStore;

/// Persists positions for leases, fenced by the lease's epoch.
///
/// The default [`StoreCheckpointer`] keeps positions inside the lease record and writes them with
/// the store's compare-and-set, so a worker that lost its lease (a zombie) can never move a
/// checkpoint. For effectively-once output, implement this trait on your own database and write
/// the position in the same transaction as the output, checking the epoch of the [`LeaseToken`]
/// (set it with `WorkerBuilder::checkpointer`).
#[async_trait]
pub trait Checkpointer: Send + Sync + Debug {
    /// Records that everything up to `position` is processed. Fails with `Error::LeaseLost` when
    /// `token` is no longer the current owner and epoch, and with `Error::InvalidInput` when the
    /// position would move the checkpoint backwards.
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()>;

    /// The last recorded position, if any.
    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>>;

    /// Whether positions live in the lease record itself: the runtime then resumes a lease from
    /// the record's checkpoint without a [`fetch`](Self::fetch), remembers the positions written
    /// as the record's (and repairs the record to them should the store lose them), and need not
    /// copy `ShardEnd` into the record when a shard finishes. `false` (the default) for positions
    /// kept anywhere else, where `fetch` is the source of truth.
    fn stores_in_lease(&self) -> bool {
        false
    }
}

/// How many times a checkpoint re-reads after a conflict that did not change ownership
/// (a claim written by a peer, say) before giving up with a retryable error.
const MAX_CONFLICT_RETRIES: usize = 16;

/// The default checkpointer: positions live in the lease record, written by compare-and-set.
#[derive(Debug)]
pub struct StoreCheckpointer {
    store: Arc<dyn LeaseStore>,
    cache: Mutex<HashMap<LeaseKey, VersionedLease>>,
}

impl StoreCheckpointer {
    /// A checkpointer writing through `store`.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        StoreCheckpointer { store, cache: Mutex::new(HashMap::new()) }
    }

    fn cached(&self, key: &LeaseKey) -> Option<VersionedLease> {
        self.cache.lock().ok().and_then(|c| c.get(key).cloned())
    }

    fn remember(&self, key: &LeaseKey, value: Option<VersionedLease>) {
        if let Ok(mut c) = self.cache.lock() {
            match value {
                Some(v) => {
                    c.insert(key.clone(), v);
                }
                None => {
                    c.remove(key);
                }
            }
        }
    }

    async fn current(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        if let Some(v) = self.cached(key) {
            return Ok(Some(v));
        }
        let read = self.store.get_lease(key).await?;
        self.remember(key, read.clone());
        Ok(read)
    }
}

#[async_trait]
impl Checkpointer for StoreCheckpointer {
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()> {
        let lost = || Error::LeaseLost { key: token.key.clone(), epoch: token.epoch };
        for _ in 0..MAX_CONFLICT_RETRIES {
            let Some(VersionedLease { lease, version }) = self.current(&token.key).await? else {
                return Err(lost());
            };
            if !token.matches(&lease) {
                return Err(lost());
            }
            if lease.checkpoint.would_regress_to(position) {
                return Err(Error::InvalidInput(format!(
                    "checkpoint of {} would move backwards from {} to {position}",
                    token.key, lease.checkpoint
                )));
            }
            if &lease.checkpoint == position {
                return Ok(());
            }
            let next = Lease { checkpoint: position.clone(), ..lease.clone() };
            match crate::notify::update_lease(&*self.store, &lease, &next, version).await {
                Ok(v) => {
                    self.remember(&token.key, Some(VersionedLease::new(next, v)));
                    return Ok(());
                }
                Err(Error::Conflict { current, .. }) => {
                    let current = current.map(|b| *b);
                    if current.is_none() {
                        self.remember(&token.key, None);
                        return Err(lost());
                    }
                    self.remember(&token.key, current);
                }
                Err(e) => {
                    self.remember(&token.key, None);
                    return Err(e);
                }
            }
        }
        Err(Error::retryable(format!("checkpoint of {} kept conflicting", token.key)))
    }

    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>> {
        let read = self.store.get_lease(key).await?;
        self.remember(key, read.clone());
        Ok(read.map(|v| v.lease.checkpoint))
    }

    fn stores_in_lease(&self) -> bool {
        true
    }
}

impl StoreCheckpointer {
    /// What the runtime just read or wrote of a lease: cached, so the next checkpoint of it needs
    /// no read. (Only the runtime's own default checkpointer gets these hints; they are not part
    /// of [`Checkpointer`].)
    pub(crate) fn observe(&self, lease: &Lease, version: Version) {
        self.remember(&lease.key, Some(VersionedLease::new(lease.clone(), version)));
    }
}
