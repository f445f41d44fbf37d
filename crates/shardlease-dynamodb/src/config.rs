//! [`DynamoDbStoreBuilder`]: the one way to open a [`DynamoDbStore`], configured the way AWS
//! users expect it.
//!
//! Region, credentials and endpoint come from the SDK's default chains (environment variables,
//! `~/.aws/config` profiles, web identity, ECS and EC2 instance metadata) unless set here, or
//! from an SDK client of the application's own; an explicit endpoint serves emulators and VPC
//! endpoints. The `dynamodb://` URL form of the facade is parsed here too, into the same
//! options.

use std::fmt;
use std::time::Duration;

use crate::store::DynamoDbStore;
use crate::table::{Billing, TableSetup};
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::{Credentials, SharedHttpClient};
use aws_sdk_dynamodb::Client;
use aws_smithy_http_client::tls;
use shardlease_core::store::url::redact_url;
use shardlease_core::store::{Redactor, MASK};
use shardlease_core::{Error, Namespace, Result};

mod from_url;

use from_url::parse_url;

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
///
/// The table comes from [`table`](Self::table) or a `dynamodb://` [`url`](Self::url), and the
/// AWS configuration from the SDK's default chains plus the options set here, or from an SDK
/// [`client`](Self::client) the application built. A value set on the builder wins over the
/// same parameter of the URL, whatever the order of the calls. Nothing is checked until
/// [`connect`](Self::connect), which reports every bad input as `Error::Config` (never a panic)
/// without repeating a key.
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct DynamoDbStoreBuilder {
    url: Option<String>,
    client: Option<Client>,
    table: Option<String>,
    namespace: Option<String>,
    region: Option<String>,
    endpoint: Option<String>,
    ca_file: Option<String>,
    profile: Option<String>,
    keys: Option<StaticKeys>,
    create_table: Option<bool>,
    check_table: Option<bool>,
    billing: Option<Billing>,
    page_size: Option<u32>,
    max_attempts: Option<u32>,
    initial_backoff: Option<Duration>,
    attempt_timeout: Option<Duration>,
    table_ready_timeout: Option<Duration>,
    transact_batches: Option<bool>,
}

impl fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStoreBuilder")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("client", &self.client.as_ref().map(|_| "<given>"))
            .field("table", &self.table)
            .field("namespace", &self.namespace)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("ca_file", &self.ca_file)
            .field("profile", &self.profile)
            .field("credentials", &self.keys.as_ref().map(|_| MASK))
            .field("create_table", &self.create_table)
            .field("check_table", &self.check_table)
            .field("billing", &self.billing)
            .field("page_size", &self.page_size)
            .field("max_attempts", &self.max_attempts)
            .field("transact_batches", &self.transact_batches)
            .finish_non_exhaustive()
    }
}

impl DynamoDbStoreBuilder {
    /// The table, 3 to 255 characters of `A-Z a-z 0-9 _ - .` (or give it in a URL). Many
    /// namespaces share one table.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }

    /// The table and options as a URL: `dynamodb://[KEY_ID:SECRET@]TABLE?region=&endpoint=&
    /// profile=&namespace=&create_table=true&billing=on-demand|provisioned&read_capacity=&
    /// write_capacity=&page_size=&max_attempts=&attempt_timeout_ms=&session_token=`. Options set
    /// on the builder win over the URL's. Keys in a URL are for emulators.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// An SDK client the application built (with the [`aws_sdk_dynamodb`](crate::aws_sdk_dynamodb)
    /// crate this one re-exports), instead of the default chains: region, endpoint, credentials,
    /// retries and timeouts are the client's then, and setting them here (or giving a URL) is an
    /// error.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
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

    /// A PEM file of the certificate authority to trust for an HTTPS endpoint, instead of the
    /// platform's roots (an endpoint behind a private CA: a VPC proxy, a TLS-terminating
    /// emulator). The certificate chain and the host name are verified against it.
    pub fn ca_file(mut self, path: impl Into<String>) -> Self {
        self.ca_file = Some(path.into());
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
        self.create_table = Some(create);
        self
    }

    /// Whether connecting checks the table (`DescribeTable`: that it exists with this crate's
    /// key schema and is `ACTIVE`). Default: yes. Off, for credentials without
    /// `dynamodb:DescribeTable`, the store's first call fails (permanently) if the table is
    /// missing; `create_table(true)` then is an error.
    pub fn check_table(mut self, check: bool) -> Self {
        self.check_table = Some(check);
        self
    }

    /// The billing mode of a table this builder creates (default [`Billing::OnDemand`]).
    pub fn billing(mut self, billing: Billing) -> Self {
        self.billing = Some(billing);
        self
    }

