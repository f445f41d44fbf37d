//! The CLI's failures and the exit code each one maps to, so scripts can tell "you typed it
//! wrong" from "the store is down" from "refused for safety" from "someone wrote first".

use std::process::ExitCode;

/// Exit codes (documented in `--help` and docs/operations.md).
pub mod code {
    /// Success; for `status`, a healthy fleet.
    pub const OK: u8 = 0;
    /// `status` found a problem (a stuck lease or a corrupt record).
    pub const UNHEALTHY: u8 = 1;
    /// Bad command line or input (also what clap uses for parse errors).
    pub const USAGE: u8 = 2;
    /// The store could not be reached or failed.
    pub const STORE: u8 = 3;
    /// Refused for safety (the owner or worker looks alive); `--force` overrides.
    pub const REFUSED: u8 = 4;
    /// A compare-and-set lost: the record changed between read and write. Nothing was written.
    pub const CONFLICT: u8 = 5;
    /// The lease or worker does not exist.
    pub const NOT_FOUND: u8 = 6;
}

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input.
    #[error("{0}")]
    Usage(String),
    /// A store error (its message is redacted by the store), shown with its source chain.
    #[error("store error: {}", shardlease::ErrorChain(.0))]
    Store(shardlease::Error),
    /// Refused for safety.
    #[error("{0}")]
    Refused(String),
    /// A compare-and-set conflict.
    #[error("{0}")]
    Conflict(String),
    /// Nothing by that name.
    #[error("{0}")]
    NotFound(String),
    /// A source other than the store (a KCL lease table) failed or could not be reached.
    #[allow(dead_code)] // only `import-kcl` (feature `dynamodb`) reads another source
    #[error("{0}")]
    Source(String),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Usage(_) | CliError::Store(shardlease::Error::Config(_)) => code::USAGE,
            CliError::Store(_) | CliError::Source(_) => code::STORE,
            CliError::Refused(_) => code::REFUSED,
            CliError::Conflict(_) => code::CONFLICT,
            CliError::NotFound(_) => code::NOT_FOUND,
        })
    }

    /// A store error from a compare-and-set: conflicts get their own message and exit code.
    pub fn from_write(e: shardlease::Error, what: &str) -> CliError {
        match e {
            shardlease::Error::Conflict { key, .. } => CliError::Conflict(format!(
                "lease {key} changed between reading and writing it (a worker wrote it \
                 meanwhile); nothing was written by {what}: look again and re-run"
            )),
            other => CliError::Store(other),
        }
    }
}
