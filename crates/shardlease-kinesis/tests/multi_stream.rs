//! End to end on kinesalite: one fleet consumes three streams through a `MultiStreamSource`
//! (one namespace, leases keyed `stream/shardId-…`). While it runs, a worker joins, a fourth
//! stream is added, one stream is removed, a worker crashes and another leaves gracefully. Every
//! record of every stream is processed at least once, and the removed stream's leases are
//! finished and deleted once its removal grace passed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::fleet::{seq, start, Id, Log};
use common::{emulator, eventually, fast_reads, Emulator};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, Position, ShardSource};
use shardlease_kinesis::{KinesisSource, MultiStreamSource};

/// Puts `n` records on `stream`, returning their ids as the fleet's log records them.
async fn put(k: &Emulator, stream: &str, n: usize, tag: &str) -> Vec<Id> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let (shard, s) = k.put(stream, &format!("{tag}-{i}"), format!("{tag}-{i}")).await;
        ids.push((format!("{stream}/{shard}"), seq(&s), 0));
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reads_several_streams_added_and_removed_while_it_runs() {
    let Some(k) = emulator() else { return };
    let (a, b, c, d) = (
        k.create_stream(2).await,
        k.create_stream(1).await,
        k.create_stream(1).await,
        k.create_stream(1).await,
    );
    let grace = Duration::from_secs(2);
    let template = KinesisSource::builder("")
        .region("us-east-1")
        .endpoint_url(&k.endpoint)
        .static_credentials("dummy", "dummy")
        .read_config(fast_reads());
    let multi = MultiStreamSource::builder(template)
        .stream(&a)
        .stream(&b)
        .stream_at(&c, Position::TrimHorizon)
        .removal_grace(grace)
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let source: Arc<dyn ShardSource> = Arc::new(multi.clone());
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("multi".parse().unwrap_or_else(|e| panic!("{e}"))));
    let config = Config::new("multi")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_shard_sync_interval(Duration::from_millis(300))
        .with_initial_position(Position::TrimHorizon);
    let log = Log::default();
    let mut expected: BTreeMap<String, BTreeSet<Id>> = BTreeMap::new();
    for s in [&a, &b, &c] {
        expected.entry(s.clone()).or_default().extend(put(&k, s, 10, "before").await);
    }
    let w1 = start(&config, "w1", &store, &source, &log).await;
    let w2 = start(&config, "w2", &store, &source, &log).await;
    let seen_all = |log: &Log, want: &BTreeSet<Id>| want.is_subset(&log.ids());
    let b_ids = expected[&b].clone();
    eventually("every record of the stream to remove", || async {
        seen_all(&log, &b_ids).then_some(())
    })
    .await;

    // A worker joins; a stream is added; the removed stream's leases stay for the grace.
    let w3 = start(&config, "w3", &store, &source, &log).await;
    multi.add_stream(&d, None).await.unwrap_or_else(|e| panic!("{e}"));
    expected.entry(d.clone()).or_default().extend(put(&k, &d, 10, "added").await);
    multi.remove_stream(&b).unwrap_or_else(|e| panic!("{e}"));
    let b_leases = |store: Arc<dyn LeaseStore>, b: String| async move {
        let listing = store.list_leases().await.unwrap_or_else(|e| panic!("{e}"));
        listing.items.iter().filter(|v| v.lease.key.as_str().starts_with(&format!("{b}/"))).count()
    };
    assert_eq!(b_leases(store.clone(), b.clone()).await, 1, "removed, still in its grace");

    // A crash and a graceful leave while records keep coming.
    w1.crash();
    for s in [&a, &c, &d] {
        expected.entry(s.clone()).or_default().extend(put(&k, s, 10, "after-crash").await);
    }
    w2.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    for s in [&a, &c, &d] {
        expected.entry(s.clone()).or_default().extend(put(&k, s, 5, "after-leave").await);
    }
    let all: BTreeSet<Id> = expected.values().flatten().cloned().collect();
    eventually("every record of every stream", || async { seen_all(&log, &all).then_some(()) })
        .await;
    eventually("the removed stream's leases deleted after the grace", || async {
        (b_leases(store.clone(), b.clone()).await == 0).then_some(())
    })
    .await;
    let keys: Vec<String> = store
        .list_leases()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .items
        .iter()
        .map(|v| v.lease.key.as_str().to_owned())
        .collect();
    assert!(keys.iter().any(|key| key.starts_with(&format!("{d}/"))), "{keys:?}");
    w3.shutdown().await.unwrap_or_else(|e| panic!("{e}"));

    let events = log.events();
    for (name, want) in &expected {
        let delivered: Vec<&Id> =
            events.iter().map(|(id, _)| id).filter(|id| want.contains(*id)).collect();
        let distinct: BTreeSet<&Id> = delivered.iter().copied().collect();
        let role = match name {
            n if n == &b => "removed",
            n if n == &d => "added",
            _ => "kept",
        };
        eprintln!(
            "multi-stream e2e: stream {role}: records {} / processed {} / twice {}",
            want.len(),
            delivered.len(),
            delivered.len() - distinct.len()
        );
        assert_eq!(distinct.len(), want.len(), "stream {name}: every record processed");
    }
    for s in [&a, &b, &c, &d] {
        k.delete(s).await;
    }
}
