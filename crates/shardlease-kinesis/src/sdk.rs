//! The [`Api`] over the AWS SDK client: request building, conversion of the replies, a timeout
//! around every call, and the classification of failures (throttled, expired iterator, retryable,
//! permanent).
//!
//! Error messages carry the operation, the service's error code and message, never credentials
//! (the SDK keeps those out of its errors; we add nothing from the configuration).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::types::{HashKeyRange, ShardIteratorType};
use aws_sdk_kinesis::Client;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_types::DateTime;
use bytes::Bytes;
use shardlease_core::{Error, HashRange, LeaseKey, ShardInfo};
use tracing::warn;

use crate::api::{
    Api, ApiError, IteratorStart, ListPage, RawRecord, RecordsPage, ShardPage, StreamRef,
};

/// The SDK-backed implementation of [`Api`] for one stream.
#[derive(Clone)]
pub(crate) struct SdkApi {
    client: Client,
    stream: StreamRef,
    timeout: Duration,
}

impl fmt::Debug for SdkApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SdkApi")
            .field("stream", &self.stream)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SdkApi {
    pub(crate) fn new(client: Client, stream: StreamRef, timeout: Duration) -> Self {
        SdkApi { client, stream, timeout }
    }

    /// The client (the fan-out calls live in [`crate::sdk_fanout`]).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The stream this API reads.
    pub(crate) fn stream(&self) -> &StreamRef {
        &self.stream
    }

    /// Runs one call under the operation timeout (on top of the SDK's own, which a client
    /// built elsewhere may not have set).
    pub(crate) async fn bounded<T, E>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    ) -> Result<T, ApiError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(what, e)),
            Err(_) => Err(ApiError::Other(Error::retryable(format!(
                "Kinesis {what} timed out after {:?}",
                self.timeout
            )))),
        }
    }
}

/// A raw reply an SDK error may carry: an HTTP response, or an event-stream message (which has
/// no status; its error code says everything).
pub(crate) trait RawReply: fmt::Debug + Send + Sync + 'static {
    /// Whether the service failed (a 5xx status).
    fn server_error(&self) -> bool;
}

impl RawReply for HttpResponse {
    fn server_error(&self) -> bool {
        self.status().is_server_error()
    }
}

impl RawReply for aws_smithy_types::event_stream::RawMessage {
    fn server_error(&self) -> bool {
        false
    }
}

impl SdkApi {
    /// Like [`SdkApi::bounded`], but `ResourceNotFoundException` is `Ok(None)`.
    pub(crate) async fn bounded_found<T, E>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    ) -> Result<Option<T>, ApiError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(e)) if e.code() == Some("ResourceNotFoundException") => Ok(None),
            Ok(Err(e)) => Err(classify(what, e)),
            Err(_) => Err(ApiError::Other(Error::retryable(format!(
                "Kinesis {what} timed out after {:?}",
                self.timeout
            )))),
        }
    }
}

