//! Redis Cluster: the `redis+cluster://` / `rediss+cluster://` URL, the cluster connection and
//! its change subscriptions.
//!
//! A cluster URL lists seed nodes, `redis+cluster://[[user]:password@]h1:7000,h2:7001[?…]`; the
//! client asks them for the slot map and then speaks to every master it names. The key layout
//! needs nothing more: every key of a namespace shares one hash tag, so one slot, so the scripts
//! run unchanged on the master of that slot.
//!
//! **Change notification.** The scripts `PUBLISH` to the namespace's channel as on a single
//! server, and Redis Cluster forwards a `PUBLISH` to every node, so a subscriber may listen on
//! any node. The `redis` crate subscribes on a cluster over RESP3 only (pushes), so a
//! subscription opens a cluster connection of its own speaking RESP3, whatever the store's
//! connection speaks. Like a single server's, the stream ends when a connection of the
//! subscription drops (the crate reports it as a `Disconnection` push, and would subscribe
//! again by itself, silently losing the messages published meanwhile): the runtime then
//! subscribes again and lists once, which finds every change the lost notices announced. It
//! also ends when the store connects to the cluster again (`crate::relink`), since a
//! subscription on a hung master goes silent without dropping.
//!
//! **Failover.** When the master of the namespace's slot fails, calls fail retryably until a
//! replica is promoted and the client learns of it: by itself when the master died (refused
//! connections, then `MOVED`), through `crate::relink` when it hangs.

use std::time::Duration;

use futures::StreamExt;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushKind, Value};
use shardlease_core::store::url::HostListUrl;
use shardlease_core::store::{ChangeStream, Redactor};
use shardlease_core::{Error, Result};
use tracing::debug;
use url::Url;

use crate::errors::backend;

/// The schemes of a cluster URL, and the scheme each seed node's URL gets.
const SCHEMES: &[(&str, &str)] = &[("redis+cluster", "redis"), ("rediss+cluster", "rediss")];

/// The shortest wait, in milliseconds, before the cluster client repeats a call (a random wait
/// from this to the crate's `10 ms × 2^attempt`, at most [`RETRY_WAIT_MAX_MS`]).
const RETRY_WAIT_MIN_MS: u64 = 50;

/// The longest wait, in milliseconds, before the cluster client repeats a call.
const RETRY_WAIT_MAX_MS: u64 = 1_000;

/// Whether `scheme` names a Redis Cluster.
pub(crate) fn is_cluster_scheme(scheme: &str) -> bool {
    SCHEMES.iter().any(|(s, _)| *s == scheme)
}

/// A cluster URL taken apart: the first seed as a single-node URL (which carries the
/// credentials, path and query every seed shares, for the builder to read its options from),
/// and every seed's host.
pub(crate) struct ClusterUrl {
    /// `redis[s]://[userinfo@]first-host[tail]`.
    pub first: Url,
    /// The seeds' hosts as written (`host`, `host:port`, `[v6]:port`), at least one.
    pub hosts: Vec<String>,
}

/// Splits a `redis+cluster://` URL (the caller checked the scheme). Errors never quote the
/// URL (it may hold a password).
pub(crate) fn split(raw: &str) -> Result<ClusterUrl> {
    let malformed = |why: &str| {
        Error::Config(format!(
            "malformed Redis Cluster URL ({why}); expected \
             redis+cluster://[[user]:password@]host:port[,host:port…][?options]"
        ))
    };
    let parts = HostListUrl::split(raw).ok_or_else(|| malformed("no ://"))?;
    let node_scheme = SCHEMES
        .iter()
        .find(|(s, _)| *s == parts.scheme)
        .map(|(_, n)| *n)
        .ok_or_else(|| malformed("not a cluster scheme"))?;
    let hosts: Vec<String> = parts.hosts().map(str::to_owned).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(malformed("a seed node is missing from the host list"));
    }
    for host in &hosts {
        if Url::parse(&format!("{node_scheme}://{host}/")).map_or(true, |u| u.host().is_none()) {
            return Err(malformed("a seed node is not a valid host[:port]"));
        }
    }
    let userinfo = parts.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let first = Url::parse(&format!("{node_scheme}://{userinfo}{}{}", hosts[0], parts.tail))
        .map_err(|e| malformed(&e.to_string()))?;
    Ok(ClusterUrl { first, hosts })
}

/// The seed nodes and settings of a cluster connection, kept to open subscriptions later.
#[derive(Clone)]
pub(crate) struct Seeds {
    /// One driver URL per seed node (credentials, database and driver options included).
    nodes: Vec<String>,
    response_timeout: Duration,
    connection_timeout: Duration,
    /// The CA and client certificate of `rediss+cluster://` (the `tls` feature), when the
    /// builder or the URL names any.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    certificates: Option<Certificates>,
}

/// What a TLS cluster connection is given: the CA to trust and a client certificate. Without
/// the `tls` feature there is none (an `Option` of it is always `None`).
#[cfg(feature = "tls")]
pub(crate) type Certificates = redis::TlsCertificates;
/// What a TLS cluster connection is given; without the `tls` feature there is none.
#[cfg(not(feature = "tls"))]
pub(crate) type Certificates = std::convert::Infallible;

