//! Enhanced fan-out: a registered stream consumer and one `SubscribeToShard` subscription per
//! leased shard, instead of polling `GetRecords`.
//!
//! - [`FanOutConfig`]: the consumer's name and the subscription timings.
//! - [`consumer`]: register the consumer or find it, wait until it is `ACTIVE`; deregister it
//!   (only ever on request).
//! - [`subscriber`]: the per-shard subscription loop the read-ahead task pulls batches from.

pub(crate) mod consumer;
pub(crate) mod subscriber;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Error, Result};

use crate::api::FanOutApi;

/// Enhanced fan-out settings of a [`KinesisSource`](crate::KinesisSource); see
/// [`KinesisSourceBuilder::enhanced_fan_out`](crate::KinesisSourceBuilder::enhanced_fan_out).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FanOutConfig {
    /// The stream consumer's name: one per application (every worker of the application uses
    /// the same name). 1 to 128 characters of `a-z A-Z 0-9 _ . -`.
    pub consumer_name: String,
    /// A subscription that delivers no event for this long is dropped and opened again, after
    /// a backoff with jitter (default 30 s). Kinesis keeps sending events (with no records) on
    /// an idle shard.
    pub quiet_timeout: Duration,
    /// How long building the source waits for the consumer to become `ACTIVE` (default 2 min).
    pub consumer_wait: Duration,
    /// How often the consumer's state is read while waiting for it (default 1 s).
    pub consumer_poll_interval: Duration,
}

impl FanOutConfig {
    /// Defaults for the consumer `consumer_name`.
    pub fn new(consumer_name: impl Into<String>) -> Self {
        FanOutConfig {
            consumer_name: consumer_name.into(),
            quiet_timeout: Duration::from_secs(30),
            consumer_wait: Duration::from_secs(120),
            consumer_poll_interval: Duration::from_secs(1),
        }
    }

    /// Checks every knob; the source refuses to build with an invalid one.
    pub fn validate(&self) -> Result<()> {
        let n = &self.consumer_name;
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if n.is_empty() || n.len() > 128 || !n.chars().all(valid) {
            return Err(Error::Config(format!(
                "the consumer name must be 1 to 128 characters of a-z A-Z 0-9 _ . -, got {n:?}"
            )));
        }
        for (name, d) in [
            ("quiet_timeout", self.quiet_timeout),
            ("consumer_wait", self.consumer_wait),
            ("consumer_poll_interval", self.consumer_poll_interval),
        ] {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(Error::Config(format!(
                    "{name} must be positive and at most a day, got {d:?}"
                )));
            }
        }
        Ok(())
    }
}

/// What a fan-out source holds: the calls, the settings, and the consumer it subscribes as.
#[derive(Debug, Clone)]
pub(crate) struct FanOut {
    pub api: Arc<dyn FanOutApi>,
    pub config: Arc<FanOutConfig>,
    pub consumer_arn: String,
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn consumer_names_and_timings_are_validated() {
        assert!(FanOutConfig::new("orders-app_1.v2").validate().is_ok());
        for bad in ["", "has space", "slash/", &"x".repeat(129)] {
            assert!(matches!(FanOutConfig::new(bad).validate(), Err(Error::Config(_))), "{bad}");
        }
        let mut c = FanOutConfig::new("app");
        c.quiet_timeout = Duration::ZERO;
        assert!(matches!(c.validate(), Err(Error::Config(_))));
    }
}
