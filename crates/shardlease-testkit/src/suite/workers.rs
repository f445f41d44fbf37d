//! The worker-record case: liveness is judged from heartbeat records, so an upsert must replace
//! (never duplicate) a worker's record and a clean leave must make it vanish.

use shardlease_core::{WorkerId, WorkerRecord};

use super::check::ok;
use super::{with_scope, StoreFactory};

/// A heartbeat upserts the worker's record, every field kept (load, capacity, lease count,
/// timestamp); a second heartbeat replaces it rather than adding one; two workers are both
/// listed; `remove_worker` removes one; removing a missing worker is `Ok`.
pub async fn worker_records(factory: &dyn StoreFactory) {
    with_scope(factory, "worker_records", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let listing = ok(store.list_workers().await, "list workers of an empty namespace");
        assert!(listing.items.is_empty() && listing.corrupt.is_empty(), "{listing:?}");

        let a = WorkerId::from("worker-a.example.com-4242-0000beef");
        let b = WorkerId::from("worker-b");
        let mut first = WorkerRecord::new(a.clone(), 1);
        first.lease_count = 3;
        first.load = Some(0.5);
        first.capacity = Some(10);
        ok(store.heartbeat(&first).await, "first heartbeat");
        let listing = ok(store.list_workers().await, "list after the first heartbeat");
        assert_eq!(listing.items, [first.clone()], "the heartbeat record reads back exactly");
        assert!(listing.corrupt.is_empty(), "nothing corrupt: {:?}", listing.corrupt);

        let mut second = first.clone();
        second.beat = 2;
        second.updated_at_millis += 2_000;
        second.lease_count = 4;
        second.load = None;
        ok(store.heartbeat(&second).await, "second heartbeat");
        let listing = ok(store.list_workers().await, "list after the second heartbeat");
        assert_eq!(listing.items, [second.clone()], "a heartbeat replaces the worker's record");

        let other = WorkerRecord::new(b.clone(), 7);
        ok(store.heartbeat(&other).await, "heartbeat of a second worker");
        let mut listed = ok(scope.store(&ns).await.list_workers().await, "list two workers").items;
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(listed, [second.clone(), other.clone()], "both workers are listed");

        ok(store.remove_worker(&a).await, "remove a worker");
        let listed = ok(store.list_workers().await, "list after remove").items;
        assert_eq!(listed, std::slice::from_ref(&other), "a removed worker is no longer listed");
        ok(store.remove_worker(&a).await, "remove the same worker again");
        ok(store.remove_worker(&WorkerId::from("never-seen")).await, "remove a missing worker");
        let listed = ok(store.list_workers().await, "list after removing missing workers").items;
        assert_eq!(listed, [other], "removing missing workers changes nothing");

        ok(store.heartbeat(&first).await, "heartbeat after remove");
        let listed = ok(store.list_workers().await, "list after rejoining").items;
        assert_eq!(listed.len(), 2, "a removed worker can heartbeat again: {listed:?}");
    })
    .await;
}
