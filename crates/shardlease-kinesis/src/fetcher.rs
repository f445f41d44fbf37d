//! The polling loop of one shard: `GetShardIterator` once, then `GetRecords` within the shard's
//! limits, turning each reply into a [`Batch`].
//!
//! - **Limits.** At least [`ReadConfig::min_call_interval`] between calls (5 calls/s/shard), and
//!   after a large batch long enough to stay under [`ReadConfig::max_bytes_per_second`].
//! - **Idle backoff.** A read that found nothing at the tip waits [`ReadConfig::idle_interval`].
//! - **Throttling.** `ProvisionedThroughputExceeded` (and its kin) backs off exponentially with
//!   jitter, without limit: throttling is the service asking us to wait, not a failure.
//! - **Iterator expiry.** An expired iterator is renewed `AT_SEQUENCE_NUMBER` of the last record
//!   read (skipping that record's user records again), or at the start when nothing was read.
//! - **Other failures** are retried [`ReadConfig::max_retries`] times in a row, then handed up.
//! - **Shard end.** A null next iterator means the shard is closed and read to its end; the
//!   children come from the reply (`ChildShards`) or, when the service gives none, from a
//!   listing of the stream.

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Batch, HashRange, LeaseKey, Result, SequenceNumber, ShardInfo};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::{Api, ApiError, IteratorStart, RecordsPage};
use crate::config::ReadConfig;
use crate::convert::Unpacker;
use crate::listing::list_all;
use crate::telemetry::{self, MILLIS_BEHIND_GAUGE};

/// Reads one shard, one `GetRecords` reply at a time.
pub(crate) struct Fetcher {
    api: Arc<dyn Api>,
    config: Arc<ReadConfig>,
    stream: String,
    shard: LeaseKey,
    /// De-aggregation, the out-of-range rule, and what was delivered already.
    unpacker: Unpacker,
    /// The current iterator; `None` when a new one must be fetched at `resume`.
    iterator: Option<String>,
    /// Where a new iterator starts.
    resume: IteratorStart,
    /// The arrival time of the first record this fetcher read.
    first_arrival: Option<i64>,
    next_call_at: Instant,
    /// Throttled or failed calls in a row (drives the backoff).
    attempt: u32,
    /// Non-throttling failures in a row (bounded by `max_retries`).
    failures: u32,
}

