//! The few places where PostgreSQL, SQLite and MySQL/MariaDB spell SQL differently, and every
//! statement the store runs, built once per table prefix from those spellings.
//!
//! The statements are shared: the same text (but for placeholders and the create/upsert clause)
//! runs on all three dialects, and every value in them is a bound parameter. Only the table names,
//! which come from a prefix validated as `[a-z_][a-z0-9_]{0,30}`, and core's own integer constants
//! (`WorkerRecord::BEAT_COUNT_BITS`) are spliced into the text.

use shardlease_core::store::WorkerRecord;
use std::fmt;
use std::sync::Arc;

/// The SQL dialect of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL or MariaDB.
    MySql,
}

impl Dialect {
    /// A short lower-case name: `postgres`, `sqlite` or `mysql`.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Sqlite => "sqlite",
            Dialect::MySql => "mysql",
        }
    }

    /// Placeholder number `n` (1-based). MySQL binds strictly in order, so every statement binds
    /// each parameter once, in the order it appears.
    fn ph(self, n: usize) -> String {
        match self {
            Dialect::Postgres => format!("${n}"),
            Dialect::Sqlite => format!("?{n}"),
            Dialect::MySql => "?".to_owned(),
        }
    }

    /// `count` placeholders starting at `first`, comma-separated.
    fn phs(self, first: usize, count: usize) -> String {
        (first..first + count).map(|n| self.ph(n)).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The lease columns a write sets, in the order `bind_lease_columns!` (in lib.rs)
/// binds them: the first 11 parameters of both `insert_lease` and `update_lease`.
pub(crate) const LEASE_WRITE_COLUMNS: [&str; 11] = [
    "owner",
    "epoch",
    "checkpoint_kind",
    "checkpoint_seq",
    "checkpoint_sub",
    "checkpoint_millis",
    "parents",
    "claim_by",
    "claim_at",
    "attributes",
    "updated_at_millis",
];

/// The columns of a lease row, in the order every `SELECT` returns them.
pub(crate) const LEASE_COLUMNS: &str = "lease_key, owner, epoch, version, checkpoint_kind, \
     checkpoint_seq, checkpoint_sub, checkpoint_millis, parents, claim_by, claim_at, attributes";

/// The most worker ids one `get_workers` statement names (`IN` list), far below every dialect's
/// bind limit (SQLite's smallest, 999; PostgreSQL's and MySQL's, 65535). More ids take more
/// statements.
pub(crate) const GET_WORKERS_CHUNK: usize = 1 << (GET_WORKERS_WIDTHS - 1);

/// How many `get_workers` statements there are: one per width 1, 2, 4, ... up to
/// [`GET_WORKERS_CHUNK`] (see [`Queries::get_workers`]).
const GET_WORKERS_WIDTHS: usize = 10;

/// The columns of a worker row, in the order every `SELECT` returns them.
pub(crate) const WORKER_COLUMNS: &str =
    "worker_id, beat, updated_at_millis, lease_count, load_figure, capacity, changes, lease_loads";

/// The table names of one prefix.
#[derive(Clone, Debug)]
pub(crate) struct Tables {
    pub(crate) leases: String,
    pub(crate) workers: String,
    pub(crate) namespaces: String,
    pub(crate) fleet: String,
    pub(crate) migrations: String,
}

impl Tables {
    /// The tables of `prefix` (already validated).
    pub(crate) fn new(prefix: &str) -> Self {
        Tables {
            leases: format!("{prefix}leases"),
            workers: format!("{prefix}workers"),
            namespaces: format!("{prefix}namespaces"),
            fleet: format!("{prefix}fleet"),
            migrations: format!("{prefix}schema_migrations"),
        }
    }
}

/// A statement ready to hand to sqlx (cheap to clone).
pub(crate) type Sql = Arc<str>;

/// Every statement the store runs in normal operation, built once per dialect and prefix.
#[derive(Debug)]
pub(crate) struct Queries {
    pub(crate) get_lease: Sql,
    pub(crate) list_leases_first: Sql,
    pub(crate) list_leases_after: Sql,
    pub(crate) insert_lease: Sql,
    pub(crate) update_lease: Sql,
    pub(crate) delete_lease: Sql,
    pub(crate) heartbeat: Sql,
    pub(crate) list_workers: Sql,
    pub(crate) remove_worker: Sql,
    pub(crate) remove_worker_if: Sql,
    /// `get_workers`: entry `i` reads `2^i` worker ids (`namespace` first, then the ids); the
    /// last reads [`GET_WORKERS_CHUNK`]. See [`Queries::get_workers`].
    pub(crate) get_workers: [Sql; GET_WORKERS_WIDTHS],
    /// The upsert of the namespace's fleet signal: `namespace`, `token`.
    pub(crate) write_fleet_signal: Sql,
    /// The read of the namespace's fleet signal: `namespace`.
    pub(crate) read_fleet_signal: Sql,
    pub(crate) delete_namespace: [Sql; 4],
    pub(crate) schema_version: Sql,
    /// PostgreSQL: the writes that announce themselves (see `crate::notify`).
    pub(crate) notifying: Option<Notifying>,
}

/// The PostgreSQL writes that `NOTIFY` the namespace's channel in the same statement, each the
/// plain one wrapped by `crate::notify`; the channel and payload are their last two parameters.
#[derive(Debug)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Notifying {
    pub(crate) insert_lease: Sql,
    pub(crate) update_lease: Sql,
    pub(crate) delete_lease: Sql,
    pub(crate) heartbeat: Sql,
    pub(crate) remove_worker: Sql,
    pub(crate) remove_worker_if: Sql,
}

