//! The real amazon-kclpy (from PyPI, via `scripts/kclpy.sh`) running a small application of this
//! test's own (`kclpy_app/app.py`, written against kclpy's documented v3 processor API) under the
//! daemon, on a kinesalite stream (`SHARDLEASE_TEST_KINESIS_ENDPOINT`, started by
//! `scripts/services.sh`), its leases in a SQLite file (in `memory://` when the crate is built
//! without its `sqlite` feature). Every record produced is processed, and after the daemon stops
//! gracefully and starts again it resumes from the checkpoints: nothing twice, nothing lost.
//!
//! Skipped, with the reason printed, when the emulator, python3 or kclpy is unavailable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shardlease::kinesis::aws_sdk_kinesis;
use shardlease_multilang::Settings;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(90);

fn kclpy_path() -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kclpy.sh");
    let out = std::process::Command::new(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn processed(out: &Path) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for line in std::fs::read_to_string(out).unwrap_or_default().lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        if parts[0] == "record" {
            *seen.entry(parts[4].to_owned()).or_insert(0) += 1;
        }
    }
    seen
}

async fn wait_processed(out: &Path, n: usize) {
    let start = tokio::time::Instant::now();
    while processed(out).len() < n {
        assert!(start.elapsed() < DEADLINE, "timed out: {} of {n} processed", processed(out).len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn put(client: &aws_sdk_kinesis::Client, stream: &str, from: usize, to: usize) {
    for i in from..to {
        client
            .put_record()
            .stream_name(stream)
            .partition_key(format!("key-{i}"))
            .data(aws_sdk_kinesis::primitives::Blob::new(format!("r{i}")))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kclpy_app_processes_every_record_and_resumes_after_a_restart() {
    let Some(endpoint) = shardlease_testkit::suite::env_or_skip("SHARDLEASE_TEST_KINESIS_ENDPOINT")
    else {
        return;
    };
    let pythonpath = match kclpy_path() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: amazon-kclpy is unavailable (scripts/kclpy.sh): {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("processed.log");
    // The children inherit the daemon's environment: kclpy on the path, where to write, and
    // the emulator's dummy credentials for the daemon's own AWS SDK.
    std::env::set_var("PYTHONPATH", &pythonpath);
    std::env::set_var("KCLPY_TEST_OUT", &out);
    std::env::set_var("AWS_ACCESS_KEY_ID", "dummy");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "dummy");

    let conf = aws_sdk_kinesis::Config::builder()
        .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
        .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .credentials_provider(aws_sdk_kinesis::config::Credentials::new(
            "dummy", "dummy", None, None, "test",
        ))
        .build();
    let client = aws_sdk_kinesis::Client::from_conf(conf);
    let stream = format!("kclpy-{}", std::process::id());
    client.create_stream().stream_name(&stream).shard_count(2).send().await.unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let s = client.describe_stream_summary().stream_name(&stream).send().await.unwrap();
        if s.stream_description_summary
            .is_some_and(|d| d.stream_status == aws_sdk_kinesis::types::StreamStatus::Active)
        {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "stream never active");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let store = if cfg!(feature = "sqlite") {
        format!("sqlite://{}", dir.path().join("leases.db").display())
    } else {
        "memory://".to_owned()
    };
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kclpy_app/app.py");
    let properties = format!(
        "executableName = python3 -u {app}\n\
         streamName = {stream}\n\
         applicationName = kclpy-e2e-{stream}\n\
         regionName = us-east-1\n\
         kinesisEndpoint = {endpoint}\n\
         retrievalMode = POLLING\n\
         initialPositionInStream = TRIM_HORIZON\n\
         idleTimeBetweenReadsInMillis = 50\n\
         shutdownGraceMillis = 20000\n\
         processingLanguage = python/3\n\
         shardlease.store = {store}\n\
         shardlease.heartbeatMillis = 200\n",
        app = app.display()
    );
    let path = dir.path().join("app.properties");
    std::fs::write(&path, properties).unwrap();
    let settings = Settings::from_file(&path).unwrap();

    put(&client, &stream, 0, 20).await;
    for (round, total) in [(1, 20), (2, 40)] {
        let stop = CancellationToken::new();
        let daemon = {
            let (settings, stop) = (settings.clone(), stop.clone());
            tokio::spawn(async move { shardlease_multilang::run(&settings, stop).await })
        };
        if round == 2 {
            put(&client, &stream, 20, 40).await;
        }
        wait_processed(&out, total).await;
        stop.cancel();
        let report = daemon.await.unwrap().unwrap();
        assert!(report.shutdown.abandoned.is_empty(), "{:?}", report.shutdown);
        assert_eq!(report.children.faults(), 0);
    }
    let seen = processed(&out);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang kclpy ({store_kind}): produced 40 processed {} twice {twice} lost {}",
        seen.len(),
        40 - seen.len(),
        store_kind = if cfg!(feature = "sqlite") { "sqlite" } else { "memory" }
    );
    assert_eq!(seen.len(), 40);
    assert_eq!(twice, 0, "a graceful stop checkpoints every record: {seen:?}");
    let log = std::fs::read_to_string(&out).unwrap();
    assert_eq!(log.lines().filter(|l| l.starts_with("shutdownRequested")).count(), 4, "{log}");
    // The second run's children started from the first run's checkpoints.
    let resumed = log.lines().filter(|l| l.starts_with("start")).skip(2);
    for l in resumed {
        assert!(!l.ends_with("TRIM_HORIZON"), "resumed from a checkpoint: {l}");
    }
    let _ = client.delete_stream().stream_name(&stream).send().await;
}
