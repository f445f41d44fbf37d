//! `demo`: the quickstart fleet on any store URL, small enough to read. Several workers in this
//! process share the leases of an in-memory stream (a producer keeps writing to it) through the
//! given store; every second the distribution of leases is printed, and at the end the workers
//! leave gracefully. Against a shared store (a SQLite file, PostgreSQL, Redis) the other
//! commands can watch it from another terminal.

use shardlease::store::VersionedLease;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use shardlease::{processor_fn, Config, MemorySource, Position, Worker};

use crate::error::CliError;
use crate::output::emit;
use crate::store_url::Target;

/// Runs the demo fleet.
pub async fn run(
    target: &Target,
    workers: u64,
    shards: u64,
    seconds: u64,
    heartbeat_ms: u64,
) -> Result<ExitCode, CliError> {
    let shards = usize::try_from(shards).map_err(|_| CliError::Usage("too many shards".into()))?;
    let source = Arc::new(MemorySource::new(shards));
    let producer = {
        let source = source.clone();
        tokio::spawn(async move {
            for i in 0u64.. {
                source.put(&format!("k{i}"), format!("record {i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let processor = processor_fn(|_ctx, _batch| async move { Ok(()) });
    let mut handles = Vec::new();
    for _ in 0..workers {
        let config = Config::new(target.namespace.as_str())
            .map_err(CliError::Store)?
            .with_heartbeat(Duration::from_millis(heartbeat_ms))
            .with_initial_position(Position::TrimHorizon);
        let worker =
            Worker::builder(config, target.store.clone(), source.clone(), processor.clone())
                .build()
                .map_err(CliError::Store)?;
        handles.push(worker.start());
    }
    let ids: Vec<String> = handles.iter().map(|h| h.id().to_string()).collect();
    emit(&format!(
        "demo on {} namespace {}: {} workers ({}), {shards} shards, {seconds} s",
        target.redacted_url,
        target.namespace,
        ids.len(),
        ids.join(", ")
    ));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let mut interrupted = false;
    while tokio::time::Instant::now() < deadline {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => { interrupted = true; }
        }
        if interrupted {
            break;
        }
        let listing = target.store.list_leases().await.map_err(CliError::Store)?;
        let mut owners: BTreeMap<String, usize> = BTreeMap::new();
        for VersionedLease { lease: l, .. } in &listing.items {
            let o = l.owner.as_ref().map_or_else(|| "(unowned)".to_owned(), |o| o.to_string());
            *owners.entry(o).or_default() += 1;
        }
        let all: Vec<String> = owners.iter().map(|(o, n)| format!("{o}:{n}")).collect();
        emit(&format!("{} leases  {}", listing.items.len(), all.join("  ")));
    }
    emit("leaving gracefully (checkpointing and releasing leases) ...");
    producer.abort();
    for h in &handles {
        if let Some(e) = h.shutdown().await.record_error {
            emit(&format!("{}: its worker record could not be removed ({e})", h.id()));
        }
    }
    emit("done");
    Ok(ExitCode::SUCCESS)
}
