//! Items that do not decode (an attribute of the wrong type, a missing attribute, a garbled
//! checkpoint, written by hand) are reported as `Error::Corrupt` / `Listing::corrupt` for that
//! key only: nothing panics, and every other lease and worker keeps working. Runs on the emulator
//! named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::VersionedLease;
use std::collections::{BTreeMap, HashMap};

use shardlease_core::{CreateOutcome, Error, Lease, LeaseStore, Position, Version, WorkerRecord};
use shardlease_dynamodb::aws_sdk_dynamodb::types::AttributeValue;

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

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_items_are_reported_per_key() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("corrupt");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    // Small pages, so corrupt items fall on several pages.
    let store = factory
        .builder(&table)
        .namespace("c")
        .create_table(true)
        .page_size(2)
        .connect()
        .await
        .unwrap();

    let mut versions = BTreeMap::new();
    for k in ["good-1", "good-2", "good-3", "wrong-type", "missing", "garbled"] {
        let v = created(store.create_lease(&Lease::new(k, Position::TrimHorizon)).await.unwrap());
        versions.insert(k, v);
    }
    factory.set_lease_attribute(&store, "wrong-type", "epoch", s("seven")).await;
    factory.set_lease_attribute(&store, "garbled", "checkpoint", s("{not json")).await;
    store
        .client()
        .update_item()
        .table_name(&table)
        .key("pk", s(store.lease_partition_key()))
        .key("sk", s("missing"))
        .update_expression("REMOVE epoch")
        .send()
        .await
        .unwrap();
    // An item written by someone else entirely: no version at all, a number where a list goes.
    let mut stranger = HashMap::new();
    stranger.insert("pk".to_owned(), s(store.lease_partition_key()));
    stranger.insert("sk".to_owned(), s("stranger"));
    stranger.insert("parents".to_owned(), AttributeValue::N("1".into()));
    factory.put_raw(&store, stranger).await;

    let listing = store.list_leases().await.unwrap();
    let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
    assert_eq!(items, ["good-1", "good-2", "good-3"]);
    let corrupt: BTreeMap<&str, &str> =
        listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
    assert_eq!(
        corrupt.keys().copied().collect::<Vec<_>>(),
        ["garbled", "missing", "stranger", "wrong-type"]
    );
    assert!(corrupt["wrong-type"].contains("epoch"), "{corrupt:?}");
    assert!(corrupt["missing"].contains("epoch"), "{corrupt:?}");
    assert!(corrupt["garbled"].contains("checkpoint"), "{corrupt:?}");
    assert!(corrupt["stranger"].contains("version"), "{corrupt:?}");

    // Reads and conflicting writes of a corrupt item report it; nothing is written.
    assert!(
        corrupt_reason(store.get_lease(&"wrong-type".into()).await, "wrong-type").contains("epoch")
    );
    corrupt_reason(store.get_lease(&"stranger".into()).await, "stranger");
    let stale = Version(1);
    let taken = Lease::new("garbled", Position::TrimHorizon).transferred_to(Some("w".into()));
    corrupt_reason(store.update_lease(&taken, stale).await, "garbled");
    corrupt_reason(store.delete_lease(&"missing".into(), stale).await, "missing");
    assert_eq!(
        store.create_lease(&Lease::new("stranger", Position::TrimHorizon)).await.unwrap(),
        CreateOutcome::AlreadyExists,
        "create never overwrites an item"
    );

    // The good leases keep working.
    let good = Lease::new("good-1", Position::TrimHorizon).transferred_to(Some("w".into()));
    let v = store.update_lease(&good, versions["good-1"]).await.unwrap();
    assert_eq!(
        store.get_lease(&"good-1".into()).await.unwrap(),
        Some(VersionedLease::new(good, v))
    );
    store.delete_lease(&"good-2".into(), versions["good-2"]).await.unwrap();

    // An operator who knows the version repairs a corrupt item with a plain compare-and-set.
    let repaired = Lease::new("wrong-type", Position::Latest);
    let v = store.update_lease(&repaired, versions["wrong-type"]).await.unwrap();
    assert_eq!(
        store.get_lease(&"wrong-type".into()).await.unwrap(),
        Some(VersionedLease::new(repaired, v))
    );

    let listing = store.list_leases().await.unwrap();
    let items: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
    assert_eq!(items, ["good-1", "good-3", "wrong-type"]);
    assert_eq!(listing.corrupt.len(), 3);
    common::delete_table(&endpoint, &table).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_worker_items_are_reported_per_worker() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("corrupt-workers");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    let store = factory.open("cw").await.unwrap();
    for id in ["w1", "w2", "w3"] {
        store.heartbeat(&WorkerRecord::new(id.into(), 1)).await.unwrap();
    }
    store
        .client()
        .update_item()
        .table_name(&table)
        .key("pk", s(store.worker_partition_key()))
        .key("sk", s("w2"))
        .update_expression("SET beat = :b")
        .expression_attribute_values(":b", s("many"))
        .send()
        .await
        .unwrap();
    store
        .client()
        .update_item()
        .table_name(&table)
        .key("pk", s(store.worker_partition_key()))
        .key("sk", s("w3"))
        .update_expression("REMOVE lease_count")
        .send()
        .await
        .unwrap();

    let listing = store.list_workers().await.unwrap();
    let ids: Vec<&str> = listing.items.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["w1"]);
    let corrupt: BTreeMap<&str, &str> =
        listing.corrupt.iter().map(|c| (c.key.as_str(), c.reason.as_str())).collect();
    assert!(corrupt["w2"].contains("beat"), "{corrupt:?}");
    assert!(corrupt["w3"].contains("lease_count"), "{corrupt:?}");

    // A conditional removal never removes what it cannot compare.
    assert!(!store.remove_worker_if(&"w2".into(), 1).await.unwrap());
    assert_eq!(store.list_workers().await.unwrap().corrupt.len(), 2, "still listed");
    // A heartbeat rewrites the item whole, which repairs it.
    store.heartbeat(&WorkerRecord::new("w2".into(), 2)).await.unwrap();
    let listing = store.list_workers().await.unwrap();
    assert_eq!(listing.items.len(), 2);
    assert_eq!(listing.corrupt.len(), 1);
    common::delete_table(&endpoint, &table).await.unwrap();
}
