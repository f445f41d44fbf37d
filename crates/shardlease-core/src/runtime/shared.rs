//! State shared by a worker's loops and lease tasks, plus the small timing helpers they all use
//! (jittered intervals and retry backoff drawn from one seedable RNG, so simulations replay).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::balancer::Balancer;
use crate::checkpointer::Checkpointer;
use crate::config::Config;
use crate::ids::WorkerId;
use crate::lease::{Epoch, LeaseKey};
use crate::liveness::Liveness;
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

/// A claim this worker made on a peer's lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MyClaim {
    /// When the claim timeout last restarted (the claim was written, or the record changed).
    pub since: Instant,
    /// The version of the lease record last seen under the claim.
    pub seen: crate::lease::Version,
}

/// A lease task in the balance loop's task map. The loop inserts it when it starts the task and
/// removes it when it drains the task's `Exited` report; in between, the task may already have
/// ended (see [`LeaseTask::is_running`]).
pub(crate) struct LeaseTask {
    pub epoch: Epoch,
    /// The task's per-shard metrics (the heartbeat loop refreshes their checkpoint age).
    pub metrics: Arc<crate::telemetry::LeaseMetrics>,
    pub stop: watch::Sender<Option<StopReason>>,
    /// Ends the task at once (a fence past its deadline, a shutdown's stragglers, a crash).
    pub abort: AbortHandle,
    /// Cancelled when the task has ended, however it ended (an abort too): everything it was
    /// going to write is written.
    pub done: CancellationToken,
}

impl LeaseTask {
    /// Whether the task is still running: not yet ended, whether or not the balance loop has
    /// drained its report. A task that ended holds nothing any more.
    pub(crate) fn is_running(&self) -> bool {
        !self.done.is_cancelled()
    }
}

/// Counters a worker keeps about itself (also exported through the `metrics` facade).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub passes: AtomicU64,
    pub lease_listings: AtomicU64,
    pub taking_passes: AtomicU64,
    pub taken: AtomicU64,
    pub claims: AtomicU64,
    pub handoffs: AtomicU64,
    pub lost: AtomicU64,
    pub fenced: AtomicU64,
    pub records: AtomicU64,
    pub heartbeats: AtomicU64,
    /// Leases whose processor is failing with an error retrying cannot fix (a gauge).
    pub stuck: AtomicU64,
}

/// Everything a worker's tasks share.
pub(crate) struct Shared {
    pub cfg: Config,
    /// The current incarnation's id: the configured id at first, `<id>#<random>` after a
    /// self-fence, so peers that judged the old incarnation dead never confuse it with this one.
    /// `#` is not allowed in configured ids, so an incarnation never collides with another
    /// worker's id, and the random part differs between processes restarted under one id.
    id: Mutex<WorkerId>,
    /// Ids of this process's earlier incarnations; their leases are re-taken by CAS.
    pub former_ids: Mutex<std::collections::BTreeSet<WorkerId>>,
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
    /// The lease tasks this worker started. Only the balance loop inserts and removes (it starts
    /// the tasks and drains their `Exited` reports); the heartbeat, the watchdog, a shutdown and
    /// the handle read it, from other tasks and threads, hence the lock.
    pub tasks: Mutex<BTreeMap<LeaseKey, LeaseTask>>,
    /// Where lease tasks report how they ended; the balance loop owns the receiving end.
    pub exits: UnboundedSender<super::lease_task::Exited>,
    /// Requests to the balance loop (a pass now, a shutdown's collection of the lease tasks).
    pub requests: UnboundedSender<super::balance::Request>,
    pub liveness: Mutex<Liveness>,
    /// Claims this worker made. The claim timeout only runs while the lease record stands still
    /// (the owner writes nothing), so an owner that is alive, checkpointing or acknowledging a
    /// handoff is never stolen from.
    pub my_claims: Mutex<BTreeMap<LeaseKey, MyClaim>>,
    /// The epoch at which this process acquired each lease it runs or is about to run (by its own
    /// compare-and-set, or by a handoff answering its own claim). A lease the store says this
    /// worker owns at any other epoch was not given to this process (a crashed predecessor with
    /// the same id held it, or a listing predates a handoff): it is re-taken by compare-and-set
    /// with a new epoch, never resumed, so a peer taking it at the same moment cannot also win.
    pub granted: Mutex<BTreeMap<LeaseKey, Epoch>>,
    /// Wakes the balance loop for a pass now (it is the only one that runs passes).
    pub balance_now: Notify,
    /// Ownership changes this process made (see `WorkerRecord::changes`): published by every
    /// heartbeat, so peers know when to list the leases again.
    pub changes: AtomicU64,
    /// Bumped for every reason to list the leases at the next balance pass (a peer's changes,
    /// a worker that came, went or died, a lease task that ended, a refused write); a pass that
    /// starts listing records the value it saw, so a bump during the pass is never lost.
    pub listing_wanted: AtomicU64,
    /// A peer published a change (or a worker came): the balance loop lists the leases soon, no
    /// sooner than half a balance interval after its last listing.
    pub peer_changed: Notify,
    /// Wakes the heartbeat loop to publish this worker's changes without waiting an interval.
    pub publish_now: Notify,
    /// Wakes the heartbeat loop to beat and list the worker records now: the store notified
    /// that a worker record appeared or vanished (see `notices`).
    pub workers_changed: Notify,
    /// Set after the first successful heartbeat since start (or since a fence).
    pub heartbeat_ok: watch::Sender<Option<Instant>>,
    /// When the last successful listing of worker records was started.
    pub workers_listed: watch::Sender<Option<Instant>>,
    pub fenced: AtomicBool,
    /// Whether this process has seen the application run: leases in the namespace, or an
    /// established fleet. A lease missing after that is one the store lost, never one of a new
    /// application, so it is not created at `LATEST` (see `shard_sync::start_for_missing`).
    pub seen_running: AtomicBool,
    /// Per lease, the furthest checkpoint and highest epoch this worker has seen, to notice and
    /// repair a store that lost or rolled back writes, and when its own write last updated each
    /// entry (a listing sent before that moment cannot show the write; see `recovery`).
    pub remembered: Mutex<super::recovery::Memory>,
    /// Until when this worker takes no lease that merely looks available: the store was seen
    /// going back in time (a worker's beat went backwards), so a lease may look free only because
    /// its owner's writes were lost; its running owner repairs it within a pass.
    pub hold_takes_until: Mutex<Option<Instant>>,
    /// What the last full shard sync saw, so the next one can skip listing the leases.
    pub last_sync: Mutex<Option<super::shard_sync::LastSync>>,
    /// Wakes the shard sync loop for a full sync now (a listing missed a lease it expected).
    pub sync_now: Notify,
    pub stats: Stats,
    /// This worker's metrics, labelled with its namespace and configured id.
    pub metrics: crate::telemetry::WorkerMetrics,
    rng: Mutex<StdRng>,
}

