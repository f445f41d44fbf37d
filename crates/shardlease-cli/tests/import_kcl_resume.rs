//! The switch the import exists for, end to end: records on a Kinesis stream (kinesalite, at
//! `SHARDLEASE_TEST_KINESIS_ENDPOINT`), a KCL lease table (moto, at
//! `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`) written as each KCL writes it with checkpoints in the
//! middle of the stream (one inside a KPL aggregate), `shardlease import-kcl` into SQLite, then a
//! shardlease worker on that store and stream. It must process exactly the records after each
//! checkpoint: none before it again, none after it missed. Both schemas: the Java KCL's
//! `(seq, sub)` resumes inside the aggregate, vmware-go-kcl's resumes after the whole record.
//! The same for a KCL multi-stream application: two streams' leases in one table (keys
//! `account:stream:creationEpoch:shardId`), imported with `--multi-stream` for a shardlease
//! `MultiStreamSource` fleet, which must resume every shard of both streams exactly.
//! A skip locally when either service is unset, a failure under `CI=true`.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use shardlease::kinesis::aws_sdk_kinesis;
use shardlease::kinesis::kpl::{self, UserRecord};
use shardlease::{processor_fn, Config, KinesisSource, MultiStreamSource, Position, Worker};
use shardlease_testkit::suite::env_or_skip;

const DEADLINE: Duration = Duration::from_secs(90);
/// A hash key in the first half of the hash space (shard 0 of two) and one in the second.
const SHARD0_HASH: u128 = 1;
const SHARD1_HASH: u128 = (1 << 127) + 1;

type Seen = Arc<Mutex<Vec<(String, String)>>>;

struct Kinesis {
    endpoint: String,
    client: aws_sdk_kinesis::Client,
}

