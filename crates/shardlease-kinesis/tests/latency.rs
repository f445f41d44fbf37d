//! Delivery latency, put → processor, through the runtime (one worker, in-memory store) on the
//! in-process ferrokinesis: enhanced fan-out next to polling (the default reading settings: a
//! call every 200 ms at most, 1 s after a read that found nothing; and a tighter 200 ms idle
//! interval), for 1 and 16 shards, in one run, at two paces: busy (a put every 20 ms, so a
//! polling reader always finds something) and trickle (a put every 300 ms, so it often idles).
//! Records are put one at a time with random partition keys, once the worker holds every lease;
//! the figure is the time from just before `PutRecord` to the processor's call. The emulator's subscriptions look for new
//! records every 200 ms (Kinesis pushes within about 70 ms), so fan-out figures here are
//! pessimistic. A measurement, not a check: ignored by default, one line per case. Run it with
//!
//! ```text
//! cargo test --release -p shardlease-kinesis --test latency -- --ignored --nocapture
//! ```

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ferro::{fan_out, ferrokinesis};
use common::{eventually, Emulator};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{processor_fn, Config, Position, ShardSource, Worker};
use shardlease_kinesis::ReadConfig;

/// Records per case at a pace: `SHARDLEASE_LATENCY_RECORDS` (default 200) when busy, a third of
/// that when trickling.
fn records(pace: Duration) -> usize {
    let n = std::env::var("SHARDLEASE_LATENCY_RECORDS").ok().and_then(|v| v.parse().ok());
    let n = n.unwrap_or(200_usize).max(3);
    if pace >= TRICKLE {
        n / 3
    } else {
        n
    }
}

/// Time between two puts: busy and trickle.
const BUSY: Duration = Duration::from_millis(20);
const TRICKLE: Duration = Duration::from_millis(300);

#[derive(Clone, Copy, Debug)]
enum Mode {
    FanOut,
    Polling,
    PollingTight,
}

async fn source(k: &Emulator, stream: &str, mode: Mode) -> Arc<dyn ShardSource> {
    let read = ReadConfig::default();
    match mode {
        Mode::FanOut => Arc::new(k.fan_out_source(stream, fan_out("latency"), read).await),
        Mode::Polling => Arc::new(k.source(stream, read).await),
        Mode::PollingTight => {
            let mut read = read;
            read.idle_interval = read.min_call_interval;
            Arc::new(k.source(stream, read).await)
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latencies of one case, sorted.
async fn run(k: &Emulator, shards: i32, mode: Mode, pace: Duration) -> Vec<Duration> {
    let stream = k.create_stream(shards).await;
    let source = source(k, &stream, mode).await;
    let n = records(pace);
    let put_at: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
    let got_at: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
    let factory = {
        let got_at = got_at.clone();
        processor_fn(move |_ctx, batch| {
            let got_at = got_at.clone();
            async move {
                let now = Instant::now();
                let mut got = got_at.lock().unwrap_or_else(|p| p.into_inner());
                for r in batch.records.iter() {
                    let i: usize = String::from_utf8_lossy(&r.data).parse().unwrap_or(usize::MAX);
                    if let Some(slot) = got.get_mut(i) {
                        slot.get_or_insert(now);
                    }
                }
                Ok(())
            }
        })
    };
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("latency".parse().unwrap_or_else(|e| panic!("{e}"))));
    let config = Config::new("latency")
        .unwrap_or_else(|e| panic!("{e}"))
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon)
        .with_worker_id("w");
    let worker = Worker::builder(config, store, source, factory)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
        .start();
    let want = usize::try_from(shards).unwrap_or(0);
    eventually("every lease held", || async { (worker.held_leases().len() == want).then_some(()) })
        .await;
    // Let every reader reach the tip (a first read, a first subscription) before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut next = tokio::time::Instant::now();
    for i in 0..n {
        tokio::time::sleep_until(next).await;
        next += pace;
        put_at.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(Instant::now());
        k.put(&stream, &format!("{:016x}", rand::random::<u64>()), i.to_string()).await;
    }
    eventually("every record processed", || async {
        got_at.lock().unwrap_or_else(|p| p.into_inner()).iter().all(Option::is_some).then_some(())
    })
    .await;
    worker.shutdown().await;
    let put = put_at.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let got = got_at.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut lat: Vec<Duration> = put
        .iter()
        .zip(&got)
        .filter_map(|(p, g)| Some(g.as_ref()?.duration_since(*p.as_ref()?)))
        .collect();
    lat.sort();
    lat
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run with --ignored --nocapture"]
async fn delivery_latency_fan_out_vs_polling() {
    let k = ferrokinesis(Duration::from_secs(300)).await;
    println!("delivery latency, put -> processor");
    for pace in [BUSY, TRICKLE] {
        for shards in [1, 16] {
            for mode in [Mode::FanOut, Mode::Polling, Mode::PollingTight] {
                let lat = run(&k, shards, mode, pace).await;
                println!(
                    "put every {pace:>5?} {shards:>2} shards {:<13} n {:>3} p50 {:>6.1} ms  \
                     p99 {:>6.1} ms  max {:>6.1} ms",
                    format!("{mode:?}"),
                    lat.len(),
                    percentile(&lat, 0.5).as_secs_f64() * 1000.0,
                    percentile(&lat, 0.99).as_secs_f64() * 1000.0,
                    lat.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
                );
            }
        }
    }
}
