//! End to end on kinesalite: one fleet consumes three streams through a `MultiStreamSource`
//! (one namespace, leases keyed `stream/shardId-…`). While it runs, a worker joins, a fourth
//! stream is added, one stream is removed, a worker crashes and another leaves gracefully. Every
//! record of every stream is processed at least once, and the removed stream's leases are
//! finished and deleted once its removal grace passed.
//!
//! Also a fleet where one stream starts at `LATEST` and the others at `TRIM_HORIZON`: the records
//! put on the `LATEST` stream before its leases are first opened are skipped, every record put
//! after the open is processed, also after the leases moved (a crash before the first checkpoint,
//! so the new owner resumes from the pinned start; then a graceful leave, from the checkpoint).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::fleet::{seq, start, Id, Log};
use common::{emulator, eventually, fast_reads, Emulator};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{processor_fn, Config, LeaseKey, Position, ShardSource, Worker};
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

/// An in-memory lease store and a fast fleet configuration (heartbeat 100 ms, shard sync
/// 300 ms, `TRIM_HORIZON` unless a stream says otherwise) for the namespace `name`.
fn fleet(name: &str) -> (Arc<dyn LeaseStore>, Config) {
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store(name.parse().unwrap_or_else(|e| panic!("{e}"))));
    let config = Config::new(name)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_shard_sync_interval(Duration::from_millis(300))
        .with_initial_position(Position::TrimHorizon);
    (store, config)
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
    let (store, config) = fleet("multi");
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
    w2.shutdown().await;
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
    w3.shutdown().await;

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

/// Puts `n` records on `stream`, alternating between the lower and upper half of the hash key
/// space (both shards of a two-shard stream get records), returning their ids.
async fn put_spread(k: &Emulator, stream: &str, n: usize, tag: &str) -> Vec<Id> {
    const HALF: u128 = 1 << 127;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let hash = if i % 2 == 0 { 1 } else { HALF + 1 };
        let data = Bytes::from(format!("{tag}-{i}"));
        let (shard, s) = k.put_with(stream, &format!("{tag}-{i}"), Some(hash), data).await;
        ids.push((format!("{stream}/{shard}"), seq(&s), 0));
    }
    ids
}

