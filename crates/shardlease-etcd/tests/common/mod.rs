//! Helpers shared by the integration tests: the conformance factory over the shared test server,
//! and a private `etcd` child process for tests that must restart a server (the shared one is
//! used by other tests and must never be restarted).

// Each test file uses a different subset of these helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::{Error, Result};
use shardlease_etcd::{codec, EtcdStore};
use shardlease_testkit::suite::{env_or_skip, skip};
use shardlease_testkit::StoreFactory;

/// The variable naming the shared test server.
pub const URL_VAR: &str = "SHARDLEASE_TEST_ETCD_URL";

/// The key prefix the tests use, so their keys are easy to find and never clash with a real
/// application's.
pub const TEST_PREFIX: &str = "shardlease-test";

/// The conformance suite's factory: one store per namespace on the shared test server.
pub struct EtcdFactory {
    url: String,
    watch: bool,
    page_size: Option<usize>,
}

impl EtcdFactory {
    /// A factory over the server at `url`, with change notification on or off.
    pub fn new(url: String, watch: bool) -> Self {
        EtcdFactory { url, watch, page_size: None }
    }

    /// The same, listing `n` records per page (so a test's few records fall on several pages).
    pub fn with_page_size(self, n: usize) -> Self {
        EtcdFactory { page_size: Some(n), ..self }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A store for `namespace`, as a concrete type.
    ///
    /// Requests wait up to 30 s (the default is 5 s) unless the URL says otherwise: on a busy CI
    /// machine the test server can stall for seconds, and a checkpoint that times out is returned
    /// to the processor, which has the batch delivered again. The lease-loop cases count that as
    /// a record processed twice, so a stall must delay a request, not fail it.
    pub async fn open(&self, namespace: &str) -> Result<EtcdStore> {
        let mut builder = EtcdStore::builder()
            .url(&self.url)
            .namespace(namespace)
            .key_prefix(TEST_PREFIX)
            .watch(self.watch);
        if !self.url.contains("?timeout_ms=") && !self.url.contains("&timeout_ms=") {
            builder = builder.request_timeout(Duration::from_secs(30));
        }
        if let Some(n) = self.page_size {
            builder = builder.page_size(n);
        }
        builder.connect().await
    }
}

#[async_trait]
impl StoreFactory for EtcdFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.open(namespace).await?))
    }

    async fn cleanup(&self, namespace: &str) -> Result<()> {
        self.open(namespace).await?.delete_namespace().await.map(|_| ())
    }

    fn name(&self) -> String {
        if self.watch {
            "etcd".to_owned()
        } else {
            "etcd (no watch)".to_owned()
        }
    }

    /// With the watch on, every worker receives and decodes every write of its namespace
    /// (checkpoints included): on this project's busy 2-core machine, with the suite's cases
    /// running in parallel in debug builds, the default timings (a 100 ms heartbeat) leave too
    /// little room, and workers fence themselves. The lease-loop cases run twice as slow then,
    /// with the same checks.
    fn timing_scale(&self) -> u32 {
        if self.watch {
            2
        } else {
            1
        }
    }

    /// Puts the record's value back exactly as this crate encodes `(lease, version)`, with a raw
    /// `Put` that bypasses compare-and-set, the way a store restored from a snapshot holds it.
    async fn restore_raw(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        let raw = self.open(namespace).await?;
        raw.client()
            .kv_client()
            .put(raw.lease_etcd_key(&lease.key), codec::encode_lease(lease, version), None)
            .await
            .map_err(|e| Error::permanent(format!("restore_raw: put failed: {e}")))?;
        Ok(true)
    }
}

/// The factory over `SHARDLEASE_TEST_ETCD_URL` (watch on), or `None` (skipped; a failure under
/// CI=true).
pub async fn factory() -> Option<EtcdFactory> {
    env_or_skip(URL_VAR).map(|url| EtcdFactory::new(url, true))
}

/// The same server with change notification off.
pub async fn factory_without_watch() -> Option<EtcdFactory> {
    env_or_skip(URL_VAR).map(|url| EtcdFactory::new(url, false))
}

/// An `etcd` of the test's own on free loopback ports with its data in a temporary directory
/// (kept across restarts, so a restart keeps the data, as etcd does). Killed when dropped.
pub struct PrivateEtcd {
    port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateEtcd {
    /// Starts a server, or returns `None` after saying the test is skipped (a failure under
    /// CI=true) when `etcd` is not installed.
    pub fn start_or_skip(test: &str) -> Option<PrivateEtcd> {
        let found = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            skip(test, "etcd is not installed (Debian package etcd-server)");
            return None;
        }
        for attempt in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix(&format!("shardlease-etcd-{attempt}-"))
                .tempdir()
                .unwrap_or_else(|e| panic!("{test}: cannot make a data directory: {e}"));
            let mut server =
                PrivateEtcd { port: free_port(), peer_port: free_port(), dir, child: None };
            if server.start().is_ok() {
                return Some(server);
            }
        }
        panic!("{test}: could not start a private etcd");
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its ports and waits until it accepts connections.
    pub fn start(&mut self) -> std::result::Result<(), String> {
        assert!(self.child.is_none(), "already running");
        let client = format!("http://127.0.0.1:{}", self.port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .args(["--name", "private", "--logger", "zap", "--log-level", "error"])
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("private={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning etcd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Err(format!("etcd exited at once: {status}"));
            }
            if healthy(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Err("etcd did not become healthy within 20 s".to_owned())
    }

    /// Kills the server (SIGKILL) and waits for it to exit; its data stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        // The data directory goes with the `TempDir` field, after the server is dead.
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

/// Whether etcd on `port` answers its health endpoint with a healthy server.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let req =
        format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).contains("\"health\":\"true\"")
}
