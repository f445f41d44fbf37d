//! # shardlease-redis
//!
//! A [`LeaseStore`](shardlease_core::store::LeaseStore) on Redis, standalone or Redis Cluster.
//! Open one with [`RedisStore::builder`] (a URL or a connection manager of your own, plus
//! options) or, through the `shardlease` facade with its `redis` feature, by URL:
//! `redis://[[user]:password@]host[:port][/db][?namespace=NAME&key_prefix=PREFIX&notify=BOOL]`.
//!
//! ## Redis Cluster
//!
//! `redis+cluster://[[user]:password@]host:port[,host:port…][?options]` (`rediss+cluster://`
//! with the `tls` feature) names a cluster by seed nodes; the options, the redaction of the
//! password and the errors are those of `redis://`. The store uses the `redis` crate's async
//! cluster client, which reads the slot map from the seeds and follows `MOVED`/`ASK` itself.
//! Every key of a namespace shares one hash tag, so one slot, and the scripts run unchanged on
//! its master. While a master fails over, calls fail with retryable errors (a timeout,
//! `CLUSTERDOWN`) until a replica took over. Replication is asynchronous: writes acknowledged by
//! a master just before it died may be missing on the replica that replaces it, which the
//! workers handle as a store that lost writes (see "Durability"; versions are random, so none is
//! handed out twice). Change notification works too: the scripts' `PUBLISH` reaches every node,
//! and a subscription is a RESP3 cluster connection of its own that ends when one of its
//! connections drops. [`RedisStore::manager`] is `None` on a cluster; use
//! [`RedisStore::connection`].
//!
//! `rediss://` (TLS) needs this crate's `tls` feature (`redis-tls` on the facade): rustls with the
//! aws-lc-rs provider, the crypto stack the AWS SDK crates of this workspace already use, so a full
//! build carries one TLS stack. It is off by default because aws-lc-sys is a C build of a minute or
//! two. Servers are verified (certificate and host name) against the system's roots, or against a
//! private CA given to `RedisStoreBuilder::tls_root_certificates_pem` or named by the URL:
//! `rediss://:PASSWORD@host:6380/?ca_file=/etc/ca.pem[&cert_file=client.pem&key_file=client.key]`
//! (see the [TLS guide][tls]).
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_redis::RedisStore;
//! let store = RedisStore::builder()
//!     .url("redis://127.0.0.1:6379/0")
//!     .namespace("orders")
//!     .key_prefix("shardlease")
//!     .connect()
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! ## Key layout
//!
//! Each lease is a hash, each worker record is a hash, and two sorted sets (every score 0, so
//! they sort by name and page with `ZRANGE … BYLEX`) index the namespace's lease keys and worker
//! ids. Every key of a namespace starts with the hash tag `{<prefix>:<namespace>}`, so on Redis
//! Cluster they share one slot, and a script may touch a record and its index at once:
//!
//! ```text
//! {shardlease:orders}:lease:shardId-000000000001   HGETALL → key, owner, epoch, checkpoint,
//!                                                   parents, claim, attributes, version
//! {shardlease:orders}:leases                       ZSET of lease keys
//! {shardlease:orders}:worker:host-42-1f2e3d4c       HGETALL → id, beat, updated_at_millis,
//!                                                   lease_count, changes, load, capacity,
//!                                                   lease_loads
//! {shardlease:orders}:workers                      ZSET of worker ids
//! ```
//!
//! Earlier releases also kept a `{shardlease:orders}:version` counter; nothing uses it any more,
//! and [`RedisStore::delete_namespace`] removes it with every other key of the namespace.
//!
//! Fields are plain text an operator can read with `HGETALL`: numbers in decimal, the checkpoint
//! as JSON of `Position` (`{"kind":"sequence","seq":"4959…","sub":0}`), parents, claim and
//! attributes as JSON, a worker's published lease loads as lines `<load> <lease key>` (absent
//! when it publishes none). A record that does not decode (a missing or garbled field, or a key of
//! another type) is reported as `Error::Corrupt` by `get_lease`/`update_lease`/`delete_lease`
//! and as a `Listing::corrupt` entry by the listings; the other records keep working. A listing's
//! corrupt entry is named by its index member, which is the lease key (or worker id) exactly;
//! only a member that is not UTF-8 (which no lease key can be) is named by its lossy UTF-8
//! rendering.
//!
//! ## Why Lua
//!
//! Compare-and-set must read the version, compare and write with nothing in between. A Lua
//! script runs atomically on the server in one round trip and, when the comparison fails, returns
//! the current record in the same reply, so a `Conflict` carries it at no extra cost.
//! `WATCH`/`MULTI` would need three round trips and client-side retries. The scripts are sent
//! with `EVALSHA` and loaded again by themselves when the server does not know them (after a
//! restart). The version a write gives a record is a random 63-bit number drawn by the client
//! and passed to the script, so a version never repeats for a key: not after a delete and
//! re-create, and not after the server lost writes (a restart without persistence, a failover to
//! a lagging replica), which would roll a counter kept in Redis back with the data.
//! `remove_worker_if` is a script too: it deletes a worker's record only while its `beat` field
//! is still the one the caller saw. The batch writes (`update_leases`, `create_leases`) are one
//! script over up to 128 leases (all in the namespace's slot), running the single write of each
//! item in turn: one round trip per 128 items, each item's outcome its own.
//!
//! ## Durability
//!
//! Checkpoints are exactly as durable as the Redis server's persistence settings. With
//! `appendonly yes` (AOF, ideally `appendfsync everysec` or `always`) a restart keeps the leases;
//! with RDB snapshots only, a crash loses the writes since the last snapshot; with no persistence
//! at all (`save ""`, `appendonly no`, like the test server of this project) a restart loses
//! every lease and checkpoint of every namespace. The running workers then restore the leases
//! from what they last listed (checkpoints written since are lost, so those records are processed
//! again; epochs never go backwards), and a lease no running worker remembers is created again
//! from the shard's first record, never at `LATEST` (docs/algorithm.md, "When the store loses
//! writes"). A fleet whose every process restarted with the server knows nothing to restore.
//! Use AOF in production.
//!
//! ## Connections
//!
//! One [`ConnectionManager`](redis::aio::ConnectionManager) (a multiplexed connection) is shared
//! by every clone of a store; it reconnects by itself after a server restart. Connection
//! failures, timeouts and `BUSY`/`LOADING`/`TRYAGAIN`-like replies are retryable
//! `Error::Backend`s. The password never appears in an error, a log line or `Debug` output.
//!
//! ## Guides
//!
//! [Choosing a store][choosing-a-store] (durability, cost and latency of each store, with measured
//! figures), [TLS][tls], and [the algorithm][algorithm] (what the workers do when the store loses
//! writes).
//!
//! [algorithm]: https://github.com/shardlease/shardlease/blob/main/docs/algorithm.md
//! [choosing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/choosing-a-store.md
//! [tls]: https://github.com/shardlease/shardlease/blob/main/docs/tls.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod cluster;
mod codec;
mod conn;
mod errors;
mod keys;
mod notify;
mod relink;
mod scripts;
mod store;

pub use builder::{
    RedisStoreBuilder, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PAGE_SIZE,
    DEFAULT_RESPONSE_TIMEOUT,
};
pub use conn::RedisConnection;
/// `url` with every secret masked, for logs and messages (core's, the one every store uses).
pub use shardlease_core::store::url::redact_url;
/// The namespace used when the URL or builder names none (defined once, in core).
pub use shardlease_core::DEFAULT_NAMESPACE;
pub use store::RedisStore;

/// Re-export of the `redis` crate, so a connection manager given to
/// [`RedisStoreBuilder::connection_manager`] is of the version this crate was built with.
pub use redis;
