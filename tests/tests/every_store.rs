//! The one consumer of `shardlease-e2e`, run unchanged on every store the facade can connect to:
//! a fleet of three, a join, a graceful leave and a crash, with a producer writing throughout.
//! Each test differs from the others only in its store URL (a fresh namespace every run), and
//! prints one result line (`cargo test -p shardlease-e2e -- --nocapture` shows them).
//!
//! Server URLs come from `SHARDLEASE_TEST_*` variables (scripts/services.sh sets them); a test
//! whose variable is unset prints that it is skipped, and fails under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use shardlease_e2e::{fleet_scenario, Timing};
use shardlease_testkit::fresh_namespace;
use shardlease_testkit::suite::env_or_skip;

/// The fleets run one at a time: each is timed, and seven at once would crowd a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `base` with `params` added to its query.
fn with_query(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// Runs the scenario on `url` and asserts what the engine guarantees.
fn run(store: &str, url: &str, timing: Timing) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let report = runtime
        .block_on(fleet_scenario(store, url, timing))
        .unwrap_or_else(|e| panic!("{store}: {e}"));
    println!("{}", report.line());
    assert!(report.produced > 0, "{store}: the producer wrote nothing");
    assert_eq!(report.processed, report.produced, "{store}: every record is processed");
    assert_eq!(report.twice_graceful, 0, "{store}: start, join and leave process nothing twice");
    assert!(
        report.twice_after_crash <= report.produced,
        "{store}: a crash replays at most what was written"
    );
}

fn namespace(store: &str) -> String {
    format!("namespace={}", fresh_namespace(&format!("e2e-{store}")))
}

#[test]
fn memory() {
    run("memory", &format!("memory://?{}", namespace("memory")), Timing::scaled(1));
}

#[test]
fn sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let url =
        format!("sqlite://{}?{}", dir.path().join("leases.db").display(), namespace("sqlite"));
    run("sqlite", &url, Timing::scaled(1));
}

#[test]
fn postgres() {
    let Some(base) = env_or_skip("SHARDLEASE_TEST_POSTGRES_URL") else { return };
    run("postgres", &with_query(&base, &namespace("postgres")), Timing::scaled(1));
}

#[test]
fn mysql() {
    let Some(base) = env_or_skip("SHARDLEASE_TEST_MYSQL_URL") else { return };
    run("mysql", &with_query(&base, &namespace("mysql")), Timing::scaled(1));
}

#[test]
fn redis() {
    let Some(base) = env_or_skip("SHARDLEASE_TEST_REDIS_URL") else { return };
    run("redis", &with_query(&base, &namespace("redis")), Timing::scaled(1));
}

/// The same fleet on a Redis Cluster (`redis+cluster://…`, scripts/services.sh starts one).
#[test]
fn redis_cluster() {
    let Some(base) = env_or_skip("SHARDLEASE_TEST_REDIS_CLUSTER_URL") else { return };
    let url =
        with_query(&base, &format!("key_prefix=shardlease-test&{}", namespace("redis-cluster")));
    run("redis-cluster", &url, Timing::scaled(1));
}

#[test]
fn etcd() {
    let Some(base) = env_or_skip("SHARDLEASE_TEST_ETCD_URL") else { return };
    let url = with_query(&base, &format!("prefix=shardlease-test&{}", namespace("etcd")));
    run("etcd", &url, Timing::scaled(1));
}

/// moto answers a few hundred writes a second: the same scenario, four times slower.
#[test]
fn dynamodb() {
    let Some(endpoint) = env_or_skip("SHARDLEASE_TEST_DYNAMODB_ENDPOINT") else { return };
    // moto accepts any keys; these are the dummy ones the DynamoDB crate's tests use.
    let url = format!(
        "dynamodb://test-key-id:test-secret@shardlease-e2e?region=us-east-1&endpoint={endpoint}\
         &create_table=true&{}",
        namespace("dynamodb")
    );
    run("dynamodb", &url, Timing::scaled(4));
}
