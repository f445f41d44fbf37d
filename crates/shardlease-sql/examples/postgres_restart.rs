//! A PostgreSQL restart while workers run: they keep going once it is back, and no checkpoint is
//! lost or moves backwards. Run it through `scripts/check-postgres-restart.sh`, which stops and
//! starts the local server; it is not part of the test suite because it restarts a server other
//! tests share.
//!
//! What it does: three workers (heartbeat 1 s, failover 5 s) consume 16 in-memory shards while a
//! producer writes records, with checkpoints in PostgreSQL. A monitor with its own connection
//! lists the leases every 100 ms and records the furthest checkpoint seen per lease. After a
//! warm-up it runs `SHARDLEASE_PG_STOP`, waits `SHARDLEASE_PG_OUTAGE_SECS` (default 3), runs
//! `SHARDLEASE_PG_START`, lets the workers run on, then stops producing and drains. It passes
//! when: no checkpoint the monitor saw ever moved backwards; every lease's final checkpoint is at
//! or past where it was when the server stopped; checkpoints moved on after the restart; every
//! produced record was processed; every lease is owned again and shares are even.
//!
//! ```text
//! SHARDLEASE_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! SHARDLEASE_PG_STOP='pg_ctlcluster --skip-systemctl-redirect 15 main stop' \
//! SHARDLEASE_PG_START='pg_ctlcluster --skip-systemctl-redirect 15 main start' \
//! cargo run -p shardlease-sql --example postgres_restart
//! ```
//!
//! Without `SHARDLEASE_TEST_POSTGRES_URL` it says it is skipped; without the two commands it runs
//! the same workload with no restart.

use shardlease_core::store::VersionedLease;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardlease_core::store::LeaseStore;
use shardlease_core::{Config, Error, LeaseKey, MemorySource, Position, Result, ShardSource};
use shardlease_sql::SqlStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::fresh_namespace;
use shardlease_testkit::recorder::Recorder;
use tokio_util::sync::CancellationToken;

