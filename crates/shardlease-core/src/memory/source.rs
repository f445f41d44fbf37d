//! An in-memory sharded stream: a [`ShardSource`] that tests, the demo and simulations write to
//! and reshard while workers consume it.
//!
//! It behaves like a small Kinesis stream so the runtime can be exercised without AWS: records are
//! routed by a 128-bit hash of their partition key to the open shard whose hash range holds it;
//! sequence numbers are big (they start at 10^37, beyond `u64`) and strictly increase across the
//! stream; shards can be split and merged at any time (the parents close, children take over their
//! hash ranges), and old closed shards can be trimmed as retention would expire them.
//!
//! Readers never block: they return what is there, an empty batch when they are caught up, and,
//! once a closed shard is fully read, its children.

use crate::clock::now_millis_i64 as now_millis;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{Error, Result};
use crate::lease::LeaseKey;
use crate::position::{Position, SequenceNumber};
use crate::source::{Batch, HashRange, Record, ShardInfo, ShardReader, ShardSource};

/// One shard and its records.
struct Shard {
    id: LeaseKey,
    parents: Vec<LeaseKey>,
    children: Vec<LeaseKey>,
    range: HashRange,
    closed: bool,
    trimmed: bool,
    records: Vec<Record>,
}

impl Shard {
    fn info(&self) -> ShardInfo {
        ShardInfo {
            id: self.id.clone(),
            parents: self.parents.clone(),
            hash_range: Some(self.range.clone()),
            closed: self.closed,
        }
    }
}

/// The whole stream, behind one mutex.
struct StreamState {
    /// Every shard ever created, in creation order (index = number in the id).
    shards: Vec<Shard>,
    /// The next sequence number.
    next_seq: u128,
    /// The arrival time of the last record, so arrival times never go backwards.
    last_arrival: i64,
    /// Total records written.
    produced: u64,
}

