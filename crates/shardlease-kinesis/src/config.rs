//! How a Kinesis source reads: batch size, the per-shard call and byte limits, idle and throttle
//! backoff, timeouts, listing page size and de-aggregation. Defaults follow the service limits
//! and the KCL's defaults; every knob is validated when the source is built.

use std::time::Duration;

use rand::Rng;
use shardlease_core::{Error, Result};

/// The largest `Limit` `GetRecords` accepts.
pub const MAX_RECORDS_LIMIT: i32 = 10_000;

/// Reading limits and timings of a [`KinesisSource`](crate::KinesisSource).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadConfig {
    /// Records per `GetRecords` call (1 ..= 10 000; default 10 000).
    pub max_records: i32,
    /// Least time between two `GetRecords` calls on one shard (default 200 ms: the service allows
    /// 5 calls per second per shard, shared by every consumer of the stream).
    pub min_call_interval: Duration,
    /// Bytes per second read from one shard (default 2 MiB, the service's per-shard limit). After
    /// a large batch the next call waits until the average falls back under it.
    pub max_bytes_per_second: u64,
    /// Wait after a read that found nothing new at the tip of the shard (default 1 s).
    pub idle_interval: Duration,
    /// First wait after a throttled call; doubles per throttled call up to
    /// [`ReadConfig::max_backoff`], with full jitter (default 200 ms).
    pub base_backoff: Duration,
    /// Longest wait between retries (default 10 s).
    pub max_backoff: Duration,
    /// Retryable failures other than throttling (timeouts, 5xx) retried by the reader in a row
    /// before it hands the error to the runtime (default 5).
    pub max_retries: u32,
    /// Timeout of every call to the service (default 10 s). Real Kinesis answers far sooner; the
    /// emulators never answer some calls (`AT_TIMESTAMP` past the last record).
    pub operation_timeout: Duration,
    /// `MaxResults` of each `ListShards` page (default: the service's default, 1000).
    pub list_page_size: Option<i32>,
    /// Unpack KPL aggregated records (default true). When false, aggregates are delivered raw.
    pub deaggregate: bool,
    /// For a reader opened at `LATEST` whose first read found no record: how far before the
    /// opening (on this machine's clock) its pinned `AT_TIMESTAMP` start lies, to cover clock
    /// skew with the service (default 60 s). A lease that changes hands before its first record
    /// re-reads at most this much; it never skips a record.
    pub latest_pin_margin: Duration,
    /// Skip the user records of a KPL aggregate whose hash key lies outside the shard's hash
    /// range, as the KCL does (default false: they are delivered). They exist only in the shard
    /// the aggregate landed on, so skipping loses them; each skip is logged as a warning. Either
    /// way they are counted (`shardlease_kinesis_out_of_range_user_records_total`).
    pub skip_out_of_range_user_records: bool,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            max_records: MAX_RECORDS_LIMIT,
            min_call_interval: Duration::from_millis(200),
            max_bytes_per_second: 2 * 1024 * 1024,
            idle_interval: Duration::from_secs(1),
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            max_retries: 5,
            operation_timeout: Duration::from_secs(10),
            list_page_size: None,
            deaggregate: true,
            latest_pin_margin: Duration::from_secs(60),
            skip_out_of_range_user_records: false,
        }
    }
}

/// Longest duration any knob accepts (a day): long enough for any real use, short enough that
/// adding it to an `Instant` never overflows.
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

    /// Checks every knob; the source refuses to build with an invalid one.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_RECORDS_LIMIT).contains(&self.max_records) {
            return Err(Error::Config(format!(
                "max_records must be 1 to {MAX_RECORDS_LIMIT}, got {}",
                self.max_records
            )));
        }
        if let Some(n) = self.list_page_size {
            if !(1..=10_000).contains(&n) {
                return Err(Error::Config(format!("list_page_size must be 1 to 10000, got {n}")));
            }
        }
        if self.max_bytes_per_second == 0 {
            return Err(Error::Config("max_bytes_per_second must be positive".into()));
        }
        for (name, d) in [
            ("min_call_interval", self.min_call_interval),
            ("idle_interval", self.idle_interval),
            ("base_backoff", self.base_backoff),
            ("max_backoff", self.max_backoff),
            ("operation_timeout", self.operation_timeout),
            ("latest_pin_margin", self.latest_pin_margin),
        ] {
            if d > MAX_DURATION {
                return Err(Error::Config(format!("{name} must be at most a day, got {d:?}")));
            }
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::Config("operation_timeout must be positive".into()));
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
            ReadConfig { max_records: 10_001, ..ReadConfig::default() },
            ReadConfig { list_page_size: Some(0), ..ReadConfig::default() },
            ReadConfig { max_bytes_per_second: 0, ..ReadConfig::default() },
            ReadConfig { operation_timeout: Duration::ZERO, ..ReadConfig::default() },
            ReadConfig { idle_interval: Duration::MAX, ..ReadConfig::default() },
            ReadConfig { base_backoff: Duration::from_secs(20), ..ReadConfig::default() },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{c:?}");
        }
    }
}
