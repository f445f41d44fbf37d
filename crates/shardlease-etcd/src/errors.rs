//! Mapping etcd client failures into the one error type of shardlease.
//!
//! The runtime decides what to retry from `Error::Backend { retryable }` alone. A dropped or
//! refused connection, a timeout, a server without a leader or too busy (`Unavailable`,
//! `DeadlineExceeded`, `ResourceExhausted`, `Aborted`, `Cancelled`, `Unknown`, `Internal`) may
//! succeed when repeated; a wrong password, a missing permission or a malformed request will
//! not. A gRPC failure is judged by its `tonic::Code` (etcd-client's `GRpcStatus` carries a
//! `tonic::Status`), never by its text. Every message passes through the [`Redactor`] so the
//! password never leaves the crate.

use etcd_client::Error as EtcdError;
use shardlease_core::store::Redactor;
use shardlease_core::Error;
use tonic::Code;

/// Whether repeating the call that failed with `e` may succeed.
pub(crate) fn is_retryable(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(status) => code_is_retryable(status.code()),
        EtcdError::TransportError(_) | EtcdError::IoError(_) | EtcdError::WatchError(_) => true,
        EtcdError::EndpointError(_) | EtcdError::Internal(_) => true,
        _ => false,
    }
}

/// Whether a call answered with gRPC status `code` may succeed when repeated: every code but
/// those that say the request itself is wrong or not allowed.
fn code_is_retryable(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
    )
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
        assert!(is_retryable(&EtcdError::EndpointError("gone".into())));
        assert!(!is_retryable(&EtcdError::InvalidArgs("bad".into())));
        let e = backend(&Redactor::new(["pw"]), "get", EtcdError::InvalidArgs("user u pw".into()));
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains("pw") && !e.is_retryable(), "{shown}");
    }

    /// Every gRPC code, classified by the code alone: the message is written to mislead a
    /// classification by text.
    #[test]
    fn each_grpc_code_is_classified_by_the_code() {
        let cases = [
            (Code::Ok, true),
            (Code::Cancelled, true),
            (Code::Unknown, true),
            (Code::InvalidArgument, false),
            (Code::DeadlineExceeded, true),
            (Code::NotFound, false),
            (Code::AlreadyExists, false),
            (Code::PermissionDenied, false),
            (Code::ResourceExhausted, true),
            (Code::FailedPrecondition, false),
            (Code::Aborted, true),
            (Code::OutOfRange, false),
            (Code::Unimplemented, false),
            (Code::Internal, true),
            (Code::Unavailable, true),
            (Code::DataLoss, true),
            (Code::Unauthenticated, false),
        ];
        for (code, retryable) in cases {
            let misleading = if retryable { "code: InvalidArgument" } else { "code: Unavailable" };
            let e = EtcdError::GRpcStatus(tonic::Status::new(code, misleading));
            assert_eq!(is_retryable(&e), retryable, "{code:?}");
            let mapped = backend(&Redactor::default(), "get", e);
            assert_eq!(mapped.is_retryable(), retryable, "{code:?}: {mapped}");
        }
    }
}
