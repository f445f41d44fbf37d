//! With change notification, a graceful leave is taken over at once even by a worker that is
//! still in its start hold (its first heartbeat interval, when it takes no free lease and only
//! claims; docs/algorithm.md, "Starting together").
//!
//! A worker that joined a running fleet got its share by claims within milliseconds; if the peer
//! then leaves, its released leases are free. Holding them until the newcomer's full view left
//! them unread for up to a heartbeat interval, the very delay notification removes (the etcd
//! watch test caught it with a 60 s heartbeat). Time is paused: the bound is virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{Config, MemorySource, Position, ShardSource, Worker, WorkerHandle};
use shardlease_testkit::cluster::wait_until;
use shardlease_testkit::notifying::Notifier;
use shardlease_testkit::recorder::Recorder;

const SHARDS: usize = 8;
const HB: Duration = Duration::from_secs(60);

fn start(
    store: &Arc<dyn LeaseStore>,
    source: &MemorySource,
    rec: &Recorder,
    id: &str,
) -> WorkerHandle {
    let cfg = Config::new("leave")
        .unwrap()
        .with_heartbeat(HB)
        .with_worker_id(id)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(7);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    Worker::builder(cfg, store.clone(), src, rec.factory()).build().unwrap().start()
}

#[tokio::test(start_paused = true)]
async fn a_leave_during_the_start_hold_is_taken_over_at_once() {
    let base: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store("leave".parse().unwrap()));
    let store: Arc<dyn LeaseStore> = Arc::new(Notifier::new(1).wrap(base));
    let source = MemorySource::new(SHARDS);
    for i in 0..100 {
        source.put(&format!("k{i}"), format!("v{i}"));
    }
    let rec = Recorder::new();
    let every = Duration::from_millis(10);

    let first = start(&store, &source, &rec, "first");
    wait_until("the first worker holds every lease", HB * 3, every, || async {
        first.held_leases().len() == SHARDS
    })
    .await
    .unwrap();

    let second = start(&store, &source, &rec, "second");
    let joined = tokio::time::Instant::now();
    wait_until("the newcomer holds half", HB / 2, every, || async {
        second.held_leases().len() == SHARDS / 2 && first.held_leases().len() == SHARDS / 2
    })
    .await
    .unwrap();
    assert!(joined.elapsed() < HB / 4, "the join itself is answered at once with notification");

    // The newcomer is still in its start hold (one heartbeat interval after its first beat).
    let left = tokio::time::Instant::now();
    first.shutdown().await;
    wait_until("the newcomer holds every lease", HB / 4, every, || async {
        second.held_leases().len() == SHARDS
    })
    .await
    .unwrap_or_else(|e| {
        panic!("a leave in the newcomer's start hold waited for its full view: {e}")
    });
    assert!(left.duration_since(joined) < HB, "the leave came inside the start hold");
    assert_eq!(rec.duplicates(), 0, "a graceful handoff and release deliver nothing twice");
    second.shutdown().await;
}
