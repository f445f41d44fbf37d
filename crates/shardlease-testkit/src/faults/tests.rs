//! Unit tests of the fault injector, run against the in-memory store.

use shardlease_core::store::VersionedLease;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, MemoryStore, WorkerRecord};
use shardlease_core::{Error, LeaseKey, Position, WorkerId};

use super::{Faults, FaultyStore, INJECTED_CORRUPTION};

fn setup(seed: u64) -> (Arc<dyn LeaseStore>, Faults) {
    (Arc::new(MemoryStore::new()), Faults::new(seed))
}

fn view(inner: &Arc<dyn LeaseStore>, faults: &Faults, worker: Option<&str>) -> FaultyStore {
    FaultyStore::new(inner.clone(), faults.clone(), worker.map(WorkerId::from))
}

fn is_injected(e: &Error) -> bool {
    matches!(e, Error::Backend { retryable: true, message, .. } if message.starts_with("injected fault"))
}

fn is_partitioned(e: &Error) -> bool {
    matches!(e, Error::Backend { retryable: true, message, .. } if message.starts_with("partitioned"))
}

#[tokio::test]
async fn without_faults_calls_pass_through() {
    let (inner, faults) = setup(1);
    let store = view(&inner, &faults, Some("w1"));
    let lease = Lease::new("shard-1", Position::TrimHorizon);
    let CreateOutcome::Created(v) = store.create_lease(&lease).await.unwrap() else {
        panic!("expected Created");
    };
    assert_eq!(
        store.get_lease(&lease.key).await.unwrap(),
        Some(VersionedLease::new(lease.clone(), v))
    );
    assert_eq!(
        inner.get_lease(&lease.key).await.unwrap(),
        Some(VersionedLease::new(lease.clone(), v))
    );
    store.heartbeat(&WorkerRecord::new("w1".into(), 1)).await.unwrap();
    assert_eq!(store.list_workers().await.unwrap().items.len(), 1);
    store.delete_lease(&lease.key, v).await.unwrap();
    assert!(inner.list_leases().await.unwrap().items.is_empty());
    assert_eq!(faults.injected_errors(), 0);
}

#[tokio::test]
async fn conditional_removal_and_namespace_are_forwarded() {
    let (inner, faults) = setup(2);
    let store = view(&inner, &faults, Some("w1"));
    assert_eq!(store.namespace().map(|n| n.to_string()).as_deref(), Some("default"));
    store.heartbeat(&WorkerRecord::new("w9".into(), 4)).await.unwrap();
    assert!(!store.remove_worker_if(&"w9".into(), 3).await.unwrap(), "stale beat");
    assert!(store.remove_worker_if(&"w9".into(), 4).await.unwrap());
    assert!(inner.list_workers().await.unwrap().items.is_empty());
    faults.partition(&WorkerId::from("w1"));
    let e = store.remove_worker_if(&"w9".into(), 4).await.unwrap_err();
    assert!(is_partitioned(&e), "{e}");
    assert_eq!(store.namespace().map(|n| n.to_string()).as_deref(), Some("default"));
}

#[tokio::test]
async fn reads_fail_before_and_writes_fail_on_both_sides() {
    let (inner, faults) = setup(7);
    let store = view(&inner, &faults, None);
    faults.set_error_rate(1.0);
    for _ in 0..20 {
        let e = store.list_leases().await.unwrap_err();
        assert!(is_injected(&e), "{e}");
    }
    assert_eq!(faults.lost_answers(), 0, "reads never count as lost answers");
    let n = 200;
    for i in 0..n {
        let e = store.create_lease(&Lease::new(format!("s-{i}"), Position::Latest)).await;
        assert!(is_injected(e.as_ref().unwrap_err()), "{e:?}");
    }
    let applied = inner.list_leases().await.unwrap().items.len() as u64;
    assert_eq!(faults.injected_errors(), 20 + n);
    assert_eq!(applied, faults.lost_answers(), "exactly the lost answers were applied");
    assert!((n / 4..=3 * n / 4).contains(&applied), "about half applied, got {applied}/{n}");

    faults.set_error_rate(0.0);
    assert_eq!(store.list_leases().await.unwrap().items.len() as u64, applied);
}

#[tokio::test]
async fn error_rate_is_a_probability_and_replays_from_the_seed() {
    async fn outcomes(seed: u64) -> Vec<bool> {
        let (inner, faults) = setup(seed);
        let store = view(&inner, &faults, None);
        faults.set_error_rate(0.3);
        let mut out = Vec::new();
        for _ in 0..300 {
            out.push(store.list_workers().await.is_ok());
        }
        out
    }
    let a = outcomes(42).await;
    assert_eq!(a, outcomes(42).await, "same seed, same faults");
    assert_ne!(a, outcomes(43).await, "another seed, other faults");
    let failed = a.iter().filter(|ok| !**ok).count();
    assert!((50..=130).contains(&failed), "about 30% of 300 calls should fail, got {failed}");
}