    /// Whether the batch writes (`update_leases`, `create_leases`) go as `TransactWriteItems` of
    /// up to 100 items (`true`) or as single conditional writes, up to
    /// [`PARALLEL_BATCH_WRITES`](crate::PARALLEL_BATCH_WRITES) updates at a time and creations
    /// one after another (`false`, the default). Transactions save round trips but cost twice
    /// the write units, and moto's emulator copies the whole table for each one;
    /// `docs/dynamodb.md`, "Batch writes", has the measurements. Builder only (no URL option).
    pub fn transact_batches(mut self, on: bool) -> Self {
        self.transact_batches = Some(on);
        self
    }

    /// The most items one listing page reads (DynamoDB's `Limit`, at least 1); default: none,
    /// so a page is what fits DynamoDB's 1 MB. Small values make many pages (tests use that).
    pub fn page_size(mut self, items: u32) -> Self {
        self.page_size = Some(items);
        self
    }

    /// Attempts per call, the first included (default [`DEFAULT_MAX_ATTEMPTS`], at least 1).
    /// Throttling, server errors, timeouts and connection failures are retried by the SDK with
    /// exponential backoff and full jitter; what is left after the last attempt is reported as
    /// a retryable `Error::Backend`.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// The first retry's backoff ceiling (default [`DEFAULT_INITIAL_BACKOFF`]).
    pub fn initial_backoff(mut self, backoff: Duration) -> Self {
        self.initial_backoff = Some(backoff);
        self
    }

    /// How long one attempt may take before it is abandoned and retried (default
    /// [`DEFAULT_ATTEMPT_TIMEOUT`], more than zero).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// How long connecting waits for the table to become `ACTIVE` (default
    /// [`DEFAULT_TABLE_READY_TIMEOUT`], more than zero).
    pub fn table_ready_timeout(mut self, timeout: Duration) -> Self {
        self.table_ready_timeout = Some(timeout);
        self
    }

    /// Connects: loads the AWS configuration (unless a client was given), checks the table
    /// (creating it when asked to) and returns the store. Fails with `Error::Config` for bad
    /// input, no region, or a table that is missing (and not to be created) or has another key
    /// schema; `Error::Backend` when DynamoDB cannot be reached (retryable) or refuses
    /// (permanent). No message holds a key.
    pub async fn connect(self) -> Result<DynamoDbStore> {
        let plan = self.plan()?;
        let (client, region) = match plan.client {
            Some(client) => {
                let region = client.config().region().map(|r| r.as_ref().to_owned());
                (client, region)
            }
            None => {
                let sdk = plan.sdk_config().await?;
                let region = sdk.region().map(|r| r.as_ref().to_owned());
                (Client::new(&sdk), region)
            }
        };
        let target = format!(
            "table {} in {}{}",
            plan.table,
            region.as_deref().unwrap_or("?"),
            plan.endpoint
                .as_ref()
                .map(|e| format!(" at {}", plan.redactor.scrub(e)))
                .unwrap_or_default()
        );
        let store = DynamoDbStore::assemble(
            client,
            &plan.table,
            plan.namespace,
            target,
            plan.page_size,
            plan.transact_batches,
            plan.redactor,
        );
        if let Some(setup) = &plan.table_setup {
            store.ensure_table(setup).await?;
        }
        Ok(store)
    }

