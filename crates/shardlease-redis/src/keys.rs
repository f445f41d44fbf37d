//! The key layout of one namespace.
//!
//! Every key of a namespace starts with the same hash tag `{<prefix>:<namespace>}`, so on Redis
//! Cluster they all live in one slot and a Lua script may touch a record and its index together.
//! Braces and `%` in the prefix or namespace are percent-encoded, so the tag always ends at the
//! first `}` and two namespaces can never produce the same key (`app` vs `app}:lease:x`, say).
//!
//! ```text
//! {shardlease:orders}:lease:<lease key>   hash: one lease
//! {shardlease:orders}:leases              sorted set (all scores 0): the lease keys
//! {shardlease:orders}:worker:<worker id>  hash: one worker's heartbeat record
//! {shardlease:orders}:workers             sorted set (all scores 0): the worker ids
//! {shardlease:orders}:fleet               string: the fleet signal (a decimal token)
//! {shardlease:orders}:changes             pub/sub channel (not a key): change notices
//! ```
//!
//! The fleet signal is neither a `lease:` nor a `worker:` key nor a member of an index, so no
//! listing ever reads it; every worker `GET`s it each heartbeat and lists the worker records
//! only when its token moved (`LeaseStore::write_fleet_signal`).
//!
//! Releases before random versions also kept a `{shardlease:orders}:version` counter. Nothing
//! reads or writes it any more; [`scan_pattern`](Keys::scan_pattern) still matches it, so deleting
//! a namespace removes it.

/// The keys of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Keys {
    /// `{prefix:namespace}`, escaped.
    base: String,
}

/// Percent-encodes the characters that would end or confuse the hash tag.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

impl Keys {
    /// The layout of `namespace` under `prefix`.
    pub(crate) fn new(prefix: &str, namespace: &str) -> Self {
        Keys { base: format!("{{{}:{}}}", escape(prefix), escape(namespace)) }
    }

    /// The hash tag every key of the namespace starts with.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The hash holding lease `key`.
    pub(crate) fn lease(&self, key: &str) -> String {
        format!("{}:lease:{key}", self.base)
    }

    /// The sorted set of the namespace's lease keys.
    pub(crate) fn lease_index(&self) -> String {
        format!("{}:leases", self.base)
    }

    /// The hash holding worker `id`'s heartbeat record.
    pub(crate) fn worker(&self, id: &str) -> String {
        format!("{}:worker:{id}", self.base)
    }

    /// The sorted set of the namespace's worker ids.
    pub(crate) fn worker_index(&self) -> String {
        format!("{}:workers", self.base)
    }

    /// The string holding the namespace's fleet signal (`LeaseStore::write_fleet_signal`).
    pub(crate) fn fleet_signal(&self) -> String {
        format!("{}:fleet", self.base)
    }

    /// The namespace's change channel (pub/sub, not a key; hash-tagged all the same, so a
    /// cluster's sharded pub/sub would keep it beside the keys).
    pub(crate) fn changes(&self) -> String {
        format!("{}:changes", self.base)
    }

    /// A `SCAN MATCH` pattern matching every key of the namespace and nothing else.
    pub(crate) fn scan_pattern(&self) -> String {
        let mut out = String::with_capacity(self.base.len() + 2);
        for c in self.base.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('*');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash tag Redis Cluster would use for `key`.
    fn hash_tag(key: &str) -> &str {
        match key.find('{') {
            Some(open) => match key[open + 1..].find('}') {
                Some(len) if len > 0 => &key[open + 1..open + 1 + len],
                _ => key,
            },
            None => key,
        }
    }

    #[test]
    fn every_key_shares_one_hash_tag() {
        for (prefix, ns) in [("shardlease", "orders"), ("p", "a}b{c"), ("x{y", "%7D")] {
            let k = Keys::new(prefix, ns);
            let tag = hash_tag(k.base());
            assert!(!tag.is_empty());
            for key in [
                k.lease("shardId-1"),
                k.lease("}{weird}"),
                k.lease_index(),
                k.worker("w-1"),
                k.worker_index(),
                k.fleet_signal(),
            ] {
                assert_eq!(hash_tag(&key), tag, "{key}");
            }
        }
    }

    #[test]
    fn namespaces_never_collide() {
        let a = Keys::new("p", "a");
        let evil = Keys::new("p", "a}:lease:b");
        assert_ne!(a.lease("b}:lease:c"), evil.lease("c"));
        assert_ne!(Keys::new("p", "a}b"), Keys::new("p", "a%7Db"));
        assert_eq!(Keys::new("shardlease", "orders").lease("s1"), "{shardlease:orders}:lease:s1");
        assert_eq!(Keys::new("shardlease", "orders").fleet_signal(), "{shardlease:orders}:fleet");
    }

    #[test]
    fn scan_pattern_escapes_glob_characters() {
        assert_eq!(Keys::new("p", "a*b[c]").scan_pattern(), "{p:a\\*b\\[c\\]}*");
    }
}
