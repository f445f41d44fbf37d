//! The subscription loop of one shard: `SubscribeToShard`, then its events, turned into
//! [`Batch`]es the read-ahead task hands to the processor.
//!
//! - **Resuming.** After every event the next subscription would start `AT_SEQUENCE_NUMBER` of
//!   the event's continuation sequence number. Every user record already delivered (up to the
//!   last record of the last event) is skipped if the service sends it again, so a restarted
//!   subscription never delivers a record twice and never skips one.
//! - **Session end.** The service ends every subscription after 5 minutes; the loop subscribes
//!   again at once from the continuation, without backoff (after a backoff when the subscription
//!   ended before its first event, so a server that hangs up at once is not hammered).
//! - **Quiet subscriptions.** No event for [`FanOutConfig::quiet_timeout`]: the subscription is
//!   dropped and opened again after a backoff with jitter.
//! - **`ResourceInUseException`** (a subscription to this shard opened moments ago, by a
//!   restart of ours or by the worker the lease just came from) and throttling back off with
//!   jitter without limit; other retryable failures are retried
//!   [`ReadConfig::max_retries`] times in a row, then handed up. Only one subscription of a
//!   reader is ever open, and a dropped reader's subscription is closed with it, so two never
//!   deliver to one processor.
//! - **Shard end.** The last event of a closed shard has no continuation and names the
//!   children (the emulators send the children in every event once the shard is closed: there
//!   the end is an event with children and no records). The children's parents come from a
//!   listing, which names both parents of a merge; the event's own list is the fallback.
//!
//! [`FanOutConfig::quiet_timeout`]: crate::FanOutConfig::quiet_timeout
//! [`ReadConfig::max_retries`]: crate::ReadConfig::max_retries

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::{Batch, LeaseKey, Result, ShardInfo};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::{Api, ApiError, EventStream, IteratorStart, ShardEvent};
use crate::config::ReadConfig;
use crate::convert::Unpacker;
use crate::fanout::FanOut;
use crate::listing::list_all;
use crate::reader::Pull;
use crate::telemetry::{self, MILLIS_BEHIND_GAUGE};

/// Reads one shard through enhanced fan-out, one event at a time.
pub(crate) struct Subscriber {
    fan: FanOut,
    /// For listing the children at shard end.
    api: Arc<dyn Api>,
    config: Arc<ReadConfig>,
    stream: String,
    shard: LeaseKey,
    unpacker: Unpacker,
    /// Where the next subscription starts.
    resume: IteratorStart,
    /// The open subscription, if any.
    events: Option<Box<dyn EventStream>>,
    /// Events the open subscription delivered.
    session_events: u64,
    next_subscribe_at: Instant,
    /// Backoffs in a row (drives the wait).
    attempt: u32,
    /// Non-throttling failures in a row (bounded by `max_retries`).
    failures: u32,
    first_arrival: Option<i64>,
}

