//! Redis restarts under running workers and comes back empty (this project's servers keep
//! nothing on disk, and neither does a Redis without AOF). The workers must notice that their
//! leases are gone, put them back (or get them recreated by the shard sync), own them again and
//! go on processing; no version from before the loss is handed out again (versions are random).
//! The scenario is the testkit's (`shardlease_testkit::extensions::restart`).
//!
//! The test runs its own `redis-server` on a free loopback port (the shared test server must never
//! be restarted: other tests use it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, Result};
use shardlease_redis::RedisStore;
use shardlease_testkit::extensions::restart::{workers_go_on_across_a_restart, Restart};
use shardlease_testkit::extensions::RestartServer;

struct Server(common::PrivateRedis);

#[async_trait]
impl RestartServer for Server {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        let store = RedisStore::builder()
            .url(self.0.url())
            .namespace(namespace)
            .response_timeout(Duration::from_millis(500))
            .connection_timeout(Duration::from_millis(300))
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
        false
    }
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

async fn scenario(name: &str, down: Duration) {
    init_logs();
    let Some(server) = common::PrivateRedis::start_or_skip(name, &[]) else { return };
    let how =
        Restart { heartbeat: Duration::from_millis(200), down, deadline: Duration::from_secs(30) };
    workers_go_on_across_a_restart(name, &mut Server(server), how).await;
}

/// A quick restart: the workers keep heartbeating through it, notice that the store lost their
/// leases (a refused checkpoint, a listing without them, their records gone) and put them back
/// from what they remember (docs/algorithm.md, "When the store loses writes").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_recover_when_redis_restarts_empty() {
    scenario("workers_recover_when_redis_restarts_empty", Duration::from_millis(100)).await;
}

/// A restart after an outage longer than the failover timeout: the workers fence themselves
/// first (no heartbeat), then come back as fresh workers to an empty namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_recover_after_a_long_outage_and_an_empty_restart() {
    scenario("workers_recover_after_a_long_outage", Duration::from_millis(2_000)).await;
}
