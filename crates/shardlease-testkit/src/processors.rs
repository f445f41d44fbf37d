//! Small processors the runtime's tests share: one that checkpoints every batch and, where a
//! test asks, never returns from a callback (a processor stuck in user code), so the runtime's
//! own bounds (shutdown timeout, fence deadline) can be shown to hold.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::{
    Batch, BoxError, CheckpointHandle, LeaseContext, ProcessorFactory, RecordProcessor,
};

/// Checkpoints after every batch; hangs forever in `shutdown_requested` and/or `lease_lost`
/// when told to.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checkpointing {
    /// Never return from `shutdown_requested`.
    pub hang_on_shutdown: bool,
    /// Never return from `lease_lost`.
    pub hang_on_lease_lost: bool,
}

impl Checkpointing {
    /// A factory making this processor for every lease.
    pub fn factory(self) -> Arc<dyn ProcessorFactory> {
        Arc::new(move |_: &LeaseContext| -> Box<dyn RecordProcessor> { Box::new(self) })
    }
}

#[async_trait]
impl RecordProcessor for Checkpointing {
    async fn process_records(
        &mut self,
        batch: &Batch,
        cp: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        cp.checkpoint_batch(batch).await?;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        if self.hang_on_lease_lost {
            std::future::pending::<()>().await;
        }
    }

    async fn shutdown_requested(&mut self, _cp: &CheckpointHandle) -> Result<(), BoxError> {
        if self.hang_on_shutdown {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}
