//! A lease's busy time as its share of the worker's cores (docs/algorithm.md, "Balancing by
//! load", "Measure").
//!
//! Why it exists: the wall time a batch spends in its processor includes the time it waited for a
//! core its worker's other leases were using. Counted as the lease's load, that waiting made a
//! lease look heavier the busier its co-located leases were: after a move the receiver's other
//! leases looked heavier and the giver's lighter, so the balancer moved leases again (the `skew`
//! bench: 19 moves in 120 s of steady state with one core per worker, 2 with no core limit).
//!
//! Here a worker's `cores` are shared out among the leases inside a batch at each instant: with
//! `k` of them busy, each is credited `min(1, cores / k)` seconds per second. A worker's total is
//! then never more than its cores and is exactly its cores' busy share when its processors take
//! turns at them, whatever the order; a lease's figure no longer grows with the queue in front of
//! it. The credit is kept as one running integral per worker, `G(t) = ∫ min(1, cores / k(s)) ds`,
//! updated whenever `k` changes: a batch from `t0` to `t1` is credited `G(t1) − G(t0)`, O(1) per
//! batch.
//!
//! The clock is passed in, so tests drive it with constructed instants.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A worker's share-out of its cores among the batches in progress.
#[derive(Debug)]
pub(crate) struct CoreShare {
    cores: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Batches in progress.
    busy: usize,
    /// When `credit` was last brought up to date.
    at: Option<Instant>,
    /// Seconds credited to each batch that has been in progress since the start: `G(at)`.
    credit: f64,
}

impl CoreShare {
    /// A worker with `cores` cores (at least 1).
    pub(crate) fn new(cores: usize) -> Arc<Self> {
        Arc::new(CoreShare {
            cores: cores.max(1) as f64,
            state: Mutex::new(State { busy: 0, at: None, credit: 0.0 }),
        })
    }

    /// Brings `G` up to `now` at the current number of batches in progress.
    fn advance(&self, s: &mut State, now: Instant) {
        if let Some(at) = s.at {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            if s.busy > 0 {
                s.credit += dt * (self.cores / s.busy as f64).min(1.0);
            }
        }
        if s.at.is_none_or(|at| now > at) {
            s.at = Some(now);
        }
    }

    /// A batch starts at `now`; the guard's [`BatchShare::end`] gives its credit.
    pub(crate) fn start(self: &Arc<Self>, now: Instant) -> BatchShare {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.advance(&mut s, now);
        s.busy += 1;
        BatchShare { share: Some(self.clone()), from: s.credit }
    }

    /// The credit so far of a batch that started at credit `from`, and (with `end`) its end.
    fn stop(&self, from: f64, now: Instant, end: bool) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.advance(&mut s, now);
        if end {
            s.busy = s.busy.saturating_sub(1);
        }
        Duration::try_from_secs_f64((s.credit - from).max(0.0)).unwrap_or(Duration::ZERO)
    }
}

/// One batch in progress. Dropped without [`BatchShare::end`] (the task stopped in the middle of
/// a batch) it still leaves the count of batches in progress.
#[derive(Debug)]
pub(crate) struct BatchShare {
    share: Option<Arc<CoreShare>>,
    from: f64,
}

impl BatchShare {
    /// The batch ends at `now`: the core time it is credited with.
    pub(crate) fn end(mut self, now: Instant) -> Duration {
        match self.share.take() {
            Some(share) => share.stop(self.from, now, true),
            None => Duration::ZERO,
        }
    }
}

impl Drop for BatchShare {
    fn drop(&mut self) {
        if let Some(share) = self.share.take() {
            share.stop(self.from, Instant::now(), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1000.0
    }

    #[test]
    fn a_batch_alone_is_credited_its_wall_time() {
        let share = CoreShare::new(1);
        let t = Instant::now();
        let b = share.start(t);
        assert!((ms(b.end(at(t, 40))) - 40.0).abs() < 1e-6);
    }

    #[test]
    fn batches_taking_turns_at_one_core_share_its_time_and_never_exceed_it() {
        // a: 0..30, b: 10..50, c: 20..30 on one core. 0..10 a alone; 10..20 a, b (1/2 each);
        // 20..30 a, b, c (1/3 each); 30..50 b alone.
        let share = CoreShare::new(1);
        let t = Instant::now();
        let a = share.start(t);
        let b = share.start(at(t, 10));
        let c = share.start(at(t, 20));
        let ca = ms(a.end(at(t, 30)));
        let cc = ms(c.end(at(t, 30)));
        let cb = ms(b.end(at(t, 50)));
        let third = 10.0 / 3.0;
        assert!((ca - (10.0 + 5.0 + third)).abs() < 1e-6, "{ca}");
        assert!((cc - third).abs() < 1e-6, "{cc}");
        assert!((cb - (5.0 + third + 20.0)).abs() < 1e-6, "{cb}");
        // The worker's total is the time its core was in use: 50 ms, not the 90 ms of wall time.
        assert!((ca + cb + cc - 50.0).abs() < 1e-6);
    }

    #[test]
    fn with_enough_cores_each_batch_keeps_its_wall_time() {
        let share = CoreShare::new(2);
        let t = Instant::now();
        let a = share.start(t);
        let b = share.start(t);
        assert!((ms(a.end(at(t, 20))) - 20.0).abs() < 1e-6);
        assert!((ms(b.end(at(t, 30))) - 30.0).abs() < 1e-6);
        // Three on two cores: 2/3 each.
        let a = share.start(at(t, 100));
        let b = share.start(at(t, 100));
        let c = share.start(at(t, 100));
        for x in [a, b, c] {
            assert!((ms(x.end(at(t, 130))) - 20.0).abs() < 1e-6);
        }
    }

    #[test]
    fn a_batch_dropped_midway_leaves_the_count() {
        let share = CoreShare::new(1);
        let t = Instant::now();
        let a = share.start(t);
        drop(share.start(t));
        // Only `a` is in progress now: from here on it is credited in full.
        let now = Instant::now();
        let credited = ms(a.end(now + Duration::from_millis(100)));
        assert!(credited >= 100.0 - 1e-6, "{credited}");
    }
}
