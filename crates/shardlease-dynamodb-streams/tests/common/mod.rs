//! Helpers shared by the tests against moto's server (DynamoDB and DynamoDB Streams on one
//! endpoint): the endpoint from `SHARDLEASE_TEST_DYNAMODB_ENDPOINT` (a skip locally when unset, a
//! failure under `CI=true`), an admin client, tables with random names and a stream, a [`Writer`]
//! that makes INSERT / MODIFY / REMOVE changes and remembers the change each one must show up as
//! on the stream, and reading helpers that wait for a condition with a deadline (never a fixed
//! sleep standing in for one).
//!
//! moto keeps one fixed shard per table that never closes, rotates or is trimmed, and numbers the
//! changes of a table one after another: the stream's order is the order of the writes.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue as SdkValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus,
};
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use rand::Rng;
use shardlease_core::{Record, ShardInfo, ShardReader, ShardSource};
use shardlease_dynamodb_streams::{
    AttributeValue, ChangeEvent, DynamoDbStreamsSource, DynamoDbStreamsSourceBuilder, EventName,
    Item, ReadConfig,
};
use shardlease_testkit::suite::env_or_skip;

/// The variable naming moto's endpoint (DynamoDB and DynamoDB Streams).
pub const ENDPOINT_VAR: &str = "SHARDLEASE_TEST_DYNAMODB_ENDPOINT";

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The region every client and source of these tests uses.
pub const REGION: &str = "us-east-1";

/// The tables' hash key (a string) and range key (a number).
pub const PK: &str = "pk";
pub const SK: &str = "sk";

/// moto and an admin client (DynamoDB) on it.
#[derive(Clone)]
pub struct Moto {
    pub endpoint: String,
    pub client: Client,
}

/// moto, or `None` (the test is then skipped; under `CI=true` this panics instead).
pub fn moto() -> Option<Moto> {
    let endpoint = env_or_skip(ENDPOINT_VAR)?;
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(&endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "test"))
        .timeout_config(
            aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(20))
                .build(),
        )
        .build();
    Some(Moto { endpoint, client: Client::from_conf(conf) })
}

/// Reading settings for tests: moto has no rate limits, so calls may come faster.
pub fn fast_reads() -> ReadConfig {
    let mut c = ReadConfig::default();
    c.min_call_interval = Duration::from_millis(10);
    c.idle_interval = Duration::from_millis(50);
    c.base_backoff = Duration::from_millis(20);
    c.max_backoff = Duration::from_millis(500);
    c.children_retry_interval = Duration::from_millis(200);
    c
}

/// Waits until `check` returns `Some`, polling; panics after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A random table name.
pub fn table_name() -> String {
    format!("streams-{:016x}", rand::rng().random::<u64>())
}

impl Moto {
    /// A builder for the stream of `table_or_arn` on moto, with the test keys, region and reads.
    pub fn builder(&self, table_or_arn: &str) -> DynamoDbStreamsSourceBuilder {
        DynamoDbStreamsSource::builder(table_or_arn)
            .region(REGION)
            .endpoint_url(&self.endpoint)
            .static_credentials("dummy", "dummy")
            .read_config(fast_reads())
    }

    /// A source on `table`'s stream with the test read settings.
    pub async fn source(&self, table_or_arn: &str) -> DynamoDbStreamsSource {
        self.builder(table_or_arn)
            .build()
            .await
            .unwrap_or_else(|e| panic!("building the source of {table_or_arn}: {e}"))
    }