    /// Everything checked, the builder's values laid over the URL's and the defaults.
    fn plan(self) -> Result<Plan> {
        if self.client.is_some() && self.url.is_some() {
            return Err(Error::Config(
                "DynamoDB store builder: give url() or client(), not both (a URL configures the \
                 client the store builds)"
                    .into(),
            ));
        }
        let from_url = match &self.url {
            Some(url) => parse_url(url)?,
            None => DynamoDbStoreBuilder::default(),
        };
        let b = self.over(from_url);
        let table = b.table.clone().ok_or_else(|| {
            Error::Config(
                "DynamoDB store builder: name the table with table() or a dynamodb://TABLE url()"
                    .into(),
            )
        })?;
        validate_table_name(&table)?;
        // Core's rule is all DynamoDB needs: the namespace is part of a partition key, which
        // holds 2048 bytes.
        let namespace = Namespace::new(b.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE))?;
        let create = b.create_table.unwrap_or(false);
        let check = b.check_table.unwrap_or(true);
        if create && !check {
            return Err(Error::Config(
                "DynamoDB store builder: create_table(true) needs the table check \
                 (check_table(false) skips it)"
                    .into(),
            ));
        }
        let billing = b.billing.unwrap_or_default();
        if let Billing::Provisioned { read_capacity, write_capacity } = billing {
            if read_capacity == 0 || write_capacity == 0 {
                return Err(Error::Config(
                    "DynamoDB store builder: provisioned capacity must be at least 1".into(),
                ));
            }
        }
        if b.page_size == Some(0) {
            return Err(Error::Config(
                "DynamoDB store builder: page_size must be at least 1".into(),
            ));
        }
        let max_attempts = b.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(Error::Config(
                "DynamoDB store builder: max_attempts must be at least 1".into(),
            ));
        }
        let attempt_timeout =
            positive("attempt_timeout", b.attempt_timeout, DEFAULT_ATTEMPT_TIMEOUT)?;
        let ready_timeout =
            positive("table_ready_timeout", b.table_ready_timeout, DEFAULT_TABLE_READY_TIMEOUT)?;
        if b.client.is_some() {
            let client_settings = [
                ("region", b.region.is_some()),
                ("endpoint_url", b.endpoint.is_some()),
                ("ca_file", b.ca_file.is_some()),
                ("profile", b.profile.is_some()),
                ("credentials", b.keys.is_some()),
                ("max_attempts", b.max_attempts.is_some()),
                ("initial_backoff", b.initial_backoff.is_some()),
                ("attempt_timeout", b.attempt_timeout.is_some()),
            ];
            if let Some((name, _)) = client_settings.iter().find(|(_, set)| *set) {
                return Err(Error::Config(format!(
                    "DynamoDB store builder: {name}() configures the client the store builds; \
                     with client() it is the client's own"
                )));
            }
        }
        Ok(Plan {
            redactor: b.redactor(),
            table,
            namespace,
            page_size: b.page_size,
            transact_batches: b.transact_batches.unwrap_or(false),
            table_setup: check.then_some(TableSetup { create, billing, ready_timeout }),
            endpoint: b.endpoint,
            ca_file: b.ca_file,
            region: b.region,
            profile: b.profile,
            keys: b.keys,
            max_attempts,
            initial_backoff: b.initial_backoff.unwrap_or(DEFAULT_INITIAL_BACKOFF),
            attempt_timeout,
            client: b.client,
        })
    }

    /// This builder's values, and `under`'s where this one has none.
    fn over(self, under: DynamoDbStoreBuilder) -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder {
            url: self.url,
            client: self.client,
            table: self.table.or(under.table),
            namespace: self.namespace.or(under.namespace),
            region: self.region.or(under.region),
            endpoint: self.endpoint.or(under.endpoint),
            ca_file: self.ca_file.or(under.ca_file),
            profile: self.profile.or(under.profile),
            keys: self.keys.or(under.keys),
            create_table: self.create_table.or(under.create_table),
            check_table: self.check_table.or(under.check_table),
            billing: self.billing.or(under.billing),
            page_size: self.page_size.or(under.page_size),
            max_attempts: self.max_attempts.or(under.max_attempts),
            initial_backoff: self.initial_backoff.or(under.initial_backoff),
            attempt_timeout: self.attempt_timeout.or(under.attempt_timeout),
            table_ready_timeout: self.table_ready_timeout.or(under.table_ready_timeout),
            transact_batches: self.transact_batches.or(under.transact_batches),
        }
    }

    /// The redactor for the secrets this builder holds.
    fn redactor(&self) -> Redactor {
        match &self.keys {
            Some(k) => Redactor::new([
                k.access_key_id.as_str(),
                k.secret_access_key.as_str(),
                k.session_token.as_deref().unwrap_or_default(),
            ]),
            None => Redactor::default(),
        }
    }
}

/// The SDK's own HTTPS client (rustls with aws-lc, like its default), trusting only the CA of
/// the PEM file at `path`.
fn https_client_trusting(path: &str) -> Result<SharedHttpClient> {
    let pem = std::fs::read(path)
        .map_err(|e| Error::Config(format!("DynamoDB: cannot read ca_file {path}: {e}")))?;
    let trust = tls::TrustStore::empty().with_native_roots(false).with_pem_certificate(pem);
    let context = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| Error::Config(format!("DynamoDB: ca_file {path} is not usable: {e}")))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .tls_context(context)
        .build_https())
}

/// `given` (or `default`), refused when zero.
fn positive(name: &str, given: Option<Duration>, default: Duration) -> Result<Duration> {
    match given.unwrap_or(default) {
        d if d.is_zero() => {
            Err(Error::Config(format!("DynamoDB store builder: {name} must be more than zero")))
        }
        d => Ok(d),
    }
}

/// What [`DynamoDbStoreBuilder::connect`] does, every value checked.
struct Plan {
    client: Option<Client>,
    table: String,
    namespace: Namespace,
    page_size: Option<u32>,
    transact_batches: bool,
    /// `None`: the table is not checked (`check_table(false)`).
    table_setup: Option<TableSetup>,
    redactor: Redactor,
    region: Option<String>,
    endpoint: Option<String>,
    ca_file: Option<String>,
    profile: Option<String>,
    keys: Option<StaticKeys>,
    max_attempts: u32,
    initial_backoff: Duration,
    attempt_timeout: Duration,
}

