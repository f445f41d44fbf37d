//! `shardlease-balancer-bench`: times one pass of the pure balancer on large synthetic fleets and
//! prints one JSON object per line, so a change that slows the balancer shows in figures.
//!
//! Shapes: 10,000 leases × 100 workers and 100,000 leases × 1,000 workers, each for a worker that
//! just joined (owns nothing: it takes nothing and claims its whole share, the slowest case) and
//! for a worker that owns its share (the common case). The figure is the median of several runs.
//!
//! ```text
//! cargo run --release -p shardlease-bench --bin shardlease-balancer-bench [-- RUNS]
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use shardlease::balancer::{Balancer, GreedyBalancer, Snapshot};
use shardlease::store::Lease;
use shardlease::{Epoch, LeaseKey, Position, WorkerId};

/// A balanced fleet of `workers` owning `leases` leases, plus one newcomer that owns nothing.
fn fleet(leases: usize, workers: usize) -> (Vec<Lease>, BTreeSet<WorkerId>, WorkerId) {
    let ids: Vec<WorkerId> =
        (0..workers).map(|w| WorkerId::new(format!("worker-{w:05}"))).collect();
    let all = (0..leases)
        .map(|i| {
            let mut l =
                Lease::new(LeaseKey::new(format!("shardId-{i:012}")), Position::TrimHorizon);
            l.owner = Some(ids[i % workers].clone());
            l.epoch = Epoch(1);
            l
        })
        .collect();
    let newcomer = WorkerId::new("worker-newcomer");
    let mut live: BTreeSet<WorkerId> = ids.into_iter().collect();
    live.insert(newcomer.clone());
    (all, live, newcomer)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    for (leases, workers) in [(10_000, 100), (100_000, 1_000)] {
        let (all, live, newcomer) = fleet(leases, workers);
        let owner = WorkerId::new("worker-00000");
        for (role, me) in [("joining", newcomer), ("owner", owner)] {
            let snapshot = Snapshot::new(me, all.clone(), live.clone()).with_seed(7);
            let mut times = Vec::with_capacity(runs);
            let mut claims = 0;
            for _ in 0..runs {
                let start = Instant::now();
                let plan = GreedyBalancer::default().plan(&snapshot);
                times.push(start.elapsed());
                claims = plan.claims.len();
            }
            println!(
                "{{\"scenario\":\"balancer\",\"leases\":{leases},\"workers\":{},\"worker\":\"{role}\",\"runs\":{runs},\"claims\":{claims},\"median_ms\":{:.3}}}",
                workers + 1,
                median(times).as_secs_f64() * 1e3
            );
        }
    }
}