impl Kinesis {
    fn new() -> Option<Kinesis> {
        let endpoint = env_or_skip("SHARDLEASE_TEST_KINESIS_ENDPOINT")?;
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

    async fn stream(&self, name: &str) {
        self.client
            .create_stream()
            .stream_name(name)
            .shard_count(2)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create stream: {e:?}"));
        let start = Instant::now();
        loop {
            let s = self.client.describe_stream_summary().stream_name(name).send().await.ok();
            let active = s
                .and_then(|s| s.stream_description_summary)
                .is_some_and(|d| d.stream_status == aws_sdk_kinesis::types::StreamStatus::Active);
            if active {
                return;
            }
            assert!(start.elapsed() < DEADLINE, "stream {name} never became active");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Puts `data` routed by `hash`; returns (shard, sequence number).
    async fn put(&self, stream: &str, hash: u128, data: Vec<u8>) -> (String, String) {
        let out = self
            .client
            .put_record()
            .stream_name(stream)
            .partition_key("pk")
            .explicit_hash_key(hash.to_string())
            .data(aws_sdk_kinesis::primitives::Blob::new(data))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put: {e:?}"));
        (out.shard_id, out.sequence_number)
    }
}

/// What [`Kinesis::records`] put on a stream.
struct Written {
    /// Per shard, the user records in order.
    order: HashMap<String, Vec<String>>,
    /// Shard 0 and shard 1.
    s0: String,
    s1: String,
    /// The KPL aggregate's sequence number on shard 0.
    agg_seq: String,
    /// The sequence numbers of q0..q4 on shard 1.
    q_seqs: Vec<String>,
}

impl Kinesis {
    /// Shard 0: p0, p1, an aggregate of a0..a3, p2, p3. Shard 1: q0..q4.
    async fn records(&self, stream: &str) -> Written {
        let mut order: HashMap<String, Vec<String>> = HashMap::new();
        let mut put = |shard: &str, name: &str| {
            order.entry(shard.to_owned()).or_default().push(name.to_owned());
        };
        let (s0, _) = self.put(stream, SHARD0_HASH, b"p0".to_vec()).await;
        put(&s0, "p0");
        self.put(stream, SHARD0_HASH, b"p1".to_vec()).await;
        put(&s0, "p1");
        let users: Vec<UserRecord> = (0..4)
            .map(|i| UserRecord {
                partition_key: format!("a{i}"),
                explicit_hash_key: Some(SHARD0_HASH.to_string()),
                data: format!("a{i}").into_bytes().into(),
            })
            .collect();
        let (_, agg_seq) = self.put(stream, SHARD0_HASH, kpl::aggregate(&users).to_vec()).await;
        for i in 0..4 {
            put(&s0, &format!("a{i}"));
        }
        for p in ["p2", "p3"] {
            self.put(stream, SHARD0_HASH, p.as_bytes().to_vec()).await;
            put(&s0, p);
        }
        let mut q_seqs = Vec::new();
        let mut s1 = String::new();
        for i in 0..5 {
            let (shard, seq) = self.put(stream, SHARD1_HASH, format!("q{i}").into_bytes()).await;
            put(&shard, &format!("q{i}"));
            s1 = shard;
            q_seqs.push(seq);
        }
        assert_ne!(s0, s1);
        Written { order, s0, s1, agg_seq, q_seqs }
    }
}

async fn kcl_table(endpoint: &str, key: &str) -> (aws_sdk_dynamodb::Client, String) {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(conf);
    let table = format!("kcl-resume-{}", suffix());
    client
        .create_table()
        .table_name(&table)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table: {e:?}"));
    (client, table)
}

fn suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{nanos}", std::process::id())
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// One schema's run; returns (records after the checkpoints, processed, before the checkpoints
/// processed again).
async fn switch(schema: &str) -> Option<(usize, usize, usize)> {
    let kinesis = Kinesis::new()?;
    let dynamo = env_or_skip("SHARDLEASE_TEST_DYNAMODB_ENDPOINT")?;
    let stream = format!("kcl-switch-{schema}-{}", suffix());
    kinesis.stream(&stream).await;
    let Written { order, s0, s1, agg_seq, q_seqs } = kinesis.records(&stream).await;

    // The KCL's checkpoints: shard 0 inside the aggregate (Java: user record a1 processed; Go:
    // the aggregate's whole record), shard 1 at q1.
    let (client, table, expected_0): (_, _, &[&str]) = if schema == "java" {
        let (client, table) = kcl_table(&dynamo, "leaseKey").await;
        for (shard, cp, sub) in [(&s0, &agg_seq, "1"), (&s1, &q_seqs[1], "0")] {
            let item = HashMap::from([
                ("leaseKey".to_owned(), s(shard)),
                ("checkpoint".to_owned(), s(cp)),
                ("checkpointSubSequenceNumber".to_owned(), AttributeValue::N(sub.into())),
                ("leaseCounter".to_owned(), AttributeValue::N("12".into())),
                ("leaseOwner".to_owned(), s("kcl-worker-1")),
                ("ownerSwitchesSinceCheckpoint".to_owned(), AttributeValue::N("0".into())),
            ]);
            client
                .put_item()
                .table_name(&table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        (client, table, &["a2", "a3", "p2", "p3"])
    } else {
        let (client, table) = kcl_table(&dynamo, "ShardID").await;
        for (shard, cp) in [(&s0, &agg_seq), (&s1, &q_seqs[1])] {
            let item = HashMap::from([
                ("ShardID".to_owned(), s(shard)),
                ("Checkpoint".to_owned(), s(cp)),
                ("AssignedTo".to_owned(), s("go-worker-1")),
                ("LeaseTimeout".to_owned(), s("2026-12-05T10:00:00Z")),
            ]);
            client
                .put_item()
                .table_name(&table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        (client, table, &["p2", "p3"])
    };

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("sqlite://{}?namespace=switch", dir.path().join("leases.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_shardlease"))
        .args(["--store", &url, "--observe-ms", "300", "import-kcl", "--table", &table])
        .args(["--region", "us-east-1", "--endpoint-url", &dynamo])
        .env_remove("SHARDLEASE_STORE")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = client.delete_table().table_name(&table).send().await;

    // The shardlease fleet on the imported store.
    let store = shardlease::connect(&url).await.unwrap_or_else(|e| panic!("{e}"));
    let source = KinesisSource::builder(&stream)
        .region("us-east-1")
        .endpoint_url(&kinesis.endpoint)
        .static_credentials("dummy", "dummy")
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let processor = processor_fn(move |ctx, batch| {
        let log = log.clone();
        async move {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            for r in batch.records.iter() {
                log.push((
                    ctx.key().as_str().to_owned(),
                    String::from_utf8_lossy(&r.data).into_owned(),
                ));
            }
            Ok(())
        }
    });
    let config = Config::new("switch")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(200))
        // Would reprocess everything if an imported lease were ignored.
        .with_initial_position(Position::TrimHorizon);
    let worker = Worker::builder(config, store, Arc::new(source), processor)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start();

    // A last record on each shard: once both are processed, everything before them has been
    // (a shard is processed in order), so the log is complete without waiting on a clock.
    kinesis.put(&stream, SHARD0_HASH, b"end0".to_vec()).await;
    kinesis.put(&stream, SHARD1_HASH, b"end1".to_vec()).await;
    let start = Instant::now();
    loop {
        let done = {
            let log = seen.lock().unwrap_or_else(|p| p.into_inner());
            ["end0", "end1"].iter().all(|e| log.iter().any(|(_, d)| d == e))
        };
        if done {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{schema}: the fleet never reached the last records");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;

    let log = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let on = |shard: &str| -> Vec<String> {
        log.iter().filter(|(k, _)| k == shard).map(|(_, d)| d.clone()).collect()
    };
    let mut want0: Vec<String> = expected_0.iter().map(|x| (*x).to_owned()).collect();
    want0.push("end0".into());
    let want1: Vec<String> = ["q2", "q3", "q4", "end1"].iter().map(|x| (*x).to_owned()).collect();
    assert_eq!(on(&s0), want0, "{schema}: shard {s0}");
    assert_eq!(on(&s1), want1, "{schema}: shard {s1}");
    let before: usize = order
        .values()
        .flatten()
        .filter(|name| log.iter().any(|(_, d)| d == *name))
        .filter(|name| !want0.contains(name) && !want1.contains(name))
        .count();
    let _ = kinesis.client.delete_stream().stream_name(&stream).send().await;
    Some((want0.len() + want1.len(), log.len(), before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_resumes_at_the_next_record_after_the_imported_checkpoints() {
    for schema in ["java", "go"] {
        let Some((after, processed, before)) = switch(schema).await else { return };
        println!(
            "{schema}: records after the checkpoints {after}, processed {processed}, \
             before the checkpoints reprocessed {before}, missed {}",
            after.saturating_sub(processed)
        );
        assert_eq!(before, 0);
        assert_eq!(processed, after);
    }
}

/// What a multi-stream switch saw on one stream.
struct StreamResult {
    stream: String,
    /// Records after the checkpoints (the end markers included).
    after: usize,
    /// Records the fleet processed on the stream.
    processed: usize,
    /// Records at or before a checkpoint processed again.
    before: usize,
    /// Records processed more than once.
    twice: usize,
    /// Records after a checkpoint never processed.
    missed: usize,
}

/// A Java KCL multi-stream lease row as `DynamoDBMultiStreamLeaseSerializer` writes it.
fn multi_row(stream_id: &str, shard: &str, cp: &str, sub: u64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("leaseKey".to_owned(), s(&format!("{stream_id}:{shard}"))),
        ("streamName".to_owned(), s(stream_id)),
        ("shardId".to_owned(), s(shard)),
        ("checkpoint".to_owned(), s(cp)),
        ("checkpointSubSequenceNumber".to_owned(), AttributeValue::N(sub.to_string())),
        ("leaseCounter".to_owned(), AttributeValue::N("31".into())),
        ("leaseOwner".to_owned(), s("kcl-multi-worker-1")),
        ("ownerSwitchesSinceCheckpoint".to_owned(), AttributeValue::N("0".into())),
    ])
}

/// Two streams of one KCL multi-stream application, imported with `--multi-stream` (and a
/// `--stream` per stream, leaving a third stream of the table out), then consumed by a
/// `MultiStreamSource` fleet.
async fn multi_switch() -> Option<Vec<StreamResult>> {
    let kinesis = Kinesis::new()?;
    let dynamo = env_or_skip("SHARDLEASE_TEST_DYNAMODB_ENDPOINT")?;
    let tag = suffix();
    let names = [format!("kcl-multi-a-{tag}"), format!("kcl-multi-b-{tag}")];
    // Stream a: shard 0 inside the aggregate after user record a1, shard 1 at q1. Stream b:
    // shard 0 after the aggregate's last user record a3, shard 1 at q3.
    let plans: [(u64, usize, &[&str], &[&str]); 2] =
        [(1, 1, &["a2", "a3", "p2", "p3"], &["q2", "q3", "q4"]), (3, 3, &["p2", "p3"], &["q4"])];
    let (client, table) = kcl_table(&dynamo, "leaseKey").await;
    let mut expected: Vec<(String, Written, Vec<String>, Vec<String>)> = Vec::new();
    for (name, (sub0, q_at, want0, want1)) in names.iter().zip(plans) {
        kinesis.stream(name).await;
        let written = kinesis.records(name).await;
        let stream_id = format!("123456789012:{name}:1700000000");
        for item in [
            multi_row(&stream_id, &written.s0, &written.agg_seq, sub0),
            multi_row(&stream_id, &written.s1, &written.q_seqs[q_at], 0),
        ] {
            client
                .put_item()
                .table_name(&table)
                .set_item(Some(item))
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
        }
        let own = |w: &[&str], end: &str| -> Vec<String> {
            w.iter().map(|x| (*x).to_owned()).chain([end.to_owned()]).collect()
        };
        expected.push((name.clone(), written, own(want0, "end0"), own(want1, "end1")));
    }
    // A stream the application no longer reads: left out by naming the two others.
    client
        .put_item()
        .table_name(&table)
        .set_item(Some(multi_row(
            "123456789012:kcl-multi-gone:1600000000",
            "shardId-000000000000",
            "SHARD_END",
            0,
        )))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("sqlite://{}?namespace=multi", dir.path().join("leases.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_shardlease"))
        .args(["--store", &url, "--observe-ms", "300", "--json", "import-kcl", "--table", &table])
        .args(["--region", "us-east-1", "--endpoint-url", &dynamo, "--multi-stream"])
        .args(["--stream", &names[0], "--stream", &names[1]])
        .env_remove("SHARDLEASE_STORE")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(report["summary"]["created"], 4, "{report}");
    assert_eq!(report["summary"]["skipped"], 1, "{report}");
    assert_eq!(report["multi_stream"], true, "{report}");
    let _ = client.delete_table().table_name(&table).send().await;

    // The shardlease multi-stream fleet on the imported store.
    let store = shardlease::connect(&url).await.unwrap_or_else(|e| panic!("{e}"));
    let template = KinesisSource::builder("")
        .region("us-east-1")
        .endpoint_url(&kinesis.endpoint)
        .static_credentials("dummy", "dummy");
    let source = MultiStreamSource::builder(template)
        .stream(names[0].as_str())
        .stream(names[1].as_str())
        .build()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let processor = processor_fn(move |ctx, batch| {
        let log = log.clone();
        async move {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            for r in batch.records.iter() {
                log.push((
                    ctx.key().as_str().to_owned(),
                    String::from_utf8_lossy(&r.data).into_owned(),
                ));
            }
            Ok(())
        }
    });
    let config = Config::new("multi")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(200))
        // Would reprocess everything if an imported lease were ignored.
        .with_initial_position(Position::TrimHorizon);
    let worker = Worker::builder(config, store, Arc::new(source), processor)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start();

    // A last record on each shard of each stream: once all are processed, so is everything
    // before them (a shard is processed in order).
    let mut ends: Vec<(String, &str)> = Vec::new();
    for (name, w, _, _) in &expected {
        kinesis.put(name, SHARD0_HASH, b"end0".to_vec()).await;
        kinesis.put(name, SHARD1_HASH, b"end1".to_vec()).await;
        ends.push((format!("{name}/{}", w.s0), "end0"));
        ends.push((format!("{name}/{}", w.s1), "end1"));
    }
    let start = Instant::now();
    loop {
        let done = {
            let log = seen.lock().unwrap_or_else(|p| p.into_inner());
            ends.iter().all(|(k, d)| log.iter().any(|(lk, ld)| lk == k && ld == d))
        };
        if done {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "multi-stream: the fleet never reached the ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;

    let log = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut results = Vec::new();
    for (name, w, want0, want1) in &expected {
        let mut r = StreamResult {
            stream: name.clone(),
            after: want0.len() + want1.len(),
            processed: 0,
            before: 0,
            twice: 0,
            missed: 0,
        };
        for (shard, want) in [(&w.s0, want0), (&w.s1, want1)] {
            // The lease key core's multi-stream source gives the shard.
            let key = shardlease::qualify(name, &shard.as_str().into()).to_string();
            let got: Vec<String> =
                log.iter().filter(|(k, _)| *k == key).map(|(_, d)| d.clone()).collect();
            let written = w.order.get(shard.as_str()).cloned().unwrap_or_default();
            r.processed += got.len();
            r.before += got.iter().filter(|d| written.contains(d) && !want.contains(d)).count();
            let distinct: std::collections::BTreeSet<&String> = got.iter().collect();
            r.twice += got.len() - distinct.len();
            r.missed += want.iter().filter(|d| !got.contains(d)).count();
            assert_eq!(&got, want, "stream {name}, shard {shard}");
        }
        results.push(r);
    }
    for name in &names {
        let _ = kinesis.client.delete_stream().stream_name(name).send().await;
    }
    // Nothing under another key: every record was read through an imported lease.
    let keys: std::collections::BTreeSet<&str> = log.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    Some(results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_stream_fleet_resumes_every_stream_at_the_next_record() {
    let Some(results) = multi_switch().await else { return };
    for r in &results {
        println!(
            "multi-stream {}: records after the checkpoints {}, processed {}, before the \
             checkpoints reprocessed {}, processed twice {}, missed {}",
            r.stream, r.after, r.processed, r.before, r.twice, r.missed
        );
    }
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!((r.before, r.twice, r.missed), (0, 0, 0), "{}", r.stream);
        assert_eq!(r.processed, r.after, "{}", r.stream);
    }
}
