//! Mapping Redis failures into the one error type of shardlease.
//!
//! The runtime decides what to retry from `Error::Backend { retryable }` alone, so the mapping
//! matters: a dropped connection, a timeout, a server still loading its data set (`LOADING`), a
//! busy script (`BUSY`), a cluster in flux (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `MOVED`,
//! `ASK`) or a replica just promoted (`READONLY`) may succeed when repeated; a wrong password, a
//! missing permission or a malformed command will not. Every message passes through the
//! [`Redactor`] so the password never leaves the crate.

use redis::{ErrorKind, RedisError, RetryMethod};
use shardlease_core::Error;

use shardlease_core::store::Redactor;

/// Server error codes worth repeating the call for.
const RETRYABLE_CODES: &[&str] =
    &["BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK"];

/// Server error codes that will not go away by themselves.
const PERMANENT_CODES: &[&str] = &["NOAUTH", "WRONGPASS", "NOPERM", "WRONGTYPE"];

/// Whether repeating the call that failed with `e` may succeed.
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    if let Some(code) = e.code() {
        if RETRYABLE_CODES.contains(&code) {
            return true;
        }
        if PERMANENT_CODES.contains(&code) {
            return false;
        }
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    if matches!(e.kind(), ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig) {
        return false;
    }
    matches!(
        e.retry_method(),
        RetryMethod::Reconnect
            | RetryMethod::RetryImmediately
            | RetryMethod::WaitAndRetry
            | RetryMethod::AskRedirect
            | RetryMethod::MovedRedirect
            | RetryMethod::ReconnectFromInitialConnections
    )
}

/// `Error::Backend` for a failure of `what` (free of secrets), keeping `e` as the source unless
/// its text holds the password (then a scrubbed copy of the text takes its place).
pub(crate) fn backend(redactor: &Redactor, what: &str, e: RedisError) -> Error {
    let display = e.to_string();
    redactor.backend_error(is_retryable(&e), &format!("redis: {what}"), &display, e)
}

/// `Error::Backend` (permanent) for a reply of a shape this crate does not expect.
pub(crate) fn unexpected(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::permanent(format!("redis: {what}: unexpected reply: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::new(kind, "boom"))
    }

    #[test]
    fn connection_trouble_is_retryable() {
        assert!(is_retryable(&io(std::io::ErrorKind::ConnectionRefused)));
        assert!(is_retryable(&io(std::io::ErrorKind::TimedOut)));
        assert!(is_retryable(&io(std::io::ErrorKind::BrokenPipe)));
        for code in ["BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN"] {
            let e = redis::make_extension_error(code.to_owned(), Some("x".to_owned()));
            assert!(is_retryable(&e), "{code}");
        }
    }

    #[test]
    fn bad_requests_and_credentials_are_permanent() {
        for code in ["WRONGPASS", "NOAUTH", "NOPERM", "WRONGTYPE", "ERR"] {
            let e = redis::make_extension_error(code.to_owned(), Some("x".to_owned()));
            assert!(!is_retryable(&e), "{code}");
        }
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad password"));
        assert!(!is_retryable(&auth));
    }
}
