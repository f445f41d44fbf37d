//! The table on connect: a missing table is a clear `Config` error unless creation was asked
//! for; creation makes the key schema this crate writes, on-demand by default or provisioned,
//! and waits until the table is `ACTIVE`; a table keyed otherwise is refused. Runs on the
//! emulator named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::store::{Lease, LeaseStore};
use shardlease_core::{Error, Position};
use shardlease_dynamodb::aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use shardlease_dynamodb::{Billing, DynamoDbStore};

#[tokio::test]
async fn a_missing_table_is_a_config_error_naming_the_fix() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("missing");
    let factory = common::DynamoFactory::new(endpoint, &table);
    match factory.builder(&table).namespace("ns").connect().await {
        Err(Error::Config(m)) => {
            assert!(m.contains(&table) && m.contains("does not exist"), "{m}");
            assert!(m.contains("create_table"), "the message names the option: {m}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[tokio::test]
async fn tables_are_created_on_request_on_demand_by_default() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("created");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    let store = factory.builder(&table).namespace("ns").create_table(true).connect().await.unwrap();
    let t = store.client().describe_table().table_name(&table).send().await.unwrap().table.unwrap();
    assert_eq!(t.table_status(), Some(&TableStatus::Active));
    let billing = t.billing_mode_summary().and_then(|b| b.billing_mode());
    assert_eq!(billing, Some(&BillingMode::PayPerRequest));
    let keys: Vec<_> = t.key_schema().iter().map(|k| (k.attribute_name(), k.key_type())).collect();
    assert_eq!(keys, [("pk", &KeyType::Hash), ("sk", &KeyType::Range)]);
    store.create_lease(&Lease::new("k", Position::TrimHorizon)).await.unwrap();

    // Connecting again (with or without create) uses the table as it is.
    let again = factory.builder(&table).namespace("ns").create_table(true).connect().await.unwrap();
    assert!(again.get_lease(&"k".into()).await.unwrap().is_some());
    let plain = factory.builder(&table).namespace("ns").connect().await.unwrap();
    assert!(plain.get_lease(&"k".into()).await.unwrap().is_some());
    common::delete_table(&endpoint, &table).await.unwrap();
}

#[tokio::test]
async fn provisioned_tables_get_the_capacity_asked_for() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("provisioned");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    let store = factory
        .builder(&table)
        .create_table(true)
        .billing(Billing::Provisioned { read_capacity: 3, write_capacity: 4 })
        .connect()
        .await
        .unwrap();
    let t = store.client().describe_table().table_name(&table).send().await.unwrap().table.unwrap();
    let p = t.provisioned_throughput().unwrap();
    assert_eq!((p.read_capacity_units(), p.write_capacity_units()), (Some(3), Some(4)));
    common::delete_table(&endpoint, &table).await.unwrap();
}

#[tokio::test]
async fn a_table_keyed_otherwise_is_refused() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("foreign");
    let factory = common::DynamoFactory::new(endpoint.clone(), &table);
    // A store on another table only lends its client.
    let other = common::fresh_table("lender");
    let lender = factory.builder(&other).create_table(true).connect().await.unwrap();
    lender
        .client()
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("leaseKey")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("leaseKey")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    match factory.builder(&table).create_table(true).connect().await {
        Err(Error::Config(m)) => assert!(m.contains("not a shardlease lease table"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    // Through a client of one's own the table is checked the same way, unless told not to.
    let through = |check: bool| {
        DynamoDbStore::builder()
            .client(lender.client().clone())
            .table(&table)
            .namespace("ns")
            .check_table(check)
            .connect()
    };
    match through(true).await {
        Err(Error::Config(m)) => assert!(m.contains("not a shardlease lease table"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    let unchecked = through(false).await.unwrap();
    assert_eq!(unchecked.table(), table, "check_table(false) does not describe the table");
    common::delete_table(&endpoint, &table).await.unwrap();
    common::delete_table(&endpoint, &other).await.unwrap();
}