/// Separates a configured worker id from the suffix a worker takes when it comes back after
/// fencing itself (`<id>#<random>`); not allowed in configured ids.
pub const INCARNATION_SEPARATOR: char = '#';

/// Locks a std mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    ) -> (Self, super::balance::Inbox) {
        let (exits, exits_rx) = tokio::sync::mpsc::unbounded_channel();
        let (requests, requests_rx) = tokio::sync::mpsc::unbounded_channel();
        let inbox = super::balance::Inbox { exits: exits_rx, requests: requests_rx };
        let rng = match cfg.rng_seed() {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let metrics = crate::telemetry::WorkerMetrics::new(
            cfg.namespace().as_str(),
            cfg.worker_id().as_str(),
        );
        let shared = Shared {
            id: Mutex::new(cfg.worker_id().clone()),
            former_ids: Mutex::new(Default::default()),
            liveness: Mutex::new(Liveness::new(cfg.failover_timeout())),
            cfg,
            store,
            source,
            factory,
            checkpointer,
            default_checkpointer,
            balancer,
            cancel: CancellationToken::new(),
            stop_taking: CancellationToken::new(),
            tasks: Mutex::new(BTreeMap::new()),
            exits,
            requests,
            my_claims: Mutex::new(BTreeMap::new()),
            granted: Mutex::new(BTreeMap::new()),
            balance_now: Notify::new(),
            changes: AtomicU64::new(0),
            listing_wanted: AtomicU64::new(0),
            peer_changed: Notify::new(),
            publish_now: Notify::new(),
            workers_changed: Notify::new(),
            heartbeat_ok: watch::channel(None).0,
            workers_listed: watch::channel(None).0,
            fenced: AtomicBool::new(false),
            seen_running: AtomicBool::new(false),
            remembered: Mutex::new(BTreeMap::new()),
            last_sync: Mutex::new(None),
            sync_now: Notify::new(),
            hold_takes_until: Mutex::new(None),
            stats: Stats::default(),
            metrics,
            rng: Mutex::new(rng),
        };
        (shared, inbox)
    }

    /// This worker's current id.
    pub(crate) fn id(&self) -> WorkerId {
        lock(&self.id).clone()
    }

    /// Starts a new incarnation after a self-fence; returns (old id, new id).
    pub(crate) fn reincarnate(&self) -> (WorkerId, WorkerId) {
        let suffix = self.random() as u32;
        let new =
            WorkerId::new(format!("{}{INCARNATION_SEPARATOR}{suffix:08x}", self.cfg.worker_id()));
        let old = std::mem::replace(&mut *lock(&self.id), new.clone());
        lock(&self.former_ids).insert(old.clone());
        (old, new)
    }

    /// Tells the default checkpointer what the runtime just read or wrote of a lease (a cache
    /// hint saving a read at the next checkpoint); nothing for a custom checkpointer.
    pub(crate) fn observe(&self, lease: &crate::lease::Lease, version: crate::lease::Version) {
        if let Some(d) = &self.default_checkpointer {
            d.observe(lease, version);
        }
    }

    /// Records a write this worker made to a lease in its memory of the namespace (see
    /// `recovery`), so the memory does not wait for the next listing to know what this worker
    /// itself did: a store that loses the write is then repaired to it.
    pub(crate) fn remember(&self, lease: &crate::lease::Lease) {
        let mut memory = lock(&self.remembered);
        let entry = memory
            .entry(lease.key.clone())
            .or_insert_with(|| super::recovery::Remembered::listed(lease.clone()));
        entry.written_at = Some(Instant::now());
        let seen = &mut entry.lease;
        if seen.epoch <= lease.epoch {
            let checkpoint = if seen.checkpoint.would_regress_to(&lease.checkpoint) {
                seen.checkpoint.clone()
            } else {
                lease.checkpoint.clone()
            };
            *seen = crate::lease::Lease { checkpoint, ..lease.clone() };
        }
    }

    /// Counts `n` ownership changes this worker just wrote, published by the next heartbeat;
    /// this worker's own next pass lists too. A balance pass publishes once at its end (so that
    /// peers see all of a pass's claims at once); anything else calls [`Shared::publish`] too.
    pub(crate) fn changed(&self, n: u64) {
        if n == 0 {
            return;
        }
        self.changes.fetch_add(n, Ordering::SeqCst);
        self.listing_wanted.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts `n` ownership changes and publishes them at once by an early heartbeat, so peers
    /// list the leases within about a heartbeat.
    pub(crate) fn changed_now(&self, n: u64) {
        if n > 0 {
            self.changed(n);
            self.publish_now.notify_one();
        }
    }

    /// A peer's published change count moved, or a worker came: the balance loop lists the
    /// leases soon (see `balance::run`), no sooner than half a balance interval after its last
    /// listing.
    pub(crate) fn peer_moved(&self) {
        self.listing_wanted.fetch_add(1, Ordering::SeqCst);
        self.peer_changed.notify_one();
    }

    /// Asks for a balance pass that lists the leases, now.
    pub(crate) fn want_listing(&self) {
        self.listing_wanted.fetch_add(1, Ordering::SeqCst);
        self.balance_now.notify_one();
    }

    /// Updates the liveness view from a listing of the worker records sent at `sent`, and logs
    /// the peers judged dead or gone since the last view. The heartbeat loop and a take-over's
    /// fresh look at the workers both observe through here.
    pub(crate) fn observe_workers(
        &self,
        records: &[crate::worker_record::WorkerRecord],
        sent: Instant,
    ) -> crate::liveness::LivenessChange {
        let change = lock(&self.liveness).observe(records, sent, Instant::now());
        for w in &change.newly_dead {
            tracing::info!(worker = %w, "peer judged dead (heartbeat stood still for the failover timeout)");
        }
        for w in &change.vanished {
            tracing::info!(worker = %w, "peer left");
        }
        change
    }

    /// A random u64 from the worker's RNG.
    pub(crate) fn random(&self) -> u64 {
        lock(&self.rng).random()
    }

    /// `d` moved at random by up to ± the configured jitter fraction.
    pub(crate) fn jittered(&self, d: Duration) -> Duration {
        let j = self.cfg.jitter();
        if j <= 0.0 {
            return d;
        }
        let factor: f64 = lock(&self.rng).random_range(1.0 - j..=1.0 + j);
        d.mul_f64(factor)
    }

    /// A fresh exponential backoff using the configured delays.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff { next: self.cfg.retry_min_delay(), max: self.cfg.retry_max_delay() }
    }

    /// The keys of the leases this worker is running (a task that ended is not counted, even
    /// before the balance loop drained its report).
    pub(crate) fn held(&self) -> Vec<LeaseKey> {
        lock(&self.tasks).iter().filter(|(_, t)| t.is_running()).map(|(k, _)| k.clone()).collect()
    }

    pub(crate) fn bump(&self, counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}

impl crate::processor::CheckpointObserver for Shared {
    /// Keeps this worker's memory of its own leases' checkpoints current without a listing (a
    /// quiet fleet does not list), so a store that loses writes is repaired to the latest one.
    /// Positions a custom checkpointer keeps outside the lease record are not remembered: the
    /// record never holds them, and a listing would then look like a store that lost writes.
    fn written(&self, token: &crate::lease::LeaseToken, position: &crate::position::Position) {
        if !self.checkpointer.stores_in_lease() {
            return;
        }
        let mut memory = lock(&self.remembered);
        if let Some(seen) = memory.get_mut(&token.key) {
            if seen.lease.epoch <= token.epoch && !seen.lease.checkpoint.would_regress_to(position)
            {
                seen.written_at = Some(Instant::now());
                seen.lease.checkpoint = position.clone();
            }
        }
    }

    /// The lease moved on: the next balance pass lists the leases (and counts the loss).
    fn refused(&self, _token: &crate::lease::LeaseToken) {
        self.listing_wanted.fetch_add(1, Ordering::SeqCst);
        self.balance_now.notify_one();
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

    /// The next delay (jittered by the worker's RNG).
    pub(crate) fn next(&mut self, shared: &Shared) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        shared.jittered(d)
    }
}
