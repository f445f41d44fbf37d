//! What a store author needs: the [`LeaseStore`] contract, the records it holds ([`Lease`],
//! [`VersionedLease`], [`Version`], [`Claim`], [`WorkerRecord`]), what its calls return
//! ([`CreateOutcome`], [`Listing`], [`CorruptRecord`]), decorators ([`StoreDecorator`],
//! [`InstrumentedStore`]), change notification ([`ChangeStream`], [`StoreChange`]), the
//! in-memory store ([`MemoryStore`] over a [`MemoryBackend`], with [`MemorySnapshot`]s), the
//! default [`StoreCheckpointer`], the helpers for a store URL ([`url`]) and for keeping secrets
//! out of messages ([`Redactor`]).
//!
//! The contract is deliberately tiny and free of lease logic: create-if-absent, read, list,
//! compare-and-set on an opaque [`Version`], delete, and a per-worker heartbeat upsert, with
//! optional batch forms of the create and the compare-and-set ([`LeaseUpdate`]) that a store
//! overrides to save round trips.
//! Everything algorithmic (who may take what, fencing, handoff) lives in the core and is written
//! once. The ids, [`Position`](crate::Position), [`Epoch`](crate::Epoch), [`Error`](crate::Error)
//! and `Result` that a store also names are at the crate root.
//!
//! # Proving a store: the conformance suite
//!
//! The `shardlease-testkit` crate (a dev-dependency of the store's crate) checks a store against
//! this contract. Implement its `StoreFactory` (or build an `FnFactory` from a closure for a
//! store living in process), then one line in a test file,
//! `shardlease_testkit::store_conformance_tests!(my_factory())`, expands to one `#[test]` per
//! case (`shardlease_testkit::suite::run_all` runs them all from a custom harness, and each case
//! is a public async fn of `shardlease_testkit::suite`, listed in `suite::STORE_CASES`). The
//! opt-in cases that need raw access to the backend are in `shardlease_testkit::extensions`
//! (`corrupt_record_tests!`, `redaction_tests!`, `extensions::restart`). `docs/implementing-a-store.md`
//! walks through it.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::error::Result;
use crate::ids::{Namespace, WorkerId};
use crate::lease::LeaseKey;

pub use crate::checkpointer::StoreCheckpointer;
pub use crate::instrumented::InstrumentedStore;
/// Every change of a lease's owner as a pure function, with the one epoch rule: what a tool that
/// writes lease records (an operator's release, an import) must use so its epochs agree with the
/// runtime's.
pub use crate::lease::transition;
pub use crate::lease::{Claim, Lease, Version, VersionedLease};
pub use crate::load::{
    decode_lease_loads, encode_lease_loads, LeaseLoad, MAX_PUBLISHED_LEASE_LOADS,
};
pub use crate::memory::{MemoryBackend, MemorySnapshot, MemoryStore};
pub use crate::notify::{ChangeStream, StoreChange};
pub use crate::redact::{Redactor, MASK};
pub use crate::store_decorator::StoreDecorator;
pub use crate::worker_record::{now_millis, WorkerRecord};

/// Store URLs: their query options, their namespace, their credentials and their redacted form.
///
/// Every backend is opened from a URL whose query carries shardlease options (`namespace=`,
/// `page_size=`, ...). [`QueryOptions`](url::QueryOptions) takes them out one typed call at a
/// time, so every store parses, bounds and reports them the same way, and
/// [`redact_url`](url::redact_url) is the one way a URL is shown in logs and messages.
pub mod url {
    pub use crate::store_url::{
        credentials, is_secret_option, namespace_of, percent_decode, redact_url, redactor,
        HostListUrl, QueryOptions, NAMESPACE_OPTION,
    };
}

/// Outcome of [`LeaseStore::create_lease`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The lease was created at this version.
    Created(Version),
    /// A lease with that key already existed; nothing was written.
    AlreadyExists,
}