impl Plan {
    /// The SDK configuration: the default chains, overridden by what was set.
    async fn sdk_config(&self) -> Result<aws_config::SdkConfig> {
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
        if let Some(path) = &self.ca_file {
            loader = loader.http_client(https_client_trusting(path)?);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config_error(builder: DynamoDbStoreBuilder) -> String {
        match builder.plan() {
            Err(Error::Config(m)) => m,
            Err(e) => panic!("expected a config error, got {e:?}"),
            Ok(_) => panic!("expected a config error, got a plan"),
        }
    }

    #[test]
    fn bad_input_is_a_config_error_that_never_shows_a_key() {
        let t = || DynamoDbStore::builder().table("leases").credentials("AKID", "s3cr3t", None);
        let provisioned = Billing::Provisioned { read_capacity: 0, write_capacity: 1 };
        let cases = [
            (DynamoDbStore::builder(), "name the table"),
            (t().table("x"), "invalid"),
            (t().url("dynamodb://AKID:s3cr3t@?region=x"), "malformed DynamoDB URL"),
            (t().namespace(""), "namespace"),
            (t().page_size(0), "page_size"),
            (t().max_attempts(0), "max_attempts"),
            (t().attempt_timeout(Duration::ZERO), "attempt_timeout"),
            (t().table_ready_timeout(Duration::ZERO), "table_ready_timeout"),
            (t().billing(provisioned), "capacity"),
            (t().create_table(true).check_table(false), "check_table(false)"),
        ];
        for (builder, expected) in cases {
            let shown = format!("{builder:?}");
            assert!(!shown.contains("s3cr3t") && !shown.contains("AKID"), "{shown}");
            let m = config_error(builder);
            assert!(m.contains(expected), "{shown}: {m}");
            assert!(!m.contains("s3cr3t") && !m.contains("AKID"), "{m}");
        }
    }

    #[test]
    fn the_builder_wins_over_the_url_which_wins_over_the_defaults() {
        let url = "dynamodb://t-url?region=r1&namespace=a&page_size=7&create_table=true";
        let plan = DynamoDbStore::builder().url(url).plan().unwrap();
        assert_eq!((plan.table.as_str(), plan.namespace.as_str()), ("t-url", "a"));
        assert_eq!((plan.region.as_deref(), plan.page_size), (Some("r1"), Some(7)));
        let setup = plan.table_setup.unwrap();
        assert!(setup.create && setup.billing == Billing::OnDemand);
        assert_eq!(setup.ready_timeout, DEFAULT_TABLE_READY_TIMEOUT);
        assert_eq!((plan.max_attempts, plan.attempt_timeout), (4, DEFAULT_ATTEMPT_TIMEOUT));

        let plan = DynamoDbStore::builder()
            .table("t-mine")
            .namespace("b")
            .page_size(2)
            .region("r2")
            .create_table(false)
            .max_attempts(1)
            .url(url)
            .plan()
            .unwrap();
        assert_eq!((plan.table.as_str(), plan.namespace.as_str()), ("t-mine", "b"));
        assert_eq!((plan.region.as_deref(), plan.page_size), (Some("r2"), Some(2)));
        assert!(!plan.table_setup.unwrap().create);
        assert_eq!(plan.max_attempts, 1);

        let plan = DynamoDbStore::builder().table("t-x").check_table(false).plan().unwrap();
        assert!(plan.table_setup.is_none(), "check_table(false) skips DescribeTable");
        assert_eq!(plan.namespace.as_str(), DEFAULT_NAMESPACE);
    }

    #[test]
    fn a_client_of_ones_own_takes_no_client_settings() {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("eu-west-1"))
            .build();
        let client = Client::from_conf(conf);
        let given = || DynamoDbStore::builder().client(client.clone()).table("leases");
        let plan = given().namespace("n").page_size(3).create_table(true).plan().unwrap();
        assert!(plan.client.is_some() && plan.table_setup.is_some_and(|s| s.create));
        let cases = [
            (given().region("r"), "region()"),
            (given().endpoint_url("http://h"), "endpoint_url()"),
            (given().profile("p"), "profile()"),
            (given().credentials("AKID", "s3cr3t", None), "credentials()"),
            (given().max_attempts(2), "max_attempts()"),
            (given().initial_backoff(Duration::from_millis(1)), "initial_backoff()"),
            (given().attempt_timeout(Duration::from_secs(1)), "attempt_timeout()"),
            (given().url("dynamodb://t"), "not both"),
        ];
        for (builder, expected) in cases {
            let m = config_error(builder);
            assert!(m.contains(expected), "{expected}: {m}");
        }
    }
}
