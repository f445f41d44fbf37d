//! The crate's one error type: what stops the daemon from starting or running (a bad properties
//! file, a store or stream that cannot be opened). A misbehaving child is not one of these: it
//! costs its own lease only ([`crate::child::Fault`]).

use std::path::PathBuf;

/// Why the daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum MultiLangError {
    /// The properties file could not be read.
    #[error("cannot read the properties file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A key has a value the daemon cannot use.
    #[error("properties line {line}: {key}: {message}")]
    BadValue {
        /// The key.
        key: String,
        /// Its line in the file (1-based).
        line: usize,
        /// What is wrong and what is expected.
        message: String,
    },
    /// A required key is missing, or keys contradict each other.
    #[error("properties: {0}")]
    Missing(String),
    /// The metrics and health listener (`shardlease.metricsAddress`) could not be opened (the
    /// address is in use, or not one of this host's).
    #[error("shardlease.metricsAddress = {addr}: cannot listen there: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The store, the stream or the worker refused to start.
    #[error(transparent)]
    Shardlease(#[from] shardlease::Error),
}

/// This crate's result.
pub type Result<T, E = MultiLangError> = std::result::Result<T, E>;
