//! One compare-and-set loop for every ownership write the runtime makes.
//!
//! Taking, claiming, acknowledging a claim, clearing one, handing over or releasing, withdrawing a
//! claim at shutdown: each reads (or starts from what a listing showed), decides the next record
//! from the current one, and writes it by compare-and-set. They differ only in what they decide
//! and in how hard they try, so the loop lives here once, with one policy type:
//!
//! - a **conflict** means the record moved under us: decide again from the record the store
//!   returned with the conflict (read it when it returned none), up to `conflicts` times, because
//!   the owner checkpointing all the time makes a listed version stale within milliseconds;
//! - a **store error** is retried with the worker's backoff only until `errors_until` (handing a
//!   lease over may keep trying for the shutdown timeout); otherwise the write is given up and a
//!   later pass looks again;
//! - the decision refusing (a [`Refusal`](crate::lease::transition::Refusal): the lease moved on,
//!   the claim was answered) ends the loop without writing.
//!
//! The decisions are the pure functions of [`crate::lease::transition`]: this loop issues what
//! they return and nothing else.

use tokio::time::Instant;
use tracing::{debug, warn};

use super::events::Event;
use super::shared::{Backoff, Shared, Timing};
use crate::error::Error;
use crate::lease::transition::Transition;
use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::store::LeaseUpdate;

/// How hard one write tries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Decisions made again after a conflict (0: a conflict ends the write).
    pub conflicts: usize,
    /// Store errors are retried with backoff until then; `None`: an error ends the write.
    pub errors_until: Option<Instant>,
}

impl Policy {
    /// Re-decide after a few conflicts; give up on the first store error (a later pass retries).
    pub const PERSIST: Policy = Policy { conflicts: 8, errors_until: None };

    /// Re-decide after conflicts and retry store errors until `deadline`.
    pub fn until(deadline: Instant) -> Policy {
        Policy { conflicts: 64, errors_until: Some(deadline) }
    }
}

/// How a write ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Written: the record as written and its new version.
    Written(Lease, Version),
    /// Nothing written, and nothing that may land later; why.
    Declined(Declined),
    /// Store errors outlasted the policy: the last write may have landed all the same.
    GaveUp,
}

/// Why a write was declined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Declined {
    /// The lease record does not exist (any more).
    Gone,
    /// The transition refused the current record (it moved on, the claim was answered, ...).
    Refused(crate::lease::transition::Refusal),
    /// The record kept changing: conflicts outlasted the policy (after this many decisions), or,
    /// for a single attempt, someone else wrote first.
    Contended {
        /// Compare-and-sets that lost to another write.
        conflicts: usize,
    },
}

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Declined::Gone => f.write_str("the lease record is gone"),
            Declined::Refused(r) => write!(f, "refused: {r}"),
            Declined::Contended { conflicts } => {
                write!(f, "the record kept changing ({conflicts} lost compare-and-sets)")
            }
        }
    }
}

/// Writes `decide(current)` over the current record of `key` by compare-and-set, starting from
/// `listed` when given (a listing's copy; the store is read otherwise), under `policy`. `what`
/// names the write in logs ("could not {what}").
pub(crate) async fn write<F>(
    shared: &Shared,
    timing: &mut Timing,
    key: &LeaseKey,
    listed: Option<VersionedLease>,
    policy: Policy,
    what: &str,
    mut decide: F,
) -> Outcome
where
    F: FnMut(&Lease) -> Transition,
{
    let mut current = listed;
    let mut conflicts = 0;
    // Whether a write failed in a way that says nothing of whether it was applied (a timeout, a
    // lost answer): counted once as an ownership change, so peers list the leases and see it.
    let mut uncertain = false;
    let mut backoff = timing.backoff();
    loop {
        let VersionedLease { lease, version } = match current.take() {
            Some(v) => v,
            None => match shared.store.get_lease(key).await {
                Ok(Some(v)) => v,
                Ok(None) => return Outcome::Declined(Declined::Gone),
                Err(e) => {
                    warn!(shard = %key, error = %crate::error::ErrorChain(&e), "could not {what}: reading the lease failed");
                    if !retry_error(timing, policy, &mut backoff).await {
                        return Outcome::GaveUp;
                    }
                    continue;
                }
            },
        };
        let next = match decide(&lease) {
            Ok(next) => next,
            Err(refusal) => {
                debug!(shard = %key, %refusal, "not writing ({what})");
                return Outcome::Declined(Declined::Refused(refusal));
            }
        };
        match crate::notify::update_lease(&*shared.store, &lease, &next, version).await {
            Ok(v) => return Outcome::Written(next, v),
            Err(Error::Conflict { current: now, .. }) => {
                conflicts += 1;
                if conflicts > policy.conflicts {
                    return Outcome::Declined(Declined::Contended { conflicts });
                }
                match now {
                    Some(now) => current = Some(*now),
                    // The record is gone (or the store did not say): read it again.
                    None => current = None,
                }
            }
            Err(e) => {
                warn!(shard = %key, error = %crate::error::ErrorChain(&e), "could not {what}");
                if !uncertain {
                    // The write may have landed all the same. A change nobody publishes is seen
                    // by settled peers only at the safety net: a claim applied with its answer
                    // lost was counted by its claimant toward its share while the owner never
                    // listed to answer it (docs/algorithm.md, "Listing only when something
                    // changed").
                    uncertain = true;
                    shared.tell(Event::Changed { n: 1 });
                }
                if !retry_error(timing, policy, &mut backoff).await {
                    return Outcome::GaveUp;
                }
            }
        }
    }
}

