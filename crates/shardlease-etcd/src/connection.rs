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
    } else if options.ca_file.is_some() || options.client_cert.is_some() {
        return Err(Error::Config(
            "etcd: ca_file, cert_file and key_file need TLS (etcds:// or tls=true)".into(),
        ));
    }
    let endpoints: Vec<String> =
        options.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect();
    Client::connect(endpoints, Some(connect)).await.map_err(|e| backend(redactor, "connect", e))
}

/// The server is verified (certificate chain and host name) against the CA of `ca_file`, or
/// against the platform's roots when none is named; a client certificate is presented when one
/// is named.
#[cfg(feature = "tls")]
fn tls(connect: ConnectOptions, options: &ConnectSettings) -> Result<ConnectOptions> {
    let mut tls = match &options.ca_file {
        Some(path) => etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read_pem("ca_file", path)?)),
        None => etcd_client::TlsOptions::new().with_enabled_roots(),
    };
    if let Some((cert, key)) = &options.client_cert {
        tls = tls.identity(etcd_client::Identity::from_pem(
            read_pem("cert_file", cert)?,
            read_pem("key_file", key)?,
        ));
    }
    Ok(connect.with_tls(tls))
}

/// Reads a PEM file an option names; the error names the option and the path.
#[cfg(feature = "tls")]
fn read_pem(option: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("etcd: cannot read {option} {path}: {e}")))
}

#[cfg(not(feature = "tls"))]
fn tls(_connect: ConnectOptions, _options: &ConnectSettings) -> Result<ConnectOptions> {
    Err(Error::Config(
        "etcd over TLS needs the `tls` feature of shardlease-etcd (`etcd-tls` on the shardlease \
         crate)"
            .into(),
    ))
}
