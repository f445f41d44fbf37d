//! The skewed stream of the `skew` scenario: each shard's share of the records is drawn once
//! from a Zipf distribution, and a producer writes every shard at its own rate, each rate shaken
//! by a random factor (`±noise`) that is drawn again every period, so the loads the workers
//! measure drift the way a real stream's do while the long-run shares stay put.
//!
//! Every record carries the instant it was written (microseconds since the producer's start), so
//! the processor can tell how far behind it is.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardlease::{LeaseKey, MemorySource};
use tokio::task::JoinHandle;

/// Draws `n` weights independently from Zipf(`exponent`) on `1..=max`: P(k) ∝ k^-exponent. With
/// exponent 1.1 and max 10, most shards get 1 or 2 and about one in thirty gets 10, i.e. a few hot
/// shards carry ten times a cold one's records.
pub fn zipf_weights(n: usize, exponent: f64, max: u32, rng: &mut StdRng) -> Vec<u32> {
    let max = max.max(1);
    let mass: Vec<f64> = (1..=max).map(|k| f64::from(k).powf(-exponent)).collect();
    let total: f64 = mass.iter().sum();
    (0..n)
        .map(|_| {
            let mut u = rng.random::<f64>() * total;
            for (i, m) in mass.iter().enumerate() {
                if u < *m {
                    return u32::try_from(i + 1).unwrap_or(max);
                }
                u -= m;
            }
            max
        })
        .collect()
}

/// The seconds since `base` a record's payload carries.
pub fn stamp(base: Instant) -> [u8; 8] {
    u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX).to_le_bytes()
}

/// The instant a payload written by [`stamp`] names, if it is one.
pub fn stamped(base: Instant, data: &[u8]) -> Option<Instant> {
    let micros = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    base.checked_add(Duration::from_micros(micros))
}

/// A producer writing each shard at its own rate.
#[derive(Debug)]
pub struct SkewedProducer {
    task: JoinHandle<()>,
}

impl SkewedProducer {
    /// Starts writing `rates[i]` records per second to `shards[i]`, each rate multiplied by a
    /// factor drawn uniformly from `1 ± noise` every `period`; payloads are stamped from `base`.
    pub fn start(
        source: MemorySource,
        shards: Vec<LeaseKey>,
        rates: Vec<f64>,
        noise: f64,
        period: Duration,
        base: Instant,
        seed: u64,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let task = tokio::spawn(async move {
            let mut factors = vec![1.0; rates.len()];
            // Records owed to each shard: the rate integrated over time, minus what was written.
            let mut owed = vec![0.0f64; rates.len()];
            let mut last = Instant::now();
            let mut redraw = last;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = Instant::now();
                if now >= redraw {
                    for f in &mut factors {
                        *f = 1.0 + noise * (rng.random::<f64>() * 2.0 - 1.0);
                    }
                    redraw = now + period;
                }
                let dt = now.saturating_duration_since(last).as_secs_f64();
                last = now;
                for (i, shard) in shards.iter().enumerate() {
                    let (Some(rate), Some(f), Some(o)) =
                        (rates.get(i), factors.get(i), owed.get_mut(i))
                    else {
                        continue;
                    };
                    *o += rate * f * dt;
                    while *o >= 1.0 {
                        if source.put_to_shard(shard, stamp(base).to_vec()).is_err() {
                            break;
                        }
                        *o -= 1.0;
                    }
                }
            }
        });
        SkewedProducer { task }
    }

    /// Stops writing and waits until it has stopped.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for SkewedProducer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn zipf_weights_are_skewed_and_seeded() {
        let mut rng = StdRng::seed_from_u64(7);
        let w = zipf_weights(10_000, 1.1, 10, &mut rng);
        assert!(w.iter().all(|&k| (1..=10).contains(&k)));
        let ones = w.iter().filter(|&&k| k == 1).count();
        let tens = w.iter().filter(|&&k| k == 10).count();
        // P(1) = 1/H ≈ 0.37 and P(10) ≈ 0.03 for Zipf(1.1) on 1..=10.
        assert!((3_300..4_200).contains(&ones), "{ones}");
        assert!((150..450).contains(&tens), "{tens}");
        let again = zipf_weights(10_000, 1.1, 10, &mut StdRng::seed_from_u64(7));
        assert_eq!(w, again);
        assert_eq!(zipf_weights(5, 1.1, 1, &mut rng), vec![1; 5]);
    }

    #[test]
    fn stamps_read_back() {
        let base = Instant::now();
        let s = stamp(base);
        let at = stamped(base, &s).unwrap();
        assert!(at >= base && at <= Instant::now());
        assert!(stamped(base, b"short").is_none());
    }
}
