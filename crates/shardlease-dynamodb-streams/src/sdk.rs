//! The [`Api`] over the AWS SDK's DynamoDB Streams client: request building, conversion of the
//! replies into the crate's own types, a timeout around every call, and the classification of
//! failures (throttled, expired iterator, trimmed, not found, retryable, permanent).
//!
//! The rest of the crate never sees an SDK type: the listing and reading rules talk to [`Api`],
//! which the in-process fake also implements, so this file is the only place that knows how the
//! SDK spells a shard, a record or an error. It also finds a table's current stream
//! ([`latest_stream_arn`]) for a source configured by table name.
//!
//! Error messages carry the operation, the stream's ARN (or the table's name), the service's
//! error code and message, never credentials (the SDK keeps those out of its errors; we add
//! nothing from the configuration, and [`SdkApi`]'s `Debug` leaves the client out).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodbstreams::config::http::HttpResponse;
use aws_sdk_dynamodbstreams::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodbstreams::types as sdk;
use aws_sdk_dynamodbstreams::types::{ShardFilter, ShardFilterType, ShardIteratorType};
use aws_sdk_dynamodbstreams::Client;
use aws_smithy_types::DateTime;
use bytes::Bytes;
use shardlease_core::{Error, SequenceNumber};
use tracing::warn;

use crate::api::{
    Api, ApiError, DescribeRequest, IteratorStart, RecordsPage, StreamPage, StreamShard,
    StreamStatus,
};
use crate::change::{AttributeValue, ChangeEvent, EventName, Item};

/// The SDK-backed implementation of [`Api`] for one stream.
#[derive(Clone)]
pub(crate) struct SdkApi {
    client: Client,
    stream_arn: String,
    timeout: Duration,
}

impl fmt::Debug for SdkApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client stays out: its configuration is no business of a log line.
        f.debug_struct("SdkApi")
            .field("stream_arn", &self.stream_arn)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SdkApi {
    /// The API of the stream `stream_arn`, each call bounded by `timeout` (on top of the SDK's
    /// own timeouts, which a client built elsewhere may not have set).
    pub(crate) fn new(client: Client, stream_arn: String, timeout: Duration) -> Self {
        SdkApi { client, stream_arn, timeout }
    }

    /// Runs one call on this API's stream under the operation timeout.
    async fn bounded<T, E>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    ) -> Result<T, ApiError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        bounded(self.timeout, what, Target::Stream(&self.stream_arn), call).await
    }

    /// A reply the service should not have sent (a required field missing): retryable, since
    /// the next reply may well be whole.
    fn malformed(&self, what: &'static str, problem: &str) -> ApiError {
        ApiError::Other(Error::retryable(format!(
            "DynamoDB Streams {what} on stream {}: {problem}",
            self.stream_arn
        )))
    }
}

/// What a call was about, for its error messages.
#[derive(Clone, Copy, Debug)]
enum Target<'a> {
    /// A stream, by ARN.
    Stream(&'a str),
    /// A table, by name (`ListStreams`).
    Table(&'a str),
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Stream(arn) => write!(f, "stream {arn}"),
            Target::Table(name) => write!(f, "table {name}"),
        }
    }
}

/// Runs one call under `timeout`; a timeout is retryable, a failure is [`classify`]'d.
async fn bounded<T, E>(
    timeout: Duration,
    what: &'static str,
    target: Target<'_>,
    call: impl Future<Output = Result<T, SdkError<E, HttpResponse>>>,
) -> Result<T, ApiError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(what, target, e)),
        Err(_) => Err(ApiError::Other(Error::retryable(format!(
            "DynamoDB Streams {what} on {target} timed out after {timeout:?}"
        )))),
    }
}

/// What a service error code alone says about a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodeClass {
    /// Back off and retry.
    Throttled,
    /// The shard iterator is past its 15 minutes.
    ExpiredIterator,
    /// The records asked for are past retention.
    Trimmed,
    /// The stream or the shard does not exist (any more).
    NotFound,
    /// A failure of the service: retry.
    ServerError,
    /// A code that says nothing special: the HTTP status decides.
    Unclassified,
}

