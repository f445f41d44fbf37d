//! The SQL store on an in-memory SQLite database (`sqlite::memory:`, one per test): the whole
//! conformance suite, corrupt rows, hostile identifiers, and what is particular to memory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::SqlFactory;
use shardlease_core::VersionedLease;
use shardlease_core::{Lease, LeaseStore, Position};
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
