//! The effectively-once sink of a fault run (`--exactly-once`): each consumer writes every record
//! as a row of one PostgreSQL table, in the transaction that also moves the shard's position
//! (`shardlease-sql`'s `TxCheckpointer`, fenced by the lease epoch), so the checker can hold the
//! fleet to *exactly once*: every acknowledged record in the table, none twice, whatever the
//! nemesis did. The table has no unique constraint on purpose: a duplicate must show.
//!
//! Rows carry the run's namespace, so runs sharing one database never see each other's rows; the
//! positions live in `chaos_checkpoints` under the same namespace.

use std::sync::Arc;

use shardlease::{BoxError, ProcessorFactory};
use shardlease_sql::effectively_once::{transactional_fn, TxCheckpointer};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

use crate::events::{ConsumerEvent, LineFile};

/// The table holding the records' rows (named literally in the statements).
pub const TABLE: &str = "chaos_sink";
/// The prefix of the positions table (`chaos_checkpoints`).
pub const PREFIX: &str = "chaos_";

/// Connects to the sink's database (a message without the URL, which may hold a password).
pub async fn connect(url: &str) -> Result<PgPool, BoxError> {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| {
            format!("cannot connect to the sink {}: {e}", shardlease::redact_url(url)).into()
        })
}

/// Creates the rows table if it does not exist (the harness does it once, before the fleet).
pub async fn create_table(pool: &PgPool) -> Result<(), BoxError> {
    let sql = "CREATE TABLE IF NOT EXISTS chaos_sink (run TEXT NOT NULL, shard TEXT NOT NULL, \
               seq TEXT NOT NULL, id TEXT NOT NULL)";
    match sqlx::query(sql).execute(pool).await {
        Ok(_) => Ok(()),
        // Another run created it at the same moment.
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("23505") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The ids of the rows `run` wrote, one per row (an id twice is a record written twice).
pub async fn ids(pool: &PgPool, run: &str) -> Result<Vec<String>, BoxError> {
    let rows =
        sqlx::query("SELECT id FROM chaos_sink WHERE run = $1").bind(run).fetch_all(pool).await?;
    rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
}

/// The worker's checkpointer and the processor factory that writes each batch's rows in the
/// fenced transaction. Each batch handed to the closure is also logged to `out` as `Rec` events
/// (records *attempted*: a transaction may still roll back), which is what the harness's
/// warm-up waits for; the verdict comes from the table.
pub async fn processors(
    pool: PgPool,
    run: &str,
    out: Arc<std::sync::Mutex<LineFile>>,
) -> Result<(Arc<TxCheckpointer<sqlx::Postgres>>, Arc<dyn ProcessorFactory>), BoxError> {
    let checkpointer = Arc::new(TxCheckpointer::in_checkpoints_table(pool, run, PREFIX).await?);
    let run_id: Arc<str> = Arc::from(run);
    let factory = transactional_fn(checkpointer.clone(), move |ctx, batch, tx| {
        let run_id = run_id.clone();
        let out = out.clone();
        Box::pin(async move {
            let shard = ctx.key().to_string();
            let mut events = Vec::with_capacity(batch.records.len());
            for r in batch.records.iter() {
                let id = String::from_utf8_lossy(&r.data).into_owned();
                sqlx::query("INSERT INTO chaos_sink (run, shard, seq, id) VALUES ($1, $2, $3, $4)")
                    .bind(run_id.as_ref())
                    .bind(shard.as_str())
                    .bind(r.seq.as_str())
                    .bind(id.as_str())
                    .execute(&mut **tx)
                    .await?;
                events.push(ConsumerEvent::Rec {
                    shard: shard.clone(),
                    seq: r.seq.to_string(),
                    id,
                    owner: ctx.token.owner.to_string(),
                    epoch: ctx.epoch().get(),
                });
            }
            // The log is a hint for the harness, not the verdict: an I/O error here must not
            // fail a transaction that is otherwise fine.
            let mut f = out.lock().unwrap_or_else(|p| p.into_inner());
            for e in &events {
                let _ = f.push(e);
            }
            let _ = f.sync();
            Ok(())
        })
    });
    Ok((checkpointer, factory))
}
