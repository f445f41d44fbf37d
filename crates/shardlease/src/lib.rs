//! # shardlease
//!
//! Consume a sharded stream (Amazon Kinesis first) with a fleet of workers that share the shards
//! through leases kept in a pluggable coordination store.
//!
//! This is the crate applications depend on. Its root holds what an application uses: the
//! [`Worker`] (built with a [`WorkerBuilder`], run through a [`WorkerHandle`]), its [`Config`],
//! the processor side ([`RecordProcessor`], [`ProcessorFactory`], [`processor_fn`],
//! [`LeaseContext`], [`CheckpointHandle`]; [`Checkpointer`], [`LeaseToken`] and [`Epoch`] for
//! custom checkpointers and fencing sinks), the records ([`Record`], [`Batch`], [`Position`],
//! [`SequenceNumber`]), the shard sources ([`ShardSource`], [`MemorySource`], Kinesis with the
//! `kinesis` feature; several streams as one with [`MultiSource`]), the one [`Error`], and [`connect`], which turns a URL into a store, so
//! switching stores changes one string and no code.
//!
//! What a store author needs is in [`store`], which is also where an application that reads the
//! store it connected to finds the types it names ([`LeaseStore`](store::LeaseStore),
//! [`VersionedLease`](store::VersionedLease), [`WorkerRecord`](store::WorkerRecord), ...). The
//! [`Balancer`](balancer::Balancer) trait, for those who plug their own, is in [`balancer`]; the
//! names of the metrics in [`telemetry`].
//!
//! Each backend is behind a feature flag, off by default but for embedded SQLite:
//!
//! | URL | store | feature |
//! |---|---|---|
//! | `memory://` | in-memory, process-wide (tests, demos) | always |
//! | `redis://[:password@]host[:port][/db]`, `rediss://…` | Redis (Lua compare-and-set; `?key_prefix=` sets the key prefix) | `redis` (`redis-tls` for `rediss://`) |
//! | `sqlite://path/to/leases.db`, `sqlite::memory:` | SQLite, embedded (bundled; processes on one machine can share a file) | `sqlite` (default) |
//! | `postgres://user:pw@host:5432/db`, `postgresql://…` | PostgreSQL | `postgres` (`sql-tls` for `sslmode=require`) |
//! | `mysql://user:pw@host:3306/db`, `mariadb://…` | MySQL 8 / MariaDB 10.5+ | `mysql` (`sql-tls` for TLS) |
//! | `etcd://[user:pw@]host:2379[,host:2379]`, `etcds://…` | etcd v3 (Txn compare-and-set; change notification by watch, `?watch=false` turns it off; `?prefix=` sets the key prefix) | `etcd` (`etcd-tls` for `etcds://`) |
//! | `dynamodb://TABLE?region=R&endpoint=URL&create_table=true` | DynamoDB (AWS default credential and region chains; namespaces share the table) | `dynamodb` |
//!
//! SQL URLs also take `?table_prefix=` (default `shardlease_`), `?create_schema=false` (the tables
//! are created on connect unless told not to) and `?max_connections=`.
//!
//! The shard source is the in-memory [`MemorySource`] or, with the `kinesis` feature, a Kinesis
//! data stream (the `kinesis` module and `KinesisSource`; the [Kinesis guide][kinesis]), or with
//! the `dynamodb-streams` feature a DynamoDB table's change stream (the `dynamodb_streams` module
//! and `DynamoDbStreamsSource`).
//!
//! Every URL may carry `?namespace=NAME` (default `default`); [`connect_namespace`] takes it as an
//! argument instead. The store returned is wrapped in an
//! [`InstrumentedStore`](store::InstrumentedStore) (a span and a latency histogram per call,
//! errors counted by kind); [`connect_bare`] skips the wrapper.
//!
//! ## Example
//!
//! A worker consuming an in-memory stream of 4 shards, its leases in the in-memory store (a
//! `sqlite://`, `postgres://`, `redis://`… URL changes nothing else):
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use shardlease::{processor_fn, Config, MemorySource, Position, Worker};
//!
//! #[tokio::main]
//! async fn main() -> shardlease::Result<()> {
//!     let store = shardlease::connect("memory://?namespace=orders").await?;
//!     let stream = Arc::new(MemorySource::new(4));
//!     for n in 0..100 {
//!         stream.put(&format!("customer-{n}"), format!("order {n}"));
//!     }
//!     let processed = Arc::new(AtomicUsize::new(0));
//!     let counter = Arc::clone(&processed);
//!     let processor = processor_fn(move |_ctx, batch| {
//!         let counter = Arc::clone(&counter);
//!         async move {
//!             counter.fetch_add(batch.records.len(), Ordering::SeqCst);
//!             Ok(()) // the worker checkpoints after the batch, fenced by the lease's epoch
//!         }
//!     });
//!     let config = Config::new("orders")?
//!         .with_heartbeat(Duration::from_millis(200))
//!         .with_initial_position(Position::TrimHorizon);
//!     let worker = Worker::builder(config, store, stream, processor).build()?.start();
//!     // A real consumer runs until its termination signal (see `WorkerHandle::stopped`).
//!     let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
//!     while processed.load(Ordering::SeqCst) < 100 && tokio::time::Instant::now() < deadline {
//!         tokio::time::sleep(Duration::from_millis(20)).await;
//!     }
//!     // Checkpoints, releases every lease and removes the worker's record.
//!     let report = worker.shutdown().await;
//!     assert!(report.is_clean(), "{report:?}");
//!     assert_eq!(processed.load(Ordering::SeqCst), 100);
//!     Ok(())
//! }
//! ```
//!
//! ## Guides
//!
//! In the repository's `docs/`: [getting started][getting-started], [choosing a
//! store][choosing-a-store], [operations][operations] (the `shardlease` command line, metrics and
//! alerts), [the algorithm][algorithm], [implementing a store][implementing-a-store],
//! [Kinesis][kinesis], [effectively-once output][effectively-once], [migrating from the
//! KCL][migrating-from-kcl], [reliability][reliability] (the fault campaign) and [TLS][tls]. The
//! versioning policy is in
//! [CHANGELOG.md](https://github.com/shardlease/shardlease/blob/main/CHANGELOG.md).
//!
//! [algorithm]: https://github.com/shardlease/shardlease/blob/main/docs/algorithm.md
//! [choosing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/choosing-a-store.md
//! [effectively-once]: https://github.com/shardlease/shardlease/blob/main/docs/effectively-once.md
//! [getting-started]: https://github.com/shardlease/shardlease/blob/main/docs/getting-started.md
//! [implementing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/implementing-a-store.md
//! [kinesis]: https://github.com/shardlease/shardlease/blob/main/docs/kinesis.md
//! [migrating-from-kcl]: https://github.com/shardlease/shardlease/blob/main/docs/migrating-from-kcl.md
//! [operations]: https://github.com/shardlease/shardlease/blob/main/docs/operations.md
//! [reliability]: https://github.com/shardlease/shardlease/blob/main/docs/reliability.md
//! [tls]: https://github.com/shardlease/shardlease/blob/main/docs/tls.md

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use shardlease_core::{
    processor_fn, Balance, Batch, BoxError, CheckpointHandle, Checkpointer, Config, Epoch, Error,
    ErrorChain, HashRange, LeaseContext, LeaseKey, LeaseToken, LoadBalance, MemorySource,
    MultiSource, MultiSourceBuilder, Namespace, Position, ProcessorFactory, Record,
    RecordProcessor, ReleasedLease, Result, SequenceNumber, ShardInfo, ShardReader, ShardSource,
    ShutdownReport, StreamSet, Worker, WorkerBuilder, WorkerHandle, WorkerId, WorkerStats,
};

