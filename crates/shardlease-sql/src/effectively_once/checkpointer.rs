//! [`TxCheckpointer`]: positions kept in the sink's own database and written inside the same
//! transaction as the output, fenced by the lease epoch; [`FencedTx`]: one such open transaction.
//!
//! Every transaction starts by locking the lease's position row (`SELECT ... FOR UPDATE`;
//! `BEGIN IMMEDIATE` on SQLite) and checking the fence; concurrent writers of one lease (an owner
//! and a zombie) therefore run one after the other, and the second sees what the first committed.
//! Records at or before the committed position are never handed to user code again, so a batch
//! retried after an unknown commit outcome, or read again by a new owner that started from an
//! older position, writes nothing twice.

use shardlease_core::Epoch;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::{
    Batch, Checkpointer, Error, LeaseKey, LeaseToken, Position, Record, Result, WorkerId,
};
use tracing::debug;

use super::backend::__private::{Arg, RawRow};
use super::backend::TxDatabase;
use super::statements::{Statements, Target};
use crate::codec::{check_name, decode_position, encode_position, new_version};
use crate::errors;
use crate::store::{validate_prefix, SqlStore};
use crate::Dialect;

/// What the locked row held when a transaction began.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    epoch: Epoch,
    owner: Option<WorkerId>,
    position: Position,
    /// The lease row's version (lease rows) or the commit count (checkpoints table).
    tag: i64,
}

/// How many times a transaction is tried when it fails for a reason that may pass (a
/// serialization failure, a deadlock, a lost connection) before the error is returned, and how
/// long to wait in between.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// The first pause; it doubles after each failed attempt (with jitter).
    pub min_backoff: std::time::Duration,
    /// The longest pause.
    pub max_backoff: std::time::Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            min_backoff: std::time::Duration::from_millis(5),
            max_backoff: std::time::Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt `n` (1-based): doubling from `min_backoff`, capped at
    /// `max_backoff`, then jittered to between half and all of it.
    pub(crate) fn pause(&self, n: u32) -> std::time::Duration {
        let doubled = self.min_backoff.saturating_mul(1u32 << n.saturating_sub(1).min(16));
        let full = doubled.min(self.max_backoff);
        let half = full / 2;
        let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
        half + std::time::Duration::from_micros(
            shardlease_core::store::Version::random().0 % spread,
        )
    }
}

/// A [`Checkpointer`] keeping positions in a SQL database next to the output they describe, so
/// that output and position commit in one transaction ([`TxCheckpointer::begin`],
/// [`TxCheckpointer::write_batch`], [`transactional_fn`](super::transactional_fn)).
///
/// Positions live either in a `<prefix>checkpoints` table of the sink's database
/// ([`in_checkpoints_table`](Self::in_checkpoints_table); the lease store may be anything) or in
/// the lease rows themselves when the lease store is a [`SqlStore`] in that same database
/// ([`in_lease_rows`](Self::in_lease_rows)). See `docs/effectively-once.md`.
pub struct TxCheckpointer<DB: TxDatabase> {
    pool: sqlx::Pool<DB>,
    namespace: String,
    target: Target,
    table: String,
    statements: Arc<Statements>,
    retry: RetryPolicy,
}

impl<DB: TxDatabase> fmt::Debug for TxCheckpointer<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxCheckpointer")
            .field("dialect", &DB::dialect())
            .field("namespace", &self.namespace)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<DB: TxDatabase> Clone for TxCheckpointer<DB> {
    fn clone(&self) -> Self {
        TxCheckpointer {
            pool: self.pool.clone(),
            namespace: self.namespace.clone(),
            target: self.target,
            table: self.table.clone(),
            statements: Arc::clone(&self.statements),
            retry: self.retry,
        }
    }
}

fn fail(what: &str, e: sqlx::Error, dialect: Dialect) -> Error {
    errors::backend(dialect, what, e)
}

