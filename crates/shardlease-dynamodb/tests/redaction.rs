//! AWS keys never show up in an error (its message, its source chain or its `Debug` form) nor in
//! the `Debug` output of a store or a builder: not when the endpoint is unreachable, not when a
//! call fails after connecting, not for a malformed URL. The URL case is the testkit's
//! (`shardlease_testkit::extensions::redaction`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, LeaseKey, Result};
use shardlease_dynamodb::DynamoDbStore;
use shardlease_testkit::extensions::redaction::{assert_hidden, renderings};
use shardlease_testkit::extensions::SecretUrl;

const KEY_ID: &str = "AKIAREDACTME0000TEST";
const SECRET: &str = "wJalrXUtnFEMI-s3cret-K7MDENG";
const TOKEN: &str = "session-t0ken-IQoJb3JpZ2lu";

fn hidden(what: &str, text: &str) {
    assert_hidden(what, text, &[KEY_ID, SECRET, TOKEN]);
}

struct DynamoUrls;

#[async_trait]
impl SecretUrl for DynamoUrls {
    fn urls_with_password(&self, secret: &str, port: u16) -> Vec<String> {
        vec![format!(
            "dynamodb://{KEY_ID}:{secret}@leases?region=us-east-1&endpoint=http://127.0.0.1:{port}\
             &max_attempts=1&session_token={TOKEN}"
        )]
    }
    fn other_secrets(&self) -> Vec<&'static str> {
        vec![KEY_ID, TOKEN]
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(DynamoDbStore::builder().url(url).connect().await?))
    }
    fn builder_debug(&self, url: &str) -> Option<String> {
        Some(format!("{:?}", DynamoDbStore::builder().url(url)))
    }
}

shardlease_testkit::redaction_tests!(async { Some(DynamoUrls) });

#[tokio::test]
async fn unreachable_endpoints_hide_the_keys() {
    let port = shardlease_testkit::extensions::redaction::free_port();
    let builder = DynamoDbStore::builder()
        .table("leases")
        .region("us-east-1")
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .credentials(KEY_ID, SECRET, Some(TOKEN.to_owned()))
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(1))
        .attempt_timeout(Duration::from_millis(500));
    hidden("builder Debug", &format!("{builder:?}"));
    let e = builder.connect().await.expect_err("nothing listens there");
    hidden("connect error", &renderings(&e));
    assert!(e.is_retryable(), "an unreachable endpoint may come back: {e}");
    assert!(renderings(&e).contains(&format!("127.0.0.1:{port}")), "{}", renderings(&e));

    for bad in [
        format!("dynamodb://{KEY_ID}:{SECRET}@leases?colour=blue"),
        format!("dynamodb://{KEY_ID}:{SECRET}@[bad"),
        format!("dynamodb://{KEY_ID}:{SECRET}@x"),
    ] {
        let e = DynamoDbStore::builder().url(&bad).connect().await.expect_err("malformed");
        assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
        hidden(&bad, &renderings(&e));
    }
}

#[tokio::test]
async fn failed_calls_and_debug_output_hide_the_keys() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("redaction");
    let store = DynamoDbStore::builder()
        .table(&table)
        .region("us-east-1")
        .endpoint_url(&endpoint)
        .credentials(KEY_ID, SECRET, Some(TOKEN.to_owned()))
        .namespace("ns")
        .create_table(true)
        .connect()
        .await
        .unwrap();
    assert!(store.get_lease(&LeaseKey::from("a")).await.unwrap().is_none());
    hidden("store Debug", &format!("{store:?}"));

    // The table vanishes under the store: the next call fails for good, without the keys.
    store.client().delete_table().table_name(&table).send().await.unwrap();
    let e = store.get_lease(&LeaseKey::from("a")).await.expect_err("the table is gone");
    hidden("call error", &renderings(&e));
    assert!(!e.is_retryable(), "a missing table stays missing: {e}");
    assert!(renderings(&e).contains("ResourceNotFound"), "{}", renderings(&e));
}
