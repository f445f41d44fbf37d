//! How a DynamoDB Streams source lists and reads: batch size, call pacing, backoff, what to do
//! with trimmed data, and the `DescribeStream` budget. Defaults follow the service's limits;
//! every knob is validated when the source is built.

use std::time::Duration;

use rand::Rng;
use shardlease_core::{Error, Result};

/// The largest `Limit` DynamoDB Streams' `GetRecords` accepts.
pub const MAX_RECORDS_LIMIT: i32 = 1000;

/// What the reader does when the records it must read next are past the stream's 24 h
/// retention (`TrimmedDataAccessException`, or a shard deleted after every record in it expired).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnTrimmed {
    /// Fail the read, every time, with an error saying the records are gone (the default): the
    /// lease does not move on until an operator decides, and the metric
    /// `shardlease_dynamodb_streams_trimmed_total` counts each refusal.
    #[default]
    Fail,
    /// Skip to the oldest record still kept (`TRIM_HORIZON`), logging an ERROR and counting it
    /// (`shardlease_dynamodb_streams_trimmed_total`, `action="skipped"`). Records are lost.
    SkipToTrimHorizon,
}

/// Reading and listing settings of a
/// [`DynamoDbStreamsSource`](crate::DynamoDbStreamsSource).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadConfig {
    /// Records per `GetRecords` call (1 ..= 1000; default 1000).
    pub max_records: i32,
    /// Least time between two `GetRecords` calls on one shard (default 250 ms).
    pub min_call_interval: Duration,
    /// Wait after a read that found nothing new in an open shard (default 1 s, the KCL
    /// adapter's `idleTimeBetweenReadsInMillis`).
    pub idle_interval: Duration,
    /// First wait after a throttled call; doubles per throttled call up to
    /// [`ReadConfig::max_backoff`], with jitter (default 200 ms).
    pub base_backoff: Duration,
    /// Longest wait between retries (default 10 s).
    pub max_backoff: Duration,
    /// Retryable failures other than throttling retried by the reader in a row before it hands
    /// the error to the runtime (default 5).
    pub max_retries: u32,
    /// Timeout of every call to the service (default 10 s).
    pub operation_timeout: Duration,
    /// `DescribeStream` calls per second this source makes at most, across every lease of the
    /// worker (default 5; the service allows 10 per second per account and region).
    pub describe_calls_per_second: u32,
    /// A full listing of the stream younger than this is reused instead of listing again
    /// (default 1 s): readers of many shards that end together share one listing.
    pub listing_max_age: Duration,
    /// How long a finished shard waits before asking again for children that are not listed
    /// yet (default 1 s). DynamoDB closes a shard before it lists the shard's child; a leaf is
    /// never finished early while the stream is enabled.
    pub children_retry_interval: Duration,
    /// What to do when the next records are past retention (default: fail loudly).
    pub on_trimmed: OnTrimmed,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            max_records: MAX_RECORDS_LIMIT,
            min_call_interval: Duration::from_millis(250),
            idle_interval: Duration::from_secs(1),
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            max_retries: 5,
            operation_timeout: Duration::from_secs(10),
            describe_calls_per_second: 5,
            listing_max_age: Duration::from_secs(1),
            children_retry_interval: Duration::from_secs(1),
            on_trimmed: OnTrimmed::Fail,
        }
    }
}

/// Longest duration any knob accepts (a day).
const MAX_DURATION: Duration = Duration::from_secs(86_400);

impl ReadConfig {
    /// Exponential backoff with jitter for the `attempt`-th retry in a row (from 1): a random
    /// wait in [d/2, d], d = base·2^(attempt-1) ≤ max.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let d = self.base_backoff.saturating_mul(1 << exp).min(self.max_backoff);
        let half = d / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// The least time between two `DescribeStream` calls of one source.
    pub(crate) fn describe_gap(&self) -> Duration {
        Duration::from_secs(1) / self.describe_calls_per_second.max(1)
    }

    /// Checks every knob; the source refuses to build with an invalid one.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_RECORDS_LIMIT).contains(&self.max_records) {
            return Err(Error::Config(format!(
                "max_records must be 1 to {MAX_RECORDS_LIMIT}, got {}",
                self.max_records
            )));
        }
        if !(1..=1000).contains(&self.describe_calls_per_second) {
            return Err(Error::Config(format!(
                "describe_calls_per_second must be 1 to 1000, got {}",
                self.describe_calls_per_second
            )));
        }
        for (name, d) in [
            ("min_call_interval", self.min_call_interval),
            ("idle_interval", self.idle_interval),
            ("base_backoff", self.base_backoff),
            ("max_backoff", self.max_backoff),
            ("operation_timeout", self.operation_timeout),
            ("listing_max_age", self.listing_max_age),
            ("children_retry_interval", self.children_retry_interval),
        ] {
            if d > MAX_DURATION {
                return Err(Error::Config(format!("{name} must be at most a day, got {d:?}")));
            }
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::Config("operation_timeout must be positive".into()));
        }
        if self.children_retry_interval.is_zero() {
            return Err(Error::Config("children_retry_interval must be positive".into()));
        }
        if self.base_backoff.is_zero() || self.max_backoff < self.base_backoff {
            return Err(Error::Config(
                "base_backoff must be positive and at most max_backoff".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_knobs_are_refused() {
        assert!(ReadConfig::default().validate().is_ok());
        let bad = [
            ReadConfig { max_records: 0, ..ReadConfig::default() },
            ReadConfig { max_records: 1001, ..ReadConfig::default() },
            ReadConfig { describe_calls_per_second: 0, ..ReadConfig::default() },
            ReadConfig { operation_timeout: Duration::ZERO, ..ReadConfig::default() },
            ReadConfig { children_retry_interval: Duration::ZERO, ..ReadConfig::default() },
            ReadConfig { idle_interval: Duration::MAX, ..ReadConfig::default() },
            ReadConfig { base_backoff: Duration::from_secs(20), ..ReadConfig::default() },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{c:?}");
        }
    }
}
