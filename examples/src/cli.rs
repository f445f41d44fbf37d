//! The flags the fleet examples share (`fleet`, `quickstart`): the store, the stream's shards,
//! the workers and the heartbeat, flattened into each example's arguments with
//! `#[command(flatten)]`. An example sets its own defaults with `#[command(mut_arg(...))]`.

use std::time::Duration;

/// Store, shards, workers and timing of a demo fleet.
#[derive(clap::Args, Clone, Debug)]
pub struct FleetArgs {
    /// Lease store URL (anything `shardlease::connect` accepts: `memory://`, `sqlite://`; other
    /// schemes with the examples' feature of the same name, e.g. `--features postgres`).
    #[arg(long, value_name = "URL", default_value = "memory://",
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub store: String,
    /// Shards of the in-memory stream.
    #[arg(long, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub shards: u16,
    /// Workers in this process.
    #[arg(long, value_name = "W", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=64))]
    pub workers: u8,
    /// Heartbeat interval in milliseconds, 10 to 60000; every other timing scales with it
    /// (failover 5x, balance every 2.5x, claim timeout 7.5x).
    #[arg(long = "heartbeat-ms", value_name = "MS", default_value = "200",
          value_parser = heartbeat_millis)]
    pub heartbeat: Duration,
}

/// A heartbeat from a whole number of milliseconds, 10 to 60000.
fn heartbeat_millis(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(ms) if (10..=60_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err("must be a whole number of milliseconds from 10 to 60000".to_owned()),
    }
}
