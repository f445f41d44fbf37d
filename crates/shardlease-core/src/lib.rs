//! # shardlease-core
//!
//! The heart of shardlease: the lease model, the small traits a coordination store, a stream and a
//! record processor implement, the greedy balancer, and the worker runtime that ties them together.
//! Backends live in their own crates and depend only on this one; applications normally depend on
//! the `shardlease` facade instead.
//!
//! The public surface is curated the same way as the facade's:
//! - the crate root holds what an application uses: [`Worker`] and its builder, handle, stats and
//!   shutdown report, [`Config`] (and [`Balance`]), the processor side ([`RecordProcessor`], [`ProcessorFactory`],
//!   [`processor_fn`], [`LeaseContext`], [`CheckpointHandle`], [`Checkpointer`], [`LeaseToken`],
//!   [`Epoch`]), the records ([`Record`], [`Batch`], [`Position`], [`SequenceNumber`]), the ids,
//!   the sources ([`ShardSource`], [`ShardReader`], [`ShardInfo`], [`HashRange`],
//!   [`MemorySource`]) and the one [`Error`];
//! - [`store`]: what a store author needs: the [`LeaseStore`](store::LeaseStore)
//!   compare-and-set contract every backend implements, the records it stores, decorators,
//!   change notification, the in-memory store and the store URL helpers;
//! - [`balancer`]: the [`Balancer`](balancer::Balancer) trait (a pure function from a snapshot to
//!   the actions of one pass) and the greedy balancer, for those who plug their own;
//! - [`telemetry`]: the names of the metrics the worker and the stores emit.
//!
//! ## Example
//!
//! A worker consuming an in-memory stream of 4 shards, its leases in the in-memory store. A
//! backend crate's store (or the facade's `shardlease::connect(url)`) takes the store's place;
//! the rest stays the same.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use shardlease_core::store::{LeaseStore, MemoryBackend};
//! use shardlease_core::{processor_fn, Config, MemorySource, Namespace, Position, Worker};
//!
//! #[tokio::main]
//! async fn main() -> shardlease_core::Result<()> {
//!     let store: Arc<dyn LeaseStore> =
//!         Arc::new(MemoryBackend::new().store(Namespace::new("orders")?));
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
//!     let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
//!     while processed.load(Ordering::SeqCst) < 100 && tokio::time::Instant::now() < deadline {
//!         tokio::time::sleep(Duration::from_millis(20)).await;
//!     }
//!     let report = worker.shutdown().await; // checkpoints and releases every lease
//!     assert!(report.is_clean(), "{report:?}");
//!     assert_eq!(processed.load(Ordering::SeqCst), 100);
//!     Ok(())
//! }
//! ```
//!
//! ## Guides
//!
//! [The algorithm][algorithm] says why each rule exists (balancer, liveness, self-fencing, handoff
//! and fencing, shard lifecycle); [implementing a store][implementing-a-store] states the store
//! contract and how to run its conformance suite (`shardlease-testkit`); [operations][operations]
//! lists every metric of [`telemetry`] and what to alert on.
//!
//! [algorithm]: https://github.com/shardlease/shardlease/blob/main/docs/algorithm.md
//! [implementing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/implementing-a-store.md
//! [operations]: https://github.com/shardlease/shardlease/blob/main/docs/operations.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod balance_mode;
pub mod balancer;
mod checkpointer;
mod clock;
mod config;
mod error;
mod ids;
mod instrumented;
mod lease;
mod liveness;
mod load;
mod load_meter;
mod memory;
mod multi_source;
mod notify;
mod position;
mod processor;
mod redact;
mod runtime;
mod source;
pub mod store;
mod store_decorator;
mod store_url;
pub mod telemetry;
mod worker_record;

// The root holds what an application uses; a store author's items are in [`store`], a balancer
// author's in [`balancer`], the metric names in [`telemetry`].
pub use balance_mode::{Balance, LoadBalance};
pub use checkpointer::Checkpointer;
pub use config::Config;
pub use error::{BoxError, Error, ErrorChain, Result};
pub use ids::{LeaseKey, Namespace, WorkerId, DEFAULT_NAMESPACE};
pub use lease::{Epoch, LeaseToken};
pub use memory::MemorySource;
pub use multi_source::{
    qualify, split_key, validate_stream_name, MultiSource, MultiSourceBuilder, StreamSet,
    DEFAULT_REMOVAL_GRACE, MAX_STREAM_NAME_BYTES, STREAM_SEPARATOR,
};
pub use position::{Position, SequenceNumber};
pub use processor::{
    processor_fn, CheckpointHandle, LeaseContext, ProcessorFactory, RecordProcessor,
};
pub use runtime::{
    LoopFailure, ReleasedLease, ShutdownReport, StopCause, Worker, WorkerBuilder, WorkerHandle,
    WorkerStats,
};
pub use source::{Batch, HashRange, Record, ShardInfo, ShardReader, ShardSource};

/// The separator of a worker id's incarnation suffix (`<id>#<random>`), for the testkit's audit
/// (feature `test-util`).
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub use runtime::INCARNATION_SEPARATOR;
