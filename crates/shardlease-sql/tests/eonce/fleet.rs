//! The fleet scenario: workers on the memory source writing every record into a sink table with
//! no unique constraint, through crashes, a join, a leave, a split and a merge, a worker
//! partitioned from the lease store past its failover timeout (with a zombie that keeps trying to
//! commit under its stale token), and a store failing a tenth of its calls. Every phase waits for
//! progress in the sink, never for a fixed time. The report counts rows per shard and sequence
//! number against what the source produced.

use shardlease_core::store::VersionedLease;
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    processor_fn, Batch, CheckpointHandle, Checkpointer, Config, Error, LeaseKey, MemorySource,
    Position, ShardSource, WorkerId,
};
use shardlease_sql::effectively_once::{transactional_fn, TxCheckpointer};
use shardlease_sql::{SqlPool, SqlStore};
use shardlease_testkit::cluster::{wait_until, Cluster, StoreForWorker};
use shardlease_testkit::{fresh_namespace, Faults, FaultyStore};
use sqlx::Pool;

use super::sink::{Counts, Sink};

/// Where the leases live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeasesIn {
    /// A `SqlStore` in the sink's database (transactional runs keep positions in its rows).
    SameDatabase,
    /// The in-memory store (transactional runs keep positions in `<prefix>checkpoints`).
    Memory,
}

/// How the output is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `transactional_fn` with a `TxCheckpointer`.
    Transactional,
    /// Autocommit inserts, then the default checkpointer (`processor_fn`).
    AtLeastOnce,
}

/// What a run produced and what the sink holds.
#[derive(Debug)]
pub struct Report {
    /// Records the source holds in all.
    pub produced: usize,
    /// Rows in the sink.
    pub rows: i64,
    /// Records with more than one row, and the rows beyond the first.
    pub duplicated_records: usize,
    /// Rows beyond the first of each record.
    pub duplicate_rows: i64,
    /// Records with no row.
    pub missing: usize,
    /// Rows of no produced record.
    pub unknown: usize,
    /// Whether the zombie's commit was refused (transactional runs that had one).
    pub zombie_refused: Option<bool>,
    /// Records the zombie wrote before the new owner's first commit (skipped by it later).
    pub zombie_written: usize,
}

const HB: Duration = Duration::from_millis(250);
const LONG: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(100);

async fn distinct<DB: Sink>(pool: &Pool<DB>, table: &str) -> usize {
    DB::counts(pool, table).await.len()
}

