//! A stream written into a PostgreSQL table effectively once: each batch's rows and the position
//! after them commit in one transaction, fenced by the lease epoch, so a crash, a failover or a
//! rebalance never writes a record's row twice, even though the table has no unique constraint.
//!
//! ```text
//! cargo run --example effectively_once --features postgres -- --url postgres://postgres@127.0.0.1:5432/test
//! DATABASE_URL=postgres://... cargo run --example effectively_once --features postgres -- --leases-in-postgres
//! ```
//!
//! Three workers share an 8-shard in-memory stream while a producer writes to it; half-way one
//! worker crashes (its leases fail over) and another joins. At the end the demo counts the rows
//! of this run in `shardlease_demo_events` against the records produced. The leases live in memory
//! (positions then in `shardlease_demo_checkpoints`) or, with `--leases-in-postgres`, in the same
//! database (`shardlease_demo_leases`, positions in the lease rows). See docs/effectively-once.md.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use shardlease::store::{LeaseStore, MemoryBackend};
use shardlease::{Config, MemorySource, Namespace, Position, ShardSource, Worker};
use shardlease_examples::poll_until;
use shardlease_sql::effectively_once::{transactional_fn, TxCheckpointer};
use shardlease_sql::{redact_url, SqlStore};
use sqlx::Row;

const USAGE: &str = "\
usage: effectively_once [--url URL] [--records N] [--leases-in-postgres]

  --url URL              PostgreSQL URL (default: $DATABASE_URL)
  --records N            records to produce, 1..=1000000 (default 5000)
  --leases-in-postgres   keep the leases in the same database (default: in memory)";

const PREFIX: &str = "shardlease_demo_";
const SINK: &str = "shardlease_demo_events";

struct Args {
    url: String,
    records: u32,
    leases_in_postgres: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut url = std::env::var("DATABASE_URL").ok();
    let mut records = 5_000;
    let mut leases_in_postgres = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--url" => url = Some(it.next().ok_or("--url needs a value")?),
            "--records" => {
                let v = it.next().ok_or("--records needs a value")?;
                records = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .ok_or_else(|| format!("--records must be 1..=1000000, got {v:?}"))?;
            }
            "--leases-in-postgres" => leases_in_postgres = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let url = url.ok_or("no database: pass --url or set DATABASE_URL")?;
    Ok(Some(Args { url, records, leases_in_postgres }))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match parse_args() {
        Ok(Some(args)) => match run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("effectively_once: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("effectively_once: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&args.url)
        .await
        // sqlx errors may echo connection details: say which database, without its password.
        .map_err(|_| format!("cannot connect to {}", redact_url(&args.url)))?;
    let create = "CREATE TABLE IF NOT EXISTS shardlease_demo_events \
                  (run TEXT NOT NULL, shard TEXT NOT NULL, seq TEXT NOT NULL, payload BYTEA)";
    sqlx::query(create).execute(&pool).await.map_err(|e| e.to_string())?;
    // Every run has a namespace of its own, so runs never see each other's rows or positions.
    let millis = shardlease::store::now_millis();
    let run = format!("demo-{millis}");
    let namespace: Namespace = run.parse().map_err(|e: shardlease::Error| e.to_string())?;

    let (store, checkpointer): (Arc<dyn LeaseStore>, TxCheckpointer<sqlx::Postgres>) =
        if args.leases_in_postgres {
            let store = SqlStore::builder()
                .pool(pool.clone())
                .namespace(run.as_str())
                .table_prefix(PREFIX)
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            let cp = TxCheckpointer::in_lease_rows(&store).map_err(|e| e.to_string())?;
            (Arc::new(store), cp)
        } else {
            let cp = TxCheckpointer::in_checkpoints_table(pool.clone(), &run, PREFIX)
                .await
                .map_err(|e| e.to_string())?;
            (Arc::new(MemoryBackend::new().store(namespace.clone())), cp)
        };
    let checkpointer = Arc::new(checkpointer);

    // The whole processor: write this batch's rows in this transaction. The library begins it,
    // checks the epoch, skips records already committed, checkpoints, commits and retries.
    let run_id: Arc<str> = Arc::from(run.as_str());
    let factory = transactional_fn(checkpointer.clone(), move |ctx, batch, tx| {
        let run_id = run_id.clone();
        Box::pin(async move {
            for r in batch.records.iter() {
                sqlx::query(
                    "INSERT INTO shardlease_demo_events (run, shard, seq, payload) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(run_id.as_ref())
                .bind(ctx.key().as_str())
                .bind(r.seq.as_str())
                .bind(r.data.as_ref())
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        })
    });

    let source = MemorySource::new(8);
    let config = Config::new(&namespace)
        .map_err(|e| e.to_string())?
        .with_heartbeat(Duration::from_millis(200))
        .with_initial_position(Position::TrimHorizon);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let start = |n: usize| -> Result<shardlease::WorkerHandle, String> {
        let cfg = config.clone().with_worker_id(format!("worker-{n}"));
        Worker::builder(cfg, store.clone(), src.clone(), factory.clone())
            .checkpointer(checkpointer.clone())
            .build()
            .map(Worker::start)
            .map_err(|e| e.to_string())
    };
    let mut workers = vec![start(1)?, start(2)?, start(3)?];
    println!("run {run}: 3 workers, 8 shards, producing {} records", args.records);

    let half = args.records / 2;
    for i in 0..args.records {
        source.put(&format!("key-{i}"), format!("record {i}"));
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if i == half {
            println!("crashing worker-1 (its leases fail over) and starting worker-4");
            workers.remove(0).crash();
            workers.push(start(4)?);
        }
    }

    let produced = i64::from(args.records);
    let count = |sql: &'static str| {
        let (pool, run) = (pool.clone(), run.clone());
        async move {
            sqlx::query(sql)
                .bind(run)
                .fetch_one(&pool)
                .await
                .and_then(|row| row.try_get::<i64, usize>(0))
                .ok()
        }
    };
    let distinct_sql = "SELECT COUNT(*) FROM (SELECT DISTINCT shard, seq FROM \
                        shardlease_demo_events WHERE run = $1) d";
    poll_until(
        "every record in the table",
        Duration::from_secs(300),
        Duration::from_millis(200),
        || {
            let c = count(distinct_sql);
            async move { c.await.filter(|n| *n >= produced) }
        },
    )
    .await?;
    for w in &workers {
        w.shutdown().await.record_error.map_or(Ok(()), Err)?;
    }
    let rows = count("SELECT COUNT(*) FROM shardlease_demo_events WHERE run = $1")
        .await
        .ok_or("counting the rows failed")?;
    let distinct = count(distinct_sql).await.ok_or("counting the records failed")?;
    println!(
        "records produced: {produced}; rows in {SINK}: {rows}; distinct records: {distinct}; \
         duplicates: {}",
        rows - distinct
    );
    if rows == produced && distinct == produced {
        println!("every record written exactly once");
        Ok(())
    } else {
        Err("the table does not hold every record exactly once".to_owned())
    }
}
