//! An HTTPS DynamoDB endpoint behind a private CA (`ca_file`): moto behind the TLS-terminating
//! proxy of `scripts/tls-services.sh` (`scripts/tls-proxy.py`, port 8443, a certificate for
//! `localhost` only), through the testkit's three TLS cases (a trusted CA connects and
//! round-trips a lease, an unknown CA and a wrong host name are refused, the secret key shows
//! nowhere). Skipped without the `SHARDLEASE_TEST_TLS_*` variables.

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::Result;
use shardlease_dynamodb::DynamoDbStore;
use shardlease_testkit::extensions::{TlsEnv, TlsUrls};

/// The access key id of the URLs (moto takes any). Only the secret key is checked: the AWS SDK
/// itself prints the key id (never the secret) in its TRACE lines about its credentials
/// provider; the store's own errors and `Debug` hide both (tests/redaction.rs).
const KEY_ID: &str = "AKIDTLSTEST0001";

struct DynamoTls(TlsEnv);

#[async_trait]
impl TlsUrls for DynamoTls {
    fn env(&self) -> &TlsEnv {
        &self.0
    }
    fn url(&self, host: &str, ca_file: &str, namespace: &str) -> String {
        let e = &self.0;
        format!(
            "dynamodb://{KEY_ID}:{}@shardlease-tls?region=us-east-1&endpoint=https://{host}:{}\
             &ca_file={ca_file}&create_table=true&namespace={namespace}&max_attempts=1\
             &attempt_timeout_ms=10000",
            e.password, e.port
        )
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(DynamoDbStore::builder().url(url).connect().await?))
    }
}

shardlease_testkit::store_tls_tests!(async {
    TlsEnv::from_env("SHARDLEASE_TEST_TLS_DYNAMODB_ADDR").map(DynamoTls)
});