impl StreamState {
    /// A live (not trimmed) shard by id.
    fn index_of(&self, id: &LeaseKey) -> Result<usize> {
        // Ids are `shardId-<12 digits>` = index; fall back to a scan for anything else.
        let by_number = id
            .as_str()
            .strip_prefix("shardId-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| self.shards.get(i).is_some_and(|s| &s.id == id));
        let index = by_number.or_else(|| self.shards.iter().position(|s| &s.id == id));
        match index {
            Some(i) if !self.shards[i].trimmed => Ok(i),
            Some(_) => Err(Error::InvalidInput(format!("shard {id} has been trimmed"))),
            None => Err(Error::InvalidInput(format!("unknown shard {id}"))),
        }
    }

    /// A live, open shard by id.
    fn open_index_of(&self, id: &LeaseKey) -> Result<usize> {
        let i = self.index_of(id)?;
        if self.shards[i].closed {
            return Err(Error::InvalidInput(format!("shard {id} is closed")));
        }
        Ok(i)
    }

    /// The open shard whose hash range holds `hash`. Open shards always partition the whole hash
    /// space, so the fallbacks are unreachable; they only avoid a panic.
    fn route(&self, hash: u128) -> usize {
        let open = || self.shards.iter().enumerate().filter(|(_, s)| !s.closed);
        open()
            .find(|(_, s)| s.range.start <= hash && hash <= s.range.end)
            .or_else(|| open().next())
            .map_or(0, |(i, _)| i)
    }

    fn append(&mut self, index: usize, partition_key: &str, data: Bytes) -> SequenceNumber {
        let seq = SequenceNumber::from(self.next_seq);
        self.next_seq += 1;
        self.produced += 1;
        let arrival = now_millis().max(self.last_arrival);
        self.last_arrival = arrival;
        self.shards[index].records.push(Record {
            seq: seq.clone(),
            sub: 0,
            partition_key: partition_key.to_owned(),
            data,
            arrival_millis: arrival,
        });
        seq
    }

    fn add_shard(&mut self, parents: Vec<LeaseKey>, range: HashRange) -> LeaseKey {
        let id = shard_id(self.shards.len());
        self.shards.push(Shard {
            id: id.clone(),
            parents,
            children: Vec::new(),
            range,
            closed: false,
            trimmed: false,
            records: Vec::new(),
        });
        id
    }

    fn children_of(&self, index: usize) -> Vec<ShardInfo> {
        self.shards[index]
            .children
            .iter()
            .filter_map(|c| self.index_of(c).ok())
            .map(|i| self.shards[i].info())
            .collect()
    }
}

/// The id of the `n`th shard: `shardId-000000000000`, `shardId-000000000001`, ...
fn shard_id(n: usize) -> LeaseKey {
    LeaseKey::new(format!("shardId-{n:012}"))
}

/// The `i`th of `n` hash ranges that evenly partition `0..=u128::MAX` (start = ⌊i·2^128/n⌋).
fn even_range(i: usize, n: usize) -> HashRange {
    if n <= 1 {
        return HashRange { start: 0, end: u128::MAX };
    }
    // 2^128 = q·n + r, computed without overflowing u128 (q ≤ 2^127 since n ≥ 2).
    let n128 = n as u128;
    let (mut q, mut r) = (u128::MAX / n128, u128::MAX % n128 + 1);
    if r == n128 {
        q += 1;
        r = 0;
    }
    let start = |i: usize| -> u128 { q * i as u128 + (r * i as u128) / n128 };
    let end = if i + 1 == n { u128::MAX } else { start(i + 1) - 1 };
    HashRange { start: start(i), end }
}

/// FNV-1a over `bytes` from `offset`, then a 64-bit finalizer so every input bit reaches the high
/// bits (plain FNV barely moves the top bits for a change in the last byte).
fn fnv1a_mixed(bytes: &[u8], offset: u64) -> u64 {
    let mut h = offset;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // MurmurHash3 fmix64.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A handle on an in-memory sharded stream.
///
/// Cheap to clone: clones share the stream (the batch limit is per handle and copied into the
/// readers it opens). Implements [`ShardSource`]; its readers return at once with up to the batch
/// limit of records after their cursor, `millis_behind` = how old the last returned record is (0
/// once the batch reaches the tip), and, once a closed shard is fully read, an empty batch whose
/// `end` lists the children (again on every later call). A reader of a shard trimmed meanwhile
/// fails with [`Error::InvalidInput`].
#[derive(Clone)]
pub struct MemorySource {
    state: Arc<Mutex<StreamState>>,
    batch_limit: usize,
}

impl MemorySource {
    /// The first sequence number a stream hands out: 10^37, so sequence numbers exceed `u64` and
    /// anything comparing them as strings or small integers breaks in tests.
    pub const FIRST_SEQUENCE: u128 = 10_u128.pow(37);

    /// Records per batch unless [`MemorySource::with_batch_limit`] says otherwise.
    pub const DEFAULT_BATCH_LIMIT: usize = 100;

    /// A stream with `shards` open shards (at least one) whose hash ranges evenly partition
    /// `0..=u128::MAX`, named `shardId-000000000000`, `shardId-000000000001`, ...
    pub fn new(shards: usize) -> Self {
        let n = shards.max(1);
        let mut state = StreamState {
            shards: Vec::with_capacity(n),
            next_seq: Self::FIRST_SEQUENCE,
            last_arrival: 0,
            produced: 0,
        };
        for i in 0..n {
            state.add_shard(Vec::new(), even_range(i, n));
        }
        MemorySource { state: Arc::new(Mutex::new(state)), batch_limit: Self::DEFAULT_BATCH_LIMIT }
    }

    /// The same stream with at most `n` records per batch (at least 1) in the readers this handle
    /// opens. The default is [`DEFAULT_BATCH_LIMIT`](Self::DEFAULT_BATCH_LIMIT).
    pub fn with_batch_limit(mut self, n: usize) -> Self {
        self.batch_limit = n.max(1);
        self
    }

    /// The 128-bit hash key a partition key maps to (deterministic across runs).
    pub fn hash_key(partition_key: &str) -> u128 {
        let bytes = partition_key.as_bytes();
        let hi = fnv1a_mixed(bytes, 0xcbf2_9ce4_8422_2325);
        let lo = fnv1a_mixed(bytes, 0x6c62_272e_07bb_0142);
        (u128::from(hi) << 64) | u128::from(lo)
    }

    /// Writes a record to the open shard whose hash range holds the hash of `partition_key`;
    /// returns that shard and the record's sequence number.
    pub fn put(&self, partition_key: &str, data: impl Into<Bytes>) -> (LeaseKey, SequenceNumber) {
        let hash = Self::hash_key(partition_key);
        let mut state = self.lock();
        let index = state.route(hash);
        let seq = state.append(index, partition_key, data.into());
        (state.shards[index].id.clone(), seq)
    }

    /// Writes a record straight to `shard` (partition key `""`). Fails with
    /// [`Error::InvalidInput`] when the shard is unknown, trimmed or closed.
    pub fn put_to_shard(&self, shard: &LeaseKey, data: impl Into<Bytes>) -> Result<SequenceNumber> {
        let mut state = self.lock();
        let index = state.open_index_of(shard)?;
        Ok(state.append(index, "", data.into()))
    }

    /// Makes the next record's sequence number at least `next` (it never moves back). Processes
    /// that each keep their own in-memory copy of a stream can then give the same record the same
    /// number, by deriving it from something they share (the wall clock, say), so a checkpoint
    /// written by one means the same position in another's copy (the `fleet` example does this).
    pub fn advance_sequence_to(&self, next: u128) {
        let mut state = self.lock();
        state.next_seq = state.next_seq.max(next);
    }

    /// Splits an open shard: closes it and creates two children (the next ids) holding the lower
    /// and upper halves of its hash range, each with `parents = [shard]`. Fails with
    /// [`Error::InvalidInput`] when the shard is unknown, trimmed, closed, or covers one hash key.
    pub fn split(&self, shard: &LeaseKey) -> Result<(LeaseKey, LeaseKey)> {
        let mut state = self.lock();
        let index = state.open_index_of(shard)?;
        let HashRange { start, end } = state.shards[index].range.clone();
        if start == end {
            return Err(Error::InvalidInput(format!("shard {shard} covers one hash key only")));
        }
        let mid = start + (end - start) / 2;
        let low = state.add_shard(vec![shard.clone()], HashRange { start, end: mid });
        let high = state.add_shard(vec![shard.clone()], HashRange { start: mid + 1, end });
        let parent = &mut state.shards[index];
        parent.closed = true;
        parent.children = vec![low.clone(), high.clone()];
        tracing::debug!(%shard, %low, %high, "memory source: split");
        Ok((low, high))
    }

    /// Merges two open shards with adjacent hash ranges (in either order): closes both and creates
    /// one child (the next id) covering the union, with `parents = [a, b]`. Fails with
    /// [`Error::InvalidInput`] when either is unknown, trimmed or closed, or they are not adjacent.
    pub fn merge(&self, a: &LeaseKey, b: &LeaseKey) -> Result<LeaseKey> {
        let mut state = self.lock();
        let ia = state.open_index_of(a)?;
        let ib = state.open_index_of(b)?;
        let (ra, rb) = (state.shards[ia].range.clone(), state.shards[ib].range.clone());
        let adjacent = |lo: &HashRange, hi: &HashRange| lo.end.checked_add(1) == Some(hi.start);
        let range = if adjacent(&ra, &rb) {
            HashRange { start: ra.start, end: rb.end }
        } else if adjacent(&rb, &ra) {
            HashRange { start: rb.start, end: ra.end }
        } else {
            return Err(Error::InvalidInput(format!(
                "shards {a} and {b} do not have adjacent hash ranges"
            )));
        };
        let child = state.add_shard(vec![a.clone(), b.clone()], range);
        for i in [ia, ib] {
            state.shards[i].closed = true;
            state.shards[i].children = vec![child.clone()];
        }
        tracing::debug!(%a, %b, %child, "memory source: merge");
        Ok(child)
    }

    /// Drops a closed shard and its records, as retention expiry would: it disappears from
    /// listings, `open` rejects it and its existing readers fail. Its children still name it as a
    /// parent. Trimming an already trimmed shard does nothing; an unknown or open shard is an
    /// [`Error::InvalidInput`].
    pub fn trim(&self, shard: &LeaseKey) -> Result<()> {
        let mut state = self.lock();
        let Some(index) = state.shards.iter().position(|s| &s.id == shard) else {
            return Err(Error::InvalidInput(format!("unknown shard {shard}")));
        };
        let s = &mut state.shards[index];
        if !s.closed {
            return Err(Error::InvalidInput(format!(
                "shard {shard} is open; only closed shards can be trimmed"
            )));
        }
        s.trimmed = true;
        s.records = Vec::new();
        Ok(())
    }

    /// Total records written to the stream.
    pub fn produced(&self) -> u64 {
        self.lock().produced
    }

    /// Every record of `shard`, in order (empty when it is unknown or trimmed).
    pub fn records(&self, shard: &LeaseKey) -> Vec<Record> {
        let state = self.lock();
        state.index_of(shard).map(|i| state.shards[i].records.clone()).unwrap_or_default()
    }

    /// One shard, if it exists and is not trimmed.
    pub fn shard(&self, shard: &LeaseKey) -> Option<ShardInfo> {
        let state = self.lock();
        state.index_of(shard).ok().map(|i| state.shards[i].info())
    }

    /// Every shard not trimmed, open or closed, in creation order (what `list_shards` returns).
    pub fn shards(&self) -> Vec<ShardInfo> {
        self.lock().shards.iter().filter(|s| !s.trimmed).map(Shard::info).collect()
    }

    /// The open shards, in creation order. Their hash ranges partition `0..=u128::MAX`.
    pub fn open_shards(&self) -> Vec<ShardInfo> {
        self.lock().shards.iter().filter(|s| !s.closed).map(Shard::info).collect()
    }

    fn lock(&self) -> MutexGuard<'_, StreamState> {
        lock(&self.state)
    }

    /// Test helper: the next record gets sequence number `next`.
    #[cfg(test)]
    fn with_next_sequence(self, next: u128) -> Self {
        self.lock().next_seq = next;
        self
    }
}

/// Locks the stream, recovering it if a panicking thread poisoned the mutex (no critical section
/// leaves the state half-updated).
fn lock(state: &Mutex<StreamState>) -> MutexGuard<'_, StreamState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemorySource")
            .field("shards", &state.shards.iter().filter(|s| !s.trimmed).count())
            .field("open", &state.shards.iter().filter(|s| !s.closed).count())
            .field("produced", &state.produced)
            .field("batch_limit", &self.batch_limit)
            .finish()
    }
}

