//! [`EtcdStoreBuilder`]: the one way to open an [`EtcdStore`].
//!
//! The server comes from exactly one of a URL, a list of endpoints, or an `etcd_client::Client`
//! the application built; everything else is an option. A value set on the builder wins over
//! the same option in the URL, whatever the order of the calls. Nothing is checked until
//! [`connect`](EtcdStoreBuilder::connect), which reports every bad input as `Error::Config`
//! (never a panic) without repeating a password.

use std::fmt;
use std::time::Duration;

use etcd_client::Client;
use shardlease_core::store::url::redact_url;
use shardlease_core::store::{Redactor, MASK};
use shardlease_core::{Error, Namespace, Result, DEFAULT_NAMESPACE};

use crate::config::{
    endpoint, UrlSettings, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PAGE_SIZE,
    DEFAULT_REQUEST_TIMEOUT, MAX_PAGE_SIZE, MAX_TIMEOUT,
};
use crate::store::EtcdStore;

/// Builds an [`EtcdStore`]: see [`EtcdStore::builder`].
///
/// ```no_run
/// # async fn demo() -> shardlease_core::Result<()> {
/// use std::time::Duration;
/// use shardlease_etcd::EtcdStore;
/// let store = EtcdStore::builder()
///     .url("etcd://10.0.0.1:2379,10.0.0.2:2379")
///     .namespace("orders")
///     .request_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct EtcdStoreBuilder {
    url: Option<String>,
    endpoints: Option<Vec<String>>,
    client: Option<Client>,
    credentials: Option<(String, String)>,
    tls: Option<bool>,
    ca_file: Option<String>,
    /// Client certificate and key PEM files.
    client_cert: Option<(String, String)>,
    namespace: Option<String>,
    key_prefix: Option<String>,
    page_size: Option<usize>,
    request_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    watch: Option<bool>,
}

impl fmt::Debug for EtcdStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStoreBuilder")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("endpoints", &self.endpoints)
            .field("client", &self.client.as_ref().map(|_| "<given>"))
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("password", &self.credentials.as_ref().map(|_| MASK))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("namespace", &self.namespace)
            .field("key_prefix", &self.key_prefix)
            .field("page_size", &self.page_size)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("watch", &self.watch)
            .finish()
    }
}

/// How the client is opened (when the builder opens it).
pub(crate) struct ConnectSettings {
    /// `host:port` of each endpoint.
    pub(crate) endpoints: Vec<String>,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) tls: bool,
    pub(crate) ca_file: Option<String>,
    /// Client certificate and key PEM files.
    pub(crate) client_cert: Option<(String, String)>,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
}

