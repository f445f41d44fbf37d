//! `RedisStore::builder` over a connection manager the application built: the store runs its
//! commands on it, under the builder's namespace, key prefix and page size; options that
//! configure a connection the store would open are refused with a manager. Runs on the server
//! named by `SHARDLEASE_TEST_REDIS_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use shardlease_core::store::Lease;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, Position};
use shardlease_redis::redis::aio::ConnectionManager;
use shardlease_redis::RedisStore;
use shardlease_testkit::fresh_namespace;

async fn manager(url: &str) -> ConnectionManager {
    let client = shardlease_redis::redis::Client::open(url).unwrap();
    ConnectionManager::new(client).await.unwrap()
}

#[tokio::test]
async fn a_connection_manager_of_ones_own_carries_the_store() {
    let Some(url) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let ns = fresh_namespace("builder-manager");
    let store = RedisStore::builder()
        .connection_manager(manager(&url).await)
        .namespace(&ns)
        .key_prefix(common::TEST_PREFIX)
        .page_size(2)
        .connect()
        .await
        .unwrap();
    assert_eq!(store.namespace().map(|n| n.as_str().to_owned()), Some(ns.clone()));
    assert_eq!(store.key_tag(), format!("{{{}:{ns}}}", common::TEST_PREFIX));
    for i in 0..5 {
        store.create_lease(&Lease::new(format!("k{i}"), Position::Latest)).await.unwrap();
    }
    assert_eq!(store.list_leases().await.unwrap().items.len(), 5, "three pages of two");
    let mut raw = manager(&url).await;
    let exists: bool = shardlease_redis::redis::cmd("EXISTS")
        .arg(store.lease_redis_key(&"k0".into()))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(exists, "written where the key prefix says");
    assert!(format!("{store:?}").contains("<connection manager>"), "{store:?}");
    assert!(store.delete_namespace().await.unwrap() >= 5);
}

#[tokio::test]
async fn connection_options_are_refused_with_a_manager() {
    let Some(url) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let m = manager(&url).await;
    let given = || RedisStore::builder().namespace("ns").connection_manager(m.clone());
    let cases = [
        (given().response_timeout(Duration::from_secs(1)), "response_timeout"),
        (given().connection_timeout(Duration::from_secs(1)), "connection_timeout"),
        (given().url(&url), "not both"),
    ];
    for (builder, name) in cases {
        match builder.connect().await {
            Err(Error::Config(m)) => assert!(m.contains(name), "{name}: {m}"),
            other => panic!("{name}: expected a config error, got {other:?}"),
        }
    }
}
