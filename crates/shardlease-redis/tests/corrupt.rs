//! Records that do not decode (a garbled or missing field, a value that is not text, a key of
//! the wrong type) are reported as `Error::Corrupt` / `Listing::corrupt` for that record only:
//! nothing panics, and every other lease and worker keeps working, for the store and for a
//! running worker. The cases live in `shardlease_testkit::extensions::corrupt`; this file says
//! how to damage a Redis record. Runs on the server named by `SHARDLEASE_TEST_REDIS_URL`, and on the cluster named by
//! `SHARDLEASE_TEST_REDIS_CLUSTER_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use async_trait::async_trait;
use common::RedisFactory;
use shardlease_core::store::{
    CreateOutcome, FleetSignal, Lease, LeaseStore, LeaseUpdate, Version, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Position, Result, WorkerId};
use shardlease_redis::RedisConnection;
use shardlease_testkit::extensions::{CorruptRecords, Corruption};
use shardlease_testkit::suite::with_scope;

/// The shared test server's factory, with pages of two so damaged records fall on several.
async fn corrupting() -> Option<RedisFactory> {
    common::factory().await.map(|f| f.with_page_size(2))
}

/// The same on the shared test cluster (`SHARDLEASE_TEST_REDIS_CLUSTER_URL`).
async fn corrupting_cluster() -> Option<RedisFactory> {
    common::cluster_factory().await.map(|f| f.with_page_size(2))
}

async fn raw(conn: &mut RedisConnection, args: &[&[u8]]) -> Result<()> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value =
        cmd.query_async(conn).await.map_err(|e| Error::permanent(format!("raw command: {e}")))?;
    Ok(())
}

#[async_trait]
impl CorruptRecords for RedisFactory {
    fn lease_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("garbled", "checkpoint").repairable(),
            Corruption::new("missing", "epoch"),
            Corruption::new("binary", "UTF-8"),
            Corruption::new("wrongtype", "WRONGTYPE"),
        ]
    }

    fn worker_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("garbled-beat", "beat").repairable(),
            Corruption::new("no-id", "`id`").beat_intact(),
            Corruption::new("wrongtype", "WRONGTYPE"),
            Corruption::new("garbled-loads", "lease_loads").repairable().beat_intact(),
        ]
    }

    async fn corrupt_lease(&self, ns: &str, key: &LeaseKey, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let mut conn = store.connection();
        let k = store.lease_redis_key(key);
        let k = k.as_bytes();
        match damage.name {
            "garbled" => raw(&mut conn, &[b"HSET", k, b"checkpoint", b"{not json"]).await,
            "missing" => raw(&mut conn, &[b"HDEL", k, b"epoch"]).await,
            "binary" => raw(&mut conn, &[b"HSET", k, b"owner", &[0xff, 0xfe]]).await,
            // A key of another type, still in the index.
            "wrongtype" => {
                raw(&mut conn, &[b"DEL", k]).await?;
                raw(&mut conn, &[b"SET", k, b"not a hash"]).await
            }
            other => panic!("no such damage: {other}"),
        }
    }

    async fn corrupt_worker(&self, ns: &str, id: &WorkerId, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let mut conn = store.connection();
        let k = store.worker_redis_key(id);
        let k = k.as_bytes();
        match damage.name {
            "garbled-beat" => raw(&mut conn, &[b"HSET", k, b"beat", b"many"]).await,
            "no-id" => raw(&mut conn, &[b"HDEL", k, b"id"]).await,
            "garbled-loads" => raw(&mut conn, &[b"HSET", k, b"lease_loads", b"lots s/1"]).await,
            "wrongtype" => {
                raw(&mut conn, &[b"DEL", k]).await?;
                raw(&mut conn, &[b"SET", k, b"x"]).await
            }
            other => panic!("no such damage: {other}"),
        }
    }
}

shardlease_testkit::corrupt_record_tests!(corrupting());

/// The same cases on Redis Cluster.
mod cluster {
    use super::corrupting_cluster;
    shardlease_testkit::corrupt_record_tests!(corrupting_cluster());
}

