//! A settled fleet reads worker records, not leases: with nothing changing, no worker lists the
//! leases (until the slow safety net), so what a quiet worker reads does not grow with the lease
//! count. Every change still reaches every worker within about a heartbeat plus a balance interval:
//! a join (and the claims it makes), a graceful leave, a crash (after its failover timeout), a
//! shard end, and a processor that swallows the refusal of its checkpoint.
//!
//! Time is paused, so the bounds are virtual time and hold on a loaded machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardlease_core::store::VersionedLease;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, MemorySource, Position, ShardSource, WorkerId};
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::counting::CountingStore;
use shardlease_testkit::recorder::Recorder;

const HB: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(300);

struct Fleet {
    cluster: Cluster,
    source: MemorySource,
    counting: Arc<CountingStore>,
    rec: Recorder,
    cfg: Config,
}

fn fleet(shards: usize, seed: u64) -> Fleet {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("quiet".parse().unwrap()));
    let counting = Arc::new(CountingStore::new(base));
    let source = MemorySource::new(shards);
    let rec = Recorder::new();
    let cfg = Config::new("quiet")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(seed);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let store: Arc<dyn LeaseStore> = counting.clone();
    let cluster = Cluster::new(store, src, rec.factory(), cfg.clone());
    Fleet { cluster, source, counting, rec, cfg }
}

impl Fleet {
    fn listings(&self) -> BTreeMap<WorkerId, u64> {
        self.cluster.stats().into_iter().map(|(id, s)| (id, s.lease_listings)).collect()
    }

    fn passes(&self) -> BTreeMap<WorkerId, u64> {
        self.cluster.stats().into_iter().map(|(id, s)| (id, s.passes)).collect()
    }

    /// Waits for a balanced fleet, then for three more passes on every worker (the passes right
    /// after the last move list once more, to see that nothing is left to do).
    async fn settle(&self) {
        self.cluster.wait_balanced(LONG, HB / 10).await.unwrap();
        let before = self.passes();
        wait_until("three more passes everywhere", LONG, HB / 10, || async {
            let now = self.passes();
            before.iter().all(|(id, n)| now.get(id).is_some_and(|m| *m >= n + 3))
        })
        .await
        .unwrap();
    }

    /// The longest a change may take to reach a worker's next listing: the changer's early
    /// heartbeat, the peer's next listing of worker records (each up to a jittered heartbeat),
    /// and the peer's next pass (a jittered balance interval), with a heartbeat to spare.
    fn notice_bound(&self) -> Duration {
        let jittered = |d: Duration| d.mul_f64(1.0 + self.cfg.jitter());
        jittered(HB) * 3 + jittered(self.cfg.balance_interval())
    }

    /// Waits until every worker in `who` has listed the leases since `before`, within `bound`.
    async fn all_list_within(
        &self,
        what: &str,
        who: &[WorkerId],
        before: &BTreeMap<WorkerId, u64>,
        bound: Duration,
    ) {
        wait_until(what, bound, HB / 20, || async {
            let now = self.listings();
            who.iter().all(|id| now.get(id) > before.get(id))
        })
        .await
        .unwrap_or_else(|e| panic!("{e} (listings before {before:?}, now {:?})", self.listings()));
    }
}

