//! Building a [`KinesisSource`] the AWS way: the SDK's default configuration chain (environment,
//! profile, container and instance credentials; `AWS_REGION`; `AWS_ENDPOINT_URL_KINESIS`), with
//! optional overrides for the region, the endpoint (emulators) and static credentials, or an SDK
//! config or client of the caller's own; and polling or enhanced fan-out.
//!
//! Credentials never appear in `Debug` output, logs or errors.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_kinesis::config::Credentials;
use aws_sdk_kinesis::Client;
use shardlease_core::{Error, Result};

use crate::api::StreamRef;
use crate::config::ReadConfig;
use crate::fanout::{consumer, FanOut, FanOutConfig};
use crate::sdk::SdkApi;
use crate::source::KinesisSource;

/// Static credentials, redacted in `Debug`.
#[derive(Clone)]
struct StaticCredentials {
    access_key_id: String,
    secret_access_key: String,
}

/// Builds a [`KinesisSource`]; see [`KinesisSource::builder`].
#[derive(Clone)]
pub struct KinesisSourceBuilder {
    stream: String,
    read: ReadConfig,
    fan_out: Option<FanOutConfig>,
    region: Option<String>,
    endpoint_url: Option<String>,
    credentials: Option<StaticCredentials>,
    sdk_config: Option<SdkConfig>,
    client: Option<Client>,
}

impl fmt::Debug for KinesisSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSourceBuilder")
            .field("stream", &self.stream)
            .field("read", &self.read)
            .field("fan_out", &self.fan_out)
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .field("credentials", &self.credentials.as_ref().map(|_| "<static, redacted>"))
            .field("sdk_config", &self.sdk_config.as_ref().map(|_| "<given>"))
            .field("client", &self.client.as_ref().map(|_| "<given>"))
            .finish()
    }
}

impl KinesisSourceBuilder {
    pub(crate) fn new(stream: String) -> Self {
        KinesisSourceBuilder {
            stream,
            read: ReadConfig::default(),
            fan_out: None,
            region: None,
            endpoint_url: None,
            credentials: None,
            sdk_config: None,
            client: None,
        }
    }

    /// The same configuration for another stream (a multi-stream source builds one per stream).
    pub(crate) fn for_stream(mut self, stream: String) -> Self {
        self.stream = stream;
        self
    }

    /// The region (overrides `AWS_REGION` and the profile).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The service endpoint, e.g. `http://127.0.0.1:4567` for an emulator (overrides
    /// `AWS_ENDPOINT_URL_KINESIS`).
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

    /// All reading limits and timings at once.
    pub fn read_config(mut self, read: ReadConfig) -> Self {
        self.read = read;
        self
    }

    /// Records per `GetRecords` call (1 ..= 10 000).
    pub fn max_records(mut self, n: i32) -> Self {
        self.read.max_records = n;
        self
    }

    /// Wait after a read that found nothing new.
    pub fn idle_interval(mut self, d: Duration) -> Self {
        self.read.idle_interval = d;
        self
    }

    /// Timeout of every call to the service.
    pub fn operation_timeout(mut self, d: Duration) -> Self {
        self.read.operation_timeout = d;
        self
    }

    /// `MaxResults` of each `ListShards` page.
    pub fn list_page_size(mut self, n: i32) -> Self {
        self.read.list_page_size = Some(n);
        self
    }

    /// Read through enhanced fan-out as the stream consumer `consumer_name` (one name per
    /// application; every worker of it uses the same) instead of polling `GetRecords`. Building
    /// the source registers the consumer, or finds it registered, and waits until it is
    /// `ACTIVE`; each leased shard is then read by a `SubscribeToShard` subscription. The
    /// consumer is never deregistered by the source: see
    /// [`KinesisSourceBuilder::deregister_consumer`]. Costs and trade-offs: docs/kinesis.md.
    pub fn enhanced_fan_out(mut self, consumer_name: impl Into<String>) -> Self {
        self.fan_out = Some(FanOutConfig::new(consumer_name));
        self
    }

    /// Enhanced fan-out with all its settings at once (see
    /// [`KinesisSourceBuilder::enhanced_fan_out`]).
    pub fn fan_out_config(mut self, config: FanOutConfig) -> Self {
        self.fan_out = Some(config);
        self
    }

    /// Builds the source (loading the AWS configuration unless a client was given). With
    /// enhanced fan-out, also registers or finds the consumer and waits until it is `ACTIVE`.
    pub async fn build(self) -> Result<KinesisSource> {
        let fan_out = self.fan_out.clone();
        if let Some(f) = &fan_out {
            f.validate()?;
        }
        let read = self.read.clone();
        let (api, stream) = self.api().await?;
        let api = Arc::new(api);
        let source = KinesisSource::with_api(api.clone(), stream, read.clone())?;
        match fan_out {
            None => Ok(source),
            Some(config) => {
                let consumer_arn = consumer::register_or_find(&*api, &config, &read).await?;
                let fan = FanOut { api, config: Arc::new(config), consumer_arn };
                Ok(source.with_fan_out(fan))
            }
        }
    }

    /// Deregisters the stream consumer named by [`KinesisSourceBuilder::enhanced_fan_out`]
    /// without building a source; `Ok(false)` when it was not registered. Every worker
    /// subscribed as that consumer loses its subscriptions: this is for retiring an
    /// application, never part of stopping a worker.
    pub async fn deregister_consumer(self) -> Result<bool> {
        let Some(config) = self.fan_out.clone() else {
            return Err(Error::Config(
                "deregister_consumer needs the consumer's name: call enhanced_fan_out first".into(),
            ));
        };
        config.validate()?;
        let (api, _) = self.api().await?;
        consumer::deregister(&api, &config.consumer_name).await
    }

    /// The SDK-backed calls for the configured stream.
    async fn api(self) -> Result<(SdkApi, StreamRef)> {
        self.read.validate()?;
        if self.stream.is_empty() {
            return Err(Error::Config("the Kinesis stream name must not be empty".into()));
        }
        let timeout = self.read.operation_timeout;
        let client = match self.client {
            Some(c) => c,
            None => {
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
                let mut conf = aws_sdk_kinesis::config::Builder::from(&base).timeout_config(
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
                        "no AWS region: set AWS_REGION, a profile region, or the builder's region"
                            .into(),
                    ));
                }
                Client::from_conf(conf)
            }
        };
        let stream = StreamRef::parse(&self.stream);
        Ok((SdkApi::new(client, stream.clone(), timeout), stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_in_debug_output() {
        let b = KinesisSource::builder("orders").static_credentials("AKIDEXAMPLE", "s3cr3t-key");
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cr3t-key") && !shown.contains("AKIDEXAMPLE"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[tokio::test]
    async fn bad_settings_are_refused_when_building() {
        let empty = KinesisSource::builder("").region("us-east-1").build().await;
        assert!(matches!(empty, Err(Error::Config(_))));
        let zero = KinesisSource::builder("s").region("us-east-1").max_records(0).build().await;
        assert!(matches!(zero, Err(Error::Config(_))));
    }
}
