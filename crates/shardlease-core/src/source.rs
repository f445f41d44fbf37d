//! Where records come from: a sharded stream, listed and read shard by shard.
//!
//! Throttling and retries of the stream's API live in the reader; the runtime only sees batches,
//! and learns at shard end which children continue the stream.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::Result;
use crate::lease::LeaseKey;
use crate::position::{Position, SequenceNumber};

/// The hash-key range a shard covers (inclusive), as decimal strings up to 2^128 - 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashRange {
    /// First hash key.
    pub start: u128,
    /// Last hash key.
    pub end: u128,
}

/// A shard as the source lists it. Built with [`ShardInfo::new`] and the `with_*` methods, so a
/// field added later does not break a source written today.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardInfo {
    /// The shard id (the lease key).
    pub id: LeaseKey,
    /// One parent after a split, two after a merge, none for an original shard.
    pub parents: Vec<LeaseKey>,
    /// The hash range, when the source has one.
    pub hash_range: Option<HashRange>,
    /// Whether the shard no longer receives records.
    pub closed: bool,
}

/// One record of a shard. Built with [`Record::new`] and the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Record {
    /// The record's sequence number.
    pub seq: SequenceNumber,
    /// The index inside a de-aggregated KPL record; 0 otherwise.
    pub sub: u64,
    /// The partition key.
    pub partition_key: String,
    /// The payload.
    pub data: Bytes,
    /// When the stream accepted the record, milliseconds since the Unix epoch.
    pub arrival_millis: i64,
}

impl ShardInfo {
    /// An open shard with no parents and no hash range.
    pub fn new(id: impl Into<LeaseKey>) -> Self {
        ShardInfo { id: id.into(), parents: Vec::new(), hash_range: None, closed: false }
    }

    /// Sets the parents (one after a split, two after a merge).
    pub fn with_parents(mut self, parents: impl IntoIterator<Item = LeaseKey>) -> Self {
        self.parents = parents.into_iter().collect();
        self
    }

    /// Sets the hash range.
    pub fn with_hash_range(mut self, range: HashRange) -> Self {
        self.hash_range = Some(range);
        self
    }

    /// Sets whether the shard is closed.
    pub fn with_closed(mut self, closed: bool) -> Self {
        self.closed = closed;
        self
    }
}

impl Record {
    /// A record at `seq` (sub-sequence 0, arrival time unknown: 0).
    pub fn new(
        seq: SequenceNumber,
        partition_key: impl Into<String>,
        data: impl Into<Bytes>,
    ) -> Self {
        Record {
            seq,
            sub: 0,
            partition_key: partition_key.into(),
            data: data.into(),
            arrival_millis: 0,
        }
    }

    /// Sets the index inside a de-aggregated KPL record.
    pub fn with_sub(mut self, sub: u64) -> Self {
        self.sub = sub;
        self
    }

    /// Sets when the stream accepted the record (milliseconds since the Unix epoch).
    pub fn with_arrival_millis(mut self, millis: i64) -> Self {
        self.arrival_millis = millis;
        self
    }

    /// The checkpoint position just after this record.
    pub fn position(&self) -> Position {
        Position::Sequence { seq: self.seq.clone(), sub: self.sub }
    }
}

/// What one read of a shard returned. Built with [`Batch::new`] (or `Batch::default()` for an
/// empty read) and the `with_*` methods.
///
/// The records are shared (`Arc<[Record]>`), so cloning a batch (as [`processor_fn`] does to hand
/// the closure an owned batch) copies a pointer, not the records.
///
/// [`processor_fn`]: crate::processor::processor_fn
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Batch {
    /// The records, in order. May be empty. Shared: a clone of the batch shares them.
    pub records: Arc<[Record]>,
    /// How far behind the tip of the shard this read is, when known.
    pub millis_behind: Option<u64>,
    /// `Some(children)` when the shard is closed and fully read: the shards that continue it.
    pub end: Option<Vec<ShardInfo>>,
}

impl Batch {
    /// A batch of `records` (possibly none), lag unknown, shard not ended.
    pub fn new(records: Vec<Record>) -> Self {
        Batch { records: records.into(), millis_behind: None, end: None }
    }

    /// Sets how far behind the tip of the shard this read is.
    pub fn with_millis_behind(mut self, millis: u64) -> Self {
        self.millis_behind = Some(millis);
        self
    }

    /// Marks the shard as closed and fully read, continued by `children`.
    pub fn with_end(mut self, children: Vec<ShardInfo>) -> Self {
        self.end = Some(children);
        self
    }

    /// The position after the last record of the batch, if it has records.
    pub fn last_position(&self) -> Option<Position> {
        self.records.last().map(Record::position)
    }
}

/// Reads one shard forward from a position.
#[async_trait]
pub trait ShardReader: Send {
    /// The next batch. An empty batch without `end` means "nothing new yet".
    async fn next_batch(&mut self) -> Result<Batch>;

    /// Where this reader started, as a position that does not move with time: for a reader opened
    /// at `LATEST`, the position just after the last record the shard held when it opened
    /// (`TRIM_HORIZON` when it held none); for `AT_TIMESTAMP`, the same for the last record before
    /// the timestamp. `None` when the reader cannot tell (the default).
    ///
    /// The runtime checkpoints this position before the first batch, so a lease that changes
    /// hands before its first record resumes where its first owner started instead of at a new
    /// `LATEST` (which would skip every record written in between). A reader that returns `None`
    /// is pinned at `AT_TIMESTAMP` of its opening minus a margin for clock skew instead (some
    /// records may then be read twice after a handoff; none is skipped).
    fn resolved_start(&self) -> Option<Position> {
        None
    }
}

/// A sharded stream.
#[async_trait]
pub trait ShardSource: Send + Sync + Debug {
    /// Every shard the stream still lists (paging internally).
    async fn list_shards(&self) -> Result<Vec<ShardInfo>>;

    /// Opens a reader on `shard` that yields records after `from`.
    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>>;

    /// Where a lease created for `shard` starts when no parent lease leads into it, if the source
    /// sets it (a [`MultiSource`](crate::MultiSource) sets one per stream); `None` (the default)
    /// uses the worker's `Config::initial_position`. The runtime applies the same rules to it as
    /// to the configured one (a namespace that has run reads a new shard from its first record
    /// instead of `LATEST`).
    fn initial_position(&self, shard: &LeaseKey) -> Option<Position> {
        let _ = shard;
        None
    }

    /// Whether the lease `key` belongs to a stream this source stopped reading for good (a stream
    /// removed from a [`MultiSource`](crate::MultiSource) whose grace period passed). Shard sync
    /// finishes such a lease (fencing its owner) and deletes it at a later sync; the recovery of
    /// lost leases does not bring one back. False by default.
    fn retired(&self, key: &LeaseKey) -> bool {
        let _ = key;
        false
    }

    /// Whether the lease keys name their stream (`stream/shard`, see
    /// [`MultiSource`](crate::MultiSource)): the worker's per-shard metrics then carry a `stream`
    /// label too. False by default.
    fn keys_name_streams(&self) -> bool {
        false
    }
}
