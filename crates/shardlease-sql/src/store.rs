//! [`SqlStore`]: the [`LeaseStore`] over PostgreSQL, SQLite or MySQL/MariaDB, and its builder. The
//! pool it talks through is in [`crate::pool`].
//!
//! Every operation is written once: the [`on_pool!`](crate::on_pool) macro expands the same code
//! for each compiled-in dialect, with the statement text (built once per table prefix by
//! [`Queries`]) the only difference. Every value is a bound parameter.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{
    ChangeStream, CorruptRecord, CreateOutcome, FleetSignal, Lease, LeaseStore, LeaseUpdate,
    Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};
use sqlx::AssertSqlSafe;
use tracing::debug;

use crate::codec::{
    self, check_name, encode_lease, encode_worker, new_version, read_lease, read_worker, RawLease,
    RawWorker,
};
use crate::dialect::{Dialect, Notifying, Queries, Sql, Tables, GET_WORKERS_CHUNK};
use crate::errors::{self, redact_url};
use crate::pool::{open_pool, PoolSettings, Shared, SqlPool};
use crate::schema;
use crate::url::{self as store_url, StoreUrl};

mod batch;

/// The table prefix used unless another is configured.
pub const DEFAULT_TABLE_PREFIX: &str = "shardlease_";

/// The namespace used when the URL or builder names none (defined once, in core).
pub use shardlease_core::DEFAULT_NAMESPACE;

/// A sqlx result.
type SqlxResult<T> = std::result::Result<T, sqlx::Error>;

/// Leases read per query while listing.
const LIST_PAGE: i64 = 1000;

/// How long an operation waits for a pooled connection before failing (retryably).
const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long SQLite waits for another process's write lock before failing (retryably).
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`LeaseStore`] in one namespace of a SQL database (PostgreSQL, SQLite or MySQL/MariaDB).
///
/// Cheap to clone; clones share the pool. Open one with [`SqlStore::builder`]; another namespace
/// of the same database is a builder over this store's [`pool`](SqlStore::pool).
#[derive(Clone)]
pub struct SqlStore {
    shared: Arc<Shared>,
    pub(crate) namespace: Namespace,
    /// PostgreSQL with notification on: the namespace's channel (see `crate::notify`).
    channel: Option<crate::notify::Channel>,
}

impl fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("dialect", &self.shared.dialect)
            .field("namespace", &self.namespace)
            .field("table_prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

/// Where a builder gets its connections.
enum Source {
    Url(String),
    Pool(SqlPool),
}

/// Configures and opens a [`SqlStore`]: see [`SqlStore::builder`]. The database comes from
/// exactly one of a URL and a pool the application opened; values set here win over the same
/// parameters in the URL, whatever the order of the calls. Nothing is checked until
/// [`connect`](SqlStoreBuilder::connect), which reports bad input as `Error::Config` (never a
/// panic) without repeating a password.
///
/// ```no_run
/// # async fn demo() -> shardlease_core::Result<()> {
/// let store = shardlease_sql::SqlStore::builder()
///     .url("postgres://app@db.internal/app")
///     .namespace("orders")
///     .table_prefix("shardlease_")
///     .create_schema(true)
///     .max_connections(8)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Default)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct SqlStoreBuilder {
    url: Option<String>,
    pool: Option<SqlPool>,
    namespace: Option<String>,
    table_prefix: Option<String>,
    create_schema: Option<bool>,
    max_connections: Option<u32>,
    acquire_timeout: Option<Duration>,
    busy_timeout: Option<Duration>,
    notify: Option<bool>,
}

impl fmt::Debug for SqlStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStoreBuilder")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("pool", &self.pool)
            .field("namespace", &self.namespace)
            .field("table_prefix", &self.table_prefix)
            .field("create_schema", &self.create_schema)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("busy_timeout", &self.busy_timeout)
            .field("notify", &self.notify)
            .finish()
    }
}

