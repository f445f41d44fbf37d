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
//! data stream (the `kinesis` module and `KinesisSource`; `docs/kinesis.md`).
//!
//! Every URL may carry `?namespace=NAME` (default `default`); [`connect_namespace`] takes it as an
//! argument instead. The store returned is wrapped in an
//! [`InstrumentedStore`](store::InstrumentedStore) (a span and a latency histogram per call,
//! errors counted by kind); [`connect_bare`] skips the wrapper.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> shardlease::Result<()> {
//! let store = shardlease::connect("memory://?namespace=orders").await?;
//! assert!(store.list_leases().await?.items.is_empty());
//! # Ok(()) }
//! ```

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
/// and `docs/kinesis.md`.
#[cfg(feature = "kinesis")]
pub use shardlease_kinesis as kinesis;
#[cfg(feature = "kinesis")]
pub use shardlease_kinesis::{KinesisSource, MultiStreamSource};

/// The README's code, compiled as a doctest so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// docs/getting-started.md's code, compiled as a doctest for the same reason.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/getting-started.md")]
pub struct GettingStartedDoctests;
