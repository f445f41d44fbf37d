//! Where each record of a namespace lives in etcd's flat key space.
//!
//! ```text
//! <prefix>/<namespace>/lease/<lease key>     one key per lease
//! <prefix>/<namespace>/worker/<worker id>    one key per worker record
//! <prefix>/<namespace>/fleet-signal          the fleet signal (one key)
//! ```
//!
//! The namespace is escaped (`%` → `%25`, `/` → `%2F`) so that no namespace's keys fall inside
//! another's range: without it, namespace `a` would list namespace `a/lease`'s records. Lease keys
//! and worker ids come last and are kept as they are (a lease key may hold `/`). The fleet
//! signal's key has no `/` after the namespace, so it lies outside both the lease and the worker
//! range (no listing returns it), inside the namespace's range (deleting the namespace deletes
//! it), and `Keys::classify` calls it `Record::FleetSignal`, which the watch ignores.

/// The etcd keys of one namespace.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    /// `<prefix>/<escaped namespace>/`
    root: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, namespace: &str) -> Keys {
        let ns = namespace.replace('%', "%25").replace('/', "%2F");
        Keys { root: format!("{prefix}/{ns}/") }
    }

    /// Every key of the namespace starts with this.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    pub(crate) fn lease_prefix(&self) -> String {
        format!("{}lease/", self.root)
    }

    pub(crate) fn worker_prefix(&self) -> String {
        format!("{}worker/", self.root)
    }

    pub(crate) fn lease(&self, key: &str) -> String {
        format!("{}lease/{key}", self.root)
    }

    pub(crate) fn worker(&self, id: &str) -> String {
        format!("{}worker/{id}", self.root)
    }

    /// The key of the namespace's fleet signal.
    pub(crate) fn fleet_signal(&self) -> String {
        format!("{}{FLEET_SIGNAL}", self.root)
    }

    /// What a key of this namespace holds.
    pub(crate) fn classify<'a>(&self, key: &'a [u8]) -> Record<'a> {
        let Some(rest) = key.strip_prefix(self.root.as_bytes()) else { return Record::Other };
        if let Some(k) = rest.strip_prefix(b"lease/") {
            Record::Lease(k)
        } else if let Some(id) = rest.strip_prefix(b"worker/") {
            Record::Worker(id)
        } else if rest == FLEET_SIGNAL.as_bytes() {
            Record::FleetSignal
        } else {
            Record::Other
        }
    }
}

/// The last part of the fleet signal's key (no `/`: outside the lease and worker ranges).
const FLEET_SIGNAL: &str = "fleet-signal";

/// The kind of record a key holds, with the lease key or worker id it names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    Lease(&'a [u8]),
    Worker(&'a [u8]),
    FleetSignal,
    Other,
}

/// The end of the range of every key starting with `prefix` (etcd's "prefix + 1").
pub(crate) fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_never_share_a_range() {
        let a = Keys::new("p", "a");
        let nested = Keys::new("p", "a/lease");
        assert!(!nested.lease("x").starts_with(&a.lease_prefix()));
        assert_eq!(nested.root(), "p/a%2Flease/");
        assert_eq!(Keys::new("p", "50%").root(), "p/50%25/");
    }

    /// The signal is in the namespace's range (a namespace delete removes it) and in neither the
    /// lease range nor the worker range (no listing returns it).
    #[test]
    fn the_fleet_signal_is_in_the_namespace_and_in_no_listing() {
        let k = Keys::new("p", "ns");
        let signal = k.fleet_signal();
        let within = |prefix: &str| {
            signal.starts_with(prefix) && signal.as_bytes() < range_end(prefix).as_slice()
        };
        assert_eq!(signal, "p/ns/fleet-signal");
        assert!(within(k.root()));
        assert!(!within(&k.lease_prefix()) && !within(&k.worker_prefix()));
    }

    #[test]
    fn keys_are_classified_and_ranges_end_after_the_prefix() {
        let k = Keys::new("p", "ns");
        assert_eq!(k.classify(k.lease("s/1").as_bytes()), Record::Lease(b"s/1"));
        assert_eq!(k.classify(k.worker("w").as_bytes()), Record::Worker(b"w"));
        assert_eq!(k.classify(b"p/other/lease/x"), Record::Other);
        assert_eq!(k.classify(k.fleet_signal().as_bytes()), Record::FleetSignal);
        assert_eq!(k.classify(Keys::new("p", "other").fleet_signal().as_bytes()), Record::Other);
        assert_eq!(range_end("ab/"), b"ab0".to_vec());
    }
}
