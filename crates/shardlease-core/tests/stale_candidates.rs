//! A worker whose take candidates went stale between its listing and its takes (peers took most
//! of them meanwhile, as when 16 workers start together on 10,000 leases) refreshes them with one
//! listing instead of walking them one conflict at a time: it still takes its share in one pass,
//! and its conflicts stay within what it was missing plus one round of takes. Before, it walked
//! every stale candidate: at 10,000 × 16 on Redis a first pass lasted up to a minute.
//!
//! The newcomer's store view serves it a listing from before the fleet started (every lease
//! free) until its first write, and counts the conflicts its writes meet. Paused time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{
    Lease, LeaseStore, Listing, MemoryStore, StoreDecorator, Version, VersionedLease,
};
use shardlease_core::{Config, Error, MemorySource, Position, Result, ShardSource, WorkerId};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(600);
const SHARDS: usize = 1000;
const CAP: usize = 250;
const TAKE_CONCURRENCY: usize = 16;

/// What the newcomer's view serves and counts.
#[derive(Debug, Default)]
struct Stale {
    /// The listing served to the newcomer until its first write.
    listing: Mutex<Option<Listing<VersionedLease>>>,
    /// Set at the newcomer's first write: from then on it lists the store itself.
    written: AtomicBool,
    /// Conflicts the newcomer's writes met.
    conflicts: AtomicUsize,
}

#[derive(Debug)]
struct View {
    inner: Arc<dyn LeaseStore>,
    stale: Option<Arc<Stale>>,
}

#[async_trait]
impl StoreDecorator for View {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }
    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        if let Some(stale) = &self.stale {
            if !stale.written.load(Ordering::SeqCst) {
                if let Some(l) = stale.listing.lock().unwrap().clone() {
                    return Ok(l);
                }
            }
        }
        self.inner.list_leases().await
    }
    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let r = self.inner.update_lease(lease, expected).await;
        if let Some(stale) = &self.stale {
            stale.written.store(true, Ordering::SeqCst);
            if matches!(r, Err(Error::Conflict { .. })) {
                stale.conflicts.fetch_add(1, Ordering::SeqCst);
            }
        }
        r
    }
}

/// Three workers hold `CAP` leases each of `SHARDS` (the cap keeps the rest free); a fourth joins
/// with a listing from before they took theirs, so three of every four of its candidates conflict.
#[tokio::test(start_paused = true)]
async fn a_stale_candidate_list_is_refreshed_and_the_share_still_taken_in_one_pass() {
    for seed in 1..=3 {
        let base: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let stale = Arc::new(Stale::default());
        let newcomer = WorkerId::new("w4");
        let views = {
            let (base, stale, newcomer) = (base.clone(), stale.clone(), newcomer.clone());
            Arc::new(move |w: &WorkerId| -> Arc<dyn LeaseStore> {
                let stale = (*w == newcomer).then(|| stale.clone());
                Arc::new(View { inner: base.clone(), stale })
            })
        };
        let cfg = Config::new("default")
            .unwrap()
            .with_heartbeat(HB)
            .with_initial_position(Position::TrimHorizon)
            .with_take_concurrency(TAKE_CONCURRENCY)
            .with_rng_seed(seed)
            .with_idle_poll_interval(HB / 10)
            .with_max_leases_per_worker(CAP);
        let src: Arc<dyn ShardSource> = Arc::new(MemorySource::new(SHARDS));
        let mut cluster = Cluster::with_store_per_worker(
            base.clone(),
            views,
            src,
            Recorder::new().factory(),
            cfg,
        );
        cluster.sync_shards().await.unwrap();
        *stale.listing.lock().unwrap() = Some(base.list_leases().await.unwrap());
        cluster.start_workers(3).unwrap();
        let c = &cluster;
        wait_until("three workers at their cap", LONG, HB / 10, || async {
            c.coverage().await.is_ok_and(|cov| cov.shares.values().all(|n| *n == CAP))
        })
        .await
        .unwrap();

        assert_eq!(cluster.start_worker().unwrap(), newcomer);
        let c = &cluster;
        wait_until("the newcomer to take the free quarter", LONG, HB / 10, || async {
            c.coverage().await.is_ok_and(|cov| cov.uncovered == 0 && cov.min_share() == CAP)
        })
        .await
        .unwrap();
        let stats = cluster.handle(&newcomer).unwrap().stats();
        assert_eq!((stats.taking_passes, stats.taken), (1, CAP as u64), "seed {seed}: {stats:?}");
        let conflicts = stale.conflicts.load(Ordering::SeqCst);
        eprintln!("seed {seed}: {conflicts} conflicts for {CAP} leases");
        // Walking the stale list meets about 3 conflicts per lease taken (750 in all).
        assert!(
            conflicts <= CAP + TAKE_CONCURRENCY,
            "seed {seed}: {conflicts} conflicts for {CAP} leases: the stale candidates were walked"
        );
        assert!(stats.lease_listings >= 2, "seed {seed}: the candidates were refreshed: {stats:?}");
        cluster.shutdown_all().await;
    }
}
