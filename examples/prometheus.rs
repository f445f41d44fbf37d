//! Metrics for Prometheus: a small fleet on the in-memory store and stream, with the
//! `metrics-exporter-prometheus` recorder serving `/metrics` on 127.0.0.1.
//!
//! ```text
//! cargo run --example prometheus --features prometheus -- --port 9898
//! curl -s http://127.0.0.1:9898/metrics | grep millis_behind_latest
//! ```
//!
//! Every series carries `namespace` and `worker`, the per-lease ones `shard` too; the store's
//! calls are timed by operation (docs/operations.md, "Metrics", lists them all and what to alert
//! on). It runs until Ctrl-C, then shuts the workers down gracefully.

use std::process::ExitCode;
use std::time::Duration;

use shardlease_examples::prometheus::{install_exporter, Fleet, FleetOptions};
use tracing_subscriber::EnvFilter;

const USAGE: &str = "\
usage: prometheus [--port PORT] [--shards N] [--workers W]

Serves the metrics of a small in-memory fleet at http://127.0.0.1:PORT/metrics until Ctrl-C.

options:
  --port PORT     port on 127.0.0.1; 0 picks a free one and prints it   (default 9898)
  --shards N      shards in the in-memory stream, 1..=1000               (default 4)
  --workers W     workers in this process, 1..=16                        (default 2)
  -h, --help      print this help

Logs go to stderr, filtered by RUST_LOG (default: warn).";

fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    flag: &str,
    value: Option<String>,
    min: T,
    max: T,
) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    match value.parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(format!("{flag} must be a whole number from {min} to {max}, got {value:?}")),
    }
}

/// The port and the fleet's shape, or `None` for `--help`.
fn parse_args(
    args: impl IntoIterator<Item = String>,
) -> Result<Option<(u16, FleetOptions)>, String> {
    let mut port = 9898;
    let mut options = FleetOptions::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--port" => port = number("--port", it.next(), 0, u16::MAX)?,
            "--shards" => options.shards = number("--shards", it.next(), 1, 1000)?,
            "--workers" => options.workers = number("--workers", it.next(), 1, 16)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some((port, options)))
}

#[tokio::main]
async fn main() -> ExitCode {
    let (port, options) = match parse_args(std::env::args().skip(1)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("prometheus: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    // The recorder first, so the workers' metrics go to it from their first heartbeat.
    let addr = match install_exporter(port) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("prometheus: {e}");
            return ExitCode::FAILURE;
        }
    };
    let fleet = match Fleet::start("prometheus", &options).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("prometheus: starting the fleet failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("serving metrics at http://{addr}/metrics (Ctrl-C stops)");
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = every.tick() => println!(
                "processed {} of {} records",
                fleet.log.distinct(),
                fleet.source.produced()
            ),
            r = tokio::signal::ctrl_c() => {
                if let Err(e) = r {
                    eprintln!("prometheus: waiting for Ctrl-C failed: {e}");
                }
                break;
            }
        }
    }
    match fleet.shutdown().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("prometheus: shutting down failed: {e}");
            ExitCode::FAILURE
        }
    }
}