/// Classifies a service error code (`LimitExceededException`, …). Pure, for the tests.
pub(crate) fn code_class(code: &str) -> CodeClass {
    match code {
        // DynamoDB Streams itself sends `LimitExceededException`; the others are the generic
        // AWS throttling codes a gateway or the SDK's own retry layer may report.
        "LimitExceededException"
        | "ThrottlingException"
        | "Throttling"
        | "RequestLimitExceeded"
        | "ProvisionedThroughputExceededException"
        | "TooManyRequestsException" => CodeClass::Throttled,
        "ExpiredIteratorException" => CodeClass::ExpiredIterator,
        "TrimmedDataAccessException" => CodeClass::Trimmed,
        "ResourceNotFoundException" => CodeClass::NotFound,
        "InternalServerError" | "InternalFailure" | "ServiceUnavailable" => CodeClass::ServerError,
        _ => CodeClass::Unclassified,
    }
}

/// Sorts an SDK failure into what the source does about it. Timeouts, dispatch failures
/// (connection, I/O) and unreadable replies are retryable, so is a 5xx; any other 4xx is
/// permanent, and so is a request the SDK could not build.
fn classify<E>(what: &'static str, target: Target<'_>, err: SdkError<E, HttpResponse>) -> ApiError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = err.code().unwrap_or("").to_owned();
    let transport = matches!(
        err,
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_)
    );
    let server_side = err.raw_response().is_some_and(|r| r.status().is_server_error());
    let message = match (code.as_str(), err.message()) {
        ("", _) => format!("DynamoDB Streams {what} on {target} failed"),
        (code, Some(detail)) if !detail.is_empty() => {
            format!("DynamoDB Streams {what} on {target} failed: {code}: {detail}")
        }
        (code, _) => format!("DynamoDB Streams {what} on {target} failed: {code}"),
    };
    match code_class(&code) {
        CodeClass::Throttled => ApiError::Throttled(Error::backend(true, message, err)),
        CodeClass::ExpiredIterator => ApiError::ExpiredIterator,
        CodeClass::Trimmed => ApiError::Trimmed(Error::backend(false, message, err)),
        CodeClass::NotFound => ApiError::NotFound(Error::backend(false, message, err)),
        CodeClass::ServerError => ApiError::Other(Error::backend(true, message, err)),
        CodeClass::Unclassified => {
            ApiError::Other(Error::backend(transport || server_side, message, err))
        }
    }
}

/// The stream's status as the crate types it. `None` (a reply without one, which the service
/// never sends but an emulator may) and a status newer than this SDK both read as `Enabled`:
/// that is the reading that loses nothing, since the source then keeps waiting for the children
/// of a closed shard, where `Disabled` would have it conclude that none will ever come.
fn stream_status(status: Option<&sdk::StreamStatus>) -> StreamStatus {
    match status {
        Some(sdk::StreamStatus::Enabling) => StreamStatus::Enabling,
        Some(sdk::StreamStatus::Enabled) => StreamStatus::Enabled,
        Some(sdk::StreamStatus::Disabling) => StreamStatus::Disabling,
        Some(sdk::StreamStatus::Disabled) => StreamStatus::Disabled,
        None => StreamStatus::Enabled,
        Some(other) => {
            warn!(
                status = other.as_str(),
                "DynamoDB Streams reported a stream status this SDK does not know; reading it as \
                 ENABLED"
            );
            StreamStatus::Enabled
        }
    }
}

