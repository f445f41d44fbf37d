//! [`RedisStoreBuilder`]: the one way to open a [`RedisStore`].
//!
//! The server comes from exactly one of a `redis://` / `rediss://` URL or a
//! [`ConnectionManager`] the application built; everything else is an option. A value set on the
//! builder wins over the same parameter of the URL, whatever the order of the calls. Nothing is
//! checked until [`connect`](RedisStoreBuilder::connect), which reports every bad input as
//! `Error::Config` (never a panic) without repeating a password.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use shardlease_core::store::url::{
    self as store_url, redact_url, HostListUrl, QueryOptions, NAMESPACE_OPTION,
};
use shardlease_core::store::Redactor;
use shardlease_core::{Error, Namespace, Result, DEFAULT_NAMESPACE};
use tracing::debug;
use url::Url;

use crate::cluster::{self, Seeds};
use crate::conn::StoreConn;
use crate::errors::backend;
use crate::notify::Subscriber;
use crate::relink::ClusterLink;
use crate::store::RedisStore;

/// The key prefix used unless another is configured.
pub const DEFAULT_KEY_PREFIX: &str = "shardlease";

/// How many index entries one listing page reads, unless configured.
pub const DEFAULT_PAGE_SIZE: usize = 500;

/// How long one command may take before it fails (retryably), unless configured.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long connecting may take before it fails (retryably), unless configured.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// URL query parameters this crate reads (and strips before handing the URL to the driver).
const KEY_PREFIX_PARAM: &str = "key_prefix";

/// How a store over a connection manager names its server in messages and `Debug`.
const GIVEN_MANAGER: &str = "<connection manager>";

