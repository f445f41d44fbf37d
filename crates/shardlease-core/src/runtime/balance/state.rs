//! The worker's coordination state, owned by the balance loop alone, and how each event from the
//! other tasks changes it.
//!
//! Nothing here is behind a lock: the loop's task is the only one that reads or writes it. Other
//! tasks send an [`Event`] and the loop applies it between two of its own steps; what they need
//! to read (the tasks, the change count) the loop publishes on a `watch` after every change.

use std::collections::BTreeSet;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use super::super::events::{Event, Observation, Request};
use super::super::lease_task::Exited;
use super::super::shared::{Shared, Timing};
use super::super::shutdown_report::ShutdownReport;

/// Everything the balance loop owns.
pub(crate) struct LoopState {
    /// Claims, from both sides: this worker's on peers' leases, and peers' on its own.
    pub claims: super::claims::ClaimBook,
    /// The lease tasks this worker started, and the grants of its leases.
    pub tasks: super::tasks::TaskRegistry,
    /// What this worker remembers of the namespace's leases, to repair a store that loses
    /// writes (see `recover`).
    pub memory: super::recover::RecoveryMemory,
    /// Who is alive, the peers' published change counts, and the holds on takes.
    pub membership: super::membership::Membership,
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
    /// Corrupt records already reported (reported once, then counted quietly).
    pub reported_corrupt: BTreeSet<String>,
    /// The shard sync's published expectation a listing last missed a lease of (a full sync was
    /// asked for it).
    pub missed: Option<super::super::events::Expected>,
    /// The loop's jitter and backoff.
    pub timing: Timing,
    /// Balancing by load: the loads and moves the balancer's load view is built from.
    pub loads: super::loads::LoadTracker,
    /// The balancer, called with its panics contained (see `runtime::contain`).
    pub balancer: super::super::contain::GuardedBalancer,
}

impl LoopState {
    pub(crate) fn new(shared: &Shared) -> Self {
        LoopState {
            tasks: super::tasks::TaskRegistry::default(),
            claims: super::claims::ClaimBook::default(),
            memory: super::recover::RecoveryMemory::default(),
            membership: super::membership::Membership::new(shared.cfg.failover_timeout()),
            changes: 0,
            schedule: super::schedule::PassScheduler::new(shared.cfg.shard_sync_interval()),
            in_pass: false,
            answering: Vec::new(),
            shutdown: None,
            reported_corrupt: BTreeSet::new(),
            missed: None,
            timing: Timing::new(&shared.cfg, shared.rng(1)),
            loads: super::loads::LoadTracker::default(),
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
            Event::Workers(observation) => self.on_workers(shared, &observation),
            Event::Fenced { old } => {
                // The fence token stopped every task of the old incarnation already; their
                // `Exited` events follow. Its claims and grants mean nothing to the new one.
                debug!(%old, "fenced: forgetting the old incarnation's claims and grants");
                self.claims.forget_mine();
                self.tasks.forget_grants();
            }
            Event::Resumed => self.want_listing(true),
            Event::Changed { n } => self.changed(shared, n),
            Event::WantListing { now } => self.want_listing(now),
            Event::Noticed => self.noticed(),
            Event::Loads(loads) => self.loads.set_mine(loads),
            Event::Remember(lease, at) => self.memory.remember(&lease, at),
            Event::Request(Request::Pass(reply)) => {
                self.answering.push(reply);
                self.want_listing(true);
            }
            Event::Request(Request::Shutdown { deadline, reply }) => {
                self.shutdown = Some((deadline, reply));
            }
            Event::Request(Request::Memory(reply)) => {
                self.sync_checkpoints();
                let _ = reply.send(self.memory.leases());
            }
        }
    }

    /// Applies `event` and every event waiting behind it, then publishes the task map once.
    pub(crate) fn apply_all(
        &mut self,
        shared: &Shared,
        event: Event,
        events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    ) {
        self.apply(shared, event);
        self.drain(shared, events);
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
        self.tasks.publish(shared);
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

    /// A listing of the worker records: the membership view, the peers' published loads, and
    /// the listings they call for.
    fn on_workers(&mut self, shared: &Shared, observation: &Observation) {
        let seen = self.membership.seen(shared, observation);
        if matches!(shared.cfg.balance(), crate::Balance::ByLoad(_)) {
            let live = self.membership.liveness().live_workers();
            self.loads.set_peers(observation.records.as_slice(), &shared.id(), &live);
        }
        if seen.list_now {
            self.want_listing(true);
        } else if seen.peer_moved {
            // Listed soon (a claim on this worker's leases is answered, a lease handed to it
            // resumed, without waiting for the regular pass), but no sooner than half a balance
            // interval after the last listing: with many workers changing owners together (a
            // fleet starting, a rolling deploy), a pass per signal would list the leases back to
            // back on every worker.
            self.schedule.peer_moved();
        }
    }

    /// Brings the memory of this worker's own leases up to their latest checkpoints, read from
    /// each task's slot (see [`CheckpointSlot`](super::tasks::CheckpointSlot)): a quiet fleet
    /// does not list, so a store that loses writes is still repaired to the latest one. Called
    /// where the memory is read (after a pass's listing, for a shard sync) and when a task ends,
    /// not once per checkpoint.
    pub(crate) fn sync_checkpoints(&mut self) {
        for (key, task) in self.tasks.iter() {
            self.memory.read_slot(key, &task.checkpoint);
        }
    }

    /// Removes a task that reported its end, and forgets its grant, both only if they are still
    /// the ones of that task (a later task for the key has its own epoch).
    fn on_exit(&mut self, shared: &Shared, exited: Exited) {
        // Its last checkpoint first, while the task is still registered.
        if let Some(task) = self.tasks.get(&exited.key) {
            self.memory.read_slot(&exited.key, &task.checkpoint);
        }
        self.tasks.exited(exited, shared.stop_taking.is_cancelled());
        // Whatever ended the task, the next pass looks at the lease again.
        self.schedule.want_listing();
    }
}