impl EtcdStoreBuilder {
    /// The server and options as an `etcd://` or `etcds://` URL (see the crate docs for its
    /// form). Options set on the builder win over the URL's.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The server as a list of `host[:port]` endpoints (port 2379 where none is given), instead
    /// of a URL.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = Some(endpoints.into_iter().map(Into::into).collect());
        self
    }

    /// An `etcd_client::Client` the application built (re-exported as
    /// [`etcd_client`](crate::etcd_client)), instead of a URL or endpoints. The connection
    /// options (credentials, TLS, timeouts) are the client's then, and setting them here is an
    /// error.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// User name and password for etcd's authentication. Never printed.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// Connects over TLS (what `etcds://` says); needs the crate's `tls` feature.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A PEM file of the certificate authority to trust for TLS, instead of the system's roots.
    pub fn ca_file(mut self, path: impl Into<String>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// A client certificate for TLS (servers started with `--client-cert-auth`): PEM files of
    /// the certificate and of its key (PKCS#8 or the key's own PEM form).
    pub fn client_certificate(
        mut self,
        cert_file: impl Into<String>,
        key_file: impl Into<String>,
    ) -> Self {
        self.client_cert = Some((cert_file.into(), key_file.into()));
        self
    }

    /// The namespace (application name) the store reads and writes. Default: the URL's
    /// `namespace`, else [`DEFAULT_NAMESPACE`].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The prefix of every key, before the namespace (default [`DEFAULT_KEY_PREFIX`]; not
    /// empty).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Records per range request when listing (default [`DEFAULT_PAGE_SIZE`]; 1 to 2^32 - 1).
    pub fn page_size(mut self, records: usize) -> Self {
        self.page_size = Some(records);
        self
    }

    /// How long one request may take before it fails, retryably (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]; 1 ms to an hour).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// How long connecting may take (default [`DEFAULT_CONNECT_TIMEOUT`]; 1 ms to an hour).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Change notification through an etcd watch (see `LeaseStore::subscribe_changes`); on by
    /// default, `false` makes the worker run as on any other store.
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Checks the settings, connects (unless a client was given) and returns the store. Fails
    /// with `Error::Config` for bad input and `Error::Backend` when the server cannot be
    /// reached (retryable) or refuses the credentials (permanent); no message holds the
    /// password.
    pub async fn connect(self) -> Result<EtcdStore> {
        let plan = self.plan()?;
        let (client, redactor) = match plan.connection {
            Connection::Given(client) => (*client, Redactor::default()),
            Connection::Open(settings) => {
                let redactor = match &settings.credentials {
                    Some((_, password)) => Redactor::new([password.as_str()]),
                    None => Redactor::default(),
                };
                (crate::connection::connect(&settings, &redactor).await?, redactor)
            }
        };
        Ok(EtcdStore::assemble(
            client,
            plan.namespace,
            &plan.key_prefix,
            plan.page_size,
            plan.watch,
            redactor,
        ))
    }

    /// Everything checked, the builder's values laid over the URL's and the defaults.
    fn plan(self) -> Result<Plan> {
        let from_url = match (&self.url, &self.endpoints, &self.client) {
            (Some(url), None, None) => UrlSettings::parse(url)?,
            (None, Some(list), None) => UrlSettings {
                endpoints: list.iter().map(|e| endpoint(e)).collect::<Result<_>>()?,
                ..UrlSettings::default()
            },
            (None, None, Some(_)) => UrlSettings::default(),
            (None, None, None) => {
                return Err(Error::Config(
                    "etcd store builder: name the server with url(), endpoints() or client()"
                        .into(),
                ))
            }
            _ => {
                return Err(Error::Config(
                    "etcd store builder: give only one of url(), endpoints() and client()".into(),
                ))
            }
        };
        let namespace = self.namespace.or(from_url.namespace);
        let namespace = Namespace::new(namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE))?;
        let key_prefix =
            self.key_prefix.or(from_url.key_prefix).unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
        if key_prefix.is_empty() {
            return Err(Error::Config("etcd store builder: the key prefix is empty".into()));
        }
        let page_size = self.page_size.or(from_url.page_size).unwrap_or(DEFAULT_PAGE_SIZE);
        if page_size == 0 || page_size as u64 > MAX_PAGE_SIZE {
            return Err(Error::Config(format!(
                "etcd store builder: page_size must be 1 to {MAX_PAGE_SIZE}, not {page_size}"
            )));
        }
        let watch = self.watch.or(from_url.watch).unwrap_or(true);
        let connection = match self.client {
            Some(client) => {
                let connection_options = [
                    ("credentials", self.credentials.is_some()),
                    ("tls", self.tls.is_some()),
                    ("ca_file", self.ca_file.is_some()),
                    ("client_certificate", self.client_cert.is_some()),
                    ("request_timeout", self.request_timeout.is_some()),
                    ("connect_timeout", self.connect_timeout.is_some()),
                ];
                if let Some((name, _)) = connection_options.iter().find(|(_, set)| *set) {
                    return Err(Error::Config(format!(
                        "etcd store builder: {name}() configures a connection the store opens; \
                         with client() that is the client's own"
                    )));
                }
                Connection::Given(Box::new(client))
            }
            None => Connection::Open(ConnectSettings {
                endpoints: from_url.endpoints,
                credentials: self.credentials.or(from_url.credentials),
                tls: self.tls.or(from_url.tls).unwrap_or(false),
                ca_file: self.ca_file.or(from_url.ca_file),
                client_cert: self.client_cert.or(from_url.client_cert),
                request_timeout: timeout(
                    "request_timeout",
                    self.request_timeout.or(from_url.request_timeout),
                    DEFAULT_REQUEST_TIMEOUT,
                )?,
                connect_timeout: timeout(
                    "connect_timeout",
                    self.connect_timeout.or(from_url.connect_timeout),
                    DEFAULT_CONNECT_TIMEOUT,
                )?,
            }),
        };
        if let Connection::Open(settings) = &connection {
            if settings.endpoints.is_empty() {
                return Err(Error::Config("etcd store builder: the endpoint list is empty".into()));
            }
            if settings.credentials.as_ref().is_some_and(|(user, _)| user.is_empty()) {
                return Err(Error::Config("etcd: a password needs a user name".into()));
            }
        }
        Ok(Plan { namespace, key_prefix, page_size, watch, connection })
    }
}

/// What [`EtcdStoreBuilder::connect`] does, every value checked.
struct Plan {
    namespace: Namespace,
    key_prefix: String,
    page_size: usize,
    watch: bool,
    connection: Connection,
}

/// Where the client comes from.
enum Connection {
    /// The application's (boxed: a client with TLS is a few kilobytes).
    Given(Box<Client>),
    /// Opened by the store.
    Open(ConnectSettings),
}

