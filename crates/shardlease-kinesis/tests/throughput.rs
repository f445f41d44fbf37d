//! Records per second read from kinesalite through the runtime (one worker, in-memory store),
//! next to a plain `GetRecords` loop over the same shards in the same run, for 1, 4 and 16
//! shards. Each shard count runs `SHARDLEASE_THROUGHPUT_ROUNDS` rounds (default 5) on one
//! stream, alternating which read goes first, and prints the median ratio. The runtime's time
//! includes starting the worker (one heartbeat before its first pass, 50 ms here, then taking the
//! leases and opening the shards) and ends when the processor has seen every record. A measurement, not a check: it is ignored by default and prints one
//! line per shard count. Run it with
//!
//! ```text
//! cargo test --release -p shardlease-kinesis --test throughput -- --ignored --nocapture
//! ```

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use common::{emulator, fast_reads, Emulator, DEADLINE};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{processor_fn, Config, Position, ShardSource, Worker};

/// Records per run: `SHARDLEASE_THROUGHPUT_RECORDS`, default 40 000 (a multiple of 500).
fn records() -> usize {
    std::env::var("SHARDLEASE_THROUGHPUT_RECORDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(40_000, |n| n.max(500) / 500 * 500)
}

async fn fill(k: &Emulator, stream: &str) {
    for chunk in 0..records() / 500 {
        let entries: Vec<PutRecordsRequestEntry> = (0..500)
            .map(|i| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("k{chunk}-{i}"))
                    .data(Blob::new(vec![b'x'; 100]))
                    .build()
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        let out = k
            .client
            .put_records()
            .stream_name(stream)
            .set_records(Some(entries))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(out.failed_record_count, Some(0));
    }
}

/// Reads every shard from the trim horizon to the tip with bare `GetRecords` calls, shards in
/// parallel; returns the records read.
async fn plain_loop(k: &Emulator, stream: &str, shards: usize) -> usize {
    let mut tasks = Vec::new();
    for s in 0..shards {
        let client = k.client.clone();
        let stream = stream.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut it = client
                .get_shard_iterator()
                .stream_name(&stream)
                .shard_id(format!("shardId-{s:012}"))
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{e:?}"))
                .shard_iterator;
            let mut n = 0;
            while let Some(i) = it {
                let out = client
                    .get_records()
                    .shard_iterator(i)
                    .limit(10_000)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{e:?}"));
                n += out.records.len();
                if out.records.is_empty() && out.millis_behind_latest == Some(0) {
                    break;
                }
                it = out.next_shard_iterator;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or_else(|e| panic!("{e}"));
    }
    total
}

/// Reads the whole stream through one worker of the runtime; returns as soon as every record was
/// processed (told by the processor, not polled for).
async fn through_runtime(k: &Emulator, stream: &str) {
    let mut read = fast_reads();
    // The plain loop keeps no per-shard limit either (the 2 MiB/s one would dominate here).
    read.min_call_interval = Duration::ZERO;
    read.max_bytes_per_second = 1 << 40;
    let source: Arc<dyn ShardSource> = Arc::new(k.source(stream, read).await);
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
        .unwrap_or_else(|_| panic!("not every record came through the runtime in {DEADLINE:?}"));
    worker.shutdown().await;
    assert!(count.load(Ordering::Relaxed) >= records());
}

/// Rounds per shard count: `SHARDLEASE_THROUGHPUT_ROUNDS`, default 5.
fn rounds() -> usize {
    std::env::var("SHARDLEASE_THROUGHPUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(5, |n| n.max(1))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per shard count, several rounds over the same stream, alternating which of the two reads
/// first (the order changes the figures: a stream read a moment ago is served differently);
/// prints the median ratio of the rounds and every round's ratio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn records_per_second_runtime_vs_plain_loop() {
    let Some(k) = emulator() else { return };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.split(' ').next().unwrap_or("?"));
    for shards in [1usize, 4, 16] {
        let stream = k.create_stream(i32::try_from(shards).unwrap_or(1)).await;
        fill(&k, &stream).await;
        let (mut ratios, mut plain_rates) = (Vec::new(), Vec::new());
        for round in 0..rounds() {
            let plain_first = round % 2 == 0;
            let mut plain = Duration::ZERO;
            let mut runtime = Duration::ZERO;
            for step in 0..2 {
                if (step == 0) == plain_first {
                    let t = Instant::now();
                    let n = plain_loop(&k, &stream, shards).await;
                    plain = t.elapsed();
                    assert_eq!(n, records());
                } else {
                    let t = Instant::now();
                    through_runtime(&k, &stream).await;
                    runtime = t.elapsed();
                }
            }
            let rate = |d: Duration| records() as f64 / d.as_secs_f64();
            plain_rates.push(rate(plain));
            ratios.push(plain.as_secs_f64() / runtime.as_secs_f64());
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "{{\"shards\":{shards},\"records\":{},\"rounds\":{},\"plain_rps_median\":{:.0},\"runtime_over_plain_median\":{:.2},\"runtime_over_plain\":{:.2?},\"load\":\"{}\"}}",
            records(),
            rounds(),
            median(plain_rates),
            median(ratios.clone()),
            ratios,
            load.split(' ').next().unwrap_or("?"),
        );
        k.delete(&stream).await;
    }
}