pub use shardlease_core::{balancer, store, telemetry};

/// Multi-stream lease keys (`stream/shard`, see [`MultiSource`]): how a key is made and split,
/// and which stream names it can carry, for tools that write or read such keys.
pub use shardlease_core::{
    qualify, split_key, validate_stream_name, MAX_STREAM_NAME_BYTES, STREAM_SEPARATOR,
};

/// The attribute that lets a trait like [`RecordProcessor`] or [`LeaseStore`](store::LeaseStore)
/// have async methods: re-exported so writing a processor or a store needs no dependency of its
/// own.
pub use async_trait::async_trait;

mod connect;

pub use connect::{connect, connect_bare, connect_namespace, redact_url, DEFAULT_NAMESPACE};

/// Amazon Kinesis Data Streams as the [`ShardSource`] (feature `kinesis`): see [`KinesisSource`]
/// and the [Kinesis guide](https://github.com/shardlease/shardlease/blob/main/docs/kinesis.md).
#[cfg(feature = "kinesis")]
pub use shardlease_kinesis as kinesis;
#[cfg(feature = "kinesis")]
pub use shardlease_kinesis::{KinesisSource, MultiStreamSource};

/// Amazon DynamoDB Streams as the [`ShardSource`] (feature `dynamodb-streams`): a table's changes,
/// typed ([`ChangeEvent`]); see [`DynamoDbStreamsSource`] and the
/// [DynamoDB Streams guide](https://github.com/shardlease/shardlease/blob/main/docs/dynamodb-streams.md).
#[cfg(feature = "dynamodb-streams")]
pub use shardlease_dynamodb_streams as dynamodb_streams;
#[cfg(feature = "dynamodb-streams")]
pub use shardlease_dynamodb_streams::{ChangeEvent, DynamoDbStreamsSource};

/// This crate's README (its crates.io page), compiled as a doctest so it cannot drift from the
/// API. The repository's README and guides are compiled by the examples package.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
