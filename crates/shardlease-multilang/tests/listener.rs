//! `shardlease.metricsAddress`: the daemon on an in-memory stream and store, its children
//! `children/scripted.py`, serving `GET /health` (`starting`, then `ok` while the worker runs,
//! and nothing once the daemon has returned) and `GET /metrics` (the Prometheus text of the
//! process's recorder: shardlease's metric names once leases are held, and the daemon's own);
//! and an address in use stopping the start with an error naming the key, before any child.
//!
//! The requests are plain HTTP/1.1 over std's `TcpStream` (no HTTP client). Every wait is for a
//! condition (with a deadline), never a fixed sleep. Alone in its test binary: the Prometheus
//! recorder is the process's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shardlease::MemorySource;
use shardlease_multilang::{run_with_options, MultiLangError, RunOptions, Settings};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(60);

/// An HTTP answer: the status code, the header lines, the body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<String>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// `GET path` from `addr` over plain HTTP/1.1, blocking (std's `TcpStream`; each step bounded).
fn get_blocking(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {head:?}")))?;
    let headers: Vec<String> = lines.map(str::to_owned).collect();
    let chunked = headers.iter().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body) } else { body.to_owned() };
    Ok(Answer { status, headers, body })
}

/// The payload of a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// `GET path` off the runtime's threads.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Answer> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || get_blocking(addr, &path)).await.unwrap()
}

/// GETs `path` until `check` holds of the answer; fails the test after [`DEADLINE`] with the last.
async fn get_until(
    addr: SocketAddr,
    path: &str,
    what: &str,
    check: impl Fn(&Answer) -> bool,
) -> Answer {
    let start = tokio::time::Instant::now();
    loop {
        let answer = get(addr, path).await;
        match answer {
            Ok(a) if check(&a) => return a,
            last => {
                assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}: last {last:?}")
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn python_available() -> bool {
    std::process::Command::new("python3").arg("-c").arg("pass").status().is_ok_and(|s| s.success())
}

fn properties(dir: &Path, namespace: &str, address: &str) -> Settings {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/children/scripted.py");
    let text = format!(
        "executableName = python3 -u {script} {dir} none\n\
         streamName = in-memory\n\
         applicationName = {namespace}\n\
         retrievalMode = POLLING\n\
         initialPositionInStream = TRIM_HORIZON\n\
         shardlease.heartbeatMillis = 100\n\
         shardlease.childExitTimeoutMillis = 500\n\
         shardlease.metricsAddress = {address}\n",
        script = script.display(),
        dir = dir.display(),
    );
    Settings::from_text(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_are_served_while_the_daemon_runs() {
    if !python_available() {
        eprintln!("SKIPPED: python3 is not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let settings = properties(dir.path(), "ml-listener", "127.0.0.1:0");
    assert_eq!(settings.metrics_address, Some("127.0.0.1:0".parse().unwrap()));
    let source = Arc::new(MemorySource::new(2));
    for i in 0..10 {
        source.put(&format!("key-{i}"), format!("r{i}"));
    }
    let store = shardlease::connect_namespace("memory://", "ml-listener").await.unwrap();
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let options = RunOptions { listening: Some(tx), ..RunOptions::default() };
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move { run_with_options(&settings, store, source, stop, options).await })
    };
    // Before the worker has started, `/health` would say so.
    assert_eq!(shardlease_multilang::listener::Health::new().status(), Err("starting"));
    let addr = tokio::time::timeout(DEADLINE, rx).await.unwrap().unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

    let health = get_until(addr, "/health", "/health to answer 200", |a| a.status == 200).await;
    assert_eq!(health.body, "ok");

    // Once the worker holds its leases and has started a child for each, both the worker's
    // metrics and the daemon's are in the text.
    let metrics = get_until(addr, "/metrics", "the metrics of held leases", |a| {
        a.status == 200
            && a.body
                .lines()
                .any(|l| l.starts_with("shardlease_leases_held{") && !l.ends_with(" 0"))
            && a.body.contains("shardlease_multilang_children_started_total")
    })
    .await;
    assert_eq!(metrics.header("content-type"), Some("text/plain; version=0.0.4"), "{metrics:?}");
    assert!(metrics.body.contains("# TYPE shardlease_leases_held gauge"), "{}", metrics.body);

    let unknown = get(addr, "/nothing-here").await.unwrap();
    assert_eq!(unknown.status, 404);

    stop.cancel();
    let report = tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap().unwrap();
    assert!(report.shutdown.is_clean(), "{:?}", report.shutdown);
    // The daemon has returned: its port is closed (or at least no longer healthy).
    match get(addr, "/health").await {
        Err(_) => {}
        Ok(a) => assert_ne!(a.status, 200, "still healthy after the daemon returned: {a:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_in_use_stops_the_start_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = properties(dir.path(), "ml-listener-in-use", &addr.to_string());
    let source = Arc::new(MemorySource::new(1));
    let store = shardlease::connect_namespace("memory://", "ml-listener-in-use").await.unwrap();
    let result = tokio::time::timeout(
        DEADLINE,
        run_with_options(
            &settings,
            store.clone(),
            source,
            CancellationToken::new(),
            RunOptions::default(),
        ),
    )
    .await
    .unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, MultiLangError::Listen { addr: a, .. } if a == addr), "{err:?}");
    let shown = err.to_string();
    assert!(shown.starts_with(&format!("shardlease.metricsAddress = {addr}: ")), "{shown}");
    // Refused before the worker started: no child ran, no lease was taken.
    assert!(!dir.path().join("events.log").exists(), "a child ran");
    assert!(store.list_leases().await.unwrap().items.is_empty(), "a lease was taken");
}
