//! Changes per second read from moto's DynamoDB stream through the runtime (one worker, in-memory
//! store), next to a plain `GetRecords` loop over the same stream in the same run. Runs
//! `SHARDLEASE_THROUGHPUT_ROUNDS` rounds (default 5), alternating which read goes first, and
//! prints the median ratio. The runtime's time includes starting the worker (one heartbeat, 50 ms
//! here, before its first pass, then taking the lease and opening the shard) and ends when the
//! processor has seen every change. A measurement, not a check: ignored by default. Run it with
//!
//! ```text
//! cargo test --release -p shardlease-dynamodb-streams --test throughput -- --ignored --nocapture
//! ```

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use common::{fast_reads, moto, Moto, DEADLINE, PK, SK};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{processor_fn, Config, Position, ShardSource, Worker};
use shardlease_dynamodb_streams::aws_sdk_dynamodbstreams as streams;

/// Changes per run: `SHARDLEASE_THROUGHPUT_RECORDS`, default 5 000 (a multiple of 25).
fn records() -> usize {
    std::env::var("SHARDLEASE_THROUGHPUT_RECORDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(5_000, |n| n.max(25) / 25 * 25)
}

fn rounds() -> usize {
    std::env::var("SHARDLEASE_THROUGHPUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(5, |n| n.max(1))
}

/// Writes `records()` items, 25 to a `BatchWriteItem`.
async fn fill(m: &Moto, table: &str) {
    use aws_sdk_dynamodb::types::AttributeValue as V;
    for chunk in 0..records() / 25 {
        let writes: Vec<WriteRequest> = (0..25)
            .map(|i| {
                let item = [
                    (PK.to_owned(), V::S(format!("item-{chunk}-{i}"))),
                    (SK.to_owned(), V::N("1".into())),
                    ("payload".to_owned(), V::S("x".repeat(100))),
                ];
                let put = PutRequest::builder()
                    .set_item(Some(item.into_iter().collect()))
                    .build()
                    .unwrap_or_else(|e| panic!("{e}"));
                WriteRequest::builder().put_request(put).build()
            })
            .collect();
        m.client
            .batch_write_item()
            .request_items(table, writes)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
    }
}

fn streams_client(m: &Moto) -> streams::Client {
    let conf = streams::Config::builder()
        .behavior_version(streams::config::BehaviorVersion::latest())
        .region(streams::config::Region::new(common::REGION))
        .endpoint_url(&m.endpoint)
        .credentials_provider(streams::config::Credentials::new("dummy", "dummy", None, None, "t"))
        .build();
    streams::Client::from_conf(conf)
}

/// Reads the stream's shard from the trim horizon to the tip with bare `GetRecords` calls.
async fn plain_loop(client: &streams::Client, arn: &str) -> usize {
    let shards = client
        .describe_stream()
        .stream_arn(arn)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e:?}"))
        .stream_description
        .and_then(|d| d.shards)
        .unwrap_or_default();
    let mut n = 0;
    for shard in shards {
        let mut it = client
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard.shard_id.unwrap_or_default())
            .shard_iterator_type(streams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"))
            .shard_iterator;
        while let Some(i) = it {
            let out = client
                .get_records()
                .shard_iterator(i)
                .limit(1000)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            let got = out.records.unwrap_or_default().len();
            n += got;
            if got == 0 {
                break;
            }
            it = out.next_shard_iterator;
        }
    }
    n
}

/// Reads the whole stream through one worker; returns once every change was processed.
async fn through_runtime(m: &Moto, table: &str) {
    let mut read = fast_reads();
    read.min_call_interval = Duration::ZERO;
    let source = m.builder(table).read_config(read).build().await;
    let source: Arc<dyn ShardSource> = Arc::new(source.unwrap_or_else(|e| panic!("{e}")));
    let store: Arc<dyn LeaseStore> = Arc::new(
        MemoryBackend::new().store("throughput".parse().unwrap_or_else(|e| panic!("{e}"))),
    );
    let count = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (counter, all_done) = (count.clone(), done.clone());
    let processor = processor_fn(move |_ctx, batch| {
        let (counter, all_done) = (counter.clone(), all_done.clone());
        async move {
            let n = batch.records.len();
            if counter.fetch_add(n, Ordering::Relaxed) + n >= records() {
                all_done.notify_one();
            }
            Ok(())
        }
    });
    let config = Config::new("throughput")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(50))
        .with_initial_position(Position::TrimHorizon);
    let worker = Worker::builder(config, store, source, processor)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start();
    tokio::time::timeout(DEADLINE, done.notified())
        .await
        .unwrap_or_else(|_| panic!("not every change came through the runtime in {DEADLINE:?}"));
    worker.shutdown().await;
    assert!(count.load(Ordering::Relaxed) >= records());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn changes_per_second_runtime_vs_plain_loop() {
    let Some(m) = moto() else { return };
    let table = m.create_table(true).await;
    fill(&m, &table).await;
    let client = streams_client(&m);
    let arn = m.stream_arn(&table).await;
    let (mut ratios, mut plain_rates) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        let plain_first = round % 2 == 0;
        let (mut plain, mut runtime) = (Duration::ZERO, Duration::ZERO);
        for step in 0..2 {
            if (step == 0) == plain_first {
                let t = Instant::now();
                assert_eq!(plain_loop(&client, &arn).await, records());
                plain = t.elapsed();
            } else {
                let t = Instant::now();
                through_runtime(&m, &table).await;
                runtime = t.elapsed();
            }
        }
        plain_rates.push(records() as f64 / plain.as_secs_f64());
        ratios.push(plain.as_secs_f64() / runtime.as_secs_f64());
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{{\"source\":\"dynamodb-streams (moto)\",\"changes\":{},\"rounds\":{},\"plain_rps_median\":{:.0},\"runtime_over_plain_median\":{:.2},\"runtime_over_plain\":{:.2?},\"load\":\"{}\"}}",
        records(),
        rounds(),
        median(plain_rates),
        median(ratios.clone()),
        ratios,
        load.split(' ').next().unwrap_or("?"),
    );
    m.delete_table(&table).await;
}
