//! Password redaction, once for every store: a URL with a password never shows it in `Debug`,
//! `Display`, errors (their message, source chain and `Debug` form) or `redact_url`.
//!
//! The store's test says how to build its URL and open it ([`SecretUrl`]); the store-specific
//! failures (a password refused by the server, a call failing after connecting) stay in the
//! store's test and use [`renderings`] and [`assert_hidden`] from here.

use std::net::TcpListener;
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, LeaseKey, Result};

/// The hooks a store's test implements to run [`an_unreachable_server_hides_the_password`].
#[async_trait]
pub trait SecretUrl: Send + Sync {
    /// URLs of this store carrying `secret` as their password (in the userinfo, in a query
    /// parameter, percent-encoded: every spelling the store accepts), for a server on
    /// `127.0.0.1:port`, where nothing listens, with timeouts short enough for a test.
    fn urls_with_password(&self, secret: &str, port: u16) -> Vec<String>;

    /// Opens a store from `url` the way the store's own `connect` does.
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>>;

    /// The `Debug` form of the store's builder (or options) for `url`, when it has one.
    fn builder_debug(&self, url: &str) -> Option<String>;

    /// Other secrets the URLs carry besides the password (an access key id, a session token),
    /// hidden everywhere the password is. Default none.
    fn other_secrets(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Whether the store's connection errors show the URL, redacted (`***` where the password
    /// was): then the case checks they do. Default `false`.
    fn errors_show_the_redacted_url(&self) -> bool {
        false
    }
}

/// Every rendering of `e` a log line might use: `Display` and `Debug` of the error and of each
/// error in its source chain.
pub fn renderings(e: &Error) -> String {
    let mut out = format!("{e}\n{e:?}\n");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    out
}

/// Panics, naming `what`, when any of `secrets` shows in `text`.
pub fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{what}: a secret leaked:\n{text}");
    }
}

/// A loopback port nobody listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// With a password in the URL and no server: the builder's `Debug`, the store's `Debug` (if it
/// opens lazily), the error of the connect or of the first call, and `redact_url` never show the
/// password; the error is retryable (the server may come up) and names the address.
pub async fn an_unreachable_server_hides_the_password(hooks: &dyn SecretUrl) {
    const SECRET: &str = "hunter2-s3cr3t-Pa55";
    let port = free_port();
    let urls = hooks.urls_with_password(SECRET, port);
    assert!(!urls.is_empty(), "a store has at least one URL with a password");
    let mut secrets = hooks.other_secrets();
    secrets.push(SECRET);
    for url in urls {
        if let Some(debug) = hooks.builder_debug(&url) {
            assert_hidden("the builder's Debug", &debug, &secrets);
        }
        let redacted = shardlease_core::store::url::redact_url(&url);
        assert_hidden("redact_url", &redacted, &secrets);
        assert!(redacted.contains("***"), "{redacted}");
        let e = match hooks.connect(&url).await {
            Err(e) => e,
            Ok(store) => {
                assert_hidden("the store's Debug", &format!("{store:?}"), &secrets);
                store.get_lease(&LeaseKey::from("k")).await.expect_err("nothing listens there")
            }
        };
        let shown = renderings(&e);
        assert_hidden("the error", &shown, &secrets);
        assert!(e.is_retryable(), "an unreachable server may come back: {shown}");
        assert!(shown.contains(&format!("127.0.0.1:{port}")), "the address is named: {shown}");
        if hooks.errors_show_the_redacted_url() {
            assert!(shown.contains("***"), "the URL is shown redacted: {shown}");
        }
    }
}