/// Sorts an SDK failure into what the reader does about it.
pub(crate) fn classify<E, R>(what: &'static str, err: SdkError<E, R>) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: RawReply,
{
    let code = err.code().unwrap_or("").to_owned();
    let detail = err.message().unwrap_or("").to_owned();
    let transport = matches!(
        err,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
    );
    let server_side = err.raw_response().is_some_and(RawReply::server_error);
    let message = if code.is_empty() {
        format!("Kinesis {what} failed")
    } else {
        format!("Kinesis {what} failed: {code}: {detail}")
    };
    match code.as_str() {
        "ExpiredIteratorException" => ApiError::ExpiredIterator,
        "ProvisionedThroughputExceededException"
        | "LimitExceededException"
        | "KMSThrottlingException"
        | "ThrottlingException" => ApiError::Throttled(Error::backend(true, message, err)),
        "ResourceInUseException" => ApiError::InUse(Error::backend(true, message, err)),
        "InternalFailureException" | "ServiceUnavailable" => {
            ApiError::Other(Error::backend(true, message, err))
        }
        _ => ApiError::Other(Error::backend(transport || server_side, message, err)),
    }
}

/// Parses a decimal hash key (0 ..= 2^128 - 1).
pub(crate) fn parse_hash_key(s: &str) -> Option<u128> {
    s.parse::<u128>().ok()
}

pub(crate) fn hash_range(r: Option<&HashKeyRange>, shard: &str) -> Option<HashRange> {
    let r = r?;
    match (parse_hash_key(r.starting_hash_key()), parse_hash_key(r.ending_hash_key())) {
        (Some(start), Some(end)) => Some(HashRange { start, end }),
        _ => {
            warn!(shard, "Kinesis listed a hash key range that is not two 128-bit integers");
            None
        }
    }
}

#[async_trait]
impl Api for SdkApi {
    async fn list_shards(&self, page: ListPage) -> Result<ShardPage, ApiError> {
        let mut req = self.client.list_shards();
        match page {
            ListPage::First { max_results } => {
                req = match &self.stream {
                    StreamRef::Name(n) => req.stream_name(n),
                    StreamRef::Arn(a) => req.stream_arn(a),
                };
                req = req.set_max_results(max_results);
            }
            // The API refuses a stream name (or ARN) together with a token.
            ListPage::Next { token, max_results } => {
                req = req.next_token(token).set_max_results(max_results);
            }
        }
        let out = self.bounded("ListShards", req.send()).await?;
        let shards = out
            .shards
            .unwrap_or_default()
            .into_iter()
            .map(|s| {
                let parents = [s.parent_shard_id(), s.adjacent_parent_shard_id()]
                    .into_iter()
                    .flatten()
                    .map(LeaseKey::from)
                    .collect::<Vec<_>>();
                let mut info = ShardInfo::new(s.shard_id()).with_parents(parents).with_closed(
                    s.sequence_number_range().is_some_and(|r| r.ending_sequence_number().is_some()),
                );
                info.hash_range = hash_range(s.hash_key_range(), s.shard_id());
                info
            })
            .collect();
        Ok(ShardPage { shards, next_token: out.next_token })
    }

    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError> {
        let mut req = self.client.get_shard_iterator().shard_id(shard);
        req = match &self.stream {
            StreamRef::Name(n) => req.stream_name(n),
            StreamRef::Arn(a) => req.stream_arn(a),
        };
        req = match start {
            IteratorStart::TrimHorizon => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            IteratorStart::Latest => req.shard_iterator_type(ShardIteratorType::Latest),
            IteratorStart::AtTimestamp(millis) => req
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from_millis(*millis)),
            IteratorStart::AtSequence(seq) => req
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .starting_sequence_number(seq),
        };
        let out = self.bounded("GetShardIterator", req.send()).await?;
        out.shard_iterator.ok_or_else(|| {
            ApiError::Other(Error::retryable("Kinesis GetShardIterator returned no iterator"))
        })
    }

    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError> {
        let req = self.client.get_records().shard_iterator(iterator).limit(limit);
        let out = self.bounded("GetRecords", req.send()).await?;
        let records = out
            .records
            .into_iter()
            .map(|r| RawRecord {
                arrival_millis: r.approximate_arrival_timestamp.map_or(0, |t| nearest_millis(&t)),
                seq: r.sequence_number,
                partition_key: r.partition_key.unwrap_or_default(),
                data: Bytes::from(r.data.into_inner()),
            })
            .collect();
        let children = child_infos(out.child_shards);
        Ok(RecordsPage {
            records,
            next_iterator: out.next_shard_iterator,
            millis_behind: out.millis_behind_latest,
            children,
        })
    }
}

/// The millisecond a reply's timestamp names. Kinesis sends arrival times as epoch seconds with
/// millisecond digits (`1764763464.123`); the SDK reads that number through an `f64` and truncates
/// the fraction to nanoseconds, so `.123` arrives as `.122999906`. Truncating again to
/// milliseconds would move the record 1 ms earlier than the service holds it, and an
/// `AT_TIMESTAMP` built from that figure would then start before the record's true neighbour.
/// Rounding to the nearest millisecond gives back the digits the service sent.
/// The children a reply names at a shard's end (`GetRecords` or a subscription's last event).
pub(crate) fn child_infos(
    children: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
) -> Vec<ShardInfo> {
    children
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let mut info = ShardInfo::new(c.shard_id())
                .with_parents(c.parent_shards().iter().map(|p| LeaseKey::from(p.as_str())));
            info.hash_range = hash_range(c.hash_key_range(), c.shard_id());
            info
        })
        .collect()
}

