//! # shardlease-sql
//!
//! A [`LeaseStore`](shardlease_core::store::LeaseStore) for shardlease on PostgreSQL, SQLite (the
//! embedded default) and MySQL/MariaDB, through [sqlx](https://docs.rs/sqlx). One implementation:
//! the three dialects share the schema design, the statements and the code; they differ only in
//! placeholders, the create/upsert clause and column types.
//!
//! | URL | dialect | feature |
//! |---|---|---|
//! | `postgres://user:pw@host:5432/db`, `postgresql://...` | PostgreSQL | `postgres` |
//! | `sqlite://path/to/file.db`, `sqlite:///abs/file.db?mode=rwc`, `sqlite::memory:`, `sqlite::memory:?name=NAME` (shared in the process) | SQLite (bundled) | `sqlite` |
//! | `mysql://user:pw@host:3306/db`, `mariadb://...` | MySQL 8 / MariaDB 10.5+ | `mysql` |
//!
//! TLS (`sslmode=require` on PostgreSQL, `ssl-mode=REQUIRED` on MySQL) needs the `tls`
//! feature. Besides the driver's own parameters a URL may carry `namespace`, `table_prefix`
//! (default `shardlease_`), `create_schema` (default `true`) and `max_connections`; they are
//! removed before the URL reaches sqlx. Passwords never appear in errors or logs
//! ([`redact_url`]).
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_core::store::LeaseStore;
//! let store = shardlease_sql::SqlStore::builder()
//!     .url("sqlite://leases.db")
//!     .namespace("orders")
//!     .connect()
//!     .await?;
//! let leases = store.list_leases().await?;
//! # Ok(()) }
//! ```
//!
//! ## Schema
//!
//! Created by versioned migrations on connect (unless `create_schema` is off), recorded in
//! `<prefix>schema_migrations` and safe when many workers start at once (PostgreSQL: an advisory
//! lock and transactional DDL; MySQL: `GET_LOCK`; SQLite: idempotent statements under the
//! database's write lock). Names are meant for an operator typing `SELECT` by hand:
//!
//! - `<prefix>leases`: `namespace`, `lease_key` (primary key together), `owner`, `epoch`,
//!   `version`, the checkpoint as `checkpoint_kind` (`trim_horizon`, `latest`, `at_timestamp`,
//!   `sequence`, `shard_end`) with `checkpoint_seq` (decimal digits) and `checkpoint_sub`, or
//!   `checkpoint_millis` for a timestamp; `parents` (a JSON array), `claim_by` and `claim_at`
//!   (a pending handoff), `attributes` (a JSON object) and `updated_at_millis` (the writer's
//!   wall clock, for people only).
//! - `<prefix>workers`: `namespace`, `worker_id`, `beat`, `updated_at_millis`, `lease_count`,
//!   `load_figure`, `capacity`, (since schema 2) `changes`, the worker's count of ownership
//!   changes that tells its peers when to list the leases again, and (since schema 3)
//!   `lease_loads`, the loads of the worker's heaviest leases as one text, a line
//!   `<load> <lease key>` per lease (`shardlease_core::store::encode_lease_loads`), NULL when it
//!   publishes none. Schema 2 only adds its column (default 0) and schema 3 only its nullable
//!   column (no default; NULL reads as no loads), so workers of the previous release keep working
//!   on migrated tables.
//! - `<prefix>namespaces`: `namespace`, `last_incarnation`: the per-namespace counter earlier
//!   releases drew versions from. It is no longer read or written (versions are random now,
//!   below) but stays in schema 1, so that no migration is needed and older and newer workers can
//!   share the tables; [`SqlStore::delete_namespace`] still clears a namespace's row.
//! - `<prefix>fleet` (since schema 4): `namespace` (primary key), `token` (a positive `BIGINT`):
//!   the namespace's fleet signal (`LeaseStore::write_fleet_signal`), a random token a worker
//!   writes with one upsert whenever it changes something its peers must look at (a join, a
//!   leave, an ownership change). Neither listing reads it. Schema 4 only adds the table, so
//!   workers of the previous release can still open migrated tables (they never touch it);
//!   [`SqlStore::delete_namespace`] clears the namespace's row.
//!
//! Keys compare byte by byte in every dialect (`COLLATE "C"` on PostgreSQL, a binary no-pad
//! collation on MySQL), so `a`, `A` and `a ` are three leases. Namespaces, keys and worker ids
//! are at most 255 characters and contain no NUL.
//!
//! ## One conditional `UPDATE`
//!
//! Compare-and-set is a single statement, `UPDATE <prefix>leases SET ..., version = new WHERE
//! namespace = ? AND lease_key = ? AND version = expected`: the database's row lock makes it
//! atomic with no transaction, no `SELECT ... FOR UPDATE` and no retry loop, so it costs one
//! round trip and holds the row for the duration of one statement. When it matches no row the
//! store reads the row and returns it in `Error::Conflict` (the read is not atomic with the
//! failed write, but the contract only promises the record as it is *now*). Deletes work the
//! same way; creates are an `INSERT` that does nothing on a duplicate key (`ON CONFLICT DO
//! NOTHING`; a duplicate-key error on MySQL) and report `AlreadyExists`.
//!
//! Every create and update writes a fresh random version (63 bits, a positive `BIGINT`, never
//! the version it replaces), drawn by the client. So a version never repeats for a key: not
//! after a delete and a re-create (no ABA), and not after the database was restored from a
//! backup or failed over to a replica that had not seen the last writes. A counter (`version + 1`,
//! a sequence) would hand out the same numbers again after such a rollback, and a worker holding
//! one from before it could overwrite a record written since. The hot path stays one statement
//! that touches one row.
//!
//! `remove_worker_if` (removing a dead worker's record only while its beat is the one seen) is
//! one `DELETE ... WHERE namespace = ? AND worker_id = ? AND beat = ?`.
//!
//! What a heartbeat reads: the `<prefix>fleet` row of the namespace (`SELECT token ... WHERE
//! namespace = ?`, one primary-key lookup), plus the records of the peers the worker watches
//! with `get_workers` (`SELECT ... FROM <prefix>workers WHERE namespace = ? AND worker_id IN
//! (...)`, up to 512 ids per statement, the `IN` list padded to a power of two so a few
//! statement texts stay prepared); the whole `<prefix>workers` listing only when the token
//! differs from the one the worker saw last.
//!
//! Listing pages by key (1000 rows per query, keyset pagination), so a namespace of any size is
//! never one huge result. A row that does not decode (a hand edit gone wrong) is reported as
//! `Error::Corrupt` by `get_lease` and `update_lease`, and as a `Listing::corrupt` entry by
//! `list_leases`; the other leases keep working. The entry's key is the row's `lease_key`
//! exactly; only a row whose `lease_key` itself is unreadable (SQLite lets a hand edit put a
//! blob there) is named `<unreadable lease_key after "...">` instead, which matches no lease.
//!
//! ## SQLite: several processes, one file
//!
//! A SQLite file can be shared by worker processes on one machine with no server: the store
//! turns on WAL mode (readers never block the writer) and a busy timeout (default 5 s; a writer
//! waits for another process's write instead of failing), and creates the file when the URL has
//! no `mode`. Every operation is one autocommit statement, so the write lock is held for one
//! statement. Within one process, the lease writes of a store (and its clones) queue in order on
//! an async mutex instead of meeting at SQLite's lock (whose busy handler polls with sleeps of up
//! to 100 ms); heartbeats skip that queue, so a burst of lease writes (a start-up taking 1000
//! leases) cannot delay a heartbeat past its deadline. Writes are durable when they return
//! (`synchronous` stays `FULL`: about 2k compare-and-sets per second on an SSD). The file must be
//! on a local disk (WAL needs shared memory between the processes: no network file systems).
//!
//! `sqlite::memory:` is a database private to the store that opened it, kept in one connection
//! that the pool never closes; two `connect` calls give two separate databases (to open more
//! namespaces in one, build stores over the first one's [`pool`](SqlStore::pool)).
//! `sqlite::memory:?name=NAME` names one instead: every `connect` in this process with that name
//! gets the same database (the same single-connection pool), which lives until the process exits
//! or a store on it is closed; it is never shared with other processes.
//!
//! ## Effectively-once output
//!
//! [`effectively_once`] writes a processor's output and the checkpoint after it in one transaction
//! of the sink's database, fenced by the lease epoch: see that module and the [effectively-once
//! guide][effectively-once].
//!
//! ## Errors
//!
//! I/O errors, pool timeouts, serialization failures, deadlocks, a server shutting down or
//! starting, too many connections and `SQLITE_BUSY`/`SQLITE_LOCKED` are retryable
//! `Error::Backend`s; everything else is permanent.
//!
//! ## Guides
//!
//! [Choosing a store][choosing-a-store] (durability, cost and latency of each store, with measured
//! figures), [TLS][tls] (certificates and verification modes per store).
//!
//! [choosing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/choosing-a-store.md
//! [effectively-once]: https://github.com/shardlease/shardlease/blob/main/docs/effectively-once.md
//! [tls]: https://github.com/shardlease/shardlease/blob/main/docs/tls.md

