//! [`DynamoDbStreamsSource`]: a DynamoDB table's stream as a shardlease
//! [`ShardSource`].
//!
//! Listing goes through the source's one [`Lister`] (paced, shared by every lease of the
//! worker); each leased shard is read by a [`StreamsReader`]. The shard model differs from
//! Kinesis and the core needs nothing special for it: one parent per shard, no hash ranges,
//! shards that close on their own about every four hours, 24 h retention.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::{LeaseKey, Position, Result, ShardInfo, ShardReader, ShardSource};

use crate::api::Api;
use crate::builder::DynamoDbStreamsSourceBuilder;
use crate::config::ReadConfig;
use crate::lister::Lister;
use crate::reader::StreamsReader;

/// A DynamoDB table's stream, shared by a fleet through leases. Build one with
/// [`DynamoDbStreamsSource::builder`]; clones share the client and the listing.
#[derive(Clone, Debug)]
pub struct DynamoDbStreamsSource {
    api: Arc<dyn Api>,
    lister: Arc<Lister>,
    config: Arc<ReadConfig>,
}

impl DynamoDbStreamsSource {
    /// A builder for the stream of `table` (its newest stream, found with `ListStreams`), or
    /// for the stream of that ARN when `table_or_stream_arn` starts with `arn:`.
    pub fn builder(table_or_stream_arn: impl Into<String>) -> DynamoDbStreamsSourceBuilder {
        DynamoDbStreamsSourceBuilder::new(table_or_stream_arn.into())
    }

    /// A source over any implementation of the calls (the SDK's, or a test's fake).
    pub(crate) fn with_api(api: Arc<dyn Api>, config: ReadConfig) -> Result<Self> {
        config.validate()?;
        let config = Arc::new(config);
        let lister = Arc::new(Lister::new(api.clone(), config.clone()));
        Ok(DynamoDbStreamsSource { api, lister, config })
    }

    /// The stream's ARN.
    pub fn stream_arn(&self) -> &str {
        self.api.stream_arn()
    }

    /// The reading settings.
    pub fn read_config(&self) -> &ReadConfig {
        &self.config
    }
}

#[async_trait]
impl ShardSource for DynamoDbStreamsSource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        self.lister.shards().await
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        let reader = StreamsReader::open(
            self.api.clone(),
            self.lister.clone(),
            self.config.clone(),
            shard.clone(),
            from,
        )
        .await?;
        Ok(Box::new(reader))
    }
}
