//! The per-worker heartbeat record. Only its own worker writes it; everyone else only reads it.

use serde::{Deserialize, Serialize};

use crate::ids::WorkerId;

/// A worker's heartbeat. Liveness is judged by watching `beat` change on the observer's own
/// monotonic clock; `updated_at_millis` is informational only (clocks differ between machines).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker.
    pub id: WorkerId,
    /// Incremented by the worker on every heartbeat, from a random multiple of 2^24 (see
    /// [`WorkerRecord::first_beat`]).
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
    /// How many ownership changes (takes, handoffs, releases, claims, shard ends, creations,
    /// deletions, restores) this worker's process has made. Peers list the leases again when it
    /// changes, and only then (plus a slow safety net), so a quiet fleet reads worker records,
    /// not leases. Only equality matters: a new process starts again from 0.
    #[serde(default)]
    pub changes: u64,
}

/// The low bits of a beat that count a process's heartbeats.
const BEAT_COUNT_BITS: u32 = 24;

impl WorkerRecord {
    /// The first beat of a new process: a random multiple of 2^24. A process restarted under
    /// the same id must never write a beat value its predecessor wrote: an observer that last saw
    /// that value would take it for a beat that stood still and judge a live worker dead.
    pub fn first_beat() -> u64 {
        (u64::from(rand::random::<u32>()) | 1) << BEAT_COUNT_BITS
    }

    /// Beats after which a process counts as running for a while (part of an established fleet)
    /// rather than one that started about now.
    pub(crate) const ESTABLISHED_BEATS: u64 = 3;

    /// How many heartbeats this worker's process has written (exact for the first 2^24).
    pub fn beats_written(&self) -> u64 {
        self.beat & ((1 << BEAT_COUNT_BITS) - 1)
    }

    /// Whether two beats of one worker id come from the same process (a restart under the same
    /// id draws a new random base).
    pub fn same_process(before: u64, now: u64) -> bool {
        before >> BEAT_COUNT_BITS == now >> BEAT_COUNT_BITS
    }

    /// Whether a worker's beat went from `before` to `now` backwards within one process (same
    /// random start): a live process only counts up, so the store lost writes (a rollback to an
    /// earlier copy). A restart under the same id starts from another random base instead.
    pub fn beat_went_back(before: u64, now: u64) -> bool {
        before >> BEAT_COUNT_BITS == now >> BEAT_COUNT_BITS && now < before
    }

    /// A record for `id` at beat `beat`, stamped with the current wall-clock time.
    pub fn new(id: WorkerId, beat: u64) -> Self {
        WorkerRecord {
            id,
            beat,
            updated_at_millis: now_millis(),
            lease_count: 0,
            load: None,
            capacity: None,
            changes: 0,
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it): the engine's one
/// clock, [`crate::clock::now_millis`].
pub fn now_millis() -> u64 {
    crate::clock::now_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_restarted_under_one_id_never_share_beat_values() {
        let (a, b) = (WorkerRecord::first_beat(), WorkerRecord::first_beat());
        assert_ne!(a, b, "two processes start from different beats");
        let mut r = WorkerRecord::new(WorkerId::new("w"), a);
        assert_eq!(r.beats_written(), 0);
        r.beat += 5;
        assert_eq!(r.beats_written(), 5);
        assert!(i64::try_from(r.beat).is_ok(), "fits every store's signed 64-bit column");
        assert!(WorkerRecord::beat_went_back(a + 5, a + 3), "same process, lower count");
        assert!(!WorkerRecord::beat_went_back(a + 3, a + 5), "counting up");
        let other_process = if b < a { b + 7 } else { b };
        assert!(!WorkerRecord::beat_went_back(a + 5, other_process), "a restart is not a rollback");
    }
}
