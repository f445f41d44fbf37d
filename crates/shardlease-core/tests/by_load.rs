//! Balancing by load on a running fleet: one hot shard carries ten times another's records, and
//! the worker that runs it ends up with few other leases, while by count each holds half; then
//! the leases stay put (no move in a minute of steady load).
//!
//! Time is paused: the processor "works" by sleeping 2.5 ms per record, which the runtime measures
//! as busy time like any other, so the loads and the bounds are virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    processor_fn, Balance, Config, LeaseKey, LoadBalance, MemorySource, Position, ShardSource,
    Worker, WorkerHandle,
};
use shardlease_testkit::cluster::wait_until;

const SHARDS: usize = 8;

/// Balancing by load with a core per lease: the processors sleep, so they never wait for one
/// another, and each batch's busy time is its wall time on any machine.
fn by_load() -> Balance {
    Balance::ByLoad(LoadBalance::default().with_cores(SHARDS))
}
const HB: Duration = Duration::from_secs(1);

fn start(
    store: &Arc<dyn LeaseStore>,
    source: &MemorySource,
    id: &str,
    balance: Balance,
) -> WorkerHandle {
    let cfg = Config::new("load")
        .unwrap()
        .with_heartbeat(HB)
        .with_worker_id(id)
        .with_initial_position(Position::TrimHorizon)
        .with_balance(balance)
        .with_rng_seed(11);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let factory = processor_fn(|_ctx, batch| async move {
        tokio::time::sleep(Duration::from_micros(2500) * batch.records.len() as u32).await;
        Ok(())
    });
    Worker::builder(cfg, store.clone(), src, factory).build().unwrap().start()
}

/// Workers "a" and "b", balancing by load, started together; returns once they run every shard.
async fn start_pair(
    store: &Arc<dyn LeaseStore>,
    source: &MemorySource,
) -> (WorkerHandle, WorkerHandle) {
    let a = start(store, source, "a", by_load());
    let b = start(store, source, "b", by_load());
    wait_until("both run shards", HB * 10, Duration::from_millis(100), || async {
        a.held_leases().len() + b.held_leases().len() == SHARDS
    })
    .await
    .unwrap();
    (a, b)
}

