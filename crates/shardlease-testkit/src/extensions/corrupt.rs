//! Corrupt records, once for every store: a record that does not decode is `Error::Corrupt` /
//! `Listing::corrupt` for that record only; nothing panics, and every other lease and worker
//! keeps working, for the store and for a running worker.
//!
//! The store's test says how to damage a record of its own ([`CorruptRecords`]: a raw `HSET`, an
//! etcd `put`, a DynamoDB `UpdateItem`, an SQL `UPDATE`) and which damage it knows
//! ([`Corruption`]); the assertions live here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{CreateOutcome, Lease, Version, VersionedLease, WorkerRecord};
use shardlease_core::{
    Config, Error, LeaseKey, MemorySource, Position, Result, ShardSource, WorkerId,
};

use crate::cluster::{wait_until, Cluster};
use crate::recorder::Recorder;
use crate::suite::{with_scope, StoreFactory};

/// One kind of damage a store's hook can do to one record.
#[derive(Clone, Copy, Debug)]
pub struct Corruption {
    /// The name of the damage, which tells the hook what to do; the per-record cases also use it
    /// as the key (or worker id) of the damaged record.
    pub name: &'static str,
    /// A word the `Corrupt` reason must contain, in a read and in a listing (`""`: any).
    pub reason: &'static str,
    /// Whether the record can be repaired in place: a lease by a compare-and-set at the version
    /// it was created with (the damage left the version alone), a worker by a heartbeat.
    pub repairable: bool,
    /// For a worker record: whether the damage left the beat readable, so that a conditional
    /// removal can still compare it (and may remove the record). Not checked then.
    pub beat_intact: bool,
}

impl Corruption {
    /// Damage called `name` whose reason mentions `reason`; not repairable in place.
    pub const fn new(name: &'static str, reason: &'static str) -> Self {
        Corruption { name, reason, repairable: false, beat_intact: false }
    }

    /// The same damage, repairable in place (see [`Corruption::repairable`]).
    pub const fn repairable(self) -> Self {
        Corruption { repairable: true, ..self }
    }

    /// The same damage to a worker record, leaving its beat readable (see
    /// [`Corruption::beat_intact`]).
    pub const fn beat_intact(self) -> Self {
        Corruption { beat_intact: true, ..self }
    }
}

/// The hooks a store's test implements to run the corrupt-record cases: which damage it knows,
/// and how to do it with raw access to its backend.
#[async_trait]
pub trait CorruptRecords: StoreFactory {
    /// The lease damage the store knows (at least one).
    fn lease_corruptions(&self) -> Vec<Corruption>;

    /// The worker-record damage the store knows (at least one).
    fn worker_corruptions(&self) -> Vec<Corruption>;

    /// Does `damage` to the lease `key` of `namespace`, which the case created through the store
    /// (the hook may replace it whole, say with a value of another type).
    async fn corrupt_lease(
        &self,
        namespace: &str,
        key: &LeaseKey,
        damage: &Corruption,
    ) -> Result<()>;

    /// Does `damage` to the worker record `id` of `namespace`, which the case wrote with a
    /// heartbeat of beat 1 (the hook may replace it whole).
    async fn corrupt_worker(
        &self,
        namespace: &str,
        id: &WorkerId,
        damage: &Corruption,
    ) -> Result<()>;
}

/// The reason of the `Error::Corrupt` for `key` that `r` must be.
fn corrupt_reason<T: std::fmt::Debug>(r: Result<T>, key: &str, what: &str) -> String {
    match r {
        Err(Error::Corrupt { key: k, reason }) => {
            assert_eq!(k, key, "{what}: the error names the record");
            reason
        }
        other => panic!("{what}: expected Error::Corrupt for {key}, got {other:?}"),
    }
}

fn check_reason(reason: &str, damage: &Corruption, what: &str) {
    assert!(reason.contains(damage.reason), "{what} of {}: {reason:?}", damage.name);
}

