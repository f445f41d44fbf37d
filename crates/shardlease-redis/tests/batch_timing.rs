//! How long the batch writes take on the shared test server and cluster: 10,000 leases created
//! one `create_lease` after another (what `create_leases`' default body does, the Redis store's
//! before it had a batch script), then 10,000 created in batches of 100 (what shard sync sends),
//! then those updated in batches of 128 (what the runtime's takes send). Ignored: it measures, it asserts nothing of speed (figures belong in
//! the bench, and this is where the `startup` scenario's untimed creation is timed). Run with
//! `cargo test -p shardlease-redis --release --test batch_timing -- --ignored --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::RedisFactory;
use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, LeaseUpdate};
use shardlease_core::Position;
use shardlease_testkit::suite::with_scope;

const LEASES: usize = 10_000;

async fn time_batches(f: &RedisFactory, label: &str) {
    with_scope(f, "redis_batch_timing", |scope| async move {
        for round in 1..=3 {
            let leases: Vec<Lease> = (0..LEASES)
                .map(|i| Lease::new(format!("shard-{i:05}"), Position::TrimHorizon))
                .collect();
            let (ns, _) = scope.fresh_store().await;
            let store = f.open(&ns).await.unwrap();
            let start = Instant::now();
            for lease in &leases {
                store.create_lease(lease).await.unwrap();
            }
            let singly = start.elapsed().as_secs_f64();
            let (ns, _) = scope.fresh_store().await;
            let store = f.open(&ns).await.unwrap();
            let start = Instant::now();
            let mut versions = Vec::with_capacity(LEASES);
            for chunk in leases.chunks(100) {
                for outcome in store.create_leases(chunk).await.unwrap() {
                    match outcome {
                        CreateOutcome::Created(v) => versions.push(v),
                        CreateOutcome::AlreadyExists => panic!("a fresh namespace"),
                    }
                }
            }
            let created = start.elapsed().as_secs_f64();
            let updates: Vec<LeaseUpdate> = leases
                .iter()
                .zip(&versions)
                .map(|(l, v)| {
                    let mut l = l.clone();
                    l.owner = Some("w".into());
                    LeaseUpdate::new(l, *v)
                })
                .collect();
            let start = Instant::now();
            for chunk in updates.chunks(128) {
                for outcome in store.update_leases(chunk).await.unwrap() {
                    outcome.unwrap();
                }
            }
            let updated = start.elapsed().as_secs_f64();
            println!(
                "{label} round {round}: create {LEASES} singly {singly:.3} s, \
                 in batches of 100 {created:.3} s; update in batches of 128 {updated:.3} s"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn batch_timing() {
    if let Some(f) = common::factory().await {
        time_batches(&f, "redis").await;
    }
    if let Some(f) = common::cluster_factory().await {
        time_batches(&f, "cluster").await;
    }
}
