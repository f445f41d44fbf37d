//! The Kinesis source against kinesalite: listing, every start position, resuming inside a KPL
//! aggregate, shard end after a split and a merge, de-aggregation (a malformed aggregate arrives
//! raw; user records outside the shard's hash range are delivered and counted).

mod common;

use bytes::Bytes;
use common::{emulator, fast_reads, payloads, read_records, read_to_end};
use shardlease_core::{LeaseKey, Position, SequenceNumber, ShardSource};
use shardlease_kinesis::kpl::{self, UserRecord};

const HALF: u128 = 1 << 127;

fn key(s: &str) -> LeaseKey {
    LeaseKey::from(s)
}

fn seq(s: &str) -> SequenceNumber {
    SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

fn user(pk: &str, ehk: Option<u128>, data: &str) -> UserRecord {
    UserRecord {
        partition_key: pk.into(),
        explicit_hash_key: ehk.map(|h| h.to_string()),
        data: Bytes::from(data.to_owned()),
    }
}

#[tokio::test]
async fn lists_shards_with_ranges_in_small_pages() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(5).await;
    let mut read = fast_reads();
    read.list_page_size = Some(2);
    let source = k.source(&stream, read).await;
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shards.len(), 5);
    let mut next = 0u128;
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s.id.as_str(), format!("shardId-{i:012}"));
        assert!(s.parents.is_empty() && !s.closed, "{s:?}");
        let r = s.hash_range.clone().unwrap_or_else(|| panic!("no range on {s:?}"));
        assert_eq!(r.start, next, "ranges are contiguous");
        next = r.end.wrapping_add(1);
    }
    assert_eq!(next, 0, "the last range ends at 2^128 - 1");
    k.delete(&stream).await;
}

#[tokio::test]
async fn reads_from_every_start_position() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(1).await;
    let source = k.source(&stream, fast_reads()).await;
    let shard = key("shardId-000000000000");
    let mut seqs = Vec::new();
    for d in ["a", "b", "c"] {
        seqs.push(k.put(&stream, d, d).await.1);
    }

    let mut all =
        source.open(&shard, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(all.resolved_start(), None, "TRIM_HORIZON does not move");
    let (records, _) = read_records(&mut all, 3).await;
    assert_eq!(payloads(&records), ["a", "b", "c"]);
    assert!(records.iter().all(|r| r.sub == 0 && r.arrival_millis > 0));
    assert_eq!(records[1].seq, seq(&seqs[1]));

    // After a sequence number: what follows it.
    let after_b = Position::sequence(seq(&seqs[1]));
    let mut r = source.open(&shard, &after_b).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payloads(&read_records(&mut r, 1).await.0), ["c"]);

    // AT_TIMESTAMP: exactly the records that arrived at or after it.
    let t = records[1].arrival_millis;
    let expected: Vec<String> =
        payloads(&records.iter().filter(|r| r.arrival_millis >= t).cloned().collect::<Vec<_>>());
    let at = Position::AtTimestamp { millis: t };
    let mut r = source.open(&shard, &at).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.resolved_start(), Some(at.clone()), "AT_TIMESTAMP is fixed already");
    assert_eq!(payloads(&read_records(&mut r, expected.len()).await.0), expected);

    // LATEST: only what comes after the open, and a pinned start that loses nothing of it.
    let mut latest = source.open(&shard, &Position::Latest).await.unwrap_or_else(|e| panic!("{e}"));
    let pinned = latest.resolved_start().unwrap_or_else(|| panic!("LATEST must be pinned"));
    assert!(matches!(pinned, Position::AtTimestamp { .. }), "{pinned:?}");
    k.put(&stream, "d", "d").await;
    assert_eq!(payloads(&read_records(&mut latest, 1).await.0), ["d"]);
    let mut moved = source.open(&shard, &pinned).await.unwrap_or_else(|e| panic!("{e}"));
    let (again, _) = read_records(&mut moved, 4).await;
    assert!(payloads(&again).contains(&"d".to_owned()), "a moved lease re-reads, never skips");

    // SHARD_END: the end at once (an open shard has no children).
    let mut end = source.open(&shard, &Position::ShardEnd).await.unwrap_or_else(|e| panic!("{e}"));
    let batch = end.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(batch.records.is_empty() && batch.end == Some(vec![]));
    k.delete(&stream).await;
}

#[tokio::test]
async fn latest_pins_at_or_before_what_it_reads() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(1).await;
    let source = k.source(&stream, fast_reads()).await;
    let shard = key("shardId-000000000000");
    k.put(&stream, "old", "old").await;
    // The pin lies at or before every record the LATEST reader delivers.
    let mut latest = source.open(&shard, &Position::Latest).await.unwrap_or_else(|e| panic!("{e}"));
    k.put(&stream, "new", "new").await;
    let (records, _) = read_records(&mut latest, 1).await;
    assert_eq!(payloads(&records), ["new"]);
    let Some(Position::AtTimestamp { millis }) = latest.resolved_start() else {
        panic!("LATEST must be pinned at a timestamp")
    };
    assert!(millis <= records[0].arrival_millis);
    k.delete(&stream).await;
}

