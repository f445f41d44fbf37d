//! A lease task's reading loop: where to start (the checkpoint, or a pinned `LATEST`), reading
//! batches and feeding them to the processor, idle backoff, the shard's end (children created,
//! `ShardEnd` checkpointed), and the stop requests it watches for between and during steps.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::hooks::{panic_message, Hook};
use super::{Exit, Step};
use crate::checkpointer::{Checkpointer, StoreCheckpointer};
use crate::error::Error;
use crate::lease::{Lease, LeaseKey, LeaseToken};
use crate::position::Position;
use crate::processor::{CheckpointHandle, LeaseContext, RecordProcessor};
use crate::runtime::events::Event;
use crate::runtime::shared::{Shared, StopReason, Timing};
use crate::source::{ShardInfo, ShardReader};
use crate::telemetry::LeaseMetrics;

pub(super) struct Task {
    pub(super) shared: Arc<Shared>,
    pub(super) token: LeaseToken,
    pub(super) cp: CheckpointHandle,
    pub(super) stop: Stops,
    pub(super) processor: Option<Box<dyn RecordProcessor>>,
    pub(super) metrics: Arc<LeaseMetrics>,
    /// A graceful stop cut the processor short (its deadline passed in a batch or in
    /// `shutdown_requested`): a release then reports the lease abandoned, not released.
    pub(super) cut_short: bool,
    /// The task's own jitter and backoff.
    pub(super) timing: Timing,
}

/// What can stop a lease task: the balance loop's request (the task's own channel), its
/// incarnation's fence, and the worker's shutdown. None of them needs the loop to act: a fence
/// or a shutdown reaches every task directly.
pub(crate) struct Stops {
    /// The balance loop's request (a lost lease, a handoff).
    pub own: watch::Receiver<Option<StopReason>>,
    /// Cancelled when the incarnation that started the task fences itself.
    pub fence: CancellationToken,
    /// Set when the worker shuts down: stop gracefully by this deadline.
    pub shutdown: watch::Receiver<Option<Instant>>,
}

impl Stops {
    /// The stop that applies now, if any: a fence first, then the loop's request, then a
    /// shutdown. Marks what it read as seen, so [`Stops::changed`] waits for something new.
    pub(super) fn current(&mut self) -> Option<StopReason> {
        if self.fence.is_cancelled() {
            return Some(StopReason::Fenced);
        }
        let own = self.own.borrow_and_update().clone();
        let shutdown = *self.shutdown.borrow_and_update();
        own.or_else(|| shutdown.map(|deadline| StopReason::Shutdown { deadline }))
    }

    /// Waits until one of them changes. False when the loop's end of the task's channel is gone
    /// (the worker stopped): nothing more will come, and the caller treats it as a fence.
    pub(super) async fn changed(&mut self) -> bool {
        tokio::select! {
            _ = self.fence.cancelled() => true,
            r = self.own.changed() => r.is_ok(),
            r = self.shutdown.changed() => r.is_ok(),
        }
    }
}

/// How far an idle shard's polling backs off: after consecutive empty reads the wait doubles from
/// `idle_poll_interval` up to this many times it.
const IDLE_BACKOFF_MAX_FACTOR: u32 = 4;

/// How far before its opening a `LATEST` start is pinned when the reader cannot say where it
/// landed: a generous allowance for the clock skew between this machine and the stream's.
const UNRESOLVED_LATEST_MARGIN_MILLIS: i64 = 60_000;

impl Task {
    pub(super) fn key(&self) -> &LeaseKey {
        &self.token.key
    }

    /// The stop requested so far, if any.
    pub(super) fn pending_stop(&mut self) -> Option<StopReason> {
        self.stop.current()
    }

    /// Waits for any stop request. A dropped sender (the worker is gone) counts as fenced.
    pub(super) async fn any_stop(stop: &mut Stops) -> StopReason {
        loop {
            if let Some(r) = stop.current() {
                return r;
            }
            if !stop.changed().await {
                return StopReason::Fenced;
            }
        }
    }

    /// Waits until in-flight processing must be abandoned: an abrupt stop (lease lost, fenced), or
    /// a graceful one whose deadline has passed.
    pub(super) async fn abrupt_stop(stop: &mut Stops) -> StopReason {
        loop {
            let current = stop.current();
            match current {
                Some(r) if r.is_abrupt() => return r,
                Some(r) => {
                    if let Some(deadline) = r.deadline() {
                        tokio::select! {
                            biased;
                            _ = tokio::time::sleep_until(deadline) => return r,
                            changed = stop.changed() => if !changed {
                                return StopReason::Fenced;
                            },
                        }
                        continue;
                    }
                }
                None => {}
            }
            if !stop.changed().await {
                return StopReason::Fenced;
            }
        }
    }