/// Builds a [`RedisStore`]: see [`RedisStore::builder`].
///
/// ```no_run
/// # async fn demo() -> shardlease_core::Result<()> {
/// use std::time::Duration;
/// use shardlease_redis::RedisStore;
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379/0")
///     .namespace("orders")
///     .response_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedisStoreBuilder {
    url: Option<String>,
    manager: Option<ConnectionManager>,
    namespace: Option<String>,
    key_prefix: Option<String>,
    page_size: Option<usize>,
    response_timeout: Option<Duration>,
    connection_timeout: Option<Duration>,
    notify: Option<bool>,
    /// PEM root certificates trusted for `rediss://` instead of the system's.
    #[cfg(feature = "tls")]
    tls_root_pem: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("connection_manager", &self.manager.as_ref().map(|_| "<given>"))
            .field("namespace", &self.namespace)
            .field("key_prefix", &self.key_prefix)
            .field("page_size", &self.page_size)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("notify", &self.notify)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The server: `redis://[[user]:password@]host[:port][/db]`, or `rediss://` with the `tls`
    /// feature; or a Redis Cluster by its seed nodes,
    /// `redis+cluster://[[user]:password@]host:port[,host:port…]` (`rediss+cluster://`). Besides
    /// the driver's own parameters the URL may carry `namespace` and `key_prefix`; options set on
    /// the builder win over them. A `rediss://` (or `rediss+cluster://`) URL may name PEM files:
    /// `ca_file` (the CA to trust instead of the system's roots; the builder's
    /// [`tls_root_certificates_pem`](Self::tls_root_certificates_pem) wins over it), and
    /// `cert_file` with `key_file` (a client certificate).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// A connection manager the application built (with the [`redis`](crate::redis) crate this
    /// one re-exports), instead of a URL: the store runs its commands on it. Its timeouts and
    /// TLS are its own, and setting them here is an error.
    pub fn connection_manager(mut self, manager: ConnectionManager) -> Self {
        self.manager = Some(manager);
        self
    }

    /// Whether the store announces ownership changes on the namespace's pub/sub channel and lets
    /// workers subscribe to them (`LeaseStore::subscribe_changes`), so they act on a release, a
    /// claim, a leave or a join at once instead of at their next heartbeat or balance pass.
    /// Default: the URL's `notify` parameter, else `true`. Checkpoints and heartbeats publish
    /// nothing; each subscribed worker holds one more connection. With
    /// [`connection_manager`](Self::connection_manager) the store has no client to open that
    /// connection with, so notification is off and turning it on is an error.
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = Some(notify);
        self
    }

    /// The namespace (application name) the store reads and writes. Overrides a `namespace`
    /// query parameter of the URL; the default is [`DEFAULT_NAMESPACE`].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The first part of every key's hash tag (default [`DEFAULT_KEY_PREFIX`]), to keep
    /// shardlease's keys apart from other data in the same database. Overrides a `key_prefix`
    /// query parameter of the URL.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// How many leases one listing page reads (default [`DEFAULT_PAGE_SIZE`], at least 1).
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = Some(n);
        self
    }

    /// How long one command may take (default [`DEFAULT_RESPONSE_TIMEOUT`], more than zero).
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = Some(d);
        self
    }

    /// How long one connection attempt may take (default [`DEFAULT_CONNECTION_TIMEOUT`], more
    /// than zero).
    pub fn connection_timeout(mut self, d: Duration) -> Self {
        self.connection_timeout = Some(d);
        self
    }

    /// Trusts these PEM root certificates for `rediss://` instead of the system's (a private
    /// CA, typically). Only with the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_pem = Some(pem.into());
        self
    }

    /// Connects to the server (unless a connection manager was given) and returns the store.
    /// Fails with `Error::Config` for bad input, and `Error::Backend` when the server cannot be
    /// reached (retryable) or refuses the credentials (permanent). No message ever holds the
    /// password.
    pub async fn connect(self) -> Result<RedisStore> {
        let plan = self.plan()?;
        let (conn, target, redactor, subscriber) = match plan.connection {
            Connection::Given(manager) => {
                (StoreConn::Single(manager), GIVEN_MANAGER.to_owned(), Redactor::default(), None)
            }
            Connection::Open(open) => {
                let redactor = store_url::redactor(&open.shown);
                let target = redact_url(&open.shown);
                let (conn, subscriber) = open.connect(&target, &redactor).await?;
                debug!(target = %target, namespace = %plan.namespace, "connected to Redis");
                (conn, target, redactor, Some(subscriber))
            }
        };
        let subscriber = if plan.notify { subscriber } else { None };
        Ok(RedisStore::assemble(
            conn,
            plan.namespace,
            plan.key_prefix,
            target,
            plan.page_size,
            redactor,
            subscriber,
        ))
    }

    /// Everything checked, the builder's values laid over the URL's and the defaults.
    fn plan(self) -> Result<Plan> {
        let source = match (self.url, self.manager) {
            (Some(url), None) => Source::Url(parse_url(&url)?),
            (None, Some(manager)) => Source::Manager(manager),
            (None, None) => {
                return Err(Error::Config(
                    "Redis store builder: name the server with url() or connection_manager()"
                        .into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(Error::Config(
                    "Redis store builder: give url() or connection_manager(), not both".into(),
                ))
            }
        };
        let (url_namespace, url_prefix, url_notify) = match &source {
            Source::Url(parsed) => {
                (parsed.namespace.clone(), parsed.key_prefix.clone(), parsed.notify)
            }
            Source::Manager(_) => (None, None, None),
        };
        let namespace = self.namespace.or(url_namespace);
        let namespace = Namespace::new(namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE))?;
        let key_prefix =
            self.key_prefix.or(url_prefix).unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_owned());
        validate_key_prefix(&key_prefix)?;
        let page_size = self.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if page_size == 0 {
            return Err(Error::Config("Redis store builder: page_size must be at least 1".into()));
        }
        #[cfg(feature = "tls")]
        let tls_root_pem = self.tls_root_pem;
        #[cfg(not(feature = "tls"))]
        let tls_root_pem: Option<Vec<u8>> = None;
        let connection = match source {
            Source::Url(parsed) => Connection::Open(Open {
                url: parsed.url,
                cluster_hosts: parsed.cluster_hosts,
                shown: parsed.shown,
                response_timeout: positive(
                    "response_timeout",
                    self.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT),
                )?,
                connection_timeout: positive(
                    "connection_timeout",
                    self.connection_timeout.unwrap_or(DEFAULT_CONNECTION_TIMEOUT),
                )?,
                tls_root_pem,
                tls_files: parsed.tls_files,
            }),
            Source::Manager(manager) => {
                let connection_options = [
                    ("response_timeout", self.response_timeout.is_some()),
                    ("connection_timeout", self.connection_timeout.is_some()),
                    ("tls_root_certificates_pem", tls_root_pem.is_some()),
                ];
                if let Some((name, _)) = connection_options.iter().find(|(_, set)| *set) {
                    return Err(Error::Config(format!(
                        "Redis store builder: {name}() configures a connection the store opens; \
                         with connection_manager() that is the manager's own"
                    )));
                }
                if self.notify == Some(true) {
                    return Err(Error::Config(
                        "Redis store builder: notify(true) needs url(): with \
                         connection_manager() the store cannot open the subscription's \
                         connection"
                            .into(),
                    ));
                }
                Connection::Given(manager)
            }
        };
        let notify = match &connection {
            Connection::Open(_) => self.notify.or(url_notify).unwrap_or(true),
            Connection::Given(_) => false,
        };
        Ok(Plan { namespace, key_prefix, page_size, connection, notify })
    }
}

