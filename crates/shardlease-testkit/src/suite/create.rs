//! Cases about creating and reading leases: every field survives the round trip through the
//! store's encoding, and concurrent creators of one key agree on a single winner.

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::collections::BTreeMap;
use std::sync::Arc;

use shardlease_core::store::{Claim, CreateOutcome, Lease};
use shardlease_core::{LeaseKey, Position, SequenceNumber, WorkerId};
use tokio::sync::Barrier;

use super::check::{created, join_tasks, ok};
use super::{with_scope, StoreFactory};

/// A 56-digit Kinesis sequence number: far beyond `u64`, so a store must keep it as digits.
pub(crate) const LONG_SEQUENCE: &str = "49590338271490256608559692538361571095921575989136588898";

fn seq(digits: &str) -> SequenceNumber {
    SequenceNumber::parse(digits).expect("valid sequence number")
}

/// Leases that between them use every field and every `Position` variant.
fn sample_leases() -> Vec<Lease> {
    let mut attributes = BTreeMap::new();
    attributes.insert("hash_range".to_owned(), "0-170141183460469231731687303715884105727".into());
    attributes.insert("throughput".to_owned(), "1234.5".into());
    attributes.insert("note".to_owned(), "quotes \" ' \\ and ünïcødé ✓".into());
    attributes.insert("empty".to_owned(), String::new());

    let full = Lease {
        key: LeaseKey::from("shardId-000000000001"),
        owner: Some(WorkerId::from("worker-a.example.com-4242-0000beef")),
        epoch: Epoch(7),
        checkpoint: Position::Sequence { seq: seq(LONG_SEQUENCE), sub: 3 },
        parents: vec![LeaseKey::from("shardId-000000000000"), LeaseKey::from("parent/two")],
        claim: Some(Claim { by: WorkerId::from("worker-b"), at: Epoch(7) }),
        attributes,
    };
    let mut stale_claim = Lease::new("stream-a/shardId-000000000002", Position::TrimHorizon);
    stale_claim.owner = Some(WorkerId::from("worker-b"));
    stale_claim.epoch = Epoch(3);
    stale_claim.claim = Some(Claim { by: WorkerId::from("worker-c"), at: Epoch(2) });

    let mut finished = Lease::new("shardId-000000000003", Position::ShardEnd)
        .with_parents([LeaseKey::from("shardId-000000000001")]);
    finished.epoch = Epoch(12);

    vec![
        full,
        stale_claim,
        Lease::new("shardId-000000000004", Position::Latest),
        Lease::new("shardId-000000000005", Position::AtTimestamp { millis: 1_700_000_000_123 }),
        Lease::new("shardId-000000000006", Position::sequence(seq(&"9".repeat(45)))),
        Lease::new("shardId-000000000007", Position::Sequence { seq: seq("0"), sub: 0 }),
        finished,
    ]
}

/// Every field of a lease (owner, epoch, each `Position` variant including a 56-digit sequence
/// number with a sub-sequence, parents, claim, attributes) reads back exactly as created, at the
/// version the create returned, from the same handle and from a second handle on the namespace;
/// creating an existing key reports `AlreadyExists` and changes nothing; a missing key reads as
/// `None`.
pub async fn create_and_get_round_trip(factory: &dyn StoreFactory) {
    with_scope(factory, "create_and_get_round_trip", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let leases = sample_leases();
        let mut versions = Vec::new();
        for lease in &leases {
            let v = created(store.create_lease(lease).await, format!("create {}", lease.key));
            versions.push(v);
            let got = ok(store.get_lease(&lease.key).await, format!("get {}", lease.key));
            assert_eq!(
                got,
                Some(VersionedLease::new(lease.clone(), v)),
                "get {} must return the lease exactly as created, at the version create returned",
                lease.key
            );
        }

        let again = scope.store(&ns).await;
        for (lease, v) in leases.iter().zip(&versions) {
            let got = ok(again.get_lease(&lease.key).await, format!("get {} again", lease.key));
            assert_eq!(
                got,
                Some(VersionedLease::new(lease.clone(), *v)),
                "a second store opened on the same namespace must see {}",
                lease.key
            );
        }

        let mut other = leases[2].clone();
        other.owner = Some(WorkerId::from("intruder"));
        other.epoch = Epoch(99);
        let outcome = ok(store.create_lease(&other).await, "create an existing key");
        assert_eq!(outcome, CreateOutcome::AlreadyExists, "creating an existing key");
        let got = ok(store.get_lease(&other.key).await, "get after a refused create");
        assert_eq!(
            got,
            Some(VersionedLease::new(leases[2].clone(), versions[2])),
            "a create that found the key must not change the record"
        );

        for missing in ["shardId-999999999999", "shardId-00000000000", "stream-a"] {
            let got = ok(store.get_lease(&LeaseKey::from(missing)).await, "get a missing key");
            assert_eq!(got, None, "get of the missing key {missing:?} must return None");
        }
    })
    .await;
}

/// 16 tasks create the same key at once, each with different content: exactly one sees
/// `Created`, the others `AlreadyExists`, and the stored record is the winner's, at the winner's
/// version.
pub async fn create_race_is_idempotent(factory: &dyn StoreFactory) {
    const RACERS: usize = 16;
    with_scope(factory, "create_race_is_idempotent", |scope| async move {
        let (_, store) = scope.fresh_store().await;
        let key = LeaseKey::from("shardId-000000000042");
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for i in 0..RACERS {
            let store = store.clone();
            let barrier = barrier.clone();
            let mut lease = Lease::new(key.clone(), Position::TrimHorizon);
            lease.owner = Some(WorkerId::new(format!("racer-{i}")));
            lease.epoch = Epoch(i as u64);
            lease.attributes.insert("racer".to_owned(), i.to_string());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let outcome = ok(store.create_lease(&lease).await, format!("racer {i}: create"));
                (lease, outcome)
            }));
        }
        let results = join_tasks(tasks).await;
        let winners: Vec<_> = results
            .iter()
            .filter_map(|(lease, outcome)| match outcome {
                CreateOutcome::Created(v) => Some(VersionedLease::new(lease.clone(), *v)),
                CreateOutcome::AlreadyExists => None,
            })
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "exactly one of {RACERS} concurrent creates must see Created; winners: {winners:?}"
        );
        let got = ok(store.get_lease(&key).await, "get after the race");
        assert_eq!(got.as_ref(), winners.first(), "the stored record must be the winner's");
    })
    .await;
}
