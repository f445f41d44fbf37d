//! How long listing 10,000 leases takes on the shared test server and cluster, next to the takes
//! that follow a listing at start-up (`update_leases` in chunks of 128, with the server's own time
//! in the scripts from `INFO commandstats`, shared with other clients of the server). Ignored: it
//! measures, it asserts nothing of speed (figures belong in the bench). Run with
//! `cargo test -p shardlease-redis --release --test list_timing -- --ignored --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::RedisFactory;
use shardlease_core::store::{Lease, LeaseStore, LeaseUpdate};
use shardlease_core::{Epoch, Position};
use shardlease_testkit::suite::with_scope;

const LEASES: usize = 10_000;

/// Microseconds the server spent in `EVALSHA` so far (0 when `INFO` is not answered, as on a
/// cluster connection routed to another node).
async fn script_usec(conn: &mut shardlease_redis::RedisConnection) -> u64 {
    let info: String =
        redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|u| u.parse().ok())
        .unwrap_or(0)
}

async fn time_listing(f: &RedisFactory, label: &str) {
    with_scope(f, "redis_list_timing", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let leases: Vec<Lease> = (0..LEASES)
            .map(|i| {
                let mut l = Lease::new(format!("stream/shardId-{i:012}"), Position::TrimHorizon);
                l.attributes.insert("hash_range".into(), format!("{i}-{}", i + 1));
                l
            })
            .collect();
        for chunk in leases.chunks(100) {
            store.create_leases(chunk).await.unwrap();
        }
        let mut conn = store.connection();
        for round in 1..=5 {
            let start = Instant::now();
            let listing = store.list_leases().await.unwrap();
            let listed = start.elapsed().as_secs_f64();
            assert_eq!(listing.items.len(), LEASES);
            let updates: Vec<LeaseUpdate> = listing
                .items
                .iter()
                .map(|v| {
                    let mut l = v.lease.clone();
                    l.owner = Some(format!("w{round}").as_str().into());
                    l.epoch = Epoch(l.epoch.0 + 1);
                    LeaseUpdate::new(l, v.version)
                })
                .collect();
            let before = script_usec(&mut conn).await;
            let start = Instant::now();
            for chunk in updates.chunks(128) {
                for outcome in store.update_leases(chunk).await.unwrap() {
                    outcome.unwrap();
                }
            }
            let updated = start.elapsed().as_secs_f64();
            let server = script_usec(&mut conn).await.saturating_sub(before) as f64 / 1e6;
            println!(
                "{label} round {round}: list_leases {listed:.3} s; takes in chunks of 128 \
                 {updated:.3} s, of which the server ran scripts {server:.3} s"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn list_timing() {
    if let Some(f) = common::factory().await {
        time_listing(&f, "redis").await;
    }
    if let Some(f) = common::cluster_factory().await {
        time_listing(&f, "cluster").await;
    }
}