fn created(o: CreateOutcome) -> Version {
    match o {
        CreateOutcome::Created(v) => v,
        CreateOutcome::AlreadyExists => panic!("expected Created"),
    }
}

/// Damaged leases are `Corrupt` for their key only: in a read, in a listing (across pages when
/// the factory's stores page small), in a compare-and-set or delete at a stale version (which
/// write nothing), and a create never overwrites them. The good leases keep working, and a
/// repairable record is repaired by a compare-and-set at the version it was created with.
pub async fn corrupt_leases_are_reported_per_record(f: &dyn CorruptRecords) {
    let damage = f.lease_corruptions();
    assert!(!damage.is_empty(), "a store knows at least one kind of damage");
    with_scope(f, "corrupt_leases", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let good = ["good-1", "good-2", "good-3"];
        let mut versions = BTreeMap::new();
        for k in good.iter().copied().chain(damage.iter().map(|d| d.name)) {
            let v = created(
                store.create_lease(&Lease::new(k, Position::sequence(7u64))).await.unwrap(),
            );
            versions.insert(k, v);
        }
        for d in &damage {
            let key = LeaseKey::from(d.name);
            f.corrupt_lease(&ns, &key, d).await.unwrap_or_else(|e| panic!("damaging {key}: {e}"));
        }

        let listing = store.list_leases().await.unwrap();
        let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        assert_eq!(items, good, "only the good leases decode");
        let listed: BTreeMap<&str, &str> =
            listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
        let mut want: Vec<&str> = damage.iter().map(|d| d.name).collect();
        want.sort_unstable();
        assert_eq!(listed.keys().copied().collect::<Vec<_>>(), want, "named by the key exactly");

        let stale = Version(1);
        for d in &damage {
            check_reason(listed[d.name], d, "the listing");
            let key = LeaseKey::from(d.name);
            check_reason(
                &corrupt_reason(store.get_lease(&key).await, d.name, "a read"),
                d,
                "a read",
            );
            let taken = Lease::new(d.name, Position::TrimHorizon).transferred_to(Some("w".into()));
            corrupt_reason(store.update_lease(&taken, stale).await, d.name, "a stale update");
            corrupt_reason(store.delete_lease(&key, stale).await, d.name, "a stale delete");
            assert_eq!(
                store.create_lease(&Lease::new(d.name, Position::TrimHorizon)).await.unwrap(),
                CreateOutcome::AlreadyExists,
                "create never overwrites a record, even a corrupt one ({})",
                d.name
            );
        }

        // The good leases keep working.
        let moved = Lease::new("good-1", Position::TrimHorizon).transferred_to(Some("w".into()));
        let v = store.update_lease(&moved, versions["good-1"]).await.unwrap();
        assert_eq!(
            store.get_lease(&"good-1".into()).await.unwrap(),
            Some(VersionedLease::new(moved, v))
        );
        store.delete_lease(&"good-2".into(), versions["good-2"]).await.unwrap();

        // An operator who knows the version repairs a record with a plain compare-and-set.
        let mut repaired = vec!["good-1", "good-3"];
        for d in damage.iter().filter(|d| d.repairable) {
            let lease = Lease::new(d.name, Position::Latest);
            let v = store.update_lease(&lease, versions[d.name]).await.unwrap();
            assert_eq!(
                store.get_lease(&d.name.into()).await.unwrap(),
                Some(VersionedLease::new(lease, v))
            );
            repaired.push(d.name);
        }
        repaired.sort_unstable();
        let listing = store.list_leases().await.unwrap();
        let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        assert_eq!(items, repaired);
        assert_eq!(listing.corrupt.len(), damage.iter().filter(|d| !d.repairable).count());
    })
    .await;
}

