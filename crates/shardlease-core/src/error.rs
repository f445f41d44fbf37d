//! The one public error type of shardlease.
//!
//! Every backend maps its native errors into [`Error`]; the runtime decides what to retry by
//! looking only at this enum. `Conflict` (someone else wrote the record first: re-read and decide
//! again) and `LeaseLost` (the caller no longer owns the lease: stop) are deliberately different
//! variants, because confusing them is how lease libraries end up with two owners.

use crate::lease::{Epoch, LeaseKey, VersionedLease};

/// A boxed error from a backend, a source or a record processor.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used throughout shardlease.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in shardlease.
///
/// Every backend maps its native errors into this enum; the runtime decides what to retry by
/// looking only at it ([`Error::is_retryable`]). `Conflict` (someone else wrote the record first:
/// re-read and decide again) and `LeaseLost` (the caller no longer owns the lease: stop) are
/// deliberately different variants, because confusing them is how lease libraries end up with two
/// owners.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A compare-and-set failed: the record changed (or vanished) since it was read.
    /// `current` is the record as the store holds it now, when the store could return it.
    #[error("conflict on lease {key}: the record changed since it was read")]
    Conflict {
        /// The lease whose write was rejected.
        key: LeaseKey,
        /// The record as it is now (`None` when it no longer exists).
        current: Option<Box<VersionedLease>>,
    },
    /// The caller's lease token is stale: another owner (or a release) moved the epoch on.
    #[error("lease {key} lost: epoch {epoch} is no longer current")]
    LeaseLost {
        /// The lease that was lost.
        key: LeaseKey,
        /// The epoch the caller held.
        epoch: Epoch,
    },
    /// A stored record could not be decoded. Reported for that record only.
    #[error("record {key} is corrupt: {reason}")]
    Corrupt {
        /// The store key of the record.
        key: String,
        /// Why it could not be decoded.
        reason: String,
    },
    /// Invalid configuration, detected when a worker or store is built.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Invalid input from the caller (a malformed sequence number, a checkpoint that moves back).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Returned by a record processor (from any of its methods, or anywhere in the source chain of
    /// its error): give this lease up. The processor is told its lease is lost (it writes nothing
    /// more) and the lease is released, so the shard resumes from its last checkpoint with a new
    /// processor, on this worker or another. For a failure that retrying the same batch cannot
    /// fix and a fresh processor can: a child process that died after some records it was given
    /// went unacknowledged (the MultiLang daemon), a connection that must be rebuilt from the
    /// checkpoint. Logged at WARN and counted as a processor error, not as a panic.
    #[error("the record processor gave the lease up: {0}")]
    ReleaseLease(String),
    /// A failure of the store, the shard source or the network.
    #[error("backend error ({}): {message}", if *.retryable { "retryable" } else { "permanent" })]
    Backend {
        /// Whether repeating the call may succeed.
        retryable: bool,
        /// What was being done, free of secrets.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

impl Error {
    /// A retryable backend error with a message and no source.
    pub fn retryable(message: impl Into<String>) -> Self {
        Error::Backend { retryable: true, message: message.into(), source: None }
    }

    /// A permanent backend error with a message and no source.
    pub fn permanent(message: impl Into<String>) -> Self {
        Error::Backend { retryable: false, message: message.into(), source: None }
    }

    /// A backend error wrapping `source`.
    pub fn backend(
        retryable: bool,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend { retryable, message: message.into(), source: Some(source.into()) }
    }

    /// Whether repeating the failed operation may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Backend { retryable, .. } => *retryable,
            Error::Conflict { .. } => true,
            _ => false,
        }
    }
}

/// An error followed by its sources, for logs and messages: `outer: inner: root`.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}
