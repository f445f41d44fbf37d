//! The fleet signal's item and `get_workers` on DynamoDB beyond the conformance cases: a signal
//! item that does not decode is an `Error::Corrupt` (never a panic), a worker item that does not
//! decode is in `get_workers`'s `corrupt` exactly as `list_workers` reports it, neither listing
//! returns the signal, and `delete_namespace` removes it. Runs on the emulator named by
//! `SHARDLEASE_TEST_DYNAMODB_ENDPOINT` (skipped when unset).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use shardlease_core::store::{FleetSignal, Lease, LeaseStore, Version, WorkerRecord};
use shardlease_core::{Error, Position, WorkerId};
use shardlease_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use shardlease_testkit::suite::fresh_namespace;

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

#[tokio::test]
async fn the_signal_is_an_item_of_its_own_and_goes_with_the_namespace() {
    let Some(factory) = common::factory().await else { return };
    let store = factory.open(&fresh_namespace("fleet")).await.unwrap();
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
    store.create_lease(&Lease::new("shard-1", Position::TrimHorizon)).await.unwrap();
    store.heartbeat(&WorkerRecord::new("w1".into(), 5)).await.unwrap();
    let token = Version::random();
    store.write_fleet_signal(token).await.unwrap();

    let leases = store.list_leases().await.unwrap();
    assert_eq!(leases.items.len(), 1, "{leases:?}");
    assert!(leases.corrupt.is_empty(), "{leases:?}");
    let workers = store.list_workers().await.unwrap();
    assert_eq!(workers.items.len(), 1, "{workers:?}");
    assert!(workers.corrupt.is_empty(), "{workers:?}");
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Token(token));

    assert_eq!(store.delete_namespace().await.unwrap(), 3, "lease, worker and signal");
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
    common::delete_table(factory.endpoint(), store.table()).await.unwrap();
}

#[tokio::test]
async fn an_undecodable_signal_is_corrupt() {
    let Some(factory) = common::factory().await else { return };
    let store = factory.open(&fresh_namespace("fleet")).await.unwrap();
    let pk = store.fleet_partition_key().to_owned();
    for token in [s("7"), AttributeValue::N("-3".into()), AttributeValue::N("0".into())] {
        let item = HashMap::from([
            ("pk".to_owned(), s(&pk)),
            ("sk".to_owned(), s("signal")),
            ("token".to_owned(), token),
        ]);
        factory.put_raw(&store, item).await;
        match store.read_fleet_signal().await {
            Err(Error::Corrupt { key, reason }) => {
                assert!(key.contains(&pk), "{key}");
                assert!(reason.contains("token"), "{reason}");
            }
            other => panic!("an undecodable signal reads as corrupt, not {other:?}"),
        }
    }
    let item = HashMap::from([("pk".to_owned(), s(&pk)), ("sk".to_owned(), s("signal"))]);
    factory.put_raw(&store, item).await;
    assert!(matches!(store.read_fleet_signal().await, Err(Error::Corrupt { .. })));
    // A write repairs it.
    store.write_fleet_signal(Version(9)).await.unwrap();
    assert_eq!(store.read_fleet_signal().await.unwrap(), FleetSignal::Token(Version(9)));
    common::delete_table(factory.endpoint(), store.table()).await.unwrap();
}

#[tokio::test]
async fn get_workers_reports_corrupt_records_as_the_listing_does() {
    let Some(factory) = common::factory().await else { return };
    let store = factory.open(&fresh_namespace("fleet")).await.unwrap();
    for id in ["good", "bad"] {
        store.heartbeat(&WorkerRecord::new(id.into(), 11)).await.unwrap();
    }
    store
        .client()
        .update_item()
        .table_name(store.table())
        .key("pk", s(store.worker_partition_key()))
        .key("sk", s("bad"))
        .update_expression("SET beat = :v")
        .expression_attribute_values(":v", s("many"))
        .send()
        .await
        .unwrap();
    let ids: Vec<WorkerId> =
        ["bad", "good", "gone", "bad"].into_iter().map(WorkerId::from).collect();
    let got = store.get_workers(&ids).await.unwrap();
    let listed = store.list_workers().await.unwrap();
    assert_eq!(got.items, listed.items, "the good record, as listed");
    assert_eq!(got.corrupt, listed.corrupt, "the bad record, once, as listed");
    assert_eq!(got.corrupt.len(), 1);
    assert_eq!(got.corrupt[0].key, "bad");
    common::delete_table(factory.endpoint(), store.table()).await.unwrap();
}
