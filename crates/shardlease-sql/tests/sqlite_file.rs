//! The SQL store on SQLite files (no server needed): the whole conformance suite (each test on
//! a file of its own), corrupt rows, hostile identifiers, concurrent migrations, and several
//! pools and several processes sharing one file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::{SqlFactory, TempDb};
use shardlease_core::store::{Lease, LeaseStore, WorkerRecord};
use shardlease_core::{Error, LeaseKey, Position};
use shardlease_sql::SqlStore;

async fn factory() -> Option<SqlFactory> {
    Some(SqlFactory::sqlite_file().await)
}

dialect_tests!(factory());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identifiers() {
    let file = TempDb::new("hostile");
    let f = SqlFactory::connect(&file.url()).await;
    common::hostile_identifiers(f.base(), &file.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations() {
    let file = TempDb::new("migrations");
    common::concurrent_migrations(&file.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_version_1_tables() {
    let file = TempDb::new("migrate-v1");
    common::migrates_version_1_tables(&file.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_version_2_tables() {
    let file = TempDb::new("migrate-v2");
    common::migrates_version_2_tables(&file.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_version_3_tables() {
    let file = TempDb::new("migrate-v3");
    common::migrates_version_3_tables(&file.url()).await;
}

/// Read-modify-CAS increments of one lease from `tasks` tasks on `store`; returns conflicts.
async fn increment(store: Arc<dyn LeaseStore>, key: &str, tasks: usize, each: u64) -> u64 {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let store = store.clone();
            let key = LeaseKey::from(key);
            tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..each {
                    loop {
                        let VersionedLease { mut lease, version: v } =
                            store.get_lease(&key).await.unwrap().unwrap();
                        lease.epoch = lease.epoch.next();
                        match store.update_lease(&lease, v).await {
                            Ok(_) => break,
                            Err(Error::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for h in handles {
        conflicts += h.await.unwrap();
    }
    conflicts
}

/// Two pools on one file (as two processes would have) racing on one lease lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_share_one_file() {
    let file = TempDb::new("two-pools");
    let a = SqlStore::builder().url(file.url()).namespace("shared").connect().await.unwrap();
    let b = SqlStore::builder().url(file.url()).namespace("shared").connect().await.unwrap();
    a.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    let (ca, cb) = tokio::join!(
        increment(Arc::new(a.clone()), "k", 4, 25),
        increment(Arc::new(b.clone()), "k", 4, 25)
    );
    let VersionedLease { lease, .. } = b.get_lease(&"k".into()).await.unwrap().unwrap();
    assert_eq!(lease.epoch, Epoch(200), "{ca} + {cb} conflicts retried");
}

/// The variable that makes [`child_process`] run: the database URL, and how many increments.
const CHILD_VAR: &str = "SHARDLEASE_SQLITE_CHILD";

/// Three processes on one file, each incrementing one lease 40 times by CAS and heartbeating:
/// the result is exactly 120 and all three worker records are there.
#[test]
fn processes_share_one_file() {
    let file = TempDb::new("processes");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store =
            SqlStore::builder().url(file.url()).namespace("shared").connect().await.unwrap();
        store.create_lease(&Lease::new("k", Position::Latest)).await.unwrap();
    });
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", "child_process", "--ignored", "--test-threads", "1"])
                .env(CHILD_VAR, format!("{}|{i}", file.url()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a child process failed:\n{stdout}\n{stderr}");
        // A filter matching nothing also exits 0: the child's test must have run and passed.
        assert!(
            stdout.contains("test child_process ... ok") && stdout.contains("1 passed"),
            "the child process did not run `child_process`:\n{stdout}\n{stderr}"
        );
    }
    runtime.block_on(async {
        let store =
            SqlStore::builder().url(file.url()).namespace("shared").connect().await.unwrap();
        let VersionedLease { lease, .. } = store.get_lease(&"k".into()).await.unwrap().unwrap();
        assert_eq!(lease.epoch, Epoch(120));
        assert_eq!(store.list_workers().await.unwrap().items.len(), 3);
    });
}

/// One process of [`processes_share_one_file`], which runs it with `--ignored`. Run any other way
/// (`--ignored` or `--include-ignored` by hand), it fails: it has nothing to check on its own.
#[test]
#[ignore = "runs only as a child process of processes_share_one_file"]
fn child_process() {
    let spec = std::env::var(CHILD_VAR).unwrap_or_else(|_| {
        panic!("child_process runs only as a child of processes_share_one_file ({CHILD_VAR} unset)")
    });
    let (url, i) = spec.rsplit_once('|').unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = SqlStore::builder().url(url).namespace("shared").connect().await.unwrap();
        store.heartbeat(&WorkerRecord::new(format!("process-{i}").into(), 1)).await.unwrap();
        increment(Arc::new(store), "k", 2, 20).await;
    });
}
