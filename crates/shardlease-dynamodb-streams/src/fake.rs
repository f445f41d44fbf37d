//! An in-process fake of DynamoDB Streams behind [`Api`], for unit tests of the listing, reading
//! and lineage rules.
//!
//! moto's server keeps one shard per stream forever: it never rotates shards, trims records,
//! expires iterators or throttles. Real DynamoDB Streams does all of these, and with quirks a
//! source must survive: a rotated parent still listed open (no ending sequence number) although
//! its child is listed, a closed leaf whose child is not listed yet, shards deleted once every
//! record in them is past retention, a disabled stream that closes its shards without children.
//! [`FakeStreams`] models those on demand, counts every call so tests can bound `DescribeStream`
//! calls, and reports every record written, by shard and parent, so tests can check that each
//! record is read exactly once per lineage and children never before their parents.
//!
//! Rules of the fake, in brief:
//! - Shards are created in order (`shardId-00000001-00000001`, `…-00000002`, …) and listed in
//!   that order. Each of the stream's independent lineages has one open leaf; [`FakeStreams::put`]
//!   writes to the leaf of lineage `fnv1a(key) % lineages`, so one key's changes stay in one
//!   lineage, in order.
//! - Sequence numbers grow across the whole stream, 21 digits and more, with gaps (a step of
//!   100), so a reader that adds one to a sequence number is caught.
//! - The quirk counters (parent listed open, children hidden) count `DescribeStream` calls that
//!   were answered (a throttled or failed call counts as a call but not against the quirks).

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use shardlease_core::{Error, SequenceNumber};

use crate::api::{
    Api, ApiError, DescribeRequest, IteratorStart, RawChange, RecordsPage, StreamPage, StreamShard,
    StreamStatus,
};
use crate::change::{AttributeValue, ChangeEvent, EventName, Item};

/// The fake stream's ARN.
pub(crate) const FAKE_STREAM_ARN: &str =
    "arn:aws:dynamodb:us-east-1:000000000000:table/fake/stream/2026-12-07T00:00:00.000";

/// The first sequence number the fake hands out (21 digits).
const FIRST_SEQ: u128 = 100_000_000_000_000_000_000;

/// The gap between two consecutive sequence numbers of the stream.
const SEQ_STEP: u128 = 100;

/// The fake clock's start: 2026-12-07T00:00:00Z, in milliseconds since the Unix epoch.
const START_MILLIS: i64 = 1_796_601_600_000;

/// The largest `Limit` `GetRecords` accepts.
const MAX_LIMIT: i32 = 1000;

/// One shard of the fake stream, with the records ever written to it.
#[derive(Debug)]
struct Shard {
    /// `shardId-00000001-<n>`, `n` counting the shards in creation order from 1.
    id: String,
    /// The shard it continues (a lineage's root has none).
    parent: Option<String>,
    /// The independent lineage (0-based) the shard belongs to.
    lineage: usize,
    /// Every record written, trimmed ones included (`records[..trimmed]` are gone).
    records: Vec<(u128, RawChange)>,
    /// How many records at the head are past retention.
    trimmed: usize,
    /// Set when the shard is closed.
    ending_seq: Option<u128>,
    /// Answered `DescribeStream` calls left during which the shard is listed open although closed.
    listed_open_for: u32,
    /// Answered `DescribeStream` calls left during which the shard is not listed at all.
    hidden_for: u32,
    /// Deleted: closed and every record past retention. Not listed; no iterators.
    removed: bool,
}

impl Shard {
    fn closed(&self) -> bool {
        self.ending_seq.is_some()
    }

    fn listed(&self) -> bool {
        !self.removed && self.hidden_for == 0
    }

    /// The shard as `DescribeStream` shows it now.
    fn view(&self) -> StreamShard {
        StreamShard {
            id: self.id.clone(),
            parent: self.parent.clone(),
            ending_seq: if self.listed_open_for > 0 {
                None
            } else {
                self.ending_seq.map(|s| s.to_string())
            },
        }
    }
}

/// Everything the fake knows, behind one mutex (never held across an `.await`).
#[derive(Debug)]
struct State {
    status: StreamStatus,
    /// `Disabling` answers left before a disabled stream reports `Disabled`.
    disabling_for: u32,
    /// Every shard ever created, in creation order (the listing order).
    shards: Vec<Shard>,
    /// Per lineage, the index in `shards` of its newest shard (open, or closed without child).
    leaves: Vec<usize>,
    next_seq: u128,
    clock_millis: i64,
    // Knobs.
    page_size: usize,
    rotate_every: usize,
    parent_listed_open_for: u32,
    children_hidden_for: u32,
    ignore_shard_filter: bool,
    reject_trimmed_starts: bool,
    expire_every: u64,
    // Iterators: an iterator is valid while its generation is the current one.
    generation: u64,
    // Injected failures.
    throttle_describe: u32,
    throttle_get_shard_iterator: u32,
    throttle_get_records: u32,
    fail_describe: u32,
    fail_get_records: u32,
    // Counters and logs.
    describe_calls: u64,
    get_shard_iterator_calls: u64,
    get_records_calls: u64,
    describe_log: Vec<DescribeRequest>,
}

impl State {
    fn new(lineages: usize) -> Self {
        let mut state = State {
            status: StreamStatus::Enabled,
            disabling_for: 0,
            shards: Vec::new(),
            leaves: Vec::new(),
            next_seq: FIRST_SEQ,
            clock_millis: START_MILLIS,
            page_size: 100,
            rotate_every: 0,
            parent_listed_open_for: 0,
            children_hidden_for: 0,
            ignore_shard_filter: false,
            reject_trimmed_starts: false,
            expire_every: 0,
            generation: 0,
            throttle_describe: 0,
            throttle_get_shard_iterator: 0,
            throttle_get_records: 0,
            fail_describe: 0,
            fail_get_records: 0,
            describe_calls: 0,
            get_shard_iterator_calls: 0,
            get_records_calls: 0,
            describe_log: Vec::new(),
        };
        for lineage in 0..lineages.max(1) {
            let index = state.new_shard(lineage, None, 0);
            state.leaves.push(index);
        }
        state
    }

