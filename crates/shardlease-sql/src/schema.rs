//! Versioned schema migrations, safe when many workers start at once.
//!
//! Each migration is a list of idempotent statements (`CREATE TABLE IF NOT EXISTS`); applied
//! versions are recorded in `<prefix>schema_migrations`. Concurrent runners are serialized where
//! the database offers a lock (a transaction-scoped advisory lock on PostgreSQL, whose DDL is
//! transactional; `GET_LOCK` on MySQL/MariaDB) and rely on the idempotent statements and the
//! duplicate-tolerant insert into the migrations table on SQLite, where every write takes the
//! database lock anyway (waiting up to the busy timeout).

use shardlease_core::{Error, Result};
use sqlx::{AssertSqlSafe, Row};
use tracing::{info, warn};

use crate::dialect::{self, Dialect, Tables};
use crate::errors;
use crate::pool::{Shared, SqlPool};

/// One schema version.
struct Migration {
    version: i64,
    description: &'static str,
    statements: fn(Dialect, &Tables, &str) -> Vec<String>,
}

/// Every migration, oldest first. Never edit a released one: add the next version.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "leases, workers and per-namespace incarnation counters",
        statements: dialect::schema_v1,
    },
    Migration {
        version: 2,
        description: "worker records publish their count of ownership changes",
        statements: dialect::schema_v2,
    },
    Migration {
        version: 3,
        description: "worker records publish their heaviest leases' loads",
        statements: dialect::schema_v3,
    },
    Migration {
        version: 4,
        description: "the per-namespace fleet signal",
        statements: dialect::schema_v4,
    },
];

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = 4;

/// Runs the missing migrations when `create` is set, then checks that the schema is there.
pub(crate) async fn prepare(shared: &Shared, create: bool) -> Result<()> {
    if create {
        migrate(shared).await?;
    }
    check(shared).await
}

/// Checks the schema version recorded in the migrations table.
async fn check(shared: &Shared) -> Result<()> {
    let sql = AssertSqlSafe(shared.queries.schema_version.clone());
    let version: std::result::Result<Option<i64>, sqlx::Error> = on_pool!(&shared.pool, p => {
        match sqlx::query(sql).fetch_one(p).await {
            Ok(row) => row.try_get::<Option<i64>, usize>(0),
            Err(e) => Err(e),
        }
    });
    let version = match version {
        Ok(v) => v.unwrap_or(0),
        Err(e @ sqlx::Error::Database(_)) => {
            return Err(Error::Config(format!(
                "the shardlease tables with prefix `{}` are missing or unreadable ({e}); connect \
                 with create_schema enabled (the default) or create them",
                shared.prefix
            )))
        }
        Err(e) => return Err(errors::backend(shared.dialect, "read the schema version", e)),
    };
    if version < SCHEMA_VERSION {
        return Err(Error::Config(format!(
            "the shardlease tables with prefix `{}` are at schema version {version}, this build \
             needs {SCHEMA_VERSION}: connect with create_schema enabled to migrate them",
            shared.prefix
        )));
    }
    if version > SCHEMA_VERSION {
        warn!(
            prefix = %shared.prefix,
            version,
            "the shardlease tables are at a newer schema version than this build knows; \
             continuing (migrations only add)"
        );
    }
    Ok(())
}

/// Applies the missing migrations on executor `$exec` (evaluated for every statement).
macro_rules! apply_migrations {
    ($exec:expr, $shared:expr, $collation:expr) => {{
        let shared: &Shared = $shared;
        let d = shared.dialect;
        let fail = |what: &str, e: sqlx::Error| errors::backend(d, what, e);
        let create = dialect::create_migrations_table(d, &shared.tables, $collation);
        sqlx::raw_sql(AssertSqlSafe(create))
            .execute($exec)
            .await
            .map_err(|e| fail("create the migrations table", e))?;
        let listed = format!("SELECT version FROM {}", shared.tables.migrations);
        let rows = sqlx::query(AssertSqlSafe(listed))
            .fetch_all($exec)
            .await
            .map_err(|e| fail("read the applied migrations", e))?;
        let mut applied = Vec::with_capacity(rows.len());
        for row in &rows {
            applied.push(
                row.try_get::<i64, usize>(0)
                    .map_err(|e| fail("read the applied migrations", e))?,
            );
        }
        for m in MIGRATIONS {
            if applied.contains(&m.version) {
                continue;
            }
            for statement in (m.statements)(d, &shared.tables, $collation) {
                match sqlx::raw_sql(AssertSqlSafe(statement)).execute($exec).await {
                    Ok(_) => {}
                    Err(e) if dialect::is_duplicate_column(&e) => {}
                    Err(e) => return Err(fail("apply a schema migration", e)),
                }
            }
            sqlx::query(AssertSqlSafe(dialect::record_migration(d, &shared.tables)))
                .bind(m.version)
                .bind(m.description)
                .bind(now_millis())
                .execute($exec)
                .await
                .map_err(|e| fail("record a schema migration", e))?;
            info!(prefix = %shared.prefix, version = m.version, dialect = %d, "applied shardlease schema migration");
        }
        Ok::<(), Error>(())
    }};
}

