//! [`ClusterLink`]: the store's connection to a Redis Cluster, replaced by a fresh one when its
//! calls keep failing at the connection level.
//!
//! The `redis` crate's cluster client learns a new slot map only when a node says so (`MOVED`,
//! `CLUSTERDOWN`, …) or when a connection to a node breaks. A master that dies outright does
//! the second (its connections are refused), and the client finds the promoted replica by
//! itself. A master that *hangs* (a frozen process or VM, a partition that drops packets) does
//! neither: its TCP connection stays open, every call to it times out, and the client keeps
//! sending the namespace's calls (which all go to the master of one slot) to it long after the
//! cluster promoted its replica. So after [`RELINK_AFTER`] calls in a row failed with a timeout
//! or a connection error, the link connects again from the seed nodes in the background (the
//! new client reads the cluster's current slot map) and swaps the new connection in. Calls made
//! meanwhile fail retryably, as they did; the runtime repeats them.
//!
//! Change subscriptions are cluster connections of their own, and the channel's slot is the
//! namespace's: a subscription on a hung master goes silent without ending. So connecting again
//! also ends every subscription of the store ([`ClusterLink::relinked`]): the runtime
//! subscribes again (on the current slot map) and lists once.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, RedisResult};
use shardlease_core::store::Redactor;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cluster::Seeds;

/// How many calls in a row must fail at the connection level before the link connects again.
pub(crate) const RELINK_AFTER: u32 = 3;

/// A cluster connection shared by every clone of a store, replaced when it stops answering.
pub(crate) struct ClusterLink {
    /// What a new connection is opened from.
    seeds: Seeds,
    /// The cluster as shown in messages (password redacted).
    target: String,
    redactor: Redactor,
    /// The connection calls use now.
    current: Mutex<ClusterConnection>,
    /// Calls in a row that failed at the connection level (reset by any call that got an
    /// answer).
    failures: AtomicU32,
    /// Whether a new connection is being opened.
    relinking: AtomicBool,
    /// When the last attempt to connect again started: attempts are at least `spacing` apart,
    /// so an unreachable cluster is not hammered by one attempt per failed call.
    last_attempt: Mutex<Option<Instant>>,
    spacing: Duration,
    /// How many times a new connection was swapped in (subscriptions end on a change).
    relinks: watch::Sender<u64>,
}

impl ClusterLink {
    /// A link over `conn`, opened from `seeds`.
    pub(crate) fn new(
        seeds: Seeds,
        conn: ClusterConnection,
        target: String,
        redactor: Redactor,
    ) -> Arc<ClusterLink> {
        let spacing = seeds.response_timeout();
        Arc::new(ClusterLink {
            seeds,
            target,
            redactor,
            current: Mutex::new(conn),
            failures: AtomicU32::new(0),
            relinking: AtomicBool::new(false),
            last_attempt: Mutex::new(None),
            spacing,
            relinks: watch::Sender::new(0),
        })
    }

    /// Resolves when a new connection is next swapped in (or the link is gone).
    pub(crate) fn relinked(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut relinks = self.relinks.subscribe();
        async move {
            let _ = relinks.changed().await;
        }
    }

    /// The connection to run a call on (a cheap clone).
    pub(crate) fn connection(&self) -> ClusterConnection {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes note of a call's outcome: an answer (even an error reply) resets the count, a
    /// timeout or a connection error adds to it and, once there are [`RELINK_AFTER`] in a row,
    /// starts connecting again.
    pub(crate) fn observe<T>(self: &Arc<Self>, result: &RedisResult<T>) {
        match result {
            Ok(_) => self.failures.store(0, Ordering::Relaxed),
            Err(e) if is_connection_trouble(e) => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                if failures >= RELINK_AFTER {
                    self.relink();
                }
            }
            Err(_) => self.failures.store(0, Ordering::Relaxed),
        }
    }

    /// Opens a new connection from the seeds in a task of its own (one at a time, attempts at
    /// least `spacing` apart) and swaps it in. Outside a Tokio runtime it does nothing.
    fn relink(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        {
            let mut last = self.last_attempt.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < self.spacing) {
                return;
            }
            if self.relinking.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        warn!(
            target_cluster = %self.target,
            failures = self.failures.load(Ordering::Relaxed),
            "calls to the Redis Cluster keep failing at the connection level; connecting again \
             from the seed nodes to read the current slot map"
        );
        let link = Arc::clone(self);
        runtime.spawn(async move {
            let _done = Relinking(&link.relinking);
            match link.seeds.connect(&link.target, &link.redactor).await {
                Ok(conn) => {
                    *link.current.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                    link.failures.store(0, Ordering::Relaxed);
                    link.relinks.send_modify(|n| *n = n.wrapping_add(1));
                    info!(target_cluster = %link.target, "connected to the Redis Cluster again");
                }
                Err(e) => {
                    warn!(target_cluster = %link.target, error = %e, "connecting again failed");
                }
            }
        });
    }
}

/// Clears the `relinking` flag when the attempt ends, however it ends.
struct Relinking<'a>(&'a AtomicBool);

impl Drop for Relinking<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Whether `e` says the node did not answer (a timeout, a refused or dropped connection, no
/// connection to the slot's node), as opposed to an error reply from a node.
pub(crate) fn is_connection_trouble(e: &RedisError) -> bool {
    e.code().is_none()
        && (e.is_timeout()
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.kind() == ErrorKind::ClusterConnectionNotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_broken_connections_are_trouble_and_replies_are_not() {
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
        ] {
            let e = RedisError::from(std::io::Error::new(kind, "boom"));
            assert!(is_connection_trouble(&e), "{kind:?}");
        }
        let no_node = RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connection"));
        assert!(is_connection_trouble(&no_node));
        for code in ["MOVED", "CLUSTERDOWN", "NOSCRIPT", "WRONGTYPE", "ERR"] {
            let e = redis::make_extension_error(code.to_owned(), Some("x".to_owned()));
            assert!(!is_connection_trouble(&e), "{code}");
        }
    }
}
