//! The batch writes of [`SqlStore`] (`LeaseStore::update_leases` and `create_leases`): many
//! compare-and-sets or creations per round trip, so that a worker taking thousands of leases at
//! start-up does not pay one statement per lease.
//!
//! - **PostgreSQL**: one `UPDATE .. FROM (VALUES ..) .. RETURNING lease_key` per batch (the rows
//!   returned are the items applied, each checked against its own expected version), announced
//!   with one `pg_notify` per row written when notification is on; creations are one
//!   `INSERT .. VALUES .., .. ON CONFLICT DO NOTHING RETURNING lease_key`.
//! - **MySQL/MariaDB** (no `RETURNING` on `UPDATE`): one transaction holding one
//!   `UPDATE .. SET col = CASE lease_key WHEN .. END .. WHERE (lease_key = .. AND version = ..)
//!   OR ..`, then, only when fewer rows changed than the batch has items, one `SELECT` of the
//!   batch's rows: an item was applied when its row holds the version the batch wrote (random, so
//!   nobody else wrote it), and the row locks taken by the `UPDATE` keep it so until the commit.
//!   Creations keep the default (one `INSERT` after another).
//! - **SQLite** (in process, one writer at a time): one transaction of the single statements,
//!   so a batch costs one commit (one sync of the file) instead of one per item.
//!
//! In every dialect the items that were not applied are answered with `Conflict` carrying their
//! row as one `SELECT` of them reads it afterwards (or the error of that read).

use std::collections::{HashMap, HashSet};

use shardlease_core::store::{check_distinct_keys, CreateOutcome, Lease, LeaseUpdate, Version};
use shardlease_core::{Error, LeaseKey, Result};

use super::{stmt, SqlStore, SqlxResult};
use crate::codec::{encode_lease, new_version, read_lease, LeaseColumns, RawLease};
use crate::dialect::{Dialect, LEASE_COLUMNS, LEASE_WRITE_COLUMNS};

/// Items per statement at most: PostgreSQL and MySQL take at most 65,535 parameters per
/// statement (an update item binds 14 on PostgreSQL and 26 on MySQL).
const MAX_BATCH: usize = 1000;

/// One update of a batch, encoded.
struct Item<'a> {
    columns: LeaseColumns<'a>,
    key: &'a str,
    /// The version the row must hold (`None`: no row can hold it, the item is a conflict).
    expected: Option<i64>,
    /// The version the write gives the row.
    new: i64,
}

impl SqlStore {
    /// `LeaseStore::update_leases`.
    pub(super) async fn update_batch(
        &self,
        updates: &[LeaseUpdate],
    ) -> Result<Vec<Result<Version>>> {
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        let mut outcomes = Vec::with_capacity(updates.len());
        for chunk in updates.chunks(MAX_BATCH) {
            outcomes.extend(self.update_chunk(chunk).await?);
        }
        Ok(outcomes)
    }

    async fn update_chunk(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        let mut items = Vec::with_capacity(updates.len());
        for u in updates {
            items.push(Item {
                columns: encode_lease(&u.lease)?,
                key: u.lease.key.as_str(),
                expected: i64::try_from(u.expected.0).ok(),
                new: new_version(Some(u.expected)),
            });
        }
        let writable: Vec<&Item<'_>> = items.iter().filter(|i| i.expected.is_some()).collect();
        let applied: HashSet<String> = if writable.is_empty() {
            HashSet::new()
        } else {
            match self.shared.dialect {
                Dialect::Postgres => self.update_returning(&writable).await?,
                Dialect::MySql => self.update_in_transaction(&writable).await?,
                Dialect::Sqlite => self.update_one_by_one(&writable).await?,
            }
        };
        let conflicted: Vec<&LeaseKey> = updates
            .iter()
            .filter(|u| !applied.contains(u.lease.key.as_str()))
            .map(|u| &u.lease.key)
            .collect();
        let mut current = self.read_many(&conflicted).await;
        Ok(items
            .iter()
            .zip(updates)
            .map(|(item, u)| {
                if applied.contains(item.key) {
                    return Ok(Version(item.new.unsigned_abs()));
                }
                match &mut current {
                    Ok(rows) => match rows.remove(item.key) {
                        Some(Ok(v)) => Err(Error::Conflict {
                            key: u.lease.key.clone(),
                            current: Some(Box::new(v)),
                        }),
                        Some(Err(e)) => Err(e),
                        None => Err(Error::Conflict { key: u.lease.key.clone(), current: None }),
                    },
                    // The write happened; only reading what the conflicts are now failed.
                    Err(e) => Err(Error::retryable(format!(
                        "the compare-and-set failed and reading the record failed: {e}"
                    ))),
                }
            })
            .collect())
    }

