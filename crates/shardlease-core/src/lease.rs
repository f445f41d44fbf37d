//! The lease record: who owns a shard, under which fencing epoch, and how far it has got.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::ids::{LeaseKey, WorkerId};
use crate::position::Position;

pub mod transition;

/// An opaque store-assigned token naming one version of a record, used for compare-and-set.
///
/// **A version never repeats for a key**: every write of a record (create and update) gives it a
/// version that key has never had, not after a delete and a re-create, and not after the store
/// lost or rolled back writes (a Redis failover to a lagging replica, a database restored from a
/// snapshot). Otherwise a writer holding a version from before the loss could win a
/// compare-and-set against a record written since by someone else (the ABA problem). A counter
/// does not give that, since a rollback rolls the counter back too; the stores of this workspace
/// therefore draw every version at random ([`Version::random`]: 63 bits, so two draws collide
/// with probability 2^-63).
///
/// Only equality means something. The order (derived, for use as a map key) says nothing about
/// which version is newer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version(pub u64);

impl Version {
    /// The largest version [`Version::random`] draws: `i64::MAX`, so a version fits a signed
    /// 64-bit column (a SQL `BIGINT`) as a positive number.
    pub const MAX_RANDOM: u64 = i64::MAX as u64;

    /// A fresh version for a write: uniformly random in `1..=`[`Version::MAX_RANDOM`], from the
    /// thread-local generator (seeded by the operating system, never by the caller).
    pub fn random() -> Version {
        Version(rand::random_range(1..=Version::MAX_RANDOM))
    }

    /// A fresh version for an update of a record now at `previous`: like [`Version::random`],
    /// but never `previous` itself, so even the 2^-63 chance of a write leaving the version
    /// unchanged is ruled out.
    pub fn random_other_than(previous: Version) -> Version {
        loop {
            let v = Version::random();
            if v != previous {
                return v;
            }
        }
    }
}

/// A lease's fencing token: it grows on every change of owner, including a release, so a write
/// made under an older epoch can be refused by the store and by any sink that remembers the
/// largest epoch it saw.
///
/// Unlike a [`Version`] it is ordered: a larger epoch is a later ownership. The runtime moves it to
/// at least the wall clock in milliseconds when it takes a lease, so it never goes backwards even
/// after a store rolled back (docs/algorithm.md, "Epochs").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch of a lease nobody has owned yet.
    pub const ZERO: Epoch = Epoch(0);

    /// The next epoch (saturating: `u64::MAX` stays put rather than wrapping to zero).
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }

    /// The number, for a sink's column or a log line.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for Epoch {
    fn from(n: u64) -> Self {
        Epoch(n)
    }
}

/// A handoff request: `by` asks the owner to hand the lease over. Valid only while the lease's
/// epoch is still `at` (any change of owner makes it stale).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The worker that wants the lease.
    pub by: WorkerId,
    /// The lease epoch the claim was made against.
    pub at: Epoch,
}

/// One lease: the unit of work a worker holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The shard (or `stream/shard`) this lease is for.
    pub key: LeaseKey,
    /// The worker holding it, if any.
    pub owner: Option<WorkerId>,
    /// Fencing token: grows on every change of owner, including a release (the runtime moves it to
    /// at least the wall clock in milliseconds, so it never repeats after a store rolled back).
    pub epoch: Epoch,
    /// How far processing has got. `ShardEnd` means the lease is finished.
    pub checkpoint: Position,
    /// Parent shards that must be finished (or gone) before this one may be processed.
    #[serde(default)]
    pub parents: Vec<LeaseKey>,
    /// A pending handoff request.
    #[serde(default)]
    pub claim: Option<Claim>,
    /// Extension fields (throughput, hash range, ...), kept verbatim by every store.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

impl Lease {
    /// A new, unowned lease at `checkpoint`.
    pub fn new(key: impl Into<LeaseKey>, checkpoint: Position) -> Self {
        Lease {
            key: key.into(),
            owner: None,
            epoch: Epoch::ZERO,
            checkpoint,
            parents: Vec::new(),
            claim: None,
            attributes: BTreeMap::new(),
        }
    }

    /// Sets the parents (builder style).
    pub fn with_parents(mut self, parents: impl IntoIterator<Item = LeaseKey>) -> Self {
        self.parents = parents.into_iter().collect();
        self
    }

    /// Whether the shard has been processed to its end.
    pub fn is_finished(&self) -> bool {
        self.checkpoint.is_shard_end()
    }

    /// Whether `worker` owns this lease.
    pub fn is_owned_by(&self, worker: &WorkerId) -> bool {
        self.owner.as_ref() == Some(worker)
    }

    /// The claim, if it is still valid for the current epoch.
    pub fn live_claim(&self) -> Option<&Claim> {
        self.claim.as_ref().filter(|c| c.at == self.epoch)
    }

    /// This lease with a new owner (or none): epoch + 1, claim cleared, checkpoint kept. A fixture
    /// helper for tests (feature `test-util`): the runtime and the CLI change owners only through
    /// [`transition`], whose epoch rule also moves the epoch to the wall clock.
    #[cfg(any(test, feature = "test-util"))]
    pub fn transferred_to(&self, owner: Option<WorkerId>) -> Lease {
        Lease { owner, epoch: self.epoch.next(), claim: None, ..self.clone() }
    }

    /// The token proving ownership at the current epoch, if owned.
    pub fn token(&self) -> Option<LeaseToken> {
        self.owner.clone().map(|owner| LeaseToken {
            key: self.key.clone(),
            owner,
            epoch: self.epoch,
        })
    }
}

/// A lease together with the version it was read at: what a listing returns and what a
/// compare-and-set compares against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionedLease {
    /// The record.
    pub lease: Lease,
    /// The version it was read at; a conditional write succeeds only while it is still current.
    pub version: Version,
}

impl VersionedLease {
    /// Pairs a lease with the version it was read at.
    pub fn new(lease: Lease, version: Version) -> Self {
        VersionedLease { lease, version }
    }
}

/// Proof of ownership handed to processors and checkpointers: fenced writes compare all three.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseToken {
    /// The lease.
    pub key: LeaseKey,
    /// The owner.
    pub owner: WorkerId,
    /// The epoch of ownership. Downstream sinks can fence their own writes with it.
    pub epoch: Epoch,
}

impl LeaseToken {
    /// Whether `lease` is still owned under this token.
    pub fn matches(&self, lease: &Lease) -> bool {
        lease.key == self.key && lease.is_owned_by(&self.owner) && lease.epoch == self.epoch
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn random_versions_are_positive_i64s_and_do_not_repeat() {
        let drawn: HashSet<Version> = (0..10_000).map(|_| Version::random()).collect();
        assert_eq!(drawn.len(), 10_000, "63-bit draws do not collide in practice");
        assert!(drawn.iter().all(|v| v.0 >= 1 && i64::try_from(v.0).is_ok()));
        let previous = Version(42);
        assert!((0..1_000).all(|_| Version::random_other_than(previous) != previous));
    }
}