/// `Some` of a non-empty string (the service's "no more pages" is sometimes `""`).
fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// An SDK attribute value as the crate's. `Err` names what could not be converted: a value of
/// a type newer than this SDK (the SDK's union is non-exhaustive and reads such a value as
/// `Unknown`, its content lost).
pub(crate) fn attribute(value: sdk::AttributeValue) -> Result<AttributeValue, String> {
    Ok(match value {
        sdk::AttributeValue::S(s) => AttributeValue::S(s),
        sdk::AttributeValue::N(n) => AttributeValue::N(n),
        sdk::AttributeValue::B(b) => AttributeValue::B(Bytes::from(b.into_inner())),
        sdk::AttributeValue::Bool(b) => AttributeValue::Bool(b),
        sdk::AttributeValue::Null(b) => AttributeValue::Null(b),
        sdk::AttributeValue::M(m) => AttributeValue::M(item(m)?),
        sdk::AttributeValue::L(l) => {
            AttributeValue::L(l.into_iter().map(attribute).collect::<Result<_, _>>()?)
        }
        sdk::AttributeValue::Ss(v) => AttributeValue::Ss(v),
        sdk::AttributeValue::Ns(v) => AttributeValue::Ns(v),
        sdk::AttributeValue::Bs(v) => {
            AttributeValue::Bs(v.into_iter().map(|b| Bytes::from(b.into_inner())).collect())
        }
        _ => return Err("a value of a type this SDK does not know".to_owned()),
    })
}

/// An SDK item (or key, or image) as the crate's, its attributes sorted by name. `Err` names
/// the attribute that could not be converted.
pub(crate) fn item(map: HashMap<String, sdk::AttributeValue>) -> Result<Item, String> {
    map.into_iter()
        .map(|(name, value)| match attribute(value) {
            Ok(v) => Ok((name, v)),
            Err(why) => Err(format!("attribute {name:?}: {why}")),
        })
        .collect()
}

/// The principal DynamoDB names in `userIdentity` of a deletion made by time to live.
const TTL_PRINCIPAL: &str = "dynamodb.amazonaws.com";

/// Whether a record's `userIdentity` is DynamoDB's time to live (type `Service`, principal
/// `dynamodb.amazonaws.com`), as [`ChangeEvent::from_json`] reads it.
pub(crate) fn removed_by_ttl(identity: Option<&sdk::Identity>) -> bool {
    identity.is_some_and(|i| {
        i.r#type().is_some_and(|t| t.eq_ignore_ascii_case("Service"))
            && i.principal_id() == Some(TTL_PRINCIPAL)
    })
}

/// The millisecond a reply's timestamp names. DynamoDB Streams sends epoch seconds, with
/// millisecond digits (`1791316726.480`); the SDK reads that number through an `f64`, so `.480`
/// may arrive as `.479999…`. Rounding to the nearest millisecond gives back the digits the
/// service sent, where truncating would move the change 1 ms early.
pub(crate) fn nearest_millis(t: &DateTime) -> i64 {
    t.secs()
        .saturating_mul(1000)
        .saturating_add(i64::from((t.subsec_nanos() + 500_000) / 1_000_000))
}

/// One SDK record as a [`ChangeEvent`]. `Err` says what is wrong with it, naming its sequence
/// number when it has a valid one (the call's error message adds the operation and the stream).
/// A record without `eventID` takes its sequence number as id (as [`ChangeEvent::new`] does);
/// one without `ApproximateCreationDateTime` gets 0 (as [`ChangeEvent::from_json`] does).
pub(crate) fn change_event(record: sdk::Record) -> Result<ChangeEvent, String> {
    let sdk::Record { event_id, event_name, dynamodb, user_identity, .. } = record;
    let change = dynamodb.ok_or_else(|| "a record without its change (dynamodb)".to_owned())?;
    let seq_text =
        change.sequence_number.ok_or_else(|| "a record without a sequence number".to_owned())?;
    let seq = SequenceNumber::parse(&seq_text)
        .map_err(|e| format!("a record has a bad sequence number ({e})"))?;
    let event_name = match event_name {
        Some(sdk::OperationType::Insert) => EventName::Insert,
        Some(sdk::OperationType::Modify) => EventName::Modify,
        Some(sdk::OperationType::Remove) => EventName::Remove,
        Some(other) => {
            return Err(format!("record {seq} has an unknown eventName {:?}", other.as_str()))
        }
        None => return Err(format!("record {seq} has no eventName")),
    };
    let in_record = |why: String| format!("record {seq}: {why}");
    let keys = item(change.keys.unwrap_or_default()).map_err(in_record)?;
    let new_image = change.new_image.map(item).transpose().map_err(in_record)?;
    let old_image = change.old_image.map(item).transpose().map_err(in_record)?;
    Ok(ChangeEvent {
        event_id: non_empty(event_id).unwrap_or_else(|| seq.as_str().to_owned()),
        event_name,
        approximate_creation_millis: change
            .approximate_creation_date_time
            .as_ref()
            .map_or(0, nearest_millis),
        keys,
        new_image,
        old_image,
        size_bytes: change.size_bytes,
        stream_view_type: change.stream_view_type.map(|v| v.as_str().to_owned()),
        removed_by_ttl: removed_by_ttl(user_identity.as_ref()),
        sequence_number: seq,
    })
}