#![cfg_attr(docsrs, feature(doc_cfg))]
// With no dialect compiled in, the pool enum is empty and much of the crate is unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(
        dead_code,
        unused_imports,
        unused_macros,
        unused_variables,
        unreachable_code,
        clippy::never_loop
    )
)]

/// Binds the encoded lease columns (`$c`, a `codec::LeaseColumns`) to `$query` in the order of
/// `dialect::LEASE_WRITE_COLUMNS`: the one bind list of every lease write.
macro_rules! bind_lease_columns {
    ($query:expr, $c:expr) => {{
        let c = &$c;
        $query
            .bind(c.owner)
            .bind(c.epoch)
            .bind(c.checkpoint_kind)
            .bind(c.checkpoint_seq)
            .bind(c.checkpoint_sub)
            .bind(c.checkpoint_millis)
            .bind(c.parents.as_str())
            .bind(c.claim_by)
            .bind(c.claim_at)
            .bind(c.attributes.as_str())
            .bind(c.updated_at_millis)
    }};
}

/// Binds a notice's channel and payload (`$notice`, an `Option<(&str, String)>` from
/// `SqlStore::write_sql`) as the last two parameters of `$query`, when there is one.
macro_rules! with_notice {
    ($query:expr, $notice:expr) => {{
        let query = $query;
        match $notice {
            Some((channel, payload)) => query.bind(channel).bind(payload),
            None => query,
        }
    }};
}

/// Runs `$body` with `$p` bound to the concrete pool of `$pool` (a `&SqlPool`): the body is
/// written once and compiled for every dialect that is enabled.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "postgres")]
            $crate::pool::SqlPool::Postgres($p) => $body,
            #[cfg(feature = "sqlite")]
            $crate::pool::SqlPool::Sqlite($p) => $body,
            #[cfg(feature = "mysql")]
            $crate::pool::SqlPool::MySql($p) => $body,
            #[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
            $crate::pool::SqlPool::NoDialect(never) => match *never {},
        }
    };
}

mod codec;
mod dialect;
pub mod effectively_once;
mod errors;
mod notify;
mod pool;
mod schema;
mod store;
mod url;

pub use dialect::Dialect;
pub use errors::redact_url;
pub use pool::SqlPool;
pub use schema::SCHEMA_VERSION;
pub use store::{SqlStore, SqlStoreBuilder, DEFAULT_NAMESPACE, DEFAULT_TABLE_PREFIX};
