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

// Needs no server: nothing listens on the port.
shardlease_testkit::redaction_tests!(async {
    Some(common::SqlUrls(&[
        "mysql://root:{secret}@127.0.0.1:{port}/test",
        "mariadb://root:{secret}@127.0.0.1:{port}/test",
    ]))
});
