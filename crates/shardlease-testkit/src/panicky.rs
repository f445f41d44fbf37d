//! Plug-ins that panic: a [`Balancer`] and a [`ShardSource`] wrapper that panic now and then, for
//! simulations and tests of the runtime's containment of user code (a panicking `plan` plans
//! nothing for that pass; a panicking `list_shards` is a failed listing).
//!
//! Each wrapper draws its panics from an RNG seeded by the caller, so a simulation replays from
//! its seed, and can be switched off ([`clear`](PanickyBalancer::clear)) so a test's final checks
//! run fault-free. The panics' messages begin with [`INJECTED_PANIC`], for a panic hook that keeps
//! them quiet. Keep an `Arc` of the wrapper to switch it and read its count, and hand the runtime
//! a clone as `Arc<dyn Balancer>` / `Arc<dyn ShardSource>`.
//!
//! ```
//! use std::sync::Arc;
//!
//! use shardlease_core::balancer::{Balancer, GreedyBalancer};
//! use shardlease_testkit::panicky::PanickyBalancer;
//!
//! let balancer = Arc::new(PanickyBalancer::new(Arc::new(GreedyBalancer::default()), 7, 0.1));
//! let for_workers: Arc<dyn Balancer> = balancer.clone();
//! # let _ = for_workers;
//! // ... the fleet runs, and some passes panic ...
//! balancer.clear();
//! assert_eq!(balancer.rate(), 0.0);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardlease_core::balancer::{Balancer, Plan, Snapshot};
use shardlease_core::{LeaseKey, Position, Result, ShardInfo, ShardReader, ShardSource};

pub use crate::faults::INJECTED_PANIC;

/// A seeded draw of panics: a rate that can change while the wrapper is in use, and a count.
struct Draw {
    state: Mutex<(StdRng, f64)>,
    panics: AtomicU64,
}

impl Draw {
    fn new(seed: u64, rate: f64) -> Self {
        Draw { state: Mutex::new((StdRng::seed_from_u64(seed), clamp(rate))), panics: 0.into() }
    }

    fn lock(&self) -> MutexGuard<'_, (StdRng, f64)> {
        // The guard is never held across a panic (the draw returns first); a poisoned lock is
        // still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_rate(&self, rate: f64) {
        self.lock().1 = clamp(rate);
    }

    fn rate(&self) -> f64 {
        self.lock().1
    }

    /// Whether this call panics (no RNG draw while the rate is 0).
    fn hit(&self) -> bool {
        let hit = {
            let mut s = self.lock();
            let rate = s.1;
            rate > 0.0 && s.0.random_bool(rate)
        };
        if hit {
            self.panics.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }
}

/// A probability: clamped to `0.0..=1.0`, NaN meaning 0.
fn clamp(rate: f64) -> f64 {
    if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    }
}

/// A plug-in wrapper that panics with a probability (drawn from a seeded RNG) in the calls it
/// names, and otherwise does what the plug-in it wraps does: [`PanickyBalancer`] (its `plan`),
/// [`PanickySource`] (its `list_shards`; every other method, the ones with a default body
/// included, is the wrapped source's).
pub struct Panicky<T: ?Sized> {
    inner: Arc<T>,
    draw: Draw,
}

/// A [`Balancer`] whose `plan` panics now and then.
pub type PanickyBalancer = Panicky<dyn Balancer>;

/// A [`ShardSource`] whose `list_shards` panics now and then.
pub type PanickySource = Panicky<dyn ShardSource>;

impl<T: ?Sized> Panicky<T> {
    /// Wraps `inner`; each call it names panics with probability `rate` (clamped to
    /// `0.0..=1.0`, NaN meaning 0), drawn from an RNG seeded with `seed`.
    pub fn new(inner: Arc<T>, seed: u64, rate: f64) -> Self {
        Panicky { inner, draw: Draw::new(seed, rate) }
    }

    /// Changes the probability of a panic (clamped, NaN meaning 0).
    pub fn set_rate(&self, rate: f64) {
        self.draw.set_rate(rate);
    }

    /// The probability of a panic.
    pub fn rate(&self) -> f64 {
        self.draw.rate()
    }