impl Subscriber {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        fan: FanOut,
        api: Arc<dyn Api>,
        config: Arc<ReadConfig>,
        stream: String,
        shard: LeaseKey,
        unpacker: Unpacker,
        resume: IteratorStart,
    ) -> Self {
        Subscriber {
            fan,
            api,
            config,
            stream,
            shard,
            unpacker,
            resume,
            events: None,
            session_events: 0,
            next_subscribe_at: Instant::now(),
            attempt: 0,
            failures: 0,
            first_arrival: None,
        }
    }

    /// The fan-out settings.
    pub(crate) fn fan_config(&self) -> &crate::fanout::FanOutConfig {
        &self.fan.config
    }

    /// The arrival time of the first record read, if any was.
    pub(crate) fn first_arrival(&self) -> Option<i64> {
        self.first_arrival
    }

    /// Where to subscribe again while no event has moved the start (a `LATEST` start, once
    /// pinned, must not be renewed at a newer `LATEST`).
    pub(crate) fn renew_before_first_event_at(&mut self, start: IteratorStart) {
        if self.resume == IteratorStart::Latest {
            self.resume = start;
        }
    }

    /// One event (after any waits and resubscriptions): `Some` batch with records or the
    /// shard's end, `None` when the event held nothing to deliver.
    pub(crate) async fn next_event(&mut self) -> Result<Option<Batch>> {
        loop {
            let Some(events) = self.events.as_mut() else {
                self.subscribe().await?;
                continue;
            };
            match tokio::time::timeout(self.fan.config.quiet_timeout, events.recv()).await {
                Ok(Ok(Some(event))) => {
                    self.session_events += 1;
                    self.attempt = 0;
                    self.failures = 0;
                    return self.on_event(event).await;
                }
                Ok(Ok(None)) if self.session_events > 0 => {
                    // The session is over (5 minutes on Kinesis): continue at once.
                    self.restart("session_end");
                    debug!(shard = %self.shard, resume = ?self.resume, "subscription ended; renewing");
                }
                Ok(Ok(None)) => {
                    // Ended before its first event: not a session's end; do not spin.
                    self.restart("empty_session");
                    self.attempt = self.attempt.saturating_add(1);
                    let wait = self.config.backoff(self.attempt);
                    debug!(shard = %self.shard, ?wait, "subscription ended without an event");
                    self.next_subscribe_at = Instant::now() + wait;
                }
                Err(_) => {
                    self.restart("quiet");
                    self.attempt = self.attempt.saturating_add(1);
                    let wait = self.config.backoff(self.attempt);
                    warn!(shard = %self.shard, quiet = ?self.fan.config.quiet_timeout, ?wait,
                        "the subscription went quiet; subscribing again");
                    self.next_subscribe_at = Instant::now() + wait;
                }
                Ok(Err(e)) => {
                    self.restart("error");
                    self.on_failure(e)?;
                }
            }
        }
    }

    /// Drops the open subscription (closing its connection) and counts why.
    fn restart(&mut self, reason: &'static str) {
        self.events = None;
        metrics::counter!(telemetry::SUBSCRIPTION_RESTARTS, telemetry::REASON => reason)
            .increment(1);
    }

    /// One `SubscribeToShard` attempt, after the current wait.
    async fn subscribe(&mut self) -> Result<()> {
        tokio::time::sleep_until(self.next_subscribe_at).await;
        let call =
            self.fan.api.subscribe(&self.fan.consumer_arn, self.shard.as_str(), &self.resume);
        match call.await {
            Ok(events) => {
                metrics::counter!(
                    telemetry::SUBSCRIPTIONS,
                    telemetry::STREAM => self.stream.clone(),
                    telemetry::SHARD => self.shard.as_str().to_owned()
                )
                .increment(1);
                debug!(shard = %self.shard, start = ?self.resume, "subscribed");
                self.events = Some(events);
                self.session_events = 0;
                Ok(())
            }
            Err(e) => self.on_failure(e),
        }
    }

    /// Decides what a failed call or event leads to: a wait before subscribing again, or the
    /// error itself.
    fn on_failure(&mut self, e: ApiError) -> Result<()> {
        let wait = |s: &mut Self| {
            s.attempt = s.attempt.saturating_add(1);
            let wait = s.config.backoff(s.attempt);
            s.next_subscribe_at = Instant::now() + wait;
            wait
        };
        match e {
            ApiError::Throttled(err) => {
                metrics::counter!(telemetry::THROTTLED).increment(1);
                let wait = wait(self);
                debug!(shard = %self.shard, error = %err, ?wait, "throttled; backing off");
                Ok(())
            }
            ApiError::InUse(err) => {
                metrics::counter!(telemetry::SUBSCRIPTION_RESTARTS, telemetry::REASON => "in_use")
                    .increment(1);
                let wait = wait(self);
                debug!(shard = %self.shard, error = %err, ?wait,
                    "another subscription to the shard is in use; backing off");
                Ok(())
            }
            ApiError::ExpiredIterator => Err(e.into_error()),
            ApiError::Other(err)
                if err.is_retryable() && self.failures < self.config.max_retries =>
            {
                self.failures += 1;
                let wait = wait(self);
                warn!(shard = %self.shard, error = %err, ?wait, "the subscription failed; retrying");
                Ok(())
            }
            ApiError::Other(err) => Err(err),
        }
    }

    async fn on_event(&mut self, event: ShardEvent) -> Result<Option<Batch>> {
        let read_nothing = event.records.is_empty();
        if let Some(first) = event.records.first() {
            self.first_arrival.get_or_insert(first.arrival_millis);
        }
        let records = self.unpacker.convert(event.records)?;
        if let Some(c) = &event.continuation {
            self.resume = IteratorStart::AtSequence(c.clone());
        } else if let Some(last) = self.unpacker.last_seq() {
            self.resume = IteratorStart::AtSequence(last.as_str().to_owned());
        }
        let millis_behind = event.millis_behind.map(|m| u64::try_from(m).unwrap_or(0));
        if let Some(m) = millis_behind {
            metrics::gauge!(
                MILLIS_BEHIND_GAUGE,
                telemetry::STREAM => self.stream.clone(),
                telemetry::SHARD => self.shard.as_str().to_owned()
            )
            .set(m as f64);
        }
        let ended = event.continuation.is_none() || (!event.children.is_empty() && read_nothing);
        let end = if ended {
            self.events = None;
            Some(children(&*self.api, &self.config, &self.shard, event.children).await?)
        } else {
            None
        };
        if records.is_empty() && end.is_none() {
            return Ok(None);
        }
        let mut batch = Batch::new(records);
        batch.millis_behind = millis_behind;
        batch.end = end;
        Ok(Some(batch))
    }
}

/// The children of a closed shard: from a listing (both parents of a merge), else as the event
/// named them.
async fn children(
    api: &dyn Api,
    config: &ReadConfig,
    shard: &LeaseKey,
    reported: Vec<ShardInfo>,
) -> Result<Vec<ShardInfo>> {
    let listed: Vec<ShardInfo> = list_all(api, config.list_page_size)
        .await?
        .into_iter()
        .filter(|s| s.parents.contains(shard))
        .collect();
    debug!(shard = %shard, children = listed.len(), "shard ended");
    Ok(if listed.is_empty() { reported } else { listed })
}

#[async_trait]
impl Pull for Subscriber {
    async fn next(&mut self) -> Result<Option<Batch>> {
        self.next_event().await
    }
}
