//! Compare-and-set operations per second that one worker sustains on each SQL dialect.
//!
//! Sequential `update_lease` calls (each a single conditional `UPDATE`) on one lease, from one
//! task, after a short warm-up; prints one line per store. No server needed for SQLite; PostgreSQL
//! and MySQL/MariaDB are measured when `SHARDLEASE_TEST_POSTGRES_URL` / `SHARDLEASE_TEST_MYSQL_URL`
//! are set (`eval "$(scripts/services.sh)"`).
//!
//! ```text
//! cargo run --release -p shardlease-sql --example cas_rate [-- OPS [URL...]]
//! ```

use std::time::Instant;

use shardlease_core::{Lease, LeaseStore, Position, Result};
use shardlease_sql::{redact_url, SqlStore};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let ops: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let mut urls: Vec<String> = args.collect();
    // The SQLite file's directory, removed with everything in it when `main` returns.
    let tmp = tempfile::tempdir().map_err(|e| {
        shardlease_core::Error::InvalidInput(format!("no temporary directory: {e}"))
    })?;
    if urls.is_empty() {
        urls.push("sqlite::memory:".into());
        urls.push(format!("sqlite://{}", tmp.path().join("cas-rate.db").display()));
        for var in ["SHARDLEASE_TEST_POSTGRES_URL", "SHARDLEASE_TEST_MYSQL_URL"] {
            match std::env::var(var) {
                Ok(url) if !url.is_empty() => urls.push(url),
                _ => println!("{var} is not set: that dialect is skipped"),
            }
        }
    }
    for url in &urls {
        let namespace = format!("cas-rate-{}", std::process::id());
        let store = SqlStore::connect(url, &namespace).await?;
        let (cas, get) = measure(&store, ops).await?;
        println!(
            "{:<8} {:<60} {ops} CAS: {cas:>7.0} ops/s   {ops} get: {get:>7.0} ops/s",
            store.dialect().name(),
            redact_url(url)
        );
        store.delete_namespace().await?;
    }
    Ok(())
}

/// (CAS updates per second, reads per second) over `ops` sequential calls each.
async fn measure(store: &SqlStore, ops: u64) -> Result<(f64, f64)> {
    let mut lease = Lease::new("shardId-000000000000", Position::TrimHorizon);
    let mut version = match store.create_lease(&lease).await? {
        shardlease_core::CreateOutcome::Created(v) => v,
        shardlease_core::CreateOutcome::AlreadyExists => {
            return Err(shardlease_core::Error::InvalidInput("the lease already exists".into()))
        }
    };
    let mut seq = 0u64;
    let mut step = |lease: &mut Lease| {
        seq += 1;
        lease.checkpoint = Position::sequence(seq);
    };
    for _ in 0..ops / 10 {
        step(&mut lease);
        version = store.update_lease(&lease, version).await?;
    }
    let started = Instant::now();
    for _ in 0..ops {
        step(&mut lease);
        version = store.update_lease(&lease, version).await?;
    }
    let cas = ops as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..ops {
        store.get_lease(&lease.key).await?;
    }
    let get = ops as f64 / started.elapsed().as_secs_f64();
    Ok((cas, get))
}
