//! In-memory implementations of the two external dependencies of a worker: a coordination store
//! ([`MemoryStore`], over a [`MemoryBackend`] holding many namespaces) and a sharded stream
//! ([`MemorySource`]).
//!
//! They exist so the whole runtime can be run, tested and demonstrated in one process with no
//! external service: unit and conformance tests, simulations that reshard a stream while workers
//! consume it (and roll the store back with [`MemoryStore::snapshot`] and
//! [`MemoryStore::restore`]), the quickstart and `memory://` URLs. They follow the same contracts
//! as the real backends (compare-and-set with versions that never repeat, even across a
//! rollback; big, strictly increasing sequence numbers; closed shards that report their
//! children), so code tested against them behaves the same against DynamoDB or Kinesis.

mod snapshot;
mod source;
mod store;

pub use snapshot::MemorySnapshot;
pub use source::MemorySource;
pub use store::{MemoryBackend, MemoryStore};
