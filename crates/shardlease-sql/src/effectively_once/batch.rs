//! One batch, effectively once: [`TxCheckpointer::write_batch`] begins a transaction, fences it,
//! hands the records not yet committed to user code, writes the position after the batch and
//! commits, retrying the whole transaction on a serialization failure, a deadlock or a lost
//! connection (bounded, with backoff), and tells the runtime through the processor's
//! [`CheckpointHandle`] when a newer owner refused the batch.

use std::future::Future;
use std::pin::Pin;

use shardlease_core::{Batch, BoxError, CheckpointHandle, Error, Result};
use tracing::debug;

use super::backend::TxDatabase;
use super::checkpointer::TxCheckpointer;
use crate::errors;

/// The future user code returns for the writes of one batch (`Box::pin(async move { ... })`).
pub type TxFuture<'a> =
    Pin<Box<dyn Future<Output = std::result::Result<(), BoxError>> + Send + 'a>>;

/// What one [`TxCheckpointer::write_batch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Records handed to user code in the transaction that committed.
    pub written: usize,
    /// Records skipped because their output was already committed.
    pub skipped: usize,
    /// Transactions tried (1 unless a transient failure forced a retry).
    pub attempts: u32,
}

impl<DB: TxDatabase> TxCheckpointer<DB> {
    /// Writes `batch` effectively once for the lease of `handle`: in one transaction, locks and
    /// checks the position row (a newer owner means `Error::LeaseLost`, and nothing is written),
    /// calls `write` with the records whose output is not yet committed, writes the position
    /// after the batch, and commits. A transient failure (serialization failure, deadlock, lost
    /// connection, also when `write` returns one as a `sqlx::Error`) rolls back and retries the
    /// whole transaction, up to the [`RetryPolicy`](super::RetryPolicy); records already
    /// committed by an attempt whose commit outcome was unknown are skipped by the next.
    ///
    /// A refusal is reported to the runtime through `handle`: it ends the lease as a refused
    /// checkpoint does. Returns at once for a batch without records.
    pub async fn write_batch<F>(
        &self,
        handle: &CheckpointHandle,
        batch: &Batch,
        mut write: F,
    ) -> Result<BatchOutcome>
    where
        F: for<'a> FnMut(&'a Batch, &'a mut sqlx::Transaction<'static, DB>) -> TxFuture<'a> + Send,
    {
        let Some(last) = batch.last_position() else { return Ok(BatchOutcome::default()) };
        let token = handle.token();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = async {
                let mut fenced = self.begin(token).await?;
                let unseen = fenced.unseen(batch);
                let written = unseen.records.len();
                if written > 0 {
                    if let Err(e) = write(&unseen, fenced.transaction()).await {
                        let _ = fenced.rollback().await;
                        return Err(self.user_error(e));
                    }
                }
                fenced.commit(&last).await?;
                Ok(BatchOutcome { written, skipped: batch.records.len() - written, attempts })
            }
            .await;
            match result {
                // Success is not reported: the runtime's memory of lease records must never
                // hold a position the sink's database does not (it would "repair" a record to
                // it), and it learns the lease rows' positions from its listings anyway.
                Ok(outcome) => return Ok(outcome),
                Err(e @ Error::LeaseLost { .. }) => {
                    let lost = Err(e);
                    handle.record_outcome(&last, &lost);
                    return lost.map(|()| BatchOutcome::default());
                }
                Err(e) if e.is_retryable() && attempts < self.retry_policy().attempts => {
                    debug!(error = %e, attempts, key = %token.key, "batch transaction failed; retrying");
                    tokio::time::sleep(self.retry_policy().pause(attempts)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// An error from user code as a shardlease error: kept when it is one, a sqlx error
    /// classified like the store's own (so serialization failures are retried), anything else a
    /// permanent backend error (the runtime still retries the batch, with its own backoff).
    fn user_error(&self, e: BoxError) -> Error {
        let e = match e.downcast::<Error>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        match e.downcast::<sqlx::Error>() {
            Ok(e) => errors::backend(DB::dialect(), "the batch's writes", *e),
            Err(e) => Error::backend(false, "the batch's writes failed", e),
        }
    }
}
