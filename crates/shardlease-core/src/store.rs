//! The store contract: the whole of what a coordination backend implements.
//!
//! It is deliberately tiny and free of lease logic: create-if-absent, read, list, compare-and-set
//! on an opaque [`Version`], delete, and a per-worker heartbeat upsert. Everything algorithmic
//! (who may take what, fencing, handoff) lives in the core and is written once.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::Result;
use crate::ids::WorkerId;
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::worker_record::WorkerRecord;

/// Outcome of [`LeaseStore::create_lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The lease was created at this version.
    Created(Version),
    /// A lease with that key already existed; nothing was written.
    AlreadyExists,
}

/// A record in a listing that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptRecord {
    /// The record's key as the store knows it.
    pub key: String,
    /// Why it could not be decoded.
    pub reason: String,
}

/// The result of a list call: the records that decoded, and the ones that did not.
/// A corrupt record never hides the others.
#[derive(Clone, Debug)]
pub struct Listing<T> {
    /// Records that decoded.
    pub items: Vec<T>,
    /// Records that did not.
    pub corrupt: Vec<CorruptRecord>,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing { items: Vec::new(), corrupt: Vec::new() }
    }
}

impl<T> Listing<T> {
    /// A listing with only good records.
    pub fn ok(items: Vec<T>) -> Self {
        Listing { items, corrupt: Vec::new() }
    }
}

/// A coordination store for one namespace. Linearizable per record.
///
/// Implementations are thin translations into the store's native compare-and-set; they hold no
/// lease logic. Run `shardlease_testkit`'s conformance suite against any implementation.
#[async_trait]
pub trait LeaseStore: Send + Sync + Debug {
    /// Creates `lease` if no lease with its key exists. Idempotent under races: exactly one of
    /// several concurrent creators sees `Created`.
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome>;

    /// Reads one lease. `Err(Corrupt)` when the record exists but cannot be decoded.
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>>;

    /// Lists every lease of the namespace (paging internally).
    async fn list_leases(&self) -> Result<Listing<VersionedLease>>;

    /// Replaces the lease with key `lease.key` if its version is still `expected`; returns the new
    /// version. Otherwise fails with `Error::Conflict` carrying the current record (or `None`
    /// when it does not exist).
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version>;

    /// Deletes the lease if its version is still `expected`; `Error::Conflict` otherwise.
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()>;

    /// Upserts the worker's heartbeat record.
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()>;

    /// Lists every worker record of the namespace.
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>>;

    /// Removes a worker record (a clean leave). Removing a missing record is not an error.
    async fn remove_worker(&self, id: &WorkerId) -> Result<()>;
}
