//! Store URLs: their query options, their namespace, and their redacted form.
//!
//! Every backend is opened from a URL whose query carries shardlease options (`namespace=`,
//! `page_size=`, ...), and some of them hand what is left to a driver. [`QueryOptions`] takes
//! the options out one typed call at a time, so every store parses, bounds and reports them the
//! same way: a duplicate is refused, a backend that owns the whole query refuses unknown names
//! (listing the known ones), and no error ever repeats a password. [`redact_url`] is the one
//! way a URL is shown in logs and messages.

use std::ops::RangeInclusive;
use std::time::Duration;

use url::Url;

use crate::error::{Error, Result};
use crate::ids::{Namespace, DEFAULT_NAMESPACE};
use crate::redact::{Redactor, MASK};

/// The query parameter naming the namespace, in every store URL.
pub const NAMESPACE_OPTION: &str = "namespace";

/// What a URL that cannot be shown safely is replaced by.
const UNPARSEABLE: &str = "<unparseable URL>";

/// Whether a query parameter called `name` may carry a secret (a password, a key, a token), so
/// its value is masked by [`redact_url`] and never quoted in an error.
pub fn is_secret_option(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "key", "credential", "auth"].iter().any(|s| name.contains(s))
}

/// The query options of a store URL, taken out one by one.
///
/// ```
/// use shardlease_core::store::url::QueryOptions;
/// let mut q = QueryOptions::parse("etcd", "namespace=orders&page_size=50&watch=false").unwrap();
/// assert_eq!(q.string("namespace").unwrap().as_deref(), Some("orders"));
/// assert_eq!(q.integer("page_size", 1..=10_000).unwrap(), Some(50));
/// assert_eq!(q.bool("watch").unwrap(), Some(false));
/// q.finish(&["namespace", "page_size", "watch"]).unwrap();
/// ```
#[derive(Clone)]
pub struct QueryOptions {
    /// Which store the URL is for, as messages name it ("etcd", "Redis", ...).
    store: String,
    /// The decoded pairs not taken yet, in URL order.
    pairs: Vec<(String, String)>,
}

impl std::fmt::Debug for QueryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<(&str, &str)> = self
            .pairs
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret_option(k) { MASK } else { v.as_str() }))
            .collect();
        f.debug_struct("QueryOptions").field("store", &self.store).field("pairs", &shown).finish()
    }
}

impl QueryOptions {
    /// The options of `query` (the part after `?`, form-encoded) of a `store` URL.
    pub fn parse(store: &str, query: &str) -> Result<QueryOptions> {
        let pairs = url::form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Ok(QueryOptions { store: store.to_owned(), pairs })
    }

    /// The options of a parsed URL's query.
    pub fn from_url(store: &str, url: &Url) -> Result<QueryOptions> {
        QueryOptions::parse(store, url.query().unwrap_or(""))
    }

    /// The options of the query of `url`, a string that need not parse as a [`Url`] (an etcd
    /// host list, `sqlite::memory:`): everything after the first `?`, up to a `#`.
    pub fn of_raw_url(store: &str, url: &str) -> Result<QueryOptions> {
        let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
        QueryOptions::parse(store, query.split('#').next().unwrap_or(""))
    }

    fn error(&self, name: &str, what: impl std::fmt::Display) -> Error {
        Error::Config(format!("{} URL option `{}` {what}", self.store, shown_name(name)))
    }

    /// How a value is quoted in an error: masked when its name suggests a secret.
    fn shown_value(name: &str, value: &str) -> String {
        if is_secret_option(name) {
            MASK.to_owned()
        } else {
            format!("{:?}", value.chars().take(40).collect::<String>())
        }
    }

    /// Removes and returns the value of `name`, refusing a name given twice.
    fn take(&mut self, name: &str) -> Result<Option<String>> {
        let mut found = self.pairs.iter().filter(|(k, _)| k == name);
        if found.next().is_some() && found.next().is_some() {
            return Err(self.error(name, "is given more than once"));
        }
        let at = self.pairs.iter().position(|(k, _)| k == name);
        Ok(at.map(|i| self.pairs.remove(i).1))
    }

    /// A string option, as given (possibly empty).
    pub fn string(&mut self, name: &str) -> Result<Option<String>> {
        self.take(name)
    }

    /// A string option that must not be empty when given.
    pub fn non_empty(&mut self, name: &str) -> Result<Option<String>> {
        match self.take(name)? {
            Some(v) if v.is_empty() => Err(self.error(name, "must not be empty")),
            other => Ok(other),
        }
    }

