//! Throughput of effectively-once output on PostgreSQL next to the at-least-once path, in one run:
//! four shards written concurrently in batches of 100 and 500, each batch a multi-row `INSERT`
//! into a sink table; effectively once = the insert and the checkpoint in one fenced transaction
//! (positions in the lease rows, or in `<prefix>checkpoints`); at least once = an autocommit
//! insert, then the default checkpointer's compare-and-set on the lease row.
//!
//! A measurement, not a check: `SHARDLEASE_TEST_POSTGRES_URL=... cargo test -p shardlease-sql
//! --test effectively_once_throughput -- --ignored --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod eonce;

use shardlease_core::Epoch;
use std::sync::Arc;
use std::time::Instant;

use eonce::sink::Sink;
use shardlease_core::store::{Lease, LeaseStore, StoreCheckpointer};
use shardlease_core::{Batch, CheckpointHandle, Checkpointer, MemorySource, Position, WorkerId};
use shardlease_sql::effectively_once::TxCheckpointer;
use shardlease_sql::SqlStore;

const SHARDS: usize = 4;
const PER_SHARD: usize = 10_000;

#[derive(Clone, Copy, Debug)]
enum Path {
    TxLeaseRows,
    TxCheckpointsTable,
    AtLeastOnce,
}

async fn measure(pool: &sqlx::PgPool, source: &MemorySource, path: Path, batch: usize) -> f64 {
    let prefix = eonce::fresh_prefix();
    let table: Arc<str> = Arc::from(format!("{prefix}sink"));
    sqlx::Postgres::create_sink(pool, &table).await;
    let store = SqlStore::builder()
        .pool(pool.clone())
        .namespace("throughput")
        .table_prefix(prefix.as_str())
        .connect()
        .await
        .unwrap();
    let tx_cp: Option<Arc<TxCheckpointer<sqlx::Postgres>>> = match path {
        Path::TxLeaseRows => Some(Arc::new(TxCheckpointer::in_lease_rows(&store).unwrap())),
        Path::TxCheckpointsTable => Some(Arc::new(
            TxCheckpointer::in_checkpoints_table(pool.clone(), "throughput", &prefix)
                .await
                .unwrap(),
        )),
        Path::AtLeastOnce => None,
    };
    let store_cp: Arc<dyn Checkpointer> = Arc::new(StoreCheckpointer::new(Arc::new(store.clone())));
    let shards: Vec<_> = source.open_shards().into_iter().map(|s| s.id).collect();
    for key in &shards {
        let lease = Lease {
            owner: Some(WorkerId::new("bench")),
            epoch: Epoch(1),
            ..Lease::new(key.clone(), Position::TrimHorizon)
        };
        store.create_lease(&lease).await.unwrap();
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for key in shards {
        let token = Lease {
            owner: Some(WorkerId::new("bench")),
            epoch: Epoch(1),
            ..Lease::new(key.clone(), Position::TrimHorizon)
        }
        .token()
        .unwrap();
        let records = source.records(&key);
        let (pool, table, tx_cp, store_cp) =
            (pool.clone(), table.clone(), tx_cp.clone(), store_cp.clone());
        tasks.push(tokio::spawn(async move {
            let k: Arc<str> = Arc::from(key.as_str());
            for chunk in records.chunks(batch) {
                let b = Batch::new(chunk.to_vec());
                match &tx_cp {
                    Some(cp) => {
                        let as_dyn: Arc<dyn Checkpointer> = cp.clone();
                        let handle = CheckpointHandle::new(as_dyn, token.clone());
                        cp.write_batch(&handle, &b, |b, tx| {
                            let (t, k) = (table.clone(), k.clone());
                            Box::pin(async move {
                                sqlx::Postgres::insert_tx(tx, &t, &k, "bench", &b.records).await?;
                                Ok(())
                            })
                        })
                        .await
                        .unwrap();
                    }
                    None => {
                        sqlx::Postgres::insert(&pool, &table, &k, "bench", &b.records)
                            .await
                            .unwrap();
                        let handle = CheckpointHandle::new(store_cp.clone(), token.clone());
                        handle.checkpoint_batch(&b).await.unwrap();
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let rows: i64 = sqlx::Postgres::counts(pool, &table).await.values().sum();
    assert_eq!(rows, (SHARDS * PER_SHARD) as i64);
    store.delete_namespace().await.unwrap();
    for t in
        ["sink", "checkpoints", "leases", "workers", "namespaces", "fleet", "schema_migrations"]
    {
        sqlx::Postgres::drop_table(pool, &format!("{prefix}{t}")).await;
    }
    (SHARDS * PER_SHARD) as f64 / secs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn throughput_on_postgres() {
    let Some(url) = common::postgres_url() else { return };
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(8).connect(&url).await.unwrap();
    let source = MemorySource::new(SHARDS);
    let shards: Vec<_> = source.open_shards().into_iter().map(|s| s.id).collect();
    for i in 0..PER_SHARD {
        for s in &shards {
            source.put_to_shard(s, format!("record {i}")).unwrap();
        }
    }
    println!("{SHARDS} shards x {PER_SHARD} records, written concurrently per shard");
    for batch in [100, 500] {
        for path in [Path::TxLeaseRows, Path::TxCheckpointsTable, Path::AtLeastOnce] {
            let rate = measure(&pool, &source, path, batch).await;
            println!("THROUGHPUT batch={batch:<4} path={path:<20?} records/s={rate:>9.0}");
        }
    }
}
