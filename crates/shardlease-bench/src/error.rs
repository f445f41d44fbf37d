//! What can go wrong in a scenario run: a condition not reached by its deadline, a store or
//! runtime error, or an impossible setup. Each becomes the `"error"` value of a JSON line.

use std::fmt;
use std::time::Duration;

/// A failed scenario run.
#[derive(Debug)]
pub enum BenchError {
    /// A condition was not reached in time.
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long the wait lasted.
        after: Duration,
        /// The last observation (and the last error, if any), for diagnosis.
        last: String,
    },
    /// The store, the source or the runtime refused something.
    Shardlease(shardlease::Error),
    /// The scenario cannot run as configured.
    Setup(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Timeout { what, after, last } => {
                write!(
                    f,
                    "timed out after {:.3} s waiting for {what}; last seen: {last}",
                    after.as_secs_f64()
                )
            }
            BenchError::Shardlease(e) => write!(f, "{e}"),
            BenchError::Setup(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<shardlease::Error> for BenchError {
    fn from(e: shardlease::Error) -> Self {
        BenchError::Shardlease(e)
    }
}