impl Notifying {
    #[cfg(feature = "postgres")]
    fn new(plain: &Queries) -> Self {
        use crate::notify::{notifying, notifying_insert};
        let n = LEASE_WRITE_COLUMNS.len();
        Notifying {
            insert_lease: sql(notifying(&plain.insert_lease, n + 4)),
            update_lease: sql(notifying(&plain.update_lease, n + 5)),
            delete_lease: sql(notifying(&plain.delete_lease, 4)),
            heartbeat: sql(notifying_insert(&plain.heartbeat, 10)),
            remove_worker: sql(notifying(&plain.remove_worker, 3)),
            remove_worker_if: sql(notifying(&plain.remove_worker_if, 4)),
        }
    }
}

impl Queries {
    /// The statements of `dialect` over `tables`.
    pub(crate) fn new(dialect: Dialect, tables: &Tables) -> Self {
        let d = dialect;
        let Tables { leases, workers, namespaces, fleet, migrations } = tables;
        let p = |n| d.ph(n);
        // The fleet signal is a plain put: the row keeps whatever token was written last.
        let fleet_upsert = match d {
            Dialect::MySql => " ON DUPLICATE KEY UPDATE token = VALUES(token)",
            Dialect::Postgres | Dialect::Sqlite => {
                " ON CONFLICT (namespace) DO UPDATE SET token = excluded.token"
            }
        };
        let on_conflict_nothing = match d {
            // MySQL has no "do nothing" that is not INSERT IGNORE (which also turns data errors
            // into warnings); its duplicate-key error is mapped to "already exists" instead.
            Dialect::MySql => String::new(),
            Dialect::Postgres | Dialect::Sqlite => {
                " ON CONFLICT (namespace, lease_key) DO NOTHING".to_owned()
            }
        };
        // A heartbeat never replaces a later (or the same) beat of the same process (the rule of
        // `LeaseStore::heartbeat`): the stored row is kept when its beat has the same process
        // base (`beat >> WorkerRecord::BEAT_COUNT_BITS`) and is not lower. Beats are non-negative
        // `BIGINT`s, so the shift is exact in every dialect.
        let bits = WorkerRecord::BEAT_COUNT_BITS;
        let worker_upsert = match d {
            // MySQL's upsert has no `WHERE`: each column keeps its old value unless the row is
            // replaced. Assignments run left to right and later ones see the new values, so
            // `beat`, which the condition reads, is assigned last.
            Dialect::MySql => {
                let replace = format!(
                    "((beat >> {bits}) <> (VALUES(beat) >> {bits}) OR beat < VALUES(beat))"
                );
                let set: Vec<String> = [
                    "updated_at_millis",
                    "lease_count",
                    "load_figure",
                    "capacity",
                    "changes",
                    "lease_loads",
                    "beat",
                ]
                .iter()
                .map(|c| format!("{c} = IF({replace}, VALUES({c}), {c})"))
                .collect();
                format!(" ON DUPLICATE KEY UPDATE {}", set.join(", "))
            }
            Dialect::Postgres | Dialect::Sqlite => format!(
                " ON CONFLICT (namespace, worker_id) DO UPDATE \
                 SET beat = excluded.beat, updated_at_millis = excluded.updated_at_millis, \
                 lease_count = excluded.lease_count, load_figure = excluded.load_figure, \
                 capacity = excluded.capacity, changes = excluded.changes, \
                 lease_loads = excluded.lease_loads \
                 WHERE ({workers}.beat >> {bits}) <> (excluded.beat >> {bits}) \
                 OR {workers}.beat < excluded.beat"
            ),
        };
        let n = LEASE_WRITE_COLUMNS.len();
        let write_columns = LEASE_WRITE_COLUMNS.join(", ");
        let set_columns: Vec<String> = LEASE_WRITE_COLUMNS
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = {}", p(i + 1)))
            .collect();
        let set_columns = set_columns.join(", ");
        #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
        let mut queries = Queries {
            get_lease: sql(format!(
                "SELECT {LEASE_COLUMNS} FROM {leases} WHERE namespace = {} AND lease_key = {}",
                p(1),
                p(2)
            )),
            list_leases_first: sql(format!(
                "SELECT {LEASE_COLUMNS} FROM {leases} WHERE namespace = {} \
                 ORDER BY lease_key LIMIT {} OFFSET {}",
                p(1),
                p(2),
                p(3)
            )),
            list_leases_after: sql(format!(
                "SELECT {LEASE_COLUMNS} FROM {leases} WHERE namespace = {} AND lease_key > {} \
                 ORDER BY lease_key LIMIT {} OFFSET {}",
                p(1),
                p(2),
                p(3),
                p(4)
            )),
            insert_lease: sql(format!(
                "INSERT INTO {leases} ({write_columns}, version, namespace, lease_key) \
                 VALUES ({}){on_conflict_nothing}",
                d.phs(1, n + 3)
            )),
            update_lease: sql(format!(
                "UPDATE {leases} SET {set_columns}, version = {} \
                 WHERE namespace = {} AND lease_key = {} AND version = {}",
                p(n + 1),
                p(n + 2),
                p(n + 3),
                p(n + 4)
            )),
            delete_lease: sql(format!(
                "DELETE FROM {leases} WHERE namespace = {} AND lease_key = {} AND version = {}",
                p(1),
                p(2),
                p(3)
            )),
            heartbeat: sql(format!(
                "INSERT INTO {workers} (namespace, worker_id, beat, updated_at_millis, \
                 lease_count, load_figure, capacity, changes, lease_loads) \
                 VALUES ({}){worker_upsert}",
                d.phs(1, 9)
            )),
            list_workers: sql(format!(
                "SELECT {WORKER_COLUMNS} FROM {workers} WHERE namespace = {} ORDER BY worker_id",
                p(1)
            )),
            remove_worker: sql(format!(
                "DELETE FROM {workers} WHERE namespace = {} AND worker_id = {}",
                p(1),
                p(2)
            )),
            remove_worker_if: sql(format!(
                "DELETE FROM {workers} WHERE namespace = {} AND worker_id = {} AND beat = {}",
                p(1),
                p(2),
                p(3)
            )),
            get_workers: std::array::from_fn(|i| {
                sql(format!(
                    "SELECT {WORKER_COLUMNS} FROM {workers} WHERE namespace = {} \
                     AND worker_id IN ({})",
                    p(1),
                    d.phs(2, 1 << i)
                ))
            }),
            write_fleet_signal: sql(format!(
                "INSERT INTO {fleet} (namespace, token) VALUES ({}){fleet_upsert}",
                d.phs(1, 2)
            )),
            read_fleet_signal: sql(format!("SELECT token FROM {fleet} WHERE namespace = {}", p(1))),
            delete_namespace: [leases, workers, namespaces, fleet]
                .map(|t| sql(format!("DELETE FROM {t} WHERE namespace = {}", p(1)))),
            schema_version: sql(format!("SELECT MAX(version) FROM {migrations}")),
            notifying: None,
        };
        #[cfg(feature = "postgres")]
        if d == Dialect::Postgres {
            queries.notifying = Some(Notifying::new(&queries));
        }
        queries
    }
}

