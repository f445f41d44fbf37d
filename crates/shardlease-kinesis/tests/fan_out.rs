//! Enhanced fan-out against the in-process ferrokinesis emulator: the consumer registered once
//! and found again, every start position through a subscription, resubscription after short
//! sessions without loss or repeat, shard end with both parents of a merge, KPL aggregates that
//! pack a partition key per user record (delivered whole, out-of-range ones counted, exactly as
//! polling delivers them), deregistration only on request, and errors (not panics) for unknown
//! streams and shards.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::ferro::{counter, fan_out, ferrokinesis, record_metrics};
use common::{eventually, fast_reads, payloads, read_records, read_to_end, Emulator};
use rand::Rng;
use shardlease_core::{LeaseKey, Position, Record, SequenceNumber, ShardSource};
use shardlease_kinesis::kpl::{self, UserRecord};
use shardlease_kinesis::telemetry::{OUT_OF_RANGE_USER_RECORDS, SUBSCRIPTIONS};
use shardlease_kinesis::KinesisSource;

const HALF: u128 = 1 << 127;
/// A session far longer than any test.
const LONG: Duration = Duration::from_secs(600);

fn key(s: &str) -> LeaseKey {
    LeaseKey::from(s)
}

fn seq(s: &str) -> SequenceNumber {
    SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

async fn efo(k: &Emulator, stream: &str, consumer: &str) -> KinesisSource {
    k.fan_out_source(stream, fan_out(consumer), fast_reads()).await
}

#[tokio::test]
async fn the_consumer_is_registered_once_and_deregistered_only_on_request() {
    let k = ferrokinesis(LONG).await;
    let stream = k.create_stream(1).await;
    let first = efo(&k, &stream, "app").await;
    let arn = first.consumer_arn().unwrap_or_else(|| panic!("no consumer")).to_owned();
    assert!(arn.contains("/consumer/app:"), "{arn}");
    // A second worker finds the same consumer.
    let second = efo(&k, &stream, "app").await;
    assert_eq!(second.consumer_arn(), Some(arn.as_str()));
    // Dropping sources deregisters nothing.
    drop((first, second));
    let listed = k.client.list_stream_consumers().stream_arn(arn_of(&k, &stream).await);
    let listed = listed.send().await.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(listed.consumers().len(), 1);
    // Deregistering is explicit, and says whether there was anything to remove.
    let builder = || {
        KinesisSource::builder(&stream)
            .region("us-east-1")
            .endpoint_url(&k.endpoint)
            .static_credentials("dummy", "dummy")
            .enhanced_fan_out("app")
    };
    assert!(builder().deregister_consumer().await.unwrap_or_else(|e| panic!("{e}")));
    eventually("the consumer gone", || async {
        let out = k.client.list_stream_consumers().stream_arn(arn_of(&k, &stream).await);
        let out = out.send().await.ok()?;
        out.consumers().is_empty().then_some(())
    })
    .await;
    assert!(!builder().deregister_consumer().await.unwrap_or_else(|e| panic!("{e}")));
    // A polling source has no consumer to deregister.
    let polling = k.source(&stream, fast_reads()).await;
    assert!(polling.deregister_consumer().await.is_err());
}

async fn arn_of(k: &Emulator, stream: &str) -> String {
    let out = k.client.describe_stream_summary().stream_name(stream).send().await;
    let out = out.unwrap_or_else(|e| panic!("{e:?}"));
    out.stream_description_summary.unwrap_or_else(|| panic!("no summary")).stream_arn
}

#[tokio::test]
async fn reads_from_every_start_position() {
    let k = ferrokinesis(LONG).await;
    let stream = k.create_stream(1).await;
    let source = efo(&k, &stream, "positions").await;
    let shard = key("shardId-000000000000");
    let mut seqs = Vec::new();
    for d in ["a", "b", "c"] {
        seqs.push(k.put(&stream, d, d).await.1);
    }

    let mut all =
        source.open(&shard, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(all.resolved_start(), None);
    let (records, _) = read_records(&mut all, 3).await;
    assert_eq!(payloads(&records), ["a", "b", "c"]);
    assert!(records.iter().all(|r| r.sub == 0 && r.arrival_millis > 0));
    assert_eq!(records[1].seq, seq(&seqs[1]));
    // The subscription stays open: later records arrive on it.
    k.put(&stream, "d", "d").await;
    assert_eq!(payloads(&read_records(&mut all, 1).await.0), ["d"]);

    let after_b = Position::sequence(seq(&seqs[1]));
    let mut r = source.open(&shard, &after_b).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payloads(&read_records(&mut r, 2).await.0), ["c", "d"]);

    let t = records[1].arrival_millis;
    let at = Position::AtTimestamp { millis: t };
    let mut r = source.open(&shard, &at).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.resolved_start(), Some(at.clone()));
    let expected: Vec<String> =
        payloads(&records.iter().filter(|r| r.arrival_millis >= t).cloned().collect::<Vec<_>>());
    let got = payloads(&read_records(&mut r, expected.len()).await.0);
    assert_eq!(got[..expected.len()], expected[..]);

    let mut latest = source.open(&shard, &Position::Latest).await.unwrap_or_else(|e| panic!("{e}"));
    let pinned = latest.resolved_start().unwrap_or_else(|| panic!("LATEST must be pinned"));
    assert!(matches!(pinned, Position::AtTimestamp { .. }), "{pinned:?}");
    k.put(&stream, "e", "e").await;
    assert_eq!(payloads(&read_records(&mut latest, 1).await.0), ["e"]);
    let mut moved = source.open(&shard, &pinned).await.unwrap_or_else(|e| panic!("{e}"));
    let (again, _) = read_records(&mut moved, 5).await;
    assert!(payloads(&again).contains(&"e".to_owned()), "a moved lease re-reads, never skips");

    let mut end = source.open(&shard, &Position::ShardEnd).await.unwrap_or_else(|e| panic!("{e}"));
    let batch = end.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(batch.records.is_empty() && batch.end == Some(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_renewed_after_their_session_lose_and_repeat_nothing() {
    record_metrics();
    // Sessions of 700 ms: the reader below lives through several.
    let k = ferrokinesis(Duration::from_millis(700)).await;
    let stream = k.create_stream(1).await;
    let source = efo(&k, &stream, "renewing").await;
    let shard = key("shardId-000000000000");
    let subscriptions =
        || counter(SUBSCRIPTIONS, &[("stream", stream.as_str()), ("shard", shard.as_str())]);
    let mut reader =
        source.open(&shard, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    let mut delivered: Vec<Record> = Vec::new();
    let mut expected = Vec::new();
    // Records put in rounds, each round after the reader subscribed once more.
    for round in 0..4 {
        let before = subscriptions();
        for i in 0..5 {
            let data = format!("r{round}-{i}");
            k.put(&stream, &data, data.clone()).await;
            expected.push(data);
        }
        let (records, _) = read_records(&mut reader, 5).await;
        delivered.extend(records);
        eventually("a renewed subscription", || async { (subscriptions() > before).then_some(()) })
            .await;
    }
    // Whatever the renewals re-sent, the processor saw every record once, in order.
    k.put(&stream, "last", "last").await;
    expected.push("last".into());
    let want = expected.len() - delivered.len();
    delivered.extend(read_records(&mut reader, want).await.0);
    assert_eq!(payloads(&delivered), expected);
    // Every round waited for a subscription newer than the one before it.
    assert!(subscriptions() >= 4, "{}", subscriptions());
}

#[tokio::test]
async fn shards_end_with_their_children_after_a_split_and_a_merge() {
    let k = ferrokinesis(LONG).await;
    let stream = k.create_stream(1).await;
    let source = efo(&k, &stream, "reshard").await;
    let (p, c1, c2, m) = (
        key("shardId-000000000000"),
        key("shardId-000000000001"),
        key("shardId-000000000002"),
        key("shardId-000000000003"),
    );
    // A subscription open on the parent while it splits: it ends with the children.
    let mut live = source.open(&p, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    k.put(&stream, "before", "before").await;
    assert_eq!(payloads(&read_records(&mut live, 1).await.0), ["before"]);
    k.split(&stream, p.as_str(), HALF).await;
    k.put_with(&stream, "low", Some(1), Bytes::from_static(b"low")).await;
    k.put_with(&stream, "high", Some(HALF + 1), Bytes::from_static(b"high")).await;
    let (rest, children) = read_to_end(&mut live).await;
    assert!(rest.is_empty(), "{rest:?}");
    let mut ids: Vec<LeaseKey> = children.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec![c1.clone(), c2.clone()]);
    assert!(children.iter().all(|c| c.parents == vec![p.clone()] && c.hash_range.is_some()));
    let again = live.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.end.map(|c| c.len()), Some(2), "the end is reported again");

    k.merge(&stream, c1.as_str(), c2.as_str()).await;
    k.put(&stream, "after", "after").await;
    for (child, data) in [(&c1, "low"), (&c2, "high")] {
        let mut r =
            source.open(child, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
        let (records, children) = read_to_end(&mut r).await;
        assert_eq!(payloads(&records), [data]);
        assert_eq!(children.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), vec![m.clone()]);
        // Both parents, from either side of the merge.
        assert_eq!(children[0].parents, vec![c1.clone(), c2.clone()], "read from {child}");
    }
    let mut r = source.open(&m, &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payloads(&read_records(&mut r, 1).await.0), ["after"]);
}

/// Aggregates as the aggregation libraries build them: a random partition key per user record,
/// the aggregate routed by the first one's key, so most user records hash outside the shard the
/// aggregate lands on.
fn library_aggregates(n: usize, per: usize) -> Vec<(String, Vec<UserRecord>)> {
    let mut rng = rand::rng();
    (0..n)
        .map(|a| {
            let users: Vec<UserRecord> = (0..per)
                .map(|i| UserRecord {
                    partition_key: format!("{:016x}", rng.random::<u64>()),
                    explicit_hash_key: None,
                    data: Bytes::from(format!("agg{a}-{i}")),
                })
                .collect();
            (users[0].partition_key.clone(), users)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpl_user_records_are_delivered_whole_and_exactly_as_polling_delivers_them() {
    record_metrics();
    let k = ferrokinesis(LONG).await;
    let stream = k.create_stream(4).await;
    let polling = k.source(&stream, fast_reads()).await;
    let fanning = efo(&k, &stream, "kpl").await;
    let shards = polling.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    let mut expected: BTreeMap<String, usize> = BTreeMap::new(); // shard -> user records
    let mut out_of_range: BTreeMap<String, u64> = BTreeMap::new();
    for (pk, users) in library_aggregates(12, 8) {
        let (shard, _) = k.put(&stream, &pk, kpl::aggregate(&users)).await;
        let range = shards
            .iter()
            .find(|s| s.id.as_str() == shard)
            .and_then(|s| s.hash_range.clone())
            .unwrap_or_else(|| panic!("{shard} has no range"));
        let outside = users
            .iter()
            .filter(|u| {
                let h = kpl::partition_key_hash(&u.partition_key);
                h < range.start || h > range.end
            })
            .count();
        *out_of_range.entry(shard.clone()).or_default() += outside as u64;
        *expected.entry(shard).or_default() += users.len();
    }
    // Plain records and a malformed aggregate between them.
    let mut corrupt = kpl::aggregate(&[UserRecord {
        partition_key: "x".into(),
        explicit_hash_key: None,
        data: Bytes::from_static(b"x"),
    }])
    .to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x55;
    let (s, _) = k.put(&stream, "corrupt", Bytes::from(corrupt)).await;
    *expected.entry(s).or_default() += 1;
    assert!(out_of_range.values().sum::<u64>() > 0, "the test needs out-of-range records");

    let shard_ids: Vec<String> = expected.keys().cloned().collect();
    for id in &shard_ids {
        let want = expected[id];
        let mut p =
            polling.open(&key(id), &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
        let mut f =
            fanning.open(&key(id), &Position::TrimHorizon).await.unwrap_or_else(|e| panic!("{e}"));
        let (by_polling, _) = read_records(&mut p, want).await;
        let (by_fan_out, _) = read_records(&mut f, want).await;
        assert_eq!(by_polling.len(), want, "{id}");
        assert_eq!(by_fan_out, by_polling, "{id}: same records, same sub-sequence numbers");
        // Resuming inside an aggregate: exactly the user records after the checkpoint.
        let (mid, tail) = by_polling.split_at(want / 2);
        let from = mid.last().map_or(Position::TrimHorizon, Record::position);
        let mut r = fanning.open(&key(id), &from).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_records(&mut r, tail.len()).await.0, tail, "{id} from {from:?}");
    }
    // Polling and fan-out each counted every out-of-range user record, by shard (the resumed
    // reads count the aggregates they re-read too: at least twice over).
    for (id, n) in out_of_range.iter().filter(|(_, n)| **n > 0) {
        let got = counter(OUT_OF_RANGE_USER_RECORDS, &[("stream", &stream), ("shard", id)]);
        assert!(got >= 2 * n, "{id}: counted {got}, expected at least {}", 2 * n);
    }
}

#[tokio::test]
async fn unknown_streams_and_shards_are_errors_not_panics() {
    let k = ferrokinesis(LONG).await;
    // No stream: building fails at once (a permanent error), it does not wait for a consumer.
    let built = KinesisSource::builder("no-such-stream")
        .region("us-east-1")
        .endpoint_url(&k.endpoint)
        .static_credentials("dummy", "dummy")
        .fan_out_config(fan_out("app"))
        .build()
        .await;
    let err = built.err().unwrap_or_else(|| panic!("building must fail"));
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("ResourceNotFoundException"), "{err}");
    assert!(!err.to_string().contains("dummy"), "no credentials in errors: {err}");
    // No shard: opening it fails.
    let stream = k.create_stream(1).await;
    let source = efo(&k, &stream, "app").await;
    let open = source.open(&key("shardId-000000000009"), &Position::TrimHorizon).await;
    assert!(open.is_err());
}
