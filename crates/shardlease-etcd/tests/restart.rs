//! etcd restarts under running workers (SIGKILL, then the same data directory and ports). etcd
//! keeps what it acknowledged, so the workers must simply go on: no checkpoint lost or moved
//! back, no epoch going back, every record processed, both workers running. Their watches break
//! with the connection and are opened again (then each worker lists once). The scenario is the
//! testkit's (`shardlease_testkit::extensions::restart`).
//!
//! The test runs its own `etcd` on free loopback ports and kills only that process (the shared
//! test server is used by other tests and must never be restarted).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, Result};
use shardlease_etcd::EtcdStore;
use shardlease_testkit::extensions::restart::{workers_go_on_across_a_restart, Restart};
use shardlease_testkit::extensions::RestartServer;

struct Server(common::PrivateEtcd);

#[async_trait]
impl RestartServer for Server {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        let store = EtcdStore::builder()
            .url(self.0.url())
            .namespace(namespace)
            .request_timeout(Duration::from_millis(1000))
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await?;
        Ok(Arc::new(store))
    }
    fn kill(&mut self) {
        self.0.kill();
    }
    fn start(&mut self) -> Result<()> {
        self.0.start().map_err(Error::permanent)
    }
    fn durable(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_go_on_when_etcd_restarts() {
    let name = "workers_go_on_when_etcd_restarts";
    let Some(server) = common::PrivateEtcd::start_or_skip(name) else { return };
    let how = Restart {
        heartbeat: Duration::from_millis(300),
        down: Duration::from_millis(500),
        deadline: Duration::from_secs(60),
    };
    workers_go_on_across_a_restart(name, &mut Server(server), how).await;
}