fn sql(s: String) -> Sql {
    Arc::from(s)
}

impl Queries {
    /// The `get_workers` statement for `count` ids (at most [`GET_WORKERS_CHUNK`]) and how many
    /// ids it binds: the narrowest of widths 1, 2, 4, ... that fits. The caller repeats its last id
    /// in the spare placeholders (`IN` matches a row once however often it is named), so a few
    /// statement texts serve every count and stay in the drivers' prepared-statement caches.
    pub(crate) fn get_workers(&self, count: usize) -> (&Sql, usize) {
        let width = count.clamp(1, GET_WORKERS_CHUNK).next_power_of_two();
        let index = width.trailing_zeros() as usize;
        // `index < GET_WORKERS_WIDTHS` since `width <= GET_WORKERS_CHUNK`.
        let last = &self.get_workers[GET_WORKERS_WIDTHS - 1];
        (self.get_workers.get(index).unwrap_or(last), width)
    }
}

/// Column types of the schema, per dialect.
struct Types {
    /// A namespace, lease key or worker id: compared byte by byte, no padding, no case folding.
    name: &'static str,
    /// A short enum-like text (`checkpoint_kind`).
    tag: &'static str,
    /// A decimal sequence number (up to 256 digits).
    digits: &'static str,
    /// A JSON document.
    json: &'static str,
    /// A 64-bit integer.
    int: &'static str,
    /// A double.
    float: &'static str,
    /// What follows the closing parenthesis of `CREATE TABLE`.
    table_options: String,
}