/// Damaged worker records are listed as corrupt, the others as workers; a conditional removal
/// never removes what it cannot compare; a heartbeat repairs a repairable record and
/// `remove_worker` removes any.
pub async fn corrupt_workers_are_reported_per_record(f: &dyn CorruptRecords) {
    let damage = f.worker_corruptions();
    assert!(!damage.is_empty(), "a store knows at least one kind of damage");
    with_scope(f, "corrupt_workers", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        for id in std::iter::once("w-good").chain(damage.iter().map(|d| d.name)) {
            store.heartbeat(&WorkerRecord::new(id.into(), 1)).await.unwrap();
        }
        for d in &damage {
            let id = WorkerId::from(d.name);
            f.corrupt_worker(&ns, &id, d).await.unwrap_or_else(|e| panic!("damaging {id}: {e}"));
        }

        let listing = store.list_workers().await.unwrap();
        let ids: Vec<&str> = listing.items.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["w-good"]);
        let listed: BTreeMap<&str, &str> =
            listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
        assert_eq!(listed.len(), damage.len(), "{listed:?}");
        for d in &damage {
            check_reason(listed[d.name], d, "the listing");
            if d.beat_intact {
                continue;
            }
            let removed = store.remove_worker_if(&WorkerId::from(d.name), 1).await.unwrap();
            assert!(!removed, "{}: a conditional removal of a record it cannot compare", d.name);
        }
        assert_eq!(store.list_workers().await.unwrap().corrupt.len(), damage.len(), "kept");

        // A heartbeat rewrites a repairable record whole; `remove_worker` removes the others.
        let mut ids = vec!["w-good"];
        for d in &damage {
            if d.repairable {
                store.heartbeat(&WorkerRecord::new(d.name.into(), 2)).await.unwrap();
                ids.push(d.name);
            } else {
                store.remove_worker(&WorkerId::from(d.name)).await.unwrap();
            }
        }
        ids.sort_unstable();
        let listing = store.list_workers().await.unwrap();
        let listed: Vec<&str> = listing.items.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(listed, ids);
        assert!(listing.corrupt.is_empty(), "{:?}", listing.corrupt);
    })
    .await;
}

/// A running worker takes and processes every lease around a corrupt one (the first of
/// [`CorruptRecords::lease_corruptions`], done to the first shard's lease), and the corrupt
/// lease stays listed as corrupt.
pub async fn a_worker_processes_the_leases_around_a_corrupt_one(f: &dyn CorruptRecords) {
    let damage = *f.lease_corruptions().first().unwrap_or_else(|| panic!("no lease damage"));
    let scale = f.timing_scale().max(1);
    with_scope(f, "worker_around_corrupt", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let source = MemorySource::new(4);
        for i in 0..100 {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
        let shards = source.shards();
        let bad = shards[0].id.clone();
        let rec = Recorder::new();
        let cfg = Config::new(ns.as_str())
            .unwrap_or_else(|e| panic!("{e}"))
            .with_heartbeat(Duration::from_millis(100) * scale)
            .with_initial_position(Position::TrimHorizon);
        let src: Arc<dyn ShardSource> = Arc::new(source.clone());
        let mut cluster = Cluster::new(store.clone(), src, rec.factory(), cfg);
        cluster.sync_shards().await.unwrap();
        f.corrupt_lease(&ns, &bad, &damage).await.unwrap_or_else(|e| panic!("{e}"));

        let ids = cluster.start_workers(1).unwrap();
        let expected: usize =
            shards.iter().filter(|s| s.id != bad).map(|s| source.records(&s.id).len()).sum();
        wait_until(
            "the other shards' records",
            Duration::from_secs(20) * scale,
            Duration::from_millis(50),
            || async { rec.distinct() == expected },
        )
        .await
        .unwrap();
        let listing = store.list_leases().await.unwrap();
        assert_eq!(listing.corrupt.len(), 1);
        assert_eq!(listing.corrupt[0].key, bad.as_str());
        assert_eq!(listing.items.len(), 3);
        assert!(listing.items.iter().all(|v| v.lease.owner.as_ref() == Some(&ids[0])));
        cluster.shutdown_all().await;
    })
    .await;
}
