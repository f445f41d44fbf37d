//! One task per held lease: open the shard, feed batches to the processor, handle shard end, and
//! on the way out either write nothing (lease lost, fenced) or hand the lease over / release it by
//! a fenced compare-and-set (handoff, shutdown, processor panic).
//!
//! Processor errors are retried with backoff, never skipped. A panic is caught: the lease is
//! released so the shard resumes from its last checkpoint. Abrupt stops (lease lost, self-fence)
//! abandon in-flight processing at once; graceful ones (handoff, shutdown) let the current batch
//! finish and give the processor a chance to checkpoint.
//!
//! A task never touches the balance loop's state: it tells the loop what it wrote and, however it
//! ends, that it ended (`Event::Exited`); the loop owns the task map. It stops when the loop asks
//! (its own stop channel), when its incarnation fences itself (the fence token) and when the
//! worker shuts down (the shutdown deadline), whichever comes first, without waiting for the loop.

mod hooks;
mod task;

use task::Task;

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use super::balance::{CheckpointSlot, LeaseTask, LoopState};
use super::events::Event;
use super::shared::{HeldLease, Shared, StopReason, Timing};
use crate::ids::WorkerId;
use crate::lease::{Epoch, Lease, LeaseKey, LeaseToken, Version};
use crate::position::Position;
use crate::processor::{CheckpointHandle, CheckpointObserver};
use crate::telemetry::LeaseMetrics;

/// Starts a task for `lease` (owned by this worker at `version`) unless one is in the task map
/// (running, or ended but its `Exited` not yet applied), or the worker is shutting down or fenced.
/// Returns false when no task was started. Called by the balance loop, which owns the map.
///
/// A task started just as a shutdown or a fence begins sees its signal at once (the shutdown
/// deadline, its incarnation's fence token) and stops: no orphan task can run on.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    lease: Lease,
    version: Version,
) -> bool {
    let Some(token) = lease.token() else { return false };
    let (live, fence) = {
        let incarnation = shared.incarnation.borrow();
        (incarnation.live, incarnation.fence.clone())
    };
    if state.tasks.contains_key(&lease.key) || shared.stop_taking.is_cancelled() || !live {
        return false;
    }
    shared.observe(&lease, version);
    state.tasks.grant(lease.key.clone(), token.epoch);
    let (tx, rx) = watch::channel(None);
    let metrics = Arc::new(shared.metrics.lease(&lease.key));
    let done = CancellationToken::new();
    let stop = task::Stops { own: rx, fence, shutdown: shared.shutdown.subscribe() };
    let timing = state.timing.fork();
    let checkpoint = Arc::new(CheckpointSlot::default());
    let report = Report {
        events: shared.events.clone(),
        key: lease.key.clone(),
        epoch: token.epoch,
        outcome: Ended::NotReleased,
        metrics: metrics.clone(),
        done: done.clone(),
    };
    let span = tracing::info_span!("lease", shard = %lease.key, epoch = %lease.epoch);
    let join = tokio::spawn(
        run(shared.clone(), lease.clone(), stop, timing, report, checkpoint.clone())
            .instrument(span),
    );
    let abort = join.abort_handle();
    let held = Arc::new(HeldLease { key: lease.key.clone(), done, abort, metrics });
    state
        .tasks
        .insert(lease.key.clone(), LeaseTask { epoch: token.epoch, stop: tx, held, checkpoint });
    true
}

/// What a lease task reports to the balance loop when it ends, however it ends (an abort or a
/// panic too): the loop removes it from the task map and forgets its grant.
#[derive(Debug)]
pub(crate) struct Exited {
    /// The lease.
    pub key: LeaseKey,
    /// The epoch the task ran it at (a later task for the same key has another entry).
    pub epoch: Epoch,
    /// What became of the lease.
    pub outcome: Ended,
}

