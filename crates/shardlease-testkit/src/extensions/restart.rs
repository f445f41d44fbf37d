//! Server restarts, once for every store that can run a private server: workers keep running
//! through a restart (SIGKILL, then the same address again), every record is processed, no
//! epoch goes back; a durable server loses and moves back no checkpoint, and after a server
//! that comes back empty no version from before the loss is handed out again (docs/algorithm.md,
//! "When the store loses writes").
//!
//! The store's test owns the private server (the shared test server must never be restarted)
//! and implements [`RestartServer`]; the scenario and its assertions live here.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::{Config, MemorySource, Position, Result, ShardSource};

use crate::cluster::{wait_until, Cluster};
use crate::recorder::Recorder;

/// The hooks a store's test implements to run [`workers_go_on_across_a_restart`].
#[async_trait]
pub trait RestartServer: Send {
    /// A store on the private server for `namespace`, with timeouts short enough that a call
    /// to a dead server fails within a heartbeat or two.
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>>;

    /// Kills the server (SIGKILL).
    fn kill(&mut self);

    /// Starts the server again on the same address.
    fn start(&mut self) -> Result<()>;

    /// Whether the server keeps what it acknowledged across a restart (etcd, PostgreSQL), or
    /// comes back empty (a Redis without persistence).
    fn durable(&self) -> bool;
}

/// How the restart scenario runs.
#[derive(Clone, Copy, Debug)]
pub struct Restart {
    /// The workers' heartbeat.
    pub heartbeat: Duration,
    /// How long the server stays down (an outage, not a synchronisation: the workers must cope
    /// with any length; one beyond the failover timeout makes them fence themselves first).
    pub down: Duration,
    /// How long each wait may take.
    pub deadline: Duration,
}

async fn leases(store: &dyn LeaseStore) -> BTreeMap<String, (Lease, Version)> {
    let listing = store.list_leases().await.unwrap_or_else(|e| panic!("{e}"));
    listing
        .items
        .into_iter()
        .map(|v| (v.lease.key.as_str().to_owned(), (v.lease, v.version)))
        .collect()
}

/// Two workers on four shards process 200 records; the server is killed, 50 records arrive,
/// it comes back after `how.down`, 50 more arrive. Every record is processed, the fleet is
/// balanced over the four leases again, both workers keep running and no epoch goes back. On a
/// durable server no lease is lost and no checkpoint moves back; on one that comes back empty
/// the leases are recreated and none has a version from before the loss.
pub async fn workers_go_on_across_a_restart(
    name: &str,
    server: &mut dyn RestartServer,
    how: Restart,
) {
    let namespace = "restart";
    let observer = server.store(namespace).await.unwrap_or_else(|e| panic!("{e}"));
    let source = MemorySource::new(4);
    let put = |from: usize, to: usize| {
        for i in from..to {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
    };
    put(0, 200);
    let rec = Recorder::new();
    let cfg = Config::new(namespace)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(how.heartbeat)
        .with_initial_position(Position::TrimHorizon)
        // An empty namespace is noticed by the shard sync too: keep it frequent.
        .with_shard_sync_interval(how.heartbeat * 3);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::new(observer.clone(), src, rec.factory(), cfg);
    // No explicit shard sync: a worker syncs by itself when it finds the namespace empty.
    cluster.start_workers(2).unwrap_or_else(|e| panic!("{e}"));
    let every = Duration::from_millis(50);
    cluster.wait_balanced(how.deadline, every).await.unwrap_or_else(|e| panic!("{e}"));
    wait_until("the first 200 records", how.deadline, every, || async { rec.distinct() == 200 })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rec.duplicates(), 0, "nothing is delivered twice before the restart");
    if server.durable() {
        // The checkpoints of the first 200 land before the restart.
        wait_until("checkpoints written", how.deadline, every, || async {
            leases(&*observer)
                .await
                .values()
                .all(|(l, _)| matches!(l.checkpoint, Position::Sequence { .. }))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let before = leases(&*observer).await;

    server.kill();
    put(200, 250);
    tokio::time::sleep(how.down).await;
    server.start().unwrap_or_else(|e| panic!("{e}"));

    // An empty namespace counts as balanced: wait for the four leases first.
    wait_until("the four leases", how.deadline, every, || async {
        cluster.coverage().await.is_ok_and(|c| c.active == 4)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    put(250, 300);
    wait_until("every record, old and new", how.deadline, every, || async {
        rec.distinct() == 300
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let cov = cluster.wait_balanced(how.deadline, every).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cov.active, 4);
    assert!(rec.missing(&source).is_empty());

    let after = leases(&*observer).await;
    if server.durable() {
        assert_eq!(after.len(), before.len(), "no lease lost");
    } else {
        let old: HashSet<Version> = before.values().map(|(_, v)| *v).collect();
        let new: HashSet<Version> = after.values().map(|(_, v)| *v).collect();
        assert!(
            old.is_disjoint(&new),
            "a version from before the loss came back ({old:?} / {new:?})"
        );
    }
    for (key, (old, _)) in &before {
        let Some((new, _)) = after.get(key) else { panic!("{key}: lost") };
        assert!(new.epoch >= old.epoch, "{key}: epoch {} before, {} after", old.epoch, new.epoch);
        if server.durable() {
            assert!(
                !old.checkpoint.would_regress_to(&new.checkpoint),
                "{key}: checkpoint went back from {} to {}",
                old.checkpoint,
                new.checkpoint
            );
        }
    }
    assert_eq!(cluster.running().len(), 2);
    for id in cluster.running() {
        assert!(cluster.handle(&id).is_some_and(|h| h.is_running()), "{id} keeps running");
    }
    println!("{name}: duplicates={} lost={}", rec.duplicates(), rec.lost());
    cluster.shutdown_all().await;
}
