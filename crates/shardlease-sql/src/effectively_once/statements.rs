//! The statements of the transactional checkpointer, per dialect and per place the positions
//! live: its own `<prefix>checkpoints` table, or the lease rows of a [`SqlStore`](crate::SqlStore)
//! in the same database. Built once per checkpointer from validated table names; every value is a
//! placeholder.

use std::sync::Arc;

use crate::dialect::Dialect;

/// Where the positions live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `<prefix>checkpoints`: one row per lease, its epoch the newest writer's.
    Checkpoints,
    /// The lease row of the lease store itself (same database): fenced by its owner and epoch.
    LeaseRows,
}

/// Every statement a checkpointer runs.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `epoch, owner, kind, seq, sub, millis, tag` of one row, locked until the transaction ends.
    pub(crate) select_locked: Arc<str>,
    /// The same, unlocked (for `fetch`).
    pub(crate) select: Arc<str>,
    /// Checkpoints table only: a new row (`namespace, lease_key, epoch, owner, kind, seq, sub,
    /// millis, updated_at_millis`).
    pub(crate) insert: Arc<str>,
    /// Checkpoints: `epoch, owner, kind, seq, sub, millis, updated_at_millis` then `namespace,
    /// lease_key, epoch` (the row's epoch must not be newer). Lease rows: `kind, seq, sub,
    /// millis, version, updated_at_millis` then `namespace, lease_key, version` (the one read).
    pub(crate) update: Arc<str>,
    /// Checkpoints table only: `CREATE TABLE IF NOT EXISTS`.
    pub(crate) create: Arc<str>,
}

fn ph(d: Dialect, n: usize) -> String {
    match d {
        Dialect::Postgres => format!("${n}"),
        Dialect::Sqlite => format!("?{n}"),
        Dialect::MySql => "?".to_owned(),
    }
}

fn phs(d: Dialect, first: usize, count: usize) -> String {
    (first..first + count).map(|n| ph(d, n)).collect::<Vec<_>>().join(", ")
}

impl Statements {
    /// The statements over `table` (a validated name) in `dialect`.
    pub(crate) fn new(dialect: Dialect, target: Target, table: &str) -> Statements {
        let d = dialect;
        let lock = match d {
            // SQLite has no row locks: `BEGIN IMMEDIATE` holds the database's write lock instead.
            Dialect::Sqlite => "",
            Dialect::Postgres | Dialect::MySql => " FOR UPDATE",
        };
        let tag = match target {
            Target::Checkpoints => "commits",
            Target::LeaseRows => "version",
        };
        let select = format!(
            "SELECT epoch, owner, checkpoint_kind, checkpoint_seq, checkpoint_sub, \
             checkpoint_millis, {tag} FROM {table} WHERE namespace = {} AND lease_key = {}",
            ph(d, 1),
            ph(d, 2)
        );
        let update = match target {
            Target::Checkpoints => format!(
                "UPDATE {table} SET epoch = {}, owner = {}, checkpoint_kind = {}, \
                 checkpoint_seq = {}, checkpoint_sub = {}, checkpoint_millis = {}, \
                 commits = commits + 1, updated_at_millis = {} \
                 WHERE namespace = {} AND lease_key = {} AND epoch <= {}",
                ph(d, 1),
                ph(d, 2),
                ph(d, 3),
                ph(d, 4),
                ph(d, 5),
                ph(d, 6),
                ph(d, 7),
                ph(d, 8),
                ph(d, 9),
                ph(d, 10)
            ),
            Target::LeaseRows => format!(
                "UPDATE {table} SET checkpoint_kind = {}, checkpoint_seq = {}, \
                 checkpoint_sub = {}, checkpoint_millis = {}, version = {}, \
                 updated_at_millis = {} WHERE namespace = {} AND lease_key = {} AND version = {}",
                ph(d, 1),
                ph(d, 2),
                ph(d, 3),
                ph(d, 4),
                ph(d, 5),
                ph(d, 6),
                ph(d, 7),
                ph(d, 8),
                ph(d, 9)
            ),
        };
        let insert = format!(
            "INSERT INTO {table} (namespace, lease_key, epoch, owner, checkpoint_kind, \
             checkpoint_seq, checkpoint_sub, checkpoint_millis, commits, updated_at_millis) \
             VALUES ({}, 1, {})",
            phs(d, 1, 8),
            ph(d, 9)
        );
        let (name, tag_type, digits, options) = match d {
            Dialect::Postgres => ("TEXT COLLATE \"C\"", "TEXT", "TEXT", ""),
            Dialect::Sqlite => ("TEXT", "TEXT", "TEXT", ""),
            Dialect::MySql => (
                "VARCHAR(255)",
                "VARCHAR(32)",
                "VARCHAR(300)",
                " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            ),
        };
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {table} (\
             namespace {name} NOT NULL, \
             lease_key {name} NOT NULL, \
             epoch BIGINT NOT NULL, \
             owner {name}, \
             checkpoint_kind {tag_type} NOT NULL, \
             checkpoint_seq {digits}, \
             checkpoint_sub BIGINT, \
             checkpoint_millis BIGINT, \
             commits BIGINT NOT NULL, \
             updated_at_millis BIGINT NOT NULL, \
             PRIMARY KEY (namespace, lease_key)){options}"
        );
        Statements {
            select_locked: Arc::from(format!("{select}{lock}")),
            select: Arc::from(select),
            insert: Arc::from(insert),
            update: Arc::from(update),
            create: Arc::from(create),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_bind_every_value_and_lock_the_row() {
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            for t in [Target::Checkpoints, Target::LeaseRows] {
                let s = Statements::new(d, t, "p_checkpoints");
                for text in [&s.select_locked, &s.select, &s.insert, &s.update, &s.create] {
                    assert!(!text.contains('\''), "{text}");
                }
                assert_eq!(s.select_locked.ends_with("FOR UPDATE"), d != Dialect::Sqlite);
            }
        }
    }
}
