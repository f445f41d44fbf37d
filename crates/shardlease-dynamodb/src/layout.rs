//! Where a namespace's records live in the table: the key layout, in one place.
//!
//! One table holds any number of namespaces. Every item has a string partition key `pk` and a
//! string sort key `sk`:
//!
//! ```text
//! pk = "<namespace>/leases"    sk = <lease key>   one item per lease
//! pk = "<namespace>/workers"   sk = <worker id>   one item per worker's heartbeat record
//! pk = "<namespace>/fleet"     sk = "signal"      the fleet signal (one item, see below)
//! ```
//!
//! A namespace's leases are therefore one item collection, read with a `Query` on its partition
//! key (never a `Scan` of the table, which would read every other namespace's items too), and its
//! worker records another, so listing the workers every heartbeat reads the workers only. A lease
//! key ends in `/leases`, a worker key in `/workers` and the fleet signal's in `/fleet`, so two
//! partition keys are equal only for the same namespace and the same kind of record; no escaping
//! is needed.
//!
//! The fleet signal (`LeaseStore::write_fleet_signal`) is one item in a partition of its own, so
//! neither listing (a `Query` on the lease or the worker partition key) ever returns it, and
//! reading it is one `GetItem` of a known key.

/// The partition key attribute (a string).
pub(crate) const PK: &str = "pk";
/// The sort key attribute (a string): the lease key or the worker id.
pub(crate) const SK: &str = "sk";
/// The sort key of the fleet signal's item (under [`Layout::fleet`]).
pub(crate) const FLEET_SIGNAL: &str = "signal";

/// The partition keys of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    leases: String,
    workers: String,
    fleet: String,
}

impl Layout {
    /// The layout of `namespace`.
    pub(crate) fn new(namespace: &str) -> Self {
        Layout {
            leases: format!("{namespace}/leases"),
            workers: format!("{namespace}/workers"),
            fleet: format!("{namespace}/fleet"),
        }
    }

    /// The partition key of the namespace's leases.
    pub(crate) fn leases(&self) -> &str {
        &self.leases
    }

    /// The partition key of the namespace's worker records.
    pub(crate) fn workers(&self) -> &str {
        &self.workers
    }

    /// The partition key of the namespace's fleet signal (one item, sort key [`FLEET_SIGNAL`]).
    pub(crate) fn fleet(&self) -> &str {
        &self.fleet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_never_share_a_partition_key() {
        let names = ["a", "a/leases", "a/workers", "a/fleet", "a/", "", "b"];
        let mut keys = std::collections::HashSet::new();
        for n in names {
            let l = Layout::new(n);
            assert!(keys.insert(l.leases().to_owned()), "{n}");
            assert!(keys.insert(l.workers().to_owned()), "{n}");
            assert!(keys.insert(l.fleet().to_owned()), "{n}");
        }
        assert_eq!(Layout::new("orders").leases(), "orders/leases");
    }
}
