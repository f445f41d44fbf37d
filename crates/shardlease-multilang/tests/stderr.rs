//! A child's stderr is forwarded into the daemon's log line by line, with its shard. Alone in
//! its test binary: the log capture is per thread and tracing's callsite cache is per process,
//! so tests running beside it on other threads could hide its lines.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shardlease::MemorySource;
use shardlease_multilang::{run_with, Settings};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn child_stderr_is_logged_with_its_shard() {
    if !std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let (logs, _guard) = shardlease_testkit::logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/scripted.py");
    let text = format!(
        "executableName = python3 -u {} {} none\nstreamName = s\napplicationName = ml-stderr\n\
         retrievalMode = POLLING\ninitialPositionInStream = TRIM_HORIZON\nshardlease.heartbeatMillis = 100\n",
        script.display(),
        dir.path().display()
    );
    let settings = Settings::from_text(&text).unwrap();
    let source = Arc::new(MemorySource::new(1));
    let store = shardlease::connect_namespace("memory://", "ml-stderr").await.unwrap();
    let stop = CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move { run_with(&settings, store, source, stop).await })
    };
    let start = tokio::time::Instant::now();
    while !logs.text().contains("initialized shardId-") {
        assert!(start.elapsed() < Duration::from_secs(60), "no stderr line: {}", logs.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    task.await.unwrap().unwrap();
    let text = logs.text();
    let line = text.lines().find(|l| l.contains("initialized shardId-")).unwrap();
    assert!(line.contains("shard=shardId-000000000000"), "{line}");
    assert!(line.contains("shardlease_multilang::child"), "{line}");
}
