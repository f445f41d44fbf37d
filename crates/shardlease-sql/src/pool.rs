//! [`SqlPool`], the connection pool of whichever dialect a store talks to, how one is opened
//! from a URL, and [`Shared`], what the stores of one pool and table prefix share. Both the store
//! and the schema module build on it (it depends on neither).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::{Error, Result};

use crate::dialect::{Dialect, Queries, Tables};
use crate::errors;
use crate::url::StoreUrl;

/// Default pool size for PostgreSQL and MySQL.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
const DEFAULT_SERVER_CONNECTIONS: u32 = 10;
/// Default pool size for a SQLite file (writers take turns anyway; readers run in parallel).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
const DEFAULT_SQLITE_CONNECTIONS: u32 = 4;

/// A connection pool of one of the compiled-in dialects. Build one with `From` (e.g.
/// `SqlPool::from(pg_pool)`) to share an application's pool with a store
/// ([`SqlStoreBuilder::pool`](crate::SqlStoreBuilder::pool), which takes the sqlx pools too).
#[derive(Clone)]
#[non_exhaustive]
pub enum SqlPool {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
    /// No dialect is compiled in (enable `postgres`, `sqlite` or `mysql`).
    #[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
    #[doc(hidden)]
    NoDialect(std::convert::Infallible),
}

impl SqlPool {
    /// The pool's dialect.
    pub fn dialect(&self) -> Dialect {
        on_pool_dialect(self)
    }

    /// Closes every connection of the pool. An in-memory SQLite database cannot be reached
    /// afterwards (a new connect opens a new one); its memory is freed with the pool's last clone.
    pub async fn close(&self) {
        on_pool!(self, p => p.close().await)
    }
}

fn on_pool_dialect(pool: &SqlPool) -> Dialect {
    match pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(_) => Dialect::Postgres,
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(_) => Dialect::Sqlite,
        #[cfg(feature = "mysql")]
        SqlPool::MySql(_) => Dialect::MySql,
        #[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
        SqlPool::NoDialect(never) => match *never {},
    }
}

impl fmt::Debug for SqlPool {
    /// Never prints connect options (they hold the password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (size, idle): (u32, usize) = on_pool!(self, p => (p.size(), p.num_idle()));
        f.debug_struct("SqlPool")
            .field("dialect", &self.dialect())
            .field("size", &size)
            .field("idle", &idle)
            .finish()
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for SqlPool {
    fn from(p: sqlx::PgPool) -> Self {
        SqlPool::Postgres(p)
    }
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for SqlPool {
    fn from(p: sqlx::SqlitePool) -> Self {
        SqlPool::Sqlite(p)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for SqlPool {
    fn from(p: sqlx::MySqlPool) -> Self {
        SqlPool::MySql(p)
    }
}

/// What the stores of one pool and prefix share.
pub(crate) struct Shared {
    pub(crate) pool: SqlPool,
    pub(crate) dialect: Dialect,
    pub(crate) prefix: String,
    pub(crate) tables: Tables,
    pub(crate) queries: Queries,
    /// SQLite: writers of this pool queue here, in order, instead of meeting at the database
    /// lock, where SQLite's busy handler would make them poll with sleeps of up to 100 ms.
    /// (Other processes sharing the file still meet there.)
    pub(crate) write_gate: Option<tokio::sync::Mutex<()>>,
    /// Held (shared) by every heartbeat statement until it has run, and exclusively by
    /// `remove_worker`: a heartbeat the caller gave up on (a timeout) still runs to completion
    /// before a later removal, so it cannot land after it and resurrect the record.
    pub(crate) heartbeats: Arc<tokio::sync::RwLock<()>>,
}

/// Pool settings taken from the builder and the URL.
pub(crate) struct PoolSettings {
    pub(crate) max_connections: Option<u32>,
    pub(crate) acquire_timeout: Duration,
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) busy_timeout: Duration,
}

/// Opens the pool a parsed URL names.
pub(crate) async fn open_pool(
    url: &str,
    parsed: &StoreUrl,
    settings: &PoolSettings,
) -> Result<SqlPool> {
    let dialect = parsed.dialect.ok_or_else(|| Error::Config("no dialect".into()))?;
    match dialect {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            Ok(SqlPool::Postgres(open_server_pool(dialect, url, parsed, settings).await?))
        }
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            Ok(SqlPool::MySql(open_server_pool(dialect, url, parsed, settings).await?))
        }
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => open_sqlite(url, parsed, settings).await,
        #[allow(unreachable_patterns)]
        other => Err(Error::Config(format!(
            "`{}` URLs need the `{}` feature of shardlease-sql (or of the shardlease crate)",
            other.name(),
            other.name()
        ))),
    }
}

/// Opens a pool on a database server (PostgreSQL, MySQL): probe first, then the pool.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn open_server_pool<DB>(
    dialect: Dialect,
    url: &str,
    parsed: &StoreUrl,
    settings: &PoolSettings,
) -> Result<sqlx::Pool<DB>>
where
    DB: sqlx::Database,
    <DB::Connection as sqlx::Connection>::Options: FromStr<Err = sqlx::Error>,
{
    let options = <<DB::Connection as sqlx::Connection>::Options>::from_str(&parsed.sqlx_url)
        .map_err(|e| errors::connecting(dialect, url, e))?;
    probe(dialect, url, &options).await?;
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(settings.max_connections.unwrap_or(DEFAULT_SERVER_CONNECTIONS))
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|e| errors::connecting(dialect, url, e))
}

