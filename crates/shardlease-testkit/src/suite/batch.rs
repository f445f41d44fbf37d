//! Cases about the batch writes (`update_leases`, `create_leases`): each item of a batch is its
//! own compare-and-set, judged exactly as `update_lease` judges it, and one item's conflict
//! neither stops nor undoes the others. The runtime takes leases and creates them at shard sync
//! through these calls, so a store's own batch must keep every rule of the single write.

use shardlease_core::store::{CreateOutcome, Lease, LeaseUpdate, Version, VersionedLease};
use shardlease_core::{Error, LeaseKey, Position, WorkerId};

use super::check::{created, ok};
use super::{with_scope, StoreFactory};

fn key(i: usize) -> String {
    format!("shardId-{i:012}")
}

/// The record a batch item fails with: a `Conflict` for `key`, carrying what it holds now.
fn conflicted(
    r: &shardlease_core::Result<Version>,
    key: &str,
    what: &str,
) -> Option<VersionedLease> {
    match r {
        Err(Error::Conflict { key: k, current }) => {
            assert_eq!(k.as_str(), key, "{what}: the conflict must name its own key");
            current.as_deref().cloned()
        }
        other => panic!("{what}: expected Error::Conflict for {key}, got {other:?}"),
    }
}

/// A batch mixing current and stale versions, with the stale items first, in the middle and last,
/// and a missing key: the current ones are written (new versions, read back), the stale ones
/// fail with `Conflict` carrying the record as it is, and write nothing.
pub async fn a_batch_applies_each_compare_and_set_on_its_own(factory: &dyn StoreFactory) {
    with_scope(factory, "a_batch_applies_each_compare_and_set_on_its_own", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let mut versions = Vec::new();
        for i in 0..6 {
            let lease = Lease::new(key(i), Position::TrimHorizon);
            versions.push(created(store.create_lease(&lease).await, "create"));
        }
        // Items 0, 2 and 5 are stale: someone wrote them since.
        let mut now = versions.clone();
        for i in [0, 2, 5] {
            let moved = Lease::new(key(i), Position::sequence(7u64));
            now[i] = ok(store.update_lease(&moved, versions[i]).await, "update");
        }
        let me = WorkerId::from("batcher");
        let mut updates: Vec<LeaseUpdate> = (0..6)
            .map(|i| {
                let lease =
                    Lease::new(key(i), Position::TrimHorizon).transferred_to(Some(me.clone()));
                LeaseUpdate::new(lease, versions[i])
            })
            .collect();
        updates.insert(3, LeaseUpdate::new(Lease::new(key(99), Position::Latest), versions[0]));
        let outcomes = ok(store.update_leases(&updates).await, "update_leases");
        assert_eq!(outcomes.len(), updates.len(), "one outcome per item, in order");
        for (u, r) in updates.iter().zip(&outcomes) {
            let k = u.lease.key.as_str();
            let got = ok(store.get_lease(&u.lease.key).await, "get after the batch");
            if k == key(99) {
                assert_eq!(conflicted(r, k, "a missing key"), None, "missing: Conflict with None");
                assert_eq!(got, None, "a batch update must not create a missing lease");
                continue;
            }
            let i: usize = (0..6).find(|i| key(*i) == k).unwrap_or_default();
            if [0, 2, 5].contains(&i) {
                let current = conflicted(r, k, "a stale item");
                let expected = Lease::new(key(i), Position::sequence(7u64));
                assert_eq!(current, Some(VersionedLease::new(expected.clone(), now[i])));
                assert_eq!(
                    got,
                    Some(VersionedLease::new(expected, now[i])),
                    "{k}: nothing written"
                );
            } else {
                let v = match r {
                    Ok(v) => *v,
                    Err(e) => panic!("{k}: an item at its current version must be written: {e}"),
                };
                assert_ne!(v, versions[i], "{k}: a written item gets a new version");
                assert_eq!(got, Some(VersionedLease::new(u.lease.clone(), v)), "{k}: read back");
            }
        }
    })
    .await;
}

