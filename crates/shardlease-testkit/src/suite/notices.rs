//! The change-notification cases, for a store whose
//! [`subscribe_changes`](shardlease_core::store::LeaseStore::subscribe_changes) returns a stream
//! (a store without one has nothing to check here, and these cases say so and pass).
//!
//! The runtime acts on a notice by listing, never on its content, so what matters is that a
//! notice comes for every change a peer must react to (a lease created, deleted or changing
//! owner, claim or finished state; a worker record appearing or vanishing), that none comes for
//! the writes of a steady state (a checkpoint written with `update_lease_quietly`, a heartbeat
//! of a known worker), which would cost every subscriber a listing, and that a subscription
//! whose connection is lost ends its stream, so the runtime subscribes again and lists.
//!
//! "No notice for X" is checked without waiting for a silence: after X the case makes a change
//! that must be announced (a marker lease) and reads up to its notice; nothing before it may
//! call for a listing.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use shardlease_core::store::{
    ChangeStream, Claim, CreateOutcome, Lease, LeaseStore, StoreChange, Version, WorkerRecord,
};
use shardlease_core::{Epoch, LeaseKey, Position, SequenceNumber, WorkerId};

use super::check::ok;
use super::{with_scope, StoreFactory};

/// The notification cases of one process run one at a time: dropping subscriptions may, on some
/// stores, drop every subscription of the server's clients, not only the case's own.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a notice may take to arrive: generous, since a stalled CI machine is no fault of
/// the store (a notice that never comes fails the case all the same).
fn patience(factory: &dyn StoreFactory) -> Duration {
    Duration::from_secs(20) * factory.timing_scale()
}

/// The next notice, or a panic naming `what` when none comes in time or the stream ends.
async fn next(stream: &mut ChangeStream, patience: Duration, what: &str) -> StoreChange {
    match tokio::time::timeout(patience, stream.next()).await {
        Ok(Some(change)) => change,
        Ok(None) => panic!("the change stream ended while waiting for the notice of {what}"),
        Err(_) => panic!("no notice of {what} within {patience:?}"),
    }
}

/// Reads notices up to the first one that calls for a listing; it must be about lease `key`.
async fn expect_lease(stream: &mut ChangeStream, key: &LeaseKey, patience: Duration, what: &str) {
    loop {
        let change = next(stream, patience, what).await;
        if !change.calls_for_listing() {
            continue;
        }
        match &change {
            StoreChange::Lease { key: k, .. } if k == key => return,
            StoreChange::Unknown => return,
            other => panic!("expected the notice of {what} (lease {key}), got {other:?}"),
        }
    }
}

/// Reads notices up to the first one that calls for a listing of the workers; it must be about
/// worker `id` (or unknown).
async fn expect_worker(stream: &mut ChangeStream, id: &WorkerId, patience: Duration, what: &str) {
    loop {
        let change = next(stream, patience, what).await;
        if !change.calls_for_worker_listing() {
            assert!(
                !change.calls_for_listing(),
                "expected the notice of {what} (worker {id}), got {change:?}"
            );
            continue;
        }
        match &change {
            StoreChange::Worker { id: w, .. } if w == id => return,
            StoreChange::Unknown => return,
            other => panic!("expected the notice of {what} (worker {id}), got {other:?}"),
        }
    }
}

/// Creates a marker lease and reads the notices up to its own: none before it may call for a
/// listing of either kind (`quiet` names the writes that came before it).
async fn expect_silence(
    store: &Arc<dyn LeaseStore>,
    stream: &mut ChangeStream,
    marker: &str,
    patience: Duration,
    quiet: &str,
) {
    let marker = LeaseKey::from(marker);
    let created = ok(
        store.create_lease(&Lease::new(marker.clone(), Position::Latest)).await,
        "create a marker lease",
    );
    assert!(matches!(created, CreateOutcome::Created(_)), "the marker lease is new");
    loop {
        let change = next(stream, patience, "the marker lease").await;
        match &change {
            StoreChange::Lease { key, .. } if key == &marker => return,
            _ => assert!(
                !change.calls_for_listing() && !change.calls_for_worker_listing(),
                "{quiet} must not be announced, but got {change:?}"
            ),
        }
    }
}

fn created(outcome: CreateOutcome, what: &str) -> Version {
    match outcome {
        CreateOutcome::Created(v) => v,
        other => panic!("{what}: expected Created, got {other:?}"),
    }
}

