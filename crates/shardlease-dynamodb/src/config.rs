//! [`DynamoDbStoreBuilder`]: configuration the way AWS users expect it.
//!
//! Region, credentials and endpoint come from the SDK's default chains (environment variables,
//! `~/.aws/config` profiles, web identity, ECS and EC2 instance metadata) unless set here; an
//! explicit endpoint serves emulators and VPC endpoints. The `dynamodb://` URL form of the facade
//! is parsed here too, so both spellings share one set of options.

use std::fmt;
use std::time::Duration;

use crate::store::DynamoDbStore;
use crate::table::{Billing, TableSetup};
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use shardlease_core::store::url::{self as store_url, redact_url, QueryOptions, NAMESPACE_OPTION};
use shardlease_core::store::{Redactor, MASK};
use shardlease_core::{Error, Namespace, Result};
use url::Url;

/// The namespace used when the URL or builder names none (defined once, in core).
pub use shardlease_core::DEFAULT_NAMESPACE;

/// How many attempts the SDK makes per call (the first plus retries), unless configured.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 4;

/// The first retry's backoff ceiling (full jitter, doubling per attempt), unless configured.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(50);

/// How long one attempt of a call may take before it is retried, unless configured.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long connecting waits for a table to become `ACTIVE`, unless configured.
pub const DEFAULT_TABLE_READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Static credentials given to the builder or in the URL.
#[derive(Clone)]
struct StaticKeys {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

/// Builds a [`DynamoDbStore`]: see [`DynamoDbStore::builder`].
#[derive(Clone)]
pub struct DynamoDbStoreBuilder {
    pub(crate) table: String,
    pub(crate) namespace: Option<String>,
    region: Option<String>,
    endpoint: Option<String>,
    profile: Option<String>,
    keys: Option<StaticKeys>,
    pub(crate) create_table: bool,
    pub(crate) billing: Billing,
    pub(crate) page_size: Option<u32>,
    max_attempts: u32,
    initial_backoff: Duration,
    attempt_timeout: Duration,
    pub(crate) table_ready_timeout: Duration,
}

impl fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStoreBuilder")
            .field("table", &self.table)
            .field("namespace", &self.namespace)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("profile", &self.profile)
            .field("credentials", &self.keys.as_ref().map(|_| MASK))
            .field("create_table", &self.create_table)
            .field("billing", &self.billing)
            .field("page_size", &self.page_size)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStoreBuilder {
    pub(crate) fn new(table: String) -> Self {
        DynamoDbStoreBuilder {
            table,
            namespace: None,
            region: None,
            endpoint: None,
            profile: None,
            keys: None,
            create_table: false,
            billing: Billing::OnDemand,
            page_size: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            table_ready_timeout: DEFAULT_TABLE_READY_TIMEOUT,
        }
    }

    /// The namespace (application name) the store reads and writes (default
    /// [`DEFAULT_NAMESPACE`]). Many namespaces share one table.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The AWS region, instead of the default chain (`AWS_REGION`, the profile's `region`, ...).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The endpoint to call instead of the region's (an emulator, a VPC endpoint).
    pub fn endpoint_url(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The `~/.aws/config` profile to read, instead of `AWS_PROFILE` or `default`.
    pub fn profile(mut self, profile: impl Into<String>) -> Self {
        self.profile = Some(profile.into());
        self
    }

    /// Static credentials instead of the default chain (for emulators and tests; in production
    /// prefer the chain: roles, profiles, instance metadata). Never printed.
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Self {
        self.keys = Some(StaticKeys {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token,
        });
        self
    }

    /// Creates the table when it does not exist (default: no, and connecting fails with a
    /// `Config` error saying so), then waits until it is `ACTIVE`.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// The billing mode of a table this builder creates (default [`Billing::OnDemand`]).
    pub fn billing(mut self, billing: Billing) -> Self {
        self.billing = billing;
        self
    }

    /// The most items one listing page reads (DynamoDB's `Limit`); default: none, so a page is
    /// what fits DynamoDB's 1 MB. Small values make many pages (tests use that).
    pub fn page_size(mut self, items: u32) -> Self {
        self.page_size = Some(items.max(1));
        self
    }

    /// Attempts per call, the first included (default [`DEFAULT_MAX_ATTEMPTS`], at least 1).
    /// Throttling, server errors, timeouts and connection failures are retried by the SDK with
    /// exponential backoff and full jitter; what is left after the last attempt is reported as
    /// a retryable `Error::Backend`.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The first retry's backoff ceiling (default [`DEFAULT_INITIAL_BACKOFF`]).
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.initial_backoff = backoff;
        self
    }

    /// How long one attempt may take before it is abandoned and retried (default
    /// [`DEFAULT_ATTEMPT_TIMEOUT`]).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long connecting waits for the table to become `ACTIVE` (default
    /// [`DEFAULT_TABLE_READY_TIMEOUT`]).
    pub fn table_ready_timeout(mut self, timeout: Duration) -> Self {
        self.table_ready_timeout = timeout;
        self
    }

    /// The redactor for the secrets this builder holds.
    pub(crate) fn redactor(&self) -> Redactor {
        match &self.keys {
            Some(k) => Redactor::new([
                k.access_key_id.as_str(),
                k.secret_access_key.as_str(),
                k.session_token.as_deref().unwrap_or_default(),
            ]),
            None => Redactor::default(),
        }
    }

    /// The SDK configuration: the default chains, overridden by what was set here.
    pub(crate) async fn sdk_config(&self) -> Result<aws_config::SdkConfig> {
        let retry = RetryConfig::standard()
            .with_max_attempts(self.max_attempts)
            .with_initial_backoff(self.initial_backoff)
            .with_max_backoff(Duration::from_secs(5));
        let timeouts = TimeoutConfig::builder()
            .operation_attempt_timeout(self.attempt_timeout)
            .connect_timeout(self.attempt_timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint.clone());
        }
        if let Some(profile) = &self.profile {
            loader = loader.profile_name(profile.clone());
        }
        if let Some(k) = &self.keys {
            loader = loader.credentials_provider(Credentials::new(
                k.access_key_id.clone(),
                k.secret_access_key.clone(),
                k.session_token.clone(),
                None,
                "shardlease-static",
            ));
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(Error::Config(
                "no AWS region: set AWS_REGION, a `region` in the profile, or the store's region \
                 (DynamoDbStoreBuilder::region, `?region=` in a dynamodb:// URL)"
                    .into(),
            ));
        }
        Ok(config)
    }

