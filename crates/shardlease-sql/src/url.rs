//! Connection URLs: which dialect, and the shardlease parameters taken out before the rest goes
//! to sqlx.
//!
//! Accepted: `postgres://`, `postgresql://`, `sqlite://path`, `sqlite:path`, `sqlite::memory:`,
//! `mysql://` and `mariadb://` (spoken to with the MySQL driver). shardlease's own query
//! parameters (`namespace`, `table_prefix`, `create_schema`, `max_connections`, `notify`) are
//! removed;
//! everything else (`sslmode`, `mode=rwc`, ...) is handed to sqlx unchanged. The options are
//! read with core's [`QueryOptions`] (a duplicate is refused); error messages never echo the URL.

use shardlease_core::store::url::{QueryOptions, NAMESPACE_OPTION};
use shardlease_core::{Error, Result};

use crate::dialect::Dialect;

/// A URL split into what sqlx gets and what shardlease keeps.
#[derive(Debug, Default)]
pub(crate) struct StoreUrl {
    /// The URL for sqlx (scheme normalized, shardlease parameters removed).
    pub(crate) sqlx_url: String,
    pub(crate) dialect: Option<Dialect>,
    pub(crate) namespace: Option<String>,
    pub(crate) table_prefix: Option<String>,
    pub(crate) create_schema: Option<bool>,
    pub(crate) max_connections: Option<u32>,
    /// PostgreSQL: whether the store announces changes (`notify=false` turns it off).
    pub(crate) notify: Option<bool>,
    /// SQLite: an in-memory database (one connection holds it).
    pub(crate) sqlite_in_memory: bool,
    /// SQLite: `sqlite::memory:?name=NAME`, an in-memory database every `connect` of this
    /// process with the same name shares.
    pub(crate) sqlite_memory_name: Option<String>,
    /// SQLite: the URL says `mode=...` itself (otherwise the file is created when missing).
    pub(crate) sqlite_mode_given: bool,
}

/// The dialect a URL's scheme names.
pub(crate) fn dialect_of(url: &str) -> Result<Dialect> {
    let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
    match scheme.as_str() {
        "postgres" | "postgresql" => Ok(Dialect::Postgres),
        "sqlite" => Ok(Dialect::Sqlite),
        "mysql" | "mariadb" => Ok(Dialect::MySql),
        _ => Err(Error::Config(format!(
            "the SQL store does not know the URL scheme `{}`; use postgres://, postgresql://, \
             sqlite://, sqlite::memory:, mysql:// or mariadb://",
            scheme.chars().take(20).collect::<String>()
        ))),
    }
}

/// Parses `url`.
pub(crate) fn parse(url: &str) -> Result<StoreUrl> {
    let dialect = dialect_of(url)?;
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut parsed = StoreUrl { dialect: Some(dialect), ..StoreUrl::default() };
    let mut options = QueryOptions::parse("SQL store", query.unwrap_or(""))?;
    parsed.namespace = options.string(NAMESPACE_OPTION)?;
    parsed.table_prefix = options.string("table_prefix")?;
    parsed.create_schema = options.bool("create_schema")?;
    parsed.max_connections = options
        .integer("max_connections", 1..=u64::from(u32::MAX))?
        .and_then(|n| u32::try_from(n).ok());
    parsed.notify = options.bool("notify")?;
    if dialect == Dialect::Sqlite {
        parsed.sqlite_memory_name = options.non_empty("name")?;
    }
    let rest = options.into_rest();
    if dialect == Dialect::Sqlite {
        if let Some((_, mode)) = rest.iter().find(|(k, _)| k == "mode") {
            parsed.sqlite_mode_given = true;
            parsed.sqlite_in_memory |= mode == "memory";
        }
    }
    let base = match base.get(..8) {
        Some(s) if s.eq_ignore_ascii_case("mariadb:") => format!("mysql:{}", &base[8..]),
        _ => base.to_owned(),
    };
    if dialect == Dialect::Sqlite {
        let path = base.trim_start_matches("sqlite://").trim_start_matches("sqlite:");
        parsed.sqlite_in_memory |= path == ":memory:";
        if parsed.sqlite_memory_name.is_some() && !parsed.sqlite_in_memory {
            return Err(Error::Config(
                "name names an in-memory database: use it as sqlite::memory:?name=NAME".into(),
            ));
        }
    }
    parsed.sqlx_url = if rest.is_empty() {
        base
    } else {
        let kept = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(rest).finish();
        format!("{base}?{kept}")
    };
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn shardlease_parameters_are_removed() {
        let u = parse(
            "postgres://u:pw@h:5432/db?namespace=orders&sslmode=disable&table_prefix=app_&create_schema=false&max_connections=3",
        )
        .unwrap();
        assert_eq!(u.sqlx_url, "postgres://u:pw@h:5432/db?sslmode=disable");
        assert_eq!(u.dialect, Some(Dialect::Postgres));
        assert_eq!(u.namespace.as_deref(), Some("orders"));
        assert_eq!(u.table_prefix.as_deref(), Some("app_"));
        assert_eq!(u.create_schema, Some(false));
        assert_eq!(u.max_connections, Some(3));
        let u = parse("postgresql://h/db").unwrap();
        assert_eq!(u.sqlx_url, "postgresql://h/db");
        assert_eq!(u.create_schema, None);
    }

    #[test]
    fn mariadb_is_spoken_to_as_mysql() {
        let u = parse("mariadb://root@127.0.0.1:3306/test?namespace=x").unwrap();
        assert_eq!(u.sqlx_url, "mysql://root@127.0.0.1:3306/test");
        assert_eq!(u.dialect, Some(Dialect::MySql));
    }

    #[test]
    fn sqlite_forms() {
        let u = parse("sqlite::memory:").unwrap();
        assert!(u.sqlite_in_memory && !u.sqlite_mode_given);
        assert_eq!(u.sqlx_url, "sqlite::memory:");
        let u = parse("sqlite://:memory:?namespace=a").unwrap();
        assert!(u.sqlite_in_memory);
        assert_eq!(u.sqlx_url, "sqlite://:memory:");
        let u = parse("sqlite:///tmp/x.db?mode=rwc&create_schema=1").unwrap();
        assert!(!u.sqlite_in_memory && u.sqlite_mode_given);
        assert_eq!(u.sqlx_url, "sqlite:///tmp/x.db?mode=rwc");
        assert_eq!(u.create_schema, Some(true));
        assert!(parse("sqlite://?mode=memory").unwrap().sqlite_in_memory);
    }

    #[test]
    fn bad_urls_are_config_errors_without_echo() {
        for (url, want) in [
            ("redis://:s3cret@h", "does not know the URL scheme `redis`"),
            ("postgres://u:s3cret@h/db?create_schema=maybe", "create_schema"),
            ("postgres://u:s3cret@h/db?max_connections=0", "max_connections"),
        ] {
            match parse(url) {
                Err(Error::Config(m)) => {
                    assert!(m.contains(want), "{m}");
                    assert!(!m.contains("s3cret"), "{m}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