impl<DB: TxDatabase> TxCheckpointer<DB> {
    /// Positions in `<table_prefix>checkpoints` of the database behind `pool`, under
    /// `namespace` (use the application's name, the namespace of its lease store). Creates the
    /// table if it does not exist. The lease store may be any store, in any system.
    pub async fn in_checkpoints_table(
        pool: sqlx::Pool<DB>,
        namespace: &str,
        table_prefix: &str,
    ) -> Result<Self> {
        validate_prefix(table_prefix)?;
        check_name("namespace", namespace)?;
        let table = format!("{table_prefix}checkpoints");
        let statements = Statements::new(DB::dialect(), Target::Checkpoints, &table);
        let mut conn = pool.acquire().await.map_err(|e| fail("connect", e, DB::dialect()))?;
        match DB::exec(&mut conn, &statements.create, Vec::new()).await {
            Ok(_) => {}
            // PostgreSQL: another process created it at the same moment (the catalog's unique
            // index, not `IF NOT EXISTS`, caught the race).
            Err(e) if errors::is_unique_violation(&e) => {}
            Err(e) => return Err(fail("create the checkpoints table", e, DB::dialect())),
        }
        Ok(TxCheckpointer {
            pool,
            namespace: namespace.to_owned(),
            target: Target::Checkpoints,
            table,
            statements: Arc::new(statements),
            retry: RetryPolicy::default(),
        })
    }

    /// Positions in the lease rows of `store`, whose database also holds the output: the
    /// transaction locks the lease row and writes only while the row still names this owner and
    /// epoch. Fails with `Error::Config` when `store` is not a `DB` database.
    pub fn in_lease_rows(store: &SqlStore) -> Result<Self> {
        let pool = DB::pool_of(store.pool()).ok_or_else(|| {
            Error::Config(format!(
                "the lease store is a {} database, not {}",
                store.dialect(),
                DB::dialect()
            ))
        })?;
        let table = store.leases_table().to_owned();
        Ok(TxCheckpointer {
            pool,
            namespace: store.namespace.as_str().to_owned(),
            target: Target::LeaseRows,
            statements: Arc::new(Statements::new(DB::dialect(), Target::LeaseRows, &table)),
            table,
            retry: RetryPolicy::default(),
        })
    }

    /// The same checkpointer retrying transient failures as `retry` says.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = RetryPolicy { attempts: retry.attempts.max(1), ..retry };
        self
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// The connection pool (the sink's database).
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The table the positions live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    pub(crate) fn fail(&self, what: &str, e: sqlx::Error) -> Error {
        fail(what, e, DB::dialect())
    }

    fn decode(&self, key: &LeaseKey, raw: RawRow) -> Result<Stored> {
        let corrupt =
            |reason: String| Error::Corrupt { key: format!("{}/{key}", self.table), reason };
        let epoch = match raw.epoch {
            Ok(Some(e)) => u64::try_from(e)
                .map(Epoch)
                .map_err(|_| corrupt(format!("epoch {e} is negative")))?,
            Ok(None) => return Err(corrupt("column epoch is NULL".into())),
            Err(e) => return Err(corrupt(format!("column epoch: {e}"))),
        };
        let owner = raw.owner.map_err(|e| corrupt(format!("column owner: {e}")))?;
        let tag = match raw.tag {
            Ok(Some(t)) => t,
            Ok(None) => return Err(corrupt("version/commits column is NULL".into())),
            Err(e) => return Err(corrupt(e)),
        };
        let position = decode_position(raw.kind, raw.seq, raw.sub, raw.millis).map_err(corrupt)?;
        Ok(Stored { epoch, owner: owner.map(WorkerId::from), position, tag })
    }