/// What [`RedisStoreBuilder::connect`] does, every value checked.
struct Plan {
    namespace: Namespace,
    key_prefix: String,
    page_size: usize,
    connection: Connection,
    /// Whether to announce changes and let workers subscribe.
    notify: bool,
}

/// What the builder was given to reach the server.
enum Source {
    Url(ParsedUrl),
    Manager(ConnectionManager),
}

/// Where the connection comes from.
enum Connection {
    /// The application's connection manager.
    Given(ConnectionManager),
    /// A connection the store opens.
    Open(Open),
}

/// A connection to open, from a URL.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
struct Open {
    /// The URL without this crate's parameters: what the driver gets (for a cluster, the first
    /// seed's URL, whose credentials, path and query every seed shares).
    url: Url,
    /// A cluster's seed hosts; `None` for a single server.
    cluster_hosts: Option<Vec<String>>,
    /// The URL as given without this crate's parameters (a cluster's whole host list), for
    /// messages once redacted.
    shown: String,
    response_timeout: Duration,
    connection_timeout: Duration,
    tls_root_pem: Option<Vec<u8>>,
    tls_files: Box<TlsFiles>,
}

impl Open {
    /// The CA and client certificate to use for `rediss://`: the builder's CA wins over the
    /// URL's `ca_file`. `None` when neither names any (the system's roots).
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Result<Option<redis::TlsCertificates>> {
        let root_cert = match (&self.tls_root_pem, &self.tls_files.ca_file) {
            (Some(pem), _) => Some(pem.clone()),
            (None, Some(path)) => Some(read_pem("ca_file", path)?),
            (None, None) => None,
        };
        let client_tls = match (&self.tls_files.cert_file, &self.tls_files.key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem("cert_file", cert)?,
                client_key: read_pem("key_file", key)?,
            }),
            _ => None,
        };
        Ok((root_cert.is_some() || client_tls.is_some())
            .then_some(redis::TlsCertificates { client_tls, root_cert }))
    }

    /// Opens the connection (a connection manager, or a cluster connection); what opens
    /// subscriptions is kept.
    async fn connect(self, target: &str, redactor: &Redactor) -> Result<(StoreConn, Subscriber)> {
        if matches!(self.url.scheme(), "rediss") {
            prepare_tls()?;
        }
        #[cfg(feature = "tls")]
        let certificates = self.certificates()?;
        #[cfg(not(feature = "tls"))]
        let certificates: Option<crate::cluster::Certificates> = None;
        if let Some(hosts) = &self.cluster_hosts {
            let seeds = Seeds::new(
                &self.url,
                hosts,
                self.response_timeout,
                self.connection_timeout,
                certificates,
            )?;
            let conn = seeds.connect(target, redactor).await?;
            let link = ClusterLink::new(seeds.clone(), conn, target.to_owned(), redactor.clone());
            let subscriber =
                Subscriber::Cluster { seeds, target: target.to_owned(), link: Arc::clone(&link) };
            return Ok((StoreConn::Cluster(link), subscriber));
        }
        #[cfg(feature = "tls")]
        let client = match certificates {
            Some(certificates) => redis::Client::build_with_tls(self.url.as_str(), certificates),
            None => redis::Client::open(self.url.as_str()),
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(self.url.as_str());
        let client = client.map_err(|e| {
            Error::Config(format!(
                "Redis URL {target} is not usable: {}",
                redactor.scrub(&e.to_string())
            ))
        })?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let manager = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| backend(redactor, &format!("connecting to {target}"), e))?;
        Ok((StoreConn::Single(manager), Subscriber::Single(client)))
    }
}