    /// PostgreSQL: one `UPDATE .. FROM (VALUES ..) RETURNING lease_key`; the keys written.
    async fn update_returning(&self, items: &[&Item<'_>]) -> Result<HashSet<String>> {
        let d = self.shared.dialect;
        let n = LEASE_WRITE_COLUMNS.len();
        let per_row = n + 3;
        let rows: Vec<String> =
            (0..items.len()).map(|r| format!("({})", phs(d, r * per_row + 1, per_row))).collect();
        let names: Vec<&str> =
            LEASE_WRITE_COLUMNS.iter().copied().chain(["new_version", "k", "expected"]).collect();
        let set: Vec<String> = LEASE_WRITE_COLUMNS.iter().map(|c| format!("{c} = v.{c}")).collect();
        let ns_ph = ph(d, items.len() * per_row + 1);
        let update = format!(
            "UPDATE {leases} AS t SET {set}, version = v.new_version FROM (VALUES {rows}) AS v ({names}) \
             WHERE t.namespace = {ns_ph} AND t.lease_key = v.k AND t.version = v.expected \
             RETURNING t.lease_key",
            leases = self.shared.tables.leases,
            set = set.join(", "),
            rows = rows.join(", "),
            names = names.join(", "),
        );
        let notice = self.channel.as_ref().map(|c| (c.name(), c.lease("")));
        let sql = match notice {
            Some(_) => format!(
                "WITH w AS ({update}) SELECT w.lease_key, pg_notify({}, {} || w.lease_key) FROM w",
                ph(d, items.len() * per_row + 2),
                ph(d, items.len() * per_row + 3)
            ),
            None => update,
        };
        let sql = stmt(&sql.into());
        let ns = self.namespace.as_str();
        let turn = self.write_turn().await;
        let written: SqlxResult<Vec<String>> = on_pool!(&self.shared.pool, p => {
            let mut q = sqlx::query(sql);
            for i in items {
                q = bind_lease_columns!(q, i.columns).bind(i.new).bind(i.key).bind(i.expected);
            }
            let q = with_notice!(q.bind(ns), notice);
            q.fetch_all(p).await.map(|rows| {
                rows.iter()
                    .filter_map(|r| crate::codec::col::<_, String>(r, 0).ok().flatten())
                    .collect()
            })
        });
        drop(turn);
        Ok(written.map_err(|e| self.fail("update leases", e))?.into_iter().collect())
    }

    /// MySQL: one transaction of one `UPDATE .. CASE ..`, then the batch's rows when some item
    /// was not applied; the keys written.
    async fn update_in_transaction(&self, items: &[&Item<'_>]) -> Result<HashSet<String>> {
        let d = self.shared.dialect;
        let case = |column: &str| {
            let whens: Vec<String> =
                (0..items.len()).map(|_| format!("WHEN {} THEN {}", ph(d, 0), ph(d, 0))).collect();
            format!("{column} = CASE lease_key {} END", whens.join(" "))
        };
        let set: Vec<String> =
            LEASE_WRITE_COLUMNS.iter().copied().chain(["version"]).map(case).collect();
        let matches: Vec<String> = (0..items.len())
            .map(|_| format!("(lease_key = {} AND version = {})", ph(d, 0), ph(d, 0)))
            .collect();
        let update = format!(
            "UPDATE {leases} SET {set} WHERE namespace = {} AND ({matches})",
            ph(d, 0),
            leases = self.shared.tables.leases,
            set = set.join(", "),
            matches = matches.join(" OR "),
        );
        let update = stmt(&update.into());
        let select = stmt(&self.select_many_sql(items.len()).into());
        let ns = self.namespace.as_str();
        let turn = self.write_turn().await;
        let done: SqlxResult<HashSet<String>> = on_pool!(&self.shared.pool, p => async {
            let mut tx = p.begin().await?;
            let mut q = sqlx::query(update);
            // One column at a time (MySQL binds in the order the placeholders appear).
            macro_rules! case_binds {
                ($($field:ident),*) => {$(
                    for i in items {
                        q = q.bind(i.key).bind(&i.columns.$field);
                    }
                )*};
            }
            case_binds!(
                owner, epoch, checkpoint_kind, checkpoint_seq, checkpoint_sub, checkpoint_millis,
                parents, claim_by, claim_at, attributes, updated_at_millis
            );
            for i in items {
                q = q.bind(i.key).bind(i.new);
            }
            q = q.bind(ns);
            for i in items {
                q = q.bind(i.key).bind(i.expected);
            }
            let changed = q.execute(&mut *tx).await?.rows_affected();
            let applied: HashSet<String> = if changed as usize == items.len() {
                items.iter().map(|i| i.key.to_owned()).collect()
            } else {
                let mut q = sqlx::query(select).bind(ns);
                for i in items {
                    q = q.bind(i.key);
                }
                let rows = q.fetch_all(&mut *tx).await?;
                let now: HashMap<String, Option<i64>> = rows
                    .iter()
                    .map(read_lease)
                    .filter_map(|r| r.key().map(str::to_owned).map(|k| (k, r.version())))
                    .collect();
                items
                    .iter()
                    .filter(|i| now.get(i.key).copied().flatten() == Some(i.new))
                    .map(|i| i.key.to_owned())
                    .collect()
            };
            tx.commit().await?;
            Ok(applied)
        }.await);
        drop(turn);
        done.map_err(|e| self.fail("update leases", e))
    }

    /// SQLite: the single `UPDATE`s in one transaction; the keys written.
    async fn update_one_by_one(&self, items: &[&Item<'_>]) -> Result<HashSet<String>> {
        let sql = &self.shared.queries.update_lease;
        let ns = self.namespace.as_str();
        let turn = self.write_turn().await;
        let done: SqlxResult<HashSet<String>> = on_pool!(&self.shared.pool, p => async {
            let mut tx = p.begin().await?;
            let mut applied = HashSet::new();
            for i in items {
                let q = bind_lease_columns!(sqlx::query(stmt(sql)), i.columns)
                    .bind(i.new)
                    .bind(ns)
                    .bind(i.key)
                    .bind(i.expected);
                if q.execute(&mut *tx).await?.rows_affected() == 1 {
                    applied.insert(i.key.to_owned());
                }
            }
            tx.commit().await?;
            Ok(applied)
        }.await);
        drop(turn);
        done.map_err(|e| self.fail("update leases", e))
    }

    /// `SELECT` of the rows of `count` keys (namespace first, then the keys).
    fn select_many_sql(&self, count: usize) -> String {
        let d = self.shared.dialect;
        format!(
            "SELECT {LEASE_COLUMNS} FROM {} WHERE namespace = {} AND lease_key IN ({})",
            self.shared.tables.leases,
            ph(d, 1),
            phs(d, 2, count)
        )
    }

    /// The records of `keys` as they are now, by key: decoded, or `Corrupt`. Keys without a row
    /// are missing from the map.
    async fn read_many(
        &self,
        keys: &[&LeaseKey],
    ) -> Result<HashMap<String, Result<shardlease_core::store::VersionedLease>>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = stmt(&self.select_many_sql(keys.len()).into());
        let ns = self.namespace.as_str();
        let rows: SqlxResult<Vec<RawLease>> = on_pool!(&self.shared.pool, p => {
            let mut q = sqlx::query(sql).bind(ns);
            for k in keys {
                q = q.bind(k.as_str());
            }
            q.fetch_all(p).await.map(|rows| rows.iter().map(read_lease).collect())
        });
        let rows = rows.map_err(|e| self.fail("read leases", e))?;
        Ok(rows
            .into_iter()
            .filter_map(|raw| {
                let key = raw.key()?.to_owned();
                let decoded = raw
                    .decode(&key)
                    .map_err(|bad| Error::Corrupt { key: bad.key, reason: bad.reason });
                Some((key, decoded))
            })
            .collect())
    }

    /// `LeaseStore::create_leases`: one statement per batch on PostgreSQL, one transaction on
    /// SQLite, one `INSERT` after another on MySQL (whose only multi-row "if absent" is
    /// `INSERT IGNORE`, which also turns data errors into warnings).
    pub(super) async fn create_batch(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        use shardlease_core::store::LeaseStore;
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let mut outcomes = Vec::with_capacity(leases.len());
        if self.shared.dialect == Dialect::MySql {
            for lease in leases {
                outcomes.push(self.create_lease(lease).await?);
            }
            return Ok(outcomes);
        }
        for chunk in leases.chunks(MAX_BATCH) {
            outcomes.extend(self.create_chunk(chunk).await?);
        }
        Ok(outcomes)
    }

    async fn create_chunk(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        let mut items = Vec::with_capacity(leases.len());
        for l in leases {
            items.push((encode_lease(l)?, new_version(None), l.key.as_str()));
        }
        let d = self.shared.dialect;
        let ns = self.namespace.as_str();
        let n = LEASE_WRITE_COLUMNS.len();
        let created: SqlxResult<HashSet<String>> = match d {
            Dialect::Sqlite => {
                let sql = &self.shared.queries.insert_lease;
                let _turn = self.write_turn().await;
                on_pool!(&self.shared.pool, p => async {
                    let mut tx = p.begin().await?;
                    let mut created = HashSet::new();
                    for (c, version, key) in &items {
                        let q = bind_lease_columns!(sqlx::query(stmt(sql)), c)
                            .bind(version)
                            .bind(ns)
                            .bind(key);
                        if q.execute(&mut *tx).await?.rows_affected() == 1 {
                            created.insert((*key).to_owned());
                        }
                    }
                    tx.commit().await?;
                    Ok(created)
                }.await)
            }
            Dialect::Postgres | Dialect::MySql => {
                let per_row = n + 3;
                let rows: Vec<String> = (0..items.len())
                    .map(|r| format!("({})", phs(d, r * per_row + 1, per_row)))
                    .collect();
                let insert = format!(
                    "INSERT INTO {} ({}, version, namespace, lease_key) VALUES {} \
                     ON CONFLICT (namespace, lease_key) DO NOTHING RETURNING lease_key",
                    self.shared.tables.leases,
                    LEASE_WRITE_COLUMNS.join(", "),
                    rows.join(", ")
                );
                let notice = self.channel.as_ref().map(|c| (c.name(), c.lease("")));
                let sql = match notice {
                    Some(_) => format!(
                        "WITH w AS ({insert}) SELECT w.lease_key, pg_notify({}, {} || w.lease_key) \
                         FROM w",
                        ph(d, items.len() * per_row + 1),
                        ph(d, items.len() * per_row + 2)
                    ),
                    None => insert,
                };
                let sql = stmt(&sql.into());
                on_pool!(&self.shared.pool, p => {
                    let mut q = sqlx::query(sql);
                    for (c, version, key) in &items {
                        q = bind_lease_columns!(q, c).bind(version).bind(ns).bind(key);
                    }
                    with_notice!(q, notice).fetch_all(p).await.map(|rows| {
                        rows.iter()
                            .filter_map(|r| crate::codec::col::<_, String>(r, 0).ok().flatten())
                            .collect()
                    })
                })
            }
        };
        let created = created.map_err(|e| self.fail("create leases", e))?;
        Ok(items
            .iter()
            .map(|(_, version, key)| {
                if created.contains(*key) {
                    CreateOutcome::Created(Version(version.unsigned_abs()))
                } else {
                    CreateOutcome::AlreadyExists
                }
            })
            .collect())
    }
}

/// Placeholder `n` of `d` (MySQL's are all `?`, bound in order).
fn ph(d: Dialect, n: usize) -> String {
    match d {
        Dialect::Postgres => format!("${n}"),
        Dialect::Sqlite => format!("?{n}"),
        Dialect::MySql => "?".to_owned(),
    }
}

/// `count` placeholders from `first`, comma-separated.
fn phs(d: Dialect, first: usize, count: usize) -> String {
    (first..first + count).map(|n| ph(d, n)).collect::<Vec<_>>().join(", ")
}
