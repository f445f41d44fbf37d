//! Claims, from both sides: this worker's claims on peers' leases (followed until answered or
//! timed out), and peers' claims on this worker's leases (acknowledged, cleared, or, when a claim
//! cannot be answered in time, the task stopped before the claimant may take the lease).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

use super::super::cas;
use super::super::shared::{Shared, StopReason, Timing};
use crate::lease::transition;
use crate::lease::{Epoch, LeaseKey, Version, VersionedLease, WorkerId};

use super::LoopState;

/// A claim this worker made on a peer's lease.
#[derive(Clone, Copy, Debug)]
struct MyClaim {
    /// When the claim timeout last restarted (the claim was written, or the record changed).
    since: Instant,
    /// The version of the lease record last seen under the claim.
    seen: Version,
}

/// Claims, from both sides (see the module documentation). Owned by the balance loop.
#[derive(Debug, Default)]
pub(crate) struct ClaimBook {
    /// Claims this worker made. The claim timeout only runs while the lease record stands still
    /// (the owner writes nothing), so an owner that is alive, checkpointing or acknowledging a
    /// handoff is never stolen from.
    mine: BTreeMap<LeaseKey, MyClaim>,
    /// Leases this worker owns that a peer claimed: the record version last listed, and the
    /// earliest moment that version can have been written (see [`yield_unanswered_claims`]).
    on_mine: BTreeMap<LeaseKey, (Version, Instant)>,
    /// When the previous pass's listing was sent.
    previous_listing: Option<Instant>,
}

impl ClaimBook {
    /// Records a claim this worker just wrote on `key`, at record version `seen`.
    pub(crate) fn made(&mut self, key: LeaseKey, seen: Version) {
        self.mine.insert(key, MyClaim { since: Instant::now(), seen });
    }

    /// Whether this worker has a claim standing on `key`.
    pub(crate) fn is_mine(&self, key: &LeaseKey) -> bool {
        self.mine.contains_key(key)
    }

    /// Whether this worker has no claim standing.
    pub(crate) fn none_mine(&self) -> bool {
        self.mine.is_empty()
    }

    /// The leases this worker claimed.
    pub(crate) fn mine(&self) -> Vec<LeaseKey> {
        self.mine.keys().cloned().collect()
    }

    /// Forgets this worker's claims (a fence: they were the old incarnation's).
    pub(crate) fn forget_mine(&mut self) {
        self.mine.clear();
    }
}

/// The owner's side of the claim timeout. A claimant takes a claimed lease by force once the
/// record has stood still for the claim timeout on its clock. An owner that cannot answer (its
/// acknowledgement or clear keeps failing) and writes nothing else must stop processing first, or
/// the lease has two owners. The owner times the same standstill from the send time of the listing
/// *before* the one that showed the record's current version (no later than the write itself, so
/// no later than the claimant's clock start) and stops the task a heartbeat before the claim
/// timeout; the lease is then handed over, or the claim cleared, by a later pass.
pub(super) fn yield_unanswered_claims(
    shared: &Shared,
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
    list_sent: Instant,
    now: Instant,
    answered: &BTreeSet<LeaseKey>,
) {
    let previous = state.claims.previous_listing.replace(list_sent).unwrap_or(list_sent);
    let claimed: BTreeMap<&LeaseKey, Version> = leases
        .iter()
        .filter(|v| v.lease.is_owned_by(me) && v.lease.live_claim().is_some_and(|c| &c.by != me))
        .filter(|v| !answered.contains(&v.lease.key))
        .map(|v| (&v.lease.key, v.version))
        .collect();
    {
        let watched = &mut state.claims.on_mine;
        watched.retain(|k, _| claimed.contains_key(k));
        for (key, version) in claimed {
            let (seen, since) = watched.entry(key.clone()).or_insert((version, previous));
            if *seen != version {
                *seen = version;
                *since = previous;
            }
        }
    }
    stop_unanswered_past_deadline(shared, state, now);
}

/// How long a claim on one of this worker's leases may stand unanswered, from the send time of
/// the listing before the one that showed the record's current version, before its task stops.
pub(super) fn unanswered_claim_limit(shared: &Shared) -> Duration {
    shared.cfg.claim_timeout().saturating_sub(shared.cfg.heartbeat_interval())
}

/// The earliest moment after `now` a watched claim on this worker's leases reaches its limit:
/// the balance loop wakes then, whatever its interval, so the task stops before the claimant may
/// take it. (Deadlines already past were acted on when they passed.)
pub(super) fn next_unanswered_deadline(
    shared: &Shared,
    state: &LoopState,
    now: Instant,
) -> Option<Instant> {
    let limit = unanswered_claim_limit(shared);
    state.claims.on_mine.values().map(|(_, since)| *since + limit).filter(|d| *d > now).min()
}

