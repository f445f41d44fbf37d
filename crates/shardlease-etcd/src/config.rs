//! The connection settings of an etcd store, and the `etcd://` URL that spells them.
//!
//! `etcd://[user:password@]host[:port][,host[:port]...][/][?options]` (`etcds://` for TLS). The
//! `url` crate cannot parse a host list, so the URL is taken apart here by hand; the password is
//! percent-decoded, and it never appears in an error, a log line or `Debug` output (see
//! [`redact_url`]).

use std::fmt;
use std::time::Duration;

use shardlease_core::redact::{Redactor, MASK};
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
        for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match k.as_ref() {
                "namespace" => o.namespace = Some(v.into_owned()),
                "prefix" | "key_prefix" => o.key_prefix = v.into_owned(),
                "page_size" => o.page_size = number(&k, &v)?.max(1) as usize,
                "timeout_ms" => o.request_timeout = Duration::from_millis(number(&k, &v)?.max(1)),
                "connect_timeout_ms" => {
                    o.connect_timeout = Duration::from_millis(number(&k, &v)?.max(1))
                }
                "tls" => o.tls = flag(&k, &v)?,
                "ca_file" => o.ca_file = Some(v.into_owned()),
                "watch" => o.watch = flag(&k, &v)?,
                other => {
                    return Err(Error::Config(format!(
                        "etcd URL: unknown option `{other}` (known: namespace, prefix, \
                         page_size, timeout_ms, connect_timeout_ms, tls, ca_file, watch)"
                    )))
                }
            }
        }
        if o.key_prefix.is_empty() {
            return Err(Error::Config("etcd URL: prefix must not be empty".into()));
        }
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

fn number(key: &str, v: &str) -> Result<u64> {
    v.parse().map_err(|_| Error::Config(format!("etcd URL: `{key}` must be a whole number")))
}

fn flag(key: &str, v: &str) -> Result<bool> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::Config(format!("etcd URL: `{key}` must be true or false"))),
    }
}

/// Decodes `%XX` escapes; anything malformed is kept as it is.
fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// `url` with the password of an `etcd://` or `etcds://` URL replaced by `***`, for logs and
/// messages. Anything that is not such a URL is replaced whole (it may hold a password in a shape
/// this function cannot find).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "<unparseable URL>".into() };
    if scheme != "etcd" && scheme != "etcds" {
        return "<unparseable URL>".into();
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map(|(u, _)| u).unwrap_or(userinfo);
            format!("{scheme}://{user}:{MASK}@{hosts}{tail}")
        }
        None => url.to_owned(),
    }
}

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