const SHARDS: usize = 16;
const WORKERS: usize = 3;
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The furthest checkpoint seen per lease, and every backwards move seen.
#[derive(Default)]
struct Watch {
    best: BTreeMap<LeaseKey, Position>,
    regressions: Vec<String>,
    polls_ok: u64,
    polls_failed: u64,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn run_command(what: &str, command: &str) -> std::result::Result<(), String> {
    println!("{what}: {command}");
    let status = std::process::Command::new("sh")
        .args(["-c", command])
        .status()
        .map_err(|e| format!("{what}: cannot run: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what}: exited with {status}"))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "error,shardlease_core=warn".into()),
        )
        .try_init();
    let Some(url) = env("SHARDLEASE_TEST_POSTGRES_URL") else {
        println!("postgres_restart: SKIPPED because SHARDLEASE_TEST_POSTGRES_URL is not set");
        return ExitCode::SUCCESS;
    };
    match run(&url).await {
        Ok(failures) if failures.is_empty() => {
            println!("RESULT: PASS");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            for f in failures {
                println!("FAILED: {f}");
            }
            println!("RESULT: FAIL");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("RESULT: FAIL ({e})");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<Vec<String>> {
    let restart = match (env("SHARDLEASE_PG_STOP"), env("SHARDLEASE_PG_START")) {
        (Some(stop), Some(start)) => Some((stop, start)),
        _ => {
            println!("SHARDLEASE_PG_STOP / SHARDLEASE_PG_START not set: running without a restart");
            None
        }
    };
    let outage = Duration::from_secs(
        env("SHARDLEASE_PG_OUTAGE_SECS").and_then(|s| s.parse().ok()).unwrap_or(3),
    );
    let ns = fresh_namespace("pg-restart");
    let store = SqlStore::builder().url(url).namespace(&ns).connect().await?;
    let observer = SqlStore::builder().url(url).namespace(&ns).connect().await?;

    let source = MemorySource::new(SHARDS);
    let recorder = Recorder::new();
    let config = Config::new(ns.as_str())?
        .with_heartbeat(HEARTBEAT)
        .with_initial_position(Position::TrimHorizon)
        .with_idle_poll_interval(Duration::from_millis(50));
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(Arc::new(store.clone()), src, recorder.factory(), config);
    cluster.sync_shards().await?;
    cluster.start_workers(WORKERS)?;

    let stop = CancellationToken::new();
    let producing = CancellationToken::new();
    let producer = {
        let (source, producing) = (source.clone(), producing.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !producing.is_cancelled() {
                for _ in 0..8 {
                    i += 1;
                    source.put(&format!("key-{}", i % 101), format!("record {i}"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let watch = Arc::new(Mutex::new(Watch::default()));
    let monitor = {
        let (watch, stop, observer) = (watch.clone(), stop.clone(), observer.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let listed =
                    tokio::time::timeout(Duration::from_secs(2), observer.list_leases()).await;
                {
                    let mut w = watch.lock().unwrap_or_else(|p| p.into_inner());
                    match listed {
                        Ok(Ok(listing)) => {
                            w.polls_ok += 1;
                            for VersionedLease { lease, .. } in listing.items {
                                let prev = w.best.get(&lease.key).cloned();
                                match prev {
                                    Some(p) if p.would_regress_to(&lease.checkpoint) => {
                                        let m = format!(
                                            "{} moved backwards: {p} -> {}",
                                            lease.key, lease.checkpoint
                                        );
                                        w.regressions.push(m);
                                    }
                                    _ => {
                                        w.best.insert(lease.key.clone(), lease.checkpoint.clone());
                                    }
                                }
                            }
                        }
                        _ => w.polls_failed += 1,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let mut failures = Vec::new();
    let started = Instant::now();
    if let Err(e) = cluster.wait_balanced(Duration::from_secs(30), Duration::from_millis(50)).await
    {
        failures.push(format!("before the restart: {e}"));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let processed_before = recorder.distinct();
    let mut at_stop = BTreeMap::new();
    if let Some((stop_cmd, start_cmd)) = &restart {
        at_stop = watch.lock().unwrap_or_else(|p| p.into_inner()).best.clone();
        if let Err(e) = run_command("stopping PostgreSQL", stop_cmd) {
            failures.push(e);
        }
        tokio::time::sleep(outage).await;
        if let Err(e) = run_command("starting PostgreSQL", start_cmd) {
            failures.push(e);
        }
        let back = Instant::now();
        let probe = observer.clone();
        let up =
            wait_until("PostgreSQL answering again", Duration::from_secs(60), HEARTBEAT, || {
                let probe = probe.clone();
                async move { probe.list_leases().await.is_ok() }
            })
            .await;
        if let Err(e) = up {
            failures.push(e);
        }
        println!("PostgreSQL answering again {:.1} s after the start command", secs(back));
    }
    let back_at = Instant::now();
    let balanced = cluster.wait_balanced(Duration::from_secs(60), Duration::from_millis(100)).await;
    match &balanced {
        Ok(c) => println!(
            "after the restart: every lease owned and balanced {:.1} s after the server was back \
             ({:?})",
            secs(back_at),
            c.shares
        ),
        Err(e) => failures.push(format!("after the restart: {e}")),
    }
    // Run on for a while, and still be balanced at the end.
    tokio::time::sleep(Duration::from_secs(5)).await;
    if let Err(e) = cluster.wait_balanced(Duration::from_secs(30), Duration::from_millis(100)).await
    {
        failures.push(format!("at the end: {e}"));
    }
    let processed_after_restart = recorder.distinct().saturating_sub(processed_before);
    producing.cancel();
    let _ = producer.await;
    let produced = source.produced();
    let rec = recorder.clone();
    let drained = wait_until(
        "every produced record processed",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let rec = rec.clone();
            async move { rec.distinct() as u64 >= produced }
        },
    )
    .await;
    if let Err(e) = drained {
        failures.push(format!("{e} ({} of {produced})", recorder.distinct()));
    }
    let missing = recorder.missing(&source);
    if !missing.is_empty() {
        failures.push(format!(
            "{} records never processed, e.g. {:?}",
            missing.len(),
            &missing[..1]
        ));
    }
    // Let the monitor see the final checkpoints, then stop it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let _ = monitor.await;

    let final_leases = observer.list_leases().await?;
    let mut advanced = 0;
    for VersionedLease { lease, .. } in &final_leases.items {
        if let Some(before) = at_stop.get(&lease.key) {
            if before.would_regress_to(&lease.checkpoint) {
                failures.push(format!(
                    "{}: checkpoint {} is behind {before}, where it was when the server stopped",
                    lease.key, lease.checkpoint
                ));
            } else if &lease.checkpoint != before {
                advanced += 1;
            }
        }
    }
    if restart.is_some() && advanced == 0 {
        failures.push("no checkpoint moved on after the restart".into());
    }
    let (regressions, polls_ok, polls_failed) = {
        let w = watch.lock().unwrap_or_else(|p| p.into_inner());
        (w.regressions.clone(), w.polls_ok, w.polls_failed)
    };
    failures.extend(regressions);
    let mut stats = Vec::new();
    for id in cluster.running() {
        if let Some(h) = cluster.handle(&id) {
            let s = h.stats();
            stats.push(format!(
                "{id}: fenced {} lost {} taken {} handoffs {} heartbeats {}",
                s.fenced, s.lost, s.taken, s.handoffs, s.heartbeats
            ));
        }
    }
    cluster.shutdown_all().await;
    observer.delete_namespace().await?;

    println!(
        "outage {}s; produced {produced}, processed {} distinct ({} after the restart), {} \
         processed twice (at-least-once: a batch whose checkpoint failed is processed again)",
        if restart.is_some() { outage.as_secs() } else { 0 },
        recorder.distinct(),
        processed_after_restart,
        recorder.duplicates()
    );
    println!(
        "monitor: {polls_ok} listings, {polls_failed} failed (server down); {advanced} of \
         {SHARDS} checkpoints moved on after the restart; {} corrupt",
        final_leases.corrupt.len()
    );
    for s in stats {
        println!("  {s}");
    }
    println!("ran {:.1} s", secs(started));
    if !final_leases.corrupt.is_empty() {
        return Err(Error::InvalidInput(format!("corrupt leases: {:?}", final_leases.corrupt)));
    }
    Ok(failures)
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}