impl SqlStoreBuilder {
    /// The database: `postgres://`, `postgresql://`, `sqlite://path`, `sqlite::memory:`,
    /// `mysql://` or `mariadb://`. The URL may carry the shardlease parameters `namespace`,
    /// `table_prefix`, `create_schema` and `max_connections` (the builder's values win over
    /// them); the rest of it goes to sqlx as it is.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// A pool the application opened (a `sqlx::PgPool`, `SqlitePool` or `MySqlPool`, or a
    /// [`SqlPool`], e.g. [`SqlStore::pool`] of another store), instead of a URL. The pool
    /// settings (`max_connections`, `acquire_timeout`, `busy_timeout`) are its own then, and
    /// setting them here is an error.
    pub fn pool(self, pool: impl Into<SqlPool>) -> Self {
        SqlStoreBuilder { pool: Some(pool.into()), ..self }
    }

    /// The namespace (application name) to read and write. Default: the URL's `namespace`
    /// parameter, else [`DEFAULT_NAMESPACE`].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The prefix of the table names, `[a-z_][a-z0-9_]{0,30}`. Default: the URL's
    /// `table_prefix` parameter, else [`DEFAULT_TABLE_PREFIX`].
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = Some(prefix.into());
        self
    }

    /// Whether to create or migrate the tables on connect (safe when many workers do it at
    /// once). Default: the URL's `create_schema` parameter, else `true`. When off, connect
    /// fails with `Error::Config` if the tables are missing or too old.
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = Some(create);
        self
    }

    /// The most connections the pool opens, at least 1. Default: the URL's `max_connections`,
    /// else 10 for PostgreSQL and MySQL, 4 for a SQLite file; always 1 for an in-memory SQLite
    /// database.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// How long an operation waits for a free pooled connection (default 10 s, more than
    /// zero).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = Some(timeout);
        self
    }

    /// SQLite: how long a write waits for another connection's or process's lock (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = Some(timeout);
        self
    }

    /// PostgreSQL: whether the store announces ownership changes with `NOTIFY` and lets workers
    /// subscribe to them (`LeaseStore::subscribe_changes`), so they act on a release, a claim,
    /// a leave or a join at once instead of at their next heartbeat or balance pass. Default:
    /// the URL's `notify` parameter, else `true`. Checkpoints and heartbeats announce nothing,
    /// so it adds no store writes; each subscribed worker holds one more connection (its own,
    /// not one of the pool's). The other dialects have no notification and ignore it.
    pub fn notify(mut self, notify: bool) -> Self {
        self.notify = Some(notify);
        self
    }

    /// Connects (or takes the pool), runs the migrations if asked, and returns the store.
    pub async fn connect(self) -> Result<SqlStore> {
        let SqlStoreBuilder {
            url,
            pool,
            namespace,
            table_prefix,
            create_schema,
            max_connections,
            acquire_timeout,
            busy_timeout,
            notify,
        } = self;
        let source = match (url, pool) {
            (Some(url), None) => Source::Url(url),
            (None, Some(pool)) => Source::Pool(pool),
            (None, None) => {
                return Err(Error::Config(
                    "SQL store builder: name the database with url() or pool()".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(Error::Config(
                    "SQL store builder: give url() or pool(), not both".into(),
                ))
            }
        };
        let (pool, from_url) = match source {
            Source::Pool(pool) => {
                let pool_settings = [
                    ("max_connections", max_connections.is_some()),
                    ("acquire_timeout", acquire_timeout.is_some()),
                    ("busy_timeout", busy_timeout.is_some()),
                ];
                if let Some((name, _)) = pool_settings.iter().find(|(_, set)| *set) {
                    return Err(Error::Config(format!(
                        "SQL store builder: {name}() configures a pool the store opens; with \
                         pool() it is the pool's own"
                    )));
                }
                (pool, StoreUrl::default())
            }
            Source::Url(url) => {
                let parsed = store_url::parse(&url)?;
                let namespace = namespace.as_deref().or(parsed.namespace.as_deref());
                Namespace::new(namespace.unwrap_or(DEFAULT_NAMESPACE))?;
                validate_prefix(
                    table_prefix
                        .as_deref()
                        .or(parsed.table_prefix.as_deref())
                        .unwrap_or(DEFAULT_TABLE_PREFIX),
                )?;
                if max_connections == Some(0) {
                    return Err(Error::Config(
                        "SQL store builder: max_connections must be at least 1".into(),
                    ));
                }
                let acquire_timeout = acquire_timeout.unwrap_or(DEFAULT_ACQUIRE_TIMEOUT);
                if acquire_timeout.is_zero() {
                    return Err(Error::Config(
                        "SQL store builder: acquire_timeout must be more than zero".into(),
                    ));
                }
                let options = PoolSettings {
                    max_connections: max_connections.or(parsed.max_connections),
                    acquire_timeout,
                    busy_timeout: busy_timeout.unwrap_or(DEFAULT_BUSY_TIMEOUT),
                };
                let pool = open_pool(&url, &parsed, &options).await?;
                debug!(url = %redact_url(&url), "connected the SQL lease store");
                (pool, parsed)
            }
        };
        let namespace =
            namespace.or(from_url.namespace).unwrap_or_else(|| DEFAULT_NAMESPACE.into());
        let prefix =
            table_prefix.or(from_url.table_prefix).unwrap_or_else(|| DEFAULT_TABLE_PREFIX.into());
        let create = create_schema.or(from_url.create_schema).unwrap_or(true);
        let notify = notify.or(from_url.notify).unwrap_or(true);
        let namespace = Namespace::new(namespace)?;
        validate_prefix(&prefix)?;
        let dialect = pool.dialect();
        let tables = Tables::new(&prefix);
        let queries = Queries::new(dialect, &tables);
        let write_gate = (dialect == Dialect::Sqlite).then(|| tokio::sync::Mutex::new(()));
        let heartbeats = Arc::new(tokio::sync::RwLock::new(()));
        let shared =
            Arc::new(Shared { pool, dialect, prefix, tables, queries, write_gate, heartbeats });
        schema::prepare(&shared, create).await?;
        Ok(SqlStore::in_namespace(shared, namespace, notify))
    }
}

/// Checks a table prefix: `[a-z_][a-z0-9_]{0,30}`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 31
        && prefix.bytes().next().is_some_and(|b| b == b'_' || b.is_ascii_lowercase())
        && prefix.bytes().all(|b| b == b'_' || b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "table prefix {:?} is not valid: use 1 to 31 characters of [a-z0-9_], not starting \
             with a digit",
            prefix.chars().take(40).collect::<String>()
        )))
    }
}

