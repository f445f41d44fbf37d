//! Listings follow `LastEvaluatedKey` to the end. The Go KCL port read only the first page, so a
//! lease table over 1 MB silently lost leases; an emulator may not enforce the 1 MB page, so the
//! store is given a page `Limit` of 7 items, which turns 200 leases into 29 pages. Runs on the
//! emulator named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::store::VersionedLease;
use std::collections::BTreeMap;

use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, WorkerRecord};
use shardlease_core::{Position, WorkerId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_pages_list_every_record_exactly_once() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("pages");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    let store = factory
        .builder(&table)
        .namespace("paged")
        .create_table(true)
        .page_size(7)
        .connect()
        .await
        .unwrap();
    // A neighbour namespace in the same table, which no listing may show.
    let neighbour = factory.open("paged-neighbour").await.unwrap();
    neighbour.create_lease(&Lease::new("shardId-x", Position::Latest)).await.unwrap();
    neighbour.heartbeat(&WorkerRecord::new("nw".into(), 1)).await.unwrap();

    let mut created = BTreeMap::new();
    for i in 0..200u64 {
        let lease = Lease::new(format!("shardId-{i:012}"), Position::sequence(i));
        match store.create_lease(&lease).await.unwrap() {
            CreateOutcome::Created(v) => created.insert(lease.key.clone(), (lease, v)),
            CreateOutcome::AlreadyExists => panic!("fresh key {i} already existed"),
        };
    }
    for i in 0..15u64 {
        store.heartbeat(&WorkerRecord::new(WorkerId::from(format!("w{i:02}")), i)).await.unwrap();
    }

    let listing = store.list_leases().await.unwrap();
    assert!(listing.corrupt.is_empty(), "{:?}", listing.corrupt);
    assert_eq!(listing.items.len(), 200, "every page was read, none twice");
    let listed: BTreeMap<_, _> = listing
        .items
        .into_iter()
        .map(|VersionedLease { lease: l, version: v }| (l.key.clone(), (l, v)))
        .collect();
    assert_eq!(listed, created, "each lease listed once, as created, at its version");

    let workers = store.list_workers().await.unwrap();
    let ids: Vec<String> = workers.items.iter().map(|w| w.id.to_string()).collect();
    let want: Vec<String> = (0..15).map(|i| format!("w{i:02}")).collect();
    assert_eq!(ids, want, "three pages of workers, nothing from the neighbour");
    common::delete_table(&endpoint, &table).await.unwrap();
}
