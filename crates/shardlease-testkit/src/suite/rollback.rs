//! The rollback case: a version never repeats for a key, even after the store lost writes.
//!
//! A store can roll back: a Redis failover to a replica that had not seen the last writes, a
//! database restored from a snapshot. A store whose versions come from a counter (`expected + 1`,
//! a per-namespace sequence) then hands out versions it handed out before the rollback, and a
//! worker still holding one of those (its cached `(owner, epoch, version)`) wins a
//! compare-and-set against a record someone else wrote since. The case rolls one record back with
//! the factory's [`restore_raw`](super::StoreFactory::restore_raw) hook and checks that the
//! version from the lost timeline is refused.

use shardlease_core::store::Lease;
use shardlease_core::store::VersionedLease;
use shardlease_core::{Position, WorkerId};

use super::check::{conflict, created, ok};
use super::skip::skip;
use super::{with_scope, StoreFactory};

const CASE: &str = "a_rolled_back_record_never_accepts_a_stale_version";

/// Reads a lease at `v1`; owner B updates it (`v2`); the record is rolled back to exactly
/// `(content, v1)` through the factory's rollback hook; owner C updates it from `v1` (`v3`).
/// Then `v3` differs from `v2` (and `v1`), and an update or delete at `v2` (B's cached version,
/// from the lost timeline) fails with `Error::Conflict` carrying C's record. Skipped (a failure
/// under `CI=true`) when the factory has no rollback hook.
pub async fn a_rolled_back_record_never_accepts_a_stale_version(factory: &dyn StoreFactory) {
    with_scope(factory, CASE, |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let key = "shardId-000000000007";
        let start =
            Lease::new(key, Position::TrimHorizon).transferred_to(Some(WorkerId::from("owner-a")));
        created(store.create_lease(&start).await, "create");
        let VersionedLease { lease: content, version: v1 } =
            ok(store.get_lease(&start.key).await, "read the lease")
                .unwrap_or_else(|| panic!("{CASE}: the created lease is missing"));

        let mut b = content.transferred_to(Some(WorkerId::from("owner-b")));
        b.checkpoint = Position::sequence(100u64);
        let v2 = ok(store.update_lease(&b, v1).await, "owner B's update from v1");

        let restored = ok(
            scope.factory().restore_raw(&store, &ns, &content, v1).await,
            "the rollback hook (restore_raw)",
        );
        if !restored {
            skip(CASE, &format!("store factory `{}` has no rollback hook", factory.name()));
            return;
        }
        let got = ok(store.get_lease(&content.key).await, "read the rolled-back lease");
        assert_eq!(
            got,
            Some(VersionedLease::new(content.clone(), v1)),
            "restore_raw must put the record back exactly as (content, v1)"
        );

        let mut c = content.transferred_to(Some(WorkerId::from("owner-c")));
        c.checkpoint = Position::sequence(50u64);
        let v3 = ok(store.update_lease(&c, v1).await, "owner C's update from the rolled-back v1");
        assert!(
            v3 != v2 && v3 != v1,
            "after a rollback the store handed out version {v3:?} again (v1 = {v1:?}, v2 = \
             {v2:?}): versions must never repeat for a key, even after the store lost writes, or \
             a writer holding a version from the lost timeline overwrites someone else's record"
        );

        let mut stale = b.clone();
        stale.checkpoint = Position::sequence(200u64);
        let current = conflict(
            store.update_lease(&stale, v2).await,
            &content.key,
            "owner B's update at v2, a version from before the rollback",
        );
        assert_eq!(
            current,
            Some(VersionedLease::new(c.clone(), v3)),
            "Error::Conflict of the stale update must carry owner C's record"
        );
        let current = conflict(
            store.delete_lease(&content.key, v2).await,
            &content.key,
            "delete at v2, a version from before the rollback",
        );
        if let Some(current) = current {
            assert_eq!(
                current,
                VersionedLease::new(c.clone(), v3),
                "Error::Conflict must carry the current record"
            );
        }
        let got = ok(store.get_lease(&content.key).await, "final read");
        assert_eq!(
            got,
            Some(VersionedLease::new(c, v3)),
            "nothing from the lost timeline may write the record"
        );
    })
    .await;
}
