//! A background producer writing records to the in-memory stream(s) at a steady rate, with random
//! partition keys (so records spread over every shard of every stream), while join, leave and
//! crash are measured.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::task::JoinHandle;

use crate::streams::BenchStreams;

/// A running producer; [`stop`](Producer::stop) it before counting deliveries.
#[derive(Debug)]
pub struct Producer {
    task: JoinHandle<()>,
}

impl Producer {
    /// Starts writing `rate` records per second to `streams` (a stream's share of the rate is its
    /// share of the shards).
    pub fn start(streams: BenchStreams, rate: u64, seed: Option<u64>) -> Self {
        let mut rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut written: u64 = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tick.tick().await;
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                while written < due {
                    streams.put_random(&mut rng, format!("record {written}").into_bytes());
                    written += 1;
                }
            }
        });
        Producer { task }
    }

    /// Stops writing and waits until it has stopped. Every put is synchronous, so no record is
    /// half-written. (Dropping a producer stops it too, without waiting.)
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
