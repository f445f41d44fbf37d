//! A lease's state in the words of the person on call, derived from the core's own notions:
//! `Lease::is_finished`, `Lease::live_claim`, and `balancer::is_active` for "blocked on a parent"
//! (a parent that is not finished, or whose record is corrupt, blocks its children exactly as the
//! balancer sees it). Only liveness comes from the CLI's own observation.

use shardlease::store::VersionedLease;
use std::collections::{BTreeSet, HashMap};

use serde::Serialize;
use shardlease::store::Lease;
use shardlease::LeaseKey;

use crate::observe::Observation;

/// What a lease is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Owned by a worker whose heartbeat moved during the observation.
    Running,
    /// Owned by a live worker, with a live claim (a handoff requested).
    Claimed,
    /// Owned by a worker that did not beat during the observation (or has no record): peers take
    /// it once the failover timeout has passed.
    OwnerDead,
    /// Active and without an owner: the next balance pass should take it.
    Unowned,
    /// Waits for a parent shard to finish (or for a corrupt parent to become readable).
    Blocked,
    /// Processed to SHARD_END.
    Finished,
    /// The record cannot be decoded.
    Corrupt,
}

impl LeaseState {
    /// The label shown in tables.
    pub fn label(self) -> &'static str {
        match self {
            LeaseState::Running => "running",
            LeaseState::Claimed => "claimed",
            LeaseState::OwnerDead => "owner dead",
            LeaseState::Unowned => "unowned",
            LeaseState::Blocked => "blocked on parent",
            LeaseState::Finished => "finished",
            LeaseState::Corrupt => "corrupt",
        }
    }
}

/// The states of every readable lease of `obs`, in listing order.
pub fn classify(obs: &Observation) -> Vec<LeaseState> {
    let all: HashMap<&LeaseKey, &Lease> =
        obs.leases.iter().map(|v| (&v.lease.key, &v.lease)).collect();
    let withheld: BTreeSet<LeaseKey> =
        obs.corrupt_leases.iter().map(|c| LeaseKey::from(c.key.as_str())).collect();
    obs.leases
        .iter()
        .map(|VersionedLease { lease, .. }| {
            if lease.is_finished() {
                LeaseState::Finished
            } else if !shardlease::balancer::is_active(lease, &all, &withheld) {
                LeaseState::Blocked
            } else {
                match &lease.owner {
                    None => LeaseState::Unowned,
                    Some(o) if !obs.is_alive(o) => LeaseState::OwnerDead,
                    Some(_) if lease.live_claim().is_some() => LeaseState::Claimed,
                    Some(_) => LeaseState::Running,
                }
            }
        })
        .collect()
}
