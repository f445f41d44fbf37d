//! sqlx errors to shardlease errors, and keeping passwords out of every message.
//!
//! What is retryable: anything that says the connection, the server or a lock was in the way for
//! a moment (I/O, pool timeout, serialization failure, deadlock, server shutting down or starting
//! up, `SQLITE_BUSY`/`SQLITE_LOCKED`). Everything else (syntax, constraint, configuration,
//! authentication) is permanent.

use shardlease_core::Error;

use crate::dialect::Dialect;

/// Wraps a sqlx error from an operation of a connected store. These never carry the connection
/// URL, so the error is kept as the source.
pub(crate) fn backend(dialect: Dialect, what: &str, e: sqlx::Error) -> Error {
    let retryable = is_retryable(dialect, &e);
    Error::backend(retryable, format!("{dialect}: {what}: {e}"), e)
}

/// Wraps a sqlx error raised while connecting with `url`: the message is scrubbed of the URL's
/// password and the original error is dropped (its chain could echo a connection string).
pub(crate) fn connecting(dialect: Dialect, url: &str, e: sqlx::Error) -> Error {
    let retryable = is_retryable(dialect, &e);
    let mut chain = e.to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = s.source();
    }
    let message = format!("{dialect}: connecting to {}: {}", redact_url(url), scrub(&chain, url));
    Error::Backend { retryable, message, source: None }
}

/// Whether repeating the operation that failed with `e` may succeed.
pub(crate) fn is_retryable(dialect: Dialect, e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(db) => database_error_is_retryable(dialect, db.as_ref()),
        _ => false,
    }
}

fn database_error_is_retryable(dialect: Dialect, db: &dyn sqlx::error::DatabaseError) -> bool {
    let code = db.code();
    let code = code.as_deref().unwrap_or("");
    match dialect {
        Dialect::Postgres => {
            // 08: connection exception; 40001/40P01: serialization failure, deadlock;
            // 53: insufficient resources (too many connections); 55P03: lock not available;
            // 57P01-57P03: admin/crash shutdown, cannot connect now (a restart).
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(code, "40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03")
        }
        Dialect::Sqlite => {
            // The primary result code is the low byte of the extended one:
            // 5 SQLITE_BUSY (incl. BUSY_SNAPSHOT, BUSY_RECOVERY), 6 SQLITE_LOCKED.
            code.parse::<i64>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
        }
        Dialect::MySql => {
            if code == "40001" || code.starts_with("08") {
                return true;
            }
            mysql_number(db).is_some_and(|n| {
                // lock wait timeout, deadlock, too many connections, server shutdown,
                // connection killed (MariaDB), idle/read timeout disconnects.
                matches!(n, 1205 | 1213 | 1040 | 1053 | 1927 | 4031 | 2006 | 2013)
            })
        }
    }
}

#[cfg(feature = "mysql")]
fn mysql_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|e| e.number())
}

#[cfg(not(feature = "mysql"))]
fn mysql_number(_db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    None
}

/// Whether `e` is a duplicate-key error.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|db| db.is_unique_violation())
}

/// `url` with every secret masked, for logs and messages (core's, the one every store uses).
pub use shardlease_core::store::url::redact_url;

/// `message` with every secret of `url` replaced by `***`.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    shardlease_core::store::url::redactor(url).scrub(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        let cases = [
            ("postgres://app:s3cr%40t@db:5432/x", "postgres://app:***@db:5432/x"),
            ("postgresql://app@db/x", "postgresql://app@db/x"),
            (
                "mariadb://root:pw@127.0.0.1:3306/test?x=1",
                "mariadb://root:***@127.0.0.1:3306/test?x=1",
            ),
            ("postgres://u:a/b@c@host/db", "<unparseable URL>"),
            (
                "postgres://h/db?user=u&password=hunter2&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            ("sqlite::memory:", "sqlite::memory:"),
            ("not a url at all", "<unparseable URL>"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn transient_failures_are_retryable() {
        let io = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            assert!(is_retryable(d, &io()));
            assert!(is_retryable(d, &sqlx::Error::PoolTimedOut));
            assert!(!is_retryable(d, &sqlx::Error::PoolClosed));
            assert!(!is_retryable(d, &sqlx::Error::RowNotFound));
            assert!(!is_retryable(d, &sqlx::Error::Configuration("bad".into())));
        }
        let e = backend(Dialect::Postgres, "update a lease", io());
        assert!(e.is_retryable());
        assert!(e.to_string().contains("postgres: update a lease"), "{e}");
        let e = connecting(Dialect::MySql, "mysql://u:hunter22@h/db", io());
        assert!(e.is_retryable() && !format!("{e:?}").contains("hunter22"), "{e:?}");
    }

    #[test]
    fn messages_are_scrubbed() {
        let url = "postgres://u:p%40ss@h/db?sslpassword=other";
        let m = scrub("failed for p%40ss and p@ss and other", url);
        assert_eq!(m, "failed for *** and *** and ***");
        assert_eq!(scrub("nothing secret", "sqlite://a.db"), "nothing secret");
    }
}
