//! The `etcd://` URL that spells an etcd store's settings, its defaults and bounds.
//!
//! `etcd://[user:password@]host[:port][,host[:port]...][/][?options]` (`etcds://` for TLS). The
//! `url` crate cannot parse a host list, so the URL is taken apart by core's
//! [`HostListUrl`]; the password is percent-decoded, and it never appears in an error, a log
//! line or `Debug` output (see [`redact_url`]). The builder (`builder.rs`) lays what it is told
//! over what the URL says.

use std::time::Duration;

use shardlease_core::store::url::{percent_decode, HostListUrl, QueryOptions, NAMESPACE_OPTION};
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

/// The longest timeout a URL or the builder may set (an hour), in milliseconds.
const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// The same, as a duration.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_millis(MAX_TIMEOUT_MS);
/// The most records per range request a URL or the builder may ask for.
pub(crate) const MAX_PAGE_SIZE: u64 = u32::MAX as u64;

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
    "cert_file",
    "key_file",
    "watch",
];

/// What an `etcd://` URL sets: every field is `None` where the URL says nothing, so the builder
/// can tell its own values, the URL's and the defaults apart.
#[derive(Default, PartialEq)]
pub(crate) struct UrlSettings {
    /// `host:port` of each endpoint (the default port added where none is given).
    pub(crate) endpoints: Vec<String>,
    /// User name and password (percent-decoded).
    pub(crate) credentials: Option<(String, String)>,
    /// `true` for `etcds://`; `tls=` otherwise.
    pub(crate) tls: Option<bool>,
    pub(crate) ca_file: Option<String>,
    /// `cert_file` and `key_file`: a client certificate.
    pub(crate) client_cert: Option<(String, String)>,
    pub(crate) namespace: Option<String>,
    pub(crate) key_prefix: Option<String>,
    pub(crate) page_size: Option<usize>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) watch: Option<bool>,
}

impl UrlSettings {
    /// Parses an `etcd://` or `etcds://` URL. Errors never repeat the URL (it may hold a
    /// password).
    pub(crate) fn parse(url: &str) -> Result<UrlSettings> {
        let parts = HostListUrl::split(url)
            .filter(|p| p.scheme == "etcd" || p.scheme == "etcds")
            .ok_or_else(|| {
            Error::Config("an etcd store URL starts with etcd:// or etcds://".into())
        })?;
        let tail = parts.tail.split('#').next().unwrap_or_default();
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        if !matches!(path, "" | "/") {
            return Err(Error::Config(
                "an etcd store URL has no path; name the namespace with ?namespace=".into(),
            ));
        }
        let mut o = UrlSettings::default();
        if parts.scheme == "etcds" {
            o.tls = Some(true);
        }
        if let Some(userinfo) = parts.userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let user = percent_decode(user);
            if user.is_empty() {
                return Err(Error::Config("etcd URL: a password needs a user name".into()));
            }
            o.credentials = Some((user, percent_decode(password)));
        }
        o.endpoints = parts.hosts().map(endpoint).collect::<Result<_>>()?;
        let mut q = QueryOptions::parse("etcd", query)?;
        o.namespace = q.string(NAMESPACE_OPTION)?;
        let prefix = q.non_empty("prefix")?;
        let key_prefix = q.non_empty("key_prefix")?;
        if prefix.is_some() && key_prefix.is_some() {
            return Err(Error::Config(
                "etcd URL: give the key prefix once, as prefix= (key_prefix= is its alias)".into(),
            ));
        }
        o.key_prefix = prefix.or(key_prefix);
        o.page_size = q
            .integer("page_size", 1..=MAX_PAGE_SIZE)?
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        o.request_timeout = q.millis("timeout_ms", 1..=MAX_TIMEOUT_MS)?;
        o.connect_timeout = q.millis("connect_timeout_ms", 1..=MAX_TIMEOUT_MS)?;
        if let Some(tls) = q.bool("tls")? {
            o.tls = Some(tls);
        }
        o.ca_file = q.string("ca_file")?;
        o.client_cert = match (q.non_empty("cert_file")?, q.non_empty("key_file")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(Error::Config(
                    "etcd URL: a client certificate needs both cert_file and key_file".into(),
                ))
            }
        };
        o.watch = q.bool("watch")?;
        q.finish(OPTIONS)?;
        Ok(o)
    }
}

/// `host[:port]` checked, with the default port added.
pub(crate) fn endpoint(host: &str) -> Result<String> {
    if host.is_empty() {
        return Err(Error::Config("etcd: an empty host in the host list".into()));
    }
    if host.contains(['/', '@', ' ', ',', '?', '#']) {
        return Err(Error::Config("etcd: a malformed host in the host list".into()));
    }
    let has_port = match host.rsplit_once(':') {
        // `[::1]:2379`, `host:2379`; a bare `[::1]` or an IPv6 address without brackets has none.
        Some((h, p)) => !h.is_empty() && !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()),
        None => false,
    };
    if has_port {
        let port = host.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
        port.parse::<u16>()
            .map_err(|_| Error::Config("etcd: a port is not a number 0-65535".into()))?;
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
        let o = UrlSettings::parse(
            "etcd://app:p%40ss%2Bw@10.0.0.1:2379,10.0.0.2,[::1]:2380/?namespace=orders&prefix=x&\
             page_size=7&timeout_ms=1500&watch=false",
        )
        .unwrap();
        assert_eq!(o.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379", "[::1]:2380"]);
        assert_eq!(o.credentials, Some(("app".to_owned(), "p@ss+w".to_owned())));
        assert_eq!(o.namespace.as_deref(), Some("orders"));
        assert_eq!(o.key_prefix.as_deref(), Some("x"));
        assert_eq!(o.page_size, Some(7));
        assert_eq!(o.request_timeout, Some(Duration::from_millis(1500)));
        assert_eq!((o.watch, o.tls, o.connect_timeout), (Some(false), None, None));
        assert_eq!(UrlSettings::parse("etcds://h").unwrap().tls, Some(true));
        assert_eq!(UrlSettings::parse("etcds://h?tls=false").unwrap().tls, Some(false));
        let bare = UrlSettings::parse("etcd://h/#fragment").unwrap();
        assert_eq!(bare.endpoints, ["h:2379"]);
        let defaults = UrlSettings { endpoints: bare.endpoints.clone(), ..UrlSettings::default() };
        assert!(bare == defaults, "a bare URL sets nothing but its endpoint");
    }

    #[test]
    fn malformed_urls_are_config_errors_that_never_echo_the_password() {
        for bad in [
            "etcd://u:hunter2@",
            "etcd://u:hunter2@h:99999",
            "etcd://u:hunter2@h/ns",
            "etcd://u:hunter2@h,",
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
            match UrlSettings::parse(bad) {
                Err(Error::Config(m)) => assert!(!m.contains("hunter2"), "{bad}: {m}"),
                Err(e) => panic!("{bad}: expected a config error, got {e:?}"),
                Ok(_) => panic!("{bad}: expected a config error, got settings"),
            }
        }
    }

    #[test]
    fn endpoints_get_the_default_port() {
        assert_eq!(endpoint("h").unwrap(), "h:2379");
        assert_eq!(endpoint("h:1").unwrap(), "h:1");
        assert_eq!(endpoint("[::1]").unwrap(), "[::1]:2379");
        assert_eq!(endpoint("[::1]:2380").unwrap(), "[::1]:2380");
        for bad in ["", "h:70000", "h/x", "a,b", "u@h", "h h"] {
            assert!(matches!(endpoint(bad), Err(Error::Config(_))), "{bad:?}");
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
