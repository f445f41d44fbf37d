//! The sink of the tests: a table with no unique constraint at all (`shard, seq, sub, worker`),
//! so every duplicate write would show, written by the same statement on each dialect.

use async_trait::async_trait;
use shardlease_core::Record;
use shardlease_sql::effectively_once::TxDatabase;
use sqlx::{AssertSqlSafe, Pool, Row, Transaction};

/// Rows per `(shard, seq)`, sorted.
pub type Counts = std::collections::BTreeMap<(String, String), i64>;

/// A dialect the tests can write the sink in.
#[async_trait]
pub trait Sink: TxDatabase {
    /// `$1` or `?`.
    fn ph(n: usize) -> String;
    /// Creates the sink table.
    async fn create_sink(pool: &Pool<Self>, table: &str);
    /// Inserts one row per record inside `tx`.
    async fn insert_tx(
        tx: &mut Transaction<'static, Self>,
        table: &str,
        shard: &str,
        worker: &str,
        records: &[Record],
    ) -> Result<(), sqlx::Error>;
    /// Inserts one row per record, autocommit (the at-least-once way).
    async fn insert(
        pool: &Pool<Self>,
        table: &str,
        shard: &str,
        worker: &str,
        records: &[Record],
    ) -> Result<(), sqlx::Error>;
    /// Rows per `(shard, seq)`.
    async fn counts(pool: &Pool<Self>, table: &str) -> Counts;
    /// Drops the sink table.
    async fn drop_table(pool: &Pool<Self>, table: &str);
}

/// The multi-row `INSERT` of `n` records.
fn insert_sql<DB: Sink>(table: &str, n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let b = i * 4;
            format!("({}, {}, {}, {})", DB::ph(b + 1), DB::ph(b + 2), DB::ph(b + 3), DB::ph(b + 4))
        })
        .collect();
    format!("INSERT INTO {table} (shard, seq, sub, worker) VALUES {}", rows.join(", "))
}

macro_rules! sink {
    ($db:ty, $ph:expr, $text:literal) => {
        #[async_trait]
        impl Sink for $db {
            fn ph(n: usize) -> String {
                let f: fn(usize) -> String = $ph;
                f(n)
            }

            async fn create_sink(pool: &Pool<Self>, table: &str) {
                let sql = format!(
                    "CREATE TABLE {table} (shard {t} NOT NULL, seq {t} NOT NULL, sub BIGINT NOT NULL, worker {t} NOT NULL)",
                    t = $text
                );
                sqlx::query(AssertSqlSafe(sql)).execute(pool).await.unwrap();
            }

            async fn insert_tx(
                tx: &mut Transaction<'static, Self>,
                table: &str,
                shard: &str,
                worker: &str,
                records: &[Record],
            ) -> Result<(), sqlx::Error> {
                let mut q = sqlx::query(AssertSqlSafe(insert_sql::<Self>(table, records.len())));
                for r in records {
                    q = q.bind(shard.to_owned()).bind(r.seq.as_str().to_owned());
                    q = q.bind(r.sub as i64).bind(worker.to_owned());
                }
                q.execute(&mut **tx).await.map(|_| ())
            }

            async fn insert(
                pool: &Pool<Self>,
                table: &str,
                shard: &str,
                worker: &str,
                records: &[Record],
            ) -> Result<(), sqlx::Error> {
                let mut q = sqlx::query(AssertSqlSafe(insert_sql::<Self>(table, records.len())));
                for r in records {
                    q = q.bind(shard.to_owned()).bind(r.seq.as_str().to_owned());
                    q = q.bind(r.sub as i64).bind(worker.to_owned());
                }
                q.execute(pool).await.map(|_| ())
            }

            async fn counts(pool: &Pool<Self>, table: &str) -> Counts {
                let sql = format!("SELECT shard, seq, COUNT(*) FROM {table} GROUP BY shard, seq");
                let rows = sqlx::query(AssertSqlSafe(sql)).fetch_all(pool).await.unwrap();
                rows.iter()
                    .map(|r| {
                        let shard: String = r.try_get(0).unwrap();
                        let seq: String = r.try_get(1).unwrap();
                        let n: i64 = r.try_get(2).unwrap();
                        ((shard, seq), n)
                    })
                    .collect()
            }

            async fn drop_table(pool: &Pool<Self>, table: &str) {
                let sql = format!("DROP TABLE IF EXISTS {table}");
                let _ = sqlx::query(AssertSqlSafe(sql)).execute(pool).await;
            }
        }
    };
}

sink!(sqlx::Postgres, |n| format!("${n}"), "TEXT");
sink!(sqlx::MySql, |_| "?".to_owned(), "VARCHAR(300)");
sink!(sqlx::Sqlite, |n| format!("?{n}"), "TEXT");