#[tokio::test(start_paused = true)]
async fn a_settled_fleet_lists_no_leases() {
    let mut f = fleet(64, 1);
    f.cluster.sync_shards().await.unwrap();
    f.cluster.start_workers(4).unwrap();
    f.settle().await;
    let before = f.counting.counts();
    let listings = f.listings();
    // Twenty heartbeats with nothing happening: under the safety net's interval (the shard-sync
    // interval, 30 heartbeats here, jittered by at most 10%).
    let window = HB * 20;
    assert!(window < f.cfg.shard_sync_interval().mul_f64(1.0 - f.cfg.jitter()));
    tokio::time::sleep(window).await;
    let ops = f.counting.counts().since(&before);
    assert_eq!(f.listings(), listings, "no balance pass listed the leases");
    assert_eq!(ops.of("list_leases"), 0, "nothing listed the leases: {ops:?}");
    assert_eq!(ops.of("get_lease"), 0, "nothing read a lease: {ops:?}");
    // The window was real: every worker beat and read the fleet signal all along.
    assert!(ops.of("read_fleet_signal") >= 4 * 15, "{ops:?}");
    assert!(ops.of("heartbeat") >= 4 * 15, "{ops:?}");
    // Nothing moved, so nobody wrote the signal, and the worker records were listed only by
    // the safety net (every 10 heartbeats, docs/algorithm.md, "A fleet too large to list each
    // heartbeat"); the other heartbeats read the two watched peers.
    assert_eq!(ops.of("write_fleet_signal"), 0, "{ops:?}");
    assert!(ops.of("list_workers") <= 4 * 3, "{ops:?}");
    assert!(ops.of("get_workers") >= 4 * 12, "{ops:?}");
    // What a quiet worker reads: the signal, two watched records, four per listing.
    let expected =
        ops.of("read_fleet_signal") + 2 * ops.of("get_workers") + 4 * ops.of("list_workers");
    assert_eq!(ops.records_read, expected, "{ops:?}");
    f.cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn every_change_reaches_every_worker_within_a_heartbeat_and_a_balance_interval() {
    let mut f = fleet(24, 2);
    f.cluster.sync_shards().await.unwrap();
    f.cluster.start_workers(3).unwrap();
    f.settle().await;
    let bound = f.notice_bound();

    // A join: the newcomer's record appears; then its claims (changes it publishes) reach the
    // owners, which hand over.
    let before = f.listings();
    let old = f.cluster.running();
    let newcomer = f.cluster.start_worker().unwrap();
    f.all_list_within("a join noticed", &old, &before, bound).await;
    f.cluster.wait_balanced(bound * 4, HB / 10).await.unwrap();
    assert!(f.cluster.handle(&newcomer).unwrap().stats().claims > 0, "the newcomer claimed");
    f.settle().await;

    // A graceful leave: the leaver releases (changes) and removes its record.
    let before = f.listings();
    let leaver = f.cluster.running()[0].clone();
    f.cluster.shutdown(&leaver).await.unwrap();
    let rest = f.cluster.running();
    f.all_list_within("a leave noticed", &rest, &before, bound).await;
    f.settle().await;

    // A crash: nothing is written; the peers notice when its heartbeat has stood still for the
    // failover timeout.
    let before = f.listings();
    let victim = f.cluster.running()[0].clone();
    f.cluster.crash(&victim);
    let rest = f.cluster.running();
    f.all_list_within("a crash noticed", &rest, &before, f.cfg.failover_timeout() + bound).await;
    f.settle().await;

    // A shard end: the owner finishes the parent (a change) and every worker lists, so the
    // children are taken at once.
    let before = f.listings();
    let parent = f.source.shards()[0].id.clone();
    let (a, b) = f.source.split(&parent).unwrap();
    let all = f.cluster.running();
    let bound_end = f.cfg.idle_poll_interval() * 2 + bound;
    f.all_list_within("a shard end noticed", &all, &before, bound_end).await;
    let store = f.cluster.store().clone();
    wait_until("both children owned", bound_end + bound, HB / 20, || async {
        let leases = store.list_leases().await.unwrap().items;
        [&a, &b]
            .iter()
            .all(|k| leases.iter().any(|v| &v.lease.key == *k && v.lease.owner.is_some()))
    })
    .await
    .unwrap();
    f.source.put_to_shard(&a, "to a child").unwrap();
    wait_until("the child's record processed", LONG, HB / 10, || async { f.rec.distinct() == 1 })
        .await
        .unwrap();
    f.cluster.shutdown_all().await;
}

/// What a processor does with the error of a refused checkpoint.
#[derive(Clone, Copy, Debug)]
enum OnRefusal {
    /// Wraps it in an error of its own (as `anyhow::Context` does): the type no longer matches.
    Wrap,
    /// Logs it and carries on as if nothing happened.
    Swallow,
}

/// An error that hides what caused it, the way a context wrapper does.
#[derive(Debug)]
struct Wrapped(String);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "writing my sink failed: {}", self.0)
    }
}

