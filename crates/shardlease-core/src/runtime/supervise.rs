//! Supervision of a worker's loops: a worker never outlives one of them.
//!
//! A worker is its loops (heartbeat, watchdog, balance, shard sync, store notices) and one task
//! per held lease. Each loop runs inside [`supervised`], which catches its end: a loop that panics,
//! or returns while the worker is meant to run, stops the whole worker at once, as a crash would
//! and sooner: taking stops, every lease task of the current incarnation is fenced (it stops and
//! writes nothing, so no checkpoint moves past the fence), the heartbeat stops, and peers take the
//! leases once the heartbeat has stood still for the failover timeout, as after a crash. The cause
//! is logged at ERROR, counted (`shardlease_worker_loop_failures_total{loop}`) and kept for the
//! handle: [`WorkerHandle::stop_cause`](super::WorkerHandle::stop_cause), `is_running()` false,
//! and the shutdown's report.
//!
//! Why stop rather than restart the loop: the balance loop owns the worker's coordination state
//! (tasks, claims, grants, its memory of the namespace), and a loop that died half-way through a
//! pass left that state half-changed; a restarted loop would act on it. A worker that stops is a
//! case the algorithm already handles (a crash), with a bound on how long its leases go unread.
//! Plug-in code (a user's store, source, checkpointer or balancer) is contained one call at a
//! time before it gets here (`contain`), so what reaches supervision is a bug of the runtime.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tracing::error;

use super::contain::panic_message;
use super::shared::Shared;

/// One of a worker's loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Loop {
    Heartbeat,
    Watchdog,
    Balance,
    ShardSync,
    Notices,
}

impl Loop {
    /// The loop's name, as logs, metrics and [`LoopFailure::loop_name`] give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Loop::Heartbeat => "heartbeat",
            Loop::Watchdog => "watchdog",
            Loop::Balance => "balance",
            Loop::ShardSync => "shard_sync",
            Loop::Notices => "notices",
        }
    }

    /// Every loop, for the test hook that makes one fail.
    #[cfg(feature = "test-util")]
    pub(crate) fn from_name(name: &str) -> Option<Loop> {
        [Loop::Heartbeat, Loop::Watchdog, Loop::Balance, Loop::ShardSync, Loop::Notices]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

/// One of a worker's loops ended while the worker was meant to run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoopFailure {
    /// The loop: `heartbeat`, `watchdog`, `balance`, `shard_sync` or `notices`.
    pub loop_name: &'static str,
    /// Whether it panicked (otherwise it returned, which a loop does only when the worker stops).
    pub panicked: bool,
    /// The panic's message, or what happened.
    pub message: String,
}

impl std::fmt::Display for LoopFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.panicked {
            write!(f, "the {} loop panicked: {}", self.loop_name, self.message)
        } else {
            write!(f, "the {} loop ended: {}", self.loop_name, self.message)
        }
    }
}

/// Why a worker stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopCause {
    /// [`WorkerHandle::shutdown`](super::WorkerHandle::shutdown) stopped it.
    Shutdown,
    /// It was stopped at once, releasing nothing: the handle was dropped without `shutdown()`, or
    /// the `crash()` test hook.
    Abrupt,
    /// One of its loops failed: the worker fenced itself and stopped; its leases move to peers
    /// once its heartbeat has stood still for the failover timeout.
    LoopFailed(LoopFailure),
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopCause::Shutdown => f.write_str("shut down"),
            StopCause::Abrupt => f.write_str("stopped abruptly"),
            StopCause::LoopFailed(l) => write!(f, "stopped because {l}"),
        }
    }
}

/// Records why the worker stopped, unless a cause was recorded already (the first one stands).
pub(crate) fn set_cause(shared: &Shared, cause: StopCause) {
    shared.stop_cause.send_if_modified(|c| {
        if c.is_some() {
            return false;
        }
        *c = Some(cause);
        true
    });
}

/// Runs one of the worker's loops, and stops the worker when the loop ends before it should (see
/// the module documentation). The loop is dropped at once when the worker stops.
pub(crate) async fn supervised(
    shared: Arc<Shared>,
    which: Loop,
    body: impl Future<Output = ()> + Send,
) {
    let body = AssertUnwindSafe(injectable(&shared, which, body)).catch_unwind();
    let ended = tokio::select! {
        biased;
        _ = shared.cancel.cancelled() => return,
        ended = body => ended,
    };
    let failure = match ended {
        Err(p) => {
            LoopFailure { loop_name: which.name(), panicked: true, message: panic_message(p) }
        }
        // Returning is how the loops that end at a shutdown end (taking stops first); otherwise
        // it is a loop that gave up.
        Ok(()) if shared.stop_taking.is_cancelled() => return,
        Ok(()) => LoopFailure {
            loop_name: which.name(),
            panicked: false,
            message: "returned while the worker was running".to_owned(),
        },
    };
    fail(&shared, failure);
}

/// Stops the worker after a loop failed: see the module documentation.
fn fail(shared: &Shared, failure: LoopFailure) {
    shared.metrics.loop_failed(failure.loop_name);
    let stopping = shared.stop_taking.is_cancelled();
    error!(
        worker = %shared.id(),
        r#loop = failure.loop_name,
        panicked = failure.panicked,
        message = %failure.message,
        "a worker loop failed: stopping the worker (its lease tasks are fenced and write nothing; \
         peers take its leases once its heartbeat has stood still for the failover timeout)"
    );
    set_cause(shared, StopCause::LoopFailed(failure));
    if stopping {
        // A shutdown is under way and collects its tasks itself; its report carries the cause.
        return;
    }
    shared.stop_taking.cancel();
    // Every task of this incarnation stops on its fence token, writing nothing.
    shared.incarnation.borrow().fence.cancel();
    shared.cancel.cancel();
    // A task that does not stop within half a heartbeat is aborted (as in a self-fence).
    let running: Vec<_> = shared.held.borrow().iter().filter(|t| t.is_running()).cloned().collect();
    if running.is_empty() {
        return;
    }
    let limit = shared.cfg.heartbeat_interval() / 2;
    tokio::spawn(async move { super::shared::end_or_abort(&running, limit).await });
}

/// The loop itself, or (test hook, feature `test-util`) a panic inside it when a test asks.
#[cfg(feature = "test-util")]
async fn injectable(shared: &Shared, which: Loop, body: impl Future<Output = ()>) {
    let mut asked = shared.inject_failure.subscribe();
    tokio::select! {
        biased;
        _ = asked.wait_for(|l| *l == Some(which)) => {
            panic!("injected failure of the {} loop (test hook)", which.name())
        }
        () = body => {}
    }
}

#[cfg(not(feature = "test-util"))]
async fn injectable(_shared: &Shared, _which: Loop, body: impl Future<Output = ()>) {
    body.await
}