    /// Begins a transaction for a batch of the lease `token` names: locks the lease's position
    /// row and checks the fence. Fails with `Error::LeaseLost` when a newer owner exists (the
    /// row's epoch is newer than the token's; for lease rows, when the row no longer names this
    /// owner and epoch); nothing is then written.
    ///
    /// Write the output through [`FencedTx::transaction`], skipping records
    /// [`FencedTx::is_done`] (already committed, by this owner before an unknown commit outcome
    /// or by a previous owner), then [`FencedTx::commit`] with the position after them.
    pub async fn begin(&self, token: &LeaseToken) -> Result<FencedTx<'_, DB>> {
        let mut tx =
            DB::begin_writing(&self.pool).await.map_err(|e| self.fail("begin a transaction", e))?;
        let args =
            vec![Arg::Text(self.namespace.clone()), Arg::Text(token.key.as_str().to_owned())];
        let raw = DB::fetch_row(&mut tx, &self.statements.select_locked, args)
            .await
            .map_err(|e| self.fail("lock the checkpoint row", e))?;
        let stored = raw.map(|r| self.decode(&token.key, r)).transpose()?;
        let lost = || Error::LeaseLost { key: token.key.clone(), epoch: token.epoch };
        let fenced = match (self.target, &stored) {
            (Target::Checkpoints, Some(s)) => s.epoch <= token.epoch,
            (Target::Checkpoints, None) => true,
            (Target::LeaseRows, Some(s)) => {
                s.epoch == token.epoch && s.owner.as_ref() == Some(&token.owner)
            }
            (Target::LeaseRows, None) => false,
        };
        if !fenced {
            debug!(key = %token.key, epoch = %token.epoch, stored = ?stored.as_ref().map(|s| s.epoch), "refused: a newer owner exists");
            // Dropping the transaction rolls it back; say so explicitly to free the row now.
            let _ = tx.rollback().await;
            return Err(lost());
        }
        Ok(FencedTx { cp: self, tx, token: token.clone(), stored })
    }
}

/// An open transaction of one lease, fenced by its epoch: the position row is locked until
/// [`commit`](Self::commit) or drop (which rolls everything back).
pub struct FencedTx<'c, DB: TxDatabase> {
    cp: &'c TxCheckpointer<DB>,
    tx: sqlx::Transaction<'static, DB>,
    token: LeaseToken,
    stored: Option<Stored>,
}

impl<DB: TxDatabase> fmt::Debug for FencedTx<'_, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedTx")
            .field("token", &self.token)
            .field("committed", &self.committed())
            .finish_non_exhaustive()
    }
}

