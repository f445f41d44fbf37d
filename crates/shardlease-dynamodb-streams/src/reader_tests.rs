//! The source's listing and reading rules on the in-process fake, where shards rotate, trim,
//! expire and throttle on demand (moto's server never does). On paused time: every wait the
//! source schedules passes at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Batch, Error, LeaseKey, Position, ShardReader, ShardSource};

use crate::api::StreamStatus;
use crate::change::{ChangeEvent, EventName};
use crate::config::{OnTrimmed, ReadConfig};
use crate::fake::FakeStreams;
use crate::source::DynamoDbStreamsSource;

fn source(fake: &Arc<FakeStreams>, config: ReadConfig) -> DynamoDbStreamsSource {
    DynamoDbStreamsSource::with_api(fake.clone(), config).unwrap()
}

fn small_pages() -> ReadConfig {
    ReadConfig { max_records: 2, ..ReadConfig::default() }
}

/// Reads `reader` until the shard ends: the sequence numbers delivered and the children.
async fn read_to_end(reader: &mut Box<dyn ShardReader>) -> (Vec<String>, Vec<String>) {
    let mut seqs = Vec::new();
    for _ in 0..10_000 {
        let batch: Batch = reader.next_batch().await.unwrap();
        seqs.extend(batch.records.iter().map(|r| r.seq.as_str().to_owned()));
        if let Some(children) = batch.end {
            return (seqs, children.iter().map(|c| c.id.as_str().to_owned()).collect());
        }
    }
    panic!("the shard never ended; read {seqs:?}");
}

/// A rotation where DynamoDB still lists the parent open after its child appears, and lists the
/// child only some calls after the parent closed: the parent is reported closed as soon as its
/// child is listed, and its reader delivers every record once, then waits for the child instead
/// of finishing the shard early.
#[tokio::test(start_paused = true)]
async fn a_rotation_ends_the_parent_only_once_its_child_is_listed() {
    let fake = FakeStreams::new();
    let parent = fake.leaf(0).unwrap();
    let written: Vec<String> =
        (0..5).map(|i| fake.put(&format!("k{i}"), EventName::Insert).unwrap()).collect();
    fake.children_hidden_for(4).parent_listed_open_for(6);
    let child = fake.rotate(0).unwrap();
    let more = fake.put("k9", EventName::Modify).unwrap();
    let src = source(&fake, small_pages());

    let listed = src.list_shards().await.unwrap();
    assert_eq!(listed.len(), 1, "the child is hidden still: {listed:?}");
    let mut reader =
        src.open(&LeaseKey::from(parent.as_str()), &Position::TrimHorizon).await.unwrap();
    let (seqs, children) = read_to_end(&mut reader).await;
    assert_eq!(seqs, written, "every record of the parent, once, in order");
    assert_eq!(children, vec![child.clone()]);

    // Listed open by the service, yet closed: its child is listed.
    let listed = src.list_shards().await.unwrap();
    let p = listed.iter().find(|s| s.id.as_str() == parent).unwrap();
    let c = listed.iter().find(|s| s.id.as_str() == child).unwrap();
    assert!(p.closed, "{listed:?}");
    assert!(!c.closed && c.parents == vec![LeaseKey::from(parent.as_str())], "{listed:?}");
    let mut reader = src.open(&c.id, &Position::TrimHorizon).await.unwrap();
    let batch = reader.next_batch().await.unwrap();
    assert_eq!(batch.records[0].seq.as_str(), more);
}

/// A finished shard's children cost one `CHILD_SHARDS` call when they are listed already; while
/// they are not, the reader asks again every `children_retry_interval`, a bounded number of
/// calls, never finishing the shard without them.
#[tokio::test(start_paused = true)]
async fn describe_calls_per_rotation_are_bounded() {
    let fake = FakeStreams::new();
    let parent = fake.leaf(0).unwrap();
    fake.put("a", EventName::Insert).unwrap();
    fake.rotate(0).unwrap();
    let src = source(&fake, ReadConfig::default());
    let mut reader =
        src.open(&LeaseKey::from(parent.as_str()), &Position::TrimHorizon).await.unwrap();
    let before = fake.describe_calls();
    let (_, children) = read_to_end(&mut reader).await;
    assert_eq!(children.len(), 1);
    assert_eq!(fake.describe_calls() - before, 1, "{:?}", fake.describe_requests());

    // Hidden for 6 calls: each retry costs a CHILD_SHARDS call and a full listing.
    let parent = fake.leaf(0).unwrap();
    fake.put("b", EventName::Insert).unwrap();
    fake.children_hidden_for(6);
    fake.rotate(0).unwrap();
    let mut reader =
        src.open(&LeaseKey::from(parent.as_str()), &Position::TrimHorizon).await.unwrap();
    let before = fake.describe_calls();
    let started = tokio::time::Instant::now();
    let (_, children) = read_to_end(&mut reader).await;
    assert_eq!(children.len(), 1);
    let calls = fake.describe_calls() - before;
    assert!((6..=8).contains(&calls), "{calls} calls: {:?}", fake.describe_requests());
    assert!(started.elapsed() >= Duration::from_secs(2), "it waited between asks");
}

