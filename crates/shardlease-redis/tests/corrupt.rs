//! Records that do not decode (a garbled or missing field, a value that is not text, a key of
//! the wrong type) are reported as `Error::Corrupt` / `Listing::corrupt` for that record only:
//! nothing panics, and every other lease and worker keeps working, for the store and for a
//! running worker. Runs on the server named by `SHARDLEASE_TEST_REDIS_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::VersionedLease;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use shardlease_core::{
    Config, CreateOutcome, Error, Lease, LeaseKey, LeaseStore, MemorySource, Position, ShardSource,
    Version, WorkerId, WorkerRecord,
};
use shardlease_redis::RedisStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::suite::with_scope;

async fn raw(conn: &mut ConnectionManager, args: &[&[u8]]) {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(conn).await.unwrap();
}

fn created(o: CreateOutcome) -> Version {
    match o {
        CreateOutcome::Created(v) => v,
        CreateOutcome::AlreadyExists => panic!("expected Created"),
    }
}

fn corrupt_reason<T: std::fmt::Debug>(r: shardlease_core::Result<T>, key: &str) -> String {
    match r {
        Err(Error::Corrupt { key: k, reason }) => {
            assert_eq!(k, key);
            reason
        }
        other => panic!("expected Error::Corrupt for {key}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_records_are_reported_per_record() {
    let Some(factory) = common::factory().await else { return };
    let url = factory.url().to_owned();
    with_scope(&factory, "corrupt_records", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        // Small pages, so corrupt entries fall on several pages.
        let store = RedisStore::builder(&url)
            .namespace(&ns)
            .key_prefix(common::TEST_PREFIX)
            .page_size(2)
            .connect()
            .await
            .unwrap();
        let mut conn = store.manager();
        let index = format!("{}:leases", store.key_tag());
        let key = |k: &str| store.lease_redis_key(&LeaseKey::from(k));

        let mut versions = BTreeMap::new();
        for k in ["good-1", "good-2", "good-3", "garbled", "missing", "binary"] {
            let v =
                created(store.create_lease(&Lease::new(k, Position::TrimHorizon)).await.unwrap());
            versions.insert(k, v);
        }
        raw(&mut conn, &[b"HSET", key("garbled").as_bytes(), b"checkpoint", b"{not json"]).await;
        raw(&mut conn, &[b"HDEL", key("missing").as_bytes(), b"epoch"]).await;
        raw(&mut conn, &[b"HSET", key("binary").as_bytes(), b"owner", &[0xff, 0xfe]]).await;
        raw(&mut conn, &[b"SET", key("wrongtype").as_bytes(), b"not a hash"]).await;
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"wrongtype"]).await;
        // An index entry whose hash vanished (a delete racing a listing looks like this).
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"ghost"]).await;

        let listing = store.list_leases().await.unwrap();
        let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        assert_eq!(items, ["good-1", "good-2", "good-3"]);
        let corrupt: BTreeMap<&str, &str> =
            listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
        assert_eq!(
            corrupt.keys().copied().collect::<Vec<_>>(),
            ["binary", "garbled", "missing", "wrongtype"]
        );
        assert!(corrupt["garbled"].contains("checkpoint"), "{corrupt:?}");
        assert!(corrupt["missing"].contains("epoch"), "{corrupt:?}");
        assert!(corrupt["binary"].contains("UTF-8"), "{corrupt:?}");
        assert!(corrupt["wrongtype"].contains("WRONGTYPE"), "{corrupt:?}");

        // Reads and writes of a corrupt record report it; nothing is written.
        assert!(corrupt_reason(store.get_lease(&"garbled".into()).await, "garbled")
            .contains("checkpoint"));
        assert!(
            corrupt_reason(store.get_lease(&"missing".into()).await, "missing").contains("epoch")
        );
        assert!(corrupt_reason(store.get_lease(&"wrongtype".into()).await, "wrongtype")
            .contains("WRONGTYPE"));
        corrupt_reason(store.get_lease(&"binary".into()).await, "binary");
        assert_eq!(store.get_lease(&"ghost".into()).await.unwrap(), None);
        let stale = Version(1);
        let taken = Lease::new("garbled", Position::TrimHorizon).transferred_to(Some("w".into()));
        corrupt_reason(store.update_lease(&taken, stale).await, "garbled");
        let taken = Lease::new("wrongtype", Position::TrimHorizon).transferred_to(Some("w".into()));
        corrupt_reason(store.update_lease(&taken, stale).await, "wrongtype");
        corrupt_reason(store.delete_lease(&"missing".into(), stale).await, "missing");
        corrupt_reason(store.delete_lease(&"wrongtype".into(), stale).await, "wrongtype");
        assert_eq!(
            store.create_lease(&Lease::new("wrongtype", Position::TrimHorizon)).await.unwrap(),
            CreateOutcome::AlreadyExists,
            "create never overwrites a key of another type"
        );
        let t: String =
            redis::cmd("TYPE").arg(key("wrongtype")).query_async(&mut conn).await.unwrap();
        assert_eq!(t, "string");

        // The good leases keep working.
        let good = Lease::new("good-1", Position::TrimHorizon).transferred_to(Some("w".into()));
        let v = store.update_lease(&good, versions["good-1"]).await.unwrap();
        assert_eq!(
            store.get_lease(&"good-1".into()).await.unwrap(),
            Some(VersionedLease::new(good, v))
        );
        store.delete_lease(&"good-2".into(), versions["good-2"]).await.unwrap();

        // An operator who knows the version repairs a garbled record with a plain CAS.
        let repaired = Lease::new("garbled", Position::Latest);
        let v = store.update_lease(&repaired, versions["garbled"]).await.unwrap();
        assert_eq!(
            store.get_lease(&"garbled".into()).await.unwrap(),
            Some(VersionedLease::new(repaired, v))
        );

        let listing = store.list_leases().await.unwrap();
        let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        assert_eq!(items, ["garbled", "good-1", "good-3"]);
        assert_eq!(listing.corrupt.len(), 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_worker_records_are_reported_per_record() {
    let Some(factory) = common::factory().await else { return };
    let f = &factory;
    with_scope(f, "corrupt_workers", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let mut conn = store.manager();
        let w = |id: &str| store.worker_redis_key(&WorkerId::from(id));
        let index = format!("{}:workers", store.key_tag());
        for id in ["w1", "w2", "w4"] {
            store.heartbeat(&WorkerRecord::new(id.into(), 1)).await.unwrap();
        }
        raw(&mut conn, &[b"HSET", w("w2").as_bytes(), b"beat", b"many"]).await;
        raw(&mut conn, &[b"HDEL", w("w4").as_bytes(), b"id"]).await;
        raw(&mut conn, &[b"SET", w("w3").as_bytes(), b"x"]).await;
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"w3"]).await;

        let listing = store.list_workers().await.unwrap();
        let ids: Vec<&str> = listing.items.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["w1"]);
        let corrupt: BTreeMap<&str, &str> =
            listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
        assert!(corrupt["w2"].contains("beat"), "{corrupt:?}");
        assert!(corrupt["w3"].contains("WRONGTYPE"), "{corrupt:?}");
        assert!(corrupt["w4"].contains("`id`"), "{corrupt:?}");

        // A conditional removal never removes what it cannot compare: a garbled beat, a key
        // that is not a hash.
        assert!(!store.remove_worker_if(&"w2".into(), 1).await.unwrap());
        assert!(!store.remove_worker_if(&"w3".into(), 1).await.unwrap());
        assert_eq!(store.list_workers().await.unwrap().corrupt.len(), 3, "all still listed");

        // A heartbeat rewrites the record whole, which repairs it.
        store.heartbeat(&WorkerRecord::new("w2".into(), 2)).await.unwrap();
        store.remove_worker(&"w3".into()).await.unwrap();
        let listing = store.list_workers().await.unwrap();
        let ids: Vec<&str> = listing.items.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["w1", "w2"]);
        assert_eq!(listing.corrupt.len(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_processes_the_leases_around_a_corrupt_one() {
    let Some(factory) = common::factory().await else { return };
    let f = &factory;
    with_scope(f, "worker_around_corrupt", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let shared: Arc<dyn LeaseStore> = Arc::new(store.clone());
        let source = MemorySource::new(4);
        for i in 0..100 {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
        let shards = source.shards();
        let bad = shards[0].id.clone();
        let rec = Recorder::new();
        let cfg = Config::new(ns.as_str())
            .unwrap()
            .with_heartbeat(Duration::from_millis(100))
            .with_initial_position(Position::TrimHorizon);
        let src: Arc<dyn ShardSource> = Arc::new(source.clone());
        let mut cluster = Cluster::new(shared, src, rec.factory(), cfg);
        cluster.sync_shards().await.unwrap();
        let mut conn = store.manager();
        raw(&mut conn, &[b"HSET", store.lease_redis_key(&bad).as_bytes(), b"epoch", b"NaN"]).await;

        cluster.start_workers(1).unwrap();
        let expected: usize = shards.iter().skip(1).map(|s| source.records(&s.id).len()).sum();
        wait_until(
            "the other shards' records",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async { rec.distinct() == expected },
        )
        .await
        .unwrap();
        let listing = store.list_leases().await.unwrap();
        assert_eq!(listing.corrupt.len(), 1);
        assert_eq!(listing.corrupt[0].key, bad.as_str());
        assert_eq!(listing.items.len(), 3);
        assert!(listing.items.iter().all(|v| v
            .lease
            .owner
            .as_ref()
            .is_some_and(|o| o.as_str() == "w1")));
        cluster.shutdown_all().await;
    })
    .await;
}
