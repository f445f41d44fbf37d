//! The combining logic on memory streams: qualified keys and parents, reading through the
//! combined source, per-stream initial positions, adding, removing and retiring streams, and the
//! configuration errors.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::memory::MemorySource;

fn key(s: &str) -> LeaseKey {
    LeaseKey::from(s)
}

fn two() -> (MultiSource, MemorySource, MemorySource) {
    let (a, b) = (MemorySource::new(1), MemorySource::new(2));
    let source = MultiSource::builder()
        .stream("a", Arc::new(a.clone()))
        .stream_at("b", Arc::new(b.clone()), Position::Latest)
        .removal_grace(Duration::ZERO)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    (source, a, b)
}

fn ids(shards: &[ShardInfo]) -> Vec<&str> {
    shards.iter().map(|s| s.id.as_str()).collect()
}

#[tokio::test]
async fn keys_and_parents_are_qualified_by_stream() {
    let (source, a, b) = two();
    let (l, r) = a.split(&key("shardId-000000000000")).unwrap_or_else(|e| panic!("{e}"));
    b.merge(&key("shardId-000000000000"), &key("shardId-000000000001"))
        .unwrap_or_else(|e| panic!("{e}"));
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ids(&shards),
        [
            "a/shardId-000000000000",
            "a/shardId-000000000001",
            "a/shardId-000000000002",
            "b/shardId-000000000000",
            "b/shardId-000000000001",
            "b/shardId-000000000002",
        ]
    );
    let split_kids: Vec<&ShardInfo> =
        shards.iter().filter(|s| s.id == qualify("a", &l) || s.id == qualify("a", &r)).collect();
    assert_eq!(split_kids.len(), 2);
    for kid in split_kids {
        assert_eq!(kid.parents, [key("a/shardId-000000000000")]);
    }
    let merged = shards.iter().find(|s| s.id.as_str() == "b/shardId-000000000002");
    assert_eq!(
        merged.map(|m| m.parents.clone()),
        Some(vec![key("b/shardId-000000000000"), key("b/shardId-000000000001")])
    );
    assert!(shards
        .iter()
        .filter(|s| s.id.as_str().starts_with("b/"))
        .all(|s| s.hash_range.is_some()));
}

#[tokio::test]
async fn reads_go_to_the_right_stream_and_shard_end_children_are_qualified() {
    let (source, a, b) = two();
    a.put("x", "from-a");
    b.put_to_shard(&key("shardId-000000000001"), "from-b").unwrap_or_else(|e| panic!("{e}"));
    let mut ra = source
        .open(&key("a/shardId-000000000000"), &Position::TrimHorizon)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rb = source
        .open(&key("b/shardId-000000000001"), &Position::TrimHorizon)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ba = ra.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    let bb = rb.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ba.records.iter().map(|r| r.data.clone()).collect::<Vec<_>>(), ["from-a"]);
    assert_eq!(bb.records.iter().map(|r| r.data.clone()).collect::<Vec<_>>(), ["from-b"]);
    a.split(&key("shardId-000000000000")).unwrap_or_else(|e| panic!("{e}"));
    let end = ra.next_batch().await.unwrap_or_else(|e| panic!("{e}")).end;
    let kids: Vec<String> =
        end.unwrap_or_default().iter().map(|c| c.id.as_str().to_owned()).collect();
    assert_eq!(kids, ["a/shardId-000000000001", "a/shardId-000000000002"]);
    for bad in ["shardId-000000000000", "c/shardId-000000000000", "/x", "a/"] {
        assert!(source.open(&key(bad), &Position::TrimHorizon).await.is_err(), "{bad}");
    }
}

#[test]
fn initial_positions_are_per_stream() {
    let (source, _, _) = two();
    assert_eq!(source.initial_position(&key("a/shardId-000000000000")), None);
    assert_eq!(source.initial_position(&key("b/shardId-000000000000")), Some(Position::Latest));
    assert_eq!(source.initial_position(&key("shardId-000000000000")), None);
    assert!(source.keys_name_streams());
}