/// One compare-and-set of a batch ([`LeaseStore::update_leases`]): replace the lease with key
/// `lease.key` by `lease` if its version is still `expected`, exactly as
/// [`update_lease`](LeaseStore::update_lease)`(lease, expected)` would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseUpdate {
    /// The record to write.
    pub lease: Lease,
    /// The version the stored record must still have.
    pub expected: Version,
}

impl LeaseUpdate {
    /// An update of `lease` over `expected`.
    pub fn new(lease: Lease, expected: Version) -> Self {
        LeaseUpdate { lease, expected }
    }
}

/// `Err(InvalidInput)` when two items of a batch name the same lease key: a batch's items are
/// independent compare-and-sets, so one key twice has no meaning (which write would the other's
/// version refer to?). The stores of this workspace check their batches with it.
pub fn check_distinct_keys<'a>(keys: impl IntoIterator<Item = &'a LeaseKey>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for key in keys {
        if !seen.insert(key) {
            return Err(crate::error::Error::InvalidInput(format!(
                "lease key {key} appears twice in one batch"
            )));
        }
    }
    Ok(())
}

/// How many single writes the default bodies of [`LeaseStore::update_leases`] have in flight at
/// once (the runtime's default `take_concurrency`).
pub const DEFAULT_BATCH_CONCURRENCY: usize = 16;

/// A record in a listing that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptRecord {
    /// The record's key as the store knows it.
    ///
    /// In a lease listing ([`LeaseStore::list_leases`]) it is **the lease key exactly** (the
    /// string of [`LeaseKey`]), so the caller can match it against other leases: the runtime
    /// keeps a corrupt parent blocking its children by comparing it with their `parents`. In a
    /// worker listing it is the worker id. Only when the store cannot read the key itself does it
    /// put something else here: the lossy UTF-8 rendering of a key that is not UTF-8 (Redis), or
    /// a description in angle brackets (a SQLite key column holding a blob); such a record
    /// matches no lease key, and no lease can name it as a parent.
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

/// What [`LeaseStore::read_fleet_signal`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetSignal {
    /// The store keeps no fleet signal: the runtime lists every worker record each heartbeat.
    Unsupported,
    /// No signal is stored in this namespace: never written, or lost with the store's data.
    Missing,
    /// The token last written.
    Token(Version),
}

/// A coordination store for one namespace. Linearizable per record.
///
/// Implementations are thin translations into the store's native compare-and-set; they hold no
/// lease logic. Run `shardlease_testkit`'s conformance suite against any implementation.
///
/// # Versions never repeat for a key
///
/// Every write of a lease (create and update) gives the record a [`Version`] that key has never
/// had before, **even after the store lost or rolled back writes**: a Redis failover to a replica
/// that had not seen the last writes, a database restored from a snapshot, a namespace rebuilt.
/// The runtime caches `(owner, epoch, version)` and writes by compare-and-set on the version; if
/// a version could come back, a writer holding a stale one could win a compare-and-set against a
/// record another owner wrote since. A counter (a column incremented per write, a per-namespace
/// sequence, a server-clock seed) does not meet the rule, because a rollback rolls the counter
/// back too and the same numbers are handed out again. The stores of this workspace draw each
/// new version with [`Version::random`] (63 random bits, never the version being replaced);
/// a store whose native token is already unique across rollbacks (an etcd `mod_revision` is
/// not, after a restore) may use that instead.
///
/// # Decorators
///
/// A store that wraps another (fault injection, auditing, counting) must forward every method,
/// including the ones with a default body ([`update_lease_quietly`](LeaseStore::update_lease_quietly),
/// [`update_leases`](LeaseStore::update_leases), [`create_leases`](LeaseStore::create_leases),
/// [`remove_worker_if`](LeaseStore::remove_worker_if), [`namespace`](LeaseStore::namespace),
/// [`subscribe_changes`](LeaseStore::subscribe_changes)),
/// or the wrapped store's native behaviour is lost: implement
/// [`StoreDecorator`], which does that, instead of this trait.
#[async_trait]
pub trait LeaseStore: Send + Sync + Debug {
    /// Creates `lease` if no lease with its key exists, at a version the key never had (see
    /// [Versions never repeat for a key](LeaseStore#versions-never-repeat-for-a-key)).
    /// Idempotent under races: exactly one of several concurrent creators sees `Created`.
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome>;