/// An empty batch is `Ok(vec![])`, for updates and creations alike.
pub async fn an_empty_batch_does_nothing(factory: &dyn StoreFactory) {
    with_scope(factory, "an_empty_batch_does_nothing", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let updates = ok(store.update_leases(&[]).await, "empty update_leases");
        assert!(updates.is_empty(), "an empty batch has no outcomes: {updates:?}");
        let creates = ok(store.create_leases(&[]).await, "empty create_leases");
        assert!(creates.is_empty(), "an empty batch has no outcomes: {creates:?}");
        let listing = ok(store.list_leases().await, "list");
        assert!(listing.items.is_empty(), "an empty batch writes nothing");
    })
    .await;
}

/// Versions in a batch behave exactly as with `update_lease`: a version written by a batch is
/// the one the next single update must name, a batch naming a replaced version conflicts, and
/// versions never repeat.
pub async fn a_batch_honours_versions_like_update_lease(factory: &dyn StoreFactory) {
    with_scope(factory, "a_batch_honours_versions_like_update_lease", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let lease = Lease::new(key(1), Position::TrimHorizon);
        let v0 = created(store.create_lease(&lease).await, "create");
        let l1 = lease.transferred_to(Some(WorkerId::from("a")));
        let out = ok(store.update_leases(&[LeaseUpdate::new(l1.clone(), v0)]).await, "batch");
        let v1 = match &out[..] {
            [Ok(v)] => *v,
            other => panic!("a batch of one at the current version must be written: {other:?}"),
        };
        assert_ne!(v1, v0);
        // The replaced version no longer works, in a batch or alone.
        let l2 = l1.transferred_to(Some(WorkerId::from("b")));
        let out = ok(store.update_leases(&[LeaseUpdate::new(l2.clone(), v0)]).await, "stale batch");
        let current = conflicted(&out[0], key(1).as_str(), "a batch at a replaced version");
        assert_eq!(current, Some(VersionedLease::new(l1.clone(), v1)));
        assert!(matches!(store.update_lease(&l2, v0).await, Err(Error::Conflict { .. })));
        // The version the batch returned is the one a single update names next.
        let v2 = ok(store.update_lease(&l2, v1).await, "single update after the batch");
        assert!(v2 != v0 && v2 != v1, "versions never repeat");
        let out = ok(store.update_leases(&[LeaseUpdate::new(l1.clone(), v2)]).await, "batch again");
        let v3 = match &out[..] {
            [Ok(v)] => *v,
            other => panic!("{other:?}"),
        };
        assert!(![v0, v1, v2].contains(&v3), "versions never repeat: {v3:?}");
        let got = ok(store.get_lease(&lease.key).await, "get");
        assert_eq!(got, Some(VersionedLease::new(l1, v3)));
    })
    .await;
}

/// `create_leases` is create-if-absent per lease, in order: existing leases are left as they
/// are (`AlreadyExists`), the others created at the version reported; a batch naming a key
/// twice is refused as a whole.
pub async fn a_batch_creates_only_missing_leases(factory: &dyn StoreFactory) {
    with_scope(factory, "a_batch_creates_only_missing_leases", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let existing = Lease::new(key(2), Position::sequence(5u64));
        let v = created(store.create_lease(&existing).await, "create");
        let batch: Vec<Lease> = (0..5)
            .map(|i| {
                Lease::new(key(i), Position::TrimHorizon).with_parents([LeaseKey::from(key(9))])
            })
            .collect();
        let outcomes = ok(store.create_leases(&batch).await, "create_leases");
        assert_eq!(outcomes.len(), batch.len(), "one outcome per lease, in order");
        for (lease, outcome) in batch.iter().zip(&outcomes) {
            let got = ok(store.get_lease(&lease.key).await, "get");
            match outcome {
                CreateOutcome::AlreadyExists => {
                    assert_eq!(lease.key.as_str(), key(2), "only the existing lease exists");
                    assert_eq!(got, Some(VersionedLease::new(existing.clone(), v)), "left as is");
                }
                CreateOutcome::Created(v) => {
                    assert_eq!(got, Some(VersionedLease::new(lease.clone(), *v)), "created");
                }
            }
        }
        let twice = [Lease::new(key(7), Position::Latest), Lease::new(key(7), Position::Latest)];
        assert!(store.create_leases(&twice).await.is_err(), "one key twice: refused");
        let again = ok(store.create_leases(&batch).await, "create_leases again");
        assert!(again.iter().all(|o| *o == CreateOutcome::AlreadyExists), "{again:?}");
    })
    .await;
}

