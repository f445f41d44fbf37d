//! # shardlease-e2e
//!
//! The proof of "swap stores without touching consumer code": [`consumer`] is one consumer
//! program written the way an application writes it, against the `shardlease` facade alone (a
//! store URL in, a running worker out), and [`scenario`] runs a fleet of it through a start, a
//! join, a graceful leave and a crash while a producer keeps writing, counting every delivery.
//! The tests under `tests/` run that scenario, unchanged, on every store the facade can connect
//! to; only the URL differs.

pub mod consumer;
pub mod scenario;

pub use consumer::{run_consumer, Tally};
pub use scenario::{fleet_scenario, Report, Timing};
