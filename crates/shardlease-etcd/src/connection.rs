//! Opening the etcd client the builder describes: endpoints, timeouts, credentials, TLS.
//!
//! The client keeps one gRPC channel balanced over the endpoints; it reconnects by itself after a
//! server restart, so a store survives one (calls in between fail as retryable). HTTP/2
//! keep-alive pings notice a dead connection (and end a watch on it) within seconds.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use shardlease_core::store::Redactor;
use shardlease_core::{Error, Result};

use crate::builder::ConnectSettings;
use crate::errors::backend;

/// How often an idle connection is pinged, and how long a ping may go unanswered.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(5));

pub(crate) async fn connect(options: &ConnectSettings, redactor: &Redactor) -> Result<Client> {
    let mut connect = ConnectOptions::new()
        .with_timeout(options.request_timeout)
        .with_connect_timeout(options.connect_timeout)
        .with_keep_alive(KEEP_ALIVE.0, KEEP_ALIVE.1)
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &options.credentials {
        connect = connect.with_user(user.clone(), password.clone());
    }
    let scheme = if options.tls { "https" } else { "http" };
    if options.tls {
        connect = tls(connect, options)?;
    } else if options.ca_file.is_some() {
        return Err(Error::Config("etcd: ca_file needs TLS (etcds:// or tls=true)".into()));
    }
    let endpoints: Vec<String> =
        options.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect();
    Client::connect(endpoints, Some(connect)).await.map_err(|e| backend(redactor, "connect", e))
}

#[cfg(feature = "tls")]
fn tls(connect: ConnectOptions, options: &ConnectSettings) -> Result<ConnectOptions> {
    let mut tls = etcd_client::TlsOptions::new().with_enabled_roots();
    if let Some(path) = &options.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| Error::Config(format!("etcd: cannot read ca_file {path}: {e}")))?;
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
    }
    Ok(connect.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls(_connect: ConnectOptions, _options: &ConnectSettings) -> Result<ConnectOptions> {
    Err(Error::Config(
        "etcd over TLS needs the `tls` feature of shardlease-etcd (`etcd-tls` on the shardlease \
         crate)"
            .into(),
    ))
}
