//! The SQL store on an in-memory SQLite database (`sqlite::memory:`, one per test): the whole
//! conformance suite, corrupt rows, hostile identifiers, and what is particular to memory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::SqlFactory;
use shardlease_core::store::VersionedLease;
use shardlease_core::store::{Lease, LeaseStore};
use shardlease_core::Position;
use shardlease_sql::SqlStore;

async fn factory() -> Option<SqlFactory> {
    Some(SqlFactory::connect("sqlite::memory:").await)
}

dialect_tests!(factory());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers() {
    let f = SqlFactory::connect("sqlite::memory:").await;
    common::hostile_identifiers(f.base(), "sqlite::memory:").await;
}

/// Each `sqlite::memory:` connect is a database of its own; namespaces of one store share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_databases_are_private_and_kept() {
    let a = SqlStore::builder().url("sqlite::memory:").namespace("x").connect().await.unwrap();
    let b = SqlStore::builder()
        .url("sqlite::memory:?namespace=ignored")
        .namespace("x")
        .connect()
        .await
        .unwrap();
    a.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    assert!(b.get_lease(&"k".into()).await.unwrap().is_none(), "separate databases");
    let a2 = common::other_namespace(&a, "y").await.unwrap();
    a2.create_lease(&Lease::new("k2", Position::Latest)).await.unwrap();
    assert_eq!(a.list_leases().await.unwrap().items.len(), 1, "namespaces stay apart");
    // Many concurrent operations on the single connection queue up; none fails.
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move {
                a.create_lease(&Lease::new(format!("c{i}"), Position::Latest)).await.unwrap()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(a.list_leases().await.unwrap().items.len(), 33);
}

/// Parameters come from the URL; the builder's win over them; bad ones are `Config` errors.
#[tokio::test]
async fn url_parameters_reach_the_store() {
    let url = "sqlite::memory:?table_prefix=app_&namespace=from_url";
    let store = SqlStore::builder().url(url).connect().await.unwrap();
    assert_eq!((store.table_prefix(), common::namespace_of(&store).as_str()), ("app_", "from_url"));
    let store = SqlStore::builder().namespace("ns").table_prefix("mine_").url(url).connect().await;
    let store = store.unwrap();
    assert_eq!((store.table_prefix(), common::namespace_of(&store).as_str()), ("mine_", "ns"));
    for bad in ["sqlite::memory:?create_schema=false", "sqlite::memory:?table_prefix=Bad-Prefix"] {
        let err = SqlStore::builder().url(bad).namespace("ns").connect().await;
        assert!(matches!(err, Err(shardlease_core::Error::Config(_))), "{bad}: {err:?}");
    }
}

/// The builder needs exactly one of a URL and a pool; the pool's own settings cannot be set
/// with a pool; zero connections or a zero wait are refused. All `Config` errors.
#[tokio::test]
async fn builder_input_is_checked() {
    let a = SqlStore::builder().url("sqlite::memory:").namespace("x").connect().await.unwrap();
    let pool = || a.pool().clone();
    let url = "sqlite::memory:";
    let cases = [
        (SqlStore::builder(), "url() or pool()"),
        (SqlStore::builder().url(url).pool(pool()), "not both"),
        (SqlStore::builder().pool(pool()).max_connections(2), "max_connections"),
        (SqlStore::builder().pool(pool()).acquire_timeout(Duration::from_secs(1)), "acquire"),
        (SqlStore::builder().pool(pool()).busy_timeout(Duration::from_secs(1)), "busy_timeout"),
        (SqlStore::builder().url(url).max_connections(0), "max_connections"),
        (SqlStore::builder().url(url).acquire_timeout(Duration::ZERO), "acquire_timeout"),
        (SqlStore::builder().pool(pool()).namespace(""), "namespace"),
        (SqlStore::builder().pool(pool()).table_prefix("Bad"), "table prefix"),
    ];
    for (builder, expected) in cases {
        let shown = format!("{builder:?}");
        match builder.connect().await {
            Err(shardlease_core::Error::Config(m)) => assert!(m.contains(expected), "{shown}: {m}"),
            other => panic!("{shown}: expected a config error, got {other:?}"),
        }
    }
    // Over the pool of `a`: the same database, another namespace.
    let b = SqlStore::builder().pool(pool()).namespace("y").connect().await.unwrap();
    b.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    assert!(a.list_leases().await.unwrap().items.is_empty(), "namespaces stay apart");
    let b_again = common::other_namespace(&a, "y").await.unwrap();
    assert_eq!(b_again.list_leases().await.unwrap().items.len(), 1, "one database");
}

