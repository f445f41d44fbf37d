//! Change notification on etcd: a peer acts on a graceful leave at once, not at its next
//! heartbeat.
//!
//! The taker runs with a 60 s heartbeat (and the default ratios: a 150 s balance interval, a
//! 300 s failover timeout) and no jitter; the leaver beats every 200 ms with the same failover
//! timeout. Without notification it can only learn that the
//! leaver's record vanished from its own heartbeat loop's listing of the worker records, and a
//! listing comes no sooner than a quarter heartbeat (15 s) after the previous beat, even when it
//! beats early to publish a change. The leave starts right after one of its beats is observed, so
//! a takeover within 12 s of that beat (the leaver's shutdown included) can only come from the
//! watch; it normally takes a fraction of a second. The 3 s between the two leave room for a
//! stalled machine to notice the beat late without letting a polled listing pass for the watch.
//! Runs on the server named by `SHARDLEASE_TEST_ETCD_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardlease_core::{Config, MemorySource, Position, ShardSource, Worker, WorkerHandle};
use shardlease_testkit::cluster::wait_until;
use shardlease_testkit::recorder::Recorder;
use shardlease_testkit::suite::with_scope;

const SHARDS: usize = 8;

fn start(
    cfg: Config,
    store: Arc<dyn shardlease_core::store::LeaseStore>,
    source: &MemorySource,
    rec: &Recorder,
) -> WorkerHandle {
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    Worker::builder(cfg, store, src, rec.factory()).build().unwrap().start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_leave_is_taken_over_before_the_takers_next_heartbeat() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let Some(factory) = common::factory().await else { return };
    with_scope(&factory, "watch_leave", |scope| async move {
        let (ns, store) = scope.fresh_store().await;
        let source = MemorySource::new(SHARDS);
        for i in 0..200 {
            source.put(&format!("k{i}"), format!("v{i}"));
        }
        let rec = Recorder::new();
        let every = Duration::from_millis(20);

        // A fleet shares one failover timeout: with its own (5 × 200 ms) the fast worker would
        // judge the slow one dead between two of its beats, take its leases and remove its record.
        let hb = Duration::from_secs(60);
        let fast_cfg = Config::new(ns.as_str())
            .unwrap()
            .with_heartbeat(Duration::from_millis(200))
            .with_failover_timeout(hb * 5)
            .with_worker_id("fast")
            .with_initial_position(Position::TrimHorizon);
        let fast = start(fast_cfg, store.clone(), &source, &rec);
        wait_until("the fast worker holds every lease", Duration::from_secs(30), every, || async {
            fast.held_leases().len() == SHARDS
        })
        .await
        .unwrap();

        let slow_cfg = Config::new(ns.as_str())
            .unwrap()
            .with_heartbeat(hb)
            .with_worker_id("slow")
            .with_initial_position(Position::TrimHorizon)
            .with_jitter(0.0);
        let slow = start(slow_cfg, store.clone(), &source, &rec);
        // Its first pass comes one heartbeat after its first beat; it claims half, and the fast
        // worker hands them over.
        wait_until("the slow worker holds half", hb * 3, every, || async {
            slow.held_leases().len() == SHARDS / 2 && fast.held_leases().len() == SHARDS / 2
        })
        .await
        .unwrap();

        // Leave right after one of the slow worker's beats: its next listing of worker records
        // without notification is at least a quarter heartbeat away.
        let beats = slow.stats().heartbeats;
        wait_until("a beat of the slow worker", hb * 2, Duration::from_millis(5), || async {
            slow.stats().heartbeats > beats
        })
        .await
        .unwrap();
        let beat_seen = Instant::now();
        fast.shutdown().await;
        let window = Duration::from_secs(12);
        let left = window.saturating_sub(beat_seen.elapsed());
        wait_until("the slow worker holds every lease", left, every, || async {
            slow.held_leases().len() == SHARDS
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no takeover within {window:?} of the taker's beat, the leaver's shutdown \
                 included (quarter heartbeat 15 s): {e}"
            )
        });
        println!(
            "graceful leave taken over {:?} after the beat (shutdown included)",
            beat_seen.elapsed()
        );
        assert!(slow.is_running() && !slow.is_fenced());
        assert_eq!(rec.duplicates(), 0, "a graceful handoff and release deliver nothing twice");
        slow.shutdown().await;
    })
    .await;
}
