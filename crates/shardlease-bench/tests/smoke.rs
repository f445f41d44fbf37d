//! Smoke tests of the `shardlease-bench` binary on `memory://` with tiny sizes: the JSON lines
//! carry every documented key with sensible values, failures print an `"error"` line and exit 1,
//! and bad flags exit 2. No timing thresholds: only counts and shapes are checked.

use std::process::{Command, Output};

use serde_json::Value;

const KEYS: [&str; 20] = [
    "scenario",
    "store",
    "policy",
    "shards",
    "workers",
    "passes_to_full_coverage",
    "seconds_to_full_coverage",
    "moves_after_first_pass",
    "seconds_to_balanced",
    "max_share",
    "min_share",
    "records_processed_twice",
    "store_reads_per_sec_per_worker",
    "store_writes_per_sec_per_worker",
    "records_per_sec",
    "heartbeat_ms",
    "balance_ms",
    "failover_ms",
    "self_fences",
    "namespace",
];

fn bench(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardlease-bench"))
        .args(args.split_whitespace())
        .env("RUST_LOG", "error")
        .output()
        .unwrap_or_else(|e| panic!("the benchmark binary does not run: {e}"))
}

/// Runs the binary, expects success, and returns its JSON lines. Unless the case sets its own,
/// the failover timeout is 20 s (50 heartbeats would do; the bench's default is 500 ms): none of
/// these cases waits for a failover, and a machine stalled for a second (CI on a busy 2-core box)
/// must not fence a worker and fail the exact `self_fences == 0` check.
fn lines(args: &str) -> Vec<Value> {
    let args = if args.contains("--failover-ms") {
        args.to_owned()
    } else {
        format!("{args} --failover-ms 20000")
    };
    let args = args.as_str();
    let out = bench(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`{args}` failed with {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &lines {
        for key in KEYS {
            assert!(line.get(key).is_some(), "key `{key}` missing from {line}");
        }
        assert!(line.get("error").is_none(), "{line}");
        assert_eq!(line["self_fences"], 0, "{line}");
    }
    lines
}

#[test]
fn startup_with_one_worker_takes_everything_in_one_pass() {
    let lines = lines("--scenario startup --store memory:// --shards 8 --workers 1");
    assert_eq!(lines.len(), 1);
    let r = &lines[0];
    assert_eq!(r["scenario"], "startup");
    assert_eq!(r["store"], "memory://");
    assert_eq!(r["policy"], "greedy");
    assert_eq!((r["shards"].as_u64(), r["workers"].as_u64()), (Some(8), Some(1)));
    assert_eq!(r["passes_to_full_coverage"], 1);
    assert_eq!(r["moves_after_first_pass"], 0);
    assert_eq!((r["max_share"].as_u64(), r["min_share"].as_u64()), (Some(8), Some(8)));
    assert!(r["seconds_to_full_coverage"].as_f64().is_some_and(|s| s >= 0.0));
    assert!(r["seconds_to_balanced"].as_f64() >= r["seconds_to_full_coverage"].as_f64());
    assert!(r["records_processed_twice"].is_null());
    assert!(r["records_per_sec"].is_null());
}

#[test]
fn startup_one_per_pass_takes_one_lease_per_pass() {
    let lines =
        lines("--scenario startup --store memory:// --shards 3 --workers 1 --policy one-per-pass");
    assert_eq!(lines[0]["policy"], "one-per-pass");
    assert_eq!(lines[0]["passes_to_full_coverage"], 3);
    assert_eq!(lines[0]["max_share"], 3);
}

#[test]
fn steady_counts_store_operations_per_worker() {
    let lines = lines(
        "--scenario steady --store memory:// --shards 16 --workers 2 --duration-s 0.3 --policy both",
    );
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0]["policy"].as_str(), lines[1]["policy"].as_str()),
        (Some("greedy"), Some("one-per-pass"))
    );
    for r in &lines {
        assert_eq!(r["scenario"], "steady");
        let ops = &r["ops_per_sec_per_worker"];
        for op in [
            "heartbeat",
            "list_workers",
            "list_leases",
            "get_lease",
            "update_lease",
            "create_lease",
        ] {
            assert!(ops[op].as_f64().is_some(), "{op} missing from {ops}");
        }
        assert!(ops["heartbeat"].as_f64().is_some_and(|n| n > 0.0), "{r}");
        assert!(r["store_writes_per_sec_per_worker"].as_f64().is_some_and(|n| n > 0.0), "{r}");
        assert!(r["store_reads_per_sec_per_worker"].as_f64().is_some_and(|n| n > 0.0), "{r}");
        // Nothing flows, so nothing but heartbeats (and at most a few balancing writes) is written.
        assert_eq!(r["ops_total"]["create_lease"], 0, "{r}");
        assert_eq!((r["max_share"].as_u64(), r["min_share"].as_u64()), (Some(8), Some(8)));
    }
}

#[test]
fn throughput_processes_every_record_once() {
    let lines =
        lines("--scenario throughput --store memory:// --shards 4 --workers 2 --records 2000");
    let r = &lines[0];
    assert_eq!(r["records"], 2000);
    assert_eq!(r["records_delivered"], 2000);
    assert_eq!(r["records_processed_twice"], 0);
    assert!(r["records_per_sec"].as_f64().is_some_and(|n| n > 0.0), "{r}");
}

