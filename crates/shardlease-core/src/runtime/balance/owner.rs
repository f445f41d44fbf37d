//! The worker's coordination state, owned by the balance loop alone, and how each event from the
//! other tasks changes it.
//!
//! Nothing here is behind a lock: the loop's task is the only one that reads or writes it. Other
//! tasks send an [`Event`] and the loop applies it between two of its own steps; what they need
//! to read (the tasks, the change count) the loop publishes on a `watch` after every change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::super::events::{Event, Request};
use super::super::lease_task::Exited;
use super::super::recovery;
use super::super::shared::{HeldLease, Shared, StopReason, Timing};
use super::super::shutdown_report::ShutdownReport;
use crate::ids::WorkerId;
use crate::lease::{Epoch, Lease, LeaseKey, LeaseToken, Version};
use crate::liveness::Liveness;
use crate::position::Position;
use crate::worker_record::WorkerRecord;

/// A claim this worker made on a peer's lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MyClaim {
    /// When the claim timeout last restarted (the claim was written, or the record changed).
    pub since: Instant,
    /// The version of the lease record last seen under the claim.
    pub seen: Version,
}

/// A lease task this worker started. Inserted when it starts, removed when the loop applies the
/// task's `Exited` event; in between, the task may already have ended (see
/// [`LeaseTask::is_running`]).
pub(crate) struct LeaseTask {
    pub epoch: Epoch,
    pub stop: watch::Sender<Option<StopReason>>,
    /// What is published of the task (its key, `done` token, abort handle and metrics), built
    /// once so that publishing the map clones a pointer per task.
    pub held: Arc<HeldLease>,
}

impl LeaseTask {
    /// Whether the task is still running: not yet ended, whether or not its `Exited` event has
    /// been applied. A task that ended holds nothing any more.
    pub(crate) fn is_running(&self) -> bool {
        self.held.is_running()
    }

    /// Ends the task at once.
    pub(crate) fn abort(&self) {
        self.held.abort.abort();
    }
}

/// Why a worker record's removal may wait: how many failover timeouts a worker's heartbeat must
/// stand still before its record is removed. A worker that stopped heartbeating fenced itself
/// after one failover timeout and comes back under a new id, so its record is garbage long before
/// this; a process restarted under the same id beats again, and the removal is conditional on the
/// beat, so it never loses a live record.
const DEAD_RECORD_AGE_IN_FAILOVERS: u32 = 10;

/// What the balance loop remembers of a lease's owner, balancing by load (see
/// [`Owner::owner_seen`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SeenOwner {
    /// The owner at the last listing.
    pub owner: Option<WorkerId>,
    /// When this worker saw the owner change (never, for a lease seen with one owner only).
    pub moved_at: Option<Instant>,
    /// The lease's last load figure from before any move in progress.
    pub load: Option<f64>,
}