impl std::error::Error for Wrapped {}

/// Counts batches per lease and checkpoints each one.
struct Checkpointing {
    on_refusal: OnRefusal,
    batches: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl shardlease_core::RecordProcessor for Checkpointing {
    async fn process_records(
        &mut self,
        batch: &shardlease_core::Batch,
        cp: &shardlease_core::CheckpointHandle,
    ) -> Result<(), shardlease_core::BoxError> {
        self.batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match (cp.checkpoint_batch(batch).await, self.on_refusal) {
            (Ok(()), _) => Ok(()),
            (Err(e), OnRefusal::Wrap) => Err(Box::new(Wrapped(e.to_string()))),
            (Err(_), OnRefusal::Swallow) => Ok(()),
        }
    }
}

/// A lease taken from under its owner: the owner's next checkpoint is refused, and the owner
/// stops processing that shard however its processor reports the refusal.
async fn refused_checkpoint_stops_the_task(on_refusal: OnRefusal) {
    let (logs, _guard) = shardlease_testkit::logs::capture();
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("refused".parse().unwrap()));
    let source = MemorySource::new(1);
    let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = batches.clone();
    let factory =
        move |_: &shardlease_core::LeaseContext| -> Box<dyn shardlease_core::RecordProcessor> {
            Box::new(Checkpointing { on_refusal, batches: counted.clone() })
        };
    let cfg = Config::new("refused")
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(3);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(store.clone(), src, Arc::new(factory), cfg);
    cluster.sync_shards().await.unwrap();
    let id = cluster.start_worker().unwrap();
    let key = source.shards()[0].id.clone();
    wait_until("the lease taken", LONG, HB / 10, || async {
        cluster.handle(&id).unwrap().held_leases() == [key.clone()]
    })
    .await
    .unwrap();
    // Someone else takes the lease (an operator, or a peer that judged this worker dead).
    let VersionedLease { lease, version } = store.get_lease(&key).await.unwrap().unwrap();
    let other = shardlease_core::store::Lease {
        epoch: lease.epoch.next(),
        ..lease.transferred_to(Some(WorkerId::new("someone-else")))
    };
    store.update_lease(&other, version).await.unwrap();
    source.put_to_shard(&key, "one record").unwrap();
    wait_until("the task stopped", LONG, HB / 10, || async {
        cluster.handle(&id).unwrap().held_leases().is_empty()
    })
    .await
    .unwrap_or_else(|e| {
        panic!("{e}: {on_refusal:?}, {} batches", batches.load(std::sync::atomic::Ordering::SeqCst))
    });
    assert_eq!(cluster.handle(&id).unwrap().stats().lost, 1, "{on_refusal:?}");
    // The batch was offered once: the refused write stopped the task itself (not a later balance
    // pass), and the batch was not retried as if the processor had failed.
    assert_eq!(batches.load(std::sync::atomic::Ordering::SeqCst), 1, "{on_refusal:?}");
    let text = logs.text();
    assert!(text.contains("a fenced write was refused"), "{on_refusal:?}: {text}");
    assert!(!text.contains("retrying the same input"), "{on_refusal:?}: {text}");
    cluster.shutdown_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_wrapped_refusal_still_stops_the_task() {
    refused_checkpoint_stops_the_task(OnRefusal::Wrap).await;
}

#[tokio::test(start_paused = true)]
async fn a_swallowed_refusal_still_stops_the_task() {
    refused_checkpoint_stops_the_task(OnRefusal::Swallow).await;
}

/// A change made outside the fleet (here: every lease deleted by hand, no worker record touched)
/// is not signalled; the safety net's listing still finds it within its interval, and the fleet
/// restores the leases (their running owners remember them) without any signal.
#[tokio::test(start_paused = true)]
async fn the_safety_net_catches_a_change_nobody_signalled() {
    let mut f = fleet(16, 4);
    f.cluster.sync_shards().await.unwrap();
    f.cluster.start_workers(2).unwrap();
    f.settle().await;
    let store = f.cluster.store().clone();
    let before = store.list_leases().await.unwrap().items;
    for VersionedLease { lease: l, version: v } in &before {
        store.delete_lease(&l.key, *v).await.unwrap();
    }
    let listings = f.listings();
    let all = f.cluster.running();
    // The safety net's interval (the shard-sync interval at 16 leases), jittered, and a pass.
    let bound = f.cfg.shard_sync_interval().mul_f64(1.0 + f.cfg.jitter()) + f.notice_bound();
    f.all_list_within("the safety net listed", &all, &listings, bound).await;
    wait_until("every lease back", bound, HB / 10, || async {
        store.list_leases().await.unwrap().items.len() == before.len()
    })
    .await
    .unwrap();
    f.cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    f.cluster.shutdown_all().await;
}

/// A claim left on a lease whose shard ended while the handoff was pending waits for nobody: a
/// fleet holding such a lease still goes quiet. (It used to count as a pending claim, and every
/// worker listed every lease on every pass for as long as the finished lease stayed in the store,
/// which is as long as its children read nothing.)
#[tokio::test(start_paused = true)]
async fn a_claim_left_on_a_finished_lease_keeps_nobody_listing() {
    use shardlease_core::store::{Claim, Lease};
    let mut f = fleet(1, 4);
    let parent = f.source.shards()[0].id.clone();
    let (low, high) = f.source.split(&parent).unwrap();
    let mut finished = Lease::new(parent.clone(), Position::ShardEnd);
    finished.owner = Some(WorkerId::new("gone"));
    finished.claim = Some(Claim { by: WorkerId::new("claimant"), at: finished.epoch });
    assert!(finished.live_claim().is_some());
    f.counting.create_lease(&finished).await.unwrap();
    f.cluster.sync_shards().await.unwrap();
    assert!([&low, &high].iter().all(|k| f.source.records(k).is_empty()), "children stay idle");
    f.cluster.start_workers(2).unwrap();
    f.settle().await;
    let listings = f.listings();
    let window = HB * 20;
    assert!(window < f.cfg.shard_sync_interval().mul_f64(1.0 - f.cfg.jitter()));
    tokio::time::sleep(window).await;
    assert_eq!(f.listings(), listings, "no balance pass listed the leases");
    let VersionedLease { lease: still, .. } = f.counting.get_lease(&parent).await.unwrap().unwrap();
    assert!(still.is_finished() && still.live_claim().is_some(), "the case under test stood");
    f.cluster.shutdown_all().await;
}

/// `balance_now` asks the balance loop (the only one that runs passes) for a listing pass and
/// waits for it; once the worker stopped it returns at once instead of waiting forever.
#[tokio::test(start_paused = true)]
async fn balance_now_is_answered_by_the_loop_and_never_hangs() {
    let mut f = fleet(8, 5);
    f.cluster.sync_shards().await.unwrap();
    let ids = f.cluster.start_workers(2).unwrap();
    f.settle().await;
    let before = f.listings();
    tokio::time::timeout(HB * 10, f.cluster.handle(&ids[0]).unwrap().balance_now())
        .await
        .expect("answered within a few heartbeats");
    let after = f.listings();
    assert!(after[&ids[0]] > before[&ids[0]], "the pass listed: {before:?} then {after:?}");
    assert_eq!(after[&ids[1]], before[&ids[1]], "only the asked worker listed");
    let h = f.cluster.handle(&ids[1]).unwrap();
    h.shutdown().await;
    tokio::time::timeout(HB, h.balance_now()).await.expect("a stopped worker answers at once");
    f.cluster.shutdown_all().await;
}

/// How the wrapped store answers `victim`'s claim writes.
#[derive(Debug, Default)]
struct ClaimAnswers {
    /// Claim writes fail before being applied.
    refuse: std::sync::atomic::AtomicBool,
    /// The next claim write is applied and its answer lost (an error), then writes are normal.
    lose_next: std::sync::atomic::AtomicBool,
    /// Claim writes whose answer was lost.
    lost: std::sync::atomic::AtomicU64,
}

/// A store whose answers to one worker's claim writes can be refused or lost.
#[derive(Debug)]
struct LosesClaimAnswers {
    inner: Arc<dyn LeaseStore>,
    claimant: WorkerId,
    answers: Arc<ClaimAnswers>,
}

#[async_trait::async_trait]
impl shardlease_core::store::StoreDecorator for LosesClaimAnswers {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn update_lease(
        &self,
        lease: &shardlease_core::store::Lease,
        expected: shardlease_core::store::Version,
    ) -> shardlease_core::Result<shardlease_core::store::Version> {
        use std::sync::atomic::Ordering::SeqCst;
        let claims = lease.claim.as_ref().is_some_and(|c| c.by == self.claimant)
            && lease.owner.as_ref() != Some(&self.claimant);
        if claims && self.answers.refuse.load(SeqCst) {
            return Err(shardlease_core::Error::retryable("claim refused (test)"));
        }
        if claims && self.answers.lose_next.swap(false, SeqCst) {
            self.inner.update_lease(lease, expected).await?;
            self.answers.lost.fetch_add(1, SeqCst);
            return Err(shardlease_core::Error::retryable("claim applied, answer lost (test)"));
        }
        self.inner.update_lease(lease, expected).await
    }
}

/// A claim whose write was applied but whose answer was lost (a timeout on a loaded store) is
/// still a change the owner must hear of. The claimant counted it toward its share (it sees its
/// own claim in the listing) and stopped claiming, while the owner, settled and told nothing,
/// did not list the leases again until the safety net: the fleet stayed unbalanced (with an
/// available lease, uncovered) for the safety-net interval, 1,000 s at 10,000 leases.
#[tokio::test(start_paused = true)]
async fn a_claim_whose_answer_was_lost_is_still_answered() {
    use std::sync::atomic::Ordering::SeqCst;
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("quiet".parse().unwrap()));
    let source = MemorySource::new(3);
    let rec = Recorder::new();
    let cfg = Config::new("quiet")
        .unwrap()
        .with_heartbeat(HB)
        .with_shard_sync_interval(Duration::from_secs(3600))
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(9);
    let answers = Arc::new(ClaimAnswers::default());
    let store: Arc<dyn LeaseStore> = Arc::new(LosesClaimAnswers {
        inner: base,
        claimant: WorkerId::new("w2"),
        answers: answers.clone(),
    });
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(store, src, rec.factory(), cfg.clone());
    cluster.sync_shards().await.unwrap();
    let a = cluster.start_worker().unwrap();
    cluster.wait_balanced(LONG, HB / 10).await.unwrap();
    // The second worker's claims fail at first, so the owner lists once after it appeared, sees
    // no claim, and settles.
    answers.refuse.store(true, SeqCst);
    let b = cluster.start_worker().unwrap();
    assert_eq!(b, WorkerId::new("w2"));
    tokio::time::sleep(HB * 15).await;
    answers.lose_next.store(true, SeqCst);
    answers.refuse.store(false, SeqCst);
    wait_until("the claim applied with its answer lost", LONG, HB / 10, || async {
        answers.lost.load(SeqCst) == 1
    })
    .await
    .unwrap();
    // Heard within about a heartbeat and a balance interval, answered, and handed over; far
    // sooner than the safety net (an hour here).
    let jittered = |d: Duration| d.mul_f64(1.0 + cfg.jitter());
    let bound = jittered(HB) * 3 + jittered(cfg.balance_interval()) * 2 + cfg.shutdown_timeout();
    let cov = cluster.wait_balanced(bound, HB / 10).await.unwrap_or_else(|e| {
        panic!("{e}; {:?}", cluster.stats_report());
    });
    assert_eq!((cov.shares[&a], cov.shares[&b]), (2, 1));
    cluster.shutdown_all().await;
}
