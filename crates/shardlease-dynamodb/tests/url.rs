//! The `dynamodb://` URL the facade hands to the builder: every option reaches the store, the
//! builder's namespace wins over the URL's, and two namespaces opened on one URL share the table
//! but nothing else. Runs on the emulator
//! named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::store::Lease;
use shardlease_core::store::LeaseStore;
use shardlease_core::Position;
use shardlease_dynamodb::DynamoDbStore;

#[tokio::test]
async fn urls_open_namespaces_of_one_table() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("url");
    let url = format!(
        "dynamodb://{}:{}@{table}?region=us-east-1&endpoint={endpoint}&create_table=true\
         &page_size=2&namespace=ignored",
        common::KEY_ID,
        common::SECRET
    );
    let open = |ns: &'static str| DynamoDbStore::builder().url(&url).namespace(ns).connect();
    let a = open("app-a").await.unwrap();
    let b = open("app-b").await.unwrap();
    assert_eq!(a.namespace().unwrap().as_str(), "app-a", "the builder wins over the URL");
    for i in 0..5 {
        a.create_lease(&Lease::new(format!("s{i}"), Position::TrimHorizon)).await.unwrap();
    }
    assert_eq!(a.list_leases().await.unwrap().items.len(), 5, "three pages of two");
    assert!(b.list_leases().await.unwrap().items.is_empty());
    common::delete_table(&endpoint, &table).await.unwrap();
}