async fn wait_rows<DB: Sink>(pool: &Pool<DB>, table: &str, n: usize, what: &str) {
    wait_until(what, LONG, POLL, || async { distinct(pool, table).await >= n })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Runs the scenario on `pool`'s database.
pub async fn run<DB: Sink>(pool: Pool<DB>, leases: LeasesIn, output: Output, seed: u64) -> Report
where
    SqlPool: From<Pool<DB>>,
{
    let prefix = super::fresh_prefix();
    let ns = fresh_namespace(&format!("eo-{seed}"));
    let table: Arc<str> = Arc::from(format!("{prefix}sink"));
    DB::create_sink(&pool, &table).await;

    let sql_store = match leases {
        LeasesIn::SameDatabase => Some(
            SqlStore::builder()
                .pool(pool.clone())
                .namespace(ns.as_str())
                .table_prefix(prefix.as_str())
                .connect()
                .await
                .unwrap(),
        ),
        LeasesIn::Memory => None,
    };
    let base: Arc<dyn LeaseStore> = match &sql_store {
        Some(s) => Arc::new(s.clone()),
        None => Arc::new(MemoryBackend::new().store(ns.parse().unwrap())),
    };
    let cp: Option<Arc<TxCheckpointer<DB>>> = match output {
        Output::Transactional => Some(Arc::new(match &sql_store {
            Some(s) => TxCheckpointer::in_lease_rows(s).unwrap(),
            None => TxCheckpointer::in_checkpoints_table(pool.clone(), &ns, &prefix).await.unwrap(),
        })),
        Output::AtLeastOnce => None,
    };
    let factory = match &cp {
        Some(cp) => {
            let t = table.clone();
            transactional_fn(cp.clone(), move |ctx, batch, tx| {
                let t = t.clone();
                Box::pin(async move {
                    let (key, owner) = (ctx.key().as_str(), ctx.token.owner.as_str());
                    DB::insert_tx(tx, &t, key, owner, &batch.records).await?;
                    Ok(())
                })
            })
        }
        None => {
            let (p, t) = (pool.clone(), table.clone());
            processor_fn(move |ctx, batch| {
                let (p, t) = (p.clone(), t.clone());
                async move {
                    let (key, owner) = (ctx.key().as_str(), ctx.token.owner.as_str());
                    DB::insert(&p, &t, key, owner, &batch.records).await?;
                    Ok(())
                }
            })
        }
    };

    let faults = Faults::new(seed);
    let store_for: StoreForWorker = {
        let (base, faults) = (base.clone(), faults.clone());
        Arc::new(move |w: &WorkerId| -> Arc<dyn LeaseStore> {
            Arc::new(FaultyStore::new(base.clone(), faults.clone(), Some(w.clone())))
        })
    };
    let source = MemorySource::new(4);
    let cfg = Config::new(ns.as_str())
        .unwrap()
        .with_heartbeat(HB)
        .with_initial_position(Position::TrimHorizon)
        .with_rng_seed(seed);
    let src: Arc<dyn ShardSource> = Arc::new(source.clone());
    let mut cluster = Cluster::with_store_per_worker(base.clone(), store_for, src, factory, cfg);
    if let Some(cp) = &cp {
        cluster = cluster.with_checkpointer(cp.clone());
    }

    cluster.sync_shards().await.unwrap();
    let ids = cluster.start_workers(3).unwrap();
    let producer = {
        let source = source.clone();
        tokio::spawn(async move {
            for i in 0..2_400u32 {
                source.put(&format!("k{seed}-{i}"), "x");
                if i % 10 == 9 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    };

    wait_rows(&pool, &table, 200, "200 records in the sink").await;
    // A crash (its leases fail over) and a join.
    cluster.crash(&ids[0]);
    cluster.start_worker().unwrap();
    wait_rows(&pool, &table, 500, "500 records in the sink").await;
    // A split and a merge.
    let open: Vec<LeaseKey> = source.open_shards().into_iter().map(|s| s.id).collect();
    source.split(&open[0]).unwrap();
    source.merge(&open[2], &open[3]).unwrap();
    wait_rows(&pool, &table, 900, "900 records in the sink").await;

    // A worker cut off from the lease store past its failover timeout; meanwhile a zombie with
    // one of its leases' tokens keeps trying to commit.
    let victim = ids[1].clone();
    let victim_runs_an_open_shard = || async {
        base.list_leases().await.unwrap().items.iter().any(|VersionedLease { lease: l, .. }| {
            l.owner.as_ref() == Some(&victim)
                && !l.is_finished()
                && source.shard(&l.key).is_some_and(|s| !s.closed)
        })
    };
    wait_until("the victim runs an open shard", LONG, POLL, victim_runs_an_open_shard)
        .await
        .unwrap();
    let zombie_token = base
        .list_leases()
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|v| v.lease)
        .filter(|l| l.owner.as_ref() == Some(&victim) && !l.is_finished())
        .find(|l| source.shard(&l.key).is_some_and(|s| !s.closed))
        .and_then(|l| l.token());
    faults.partition(&victim);
    let zombie = match (&cp, zombie_token) {
        (Some(cp), Some(token)) => {
            let (cp, source, t) = (cp.clone(), source.clone(), table.clone());
            Some(tokio::spawn(async move {
                let as_dyn: Arc<dyn Checkpointer> = cp.clone();
                let handle = CheckpointHandle::new(as_dyn, token.clone());
                let key: Arc<str> = Arc::from(token.key.as_str());
                let mut written = 0;
                loop {
                    // New records keep arriving on the shard, so its new owner has work.
                    let _ = source.put_to_shard(&token.key, "z");
                    let batch = Batch::new(source.records(&token.key));
                    let r = cp
                        .write_batch(&handle, &batch, |b, tx| {
                            let (t, k) = (t.clone(), key.clone());
                            Box::pin(async move {
                                DB::insert_tx(tx, &t, &k, "zombie", &b.records).await?;
                                Ok(())
                            })
                        })
                        .await;
                    match r {
                        Ok(o) => written += o.written,
                        Err(Error::LeaseLost { .. }) => return (true, written),
                        Err(_) => {}
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }))
        }
        _ => None,
    };
    {
        let c = &cluster;
        wait_until("the partitioned worker fenced itself", LONG, POLL, || async {
            c.handle(&victim).is_some_and(|h| h.stats().fenced >= 1)
        })
        .await
        .unwrap();
    }
    let (zombie_refused, zombie_written) = match zombie {
        Some(z) => {
            let (refused, written) = tokio::time::timeout(LONG, z).await.unwrap().unwrap();
            (Some(refused), written)
        }
        None => (None, 0),
    };
    faults.heal(&victim);

    // A store failing a tenth of its calls (half of the failed writes applied anyway).
    faults.set_error_rate(0.1);
    wait_rows(&pool, &table, 1_500, "1500 records in the sink").await;
    faults.set_error_rate(0.0);
    // A graceful leave.
    cluster.shutdown(&ids[2]).await.unwrap();
    producer.await.unwrap();

    let expected = |source: &MemorySource| -> Vec<(String, String)> {
        source
            .shards()
            .iter()
            .flat_map(|s| {
                source
                    .records(&s.id)
                    .into_iter()
                    .map(|r| (s.id.as_str().to_owned(), r.seq.as_str().to_owned()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let produced = expected(&source).len();
    wait_until("every record in the sink", LONG, POLL, || async {
        distinct(&pool, &table).await >= produced
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    cluster.teardown().await.unwrap();

    let counts: Counts = DB::counts(&pool, &table).await;
    let want = expected(&source);
    let rows = counts.values().sum();
    let missing = want.iter().filter(|k| !counts.contains_key(*k)).count();
    let known: std::collections::BTreeSet<_> = want.iter().collect();
    let unknown = counts.keys().filter(|k| !known.contains(k)).count();
    let duplicated_records = counts.values().filter(|n| **n > 1).count();
    let duplicate_rows = counts.values().map(|n| n - 1).sum();
    for t in ["sink", "checkpoints", "leases", "workers", "namespaces", "schema_migrations"] {
        DB::drop_table(&pool, &format!("{prefix}{t}")).await;
    }
    Report {
        produced: want.len(),
        rows,
        duplicated_records,
        duplicate_rows,
        missing,
        unknown,
        zombie_refused,
        zombie_written,
    }
}