/// Waits before retrying after a store error, if the policy's deadline allows one more try.
async fn retry_error(timing: &mut Timing, policy: Policy, backoff: &mut Backoff) -> bool {
    match policy.errors_until {
        Some(deadline) if Instant::now() < deadline => {
            tokio::time::sleep(backoff.next(timing)).await;
            true
        }
        _ => false,
    }
}

/// [`write`] with one attempt (no decision again after a conflict, no retry after a store
/// error: a conflict means someone else acted first) for many leases at once, each from its listed record: the
/// writes go to the store as one batch ([`LeaseStore::update_leases`](crate::store::LeaseStore::update_leases)),
/// and each item ends exactly as its own `write(.., Some(listed), policy, what, decide)`
/// with `Policy { conflicts: 0, errors_until: None }`
/// would have ended: the decision refusing is `Declined` without a write, a conflict is
/// `Declined`, a store error (of the item, or of the whole batch, which leaves every item
/// uncertain) is `GaveUp` and counted as a change, in case the write landed all the same. One
/// outcome per listed record, in order.
///
/// A write that changes no owner (`notify::changes_ownership`) is written on its own with
/// `update_lease_quietly`, as [`write`] would; the batch is for the announced ones (takes always
/// are).
pub(crate) async fn write_once_batch<F>(
    shared: &Shared,
    listed: &[&VersionedLease],
    what: &str,
    mut decide: F,
) -> Vec<Outcome>
where
    F: FnMut(&Lease) -> Transition,
{
    let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(listed.len());
    // The announced writes: their index in `listed`, and the update.
    let mut batch: Vec<(usize, LeaseUpdate)> = Vec::new();
    let mut quiet = Vec::new();
    for (i, v) in listed.iter().enumerate() {
        match decide(&v.lease) {
            Ok(next) if crate::notify::changes_ownership(&v.lease, &next) => {
                batch.push((i, LeaseUpdate::new(next, v.version)));
                outcomes.push(None);
            }
            Ok(next) => {
                quiet.push((i, next));
                outcomes.push(None);
            }
            Err(refusal) => {
                debug!(shard = %v.lease.key, %refusal, "not writing ({what})");
                outcomes.push(Some(Outcome::Declined(Declined::Refused(refusal))));
            }
        }
    }
    let store = &*shared.store;
    let updates: Vec<LeaseUpdate> = batch.iter().map(|(_, u)| u.clone()).collect();
    let batched = async {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        match store.update_leases(&updates).await {
            Ok(written) if written.len() == updates.len() => Ok(written),
            Ok(written) => Err(Error::permanent(format!(
                "the store answered a batch of {} writes with {} outcomes",
                updates.len(),
                written.len()
            ))),
            Err(e) => Err(e),
        }
    };
    let singles = futures::future::join_all(quiet.iter().map(|(i, next)| {
        let v = listed[*i];
        crate::notify::update_lease(store, &v.lease, next, v.version)
    }));
    let (batched, singles) = tokio::join!(batched, singles);
    let mut uncertain = 0u64;
    let mut batch_failed = 0u64;
    let mut settle = |next: Lease, written: Result<Version, Error>| match written {
        Ok(v) => Outcome::Written(next, v),
        Err(Error::Conflict { .. }) => Outcome::Declined(Declined::Contended { conflicts: 1 }),
        Err(e) => {
            warn!(shard = %next.key, error = %crate::error::ErrorChain(&e), "could not {what}");
            uncertain += 1;
            Outcome::GaveUp
        }
    };
    match batched {
        Ok(written) => {
            for ((i, u), w) in batch.into_iter().zip(written) {
                outcomes[i] = Some(settle(u.lease, w));
            }
        }
        Err(e) => {
            warn!(writes = batch.len(), error = %crate::error::ErrorChain(&e), "could not {what}: the batch failed");
            for (i, _) in &batch {
                outcomes[*i] = Some(Outcome::GaveUp);
            }
            batch_failed = batch.len() as u64;
        }
    }
    for ((i, next), w) in quiet.into_iter().zip(singles) {
        outcomes[i] = Some(settle(next, w));
    }
    uncertain += batch_failed;
    if uncertain > 0 {
        // As `write` does for each: the writes may have landed all the same.
        shared.tell(Event::Changed { n: uncertain });
    }
    outcomes.into_iter().map(|o| o.unwrap_or(Outcome::GaveUp)).collect()
}
