//! What a worker's tasks share: the parts the worker was built from (never changed after), the
//! channel of events to the balance loop (the one owner of the worker's coordination state), and
//! a few signals and published snapshots. Nothing here is state that two tasks write: the balance
//! loop owns the view of leases and workers, the lease tasks, claims, grants, the memory of the
//! namespace and the change counters (`balance::LoopState`), and everyone else tells it what they saw
//! or did through [`Event`]s. docs/algorithm.md, "Who owns the runtime's state".

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::events::Event;
use crate::balancer::Balancer;
use crate::checkpointer::Checkpointer;
use crate::config::Config;
use crate::ids::WorkerId;
use crate::lease::LeaseKey;
use crate::processor::ProcessorFactory;
use crate::source::ShardSource;
use crate::store::LeaseStore;

/// Why a lease task is asked to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// Someone else owns the lease now: tell the processor, write nothing.
    LeaseLost,
    /// This worker fenced itself: tell the processor the lease is lost, write nothing.
    Fenced,
    /// Hand the lease to a claimant: let the processor checkpoint, then transfer. Whatever the
    /// processor is doing is abandoned at `deadline` (the claimant may take the lease by force
    /// after its claim timeout, which validation keeps longer than this).
    Handoff {
        /// The claimant.
        to: WorkerId,
        /// When the in-flight batch and `shutdown_requested` are abandoned.
        deadline: Instant,
    },
    /// Graceful shutdown: let the processor checkpoint, then release, by `deadline`.
    Shutdown {
        /// When the in-flight batch and `shutdown_requested` are abandoned.
        deadline: Instant,
    },
}

impl StopReason {
    /// Whether in-flight processing may be abandoned (the lease is gone anyway).
    pub(crate) fn is_abrupt(&self) -> bool {
        matches!(self, StopReason::LeaseLost | StopReason::Fenced)
    }

    /// When a graceful stop stops waiting for the processor.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            StopReason::Handoff { deadline, .. } | StopReason::Shutdown { deadline } => {
                Some(*deadline)
            }
            StopReason::LeaseLost | StopReason::Fenced => None,
        }
    }
}

/// Who this process is now. Written only by the heartbeat side (the watchdog's fence starts a new
/// incarnation; the next successful heartbeat makes it live), read by everyone.
#[derive(Clone, Debug)]
pub(crate) struct Incarnation {
    /// The id: the configured one at first, `<id>#<random>` after a self-fence, so peers that
    /// judged the old incarnation dead never confuse it with this one. `#` is not allowed in
    /// configured ids, so an incarnation never collides with another worker's id, and the random
    /// part differs between processes restarted under one id.
    pub id: WorkerId,
    /// The ids of this process's earlier incarnations; their leases are re-taken by CAS.
    pub former: Arc<Vec<WorkerId>>,
    /// Cancelled when this incarnation fences itself: every lease task started under it stops at
    /// once and writes nothing (no lock, no round trip through the balance loop, which may be
    /// waiting on the very store that made the heartbeats fail).
    pub fence: CancellationToken,
    /// Whether a heartbeat succeeded since this incarnation began: a fenced worker takes nothing
    /// and runs no pass until then.
    pub live: bool,
}

/// A lease task as the balance loop publishes it, for those who must reach every task without
/// asking the loop: the handle (held leases, a crash), the watchdog (a fence's stragglers), the
/// heartbeat (lease count, checkpoint-age gauges).
#[derive(Clone, Debug)]
pub(crate) struct HeldLease {
    /// The lease.
    pub key: LeaseKey,
    /// Cancelled when the task has ended, however it ended.
    pub done: CancellationToken,
    /// Ends the task at once.
    pub abort: AbortHandle,
    /// The task's per-shard metrics.
    pub metrics: Arc<crate::telemetry::LeaseMetrics>,
}

impl HeldLease {
    /// Whether the task is still running (a task that ended holds nothing any more, even before
    /// the balance loop drained its report).
    pub(crate) fn is_running(&self) -> bool {
        !self.done.is_cancelled()
    }
}

/// Requests to the shard sync loop.
pub(crate) enum SyncRequest {
    /// A full sync now; the result goes to the reply, when there is one
    /// (`WorkerHandle::sync_shards`).
    Now(Option<tokio::sync::oneshot::Sender<crate::error::Result<()>>>),
}

/// Waits until every task of `running` has ended, and aborts those still running after `limit`
/// (one deadline for them all, not one each: with thousands of leases, a limit per task would
/// outlast the failover timeout). What a self-fence and a failed loop do with their tasks.
pub(crate) async fn end_or_abort(running: &[Arc<HeldLease>], limit: Duration) {
    let ended = futures::future::join_all(running.iter().map(|t| t.done.cancelled()));
    if tokio::time::timeout(limit, ended).await.is_err() {
        for t in running {
            t.abort.abort();
        }
    }
}