// Namespaces are checked by core's `Namespace::new` only: its limit (200 bytes) is within the
// 255-character namespace columns, so the SQL store needs no check of its own on top.
const _: () = assert!(Namespace::MAX_BYTES <= crate::codec::MAX_NAME_CHARS);

/// The statement `sql`, for sqlx. Statement texts are built from validated identifiers and
/// placeholders only (see [`Queries`]), never from values.
fn stmt(sql: &Sql) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

impl SqlStore {
    /// A builder: the one way to open a store (a URL or a pool of your own, and options).
    pub fn builder() -> SqlStoreBuilder {
        SqlStoreBuilder::default()
    }

    fn in_namespace(shared: Arc<Shared>, namespace: Namespace, notify: bool) -> SqlStore {
        let channel = (notify && shared.queries.notifying.is_some())
            .then(|| crate::notify::Channel::new(&shared.prefix, &namespace));
        SqlStore { shared, namespace, channel }
    }

    /// The statement for a write: `plain`, or (PostgreSQL with notification on) its notifying
    /// form from `pick`, with the channel and the payload `say` writes, its last two parameters.
    fn write_sql<'a>(
        &'a self,
        plain: &'a Sql,
        pick: impl FnOnce(&'a Notifying) -> &'a Sql,
        say: impl FnOnce(&'a crate::notify::Channel) -> String,
    ) -> (AssertSqlSafe<Arc<str>>, Option<(&'a str, String)>) {
        match (&self.channel, &self.shared.queries.notifying) {
            (Some(channel), Some(n)) => (stmt(pick(n)), Some((channel.name(), say(channel)))),
            _ => (stmt(plain), None),
        }
    }

    /// The dialect of the database.
    pub fn dialect(&self) -> Dialect {
        self.shared.dialect
    }

    /// The table prefix.
    pub fn table_prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The name of the leases table (`<prefix>leases`).
    pub fn leases_table(&self) -> &str {
        &self.shared.tables.leases
    }

    /// The name of the worker records table (`<prefix>workers`).
    pub fn workers_table(&self) -> &str {
        &self.shared.tables.workers
    }

    /// PostgreSQL with notification on: the channel this namespace's change notices go to (see
    /// [`SqlStoreBuilder::notify`]). `LISTEN "<channel>"` in `psql` shows them as they happen.
    pub fn notify_channel(&self) -> Option<&str> {
        self.channel.as_ref().map(crate::notify::Channel::name)
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlPool {
        &self.shared.pool
    }

    /// Deletes every lease and worker record of this namespace, its fleet signal (the
    /// `<prefix>fleet` row) and its row in the `<prefix>namespaces` table that releases before
    /// random versions kept. Only for a namespace
    /// no worker uses any more (tests, decommissioning): running workers would recreate records.
    pub async fn delete_namespace(&self) -> Result<()> {
        for statement in &self.shared.queries.delete_namespace {
            let ns = self.namespace.as_str();
            let _turn = self.write_turn().await;
            let done: SqlxResult<()> = on_pool!(&self.shared.pool, p => sqlx::query(stmt(statement))
                .bind(ns)
                .execute(p)
                .await
                .map(|_| ()));
            done.map_err(|e| self.fail("delete the namespace", e))?;
        }
        Ok(())
    }

    /// Waits for this pool's turn to write (SQLite only; see `Shared::write_gate`).
    async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.shared.write_gate {
            Some(gate) => Some(gate.lock().await),
            None => None,
        }
    }

    fn fail(&self, what: &str, e: sqlx::Error) -> Error {
        errors::backend(self.shared.dialect, what, e)
    }

    /// Reads the raw row of `key`.
    async fn read_raw(&self, key: &str) -> Result<Option<RawLease>> {
        let sql = stmt(&self.shared.queries.get_lease);
        let ns = self.namespace.as_str();
        let row: SqlxResult<Option<RawLease>> = on_pool!(&self.shared.pool, p => sqlx::query(sql)
            .bind(ns)
            .bind(key)
            .fetch_optional(p)
            .await
            .map(|row| row.map(|r| read_lease(&r))));
        row.map_err(|e| self.fail("read a lease", e))
    }

    /// Reads and decodes `key`; a row that does not decode is `Error::Corrupt`.
    async fn read(&self, key: &str) -> Result<Option<VersionedLease>> {
        match self.read_raw(key).await? {
            None => Ok(None),
            Some(raw) => raw
                .decode(key)
                .map(Some)
                .map_err(|CorruptRecord { key, reason }| Error::Corrupt { key, reason }),
        }
    }

    /// The error of a failed compare-and-set on `key`: `Conflict` with the record as it is now
    /// (or the error reading it: `Corrupt`, or a backend error).
    async fn conflict(&self, key: &LeaseKey) -> Error {
        match self.read(key.as_str()).await {
            Ok(current) => Error::Conflict { key: key.clone(), current: current.map(Box::new) },
            Err(e) => e,
        }
    }

    /// One page of raw lease rows after `cursor` (skipping `skip` rows past it).
    async fn list_page(&self, cursor: Option<&str>, skip: i64) -> Result<Vec<RawLease>> {
        let q = &self.shared.queries;
        let ns = self.namespace.as_str();
        let page: SqlxResult<Vec<RawLease>> = on_pool!(&self.shared.pool, p => {
            let query = match cursor {
                None => sqlx::query(stmt(&q.list_leases_first)).bind(ns),
                Some(after) => sqlx::query(stmt(&q.list_leases_after)).bind(ns).bind(after),
            };
            query
                .bind(LIST_PAGE)
                .bind(skip)
                .fetch_all(p)
                .await
                .map(|rows| rows.iter().map(read_lease).collect())
        });
        page.map_err(|e| self.fail("list leases", e))
    }
}

impl SqlStore {
    /// The compare-and-set `UPDATE`, announced when `announce` (and notification is on).
    async fn update(&self, lease: &Lease, expected: Version, announce: bool) -> Result<Version> {
        let c = encode_lease(lease)?;
        let new_version = new_version(Some(expected));
        let Ok(expected) = i64::try_from(expected.0) else {
            // No row can hold this version.
            return Err(self.conflict(&lease.key).await);
        };
        let ns = self.namespace.as_str();
        let key = lease.key.as_str();
        let plain = &self.shared.queries.update_lease;
        let (sql, notice) = if announce {
            self.write_sql(plain, |n| &n.update_lease, |c| c.lease(key))
        } else {
            (stmt(plain), None)
        };
        let turn = self.write_turn().await;
        let updated: SqlxResult<u64> = on_pool!(&self.shared.pool, p => {
            let q = bind_lease_columns!(sqlx::query(sql), c)
                .bind(new_version)
                .bind(ns)
                .bind(key)
                .bind(expected);
            with_notice!(q, notice).execute(p).await.map(|r| r.rows_affected())
        });
        drop(turn);
        let updated = updated.map_err(|e| self.fail("update a lease", e))?;
        if updated == 1 {
            Ok(Version(new_version.unsigned_abs()))
        } else {
            Err(self.conflict(&lease.key).await)
        }
    }
}

#[async_trait]
impl LeaseStore for SqlStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let c = encode_lease(lease)?;
        let version = new_version(None);
        let ns = self.namespace.as_str();
        let key = lease.key.as_str();
        let (sql, notice) = self.write_sql(
            &self.shared.queries.insert_lease,
            |n| &n.insert_lease,
            |c| c.lease(key),
        );
        let turn = self.write_turn().await;
        let inserted: SqlxResult<u64> = on_pool!(&self.shared.pool, p => {
            let q = bind_lease_columns!(sqlx::query(sql), c).bind(version).bind(ns).bind(key);
            with_notice!(q, notice).execute(p).await.map(|r| r.rows_affected())
        });
        drop(turn);
        match inserted {
            Ok(1) => Ok(CreateOutcome::Created(Version(version.unsigned_abs()))),
            Ok(_) => Ok(CreateOutcome::AlreadyExists),
            Err(e) if errors::is_unique_violation(&e) => Ok(CreateOutcome::AlreadyExists),
            Err(e) => Err(self.fail("create a lease", e)),
        }
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        check_name("lease key", key.as_str())?;
        self.read(key.as_str()).await
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let mut listing = Listing::ok(Vec::new());
        // Keyset pagination by key. A row whose key itself cannot be read (only possible in
        // SQLite, which lets a hand edit store any type anywhere) cannot be a cursor: such rows
        // are counted past with OFFSET from the last readable key.
        let mut cursor: Option<String> = None;
        let mut skip = 0i64;
        loop {
            let page = self.list_page(cursor.as_deref(), skip).await?;
            let full = page.len() as i64 == LIST_PAGE;
            for raw in page {
                match raw.key().map(str::to_owned) {
                    Some(key) => {
                        match raw.decode(&key) {
                            Ok(item) => listing.items.push(item),
                            Err(bad) => listing.corrupt.push(bad),
                        }
                        cursor = Some(key);
                        skip = 0;
                    }
                    None => {
                        let after = cursor.as_deref().unwrap_or("");
                        let fallback = format!("<unreadable lease_key after {after:?}>");
                        if let Err(bad) = raw.decode(&fallback) {
                            listing.corrupt.push(bad);
                        }
                        skip += 1;
                    }
                }
            }
            if !full {
                return Ok(listing);
            }
        }
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, true).await
    }

    /// The same `UPDATE`, without `NOTIFY`.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, false).await
    }

    /// One statement per batch on PostgreSQL and MySQL, one transaction on SQLite (`batch`).
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        self.update_batch(updates).await
    }

    /// One statement per batch on PostgreSQL, one transaction on SQLite (`batch`).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.create_batch(leases).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        check_name("lease key", key.as_str())?;
        let Ok(expected) = i64::try_from(expected.0) else {
            return Err(self.conflict(key).await);
        };
        let ns = self.namespace.as_str();
        let (sql, notice) = self.write_sql(
            &self.shared.queries.delete_lease,
            |n| &n.delete_lease,
            |c| c.lease(key.as_str()),
        );
        let turn = self.write_turn().await;
        let deleted: SqlxResult<u64> = on_pool!(&self.shared.pool, p => {
            let q = sqlx::query(sql).bind(ns).bind(key.as_str()).bind(expected);
            with_notice!(q, notice).execute(p).await.map(|r| r.rows_affected())
        });
        drop(turn);
        let deleted = deleted.map_err(|e| self.fail("delete a lease", e))?;
        if deleted == 1 {
            Ok(())
        } else {
            Err(self.conflict(key).await)
        }
    }
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let c = encode_worker(record)?;
        let (worker_id, beat, updated_at, lease_count, load, capacity, changes, lease_loads) = (
            c.worker_id.to_owned(),
            c.beat,
            c.updated_at_millis,
            c.lease_count,
            c.load,
            c.capacity,
            c.changes,
            c.lease_loads,
        );
        let shared = Arc::clone(&self.shared);
        let namespace = self.namespace.clone();
        // The statement runs in a task of its own, so that it finishes (or fails) even if the
        // caller stops waiting, and holds `heartbeats` until then (see `Shared::heartbeats`).
        // No write turn: a heartbeat must not queue behind a burst of lease writes (it would
        // miss its deadline and fence the worker); it meets at most the one write in progress
        // at SQLite's lock, which the busy handler resolves within milliseconds.
        // Announced only when it inserts the record (a join), never for a heartbeat.
        let (sql, notice) = self.write_sql(
            &self.shared.queries.heartbeat,
            |n| &n.heartbeat,
            |c| c.joined(&worker_id),
        );
        let notice = notice.map(|(channel, payload)| (channel.to_owned(), payload));
        let in_flight = Arc::clone(&self.shared.heartbeats).read_owned().await;
        let write = tokio::spawn(async move {
            let _in_flight = in_flight;
            let ns = namespace.as_str();
            let done: SqlxResult<()> = on_pool!(&shared.pool, p => {
                let q = sqlx::query(sql)
                    .bind(ns)
                    .bind(worker_id.as_str())
                    .bind(beat)
                    .bind(updated_at)
                    .bind(lease_count)
                    .bind(load)
                    .bind(capacity)
                    .bind(changes)
                    .bind(lease_loads.as_deref());
                with_notice!(q, notice).execute(p).await.map(|_| ())
            });
            done.map_err(|e| errors::backend(shared.dialect, "write a heartbeat", e))
        });
        match write.await {
            Ok(result) => result,
            Err(e) => Err(Error::retryable(format!(
                "{}: the heartbeat write did not complete: {e}",
                self.shared.dialect
            ))),
        }
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        let sql = stmt(&self.shared.queries.list_workers);
        let ns = self.namespace.as_str();
        let rows: SqlxResult<Vec<codec::RawWorker>> = on_pool!(&self.shared.pool, p => sqlx::query(sql)
            .bind(ns)
            .fetch_all(p)
            .await
            .map(|rows| rows.iter().map(read_worker).collect()));
        let rows = rows.map_err(|e| self.fail("list workers", e))?;
        let mut listing = Listing::ok(Vec::new());
        add_workers(&mut listing, rows);
        Ok(listing)
    }

    /// `SELECT ... WHERE namespace = ? AND worker_id IN (...)`, up to 512 distinct
    /// ids per statement, rows decoded as [`list_workers`](LeaseStore::list_workers) decodes
    /// them. An id the store could not hold (a NUL, more than 255 characters) names no record
    /// and is left out.
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        let wanted: Vec<&str> = ids
            .iter()
            .map(WorkerId::as_str)
            .filter(|id| check_name("worker id", id).is_ok() && seen.insert(*id))
            .collect();
        let ns = self.namespace.as_str();
        let mut listing = Listing::ok(Vec::new());
        for chunk in wanted.chunks(GET_WORKERS_CHUNK) {
            let Some(&last) = chunk.last() else { continue };
            let (sql, width) = self.shared.queries.get_workers(chunk.len());
            let padding = std::iter::repeat_n(last, width.saturating_sub(chunk.len()));
            let rows: SqlxResult<Vec<RawWorker>> = on_pool!(&self.shared.pool, p => {
                let mut query = sqlx::query(stmt(sql)).bind(ns);
                for id in chunk.iter().copied().chain(padding) {
                    query = query.bind(id);
                }
                query.fetch_all(p).await.map(|rows| rows.iter().map(read_worker).collect())
            });
            add_workers(&mut listing, rows.map_err(|e| self.fail("read workers", e))?);
        }
        Ok(listing)
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        check_name("worker id", id.as_str())?;
        let (sql, notice) = self.write_sql(
            &self.shared.queries.remove_worker,
            |n| &n.remove_worker,
            |c| c.left(id.as_str()),
        );
        let ns = self.namespace.as_str();
        // After every heartbeat already started, even abandoned ones (see `Shared::heartbeats`).
        let _no_heartbeat_in_flight = self.shared.heartbeats.write().await;
        let _turn = self.write_turn().await;
        let done: SqlxResult<()> = on_pool!(&self.shared.pool, p => {
            let q = sqlx::query(sql).bind(ns).bind(id.as_str());
            with_notice!(q, notice).execute(p).await.map(|_| ())
        });
        done.map_err(|e| self.fail("remove a worker", e))
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        check_name("worker id", id.as_str())?;
        let Ok(beat) = i64::try_from(beat) else {
            return Ok(false); // no row can hold this beat
        };
        let (sql, notice) = self.write_sql(
            &self.shared.queries.remove_worker_if,
            |n| &n.remove_worker_if,
            |c| c.left(id.as_str()),
        );
        let ns = self.namespace.as_str();
        // No wait for heartbeats in flight (unlike `remove_worker`): one that lands afterwards
        // recreates the record, which is right, since its worker is alive after all.
        let _turn = self.write_turn().await;
        let removed: SqlxResult<u64> = on_pool!(&self.shared.pool, p => {
            let q = sqlx::query(sql).bind(ns).bind(id.as_str()).bind(beat);
            with_notice!(q, notice).execute(p).await.map(|r| r.rows_affected())
        });
        removed.map(|n| n > 0).map_err(|e| self.fail("remove a worker conditionally", e))
    }

    /// An upsert of the namespace's row in `<prefix>fleet`.
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        let token = i64::try_from(token.0).map_err(|_| {
            Error::InvalidInput(format!(
                "fleet signal token {} does not fit the SQL store's BIGINT column",
                token.0
            ))
        })?;
        let sql = stmt(&self.shared.queries.write_fleet_signal);
        let ns = self.namespace.as_str();
        let _turn = self.write_turn().await;
        let done: SqlxResult<()> = on_pool!(&self.shared.pool, p => sqlx::query(sql)
            .bind(ns)
            .bind(token)
            .execute(p)
            .await
            .map(|_| ()));
        done.map_err(|e| self.fail("write the fleet signal", e))
    }

    /// The namespace's row in `<prefix>fleet`; a token that does not decode (a hand edit) is
    /// `Error::Corrupt`.
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        let sql = stmt(&self.shared.queries.read_fleet_signal);
        let ns = self.namespace.as_str();
        let token: SqlxResult<Option<codec::Col<i64>>> = on_pool!(&self.shared.pool, p => {
            sqlx::query(sql)
                .bind(ns)
                .fetch_optional(p)
                .await
                .map(|row| row.map(|r| codec::col(&r, 0)))
        });
        match token.map_err(|e| self.fail("read the fleet signal", e))? {
            None => Ok(FleetSignal::Missing),
            Some(token) => codec::decode_token(token).map(FleetSignal::Token).map_err(|reason| {
                Error::Corrupt { key: format!("fleet signal of namespace {ns}"), reason }
            }),
        }
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.namespace.clone())
    }

    /// PostgreSQL with notification on (the default; see [`SqlStoreBuilder::notify`]): a
    /// `LISTEN` on the namespace's channel, over a connection of its own. Other dialects have
    /// no notification.
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        match (&self.channel, &self.shared.pool) {
            #[cfg(feature = "postgres")]
            (Some(channel), SqlPool::Postgres(pool)) => {
                crate::notify::subscribe(pool, channel).await.map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// Adds decoded worker rows to `listing`: the records that decode to `items`, the others to
/// `corrupt` (`list_workers` and `get_workers` alike).
fn add_workers(listing: &mut Listing<WorkerRecord>, rows: Vec<RawWorker>) {
    for raw in rows {
        match raw.decode() {
            Ok(w) => listing.items.push(w),
            Err(bad) => listing.corrupt.push(bad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_identifiers() {
        for good in ["shardlease_", "a", "_", "app_v2_", &"a".repeat(31)] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "Abc", "a-b", "x;DROP TABLE y", "ü", "a b", &"a".repeat(32)] {
            assert!(matches!(validate_prefix(bad), Err(Error::Config(_))), "{bad}");
        }
    }
}
