//! Effectively-once output on real servers (`SHARDLEASE_TEST_POSTGRES_URL`,
//! `SHARDLEASE_TEST_MYSQL_URL`; skipped when unset) and a SQLite file: the fleet scenario of
//! `eonce::fleet` ends with every produced record in the sink exactly once, whether the leases
//! live in the sink's database or in memory; the same fleet with the default at-least-once
//! checkpointer is run for comparison (its duplicates are reported, not asserted). A zombie's
//! transaction that comes after the new owner's is refused and writes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod eonce;

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::sync::Arc;
use std::time::Duration;

use eonce::fleet::{self, LeasesIn, Output, Report};
use eonce::sink::Sink;
use shardlease_core::store::{Lease, LeaseStore};
use shardlease_core::{
    Batch, CheckpointHandle, Checkpointer, Error, LeaseToken, MemorySource, Position, WorkerId,
};
use shardlease_sql::effectively_once::{FencedTx, TxCheckpointer};
use shardlease_sql::{SqlPool, SqlStore};
use sqlx::Pool;

async fn postgres() -> Option<sqlx::PgPool> {
    let url = common::postgres_url()?;
    Some(sqlx::postgres::PgPoolOptions::new().max_connections(12).connect(&url).await.unwrap())
}

async fn mysql() -> Option<sqlx::MySqlPool> {
    let url = common::mysql_url()?;
    Some(sqlx::mysql::MySqlPoolOptions::new().max_connections(12).connect(&url).await.unwrap())
}

/// A SQLite file of its own (WAL, a busy timeout), kept alive by the returned guard.
async fn sqlite() -> (sqlx::SqlitePool, common::TempDb) {
    use std::str::FromStr;
    let db = common::TempDb::new("eonce");
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url())
        .unwrap()
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    (pool, db)
}

fn check(store: &str, leases: LeasesIn, r: &Report) {
    println!(
        "EONCE store={store} leases={leases:?} output=transactional produced={} rows={} \
         duplicate_rows={} missing={} zombie_refused={:?} zombie_written={}",
        r.produced, r.rows, r.duplicate_rows, r.missing, r.zombie_refused, r.zombie_written
    );
    assert_eq!(r.missing, 0, "{r:?}");
    assert_eq!(r.unknown, 0, "{r:?}");
    assert_eq!(r.duplicated_records, 0, "{r:?}");
    assert_eq!(r.rows, i64::try_from(r.produced).unwrap(), "{r:?}");
    if let Some(refused) = r.zombie_refused {
        assert!(refused, "{r:?}");
    }
}

fn compare(store: &str, r: &Report) {
    println!(
        "EONCE store={store} leases=SameDatabase output=at-least-once produced={} rows={} \
         duplicated_records={} duplicate_rows={} missing={}",
        r.produced, r.rows, r.duplicated_records, r.duplicate_rows, r.missing
    );
    // At least once: nothing missing; duplicates are the point of the comparison, not asserted.
    assert_eq!(r.missing, 0, "{r:?}");
}

