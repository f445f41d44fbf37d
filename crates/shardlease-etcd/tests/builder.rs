//! `EtcdStore::builder` over an `etcd_client::Client` the application built: the store writes
//! through that client, under the builder's namespace, key prefix and page size, with the watch
//! as asked; options that configure a connection the store would open are refused with a client.
//! Runs on the server named by `SHARDLEASE_TEST_ETCD_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use shardlease_core::store::Lease;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, Position};
use shardlease_etcd::etcd_client::Client;
use shardlease_etcd::EtcdStore;
use shardlease_testkit::fresh_namespace;

/// A client of the test's own on the shared server.
async fn client(url: &str) -> Client {
    let host = url.trim_start_matches("etcd://").split(['/', '?']).next().unwrap();
    Client::connect([format!("http://{host}")], None).await.unwrap()
}

#[tokio::test]
async fn a_client_of_ones_own_carries_the_store() {
    let Some(url) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let ns = fresh_namespace("builder-client");
    let store = EtcdStore::builder()
        .client(client(&url).await)
        .namespace(&ns)
        .key_prefix(common::TEST_PREFIX)
        .page_size(2)
        .watch(false)
        .connect()
        .await
        .unwrap();
    assert_eq!(LeaseStore::namespace(&store).unwrap().as_str(), ns);
    for i in 0..5 {
        store.create_lease(&Lease::new(format!("k{i}"), Position::Latest)).await.unwrap();
    }
    assert_eq!(store.list_leases().await.unwrap().items.len(), 5, "three pages of two");
    let key = store.lease_etcd_key(&"k0".into());
    assert!(key.starts_with(&format!("{}/", common::TEST_PREFIX)), "{key}");
    let raw = client(&url).await.kv_client().get(key, None).await.unwrap();
    assert_eq!(raw.kvs().len(), 1, "written where the key prefix says");
    assert!(store.subscribe_changes().await.unwrap().is_none(), "watch(false) is kept");
    assert_eq!(store.delete_namespace().await.unwrap(), 5);
}

#[tokio::test]
async fn connection_options_are_refused_with_a_client() {
    let Some(url) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let given = || EtcdStore::builder().namespace("ns");
    let c = client(&url).await;
    let cases = [
        (given().client(c.clone()).request_timeout(Duration::from_secs(1)), "request_timeout"),
        (given().client(c.clone()).connect_timeout(Duration::from_secs(1)), "connect_timeout"),
        (given().client(c.clone()).credentials("u", "pw"), "credentials"),
        (given().client(c.clone()).tls(true), "tls"),
        (given().client(c.clone()).ca_file("/ca.pem"), "ca_file"),
        (given().client(c.clone()).url(&url), "only one of"),
        (given().client(c.clone()).endpoints(["h"]), "only one of"),
    ];
    for (builder, name) in cases {
        match builder.connect().await {
            Err(Error::Config(m)) => assert!(m.contains(name), "{name}: {m}"),
            other => panic!("{name}: expected a config error, got {other:?}"),
        }
    }
}