/// Opens one connection and closes it again, so that a wrong host, port or password fails at
/// once with its real cause (a pool retries those until its acquire timeout, then reports only
/// the timeout).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<O>(dialect: Dialect, url: &str, options: &O) -> Result<()>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    use sqlx::Connection;
    let conn = options.connect().await.map_err(|e| errors::connecting(dialect, url, e))?;
    let _ = conn.close().await;
    Ok(())
}

/// Opens a SQLite pool: WAL and a busy timeout for a file shared by several processes; exactly
/// one connection for an in-memory database (queries queue on it instead of meeting at a lock),
/// plus a keeper connection that holds the database for as long as the pool lives (see
/// [`open_sqlite_pool`]).
///
/// A named in-memory database (`sqlite::memory:?name=NAME`) is one such pool per name for the
/// whole process, kept in a registry: every `connect` with the name gets the same pool (so the
/// same database, with no second connection to lock against), until one store closes it.
#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &str, parsed: &StoreUrl, settings: &PoolSettings) -> Result<SqlPool> {
    type Registry = tokio::sync::Mutex<std::collections::HashMap<String, sqlx::SqlitePool>>;
    static NAMED: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    let Some(name) = &parsed.sqlite_memory_name else {
        return Ok(SqlPool::Sqlite(open_sqlite_pool(url, parsed, settings).await?));
    };
    let mut named = NAMED.get_or_init(Registry::default).lock().await;
    if let Some(pool) = named.get(name).filter(|p| !p.is_closed()) {
        return Ok(SqlPool::Sqlite(pool.clone()));
    }
    let pool = open_sqlite_pool(url, parsed, settings).await?;
    named.insert(name.clone(), pool.clone());
    Ok(SqlPool::Sqlite(pool))
}

/// A new SQLite pool for `parsed` (see [`open_sqlite`]).
#[cfg(feature = "sqlite")]
async fn open_sqlite_pool(
    url: &str,
    parsed: &StoreUrl,
    settings: &PoolSettings,
) -> Result<sqlx::SqlitePool> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    use sqlx::ConnectOptions;
    let dialect = Dialect::Sqlite;
    let mut options = SqliteConnectOptions::from_str(&parsed.sqlx_url)
        .map_err(|e| errors::connecting(dialect, url, e))?
        .busy_timeout(settings.busy_timeout);
    let pool_options = if parsed.sqlite_in_memory {
        // sqlx opens `sqlite::memory:` as a shared-cache database of a name unique to these
        // options, which lives while any connection to it is open. The pool's one connection is
        // not enough: sqlx closes a connection it finds broken on release (a query cancelled by
        // an aborted task) and opens another, which would find an empty database. A keeper
        // connection that never runs a statement (so never takes a lock) holds it for as long
        // as the pool lives: the pool's options own it, through this hook.
        let keeper = std::sync::Mutex::new(
            options.connect().await.map_err(|e| errors::connecting(dialect, url, e))?,
        );
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .after_connect(move |_, _| {
                let _held = &keeper;
                Box::pin(async { Ok(()) })
            })
    } else {
        options = options.journal_mode(SqliteJournalMode::Wal);
        if !parsed.sqlite_mode_given {
            options = options.create_if_missing(true);
        }
        SqlitePoolOptions::new()
            .max_connections(settings.max_connections.unwrap_or(DEFAULT_SQLITE_CONNECTIONS))
    }
    .acquire_timeout(settings.acquire_timeout);
    // Switching a new file to WAL takes a lock that the busy timeout does not wait for: when
    // several processes create the file at once, one of them may see SQLITE_BUSY. Retry.
    let mut attempt = 0u32;
    loop {
        match pool_options.clone().connect_with(options.clone()).await {
            Ok(pool) => return Ok(pool),
            Err(e) if attempt < 20 && errors::is_retryable(dialect, &e) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(25 * u64::from(attempt))).await;
            }
            Err(e) => return Err(errors::connecting(dialect, url, e)),
        }
    }
}
