//! Helpers shared by the integration tests: the conformance factory over the shared test server,
//! and a private `redis-server` child process for tests that must restart or configure a server
//! (the shared one on 6379 is used by other tests and must never be restarted).

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

pub mod private_cluster;

use shardlease_core::store::VersionedLease;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::cluster_routing::{AggregateOp, MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::{Error, Result};
use shardlease_redis::{RedisConnection, RedisStore};
use shardlease_testkit::suite::{env_or_skip, skip};
use shardlease_testkit::StoreFactory;

/// The variable naming the shared test server.
pub const URL_VAR: &str = "SHARDLEASE_TEST_REDIS_URL";

/// The variable naming the shared test cluster (`redis+cluster://…`).
pub const CLUSTER_URL_VAR: &str = "SHARDLEASE_TEST_REDIS_CLUSTER_URL";

/// The key prefix the tests use, so their keys are easy to find and never clash with a real
/// application's.
pub const TEST_PREFIX: &str = "shardlease-test";

/// The conformance suite's factory: one store per namespace on the shared test server.
pub struct RedisFactory {
    url: String,
    page_size: Option<usize>,
}

impl RedisFactory {
    /// A factory over the server at `url`.
    pub fn new(url: String) -> Self {
        RedisFactory { url, page_size: None }
    }

    /// The same, listing `n` records per page (so a test's few records fall on several pages).
    pub fn with_page_size(self, n: usize) -> Self {
        RedisFactory { page_size: Some(n), ..self }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A store for `namespace`, as a concrete type.
    pub async fn open(&self, namespace: &str) -> Result<RedisStore> {
        let builder =
            RedisStore::builder().url(&self.url).namespace(namespace).key_prefix(TEST_PREFIX);
        match self.page_size {
            Some(n) => builder.page_size(n).connect().await,
            None => builder.connect().await,
        }
    }
}

#[async_trait]
impl StoreFactory for RedisFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.open(namespace).await?))
    }

    async fn cleanup(&self, namespace: &str) -> Result<()> {
        self.open(namespace).await?.delete_namespace().await.map(|_| ())
    }

    fn name(&self) -> String {
        if self.url.contains("+cluster://") { "redis-cluster" } else { "redis" }.to_owned()
    }

    /// `CLIENT KILL TYPE pubsub`: every subscriber connection of the server (of every node of a
    /// cluster) goes (the notification cases run one at a time; a worker's subscription is
    /// made again).
    async fn drop_subscriptions(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
    ) -> Result<bool> {
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("TYPE").arg("pubsub");
        let failed = |e: redis::RedisError| {
            Error::permanent(format!("drop_subscriptions: CLIENT KILL failed: {e}"))
        };
        let killed: i64 = match self.open(namespace).await?.connection() {
            RedisConnection::Single(mut conn) => {
                kill.query_async(&mut conn).await.map_err(failed)?
            }
            RedisConnection::Cluster(mut conn) => {
                let every_node = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllNodes,
                    Some(ResponsePolicy::Aggregate(AggregateOp::Sum)),
                ));
                let value = conn.route_command(kill, every_node).await.map_err(failed)?;
                redis::from_redis_value(value)
                    .map_err(|e| Error::permanent(format!("drop_subscriptions: {e}")))?
            }
        };
        if killed == 0 {
            return Err(Error::permanent("drop_subscriptions: no subscriber connection to kill"));
        }
        Ok(true)
    }

    /// Writes the content through `store` (its own encoding: an update at the current version,
    /// or a create), then sets the hash's `version` field by hand with a raw `HSET`.
    async fn restore_raw(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        match store.get_lease(&lease.key).await? {
            Some(VersionedLease { version: current, .. }) => {
                store.update_lease(lease, current).await?;
            }
            None => {
                store.create_lease(lease).await?;
            }
        }
        let raw = self.open(namespace).await?;
        let mut conn = raw.connection();
        let added: i64 = redis::cmd("HSET")
            .arg(raw.lease_redis_key(&lease.key))
            .arg("version")
            .arg(version.0.to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::permanent(format!("restore_raw: HSET failed: {e}")))?;
        // 0: the field existed and was overwritten, as it must have been.
        if added != 0 {
            return Err(Error::permanent("restore_raw: the lease hash had no version field"));
        }
        Ok(true)
    }
}

/// The factory over `SHARDLEASE_TEST_REDIS_URL`, or `None` (skipped; a failure under CI=true).
pub async fn factory() -> Option<RedisFactory> {
    env_or_skip(URL_VAR).map(RedisFactory::new)
}

/// The factory over `SHARDLEASE_TEST_REDIS_CLUSTER_URL`, or `None` (skipped; a failure under
/// CI=true).
pub async fn cluster_factory() -> Option<RedisFactory> {
    env_or_skip(CLUSTER_URL_VAR).map(RedisFactory::new)
}

/// A `redis-server` of the test's own on a free loopback port, with no persistence (so a restart
/// loses everything, like the servers of this project). Killed when dropped.
pub struct PrivateRedis {
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts a server, or returns `None` after saying the test is skipped (a failure under
    /// CI=true) when `redis-server` is not installed.
    pub fn start_or_skip(test: &str, extra: &[&str]) -> Option<PrivateRedis> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            skip(test, "redis-server is not installed");
            return None;
        }
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        for _ in 0..5 {
            let port = free_port();
            let mut server = PrivateRedis { port, extra: extra.clone(), child: None };
            if server.start().is_ok() {
                return Some(server);
            }
        }
        panic!("{test}: could not start a private redis-server");
    }

    /// The server's URL (without credentials).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server (again) on its port and waits until it answers `PING`.
    pub fn start(&mut self) -> std::result::Result<(), String> {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("redis-server exited at once: {status}"));
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err("redis-server did not answer PING within 5 s".to_owned())
    }

    /// Kills the server (SIGKILL: no shutdown, nothing saved) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// Whether a Redis server on `port` answers `PING` (or asks for a password, which also means it
/// is up).
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) => buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"),
        Err(_) => false,
    }
}
