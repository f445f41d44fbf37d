//! `rediss://` against the TLS-only Redis of `scripts/tls-services.sh` (port 6390, a password,
//! a certificate for `localhost` only): the testkit's three TLS cases (a trusted CA connects and
//! round-trips a lease, an unknown CA and a wrong host name are refused, the password shows
//! nowhere). The CA comes from the URL's `ca_file`. Skipped without the
//! `SHARDLEASE_TEST_TLS_*` variables; only with the `tls` feature.

#![cfg(feature = "tls")]

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::Result;
use shardlease_redis::RedisStore;
use shardlease_testkit::extensions::{TlsEnv, TlsUrls};

struct RedisTls(TlsEnv);

#[async_trait]
impl TlsUrls for RedisTls {
    fn env(&self) -> &TlsEnv {
        &self.0
    }
    fn url(&self, host: &str, ca_file: &str, namespace: &str) -> String {
        let e = &self.0;
        format!(
            "rediss://:{}@{host}:{}/?ca_file={ca_file}&namespace={namespace}",
            e.password, e.port
        )
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        let b =
            RedisStore::builder().url(url).connection_timeout(std::time::Duration::from_secs(2));
        Ok(Arc::new(b.connect().await?))
    }
}

shardlease_testkit::store_tls_tests!(async {
    TlsEnv::from_env("SHARDLEASE_TEST_TLS_REDIS_ADDR").map(RedisTls)
});