#[async_trait]
impl ShardSource for MemorySource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        Ok(self.shards())
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        let state = self.lock();
        let index = state.index_of(shard)?;
        let records = &state.shards[index].records;
        let (cursor, at_end) = match from {
            Position::TrimHorizon => (0, false),
            Position::Latest => (records.len(), false),
            Position::AtTimestamp { millis } => {
                (records.partition_point(|r| r.arrival_millis < *millis), false)
            }
            Position::Sequence { seq, sub } => {
                (records.partition_point(|r| (&r.seq, r.sub) <= (seq, *sub)), false)
            }
            Position::ShardEnd => (records.len(), true),
        };
        let resolved = match from {
            Position::Latest | Position::AtTimestamp { .. } => Some(match cursor {
                0 => Position::TrimHorizon,
                n => records[n - 1].position(),
            }),
            _ => None,
        };
        Ok(Box::new(MemoryReader {
            resolved,
            state: Arc::clone(&self.state),
            index,
            id: shard.clone(),
            cursor,
            at_end,
            batch_limit: self.batch_limit,
        }))
    }
}

/// A reader of one shard of a [`MemorySource`].
struct MemoryReader {
    /// Where a `LATEST` / `AT_TIMESTAMP` open landed, as a fixed position.
    resolved: Option<Position>,
    state: Arc<Mutex<StreamState>>,
    index: usize,
    id: LeaseKey,
    /// Index of the next record to return.
    cursor: usize,
    /// Opened at `ShardEnd`: report the end at once.
    at_end: bool,
    batch_limit: usize,
}

