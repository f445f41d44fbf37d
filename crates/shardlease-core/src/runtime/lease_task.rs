//! One task per held lease: open the shard, feed batches to the processor, handle shard end, and
//! on the way out either write nothing (lease lost, fenced) or hand the lease over / release it by
//! a fenced compare-and-set (handoff, shutdown, processor panic).
//!
//! Processor errors are retried with backoff, never skipped. A panic is caught: the lease is
//! released so the shard resumes from its last checkpoint. Abrupt stops (lease lost, self-fence)
//! abandon in-flight processing at once; graceful ones (handoff, shutdown) let the current batch
//! finish and give the processor a chance to checkpoint.
//!
//! A task never touches the task map: however it ends, it reports `Exited` to the balance loop,
//! which owns the map.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use super::shared::{lock, LeaseTask, Shared, StopReason};
use crate::checkpointer::{Checkpointer, StoreCheckpointer};
use crate::error::{BoxError, Error};
use crate::ids::WorkerId;
use crate::lease::{Epoch, Lease, LeaseKey, LeaseToken, Version};
use crate::position::Position;
use crate::processor::{CheckpointHandle, CheckpointObserver, LeaseContext, RecordProcessor};
use crate::source::{Batch, ShardInfo, ShardReader};
use crate::telemetry::LeaseMetrics;

/// Starts a task for `lease` (owned by this worker at `version`) unless one is in the task map
/// (running, or ended but not yet drained), or the worker is shutting down or fenced. Returns
/// false when no task was started. Called by the balance loop only: it alone inserts into the
/// task map, and removes an entry when it drains the task's [`Exited`] report.
///
/// The check is made under the task-map lock, which shutdown and fencing also hold while they
/// read the map: a take that completes during either can never leave an orphan task running.
pub(crate) fn spawn(shared: &Arc<Shared>, lease: Lease, version: Version) -> bool {
    let Some(token) = lease.token() else { return false };
    let mut tasks = lock(&shared.tasks);
    if tasks.contains_key(&lease.key)
        || shared.stop_taking.is_cancelled()
        || shared.fenced.load(std::sync::atomic::Ordering::SeqCst)
    {
        return false;
    }
    shared.observe(&lease, version);
    lock(&shared.granted).insert(lease.key.clone(), token.epoch);
    let (tx, rx) = watch::channel(None);
    let metrics = Arc::new(shared.metrics.lease(&lease.key));
    let done = CancellationToken::new();
    let report = Report {
        exits: shared.exits.clone(),
        key: lease.key.clone(),
        epoch: token.epoch,
        outcome: Ended::NotReleased,
        metrics: metrics.clone(),
        done: done.clone(),
    };
    let span = tracing::info_span!("lease", shard = %lease.key, epoch = %lease.epoch);
    let join = tokio::spawn(run(shared.clone(), lease.clone(), rx, report).instrument(span));
    let abort = join.abort_handle();
    tasks.insert(
        lease.key.clone(),
        LeaseTask { epoch: token.epoch, stop: tx, abort, done, metrics },
    );
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
    exits: tokio::sync::mpsc::UnboundedSender<Exited>,
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
        let _ = self.exits.send(Exited { key: self.key.clone(), epoch: self.epoch, outcome });
    }
}

/// How a lease task ended.
enum Exit {
    Finished,
    Stopped(StopReason),
    Lost,
    Panicked(String),
}

/// What became of a lease when its task ended: what a shutdown reports for it.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Released or handed over, with this checkpoint stored for the next owner.
    Released(Position),
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
}

impl CheckpointObserver for Observed {
    fn written(&self, token: &LeaseToken, position: &Position) {
        self.metrics.checkpointed(tokio::time::Instant::now());
        self.shared.written(token, position);
    }

    fn refused(&self, token: &LeaseToken) {
        self.shared.refused(token);
    }
}

