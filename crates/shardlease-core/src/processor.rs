//! User code: one [`RecordProcessor`] per held lease, made by a [`ProcessorFactory`].
//!
//! The processor decides when to checkpoint through the [`CheckpointHandle`] it is given; the
//! handle carries the lease's fencing token, so a checkpoint after the lease moved on is refused
//! with `Error::LeaseLost`. For simple cases [`processor_fn`] turns an async closure into a factory
//! whose processors checkpoint after every batch the closure accepted.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::checkpointer::Checkpointer;
use crate::error::{BoxError, Result};
use crate::lease::{Epoch, LeaseKey, LeaseToken};
use crate::position::Position;
use crate::source::Batch;

/// What a processor knows about the lease it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseContext {
    /// The ownership token (key, owner, epoch). Downstream sinks can fence on the epoch.
    pub token: LeaseToken,
    /// Where reading starts.
    pub start: Position,
    /// The parent shards, all finished before this processor was created.
    pub parents: Vec<LeaseKey>,
}

impl LeaseContext {
    /// The lease (shard) key.
    pub fn key(&self) -> &LeaseKey {
        &self.token.key
    }
    /// The fencing epoch.
    pub fn epoch(&self) -> Epoch {
        self.token.epoch
    }
}

/// What the runtime learns from a lease's checkpoints as they are written, whatever the processor
/// then does with the result (it may wrap an error so that nobody can match it any more).
pub(crate) trait CheckpointObserver: Send + Sync {
    /// `position` was written under `token`.
    fn written(&self, token: &LeaseToken, position: &Position);
    /// A write under `token` was refused: the lease moved on.
    fn refused(&self, token: &LeaseToken);
}

/// A fenced checkpointer bound to one lease at one epoch.
#[derive(Clone)]
pub struct CheckpointHandle {
    checkpointer: Arc<dyn Checkpointer>,
    token: LeaseToken,
    observer: Option<Arc<dyn CheckpointObserver>>,
    /// Set when a write was refused because the lease moved on, whatever the processor does
    /// with the error afterwards.
    refused: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for CheckpointHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointHandle")
            .field("checkpointer", &self.checkpointer)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl CheckpointHandle {
    /// A handle writing through `checkpointer` under `token`.
    pub fn new(checkpointer: Arc<dyn Checkpointer>, token: LeaseToken) -> Self {
        CheckpointHandle { checkpointer, token, observer: None, refused: Default::default() }
    }

    /// A handle that also tells the runtime about each write.
    pub(crate) fn observed(
        checkpointer: Arc<dyn Checkpointer>,
        token: LeaseToken,
        observer: Arc<dyn CheckpointObserver>,
    ) -> Self {
        CheckpointHandle {
            checkpointer,
            token,
            observer: Some(observer),
            refused: Default::default(),
        }
    }

    /// Whether a write through this handle (or a clone) was refused because the lease moved on.
    pub(crate) fn was_refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records that everything up to `position` is processed.
    /// `Error::LeaseLost` means the lease moved on: stop writing for this shard.
    pub async fn checkpoint(&self, position: Position) -> Result<()> {
        let result = self.checkpointer.checkpoint(&self.token, &position).await;
        self.record_outcome(&position, &result);
        result
    }

    /// Tells the runtime the outcome of a checkpoint written without this handle, for example in
    /// the same database transaction as the processor's output: `Ok` records `position` as
    /// written under this handle's token, `Err(Error::LeaseLost)` ends the lease exactly as a
    /// refused [`checkpoint`](Self::checkpoint) does. Other errors change nothing.
    pub fn record_outcome(&self, position: &Position, result: &Result<()>) {
        if let Err(crate::error::Error::LeaseLost { .. }) = result {
            self.refused.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some(o) = &self.observer {
            match result {
                Ok(()) => o.written(&self.token, position),
                Err(crate::error::Error::LeaseLost { .. }) => o.refused(&self.token),
                Err(_) => {}
            }
        }
    }

    /// Checkpoints after the last record of `batch` (nothing if it is empty).
    pub async fn checkpoint_batch(&self, batch: &Batch) -> Result<()> {
        match batch.last_position() {
            Some(p) => self.checkpoint(p).await,
            None => Ok(()),
        }
    }

    /// The ownership token.
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }
}

/// Processes the records of one shard while its lease is held.
///
/// An error returned from a method is retried with backoff (nothing is skipped); a panic is
/// contained, the lease released, and the shard resumes from its last checkpoint. To give a lease
/// up on purpose (a resource behind the processor failed and only a fresh start from the
/// checkpoint can recover), return [`Error::ReleaseLease`](crate::Error::ReleaseLease): the
/// processor hears `lease_lost` and the lease is released, as after a panic, without one.
#[async_trait]
pub trait RecordProcessor: Send {
    /// Called once before the first batch.
    async fn initialize(&mut self, _ctx: &LeaseContext) -> Result<(), BoxError> {
        Ok(())
    }