#[async_trait]
impl ShardReader for MemoryReader {
    async fn next_batch(&mut self) -> Result<Batch> {
        let state = lock(&self.state);
        let shard = &state.shards[self.index];
        if shard.trimmed {
            return Err(Error::InvalidInput(format!("shard {} has been trimmed", self.id)));
        }
        let available = shard.records.len().saturating_sub(self.cursor);
        if self.at_end || (available == 0 && shard.closed) {
            return Ok(Batch {
                records: Default::default(),
                millis_behind: Some(0),
                end: Some(state.children_of(self.index)),
            });
        }
        let take = available.min(self.batch_limit);
        let records: Arc<[Record]> = shard.records[self.cursor..self.cursor + take].into();
        self.cursor += take;
        let millis_behind = match records.last() {
            Some(last) if self.cursor < shard.records.len() => {
                u64::try_from(now_millis().saturating_sub(last.arrival_millis)).unwrap_or(0)
            }
            _ => 0,
        };
        Ok(Batch { records, millis_behind: Some(millis_behind), end: None })
    }

    fn resolved_start(&self) -> Option<Position> {
        self.resolved.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LeaseKey {
        LeaseKey::from(s)
    }

    #[test]
    fn two_copies_number_the_same_records_alike_and_never_go_back() {
        let (a, b) = (MemorySource::new(2), MemorySource::new(2));
        let s = key("shardId-000000000001");
        // b was started later: it skipped what a wrote before.
        a.advance_sequence_to(MemorySource::FIRST_SEQUENCE + 100);
        let early = a.put_to_shard(&s, "early").unwrap_or_else(|e| panic!("{e}"));
        for src in [&a, &b] {
            src.advance_sequence_to(MemorySource::FIRST_SEQUENCE + 200);
        }
        let x = a.put_to_shard(&s, "x").unwrap_or_else(|e| panic!("{e}"));
        let y = b.put_to_shard(&s, "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x, y);
        assert!(early < x);
        a.advance_sequence_to(MemorySource::FIRST_SEQUENCE);
        let after = a.put_to_shard(&s, "later").unwrap_or_else(|e| panic!("{e}"));
        assert!(after > x, "never back: {after} after {x}");
    }

    async fn read_all(reader: &mut Box<dyn ShardReader>) -> (Vec<Record>, Option<Vec<ShardInfo>>) {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let batch = reader.next_batch().await.unwrap();
            if batch.end.is_some() {
                assert!(batch.records.is_empty());
                return (out, batch.end);
            }
            if batch.records.is_empty() {
                return (out, None);
            }
            out.extend(batch.records.iter().cloned());
        }
        panic!("reader never finished");
    }

    fn data(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| String::from_utf8_lossy(&r.data).into_owned()).collect()
    }