/// Everything the balance loop owns.
pub(crate) struct Owner {
    /// The lease tasks this worker started.
    pub tasks: BTreeMap<LeaseKey, LeaseTask>,
    /// The task map changed since it was last published.
    pub tasks_changed: bool,
    /// The epoch at which this process acquired each lease it runs or is about to run (by its own
    /// compare-and-set, or by a handoff answering its own claim). A lease the store says this
    /// worker owns at any other epoch was not given to this process (a crashed predecessor with
    /// the same id held it, or a listing predates a handoff): it is re-taken by compare-and-set
    /// with a new epoch, never resumed, so a peer taking it at the same moment cannot also win.
    pub granted: BTreeMap<LeaseKey, Epoch>,
    /// Claims this worker made. The claim timeout only runs while the lease record stands still
    /// (the owner writes nothing), so an owner that is alive, checkpointing or acknowledging a
    /// handoff is never stolen from.
    pub my_claims: BTreeMap<LeaseKey, MyClaim>,
    /// Who is alive, from the heartbeat's listings of the worker records.
    pub liveness: Liveness,
    /// Each peer's published count of ownership changes, as last listed.
    peers: Option<BTreeMap<WorkerId, u64>>,
    /// When the latest listing of the worker records was sent.
    pub workers_listed: Option<Instant>,
    /// Per lease, the furthest checkpoint and highest epoch this worker has seen, to notice and
    /// repair a store that lost or rolled back writes, and when its own write last updated each
    /// entry (see `recovery`).
    pub memory: recovery::Memory,
    /// Until when this worker takes no lease that merely looks available: the store was seen
    /// going back in time (a worker's beat went backwards), so a lease may look free only because
    /// its owner's writes were lost; its running owner repairs it within a pass.
    pub hold_takes_until: Option<Instant>,
    /// The start hold: until a listing of the worker records sent at or after this moment (one
    /// heartbeat interval after this worker's first heartbeat), its passes take no lease that
    /// is free, only claim, so workers started together split the free leases on one view
    /// (docs/algorithm.md, "Starting together"). `None` before the first heartbeat.
    pub full_view_at: Option<Instant>,
    /// Whether a peer left or died during the start hold, which ends it: that peer's leases are
    /// free now, and holding them until the full view would leave them unread for up to a
    /// heartbeat interval, while taking them costs at most a handoff to a worker that started
    /// together with this one and is not yet seen (docs/algorithm.md, "Starting together").
    pub fleet_changed_in_hold: bool,
    /// This worker's lease loads, as its heartbeat last measured them (balancing by load).
    pub my_loads: Vec<crate::load::LeaseLoad>,
    /// What each peer last published of its loads (balancing by load).
    pub peer_loads: BTreeMap<WorkerId, crate::balancer::PublishedLoad>,
    /// Per lease, its owner at the last listing, when this worker saw the owner change (never,
    /// for one seen once) and its last load figure from before any move in progress: a lease that
    /// moved waits out the load cooldown, counted at that figure.
    pub owner_seen: BTreeMap<LeaseKey, SeenOwner>,
    /// Balancing by load: until when each worker sits out load moves while its figures settle
    /// (see [`crate::balancer::LoadView::settling`]): it received a lease (an owner changing
    /// from one worker to another), or took one never seen owned.
    pub worker_moved: BTreeMap<WorkerId, Instant>,
    /// Until when each worker that gave a lease for load may give but not receive
    /// (`LoadView::gave`).
    pub worker_gave: BTreeMap<WorkerId, Instant>,
    /// Balancing by load: the snapshot of the last listing, which a quiet pass plans on again
    /// with newer loads to see whether a listing is due.
    pub load_snapshot: Option<crate::balancer::Snapshot>,
    /// Peers already warned about for balancing by another mode (once per peer and process).
    pub other_mode_warned: std::collections::BTreeSet<WorkerId>,
    /// Ownership changes this process made: published on [`Shared::changes`] for the heartbeat.
    pub changes: u64,
    /// When the next pass runs and whether it lists (see `schedule`): every reason to list the
    /// leases (a peer's changes, a worker that came, went or died, a lease task that ended, a
    /// refused write) goes there.
    pub schedule: super::schedule::PassScheduler,
    /// Whether a pass is running: changes made meanwhile are published at its end, so peers see
    /// all of a pass's claims at once.
    pub in_pass: bool,
    /// Callers of `balance_now`, answered after the coming pass.
    pub answering: Vec<oneshot::Sender<()>>,
    /// The shutdown's request, once it arrived.
    pub shutdown: Option<(Instant, oneshot::Sender<ShutdownReport>)>,
    /// Reports of tasks that ended after taking stopped: the shutdown collects them from here.
    pub exited_while_stopping: Vec<Exited>,
    /// When the previous pass's listing was sent.
    pub previous_listing: Option<Instant>,
    /// Leases this worker owns that a peer claimed: the record version last listed, and the
    /// earliest moment that version can have been written (see `yield_unanswered_claims`).
    pub claims_on_mine: BTreeMap<LeaseKey, (Version, Instant)>,
    /// Since when each lost lease has been found lost, in passes without a break.
    pub lost_since: BTreeMap<LeaseKey, Instant>,
    /// Corrupt records already reported (reported once, then counted quietly).
    pub reported_corrupt: BTreeSet<String>,
    /// The shard sync's published expectation a listing last missed a lease of (a full sync was
    /// asked for it).
    pub missed: Option<super::super::events::Expected>,
    /// The loop's jitter and backoff.
    pub timing: Timing,
    /// The balancer, called with its panics contained (see `runtime::contain`).
    pub balancer: super::super::contain::GuardedBalancer,
}

