//! The Redis password never shows up in an error (its message, its source chain or its `Debug`
//! form) nor in the `Debug` output of a store or a builder: not when the server is unreachable,
//! not when it refuses the password, not when a call fails after connecting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::error::Error as _;
use std::time::Duration;

use shardlease_core::{Error, LeaseKey, LeaseStore};
use shardlease_redis::RedisStore;

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

fn assert_hidden(e: &Error, secret: &str) {
    let all = renderings(e);
    assert!(!all.contains(secret), "the password leaked:\n{all}");
}

#[tokio::test]
async fn unreachable_server_errors_hide_the_password() {
    const SECRET: &str = "hunter2-s3cret";
    let port = common::free_port();
    let url = format!("redis://user:{SECRET}@127.0.0.1:{port}/0");
    let builder =
        RedisStore::builder(&url).namespace("ns").connection_timeout(Duration::from_millis(300));
    assert!(!format!("{builder:?}").contains(SECRET));
    let e = builder.connect().await.expect_err("nothing listens there");
    assert_hidden(&e, SECRET);
    assert!(e.is_retryable(), "an unreachable server may come back: {e}");
    assert!(renderings(&e).contains(&format!("127.0.0.1:{port}")), "{}", renderings(&e));

    // Percent-encoded passwords are hidden in both spellings.
    let url = format!("redis://:p%40ss-{SECRET}@127.0.0.1:{port}/");
    let e = RedisStore::connect(&url, "ns").await.expect_err("nothing listens there");
    assert_hidden(&e, SECRET);

    for bad in [format!("redis://:{SECRET}@[bad-host/"), format!("gopher://:{SECRET}@h/")] {
        match RedisStore::connect(&bad, "ns").await {
            Err(e @ Error::Config(_)) => assert_hidden(&e, SECRET),
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

    let e = RedisStore::connect(&format!("redis://:{WRONG}@127.0.0.1:{port}/"), "ns")
        .await
        .expect_err("a wrong password is refused");
    assert_hidden(&e, WRONG);
    assert!(!e.is_retryable(), "a wrong password stays wrong: {e}");
    eprintln!("wrong password: {e}");

    // Without a password the connection opens, and the first command is refused for good.
    let anonymous = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"), "ns").await.unwrap();
    let e = anonymous.list_leases().await.expect_err("NOAUTH");
    assert!(!e.is_retryable() && e.to_string().contains("NOAUTH"), "{e}");
    eprintln!("no password: {e}");

    let store = RedisStore::builder(format!("redis://:{RIGHT}@127.0.0.1:{port}/"))
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
    assert_hidden(&e, RIGHT);
    assert!(e.is_retryable(), "a dropped connection is retryable: {e}");
}
