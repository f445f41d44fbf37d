//! The password of an `etcd://` URL never shows: not in a connection error (a port nobody
//! listens on: the testkit's case, `shardlease_testkit::extensions::redaction`; a server without
//! authentication), not in `Debug` output, not in `redact_url`. Connection failures are
//! retryable. Runs on the server named by `SHARDLEASE_TEST_ETCD_URL` (which has no
//! authentication enabled) and on a closed loopback port.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::Result;
use shardlease_etcd::{redact_url, EtcdStore};
use shardlease_testkit::extensions::redaction::{assert_hidden, renderings};
use shardlease_testkit::extensions::SecretUrl;

const SECRET: &str = "s3cr3t-Pa55";

struct EtcdUrls;

#[async_trait]
impl SecretUrl for EtcdUrls {
    fn urls_with_password(&self, secret: &str, port: u16) -> Vec<String> {
        vec![format!("etcd://app:{secret}@127.0.0.1:{port}?connect_timeout_ms=300&timeout_ms=300")]
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(EtcdStore::builder().url(url).namespace("ns").connect().await?))
    }
    fn builder_debug(&self, url: &str) -> Option<String> {
        Some(format!("{:?}", EtcdStore::builder().url(url).namespace("ns")))
    }
}

shardlease_testkit::redaction_tests!(async { Some(EtcdUrls) });

#[tokio::test]
async fn credentials_refused_by_the_server_never_show() {
    let Some(base) = shardlease_testkit::suite::env_or_skip(common::URL_VAR) else { return };
    let host = base.trim_start_matches("etcd://").trim_end_matches('/');
    let url = format!("etcd://app:{SECRET}@{host}?timeout_ms=2000");
    let connect = EtcdStore::builder().url(&url).namespace("ns").connect();
    let result = tokio::time::timeout(Duration::from_secs(10), connect).await.expect("answers");
    match result {
        Err(e) => assert_hidden("a refused login", &renderings(&e), &[SECRET]),
        Ok(store) => assert_hidden("the store's Debug", &format!("{store:?}"), &[SECRET]),
    }
    assert_eq!(redact_url(&url), format!("etcd://app:***@{host}?timeout_ms=2000"));
}
