//! Cases about compare-and-set: the one primitive all fencing rests on. A write with a stale
//! version must fail and say what the record is now; versions must never repeat for a key (no
//! ABA, even across delete and re-create); and concurrent read-modify-CAS loops lose nothing.

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::collections::HashSet;
use std::sync::Arc;

use shardlease_core::store::{Lease, Version};
use shardlease_core::{Error, LeaseKey, Position, WorkerId};
use tokio::sync::Barrier;

use super::check::{conflict, created, join_tasks, ok};
use super::{with_scope, StoreFactory};

/// Update with the current version succeeds with a new version, which `get` then returns with
/// the new content; update with a stale version fails with `Error::Conflict` whose `current` is
/// the latest record and version, and writes nothing; update of a missing key fails with
/// `Error::Conflict` and `current: None`.
pub async fn update_is_compare_and_set(factory: &dyn StoreFactory) {
    with_scope(factory, "update_is_compare_and_set", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let lease = Lease::new("shardId-000000000001", Position::TrimHorizon);
        let v0 = created(store.create_lease(&lease).await, "create");

        let mut l1 = lease.transferred_to(Some(WorkerId::from("worker-a")));
        l1.checkpoint = Position::sequence(100u64);
        let v1 = ok(store.update_lease(&l1, v0).await, "update at the current version");
        assert_ne!(v1, v0, "a successful update must return a new version");
        let got = ok(store.get_lease(&lease.key).await, "get after update");
        assert_eq!(
            got,
            Some(VersionedLease::new(l1.clone(), v1)),
            "get must return the updated lease and version"
        );

        let mut stale = l1.transferred_to(Some(WorkerId::from("zombie")));
        stale.checkpoint = Position::sequence(5u64);
        let current = conflict(
            store.update_lease(&stale, v0).await,
            &lease.key,
            "update with a stale version",
        );
        assert_eq!(
            current,
            Some(VersionedLease::new(l1.clone(), v1)),
            "Error::Conflict of a stale update must carry the current lease and version"
        );
        let got = ok(store.get_lease(&lease.key).await, "get after a stale update");
        assert_eq!(
            got,
            Some(VersionedLease::new(l1.clone(), v1)),
            "a stale update must not write anything"
        );

        let mut l2 = l1.clone();
        l2.checkpoint = Position::sequence(200u64);
        let v2 = ok(store.update_lease(&l2, v1).await, "second update");
        assert!(v2 != v0 && v2 != v1, "versions must not repeat: {v0:?}, {v1:?}, {v2:?}");
        let current = conflict(
            store.update_lease(&stale, v1).await,
            &lease.key,
            "update with the previous version",
        );
        assert_eq!(
            current,
            Some(VersionedLease::new(l2.clone(), v2)),
            "Error::Conflict must carry the latest"
        );

        let missing = Lease::new("shardId-999999999999", Position::Latest);
        for v in [v0, v1, v2] {
            let current = conflict(
                store.update_lease(&missing, v).await,
                &missing.key,
                "update of a missing key",
            );
            assert_eq!(current, None, "updating a missing key: Conflict with current None");
        }
        let got = ok(store.get_lease(&missing.key).await, "get after updating a missing key");
        assert_eq!(got, None, "updating a missing key must not create it");
    })
    .await;
}

