//! A private Redis Cluster for tests that fail a node over: six `redis-server`s (three masters,
//! one replica each) on ports of their own, children of the test, data under the build
//! folder. The shared test cluster (7000-7005) serves other tests and must never lose a node.
//! Dropping the cluster kills exactly the processes it started, also when the test fails.
//!
//! A new cluster is `cluster_state:ok` before its replicas have attached and synced; a master
//! that fails then has no replica to promote and its slots stay down. So
//! [`PrivateCluster::start`] waits until every node sees three masters and three replicas and
//! every replica's link to its master is up. Every wait is on a condition, polled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// How a node is failed.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// SIGKILL: the process dies, its connections are refused.
    Kill,
    /// SIGSTOP: the process hangs (a frozen VM, a partition): connections stay open, nothing
    /// answers.
    Freeze,
}

/// How long a wait for the servers may take before the test fails.
const WAIT_POLLS: u32 = 1_200;
/// How often a wait polls.
const POLL: Duration = Duration::from_millis(50);

/// Where the next cluster of this process looks for free ports (each cluster of a process
/// gets a range of its own).
static NEXT_RANGE: AtomicU16 = AtomicU16::new(0);

/// Six `redis-server`s in cluster mode, killed when dropped.
pub struct PrivateCluster {
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    _dir: tempfile::TempDir,
}

impl PrivateCluster {
    /// Whether `redis-server` and `redis-cli` are installed.
    pub fn installed() -> bool {
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
        let range = NEXT_RANGE.fetch_add(1, Ordering::Relaxed);
        let mut candidate = 21_000 + (std::process::id() % 40) as u16 * 100 + range * 20;
        let mut ports = Vec::new();
        while ports.len() < 6 {
            candidate += 1;
            let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
            if free(candidate) && free(candidate + 10_000) {
                ports.push(candidate);
            }
        }
        ports
    }

    /// Starts the six servers, creates the cluster and waits until it is fully formed.
    pub fn start() -> PrivateCluster {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let ports = Self::ports();
        let mut cluster = PrivateCluster { ports, children: Vec::new(), _dir: dir };
        for p in cluster.ports.clone() {
            let conf = cluster._dir.path().join(format!("nodes-{p}.conf"));
            let node_dir = cluster._dir.path().join(p.to_string());
            std::fs::create_dir(&node_dir).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &p.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .args(["--cluster-config-file", &conf.to_string_lossy()])
                .args(["--dir", &node_dir.to_string_lossy()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            cluster.children.push(Some(child));
        }
        for p in &cluster.ports {
            cluster.wait_for(&format!("node {p} answers"), || Self::cli(*p, &["ping"]) == "PONG");
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
        cluster.wait_for("every master with a replica in sync", || cluster.formed());
        cluster
    }

    /// `redis-cli` on `port`: its output, trimmed (empty when it fails).
    pub fn cli(port: u16, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    /// Polls `check` until it holds; fails the test if it never does.
    pub fn wait_for(&self, what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..WAIT_POLLS {
            if check() {
                return;
            }
            std::thread::sleep(POLL);
        }
        panic!("the private cluster never got there: {what}");
    }

    /// Every node is `cluster_state:ok` and sees three masters and three replicas, none failing,
    /// and every replica's replication link is up.
    fn formed(&self) -> bool {
        let healthy = |p: &u16| {
            let nodes = Self::cli(*p, &["cluster", "nodes"]);
            let lines: Vec<&str> = nodes.lines().collect();
            Self::cli(*p, &["cluster", "info"]).contains("cluster_state:ok")
                && lines.len() == 6
                && lines.iter().filter(|l| l.contains("slave")).count() == 3
                && lines.iter().all(|l| {
                    l.contains(" connected") && !l.contains("fail") && !l.contains("handshake")
                })
        };
        let synced = self
            .ports
            .iter()
            .filter(|p| {
                let role = Self::cli(**p, &["role"]);
                role.starts_with("slave") && role.lines().nth(3) == Some("connected")
            })
            .count();
        self.ports.iter().all(healthy) && synced == 3
    }

    /// The seed URL of the whole cluster.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The node that serves `key` (the master of its slot: the others answer `MOVED`).
    pub fn owner_of(&self, key: &str) -> usize {
        let owners: Vec<usize> = (0..self.ports.len())
            .filter(|i| Self::cli(self.ports[*i], &["exists", key]).parse::<u64>().is_ok())
            .collect();
        assert_eq!(owners.len(), 1, "exactly one node serves {key}: {owners:?}");
        owners[0]
    }

    /// The replica of master `i`.
    pub fn replica_of(&self, i: usize) -> usize {
        let id = Self::cli(self.ports[i], &["cluster", "myid"]);
        let replicas: Vec<usize> = (0..self.ports.len())
            .filter(|j| {
                let role = Self::cli(self.ports[*j], &["role"]);
                let master = role.lines().nth(2).and_then(|p| p.parse::<u16>().ok());
                role.starts_with("slave") && master == Some(self.ports[i])
            })
            .collect();
        assert_eq!(replicas.len(), 1, "master {i} ({id}) has one replica: {replicas:?}");
        replicas[0]
    }

    /// Whether node `i` is a master now.
    pub fn is_master(&self, i: usize) -> bool {
        Self::cli(self.ports[i], &["role"]).starts_with("master")
    }

    /// Fails node `i`.
    pub fn fail(&mut self, i: usize, fault: Fault) {
        match fault {
            Fault::Kill => self.kill(i),
            Fault::Freeze => {
                let pid = self.children[i].as_ref().map(Child::id).unwrap();
                let status = Command::new("kill").args(["-STOP", &pid.to_string()]).status();
                assert!(status.is_ok_and(|s| s.success()), "SIGSTOP to node {i} failed");
            }
        }
    }

    /// Kills node `i` (SIGKILL, which also ends a stopped process) and reaps it.
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
