//! The properties file mapped: a KCL sample file as kclpy ships it, every mapped key, the
//! shardlease keys, the ignored keys listed, and bad values reported with their key and line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use shardlease::{Balance, Position};
use shardlease_multilang::settings::{Retrieval, Settings, DEFAULT_GRACE, DEFAULT_STORE_URL};
use shardlease_multilang::MultiLangError;

const SAMPLE: &str = "\
# from amazon-kclpy's samples/sample.properties
executableName = sample_kclpy_app.py
streamArn = arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample
streamName = kclpysample
applicationName = PythonKCLSample
AwsCredentialsProvider = DefaultCredentialsProvider
processingLanguage = python/3.8
initialPositionInStream = TRIM_HORIZON
regionName = us-east-1
#failoverTimeMillis = 10000
workerId =
";

#[test]
fn the_kclpy_sample() {
    let s = Settings::from_text(SAMPLE).unwrap();
    assert_eq!(s.child.command, vec!["sample_kclpy_app.py"]);
    assert_eq!(s.stream, "arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample");
    assert_eq!(s.namespace, "PythonKCLSample");
    assert_eq!(s.region.as_deref(), Some("us-east-1"));
    assert_eq!(s.initial_position, Position::TrimHorizon);
    assert_eq!(s.worker_id, None, "an empty value is unset");
    assert_eq!(s.metrics_address, None, "no listener unless asked");
    // The KCL's default retrieval is enhanced fan-out, as the application's name.
    assert_eq!(s.retrieval, Retrieval::FanOut { consumer_name: "PythonKCLSample".into() });
    assert_eq!(s.store_url, DEFAULT_STORE_URL);
    assert_eq!(s.kcl_table, "PythonKCLSample");
    assert_eq!(s.grace, DEFAULT_GRACE);
    assert_eq!(s.child.response_timeout, None);
    let ignored: Vec<(&str, usize, bool)> =
        s.ignored.iter().map(|k| (k.key.as_str(), k.line, k.known_to_kcl)).collect();
    assert_eq!(ignored, vec![("AwsCredentialsProvider", 6, true), ("processingLanguage", 7, true)]);
    // The KCL's failover time, and a heartbeat of a tenth of it (the start hold is a heartbeat).
    let config = shardlease_multilang::daemon::worker_config(&s).unwrap();
    assert_eq!(config.failover_timeout(), Duration::from_secs(10));
    assert_eq!(config.heartbeat_interval(), Duration::from_secs(1));
}

#[test]
fn every_mapped_key() {
    let text = "\
executableName = python3  -u app.py --flag
streamName = orders
applicationName = orders-app
kinesisEndpoint = http://127.0.0.1:4567
dynamoDBEndpoint = http://127.0.0.1:8000
tableName = orders-kcl
workerId = w-1
initialPositionInStreamExtended = 1636609142
failoverTimeMillis = 6000
shardSyncIntervalMillis = 30000
maxLeasesForWorker = 7
maxRecords = 500
idleTimeBetweenReadsInMillis = 250
retrievalMode = POLLING
callProcessRecordsEvenForEmptyRecordList = true
shutdownGraceMillis = 2500
timeoutInSeconds = 30
shardlease.store = dynamodb://shardlease-leases
regionName = eu-west-1
shardlease.balance = load
shardlease.heartbeatMillis = 500
shardlease.childExitTimeoutMillis = 1000
fancyNewKey = 1
";
    let s = Settings::from_text(text).unwrap();
    assert_eq!(s.child.command, vec!["python3", "-u", "app.py", "--flag"]);
    assert_eq!(s.stream, "orders");
    assert_eq!(s.kinesis_endpoint.as_deref(), Some("http://127.0.0.1:4567"));
    assert_eq!(s.kcl_table, "orders-kcl");
    assert_eq!(s.worker_id.as_deref(), Some("w-1"));
    assert_eq!(s.initial_position, Position::AtTimestamp { millis: 1_636_609_142_000 });
    assert_eq!(s.failover, Some(Duration::from_millis(6000)));
    assert_eq!(s.shard_sync, Some(Duration::from_secs(30)));
    assert_eq!(s.max_leases, Some(7));
    assert_eq!(s.max_records, Some(500));
    assert_eq!(s.idle_between_reads, Some(Duration::from_millis(250)));
    assert_eq!(s.retrieval, Retrieval::Polling);
    assert!(s.child.call_for_empty_batches);
    assert_eq!(s.grace, Duration::from_millis(2500));
    assert_eq!(s.child.response_timeout, Some(Duration::from_secs(30)));
    assert_eq!(s.child.exit_timeout, Duration::from_secs(1));
    assert_eq!(s.heartbeat, Some(Duration::from_millis(500)));
    assert_eq!(s.balance, Balance::by_load());
    assert_eq!(
        s.effective_store_url(),
        "dynamodb://shardlease-leases?region=eu-west-1&endpoint=http://127.0.0.1:8000"
    );
    assert_eq!(s.store_dynamodb_table(), Some("shardlease-leases"));
    let ignored: Vec<(&str, bool)> =
        s.ignored.iter().map(|k| (k.key.as_str(), k.known_to_kcl)).collect();
    assert_eq!(ignored, vec![("fancyNewKey", false)]);
    let config = shardlease_multilang::daemon::worker_config(&s).unwrap();
    assert_eq!(config.failover_timeout(), Duration::from_millis(6000));
    assert_eq!(config.heartbeat_interval(), Duration::from_millis(500));
}

