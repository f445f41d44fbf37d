//! Leases the store lost (vanished, rolled back, re-created at the initial position), found by
//! comparing a listing with this worker's memory of the namespace (`runtime::recovery`), and
//! written back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::super::recovery;
use super::super::shared::Shared;
use crate::error::Error;
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::position::Position;
use crate::store::CreateOutcome;

use super::LoopState;

/// What this worker remembers of the namespace's leases (see `recovery`).
#[derive(Debug, Default)]
pub(crate) struct RecoveryMemory {
    /// Per lease, the furthest checkpoint and highest epoch this worker has seen, to notice and
    /// repair a store that lost or rolled back writes, and when its own write last updated each
    /// entry (see `recovery`).
    seen: recovery::Memory,
    /// Since when each lost lease has been found lost, in passes without a break.
    lost_since: BTreeMap<LeaseKey, Instant>,
}

impl RecoveryMemory {
    /// Every lease remembered, as last seen.
    pub(crate) fn leases(&self) -> Vec<Lease> {
        self.seen.values().map(|r| r.lease.clone()).collect()
    }

    /// A listing found nothing lost.
    pub(crate) fn clear_lost(&mut self) {
        self.lost_since.clear();
    }

    /// Records a write this worker made to a lease (at `at`) in its memory of the namespace (see
    /// `recovery`), so the memory does not wait for the next listing to know what this worker
    /// itself did: a store that loses the write is then repaired to it.
    pub(crate) fn remember(&mut self, lease: &Lease, at: Instant) {
        let entry = self
            .seen
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

    /// Records a lease this worker has just taken: [`RecoveryMemory::remember`], except that the memory
    /// then holds the checkpoint the take wrote, which is where the new task starts, even when
    /// it remembered a later one from an earlier epoch. (The store lost that later checkpoint:
    /// a rollback, or a late write that fenced the old task. The new task reads those records
    /// again either way, and a restore of the later checkpoint under it would make each of the
    /// task's next checkpoints look like a move backwards, so the lease would stop for good.)
    pub(crate) fn remember_taken(&mut self, lease: &Lease, at: Instant) {
        self.remember(lease, at);
        if let Some(entry) = self.seen.get_mut(&lease.key) {
            if entry.lease.epoch == lease.epoch {
                entry.lease.checkpoint = lease.checkpoint.clone();
            }
        }
    }

    /// Takes in the checkpoint a task left in its slot since the last read, if any.
    pub(crate) fn read_slot(&mut self, key: &LeaseKey, slot: &super::CheckpointSlot) {
        if let Some((epoch, position, at)) = slot.take() {
            self.checkpointed(key, epoch, &position, at);
        }
    }

    /// Keeps the memory of this worker's own leases' checkpoints current without a listing (a
    /// quiet fleet does not list), so a store that loses writes is repaired to the latest one.
    /// (Lease tasks fill their slot only when positions live in the lease record: a custom
    /// checkpointer's positions are never in the record, and a listing would then look like a
    /// store that lost writes.)
    fn checkpointed(
        &mut self,
        key: &LeaseKey,
        epoch: crate::lease::Epoch,
        position: &Position,
        at: Instant,
    ) {
        if let Some(seen) = self.seen.get_mut(key) {
            if seen.lease.epoch <= epoch && !seen.lease.checkpoint.would_regress_to(position) {
                seen.written_at = seen.written_at.max(Some(at));
                seen.lease.checkpoint = position.clone();
            }
        }
    }
}

/// The leases the store lost, compared with this worker's memory (see `recovery`). Vanished ones
/// are checked against the stream's lineage to rule out those the shard sync collected while this
/// worker was not looking (a one-off listing of the shards, only when something vanished).
pub(super) async fn lost_leases(
    shared: &Shared,
    state: &mut LoopState,
    listed: &[VersionedLease],
    corrupt: &BTreeSet<LeaseKey>,
    list_sent: Instant,
) -> Vec<recovery::Lost> {
    let lost = {
        let memory = &mut state.memory.seen;
        let fresh = recovery::fresh_keys(memory, list_sent);
        recovery::compare(memory, listed, corrupt, &fresh)
    };
    if lost.iter().all(|l| l.now.is_some()) {
        return lost;
    }
    // A vanished lease of a stream the source retired was deleted on purpose (runtime::retire).
    let (retired, lost): (Vec<_>, Vec<_>) =
        lost.into_iter().partition(|l| l.now.is_none() && shared.source.retired(l.key()));
    for l in &retired {
        state.memory.seen.remove(l.key());
    }
    match shared.source.list_shards().await {
        Ok(shards) => {
            let mut children: BTreeMap<LeaseKey, Vec<LeaseKey>> = BTreeMap::new();
            for s in shards {
                for p in s.parents {
                    children.entry(p).or_default().push(s.id.clone());
                }
            }
            recovery::forget_collected(&mut state.memory.seen, lost, &children, listed)
        }
        Err(e) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing shards to tell lost leases from collected ones failed");
            lost
        }
    }
}

