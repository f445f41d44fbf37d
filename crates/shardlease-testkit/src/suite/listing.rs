//! Cases about listing: a list must page through everything exactly once, and a namespace must
//! see only its own records (the classic bug: a key-prefix scan of `app` also matching `app-b`).

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::collections::HashMap;

use futures::stream::{self, StreamExt};
use shardlease_core::store::{Lease, LeaseStore, WorkerRecord};
use shardlease_core::{LeaseKey, Position, WorkerId};

use super::check::{conflict, created, ok};
use super::{with_scope, StoreFactory};

/// How many leases [`list_many_leases`] creates.
pub const LIST_MANY_LEASES_COUNT: usize = 10_000;

/// How many creates [`list_many_leases_n`] keeps in flight.
const CREATE_CONCURRENCY: usize = 64;

/// [`list_many_leases_n`] with [`LIST_MANY_LEASES_COUNT`] (10 000) leases.
pub async fn list_many_leases(factory: &dyn StoreFactory) {
    list_many_leases_n(factory, LIST_MANY_LEASES_COUNT).await;
}

/// Creates `count` leases (64 creates in flight), then checks that one `list_leases` returns each
/// of them exactly once, as created and at its create version, and reports nothing corrupt.
pub async fn list_many_leases_n(factory: &dyn StoreFactory, count: usize) {
    with_scope(factory, "list_many_leases", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let store: &dyn LeaseStore = &*store;
        let mut expected: HashMap<LeaseKey, _> = stream::iter(0..count)
            .map(|i| async move {
                let mut lease =
                    Lease::new(format!("shardId-{i:012}"), Position::sequence(i as u64));
                lease.epoch = Epoch((i % 7) as u64);
                let v = created(store.create_lease(&lease).await, format!("create lease {i}"));
                (lease.key.clone(), (lease, v))
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;

        let listing = ok(store.list_leases().await, format!("list {count} leases"));
        assert!(listing.corrupt.is_empty(), "nothing is corrupt, got {:?}", listing.corrupt);
        let listed = listing.items.len();
        for VersionedLease { lease, version } in listing.items {
            match expected.remove(&lease.key) {
                Some(want) => assert_eq!(
                    (lease, version),
                    want,
                    "a listed lease must equal the lease created, at its version"
                ),
                None => {
                    panic!("list_leases returned {} twice, or a lease never created", lease.key)
                }
            }
        }
        let mut missing: Vec<_> = expected.into_keys().collect();
        missing.sort();
        assert!(
            missing.is_empty(),
            "list_leases returned {listed} items but missed {} of the {count} leases, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    })
    .await;
}

/// Two namespaces (one's name a prefix of the other's) are independent: the same key exists in
/// both with different content and versions, writes and deletes in one never touch the other,
/// and listing leases or workers in one never shows the other's; `remove_worker_if` compares the
/// record of its own namespace; a store that names its namespace (`LeaseStore::namespace`) names
/// the one it was opened on.
pub async fn namespaces_are_isolated(factory: &dyn StoreFactory) {
    with_scope(factory, "namespaces_are_isolated", |scope| async move {
        let (ns_a, a) = scope.fresh_store().await;
        let ns_b = format!("{ns_a}-b");
        let b = scope.store(&ns_b).await;

        let key = LeaseKey::from("shardId-000000000001");
        let mut lease_a = Lease::new(key.clone(), Position::TrimHorizon);
        lease_a.owner = Some(WorkerId::from("worker-a"));
        let mut lease_b = Lease::new(key.clone(), Position::Latest);
        lease_b.owner = Some(WorkerId::from("worker-b"));
        let va = created(a.create_lease(&lease_a).await, format!("create in {ns_a}"));
        let vb = created(b.create_lease(&lease_b).await, format!("create the same key in {ns_b}"));
        let only_a = Lease::new("only-in-a", Position::TrimHorizon);
        created(a.create_lease(&only_a).await, "create a lease only in the first namespace");

        let got = ok(b.get_lease(&only_a.key).await, "get in the other namespace");
        assert_eq!(got, None, "a lease of {ns_a} must not be visible in {ns_b}");
        let got = ok(b.get_lease(&key).await, "get the shared key in the second namespace");
        assert_eq!(
            got,
            Some(VersionedLease::new(lease_b.clone(), vb)),
            "each namespace keeps its own record"
        );

        let moved = lease_a.transferred_to(Some(WorkerId::from("worker-c")));
        let va2 = ok(a.update_lease(&moved, va).await, "update in the first namespace");
        let got = ok(b.get_lease(&key).await, "get in the second after an update in the first");
        assert_eq!(
            got,
            Some(VersionedLease::new(lease_b.clone(), vb)),
            "an update in {ns_a} must not touch {ns_b}"
        );

        ok(b.delete_lease(&key, vb).await, "delete in the second namespace");
        let got = ok(a.get_lease(&key).await, "get in the first after a delete in the second");
        assert_eq!(
            got,
            Some(VersionedLease::new(moved.clone(), va2)),
            "a delete in {ns_b} must not touch {ns_a}"
        );
        conflict(b.delete_lease(&key, va2).await, &key, "delete in the second, first's version");

        let listed_a = ok(a.list_leases().await, "list the first namespace").items;
        let mut keys_a: Vec<_> = listed_a.iter().map(|v| v.lease.key.as_str()).collect();
        keys_a.sort_unstable();
        assert_eq!(keys_a, ["only-in-a", key.as_str()], "{ns_a} lists exactly its own leases");
        let listed_b = ok(b.list_leases().await, "list the second namespace").items;
        assert!(listed_b.is_empty(), "{ns_b} has no leases left, but lists {listed_b:?}");

        ok(a.heartbeat(&WorkerRecord::new(WorkerId::from("worker-a"), 1)).await, "heartbeat");
        ok(b.heartbeat(&WorkerRecord::new(WorkerId::from("worker-b"), 1)).await, "heartbeat");
        ok(b.heartbeat(&WorkerRecord::new(WorkerId::from("worker-a"), 50)).await, "heartbeat");
        let workers_a = ok(a.list_workers().await, "list workers of the first").items;
        assert_eq!(workers_a.len(), 1, "{ns_a} lists only its own worker: {workers_a:?}");
        assert_eq!((workers_a[0].id.as_str(), workers_a[0].beat), ("worker-a", 1));
        let mut workers_b: Vec<_> = ok(b.list_workers().await, "list workers of the second")
            .items
            .into_iter()
            .map(|w| (w.id.to_string(), w.beat))
            .collect();
        workers_b.sort();
        assert_eq!(
            workers_b,
            [("worker-a".to_owned(), 50), ("worker-b".to_owned(), 1)],
            "{ns_b} lists only its own workers"
        );
        let removed = ok(
            b.remove_worker_if(&WorkerId::from("worker-a"), 1).await,
            "remove_worker_if in the second with the first's beat",
        );
        assert!(!removed, "remove_worker_if in {ns_b} must compare {ns_b}'s record, not {ns_a}'s");
        ok(b.remove_worker(&WorkerId::from("worker-a")).await, "remove a worker in the second");
        let workers_a = ok(a.list_workers().await, "list workers of the first again").items;
        assert_eq!(workers_a.len(), 1, "removing a worker in {ns_b} must not touch {ns_a}");

        for (ns, store) in [(&ns_a, &a), (&ns_b, &b)] {
            if let Some(named) = store.namespace() {
                assert_eq!(named.as_str(), ns, "a store that names its namespace names its own");
            }
        }
    })
    .await;
}
