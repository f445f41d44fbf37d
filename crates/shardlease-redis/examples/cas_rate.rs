//! Measures compare-and-set operations per second on Redis from one client: a chain of
//! sequential `update_lease` calls on one lease (each waits for the previous one: latency bound),
//! then the same spread over 32 leases in flight at once on the same multiplexed connection.
//!
//! ```text
//! cargo run --release -p shardlease-redis --example cas_rate -- [redis://127.0.0.1:6379/] [ops]
//! ```
//!
//! The URL defaults to `SHARDLEASE_TEST_REDIS_URL`, then `redis://127.0.0.1:6379/`. Works in a
//! fresh namespace and deletes it afterwards. Prints one JSON line per measurement.

use std::time::Instant;

use serde_json::{json, Value};
use shardlease_core::{CreateOutcome, Lease, LeaseStore, Position, Version};
use shardlease_redis::RedisStore;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Prints one measurement as a JSON line, tagged with the store.
fn print_line(mut fields: Value) {
    fields["store"] = "redis".into();
    println!("{fields}");
}

/// `x` rounded to `digits` decimals, for readable figures.
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Creates `key` and returns its version.
async fn create(store: &RedisStore, key: &str) -> BoxResult<(Lease, Version)> {
    let lease = Lease::new(key, Position::TrimHorizon);
    match store.create_lease(&lease).await? {
        CreateOutcome::Created(v) => Ok((lease, v)),
        CreateOutcome::AlreadyExists => Err(format!("lease {key} already exists").into()),
    }
}

/// `ops` sequential CAS writes on one lease, each moving the checkpoint forward.
async fn chain(store: &RedisStore, key: &str, ops: u64) -> BoxResult<()> {
    let (mut lease, mut version) = create(store, key).await?;
    for i in 1..=ops {
        lease.checkpoint = Position::sequence(i);
        version = store.update_lease(&lease, version).await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> BoxResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .or_else(|| std::env::var("SHARDLEASE_TEST_REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let ops: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5_000);
    let namespace = format!("cas-rate-{}", std::process::id());
    let store = RedisStore::builder(&url)
        .namespace(&namespace)
        .key_prefix("shardlease-bench")
        .connect()
        .await?;

    let started = Instant::now();
    let outcome = chain(&store, "sequential", ops).await;
    let secs = started.elapsed().as_secs_f64();
    if let Err(e) = outcome {
        store.delete_namespace().await?;
        return Err(e);
    }
    let rate = ops as f64 / secs;
    let fields = json!({"measure": "cas_sequential", "ops": ops, "seconds": round(secs, 3), "ops_per_sec": rate.round()});
    print_line(fields);

    const IN_FLIGHT: u64 = 32;
    let per_task = (ops / IN_FLIGHT).max(1);
    let started = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                chain(&store, &format!("parallel-{t}"), per_task).await.map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut failure = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if let Some(e) = failure {
        store.delete_namespace().await?;
        return Err(e.into());
    }
    let total = per_task * IN_FLIGHT;
    let measure = format!("cas_{IN_FLIGHT}_in_flight");
    let rate = total as f64 / secs;
    print_line(
        json!({"measure": measure, "ops": total, "seconds": round(secs, 3), "ops_per_sec": rate.round()}),
    );

    let listed = list_rate(&store).await;
    store.delete_namespace().await?;
    listed
}

/// How long listing 1024 leases takes (the balancer lists every pass).
async fn list_rate(store: &RedisStore) -> BoxResult<()> {
    const LEASES: usize = 1024;
    const LISTINGS: u32 = 20;
    let before = store.list_leases().await?.items.len();
    for i in before..LEASES {
        create(store, &format!("shardId-{i:012}")).await?;
    }
    let started = Instant::now();
    for _ in 0..LISTINGS {
        let n = store.list_leases().await?.items.len();
        if n != LEASES {
            return Err(format!("listed {n} leases, expected {LEASES}").into());
        }
    }
    let per = started.elapsed().as_secs_f64() / f64::from(LISTINGS);
    let ms = per * 1000.0;
    print_line(json!({"measure": "list_leases", "leases": LEASES, "ms_per_listing": round(ms, 2)}));
    Ok(())
}