impl<'c, DB: TxDatabase> FencedTx<'c, DB> {
    /// The transaction, for the output's statements (`query.execute(&mut **tx.transaction())`).
    pub fn transaction(&mut self) -> &mut sqlx::Transaction<'static, DB> {
        &mut self.tx
    }

    /// The position committed for this lease so far, if any.
    pub fn committed(&self) -> Option<&Position> {
        self.stored.as_ref().map(|s| &s.position)
    }

    /// Whether `record`'s output is already committed (it is at or before the committed position).
    pub fn is_done(&self, record: &Record) -> bool {
        match self.committed() {
            Some(Position::ShardEnd) => true,
            Some(Position::Sequence { seq, sub }) => (&record.seq, record.sub) <= (seq, *sub),
            _ => false,
        }
    }

    /// `batch` without the records already committed.
    pub fn unseen(&self, batch: &Batch) -> Batch {
        let mut unseen =
            Batch::new(batch.records.iter().filter(|r| !self.is_done(r)).cloned().collect());
        unseen.millis_behind = batch.millis_behind;
        unseen.end = batch.end.clone();
        unseen
    }

    /// Writes `position` (or keeps the committed one if it is further along) under this
    /// transaction's epoch, then commits the output and the position together.
    pub async fn commit(mut self, position: &Position) -> Result<()> {
        self.write(position).await?;
        let cp = self.cp;
        self.tx.commit().await.map_err(|e| cp.fail("commit", e))
    }

    /// Rolls the transaction back: no output, no position.
    pub async fn rollback(self) -> Result<()> {
        let cp = self.cp;
        self.tx.rollback().await.map_err(|e| cp.fail("roll back", e))
    }

    /// Whether writing `position` would move a checkpoint this owner wrote backwards.
    pub(crate) fn would_regress(&self, position: &Position) -> bool {
        self.stored
            .as_ref()
            .is_some_and(|s| s.epoch == self.token.epoch && s.position.would_regress_to(position))
    }

    async fn write(&mut self, position: &Position) -> Result<()> {
        let cp = self.cp;
        let token = &self.token;
        let target = match &self.stored {
            Some(s) if s.position.would_regress_to(position) => s.position.clone(),
            _ => position.clone(),
        };
        let cols = encode_position(&target)?;
        let now = i64::try_from(shardlease_core::store::now_millis()).unwrap_or(i64::MAX);
        let epoch = i64::try_from(token.epoch.get()).map_err(|_| {
            Error::InvalidInput(format!("epoch {} does not fit BIGINT", token.epoch))
        })?;
        let kind = Arg::Text(cols.checkpoint_kind.to_owned());
        let seq = Arg::OptText(cols.checkpoint_seq.map(str::to_owned));
        let sub = Arg::OptInt(cols.checkpoint_sub);
        let millis = Arg::OptInt(cols.checkpoint_millis);
        let ns = Arg::Text(cp.namespace.clone());
        let key = Arg::Text(token.key.as_str().to_owned());
        let (sql, args) = match (cp.target, &self.stored) {
            (Target::Checkpoints, None) => (
                &cp.statements.insert,
                vec![
                    ns,
                    key,
                    Arg::Int(epoch),
                    Arg::Text(token.owner.as_str().to_owned()),
                    kind,
                    seq,
                    sub,
                    millis,
                    Arg::Int(now),
                ],
            ),
            (Target::Checkpoints, Some(_)) => (
                &cp.statements.update,
                vec![
                    Arg::Int(epoch),
                    Arg::Text(token.owner.as_str().to_owned()),
                    kind,
                    seq,
                    sub,
                    millis,
                    Arg::Int(now),
                    ns,
                    key,
                    Arg::Int(epoch),
                ],
            ),
            (Target::LeaseRows, Some(s)) => {
                let replacing = u64::try_from(s.tag).ok().map(shardlease_core::store::Version);
                (
                    &cp.statements.update,
                    vec![
                        kind,
                        seq,
                        sub,
                        millis,
                        Arg::Int(new_version(replacing)),
                        Arg::Int(now),
                        ns,
                        key,
                        Arg::Int(s.tag),
                    ],
                )
            }
            // `begin` refuses a lease row that does not exist.
            (Target::LeaseRows, None) => {
                return Err(Error::LeaseLost { key: token.key.clone(), epoch: token.epoch })
            }
        };
        let changed = DB::exec(&mut self.tx, sql, args).await.map_err(|e| {
            if errors::is_unique_violation(&e) {
                // Another owner created the row after this transaction looked: try again.
                Error::retryable(format!("checkpoint row of {} created concurrently", token.key))
            } else {
                cp.fail("write the checkpoint", e)
            }
        })?;
        if changed != 1 {
            // The row is locked by this transaction; this cannot happen unless someone edits
            // rows outside any lock. Start over.
            return Err(Error::retryable(format!(
                "checkpoint row of {} changed under its lock",
                token.key
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl<DB: TxDatabase> Checkpointer for TxCheckpointer<DB> {
    /// A transaction of its own that writes only the position (the start pinned by the runtime,
    /// `ShardEnd`, or a checkpoint a hand-written processor makes outside a batch).
    async fn checkpoint(&self, token: &LeaseToken, position: &Position) -> Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = async {
                let fenced = self.begin(token).await?;
                if fenced.would_regress(position) {
                    let from = fenced.committed().cloned();
                    fenced.rollback().await?;
                    return Err(Error::InvalidInput(format!(
                        "checkpoint of {} would move backwards from {} to {position}",
                        token.key,
                        from.map_or_else(|| "nothing".to_owned(), |p| p.to_string())
                    )));
                }
                fenced.commit(position).await
            }
            .await;
            match result {
                Err(e) if e.is_retryable() && attempt < self.retry.attempts => {
                    debug!(error = %e, attempt, "checkpoint transaction failed; retrying");
                    tokio::time::sleep(self.retry.pause(attempt)).await;
                }
                other => return other,
            }
        }
    }

    async fn fetch(&self, key: &LeaseKey) -> Result<Option<Position>> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.fail("connect", e))?;
        let args = vec![Arg::Text(self.namespace.clone()), Arg::Text(key.as_str().to_owned())];
        let raw = DB::fetch_row(&mut conn, &self.statements.select, args)
            .await
            .map_err(|e| self.fail("read the checkpoint", e))?;
        Ok(raw.map(|r| self.decode(key, r)).transpose()?.map(|s| s.position))
    }

    fn stores_in_lease(&self) -> bool {
        self.target == Target::LeaseRows
    }
}