    #[test]
    fn shards_partition_the_hash_space() {
        for n in [1, 2, 3, 4, 7, 16, 1000] {
            let src = MemorySource::new(n);
            let shards = src.shards();
            assert_eq!(shards.len(), n);
            assert_eq!(shards[0].id.as_str(), "shardId-000000000000");
            assert_eq!(shards[n - 1].id, shard_id(n - 1));
            let ranges: Vec<HashRange> =
                shards.iter().map(|s| s.hash_range.clone().unwrap()).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[n - 1].end, u128::MAX);
            for w in ranges.windows(2) {
                assert_eq!(w[0].end + 1, w[1].start);
            }
            let sizes: Vec<u128> = ranges.iter().map(|r| r.end - r.start).collect();
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(max - min <= 1, "uneven ranges for {n}: {min} vs {max}");
            assert!(shards.iter().all(|s| !s.closed && s.parents.is_empty()));
        }
        assert_eq!(MemorySource::new(0).shards().len(), 1);
        assert_eq!(even_range(1, 2).start, 1_u128 << 127);
    }

    #[test]
    fn put_routes_by_hash_and_spreads() {
        let src = MemorySource::new(4);
        let mut counts = [0_usize; 4];
        for i in 0..4000 {
            let pk = format!("key-{i}");
            let (shard, _) = src.put(&pk, "x");
            let info = src.shard(&shard).unwrap();
            let range = info.hash_range.unwrap();
            let h = MemorySource::hash_key(&pk);
            assert!(range.start <= h && h <= range.end);
            counts[shard.as_str()[8..].parse::<usize>().unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "poor spread: {counts:?}");
        assert_eq!(src.produced(), 4000);
        // The same key always goes to the same shard.
        assert_eq!(src.put("same", "a").0, src.put("same", "b").0);
        assert_eq!(MemorySource::hash_key("abc"), MemorySource::hash_key("abc"));
    }

    #[test]
    fn sequence_numbers_are_big_and_increasing() {
        let src = MemorySource::new(3);
        let mut last: Option<SequenceNumber> = None;
        for i in 0..50 {
            let (_, seq) = src.put(&format!("k{i}"), "x");
            assert!(seq.as_str().len() >= 38, "{seq} should exceed u64");
            if let Some(prev) = &last {
                assert!(*prev < seq);
            }
            last = Some(seq);
        }
        let first = src.shards().iter().flat_map(|s| src.records(&s.id)).map(|r| r.seq).min();
        assert_eq!(first, Some(SequenceNumber::from(MemorySource::FIRST_SEQUENCE)));
        for s in src.shards() {
            let records = src.records(&s.id);
            assert!(records.windows(2).all(|w| w[0].seq < w[1].seq));
            assert!(records.iter().all(|r| r.sub == 0));
        }
        // Crossing a power of ten (a longer decimal string) still orders numerically.
        let nines = SequenceNumber::from(10_u128.pow(38) - 1);
        assert!(nines < SequenceNumber::from(10_u128.pow(38)));
    }

    #[test]
    fn put_to_shard_checks_the_shard() {
        let src = MemorySource::new(2);
        let s0 = key("shardId-000000000000");
        let seq = src.put_to_shard(&s0, Bytes::from_static(b"hi")).unwrap();
        assert_eq!(src.records(&s0)[0].seq, seq);
        assert!(matches!(src.put_to_shard(&key("nope"), "x"), Err(Error::InvalidInput(_))));
        src.split(&s0).unwrap();
        assert!(matches!(src.put_to_shard(&s0, "x"), Err(Error::InvalidInput(_))));
    }

    #[tokio::test]
    async fn split_closes_parent_and_routes_to_children() {
        let src = MemorySource::new(1);
        let parent = key("shardId-000000000000");
        for i in 0..10 {
            src.put(&format!("before-{i}"), format!("b{i}"));
        }
        let mut reader = src.open(&parent, &Position::TrimHorizon).await.unwrap();
        let (low, high) = src.split(&parent).unwrap();
        assert_eq!((low.as_str(), high.as_str()), ("shardId-000000000001", "shardId-000000000002"));
        for i in 0..100 {
            let (shard, _) = src.put(&format!("after-{i}"), format!("a{i}"));
            assert!(shard == low || shard == high);
        }
        assert_eq!(src.records(&parent).len(), 10);
        assert!(!src.records(&low).is_empty() && !src.records(&high).is_empty());

        let listed = src.list_shards().await.unwrap();
        assert_eq!(listed.len(), 3);
        assert!(listed[0].closed);
        let lr = listed[1].hash_range.clone().unwrap();
        let hr = listed[2].hash_range.clone().unwrap();
        assert_eq!((lr.start, lr.end + 1, hr.end), (0, hr.start, u128::MAX));
        assert_eq!(listed[1].parents, vec![parent.clone()]);
        assert_eq!(src.open_shards().len(), 2);

        // The parent's reader sees its records, then the end with both children.
        let (records, end) = read_all(&mut reader).await;
        assert_eq!(data(&records), (0..10).map(|i| format!("b{i}")).collect::<Vec<_>>());
        let children = end.expect("parent should end");
        assert_eq!(children.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), vec![low, high]);
        assert!(children.iter().all(|c| c.parents == vec![parent.clone()] && !c.closed));
        // The end is reported again on every later call.
        assert!(reader.next_batch().await.unwrap().end.is_some());

        assert!(matches!(src.split(&parent), Err(Error::InvalidInput(_))));
        assert!(matches!(src.split(&key("shardId-000000000099")), Err(Error::InvalidInput(_))));
    }

    #[tokio::test]
    async fn merge_closes_both_parents() {
        let src = MemorySource::new(3);
        let [s0, s1, s2] = [0, 1, 2].map(shard_id);
        assert!(matches!(src.merge(&s0, &s2), Err(Error::InvalidInput(_))), "not adjacent");
        assert!(matches!(src.merge(&s0, &s0), Err(Error::InvalidInput(_))));
        src.put_to_shard(&s1, "in-s1").unwrap();
        let child = src.merge(&s2, &s1).unwrap(); // either order
        assert_eq!(child, shard_id(3));
        let info = src.shard(&child).unwrap();
        assert_eq!(info.parents, vec![s2.clone(), s1.clone()]);
        let range = info.hash_range.unwrap();
        assert_eq!(range.start, src.shard(&s1).unwrap().hash_range.unwrap().start);
        assert_eq!(range.end, u128::MAX);
        assert!(src.shard(&s1).unwrap().closed && src.shard(&s2).unwrap().closed);
        assert!(matches!(src.merge(&s0, &s1), Err(Error::InvalidInput(_))), "s1 is closed");
        let open: Vec<LeaseKey> = src.open_shards().into_iter().map(|s| s.id).collect();
        assert_eq!(open, vec![s0.clone(), child.clone()]);

        for i in 0..200 {
            let (shard, _) = src.put(&format!("k{i}"), "x");
            assert!(shard == s0 || shard == child);
        }
        let mut reader = src.open(&s1, &Position::TrimHorizon).await.unwrap();
        let (records, end) = read_all(&mut reader).await;
        assert_eq!(data(&records), vec!["in-s1"]);
        let end = end.unwrap();
        assert_eq!(end.len(), 1);
        assert_eq!(end[0].id, child);
        assert_eq!(end[0].parents, vec![s2, s1]);

        // Merge back into one shard covering everything.
        let all = src.merge(&s0, &child).unwrap();
        let range = src.shard(&all).unwrap().hash_range.unwrap();
        assert_eq!((range.start, range.end), (0, u128::MAX));
    }

    #[tokio::test]
    async fn trimmed_shards_disappear() {
        let src = MemorySource::new(1);
        let parent = shard_id(0);
        src.put("k", "x");
        assert!(matches!(src.trim(&parent), Err(Error::InvalidInput(_))), "open shard");
        assert!(matches!(src.trim(&key("nope")), Err(Error::InvalidInput(_))));
        let mut reader = src.open(&parent, &Position::TrimHorizon).await.unwrap();
        let (a, b) = src.split(&parent).unwrap();
        src.trim(&parent).unwrap();
        src.trim(&parent).unwrap(); // idempotent
        let listed: Vec<LeaseKey> =
            src.list_shards().await.unwrap().into_iter().map(|s| s.id).collect();
        assert_eq!(listed, vec![a.clone(), b]);
        assert!(src.records(&parent).is_empty());
        assert!(src.shard(&parent).is_none());
        assert!(matches!(
            src.open(&parent, &Position::TrimHorizon).await.err(),
            Some(Error::InvalidInput(_))
        ));
        assert!(matches!(reader.next_batch().await, Err(Error::InvalidInput(_))));
        assert_eq!(src.shard(&a).unwrap().parents, vec![parent]);
        assert_eq!(src.produced(), 1);
    }

    #[tokio::test]
    async fn every_open_position() {
        let src = MemorySource::new(1);
        let s = shard_id(0);
        let mut seqs = Vec::new();
        for i in 0..5 {
            seqs.push(src.put_to_shard(&s, format!("r{i}")).unwrap());
        }
        let texts = |r: &[Record]| data(r);

        let mut r = src.open(&s, &Position::TrimHorizon).await.unwrap();
        assert_eq!(texts(&read_all(&mut r).await.0), vec!["r0", "r1", "r2", "r3", "r4"]);

        let mut latest = src.open(&s, &Position::Latest).await.unwrap();
        let b = latest.next_batch().await.unwrap();
        assert!(b.records.is_empty() && b.end.is_none());
        assert_eq!(b.millis_behind, Some(0));
        src.put_to_shard(&s, "r5").unwrap();
        assert_eq!(texts(&read_all(&mut latest).await.0), vec!["r5"]);

        let after = Position::Sequence { seq: seqs[1].clone(), sub: 0 };
        let mut r = src.open(&s, &after).await.unwrap();
        assert_eq!(texts(&read_all(&mut r).await.0), vec!["r2", "r3", "r4", "r5"]);
        // A sub-sequence past 0 of the same record is still after it.
        let mid = Position::Sequence { seq: seqs[1].clone(), sub: 3 };
        let mut r = src.open(&s, &mid).await.unwrap();
        assert_eq!(read_all(&mut r).await.0.len(), 4);
        // Before the first record: everything.
        let before = Position::sequence(1_u64);
        let mut r = src.open(&s, &before).await.unwrap();
        assert_eq!(read_all(&mut r).await.0.len(), 6);

        let records = src.records(&s);
        let t = records[3].arrival_millis;
        let expected = records.iter().filter(|r| r.arrival_millis >= t).count();
        let mut r = src.open(&s, &Position::AtTimestamp { millis: t }).await.unwrap();
        let got = read_all(&mut r).await.0;
        assert_eq!(got.len(), expected);
        assert!(got.iter().all(|r| r.arrival_millis >= t));
        let mut r = src.open(&s, &Position::AtTimestamp { millis: i64::MAX }).await.unwrap();
        assert!(read_all(&mut r).await.0.is_empty());
        let mut r = src.open(&s, &Position::AtTimestamp { millis: 0 }).await.unwrap();
        assert_eq!(read_all(&mut r).await.0.len(), 6);

        let mut r = src.open(&s, &Position::ShardEnd).await.unwrap();
        let b = r.next_batch().await.unwrap();
        assert!(b.records.is_empty());
        assert_eq!(b.end, Some(Vec::new()));

        assert!(matches!(
            src.open(&key("shardId-000000000009"), &Position::Latest).await.err(),
            Some(Error::InvalidInput(_))
        ));
    }

    #[tokio::test]
    async fn batches_respect_the_limit() {
        let src = MemorySource::new(1).with_batch_limit(3);
        let s = shard_id(0);
        for i in 0..8 {
            src.put_to_shard(&s, format!("r{i}")).unwrap();
        }
        let mut r = src.open(&s, &Position::TrimHorizon).await.unwrap();
        let mut sizes = Vec::new();
        for _ in 0..4 {
            let b = r.next_batch().await.unwrap();
            assert!(b.end.is_none());
            assert!(b.millis_behind.is_some());
            sizes.push(b.records.len());
        }
        assert_eq!(sizes, vec![3, 3, 2, 0]);
        let default = MemorySource::new(1);
        for i in 0..250 {
            default.put_to_shard(&s, format!("r{i}")).unwrap();
        }
        let mut r = default.open(&s, &Position::TrimHorizon).await.unwrap();
        assert_eq!(r.next_batch().await.unwrap().records.len(), MemorySource::DEFAULT_BATCH_LIMIT);
        // A zero limit is clamped to one.
        let one = default.clone().with_batch_limit(0);
        let mut r = one.open(&s, &Position::TrimHorizon).await.unwrap();
        assert_eq!(r.next_batch().await.unwrap().records.len(), 1);
    }

    #[tokio::test]
    async fn positions_resume_across_readers() {
        // Checkpointing the last record of a batch and reopening there loses nothing and
        // repeats nothing, across a change in the number of decimal digits (99..9 -> 100..0),
        // where comparing sequence numbers as strings would go wrong.
        let src = MemorySource::new(1).with_batch_limit(7).with_next_sequence(10_u128.pow(38) - 12);
        let s = shard_id(0);
        for i in 0..30 {
            src.put_to_shard(&s, format!("r{i}")).unwrap();
        }
        let mut seen = Vec::new();
        let mut from = Position::TrimHorizon;
        loop {
            let mut r = src.open(&s, &from).await.unwrap();
            let b = r.next_batch().await.unwrap();
            let Some(pos) = b.last_position() else { break };
            seen.extend(data(&b.records));
            from = pos;
        }
        assert_eq!(seen, (0..30).map(|i| format!("r{i}")).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_puts_and_reshards_lose_nothing() {
        let src = MemorySource::new(2);
        let producers: Vec<_> = (0..4)
            .map(|p| {
                let src = src.clone();
                tokio::spawn(async move {
                    for i in 0..500 {
                        src.put(&format!("p{p}-{i}"), "x");
                        if i % 50 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for _ in 0..5 {
            let open = src.open_shards();
            if let Some(first) = open.first() {
                src.split(&first.id).unwrap();
            }
            tokio::task::yield_now().await;
        }
        for p in producers {
            p.await.unwrap();
        }
        let mut total = 0;
        for shard in src.list_shards().await.unwrap() {
            let mut r = src.open(&shard.id, &Position::TrimHorizon).await.unwrap();
            let (records, end) = read_all(&mut r).await;
            assert_eq!(end.is_some(), shard.closed);
            total += records.len();
        }
        assert_eq!(total as u64, src.produced());
        assert_eq!(src.produced(), 2000);
    }

    #[test]
    fn debug_is_a_summary() {
        let src = MemorySource::new(2);
        src.put("a", "x");
        let s = format!("{src:?}");
        assert!(s.contains("produced: 1"), "{s}");
    }
}