#[tokio::test]
async fn resumes_inside_an_aggregate_by_sub_sequence_number() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(1).await;
    let source = k.source(&stream, fast_reads()).await;
    let shard = key("shardId-000000000000");
    let users: Vec<UserRecord> =
        (0..4).map(|i| user(&format!("u{i}"), None, &format!("u{i}"))).collect();
    let (_, agg_seq) = k.put(&stream, "agg", kpl::aggregate(&users)).await;
    k.put(&stream, "plain", "plain").await;

    let mut r = source.open(&shard, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    let (records, _) = read_records(&mut r, 5).await;
    assert_eq!(payloads(&records), ["u0", "u1", "u2", "u3", "plain"]);
    let subs: Vec<u64> = records.iter().map(|r| r.sub).collect();
    assert_eq!(subs, [0, 1, 2, 3, 0]);
    assert!(records[..4].iter().all(|r| r.seq == seq(&agg_seq)));
    assert_eq!(records[2].partition_key, "u2");

    for (sub, expected) in [(1, vec!["u2", "u3", "plain"]), (3, vec!["plain"])] {
        let from = Position::Sequence { seq: seq(&agg_seq), sub };
        let mut r = source.open(&shard, &from).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            payloads(&read_records(&mut r, expected.len()).await.0),
            expected,
            "after {sub}"
        );
    }
    k.delete(&stream).await;
}

#[tokio::test]
async fn malformed_aggregates_arrive_raw_and_out_of_range_user_records_are_delivered() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(2).await;
    let source = k.source(&stream, fast_reads()).await;
    let shard = key("shardId-000000000000"); // hash keys 0 ..= 2^127 - 1

    // An aggregate routed to shard 0 whose user records straddle both shards' ranges.
    let mixed = vec![
        user("a", Some(5), "in-0"),
        user("b", Some(HALF + 5), "out"),
        user("c", Some(7), "in-2"),
    ];
    let (s, mixed_seq) = k.put_with(&stream, "x", Some(1), kpl::aggregate(&mixed)).await;
    assert_eq!(s, shard.as_str());
    // A corrupt one: the right magic, a wrong digest.
    let mut corrupt = kpl::aggregate(&[user("a", Some(5), "lost?")]).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x55;
    k.put_with(&stream, "y", Some(2), Bytes::from(corrupt.clone())).await;
    k.put_with(&stream, "z", Some(3), Bytes::from_static(b"plain")).await;

    let mut r = source.open(&shard, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    let (records, _) = read_records(&mut r, 5).await;
    assert_eq!(records.len(), 5, "{records:?}");
    assert_eq!(payloads(&records[..3]), ["in-0", "out", "in-2"], "out of range, still delivered");
    let subs: Vec<u64> = records[..3].iter().map(|r| r.sub).collect();
    assert_eq!(subs, [0, 1, 2]);
    assert_eq!(records[1].partition_key, "b");
    assert!(records[..3].iter().all(|r| r.seq == seq(&mixed_seq)));
    assert_eq!(records[3].data, Bytes::from(corrupt), "the malformed aggregate arrives raw");
    assert_eq!((records[3].sub, records[3].partition_key.as_str()), (0, "y"));
    assert_eq!(payloads(&records[4..]), ["plain"]);
    k.delete(&stream).await;
}

#[tokio::test]
async fn shards_end_with_their_children_after_a_split_and_a_merge() {
    let Some(k) = emulator() else { return };
    let stream = k.create_stream(1).await;
    let source = k.source(&stream, fast_reads()).await;
    let (p, c1, c2, m) = (
        key("shardId-000000000000"),
        key("shardId-000000000001"),
        key("shardId-000000000002"),
        key("shardId-000000000003"),
    );
    k.put(&stream, "before", "before").await;
    k.split(&stream, p.as_str(), HALF).await;
    k.put_with(&stream, "low", Some(1), Bytes::from_static(b"low")).await;
    k.put_with(&stream, "high", Some(HALF + 1), Bytes::from_static(b"high")).await;
    k.merge(&stream, c1.as_str(), c2.as_str()).await;
    k.put(&stream, "after", "after").await;

    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    let by_id = |id: &LeaseKey| shards.iter().find(|s| &s.id == id).cloned();
    let listed = |id: &LeaseKey| by_id(id).unwrap_or_else(|| panic!("{id} not listed"));
    assert!(listed(&p).closed && listed(&c1).closed && listed(&c2).closed && !listed(&m).closed);
    assert_eq!(listed(&c1).parents, vec![p.clone()]);
    assert_eq!(listed(&m).parents, vec![c1.clone(), c2.clone()], "parent, then adjacent parent");

    let mut r = source.open(&p, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    let (records, children) = read_to_end(&mut r).await;
    assert_eq!(payloads(&records), ["before"]);
    let mut ids: Vec<LeaseKey> = children.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec![c1.clone(), c2.clone()]);
    // The end is reported again on every later call.
    let again = r.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.end.map(|c| c.len()), Some(2));

    for (child, data) in [(&c1, "low"), (&c2, "high")] {
        let mut r =
            source.open(child, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
        let (records, children) = read_to_end(&mut r).await;
        assert_eq!(payloads(&records), [data]);
        assert_eq!(children.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), vec![m.clone()]);
        assert_eq!(children[0].parents, vec![c1.clone(), c2.clone()]);
    }
    let mut r = source.open(&m, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payloads(&read_records(&mut r, 1).await.0), ["after"]);
    k.delete(&stream).await;
}

#[tokio::test]
async fn unknown_streams_and_shards_are_errors_not_panics() {
    let Some(k) = emulator() else { return };
    let source = k.source("no-such-stream", fast_reads()).await;
    let err = source.list_shards().await.err().unwrap_or_else(|| panic!("listing must fail"));
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("ResourceNotFoundException"), "{err}");
    assert!(!err.to_string().contains("dummy"), "no credentials in errors: {err}");
    let stream = k.create_stream(1).await;
    let source = k.source(&stream, fast_reads()).await;
    let open = source.open(&key("shardId-000000000009"), &Position::TrimHorizon).await;
    assert!(open.is_err());
    k.delete(&stream).await;
}
