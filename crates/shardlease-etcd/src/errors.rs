//! Mapping etcd client failures into the one error type of shardlease.
//!
//! The runtime decides what to retry from `Error::Backend { retryable }` alone. A dropped or
//! refused connection, a timeout, a server without a leader or too busy (`Unavailable`,
//! `DeadlineExceeded`, `ResourceExhausted`, `Aborted`, `Cancelled`, `Unknown`, `Internal`) may
//! succeed when repeated; a wrong password, a missing permission or a malformed request will
//! not. Every message passes through the [`Redactor`] so the password never leaves the crate.

use etcd_client::Error as EtcdError;
use shardlease_core::store::Redactor;
use shardlease_core::Error;

/// Whether repeating the call that failed with `e` may succeed.
pub(crate) fn is_retryable(e: &EtcdError) -> bool {
    use tonic_code::*;
    match e {
        EtcdError::GRpcStatus(s) => !matches!(
            code_of(s),
            INVALID_ARGUMENT
                | NOT_FOUND
                | ALREADY_EXISTS
                | PERMISSION_DENIED
                | UNAUTHENTICATED
                | FAILED_PRECONDITION
                | OUT_OF_RANGE
                | UNIMPLEMENTED
        ),
        EtcdError::TransportError(_) | EtcdError::IoError(_) | EtcdError::WatchError(_) => true,
        EtcdError::EndpointError(_) | EtcdError::Internal(_) => true,
        _ => false,
    }
}

/// gRPC status codes by number, so this crate does not depend on tonic directly.
mod tonic_code {
    pub(super) const INVALID_ARGUMENT: i32 = 3;
    pub(super) const NOT_FOUND: i32 = 5;
    pub(super) const ALREADY_EXISTS: i32 = 6;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const FAILED_PRECONDITION: i32 = 9;
    pub(super) const OUT_OF_RANGE: i32 = 11;
    pub(super) const UNIMPLEMENTED: i32 = 12;
    pub(super) const UNAUTHENTICATED: i32 = 16;

    pub(super) fn code_of<S: std::fmt::Debug>(status: &S) -> i32 {
        // `tonic::Status` is not re-exported by etcd-client; its `Debug` begins with the code's
        // name, which maps back to the number.
        let text = format!("{status:?}");
        let names = [
            ("InvalidArgument", INVALID_ARGUMENT),
            ("NotFound", NOT_FOUND),
            ("AlreadyExists", ALREADY_EXISTS),
            ("PermissionDenied", PERMISSION_DENIED),
            ("FailedPrecondition", FAILED_PRECONDITION),
            ("OutOfRange", OUT_OF_RANGE),
            ("Unimplemented", UNIMPLEMENTED),
            ("Unauthenticated", UNAUTHENTICATED),
        ];
        names
            .iter()
            .find(|(name, _)| text.contains(&format!("code: {name}")))
            .map(|(_, n)| *n)
            .unwrap_or(-1)
    }
}

/// `Error::Backend` for a failure of `what` (free of secrets), keeping `e` as the source unless
/// its text holds the password (then a scrubbed copy of the text takes its place).
pub(crate) fn backend(redactor: &Redactor, what: &str, e: EtcdError) -> Error {
    let display = e.to_string();
    redactor.backend_error(is_retryable(&e), &format!("etcd: {what}"), &display, e)
}

/// `Error::Backend` (permanent) for a reply of a shape this crate does not expect.
pub(crate) fn unexpected(what: &str) -> Error {
    Error::permanent(format!("etcd: {what}: unexpected reply"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_retry_and_bad_arguments_do_not() {
        assert!(is_retryable(&EtcdError::WatchError("stream closed".into())));
        assert!(!is_retryable(&EtcdError::InvalidArgs("bad".into())));
        let e = backend(&Redactor::new(["pw"]), "get", EtcdError::InvalidArgs("user u pw".into()));
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains("pw") && !e.is_retryable(), "{shown}");
    }
}
