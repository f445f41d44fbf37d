//! A store wrapper that checks the fencing invariants on every accepted write: a checkpoint only
//! moves when its writer owns the lease at the same epoch, never moves backwards, and an epoch
//! never goes down. Violations are collected in an [`AuditLog`] the test asserts empty.
//!
//! It reads the record before each update, so it is exact only over a store whose calls do not
//! interleave between that read and the write: the in-memory store on a current-thread runtime,
//! which is what simulations use.

use shardlease_core::store::VersionedLease;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::INCARNATION_SEPARATOR;
use shardlease_core::{Result, WorkerId};

/// Violations found by [`AuditStore`] views.
#[derive(Clone, Debug, Default)]
pub struct AuditLog(Arc<Mutex<Vec<String>>>);

impl AuditLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every violation so far.
    pub fn violations(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn push(&self, v: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(v);
    }
}

/// One worker's audited view of a store.
#[derive(Debug, Clone)]
pub struct AuditStore {
    inner: Arc<dyn LeaseStore>,
    writer: Option<WorkerId>,
    log: AuditLog,
}

impl AuditStore {
    /// Audits writes made through this view by `writer`.
    pub fn new(inner: Arc<dyn LeaseStore>, writer: Option<WorkerId>, log: AuditLog) -> Self {
        AuditStore { inner, writer, log }
    }

    fn check(&self, prev: &Lease, next: &Lease) {
        let who = self.writer.as_ref().map(|w| w.as_str()).unwrap_or("<no worker>");
        if next.epoch < prev.epoch {
            self.log.push(format!(
                "{who} moved the epoch of {} back: {} → {}",
                prev.key, prev.epoch, next.epoch
            ));
        }
        if next.owner != prev.owner && next.epoch == prev.epoch {
            self.log.push(format!("{who} changed the owner of {} without a new epoch", prev.key));
        }
        if next.checkpoint != prev.checkpoint {
            // A worker that fenced itself comes back as `<id>#<suffix>`: the same writer.
            let same_writer = match (&prev.owner, &self.writer) {
                (Some(o), Some(w)) => {
                    o == w
                        || o.as_str()
                            .strip_prefix(w.as_str())
                            .is_some_and(|rest| rest.starts_with(INCARNATION_SEPARATOR))
                }
                _ => false,
            };
            let owner_ok = same_writer && next.owner == prev.owner && next.epoch == prev.epoch;
            // A worker restoring a lease the store lost or rolled back writes the checkpoint it
            // remembers (forward only: the check below) under an epoch above the regressed
            // record's, to whichever owner it restores it to. A zombie's checkpoint never bumps
            // the epoch, so it is still caught.
            let restore = next.epoch > prev.epoch;
            if !owner_ok && !restore {
                self.log.push(format!(
                    "{who} moved the checkpoint of {} ({} → {}) without owning it (owner {:?}, epoch {} → {})",
                    prev.key, prev.checkpoint, next.checkpoint, prev.owner, prev.epoch, next.epoch
                ));
            }
            if prev.checkpoint.would_regress_to(&next.checkpoint) {
                self.log.push(format!(
                    "{who} moved the checkpoint of {} backwards: {} → {}",
                    prev.key, prev.checkpoint, next.checkpoint
                ));
            }
        }
    }
}

#[async_trait]
impl shardlease_core::store::StoreDecorator for AuditStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.audited(lease, expected, false).await
    }

    /// Audited as an update, passed on as quiet.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.audited(lease, expected, true).await
    }
}

impl AuditStore {
    /// The update, checked against the record it replaced.
    async fn audited(&self, lease: &Lease, expected: Version, quiet: bool) -> Result<Version> {
        let prev = self.inner.get_lease(&lease.key).await.ok().flatten();
        let v = if quiet {
            self.inner.update_lease_quietly(lease, expected).await?
        } else {
            self.inner.update_lease(lease, expected).await?
        };
        if let Some(VersionedLease { lease: prev, version: pv }) = prev {
            if pv == expected {
                self.check(&prev, lease);
            }
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use shardlease_core::store::{MemoryStore, WorkerRecord};

    use super::*;

    #[tokio::test]
    async fn conditional_removal_and_namespace_are_forwarded() {
        let inner: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let store = AuditStore::new(inner.clone(), None, AuditLog::new());
        assert_eq!(store.namespace().map(|n| n.to_string()).as_deref(), Some("default"));
        store.heartbeat(&WorkerRecord::new("w".into(), 2)).await.unwrap();
        assert!(!store.remove_worker_if(&"w".into(), 1).await.unwrap());
        assert!(store.remove_worker_if(&"w".into(), 2).await.unwrap());
        assert!(inner.list_workers().await.unwrap().items.is_empty());
    }
}
