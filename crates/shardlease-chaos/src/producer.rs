//! The producer process of a fault run: writes records with unique ids to the stream all through
//! the run, and logs each one the stream acknowledged (its id, shard and sequence number). Those
//! are the records the checker requires the fleet to have processed.

use std::path::PathBuf;
use std::time::Duration;

use shardlease::BoxError;

use crate::events::{LineFile, Produced};

/// What the producer is told on its command line.
#[derive(clap::Args, Debug, Clone)]
pub struct ProducerArgs {
    /// Kinesis stream name.
    #[arg(long)]
    pub stream: String,
    /// Kinesis endpoint (the emulator).
    #[arg(long)]
    pub endpoint: String,
    /// Prefix of the record ids (unique per run).
    #[arg(long)]
    pub prefix: String,
    /// Output file of the acknowledged records.
    #[arg(long)]
    pub out: PathBuf,
    /// Records per second.
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
}

/// Writes records until SIGTERM or SIGINT.
pub async fn run(args: ProducerArgs) -> Result<(), BoxError> {
    let client = crate::kinesis::client(&args.endpoint);
    let mut out = LineFile::open(&args.out)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let period = Duration::from_micros(1_000_000 / u64::from(args.rate.max(1)));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {}
        }
        let id = format!("{}-{n}", args.prefix);
        n += 1;
        // A put whose answer is lost may still have landed: such a record is not required,
        // and if the fleet processes it, it counts as an unknown extra, not a loss.
        match crate::kinesis::put(&client, &args.stream, &id).await {
            Ok((shard, seq)) => {
                out.push(&Produced { id, shard, seq })?;
                out.sync()?;
            }
            Err(e) => tracing::warn!(error = %e, "put failed"),
        }
    }
    out.sync()?;
    Ok(())
}
