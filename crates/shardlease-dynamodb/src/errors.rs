//! Mapping AWS SDK failures into the one error type of shardlease.
//!
//! The runtime decides what to retry from `Error::Backend { retryable }` alone. The SDK has
//! already retried a call (standard mode: exponential backoff with full jitter, see
//! [`DynamoDbStoreBuilder::max_attempts`](crate::DynamoDbStoreBuilder::max_attempts)) before an
//! error reaches this module, so what arrives here is what the retries could not fix. Throttling
//! (`ProvisionedThroughputExceededException`, `ThrottlingException`, `RequestLimitExceeded`),
//! server errors, timeouts and connection failures stay retryable: the runtime tries again on its
//! next beat, and a throttled heartbeat is never reported as anything else (in particular never
//! as a lost lease). A missing table, a refused signature, a denied permission or a malformed
//! request are permanent. Every message passes through the [`Redactor`].

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use shardlease_core::Error;

use shardlease_core::store::Redactor;

/// Service error codes worth repeating the call for.
const RETRYABLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionInProgressException",
    "LimitExceededException",
];

/// Whether the service error code `code` (with HTTP status `status`) may go away by itself.
pub(crate) fn is_retryable_code(code: Option<&str>, status: u16) -> bool {
    code.is_some_and(|c| RETRYABLE_CODES.contains(&c)) || status >= 500
}

/// Whether repeating the call that failed with `e` may succeed.
pub(crate) fn is_retryable<E, R>(e: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
    R: HttpStatus,
{
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => is_retryable_code(s.err().code(), s.raw().status_code()),
        _ => false,
    }
}

/// The HTTP status of a raw response (a trait so tests can use their own response type).
pub(crate) trait HttpStatus {
    /// The status code.
    fn status_code(&self) -> u16;
}

impl HttpStatus for aws_sdk_dynamodb::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

/// `Error::Backend` for a failure of `what` (free of secrets), keeping `e` as the source unless
/// its text holds a secret (then a scrubbed copy of the text takes its place).
pub(crate) fn backend<E, R>(redactor: &Redactor, what: &str, e: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: HttpStatus + std::fmt::Debug + Send + Sync + 'static,
{
    let display = DisplayErrorContext(&e).to_string();
    redactor.backend_error(is_retryable(&e), &format!("dynamodb: {what}"), &display, e)
}

/// `Error::Backend` (permanent) for a reply of a shape this crate does not expect.
pub(crate) fn unexpected(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::permanent(format!("dynamodb: {what}: unexpected reply: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_and_server_errors_are_retryable() {
        for code in [
            "ProvisionedThroughputExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
            "InternalServerError",
        ] {
            assert!(is_retryable_code(Some(code), 400), "{code}");
        }
        assert!(is_retryable_code(None, 503));
    }

    #[test]
    fn bad_requests_and_credentials_are_permanent() {
        for code in [
            "ResourceNotFoundException",
            "ValidationException",
            "AccessDeniedException",
            "UnrecognizedClientException",
            "ConditionalCheckFailedException",
        ] {
            assert!(!is_retryable_code(Some(code), 400), "{code}");
        }
        assert!(!is_retryable_code(None, 400));
    }
}
