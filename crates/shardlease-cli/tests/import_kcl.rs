//! `shardlease import-kcl` against the DynamoDB emulator (moto, at
//! `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`; a skip locally when unset, a failure under `CI=true`).
//! Each test creates a KCL lease table in one schema with rows written as the KCL writes them
//! (Java KCL 2.x/3.x: `leaseKey`, `checkpoint` with its sentinels, `checkpointSubSequenceNumber`,
//! `parentShardId` as a string set, `leaseOwner`, `leaseCounter`; vmware-go-kcl: `ShardID`,
//! `Checkpoint`, `AssignedTo`, `LeaseTimeout`, `ParentShardId`), runs the binary into a SQLite
//! store and checks every lease it wrote, then a second run (nothing changes), the dry run, the
//! refusal while a KCL worker renews its leases, and the refusal of a non-empty namespace.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_dynamodb::Client;
use serde_json::Value;
use shardlease::store::{Lease, VersionedLease};
use shardlease::{LeaseKey, Position, SequenceNumber};
use shardlease_testkit::suite::env_or_skip;

const ENDPOINT_VAR: &str = "SHARDLEASE_TEST_DYNAMODB_ENDPOINT";
const SEQ_A: &str = "49590338271490256608559692538361571095921575989136588898";
const SEQ_B: &str = "49590338271490256608559692540925702759324208523137515618";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

struct Kcl {
    endpoint: String,
    client: Client,
    table: String,
}

async fn kcl_table(key: &str) -> Option<Kcl> {
    let endpoint = env_or_skip(ENDPOINT_VAR)?;
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .build();
    let client = Client::from_conf(conf);
    let table = format!("kcl-import-{}", rand_suffix());
    client
        .create_table()
        .table_name(&table)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table: {e:?}"));
    Some(Kcl { endpoint, client, table })
}

fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{nanos}", std::process::id())
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}
fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}
fn ss(v: &[&str]) -> AttributeValue {
    AttributeValue::Ss(v.iter().map(|x| (*x).to_owned()).collect())
}

impl Kcl {
    async fn put(&self, attrs: &[(&str, AttributeValue)]) {
        let item: HashMap<String, AttributeValue> =
            attrs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put: {e:?}"));
    }

    /// A Java KCL lease row as `DynamoDBLeaseSerializer` writes it.
    async fn java(&self, key: &str, checkpoint: &str, sub: u64, parents: &[&str], owner: &str) {
        let mut attrs = vec![
            ("leaseKey", s(key)),
            ("checkpoint", s(checkpoint)),
            ("checkpointSubSequenceNumber", n(sub)),
            ("leaseCounter", n(42)),
            ("ownerSwitchesSinceCheckpoint", n(0)),
        ];
        if !parents.is_empty() {
            attrs.push(("parentShardId", ss(parents)));
        }
        if !owner.is_empty() {
            attrs.push(("leaseOwner", s(owner)));
        }
        self.put(&attrs).await;
    }

    async fn cli(&self, store: &str, args: &[&str]) -> Out {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardlease"));
        cmd.arg("--store")
            .arg(store)
            .arg("import-kcl")
            .arg("--table")
            .arg(&self.table)
            .arg("--region")
            .arg("us-east-1")
            .arg("--endpoint-url")
            .arg(&self.endpoint)
            .args(args)
            .env_remove("SHARDLEASE_STORE")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env_remove("AWS_PROFILE");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("cannot run the shardlease binary: {e}"));
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn drop_table(&self) {
        let _ = self.client.delete_table().table_name(&self.table).send().await;
    }
}

fn json(out: &Out) -> Value {
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", out.stdout, out.stderr))
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("leases.db").display())
}

async fn leases(url: &str) -> HashMap<String, VersionedLease> {
    let store = shardlease::connect(url).await.unwrap_or_else(|e| panic!("{e}"));
    let listing = store.list_leases().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(listing.corrupt.is_empty(), "{:?}", listing.corrupt);
    listing.items.into_iter().map(|v| (v.lease.key.to_string(), v)).collect()
}

fn seq(s: &str, sub: u64) -> Position {
    Position::Sequence { seq: SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}")), sub }
}

