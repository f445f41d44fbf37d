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

// Needs no server: nothing listens on the port.
shardlease_testkit::redaction_tests!(async {
    Some(common::SqlUrls(&[
        "postgres://app:{secret}@127.0.0.1:{port}/test",
        "postgresql://app@127.0.0.1:{port}/test?password={secret}",
    ]))
});