impl Seeds {
    /// The seeds: `first` (a driver URL, this crate's options taken out) with each of `hosts`
    /// in place of its host.
    pub(crate) fn new(
        first: &Url,
        hosts: &[String],
        response_timeout: Duration,
        connection_timeout: Duration,
        certificates: Option<Certificates>,
    ) -> Result<Seeds> {
        let first = first.as_str();
        let parts = HostListUrl::split(first)
            .ok_or_else(|| Error::Config("malformed Redis Cluster URL".into()))?;
        let nodes = hosts.iter().map(|h| parts.with_host_list(h)).collect();
        Ok(Seeds { nodes, response_timeout, connection_timeout, certificates })
    }

    /// How long one command may take.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// A client builder over the seeds, with the store's timeouts (each also bounds a whole
    /// call, redirections and retries included, so a call to a dead master fails in time).
    /// A call the client repeats (after `MOVED`, `CLUSTERDOWN`, a refused connection) waits
    /// [`RETRY_WAIT_MIN_MS`] or a little more first, not the crate's default of over a second,
    /// which no call with a shorter response timeout would ever see the end of.
    fn builder(&self) -> ClusterClientBuilder {
        let builder = ClusterClientBuilder::new(self.nodes.iter().map(String::as_str))
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(3)
            .min_retry_wait(RETRY_WAIT_MIN_MS)
            .max_retry_wait(RETRY_WAIT_MAX_MS);
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return builder.certs(certificates.clone());
        }
        builder
    }

    /// Connects to the cluster: reads the slot map from a seed and connects to its nodes.
    pub(crate) async fn connect(
        &self,
        target: &str,
        redactor: &Redactor,
    ) -> Result<ClusterConnection> {
        let client = self.builder().build().map_err(|e| usable(target, redactor, &e))?;
        client
            .get_async_connection()
            .await
            .map_err(|e| backend(redactor, &format!("connecting to {target}"), e))
    }

    /// Subscribes to `channel` on a cluster connection of its own (RESP3): the notices, as a
    /// stream that ends when a connection of the subscription drops or `ends` resolves (the
    /// store connected again: see `crate::relink`). Redis confirms the subscription before this
    /// returns.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        target: &str,
        redactor: &Redactor,
        ends: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<ChangeStream> {
        let (sender, pushes) = futures::channel::mpsc::unbounded();
        let client = self
            .builder()
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(sender)
            .build()
            .map_err(|e| usable(target, redactor, &e))?;
        let mut conn = client
            .get_async_connection()
            .await
            .map_err(|e| backend(redactor, "opening the change subscription", e))?;
        conn.subscribe(channel)
            .await
            .map_err(|e| backend(redactor, "subscribing to the change channel", e))?;
        debug!(channel, "subscribed to lease changes on the cluster");
        let notices = pushes
            .take_while(|push: &redis::PushInfo| {
                futures::future::ready(push.kind != PushKind::Disconnection)
            })
            .filter_map(move |push| {
                // The stream owns the connection: dropping the stream closes it.
                let _subscription = &conn;
                futures::future::ready(match (push.kind, push.data.last()) {
                    (PushKind::Message, Some(Value::BulkString(payload))) => {
                        Some(crate::notify::parse(payload))
                    }
                    _ => None,
                })
            })
            .take_until(ends);
        Ok(notices.boxed())
    }
}

/// `Error::Config` for a cluster URL the driver refuses.
fn usable(target: &str, redactor: &Redactor, e: &redis::RedisError) -> Error {
    Error::Config(format!(
        "Redis Cluster URL {target} is not usable: {}",
        redactor.scrub(&e.to_string())
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn cluster_urls_split_into_seeds() {
        let u = split("redis+cluster://u:p%40ss@h1:7000,[::1]:7001,h3/?namespace=a").unwrap();
        assert_eq!(u.first.as_str(), "redis://u:p%40ss@h1:7000/?namespace=a");
        assert_eq!(u.hosts, ["h1:7000", "[::1]:7001", "h3"]);
        let seeds = Seeds::new(&u.first, &u.hosts, Duration::ZERO, Duration::ZERO, None).unwrap();
        assert_eq!(
            seeds.nodes,
            [
                "redis://u:p%40ss@h1:7000/?namespace=a",
                "redis://u:p%40ss@[::1]:7001/?namespace=a",
                "redis://u:p%40ss@h3/?namespace=a"
            ]
        );
        let tls = split("rediss+cluster://h1:7000").unwrap();
        assert_eq!(tls.first.as_str(), "rediss://h1:7000");
        for bad in [
            "redis+cluster://:s3cr3t@",
            "redis+cluster://:s3cr3t@h1,,h2",
            "redis+cluster://:s3cr3t@h1:99999,h2",
            "redis+cluster://:s3cr3t@h1,h2:x",
            "redis+cluster://:s3cr3t@h1,[bad",
        ] {
            match split(bad) {
                Err(Error::Config(m)) => {
                    assert!(!m.contains("s3cr3t"), "{m}");
                    assert!(m.contains("Redis Cluster URL"), "{m}");
                }
                _ => panic!("{bad} must be refused"),
            }
        }
    }
}