/// What only Redis has: an index entry whose hash vanished (a delete racing a listing looks like
/// this) is no lease at all, and a create never turns a key of another type into a hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_entries_without_a_hash_and_keys_of_another_type() {
    let Some(f) = corrupting().await else { return };
    let f = &f;
    with_scope(f, "redis_index_damage", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let mut conn = store.connection();
        let index = format!("{}:leases", store.key_tag());
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"ghost"]).await.unwrap();
        let wrong = store.lease_redis_key(&"wrongtype".into());
        raw(&mut conn, &[b"SET", wrong.as_bytes(), b"not a hash"]).await.unwrap();
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"wrongtype"]).await.unwrap();
        // A hash holding none of a lease's fields: a listing reads only those (`HMGET`), so it
        // must tell this one from a vanished hash.
        let stranger = store.lease_redis_key(&"stranger".into());
        raw(&mut conn, &[b"HSET", stranger.as_bytes(), b"foo", b"bar"]).await.unwrap();
        raw(&mut conn, &[b"ZADD", index.as_bytes(), b"0", b"stranger"]).await.unwrap();

        assert_eq!(store.get_lease(&"ghost".into()).await.unwrap(), None);
        let listing = store.list_leases().await.unwrap();
        assert!(listing.items.is_empty(), "{:?}", listing.items);
        let corrupt: Vec<&str> = listing.corrupt.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(corrupt, ["stranger", "wrongtype"], "the ghost is not listed at all");
        assert!(listing.corrupt[0].reason.contains("`key` is missing"), "{:?}", listing.corrupt);
        assert_eq!(
            store.create_lease(&Lease::new("wrongtype", Position::TrimHorizon)).await.unwrap(),
            CreateOutcome::AlreadyExists
        );
        let t: String = redis::cmd("TYPE").arg(&wrong).query_async(&mut conn).await.unwrap();
        assert_eq!(t, "string", "create never overwrites a key of another type");
    })
    .await;
}

