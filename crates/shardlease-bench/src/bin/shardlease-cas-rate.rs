//! `shardlease-cas-rate`: compare-and-set operations per second one client sustains on each
//! store, one JSON object per line. The bench builds every store, so one measurement serves all
//! (it replaces the per-store `cas_rate` examples).
//!
//! For each store URL: a chain of sequential `update_lease` calls on one lease (each waits for the
//! previous one: latency bound), the same spread over 32 leases in flight at once, sequential
//! `get_lease` calls, and how long listing 1024 leases takes (the balancer lists every pass).
//! Works in a fresh namespace and deletes its leases afterwards.
//!
//! ```text
//! cargo run --release -p shardlease-bench --bin shardlease-cas-rate [-- OPS [URL...]]
//! ```
//!
//! Without URLs: `sqlite::memory:` and every store named by a `SHARDLEASE_TEST_*_URL` variable
//! (`eval "$(scripts/services.sh)"`).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use shardlease::store::{CreateOutcome, Lease, LeaseStore, Version};
use shardlease::{redact_url, Error, Position, Result};

/// The variables naming test servers, measured when set.
const URL_VARS: [&str; 5] = [
    "SHARDLEASE_TEST_POSTGRES_URL",
    "SHARDLEASE_TEST_MYSQL_URL",
    "SHARDLEASE_TEST_REDIS_URL",
    "SHARDLEASE_TEST_ETCD_URL",
    "SHARDLEASE_TEST_DYNAMODB_URL",
];

/// Leases in flight at once in the parallel measurement.
const IN_FLIGHT: u64 = 32;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let ops: u64 = match args.next() {
        Some(a) => a.parse().map_err(|e| Error::Config(format!("OPS {a:?}: {e}")))?,
        None => 2_000,
    };
    let mut urls: Vec<String> = args.collect();
    if urls.is_empty() {
        urls.push("sqlite::memory:".into());
        for var in URL_VARS {
            match std::env::var(var) {
                Ok(url) if !url.is_empty() => urls.push(url),
                _ => eprintln!("{var} is not set: that store is skipped"),
            }
        }
    }
    for url in &urls {
        let namespace = format!("cas-rate-{}", std::process::id());
        let store = shardlease::connect_namespace(url, &namespace).await?;
        let print = |mut fields: Value| {
            fields["store"] = redact_url(url).into();
            println!("{fields}");
        };
        let measured = measure(&store, ops, print).await;
        let cleaned = delete_all(&*store).await;
        measured.and(cleaned)?;
    }
    Ok(())
}

/// Every measurement on `store`, each printed as it is made.
async fn measure(store: &Arc<dyn LeaseStore>, ops: u64, print: impl Fn(Value)) -> Result<()> {
    // Warm-up: a tenth of the chain.
    chain(&**store, "warm-up", ops / 10).await?;

    let started = Instant::now();
    let key = chain(&**store, "sequential", ops).await?;
    print(rate("cas_sequential", ops, started));

    let per_task = (ops / IN_FLIGHT).max(1);
    let started = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move { chain(&*store, &format!("parallel-{t}"), per_task).await })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| Error::permanent(format!("a CAS task failed: {e}")))??;
    }
    print(rate(&format!("cas_{IN_FLIGHT}_in_flight"), per_task * IN_FLIGHT, started));

    let started = Instant::now();
    for _ in 0..ops {
        store.get_lease(&key.key).await?;
    }
    print(rate("get_sequential", ops, started));

    const LEASES: usize = 1024;
    const LISTINGS: u32 = 20;
    let before = store.list_leases().await?.items.len();
    for i in before..LEASES {
        create(&**store, &format!("shardId-{i:012}")).await?;
    }
    let started = Instant::now();
    for _ in 0..LISTINGS {
        let n = store.list_leases().await?.items.len();
        if n != LEASES {
            return Err(Error::permanent(format!("listed {n} leases, expected {LEASES}")));
        }
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0 / f64::from(LISTINGS);
    print(json!({"measure": "list_leases", "leases": LEASES, "ms_per_listing": round(ms, 2)}));
    Ok(())
}

/// One measurement of `ops` operations since `started`.
fn rate(measure: &str, ops: u64, started: Instant) -> Value {
    let secs = started.elapsed().as_secs_f64();
    let per_sec = (ops as f64 / secs).round();
    json!({"measure": measure, "ops": ops, "seconds": round(secs, 3), "ops_per_sec": per_sec})
}

/// `x` rounded to `digits` decimals, for readable figures.
fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Creates `key` and returns it with its version.
async fn create(store: &dyn LeaseStore, key: &str) -> Result<(Lease, Version)> {
    let lease = Lease::new(key, Position::TrimHorizon);
    match store.create_lease(&lease).await? {
        CreateOutcome::Created(v) => Ok((lease, v)),
        CreateOutcome::AlreadyExists => Err(Error::permanent(format!("lease {key} exists"))),
    }
}

/// Creates `key`, then `ops` sequential CAS writes on it, each moving the checkpoint forward.
async fn chain(store: &dyn LeaseStore, key: &str, ops: u64) -> Result<Lease> {
    let (mut lease, mut version) = create(store, key).await?;
    for i in 1..=ops {
        lease.checkpoint = Position::sequence(i);
        version = store.update_lease(&lease, version).await?;
    }
    Ok(lease)
}

/// Deletes every lease of the namespace.
async fn delete_all(store: &dyn LeaseStore) -> Result<()> {
    for v in store.list_leases().await?.items {
        store.delete_lease(&v.lease.key, v.version).await?;
    }
    Ok(())
}
