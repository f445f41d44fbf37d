//! Snapshots of one namespace of the in-memory store, so a test or a simulation can roll the store
//! back the way a real one rolls back (a Redis failover to a lagging replica, a database restored
//! from a backup) and check that the lease algorithm stays safe.
//!
//! [`MemoryStore::snapshot`] copies every lease (with its version) and every worker record of the
//! namespace; [`MemoryStore::restore`] puts exactly those records back, versions included, and
//! drops everything written since; [`MemoryStore::wipe`] empties the namespace (a store that lost
//! everything). Versions are random ([`Version::random`](crate::lease::Version::random)), so
//! versions handed out after a restore or a wipe still never equal any handed out before: a
//! writer holding a version from the lost timeline can never win a compare-and-set.

use std::fmt;

use super::store::{MemoryStore, NamespaceState};
use crate::ids::Namespace;

/// Every record of one namespace at one moment: see [`MemoryStore::snapshot`].
///
/// Opaque and cheap enough to clone (a copy of the records). It can be restored any number of
/// times, into the namespace it was taken from or any other.
#[derive(Clone)]
pub struct MemorySnapshot {
    namespace: Namespace,
    state: NamespaceState,
}

impl MemorySnapshot {
    /// The namespace the snapshot was taken of.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// How many leases it holds.
    pub fn lease_count(&self) -> usize {
        self.state.leases.len()
    }

    /// How many worker records it holds.
    pub fn worker_count(&self) -> usize {
        self.state.workers.len()
    }
}

impl fmt::Debug for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySnapshot")
            .field("namespace", &self.namespace)
            .field("leases", &self.lease_count())
            .field("workers", &self.worker_count())
            .finish()
    }
}

impl MemoryStore {
    /// Every lease (with its version) and every worker record of this namespace, as they are now
    /// (one atomic copy).
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot { namespace: self.namespace.clone(), state: self.lock().clone() }
    }

    /// Replaces every record of this namespace with exactly the snapshot's, versions included
    /// (one atomic step): records written since the snapshot are gone, records deleted since are
    /// back. Every handle on the namespace sees the result at once. Writes after a restore get
    /// fresh random versions, which never equal a version handed out before it.
    pub fn restore(&self, snapshot: &MemorySnapshot) {
        *self.lock() = snapshot.state.clone();
    }

    /// Deletes every lease and worker record of this namespace, as a store that lost its data
    /// would (the namespace itself stays open).
    pub fn wipe(&self) {
        *self.lock() = NamespaceState::default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashSet;

    use super::*;
    use crate::error::Error;
    use crate::lease::{Lease, Version, VersionedLease};
    use crate::memory::MemoryBackend;
    use crate::position::Position;
    use crate::store::{CreateOutcome, LeaseStore};
    use crate::worker_record::WorkerRecord;

    fn lease(key: &str) -> Lease {
        Lease::new(key, Position::TrimHorizon)
    }

    async fn create(store: &MemoryStore, key: &str) -> Version {
        match store.create_lease(&lease(key)).await.unwrap() {
            CreateOutcome::Created(v) => v,
            CreateOutcome::AlreadyExists => panic!("{key} already exists"),
        }
    }

    #[tokio::test]
    async fn restore_puts_back_exactly_the_snapshot() {
        let backend = MemoryBackend::new();
        let store = backend.store("app".parse().unwrap());
        let other = backend.store("other".parse().unwrap());
        let va = create(&store, "a").await;
        let vb = create(&store, "b").await;
        store.heartbeat(&WorkerRecord::new("w1".into(), 1)).await.unwrap();
        create(&other, "untouched").await;
        let snap = store.snapshot();
        assert_eq!((snap.lease_count(), snap.worker_count()), (2, 1));
        assert_eq!(snap.namespace().as_str(), "app");
        let before = store.list_leases().await.unwrap().items;

        // Move on: update a, delete b, create c, new worker, new beat.
        let owned = lease("a").transferred_to(Some("w1".into()));
        let va2 = store.update_lease(&owned, va).await.unwrap();
        store.delete_lease(&"b".into(), vb).await.unwrap();
        create(&store, "c").await;
        store.heartbeat(&WorkerRecord::new("w1".into(), 2)).await.unwrap();
        store.heartbeat(&WorkerRecord::new("w2".into(), 1)).await.unwrap();

        // Another handle on the namespace restores; everyone sees the snapshot again.
        backend.store("app".parse().unwrap()).restore(&snap);
        assert_eq!(store.list_leases().await.unwrap().items, before);
        let workers = store.list_workers().await.unwrap().items;
        let beats: Vec<(&str, u64)> = workers.iter().map(|w| (w.id.as_str(), w.beat)).collect();
        assert_eq!(beats, vec![("w1", 1)], "worker records are restored too");
        assert_eq!(other.lease_count(), 1, "other namespaces are untouched");

        // The old timeline's version no longer writes; a write from the snapshot's version gets
        // a version different from every one handed out before.
        assert!(matches!(
            store.update_lease(&owned, va2).await,
            Err(Error::Conflict { current: Some(_), .. })
        ));
        let va3 = store.update_lease(&owned, va).await.unwrap();
        assert!(!HashSet::from([va, vb, va2]).contains(&va3));

        // A snapshot can be restored again, and into another namespace.
        store.restore(&snap);
        assert_eq!(
            store.get_lease(&"a".into()).await.unwrap(),
            Some(VersionedLease::new(lease("a"), va))
        );
        other.restore(&snap);
        assert_eq!(other.list_leases().await.unwrap().items, before);
        let shown = format!("{snap:?}");
        assert_eq!(shown, r#"MemorySnapshot { namespace: "app", leases: 2, workers: 1 }"#);
    }

    #[tokio::test]
    async fn wipe_empties_the_namespace_and_versions_stay_fresh() {
        let store = MemoryStore::new();
        let v1 = create(&store, "a").await;
        store.heartbeat(&WorkerRecord::new("w".into(), 1)).await.unwrap();
        let empty = MemoryStore::new().snapshot();
        store.wipe();
        assert_eq!((store.lease_count(), store.worker_count()), (0, 0));
        let v2 = create(&store, "a").await;
        assert_ne!(v1, v2, "a version handed out before the wipe never comes back");
        store.restore(&empty);
        assert_eq!(store.lease_count(), 0, "restoring an empty snapshot empties the namespace");
    }
}
