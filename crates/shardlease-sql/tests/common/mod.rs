//! Shared by the per-dialect test files: the conformance suite's factory over a [`SqlStore`],
//! how each test finds its server, raw SQL for tests that break rows by hand, and the checks that
//! every dialect runs (hostile identifiers, concurrent migrations, redaction) and how it damages
//! rows for the testkit's corrupt-record cases.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unused_macros)]

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::VersionedLease;
use shardlease_core::store::{CreateOutcome, Lease, LeaseLoad, LeaseStore, Version, WorkerRecord};
use shardlease_core::{Error, LeaseKey, Position, Result, WorkerId};
use shardlease_sql::{Dialect, SqlPool, SqlStore};
use shardlease_testkit::extensions::{CorruptRecords, Corruption, SecretUrl};
use shardlease_testkit::{fresh_namespace, StoreFactory};

/// The tests every dialect runs on its factory: the conformance suite, the corrupt-record cases
/// of the testkit, random versions and conditional worker removal. `$factory` is an async expression giving
/// `Option<SqlFactory>` (`None`: skipped).
macro_rules! dialect_tests {
    ($factory:expr) => {
        shardlease_testkit::store_conformance_tests!(@async $factory);

        shardlease_testkit::corrupt_record_tests!($factory);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn versions_are_random_and_never_repeat() {
            let Some(f) = $factory.await else { return };
            common::versions_are_random_and_never_repeat(f.base()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn remove_worker_if_is_one_conditional_delete() {
            let Some(f) = $factory.await else { return };
            common::remove_worker_if_is_one_conditional_delete(f.base()).await;
        }
    };
}

/// The tests a database server runs on top of [`dialect_tests!`]: hostile identifiers and
/// concurrent migrations against the server `$url` names (an `Option<String>`; `None`: skipped).
macro_rules! server_tests {
    ($url:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn hostile_identifiers() {
            let Some(url) = $url else { return };
            let f = common::SqlFactory::connect(&url).await;
            common::hostile_identifiers(f.base(), &url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_migrations() {
            let Some(url) = $url else { return };
            common::concurrent_migrations(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn migrates_version_1_tables() {
            let Some(url) = $url else { return };
            common::migrates_version_1_tables(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn migrates_version_2_tables() {
            let Some(url) = $url else { return };
            common::migrates_version_2_tables(&url).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn migrates_version_3_tables() {
            let Some(url) = $url else { return };
            common::migrates_version_3_tables(&url).await;
        }
    };
}

/// The conformance suite's factory: every namespace on one pool, one store per namespace (the
/// stores a test opens on a namespace are clones of it, as the workers of one process would
/// share one).
pub struct SqlFactory {
    base: SqlStore,
    stores: tokio::sync::Mutex<HashMap<String, SqlStore>>,
    _file: Option<TempDb>,
}

/// A store for `namespace` on the pool and tables of `base`.
pub async fn other_namespace(base: &SqlStore, namespace: &str) -> Result<SqlStore> {
    SqlStore::builder()
        .pool(base.pool().clone())
        .table_prefix(base.table_prefix())
        .namespace(namespace)
        .create_schema(false)
        .connect()
        .await
}

impl SqlFactory {
    /// Connects to `url` (panics when that fails: a configured server must work).
    pub async fn connect(url: &str) -> SqlFactory {
        let base = SqlStore::builder()
            .url(url)
            .namespace("conformance-base")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", shardlease_sql::redact_url(url)));
        SqlFactory { base, stores: Default::default(), _file: None }
    }

    /// A factory over a new SQLite file, removed when the factory is dropped.
    pub async fn sqlite_file() -> SqlFactory {
        let file = TempDb::new("conformance");
        let mut factory = SqlFactory::connect(&file.url()).await;
        factory._file = Some(file);
        factory
    }

    /// The store the factory opens namespaces from.
    pub fn base(&self) -> &SqlStore {
        &self.base
    }

    /// The factory's store for `namespace`.
    pub async fn open(&self, namespace: &str) -> Result<SqlStore> {
        let mut stores = self.stores.lock().await;
        if let Some(store) = stores.get(namespace) {
            return Ok(store.clone());
        }
        let store = other_namespace(&self.base, namespace).await?;
        stores.insert(namespace.to_owned(), store.clone());
        Ok(store)
    }
}

#[async_trait]
impl StoreFactory for SqlFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.open(namespace).await?))
    }

    async fn cleanup(&self, namespace: &str) -> Result<()> {
        self.open(namespace).await?.delete_namespace().await
    }

    fn name(&self) -> String {
        format!("sql/{}", self.base.dialect())
    }

    /// PostgreSQL: terminates the backends `LISTEN`ing on the namespace's channel. The other
    /// dialects have no notification.
    async fn drop_subscriptions(
        &self,
        _store: &Arc<dyn LeaseStore>,
        namespace: &str,
    ) -> Result<bool> {
        let raw = self.open(namespace).await?;
        let Some(channel) = raw.notify_channel() else { return Ok(false) };
        let listen = format!("LISTEN \"{channel}\"");
        let sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1";
        match exec_raw(&raw, sql, &[&listen]).await {
            0 => Err(Error::permanent(format!("drop_subscriptions: nobody runs {listen}"))),
            _ => Ok(true),
        }
    }

    /// Writes the content through `store` (its own encoding: an update at the current version,
    /// or a create), then sets the version by hand with a raw `UPDATE` on the factory's pool.
    async fn restore_raw(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        match store.get_lease(&lease.key).await? {
            Some(VersionedLease { version: current, .. }) => {
                store.update_lease(lease, current).await?;
            }
            None => {
                store.create_lease(lease).await?;
            }
        }
        let raw = self.open(namespace).await?;
        let version = i64::try_from(version.0)
            .map_err(|_| Error::InvalidInput(format!("{version:?} does not fit a BIGINT")))?;
        let d = raw.dialect();
        let sql = format!(
            "UPDATE {} SET version = {version} WHERE namespace = {} AND lease_key = {}",
            raw.leases_table(),
            ph(d, 1),
            ph(d, 2)
        );
        match exec_raw(&raw, &sql, &[namespace, lease.key.as_str()]).await {
            1 => Ok(true),
            n => Err(Error::permanent(format!("restore_raw: {sql} changed {n} rows, not 1"))),
        }
    }
}

/// The damage: garbage written by hand in one column of a row, named after what it breaks.
const VANDALISM: &[(&str, &str, &str)] = &[
    ("kind", "checkpoint_kind", "'bogus'"),
    ("seq", "checkpoint_seq", "'12abc'"),
    ("parents", "parents", "'not json'"),
    ("attrs", "attributes", "'{\"a\": 1'"),
    ("epoch", "epoch", "-5"),
    ("claim", "claim_by", "'w-half-a-claim'"),
    ("sub", "checkpoint_sub", "-1"),
];

/// SQLite keeps whatever type a hand edit writes: two more kinds of damage there.
const SQLITE_VANDALISM: &[(&str, &str, &str)] =
    &[("typed", "epoch", "'garbage'"), ("blob", "parents", "x'00ff'")];

impl SqlFactory {
    fn vandalism(
        &self,
    ) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
        let extra = if self.base.dialect() == Dialect::Sqlite { SQLITE_VANDALISM } else { &[] };
        VANDALISM.iter().chain(extra)
    }
}

/// Rows with garbage in a column: every row is repaired by a write at its real version.
#[async_trait]
impl CorruptRecords for SqlFactory {
    fn lease_corruptions(&self) -> Vec<Corruption> {
        self.vandalism().map(|(name, _, _)| Corruption::new(name, "").repairable()).collect()
    }

    fn worker_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("w-bad", "").repairable().beat_intact(),
            Corruption::new("w-loads", "lease_loads").repairable().beat_intact(),
        ]
    }

    async fn corrupt_lease(&self, ns: &str, key: &LeaseKey, damage: &Corruption) -> Result<()> {
        let (_, column, value) = self
            .vandalism()
            .find(|(name, _, _)| *name == damage.name)
            .unwrap_or_else(|| panic!("no such damage: {}", damage.name));
        vandalize(&self.open(ns).await?, key.as_str(), column, value).await;
        Ok(())
    }

    async fn corrupt_worker(&self, ns: &str, id: &WorkerId, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let d = store.dialect();
        let set = match damage.name {
            "w-bad" => "lease_count = -1",
            "w-loads" => "lease_loads = 'not lease loads'",
            other => panic!("no such damage: {other}"),
        };
        let sql = format!(
            "UPDATE {} SET {set} WHERE namespace = {} AND worker_id = {}",
            store.workers_table(),
            ph(d, 1),
            ph(d, 2)
        );
        assert_eq!(exec_raw(&store, &sql, &[namespace_of(&store).as_str(), id.as_str()]).await, 1);
        Ok(())
    }
}

/// The PostgreSQL test server's URL, or `None` (the test says it is skipped).
pub fn postgres_url() -> Option<String> {
    shardlease_testkit::suite::env_or_skip("SHARDLEASE_TEST_POSTGRES_URL")
}

/// The MySQL/MariaDB test server's URL, or `None` (the test says it is skipped).
pub fn mysql_url() -> Option<String> {
    shardlease_testkit::suite::env_or_skip("SHARDLEASE_TEST_MYSQL_URL")
}

/// A SQLite database file in a temporary directory of its own, removed (with its WAL and
/// shared-memory files) on drop.
pub struct TempDb {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TempDb {
    /// A new, not yet existing, database file.
    pub fn new(tag: &str) -> TempDb {
        let dir = tempfile::Builder::new()
            .prefix(&format!("shardlease-sql-{tag}-"))
            .tempdir()
            .expect("create the test directory");
        TempDb { path: dir.path().join("test.db"), _dir: dir }
    }

    /// Its `sqlite://` URL.
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    /// Its path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// A placeholder of `dialect`.
pub fn ph(dialect: Dialect, n: usize) -> String {
    match dialect {
        Dialect::Postgres => format!("${n}"),
        Dialect::Sqlite => format!("?{n}"),
        Dialect::MySql => "?".into(),
    }
}

/// The namespace a store reads and writes, as the raw SQL of these tests binds it.
pub fn namespace_of(store: &SqlStore) -> String {
    LeaseStore::namespace(store).map(|n| n.as_str().to_owned()).unwrap_or_default()
}

/// Runs `sql` with text parameters `binds` on the store's pool (for tests that break rows by
/// hand); returns the rows affected.
pub async fn exec_raw(store: &SqlStore, sql: &str, binds: &[&str]) -> u64 {
    let sql = sql.to_owned();
    let result = match store.pool() {
        SqlPool::Postgres(p) => {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
            for b in binds {
                q = q.bind(*b);
            }
            q.execute(p).await.map(|r| r.rows_affected())
        }
        SqlPool::Sqlite(p) => {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
            for b in binds {
                q = q.bind(*b);
            }
            q.execute(p).await.map(|r| r.rows_affected())
        }
        SqlPool::MySql(p) => {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
            for b in binds {
                q = q.bind(*b);
            }
            q.execute(p).await.map(|r| r.rows_affected())
        }
        _ => unreachable!(),
    };
    result.unwrap_or_else(|e| panic!("raw SQL failed: {sql}: {e}"))
}

/// Sets column `column` of lease `key` to the SQL expression `value` (a literal written by the
/// test) by hand, as an operator's bad edit would.
pub async fn vandalize(store: &SqlStore, key: &str, column: &str, value: &str) {
    let d = store.dialect();
    let sql = format!(
        "UPDATE {} SET {column} = {value} WHERE namespace = {} AND lease_key = {}",
        store.leases_table(),
        ph(d, 1),
        ph(d, 2)
    );
    let n = exec_raw(store, &sql, &[namespace_of(store).as_str(), key]).await;
    assert_eq!(n, 1, "{sql} must change one row");
}

fn created(outcome: Result<CreateOutcome>) -> Version {
    match outcome {
        Ok(CreateOutcome::Created(v)) => v,
        other => panic!("expected Created, got {other:?}"),
    }
}

/// Identifiers built to break naive SQL either round-trip exactly or are rejected clearly.
pub async fn hostile_identifiers(base: &SqlStore, url: &str) {
    // A table prefix is an identifier spliced into statements: only [a-z_][a-z0-9_]{0,30}.
    for prefix in ["x;DROP TABLE shardlease_leases;--", "Shard", "a b", "x'", "9a", ""] {
        match SqlStore::builder().url(url).table_prefix(prefix).namespace("n").connect().await {
            Err(Error::Config(m)) => assert!(m.contains("table prefix"), "{m}"),
            other => panic!("prefix {prefix:?}: expected a Config error, got {other:?}"),
        }
    }
    let url_prefix = format!(
        "{url}{}table_prefix=x%3BDROP%20TABLE%20y",
        if url.contains('?') { "&" } else { "?" }
    );
    assert!(matches!(
        SqlStore::builder().url(&url_prefix).namespace("n").connect().await,
        Err(Error::Config(_))
    ));

    let suffix = fresh_namespace("hostile");
    let namespaces = [
        format!("it's \"{suffix}\"; DROP TABLE shardlease_leases; --"),
        format!("{suffix}-名前空間-ü-🦀"),
        format!("{suffix}%"),
        format!("{suffix}_"),
        format!("{suffix}\\"),
        format!("{suffix}__"),
    ];
    let keys = [
        "'",
        "''",
        "\"",
        "\\",
        "%",
        "_",
        "a%",
        "a_",
        "--",
        "/* x */",
        "a",
        "A",
        "a ",
        " a",
        "ä",
        "a\u{308}",
        "🦀/shardId-0001",
        "key\nwith newline",
        "Robert'); DROP TABLE x;--",
    ];
    let max_key = "🦀".repeat(255);
    let mut stores = Vec::new();
    for (i, ns) in namespaces.iter().enumerate() {
        let store = other_namespace(base, ns).await.unwrap();
        for key in keys.iter().copied().chain([max_key.as_str()]) {
            let mut lease = Lease::new(key, Position::sequence(i as u64 + 1));
            lease.owner = Some(WorkerId::from(format!("worker '{i}\" 🦀")));
            lease.parents = vec![LeaseKey::from("'parent'"), LeaseKey::from(key)];
            lease.attributes.insert("q'uote".into(), "nul\0 and \"quotes\" and 🦀".into());
            let v = created(store.create_lease(&lease).await);
            assert_eq!(
                store.get_lease(&lease.key).await.unwrap(),
                Some(VersionedLease::new(lease.clone(), v)),
                "{ns:?} / {key:?} must round-trip"
            );
        }
        store.heartbeat(&WorkerRecord::new(format!("w'{i}\"").into(), 1)).await.unwrap();
        stores.push(store);
    }
    for (store, ns) in stores.iter().zip(&namespaces) {
        let listing = store.list_leases().await.unwrap();
        assert!(listing.corrupt.is_empty(), "{:?}", listing.corrupt);
        let mut got: Vec<&str> = listing.items.iter().map(|v| v.lease.key.as_str()).collect();
        got.sort_unstable();
        let mut want: Vec<&str> = keys.iter().copied().chain([max_key.as_str()]).collect();
        want.sort_unstable();
        assert_eq!(got, want, "{ns:?}: each namespace lists exactly its own keys");
        assert_eq!(store.list_workers().await.unwrap().items.len(), 1, "{ns:?}");
    }

    // Too long, or a NUL: rejected with InvalidInput before any SQL runs.
    let store = &stores[0];
    for bad in ["🦀".repeat(256), "nul\0key".to_owned()] {
        let lease = Lease::new(bad.as_str(), Position::Latest);
        assert!(matches!(store.create_lease(&lease).await, Err(Error::InvalidInput(_))));
        assert!(matches!(store.get_lease(&lease.key).await, Err(Error::InvalidInput(_))));
    }
    assert!(matches!(other_namespace(base, "nul\0ns").await, Err(Error::Config(_))));
    assert!(matches!(other_namespace(base, "").await, Err(Error::Config(_))));

    // The tables are all still there.
    let probe = other_namespace(base, &fresh_namespace("after-hostile")).await.unwrap();
    assert!(probe.list_leases().await.unwrap().items.is_empty());
    for store in &stores {
        store.delete_namespace().await.unwrap();
    }
}

/// Many stores connecting at once with a new table prefix all run the migrations and succeed;
/// `create_schema=false` on a prefix with no tables is a clear `Config` error. Drops the tables.
pub async fn concurrent_migrations(url: &str) {
    let prefix = format!("t{}_", fresh_namespace("").replace('-', "_").trim_start_matches("ns_"));
    match SqlStore::builder().url(url).table_prefix(&prefix).create_schema(false).connect().await {
        Err(Error::Config(m)) => assert!(m.contains("missing"), "{m}"),
        other => panic!("create_schema=false without tables: expected Config, got {other:?}"),
    }
    let connects = (0..6).map(|i| {
        let url = url.to_owned();
        let prefix = prefix.clone();
        tokio::spawn(async move {
            SqlStore::builder()
                .url(url)
                .table_prefix(prefix)
                .namespace(format!("m{i}"))
                .max_connections(2)
                .connect()
                .await
        })
    });
    let mut stores = Vec::new();
    for handle in connects.collect::<Vec<_>>() {
        stores.push(handle.await.unwrap().unwrap_or_else(|e| panic!("concurrent connect: {e}")));
    }
    for store in &stores {
        created(store.create_lease(&Lease::new("k", Position::Latest)).await);
    }
    let again = SqlStore::builder()
        .url(url)
        .table_prefix(&prefix)
        .create_schema(false)
        .connect()
        .await
        .unwrap();
    assert_eq!(again.table_prefix(), prefix);
    let m0 = other_namespace(&again, "m0").await.unwrap();
    assert_eq!(m0.list_leases().await.unwrap().items.len(), 1);
    let migrations = format!("{prefix}schema_migrations");
    for table in [
        again.leases_table().to_owned(),
        again.workers_table().to_owned(),
        format!("{prefix}namespaces"),
        format!("{prefix}fleet"),
        migrations,
    ] {
        exec_raw(&again, &format!("DROP TABLE {table}"), &[]).await;
    }
}

/// Tables of `prefix` on `url`, created at the current schema, then taken back by hand to schema
/// `version` (1, 2 or 3): the tables and columns later migrations add dropped and their records deleted. The
/// returned store (`create_schema` off) is on a new pool: SQLite compiles DDL against the schema
/// a connection cached, and a connection of the migrating pool may have cached the table before
/// another one added a column ("no such column", seen once in CI on a loaded machine). New
/// connections read the schema afresh.
async fn tables_at_version(url: &str, prefix: &str, version: i64) -> SqlStore {
    let current = SqlStore::builder().url(url).table_prefix(prefix).connect().await.unwrap();
    drop(current);
    let current = SqlStore::builder()
        .url(url)
        .table_prefix(prefix)
        .create_schema(false)
        .connect()
        .await
        .unwrap();
    let workers = current.workers_table().to_owned();
    let migrations = format!("{prefix}schema_migrations");
    // Newest first: each table and column with the migration that added it.
    if version < 4 {
        exec_raw(&current, &format!("DROP TABLE {prefix}fleet"), &[]).await;
        exec_raw(&current, &format!("DELETE FROM {migrations} WHERE version = 4"), &[]).await;
    }
    for (added_by, column) in [(3, "lease_loads"), (2, "changes")] {
        if added_by > version {
            exec_raw(&current, &format!("ALTER TABLE {workers} DROP COLUMN {column}"), &[]).await;
            exec_raw(
                &current,
                &format!("DELETE FROM {migrations} WHERE version = {added_by}"),
                &[],
            )
            .await;
        }
    }
    current
}

/// Drops the tables of `store`'s prefix.
async fn drop_tables(store: &SqlStore) {
    let prefix = store.table_prefix().to_owned();
    for table in [
        store.leases_table().to_owned(),
        store.workers_table().to_owned(),
        format!("{prefix}namespaces"),
        format!("{prefix}fleet"),
        format!("{prefix}schema_migrations"),
    ] {
        exec_raw(store, &format!("DROP TABLE {table}"), &[]).await;
    }
}

/// Tables left at schema version 3 (no fleet table) are refused without `create_schema` and
/// migrated with it: the fleet signal starts missing and round-trips, the worker rows written
/// before are still listed and read by id, and `delete_namespace` clears the signal.
pub async fn migrates_version_3_tables(url: &str) {
    use shardlease_core::store::FleetSignal;
    let prefix = format!("f{}_", fresh_namespace("").replace('-', "_").trim_start_matches("ns_"));
    let current = tables_at_version(url, &prefix, 3).await;
    current.heartbeat(&WorkerRecord::new("old".into(), 7)).await.unwrap();
    match SqlStore::builder().url(url).table_prefix(&prefix).create_schema(false).connect().await {
        Err(Error::Config(m)) => assert!(m.contains("schema version 3"), "{m}"),
        other => panic!("version 3 tables without create_schema: expected Config, got {other:?}"),
    }
    let migrated = SqlStore::builder().url(url).table_prefix(&prefix).connect().await.unwrap();
    assert_eq!(migrated.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
    migrated.write_fleet_signal(Version(42)).await.unwrap();
    assert_eq!(migrated.read_fleet_signal().await.unwrap(), FleetSignal::Token(Version(42)));
    let got = migrated.get_workers(&["old".into(), "new".into()]).await.unwrap();
    assert_eq!(got.items.len(), 1, "{got:?}");
    assert_eq!(migrated.list_workers().await.unwrap().items.len(), 1);
    migrated.delete_namespace().await.unwrap();
    assert_eq!(migrated.read_fleet_signal().await.unwrap(), FleetSignal::Missing);
    drop_tables(&migrated).await;
}

/// Tables left at schema version 2 (worker rows without `lease_loads`) are refused without
/// `create_schema` and migrated with it; their old worker rows, and rows a worker of the previous
/// release writes after the migration (an insert that does not name the column), read as no lease
/// loads; a heartbeat with loads keeps them.
pub async fn migrates_version_2_tables(url: &str) {
    let prefix = format!("w{}_", fresh_namespace("").replace('-', "_").trim_start_matches("ns_"));
    let current = tables_at_version(url, &prefix, 2).await;
    let workers = current.workers_table().to_owned();
    let old_row = |id: &str| {
        format!(
            "INSERT INTO {workers} (namespace, worker_id, beat, updated_at_millis, lease_count, \
             changes) VALUES ('default', '{id}', 7, 0, 1, 3)"
        )
    };
    exec_raw(&current, &old_row("old"), &[]).await;
    match SqlStore::builder().url(url).table_prefix(&prefix).create_schema(false).connect().await {
        Err(Error::Config(m)) => assert!(m.contains("schema version 2"), "{m}"),
        other => panic!("version 2 tables without create_schema: expected Config, got {other:?}"),
    }
    let migrated = SqlStore::builder().url(url).table_prefix(&prefix).connect().await.unwrap();
    exec_raw(&migrated, &old_row("older-release"), &[]).await;
    let listed = migrated.list_workers().await.unwrap();
    assert!(listed.corrupt.is_empty(), "{listed:?}");
    assert_eq!(listed.items.len(), 2, "{listed:?}");
    for w in &listed.items {
        assert_eq!((w.beat, w.changes), (7, 3), "{w:?}");
        assert!(w.lease_loads.is_empty(), "NULL is no loads: {w:?}");
    }
    let mut fresh = WorkerRecord::new("new".into(), 1);
    fresh.load = Some(0.75);
    fresh.lease_loads = vec![LeaseLoad::new("a/b c", 0.5), LeaseLoad::new("d", 0.25)];
    migrated.heartbeat(&fresh).await.unwrap();
    let listed = migrated.list_workers().await.unwrap();
    let loads = listed.items.iter().find(|w| w.id.as_str() == "new").map(|w| &w.lease_loads);
    assert_eq!(loads, Some(&fresh.lease_loads), "{listed:?}");
    // Migrating again (another worker starting) changes nothing.
    let again = SqlStore::builder().url(url).table_prefix(&prefix).connect().await.unwrap();
    assert_eq!(again.list_workers().await.unwrap().items.len(), 3);
    drop_tables(&migrated).await;
}

/// Tables left at schema version 1 (worker rows without `changes`) are refused without
/// `create_schema`, migrated with it, and their old worker rows read as 0 changes.
pub async fn migrates_version_1_tables(url: &str) {
    let prefix = format!("v{}_", fresh_namespace("").replace('-', "_").trim_start_matches("ns_"));
    let current = tables_at_version(url, &prefix, 1).await;
    let workers = current.workers_table().to_owned();
    let old_row = format!(
        "INSERT INTO {workers} (namespace, worker_id, beat, updated_at_millis, lease_count) \
         VALUES ('default', 'old', 7, 0, 1)"
    );
    exec_raw(&current, &old_row, &[]).await;
    match SqlStore::builder().url(url).table_prefix(&prefix).create_schema(false).connect().await {
        Err(Error::Config(m)) => assert!(m.contains("schema version 1"), "{m}"),
        other => panic!("version 1 tables without create_schema: expected Config, got {other:?}"),
    }
    let migrated = SqlStore::builder().url(url).table_prefix(&prefix).connect().await.unwrap();
    let listed = migrated.list_workers().await.unwrap();
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    assert_eq!((listed.items[0].beat, listed.items[0].changes), (7, 0));
    assert!(listed.items[0].lease_loads.is_empty());
    let mut fresh = WorkerRecord::new("new".into(), 1);
    fresh.changes = 12;
    migrated.heartbeat(&fresh).await.unwrap();
    let listed = migrated.list_workers().await.unwrap();
    assert_eq!(listed.items.iter().find(|w| w.id.as_str() == "new").map(|w| w.changes), Some(12));
    drop_tables(&migrated).await;
}

/// The URLs with a password of one dialect's scheme(s), for the testkit's redaction case:
/// each `format` has `{secret}` and `{port}` in it.
pub struct SqlUrls(pub &'static [&'static str]);

#[async_trait]
impl SecretUrl for SqlUrls {
    fn urls_with_password(&self, secret: &str, port: u16) -> Vec<String> {
        let fill = |f: &str| f.replace("{secret}", secret).replace("{port}", &port.to_string());
        self.0.iter().map(|f| fill(f)).collect()
    }
    async fn connect(&self, url: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(SqlStore::builder().url(url).namespace("n").connect().await?))
    }
    fn builder_debug(&self, url: &str) -> Option<String> {
        Some(format!("{:?}", SqlStore::builder().url(url)))
    }
    fn errors_show_the_redacted_url(&self) -> bool {
        true
    }
}

/// Creates and updates write random positive versions that never repeat, even when an update
/// starts from a version set by hand to the largest `BIGINT` (no overflow, no counter); the
/// namespace's row in the old incarnation counter table is never written.
pub async fn versions_are_random_and_never_repeat(base: &SqlStore) {
    let store = other_namespace(base, &fresh_namespace("random-versions")).await.unwrap();
    let mut seen = std::collections::HashSet::new();
    for i in 0..50 {
        let v = created(store.create_lease(&Lease::new(format!("k{i}"), Position::Latest)).await);
        assert!(v.0 >= 1 && i64::try_from(v.0).is_ok(), "{v:?} is a positive BIGINT");
        assert!(seen.insert(v), "{v:?} handed out twice");
    }
    let VersionedLease { lease, version: mut v } =
        store.get_lease(&"k0".into()).await.unwrap().unwrap();
    for _ in 0..50 {
        v = store.update_lease(&lease, v).await.unwrap();
        assert!(v.0 >= 1 && i64::try_from(v.0).is_ok(), "{v:?} is a positive BIGINT");
        assert!(seen.insert(v), "{v:?} handed out twice");
    }
    let sql = format!(
        "UPDATE {} SET version = {} WHERE namespace = {} AND lease_key = {}",
        store.leases_table(),
        i64::MAX,
        ph(store.dialect(), 1),
        ph(store.dialect(), 2)
    );
    exec_raw(&store, &sql, &[namespace_of(&store).as_str(), "k1"]).await;
    let VersionedLease { lease, version: v } =
        store.get_lease(&"k1".into()).await.unwrap().unwrap();
    assert_eq!(v.0, i64::MAX as u64);
    let next = store.update_lease(&lease, v).await.unwrap();
    assert!(next != v && next.0 >= 1, "{next:?}");
    // Nothing wrote the namespace's row of the counter table earlier releases used.
    let sql = format!(
        "DELETE FROM {}namespaces WHERE namespace = {}",
        store.table_prefix(),
        ph(store.dialect(), 1)
    );
    assert_eq!(exec_raw(&store, &sql, &[namespace_of(&store).as_str()]).await, 0, "no counter row");
    store.delete_namespace().await.unwrap();
}

/// `remove_worker_if` deletes only the row of this namespace with that worker id and beat; a beat
/// no `BIGINT` can hold matches nothing; an invalid worker id is refused like everywhere else.
pub async fn remove_worker_if_is_one_conditional_delete(base: &SqlStore) {
    let ns = fresh_namespace("remove-if");
    let store = other_namespace(base, &ns).await.unwrap();
    let other = other_namespace(base, &format!("{ns}-other")).await.unwrap();
    store.heartbeat(&WorkerRecord::new("w".into(), 5)).await.unwrap();
    other.heartbeat(&WorkerRecord::new("w".into(), 5)).await.unwrap();
    assert!(!store.remove_worker_if(&"w".into(), u64::MAX).await.unwrap());
    assert!(!store.remove_worker_if(&"w".into(), 4).await.unwrap());
    assert!(store.remove_worker_if(&"w".into(), 5).await.unwrap());
    assert!(store.list_workers().await.unwrap().items.is_empty());
    assert_eq!(other.list_workers().await.unwrap().items.len(), 1, "other namespace untouched");
    let bad = WorkerId::from("nul\0id");
    assert!(matches!(store.remove_worker_if(&bad, 5).await, Err(Error::InvalidInput(_))));
    let named = LeaseStore::namespace(&store).unwrap();
    assert_eq!(named.as_str(), ns, "the store names its namespace");
    store.delete_namespace().await.unwrap();
    other.delete_namespace().await.unwrap();
}
