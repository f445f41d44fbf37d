//! STUB: the greedy balancer (being written).
use super::{Balancer, Plan, Snapshot};

/// The default balancer.
#[derive(Clone, Debug, Default)]
pub struct GreedyBalancer;

impl Balancer for GreedyBalancer {
    fn plan(&self, _snapshot: &Snapshot) -> Plan {
        Plan::default()
    }
}
