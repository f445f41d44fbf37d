//! The `shardlease` binary run against a real SQLite file, next to real workers running in this
//! test process on the same file: its JSON parsed and checked, its exit codes, its refusals, and
//! its writes noticed by a running worker. The same checks then run against every server store
//! scripts/services.sh starts (PostgreSQL, MySQL/MariaDB, Redis, etcd, DynamoDB's emulator), each
//! in a fresh namespace; a server whose `SHARDLEASE_TEST_*` variable is unset is skipped (a
//! failure under `CI=true`). The test build has every store compiled in (the facade's features
//! are dev-dependency features of this crate). Conditions are awaited by polling with generous
//! deadlines, never by a fixed sleep (the machine running this is small and busy).

use shardlease::store::VersionedLease;
use shardlease::Epoch;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use shardlease::store::{Lease, LeaseStore, WorkerRecord};
use shardlease::{
    processor_fn, Config, LeaseKey, MemorySource, Position, Worker, WorkerHandle, WorkerId,
};

const DEADLINE: Duration = Duration::from_secs(90);

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the binary with `args` against `url`.
fn cli(url: &str, args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlease"))
        .arg("--store")
        .arg(url)
        .args(args)
        .env_remove("SHARDLEASE_STORE")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the shardlease binary: {e}"));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the binary off the async runtime (it blocks for its observation window).
async fn cli_async(url: &str, args: &[&str]) -> Out {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&url, &refs)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn json(out: &Out) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", out.stdout, out.stderr))
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("leases.db").display())
}