/// Stops the tasks of leases whose claim has stood unanswered past the limit. Also called when a
/// pass cannot list: not knowing whether the claim was answered, the task stops all the same
/// (the claimant's clock does not wait for this worker's store errors).
pub(super) fn stop_unanswered_past_deadline(shared: &Shared, state: &LoopState, now: Instant) {
    let limit = unanswered_claim_limit(shared);
    let watched = &state.claims.on_mine;
    let tasks = &state.tasks;
    for (key, (_, since)) in watched.iter() {
        if now.saturating_duration_since(*since) < limit {
            continue;
        }
        if let Some(t) = tasks.get(key).filter(|t| t.is_running()) {
            if t.stop.borrow().as_ref().is_none_or(|r| !r.is_abrupt()) {
                warn!(shard = %key, "a claim on this lease went unanswered for almost the claim timeout; stopping its task before the claimant takes it");
                shared.metrics.lost(key);
                t.stop.send_replace(Some(StopReason::LeaseLost));
            }
        }
    }
}

/// This worker's claims still standing, pruned; returns those whose lease record has not changed
/// for the claim timeout (the owner is alive but stuck: it neither answers nor checkpoints).
pub(super) fn expired_claims(
    shared: &Shared,
    state: &mut LoopState,
    me: &WorkerId,
    leases: &[VersionedLease],
    now: Instant,
) -> BTreeSet<LeaseKey> {
    // A claim on a lease that finished since is moot: nothing is left to hand over.
    let standing: BTreeMap<&LeaseKey, Version> = leases
        .iter()
        .filter(|v| !v.lease.is_owned_by(me) && !v.lease.is_finished())
        .filter(|v| v.lease.live_claim().is_some_and(|c| &c.by == me))
        .map(|v| (&v.lease.key, v.version))
        .collect();
    let mine = &mut state.claims.mine;
    mine.retain(|k, _| standing.contains_key(k));
    // A claim of mine the store holds but this worker did not record (its write was applied but
    // the answer lost) is watched like any other: the balancer counts it toward my share, so it
    // must be followed until answered (the lease handed to this id, then re-taken) or timed out.
    for (key, version) in &standing {
        mine.entry((*key).clone()).or_insert(MyClaim { since: now, seen: *version });
    }
    let mut expired = BTreeSet::new();
    for (key, claim) in mine.iter_mut() {
        let Some(current) = standing.get(key) else { continue };
        if *current != claim.seen {
            // The owner wrote since (a checkpoint, or the acknowledgement of this claim that
            // starts its handoff): it is not stuck; restart the clock.
            claim.since = now;
            claim.seen = *current;
        } else if now.saturating_duration_since(claim.since) >= shared.cfg.claim_timeout() {
            expired.insert(key.clone());
        }
    }
    expired
}

/// Clears a claim on a lease this worker owns. The owner checkpoints all the time, so the listed
/// version is often stale: on a conflict, re-decide from the current record (a claim left standing
/// would let the claimant take the lease after the claim timeout). True when it cleared it.
pub(super) async fn clear_claim(
    shared: &Shared,
    state: &mut LoopState,
    listed: &VersionedLease,
) -> bool {
    let claim = listed.lease.live_claim().cloned();
    let me = shared.id();
    let key = listed.lease.key.clone();
    let outcome = cas::write(
        shared,
        &mut state.timing,
        &key,
        Some(listed.clone()),
        cas::Policy::PERSIST,
        "clear a claim",
        |l| transition::clear_claim(l, &me, claim.as_ref()),
    )
    .await;
    match outcome {
        cas::Outcome::Written(next, v) => {
            shared.observe(&next, v);
            state.changed(shared, 1);
            true
        }
        cas::Outcome::Declined(_) | cas::Outcome::GaveUp => false,
    }
}

/// Acknowledges `to`'s claim on a lease this worker runs at `epoch` with a write that changes
/// nothing but the record's version (which restarts the claimant's claim timeout). False when the
/// lease or the claim moved on, or the store kept failing: the handoff is then left to a later
/// pass.
pub(super) async fn acknowledge_claim(
    shared: &Shared,
    mut timing: Timing,
    key: &LeaseKey,
    epoch: Epoch,
    to: &WorkerId,
) -> bool {
    let me = shared.id();
    // Read first: the listing's version is likely stale (the owner checkpoints all the time).
    let mut decisions = 0;
    let mut last_standing = false;
    let outcome = cas::write(
        shared,
        &mut timing,
        key,
        None,
        cas::Policy::PERSIST,
        "acknowledge a claim",
        |l| {
            let answer = transition::acknowledge(l, &me, epoch, to);
            decisions += 1;
            last_standing = answer.is_ok();
            answer
        },
    )
    .await;
    // Why a claim stays unanswered shows in the log: `last_standing` with many decisions means
    // the owner's own checkpoints kept moving the record under the acknowledgement.
    match &outcome {
        cas::Outcome::Declined(why) => {
            debug!(shard = %key, to = %to, decisions, last_standing, %why, "claim not acknowledged")
        }
        cas::Outcome::GaveUp => {
            debug!(shard = %key, to = %to, decisions, "claim not acknowledged: the store kept failing")
        }
        cas::Outcome::Written(..) => {}
    }
    match outcome {
        cas::Outcome::Written(lease, v) => {
            shared.observe(&lease, v);
            debug!(shard = %key, to = %to, "claim acknowledged; handing over");
            true
        }
        cas::Outcome::Declined(_) | cas::Outcome::GaveUp => false,
    }
}