/// Everything a worker's tasks share: see the module documentation.
pub(crate) struct Shared {
    pub cfg: Config,
    pub store: Arc<dyn LeaseStore>,
    pub source: Arc<dyn ShardSource>,
    pub factory: Arc<dyn ProcessorFactory>,
    pub checkpointer: Arc<dyn Checkpointer>,
    /// The same checkpointer when it is the default one (positions in the lease record), for the
    /// runtime's cache hints ([`Shared::observe`]).
    default_checkpointer: Option<Arc<crate::checkpointer::StoreCheckpointer>>,
    pub balancer: Arc<dyn Balancer>,
    /// Cancelled when the worker stops (gracefully or by crash).
    pub cancel: CancellationToken,
    /// Cancelled when taking new work must stop (start of a shutdown).
    pub stop_taking: CancellationToken,
    /// Events to the balance loop, the owner of the worker's coordination state.
    pub events: UnboundedSender<Event>,
    /// Requests to the shard sync loop.
    pub sync: UnboundedSender<SyncRequest>,
    /// The leases the last full shard sync expects the namespace to hold, as the sync loop
    /// publishes them (see `shard_sync`).
    pub expected: watch::Sender<Option<super::events::Expected>>,
    /// Who this process is now (see [`Incarnation`]).
    pub incarnation: watch::Sender<Incarnation>,
    /// Set by a shutdown: every lease task stops gracefully, by this deadline, at once.
    pub shutdown: watch::Sender<Option<Instant>>,
    /// The lease tasks, as the balance loop last published them (after each batch of starts and
    /// removals).
    pub held: watch::Sender<Arc<Vec<Arc<HeldLease>>>>,
    /// Ownership changes this process made (see `WorkerRecord::changes`), as the balance loop
    /// publishes them: the heartbeat writes the count, and beats early when it moves.
    pub changes: watch::Sender<u64>,
    /// Set after the first successful heartbeat since start (or since a fence): when it was sent.
    pub heartbeat_ok: watch::Sender<Option<Instant>>,
    /// Wakes the heartbeat loop to beat and list the worker records now: the store notified that
    /// a worker record appeared or vanished (see `notices`).
    pub workers_changed: Notify,
    /// Whether the store's change stream is open (see `notices`): peers then hear of this
    /// worker's first heartbeat and of its claims at once, so a starting worker may claim before
    /// its full view of the workers (see `balance::wait_for_first_view`).
    pub notified: watch::Sender<bool>,
    /// This worker's metrics and counters, labelled with its namespace and configured id.
    pub metrics: crate::telemetry::WorkerMetrics,
    /// Balancing by load: the share-out of the worker's cores among the batches in progress,
    /// which credits each batch's busy time (see `core_share`). `None` balancing by count.
    pub core_share: Option<Arc<super::core_share::CoreShare>>,
    /// Why the worker stopped, once it did (the first cause stands; see `supervise`).
    pub stop_cause: watch::Sender<Option<super::supervise::StopCause>>,
    /// Counts and logs the plug-ins' contained panics (see `contain`).
    pub panics: Arc<super::contain::PanicLog>,
    /// Test hook: the loop a test asked to fail (see `supervise`).
    #[cfg(feature = "test-util")]
    pub inject_failure: watch::Sender<Option<super::supervise::Loop>>,
}

/// Separates a configured worker id from the suffix a worker takes when it comes back after
/// fencing itself (`<id>#<random>`); not allowed in configured ids.
pub const INCARNATION_SEPARATOR: char = '#';

