//! Connect-by-URL: one string picks the coordination store, so consumer code never names a
//! backend type. A scheme whose backend was compiled out is reported with the feature to enable;
//! a malformed URL is reported without ever echoing it (it may hold a password).

use std::sync::Arc;

use shardlease_core::store::url::HostListUrl;
use shardlease_core::store::InstrumentedStore;
use shardlease_core::store::LeaseStore;
use shardlease_core::store::MemoryBackend;
use shardlease_core::{Error, Namespace, Result};
use url::Url;

/// The namespace used when the URL or builder names none (defined once, in core).
pub use shardlease_core::DEFAULT_NAMESPACE;

/// Schemes known to shardlease, with the feature that enables each.
const KNOWN: &[(&str, &str)] = &[
    ("memory", "(always on)"),
    ("sqlite", "sqlite"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+cluster", "redis"),
    ("rediss+cluster", "redis"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("dynamodb", "dynamodb"),
];

/// Opens the store named by `url`, in the namespace given by its `namespace` query parameter
/// (default [`DEFAULT_NAMESPACE`]).
///
/// The store comes wrapped in an [`InstrumentedStore`]: every call runs in a `store` span and is
/// timed in `shardlease_store_call_seconds`, errors counted in `shardlease_store_errors_total`
/// (docs/operations.md, "Metrics"). [`connect_bare`] returns the store without it.
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseStore>> {
    Ok(Arc::new(InstrumentedStore::new(connect_bare(url).await?)))
}

/// Opens the store named by `url` in `namespace` (any `namespace` query parameter is ignored),
/// wrapped in an [`InstrumentedStore`] like [`connect`]'s.
pub async fn connect_namespace(url: &str, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
    let parsed = parse(url)?;
    Ok(Arc::new(InstrumentedStore::new(open(url, &parsed, namespace).await?)))
}

/// [`connect`] without the [`InstrumentedStore`]: the backend's store itself, for an application
/// that instruments its stores its own way (or not at all).
pub async fn connect_bare(url: &str) -> Result<Arc<dyn LeaseStore>> {
    let parsed = parse(url)?;
    let namespace = shardlease_core::store::url::namespace_of(url)?;
    open(url, &parsed, namespace.as_str()).await
}

fn parse(url: &str) -> Result<Url> {
    // `sqlite::memory:` is sqlx's spelling of an in-memory SQLite database; accept it as a URL
    // (keeping its query, which may name the namespace).
    let memory = ["sqlite::memory:", "sqlite://:memory:"].iter().find(|p| url.starts_with(**p));
    let normalized = match memory {
        Some(prefix) => format!("sqlite:memory{}", &url[prefix.len()..]),
        None => first_etcd_host(url).unwrap_or_else(|| url.to_owned()),
    };
    Url::parse(&normalized).map_err(|e| {
        Error::Config(format!(
            "malformed store URL ({e}); expected e.g. memory:// or redis://host:6379"
        ))
    })
}

/// An `etcd://` or `redis+cluster://` URL may list several hosts (`h1:2379,h2:2379`), which
/// `Url` cannot parse: for the scheme and the query, keep only the first; the store parses the
/// whole URL itself.
fn first_etcd_host(url: &str) -> Option<String> {
    let parts = HostListUrl::split(url)?;
    if !matches!(parts.scheme, "etcd" | "etcds" | "redis+cluster" | "rediss+cluster") {
        return None;
    }
    Some(parts.with_host_list(parts.hosts().next().unwrap_or_default()))
}

/// Opens `namespace` on the store `url` names (`raw` as given; `url` parsed, an etcd host list cut
/// to its first host): each backend through its builder.
async fn open(_raw: &str, url: &Url, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
    let checked = Namespace::new(namespace)?;
    match url.scheme() {
        "memory" => Ok(Arc::new(MemoryBackend::global().store(checked))),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let builder = shardlease_redis::RedisStore::builder().url(url.as_str());
            Ok(Arc::new(builder.namespace(namespace).connect().await?))
        }
        #[cfg(feature = "redis")]
        "redis+cluster" | "rediss+cluster" => {
            let builder = shardlease_redis::RedisStore::builder().url(_raw);
            Ok(Arc::new(builder.namespace(namespace).connect().await?))
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => {
            let builder = shardlease_etcd::EtcdStore::builder().url(_raw);
            Ok(Arc::new(builder.namespace(namespace).connect().await?))
        }
        #[cfg(feature = "dynamodb")]
        "dynamodb" => {
            let builder = shardlease_dynamodb::DynamoDbStore::builder().url(_raw);
            Ok(Arc::new(builder.namespace(namespace).connect().await?))
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => open_sql(_raw, namespace).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => open_sql(_raw, namespace).await,
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => open_sql(_raw, namespace).await,
        scheme => match KNOWN.iter().find(|(s, _)| *s == scheme) {
            Some((_, feature)) => Err(Error::Config(format!(
                "store scheme `{scheme}://` needs the `{feature}` feature of the shardlease crate \
                 (features = [\"{feature}\"])"
            ))),
            None => Err(Error::Config(format!(
                "unknown store scheme `{scheme}://`; known: {}",
                KNOWN.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

/// The SQL store at `url` (any compiled-in dialect), in `namespace`.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn open_sql(url: &str, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
    let builder = shardlease_sql::SqlStore::builder().url(url);
    Ok(Arc::new(builder.namespace(namespace).connect().await?))
}

/// `url` with every secret masked, for logs and messages (core's, the one every store uses).
pub use shardlease_core::store::url::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(r: Result<Arc<dyn LeaseStore>>) -> String {
        match r {
            Err(Error::Config(m)) => m,
            Err(e) => panic!("expected a config error, got {e}"),
            Ok(_) => panic!("expected a config error, got a store"),
        }
    }

    #[tokio::test]
    async fn memory_urls_share_one_process_wide_backend() {
        let a = connect("memory://?namespace=facade-a").await.unwrap();
        let b = connect_namespace("memory://", "facade-a").await.unwrap();
        let lease = shardlease_core::store::Lease::new("k", shardlease_core::Position::Latest);
        a.create_lease(&lease).await.unwrap();
        assert!(b.get_lease(&"k".into()).await.unwrap().is_some());
        let other = connect("memory://?namespace=facade-b").await.unwrap();
        assert!(other.get_lease(&"k".into()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn compiled_out_schemes_name_their_feature() {
        if !cfg!(feature = "redis") {
            let m = config_error(connect("redis://:hunter2@127.0.0.1:6379").await);
            assert!(m.contains("`redis` feature"), "{m}");
            assert!(!m.contains("hunter2"), "{m}");
        }
        if !cfg!(feature = "redis") {
            let m = config_error(connect("redis+cluster://:hunter2@h1:7000,h2:7001").await);
            assert!(m.contains("`redis` feature"), "{m}");
            assert!(!m.contains("hunter2"), "{m}");
        }
        if !cfg!(feature = "postgres") {
            let m = config_error(connect("postgresql://u:pw@localhost/db").await);
            assert!(m.contains("`postgres` feature"), "{m}");
            assert!(!m.contains("pw@"), "{m}");
        }
        if !cfg!(feature = "dynamodb") {
            let m = config_error(connect("dynamodb://AKID:s3cr3t@leases?region=x").await);
            assert!(m.contains("`dynamodb` feature"), "{m}");
            assert!(!m.contains("s3cr3t"), "{m}");
        }
        if !cfg!(feature = "etcd") {
            let m = config_error(connect("etcd://u:s3cr3t@h1:2379,h2:2379?namespace=a").await);
            assert!(m.contains("`etcd` feature"), "{m}");
            assert!(!m.contains("s3cr3t"), "{m}");
        }
        let m = config_error(connect("gopher://x").await);
        assert!(m.contains("unknown store scheme"), "{m}");
    }

    #[tokio::test]
    async fn malformed_urls_never_echo_a_password() {
        for bad in [
            "redis://user:s3cr3t@[bad-host/",
            "not a url s3cr3t",
            "postgres://u:s3cr3t@host:99999/db",
        ] {
            let m = config_error(connect(bad).await);
            assert!(m.contains("malformed store URL"), "{m}");
            assert!(!m.contains("s3cr3t"), "{m}");
        }
        let m = config_error(connect("memory://?namespace=").await);
        assert!(m.contains("namespace"), "{m}");
    }

    /// With the `etcd` feature, `etcd://` URLs (one host or a host list) open the etcd store in
    /// the URL's namespace, on the server named by `SHARDLEASE_TEST_ETCD_URL`.
    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn etcd_urls_open_the_etcd_store() {
        let Some(base) = std::env::var("SHARDLEASE_TEST_ETCD_URL").ok().filter(|u| !u.is_empty())
        else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "SHARDLEASE_TEST_ETCD_URL unset");
            println!("etcd_urls_open_the_etcd_store: SKIPPED (SHARDLEASE_TEST_ETCD_URL unset)");
            return;
        };
        let host = base.trim_start_matches("etcd://").trim_end_matches('/').to_owned();
        let url = format!("etcd://{host},{host}/?namespace=facade-etcd&prefix=shardlease-test");
        let store = connect(&url).await.unwrap();
        assert_eq!(store.namespace().map(|n| n.as_str().to_owned()), Some("facade-etcd".into()));
        let lease = shardlease_core::store::Lease::new("k", shardlease_core::Position::Latest);
        let _ = store.create_lease(&lease).await.unwrap();
        assert!(store.get_lease(&"k".into()).await.unwrap().is_some());
        assert!(store.subscribe_changes().await.unwrap().is_some(), "watch is on by default");
        let off = connect_namespace(&format!("{url}&watch=false"), "facade-etcd").await.unwrap();
        assert!(off.subscribe_changes().await.unwrap().is_none(), "watch=false turns it off");
        let v = store.get_lease(&"k".into()).await.unwrap().unwrap().version;
        store.delete_lease(&"k".into(), v).await.unwrap();
    }

    /// With the `redis` feature, `redis+cluster://` URLs open the Redis store on the cluster
    /// named by `SHARDLEASE_TEST_REDIS_CLUSTER_URL`, in the URL's namespace.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis_cluster_urls_open_the_redis_store() {
        let var = "SHARDLEASE_TEST_REDIS_CLUSTER_URL";
        let Some(base) = std::env::var(var).ok().filter(|u| !u.is_empty()) else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{var} unset");
            println!("redis_cluster_urls_open_the_redis_store: SKIPPED ({var} unset)");
            return;
        };
        let url = format!("{base}?namespace=facade-cluster&key_prefix=shardlease-test");
        let store = connect(&url).await.unwrap();
        assert_eq!(store.namespace().map(|n| n.as_str().to_owned()), Some("facade-cluster".into()));
        let lease = shardlease_core::store::Lease::new("k", shardlease_core::Position::Latest);
        let _ = store.create_lease(&lease).await.unwrap();
        let v = store.get_lease(&"k".into()).await.unwrap().unwrap().version;
        store.delete_lease(&"k".into(), v).await.unwrap();
    }

    /// With the `sqlite` feature, a SQL URL reaches the SQL store's builder with its
    /// parameters, the namespace argument winning over the URL's.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sql_urls_open_the_sql_store_with_their_parameters() {
        let url = "sqlite::memory:?table_prefix=facade_&namespace=from-url";
        let store = connect_bare(url).await.unwrap();
        assert!(format!("{store:?}").contains("facade_"), "{store:?}");
        assert_eq!(store.namespace().map(|n| n.as_str().to_owned()), Some("from-url".into()));
        let named = connect_namespace(url, "argument").await.unwrap();
        assert_eq!(named.namespace().map(|n| n.as_str().to_owned()), Some("argument".into()));
        let m = config_error(connect("sqlite::memory:?table_prefix=Bad-Prefix").await);
        assert!(m.contains("table prefix"), "{m}");
    }

    #[tokio::test]
    async fn connect_instruments_the_store_and_connect_bare_does_not() {
        let wrapped = connect("memory://?namespace=facade-i").await.unwrap();
        assert!(format!("{wrapped:?}").starts_with("InstrumentedStore"), "{wrapped:?}");
        assert_eq!(wrapped.namespace().map(|n| n.as_str().to_owned()), Some("facade-i".into()));
        let named = connect_namespace("memory://", "facade-i").await.unwrap();
        assert!(format!("{named:?}").starts_with("InstrumentedStore"), "{named:?}");
        let bare = connect_bare("memory://?namespace=facade-i").await.unwrap();
        assert!(format!("{bare:?}").starts_with("MemoryStore"), "{bare:?}");
        assert_eq!(bare.namespace().map(|n| n.as_str().to_owned()), Some("facade-i".into()));
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("memory://"), "memory://");
        assert_eq!(redact_url("dynamodb://AKID:sk@t?region=r"), "dynamodb://***:***@t?region=r");
        assert_eq!(redact_url("::nope pw"), "<unparseable URL>");
        assert_eq!(redact_url("etcd://u:pw@h:2379?watch=false"), "etcd://u:***@h:2379?watch=false");
        assert_eq!(redact_url("etcd://u:pw@h1:2379,h2:2379"), "etcd://u:***@h1:2379,h2:2379");
        assert_eq!(
            redact_url("redis+cluster://:pw@h1:7000,h2:7001?namespace=a"),
            "redis+cluster://:***@h1:7000,h2:7001?namespace=a"
        );
        assert_eq!(redact_url("mysql://u@h/db?password=pw"), "mysql://u@h/db?password=***");
    }
}
