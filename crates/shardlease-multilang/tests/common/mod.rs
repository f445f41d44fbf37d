//! What the end-to-end tests running the daemon's own binary share: a kinesalite client (streams
//! made and awaited, records put), the real client libraries (amazon-kclpy from
//! `scripts/kclpy.sh`, aws-kcl from `scripts/aws-kcl.sh`), the binary started as a process with
//! its log in a file (signalled with the `kill` command, killed when the test ends), the event
//! log the test applications write (`KIND SHARD ...` lines), and waits for conditions with a
//! deadline (never a sleep standing in for one).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use shardlease::kinesis::aws_sdk_kinesis;
use shardlease::store::LeaseStore;
use shardlease::SequenceNumber;
use tokio_util::sync::CancellationToken;

/// The longest any one awaited condition may take (CI is a busy 2-core machine).
pub const DEADLINE: Duration = Duration::from_secs(90);

/// Polls `check` until it holds; fails the test after [`DEADLINE`], saying `what` and `detail`.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool, detail: impl Fn() -> String) {
    let start = tokio::time::Instant::now();
    while !check() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}: {}", detail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a `scripts/` helper that prints a path on success, else says why on stderr.
pub fn script_path(name: &str) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts").join(name);
    let out = Command::new(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether python3 runs.
pub fn python_available() -> bool {
    Command::new("python3").arg("-c").arg("pass").status().is_ok_and(|s| s.success())
}

/// The `PYTHONPATH` that imports amazon-kclpy, or why the test is skipped (printed).
pub fn kclpy_or_skip() -> Option<String> {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return None;
    }
    match script_path("kclpy.sh") {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("SKIPPED: amazon-kclpy is unavailable (scripts/kclpy.sh): {why}");
            None
        }
    }
}

/// The test application written against kclpy.
pub fn kclpy_app() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kclpy_app/app.py")
}

/// kinesalite, through the AWS SDK.
#[derive(Clone)]
pub struct Kinesis {
    /// Its endpoint.
    pub endpoint: String,
    /// The client.
    pub client: aws_sdk_kinesis::Client,
}

impl Kinesis {
    /// The emulator `scripts/services.sh` started, or `None` (skip, printed) when it is not set
    /// or the crate is built without SQLite.
    pub fn or_skip() -> Option<Kinesis> {
        if !cfg!(feature = "sqlite") {
            // The daemons are processes: their leases must be in a store they can share.
            eprintln!("SKIPPED: built without the sqlite feature (the binary's store is a file)");
            return None;
        }
        let endpoint = shardlease_testkit::suite::env_or_skip("SHARDLEASE_TEST_KINESIS_ENDPOINT")?;
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .credentials_provider(aws_sdk_kinesis::config::Credentials::new(
                "dummy", "dummy", None, None, "test",
            ))
            .build();
        Some(Kinesis { endpoint, client: aws_sdk_kinesis::Client::from_conf(conf) })
    }

    /// Creates `stream` with `shards` shards and waits until it is active.
    pub async fn create_stream(&self, stream: &str, shards: i32) {
        self.client.create_stream().stream_name(stream).shard_count(shards).send().await.unwrap();
        self.wait_active(stream).await;
    }