#[tokio::test]
async fn a_partitioned_worker_reaches_nothing_and_others_are_unaffected() {
    let (inner, faults) = setup(3);
    let a = view(&inner, &faults, Some("a"));
    let b = view(&inner, &faults, Some("b"));
    let anon = view(&inner, &faults, None);
    let wa = WorkerId::from("a");
    faults.partition(&wa);
    assert!(faults.is_partitioned(&wa));

    let lease = Lease::new("shard-1", Position::TrimHorizon);
    let e = a.create_lease(&lease).await.unwrap_err();
    assert!(is_partitioned(&e), "{e}");
    assert!(is_partitioned(&a.heartbeat(&WorkerRecord::new(wa.clone(), 1)).await.unwrap_err()));
    assert!(is_partitioned(&a.list_leases().await.unwrap_err()));
    assert!(inner.list_leases().await.unwrap().items.is_empty(), "nothing applied");
    assert!(inner.list_workers().await.unwrap().items.is_empty(), "nothing applied");

    assert!(matches!(b.create_lease(&lease).await.unwrap(), CreateOutcome::Created(_)));
    assert_eq!(anon.list_leases().await.unwrap().items.len(), 1);
    assert_eq!(faults.partition_rejections(), 3);
    assert_eq!(faults.injected_errors(), 0);

    faults.heal(&wa);
    assert_eq!(a.list_leases().await.unwrap().items.len(), 1);
    faults.partition(&wa);
    faults.partition(&WorkerId::from("b"));
    assert!(a.list_workers().await.is_err() && b.list_workers().await.is_err());
    faults.heal_all();
    assert!(a.list_workers().await.is_ok() && b.list_workers().await.is_ok());
}