/// A disabled stream closes its shards without children: the reader finishes them with none.
#[tokio::test(start_paused = true)]
async fn a_disabled_stream_finishes_its_shards_without_children() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    let seq = fake.put("a", EventName::Insert).unwrap();
    fake.disable();
    let src = source(&fake, ReadConfig::default());
    let mut reader =
        src.open(&LeaseKey::from(shard.as_str()), &Position::TrimHorizon).await.unwrap();
    let (seqs, children) = read_to_end(&mut reader).await;
    assert_eq!((seqs, children), (vec![seq], vec![]));
    fake.set_status(StreamStatus::Disabled);
}

/// Expired iterators are renewed after the last change read: nothing is lost or read twice.
#[tokio::test(start_paused = true)]
async fn expired_iterators_are_renewed_after_the_last_change() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    let written: Vec<String> =
        (0..9).map(|i| fake.put(&format!("k{i}"), EventName::Insert).unwrap()).collect();
    fake.rotate(0).unwrap();
    fake.expire_every(2);
    let src = source(&fake, small_pages());
    let mut reader =
        src.open(&LeaseKey::from(shard.as_str()), &Position::TrimHorizon).await.unwrap();
    let (seqs, _) = read_to_end(&mut reader).await;
    assert_eq!(seqs, written);
}

/// Throttled listings and reads back off and go on; nothing is lost.
#[tokio::test(start_paused = true)]
async fn throttling_is_waited_out() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    let written: Vec<String> =
        (0..4).map(|i| fake.put(&format!("k{i}"), EventName::Insert).unwrap()).collect();
    fake.rotate(0).unwrap();
    fake.throttle_describe(3).throttle_get_records(7).throttle_get_shard_iterator(2);
    let src = source(&fake, small_pages());
    assert_eq!(src.list_shards().await.unwrap().len(), 2);
    let mut reader =
        src.open(&LeaseKey::from(shard.as_str()), &Position::TrimHorizon).await.unwrap();
    let (seqs, children) = read_to_end(&mut reader).await;
    assert_eq!((seqs, children.len()), (written, 1));
}

/// Trimmed data fails every read by default (loudly, not silently skipped), and with
/// `SkipToTrimHorizon` the reader goes on from the oldest change kept.
#[tokio::test(start_paused = true)]
async fn trimmed_data_fails_loudly_or_is_skipped_on_request() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    let written: Vec<String> =
        (0..6).map(|i| fake.put(&format!("k{i}"), EventName::Insert).unwrap()).collect();
    fake.rotate(0).unwrap();
    fake.reject_trimmed_starts(true);
    fake.trim_before(&written[3]);
    let key = LeaseKey::from(shard.as_str());
    let checkpoint =
        Position::sequence(shardlease_core::SequenceNumber::parse(&written[0]).unwrap());

    let src = source(&fake, small_pages());
    let mut reader = src.open(&key, &checkpoint).await.unwrap();
    for _ in 0..2 {
        let err = reader.next_batch().await.unwrap_err();
        assert!(matches!(err, Error::Backend { retryable: false, .. }), "{err:?}");
        assert!(err.to_string().contains("retention"), "{err}");
    }

    let skip = ReadConfig { on_trimmed: OnTrimmed::SkipToTrimHorizon, ..small_pages() };
    let src = source(&fake, skip);
    let mut reader = src.open(&key, &checkpoint).await.unwrap();
    let (seqs, children) = read_to_end(&mut reader).await;
    assert_eq!(seqs, written[3..].to_vec(), "on from the oldest change kept");
    assert_eq!(children.len(), 1);
}