impl Owner {
    pub(crate) fn new(shared: &Shared) -> Self {
        Owner {
            tasks: BTreeMap::new(),
            tasks_changed: false,
            granted: BTreeMap::new(),
            my_claims: BTreeMap::new(),
            liveness: Liveness::new(shared.cfg.failover_timeout()),
            peers: None,
            workers_listed: None,
            memory: BTreeMap::new(),
            hold_takes_until: None,
            full_view_at: None,
            fleet_changed_in_hold: false,
            my_loads: Vec::new(),
            peer_loads: BTreeMap::new(),
            owner_seen: BTreeMap::new(),
            worker_moved: BTreeMap::new(),
            worker_gave: BTreeMap::new(),
            other_mode_warned: std::collections::BTreeSet::new(),
            load_snapshot: None,
            changes: 0,
            schedule: super::schedule::PassScheduler::new(shared.cfg.shard_sync_interval()),
            in_pass: false,
            answering: Vec::new(),
            shutdown: None,
            exited_while_stopping: Vec::new(),
            previous_listing: None,
            claims_on_mine: BTreeMap::new(),
            lost_since: BTreeMap::new(),
            reported_corrupt: BTreeSet::new(),
            missed: None,
            timing: Timing::new(&shared.cfg, shared.rng(1)),
            balancer: super::super::contain::GuardedBalancer::new(
                shared.balancer.clone(),
                shared.panics.clone(),
            ),
        }
    }

    /// Applies one event.
    pub(crate) fn apply(&mut self, shared: &Shared, event: Event) {
        match event {
            Event::Exited(exited) => self.on_exit(shared, exited),
            Event::Workers { records, sent, received } => {
                self.on_workers(shared, &records, sent, received)
            }
            Event::Fenced { old } => {
                // The fence token stopped every task of the old incarnation already; their
                // `Exited` events follow. Its claims and grants mean nothing to the new one.
                debug!(%old, "fenced: forgetting the old incarnation's claims and grants");
                self.my_claims.clear();
                self.granted.clear();
            }
            Event::Resumed => self.want_listing(true),
            Event::Changed { n } => self.changed(shared, n),
            Event::WantListing { now } => self.want_listing(now),
            Event::Noticed => self.noticed(),
            Event::Loads(loads) => self.my_loads = loads,
            Event::Remember(lease, at) => self.remember(&lease, at),
            Event::Checkpointed(token, position, at) => self.checkpointed(&token, &position, at),
            Event::Request(Request::Pass(reply)) => {
                self.answering.push(reply);
                self.want_listing(true);
            }
            Event::Request(Request::Shutdown { deadline, reply }) => {
                self.shutdown = Some((deadline, reply));
            }
            Event::Request(Request::Memory(reply)) => {
                let _ = reply.send(self.memory.values().map(|r| r.lease.clone()).collect());
            }
        }
    }

    /// Applies every event waiting in the channel.
    pub(crate) fn drain(
        &mut self,
        shared: &Shared,
        events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    ) {
        while let Ok(event) = events.try_recv() {
            self.apply(shared, event);
        }
        self.publish_tasks(shared);
    }

    /// A store notice: a listing at a pass that runs after the notice's coalescing delay, and no
    /// sooner than the notice gap after the last pass a notice brought forward.
    fn noticed(&mut self) {
        let timing = &mut self.timing;
        self.schedule.noticed(Instant::now(), || timing.jittered(super::NOTICE_COALESCE));
    }

    /// Asks for a listing at the next pass, and for that pass at once with `now`.
    pub(crate) fn want_listing(&mut self, now: bool) {
        if now {
            self.schedule.want_pass_now();
        } else {
            self.schedule.want_listing();
        }
    }

    /// Counts `n` ownership changes: published for the heartbeat at once, or at the end of the
    /// running pass; this worker's own next pass lists too.
    pub(crate) fn changed(&mut self, shared: &Shared, n: u64) {
        if n == 0 {
            return;
        }
        self.changes += n;
        self.schedule.want_listing();
        if !self.in_pass {
            self.publish_changes(shared);
        }
    }

    /// Publishes the change count (the heartbeat beats early when it moves).
    pub(crate) fn publish_changes(&self, shared: &Shared) {
        shared.changes.send_if_modified(|c| {
            let moved = *c != self.changes;
            *c = self.changes;
            moved
        });
    }

    /// Publishes the task map for those outside the loop (see [`Shared::held`]), when it
    /// changed since the last time. The loop calls this after each batch of starts and removals
    /// (a chunk of takes, the events it applied), not after each one: with 10,000 leases, a
    /// publication per start made a first pass quadratic. A task started but not yet published
    /// stops all the same on a crash, a fence or a shutdown (it watches their signals itself).
    pub(crate) fn publish_tasks(&mut self, shared: &Shared) {
        if !std::mem::take(&mut self.tasks_changed) {
            return;
        }
        let held: Vec<Arc<HeldLease>> = self.tasks.values().map(|t| t.held.clone()).collect();
        shared.held.send_replace(Arc::new(held));
    }

    /// How many leases this worker is running.
    pub(crate) fn held(&self) -> usize {
        self.tasks.values().filter(|t| t.is_running()).count()
    }