    /// Sleeps for `d` unless a stop arrives first.
    pub(super) async fn pause(&mut self, d: std::time::Duration) -> Option<StopReason> {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(d) => None,
            r = Self::any_stop(&mut self.stop) => Some(r),
        }
    }

    /// Runs a store or source call unless a stop that abandons in-flight work (a lost lease, a
    /// fence, a graceful stop whose deadline passed) comes first. Such a stop must reach
    /// `on_stop`, and the processor its farewell, while the call is still on its way: a fence
    /// or a shutdown aborts a task that does not stop in time, and an abort drops the processor
    /// without a word (the simulation found it on a slow store, in a shard end's calls).
    pub(super) async fn unless_stopped<T>(
        &mut self,
        call: impl std::future::Future<Output = T>,
    ) -> Step<T> {
        tokio::select! {
            biased;
            r = Self::abrupt_stop(&mut self.stop) => Step::Exit(Exit::Stopped(r)),
            v = call => Step::Done(v),
        }
    }

    /// Opens the shard at `position` (see [`Task::unless_stopped`]).
    async fn open(
        &mut self,
        position: &Position,
    ) -> Step<crate::error::Result<Box<dyn ShardReader>>> {
        let (source, key, position) =
            (self.shared.source.clone(), self.key().clone(), position.clone());
        self.unless_stopped(async move { source.open(&key, &position).await }).await
    }

    pub(super) async fn drive(&mut self, lease: &Lease) -> Exit {
        match self.drive_inner(lease).await {
            Step::Done(()) => Exit::Finished,
            Step::Exit(Exit::Stopped(reason)) => self.on_stop(reason).await,
            Step::Exit(Exit::Lost) => {
                self.tell_lost().await;
                Exit::Lost
            }
            // The lease is released for the shard to resume from its checkpoint: the processor
            // must write nothing more, panicked or not.
            Step::Exit(Exit::Panicked(msg)) => {
                self.tell_lost().await;
                Exit::Panicked(msg)
            }
            Step::Exit(Exit::GaveUp(msg)) => {
                self.tell_lost().await;
                Exit::GaveUp(msg)
            }
            Step::Exit(e) => e,
        }
    }

    pub(super) async fn drive_inner(&mut self, lease: &Lease) -> Step<()> {
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
        let mut backoff = self.timing.backoff();
        let mut idle_factor: u32 = 1;
        loop {
            if let Some(r) = self.pending_stop() {
                return Step::Exit(Exit::Stopped(r));
            }
            let mut current = match reader.take() {
                Some(r) => r,
                None => match self.open(&position).await {
                    Step::Exit(e) => return Step::Exit(e),
                    Step::Done(Ok(r)) => r,
                    Step::Done(Err(e)) => {
                        warn!(error = %crate::error::ErrorChain(&e), %position, "opening the shard failed; retrying");
                        let d = backoff.next(&mut self.timing);
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
                    let d = backoff.next(&mut self.timing);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                    continue;
                }
            };
            backoff = self.timing.backoff();
            reader = Some(current);
            self.metrics.read(&batch);
            if let Some(last) = batch.last_position() {
                let started = tokio::time::Instant::now();
                // Balancing by load, the batch is credited its share of the worker's cores
                // rather than its wall time (see `core_share`).
                let share = self.shared.core_share.as_ref().map(|s| s.start(started));
                if let Step::Exit(e) = self.call(Hook::Process(&batch)).await {
                    return Step::Exit(e);
                }
                let n = batch.records.len() as u64;
                self.shared.metrics.records(n);
                let now = tokio::time::Instant::now();
                let took = now.duration_since(started);
                let busy = share.map_or(took, |s| s.end(now));
                self.metrics.processed(&batch, took, busy);
                position = last;
            }
            self.metrics.handled(&batch, tokio::time::Instant::now());
            if let Some(children) = batch.end {
                return self.shard_end(children).await;
            }
            if batch.records.is_empty() {
                let base = self.shared.cfg.idle_poll_interval();
                let d = self.timing.jittered(base.saturating_mul(idle_factor));
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
    pub(super) async fn start_position(&mut self, lease: &Lease) -> Step<Position> {
        if self.shared.checkpointer.stores_in_lease() {
            return Step::Done(lease.checkpoint.clone());
        }
        let mut backoff = self.timing.backoff();
        loop {
            match self.shared.checkpointer.fetch(self.key()).await {
                Ok(p) => return Step::Done(p.unwrap_or_else(|| lease.checkpoint.clone())),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "fetching the checkpoint failed; retrying");
                    let d = backoff.next(&mut self.timing);
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
    pub(super) async fn pin(
        &mut self,
        lease: &Lease,
        start: Position,
    ) -> Step<(Position, Box<dyn ShardReader>)> {
        let mut backoff = self.timing.backoff();
        let reader = loop {
            if let Some(r) = self.pending_stop() {
                return Step::Exit(Exit::Stopped(r));
            }
            match self.shared.source.open(self.key(), &start).await {
                Ok(r) => break r,
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), position = %start, "opening the shard failed; retrying");
                    let d = backoff.next(&mut self.timing);
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
                        let now = tokio::time::Instant::now();
                        self.shared.tell(Event::Remember(mine, now));
                    }
                    return Step::Done((pinned, reader));
                }
                Err(Error::LeaseLost { .. }) => return Step::Exit(Exit::Lost),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "pinning the start position failed; retrying");
                    let d = backoff.next(&mut self.timing);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }

    /// The shard is closed and read: create the children, let the processor checkpoint
    /// `ShardEnd`, and refuse to finish until it has.
    pub(super) async fn shard_end(&mut self, children: Vec<ShardInfo>) -> Step<()> {
        let mut backoff = self.timing.backoff();
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
            let (checkpointer, key) = (self.shared.checkpointer.clone(), self.key().clone());
            let fetched =
                match self.unless_stopped(async move { checkpointer.fetch(&key).await }).await {
                    Step::Done(f) => f,
                    Step::Exit(e) => return Step::Exit(e),
                };
            match fetched {
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
            let d = backoff.next(&mut self.timing);
            if let Some(r) = self.pause(d).await {
                return Step::Exit(Exit::Stopped(r));
            }
        }
        self.mark_finished().await
    }

    /// When positions live outside the lease record, marks the lease itself finished (fenced by
    /// its epoch) so the children unblock: the lease store decides when they may start.
    pub(super) async fn mark_finished(&mut self) -> Step<()> {
        if self.shared.checkpointer.stores_in_lease() {
            return Step::Done(());
        }
        let mut backoff = self.timing.backoff();
        let marker = Arc::new(StoreCheckpointer::new(self.shared.store.clone()));
        loop {
            let (marker, token) = (marker.clone(), self.token.clone());
            let marked = async move { marker.checkpoint(&token, &Position::ShardEnd).await };
            let marked = match self.unless_stopped(marked).await {
                Step::Done(m) => m,
                Step::Exit(e) => return Step::Exit(e),
            };
            match marked {
                Ok(()) => return Step::Done(()),
                Err(Error::LeaseLost { .. }) => return Step::Exit(Exit::Lost),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "marking the lease finished failed; retrying");
                    let d = backoff.next(&mut self.timing);
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
    pub(super) async fn create_child(&mut self, child: &ShardInfo) -> Step<()> {
        let mut backoff = self.timing.backoff();
        let own = self.shared.source.initial_position(&child.id);
        let initial = own.as_ref().unwrap_or(self.shared.cfg.initial_position());
        let start = crate::runtime::shard_sync::child_start(initial);
        loop {
            let (store, me, shard, start) =
                (self.shared.store.clone(), self.key().clone(), child.clone(), start.clone());
            let attempt = async move {
                for p in shard.parents.iter().filter(|p| **p != me) {
                    match store.get_lease(p).await {
                        Ok(Some(_)) => {}
                        // Undecodable, but it exists; the child stays blocked by it.
                        Err(Error::Corrupt { .. }) => {}
                        Ok(None) => return Ok(false),
                        Err(e) => return Err(e),
                    }
                }
                let lease = Lease {
                    epoch: crate::runtime::recovery::creation_epoch(),
                    ..Lease::new(shard.id.clone(), start)
                        .with_parents(shard.parents.iter().cloned())
                };
                store.create_lease(&lease).await?;
                crate::error::Result::Ok(true)
            };
            let attempt = match self.unless_stopped(attempt).await {
                Step::Done(a) => a,
                Step::Exit(e) => return Step::Exit(e),
            };
            match attempt {
                Ok(true) => return Step::Done(()),
                Ok(false) => {
                    debug!(child = %child.id, "another parent has no lease yet; leaving the child to it");
                    return Step::Done(());
                }
                Err(e) => {
                    warn!(child = %child.id, error = %crate::error::ErrorChain(&e), "creating a child lease failed; retrying");
                    let d = backoff.next(&mut self.timing);
                    if let Some(r) = self.pause(d).await {
                        return Step::Exit(Exit::Stopped(r));
                    }
                }
            }
        }
    }
}
