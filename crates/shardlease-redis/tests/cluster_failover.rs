//! A master of a Redis Cluster fails under a running fleet: the fleet consumes a memory source
//! through a private loopback cluster (three masters, one replica each, on ports of its own, so
//! the shared test cluster is never touched), the master owning the namespace's slot fails
//! mid-run, its replica takes over after the node timeout (calls fail retryably meanwhile),
//! and nothing is lost: every record is processed, every lease is owned again and checkpointed
//! to its shard's last record, in the new master. Two faults: the master dies (SIGKILL), and the
//! master hangs (SIGSTOP: its connections stay open and nothing answers, so only the store
//! connecting again from the seeds finds the new master). A change subscription made before the
//! fault ends, so the runtime subscribes again. Every wait is on a condition.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::private_cluster::{Fault, PrivateCluster};
use futures::StreamExt;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Config, LeaseKey, MemorySource, Position, ShardSource};
use shardlease_redis::RedisStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::suite::skip;

/// One failover at a time: two private clusters and fleets at once would crowd the machine,
/// and a node too slow to answer its peers within the node timeout fails over by itself.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_loses_nothing_when_the_slots_master_dies() {
    fails_over(Fault::Kill, "the_fleet_loses_nothing_when_the_slots_master_dies").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_loses_nothing_when_the_slots_master_hangs() {
    fails_over(Fault::Freeze, "the_fleet_loses_nothing_when_the_slots_master_hangs").await;
}

async fn fails_over(fault: Fault, name: &str) {
    if !PrivateCluster::installed() {
        skip(name, "redis-server or redis-cli is not installed");
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let mut servers = tokio::task::spawn_blocking(PrivateCluster::start).await.unwrap();
    let namespace = "failover";
    let store = RedisStore::builder()
        .url(servers.url())
        .namespace(namespace)
        .response_timeout(Duration::from_millis(500))
        .connection_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let index = format!("{}:leases", store.key_tag());
    let observer: Arc<dyn LeaseStore> = Arc::new(store);

    let source = MemorySource::new(4);
    let put = |from: usize, to: usize| {
        for i in from..to {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
    };
    put(0, 200);
    let rec = Recorder::new();
    let heartbeat = Duration::from_millis(200);
    let cfg = Config::new(namespace)
        .unwrap()
        .with_heartbeat(heartbeat)
        .with_initial_position(Position::TrimHorizon)
        .with_shard_sync_interval(heartbeat * 3);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut fleet = Cluster::new(observer.clone(), src, rec.factory(), cfg);
    fleet.start_workers(2).unwrap();
    let deadline = Duration::from_secs(60);
    let every = Duration::from_millis(50);
    fleet.wait_balanced(deadline, every).await.unwrap();
    wait_until("the first 200 records", deadline, every, || async { rec.distinct() == 200 })
        .await
        .unwrap();

    // A subscription made before the fault listens on the failing master (the channel shares the
    // namespace's slot): it must end, so that the runtime subscribes again, rather than go
    // silent.
    let mut before = observer.subscribe_changes().await.unwrap().expect("notification is on");
    let owner = servers.owner_of(&index);
    let replica = servers.replica_of(owner);
    let failed_at = std::time::Instant::now();
    servers.fail(owner, fault);
    put(200, 300);
    // The replica takes the slot over after the node timeout; the workers' calls fail retryably
    // meanwhile. The fleet must then process what arrived during and after the failover.
    let promoted = tokio::task::spawn_blocking(move || {
        servers.wait_for("the replica promoted", || servers.is_master(replica));
        servers
    });
    let servers = promoted.await.unwrap();
    wait_until("a listing that succeeds", deadline, every, || async {
        observer.list_leases().await.is_ok()
    })
    .await
    .unwrap();
    let answered_after = failed_at.elapsed();
    put(300, 400);
    wait_until("every record, before and after the failover", deadline, every, || async {
        rec.distinct() == 400
    })
    .await
    .unwrap();
    assert!(rec.missing(&source).is_empty(), "nothing is lost");
    // Writes acknowledged by the old master just before it failed may be missing from the new
    // one (replication is asynchronous): the fleet then runs those records again and writes its
    // checkpoints anew. Wait for a listing that shows every lease owned, balanced and
    // checkpointed to its shard's last record.
    let last: HashMap<LeaseKey, Position> = source
        .shards()
        .iter()
        .map(|s| (s.id.clone(), source.records(&s.id).last().unwrap().position()))
        .collect();
    wait_until("the four leases owned, balanced and checkpointed", deadline, every, || async {
        let covered = fleet
            .coverage()
            .await
            .is_ok_and(|c| c.active == 4 && c.is_covered() && c.is_balanced());
        let checkpointed = fleet.leases().await.is_ok_and(|leases| {
            leases.len() == 4 && leases.iter().all(|l| last.get(&l.key) == Some(&l.checkpoint))
        });
        covered && checkpointed
    })
    .await
    .unwrap();
    assert_eq!(fleet.running().len(), 2, "both workers keep running");
    let ended = tokio::time::timeout(deadline, async { while before.next().await.is_some() {} });
    assert!(ended.await.is_ok(), "the subscription made before the failover ended");
    println!(
        "{name}: processed={} duplicates={} store answered again {answered_after:.1?} after the \
         fault",
        rec.distinct(),
        rec.duplicates()
    );
    fleet.shutdown_all().await;
    drop(servers);
}