/// Leases in [`a_batch_larger_than_any_backend_chunk`]: more than the chunk of every store of
/// this workspace that splits a batch below 256 items (DynamoDB's transactions take 100, etcd's
/// 128), so the batch spans several chunks.
pub const LARGE_BATCH: usize = 260;

/// A batch of [`LARGE_BATCH`] items, so a store that splits batches writes it in several chunks:
/// the conflicts sit in the first, a later and the last chunk, and each item is still judged on
/// its own. `create_leases` over leases of which some exist (in a later chunk) creates the others
/// and reports `AlreadyExists` for those; `update_leases` with stale items writes the rest, and
/// the stale ones keep what they hold.
pub async fn a_batch_larger_than_any_backend_chunk(factory: &dyn StoreFactory) {
    with_scope(factory, "a_batch_larger_than_any_backend_chunk", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let existing = [130, 205];
        let mut before = Vec::new();
        for i in existing {
            let lease = Lease::new(key(i), Position::sequence(1u64));
            before.push(created(store.create_lease(&lease).await, "create"));
        }
        let leases: Vec<Lease> =
            (0..LARGE_BATCH).map(|i| Lease::new(key(i), Position::TrimHorizon)).collect();
        let outcomes = ok(store.create_leases(&leases).await, "create_leases");
        assert_eq!(outcomes.len(), LARGE_BATCH, "one outcome per lease, in order");
        let mut versions = Vec::new();
        for (i, outcome) in outcomes.iter().enumerate() {
            match (existing.iter().position(|e| *e == i), outcome) {
                (Some(n), CreateOutcome::AlreadyExists) => versions.push(before[n]),
                (None, CreateOutcome::Created(v)) => versions.push(*v),
                (_, other) => panic!("{}: wrong creation outcome {other:?}", key(i)),
            }
        }
        let listing = ok(store.list_leases().await, "list");
        assert_eq!(listing.items.len(), LARGE_BATCH, "every lease exists once");
        for (i, v) in versions.iter().enumerate() {
            let got = ok(store.get_lease(&LeaseKey::from(key(i))).await, "get");
            let expected = match existing.iter().position(|e| *e == i) {
                Some(_) => Lease::new(key(i), Position::sequence(1u64)),
                None => leases[i].clone(),
            };
            assert_eq!(got, Some(VersionedLease::new(expected, *v)), "{}", key(i));
        }
        // Stale items in the first chunk, in later ones and last.
        let stale = [0, 150, 230, LARGE_BATCH - 1];
        let mut now = versions.clone();
        for i in stale {
            let moved = Lease::new(key(i), Position::sequence(9u64));
            now[i] = ok(store.update_lease(&moved, versions[i]).await, "update");
        }
        let me = WorkerId::from("batcher");
        let updates: Vec<LeaseUpdate> = (0..LARGE_BATCH)
            .map(|i| {
                let lease =
                    Lease::new(key(i), Position::TrimHorizon).transferred_to(Some(me.clone()));
                LeaseUpdate::new(lease, versions[i])
            })
            .collect();
        let results = ok(store.update_leases(&updates).await, "update_leases");
        assert_eq!(results.len(), LARGE_BATCH, "one outcome per item, in order");
        for (i, (u, r)) in updates.iter().zip(&results).enumerate() {
            let k = key(i);
            let got = ok(store.get_lease(&u.lease.key).await, "get after the batch");
            if stale.contains(&i) {
                let moved =
                    VersionedLease::new(Lease::new(key(i), Position::sequence(9u64)), now[i]);
                assert_eq!(conflicted(r, &k, "a stale item"), Some(moved.clone()));
                assert_eq!(got, Some(moved), "{k}: nothing written");
            } else {
                let v = match r {
                    Ok(v) => *v,
                    Err(e) => panic!("{k}: an item at its current version must be written: {e}"),
                };
                assert_ne!(v, versions[i], "{k}: a written item gets a new version");
                assert_eq!(got, Some(VersionedLease::new(u.lease.clone(), v)), "{k}: read back");
            }
        }
    })
    .await;
}
