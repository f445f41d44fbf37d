//! `etcds://` against the TLS-only etcd of `scripts/tls-services.sh` (port 2391, started with
//! `--client-cert-auth`, password authentication on, a certificate for `localhost` only): the
//! testkit's three TLS cases (a trusted CA connects and round-trips a lease, an unknown CA and a
//! wrong host name are refused, the password shows nowhere), with the CA and the client
//! certificate named by the URL (`ca_file`, `cert_file`, `key_file`). Skipped without the
//! `SHARDLEASE_TEST_TLS_*` variables; only with the `tls` feature.

#![cfg(feature = "tls")]

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::Result;
use shardlease_etcd::EtcdStore;
use shardlease_testkit::extensions::{TlsEnv, TlsUrls};

struct EtcdTls(TlsEnv);

#[async_trait]
impl TlsUrls for EtcdTls {
    fn env(&self) -> &TlsEnv {
        &self.0
    }
    fn url(&self, host: &str, ca_file: &str, namespace: &str) -> String {
        let e = &self.0;
        format!(
            "etcds://root:{}@{host}:{}?namespace={namespace}&ca_file={ca_file}&cert_file={}\
             &key_file={}&connect_timeout_ms=3000&timeout_ms=5000",
            e.password, e.port, e.client_cert, e.client_key
        )
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(EtcdStore::builder().url(url).connect().await?))
    }
}

shardlease_testkit::store_tls_tests!(async {
    TlsEnv::from_env("SHARDLEASE_TEST_TLS_ETCD_ADDR").map(EtcdTls)
});
