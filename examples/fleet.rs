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
//! Each process keeps its own in-memory copy of the stream, so the demo needs no server at all:
//! what is shared is the lease table in the SQLite file. The copies agree record for record:
//! every 100 ms of wall clock each process writes one record per shard, numbered from that moment,
//! so a lease that moves between processes resumes in the new owner's copy exactly where the
//! old owner's checkpoint says.

use shardlease::VersionedLease;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardlease::{processor_fn, Config, MemorySource, Position, Worker};

const USAGE: &str = "\
usage: fleet [--store URL] [--shards N] [--workers W] [--heartbeat-ms MS]

  --store URL        lease store shared by every process   (default sqlite://fleet.db)
  --shards N         shards of the (per-process, in-memory) stream       (default 32)
  --workers W        workers in this process                              (default 1)
  --heartbeat-ms MS  heartbeat interval; other timings scale with it      (default 500)

Run it in two terminals against the same --store; stop one with Ctrl-C.";

/// How often each process writes one record to every shard.
const TICK: Duration = Duration::from_millis(100);

struct Args {
    store: String,
    shards: usize,
    workers: usize,
    heartbeat: Duration,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        store: "sqlite://fleet.db".into(),
        shards: 32,
        workers: 1,
        heartbeat: Duration::from_millis(500),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |min: u64, max: u64| -> Result<u64, String> {
            match value.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => {
                    Err(format!("{flag} must be a whole number from {min} to {max}, got {value:?}"))
                }
            }
        };
        match flag.as_str() {
            "--store" => a.store = value.clone(),
            "--shards" => a.shards = number(1, 10_000)? as usize,
            "--workers" => a.workers = number(1, 64)? as usize,
            "--heartbeat-ms" => a.heartbeat = Duration::from_millis(number(10, 60_000)?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Some(a))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fleet: {e}\n\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> shardlease::Result<()> {
    let store = shardlease::connect_namespace(&args.store, "fleet-demo").await?;
    let source = Arc::new(MemorySource::new(args.shards));
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
                let first = shardlease::FIRST_SEQUENCE + slot * shards.len() as u128;
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
    for _ in 0..args.workers {
        // The store's namespace (the URL's `?namespace=`, "default" otherwise) is where the
        // leases live; the Config must name the same one.
        let namespace = shardlease::LeaseStore::namespace(&*store)
            .map_or_else(|| shardlease::DEFAULT_NAMESPACE.to_owned(), |n| n.as_str().to_owned());
        let config = Config::new(namespace)
            .with_heartbeat(args.heartbeat)
            .with_initial_position(Position::TrimHorizon);
        let worker =
            Worker::builder(config, store.clone(), source.clone(), processor.clone()).build()?;
        handles.push(worker.start());
    }
    let mine: Vec<String> = handles.iter().map(|h| h.id().to_string()).collect();
    println!(
        "this process runs {} ({} shards); Ctrl-C to leave gracefully",
        mine.join(", "),
        args.shards
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
        h.shutdown().await?;
    }
    println!("left cleanly; the other processes take the leases within a heartbeat");
    Ok(())
}
