//! The per-dialect glue of the transactional checkpointer: [`TxDatabase`] is implemented for
//! `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite` by one macro, so the statements run inside
//! a user's transaction are written once and compiled for each enabled dialect. Every value is a
//! bound parameter ([`Arg`]); only validated table names are spliced into statement texts.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::dialect::Dialect;
use crate::pool::SqlPool;
use __private::{Arg, RawRow};

/// A sqlx database the transactional checkpointer supports: `sqlx::Postgres`, `sqlx::MySql` or
/// `sqlx::Sqlite` (each with its crate feature). Sealed: its methods are internal.
pub trait TxDatabase: sqlx::Database + __private::Backend {}

impl<T: sqlx::Database + __private::Backend> TxDatabase for T {}

/// Internal: the sealed part of [`TxDatabase`]. Not part of the public API.
#[doc(hidden)]
pub mod __private {
    use super::*;
    use crate::codec::{col, Col};

    /// A value bound to a statement, in placeholder order.
    #[derive(Clone, Debug)]
    pub enum Arg {
        /// Text.
        Text(String),
        /// Text or NULL.
        OptText(Option<String>),
        /// A 64-bit integer.
        Int(i64),
        /// A 64-bit integer or NULL.
        OptInt(Option<i64>),
    }

    /// A position row as the driver returned it: `epoch, owner, checkpoint_kind, checkpoint_seq,
    /// checkpoint_sub, checkpoint_millis, tag` (`tag`: the lease row's version, or the checkpoint
    /// row's commit count).
    pub struct RawRow {
        pub(crate) epoch: Col<i64>,
        pub(crate) owner: Col<String>,
        pub(crate) kind: Col<String>,
        pub(crate) seq: Col<String>,
        pub(crate) sub: Col<i64>,
        pub(crate) millis: Col<i64>,
        pub(crate) tag: Col<i64>,
    }

    impl RawRow {
        pub(crate) fn read<R>(row: &R) -> RawRow
        where
            R: Row,
            usize: ColumnIndex<R>,
            for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
            for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
        {
            RawRow {
                epoch: col(row, 0),
                owner: col(row, 1),
                kind: col(row, 2),
                seq: col(row, 3),
                sub: col(row, 4),
                millis: col(row, 5),
                tag: col(row, 6),
            }
        }
    }

    /// A sqlx result.
    pub type SqlxResult<T> = std::result::Result<T, sqlx::Error>;

    /// What the checkpointer needs from one dialect.
    #[async_trait]
    pub trait Backend: sqlx::Database {
        /// The dialect.
        fn dialect() -> Dialect;
        /// This dialect's pool inside a [`SqlPool`], if it is one.
        fn pool_of(pool: &SqlPool) -> Option<sqlx::Pool<Self>>;
        /// Begins a transaction that will write (SQLite: `BEGIN IMMEDIATE`, so the write lock
        /// is taken at once and the transaction cannot fail later on a lock upgrade).
        async fn begin_writing(
            pool: &sqlx::Pool<Self>,
        ) -> SqlxResult<sqlx::Transaction<'static, Self>>;
        /// Runs `sql` with `args`; the number of rows it changed (matched, on MySQL).
        async fn exec(
            conn: &mut Self::Connection,
            sql: &Arc<str>,
            args: Vec<Arg>,
        ) -> SqlxResult<u64>;
        /// Runs `sql` with `args`; its first row, if any.
        async fn fetch_row(
            conn: &mut Self::Connection,
            sql: &Arc<str>,
            args: Vec<Arg>,
        ) -> SqlxResult<Option<RawRow>>;
    }
}

macro_rules! backend {
    ($db:ty, $feature:literal, $variant:ident, $begin:expr) => {
        #[cfg(feature = $feature)]
        #[async_trait]
        impl __private::Backend for $db {
            fn dialect() -> Dialect {
                Dialect::$variant
            }

            fn pool_of(pool: &SqlPool) -> Option<sqlx::Pool<Self>> {
                #[allow(unreachable_patterns)]
                match pool {
                    SqlPool::$variant(p) => Some(p.clone()),
                    _ => None,
                }
            }

            async fn begin_writing(
                pool: &sqlx::Pool<Self>,
            ) -> __private::SqlxResult<sqlx::Transaction<'static, Self>> {
                let begin: Option<&'static str> = $begin;
                match begin {
                    Some(statement) => pool.begin_with(statement).await,
                    None => pool.begin().await,
                }
            }

            async fn exec(
                conn: &mut Self::Connection,
                sql: &Arc<str>,
                args: Vec<Arg>,
            ) -> __private::SqlxResult<u64> {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(sql)));
                for a in args {
                    q = match a {
                        Arg::Text(v) => q.bind(v),
                        Arg::OptText(v) => q.bind(v),
                        Arg::Int(v) => q.bind(v),
                        Arg::OptInt(v) => q.bind(v),
                    };
                }
                Ok(q.execute(&mut *conn).await?.rows_affected())
            }

            async fn fetch_row(
                conn: &mut Self::Connection,
                sql: &Arc<str>,
                args: Vec<Arg>,
            ) -> __private::SqlxResult<Option<RawRow>> {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(sql)));
                for a in args {
                    q = match a {
                        Arg::Text(v) => q.bind(v),
                        Arg::OptText(v) => q.bind(v),
                        Arg::Int(v) => q.bind(v),
                        Arg::OptInt(v) => q.bind(v),
                    };
                }
                Ok(q.fetch_optional(&mut *conn).await?.map(|row| RawRow::read(&row)))
            }
        }
    };
}

backend!(sqlx::Postgres, "postgres", Postgres, None);
backend!(sqlx::MySql, "mysql", MySql, None);
backend!(sqlx::Sqlite, "sqlite", Sqlite, Some("BEGIN IMMEDIATE"));