    /// A new table with a random name (hash key [`PK`], range key [`SK`]) and, if `stream`, a
    /// `NEW_AND_OLD_IMAGES` stream; returned once it is active.
    pub async fn create_table(&self, stream: bool) -> String {
        let name = table_name();
        let attr = |n: &str, t: ScalarAttributeType| {
            AttributeDefinition::builder()
                .attribute_name(n)
                .attribute_type(t)
                .build()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let key = |n: &str, t: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(n)
                .key_type(t)
                .build()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let spec = stream.then(|| {
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap_or_else(|e| panic!("{e}"))
        });
        self.client
            .create_table()
            .table_name(&name)
            .attribute_definitions(attr(PK, ScalarAttributeType::S))
            .attribute_definitions(attr(SK, ScalarAttributeType::N))
            .key_schema(key(PK, KeyType::Hash))
            .key_schema(key(SK, KeyType::Range))
            .billing_mode(BillingMode::PayPerRequest)
            .set_stream_specification(spec)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create table {name}: {e:?}"));
        eventually("the table to be active", || async {
            let out = self.client.describe_table().table_name(&name).send().await.ok()?;
            (out.table?.table_status? == TableStatus::Active).then_some(())
        })
        .await;
        name
    }

    /// The ARN of `table`'s latest stream, as DynamoDB describes the table.
    pub async fn stream_arn(&self, table: &str) -> String {
        let out = self
            .client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap_or_else(|e| panic!("describe table {table}: {e:?}"));
        out.table
            .and_then(|t| t.latest_stream_arn)
            .unwrap_or_else(|| panic!("table {table} has no stream ARN"))
    }

    /// Deletes the table (best effort).
    pub async fn delete_table(&self, table: &str) {
        let _ = self.client.delete_table().table_name(table).send().await;
    }
}

/// An attribute value of the crate in the SDK's form.
pub fn to_sdk(v: &AttributeValue) -> SdkValue {
    match v {
        AttributeValue::S(s) => SdkValue::S(s.clone()),
        AttributeValue::N(n) => SdkValue::N(n.clone()),
        AttributeValue::B(b) => SdkValue::B(Blob::new(b.to_vec())),
        AttributeValue::Bool(b) => SdkValue::Bool(*b),
        AttributeValue::Null(b) => SdkValue::Null(*b),
        AttributeValue::M(m) => SdkValue::M(to_sdk_item(m)),
        AttributeValue::L(l) => SdkValue::L(l.iter().map(to_sdk).collect()),
        AttributeValue::Ss(v) => SdkValue::Ss(v.clone()),
        AttributeValue::Ns(v) => SdkValue::Ns(v.clone()),
        AttributeValue::Bs(v) => SdkValue::Bs(v.iter().map(|b| Blob::new(b.to_vec())).collect()),
        other => panic!("no SDK form for {other:?}"),
    }
}

/// An item of the crate in the SDK's form.
pub fn to_sdk_item(item: &Item) -> std::collections::HashMap<String, SdkValue> {
    item.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()
}

/// A string value.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number value.
pub fn n(v: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The key of item `id` (hash key `id`, range key 7).
pub fn key_of(id: &str) -> Item {
    Item::from([(PK.to_owned(), s(id)), (SK.to_owned(), n(7))])
}

/// The change a write must show up as on the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub name: EventName,
    pub keys: Item,
    pub new_image: Option<Item>,
    pub old_image: Option<Item>,
}

impl Expected {
    /// What a change read from the stream says, in the same terms.
    pub fn of(change: &ChangeEvent) -> Self {
        Expected {
            name: change.event_name,
            keys: change.keys.clone(),
            new_image: change.new_image.clone(),
            old_image: change.old_image.clone(),
        }
    }

    /// The item's id (its hash key).
    pub fn id(&self) -> String {
        match self.keys.get(PK) {
            Some(AttributeValue::S(id)) => id.clone(),
            other => panic!("a key without a string {PK}: {other:?}"),
        }
    }
}

/// Writes changes to a table and keeps a model of its items, so that each write's change
/// (event, key, new and old image) is known in advance. Writes go one at a time, so the stream
/// lists them in the order they were made.
pub struct Writer {
    moto: Moto,
    table: String,
    items: BTreeMap<String, Item>,
    /// Changes made since each item was last inserted, per item.
    ops: BTreeMap<String, u32>,
    /// Every change made so far, in order.
    pub written: Vec<Expected>,
}

impl Writer {
    pub fn new(moto: &Moto, table: &str) -> Self {
        Writer {
            moto: moto.clone(),
            table: table.to_owned(),
            items: BTreeMap::new(),
            ops: BTreeMap::new(),
            written: Vec::new(),
        }
    }

    /// Whether item `id` exists (as far as this writer's changes go).
    pub fn exists(&self, id: &str) -> bool {
        self.items.contains_key(id)
    }

    /// `PutItem` of item `id` with `attrs` (the key is added): an INSERT, or a MODIFY of an
    /// existing item.
    pub async fn put(&mut self, id: &str, attrs: Item) -> Expected {
        let mut item = attrs;
        item.extend(key_of(id));
        self.moto
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_sdk_item(&item)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {id}: {e:?}"));
        let old = self.items.insert(id.to_owned(), item.clone());
        let name = if old.is_some() { EventName::Modify } else { EventName::Insert };
        self.record(Expected { name, keys: key_of(id), new_image: Some(item), old_image: old })
    }