fn types(dialect: Dialect, mysql_collation: &str) -> Types {
    match dialect {
        // COLLATE "C": byte order, the same order as the other dialects, and no locale cost.
        Dialect::Postgres => Types {
            name: "TEXT COLLATE \"C\"",
            tag: "TEXT",
            digits: "TEXT",
            json: "TEXT",
            int: "BIGINT",
            float: "DOUBLE PRECISION",
            table_options: String::new(),
        },
        Dialect::Sqlite => Types {
            name: "TEXT",
            tag: "TEXT",
            digits: "TEXT",
            json: "TEXT",
            int: "BIGINT",
            float: "DOUBLE PRECISION",
            table_options: String::new(),
        },
        // utf8mb4 with a binary, no-pad collation (see `schema::mysql_collation`): keys that
        // differ only in case, accents or trailing spaces stay distinct.
        Dialect::MySql => Types {
            name: "VARCHAR(255)",
            tag: "VARCHAR(32)",
            digits: "VARCHAR(300)",
            json: "MEDIUMTEXT",
            int: "BIGINT",
            float: "DOUBLE",
            table_options: format!(
                " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={mysql_collation}"
            ),
        },
    }
}

/// `CREATE TABLE IF NOT EXISTS` of the migrations table.
pub(crate) fn create_migrations_table(
    dialect: Dialect,
    tables: &Tables,
    mysql_collation: &str,
) -> String {
    let t = types(dialect, mysql_collation);
    format!(
        "CREATE TABLE IF NOT EXISTS {} (version {int} NOT NULL PRIMARY KEY, description {json} \
         NOT NULL, applied_at_millis {int} NOT NULL){}",
        tables.migrations,
        t.table_options,
        int = t.int,
        json = t.json,
    )
}

/// Records that migration `version` was applied; a no-op when it already was (several workers
/// may run the migrations at once).
pub(crate) fn record_migration(dialect: Dialect, tables: &Tables) -> String {
    let m = &tables.migrations;
    match dialect {
        Dialect::MySql => format!(
            "INSERT IGNORE INTO {m} (version, description, applied_at_millis) VALUES (?, ?, ?)"
        ),
        Dialect::Postgres | Dialect::Sqlite => format!(
            "INSERT INTO {m} (version, description, applied_at_millis) VALUES ({}) \
             ON CONFLICT (version) DO NOTHING",
            dialect.phs(1, 3)
        ),
    }
}

