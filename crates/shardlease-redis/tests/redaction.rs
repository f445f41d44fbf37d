//! The Redis password never shows up in an error (its message, its source chain or its `Debug`
//! form) nor in the `Debug` output of a store or a builder: not when the server is unreachable
//! (the testkit's case, `shardlease_testkit::extensions::redaction`), not when it refuses the
//! password, not when a call fails after connecting, not for a malformed URL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, LeaseKey, Result};
use shardlease_redis::RedisStore;
use shardlease_testkit::extensions::redaction::{assert_hidden, renderings};
use shardlease_testkit::extensions::SecretUrl;

struct RedisUrls;

#[async_trait]
impl SecretUrl for RedisUrls {
    fn urls_with_password(&self, secret: &str, port: u16) -> Vec<String> {
        vec![
            format!("redis://user:{secret}@127.0.0.1:{port}/0"),
            // Percent-encoded passwords are hidden in both spellings.
            format!("redis://:p%40ss-{secret}@127.0.0.1:{port}/"),
        ]
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        let b = RedisStore::builder().url(url).namespace("ns");
        Ok(Arc::new(b.connection_timeout(Duration::from_millis(300)).connect().await?))
    }
    fn builder_debug(&self, url: &str) -> Option<String> {
        Some(format!("{:?}", RedisStore::builder().url(url).namespace("ns")))
    }
}

shardlease_testkit::redaction_tests!(async { Some(RedisUrls) });

#[tokio::test]
async fn malformed_urls_hide_the_password() {
    const SECRET: &str = "hunter2-s3cret";
    for bad in [format!("redis://:{SECRET}@[bad-host/"), format!("gopher://:{SECRET}@h/")] {
        match RedisStore::builder().url(&bad).namespace("ns").connect().await {
            Err(e @ Error::Config(_)) => assert_hidden(&bad, &renderings(&e), &[SECRET]),
            other => panic!("{bad}: expected a config error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_failed_calls_hide_the_password() {
    const RIGHT: &str = "right-Pa55-word";
    const WRONG: &str = "wrong-Pa55-word";
    let Some(mut server) = common::PrivateRedis::start_or_skip(
        "refused_and_failed_calls_hide_the_password",
        &["--requirepass", RIGHT],
    ) else {
        return;
    };
    let port = server.port();

    let e = RedisStore::builder()
        .url(format!("redis://:{WRONG}@127.0.0.1:{port}/"))
        .namespace("ns")
        .connect()
        .await
        .expect_err("a wrong password is refused");
    assert_hidden("a refused password", &renderings(&e), &[WRONG]);
    assert!(!e.is_retryable(), "a wrong password stays wrong: {e}");
    eprintln!("wrong password: {e}");

    // Without a password the connection opens, and the first command is refused for good.
    let anonymous = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}/"))
        .namespace("ns")
        .connect()
        .await
        .unwrap();
    let e = anonymous.list_leases().await.expect_err("NOAUTH");
    assert!(!e.is_retryable() && e.to_string().contains("NOAUTH"), "{e}");
    eprintln!("no password: {e}");

    let store = RedisStore::builder()
        .url(format!("redis://:{RIGHT}@127.0.0.1:{port}/"))
        .namespace("ns")
        .response_timeout(Duration::from_millis(500))
        .connection_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    assert!(store.get_lease(&LeaseKey::from("a")).await.unwrap().is_none());
    let debug = format!("{store:?}");
    assert!(!debug.contains(RIGHT) && debug.contains("***"), "{debug}");

    server.kill();
    let e = store.get_lease(&LeaseKey::from("a")).await.expect_err("the server is gone");
    assert_hidden("a call after the server went away", &renderings(&e), &[RIGHT]);
    assert!(e.is_retryable(), "a dropped connection is retryable: {e}");
}
