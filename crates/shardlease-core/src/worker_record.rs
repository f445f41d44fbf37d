//! The per-worker heartbeat record. Only its own worker writes it; everyone else only reads it.

use serde::{Deserialize, Serialize};

use crate::ids::WorkerId;
use crate::load::LeaseLoad;

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
    /// The worker's total load: the sum of its leases' measured loads (busy seconds per second,
    /// see [`LeaseLoad`]) when it measures them, for operators and the load-aware balancer.
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
    /// The worker's heaviest leases by measured load, at most
    /// [`MAX_PUBLISHED_LEASE_LOADS`](crate::store::MAX_PUBLISHED_LEASE_LOADS), heaviest first;
    /// `load` then holds the total over all its leases. Empty when the worker does not measure
    /// (balancing by count). Stores keep it as one text field
    /// ([`encode_lease_loads`](crate::store::encode_lease_loads)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lease_loads: Vec<LeaseLoad>,
}

const BEAT_COUNT_BITS: u32 = WorkerRecord::BEAT_COUNT_BITS;

impl WorkerRecord {
    /// The low bits of a beat that count a process's heartbeats; the bits above them are the
    /// process's random base. Stores whose conditional writes can shift (SQL) compare
    /// `beat >> BEAT_COUNT_BITS` to tell one process from another.
    pub const BEAT_COUNT_BITS: u32 = 24;

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

    /// The last beat value the process that wrote `beat` can write: the top of its range of
    /// 2^24 beats. Two beats `a` and `b` come from the same process exactly when
    /// `a >> 24 == b >> 24`, which is `a` lying in `b`'s range
    /// `[b >> 24 << 24, WorkerRecord::last_beat_of_process(b)]`: stores whose conditional
    /// writes can compare but not shift (Redis scripts on strings, DynamoDB conditions) use
    /// that form.
    pub fn last_beat_of_process(beat: u64) -> u64 {
        beat | ((1 << BEAT_COUNT_BITS) - 1)
    }

    /// Whether a heartbeat writing beat `new` may replace a stored record whose beat is
    /// `stored` (the rule of [`LeaseStore::heartbeat`](crate::store::LeaseStore::heartbeat)): yes,
    /// unless both come from the same process and the stored beat is not lower. A process writes
    /// each beat value once, counting up, so a stored beat at or above `new` is this write's
    /// own later heartbeat (or this very write, landed already), and the write is a late one.
    pub fn heartbeat_replaces(stored: u64, new: u64) -> bool {
        !Self::same_process(stored, new) || stored < new
    }

    /// The id suffix of a death notice (see [`WorkerRecord::death_notice`]): after the
    /// incarnation separator `#`, which configured ids cannot contain, and not the 8 hex digits of
    /// an incarnation, so a notice's id is never a worker's.
    pub const DEATH_NOTICE_SUFFIX: &'static str = "#dead";

    /// A **death notice**: the record a worker writes when, watching `dead`, it judged it dead
    /// at `beat` (docs/algorithm.md, "A fleet too large to list each heartbeat"). It is stored
    /// as a worker record (every store keeps those) under the id `<dead>#dead`, with the dead
    /// worker's beat. Peers that list it take `dead` for dead while `dead`'s own record still
    /// shows that beat; it is never a worker and never counted as one.
    pub fn death_notice(dead: &WorkerId, beat: u64) -> WorkerRecord {
        WorkerRecord::new(
            WorkerId::new(format!("{}{}", dead.as_str(), Self::DEATH_NOTICE_SUFFIX)),
            beat,
        )
    }

    /// The worker this record announces dead, if it is a death notice
    /// ([`WorkerRecord::death_notice`]).
    pub fn notice_of(&self) -> Option<WorkerId> {
        self.id.as_str().strip_suffix(Self::DEATH_NOTICE_SUFFIX).map(WorkerId::new)
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
            lease_loads: Vec::new(),
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it): the engine's one
/// clock, which stores use for the informational `updated_at` of their records. Under tokio's
/// paused time (simulations, tests) it advances with the simulated time.
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

    #[test]
    fn a_heartbeat_replaces_older_beats_and_other_processes_only() {
        let a = 5 << BEAT_COUNT_BITS;
        assert!(WorkerRecord::heartbeat_replaces(a + 1, a + 2), "counting up");
        assert!(!WorkerRecord::heartbeat_replaces(a + 2, a + 1), "a late write of an older beat");
        assert!(!WorkerRecord::heartbeat_replaces(a + 2, a + 2), "the same write again");
        let (older_base, newer_base) = (3 << BEAT_COUNT_BITS, 9 << BEAT_COUNT_BITS);
        assert!(WorkerRecord::heartbeat_replaces(a + 7, older_base), "a restart, lower base");
        assert!(WorkerRecord::heartbeat_replaces(a + 7, newer_base), "a restart, higher base");
        let top = WorkerRecord::last_beat_of_process(a + 7);
        assert_eq!(top, (6 << BEAT_COUNT_BITS) - 1);
        assert!(WorkerRecord::same_process(a, top) && !WorkerRecord::same_process(a, top + 1));
        assert_eq!(WorkerRecord::last_beat_of_process(top), top);
    }
}
