//! The names of the metrics the Kinesis source emits, in one place (the core's own are in
//! `shardlease_core::telemetry`). All go through the `metrics` facade; docs/kinesis.md lists them
//! with their labels.

/// Label: the stream's name.
pub const STREAM: &str = "stream";
/// Label: the shard id.
pub const SHARD: &str = "shard";
/// Label: why a subscription was restarted (`session_end`, `empty_session`, `quiet`, `error`,
/// `in_use`).
pub const REASON: &str = "reason";

/// Gauge `{stream, shard}`: how far behind the tip of the shard the last read was, in ms.
pub const MILLIS_BEHIND_GAUGE: &str = "shardlease_kinesis_millis_behind_latest";
/// Counter: `GetRecords` calls made (polling).
pub const GET_RECORDS: &str = "shardlease_kinesis_get_records_total";
/// Counter: calls the service throttled.
pub const THROTTLED: &str = "shardlease_kinesis_throttled_total";
/// Counter: shard iterators renewed after expiring (polling).
pub const ITERATOR_RENEWALS: &str = "shardlease_kinesis_iterator_renewals_total";
/// Counter: KPL aggregates that did not check out and were delivered raw.
pub const MALFORMED_AGGREGATES: &str = "shardlease_kinesis_malformed_aggregates_total";
/// Counter `{stream, shard}`: user records of KPL aggregates whose hash key lies outside the
/// shard's hash range (delivered unless `skip_out_of_range_user_records` is set).
pub const OUT_OF_RANGE_USER_RECORDS: &str = "shardlease_kinesis_out_of_range_user_records_total";
/// Counter `{stream, shard}`: `SubscribeToShard` calls that opened a subscription (fan-out).
pub const SUBSCRIPTIONS: &str = "shardlease_kinesis_subscriptions_total";
/// Counter `{reason}`: subscriptions ended and opened again (fan-out).
pub const SUBSCRIPTION_RESTARTS: &str = "shardlease_kinesis_subscription_restarts_total";
