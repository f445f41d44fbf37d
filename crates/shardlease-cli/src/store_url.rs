//! Which store and namespace the CLI operates. The store URL's `?namespace=` is the source of
//! truth in shardlease (see `Config::namespace`), so `--namespace` is folded into the URL: it
//! adds the parameter, agrees with one already there, and is an error when the two differ. Every
//! message names the URL only in its redacted form, since it may carry a password.

use std::sync::Arc;

use shardlease::store::url::{namespace_of, QueryOptions, NAMESPACE_OPTION};
use shardlease::store::LeaseStore;

use crate::error::CliError;

/// `url` with its `namespace` query parameter set to `namespace` (when given). A URL that names
/// another namespace is refused rather than silently overridden.
pub fn with_namespace(url: &str, namespace: Option<&str>) -> Result<String, CliError> {
    let Some(ns) = namespace else { return Ok(url.to_owned()) };
    if ns.is_empty() {
        return Err(CliError::Usage("--namespace must not be empty".into()));
    }
    let named = QueryOptions::of_raw_url("store", url)
        .and_then(|mut q| q.string(NAMESPACE_OPTION))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    match named {
        None => {
            let encoded: String = url::form_urlencoded::byte_serialize(ns.as_bytes()).collect();
            let sep = if url.contains('?') { '&' } else { '?' };
            Ok(format!("{url}{sep}namespace={encoded}"))
        }
        Some(same) if same == ns => Ok(url.to_owned()),
        Some(_) => Err(CliError::Usage(format!(
            "--namespace {ns:?} conflicts with the namespace in the store URL {} (the URL's \
             ?namespace= is what workers use; give one of them, or the same in both)",
            shardlease::redact_url(url)
        ))),
    }
}

/// The opened store and the namespace it reads and writes.
pub struct Target {
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// The namespace, as the store reports it (the URL's otherwise).
    pub namespace: String,
    /// The URL with any secret masked, for output.
    pub redacted_url: String,
}

/// Opens the store named by `url` (with `--namespace` folded in).
pub async fn open(url: &str, namespace: Option<&str>) -> Result<Target, CliError> {
    let url = with_namespace(url, namespace)?;
    let store = shardlease::connect(&url).await.map_err(CliError::Store)?;
    let namespace = match store.namespace() {
        Some(n) => n,
        None => namespace_of(&url).map_err(CliError::Store)?,
    };
    let namespace = namespace.as_str().to_owned();
    Ok(Target { store, namespace, redacted_url: shardlease::redact_url(&url) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_is_added_kept_or_refused() {
        assert_eq!(with_namespace("sqlite://a.db", None).ok().as_deref(), Some("sqlite://a.db"));
        assert_eq!(
            with_namespace("sqlite://a.db", Some("orders")).ok().as_deref(),
            Some("sqlite://a.db?namespace=orders")
        );
        assert_eq!(
            with_namespace("sqlite://a.db?create_schema=false", Some("a b")).ok().as_deref(),
            Some("sqlite://a.db?create_schema=false&namespace=a+b")
        );
        assert_eq!(
            with_namespace("memory://?namespace=x", Some("x")).ok().as_deref(),
            Some("memory://?namespace=x")
        );
        match with_namespace("redis://:s3cr3t@h:6379/?namespace=x", Some("y")) {
            Err(CliError::Usage(m)) => {
                assert!(m.contains("conflicts"), "{m}");
                assert!(!m.contains("s3cr3t"), "{m}");
            }
            other => panic!("expected a usage error, got {:?}", other.map(|_| ())),
        }
        assert!(matches!(with_namespace("memory://", Some("")), Err(CliError::Usage(_))));
        match with_namespace("redis://:s3cr3t@h:6379/?namespace=x&namespace=x", Some("x")) {
            Err(CliError::Usage(m)) => {
                assert!(m.contains("more than once"), "{m}");
                assert!(!m.contains("s3cr3t"), "{m}");
            }
            other => panic!("expected a usage error, got {:?}", other.map(|_| ())),
        }
    }
}