/// The statements of schema version 1: leases, workers and the per-namespace incarnation
/// counters (`<prefix>namespaces`, no longer written since versions are random, but kept: dropping
/// it would take a migration and buys nothing). Every statement is idempotent.
pub(crate) fn schema_v1(dialect: Dialect, tables: &Tables, mysql_collation: &str) -> Vec<String> {
    let Types { name, tag, digits, json, int, float, table_options } =
        types(dialect, mysql_collation);
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {leases} (\
             namespace {name} NOT NULL, \
             lease_key {name} NOT NULL, \
             owner {name}, \
             epoch {int} NOT NULL, \
             version {int} NOT NULL, \
             checkpoint_kind {tag} NOT NULL, \
             checkpoint_seq {digits}, \
             checkpoint_sub {int}, \
             checkpoint_millis {int}, \
             parents {json} NOT NULL, \
             claim_by {name}, \
             claim_at {int}, \
             attributes {json} NOT NULL, \
             updated_at_millis {int} NOT NULL, \
             PRIMARY KEY (namespace, lease_key)){table_options}",
            leases = tables.leases
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {workers} (\
             namespace {name} NOT NULL, \
             worker_id {name} NOT NULL, \
             beat {int} NOT NULL, \
             updated_at_millis {int} NOT NULL, \
             lease_count {int} NOT NULL, \
             load_figure {float}, \
             capacity {int}, \
             PRIMARY KEY (namespace, worker_id)){table_options}",
            workers = tables.workers
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {namespaces} (\
             namespace {name} NOT NULL PRIMARY KEY, \
             last_incarnation {int} NOT NULL){table_options}",
            namespaces = tables.namespaces
        ),
    ]
}

/// The statements of schema version 2: the `changes` column of worker records (see
/// `WorkerRecord::changes`). PostgreSQL and MariaDB skip a column that exists; on SQLite and MySQL
/// the "duplicate column" error of a concurrent runner is tolerated (see [`is_duplicate_column`]).
pub(crate) fn schema_v2(dialect: Dialect, tables: &Tables, _mysql_collation: &str) -> Vec<String> {
    let if_not_exists = match dialect {
        Dialect::Postgres => "IF NOT EXISTS ",
        Dialect::Sqlite | Dialect::MySql => "",
    };
    vec![format!(
        "ALTER TABLE {workers} ADD COLUMN {if_not_exists}changes BIGINT NOT NULL DEFAULT 0",
        workers = tables.workers
    )]
}

/// The statements of schema version 3: the `lease_loads` column of worker records (see
/// `WorkerRecord::lease_loads`), the published lease loads as one text
/// (`shardlease_core::store::encode_lease_loads`). Nullable with no default (MySQL cannot give a
/// `TEXT` column a default before 8.0.13): NULL reads as no loads, so rows written before the
/// column existed, and by workers of the previous release (whose upsert leaves the column as it
/// is, NULL on a row they insert), stay readable. Duplicate columns are handled as in
/// [`schema_v2`].
pub(crate) fn schema_v3(dialect: Dialect, tables: &Tables, _mysql_collation: &str) -> Vec<String> {
    let if_not_exists = match dialect {
        Dialect::Postgres => "IF NOT EXISTS ",
        Dialect::Sqlite | Dialect::MySql => "",
    };
    vec![format!(
        "ALTER TABLE {workers} ADD COLUMN {if_not_exists}lease_loads TEXT",
        workers = tables.workers
    )]
}

/// The statements of schema version 4: the fleet signal table, one row per namespace holding the
/// token workers write when they change something their peers must look at (see
/// `LeaseStore::write_fleet_signal`). Only a new table, which neither the lease nor the worker
/// listing reads, so workers of the previous release keep working on migrated tables.
pub(crate) fn schema_v4(dialect: Dialect, tables: &Tables, mysql_collation: &str) -> Vec<String> {
    let Types { name, int, table_options, .. } = types(dialect, mysql_collation);
    vec![format!(
        "CREATE TABLE IF NOT EXISTS {fleet} (\
         namespace {name} NOT NULL PRIMARY KEY, \
         token {int} NOT NULL){table_options}",
        fleet = tables.fleet
    )]
}

