//! Change notification for PostgreSQL: `NOTIFY` in the statement that makes each change, and a
//! `LISTEN`ing connection per subscription (see `LeaseStore::subscribe_changes`).
//!
//! **What is announced.** Every lease creation and deletion, every update the core writes with
//! `update_lease` (an ownership change: take, claim, release, handoff, finish), and a worker
//! record appearing (a join) or being removed (a leave, or a dead worker's record collected). A
//! checkpoint, which the core writes with `update_lease_quietly`, and a heartbeat that updates an
//! existing record announce nothing, so notification adds no store writes and no reads in a
//! steady state.
//!
//! **In the same statement.** The notifying statements wrap the plain one in a data-modifying
//! CTE, `WITH w AS (<write> RETURNING ..) SELECT pg_notify($c, $p) FROM w`: the notice is sent
//! only when the write happened, and PostgreSQL delivers it when the write commits, never
//! before and never for a write rolled back. It costs no extra round trip.
//!
//! **Channel and payload.** One channel per namespace and table prefix:
//! `<prefix>changes_<16 hex digits>`, the digits a stable hash (FNV-1a) of the namespace, since a
//! namespace may be longer than PostgreSQL's 63-byte identifiers. Two namespaces whose hashes
//! collide share a channel; the payload names the namespace, and a listener drops notices of
//! another one. The payload is `<kind><namespace length>:<namespace><key or worker id>` with kind
//! `L` (a lease), `J` (a worker record appeared) or `X` (one was removed): at most a few hundred
//! bytes, far below PostgreSQL's 8,000-byte limit. A payload that does not parse becomes
//! `StoreChange::Unknown` (a listing of both kinds), never an error.
//!
//! **Losing the connection.** A subscription holds one connection of its own (not one of the
//! store's pool). When it drops, the stream ends, and the runtime subscribes again and lists
//! once; notices sent in between are lost, and that listing finds what they said.

use shardlease_core::store::StoreChange;
use shardlease_core::{LeaseKey, Namespace, WorkerId};

/// The namespace's channel, and the payloads written to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Channel {
    /// The channel name (an identifier of at most 31 + 8 + 16 = 55 bytes).
    name: String,
    namespace: Namespace,
}

/// What a notice says.
const LEASE: char = 'L';
const JOINED: char = 'J';
const LEFT: char = 'X';

impl Channel {
    /// The channel of `namespace` under table `prefix` (already validated).
    pub(crate) fn new(prefix: &str, namespace: &Namespace) -> Self {
        let hash = fnv1a(namespace.as_str().as_bytes());
        Channel { name: format!("{prefix}changes_{hash:016x}"), namespace: namespace.clone() }
    }

