//! The task registry: the lease tasks this worker started, the epoch each lease was granted to
//! this process at, and what the shutdown collects. Owned by the balance loop; published for the
//! other tasks on [`Shared::held`] (docs/algorithm.md, "Who owns the runtime's state").
//!
//! A task stays in the registry from its start until the loop applies its `Exited` event; in
//! between it may already have ended, so readers ask the task itself ([`LeaseTask::is_running`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::super::lease_task::Exited;
use super::super::shared::{HeldLease, Shared, StopReason};
use crate::lease::{Epoch, LeaseKey};
use crate::position::Position;

/// The latest checkpoint a lease task wrote (its epoch, the position, when), until the balance
/// loop reads it into its memory of the namespace. The task overwrites it at every checkpoint and
/// the loop takes it when it needs the memory (after a listing, for a shard sync, when the task
/// ends): one uncontended lock per checkpoint, where an event per checkpoint woke the loop each
/// time.
#[derive(Debug, Default)]
pub(crate) struct CheckpointSlot(std::sync::Mutex<Option<(Epoch, Position, Instant)>>);

impl CheckpointSlot {
    /// Records a checkpoint written (replacing any the loop has not read yet).
    pub(crate) fn put(&self, epoch: Epoch, position: Position, at: Instant) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, position, at));
    }

    /// The checkpoint written since the last call, if any.
    pub(crate) fn take(&self) -> Option<(Epoch, Position, Instant)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// A lease task this worker started. Inserted when it starts, removed when the loop applies the
/// task's `Exited` event; in between, the task may already have ended (see
/// [`LeaseTask::is_running`]).
pub(crate) struct LeaseTask {
    /// The epoch the task runs the lease at.
    pub epoch: Epoch,
    /// Asks the task to stop, and why.
    pub stop: watch::Sender<Option<StopReason>>,
    /// What is published of the task (its key, `done` token, abort handle and metrics), built
    /// once so that publishing the map clones a pointer per task.
    pub held: Arc<HeldLease>,
    /// The latest checkpoint the task wrote, for the loop's memory.
    pub checkpoint: Arc<CheckpointSlot>,
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

/// The lease tasks and grants (see the module documentation).
#[derive(Default)]
pub(crate) struct TaskRegistry {
    /// The lease tasks this worker started, by lease.
    by_key: BTreeMap<LeaseKey, LeaseTask>,
    /// The map changed since it was last published.
    changed: bool,
    /// The epoch at which this process acquired each lease it runs or is about to run (by its own
    /// compare-and-set, or by a handoff answering its own claim). A lease the store says this
    /// worker owns at any other epoch was not given to this process (a crashed predecessor with
    /// the same id held it, or a listing predates a handoff): it is re-taken by compare-and-set
    /// with a new epoch, never resumed, so a peer taking it at the same moment cannot also win.
    granted: BTreeMap<LeaseKey, Epoch>,
    /// Reports of tasks that ended after taking stopped: the shutdown collects them from here.
    exited_while_stopping: Vec<Exited>,
}

impl TaskRegistry {
    /// Whether a task is registered for `key` (running or ended but not yet reported).
    pub(crate) fn contains_key(&self, key: &LeaseKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// The task registered for `key`.
    pub(crate) fn get(&self, key: &LeaseKey) -> Option<&LeaseTask> {
        self.by_key.get(key)
    }

    /// Every registered task, by lease.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&LeaseKey, &LeaseTask)> {
        self.by_key.iter()
    }

    /// Registers a task just started (published with the next batch).
    pub(crate) fn insert(&mut self, key: LeaseKey, task: LeaseTask) {
        self.by_key.insert(key, task);
        self.changed = true;
    }

    /// Removes the task of `key` (published with the next batch).
    pub(crate) fn remove(&mut self, key: &LeaseKey) -> Option<LeaseTask> {
        let task = self.by_key.remove(key);
        self.changed |= task.is_some();
        task
    }

    /// How many leases this worker is running.
    pub(crate) fn running(&self) -> usize {
        self.by_key.values().filter(|t| t.is_running()).count()
    }

    /// Records that this process acquired `key` at `epoch`.
    pub(crate) fn grant(&mut self, key: LeaseKey, epoch: Epoch) {
        self.granted.insert(key, epoch);
    }

    /// The epoch this process acquired `key` at, if it did.
    pub(crate) fn granted(&self, key: &LeaseKey) -> Option<Epoch> {
        self.granted.get(key).copied()
    }

    /// Forgets every grant (a fence: they belonged to the old incarnation).
    pub(crate) fn forget_grants(&mut self) {
        self.granted.clear();
    }

    /// Applies a task's report of its end: removes the task and forgets its grant, both only if
    /// they are still that task's (a later task for the key has its own epoch). While `stopping`,
    /// the report is kept for the shutdown.
    pub(crate) fn exited(&mut self, exited: Exited, stopping: bool) {
        if self.by_key.get(&exited.key).is_some_and(|t| t.epoch == exited.epoch) {
            self.by_key.remove(&exited.key);
            self.changed = true;
        }
        if self.granted.get(&exited.key) == Some(&exited.epoch) {
            self.granted.remove(&exited.key);
        }
        if stopping {
            self.exited_while_stopping.push(exited);
        }
    }

    /// The reports kept since taking stopped.
    pub(crate) fn take_exited_while_stopping(&mut self) -> Vec<Exited> {
        std::mem::take(&mut self.exited_while_stopping)
    }

    /// The reports kept since taking stopped, without taking them.
    pub(crate) fn exited_while_stopping(&self) -> &[Exited] {
        &self.exited_while_stopping
    }

    /// Publishes the task map for those outside the loop (see [`Shared::held`]), when it
    /// changed since the last time. The loop calls this after each batch of starts and removals
    /// (a chunk of takes, the events it applied), not after each one: with 10,000 leases, a
    /// publication per start made a first pass quadratic. A task started but not yet published
    /// stops all the same on a crash, a fence or a shutdown (it watches their signals itself).
    pub(crate) fn publish(&mut self, shared: &Shared) {
        if !std::mem::take(&mut self.changed) {
            return;
        }
        let held: Vec<Arc<HeldLease>> = self.by_key.values().map(|t| t.held.clone()).collect();
        shared.held.send_replace(Arc::new(held));
    }
}
