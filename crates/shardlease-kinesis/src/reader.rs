//! [`KinesisReader`]: the [`ShardReader`] of one Kinesis shard, reading one batch ahead.
//!
//! A background task pulls batches from a [`Pull`] (the polling [`Fetcher`], or a fan-out
//! [`Subscriber`](crate::fanout::subscriber::Subscriber)) and hands them over a channel of
//! capacity one, and it reserves the slot *before* it reads: so exactly one batch waits while the
//! processor works on the one before (a slow processor does not also pay the read latency), and
//! memory stays bounded. For a subscription this is also its backpressure: no event is taken off
//! the connection while the slot is full. Dropping the reader ends the task at once, even
//! mid-wait (and so closes a subscription).

use async_trait::async_trait;
use shardlease_core::{Batch, Error, LeaseKey, Position, Result, ShardInfo, ShardReader};

/// Where the read-ahead task takes batches from.
#[async_trait]
pub(crate) trait Pull: Send + 'static {
    /// `Some` batch with records or the shard's end; `None` when a read found nothing to
    /// deliver; an error the reader hands to the runtime (the task then stops).
    async fn next(&mut self) -> Result<Option<Batch>>;
}

#[async_trait]
impl Pull for Fetcher {
    async fn next(&mut self) -> Result<Option<Batch>> {
        Fetcher::next(self).await
    }
}
use tokio::sync::mpsc;
use tracing::debug;

use crate::fetcher::Fetcher;

/// Reads one shard of a Kinesis stream; made by [`KinesisSource`](crate::KinesisSource).
pub struct KinesisReader {
    shard: LeaseKey,
    batches: mpsc::Receiver<Result<Batch>>,
    /// Where a `LATEST` / `AT_TIMESTAMP` start landed, as a position that does not move.
    resolved: Option<Position>,
    /// Set once the shard's end was delivered: reported again on every later call.
    ended: Option<Vec<ShardInfo>>,
    /// The task stopped after an error it already delivered.
    stopped: bool,
}

impl std::fmt::Debug for KinesisReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KinesisReader")
            .field("shard", &self.shard)
            .field("resolved", &self.resolved)
            .finish_non_exhaustive()
    }
}

impl KinesisReader {
    /// Starts the read-ahead task. `first` is a batch already read while opening (to pin a
    /// `LATEST` start); it is delivered before anything else.
    pub(crate) fn spawn(
        shard: LeaseKey,
        mut fetcher: impl Pull,
        first: Option<Batch>,
        resolved: Option<Position>,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<Result<Batch>>(1);
        let task_shard = shard.clone();
        tokio::spawn(async move {
            let mut pending = first;
            loop {
                let Ok(permit) = tx.reserve().await else { break };
                let next = match pending.take() {
                    Some(b) => Ok(Some(b)),
                    None => tokio::select! {
                        r = fetcher.next() => r,
                        _ = tx.closed() => break,
                    },
                };
                match next {
                    Ok(Some(batch)) => {
                        let end = batch.end.is_some();
                        permit.send(Ok(batch));
                        if end {
                            break;
                        }
                    }
                    Ok(None) => drop(permit),
                    Err(e) => {
                        permit.send(Err(e));
                        break;
                    }
                }
            }
            debug!(shard = %task_shard, "shard read-ahead stopped");
        });
        KinesisReader { shard, batches: rx, resolved, ended: None, stopped: false }
    }

    /// A reader of a shard already read to its end: reports `children` on every call.
    pub(crate) fn at_end(shard: LeaseKey, children: Vec<ShardInfo>) -> Self {
        let (_, rx) = mpsc::channel(1);
        KinesisReader { shard, batches: rx, resolved: None, ended: Some(children), stopped: false }
    }
}

#[async_trait]
impl ShardReader for KinesisReader {
    /// The next batch with records, or the shard's end; waits while the shard has nothing new.
    async fn next_batch(&mut self) -> Result<Batch> {
        if let Some(children) = &self.ended {
            return Ok(Batch::default().with_millis_behind(0).with_end(children.clone()));
        }
        if self.stopped {
            return Err(Error::retryable(format!(
                "the reader of shard {} stopped after an error; reopen it",
                self.shard
            )));
        }
        match self.batches.recv().await {
            Some(Ok(batch)) => {
                if let Some(children) = &batch.end {
                    self.ended = Some(children.clone());
                }
                Ok(batch)
            }
            Some(Err(e)) => {
                self.stopped = true;
                Err(e)
            }
            None => {
                self.stopped = true;
                Err(Error::retryable(format!("the reader of shard {} stopped", self.shard)))
            }
        }
    }

    fn resolved_start(&self) -> Option<Position> {
        self.resolved.clone()
    }
}
