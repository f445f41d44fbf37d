//! # shardlease-core
//!
//! The heart of shardlease: the lease model, the small traits a coordination store, a stream and a
//! record processor implement, the greedy balancer, and the worker runtime that ties them together.
//! Backends live in their own crates and depend only on this one; applications normally depend on
//! the `shardlease` facade instead.
//!
//! The moving parts, each in a module of its own:
//! - [`LeaseStore`](store::LeaseStore): the compare-and-set contract every backend implements;
//! - [`ShardSource`](source::ShardSource): where records come from;
//! - [`Checkpointer`](checkpointer::Checkpointer): where positions are persisted, fenced by epoch;
//! - [`RecordProcessor`](processor::RecordProcessor): user code, one per held lease;
//! - [`Balancer`](balancer::Balancer): a pure function from a snapshot to the actions of one pass;
//! - [`Worker`](runtime::Worker): heartbeats, liveness, balance passes, shard sync, one task per lease.
//!
//! See `docs/algorithm.md` in the repository for why each rule exists.

pub mod balancer;
pub mod checkpointer;
pub mod clock;
pub mod config;
pub mod error;
mod ids;
pub mod instrumented;
pub mod lease;
pub mod liveness;
pub mod memory;
pub mod notify;
pub mod position;
pub mod processor;
pub mod redact;
pub mod runtime;
pub mod source;
pub mod store;
pub mod store_decorator;
pub mod store_url;
pub mod telemetry;
pub mod worker_record;

pub use balancer::{Balancer, GreedyBalancer, OnePerPassBalancer, Plan, Snapshot};
pub use checkpointer::{Checkpointer, StoreCheckpointer};
pub use config::Config;
pub use error::{BoxError, Error, ErrorChain, Result};
pub use ids::{LeaseKey, Namespace, WorkerId, DEFAULT_NAMESPACE};
pub use instrumented::InstrumentedStore;
pub use lease::{Claim, Epoch, Lease, LeaseToken, Version, VersionedLease};
pub use memory::{MemoryBackend, MemorySnapshot, MemorySource, MemoryStore, FIRST_SEQUENCE};
pub use notify::{ChangeStream, StoreChange};
pub use position::{Position, SequenceNumber};
pub use processor::{
    processor_fn, CheckpointHandle, LeaseContext, ProcessorFactory, RecordProcessor,
};
pub use runtime::{
    ReleasedLease, ShutdownReport, Worker, WorkerBuilder, WorkerHandle, WorkerStats,
};
pub use source::{Batch, HashRange, Record, ShardInfo, ShardReader, ShardSource};
pub use store::{CorruptRecord, CreateOutcome, LeaseStore, Listing};
pub use store_decorator::StoreDecorator;
pub use worker_record::WorkerRecord;