impl Fetcher {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        api: Arc<dyn Api>,
        config: Arc<ReadConfig>,
        stream: String,
        shard: LeaseKey,
        range: Option<HashRange>,
        iterator: Option<String>,
        resume: IteratorStart,
        skip_through: Option<(SequenceNumber, u64)>,
    ) -> Self {
        let unpacker = Unpacker::new(stream.clone(), shard.clone(), range, &config, skip_through);
        Fetcher {
            api,
            config,
            stream,
            shard,
            unpacker,
            iterator,
            resume,
            first_arrival: None,
            next_call_at: Instant::now(),
            attempt: 0,
            failures: 0,
        }
    }

    /// The arrival time of the first record read, if any was.
    pub(crate) fn first_arrival(&self) -> Option<i64> {
        self.first_arrival
    }

    /// Where to renew the iterator while no record has been read yet (a `LATEST` start, once
    /// pinned, must not be renewed at a newer `LATEST`).
    pub(crate) fn renew_before_first_record_at(&mut self, start: IteratorStart) {
        if self.resume == IteratorStart::Latest {
            self.resume = start;
        }
    }

    /// One successful `GetRecords` (after any waits and retries): `Some` batch with records or
    /// the shard's end, `None` when the reply held nothing to deliver.
    pub(crate) async fn next(&mut self) -> Result<Option<Batch>> {
        loop {
            tokio::time::sleep_until(self.next_call_at).await;
            let iterator = match &self.iterator {
                Some(i) => i.clone(),
                None => {
                    match self.api.get_shard_iterator(self.shard.as_str(), &self.resume).await {
                        Ok(i) => {
                            self.iterator = Some(i.clone());
                            i
                        }
                        Err(e) => {
                            self.on_failure(e)?;
                            continue;
                        }
                    }
                }
            };
            metrics::counter!(telemetry::GET_RECORDS).increment(1);
            match self.api.get_records(&iterator, self.config.max_records).await {
                Ok(page) => {
                    self.attempt = 0;
                    self.failures = 0;
                    return self.on_page(page).await;
                }
                Err(e) => self.on_failure(e)?,
            }
        }
    }

    /// Decides what a failed call leads to: a wait before the next try, or the error itself.
    fn on_failure(&mut self, e: ApiError) -> Result<()> {
        match e {
            ApiError::Throttled(err) => {
                metrics::counter!(telemetry::THROTTLED).increment(1);
                self.attempt = self.attempt.saturating_add(1);
                let wait = self.backoff();
                debug!(shard = %self.shard, error = %err, ?wait, "throttled; backing off");
                self.next_call_at = Instant::now() + wait;
                Ok(())
            }
            ApiError::ExpiredIterator => {
                metrics::counter!(telemetry::ITERATOR_RENEWALS).increment(1);
                self.iterator = None;
                self.failures = self.failures.saturating_add(1);
                if self.failures > self.config.max_retries {
                    return Err(ApiError::ExpiredIterator.into_error());
                }
                debug!(shard = %self.shard, resume = ?self.resume, "shard iterator expired; renewing");
                Ok(())
            }
            ApiError::InUse(err) => self.on_failure(ApiError::Other(err)),
            ApiError::Other(err)
                if err.is_retryable() && self.failures < self.config.max_retries =>
            {
                self.failures += 1;
                self.attempt = self.attempt.saturating_add(1);
                let wait = self.backoff();
                warn!(shard = %self.shard, error = %err, ?wait, "reading the shard failed; retrying");
                self.next_call_at = Instant::now() + wait;
                Ok(())
            }
            ApiError::Other(err) => Err(err),
        }
    }

    fn backoff(&self) -> Duration {
        self.config.backoff(self.attempt)
    }

    async fn on_page(&mut self, page: RecordsPage) -> Result<Option<Batch>> {
        let bytes: u64 = page.records.iter().map(|r| r.data.len() as u64).sum();
        // At most a day (a tiny byte rate and a huge batch must not overflow anything).
        let byte_wait =
            Duration::try_from_secs_f64(bytes as f64 / self.config.max_bytes_per_second as f64)
                .unwrap_or(Duration::MAX)
                .min(Duration::from_secs(86_400));
        let now = Instant::now();
        self.next_call_at = now + self.config.min_call_interval.max(byte_wait);
        let read_nothing = page.records.is_empty();
        if let Some(first) = page.records.first() {
            self.first_arrival.get_or_insert(first.arrival_millis);
        }
        let records = self.unpacker.convert(page.records)?;
        if let Some(last) = self.unpacker.last_seq() {
            // A renewed iterator starts at the last record again; every part of it is read.
            self.resume = IteratorStart::AtSequence(last.as_str().to_owned());
        }
        let millis_behind = page.millis_behind.map(|m| u64::try_from(m).unwrap_or(0));
        if let Some(m) = millis_behind {
            metrics::gauge!(
                MILLIS_BEHIND_GAUGE,
                "stream" => self.stream.clone(),
                "shard" => self.shard.as_str().to_owned()
            )
            .set(m as f64);
        }
        let end = match page.next_iterator {
            Some(next) => {
                self.iterator = Some(next);
                if read_nothing && millis_behind.unwrap_or(0) == 0 {
                    self.next_call_at = self.next_call_at.max(now + self.config.idle_interval);
                }
                None
            }
            None => {
                self.iterator = None;
                Some(self.children(page.children).await?)
            }
        };
        if records.is_empty() && end.is_none() {
            return Ok(None);
        }
        let mut batch = Batch::new(records);
        batch.millis_behind = millis_behind;
        batch.end = end;
        Ok(Some(batch))
    }

    /// The children of this (closed) shard: from the reply, or else from a listing.
    async fn children(&self, reported: Vec<ShardInfo>) -> Result<Vec<ShardInfo>> {
        if !reported.is_empty() {
            return Ok(reported);
        }
        let all = list_all(&*self.api, self.config.list_page_size).await?;
        let children: Vec<ShardInfo> =
            all.into_iter().filter(|s| s.parents.contains(&self.shard)).collect();
        debug!(shard = %self.shard, children = children.len(), "shard ended");
        Ok(children)
    }
}