#[tokio::test]
async fn added_streams_are_listed_and_removed_ones_retired_after_the_grace() {
    let (source, _, _) = two();
    let set = source.streams();
    set.add_at("c", Arc::new(MemorySource::new(1)), Position::TrimHorizon)
        .unwrap_or_else(|e| panic!("{e}"));
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(ids(&shards).contains(&"c/shardId-000000000000"));
    assert!(!source.retired(&key("a/shardId-000000000000")));
    set.remove("a").unwrap_or_else(|e| panic!("{e}"));
    // Zero grace: retired at once; not listed, not opened, and its keys say so.
    assert!(source.retired(&key("a/shardId-000000000000")));
    assert!(!source.retired(&key("b/shardId-000000000000")));
    assert!(!source.retired(&key("shardId-000000000000")));
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(ids(&shards).iter().all(|k| !k.starts_with("a/")), "{shards:?}");
    assert!(source.open(&key("a/shardId-000000000000"), &Position::TrimHorizon).await.is_err());
    assert_eq!(set.names(), ["b", "c"]);
    assert_eq!(set.retired(), ["a"]);
    // A retired stream cannot come back under its name in this process.
    assert!(matches!(set.add("a", Arc::new(MemorySource::new(1))), Err(Error::Config(_))));
    // A stream this process never read is retired too (a removal from before a restart).
    set.remove("old").unwrap_or_else(|e| panic!("{e}"));
    assert!(source.retired(&key("old/shardId-000000000000")));
}

#[tokio::test]
async fn a_removed_stream_is_read_during_its_grace_and_can_come_back() {
    let source = MultiSource::builder()
        .stream("a", Arc::new(MemorySource::new(1)))
        .stream("b", Arc::new(MemorySource::new(1)))
        .removal_grace(Duration::from_secs(3600))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let set = source.streams();
    set.remove("a").unwrap_or_else(|e| panic!("{e}"));
    set.remove("a").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.removing(), ["a"]);
    assert!(!source.retired(&key("a/shardId-000000000000")));
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&shards), ["a/shardId-000000000000", "b/shardId-000000000000"]);
    assert!(source.open(&key("a/shardId-000000000000"), &Position::TrimHorizon).await.is_ok());
    set.add("a", Arc::new(MemorySource::new(5))).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.removing().is_empty());
    // The first source is kept: still one shard.
    let shards = source.list_shards().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(shards.len(), 2);
}

#[test]
fn configuration_errors_are_clear() {
    let m = || Arc::new(MemorySource::new(1)) as Arc<dyn ShardSource>;
    let err = |b: MultiSourceBuilder| match b.build() {
        Err(Error::Config(msg)) => msg,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert!(err(MultiSource::builder()).contains("at least one stream"));
    assert!(err(MultiSource::builder().stream("a", m()).stream("a", m())).contains("twice"));
    assert!(err(MultiSource::builder().stream("", m())).contains("empty"));
    assert!(err(MultiSource::builder().stream("a/b", m())).contains("'/'"));
    assert!(err(MultiSource::builder().stream("a b", m())).contains("whitespace"));
    assert!(err(MultiSource::builder().stream("x".repeat(129), m())).contains("128"));
    let seq = Position::ShardEnd;
    assert!(err(MultiSource::builder().stream_at("a", m(), seq)).contains("initial position"));
    let long = Duration::from_secs(31 * 86_400);
    assert!(err(MultiSource::builder().stream("a", m()).removal_grace(long)).contains("30 days"));
    let (source, _, _) = two();
    let set = source.streams();
    assert!(matches!(set.add("a", m()), Err(Error::Config(m)) if m.contains("already")));
    assert!(matches!(set.remove("a/b"), Err(Error::Config(_))));
}

#[test]
fn keys_split_at_the_first_separator() {
    assert_eq!(split_key(&key("s/shardId-1")), Some(("s", key("shardId-1"))));
    assert_eq!(split_key(&key("s/a/b")), Some(("s", key("a/b"))));
    assert_eq!(split_key(&key("shardId-1")), None);
    assert_eq!(split_key(&key("/x")), None);
    assert_eq!(qualify("s", &key("shardId-1")), key("s/shardId-1"));
}
