//! Calling user code: each processor hook is retried with backoff on error (never skipped),
//! caught when it panics, abandoned when a stop must not wait for it, and each lease task ends
//! for its processor with exactly one farewell hook ([`farewell`]).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tracing::{debug, error, warn};

use super::task::Task;
use super::{Exit, Step};
use crate::error::{BoxError, Error};
use crate::processor::LeaseContext;
use crate::runtime::shared::{Shared, StopReason};
use crate::source::Batch;

pub(super) enum Hook<'a> {
    Initialize(&'a LeaseContext),
    Process(&'a Batch),
    ShardEnded,
}

impl Hook<'_> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Hook::Initialize(_) => "initialize",
            Hook::Process(_) => "process_records",
            Hook::ShardEnded => "shard_ended",
        }
    }
}

pub(super) use super::super::contain::panic_message;

/// Whether `e`, or any error in its source chain, is one of ours that `matches`.
fn in_chain(e: &BoxError, matches: impl Fn(&Error) -> bool) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&**e);
    while let Some(err) = next {
        if err.downcast_ref::<Error>().is_some_and(&matches) {
            return true;
        }
        next = err.source();
    }
    false
}

/// Whether a processor reports the loss of its lease itself, wrapped or not: a processor fencing
/// its own sink on the epoch learns it there. (A refusal of a checkpoint through the handle needs
/// no such report: the handle records it, whatever the processor returns.)
fn is_lease_lost(e: &BoxError) -> bool {
    in_chain(e, |e| matches!(e, Error::LeaseLost { .. }))
}

/// Whether a processor error, or any error in its source chain, gives the lease up
/// ([`Error::ReleaseLease`]).
fn gives_up(e: &BoxError) -> bool {
    in_chain(e, |e| matches!(e, Error::ReleaseLease(_)))
}

/// The longest wait between retries of a processor stuck on an error retrying cannot fix.
const STUCK_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a processor error, or any error in its source chain (a user wrapping it), is one
/// retrying cannot fix: invalid input (a checkpoint behind the stored one, say) or configuration.
fn is_permanent(e: &BoxError) -> bool {
    in_chain(e, |e| matches!(e, Error::InvalidInput(_) | Error::Config(_)))
}

/// One stuck lease counted in `WorkerStats::stuck` and the `shardlease_leases_stuck` gauge, for
/// as long as this lives.
struct Stuck(Arc<Shared>);

impl Stuck {
    fn new(shared: &Arc<Shared>) -> Stuck {
        shared.metrics.stuck(1);
        Stuck(shared.clone())
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        self.0.metrics.stuck(-1);
    }
}

/// The hook that tells a processor its lease ends, on a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Farewell {
    /// `lease_lost`: the lease is gone or going without the processor's last checkpoint; it must
    /// write nothing more.
    LeaseLost,
    /// `shutdown_requested`: the lease is released or handed over once the processor has had its
    /// chance to checkpoint.
    ShutdownRequested,
}

/// Which hook a stop for `reason` calls, at `now`: `lease_lost` for an abrupt stop (lost, fenced)
/// and for a graceful one whose deadline has passed, `shutdown_requested` otherwise. With a
/// shard's end (`shard_ended`) and the loss found by a refused write (`lease_lost`), these are the
/// only ways a lease task ends for a processor it created, and each path calls exactly one hook.
pub(crate) fn farewell(reason: &StopReason, now: tokio::time::Instant) -> Farewell {
    match reason.deadline() {
        Some(deadline) if deadline > now => Farewell::ShutdownRequested,
        _ => Farewell::LeaseLost,
    }
}

impl Task {
    /// Calls a processor hook until it succeeds, the lease is lost, a stop arrives or it panics.
    pub(super) async fn call(&mut self, hook: Hook<'_>) -> Step<()> {
        let mut backoff = self.timing.backoff();
        // Set while the processor fails with an error retrying cannot fix; counted in
        // `WorkerStats::stuck` until the call returns, however it returns.
        let mut stuck: Option<Stuck> = None;
        loop {
            let Some(p) = self.processor.as_mut() else { return Step::Done(()) };
            let cp = &self.cp;
            let fut = AssertUnwindSafe(async {
                match &hook {
                    Hook::Initialize(ctx) => p.initialize(ctx).await,
                    Hook::Process(batch) => p.process_records(batch, cp).await,
                    Hook::ShardEnded => p.shard_ended(cp).await,
                }
            })
            .catch_unwind();
            let result = tokio::select! {
                biased;
                r = fut => r,
                r = Self::abrupt_stop(&mut self.stop) => return Step::Exit(Exit::Stopped(r)),
            };
            match result {
                // A refused checkpoint ends the lease whatever the processor made of the error
                // (wrapped it, logged it, or swallowed it and carried on).
                Ok(_) if self.cp.was_refused() => return Step::Exit(Exit::Lost),
                Ok(Ok(())) => return Step::Done(()),
                // A processor fencing its own sink may report the loss itself.
                Ok(Err(e)) if is_lease_lost(&e) => return Step::Exit(Exit::Lost),
                // The processor gives the lease up: released, resumed from its checkpoint.
                Ok(Err(e)) if gives_up(&e) => {
                    self.metrics.processor_error();
                    return Step::Exit(Exit::GaveUp(crate::error::ErrorChain(&*e).to_string()));
                }
                Ok(Err(e)) if is_permanent(&e) => {
                    self.metrics.processor_error();
                    if stuck.is_none() {
                        error!(
                            hook = hook.name(),
                            error = %crate::error::ErrorChain(&*e),
                            "record processor keeps failing with an error retrying cannot fix; the lease is \
                             stuck (WorkerStats::stuck) and retried with backoff up to a minute. A \
                             checkpoint behind the stored one usually means the stream was \
                             re-created under the same name with an old lease table: reset the \
                             lease's checkpoint or delete the lease"
                        );
                        stuck = Some(Stuck::new(&self.shared));
                        backoff = self.timing.backoff().with_max(STUCK_RETRY_MAX);
                    } else {
                        debug!(hook = hook.name(), error = %crate::error::ErrorChain(&*e), "still stuck");
                    }
                }
                Ok(Err(e)) => {
                    self.metrics.processor_error();
                    warn!(hook = hook.name(), error = %crate::error::ErrorChain(&*e), "record processor failed; retrying the same input");
                }
                Err(p) => return Step::Exit(Exit::Panicked(panic_message(p))),
            }
            let d = backoff.next(&mut self.timing);
            if let Some(r) = self.pause(d).await {
                return Step::Exit(Exit::Stopped(r));
            }
        }
    }