#[test]
fn streams_spread_the_shards_over_a_multi_stream_source() {
    let out = lines("--scenario startup --store memory:// --shards 8 --workers 1 --streams 3");
    let r = &out[0];
    assert_eq!((r["streams"].as_u64(), r["shards"].as_u64()), (Some(3), Some(8)), "{r}");
    assert_eq!(r["passes_to_full_coverage"], 1, "{r}");
    assert_eq!((r["max_share"].as_u64(), r["active_leases"].as_u64()), (Some(8), Some(8)), "{r}");
    assert_eq!(
        lines("--scenario startup --store memory:// --shards 2 --workers 1")[0]["streams"],
        1
    );
    // Records written to every stream reach the fleet, none twice in a graceful leave.
    let out = lines(
        "--scenario leave --store memory:// --shards 6 --workers 2 --streams 3 --rate 500 --seed 1",
    );
    let r = &out[0];
    assert_eq!(r["records_processed_twice"], 0, "{r}");
    assert!(r["records_produced"].as_u64().is_some_and(|n| n > 0), "{r}");
    let out = lines(
        "--scenario throughput --store memory:// --shards 4 --workers 2 --records 1000 --streams 2",
    );
    assert_eq!(out[0]["records_delivered"], 1000, "{}", out[0]);
}

#[test]
fn skew_runs_both_modes_in_one_line() {
    let lines = lines(
        "--scenario skew --store memory:// --shards 8 --workers 2 --seed 3 --duration-s 0.5 \
         --rate 400",
    );
    let r = &lines[0];
    assert_eq!(r["scenario"], "skew");
    assert!(r["best_possible_ratio"].as_f64().is_some_and(|x| x >= 1.0), "{r}");
    for mode in ["by_count", "by_load"] {
        let m = &r[mode];
        assert_eq!(m["records_processed_twice"], 0, "{mode}: {m}");
        assert!(m["max_mean_load_ratio"].as_f64().is_some_and(|x| x >= 1.0), "{mode}: {m}");
        assert!(m["records_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{mode}: {m}");
        assert_eq!(m["worker_loads"].as_array().map(Vec::len), Some(2), "{mode}: {m}");
        assert!(m["moves_in_steady_state"].is_u64(), "{mode}: {m}");
    }
    assert_eq!(r["records_processed_twice"], 0);
}

#[test]
fn a_wait_that_times_out_prints_an_error_line_and_exits_1() {
    let out = bench(
        "--scenario startup --store memory:// --shards 4 --workers 1 --heartbeat-ms 1000 \
         --failover-ms 3000 --balance-ms 1000 --timeout-s 0.001",
    );
    assert_eq!(out.status.code(), Some(1));
    let line: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert!(line["error"].as_str().is_some_and(|e| e.contains("timed out")), "{line}");
    assert_eq!(line["scenario"], "startup");
}

#[test]
fn bad_flags_exit_2_with_a_clear_message() {
    for (args, expected) in [
        ("--scenario startup --store memory:// --shards 4", "required arguments were not provided:\n  --workers"),
        ("--scenario sideways --store memory:// --shards 4 --workers 1", "unknown scenario"),
        (
            "--scenario startup --store memory:// --shards 4 --workers 1 --heartbeat-ms 200 --failover-ms 500",
            "failover_timeout",
        ),
        ("--scenario startup --store gopher://x --shards 4 --workers 1", "unknown store scheme"),
        ("--scenario leave --store memory:// --shards 4 --workers 1", "at least 2"),
        ("--scenario startup --store memory:// --shards 2 --workers 1 --streams 3", "more than"),
    ] {
        let out = bench(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "`{args}`: {stderr}");
        assert!(stderr.contains(expected), "`{args}`: {stderr}");
        assert!(out.stdout.is_empty(), "`{args}` printed to stdout");
    }
}

#[test]
fn passwords_never_reach_the_output() {
    let out = bench(
        "--scenario startup --store redis://user:hunter2@127.0.0.1:1/0 --shards 1 --workers 1",
    );
    let all =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!all.contains("hunter2"), "{all}");
}

/// The default build opens every server store `shardlease::connect` knows (no feature flags):
/// one startup run on each test server that is configured.
#[test]
fn every_store_backend_is_built_in() {
    for var in [
        "SHARDLEASE_TEST_POSTGRES_URL",
        "SHARDLEASE_TEST_MYSQL_URL",
        "SHARDLEASE_TEST_REDIS_URL",
        "SHARDLEASE_TEST_ETCD_URL",
        "SHARDLEASE_TEST_DYNAMODB_URL",
    ] {
        let Some(url) = shardlease_testkit::suite::env_or_skip(var) else { continue };
        let out = Command::new(env!("CARGO_BIN_EXE_shardlease-bench"))
            .args(["--scenario", "startup", "--shards", "2", "--workers", "1", "--store", &url])
            .env("RUST_LOG", "error")
            .output()
            .unwrap_or_else(|e| panic!("the benchmark binary does not run: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{var}: {:?}\n{stderr}", out.status);
        let line: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert_eq!(line["passes_to_full_coverage"], 1, "{var}: {line}");
    }
}
