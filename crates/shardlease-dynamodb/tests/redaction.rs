//! AWS keys never show up in an error (its message, its source chain or its `Debug` form) nor in
//! the `Debug` output of a store or a builder: not when the endpoint is unreachable, not when a
//! call fails after connecting, not for a malformed URL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::error::Error as _;
use std::net::TcpListener;
use std::time::Duration;

use shardlease_core::{Error, LeaseKey, LeaseStore};
use shardlease_dynamodb::{builder_from_url, DynamoDbStore};

const KEY_ID: &str = "AKIAREDACTME0000TEST";
const SECRET: &str = "wJalrXUtnFEMI-s3cret-K7MDENG";
const TOKEN: &str = "session-t0ken-IQoJb3JpZ2lu";

/// Every rendering of `e` a log line might use.
fn renderings(e: &Error) -> String {
    let mut out = format!("{e}\n{e:?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    out
}

fn assert_hidden(what: &str, text: &str) {
    for secret in [KEY_ID, SECRET, TOKEN] {
        assert!(!text.contains(secret), "{what}: a key leaked:\n{text}");
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap()
}

#[tokio::test]
async fn unreachable_endpoints_hide_the_keys() {
    let port = free_port();
    let builder = DynamoDbStore::builder("leases")
        .region("us-east-1")
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .credentials(KEY_ID, SECRET, Some(TOKEN.to_owned()))
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(1))
        .attempt_timeout(Duration::from_millis(500));
    assert_hidden("builder Debug", &format!("{builder:?}"));
    let e = builder.connect().await.expect_err("nothing listens there");
    assert_hidden("connect error", &renderings(&e));
    assert!(e.is_retryable(), "an unreachable endpoint may come back: {e}");
    assert!(renderings(&e).contains(&format!("127.0.0.1:{port}")), "{}", renderings(&e));

    let url = format!(
        "dynamodb://{KEY_ID}:{SECRET}@leases?region=us-east-1&endpoint=http://127.0.0.1:{port}\
         &max_attempts=1&session_token={TOKEN}"
    );
    let b = builder_from_url(&url).unwrap();
    assert_hidden("URL builder Debug", &format!("{b:?}"));
    let e = b.connect().await.expect_err("nothing listens there");
    assert_hidden("URL connect error", &renderings(&e));
    for bad in [
        format!("dynamodb://{KEY_ID}:{SECRET}@leases?colour=blue"),
        format!("dynamodb://{KEY_ID}:{SECRET}@[bad"),
        format!("dynamodb://{KEY_ID}:{SECRET}@x"),
    ] {
        let e = match builder_from_url(&bad) {
            Err(e) => e,
            Ok(b) => b.connect().await.expect_err("no such table name"),
        };
        assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
        assert_hidden(&bad, &renderings(&e));
    }
}

#[tokio::test]
async fn failed_calls_and_debug_output_hide_the_keys() {
    let Some(endpoint) = common::endpoint() else { return };
    let table = common::fresh_table("redaction");
    let store = DynamoDbStore::builder(&table)
        .region("us-east-1")
        .endpoint_url(&endpoint)
        .credentials(KEY_ID, SECRET, Some(TOKEN.to_owned()))
        .namespace("ns")
        .create_table(true)
        .connect()
        .await
        .unwrap();
    assert!(store.get_lease(&LeaseKey::from("a")).await.unwrap().is_none());
    assert_hidden("store Debug", &format!("{store:?}"));

    // The table vanishes under the store: the next call fails for good, without the keys.
    store.client().delete_table().table_name(&table).send().await.unwrap();
    let e = store.get_lease(&LeaseKey::from("a")).await.expect_err("the table is gone");
    assert_hidden("call error", &renderings(&e));
    assert!(!e.is_retryable(), "a missing table stays missing: {e}");
    assert!(renderings(&e).contains("ResourceNotFound"), "{}", renderings(&e));
}
