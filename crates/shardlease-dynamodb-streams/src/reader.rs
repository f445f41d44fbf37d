//! [`StreamsReader`]: the [`ShardReader`] of one DynamoDB Streams shard.
//!
//! - **Pacing.** A full page (`max_records`) is followed at once by the next call (a backlog is
//!   read at the service's speed); a partial page waits `min_call_interval`, an empty one
//!   `idle_interval`.
//! - **Throttling** backs off exponentially with jitter, without limit; **other retryable
//!   failures** are retried `max_retries` times in a row, then handed to the runtime (which
//!   reopens the shard after a pause).
//! - **Iterator expiry.** An expired iterator is renewed `AFTER_SEQUENCE_NUMBER` of the last
//!   record read (or where the reader started, when it read nothing yet).
//! - **Trimmed data** follows [`OnTrimmed`]: fail loudly (every read, counted), or skip to the
//!   oldest record kept with an ERROR and a count. Never silently.
//! - **`AT_TIMESTAMP`**, which DynamoDB Streams lacks, starts at the trim horizon and skips the
//!   changes made before the timestamp (to the change's approximate creation time).
//! - **Shard end.** A null next iterator means the shard is read to its end; the children come
//!   from the source's [`Lister`]. A leaf whose children are not listed yet is asked again every
//!   `children_retry_interval`: it is never finished early (the "worker idle forever after
//!   SHARD_END" of the KCL adapter), unless the stream was disabled.
//! - **Lag.** DynamoDB Streams has no `MillisBehindLatest`. Each batch reports how old its newest
//!   change is (`millis_behind`, which the core's per-shard lag gauge shows), and every read sets
//!   the gauge `shardlease_dynamodb_streams_change_age_millis`: that age, or 0 after a read that
//!   found nothing new in an open shard (caught up).
//! - **`AT_TIMESTAMP`** skips only the changes made in seconds before the timestamp's:
//!   creation times are rounded down to the second, so a change of that second is delivered
//!   (it may precede the timestamp by less than a second; none after it is skipped).
//!
//! There is no read-ahead: a shard is read only while its lease task asks for a batch, and
//! dropping the reader stops it, so during a handoff at most one worker reads the shard (the
//! service throttles a shard with more than two readers).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use shardlease_core::{
    Batch, Error, LeaseKey, Position, Record, Result, SequenceNumber, ShardReader,
};
use tokio::time::Instant;
use tracing::{debug, error, warn};

use crate::api::{Api, ApiError, IteratorStart, RecordsPage};
use crate::config::{OnTrimmed, ReadConfig};
use crate::lister::{Children, Lister};
use crate::telemetry;

/// How far before its opening a `LATEST` reader whose iterator expired before its first change
/// renews from: covers the service's clock running behind this machine's.
const LATEST_RENEWAL_MARGIN_MILLIS: i64 = 60_000;

/// Reads one shard; made by [`DynamoDbStreamsSource`](crate::DynamoDbStreamsSource).
pub struct StreamsReader {
    api: Arc<dyn Api>,
    lister: Arc<Lister>,
    config: Arc<ReadConfig>,
    shard: LeaseKey,
    /// The table's name, for metric labels.
    table: String,
    /// The current iterator; `None` when a new one must be fetched at `resume`.
    iterator: Option<String>,
    /// Where a new iterator starts.
    resume: IteratorStart,
    /// `AT_TIMESTAMP`: changes made before this (ms since the epoch) are skipped, until the
    /// first one at or after it.
    skip_before: Option<i64>,
    /// For a reader opened at `LATEST`: when (ms since the epoch, this machine's clock).
    latest_opened: Option<i64>,
    /// When the shard was found read to its end (a null next iterator).
    ended_at: Option<Instant>,
    next_call_at: Instant,
    /// Throttled or failed calls in a row (drives the backoff).
    attempt: u32,
    /// Non-throttling failures in a row (bounded by `max_retries`).
    failures: u32,
}

impl std::fmt::Debug for StreamsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamsReader")
            .field("shard", &self.shard)
            .field("resume", &self.resume)
            .field("ended", &self.ended_at.is_some())
            .finish_non_exhaustive()
    }
}

impl StreamsReader {
    /// A reader of `shard` from `from` (a checkpoint, or a starting point). At `LATEST` the
    /// iterator is taken here, so every change made after the open is read.
    pub(crate) async fn open(
        api: Arc<dyn Api>,
        lister: Arc<Lister>,
        config: Arc<ReadConfig>,
        shard: LeaseKey,
        from: &Position,
    ) -> Result<Self> {
        let mut reader = Self::new(api, lister, config, shard, from);
        if *from == Position::Latest {
            let iterator = reader
                .api
                .get_shard_iterator(reader.shard.as_str(), &IteratorStart::Latest)
                .await
                .map_err(ApiError::into_error)?;
            reader.iterator = Some(iterator);
            reader.latest_opened = Some(now_millis());
        }
        Ok(reader)
    }

