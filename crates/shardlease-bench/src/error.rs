//! What can go wrong in a scenario run: a condition not reached by its deadline, a store or
//! runtime error, or an impossible setup. Each becomes the `"error"` value of a JSON line.

use std::time::Duration;

/// A failed scenario run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A condition was not reached in time.
    #[error("timed out after {:.3} s waiting for {what}; last seen: {last}", after.as_secs_f64())]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long the wait lasted.
        after: Duration,
        /// The last observation (and the last error, if any), for diagnosis.
        last: String,
    },
    /// The store, the source or the runtime refused something.
    #[error(transparent)]
    Shardlease(#[from] shardlease::Error),
    /// The scenario cannot run as configured.
    #[error("{0}")]
    Setup(String),
}
