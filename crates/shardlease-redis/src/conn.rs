//! [`RedisConnection`]: the one connection type the store runs its commands on, whether it
//! speaks to a single server (a [`ConnectionManager`]) or to a Redis Cluster (the `redis`
//! crate's async [`ClusterConnection`]).
//!
//! Every command of the store names keys of one namespace, which share one hash tag and so one
//! slot: the cluster connection routes each command (a script by its first key, a pipeline by
//! its first keyed command) to the master of that slot and follows `MOVED`/`ASK` by itself.
//! The one command without a key, `SCAN`, is routed by hand to the master of the namespace's
//! slot ([`RedisConnection::query_in_slot_of`]).
//!
//! The store itself runs its calls on a [`StoreConn`], the same thing with the cluster
//! connection behind a [`ClusterLink`], which replaces it when it stops answering
//! (see `crate::relink`).

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use crate::relink::ClusterLink;

/// A connection to a single Redis server or to a Redis Cluster, shared by every clone of a
/// store (cloning it is cheap). It implements [`ConnectionLike`], so commands and pipelines of
/// the [`redis`](crate::redis) crate run on it directly.
#[derive(Clone)]
pub enum RedisConnection {
    /// A single server (or a given connection manager).
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConnection::Single(_) => "RedisConnection::Single",
            RedisConnection::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl RedisConnection {
    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConnection::Cluster(_))
    }

    /// Runs `cmd`, which names no key, on the server holding `key`: the one server, or the
    /// master of `key`'s slot on a cluster.
    pub async fn query_in_slot_of<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        key: &str,
    ) -> RedisResult<T> {
        match self {
            RedisConnection::Single(conn) => cmd.query_async(conn).await,
            RedisConnection::Cluster(conn) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = conn.route_command(cmd.clone(), routing).await?;
                T::from_redis_value(value).map_err(Into::into)
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(conn) => conn.req_packed_command(cmd),
            RedisConnection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(conn) => conn.get_db(),
            RedisConnection::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The store's connection: a single server's connection manager, or the link to a cluster
/// (cloning it is cheap). Every cluster call's outcome is reported to the link.
#[derive(Clone)]
pub(crate) enum StoreConn {
    /// A single server (or a given connection manager).
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(Arc<ClusterLink>),
}

impl StoreConn {
    /// The connection as the public API shows it (a cluster's current connection).
    pub(crate) fn public(&self) -> RedisConnection {
        match self {
            StoreConn::Single(manager) => RedisConnection::Single(manager.clone()),
            StoreConn::Cluster(link) => RedisConnection::Cluster(link.connection()),
        }
    }

    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, StoreConn::Cluster(_))
    }

    /// [`RedisConnection::query_in_slot_of`].
    pub(crate) async fn query_in_slot_of<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        key: &str,
    ) -> RedisResult<T> {
        match self {
            StoreConn::Single(conn) => cmd.query_async(conn).await,
            StoreConn::Cluster(link) => {
                let result =
                    RedisConnection::Cluster(link.connection()).query_in_slot_of(cmd, key).await;
                link.observe(&result);
                result
            }
        }
    }
}

impl ConnectionLike for StoreConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            StoreConn::Single(conn) => conn.req_packed_command(cmd),
            StoreConn::Cluster(link) => Box::pin(async move {
                let result = link.connection().req_packed_command(cmd).await;
                link.observe(&result);
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            StoreConn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            StoreConn::Cluster(link) => Box::pin(async move {
                let result = link.connection().req_packed_commands(pipeline, offset, count).await;
                link.observe(&result);
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Single(conn) => conn.get_db(),
            StoreConn::Cluster(_) => 0,
        }
    }
}