async fn store(url: &str) -> Arc<dyn LeaseStore> {
    shardlease::connect(url).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn lease(store: &dyn LeaseStore, key: &str) -> Lease {
    match store.get_lease(&LeaseKey::from(key)).await {
        Ok(Some(VersionedLease { lease: l, .. })) => l,
        other => panic!("lease {key}: {other:?}"),
    }
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One worker on `store`, reading a two-shard in-memory stream that a producer keeps writing to
/// (so the worker checkpoints all the time), with a short heartbeat.
fn start_worker(
    store: Arc<dyn LeaseStore>,
    namespace: &str,
) -> (WorkerHandle, tokio::task::JoinHandle<()>) {
    let source = Arc::new(MemorySource::new(2));
    let producer = {
        let source = source.clone();
        tokio::spawn(async move {
            for i in 0u64.. {
                source.put(&format!("k{i}"), format!("record {i}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let config = Config::new(namespace)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(200))
        // A loaded CI machine can stall the worker's heartbeat for a second: with the derived
        // failover timeout it would fence itself and re-take its leases at a new epoch in the
        // middle of a check that expects the CLI's write to be the only one.
        .with_failover_timeout(Duration::from_secs(20))
        .with_initial_position(Position::TrimHorizon);
    let processor = processor_fn(|_ctx, _batch| async move { Ok(()) });
    let worker =
        Worker::builder(config, store, source, processor).build().unwrap_or_else(|e| panic!("{e}"));
    (worker.start(), producer)
}

/// `leases` and `workers` as JSON and as a table, `delete-worker` and `release` of a dead
/// owner's lease, on the store `url` names (its namespace must be empty).
async fn check_leases_and_workers(url: &str) {
    let s = store(url).await;
    let mut parent = Lease::new("parent", Position::Latest);
    parent.owner = Some(WorkerId::from("ghost"));
    parent.epoch = Epoch(7);
    for l in [
        parent,
        Lease::new("child", Position::TrimHorizon).with_parents([LeaseKey::from("parent")]),
        Lease::new("done", Position::ShardEnd),
        Lease::new("free", Position::AtTimestamp { millis: 1_700_000_000_000 }),
    ] {
        s.create_lease(&l).await.unwrap_or_else(|e| panic!("{e}"));
    }
    // A worker record that never beats again: dead.
    s.heartbeat(&WorkerRecord::new(WorkerId::from("ghost"), WorkerRecord::first_beat()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let out = cli_async(url, &["--json", "--observe-ms", "300", "leases"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = json(&out);
    let rows = rows.as_array().unwrap_or_else(|| panic!("an array: {rows}"));
    let state = |key: &str| {
        rows.iter()
            .find(|r| r["key"] == key)
            .map(|r| r["state"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("{key} listed"))
    };
    assert_eq!(rows.len(), 4);
    assert_eq!(state("parent"), "owner_dead");
    assert_eq!(state("child"), "blocked");
    assert_eq!(state("done"), "finished");
    assert_eq!(state("free"), "unowned");
    let parent = rows.iter().find(|r| r["key"] == "parent").unwrap_or_else(|| panic!("parent"));
    assert_eq!(parent["owner"], "ghost");
    assert_eq!(parent["epoch"], 7);
    let child = rows.iter().find(|r| r["key"] == "child").unwrap_or_else(|| panic!("child"));
    assert_eq!(child["parents"], serde_json::json!(["parent"]));
    let free = rows.iter().find(|r| r["key"] == "free").unwrap_or_else(|| panic!("free"));
    assert_eq!(free["checkpoint"], "AT_TIMESTAMP(1700000000000)");

    let out = cli_async(url, &["--json", "--observe-ms", "300", "workers"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let workers = json(&out);
    assert_eq!(workers[0]["id"], "ghost");
    assert_eq!(workers[0]["alive"], false);
    assert_eq!(workers[0]["leases_held"], 1);

    // The table form names the state in words.
    let out = cli_async(url, &["--observe-ms", "300", "leases"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("blocked on parent"), "{}", out.stdout);

    // A dead worker's record is deleted; a missing one is "not found".
    let out = cli_async(url, &["--observe-ms", "300", "delete-worker", "ghost"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("still name it as owner"), "{}", out.stdout);
    let listed = s.list_workers().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.items.is_empty(), "{listed:?}");
    let out = cli_async(url, &["--observe-ms", "100", "delete-worker", "ghost"]).await;
    assert_eq!(out.code, 6, "{}", out.stderr);

    // Releasing the dead owner's lease needs no --force; an unowned lease needs nothing. The
    // epoch moves by the runtime's rule (at least the wall clock in milliseconds), not by one: a
    // store rolled back to an older epoch must not get a number an earlier owner already had.
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let out = cli_async(url, &["--observe-ms", "300", "release", "parent"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let released = lease(&*s, "parent").await;
    assert_eq!(released.owner, None);
    assert!(released.epoch.get() >= before_ms, "{:?} below the clock {before_ms}", released.epoch);
    let out = cli_async(url, &["--json", "--observe-ms", "100", "release", "free"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out)["action"], "nothing");
    let out = cli_async(url, &["--observe-ms", "100", "release", "nope"]).await;
    assert_eq!(out.code, 6, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_workers_as_json() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?namespace=inspect", sqlite_url(dir.path()));
    check_leases_and_workers(&url).await;

    // --namespace is the URL's namespace: the same is fine, another is a usage error.
    let out = cli_async(&url, &["--namespace", "inspect", "--observe-ms", "100", "leases"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli_async(&url, &["--namespace", "other", "leases"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("conflicts"), "{}", out.stderr);
    let plain = sqlite_url(dir.path());
    let out =
        cli_async(&plain, &["--namespace", "inspect", "--json", "--observe-ms", "100", "leases"])
            .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out).as_array().map(Vec::len), Some(4));
}

/// `leases --watch N` keeps listing until it is stopped, and a later table shows a change made
/// after the first one was drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_watch_redraws_what_changed() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?namespace=watched", sqlite_url(dir.path()));
    let s = store(&url).await;
    s.create_lease(&Lease::new("first", Position::TrimHorizon))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlease"))
        .args(["--store", &url, "--json", "--observe-ms", "100", "leases", "--watch", "1"])
        .env_remove("SHARDLEASE_STORE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run the shardlease binary: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    // Each redraw is one JSON array: read them as a stream of values, a key list each.
    let (tx, rx) = std::sync::mpsc::channel::<Vec<String>>();
    let reader = std::thread::spawn(move || {
        for value in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
            let Ok(Value::Array(rows)) = value else { return };
            let keys = rows.iter().filter_map(|r| r["key"].as_str().map(str::to_owned)).collect();
            if tx.send(keys).is_err() {
                return;
            }
        }
    });
    let next = |what: &str| {
        rx.recv_timeout(DEADLINE).unwrap_or_else(|e| panic!("no redraw ({what}): {e}"))
    };
    assert_eq!(next("first"), ["first"]);
    s.create_lease(&Lease::new("second", Position::TrimHorizon))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let mut draws = 1;
    loop {
        let keys = next("after the change");
        draws += 1;
        if keys == ["first", "second"] {
            break;
        }
        assert_eq!(keys, ["first"], "an earlier table, or the one after the change");
        assert!(start.elapsed() < DEADLINE, "the change never showed in {draws} tables");
    }
    assert!(child.try_wait().unwrap_or_else(|e| panic!("{e}")).is_none(), "--watch keeps running");
    child.kill().unwrap_or_else(|e| panic!("{e}"));
    child.wait().unwrap_or_else(|e| panic!("{e}"));
    reader.join().unwrap_or_else(|_| panic!("the reader thread panicked"));
}

/// `watch --once` on a SQLite file with a running worker: one frame as text, with the worker,
/// its leases and the health line. Without --once and without a terminal it refuses (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_once_prints_a_frame_and_watch_needs_a_terminal() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?namespace=framed", sqlite_url(dir.path()));
    let (worker, producer) = start_worker(store(&url).await, "framed");
    let id = worker.id().to_string();
    eventually("the worker holds both leases", || async { worker.held_leases().len() == 2 }).await;
    let out = cli_async(
        &url,
        &[
            "--namespace",
            "framed",
            "--observe-ms",
            "600",
            "watch",
            "--once",
            "--interval-ms",
            "100",
            "--width",
            "120",
        ],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let text = &out.stdout;
    assert!(text.starts_with("shardlease watch  namespace framed"), "{text}");
    assert!(text.contains("health: ok  2 leases (2 running)"), "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(&id)).collect();
    assert!(rows.iter().any(|l| l.contains("alive")), "{text}");
    assert_eq!(rows.iter().filter(|l| l.contains("running")).count(), 2, "{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 120), "{text}");

    let out = cli_async(&url, &["--namespace", "framed", "watch"]).await;
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("use --once"), "{}", out.stderr);
    worker.shutdown().await;
    producer.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_clear_errors_without_secrets() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());
    let out = cli_async(&url, &["reset-checkpoint", "k", "AT_TIMESTAMP(soon)"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("bad POSITION"), "{}", out.stderr);
    let out = cli_async(&url, &["--observe-ms", "100", "reset-checkpoint", "k", "LATEST"]).await;
    assert_eq!(out.code, 6, "{}", out.stderr);
    let out = cli_async("gopher://u:s3cr3t@host/x", &["leases"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(!out.stderr.contains("s3cr3t"), "{}", out.stderr);
    let out =
        cli_async("redis://:s3cr3t@127.0.0.1:1/?namespace=a", &["--namespace", "b", "leases"])
            .await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(!out.stderr.contains("s3cr3t"), "{}", out.stderr);
    let out = tokio::task::spawn_blocking(|| {
        Command::new(env!("CARGO_BIN_EXE_shardlease"))
            .arg("leases")
            .env_remove("SHARDLEASE_STORE")
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SHARDLEASE_STORE"));
}

/// `status` exits 1 for a lease nobody takes for the failover window, and 0 once a running
/// worker holds every lease, on the store `url` names (namespace `namespace`, empty). Returns the
/// store, the running worker and its producer.
async fn check_status_exit_codes(
    url: &str,
    namespace: &str,
) -> (Arc<dyn LeaseStore>, WorkerHandle, tokio::task::JoinHandle<()>) {
    let s = store(url).await;

    // A lease nobody takes for the whole failover window: a problem.
    s.create_lease(&Lease::new("orphan", Position::Latest)).await.unwrap_or_else(|e| panic!("{e}"));
    let out = cli_async(url, &["--json", "status", "--failover-ms", "500"]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let summary = json(&out);
    assert_eq!(summary["healthy"], false);
    assert_eq!(summary["stuck"], serde_json::json!(["orphan"]));
    assert_eq!(summary["unowned"], 1);

    // A running worker takes it: healthy.
    let (worker, producer) = start_worker(s.clone(), namespace);
    let id = worker.id();
    let s2 = s.clone();
    eventually("the worker takes every lease", || {
        let s = s2.clone();
        let id = id.clone();
        async move {
            s.list_leases().await.is_ok_and(|l| {
                l.items.len() == 3 && l.items.iter().all(|v| v.lease.owner.as_ref() == Some(&id))
            })
        }
    })
    .await;
    let out = cli_async(url, &["--json", "status", "--failover-ms", "1500"]).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let summary = json(&out);
    assert_eq!(summary["healthy"], true);
    assert_eq!(summary["workers_alive"], 1);
    assert_eq!((summary["max_share"].clone(), summary["min_share"].clone()), (3.into(), 3.into()));
    (s, worker, producer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exit_codes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?namespace=status", sqlite_url(dir.path()));
    let (_s, worker, producer) = check_status_exit_codes(&url, "status").await;

    // A corrupt record: a problem whatever else holds.
    let pool = sqlx::sqlite::SqlitePool::connect(&sqlite_url(dir.path()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = sqlx::query(
        "UPDATE shardlease_leases SET checkpoint_kind = 'bogus' WHERE namespace = ? AND lease_key = ?",
    )
    .bind("status")
    .bind("orphan")
    .execute(&pool)
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .rows_affected();
    assert_eq!(changed, 1);
    let out = cli_async(&url, &["--json", "status", "--failover-ms", "300"]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let summary = json(&out);
    assert_eq!(summary["corrupt_leases"], 1);
    let out = cli_async(&url, &["--json", "--observe-ms", "300", "leases"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        json(&out).as_array().is_some_and(|rows| rows.iter().any(|r| r["state"] == "corrupt")),
        "{}",
        out.stdout
    );
    producer.abort();
    worker.shutdown().await;
}

/// Runs a forced write as an operator would: a conflict (exit 5: the worker wrote more than a
/// checkpoint between the CLI's read and its write, nothing written) is re-run, a few times. A
/// worker that has just re-taken a lease may still be settling it (a second take at a new epoch),
/// and on a loaded machine that can fall inside the CLI's observation window.
async fn forced(url: &str, args: &[&str]) -> Out {
    let mut conflicts = Vec::new();
    loop {
        let out = cli_async(url, args).await;
        if out.code != 5 || conflicts.len() == 4 {
            assert_eq!(
                out.code, 0,
                "{}\n{}\nearlier conflicts: {conflicts:?}",
                out.stdout, out.stderr
            );
            return out;
        }
        assert!(out.stderr.contains("nothing was written"), "{}", out.stderr);
        conflicts.push(out.stderr);
    }
}

/// `reset-checkpoint` and `release` refuse while the owner is alive, and with `--force` write by
/// compare-and-set; the running worker notices (its lease is fenced) and takes the lease again at
/// a new epoch. `delete-worker` refuses a live worker.
async fn check_forced_writes(url: &str, namespace: &str) {
    let s = store(url).await;
    let (worker, producer) = start_worker(s.clone(), namespace);
    let id = worker.id();
    let key = "shardId-000000000000";
    let owned_after = |epoch: u64| {
        let s = s.clone();
        let id = id.clone();
        move || {
            let s = s.clone();
            let id = id.clone();
            async move {
                matches!(s.get_lease(&LeaseKey::from(key)).await,
                    Ok(Some(VersionedLease { lease: l, .. })) if l.owner.as_ref() == Some(&id) && l.epoch.get() > epoch)
            }
        }
    };
    eventually("the worker takes the lease", owned_after(0)).await;
    let before = lease(&*s, key).await;

    // Refused while the owner is alive; nothing written.
    let out =
        cli_async(url, &["--observe-ms", "4000", "reset-checkpoint", key, "TRIM_HORIZON"]).await;
    assert_eq!(out.code, 4, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("alive"), "{}", out.stderr);
    assert_eq!(lease(&*s, key).await.epoch, before.epoch, "nothing written");

    // Forced: old and new printed, the lease released at the new checkpoint.
    let out = forced(
        url,
        &["--json", "--observe-ms", "1500", "reset-checkpoint", key, "TRIM_HORIZON", "--force"],
    )
    .await;
    let reset = json(&out);
    assert_eq!(reset["new_checkpoint"], "TRIM_HORIZON");
    assert!(reset["old_checkpoint"].is_string(), "{reset}");
    let reset_epoch = reset["epoch"].as_u64().unwrap_or_else(|| panic!("an epoch: {reset}"));
    assert!(reset_epoch > before.epoch.get());
    eventually("the worker re-takes the reset lease", owned_after(reset_epoch)).await;

    // Release: refused, then forced, then re-taken.
    let out = cli_async(url, &["--observe-ms", "4000", "release", key]).await;
    assert_eq!(out.code, 4, "{}\n{}", out.stdout, out.stderr);
    let out = forced(url, &["--json", "--observe-ms", "1500", "release", key, "--force"]).await;
    let released = json(&out);
    assert_eq!(released["action"], "released");
    let released_epoch = released["epoch"].as_u64().unwrap_or_else(|| panic!("{released}"));
    eventually("the worker re-takes the released lease", owned_after(released_epoch)).await;

    // The live worker's record is not deleted without --force.
    let out = cli_async(url, &["--observe-ms", "4000", "delete-worker", id.as_str()]).await;
    assert_eq!(out.code, 4, "{}\n{}", out.stdout, out.stderr);

    producer.abort();
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_writes_are_noticed_by_a_running_worker() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?namespace=writes", sqlite_url(dir.path()));
    check_forced_writes(&url, "writes").await;
}

/// `base` with `params` added to its query.
fn with_query(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// A fresh namespace on the server `base` names: its URL and the namespace.
fn fresh(base: &str, what: &str) -> (String, String) {
    let ns = shardlease_testkit::fresh_namespace(&format!("cli-{what}"));
    (with_query(base, &format!("namespace={ns}")), ns)
}

/// Deletes what a test left in its namespace on a shared server (best effort).
async fn clean_up(url: &str) {
    let s = store(url).await;
    if let Ok(listing) = s.list_leases().await {
        for VersionedLease { lease, version } in listing.items {
            let _ = s.delete_lease(&lease.key, version).await;
        }
    }
    if let Ok(workers) = s.list_workers().await {
        for w in workers.items {
            let _ = s.remove_worker(&w.id).await;
        }
    }
}

/// The store-independent checks as tests on one server store: `$base` is an expression giving
/// the server's URL as `Option<String>` (`None`: skipped).
macro_rules! server_store_tests {
    ($store:ident, $base:expr) => {
        mod $store {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leases_and_workers_as_json() {
                let Some(base) = $base else { return };
                let (url, _) = fresh(&base, "json");
                check_leases_and_workers(&url).await;
                clean_up(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn status_exit_codes() {
                let Some(base) = $base else { return };
                let (url, ns) = fresh(&base, "status");
                let (_s, worker, producer) = check_status_exit_codes(&url, &ns).await;
                producer.abort();
                worker.shutdown().await;
                clean_up(&url).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn forced_writes_are_noticed_by_a_running_worker() {
                let Some(base) = $base else { return };
                let (url, ns) = fresh(&base, "writes");
                check_forced_writes(&url, &ns).await;
                clean_up(&url).await;
            }
        }
    };
}

fn server(var: &str) -> Option<String> {
    shardlease_testkit::suite::env_or_skip(var)
}

server_store_tests!(postgres, server("SHARDLEASE_TEST_POSTGRES_URL"));
server_store_tests!(mysql, server("SHARDLEASE_TEST_MYSQL_URL"));
server_store_tests!(redis, server("SHARDLEASE_TEST_REDIS_URL"));
server_store_tests!(
    etcd,
    server("SHARDLEASE_TEST_ETCD_URL").map(|u| with_query(&u, "prefix=shardlease-test"))
);
// moto accepts any keys; these are the dummy ones the DynamoDB crate's tests use.
server_store_tests!(
    dynamodb,
    server("SHARDLEASE_TEST_DYNAMODB_ENDPOINT").map(|endpoint| format!(
        "dynamodb://test-key-id:test-secret@shardlease-cli-test?region=us-east-1\
         &endpoint={endpoint}&create_table=true"
    ))
);
