//! The connection settings of an etcd store, and the `etcd://` URL that spells them.
//!
//! `etcd://[user:password@]host[:port][,host[:port]...][/][?options]` (`etcds://` for TLS). The
//! `url` crate cannot parse a host list, so the URL is taken apart here by hand; the password is
//! percent-decoded, and it never appears in an error, a log line or `Debug` output (see
//! [`redact_url`]).

use std::fmt;
use std::time::Duration;

use shardlease_core::store::url::{percent_decode, QueryOptions, NAMESPACE_OPTION};
use shardlease_core::store::{Redactor, MASK};
use shardlease_core::{Error, Result};

/// The etcd client port used when a host names none.
pub const DEFAULT_PORT: u16 = 2379;
/// The key prefix of every record, before the namespace.
pub const DEFAULT_KEY_PREFIX: &str = "shardlease";
/// Records read per range request when listing.
pub const DEFAULT_PAGE_SIZE: usize = 500;
/// How long one request may take before it fails (retryable).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest timeout a URL may set (an hour), in milliseconds.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The options of an `etcd://` URL.
const OPTIONS: &[&str] = &[
    "namespace",
    "prefix",
    "key_prefix",
    "page_size",
    "timeout_ms",
    "connect_timeout_ms",
    "tls",
    "ca_file",
    "watch",
];

/// Everything needed to open an etcd store.
#[derive(Clone)]
pub struct EtcdOptions {
    /// `host:port` of each endpoint.
    pub endpoints: Vec<String>,
    /// User name and password for etcd's authentication, if any.
    pub credentials: Option<(String, String)>,
    /// Whether to connect over TLS (`etcds://` or `tls=true`; needs the crate's `tls` feature).
    pub tls: bool,
    /// A PEM file of the certificate authority to trust for TLS (`ca_file=`); the system roots
    /// otherwise.
    pub ca_file: Option<String>,
    /// The namespace named by the URL (`namespace=`), if any.
    pub namespace: Option<String>,
    /// The key prefix (`prefix=`).
    pub key_prefix: String,
    /// Records per range request (`page_size=`).
    pub page_size: usize,
    /// Per-request timeout (`timeout_ms=`).
    pub request_timeout: Duration,
    /// Connect timeout (`connect_timeout_ms=`).
    pub connect_timeout: Duration,
    /// Whether the store offers change notification (`watch=false` turns it off).
    pub watch: bool,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            credentials: None,
            tls: false,
            ca_file: None,
            namespace: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            page_size: DEFAULT_PAGE_SIZE,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            watch: true,
        }
    }
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("password", &self.credentials.as_ref().map(|_| MASK))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("namespace", &self.namespace)
            .field("key_prefix", &self.key_prefix)
            .field("page_size", &self.page_size)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("watch", &self.watch)
            .finish()
    }
}

impl EtcdOptions {
    /// Parses an `etcd://` or `etcds://` URL. Errors never repeat the URL (it may hold a
    /// password).
    pub fn from_url(url: &str) -> Result<EtcdOptions> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else {
            return Err(Error::Config("an etcd store URL starts with etcd:// or etcds://".into()));
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = match before_query.split_once('/') {
            Some((a, "")) => a,
            Some(_) => {
                return Err(Error::Config(
                    "an etcd store URL has no path; name the namespace with ?namespace=".into(),
                ))
            }
            None => before_query,
        };
        let mut o = EtcdOptions { tls, ..EtcdOptions::default() };
        let hosts = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let user = percent_decode(user);
                if user.is_empty() {
                    return Err(Error::Config("etcd URL: a password needs a user name".into()));
                }
                o.credentials = Some((user, percent_decode(password)));
                hosts
            }
            None => authority,
        };
        o.endpoints = hosts.split(',').map(endpoint).collect::<Result<_>>()?;
        let mut q = QueryOptions::parse("etcd", query.unwrap_or(""))?;
        o.namespace = q.string(NAMESPACE_OPTION)?;
        let prefix = q.non_empty("prefix")?;
        let key_prefix = q.non_empty("key_prefix")?;
        if prefix.is_some() && key_prefix.is_some() {
            return Err(Error::Config(
                "etcd URL: give the key prefix once, as prefix= (key_prefix= is its alias)".into(),
            ));
        }
        if let Some(p) = prefix.or(key_prefix) {
            o.key_prefix = p;
        }
        if let Some(n) = q.integer("page_size", 1..=u64::from(u32::MAX))? {
            o.page_size = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(d) = q.millis("timeout_ms", 1..=MAX_TIMEOUT_MS)? {
            o.request_timeout = d;
        }
        if let Some(d) = q.millis("connect_timeout_ms", 1..=MAX_TIMEOUT_MS)? {
            o.connect_timeout = d;
        }
        o.tls = q.bool("tls")?.unwrap_or(o.tls);
        o.ca_file = q.string("ca_file")?;
        o.watch = q.bool("watch")?.unwrap_or(o.watch);
        q.finish(OPTIONS)?;
        Ok(o)
    }

    /// A redactor for this configuration's password.
    pub(crate) fn redactor(&self) -> Redactor {
        match &self.credentials {
            Some((_, p)) => Redactor::new([p.as_str()]),
            None => Redactor::default(),
        }
    }
}