    /// `UpdateItem` `SET attr = value` of the existing item `id`: a MODIFY.
    pub async fn set(&mut self, id: &str, attr: &str, value: AttributeValue) -> Expected {
        let old = self.items.get(id).cloned().unwrap_or_else(|| panic!("{id} does not exist"));
        self.moto
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(to_sdk_item(&key_of(id))))
            .update_expression("SET #a = :v")
            .expression_attribute_names("#a", attr)
            .expression_attribute_values(":v", to_sdk(&value))
            .send()
            .await
            .unwrap_or_else(|e| panic!("update {id}: {e:?}"));
        let mut new = old.clone();
        new.insert(attr.to_owned(), value);
        self.items.insert(id.to_owned(), new.clone());
        self.record(Expected {
            name: EventName::Modify,
            keys: key_of(id),
            new_image: Some(new),
            old_image: Some(old),
        })
    }

    /// `DeleteItem` of the existing item `id`: a REMOVE.
    pub async fn delete(&mut self, id: &str) -> Expected {
        let old = self.items.remove(id).unwrap_or_else(|| panic!("{id} does not exist"));
        self.moto
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(to_sdk_item(&key_of(id))))
            .send()
            .await
            .unwrap_or_else(|e| panic!("delete {id}: {e:?}"));
        self.record(Expected {
            name: EventName::Remove,
            keys: key_of(id),
            new_image: None,
            old_image: Some(old),
        })
    }

    /// The next change of item `id` in the cycle INSERT (`PutItem`), MODIFY (`UpdateItem`),
    /// MODIFY (`PutItem` over it), REMOVE (`DeleteItem`); `round` goes into the values written.
    pub async fn cycle(&mut self, id: &str, round: usize) -> Expected {
        if !self.exists(id) {
            self.ops.insert(id.to_owned(), 0);
            return self.put(id, rich_attrs(round)).await;
        }
        let op = {
            let ops = self.ops.entry(id.to_owned()).or_default();
            *ops += 1;
            *ops
        };
        match op % 3 {
            1 => self.set(id, "n", n(round)).await,
            2 => {
                let attrs = Item::from([
                    ("n".to_owned(), n(round)),
                    ("note".to_owned(), s(format!("overwritten in round {round}"))),
                ]);
                self.put(id, attrs).await
            }
            _ => self.delete(id).await,
        }
    }

    fn record(&mut self, e: Expected) -> Expected {
        self.written.push(e.clone());
        e
    }
}

/// Attributes of every type the stream carries, for an inserted item.
pub fn rich_attrs(round: usize) -> Item {
    Item::from([
        ("n".to_owned(), n(round)),
        ("big".to_owned(), n("12345678901234567890123456789012345678")),
        ("s".to_owned(), s(format!("inserted in round {round} ✓"))),
        ("b".to_owned(), AttributeValue::B(Bytes::from_static(b"\x00\xffbin"))),
        ("flag".to_owned(), AttributeValue::Bool(round.is_multiple_of(2))),
        ("nothing".to_owned(), AttributeValue::Null(true)),
        ("list".to_owned(), AttributeValue::L(vec![n(1), s("two"), AttributeValue::Bool(false)])),
        (
            "map".to_owned(),
            AttributeValue::M(Item::from([
                ("inner".to_owned(), s("x")),
                ("deep".to_owned(), AttributeValue::M(Item::from([("k".to_owned(), n(-2.5))]))),
            ])),
        ),
    ])
}

/// The one shard of a moto table's stream.
pub async fn only_shard(source: &dyn ShardSource) -> ShardInfo {
    let mut shards = source.list_shards().await.unwrap_or_else(|e| panic!("list_shards: {e}"));
    assert_eq!(shards.len(), 1, "moto keeps one shard per table: {shards:?}");
    shards.remove(0)
}

/// Reads until `want` records arrived (or the shard ended, which on moto it never does).
pub async fn read_records(reader: &mut Box<dyn ShardReader>, want: usize) -> Vec<Record> {
    let mut out = Vec::new();
    let read = async {
        while out.len() < want {
            let batch = reader.next_batch().await.unwrap_or_else(|e| panic!("next_batch: {e}"));
            out.extend(batch.records.iter().cloned());
            assert!(batch.end.is_none(), "moto never ends a shard");
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("timed out reading {want} records"));
    out
}

/// The change a record carries (panics on a record that is not one).
pub fn change(record: &Record) -> ChangeEvent {
    ChangeEvent::from_record(record)
        .unwrap_or_else(|e| panic!("record {} is not a change: {e}", record.seq))
}