async fn run(
    shared: Arc<Shared>,
    lease: Lease,
    stop: watch::Receiver<Option<StopReason>>,
    mut report: Report,
) {
    let Some(token) = lease.token() else {
        report.outcome = Ended::Nothing;
        return;
    };
    let metrics = report.metrics.clone();
    let observer = Arc::new(Observed { shared: shared.clone(), metrics: metrics.clone() });
    let cp = CheckpointHandle::observed(shared.checkpointer.clone(), token.clone(), observer);
    let mut task = Task {
        shared: shared.clone(),
        token: token.clone(),
        cp,
        stop,
        processor: None,
        metrics: metrics.clone(),
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
            shared.remember(&finished);
            shared.changed_now(1);
            shared.balance_now.notify_one();
            Ended::Nothing
        }
        Exit::Lost => {
            shared.bump(&shared.stats.lost, 1);
            shared.metrics.lost(&token.key);
            warn!("lease lost (a fenced write was refused)");
            shared.want_listing();
            Ended::Nothing
        }
        Exit::Stopped(StopReason::Handoff { to, .. }) => transfer(&shared, &token, Some(to)).await,
        Exit::Stopped(StopReason::Shutdown { .. }) => transfer(&shared, &token, None).await,
        Exit::Stopped(StopReason::LeaseLost) => {
            debug!("lease task stopped: the lease moved on");
            Ended::Nothing
        }
        Exit::Stopped(reason) => {
            debug!(?reason, "lease task stopped");
            Ended::Nothing
        }
        Exit::Panicked(msg) => {
            error!(panic = %msg, "record processor panicked; releasing the lease so the shard resumes from its checkpoint");
            metrics.processor_panic();
            transfer(&shared, &token, None).await
        }
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
pub(crate) async fn transfer(shared: &Shared, token: &LeaseToken, to: Option<WorkerId>) -> Ended {
    let deadline = tokio::time::Instant::now() + shared.cfg.shutdown_timeout();
    let policy = super::cas::Policy::until(deadline);
    let outcome = super::cas::write(shared, &token.key, None, policy, "hand the lease over", |l| {
        if !token.matches(l) {
            return None;
        }
        let next_owner = to.clone().filter(|w| l.live_claim().is_some_and(|c| &c.by == w));
        Some(Lease { epoch: super::recovery::next_epoch(l.epoch), ..l.transferred_to(next_owner) })
    })
    .await;
    if let super::cas::Outcome::Written(next, v) = outcome {
        shared.observe(&next, v);
        shared.remember(&next);
        shared.changed_now(1);
        match &next.owner {
            Some(w) => {
                shared.bump(&shared.stats.handoffs, 1);
                shared.metrics.handed_over(&token.key);
                info!(to = %w, epoch = %next.epoch, "lease handed over");
            }
            None => info!(epoch = %next.epoch, "lease released"),
        }
        return Ended::Released(next.checkpoint);
    }
    Ended::NotReleased
}

enum Hook<'a> {
    Initialize(&'a LeaseContext),
    Process(&'a Batch),
    ShardEnded,
}

impl Hook<'_> {
    fn name(&self) -> &'static str {
        match self {
            Hook::Initialize(_) => "initialize",
            Hook::Process(_) => "process_records",
            Hook::ShardEnded => "shard_ended",
        }
    }
}

struct Task {
    shared: Arc<Shared>,
    token: LeaseToken,
    cp: CheckpointHandle,
    stop: watch::Receiver<Option<StopReason>>,
    processor: Option<Box<dyn RecordProcessor>>,
    metrics: Arc<LeaseMetrics>,
}

/// How far an idle shard's polling backs off: after consecutive empty reads the wait doubles from
/// `idle_poll_interval` up to this many times it.
const IDLE_BACKOFF_MAX_FACTOR: u32 = 4;

/// How far before its opening a `LATEST` start is pinned when the reader cannot say where it
/// landed: a generous allowance for the clock skew between this machine and the stream's.
const UNRESOLVED_LATEST_MARGIN_MILLIS: i64 = 60_000;

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

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
        let n = shared.stats.stuck.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        shared.metrics.leases_stuck(n);
        Stuck(shared.clone())
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        let n = self.0.stats.stuck.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) - 1;
        self.0.metrics.leases_stuck(n);
    }
}

impl Task {
    fn key(&self) -> &LeaseKey {
        &self.token.key
    }

    /// The stop requested so far, if any.
    fn pending_stop(&self) -> Option<StopReason> {
        self.stop.borrow().clone()
    }

    /// Waits for any stop request. A dropped sender (the worker is gone) counts as fenced.
    async fn any_stop(stop: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
        loop {
            if let Some(r) = stop.borrow_and_update().clone() {
                return r;
            }
            if stop.changed().await.is_err() {
                return StopReason::Fenced;
            }
        }
    }