/// `host[:port]` checked, with the default port added.
fn endpoint(host: &str) -> Result<String> {
    if host.is_empty() {
        return Err(Error::Config("etcd URL: an empty host in the host list".into()));
    }
    if host.contains(['/', '@', ' ']) {
        return Err(Error::Config("etcd URL: a malformed host in the host list".into()));
    }
    let has_port = match host.rsplit_once(':') {
        // `[::1]:2379`, `host:2379`; a bare `[::1]` or an IPv6 address without brackets has none.
        Some((h, p)) => !h.is_empty() && !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()),
        None => false,
    };
    if has_port {
        let port = host.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
        port.parse::<u16>()
            .map_err(|_| Error::Config("etcd URL: a port is not a number 0-65535".into()))?;
        Ok(host.to_owned())
    } else {
        Ok(format!("{host}:{DEFAULT_PORT}"))
    }
}

/// `url` with its password masked, for logs and messages (core's, the one every store uses;
/// it keeps an etcd host list as written).
pub use shardlease_core::store::url::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_credentials_and_options_parse() {
        let o = EtcdOptions::from_url(
            "etcd://app:p%40ss%2Bw@10.0.0.1:2379,10.0.0.2,[::1]:2380/?namespace=orders&prefix=x&\
             page_size=7&timeout_ms=1500&watch=false",
        )
        .unwrap();
        assert_eq!(o.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379", "[::1]:2380"]);
        assert_eq!(o.credentials, Some(("app".to_owned(), "p@ss+w".to_owned())));
        assert_eq!(o.namespace.as_deref(), Some("orders"));
        assert_eq!(o.key_prefix, "x");
        assert_eq!(o.page_size, 7);
        assert_eq!(o.request_timeout, Duration::from_millis(1500));
        assert!(!o.watch && !o.tls);
        let debug = format!("{o:?}");
        assert!(!debug.contains("p@ss") && debug.contains("***"), "{debug}");
        assert!(EtcdOptions::from_url("etcds://h").unwrap().tls);
    }

    #[test]
    fn malformed_urls_are_config_errors_that_never_echo_the_password() {
        for bad in [
            "etcd://u:hunter2@",
            "etcd://u:hunter2@h:99999",
            "etcd://u:hunter2@h/ns",
            "etcd://u:hunter2@h?bogus=1",
            "etcd://:hunter2@h",
            "etcd://u:hunter2@h?watch=maybe",
            "etcd://u:hunter2@h?page_size=0",
            "etcd://u:hunter2@h?timeout_ms=x",
            "etcd://u:hunter2@h?namespace=a&namespace=b",
            "etcd://u:hunter2@h?prefix=a&key_prefix=b",
            "etcd://u:hunter2@h?prefix=",
            "http://u:hunter2@h",
        ] {
            match EtcdOptions::from_url(bad) {
                Err(Error::Config(m)) => assert!(!m.contains("hunter2"), "{bad}: {m}"),
                other => panic!("{bad}: expected a config error, got {other:?}"),
            }
        }
    }

    #[test]
    fn redact_url_hides_only_the_password() {
        assert_eq!(
            redact_url("etcd://app:s3cr3t@h1:2379,h2:2379/?namespace=a"),
            "etcd://app:***@h1:2379,h2:2379/?namespace=a"
        );
        assert_eq!(redact_url("etcd://h1:2379"), "etcd://h1:2379");
        assert_eq!(redact_url("garbage s3cr3t"), "<unparseable URL>");
    }
}
