//! The fleet signal's key on etcd, beyond the conformance cases: a value that does not decode is
//! `Err(Corrupt)` (never a panic), a write of the signal gives the watch no notice, and deleting
//! the namespace deletes it. Runs on the server named by `SHARDLEASE_TEST_ETCD_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures::StreamExt;
use shardlease_core::store::StoreChange;
use shardlease_core::store::{FleetSignal, LeaseStore, Version, WorkerRecord};
use shardlease_core::{Error, WorkerId};

fn namespace(case: &str) -> String {
    format!("fleet-signal-{case}-{}", Version::random().0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_signal_is_corrupt_and_a_namespace_delete_removes_it() {
    let Some(factory) = common::factory_without_watch().await else { return };
    let store = factory.open(&namespace("corrupt")).await.unwrap();
    let key = store.fleet_signal_etcd_key();
    for bad in [&b"{not json \xff"[..], br#"{"format":9,"token":5}"#, br#"{"format":1,"token":0}"#]
    {
        store.client().kv_client().put(key.clone(), bad.to_vec(), None).await.unwrap();
        match store.read_fleet_signal().await {
            Err(Error::Corrupt { key: named, .. }) => assert_eq!(named, key),
            other => panic!("{:?}: expected Corrupt, got {other:?}", String::from_utf8_lossy(bad)),
        }
        let listed = store.list_workers().await.unwrap();
        assert!(listed.items.is_empty() && listed.corrupt.is_empty(), "{listed:?}");
        assert!(store.list_leases().await.unwrap().corrupt.is_empty());
    }
    store.write_fleet_signal(Version(9)).await.unwrap();
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Token(Version(9)));
    assert_eq!(store.delete_namespace().await.unwrap(), 1, "the signal was the only key");
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_write_is_no_watch_notice() {
    let Some(factory) = common::factory().await else { return };
    let store = factory.open(&namespace("watch")).await.unwrap();
    let mut changes = store.subscribe_changes().await.unwrap().expect("the watch is on");
    store.write_fleet_signal(Version::random()).await.unwrap();
    store.write_fleet_signal(Version::random()).await.unwrap();
    // A worker joining afterwards: the first notice must be its own.
    store.heartbeat(&WorkerRecord::new(WorkerId::new("w1"), 1)).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("a notice within 10 s")
        .expect("the stream is open");
    match first {
        StoreChange::Worker { id, present: true } => assert_eq!(id.as_str(), "w1"),
        other => panic!("the signal writes made a notice: {other:?}"),
    }
    store.delete_namespace().await.unwrap();
}
