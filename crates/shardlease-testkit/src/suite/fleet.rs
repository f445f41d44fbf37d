//! The cases of the operations that keep a large fleet's reads flat: the fleet signal (one small
//! record every worker reads each heartbeat, listing the worker records only when it moved) and
//! the read of a few named worker records (the peers a worker watches). docs/algorithm.md, "A
//! fleet too large to list each heartbeat", says how the runtime uses them.

use shardlease_core::store::{FleetSignal, Version, WorkerRecord};
use shardlease_core::WorkerId;

use super::check::ok;
use super::{with_scope, StoreFactory};

/// The fleet signal reads back the token last written: `Missing` in a fresh namespace, the
/// token after a write, the newer token after another write (an older token written again reads
/// back too: it is a plain put). A second handle on the namespace reads the same token; another
/// namespace's signal is its own. A store that answers `Unsupported` (the trait's default) passes
/// with a line saying so: it is correct, only costlier for a large fleet.
pub async fn the_fleet_signal_round_trips(factory: &dyn StoreFactory) {
    with_scope(factory, "the_fleet_signal_round_trips", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let first = ok(store.read_fleet_signal().await, "read the signal of a fresh namespace");
        if first == FleetSignal::Unsupported {
            // The trait's default, and correct: workers then list every worker record on each
            // heartbeat, which costs reads in a large fleet but loses nothing.
            println!(
                "the_fleet_signal_round_trips: the {} store keeps no fleet signal (the trait's \
                 default): its workers list every worker record each heartbeat",
                scope.factory().name()
            );
            return;
        }
        assert_eq!(first, FleetSignal::Missing, "a fresh namespace holds no signal");

        let a = Version::random();
        let b = Version::random_other_than(a);
        ok(store.write_fleet_signal(a).await, "write a first token");
        let read = ok(store.read_fleet_signal().await, "read after the first write");
        assert_eq!(read, FleetSignal::Token(a), "the signal reads back the token written");
        ok(store.write_fleet_signal(b).await, "write a second token");
        let again = ok(scope.store(&ns).await.read_fleet_signal().await, "read on a new handle");
        assert_eq!(again, FleetSignal::Token(b), "the newest token, on any handle");
        ok(store.write_fleet_signal(a).await, "write the first token again");
        let back = ok(store.read_fleet_signal().await, "read after writing an older token");
        assert_eq!(back, FleetSignal::Token(a), "a write replaces the token, whatever it was");

        // Tokens use the whole range a version can have.
        let max = Version(Version::MAX_RANDOM);
        ok(store.write_fleet_signal(max).await, "write the largest token");
        let read = ok(store.read_fleet_signal().await, "read the largest token");
        assert_eq!(read, FleetSignal::Token(max), "the largest token reads back exactly");

        let (_, other) = scope.fresh_store().await;
        let theirs = ok(other.read_fleet_signal().await, "read another namespace's signal");
        assert_eq!(theirs, FleetSignal::Missing, "namespaces do not share a signal");
        // Worker listings never show the signal, whatever the store keeps it in.
        let workers = ok(store.list_workers().await, "list workers beside a signal");
        assert!(
            workers.items.is_empty() && workers.corrupt.is_empty(),
            "the signal is not a worker record: {workers:?}"
        );
    })
    .await;
}

/// How many workers `get_workers_reads_the_named_records` asks for at once: more than a
/// DynamoDB `BatchGetItem` (100 keys) or a typical statement's chunk, so a store that splits the
/// read must put the pieces together.
pub const MANY_WORKERS: usize = 130;

/// `get_workers` returns exactly the named records that exist, each once, every field as
/// `list_workers` returns it: missing ids are left out, a repeated id gives one record, an empty
/// list gives nothing, and a read of [`MANY_WORKERS`] ids returns them all.
pub async fn get_workers_reads_the_named_records(factory: &dyn StoreFactory) {
    with_scope(factory, "get_workers_reads_the_named_records", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let none = ok(store.get_workers(&[]).await, "get no workers");
        assert!(none.items.is_empty() && none.corrupt.is_empty(), "{none:?}");

        let mut records = Vec::new();
        for i in 0..MANY_WORKERS {
            let mut r = WorkerRecord::new(WorkerId::from(format!("worker-{i:03}")), 7 + i as u64);
            r.lease_count = i as u32;
            r.changes = 3 * i as u64;
            if i % 2 == 0 {
                r.capacity = Some(50);
                r.load = Some(0.25 * i as f64);
            }
            ok(store.heartbeat(&r).await, "heartbeat");
            records.push(r);
        }
        let listed = ok(store.list_workers().await, "list every worker").items;
        let find = |id: &WorkerId| listed.iter().find(|w| &w.id == id).cloned();

        let ids = [
            records[3].id.clone(),
            WorkerId::from("worker-never-seen"),
            records[0].id.clone(),
            records[3].id.clone(),
        ];
        let mut got = ok(store.get_workers(&ids).await, "get three named workers").items;
        got.sort_by(|x, y| x.id.cmp(&y.id));
        let want: Vec<_> = [&records[0].id, &records[3].id].into_iter().filter_map(find).collect();
        assert_eq!(want.len(), 2, "the heartbeats were listed");
        assert_eq!(got, want, "exactly the named records that exist, each once, as listed");

        let missing = [WorkerId::from("worker-gone")];
        let got = ok(store.get_workers(&missing).await, "get a missing worker");
        assert!(got.items.is_empty() && got.corrupt.is_empty(), "nothing: {got:?}");

        let all: Vec<WorkerId> = records.iter().map(|r| r.id.clone()).collect();
        let mut got = ok(store.get_workers(&all).await, "get many workers").items;
        got.sort_by(|x, y| x.id.cmp(&y.id));
        let mut listed = listed.clone();
        listed.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(got.len(), MANY_WORKERS, "every named record is read");
        assert_eq!(got, listed, "the records read equal the listing's");

        ok(store.remove_worker(&records[5].id).await, "remove one worker");
        let got = ok(store.get_workers(&all[..10]).await, "get after a removal").items;
        assert_eq!(got.len(), 9, "a removed record is not read: {got:?}");
    })
    .await;
}
