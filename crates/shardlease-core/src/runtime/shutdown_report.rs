//! What a graceful shutdown did with each lease: the answer `WorkerHandle::shutdown` returns.
//!
//! A shutdown that had to cut a processor short is not a failure of the call (the worker did
//! stop, and the lease was released so a peer takes it at once), but it is something the caller
//! must be able to see: the records after the lease's last checkpoint are processed again by
//! the next owner. A `WARN` line alone is not enough for a deploy script or a test to act on.

use super::supervise::StopCause;
use crate::lease::LeaseKey;
use crate::position::Position;

/// A lease handed back by a shutdown, and where its next owner starts reading.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReleasedLease {
    /// The lease.
    pub key: LeaseKey,
    /// The checkpoint stored with the release: the next owner resumes after it.
    pub resumes_at: Position,
}

/// What [`WorkerHandle::shutdown`](super::WorkerHandle::shutdown) did with the leases the worker
/// held. A second call returns an empty report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Leases whose processor finished `shutdown_requested` in time and which were released at
    /// the checkpoint it left: nothing after it was processed, so nothing is processed twice.
    pub released: Vec<ReleasedLease>,
    /// Leases whose processor did not stop within `shutdown_timeout`: its batch was abandoned
    /// and the lease released anyway. Records after `resumes_at` that the abandoned batch may
    /// already have written somewhere are processed again by the next owner.
    pub abandoned: Vec<ReleasedLease>,
    /// Leases that could not be released (the store kept failing, or the lease had moved on to
    /// another owner meanwhile). A lease still naming this worker is taken by a peer once this
    /// worker's heartbeat has stood still for the failover timeout.
    pub not_released: Vec<LeaseKey>,
    /// Leases whose task ended on its own while stopping: a shard that reached its end, or a
    /// lease another worker had taken (a refused fenced write).
    pub ended: Vec<LeaseKey>,
    /// What stopped the worker: [`StopCause::Shutdown`] for this shutdown, or the failure that
    /// had stopped it before the call (its leases are then in none of the lists: their tasks were
    /// fenced, and peers take them after the failover timeout). `None` in a second call's report.
    pub cause: Option<StopCause>,
    /// Why the worker record could not be removed, if it could not: its peers then judge the
    /// worker dead after the failover timeout instead of at once. The leases' fate above stands.
    pub record_error: Option<String>,
}

impl ShutdownReport {
    /// Whether every lease was handed back after its processor stopped in time and the worker
    /// record removed: nothing abandoned, nothing left to expire, no loop failure before.
    pub fn is_clean(&self) -> bool {
        self.abandoned.is_empty()
            && self.not_released.is_empty()
            && self.record_error.is_none()
            && !matches!(self.cause, Some(StopCause::LoopFailed(_)))
    }

    /// How many leases the worker held when the shutdown began.
    pub fn leases(&self) -> usize {
        self.released.len() + self.abandoned.len() + self.not_released.len() + self.ended.len()
    }

    /// Puts each list in key order (tasks report in the order they end).
    pub(crate) fn sort(&mut self) {
        self.released.sort_by(|a, b| a.key.cmp(&b.key));
        self.abandoned.sort_by(|a, b| a.key.cmp(&b.key));
        self.not_released.sort();
        self.ended.sort();
    }
}