#[tokio::test]
async fn corrupt_records_are_reported_and_never_written() {
    let (inner, faults) = setup(5);
    let store = view(&inner, &faults, Some("w"));
    let bad = Lease::new("bad", Position::TrimHorizon);
    let good = Lease::new("good", Position::TrimHorizon);
    let CreateOutcome::Created(v) = store.create_lease(&bad).await.unwrap() else {
        panic!("expected Created");
    };
    store.create_lease(&good).await.unwrap();
    faults.corrupt(&bad.key);

    match store.get_lease(&bad.key).await {
        Err(Error::Corrupt { key, reason }) => {
            assert_eq!(key, "bad");
            assert_eq!(reason, INJECTED_CORRUPTION);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let listing = store.list_leases().await.unwrap();
    assert_eq!(listing.items.len(), 1);
    assert_eq!(listing.items[0].lease.key, good.key);
    assert_eq!(listing.corrupt.len(), 1);
    assert_eq!(listing.corrupt[0].key, "bad");

    let moved = bad.transferred_to(Some("w".into()));
    assert!(matches!(store.update_lease(&moved, v).await, Err(Error::Corrupt { .. })));
    assert!(matches!(store.delete_lease(&bad.key, v).await, Err(Error::Corrupt { .. })));
    assert_eq!(
        inner.get_lease(&bad.key).await.unwrap(),
        Some(VersionedLease::new(bad.clone(), v)),
        "untouched"
    );

    faults.uncorrupt(&bad.key);
    assert_eq!(store.get_lease(&bad.key).await.unwrap(), Some(VersionedLease::new(bad.clone(), v)));
    assert!(store.list_leases().await.unwrap().corrupt.is_empty());
    store.update_lease(&moved, v).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn latency_uses_tokio_time_and_stays_in_bounds() {
    let (inner, faults) = setup(11);
    let store = view(&inner, &faults, None);
    faults.set_latency(Duration::from_millis(100), Duration::from_millis(300));
    let mut seen = Vec::new();
    for _ in 0..50 {
        let start = tokio::time::Instant::now();
        store.list_leases().await.unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took <= Duration::from_millis(301),
            "{took:?}"
        );
        seen.push(took);
    }
    seen.sort();
    assert!(seen[49] - seen[0] > Duration::from_millis(50), "latency should vary: {seen:?}");

    faults.clear();
    let start = tokio::time::Instant::now();
    store.list_leases().await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(1));
}

#[tokio::test]
async fn clear_turns_every_fault_off_but_keeps_counters() {
    let (inner, faults) = setup(9);
    let store = view(&inner, &faults, Some("w"));
    faults.set_error_rate(1.0);
    faults.partition(&WorkerId::from("w"));
    faults.corrupt(&LeaseKey::from("k"));
    assert!(store.list_leases().await.is_err());
    faults.clear();
    let lease = Lease::new("k", Position::Latest);
    store.create_lease(&lease).await.unwrap();
    assert!(store.get_lease(&lease.key).await.unwrap().is_some());
    assert_eq!(faults.partition_rejections(), 1);
    assert!(format!("{faults:?}").contains("seed: 9"));
    assert_eq!(faults.seed(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_late_write_fails_for_the_caller_and_lands_after_its_delay() {
    let (inner, faults) = setup(11);
    let store = view(&inner, &faults, Some("w1"));
    faults.set_late_writes(1.0, Duration::from_secs(2));
    let base = WorkerRecord::first_beat();
    let e = store.heartbeat(&WorkerRecord::new("w1".into(), base + 1)).await.unwrap_err();
    assert!(is_injected(&e), "{e}");
    assert!(inner.list_workers().await.unwrap().items.is_empty(), "not landed yet");
    faults.set_late_writes(0.0, Duration::ZERO);
    // The caller's next beat lands first; the late one lands after it and, by the store's rule,
    // does not move the beat back.
    store.heartbeat(&WorkerRecord::new("w1".into(), base + 2)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beats: Vec<u64> =
        inner.list_workers().await.unwrap().items.iter().map(|r| r.beat).collect();
    assert_eq!(beats, vec![base + 2]);
    assert_eq!(faults.late_writes(), 1);

    // A late lease write lands too, by compare-and-set against the version it was sent with.
    let lease = Lease::new("shard-1", Position::TrimHorizon);
    let CreateOutcome::Created(v) = inner.create_lease(&lease).await.unwrap() else {
        panic!("expected Created");
    };
    faults.set_late_writes(1.0, Duration::from_secs(2));
    let owned = lease.transferred_to(Some("w1".into()));
    assert!(is_injected(&store.update_lease(&owned, v).await.unwrap_err()));
    assert_eq!(inner.get_lease(&lease.key).await.unwrap().unwrap().lease.owner, None);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = inner.get_lease(&lease.key).await.unwrap().unwrap().lease;
    assert_eq!(now.owner, Some(WorkerId::from("w1")));
    assert_eq!(faults.late_writes(), 2);
}

/// Runs one call of `store`, `Err(message)` when it panicked.
async fn caught<T>(call: impl std::future::Future<Output = T>) -> Result<T, String> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(call).catch_unwind().await.map_err(|p| {
        p.downcast_ref::<String>().cloned().unwrap_or_else(|| "non-string panic".to_owned())
    })
}

#[tokio::test]
async fn panics_are_a_probability_replay_from_the_seed_and_clear() {
    async fn outcomes(seed: u64) -> (Vec<bool>, u64) {
        let (inner, faults) = setup(seed);
        let store = view(&inner, &faults, Some("w1"));
        faults.set_panic_rate(0.3);
        let mut out = Vec::new();
        for _ in 0..300 {
            match caught(store.list_workers()).await {
                Ok(r) => {
                    r.unwrap();
                    out.push(false);
                }
                Err(m) => {
                    assert!(m.starts_with(super::INJECTED_PANIC), "{m}");
                    out.push(true);
                }
            }
        }
        (out, faults.injected_panics())
    }
    let (a, n) = outcomes(42).await;
    assert_eq!(a, outcomes(42).await.0, "same seed, same panics");
    assert_ne!(a, outcomes(43).await.0, "another seed, other panics");
    let panicked = a.iter().filter(|p| **p).count();
    assert_eq!(n, panicked as u64);
    assert!((50..=130).contains(&panicked), "about 30% of 300 calls should panic, got {panicked}");

    // Panics have an RNG of their own: a read that panics draws nothing else, so the calls that
    // do not panic see the errors the seed draws without panics, in the same order.
    async fn errors(seed: u64, panic_rate: f64) -> Vec<bool> {
        let (inner, faults) = setup(seed);
        let store = view(&inner, &faults, None);
        faults.set_error_rate(0.3);
        faults.set_panic_rate(panic_rate);
        let mut out = Vec::new();
        for _ in 0..200 {
            if let Ok(r) = caught(store.list_leases()).await {
                out.push(r.is_ok());
            }
        }
        out
    }
    let with_panics = errors(5, 0.3).await;
    assert!(with_panics.len() < 180, "some calls panicked");
    assert_eq!(with_panics[..], errors(5, 0.0).await[..with_panics.len()]);

    // Writes panic before or after reaching the store; clear() stops the panics.
    let (inner, faults) = setup(8);
    let store = view(&inner, &faults, Some("w1"));
    faults.set_panic_rate(1.0);
    let n = 100;
    for i in 0..n {
        let m = caught(store.create_lease(&Lease::new(format!("s-{i}"), Position::Latest)))
            .await
            .unwrap_err();
        assert!(m.starts_with(super::INJECTED_PANIC), "{m}");
    }
    let applied = inner.list_leases().await.unwrap().items.len();
    assert!((n / 4..=3 * n / 4).contains(&applied), "about half applied, got {applied}/{n}");
    assert!(caught(store.subscribe_changes()).await.is_err());
    assert!(store.namespace().is_some(), "namespace never panics");
    assert_eq!(faults.injected_panics(), n as u64 + 1);
    assert!(format!("{faults:?}").contains("injected_panics: 101"));
    faults.clear();
    assert_eq!(caught(store.list_leases()).await.unwrap().unwrap().items.len(), applied);
    assert_eq!(faults.injected_panics(), n as u64 + 1, "counters kept");
}