    /// Connects: loads the AWS configuration, checks the table (creating it when asked to) and
    /// returns the store. Fails with `Error::Config` for bad options, no region, or a table that
    /// is missing (and not to be created) or has another key schema; `Error::Backend` when
    /// DynamoDB cannot be reached (retryable) or refuses (permanent). No message holds a key.
    pub async fn connect(self) -> Result<DynamoDbStore> {
        validate_table_name(&self.table)?;
        // Core's rule is all DynamoDB needs: the namespace is part of a partition key, which
        // holds 2048 bytes.
        let namespace =
            Namespace::new(self.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()))?;
        let redactor = self.redactor();
        let sdk = self.sdk_config().await?;
        let client = aws_sdk_dynamodb::Client::new(&sdk);
        let target = format!(
            "table {} in {}{}",
            self.table,
            sdk.region().map(|r| r.as_ref()).unwrap_or("?"),
            self.endpoint
                .as_ref()
                .map(|e| format!(" at {}", redactor.scrub(e)))
                .unwrap_or_default()
        );
        let store = DynamoDbStore::assemble(
            client,
            &self.table,
            namespace,
            target,
            self.page_size,
            redactor,
        );
        let setup = TableSetup {
            create: self.create_table,
            billing: self.billing,
            ready_timeout: self.table_ready_timeout,
        };
        store.ensure_table(&setup).await?;
        Ok(store)
    }
}

/// Checks a table name against DynamoDB's rules (3 to 255 of `[A-Za-z0-9_.-]`).
fn validate_table_name(table: &str) -> Result<()> {
    let ok_chars =
        table.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if (3..=255).contains(&table.len()) && ok_chars {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "DynamoDB table name {table:?} is invalid: 3 to 255 characters of A-Z a-z 0-9 _ - ."
        )))
    }
}

/// The most read or write capacity units a URL may ask for.
const MAX_CAPACITY: u64 = 1_000_000;

/// The longest attempt timeout a URL may set (an hour), in milliseconds.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Query parameters of a `dynamodb://` URL.
const PARAMS: &[&str] = &[
    "namespace",
    "region",
    "endpoint",
    "profile",
    "create_table",
    "billing",
    "read_capacity",
    "write_capacity",
    "page_size",
    "max_attempts",
    "attempt_timeout_ms",
    "session_token",
];