fn check(all: &HashMap<String, VersionedLease>, key: &str, cp: &Position, parents: &[&str]) {
    let l = &all.get(key).unwrap_or_else(|| panic!("no lease {key}: {:?}", all.keys())).lease;
    assert_eq!(&l.checkpoint, cp, "{key}");
    let mut got: Vec<&str> = l.parents.iter().map(LeaseKey::as_str).collect();
    got.sort_unstable();
    assert_eq!(got, parents, "{key}");
    assert_eq!(l.owner, None, "{key} must be unowned");
    assert!(l.claim.is_none(), "{key}");
    assert!(l.epoch.0 > 0, "{key}: a created lease's epoch is the clock");
}

fn actions(v: &Value) -> HashMap<String, String> {
    v["leases"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|e| {
            (
                e["kcl_key"].as_str().unwrap_or_default().to_owned(),
                e["action"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The Java table of the tests: a merge (0 + 1 -> 2, both parents finished), 2 checkpointed
/// inside a KPL aggregate, its child 3 never checkpointed, 4 at LATEST, 5 at a plain record,
/// plus a row that is not a lease and a multi-stream lease of another application.
async fn java_rows(k: &Kcl) {
    k.java("shardId-000000000000", "SHARD_END", 0, &[], "").await;
    k.java("shardId-000000000001", "SHARD_END", 0, &[], "worker-a").await;
    k.java(
        "shardId-000000000002",
        SEQ_A,
        3,
        &["shardId-000000000000", "shardId-000000000001"],
        "worker-b",
    )
    .await;
    k.java("shardId-000000000003", "TRIM_HORIZON", 0, &["shardId-000000000002"], "").await;
    k.java("shardId-000000000004", "LATEST", 0, &[], "worker-a").await;
    k.java("shardId-000000000005", SEQ_B, 0, &[], "worker-b").await;
    k.put(&[("leaseKey", s("worker-a")), ("entityType", s("WORKER_METRICS_STATS"))]).await;
    k.java("123456789012:clicks:1700000000:shardId-000000000000", SEQ_B, 1, &[], "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_table_imports_every_lease_exactly_once() {
    let Some(k) = kcl_table("leaseKey").await else { return };
    java_rows(&k).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());

    // Dry run: the plan, nothing written.
    let dry = k.cli(&url, &["--dry-run", "--observe-ms", "300"]).await;
    assert_eq!(dry.code, 0, "{}{}", dry.stdout, dry.stderr);
    println!("{}", dry.stdout);
    for word in
        ["shardId-000000000002", SEQ_A, "finished", "blocked on parent", "create", "skipped"]
    {
        assert!(dry.stdout.contains(word), "{word} missing:\n{}", dry.stdout);
    }
    assert!(dry.stdout.contains("dry run: nothing written"), "{}", dry.stdout);
    assert!(leases(&url).await.is_empty(), "a dry run wrote");
    let dry_json = json(&k.cli(&url, &["--dry-run", "--json", "--observe-ms", "300"]).await);
    assert_eq!(dry_json["schema"], "java");
    assert_eq!(dry_json["fleet"]["status"], "stopped");
    assert_eq!(dry_json["summary"]["create"], 6);
    assert_eq!(dry_json["summary"]["skipped"], 2);
    let a = actions(&dry_json);
    assert_eq!(a["worker-a"], "skipped");
    assert_eq!(a["123456789012:clicks:1700000000:shardId-000000000000"], "skipped");
    let two = dry_json["leases"]
        .as_array()
        .and_then(|v| v.iter().find(|e| e["key"] == "shardId-000000000002"))
        .unwrap_or_else(|| panic!("{dry_json}"));
    assert_eq!(two["sub_sequence"], "3");
    assert_eq!(two["kcl_owner"], "worker-b");

    // The import.
    let out = k.cli(&url, &["--json", "--observe-ms", "300"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(json(&out)["summary"]["created"], 6);
    let all = leases(&url).await;
    assert_eq!(all.len(), 6, "{:?}", all.keys());
    check(&all, "shardId-000000000000", &Position::ShardEnd, &[]);
    check(&all, "shardId-000000000001", &Position::ShardEnd, &[]);
    check(
        &all,
        "shardId-000000000002",
        &seq(SEQ_A, 3),
        &["shardId-000000000000", "shardId-000000000001"],
    );
    check(&all, "shardId-000000000003", &Position::TrimHorizon, &["shardId-000000000002"]);
    check(&all, "shardId-000000000004", &Position::Latest, &[]);
    check(&all, "shardId-000000000005", &seq(SEQ_B, 0), &[]);

    // Again: nothing changes, not even a version.
    let again = k.cli(&url, &["--json", "--observe-ms", "300"]).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    let v = json(&again);
    assert_eq!(v["summary"]["unchanged"], 6, "{v}");
    assert_eq!(v["summary"]["created"], 0, "{v}");
    let after = leases(&url).await;
    for (key, was) in &all {
        assert_eq!(after[key].version, was.version, "{key} was written again");
    }
    println!("java: 6 leases imported exactly, 2 rows skipped, second run unchanged 6");
    k.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_table_imports_and_refuses_what_it_cannot_map() {
    let Some(k) = kcl_table("ShardID").await else { return };
    k.put(&[
        ("ShardID", s("shardId-000000000000")),
        ("Checkpoint", s("SHARD_END")),
        ("LeaseTimeout", s("2026-12-05T10:00:00Z")),
    ])
    .await;
    k.put(&[
        ("ShardID", s("shardId-000000000001")),
        ("Checkpoint", s(SEQ_A)),
        ("AssignedTo", s("go-worker-1")),
        ("LeaseTimeout", s("2026-12-05T10:00:05Z")),
        ("ParentShardId", s("shardId-000000000000")),
    ])
    .await;
    // Never checkpointed: the application's initial position applies, which the table lacks.
    k.put(&[("ShardID", s("shardId-000000000002")), ("LeaseTimeout", s("2026-12-05T10:00:06Z"))])
        .await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());

    let refused = k.cli(&url, &["--observe-ms", "300"]).await;
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stdout.contains("--initial-position"), "{}", refused.stdout);
    assert!(refused.stderr.contains("nothing was written"), "{}", refused.stderr);
    assert!(leases(&url).await.is_empty());

    let out =
        k.cli(&url, &["--json", "--observe-ms", "300", "--initial-position", "TRIM_HORIZON"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = json(&out);
    assert_eq!(v["schema"], "go");
    assert_eq!(v["summary"]["created"], 3);
    let all = leases(&url).await;
    check(&all, "shardId-000000000000", &Position::ShardEnd, &[]);
    // vmware-go-kcl resumes after the whole Kinesis record: every user record of it is covered.
    check(
        &all,
        "shardId-000000000001",
        &seq(SEQ_A, i64::MAX.unsigned_abs()),
        &["shardId-000000000000"],
    );
    check(&all, "shardId-000000000002", &Position::TrimHorizon, &[]);

    let again =
        k.cli(&url, &["--json", "--observe-ms", "300", "--initial-position", "TRIM_HORIZON"]).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert_eq!(json(&again)["summary"]["unchanged"], 3);
    println!("go: 3 leases imported exactly, unmappable row refused, second run unchanged 3");
    k.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_leases_of_one_stream_are_imported() {
    let Some(k) = kcl_table("leaseKey").await else { return };
    let key = |stream: &str, shard: &str| format!("123456789012:{stream}:1700000000:{shard}");
    k.java(&key("orders", "shardId-000000000000"), "SHARD_END", 0, &[], "").await;
    k.java(&key("orders", "shardId-000000000001"), SEQ_A, 7, &["shardId-000000000000"], "w").await;
    k.java(&key("clicks", "shardId-000000000000"), SEQ_B, 0, &[], "w").await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());

    let none = k.cli(&url, &["--observe-ms", "300", "--stream", "payments"]).await;
    assert_eq!(none.code, 2, "{}{}", none.stdout, none.stderr);

    let out = k.cli(&url, &["--json", "--observe-ms", "300", "--stream", "orders"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = json(&out);
    assert_eq!(v["summary"]["created"], 2, "{v}");
    assert_eq!(actions(&v)[&key("clicks", "shardId-000000000000")], "skipped");
    let all = leases(&url).await;
    assert_eq!(all.len(), 2);
    check(&all, "shardId-000000000000", &Position::ShardEnd, &[]);
    check(&all, "shardId-000000000001", &seq(SEQ_A, 7), &["shardId-000000000000"]);
    k.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_tables_import_for_a_multi_stream_fleet() {
    let Some(k) = kcl_table("leaseKey").await else { return };
    let key = |stream: &str, shard: &str| format!("123456789012:{stream}:1700000000:{shard}");
    k.java(&key("orders", "shardId-000000000000"), "SHARD_END", 0, &[], "").await;
    k.java(&key("orders", "shardId-000000000001"), SEQ_A, 7, &["shardId-000000000000"], "w").await;
    k.java(&key("clicks", "shardId-000000000000"), SEQ_B, 2, &[], "w").await;
    k.java(&key("audit", "shardId-000000000000"), "TRIM_HORIZON", 0, &[], "").await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());
    let ms = ["--observe-ms", "300", "--multi-stream"];

    // Usage errors, before anything is read or written.
    let many =
        k.cli(&url, &["--observe-ms", "300", "--stream", "orders", "--stream", "clicks"]).await;
    assert_eq!(many.code, 2, "{}{}", many.stdout, many.stderr);
    assert!(many.stderr.contains("--multi-stream"), "{}", many.stderr);
    let slash = k.cli(&url, &[&ms[..], &["--stream", "a/b"]].concat()).await;
    assert_eq!(slash.code, 2, "{}{}", slash.stdout, slash.stderr);
    assert!(slash.stderr.contains("contains '/'"), "{}", slash.stderr);
    let absent = k.cli(&url, &[&ms[..], &["--stream", "payments"]].concat()).await;
    assert_eq!(absent.code, 2, "{}{}", absent.stdout, absent.stderr);

    // The dry run: every stream, keyed stream/shardId.
    let dry = k.cli(&url, &[&ms[..], &["--dry-run"]].concat()).await;
    assert_eq!(dry.code, 0, "{}{}", dry.stdout, dry.stderr);
    println!("{}", dry.stdout);
    for word in
        ["orders/shardId-000000000001", "clicks/shardId-000000000000", "stream/shardId keys"]
    {
        assert!(dry.stdout.contains(word), "{word} missing:\n{}", dry.stdout);
    }
    assert!(leases(&url).await.is_empty(), "a dry run wrote");

    // Two of the three streams.
    let args = [&ms[..], &["--json", "--stream", "orders", "--stream", "clicks"]].concat();
    let out = k.cli(&url, &args).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = json(&out);
    assert_eq!(v["summary"]["created"], 3, "{v}");
    assert_eq!(v["multi_stream"], true, "{v}");
    assert_eq!(v["streams"], serde_json::json!(["clicks", "orders"]), "{v}");
    assert_eq!(actions(&v)[&key("audit", "shardId-000000000000")], "skipped");
    let all = leases(&url).await;
    assert_eq!(all.len(), 3, "{:?}", all.keys());
    check(&all, "orders/shardId-000000000000", &Position::ShardEnd, &[]);
    check(&all, "orders/shardId-000000000001", &seq(SEQ_A, 7), &["orders/shardId-000000000000"]);
    check(&all, "clicks/shardId-000000000000", &seq(SEQ_B, 2), &[]);

    // Again: nothing changes, not even a version.
    let again = k.cli(&url, &args).await;
    assert_eq!(again.code, 0, "{}{}", again.stdout, again.stderr);
    assert_eq!(json(&again)["summary"]["unchanged"], 3);
    let after = leases(&url).await;
    for (key, was) in &all {
        assert_eq!(after[key].version, was.version, "{key} was written again");
    }
    // Every stream now: the leases in place are the import's own, the third stream's is added.
    let widened = k.cli(&url, &[&ms[..], &["--json"]].concat()).await;
    assert_eq!(widened.code, 0, "{}{}", widened.stdout, widened.stderr);
    assert_eq!(json(&widened)["summary"]["created"], 1);
    check(&leases(&url).await, "audit/shardId-000000000000", &Position::TrimHorizon, &[]);

    // The bare keys of a single-stream import are other keys: refused without --merge.
    let dir2 = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url2 = sqlite_url(dir2.path());
    let single = k.cli(&url2, &["--observe-ms", "300", "--stream", "orders"]).await;
    assert_eq!(single.code, 0, "{}{}", single.stdout, single.stderr);
    let mixed = k.cli(&url2, &ms).await;
    assert_eq!(mixed.code, 4, "{}{}", mixed.stdout, mixed.stderr);
    assert!(mixed.stderr.contains("--merge"), "{}", mixed.stderr);
    assert_eq!(leases(&url2).await.len(), 2, "written without --merge");

    // A KCL worker still renewing a multi-stream lease: refused, nothing written.
    let dir4 = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url4 = sqlite_url(dir4.path());
    let stop = Arc::new(AtomicBool::new(false));
    renew_until(&k, "leaseKey", &key("clicks", "shardId-000000000000"), stop.clone());
    let live = k.cli(&url4, &["--observe-ms", "1500", "--multi-stream"]).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(live.code, 4, "{}{}", live.stdout, live.stderr);
    assert!(live.stderr.contains("KCL fleet is alive"), "{}", live.stderr);
    assert!(leases(&url4).await.is_empty(), "written while the fleet ran");

    // The stream recreated under its name: two rows for orders/shardId-000000000000.
    k.java("123456789012:orders:1800000000:shardId-000000000000", "TRIM_HORIZON", 0, &[], "").await;
    let dir3 = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url3 = sqlite_url(dir3.path());
    // --force: the renewer above may land one last renewal (no watch, so no race with it).
    let twice = k.cli(&url3, &["--force", "--multi-stream"]).await;
    assert_eq!(twice.code, 2, "{}{}", twice.stdout, twice.stderr);
    assert!(
        twice.stdout.contains("2 KCL leases map to lease key orders/shardId-000000000000"),
        "{}",
        twice.stdout
    );
    assert!(twice.stderr.contains("nothing was written"), "{}", twice.stderr);
    assert!(leases(&url3).await.is_empty());
    println!(
        "multi-stream: 3 leases under stream/shardId, second run unchanged 3, live fleet and \
         recreated stream refused"
    );
    k.drop_table().await;
}

/// Keeps renewing like a live KCL worker (a `leaseCounter` ADD or a new `LeaseTimeout`) until
/// stopped.
fn renew_until(k: &Kcl, key_attr: &'static str, key: &str, stop: Arc<AtomicBool>) {
    let client = k.client.clone();
    let table = k.table.clone();
    let key = key.to_owned();
    tokio::spawn(async move {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let update = client.update_item().table_name(&table).key(key_attr, s(&key));
            let update = if key_attr == "leaseKey" {
                update
                    .update_expression("ADD leaseCounter :one")
                    .expression_attribute_values(":one", n(1))
            } else {
                update
                    .update_expression("SET LeaseTimeout = :t")
                    .expression_attribute_values(":t", s(&format!("2026-12-05T10:00:{i:02}Z")))
            };
            let _ = update.send().await;
            // A worker renews periodically; this one much more often than the window.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_while_the_kcl_fleet_renews_its_leases() {
    for (key_attr, schema) in [("leaseKey", "java"), ("ShardID", "go")] {
        let Some(k) = kcl_table(key_attr).await else { return };
        if key_attr == "leaseKey" {
            java_rows(&k).await;
        } else {
            k.put(&[
                ("ShardID", s("shardId-000000000000")),
                ("Checkpoint", s(SEQ_A)),
                ("AssignedTo", s("go-worker-1")),
                ("LeaseTimeout", s("2026-12-05T10:00:00Z")),
            ])
            .await;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let url = sqlite_url(dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let renewed =
            if key_attr == "leaseKey" { "shardId-000000000002" } else { "shardId-000000000000" };
        renew_until(&k, key_attr, renewed, stop.clone());
        let out = k.cli(&url, &["--observe-ms", "1500"]).await;
        assert_eq!(out.code, 4, "{schema}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("KCL fleet is alive"), "{}", out.stderr);
        assert!(out.stderr.contains("--force"), "{}", out.stderr);
        assert!(leases(&url).await.is_empty(), "{schema}: written while the fleet ran");
        let forced = k.cli(&url, &["--force", "--json"]).await;
        stop.store(true, Ordering::Relaxed);
        assert_eq!(forced.code, 0, "{schema}: {}{}", forced.stdout, forced.stderr);
        assert_eq!(json(&forced)["fleet"]["status"], "not observed");
        assert!(!leases(&url).await.is_empty());
        println!("{schema}: refused while {renewed} renewed (exit 4); --force imported");
        k.drop_table().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_with_other_leases_needs_merge_and_conflicts_are_kept() {
    let Some(k) = kcl_table("leaseKey").await else { return };
    java_rows(&k).await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());
    let store = shardlease::connect(&url).await.unwrap_or_else(|e| panic!("{e}"));
    let foreign = Lease::new("shardId-000000000099", Position::TrimHorizon);
    store.create_lease(&foreign).await.unwrap_or_else(|e| panic!("{e}"));

    let refused = k.cli(&url, &["--observe-ms", "300"]).await;
    assert_eq!(refused.code, 4, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("--merge"), "{}", refused.stderr);
    assert_eq!(leases(&url).await.len(), 1, "written without --merge");

    let merged = k.cli(&url, &["--merge", "--json", "--observe-ms", "300"]).await;
    assert_eq!(merged.code, 0, "{}{}", merged.stdout, merged.stderr);
    assert_eq!(json(&merged)["summary"]["created"], 6);
    assert_eq!(leases(&url).await.len(), 7);

    // A shardlease worker moved shard 5 on: a merge reports it and leaves it.
    let key = LeaseKey::from("shardId-000000000005");
    let Ok(Some(VersionedLease { lease, version })) = store.get_lease(&key).await else {
        panic!("no lease 5")
    };
    let moved = Lease { checkpoint: seq(SEQ_B, 9), ..lease };
    store.update_lease(&moved, version).await.unwrap_or_else(|e| panic!("{e}"));
    let conflict = k.cli(&url, &["--merge", "--json", "--observe-ms", "300"]).await;
    assert_eq!(conflict.code, 5, "{}{}", conflict.stdout, conflict.stderr);
    let v = json(&conflict);
    assert_eq!(actions(&v)["shardId-000000000005"], "conflict");
    assert_eq!(v["summary"]["unchanged"], 5);
    let all = leases(&url).await;
    assert_eq!(all["shardId-000000000005"].lease.checkpoint, seq(SEQ_B, 9), "overwritten");
    k.drop_table().await;
}

/// The lease table of the KCL's DynamoDB Streams Kinesis Adapter 1.x is a KCL 1.x table: the
/// same attributes the Java import reads (older KCL 1.x rows lack `checkpointSubSequenceNumber`),
/// DynamoDB Streams shard ids and 21-digit sequence numbers. A rotated lineage: the parent
/// finished, the child checkpointed, the grandchild not yet started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamodb_streams_adapter_table_imports() {
    let Some(k) = kcl_table("leaseKey").await else { return };
    let (parent, child, grandchild) = (
        "shardId-00000001701234567890-0a1b2c3d",
        "shardId-00000001701249000000-4e5f6a7b",
        "shardId-00000001701263000000-8c9d0e1f",
    );
    let seq_child = "100000000005391461882";
    k.java(parent, "SHARD_END", 0, &[], "").await;
    // A KCL 1.x row written before sub-sequence numbers existed.
    k.put(&[
        ("leaseKey", s(child)),
        ("checkpoint", s(seq_child)),
        ("leaseCounter", n(7)),
        ("leaseOwner", s("adapter-worker-1")),
        ("parentShardId", ss(&[parent])),
    ])
    .await;
    k.java(grandchild, "TRIM_HORIZON", 0, &[child], "").await;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let url = sqlite_url(dir.path());
    let out = k.cli(&url, &["--json", "--observe-ms", "300"]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let v = json(&out);
    assert_eq!(v["schema"], "java", "{v}");
    assert_eq!(v["summary"]["created"], 3, "{v}");
    let all = leases(&url).await;
    check(&all, parent, &Position::ShardEnd, &[]);
    check(&all, child, &seq(seq_child, 0), &[parent]);
    check(&all, grandchild, &Position::TrimHorizon, &[child]);
    println!("dynamodb streams adapter (KCL 1.x table): 3 leases imported exactly");
    k.drop_table().await;
}
