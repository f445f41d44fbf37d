//! A long-running fleet member: run it in several terminals against one store and watch the
//! leases split between the processes, then stop one (Ctrl-C: a graceful leave) and watch the
//! others take its leases within a heartbeat.
//!
//! ```sh
//! # terminal 1                                   # terminal 2
//! cargo run --release --example fleet -- \        cargo run --release --example fleet -- \
//!   --store sqlite://fleet.db                       --store sqlite://fleet.db
//! ```
//!
//! The leases live in namespace `fleet-demo` (unless the URL names another with `?namespace=`);
//! the `shardlease` CLI shows them live, from a third terminal:
//!
//! ```sh
//! cargo run -p shardlease-cli -- --store sqlite://fleet.db --namespace fleet-demo watch
//! ```
//!
//! Each process keeps its own in-memory copy of the stream, so the demo needs no server at all:
//! what is shared is the lease table in the SQLite file. The copies agree record for record:
//! every 100 ms of wall clock each process writes one record per shard, numbered from that moment,
//! so a lease that moves between processes resumes in the new owner's copy exactly where the
//! old owner's checkpoint says.

use shardlease::store::VersionedLease;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use shardlease::{processor_fn, Config, MemorySource, Position, Worker};
use shardlease_examples::cli::FleetArgs;

/// How often each process writes one record to every shard.
const TICK: Duration = Duration::from_millis(100);

/// A long-running fleet member: run it in two terminals against the same --store; stop one with
/// Ctrl-C.
#[derive(Parser, Debug)]
#[command(
    name = "fleet",
    mut_arg("store", |a| a.default_value("sqlite://fleet.db")
        .help("Lease store shared by every process")),
    mut_arg("heartbeat", |a| a.default_value("500")),
)]
struct Args {
    #[command(flatten)]
    fleet: FleetArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // `--help` prints and exits 0; a bad flag prints the mistake and exits 2.
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> shardlease::Result<()> {
    let store = shardlease::connect_namespace(&args.fleet.store, "fleet-demo").await?;
    let source = Arc::new(MemorySource::new(usize::from(args.fleet.shards)));
    let producer = {
        let source = source.clone();
        let shards: Vec<_> = source.shards().into_iter().map(|s| s.id).collect();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut last_slot = 0;
            loop {
                tick.tick().await;
                // The same tick gives every process the same sequence numbers.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let slot = now.as_millis() / TICK.as_millis();
                if slot <= last_slot {
                    continue;
                }
                last_slot = slot;
                let first = MemorySource::FIRST_SEQUENCE + slot * shards.len() as u128;
                for (i, shard) in shards.iter().enumerate() {
                    source.advance_sequence_to(first + i as u128);
                    if source.put_to_shard(shard, format!("{shard} at slot {slot}")).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let processor = processor_fn(|_ctx, _batch| async move { Ok(()) });
    let mut handles = Vec::new();
    for _ in 0..args.fleet.workers {
        // The store's namespace (the URL's `?namespace=`, "default" otherwise) is where the
        // leases live; the Config must name the same one.
        let namespace = shardlease::store::LeaseStore::namespace(&*store).unwrap_or_default();
        let config = Config::new(namespace)?
            .with_heartbeat(args.fleet.heartbeat)
            .with_initial_position(Position::TrimHorizon);
        let worker =
            Worker::builder(config, store.clone(), source.clone(), processor.clone()).build()?;
        handles.push(worker.start());
    }
    let mine: Vec<String> = handles.iter().map(|h| h.id().to_string()).collect();
    println!(
        "this process runs {} ({} shards); Ctrl-C to leave gracefully",
        mine.join(", "),
        args.fleet.shards
    );
    // How to see the fleet from outside: the CLI reads one namespace, this one.
    let namespace = shardlease::store::LeaseStore::namespace(&*store).unwrap_or_default();
    println!(
        "watch it: cargo run -p shardlease-cli -- --store '{}' --namespace {namespace} watch",
        shardlease::redact_url(&args.fleet.store)
    );
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        let leases = store.list_leases().await?.items;
        let mut owners: BTreeMap<String, usize> = BTreeMap::new();
        for VersionedLease { lease: l, .. } in &leases {
            let o = l.owner.as_ref().map_or_else(|| "(unowned)".to_owned(), |o| o.to_string());
            *owners.entry(o).or_default() += 1;
        }
        let here: usize = handles.iter().map(|h| h.held_leases().len()).sum();
        let all: Vec<String> = owners.iter().map(|(o, n)| format!("{o}:{n}")).collect();
        println!("held here: {here:>4} of {:<5} owners: {}", leases.len(), all.join(" "));
    }
    println!("leaving: checkpointing and releasing leases ...");
    producer.abort();
    for h in &handles {
        if let Some(e) = h.shutdown().await.record_error {
            eprintln!("the worker record could not be removed ({e}): peers take over after the failover timeout");
        }
    }
    println!("left cleanly; the other processes take the leases within a heartbeat");
    Ok(())
}
