//! Building a [`DynamoDbStreamsSource`] the AWS way: the SDK's default configuration chain
//! (environment, profile, container and instance credentials; `AWS_REGION`;
//! `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`), with optional overrides for the region, the endpoint
//! (emulators) and static credentials, or an SDK config or client of the caller's own.
//!
//! Credentials never appear in `Debug` output, logs or errors.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodbstreams::config::Credentials;
use aws_sdk_dynamodbstreams::Client;
use shardlease_core::{Error, Result};

use crate::config::{OnTrimmed, ReadConfig};
use crate::sdk::{latest_stream_arn, SdkApi};
use crate::source::DynamoDbStreamsSource;

/// Static credentials, redacted in `Debug`.
#[derive(Clone)]
struct StaticCredentials {
    access_key_id: String,
    secret_access_key: String,
}

/// Builds a [`DynamoDbStreamsSource`]; see [`DynamoDbStreamsSource::builder`].
#[derive(Clone)]
pub struct DynamoDbStreamsSourceBuilder {
    table_or_arn: String,
    read: ReadConfig,
    region: Option<String>,
    endpoint_url: Option<String>,
    credentials: Option<StaticCredentials>,
    sdk_config: Option<SdkConfig>,
    client: Option<Client>,
}

impl fmt::Debug for DynamoDbStreamsSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStreamsSourceBuilder")
            .field("table_or_arn", &self.table_or_arn)
            .field("read", &self.read)
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .field("credentials", &self.credentials.as_ref().map(|_| "<static, redacted>"))
            .field("sdk_config", &self.sdk_config.as_ref().map(|_| "<given>"))
            .field("client", &self.client.as_ref().map(|_| "<given>"))
            .finish()
    }
}

impl DynamoDbStreamsSourceBuilder {
    pub(crate) fn new(table_or_arn: String) -> Self {
        DynamoDbStreamsSourceBuilder {
            table_or_arn,
            read: ReadConfig::default(),
            region: None,
            endpoint_url: None,
            credentials: None,
            sdk_config: None,
            client: None,
        }
    }

    /// The region (overrides `AWS_REGION` and the profile).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The DynamoDB Streams endpoint, e.g. `http://127.0.0.1:5000` for moto (overrides
    /// `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`).
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Fixed credentials instead of the default chain (emulators, tests).
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some(StaticCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        });
        self
    }

    /// Start from this SDK configuration instead of loading the default chain (the region,
    /// endpoint and credentials overrides still apply).
    pub fn sdk_config(mut self, config: SdkConfig) -> Self {
        self.sdk_config = Some(config);
        self
    }

    /// Use this client as is (the overrides above are ignored). Every call is still bounded by
    /// [`ReadConfig::operation_timeout`].
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// All reading and listing settings at once.
    pub fn read_config(mut self, read: ReadConfig) -> Self {
        self.read = read;
        self
    }

    /// Records per `GetRecords` call (1 ..= 1000).
    pub fn max_records(mut self, n: i32) -> Self {
        self.read.max_records = n;
        self
    }

    /// Wait after a read that found nothing new.
    pub fn idle_interval(mut self, d: Duration) -> Self {
        self.read.idle_interval = d;
        self
    }

    /// What to do when the next records are past the stream's retention (default: fail).
    pub fn on_trimmed(mut self, on_trimmed: OnTrimmed) -> Self {
        self.read.on_trimmed = on_trimmed;
        self
    }

    /// Timeout of every call to the service.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.read.operation_timeout = d;
        self
    }

    /// Builds the source: loads the AWS configuration (unless a client was given) and, for a
    /// table name, finds the table's newest stream.
    pub async fn build(self) -> Result<DynamoDbStreamsSource> {
        self.read.validate()?;
        let name = self.table_or_arn.trim().to_owned();
        if name.is_empty() {
            return Err(Error::Config(
                "the DynamoDB table name or stream ARN must not be empty".into(),
            ));
        }
        let timeout = self.read.operation_timeout;
        let read = self.read.clone();
        let client = self.sdk_client(timeout).await?;
        let arn = if name.starts_with("arn:") {
            name
        } else {
            latest_stream_arn(&client, &name, timeout).await?
        };
        DynamoDbStreamsSource::with_api(Arc::new(SdkApi::new(client, arn, timeout)), read)
    }

    /// The client: given, or built from the SDK's chain and the overrides.
    async fn sdk_client(self, timeout: Duration) -> Result<Client> {
        if let Some(c) = self.client {
            return Ok(c);
        }
        let base = match self.sdk_config {
            Some(c) => c,
            None => {
                let mut loader = aws_config::defaults(BehaviorVersion::latest());
                // A region given here spares the chain its lookups (profile, IMDS).
                if let Some(r) = &self.region {
                    loader = loader.region(Region::new(r.clone()));
                }
                loader.load().await
            }
        };
        let mut conf = aws_sdk_dynamodbstreams::config::Builder::from(&base).timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(timeout)
                .operation_attempt_timeout(timeout)
                .build(),
        );
        if let Some(r) = self.region {
            conf = conf.region(Region::new(r));
        }
        if let Some(u) = self.endpoint_url {
            conf = conf.endpoint_url(u);
        }
        if let Some(c) = self.credentials {
            conf = conf.credentials_provider(Credentials::new(
                c.access_key_id,
                c.secret_access_key,
                None,
                None,
                "shardlease-static",
            ));
        }
        let conf = conf.build();
        if conf.region().is_none() {
            return Err(Error::Config(
                "no AWS region: set AWS_REGION, a profile region, or the builder's region".into(),
            ));
        }
        Ok(Client::from_conf(conf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_in_debug_output() {
        let b = DynamoDbStreamsSource::builder("orders")
            .static_credentials("AKIDEXAMPLE", "s3cr3t-key");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cr3t-key") && !shown.contains("AKIDEXAMPLE"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[tokio::test]
    async fn bad_settings_are_refused_when_building() {
        let empty = DynamoDbStreamsSource::builder(" ").region("us-east-1").build().await;
        assert!(matches!(empty, Err(Error::Config(_))), "{empty:?}");
        let zero =
            DynamoDbStreamsSource::builder("t").region("us-east-1").max_records(0).build().await;
        assert!(matches!(zero, Err(Error::Config(_))), "{zero:?}");
    }
}