    fn alloc_seq(&mut self) -> u128 {
        let seq = self.next_seq;
        self.next_seq += SEQ_STEP;
        seq
    }

    /// Creates a shard and returns its index.
    fn new_shard(&mut self, lineage: usize, parent: Option<String>, hidden_for: u32) -> usize {
        let index = self.shards.len();
        self.shards.push(Shard {
            id: format!("shardId-00000001-{:08}", index + 1),
            parent,
            lineage,
            records: Vec::new(),
            trimmed: 0,
            ending_seq: None,
            listed_open_for: 0,
            hidden_for,
            removed: false,
        });
        index
    }

    fn find(&self, id: &str) -> Option<usize> {
        self.shards.iter().position(|s| s.id == id)
    }

    /// Closes the open leaf of `lineage` and opens its child, with the quirk knobs as they are
    /// now. The child's id, or `None` when the leaf is closed already.
    fn rotate(&mut self, lineage: usize) -> Option<String> {
        let leaf = *self.leaves.get(lineage)?;
        if self.shards[leaf].closed() {
            return None;
        }
        let ending = self.alloc_seq();
        let listed_open_for = self.parent_listed_open_for;
        let parent = &mut self.shards[leaf];
        parent.ending_seq = Some(ending);
        parent.listed_open_for = listed_open_for;
        // A child is never listed before its parent.
        let hidden_for = self.children_hidden_for.max(parent.hidden_for);
        let parent_id = parent.id.clone();
        let child = self.new_shard(lineage, Some(parent_id), hidden_for);
        self.leaves[lineage] = child;
        Some(self.shards[child].id.clone())
    }

    /// Closes every open shard without a child (a disabled stream).
    fn close_all_without_children(&mut self) {
        for i in 0..self.shards.len() {
            if !self.shards[i].closed() {
                let ending = self.alloc_seq();
                self.shards[i].ending_seq = Some(ending);
                self.shards[i].listed_open_for = 0;
            }
        }
    }

    fn iterator(&self, shard: &str, index: usize) -> String {
        format!("fake-iterator/{}/{index}/{shard}", self.generation)
    }

    /// One answered `DescribeStream` call has passed: the quirks count down.
    fn tick_describe(&mut self) {
        for s in &mut self.shards {
            s.listed_open_for = s.listed_open_for.saturating_sub(1);
            s.hidden_for = s.hidden_for.saturating_sub(1);
        }
        if self.status == StreamStatus::Disabling {
            self.disabling_for = self.disabling_for.saturating_sub(1);
            if self.disabling_for == 0 {
                self.status = StreamStatus::Disabled;
            }
        }
    }

    fn page(&self, exclusive_start: Option<&str>) -> Result<StreamPage, ApiError> {
        let from = match exclusive_start {
            None => 0,
            Some(id) => {
                self.find(id).ok_or_else(|| {
                    ApiError::Other(Error::permanent(format!(
                        "ExclusiveStartShardId {id} is not a shard of the stream"
                    )))
                })? + 1
            }
        };
        let mut listed = self.shards[from..].iter().filter(|s| s.listed());
        let shards: Vec<StreamShard> =
            listed.by_ref().take(self.page_size.max(1)).map(Shard::view).collect();
        let more = listed.next().is_some();
        let last_evaluated = if more { shards.last().map(|s| s.id.clone()) } else { None };
        Ok(StreamPage { status: self.status, shards, last_evaluated })
    }

    fn children(&self, parent: &str) -> StreamPage {
        let shards = self
            .shards
            .iter()
            .filter(|s| s.listed() && s.parent.as_deref() == Some(parent))
            .map(Shard::view)
            .collect();
        StreamPage { status: self.status, shards, last_evaluated: None }
    }
}

/// What the fake wrote to one shard, for tests that check what a source read.
#[derive(Clone, Debug)]
pub(crate) struct ShardRecords {
    /// The shard's id.
    pub id: String,
    /// The shard it continues, if any (listed or not: a deleted parent stays named here).
    pub parent: Option<String>,
    /// The independent lineage (0-based) the shard belongs to.
    pub lineage: usize,
    /// Every record written to the shard, in order, trimmed ones included.
    pub records: Vec<RawChange>,
    /// How many records at the head of `records` are past retention.
    pub trimmed: usize,
    /// The ending sequence number, once the shard is closed (whatever the listings show).
    pub ending_seq: Option<String>,
    /// Deleted (closed and fully trimmed): no longer listed.
    pub removed: bool,
}

impl ShardRecords {
    /// The sequence numbers of every record written to the shard, in order.
    pub fn seqs(&self) -> Vec<String> {
        self.records.iter().map(|r| r.seq.clone()).collect()
    }

    /// The sequence numbers of the records not past retention.
    pub fn kept_seqs(&self) -> Vec<String> {
        self.records[self.trimmed..].iter().map(|r| r.seq.clone()).collect()
    }
}

/// An in-process DynamoDB stream: shards that rotate, trim, expire and throttle on demand.
///
/// Knobs take `&self` and return it, so they chain on the `Arc`:
/// `FakeStreams::new().rotate_every(3).children_hidden_for(2);`
#[derive(Debug)]
pub(crate) struct FakeStreams {
    arn: String,
    state: Mutex<State>,
}

impl FakeStreams {
    /// An enabled stream with one open shard (one lineage).
    pub fn new() -> Arc<Self> {
        Self::with_lineages(1)
    }

