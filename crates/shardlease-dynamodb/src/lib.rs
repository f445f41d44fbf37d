//! # shardlease-dynamodb
//!
//! A [`LeaseStore`](shardlease_core::store::LeaseStore) on Amazon DynamoDB. Open one with
//! [`DynamoDbStore::builder`] (a table or a URL, the AWS default chains or an SDK client of your
//! own, plus options) or, through the `shardlease` facade with its `dynamodb` feature, by URL:
//! `dynamodb://TABLE?region=REGION&endpoint=URL&namespace=NAME&create_table=true`.
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_dynamodb::{Billing, DynamoDbStore};
//! let store = DynamoDbStore::builder()
//!     .table("shardlease-leases") // region, credentials: the AWS default chains
//!     .namespace("orders")
//!     .create_table(true) // on-demand billing unless told otherwise
//!     .billing(Billing::OnDemand)
//!     .connect()
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## One table, namespaces in the key
//!
//! One table holds any number of namespaces (applications): partition key `pk` =
//! `<namespace>/leases` or `<namespace>/workers`, sort key `sk` = the lease key or worker id,
//! and the fleet signal one item under `<namespace>/fleet` (see the `layout` module). Why not one table per namespace, as the Java KCL does:
//!
//! - a store URL names a place, and the namespace is chosen apart from it (the facade's
//!   `connect_namespace`, the bench's fresh namespace per run, tests): a table per namespace
//!   would make every new namespace a `CreateTable` (seconds on AWS, an IAM permission most
//!   consumers should not hold, and an account-wide table quota);
//! - listings read only their own records: the workers are listed every heartbeat and must cost
//!   O(workers), which a `Scan` of a table that also holds the leases cannot do. Both listings
//!   are a consistent `Query` on one partition key, paged through `LastEvaluatedKey`;
//! - one table is one thing to provision, back up, alarm on and grant.
//!
//! The price: a namespace's leases share one partition key, so their writes share DynamoDB's
//! per-partition ceiling (about 1,000 write units per second before adaptive capacity splits the
//! collection by sort key). The [DynamoDB guide][dynamodb] works out what a fleet needs;
//! checkpoints are the only writes that grow with the shard count.
//!
//! ## Versions, conflicts, corruption, retries
//!
//! Every write draws a random 63-bit `version` ([`Version::random`](shardlease_core::store::Version)),
//! so a version never repeats for a key, even after a table is restored from a backup.
//! Conditional writes return the current item on failure (`ReturnValuesOnConditionCheckFailure`),
//! so a `Conflict` carries it at no extra cost. Batch writes are single conditional writes by
//! default, or `TransactWriteItems` with
//! [`DynamoDbStoreBuilder::transact_batches`] (fewer requests, twice the write units). An item that does not decode is
//! `Error::Corrupt` for that key (a listing's `corrupt` entry), never a panic. Throttling,
//! server errors and timeouts are retried by the SDK with jittered exponential backoff and then
//! reported as retryable `Error::Backend`. AWS keys never appear in an error, a log line or
//! `Debug` output.
//!
//! ## Guides
//!
//! [DynamoDB][dynamodb] (configuration, IAM, cost per fleet), [choosing a store][choosing-a-store],
//! [TLS][tls] (a private CA).
//!
//! [choosing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/choosing-a-store.md
//! [dynamodb]: https://github.com/shardlease/shardlease/blob/main/docs/dynamodb.md
//! [tls]: https://github.com/shardlease/shardlease/blob/main/docs/tls.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod codec;
mod config;
mod errors;
mod layout;
mod store;
mod table;

pub use config::{
    DynamoDbStoreBuilder, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_NAMESPACE, DEFAULT_TABLE_READY_TIMEOUT,
};
/// `url` with its keys masked, for logs and messages (core's, the one every store uses).
pub use shardlease_core::store::url::redact_url;
pub use store::batch::{MAX_TRANSACT_ITEMS, PARALLEL_BATCH_WRITES, TRANSACT_ATTEMPTS};
pub use store::DynamoDbStore;
pub use table::Billing;

/// Re-export of the SDK crate, so a client given to [`DynamoDbStoreBuilder::client`] is of the
/// version this crate was built with.
pub use aws_sdk_dynamodb;
