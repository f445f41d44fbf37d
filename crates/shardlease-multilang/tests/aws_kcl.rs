//! The real aws-kcl (the KCL's Node.js client, from npm via `scripts/aws-kcl.sh`) running a small
//! application of this test's own (`aws_kcl_app/app.js`, written against aws-kcl's documented
//! record processor API) under the daemon's binary, on a kinesalite stream, its leases in a
//! SQLite file: every record processed, every checkpoint confirmed, and after a SIGTERM and a
//! restart the children resume from the checkpoints: nothing twice, nothing lost.
//!
//! Skipped, with the reason printed, when the emulator, node or the package is unavailable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    children_gone, events, eventually, namespace, of_kind, open_store, processed, script_path, seq,
    Daemon, Kinesis, World,
};
use shardlease::Position;

const EXIT_BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_kcl_app_processes_every_record_and_resumes_after_a_restart() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let node_path = match script_path("aws-kcl.sh") {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED: aws-kcl (node) is unavailable (scripts/aws-kcl.sh): {why}");
            return;
        }
    };
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aws_kcl_app/app.js");
    let command = format!("node {}", app.display());
    let extra = "shutdownGraceMillis = 20000\nshardlease.heartbeatMillis = 200\n";
    let World { kinesis, dir, stream, store, properties } =
        World::new(kinesis, "awskcl", 2, &command, extra).await;
    let out = dir.path().join("processed.log");
    let env = [("NODE_PATH", node_path.as_str()), ("AWS_KCL_TEST_OUT", out.to_str().unwrap())];

    kinesis.put(&stream, 0, 20).await;
    for (round, total) in [(1, 20), (2, 40)] {
        let log = dir.path().join(format!("daemon-{round}.log"));
        let mut daemon = Daemon::start(&properties, &env, &log);
        if round == 2 {
            kinesis.put(&stream, 20, 40).await;
        }
        eventually(
            &format!("{total} records processed"),
            || processed(&[&out]).len() == total,
            || format!("{:?}\n{}", events(&out), daemon.log_text()),
        )
        .await;
        daemon.signal("TERM");
        let status = daemon.wait_exit(EXIT_BOUND).await;
        assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
        assert!(!daemon.log_text().contains("child failed"), "{}", daemon.log_text());
    }
    children_gone(&out).await;

    let ev = events(&out);
    let count = |kind: &str| ev.iter().filter(|e| e[0] == kind).count();
    assert_eq!(count("checkpointError"), 0, "{ev:?}");
    // Two children a run, each told shutdownRequested then leaseLost.
    assert_eq!(count("start"), 4, "{ev:?}");
    assert_eq!(count("shutdownRequested"), 4, "{ev:?}");
    assert_eq!(count("leaseLost"), 4, "{ev:?}");
    // The second run's children started at the checkpoints of the first.
    let starts = of_kind(&out, "start");
    for (shard, rest) in &starts[2..] {
        assert_ne!(rest[0], "TRIM_HORIZON", "{shard} resumed from a checkpoint: {ev:?}");
        seq(&rest[0]);
    }
    // Every batch's checkpoint, by the record's sequence number, was confirmed with it.
    let records = of_kind(&out, "record");
    for (shard, rest) in of_kind(&out, "checkpointed") {
        assert!(records.iter().any(|(s, r)| *s == shard && r[0] == rest[0]), "{shard} {rest:?}");
    }
    let seen = processed(&[&out]);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang aws-kcl (sqlite): produced 40 processed {} twice {twice} lost {}",
        seen.len(),
        40 - seen.len()
    );
    assert_eq!(twice, 0, "{seen:?}");
    assert_eq!(seen.len(), 40);

    // The store: both leases released, each at its shard's last record.
    let leases = open_store(&store, &namespace(&stream)).await;
    for v in leases.list_leases().await.unwrap().items {
        assert_eq!(v.lease.owner, None, "{:?}", v.lease);
        let last = records
            .iter()
            .filter(|(s, _)| s == v.lease.key.as_str())
            .map(|(_, r)| seq(&r[0]))
            .max()
            .unwrap();
        assert_eq!(v.lease.checkpoint, Position::Sequence { seq: last, sub: 0 });
    }
    kinesis.delete_stream(&stream).await;
}
