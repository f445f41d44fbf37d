//! Unit tests of the reading loop against the scripted [`FakeApi`], in paused tokio time (every
//! wait is virtual and exact): listing pages, the call interval, idle backoff, jittered backoff
//! on throttling, iterator renewal, bounded retries, shard end, and the one-batch read-ahead.

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Error, LeaseKey, Position, ShardSource};
use tokio::time::Instant;

use crate::api::{Api, IteratorStart, StreamRef};
use crate::config::ReadConfig;
use crate::fake::FakeApi;
use crate::fetcher::Fetcher;
use crate::listing::list_all;
use crate::source::KinesisSource;

fn config() -> ReadConfig {
    ReadConfig { max_records: 2, max_retries: 2, ..ReadConfig::default() }
}

fn fetcher(api: &Arc<FakeApi>, c: ReadConfig) -> Fetcher {
    let api: Arc<dyn Api> = api.clone();
    Fetcher::new(
        api,
        Arc::new(c),
        "stream".into(),
        LeaseKey::from("s0"),
        None,
        None,
        IteratorStart::TrimHorizon,
        None,
    )
}

fn data(batch: &shardlease_core::Batch) -> Vec<String> {
    batch.records.iter().map(|r| String::from_utf8_lossy(&r.data).into_owned()).collect()
}

async fn next_batch(f: &mut Fetcher) -> shardlease_core::Batch {
    loop {
        match f.next().await {
            Ok(Some(b)) => return b,
            Ok(None) => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn listing_follows_next_tokens() {
    let api = FakeApi::new(5, 2);
    let shards = list_all(&api, Some(2)).await.unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["s0", "s1", "s2", "s3", "s4"]);
    assert_eq!(api.lock().calls, ["list", "list next 2", "list next 4"]);
}

#[tokio::test(start_paused = true)]
async fn calls_keep_the_interval_and_idle_reads_back_off() {
    let api = Arc::new(FakeApi::new(1, 10));
    api.put("s0", &["a", "b", "c", "d"]);
    let c = config();
    let (interval, idle) = (c.min_call_interval, c.idle_interval);
    let mut f = fetcher(&api, c);
    assert_eq!(data(&next_batch(&mut f).await), ["a", "b"]);
    assert_eq!(data(&next_batch(&mut f).await), ["c", "d"]);
    // Caught up: the next read comes back empty, and the one after waits the idle interval.
    assert!(f.next().await.unwrap_or_else(|e| panic!("{e}")).is_none());
    api.put("s0", &["e"]);
    assert_eq!(data(&next_batch(&mut f).await), ["e"]);
    let at = api.lock().get_records_at.clone();
    assert_eq!(at.len(), 4);
    assert!(at[1] - at[0] >= interval && at[2] - at[1] >= interval);
    assert!(at[3] - at[2] >= idle, "{:?}", at[3] - at[2]);
}

#[tokio::test(start_paused = true)]
async fn throttling_backs_off_with_growing_jittered_waits() {
    let api = Arc::new(FakeApi::new(1, 10));
    api.put("s0", &["a"]);
    api.lock().throttle_next = 4;
    let c = config();
    let base = c.base_backoff;
    let mut f = fetcher(&api, c);
    assert_eq!(data(&next_batch(&mut f).await), ["a"], "throttling is waited out, not an error");
    let at = api.lock().get_records_at.clone();
    assert_eq!(at.len(), 5);
    for (i, w) in at.windows(2).enumerate() {
        let ceiling = base * (1 << i);
        let gap = w[1] - w[0];
        assert!(
            gap >= ceiling / 2 && gap <= ceiling + Duration::from_millis(1),
            "wait {i}: {gap:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_expired_iterator_is_renewed_after_the_last_record_read() {
    let api = Arc::new(FakeApi::new(1, 10));
    api.put("s0", &["a", "b", "c", "d"]);
    let mut f = fetcher(&api, config());
    assert_eq!(data(&next_batch(&mut f).await), ["a", "b"]);
    api.lock().expire_next = 1;
    // The renewed iterator starts at "b" again; "b" is not delivered twice.
    let mut rest = data(&next_batch(&mut f).await);
    rest.extend(data(&next_batch(&mut f).await));
    assert_eq!(rest, ["c", "d"], "nothing skipped, nothing repeated");
    let calls = api.lock().calls.clone();
    assert!(calls.contains(&"iterator AtSequence(\"1001\")".to_owned()), "{calls:?}");
}

#[tokio::test(start_paused = true)]
async fn other_failures_are_retried_a_bounded_number_of_times() {
    let api = Arc::new(FakeApi::new(1, 10));
    api.put("s0", &["a"]);
    api.lock().fail_next = 2;
    let mut f = fetcher(&api, config());
    assert_eq!(data(&next_batch(&mut f).await), ["a"]);
    api.lock().fail_next = 3;
    api.put("s0", &["b"]);
    let err = loop {
        match f.next().await {
            Ok(None) => continue,
            Ok(Some(b)) => panic!("unexpected batch {:?}", data(&b)),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::Backend { retryable: true, .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_closed_shard_ends_with_the_children_from_a_listing() {
    let api = Arc::new(FakeApi::new(1, 1));
    api.put("s0", &["a"]);
    api.close_with_child("s0", "s1");
    let mut f = fetcher(&api, config());
    let batch = next_batch(&mut f).await;
    assert_eq!(data(&batch), ["a"]);
    let children = batch.end.unwrap_or_else(|| panic!("the shard must end"));
    assert_eq!(children.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["s1"]);
}

#[tokio::test(start_paused = true)]
async fn the_reader_reads_one_batch_ahead_and_no_more() {
    let api = Arc::new(FakeApi::new(1, 10));
    api.put("s0", &["a", "b", "c", "d", "e", "f"]);
    let dyn_api: Arc<dyn Api> = api.clone();
    let source = KinesisSource::with_api(dyn_api, StreamRef::parse("stream"), config())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reader = source
        .open(&LeaseKey::from("s0"), &Position::TrimHorizon)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let gets = || api.lock().calls.iter().filter(|c| *c == "get").count();
    // Nothing consumed: one batch is read ahead, then the task waits for room.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(gets(), 1);
    let b = reader.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(data(&b), ["a", "b"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(gets(), 2, "the next batch is read while this one is processed");
    let started = Instant::now();
    let b = reader.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (data(&b), started.elapsed()),
        (vec!["c".to_owned(), "d".to_owned()], Duration::ZERO)
    );
}