    /// Whether takes are on hold (the store was seen going back in time).
    pub(crate) fn holding_takes(&self) -> bool {
        self.hold_takes_until.is_some_and(|until| Instant::now() < until)
    }

    /// Whether the start hold is on: this worker has not yet listed the worker records one
    /// heartbeat interval after its first heartbeat (see [`Owner::full_view_at`]), and no peer
    /// left or died meanwhile ([`Owner::fleet_changed_in_hold`]).
    pub(crate) fn before_full_view(&self) -> bool {
        if self.fleet_changed_in_hold {
            return false;
        }
        match self.full_view_at {
            None => true,
            Some(at) => self.workers_listed.is_none_or(|listed| listed < at),
        }
    }

    /// Removes a task that reported its end, and forgets its grant, both only if they are still
    /// the ones of that task (a later task for the key has its own epoch).
    fn on_exit(&mut self, shared: &Shared, exited: Exited) {
        if self.tasks.get(&exited.key).is_some_and(|t| t.epoch == exited.epoch) {
            self.tasks.remove(&exited.key);
            self.tasks_changed = true;
        }
        if self.granted.get(&exited.key) == Some(&exited.epoch) {
            self.granted.remove(&exited.key);
        }
        // Whatever ended the task, the next pass looks at the lease again.
        self.schedule.want_listing();
        if shared.stop_taking.is_cancelled() {
            self.exited_while_stopping.push(exited);
        }
    }

    /// Warns once per peer that balances by the other mode (its record publishes a load when it
    /// balances by load, and none when it balances by count): the two rules disagree on where
    /// leases belong, so such a fleet may move leases back and forth.
    fn check_balance_modes(&mut self, shared: &Shared, records: &[WorkerRecord]) {
        let by_load = matches!(shared.cfg.balance(), crate::Balance::ByLoad(_));
        let me = shared.id();
        for r in records.iter().filter(|r| r.id != me) {
            if r.load.is_some() != by_load && self.other_mode_warned.insert(r.id.clone()) {
                let (mine, theirs) =
                    if by_load { ("by load", "by count") } else { ("by count", "by load") };
                shared.metrics.balance_mode_mismatch();
                warn!(
                    peer = %r.id,
                    mine,
                    theirs,
                    "a peer balances by another mode: every worker of a fleet must use the same \
                     `Balance`, or leases may move back and forth between the two rules"
                );
            }
        }
    }

    /// A listing of the worker records: the liveness view, the peers' published change counts,
    /// and the listings and holds they call for.
    fn on_workers(
        &mut self,
        shared: &Shared,
        records: &[WorkerRecord],
        sent: Instant,
        received: Instant,
    ) {
        let change = self.observe_workers(records, sent, received);
        self.check_balance_modes(shared, records);
        if matches!(shared.cfg.balance(), crate::Balance::ByLoad(_)) {
            let me = shared.id();
            self.peer_loads = records
                .iter()
                .filter(|r| r.id != me)
                .map(|r| {
                    let load = crate::balancer::PublishedLoad::new(
                        r.load.unwrap_or(0.0),
                        r.lease_loads.clone(),
                    );
                    (r.id.clone(), load)
                })
                .collect();
        }
        if !change.went_back.is_empty() {
            // A running owner repairs what it runs within a (jittered) pass; give it that and a
            // heartbeat before taking anything that only looks available.
            let grace = shared.cfg.balance_interval().mul_f64(1.0 + shared.cfg.jitter())
                + shared.cfg.heartbeat_interval();
            self.hold_takes_until = Some(Instant::now() + grace);
            warn!(
                workers = ?change.went_back,
                ?grace,
                "worker records went back in time (the store lost writes): taking no lease that \
                 looks available for a while, so their owners repair them first"
            );
        }
        let me = shared.id();
        let now: BTreeMap<_, _> =
            records.iter().filter(|r| r.id != me).map(|r| (r.id.clone(), r.changes)).collect();
        let moved = self.peers.as_ref() != Some(&now);
        if moved {
            debug!("a peer changed owners, came or went: the next pass lists the leases");
        }
        self.peers = Some(now);
        let held = self.before_full_view();
        self.workers_listed = self.workers_listed.max(Some(sent));
        if held && change.needs_balance() {
            debug!(left = ?change.vanished, died = ?change.newly_dead, "a peer left or died during the start hold: ending it");
            self.fleet_changed_in_hold = true;
        }
        if held && !self.before_full_view() {
            // The start hold is over: the pass that takes the free leases runs now.
            self.want_listing(true);
        }
        self.remove_long_dead(shared);
        shared.metrics.live_workers(records.len());
        if change.needs_balance() || !change.went_back.is_empty() {
            self.want_listing(true);
        } else if moved {
            // Listed soon (a claim on this worker's leases is answered, a lease handed to it
            // resumed, without waiting for the regular pass), but no sooner than half a balance
            // interval after the last listing: with many workers changing owners together (a
            // fleet starting, a rolling deploy), a pass per signal would list the leases back to
            // back on every worker.
            self.schedule.peer_moved();
        }
    }