/// `d`, refused when zero.
fn positive(name: &str, d: Duration) -> Result<Duration> {
    if d.is_zero() {
        return Err(Error::Config(format!("Redis store builder: {name} must be more than zero")));
    }
    Ok(d)
}

/// A URL taken apart: what the driver gets, and the options this crate reads from it.
struct ParsedUrl {
    /// The driver's URL (a cluster's first seed).
    url: Url,
    /// A cluster's seed hosts.
    cluster_hosts: Option<Vec<String>>,
    /// The URL as given, without this crate's options.
    shown: String,
    namespace: Option<String>,
    key_prefix: Option<String>,
    notify: Option<bool>,
    /// Boxed: rarely set, and it would make every URL source three words per file bigger.
    tls_files: Box<TlsFiles>,
}

/// The TLS files a `rediss://` URL names (`ca_file`, `cert_file`, `key_file`), read at connect.
#[derive(Default)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
struct TlsFiles {
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
}

impl TlsFiles {
    fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// Reads one PEM file a URL names; the error names the option and the path (never the URL).
#[cfg(feature = "tls")]
fn read_pem(option: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("Redis URL: cannot read {option} {path}: {e}")))
}

fn parse_url(raw: &str) -> Result<ParsedUrl> {
    let scheme = raw.split_once("://").map(|(s, _)| s);
    let (mut url, cluster_hosts) = match scheme {
        Some(s) if cluster::is_cluster_scheme(s) => {
            let split = cluster::split(raw)?;
            (split.first, Some(split.hosts))
        }
        _ => {
            let url = Url::parse(raw).map_err(|e| {
                Error::Config(format!(
                    "malformed Redis URL ({e}); expected redis://[:password@]host[:port][/db], \
                     rediss://… or redis+cluster://[:password@]host:port[,host:port…]"
                ))
            })?;
            (url, None)
        }
    };
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(Error::Config(format!(
            "a Redis URL starts with redis://, rediss://, redis+cluster:// or rediss+cluster://, \
             not {}://",
            url.scheme()
        )));
    }
    let mut options = QueryOptions::from_url("Redis", &url)?;
    let namespace = options.string(NAMESPACE_OPTION)?;
    let key_prefix = options.string(KEY_PREFIX_PARAM)?;
    let notify = options.bool("notify")?;
    let tls_files = Box::new(TlsFiles {
        ca_file: options.non_empty("ca_file")?,
        cert_file: options.non_empty("cert_file")?,
        key_file: options.non_empty("key_file")?,
    });
    if tls_files.any() && url.scheme() != "rediss" {
        return Err(Error::Config(
            "Redis URL: ca_file, cert_file and key_file need TLS (rediss://)".into(),
        ));
    }
    if tls_files.cert_file.is_some() != tls_files.key_file.is_some() {
        return Err(Error::Config(
            "Redis URL: a client certificate needs both cert_file and key_file".into(),
        ));
    }
    let rest = options.into_rest();
    if rest.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(rest);
    }
    let shown = match (&cluster_hosts, HostListUrl::split(url.as_str())) {
        (Some(hosts), Some(parts)) => {
            let scheme = format!("{}+cluster", parts.scheme);
            HostListUrl { scheme: &scheme, ..parts }.with_host_list(&hosts.join(","))
        }
        _ => url.as_str().to_owned(),
    };
    Ok(ParsedUrl { url, cluster_hosts, shown, namespace, key_prefix, notify, tls_files })
}

/// Checks a key prefix (the namespace is checked by [`Namespace::new`]; Redis keys take any
/// bytes, so the store adds no limit of its own).
fn validate_key_prefix(key_prefix: &str) -> Result<()> {
    if key_prefix.chars().any(char::is_control) {
        return Err(Error::Config("the key prefix must not contain control characters".into()));
    }
    Ok(())
}

/// Makes `rediss://` work: rustls needs a process-wide crypto provider, and panics at connect
/// time when several are compiled in and none was chosen; pick aws-lc-rs unless one is set.
#[cfg(feature = "tls")]
fn prepare_tls() -> Result<()> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Fails only when another thread installed one first, which is just as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    Ok(())
}

