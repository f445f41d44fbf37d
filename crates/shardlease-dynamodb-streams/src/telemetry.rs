//! The names of the metrics the DynamoDB Streams source emits, in one place (the core's own are
//! in `shardlease_core::telemetry`, among them the per-shard lag gauge this source feeds). All
//! go through the `metrics` facade; docs/dynamodb-streams.md lists them.

/// Label: the stream's table name.
pub const TABLE: &str = "table";
/// Label: the shard id.
pub const SHARD: &str = "shard";
/// Label: what was done about trimmed records (`failed`, `skipped`).
pub const ACTION: &str = "action";
/// Label: which kind of `DescribeStream` call (`page`, `children`).
pub const KIND: &str = "kind";

/// Counter `{kind}`: `DescribeStream` calls made (paced by `describe_calls_per_second`).
pub const DESCRIBE_STREAM: &str = "shardlease_dynamodb_streams_describe_stream_total";
/// Counter: `GetRecords` calls made.
pub const GET_RECORDS: &str = "shardlease_dynamodb_streams_get_records_total";
/// Counter: calls the service throttled.
pub const THROTTLED: &str = "shardlease_dynamodb_streams_throttled_total";
/// Counter: shard iterators renewed after expiring.
pub const ITERATOR_RENEWALS: &str = "shardlease_dynamodb_streams_iterator_renewals_total";
/// Counter `{table, shard, action}`: reads that found their next records past the stream's retention.
pub const TRIMMED: &str = "shardlease_dynamodb_streams_trimmed_total";
/// Counter: times a finished shard asked for children that were not listed yet.
pub const CHILDREN_NOT_LISTED_YET: &str =
    "shardlease_dynamodb_streams_children_not_listed_yet_total";
/// Gauge `{table, shard}`: the age in ms of the newest change the last read returned, 0 after a
/// read that found nothing new in an open shard (the service has no `MillisBehindLatest`).
pub const CHANGE_AGE: &str = "shardlease_dynamodb_streams_change_age_millis";
