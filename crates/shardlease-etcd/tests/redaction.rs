//! The password of an `etcd://` URL never shows: not in a connection error (a server without
//! authentication, a port nobody listens on), not in `Debug` output, not in `redact_url`.
//! Connection failures are retryable. Runs on the server named by `SHARDLEASE_TEST_ETCD_URL`
//! (which has no authentication enabled) and on a closed loopback port.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use shardlease_core::{Error, LeaseKey, LeaseStore};
use shardlease_etcd::{redact_url, EtcdOptions, EtcdStore};

const SECRET: &str = "s3cr3t-Pa55";

fn shown(e: &Error) -> String {
    let mut text = format!("{e} {e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    text
}

#[tokio::test]
async fn a_closed_port_is_a_retryable_error_without_the_password() {
    let port = common::free_port();
    let url = format!("etcd://app:{SECRET}@127.0.0.1:{port}?connect_timeout_ms=300&timeout_ms=300");
    let options = EtcdOptions::from_url(&url).unwrap();
    assert!(!format!("{options:?}").contains(SECRET));
    let err = match EtcdStore::connect(&url, "ns").await {
        Err(e) => e,
        Ok(store) => {
            assert!(!format!("{store:?}").contains(SECRET));
            store.get_lease(&LeaseKey::from("k")).await.unwrap_err()
        }
    };
    let text = shown(&err);
    assert!(!text.contains(SECRET), "{text}");
    assert!(err.is_retryable(), "a refused connection may succeed later: {text}");
}

#[tokio::test]
async fn credentials_refused_by_the_server_never_show() {
    let Some(base) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let host = base.trim_start_matches("etcd://").trim_end_matches('/');
    let url = format!("etcd://app:{SECRET}@{host}?timeout_ms=2000");
    let result = tokio::time::timeout(Duration::from_secs(10), EtcdStore::connect(&url, "ns"))
        .await
        .expect("connect answers");
    match result {
        Err(e) => assert!(!shown(&e).contains(SECRET), "{}", shown(&e)),
        Ok(store) => assert!(!format!("{store:?}").contains(SECRET)),
    }
    assert_eq!(redact_url(&url), format!("etcd://app:***@{host}?timeout_ms=2000"));
}
