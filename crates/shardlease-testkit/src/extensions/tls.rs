//! TLS, once for every store: against a real TLS-only server on loopback (started by
//! `scripts/tls-services.sh`, with a test CA and a certificate for the name `localhost` only),
//!
//! - [`a_trusted_certificate_connects`]: the URL that trusts the test CA connects and passes a
//!   short lease round trip;
//! - [`an_unknown_ca_is_refused`]: the same URL trusting another CA is refused, with an error
//!   that says why (a certificate problem), never a panic;
//! - [`a_wrong_host_name_is_refused`]: connecting through `127.0.0.1`, a name the certificate
//!   does not cover, is refused the same way;
//!
//! and in each, the password of the URL (every server has a user with one) shows in no error
//! and in no log line, at any level ([`logs::capture_all`](crate::logs::capture_all)).
//!
//! A store's test implements [`TlsUrls`] (how its URL spells the CA, the client certificate and
//! the password) and generates the three tests with
//! [`store_tls_tests!`](crate::store_tls_tests).

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, WorkerRecord};
use shardlease_core::{Error, LeaseKey, Position, Result, SequenceNumber, WorkerId};

use super::redaction::{assert_hidden, renderings};
use crate::logs::{capture_all, Logs};
use crate::suite::{env_or_skip, fresh_namespace};

/// The host name the test certificate covers.
pub const CERT_HOST: &str = "localhost";
/// A name for the same server that the certificate does not cover.
pub const WRONG_HOST: &str = "127.0.0.1";

/// What `scripts/tls-services.sh` exported: the files and the password every TLS test uses, and
/// the port of one store's TLS server.
#[derive(Clone, Debug)]
pub struct TlsEnv {
    /// PEM of the CA that signed the servers' certificate.
    pub ca: String,
    /// PEM of a CA that signed nothing the servers use.
    pub other_ca: String,
    /// PEM of a client certificate from the test CA (CN=root).
    pub client_cert: String,
    /// Its key (PKCS#8 PEM).
    pub client_key: String,
    /// The password of the servers' test user.
    pub password: String,
    /// The port of this store's TLS server on 127.0.0.1.
    pub port: u16,
}

impl TlsEnv {
    /// Reads the `SHARDLEASE_TEST_TLS_*` variables and `addr_var` (`localhost:PORT`); `None`
    /// (with a printed skip line, a failure under `CI=true`) when any is unset.
    pub fn from_env(addr_var: &str) -> Option<TlsEnv> {
        let addr = env_or_skip(addr_var)?;
        let port = addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())?;
        Some(TlsEnv {
            ca: env_or_skip("SHARDLEASE_TEST_TLS_CA")?,
            other_ca: env_or_skip("SHARDLEASE_TEST_TLS_OTHER_CA")?,
            client_cert: env_or_skip("SHARDLEASE_TEST_TLS_CLIENT_CERT")?,
            client_key: env_or_skip("SHARDLEASE_TEST_TLS_CLIENT_KEY")?,
            password: env_or_skip("SHARDLEASE_TEST_TLS_PASSWORD")?,
            port,
        })
    }
}

/// The hooks a store's TLS test implements.
#[async_trait]
pub trait TlsUrls: Send + Sync {
    /// The environment the URLs are built from.
    fn env(&self) -> &TlsEnv;

    /// The store's URL for its TLS server at `host:{env().port}`, with the test password, with
    /// full verification (CA and host name) against the CA in the PEM file `ca_file`, in
    /// `namespace`, and with timeouts short enough for a test.
    fn url(&self, host: &str, ca_file: &str, namespace: &str) -> String;

    /// Opens a store from `url` the way the store's own `connect` does.
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>>;

    /// Secrets besides the password that must never show (an AWS secret key). Default none.
    fn other_secrets(&self) -> Vec<String> {
        Vec::new()
    }
}

fn secrets(hooks: &dyn TlsUrls) -> Vec<String> {
    let mut s = hooks.other_secrets();
    s.push(hooks.env().password.clone());
    s
}

fn check_hidden(what: &str, text: &str, secrets: &[String]) {
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_hidden(what, text, &secrets);
}

/// Runs a TLS case on a current-thread runtime with every log line captured (every task the
/// clients spawn runs on this thread, so the capture sees their logs too).
#[doc(hidden)]
pub fn __run_tls_test<F, Fut>(test: F)
where
    F: FnOnce(Logs) -> Fut,
    Fut: Future<Output = ()>,
{
    let (logs, _guard) = capture_all();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime for a TLS test")
        .block_on(test(logs));
}

