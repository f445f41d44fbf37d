//! # shardlease-dynamodb-streams
//!
//! Amazon DynamoDB Streams as a shardlease [`ShardSource`](shardlease_core::ShardSource): a
//! fleet of workers shares a table's change stream through leases in any shardlease store, and
//! each change reaches a processor once per lineage, in order per item.
//!
//! - **Listing** pages through `DescribeStream` (`ExclusiveStartShardId`), paced
//!   (`describe_calls_per_second`) and shared by every lease of a worker. A parent that still
//!   reports itself open after its child is listed counts as closed; a closed leaf whose child is
//!   not listed yet is asked about again, never finished early (unless the stream is disabled);
//!   a finished shard's children come from one `ShardFilter` `CHILD_SHARDS` call, with the full
//!   listing as the fallback.
//! - **Reading** polls `GetRecords` until the next iterator is null, renews expired iterators
//!   after the last change read, backs off with jitter when throttled, supports every
//!   [`Position`](shardlease_core::Position) (`AT_TIMESTAMP` by skipping from the trim horizon),
//!   and treats data past retention as [`OnTrimmed`] says: fail loudly (the default) or skip to
//!   the oldest change kept, with an ERROR and a count. Never silently.
//! - **Records** carry the change as JSON (the shape AWS Lambda gives a DynamoDB stream record);
//!   [`ChangeEvent::from_record`] types it: INSERT / MODIFY / REMOVE, keys, new and old image,
//!   approximate creation time, whether TTL removed the item. The partition key is the item's
//!   key, the sequence number the change's (compared as a number).
//! - **Lag**: each batch reports the age of its newest change, which the core publishes as the
//!   per-shard gauge `shardlease_millis_behind_latest` (the service has no `MillisBehindLatest`).
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_dynamodb_streams::DynamoDbStreamsSource;
//! let source = DynamoDbStreamsSource::builder("orders") // a table, or a stream ARN
//!     .region("us-east-1")
//!     .endpoint_url("http://127.0.0.1:5000") // an emulator; omit for AWS
//!     .static_credentials("dummy", "dummy") // emulator only; omit to use the default chain
//!     .build()
//!     .await?;
//! # let _ = source; Ok(()) }
//! ```
//!
//! See the [DynamoDB Streams guide][guide] for the shard model, the costs and what differs from
//! the KCL's DynamoDB Streams adapter.
//!
//! [guide]: https://github.com/shardlease/shardlease/blob/main/docs/dynamodb-streams.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod api;
mod builder;
pub mod change;
mod config;
mod lister;
mod reader;
mod sdk;
mod source;
pub mod telemetry;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod fleet_tests;
#[cfg(test)]
mod reader_tests;

/// The AWS SDK crates this source is built on, so a caller can build a client or config of its
/// own ([`DynamoDbStreamsSourceBuilder::client`], [`DynamoDbStreamsSourceBuilder::sdk_config`])
/// with exactly the versions shardlease uses.
pub use {aws_config, aws_sdk_dynamodbstreams};

pub use builder::DynamoDbStreamsSourceBuilder;
pub use change::{AttributeValue, ChangeEvent, EventName, Item};
pub use config::{OnTrimmed, ReadConfig, MAX_RECORDS_LIMIT};
pub use reader::StreamsReader;
pub use source::DynamoDbStreamsSource;