/// Delete with a stale version fails with `Error::Conflict` and keeps the record; with the
/// current version it removes it (from `get` and `list`); a re-created record gets a version
/// different from every earlier one, so old versions can neither update nor delete it (no ABA);
/// deleting a missing key fails with `Error::Conflict`.
pub async fn delete_is_compare_and_set(factory: &dyn StoreFactory) {
    with_scope(factory, "delete_is_compare_and_set", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let lease = Lease::new("shardId-000000000001", Position::TrimHorizon);
        let key = lease.key.clone();
        let v0 = created(store.create_lease(&lease).await, "create");
        let l1 = lease.transferred_to(Some(WorkerId::from("worker-a")));
        let v1 = ok(store.update_lease(&l1, v0).await, "update");

        let current = conflict(store.delete_lease(&key, v0).await, &key, "delete, stale version");
        if let Some(current) = current {
            assert_eq!(
                current,
                VersionedLease::new(l1.clone(), v1),
                "Error::Conflict must carry the current record"
            );
        }
        let got = ok(store.get_lease(&key).await, "get after a stale delete");
        assert_eq!(
            got,
            Some(VersionedLease::new(l1.clone(), v1)),
            "a stale delete must leave the record alone"
        );

        ok(store.delete_lease(&key, v1).await, "delete at the current version");
        assert_eq!(ok(store.get_lease(&key).await, "get after delete"), None, "deleted");
        let listing = ok(store.list_leases().await, "list after delete");
        assert!(
            listing.items.iter().all(|v| v.lease.key != key),
            "a deleted lease must not be listed"
        );

        let current = conflict(store.delete_lease(&key, v1).await, &key, "delete a missing key");
        assert_eq!(current, None, "deleting a missing key: Conflict with current None");

        let mut earlier: HashSet<Version> = HashSet::from([v0, v1]);
        let mut reborn = Lease::new(key.clone(), Position::Latest);
        for round in 0..3 {
            reborn.epoch = Epoch(round);
            let v = created(store.create_lease(&reborn).await, "re-create after delete");
            assert!(
                !earlier.contains(&v),
                "re-created record got version {v:?}, already used by an earlier incarnation \
                 ({earlier:?}): a zombie holding the old version could overwrite it (ABA)"
            );
            for old in earlier.iter().copied() {
                let moved = reborn.transferred_to(Some(WorkerId::from("zombie")));
                conflict(store.update_lease(&moved, old).await, &key, "update, old incarnation");
                conflict(store.delete_lease(&key, old).await, &key, "delete, old incarnation");
            }
            let got = ok(store.get_lease(&key).await, "get the re-created record");
            assert_eq!(
                got,
                Some(VersionedLease::new(reborn.clone(), v)),
                "old versions must not touch the record"
            );
            earlier.insert(v);
            let moved = reborn.transferred_to(Some(WorkerId::from("worker-b")));
            let v2 = ok(store.update_lease(&moved, v).await, "update the re-created record");
            assert!(
                !earlier.contains(&v2),
                "update of a re-created record returned version {v2:?}, already used ({earlier:?})"
            );
            ok(store.delete_lease(&key, v2).await, "delete the re-created record");
            earlier.insert(v2);
        }
    })
    .await;
}

/// Tasks running concurrently in read-modify-CAS loops (retrying a `Conflict` from the record
/// it carries).
const INCREMENT_TASKS: u64 = 8;
/// Increments each task makes.
const INCREMENTS_PER_TASK: u64 = 25;

/// 8 tasks, started together, each increment the lease's `epoch` 25 times by read-modify-CAS
/// (yielding between read and write so the writes race), retrying each `Conflict` from the
/// `current` record it carries: the final epoch is exactly 200, so no increment was lost or
/// applied twice.
pub async fn concurrent_increments(factory: &dyn StoreFactory) {
    with_scope(factory, "concurrent_increments", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let key = LeaseKey::from("shardId-000000000001");
        created(
            store.create_lease(&Lease::new(key.clone(), Position::TrimHorizon)).await,
            "create",
        );

        let barrier = Arc::new(Barrier::new(INCREMENT_TASKS as usize));
        let mut tasks = Vec::new();
        for task in 0..INCREMENT_TASKS {
            let store = store.clone();
            let key = key.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let mut conflicts = 0u64;
                barrier.wait().await;
                let read = ok(store.get_lease(&key).await, format!("task {task}: get"));
                let VersionedLease { mut lease, mut version } =
                    read.unwrap_or_else(|| panic!("task {task}: the lease vanished"));
                for i in 0..INCREMENTS_PER_TASK {
                    loop {
                        let mut next = lease.clone();
                        next.epoch = next.epoch.next();
                        // Let the others read the same version too, so the CAS really races.
                        tokio::task::yield_now().await;
                        match store.update_lease(&next, version).await {
                            Ok(v) => {
                                (lease, version) = (next, v);
                                break;
                            }
                            Err(Error::Conflict { current: Some(current), .. }) => {
                                conflicts += 1;
                                VersionedLease { lease, version } = *current;
                            }
                            Err(e) => panic!(
                                "task {task}, increment {i}: expected success or a Conflict \
                                 carrying the current record, got {e} ({e:?})"
                            ),
                        }
                    }
                }
                conflicts
            }));
        }
        let conflicts: u64 = join_tasks(tasks).await.into_iter().sum();
        let VersionedLease { lease, .. } = ok(store.get_lease(&key).await, "final get")
            .unwrap_or_else(|| panic!("the lease vanished"));
        assert_eq!(
            lease.epoch.get(),
            INCREMENT_TASKS * INCREMENTS_PER_TASK,
            "{INCREMENT_TASKS} tasks x {INCREMENTS_PER_TASK} CAS increments ({conflicts} \
             conflicts retried) must give exactly their product"
        );
    })
    .await;
}