    /// The channel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn payload(&self, kind: char, name: &str) -> String {
        let ns = self.namespace.as_str();
        format!("{kind}{}:{ns}{name}", ns.len())
    }

    /// The payload announcing a write of lease `key`.
    pub(crate) fn lease(&self, key: &str) -> String {
        self.payload(LEASE, key)
    }

    /// The payload announcing that worker `id`'s record appeared.
    pub(crate) fn joined(&self, id: &str) -> String {
        self.payload(JOINED, id)
    }

    /// The payload announcing that worker `id`'s record was removed.
    pub(crate) fn left(&self, id: &str) -> String {
        self.payload(LEFT, id)
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    /// The change a payload announces: `None` for another namespace's notice (a shared channel),
    /// `Unknown` for a payload that does not parse.
    pub(crate) fn parse(&self, payload: &str) -> Option<StoreChange> {
        let Some(parsed) = split(payload) else { return Some(StoreChange::Unknown) };
        let (kind, namespace, name) = parsed;
        if namespace != self.namespace.as_str() {
            return None;
        }
        Some(match kind {
            LEASE => StoreChange::Lease {
                key: LeaseKey::new(name.to_owned()),
                before: None,
                after: None,
            },
            JOINED => StoreChange::Worker { id: WorkerId::new(name.to_owned()), present: true },
            LEFT => StoreChange::Worker { id: WorkerId::new(name.to_owned()), present: false },
            _ => StoreChange::Unknown,
        })
    }
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
/// `<kind><len>:<namespace><name>` into its parts.
fn split(payload: &str) -> Option<(char, &str, &str)> {
    let mut chars = payload.chars();
    let kind = chars.next()?;
    let rest = chars.as_str();
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let namespace = rest.get(..len)?;
    let name = rest.get(len..)?;
    Some((kind, namespace, name))
}

/// FNV-1a, 64 bits: a hash that is the same in every process and every version of this crate
/// (the standard library's is not promised to be), so every worker of a namespace finds the
/// same channel.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(feature = "postgres")]
/// Wraps a write statement (without a `RETURNING` clause) so that it notifies `$channel` with
/// `$payload` (the next two placeholders, `$first` and `$first + 1`) when it wrote a row.
pub(crate) fn notifying(write: &str, first: usize) -> String {
    format!("WITH w AS ({write} RETURNING 1) SELECT pg_notify(${first}, ${}) FROM w", first + 1)
}

#[cfg(feature = "postgres")]
/// The worker upsert, notifying only when it inserted a new record (a join), not when it
/// updated one (a heartbeat): `xmax` is 0 on a row version that an `INSERT` created.
pub(crate) fn notifying_insert(upsert: &str, first: usize) -> String {
    format!(
        "WITH w AS ({upsert} RETURNING (xmax = 0) AS inserted) \
         SELECT pg_notify(${first}, ${}) FROM w WHERE w.inserted",
        first + 1
    )
}

#[cfg(feature = "postgres")]
/// Opens a connection of its own to the database of `pool`, `LISTEN`s on `channel`, and
/// returns the notices as a stream that ends when the connection does.
pub(crate) async fn subscribe(
    pool: &sqlx::PgPool,
    channel: &Channel,
) -> shardlease_core::Result<shardlease_core::store::ChangeStream> {
    use futures::StreamExt;
    use sqlx::postgres::{PgListener, PgPoolOptions};
    use tracing::debug;
    let fail = |what: &str, e: sqlx::Error| {
        crate::errors::backend(crate::dialect::Dialect::Postgres, what, e)
    };
    // A pool of one for the listener alone: it must not take one of the store's connections
    // for as long as the subscription lives.
    let options = (*pool.connect_options()).clone();
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options)
        .await
        .map_err(|e| fail("open the listening connection", e))?;
    let mut listener =
        PgListener::connect_with(&own).await.map_err(|e| fail("open the listener", e))?;
    // A lost connection ends the stream at once; the runtime's listing covers the gap.
    listener.eager_reconnect(false);
    listener.listen(channel.name()).await.map_err(|e| fail("LISTEN", e))?;
    debug!(channel = channel.name(), "listening for lease changes");
    let state = (listener, own, channel.clone());
    Ok(futures::stream::unfold(state, |(mut listener, own, channel)| async move {
        loop {
            match listener.try_recv().await {
                Ok(Some(notice)) => {
                    if let Some(change) = channel.parse(notice.payload()) {
                        return Some((change, (listener, own, channel)));
                    }
                }
                Ok(None) => {
                    debug!("the listening connection was lost");
                    return None;
                }
                Err(e) => {
                    debug!(error = %e, "the listening connection failed");
                    return None;
                }
            }
        }
    })
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(ns: &str) -> Channel {
        Channel::new("shardlease_", &Namespace::new(ns).unwrap())
    }

    #[test]
    fn payloads_round_trip() {
        let c = channel("orders");
        let key = "shardId-000000000001";
        assert_eq!(
            c.parse(&c.lease(key)),
            Some(StoreChange::Lease { key: LeaseKey::new(key), before: None, after: None })
        );
        assert_eq!(
            c.parse(&c.joined("w:1")),
            Some(StoreChange::Worker { id: WorkerId::new("w:1"), present: true })
        );
        assert_eq!(
            c.parse(&c.left("w:1")),
            Some(StoreChange::Worker { id: WorkerId::new("w:1"), present: false })
        );
    }

    #[test]
    fn a_namespace_that_prefixes_another_is_told_apart() {
        let short = channel("app");
        let long = channel("app:2");
        assert_eq!(short.parse(&long.lease("k")), None, "another namespace's notice is dropped");
        assert_eq!(long.parse(&short.lease("2:k")), None);
    }

    #[test]
    fn garbage_is_an_unknown_change_not_an_error() {
        let c = channel("orders");
        for bad in ["", "L", "Lx:orders", "L99:orders", "Q6:ordersk"] {
            assert_eq!(c.parse(bad), Some(StoreChange::Unknown), "{bad:?}");
        }
    }

    #[test]
    fn channel_names_are_stable_short_identifiers() {
        let c = channel(&"n".repeat(200));
        assert!(c.name().len() <= 63, "{}", c.name());
        assert_eq!(channel("orders").name(), channel("orders").name());
        assert_ne!(channel("orders").name(), channel("orders2").name());
        // FNV-1a's published test vector: the hash must not change between versions.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn notifying_statements_wrap_the_write() {
        let s = notifying("DELETE FROM t WHERE a = $1", 2);
        assert_eq!(
            s,
            "WITH w AS (DELETE FROM t WHERE a = $1 RETURNING 1) SELECT pg_notify($2, $3) FROM w"
        );
    }
}