/// `AT_TIMESTAMP` starts at the first change made at or after the timestamp.
#[tokio::test(start_paused = true)]
async fn at_timestamp_skips_what_came_before() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    let first = ChangeEvent::from_json(&fake_change(&fake, "a")).unwrap();
    fake.advance_clock(60_000);
    let later: Vec<String> =
        (0..3).map(|i| fake.put(&format!("b{i}"), EventName::Insert).unwrap()).collect();
    let src = source(&fake, small_pages());
    // Creation times are whole seconds: a change of the timestamp's own second is not skipped.
    for offset in [30_000, 60_000, 60_999] {
        let at = Position::AtTimestamp { millis: first.approximate_creation_millis + offset };
        let mut reader = src.open(&LeaseKey::from(shard.as_str()), &at).await.unwrap();
        let mut seqs = Vec::new();
        while seqs.len() < later.len() {
            let batch = reader.next_batch().await.unwrap();
            seqs.extend(batch.records.iter().map(|r| r.seq.as_str().to_owned()));
        }
        assert_eq!(seqs, later, "from {offset} ms after the first change");
    }
}

#[test]
fn the_table_is_read_from_the_stream_arn() {
    let arn = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T00:00:00.000";
    assert_eq!(crate::reader::table_of(arn), "orders");
    assert_eq!(crate::reader::table_of("weird"), "weird");
}

/// Writes one change of key `k` and returns its raw JSON.
fn fake_change(fake: &FakeStreams, k: &str) -> bytes::Bytes {
    let seq = fake.put(k, EventName::Insert).unwrap();
    let all = fake.all_records();
    all.iter().flat_map(|s| s.records.iter()).find(|r| r.seq == seq).unwrap().json.clone()
}

/// Records carry the change as JSON, the item's key as partition key, the creation time as
/// arrival time; each batch reports the age of its newest change as its lag.
#[tokio::test(start_paused = true)]
async fn records_carry_the_change_and_batches_their_age() {
    let fake = FakeStreams::new();
    let shard = fake.leaf(0).unwrap();
    fake.put("a", EventName::Insert).unwrap();
    fake.put("a", EventName::Remove).unwrap();
    let src = source(&fake, ReadConfig::default());
    let mut reader =
        src.open(&LeaseKey::from(shard.as_str()), &Position::TrimHorizon).await.unwrap();
    let batch = reader.next_batch().await.unwrap();
    let events: Vec<ChangeEvent> =
        batch.records.iter().map(|r| ChangeEvent::from_record(r).unwrap()).collect();
    assert_eq!(
        events.iter().map(|e| e.event_name).collect::<Vec<_>>(),
        [EventName::Insert, EventName::Remove]
    );
    for (r, e) in batch.records.iter().zip(&events) {
        assert_eq!(r.partition_key, e.key_json());
        assert_eq!(r.arrival_millis, e.approximate_creation_millis);
        assert_eq!(&r.seq, &e.sequence_number);
    }
    assert!(batch.millis_behind.is_some());
}

/// `LATEST` is where the shard stood at the open: a change made right after it is read, also
/// when the iterator expired before the first read (it renews from the trim horizon, skipping
/// what was made more than a margin before the open, never at a new `LATEST`).
#[tokio::test(start_paused = true)]
async fn latest_is_where_the_shard_stood_at_the_open() {
    let fake = FakeStreams::new();
    let shard = LeaseKey::from(fake.leaf(0).unwrap().as_str());
    fake.put("old", EventName::Insert).unwrap();
    let src = source(&fake, ReadConfig::default());
    let mut reader = src.open(&shard, &Position::Latest).await.unwrap();
    let after = fake.put("after-open", EventName::Insert).unwrap();
    let batch = reader.next_batch().await.unwrap();
    assert_eq!(batch.records.iter().map(|r| r.seq.as_str()).collect::<Vec<_>>(), [after.as_str()]);

    // The fake's clock set to this machine's: the old changes are hours older than the open.
    let old = ChangeEvent::from_json(&fake_change(&fake, "old")).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    fake.advance_clock(i64::try_from(now.as_millis()).unwrap() - old.approximate_creation_millis);
    let mut reader = src.open(&shard, &Position::Latest).await.unwrap();
    fake.expire_iterators();
    let after = fake.put("after-expiry", EventName::Insert).unwrap();
    let batch = tokio::time::timeout(Duration::from_secs(60), reader.next_batch()).await;
    let batch = batch.expect("the change after the open is read").unwrap();
    assert_eq!(batch.records.iter().map(|r| r.seq.as_str()).collect::<Vec<_>>(), [after.as_str()]);
}
