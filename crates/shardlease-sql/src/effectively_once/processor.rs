//! The closure form of effectively-once output, in the spirit of `shardlease_core::processor_fn`:
//! [`transactional_fn`] turns "given this batch and this transaction, write my rows" into a
//! processor factory whose processors do everything else through
//! [`TxCheckpointer::write_batch`].

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::{
    Batch, BoxError, CheckpointHandle, LeaseContext, ProcessorFactory, RecordProcessor,
};

use super::backend::TxDatabase;
use super::batch::TxFuture;
use super::checkpointer::TxCheckpointer;

/// A processor factory from a closure `(context, records, transaction) -> future` that writes
/// the output of the records in the transaction it is given (and does not commit it). For each
/// batch the library begins the transaction, checks the lease's epoch, hands over only the
/// records not yet committed, writes the position after the batch, commits, and retries
/// transient failures; `Error::LeaseLost` ends the lease. The checkpointer must also be the
/// worker's (`WorkerBuilder::checkpointer`), so a new owner resumes from its positions.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(pool: sqlx::PgPool) -> shardlease_core::Result<()> {
/// use std::sync::Arc;
/// use shardlease_sql::effectively_once::{transactional_fn, TxCheckpointer};
///
/// let checkpointer = Arc::new(TxCheckpointer::in_checkpoints_table(pool, "orders", "app_").await?);
/// let factory = transactional_fn(checkpointer.clone(), |ctx, batch, tx| {
///     Box::pin(async move {
///         for r in batch.records.iter() {
///             sqlx::query("INSERT INTO events (shard, seq, body) VALUES ($1, $2, $3)")
///                 .bind(ctx.key().as_str())
///                 .bind(r.seq.as_str())
///                 .bind(r.data.as_ref())
///                 .execute(&mut **tx)
///                 .await?;
///         }
///         Ok(())
///     })
/// });
/// # Ok(()) }
/// ```
pub fn transactional_fn<DB, F>(
    checkpointer: Arc<TxCheckpointer<DB>>,
    write: F,
) -> Arc<dyn ProcessorFactory>
where
    DB: TxDatabase,
    F: for<'a> Fn(
            Arc<LeaseContext>,
            &'a Batch,
            &'a mut sqlx::Transaction<'static, DB>,
        ) -> TxFuture<'a>
        + Send
        + Sync
        + 'static,
{
    Arc::new(TxFactory { checkpointer, write: Arc::new(write) })
}

struct TxFactory<DB: TxDatabase, F> {
    checkpointer: Arc<TxCheckpointer<DB>>,
    write: Arc<F>,
}

impl<DB, F> ProcessorFactory for TxFactory<DB, F>
where
    DB: TxDatabase,
    F: for<'a> Fn(
            Arc<LeaseContext>,
            &'a Batch,
            &'a mut sqlx::Transaction<'static, DB>,
        ) -> TxFuture<'a>
        + Send
        + Sync
        + 'static,
{
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        Box::new(TxProcessor {
            checkpointer: Arc::clone(&self.checkpointer),
            write: Arc::clone(&self.write),
            ctx: Arc::new(ctx.clone()),
        })
    }
}

struct TxProcessor<DB: TxDatabase, F> {
    checkpointer: Arc<TxCheckpointer<DB>>,
    write: Arc<F>,
    ctx: Arc<LeaseContext>,
}

#[async_trait]
impl<DB, F> RecordProcessor for TxProcessor<DB, F>
where
    DB: TxDatabase,
    F: for<'a> Fn(
            Arc<LeaseContext>,
            &'a Batch,
            &'a mut sqlx::Transaction<'static, DB>,
        ) -> TxFuture<'a>
        + Send
        + Sync
        + 'static,
{
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        let ctx = &self.ctx;
        let write = &*self.write;
        self.checkpointer
            .write_batch(checkpointer, batch, |records, tx| write(Arc::clone(ctx), records, tx))
            .await?;
        Ok(())
    }
}
