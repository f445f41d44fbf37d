//! The Prometheus example's moving parts, kept in the library so that a test can start the same
//! fleet the example runs and scrape it: the exporter's HTTP listener on 127.0.0.1, a small fleet
//! on the in-memory store and stream, and a plain HTTP GET of `/metrics`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use shardlease::{Config, MemorySource, Position, ShardSource, Worker, WorkerHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::DeliveryLog;

/// Bucket bounds (seconds) of the histograms: store calls and batches take from a fraction of a
/// millisecond (memory store) to seconds (a slow sink, a store under load).
const SECONDS_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Installs the Prometheus exporter as the process's metrics recorder, serving `/metrics` on
/// 127.0.0.1 at `port` (0 picks a free port), and returns the address it listens on. Must run
/// inside a tokio runtime (the listener is a task on it); call it once per process.
pub fn install_exporter(port: u16) -> Result<SocketAddr, String> {
    // The exporter does not report the port it bound, so 0 is resolved here first: bind, read the
    // port, let it go, and hand it to the exporter (another process could take it in between; the
    // exporter's bind then fails and says so).
    let addr = if port == 0 {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("finding a free port failed: {e}"))?;
        probe.local_addr().map_err(|e| format!("finding a free port failed: {e}"))?
    } else {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    };
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .map_err(|e| format!("configuring the exporter failed: {e}"))?
        .build()
        .map_err(|e| format!("starting the exporter on {addr} failed: {e}"))?;
    metrics::set_global_recorder(recorder)
        .map_err(|e| format!("installing the metrics recorder failed: {e}"))?;
    shardlease::telemetry::describe();
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the Prometheus exporter stopped");
        }
    });
    Ok(addr)
}

/// What the demo fleet looks like.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Shards in the in-memory stream.
    pub shards: usize,
    /// Workers in this process.
    pub workers: usize,
    /// Heartbeat interval; every other timing scales with it.
    pub heartbeat: Duration,
    /// Records written per second, spread over the shards by partition key.
    pub records_per_second: u32,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            shards: 4,
            workers: 2,
            heartbeat: Duration::from_millis(200),
            records_per_second: 100,
        }
    }
}

/// A fleet sharing an in-memory stream through the in-memory store, with a producer writing to it.
#[derive(Debug)]
pub struct Fleet {
    /// The running workers.
    pub workers: Vec<Arc<WorkerHandle>>,
    /// Every record delivered to a processor.
    pub log: DeliveryLog,
    /// The stream.
    pub source: MemorySource,
    stop_producer: oneshot::Sender<()>,
    producer: JoinHandle<()>,
}

impl Fleet {
    /// Starts `options.workers` workers named `w1`, `w2`, ... on a fresh namespace of the
    /// process-wide in-memory store (`memory://?namespace=NAMESPACE`), and the producer.
    pub async fn start(namespace: &str, options: &FleetOptions) -> shardlease::Result<Fleet> {
        let store = shardlease::connect_namespace("memory://", namespace).await?;
        let source = MemorySource::new(options.shards);
        let log = DeliveryLog::new();
        let template = Config::new(namespace)?
            .with_heartbeat(options.heartbeat)
            .with_initial_position(Position::TrimHorizon);
        let mut workers = Vec::new();
        for n in 1..=options.workers {
            let shards: Arc<dyn ShardSource> = Arc::new(source.clone());
            let cfg = template.clone().with_worker_id(format!("w{n}"));
            let worker = Worker::builder(cfg, store.clone(), shards, log.factory()).build()?;
            workers.push(Arc::new(worker.start()));
        }
        let (stop_producer, stopped) = oneshot::channel();
        let producer = spawn_producer(source.clone(), options.records_per_second, stopped);
        Ok(Fleet { workers, log, source, stop_producer, producer })
    }

    /// Stops the producer and shuts every worker down gracefully.
    pub async fn shutdown(self) -> shardlease::Result<()> {
        let _ = self.stop_producer.send(());
        let _ = self.producer.await;
        for w in &self.workers {
            if let Some(e) = w.shutdown().await.record_error {
                return Err(shardlease::Error::retryable(e));
            }
        }
        Ok(())
    }
}

/// Writes `per_second` records per second (in ticks of 10 ms) until told to stop.
fn spawn_producer(
    source: MemorySource,
    per_second: u32,
    mut stop: oneshot::Receiver<()>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut written: u64 = 0;
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let due = (started.elapsed().as_secs_f64() * f64::from(per_second)) as u64;
                    while written < due {
                        source.put(&format!("customer-{}", written % 1_009), format!("order {written}"));
                        written += 1;
                    }
                }
                _ = &mut stop => return,
            }
        }
    })
}

/// `GET /metrics` from `addr` over plain HTTP/1.1 (std's `TcpStream`, no HTTP client): the status
/// line and the body. Blocking; `timeout` bounds connecting, each read and each write.
pub fn scrape(addr: SocketAddr, timeout: Duration) -> std::io::Result<(String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body) } else { body.to_owned() };
    Ok((status, body))
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

/// One sample of a Prometheus text exposition: the metric name, its labels and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series name (with `_bucket`, `_sum`, `_count` for histogram parts).
    pub name: String,
    /// Label pairs, in the order printed.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// The samples of a Prometheus text exposition (comments skipped; label values are assumed free
/// of escaped quotes, which holds for shardlease's labels).
pub fn parse_samples(body: &str) -> Vec<Sample> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}')?;
                    let labels = inner
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .filter_map(|pair| {
                            let (k, v) = pair.split_once("=\"")?;
                            Some((k.to_owned(), v.trim_end_matches('"').to_owned()))
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), Vec::new()),
            };
            Some(Sample { name, labels, value })
        })
        .collect()
}