/// SQLite lets a hand edit put a blob in the key column itself. Such rows cannot be a
/// pagination cursor: listing still terminates, reports them as corrupt, and lists every other
/// lease once, here with the unreadable rows at the very end of a full page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_keys_do_not_break_listing() {
    let store =
        SqlStore::builder().url("sqlite::memory:").namespace("keys").connect().await.unwrap();
    for i in 0..1000 {
        store.create_lease(&Lease::new(format!("k{i:04}"), Position::Latest)).await.unwrap();
    }
    // Blobs sort after every text key; these are not UTF-8. (A number written into the key
    // column becomes text: the column has TEXT affinity.)
    for (key, value) in [("k0001", "x'ff00'"), ("k0500", "x'fe01'"), ("k0002", "12345")] {
        common::vandalize(&store, key, "lease_key", value).await;
    }
    let listing = store.list_leases().await.unwrap();
    let mut keys: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
    assert_eq!(keys.len(), 998, "every readable lease");
    assert!(keys.contains(&"12345"));
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 998, "no lease listed twice");
    assert_eq!(listing.corrupt.len(), 2, "{:?}", listing.corrupt);
    assert!(
        listing.corrupt.iter().all(|c| c.key.contains("unreadable lease_key")),
        "{:?}",
        listing.corrupt
    );
    // The other leases keep working.
    let VersionedLease { lease, version: v } =
        store.get_lease(&"k0003".into()).await.unwrap().unwrap();
    store.update_lease(&lease, v).await.unwrap();
}

/// `sqlite::memory:?name=NAME` names an in-memory database: every `connect` in this process with
/// the same name opens the same database, another name another one. Writes from two stores on it
/// race by CAS, losing none; closed, it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_memory_databases_are_shared_in_the_process() {
    let name = shardlease_testkit::fresh_namespace("named-memory");
    let url = format!("sqlite::memory:?name={name}");
    let a = SqlStore::builder().url(&url).namespace("x").connect().await.unwrap();
    let b: Arc<dyn LeaseStore> =
        Arc::new(SqlStore::builder().url(&url).namespace("x").connect().await.unwrap());
    let other = SqlStore::builder()
        .url(format!("sqlite::memory:?name={name}-other"))
        .namespace("x")
        .connect()
        .await
        .unwrap();
    a.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    let VersionedLease { lease, .. } =
        b.get_lease(&"k".into()).await.unwrap().expect("the same database");
    assert!(other.get_lease(&"k".into()).await.unwrap().is_none(), "another name, another one");

    let a_dyn: Arc<dyn LeaseStore> = Arc::new(a.clone());
    let tasks: Vec<_> = [a_dyn.clone(), b.clone(), a_dyn, b.clone()]
        .into_iter()
        .map(|store| {
            tokio::spawn(async move {
                for _ in 0..25 {
                    loop {
                        let VersionedLease { lease: mut l, version: v } =
                            store.get_lease(&"k".into()).await.unwrap().unwrap();
                        l.epoch = l.epoch.next();
                        match store.update_lease(&l, v).await {
                            Ok(_) => break,
                            Err(shardlease_core::Error::Conflict { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let VersionedLease { lease: after, .. } = a.get_lease(&"k".into()).await.unwrap().unwrap();
    assert_eq!(after.epoch.get(), lease.epoch.get() + 100);

    drop(b);
    let c = SqlStore::builder().url(&url).namespace("x").connect().await.unwrap();
    assert!(c.get_lease(&"k".into()).await.unwrap().is_some(), "kept while the process runs");
    a.pool().close().await;
    let d = SqlStore::builder().url(&url).namespace("x").connect().await.unwrap();
    assert!(d.get_lease(&"k".into()).await.unwrap().is_none(), "closed: a new database");
    let err = SqlStore::builder().url("sqlite://some.db?name=x").namespace("x").connect().await;
    assert!(matches!(err, Err(shardlease_core::Error::Config(_))), "{err:?}");
}

/// The pool may close its one connection at any time (a query cancelled mid-flight by an aborted
/// task fails the pool's check on release; sqlx then closes it and opens another). The
/// database must outlive that connection: before, the new connection found an empty database and
/// every operation failed with "no such table" (seen as a CI flake of the crash test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_outlives_a_replaced_connection() {
    for url in ["sqlite::memory:", "sqlite::memory:?name=outlives_a_replaced_connection"] {
        let store = SqlStore::builder().url(url).namespace("x").connect().await.unwrap();
        store.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
        let shardlease_sql::SqlPool::Sqlite(pool) = store.pool() else { unreachable!() };
        for _ in 0..3 {
            // What sqlx does with a connection it finds broken on release: close it.
            let conn = pool.acquire().await.unwrap();
            conn.close().await.unwrap();
            let leases = store.list_leases().await.unwrap().items;
            assert_eq!(leases.len(), 1, "{url}: the lease outlives the connection: {leases:?}");
        }
        store.pool().close().await;
    }
}