    /// Stops the panics (the count and the RNG state are kept).
    pub fn clear(&self) {
        self.draw.set_rate(0.0);
    }

    /// How many calls panicked.
    pub fn panics(&self) -> u64 {
        self.draw.panics()
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Panicky<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Panicky")
            .field("inner", &self.inner)
            .field("rate", &self.rate())
            .field("panics", &self.panics())
            .finish()
    }
}

impl Balancer for PanickyBalancer {
    fn plan(&self, snapshot: &Snapshot) -> Plan {
        if self.draw.hit() {
            panic!("{INJECTED_PANIC}: Balancer::plan");
        }
        self.inner.plan(snapshot)
    }
}

#[async_trait]
impl ShardSource for PanickySource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        if self.draw.hit() {
            panic!("{INJECTED_PANIC}: ShardSource::list_shards");
        }
        self.inner.list_shards().await
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        self.inner.open(shard, from).await
    }

    fn initial_position(&self, shard: &LeaseKey) -> Option<Position> {
        self.inner.initial_position(shard)
    }

    fn retired(&self, key: &LeaseKey) -> bool {
        self.inner.retired(key)
    }

    fn keys_name_streams(&self) -> bool {
        self.inner.keys_name_streams()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use shardlease_core::balancer::GreedyBalancer;
    use shardlease_core::store::Lease;
    use shardlease_core::MemorySource;

    use super::*;

    fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
        p.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    /// Which of `n` plans panicked.
    fn plans(b: &PanickyBalancer, n: usize) -> Vec<bool> {
        let snapshot = Snapshot::new(
            "w1".into(),
            vec![Lease::new("s-1", Position::TrimHorizon)],
            BTreeSet::from(["w1".into()]),
        );
        (0..n)
            .map(|_| match catch_unwind(AssertUnwindSafe(|| b.plan(&snapshot))) {
                Ok(plan) => {
                    assert_eq!(plan.take_count, 1, "the wrapped balancer plans: {plan:?}");
                    false
                }
                Err(p) => {
                    assert!(panic_text(p).starts_with(INJECTED_PANIC));
                    true
                }
            })
            .collect()
    }

    #[test]
    fn a_balancer_panics_at_its_rate_replays_from_its_seed_and_clears() {
        let greedy: Arc<dyn Balancer> = Arc::new(GreedyBalancer::default());
        let b = PanickyBalancer::new(greedy.clone(), 3, 0.3);
        let drawn = plans(&b, 200);
        let hits = drawn.iter().filter(|p| **p).count();
        assert!((30..=90).contains(&hits), "about 30% of 200 plans, got {hits}");
        assert_eq!(b.panics(), hits as u64);
        assert_eq!(drawn, plans(&PanickyBalancer::new(greedy.clone(), 3, 0.3), 200), "same seed");
        assert_ne!(drawn, plans(&PanickyBalancer::new(greedy, 4, 0.3), 200), "another seed");
        b.clear();
        assert_eq!(b.rate(), 0.0);
        assert!(plans(&b, 50).iter().all(|p| !p), "cleared: no panics");
        b.set_rate(f64::NAN);
        assert_eq!(b.rate(), 0.0);
        b.set_rate(2.0);
        assert!(plans(&b, 5).iter().all(|p| *p));
        assert!(format!("{b:?}").contains("GreedyBalancer"));
    }

    #[tokio::test]
    async fn a_source_panics_only_when_listing_and_forwards_the_rest() {
        let source = PanickySource::new(Arc::new(MemorySource::new(3)), 1, 1.0);
        let listing = AssertUnwindSafe(source.list_shards());
        let p = futures::FutureExt::catch_unwind(listing).await.unwrap_err();
        assert!(panic_text(p).starts_with(INJECTED_PANIC));
        let key = LeaseKey::from("shard-0");
        assert_eq!(source.initial_position(&key), None);
        assert!(!source.retired(&key));
        assert!(!source.keys_name_streams());
        assert_eq!(source.panics(), 1);
        source.clear();
        let shards = source.list_shards().await.unwrap();
        assert_eq!(shards.len(), 3);
        source.open(&shards[0].id, &Position::TrimHorizon).await.unwrap();
        assert_eq!(source.panics(), 1);
    }
}