/// The leases of `stream` in the store: key, owner, checkpoint.
async fn leases_of(
    store: &Arc<dyn LeaseStore>,
    stream: &str,
) -> Vec<(String, Option<String>, Position)> {
    let prefix = format!("{stream}/");
    store
        .list_leases()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .items
        .into_iter()
        .filter(|v| v.lease.key.as_str().starts_with(&prefix))
        .map(|v| {
            let owner = v.lease.owner.as_ref().map(|o| o.as_str().to_owned());
            (v.lease.key.as_str().to_owned(), owner, v.lease.checkpoint)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latest_stream_skips_what_came_before_its_open_and_nothing_after_it() {
    let Some(k) = emulator() else { return };
    let (a, c, l) = (k.create_stream(2).await, k.create_stream(1).await, k.create_stream(2).await);
    // Kinesalite runs on this machine's clock: no skew to cover. With the default margin (60 s),
    // a lease moved before its first checkpoint would also deliver what arrived in the minute
    // before its open (documented: re-read, never skipped); without one, the pin is the open.
    let mut read = fast_reads();
    read.latest_pin_margin = Duration::ZERO;
    let template = KinesisSource::builder("")
        .region("us-east-1")
        .endpoint_url(&k.endpoint)
        .static_credentials("dummy", "dummy")
        .read_config(read);
    let multi = MultiStreamSource::builder(template)
        .stream(&a)
        .stream_at(&c, Position::TrimHorizon)
        .stream_at(&l, Position::Latest)
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let source: Arc<dyn ShardSource> = Arc::new(multi);
    let (store, config) = fleet("latest");
    let log = Log::default();
    let mut expected: BTreeMap<String, BTreeSet<Id>> = BTreeMap::new();
    for s in [&a, &c] {
        expected.entry(s.clone()).or_default().extend(put_spread(&k, s, 10, "before").await);
    }
    let l_before: BTreeSet<Id> = put_spread(&k, &l, 10, "before").await.into_iter().collect();
    let mut l_after: BTreeSet<Id> = BTreeSet::new();

    // The first worker reads the LATEST stream but never gets to checkpoint a record of it: its
    // processor keeps the first batch with records of each of those shards (and is crashed).
    let held: Arc<std::sync::Mutex<BTreeSet<String>>> = Arc::default();
    let factory = {
        let (log, held, prefix) = (log.clone(), held.clone(), format!("{l}/"));
        processor_fn(move |ctx, batch| {
            let (held, log, prefix) = (held.clone(), log.clone(), prefix.clone());
            async move {
                let key = ctx.key().as_str().to_owned();
                if key.starts_with(&prefix) && !batch.records.is_empty() {
                    held.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
                    std::future::pending::<()>().await;
                }
                log.record(&ctx, &batch);
                Ok(())
            }
        })
    };
    let w1 = Worker::builder(
        config.clone().with_worker_id("w1"),
        store.clone(),
        source.clone(),
        factory,
    )
    .build()
    .unwrap_or_else(|e| panic!("{e}"))
    .start();

    // The producer waits for the open: both leases of the LATEST stream pinned in the store.
    let pinned = eventually("the LATEST stream's leases opened and pinned", || async {
        let ls = leases_of(&store, &l).await;
        let all = ls.len() == 2
            && ls.iter().all(|(_, o, p)| {
                o.as_deref() == Some("w1") && matches!(p, Position::AtTimestamp { .. })
            });
        all.then_some(ls)
    })
    .await;
    l_after.extend(put_spread(&k, &l, 10, "after-open").await);
    for s in [&a, &c] {
        expected.entry(s.clone()).or_default().extend(put_spread(&k, s, 10, "after-open").await);
    }
    eventually("w1 read records after the open on both LATEST shards", || async {
        (held.lock().unwrap_or_else(|p| p.into_inner()).len() == 2).then_some(())
    })
    .await;
    assert_eq!(leases_of(&store, &l).await, pinned, "nothing of the LATEST stream checkpointed");

    // A crash before the first checkpoint: the new owners resume from the pins.
    w1.crash();
    let w2 = start(&config, "w2", &store, &source, &log).await;
    let w3 = start(&config, "w3", &store, &source, &log).await;
    l_after.extend(put_spread(&k, &l, 10, "after-crash").await);
    for s in [&a, &c] {
        expected.entry(s.clone()).or_default().extend(put_spread(&k, s, 10, "after-crash").await);
    }
    let seen_all = |want: BTreeSet<Id>| {
        let log = log.clone();
        async move { want.is_subset(&log.ids()).then_some(()) }
    };
    eventually("every record after the open, after the crash", || seen_all(l_after.clone())).await;
    let owners: Vec<Option<String>> =
        leases_of(&store, &l).await.into_iter().map(|(_, o, _)| o).collect();
    assert!(owners.iter().all(|o| o.as_deref() != Some("w1")), "moved off w1: {owners:?}");

    // A graceful leave of the owner of the first LATEST shard: its successor resumes from the
    // checkpoint.
    let first = LeaseKey::from(format!("{l}/shardId-000000000000"));
    let (leaving, staying) = if w2.held_leases().contains(&first) { (w2, w3) } else { (w3, w2) };
    leaving.shutdown().await;
    l_after.extend(put_spread(&k, &l, 5, "after-leave").await);
    for s in [&a, &c] {
        expected.entry(s.clone()).or_default().extend(put_spread(&k, s, 5, "after-leave").await);
    }
    let all: BTreeSet<Id> = expected.values().flatten().chain(&l_after).cloned().collect();
    eventually("every record of every stream after the open", || seen_all(all.clone())).await;
    assert!(staying.held_leases().contains(&first), "the LATEST lease moved on the leave");
    staying.shutdown().await;

    let events = log.events();
    let delivered = |want: &BTreeSet<Id>| -> (usize, usize) {
        let hits: Vec<&Id> =
            events.iter().map(|(id, _)| id).filter(|id| want.contains(*id)).collect();
        let distinct: BTreeSet<&Id> = hits.iter().copied().collect();
        (distinct.len(), hits.len() - distinct.len())
    };
    let (before_seen, _) = delivered(&l_before);
    let (after_seen, after_twice) = delivered(&l_after);
    eprintln!(
        "multi-stream e2e: stream latest: before {} skipped {} / after {} processed {} / twice {}",
        l_before.len(),
        l_before.len() - before_seen,
        l_after.len(),
        after_seen,
        after_twice
    );
    for (name, want) in &expected {
        let (seen, twice) = delivered(want);
        let role = if name == &a { "trim-horizon (configured)" } else { "trim-horizon (own)" };
        eprintln!(
            "multi-stream e2e: stream {role}: records {} / processed {seen} / twice {twice}",
            want.len()
        );
        assert_eq!(seen, want.len(), "stream {name}: every record processed");
    }
    assert_eq!(before_seen, 0, "a record put before the LATEST open was processed");
    assert_eq!(after_seen, l_after.len(), "a record put after the LATEST open was skipped");
    for s in [&a, &c, &l] {
        k.delete(s).await;
    }
}
