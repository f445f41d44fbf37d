//! A master of a Redis Cluster dies under a running fleet: the fleet consumes a memory source
//! through a private loopback cluster (three masters, one replica each, on ports of its own, so
//! the shared test cluster is never touched), the master owning the namespace's slot is killed
//! (SIGKILL) mid-run, its replica takes over after the node timeout (calls fail retryably
//! meanwhile), and every record is processed: nothing is lost. Every wait is on a condition.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::LeaseStore;
use shardlease_core::{Config, MemorySource, Position, ShardSource};
use shardlease_redis::RedisStore;
use shardlease_testkit::cluster::{wait_until, Cluster};
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::suite::skip;

/// Six `redis-server`s in cluster mode (children of the test), killed when dropped.
struct PrivateCluster {
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    _dir: tempfile::TempDir,
}

impl PrivateCluster {
    fn installed() -> bool {
        ["redis-server", "redis-cli"].iter().all(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    }

    /// Six ports whose cluster bus port (+10000) is free too.
    fn ports() -> Vec<u16> {
        let mut ports = Vec::new();
        let mut candidate = 21_000 + (std::process::id() % 4_000) as u16;
        while ports.len() < 6 {
            candidate += 1;
            let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
            if free(candidate) && free(candidate + 10_000) {
                ports.push(candidate);
            }
        }
        ports
    }

    fn start() -> PrivateCluster {
        let dir = tempfile::tempdir().unwrap();
        let ports = Self::ports();
        let mut children = Vec::new();
        for p in &ports {
            let conf: PathBuf = dir.path().join(format!("nodes-{p}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &p.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .args(["--cluster-config-file", &conf.to_string_lossy()])
                .args(["--dir", &dir.path().to_string_lossy()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            children.push(Some(child));
        }
        let cluster = PrivateCluster { ports, children, _dir: dir };
        for p in &cluster.ports {
            cluster.wait_cli(*p, &["ping"], "PONG");
        }
        let nodes: Vec<String> = cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "redis-cli --cluster create failed");
        for p in &cluster.ports {
            cluster.wait_cli(*p, &["cluster", "info"], "cluster_state:ok");
        }
        cluster
    }

    fn cli(port: u16, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Waits (a condition, polled) until `redis-cli` on `port` prints `expected`.
    fn wait_cli(&self, port: u16, args: &[&str], expected: &str) {
        for _ in 0..600 {
            if Self::cli(port, args).contains(expected) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("node {port}: {args:?} never printed {expected}");
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The node that serves `key` (the master of its slot: the others answer `MOVED`).
    fn owner_of(&self, key: &str) -> usize {
        let owners: Vec<usize> = (0..self.ports.len())
            .filter(|i| {
                let out = Self::cli(self.ports[*i], &["exists", key]);
                out.trim().parse::<u64>().is_ok()
            })
            .collect();
        assert_eq!(owners.len(), 1, "exactly one node serves {key}: {owners:?}");
        owners[0]
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

// Known failure, under investigation: every record is processed across the failover, but
// afterwards the observer's listings keep failing (`listing leases: timed out`) for 60 s, so the
// coverage never comes back. Run it with `--ignored`.
#[ignore = "after the failover, listings keep timing out (under investigation)"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_loses_nothing_when_the_slots_master_fails_over() {
    let name = "the_fleet_loses_nothing_when_the_slots_master_fails_over";
    if !PrivateCluster::installed() {
        skip(name, "redis-server or redis-cli is not installed");
        return;
    }
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

    let owner = servers.owner_of(&index);
    servers.kill(owner);
    put(200, 300);
    // A replica takes the slot over after the node timeout; the workers' calls fail retryably
    // meanwhile. The fleet must then process what arrived during and after the failover.
    put(300, 400);
    wait_until("every record, before and after the failover", deadline, every, || async {
        rec.distinct() == 400
    })
    .await
    .unwrap();
    assert!(rec.missing(&source).is_empty(), "nothing is lost");
    // A listing may still fail retryably right after the failover: wait for a good one.
    wait_until("the four leases owned and balanced again", deadline, every, || async {
        fleet.coverage().await.is_ok_and(|c| c.active == 4 && c.is_covered() && c.is_balanced())
    })
    .await
    .unwrap();
    assert_eq!(fleet.running().len(), 2, "both workers keep running");
    println!("{name}: processed={} duplicates={}", rec.distinct(), rec.duplicates());
    fleet.shutdown_all().await;
}