#[cfg(not(feature = "tls"))]
fn prepare_tls() -> Result<()> {
    Err(Error::Config(
        "rediss:// (TLS) needs the `tls` feature of shardlease-redis (or `redis-tls` of shardlease)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_give_up_their_options_and_keep_the_rest() {
        let p =
            parse_url("redis://:pw@h:1/2?namespace=orders&key_prefix=sl&protocol=resp3").unwrap();
        assert_eq!(p.namespace.as_deref(), Some("orders"));
        assert_eq!(p.key_prefix.as_deref(), Some("sl"));
        assert_eq!(p.url.as_str(), "redis://:pw@h:1/2?protocol=resp3");
        let p = parse_url("rediss://h/?namespace=x").unwrap();
        assert_eq!(p.url.as_str(), "rediss://h/");
        for bad in [
            "http://h/",
            "not a url :pw@",
            "redis://:s3cr3t@[bad/",
            "redis://:s3cr3t@h/?namespace=a&namespace=b",
        ] {
            match parse_url(bad) {
                Err(Error::Config(m)) => assert!(!m.contains("s3cr3t"), "{m}"),
                _ => panic!("{bad} must be refused"),
            }
        }
    }

    fn config_error(builder: RedisStoreBuilder) -> String {
        match builder.plan() {
            Err(Error::Config(m)) => m,
            Err(e) => panic!("expected a config error, got {e:?}"),
            Ok(_) => panic!("expected a config error, got a plan"),
        }
    }

    #[test]
    fn bad_input_is_a_config_error_that_never_shows_the_password() {
        let url = "redis://:s3cr3t@127.0.0.1:1/";
        let cases = [
            (RedisStoreBuilder::default(), "url() or connection_manager()"),
            (RedisStore::builder().url("gopher://:s3cr3t@h/"), "redis://"),
            (RedisStore::builder().url(url).namespace(""), "namespace"),
            (RedisStore::builder().url(format!("{url}?namespace=")), "namespace"),
            (RedisStore::builder().url(url).key_prefix("a\nb"), "control characters"),
            (RedisStore::builder().url(url).page_size(0), "page_size"),
            (RedisStore::builder().url(url).response_timeout(Duration::ZERO), "response_timeout"),
            (
                RedisStore::builder().url(url).connection_timeout(Duration::ZERO),
                "connection_timeout",
            ),
        ];
        for (builder, expected) in cases {
            let shown = format!("{builder:?}");
            assert!(!shown.contains("s3cr3t"), "{shown}");
            let m = config_error(builder);
            assert!(m.contains(expected), "{shown}: {m}");
            assert!(!m.contains("s3cr3t"), "{m}");
        }
    }

    #[test]
    fn the_builder_wins_over_the_url_which_wins_over_the_defaults() {
        let url = "redis://:s3cr3t@h:1/2?namespace=a&key_prefix=p&protocol=resp3";
        let plan = RedisStore::builder().url(url).plan().unwrap();
        assert_eq!((plan.namespace.as_str(), plan.key_prefix.as_str()), ("a", "p"));
        assert_eq!(plan.page_size, DEFAULT_PAGE_SIZE);
        let Connection::Open(open) = &plan.connection else { panic!("a URL was given") };
        assert_eq!(open.url.as_str(), "redis://:s3cr3t@h:1/2?protocol=resp3");
        assert_eq!(open.response_timeout, DEFAULT_RESPONSE_TIMEOUT);
        assert_eq!(open.connection_timeout, DEFAULT_CONNECTION_TIMEOUT);

        let plan = RedisStore::builder()
            .namespace("b")
            .key_prefix("q")
            .page_size(3)
            .response_timeout(Duration::from_millis(7))
            .url(url)
            .plan()
            .unwrap();
        assert_eq!((plan.namespace.as_str(), plan.key_prefix.as_str()), ("b", "q"));
        assert_eq!(plan.page_size, 3);
        let Connection::Open(open) = &plan.connection else { panic!("a URL was given") };
        assert_eq!(open.response_timeout, Duration::from_millis(7));

        let plan = RedisStore::builder().url("redis://h").plan().unwrap();
        assert_eq!((plan.namespace.as_str(), plan.key_prefix.as_str()), ("default", "shardlease"));
    }
}