/// A notice comes for each change a peer reacts to: a lease created, taken, claimed, handed
/// over, released, finished and deleted, and a worker record appearing and being removed (by
/// `remove_worker_if` and by `remove_worker`); none comes for a checkpoint written with
/// `update_lease_quietly` or for a heartbeat of a worker whose record exists. Notices reach a
/// subscriber of another handle on the same namespace, and none comes from another namespace.
pub async fn notices_announce_ownership_changes_only(factory: &dyn StoreFactory) {
    let _one = ONE_AT_A_TIME.lock().await;
    with_scope(factory, "notices_announce_ownership_changes_only", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let Some(mut notices) = ok(store.subscribe_changes().await, "subscribe") else {
            println!(
                "notices_announce_ownership_changes_only [{}]: the store has no change \
                 notification; nothing to check",
                scope.factory().name()
            );
            return;
        };
        let p = patience(scope.factory());
        let writer = scope.store(&ns).await;
        // Another namespace's changes are not this namespace's notices.
        let (_, elsewhere) = scope.fresh_store().await;
        ok(
            elsewhere.create_lease(&Lease::new("elsewhere", Position::Latest)).await,
            "create elsewhere",
        );
        ok(
            elsewhere.heartbeat(&WorkerRecord::new(WorkerId::from("elsewhere"), 1)).await,
            "heartbeat elsewhere",
        );

        let key = LeaseKey::from("notice-shard");
        let (w1, w2) = (WorkerId::from("notice-w1"), WorkerId::from("notice-w2"));
        let lease = Lease::new(key.clone(), Position::TrimHorizon);
        let v = created(ok(writer.create_lease(&lease).await, "create"), "create");
        expect_lease(&mut notices, &key, p, "a created lease").await;

        let taken = Lease { owner: Some(w1.clone()), epoch: Epoch(1), ..lease.clone() };
        let v = ok(writer.update_lease(&taken, v).await, "take");
        expect_lease(&mut notices, &key, p, "a take").await;

        let checkpointed = Lease {
            checkpoint: Position::Sequence { seq: SequenceNumber::from(100u64), sub: 0 },
            ..taken.clone()
        };
        let v = ok(writer.update_lease_quietly(&checkpointed, v).await, "checkpoint quietly");
        let heartbeat = WorkerRecord::new(w1.clone(), 1);
        ok(writer.heartbeat(&heartbeat).await, "first heartbeat");
        expect_worker(&mut notices, &w1, p, "a worker record appearing").await;
        let mut later = heartbeat.clone();
        later.beat += 1;
        later.lease_count = 1;
        ok(writer.heartbeat(&later).await, "second heartbeat");
        expect_silence(&writer, &mut notices, "marker-1", p, "a quiet checkpoint or a heartbeat")
            .await;

        let claimed =
            Lease { claim: Some(Claim { by: w2.clone(), at: Epoch(1) }), ..checkpointed.clone() };
        let v = ok(writer.update_lease(&claimed, v).await, "claim");
        expect_lease(&mut notices, &key, p, "a claim").await;
        let handed =
            Lease { owner: Some(w2.clone()), epoch: Epoch(2), claim: None, ..checkpointed };
        let v = ok(writer.update_lease(&handed, v).await, "hand over");
        expect_lease(&mut notices, &key, p, "a handoff").await;
        let released = Lease { owner: None, epoch: Epoch(3), ..handed.clone() };
        let v = ok(writer.update_lease(&released, v).await, "release");
        expect_lease(&mut notices, &key, p, "a release").await;
        let finished = Lease { checkpoint: Position::ShardEnd, ..released };
        let v = ok(writer.update_lease(&finished, v).await, "finish");
        expect_lease(&mut notices, &key, p, "a shard end").await;
        ok(writer.delete_lease(&key, v).await, "delete");
        expect_lease(&mut notices, &key, p, "a deletion").await;

        let removed = ok(writer.remove_worker_if(&w1, later.beat).await, "remove_worker_if");
        assert!(removed, "remove_worker_if at the current beat removes the record");
        expect_worker(&mut notices, &w1, p, "a worker record collected").await;
        ok(
            writer.heartbeat(&WorkerRecord::new(w2.clone(), 7)).await,
            "heartbeat of a second worker",
        );
        expect_worker(&mut notices, &w2, p, "a second worker joining").await;
        ok(writer.remove_worker(&w2).await, "remove_worker");
        expect_worker(&mut notices, &w2, p, "a worker leaving").await;
    })
    .await;
}

/// A subscription whose connection the server drops ends its stream (the runtime then
/// subscribes again and lists once); a change made while no stream is open is in the next
/// listing, and a new subscription carries the changes made after it. Runs where the factory
/// can drop a store's subscriptions from outside
/// ([`StoreFactory::drop_subscriptions`]); elsewhere it says so and passes.
pub async fn a_dropped_subscription_ends_its_stream(factory: &dyn StoreFactory) {
    let _one = ONE_AT_A_TIME.lock().await;
    with_scope(factory, "a_dropped_subscription_ends_its_stream", |scope| async move {
        let name = scope.factory().name();
        let (ns, store) = scope.fresh_store().await;
        let Some(mut notices) = ok(store.subscribe_changes().await, "subscribe") else {
            println!("a_dropped_subscription_ends_its_stream [{name}]: no change notification");
            return;
        };
        let p = patience(scope.factory());
        let dropped = ok(
            scope.factory().drop_subscriptions(&store, &ns).await,
            "drop the namespace's subscriptions (the factory's hook)",
        );
        if !dropped {
            println!(
                "a_dropped_subscription_ends_its_stream [{name}]: the factory cannot drop \
                 subscriptions from outside; nothing to check"
            );
            return;
        }
        loop {
            match tokio::time::timeout(p, notices.next()).await {
                Ok(None) => break,
                Ok(Some(_)) => continue,
                Err(_) => panic!("the stream did not end within {p:?} of its connection dropping"),
            }
        }
        let missed = LeaseKey::from("made-while-unsubscribed");
        ok(store.create_lease(&Lease::new(missed.clone(), Position::Latest)).await, "create");
        let listed = ok(store.list_leases().await, "list after the gap").items;
        assert!(
            listed.iter().any(|v| v.lease.key == missed),
            "the listing after a lost subscription finds the change made meanwhile"
        );
        let mut again = ok(store.subscribe_changes().await, "subscribe again")
            .expect("a store that notified once subscribes again");
        let after = LeaseKey::from("made-after-resubscribing");
        ok(store.create_lease(&Lease::new(after.clone(), Position::Latest)).await, "create");
        expect_lease(&mut again, &after, p, "a lease created after subscribing again").await;
    })
    .await;
}