/// Writes back leases the store lost (see `recovery`): created again when they vanished,
/// replaced by compare-and-set when they were rolled back or re-created at the initial position.
/// A lease this worker runs is kept (its task goes on); one another live worker owned is left to
/// that worker for a pass, unless this worker saw it finished (nothing to wait for). A restore
/// that loses a race is retried at the next pass, which finds the lease lost again.
pub(super) async fn restore_lost(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    lost: Vec<recovery::Lost>,
    vanished: bool,
) {
    let total = lost.len();
    if vanished {
        error!(
            leases = total,
            held = state.tasks.running(),
            "every lease of the namespace vanished from the store: checkpoints written since this \
             worker last listed them are LOST (those records will be processed again); restoring \
             the leases as this worker last saw them"
        );
        shared.metrics.namespace_vanished();
    } else {
        error!(
            leases = total,
            "the store lost or rolled back writes (a checkpoint moved backwards, an epoch went \
             down or an unfinished lease vanished): restoring those leases as this worker last \
             saw them"
        );
    }
    let me = shared.id();
    let writes: Vec<(Lease, Option<Version>)> = {
        let tasks = &state.tasks;
        let liveness = state.membership.liveness_mut();
        let since = &mut state.memory.lost_since;
        let keys: BTreeSet<&LeaseKey> = lost.iter().map(|l| l.key()).collect();
        since.retain(|k, _| keys.contains(k));
        let now = Instant::now();
        // A live owner runs a pass within a (jittered) balance interval; give it that and a
        // heartbeat to repair the leases it runs itself, without interrupting them.
        let grace = shared.cfg.balance_interval().mul_f64(1.0 + shared.cfg.jitter())
            + shared.cfg.heartbeat_interval();
        let restart_window = grace + shared.cfg.failover_timeout();
        lost.iter()
            .filter_map(|l| {
                let first = *since.entry(l.key().clone()).or_insert(now);
                let standing = recovery::Standing {
                    me: &me,
                    running_at: tasks.get(l.key()).filter(|t| t.is_running()).map(|t| t.epoch),
                    // This worker knows whether it runs a lease it owned; it never waits for itself.
                    owner_alive: l
                        .seen
                        .owner
                        .as_ref()
                        .is_some_and(|o| *o != me && liveness.is_alive(o)),
                    // An owner whose process started a moment ago (restarted under the same
                    // id) knows only what it listed since; waiting for it to repair a lease it
                    // may never have seen lets a fresh create win (see `recovery`).
                    owner_had_time: now.saturating_duration_since(first) >= grace
                        || l.seen.owner.as_ref().is_some_and(|o| {
                            *o != me && liveness.started_within(o, restart_window)
                        }),
                    now_millis: crate::clock::now_millis(),
                };
                l.restoration(&standing).map(|r| (r, l.now.as_ref().map(|v| v.version)))
            })
            .collect()
    };
    let waiting = total - writes.len();
    let store = &shared.store;
    let results: Vec<Option<Lease>> = futures::stream::iter(writes)
        .map(|(lease, over)| {
            async move {
                let done = match over {
                    None => store
                        .create_lease(&lease)
                        .await
                        .map(|o| matches!(o, CreateOutcome::Created(_))),
                    Some(v) => store.update_lease(&lease, v).await.map(|_| true),
                };
                debug!(
                    shard = %lease.key,
                    owner = ?lease.owner,
                    epoch = %lease.epoch,
                    checkpoint = %lease.checkpoint,
                    written = ?done.as_ref().ok(),
                    "restoring a lost lease"
                );
                match done {
                    Ok(true) => Some(lease),
                    Ok(false) | Err(Error::Conflict { .. }) => None,
                    Err(e) => {
                        warn!(shard = %lease.key, error = %crate::error::ErrorChain(&e), "restoring a lost lease failed");
                        None
                    }
                }
            }
        })
        .buffer_unordered(shared.cfg.take_concurrency())
        .collect()
        .await;
    let mut restored = 0;
    for lease in results.into_iter().flatten() {
        if lease.is_owned_by(&me) {
            state.tasks.grant(lease.key.clone(), lease.epoch);
        }
        state.memory.remember(&lease, Instant::now());
        restored += 1;
    }
    state.changed(shared, restored as u64);
    shared.metrics.restored(restored);
    error!(
        restored,
        not_restored = total - restored,
        left_to_their_owner = waiting,
        "restored {restored} of {total} lost leases; the others are checked again at the next \
         pass (left to their live owner this pass: {waiting})"
    );
    if vanished {
        let memory: Vec<Lease> = state.memory.leases();
        if let Err(e) = super::super::shard_sync::sync_after_loss(shared, &memory).await {
            warn!(error = %crate::error::ErrorChain(&e), "shard sync after the namespace vanished failed");
        }
    }
    if restored > 0 {
        // Take what was restored unowned without waiting a whole interval. (Only then: a pass
        // that merely waits for an owner must not start another at once.)
        state.want_listing(true);
    }
}
