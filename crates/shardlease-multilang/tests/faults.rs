//! The daemon driving real child processes (python3 running `children/scripted.py`) on an
//! in-memory stream and store: a clean run and a graceful stop, then each way a child can fail
//! (exit, non-JSON line, wrong `responseFor`, unknown action, no answer past the timeout, EOF
//! ignored), each costing its own lease only, and a shard's end.
//!
//! Every wait is for a condition (with a generous deadline), never a fixed sleep.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shardlease::store::LeaseStore;
use shardlease::{LeaseKey, MemorySource, Position};
use shardlease_multilang::{run_with, RunReport, Settings};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(60);

fn python_available() -> bool {
    std::process::Command::new("python3").arg("-c").arg("pass").status().is_ok_and(|s| s.success())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/scripted.py")
}

struct Run {
    dir: tempfile::TempDir,
    source: Arc<MemorySource>,
    store: Arc<dyn LeaseStore>,
    stop: CancellationToken,
    task: JoinHandle<shardlease_multilang::Result<RunReport>>,
}

/// The events the children logged, one per line.
fn events(dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join("events.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

/// Record payload -> how many times a child processed it.
fn processed(dir: &Path) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for e in events(dir) {
        if e[0] == "record" {
            *seen.entry(e[4].clone()).or_insert(0) += 1;
        }
    }
    seen
}

/// Shard -> children started for it.
fn starts(dir: &Path) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for e in events(dir) {
        if e[0] == "start" {
            *n.entry(e[1].clone()).or_insert(0) += 1;
        }
    }
    n
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !check() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start(fault: &str, shards: usize, records: usize) -> Run {
    let dir = tempfile::tempdir().unwrap();
    // The in-memory store is process-wide: each run its own namespace.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let namespace = format!("ml-{fault}-{n}");
    let text = format!(
        "executableName = python3 -u {script} {dir} {fault}\n\
         streamName = in-memory\n\
         applicationName = {namespace}\n\
         retrievalMode = POLLING\n\
         initialPositionInStream = TRIM_HORIZON\n\
         timeoutInSeconds = 2\n\
         shutdownGraceMillis = 20000\n\
         shardlease.heartbeatMillis = 100\n\
         shardlease.childRestartBackoffMillis = 50\n\
         shardlease.childExitTimeoutMillis = 500\n",
        script = script().display(),
        dir = dir.path().display(),
    );
    let settings = Settings::from_text(&text).unwrap();
    let source = Arc::new(MemorySource::new(shards));
    for i in 0..records {
        source.put(&format!("key-{i}"), format!("r{i}"));
    }
    let store = shardlease::connect_namespace("memory://", &namespace).await.unwrap();
    let stop = CancellationToken::new();
    let task = {
        let (store, source, stop) = (store.clone(), source.clone(), stop.clone());
        tokio::spawn(async move { run_with(&settings, store, source, stop).await })
    };
    Run { dir, source, store, stop, task }
}

impl Run {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    async fn all_processed(&self, records: usize) {
        eventually("every record processed", || processed(self.path()).len() == records).await;
    }

    async fn stop(self) -> (RunReport, tempfile::TempDir, Arc<dyn LeaseStore>, Arc<MemorySource>) {
        self.stop.cancel();
        let report = self.task.await.unwrap().unwrap();
        (report, self.dir, self.store, self.source)
    }
}

/// Each shard's stored checkpoint is its last record.
async fn assert_checkpointed_at_end(store: &Arc<dyn LeaseStore>, source: &MemorySource) {
    for shard in source.shards() {
        let lease = store.get_lease(&shard.id).await.unwrap().unwrap().lease;
        let last = source
            .records(&shard.id)
            .last()
            .map(|r| Position::Sequence { seq: r.seq.clone(), sub: r.sub });
        assert_eq!(Some(lease.checkpoint), last, "{}", shard.id);
        assert_eq!(lease.owner, None, "{} released", shard.id);
    }
}

#[tokio::test]
async fn clean_run_then_graceful_stop_checkpoints_and_releases() {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let run = start("none", 3, 30).await;
    run.all_processed(30).await;
    let (report, dir, store, source) = run.stop().await;
    let seen = processed(dir.path());
    println!(
        "multilang clean: produced 30 processed {} twice {} lost {}",
        seen.len(),
        seen.values().filter(|n| **n > 1).count(),
        30 - seen.len()
    );
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert_eq!(report.shutdown.released.len(), 3, "{:?}", report.shutdown);
    assert!(report.shutdown.abandoned.is_empty(), "{:?}", report.shutdown);
    let ev = events(dir.path());
    let count = |what: &str| ev.iter().filter(|e| e[0] == what).count();
    // Every child heard shutdownRequested, then leaseLost (as the KCL sends them), then EOF.
    assert_eq!(count("shutdownRequested"), 3);
    assert_eq!(count("leaseLost"), 3);
    assert_eq!(report.children.faults(), 0);
    assert_eq!(report.children.killed_after_eof(), 0);
    assert_checkpointed_at_end(&store, &source).await;
}

async fn one_fault(fault: &str) {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let run = start(fault, 3, 30).await;
    run.all_processed(30).await;
    assert!(!run.task.is_finished(), "the daemon goes on");
    let (report, dir, store, source) = run.stop().await;
    let ev = events(dir.path());
    let faulty: Vec<&String> = ev.iter().filter(|e| e[0] == "fault").map(|e| &e[1]).collect();
    assert_eq!(faulty.len(), 1, "{ev:?}");
    let seen = processed(dir.path());
    println!(
        "multilang {fault}: produced 30 processed {} twice {} lost {}",
        seen.len(),
        seen.values().filter(|n| **n > 1).count(),
        30 - seen.len()
    );
    assert_eq!(report.children.faults(), 1);
    assert_eq!(report.children.leases_given_up(), 1);
    // That shard got a new child; every other shard kept its first.
    let starts = starts(dir.path());
    for (shard, n) in &starts {
        let want = if shard == faulty[0] { 2 } else { 1 };
        assert_eq!(*n, want, "{shard}: {starts:?}");
    }
    assert_eq!(report.shutdown.released.len(), 3, "{:?}", report.shutdown);
    assert_checkpointed_at_end(&store, &source).await;
}

#[tokio::test]
async fn a_child_that_exits_costs_its_lease_only() {
    one_fault("crash").await;
}

#[tokio::test]
async fn a_non_json_line_costs_its_lease_only() {
    one_fault("notjson").await;
}

#[tokio::test]
async fn a_wrong_response_for_costs_its_lease_only() {
    one_fault("wrongresp").await;
}

#[tokio::test]
async fn an_unknown_action_costs_its_lease_only() {
    one_fault("unknown").await;
}

#[tokio::test]
async fn a_child_that_stops_answering_costs_its_lease_only() {
    one_fault("hang").await;
}

#[tokio::test]
async fn a_child_ignoring_eof_is_killed() {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let run = start("ignoreeof", 2, 10).await;
    run.all_processed(10).await;
    let (report, dir, _store, _source) = run.stop().await;
    assert_eq!(report.children.killed_after_eof(), 2);
    for e in events(dir.path()).iter().filter(|e| e[0] == "start") {
        let pid = &e[2];
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "child {pid} still runs");
    }
}

#[tokio::test]
async fn a_shard_end_is_checkpointed_by_the_child_and_its_children_start() {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let run = start("none", 1, 5).await;
    run.all_processed(5).await;
    let parent = LeaseKey::from("shardId-000000000000");
    let (a, b) = run.source.split(&parent).unwrap();
    for i in 5..15 {
        run.source.put(&format!("key-{i}"), format!("r{i}"));
    }
    run.all_processed(15).await;
    let (_report, dir, store, _source) = run.stop().await;
    let ev = events(dir.path());
    assert!(ev.iter().any(|e| e[0] == "shardEnded" && e[1] == parent.to_string()), "{ev:?}");
    let started: BTreeSet<String> = starts(dir.path()).into_keys().collect();
    assert!(started.contains(&a.to_string()) && started.contains(&b.to_string()), "{started:?}");
    let lease = store.get_lease(&parent).await.unwrap().unwrap().lease;
    assert_eq!(lease.checkpoint, Position::ShardEnd);
}
