//! The Go KCL port's behaviour, kept as a baseline to measure the greedy balancer against.
//!
//! The port took at most one lease per balance pass, so a lone worker needed a hundred passes to
//! pick up a hundred shards (the reported bug), and a fleet starting together needed about
//! `leases / workers` passes each. This balancer reproduces that rate on top of the greedy rules:
//! it computes the [`GreedyBalancer`] plan and caps both the takes and the claims at one per pass.
//! Handoffs, cleared claims and take-overs are left as the greedy plan decides them. It is useful
//! in benchmarks and simulations, so it is built only with the `test-util` feature (and for the
//! balancer's own tests).

use super::{Balancer, GreedyBalancer, Plan, Snapshot};

/// At most one new lease and one claim per pass; otherwise the greedy plan (feature `test-util`:
/// a baseline for benchmarks and simulations, not a production policy).
///
/// Build it with `OnePerPassBalancer::default()`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct OnePerPassBalancer {
    greedy: GreedyBalancer,
}

impl Balancer for OnePerPassBalancer {
    fn plan(&self, snapshot: &Snapshot) -> Plan {
        let mut plan = self.greedy.plan(snapshot);
        plan.take_count = plan.take_count.min(1);
        plan.claims.truncate(1);
        plan
    }
}
