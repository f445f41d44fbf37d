//! The real amazon-kclpy (from PyPI, via `scripts/kclpy.sh`) running a small application of this
//! test's own (`kclpy_app/app.py`, written against kclpy's documented v3 processor API) under the
//! daemon run in this process (`shardlease_multilang::run`; tests/process.rs runs the binary), on
//! a kinesalite stream (`SHARDLEASE_TEST_KINESIS_ENDPOINT`, started by `scripts/services.sh`), its
//! leases in a SQLite file. Every record produced is processed, and after the daemon stops
//! gracefully and starts again it resumes from the checkpoints: nothing twice, nothing lost.
//!
//! Skipped, with the reason printed, when the emulator, python3 or kclpy is unavailable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{eventually, kclpy_app, kclpy_or_skip, processed, Kinesis, World};
use shardlease_multilang::Settings;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kclpy_app_processes_every_record_and_resumes_after_a_restart() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let Some(pythonpath) = kclpy_or_skip() else { return };
    let command = format!("python3 -u {}", kclpy_app().display());
    let extra = "shutdownGraceMillis = 20000\nshardlease.heartbeatMillis = 200\n";
    let World { kinesis, dir, stream, properties, .. } =
        World::new(kinesis, "kclpy", 2, &command, extra).await;
    let out = dir.path().join("processed.log");
    // The children inherit the daemon's environment: kclpy on the path, where to write, and
    // the emulator's dummy credentials for the daemon's own AWS SDK.
    std::env::set_var("PYTHONPATH", &pythonpath);
    std::env::set_var("KCLPY_TEST_OUT", &out);
    std::env::set_var("AWS_ACCESS_KEY_ID", "dummy");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "dummy");
    let settings = Settings::from_file(&properties).unwrap();

    kinesis.put(&stream, 0, 20).await;
    for (round, total) in [(1, 20), (2, 40)] {
        let stop = CancellationToken::new();
        let daemon = {
            let (settings, stop) = (settings.clone(), stop.clone());
            tokio::spawn(async move { shardlease_multilang::run(&settings, stop).await })
        };
        if round == 2 {
            kinesis.put(&stream, 20, 40).await;
        }
        let done = || processed(&[&out]).len() >= total;
        eventually("every record processed", done, String::new).await;
        stop.cancel();
        let report = daemon.await.unwrap().unwrap();
        assert!(report.shutdown.abandoned.is_empty(), "{:?}", report.shutdown);
        assert_eq!(report.children.faults(), 0);
    }
    let seen = processed(&[&out]);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang kclpy (sqlite): produced 40 processed {} twice {twice} lost {}",
        seen.len(),
        40 - seen.len(),
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
    kinesis.delete_stream(&stream).await;
}
