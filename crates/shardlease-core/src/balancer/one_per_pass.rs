//! STUB: the Go-port baseline (being written).
use super::{Balancer, Plan, Snapshot};

/// At most one new lease per pass.
#[derive(Clone, Debug, Default)]
pub struct OnePerPassBalancer;

impl Balancer for OnePerPassBalancer {
    fn plan(&self, _snapshot: &Snapshot) -> Plan {
        Plan::default()
    }
}
