//! [`KinesisSource`]: the [`ShardSource`] of one Kinesis data stream.
//!
//! Listing pages through `ListShards`; opening a shard gets an iterator for the position (or,
//! with enhanced fan-out, subscribes at it) and starts a [`KinesisReader`]. Positions map to
//! iterators (and subscription starting positions) as follows:
//!
//! | position | iterator | delivered |
//! |---|---|---|
//! | `TrimHorizon` | `TRIM_HORIZON` | everything still retained |
//! | `Latest` | `LATEST` | records written after the open; pinned (below) |
//! | `AtTimestamp(t)` | `AT_TIMESTAMP` t | records that arrived at or after t |
//! | `Sequence { seq, sub }` | `AT_SEQUENCE_NUMBER` seq | user records after (seq, sub) |
//! | `ShardEnd` | none | the shard's end at once |
//!
//! A checkpoint names the last user record processed, so resuming reads that Kinesis record again
//! and skips its user records up to `sub`: this resumes exactly inside a KPL aggregate and costs
//! one record for plain ones.
//!
//! **Pinning `LATEST`.** Opening at `LATEST` reads once (or takes the first event) right away. If that read found records,
//! the reader reports `AT_TIMESTAMP` of the first one's arrival as its resolved start (every
//! record after the iterator arrived at or after it); if it found none, `AT_TIMESTAMP` of the
//! opening minus [`ReadConfig::latest_pin_margin`]. Either way a lease that moves before its first
//! checkpoint resumes at or before where its first owner started: some records may be read twice,
//! none is skipped. `AT_TIMESTAMP` is already a fixed position and is reported as is.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use shardlease_core::{
    Error, HashRange, LeaseKey, Position, Result, SequenceNumber, ShardInfo, ShardReader,
    ShardSource,
};

use crate::api::{Api, ApiError, IteratorStart, StreamRef};
use crate::builder::KinesisSourceBuilder;
use crate::config::ReadConfig;
use crate::convert::Unpacker;
use crate::fanout::subscriber::Subscriber;
use crate::fanout::{consumer, FanOut, FanOutConfig};
use crate::fetcher::Fetcher;
use crate::listing::list_all;
use crate::reader::KinesisReader;

/// A Kinesis data stream as a [`ShardSource`]. Cheap to share behind an `Arc`.
///
/// Build one with [`KinesisSource::builder`] (the AWS default configuration chain, with optional
/// region, endpoint and credentials overrides) or [`KinesisSourceBuilder::client`] to use an SDK
/// client of your own.
pub struct KinesisSource {
    api: Arc<dyn Api>,
    stream: StreamRef,
    config: Arc<ReadConfig>,
    /// Hash ranges of the shards seen in listings, for the out-of-range rule of de-aggregated
    /// records.
    ranges: Mutex<HashMap<LeaseKey, Option<HashRange>>>,
    /// Enhanced fan-out: the consumer and its calls; `None` when polling.
    fan_out: Option<FanOut>,
}

impl fmt::Debug for KinesisSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSource")
            .field("stream", &self.stream)
            .field("config", &self.config)
            .field("fan_out", &self.fan_out.as_ref().map(|f| (&f.config, &f.consumer_arn)))
            .finish_non_exhaustive()
    }
}

impl KinesisSource {
    /// A builder for the stream named `stream` (a name, or an ARN starting with `arn:`).
    pub fn builder(stream: impl Into<String>) -> KinesisSourceBuilder {
        KinesisSourceBuilder::new(stream.into())
    }

    pub(crate) fn with_api(
        api: Arc<dyn Api>,
        stream: StreamRef,
        config: ReadConfig,
    ) -> Result<Self> {
        config.validate()?;
        Ok(KinesisSource {
            api,
            stream,
            config: Arc::new(config),
            ranges: Mutex::new(HashMap::new()),
            fan_out: None,
        })
    }

    /// Reads through enhanced fan-out as the consumer `consumer_arn`.
    pub(crate) fn with_fan_out(mut self, fan_out: FanOut) -> Self {
        self.fan_out = Some(fan_out);
        self
    }

    /// The enhanced fan-out settings, when this source subscribes instead of polling.
    pub fn fan_out_config(&self) -> Option<&FanOutConfig> {
        self.fan_out.as_ref().map(|f| &*f.config)
    }

    /// The ARN of the stream consumer this source subscribes as (enhanced fan-out only).
    pub fn consumer_arn(&self) -> Option<&str> {
        self.fan_out.as_ref().map(|f| f.consumer_arn.as_str())
    }

    /// Deregisters this source's stream consumer (enhanced fan-out only; `Ok(false)` when it was
    /// not registered any more). Every application reading the stream through that consumer
    /// loses its subscriptions: call it only when the application is retired, never as part of
    /// a worker's shutdown. See also
    /// [`KinesisSourceBuilder::deregister_consumer`] (no source needed).
    pub async fn deregister_consumer(&self) -> Result<bool> {
        match &self.fan_out {
            Some(f) => consumer::deregister(&*f.api, &f.config.consumer_name).await,
            None => Err(Error::Config(
                "this Kinesis source polls; it has no stream consumer to deregister".into(),
            )),
        }
    }

    /// The stream this source reads.
    pub fn stream(&self) -> &StreamRef {
        &self.stream
    }

    /// The reading limits and timings.
    pub fn read_config(&self) -> &ReadConfig {
        &self.config
    }

    fn remember(&self, shards: &[ShardInfo]) {
        let mut ranges = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        for s in shards {
            ranges.insert(s.id.clone(), s.hash_range.clone());
        }
    }