    /// Updates the liveness view from a listing of worker records, and logs the peers judged
    /// dead or gone since the last view. The heartbeat's listings and a take-over's fresh look
    /// at the workers both observe through here.
    pub(crate) fn observe_workers(
        &mut self,
        records: &[WorkerRecord],
        sent: Instant,
        received: Instant,
    ) -> crate::liveness::LivenessChange {
        let change = self.liveness.observe(records, sent, received);
        for w in &change.newly_dead {
            info!(worker = %w, "peer judged dead (heartbeat stood still for the failover timeout)");
        }
        for w in &change.vanished {
            info!(worker = %w, "peer left");
        }
        change
    }

    /// Removes, from a task of its own, the records of workers dead for
    /// [`DEAD_RECORD_AGE_IN_FAILOVERS`] failover timeouts (crashed processes with generated ids
    /// would otherwise leave one record each, listed by every worker on every heartbeat forever).
    fn remove_long_dead(&mut self, shared: &Shared) {
        let age = shared.cfg.failover_timeout().saturating_mul(DEAD_RECORD_AGE_IN_FAILOVERS);
        let garbage = self.liveness.long_dead(age);
        if garbage.is_empty() {
            return;
        }
        let store = shared.store.clone();
        let limit: Duration = shared.cfg.heartbeat_interval();
        tokio::spawn(async move {
            for (id, beat) in garbage {
                match tokio::time::timeout(limit, store.remove_worker_if(&id, beat)).await {
                    Ok(Ok(true)) => {
                        info!(worker = %id, beat, ?age, "removed the record of a long-dead worker")
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => {
                        debug!(worker = %id, error = %crate::error::ErrorChain(&e), "removing a long-dead worker's record failed")
                    }
                    Err(_) => {
                        debug!(worker = %id, "removing a long-dead worker's record timed out")
                    }
                }
            }
        });
    }

    /// Records a write this worker made to a lease (at `at`) in its memory of the namespace (see
    /// `recovery`), so the memory does not wait for the next listing to know what this worker
    /// itself did: a store that loses the write is then repaired to it.
    pub(crate) fn remember(&mut self, lease: &Lease, at: Instant) {
        let entry = self
            .memory
            .entry(lease.key.clone())
            .or_insert_with(|| recovery::Remembered::listed(lease.clone()));
        entry.written_at = entry.written_at.max(Some(at));
        let seen = &mut entry.lease;
        if seen.epoch <= lease.epoch {
            let checkpoint = if seen.checkpoint.would_regress_to(&lease.checkpoint) {
                seen.checkpoint.clone()
            } else {
                lease.checkpoint.clone()
            };
            *seen = Lease { checkpoint, ..lease.clone() };
        }
    }

    /// Records a lease this worker has just taken: [`Owner::remember`], except that the memory
    /// then holds the checkpoint the take wrote, which is where the new task starts, even when
    /// it remembered a later one from an earlier epoch. (The store lost that later checkpoint:
    /// a rollback, or a late write that fenced the old task. The new task reads those records
    /// again either way, and a restore of the later checkpoint under it would make each of the
    /// task's next checkpoints look like a move backwards, so the lease would stop for good.)
    pub(crate) fn remember_taken(&mut self, lease: &Lease, at: Instant) {
        self.remember(lease, at);
        if let Some(entry) = self.memory.get_mut(&lease.key) {
            if entry.lease.epoch == lease.epoch {
                entry.lease.checkpoint = lease.checkpoint.clone();
            }
        }
    }

    /// Keeps the memory of this worker's own leases' checkpoints current without a listing (a
    /// quiet fleet does not list), so a store that loses writes is repaired to the latest one.
    /// (Lease tasks send these only when positions live in the lease record: a custom
    /// checkpointer's positions are never in the record, and a listing would then look like a
    /// store that lost writes.)
    fn checkpointed(&mut self, token: &LeaseToken, position: &Position, at: Instant) {
        if let Some(seen) = self.memory.get_mut(&token.key) {
            if seen.lease.epoch <= token.epoch && !seen.lease.checkpoint.would_regress_to(position)
            {
                seen.written_at = seen.written_at.max(Some(at));
                seen.lease.checkpoint = position.clone();
            }
        }
    }
}
