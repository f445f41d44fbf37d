//! The DynamoDB Streams calls the source makes, behind one small internal trait, [`Api`].
//!
//! The listing, reading and lineage rules (rate limits, backoff, iterator renewal, trimmed data,
//! parents still listed open, leaves whose children are not listed yet) talk to this trait only,
//! so the same code runs against the AWS SDK ([`crate::sdk`]) and, in tests, against the
//! in-process fake ([`crate::fake`]) that rotates, trims, expires and throttles on demand: the
//! things moto's server never does.

use std::fmt::Debug;

use async_trait::async_trait;
use bytes::Bytes;
use shardlease_core::Error;

/// Where a shard iterator starts. `AT_TIMESTAMP` is not among them: the service added that
/// iterator type late and emulators lack it, so the reader starts at the trim horizon and skips
/// the changes made before the timestamp, which works on every endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IteratorStart {
    TrimHorizon,
    Latest,
    AfterSequence(String),
}

/// A shard as `DescribeStream` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamShard {
    pub id: String,
    /// The shard it continues (DynamoDB Streams shards have at most one parent).
    pub parent: Option<String>,
    /// `SequenceNumberRange.EndingSequenceNumber`: present once the shard is closed.
    pub ending_seq: Option<String>,
}

/// The stream's status: a disabled stream closes its shards without children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamStatus {
    Enabling,
    Enabled,
    Disabling,
    Disabled,
}

/// Which shards one `DescribeStream` call asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DescribeRequest {
    /// A page of every shard, after `exclusive_start` (the previous page's last evaluated id).
    Page { exclusive_start: Option<String> },
    /// The children of `parent` (`ShardFilter` `CHILD_SHARDS`). A service that ignores the
    /// filter answers with a page of every shard; the caller keeps only the children.
    ChildrenOf { parent: String },
}

/// What one `DescribeStream` call returned.
#[derive(Clone, Debug)]
pub(crate) struct StreamPage {
    pub status: StreamStatus,
    pub shards: Vec<StreamShard>,
    /// `LastEvaluatedShardId`: `Some` when more pages follow.
    pub last_evaluated: Option<String>,
}

/// One change record as `GetRecords` returns it, already in its raw JSON form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawChange {
    pub seq: String,
    /// `ApproximateCreationDateTime`, milliseconds since the Unix epoch.
    pub created_millis: i64,
    /// The item's key attributes as canonical JSON (the record's partition key).
    pub keys: String,
    /// The whole record as JSON, in the form of a Lambda DynamoDB event record
    /// (see [`crate::change`]).
    pub json: Bytes,
}

/// What one `GetRecords` call returned.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordsPage {
    pub records: Vec<RawChange>,
    /// `None`: the shard is closed and read to its end.
    pub next_iterator: Option<String>,
}

/// A failed call, classified the way the source reacts to it.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// `LimitExceededException`, `ThrottlingException`: back off with jitter.
    Throttled(Error),
    /// `ExpiredIteratorException`: get a new iterator where reading stopped.
    ExpiredIterator,
    /// `TrimmedDataAccessException`: the records asked for are past the 24 h retention.
    Trimmed(Error),
    /// `ResourceNotFoundException`: the stream or the shard is gone (a shard is deleted once
    /// every record in it is past retention).
    NotFound(Error),
    /// Anything else, retryable or not as the core error says.
    Other(Error),
}

impl ApiError {
    /// The error as the core sees it.
    pub(crate) fn into_error(self) -> Error {
        match self {
            ApiError::Throttled(e)
            | ApiError::Trimmed(e)
            | ApiError::NotFound(e)
            | ApiError::Other(e) => e,
            ApiError::ExpiredIterator => {
                Error::retryable("DynamoDB Streams shard iterator expired")
            }
        }
    }
}

/// The calls the source makes, on one stream (its ARN is the implementation's). Each
/// implementation bounds every call by a timeout.
#[async_trait]
pub(crate) trait Api: Send + Sync + Debug {
    /// The stream's ARN, for logs and metric labels.
    fn stream_arn(&self) -> &str;
    async fn describe_stream(&self, request: DescribeRequest) -> Result<StreamPage, ApiError>;
    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError>;
    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError>;
}
