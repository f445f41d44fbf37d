//! # shardlease-bench
//!
//! Measures the figures docs/algorithm.md reports ("Measured figures") on any store: start-up passes and
//! time, lease moves, join / leave / crash recovery and duplicate deliveries, steady-state store
//! cost per worker, and records per second. Workers run as tasks of one process on an in-memory
//! stream; the coordination store is the one named by `--store`, opened in a fresh namespace per
//! run. Each run prints one JSON object per line (see [`report::Report`]).
//!
//! The binary's flags are described by [`args::usage`] (`--help`); [`run`] is what it calls.

pub mod args;
pub mod counting_store;
pub mod error;
pub mod fleet;
pub mod hogs;
pub mod processors;
pub mod producer;
pub mod report;
pub mod scenarios;
pub mod skew_load;
pub mod skew_processor;
pub mod spread;
pub mod streams;
pub mod unbatched;
pub mod wait;

use args::Args;
use report::Report;

/// Checks that the store URL opens (a scheme compiled out or a malformed URL is a flag error);
/// the message never echoes the URL, which may hold a password.
pub async fn preflight(args: &Args) -> Result<(), String> {
    match shardlease::connect_namespace(&args.store, "bench-preflight").await {
        Ok(_) => Ok(()),
        Err(shardlease::Error::Config(m)) => Err(format!("`--store`: {m}")),
        Err(e) => Err(format!("`--store` {}: {e}", shardlease::redact_url(&args.store))),
    }
}

/// Runs every requested scenario with every requested policy, handing each line to `emit` as soon
/// as it is ready (a failed run's line has an `"error"` key). Returns whether every run succeeded.
pub async fn run(args: &Args, mut emit: impl FnMut(&Report)) -> bool {
    // Each runtime hog computes for most of the self-fence margin at a time.
    let _hogs = hogs::CpuHogs::start(args.cpu_hogs, args.timings.heartbeat * 3 / 2);
    let mut ok = true;
    for &scenario in &args.scenarios {
        for &policy in &args.policies {
            match scenarios::run(args, scenario, policy).await {
                Ok(report) => emit(&report),
                Err((mut report, e)) => {
                    ok = false;
                    report.set("error", e.to_string());
                    emit(&report);
                }
            }
        }
    }
    ok
}