#[test]
fn fan_out_consumers() {
    let base = "executableName=a\nstreamName=s\napplicationName=app\n";
    let s =
        Settings::from_text(&format!("{base}retrievalMode=FANOUT\nconsumerName=mine\n")).unwrap();
    assert_eq!(s.retrieval, Retrieval::FanOut { consumer_name: "mine".into() });
    let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/theirs:1700000000";
    let s = Settings::from_text(&format!("{base}consumerArn={arn}\n")).unwrap();
    assert_eq!(s.retrieval, Retrieval::FanOut { consumer_name: "theirs".into() });
}

fn bad(text: &str) -> (String, usize, String) {
    match Settings::from_text(text) {
        Err(MultiLangError::BadValue { key, line, message }) => (key, line, message),
        other => panic!("expected a bad value, got {other:?}"),
    }
}

#[test]
fn bad_values_name_their_key_and_line() {
    let base = "executableName=a\nstreamName=s\napplicationName=app\n";
    let cases = [
        ("maxRecords = 20000", "maxRecords"),
        ("maxRecords = many", "maxRecords"),
        ("failoverTimeMillis = 0", "failoverTimeMillis"),
        ("failoverTimeMillis = -5", "failoverTimeMillis"),
        ("initialPositionInStream = EARLIEST", "initialPositionInStream"),
        ("initialPositionInStream = AT_TIMESTAMP", "initialPositionInStream"),
        ("initialPositionInStreamExtended = yesterday", "initialPositionInStreamExtended"),
        ("retrievalMode = PUSH", "retrievalMode"),
        (
            "callProcessRecordsEvenForEmptyRecordList = yes",
            "callProcessRecordsEvenForEmptyRecordList",
        ),
        ("timeoutInSeconds = 0", "timeoutInSeconds"),
        ("shardlease.balance = random", "shardlease.balance"),
        ("consumerArn = nope", "consumerArn"),
        ("shardlease.metricsAddress = localhost", "shardlease.metricsAddress"),
        ("shardlease.metricsAddress = 127.0.0.1", "shardlease.metricsAddress"),
        ("shardlease.metricsAddress = 127.0.0.1:99999", "shardlease.metricsAddress"),
    ];
    for (line, key) in cases {
        let (k, l, message) = bad(&format!("{base}# a comment\n{line}\n"));
        assert_eq!((k.as_str(), l), (key, 5), "{line}: {message}");
        let shown = MultiLangError::BadValue { key: k, line: l, message }.to_string();
        assert!(shown.starts_with(&format!("properties line 5: {key}: ")), "{shown}");
    }
    let (k, l, _) = bad("executableName=a\nstreamArn=orders\napplicationName=app\n");
    assert_eq!((k.as_str(), l), ("streamArn", 2));
}

#[test]
fn metrics_address() {
    let base = "executableName=a\nstreamName=s\napplicationName=app\n";
    let s =
        Settings::from_text(&format!("{base}shardlease.metricsAddress = 0.0.0.0:9464\n")).unwrap();
    assert_eq!(s.metrics_address, Some("0.0.0.0:9464".parse().unwrap()));
    assert!(s.ignored.is_empty(), "{:?}", s.ignored);
    let s = Settings::from_text(&format!("{base}shardlease.metricsAddress = [::1]:0\n")).unwrap();
    assert_eq!(s.metrics_address, Some("[::1]:0".parse().unwrap()));
    // Empty is unset, as for every key.
    let s = Settings::from_text(&format!("{base}shardlease.metricsAddress =\n")).unwrap();
    assert_eq!(s.metrics_address, None);
    let (key, line, message) = bad(&format!("{base}shardlease.metricsAddress = :9464\n"));
    assert_eq!((key.as_str(), line), ("shardlease.metricsAddress", 4));
    assert!(message.contains("127.0.0.1:9464") && message.contains(":9464"), "{message}");
}

#[test]
fn required_keys() {
    for text in [
        "streamName=s\napplicationName=a\n",
        "executableName=a\napplicationName=a\n",
        "executableName=a\nstreamName=s\n",
    ] {
        assert!(matches!(Settings::from_text(text), Err(MultiLangError::Missing(_))), "{text}");
    }
}