/// The newest of a table's streams, given as `(StreamLabel, StreamArn)`: the one with the
/// greatest label. Labels are ISO-8601 timestamps of one format, so they sort as strings.
pub(crate) fn newest_stream(streams: impl IntoIterator<Item = (String, String)>) -> Option<String> {
    streams.into_iter().max().map(|(_, arn)| arn)
}

#[async_trait]
impl Api for SdkApi {
    fn stream_arn(&self) -> &str {
        &self.stream_arn
    }

    async fn describe_stream(&self, request: DescribeRequest) -> Result<StreamPage, ApiError> {
        let req = self.client.describe_stream().stream_arn(&self.stream_arn);
        let req = match request {
            DescribeRequest::Page { exclusive_start } => {
                req.set_exclusive_start_shard_id(non_empty(exclusive_start))
            }
            DescribeRequest::ChildrenOf { parent } => req.shard_filter(
                ShardFilter::builder()
                    .r#type(ShardFilterType::ChildShards)
                    .shard_id(parent)
                    .build(),
            ),
        };
        let out = self.bounded("DescribeStream", req.send()).await?;
        let description = out.stream_description.ok_or_else(|| {
            self.malformed("DescribeStream", "the reply has no StreamDescription")
        })?;
        let shards = description
            .shards
            .unwrap_or_default()
            .into_iter()
            .map(|s| {
                let id = non_empty(s.shard_id)
                    .ok_or_else(|| self.malformed("DescribeStream", "a shard has no ShardId"))?;
                Ok(StreamShard {
                    id,
                    parent: non_empty(s.parent_shard_id),
                    ending_seq: non_empty(
                        s.sequence_number_range.and_then(|r| r.ending_sequence_number),
                    ),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(StreamPage {
            status: stream_status(description.stream_status.as_ref()),
            shards,
            last_evaluated: non_empty(description.last_evaluated_shard_id),
        })
    }

    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError> {
        let req = self.client.get_shard_iterator().stream_arn(&self.stream_arn).shard_id(shard);
        let req = match start {
            IteratorStart::TrimHorizon => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            IteratorStart::Latest => req.shard_iterator_type(ShardIteratorType::Latest),
            IteratorStart::AfterSequence(seq) => {
                req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).sequence_number(seq)
            }
        };
        let out = self.bounded("GetShardIterator", req.send()).await?;
        non_empty(out.shard_iterator).ok_or_else(|| {
            self.malformed("GetShardIterator", &format!("no iterator for shard {shard}"))
        })
    }

    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError> {
        // The iterator stays out of every message: it is long and says nothing to a reader.
        let req = self.client.get_records().shard_iterator(iterator).limit(limit);
        let out = self.bounded("GetRecords", req.send()).await?;
        let records = out
            .records
            .unwrap_or_default()
            .into_iter()
            .map(|r| match change_event(r) {
                Ok(change) => Ok(change.to_raw()),
                Err(why) => Err(ApiError::Other(Error::permanent(format!(
                    "DynamoDB Streams GetRecords on stream {}: {why}",
                    self.stream_arn
                )))),
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(RecordsPage { records, next_iterator: non_empty(out.next_shard_iterator) })
    }
}

/// The ARN of `table`'s current stream: of the streams `ListStreams` names for the table (a
/// disabled stream stays listed for 24 hours, next to the one enabled after it), the one with
/// the greatest `StreamLabel`. Every page is bounded by `timeout`. A table without a stream is
/// a configuration error; failures are classified as the [`SdkApi`] calls' are.
pub(crate) async fn latest_stream_arn(
    client: &Client,
    table: &str,
    timeout: Duration,
) -> shardlease_core::Result<String> {
    let mut streams = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let req =
            client.list_streams().table_name(table).set_exclusive_start_stream_arn(start.clone());
        let out = bounded(timeout, "ListStreams", Target::Table(table), req.send())
            .await
            .map_err(ApiError::into_error)?;
        for s in out.streams.unwrap_or_default() {
            // The filter is the service's; a stream of another table (an emulator that ignores
            // `TableName`) is not this table's stream.
            if s.table_name.as_deref().is_some_and(|t| t != table) {
                continue;
            }
            if let Some(arn) = non_empty(s.stream_arn) {
                streams.push((s.stream_label.unwrap_or_default(), arn));
            }
        }
        match non_empty(out.last_evaluated_stream_arn) {
            // A service that hands back the page it was asked for would page forever.
            Some(next) if start.as_deref() != Some(next.as_str()) => start = Some(next),
            _ => break,
        }
    }
    newest_stream(streams).ok_or_else(|| {
        Error::Config(format!(
            "table {table} has no stream: enable one (StreamSpecification StreamEnabled=true, a \
             StreamViewType) or give the stream's ARN"
        ))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use aws_sdk_dynamodbstreams::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError;
    use aws_sdk_dynamodbstreams::types::error::{
        ExpiredIteratorException, InternalServerError, LimitExceededException,
        ResourceNotFoundException, TrimmedDataAccessException,
    };
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::Blob;

    const ARN: &str =
        "arn:aws:dynamodb:eu-west-1:123456789012:table/t/stream/2024-05-01T00:00:00.000";

    fn blob(b: &[u8]) -> Blob {
        Blob::new(b.to_vec())
    }

    #[test]
    fn every_attribute_type_converts() {
        let cases = vec![
            (sdk::AttributeValue::S("s".into()), AttributeValue::S("s".into())),
            (
                sdk::AttributeValue::N("12345678901234567890123456789012345678".into()),
                AttributeValue::N("12345678901234567890123456789012345678".into()),
            ),
            (
                sdk::AttributeValue::B(blob(b"\x00\xff")),
                AttributeValue::B(Bytes::from_static(b"\x00\xff")),
            ),
            (sdk::AttributeValue::Bool(true), AttributeValue::Bool(true)),
            (sdk::AttributeValue::Null(true), AttributeValue::Null(true)),
            (
                sdk::AttributeValue::Ss(vec!["a".into(), "b".into()]),
                AttributeValue::Ss(vec!["a".into(), "b".into()]),
            ),
            (
                sdk::AttributeValue::Ns(vec!["1".into(), "-2.5".into()]),
                AttributeValue::Ns(vec!["1".into(), "-2.5".into()]),
            ),
            (
                sdk::AttributeValue::Bs(vec![blob(b"x"), blob(b"")]),
                AttributeValue::Bs(vec![Bytes::from_static(b"x"), Bytes::new()]),
            ),
            (
                sdk::AttributeValue::L(vec![
                    sdk::AttributeValue::Bool(false),
                    sdk::AttributeValue::L(vec![sdk::AttributeValue::N("1".into())]),
                ]),
                AttributeValue::L(vec![
                    AttributeValue::Bool(false),
                    AttributeValue::L(vec![AttributeValue::N("1".into())]),
                ]),
            ),
            (
                sdk::AttributeValue::M(HashMap::from([
                    ("z".to_owned(), sdk::AttributeValue::Null(true)),
                    (
                        "a".to_owned(),
                        sdk::AttributeValue::M(HashMap::from([(
                            "b".to_owned(),
                            sdk::AttributeValue::B(blob(b"\x01")),
                        )])),
                    ),
                ])),
                AttributeValue::M(Item::from([
                    ("z".to_owned(), AttributeValue::Null(true)),
                    (
                        "a".to_owned(),
                        AttributeValue::M(Item::from([(
                            "b".to_owned(),
                            AttributeValue::B(Bytes::from_static(b"\x01")),
                        )])),
                    ),
                ])),
            ),
        ];
        for (sdk_value, ours) in cases {
            assert_eq!(attribute(sdk_value.clone()).unwrap(), ours, "{sdk_value:?}");
        }
    }

    #[test]
    fn items_sort_their_attributes() {
        let map = HashMap::from([
            ("b".to_owned(), sdk::AttributeValue::S("2".into())),
            ("a".to_owned(), sdk::AttributeValue::S("1".into())),
        ]);
        let converted = item(map).unwrap();
        assert_eq!(converted.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(item(HashMap::new()).unwrap().is_empty());
    }

    #[test]
    fn a_ttl_deletion_is_told_apart() {
        let ttl = sdk::Identity::builder().r#type("Service").principal_id(TTL_PRINCIPAL).build();
        assert!(removed_by_ttl(Some(&ttl)));
        let lower = sdk::Identity::builder().r#type("service").principal_id(TTL_PRINCIPAL).build();
        assert!(removed_by_ttl(Some(&lower)));
        let user = sdk::Identity::builder().r#type("Service").principal_id("someone").build();
        assert!(!removed_by_ttl(Some(&user)));
        let no_type = sdk::Identity::builder().principal_id(TTL_PRINCIPAL).build();
        assert!(!removed_by_ttl(Some(&no_type)));
        assert!(!removed_by_ttl(None));
    }

    #[test]
    fn error_codes_are_classified() {
        for code in [
            "LimitExceededException",
            "ThrottlingException",
            "RequestLimitExceeded",
            "ProvisionedThroughputExceededException",
        ] {
            assert_eq!(code_class(code), CodeClass::Throttled, "{code}");
        }
        assert_eq!(code_class("ExpiredIteratorException"), CodeClass::ExpiredIterator);
        assert_eq!(code_class("TrimmedDataAccessException"), CodeClass::Trimmed);
        assert_eq!(code_class("ResourceNotFoundException"), CodeClass::NotFound);
        assert_eq!(code_class("InternalServerError"), CodeClass::ServerError);
        assert_eq!(code_class("ValidationException"), CodeClass::Unclassified);
        assert_eq!(code_class(""), CodeClass::Unclassified);
    }

    fn meta(code: &str) -> ErrorMetadata {
        ErrorMetadata::builder().code(code).message("from the service").build()
    }

    fn service(e: GetRecordsError, status: u16) -> SdkError<GetRecordsError, HttpResponse> {
        let status = status.try_into().unwrap();
        SdkError::service_error(e, HttpResponse::new(status, SdkBody::empty()))
    }

    fn classify_records(err: SdkError<GetRecordsError, HttpResponse>) -> ApiError {
        classify("GetRecords", Target::Stream(ARN), err)
    }

    #[test]
    fn failures_are_classified_by_code_and_status() {
        let throttled = GetRecordsError::LimitExceededException(
            LimitExceededException::builder().meta(meta("LimitExceededException")).build(),
        );
        match classify_records(service(throttled, 400)) {
            ApiError::Throttled(e) => {
                assert!(e.is_retryable());
                let text = e.to_string();
                assert!(text.contains("GetRecords"), "{text}");
                assert!(text.contains(ARN), "{text}");
                assert!(text.contains("LimitExceededException: from the service"), "{text}");
            }
            other => panic!("{other:?}"),
        }

        let expired = GetRecordsError::ExpiredIteratorException(
            ExpiredIteratorException::builder().meta(meta("ExpiredIteratorException")).build(),
        );
        assert!(matches!(classify_records(service(expired, 400)), ApiError::ExpiredIterator));

        let trimmed = GetRecordsError::TrimmedDataAccessException(
            TrimmedDataAccessException::builder().meta(meta("TrimmedDataAccessException")).build(),
        );
        assert!(
            matches!(classify_records(service(trimmed, 400)), ApiError::Trimmed(e) if !e.is_retryable())
        );

        let missing = GetRecordsError::ResourceNotFoundException(
            ResourceNotFoundException::builder().meta(meta("ResourceNotFoundException")).build(),
        );
        assert!(
            matches!(classify_records(service(missing, 400)), ApiError::NotFound(e) if !e.is_retryable())
        );

        let internal = GetRecordsError::InternalServerError(
            InternalServerError::builder().meta(meta("InternalServerError")).build(),
        );
        assert!(
            matches!(classify_records(service(internal, 500)), ApiError::Other(e) if e.is_retryable())
        );

        // A generic throttling code (what a gateway in front may send) is still throttling.
        let generic = GetRecordsError::generic(meta("ThrottlingException"));
        assert!(matches!(classify_records(service(generic, 400)), ApiError::Throttled(_)));

        let unknown = GetRecordsError::generic(meta("SomethingNew"));
        assert!(
            matches!(classify_records(service(unknown, 503)), ApiError::Other(e) if e.is_retryable())
        );
        let unknown = GetRecordsError::generic(meta("ValidationException"));
        assert!(
            matches!(classify_records(service(unknown, 400)), ApiError::Other(e) if !e.is_retryable())
        );

        let timeout: SdkError<GetRecordsError, HttpResponse> = SdkError::timeout_error("slow");
        assert!(matches!(classify_records(timeout), ApiError::Other(e) if e.is_retryable()));
        let io = ConnectorError::io(Box::new(std::io::Error::other("connection reset")));
        let dispatch: SdkError<GetRecordsError, HttpResponse> = SdkError::dispatch_failure(io);
        assert!(matches!(classify_records(dispatch), ApiError::Other(e) if e.is_retryable()));
        let bad: SdkError<GetRecordsError, HttpResponse> = SdkError::construction_failure("bad");
        match classify_records(bad) {
            ApiError::Other(e) => {
                assert!(!e.is_retryable());
                assert!(e.to_string().contains(ARN), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_outlives_its_timeout_is_retryable() {
        let never = std::future::pending::<Result<(), SdkError<GetRecordsError, HttpResponse>>>();
        let err = bounded(Duration::from_secs(3), "GetRecords", Target::Stream(ARN), never)
            .await
            .unwrap_err();
        match err {
            ApiError::Other(e) => {
                assert!(e.is_retryable());
                assert!(e.to_string().contains("GetRecords on stream arn:aws:dynamodb"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stream_statuses_map_and_the_unknown_read_as_enabled() {
        assert_eq!(stream_status(Some(&sdk::StreamStatus::Enabling)), StreamStatus::Enabling);
        assert_eq!(stream_status(Some(&sdk::StreamStatus::Enabled)), StreamStatus::Enabled);
        assert_eq!(stream_status(Some(&sdk::StreamStatus::Disabling)), StreamStatus::Disabling);
        assert_eq!(stream_status(Some(&sdk::StreamStatus::Disabled)), StreamStatus::Disabled);
        assert_eq!(
            stream_status(Some(&sdk::StreamStatus::from("ARCHIVED"))),
            StreamStatus::Enabled
        );
        assert_eq!(stream_status(None), StreamStatus::Enabled);
    }

    #[test]
    fn creation_times_keep_the_millisecond_the_service_sent() {
        for millis in
            [1_791_316_726_480_i64, 1_791_316_726_001, 1_791_316_726_999, 1_791_316_726_000]
        {
            let parsed = DateTime::from_secs_f64(millis as f64 / 1000.0);
            assert_eq!(nearest_millis(&parsed), millis);
        }
        assert_eq!(nearest_millis(&DateTime::from_secs(1_700_000_000)), 1_700_000_000_000);
    }

    fn sdk_record(name: sdk::OperationType, seq: &str) -> sdk::Record {
        sdk::Record::builder()
            .event_id("e1")
            .event_name(name)
            .dynamodb(
                sdk::StreamRecord::builder()
                    .approximate_creation_date_time(DateTime::from_millis(1_700_000_000_123))
                    .keys("pk", sdk::AttributeValue::S("a".into()))
                    .new_image("pk", sdk::AttributeValue::S("a".into()))
                    .new_image("n", sdk::AttributeValue::N("7".into()))
                    .sequence_number(seq)
                    .size_bytes(42)
                    .stream_view_type(sdk::StreamViewType::NewAndOldImages)
                    .build(),
            )
            .build()
    }

    #[test]
    fn a_record_becomes_a_change() {
        let c = change_event(sdk_record(sdk::OperationType::Modify, "000100000000000000001234"))
            .unwrap();
        assert_eq!(c.event_id, "e1");
        assert_eq!(c.event_name, EventName::Modify);
        assert_eq!(c.sequence_number.as_str(), "100000000000000001234");
        assert_eq!(c.approximate_creation_millis, 1_700_000_000_123);
        assert_eq!(c.keys, Item::from([("pk".to_owned(), AttributeValue::S("a".into()))]));
        assert_eq!(c.new_image.as_ref().map(Item::len), Some(2));
        assert_eq!(c.old_image, None);
        assert_eq!(c.size_bytes, Some(42));
        assert_eq!(c.stream_view_type.as_deref(), Some("NEW_AND_OLD_IMAGES"));
        assert!(!c.removed_by_ttl);
        let raw = c.to_raw();
        assert_eq!(raw.keys, r#"{"pk":{"S":"a"}}"#);
        assert_eq!(ChangeEvent::from_json(&raw.json).unwrap(), c);

        let mut ttl = sdk_record(sdk::OperationType::Remove, "5");
        ttl.user_identity =
            Some(sdk::Identity::builder().r#type("Service").principal_id(TTL_PRINCIPAL).build());
        ttl.event_id = None;
        let c = change_event(ttl).unwrap();
        assert!(c.removed_by_ttl);
        assert_eq!(c.event_id, "5");
    }

    #[test]
    fn a_bad_record_is_an_error_naming_its_sequence_number() {
        let why = change_event(sdk_record(sdk::OperationType::from("UPSERT"), "77")).unwrap_err();
        assert!(why.contains("77") && why.contains("UPSERT"), "{why}");
        let why = change_event(sdk_record(sdk::OperationType::Insert, "x1")).unwrap_err();
        assert!(why.contains("sequence number"), "{why}");
        let mut no_seq = sdk_record(sdk::OperationType::Insert, "1");
        no_seq.dynamodb = no_seq.dynamodb.map(|mut d| {
            d.sequence_number = None;
            d
        });
        assert!(change_event(no_seq).is_err());
        let mut no_change = sdk_record(sdk::OperationType::Insert, "1");
        no_change.dynamodb = None;
        assert!(change_event(no_change).is_err());
        let mut no_name = sdk_record(sdk::OperationType::Insert, "1");
        no_name.event_name = None;
        assert!(change_event(no_name).is_err());
    }

    #[test]
    fn the_newest_stream_is_the_greatest_label() {
        let streams = vec![
            ("2024-05-01T00:00:00.000".to_owned(), "arn-old".to_owned()),
            ("2025-01-02T03:04:05.678".to_owned(), "arn-new".to_owned()),
            ("2024-12-31T23:59:59.999".to_owned(), "arn-mid".to_owned()),
        ];
        assert_eq!(newest_stream(streams).as_deref(), Some("arn-new"));
        assert_eq!(newest_stream(Vec::new()), None);
    }
}