    fn new(
        api: Arc<dyn Api>,
        lister: Arc<Lister>,
        config: Arc<ReadConfig>,
        shard: LeaseKey,
        from: &Position,
    ) -> Self {
        let (resume, skip_before, ended_at) = match from {
            Position::TrimHorizon => (IteratorStart::TrimHorizon, None, None),
            Position::Latest => (IteratorStart::Latest, None, None),
            Position::AtTimestamp { millis } => (IteratorStart::TrimHorizon, Some(*millis), None),
            Position::Sequence { seq, .. } => {
                (IteratorStart::AfterSequence(seq.as_str().to_owned()), None, None)
            }
            // Read to its end already: only the children are left to find.
            Position::ShardEnd => (IteratorStart::TrimHorizon, None, Some(Instant::now())),
        };
        let table = table_of(api.stream_arn());
        StreamsReader {
            api,
            lister,
            config,
            shard,
            table,
            iterator: None,
            resume,
            skip_before,
            latest_opened: None,
            ended_at,
            next_call_at: Instant::now(),
            attempt: 0,
            failures: 0,
        }
    }

    /// One step: `Some` batch with records or the shard's end, `None` when nothing was
    /// delivered (a wait was scheduled).
    async fn step(&mut self) -> Result<Option<Batch>> {
        tokio::time::sleep_until(self.next_call_at).await;
        if let Some(ended_at) = self.ended_at {
            return self.end(ended_at).await;
        }
        let iterator = match &self.iterator {
            Some(i) => i.clone(),
            None => match self.api.get_shard_iterator(self.shard.as_str(), &self.resume).await {
                Ok(i) => {
                    self.iterator = Some(i.clone());
                    i
                }
                Err(e) => {
                    self.on_failure(e)?;
                    return Ok(None);
                }
            },
        };
        metrics::counter!(telemetry::GET_RECORDS).increment(1);
        match self.api.get_records(&iterator, self.config.max_records).await {
            Ok(page) => {
                self.attempt = 0;
                self.failures = 0;
                Ok(self.on_page(page))
            }
            Err(e) => {
                self.on_failure(e)?;
                Ok(None)
            }
        }
    }

    /// The shard is read to its end: its children, once listed.
    async fn end(&mut self, ended_at: Instant) -> Result<Option<Batch>> {
        match self.lister.children_of(&self.shard, ended_at).await? {
            Children::Found(children) => {
                debug!(shard = %self.shard, children = children.len(), "shard ended");
                Ok(Some(Batch::default().with_millis_behind(0).with_end(children)))
            }
            Children::Never => {
                debug!(shard = %self.shard, "shard ended without children: the stream is disabled");
                Ok(Some(Batch::default().with_millis_behind(0).with_end(Vec::new())))
            }
            Children::NotYet => {
                metrics::counter!(telemetry::CHILDREN_NOT_LISTED_YET).increment(1);
                debug!(shard = %self.shard, "shard ended; its children are not listed yet");
                self.next_call_at = Instant::now() + self.config.children_retry_interval;
                Ok(None)
            }
        }
    }

    /// Decides what a failed call leads to: a wait before the next try, or the error itself.
    fn on_failure(&mut self, e: ApiError) -> Result<()> {
        match e {
            ApiError::Throttled(err) => {
                metrics::counter!(telemetry::THROTTLED).increment(1);
                self.attempt = self.attempt.saturating_add(1);
                let wait = self.config.backoff(self.attempt);
                debug!(shard = %self.shard, error = %err, ?wait, "throttled; backing off");
                self.next_call_at = Instant::now() + wait;
                Ok(())
            }
            ApiError::ExpiredIterator => {
                metrics::counter!(telemetry::ITERATOR_RENEWALS).increment(1);
                self.iterator = None;
                if let (IteratorStart::Latest, Some(opened)) = (&self.resume, self.latest_opened) {
                    // Nothing read yet: a new `LATEST` would skip what came since the open.
                    // Renew from the trim horizon, skipping what was made before the open (less
                    // a margin for the service's clock).
                    self.resume = IteratorStart::TrimHorizon;
                    self.skip_before = Some(opened.saturating_sub(LATEST_RENEWAL_MARGIN_MILLIS));
                }
                self.failures = self.failures.saturating_add(1);
                if self.failures > self.config.max_retries {
                    return Err(ApiError::ExpiredIterator.into_error());
                }
                debug!(shard = %self.shard, resume = ?self.resume, "shard iterator expired; renewing");
                Ok(())
            }
            ApiError::Trimmed(err) => self.on_trimmed(err, false),
            // The shard itself is gone: deleted once every record in it passed retention.
            ApiError::NotFound(err) => self.on_trimmed(err, true),
            ApiError::Other(err)
                if err.is_retryable() && self.failures < self.config.max_retries =>
            {
                self.failures += 1;
                self.attempt = self.attempt.saturating_add(1);
                let wait = self.config.backoff(self.attempt);
                warn!(shard = %self.shard, error = %err, ?wait, "reading the shard failed; retrying");
                self.next_call_at = Instant::now() + wait;
                Ok(())
            }
            ApiError::Other(err) => Err(err),
        }
    }