/// Whether a migration statement failed only because the column it adds exists already (another
/// worker migrating at the same moment, or a run interrupted before it recorded the version).
pub(crate) fn is_duplicate_column(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.message().to_ascii_lowercase().contains("duplicate column"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_follow_the_dialect() {
        assert_eq!(Dialect::Postgres.phs(3, 2), "$3, $4");
        assert_eq!(Dialect::Sqlite.phs(1, 3), "?1, ?2, ?3");
        assert_eq!(Dialect::MySql.phs(1, 3), "?, ?, ?");
    }

    #[test]
    fn statements_bind_every_value() {
        let tables = Tables::new("shardlease_");
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let q = Queries::new(d, &tables);
            assert!(q.update_lease.contains("version = ") && q.update_lease.contains("UPDATE"));
            assert!(q.get_lease.contains("shardlease_leases"));
            // No quote character anywhere: nothing but identifiers and placeholders.
            for s in [&q.get_lease, &q.insert_lease, &q.update_lease, &q.heartbeat] {
                assert!(!s.contains('\''), "{s}");
            }
            let count = q.update_lease.matches(match d {
                Dialect::Postgres => "$",
                _ => "?",
            });
            assert_eq!(count.count(), 15, "{d}: {}", q.update_lease);
            assert!(q.heartbeat.contains("lease_loads") && q.list_workers.contains("lease_loads"));
        }
    }

    #[test]
    fn the_heartbeat_writes_nine_columns_and_notices_follow_them() {
        let tables = Tables::new("shardlease_");
        let q = Queries::new(Dialect::Sqlite, &tables);
        assert!(q.heartbeat.contains("?9)") && !q.heartbeat.contains("?10"), "{}", q.heartbeat);
        let q = Queries::new(Dialect::MySql, &tables);
        assert!(q.heartbeat.contains("lease_loads = IF("), "{}", q.heartbeat);
        #[cfg(feature = "postgres")]
        {
            let q = Queries::new(Dialect::Postgres, &tables);
            assert!(q.heartbeat.contains("$9)") && !q.heartbeat.contains("$10"));
            let n = q.notifying.as_ref().map(|n| n.heartbeat.to_string()).unwrap_or_default();
            assert!(n.contains("pg_notify($10, $11)"), "{n}");
        }
    }

    #[test]
    fn get_workers_statements_fit_every_count() {
        let tables = Tables::new("shardlease_");
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let q = Queries::new(d, &tables);
            for count in 1..=GET_WORKERS_CHUNK {
                let (statement, width) = q.get_workers(count);
                assert!(width >= count && width < 2 * count, "{d}: {count} ids, width {width}");
                let binds = match d {
                    Dialect::Postgres => statement.matches('$').count(),
                    _ => statement.matches('?').count(),
                };
                assert_eq!(binds, width + 1, "{d}: namespace and {width} ids: {statement}");
            }
            assert_eq!(q.get_workers(GET_WORKERS_CHUNK).1, GET_WORKERS_CHUNK);
            assert!(q.get_workers(1).0.contains("FROM shardlease_workers WHERE namespace = "));
        }
    }

    #[test]
    fn the_fleet_signal_is_an_upsert_of_its_own_table() {
        let tables = Tables::new("p_");
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let q = Queries::new(d, &tables);
            assert!(q.write_fleet_signal.starts_with("INSERT INTO p_fleet (namespace, token)"));
            assert!(q.read_fleet_signal.starts_with("SELECT token FROM p_fleet WHERE"));
            assert!(q.delete_namespace.iter().any(|s| s.starts_with("DELETE FROM p_fleet ")));
            let s = &schema_v4(d, &tables, "utf8mb4_bin")[0];
            assert!(s.starts_with("CREATE TABLE IF NOT EXISTS p_fleet ("), "{s}");
        }
        assert!(Queries::new(Dialect::MySql, &tables).write_fleet_signal.contains("ON DUPLICATE"));
        assert!(Queries::new(Dialect::Sqlite, &tables).write_fleet_signal.contains("ON CONFLICT"));
    }

    #[test]
    fn schema_3_adds_a_nullable_text_column() {
        let tables = Tables::new("p_");
        for d in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let statements = schema_v3(d, &tables, "");
            assert_eq!(statements.len(), 1);
            let s = &statements[0];
            assert!(s.starts_with("ALTER TABLE p_workers ADD COLUMN "), "{s}");
            assert!(s.ends_with("lease_loads TEXT"), "{d}: no NOT NULL, no DEFAULT: {s}");
        }
        assert!(schema_v3(Dialect::Postgres, &tables, "")[0].contains("IF NOT EXISTS"));
    }
}