    /// Tells the processor why it stops, with the one hook [`farewell`] picks: `lease_lost` (write
    /// nothing more) or `shutdown_requested` (checkpoint now, within the stop's deadline). A
    /// graceful stop whose deadline passed while the processor was still in a batch is cut short:
    /// the lease goes without the processor's last word, so it hears `lease_lost`.
    pub(super) async fn on_stop(&mut self, reason: StopReason) -> Exit {
        match farewell(&reason, tokio::time::Instant::now()) {
            Farewell::LeaseLost => {
                if !reason.is_abrupt() {
                    warn!(?reason, "the graceful stop's deadline passed during the last batch; telling the processor its lease is lost");
                    self.cut_short = true;
                }
                self.tell_lost().await;
            }
            Farewell::ShutdownRequested => self.request_shutdown(&reason).await,
        }
        Exit::Stopped(reason)
    }

    /// Calls `shutdown_requested`, waiting until the stop's deadline at most.
    pub(super) async fn request_shutdown(&mut self, reason: &StopReason) {
        let limit = match reason.deadline() {
            Some(d) => d.saturating_duration_since(tokio::time::Instant::now()),
            None => self.shared.cfg.shutdown_timeout(),
        };
        if let Some(p) = self.processor.as_mut() {
            let fut = AssertUnwindSafe(p.shutdown_requested(&self.cp)).catch_unwind();
            match tokio::time::timeout(limit, fut).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    warn!(error = %crate::error::ErrorChain(&*e), "shutdown_requested failed")
                }
                Ok(Err(p)) => {
                    error!(panic = %panic_message(p), "shutdown_requested panicked")
                }
                Err(_) => {
                    warn!(?limit, "shutdown_requested did not finish in time");
                    self.cut_short = true;
                }
            }
        }
    }

    /// Tells the processor its lease is gone, waiting at most half a heartbeat: a fence must
    /// finish before peers may judge this worker dead, whatever `lease_lost` does.
    pub(super) async fn tell_lost(&mut self) {
        let limit = self.shared.cfg.heartbeat_interval() / 2;
        if let Some(p) = self.processor.as_mut() {
            let told = AssertUnwindSafe(p.lease_lost()).catch_unwind();
            match tokio::time::timeout(limit, told).await {
                Ok(Ok(())) => {}
                Ok(Err(p)) => error!(panic = %panic_message(p), "lease_lost panicked"),
                Err(_) => warn!(?limit, "lease_lost did not return in time; abandoned"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Epoch, LeaseKey, WorkerId};

    /// An error of the processor's own that keeps ours as its source, as `anyhow::Context` does.
    #[derive(Debug)]
    struct Context(Error);

    impl std::fmt::Display for Context {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("writing to the sink")
        }
    }

    impl std::error::Error for Context {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Every stop reason, before and at its deadline, picks the one hook it calls.
    #[test]
    fn every_stop_tells_the_processor_exactly_one_thing() {
        let now = tokio::time::Instant::now();
        let later = now + std::time::Duration::from_secs(1);
        let to = WorkerId::new("b");
        for (reason, want) in [
            (StopReason::LeaseLost, Farewell::LeaseLost),
            (StopReason::Fenced, Farewell::LeaseLost),
            (StopReason::Handoff { to: to.clone(), deadline: later }, Farewell::ShutdownRequested),
            (StopReason::Handoff { to: to.clone(), deadline: now }, Farewell::LeaseLost),
            (StopReason::Shutdown { deadline: later }, Farewell::ShutdownRequested),
            (StopReason::Shutdown { deadline: now }, Farewell::LeaseLost),
        ] {
            assert_eq!(farewell(&reason, now), want, "{reason:?}");
        }
    }

    fn lost() -> Error {
        Error::LeaseLost { key: LeaseKey::new("k"), epoch: Epoch(3) }
    }

    /// A processor whose sink refused a write on the epoch reports the loss wrapped in its own
    /// context: it is still a lost lease (the match on the outer type alone missed it).
    #[test]
    fn a_lost_lease_is_found_under_the_processors_context() {
        assert!(is_lease_lost(&(Box::new(lost()) as BoxError)));
        assert!(is_lease_lost(&(Box::new(Context(lost())) as BoxError)));
        let other = Context(Error::retryable("timeout"));
        assert!(!is_lease_lost(&(Box::new(other) as BoxError)));
        assert!(!is_permanent(&(Box::new(Context(lost())) as BoxError)));
    }
}
