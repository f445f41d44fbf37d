//! PostgreSQL (`sslmode=verify-full&sslrootcert=`) and MySQL/MariaDB
//! (`ssl-mode=VERIFY_IDENTITY&ssl-ca=`) against the TLS-only servers of
//! `scripts/tls-services.sh` (ports 5433 and 3307, a user with a password, a certificate for
//! `localhost` only): the testkit's three TLS cases each (a trusted CA connects and round-trips a
//! lease, an unknown CA and a wrong host name are refused, the password shows nowhere). The TLS
//! parameters go to sqlx unchanged. Skipped without the `SHARDLEASE_TEST_TLS_*` variables; only
//! with the `tls` feature.

#![cfg(feature = "tls")]

use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::Result;
use shardlease_sql::SqlStore;
use shardlease_testkit::extensions::{TlsEnv, TlsUrls};

/// A SQL server's TLS URLs: `scheme://shardlease:PASSWORD@host:port/test?{tls}`.
struct SqlTls {
    env: TlsEnv,
    scheme: &'static str,
    /// The query parameters that ask for full verification against `{ca}`.
    tls: &'static str,
}

#[async_trait]
impl TlsUrls for SqlTls {
    fn env(&self) -> &TlsEnv {
        &self.env
    }
    fn url(&self, host: &str, ca_file: &str, namespace: &str) -> String {
        let e = &self.env;
        let tls = self.tls.replace("{ca}", ca_file);
        format!(
            "{}://shardlease:{}@{host}:{}/test?{tls}&namespace={namespace}&max_connections=2",
            self.scheme, e.password, e.port
        )
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(SqlStore::builder().url(url).connect().await?))
    }
}

mod postgres {
    use super::*;

    shardlease_testkit::store_tls_tests!(async {
        TlsEnv::from_env("SHARDLEASE_TEST_TLS_POSTGRES_ADDR").map(|env| SqlTls {
            env,
            scheme: "postgres",
            tls: "sslmode=verify-full&sslrootcert={ca}",
        })
    });
}

mod mysql {
    use super::*;

    shardlease_testkit::store_tls_tests!(async {
        TlsEnv::from_env("SHARDLEASE_TEST_TLS_MYSQL_ADDR").map(|env| SqlTls {
            env,
            scheme: "mysql",
            tls: "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}",
        })
    });
}