    /// The next records are past retention (`gone`: the whole shard is).
    fn on_trimmed(&mut self, err: Error, gone: bool) -> Result<()> {
        let what = if gone { "the shard is gone" } else { "its next records were trimmed" };
        match self.config.on_trimmed {
            OnTrimmed::Fail => {
                metrics::counter!(telemetry::TRIMMED, telemetry::TABLE => self.table.clone(), telemetry::SHARD => self.shard.as_str().to_owned(), telemetry::ACTION => "failed").increment(1);
                error!(shard = %self.shard, resume = ?self.resume, error = %err, "{what}: records past the stream's 24 h retention are lost; not going on (set on_trimmed to SkipToTrimHorizon to read on from the oldest record kept)");
                Err(Error::permanent(format!(
                    "DynamoDB Streams shard {}: {what}; records past the stream's retention are lost (on_trimmed = Fail)",
                    self.shard
                )))
            }
            OnTrimmed::SkipToTrimHorizon => {
                metrics::counter!(telemetry::TRIMMED, telemetry::TABLE => self.table.clone(), telemetry::SHARD => self.shard.as_str().to_owned(), telemetry::ACTION => "skipped").increment(1);
                error!(shard = %self.shard, resume = ?self.resume, error = %err, "{what}: records past the stream's 24 h retention are lost; skipping to the oldest record kept");
                self.iterator = None;
                if gone {
                    // Nothing of it is left to read: only its children.
                    self.ended_at = Some(Instant::now());
                } else {
                    self.resume = IteratorStart::TrimHorizon;
                }
                Ok(())
            }
        }
    }

    fn on_page(&mut self, page: RecordsPage) -> Option<Batch> {
        let full = page.records.len() >= usize::try_from(self.config.max_records).unwrap_or(0);
        let now = Instant::now();
        let mut records = Vec::with_capacity(page.records.len());
        let mut newest = None;
        for raw in page.records {
            let seq = match SequenceNumber::parse(&raw.seq) {
                Ok(s) => s,
                Err(e) => {
                    // The SDK layer checks sequence numbers; a bad one here is a bug upstream.
                    warn!(shard = %self.shard, error = %e, "a change with a bad sequence number was skipped");
                    continue;
                }
            };
            self.resume = IteratorStart::AfterSequence(raw.seq.clone());
            if let Some(before) = self.skip_before {
                // Creation times are rounded down to the second: a change of the timestamp's
                // second may have been made after it, so only earlier seconds are skipped.
                if raw.created_millis < before - before.rem_euclid(1000) {
                    continue;
                }
                self.skip_before = None;
            }
            newest = Some(newest.map_or(raw.created_millis, |n: i64| n.max(raw.created_millis)));
            records
                .push(Record::new(seq, raw.keys, raw.json).with_arrival_millis(raw.created_millis));
        }
        let read_nothing = records.is_empty();
        self.next_call_at = match (&page.next_iterator, full, read_nothing) {
            (_, true, _) => now,
            (Some(_), false, true) => now + self.config.idle_interval,
            _ => now + self.config.min_call_interval,
        };
        match page.next_iterator {
            Some(next) if !next.is_empty() => self.iterator = Some(next),
            _ => {
                self.iterator = None;
                self.ended_at = Some(now);
                self.next_call_at = now;
            }
        }
        let age = newest.map_or(0, |n| u64::try_from(now_millis().saturating_sub(n)).unwrap_or(0));
        if !read_nothing || self.iterator.is_some() {
            metrics::gauge!(
                telemetry::CHANGE_AGE,
                telemetry::TABLE => self.table.clone(),
                telemetry::SHARD => self.shard.as_str().to_owned()
            )
            .set(age as f64);
        }
        if read_nothing {
            return None;
        }
        Some(Batch::new(records).with_millis_behind(age))
    }
}

/// The table's name in a stream ARN (`arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL`).
pub(crate) fn table_of(stream_arn: &str) -> String {
    let after = stream_arn.split_once(":table/").map_or(stream_arn, |(_, rest)| rest);
    after.split('/').next().unwrap_or(after).to_owned()
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[async_trait]
impl ShardReader for StreamsReader {
    /// The next batch with records, or the shard's end; waits while the shard has nothing new.
    async fn next_batch(&mut self) -> Result<Batch> {
        loop {
            if let Some(batch) = self.step().await? {
                return Ok(batch);
            }
        }
    }
}