    /// The shard's hash range, listing the stream when it was not seen yet.
    async fn range_of(&self, shard: &LeaseKey) -> Result<Option<HashRange>> {
        let known = self.ranges.lock().unwrap_or_else(|p| p.into_inner()).get(shard).cloned();
        if let Some(r) = known {
            return Ok(r);
        }
        let shards = self.list_shards().await?;
        match shards.iter().find(|s| &s.id == shard) {
            Some(s) => Ok(s.hash_range.clone()),
            None => Err(Error::InvalidInput(format!(
                "shard {shard} is not listed by stream {}",
                self.stream.label()
            ))),
        }
    }

    fn fetcher(
        &self,
        shard: &LeaseKey,
        range: Option<HashRange>,
        iterator: String,
        resume: IteratorStart,
        skip_through: Option<(SequenceNumber, u64)>,
    ) -> Fetcher {
        Fetcher::new(
            self.api.clone(),
            self.config.clone(),
            self.stream.label().to_owned(),
            shard.clone(),
            range,
            Some(iterator),
            resume,
            skip_through,
        )
    }
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[async_trait]
impl ShardSource for KinesisSource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        let shards = list_all(&*self.api, self.config.list_page_size).await?;
        self.remember(&shards);
        Ok(shards)
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        if from.is_shard_end() {
            let children = self
                .list_shards()
                .await?
                .into_iter()
                .filter(|s| s.parents.contains(shard))
                .collect();
            return Ok(Box::new(KinesisReader::at_end(shard.clone(), children)));
        }
        let range = if self.config.deaggregate { self.range_of(shard).await? } else { None };
        if let Some(fan) = &self.fan_out {
            return self.subscribe(fan.clone(), shard, from, range).await;
        }
        let (start, skip) = start_of(from);
        let opened_at = now_millis();
        let iterator = self
            .api
            .get_shard_iterator(shard.as_str(), &start)
            .await
            .map_err(ApiError::into_error)?;
        let mut fetcher = self.fetcher(shard, range, iterator, start, skip);
        let (first, resolved) = match from {
            Position::Latest => {
                // Bounded: a throttled shard must not hold the open (and the lease task) for
                // long; the runtime retries the open after a pause.
                let bound = self.config.operation_timeout.saturating_mul(2);
                let first = tokio::time::timeout(bound, fetcher.next()).await.map_err(|_| {
                    Error::retryable(format!("the first read of shard {shard} at LATEST timed out"))
                })??;
                let pin = fetcher.first_arrival().unwrap_or_else(|| {
                    let margin = i64::try_from(self.config.latest_pin_margin.as_millis())
                        .unwrap_or(i64::MAX);
                    opened_at.saturating_sub(margin)
                });
                fetcher.renew_before_first_record_at(IteratorStart::AtTimestamp(pin));
                (first, Some(Position::AtTimestamp { millis: pin }))
            }
            Position::AtTimestamp { .. } => (None, Some(from.clone())),
            _ => (None, None),
        };
        Ok(Box::new(KinesisReader::spawn(shard.clone(), fetcher, first, resolved)))
    }
}

impl KinesisSource {
    /// Opens `shard` through enhanced fan-out. The first subscription is made by the reader
    /// (so `ResourceInUseException` is waited out there), except at `LATEST`: the first event
    /// is taken here to pin the start, as polling pins it with its first read.
    async fn subscribe(
        &self,
        fan: FanOut,
        shard: &LeaseKey,
        from: &Position,
        range: Option<HashRange>,
    ) -> Result<Box<dyn ShardReader>> {
        let (start, skip) = start_of(from);
        let unpacker =
            Unpacker::new(self.stream.label().to_owned(), shard.clone(), range, &self.config, skip);
        let mut sub = Subscriber::new(
            fan,
            self.api.clone(),
            self.config.clone(),
            self.stream.label().to_owned(),
            shard.clone(),
            unpacker,
            start,
        );
        let opened_at = now_millis();
        let (first, resolved) = match from {
            Position::Latest => {
                let f = sub.fan_config().quiet_timeout.max(self.config.operation_timeout);
                let bound = f.saturating_mul(2);
                let first =
                    tokio::time::timeout(bound, sub.next_event()).await.map_err(|_| {
                        Error::retryable(format!(
                            "the first event of shard {shard} at LATEST did not come in time"
                        ))
                    })??;
                let pin = sub.first_arrival().unwrap_or_else(|| {
                    let margin = i64::try_from(self.config.latest_pin_margin.as_millis())
                        .unwrap_or(i64::MAX);
                    opened_at.saturating_sub(margin)
                });
                sub.renew_before_first_event_at(IteratorStart::AtTimestamp(pin));
                (first, Some(Position::AtTimestamp { millis: pin }))
            }
            Position::AtTimestamp { .. } => (None, Some(from.clone())),
            _ => (None, None),
        };
        Ok(Box::new(KinesisReader::spawn(shard.clone(), sub, first, resolved)))
    }
}

/// Where reading starts for a position, and what of that first record a checkpoint covers.
fn start_of(from: &Position) -> (IteratorStart, Option<(SequenceNumber, u64)>) {
    match from {
        Position::TrimHorizon => (IteratorStart::TrimHorizon, None),
        Position::Latest => (IteratorStart::Latest, None),
        Position::AtTimestamp { millis } => (IteratorStart::AtTimestamp(*millis), None),
        Position::Sequence { seq, sub } => {
            (IteratorStart::AtSequence(seq.as_str().to_owned()), Some((seq.clone(), *sub)))
        }
        // Handled before any reading starts.
        Position::ShardEnd => (IteratorStart::TrimHorizon, None),
    }
}