/// Sends a task's [`Exited`] report when dropped: at the end of `run`, or when the task is
/// aborted or panics outside the processor (the outcome then stays `NotReleased`). Its gauges
/// go to 0 first, so a task started next for the same shard keeps its own.
struct Report {
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    key: LeaseKey,
    epoch: Epoch,
    outcome: Ended,
    metrics: Arc<LeaseMetrics>,
    done: CancellationToken,
}

impl Drop for Report {
    fn drop(&mut self) {
        self.metrics.ended();
        self.done.cancel();
        let outcome = std::mem::replace(&mut self.outcome, Ended::Nothing);
        // An error means the balance loop is gone (the worker stopped): nobody left to tell.
        let exited = Exited { key: self.key.clone(), epoch: self.epoch, outcome };
        let _ = self.events.send(Event::Exited(exited));
    }
}

/// How a lease task ended.
enum Exit {
    Finished,
    Stopped(StopReason),
    Lost,
    Panicked(String),
    /// The processor returned [`crate::Error::ReleaseLease`] (the message says why).
    GaveUp(String),
}

/// What became of a lease when its task ended: what a shutdown reports for it.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Released or handed over, with this checkpoint stored for the next owner.
    Released(Position),
    /// Released or handed over after the processor was cut short (a graceful stop's deadline
    /// passed in a batch or in `shutdown_requested`): the next owner processes again what
    /// followed this checkpoint.
    Abandoned(Position),
    /// A release was due but could not be written (the store kept failing, or the lease moved
    /// on meanwhile).
    NotReleased,
    /// Nothing to release: the shard ended, the lease was lost or moved on, or the worker
    /// stopped abruptly.
    Nothing,
}

/// The outcome of one step that may be interrupted.
enum Step<T> {
    Done(T),
    Exit(Exit),
}

/// The runtime's view of a lease's checkpoints (see `Shared`'s observer), plus its age metric.
struct Observed {
    shared: Arc<Shared>,
    metrics: Arc<LeaseMetrics>,
    /// Where the balance loop reads the latest checkpoint from.
    slot: Arc<CheckpointSlot>,
    /// Whether positions live in the lease record (asked once per task).
    in_lease: bool,
}

impl CheckpointObserver for Observed {
    fn written(&self, token: &LeaseToken, position: &Position) {
        let now = tokio::time::Instant::now();
        self.metrics.checkpointed(now);
        // Positions a custom checkpointer keeps outside the lease record are not remembered: the
        // record never holds them, and a listing would then look like a store that lost writes.
        if self.in_lease {
            self.slot.put(token.epoch, position.clone(), now);
        }
    }

    /// The lease moved on: the next balance pass lists the leases (and counts the loss).
    fn refused(&self, _token: &LeaseToken) {
        self.shared.tell(Event::WantListing { now: true });
    }
}