/// A builder from a URL `dynamodb://[access_key_id:secret_access_key@]table?region=...&
/// endpoint=...&namespace=...&profile=...&create_table=true&billing=on-demand|provisioned&
/// read_capacity=N&write_capacity=N&page_size=N&max_attempts=N&attempt_timeout_ms=N`. Errors
/// never echo the keys.
pub(crate) fn builder_from_url(raw: &str) -> Result<DynamoDbStoreBuilder> {
    let shown = redact_url(raw);
    let url = Url::parse(raw).map_err(|e| {
        Error::Config(format!(
            "malformed DynamoDB URL {shown} ({e}); expected dynamodb://table?region=...&endpoint=..."
        ))
    })?;
    if url.scheme() != "dynamodb" {
        return Err(Error::Config(format!(
            "a DynamoDB URL starts with dynamodb://, not {}://",
            url.scheme()
        )));
    }
    let table = url.host_str().unwrap_or_default();
    if table.is_empty() {
        return Err(Error::Config(format!(
            "the DynamoDB URL {shown} names no table (dynamodb://TABLE)"
        )));
    }
    let mut b = DynamoDbStoreBuilder::new(table.to_owned());
    if let Some((key_id, secret)) = store_url::credentials(&url) {
        if secret.is_empty() {
            return Err(Error::Config(format!(
                "the DynamoDB URL {shown} has an access key id but no secret key (KEY:SECRET@table)"
            )));
        }
        b = b.credentials(key_id, secret, None);
    }
    let mut q = QueryOptions::from_url("DynamoDB", &url)?;
    b.namespace = q.string(NAMESPACE_OPTION)?;
    b.region = q.non_empty("region")?;
    b.endpoint = q.non_empty("endpoint")?;
    b.profile = q.non_empty("profile")?;
    b.create_table = q.bool("create_table")?.unwrap_or(b.create_table);
    let provisioned = match q.string("billing")?.as_deref() {
        None | Some("on-demand" | "on_demand" | "pay-per-request" | "PAY_PER_REQUEST") => false,
        Some("provisioned" | "PROVISIONED") => true,
        Some(other) => {
            return Err(Error::Config(format!(
                "DynamoDB URL option `billing` must be on-demand or provisioned, not {:?}",
                other.chars().take(40).collect::<String>()
            )))
        }
    };
    let read = q.integer("read_capacity", 1..=MAX_CAPACITY)?;
    let write = q.integer("write_capacity", 1..=MAX_CAPACITY)?;
    let u32_max = u64::from(u32::MAX);
    if let Some(n) = q.integer("page_size", 1..=u32_max)? {
        b = b.page_size(u32::try_from(n).unwrap_or(u32::MAX));
    }
    if let Some(n) = q.integer("max_attempts", 1..=u32_max)? {
        b = b.max_attempts(u32::try_from(n).unwrap_or(u32::MAX));
    }
    if let Some(d) = q.millis("attempt_timeout_ms", 1..=MAX_TIMEOUT_MS)? {
        b = b.attempt_timeout(d);
    }
    if let Some(token) = q.string("session_token")? {
        if let Some(k) = b.keys.as_mut() {
            k.session_token = Some(token);
        }
    }
    q.finish(PARAMS)?;
    if provisioned || read.is_some() || write.is_some() {
        b = b.billing(Billing::Provisioned {
            read_capacity: read.unwrap_or(5),
            write_capacity: write.unwrap_or(5),
        });
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_set_every_option() {
        let b = builder_from_url(
            "dynamodb://AKID:se%2Fcret@my-leases?region=eu-west-1&endpoint=http://127.0.0.1:8000\
             &namespace=orders&create_table=true&billing=provisioned&read_capacity=10&page_size=7\
             &attempt_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(b.table, "my-leases");
        assert_eq!(b.namespace.as_deref(), Some("orders"));
        assert_eq!(b.region.as_deref(), Some("eu-west-1"));
        assert_eq!(b.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert!(b.create_table);
        assert_eq!(b.billing, Billing::Provisioned { read_capacity: 10, write_capacity: 5 });
        assert_eq!(b.page_size, Some(7));
        assert_eq!(b.attempt_timeout, Duration::from_millis(250));
        let keys = b.keys.as_ref().unwrap();
        assert_eq!(
            (keys.access_key_id.as_str(), keys.secret_access_key.as_str()),
            ("AKID", "se/cret")
        );
        let debug = format!("{b:?}");
        assert!(!debug.contains("AKID") && !debug.contains("cret"), "{debug}");
        let plain = builder_from_url("dynamodb://Leases.Table_1").unwrap();
        assert_eq!(plain.table, "Leases.Table_1");
        assert!(!plain.create_table && plain.keys.is_none());
    }

    #[test]
    fn bad_urls_are_config_errors_without_keys() {
        for bad in [
            "dynamodb://AKID:s3cr3t@?region=x",
            "redis://AKID:s3cr3t@t",
            "dynamodb://AKID:s3cr3t@t?colour=blue",
            "dynamodb://AKID:s3cr3t@t?create_table=maybe",
            "dynamodb://AKID:s3cr3t@t?page_size=0",
            "dynamodb://AKID:s3cr3t@t?region=a&region=b",
            "dynamodb://AKID:s3cr3t@t?session_token=s3cr3t&session_token=s3cr3t",
            "dynamodb://AKID@tab",
            "dynamodb://AKID:s3cr3t@[::1",
        ] {
            match builder_from_url(bad) {
                Err(Error::Config(m)) => {
                    assert!(!m.contains("s3cr3t") && !m.contains("AKID"), "{m}")
                }
                other => panic!("{bad}: expected a config error, got {other:?}"),
            }
        }
        assert!(validate_table_name("ab").is_err());
        assert!(validate_table_name("has space").is_err());
        assert!(validate_table_name("ok-table_1.x").is_ok());
    }
}