/// `given` (or `default`) checked to be from 1 ms to an hour.
fn timeout(name: &str, given: Option<Duration>, default: Duration) -> Result<Duration> {
    let d = given.unwrap_or(default);
    if d < Duration::from_millis(1) || d > MAX_TIMEOUT {
        return Err(Error::Config(format!(
            "etcd store builder: {name} must be from 1 ms to an hour, not {d:?}"
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(builder: EtcdStoreBuilder) -> String {
        match builder.plan() {
            Err(Error::Config(m)) => m,
            Err(e) => panic!("expected a config error, got {e:?}"),
            Ok(_) => panic!("expected a config error, got a plan"),
        }
    }

    fn open(builder: EtcdStoreBuilder) -> Plan {
        builder.plan().unwrap_or_else(|e| panic!("{e}"))
    }

    fn settings(plan: &Plan) -> &ConnectSettings {
        match &plan.connection {
            Connection::Open(settings) => settings,
            Connection::Given(_) => panic!("no client was given"),
        }
    }

    #[test]
    fn bad_input_is_a_config_error_that_never_shows_the_password() {
        let url = "etcd://u:hunter2@127.0.0.1:1";
        let cases = [
            (EtcdStoreBuilder::default(), "url(), endpoints() or client()"),
            (EtcdStore::builder().url(url).endpoints(["h"]), "only one of"),
            (EtcdStore::builder().endpoints(Vec::<String>::new()), "endpoint list is empty"),
            (EtcdStore::builder().endpoints(["h/x"]), "malformed host"),
            (EtcdStore::builder().endpoints(["h:99999"]), "port"),
            (EtcdStore::builder().url("http://u:hunter2@h"), "etcd://"),
            (EtcdStore::builder().url(url).namespace(""), "namespace"),
            (EtcdStore::builder().url(url).key_prefix(""), "key prefix"),
            (EtcdStore::builder().url(url).page_size(0), "page_size"),
            (EtcdStore::builder().url(url).request_timeout(Duration::ZERO), "request_timeout"),
            (
                EtcdStore::builder().url(url).connect_timeout(Duration::from_secs(7200)),
                "connect_timeout",
            ),
            (EtcdStore::builder().endpoints(["h"]).credentials("", "hunter2"), "user name"),
        ];
        for (builder, expected) in cases {
            let shown = format!("{builder:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            let m = config_error(builder);
            assert!(m.contains(expected), "{shown}: {m}");
            assert!(!m.contains("hunter2"), "{m}");
        }
    }

    #[test]
    fn the_builder_wins_over_the_url_which_wins_over_the_defaults() {
        let url = "etcds://app:s3cr3t@h1,h2:2380?namespace=a&watch=false&page_size=7&timeout_ms=9";
        let plan = open(EtcdStore::builder().url(url));
        let settings = settings(&plan);
        assert_eq!(plan.namespace.as_str(), "a");
        assert_eq!(
            (plan.key_prefix.as_str(), plan.page_size, plan.watch),
            ("shardlease", 7, false)
        );
        assert_eq!(settings.endpoints, ["h1:2379", "h2:2380"]);
        assert_eq!(settings.credentials, Some(("app".into(), "s3cr3t".into())));
        assert_eq!((settings.tls, settings.request_timeout), (true, Duration::from_millis(9)));
        assert_eq!(settings.connect_timeout, DEFAULT_CONNECT_TIMEOUT);

        let builder = EtcdStore::builder()
            .watch(true)
            .page_size(3)
            .namespace("b")
            .key_prefix("p")
            .credentials("other", "s3cr3t-too")
            .tls(false)
            .request_timeout(Duration::from_secs(1))
            .url(url);
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("etcds://app:***@h1,h2:2380") && shown.contains("other"), "{shown}");
        let plan = open(builder);
        let settings = self::settings(&plan);
        assert_eq!((plan.namespace.as_str(), plan.key_prefix.as_str()), ("b", "p"));
        assert_eq!((plan.page_size, plan.watch, settings.tls), (3, true, false));
        assert_eq!(settings.credentials, Some(("other".into(), "s3cr3t-too".into())));
        assert_eq!(settings.request_timeout, Duration::from_secs(1));

        let plan = open(EtcdStore::builder().endpoints(["10.0.0.1", "[::1]:2380"]));
        let settings = self::settings(&plan);
        assert_eq!(settings.endpoints, ["10.0.0.1:2379", "[::1]:2380"]);
        assert_eq!(plan.namespace.as_str(), DEFAULT_NAMESPACE);
        assert_eq!((plan.page_size, plan.watch, settings.tls), (DEFAULT_PAGE_SIZE, true, false));
        assert_eq!(settings.request_timeout, DEFAULT_REQUEST_TIMEOUT);
    }
}