pub(crate) fn nearest_millis(t: &DateTime) -> i64 {
    t.secs()
        .saturating_mul(1000)
        .saturating_add(i64::from((t.subsec_nanos() + 500_000) / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_kinesis::error::ErrorMetadata;
    use aws_sdk_kinesis::operation::get_records::GetRecordsError;
    use aws_sdk_kinesis::types::error::{
        ExpiredIteratorException, InternalFailureException, ProvisionedThroughputExceededException,
        ResourceNotFoundException,
    };
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    fn meta(code: &str) -> ErrorMetadata {
        ErrorMetadata::builder().code(code).message("from the service").build()
    }

    fn service(e: GetRecordsError, status: u16) -> SdkError<GetRecordsError, HttpResponse> {
        let status = StatusCode::try_from(status).unwrap_or_else(|e| panic!("{e}"));
        SdkError::service_error(e, HttpResponse::new(status, SdkBody::empty()))
    }

    #[test]
    fn failures_are_classified_by_code_and_status() {
        let throttled = GetRecordsError::ProvisionedThroughputExceededException(
            ProvisionedThroughputExceededException::builder()
                .meta(meta("ProvisionedThroughputExceededException"))
                .build(),
        );
        assert!(matches!(classify("GetRecords", service(throttled, 400)), ApiError::Throttled(_)));

        let expired = GetRecordsError::ExpiredIteratorException(
            ExpiredIteratorException::builder().meta(meta("ExpiredIteratorException")).build(),
        );
        assert!(matches!(classify("GetRecords", service(expired, 400)), ApiError::ExpiredIterator));

        let missing = GetRecordsError::ResourceNotFoundException(
            ResourceNotFoundException::builder().meta(meta("ResourceNotFoundException")).build(),
        );
        match classify("GetRecords", service(missing, 400)) {
            ApiError::Other(e) => {
                assert!(!e.is_retryable());
                assert!(
                    e.to_string().contains("ResourceNotFoundException: from the service"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }

        let internal = GetRecordsError::InternalFailureException(
            InternalFailureException::builder().meta(meta("InternalFailureException")).build(),
        );
        assert!(
            matches!(classify("GetRecords", service(internal, 500)), ApiError::Other(e) if e.is_retryable())
        );

        let unknown = GetRecordsError::generic(meta("SomethingNew"));
        assert!(
            matches!(classify("GetRecords", service(unknown, 503)), ApiError::Other(e) if e.is_retryable())
        );
        let unknown = GetRecordsError::generic(meta("SomethingNew"));
        assert!(
            matches!(classify("GetRecords", service(unknown, 400)), ApiError::Other(e) if !e.is_retryable())
        );

        let timeout: SdkError<GetRecordsError, HttpResponse> = SdkError::timeout_error("slow");
        assert!(matches!(classify("GetRecords", timeout), ApiError::Other(e) if e.is_retryable()));
        let bad: SdkError<GetRecordsError, HttpResponse> = SdkError::construction_failure("bad");
        assert!(matches!(classify("GetRecords", bad), ApiError::Other(e) if !e.is_retryable()));
    }

    #[test]
    fn hash_keys_parse_as_128_bit_integers() {
        assert_eq!(parse_hash_key("0"), Some(0));
        assert_eq!(parse_hash_key(&u128::MAX.to_string()), Some(u128::MAX));
        assert_eq!(parse_hash_key("340282366920938463463374607431768211456"), None); // 2^128
        assert_eq!(parse_hash_key("x"), None);
    }

    #[test]
    fn arrival_times_keep_the_millisecond_the_service_sent() {
        // What the SDK makes of `"ApproximateArrivalTimestamp": 1764763464.123` and friends.
        for millis in
            [1_764_763_464_123_i64, 1_764_763_464_001, 1_764_763_464_999, 1_764_763_464_000]
        {
            let secs = millis as f64 / 1000.0;
            let parsed = DateTime::from_secs_f64(secs);
            assert_eq!(nearest_millis(&parsed), millis, "{secs}");
        }
        // Exact values stay exact.
        assert_eq!(nearest_millis(&DateTime::from_millis(42_007)), 42_007);
    }
}
