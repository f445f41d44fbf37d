//! The SQL store on MySQL or MariaDB (`SHARDLEASE_TEST_MYSQL_URL`; skipped when unset): the whole
//! conformance suite, corrupt rows, hostile identifiers, concurrent migrations, redaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::SqlFactory;

async fn factory() -> Option<SqlFactory> {
    Some(SqlFactory::connect(&common::mysql_url()?).await)
}

dialect_tests!(factory());
server_tests!(common::mysql_url());

/// Needs no server: port 1 refuses the connection.
#[tokio::test]
async fn passwords_stay_secret() {
    common::passwords_stay_secret("mysql://root:s3cr3t-pw@127.0.0.1:1/test", "s3cr3t-pw").await;
    common::passwords_stay_secret("mariadb://root:an0ther-pw@127.0.0.1:1/test", "an0ther-pw").await;
}