async fn run(
    shared: Arc<Shared>,
    lease: Lease,
    stop: task::Stops,
    timing: Timing,
    mut report: Report,
    slot: Arc<CheckpointSlot>,
) {
    let Some(token) = lease.token() else {
        report.outcome = Ended::Nothing;
        return;
    };
    let metrics = report.metrics.clone();
    let in_lease = shared.checkpointer.stores_in_lease();
    let observer =
        Arc::new(Observed { shared: shared.clone(), metrics: metrics.clone(), slot, in_lease });
    let cp = CheckpointHandle::observed(shared.checkpointer.clone(), token.clone(), observer);
    let mut task = Task {
        shared: shared.clone(),
        token: token.clone(),
        cp,
        stop,
        processor: None,
        metrics: metrics.clone(),
        cut_short: false,
        timing,
    };
    debug!("lease task started");
    // `cancel` fires only after a shutdown has dealt with every task it knew of, or on a crash:
    // a task still running then has nothing left to write, so it simply stops.
    let exit = tokio::select! {
        biased;
        e = task.drive(&lease) => e,
        _ = shared.cancel.cancelled() => {
            report.outcome = Ended::Nothing;
            return;
        }
    };
    let ended = match exit {
        Exit::Finished => {
            info!("shard finished");
            // Remembered at once: should the store lose the end, this worker restores the lease
            // as finished rather than letting it be read again after its children started.
            let finished = Lease {
                owner: Some(token.owner.clone()),
                epoch: token.epoch,
                checkpoint: Position::ShardEnd,
                ..lease.clone()
            };
            shared.tell(Event::Remember(finished, tokio::time::Instant::now()));
            shared.tell(Event::Changed { n: 1 });
            shared.tell(Event::WantListing { now: true });
            Ended::Nothing
        }
        Exit::Lost => {
            shared.metrics.lost(&token.key);
            warn!("lease lost (a fenced write was refused)");
            shared.tell(Event::WantListing { now: true });
            Ended::Nothing
        }
        Exit::Stopped(StopReason::Handoff { to, .. }) => {
            transfer(&shared, &mut task.timing, &token, Some(to)).await
        }
        Exit::Stopped(StopReason::Shutdown { .. }) => {
            transfer(&shared, &mut task.timing, &token, None).await
        }
        Exit::Stopped(StopReason::LeaseLost) => {
            debug!("lease task stopped: the lease moved on");
            Ended::Nothing
        }
        Exit::Stopped(reason) => {
            debug!(?reason, "lease task stopped");
            Ended::Nothing
        }
        Exit::GaveUp(msg) => {
            warn!(reason = %msg, "record processor gave the lease up; releasing it so the shard resumes from its checkpoint");
            transfer(&shared, &mut task.timing, &token, None).await
        }
        Exit::Panicked(msg) => {
            error!(panic = %msg, "record processor panicked; releasing the lease so the shard resumes from its checkpoint");
            metrics.processor_panic();
            transfer(&shared, &mut task.timing, &token, None).await
        }
    };
    let ended = match ended {
        Ended::Released(at) if task.cut_short => Ended::Abandoned(at),
        other => other,
    };
    // Reported when `report` drops, after everything the task writes: the balance loop then
    // removes the task and its grant together, between two of its own steps, so a reconcile sees
    // either both or neither. A listing older than this moment that still shows the lease as ours
    // at this epoch then leads to a compare-and-set against a stale version, never to a second
    // task.
    report.outcome = ended;
}

/// Hands the lease to `to` (if its claim is still standing) or releases it, by compare-and-set.
/// Only acts while `token` is still current: a lease that moved on is left alone. Gives up when
/// the store keeps failing past the shutdown timeout (the lease then expires with this worker).
pub(crate) async fn transfer(
    shared: &Shared,
    timing: &mut Timing,
    token: &LeaseToken,
    to: Option<WorkerId>,
) -> Ended {
    let deadline = tokio::time::Instant::now() + shared.cfg.shutdown_timeout();
    let policy = super::cas::Policy::until(deadline);
    let what = "hand the lease over";
    let outcome = super::cas::write(shared, timing, &token.key, None, policy, what, |l| {
        crate::lease::transition::hand_over(l, token, to.as_ref(), crate::clock::now_millis())
    })
    .await;
    if let super::cas::Outcome::Declined(why) = &outcome {
        debug!(shard = %token.key, epoch = %token.epoch, %why, "not handed over or released");
    }
    if let super::cas::Outcome::Written(next, v) = outcome {
        shared.observe(&next, v);
        shared.tell(Event::Remember(next.clone(), tokio::time::Instant::now()));
        shared.tell(Event::Changed { n: 1 });
        match &next.owner {
            Some(w) => {
                shared.metrics.handed_over(&token.key);
                info!(to = %w, epoch = %next.epoch, "lease handed over");
            }
            None => info!(epoch = %next.epoch, "lease released"),
        }
        return Ended::Released(next.checkpoint);
    }
    Ended::NotReleased
}