/// The URL trusting the test CA connects, and a lease makes a round trip: created, read back
/// whole, updated under its version, listed, deleted; a worker record too. No secret shows in
/// the store's `Debug` or the logs.
pub async fn a_trusted_certificate_connects(hooks: &dyn TlsUrls, logs: Logs) {
    let env = hooks.env().clone();
    let url = hooks.url(CERT_HOST, &env.ca, &fresh_namespace("tls"));
    let secrets = secrets(hooks);
    let store = match hooks.connect(&url).await {
        Ok(store) => store,
        Err(e) => panic!("the trusted TLS server refused: {}", renderings(&e)),
    };
    check_hidden("the store's Debug", &format!("{store:?}"), &secrets);

    let mut lease = Lease::new("shardId-tls-000001", Position::TrimHorizon);
    lease.owner = Some(WorkerId::from("tls-worker"));
    let v1 = match store.create_lease(&lease).await.expect("create over TLS") {
        CreateOutcome::Created(v) => v,
        CreateOutcome::AlreadyExists => panic!("a fresh namespace holds no lease"),
    };
    let read = store.get_lease(&lease.key).await.expect("get over TLS").expect("the lease");
    assert_eq!((&read.lease, &read.version), (&lease, &v1));
    let seq = SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898")
        .expect("a sequence number");
    lease.checkpoint = Position::sequence(seq);
    let v2 = store.update_lease(&lease, v1).await.expect("update over TLS");
    let listed = store.list_leases().await.expect("list over TLS");
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    assert_eq!((&listed.items[0].lease, &listed.items[0].version), (&lease, &v2));
    let stale = store.update_lease(&lease, v1).await;
    assert!(matches!(stale, Err(Error::Conflict { .. })), "a stale version loses: {stale:?}");
    store.delete_lease(&lease.key, v2).await.expect("delete over TLS");
    assert_eq!(store.get_lease(&LeaseKey::from("shardId-tls-000001")).await.expect("get"), None);

    let record = WorkerRecord::new(WorkerId::from("tls-worker"), 1);
    store.heartbeat(&record).await.expect("heartbeat over TLS");
    let workers = store.list_workers().await.expect("list workers over TLS");
    assert_eq!(workers.items.iter().map(|w| w.id.clone()).collect::<Vec<_>>(), [record.id]);
    drop(store);
    check_hidden("the logs", &logs.text(), &secrets);
}

/// Connects (or makes the first call) with `url` and returns the error; panics if it succeeds.
async fn refused(hooks: &dyn TlsUrls, url: &str, why: &str) -> Error {
    match hooks.connect(url).await {
        Err(e) => e,
        Ok(store) => match store.get_lease(&LeaseKey::from("k")).await {
            Err(e) => e,
            Ok(found) => panic!("{why}: the connection was accepted (read {found:?})"),
        },
    }
}

/// Whether an error's text says the server's certificate was the problem.
fn names_the_certificate(shown: &str) -> bool {
    shown.to_lowercase().contains("certificate")
}

/// A URL that trusts another CA is refused, with an error that names the certificate problem;
/// no secret shows in it or in the logs.
pub async fn an_unknown_ca_is_refused(hooks: &dyn TlsUrls, logs: Logs) {
    let env = hooks.env().clone();
    let url = hooks.url(CERT_HOST, &env.other_ca, &fresh_namespace("tls"));
    refused_saying_why(hooks, &url, "a certificate from an unknown CA", logs).await;
}

/// Opening `url` fails; the error names the certificate problem, and no secret shows in it or in
/// the logs.
async fn refused_saying_why(hooks: &dyn TlsUrls, url: &str, what: &str, logs: Logs) {
    let e = refused(hooks, url, what).await;
    let shown = renderings(&e);
    println!("refused as it must be: {e}");
    assert!(names_the_certificate(&shown), "the error says why: {shown}");
    let secrets = secrets(hooks);
    check_hidden("the error", &shown, &secrets);
    check_hidden("the logs", &logs.text(), &secrets);
}

/// Connecting through a name the certificate does not cover (`127.0.0.1`; it names only
/// `localhost`) is refused with an error that names the certificate problem; no secret shows.
pub async fn a_wrong_host_name_is_refused(hooks: &dyn TlsUrls, logs: Logs) {
    let env = hooks.env().clone();
    let url = hooks.url(WRONG_HOST, &env.ca, &fresh_namespace("tls"));
    refused_saying_why(hooks, &url, "a certificate for another host name", logs).await;
}
