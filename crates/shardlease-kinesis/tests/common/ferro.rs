//! The in-process Kinesis emulator of the enhanced fan-out tests: ferrokinesis (a dev-dependency,
//! nothing to install) served on an ephemeral port of 127.0.0.1 by a task of the test's own
//! runtime, so it lives exactly as long as the test. Stream and consumer operations take effect
//! at once (no create/update delays), the shard limit is raised, and `SubscribeToShard`
//! sessions last `session` instead of 5 minutes. Also: the source's counters, read back through
//! a debugging recorder installed once per test binary.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::Client;
use ferrokinesis::store::StoreOptions;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use shardlease_kinesis::{FanOutConfig, KinesisSource, ReadConfig};

use super::Emulator;

/// Starts an emulator whose subscriptions end after `session`.
pub async fn ferrokinesis(session: Duration) -> Emulator {
    let options = StoreOptions {
        create_stream_ms: 0,
        delete_stream_ms: 0,
        update_stream_ms: 0,
        shard_limit: 10_000,
        subscribe_to_shard_session_ms: u64::try_from(session.as_millis()).unwrap_or(u64::MAX),
        ..StoreOptions::default()
    };
    let (app, _store) = ferrokinesis::create_app(options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("binding the emulator: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            panic!("the emulator stopped: {e}");
        }
    });
    let endpoint = format!("http://{addr}");
    let conf = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "test"))
        .timeout_config(
            aws_sdk_kinesis::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    Emulator { endpoint, client: Client::from_conf(conf) }
}

/// Fan-out settings for tests: the emulator sends an event every 200 ms, and its consumers are
/// active half a second after registering.
pub fn fan_out(consumer: &str) -> FanOutConfig {
    let mut c = FanOutConfig::new(consumer);
    c.quiet_timeout = Duration::from_secs(5);
    c.consumer_poll_interval = Duration::from_millis(100);
    c
}

impl Emulator {
    /// A fan-out source on `stream` as `consumer`.
    pub async fn fan_out_source(
        &self,
        stream: &str,
        fan: FanOutConfig,
        read: ReadConfig,
    ) -> KinesisSource {
        KinesisSource::builder(stream)
            .region("us-east-1")
            .endpoint_url(&self.endpoint)
            .static_credentials("dummy", "dummy")
            .read_config(read)
            .fan_out_config(fan)
            .build()
            .await
            .unwrap_or_else(|e| panic!("building the fan-out source: {e}"))
    }
}

/// A counter series: its name and its sorted labels.
type Series = (String, Vec<(String, String)>);

struct Counters {
    snapshotter: Snapshotter,
    /// A snapshot drains the recorder's counters: every test adds what it drained here.
    totals: Mutex<HashMap<Series, u64>>,
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap_or_else(|e| panic!("installing the recorder: {e}"));
        Counters { snapshotter, totals: Mutex::new(HashMap::new()) }
    })
}

/// Installs the recorder (call before the source emits anything the test reads back).
pub fn record_metrics() {
    counters();
}

/// The total of counter `name` over the series whose labels include `labels`.
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let c = counters();
    let mut totals = c.totals.lock().unwrap_or_else(|p| p.into_inner());
    for (key, _, _, value) in c.snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let k = key.key();
            let mut labels: Vec<(String, String)> =
                k.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            labels.sort();
            *totals.entry((k.name().to_owned(), labels)).or_default() += n;
        }
    }
    totals
        .iter()
        .filter(|((n, ls), _)| {
            n == name && labels.iter().all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| *v)
        .sum()
}