    /// An enabled stream with `n` (at least 1) independent open shards, each the root of its own
    /// lineage.
    pub fn with_lineages(n: usize) -> Arc<Self> {
        Arc::new(FakeStreams { arn: FAKE_STREAM_ARN.to_owned(), state: Mutex::new(State::new(n)) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- Writing and shaping the stream ----

    /// Records a change of the item whose key is `{"pk": {"S": keys_id}}` in the open leaf of
    /// lineage `fnv1a(keys_id) % lineages`, then rotates that shard if `rotate_every` says so.
    /// The change's sequence number, or `None` when the lineage has no open shard (a disabled
    /// stream, or after [`close_all_without_children`](Self::close_all_without_children)).
    pub fn put(&self, keys_id: &str, event: EventName) -> Option<String> {
        let mut s = self.lock();
        let lineage = (fnv1a(keys_id.as_bytes()) % s.leaves.len() as u64) as usize;
        let leaf = s.leaves[lineage];
        if s.shards[leaf].closed() || s.status != StreamStatus::Enabled {
            return None;
        }
        let seq = s.alloc_seq();
        let keys = Item::from([("pk".to_owned(), AttributeValue::S(keys_id.to_owned()))]);
        let raw = ChangeEvent::new(event, SequenceNumber::from(seq), s.clock_millis, keys).to_raw();
        let text = raw.seq.clone();
        s.shards[leaf].records.push((seq, raw));
        let every = s.rotate_every;
        if every > 0 && s.shards[leaf].records.len() >= every {
            s.rotate(lineage);
        }
        Some(text)
    }

    /// Closes the open leaf of `lineage` and opens its child now (whatever `rotate_every` says),
    /// with the quirk knobs as they are. The child's id, or `None` when there is no open leaf.
    pub fn rotate(&self, lineage: usize) -> Option<String> {
        self.lock().rotate(lineage)
    }

    /// After every `n` records written to a shard, that shard is closed and a child opened
    /// (0: never, the default).
    pub fn rotate_every(&self, n: usize) -> &Self {
        self.lock().rotate_every = n;
        self
    }

    /// Quirk: after a rotation, the parent is listed open (no ending sequence number) in the next
    /// `k` answered `DescribeStream` calls, although its child is listed. Reading it still ends
    /// (`next_iterator: None`) once its records are read. Applies to later rotations.
    pub fn parent_listed_open_for(&self, k: u32) -> &Self {
        self.lock().parent_listed_open_for = k;
        self
    }

    /// Quirk: after a rotation, the child is listed neither in pages nor in `ChildrenOf` answers
    /// for the next `k` answered `DescribeStream` calls: the parent is a closed leaf meanwhile.
    /// Records written meanwhile go to the hidden child. Applies to later rotations.
    pub fn children_hidden_for(&self, k: u32) -> &Self {
        self.lock().children_hidden_for = k;
        self
    }

    /// Closes every open shard without a child; the status stays as it is. Writes are dropped
    /// from then on.
    pub fn close_all_without_children(&self) -> &Self {
        self.lock().close_all_without_children();
        self
    }

    /// Disables the stream: every open shard is closed without a child, the next answered
    /// `DescribeStream` call reports `Disabling`, later ones `Disabled`. Writes are dropped.
    pub fn disable(&self) -> &Self {
        let mut s = self.lock();
        s.close_all_without_children();
        s.status = StreamStatus::Disabling;
        s.disabling_for = 1;
        self
    }

    /// Sets the status `DescribeStream` reports (say `Enabling`, for a stream just created).
    pub fn set_status(&self, status: StreamStatus) -> &Self {
        let mut s = self.lock();
        s.status = status;
        s.disabling_for = u32::from(status == StreamStatus::Disabling);
        self
    }

    /// Moves the clock the changes' creation times come from (starts at 2026-12-07T00:00:00Z).
    pub fn advance_clock(&self, millis: i64) -> &Self {
        self.lock().clock_millis += millis;
        self
    }

    // ---- Retention ----

    /// Every record below `seq` (numerically) is past retention, in every shard. A closed shard
    /// left with no record (and, when empty, whose ending sequence number is below `seq`) is
    /// deleted: no longer listed, `GetShardIterator` answers `NotFound`. A `seq` that is not a
    /// decimal `u128` (every sequence number the fake hands out is one) changes nothing.
    pub fn trim_before(&self, seq: &str) -> &Self {
        let Ok(limit) = seq.parse::<u128>() else {
            return self;
        };
        let mut s = self.lock();
        for shard in &mut s.shards {
            let below = shard.records.partition_point(|(r, _)| *r < limit);
            shard.trimmed = shard.trimmed.max(below);
            let all_gone = shard.trimmed == shard.records.len();
            let past = !shard.records.is_empty() || shard.ending_seq.is_some_and(|e| e < limit);
            if shard.closed() && all_gone && past {
                shard.removed = true;
            }
        }
        self
    }

    /// The first `n` records of `shard` are past retention. A closed shard with every record
    /// trimmed is deleted.
    pub fn trim_records(&self, shard: &str, n: usize) -> &Self {
        let mut s = self.lock();
        if let Some(i) = s.find(shard) {
            let shard = &mut s.shards[i];
            shard.trimmed = shard.trimmed.max(n.min(shard.records.len()));
            if shard.closed() && n >= shard.records.len() {
                shard.removed = true;
            }
        }
        self
    }

    /// Whether `GetShardIterator` at or after a trimmed sequence number answers `Trimmed` (as
    /// the service documents) instead of starting at the first record kept (the default).
    pub fn reject_trimmed_starts(&self, on: bool) -> &Self {
        self.lock().reject_trimmed_starts = on;
        self
    }

    // ---- Iterators, paging, failures ----

    /// Every iterator issued so far answers `ExpiredIterator`.
    pub fn expire_iterators(&self) -> &Self {
        self.lock().generation += 1;
        self
    }

    /// Every `n`-th `GetRecords` call (counting all of them), every iterator issued so far
    /// expires first, so that call answers `ExpiredIterator` (0: never, the default).
    pub fn expire_every(&self, n: u64) -> &Self {
        self.lock().expire_every = n;
        self
    }

    /// `DescribeStream` pages hold up to `n` shards (default 100).
    pub fn page_size(&self, n: usize) -> &Self {
        self.lock().page_size = n.max(1);
        self
    }

    /// `ChildrenOf` requests are answered like a first page of every shard (a service that
    /// ignores `ShardFilter`).
    pub fn ignore_shard_filter(&self, on: bool) -> &Self {
        self.lock().ignore_shard_filter = on;
        self
    }

    /// The next `n` `DescribeStream` calls answer `Throttled`.
    pub fn throttle_describe(&self, n: u32) -> &Self {
        self.lock().throttle_describe = n;
        self
    }

    /// The next `n` `GetShardIterator` calls answer `Throttled`.
    pub fn throttle_get_shard_iterator(&self, n: u32) -> &Self {
        self.lock().throttle_get_shard_iterator = n;
        self
    }

    /// The next `n` `GetRecords` calls answer `Throttled`.
    pub fn throttle_get_records(&self, n: u32) -> &Self {
        self.lock().throttle_get_records = n;
        self
    }

    /// The next `n` `DescribeStream` calls fail with a retryable `Other` error (a 500).
    pub fn fail_describe(&self, n: u32) -> &Self {
        self.lock().fail_describe = n;
        self
    }

    /// The next `n` `GetRecords` calls fail with a retryable `Other` error (a 500).
    pub fn fail_get_records(&self, n: u32) -> &Self {
        self.lock().fail_get_records = n;
        self
    }

    // ---- Inspection ----

    /// `DescribeStream` calls so far, throttled and failed ones included.
    pub fn describe_calls(&self) -> u64 {
        self.lock().describe_calls
    }

    /// `GetShardIterator` calls so far, throttled ones included.
    pub fn get_shard_iterator_calls(&self) -> u64 {
        self.lock().get_shard_iterator_calls
    }

    /// `GetRecords` calls so far, throttled and failed ones included.
    pub fn get_records_calls(&self) -> u64 {
        self.lock().get_records_calls
    }

    /// Every `DescribeStream` request so far, in order.
    pub fn describe_requests(&self) -> Vec<DescribeRequest> {
        self.lock().describe_log.clone()
    }

    /// Every shard ever created, in creation order, with every record written to it.
    pub fn all_records(&self) -> Vec<ShardRecords> {
        self.lock()
            .shards
            .iter()
            .map(|s| ShardRecords {
                id: s.id.clone(),
                parent: s.parent.clone(),
                lineage: s.lineage,
                records: s.records.iter().map(|(_, r)| r.clone()).collect(),
                trimmed: s.trimmed,
                ending_seq: s.ending_seq.map(|e| e.to_string()),
                removed: s.removed,
            })
            .collect()
    }

    /// The id of the newest shard of `lineage` (open, or closed without child).
    pub fn leaf(&self, lineage: usize) -> Option<String> {
        let s = self.lock();
        s.leaves.get(lineage).map(|&i| s.shards[i].id.clone())
    }

    /// The lineage `keys_id` is written to.
    pub fn lineage_of(&self, keys_id: &str) -> usize {
        let n = self.lock().leaves.len() as u64;
        (fnv1a(keys_id.as_bytes()) % n) as usize
    }
}

/// FNV-1a, 64 bits: a hash that is the same on every run and every platform.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The parts of an iterator: generation, next index, shard.
fn parse_iterator(iterator: &str) -> Option<(u64, usize, &str)> {
    let rest = iterator.strip_prefix("fake-iterator/")?;
    let mut parts = rest.splitn(3, '/');
    let generation = parts.next()?.parse().ok()?;
    let index = parts.next()?.parse().ok()?;
    Some((generation, index, parts.next()?))
}

fn throttled(op: &str) -> ApiError {
    ApiError::Throttled(Error::retryable(format!("{op}: LimitExceededException (fake)")))
}

fn not_found(what: String) -> ApiError {
    ApiError::NotFound(Error::permanent(format!("ResourceNotFoundException (fake): {what}")))
}

fn invalid(what: String) -> ApiError {
    ApiError::Other(Error::permanent(format!("ValidationException (fake): {what}")))
}

fn trimmed(what: String) -> ApiError {
    ApiError::Trimmed(Error::permanent(format!("TrimmedDataAccessException (fake): {what}")))
}

#[async_trait]
impl Api for FakeStreams {
    fn stream_arn(&self) -> &str {
        &self.arn
    }

    async fn describe_stream(&self, request: DescribeRequest) -> Result<StreamPage, ApiError> {
        let mut s = self.lock();
        s.describe_calls += 1;
        s.describe_log.push(request.clone());
        if s.throttle_describe > 0 {
            s.throttle_describe -= 1;
            return Err(throttled("DescribeStream"));
        }
        if s.fail_describe > 0 {
            s.fail_describe -= 1;
            return Err(ApiError::Other(Error::retryable("DescribeStream: 500 (fake)")));
        }
        let page = match &request {
            DescribeRequest::Page { exclusive_start } => s.page(exclusive_start.as_deref())?,
            DescribeRequest::ChildrenOf { .. } if s.ignore_shard_filter => s.page(None)?,
            DescribeRequest::ChildrenOf { parent } => s.children(parent),
        };
        s.tick_describe();
        Ok(page)
    }

    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError> {
        let mut s = self.lock();
        s.get_shard_iterator_calls += 1;
        if s.throttle_get_shard_iterator > 0 {
            s.throttle_get_shard_iterator -= 1;
            return Err(throttled("GetShardIterator"));
        }
        let Some(i) = s.find(shard).filter(|&i| !s.shards[i].removed) else {
            return Err(not_found(format!("shard {shard}")));
        };
        let sh = &s.shards[i];
        let position = |seq: &str, after: bool| -> Result<usize, ApiError> {
            let wanted = SequenceNumber::parse(seq)
                .map_err(|e| invalid(format!("sequence number {seq:?}: {e}")))?;
            if let Some(end) = sh.ending_seq {
                if wanted > SequenceNumber::from(end) {
                    return Err(invalid(format!("{seq} is beyond the end of shard {shard}")));
                }
            }
            let index = sh.records.partition_point(|(r, _)| {
                let r = SequenceNumber::from(*r);
                if after {
                    r <= wanted
                } else {
                    r < wanted
                }
            });
            if index < sh.trimmed && s.reject_trimmed_starts {
                return Err(trimmed(format!("{seq} in shard {shard} is past retention")));
            }
            Ok(index.max(sh.trimmed))
        };
        let index = match start {
            IteratorStart::TrimHorizon => sh.trimmed,
            IteratorStart::Latest => sh.records.len(),
            IteratorStart::AfterSequence(seq) => position(seq, true)?,
        };
        Ok(s.iterator(shard, index))
    }

    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError> {
        let mut s = self.lock();
        s.get_records_calls += 1;
        if s.throttle_get_records > 0 {
            s.throttle_get_records -= 1;
            return Err(throttled("GetRecords"));
        }
        if s.fail_get_records > 0 {
            s.fail_get_records -= 1;
            return Err(ApiError::Other(Error::retryable("GetRecords: 500 (fake)")));
        }
        if s.expire_every > 0 && s.get_records_calls.is_multiple_of(s.expire_every) {
            s.generation += 1;
        }
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(invalid(format!("Limit {limit} is not within 1..={MAX_LIMIT}")));
        }
        let Some((generation, index, shard)) = parse_iterator(iterator) else {
            return Err(invalid(format!("{iterator:?} is not a shard iterator")));
        };
        if generation != s.generation {
            return Err(ApiError::ExpiredIterator);
        }
        let Some(i) = s.find(shard) else {
            return Err(not_found(format!("shard {shard}")));
        };
        let sh = &s.shards[i];
        if index < sh.trimmed {
            return Err(trimmed(format!("records of shard {shard} are past retention")));
        }
        if sh.removed {
            return Err(not_found(format!("shard {shard} was deleted")));
        }
        let len = sh.records.len();
        let start = index.min(len);
        let end = (start + limit as usize).min(len);
        let records = sh.records[start..end].iter().map(|(_, r)| r.clone()).collect();
        let next_iterator =
            if sh.closed() && end == len { None } else { Some(s.iterator(shard, end)) };
        Ok(RecordsPage { records, next_iterator })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn page_req(start: Option<&str>) -> DescribeRequest {
        DescribeRequest::Page { exclusive_start: start.map(str::to_owned) }
    }

    fn children_req(parent: &str) -> DescribeRequest {
        DescribeRequest::ChildrenOf { parent: parent.to_owned() }
    }

    /// Every shard the listing shows, following `last_evaluated`.
    async fn list_all(fake: &FakeStreams) -> Vec<StreamShard> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = fake.describe_stream(page_req(start.as_deref())).await.unwrap();
            out.extend(page.shards);
            match page.last_evaluated {
                Some(last) => start = Some(last),
                None => return out,
            }
        }
    }

    /// Reads `shard` from `start` to its end (or its tip, when open) in `limit`-sized pages,
    /// renewing nothing. The sequence numbers read, and whether the shard ended.
    async fn read_all(
        fake: &FakeStreams,
        shard: &str,
        start: IteratorStart,
        limit: i32,
    ) -> Result<(Vec<String>, bool), ApiError> {
        let mut seqs = Vec::new();
        let mut iterator = fake.get_shard_iterator(shard, &start).await?;
        loop {
            let page = fake.get_records(&iterator, limit).await?;
            let empty = page.records.is_empty();
            seqs.extend(page.records.into_iter().map(|r| r.seq));
            match page.next_iterator {
                None => return Ok((seqs, true)),
                Some(_) if empty => return Ok((seqs, false)),
                Some(next) => iterator = next,
            }
        }
    }

    fn ids(shards: &[StreamShard]) -> Vec<String> {
        shards.iter().map(|s| s.id.clone()).collect()
    }

    #[tokio::test]
    async fn sequence_numbers_are_long_increasing_and_round_trip() {
        let fake = FakeStreams::new();
        assert_eq!(fake.stream_arn(), FAKE_STREAM_ARN);
        let mut last: Option<SequenceNumber> = None;
        for i in 0..5 {
            let seq = fake.put(&format!("k{i}"), EventName::Insert).unwrap();
            assert!(seq.len() >= 21 && !seq.starts_with('0'), "{seq}");
            let parsed = SequenceNumber::parse(&seq).unwrap();
            assert!(last.as_ref().is_none_or(|l| *l < parsed));
            last = Some(parsed);
        }
        let shard = fake.leaf(0).unwrap();
        assert_eq!(shard, "shardId-00000001-00000001");
        let it = fake.get_shard_iterator(&shard, &IteratorStart::TrimHorizon).await.unwrap();
        let page = fake.get_records(&it, 10).await.unwrap();
        assert_eq!(page.records.len(), 5);
        let change = ChangeEvent::from_json(&page.records[0].json).unwrap();
        assert_eq!(change.event_name, EventName::Insert);
        assert_eq!(change.sequence_number.as_str(), page.records[0].seq);
        assert_eq!(page.records[0].keys, r#"{"pk":{"S":"k0"}}"#);
        // The tip of an open shard: an empty page and an iterator to go on with.
        let tip = fake.get_records(page.next_iterator.as_ref().unwrap(), 10).await.unwrap();
        assert!(tip.records.is_empty());
        assert!(tip.next_iterator.is_some());
        assert_eq!(fake.all_records()[0].seqs().len(), 5);
    }

    #[tokio::test]
    async fn keys_stay_in_their_lineage() {
        let fake = FakeStreams::with_lineages(4);
        fake.rotate_every(3);
        for round in 0..6 {
            for k in ["a", "b", "c", "d", "e", "f", "g"] {
                fake.put(k, if round == 0 { EventName::Insert } else { EventName::Modify });
            }
        }
        let all = fake.all_records();
        let mut used = std::collections::BTreeSet::new();
        for shard in &all {
            for r in &shard.records {
                let key: String = serde_json::from_str::<Item>(&r.keys)
                    .map(|item| match item.get("pk") {
                        Some(AttributeValue::S(s)) => s.clone(),
                        other => panic!("{other:?}"),
                    })
                    .unwrap();
                assert_eq!(fake.lineage_of(&key), shard.lineage);
                used.insert(shard.lineage);
            }
            if let Some(parent) = &shard.parent {
                let p = all.iter().find(|s| &s.id == parent).unwrap();
                assert_eq!(p.lineage, shard.lineage);
                // A parent's records all come before its child's.
                if let (Some(a), Some(b)) = (p.records.last(), shard.records.first()) {
                    assert!(
                        SequenceNumber::parse(&a.seq).unwrap()
                            < SequenceNumber::parse(&b.seq).unwrap()
                    );
                }
            }
        }
        assert!(used.len() > 1, "keys spread over lineages: {used:?}");
        assert_eq!(all.iter().map(|s| s.records.len()).sum::<usize>(), 42);
    }

    #[tokio::test]
    async fn pages_follow_last_evaluated_and_exclusive_start() {
        let fake = FakeStreams::with_lineages(5);
        fake.page_size(2);
        let first = fake.describe_stream(page_req(None)).await.unwrap();
        assert_eq!(first.status, StreamStatus::Enabled);
        assert_eq!(first.shards.len(), 2);
        assert_eq!(first.last_evaluated.as_deref(), Some(first.shards[1].id.as_str()));
        let second = fake.describe_stream(page_req(first.last_evaluated.as_deref())).await.unwrap();
        assert_eq!(ids(&second.shards), ["shardId-00000001-00000003", "shardId-00000001-00000004"]);
        let third = fake.describe_stream(page_req(second.last_evaluated.as_deref())).await.unwrap();
        assert_eq!(third.shards.len(), 1);
        assert_eq!(third.last_evaluated, None);
        assert_eq!(fake.describe_calls(), 3);
        // An exactly full last page has no last_evaluated.
        fake.page_size(5);
        let all = fake.describe_stream(page_req(None)).await.unwrap();
        assert_eq!(all.shards.len(), 5);
        assert_eq!(all.last_evaluated, None);
        assert!(all.shards.iter().all(|s| s.parent.is_none() && s.ending_seq.is_none()));
        assert!(matches!(
            fake.describe_stream(page_req(Some("shardId-nope"))).await,
            Err(ApiError::Other(_))
        ));
        assert_eq!(fake.describe_requests().len(), 5);
        assert_eq!(fake.describe_requests()[1], page_req(Some("shardId-00000001-00000002")));
    }

    #[tokio::test]
    async fn rotation_closes_the_parent_and_lists_the_child() {
        let fake = FakeStreams::new();
        fake.rotate_every(2);
        let s1 = fake.put("a", EventName::Insert).unwrap();
        let s2 = fake.put("a", EventName::Modify).unwrap();
        let s3 = fake.put("a", EventName::Remove).unwrap();
        let shards = list_all(&fake).await;
        assert_eq!(shards.len(), 2);
        let (parent, child) = (&shards[0], &shards[1]);
        assert_eq!(child.parent.as_deref(), Some(parent.id.as_str()));
        let ending = parent.ending_seq.clone().unwrap();
        // The ending sequence number is past the parent's last record, not equal to it.
        assert!(SequenceNumber::parse(&ending).unwrap() > SequenceNumber::parse(&s2).unwrap());
        assert!(child.ending_seq.is_none());
        let (seqs, ended) =
            read_all(&fake, &parent.id, IteratorStart::TrimHorizon, 1).await.unwrap();
        assert_eq!((seqs, ended), (vec![s1, s2], true));
        let (seqs, ended) =
            read_all(&fake, &child.id, IteratorStart::TrimHorizon, 1).await.unwrap();
        assert_eq!((seqs, ended), (vec![s3], false));
        let kids = fake.describe_stream(children_req(&parent.id)).await.unwrap();
        assert_eq!(ids(&kids.shards), [child.id.as_str()]);
        assert_eq!(kids.last_evaluated, None);
        assert!(fake.describe_stream(children_req(&child.id)).await.unwrap().shards.is_empty());
        // A manual rotation.
        let grandchild = fake.rotate(0).unwrap();
        assert_eq!(fake.leaf(0).as_deref(), Some(grandchild.as_str()));
    }

    #[tokio::test]
    async fn a_rotated_parent_can_stay_listed_open() {
        let fake = FakeStreams::new();
        fake.rotate_every(2).parent_listed_open_for(2);
        let s1 = fake.put("a", EventName::Insert).unwrap();
        let s2 = fake.put("a", EventName::Insert).unwrap();
        for _ in 0..2 {
            let shards = list_all(&fake).await;
            assert_eq!(shards.len(), 2, "the child is listed");
            assert_eq!(shards[0].ending_seq, None, "the parent still looks open");
            assert_eq!(shards[1].parent.as_deref(), Some(shards[0].id.as_str()));
        }
        let shards = list_all(&fake).await;
        assert!(shards[0].ending_seq.is_some(), "closed from the third listing on");
        // Reading the parent ends although it was listed open.
        let parent = shards[0].id.clone();
        let (seqs, ended) =
            read_all(&fake, &parent, IteratorStart::TrimHorizon, 100).await.unwrap();
        assert_eq!((seqs, ended), (vec![s1, s2], true));
    }

    #[tokio::test]
    async fn a_closed_leaf_can_have_its_child_hidden() {
        let fake = FakeStreams::new();
        fake.rotate_every(2).children_hidden_for(2);
        fake.put("a", EventName::Insert);
        fake.put("a", EventName::Insert);
        let buffered = fake.put("a", EventName::Modify).unwrap();
        let parent = "shardId-00000001-00000001";
        for _ in 0..2 {
            let page = fake.describe_stream(page_req(None)).await.unwrap();
            assert_eq!(ids(&page.shards), [parent]);
            assert!(page.shards[0].ending_seq.is_some(), "a closed leaf");
        }
        // Two calls have passed; a CHILD_SHARDS answer counts as a call too.
        let kids = fake.describe_stream(children_req(parent)).await.unwrap();
        assert_eq!(ids(&kids.shards), ["shardId-00000001-00000002"]);
        let all = fake.all_records();
        assert_eq!(all[1].seqs(), [buffered.as_str()]);
        let (seqs, _) =
            read_all(&fake, &kids.shards[0].id, IteratorStart::TrimHorizon, 10).await.unwrap();
        assert_eq!(seqs, [buffered]);
    }

    #[tokio::test]
    async fn both_quirks_at_once_never_list_a_child_before_its_parent() {
        let fake = FakeStreams::new();
        fake.rotate_every(1).parent_listed_open_for(1).children_hidden_for(3);
        fake.put("a", EventName::Insert); // rotates into hidden child 2
        fake.children_hidden_for(0);
        fake.put("a", EventName::Insert); // child 2 rotates into 3, hidden as long as 2
        let first = list_all(&fake).await;
        assert_eq!(ids(&first), ["shardId-00000001-00000001"]);
        assert_eq!(first[0].ending_seq, None, "listed open, children hidden: looks like a leaf");
        let second = list_all(&fake).await;
        assert_eq!(ids(&second), ["shardId-00000001-00000001"]);
        assert!(second[0].ending_seq.is_some(), "a closed leaf");
        fake.describe_stream(page_req(None)).await.unwrap();
        let fourth = list_all(&fake).await;
        assert_eq!(fourth.len(), 3);
        assert_eq!(fourth[2].parent.as_deref(), Some(fourth[1].id.as_str()));
    }

    #[tokio::test]
    async fn trimming_moves_the_horizon_and_deletes_spent_shards() {
        let fake = FakeStreams::new();
        fake.rotate_every(3);
        let seqs: Vec<String> = (0..4).map(|_| fake.put("a", EventName::Insert).unwrap()).collect();
        let (parent, child) = ("shardId-00000001-00000001", "shardId-00000001-00000002");
        let old = fake.get_shard_iterator(parent, &IteratorStart::TrimHorizon).await.unwrap();
        fake.trim_before(&seqs[1]);
        assert!(matches!(fake.get_records(&old, 10).await, Err(ApiError::Trimmed(_))));
        for start in [IteratorStart::TrimHorizon, IteratorStart::AfterSequence(seqs[0].clone())] {
            let (read, ended) = read_all(&fake, parent, start, 10).await.unwrap();
            assert_eq!(read, &seqs[1..3]);
            assert!(ended);
        }
        let (read, _) = read_all(&fake, parent, IteratorStart::AfterSequence(seqs[1].clone()), 10)
            .await
            .unwrap();
        assert_eq!(read, &seqs[2..3]);
        fake.reject_trimmed_starts(true);
        // After seqs[0] is seqs[1], the oldest record kept: not a trimmed start.
        assert!(fake
            .get_shard_iterator(parent, &IteratorStart::AfterSequence(seqs[0].clone()))
            .await
            .is_ok());
        assert!(fake.get_shard_iterator(parent, &IteratorStart::TrimHorizon).await.is_ok());
        // Every record of the closed parent past retention: it is deleted.
        fake.trim_before(&seqs[3]);
        assert_eq!(ids(&list_all(&fake).await), [child]);
        assert!(matches!(
            fake.get_shard_iterator(parent, &IteratorStart::TrimHorizon).await,
            Err(ApiError::NotFound(_))
        ));
        assert!(fake.all_records()[0].removed);
        assert_eq!(fake.all_records()[1].kept_seqs(), &seqs[3..]);
        // The open child, fully trimmed, stays listed and starts at its tip.
        fake.trim_records(child, 1);
        assert_eq!(ids(&list_all(&fake).await), [child]);
        let (read, ended) = read_all(&fake, child, IteratorStart::TrimHorizon, 10).await.unwrap();
        assert!(read.is_empty() && !ended);
        // A sequence number past the end of a closed shard is refused.
        fake.rotate(0);
        let ending = fake.all_records()[1].ending_seq.clone().unwrap();
        let beyond = (ending.parse::<u128>().unwrap() + 1).to_string();
        assert!(matches!(
            fake.get_shard_iterator(child, &IteratorStart::AfterSequence(beyond)).await,
            Err(ApiError::Other(_))
        ));
        fake.trim_records(child, 1);
        assert!(fake.all_records()[1].removed);
    }

    #[tokio::test]
    async fn iterators_expire_on_demand_and_on_schedule() {
        let fake = FakeStreams::new();
        fake.put("a", EventName::Insert);
        let shard = fake.leaf(0).unwrap();
        let it = fake.get_shard_iterator(&shard, &IteratorStart::TrimHorizon).await.unwrap();
        let page = fake.get_records(&it, 10).await.unwrap();
        let next = page.next_iterator.unwrap();
        fake.expire_iterators();
        assert!(matches!(fake.get_records(&it, 10).await, Err(ApiError::ExpiredIterator)));
        assert!(matches!(fake.get_records(&next, 10).await, Err(ApiError::ExpiredIterator)));
        let fresh = fake.get_shard_iterator(&shard, &IteratorStart::Latest).await.unwrap();
        assert!(fake.get_records(&fresh, 10).await.unwrap().records.is_empty());

        fake.expire_every(3);
        // Calls so far: 4. The 5th works, the 6th expires.
        let fresh = fake.get_shard_iterator(&shard, &IteratorStart::TrimHorizon).await.unwrap();
        let page = fake.get_records(&fresh, 10).await.unwrap();
        assert_eq!(page.records.len(), 1);
        let next = page.next_iterator.unwrap();
        assert!(matches!(fake.get_records(&next, 10).await, Err(ApiError::ExpiredIterator)));
        assert_eq!(fake.get_records_calls(), 6);
        assert_eq!(fake.get_shard_iterator_calls(), 3);
        assert!(matches!(fake.get_records("garbage", 10).await, Err(ApiError::Other(_))));
    }

    #[tokio::test]
    async fn throttles_and_failures_are_counted_and_run_out() {
        let fake = FakeStreams::new();
        fake.throttle_describe(2).fail_describe(1);
        for _ in 0..2 {
            assert!(matches!(
                fake.describe_stream(page_req(None)).await,
                Err(ApiError::Throttled(_))
            ));
        }
        let failed = fake.describe_stream(page_req(None)).await;
        assert!(matches!(&failed, Err(ApiError::Other(e)) if e.is_retryable()), "{failed:?}");
        assert!(fake.describe_stream(page_req(None)).await.is_ok());
        assert_eq!(fake.describe_calls(), 4);

        let shard = fake.leaf(0).unwrap();
        fake.throttle_get_shard_iterator(1);
        assert!(matches!(
            fake.get_shard_iterator(&shard, &IteratorStart::Latest).await,
            Err(ApiError::Throttled(_))
        ));
        let it = fake.get_shard_iterator(&shard, &IteratorStart::Latest).await.unwrap();
        fake.throttle_get_records(1).fail_get_records(1);
        assert!(matches!(fake.get_records(&it, 10).await, Err(ApiError::Throttled(_))));
        assert!(matches!(fake.get_records(&it, 10).await, Err(ApiError::Other(_))));
        assert!(fake.get_records(&it, 10).await.is_ok());
        assert_eq!(fake.get_records_calls(), 3);
        for bad in [0, MAX_LIMIT + 1] {
            assert!(matches!(fake.get_records(&it, bad).await, Err(ApiError::Other(_))));
        }
        // Throttled calls do not count down the quirks.
        fake.rotate_every(1).children_hidden_for(1);
        fake.put("a", EventName::Insert);
        fake.throttle_describe(1);
        assert!(fake.describe_stream(page_req(None)).await.is_err());
        assert_eq!(list_all(&fake).await.len(), 1);
        assert_eq!(list_all(&fake).await.len(), 2);
    }

    #[tokio::test]
    async fn get_records_honours_the_limit_and_ends_only_closed_shards() {
        let fake = FakeStreams::new();
        let seqs: Vec<String> =
            (0..5).map(|i| fake.put(&i.to_string(), EventName::Insert).unwrap()).collect();
        let shard = fake.leaf(0).unwrap();
        let it = fake.get_shard_iterator(&shard, &IteratorStart::TrimHorizon).await.unwrap();
        let page = fake.get_records(&it, 2).await.unwrap();
        assert_eq!(page.records.iter().map(|r| r.seq.clone()).collect::<Vec<_>>(), &seqs[..2]);
        let page = fake.get_records(page.next_iterator.as_ref().unwrap(), 3).await.unwrap();
        assert_eq!(page.records.len(), 3);
        let at_tip = page.next_iterator.unwrap();
        assert!(fake.get_records(&at_tip, 3).await.unwrap().next_iterator.is_some());
        fake.rotate(0);
        // Closed and read to the end: no next iterator.
        let end = fake.get_records(&at_tip, 3).await.unwrap();
        assert!(end.records.is_empty() && end.next_iterator.is_none());
        // A closed shard read with a limit smaller than what is left goes on.
        let it = fake.get_shard_iterator(&shard, &IteratorStart::TrimHorizon).await.unwrap();
        assert!(fake.get_records(&it, 4).await.unwrap().next_iterator.is_some());
    }

    #[tokio::test]
    async fn a_disabled_stream_closes_its_shards_without_children() {
        let fake = FakeStreams::with_lineages(2);
        fake.set_status(StreamStatus::Enabling);
        assert_eq!(
            fake.describe_stream(page_req(None)).await.unwrap().status,
            StreamStatus::Enabling
        );
        fake.set_status(StreamStatus::Enabled);
        fake.put("a", EventName::Insert).unwrap();
        fake.disable();
        assert_eq!(fake.put("a", EventName::Modify), None);
        let first = fake.describe_stream(page_req(None)).await.unwrap();
        assert_eq!(first.status, StreamStatus::Disabling);
        assert_eq!(first.shards.len(), 2);
        assert!(first.shards.iter().all(|s| s.ending_seq.is_some()));
        let second = fake.describe_stream(page_req(None)).await.unwrap();
        assert_eq!(second.status, StreamStatus::Disabled);
        for shard in &second.shards {
            let kids = fake.describe_stream(children_req(&shard.id)).await.unwrap();
            assert!(kids.shards.is_empty());
        }
        // The other knob: closed without children, the status unchanged.
        let other = FakeStreams::new();
        other.close_all_without_children();
        assert_eq!(other.put("a", EventName::Insert), None);
        let page = other.describe_stream(page_req(None)).await.unwrap();
        assert_eq!(page.status, StreamStatus::Enabled);
        assert!(page.shards[0].ending_seq.is_some());
        assert_eq!(other.rotate(0), None);
    }

    #[tokio::test]
    async fn a_service_ignoring_the_shard_filter_answers_with_every_shard() {
        let fake = FakeStreams::new();
        fake.rotate_every(1).advance_clock(5_000);
        fake.put("a", EventName::Insert);
        fake.ignore_shard_filter(true);
        let page = fake.describe_stream(children_req("shardId-00000001-00000002")).await.unwrap();
        assert_eq!(page.shards.len(), 2);
        assert_eq!(fake.all_records()[0].records[0].created_millis, START_MILLIS + 5_000);
    }
}
