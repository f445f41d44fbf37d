//! The Kinesis calls the source makes, behind two small internal traits: [`Api`] for listing and
//! polling, [`FanOutApi`] for enhanced fan-out (consumers and `SubscribeToShard`).
//!
//! The reading loops (limits, backoff, iterator renewal, resubscription, shard end) talk to these
//! traits only, so the same loops run against the AWS SDK ([`crate::sdk`]) and, in unit tests,
//! against scripted fakes that throttle, expire iterators, page listings and end subscriptions on
//! demand.

use std::fmt::Debug;

use async_trait::async_trait;
use bytes::Bytes;
use shardlease_core::{Error, ShardInfo};

/// How a stream is addressed in a request: by name, or by ARN (cross-account and newer APIs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamRef {
    /// The stream's name, e.g. `orders`.
    Name(String),
    /// The stream's ARN, e.g. `arn:aws:kinesis:us-east-1:123456789012:stream/orders`.
    Arn(String),
}

impl StreamRef {
    /// A stream by name, or by ARN when `s` starts with `arn:`.
    pub fn parse(s: &str) -> Self {
        if s.starts_with("arn:") {
            StreamRef::Arn(s.to_owned())
        } else {
            StreamRef::Name(s.to_owned())
        }
    }

    /// The stream's name (the last path segment of an ARN), for logs and metric labels.
    pub fn label(&self) -> &str {
        match self {
            StreamRef::Name(n) => n,
            StreamRef::Arn(a) => a.rsplit('/').next().unwrap_or(a),
        }
    }
}

/// Where a shard iterator starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IteratorStart {
    TrimHorizon,
    Latest,
    AtTimestamp(i64),
    AtSequence(String),
}

/// One page of `ListShards`: the first page names the stream, later ones only carry the token
/// (the API refuses both together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListPage {
    First { max_results: Option<i32> },
    Next { token: String, max_results: Option<i32> },
}

/// What one `ListShards` call returned.
#[derive(Clone, Debug, Default)]
pub(crate) struct ShardPage {
    pub shards: Vec<ShardInfo>,
    pub next_token: Option<String>,
}

/// One record as `GetRecords` returns it (before de-aggregation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawRecord {
    pub seq: String,
    pub partition_key: String,
    pub data: Bytes,
    pub arrival_millis: i64,
}

/// What one `GetRecords` call returned.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordsPage {
    pub records: Vec<RawRecord>,
    /// `None`: the shard is closed and fully read.
    pub next_iterator: Option<String>,
    pub millis_behind: Option<i64>,
    /// The children, when the service reports them at shard end (real Kinesis does; the
    /// emulators do not).
    pub children: Vec<ShardInfo>,
}

/// A failed call, classified the way the reader reacts to it.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// `ProvisionedThroughputExceeded`, `LimitExceeded`, KMS throttling: back off with jitter.
    Throttled(Error),
    /// `ResourceInUseException`: another subscription to the shard was opened moments ago (or
    /// the consumer is not active yet); back off with jitter and try again.
    InUse(Error),
    /// The shard iterator is too old: get a new one where reading stopped.
    ExpiredIterator,
    /// Anything else, retryable or not as the core error says.
    Other(Error),
}

impl ApiError {
    /// The error as the core sees it.
    pub fn into_error(self) -> Error {
        match self {
            ApiError::Throttled(e) | ApiError::InUse(e) | ApiError::Other(e) => e,
            ApiError::ExpiredIterator => Error::retryable("Kinesis shard iterator expired"),
        }
    }
}

/// The calls the source makes. Each implementation bounds every call by a timeout.
#[async_trait]
pub(crate) trait Api: Send + Sync + Debug {
    async fn list_shards(&self, page: ListPage) -> Result<ShardPage, ApiError>;
    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError>;
    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError>;
}

/// The state of a registered stream consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConsumerState {
    Creating,
    Active,
    Deleting,
}

/// A registered stream consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConsumerInfo {
    pub arn: String,
    pub state: ConsumerState,
}

/// One `SubscribeToShardEvent`.
#[derive(Clone, Debug, Default)]
pub(crate) struct ShardEvent {
    pub records: Vec<RawRecord>,
    /// Where a new subscription continues; `None` (or empty from the service) after the last
    /// event of a closed shard.
    pub continuation: Option<String>,
    pub millis_behind: Option<i64>,
    /// The children, in the last event of a closed shard.
    pub children: Vec<ShardInfo>,
}

/// An open subscription: the events of one shard, in order.
#[async_trait]
pub(crate) trait EventStream: Send + Debug {
    /// The next event; `None` once the service ended the subscription (its session is over).
    async fn recv(&mut self) -> Result<Option<ShardEvent>, ApiError>;
}

/// The enhanced fan-out calls. Each implementation bounds every call (but not the wait for
/// an event) by a timeout.
#[async_trait]
pub(crate) trait FanOutApi: Send + Sync + Debug {
    /// The ARN of the stream (consumers are registered by stream ARN).
    async fn stream_arn(&self) -> Result<String, ApiError>;
    /// The consumer of that name, or `None` when none is registered.
    async fn describe_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<Option<ConsumerInfo>, ApiError>;
    /// Registers a consumer; `InUse` when one of that name exists already.
    async fn register_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<ConsumerInfo, ApiError>;
    /// Deregisters the consumer; `Ok(false)` when none of that name was registered.
    async fn deregister_consumer(&self, stream_arn: &str, name: &str) -> Result<bool, ApiError>;
    /// Opens a subscription to `shard` for the consumer, starting at `start`.
    async fn subscribe(
        &self,
        consumer_arn: &str,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, ApiError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_named_or_addressed_by_arn() {
        assert_eq!(StreamRef::parse("orders"), StreamRef::Name("orders".into()));
        let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";
        assert_eq!(StreamRef::parse(arn), StreamRef::Arn(arn.into()));
        assert_eq!(StreamRef::parse(arn).label(), "orders");
        assert_eq!(StreamRef::parse("orders").label(), "orders");
    }
}