async fn migrate(shared: &Shared) -> Result<()> {
    match &shared.pool {
        #[cfg(feature = "postgres")]
        SqlPool::Postgres(p) => {
            let d = Dialect::Postgres;
            let mut tx = p.begin().await.map_err(|e| errors::backend(d, "begin migrations", e))?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(lock_key(&shared.prefix))
                .execute(&mut *tx)
                .await
                .map_err(|e| errors::backend(d, "take the schema lock", e))?;
            apply_migrations!(&mut *tx, shared, "")?;
            tx.commit().await.map_err(|e| errors::backend(d, "commit migrations", e))
        }
        #[cfg(feature = "sqlite")]
        SqlPool::Sqlite(p) => apply_migrations!(p, shared, ""),
        #[cfg(feature = "mysql")]
        SqlPool::MySql(p) => {
            let d = Dialect::MySql;
            let mut conn = p.acquire().await.map_err(|e| errors::backend(d, "connect", e))?;
            let lock = format!("shardlease.schema.{}", shared.prefix);
            let row = sqlx::query("SELECT CAST(GET_LOCK(?, 60) AS SIGNED)")
                .bind(lock.as_str())
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| errors::backend(d, "take the schema lock", e))?;
            let got = row.try_get::<Option<i64>, usize>(0).ok().flatten();
            if got != Some(1) {
                return Err(Error::retryable(
                    "mysql: timed out after 60 s waiting for the schema lock (another worker is \
                     migrating the shardlease tables)",
                ));
            }
            let result = async {
                let collation = mysql_collation(&mut conn).await?;
                apply_migrations!(&mut *conn, shared, collation)
            }
            .await;
            // Released with the connection anyway; releasing now lets the next worker go.
            let _ =
                sqlx::query("SELECT RELEASE_LOCK(?)").bind(lock.as_str()).execute(&mut *conn).await;
            result
        }
        #[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
        SqlPool::NoDialect(never) => match *never {},
    }
}

/// The binary, no-pad utf8mb4 collation of this server: `utf8mb4_0900_bin` (MySQL 8) or
/// `utf8mb4_nopad_bin` (MariaDB), so keys differing only in case, accents or trailing spaces
/// stay distinct. Falls back to `utf8mb4_bin` (trailing spaces then compare equal).
#[cfg(feature = "mysql")]
async fn mysql_collation(conn: &mut sqlx::mysql::MySqlConnection) -> Result<&'static str> {
    let rows = sqlx::query(
        "SELECT COLLATION_NAME FROM information_schema.COLLATIONS \
         WHERE COLLATION_NAME IN ('utf8mb4_0900_bin', 'utf8mb4_nopad_bin')",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| errors::backend(Dialect::MySql, "list collations", e))?;
    let names: Vec<String> =
        rows.iter().filter_map(|r| r.try_get::<String, usize>(0).ok()).collect();
    Ok(if names.iter().any(|n| n == "utf8mb4_0900_bin") {
        "utf8mb4_0900_bin"
    } else if names.iter().any(|n| n == "utf8mb4_nopad_bin") {
        "utf8mb4_nopad_bin"
    } else {
        warn!("no binary no-pad utf8mb4 collation on this server: keys differing only in trailing spaces will collide");
        "utf8mb4_bin"
    })
}

/// The advisory lock id of `prefix` on PostgreSQL (FNV-1a of a fixed string and the prefix).
#[cfg(feature = "postgres")]
fn lock_key(prefix: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "shardlease.schema.".bytes().chain(prefix.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

fn now_millis() -> i64 {
    i64::try_from(shardlease_core::store::now_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_in_order_and_end_at_the_schema_version() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(versions, sorted);
        assert_eq!(versions.last(), Some(&SCHEMA_VERSION));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn lock_keys_differ_per_prefix() {
        assert_ne!(lock_key("shardlease_"), lock_key("other_"));
        assert_eq!(lock_key("a_"), lock_key("a_"));
    }
}