    /// Waits until in-flight processing must be abandoned: an abrupt stop (lease lost, fenced), or
    /// a graceful one whose deadline has passed.
    async fn abrupt_stop(stop: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
        loop {
            let current = stop.borrow_and_update().clone();
            match current {
                Some(r) if r.is_abrupt() => return r,
                Some(r) => {
                    if let Some(deadline) = r.deadline() {
                        tokio::select! {
                            biased;
                            _ = tokio::time::sleep_until(deadline) => return r,
                            changed = stop.changed() => if changed.is_err() {
                                return StopReason::Fenced;
                            },
                        }
                        continue;
                    }
                }
                None => {}
            }
            if stop.changed().await.is_err() {
                return StopReason::Fenced;
            }
        }
    }

    /// Sleeps for `d` unless a stop arrives first.
    async fn pause(&mut self, d: std::time::Duration) -> Option<StopReason> {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(d) => None,
            r = Self::any_stop(&mut self.stop) => Some(r),
        }
    }

    async fn drive(&mut self, lease: &Lease) -> Exit {
        match self.drive_inner(lease).await {
            Step::Done(()) => Exit::Finished,
            Step::Exit(Exit::Stopped(reason)) => self.on_stop(reason).await,
            Step::Exit(Exit::Lost) => {
                self.tell_lost().await;
                Exit::Lost
            }
            Step::Exit(e) => e,
        }
    }

    async fn drive_inner(&mut self, lease: &Lease) -> Step<()> {
        let start = match self.start_position(lease).await {
            Step::Done(p) => p,
            Step::Exit(e) => return Step::Exit(e),
        };
        if start.is_shard_end() {
            // A custom checkpointer may hold `ShardEnd` while the lease record does not (its
            // last owner stopped in between): mark the lease so the children can start.
            return self.mark_finished().await;
        }
        let (start, mut reader) = match start {
            Position::Latest | Position::AtTimestamp { .. } => match self.pin(lease, start).await {
                Step::Done((p, r)) => (p, Some(r)),
                Step::Exit(e) => return Step::Exit(e),
            },
            other => (other, None),
        };
        let ctx = LeaseContext {
            token: self.token.clone(),
            start: start.clone(),
            parents: lease.parents.clone(),
        };
        let factory = self.shared.factory.clone();
        match std::panic::catch_unwind(AssertUnwindSafe(|| factory.create(&ctx))) {
            Ok(p) => self.processor = Some(p),
            Err(p) => return Step::Exit(Exit::Panicked(panic_message(p))),
        }
        if let Step::Exit(e) = self.call(Hook::Initialize(&ctx)).await {
            return Step::Exit(e);
        }
        let mut position = start;
        let mut backoff = self.shared.backoff();
        let mut idle_factor: u32 = 1;
        loop {
            if let Some(r) = self.pending_stop() {
                return Step::Exit(Exit::Stopped(r));
            }
            let mut current = match reader.take() {
                Some(r) => r,
                None => match self.shared.source.open(self.key(), &position).await {
                    Ok(r) => r,
                    Err(e) => {
                        warn!(error = %crate::error::ErrorChain(&e), %position, "opening the shard failed; retrying");
                        let d = backoff.next(&self.shared);
                        if let Some(r) = self.pause(d).await {
                            return Step::Exit(Exit::Stopped(r));
                        }
                        continue;
                    }
                },
            };
            let read = tokio::select! {
                biased;
                b = current.next_batch() => b,
                r = Self::any_stop(&mut self.stop) => return Step::Exit(Exit::Stopped(r)),
            };
            let batch = match read {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "reading the shard failed; reopening after a pause");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                    continue;
                }
            };
            backoff = self.shared.backoff();
            reader = Some(current);
            self.metrics.read(&batch);
            if let Some(last) = batch.last_position() {
                let started = tokio::time::Instant::now();
                if let Step::Exit(e) = self.call(Hook::Process(&batch)).await {
                    return Step::Exit(e);
                }
                let n = batch.records.len() as u64;
                self.shared.bump(&self.shared.stats.records, n);
                self.metrics.processed(&batch, started.elapsed());
                position = last;
            }
            if let Some(children) = batch.end {
                return self.shard_end(children).await;
            }
            if batch.records.is_empty() {
                let base = self.shared.cfg.idle_poll_interval();
                let d = self.shared.jittered(base.saturating_mul(idle_factor));
                idle_factor = (idle_factor * 2).min(IDLE_BACKOFF_MAX_FACTOR);
                if let Some(r) = self.pause(d).await {
                    return Step::Exit(Exit::Stopped(r));
                }
            } else {
                idle_factor = 1;
            }
        }
    }

    /// Where to start: the lease's own checkpoint, or the custom checkpointer's record of it.
    async fn start_position(&mut self, lease: &Lease) -> Step<Position> {
        if self.shared.checkpointer.stores_in_lease() {
            return Step::Done(lease.checkpoint.clone());
        }
        let mut backoff = self.shared.backoff();
        loop {
            match self.shared.checkpointer.fetch(self.key()).await {
                Ok(p) => return Step::Done(p.unwrap_or_else(|| lease.checkpoint.clone())),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "fetching the checkpoint failed; retrying");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }

    /// Opens the shard at a start that moves with time (`LATEST`, `AT_TIMESTAMP`) and checkpoints
    /// the fixed position the reader landed on before any record is processed, so whoever holds
    /// the lease next resumes exactly there: a lease handed over, released or failed over before
    /// its first record must not be reopened at a newer `LATEST` (the records in between would be
    /// skipped). See `ShardReader::resolved_start` for readers that cannot tell.
    async fn pin(
        &mut self,
        lease: &Lease,
        start: Position,
    ) -> Step<(Position, Box<dyn ShardReader>)> {
        let mut backoff = self.shared.backoff();
        let reader = loop {
            if let Some(r) = self.pending_stop() {
                return Step::Exit(Exit::Stopped(r));
            }
            match self.shared.source.open(self.key(), &start).await {
                Ok(r) => break r,
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), position = %start, "opening the shard failed; retrying");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        };
        let pinned = match (reader.resolved_start(), &start) {
            (Some(p), _) => p,
            (None, Position::Latest) => Position::AtTimestamp {
                millis: crate::clock::now_millis_i64()
                    .saturating_sub(UNRESOLVED_LATEST_MARGIN_MILLIS),
            },
            (None, _) => return Step::Done((start, reader)),
        };
        loop {
            match self.cp.checkpoint(pinned.clone()).await {
                Ok(()) => {
                    debug!(from = %start, pinned = %pinned, "start position pinned");
                    // Remember it at once rather than at the next listing: should the store lose
                    // the write, this worker restores the pin, not the moving start. (A custom
                    // checkpointer keeping positions elsewhere leaves the lease record as it is.)
                    if self.shared.checkpointer.stores_in_lease() {
                        let mine = Lease {
                            owner: Some(self.token.owner.clone()),
                            epoch: self.token.epoch,
                            checkpoint: pinned.clone(),
                            ..lease.clone()
                        };
                        self.shared.remember(&mine);
                    }
                    return Step::Done((pinned, reader));
                }
                Err(Error::LeaseLost { .. }) => return Step::Exit(Exit::Lost),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "pinning the start position failed; retrying");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }

    /// Calls a processor hook until it succeeds, the lease is lost, a stop arrives or it panics.
    async fn call(&mut self, hook: Hook<'_>) -> Step<()> {
        let mut backoff = self.shared.backoff();
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
                Ok(Err(e)) if is_permanent(&e) => {
                    self.metrics.processor_error();
                    if stuck.is_none() {
                        error!(
                            hook = hook.name(),
                            error = %crate::error::ErrorChain(&*e),
                            "record processor keeps failing with an error retrying cannot fix;                              the lease is stuck (WorkerStats::stuck) and retried with backoff up                              to a minute. A checkpoint behind the stored one usually means the                              stream was re-created under the same name with an old lease table:                              reset the lease's checkpoint or delete the lease"
                        );
                        stuck = Some(Stuck::new(&self.shared));
                        backoff = self.shared.backoff().with_max(STUCK_RETRY_MAX);
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
            let d = backoff.next(&self.shared);
            if let Some(r) = self.pause(d).await {
                return Step::Exit(Exit::Stopped(r));
            }
        }
    }

    /// The shard is closed and read: create the children, let the processor checkpoint
    /// `ShardEnd`, and refuse to finish until it has.
    async fn shard_end(&mut self, children: Vec<ShardInfo>) -> Step<()> {
        let mut backoff = self.shared.backoff();
        for child in &children {
            match self.create_child(child).await {
                Step::Done(()) => {}
                Step::Exit(e) => return Step::Exit(e),
            }
        }
        loop {
            if let Step::Exit(e) = self.call(Hook::ShardEnded).await {
                return Step::Exit(e);
            }
            match self.shared.checkpointer.fetch(self.key()).await {
                Ok(Some(Position::ShardEnd)) => break,
                Ok(other) => error!(
                    checkpoint = ?other,
                    "shard_ended returned without checkpointing ShardEnd; the shard cannot finish \
                     and its children stay blocked until it does"
                ),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "reading the checkpoint at shard end failed")
                }
            }
            let d = backoff.next(&self.shared);
            if let Some(r) = self.pause(d).await {
                return Step::Exit(Exit::Stopped(r));
            }
        }
        self.mark_finished().await
    }

    /// When positions live outside the lease record, marks the lease itself finished (fenced by
    /// its epoch) so the children unblock: the lease store decides when they may start.
    async fn mark_finished(&mut self) -> Step<()> {
        if self.shared.checkpointer.stores_in_lease() {
            return Step::Done(());
        }
        let mut backoff = self.shared.backoff();
        let marker = StoreCheckpointer::new(self.shared.store.clone());
        loop {
            match marker.checkpoint(&self.token, &Position::ShardEnd).await {
                Ok(()) => return Step::Done(()),
                Err(Error::LeaseLost { .. }) => return Step::Exit(Exit::Lost),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "marking the lease finished failed; retrying");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }

    /// Creates the lease of a child shard, unless another parent of it has no lease yet: that
    /// parent is still to come (its own parent has not ended), and a child created now would see
    /// it as "gone" and start too early. The last parent to end, or the shard sync, creates it.
    async fn create_child(&mut self, child: &ShardInfo) -> Step<()> {
        let mut backoff = self.shared.backoff();
        let store = self.shared.store.clone();
        let me = self.key().clone();
        loop {
            let attempt: crate::error::Result<bool> = async {
                for p in child.parents.iter().filter(|p| **p != me) {
                    match store.get_lease(p).await {
                        Ok(Some(_)) => {}
                        // Undecodable, but it exists; the child stays blocked by it.
                        Err(Error::Corrupt { .. }) => {}
                        Ok(None) => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
                let start = super::shard_sync::child_start(self.shared.cfg.initial_position());
                let lease = Lease {
                    epoch: super::recovery::creation_epoch(),
                    ..Lease::new(child.id.clone(), start)
                        .with_parents(child.parents.iter().cloned())
                };
                store.create_lease(&lease).await?;
                Ok(true)
            }
            .await;
            match attempt {
                Ok(true) => return Step::Done(()),
                Ok(false) => {
                    debug!(child = %child.id, "another parent has no lease yet; leaving the child to it");
                    return Step::Done(());
                }
                Err(e) => {
                    warn!(child = %child.id, error = %crate::error::ErrorChain(&e), "creating a child lease failed; retrying");
                    let d = backoff.next(&self.shared);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }

    /// Tells the processor why it stops: lost (write nothing) or a graceful stop (checkpoint).
    async fn on_stop(&mut self, reason: StopReason) -> Exit {
        if reason.is_abrupt() {
            self.tell_lost().await;
            return Exit::Stopped(reason);
        }
        let limit = match reason.deadline() {
            Some(d) => d.saturating_duration_since(tokio::time::Instant::now()),
            None => self.shared.cfg.shutdown_timeout(),
        };
        if limit.is_zero() {
            warn!(?reason, "the graceful stop's deadline passed during the last batch; stopping without shutdown_requested");
            return Exit::Stopped(reason);
        }
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
                Err(_) => warn!(?limit, "shutdown_requested did not finish in time"),
            }
        }
        Exit::Stopped(reason)
    }

    /// Tells the processor its lease is gone, waiting at most half a heartbeat: a fence must
    /// finish before peers may judge this worker dead, whatever `lease_lost` does.
    async fn tell_lost(&mut self) {
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
