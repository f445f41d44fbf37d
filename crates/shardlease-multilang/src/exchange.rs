//! One call and response with a child, as the KCL's `MultiLangProtocol` does it: send a message,
//! then read until the child's `status` for it, serving every `checkpoint` it asks for on the
//! way through the lease's fenced [`CheckpointHandle`] and answering each with the name of the
//! exception the KCL's clients know.

use std::time::Duration;

use shardlease::{CheckpointHandle, Error, Position, SequenceNumber};
use tracing::debug;

use crate::child::{ChildProcess, Fault};
use crate::protocol::{FromChild, ToChild};

/// What a checkpoint asked for during a message may write.
#[derive(Clone, Copy, Debug)]
pub enum CheckpointScope<'a> {
    /// No checkpointer (`initialize`, `leaseLost`): every checkpoint is `InvalidStateException`.
    None,
    /// During `processRecords` or `shutdownRequested`: up to `last`, the last record delivered
    /// (`None` before any), which a checkpoint without a sequence number means.
    UpTo {
        /// The handle.
        handle: &'a CheckpointHandle,
        /// The last record delivered.
        last: Option<&'a Position>,
    },
    /// During `shardEnded`: a checkpoint without a sequence number finishes the shard.
    ShardEnd {
        /// The handle.
        handle: &'a CheckpointHandle,
    },
}

/// What the exchange saw besides the status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Checkpoints written.
    pub written: Vec<Position>,
}

/// Sends `msg` and serves the child until its status for it.
pub async fn exchange(
    child: &mut ChildProcess,
    msg: &ToChild,
    scope: CheckpointScope<'_>,
    timeout: Option<Duration>,
) -> Result<Outcome, Fault> {
    let action = msg.action();
    child.send(msg).await?;
    let mut outcome = Outcome::default();
    loop {
        match child.next_message(action, timeout).await? {
            FromChild::Status { response_for } if response_for == action => return Ok(outcome),
            FromChild::Status { response_for } => {
                return Err(Fault::WrongResponse { expected: action, got: response_for })
            }
            FromChild::Checkpoint { sequence_number, sub_sequence_number } => {
                let result =
                    checkpoint(scope, sequence_number.as_deref(), sub_sequence_number).await;
                let error = match result {
                    Ok(Some(p)) => {
                        outcome.written.push(p);
                        None
                    }
                    Ok(None) => None,
                    Err(name) => Some(name.to_owned()),
                };
                debug!(?sequence_number, ?sub_sequence_number, ?error, "checkpoint");
                let reply = ToChild::Checkpoint { sequence_number, sub_sequence_number, error };
                child.send(&reply).await?;
            }
        }
    }
}

/// The KCL exception name for a refused checkpoint.
pub fn exception_name(e: &Error) -> &'static str {
    match e {
        Error::LeaseLost { .. } => "ShutdownException",
        Error::InvalidInput(_) => "IllegalArgumentException",
        Error::Backend { retryable: true, .. } => "ThrottlingException",
        Error::Backend { retryable: false, .. } | Error::Conflict { .. } => {
            "KinesisClientLibDependencyException"
        }
        _ => "InvalidStateException",
    }
}

/// Writes one checkpoint: `Ok(Some(position))` when written, `Ok(None)` when there was nothing
/// to write (no record delivered yet), `Err(exception name)` otherwise.
async fn checkpoint(
    scope: CheckpointScope<'_>,
    seq: Option<&str>,
    sub: Option<i64>,
) -> Result<Option<Position>, &'static str> {
    let (handle, last, at_end) = match scope {
        CheckpointScope::None => return Err("InvalidStateException"),
        CheckpointScope::UpTo { handle, last } => (handle, last, false),
        CheckpointScope::ShardEnd { handle } => (handle, None, true),
    };
    let position = match seq {
        None if at_end => Position::ShardEnd,
        None => match last {
            Some(p) => p.clone(),
            None => return Ok(None),
        },
        Some(s) => {
            let seq = SequenceNumber::parse(s).map_err(|_| "IllegalArgumentException")?;
            let sub = u64::try_from(sub.unwrap_or(0)).map_err(|_| "IllegalArgumentException")?;
            if let Some(Position::Sequence { seq: last_seq, sub: last_sub }) = last {
                // Beyond the last record delivered: the KCL refuses it the same way.
                if (&seq, sub) > (last_seq, *last_sub) {
                    return Err("IllegalArgumentException");
                }
            }
            Position::Sequence { seq, sub }
        }
    };
    match handle.checkpoint(position.clone()).await {
        Ok(()) => Ok(Some(position)),
        Err(e) => Err(exception_name(&e)),
    }
}