/// The receiving ends of a worker's channels, handed to the loops that own them at start.
pub(crate) struct Receivers {
    /// The balance loop's events.
    pub events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    /// The shard sync loop's requests.
    pub sync: tokio::sync::mpsc::UnboundedReceiver<SyncRequest>,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: Config,
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
        checkpointer: Arc<dyn Checkpointer>,
        default_checkpointer: Option<Arc<crate::checkpointer::StoreCheckpointer>>,
        balancer: Arc<dyn Balancer>,
        panics: Arc<super::contain::PanicLog>,
    ) -> (Self, Receivers) {
        let (events, events_rx) = tokio::sync::mpsc::unbounded_channel();
        let (sync, sync_rx) = tokio::sync::mpsc::unbounded_channel();
        let metrics = crate::telemetry::WorkerMetrics::new(
            cfg.namespace().as_str(),
            cfg.worker_id().as_str(),
        )
        .by_stream(source.keys_name_streams());
        let incarnation = Incarnation {
            id: cfg.worker_id().clone(),
            former: Arc::new(Vec::new()),
            fence: CancellationToken::new(),
            live: true,
        };
        let core_share = match cfg.balance() {
            crate::Balance::ByLoad(settings) => {
                Some(super::core_share::CoreShare::new(settings.cores_or_default()))
            }
            crate::Balance::ByCount => None,
        };
        let shared = Shared {
            cfg,
            store,
            source,
            factory,
            checkpointer,
            default_checkpointer,
            balancer,
            cancel: CancellationToken::new(),
            stop_taking: CancellationToken::new(),
            events,
            sync,
            expected: watch::channel(None).0,
            incarnation: watch::channel(incarnation).0,
            shutdown: watch::channel(None).0,
            held: watch::channel(Arc::new(Vec::new())).0,
            changes: watch::channel(0).0,
            heartbeat_ok: watch::channel(None).0,
            workers_changed: Notify::new(),
            notified: watch::channel(false).0,
            metrics,
            core_share,
            stop_cause: watch::channel(None).0,
            panics,
            #[cfg(feature = "test-util")]
            inject_failure: watch::channel(None).0,
        };
        (shared, Receivers { events: events_rx, sync: sync_rx })
    }

    /// This worker's current id.
    pub(crate) fn id(&self) -> WorkerId {
        self.incarnation.borrow().id.clone()
    }

    /// Whether this worker fenced itself and no heartbeat has succeeded since.
    pub(crate) fn is_fenced(&self) -> bool {
        !self.incarnation.borrow().live
    }

    /// Tells the balance loop something. An error means the loop has ended: the worker is
    /// stopping (a loop never ends while the worker runs: `supervise` stops the worker when one
    /// does), so there is nobody left to tell.
    pub(crate) fn tell(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// Tells the default checkpointer what the runtime just read or wrote of a lease (a cache
    /// hint saving a read at the next checkpoint); nothing for a custom checkpointer.
    pub(crate) fn observe(&self, lease: &crate::lease::Lease, version: crate::lease::Version) {
        if let Some(d) = &self.default_checkpointer {
            d.observe(lease, version);
        }
    }

    /// An RNG for one of the worker's loops or tasks: seeded from the configured seed and
    /// `stream` (so a replay draws the same numbers in each), from the OS otherwise.
    pub(crate) fn rng(&self, stream: u64) -> StdRng {
        match self.cfg.rng_seed() {
            Some(seed) => StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            None => StdRng::from_os_rng(),
        }
    }

    /// The leases this worker is running (a task that ended is not counted, even before the
    /// balance loop drained its report).
    pub(crate) fn held_leases(&self) -> Vec<LeaseKey> {
        self.held.borrow().iter().filter(|t| t.is_running()).map(|t| t.key.clone()).collect()
    }
}

/// Jitter and backoff delays drawn from one loop's (or one task's) own RNG, so no two tasks share
/// a generator and a seeded worker replays.
pub(crate) struct Timing {
    rng: StdRng,
    jitter: f64,
    retry_min: Duration,
    retry_max: Duration,
}

impl Timing {
    /// Timings for `cfg`, drawn from `rng`.
    pub(crate) fn new(cfg: &Config, rng: StdRng) -> Self {
        Timing {
            rng,
            jitter: cfg.jitter(),
            retry_min: cfg.retry_min_delay(),
            retry_max: cfg.retry_max_delay(),
        }
    }

    /// Timings of their own for a task started now (a lease task, one of several concurrent
    /// writes), seeded from this generator so a seeded worker still replays.
    pub(crate) fn fork(&mut self) -> Timing {
        Timing { rng: StdRng::seed_from_u64(self.rng.random()), ..*self }
    }

    /// A random u64.
    pub(crate) fn random(&mut self) -> u64 {
        self.rng.random()
    }

    /// `d` moved at random by up to ± the configured jitter fraction.
    pub(crate) fn jittered(&mut self, d: Duration) -> Duration {
        let j = self.jitter;
        if j <= 0.0 {
            return d;
        }
        let factor: f64 = self.rng.random_range(1.0 - j..=1.0 + j);
        d.mul_f64(factor)
    }

    /// A fresh exponential backoff using the configured delays.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff { next: self.retry_min, max: self.retry_max }
    }
}

/// Exponential backoff with jitter, doubling from the minimum to the maximum delay.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// The same, with a longer cap on the delay.
    pub(crate) fn with_max(self, max: Duration) -> Backoff {
        Backoff { max: self.max.max(max), ..self }
    }

    /// The next delay (jittered by `timing`'s RNG).
    pub(crate) fn next(&mut self, timing: &mut Timing) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        timing.jittered(d)
    }
}
