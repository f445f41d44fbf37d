//! Unit tests of the subscription loop against the scripted [`FakeFanOut`], in paused tokio time
//! (every wait is virtual and exact): `ResourceInUseException` waited out with growing jittered
//! backoffs, a session end renewed at once from the continuation (but one without any event
//! after a backoff), a quiet subscription dropped
//! after the quiet timeout, a broken one retried a bounded number of times, records the service
//! sends again never delivered twice, and the shard's end with children from a listing.

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Batch, Error, LeaseKey, ShardInfo};

use crate::api::{Api, FanOutApi, IteratorStart};
use crate::config::ReadConfig;
use crate::convert::Unpacker;
use crate::fake::FakeApi;
use crate::fanout::fake::{event, last_event, Answer, FakeFanOut, Item};
use crate::fanout::subscriber::Subscriber;
use crate::fanout::{FanOut, FanOutConfig};

fn config() -> ReadConfig {
    ReadConfig { max_retries: 2, ..ReadConfig::default() }
}

fn subscriber(fake: &Arc<FakeFanOut>, listing: FakeApi) -> Subscriber {
    let api: Arc<dyn FanOutApi> = fake.clone();
    let fan =
        FanOut { api, config: Arc::new(FanOutConfig::new("app")), consumer_arn: "consumer".into() };
    let read = Arc::new(config());
    let shard = LeaseKey::from("s0");
    let unpacker = Unpacker::new("s".into(), shard.clone(), None, &read, None);
    let listing: Arc<dyn Api> = Arc::new(listing);
    Subscriber::new(fan, listing, read, "s".into(), shard, unpacker, IteratorStart::TrimHorizon)
}

fn data(batch: &Batch) -> Vec<String> {
    batch.records.iter().map(|r| String::from_utf8_lossy(&r.data).into_owned()).collect()
}

async fn next_batch(s: &mut Subscriber) -> Batch {
    loop {
        match s.next_event().await {
            Ok(Some(b)) => return b,
            Ok(None) => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn restarts_deliver_every_record_once_in_order() {
    let fake = Arc::new(FakeFanOut::new(vec![
        Answer::InUse,
        Answer::InUse,
        Answer::Opens(vec![event(&[1000, 1001], Some("1002")), Item::End]),
        // The renewal starts where the last event said, and the service sends 1001 again.
        Answer::Opens(vec![event(&[1001, 1002], Some("1003")), Item::Quiet]),
        Answer::Opens(vec![event(&[1003], Some("1004")), Item::Fail]),
        Answer::Opens(vec![event(&[], Some("1004")), event(&[1004], Some("1005"))]),
    ]));
    let mut s = subscriber(&fake, FakeApi::new(1, 10));
    let mut got = Vec::new();
    while got.len() < 5 {
        got.extend(data(&next_batch(&mut s).await));
    }
    assert_eq!(got, ["1000", "1001", "1002", "1003", "1004"], "nothing twice, nothing skipped");

    let calls = fake.calls();
    let starts: Vec<IteratorStart> = calls.iter().map(|(s, _)| s.clone()).collect();
    let at = |s: &str| IteratorStart::AtSequence(s.into());
    assert_eq!(
        starts,
        [
            IteratorStart::TrimHorizon,
            IteratorStart::TrimHorizon,
            IteratorStart::TrimHorizon,
            at("1002"),
            at("1003"),
            at("1004")
        ]
    );
    let gap = |i: usize| calls[i + 1].1 - calls[i].1;
    let c = config();
    // In use: jittered backoffs, the second up to twice the first's ceiling.
    assert!(gap(0) >= c.base_backoff / 2 && gap(0) <= c.base_backoff);
    assert!(gap(1) >= c.base_backoff && gap(1) <= c.base_backoff * 2);
    // A session end is renewed at once.
    assert_eq!(gap(2), Duration::ZERO);
    // A quiet subscription is dropped after the quiet timeout, then a backoff.
    let quiet = FanOutConfig::new("app").quiet_timeout;
    assert!(gap(3) >= quiet + c.base_backoff / 2 && gap(3) <= quiet + c.base_backoff);
    // A broken one is retried after a backoff.
    assert!(gap(4) >= c.base_backoff / 2 && gap(4) <= c.base_backoff);
}

#[tokio::test(start_paused = true)]
async fn subscriptions_ending_before_any_event_are_retried_after_a_backoff() {
    let fake = Arc::new(FakeFanOut::new(vec![
        Answer::Opens(vec![Item::End]),
        Answer::Opens(vec![Item::End]),
        Answer::Opens(vec![event(&[1000], Some("1001"))]),
    ]));
    let mut s = subscriber(&fake, FakeApi::new(1, 10));
    assert_eq!(data(&next_batch(&mut s).await), ["1000"]);
    let calls = fake.calls();
    let c = config();
    assert_eq!(calls.len(), 3);
    let (g0, g1) = (calls[1].1 - calls[0].1, calls[2].1 - calls[1].1);
    assert!(g0 >= c.base_backoff / 2 && g0 <= c.base_backoff, "{g0:?}");
    assert!(g1 >= c.base_backoff && g1 <= c.base_backoff * 2, "{g1:?}");
}

#[tokio::test(start_paused = true)]
async fn failures_in_a_row_are_bounded_and_handed_up() {
    let fake = Arc::new(FakeFanOut::new(vec![Answer::Fail, Answer::Fail, Answer::Fail]));
    let mut s = subscriber(&fake, FakeApi::new(1, 10));
    let err = loop {
        match s.next_event().await {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::Backend { retryable: true, .. }), "{err}");
    assert_eq!(fake.calls().len(), 3, "max_retries 2: three tries");
}

#[tokio::test(start_paused = true)]
async fn the_last_event_ends_the_shard_with_its_children() {
    let listing = FakeApi::new(1, 10);
    listing.close_with_child("s0", "s1");
    let reported = vec![ShardInfo::new("s1").with_parents([LeaseKey::from("s0")])];
    let fake = Arc::new(FakeFanOut::new(vec![Answer::Opens(vec![
        event(&[1000], Some("1001")),
        last_event(reported),
    ])]));
    let mut s = subscriber(&fake, listing);
    let first = next_batch(&mut s).await;
    assert_eq!((data(&first), first.end), (vec!["1000".to_owned()], None));
    let last = next_batch(&mut s).await;
    assert!(last.records.is_empty());
    let children = last.end.unwrap_or_else(|| panic!("the shard must end"));
    assert_eq!(children.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["s1"]);
}