/// Every 250 ms: 40 records on the hot shard, 4 on each other (160/s against 16/s), each count
/// drawn within ±20% with `noise`.
fn produce(source: &MemorySource, hot: &LeaseKey, noise: bool) -> tokio::task::JoinHandle<()> {
    let (source, hot) = (source.clone(), hot.clone());
    tokio::spawn(async move {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let keys: Vec<LeaseKey> = source.shards().into_iter().map(|s| s.id).collect();
        loop {
            for k in &keys {
                let base: f64 = if *k == hot { 40.0 } else { 4.0 };
                let factor: f64 = if noise { rng.random_range(0.8..1.2) } else { 1.0 };
                let n = (base * factor).round() as usize;
                for _ in 0..n {
                    source.put_to_shard(k, "x").unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// (leases of the worker running the hot shard, leases of the other) once both run all shards.
async fn settle(balance: Balance, noise: bool) -> (usize, usize, u64) {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("load".parse().unwrap()));
    let source = MemorySource::new(SHARDS);
    let hot = source.shards()[0].id.clone();
    let producer = produce(&source, &hot, noise);
    let a = start(&base, &source, "a", balance.clone());
    let every = Duration::from_millis(100);
    wait_until("a runs every shard", HB * 10, every, || async { a.held_leases().len() == SHARDS })
        .await
        .unwrap();
    let b = start(&base, &source, "b", balance);
    // Two minutes of virtual time: count balancing settles at once, load balancing within a few
    // balance intervals of the loads being measured.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let moves_before = a.stats().handoffs + b.stats().handoffs;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let moves_after = a.stats().handoffs + b.stats().handoffs;
    let (hot_holder, other) = if a.held_leases().contains(&hot) { (&a, &b) } else { (&b, &a) };
    let held = (hot_holder.held_leases().len(), other.held_leases().len());
    assert_eq!(held.0 + held.1, SHARDS, "every shard runs");
    producer.abort();
    a.shutdown().await;
    b.shutdown().await;
    (held.0, held.1, moves_after - moves_before)
}

#[tokio::test(start_paused = true)]
async fn the_worker_with_the_hot_shard_gives_away_its_light_leases() {
    let (hot, other, _) = settle(Balance::ByCount, false).await;
    assert_eq!((hot, other), (4, 4), "by count each holds half");
    for noise in [false, true] {
        let (hot, other, moves) = settle(by_load(), noise).await;
        println!(
            "by load (noise {noise}): the hot shard's worker holds {hot}, the other {other}; \
             {moves} moves in the last minute"
        );
        assert!(hot <= 2 && other >= 6, "by load: {hot} and {other}");
        assert_eq!(moves, 0, "steady load (noise {noise}): no move in a minute");
    }
}

/// A fleet whose workers balance by different modes is a misconfiguration the two rules would
/// fight over: each worker says so once per peer, in a WARN naming the peer.
#[tokio::test(start_paused = true)]
async fn a_worker_warns_of_a_peer_balancing_by_another_mode() {
    let (logs, _guard) = shardlease_testkit::logs::capture();
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("load".parse().unwrap()));
    let source = MemorySource::new(SHARDS);
    let a = start(&base, &source, "a", Balance::ByCount);
    let b = start(&base, &source, "b", by_load());
    let c = start(&base, &source, "c", by_load());
    let warned = |peer: &str, mine: &str| {
        logs.text().lines().any(|l| {
            l.contains("a peer balances by another mode")
                && l.contains(&format!("peer={peer}"))
                && l.contains(&format!("mine=\"{mine}\""))
        })
    };
    wait_until("both sides warned", HB * 10, Duration::from_millis(100), || async {
        warned("b", "by count") && warned("c", "by count") && warned("a", "by load")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}:\n{}", logs.text()));
    // Once per peer and process, however many heartbeats follow; never between b and c.
    tokio::time::sleep(HB * 5).await;
    let text = logs.text();
    let count = text.lines().filter(|l| l.contains("a peer balances by another mode")).count();
    assert_eq!(count, 4, "a warns of b and c, b and c of a:\n{text}");
    for w in [a, b, c] {
        w.shutdown().await;
    }
}

/// A fleet that starts together balances by load as soon as the loads are measured. The leases
/// of its first pass were taken while free with no figure seen, so they do not cool: cooling
/// them (a cooldown is six balance intervals) held every load move off for the whole cooldown.
#[tokio::test(start_paused = true)]
async fn a_fleet_starting_together_moves_by_load_before_a_cooldown_has_passed() {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("load".parse().unwrap()));
    let source = MemorySource::new(SHARDS);
    let hot = source.shards()[0].id.clone();
    let producer = produce(&source, &hot, false);
    let (a, b) = start_pair(&base, &source).await;
    let every = Duration::from_millis(100);
    let started = tokio::time::Instant::now();
    let cooldown = Config::new("load").unwrap().with_heartbeat(HB).balance_interval() * 6;
    let balanced =
        wait_until("the hot shard's worker holds at most 2", cooldown, every, || async {
            let holder = if a.held_leases().contains(&hot) { &a } else { &b };
            holder.held_leases().len() <= 2
        })
        .await;
    println!("balanced by load {:?} after coverage", started.elapsed());
    producer.abort();
    a.shutdown().await;
    b.shutdown().await;
    balanced.unwrap();
}

/// A fleet starting on a backlog: half the shards hold half a minute of records, every shard
/// then gets the same rate. The leases with the backlog spend their first second catching up at
/// a whole core each, which says nothing of their steady load; counted as their load, their
/// worker looked overloaded and gave leases away, and took them back once caught up. The load
/// figure starts afresh once a lease reaches the tip of its shard, and a worker sits out load
/// moves while the leases it took have been measured for less than the smoothing time.
#[tokio::test(start_paused = true)]
async fn a_fleet_starting_on_a_backlog_does_not_move_leases_for_its_catch_up() {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("load".parse().unwrap()));
    let source = MemorySource::new(SHARDS);
    let keys: Vec<LeaseKey> = source.shards().into_iter().map(|s| s.id).collect();
    for k in &keys[..SHARDS / 2] {
        for _ in 0..480 {
            source.put_to_shard(k, "x").unwrap();
        }
    }
    let producer = {
        let (source, keys) = (source.clone(), keys.clone());
        tokio::spawn(async move {
            loop {
                for k in &keys {
                    for _ in 0..4 {
                        source.put_to_shard(k, "x").unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let (a, b) = start_pair(&base, &source).await;
    let held = (a.held_leases().len(), b.held_leases().len());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let moves = a.stats().handoffs + b.stats().handoffs;
    let after = (a.held_leases().len(), b.held_leases().len());
    producer.abort();
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(after.0 + after.1, SHARDS, "every shard runs");
    assert_eq!((moves, after), (0, held), "equal loads: no lease moves for the catch-up");
}
