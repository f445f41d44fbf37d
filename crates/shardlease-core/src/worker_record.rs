//! The per-worker heartbeat record. Only its own worker writes it; everyone else only reads it.

use serde::{Deserialize, Serialize};

use crate::ids::WorkerId;

/// A worker's heartbeat. Liveness is judged by watching `beat` change on the observer's own
/// monotonic clock; `updated_at_millis` is informational only (clocks differ between machines).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker.
    pub id: WorkerId,
    /// Incremented by the worker on every heartbeat.
    pub beat: u64,
    /// Wall-clock time of the heartbeat, milliseconds since the Unix epoch (for operators).
    pub updated_at_millis: u64,
    /// How many leases the worker holds.
    pub lease_count: u32,
    /// Optional load figure (records per second, CPU, ...), for operators and custom balancers.
    #[serde(default)]
    pub load: Option<f64>,
    /// Optional capacity (maximum leases) the worker advertises.
    #[serde(default)]
    pub capacity: Option<u32>,
}

impl WorkerRecord {
    /// A record for `id` at beat `beat`, stamped with the current wall-clock time.
    pub fn new(id: WorkerId, beat: u64) -> Self {
        WorkerRecord {
            id,
            beat,
            updated_at_millis: now_millis(),
            lease_count: 0,
            load: None,
            capacity: None,
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