macro_rules! fleet_tests {
    ($name:ident, $pool:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exactly_once_with_leases_in_the_same_database() {
                let Some((pool, _guard)) = $pool.await else { return };
                let r = fleet::run(pool, LeasesIn::SameDatabase, Output::Transactional, 11).await;
                check(stringify!($name), LeasesIn::SameDatabase, &r);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exactly_once_with_leases_in_memory() {
                let Some((pool, _guard)) = $pool.await else { return };
                let r = fleet::run(pool, LeasesIn::Memory, Output::Transactional, 12).await;
                check(stringify!($name), LeasesIn::Memory, &r);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn at_least_once_for_comparison() {
                let Some((pool, _guard)) = $pool.await else { return };
                let r = fleet::run(pool, LeasesIn::SameDatabase, Output::AtLeastOnce, 13).await;
                compare(stringify!($name), &r);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_late_zombie_is_refused_and_writes_nothing() {
                let Some((pool, _guard)) = $pool.await else { return };
                late_zombie(pool).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transient_failures_and_unknown_commits_write_nothing_twice() {
                let Some((pool, _guard)) = $pool.await else { return };
                retries(pool).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_stale_lease_row_refuses_the_whole_transaction() {
                let Some((pool, _guard)) = $pool.await else { return };
                stale_lease_row(pool).await;
            }
        }
    };
}

fleet_tests!(postgres, async { postgres().await.map(|p| (p, ())) });
fleet_tests!(mysql, async { mysql().await.map(|p| (p, ())) });
fleet_tests!(sqlite, async { Some(sqlite().await) });

fn token(key: &str, owner: &str, epoch: u64) -> LeaseToken {
    LeaseToken { key: key.into(), owner: WorkerId::new(owner), epoch: Epoch(epoch) }
}

/// Ten records of one shard, and the batch of the first `n`.
fn records(n: usize) -> (MemorySource, Batch, Batch) {
    let source = MemorySource::new(1);
    let shard = source.open_shards()[0].id.clone();
    for i in 0..10 {
        source.put_to_shard(&shard, format!("r{i}")).unwrap();
    }
    let all = source.records(&shard);
    let first = Batch::new(all[..n].to_vec());
    let every = Batch::new(all);
    (source, first, every)
}

async fn write<DB: Sink>(
    cp: &Arc<TxCheckpointer<DB>>,
    t: &LeaseToken,
    table: &Arc<str>,
    writer: &'static str,
    batch: &Batch,
) -> shardlease_core::Result<usize> {
    let as_dyn: Arc<dyn Checkpointer> = cp.clone();
    let handle = CheckpointHandle::new(as_dyn, t.clone());
    let key: Arc<str> = Arc::from(t.key.as_str());
    cp.write_batch(&handle, batch, |b, tx| {
        let (table, key) = (table.clone(), key.clone());
        Box::pin(async move {
            DB::insert_tx(tx, &table, &key, writer, &b.records).await?;
            Ok(())
        })
    })
    .await
    .map(|o| o.written)
}

/// Rows per writer.
async fn rows_by<DB: Sink>(pool: &Pool<DB>, table: &str) -> (i64, usize) {
    let c = DB::counts(pool, table).await;
    (c.values().sum(), c.len())
}

/// The new owner (epoch 2) commits first; the zombie (epoch 1) then tries the same and more
/// records: refused, nothing written, and the new owner later writes only what is missing.
async fn late_zombie<DB: Sink>(pool: Pool<DB>) {
    let prefix = eonce::fresh_prefix();
    let table: Arc<str> = Arc::from(format!("{prefix}sink"));
    DB::create_sink(&pool, &table).await;
    let cp = Arc::new(
        TxCheckpointer::in_checkpoints_table(pool.clone(), "zombie", &prefix).await.unwrap(),
    );
    let (_source, first5, all10) = records(5);
    let zombie = token("shard-a", "old", 1);
    let owner = token("shard-a", "new", 2);

    // The zombie committed a few records while it still owned the shard.
    let first2 = Batch::new(first5.records[..2].to_vec());
    assert_eq!(write(&cp, &zombie, &table, "zombie", &first2).await.unwrap(), 2);
    // The new owner, which read the position before that commit, writes records 1-5: the two
    // already committed are skipped.
    assert_eq!(write(&cp, &owner, &table, "owner", &first5).await.unwrap(), 3);
    // The zombie's next transaction comes after the new owner's: refused, no rows.
    let late = write(&cp, &zombie, &table, "zombie", &all10).await;
    assert!(matches!(late, Err(Error::LeaseLost { epoch: Epoch(1), .. })), "{late:?}");
    assert_eq!(rows_by(&pool, &table).await, (5, 5));
    // Also by hand: a fenced transaction opened with the zombie's token is refused at begin.
    let refused: Result<FencedTx<'_, DB>, Error> = cp.begin(&zombie).await;
    assert!(matches!(refused, Err(Error::LeaseLost { .. })));
    drop(refused);
    // The new owner goes on: only records 6-10 are written.
    assert_eq!(write(&cp, &owner, &table, "owner", &all10).await.unwrap(), 5);
    assert_eq!(rows_by(&pool, &table).await, (10, 10));
    assert_eq!(cp.fetch(&"shard-a".into()).await.unwrap(), all10.last_position());
    // A checkpoint moving this owner's position backwards is refused as invalid input.
    let back = cp.checkpoint(&owner, &first5.last_position().unwrap()).await;
    assert!(matches!(back, Err(Error::InvalidInput(_))), "{back:?}");
    DB::drop_table(&pool, &table).await;
    DB::drop_table(&pool, &format!("{prefix}checkpoints")).await;
}

/// Positions in the lease rows: once the lease moved to a new epoch, the old owner's
/// transaction is refused before any output, and the lease row keeps the new owner's state.
async fn stale_lease_row<DB: Sink>(pool: Pool<DB>)
where
    SqlPool: From<Pool<DB>>,
{
    let prefix = eonce::fresh_prefix();
    let table: Arc<str> = Arc::from(format!("{prefix}sink"));
    DB::create_sink(&pool, &table).await;
    let store = SqlStore::builder()
        .pool(pool.clone())
        .namespace("stale-row")
        .table_prefix(prefix.as_str())
        .connect()
        .await
        .unwrap();
    let cp = Arc::new(TxCheckpointer::<DB>::in_lease_rows(&store).unwrap());
    assert!(cp.stores_in_lease());
    let lease = Lease {
        owner: Some(WorkerId::new("old")),
        epoch: Epoch(1),
        ..Lease::new("shard-b", Position::TrimHorizon)
    };
    store.create_lease(&lease).await.unwrap();
    let old = lease.token().unwrap();
    let (_source, first5, all10) = records(5);
    assert_eq!(write(&cp, &old, &table, "old", &first5).await.unwrap(), 5);
    // The lease moves on (a failover): new owner, new epoch, by the store's compare-and-set.
    let VersionedLease { lease: current, version } =
        store.get_lease(&"shard-b".into()).await.unwrap().unwrap();
    assert_eq!(current.checkpoint, first5.last_position().unwrap());
    let moved = Lease { owner: Some(WorkerId::new("new")), epoch: Epoch(2), ..current };
    store.update_lease(&moved, version).await.unwrap();
    let late = write(&cp, &old, &table, "old", &all10).await;
    assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
    assert_eq!(rows_by(&pool, &table).await, (5, 5));
    let new = moved.token().unwrap();
    assert_eq!(write(&cp, &new, &table, "new", &all10).await.unwrap(), 5);
    let VersionedLease { lease: row, .. } =
        store.get_lease(&"shard-b".into()).await.unwrap().unwrap();
    assert_eq!((row.epoch, row.checkpoint), (Epoch(2), all10.last_position().unwrap()));
    assert_eq!(rows_by(&pool, &table).await, (10, 10));
    store.delete_namespace().await.unwrap();
    for t in ["sink", "leases", "workers", "namespaces", "fleet", "schema_migrations"] {
        DB::drop_table(&pool, &format!("{prefix}{t}")).await;
    }
}

/// A transient error from the batch's writes rolls back and retries the whole transaction; a
/// batch whose commit went through although the caller never learnt it (a connection lost during
/// `COMMIT`) is skipped entirely when it comes again.
async fn retries<DB: Sink>(pool: Pool<DB>) {
    use std::sync::atomic::{AtomicU32, Ordering};
    let prefix = eonce::fresh_prefix();
    let table: Arc<str> = Arc::from(format!("{prefix}sink"));
    DB::create_sink(&pool, &table).await;
    let cp = Arc::new(
        TxCheckpointer::in_checkpoints_table(pool.clone(), "retries", &prefix).await.unwrap(),
    );
    let (_source, first5, all10) = records(5);
    let t = token("shard-c", "w", 7);
    let as_dyn: Arc<dyn Checkpointer> = cp.clone();
    let handle = CheckpointHandle::new(as_dyn, t.clone());
    // The first attempt writes its rows, then fails as a dropped connection would.
    let calls = Arc::new(AtomicU32::new(0));
    let outcome = cp
        .write_batch(&handle, &first5, |b, tx| {
            let (table, calls) = (table.clone(), calls.clone());
            Box::pin(async move {
                DB::insert_tx(tx, &table, "shard-c", "w", &b.records).await?;
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected");
                    return Err(sqlx::Error::Io(io).into());
                }
                Ok(())
            })
        })
        .await
        .unwrap();
    assert_eq!((outcome.written, outcome.skipped, outcome.attempts), (5, 0, 2));
    assert_eq!(rows_by(&pool, &table).await, (5, 5));
    // The next batch commits by hand, and the caller "loses" the answer and tries again.
    let mut fenced = cp.begin(&t).await.unwrap();
    let unseen = fenced.unseen(&all10);
    assert_eq!(unseen.records.len(), 5);
    DB::insert_tx(fenced.transaction(), &table, "shard-c", "w", &unseen.records).await.unwrap();
    fenced.commit(&all10.last_position().unwrap()).await.unwrap();
    let again = write(&cp, &t, &table, "w", &all10).await.unwrap();
    assert_eq!(again, 0);
    assert_eq!(rows_by(&pool, &table).await, (10, 10));
    // A permanent error is returned as it is, after one attempt, and leaves nothing behind.
    let as_dyn: Arc<dyn Checkpointer> = cp.clone();
    let other = CheckpointHandle::new(as_dyn, token("shard-d", "w", 7));
    let failed = cp
        .write_batch(&other, &all10, |_b, _tx| {
            Box::pin(async move { Err("the sink rejected the rows".into()) })
        })
        .await;
    assert!(matches!(failed, Err(Error::Backend { retryable: false, .. })), "{failed:?}");
    assert_eq!(cp.fetch(&"shard-d".into()).await.unwrap(), None);
    DB::drop_table(&pool, &table).await;
    DB::drop_table(&pool, &format!("{prefix}checkpoints")).await;
}
