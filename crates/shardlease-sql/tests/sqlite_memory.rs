//! The SQL store on an in-memory SQLite database (`sqlite::memory:`, one per test): the whole
//! conformance suite, corrupt rows, hostile identifiers, and what is particular to memory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::sync::Arc;

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
    let a = SqlStore::connect("sqlite::memory:", "x").await.unwrap();
    let b = SqlStore::connect("sqlite::memory:?namespace=ignored", "x").await.unwrap();
    a.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    assert!(b.get_lease(&"k".into()).await.unwrap().is_none(), "separate databases");
    let a2 = a.with_namespace("y").unwrap();
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

/// The facade's URL entry point: parameters come from the URL.
#[tokio::test]
async fn connect_url_reads_its_parameters() {
    let store =
        shardlease_sql::connect_url("sqlite::memory:?table_prefix=app_", "ns").await.unwrap();
    assert!(format!("{store:?}").contains("app_"), "{store:?}");
    let err = shardlease_sql::connect_url("sqlite::memory:?create_schema=false", "ns").await;
    assert!(matches!(err, Err(shardlease_core::Error::Config(_))), "{err:?}");
    let err = shardlease_sql::connect_url("sqlite::memory:?table_prefix=Bad-Prefix", "ns").await;
    assert!(matches!(err, Err(shardlease_core::Error::Config(_))), "{err:?}");
}

/// SQLite lets a hand edit put a blob in the key column itself. Such rows cannot be a
/// pagination cursor: listing still terminates, reports them as corrupt, and lists every other
/// lease once, here with the unreadable rows at the very end of a full page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_keys_do_not_break_listing() {
    let store = SqlStore::connect("sqlite::memory:", "keys").await.unwrap();
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
/// the same name opens the same database (through the facade as well), another name another
/// one. Writes from two stores on it race by CAS, losing none; closed, it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_memory_databases_are_shared_in_the_process() {
    let name = shardlease_testkit::fresh_namespace("named-memory");
    let url = format!("sqlite::memory:?name={name}");
    let a = SqlStore::connect(&url, "x").await.unwrap();
    let b: Arc<dyn LeaseStore> = shardlease_sql::connect_url(&url, "x").await.unwrap();
    let other =
        SqlStore::connect(&format!("sqlite::memory:?name={name}-other"), "x").await.unwrap();
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
    let c = SqlStore::connect(&url, "x").await.unwrap();
    assert!(c.get_lease(&"k".into()).await.unwrap().is_some(), "kept while the process runs");
    a.pool().close().await;
    let d = SqlStore::connect(&url, "x").await.unwrap();
    assert!(d.get_lease(&"k".into()).await.unwrap().is_none(), "closed: a new database");
    let err = SqlStore::connect("sqlite://some.db?name=x", "x").await;
    assert!(matches!(err, Err(shardlease_core::Error::Config(_))), "{err:?}");
}
