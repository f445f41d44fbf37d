//! How a fleet spreads its leases: by count (the default) or by measured load
//! (docs/algorithm.md, "Balancing by load"). Every worker of a fleet must use the same mode.

use std::time::Duration;

use crate::error::{Error, Result};

/// What the balancer evens out ([`Config::with_balance`](crate::Config::with_balance)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum Balance {
    /// Every worker holds the same number of leases, within one. The default.
    #[default]
    ByCount,
    /// Every worker carries about the same load: the busy time of its processors, as shares of
    /// its cores ([`LoadBalance::cores`]). Each worker
    /// measures its leases and publishes its heaviest ones in its heartbeat record.
    ByLoad(LoadBalance),
}

impl Balance {
    /// Balancing by load with the default settings ([`LoadBalance::default`]).
    pub fn by_load() -> Self {
        Balance::ByLoad(LoadBalance::default())
    }
}

/// The settings of [`Balance::ByLoad`].
///
/// Loads are in busy seconds per second (1.0 keeps one core busy). A worker is overloaded when
/// its load exceeds the fleet's mean by more than `max(floor, margin × mean)`; a lease moves
/// only by claim and graceful handoff, only when the move lowers the pair's peak by more than the
/// floor, and not again within the cooldown. So a quiet stream (every load near 0) balances by
/// count and never moves a lease for its noise. Each lease's load is smoothed over six balance
/// intervals (30 s at the default heartbeat), so a shift of load is acted on within about that
/// time, and a burst shorter than it is not.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoadBalance {
    /// The relative margin over the mean load. Default 0.15.
    pub margin: f64,
    /// The absolute floor, in busy seconds per second. Default 0.005 (half a percent of a core).
    /// Each lease also costs `2 × floor` on top of its load, so the floor must stay well below a
    /// typical lease's load: at 0.02 a fleet whose leases averaged 0.031 balanced its lease
    /// counts rather than its loads (the `skew` bench stopped at 1.37 max/mean against 1.05).
    pub floor: f64,
    /// How long a lease stays where it went before it can move for load again. Default: 6
    /// balance intervals (30 s at the default heartbeat).
    pub cooldown: Option<Duration>,
    /// The cores a worker's processors share. A batch is credited, for each instant it is in its
    /// processor, its share of them: all of it while no more batches than cores are in progress,
    /// `cores / k` with `k` in progress. So a lease's load does not count the time it waited for
    /// a core its worker's other leases were using. Default: the machine's available parallelism.
    pub cores: Option<usize>,
}

impl Default for LoadBalance {
    fn default() -> Self {
        LoadBalance { margin: 0.15, floor: 0.005, cooldown: None, cores: None }
    }
}

impl LoadBalance {
    /// Sets the relative margin.
    pub fn with_margin(mut self, margin: f64) -> Self {
        self.margin = margin;
        self
    }

    /// Sets the absolute floor.
    pub fn with_floor(mut self, floor: f64) -> Self {
        self.floor = floor;
        self
    }

    /// Sets the cooldown.
    pub fn with_cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = Some(cooldown);
        self
    }

    /// Sets the cores a worker's processors share (at least 1).
    pub fn with_cores(mut self, cores: usize) -> Self {
        self.cores = Some(cores);
        self
    }

    /// The cores: the ones set, or the machine's available parallelism (1 if unknown).
    pub fn cores_or_default(&self) -> usize {
        self.cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The cooldown with `balance_interval`: the one set, or 6 balance intervals.
    pub fn cooldown_or_default(&self, balance_interval: Duration) -> Duration {
        self.cooldown.unwrap_or_else(|| balance_interval.saturating_mul(6))
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.margin.is_finite() || !(0.0..=10.0).contains(&self.margin) {
            return Err(Error::Config(format!(
                "balance margin must be within 0.0..=10.0, got {}",
                self.margin
            )));
        }
        if !self.floor.is_finite() || !(0.0..=1000.0).contains(&self.floor) || self.floor == 0.0 {
            return Err(Error::Config(format!(
                "balance floor must be greater than 0 and at most 1000 (busy seconds per second), \
                 got {}: a floor of 0 would move leases for noise",
                self.floor
            )));
        }
        if self.cores == Some(0) {
            return Err(Error::Config("balance cores must be at least 1".into()));
        }
        if self.cooldown.is_some_and(|c| c > crate::config::MAX_DURATION) {
            return Err(Error::Config("balance cooldown must be at most 30 days".into()));
        }
        Ok(())
    }
}
