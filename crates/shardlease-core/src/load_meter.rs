//! A lease's load figure: its busy seconds per second, smoothed over time (docs/algorithm.md,
//! "Balancing by load", "Measure").
//!
//! Why it exists: the balancer plans on these figures, and a figure that is wrong while a lease
//! is young plans wrong moves. The meter started as an exponential average seeded with its first
//! sample, and that first sample is the worst one it takes: a task that started a moment before
//! a heartbeat is sampled over a fraction of a second, most of it spent on the records that waited
//! while the lease had no owner. A starting fleet's figures came out at twice their true level and
//! took several time constants to come down, and the `skew` bench moved ten leases on them in its
//! first ten seconds and then moved them back. Here every sample weighs by the time it covers, and
//! the average is divided by the total weight so far (the bias correction of an exponential
//! average started at zero): until the time constant has passed it is the plain average of
//! everything measured since the task started, and afterwards the usual exponential average.

use std::time::Duration;

use tokio::time::Instant;

/// The running state of one lease's load figure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadMeter {
    /// Busy nanoseconds counted at the last sample.
    busy: u64,
    /// When the last sample was taken (or the meter started).
    at: Instant,
    /// The exponential average, started at 0.
    sum: f64,
    /// The weight the average has gathered: `1 − e^(−t/τ)` for `t` measured so far.
    weight: f64,
}

impl LoadMeter {
    /// A meter that starts measuring at `now` with `busy` nanoseconds counted so far.
    pub(crate) fn new(busy: u64, now: Instant) -> Self {
        LoadMeter { busy, at: now, sum: 0.0, weight: 0.0 }
    }

    /// Takes a sample at `now` with `busy` nanoseconds counted in all, smoothed with time constant
    /// `tau`; returns the figure (0 until some time has been measured).
    pub(crate) fn sample(&mut self, busy: u64, now: Instant, tau: Duration) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        if dt > 0.0 {
            let rate = busy.saturating_sub(self.busy) as f64 / 1e9 / dt;
            let alpha = 1.0 - (-dt / tau.as_secs_f64().max(1e-3)).exp();
            self.sum += alpha * (rate - self.sum);
            self.weight += alpha * (1.0 - self.weight);
            self.busy = busy;
            self.at = now;
        }
        self.figure()
    }

    /// The figure as of the last sample.
    pub(crate) fn figure(&self) -> f64 {
        if self.weight > 0.0 {
            let f = self.sum / self.weight;
            if f.is_finite() {
                return f.max(0.0);
            }
        }
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_short_first_sample_weighs_only_for_the_time_it_covers() {
        // Started 0.1 s before the first beat and busy all of it (the catch-up), then a quarter
        // busy: seeded with its first sample the figure read 1.0 and then about 0.86.
        let t = Instant::now();
        let mut m = LoadMeter::new(0, t);
        let tau = Duration::from_secs(5);
        m.sample(SEC / 10, t + Duration::from_millis(100), tau);
        let f = m.sample(SEC / 10 + SEC / 4, t + Duration::from_millis(1100), tau);
        // The time-weighted average of the 1.1 s: (0.1 + 0.25) / 1.1 = 0.318.
        let expected = (0.1 + 0.25) / 1.1;
        assert!((f - expected).abs() < 0.01, "{f}");
    }

    #[test]
    fn until_the_time_constant_it_is_the_plain_average_and_then_it_forgets() {
        let t = Instant::now();
        let tau = Duration::from_secs(5);
        let mut m = LoadMeter::new(0, t);
        // One second at 0.6, one at 0.2: about the average, 0.4.
        m.sample(6 * SEC / 10, t + Duration::from_secs(1), tau);
        let f = m.sample(8 * SEC / 10, t + Duration::from_secs(2), tau);
        assert!((f - 0.4).abs() < 0.03, "{f}");
        // Then 30 s at 0.1: the early seconds are forgotten.
        let mut busy = 8 * SEC / 10;
        let mut f = 0.0;
        for s in 3..=32 {
            busy += SEC / 10;
            f = m.sample(busy, t + Duration::from_secs(s), tau);
        }
        assert!((f - 0.1).abs() < 0.01, "{f}");
    }

    #[test]
    fn no_time_measured_is_no_load_and_a_clock_standing_still_changes_nothing() {
        let t = Instant::now();
        let tau = Duration::from_secs(5);
        let mut m = LoadMeter::new(0, t);
        assert_eq!(m.sample(SEC, t, tau), 0.0);
        let f = m.sample(SEC / 2, t + Duration::from_secs(1), tau);
        assert!((f - 0.5).abs() < 1e-9, "{f}");
        assert_eq!(m.sample(2 * SEC, t + Duration::from_secs(1), tau), f);
        // A counter that went backwards (it cannot, but a store cannot make us panic) is 0 busy.
        let g = m.sample(0, t + Duration::from_secs(2), tau);
        assert!(g < f && g >= 0.0, "{g}");
    }
}