    /// Waits until `stream` is active (after a create or a reshard).
    pub async fn wait_active(&self, stream: &str) {
        let start = tokio::time::Instant::now();
        loop {
            let s = self.client.describe_stream_summary().stream_name(stream).send().await.unwrap();
            if s.stream_description_summary
                .is_some_and(|d| d.stream_status == aws_sdk_kinesis::types::StreamStatus::Active)
            {
                return;
            }
            assert!(start.elapsed() < DEADLINE, "stream {stream} never active");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Puts records `r{from}` .. `r{to}` (partition keys `key-{i}`), one call each, in order.
    pub async fn put(&self, stream: &str, from: usize, to: usize) {
        for i in from..to {
            self.put_one(stream, i).await;
        }
    }

    /// Puts record `r{i}` with partition key `key-{i}`.
    pub async fn put_one(&self, stream: &str, i: usize) {
        self.client
            .put_record()
            .stream_name(stream)
            .partition_key(format!("key-{i}"))
            .data(aws_sdk_kinesis::primitives::Blob::new(format!("r{i}")))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put: {e:?}"));
    }

    /// Puts records `r{from}`, `r{from + 1}`, ... in the background, pausing `pause` after each,
    /// so that they keep coming while the test does something else, until `stop` is cancelled;
    /// the task returns the number after the last record put.
    pub fn produce(
        &self,
        stream: &str,
        from: usize,
        pause: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<usize> {
        let (kinesis, stream) = (self.clone(), stream.to_owned());
        tokio::spawn(async move {
            let mut i = from;
            while !stop.is_cancelled() {
                kinesis.put_one(&stream, i).await;
                i += 1;
                tokio::time::sleep(pause).await;
            }
            i
        })
    }

    /// Deletes `stream` (best effort: the emulator is shared, its streams are named per run).
    pub async fn delete_stream(&self, stream: &str) {
        let _ = self.client.delete_stream().stream_name(stream).send().await;
    }
}

/// A stream name unique to this test process and `tag`.
pub fn stream_name(tag: &str) -> String {
    format!("ml-{tag}-{}", std::process::id())
}

/// The SQLite store URL of a file in `dir` (`memory://` cannot be shared between processes, so
/// the tests running the binary need the `sqlite` feature, the default: [`Kinesis::or_skip`]
/// skips them without it).
pub fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("leases.db").display())
}

/// A properties file for the binary: the application's command, the stream on kinesalite, the
/// store, and `extra` lines; written to `dir/NAME`.
pub fn write_properties(
    dir: &Path,
    name: &str,
    command: &str,
    stream: &str,
    endpoint: &str,
    store: &str,
    extra: &str,
) -> PathBuf {
    let text = format!(
        "executableName = {command}\n\
         streamName = {stream}\n\
         applicationName = app-{stream}\n\
         regionName = us-east-1\n\
         kinesisEndpoint = {endpoint}\n\
         retrievalMode = POLLING\n\
         initialPositionInStream = TRIM_HORIZON\n\
         idleTimeBetweenReadsInMillis = 50\n\
         processingLanguage = test\n\
         shardlease.store = {store}\n\
         {extra}"
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// What an end-to-end test of the binary starts from: a fresh stream of `shards` shards on
/// kinesalite, and a temporary directory holding the SQLite store and a properties file that runs
/// `command` on that stream (with `extra` lines).
pub struct World {
    /// The emulator.
    pub kinesis: Kinesis,
    /// The test's directory (the store, the properties, the logs).
    pub dir: tempfile::TempDir,
    /// The stream.
    pub stream: String,
    /// The store's URL.
    pub store: String,
    /// The properties file.
    pub properties: PathBuf,
}

impl World {
    /// Creates the stream and writes the properties file.
    pub async fn new(
        kinesis: Kinesis,
        tag: &str,
        shards: i32,
        command: &str,
        extra: &str,
    ) -> World {
        let dir = tempfile::tempdir().unwrap();
        let stream = stream_name(tag);
        kinesis.create_stream(&stream, shards).await;
        let store = sqlite_url(dir.path());
        let properties = write_properties(
            dir.path(),
            "app.properties",
            command,
            &stream,
            &kinesis.endpoint,
            &store,
            extra,
        );
        World { kinesis, dir, stream, store, properties }
    }
}

/// The lease namespace [`write_properties`] gives `stream`.
pub fn namespace(stream: &str) -> String {
    format!("app-{stream}")
}

/// The daemon's binary, running.
pub struct Daemon {
    child: Child,
    /// Its stderr (the log), for failure messages.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the binary with `properties` and `env` (besides the test's own environment and the
    /// emulator's dummy credentials), its stderr into `log`.
    pub fn start(properties: &Path, env: &[(&str, &str)], log: &Path) -> Daemon {
        let file = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardlease-multilang"));
        cmd.arg("--properties")
            .arg(properties)
            .env("AWS_ACCESS_KEY_ID", "dummy")
            .env("AWS_SECRET_ACCESS_KEY", "dummy")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Daemon { child: cmd.spawn().unwrap(), log: log.to_owned() }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `KILL`, ...) with the `kill` command.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits up to `bound` for it to exit; fails the test (with its log) otherwise.
    pub async fn wait_exit(&mut self, bound: Duration) -> ExitStatus {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < bound,
                "the daemon did not exit within {bound:?}; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A test that failed half-way leaves no daemon behind (its children see EOF and exit).
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One line of an application's event log, split on spaces.
pub type Event = Vec<String>;

/// The events in `out`, in order.
pub fn events(out: &Path) -> Vec<Event> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

/// Record payload -> how many times it was processed, over every log in `outs`.
pub fn processed(outs: &[&Path]) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for out in outs {
        for e in events(out) {
            if e[0] == "record" {
                *seen.entry(e[4].clone()).or_insert(0) += 1;
            }
        }
    }
    seen
}

/// The events of `kind` in `out`, as their shard and the rest of the line.
pub fn of_kind(out: &Path, kind: &str) -> Vec<(String, Vec<String>)> {
    events(out)
        .into_iter()
        .filter(|e| e[0] == kind)
        .map(|e| (e[1].clone(), e[2..].to_vec()))
        .collect()
}

/// Shard -> the last sequence number a child of `out` saw confirmed as checkpointed.
pub fn last_checkpoints(out: &Path) -> BTreeMap<String, String> {
    let mut last = BTreeMap::new();
    for (shard, rest) in of_kind(out, "checkpointed") {
        last.insert(shard, rest[0].clone());
    }
    last
}

/// A sequence number of the logs.
pub fn seq(s: &str) -> SequenceNumber {
    SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{s:?} is not a sequence number: {e}"))
}

/// Waits until every pid the children of `out` logged has exited.
pub async fn children_gone(out: &Path) {
    let pids: Vec<String> =
        of_kind(out, "pid").into_iter().map(|(_, rest)| rest[0].clone()).collect();
    eventually(
        "every child to exit",
        || pids.iter().all(|pid| !alive(pid)),
        || format!("pids {pids:?}"),
    )
    .await;
}

/// Whether process `pid` runs (a zombie, exited but not yet reaped, does not).
pub fn alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "PID (COMM) STATE ...": the state follows the last parenthesis.
        Ok(stat) => {
            stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        }
        Err(_) => false,
    }
}

/// Opens the store the binary used.
pub async fn open_store(url: &str, namespace: &str) -> Arc<dyn LeaseStore> {
    shardlease::connect_namespace(url, namespace).await.unwrap()
}