/// A batch meets damaged records item by item, as the single writes do: an update of a key of
/// another type, or one that conflicts with a record that does not decode, is `Corrupt` for that
/// item only, and the items before and after it are written; a creation over a key of another
/// type is `AlreadyExists` and leaves the key as it is, and the lease after it is created.
async fn damaged_records_in_a_batch(f: &RedisFactory) {
    with_scope(f, "redis_batch_damage", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let mut conn = store.connection();
        let names = ["a", "wrong", "b", "binary", "c"];
        let leases: Vec<Lease> =
            names.iter().map(|k| Lease::new(*k, Position::TrimHorizon)).collect();
        let versions: Vec<Version> = store
            .create_leases(&leases)
            .await
            .unwrap()
            .into_iter()
            .map(|o| match o {
                CreateOutcome::Created(v) => v,
                other => panic!("expected a creation, got {other:?}"),
            })
            .collect();
        let wrong = store.lease_redis_key(&"wrong".into());
        raw(&mut conn, &[b"DEL", wrong.as_bytes()]).await.unwrap();
        raw(&mut conn, &[b"SET", wrong.as_bytes(), b"not a hash"]).await.unwrap();
        let binary = store.lease_redis_key(&"binary".into());
        raw(&mut conn, &[b"HSET", binary.as_bytes(), b"owner", &[0xff, 0xfe]]).await.unwrap();

        // "binary" with a stale version: its conflict carries a record that is not text.
        let updates: Vec<LeaseUpdate> = leases
            .iter()
            .zip(&versions)
            .map(|(l, v)| {
                let expected = if l.key.as_str() == "binary" { Version(v.0 ^ 1) } else { *v };
                LeaseUpdate::new(l.clone(), expected)
            })
            .collect();
        let outcomes = store.update_leases(&updates).await.unwrap();
        assert_eq!(outcomes.len(), names.len());
        for (name, outcome) in names.iter().zip(&outcomes) {
            match (*name, outcome) {
                ("wrong", Err(Error::Corrupt { key, reason })) => {
                    assert_eq!(key, "wrong");
                    assert!(reason.contains("WRONGTYPE"), "{reason}");
                }
                ("binary", Err(Error::Corrupt { key, .. })) => assert_eq!(key, "binary"),
                ("a" | "b" | "c", Ok(_)) => {}
                (name, outcome) => panic!("{name}: unexpected {outcome:?}"),
            }
        }

        let again =
            [Lease::new("wrong", Position::TrimHorizon), Lease::new("d", Position::TrimHorizon)];
        let outcomes = store.create_leases(&again).await.unwrap();
        assert_eq!(outcomes[0], CreateOutcome::AlreadyExists);
        assert!(matches!(outcomes[1], CreateOutcome::Created(_)), "{outcomes:?}");
        let t: String = redis::cmd("TYPE").arg(&wrong).query_async(&mut conn).await.unwrap();
        assert_eq!(t, "string", "a batch creation never overwrites a key of another type");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_records_in_a_batch_on_a_server() {
    let Some(f) = corrupting().await else { return };
    damaged_records_in_a_batch(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_records_in_a_batch_on_a_cluster() {
    let Some(f) = corrupting_cluster().await else { return };
    damaged_records_in_a_batch(&f).await;
}

/// `get_workers` reports damaged worker records exactly as `list_workers` does (pages and
/// chunks of two here), and a fleet signal that is not a token, or a key of another type, is
/// `Error::Corrupt` keyed by its Redis key, never a panic, until the next write replaces it.
/// The signal's key carries the
/// namespace's hash tag and `delete_namespace` removes it.
async fn damaged_workers_and_signal(f: &RedisFactory) {
    with_scope(f, "redis_fleet_damage", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let mut conn = store.connection();
        let ids: Vec<WorkerId> = ["w-a", "w-b", "w-c", "w-d", "w-e"].map(WorkerId::from).into();
        for (i, id) in ids.iter().enumerate() {
            store.heartbeat(&WorkerRecord::new(id.clone(), 1 + i as u64)).await.unwrap();
        }
        let k = |id: &WorkerId| store.worker_redis_key(id);
        raw(&mut conn, &[b"HSET", k(&ids[1]).as_bytes(), b"beat", b"many"]).await.unwrap();
        raw(&mut conn, &[b"DEL", k(&ids[2]).as_bytes()]).await.unwrap();
        raw(&mut conn, &[b"SET", k(&ids[2]).as_bytes(), b"x"]).await.unwrap();
        raw(&mut conn, &[b"DEL", k(&ids[3]).as_bytes()]).await.unwrap();
        raw(&mut conn, &[b"HSET", k(&ids[3]).as_bytes(), b"foo", b"bar"]).await.unwrap();

        let listed = store.list_workers().await.unwrap();
        let mut wanted = ids.clone();
        wanted.push(WorkerId::from("w-never"));
        wanted.push(ids[1].clone());
        let mut got = store.get_workers(&wanted).await.unwrap();
        got.items.sort_by(|a, b| a.id.cmp(&b.id));
        got.corrupt.sort_by(|a, b| a.key.cmp(&b.key));
        let mut listed_corrupt = listed.corrupt.clone();
        listed_corrupt.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(got.items, listed.items, "the intact records, as listed");
        assert_eq!(got.corrupt.len(), 3, "{:?}", got.corrupt);
        for (a, b) in got.corrupt.iter().zip(&listed_corrupt) {
            assert_eq!((&a.key, &a.reason), (&b.key, &b.reason), "reported as the listing does");
        }

        let signal = store.fleet_signal_redis_key();
        assert!(signal.starts_with(store.key_tag()), "{signal}");
        for bad in [b"soon".as_slice(), b"0", b"-4", &[0xff, 0xfe]] {
            raw(&mut conn, &[b"SET", signal.as_bytes(), bad]).await.unwrap();
            match store.read_fleet_signal().await {
                Err(Error::Corrupt { key, .. }) => assert_eq!(key, signal),
                other => panic!("{bad:?}: expected Corrupt, got {other:?}"),
            }
        }
        raw(&mut conn, &[b"DEL", signal.as_bytes()]).await.unwrap();
        raw(&mut conn, &[b"HSET", signal.as_bytes(), b"a", b"b"]).await.unwrap();
        match store.read_fleet_signal().await {
            Err(Error::Corrupt { key, reason }) => {
                assert_eq!(key, signal);
                assert!(reason.contains("WRONGTYPE"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // A write is a plain `SET`: it replaces whatever the key held, so the signal mends.
        store.write_fleet_signal(Version(9)).await.unwrap();
        assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Token(Version(9)));
        store.delete_namespace().await.unwrap();
        assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_workers_and_signal_on_a_server() {
    let Some(f) = corrupting().await else { return };
    damaged_workers_and_signal(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_workers_and_signal_on_a_cluster() {
    let Some(f) = corrupting_cluster().await else { return };
    damaged_workers_and_signal(&f).await;
}
