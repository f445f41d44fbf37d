//! The CI fault runs: one short schedule with every fault class once, on PostgreSQL (a private
//! cluster, so the store restart and the partitions apply) with real consumer processes on the
//! shared Kinesis emulator; once with the default at-least-once checkpointer, once with the
//! effectively-once SQL sink (held to exactly once). Skipped, with a message, when the
//! emulator's variable is unset.

use std::path::PathBuf;

use shardlease_chaos::harness::{run, Env, Report, RunOptions};
use shardlease_chaos::stores::StoreKind;

fn env_var(name: &str) -> Option<String> {
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        Some(v) => Some(v),
        None => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{name} unset under CI");
            println!("chaos CI schedule: SKIPPED ({name} unset)");
            None
        }
    }
}

/// Every class once on PostgreSQL; `None` when the services are not there.
async fn every_class_once(seed: u64, exactly_once: bool) -> Option<Report> {
    let endpoint = env_var("SHARDLEASE_TEST_KINESIS_ENDPOINT")?;
    let sink_url = if exactly_once { Some(env_var("SHARDLEASE_TEST_POSTGRES_URL")?) } else { None };
    let env = Env {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_shardlease-chaos")),
        endpoint,
        history_dir: std::env::temp_dir().join("shardlease-chaos-history"),
        keep: false,
        sink_url,
    };
    let mut opts = RunOptions::new(StoreKind::Postgres, seed);
    opts.extra_faults = 0;
    opts.exactly_once = exactly_once;
    let classes = shardlease_chaos::schedule::classes(StoreKind::Postgres);
    let drawn: Vec<&str> = opts.schedule().steps.iter().map(|s| s.fault.class()).collect();
    for c in &classes {
        assert!(drawn.contains(c), "the CI schedule misses {c}");
    }
    let report = run(&opts, &env).await;
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    assert!(report.error.is_none(), "{report:?}");
    assert!(report.records > 0, "{report:?}");
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.regressions, 0, "{report:?}");
    assert_eq!(report.foreign_checkpoints, 0, "{report:?}");
    assert!(report.ok, "{report:?}");
    Some(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_once_loses_nothing_and_fences_every_checkpoint() {
    if let Some(report) = every_class_once(1, false).await {
        assert!(report.checkpoints > 0, "{report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_once_through_the_sql_sink_writes_every_record_exactly_once() {
    if let Some(report) = every_class_once(2, true).await {
        assert!(report.exactly_once, "{report:?}");
        assert_eq!(report.duplicates, 0, "{report:?}");
    }
}