    /// A flag: `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off` (any case).
    pub fn bool(&mut self, name: &str) -> Result<Option<bool>> {
        let Some(v) = self.take(name)? else { return Ok(None) };
        match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Some(true)),
            "false" | "0" | "no" | "off" => Ok(Some(false)),
            _ => Err(self.error(
                name,
                format_args!("must be true or false, not {}", Self::shown_value(name, &v)),
            )),
        }
    }

    /// A whole number within `bounds`.
    pub fn integer(&mut self, name: &str, bounds: RangeInclusive<u64>) -> Result<Option<u64>> {
        let Some(v) = self.take(name)? else { return Ok(None) };
        match v.parse::<u64>() {
            Ok(n) if bounds.contains(&n) => Ok(Some(n)),
            _ => Err(self.error(
                name,
                format_args!(
                    "must be a whole number from {} to {}, not {}",
                    bounds.start(),
                    bounds.end(),
                    Self::shown_value(name, &v)
                ),
            )),
        }
    }

    /// A duration given in whole milliseconds, within `bounds` (in milliseconds).
    pub fn millis(&mut self, name: &str, bounds: RangeInclusive<u64>) -> Result<Option<Duration>> {
        Ok(self.integer(name, bounds)?.map(Duration::from_millis))
    }

    /// The `namespace` option, checked by [`Namespace::new`].
    pub fn namespace(&mut self) -> Result<Option<Namespace>> {
        self.take(NAMESPACE_OPTION)?.map(Namespace::new).transpose()
    }

    /// Ends parsing for a store that owns the whole query: any option not taken is refused, and
    /// the message lists `known`.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        match self.pairs.first() {
            None => Ok(()),
            Some((name, _)) => Err(Error::Config(format!(
                "{} URL: unknown option `{}` (known: {})",
                self.store,
                shown_name(name),
                known.join(", ")
            ))),
        }
    }

    /// Ends parsing for a store that hands the rest of the query to its driver: the options not
    /// taken, in URL order.
    pub fn into_rest(self) -> Vec<(String, String)> {
        self.pairs
    }
}

/// An option name as quoted in a message (bounded, since it is user text).
fn shown_name(name: &str) -> String {
    name.chars().take(40).filter(|c| !c.is_control()).collect()
}

/// The namespace a store URL names with `?namespace=`, or [`DEFAULT_NAMESPACE`], checked.
/// `url` need not parse as a [`Url`] (an etcd host list, `sqlite::memory:`); only its query
/// is read, and nothing of it is repeated in an error.
pub fn namespace_of(url: &str) -> Result<Namespace> {
    let mut q = QueryOptions::of_raw_url("store", url)?;
    match q.namespace()? {
        Some(ns) => Ok(ns),
        None => Namespace::new(DEFAULT_NAMESPACE),
    }
}

/// `url` with every secret replaced by `***`, for logs and messages: the password, a
/// `dynamodb://` user name (an AWS access key id), and the value of every query parameter whose
/// name suggests a secret ([`is_secret_option`]). An etcd host list (`etcd://h1,h2`) is kept as
/// written; any other string that does not parse is replaced whole, as it may hold a secret in
/// a shape this function cannot find.
///
/// ```
/// use shardlease_core::store::url::redact_url;
/// assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
/// assert_eq!(redact_url("mysql://u@h/db?password=s3cret"), "mysql://u@h/db?password=***");
/// assert_eq!(redact_url("dynamodb://AKID:sk@t?region=r"), "dynamodb://***:***@t?region=r");
/// ```
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => redact_parsed(parsed),
        Err(_) => redact_host_list(url).unwrap_or_else(|| UNPARSEABLE.to_owned()),
    }
}

