//! # shardlease-kinesis
//!
//! Amazon Kinesis Data Streams as a shardlease [`ShardSource`](shardlease_core::ShardSource):
//! workers share a stream's shards through leases and read each shard by polling `GetRecords`,
//! or through enhanced fan-out (`SubscribeToShard`).
//!
//! - **Listing** pages through `ListShards` (`NextToken` alone after the first page) and reports
//!   parents (both parents of a merge), hash ranges and closed shards. A stream is addressed by
//!   name or by ARN.
//! - **Reading** honours every [`Position`](shardlease_core::Position), including sub-sequence
//!   numbers inside KPL aggregates; pins `LATEST` so no record is lost when a lease moves before
//!   its first checkpoint; keeps to the per-shard limits (5 calls/s, 2 MiB/s, a configurable
//!   batch size); backs off when idle and, with jitter, when throttled; renews expired
//!   iterators; reports `MillisBehindLatest` in each batch and as the per-shard gauge
//!   `shardlease_kinesis_millis_behind_latest`; detects shard end from a null next iterator and
//!   finds the children (from `ChildShards`, or by listing when the service omits them); and
//!   reads one batch ahead of the processor.
//! - **Enhanced fan-out** ([`KinesisSourceBuilder::enhanced_fan_out`]) registers or finds the
//!   application's stream consumer and keeps one subscription per leased shard: renewed at the
//!   end of each session from the continuation sequence number, restarted with jittered backoff
//!   when quiet or in use (`ResourceInUseException`), read one event ahead (backpressure), ended
//!   at shard end with the children. The consumer is deregistered only on request
//!   ([`KinesisSource::deregister_consumer`]).
//! - **KPL aggregates** are unpacked ([`kpl`]); a malformed one is delivered raw with a warning;
//!   user records whose hash key lies outside the shard's hash range are delivered too (they
//!   exist nowhere else) and counted ([`telemetry::OUT_OF_RANGE_USER_RECORDS`]).
//! - **Several streams** ([`MultiStreamSource`]): one fleet, one namespace, leases keyed
//!   `stream/shardId-…`, an initial position per stream, streams added and removed while it runs.
//! - **Configuration** follows the AWS SDK's default chain, with region, endpoint and credential
//!   overrides ([`KinesisSourceBuilder`]); every call has an operation timeout.
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_kinesis::KinesisSource;
//! let source = KinesisSource::builder("orders")
//!     .region("us-east-1")
//!     .endpoint_url("http://127.0.0.1:4567") // an emulator; omit for AWS
//!     .static_credentials("dummy", "dummy") // emulator only; omit to use the default chain
//!     .build()
//!     .await?;
//! # let _ = source; Ok(()) }
//! ```
//!
//! See the [Kinesis guide][kinesis] for the limits, positions, de-aggregation rules and when
//! fan-out is worth its cost, and [migrating from the KCL][migrating-from-kcl] to take over a KCL
//! application's checkpoints.
//!
//! [kinesis]: https://github.com/shardlease/shardlease/blob/main/docs/kinesis.md
//! [migrating-from-kcl]: https://github.com/shardlease/shardlease/blob/main/docs/migrating-from-kcl.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod api;
mod builder;
mod config;
mod convert;
mod fanout;
mod fetcher;
pub mod kpl;
mod listing;
mod multi;
mod reader;
mod sdk;
mod sdk_fanout;
mod source;
pub mod telemetry;

#[cfg(test)]
mod cost_bench;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod fetcher_tests;

/// The AWS SDK crates this source is built on, so a caller can build a client or config of its
/// own ([`KinesisSourceBuilder::client`], [`KinesisSourceBuilder::sdk_config`]) with exactly the
/// versions shardlease uses.
pub use {aws_config, aws_sdk_kinesis};

pub use api::StreamRef;
pub use builder::KinesisSourceBuilder;
pub use config::{ReadConfig, MAX_RECORDS_LIMIT};
pub use fanout::FanOutConfig;
pub use multi::{MultiStreamSource, MultiStreamSourceBuilder};
pub use reader::KinesisReader;
pub use source::KinesisSource;
pub use telemetry::MILLIS_BEHIND_GAUGE;
