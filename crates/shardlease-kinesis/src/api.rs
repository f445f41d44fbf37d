//! The three Kinesis calls the source makes, behind a small internal trait.
//!
//! The reader's loop (limits, backoff, iterator renewal, shard end) talks to this trait only, so
//! the same loop runs against the AWS SDK ([`crate::sdk`]) and, in unit tests, against a scripted
//! fake that throttles, expires iterators and pages listings on demand.

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
    /// The shard iterator is too old: get a new one where reading stopped.
    ExpiredIterator,
    /// Anything else, retryable or not as the core error says.
    Other(Error),
}

impl ApiError {
    /// The error as the core sees it.
    pub fn into_error(self) -> Error {
        match self {
            ApiError::Throttled(e) | ApiError::Other(e) => e,
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