fn redact_parsed(mut u: Url) -> String {
    if u.password().is_some() {
        // Fails only for URLs that cannot have credentials, which have no password.
        let _ = u.set_password(Some(MASK));
    }
    if u.scheme() == "dynamodb" && !u.username().is_empty() {
        let _ = u.set_username(MASK);
    }
    if u.query_pairs().any(|(k, _)| is_secret_option(&k)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_option(&k) { MASK.to_owned() } else { v.into_owned() };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// `scheme://[userinfo@]h1,h2[/...]`, which [`Url`] cannot parse: redacted with a stand-in for
/// the host list, which is then put back (a host list holds no secret).
fn redact_host_list(url: &str) -> Option<String> {
    const STAND_IN: &str = "host-list.invalid";
    let parts = HostListUrl::split(url)?;
    if parts.hosts().count() < 2 || parts.host_list.contains(['@', ' ']) {
        return None;
    }
    let redacted = redact_parsed(Url::parse(&parts.with_host_list(STAND_IN)).ok()?);
    let at = redacted.find(STAND_IN)?;
    Some(format!("{}{}{}", &redacted[..at], parts.host_list, &redacted[at + STAND_IN.len()..]))
}

/// A URL whose authority may list several hosts, `scheme://[userinfo@]h1[:port],h2[:port][tail]`
/// (an `etcd://` cluster), taken apart by hand since [`Url`] cannot parse a host list. This is
/// the one place such a URL is split: the etcd store reads its endpoints from it, the facade
/// its scheme and query, [`redact_url`] everything but the hosts.
///
/// ```
/// use shardlease_core::store::url::HostListUrl;
/// let u = HostListUrl::split("etcd://app:pw@h1:2379,h2/?namespace=a").unwrap();
/// assert_eq!((u.scheme, u.userinfo, u.tail), ("etcd", Some("app:pw"), "/?namespace=a"));
/// assert_eq!(u.hosts().collect::<Vec<_>>(), ["h1:2379", "h2"]);
/// assert_eq!(u.with_host_list("h1:2379"), "etcd://app:pw@h1:2379/?namespace=a");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostListUrl<'a> {
    /// The scheme, before `://`.
    pub scheme: &'a str,
    /// What comes before the last `@` of the authority (`user:password`, still percent-encoded).
    pub userinfo: Option<&'a str>,
    /// The comma-separated hosts, as written (possibly empty).
    pub host_list: &'a str,
    /// Everything from the first `/`, `?` or `#` after the authority on (possibly empty).
    pub tail: &'a str,
}

impl<'a> HostListUrl<'a> {
    /// The parts of `url`, or `None` when it has no `://`. Nothing is checked beyond that: the
    /// hosts may be empty or malformed, for the caller to judge.
    pub fn split(url: &'a str) -> Option<HostListUrl<'a>> {
        let (scheme, rest) = url.split_once("://")?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        Some(HostListUrl { scheme, userinfo, host_list, tail })
    }

    /// Each host of the list, as written (`host`, `host:port`, `[v6]:port`; empty ones too).
    pub fn hosts(&self) -> std::str::Split<'a, char> {
        self.host_list.split(',')
    }

    /// The same URL with `host_list` in place of its hosts.
    pub fn with_host_list(&self, host_list: &str) -> String {
        let userinfo = self.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        format!("{}://{userinfo}{host_list}{}", self.scheme, self.tail)
    }
}

/// A [`Redactor`] for every secret of `url`, raw and decoded: the password in its user-info
/// part and the value of every secret query parameter ([`is_secret_option`]), plus the user
/// name of a `dynamodb://` URL (an access key id). Works on strings that do not parse as URLs
/// too, so a driver message quoting a malformed URL is scrubbed all the same.
pub fn redactor(url: &str) -> Redactor {
    let mut found: Vec<String> = Vec::new();
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    if let Some((scheme, rest)) = base.split_once("://") {
        if let Some(at) = rest.rfind('@') {
            let (user, password) = rest[..at].split_once(':').unwrap_or((&rest[..at], ""));
            found.push(password.to_owned());
            if scheme == "dynamodb" {
                found.push(user.to_owned());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
    found.extend(decoded);
    for pair in query.split(['&', '#']) {
        if let Some((k, v)) = pair.split_once('=') {
            if is_secret_option(k) {
                found.push(v.to_owned());
                let form = url::form_urlencoded::parse(pair.as_bytes()).next();
                found.extend(form.map(|(_, v)| v.into_owned()));
            }
        }
    }
    Redactor::new(found)
}

/// `%XX` escapes of a URL's user name or password decoded (`+` stays a `+`); a malformed
/// escape is kept as written.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The user name and password of a parsed URL, percent-decoded (`None` without a user name).
pub fn credentials(url: &Url) -> Option<(String, String)> {
    if url.username().is_empty() {
        return None;
    }
    Some((percent_decode(url.username()), url.password().map(percent_decode).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn config_error<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn typed_options_are_taken_once_and_bounded() {
        let mut q = QueryOptions::parse(
            "etcd",
            "namespace=a%20b&watch=ON&page_size=7&timeout_ms=1500&prefix=&sslmode=disable",
        )
        .unwrap();
        assert_eq!(q.namespace().unwrap(), Some(Namespace::new("a b").unwrap()));
        assert_eq!(q.bool("watch").unwrap(), Some(true));
        assert_eq!(q.bool("tls").unwrap(), None);
        assert_eq!(q.integer("page_size", 1..=100).unwrap(), Some(7));
        assert_eq!(q.millis("timeout_ms", 1..=60_000).unwrap(), Some(Duration::from_millis(1500)));
        assert_eq!(q.string("prefix").unwrap().as_deref(), Some(""));
        assert_eq!(q.into_rest(), vec![("sslmode".to_owned(), "disable".to_owned())]);

        let m = config_error(
            QueryOptions::parse("Redis", "page_size=0").unwrap().integer("page_size", 1..=9),
        );
        assert_eq!(m, "Redis URL option `page_size` must be a whole number from 1 to 9, not \"0\"");
        let m = config_error(
            QueryOptions::parse("SQL", "create_schema=maybe").unwrap().bool("create_schema"),
        );
        assert_eq!(m, "SQL URL option `create_schema` must be true or false, not \"maybe\"");
        let m = config_error(QueryOptions::parse("etcd", "prefix=").unwrap().non_empty("prefix"));
        assert_eq!(m, "etcd URL option `prefix` must not be empty");
        let m = config_error(QueryOptions::parse("etcd", "namespace=").unwrap().namespace());
        assert!(m.contains("namespace must not be empty"), "{m}");
    }

    #[test]
    fn duplicates_and_unknown_options_are_refused() {
        let mut q = QueryOptions::parse("etcd", "namespace=a&namespace=b").unwrap();
        let m = config_error(q.string("namespace"));
        assert_eq!(m, "etcd URL option `namespace` is given more than once");
        let mut q = QueryOptions::parse("etcd", "watch=true&bogus=1").unwrap();
        q.bool("watch").unwrap();
        let m = config_error(q.finish(&["namespace", "watch"]));
        assert_eq!(m, "etcd URL: unknown option `bogus` (known: namespace, watch)");
        QueryOptions::parse("etcd", "").unwrap().finish(&["watch"]).unwrap();
    }

    #[test]
    fn secret_values_never_reach_an_error_or_debug() {
        let mut q =
            QueryOptions::parse("DynamoDB", "session_token=s3cr3t&api_key=s3cr3t&x=1").unwrap();
        let m = config_error(q.integer("session_token", 1..=2));
        assert!(!m.contains("s3cr3t") && m.contains("***"), "{m}");
        let m = config_error(q.bool("api_key"));
        assert!(!m.contains("s3cr3t") && m.contains("***"), "{m}");
        let q = QueryOptions::parse("DynamoDB", "secret_access_key=s3cr3t&x=1").unwrap();
        let d = format!("{q:?}");
        assert!(!d.contains("s3cr3t") && d.contains("\"x\", \"1\""), "{d}");
        for name in [
            "password",
            "sslpassword",
            "pwd",
            "secret_access_key",
            "session_token",
            "access_key_id",
            "auth",
        ] {
            assert!(is_secret_option(name), "{name}");
        }
        for name in ["namespace", "region", "page_size", "sslmode", "prefix"] {
            assert!(!is_secret_option(name), "{name}");
        }
    }

    #[test]
    fn the_namespace_of_any_store_url() {
        assert_eq!(namespace_of("memory://").unwrap().as_str(), DEFAULT_NAMESPACE);
        assert_eq!(namespace_of("sqlite::memory:?namespace=orders").unwrap().as_str(), "orders");
        assert_eq!(namespace_of("etcd://h1,h2/?watch=0&namespace=a+b").unwrap().as_str(), "a b");
        assert_eq!(namespace_of("redis://:pw@h/?namespace=x#frag").unwrap().as_str(), "x");
        let m = config_error(namespace_of("redis://:s3cr3t@h/?namespace="));
        assert!(!m.contains("s3cr3t"), "{m}");
        let m = config_error(namespace_of("memory://?namespace=a&namespace=b"));
        assert!(m.contains("more than once"), "{m}");
    }

    #[test]
    fn host_lists_split_into_their_parts() {
        let u = HostListUrl::split("etcds://u:p@ss@[::1]:2380,h2,/x?a=1#f").unwrap();
        assert_eq!(
            (u.scheme, u.userinfo, u.host_list),
            ("etcds", Some("u:p@ss"), "[::1]:2380,h2,")
        );
        assert_eq!(u.tail, "/x?a=1#f");
        assert_eq!(u.hosts().collect::<Vec<_>>(), ["[::1]:2380", "h2", ""]);
        let bare = HostListUrl::split("etcd://h1:2379").unwrap();
        assert_eq!((bare.userinfo, bare.host_list, bare.tail), (None, "h1:2379", ""));
        assert_eq!(bare.hosts().count(), 1);
        let empty = HostListUrl::split("etcd://?namespace=a").unwrap();
        assert_eq!((empty.host_list, empty.tail), ("", "?namespace=a"));
        assert_eq!(empty.hosts().collect::<Vec<_>>(), [""]);
        assert_eq!(HostListUrl::split("etcd://h#x").unwrap().tail, "#x");
        assert_eq!(HostListUrl::split("sqlite::memory:"), None);
        assert_eq!(u.with_host_list("h"), "etcds://u:p@ss@h/x?a=1#f");
        assert_eq!(bare.with_host_list("a,b"), "etcd://a,b");
    }

    #[test]
    fn passwords_in_userinfo_are_masked() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("rediss://:p%40ss@h/"), "rediss://:***@h/");
        assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(redact_url("dynamodb://AKID:sk@t?region=r"), "dynamodb://***:***@t?region=r");
        assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact_url("memory://"), "memory://");
        assert_eq!(redact_url("sqlite::memory:?name=a"), "sqlite::memory:?name=a");
        assert_eq!(redact_url("sqlite:///var/app.db?mode=rwc"), "sqlite:///var/app.db?mode=rwc");
        assert_eq!(
            redact_url("etcd://app:s3cr3t@h1:2379,h2:2379/?namespace=a"),
            "etcd://app:***@h1:2379,h2:2379/?namespace=a"
        );
        assert_eq!(redact_url("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
        for bad in ["::nope s3cr3t", "redis://user:s3cr3t@[bad-host/", "etcd://u:s3cr3t@h1, h2"] {
            assert_eq!(redact_url(bad), UNPARSEABLE, "{bad}");
        }
    }

    #[test]
    fn every_secret_query_parameter_is_masked() {
        for name in [
            "password",
            "sslpassword",
            "pwd",
            "secret_access_key",
            "access_key_id",
            "session_token",
            "token",
            "api_key",
            "client_secret",
        ] {
            let url = format!("postgres://u@h/db?sslmode=require&{name}=s3cr3t&namespace=n");
            let shown = redact_url(&url);
            assert_eq!(shown, format!("postgres://u@h/db?sslmode=require&{name}=***&namespace=n"));
            let etcd = redact_url(&format!("etcd://u:pw@h1,h2/?{name}=s3cr3t"));
            assert_eq!(etcd, format!("etcd://u:***@h1,h2/?{name}=***"));
        }
        assert_eq!(
            redact_url("mysql://u:pw@h/db?password=s3cret&PassWord=x"),
            "mysql://u:***@h/db?password=***&PassWord=***"
        );
    }

    #[test]
    fn a_redactor_finds_every_secret_even_in_a_malformed_url() {
        let r = redactor("postgres://u:a/b%40c@host/db?sslmode=x&password=p%2Bw+x&namespace=n");
        assert_eq!(r.scrub("a/b%40c a/b@c p%2Bw+x p+w x host n"), "*** *** *** *** host n");
        let r = redactor("dynamodb://AKID:s%2Fk@t?session_token=tok");
        assert_eq!(r.scrub("AKID s/k s%2Fk tok t"), "*** *** *** *** t");
        let r = redactor("not a url s3cr3t");
        assert_eq!(r.scrub("not a url s3cr3t"), "not a url s3cr3t");
        assert!(!redactor("redis://h/?namespace=x").leaks("redis://h/?namespace=x"));
    }

    #[test]
    fn credentials_are_percent_decoded() {
        let u = Url::parse("etcd://a%20b:p%40ss%2Bw@h").unwrap();
        assert_eq!(credentials(&u), Some(("a b".to_owned(), "p@ss+w".to_owned())));
        assert_eq!(credentials(&Url::parse("redis://:pw@h").unwrap()), None);
        assert_eq!(credentials(&Url::parse("redis://u@h").unwrap()), Some(("u".into(), "".into())));
        assert_eq!(percent_decode("a+b%2B%zz%4"), "a+b+%zz%4");
    }
}