    /// Processes one batch. Checkpoint through `checkpointer` when the work is durable.
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError>;

    /// The lease was lost (taken over, or this worker fenced itself). Checkpointing is no longer
    /// possible; release resources.
    async fn lease_lost(&mut self) {}

    /// The shard is closed and fully read. The default checkpoints `ShardEnd`; an override must do
    /// so too, or the runtime will not let the children start.
    async fn shard_ended(&mut self, checkpointer: &CheckpointHandle) -> Result<(), BoxError> {
        checkpointer.checkpoint(Position::ShardEnd).await?;
        Ok(())
    }

    /// The lease is being handed over or the worker is shutting down: checkpoint what is done.
    async fn shutdown_requested(
        &mut self,
        _checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Makes one processor per lease.
pub trait ProcessorFactory: Send + Sync {
    /// A processor for the lease described by `ctx`.
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor>;
}

impl<F> ProcessorFactory for F
where
    F: Fn(&LeaseContext) -> Box<dyn RecordProcessor> + Send + Sync,
{
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        self(ctx)
    }
}

/// A factory from an async closure `(context, batch) -> Result<(), BoxError>`. After the closure
/// returns `Ok` for a batch, the processor checkpoints after its last record; an `Err` is retried.
///
/// The closure gets an owned [`Batch`] (so its future can be `'static`), but nothing is copied to
/// give it one: a batch's records are an `Arc<[Record]>`, and the clone made per call only bumps
/// a reference count. Iterate them with `batch.records.iter()` (or `for r in batch.records.iter()`).
///
/// [`Record`]: crate::source::Record
pub fn processor_fn<F, Fut>(f: F) -> Arc<dyn ProcessorFactory>
where
    F: Fn(Arc<LeaseContext>, Batch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    Arc::new(FnFactory { f: Arc::new(f) })
}

struct FnFactory<F> {
    f: Arc<F>,
}

impl<F, Fut> ProcessorFactory for FnFactory<F>
where
    F: Fn(Arc<LeaseContext>, Batch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        Box::new(FnProcessor { f: self.f.clone(), ctx: Arc::new(ctx.clone()) })
    }
}

struct FnProcessor<F> {
    f: Arc<F>,
    ctx: Arc<LeaseContext>,
}

#[async_trait]
impl<F, Fut> RecordProcessor for FnProcessor<F>
where
    F: Fn(Arc<LeaseContext>, Batch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        // O(1): the records are shared, not copied (see `Batch::records`).
        (self.f)(self.ctx.clone(), batch.clone()).await?;
        checkpointer.checkpoint_batch(batch).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ids::WorkerId;
    use crate::position::SequenceNumber;
    use crate::source::Record;

    /// Accepts every checkpoint.
    #[derive(Debug)]
    struct AcceptAll;

    #[async_trait]
    impl Checkpointer for AcceptAll {
        async fn checkpoint(&self, _: &LeaseToken, _: &Position) -> Result<()> {
            Ok(())
        }
        async fn fetch(&self, _: &LeaseKey) -> Result<Option<Position>> {
            Ok(None)
        }
    }

    #[tokio::test]
    async fn processor_fn_shares_the_batch_records_instead_of_copying_them() {
        let seen: Arc<Mutex<Vec<Batch>>> = Arc::default();
        let keep = seen.clone();
        let factory = processor_fn(move |_ctx, batch| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap_or_else(|e| panic!("{e}")).push(batch);
                Ok(())
            }
        });
        let token = LeaseToken { key: "s".into(), owner: WorkerId::new("w"), epoch: Epoch(1) };
        let ctx =
            LeaseContext { token: token.clone(), start: Position::TrimHorizon, parents: vec![] };
        let handle = CheckpointHandle::new(Arc::new(AcceptAll), token);
        let batch = Batch::new(vec![Record::new(SequenceNumber::from(1u64), "pk", "data")]);
        let mut processor = factory.create(&ctx);
        processor.process_records(&batch, &handle).await.unwrap_or_else(|e| panic!("{e}"));
        let seen = seen.lock().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen.len(), 1);
        assert!(Arc::ptr_eq(&seen[0].records, &batch.records), "the records were copied");
    }
}