    /// Reads one lease. `Err(Corrupt)` when the record exists but cannot be decoded.
    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>>;

    /// Lists every lease of the namespace (paging internally).
    async fn list_leases(&self) -> Result<Listing<VersionedLease>>;

    /// Replaces the lease with key `lease.key` if its version is still `expected`; returns the new
    /// version, one the key never had (see
    /// [Versions never repeat for a key](LeaseStore#versions-never-repeat-for-a-key)).
    /// Otherwise fails with `Error::Conflict` carrying the current record (or `None` when it does
    /// not exist).
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version>;

    /// [`update_lease`](LeaseStore::update_lease) for a write that changes nothing the
    /// namespace's subscribers care about: a checkpoint moving within a shard, where the owner,
    /// epoch, claim, parents and finished state all stay as they are. The core decides which
    /// writes those are and calls this for them; a store that pushes change notices (see
    /// [`subscribe_changes`](LeaseStore::subscribe_changes)) sends none for this write, so
    /// checkpoints cost subscribers nothing. The compare-and-set is exactly `update_lease`'s.
    ///
    /// Default: `update_lease` (a store without notices has nothing to leave out).
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update_lease(lease, expected).await
    }

    /// Many [`update_lease`](LeaseStore::update_lease)s in one call: one round trip where the
    /// store can (one statement, one script, one transaction).
    ///
    /// Each item is its own compare-and-set, judged exactly as `update_lease` judges it, and
    /// `Ok` carries one outcome per item, in the order of `updates`: the new version (one the
    /// key never had), or the error `update_lease` would have returned for that item alone
    /// (`Error::Conflict` with the current record, or `None` when it does not exist; a
    /// `Corrupt` or backend error that concerns that item only). One item's conflict neither
    /// stops nor undoes the others. A store may apply the items atomically, or one by one in
    /// any order, as long as each item's outcome is the one its own `update_lease` would have
    /// had at some moment during the call.
    ///
    /// `Err` of the whole call (a lost connection, a timeout) says nothing of any item: each may
    /// or may not have been applied, as after an `update_lease` that failed that way. The keys
    /// must be distinct ([`check_distinct_keys`]); an empty batch is `Ok(vec![])`. Every item is
    /// a write subscribers hear of (as with `update_lease`, not
    /// [`update_lease_quietly`](LeaseStore::update_lease_quietly)). The batch may be of any
    /// length: a store splits it where its backend has a limit.
    ///
    /// Default: `update_lease` for each item, [`DEFAULT_BATCH_CONCURRENCY`] at a time, so a store
    /// without a batch of its own keeps working unchanged.
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        use futures::StreamExt;
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        // Futures do nothing until polled: `buffered` starts them a few at a time.
        let writes: Vec<_> =
            updates.iter().map(|u| self.update_lease(&u.lease, u.expected)).collect();
        Ok(futures::stream::iter(writes).buffered(DEFAULT_BATCH_CONCURRENCY).collect().await)
    }

    /// Many [`create_lease`](LeaseStore::create_lease)s in one call: one outcome per lease, in
    /// the order of `leases`, each exactly what `create_lease` would have said of it.
    ///
    /// The leases are created **in order**: once a lease of the batch is visible to readers, so
    /// is every lease before it in the batch (creating them all atomically meets this too). Shard
    /// sync relies on it: it creates parents before their children, and a child seen without its
    /// parent would look like a child whose parent was collected. `Err` of the whole call: some
    /// of the leases (a prefix, by the rule above) may have been created; creating is idempotent,
    /// so the caller calls again. Keys must be distinct ([`check_distinct_keys`]).
    ///
    /// Default: `create_lease` for each lease, one after another.
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let mut outcomes = Vec::with_capacity(leases.len());
        for lease in leases {
            outcomes.push(self.create_lease(lease).await?);
        }
        Ok(outcomes)
    }

    /// Deletes the lease if its version is still `expected`; `Error::Conflict` otherwise.
    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()>;

    /// Upserts the worker's heartbeat record, **unless the stored record is a later (or the same)
    /// heartbeat of the same process**: a record whose beat comes from the same process
    /// ([`WorkerRecord::same_process`]: same `beat >> 24`) and is greater than or equal to
    /// `record.beat` is left as it is, and the call returns `Ok(())` (the write is one that lost
    /// a race with its own successor, not an error). A missing record, and a record of another
    /// process under the same id (a restart draws a new random base), whatever its beat, are
    /// always replaced; so is a stored record whose beat cannot be read. The whole rule is
    /// [`WorkerRecord::heartbeat_replaces`].
    ///
    /// The check and the write are one atomic step (the store's native conditional write). A
    /// process writes each beat value once, counting up, so the rule only ever refuses a write
    /// that landed late: a heartbeat the worker stopped waiting for (it timed out) but which the
    /// store or its client still carried out after the next one. Written over the newer record,
    /// it would show peers the worker's beat going back, which they take for a store that lost
    /// writes ([`WorkerRecord::beat_went_back`]), holding every take for a while.
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()>;

    /// Lists every worker record of the namespace.
    async fn list_workers(&self) -> Result<Listing<WorkerRecord>>;

    /// Removes a worker record (a clean leave). Removing a missing record is not an error.
    async fn remove_worker(&self, id: &WorkerId) -> Result<()>;

    /// Removes the worker record of `id` only if its `beat` is still `beat` (the beat the caller
    /// saw when it judged the worker dead); returns whether it removed it. A record that has
    /// moved on (the worker heartbeat since: it is alive after all) or is missing is left alone
    /// and gives `Ok(false)`.
    ///
    /// The check and the delete must be one atomic step (the store's native conditional delete:
    /// `DELETE ... WHERE beat = ?`, a Lua script, a condition expression, a transaction): a
    /// list-compare-delete is racy, since a heartbeat landing between the listing and the delete
    /// is deleted with the record, and a live worker loses its record.
    ///
    /// The default body removes nothing and returns `Ok(false)`, so that a store written against
    /// an older version of this trait keeps compiling and stays safe: a store that cannot delete
    /// conditionally just keeps the records of long-dead workers (every worker lists them on each
    /// heartbeat, which costs reads), but never deletes a live one. Override it with an atomic
    /// conditional delete (the stores of this workspace all do); the conformance case
    /// `remove_worker_if_checks_the_beat` fails on the default.
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let _ = (id, beat);
        Ok(false)
    }

    /// The namespace this store reads and writes, if it knows it. The runtime takes it as the
    /// single source of truth and rejects a configuration naming another namespace. Default:
    /// `None` (unknown; nothing is checked).
    fn namespace(&self) -> Option<Namespace> {
        None
    }

    /// Writes the namespace's **fleet signal**: one small record holding `token`, replacing
    /// whatever token it held (a plain put; no compare-and-set). Tokens are in
    /// `1..=`[`Version::MAX_RANDOM`] (what [`Version::random`] draws), so a store keeps one as it
    /// keeps a version.
    ///
    /// A worker writes a fresh random token ([`Version::random`]) whenever it changes something
    /// its peers must look at (it joined, left, changed a lease's owner, announced a death), and
    /// every worker reads the signal on each heartbeat ([`read_fleet_signal`](LeaseStore::read_fleet_signal)),
    /// listing every worker record only when the token differs from the one it saw last. So a
    /// quiet fleet reads one record per worker per heartbeat instead of the whole fleet
    /// (docs/algorithm.md, "A fleet too large to list each heartbeat"). Random tokens rather
    /// than a counter: a store that lost or rolled back writes may bring back an older token,
    /// which still differs from the newest one each reader saw, so it reads as a change and
    /// never as "quiet".
    ///
    /// Default: does nothing (with [`read_fleet_signal`](LeaseStore::read_fleet_signal)
    /// returning [`FleetSignal::Unsupported`], the runtime lists every worker record each
    /// heartbeat, as it did before this method existed). A store implements both or neither; the
    /// conformance case `the_fleet_signal_round_trips` checks them.
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        let _ = token;
        Ok(())
    }

    /// Reads the namespace's fleet signal (see
    /// [`write_fleet_signal`](LeaseStore::write_fleet_signal)): [`FleetSignal::Token`] with the
    /// last token written, [`FleetSignal::Missing`] when none is stored (never written, or lost
    /// with the store's data). Default: [`FleetSignal::Unsupported`].
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        Ok(FleetSignal::Unsupported)
    }

    /// Reads the worker records of `ids` that exist, in any order: each record once however
    /// often its id is named, a missing one left out, an undecodable one in `corrupt`. The
    /// records read are those `ids` name, not the namespace's: a worker watching two peers
    /// reads two records whatever the fleet's size.
    ///
    /// Default: [`list_workers`](LeaseStore::list_workers), filtered (correct, but it reads
    /// every record; override it with the store's multi-key read).
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let wanted: std::collections::HashSet<&WorkerId> = ids.iter().collect();
        let listing = self.list_workers().await?;
        Ok(Listing {
            items: listing.items.into_iter().filter(|w| wanted.contains(&w.id)).collect(),
            corrupt: listing
                .corrupt
                .into_iter()
                .filter(|c| wanted.iter().any(|id| id.as_str() == c.key))
                .collect(),
        })
    }

    /// Subscribes to notices of changes in this namespace, for stores that can push them (an
    /// etcd watch, PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub): a [`ChangeStream`] of
    /// [`StoreChange`]s.
    ///
    /// `Ok(None)`, the default, means "not supported": the worker then runs exactly as without
    /// notification. A returned stream carries the changes made after this call returned; it ends
    /// when the subscription is lost, and the runtime subscribes again and lists once, so a
    /// change made in between is never missed.
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Implements only the required methods: every default body of [`LeaseStore`] is its own.
    #[derive(Debug)]
    struct RequiredOnly(MemoryStore);

    #[async_trait]
    impl LeaseStore for RequiredOnly {
        async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
            self.0.create_lease(lease).await
        }
        async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
            self.0.get_lease(key).await
        }
        async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
            self.0.list_leases().await
        }
        async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
            self.0.update_lease(lease, expected).await
        }
        async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
            self.0.delete_lease(key, expected).await
        }
        async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
            self.0.heartbeat(record).await
        }
        async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
            self.0.list_workers().await
        }
        async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
            self.0.remove_worker(id).await
        }
    }

    /// The default `remove_worker_if` cannot compare and delete in one step, so it never deletes:
    /// not even a record whose beat matches (it could move on between a check and a delete).
    #[tokio::test]
    async fn the_default_remove_worker_if_removes_nothing() {
        let store = RequiredOnly(MemoryStore::new());
        let record = WorkerRecord::new("w".into(), 7);
        store.heartbeat(&record).await.unwrap();
        assert!(!store.remove_worker_if(&"w".into(), 7).await.unwrap(), "matching beat");
        assert!(!store.remove_worker_if(&"w".into(), 6).await.unwrap(), "stale beat");
        assert!(!store.remove_worker_if(&"never".into(), 0).await.unwrap(), "missing record");
        assert_eq!(store.list_workers().await.unwrap().items, [record]);
    }
}
