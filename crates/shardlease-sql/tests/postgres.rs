//! The SQL store on PostgreSQL (`SHARDLEASE_TEST_POSTGRES_URL`; skipped when unset): the whole
//! conformance suite, corrupt rows, hostile identifiers, concurrent migrations, redaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::SqlFactory;

async fn factory() -> Option<SqlFactory> {
    Some(SqlFactory::connect(&common::postgres_url()?).await)
}

dialect_tests!(factory());
server_tests!(common::postgres_url());

/// Needs no server: port 1 refuses the connection.
#[tokio::test]
async fn passwords_stay_secret() {
    common::passwords_stay_secret("postgres://app:s3cr3t-pw@127.0.0.1:1/test", "s3cr3t-pw").await;
    common::passwords_stay_secret(
        "postgresql://app@127.0.0.1:1/test?password=an0ther-pw",
        "an0ther-pw",
    )
    .await;
}
