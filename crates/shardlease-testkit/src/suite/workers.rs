//! The worker-record cases: liveness is judged from heartbeat records, so an upsert must replace
//! (never duplicate) a worker's record, a clean leave must make it vanish, and removing a dead
//! worker's record must not remove a record its worker refreshed meanwhile.

use shardlease_core::store::{LeaseLoad, WorkerRecord, MAX_PUBLISHED_LEASE_LOADS};
use shardlease_core::WorkerId;

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
        first.changes = 5;
        ok(store.heartbeat(&first).await, "first heartbeat");
        let listing = ok(store.list_workers().await, "list after the first heartbeat");
        assert_eq!(listing.items, [first.clone()], "the heartbeat record reads back exactly");
        assert!(listing.corrupt.is_empty(), "nothing corrupt: {:?}", listing.corrupt);

        let mut second = first.clone();
        second.beat = 2;
        second.updated_at_millis += 2_000;
        second.lease_count = 4;
        second.load = None;
        // Peers list the leases again when this changes, so it must read back exactly, even
        // when it goes down (a new process under the same id starts again from 0).
        second.changes = 0;
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

/// `remove_worker_if` removes a worker record only while its beat is the one given: with a stale
/// beat (the worker heartbeat since, so it is alive) it returns `Ok(false)` and the record is
/// still listed, unchanged; with the current beat it returns `Ok(true)` and the record is gone
/// (other workers stay); for a missing record it returns `Ok(false)`.
pub async fn remove_worker_if_checks_the_beat(factory: &dyn StoreFactory) {
    with_scope(factory, "remove_worker_if_checks_the_beat", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let dead = WorkerId::from("worker-judged-dead");
        let other = WorkerRecord::new(WorkerId::from("worker-other"), 9);
        ok(store.heartbeat(&WorkerRecord::new(dead.clone(), 41)).await, "first heartbeat");
        let mut alive = WorkerRecord::new(dead.clone(), 42);
        alive.lease_count = 2;
        ok(store.heartbeat(&alive).await, "a later heartbeat");
        ok(store.heartbeat(&other).await, "heartbeat of another worker");

        let removed = ok(store.remove_worker_if(&dead, 41).await, "remove_worker_if, stale beat");
        assert!(!removed, "remove_worker_if with a stale beat must return false");
        let mut listed = ok(store.list_workers().await, "list after a stale removal").items;
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(
            listed,
            [alive.clone(), other.clone()],
            "a record whose beat moved on must not be removed"
        );

        let removed = ok(store.remove_worker_if(&dead, 42).await, "remove_worker_if, same beat");
        assert!(removed, "remove_worker_if with the record's beat must return true");
        let listed = ok(store.list_workers().await, "list after the removal").items;
        assert_eq!(listed, std::slice::from_ref(&other), "the record is gone, the other stays");

        let removed = ok(store.remove_worker_if(&dead, 42).await, "remove_worker_if, missing");
        assert!(!removed, "remove_worker_if of a missing record must return false");
        let never = WorkerId::from("never-seen");
        let removed = ok(store.remove_worker_if(&never, 0).await, "remove_worker_if, never seen");
        assert!(!removed, "remove_worker_if of a worker never seen must return false");
        let listed = ok(store.list_workers().await, "list at the end").items;
        assert_eq!(listed, [other], "removing missing records changes nothing");
    })
    .await;
}

/// A heartbeat never moves a worker record's beat backwards within one process: with beat
/// `b + 2` stored, a late write of beat `b + 1` of the same process (same `beat >> 24`) returns
/// `Ok` and leaves the record exactly as it was; so does the same beat written again. A record of
/// another process under the same id (a restart draws a new random base, here a lower one, so its
/// beat is numerically smaller) replaces it, and so does the first beat of the next base up.
pub async fn a_heartbeat_never_moves_the_beat_back(factory: &dyn StoreFactory) {
    with_scope(factory, "a_heartbeat_never_moves_the_beat_back", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let id = WorkerId::from("worker-late-write");
        let base: u64 = 0x40 << 24;
        let other = WorkerRecord::new(WorkerId::from("worker-bystander"), base + 9);
        ok(store.heartbeat(&other).await, "heartbeat of another worker");

        let mut newer = WorkerRecord::new(id.clone(), base + 2);
        newer.lease_count = 2;
        newer.changes = 20;
        ok(store.heartbeat(&newer).await, "heartbeat at beat b + 2");
        let mut late = WorkerRecord::new(id.clone(), base + 1);
        late.lease_count = 1;
        late.changes = 10;
        late.updated_at_millis = newer.updated_at_millis.saturating_sub(1_000);
        ok(store.heartbeat(&late).await, "a late heartbeat at beat b + 1 is not an error");
        let mut again = newer.clone();
        again.lease_count = 3;
        ok(store.heartbeat(&again).await, "beat b + 2 written again is not an error");
        let mut listed = ok(scope.store(&ns).await.list_workers().await, "list workers").items;
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(
            listed,
            [other.clone(), newer.clone()],
            "a heartbeat must never replace a record of the same process (same beat >> 24) \
             whose beat is greater or equal: beat b + 2 must stay"
        );

        let restarted = WorkerRecord::new(id.clone(), (0x10 << 24) + 1);
        ok(store.heartbeat(&restarted).await, "heartbeat of a process restarted under the id");
        let mut listed = ok(store.list_workers().await, "list after the restart").items;
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(
            listed,
            [other.clone(), restarted.clone()],
            "a record of another process (another beat >> 24) is always replaced, whatever its beat"
        );

        let top = WorkerRecord::last_beat_of_process(restarted.beat);
        ok(store.heartbeat(&WorkerRecord::new(id.clone(), top)).await, "last beat of a process");
        let next = WorkerRecord::new(id.clone(), top + 1);
        ok(store.heartbeat(&next).await, "first beat of the next base");
        let mut listed = ok(store.list_workers().await, "list at the end").items;
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(listed, [other, next], "the next base up is another process too");
    })
    .await;
}

