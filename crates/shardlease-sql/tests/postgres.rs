//! The SQL store on PostgreSQL (`SHARDLEASE_TEST_POSTGRES_URL`; skipped when unset): the whole
//! conformance suite, corrupt rows, hostile identifiers, concurrent migrations, redaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::SqlFactory;

async fn factory() -> Option<SqlFactory> {
    Some(SqlFactory::connect(&common::postgres_url()?).await)
}

shardlease_testkit::store_conformance_tests!(@async factory());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_rows_are_reported() {
    let Some(f) = factory().await else { return };
    common::corrupt_rows_are_reported(f.base()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers() {
    let Some(url) = common::postgres_url() else { return };
    let f = SqlFactory::connect(&url).await;
    common::hostile_identifiers(f.base(), &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations() {
    let Some(url) = common::postgres_url() else { return };
    common::concurrent_migrations(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incarnations_come_from_the_counter() {
    let Some(f) = factory().await else { return };
    common::incarnations_come_from_the_counter(f.base()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_roll_over_to_a_new_incarnation() {
    let Some(f) = factory().await else { return };
    common::versions_roll_over_to_a_new_incarnation(f.base()).await;
}

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
