//! Change notification: an optional store capability that lets workers react to a change at once
//! instead of at their next heartbeat or balance pass.
//!
//! A store that can push changes (an etcd watch, PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub)
//! returns a [`ChangeStream`] from [`LeaseStore::subscribe_changes`](crate::store::LeaseStore::subscribe_changes);
//! the default says "not supported" and the worker runs exactly as without it. A notice is only a
//! hint to look again: the runtime acts on it by listing, never on its content, so a notice that
//! is late, repeated or spurious costs a listing and nothing else. What is relevant (an ownership
//! change, not a checkpoint) is decided here, in the core, by [`StoreChange::calls_for_listing`].
//! docs/algorithm.md ("Change notification") says how the runtime uses it.

use futures::stream::BoxStream;

use crate::ids::WorkerId;
use crate::lease::{Lease, LeaseKey};

/// A stream of change notices for one namespace. It ends when the store loses the subscription
/// (a dropped connection, a server restart); the runtime then subscribes again and lists once,
/// so a change made while no stream was open is never missed.
pub type ChangeStream = BoxStream<'static, StoreChange>;

/// One change in a namespace, as a store reports it.
///
/// Change notification is an optional store capability that lets workers react to a change at
/// once instead of at their next heartbeat or balance pass: a store that can push changes (an
/// etcd watch, PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub) returns a [`ChangeStream`] from
/// [`LeaseStore::subscribe_changes`](crate::store::LeaseStore::subscribe_changes). A notice is
/// only a hint to look again: the runtime acts on it by listing, never on its content, so a
/// notice that is late, repeated or spurious costs a listing and nothing else. What is relevant
/// (an ownership change, not a checkpoint) is decided by the core, in
/// [`StoreChange::calls_for_listing`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StoreChange {
    /// A lease record was created, replaced or deleted.
    Lease {
        /// The lease key.
        key: LeaseKey,
        /// The record before the write: `None` when it did not exist, or when the store cannot
        /// tell (the change then counts as relevant).
        before: Option<Box<Lease>>,
        /// The record after the write: `None` when the write deleted it, or when the store
        /// cannot tell or decode it (the change then counts as relevant).
        after: Option<Box<Lease>>,
    },
    /// A worker record appeared (a worker joined or came back) or was removed (a worker left, or
    /// its record was collected). Updates of an existing record, the heartbeats, are not notices.
    Worker {
        /// The worker.
        id: WorkerId,
        /// Whether the record exists after the change.
        present: bool,
    },
    /// Something in the namespace changed and the store cannot say what (a record it could not
    /// decode, a gap in its stream): the runtime lists the leases and the worker records.
    Unknown,
}

impl StoreChange {
    /// Whether this change calls for a listing of the leases: a lease was created or deleted, or
    /// its owner, epoch, claim, parents or finished state changed. A checkpoint that moves within
    /// a shard changes none of those and is not a reason to list.
    pub fn calls_for_listing(&self) -> bool {
        match self {
            StoreChange::Lease { before: Some(b), after: Some(a), .. } => changes_ownership(b, a),
            StoreChange::Lease { .. } | StoreChange::Worker { .. } | StoreChange::Unknown => true,
        }
    }

    /// Whether this change calls for a listing of the worker records (a worker came or went, or
    /// the store cannot say what changed).
    pub fn calls_for_worker_listing(&self) -> bool {
        matches!(self, StoreChange::Worker { .. } | StoreChange::Unknown)
    }
}

/// Whether replacing `before` with `after` is a change the namespace's subscribers hear of: the
/// owner, epoch, claim, parents or finished state changed. A checkpoint that moves within a shard
/// changes none of those; the runtime writes it with
/// [`LeaseStore::update_lease_quietly`](crate::store::LeaseStore::update_lease_quietly), and a
/// store that pushes notices sends none for it.
pub(crate) fn changes_ownership(before: &Lease, after: &Lease) -> bool {
    before.owner != after.owner
        || before.epoch != after.epoch
        || before.claim != after.claim
        || before.parents != after.parents
        || before.is_finished() != after.is_finished()
}

/// Replaces `before` (stored at `expected`) with `after`, announced to subscribers only when
/// [`changes_ownership`] says so: the one place the runtime picks between
/// [`LeaseStore::update_lease`](crate::store::LeaseStore::update_lease) and
/// [`LeaseStore::update_lease_quietly`](crate::store::LeaseStore::update_lease_quietly).
pub(crate) async fn update_lease(
    store: &dyn crate::store::LeaseStore,
    before: &Lease,
    after: &Lease,
    expected: crate::lease::Version,
) -> crate::error::Result<crate::lease::Version> {
    if changes_ownership(before, after) {
        store.update_lease(after, expected).await
    } else {
        store.update_lease_quietly(after, expected).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Epoch;
    use crate::position::Position;

    fn lease() -> Lease {
        Lease::new("shard-1", Position::TrimHorizon)
    }

    fn change(before: Option<Lease>, after: Option<Lease>) -> StoreChange {
        StoreChange::Lease {
            key: "shard-1".into(),
            before: before.map(Box::new),
            after: after.map(Box::new),
        }
    }

    #[test]
    fn a_checkpoint_within_a_shard_is_not_a_reason_to_list() {
        let before = lease();
        let after = Lease { checkpoint: Position::Latest, ..before.clone() };
        assert!(!change(Some(before), Some(after)).calls_for_listing());
    }

    #[test]
    fn ownership_claims_shard_ends_creations_and_deletions_are() {
        let before = lease();
        let owned = Lease { owner: Some(WorkerId::new("w1")), epoch: Epoch(1), ..before.clone() };
        assert!(change(Some(before.clone()), Some(owned.clone())).calls_for_listing());
        let claimed = Lease {
            claim: Some(crate::lease::Claim { by: WorkerId::new("w2"), at: Epoch(1) }),
            ..owned.clone()
        };
        assert!(change(Some(owned.clone()), Some(claimed)).calls_for_listing());
        let ended = Lease { checkpoint: Position::ShardEnd, ..owned.clone() };
        assert!(change(Some(owned.clone()), Some(ended)).calls_for_listing());
        assert!(change(None, Some(owned.clone())).calls_for_listing());
        assert!(change(Some(owned), None).calls_for_listing());
        assert!(!change(Some(before.clone()), Some(before)).calls_for_worker_listing());
    }

    #[test]
    fn workers_coming_and_going_and_unknown_changes_list_both() {
        let joined = StoreChange::Worker { id: WorkerId::new("w1"), present: true };
        assert!(joined.calls_for_listing() && joined.calls_for_worker_listing());
        assert!(StoreChange::Unknown.calls_for_listing());
        assert!(StoreChange::Unknown.calls_for_worker_listing());
    }
}