/// A heartbeat keeps the worker's published lease loads: with a total `load` and
/// [`MAX_PUBLISHED_LEASE_LOADS`] lease loads (keys with spaces and slashes, loads from 0 to a few,
/// 1.5e-7 among them), the listed record has the same keys in the same order (not sorted by key
/// or by load: as written) and loads equal within 1e-5 relative (stores may keep them as
/// text with fewer digits), every other field exactly; a later heartbeat with no lease loads
/// lists back none. A worker that publishes none is listed with none.
pub async fn worker_records_keep_lease_loads(factory: &dyn StoreFactory) {
    with_scope(factory, "worker_records_keep_lease_loads", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let loads = [
            3.75,
            2.0,
            1.0,
            0.875,
            0.5,
            1.0 / 3.0,
            0.25,
            0.125,
            0.1,
            0.0625,
            0.01,
            1e-3,
            1.234_567_89e-4,
            1e-6,
            1.5e-7,
            0.0,
        ];
        assert_eq!(loads.len(), MAX_PUBLISHED_LEASE_LOADS);
        let lease_loads: Vec<LeaseLoad> = loads
            .iter()
            .enumerate()
            .map(|(i, &load)| {
                // Keys out of key order (7 * i mod 16 is a permutation), with spaces and slashes.
                let key =
                    format!("stream {}/shardId-0000000000{:02} part a/b", i % 3, (i * 7) % 16);
                LeaseLoad::new(key, load)
            })
            .collect();
        let id = WorkerId::from("worker-with-loads");
        let mut first = WorkerRecord::new(id.clone(), (0x21 << 24) + 1);
        first.lease_count = 20;
        first.load = Some(loads.iter().sum::<f64>() + 0.5);
        first.capacity = Some(40);
        first.changes = 3;
        first.lease_loads = lease_loads.clone();
        let quiet = WorkerRecord::new(WorkerId::from("worker-without-loads"), 5);
        ok(store.heartbeat(&quiet).await, "heartbeat of a worker without lease loads");
        ok(store.heartbeat(&first).await, "heartbeat with 16 lease loads");

        let listing = ok(scope.store(&ns).await.list_workers().await, "list the workers");
        assert!(listing.corrupt.is_empty(), "nothing corrupt: {:?}", listing.corrupt);
        let listed = |id: &WorkerId| {
            listing
                .items
                .iter()
                .find(|w| &w.id == id)
                .unwrap_or_else(|| panic!("worker {id} is not listed: {listing:?}"))
                .clone()
        };
        assert_eq!(listed(&quiet.id), quiet, "a worker without lease loads reads back exactly");
        let back = listed(&id);
        let keys = |l: &[LeaseLoad]| l.iter().map(|l| l.key.clone()).collect::<Vec<_>>();
        assert_eq!(
            keys(&back.lease_loads),
            keys(&lease_loads),
            "the lease loads list back with the same keys, in the order written"
        );
        for (written, read) in lease_loads.iter().zip(&back.lease_loads) {
            let tolerance = written.load.abs() * 1e-5;
            assert!(
                (written.load - read.load).abs() <= tolerance,
                "lease {}: load {} written, {} read back (more than 1e-5 relative apart)",
                written.key,
                written.load,
                read.load
            );
        }
        let mut rest = back.clone();
        rest.lease_loads = first.lease_loads.clone();
        assert_eq!(rest, first, "every other field of the record reads back exactly");

        let mut second = first.clone();
        second.beat += 1;
        second.updated_at_millis += 1_000;
        second.lease_loads = Vec::new();
        ok(store.heartbeat(&second).await, "heartbeat with no lease loads");
        let listing = ok(store.list_workers().await, "list after a heartbeat without loads");
        let back = listing.items.iter().find(|w| w.id == id);
        assert_eq!(
            back,
            Some(&second),
            "a heartbeat with no lease loads replaces the published ones with none"
        );
    })
    .await;
}
